"""The store's encodings on the wire to a Gremlin Server, each the driver's own made cheaper
for the client's CPU: :class:`GraphSONReader` reads answers with the C JSON parser and writes
a read's request with :class:`QuickGraphSON`, and :class:`QuickWriter` (:func:`graphbinary`)
writes the other requests in GraphBinary; both writers dispatch once per value. Each gives
what the driver's gives (the tests compare them value by value and byte by byte) and hands
whatever it does not know to the driver's own code. What they saved is in docs/runner.md
("The driver's share").
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from enum import Enum
from typing import Any

from gremlin_python.driver.serializer import (
    GraphBinarySerializersV1,
    GraphSONSerializersV3d0,
    Session,
    Standard,
    Traversal,
)
from gremlin_python.process.graph_traversal import GraphTraversal
from gremlin_python.process.traversal import Bytecode, P, T, Traverser
from gremlin_python.statics import long
from gremlin_python.structure.io.graphbinaryV1 import GraphBinaryWriter, _EnumIO
from gremlin_python.structure.io.graphsonV3d0 import GraphSONWriter


class _Unusual(Exception):
    """A GraphSON value the hook leaves to the driver's reader."""


_PLAIN_KEYS = (str, int, long, T)


def _typed(d: dict[str, Any]) -> object:
    """A JSON object of an answer as the driver's GraphSON 3 reader makes it."""
    kind = d.get("@type")
    if kind is None or len(d) != 2 or "@value" not in d:
        return d
    value = d["@value"]
    if kind == "g:Map":
        keys = value[0::2]
        if not all(key.__class__ in _PLAIN_KEYS for key in keys):
            raise _Unusual
        return dict(zip(keys, value[1::2], strict=True))
    if kind == "g:List":
        return value
    if kind == "g:Int64":
        return long(value)
    if kind == "g:Int32":
        return int(value)
    if kind == "g:T":
        return T[value]
    if kind == "g:Traverser":
        return Traverser(value["value"], value["bulk"])
    raise _Unusual


class GraphSONReader(GraphSONSerializersV3d0):  # type: ignore[misc]
    """gremlinpython's GraphSON 3 serializer whose answers are read by the C JSON parser with
    one Python call per typed object (``object_hook``) instead of one per value: 97 task rows
    cost the client 2.3-3.0 ms of CPU, against 4.6-5.1 ms with the driver's GraphSON reader
    and 10.0-11.3 ms as GraphBinary, whose reader is Python for every value. The types a
    store's read answers with (maps with plain keys, lists, integers, ``T``, traversers) are
    made as the driver's reader makes them; any other (a vertex, a set, a date, a double...)
    makes the whole answer go the driver's way. Requests are written by
    :class:`QuickGraphSON`: the driver's JSON, for less of the client's CPU."""

    def __init__(self) -> None:
        super().__init__()
        writer = QuickGraphSON()
        self.standard, self.traversal, self.session = \
            Standard(writer), Traversal(writer), Session(writer)

    def deserialize_message(self, message: str | bytes) -> object:
        text = message if isinstance(message, str) else message.decode("utf-8")
        try:
            return json.loads(text, object_hook=_typed)
        except _Unusual:
            return super().deserialize_message(message)


def graphbinary() -> GraphBinarySerializersV1:
    """gremlinpython's GraphBinary serializer whose requests are written by
    :class:`QuickWriter`: the same bytes, for less of the client's CPU."""
    return GraphBinarySerializersV1(writer=QuickWriter())


_I32 = struct.Struct(">i").pack
_I64 = struct.Struct(">q").pack


class QuickWriter(GraphBinaryWriter):  # type: ignore[misc]
    """The driver's GraphBinary writer with one dictionary lookup and one call per value of
    the types the store's traversals are made of (strings, integers, booleans, enums such as
    ``T`` and ``Cardinality``, ``P``, lists, maps and nested traversals): the driver's goes
    through a class method, its prefix and a new ``struct`` pack per value, and a
    write's bytecode (a ``union`` of a dozen guarded writes) was 16% of a node's samples under
    load. Every other value, and every value out of its type's range, goes the driver's way,
    which writes it or raises as before. Its bytes equal the driver's (tests:
    ``test_store_contract.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self._quick: dict[type, Callable[..., object]] = {
            str: self._str, bool: self._bool, int: self._int, long: self._long,
            list: self._list, dict: self._map, P: self._p,
            Bytecode: self._bytecode, GraphTraversal: self._bytecode}
        for kind, io in self.serializers.items():
            if isinstance(io, type) and issubclass(io, _EnumIO):
                self._quick[kind] = self._enum
        self._enums: dict[object, bytes] = {}
        self._names: dict[str, bytes] = {}
        self._sources: dict[object, bytes] = {}

    def to_dict(self, obj: object, to_extend: bytearray | None = None) -> Any:
        if to_extend is None:
            to_extend = bytearray()
        quick = self._quick.get(obj.__class__)
        if quick is None:
            return super().to_dict(obj, to_extend)
        quick(obj, to_extend)
        return to_extend

    def _str(self, obj: str, out: bytearray) -> None:
        data = obj.encode("utf-8")
        out += b"\x03\x00"
        out += _I32(len(data))
        out += data

    def _name(self, name: str) -> bytes:
        """A string written as a bare value (its length and UTF-8 bytes): a step's name."""
        known = self._names.get(name)
        if known is None:
            data = name.encode("utf-8")
            known = self._names[name] = _I32(len(data)) + data
        return known

    def _bool(self, obj: bool, out: bytearray) -> None:
        out += b"\x27\x00\x01" if obj else b"\x27\x00\x00"

    def _int(self, obj: int, out: bytearray) -> None:
        if -2 ** 31 <= obj < 2 ** 31:
            out += b"\x01\x00"
            out += _I32(obj)
        else:
            super().to_dict(obj, out)

    def _long(self, obj: int, out: bytearray) -> None:
        if -2 ** 63 <= obj < 2 ** 63:
            out += b"\x02\x00"
            out += _I64(obj)
        else:
            super().to_dict(obj, out)

    def _list(self, obj: list[object], out: bytearray) -> None:
        out += b"\x09\x00"
        out += _I32(len(obj))
        for item in obj:
            self.to_dict(item, out)

    def _map(self, obj: dict[object, object], out: bytearray) -> None:
        out += b"\x0a\x00"
        out += _I32(len(obj))
        for key, value in obj.items():
            self.to_dict(key, out)
            self.to_dict(value, out)

    def _enum(self, obj: object, out: bytearray) -> None:
        known = self._enums.get(obj)
        if known is None:
            known = self._enums[obj] = bytes(super().to_dict(obj, bytearray()))
        out += known

    def _p(self, obj: P, out: bytearray) -> None:
        out += b"\x1e\x00"
        out += self._name(obj.operator)
        if obj.other is not None:
            args = [obj.value, obj.other]
        else:
            args = obj.value if isinstance(obj.value, list) else [obj.value]
        out += _I32(len(args))
        for arg in args:
            self.to_dict(arg, out)

    def _bytecode(self, obj: Bytecode | GraphTraversal, out: bytearray) -> None:
        code = obj.bytecode if isinstance(obj, GraphTraversal) else obj
        out += b"\x15\x00"
        out += _I32(len(code.step_instructions))
        for step in code.step_instructions:
            out += self._name(step[0])
            out += _I32(len(step) - 1)
            for arg in step[1:]:
                self.to_dict(arg, out)
        out += self._source(code.source_instructions)

    def _source(self, instructions: list[list[object]]) -> bytes:
        """The source instructions' bytes as the driver writes them (strategies as their
        classes' names), kept for the few a store's sources have."""
        try:
            key: object = tuple(tuple(step) for step in instructions)
            known = self._sources.get(key)
        except TypeError:  # an unhashable argument: written each time
            key, known = None, None
        if known is None:
            whole = bytes(super().to_dict(Bytecode(), bytearray()))  # prefix + no steps
            code = Bytecode()
            code.source_instructions = instructions
            known = bytes(super().to_dict(code, bytearray()))[len(whole) - 4:]
            if key is not None and len(self._sources) < 64:
                self._sources[key] = known
        return known


class QuickGraphSON(GraphSONWriter):  # type: ignore[misc]
    """The driver's GraphSON 3 writer (a read's request) with one dictionary lookup per value
    of the types the store's reads are made of: the driver's finds a string, a boolean, an
    enum or a traversal by trying ``isinstance`` against each of its 30 serializers in turn
    (its map is keyed by their base classes), for every argument of every step, and a read's
    request was 5% of a node's samples in a drain on a Gremlin Server (a ready page's request:
    2.0 ms of CPU, 0.2 ms this way). Every other value goes the driver's way. What it makes
    equals the driver's, value by value (tests: ``test_store_contract.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self._quick: dict[type, Callable[..., object]] = {
            str: _same, bool: _same, type(None): _same, int: self._int, long: self._long,
            list: self._list, dict: self._map, Bytecode: self._bytecode,
            GraphTraversal: self._bytecode}
        self._enums: dict[object, object] = {}

    def to_dict(self, obj: object) -> Any:
        quick = self._quick.get(obj.__class__)
        if quick is not None:
            return quick(obj)
        if isinstance(obj, Enum):  # T, Cardinality, Order...: the driver's, kept per value
            known = self._enums.get(obj)
            if known is None:
                known = self._enums[obj] = super().to_dict(obj)
            return known
        return super().to_dict(obj)

    def _int(self, obj: int) -> object:
        if -2 ** 31 <= obj < 2 ** 31:
            return {"@type": "g:Int32", "@value": obj}
        return super().to_dict(obj)

    def _long(self, obj: int) -> object:
        if -2 ** 63 <= obj < 2 ** 63:
            return {"@type": "g:Int64", "@value": obj}
        return super().to_dict(obj)

    def _list(self, obj: list[object]) -> object:
        return {"@type": "g:List", "@value": [self.to_dict(item) for item in obj]}

    def _map(self, obj: dict[object, object]) -> object:
        flat: list[object] = []
        for key, value in obj.items():
            flat += (self.to_dict(key), self.to_dict(value))
        return {"@type": "g:Map", "@value": flat}

    def _bytecode(self, obj: Bytecode | GraphTraversal) -> object:
        code = obj.bytecode if isinstance(obj, GraphTraversal) else obj
        out: dict[str, object] = {}
        to_dict = self.to_dict
        if code.source_instructions:
            out["source"] = [[step[0], *map(to_dict, step[1:])]
                             for step in code.source_instructions]
        if code.step_instructions:
            out["step"] = [[step[0], *map(to_dict, step[1:])]
                           for step in code.step_instructions]
        return {"@type": "g:Bytecode", "@value": out}


def _same(obj: object) -> object:
    """A value GraphSON writes as itself (a string, a boolean, null)."""
    return obj
