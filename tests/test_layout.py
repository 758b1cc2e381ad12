"""The layout is enforced, not described: import layering, module size, private names, error codes.

Read from the source with ``ast`` (every import, including those inside functions), so a lazy
import cannot slip past. The rules are the ones docs/architecture.md states.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("coord", "messaging", "runner")
MAX_LINES = 320  # "about 300"; a longer module says why at its top
REASON = "Why one module:"


def modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def imports_of(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """(module imported, names imported from it, line) for every import in the file."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[:-node.level]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, [a.name for a in node.names], node.lineno


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


#: (importer prefix, forbidden import prefixes, why)
RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("coord", ("messaging", "runner"), "coord is the bottom layer"),
    ("messaging", ("runner",), "messaging knows nothing of tasks"),
    ("runner.store", ("runner.tasks", "runner.ontology", "runner.pipeline", "runner.node",
                      "runner.cli", "runner.devenv", "runner.testing"),
     "the store is the runner's bottom layer"),
    ("runner.tasks", ("runner.ontology", "runner.pipeline", "runner.node", "runner.cli",
                      "runner.devenv", "runner.testing"),
     "the generic task runner knows no domain and no front end"),
    ("runner.ontology", ("runner.pipeline", "runner.node", "runner.cli", "runner.devenv",
                         "runner.testing"),
     "the domain never imports the node, the CLI or the harness"),
    ("runner.pipeline", ("runner.node", "runner.cli", "runner.devenv", "runner.testing"),
     "the domain never imports the node, the CLI or the harness"),
    ("runner.node", ("runner.cli", "runner.devenv", "runner.testing"),
     "the node process does not depend on its command line or on test code"),
    ("runner.testing", ("runner.cli",), "fixtures go through the API, not through the CLI's code"),
    ("runner.client", ("runner.cli", "runner.node.node", "runner.node.api", "runner.node.main",
                       "runner.tasks", "runner.store.gremlin", "runner.ontology",
                       "runner.pipeline", "runner.devenv", "runner.testing"),
     "the client speaks to nodes only through the API (it reads the node's views)"),
    ("runner.errors", ("runner.",), "the error root is importable from anywhere"),
    ("runner.logs", ("runner.",), "logging setup is importable from anywhere"),
    ("runner.config", ("runner.devenv", "runner.testing", "runner.cli", "runner.node"),
     "loading settings loads no subprocess or front-end code"),
]
#: nothing outside a package's testing subpackage imports it, except other harnesses and the
#: operator tooling that composes them (runner.devenv, and runner.cli's `dev` group)
HARNESS_USERS = ("coord.testing", "messaging.testing", "runner.testing", "runner.devenv",
                 "runner.cli.dev", "runner.cli.root")


def test_imports_point_down_only() -> None:
    broken = []
    for name, path in modules():
        for target, _, line in imports_of(path):
            for importer, forbidden, why in RULES:
                if not within(name, importer):
                    continue
                if importer == "coord" and within(name, "coord.testing"):
                    forbidden = ("runner",)  # coord's harness may not reach up either
                if importer == "messaging" and within(name, "messaging.testing"):
                    forbidden = ("runner",)
                for prefix in forbidden:
                    if within(target, prefix.rstrip(".")) and target != name:
                        broken.append(f"{name}:{line} imports {target} ({why})")
            for harness in ("coord.testing", "messaging.testing", "runner.testing"):
                if within(target, harness) and not any(within(name, u) for u in HARNESS_USERS):
                    broken.append(f"{name}:{line} imports the test harness {target}")
    assert broken == []


def test_private_names_stay_in_their_package() -> None:
    broken = []
    for name, path in modules():
        top = name.split(".")[0]
        for target, names, line in imports_of(path):
            if target.split(".")[0] not in PACKAGES or target.split(".")[0] == top:
                continue
            private_module = any(part.startswith("_") and part != "__init__"
                                 for part in target.split("."))
            private_names = [n for n in names if n.startswith("_")]
            if private_module or private_names:
                broken.append(f"{name}:{line} imports {target} {private_names or ''}")
    assert broken == []


def test_every_module_says_what_it_owns_and_long_ones_say_why() -> None:
    missing, long = [], []
    for name, path in modules():
        text = path.read_text()
        tree = ast.parse(text)
        doc = ast.get_docstring(tree)
        if not doc and path.name != "__main__.py":
            missing.append(name)
        lines = len(text.splitlines())
        if lines > MAX_LINES and REASON not in (doc or ""):
            long.append(f"{name}: {lines} lines")
    assert missing == []
    assert long == []


def test_error_codes_are_declared_once_and_every_runner_error_has_one() -> None:
    for name, _ in modules():
        if name.endswith("__main__") or within(name, "runner.testing"):
            continue
        importlib.import_module(name)
    from runner.errors import ERROR_CODES, RunnerError

    # control flow, not errors (runner.errors explains why), and private guards of one module;
    # the CLI's own exits are click's exceptions
    not_errors = {"TaskCancelled", "TaskConflict", "TaskDeclined"}
    import click
    outside = []
    for name, _ in modules():
        if (not within(name, "runner") or within(name, "runner.testing")
                or name.endswith("__main__")):
            continue
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if (cls.__module__ == name and issubclass(cls, BaseException)
                    and not cls_name.startswith("_") and cls_name not in not_errors
                    and not issubclass(cls, (RunnerError, click.ClickException))):
                outside.append(f"{name}.{cls_name}")
    assert outside == []
    assert len(ERROR_CODES) == len(set(ERROR_CODES.values()))
    for code, cls in ERROR_CODES.items():
        assert cls.error_code == code
        assert code.replace("_", "").isalpha() and code == code.lower()


def test_a_second_class_with_a_taken_code_is_refused() -> None:
    from runner.errors import RunnerError

    with pytest.raises(TypeError, match="task_not_found"):
        type("Imposter", (RunnerError,), {"error_code": "task_not_found"})
    with pytest.raises(TypeError, match="must declare"):
        type("Anonymous", (RunnerError,), {})
