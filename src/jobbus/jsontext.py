"""JSON text as jobbus writes it to jsonb and reads it back: strict on the way in, never raising on the way out."""

from __future__ import annotations

import json
from typing import Any

import msgspec


def dumps(value: Any) -> str:
    """JSON text for the database; refuses NaN and infinities, which jsonb cannot hold."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


class UndecodableJson(dict[str, Any]):
    """Stands for a stored JSON value this process cannot decode (say, nested deeper than Python's
    recursion limit, written by another producer). Empty, so reads of such a row still work; the
    worker fails the job at once with `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason

    def __repr__(self) -> str:
        return f"<undecodable JSON: {self.reason}>"


_decode = msgspec.json.Decoder().decode


def loads(data: str | bytes) -> Any:
    """JSON decoding that never raises on a value the database accepted: no row can kill a reader.

    msgspec first (several times faster than json.loads on the two jsonb columns of every claimed
    job); a value it refuses (a number beyond float or 64-bit range, nesting too deep) goes through
    json.loads, which decides as before: a value, or `UndecodableJson`."""
    try:
        return _decode(data)
    except (msgspec.DecodeError, RecursionError):
        pass
    try:
        return json.loads(data)
    except RecursionError:
        return UndecodableJson(f"nested too deeply to decode ({len(data)} bytes of JSON)")
    except ValueError as exc:
        return UndecodableJson(f"invalid JSON: {exc}")
