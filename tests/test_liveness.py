"""coord.liveness: a watcher learns that the process behind a beacon is gone from its
connection's close (kill -9 included), learns nothing from a frozen one, and a beacon names
the first watcher still connected as the successor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from coord.liveness import Beacon, Liveness, Watcher
from coord.testing import wait_until

BEACON_PROCESS = (
    "from coord.liveness import Beacon\n"
    "import sys, time\n"
    "b = Beacon('127.0.0.1')\n"
    "print(b.address, flush=True)\n"
    "time.sleep(120)\n")


@pytest.fixture
def beacon_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen([sys.executable, "-c", BEACON_PROCESS], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    address = proc.stdout.readline().strip()
    yield proc, address
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()
    proc.stdout.close()


def test_a_frozen_process_says_nothing_and_a_killed_one_is_gone_at_once(
        beacon_process: tuple[subprocess.Popen[str], str]) -> None:
    proc, address = beacon_process
    told = threading.Event()
    watcher = Watcher(told.set, "follower")
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # frozen: its connections stay open
        watcher.follow(address)  # the kernel still accepts the connection for it
        assert not told.wait(1.0) and not watcher.gone(address)
        proc.kill()  # kill -9 of a frozen process: the kernel closes its sockets
        assert told.wait(10), "the watcher did not learn that the process was killed"
        assert watcher.gone(address) and not watcher.gone("127.0.0.1:1")
    finally:
        watcher.close()


def test_nothing_listening_is_gone_and_a_dropped_watch_says_nothing() -> None:
    beacon = Beacon("127.0.0.1")
    address = beacon.address
    told = threading.Event()
    watcher = Watcher(told.set, "follower")
    try:
        watcher.follow(address)
        assert wait_until(lambda: beacon.successor == "follower", 5)
        other = Beacon("127.0.0.1")
        try:
            watcher.follow(other.address)  # looks elsewhere: the old connection goes quietly
            assert wait_until(lambda: beacon.successor is None, 5)
            assert not told.wait(0.3) and not watcher.gone(address)
        finally:
            other.close()
        assert told.wait(10) and watcher.gone(other.address)  # its beacon closed: gone
        told.clear()
        beacon.close()
        watcher.follow(address)  # nothing listens there any more: refused, gone
        assert told.wait(10) and watcher.gone(address)
    finally:
        watcher.close()
        beacon.close()


def test_the_successor_is_the_first_watcher_still_connected() -> None:
    beacon = Beacon("127.0.0.1")
    watchers = [Watcher(lambda: None, f"copy{i}") for i in range(3)]
    try:
        for watcher in watchers:
            watcher.follow(beacon.address)
            assert wait_until(lambda n=watcher.name: n in beacon.watchers, 5)
        assert beacon.watchers == ["copy0", "copy1", "copy2"] and beacon.successor == "copy0"
        watchers[0].close()  # the successor goes: the next oldest connection takes its place
        assert wait_until(lambda: beacon.successor == "copy1", 5)
    finally:
        for watcher in watchers:
            watcher.close()
        beacon.close()


def test_a_beacon_refuses_an_address_nobody_can_connect_to() -> None:
    for host in ("0.0.0.0", "::", ""):
        with pytest.raises(ValueError, match="not a wildcard"):
            Beacon(host)


def test_a_closed_watcher_reports_nothing_more() -> None:
    beacon = Beacon("127.0.0.1")
    told = threading.Event()
    watcher = Watcher(told.set, "w")
    watcher.follow(beacon.address)
    assert wait_until(lambda: beacon.successor == "w", 5)
    watcher.close()
    beacon.close()
    time.sleep(0.3)
    assert not told.is_set() and not watcher.gone(beacon.address)


def test_a_loopback_beacon_of_a_copy_on_another_host_is_not_followed() -> None:
    """A cluster left on the loopback default across hosts: the address points at this host's
    own loopback, where anything (or nothing) may listen; following it would take a stranger's
    close (or a refusal) for the copy's death. It is not followed: the patience decides."""
    beacon = Beacon("127.0.0.1")
    here = Liveness("127.0.0.1", "hosta:10", lambda: None)
    try:
        here.follow({"by": "hostb:20", "at": beacon.address, "next": "hosta:10"})
        time.sleep(0.3)
        assert beacon.watchers == []
        here.follow({"by": "hosta:30", "at": beacon.address, "next": "hosta:10"})  # same host
        assert wait_until(lambda: beacon.watchers == ["hosta:10"], 5)
    finally:
        here.close()
        beacon.close()
