"""LeaderLatch: exactly one master among the participants (Curator's LeaderLatch, in Python).

Each participant holds an ephemeral sequential node ``master/<uuid>-latch-<seq>`` whose data is
its participant (member) id; the lowest sequence is the leader. A follower watches only its
predecessor, so a leader's departure wakes one participant, not all.

Failure behaviour:

* leader killed -9: its node goes when the server expires its session; the next participant
  becomes leader within the session timeout plus a tick;
* SUSPENDED: leadership is dropped at once by default (``drop_on_suspend``), because the
  session may be expiring; if the same session reconnects, the latch checks again and regains it;
* LOST: leadership is dropped; after the next CONNECTED the participant joins again at the end;
* frozen (SIGSTOP) past the session timeout: on waking, the in-memory flag may still say leader,
  which is why a master calls :meth:`check_leadership` before acting. It asks the server whether
  the lowest latch node belongs to *this* session (its ephemeralOwner), and is False on any
  error, so a stale master fails the check (the Curator double-leader fix);
* ``close()`` deletes the node, so the next participant takes over in milliseconds.

Listeners (``on_gain``, ``on_loss``) run on the latch's own thread and may do blocking I/O.
"""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections.abc import Callable

from kazoo.exceptions import NoNodeError

from coord._znodes import create_protected, retry_policy, sort_by_seq, zk_errors
from coord.errors import LifecycleError, NotLeader
from coord.session import Session, SessionState

log = logging.getLogger(__name__)
MASTER = "/master"

LeadershipListener = Callable[[], None]


class LatchState(enum.Enum):
    LATENT = "LATENT"
    STARTED = "STARTED"
    CLOSED = "CLOSED"


def read_leader(session: Session, path: str = MASTER) -> str | None:
    """The current leader's participant id, for any client (participant or not)."""
    client = session.client
    with zk_errors(f"cannot read {path}"):
        try:
            children = sort_by_seq(client.get_children(path))
        except NoNodeError:
            return None
        for child in children:  # the lowest may vanish while we read: take the next one
            try:
                data, _ = client.get(f"{path}/{child}")
            except NoNodeError:
                continue
            return bytes(data).decode()
    return None


class LeaderLatch:
    """One participant in the election at ``path``."""

    def __init__(self, session: Session, participant_id: str, path: str = MASTER,
                 drop_on_suspend: bool = True) -> None:
        self.session = session
        self.participant_id = participant_id
        self.path = path
        self.drop_on_suspend = drop_on_suspend
        self._state = LatchState.LATENT
        self._prefix = f"{uuid.uuid4().hex}-latch-"
        self._node: str | None = None
        self._leader = threading.Event()
        self._lock = threading.RLock()
        self._on_gain: list[LeadershipListener] = []
        self._on_loss: list[LeadershipListener] = []
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> LeaderLatch:
        if self._state is not LatchState.LATENT:
            raise LifecycleError(f"latch is {self._state.value}; start() works once")
        self._state = LatchState.STARTED
        self.session.add_listener(self._on_session)
        self._worker = threading.Thread(target=self._run, daemon=True,
                                        name=f"coord-latch-{self.participant_id}")
        self._worker.start()
        self._wake.set()
        return self

    def close(self) -> None:
        """Leave the election; a successor takes over as soon as our node is deleted."""
        if self._state is not LatchState.STARTED:
            self._state = LatchState.CLOSED
            return
        self._state = LatchState.CLOSED
        self.session.remove_listener(self._on_session)
        self._wake.set()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(10)
        with self._lock:
            node, self._node = self._node, None
        if node is not None:
            def delete() -> None:
                client = self.session.client
                try:
                    client.retry(client.delete, node)
                except NoNodeError:
                    pass
            self.session.tidy(f"latch {self.participant_id}: {node} (goes with the session)",
                              delete)
        self._set_leader(False)

    def __enter__(self) -> LeaderLatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ---------------------------------------------------------------------------

    @property
    def state(self) -> LatchState:
        return self._state

    @property
    def is_leader(self) -> bool:
        """What this participant believes; call :meth:`check_leadership` before acting on it."""
        return self._leader.is_set()

    @property
    def node(self) -> str | None:
        """This participant's election node while it has one: ephemeral, so it lives exactly as
        long as the session it was created on. A ZooKeeper transaction that checks it is
        refused once that session is gone (a fence for a master's effects)."""
        return self._node

    def leader_id(self) -> str | None:
        return read_leader(self.session, self.path)

    def await_leadership(self, timeout: float | None = None) -> bool:
        return self._leader.wait(timeout)

    def check_leadership(self) -> bool:
        """Ask the server: is the lowest latch node ours, owned by our current session?

        False on any error (a master that cannot prove it leads must not act as master).
        """
        if not self._leader.is_set() or self.session.state is not SessionState.CONNECTED:
            return False
        node = self._node
        try:
            client = self.session.client
            children = sort_by_seq(client.get_children(self.path))
            if not children or node is None or f"{self.path}/{children[0]}" != node:
                return False
            stat = client.exists(node)
            return stat is not None and stat.ephemeralOwner == client.client_id[0]
        except Exception as exc:
            log.info("latch %s: leadership check failed: %r", self.participant_id, exc)
            return False

    def require_leadership(self) -> None:
        if not self.check_leadership():
            raise NotLeader(f"{self.participant_id} is not the leader of {self.path}")

    def add_listener(self, on_gain: LeadershipListener | None = None,
                     on_loss: LeadershipListener | None = None) -> None:
        if on_gain is not None:
            self._on_gain.append(on_gain)
        if on_loss is not None:
            self._on_loss.append(on_loss)

    # -- the election ----------------------------------------------------------------------

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            with self._lock:
                self._node = None  # it went with the session
            self._set_leader(False)
        elif state is SessionState.SUSPENDED:
            if self.drop_on_suspend:
                self._set_leader(False)
        elif state is SessionState.CONNECTED:
            self._wake.set()

    def _on_watch(self, event: object) -> None:
        self._wake.set()  # kazoo's thread: just wake the worker

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._state is not LatchState.STARTED:
                return
            if self.session.state is not SessionState.CONNECTED:
                continue  # the session listener wakes us on CONNECTED
            try:
                self._check()
            except Exception as exc:
                log.warning("latch %s: election step failed: %r", self.participant_id, exc)
                self._set_leader(False)
                if self.session.state is SessionState.CONNECTED:
                    threading.Timer(0.2, self._wake.set).start()

    def _check(self) -> None:
        client = self.session.client
        with self._lock:
            if self._node is None:
                path, _ = create_protected(client, self.path, self._prefix,
                                           self.participant_id.encode(), retry_policy(),
                                           makepath=True)
                self._node = path
            node = self._node
        while True:
            children = sort_by_seq(client.retry(client.get_children, self.path))
            names = [f"{self.path}/{c}" for c in children]
            if node not in names:
                # Our node is gone (session replaced): join again at the end.
                with self._lock:
                    self._node = None
                self._wake.set()
                return
            index = names.index(node)
            if index == 0:
                self._set_leader(True)
                return
            self._set_leader(False)
            if client.retry(client.exists, names[index - 1], watch=self._on_watch) is not None:
                return  # wait for the predecessor to go
            # it went between the two reads: look again

    def _set_leader(self, leader: bool) -> None:
        with self._lock:
            if leader == self._leader.is_set():
                return
            if leader:
                self._leader.set()
            else:
                self._leader.clear()
        log.info("latch %s: %s leadership of %s", self.participant_id,
                 "gained" if leader else "lost", self.path)
        for listener in list(self._on_gain if leader else self._on_loss):
            try:
                listener()
            except Exception:
                log.exception("leadership listener %r failed", listener)
