"""One of several processes claiming tasks in a shared gremlite file (conditional updates).

``python -m runner.testing.storeclaimer GRAPH_FILE NAME LOG`` prints ``READY``, waits for
``LOG.go``, then walks every unfinished task (in its own random order) and claims the WAITING
ones: status RUNNING and owner NAME, guarded by the version it read. A CommitConflict means
another process was first: it moves on. It writes the ids it claimed to LOG and prints
``DONE <count>``; any other error is printed as ``ERROR <repr>`` and exits 1.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from runner.errors import CommitConflict
from runner.store import TaskStatus, open_store


def main(argv: list[str]) -> int:
    graph_file, name, log_path = argv
    go = Path(log_path + ".go")
    with open_store(graph_file) as store:
        print("READY", flush=True)
        while not go.exists():
            time.sleep(0.01)
        claimed = []
        try:
            tasks = store.tasks.unfinished()
            random.Random(name).shuffle(tasks)
            for listed in tasks:
                task = store.tasks.get(listed.id)
                if task.status is not TaskStatus.WAITING:
                    continue
                try:
                    store.tasks.update(task.id, task.version, None, status=TaskStatus.RUNNING,
                                       owner=name)
                except CommitConflict:
                    continue
                claimed.append(task.id)
        except Exception as exc:
            print(f"ERROR {exc!r}", flush=True)
            return 1
        Path(log_path).write_text("".join(f"{t}\n" for t in claimed))
        print(f"DONE {len(claimed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
