"""Configuration: TOML file + LATCHWORK_* environment, and the compose file that uses it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from runner.cli import cli
from runner.config import Settings
from runner.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_file_then_environment_then_overrides(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "node.toml"
    config.write_text('cluster = "from-file"\nworkers = 7\nzk_hosts = "zk:1"\n')
    monkeypatch.setenv("LATCHWORK_WORKERS", "9")
    settings = Settings.load(config, zk_hosts="zk:2")
    assert settings.cluster == "from-file"
    assert settings.workers == 9
    assert settings.zk_hosts == "zk:2"


def test_bad_configuration_is_a_typed_error_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("wokers = 3\n")
    with pytest.raises(ConfigError, match="wokers"):
        Settings.load(config)
    config.write_text("workers = 0\n")
    with pytest.raises(ConfigError, match="workers"):
        Settings.load(config)
    config.write_text("workers = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.load(config)
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.load(tmp_path / "missing.toml")


def test_compose_passes_only_settings_the_code_reads() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    nodes = {name: s for name, s in services.items() if s.get("image") == "latchwork:dev"}
    assert sorted(nodes) == ["node1", "node2", "node3"]
    zookeepers = [name for name, s in services.items()
                  if str(s.get("image", "")).startswith("zookeeper:")]
    assert len(zookeepers) == 3
    for service in nodes.values():
        env = service["environment"]
        unknown = {k for k in env if k.startswith("LATCHWORK_")} - Settings.env_names()
        assert unknown == set()
        # Every value is one the config model accepts.
        Settings(**{k.removeprefix("LATCHWORK_").lower(): v for k, v in env.items()})
        hosts = [h.split(":")[0] for h in env["LATCHWORK_ZK_HOSTS"].split(",")]
        assert sorted(hosts) == sorted(zookeepers)
        # secure by configuration: ZooKeeper's TLS port with digest ACLs, amqps, certificates
        # from the certs volume (deploy/certs.sh), a transactional graph
        assert {h.split(":")[1] for h in env["LATCHWORK_ZK_HOSTS"].split(",")} == {"2281"}
        assert env["LATCHWORK_ZK_AUTH"].startswith("latchwork:${")
        assert env["LATCHWORK_AMQP_URL"].startswith("amqps://latchwork:${")
        assert "@rabbitmq:5671/" in env["LATCHWORK_AMQP_URL"]
        for name in ("ZK", "AMQP"):
            assert {env[f"LATCHWORK_{name}_TLS_{part}"] for part in ("CA", "CERT", "KEY")} == {
                "/certs/ca.pem", "/certs/client.crt", "/certs/client.key"}
        assert env["LATCHWORK_GRAPH"].startswith("ws://gremlin:")
        assert "certs:/certs:ro" in service["volumes"]
        assert service["command"][0] == "latchwork"
    for name in zookeepers:  # the port the nodes use is the servers' TLS port
        extra = services[name]["environment"]["ZOO_CFG_EXTRA"]
        assert "secureClientPort=2281" in extra and "ssl.clientAuth=need" in extra
    assert "janusgraph" in services["gremlin"]["image"]
    assert (ROOT / "deploy" / "janusgraph-schema.groovy").exists()
    rabbit_conf = (ROOT / "deploy" / "rabbitmq.conf").read_text()
    assert "listeners.tcp = none" in rabbit_conf and "fail_if_no_peer_cert = true" in rabbit_conf
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'CMD ["latchwork", "node", "start"]' in dockerfile
    # the command the nodes run is a real one
    ctx = click.Context(cli)
    for service in nodes.values():
        command: click.Command | None = cli
        for word in service["command"][1:]:
            assert isinstance(command, click.Group)
            command = command.get_command(ctx, word)
        assert command is not None and not isinstance(command, click.Group)


@pytest.mark.parametrize(("variable", "value", "named"), [
    ("LATCHWORK_SPARK_CONF", "{bad", "spark_conf"),
    ("LATCHWORK_TASKS", "mypkg.tasks", "tasks"),  # a list is JSON in the environment
    ("LATCHWORK_ASPECTS", '{"x": {"kind": "heavy"}}', "aspects.x: classes"),
    ("LATCHWORK_WORKERS", "zero", "workers"),
])
def test_node_start_refuses_bad_settings_in_one_line_exit_2(variable: str, value: str,
                                                           named: str) -> None:
    env = {**os.environ, variable: value}
    run = subprocess.run([sys.executable, "-m", "runner.cli", "node", "start"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid configuration" in lines[0] and named in lines[0]


def test_settings_come_from_the_toml_source_with_nested_tables(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('tasks = ["a.b", "c.d"]\n'
                      '[spark_conf]\n"spark.sql.shuffle.partitions" = "3"\n')
    settings = Settings.load(config)
    assert settings.tasks == ["a.b", "c.d"]
    assert settings.spark_conf == {"spark.sql.shuffle.partitions": "3"}


def test_a_node_on_an_embedded_graph_switches_threads_every_half_millisecond(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gremlite's writes run Python for milliseconds while the ZooKeeper and broker threads
    wait for the interpreter: a node on an embedded graph lets them in every 0.5 ms; on a
    remote graph Python's 5 ms stays; the setting decides when given, from the environment
    too, and a value out of range is refused."""
    from runner.node.main import switch_interval

    assert switch_interval(Settings(graph="/data/graph.db")) == 0.0005
    assert switch_interval(Settings(graph="ws://graph:8182/gremlin")) == 0.005
    assert switch_interval(Settings(graph="wss://graph:8182/gremlin")) == 0.005
    assert switch_interval(Settings(graph="/g.db", switch_interval=0.002)) == 0.002
    monkeypatch.setenv("LATCHWORK_SWITCH_INTERVAL", "0.001")
    assert switch_interval(Settings.load(None)) == 0.001
    with pytest.raises(ConfigError, match="switch_interval"):
        Settings.load(None, switch_interval=0)


def test_a_node_run_sets_the_switch_interval_while_it_runs_and_restores_it_after() -> None:
    """``latchwork node start``'s run loop applies the interval before the node is built and
    puts the process's own back when the node has stopped (SIGTERM here). It also freezes
    what the start allocated out of the collector's generations while the node runs, and
    thaws it after (runner.node.main._freeze_start_up)."""
    import gc
    import signal

    from runner.node.main import run

    seen: list[float] = []

    class Started:
        member_id = "host:1"

        def __enter__(self) -> Started:
            seen.append(sys.getswitchinterval())
            os.kill(os.getpid(), signal.SIGTERM)  # recorded by run's handler: it stops
            return self

        def __exit__(self, *exc: object) -> None:
            seen.append(sys.getswitchinterval())
            frozen.append(gc.get_freeze_count())

    frozen: list[int] = []
    before = sys.getswitchinterval()
    assert gc.get_freeze_count() == 0
    assert run(Settings(graph="/data/graph.db"), node=Started()) == 0  # type: ignore[arg-type]
    assert seen == [0.0005, 0.0005]
    assert sys.getswitchinterval() == before
    assert frozen[0] > 1000 and gc.get_freeze_count() == 0
