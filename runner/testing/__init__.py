"""Test harness latchwork ships: real servers started as local processes, and fault injectors.

Use it from a ``conftest.py`` with ``pytest_plugins = ["runner.testing.plugin"]``; the fixtures
are documented in :mod:`runner.testing.plugin`, the fault injectors in :mod:`runner.testing.faults`.
"""

from runner.testing.faults import (
    FaultInjectionFailed,
    NodeProcess,
    broker_outage,
    expire_session,
    kill_ensemble_leader,
    wait_until,
)
from runner.testing.proxy import TcpProxy

__all__ = [
    "FaultInjectionFailed",
    "NodeProcess",
    "TcpProxy",
    "broker_outage",
    "expire_session",
    "kill_ensemble_leader",
    "wait_until",
]
