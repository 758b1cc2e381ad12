"""The web console's server side, with Starlette's test client against a real cluster (node
processes, ZooKeeper, RabbitMQ): every page, the query box, live fragments, and safety: no
action route or control without ``allow_actions``; with it, credentials and a CSRF token."""

from __future__ import annotations

import base64
import re
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from coord.testing import wait_until
from coord.testing.tls import Pki
from messaging.testing.plugin import AmqpNamespace
from messaging.testing.rabbitmq import RabbitMQServer
from runner.errors import ConfigError
from runner.store import Fence
from runner.templates import ScheduleSpec
from runner.testing.cluster import Cluster
from runner.web.app import create_app
from runner.web.security import Credentials, Transport, check_bind
from runner.web.views import QueryError, parse_query

CREDENTIALS = Credentials("ops", SecretStr("s3cret-pass"), SecretStr("t0ken-abc"))
BASIC = "Basic " + base64.b64encode(b"ops:s3cret-pass").decode()


def console(cluster: Cluster, allow_actions: bool = False) -> TestClient:
    app = create_app(lambda: cluster.client(timeout=10),
                     CREDENTIALS if allow_actions else None, allow_actions=allow_actions)
    return TestClient(app)


def test_every_page_answers_from_the_cluster(cluster: Cluster) -> None:
    member = cluster.start_node()
    with cluster.client() as client:
        done = client.submit("diag.sleep", {"seconds": 0.01})
        failed = client.submit("diag.fail", {"message": "the ledger is locked"})
        client.wait(done.id, 30)
        client.wait(failed.id, 30)
        client.schedule_add("nightly", ScheduleSpec(type="diag.sleep", payload={"seconds": 0},
                                                    cron="0 3 * * *"))
    with console(cluster) as web:
        page = web.get("/cluster")
        assert page.status_code == 200
        assert member in page.text and "master" in page.text and 'hx-trigger="every 2s"' in \
            page.text
        assert web.get("/").url.path == "/cluster"
        tasks = web.get("/tasks")
        assert done.id in tasks.text and failed.id in tasks.text
        stopped = web.get("/tasks", params={"q": "state:stopped"})  # format 4's word
        assert failed.id in stopped.text and done.id not in stopped.text
        failing = web.get("/tasks", params={"q": "state:failed"})
        assert failed.id in failing.text and done.id not in failing.text
        assert failed.id not in web.get("/tasks", params={"q": "state:cancelled"}).text
        by_type = web.get("/tasks", params={"q": "type:diag.sleep state:finished"})
        assert done.id in by_type.text and failed.id not in by_type.text
        # a key given twice: any of its values (issue 40: the first was dropped silently)
        either = web.get("/tasks", params={"q": "type:diag.sleep type:diag.fail"})
        assert either.status_code == 200
        assert done.id in either.text and failed.id in either.text
        neither = web.get("/tasks", params={"q": "state:stopped state:finished type:diag.fail"})
        assert failed.id in neither.text and done.id not in neither.text
        both = web.get("/tasks/counts", params={"q": "type:diag.fail type:diag.sleep"})
        assert re.search(r'id="count-failed">1<', both.text), both.text
        assert re.search(r'id="count-succeeded">1<', both.text), both.text
        two = web.get("/tasks", params={"q": "resource:a resource:b"})
        assert two.status_code == 400 and "resource: give one" in two.text
        counts = web.get("/tasks/counts", params={"q": "type:diag.fail"})
        assert re.search(r'id="count-failed">1<', counts.text), counts.text
        assert re.search(r'id="count-succeeded">0<', counts.text)
        bad = web.get("/tasks", params={"q": "colour:red"})
        assert bad.status_code == 400 and "unknown key &#39;colour&#39;" in bad.text
        jump = web.get("/tasks", params={"q": done.id}, follow_redirects=False)
        assert jump.status_code == 303 and jump.headers["location"] == f"/tasks/{done.id}"
        task = web.get(f"/tasks/{failed.id}")
        assert task.status_code == 200
        assert "the ledger is locked" in task.text and "stack trace" in task.text
        assert 'class="bar failed"' in task.text and "diag.fail" in task.text
        assert "hx-get" not in task.text.split('id="task-live"')[1].split(">")[0]  # done
        assert web.get("/tasks/no-such-task").status_code == 404
        assert "nightly" in web.get("/schedules").text
        assert "no stream declared" in web.get("/streams").text
        assert "dead-letter queue is empty" in web.get("/dead-letters").text
        types = web.get("/types")
        assert "diag.sleep" in types.text and "SYNCHRONIZE_MODEL" in types.text
        assert web.get("/static/htmx.min.js").status_code == 200


def test_live_fragments_follow_a_running_task(cluster: Cluster) -> None:
    cluster.start_node()
    with cluster.client() as client, console(cluster) as web:
        # running through the checks below on a loaded box too (3 s left little margin)
        task = client.submit("diag.sleep", {"seconds": 8})
        assert wait_until(lambda: task.id in web.get("/tasks/running").text, 30, 0.2)
        (attempt,) = cluster.store.attempts.for_task(task.id)  # a checkpoint, as its owner
        cluster.store.checkpoints.commit(Fence(task.id, attempt.fence, attempt.id),
                                         attempt.seq, {"next": 7})
        assert "10 B, " in web.get("/tasks/running").text  # its size and age
        live = web.get(f"/tasks/{task.id}/live")
        assert 'hx-trigger="every 2s"' in live.text and "RUNNING" in live.text
        assert re.search(r'id="checkpoint">10 B, \d+\w* ago \(attempt 1\)<', live.text), \
            live.text
        assert wait_until(lambda: "SUCCEEDED" in web.get(f"/tasks/{task.id}/live").text,
                          30, 0.2)
        assert 'hx-trigger' not in web.get(f"/tasks/{task.id}/live").text  # stops polling


def test_read_only_has_no_action_route_or_control(cluster: Cluster) -> None:
    cluster.start_node()
    with cluster.client() as client, console(cluster) as web:
        task = client.submit("diag.sleep", {"seconds": 30})
        page = web.get(f"/tasks/{task.id}")
        assert "<form method=\"post\"" not in page.text and "csrf" not in page.text
        for path in (f"/tasks/{task.id}/cancel", f"/tasks/{task.id}/deactivate",
                     f"/tasks/{task.id}/skip", "/dead-letters/x/replay",
                     "/schedules/x/pause"):
            answer = web.post(path, headers={"authorization": BASIC})
            assert answer.status_code in (404, 405), (path, answer.status_code)
        client.cancel(task.id)


def test_actions_need_credentials_and_a_csrf_token(cluster: Cluster) -> None:
    cluster.start_node()
    with cluster.client() as client, console(cluster, allow_actions=True) as web:
        task = client.submit("diag.sleep", {"seconds": 30})
        assert wait_until(lambda: client.get(task.id).task.status == "RUNNING", 30, 0.1)
        page = web.get(f"/tasks/{task.id}")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token and 'id="action-cancel"' in page.text
        path = f"/tasks/{task.id}/cancel"
        no_auth = web.post(path, data={"csrf": token.group(1)})
        assert no_auth.status_code == 401 and "Basic" in no_auth.headers["www-authenticate"]
        wrong = web.post(path, data={"csrf": token.group(1)},
                         headers={"authorization": "Basic " + base64.b64encode(
                             b"ops:wrong").decode()})
        assert wrong.status_code == 401
        forged = web.post(path, data={"csrf": "x" * 43}, headers={"authorization": BASIC})
        assert forged.status_code == 403
        other_site = web.post(path, data={"csrf": token.group(1)},
                              headers={"authorization": BASIC,
                                       "origin": "http://evil.example"})
        assert other_site.status_code == 403
        assert client.get(task.id).task.status == "RUNNING"  # nothing done so far
        done = web.post(path, data={"csrf": token.group(1)},
                        headers={"authorization": "Bearer t0ken-abc"},
                        follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == f"/tasks/{task.id}"
        report = client.wait(task.id, 30)
        assert report.attempts[-1].status == "CANCELLED"


def test_the_console_refuses_to_be_exposed_without_credentials_or_tls(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    tls = Transport(pki.server_cert, pki.server_key)
    with pytest.raises(ConfigError, match=r"refuses to listen on 0\.0\.0\.0"):
        check_bind("0.0.0.0", Credentials(), False, tls)
    with pytest.raises(ConfigError, match="--allow-actions needs credentials"):
        check_bind("127.0.0.1", Credentials(), True)
    # credentials beyond loopback: only over TLS, or behind a TLS-terminating proxy
    with pytest.raises(ConfigError, match=r"refuses to serve credentials in clear on 0\.0\.0"):
        check_bind("0.0.0.0", CREDENTIALS, True)
    check_bind("0.0.0.0", CREDENTIALS, True, tls)
    check_bind("0.0.0.0", CREDENTIALS, True, Transport(behind_proxy=True))
    check_bind("127.0.0.1", Credentials(), False)
    check_bind("127.0.0.1", CREDENTIALS, True)  # loopback: the path is this machine
    with pytest.raises(ConfigError, match="go together"):
        check_bind("127.0.0.1", CREDENTIALS, True, Transport(pki.server_cert))
    with pytest.raises(ConfigError, match="cannot use the TLS certificate"):
        check_bind("127.0.0.1", CREDENTIALS, True, Transport(pki.server_cert, pki.client_key))
    with pytest.raises(ConfigError, match="not an address"):
        check_bind("0.0.0.0", CREDENTIALS, True,
                   Transport(behind_proxy=True, proxies=("proxy.example",)))
    assert repr(CREDENTIALS).count("s3cret") == 0  # a SecretStr never shows


def test_the_query_box() -> None:
    query = parse_query("type:billing.sync state:stopped owner:h:1:ab key:acct-7 resource:p")
    assert query.filters == {"type": ("billing.sync",), "state": ("stopped",),
                             "owner": ("h:1:ab",), "ordering_key": ("acct-7",)}
    assert query.resource == "p"
    twice = parse_query("type:a type:b state:waiting type:a state:stopped")
    assert twice.filters == {"type": ("a", "b"), "state": ("waiting", "stopped")}
    with pytest.raises(QueryError, match="resource: give one"):
        parse_query("resource:p resource:q")
    with pytest.raises(QueryError, match="state:lost"):
        parse_query("state:lost")
    with pytest.raises(QueryError, match="neither key:value nor a task id"):
        parse_query("hello")


def test_latchwork_web_refuses_an_exposed_bind_in_one_line(cluster: Cluster) -> None:
    for args in (["--host", "0.0.0.0"], ["--allow-actions"]):
        run = cluster.cli("web", "--port", "0", *args, timeout=60)
        assert run.exit_code == 2, run.output
        lines = run.output.strip().splitlines()
        assert len(lines) == 1 and "credentials" in lines[0], run.output
    cluster.env.update(LATCHWORK_WEB_USERNAME="ops", LATCHWORK_WEB_PASSWORD="s3cret-pass")
    run = cluster.cli("web", "--port", "0", "--host", "0.0.0.0", timeout=60)
    assert run.exit_code == 2, run.output
    (line,) = run.output.strip().splitlines()
    assert "in clear on 0.0.0.0" in line and "--tls-cert" in line and "--behind-proxy" in line


AUTH = {"Authorization": BASIC}
CREDENTIAL_ENV = {"LATCHWORK_WEB_USERNAME": "ops", "LATCHWORK_WEB_PASSWORD": "s3cret-pass"}


def _get(url: str, headers: dict[str, str], context: ssl.SSLContext | None = None
         ) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return answer.status, answer.headers


def test_over_tls_the_csrf_cookie_is_secure_and_hsts_is_sent(cluster: Cluster,
                                                                tmp_path: Path) -> None:
    """Issue 41: ``--tls-cert``/``--tls-key``: the console serves HTTPS itself (checked
    against the test's CA), every response carries HSTS, and the CSRF cookie is ``Secure``,
    ``HttpOnly`` and ``SameSite=Strict``; plain HTTP is not served on that port."""
    pki = Pki.create(tmp_path / "pki")
    cluster.start_node()
    url, web = cluster.start_web("--allow-actions", "--tls-cert", str(pki.server_cert),
                                 "--tls-key", str(pki.server_key), scheme="https",
                                 cafile=str(pki.ca), **CREDENTIAL_ENV)
    assert url.startswith("https://") and web.lines[-1].startswith("latchwork web on https://")
    context = ssl.create_default_context(cafile=str(pki.ca))
    status, headers = _get(f"{url}/types", AUTH, context)
    assert status == 200
    assert headers["strict-transport-security"] == "max-age=31536000"
    cookie = headers["set-cookie"]
    assert cookie.startswith("latchwork_csrf=")
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"secure", "httponly", "samesite=strict"} <= flags, cookie
    with pytest.raises(urllib.error.URLError):  # no certificate the system trusts
        _get(f"{url}/types", AUTH, ssl.create_default_context())
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP
        _get(url.replace("https://", "http://") + "/types", AUTH)


def test_behind_a_proxy_forwarded_headers_count_from_its_addresses_only(
        cluster: Cluster) -> None:
    """Issue 41: ``--behind-proxy`` honours ``X-Forwarded-Proto``/``-For`` from the listed
    proxies only: from an address not on the list they are ignored (no HSTS, no Secure
    cookie, the access line names the real peer); from a listed one they count."""
    cluster.start_node()
    forwarded = {**AUTH, "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    elsewhere, far = cluster.start_web("--allow-actions", "--behind-proxy", "--proxy",
                                       "192.0.2.10", **CREDENTIAL_ENV)
    near, local = cluster.start_web("--allow-actions", "--behind-proxy", **CREDENTIAL_ENV)
    _, ignored = _get(f"{elsewhere}/types", forwarded)
    assert "strict-transport-security" not in ignored
    assert "secure" not in ignored["set-cookie"].lower()
    _, honoured = _get(f"{near}/types", forwarded)
    assert honoured["strict-transport-security"] == "max-age=31536000"
    assert "; secure" in honoured["set-cookie"].lower()
    assert far.terminate() == 0 and local.terminate() == 0
    far_log, near_log = far.log_path.read_text(), local.log_path.read_text()
    assert '127.0.0.1:' in far_log and "203.0.113.7" not in far_log, far_log
    assert '203.0.113.7:0 - "GET /types' in near_log, near_log


def test_latchwork_web_keeps_its_connections_logs_what_matters_and_exits_0(
        cluster: Cluster, amqp_vhost: AmqpNamespace) -> None:
    """Issue 40: the cluster page's live part asked for the dead-letter count every 2 s, each
    over a new AMQP connection (26 a minute, 358 of 360 log lines pika's); SIGTERM ended the
    console with 143. Now: a kept connection (the broker sees a handful from the console, not
    one per refresh), no pika line, an access line per page but none per successful refresh,
    and exit 0 on SIGTERM."""
    cluster.start_node()
    url, web = cluster.start_web()
    for _ in range(3):
        assert urllib.request.urlopen(f"{url}/cluster", timeout=10).status == 200
    for _ in range(20):
        assert urllib.request.urlopen(f"{url}/cluster/live", timeout=10).status == 200
    assert web.terminate() == 0

    def console_connections() -> tuple[int, int]:
        """(opened, closed) connections of the console, as the broker logs them (it writes
        its log a moment later: read until every one opened is seen closed)."""
        assert isinstance(amqp_vhost.server, RabbitMQServer)
        text = amqp_vhost.server.broker_log.read_text(errors="replace")
        lines = [line for line in text.splitlines() if amqp_vhost.vhost in line]
        return (sum("- latchwork web)" in line and "granted access" in line for line in lines),
                sum("- latchwork web," in line and "closing AMQP" in line for line in lines))
    assert wait_until(lambda: console_connections()[0] == console_connections()[1] > 0, 20,
                      0.2), console_connections()
    opened, _ = console_connections()
    assert opened <= 6, opened  # before: 26, one per dead-letter count
    log = web.log_path.read_text(errors="replace").splitlines()
    assert not [line for line in log if " pika" in line], log
    pages = [line for line in log if '"GET /cluster HTTP/1.1" 200' in line]
    assert len(pages) == 3, log
    assert not [line for line in log if "/cluster/live" in line], log
    assert log[-1].endswith("latchwork web stopped"), log


def _cert(directory: Path, name: str, not_before: datetime, not_after: datetime
          ) -> tuple[Path, Path]:
    """A server certificate valid from ``not_before`` to ``not_after`` (trustme), its key."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    leaf = trustme.CA().issue_cert("127.0.0.1", not_before=not_before, not_after=not_after)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    return cert, key


def test_a_certificate_out_of_its_dates_or_a_directory_is_refused_in_one_line(
        cluster: Cluster, tmp_path: Path) -> None:
    """An expired certificate was served without a word (clients then failed with
    "certificate has expired"), one not valid yet likewise, and a directory given as
    --tls-cert printed click's three-line usage error."""
    now = datetime.now(UTC)
    expired = _cert(tmp_path, "expired", now - timedelta(days=30), now - timedelta(days=1))
    early = _cert(tmp_path, "early", now + timedelta(days=1), now + timedelta(days=30))
    cases = [(expired, "expired on " + f"{now - timedelta(days=1):%Y-%m-%d}"),
             (early, "is not valid before " + f"{now + timedelta(days=1):%Y-%m-%d}"),
             ((tmp_path, expired[1]), "is a directory, not a PEM file")]
    for (cert, key), says in cases:
        run = cluster.cli("web", "--port", "0", "--tls-cert", str(cert), "--tls-key", str(key),
                          timeout=60)
        lines = run.output.strip().splitlines()
        assert run.exit_code == 2 and len(lines) == 1 and says in lines[0], run.output


def test_a_certificate_near_its_end_is_warned_of_in_the_log(cluster: Cluster,
                                                             tmp_path: Path) -> None:
    now = datetime.now(UTC)
    cert, key = _cert(tmp_path, "soon", now - timedelta(days=60), now + timedelta(days=5))
    web = subprocess.Popen([sys.executable, "-m", "runner.cli", "web", "--port", "0",
                            "--tls-cert", str(cert), "--tls-key", str(key)], env=cluster.env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert web.stdout is not None
        seen = []
        for line in web.stdout:
            seen.append(line)
            if "latchwork web on https://" in line:
                break
        text = "".join(seen)
        assert f"expires on {now + timedelta(days=5):%Y-%m-%d}" in text, text
        assert "WARNING" in text and "renew it" in text
    finally:
        web.terminate()
        web.communicate(timeout=30)  # its pipe read to the end and closed


def _status(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """POST an action (an empty form): the status and headers. Actions need credentials even
    on loopback (pages do beyond it): 401 or 429 before the credentials are accepted, 403 (no
    CSRF token) after."""
    request = urllib.request.Request(url, data=b"", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}


def test_the_login_throttle_waits_longer_with_each_failure_past_the_free_ones() -> None:
    """The throttle's arithmetic on a clock of the test's: 5 failures are free, the 5th starts
    a 2 s wait, each failure after a wait doubles it (to 300 s at most), a success clears it,
    a minute without failures after the last wait forgets them. (The real console: below.)"""
    from runner.web.logins import LoginThrottle

    now = [1000.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    for _ in range(4):
        throttle.failed("a")
        assert throttle.wait("a") == 0
    throttle.failed("a")
    assert throttle.wait("a") == 2.0 and throttle.wait("b") == 0
    waits = []
    for _ in range(9):
        now[0] += throttle.wait("a")  # waited it out, then failed again
        throttle.failed("a")
        waits.append(throttle.wait("a"))
    assert waits[:4] == [4.0, 8.0, 16.0, 32.0] and waits[-1] == 300.0
    throttle.succeeded("a")
    assert throttle.wait("a") == 0
    for _ in range(5):
        throttle.failed("c")
    now[0] += 2 + 61  # its wait (2 s), then a minute without a failure
    throttle.failed("c")  # the five before are forgotten: one failure now
    assert throttle.wait("c") == 0


def test_failed_logins_are_throttled_per_client_address(cluster: Cluster) -> None:
    """30 wrong passwords in 9.8 s were all answered 401 at full speed. Now an address that
    failed 5 times within a minute gets 429 with Retry-After (growing), wrong tokens count
    too, the throttled address is logged once, and the right password keeps working for
    everyone else: behind a listed proxy each client is its X-Forwarded-For address, so one
    attacker does not lock out the others."""
    cluster.env["LATCHWORK_WEB_TOKEN"] = "the-right-token"
    cluster.start_node()
    base, web = cluster.start_web("--allow-actions", "--behind-proxy", **CREDENTIAL_ENV)
    url = f"{base}/tasks/no-such-task/cancel"
    wrong = "Basic " + base64.b64encode(b"ops:wrong").decode()
    attacker = {"X-Forwarded-For": "203.0.113.66"}
    answers = [_status(url, {**attacker, "Authorization": wrong}) for _ in range(4)]
    answers.append(_status(url, {**attacker, "Authorization": "Bearer nope"}))
    assert [code for code, _ in answers] == [401] * 5
    for _ in range(25):  # within its first wait (2 s): not even checked
        code, headers = _status(url, {**attacker, "Authorization": wrong})
        assert code == 429 and 1 <= int(headers["retry-after"]) <= 2, (code, headers)
    # the attacker's right password waits too; every other client gets past the login
    assert _status(url, {**attacker, **AUTH})[0] == 429
    assert _status(url, {"X-Forwarded-For": "198.51.100.7", **AUTH})[0] == 403
    assert _status(url, {**AUTH})[0] == 403  # the proxy itself
    assert _status(url, {"X-Forwarded-For": "198.51.100.8", "Authorization": wrong})[0] == 401
    assert _status(url, {"X-Forwarded-For": "198.51.100.9",
                         "Authorization": "Bearer the-right-token"})[0] == 403
    # a request without credentials is no failed login
    for _ in range(8):
        assert _status(url, {"X-Forwarded-For": "198.51.100.10"})[0] == 401
    assert web.terminate() == 0
    log = web.log_path.read_text()
    assert log.count("failed logins from 203.0.113.66") == 1, log
