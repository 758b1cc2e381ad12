"""The lock-free queue and the concurrent exactly-once handler on a real ZooKeeper, with their
participants as processes that are frozen (SIGSTOP) and killed -9 while they work."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from coord import Session
from coord.exactly_once import ExactlyOnceHandler, QueueOutput
from coord.queue import LockFreeQueue
from coord.queuedata import (
    MAX_ELEMENT_BYTES,
    QueueConflict,
    QueueElementTooLarge,
    QueueIndexExpired,
)
from coord.stream_input import HandlerFailed, dead_letter
from coord.testing import NodeProcess, wait_until
from coord.testing.plugin import ZkNamespace
from coord.testing.streamcopy import running_sum

#: the example stream is loaded like any user's (it is not on the default node path)
EXAMPLE_MODULE = "runner.tasks.features.example_stream"


def session(ns: ZkNamespace) -> Session:
    return Session(ns.hosts, "s1", timeout=4.0)


def test_push_push_at_read_and_the_limits(zk_namespace: ZkNamespace) -> None:
    with session(zk_namespace) as s:
        q = LockFreeQueue(s, "q")
        assert q.end() == 0 and q.get(0) is None and list(q.read(0)) == []
        assert [q.push(f"v{i}".encode()) for i in range(3)] == [0, 1, 2]
        q.push_at(3, b"x")
        q.push_at(3, b"x")  # the same value again: success
        with pytest.raises(QueueConflict):
            q.push_at(3, b"y")
        assert q.push(b"after") == 4 and q.end() == 5
        assert list(q.read(1, limit=2)) == [(1, b"v1"), (2, b"v2")]
        with pytest.raises(QueueElementTooLarge):
            q.push(b"x" * (MAX_ELEMENT_BYTES + 1))
        # a pusher frozen after its create and before raising the hint blocks nobody
        s.client.create(f"queues/q/e/{5:010d}", b'{"v": "ZnJvemVu", "t": "frozen"}')
        assert q.end() == 6 and q.get(5) == b"frozen"
        assert q.push(b"next") == 6
        assert q.prune(older_than=0, now=time.time() + 1, below=2) == 2  # a consumer at 2
        assert q.prune(older_than=0, now=time.time() + 1, limit=3) == 3
        assert q.first() == 5
        assert q.prune(older_than=0, now=time.time() + 1) == 2
        assert q.first() == 7 and q.end() == 7
        with pytest.raises(QueueIndexExpired):
            q.get(3)


def test_push_many_is_one_step_once_per_token_and_skips_a_frozen_pushers_slot(
        zk_namespace: ZkNamespace) -> None:
    """What a client's ``stream_push`` does: the values at consecutive indexes in one
    transaction with a record of the caller's token; the same token again, from this object
    or another session's, pushes nothing more and answers the first indexes (a retry after a
    lost reply); a slot a frozen pusher created without raising the hint is stepped over; the
    values together over one element's limit are refused."""
    with session(zk_namespace) as s, session(zk_namespace) as other:
        q = LockFreeQueue(s, "many")
        assert q.push(b"first") == 0
        assert q.push_many([b"a", b"b", b"c"], "t-1") == [1, 2, 3]
        assert q.push_many([b"a", b"b", b"c"], "t-1") == [1, 2, 3]
        assert LockFreeQueue(other, "many").push_many([b"a", b"b", b"c"], "t-1") == [1, 2, 3]
        s.client.create(f"queues/many/e/{4:010d}", b'{"v": "ZnJvemVu", "t": "frozen"}')
        assert LockFreeQueue(other, "many").push_many([b"d", b"e"], "t-2") == [5, 6]
        assert q.push(b"after") == 7  # the hint moved past the batch
        assert [v for _, v in q.read(0)] == [b"first", b"a", b"b", b"c", b"frozen", b"d", b"e",
                                             b"after"]
        racing: list[list[int]] = []
        threads = [threading.Thread(target=lambda x=x: racing.append(
            LockFreeQueue(x, "many").push_many([b"r1", b"r2"], "t-3"))) for x in (s, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert racing == [[8, 9], [8, 9]] and q.end() == 10
        with pytest.raises(QueueElementTooLarge):
            q.push_many([b"x" * (MAX_ELEMENT_BYTES // 2)] * 2, "t-4")
        with pytest.raises(ValueError, match="invalid push token"):
            q.push_many([b"x"], "a/b")
        assert q.end() == 10
        # token records age out with the queue's retention
        assert q.prune(older_than=0, now=time.time() + 1) == 10
        assert s.client.get_children("queues/many/pushes") == []


def test_push_at_from_a_stale_view_and_reads_across_windows_and_gaps(
        zk_namespace: ZkNamespace) -> None:
    """push_at writes the element and raises the end hint in one transaction from the hint its
    object saw last: when another writer moved the hint, it reads it and still raises it (never
    lowers it). read() asks for slots a window at a time: it stops at the first empty slot and
    at its limit, wherever they fall in a window."""
    with session(zk_namespace) as s:
        a, b = LockFreeQueue(s, "w"), LockFreeQueue(s, "w")
        a.push_at(0, b"0")  # the queue's first element: its transaction creates the hint
        for i in range(1, 5):
            a.push_at(i, str(i).encode())
        for i in range(5, 13):  # b moves the hint; a's view of it is now stale
            b.push_at(i, str(i).encode())
        a.push_at(13, b"13")
        assert a._hint()[0] == 14 and b.push(b"14") == 14
        a.push_at(20, b"20")  # past a gap: the hint rises past it, the gap stays empty
        a.push_at(2, b"2")  # below the hint: the same value is success, the hint stays
        assert a._hint()[0] == 21 and a.get(17) is None and a.end() == 21
        b.push_at(18, b"18")  # in the gap, below the hint: written, the hint stays
        assert a.get(18) == b"18" and a._hint()[0] == 21
        s.client.delete(f"queues/w/e/{18:010d}")  # (the gap as it was, for the reads below)
        values = [(i, str(i).encode()) for i in range(15)]
        assert list(a.read(0)) == values  # windows of 2, 4, 8, 16: stops at the gap at 15
        for start, limit in ((0, 1), (0, 2), (0, 3), (1, 6), (5, 7), (3, 100)):
            assert list(a.read(start, limit)) == values[start:start + limit], (start, limit)
        assert list(a.read(15)) == [] and list(a.read(20)) == [(20, b"20")]


def test_push_at_on_a_taken_slot_reads_it_and_the_hint_in_one_round_trip(
        zk_namespace: ZkNamespace, monkeypatch: Any) -> None:
    """A copy that redoes an output write another wrote (it took over from a copy that died
    before recording it) makes one transaction, finds the slot taken, and reads the slot and
    the hint together: no plain create, no separate read. A slot below its view of the hint is
    read at once, with no transaction. A taken slot whose creator died before raising the
    hint gets the hint raised; another value there is a conflict."""
    with session(zk_namespace) as s:
        a, b = LockFreeQueue(s, "t"), LockFreeQueue(s, "t")
        for i in range(3):
            a.push_at(i, str(i).encode())
        b.push_at(0, b"0")  # b's view of the hint: 3
        a.push_at(3, b"3")  # a moves on: b's view is stale
        calls: list[str] = []
        for name in ("create", "get", "get_async", "set", "transaction", "exists"):
            real = getattr(s.client, name)
            monkeypatch.setattr(s.client, name, lambda *a_, _r=real, _n=name, **k: (
                calls.append(_n), _r(*a_, **k))[1])
        b.push_at(3, b"3")  # taken: its transaction fails on the slot
        assert calls == ["transaction", "get_async", "get_async"], calls
        assert b._seen[0] == 4
        calls.clear()
        b.push_at(1, b"1")  # below the hint b saw: only the read
        assert calls == ["get_async", "get_async"], calls
        with pytest.raises(QueueConflict):
            b.push_at(2, b"other")
        monkeypatch.undo()
        s.client.create(f"queues/t/e/{4:010d}", b'{"v": "NA==", "t": "died"}')  # "4", no hint
        assert a._hint()[0] == 4
        b.push_at(4, b"4")
        assert a._hint()[0] == 5 and a.end() == 5 and a.get(4) == b"4"


def test_push_at_raises_the_cause_when_its_transaction_fails_otherwise(
        zk_namespace: ZkNamespace, monkeypatch: Any) -> None:
    """A write transaction refused for another reason than a taken slot or a moved hint (here
    the server's ACL, on either of its two operations) raises that cause, typed, at once."""
    from kazoo.exceptions import NoAuthError, RolledBackError, RuntimeInconsistency

    from coord.errors import NotAuthorised

    with session(zk_namespace) as s:
        q = LockFreeQueue(s, "f")
        q.push_at(0, b"0")
        real = s.client.transaction
        for results in ([NoAuthError(), RuntimeInconsistency()],
                        [RolledBackError(), NoAuthError()]):
            def refused(results: list[Exception] = results) -> Any:
                tx = real()
                tx.commit = lambda: results
                return tx

            monkeypatch.setattr(s.client, "transaction", refused)
            with pytest.raises(NotAuthorised):
                q.push_at(1, b"1")
        monkeypatch.undo()
        q.push_at(1, b"1")
        assert q.get(1) == b"1" and q.end() == 2


def test_eight_pushers_frozen_and_killed_push_every_value_once(
        zk_namespace: ZkNamespace, spawn_node: Callable[..., NodeProcess]) -> None:
    rng = random.Random(18)
    pushers = [spawn_node(["-m", "coord.testing.queuepusher", zk_namespace.hosts, "s1", "load",
                           f"w{i}", "1000"], name=f"pusher{i}") for i in range(8)]
    killed = pushers[7]
    time.sleep(0.5)
    progressed_while_frozen = []

    def pushed(p: NodeProcess) -> int:
        p.drain()
        return len(p.lines)

    for round_ in range(4):
        frozen = rng.sample(pushers[:7], 2)
        for p in frozen:
            p.pause()
        others = [p for p in pushers[:7] if p not in frozen and pushed(p) and "DONE" not in p.lines]
        before = sum(pushed(p) for p in others)
        time.sleep(1.0)
        if others:  # still pushing: they must have gone on while two others were frozen
            progressed_while_frozen.append(sum(pushed(p) for p in others) - before)
        for p in frozen:
            p.resume()
        if round_ == 1:
            killed.kill()
    assert progressed_while_frozen and all(n > 0 for n in progressed_while_frozen)
    for p in pushers[:7]:
        assert p.wait_for_line("DONE", 120)
    with session(zk_namespace) as s:
        q = LockFreeQueue(s, "load")
        end = q.end()
        values = [v.decode() for _, v in q.read(0, limit=end + 1)]
    assert len(values) == end  # no hole: the created slots are a prefix
    assert len(set(values)) == len(values)  # every value once
    reported: dict[str, int] = {}
    last_index: dict[str, int] = {}
    for p in pushers:
        p.drain()
        for line in p.lines:
            if line.startswith("P "):
                _, value, index = line.split()
                reported[value] = int(index)
                worker = value.split("-")[0]
                assert int(index) > last_index.get(worker, -1)  # never goes backwards
                last_index[worker] = int(index)
    assert all(values[i] == v for v, i in reported.items())
    assert sum(1 for v in values if not v.startswith("w7-")) == 7000
    # the killed pusher's values: each once, up to one pushed but not reported before kill -9
    w7 = [v for v in values if v.startswith("w7-")]
    assert len(w7) - sum(1 for v in reported if v.startswith("w7-")) in (0, 1)


def test_concurrent_copies_produce_every_output_exactly_once(
        zk_namespace: ZkNamespace, spawn_node: Callable[..., NodeProcess]) -> None:
    """Three copy processes (each with a beacon on loopback): the copy ahead frozen, then the
    next copy ahead killed -9, and the frozen one woken. The outputs are a single run's; the
    freeze was covered by a follower's patience (a frozen process keeps its connections), the
    kill by a follower as soon as the killed copy's beacon connection closed."""
    numbers = list(range(1, 401))
    with session(zk_namespace) as s:
        source = LockFreeQueue(s, "numbers")
        for n in numbers[:100]:
            source.push(str(n).encode())
        copies = [spawn_node(["-m", "coord.testing.streamcopy", zk_namespace.hosts, "s1",
                              "sums", "numbers", "out"], name=f"copy{i}") for i in range(3)]
        sink = LockFreeQueue(s, "out")
        register = ExactlyOnceHandler(s, "sums", [source], QueueOutput(sink),
                                      running_sum).register

        def ahead() -> NodeProcess:  # the copy that wrote the state last
            by = str(register.get()[0]["by"])
            return next(c for c in copies if by.endswith(f":{c.pid}"))

        assert wait_until(lambda: sink.end() >= 50, 30)
        frozen = ahead()
        frozen.pause()  # the copy ahead frozen mid-way: a follower steps in
        for n in numbers[100:250]:
            source.push(str(n).encode())
        assert wait_until(lambda: sink.end() >= 250, 30)
        killed = ahead()
        assert killed is not frozen
        killed.kill()  # the copy ahead now killed: the last one steps in
        time.sleep(0.3)  # the kernel closes the killed copy's sockets meanwhile
        for n in numbers[250:]:
            source.push(str(n).encode())
        frozen.resume()
        assert wait_until(lambda: sink.end() == len(numbers), 60)
        time.sleep(0.5)  # a late copy could only rewrite the same values
        outputs = [int(v) for _, v in sink.read(0, limit=1000)]
        expected, total = [], 0
        for n in numbers:
            total += n
            expected.append(total)
        assert outputs == expected
        state, _ = register.get()
        assert state["state"] == sum(numbers) and state["positions"] == {"numbers": 400}
    survivors = [c for c in copies if c is not killed]
    for copy in survivors:
        assert copy.terminate(timeout=20) == 0
    stopped = [dict(kv.split("=") for kv in line.split()[1:]) for c in survivors
               for line in [*c.lines, *c.drain()] if line.startswith("STOPPED")]
    assert len(stopped) == 2 and sum(int(s["won"]) for s in stopped) > 0
    # the kill: the one follower alive then (the other copy was frozen) stepped in because
    # the killed copy's beacon closed. (The freeze's step-in by patience is not counted here:
    # the copy that made it became the copy ahead, the one killed next.)
    assert sum(int(s["gone"]) for s in stopped) >= 1


def test_a_follower_steps_in_only_when_the_state_stalls(zk_namespace: ZkNamespace) -> None:
    """The copy ahead goes on alone; a follower that sees the state move stays out, and one
    that sees it stand still with an input waiting steps in (the copy ahead died)."""
    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "in"), LockFreeQueue(s, "out")
        a, b = (ExactlyOnceHandler(s, "sums", [source], QueueOutput(sink), running_sum,
                                   initial_state=0, copy_id=c) for c in "ab")
        stop = threading.Event()
        source.push(b"1")
        assert a.step() and a.ahead and a.status()["phase"] == "PREPARING"

        def a_goes_on() -> None:
            time.sleep(0.05)
            assert a.step()  # the output, and back to HANDLING in the same CAS

        going = threading.Thread(target=a_goes_on)
        going.start()
        assert not b.stalled(stop, 0.3)  # the state moved meanwhile
        going.join()
        assert sink.get(0) == b"1" and a.status()["phase"] == "HANDLING"
        assert not b.stalled(stop, 0.1)  # nothing to do: no input waiting
        source.push(b"2")  # a is gone now: the input waits
        began = time.monotonic()
        assert b.stalled(stop, 0.2) and time.monotonic() - began >= 0.2
        assert b.step() and b.ahead and b.status()["by"] == "b"
        assert a.step() and not a.ahead  # a comes back: its CAS from a stale state loses
        assert a.lost == 1


def test_an_output_is_one_transition_and_the_last_returns_to_handling(
        zk_namespace: ZkNamespace) -> None:
    """HANDLING to PREPARING, then one CAS per output written, the last one straight back to
    HANDLING: one input with one output is two transitions, three inputs in one batch four.
    A copy that stops after an output's write but before its CAS (simulated: the write made by
    hand) leaves it to the next step, which writes the same value again and moves on."""
    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "in"), LockFreeQueue(s, "out")
        a = ExactlyOnceHandler(s, "count", [source], QueueOutput(sink), running_sum,
                               initial_state=0, batch=3)
        source.push(b"1")
        assert a.step() and a.status()["phase"] == "PREPARING"
        assert a.step() and a.status()["phase"] == "HANDLING" and a.won == 2
        assert not a.step()
        for n in (2, 3, 4):
            source.push(str(n).encode())
        assert a.step() and a.status()["pending"] != []
        sink.push_at(1, b"3")  # the first output written, its CAS not made
        assert a.step() and a.status()["phase"] == "WRITING" and a.status()["written"] == 1
        assert a.step() and a.status()["phase"] == "WRITING"
        assert a.step() and a.status()["phase"] == "HANDLING" and a.won == 6
        assert a.status()["out_next"] == 4 and a.status()["pending"] == []
        assert [v for _, v in sink.read(0)] == [b"1", b"3", b"6", b"10"]


def test_bad_inputs_become_dead_letters_once_each_and_in_order(zk_namespace: ZkNamespace
                                                               ) -> None:
    """Two copies (threads) race over inputs among which some are not integers: each bad one
    is recorded once, in input order, in ``<handler>.dead`` (its queue, index and the reason),
    the outputs are the running sums of the good ones, and the stream never stops."""
    values = [str(n).encode() for n in range(1, 121)]
    bad = {3: b"three", 40: b"", 41: b"4l", 119: b"\xff"}
    values = [bad.get(i, v) for i, v in enumerate(values)]
    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "in"), LockFreeQueue(s, "out")
        for v in values:
            source.push(v)
        stop = threading.Event()
        handlers = [ExactlyOnceHandler(s, "sums", [source], QueueOutput(sink), running_sum,
                                       initial_state=0, batch=5, copy_id=c) for c in "ab"]
        threads = [threading.Thread(target=h.run, args=(stop,)) for h in handlers]
        for t in threads:
            t.start()
        try:
            assert wait_until(lambda: handlers[0].status()["positions"] == {"in": 120}
                              and handlers[0].status()["phase"] == "HANDLING", 30)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        good = [int(v) for i, v in enumerate(values) if i not in bad]
        assert [int(v) for _, v in sink.read(0, 200)] == \
            [sum(good[:k + 1]) for k in range(len(good))]
        dead = [json.loads(v) for _, v in LockFreeQueue(s, "sums.dead").read(0, 200)]
        assert [(d["queue"], d["index"]) for d in dead] == [("in", i) for i in sorted(bad)]
        assert all("not an integer" in d["reason"] and d["handler"] == "sums" for d in dead)
        state = handlers[0].status()
        assert state["dead_next"] == 4 and state["out_next"] == 116


def test_a_handler_that_fails_otherwise_stops_the_step_naming_the_inputs(
        zk_namespace: ZkNamespace) -> None:
    """A handler that raises anything but BadInput (a bug, a dependency down) is not the
    input's fault: the step raises HandlerFailed naming the inputs and writes nothing, and a
    copy with the handler mended goes on from the same place. A dead letter written whose
    CAS was not made (the copy died) is not written twice."""
    def broken(state: Any, inputs: list[tuple[str, int, bytes]]) -> tuple[Any, list[bytes]]:
        raise ZeroDivisionError("oops")

    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "in"), LockFreeQueue(s, "out")
        for v in (b"1", b"x", b"2"):
            source.push(v)
        h = ExactlyOnceHandler(s, "f", [source], QueueOutput(sink), broken, initial_state=0)
        with pytest.raises(HandlerFailed, match=r"handler f failed on inputs in@0, in@1, in@2"):
            h.step()
        assert h.status()["positions"] == {"in": 0} and sink.end() == 0
        mended = ExactlyOnceHandler(s, "f", [source], QueueOutput(sink), running_sum,
                                    initial_state=0)
        assert mended.step() and mended.status()["phase"] == "PREPARING"
        assert mended.step()  # output 1
        LockFreeQueue(s, "f.dead").push_at(0, dead_letter("f", mended.status()["pending"][1]))
        assert mended.step() and mended.step()  # the dead letter again (the same), output 3
        assert mended.status()["phase"] == "HANDLING" and mended.status()["dead_next"] == 1
        assert [v for _, v in sink.read(0)] == [b"1", b"3"]
        assert len(list(LockFreeQueue(s, "f.dead").read(0))) == 1


def test_a_copy_that_steps_in_writes_its_first_output_in_one_transaction(
        zk_namespace: ZkNamespace, monkeypatch: Any) -> None:
    """Every state records where its writer saw the output queue's end hint (``out_view``); a
    copy that steps in takes it up, so its first output write is one transaction, not a read
    of the hint first (or a transaction that fails on a stale view, a read and another)."""
    with session(zk_namespace) as s:
        source = LockFreeQueue(s, "in")
        a, b = (ExactlyOnceHandler(s, "view", [source], QueueOutput(LockFreeQueue(s, "out")),
                                   running_sum, initial_state=0, copy_id=c) for c in "ab")
        for _ in range(5):
            source.push(b"1")
            assert a.step() and a.step()
        assert a.status()["out_view"] == [5, 4]  # the hint's node: created, then set 4 times
        source.push(b"1")
        assert b.step() and b.ahead  # a is gone: b steps in (HANDLING to PREPARING)
        calls: list[str] = []
        for name in ("get", "get_async", "transaction", "create", "set"):
            real = getattr(s.client, name)
            monkeypatch.setattr(s.client, name, lambda *a_, _r=real, _n=name, **k: (
                calls.append(_n), _r(*a_, **k))[1])
        assert b.step()
        assert calls == ["transaction", "set"], calls  # the output, then the CAS: no read
        monkeypatch.undo()
        assert b.status()["phase"] == "HANDLING"
        assert LockFreeQueue(s, "out").get(5) == b"6" and b.status()["out_view"] == [6, 5]


def test_a_follower_learns_the_pace_of_the_copy_ahead(zk_namespace: ZkNamespace) -> None:
    """A follower that has watched the copy ahead move the state quickly, input after input,
    steps in after a few of those step times when it stops, not after ``follower_idle``.
    While the copy ahead works it mostly does not step in; its patience is 1.5 learned step
    times, so a scheduling hiccup of that size on a loaded box may make it look once too
    early (harmless: a copy that steps in wrongly loses its CAS), at most 3 of 30 times."""
    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "in"), LockFreeQueue(s, "out")
        a, b = (ExactlyOnceHandler(s, "pace", [source], QueueOutput(sink), running_sum,
                                   initial_state=0, copy_id=c) for c in "ab")
        stop = threading.Event()

        def a_steps(n: int) -> None:
            time.sleep(0.03)  # b looks first (after its settle): the state stands, the input waits
            while a.step():  # a works the input through, then finds none
                pass

        early = 0
        for n in range(30):  # b watches: each input, a moves the state within milliseconds
            source.push(b"1")
            worker = threading.Thread(target=a_steps, args=(n,))
            worker.start()
            early += b.stalled(stop, 2.0)
            worker.join()
        assert early <= 3, f"the follower looked too early {early} times of 30"
        assert sink.end() == 30
        source.push(b"1")  # a is gone now
        began = time.monotonic()
        assert b.stalled(stop, 2.0)
        waited = time.monotonic() - began
        assert waited < 0.5, waited  # a few learned step times, far below follower_idle
        assert b.step() and b.ahead


def test_watch_tells_when_an_element_arrives(zk_namespace: ZkNamespace) -> None:
    with session(zk_namespace) as s:
        q = LockFreeQueue(s, "w")
        arrived = threading.Event()
        assert not q.watch(0, lambda _event: arrived.set())
        assert not arrived.is_set()
        q.push(b"x")
        assert arrived.wait(10)
        assert q.watch(0, lambda _event: None)


def test_a_non_deterministic_handler_counts_only_the_winning_result(
        zk_namespace: ZkNamespace) -> None:
    """Two copies in threads, each adding a random tag to its outputs: every input's output
    appears once, from whichever copy won its step."""
    def tagged(state: Any, inputs: list[tuple[str, int, bytes]]) -> tuple[Any, list[bytes]]:
        tag = random.random()
        return int(state or 0) + len(inputs), [f"{v.decode()}:{tag}".encode()
                                               for _, _, v in inputs]

    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "in"), LockFreeQueue(s, "out")
        for n in range(60):
            source.push(str(n).encode())
        stop = threading.Event()
        handlers = [ExactlyOnceHandler(s, "tagger", [source], QueueOutput(sink), tagged,
                                       initial_state=0, batch=4) for _ in range(2)]
        threads = [threading.Thread(target=h.run, args=(stop,)) for h in handlers]
        for t in threads:
            t.start()
        try:
            assert wait_until(lambda: sink.end() == 60, 30)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        outputs = [v.decode().split(":")[0] for _, v in sink.read(0, limit=100)]
        assert outputs == [str(n) for n in range(60)]
        assert handlers[0].register.get()[0]["state"] == 60


def test_a_stream_runs_as_copies_on_distinct_nodes_through_kill_9(
        cluster: Any, zk_client: Any) -> None:
    """`stream start --redundancy 2` on 3 nodes: two copies on two distinct nodes; kill -9 of a
    node running one: the third node takes its copy over; the averages and the graph counter
    are exactly the sequential result. Two malformed readings (one before the kill, one after)
    become dead letters, once each, and the stream goes on without them."""
    import json as json_

    from runner.tasks.features.example_stream import EXAMPLE, crossings, moving_average

    members = [cluster.start_node("--tasks", EXAMPLE_MODULE) for _ in range(3)]
    started = cluster.cli("stream", "start", EXAMPLE, "--redundancy", "2", "--json")
    assert started.exit_code == 0, started.output
    assert cluster.cli("stream", "start", EXAMPLE, "--json").exit_code == 0  # idempotent
    assert len(cluster.store.tasks.all("stream.copy")) == 2

    def running() -> dict[str, int]:
        status = json_.loads(cluster.cli("stream", "status", EXAMPLE, "--json").output)
        copies: dict[str, int] = status["copies"]
        return copies

    assert wait_until(lambda: len(running()) == 2, 60, 0.5)
    readings = [json_.dumps({"t": i * 5.0, "v": (i * 7) % 13}).encode() for i in range(240)]
    bad = {50: b"not json", 170: b'{"t": "soon", "v": 1}'}
    readings = [bad.get(i, raw) for i, raw in enumerate(readings)]
    with Session(cluster.env["LATCHWORK_ZK_HOSTS"], "r1", timeout=4.0) as s:
        source, sink = LockFreeQueue(s, "readings"), LockFreeQueue(s, "averages")
        for raw in readings[:120]:
            source.push(raw)
        assert wait_until(lambda: sink.end() >= 60, 60, 0.2)
        victim = next(iter(running()))
        cluster.nodes[victim].kill()
        for raw in readings[120:]:
            source.push(raw)
        survivors = [m for m in members if m != victim]
        assert wait_until(lambda: set(running()) == set(survivors), 60, 0.5)
        assert wait_until(lambda: sink.end() == len(readings) - len(bad), 60, 0.2)
        outputs = [v for _, v in sink.read(0, limit=1000)]
        dead = [json_.loads(v) for _, v in LockFreeQueue(s, f"{EXAMPLE}.dead").read(0)]
    _, expected = moving_average()({"window": [], "over": False},
                                   [("readings", i, raw) for i, raw in enumerate(readings)
                                    if i not in bad])
    assert outputs == expected
    assert [(d["queue"], d["index"]) for d in dead] == [("readings", 50), ("readings", 170)]
    assert all("not a reading" in d["reason"] and d["handler"] == EXAMPLE for d in dead)
    assert "dead letters 2" in cluster.cli("stream", "status", EXAMPLE).output
    crossed = sum(1 for v in expected if json_.loads(v).get("crossed"))
    assert crossed > 0 and crossings(cluster.store) == crossed
    listing = cluster.cli("task", "list", "--unfinished")
    assert "copy 0:" in listing.output or "copy 1:" in listing.output
    assert "out 238" in listing.output


def test_the_master_prunes_stream_queues_but_never_an_unread_input(
        zk_namespace: ZkNamespace) -> None:
    """StreamRetention (the master's pass): two streams read one queue, one of them further
    than the other; elements past the retention go from the outputs and the dead letters, and
    from the shared input only below the slower stream's position. At most ``batch`` a queue a
    pass; the streams read on from where they were."""
    from runner.tasks.features.streams import StreamDefinition, StreamRegistry, StreamRetention

    registry = StreamRegistry()
    for name, out in (("fast", "fast-out"), ("slow", "slow-out")):
        registry.define(StreamDefinition(name, ("shared",), running_sum, output=out,
                                         initial_state=0, batch=4))
    with session(zk_namespace) as s:
        source = LockFreeQueue(s, "shared")
        for v in [b"1", b"2", b"x", *[b"1"] * 9]:
            source.push(v)
        fast, slow = (ExactlyOnceHandler(s, n, [source], QueueOutput(LockFreeQueue(s, f"{n}-out")),
                                         running_sum, initial_state=0, batch=4)
                      for n in ("fast", "slow"))
        while fast.step():
            pass
        for _ in range(5):  # one batch of 4 inputs: PREPARING, then 3 outputs and 1 dead letter
            assert slow.step()
        assert slow.status()["positions"] == {"shared": 4}
        assert slow.status()["phase"] == "HANDLING"
        time.sleep(0.05)
        retention = StreamRetention(s, registry, "m1", retention=0.01, interval=3600, batch=100)
        assert retention.tick() > 0
        assert retention.tick() == 0  # not before the interval
        assert source.first() == 4  # the slow stream had not read past 4
        assert LockFreeQueue(s, "fast-out").first() == 11
        assert LockFreeQueue(s, "slow-out").first() == 3
        assert LockFreeQueue(s, "fast.dead").first() == 1
        assert LockFreeQueue(s, "slow.dead").first() == 1
        assert slow.step() and slow.status()["positions"] == {"shared": 8}  # reads on
        capped = StreamRetention(s, registry, "m1", retention=0.01, batch=2)
        assert capped.tick() == 2  # the shared input, 4 more readable: 2 a pass
        assert source.first() == 6


def test_a_node_master_prunes_the_example_streams_queues(cluster: Any) -> None:
    """The setting end to end: a node with ``stream_retention`` 1 s prunes the example's
    consumed readings and its averages once they are older, and the stream goes on."""
    from runner.tasks.features.example_stream import EXAMPLE

    cluster.env["LATCHWORK_STREAM_RETENTION"] = "1"
    cluster.env["LATCHWORK_STREAM_RETENTION_INTERVAL"] = "0.5"
    cluster.start_node("--tasks", EXAMPLE_MODULE)
    assert cluster.cli("stream", "start", EXAMPLE, "--redundancy", "1").exit_code == 0
    with Session(cluster.env["LATCHWORK_ZK_HOSTS"], "r1", timeout=4.0) as s:
        source, sink = LockFreeQueue(s, "readings"), LockFreeQueue(s, "averages")
        for i in range(5):
            source.push(json.dumps({"t": i, "v": i}).encode())
        assert wait_until(lambda: sink.end() == 5, 60, 0.2)
        assert wait_until(lambda: source.first() == 5 and sink.first() == 5, 30, 0.2)
        source.push(json.dumps({"t": 5, "v": 5}).encode())
        assert wait_until(lambda: sink.end() == 6, 30, 0.2)
        assert json.loads(sink.get(5) or b"{}")["avg"] == 2.5


def test_an_output_write_whose_reply_is_lost_is_written_once(zk_namespace: ZkNamespace,
                                                             monkeypatch: Any) -> None:
    """The output's create reaches the server but its reply is lost (ConnectionLoss): the retry
    finds the same value at the index (success), so every output is there once. The loss hits
    the transaction that creates an output and raises the end hint, the queue's first element
    (whose transaction creates the hint's node) included; a plain create of an output would be
    lost too (none is made)."""
    from kazoo.exceptions import ConnectionLoss

    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "in"), LockFreeQueue(s, "out")
        for n in range(1, 21):
            source.push(str(n).encode())
        real_create, real_transaction = s.client.create, s.client.transaction
        lost: list[str] = []

        def create_then_lose_reply(path: str, *args: Any, **kwargs: Any) -> Any:
            result = real_create(path, *args, **kwargs)
            if "/out/e/" in path and len(lost) < 5:
                lost.append(f"create {path}")
                raise ConnectionLoss("reply lost")
            return result

        def transaction_then_lose_reply() -> Any:
            tx = real_transaction()
            real_commit = tx.commit

            def commit() -> Any:
                results = real_commit()
                paths = [str(getattr(op, "path", "")) for op in tx.operations]
                if any("/out/e/" in p for p in paths) and len(lost) < 5 \
                        and not any(isinstance(r, Exception) for r in results):
                    lost.append(f"transaction {paths}")
                    raise ConnectionLoss("reply lost")
                return results

            tx.commit = commit
            return tx

        monkeypatch.setattr(s.client, "create", create_then_lose_reply)
        monkeypatch.setattr(s.client, "transaction", transaction_then_lose_reply)
        handler = ExactlyOnceHandler(s, "sums", [source], QueueOutput(sink), running_sum,
                                     initial_state=0, batch=6)
        while handler.step():
            pass
        assert len(lost) == 5
        assert all(way.startswith("transaction") for way in lost), lost
        assert "/out/e/0000000000" in lost[0] and "/out/end" in lost[0], lost
        outputs = [int(v) for _, v in sink.read(0, limit=100)]
        assert outputs == [sum(range(1, n + 1)) for n in range(1, 21)]


def test_three_moving_average_copies_killed_and_restarted_equal_one_sequential_run(
        zk_namespace: ZkNamespace, spawn_node: Callable[..., NodeProcess],
        tmp_path: Any) -> None:
    import json as json_

    from runner.store import open_store
    from runner.tasks.features.example_stream import crossings, moving_average

    rng = random.Random(5000)
    graph = str(tmp_path / "graph.db")
    open_store(graph).close()
    # a reading a second, with bursts of ten a second that take the 60 s window past its
    # bound of 10 (a crossing, counted in the graph) and back
    def when(i: int) -> float:
        return float(i) if i % 700 >= 80 else (i - i % 700) + (i % 700) / 10

    readings = [json_.dumps({"t": when(i), "v": rng.randint(0, 100)}).encode()
                for i in range(5000)]
    argv = ["-m", "runner.testing.streamnode", zk_namespace.hosts, "s1", graph]
    copies = [spawn_node(argv, name=f"avg{i}") for i in range(3)]
    with session(zk_namespace) as s:
        source, sink = LockFreeQueue(s, "readings"), LockFreeQueue(s, "averages")
        pushing = threading.Thread(target=lambda: [source.push(r) for r in readings])
        pushing.start()
        restarts = 0
        while sink.end() < len(readings) and restarts < 12:
            time.sleep(rng.uniform(0.5, 1.5))
            k = rng.randrange(3)
            copies[k].kill()
            copies[k] = spawn_node(argv, name=f"avg{k}-{restarts}")
            restarts += 1
        pushing.join(120)
        assert wait_until(lambda: sink.end() == len(readings), 120, 0.2)
        outputs = [v for _, v in sink.read(0, limit=len(readings) + 1)]
    _, expected = moving_average()({"window": [], "over": False},
                                   [("readings", i, r) for i, r in enumerate(readings)])
    assert outputs == expected  # same values, same order, no gap, no duplicate
    crossed = sum(1 for v in expected if json_.loads(v).get("crossed"))
    with open_store(graph) as store:
        assert crossed > 1 and crossings(store) == crossed
    assert restarts >= 3


def test_a_node_that_runs_a_copy_declines_a_second_one(zk_namespace: ZkNamespace,
                                                       tmp_path: Any) -> None:
    from runner.store import open_store
    from runner.tasks import CancelToken, Services, TaskContext, TaskDeclined
    from runner.tasks.features.example_stream import EXAMPLE, example_streams
    from runner.tasks.features.streams import CopyPayload, run_copy

    with session(zk_namespace) as s, open_store(str(tmp_path / "g.db")) as store:
        s.client.create(f"streams/{EXAMPLE}/copies/m1", b'{"copy": 0, "task": "t0"}',
                        ephemeral=True, makepath=True)
        task = store.tasks.create("stream.copy", {"stream": EXAMPLE, "copy_no": 1})
        attempt = store.attempts.start(task.id, "m1")
        ctx = TaskContext(task=task, attempt=attempt, member_id="m1", fence_token=0,
                          cancel=CancelToken(), store=store,
                          services=Services(s, example_streams()))
        with pytest.raises(TaskDeclined, match="already runs a copy"):
            run_copy(ctx, CopyPayload(stream=EXAMPLE, copy_no=1))
        assert s.client.get(f"streams/{EXAMPLE}/copies/m1")[0] == b'{"copy": 0, "task": "t0"}'
