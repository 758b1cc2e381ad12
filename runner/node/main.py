"""Running a node in the foreground until SIGTERM or SIGINT (``latchwork node start``).

The signal handler only records the signal; the main thread polls it and closes the node:
running tasks cancelled (their attempts end CANCELLED_BY_SYSTEM), locks released after the
attempts are written, the latch handed over, membership left, exit 0, within
``shutdown_timeout`` plus a few seconds. A node that fails to start raises; nothing it had
started is left running. A node whose own thread dies of an exception stops the same way and
exits 70 (:data:`THREAD_DIED`), loudly, rather than run on with a guarantee switched off.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType

from runner import logs
from runner.config import Settings
from runner.node.node import Node
from runner.store import is_server

log = logging.getLogger("latchwork.node")


def run(settings: Settings, ready: threading.Event | None = None,
        node: Node | None = None) -> int:
    """Run a node (``node``, or one built from ``settings``) until SIGTERM/SIGINT; returns the
    exit code.

    The signal handler only records the signal: taking a lock (Event.set, a log record) inside
    a handler can deadlock with the code it interrupted. The main thread polls the flag.
    """
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    died: list[str] = []
    hook = threading.excepthook
    threading.excepthook = _on_thread_death(hook, died, stopping=lambda: bool(received))
    switch = sys.getswitchinterval()
    frozen = False
    try:
        sys.setswitchinterval(switch_interval(settings))
        with node or Node(settings) as running:
            logs.set_member(running.member_id)
            print(f"latchwork node {running.member_id} joined cluster {settings.cluster} "
                  f"at {settings.zk_hosts}", flush=True)
            frozen = _freeze_start_up()
            if ready is not None:
                ready.set()
            while not received and not died:
                time.sleep(0.1)
            if died:
                log.critical("member %s: its thread %s died; leaving the cluster (exit %d)",
                             running.member_id, died[0], THREAD_DIED)
            else:
                log.info("member %s: signal %s: leaving the cluster", running.member_id,
                         signal.Signals(received[0]).name)
        if died:
            print(f"latchwork node stopped: its thread {died[0]} died (see the log)",
                  file=sys.stderr, flush=True)
            return THREAD_DIED
        log.info("node stopped cleanly")
        return 0
    finally:
        threading.excepthook = hook
        if frozen:
            gc.unfreeze()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.setswitchinterval(switch)


#: the exit code of a node one of whose own threads died (EX_SOFTWARE)
THREAD_DIED = 70

#: the packages whose threads are the node's own: one of them dying stops the node
OWN_PACKAGES = ("coord.", "messaging.", "runner.")


def _on_thread_death(hook: Callable[[threading.ExceptHookArgs], object], died: list[str],
                     stopping: Callable[[], bool] = lambda: False
                     ) -> Callable[[threading.ExceptHookArgs], None]:
    """A ``threading.excepthook`` that stops the node when one of its own threads dies of an
    exception: a dead time-limit watcher, group commit or scan feeder would switch a guarantee
    off in silence, so the node logs CRITICAL, leaves the cluster and exits
    :data:`THREAD_DIED` (a supervisor starts it again). A thread of a user's handler is not the
    node's: its death is only logged, as Python does."""
    def on_death(args: threading.ExceptHookArgs) -> None:
        hook(args)  # the traceback on stderr, as always
        if args.exc_type is SystemExit or not _own(args.exc_traceback) or stopping():
            return  # not the node's, or the node is leaving anyway (a SIGTERM came first)
        name = args.thread.name if args.thread is not None else "?"
        log.critical("thread %s died: %s: %s", name, args.exc_type.__name__, args.exc_value)
        died.append(name)
    return on_death


def _own(tb: TracebackType | None) -> bool:
    """Whether the thread whose traceback this is ran a target of latchwork's own packages
    (the first frame after threading's ``run``)."""
    while tb is not None and tb.tb_frame.f_globals.get("__name__") == "threading":
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith(
        OWN_PACKAGES)


def _freeze_start_up() -> bool:
    """Move what the node's start allocated (the libraries' modules, the registry, the
    connections: most of the process's objects, and they live as long as it) out of the
    garbage collector's generations, so that its full collections walk only what was allocated
    since: ``gc.freeze``, done once the node has started; ``run`` undoes it when the node
    has stopped. Without it, each node paused 30-55 ms in a full collection now and then, in
    whichever traversal was running (one submit's store write here in the bench's paced
    latency: its p99 was 51 ms where its p90 was 10). Whether this run froze anything (a
    process that froze before keeps its own)."""
    if gc.get_freeze_count():
        return False
    gc.freeze()
    return True


#: the switch interval of a node on an embedded graph (seconds)
EMBEDDED_SWITCH_INTERVAL = 0.0005


def switch_interval(settings: Settings) -> float:
    """How long a node's thread runs Python before a waiting one may take the interpreter:
    ``settings.switch_interval``, else 0.5 ms on an embedded graph, else Python's own 5 ms. A
    gremlite write runs Python for milliseconds; meanwhile the ZooKeeper client's thread, the
    broker's, and a worker whose lock answer came wait for the interpreter, up to the interval
    each time (the embedded drain rose in three of four A/B pairs at 0.5 ms, -6% to +16%; on a
    remote graph, where a node mostly waits on sockets, two pairs read 2.5% slower: the
    default stays there)."""
    if settings.switch_interval is not None:
        return settings.switch_interval
    if is_server(settings.graph):
        return 0.005
    return EMBEDDED_SWITCH_INTERVAL
