"""Incidents as ``incident`` vertices: one per (task, kind, occurrence), so raising it again
(another master after a failover) finds the same record. ``incident_open`` indexes the open
ones; ``incident_delivered`` lists the events hooks have heard (``raised``, ``resolved``)."""

from __future__ import annotations

from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.steps import get_or_add, set_props
from runner.store.gremlin.writes import matched_write
from runner.store.model import Incident
from runner.store.traversal import Row, Traversal


def _from_row(row: Row) -> Incident:
    doc = codec.decode_json(row["incident_doc"])
    return Incident(key=row["incident_key"], task_id=doc["task"], kind=doc["kind"],
                    detail=doc["detail"], raised_at=codec.decode_time(doc["raised"]),
                    resolved_at=codec.decode_time(doc["resolved"]) if doc["resolved"] else None,
                    delivered=frozenset(codec.decode_json(row["incident_delivered"])))


class GremlinIncidentStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def raise_(self, task_id: str, kind: str, occurrence: str, detail: str
               ) -> tuple[Incident, bool]:
        """The incident of (task, kind, occurrence), and whether this call created it."""
        key = f"{task_id}:{kind}:{occurrence}"
        raised = codec.now()
        props = {"incident_key": key, "incident_open": "open", "incident_delivered": "[]",
                 "incident_pending": "1", "incident_task": task_id,
                 "incident_doc": codec.encode_json({
                     "task": task_id, "kind": kind, "detail": detail,
                     "raised": codec.encode_time(raised), "resolved": ""})}
        row = self.graph.write(lambda g: get_or_add(g, "incident_key", key, "incident", props)
                               .element_map().next())
        incident = _from_row(row)
        return incident, incident.raised_at == codec.decode_time(codec.encode_time(raised))

    def open(self) -> list[Incident]:
        rows = self.graph.read(
            lambda g: g.V().has("incident_open", "open").element_map().to_list())
        return sorted((_from_row(r) for r in rows), key=lambda i: i.raised_at)

    def undelivered(self) -> list[Incident]:
        """Open incidents hooks have not heard of, and resolved ones whose resolution they have
        not heard (``incident_pending`` indexes both)."""
        rows = self.graph.read(
            lambda g: g.V().has("incident_pending", "1").element_map().to_list())
        return sorted((_from_row(r) for r in rows), key=lambda i: i.raised_at)

    def for_task(self, task_id: str) -> list[Incident]:
        rows = self.graph.read(
            lambda g: g.V().has("incident_task", task_id).element_map().to_list())
        return sorted(map(_from_row, rows), key=lambda i: i.raised_at)

    def resolve(self, incident: Incident) -> bool:
        """Close an open incident; False if someone else did first."""
        doc = {"task": incident.task_id, "kind": incident.kind, "detail": incident.detail,
               "raised": codec.encode_time(incident.raised_at),
               "resolved": codec.encode_time(codec.now())}

        def guarded(g: Traversal) -> Traversal:
            return set_props(g.V().has("incident_key", incident.key)
                             .has("incident_open", "open"),
                             {"incident_open": "", "incident_doc": codec.encode_json(doc),
                              "incident_pending": "1"})
        return matched_write(self.graph, guarded)

    def delivered(self, incident: Incident, event: str) -> None:
        """Record that the hooks heard ``event`` of ``incident`` (as it was read: if it was
        resolved meanwhile, it stays pending for its resolution)."""
        heard = sorted(incident.delivered | {event})
        done = "resolved" in heard or (incident.open and "raised" in heard)

        def guarded(g: Traversal) -> Traversal:
            return set_props(g.V().has("incident_key", incident.key)
                             .has("incident_open", "open" if incident.open else ""),
                             {"incident_delivered": codec.encode_json(heard),
                              "incident_pending": "" if done else "1"})
        matched_write(self.graph, guarded)
