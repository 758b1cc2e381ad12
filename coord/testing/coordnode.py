"""A coord participant as its own process, for kill -9 / SIGSTOP tests and benchmarks.

``python -m coord.testing.coordnode MODE HOSTS CLUSTER SESSION_TIMEOUT [ARGS...]``

* ``member``: registers in membership; prints ``READY <member id>``.
* ``latch``: registers and joins the leader latch; prints ``READY <member id>``, then ``LEADER``
  when it gains leadership and ``FOLLOWER`` when it loses it. Every 50 ms, while it believes it
  leads, it runs the server-side check and prints ``ACT <wall time the check started>`` when
  the check passes: the "act as master" of a real node.
* ``locker TASKS PASSES LOG``: tries the locks of task ``t0 .. t<TASKS-1>`` round-robin for PASSES
  passes, recording ``task token acquired released`` lines (CLOCK_MONOTONIC, comparable across
  processes on one host) in LOG; prints ``READY``, starts once ``LOG.go`` exists, and prints
  ``DONE <acquired>`` at the end.

SIGTERM closes everything cleanly and exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from coord import LeaderLatch, Membership, Session, TaskLock


def main(argv: list[str]) -> int:
    mode, hosts, cluster, timeout = argv[0], argv[1], argv[2], float(argv[3])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    session = Session(hosts, cluster, timeout=timeout).start()
    membership = Membership(session).start()
    member_id = membership.member_id
    try:
        if mode == "member":
            print(f"READY {member_id}", flush=True)
            while not stop.wait(0.1):  # a timed wait: a signal taken by another thread wakes it
                pass
        elif mode == "latch":
            latch = LeaderLatch(session, member_id)
            latch.add_listener(on_gain=lambda: print("LEADER", flush=True),
                               on_loss=lambda: print("FOLLOWER", flush=True))
            latch.start()
            print(f"READY {member_id}", flush=True)
            while not stop.wait(0.05):
                if latch.is_leader:
                    started = time.time()
                    if latch.check_leadership():
                        print(f"ACT {started:.6f}", flush=True)
            latch.close()
        elif mode == "locker":
            tasks, passes, log_path = int(argv[4]), int(argv[5]), argv[6]
            go = Path(log_path + ".go")
            print("READY", flush=True)
            while not go.exists():  # all lockers start together
                time.sleep(0.01)
            acquired = 0
            with open(log_path, "w") as log:
                for _ in range(passes):
                    for i in range(tasks):
                        lock = TaskLock(session, f"t{i}", member_id)
                        token = lock.try_acquire()
                        if token is None:
                            continue
                        got = time.monotonic()
                        time.sleep(0.0005)  # hold it a little, so an overlap would show
                        released = time.monotonic()
                        lock.release()
                        log.write(f"t{i} {token} {got:.9f} {released:.9f}\n")
                        acquired += 1
            print(f"DONE {acquired}", flush=True)
            while not stop.wait(0.1):  # a timed wait: a signal taken by another thread wakes it
                pass
        else:
            print(f"unknown mode {mode}", file=sys.stderr)
            return 2
    finally:
        membership.close()
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
