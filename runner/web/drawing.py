"""A workflow drawn as a graph: members as boxes coloured by state, ``depends_on`` edges as
lines, laid out here in Python and written as one SVG (no JavaScript, no Graphviz).

Layout: each member's column is the length of the longest chain of dependencies before it (a
root in column 0, a join one past its group), its row its order within the column; an edge goes
from the right side of what a member depends on to its left side. A group's members past 50
come as one entry of the report (state ``group``), drawn as one box with its count and its
counts per state. A failed member is drawn with a thick border. Pure: nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from runner.replies import WorkflowMemberView

WIDTH, HEIGHT = 170, 40  # a box
GAP_X, GAP_Y = 60, 16  # between columns, between rows
PAD = 10
#: fill per state (the console's badges')
FILL = {"waiting": "#d8eefc", "delayed": "#d8eefc", "running": "#fff2b3",
        "succeeded": "#cdeccd", "skipped": "#e6f2e6", "failed": "#f8c8c8",
        "cancelled": "#ead5f2", "blocked": "#f4dede", "standby": "#eeeeee", "group": "#ffffff"}


@dataclass(frozen=True)
class Box:
    member: WorkflowMemberView
    x: int
    y: int


def layout(members: list[WorkflowMemberView]) -> list[Box]:
    """Each member's box (see the module); a dependency not listed (past the report's
    members) is left out of the longest chain."""
    column: dict[str, int] = {}
    for m in members:  # each after what it depends on: its columns are known
        column[m.id] = 1 + max((column[d] for d in m.depends_on if d in column), default=-1)
    rows: dict[int, int] = {}
    boxes = []
    for m in members:
        col = column[m.id]
        row = rows.get(col, 0)
        rows[col] = row + 1
        boxes.append(Box(m, PAD + col * (WIDTH + GAP_X), PAD + row * (HEIGHT + GAP_Y)))
    return boxes


def svg(members: list[WorkflowMemberView]) -> str:
    """The workflow's drawing, one ``<svg>`` element."""
    boxes = layout(members)
    at = {b.member.id: b for b in boxes}
    width = max((b.x for b in boxes), default=0) + WIDTH + PAD
    height = max((b.y for b in boxes), default=0) + HEIGHT + PAD
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="workflow" id="workflow-graph" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    for b in boxes:
        for dep in b.member.depends_on:
            if dep in at:
                d = at[dep]
                parts.append(f'<line class="edge" x1="{d.x + WIDTH}" y1="{d.y + HEIGHT // 2}" '
                             f'x2="{b.x}" y2="{b.y + HEIGHT // 2}" stroke="#888"/>')
    for b in boxes:
        m = b.member
        fill = FILL.get(m.state, "#ffffff")
        border = 'stroke="#b00" stroke-width="3"' if m.state == "failed" else 'stroke="#555"'
        title = escape(f"{m.type} {m.id}: {m.state}" + (f": {m.error}" if m.error else ""))
        if m.count > 1:
            label = f"{m.count} x {m.type}"
            detail = ", ".join(f"{n} {state}" for state, n in sorted(m.counts.items()))
        else:
            label, detail = m.type, f"{m.state} · {m.attempts} att."
        parts.append(
            f'<g class="member {escape(m.state)}" data-id="{escape(m.id)}"><title>{title}</title>'
            f'<a href="/tasks/{escape(m.id)}"><rect x="{b.x}" y="{b.y}" width="{WIDTH}" '
            f'height="{HEIGHT}" rx="5" fill="{fill}" {border}/>'
            f'<text x="{b.x + 6}" y="{b.y + 16}" font-size="12">{escape(label[:26])}</text>'
            f'<text x="{b.x + 6}" y="{b.y + 32}" font-size="10">{escape(detail[:32])}</text>'
            f'</a></g>')
    parts.append("</svg>")
    return "".join(parts)
