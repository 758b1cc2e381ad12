"""Failed logins throttled per client address (:class:`LoginThrottle`), and the one check a
page and an action make (:func:`authorize`): 401 with the challenge, 429 with
``Retry-After`` while the address waits, or the request's way on."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from runner.web.security import Credentials, challenge

log = logging.getLogger("latchwork.web")


class LoginThrottle:
    """Failed logins per client address (wrong passwords and wrong tokens alike; a request
    with no credentials is no attempt), counted until a minute passes without one after the
    last wait. An address may fail :data:`FREE` times; past that it is answered 429 with
    ``Retry-After`` (the wait left), a wait that doubles with each further failure (2 s after
    the fifth, 4 s, 8 s, ... at most :data:`LONGEST`); tries while it waits are not checked
    (so not counted), and its right password waits too. The address is the request's peer, or
    the client a listed proxy forwards (``X-Forwarded-For``, honoured from ``web_proxies``
    only): so one attacker behind a proxy does not lock out the others it fronts. A throttled
    address is logged once a minute. Thread-safe; memory stays bounded (addresses quiet for a
    minute are dropped)."""

    FREE = 5
    WINDOW = 60.0
    LONGEST = 300.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._failures: dict[str, list[float]] = {}
        self._until: dict[str, float] = {}
        self._logged: dict[str, float] = {}
        self._lock = threading.Lock()

    def wait(self, address: str) -> float:
        """Seconds ``address`` must still wait before its next try (0: it may try now)."""
        with self._lock:
            return max(0.0, self._until.get(address, 0.0) - self.clock())

    def failed(self, address: str) -> None:
        now = self.clock()
        with self._lock:
            if len(self._failures) > 10_000:
                self._forget(now)
            # failures count until a minute passes without one (a wait, however long, does
            # not wipe them: the next failure after it waits twice as long)
            recent = self._failures.get(address, [])
            if recent and now - recent[-1] >= self.WINDOW + self._waited(address, recent[-1]):
                recent = []
            recent = [*recent[-64:], now]
            self._failures[address] = recent
            over = len(recent) - self.FREE + 1  # the FREE-th failure: the first wait
            if over > 0:
                self._until[address] = now + min(self.LONGEST, 2.0 ** over)
                if now - self._logged.get(address, -self.WINDOW) >= self.WINDOW:
                    self._logged[address] = now
                    log.warning("web console: %d failed logins from %s: throttled (429, "
                                "Retry-After %.0f s)", len(recent), address,
                                self._until[address] - now)

    def _waited(self, address: str, last: float) -> float:
        """How long the wait set at the failure ``last`` of ``address`` ran."""
        return max(0.0, self._until.get(address, last) - last)

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._failures.pop(address, None)
            self._until.pop(address, None)

    def _forget(self, now: float) -> None:
        for address in [a for a, ts in self._failures.items() if now - ts[-1] >= self.WINDOW]:
            self._failures.pop(address, None)
            self._until.pop(address, None)
            self._logged.pop(address, None)


def authorize(request: Request, credentials: Credentials, throttle: LoginThrottle
              ) -> Response | None:
    """None when the request carries the credentials; else the answer: 429 while its address
    is throttled, else 401 with the challenge (a failure counted when it tried)."""
    header = request.headers.get("authorization")
    address = request.client.host if request.client is not None else "unknown"
    if header:
        wait = throttle.wait(address)
        if wait > 0:
            return PlainTextResponse("too many failed logins: try again later", 429,
                                     headers={"Retry-After": str(math.ceil(wait))})
        if credentials.accepts(header):
            throttle.succeeded(address)
            return None
        throttle.failed(address)
    return challenge()
