"""The node process: :class:`~runner.node.node.Node` (one cluster member), its API
(:mod:`runner.node.api`), the JSON views its replies carry and clients read
(:mod:`runner.node.views`) and :func:`~runner.node.main.run` (signals).

Nothing is imported here, so a client that reads the views does not load the node's runtime
(Spark, the graph store, the task loop): import from the submodules.
"""
