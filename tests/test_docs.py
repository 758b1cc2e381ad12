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
