"""messaging throughput against raw pika on the same broker, one run (ratios last).

1. MASTER send (envelope built and validated, persistent, publisher confirm, mandatory) msgs/s
   ÷ raw pika confirmed persistent mandatory publish of a body of the same size. Target >= 0.9.
2. MODEL fanout deliveries/s to 3 consumers (our ModelConsumer: decode, validate, route,
   worker-thread handler, ack through add_callback_threadsafe) ÷ raw pika: 3 consumer
   connections acking inline in the callback, same prefetch, same confirmed publisher.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pika

from bench._servers import rabbitmq
from messaging import (
    Connector,
    Envelope,
    HandlerRegistry,
    MessageBus,
    ModelConsumer,
    Paradigm,
    Publisher,
    Topology,
    declare_topology,
    send_master,
)

SENDS = 3000
BROADCASTS = 2000
NODES = 3
PREFETCH = 4
ROUNDS = 3


def purge(url: str, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    connection.channel().queue_purge(queue)
    connection.close()


def raw_send(url: str, topology: Topology, body: bytes) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2)
    started = time.perf_counter()
    for _ in range(SENDS):
        channel.basic_publish("", topology.master_queue, body, props, mandatory=True)
    rate = SENDS / (time.perf_counter() - started)
    connection.close()
    return rate


def our_send(url: str, topology: Topology) -> float:
    with Publisher(Connector(url)) as publisher:
        send_master(publisher, topology, "bench", "warm")
        started = time.perf_counter()
        for i in range(SENDS):
            send_master(publisher, topology, "bench", "bench.job", {"n": i})
        return SENDS / (time.perf_counter() - started)


class Counter:
    def __init__(self, target: int) -> None:
        self.count = 0
        self.target = target
        self.done = threading.Event()
        self._lock = threading.Lock()

    def hit(self, *_: Any) -> None:
        with self._lock:
            self.count += 1
            if self.count >= self.target:
                self.done.set()


def raw_fanout(url: str, body: bytes) -> float:
    counter = Counter(NODES * BROADCASTS)
    exchange = "raw.model"
    ready = threading.Barrier(NODES + 1)
    stop = threading.Event()

    def consume() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.exchange_declare(exchange, "fanout", durable=True)
        queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        channel.queue_bind(queue, exchange)
        channel.basic_qos(prefetch_count=PREFETCH)

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            counter.hit()
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(queue, on_message)
        ready.wait()
        while not stop.is_set():
            connection.process_data_events(time_limit=0.1)
        connection.close()

    threads = [threading.Thread(target=consume) for _ in range(NODES)]
    for thread in threads:
        thread.start()
    ready.wait()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    started = time.perf_counter()
    for _ in range(BROADCASTS):
        channel.basic_publish(exchange, "", body, pika.BasicProperties(delivery_mode=1))
    if not counter.done.wait(120):
        raise RuntimeError(f"raw fanout delivered {counter.count}/{counter.target}")
    rate = counter.target / (time.perf_counter() - started)
    connection.close()
    stop.set()
    for thread in threads:
        thread.join()
    return rate


def our_fanout(url: str, topology: Topology) -> float:
    counter = Counter(NODES * BROADCASTS)
    consumers = []
    with Publisher(Connector(url)) as consumer_publisher:
        for i in range(NODES):
            registry = HandlerRegistry(Paradigm.MODEL)
            registry.register("UPDATE_CACHE", counter.hit)
            consumer = ModelConsumer(Connector(url), topology, registry, f"bench-{i}",
                                     consumer_publisher, workers=PREFETCH)
            consumers.append(consumer.start())
        for consumer in consumers:
            if not consumer.wait_consuming(30):
                raise RuntimeError("model consumer did not start")
        with MessageBus(Connector(url), topology, "bench") as bus:
            started = time.perf_counter()
            for _ in range(BROADCASTS):
                bus.broadcast("UPDATE_CACHE")
            if not counter.done.wait(120):
                raise RuntimeError(f"fanout delivered {counter.count}/{counter.target}")
            rate = counter.target / (time.perf_counter() - started)
        for consumer in consumers:
            consumer.close()
    return rate


def main() -> None:
    with rabbitmq() as server:
        url = server.url
        topology = Topology("bench")
        declare_topology(Connector(url), topology)
        sample = Envelope(paradigm=Paradigm.MASTER, command="bench.job", sender="bench",
                          payload={"n": SENDS}).encode()
        model = Envelope(paradigm=Paradigm.MODEL, command="UPDATE_CACHE",
                         sender="bench").encode()
        raw_send(url, topology, sample)  # warm-up
        raws, ours, raw_fans, our_fans = [], [], [], []
        for _ in range(ROUNDS):  # interleaved, best of each, so drift hits both alike
            raws.append(raw_send(url, topology, sample))
            ours.append(our_send(url, topology))
            purge(url, topology.master_queue)
            raw_fans.append(raw_fanout(url, model))
            our_fans.append(our_fanout(url, topology))
    raw, mine = max(raws), max(ours)
    raw_fan, our_fan = max(raw_fans), max(our_fans)
    print(f"raw pika confirmed publish:        {raw:8.0f} msgs/s (best of {ROUNDS})")
    print(f"MASTER send (confirmed):            {mine:8.0f} msgs/s (best of {ROUNDS})")
    print(f"raw pika fanout to {NODES} consumers:     {raw_fan:8.0f} deliveries/s")
    print(f"MODEL broadcast to {NODES} ModelConsumers: {our_fan:8.0f} deliveries/s")
    print(f"ratio MASTER send/raw pika publish: {mine / raw:.2f} (target >= 0.9)")
    print(f"ratio MODEL fanout/raw pika fanout: {our_fan / raw_fan:.2f}")


if __name__ == "__main__":
    main()
