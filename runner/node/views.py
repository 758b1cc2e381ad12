"""JSON views of tasks, attempts and cluster state (API replies and ``--json`` output)."""

from __future__ import annotations

from typing import Any

from runner.store import Attempt, Task


def task_view(task: Task) -> dict[str, Any]:
    return {
        "id": task.id, "type": task.type, "payload": task.payload, "active": task.active,
        "status": task.status.value, "finished": task.finished, "priority": task.priority,
        "created_at": task.created_at.isoformat(), "updated_at": task.updated_at.isoformat(),
        "version": task.version, "fence": task.fence, "unique_key": task.unique_key,
        "owner": task.owner, "attempts": task.attempts,
    }


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    return {
        "id": attempt.id, "seq": attempt.seq, "status": attempt.status.value,
        "executor": attempt.executor, "started_at": attempt.started_at.isoformat(),
        "ended_at": attempt.ended_at.isoformat() if attempt.ended_at else None,
        "duration_ms": attempt.duration_ms, "error": attempt.error,
        "stack_trace": attempt.stack_trace, "fence": attempt.fence,
    }
