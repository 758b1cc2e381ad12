"""A messaging participant as its own process, for kill -9 and failover tests.

``python -m messaging.testing.msgnode ZK_HOSTS CLUSTER SESSION_TIMEOUT AMQP_URL``

It joins membership and the leader latch and runs a :class:`~messaging.MessageBus` with test
handlers; it prints (stdout, one line each):

* ``READY <member id>`` once its consumers are up; ``LEADER`` / ``FOLLOWER`` on latch changes;
* ``RECEIVED <command> <message id> redelivered=<0|1>`` before a handler runs;
* ``OUTCOME <outcome> <message id>`` after each decision;
* MASTER ``test.effect`` (payload ``{"hold": seconds}``): commits one effect node under
  ``/effects`` atomically with the processed-id record, prints ``EFFECT <message id>``, then
  holds for ``hold`` seconds (a window to kill it in) and prints ``HANDLED <message id>``;
* MASTER ``test.count``: prints ``HANDLED <message id>``;
* MODEL ``UPDATE_CACHE``: prints ``MODEL UPDATE_CACHE <message id>``;
* API ``ping``: answers ``{"member": <member id>}``.

SIGTERM closes everything and exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from pydantic import BaseModel

from coord import LeaderLatch, Membership, Session
from messaging import (
    Connector,
    Delivery,
    DeliveryOutcome,
    Envelope,
    HandlerContext,
    MessageBus,
    Topology,
    ZkProcessedLog,
)


class Hold(BaseModel):
    hold: float = 0.0


_stdout = threading.Lock()


def say(line: str) -> None:
    with _stdout:  # handlers print from several worker threads
        print(line, flush=True)


def main(argv: list[str]) -> int:
    hosts, cluster, timeout, url = argv[0], argv[1], float(argv[2]), argv[3]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    session = Session(hosts, cluster, timeout=timeout).start()
    membership = Membership(session).start()
    member = membership.member_id
    latch = LeaderLatch(session, member)
    latch.add_listener(on_gain=lambda: say("LEADER"), on_loss=lambda: say("FOLLOWER"))
    processed = ZkProcessedLog(session)

    def received(delivery: Delivery, envelope: Envelope) -> None:
        say(f"RECEIVED {envelope.command} {envelope.id} redelivered={int(delivery.redelivered)}")

    def outcome(delivery: Delivery, envelope: Envelope | None, what: DeliveryOutcome,
                detail: str) -> None:
        say(f"OUTCOME {what.value} {envelope.id if envelope else '-'}")

    bus = MessageBus(Connector(url, heartbeat=5, name=f"msgnode {member}"), Topology(cluster),
                     member, on_receive=[received], on_outcome=[outcome])

    @bus.master.handler("test.effect", Hold)
    def effect(ctx: HandlerContext, payload: Hold) -> None:
        session.client.ensure_path("/effects")
        txn = processed.transaction(ctx.message_id, member)
        txn.create("/effects/e-", str(ctx.message_id).encode(), sequence=True)
        results = txn.commit()
        if any(isinstance(r, Exception) for r in results):
            say(f"ALREADY {ctx.message_id}")
            return
        say(f"EFFECT {ctx.message_id}")
        stop.wait(payload.hold)
        say(f"HANDLED {ctx.message_id}")

    @bus.master.handler("test.count")
    def count(ctx: HandlerContext, payload: dict[str, Any]) -> None:
        say(f"HANDLED {ctx.message_id}")

    @bus.model.handler("UPDATE_CACHE")
    def update_cache(ctx: HandlerContext, payload: dict[str, Any]) -> None:
        say(f"MODEL UPDATE_CACHE {ctx.message_id}")

    @bus.api.handler("ping")
    def ping(ctx: HandlerContext, payload: dict[str, Any]) -> dict[str, str]:
        return {"member": member}

    try:
        bus.start(latch, processed)
        for consumer in bus.consumers[1:]:  # MODEL and API consume at once; MASTER when leading
            consumer.wait_consuming(30)
        say(f"READY {member}")
        latch.start()
        while not stop.wait(0.1):  # a timed wait: a signal taken by another thread wakes it
            pass
    finally:
        latch.close()
        bus.close()
        membership.close()
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
