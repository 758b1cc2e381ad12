"""A process that holds one ephemeral znode, for fault-injection tests.

``python -m coord.testing.ephemeral HOSTS PATH SESSION_TIMEOUT`` connects, creates PATH as an
ephemeral node, prints ``READY <session id>`` and then every connection state change as
``STATE <state>``, until it is killed or gets SIGTERM (then it closes its session and exits 0).
"""

from __future__ import annotations

import signal
import sys
import threading

from kazoo.client import KazooClient


def main(argv: list[str]) -> int:
    hosts, path, session_timeout = argv[0], argv[1], float(argv[2])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = KazooClient(hosts=hosts, timeout=session_timeout)
    client.add_listener(lambda state: print(f"STATE {state}", flush=True))
    client.start(timeout=30)
    client.create(path, b"ephemeral", ephemeral=True, makepath=True)
    print(f"READY 0x{client.client_id[0]:x}", flush=True)
    while not stop.wait(0.1):  # a timed wait: a signal taken by another thread wakes it
        pass
    client.stop()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
