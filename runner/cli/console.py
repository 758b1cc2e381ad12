"""Rich console reports: task lists, attempt reports, results, checkpoints, cluster status.

Why one module: every report the CLI prints shares its few helpers (states, times, bars,
checkpoint and result text); split per report, each would import the others' helpers.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from runner.replies import SHOWN

STATUS_STYLE = {"SUCCEEDED": "green", "FAILED": "bold red", "RUNNING": "yellow",
                "CANCELLED_BY_SYSTEM": "magenta", "CANCELLED": "magenta", "TIMED_OUT": "bold red"}
STATUS_TEXT = {"CANCELLED_BY_SYSTEM": "cancelled by system", "SUCCEEDED": "succeeded",
               "FAILED": "failed", "RUNNING": "running", "CANCELLED": "cancelled by operator",
               "TIMED_OUT": "timed out"}


def _when(value: str | None) -> str:
    if not value:
        return "-"
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:.2f} s" if ms < 60_000 else f"{ms / 60_000:.1f} min"


def checkpoint_text(checkpoint: dict[str, Any] | None, now: datetime | None = None) -> str:
    """A task's last checkpoint as ``task show`` and ``top`` print it: its size, its age and
    the attempt that committed it; "-" when it has none."""
    if not checkpoint:
        return "-"
    at = datetime.fromisoformat(checkpoint["at"]) if isinstance(checkpoint["at"], str) \
        else checkpoint["at"]
    age = max(0.0, ((now or datetime.now(UTC)) - at).total_seconds())
    size = checkpoint["size"]
    bytes_ = f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB"
    ago = f"{age:.0f} s" if age < 120 else f"{age / 60:.1f} min" if age < 7200 \
        else f"{age / 3600:.1f} h"
    return f"{bytes_}, {ago} ago, by attempt {checkpoint['seq']}"


#: how a console colours each state
STATE_STYLE = {"waiting": "cyan", "delayed": "cyan", "running": "yellow", "succeeded": "green",
               "skipped": "green", "failed": "bold red", "cancelled": "bold magenta",
               "blocked": "red"}


def _state(task: dict[str, Any]) -> Text:
    """The task's one state (its reply's ``state``), with what a person wants next to it: who
    runs it, until when it waits, why it stopped."""
    state = task.get("state") or "waiting"
    style = STATE_STYLE.get(state, "")
    if state == "running":
        return Text(f"running on {task['owner']}", style=style)
    if state == "delayed":
        what = "next attempt at" if task.get("attempts") else "waiting until"
        return Text(f"delayed: {what} {_when(task['run_at'])}", style=style)
    why = task.get("stop_reason")
    if state in ("failed", "cancelled") and why:
        return Text(f"{state}: {why}", style=style)
    return Text(state, style=style)


def render_task_list(tasks: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"{len(tasks)} task(s)")
    for column in ("id", "type", "state", "progress", "priority", "created", "updated"):
        table.add_column(column)
    for task in tasks:
        table.add_row(task["id"], task["type"], _state(task), bar(task.get("progress")),
                      str(task["priority"]), _when(task["created_at"]),
                      _when(task["updated_at"]))
    console.print(table)


def bar(progress: dict[str, Any] | None, width: int = 20) -> Text:
    """``[#######.......] 7/20 message`` for a handler's reported progress (``-`` when none)."""
    if not progress:
        return Text("-")
    done, total = progress["done"], progress.get("total")
    if total:
        filled = min(width, round(width * done / total))
        text = Text("[" + "#" * filled + "." * (width - filled) + "]", style="cyan")
        text.append(f" {done}/{total}")
    else:
        text = Text(f"{done} done")
    if progress.get("message"):
        text.append(f" {progress['message']}", style="dim")
    return text


def render_checkpoint(found: dict[str, Any], console: Console | None = None) -> None:
    """``task show ID --checkpoint``: when, by which attempt, how big, and its value (the
    first :data:`~runner.replies.SHOWN` bytes of its JSON, said so when cut)."""
    console = console or Console()
    if not found["present"]:
        console.print(f"task {found['task_id']} has no checkpoint")
        return
    console.print(f"checkpoint of task {found['task_id']}: "
                  f"{checkpoint_text({k: found[k] for k in ('at', 'size', 'seq')})}")
    text = json.dumps(found["value"], indent=2, sort_keys=True).encode()
    console.print(Text(text[:SHOWN].decode(errors="ignore")))
    if len(text) > SHOWN:
        console.print(f"... (the first {SHOWN // 1024} KiB of {found['size']} bytes; --json "
                      "shows all of it)")


def _shown_result(result: dict[str, Any], limit: int = 200) -> str:
    """A result in one line of ``task show``: its JSON, cut at ``limit`` characters (said)."""
    text = json.dumps(result["value"], sort_keys=True)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({result['size']} bytes; `task result ID` shows all of it)"


def render_result(found: dict[str, Any], console: Console | None = None) -> None:
    """``task result ID``: the value as indented JSON (a result is at most 64 KiB), or that
    the task succeeded with none."""
    console = console or Console()
    if not found["present"]:
        console.print(f"task {found['task_id']} succeeded with no result")
        return
    console.print(Text(json.dumps(found["value"], indent=2, sort_keys=True)))


def render_workflow(report: dict[str, Any], console: Console | None = None) -> None:
    """``workflow show ID``: the workflow's head, then its members as a tree (each under the
    member it depends on first; a join under its first dependency, its others named), each
    with its state, attempts and error; and the counts per state."""
    console = console or Console()
    wf, members = report["workflow"], report["members"]
    counts = ", ".join(f"{n} {state}" for state, n in sorted(report["counts"].items()))
    console.print(f"workflow {wf['id']} ({wf['key']}): {wf['state']}, {wf['members']} members: "
                  f"{counts}")
    tree: dict[str | None, list[dict[str, Any]]] = {}
    listed = {m["id"] for m in members}
    for m in members:
        parent = next((d for d in m["depends_on"] if d in listed), None)
        tree.setdefault(parent, []).append(m)

    def line(m: dict[str, Any], depth: int) -> None:
        state = m["state"]
        if m.get("count", 1) > 1:  # a group's members past 50, as one line
            text = Text("  " * depth + f"{m['count']} x {m['type']} ")
            text.append(", ".join(f"{n} {s}" for s, n in sorted(m["counts"].items())))
        else:
            text = Text("  " * depth + f"{m['type']} {m['id'][:8]} ")
            text.append(state, style=STATE_STYLE.get(state, ""))
        text.append(f" ({m['attempts']} attempts)")
        if len(m["depends_on"]) > 1:
            text.append(f" after {len(m['depends_on'])}")
        if m.get("error"):
            text.append(f": {m['error']}", style="red")
        console.print(text)
        for child in tree.get(m["id"], []):
            line(child, depth + 1)
    for root in tree.get(None, []):
        line(root, 0)
    if report.get("more"):
        console.print(f"... and {report['more']} more members (counted above)")


def render_task_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    task, attempts = report["task"], report["attempts"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("type", task["type"])
    head.add_row("state", _state(task))
    head.add_row("payload", Text(str(task["payload"])))
    head.add_row("priority", str(task["priority"]))
    if task.get("unique_key"):
        head.add_row("unique key", task["unique_key"])
    if task.get("run_at"):
        head.add_row("run at", _when(task["run_at"]))
    if task.get("ordering_key"):
        head.add_row("ordering key", task["ordering_key"])
    if task.get("resources"):
        head.add_row("resources", ", ".join(task["resources"]))
    head.add_row("created", _when(task["created_at"]))
    head.add_row("updated", _when(task["updated_at"]))
    head.add_row("attempts", str(len(attempts)))
    running = [a for a in attempts if a["status"] == "RUNNING" and a.get("progress")]
    if running:
        head.add_row("progress", bar(running[-1]["progress"]))
    if report.get("progress"):
        head.add_row("series", progress_text(report["progress"]))
    if task.get("checkpoint"):
        head.add_row("checkpoint", checkpoint_text(task["checkpoint"]))
    result = report.get("result")
    if result and result.get("present"):
        head.add_row("result", Text(_shown_result(result)))
    beating = [a for a in attempts if a["status"] == "RUNNING" and a.get("heartbeat")]
    if beating:
        beat = beating[-1]["heartbeat"]
        age = (datetime.now(UTC) - datetime.fromisoformat(beat["at"])).total_seconds()
        head.add_row("heartbeat", Text(f"{max(0.0, age):.0f} s ago: "
                                       f"{json.dumps(beat['details'])}"))
    console.print(Panel(head, title=f"task {task['id']}", expand=False))
    table = Table(title="attempts")
    for column in ("#", "status", "executor", "start", "end", "duration", "error"):
        table.add_column(column)
    for a in attempts:
        status = a["status"]
        table.add_row(str(a["seq"]), Text(STATUS_TEXT.get(status, status),
                                          style=STATUS_STYLE.get(status, "")),
                      a["executor"], _when(a["started_at"]), _when(a["ended_at"]),
                      _duration(a["duration_ms"]), Text(a["error"] or ""))
    console.print(table)
    for a in attempts:
        if a["status"] == "FAILED" and a.get("stack_trace"):
            console.print(Panel(Group(Text(a["error"] or "", style="bold red"),
                                      Text(a["stack_trace"])),
                                title=f"attempt {a['seq']} failed on {a['executor']}",
                                border_style="red", expand=False))


def render_cluster_status(status: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(f"cluster [bold]{status['cluster']}[/bold], master "
                  f"[bold green]{status['master'] or 'none'}[/bold green]")
    members = Table(title=f"{len(status['members'])} member(s)")
    for column in ("member", "host", "pid", "version", "role"):
        members.add_column(column)
    for m in sorted(status["members"], key=lambda m: m["id"]):
        members.add_row(m["id"], m["host"], str(m["pid"]), m["version"],
                        "master" if m["id"] == status["master"] else "")
    console.print(members)
    locks = Table(title=f"{len(status['locks'])} held task lock(s)")
    for column in ("task", "owner", "token", "age"):
        locks.add_column(column)
    for lock in status["locks"]:
        locks.add_row(lock["task"], lock["owner"], str(lock["token"]), f"{lock['age_s']} s")
    console.print(locks)
    if status.get("concurrency"):
        levels = Table(title="concurrency limits")
        for column in ("group", "used", "limit"):
            levels.add_column(column)
        for level in status["concurrency"]:
            levels.add_row(level["group"], str(level["used"]), str(level["limit"]))
        console.print(levels)
    for title, held in (("resources held", status.get("resources") or {}),
                        ("ordering keys running", status.get("ordering_keys") or {})):
        if held:
            console.print(f"{title}: " + ", ".join(f"{name} by {', '.join(owners)}"
                                                   for name, owners in sorted(held.items())))
    for inflight in status.get("commands") or []:
        console.print(f"command in flight: {inflight['command']} {inflight['id']} on "
                      f"{inflight['member']} for {inflight['age_s']} s")
    incidents = status.get("incidents") or []
    console.print(Text(f"{len(incidents)} open incident(s)",
                       style="bold red" if incidents else "green"))
    for incident in incidents:
        console.print(Text(f"  {incident['kind']}: task {incident['task']} "
                           f"{incident['detail']} (since {_when(incident['raised_at'])})",
                           style="red"))


def progress_text(p: dict[str, Any]) -> Text:
    """``7/10 batches, 7,000/10,000 rows, 1,234.5 rows/s`` (plus retries and failures)."""
    total = "?" if p.get("batches_total") is None else str(p["batches_total"])
    rows_total = "?" if p.get("rows_total") is None else f"{p['rows_total']:,}"
    text = Text(f"{p['batches_done']}/{total} batches, {p['rows_done']:,}/{rows_total} rows, "
                f"{p['rows_per_s']:,.1f} rows/s ({p['state']})")
    if p.get("retries"):
        text.append(f", {p['retries']} retried", style="yellow")
    for reason in p.get("failure") or []:
        text.append(f"\n{reason}", style="red")
    return text


ASPECT_STYLE = {"READY": "green", "CREATING": "cyan", "DELETING": "cyan", "FAILED": "bold red",
                "DELETED": "dim", "ABSENT": "dim"}


def render_aspect(aspect: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("state", Text(aspect["state"], style=ASPECT_STYLE.get(aspect["state"], "")))
    head.add_row("kind", aspect["kind"])
    head.add_row("generation", str(aspect["generation"]))
    head.add_row("classes", "\n".join(aspect["classes"]))
    if aspect.get("task"):
        t = aspect["task"]
        head.add_row("task", f"{t['id']} ({t['type']}, {t['status']}"
                             f"{', finished' if t['finished'] else ''}"
                             f"{'' if t['active'] else ', STOPPED'})")
    if aspect.get("progress"):
        head.add_row("progress", progress_text(aspect["progress"]))
    if aspect.get("error"):
        head.add_row("error", Text(aspect["error"], style="red"))
    console.print(Panel(head, title=f"aspect {aspect['name']}", expand=False))


def render_aspect_list(aspects: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"{len(aspects)} aspect(s)")
    for column in ("name", "kind", "state", "generation", "task"):
        table.add_column(column)
    for a in aspects:
        table.add_row(a["name"], a["kind"],
                      Text(a["state"], style=ASPECT_STYLE.get(a["state"], "")),
                      str(a["generation"]), (a.get("task") or {}).get("id", ""))
    console.print(table)


def render_task_types(types: list[dict[str, Any]], console: Console | None = None) -> None:
    """Task types: name, default priority, slots, payload fields (required ones marked *)."""
    table = Table(title="task types", show_lines=False)
    for column in ("type", "priority", "slots", "payload", "description"):
        table.add_column(column)
    for kind in types:
        schema = kind.get("payload_schema") or {}
        required = set(schema.get("required", []))
        fields = ", ".join(f"{name}{'*' if name in required else ''}"
                           for name in schema.get("properties", {})) or "any object"
        table.add_row(kind["name"], str(kind["priority"]),
                      "-" if kind["slots"] is None else str(kind["slots"]), fields,
                      kind["description"])
    (console or Console()).print(table)


def render_ontologies(ontologies: list[dict[str, Any]], console: Console | None = None) -> None:
    table = Table(title=f"{len(ontologies)} ontologies")
    for column in ("ontology", "version", "classes", "loaded"):
        table.add_column(column)
    for o in ontologies:
        table.add_row(o["iri"], o["version"] or "-", str(o["classes"]), _when(o["loaded_at"]))
    (console or Console()).print(table)


def render_ontology(ontology: dict[str, Any], limit: int = 50,
                    console: Console | None = None) -> None:
    console = console or Console()
    classes = ontology["classes"]
    console.print(f"[bold]{ontology['iri']}[/] version {ontology['version'] or '-'}, "
                  f"{len(classes)} classes, loaded {_when(ontology['loaded_at'])}")
    table = Table()
    for column in ("class", "label", "parents", "children"):
        table.add_column(column)
    shown = classes if limit == 0 else classes[:limit]
    for c in shown:
        table.add_row(c["iri"], c["label"] or "", "\n".join(c["parents"]) or "-",
                      str(c["children"]))
    console.print(table)
    if len(shown) < len(classes):
        console.print(f"... {len(classes) - len(shown)} more (--limit 0 or --json for all)")


def render_dead_letters(letters: list[dict[str, Any]], console: Console | None = None) -> None:
    table = Table(title=f"{len(letters)} dead-lettered messages")
    for column in ("message id", "command", "reason", "from", "rejected by", "at"):
        table.add_column(column)
    for d in letters:
        table.add_row(d["message_id"] or "-", d["command"] or "-", d["reason"],
                      d["queue"], d["member"], _when(d["dead_at"]))
    (console or Console()).print(table)


def render_dead_letter(letter: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(f"[bold]{letter['message_id']}[/] {letter['command'] or '(undecodable)'}: "
                  f"[red]{letter['reason']}[/] from {letter['queue']} by {letter['member']} "
                  f"at {_when(letter['dead_at'])}")
    console.print(Panel(letter["detail"] or "-", title="detail"))
    body = letter["body"]
    console.print(Panel(json.dumps(body, indent=2) if not isinstance(body, str) else body,
                        title="body"))
