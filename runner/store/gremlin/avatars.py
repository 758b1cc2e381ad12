"""Avatars and their aspects (``aspect.<name>`` JSON properties): bulk upserts and aspect
applies keyed by avatar id, so a rerun batch writes the same values again; fenced by the
task's token. An invalid aspect name raises :class:`~runner.errors.InvalidValue`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality, P

from runner.errors import (
    InvalidValue,
    TaskNotFound,
)
from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.guards import under_fence
from runner.store.gremlin.steps import (
    ASPECT_NAME,
    BATCH,
    add_vertex,
    chunks,
    set_props,
)
from runner.store.model import (
    Avatar,
    Fence,
)
from runner.store.traversal import Row, Traversal

# -- avatars ----------------------------------------------------------------------------------

#: vertex ids one embedded export read looks at, at most (each avatar also uses an id per
#: property, so a window holds fewer avatars than ids)
EXPORT_WINDOW = 5000

def aspect_key(aspect: str) -> str:
    if not ASPECT_NAME.match(aspect):
        raise InvalidValue(f"invalid aspect name {aspect!r} (lower case, digits, _ and -)")
    return f"aspect.{aspect}"


def avatar_from_row(row: Row) -> Avatar:
    aspects = {k[len("aspect."):]: codec.decode_json(v) for k, v in row.items()
               if isinstance(k, str) and k.startswith("aspect.")}
    return Avatar(id=row["avatar_id"], class_iri=row["avatar_class"],
                  properties=codec.decode_json(row["avatar_props"]), aspects=aspects)


class GremlinAvatarStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    @staticmethod
    def _ids(g: Traversal, avatar_ids: Sequence[str]) -> dict[str, Any]:
        rows = (g.V().has("avatar_id", P.within(list(avatar_ids)))
                .project("a", "id").by("avatar_id").by(__.id_()).to_list())
        return {r["a"]: r["id"] for r in rows}

    def upsert(self, avatars: Sequence[Avatar], fence: Fence | None = None) -> int:
        """Create or update avatars (class and properties; aspects are left alone). With
        ``fence``, each batch is refused (StaleFencingToken) once the token is stale."""
        by_id = {a.id: a for a in avatars}
        for chunk in chunks(list(by_id), BATCH):
            def run(g: Traversal, chunk: Sequence[str] = chunk, fenced: bool = False) -> None:
                if fence is not None and not fenced:  # each traversal guarded by the fence
                    return under_fence(g, fence, lambda f: run(f, chunk, fenced=True))
                ids = self._ids(g, chunk)
                t = g
                for avatar_id in chunk:
                    a = by_id[avatar_id]
                    props = {"avatar_class": a.class_iri,
                             "avatar_props": codec.encode_json(a.properties)}
                    if avatar_id in ids:
                        t = set_props(t.V(ids[avatar_id]), props)
                    else:
                        t = add_vertex(t, "avatar", {"avatar_id": avatar_id, **props})
                t.iterate()
            self.graph.write(run)
        return len(by_id)

    def get(self, avatar_id: str) -> Avatar:
        rows = self.graph.read(
            lambda g: g.V().has("avatar_id", avatar_id).element_map().to_list())
        if not rows:
            raise TaskNotFound(f"no avatar {avatar_id}")
        return avatar_from_row(rows[0])

    def upsert_aspect(self, aspect: str, values: Mapping[str, Any], encoded: bool = False,
                      fence: Fence | None = None) -> int:
        """Set one aspect on many avatars; returns how many avatars exist and were written.
        With ``fence``, each batch is refused (StaleFencingToken) once the token is stale.

        Per batch: one count of the batch's avatars (an index lookup), then one traversal
        chaining ``V().has('avatar_id', id).property(...)`` per avatar. A missing avatar would
        end such a chain (no traverser left), so a batch whose count falls short first looks up
        which avatars exist and chains only those.
        """
        key = aspect_key(aspect)
        if encoded:  # JSON text already (e.g. Spark's to_json): stored as is
            texts = {k: v for k, v in values.items() if isinstance(v, str)}
            if len(texts) != len(values):
                raise InvalidValue(f"aspect {aspect}: encoded values must be JSON strings")
        else:
            texts = {avatar_id: codec.encode_json(v) for avatar_id, v in values.items()}
        written = 0
        for chunk in chunks(list(texts), BATCH):
            def run(g: Traversal, chunk: Sequence[str] = chunk, fenced: bool = False) -> int:
                if fence is not None and not fenced:  # each traversal guarded by the fence
                    return under_fence(g, fence, lambda f: run(f, chunk, fenced=True))
                present = list(chunk)
                found = int(g.V().has("avatar_id", P.within(present)).count().next())
                if found < len(present):
                    exists = set(g.V().has("avatar_id", P.within(present))
                                 .values("avatar_id").to_list())
                    present = [a for a in present if a in exists]
                if not present:
                    return 0
                t = g
                for avatar_id in present:
                    t = (t.V().has("avatar_id", avatar_id)
                         .property(Cardinality.single, key, texts[avatar_id]))
                t.iterate()
                return len(present)
            written += self.graph.write(run)
        return written

    def remove_aspect(self, aspect: str, avatar_ids: Iterable[str] | None = None,
                      fence: Fence | None = None) -> int:
        """Remove an aspect from the given avatars (all when None); returns how many had it.
        With ``fence``, each batch is refused (StaleFencingToken) once the token is stale."""
        key = aspect_key(aspect)
        if avatar_ids is None:
            def run(g: Traversal, fenced: bool = False) -> int:
                if fence is not None and not fenced:  # each traversal guarded by the fence
                    return under_fence(g, fence, lambda f: run(f, fenced=True))
                count = int(g.V().has(key).count().next())
                g.V().has(key).properties(key).drop().iterate()
                return count
            return self.graph.write(run)
        removed = 0
        ids = sorted(set(avatar_ids))
        for chunk in chunks(ids, BATCH):
            def run_chunk(g: Traversal, chunk: Sequence[str] = chunk, fenced: bool = False) -> int:
                if fence is not None and not fenced:  # each traversal guarded by the fence
                    return under_fence(g, fence, lambda f: run_chunk(f, chunk, fenced=True))
                t = g.V().has("avatar_id", P.within(list(chunk))).has(key)
                count = int(t.count().next())
                g.V().has("avatar_id", P.within(list(chunk))).properties(key).drop().iterate()
                return count
            removed += self.graph.write(run_chunk)
        return removed

    def count(self) -> int:
        return int(self.graph.read(lambda g: g.V().has_label("avatar").count().next()))

    def scan(self, class_iris: Iterable[str] | None = None) -> Iterator[list[Avatar]]:
        """Avatars in pages: those of ``class_iris`` (all when None), one read per page of
        classes; each page is one consistent read, pages may see later writes."""
        if class_iris is None:
            rows = self.graph.read(
                lambda g: g.V().has_label("avatar").element_map().to_list())
            for chunk in chunks(rows, 1000):
                yield [avatar_from_row(r) for r in chunk]
            return
        for classes in chunks(sorted(set(class_iris)), BATCH):
            def run(g: Traversal, classes: Sequence[str] = classes) -> list[Row]:
                return list(g.V().has("avatar_class", P.within(list(classes)))
                            .element_map().to_list())
            rows = self.graph.read(run)
            if rows:
                yield [avatar_from_row(r) for r in rows]

    def export_page(self, class_iris: Iterable[str], after: str | None, limit: int
                    ) -> tuple[list[tuple[str, str, str]], str | None]:
        """Up to about ``limit`` avatars (twice that at most) of ``class_iris`` after the
        cursor ``after`` (None: from the start) as ``(id, class, properties as stored
        JSON)``, and the cursor of the next page (None: there is none). Memory is bounded by
        ``limit`` whatever the graph's size; a page is one consistent read, later pages may
        see later writes.

        * Embedded (gremlite): windows of vertex ids in id order (``g.V(ids)``, an indexed
          lookup), up to the highest element id; the cursor is the next id. A keyset on
          ``avatar_id`` would cost a scan of every string per page there.
        * Remote: a keyset on ``avatar_id`` (``has(avatar_id, gt(last)).order().by(avatar_id)
          .limit(n)``), which needs an index that orders ``avatar_id`` on the server; the
          cursor is the last id."""
        classes = sorted(set(class_iris))
        if not classes or limit < 1:
            return [], None
        bound = getattr(self.graph, "element_id_bound", None)
        if bound is not None:
            return self._export_windows(classes, int(after or 1), limit, int(bound()))
        rows = self.graph.read(
            lambda g: g.V().has("avatar_class", P.within(classes))
            .has("avatar_id", P.gt(after or ""))  # a string keyset: remote only
            .order().by("avatar_id").limit(limit)
            .element_map().to_list())
        found = [(r["avatar_id"], r["avatar_class"], r["avatar_props"]) for r in rows]
        return found, (found[-1][0] if len(found) == limit else None)

    def _export_windows(self, classes: list[str], start: int, limit: int, top: int
                        ) -> tuple[list[tuple[str, str, str]], str | None]:
        found: list[tuple[str, str, str]] = []
        window = max(64, min(EXPORT_WINDOW, limit))  # a window never holds more avatars
        while start <= top and len(found) < limit:
            end = min(start + window, top + 1)

            def run(g: Traversal, ids: range = range(start, end)) -> list[Row]:
                return list(g.V(*ids).has_label("avatar")
                            .has("avatar_class", P.within(classes)).element_map().to_list())
            found.extend((r["avatar_id"], r["avatar_class"], r["avatar_props"])
                         for r in self.graph.read(run))
            start = end
        return found, (str(start) if start <= top else None)

    def with_aspect(self, aspect: str) -> dict[str, Any]:
        """``avatar id -> value`` of every avatar that has the aspect."""
        key = aspect_key(aspect)
        rows = self.graph.read(
            lambda g: g.V().has(key).project("a", "v").by("avatar_id").by(key).to_list())
        return {r["a"]: codec.decode_json(r["v"]) for r in rows}


