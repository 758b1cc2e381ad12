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


def emptied_log(db: Path) -> None:
    """The graph's write-ahead log checkpointed and cut to nothing, so that from now on every
    write needs new space: a log left long takes a write into its old frames without a byte of
    disk, and how many did depended on where the log happened to be (12 of 20 submits refused
    in one run, 20 in others)."""
    con = sqlite3.connect(db, timeout=10)
    try:
        assert wait_until(lambda: con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                          .fetchone()[0] == 0, 20, 0.05)
        assert os.path.getsize(f"{db}-wal") == 0
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
        emptied_log(volume / "graph.db")
        filler = fill(volume)
        refused = 0
        with cluster.client(timeout=20) as client:
            for _ in range(20):
                try:
                    accepted.append(client.submit("diag.sleep", {"seconds": 0.01}).id)
                except RequestFailed as exc:
                    assert (exc.code, exc.refused) == ("store_full", False), exc
                    assert "the disk is full or the file unwritable" in exc.detail
                    refused += 1
        assert refused >= 15, refused  # a write may still find a page free now and then
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
