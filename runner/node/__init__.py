"""The node process: :class:`Node` (one cluster member), its API (:mod:`runner.node.api`), the
JSON views its replies carry (:mod:`runner.node.views`) and :func:`run` (signals,
:mod:`runner.node.main`)."""

from runner.node.main import run
from runner.node.node import Node, default_registry

__all__ = ["Node", "default_registry", "run"]
