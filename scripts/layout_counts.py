"""The layout's counts issue 71 asked for, read from a tree's source with ``ast``: ``Any``
(Name and Attribute nodes) in runner/store and in coord, messaging and runner; the runner's
modules outside runner/store that import a store driver, the Gremlin layer or a concrete store
class; import cycles between modules (function-level imports included) and among
runner/store's subpackages; the store entry points the worker writes an attempt's end through;
the modules over 400 lines.

Usage: ``python scripts/layout_counts.py [TREE]`` (this checkout by default; a worktree of an
older commit to compare).
"""

from __future__ import annotations

import ast
import collections
import re
import sys
from pathlib import Path

PACKAGES = ("coord", "messaging", "runner")
DRIVERS = ("runner.store.gremlin", "runner.store.embedded", "runner.store.server",
           "runner.store.graph", "runner.store.remote", "runner.store.driver",
           "runner.store.wire", "runner.store.direct", "runner.store.strings",
           "runner.store.replace", "runner.store.branches", "runner.store.wal")
CONCRETE = {"GraphStore", "EmbeddedGraph", "RemoteGraph", "GremlinTaskStore",
            "GremlinAttemptLog", "GremlinAvatarStore", "GremlinOntologyStore"}
ENDS = re.compile(r"store\.(conclude_many|conclude|complete|release|close_attempts|"
                  r"attempts\.finish|write_ends)\(")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(100_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def main(root: Path) -> None:
    files = {module_name(root, p): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    anys: dict[str, int] = {}
    lines: dict[str, int] = {}
    imports: dict[str, set[str]] = collections.defaultdict(set)
    from_store: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in files.items():
        text = path.read_text()
        tree = ast.parse(text)
        lines[name] = len(text.splitlines())
        anys[name] = sum(1 for n in ast.walk(tree)
                         if (isinstance(n, ast.Name) and n.id == "Any")
                         or (isinstance(n, ast.Attribute) and n.attr == "Any"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    imports[name].add(full if full in files else target)
                    if target == "runner.store":
                        from_store[name].add(alias.name)
            elif isinstance(node, ast.Import):
                imports[name].update(alias.name for alias in node.names)
        imports[name] = {i for i in imports[name] if i in files and i != name}
    print("Any in runner/store:", sum(n for m, n in anys.items()
                                      if m.startswith("runner.store")))
    print("Any in coord, messaging and runner:", sum(anys.values()))
    outside = [m for m in files if m.startswith("runner") and not m.startswith("runner.store")]
    bad = sorted(m for m in outside if any(i.startswith(DRIVERS) for i in imports[m])
                 or from_store[m] & CONCRETE)
    print("runner modules outside runner/store importing a driver or a concrete store class:",
          len(bad))
    print("import cycles between modules:", len(cycles(imports)))

    def unit(module: str) -> str:
        return ".".join(module.split(".")[:3]) if module.startswith("runner.store.") else module

    store: dict[str, set[str]] = collections.defaultdict(set)
    for module, deps in imports.items():
        if module.startswith("runner.store"):
            store[unit(module)] |= {unit(d) for d in deps
                                    if d.startswith("runner.store") and unit(d) != unit(module)}
    print("import cycles among runner/store's subpackages:", cycles(store))
    calls: collections.Counter[str] = collections.Counter()
    for module, path in files.items():
        if module.startswith("runner.tasks.worker"):
            calls.update(ENDS.findall(path.read_text()))
    print("store entry points the worker writes an attempt's end through:", len(calls),
          dict(calls))
    long = sorted(((n, m) for m, n in lines.items() if n > 400), reverse=True)
    print("modules over 400 lines:", len(long), ", ".join(f"{m} ({n})" for n, m in long))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
