"""Names and declarations of a cluster's exchanges and queues.

Everything of cluster ``c`` lives under the prefix ``latchwork.c``:

=================================  ==========================================================
``latchwork.c.master``             durable queue, consumed by the master only (single active
                                   consumer as a second guard; ``x-consumer-timeout`` set)
``latchwork.c.master.retry.<ms>``  one durable delay queue per retry delay: messages wait
                                   ``<ms>`` (``x-message-ttl``) and dead-letter back to master
``latchwork.c.dead``               durable dead-letter queue; headers ``x-latchwork-reason``
                                   and ``x-latchwork-detail`` say why
``latchwork.c.model``              durable fanout exchange
``latchwork.c.model.<member>``     each node's exclusive, auto-delete queue bound to it
``latchwork.c.api``                durable queue of API requests, consumed by every node
=================================  ==========================================================

A fixed TTL per delay queue (not a per-message TTL) keeps a long delay from blocking a short one
behind it: RabbitMQ only expires messages at a queue's head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_CONSUMER_TIMEOUT_MS = 30 * 60 * 1000


@dataclass(frozen=True)
class RedeliveryPolicy:
    """How often and how late a transiently failed MASTER message is tried again."""

    max_retries: int = 3
    first_delay: float = 1.0
    factor: float = 4.0
    max_delay: float = 300.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.first_delay <= 0 or self.factor < 1:
            raise ValueError(f"invalid retry policy {self}")

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based)."""
        return min(self.max_delay, self.first_delay * self.factor ** (retry - 1))


@dataclass(frozen=True)
class Topology:
    cluster: str
    retry: RedeliveryPolicy = field(default_factory=RedeliveryPolicy)
    consumer_timeout_ms: int = DEFAULT_CONSUMER_TIMEOUT_MS

    @property
    def prefix(self) -> str:
        return f"latchwork.{self.cluster}"

    @property
    def master_queue(self) -> str:
        return f"{self.prefix}.master"

    @property
    def dead_queue(self) -> str:
        return f"{self.prefix}.dead"

    @property
    def model_exchange(self) -> str:
        return f"{self.prefix}.model"

    @property
    def api_queue(self) -> str:
        return f"{self.prefix}.api"

    def model_queue(self, member_id: str) -> str:
        return f"{self.prefix}.model.{member_id}"

    def retry_queue(self, retry: int) -> str:
        return f"{self.master_queue}.retry.{round(self.retry.delay(retry) * 1000)}"

    def _work_queue_arguments(self, single_active: bool) -> dict[str, Any]:
        # x-consumer-timeout is honoured from RabbitMQ 3.12; older brokers store it and use
        # their node-wide consumer_timeout, which the dev/test servers set to the same value.
        args: dict[str, Any] = {"x-consumer-timeout": self.consumer_timeout_ms}
        if single_active:
            args["x-single-active-consumer"] = True
        return args

    def declare(self, channel: Any) -> None:
        """Declare every shared exchange and queue (idempotent; same arguments every time)."""
        channel.queue_declare(self.master_queue, durable=True,
                              arguments=self._work_queue_arguments(single_active=True))
        channel.queue_declare(self.api_queue, durable=True,
                              arguments=self._work_queue_arguments(single_active=False))
        channel.queue_declare(self.dead_queue, durable=True)
        channel.exchange_declare(self.model_exchange, exchange_type="fanout", durable=True)
        for retry in range(1, self.retry.max_retries + 1):
            channel.queue_declare(self.retry_queue(retry), durable=True, arguments={
                "x-message-ttl": round(self.retry.delay(retry) * 1000),
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.master_queue,
            })
