"""``latchwork top``: a live dashboard of the cluster, refreshed every second (rich.Live).

Members with their role and what each runs, running tasks with owner, age and progress bars,
waiting tasks per type and priority, the attempts that ended last (finished, failed, cancelled)
and the dead-lettered messages count. Every frame is read through the client (a few API
requests and one passive queue declare); a frame that cannot be read shows the reason and the
next one is tried a second later, so the dashboard survives a node or broker going away.
``--once`` prints one frame and exits (scripts, tests).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from runner.cli.client import config_option, connect, timeout_option
from runner.cli.console import STATUS_STYLE, STATUS_TEXT, bar, checkpoint_text
from runner.cli.root import cli
from runner.client import Client
from runner.errors import ClientError
from runner.replies import ClusterStatus, RecentAttempt, TaskView


@dataclass
class Frame:
    """What one refresh read."""
    status: ClusterStatus
    open_tasks: list[TaskView]
    recent: list[RecentAttempt]
    dead_letters: int
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


def read_frame(client: Client, recent: int = 8) -> Frame:
    return Frame(client.cluster_status(), client.list(unfinished=True),
                 client.recent_attempts(recent), client.dead_letter_count())


def _age(since: datetime, now: datetime) -> str:
    seconds = max(0.0, (now - since).total_seconds())
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def short_ids(ids: list[str], minimum: int = 8) -> dict[str, str]:
    """Each id cut to its shortest prefix of at least ``minimum`` characters that no other of
    ``ids`` shares (the way git abbreviates commits)."""
    short: dict[str, str] = {}
    for task_id in ids:
        length = minimum
        while length < len(task_id) and any(
                other != task_id and other.startswith(task_id[:length]) for other in ids):
            length += 1
        short[task_id] = task_id[:length]
    return short


def render(frame: Frame, wide: bool = False) -> RenderableType:
    """One frame; task ids cut to short unique prefixes unless ``wide`` (whole, never cut)."""
    status, now = frame.status, frame.at
    every = [t.id for t in frame.open_tasks] + [a.task for a in frame.recent] + \
        [i.task for i in status.incidents]
    short = short_ids(sorted(set(every)))

    def tid(task_id: str) -> str:
        return task_id if wide else short.get(task_id, task_id[:8])
    running = [t for t in frame.open_tasks if t.status == "RUNNING"]
    waiting = [t for t in frame.open_tasks if t.status != "RUNNING"]
    runs_on: Counter[str] = Counter(t.owner for t in running if t.owner)

    members = Table(title=f"cluster {status.cluster}: {len(status.members)} members")
    for column in ("member", "role", "running", "version"):
        members.add_column(column)
    for m in status.members:
        role = Text("master", style="bold green") if m.id == status.master else Text("node")
        members.add_row(m.id, role, str(runs_on.get(m.id, 0)), m.version)

    tasks = Table(title=f"running: {len(running)}")
    tasks.add_column("task", no_wrap=True, min_width=36 if wide else None)
    for column in ("type", "owner", "age", "progress", "checkpoint"):
        tasks.add_column(column)
    for t in running:
        progress = t.progress.model_dump(mode="json") if t.progress else None
        checkpoint = t.checkpoint.model_dump() if t.checkpoint else None
        tasks.add_row(tid(t.id), t.type, t.owner or "-", _age(t.updated_at, now),
                      bar(progress), checkpoint_text(checkpoint, now))

    queue = Table(title=f"waiting: {len(waiting)}")
    for column in ("type", "priority", "tasks"):
        queue.add_column(column)
    for (kind, priority), count in sorted(Counter((t.type, t.priority) for t in waiting).items(),
                                          key=lambda kv: (-kv[0][1], kv[0][0])):
        queue.add_row(kind, str(priority), str(count))

    ended = Table(title="last ended attempts")
    ended.add_column("task", no_wrap=True, min_width=36 if wide else None)
    for column in ("type", "#", "status", "on", "ended", "error"):
        ended.add_column(column)
    for a in frame.recent:
        ended.add_row(tid(a.task), a.type, str(a.seq),
                      Text(STATUS_TEXT.get(a.status, a.status),
                           style=STATUS_STYLE.get(a.status, "")),
                      a.executor, _age(a.ended_at or a.started_at, now) + " ago",
                      Text((a.error or "")[:60]))

    head = Text(f"master {status.master or '(none)'} · answered by {status.answered_by} · "
                f"{now.strftime('%H:%M:%S')} UTC")
    return Group(head, members, tasks, queue, ended, *_footer(frame, tid))


def _footer(frame: Frame, tid: Callable[[str], str]) -> list[Text]:
    """The commands in flight, the dead letters and the open incidents of one frame."""
    status = frame.status
    commands = Text(f"commands in flight on the master: {len(status.commands)}")
    for inflight in status.commands[:5]:
        commands.append(f"\n  {inflight.command} {inflight.id} on {inflight.member} for "
                        f"{inflight.age_s:g} s")
    dead = Text(f"dead-lettered messages: {frame.dead_letters}",
                style="bold red" if frame.dead_letters else "green")
    flows = status.workflows
    incidents = Text(f"workflows: {flows.get('running', 0)} running, "
                     f"{flows.get('succeeded', 0)} succeeded, {flows.get('open', 0)} being "
                     "submitted\n")
    incidents.append(f"open incidents: {len(status.incidents)}",
                     style="bold red" if status.incidents else "green")
    for incident in status.incidents[:5]:
        incidents.append(f"\n  {incident.kind}: task {tid(incident.task)} "
                         f"{incident.detail[:80]}", style="red")
    return [commands, dead, incidents]


@cli.command("top")
@click.option("--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True,
              help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one frame and exit")
@click.option("--wide", is_flag=True, help="whole task ids (default: short unique prefixes, "
                                           "as git abbreviates)")
@config_option
@timeout_option
def top(interval: float, once: bool, wide: bool, config: Path | None, timeout: float) -> None:
    """A live view of the cluster: members and the master, running tasks with progress,
    waiting tasks per type and priority, the last ended attempts, dead letters (Ctrl-C quits).
    Task ids are short unique prefixes; --wide shows them whole."""
    with connect(config, timeout) as client:
        if once:
            Console().print(render(read_frame(client), wide))
            return

        def frame() -> RenderableType:
            try:
                return render(read_frame(client), wide)
            except ClientError as exc:  # shown, then tried again at the next refresh
                return Panel(Text(f"{type(exc).__name__}: {exc}", style="red"),
                             title="cannot read the cluster")

        try:
            with Live(frame(), refresh_per_second=4, screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(frame())
        except KeyboardInterrupt:
            pass


def describe_change(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """A line for ``task show --follow`` when an attempt started, ended or progressed."""
    status = new["status"]
    where = f"attempt {new['seq']} on {new['executor']}"
    if old is None:
        return f"{where}: {STATUS_TEXT.get(status, status)}"
    if old["status"] != status:
        error = f": {new['error']}" if new.get("error") else ""
        return f"{where}: {STATUS_TEXT.get(status, status)}{error}"
    if status == "RUNNING" and new.get("progress") != old.get("progress") and new["progress"]:
        return f"{where}: {bar(new['progress']).plain}"
    return None


def follow(client: Client, task_id: str, echo: Any = click.echo, poll: float = 0.5) -> int:
    """Print attempt changes of ``task_id`` until it ends; 0 when it succeeded, else 1."""
    seen: dict[int, dict[str, Any]] = {}
    while True:
        report = client.get(task_id)
        for attempt in report.attempts:
            view = attempt.model_dump(mode="json")
            line = describe_change(seen.get(attempt.seq), view)
            if line:
                echo(line)
            seen[attempt.seq] = view
        if report.done:
            echo(f"task {task_id} {report.task.state}")
            return 0 if report.succeeded else 1
        time.sleep(poll)
