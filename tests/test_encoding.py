"""`jobbus.encoding`: values round-trip through JSON exactly, or are refused with the field that would change."""

from __future__ import annotations

import dataclasses
import enum
import math
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict
from zoneinfo import ZoneInfo

import psycopg
import pydantic
import pytest
import typing_extensions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from pydantic.alias_generators import to_camel

from jobbus import encoding
from jobbus.encoding import EncodingError
from tests.lossy import Account, Login, Profile, Reading, Reference

# -- generated types, each with a strategy for its values ---------------------------------------------

Typed = tuple[Any, st.SearchStrategy[Any]]


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)  # what jsonb stores
minute_offsets = st.integers(-23 * 60, 23 * 60).map(lambda minutes: timezone(timedelta(minutes=minutes)))
datetimes = st.datetimes(timezones=st.none() | st.just(UTC) | minute_offsets)

SCALARS: list[Typed] = [
    (int, st.integers(-(2**63), 2**64 - 1)),
    (str, text),
    (bool, st.booleans()),
    (float, st.floats(allow_nan=False, allow_infinity=False)),
    (Decimal, st.decimals(allow_nan=False, allow_infinity=False)),
    (uuid.UUID, st.uuids()),
    (datetime, datetimes),
    (date, st.dates()),
    (time, st.times(timezones=st.none() | st.just(UTC))),
    (timedelta, st.timedeltas(min_value=timedelta(days=-(10**6)), max_value=timedelta(days=10**6))),
    (Color, st.sampled_from(Color)),
    (Level, st.sampled_from(Level)),
    (Literal["a", "b"], st.sampled_from(["a", "b"])),
]
#: Scalars pydantic's JSON mode keeps exactly (no bytes: pydantic writes them as UTF-8 text by default).
HASHABLE_KEYS: list[Typed] = [
    (str, text),
    (int, st.integers()),
    (uuid.UUID, st.uuids()),
    (Level, st.sampled_from(Level)),
]
#: Unions JSON can tell apart: at most one member per JSON kind.
UNIONS: list[Typed] = [
    (int | str, st.integers() | text),
    (float | str, st.floats(allow_nan=False, allow_infinity=False) | text),
    (uuid.UUID | int, st.uuids() | st.integers()),
    (list[int] | str, st.lists(st.integers(), max_size=3) | text),
]
_counter = iter(range(10**9))


def generic(origin: Any, *args: Any) -> Any:
    """`origin[args]` for annotations built at run time."""
    return origin[args if len(args) > 1 else args[0]]


def _scalars(with_bytes: bool) -> st.SearchStrategy[Typed]:
    extra: list[Typed] = [(bytes, st.binary(max_size=8))] if with_bytes else []
    return st.sampled_from([*SCALARS, *UNIONS, *extra])


def typed(depth: int = 2, *, with_bytes: bool = True) -> st.SearchStrategy[Typed]:
    """An annotation (scalar, container, union, dataclass, TypedDict or pydantic model) and its values."""
    leaves = _scalars(with_bytes)
    if depth == 0:
        return leaves
    inner = typed(depth - 1, with_bytes=with_bytes)
    return st.one_of(
        leaves,
        inner.map(lambda t: (generic(list, t[0]), st.lists(t[1], max_size=3))),
        inner.map(lambda t: (generic(tuple, t[0], ...), st.lists(t[1], max_size=3).map(tuple))),
        inner.map(lambda t: (t[0] | None, st.none() | t[1])),
        st.tuples(st.sampled_from(HASHABLE_KEYS), inner).map(
            lambda kv: (generic(dict, kv[0][0], kv[1][0]), st.dictionaries(kv[0][1], kv[1][1], max_size=3))
        ),
        st.sampled_from(HASHABLE_KEYS).map(lambda t: (generic(frozenset, t[0]), st.frozensets(t[1], max_size=3))),
        st.lists(inner, min_size=1, max_size=4).flatmap(dataclass_of),
        st.lists(inner, min_size=1, max_size=3).map(typeddict_of),
        st.lists(typed(depth - 1, with_bytes=False), min_size=1, max_size=4).flatmap(model_of),
    )


def dataclass_of(fields: list[Typed]) -> st.SearchStrategy[Typed]:
    def build(frozen: bool, defaults: list[bool]) -> Typed:
        specs: list[tuple[str, Any, Any]] = []
        for index, ((annotation, _), has_default) in enumerate(zip(fields, defaults, strict=True)):
            default = dataclasses.field(default=None) if has_default else dataclasses.MISSING
            specs.append((f"f{index}", annotation | None if has_default else annotation, default))
        ordered = sorted(specs, key=lambda spec: spec[2] is not dataclasses.MISSING)  # defaults last
        cls = dataclasses.make_dataclass(f"Generated{next(_counter)}", ordered, frozen=frozen)
        strategies = {
            name: (st.none() | fields[int(name[1:])][1])
            if default is not dataclasses.MISSING
            else fields[int(name[1:])][1]
            for name, _, default in ordered
        }
        return cls, st.builds(cls, **strategies)

    return st.tuples(st.booleans(), st.lists(st.booleans(), min_size=len(fields), max_size=len(fields))).map(
        lambda flags: build(*flags)
    )


def typeddict_of(fields: list[Typed]) -> Typed:
    make_typeddict: Any = typing_extensions.TypedDict  # pydantic asks for typing_extensions' on Python < 3.12
    cls = make_typeddict(f"GeneratedDict{next(_counter)}", {f"k{i}": t[0] for i, t in enumerate(fields)})
    return cls, st.fixed_dictionaries({f"k{i}": t[1] for i, t in enumerate(fields)})


def model_of(fields: list[Typed]) -> st.SearchStrategy[Typed]:
    """A pydantic model whose fields may carry an alias, separate validation/serialization aliases, or a
    camelCase alias generator."""

    def build(alias_kinds: list[int], camel: bool) -> Typed:
        definitions: dict[str, Any] = {}
        argument_names: dict[str, str] = {}
        for index, ((annotation, _), kind) in enumerate(zip(fields, alias_kinds, strict=True)):
            name = f"field_{index}"
            if kind == 1:
                definitions[name] = (annotation, pydantic.Field(alias=f"alias{index}"))
                argument_names[name] = f"alias{index}"
            elif kind == 2:
                definitions[name] = (
                    annotation,
                    pydantic.Field(validation_alias=f"in{index}", serialization_alias=f"out{index}"),
                )
                argument_names[name] = f"in{index}"
            else:
                definitions[name] = (annotation, ...)
                argument_names[name] = to_camel(name) if camel else name
        config = pydantic.ConfigDict(alias_generator=to_camel) if camel else None
        model = pydantic.create_model(f"GeneratedModel{next(_counter)}", __config__=config, **definitions)
        values = st.fixed_dictionaries({argument_names[f"field_{i}"]: t[1] for i, t in enumerate(fields)}).map(
            lambda kwargs: model(**kwargs)
        )
        return model, values

    return st.tuples(st.lists(st.integers(0, 2), min_size=len(fields), max_size=len(fields)), st.booleans()).map(
        lambda args: build(*args)
    )


# -- the properties -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_types_round_trip_exactly(data: st.DataObject) -> None:
    annotation, values = data.draw(typed())
    value = data.draw(values)
    payload = encoding.encode(value, annotation)
    assert encoding.decode(payload, annotation) == value


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_generated_types_round_trip_through_postgresql_jsonb(
    jsonb: psycopg.Connection[Any], data: st.DataObject
) -> None:
    annotation, values = data.draw(typed())
    value = data.draw(values)
    row = jsonb.execute("SELECT %s::jsonb", [Jsonb(encoding.encode(value, annotation))]).fetchone()
    assert row is not None
    assert encoding.decode(row[0], annotation) == value


@dataclass
class Loose:
    """Fields whose JSON form can lose the value: `encode` must refuse those values, not change them."""

    anything: Any
    either: float | str
    tags: list[str]


loose_values = st.builds(
    Loose,
    anything=st.one_of(st.integers(), text, st.decimals(), st.uuids(), st.tuples(st.integers()), st.lists(text)),
    either=st.floats() | text,
    tags=st.lists(text).map(tuple) | st.lists(text),
)


@settings(max_examples=200)
@given(loose_values)
def test_a_value_either_round_trips_exactly_or_is_refused(value: Loose) -> None:
    try:
        payload = encoding.encode(value, Loose, what="message")
    except EncodingError as error:
        assert str(error).startswith("message.")
        return
    assert encoding.decode(payload, Loose) == value


@pytest.fixture(scope="module")
def jsonb(admin_dsn: str) -> Any:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        yield conn


# -- what was reported: each case round-trips exactly or is refused clearly ----------------------------


class CamelAccount(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=to_camel)
    user_id: int
    created_at: datetime


def test_a_masked_secret_is_refused_not_sent_as_stars() -> None:
    with pytest.raises(EncodingError, match=r"message\.password does not survive JSON unchanged.*masked secret"):
        encoding.encode(Login(user="ann", password=pydantic.SecretStr("hunter2")), Login, what="message")


def test_a_field_excluded_from_serialisation_is_refused_not_reset_to_its_default() -> None:
    with pytest.raises(EncodingError, match=r"message\.cache_key .* sent str 'k-1', it would arrive as str ''"):
        encoding.encode(Profile(name="ann", cache_key="k-1"), Profile, what="message")
    assert encoding.decode(encoding.encode(Profile(name="ann"), Profile), Profile) == Profile(name="ann")


@pytest.mark.parametrize(
    "value",
    [
        Account.model_validate({"userId": 7, "displayIn": "Ann"}),
        CamelAccount.model_validate({"userId": 8, "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}),
    ],
)
def test_pydantic_models_with_aliases_round_trip(value: pydantic.BaseModel) -> None:
    payload = encoding.encode(value, type(value))
    assert payload == value.model_dump(mode="json")  # by field name, which validation accepts too
    assert encoding.decode(payload, type(value)) == value


def test_pydantic_payloads_written_by_alias_decode_too() -> None:
    value = CamelAccount.model_validate({"userId": 8, "createdAt": datetime(2026, 1, 1, tzinfo=UTC)})
    assert encoding.decode(value.model_dump(mode="json", by_alias=True), CamelAccount) == value


def test_a_union_whose_members_share_a_json_form_is_refused() -> None:
    looks_like_a_uuid = str(uuid.UUID(int=3))
    with pytest.raises(EncodingError, match=r"str \| uuid\.UUID.*JSON cannot tell such members apart"):
        encoding.encode(Reference(looks_like_a_uuid), Reference, what="message")


def test_a_nan_string_stays_a_string_and_a_nan_float_is_refused() -> None:
    assert encoding.decode(encoding.encode(Reading("NaN"), Reading), Reading) == Reading("NaN")
    assert type(encoding.decode(encoding.encode(Reading("NaN"), Reading), Reading).value) is str
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(EncodingError, match=r"message\.value is (nan|inf|-inf): JSON has no NaN or Infinity"):
            encoding.encode(Reading(value), Reading, what="message")


# -- comparisons where `==` says nothing useful ------------------------------------------------------


@dataclass(eq=False)
class Identity:
    name: str
    at: datetime


def test_dataclasses_without_eq_are_compared_field_by_field() -> None:
    value = Identity("x", datetime(2026, 1, 1, tzinfo=UTC))
    decoded = encoding.decode(encoding.encode(value, Identity), Identity)
    assert (decoded.name, decoded.at) == (value.name, value.at)
    with pytest.raises(EncodingError, match=r"value\.at does not survive"):
        encoding.encode(Identity("x", datetime(1800, 1, 1, tzinfo=ZoneInfo("Europe/Paris"))), Identity)


def test_decimals_keep_their_digits_and_nans() -> None:
    amounts = [Decimal("1.10"), Decimal("-0"), Decimal("1E+3"), Decimal("NaN"), Decimal("sNaN"), Decimal("-Infinity")]
    payload = encoding.encode(amounts, list[Decimal])
    assert payload == ["1.10", "-0", "1E+3", "NaN", "sNaN", "-Infinity"]
    assert [str(amount) for amount in encoding.decode(payload, list[Decimal])] == [str(a) for a in amounts]


@pytest.mark.parametrize("fold", [0, 1])
def test_zoned_datetimes_arrive_with_their_wall_time_and_offset(fold: int) -> None:
    """RFC 3339 has no zone names: a ZoneInfo datetime arrives with a fixed offset, even in a repeated hour."""
    paris = ZoneInfo("Europe/Paris")
    for wall in (datetime(2026, 10, 25, 2, 30, tzinfo=paris), datetime(2026, 3, 29, 12, 0, tzinfo=paris)):
        moment = wall.replace(fold=fold)
        decoded = encoding.decode(encoding.encode(moment, datetime), datetime)
        assert decoded.replace(tzinfo=None) == moment.replace(tzinfo=None)
        assert decoded.utcoffset() == moment.utcoffset()


def test_an_offset_in_seconds_is_refused() -> None:
    moment = datetime(2026, 1, 1, tzinfo=timezone(timedelta(seconds=561)))
    with pytest.raises(EncodingError, match="whole minutes"):
        encoding.encode(moment, datetime)


def test_an_int_for_a_float_field_is_accepted_and_a_tuple_for_a_list_field_is_refused() -> None:
    @dataclass
    class Mixed:
        ratio: float
        items: list[int]

    assert encoding.decode(encoding.encode(Mixed(3, [1]), Mixed), Mixed) == Mixed(3.0, [1])
    with pytest.raises(EncodingError, match=r"value\.items .* sent tuple \(1, 2\), it would arrive as list \[1, 2\]"):
        encoding.encode(Mixed(1.0, (1, 2)), Mixed)  # type: ignore[arg-type]


def test_pydantic_private_attributes_that_would_be_lost_are_refused() -> None:
    class Session(pydantic.BaseModel):
        user: str
        _token: str = pydantic.PrivateAttr(default="")

    session = Session(user="ann")
    assert encoding.decode(encoding.encode(session, Session), Session) == session
    session._token = "secret"
    with pytest.raises(EncodingError, match="private attributes"):
        encoding.encode(session, Session)


# -- shapes and JSON forms ----------------------------------------------------------------------------


class Point(NamedTuple):
    x: int
    y: Decimal


class Shipment(TypedDict):
    due: datetime
    points: list[Point]
    note: NotRequired[str]


class Payload(dict[str, Decimal]):
    """A dict subclass: its values decode with the declared value type."""


class Name(str):
    pass


def test_json_forms_are_readable() -> None:
    shipment = Shipment(due=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), points=[Point(1, Decimal("2.50"))])
    assert encoding.encode(shipment, Shipment) == {"due": "2026-01-02T03:04:05Z", "points": [[1, "2.50"]]}
    assert encoding.encode(
        (uuid.UUID(int=1), timedelta(days=1, seconds=30), b"hi", Color.RED, Level.HIGH, date(2026, 1, 2)),
        tuple[uuid.UUID, timedelta, bytes, Color, Level, date],
    ) == ["00000000-0000-0000-0000-000000000001", "P1DT30S", "aGk=", "red", 2, "2026-01-02"]


def test_dict_subclasses_and_str_subclasses_keep_their_class() -> None:
    payload = Payload(total=Decimal("1.50"))
    decoded = encoding.decode(encoding.encode(payload, Payload), Payload)
    assert type(decoded) is Payload and decoded == payload
    assert type(encoding.decode(encoding.encode(Name("ann"), Name), Name)) is Name


def test_unknown_fields_are_ignored_and_missing_fields_take_their_default() -> None:
    @dataclass
    class EventV2:
        id: int
        source: str = "web"

    assert encoding.decode({"id": 1, "removed_field": True}, EventV2) == EventV2(1)


@pytest.mark.parametrize(
    ("value", "type_", "message"),
    [
        ({"a": [1j]}, dict[str, list[Any]], r"message\['a'\]\[0\]: cannot encode builtins\.complex values"),
        ("a\x00b", str, "message contains a NUL character, which PostgreSQL jsonb cannot store"),
        ("\ud800", str, "message contains a lone surrogate character"),
        ({(1, 2): "x"}, dict[Any, str], "message: cannot encode builtins.tuple values"),
    ],
)
def test_encode_errors_name_the_field_and_the_problem(value: Any, type_: Any, message: str) -> None:
    with pytest.raises(EncodingError, match=message):
        encoding.encode(value, type_, what="message")


def test_a_backslash_before_u0000_is_text_not_a_nul() -> None:
    assert encoding.encode("a\\u0000", str) == "a\\u0000"


@pytest.mark.parametrize(
    ("data", "type_", "message"),
    [
        (
            {"due": "2026-01-01T00:00:00Z", "points": [[1, "x"]]},
            Shipment,
            r"message\.points\[0\]\[1\]: Invalid decimal",
        ),
        ({"points": []}, Shipment, "message: Object missing required field `due`"),
        ([1, True], list[int], r"message\[1\]: Expected `int`, got `bool`"),
        ("2026-01-01", datetime, "Invalid RFC3339 encoded datetime"),  # a date is not a datetime
        ("2026-01-01T00:00:00+01:00[Europe/Paris", datetime, "Invalid RFC3339 encoded datetime"),
        ({"user": "a"}, Login, r"message: 1 validation error for Login\npassword"),
    ],
)
def test_decode_errors_name_the_path_and_the_problem(data: Any, type_: Any, message: str) -> None:
    with pytest.raises(EncodingError, match=message):
        encoding.decode(data, type_, what="message")


def test_unresolvable_type_hints_say_what_to_do() -> None:
    @dataclass
    class Local:
        thing: Missing  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(EncodingError, match=r"cannot be resolved .* define the types they name at module level"):
        encoding.decode({"thing": 1}, Local)


# -- payloads of the earlier, hand-written codec --------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "type_", "expected"),
    [
        (
            "2026-10-25T02:30:00+01:00[Europe/Paris]",
            datetime,
            datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris")),
        ),
        ("1800-01-01T00:00:00+00:09:21[Europe/Paris]", datetime, datetime(1800, 1, 1, tzinfo=ZoneInfo("Europe/Paris"))),
        ("2026-01-01T10:00:00+01:00[Nowhere/Atlantis]", datetime, datetime(2026, 1, 1, 9, tzinfo=UTC)),
        (["Infinity", "-Infinity", "-0.0", 1e300], list[float], [math.inf, -math.inf, -0.0, 1e300]),
        ("-P0DT5400.000001S", timedelta, -timedelta(seconds=5400, microseconds=1)),
        ({"1": "x"}, dict[Level, str], {Level.LOW: "x"}),
    ],
)
def test_earlier_payload_forms_still_decode(data: Any, type_: Any, expected: Any) -> None:
    decoded = encoding.decode(data, type_)
    assert decoded == expected
    if isinstance(expected, datetime):
        assert (decoded.utcoffset(), decoded.tzinfo, decoded.fold) == (
            expected.utcoffset(),
            expected.tzinfo,
            expected.fold,
        ) or expected.tzinfo is UTC


def test_an_earlier_nan_float_decodes_as_nan() -> None:
    (value,) = encoding.decode(["NaN"], list[float])
    assert math.isnan(value)


# -- optional pydantic ----------------------------------------------------------------------------------


def test_pydantic_stays_optional_at_runtime() -> None:
    code = "import sys, jobbus.encoding, jobbus.bus; print('pydantic' in sys.modules)"
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert output.strip() == "False"


def test_the_public_api_is_small() -> None:
    assert sorted(encoding.__all__) == ["EncodingError", "JsonValue", "decode", "encode", "require_same", "to_json"]
    check: Callable[..., None] = encoding.require_same
    check(1, 1.0)
