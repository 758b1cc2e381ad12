"""Concurrent exactly-once copies through ZooKeeper's own faults: the session of the copy ahead
expired by the server, and the ensemble's leader killed -9, mid-stream. (kill -9 and SIGSTOP of
copies are in test_streams.py.) Copies run in threads here, each on its own session, as a
runner node's copy task does; whatever each fault does to the copies, the outputs must be a
single sequential run's: same values, same order, no gap, no duplicate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from coord import Session
from coord.errors import ConnectionLost, SessionExpired
from coord.exactly_once import ExactlyOnceHandler, QueueOutput
from coord.queue import LockFreeQueue
from coord.testing import ZooKeeperCluster, expire_session, kill_ensemble_leader, wait_until
from coord.testing.plugin import ZkNamespace
from coord.testing.streamcopy import running_sum

INPUTS = 300


class Copy:
    """One copy in a thread on its own session, started again after an error, as the runner
    starts a copy task again (the errors are kept for the test to look at)."""

    def __init__(self, hosts: str, name: str, session_timeout: float) -> None:
        self.session = Session(hosts, "s1", timeout=session_timeout).start()
        self.name = name
        self.stop = threading.Event()
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self._run, name=f"copy-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            s = self.session
            handler = ExactlyOnceHandler(s, "sums", [LockFreeQueue(s, "numbers")],
                                         QueueOutput(LockFreeQueue(s, "out")), running_sum,
                                         initial_state=0, batch=7, copy_id=self.name,
                                         liveness="127.0.0.1")
            try:
                handler.run(self.stop, idle=0.05, follower_idle=0.05)
            except (SessionExpired, ConnectionLost) as exc:
                self.errors.append(exc)
                time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(20)
        self.session.close()


@contextmanager
def copies(hosts: str, names: str, session_timeout: float) -> Iterator[dict[str, Copy]]:
    running = {n: Copy(hosts, n, session_timeout) for n in names}
    try:
        yield running
    finally:
        for copy in running.values():
            copy.close()


def expected() -> list[int]:
    sums, total = [], 0
    for n in range(1, INPUTS + 1):
        total += n
        sums.append(total)
    return sums


def push(source: LockFreeQueue, numbers: range, every: float = 0.002) -> None:
    for n in numbers:
        source.push(str(n).encode())
        time.sleep(every)


def check(s: Session) -> None:
    sink = LockFreeQueue(s, "out")
    assert wait_until(lambda: sink.end() == INPUTS, 60), sink.end()
    time.sleep(0.5)  # a late copy could only write the same values again
    assert [int(v) for _, v in sink.read(0, limit=INPUTS + 10)] == expected()
    state, _ = ExactlyOnceHandler(s, "sums", [LockFreeQueue(s, "numbers")], QueueOutput(sink),
                                  running_sum).register.get()
    assert state["state"] == sum(range(1, INPUTS + 1))
    assert state["positions"] == {"numbers": INPUTS} and state["out_next"] == INPUTS


def test_the_copy_ahead_whose_session_expires_costs_no_output(zk_namespace: ZkNamespace
                                                              ) -> None:
    """The server expires the session of the copy ahead mid-stream (a long GC pause, a
    partition past the timeout). A call in flight raises SessionExpired and the copy starts
    again, or the next call runs on the new session: either way no lock, no ephemeral node
    and no wait is involved, the other copy goes on, and the outputs are exact."""
    with Session(zk_namespace.hosts, "s1", timeout=4.0) as s, \
            copies(zk_namespace.hosts, "ab", 2.0) as running:
        source, sink = LockFreeQueue(s, "numbers"), LockFreeQueue(s, "out")
        state = ExactlyOnceHandler(s, "sums", [source], QueueOutput(sink), running_sum).register
        push(source, range(1, 101))
        assert wait_until(lambda: sink.end() >= 60, 30)
        pusher = threading.Thread(target=push, args=(source, range(101, INPUTS + 1)))
        pusher.start()
        ahead = running[str(state.get()[0]["by"])]
        old = ahead.session.session_id
        expire_session(ahead.session.client)  # while inputs keep coming
        pusher.join()
        check(s)
        assert ahead.session.session_id != old  # it really lost that session
        assert all(isinstance(e, SessionExpired | ConnectionLost)
                   for c in running.values() for e in c.errors)


@pytest.mark.slow
def test_the_ensemble_leader_killed_mid_stream_costs_no_output(
        zookeeper_ensemble: ZooKeeperCluster, ensemble_namespace: ZkNamespace) -> None:
    """kill -9 of the ZooKeeper ensemble's leader while two copies work: their sessions move to
    the other servers; a CAS or an output write whose reply was lost with the connection is
    recognised on retry (its write id, its value at its index), and the outputs are exact."""
    hosts = ensemble_namespace.hosts
    with Session(hosts, "s1", timeout=8.0) as s, copies(hosts, "ab", 8.0):
        source, sink = LockFreeQueue(s, "numbers"), LockFreeQueue(s, "out")
        push(source, range(1, 101))
        assert wait_until(lambda: sink.end() >= 60, 30)
        pusher = threading.Thread(target=push, args=(source, range(101, INPUTS + 1), 0.01))
        pusher.start()
        victim = kill_ensemble_leader(zookeeper_ensemble)
        try:
            pusher.join()
            check(s)
        finally:
            victim.start()
            victim.wait_ready()
