"""The console's actions, routed only when ``latchwork web --allow-actions`` (see
:mod:`runner.web.app`): each a POST behind credentials and a CSRF check, carried out by one
client call, then a redirect (303) back to the page it came from.

Failure behaviour: no or wrong credentials: 401 (a browser asks for them); a failed CSRF check:
403; a refused action (a finished task cannot be skipped): its message on the error page with
400; nothing is done in any of these cases.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from runner.client import Client
from runner.web import security

log = logging.getLogger("latchwork.web")


def _action(name: str, call: Callable[[Client, Request], Any],
            back: Callable[[Request], str]) -> Callable[[Request], Any]:
    async def run(request: Request) -> Response:
        console = request.app.state.console  # runner.web.app.Console
        refused: Response | None = console.authorize(request)
        if refused is not None:
            return refused
        form = await request.form()
        token = form.get(security.CSRF_FIELD)
        if not security.csrf_ok(request, token if isinstance(token, str) else None):
            raise HTTPException(403, "the form's CSRF token does not match: reload the page")
        from starlette.concurrency import run_in_threadpool
        await run_in_threadpool(console.call, request, lambda cl: call(cl, request))
        log.info("web console: %s %s", name, request.path_params)
        return RedirectResponse(back(request), status_code=303)
    return run


def _task(request: Request) -> str:
    return str(request.path_params["task_id"])


def action_routes() -> list[Route]:
    to_task: Callable[[Request], str] = lambda r: f"/tasks/{_task(r)}"  # noqa: E731
    return [
        Route("/tasks/{task_id}/cancel", _action(
            "cancel", lambda cl, r: cl.cancel(_task(r), reason="cancelled from the web "
                                                            "console"), to_task),
              methods=["POST"]),
        Route("/tasks/{task_id}/deactivate", _action(
            "deactivate", lambda cl, r: cl.deactivate(_task(r)), to_task), methods=["POST"]),
        Route("/tasks/{task_id}/reactivate", _action(
            "reactivate", lambda cl, r: cl.reactivate(_task(r)), to_task), methods=["POST"]),
        Route("/tasks/{task_id}/skip", _action(
            "skip", lambda cl, r: cl.skip(_task(r)), to_task), methods=["POST"]),
        Route("/dead-letters/{message_id}/replay", _action(
            "replay", lambda cl, r: cl.replay(r.path_params["message_id"]),
            lambda r: "/dead-letters"), methods=["POST"]),
        Route("/schedules/{name}/pause", _action(
            "pause", lambda cl, r: cl.schedule_pause(r.path_params["name"], True),
            lambda r: "/schedules"), methods=["POST"]),
        Route("/schedules/{name}/resume", _action(
            "resume", lambda cl, r: cl.schedule_pause(r.path_params["name"], False),
            lambda r: "/schedules"), methods=["POST"]),
    ]
