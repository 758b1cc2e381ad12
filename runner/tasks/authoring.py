"""Your own task types: the :func:`task` decorator, and loading them into a node.

::

    # mypkg/tasks.py
    from pydantic import BaseModel
    from runner.tasks import TaskContext, task

    class SyncPayload(BaseModel):
        account: str

    @task("billing.sync", payload=SyncPayload, priority=5, slots=2,
          description="pull one account's invoices")
    def sync(ctx: TaskContext, payload: SyncPayload) -> None:
        ...

    $ latchwork node start --tasks mypkg.tasks

The decorator only marks the function (no registry is global); a node loads the modules named
by ``--tasks`` / the ``tasks`` setting and every module or ``register(registry)`` function a
distribution declares in the entry-point group ``latchwork.tasks``, and registers each marked
function it finds. Payload models refuse unknown fields unless their config says otherwise.

Failure behaviour: a module that cannot be imported, an entry point that cannot be loaded, a
name that another type already has, or a module that declares no task raises
:class:`TaskLoadError` naming the module and the cause; ``latchwork node start`` turns it into
one line and exit 2, before joining the cluster.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, TypeVar

from pydantic import BaseModel

from runner.errors import TaskLoadError
from runner.tasks.commands import CommandDeclaration, CommandRegistry
from runner.tasks.features.streams import StreamDefinition, StreamRegistry
from runner.tasks.registry import NO_LIMITS, Isolation, Limits, TaskRegistry
from runner.tasks.retry import RetryPolicy

ENTRY_POINT_GROUP = "latchwork.tasks"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskDeclaration:
    """What :func:`task` records on a handler."""
    name: str
    payload: type[BaseModel] | None
    priority: int
    slots: int | None
    description: str
    resources: tuple[str, ...] = ()
    retry: RetryPolicy | None = None
    max_duration: float | None = None
    max_wait: float | None = None
    limits: Limits = NO_LIMITS
    isolation: Isolation | None = None


def task(name: str, *, payload: type[BaseModel] | None = None, priority: int = 0,
         slots: int | None = None, description: str = "", resources: Sequence[str] = (),
         retry: RetryPolicy | None = None, max_duration: float | None = None,
         max_wait: float | None = None, timeout: float | None = None, grace: float = 10.0,
         heartbeat_timeout: float | None = None, heartbeat_persist: float = 10.0,
         isolation: str = "thread", max_tasks_per_child: int = 1000,
         max_memory_mb: float | None = None) -> Callable[[F], F]:
    """Declare ``handler(ctx, payload)`` as the task type ``name``: ``payload`` is its model,
    ``priority`` the default priority of a submission that names none, ``slots`` the
    cluster-wide number of tasks of this type that may run at once, ``description`` what
    ``latchwork task types`` shows (the handler's docstring when empty), ``resources`` what
    every task of the type takes all-or-nothing before it starts, ``retry`` its
    :class:`~runner.tasks.retry.RetryPolicy` (None: a failure stops the task),
    ``max_duration`` / ``max_wait`` the seconds a task may run / wait once due before the
    master raises an incident (:mod:`runner.tasks.master.incidents`); ``timeout``, ``grace``,
    ``heartbeat_timeout`` and ``heartbeat_persist`` its time limits
    (:class:`~runner.tasks.registry.Limits`); ``isolation="process"`` runs its handler in a
    child process (``max_tasks_per_child``, ``max_memory_mb``:
    :class:`~runner.tasks.registry.Isolation`)."""
    if not name or name != name.strip():
        raise ValueError(f"invalid task type name {name!r}")
    if slots is not None and slots < 1:
        raise ValueError(f"slots of {name} must be at least 1, not {slots}")
    limits = Limits(timeout, grace, heartbeat_timeout, heartbeat_persist)  # ValueError: said
    if isolation not in ("thread", "process"):
        raise ValueError(f"task type {name!r}: isolation is 'thread' or 'process', not "
                         f"{isolation!r}")
    isolated = Isolation(max_tasks_per_child, max_memory_mb) if isolation == "process" else None

    def mark(handler: F) -> F:
        text = description or inspect.cleandoc(handler.__doc__ or "").split("\n\n")[0]
        handler.__dict__["latchwork_task"] = TaskDeclaration(
            name, payload, priority, slots, " ".join(text.split()), tuple(resources), retry,
            max_duration, max_wait, limits, isolated)
        return handler
    return mark


def declared(module: ModuleType) -> list[tuple[TaskDeclaration, Callable[..., Any]]]:
    """The task-marked functions of ``module``, in definition order."""
    found = []
    for value in vars(module).values():
        declaration = getattr(value, "latchwork_task", None)
        if isinstance(declaration, TaskDeclaration) and callable(value):
            found.append((declaration, value))
    return found


def register_module(registry: TaskRegistry, module: ModuleType,
                    streams: StreamRegistry | None = None,
                    commands: CommandRegistry | None = None) -> list[str]:
    """Register every task (and, given ``streams``, every ``@stream``; given ``commands``,
    every ``@command`` and ``@broadcast``) ``module`` declares; the names registered."""
    names = []
    if commands is not None:
        names.extend(register_commands(commands, module))
    for value in vars(module).values():
        definition = getattr(value, "latchwork_stream", None)
        if isinstance(definition, StreamDefinition) and streams is not None:
            try:
                streams.define(definition)
            except ValueError as exc:
                raise TaskLoadError(f"{module.__name__}: {exc}") from exc
            names.append(definition.name)
    for declaration, handler in declared(module):
        try:
            register_declared(registry, declaration, handler)
        except ValueError as exc:
            raise TaskLoadError(f"{module.__name__}: {exc}") from exc
        names.append(declaration.name)
    return names


def register_declared(registry: TaskRegistry, declaration: TaskDeclaration,
                      handler: Callable[..., Any]) -> None:
    """Register ``handler`` as its ``@task`` declaration says (ValueError as
    :meth:`TaskRegistry.register`)."""
    registry.register(declaration.name, handler, declaration.payload,
                      slot_limit=declaration.slots, description=declaration.description,
                      priority=declaration.priority, resources=declaration.resources,
                      retry=declaration.retry, max_duration=declaration.max_duration,
                      max_wait=declaration.max_wait, limits=declaration.limits,
                      isolation=declaration.isolation)


def register_commands(commands: CommandRegistry, module: ModuleType, *,
                      builtin: bool = False) -> list[str]:
    """Declare every ``@command`` and ``@broadcast`` of ``module``; their names."""
    names = []
    for value in vars(module).values():
        declaration = getattr(value, "latchwork_command", None)
        if isinstance(declaration, CommandDeclaration) and callable(value):
            try:
                commands.declare(declaration, value, builtin=builtin)
            except ValueError as exc:
                raise TaskLoadError(f"{module.__name__}: {exc}") from exc
            names.append(declaration.name)
    return names


def load_modules(registry: TaskRegistry, modules: Iterable[str],
                 streams: StreamRegistry | None = None,
                 commands: CommandRegistry | None = None) -> list[str]:
    """Import each module (``mypkg.tasks``) and register its tasks; the names registered."""
    names = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # any error of the user's module, reported in one line
            raise TaskLoadError(f"cannot import task module {name}: "
                                f"{type(exc).__name__}: {exc}") from exc
        found = register_module(registry, module, streams, commands)
        if not found:
            raise TaskLoadError(f"task module {name} declares no task (use @task(...), "
                                "@stream(...), @command(...) or @broadcast(...))")
        names.extend(found)
    return names


def load_entry_points(registry: TaskRegistry, group: str = ENTRY_POINT_GROUP,
                      streams: StreamRegistry | None = None,
                      commands: CommandRegistry | None = None) -> list[str]:
    """Load every entry point of ``group``: a module (its tasks are registered) or a callable
    ``register(registry)``; the names registered."""
    names: list[str] = []
    for entry in entry_points(group=group):
        before = set(registry.names())
        try:
            target = entry.load()
        except Exception as exc:
            raise TaskLoadError(f"cannot load entry point {entry.name} = {entry.value} "
                                f"({group}): {type(exc).__name__}: {exc}") from exc
        if isinstance(target, ModuleType):
            names.extend(register_module(registry, target, streams, commands))
        elif callable(target):
            try:
                target(registry)
            except ValueError as exc:
                raise TaskLoadError(f"entry point {entry.name} = {entry.value}: {exc}") from exc
            names.extend(sorted(set(registry.names()) - before))
        else:
            raise TaskLoadError(f"entry point {entry.name} = {entry.value} is neither a module "
                                "nor a register(registry) function")
    return names
