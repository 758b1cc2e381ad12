"""The reference docs name what the code gives users (issue 40: the command context's
``member_id`` and the example stream's output fields were missing). Pure reads; no server."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from messaging.registry import HandlerContext
from runner.tasks.features.example_stream import moving_average

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: the context's plumbing, set by the consumer, not for handlers
PLUMBING = {"envelope", "publisher", "processed", "fence", "valid"}


def test_the_command_context_is_listed_whole_in_docs_messaging() -> None:
    text = (DOCS / "messaging.md").read_text()
    listed = text.split("- The context (`CommandContext`):", 1)[1].split("\n\n", 1)[0]
    public = {f.name for f in dataclasses.fields(HandlerContext)} - PLUMBING
    public |= {name for name, value in vars(HandlerContext).items()
               if not name.startswith("_") and (callable(value) or isinstance(value, property))}
    missing = sorted(name for name in public if not re.search(rf"`{name}(\(\))?`", listed))
    assert missing == [], f"docs/messaging.md's context list lacks {missing}"


def test_the_example_streams_output_fields_are_named_in_docs_streams() -> None:
    handle = moving_average(window_s=60.0, bound=10)
    readings = [("readings", i, json.dumps({"t": i, "v": float(i)}).encode()) for i in range(11)]
    _, outputs = handle(None, readings)
    fields = set().union(*(json.loads(out) for out in outputs))
    assert fields == {"t", "avg", "size", "crossed"}
    text = (DOCS / "streams.md").read_text()
    missing = sorted(f for f in fields if f'"{f}"' not in text)
    assert missing == [], f"docs/streams.md does not name the example's output fields {missing}"


README = DOCS.parent / "README.md"
#: environment variables the docs name that are not settings: the test harness's, the bench's,
#: the demo's and the CLI's own switches
NOT_SETTINGS_ENV = {"LATCHWORK_DEBUG", "LATCHWORK_FUZZ_EXAMPLES", "LATCHWORK_SCREENSHOTS",
                    "LATCHWORK_TEST_SERVERS", "LATCHWORK_TEST_GREMLIN_URL",
                    "LATCHWORK_BENCH_LOGS", "LATCHWORK_DEMO_AMQP_PORT",
                    "LATCHWORK_DEMO_ZK_PORT", "LATCHWORK_AMQP_PASSWORD",
                    "LATCHWORK_ZK_PASSWORD", "LATCHWORK_TEST_BATCH_GATE"}
#: endings that make a name read as a setting (a timeout, an interval, a port, ...)
SETTING_ENDINGS = ("_for", "_interval", "_timeout", "_retention", "_port", "_host", "_bytes",
                   "_days", "_url", "_dir", "_workers")
#: names with such an ending (or a setting's prefix) in the docs that are not settings, each
#: with what it is
NOT_SETTINGS = {
    "consumer_timeout": "RabbitMQ's own setting", "heartbeat_timeout": "a @task option",
    "ignored_timeout": "a metric", "amqp_vhost": "a test fixture", "zk_client": "a fixture",
    "zk_namespace": "a test fixture", "graph_cut": "a chaos fault",
    "graph_restart": "a chaos fault", "zk_leader": "a chaos fault",
    "zk_leader_ending": "a chaos fault", "spark_standalone": "a test marker",
    "max_attempts": "a retry option", "max_duration": "a @task option",
    "max_in_progress": "a batch coordinator option", "max_memory_mb": "a @task option",
    "max_retries": "a redelivery option", "max_retrying": "a batch coordinator option",
    "max_tasks_per_child": "a @task option", "max_wait": "a @task option",
    "stream_element_too_large": "an error code", "stream_index_expired": "an error code",
}


def _doc_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in [README, *sorted(DOCS.glob("*.md"))]}


def test_every_setting_is_in_the_readmes_settings_table() -> None:
    """A newcomer finds every setting in the README's table (the web console's were only in
    the code), by its name and its variable (a row may group several: ``LATCHWORK_X ...``)."""
    from runner.config import Settings

    table = [line for line in README.read_text().split("## Configuration", 1)[1]
             .split("\n## ", 1)[0].splitlines() if line.startswith("| `")]
    rows = {name: [row for row in table if f"`{name}`" in row.split("|")[1]]
            for name in Settings.model_fields}
    missing = sorted(name for name, found in rows.items() if not found)
    assert missing == [], f"the README's settings table has no row for {missing}"
    unnamed = sorted(name for name, (row, *_) in rows.items()
                     if f"LATCHWORK_{name.upper()}" not in row and "` ..." not in row)
    assert unnamed == [], f"rows that give neither the variable nor a group: {unnamed}"


def test_every_setting_the_docs_name_exists() -> None:
    """docs/runner.md called the limit on an unwritable end ``store_retry_for``, which is no
    setting (``graph_retry_for`` is). Every ``LATCHWORK_*`` variable the docs name is a
    setting's, and every backticked name shaped like a setting (a setting's prefix, or an
    ending such as ``_interval`` or ``_for``) is one, or is listed above with what it is."""
    from runner.config import Settings

    fields = set(Settings.model_fields)
    prefixes = tuple({f.split("_")[0] + "_" for f in fields if "_" in f})
    wrong: list[str] = []
    for name, text in _doc_texts().items():
        for env in set(re.findall(r"LATCHWORK_[A-Z_]+[A-Z]", text)) - NOT_SETTINGS_ENV:
            if env.removeprefix("LATCHWORK_").lower() not in fields:
                wrong.append(f"{name}: {env}")
        for word in set(re.findall(r"`([a-z]+(?:_[a-z0-9]+)+)`", text)):
            if word in fields or word in NOT_SETTINGS:
                continue
            if word.startswith(prefixes) or word.endswith(SETTING_ENDINGS):
                wrong.append(f"{name}: `{word}`")
    assert sorted(wrong) == [], "docs name settings that do not exist"


def test_a_measured_table_the_docs_point_to_is_there() -> None:
    """docs/graph.md sent readers to "the table at the end of this page" for bench_migrate's
    figures, and there was none: a page that points to the table of a bench has that table in
    its last section, naming the bench."""
    for name, text in _doc_texts().items():
        for bench in re.findall(r"`bench/(\w+)\.py`[^.]*?\.?[^.]*?the table at the end of "
                                r"this page", text, flags=re.S):
            tail = text.rstrip().rsplit("\n## ", 1)[-1]
            assert bench in tail and re.search(r"\|\s*---", tail), f"{name} points to " \
                f"{bench}'s table at its end, which is not there"
