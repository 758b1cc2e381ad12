"""One of several processes writing the same tasks of one graph at once.

``python -m runner.testing.storeclaimer GRAPH NAME LOG [MODE]`` prints ``READY``, waits for
``LOG.go``, then works, in its own random order, on every unfinished task. ``GRAPH`` is a
gremlite file or a ``ws://`` Gremlin Server that runs one traversal at a time.

* ``update`` (the default): claims the WAITING ones with a plain task update (status RUNNING,
  owner NAME) guarded by the version it read; a CommitConflict means another process was
  first: it moves on.
* ``cycle [ROUNDS]``: the task loop's own writes, racing: claim (``Store.claim``: the
  task, its new attempt and the ends of the attempts it supersedes, with a fencing token newer
  than any before), then, for every other claim, conclude it SUCCEEDED
  (``Store.conclude``), finished from round ROUNDS on (1: at once); the claims left
  open are superseded by the next claim of another process, until every task is finished.
  Refusals (CommitConflict, StaleFencingToken, AttemptAlreadyFinished) are lost races: it
  moves on.

It writes the ids it claimed (``update``) or concluded (``cycle``) to LOG and prints
``DONE <count>``; any other error is printed as ``ERROR <repr>`` and exits 1.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from runner.errors import AttemptAlreadyFinished, CommitConflict, StaleFencingToken
from runner.store import AttemptStatus, Conclusion, Store, TaskStatus, is_server, open_store


def _open(location: str) -> Store:
    if is_server(location):
        return open_store(location, atomicity="serial")
    return open_store(location)


def _token(index: int) -> int:
    """A fencing token newer than every one handed out before, unique to this process (as a
    lock's czxid is): the clock in microseconds, the process's index in the last digit."""
    return time.time_ns() // 1000 * 10 + index


def _updates(store: Store, name: str) -> list[str]:
    claimed = []
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
    return claimed


def _cycles(store: Store, name: str, index: int, rounds: int) -> list[str]:
    concluded = []
    rng = random.Random(name)
    deadline = time.monotonic() + 120
    for round_ in range(1, 10**6):
        tasks = store.tasks.unfinished()
        if not tasks or time.monotonic() > deadline:
            break
        finish = round_ >= rounds  # the earlier rounds conclude without finishing
        rng.shuffle(tasks)
        for listed in tasks:
            current = store.tasks.get(listed.id)
            if current.finished:  # since the listing; one finished later refuses the claim
                continue
            try:
                task, attempt = store.claim(current, _token(index), name)
                if rng.random() < 0.5:
                    continue  # left open: the next claim supersedes it
                store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                             {"status": TaskStatus.WAITING, "finished": finish}))
            except (CommitConflict, StaleFencingToken, AttemptAlreadyFinished):
                continue
            if finish:
                concluded.append(task.id)
    return concluded


def main(argv: list[str]) -> int:
    graph, name, log_path, *rest = argv
    mode = rest[0] if rest else "update"
    rounds = int(rest[1]) if len(rest) > 1 else 1
    go = Path(log_path + ".go")
    with _open(graph) as store:
        print("READY", flush=True)
        while not go.exists():
            time.sleep(0.01)
        try:
            done = (_updates(store, name) if mode == "update"
                    else _cycles(store, name, int(name.lstrip("p") or 0), rounds))
        except Exception as exc:
            print(f"ERROR {exc!r}", flush=True)
            return 1
        Path(log_path).write_text("".join(f"{t}\n" for t in done))
        print(f"DONE {len(done)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
