"""The generic task runner: task types, the task loop every node runs, and the master's duties.

* :mod:`~runner.tasks.registry`: task types and their payload models;
* :mod:`~runner.tasks.authoring`: the ``@task`` decorator and loading users' task modules;
* :mod:`~runner.tasks.context`: what a handler gets (context, cancellation token);
* :mod:`~runner.tasks.worker.loop`: TaskProcessHandler, the scan and its driver;
* :mod:`~runner.tasks.worker.backlog`: the order a node tries open tasks in (pure);
* :mod:`~runner.tasks.worker.claim`: slot, lock and the claim that writes the RUNNING attempt;
* :mod:`~runner.tasks.worker.execution`: the handler, conflict retries and the conclusion;
* :mod:`~runner.tasks.outcomes`: what an attempt came to, as a type;
* :mod:`~runner.tasks.retry`: retry policies per task type;
* :mod:`~runner.tasks.due`: the cursor of the due-time buckets the master opens;
* :mod:`~runner.tasks.master.duties`: the master's reaper of dead owners' locks and attempts;
* :mod:`~runner.tasks.features.streams`: concurrent exactly-once streams run as N copy tasks;
* :mod:`~runner.tasks.features.diag`: diagnostic task types (sleep, fail, conflict, effect).

It knows nothing of ontologies or pipelines; those register their task types here.
"""

from coord.stream_input import BadInput
from runner.errors import InvalidPayload, TaskError, TaskLoadError, UnknownTaskType
from runner.tasks.authoring import task
from runner.tasks.context import (
    CancelToken,
    TaskCancelled,
    TaskConflict,
    TaskContext,
    TaskDeclined,
)
from runner.tasks.features.streams import stream
from runner.tasks.registry import TaskHandler, TaskRegistry, TaskType
from runner.tasks.retry import RetryPolicy

__all__ = [
    "BadInput",
    "CancelToken",
    "TaskHandler",
    "InvalidPayload",
    "RetryPolicy",
    "TaskCancelled",
    "TaskConflict",
    "TaskContext",
    "TaskDeclined",
    "TaskError",
    "TaskRegistry",
    "TaskType",
    "TaskLoadError",
    "UnknownTaskType",
    "stream",
    "task",
]
