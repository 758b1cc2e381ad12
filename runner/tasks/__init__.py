"""The generic task runner: task types, the task loop every node runs, and the master's duties.

What handlers and task authors see, here at the top:

* :mod:`~runner.tasks.registry`: task types and their payload models;
* :mod:`~runner.tasks.authoring`: the ``@task`` decorator and loading users' task modules;
* :mod:`~runner.tasks.commands`: ``@command`` (master-only) and ``@broadcast`` (every node);
* :mod:`~runner.tasks.context`: what a handler gets (context, cancellation token);
* :mod:`~runner.tasks.outcomes`: what an attempt came to, as a type, and how it is decided;
* :mod:`~runner.tasks.retry`: retry policies per task type;
* :mod:`~runner.tasks.observer`: the one observer seam (attempts, scans, deliveries);
* :mod:`~runner.tasks.progress`, :mod:`~runner.tasks.due`: progress writes, the due-time cursor;
* ``chain``, ``group``, ``chord``, ``step``: workflows, declared (:mod:`runner.workflows`).

By role, below:

* :mod:`~runner.tasks.worker`: every node's task loop (``TaskLoop``), the running set, the
  ordering-key chain, the backlog's order, the claim, the execution, the due timers;
* :mod:`~runner.tasks.master`: the master's duties (reaper, rounds, schedules, incidents,
  retention);
* :mod:`~runner.tasks.features`: streams run as copy tasks, the example stream, the diagnostic
  types.

It knows nothing of ontologies or pipelines; those register their task types here.
"""

from coord.stream_input import BadInput
from runner.errors import InvalidPayload, TaskError, TaskLoadError, UnknownTaskType
from runner.tasks.authoring import task
from runner.tasks.commands import CommandContext, CommandRegistry, broadcast, command
from runner.tasks.context import (
    CancelToken,
    Services,
    TaskCancelled,
    TaskConflict,
    TaskContext,
    TaskDeclined,
    TaskTimedOut,
)
from runner.tasks.features.streams import stream
from runner.tasks.observer import Hooks, Observer
from runner.tasks.registry import Limits, TaskHandler, TaskRegistry, TaskType
from runner.tasks.retry import RetryPolicy
from runner.workflows import chain, chord, group, step

__all__ = [
    "BadInput",
    "CancelToken",
    "CommandContext",
    "CommandRegistry",
    "TaskHandler",
    "Hooks",
    "InvalidPayload",
    "Limits",
    "Observer",
    "RetryPolicy",
    "Services",
    "TaskCancelled",
    "TaskConflict",
    "TaskContext",
    "TaskDeclined",
    "TaskError",
    "TaskRegistry",
    "TaskTimedOut",
    "TaskType",
    "TaskLoadError",
    "UnknownTaskType",
    "broadcast",
    "chain",
    "chord",
    "command",
    "group",
    "step",
    "stream",
    "task",
]
