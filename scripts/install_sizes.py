"""The installed size of latchwork's base and of each extra, measured in this venv: for each
requirement set, the distributions it pulls in (the transitive closure of Requires-Dist, the
markers evaluated here) and the bytes their installed files take. Prints a Markdown table (the
README's). Usage: ``.venv/bin/python scripts/install_sizes.py``."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement


def name_of(requirement: str) -> Requirement:
    return Requirement(requirement)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def size(dist: metadata.Distribution) -> int:
    total = 0
    for file in dist.files or ():
        path = Path(str(dist.locate_file(file)))
        if path.is_file():
            total += path.stat().st_size
    return total


def closure(requirements: list[str], extras: tuple[str, ...] = ()) -> set[str]:
    """The distributions ``requirements`` pull in, installed here."""
    seen: set[str] = set()
    todo = [(r, extras) for r in requirements]
    while todo:
        text, active = todo.pop()
        req = name_of(text)
        if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in (*active, "")):
            continue
        key = canonical(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        if key in seen:
            continue
        seen.add(key)
        todo += [(r, tuple(req.extras)) for r in dist.requires or ()]
    return seen


def main() -> None:
    latchwork = metadata.distribution("latchwork")
    requires = list(latchwork.requires or ())
    base = [r for r in requires if "extra ==" not in r]
    sizes = {canonical(d.metadata["Name"]): size(d) for d in metadata.distributions()}
    base_set = closure(base)
    own = size(latchwork)
    print("| install | adds | installed size |")
    print("|---|---|---|")
    print(f"| `pip install latchwork` | {len(base_set)} distributions | "
          f"{(own + sum(sizes.get(d, 0) for d in base_set)) / 2**20:.0f} MiB |")
    for extra in ("pipeline", "web", "graph-server"):
        wanted = [r.split(";")[0] for r in requires
                  if re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", r)]
        added = closure(wanted) - base_set - {"latchwork"}
        print(f"| `latchwork[{extra}]` | {', '.join(sorted(added)) or 'nothing'} | "
              f"+{sum(sizes.get(d, 0) for d in added) / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
