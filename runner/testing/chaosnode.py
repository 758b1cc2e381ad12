"""A latchwork node for the chaos suite (``bench/chaos.py``): the node ``latchwork node start``
runs, plus two things the suite needs to look inside it.

* Its ZooKeeper session's id and password, written to ``SESSION_FILE`` (mode 0600) each time a
  session is established, so the suite can make the server expire that very session (a second
  client attaches to it and closes it), the way ``faults.expire_session`` does in-process.
* A MASTER command ``CHAOS_RECORD``: each run of its handler creates a persistent sequential
  node ``/chaos/runs/<message id>-`` (data: member, start; an ``end`` is added when the run
  completes), and its effect, ``/chaos/effects/<message id>``, is created in the same ZooKeeper
  transaction as the message's processed record. The suite counts completed runs per message
  (handled twice?) and effects (a confirmed message lost?).

Usage: ``python -m runner.testing.chaosnode SESSION_FILE`` with the usual ``LATCHWORK_*``
settings in the environment.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coord import SessionState
from messaging import HandlerContext, MessageBus, fenced_out
from runner.config import Settings
from runner.node.main import run
from runner.node.node import Node

RUNS = "/chaos/runs"
EFFECTS = "/chaos/effects"
log = logging.getLogger("latchwork.chaos")


class ChaosRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hold: float = Field(0.05, ge=0, le=10)


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

    def register_messages(self, bus: MessageBus) -> None:
        super().register_messages(bus)

        @bus.master.handler("CHAOS_RECORD", ChaosRecord)
        def chaos_record(ctx: HandlerContext, payload: ChaosRecord) -> None:
            client = self.session.client
            started = {"member": self.member_id, "start": time.time()}
            run_node = client.create(f"{RUNS}/{ctx.message_id}-", json.dumps(started).encode(),
                                     sequence=True, makepath=True)
            if ctx.cancelled.wait(payload.hold):
                raise RuntimeError("cancelled: leadership lost or shutting down")
            txn = ctx.transaction()  # fenced by this master's leadership
            txn.create(f"{EFFECTS}/{ctx.message_id}", self.member_id.encode())
            results: list[Any] = txn.commit()
            if fenced_out(results):  # its leadership session is gone: a later master runs it
                raise RuntimeError("refused: this node is no longer the master that started it")
            applied = not any(isinstance(r, Exception) for r in results)
            client.set(run_node, json.dumps({**started, "end": time.time(),
                                             "effect": applied}).encode())


def main(argv: list[str]) -> int:
    session_file = Path(argv[0])
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("gremlite", "gremlinpython", "apscheduler", "kazoo"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    settings = Settings.load(None)
    return run(settings, node=ChaosNode(settings, session_file))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
