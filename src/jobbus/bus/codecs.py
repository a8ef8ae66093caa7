"""Codecs: how a message becomes the JSON payload of an envelope, and back.

A codec has a name, and the envelope records it, so a worker decodes a job with the codec that encoded
it even after the message's codec changes. `JsonCodec` is the default: a thin layer over
`jobbus.encoding` (msgspec, and pydantic for pydantic models). Whatever the codec, `dispatch` proves
that the payload decodes back into a message equal to the one dispatched before anything runs.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

from jobbus import encoding
from jobbus.encoding import EncodingError

T = TypeVar("T")


class CodecError(EncodingError):
    """A message could not be encoded exactly, or a payload does not decode into its message class."""


@runtime_checkable
class Codec(Protocol):
    """Turns message objects into JSON-able data and back.

    `name` is written into every envelope; keep it stable, because workers look the codec up by it.
    `encode` must return data that `json.dumps` accepts (dicts, lists, str, int, float, bool, None).
    `decode` receives that data after a trip through PostgreSQL jsonb (so tuples come back as lists and
    object keys may be reordered) and must return an instance of `cls`.
    """

    @property
    def name(self) -> str: ...

    def encode(self, obj: Any) -> Any: ...

    def decode(self, cls: type[T], data: Any) -> T: ...


class JsonCodec:
    """The default codec: dataclasses, TypedDicts, plain dicts and pydantic v2 models, as readable JSON.

    Field types and JSON forms are those of `jobbus.encoding` (see docs/bus.md). Payloads written by
    the earlier, hand-written codec still decode.
    """

    name = "json"

    def __repr__(self) -> str:
        return "JsonCodec()"

    def encode(self, obj: Any) -> Any:
        try:
            return encoding.to_json(obj, what="message")
        except EncodingError as exc:
            raise CodecError(str(exc)) from None

    def decode(self, cls: type[T], data: Any) -> T:
        try:
            return encoding.decode(data, cls, what="message")
        except EncodingError as exc:
            raise CodecError(str(exc)) from None


def is_typeddict(cls: object) -> bool:
    """True for TypedDict classes from `typing` and from `typing_extensions` (which pydantic asks for)."""
    if not isinstance(cls, type) or not issubclass(cls, dict):
        return False
    return hasattr(cls, "__required_keys__") and hasattr(cls, "__total__")
