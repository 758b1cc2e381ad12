"""Task types: a typed registry of handlers and their payload models.

A handler is ``handler(ctx, payload)``; ``payload`` is validated into the type's pydantic model
first (unknown fields are refused, naming them, unless the model's config says otherwise).
What the task loop does with the outcome:

* returns: the attempt SUCCEEDED and the task is finished; the value it returns is the task's
  result, stored with that attempt (:mod:`runner.tasks.results`);
* raises :class:`~runner.tasks.context.TaskConflict` (or the store's ``CommitConflict``): the
  attempt FAILED with "commit conflict", and the task is tried again with backoff (a new
  attempt each time);
* raises anything else: the attempt FAILED with the error and stack trace, the task stops
  (active = false) until someone reactivates it;
* the token is cancelled (shutdown, lost lock or session): CANCELLED_BY_SYSTEM; the task is
  left for another node. Handlers should check ``ctx.cancel`` in long loops and sleep with
  ``ctx.cancel.wait(seconds)``, call ``ctx.check()`` right before an external effect, and pass
  ``ctx.fence`` to the store writes they make.

An unknown type raises :class:`UnknownTaskType`, a payload that does not validate
:class:`InvalidPayload`; registering a name twice raises ValueError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any

from pydantic import BaseModel, ValidationError

from messaging import summary, validate_payload
from runner.errors import InvalidPayload, UnknownTaskType
from runner.tasks.context import TaskContext
from runner.tasks.results import ANY_RESULT, ResultType
from runner.tasks.retry import RetryPolicy

#: ``handler(ctx, payload)``; what it returns is the task's result (:mod:`runner.tasks.results`)
TaskHandler = Callable[[TaskContext, Any], object]


@dataclass(frozen=True)
class Limits:
    """A type's time limits (docs/runner.md, "Time limits and heartbeats").

    * ``timeout``: seconds an attempt may run; at the limit its token is cancelled (the
      attempt ends TIMED_OUT), and a handler still running ``grace`` seconds later has its
      attempt written TIMED_OUT with the task's fence moved (nothing it writes afterwards is
      accepted) while its lock is kept until it returns (an incident ``ignored_timeout``);
    * ``heartbeat_timeout``: seconds an attempt may go without ``ctx.heartbeat()`` before it
      is taken as hung (the same as a timeout: "no heartbeat for 30 s"); the beat is local to
      the node, its last details written at most every ``heartbeat_persist`` seconds.
    """
    timeout: float | None = None
    grace: float = 10.0
    heartbeat_timeout: float | None = None
    heartbeat_persist: float = 10.0

    def __post_init__(self) -> None:
        for what in ("timeout", "heartbeat_timeout"):
            value = getattr(self, what)
            if value is not None and value <= 0:
                raise ValueError(f"{what} must be positive, not {value}")
        if self.grace < 0 or self.heartbeat_persist <= 0:
            raise ValueError("grace must be >= 0 and heartbeat_persist positive")

    @property
    def watched(self) -> bool:
        """Whether an attempt of the type has a limit to watch."""
        return self.timeout is not None or self.heartbeat_timeout is not None

    def describe(self) -> dict[str, float | None]:
        return {"timeout": self.timeout, "grace": self.grace,
                "heartbeat_timeout": self.heartbeat_timeout,
                "heartbeat_persist": self.heartbeat_persist}


NO_LIMITS = Limits()


@dataclass(frozen=True)
class Isolation:
    """A type whose handler runs in a child process (``isolation="process"``,
    :mod:`runner.tasks.worker.isolated`): a child is replaced after ``max_tasks_per_child``
    attempts, and killed (the attempt FAILED) once its RSS is above ``max_memory_mb``."""
    max_tasks_per_child: int = 1000
    max_memory_mb: float | None = None

    def __post_init__(self) -> None:
        if self.max_tasks_per_child < 1:
            raise ValueError(f"max_tasks_per_child must be at least 1, not "
                             f"{self.max_tasks_per_child}")
        if self.max_memory_mb is not None and self.max_memory_mb <= 0:
            raise ValueError(f"max_memory_mb must be positive, not {self.max_memory_mb}")

    def describe(self) -> dict[str, object]:
        return {"isolation": "process", "max_tasks_per_child": self.max_tasks_per_child,
                "max_memory_mb": self.max_memory_mb}


def _names(code: CodeType) -> set[str]:
    """The attribute and global names ``code`` and the functions inside it use."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found |= _names(const)
    return found


def crossable(name: str, handler: object) -> None:
    """Refuse (ValueError, one line) a handler for a child process that reads
    ``ctx.services`` itself: its services (the ZooKeeper session, a Spark session, the bus)
    stay in the node and cannot cross the channel. Only the handler's own code is read."""
    code = getattr(handler, "__code__", None)
    if isinstance(code, CodeType) and "services" in _names(code):
        raise ValueError(f"task type {name!r}: isolation='process' cannot give "
                         f"{getattr(handler, '__qualname__', handler)} ctx.services (the "
                         "node's session, bus and Spark stay in the node): run it in a thread")


def importable(name: str, value: object, what: str) -> None:
    """Refuse (ValueError, one line) a handler or payload model a child process cannot import
    by its module and name: a lambda, a function defined inside another."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        raise ValueError(f"task type {name!r}: isolation='process' needs its {what} defined at "
                         f"the top of an importable module (the child imports it again), not "
                         f"{module}.{qualname}")


@dataclass(frozen=True)
class TaskType:
    name: str
    handler: TaskHandler
    payload_model: type[BaseModel] | None = None
    slot_limit: int | None = None  # cluster-wide concurrency of this type
    description: str = ""
    priority: int = 0  # of a submission that names none
    resources: tuple[str, ...] = ()  # every task of the type takes these (besides its own)
    retry: RetryPolicy | None = None  # None: a failure stops the task
    max_duration: float | None = None  # seconds RUNNING before an incident is raised
    max_wait: float | None = None  # seconds WAITING (once due) before an incident is raised
    limits: Limits = NO_LIMITS  # time limits and heartbeats
    isolation: Isolation | None = None  # None: the handler runs in a thread of the node
    result: ResultType = ANY_RESULT  # what its handler returns (its return annotation)

    def describe(self) -> dict[str, Any]:
        """What ``latchwork task types`` shows: name, description, default priority, slots,
        resources, retry policy and the payload's JSON schema (None: any JSON object)."""
        schema = self.payload_model.model_json_schema() if self.payload_model else None
        return {"name": self.name, "description": self.description, "priority": self.priority,
                "slots": self.slot_limit, "resources": list(self.resources),
                "retry": self.retry.describe() if self.retry else None,
                "max_duration": self.max_duration, "max_wait": self.max_wait,
                **self.limits.describe(),
                **(self.isolation.describe() if self.isolation else {"isolation": "thread"}),
                "result": self.result.shown, "payload_schema": schema}

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
        #: types this node knows but cannot run (an extra not installed): why, by name
        self._unavailable: dict[str, str] = {}

    def unavailable(self, name: str, why: str) -> None:
        """Know ``name`` without running it: a submit of it is refused with ``why`` (the
        extra it needs), not as an unknown type."""
        self._unavailable[name] = why

    def register(self, name: str, handler: TaskHandler,
                 payload_model: type[BaseModel] | None = None, *,
                 slot_limit: int | None = None, description: str = "",
                 priority: int = 0, resources: tuple[str, ...] = (),
                 retry: RetryPolicy | None = None, max_duration: float | None = None,
                 max_wait: float | None = None, limits: Limits = NO_LIMITS,
                 isolation: Isolation | None = None) -> None:
        if name in self._types:
            raise ValueError(f"task type {name!r} is already registered")
        if any(not r for r in resources):
            raise ValueError(f"task type {name!r}: a resource name cannot be empty")
        if isolation is not None:
            crossable(name, handler)
            importable(name, handler, "handler")
            if payload_model is not None:
                importable(name, payload_model, "payload model")
        for what, seconds in (("max_duration", max_duration), ("max_wait", max_wait)):
            if seconds is not None and seconds <= 0:
                raise ValueError(f"task type {name!r}: {what} must be positive")
        self._types[name] = TaskType(name, handler, payload_model, slot_limit, description,
                                     priority, tuple(resources), retry, max_duration, max_wait,
                                     limits, isolation, ResultType.of(handler))

    def add(self, kind: TaskType) -> None:
        """Register a type as another registry holds it (a stub's registry of one)."""
        if kind.name in self._types:
            raise ValueError(f"task type {kind.name!r} is already registered")
        self._types[kind.name] = kind

    def get(self, name: str) -> TaskType:
        try:
            return self._types[name]
        except KeyError:
            if name in self._unavailable:
                raise UnknownTaskType(self._unavailable[name]) from None
            known = ", ".join(sorted(self._types)) or "none"
            raise UnknownTaskType(f"unknown task type {name!r} (known: {known})") from None

    def validate(self, name: str, payload: Mapping[str, Any]) -> Any:
        return self.get(name).parse(payload)

    def names(self) -> list[str]:
        return sorted(self._types)

    def all(self) -> list[TaskType]:
        return [self._types[name] for name in self.names()]
