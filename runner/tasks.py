"""Task types: a typed registry of handlers, the context and cancellation token they get.

A handler is ``handler(ctx, payload)``; ``payload`` is validated into the type's pydantic model
first (unknown fields are refused, naming them, unless the model's config says otherwise).
What the task loop does with the outcome:

* returns: the attempt SUCCEEDED and the task is finished;
* raises :class:`TaskConflict` (or the store's ``CommitConflict``): the attempt FAILED with
  "commit conflict", and the task is tried again with backoff (a new attempt each time);
* raises anything else: the attempt FAILED with the error and stack trace, the task stops
  (active = false) until someone reactivates it;
* the token is cancelled (shutdown, lost lock or session): CANCELLED_BY_SYSTEM; the task is
  left for another node. Handlers should check ``ctx.cancel`` in long loops and sleep with
  ``ctx.cancel.wait(seconds)``, call ``ctx.check()`` right before an external effect, and pass
  ``ctx.fence`` to the store writes they make.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from messaging import summary, validate_payload
from runner.store import Attempt, Fence, GraphStore, Task

T = TypeVar("T")


class TaskError(Exception):
    """Root of the task-definition errors."""


class UnknownTaskType(TaskError, LookupError):
    """No handler is registered for this task type."""


class InvalidPayload(TaskError, ValueError):
    """The payload does not validate against the task type's model."""


class TaskConflict(Exception):
    """A commit conflict inside a handler: retried automatically with backoff."""


class TaskCancelled(Exception):
    """The handler noticed its cancellation token and stopped."""


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[str], None]] = []
        self.reason = ""

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(reason)

    def on_cancel(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(reason)`` on cancellation (at once if cancelled already); the
        returned function unregisters it. Used to reach work outside Python, e.g. a Spark job
        group."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._discard(callback)
        callback(self.reason)
        return lambda: None

    def _discard(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as the token is cancelled."""
        return self._event.wait(seconds)

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise TaskCancelled(self.reason)


@dataclass
class TaskContext:
    """What a handler gets besides its payload.

    ``check()`` right before an external effect, and ``fence`` on every store write the handler
    makes (``store.fenced_write(ctx.fence, ...)``, ``ontologies.load(..., fence=ctx.fence)``):
    together they keep an owner that lost the task (a long pause, a partition, an operator's
    cancel) from leaving an effect after someone else took over. See docs/runner.md for the
    window that remains for systems that cannot check a token.
    """
    task: Task
    attempt: Attempt
    member_id: str
    fence_token: int
    cancel: CancelToken
    store: GraphStore
    services: Mapping[str, Any] = field(default_factory=dict)
    checker: Callable[[], None] | None = None
    completer: Callable[[Callable[[Any], Any]], Any] | None = None
    completed: bool = False

    @property
    def fence(self) -> Fence:
        """This attempt's fencing token, for store writes that must be refused once it is
        stale."""
        return Fence(self.task.id, self.fence_token)

    def check(self) -> None:
        """Raise :class:`TaskCancelled` unless this attempt still owns its task.

        Checks the cancellation token, then (from the task loop) that the ZooKeeper session is
        CONNECTED, that the lock node still exists with this attempt's czxid (one ZooKeeper
        read) and that the token is still the task's (one store read). A failed check also
        cancels the token, so the attempt ends CANCELLED_BY_SYSTEM with the reason.
        """
        self.cancel.raise_if_cancelled()
        if self.checker is not None:
            self.checker()

    def complete(self, write: Callable[[Any], T]) -> T:
        """Write the handler's final graph effect (``write(g)``) together with the attempt's
        SUCCEEDED and the task's finish, as one transaction guarded by this attempt's fence:
        killed before it, neither happened (the task runs again); after it, both did, so the
        effect is applied once even when the owner dies right after it. Raises
        :class:`TaskCancelled`, nothing written, once the attempt was closed by someone else or
        the fence moved. Return right after it: the attempt is already concluded."""
        self.cancel.raise_if_cancelled()
        if self.completer is None:
            raise TaskError("complete() needs the task loop")
        result: T = self.completer(write)
        self.completed = True
        return result


Handler = Callable[[TaskContext, Any], None]


@dataclass(frozen=True)
class TaskType:
    name: str
    handler: Handler
    payload_model: type[BaseModel] | None = None
    slot_limit: int | None = None  # cluster-wide concurrency of this type
    description: str = ""

    def parse(self, payload: Mapping[str, Any]) -> Any:
        if self.payload_model is None:
            return dict(payload)
        try:
            return validate_payload(self.payload_model, dict(payload))
        except ValidationError as exc:
            raise InvalidPayload(f"payload of {self.name}: {summary(exc)}") from exc


class TaskRegistry:
    def __init__(self) -> None:
        self._types: dict[str, TaskType] = {}

    def register(self, name: str, handler: Handler, payload_model: type[BaseModel] | None = None,
                 *, slot_limit: int | None = None, description: str = "") -> None:
        if name in self._types:
            raise ValueError(f"task type {name!r} is already registered")
        self._types[name] = TaskType(name, handler, payload_model, slot_limit, description)

    def get(self, name: str) -> TaskType:
        try:
            return self._types[name]
        except KeyError:
            known = ", ".join(sorted(self._types)) or "none"
            raise UnknownTaskType(f"unknown task type {name!r} (known: {known})") from None

    def validate(self, name: str, payload: Mapping[str, Any]) -> Any:
        return self.get(name).parse(payload)

    def names(self) -> list[str]:
        return sorted(self._types)
