"""The ``--py-files`` zip for ``spark-submit``: latchwork's packages, nothing else.

``python -m runner.pipeline.bundle dist/latchwork-pyfiles.zip`` (``make pyfiles``). The driver
also needs latchwork's dependencies (kazoo, gremlinpython, pydantic...) in its Python; the
executors need none of them, since the job uses Spark built-in expressions only.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PACKAGES = ("coord", "messaging", "runner")


def build(dest: Path) -> Path:
    root = Path(__file__).resolve().parents[2]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as bundle:
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*")):
                if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                    bundle.write(path, path.relative_to(root))
    return dest


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "dist/latchwork-pyfiles.zip")))
