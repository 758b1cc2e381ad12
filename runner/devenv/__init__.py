"""Local servers for ``latchwork dev``: it composes :mod:`coord.testing` (ZooKeeper) and
:mod:`messaging.testing` (RabbitMQ) into one environment with its state on disk, and the smoke
check ``latchwork dev check`` runs against it."""

from runner.devenv.environment import DevEnvironment, DevPlan, ServiceStatus

__all__ = ["DevEnvironment", "DevPlan", "ServiceStatus"]
