"""Every operator action on a task in every state answers what it did (issue 70, items 1 and
2): ``task reactivate --fresh`` on a succeeded task said "reactivated, its checkpoint
dropped", ran nothing and dropped the checkpoint. Each task reply carries one ``state``; each
action (cancel, deactivate, reactivate, reactivate --fresh, skip) on each state (waiting,
delayed, running, succeeded, failed, cancelled, skipped) is checked through the CLI and the
client against one table: the state after, whether anything changed, the exit code, and that
a finished task's checkpoint is kept. Real node, ZooKeeper, RabbitMQ and graph."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from coord.testing import wait_until
from runner.client import Client
from runner.errors import RequestFailed, RequestRefused
from runner.testing.cluster import Cluster

MODULE = textwrap.dedent('''
    from runner.tasks import TaskContext, task

    @task("acts.keep")
    def keep(ctx: TaskContext, payload: dict) -> None:
        ctx.checkpoint({"n": 1})  # a finished task keeps it

    @task("acts.fail")
    def fail(ctx: TaskContext, payload: dict) -> None:
        ctx.checkpoint({"n": 1})
        raise RuntimeError("acts.fail fails")

    @task("acts.big")
    def big(ctx: TaskContext, payload: dict) -> None:
        ctx.checkpoint({"rows": "r" * 40_000, "next": 7})

    @task("acts.hold")
    def hold(ctx: TaskContext, payload: dict) -> None:
        ctx.cancel.wait(600)
        ctx.cancel.raise_if_cancelled()
''')

#: (action, state) -> (the state after, changed, the CLI's exit code); REFUSED: refused as
#: invalid input (exit 2); FINISHED: task_finished (exit 1, nothing changed)
REFUSED, FINISHED = "refused", "finished"
TABLE: dict[str, dict[str, tuple[str, bool, int] | str]] = {
    "cancel": {"waiting": ("cancelled", True, 0), "delayed": ("cancelled", True, 0),
               "running": ("cancelled", True, 0), "succeeded": FINISHED,
               "failed": ("failed", False, 0), "cancelled": ("cancelled", False, 0),
               "skipped": FINISHED},
    "deactivate": {"waiting": ("cancelled", True, 0), "delayed": ("cancelled", True, 0),
                   "running": ("cancelled", True, 0), "succeeded": FINISHED,
                   "failed": ("failed", False, 0), "cancelled": ("cancelled", False, 0),
                   "skipped": FINISHED},
    "reactivate": {"waiting": ("waiting", False, 0), "delayed": ("delayed", False, 0),
                   "running": ("running", False, 0), "succeeded": FINISHED,
                   "failed": ("waiting", True, 0), "cancelled": ("delayed", True, 0),
                   "skipped": FINISHED},
    "reactivate --fresh": {"waiting": ("waiting", True, 0), "delayed": ("delayed", True, 0),
                           "running": REFUSED, "succeeded": FINISHED,
                           "failed": ("waiting", True, 0), "cancelled": ("delayed", True, 0),
                           "skipped": FINISHED},
    "skip": {"waiting": ("skipped", True, 0), "delayed": ("skipped", True, 0),
             "running": REFUSED, "succeeded": FINISHED, "failed": ("skipped", True, 0),
             "cancelled": ("skipped", True, 0), "skipped": FINISHED},
}


class States:
    """Makes a fresh task in each state on a one-node cluster whose worker is kept busy (a
    held task takes ordering key ``line``: a task of that key waits behind it)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.head = client.submit("acts.hold", {}, ordering_key="line")
        self.until(self.head.id, "running")

    def until(self, task_id: str, state: str) -> str:
        assert wait_until(lambda: self.client.get(task_id).task.state == state, 60, 0.1), (
            task_id, state, self.client.get(task_id).task.state)
        return task_id

    def make(self, state: str) -> str:
        c = self.client
        if state == "waiting":  # behind the held head of its ordering key
            return self.until(c.submit("acts.keep", {}, ordering_key="line").id, "waiting")
        if state == "delayed":
            return self.until(c.submit("acts.keep", {}, delay=3600).id, "delayed")
        if state == "running":
            return self.until(c.submit("acts.hold", {}).id, "running")
        if state == "succeeded":
            return self.until(c.submit("acts.keep", {}).id, "succeeded")
        if state == "failed":
            return self.until(c.submit("acts.fail", {}).id, "failed")
        task = c.submit("acts.keep", {}, delay=3600).id
        if state == "cancelled":
            c.cancel(task)
        else:
            c.skip(task)
        return self.until(task, state)


def by_cli(cluster: Cluster) -> Callable[[str, str], tuple[int, str]]:
    def act(action: str, task_id: str) -> tuple[int, str]:
        verb, *flags = action.split()
        result = cluster.cli("task", verb, task_id, *flags)
        return result.exit_code, result.output
    return act


def by_client(client: Client) -> Callable[[str, str], tuple[int, str]]:
    calls = {"cancel": client.cancel, "deactivate": client.deactivate,
             "reactivate": client.reactivate,
             "reactivate --fresh": lambda t: client.reactivate(t, fresh=True),
             "skip": client.skip}

    def act(action: str, task_id: str) -> tuple[int, str]:
        try:
            reply = calls[action](task_id)
        except RequestRefused as exc:
            return 2, exc.code
        except RequestFailed as exc:
            return 1, exc.code
        return 0, f"was={reply.was} changed={reply.changed} state={reply.state}"
    return act


@pytest.mark.timeout(600)
@pytest.mark.parametrize("via", ["cli", "client"])
def test_every_action_on_every_state_answers_what_it_did(cluster: Cluster, tmp_path: Path,
                                                          via: str) -> None:
    cluster.load_module(tmp_path / "site", "acts", MODULE)
    cluster.start_node()
    with cluster.client(timeout=30) as client:
        states = States(client)
        act = by_cli(cluster) if via == "cli" else by_client(client)
        wrong = []
        for action, row in TABLE.items():
            for state, expected in row.items():
                task_id = states.make(state)
                before = client.get(task_id).task
                code, said = act(action, task_id)
                after = client.get(task_id).task
                if expected == FINISHED:
                    ok = code == 1 and after.version == before.version \
                        and after.checkpoint == before.checkpoint \
                        and ("task_finished" in said or f"{task_id} {state}: a finished "
                             "task is not" in said)
                elif expected == REFUSED:
                    ok = code == 2 and after.version == before.version
                else:
                    assert isinstance(expected, tuple)
                    end, changed, exit_code = expected
                    # a failed task reactivated runs (and fails) again at once: its answer
                    # says where the action left it, a read after may be later
                    moved_on = action.startswith("reactivate") and state == "failed"
                    ok = code == exit_code and (after.state == end or (moved_on and
                                                after.state in ("running", "failed"))) \
                        and (after.version != before.version) == changed
                    if via == "client":
                        ok = ok and f"changed={changed}" in said and f"was={state}" in said \
                            and f"state={end}" in said
                    else:
                        ok = ok and ("nothing changed" in said) != changed
                        if moved_on:
                            ok = ok and f"now {end}" in said
                if not ok:
                    wrong.append((action, state, code, said.strip()[-300:], after.state))
                if after.state == "running":
                    client.cancel(task_id)  # its worker back for the next case
        assert wrong == []


def test_a_succeeded_task_reactivated_fresh_is_refused_and_keeps_its_checkpoint(
        cluster: Cluster, tmp_path: Path) -> None:
    """The case a user met, as they met it: exit 1, a message naming its state and what to do
    instead, the checkpoint still there, nothing run."""
    cluster.load_module(tmp_path / "site", "acts", MODULE)
    cluster.start_node()
    with cluster.client(timeout=30) as client:
        done = client.submit("acts.keep", {})
        report = client.wait(done.id, 30)
        assert report.succeeded and report.task.state == "succeeded"
        assert report.task.checkpoint is not None
        result = cluster.cli("task", "reactivate", done.id, "--fresh")
        assert result.exit_code == 1, result.output
        assert f"task {done.id} succeeded: a finished task is not reactivated" in result.output
        assert "submit a new task" in result.output
        after = client.get(done.id)
        assert after.task.checkpoint == report.task.checkpoint
        assert len(after.attempts) == 1 and after.task.state == "succeeded"
        shown = cluster.cli("task", "show", done.id, "--json")
        assert '"state": "succeeded"' in shown.output


def test_a_checkpoint_is_read_from_outside(cluster: Cluster, tmp_path: Path) -> None:
    """Item 10: ``task show`` gave a checkpoint's time, size and sequence only. Its value is
    shown by ``task show ID --checkpoint`` (the first 16 KiB, said so when cut; ``--json`` all
    of it), ``Client.checkpoint`` and the web console's task page."""
    import json
    import urllib.request

    cluster.load_module(tmp_path / "site", "acts", MODULE)
    cluster.start_node()
    with cluster.client(timeout=30) as client:
        small = client.submit("acts.keep", {})
        large = client.submit("acts.big", {})
        none = client.submit("acts.hold", {}, delay=3600)
        for t in (small, large):
            assert client.wait(t.id, 30).succeeded
        found = client.checkpoint(small.id)
        assert found.present and found.value == {"n": 1} and found.seq == 1
        assert not client.checkpoint(none.id).present
        with pytest.raises(RequestFailed) as missing:
            client.checkpoint("no-such-task")
        assert missing.value.code == "task_not_found"
    shown = cluster.cli("task", "show", small.id, "--checkpoint")
    assert shown.exit_code == 0 and '"n": 1' in shown.output and "by attempt 1" in shown.output
    cut = cluster.cli("task", "show", large.id, "--checkpoint")
    assert cut.exit_code == 0 and "the first 16 KiB of" in cut.output
    whole = json.loads(cluster.cli("task", "show", large.id, "--checkpoint", "--json").output)
    assert whole["value"] == {"rows": "r" * 40_000, "next": 7}
    assert "has no checkpoint" in cluster.cli("task", "show", none.id, "--checkpoint").output
    url, web = cluster.start_web()
    page = urllib.request.urlopen(f"{url}/tasks/{small.id}", timeout=10).read().decode()
    assert 'id="checkpoint-value"' in page and "&#34;n&#34;: 1" in page
    page = urllib.request.urlopen(f"{url}/tasks/{large.id}", timeout=10).read().decode()
    assert "the first 16 KiB of" in page
    assert web.terminate() == 0
