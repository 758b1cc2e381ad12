"""The store as gremlinpython traversals, in the subset gremlite and Gremlin Server share.

Every query here sticks to the portable subset listed in docs/graph.md: no mergeV, hasNot,
dedup, range, group; no numeric ``P.gt/lt/between`` (gremlite returns nothing for them); edges
added only between ``as_`` labels; property writes with explicit ``Cardinality.single``. Lookups
are property equality or ``P.within`` on a property that only one kind of vertex has, which both
backends can answer from an index. Bulk writes chain many steps into one traversal (one round
trip per batch, not per row).

Vertex kinds and their properties (prefixes keep keys unique to a kind). What is looked up
is a property of its own; what only changes together is one JSON property, because every
property written costs the embedded graph a few SQL statements inside the single writer slot
(docs/graph.md, "Store format"):

* ``task``: task_id, task_type, task_payload (JSON), task_priority, task_created (time),
  task_unique, task_version (the guard of every change), task_fence (big: the fencing token of
  the owner allowed to write the task; every owner write is guarded by it inside its own
  traversal), task_queue ("open" while active and unfinished, else "closed": the
  unfinished-task scan reads only the "open" index entries, so its cost does not grow with
  finished tasks), task_state (JSON: status, active, finished, owner, updated (time), attempts
  (how many were started));
* ``attempt`` (edge ``has_attempt`` from its task, which is how a task's attempts are found):
  attempt_id, attempt_status, attempt_start (JSON: task, seq, executor, started, fence),
  attempt_end (JSON, once ended: ended, duration_ms, error, stack);
* ``ontology``: ontology_iri, ontology_version, ontology_checksum, ontology_loaded;
* ``class`` (edges ``subClassOf`` to its parents): class_iri, class_label, class_defined_by;
* ``avatar``: avatar_id, avatar_class, avatar_props (JSON), and ``aspect.<name>`` (JSON) per
  aspect.
"""

