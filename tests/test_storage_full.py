"""The embedded graph on a volume that fills up (issue 41): a submit refused while the disk is
full gets a typed, documented error (``store_full``, not refused: the CLI exits 1), each node
logs one warning line a minute while it lasts (no traceback per write), the web console's 503
page names it, and once space is back every task that was accepted finishes. A real tmpfs
(root mounts one), real node processes, ZooKeeper and RabbitMQ."""

from __future__ import annotations

import base64
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from coord.testing import NodeProcess, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.errors import RequestFailed
from runner.testing.cluster import Cluster
from runner.web.app import create_app
from runner.web.security import Credentials

CREDENTIALS = Credentials("ops", SecretStr("s3cret-pass"))
BASIC = "Basic " + base64.b64encode(b"ops:s3cret-pass").decode()

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="mounting a small tmpfs needs root (CI runs as root)")


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 12 MiB tmpfs: room for the graph, and quick to fill."""
    mount = tmp_path / "volume"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def emptied_log(db: Path) -> bool:
    """The graph's write-ahead log checkpointed and cut to nothing, so that from now on every
    write needs new space; False when a reader or writer held it back (try again)."""
    con = sqlite3.connect(db, timeout=0.2)
    try:
        done = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        return done and os.path.getsize(f"{db}-wal") == 0
    except sqlite3.OperationalError:  # busy
        return False
    finally:
        con.close()


def fill(volume: Path) -> Path:
    """Write a file until the volume has no byte left; the file, to remove later."""
    filler = volume / "filler"
    with open(filler, "wb", buffering=0) as out:
        for size in (65536, 1):  # then the last few bytes
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError:
                pass
    return filler


def filled(volume: Path, node: NodeProcess) -> Path:
    """The volume full with the graph's log empty, done while the node is paused (SIGSTOP).

    Both matter. A log left long takes a write into its old frames without a byte of disk (12
    of 20 submits refused in one run, 20 in others). And a node that writes between the cut
    and the fill (a running task's progress) grows the log again: once the node's own
    checkpointer has copied those frames, SQLite starts the log over in that same space, and a
    small write (a task's end) then commits on a full disk (one CI run). Paused, the node
    writes nothing in between; the cut is tried again while the paused node happened to hold
    a transaction open."""
    db = volume / "graph.db"
    deadline = time.monotonic() + 20
    while True:
        node.pause()
        try:
            if emptied_log(db):
                return fill(volume)
        finally:
            node.resume()
        assert time.monotonic() < deadline, "the graph's log could not be emptied in 20 s"
        time.sleep(0.05)


def test_a_full_disk_is_a_typed_error_logged_once_a_minute_and_nothing_is_lost(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
        spawn_node: Callable[..., NodeProcess], volume: Path) -> None:
    cluster = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                      graph=str(volume / "graph.db"))
    try:
        member = cluster.start_node()
        node_log = cluster.nodes[member].log_path
        accepted = [cluster.submit("diag.sleep", {"seconds": 0.01}) for _ in range(3)]
        for task_id in accepted:
            cluster.wait_finished(task_id)
        with cluster.client() as client:  # running when the disk fills: their ends wait
            running = [client.submit("diag.sleep", {"seconds": 1.5}).id for _ in range(2)]
        accepted += running
        filler = filled(volume, cluster.nodes[member])
        refused = 0
        with cluster.client(timeout=20) as client:
            for _ in range(20):
                try:
                    accepted.append(client.submit("diag.sleep", {"seconds": 0.01}).id)
                except RequestFailed as exc:
                    assert (exc.code, exc.refused) == ("store_full", False), exc
                    assert "the disk is full or the file unwritable" in exc.detail
                    refused += 1
        assert refused == 20, refused  # no write finds space: the log holds none (filled)
        cli = cluster.cli("task", "submit", "diag.sleep", "--payload", '{"seconds": 0}')
        assert cli.exit_code == 1, cli.output
        assert "disk is full" in cli.output and "Traceback" not in cli.output, cli.output

        # the console's 503 page names it (an action's write refused)
        app = create_app(lambda: cluster.client(timeout=20), CREDENTIALS, allow_actions=True)
        with TestClient(app) as web:
            page = web.get(f"/tasks/{running[0]}", headers={"authorization": BASIC})
            token = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert page.status_code == 200 and token, page.text
            answer = web.post(f"/tasks/{running[0]}/deactivate",
                              data={"csrf": token.group(1)}, headers={"authorization": BASIC})
            assert answer.status_code == 503, (answer.status_code, answer.text)
            assert "the disk is full" in answer.text

        lines = node_log.read_text().splitlines()
        alarms = [line for line in lines if "the disk is full or the file unwritable" in line]
        assert len(alarms) == 1 and " WARNING latchwork.store: " in alarms[0], alarms
        assert not [line for line in lines if "Traceback" in line or " ERROR " in line], lines
        assert not [line for line in lines if "OperationalError" in line], lines

        filler.unlink()  # space back: every accepted task finishes, each once
        for task_id in accepted:
            cluster.wait_finished(task_id, 60)
        assert wait_until(lambda: "is writable again" in node_log.read_text(), 30, 0.2)
        for task_id in accepted:
            attempts = cluster.store.attempts.for_task(task_id)
            assert [a.status.value for a in attempts][-1] == "SUCCEEDED", attempts
    finally:
        cluster.store.close()
