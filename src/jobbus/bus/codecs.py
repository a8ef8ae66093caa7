"""Codecs: how a message becomes the JSON payload of an envelope, and back.

A codec has a name, and the envelope records it, so a worker decodes a job with the codec that encoded
it even after the message's codec changes. `JsonCodec` is the default. It encodes from the value (so it
needs no type information to write) and decodes from the class's type hints (so what comes back has
the declared types exactly: a `Decimal` stays a `Decimal` with its exponent, an aware datetime keeps its
offset, and its `ZoneInfo` zone when it had one).

What the JSON codec cannot make exact, and documents in docs/bus.md instead of guessing silently:
fields typed `Any` (or a bare `dict`/`list`) get back the JSON form of their value, and a union whose
members share a JSON form (`str | UUID`) decodes to the most specific member that accepts the data.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import math
import re
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol, TypeVar, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobbus.errors import JobbusError

T = TypeVar("T")

_NONE_TYPE = type(None)
_DURATION = re.compile(r"(-)?P(\d+)DT(\d+)\.(\d{6})S")
_ZONED = re.compile(r"(.+)\[([^\[\]]+)\]")
_INTEGER = re.compile(r"-?\d+")
#: Floats JSON cannot hold, or jsonb would change (its numeric has no negative zero), travel as strings.
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf, "-0.0": -0.0}


class CodecError(JobbusError, ValueError):
    """A message could not be encoded, or a payload does not decode into its message class."""


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

    Supported field types: str, int, float, bool, None, Decimal, datetime, date, time, timedelta, UUID,
    bytes, Enum, Literal, NewType, list/tuple/set/frozenset/dict (and their `collections.abc` forms),
    Optional and unions, nested dataclasses, TypedDicts, NamedTuples and pydantic models. pydantic is
    never imported here: a class can only be a pydantic model if pydantic is already loaded.
    """

    name = "json"

    def __init__(self) -> None:
        self._decoder = _Decoder()

    def __repr__(self) -> str:
        return "JsonCodec()"

    def encode(self, obj: Any) -> Any:
        return encode_json(obj, "message")

    def decode(self, cls: type[T], data: Any) -> T:
        return self._decoder.value(data, cls, "message", strict=False)  # type: ignore[no-any-return]


# -- encoding: driven by the value ------------------------------------------------------------------


def encode_json(value: Any, path: str) -> Any:
    """The JSON form of `value`; `path` names the value in error messages."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):  # before int and str: IntEnum and StrEnum are both
        return encode_json(value.value, path)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return "-0.0" if value == 0 and math.copysign(1.0, value) < 0 else float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):  # before date: a datetime is a date
        return _datetime_text(value)
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return _duration_text(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    model = _pydantic_model_class()
    if model is not None and isinstance(value, model):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: encode_json(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value) if f.init
        }
    if isinstance(value, Mapping):
        return {_key_text(k, path): encode_json(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, AbstractSet):
        items = [encode_json(item, f"{path}[]") for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))  # stable payloads
    if isinstance(value, Sequence):
        return [encode_json(item, f"{path}[{index}]") for index, item in enumerate(value)]
    raise CodecError(
        f"{path}: the JSON codec cannot encode {type(value).__qualname__} values; use a supported field "
        f"type (see docs/bus.md) or register the message with a custom codec: @bus.message(..., codec=...)"
    )


def _key_text(key: Any, path: str) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    encoded = encode_json(key, f"{path} key")
    if isinstance(encoded, str):
        return encoded
    if isinstance(encoded, int) and not isinstance(encoded, bool):
        return str(encoded)
    if isinstance(encoded, float):
        return repr(encoded)
    raise CodecError(f"{path}: a dict key of type {type(key).__qualname__} cannot become a JSON object key")


def _datetime_text(value: datetime) -> str:
    """ISO 8601, plus the zone name in brackets (RFC 9557) for `ZoneInfo` datetimes, so the zone survives."""
    text = value.isoformat()
    zone = value.tzinfo
    if isinstance(zone, ZoneInfo) and zone.key:
        return f"{text}[{zone.key}]"
    return text


def _duration_text(value: timedelta) -> str:
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    return f"{sign}P{value.days}DT{value.seconds}.{value.microseconds:06d}S"


def _pydantic_model_class() -> type[Any] | None:
    """`pydantic.BaseModel` if pydantic is loaded; never imports it (it is optional at runtime)."""
    module = sys.modules.get("pydantic")
    model = getattr(module, "BaseModel", None) if module is not None else None
    return model if isinstance(model, type) else None


# -- decoding: driven by the type hints -------------------------------------------------------------


def _kind(data: Any) -> str:
    if data is None:
        return "null"
    if isinstance(data, bool):
        return "a boolean"
    if isinstance(data, int | float):
        return "a number"
    if isinstance(data, str):
        return "a string"
    if isinstance(data, list):
        return "an array"
    if isinstance(data, dict):
        return "an object"
    return type(data).__qualname__


def _type_name(hint: Any) -> str:
    return hint.__qualname__ if isinstance(hint, type) else repr(hint).replace("typing.", "")


def _mismatch(path: str, expected: str, data: Any) -> CodecError:
    return CodecError(f"{path}: expected {expected}, got {_kind(data)} ({data!r:.60})")


class _Decoder:
    """Builds objects of a hinted type from JSON data; raises `CodecError` naming the path that failed."""

    def __init__(self) -> None:
        self._hints: dict[Any, dict[str, Any]] = {}
        self._required: dict[Any, frozenset[str]] = {}

    def hints(self, cls: Any) -> dict[str, Any]:
        found = self._hints.get(cls)
        if found is None:
            try:
                found = typing.get_type_hints(cls)
            except Exception as exc:  # NameError for an unresolvable forward reference, mostly
                raise CodecError(
                    f"the type hints of {_type_name(cls)} cannot be resolved ({exc}); define the types it "
                    f"names at module level so typing.get_type_hints can find them"
                ) from exc
            self._hints[cls] = found
        return found

    def required_keys(self, cls: Any) -> frozenset[str]:
        """A TypedDict's required keys, read from the hints: with postponed annotations (PEP 563)
        Python 3.11 cannot see `NotRequired[...]` and lists every key in `__required_keys__`."""
        found = self._required.get(cls)
        if found is None:
            required = set(getattr(cls, "__required_keys__", ()))
            for key, hint in typing.get_type_hints(cls, include_extras=True).items():
                origin = typing.get_origin(hint)
                if origin is typing.NotRequired:
                    required.discard(key)
                elif origin is typing.Required:
                    required.add(key)
            found = self._required[cls] = frozenset(required)
        return found

    def value(self, data: Any, hint: Any, path: str, *, strict: bool) -> Any:
        if hint is Any or hint is object or isinstance(hint, TypeVar):
            return data
        supertype = getattr(hint, "__supertype__", None)  # typing.NewType
        if supertype is not None:
            return self.value(data, supertype, path, strict=strict)
        if hint is None or hint is _NONE_TYPE:
            if data is not None:
                raise _mismatch(path, "null", data)
            return None
        origin = typing.get_origin(hint)
        if origin is not None:
            return self._generic(data, hint, origin, path, strict=strict)
        if isinstance(hint, type):
            return self._class(data, hint, path, strict=strict)
        raise CodecError(f"{path}: the JSON codec cannot decode into {hint!r}; use a custom codec for it")

    # -- generic aliases: unions, Literal, containers ----------------------------------------------

    def _generic(self, data: Any, hint: Any, origin: Any, path: str, *, strict: bool) -> Any:
        args = typing.get_args(hint)
        if origin is typing.Union or origin is types.UnionType:
            return self._union(data, args, path, strict=strict)
        if origin is typing.Literal:
            return self._literal(data, args, path)
        if origin is typing.Final or origin is typing.Annotated:
            return self.value(data, args[0], path, strict=strict)
        if not isinstance(origin, type):
            raise CodecError(f"{path}: the JSON codec cannot decode into {hint!r}; use a custom codec for it")
        if dataclasses.is_dataclass(origin) or is_typeddict(origin):
            return self._class(data, origin, path, strict=strict)  # generic parameters decode as Any
        if issubclass(origin, tuple):
            return self._tuple(data, args, path, strict=strict)
        if issubclass(origin, Mapping):
            key_hint, value_hint = args if len(args) == 2 else (Any, Any)
            decoded = self._mapping(data, key_hint, value_hint, path, strict=strict)
            return decoded if _is_abstract(origin) or origin is dict else _build(origin, decoded)
        if issubclass(origin, (AbstractSet, Sequence)) and not issubclass(origin, (str, bytes)):
            item_hint = args[0] if args else Any
            items = self._items(data, item_hint, path, strict=strict)
            if issubclass(origin, frozenset):
                return frozenset(items)
            if issubclass(origin, AbstractSet):
                return set(items) if _is_abstract(origin) or origin is set else _build(origin, items)
            return items if _is_abstract(origin) or origin is list else _build(origin, items)
        raise CodecError(f"{path}: the JSON codec cannot decode into {hint!r}; use a custom codec for it")

    def _union(self, data: Any, members: tuple[Any, ...], path: str, *, strict: bool) -> Any:
        if data is None and _NONE_TYPE in members:
            return None
        options = [m for m in members if m is not _NONE_TYPE]
        if len(options) == 1:
            return self.value(data, options[0], path, strict=strict)
        # Most specific first: a string is tried as UUID/datetime/Decimal/... before `str`, an integer as
        # `int` before `float`; then a first pass refusing unknown object keys tells dataclasses apart.
        ordered = sorted(options, key=lambda member: _union_rank(member, data))
        errors: list[str] = []
        passes = (True,) if strict else (True, False)
        for strict_pass in passes:
            for member in ordered:
                try:
                    return self.value(data, member, path, strict=strict_pass)
                except CodecError as exc:
                    errors.append(str(exc))
        names = " | ".join(_type_name(m) for m in members)
        raise CodecError(f"{path}: {_kind(data)} ({data!r:.60}) matches no member of {names}: {errors[0]}")

    def _literal(self, data: Any, values: tuple[Any, ...], path: str) -> Any:
        for value in values:
            plain = value.value if isinstance(value, enum.Enum) else value
            if type(plain) is type(data) and plain == data:
                return value
        raise CodecError(f"{path}: {data!r:.60} is not one of {', '.join(repr(v) for v in values)}")

    def _items(self, data: Any, item_hint: Any, path: str, *, strict: bool) -> list[Any]:
        if not isinstance(data, list):
            raise _mismatch(path, "an array", data)
        return [self.value(item, item_hint, f"{path}[{i}]", strict=strict) for i, item in enumerate(data)]

    def _tuple(self, data: Any, args: tuple[Any, ...], path: str, *, strict: bool) -> tuple[Any, ...]:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(self._items(data, args[0], path, strict=strict))
        if not isinstance(data, list):
            raise _mismatch(path, "an array", data)
        if args == ((),):  # tuple[()]
            args = ()
        if len(data) != len(args):
            raise CodecError(f"{path}: expected an array of {len(args)} items, got {len(data)}")
        return tuple(
            self.value(item, hint, f"{path}[{i}]", strict=strict)
            for i, (item, hint) in enumerate(zip(data, args, strict=True))
        )

    def _mapping(self, data: Any, key_hint: Any, value_hint: Any, path: str, *, strict: bool) -> dict[Any, Any]:
        if not isinstance(data, dict):
            raise _mismatch(path, "an object", data)
        return {
            self._key(key, key_hint, path): self.value(item, value_hint, f"{path}[{key!r}]", strict=strict)
            for key, item in data.items()
        }

    def _key(self, text: str, hint: Any, path: str) -> Any:
        where = f"{path} key {text!r}"
        if hint is Any or hint is str or hint is object:
            return text
        if hint is bool:
            if text not in ("true", "false"):
                raise CodecError(f"{where}: expected true or false")
            return text == "true"
        if hint is int:
            if not _INTEGER.fullmatch(text):
                raise CodecError(f"{where}: expected an integer")
            return int(text)
        if hint is float:
            try:
                return float(text)
            except ValueError:
                raise CodecError(f"{where}: expected a number") from None
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            try:
                return hint(text)
            except ValueError:
                if _INTEGER.fullmatch(text):
                    return self._enum(int(text), hint, where)
                raise CodecError(f"{where}: not a value of {hint.__qualname__}") from None
        if typing.get_origin(hint) is typing.Literal:
            for value in typing.get_args(hint):
                if _key_text(value, path) == text:
                    return value
            raise CodecError(f"{where}: not one of {typing.get_args(hint)!r}")
        return self.value(text, hint, where, strict=False)

    # -- classes -----------------------------------------------------------------------------------

    def _class(self, data: Any, cls: type[Any], path: str, *, strict: bool) -> Any:
        scalar = _SCALARS.get(cls)
        if scalar is not None:
            return scalar(data, path)
        if issubclass(cls, enum.Enum):
            return self._enum(data, cls, path)
        for base in (int, float, str):  # user subclasses of plain scalars
            if issubclass(cls, base):
                return cls(_SCALARS[base](data, path))
        model = _pydantic_model_class()
        if model is not None and issubclass(cls, model):
            try:
                return cls.model_validate(data)
            except Exception as exc:
                raise CodecError(f"{path}: {cls.__qualname__}.model_validate refused the data: {exc}") from exc
        if dataclasses.is_dataclass(cls):
            return self._dataclass(data, cls, path, strict=strict)
        if is_typeddict(cls):
            return self._typed_dict(data, cls, path, strict=strict)
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return self._named_tuple(data, cls, path, strict=strict)
        if issubclass(cls, Mapping):
            decoded = self._mapping(data, Any, Any, path, strict=strict)
            return decoded if cls is dict or _is_abstract(cls) else _build(cls, decoded)
        if issubclass(cls, tuple | list | set | frozenset):
            return cls(self._items(data, Any, path, strict=strict))
        raise CodecError(
            f"{path}: the JSON codec cannot decode into {cls.__qualname__}; use a supported field type "
            f"(see docs/bus.md) or register the message with a custom codec"
        )

    def _enum(self, data: Any, cls: type[enum.Enum], path: str) -> enum.Enum:
        try:
            return cls(tuple(data) if isinstance(data, list) else data)
        except (ValueError, TypeError):
            known = ", ".join(repr(m.value) for m in cls)
            raise CodecError(f"{path}: {data!r:.60} is not a value of {cls.__qualname__} ({known})") from None

    def _dataclass(self, data: Any, cls: type[Any], path: str, *, strict: bool) -> Any:
        if not isinstance(data, dict):
            raise _mismatch(path, f"an object for {cls.__qualname__}", data)
        hints = self.hints(cls)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        kwargs: dict[str, Any] = {}
        for f in fields:
            if f.name in data:
                kwargs[f.name] = self.value(data[f.name], hints.get(f.name, Any), f"{path}.{f.name}", strict=strict)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise CodecError(f"{path}: field {f.name!r} of {cls.__qualname__} is missing")
        if strict:
            _refuse_unknown(data, {f.name for f in fields}, cls, path)
        try:
            return cls(**kwargs)
        except Exception as exc:  # __post_init__ validation, mostly
            raise CodecError(f"{path}: {cls.__qualname__}(...) refused the decoded fields: {exc}") from exc

    def _typed_dict(self, data: Any, cls: type[Any], path: str, *, strict: bool) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise _mismatch(path, f"an object for {cls.__qualname__}", data)
        hints = self.hints(cls)
        missing = sorted(self.required_keys(cls) - set(data))
        if missing:
            raise CodecError(f"{path}: key {missing[0]!r} of {cls.__qualname__} is missing")
        if strict:
            _refuse_unknown(data, set(hints), cls, path)
        return {
            key: self.value(item, hints.get(key, Any), f"{path}.{key}", strict=strict) for key, item in data.items()
        }

    def _named_tuple(self, data: Any, cls: type[Any], path: str, *, strict: bool) -> Any:
        hints = self.hints(cls)
        names: tuple[str, ...] = cls._fields
        items = self._items(data, Any, path, strict=strict)
        if len(items) > len(names):
            raise CodecError(f"{path}: {cls.__qualname__} has {len(names)} fields, got {len(items)} items")
        values = [
            self.value(item, hints.get(name, Any), f"{path}.{name}", strict=strict)
            for name, item in zip(names, items, strict=False)
        ]
        try:
            return cls(*values)
        except TypeError as exc:
            raise CodecError(f"{path}: {cls.__qualname__}(...) refused the decoded fields: {exc}") from exc


def is_typeddict(cls: object) -> bool:
    """True for TypedDict classes from `typing` and from `typing_extensions` (which pydantic asks for)."""
    if not isinstance(cls, type) or not issubclass(cls, dict):
        return False
    return hasattr(cls, "__required_keys__") and hasattr(cls, "__total__")


def _refuse_unknown(data: dict[str, Any], known: set[str], cls: type[Any], path: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise CodecError(f"{path}: {cls.__qualname__} has no field {unknown[0]!r}")


def _build(cls: Any, value: Any) -> Any:
    """A concrete container class (OrderedDict, deque, a dict subclass) built from the decoded value."""
    try:
        return cls(value)
    except Exception as exc:
        raise CodecError(f"{_type_name(cls)} cannot be built from the decoded items: {exc}") from exc


def _is_abstract(cls: type[Any]) -> bool:
    return cls.__module__ in ("collections.abc", "typing")


def _union_rank(member: Any, data: Any) -> int:
    if member is Any or member is object:
        return 3
    if member is str:
        return 2
    if member is float and isinstance(data, int):
        return 1
    return 0


# -- scalars ----------------------------------------------------------------------------------------


def _bool(data: Any, path: str) -> bool:
    if not isinstance(data, bool):
        raise _mismatch(path, "a boolean", data)
    return data


def _int(data: Any, path: str) -> int:
    if isinstance(data, bool) or not isinstance(data, int):
        raise _mismatch(path, "an integer", data)
    return data


def _float(data: Any, path: str) -> float:
    if isinstance(data, str) and data in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[data]
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise _mismatch(path, "a number", data)
    try:
        return float(data)  # jsonb writes large floats as integers: 1e300 comes back as 1000...0
    except OverflowError:
        raise CodecError(f"{path}: {data!r:.60} is too large for a float") from None


def _str(data: Any, path: str) -> str:
    if not isinstance(data, str):
        raise _mismatch(path, "a string", data)
    return data


def _text(data: Any, path: str, what: str) -> str:
    if not isinstance(data, str):
        raise _mismatch(path, f"a string holding {what}", data)
    return data


def _decimal(data: Any, path: str) -> Decimal:
    if isinstance(data, int) and not isinstance(data, bool):
        return Decimal(data)
    try:
        return Decimal(_text(data, path, "a decimal number"))
    except InvalidOperation:
        raise CodecError(f"{path}: {data!r:.60} is not a decimal number") from None


def _datetime(data: Any, path: str) -> datetime:
    text = _text(data, path, "an ISO 8601 datetime")
    zoned = _ZONED.fullmatch(text)
    base_text = zoned.group(1) if zoned else text
    if len(base_text) <= 10:  # a bare date: refuse it, so `date | datetime` unions stay exact
        raise CodecError(f"{path}: {text!r:.60} is a date, not a datetime")
    try:
        value = datetime.fromisoformat(base_text)
    except ValueError:
        raise CodecError(f"{path}: {text!r:.60} is not an ISO 8601 datetime") from None
    if zoned is None or value.tzinfo is None:
        return value
    try:
        zone = ZoneInfo(zoned.group(2))
    except (ZoneInfoNotFoundError, ValueError):
        return value  # this machine lacks the zone: keep the exact instant and offset
    offset = value.utcoffset()
    for fold in (0, 1):  # pick the fold whose offset matches: ambiguous and skipped wall times stay exact
        local = value.replace(tzinfo=zone, fold=fold)
        if local.utcoffset() == offset:
            return local
    return value.astimezone(zone)  # the zone's rules changed since encoding: keep the instant


def _date(data: Any, path: str) -> date:
    try:
        return date.fromisoformat(_text(data, path, "an ISO 8601 date"))
    except ValueError:
        raise CodecError(f"{path}: {data!r:.60} is not an ISO 8601 date") from None


def _time(data: Any, path: str) -> time:
    try:
        return time.fromisoformat(_text(data, path, "an ISO 8601 time"))
    except ValueError:
        raise CodecError(f"{path}: {data!r:.60} is not an ISO 8601 time") from None


def _timedelta(data: Any, path: str) -> timedelta:
    match = _DURATION.fullmatch(_text(data, path, "a duration"))
    if match is None:
        raise CodecError(f"{path}: {data!r:.60} is not a duration like 'P1DT30.000000S'")
    sign, days, seconds, micros = match.groups()
    value = timedelta(days=int(days), seconds=int(seconds), microseconds=int(micros))
    return -value if sign else value


def _uuid(data: Any, path: str) -> uuid.UUID:
    try:
        return uuid.UUID(_text(data, path, "a UUID"))
    except ValueError:
        raise CodecError(f"{path}: {data!r:.60} is not a UUID") from None


def _bytes(data: Any, path: str) -> bytes:
    try:
        return base64.b64decode(_text(data, path, "base64 bytes"), validate=True)
    except (binascii.Error, ValueError):
        raise CodecError(f"{path}: {data!r:.60} is not base64") from None


_SCALARS: dict[type[Any], Callable[[Any, str], Any]] = {
    bool: _bool,
    int: _int,
    float: _float,
    str: _str,
    Decimal: _decimal,
    datetime: _datetime,
    date: _date,
    time: _time,
    timedelta: _timedelta,
    uuid.UUID: _uuid,
    bytes: _bytes,
}
