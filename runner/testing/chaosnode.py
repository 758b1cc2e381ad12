"""A latchwork node for the chaos suite (``bench/chaos.py``): the node ``latchwork node start``
runs, plus two things the suite needs to look inside it.

* Its ZooKeeper session's id and password, written to ``SESSION_FILE`` (mode 0600) each time a
  session is established, so the suite can make the server expire that very session (a second
  client attaches to it and closes it), the way ``faults.expire_session`` does in-process.
* The user-declared MASTER command ``chaos.record`` (:mod:`runner.testing.chaoscommands`,
  loaded through the ``tasks`` setting as a user's module is), whose runs and effects the
  suite counts.

Usage: ``python -m runner.testing.chaosnode SESSION_FILE`` with the usual ``LATCHWORK_*``
settings in the environment.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from coord import SessionState
from runner.config import Settings
from runner.node.main import run
from runner.node.node import Node

#: the chaos suite's own command, declared as a user's would be
COMMANDS = "runner.testing.chaoscommands"
log = logging.getLogger("latchwork.chaos")


class ChaosNode(Node):
    def __init__(self, settings: Settings, session_file: Path) -> None:
        super().__init__(settings)
        self.session_file = session_file

    def _start(self) -> None:
        self.session.add_listener(self._on_session)
        super()._start()
        self._write_session()

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            self._write_session()

    def _write_session(self) -> None:
        session_id, password = self.session.client.client_id
        tmp = self.session_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"{session_id:x} {bytes(password).hex()}\n")
        tmp.replace(self.session_file)


def main(argv: list[str]) -> int:
    session_file = Path(argv[0])
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("gremlite", "gremlinpython", "apscheduler", "kazoo"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    settings = Settings.load(None)
    if COMMANDS not in settings.tasks:
        settings = settings.model_copy(update={"tasks": [*settings.tasks, COMMANDS]})
    return run(settings, node=ChaosNode(settings, session_file))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
