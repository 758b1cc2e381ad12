"""The ``pipeline`` extra: Spark (pyspark), pyarrow and pandas, installed with
``pip install 'latchwork[pipeline]'`` (``make setup`` installs it). A node without it starts
and runs every other task; what needs it is refused in one line naming the extra: the
pipeline's task types at submit, ``aspect create``/``delete``, ``avatars import``/``export``,
``retention_mode = "archive"`` at the node's start, and ``dev up --spark-workers``."""

from __future__ import annotations

import importlib.util

from runner.errors import ExtraMissing

EXTRA = "pipeline"
#: what the extra brings, by the name it is imported as
MODULES = ("pyspark", "pyarrow", "pandas")


def missing() -> list[str]:
    """The extra's modules that cannot be imported here."""
    absent = []
    for name in MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            absent.append(name)
    return absent


def needs(what: str) -> str | None:
    """Why ``what`` cannot run here (None: it can)."""
    absent = missing()
    if not absent:
        return None
    return (f"{what} needs the {EXTRA} extra (Spark, pyarrow, pandas), which is not "
            f"installed ({', '.join(absent)} missing): pip install 'latchwork[{EXTRA}]'")


def require(what: str) -> None:
    """:class:`~runner.errors.ExtraMissing` naming the extra when it is not installed."""
    why = needs(what)
    if why is not None:
        raise ExtraMissing(why)
