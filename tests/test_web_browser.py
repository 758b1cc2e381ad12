"""The web console in a real headless Chromium (Debian's ``chromium``, driven by Playwright with
``executable_path``: nothing is downloaded), against ``latchwork web`` and node processes of a
real cluster: each page, the query box and the back button, a task's attempts on the timeline,
a running task turning succeeded without a reload, a node killed -9 under a task (its attempt
CANCELLED_BY_SYSTEM, then the next one), no action without ``--allow-actions``, and with it a
cancel that needs credentials.

``LATCHWORK_SCREENSHOTS=DIR`` (``make screenshots``) saves the cluster and task pages there:
the README's pictures."""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coord.testing import NodeProcess, free_ports, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.testing.cluster import Cluster

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="Debian's chromium is not installed (make setup does)")
SHOTS = os.environ.get("LATCHWORK_SCREENSHOTS")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def cluster(zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
            spawn_node: Callable[..., NodeProcess]) -> Iterator[Cluster]:
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node)
    yield c
    c.store.close()


def start_web(cluster: Cluster, *args: str, **env: str) -> str:
    (port,) = free_ports(1)
    cluster.spawn(["-m", "runner.cli", "web", "--port", str(port), *args], name="web",
                  env={**cluster.env, **env}, ready_prefix="latchwork web")
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/static/style.css", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False
    assert wait_until(answers, 30, 0.1)
    return url


@pytest.fixture
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


def shot(page: object, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name), full_page=True)  # type: ignore[attr-defined]


def test_the_console_in_a_browser(cluster: Cluster, browser: object) -> None:
    first = cluster.start_node()
    second = cluster.start_node()
    url = start_web(cluster)
    with cluster.client() as client:
        failed = client.submit("diag.fail", {"message": "the ledger is locked"})
        done = client.submit("diag.sleep", {"seconds": 0.05})
        client.wait(failed.id, 30)
        client.wait(done.id, 30)
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]

    # every page opens
    for path, text in (("/cluster", first), ("/tasks", done.id), ("/schedules", "no schedule"),
                       ("/streams", "no stream declared"), ("/dead-letters", "empty"),
                       ("/types", "diag.sleep")):
        response = page.goto(url + path)
        assert response.status == 200, path
        assert text in page.content(), path
    page.goto(url + "/cluster")
    page.wait_for_selector("#members")
    assert second in page.inner_text("#members")

    # the query box filters on the server; the back button goes back
    page.goto(url + "/tasks")
    page.fill("#q", "type:diag.fail")
    page.click("#search button")
    page.wait_for_url("**/tasks?q=type*")
    rows = page.inner_text("#tasks")
    assert failed.id in rows and done.id not in rows
    page.wait_for_selector("#count-stopped")
    assert page.inner_text("#count-stopped") == "1"
    page.go_back()
    assert page.url.rstrip("/").endswith("/tasks") and done.id in page.inner_text("#tasks")
    assert page.locator("form[method=post]").count() == 0  # read-only: no action control

    # a task's attempts; a running task turns succeeded without a reload
    page.goto(f"{url}/tasks/{failed.id}")
    assert "FAILED" in page.inner_text("#attempts")
    assert page.locator("#timeline .bar.failed").count() == 1
    with cluster.client() as client:
        running = client.submit("diag.sleep", {"seconds": 3})
    page.goto(f"{url}/tasks/{running.id}")
    page.evaluate("window.notReloaded = true")
    page.wait_for_function("document.querySelector('#state').textContent == 'finished'",
                           timeout=30_000)
    assert page.evaluate("window.notReloaded") is True
    assert "SUCCEEDED" in page.inner_text("#attempts")

    # kill -9 the node running a task: CANCELLED_BY_SYSTEM appears, then the next attempt
    with cluster.client() as client:
        victim_task = client.submit("diag.sleep", {"seconds": 6})
    owner = cluster.wait_running_on(victim_task.id)
    page.goto(url + "/cluster")  # the live view names the task and its lock
    page.wait_for_selector(f"#locks a[href='/tasks/{victim_task.id}']", timeout=10_000)
    shot(page, "web-cluster.png")
    page.goto(f"{url}/tasks/{victim_task.id}")
    page.evaluate("window.notReloaded = true")
    cluster.nodes[owner].kill()
    page.wait_for_selector("tr.attempt[data-status=CANCELLED_BY_SYSTEM]", timeout=30_000)
    page.wait_for_function("document.querySelectorAll('tr.attempt').length == 2",
                           timeout=30_000)
    page.wait_for_selector("tr.attempt[data-status=SUCCEEDED]", timeout=30_000)
    assert page.evaluate("window.notReloaded") is True
    assert page.locator("#timeline .bar").count() == 2
    assert page.locator("#timeline .bar.system").count() == 1
    shot(page, "web-task.png")


def test_actions_need_the_flag_and_credentials(cluster: Cluster, browser: object) -> None:
    cluster.start_node()
    read_only = start_web(cluster)
    acting = start_web(cluster, "--allow-actions", LATCHWORK_WEB_USERNAME="ops",
                       LATCHWORK_WEB_PASSWORD="s3cret-pass")
    with cluster.client() as client:
        task = client.submit("diag.sleep", {"seconds": 60})
    cluster.wait_running_on(task.id)
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(f"{read_only}/tasks/{task.id}")
    assert page.locator("#action-cancel").count() == 0
    answer = page.request.post(f"{read_only}/tasks/{task.id}/cancel")
    assert answer.status in (404, 405)

    # with --allow-actions the control is there; without credentials the browser is asked
    page.goto(f"{acting}/tasks/{task.id}")
    with page.expect_response(lambda r: r.url.endswith("/cancel")) as asked:
        page.click("#action-cancel")
    assert asked.value.status == 401
    assert asked.value.headers["www-authenticate"].startswith("Basic")
    with cluster.client() as client:
        assert client.get(task.id).task.status == "RUNNING"
    context = browser.new_context(  # type: ignore[attr-defined]
        http_credentials={"username": "ops", "password": "s3cret-pass"})
    authed = context.new_page()
    authed.goto(f"{acting}/tasks/{task.id}")
    authed.click("#action-cancel")
    authed.wait_for_url(f"{acting}/tasks/{task.id}")
    authed.wait_for_selector("tr.attempt[data-status=CANCELLED]", timeout=30_000)
    assert authed.inner_text("#state") == "stopped"
    context.close()
