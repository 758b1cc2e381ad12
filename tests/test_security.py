"""Secure by configuration, on servers started here: ZooKeeper with only a TLS client port that
asks for a client certificate, latchwork's znodes under a digest ACL, and RabbitMQ with only a
TLS listener that asks for a client certificate and a user with a password. A client without a
certificate, from another CA, without TLS, with the wrong password or without the digest
credentials is refused, with a clear error; a cluster run with credentials (nodes at DEBUG, the
CLI's text and JSON, its errors) never prints a secret."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coord import ConnectionLost, Membership, NotAuthorised, Session, live_member_ids
from coord.testing import NodeProcess, Pki, ServerTls, ZooKeeperServer, free_ports, wait_until
from messaging import BrokerRefused, BrokerUnavailable, Connector
from messaging.testing import RabbitMQServer
from runner.config import Settings

ZK_SECRET = f"zk-{uuid.uuid4().hex}"
AMQP_SECRET = f"mq-{uuid.uuid4().hex}"
WRONG = f"wrong-{uuid.uuid4().hex}"
VHOST = "secure"


@dataclass(frozen=True)
class Secure:
    pki: Pki
    zk: ZooKeeperServer
    rabbit: RabbitMQServer

    @property
    def zk_hosts(self) -> str:
        return f"127.0.0.1:{self.zk.client_port}"

    def amqp_url(self, password: str = AMQP_SECRET) -> str:
        return f"amqps://lw:{password}@127.0.0.1:{self.rabbit.node_port}/{VHOST}"

    def session(self, cluster: str, *, auth: str | None = f"lw:{ZK_SECRET}",
                cert: bool = True, stranger: bool = False, tls: bool = True,
                connect_timeout: float = 30.0) -> Session:
        if not tls:
            return Session(self.zk_hosts, cluster, auth=auth, connect_timeout=connect_timeout)
        key = (self.pki.stranger_cert, self.pki.stranger_key) if stranger else (
            self.pki.client_cert, self.pki.client_key)
        return Session(self.zk_hosts, cluster, auth=auth, connect_timeout=connect_timeout,
                       tls_ca=str(self.pki.ca), tls_cert=str(key[0]) if cert else None,
                       tls_key=str(key[1]) if cert else None)

    def connector(self, password: str = AMQP_SECRET, cert: bool = True,
                  url: str | None = None) -> Connector:
        return Connector(url or self.amqp_url(password), connect_deadline=3.0,
                         tls_ca=str(self.pki.ca),
                         tls_cert=str(self.pki.client_cert) if cert else None,
                         tls_key=str(self.pki.client_key) if cert else None)

    def env(self, cluster: str, graph: Path, zk_auth: str = f"lw:{ZK_SECRET}",
            amqp_password: str = AMQP_SECRET) -> dict[str, str]:
        return {**os.environ, "LATCHWORK_CLUSTER": cluster,
                "LATCHWORK_ZK_HOSTS": self.zk_hosts, "LATCHWORK_ZK_AUTH": zk_auth,
                "LATCHWORK_ZK_TLS_CA": str(self.pki.ca),
                "LATCHWORK_ZK_TLS_CERT": str(self.pki.client_cert),
                "LATCHWORK_ZK_TLS_KEY": str(self.pki.client_key),
                "LATCHWORK_AMQP_URL": self.amqp_url(amqp_password),
                "LATCHWORK_AMQP_TLS_CA": str(self.pki.ca),
                "LATCHWORK_AMQP_TLS_CERT": str(self.pki.client_cert),
                "LATCHWORK_AMQP_TLS_KEY": str(self.pki.client_key),
                "LATCHWORK_GRAPH": str(graph), "LATCHWORK_SESSION_TIMEOUT": "2",
                "LATCHWORK_SCAN_INTERVAL": "1", "LATCHWORK_REAP_INTERVAL": "0.5",
                "LATCHWORK_WORKERS": "2", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    d = tmp_path_factory.mktemp("secure")
    pki = Pki.create(d / "pki")
    tls = ServerTls.of(pki)
    zk = ZooKeeperServer(d / "zk", free_ports(1)[0], 500, tls=tls)
    node, dist, epmd = free_ports(3)
    rabbit = RabbitMQServer(d / "rabbitmq", node, dist, epmd, tls=tls)
    zk.start()
    try:
        rabbit.start()
        try:
            zk.wait_ready()
            rabbit.wait_ready()
            rabbit.add_vhost(VHOST)
            rabbit.ctl("add_user", "lw", AMQP_SECRET)
            rabbit.ctl("set_permissions", "-p", VHOST, "lw", ".*", ".*", ".*")
            yield Secure(pki, zk, rabbit)
        finally:
            rabbit.stop()
    finally:
        zk.stop()


# kazoo leaves the socket of a refused TLS handshake to the garbage collector
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_clients_without_a_certificate_or_credentials_are_refused_clearly(
        secure: Secure) -> None:
    cluster = f"s{uuid.uuid4().hex[:8]}"
    with secure.session(cluster) as owner:  # TLS, client certificate, digest credentials
        Membership(owner, version="t").start()
        assert len(live_member_ids(owner)) == 1
        # TLS without a client certificate, or one from another CA: the handshake is refused
        for kwargs in ({"cert": False}, {"stranger": True}):
            with pytest.raises(ConnectionLost) as refused:
                secure.session(cluster, connect_timeout=4.0, **kwargs).start()
            assert "certificate" in str(refused.value).lower(), refused.value
        with pytest.raises(ConnectionLost) as plain:  # no TLS at all: nothing answers
            secure.session(cluster, tls=False, connect_timeout=4.0).start()
        assert "cannot reach ZooKeeper" in str(plain.value)
        # the right certificate without the digest credentials: latchwork's znodes say no
        with secure.session(cluster, auth=None) as outsider, \
                pytest.raises(NotAuthorised) as denied:
            live_member_ids(outsider)
        assert "zk_auth" in str(denied.value)
        with secure.session(cluster, auth=f"lw:{WRONG}") as impostor, \
                pytest.raises(NotAuthorised):
            live_member_ids(impostor)

    secure.connector().connect().close()  # amqps, client certificate, user and password
    with pytest.raises(BrokerRefused) as wrong:
        secure.connector(password=WRONG).connect()
    assert "refused the login of user 'lw'" in str(wrong.value)
    assert WRONG not in str(wrong.value) and AMQP_SECRET not in str(wrong.value)
    with pytest.raises(BrokerUnavailable) as no_cert:
        secure.connector(cert=False).connect()
    assert AMQP_SECRET not in str(no_cert.value)
    plain_url = secure.amqp_url().replace("amqps://", "amqp://")
    with pytest.raises(BrokerUnavailable) as plain_amqp:
        secure.connector(url=plain_url).connect()
    assert AMQP_SECRET not in str(plain_amqp.value)


def run_cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "runner.cli", *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, check=False)
    return proc.returncode, proc.stdout


def test_a_cluster_run_with_credentials_never_prints_them(
        secure: Secure, tmp_path: Path, spawn_node: Callable[..., NodeProcess]) -> None:
    cluster = f"s{uuid.uuid4().hex[:8]}"
    env = secure.env(cluster, tmp_path / "graph.db")
    settings = Settings(zk_auth=f"lw:{ZK_SECRET}", amqp_url=secure.amqp_url())
    assert ZK_SECRET not in repr(settings) and AMQP_SECRET not in repr(settings)
    assert ZK_SECRET not in settings.model_dump_json()
    assert AMQP_SECRET not in settings.model_dump_json()
    nodes = [spawn_node(["-m", "runner.cli", "node", "start", "--log-level", "DEBUG"],
                        name=f"secure{i}", env=env, ready_prefix="latchwork node")
             for i in range(2)]
    outputs: list[str] = []

    def cli(*args: str) -> str:
        code, out = run_cli(env, *args)
        outputs.append(out)
        assert code == 0, out
        return out

    task_id = json.loads(cli("task", "submit", "diag.sleep", "--payload", '{"seconds": 0.2}',
                             "--json"))["id"]
    assert wait_until(lambda: json.loads(cli("task", "show", task_id, "--json"))
                      ["task"]["finished"], 60, 0.5)
    cli("task", "show", task_id)
    cli("task", "list", "--json")
    status = json.loads(cli("cluster", "status", "--json"))
    assert len(status["members"]) == 2
    cli("cluster", "status")
    cli("task", "types", "--json")

    # errors: the wrong broker password, the wrong digest credentials for a new node
    code, out = run_cli(secure.env(cluster, tmp_path / "graph.db", amqp_password=WRONG),
                        "task", "list", "--timeout", "5")
    outputs.append(out)
    assert code != 0 and "refused the login" in out, out
    code, out = run_cli(secure.env(cluster, tmp_path / "graph.db", zk_auth=f"lw:{WRONG}"),
                        "node", "start")
    outputs.append(out)
    assert code == 1 and "zk_auth" in out, out

    for node in nodes:
        node.terminate()
    logs = [node.log_path.read_text(errors="replace") + "\n".join(node.lines)
            for node in nodes]
    assert all("DEBUG" in log for log in logs)  # the chattiest level was on
    for text in logs + outputs:
        for secret in (ZK_SECRET, AMQP_SECRET, WRONG):
            assert secret not in text, f"a secret was printed: ...{text[:2000]}"
