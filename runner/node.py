"""The latchwork node process (so far: membership and the leader latch).

A node joins the cluster's membership and the master election, logs every connection and
leadership change with its member id, and on SIGTERM or SIGINT leaves at once: it closes the
latch (a successor takes over in milliseconds), removes its member node and closes its session,
then exits 0. The task loop, master duties and messaging are added by the runner issue.

Failure behaviour: killed -9, its member and latch nodes go when the server expires its session;
a LOST session is logged, and membership and latch register again on the next session.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from coord import LeaderLatch, Membership, Session, SessionState
from runner import __version__
from runner.config import Settings

log = logging.getLogger("latchwork.node")


class Node:
    """One cluster node built from :class:`Settings`; ``start()`` then ``close()``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.session = Session(settings.zk_hosts, settings.cluster,
                               timeout=settings.session_timeout, auth=settings.zk_auth)
        self.membership: Membership | None = None
        self.latch: LeaderLatch | None = None

    @property
    def member_id(self) -> str:
        if self.membership is None:
            raise RuntimeError("node not started")
        return self.membership.member_id

    def start(self) -> Node:
        self.session.start()
        try:
            self.membership = Membership(self.session, version=__version__).start()
            member = self.membership.member_id
            self.session.add_listener(
                lambda state: log.log(logging.INFO if state is SessionState.CONNECTED
                                      else logging.WARNING,
                                      "member %s: ZooKeeper session %s", member, state.value))
            self.latch = LeaderLatch(self.session, member)
            self.latch.add_listener(
                on_gain=lambda: log.info("member %s: became master", member),
                on_loss=lambda: log.warning("member %s: no longer master", member))
            self.latch.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self.latch is not None:
            self.latch.close()
        if self.membership is not None:
            self.membership.close()
        self.session.close()

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def run(settings: Settings, ready: threading.Event | None = None) -> int:
    """Run a node until SIGTERM/SIGINT; returns the exit code."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: leaving the cluster", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with Node(settings) as node:
            print(f"latchwork node {node.member_id} joined cluster {settings.cluster} "
                  f"at {settings.zk_hosts}", flush=True)
            if ready is not None:
                ready.set()
            stop.wait()
        log.info("node stopped cleanly")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
