"""The web console in a real headless Chromium (Debian's ``chromium``, driven by Playwright with
``executable_path``: nothing is downloaded), against ``latchwork web`` and node processes of a
real cluster: each page, the query box and the back button, a task's attempts on the timeline,
a running task turning succeeded without a reload, a node killed -9 under a task (its attempt
CANCELLED_BY_SYSTEM, then the next one), no action without ``--allow-actions``, and with it a
cancel that needs credentials.

``LATCHWORK_SCREENSHOTS=DIR`` (``make screenshots``) saves the cluster and task pages there:
the README's pictures."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from coord.testing.tls import Pki
from runner.testing.cluster import Cluster

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="Debian's chromium is not installed (make setup does)")
SHOTS = os.environ.get("LATCHWORK_SCREENSHOTS")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def start_web(cluster: Cluster, *args: str, **env: str) -> str:
    url, _ = cluster.start_web(*args, **env)
    return url


def trusting(cert: Path) -> list[str]:
    """Chromium's flag that accepts exactly this certificate (its public key's SHA-256): the
    test's CA is in no trust store Chromium reads, and no certificate error is waved through
    for any other."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    spki = key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)
    pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    return [f"--ignore-certificate-errors-spki-list={pin}"]


def in_browser(scenario: Callable[[Any], Awaitable[None]], *flags: str) -> None:
    """Run ``scenario(browser)`` with a headless Chromium. Playwright's async API: its sync API
    switches greenlets, which leaves CPython 3.11's compiler recursion counter wrong for the
    rest of the test session ("AST constructor recursion depth mismatch" at the next import)."""
    from playwright.async_api import async_playwright

    async def main() -> None:
        async with async_playwright() as p:
            chromium = await p.chromium.launch(executable_path=CHROMIUM,
                                               args=[*FLAGS, *flags])
            try:
                await scenario(chromium)
            finally:
                await chromium.close()
    asyncio.run(main())


async def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def test_the_console_in_a_browser(cluster: Cluster) -> None:
    first = cluster.start_node()
    second = cluster.start_node()
    url = start_web(cluster)
    with cluster.client() as client:
        failed = client.submit("diag.fail", {"message": "the ledger is locked"})
        done = client.submit("diag.sleep", {"seconds": 0.05})
        client.wait(failed.id, 30)
        client.wait(done.id, 30)

    async def scenario(browser: Any) -> None:
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        # every page opens
        for path, text in (("/cluster", first), ("/tasks", done.id),
                           ("/schedules", "no schedule"), ("/streams", "no stream declared"),
                           ("/dead-letters", "empty"), ("/types", "diag.sleep")):
            response = await page.goto(url + path)
            assert response.status == 200, path
            assert text in await page.content(), path
        await page.goto(url + "/cluster")
        await page.wait_for_selector("#members")
        assert second in await page.inner_text("#members")

        # the query box filters on the server; the back button goes back
        await page.goto(url + "/tasks")
        await page.fill("#q", "type:diag.fail")
        await page.click("#search button")
        await page.wait_for_url("**/tasks?q=type*")
        rows = await page.inner_text("#tasks")
        assert failed.id in rows and done.id not in rows
        await page.wait_for_selector("#count-failed")
        assert await page.inner_text("#count-failed") == "1"
        await page.go_back()
        assert page.url.rstrip("/").endswith("/tasks")
        assert done.id in await page.inner_text("#tasks")
        assert await page.locator("form[method=post]").count() == 0  # read-only: no control

        # a task's attempts; a running task turns succeeded without a reload
        await page.goto(f"{url}/tasks/{failed.id}")
        assert "FAILED" in await page.inner_text("#attempts")
        assert await page.locator("#timeline .bar.failed").count() == 1
        with cluster.client() as client:
            running = client.submit("diag.sleep", {"seconds": 3})
        await page.goto(f"{url}/tasks/{running.id}")
        await page.evaluate("window.notReloaded = true")
        await page.wait_for_function(
            "document.querySelector('#state').textContent == 'succeeded'", timeout=30_000)
        assert await page.evaluate("window.notReloaded") is True
        assert "SUCCEEDED" in await page.inner_text("#attempts")

        # kill -9 the node running a task: CANCELLED_BY_SYSTEM appears, then the next attempt
        with cluster.client() as client:
            # still running when it is killed, after two page loads and a screenshot
            victim = client.submit("diag.sleep", {"seconds": 12})
        owner = cluster.wait_running_on(victim.id)
        await page.goto(url + "/cluster")  # the live view names the task and its lock
        await page.wait_for_selector(f"#locks a[href='/tasks/{victim.id}']", timeout=10_000)
        await shot(page, "web-cluster.png")
        await page.goto(f"{url}/tasks/{victim.id}")
        await page.evaluate("window.notReloaded = true")
        cluster.nodes[owner].kill()
        await page.wait_for_selector("tr.attempt[data-status=CANCELLED_BY_SYSTEM]",
                                     timeout=30_000)
        await page.wait_for_function("document.querySelectorAll('tr.attempt').length == 2",
                                     timeout=30_000)
        await page.wait_for_selector("tr.attempt[data-status=SUCCEEDED]", timeout=30_000)
        assert await page.evaluate("window.notReloaded") is True
        assert await page.locator("#timeline .bar").count() == 2
        assert await page.locator("#timeline .bar.system").count() == 1
        await shot(page, "web-task.png")

    in_browser(scenario)


def test_actions_need_the_flag_and_credentials(cluster: Cluster, tmp_path: Path) -> None:
    """The acting console serves HTTPS itself (issue 41: credentials never in clear), with a
    certificate made for the test: the browser gets HSTS and a Secure CSRF cookie."""
    pki = Pki.create(tmp_path / "pki")
    cluster.start_node()
    read_only = start_web(cluster)
    acting, _ = cluster.start_web("--allow-actions", "--tls-cert", str(pki.server_cert),
                                  "--tls-key", str(pki.server_key), scheme="https",
                                  cafile=str(pki.ca), LATCHWORK_WEB_USERNAME="ops",
                                  LATCHWORK_WEB_PASSWORD="s3cret-pass")
    with cluster.client() as client:
        task = client.submit("diag.sleep", {"seconds": 60})
    cluster.wait_running_on(task.id)

    async def scenario(browser: Any) -> None:
        page = await browser.new_page()
        await page.goto(f"{read_only}/tasks/{task.id}")
        assert await page.locator("#action-cancel").count() == 0
        answer = await page.request.post(f"{read_only}/tasks/{task.id}/cancel")
        assert answer.status in (404, 405)

        # with --allow-actions the control is there; without credentials the browser is asked
        opened = await page.goto(f"{acting}/tasks/{task.id}")
        assert acting.startswith("https://") and opened.status == 200
        assert opened.headers["strict-transport-security"] == "max-age=31536000"
        (cookie,) = [c for c in await page.context.cookies() if c["name"] == "latchwork_csrf"]
        assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"]) == (
            True, True, "Strict")
        async with page.expect_response(lambda r: r.url.endswith("/cancel")) as asked:
            await page.click("#action-cancel")
        response = await asked.value
        assert response.status == 401
        assert response.headers["www-authenticate"].startswith("Basic")
        with cluster.client() as client:
            assert client.get(task.id).task.status == "RUNNING"
        context = await browser.new_context(
            http_credentials={"username": "ops", "password": "s3cret-pass"})
        authed = await context.new_page()
        await authed.goto(f"{acting}/tasks/{task.id}")
        await authed.click("#action-cancel")
        await authed.wait_for_url(f"{acting}/tasks/{task.id}")
        await authed.wait_for_selector("tr.attempt[data-status=CANCELLED]", timeout=30_000)
        assert await authed.inner_text("#state") == "cancelled"
        await context.close()

    in_browser(scenario, *trusting(pki.server_cert))
