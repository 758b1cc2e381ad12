"""`latchwork dev up | status | check | down` against the real Debian servers."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from coord.testing import LOOPBACK, free_port_block, free_ports, port_is_listening
from runner.devenv import DevEnvironment


def latchwork(*args: str, env: dict[str, str] | None = None,
              timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


def left_behind(port: int, directory: str) -> bool:
    """Whether the listener on ``port`` is a process of the dev environment in ``directory``
    (its command line names it), or one whose owner cannot be seen (counted, to be safe)."""
    shown = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                           text=True, timeout=10, check=False).stdout
    pids = [int(p) for p in re.findall(r"pid=(\d+)", shown)]
    if not pids:
        return True
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if directory in command:
            return True
    return False


def test_up_status_check_down_leaves_no_process_or_listener(tmp_path: Path) -> None:
    zk_port = free_port_block(3)  # an ensemble of 3 takes zk_port .. zk_port + 2
    amqp_port = free_port_block(3)  # the AMQP, distribution and epmd ports
    spark_port = free_port_block(4)  # the Spark master, its UI, one worker and its UI
    graph_port = free_ports(1)[0]
    d = str(tmp_path / "dev")
    up = latchwork("dev", "up", "--dir", d, "--zk-ensemble", "3", "--zk-port", str(zk_port),
                   "--amqp-port", str(amqp_port), "--tick-time", "500", "--spark-workers", "1",
                   "--spark-port", str(spark_port), "--graph-server", "--graph-port",
                   str(graph_port))
    env = DevEnvironment.load(Path(d))
    try:
        assert up.returncode == 0, up.stderr
        zk_hosts = ",".join(f"{LOOPBACK}:{zk_port + i}" for i in range(3))
        assert f"export LATCHWORK_ZK_HOSTS={zk_hosts}" in up.stdout.splitlines()
        assert (f"export LATCHWORK_AMQP_URL=amqp://guest:guest@{LOOPBACK}:{amqp_port}/%2F"
                in up.stdout.splitlines())
        assert (f"export LATCHWORK_SPARK_MASTER=spark://{LOOPBACK}:{spark_port}"
                in up.stdout.splitlines())
        assert (f"export LATCHWORK_GRAPH=ws://{LOOPBACK}:{graph_port}/gremlin"
                in up.stdout.splitlines())
        assert "export LATCHWORK_GRAPH_SERIAL_SERVER=true" in up.stdout.splitlines()

        again = latchwork("dev", "up", "--dir", d)
        assert again.returncode == 1
        assert "already running" in again.stderr

        status = latchwork("dev", "status", "--dir", d, "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        services = json.loads(status.stdout)["services"]
        assert [s["name"] for s in services] == [
            "zookeeper-1", "zookeeper-2", "zookeeper-3", "rabbitmq", "spark-master",
            "spark-worker-0", "gremlin-server"]
        assert all(s["running"] and s["ready"] for s in services), services
        assert "workers=1" in services[4]["detail"]
        modes = sorted(s["detail"].split("mode=")[1] for s in services[:3])
        assert modes == ["follower", "follower", "leader"]

        check = latchwork("dev", "check", "--dir", d)
        assert check.returncode == 0, check.stderr
        assert "zookeeper: ephemeral create/read/delete ok" in check.stdout
        assert "rabbitmq: confirmed publish/get/ack ok" in check.stdout
        assert "graph: vertex add/read/drop ok" in check.stdout

        assert env is not None
        assert env.spark is not None and env.spark.master is not None
        assert env.graph is not None
        records = [s.record for s in env.zookeeper.servers] + [
            env.rabbitmq.record, env.rabbitmq.launcher, env.spark.master.record,
            *[w.record for w in env.spark.worker_daemons], env.graph.record]
        ports = {**env.zookeeper.ports(), **env.rabbitmq.ports(), **env.spark.port_map(),
                 **env.graph.ports()}
        assert all(r is not None and r.is_ours() for r in records)
    finally:
        down = latchwork("dev", "down", "--dir", d)
    assert down.returncode == 0, down.stderr
    assert not any(r is not None and r.is_ours() for r in records)
    # a port freed by the stop may be taken at once by another test's server (the suite runs
    # on two workers, and a ZooKeeper ensemble elsewhere picks its quorum ports freely): a
    # listener counts as left behind when a process of this environment holds it
    listening = [name for name, port in ports.items()
                 if port_is_listening(port) and left_behind(port, d)]
    assert listening == []
    assert not (Path(d) / "state.json").exists()
    assert (Path(d) / "gremlin-server" / "graph.kryo").exists()  # written on the clean stop
    status = latchwork("dev", "status", "--dir", d)
    assert status.returncode == 1
    assert "nothing was started" in status.stderr


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    # click prints "Error: <reason>"; the progress line before it is informational
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, text
    return errors[0]


def test_up_refuses_a_port_in_use_and_starts_nothing(tmp_path: Path) -> None:
    zk_port, amqp_port = free_ports(1)[0], free_port_block(3)
    with socket.socket() as squatter:
        squatter.bind((LOOPBACK, amqp_port + 2))  # the broker's private epmd port
        squatter.listen()
        up = latchwork("dev", "up", "--dir", str(tmp_path), "--zk-port", str(zk_port),
                       "--amqp-port", str(amqp_port))
    assert up.returncode == 1
    assert f"port {amqp_port + 2}" in _one_line(up.stderr)
    assert "already in use" in up.stderr
    assert not port_is_listening(zk_port)
    assert not (tmp_path / "state.json").exists()


def test_up_names_a_missing_package_and_how_to_install_it(tmp_path: Path) -> None:
    env = {**os.environ, "LATCHWORK_DEV_ZOOKEEPER_CLASSPATH": "/nonexistent/zookeeper.jar"}
    up = latchwork("dev", "up", "--dir", str(tmp_path), "--zk-port", str(free_ports(1)[0]),
                   env=env)
    assert up.returncode == 1
    line = _one_line(up.stderr)
    assert "'zookeeper' is missing" in line
    assert "apt-get install -y zookeeper" in line
    assert not (tmp_path / "state.json").exists()


def test_failure_after_zookeeper_started_stops_it_again(tmp_path: Path) -> None:
    """RabbitMQ dies at start: the ZooKeeper that was already running is stopped too."""
    fake_bin = tmp_path / "fake-rabbitmq"
    fake_bin.mkdir()
    script = fake_bin / "rabbitmq-server"
    script.write_text("#!/bin/sh\necho 'broken broker' >&2\nexit 1\n")
    script.chmod(0o755)
    zk_port, amqp_port = free_ports(1)[0], free_port_block(3)
    env = {**os.environ, "LATCHWORK_DEV_RABBITMQ_BIN": str(fake_bin)}
    up = latchwork("dev", "up", "--dir", str(tmp_path / "dev"), "--zk-port", str(zk_port),
                   "--amqp-port", str(amqp_port), env=env)
    assert up.returncode == 1
    assert "rabbitmq" in up.stderr and "broken broker" in up.stderr
    assert not port_is_listening(zk_port)
    assert not (tmp_path / "dev" / "state.json").exists()


def test_help_explains_the_commands() -> None:
    out = latchwork("dev", "up", "--help")
    assert out.returncode == 0
    assert "--zk-ensemble" in out.stdout and "Refuses to start twice" in out.stdout
    bad = latchwork("dev", "up", "--zk-ensemble", "zero")
    assert bad.returncode == 2


def test_picked_ports_are_free_and_below_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from the ephemeral range; a server port
    picked there could be gone before the server binds it."""
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    base = free_port_block(3)
    ports = free_ports(4)
    assert len(set(ports)) == 4
    for port in [base, base + 1, base + 2, *ports]:
        assert port < floor
        with socket.socket() as sock:
            sock.bind((LOOPBACK, port))  # free: binds without SO_REUSEADDR


def test_picked_port_blocks_never_overlap() -> None:
    """Nothing is bound between two picks, so each sees the same ports free: the picker itself
    must not hand a port out twice (CI once got the same base for ZooKeeper and RabbitMQ)."""
    seen: set[int] = set()
    for _ in range(300):
        base = free_port_block(3)
        block = set(range(base, base + 3))
        assert not block & seen
        seen |= block
    singles = free_ports(50)
    assert len(set(singles)) == 50 and not set(singles) & seen
