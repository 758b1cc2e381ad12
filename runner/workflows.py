"""Workflows, declared: a step is a task to make (:func:`step`, a :class:`TaskTemplate`);
:func:`chain` runs its parts one after another, :func:`group` side by side (a fan-out), and
:func:`chord` runs a group then one step once every member of it succeeded (a join). They
nest::

    from runner.workflows import chain, chord, group, step

    sync = chain(step("onto.diff", {"source": "brick"}),
                 chord(group([step("onto.load", {"file": f}) for f in files]),
                       then=step("onto.broadcast")))
    ref = client.submit_workflow(sync, key="sync-2026-12-08")

:func:`plan` flattens a workflow into its members in an order where every member comes after
what it depends on, each with the indices it depends on; the ids are made from the
idempotency ``key`` (:func:`workflow_id`, :func:`member_id`), so the client, the node and a
resend agree on them without asking. Pure: nothing here does I/O, and it imports nothing of
the node or the task runner (the client and the API contract use it).

Failure behaviour: an empty chain or group, or a workflow over :data:`MAX_MEMBERS` members,
raises ``ValueError`` naming it, before anything is sent.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, JsonValue

from runner.templates import TaskTemplate

#: the most members one workflow may have (a join over all of them lists them in one page of
#: its submit: 20,000 indices stay under the API's message limit)
MAX_MEMBERS = 20_000
#: the namespace of workflow ids (uuid5 of the idempotency key)
NAMESPACE = uuid.UUID("5b0f6f1e-3c52-4a3e-9d0e-6c1f7a1d2e72")


class Steps(BaseModel):
    """Parts run one after another (``chain``) or side by side (``group``)."""

    model_config = {"extra": "forbid"}
    kind: Literal["chain", "group"]
    steps: list[TaskTemplate | Steps] = Field(min_length=1)


#: a workflow: one step, or parts
Flow = TaskTemplate | Steps


def step(type: str, payload: Mapping[str, JsonValue] | None = None,
         **fields: object) -> TaskTemplate:
    """One member: a task of ``type`` with ``payload`` and a submit's other fields."""
    return TaskTemplate.model_validate({"type": type, "payload": dict(payload or {}),
                                        **fields})


def chain(*nodes: Flow) -> Steps:
    """``nodes`` one after another: each starts once the one before succeeded (all of it:
    a group's every member)."""
    if not nodes:
        raise ValueError("a chain needs at least one step")
    return Steps(kind="chain", steps=list(nodes))


def group(nodes: Iterable[Flow]) -> Steps:
    """``nodes`` side by side (a fan-out): they start together."""
    parts = list(nodes)
    if not parts:
        raise ValueError("a group needs at least one step")
    return Steps(kind="group", steps=parts)


def chord(members: Steps, then: Flow) -> Steps:
    """``members`` (a group), then ``then`` once every one of them succeeded: a join."""
    return chain(members, then)


@dataclass(frozen=True)
class Planned:
    """A member as planned: its task and the indices (in the plan) of what it depends on."""
    template: TaskTemplate
    after: tuple[int, ...]


def plan(workflow: Flow) -> list[Planned]:
    """The members of ``workflow``, each after what it depends on (see the module)."""
    out: list[Planned] = []

    def walk(node: Flow, after: tuple[int, ...]) -> tuple[int, ...]:
        if isinstance(node, TaskTemplate):
            out.append(Planned(node, after))
            if len(out) > MAX_MEMBERS:
                raise ValueError(f"a workflow has at most {MAX_MEMBERS} members")
            return (len(out) - 1,)
        if node.kind == "chain":
            for part in node.steps:
                after = walk(part, after)
            return after
        ends: list[int] = []
        for part in node.steps:
            ends.extend(walk(part, after))
        return tuple(ends)

    walk(workflow, ())
    return out


def digest(planned: list[Planned], on_failure: TaskTemplate | None = None) -> str:
    """What a workflow is, in 16 hex digits: a resend with the same key has the same; another
    workflow under that key does not (the node refuses it)."""
    text = json.dumps([[p.template.model_dump(mode="json", exclude_none=True), list(p.after)]
                       for p in planned]
                      + ([on_failure.model_dump(mode="json", exclude_none=True)]
                         if on_failure is not None else []), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class WorkflowRef:
    """A submitted workflow: its id, its key, its members' task ids (in :func:`plan`'s
    order), the node's answer to its last page (its state, how many members), and its
    ``on_failure`` step's task id."""
    id: str
    key: str
    members: tuple[str, ...]
    view: object = None
    on_failure: str | None = None  # the task id of its on_failure step


def workflow_id(key: str) -> str:
    """The id of the workflow submitted under idempotency ``key``."""
    return str(uuid.uuid5(NAMESPACE, key))


def member_id(workflow: str, index: int) -> str:
    """The task id of member ``index`` of ``workflow``."""
    return str(uuid.uuid5(uuid.UUID(workflow), str(index)))


def child_id(parent: str, key: str) -> str:
    """The task id of the child ``parent`` spawns under ``key`` (``ctx.spawn``)."""
    return str(uuid.uuid5(NAMESPACE, f"{parent}/child/{key}"))
