"""The node process: :class:`~runner.node.node.Node` (one cluster member), its API
(:mod:`runner.node.api`, whose handlers answer the reply models of :mod:`runner.replies`) and
:func:`~runner.node.main.run` (signals).

Nothing is imported here, so importing a submodule loads only what it needs: a client reads
:mod:`runner.replies` and never loads the node's runtime (Spark, the graph store, the task
loop).
"""
