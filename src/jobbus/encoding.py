"""Type-directed JSON encoding: Python values ⇄ JSON data, exact or refused.

Job configurations are JSON. Whatever jobbus stores for a typed value (a bus message, and the
arguments of typed tasks) goes through this module, so that what a handler receives is what the
producer sent:

- `encode(value, type_)` returns the JSON data (dicts, lists, str, int, float, bool, None) for a
  value of the annotation `type_`, after proving that `decode` of that data gives back a value equal
  to `value`. A value the JSON form would change (a masked pydantic secret, a field excluded from
  serialisation, a NaN, a union whose members share a JSON form, a tuple given for a `list` field)
  raises `EncodingError` naming the first field that would change, and nothing is written.
- `decode(data, type_)` builds a value of `type_` from JSON data (as it comes back from jsonb).
- `to_json(value)` is the unchecked, value-directed half of `encode`, for codecs that check later.

Conversion is delegated: msgspec (`msgspec.json` with the target type) handles dataclasses,
TypedDicts, NamedTuples, enums, `Literal`, UUID, datetime/date/time/timedelta, Decimal, bytes,
unions, containers and `Any`; pydantic's `TypeAdapter` handles pydantic models and pydantic types
(`SecretStr`, URLs, ...), and only when pydantic is already imported (it stays optional). The JSON
forms are msgspec's and pydantic's: RFC 3339 datetimes, ISO 8601 durations, Decimal as a string,
bytes as base64, enums by value, pydantic models by field name. Unions follow msgspec's rule: at most
one member per JSON kind, so that a decoder can tell them apart; other unions are refused.

Payloads written by jobbus's earlier, hand-written codec still decode: where msgspec refuses one of its
forms (a datetime with its zone name, ``"...+02:00[Europe/Paris]"``, or an offset in seconds; a float
written as ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` or ``"-0.0"``), `decode` rewrites those values,
guided by the type, and converts again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
import msgspec.inspect as mi

from jobbus.errors import JobbusError

T = TypeVar("T")
#: What `encode` and `to_json` return: a JSON value (dicts with str keys, lists, str, int, float, bool, None).
JsonValue = Any

__all__ = ["EncodingError", "JsonValue", "decode", "encode", "require_same", "to_json"]


class EncodingError(JobbusError, ValueError):
    """A value cannot be encoded as JSON exactly, or JSON data does not decode into the requested type."""


def encode(value: object, type_: Any, *, what: str = "value") -> JsonValue:
    """The JSON data for `value`, an instance of the annotation `type_`, proven to decode back equal.

    `what` names the value in error messages (``"message"``, a parameter name). One call costs an
    encode, a decode and a comparison (see docs/benchmarks.md); nothing here touches the database.
    """
    data = to_json(value, what=what)
    try:
        decoded = decode(data, type_, what=what)
    except EncodingError:
        non_finite = _non_finite_float(value, what)  # msgspec writes NaN and Infinity as null
        if non_finite is not None:
            raise EncodingError(non_finite) from None
        raise
    require_same(value, decoded, what=what)
    return data


def to_json(value: object, *, what: str = "value") -> JsonValue:
    """The JSON data of `value`, driven by the value alone and not checked: see `encode`.

    Raises `EncodingError` for values JSON cannot hold at all (an arbitrary object, a lone surrogate,
    a NUL character, which PostgreSQL's jsonb refuses). A float NaN or infinity becomes null here, as
    in msgspec's JSON; `encode` refuses it.
    """
    try:
        text = _ENCODER.encode(value)
    except UnicodeEncodeError:
        raise EncodingError(f"{what} contains a lone surrogate character, which is not valid UTF-8") from None
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise EncodingError(
            f"{_unencodable_path(value, what)}: {exc}; use a supported type (dataclass, TypedDict, pydantic "
            "model, JSON values, UUID, datetime, Decimal, enums, ...) or, for a bus message, a custom codec"
        ) from None
    if b"\\u0000" in text and _NUL.search(text):
        raise EncodingError(f"{what} contains a NUL character, which PostgreSQL jsonb cannot store")
    return _JSON.decode(text)


@overload
def decode(data: JsonValue, type_: type[T], *, what: str = "value") -> T: ...


@overload
def decode(data: JsonValue, type_: Any, *, what: str = "value") -> Any: ...


def decode(data: JsonValue, type_: Any, *, what: str = "value") -> Any:
    """A value of the annotation `type_` built from JSON `data`; `EncodingError` names what does not fit."""
    try:
        return _convert(data, type_)
    except msgspec.ValidationError as exc:
        error = exc
    except TypeError as exc:  # msgspec refuses the annotation itself
        raise EncodingError(
            f"{what}: {_type_name(type_)} cannot be decoded from JSON exactly: {exc}{_hint(exc)}"
        ) from None
    except NameError as exc:
        raise EncodingError(
            f"{what}: the type hints of {_type_name(type_)} cannot be resolved ({exc}); define the types they "
            "name at module level"
        ) from None
    legacy = _legacy_data(data, type_)
    if legacy is not _UNCHANGED:
        try:
            return _convert(legacy, type_)
        except msgspec.ValidationError:
            pass
    raise EncodingError(_validation_message(error, what)) from None


def require_same(original: object, decoded: object, *, what: str = "value") -> None:
    """Raise `EncodingError` unless `decoded` equals `original`, naming the first field that differs.

    Equality is ``==``, with three refinements where ``==`` says nothing useful: classes without
    ``__eq__`` are compared field by field when they are dataclasses and trusted otherwise, Decimals
    compare by their digits (``NaN`` included), and aware datetimes by wall time and UTC offset (two
    datetimes of different zones in a repeated hour are never ``==`` in Python).
    """
    try:
        if decoded == original:
            return
    except Exception:  # a signalling Decimal NaN raises on comparison
        pass
    difference = _difference(original, decoded, what)
    if difference is not None:
        raise EncodingError(difference)


# -- msgspec and pydantic hooks ---------------------------------------------------------------------


class _Unsupported(TypeError):
    pass


def _pydantic_adapter(cls: type[Any]) -> Any:
    """A cached `pydantic.TypeAdapter` for pydantic models and types; None without pydantic or for others.

    pydantic is never imported here: a class can only need it if pydantic is already loaded.
    """
    found = _ADAPTERS.get(cls, _UNCHANGED)
    if found is not _UNCHANGED:
        return found
    adapter = None
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and hasattr(cls, "__get_pydantic_core_schema__"):
        adapter = pydantic.TypeAdapter(cls)
    return _ADAPTERS.setdefault(cls, adapter)


def _encode_hook(value: Any) -> Any:
    for base in (str, int, float):  # subclasses of plain scalars (enums are msgspec's)
        if isinstance(value, base):
            return base(value)
    adapter = _pydantic_adapter(type(value))
    if adapter is not None:  # by field name, which validation accepts whatever the aliases
        return adapter.dump_python(value, mode="json", by_alias=False, round_trip=True)
    raise _Unsupported(f"cannot encode {type(value).__module__}.{type(value).__qualname__} values")


def _decode_hook(cls: type[Any], data: Any) -> Any:
    for base in (str, int, float):
        if issubclass(cls, base):
            if not isinstance(data, base) or isinstance(data, bool):
                raise _Unsupported(f"Expected `{base.__name__}`, got `{type(data).__name__}`")
            return cls(data)
    if issubclass(cls, dict):  # a dict subclass as a message class
        return cls(_convert(data, _dict_base(cls)))
    adapter = _pydantic_adapter(cls)
    if adapter is not None:
        return adapter.validate_python(data, **_validation_options())
    raise _Unsupported(f"cannot decode into {cls.__module__}.{cls.__qualname__}")


def _dict_base(cls: type[Any]) -> Any:
    for base in getattr(cls, "__orig_bases__", ()):
        if getattr(base, "__origin__", None) is dict:
            return base
    return dict


def _convert(data: Any, type_: Any) -> Any:
    adapter = _pydantic_adapter(type_) if isinstance(type_, type) else None
    if adapter is not None:  # a pydantic model itself: msgspec would only hand it to the hook, slowly
        try:
            return adapter.validate_python(data, **_validation_options())
        except ValueError as exc:
            raise msgspec.ValidationError(str(exc)) from exc
    return msgspec.convert(data, type_, strict=True, str_keys=True, dec_hook=_decode_hook)


@functools.cache
def _validation_options() -> dict[str, bool]:
    """pydantic >= 2.11 validates by field name *and* alias on request; older versions by alias only.

    Called once pydantic models are in use, so pydantic is loaded by then.
    """
    version = getattr(sys.modules.get("pydantic"), "VERSION", "0")
    major_minor = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    return {"by_alias": True, "by_name": True} if major_minor >= (2, 11) else {}


_ENCODER = msgspec.json.Encoder(enc_hook=_encode_hook, decimal_format="string")
_JSON = msgspec.json.Decoder()
_UNCHANGED: Any = object()
_ADAPTERS: dict[type[Any], Any] = {}
#: An escaped NUL, not a backslash followed by the text "u0000".
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


# -- error messages ---------------------------------------------------------------------------------

_PATH = re.compile(r" - at `\$(.*)`$")


def _validation_message(error: msgspec.ValidationError, what: str) -> str:
    text = str(error)
    match = _PATH.search(text)
    path = match.group(1) if match else ""
    problem = text[: match.start()] if match else text
    return f"{what}{path}: {problem}"


def _hint(exc: Exception) -> str:
    if "unions" in str(exc).lower():
        return (
            ". JSON cannot tell such members apart: use one type, a pydantic model (its unions are "
            "pydantic's), or, for a bus message, a custom codec"
        )
    return ""


def _type_name(type_: Any) -> str:
    return type_.__qualname__ if isinstance(type_, type) else repr(type_).replace("typing.", "")


# -- the comparison behind `require_same` ---------------------------------------------------------------


def _difference(original: Any, decoded: Any, path: str) -> str | None:
    """A description of the first place where `decoded` differs from `original`, or None."""
    if type(original) is not type(decoded):
        if isinstance(original, int | float) and not isinstance(original, bool) and _equal(original, decoded):
            return None  # an int given for a float field comes back as the equal float
        return _differs(path, original, decoded)
    if isinstance(original, Decimal):
        return None if str(original) == str(decoded) else _differs(path, original, decoded)
    if isinstance(original, datetime):
        same_wall_time = original.replace(tzinfo=None) == decoded.replace(tzinfo=None)
        return (
            None
            if same_wall_time and original.utcoffset() == decoded.utcoffset()
            else _differs(path, original, decoded)
        )
    children = _children(original, decoded)
    if children is None:
        if _equal(original, decoded) or type(original).__eq__ is object.__eq__:  # type: ignore[comparison-overlap]
            return None  # a class without __eq__ cannot be compared: trust its codec
        return _differs(path, original, decoded)
    for label, left, right in children:
        found = _difference(left, right, f"{path}{label}")
        if found is not None:
            return found
    return _extra_difference(original, decoded, path)


def _children(original: Any, decoded: Any) -> list[tuple[str, Any, Any]] | None:
    """The parts to compare one by one, or None for a value compared as a whole."""
    left, right = _parts(original), _parts(decoded)
    if left is None or right is None or [label for label, _ in left] != [label for label, _ in right]:
        return None
    return [(label, a, b) for (label, a), (_, b) in zip(left, right, strict=True)]


def _parts(value: Any) -> list[tuple[str, Any]] | None:
    """A structured value's fields, items or elements, labelled as a path suffix; None for the others."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value)]
    if _is_pydantic_model(value):
        return [(f".{name}", getattr(value, name)) for name in type(value).model_fields]
    if isinstance(value, Mapping):
        return [(f"[{key!r}]", item) for key, item in value.items()]
    if isinstance(value, list | tuple):
        return [(f"[{index}]", item) for index, item in enumerate(value)]
    return None


def _unencodable_path(value: Any, path: str) -> str:
    """The path of the first part of `value` that msgspec refuses (on the error path only)."""
    for label, part in _parts(value) or ():
        try:
            _ENCODER.encode(part)
        except Exception:
            return _unencodable_path(part, f"{path}{label}")
    return path


def _non_finite_float(value: Any, path: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path} is {value!r}: JSON has no NaN or Infinity; use None, a Decimal or a string"
    for label, part in _parts(value) or ():
        found = _non_finite_float(part, f"{path}{label}")
        if found is not None:
            return found
    return None


def _is_pydantic_model(value: Any) -> bool:
    return hasattr(value, "__pydantic_private__") and isinstance(getattr(type(value), "model_fields", None), Mapping)


def _extra_difference(original: Any, decoded: Any, path: str) -> str | None:
    """What the fields do not show: a pydantic model's extra fields and private attributes."""
    if not _is_pydantic_model(original):
        return None
    for attribute, kind in (("__pydantic_extra__", "extra fields"), ("__pydantic_private__", "private attributes")):
        left, right = getattr(original, attribute, None), getattr(decoded, attribute, None)
        if not _equal(left, right):
            return f"{path}: its {kind} {left!r:.80} would arrive as {right!r:.80}; only fields travel as JSON"
    return None


def _equal(left: Any, right: Any) -> bool:
    try:
        return bool(left == right)
    except Exception:
        return False


def _differs(path: str, original: Any, decoded: Any) -> str:
    sent, arrives = _show(original), _show(decoded)
    if sent == arrives:
        cause = "the JSON form loses what the repr hides, as for a masked secret such as pydantic's SecretStr"
    elif isinstance(original, datetime):
        cause = "JSON datetimes (RFC 3339) carry UTC offsets in whole minutes"
    elif type(original) is not type(decoded):
        cause = "a value of another type than its annotation, or of a union whose members share a JSON form"
    else:
        cause = "a field excluded from serialisation comes back as its default"
    return f"{path} does not survive JSON unchanged: sent {sent}, it would arrive as {arrives} ({cause})"


def _show(value: Any) -> str:
    if isinstance(value, datetime):
        return f"datetime {value.isoformat()} ({value.tzinfo})"
    text = repr(value)
    text = text if len(text) <= 100 else f"{text[:97]}..."
    name = type(value).__qualname__
    return text if text.startswith(name) else f"{name} {text}"


# -- payloads of the earlier codec -----------------------------------------------------------------------

_ZONED = re.compile(r"(.+)\[([^\[\]]+)\]")
_SECONDS_OFFSET = re.compile(r"[+-]\d\d:\d\d:\d\d(\.\d+)?$")
_LEGACY_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf, "-0.0": -0.0}


def _legacy_data(data: Any, type_: Any) -> Any:
    """`data` with the float and datetime forms of the earlier codec rewritten, or `_UNCHANGED`."""
    try:
        info = mi.type_info(type_)
    except Exception:
        return _UNCHANGED
    rewritten = _rewrite(data, info)
    return _UNCHANGED if rewritten is data else rewritten


def _rewrite(data: Any, info: mi.Type) -> Any:
    if isinstance(info, mi.Metadata):
        return _rewrite(data, info.type)
    if isinstance(info, mi.UnionType):
        for member in info.types:
            rewritten = _rewrite(data, member)
            if rewritten is not data:
                return rewritten
        return data
    if isinstance(data, str):
        if isinstance(info, mi.FloatType):
            return _LEGACY_FLOATS.get(data, data)
        if isinstance(info, mi.DateTimeType):
            return _legacy_datetime(data)
        return data
    if isinstance(data, dict):
        if isinstance(info, mi.DataclassType | mi.TypedDictType | mi.StructType):
            fields = {field.encode_name: field.type for field in info.fields}
            return _rewrite_items(data, fields.get)
        if isinstance(info, mi.DictType):
            return _rewrite_items(data, lambda key: info.value_type)
    if isinstance(data, list):
        if isinstance(info, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
            return _rewrite_list(data, [info.item_type] * len(data))
        if isinstance(info, mi.TupleType):
            return _rewrite_list(data, list(info.item_types))
        if isinstance(info, mi.NamedTupleType):
            return _rewrite_list(data, [field.type for field in info.fields])
    return data


def _rewrite_items(data: dict[str, Any], info_of: Any) -> dict[str, Any]:
    rewritten = {
        key: (_rewrite(value, info_of(key)) if info_of(key) is not None else value) for key, value in data.items()
    }
    return data if all(rewritten[key] is data[key] for key in data) else rewritten


def _rewrite_list(data: list[Any], infos: list[mi.Type]) -> list[Any]:
    rewritten = [_rewrite(value, info) for value, info in zip(data, infos, strict=False)] + data[len(infos) :]
    return data if all(new is old for new, old in zip(rewritten, data, strict=True)) else rewritten


def _legacy_datetime(text: str) -> Any:
    """``2026-03-29T02:30:00+02:00[Europe/Paris]`` (RFC 9557), or an offset in seconds: a datetime."""
    zoned = _ZONED.fullmatch(text)
    base = zoned.group(1) if zoned else text
    if zoned is None and not _SECONDS_OFFSET.search(text):
        return text  # not one of the forms msgspec refuses: a bare date stays refused, as before
    try:
        value = datetime.fromisoformat(base)
    except ValueError:
        return text
    if zoned is None or value.tzinfo is None:
        return value
    try:
        zone = ZoneInfo(zoned.group(2))
    except (ZoneInfoNotFoundError, ValueError):
        return value  # this machine lacks the zone: keep the instant and offset
    offset = value.utcoffset()
    for fold in (0, 1):  # the fold whose offset matches: repeated and skipped wall times stay exact
        local = value.replace(tzinfo=zone, fold=fold)
        if local.utcoffset() == offset:
            return local
    return value.astimezone(zone)
