// latchwork's schema for JanusGraph (docker-compose.yml runs it at start): the indexes the
// store's lookups use, a unique index on task_unique, and LOCK consistency on the keys the
// guarded writes check (versions and fences), so that of two transactions that read the same
// version and write the next one, the second commit fails (PermanentLockingException), which
// latchwork reads as "someone wrote first" and retries (docs/graph.md). Idempotent.
import org.janusgraph.core.schema.ConsistencyModifier
import org.janusgraph.core.schema.SchemaAction

graph = JanusGraphFactory.open('/etc/opt/janusgraph/janusgraph.properties')
mgmt = graph.openManagement()
def key = { name, type = String ->
    mgmt.getPropertyKey(name) ?: mgmt.makePropertyKey(name).dataType(type).make()
}
def index = { name, prop, unique ->
    if (mgmt.getGraphIndex(name) == null) {
        def b = mgmt.buildIndex(name, Vertex.class).addKey(key(prop))
        if (unique) { b = b.unique() }
        def built = b.buildCompositeIndex()
        if (unique) { mgmt.setConsistency(built, ConsistencyModifier.LOCK) }
    }
}
// the properties the store looks vertices up by (has(key, value)): a composite index each
['task_id', 'task_type', 'task_queue', 'task_okey_open', 'task_stopped', 'task_end_day',
 'attempt_id', 'attempt_status', 'attempt_end_day', 'avatar_id', 'avatar_class',
 'ontology_iri', 'class_iri', 'class_defined_by', 'schedule_name', 'incident_key',
 'incident_open', 'incident_task', 'incident_pending', 'event_key', 'event_kind',
 'tomb_task', 'task_list', 'task_owner', 'task_h', 'task_s', 'task_okey', 'task_lane',
 // workflows (store format 6): members by workflow, its roots and on_failure step while they
 // wait, and the master's round (open, unactivated, due)
 'wf_open', 'wf_roots', 'wf_due', 'task_wf', 'task_wfwait', 'task_wfonfail'].each {
    index("by_${it}", it, false)
}
index('by_task_unique', 'task_unique', true)
index('by_wf_id', 'wf_id', true)
// a task's shard (store format 4): a filter after the task_queue lookup, not an index
key('task_shard')
// the store format (runner/store/migrations): one vertex, found by its key
key('format_version', Integer)
index('by_format_key', 'format_key', true)
index('by_resource_name', 'resource_name', true)
// the keys the guarded writes check: versions are integers, the fence a 20-digit string, the
// resource holder an attempt id and its token a 20-digit string
key('task_version', Integer)
key('schedule_version', Integer)
key('task_fence')
key('resource_holder')
key('resource_token')
['task_version', 'task_fence', 'attempt_status', 'schedule_version', 'resource_holder',
 'resource_token'].each {
    mgmt.setConsistency(mgmt.getPropertyKey(it), ConsistencyModifier.LOCK)
}
mgmt.commit()
graph.close()
