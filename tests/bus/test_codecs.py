"""`JsonCodec`: exact round trips (property-based), through JSON text and through PostgreSQL jsonb."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict
from zoneinfo import ZoneInfo

import psycopg
import pydantic
import pytest
import typing_extensions
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from jobbus.bus import Codec, CodecError, JsonCodec

codec = JsonCodec()


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Leaf:
    at: datetime
    day: date
    clock: time
    ident: uuid.UUID
    mood: Mood
    level: Level
    amount: Decimal
    ratio: float
    span: timedelta
    note: str | None
    blob: bytes


@dataclass(frozen=True)
class Tree:
    leaf: Leaf
    leaves: list[Leaf]
    pair: tuple[int, str]
    amounts: tuple[Decimal, ...]
    tags: frozenset[str]
    by_id: dict[uuid.UUID, Leaf]
    by_level: dict[Level, int]
    maybe: Leaf | None
    either: int | str
    moment: datetime | date
    flag: bool
    kind: Literal["a", "b"]


class Point(NamedTuple):
    x: int
    y: Decimal


class Shipment(TypedDict):
    due: datetime
    points: list[Point]
    note: NotRequired[str]


class LegacyShipment(typing_extensions.TypedDict):
    """typing_extensions.TypedDict, which typing.is_typeddict does not recognise on Python 3.11."""

    due: datetime
    note: typing_extensions.NotRequired[str]


class Price(pydantic.BaseModel):
    amount: Decimal
    at: datetime


@dataclass
class Basket:
    price: Price
    prices: list[Price]


class Payload(dict[str, Any]):
    """A plain-dict message class."""


# -- exact comparison -------------------------------------------------------------------------------


def assert_same(original: Any, decoded: Any, path: str = "value") -> None:
    """Equal, and of the same types all the way down: what `==` alone would not prove."""
    assert type(decoded) is type(original), f"{path}: {type(decoded)} is not {type(original)}"
    if dataclasses.is_dataclass(original):
        for f in dataclasses.fields(original):
            assert_same(getattr(original, f.name), getattr(decoded, f.name), f"{path}.{f.name}")
    elif isinstance(original, Decimal):
        assert str(decoded) == str(original), f"{path}: {decoded!s} != {original!s}"
    elif isinstance(original, float):
        if math.isnan(original):
            assert math.isnan(decoded), path
        else:
            assert decoded == original and math.copysign(1, decoded) == math.copysign(1, original), path
    elif isinstance(original, datetime):
        assert decoded.replace(tzinfo=None) == original.replace(tzinfo=None), path
        assert decoded.utcoffset() == original.utcoffset(), path
        assert type(decoded.tzinfo) is type(original.tzinfo), path
        if isinstance(original.tzinfo, ZoneInfo):
            assert decoded.tzinfo is original.tzinfo, path
    elif isinstance(original, list | tuple):
        assert len(decoded) == len(original), path
        for index, (a, b) in enumerate(zip(original, decoded, strict=True)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(original, Mapping):
        assert list(map(type, decoded)) == list(map(type, original)), path
        assert decoded.keys() == original.keys(), path
        for key in original:
            assert_same(original[key], decoded[key], f"{path}[{key!r}]")
    else:
        assert decoded == original, f"{path}: {decoded!r} != {original!r}"


def round_trip(value: Any, cls: Any) -> Any:
    """Encode, store as JSON text and read back (what the bus does), then decode."""
    return codec.decode(cls, json.loads(json.dumps(codec.encode(value))))


# -- strategies -------------------------------------------------------------------------------------

any_text = st.text()
storable_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))  # what jsonb takes


def zones() -> st.SearchStrategy[Any]:
    fixed = st.integers(-23 * 60, 23 * 60).map(lambda minutes: timezone(timedelta(minutes=minutes)))
    return st.none() | st.just(UTC) | fixed | st.timezones()


def leaves(text: st.SearchStrategy[str]) -> st.SearchStrategy[Leaf]:
    return st.builds(
        Leaf,
        at=st.datetimes(timezones=zones()),
        day=st.dates(),
        clock=st.times(timezones=st.none() | st.just(UTC)),
        ident=st.uuids(),
        mood=st.sampled_from(Mood),
        level=st.sampled_from(Level),
        amount=st.decimals(allow_nan=True, allow_infinity=True),
        ratio=st.floats(),
        span=st.timedeltas(),
        note=st.none() | text,
        blob=st.binary(max_size=16),
    )


def trees(text: st.SearchStrategy[str] = any_text) -> st.SearchStrategy[Tree]:
    leaf = leaves(text)
    return st.builds(
        Tree,
        leaf=leaf,
        leaves=st.lists(leaf, max_size=3),
        pair=st.tuples(st.integers(), text),
        amounts=st.lists(st.decimals(allow_nan=False), max_size=4).map(tuple),
        tags=st.frozensets(text, max_size=4),
        by_id=st.dictionaries(st.uuids(), leaf, max_size=2),
        by_level=st.dictionaries(st.sampled_from(Level), st.integers(), max_size=2),
        maybe=st.none() | leaf,
        either=st.integers() | text.filter(lambda s: s not in ("true", "false")),
        moment=st.datetimes(timezones=zones()) | st.dates(),
        flag=st.booleans(),
        kind=st.sampled_from(["a", "b"]),
    )


# -- property-based round trips ---------------------------------------------------------------------


@settings(max_examples=300)
@given(trees())
def test_nested_dataclasses_round_trip_exactly(tree: Tree) -> None:
    assert_same(tree, round_trip(tree, Tree))


@given(st.decimals(allow_nan=True, allow_infinity=True))
def test_decimals_keep_digits_exponent_and_sign(amount: Decimal) -> None:
    assert str(round_trip(amount, Decimal)) == str(amount)


@given(st.datetimes(timezones=zones()))
def test_datetimes_keep_wall_time_offset_and_zone(moment: datetime) -> None:
    assert_same(moment, round_trip(moment, datetime))


@given(st.builds(Shipment, due=st.datetimes(timezones=zones()), points=st.lists(st.builds(Point))))
def test_typeddicts_round_trip_with_their_hints(shipment: Shipment) -> None:
    assert_same(shipment, round_trip(shipment, Shipment))


def test_typing_extensions_typeddicts_decode_with_their_hints() -> None:
    due = datetime(2026, 1, 1, tzinfo=UTC)
    assert_same(LegacyShipment(due=due), round_trip(LegacyShipment(due=due), LegacyShipment))
    with pytest.raises(CodecError, match="key 'due' of LegacyShipment is missing"):
        codec.decode(LegacyShipment, {"note": "x"})


@pytest.fixture(scope="module")
def jsonb(admin_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        yield conn


@settings(max_examples=60, deadline=None)
@given(trees(storable_text))
def test_round_trip_through_postgresql_jsonb(jsonb: psycopg.Connection[Any], tree: Tree) -> None:
    row = jsonb.execute("SELECT %s::jsonb", [Jsonb(codec.encode(tree))]).fetchone()
    assert row is not None
    assert_same(tree, codec.decode(Tree, row[0]))


@settings(deadline=None)
@given(st.lists(st.floats(), max_size=8))
def test_floats_round_trip_through_postgresql_jsonb(jsonb: psycopg.Connection[Any], floats: list[float]) -> None:
    row = jsonb.execute("SELECT %s::jsonb", [Jsonb(codec.encode(floats))]).fetchone()
    assert row is not None
    assert_same(floats, codec.decode(list[float], row[0]))


def test_large_floats_survive_jsonb_writing_them_as_integers(jsonb: psycopg.Connection[Any]) -> None:
    row = jsonb.execute("SELECT %s::jsonb", [Jsonb(codec.encode([1e300, 5e-324, -0.0]))]).fetchone()
    assert row is not None and isinstance(row[0][0], int)  # what jsonb does to 1e300
    assert_same((1e300, 5e-324, -0.0), codec.decode(tuple[float, float, float], row[0]))


# -- specific behaviour -----------------------------------------------------------------------------


def test_json_codec_is_a_codec() -> None:
    assert isinstance(JsonCodec(), Codec)
    assert JsonCodec().name == "json"


@pytest.mark.parametrize("fold", [0, 1])
def test_ambiguous_and_skipped_local_times_keep_their_fold(fold: int) -> None:
    paris = ZoneInfo("Europe/Paris")
    for wall in (datetime(2026, 10, 25, 2, 30, tzinfo=paris), datetime(2026, 3, 29, 2, 30, tzinfo=paris)):
        moment = wall.replace(fold=fold)
        text = codec.encode(moment)
        assert text.endswith("[Europe/Paris]")
        decoded = codec.decode(datetime, text)
        assert (decoded.fold, decoded.utcoffset(), decoded.tzinfo) == (fold, moment.utcoffset(), paris)


def test_unknown_zone_on_the_decoding_side_keeps_the_instant_and_offset() -> None:
    decoded = codec.decode(datetime, "2026-01-01T10:00:00+01:00[Nowhere/Atlantis]")
    assert decoded == datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
    assert decoded.utcoffset() == timedelta(hours=1)


def test_decimals_are_strings_in_the_payload() -> None:
    assert codec.encode({"a": Decimal("1.10"), "b": Decimal("-0"), "c": Decimal("1E+3")}) == {
        "a": "1.10",
        "b": "-0",
        "c": "1E+3",
    }


def test_payload_is_readable_json() -> None:
    leaf = Leaf(
        at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=ZoneInfo("Europe/Berlin")),
        day=date(2026, 1, 2),
        clock=time(3, 4, 5),
        ident=uuid.UUID(int=1),
        mood=Mood.HAPPY,
        level=Level.HIGH,
        amount=Decimal("2.50"),
        ratio=math.inf,
        span=timedelta(days=1, seconds=2, microseconds=3),
        note=None,
        blob=b"hi",
    )
    assert codec.encode(leaf) == {
        "at": "2026-01-02T03:04:05+01:00[Europe/Berlin]",
        "day": "2026-01-02",
        "clock": "03:04:05",
        "ident": "00000000-0000-0000-0000-000000000001",
        "mood": "happy",
        "level": 2,
        "amount": "2.50",
        "ratio": "Infinity",
        "span": "P1DT2.000003S",
        "note": None,
        "blob": "aGk=",
    }


def test_pydantic_models_round_trip_alone_and_nested() -> None:
    price = Price(amount=Decimal("9.90"), at=datetime(2026, 1, 1, tzinfo=UTC))
    basket = Basket(price=price, prices=[price, price])
    assert round_trip(price, Price) == price
    decoded = round_trip(basket, Basket)
    assert decoded == basket and str(decoded.prices[1].amount) == "9.90"


def test_pydantic_stays_optional_at_runtime() -> None:
    code = "import sys, jobbus.bus; print('pydantic' in sys.modules)"
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert output.strip() == "False"


def test_plain_dict_messages_keep_json_values() -> None:
    payload = Payload(name="x", count=3, nested={"a": [1, 2.5, None, True]})
    decoded = round_trip(payload, Payload)
    assert type(decoded) is Payload and decoded == payload


def test_fields_typed_any_get_the_json_form_back() -> None:
    @dataclass
    class Loose:
        data: Any
        items: list[Any] = field(default_factory=list)

    decoded = round_trip(Loose({"k": Decimal("1.5")}, [uuid.UUID(int=2)]), Loose)
    assert decoded == Loose({"k": "1.5"}, ["00000000-0000-0000-0000-000000000002"])


def test_unions_sharing_a_json_form_decode_to_the_most_specific_member() -> None:
    """Documented: `str | UUID` brings a UUID-shaped string back as a UUID; prefer distinct types."""
    looks_like_uuid = str(uuid.UUID(int=3))
    assert codec.decode(str | uuid.UUID, looks_like_uuid) == uuid.UUID(int=3)  # type: ignore[arg-type]
    assert codec.decode(str | uuid.UUID, "plain") == "plain"  # type: ignore[arg-type]
    assert codec.decode(float | int, 3) == 3 and type(codec.decode(float | int, 3)) is int  # type: ignore[arg-type]


@dataclass(frozen=True)
class Cat:
    name: str
    lives: int


@dataclass(frozen=True)
class Dog:
    name: str
    good: bool


@dataclass(frozen=True)
class Home:
    pet: Cat | Dog


def test_unions_of_dataclasses_pick_the_member_whose_fields_match() -> None:
    assert round_trip(Home(Dog("rex", True)), Home) == Home(Dog("rex", True))
    assert round_trip(Home(Cat("tom", 9)), Home) == Home(Cat("tom", 9))


@dataclass(frozen=True)
class EventV2:
    id: int
    source: str = "web"
    labels: Sequence[str] = ()


def test_old_payloads_decode_after_fields_are_added_or_removed() -> None:
    assert codec.decode(EventV2, {"id": 1}) == EventV2(1)
    assert codec.decode(EventV2, {"id": 1, "removed_field": True, "labels": ["a"]}) == EventV2(1, labels=["a"])


def test_container_types_are_rebuilt() -> None:
    assert codec.decode(frozenset[int], [1, 2]) == frozenset({1, 2})
    assert type(codec.decode(set[int], [1])) is set
    assert codec.decode(tuple[()], []) == ()
    assert codec.decode(dict[int, Level], {"1": 2}) == {1: Level.HIGH}
    assert codec.decode(dict[Level, str], {"1": "x"}) == {Level.LOW: "x"}
    assert codec.decode(Mapping[datetime, bool], {"2026-01-01T00:00:00+00:00": True}) == {  # type: ignore[type-abstract]
        datetime(2026, 1, 1, tzinfo=UTC): True
    }
    assert codec.encode({1: "a", uuid.UUID(int=0): "b"}) == {"1": "a", "00000000-0000-0000-0000-000000000000": "b"}
    assert codec.encode({3, 1, 2}) == [1, 2, 3]


@pytest.mark.parametrize(
    ("cls", "data", "message"),
    [
        (Leaf, {"at": "2026-01-01T00:00:00"}, "message: field 'day' of Leaf is missing"),
        (Home, {"pet": {"name": "x"}}, "message.pet: an object ({'name': 'x'}) matches no member of Cat | Dog"),
        (Tree, [], "message: expected an object for Tree, got an array"),
        (Mood, "angry", "message: 'angry' is not a value of Mood ('happy', 'sad')"),
        (Point, [1, "x"], "message.y: 'x' is not a decimal number"),
        (Shipment, {"points": []}, "message: key 'due' of Shipment is missing"),
        (list[int], [1, True], "message[1]: expected an integer, got a boolean"),
        (datetime, "2026-01-01", "is a date, not a datetime"),
        (timedelta, "1 day", "is not a duration"),
        (Literal["a", "b"], "c", "'c' is not one of 'a', 'b'"),
        (bytes, "***", "is not base64"),
        (complex, 1, "the JSON codec cannot decode into complex"),
    ],
)
def test_decode_errors_name_the_path_and_the_problem(cls: Any, data: Any, message: str) -> None:
    with pytest.raises(CodecError) as error:
        codec.decode(cls, data)
    assert message in str(error.value)


def test_encode_errors_name_the_field_and_the_fix() -> None:
    @dataclass
    class Holder:
        value: Any

    with pytest.raises(CodecError, match=r"message\.value\[0\]: the JSON codec cannot encode complex values"):
        codec.encode(Holder([1j]))
    with pytest.raises(CodecError, match="cannot become a JSON object key"):
        codec.encode({(1, 2): "tuple key"})
