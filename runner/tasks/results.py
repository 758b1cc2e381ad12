"""A task's result: what its handler returns, checked and encoded at the attempt's end.

A ``@task`` handler may return a value; it is stored with its SUCCEEDED attempt, in the same
fenced write as the end (``attempt_result``: a stale owner's result never lands), and read
back by ``Client.result``, ``latchwork task result``, ``task show`` and the web console.

* the value is JSON (a dict, a list, a string, a number, a bool), or a pydantic model;
* a handler whose return annotation names a type (``-> Enriched``, ``-> list[str]``) has its
  value validated against it (a dict becomes the model) and stored as that type's JSON; a
  handler with no annotation (or ``-> Any``) stores any JSON value as given;
* ``None`` stores nothing: the task succeeded with no result;
* at most :data:`RESULT_LIMIT` bytes of JSON (64 KiB, a checkpoint's limit: a result travels
  in the end's write and in an API reply): return a reference (a key, a path) to large output.

Failure behaviour: a value that is not JSON, does not validate, or is over the limit raises
:class:`~runner.errors.ResultInvalid` where the handler returned (in its node's thread, or in
its handler process, which sends the error across), so the attempt ends FAILED with it, and
the type's retry policy decides as for any other failure. Nothing is written for it.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from messaging import summary
from runner.errors import InvalidValue, ResultInvalid
from runner.store import codec

#: the most a result may be, in bytes of JSON
RESULT_LIMIT = 64 * 1024


@dataclass(frozen=True)
class ResultType:
    """What a type's handler declares it returns: ``adapter`` None: any JSON value."""
    adapter: TypeAdapter[Any] | None = None
    shown: str = "any JSON"

    @classmethod
    def of(cls, handler: Callable[..., Any]) -> ResultType:
        """The return annotation of ``handler``; an annotation that cannot be resolved (a name
        imported only for type checking) or ``Any`` checks nothing but JSON."""
        try:
            hints = typing.get_type_hints(handler)
        except Exception:  # NameError and the like: the annotation is for type checkers
            return cls()
        if "return" not in hints:
            return cls()
        annotation = hints["return"]
        if annotation is Any:
            return cls()
        if annotation is type(None):
            return cls(TypeAdapter(type(None)), "None")
        return cls(TypeAdapter(annotation), getattr(annotation, "__name__", str(annotation)))

    def encode(self, task_type: str, value: object) -> str | None:
        """``value`` as stored (JSON text), or None when there is none to store; raises
        :class:`ResultInvalid` (see the module)."""
        if self.adapter is not None:
            try:
                value = self.adapter.dump_python(self.adapter.validate_python(value),
                                                 mode="json")
            except ValidationError as exc:
                raise ResultInvalid(f"task type {task_type!r}: its handler returned a value "
                                    f"that is not {self.shown}: {summary(exc)}") from None
        elif isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        if value is None:
            return None
        try:
            text = codec.encode_json(value)
        except InvalidValue as exc:
            raise ResultInvalid(f"task type {task_type!r}: its handler returned a value that "
                                f"is not JSON ({type(value).__name__}): {exc}") from None
        size = len(text.encode())
        if size > RESULT_LIMIT:
            raise ResultInvalid(f"task type {task_type!r}: its result is {size} bytes of JSON, "
                                f"over the limit of {RESULT_LIMIT}: store large output "
                                f"elsewhere and return a reference to it")
        return text

    def decode(self, text: str | None) -> object:
        """A stored result as this type (the model for a model), None for none."""
        if text is None:
            return None
        value = codec.decode_json(text)
        return value if self.adapter is None else self.adapter.validate_python(value)


ANY_RESULT = ResultType()
