"""The web console's routes: server-rendered pages (Starlette, Jinja2) over
:class:`runner.client.Client`, with htmx fragments polled every 2 s for what is live.

Read-only unless built with ``allow_actions``: then, and only then, the POST routes of the
actions exist (cancel, deactivate, reactivate, skip, dead-letter replay, schedule pause and
resume), each behind credentials and a CSRF check (:mod:`runner.web.security`).

Failure behaviour: a request the cluster refuses shows its message with the status 400 (a bad
query) or 404 (no such task, dead letter); no node answering, no broker, or a graph that is
full or out of reach (``store_full``, ``store_unavailable``) shows a 503 page naming the cause;
the console itself keeps running and the next request tries again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from runner.client import Client
from runner.errors import (
    BrokerUnreachable,
    ClientError,
    NoAnswer,
    RequestRefused,
    StoreFull,
    StoreUnavailable,
)
from runner.web import logins, security
from runner.web.drawing import svg
from runner.web.security import Credentials
from runner.web.views import (
    QueryError,
    age,
    checkpoint,
    duration,
    parse_query,
    pretty,
    schema_fields,
    shown_checkpoint,
    shown_result,
    task_state,
    timeline,
)

HERE = Path(__file__).parent
LIVE_EVERY = "every 2s"  # what is active refreshes this often, the rest never
#: the error codes of a cluster that cannot serve now (its graph full or out of reach): 503
UNAVAILABLE = (StoreFull.error_code, StoreUnavailable.error_code)
#: the live fragments the pages poll (every 2 s while a page is open)
REFRESHES = ("/live", "/tasks/running")


class QuietRefreshes(logging.Filter):
    """Drops the access lines of live refreshes that succeeded (uvicorn's access record:
    client, method, path, HTTP version, status), so the log shows what people asked for and
    what failed, not 30 polls a minute per open page."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            path, status = str(args[2]).split("?", 1)[0], args[4]
            if path.endswith(REFRESHES) and isinstance(status, int) and status < 400:
                return False
        return True


class Console:
    """The console's state: how to reach the cluster (one client per server thread), its
    credentials and whether actions exist."""

    def __init__(self, connect: Callable[[], Client], credentials: Credentials,
                 allow_actions: bool, pages_need_auth: bool) -> None:
        self.connect = connect
        self.credentials = credentials
        self.throttle = logins.LoginThrottle()
        self.allow_actions = allow_actions
        self.pages_need_auth = pages_need_auth
        self._local = threading.local()
        self._clients: list[Client] = []
        self._lock = threading.Lock()
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.globals.update(
            age=age, checkpoint=checkpoint, duration=duration, pretty=pretty, task_state=task_state,
            schema_fields=schema_fields, LIVE_EVERY=LIVE_EVERY)

    def client(self) -> Client:
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self.connect()
            with self._lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients:
                client.close()
            self._clients.clear()

    def authorize(self, request: Request) -> Response | None:
        """None when the request carries the credentials, else its 401 or 429
        (:func:`~runner.web.security.authorize`: failed logins are throttled per address)."""
        return logins.authorize(request, self.credentials, self.throttle)

    def render(self, request: Request, name: str, http_status: int = 200,
               **context: Any) -> Response:
        if self.pages_need_auth and (refused := self.authorize(request)) is not None:
            return refused
        context.update(request=request, actions=self.allow_actions,
                       now=datetime.now(UTC))
        if self.allow_actions:
            context["csrf"] = security.csrf_token(request)
        response = self.templates.TemplateResponse(request, name, context,
                                                   status_code=http_status)
        return security.keep_token(request, response)

    def call(self, request: Request, fn: Callable[[Client], Any]) -> Any:
        """Run one client call; a refused request is a 400, a missing thing a 404, no
        cluster a 503 (raised as HTTPException and shown on the error page)."""
        try:
            return fn(self.client())
        except RequestRefused as exc:
            raise HTTPException(400, exc.detail) from exc
        except (NoAnswer, BrokerUnreachable) as exc:
            self._local.client = None  # a fresh connection next time
            raise HTTPException(503, str(exc)) from exc
        except ClientError as exc:
            code = str(getattr(exc, "code", ""))
            status = 404 if code.endswith("not_found") else \
                503 if code in UNAVAILABLE else 502
            raise HTTPException(status, str(exc)) from exc


def _view(template: str, build: Callable[[Console, Request], dict[str, Any]]
          ) -> Callable[[Request], Response]:
    """A page (or its live fragment) rendered from what ``build`` reads."""
    def endpoint(request: Request) -> Response:
        c: Console = request.app.state.console
        return c.render(request, template, **build(c, request))
    return endpoint


def _cluster(c: Console, request: Request) -> dict[str, Any]:
    status = c.call(request, lambda cl: cl.cluster_status())
    running, _ = c.call(request, lambda cl: cl.search(state="running", limit=200))
    dead = c.call(request, lambda cl: cl.dead_letter_count())
    runs: dict[str, list[Any]] = {}
    for task in running:
        runs.setdefault(task.owner or "", []).append(task)
    return {"status": status, "runs": runs, "dead_letters": dead}


def tasks_page(request: Request) -> Response:
    c: Console = request.app.state.console
    text = request.query_params.get("q", "")
    before = request.query_params.get("before") or None
    try:
        query = parse_query(text)
    except QueryError as exc:
        return c.render(request, "tasks.html", http_status=400, q=text, error=str(exc), tasks=[],
                        next=None, before=None)
    if query.task_id is not None:
        return RedirectResponse(f"/tasks/{query.task_id}", status_code=303)
    tasks, following = c.call(request, lambda cl: cl.search(
        before=before, type=query.get("type"), state=query.get("state"),
        owner=query.get("owner"), ordering_key=query.get("ordering_key"),
        resource=query.resource))
    return c.render(request, "tasks.html", q=text, error=None, tasks=tasks, next=following,
                    before=before)


def task_counts(request: Request) -> Response:
    c: Console = request.app.state.console
    text = request.query_params.get("q", "")
    try:
        query = parse_query(text)
    except QueryError as exc:
        raise HTTPException(400, str(exc)) from exc
    counts = c.call(request, lambda cl: cl.task_counts(
        type=query.get("type"), owner=query.get("owner"),
        ordering_key=query.get("ordering_key"), resource=query.resource))
    base = " ".join(t for t in text.split() if not t.startswith("state:"))
    return c.render(request, "counts.html", counts=counts, base=base,
                    selected=query.get("state") or ())


def running_live(request: Request) -> Response:
    c: Console = request.app.state.console
    running, _ = c.call(request, lambda cl: cl.search(state="running", limit=50))
    return c.render(request, "running.html", running=running)


def _task(c: Console, request: Request) -> dict[str, Any]:
    task_id = request.path_params["task_id"]
    report = c.call(request, lambda cl: cl.get(task_id))
    incidents = [i for i in c.call(request, lambda cl: cl.cluster_status()).incidents
                 if i.task == task_id]
    found = c.call(request, lambda cl: cl.checkpoint(task_id)) \
        if report.task.checkpoint is not None else None
    return {"report": report, "task": report.task, "bars": timeline(report.attempts),
            "incidents": incidents, "state": task_state(report.task),
            "checkpoint_value": shown_checkpoint(found),
            "result_value": shown_result(report.result)}


def workflow_page(request: Request) -> Response:
    """A workflow drawn as a graph (:mod:`runner.web.drawing`) with its members' states."""
    c: Console = request.app.state.console
    workflow_id = request.path_params["workflow_id"]
    report = c.call(request, lambda cl: cl.workflow(workflow_id))
    return c.render(request, "workflow.html", report=report, drawing=svg(report.members))


def schedules_page(request: Request) -> Response:
    c: Console = request.app.state.console
    return c.render(request, "schedules.html",
                    schedules=c.call(request, lambda cl: cl.schedules()))


def streams_page(request: Request) -> Response:
    c: Console = request.app.state.console
    return c.render(request, "streams.html", streams=c.call(request, lambda cl: cl.streams()))


def dead_letters_page(request: Request) -> Response:
    c: Console = request.app.state.console
    letters = c.call(request, lambda cl: cl.dead_letters(200))
    return c.render(request, "dead_letters.html", letters=letters)


def dead_letter_page(request: Request) -> Response:
    c: Console = request.app.state.console
    message_id = request.path_params["message_id"]
    letter = c.call(request, lambda cl: cl.dead_letter(message_id))
    return c.render(request, "dead_letter.html", letter=letter, view=letter.view())


def types_page(request: Request) -> Response:
    c: Console = request.app.state.console
    return c.render(request, "types.html", types=c.call(request, lambda cl: cl.task_types()),
                    commands=c.call(request, lambda cl: cl.commands()))


def home(request: Request) -> Response:
    return RedirectResponse("/cluster", status_code=307)


async def error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    c: Console = request.app.state.console
    if exc.status_code == 401:
        return security.challenge()
    return c.templates.TemplateResponse(request, "error.html", {
        "request": request, "status": exc.status_code, "detail": exc.detail,
        "actions": False, "now": datetime.now(UTC)}, status_code=exc.status_code)


def create_app(connect: Callable[[], Client], credentials: Credentials | None = None, *,
               allow_actions: bool = False, pages_need_auth: bool = False) -> Starlette:
    """The console over ``connect()`` (a new :class:`Client` per server thread)."""
    from runner.web.actions import action_routes

    credentials = credentials or Credentials()
    if allow_actions and not credentials.configured:
        raise ValueError("actions need credentials")
    console = Console(connect, credentials, allow_actions, pages_need_auth)
    routes: list[Any] = [
        Route("/", home),
        Route("/cluster", _view("cluster.html", _cluster)),
        Route("/cluster/live", _view("cluster_live.html", _cluster)),
        Route("/tasks", tasks_page),
        Route("/tasks/counts", task_counts),
        Route("/tasks/running", running_live),
        Route("/tasks/{task_id}", _view("task.html", _task)),
        Route("/tasks/{task_id}/live", _view("task_live.html", _task)),
        Route("/workflows/{workflow_id}", workflow_page),
        Route("/schedules", schedules_page),
        Route("/streams", streams_page),
        Route("/dead-letters", dead_letters_page),
        Route("/dead-letters/{message_id}", dead_letter_page),
        Route("/types", types_page),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if allow_actions:  # without it no route that changes anything exists
        routes.extend(action_routes())
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        console.close()

    app = Starlette(routes=routes, exception_handlers={HTTPException: error_page},
                    middleware=[Middleware(security.HstsMiddleware)], lifespan=lifespan)
    app.state.console = console
    return app
