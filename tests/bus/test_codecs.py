"""`JsonCodec`: a thin layer over `jobbus.encoding`, which still reads what the earlier codec wrote.

The conversions themselves are tested in tests/test_encoding.py.
"""

from __future__ import annotations

import enum
import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict
from zoneinfo import ZoneInfo

import psycopg
import pydantic
import pytest
from psycopg.types.json import Jsonb

from jobbus.bus import Codec, CodecError, JsonCodec
from jobbus.encoding import EncodingError

codec = JsonCodec()


class Channel(enum.Enum):
    EMAIL = "email"
    SMS = "sms"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Address:
    street: str
    city: str
    zip_code: str | None = None


@dataclass(frozen=True)
class OrderPlaced:
    order_id: int
    customer: str
    total: Decimal
    placed_at: datetime
    reference: uuid.UUID
    channel: Channel
    priority: Priority
    ship_to: Address
    lines: list[str]
    quantities: dict[str, int]
    due: date
    cutoff: time
    grace: timedelta
    signature: bytes
    weight: float
    coupon: str | None = None
    kind: Literal["retail", "wholesale"] = "retail"


class Point(NamedTuple):
    x: int
    y: Decimal


@dataclass(frozen=True)
class Survey:
    taken_at: datetime
    window: timedelta
    readings: tuple[float, ...]
    corner: Point
    tags: frozenset[str]
    by_id: dict[uuid.UUID, Address]
    by_priority: dict[Priority, int]
    pair: tuple[int, str]


class Invoice(TypedDict):
    number: str
    due: datetime
    amount: Decimal
    note: NotRequired[str]


class Signup(pydantic.BaseModel):
    email: str
    at: datetime
    credit: Decimal
    tags: list[str] = []


@dataclass
class Basket:
    owner: Signup
    items: list[Signup]


class Payload(dict[str, Any]):
    """A plain-dict message class."""


#: Payloads exactly as the earlier, hand-written codec wrote them, and the messages they were written from.
EARLIER_PAYLOADS: list[tuple[str, type[Any], Any]] = [
    (
        '{"order_id": 42, "customer": "a@example.com", "total": "12.50", "placed_at": "2026-03-01T12:00:00+00:00", '
        '"reference": "01234567-89ab-cdef-0123-456789abcdef", "channel": "sms", "priority": 2, "ship_to": '
        '{"street": "Main St 1", "city": "Lyon", "zip_code": null}, "lines": ["book", "pen"], "quantities": '
        '{"book": 1, "pen": 3}, "due": "2026-03-05", "cutoff": "17:30:00", "grace": "P2DT10800.000005S", '
        '"signature": "AAFzaWc=", "weight": 1.25, "coupon": null, "kind": "retail"}',
        OrderPlaced,
        OrderPlaced(
            42,
            "a@example.com",
            Decimal("12.50"),
            datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
            uuid.UUID("01234567-89ab-cdef-0123-456789abcdef"),
            Channel.SMS,
            Priority.HIGH,
            Address("Main St 1", "Lyon"),
            ["book", "pen"],
            {"book": 1, "pen": 3},
            date(2026, 3, 5),
            time(17, 30),
            timedelta(days=2, hours=3, microseconds=5),
            b"\x00\x01sig",
            1.25,
        ),
    ),
    (
        '{"taken_at": "2026-10-25T02:30:00+01:00[Europe/Paris]", "window": "-P0DT5400.000001S", "readings": '
        '["Infinity", "-0.0", 1e+300, 0.1], "corner": [3, "-0.00"], "tags": ["a", "b"], "by_id": '
        '{"00000000-0000-0000-0000-000000000007": {"street": "Rue 2", "city": "Paris", "zip_code": "75001"}}, '
        '"by_priority": {"1": 10}, "pair": [1, "one"]}',
        Survey,
        Survey(
            datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Paris"), fold=1),
            -timedelta(minutes=90, microseconds=1),
            (math.inf, -0.0, 1e300, 0.1),
            Point(3, Decimal("-0.00")),
            frozenset({"b", "a"}),
            {uuid.UUID(int=7): Address("Rue 2", "Paris", "75001")},
            {Priority.LOW: 10},
            (1, "one"),
        ),
    ),
    (
        '{"number": "A-1", "due": "2026-05-01T09:30:00-05:00", "amount": "1E+3"}',
        Invoice,
        Invoice(
            number="A-1", due=datetime(2026, 5, 1, 9, 30, tzinfo=timezone(timedelta(hours=-5))), amount=Decimal("1E+3")
        ),
    ),
    (
        '{"email": "a@example.com", "at": "2026-01-02T03:04:05Z", "credit": "10.50", "tags": ["new"]}',
        Signup,
        Signup(
            email="a@example.com", at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), credit=Decimal("10.50"), tags=["new"]
        ),
    ),
    (
        '{"owner": {"email": "b@example.com", "at": "2026-01-02T00:00:00Z", "credit": "0", "tags": []}, "items": []}',
        Basket,
        Basket(Signup(email="b@example.com", at=datetime(2026, 1, 2, tzinfo=UTC), credit=Decimal("0")), []),
    ),
    (
        '{"name": "x", "nested": {"a": [1, 2.5, null, true]}}',
        Payload,
        Payload(name="x", nested={"a": [1, 2.5, None, True]}),
    ),
]


@pytest.mark.parametrize(("text", "cls", "expected"), EARLIER_PAYLOADS)
def test_payloads_of_the_earlier_codec_decode_to_equal_messages(text: str, cls: type[Any], expected: Any) -> None:
    decoded = codec.decode(cls, json.loads(text))
    assert type(decoded) is type(expected)
    assert decoded == expected
    if isinstance(decoded, Survey):  # what == alone does not show
        assert decoded.taken_at.tzinfo is ZoneInfo("Europe/Paris") and decoded.taken_at.fold == 1
        assert str(decoded.corner.y) == "-0.00" and math.copysign(1, decoded.readings[1]) == -1


@pytest.mark.parametrize(("text", "cls", "expected"), EARLIER_PAYLOADS)
def test_payloads_of_the_earlier_codec_decode_after_postgresql_jsonb(
    jsonb: psycopg.Connection[Any], text: str, cls: type[Any], expected: Any
) -> None:
    row = jsonb.execute("SELECT %s::jsonb", [Jsonb(json.loads(text))]).fetchone()  # jsonb writes 1e300 as an integer
    assert row is not None
    assert codec.decode(cls, row[0]) == expected


def test_a_nan_the_earlier_codec_wrote_decodes_as_nan() -> None:
    (value,) = codec.decode(tuple[float], ["NaN"])
    assert math.isnan(value)


@pytest.mark.parametrize(("text", "cls", "expected"), [case for case in EARLIER_PAYLOADS if case[1] is not Survey])
def test_new_payloads_keep_the_earlier_form_where_it_was_already_standard(
    text: str, cls: type[Any], expected: Any
) -> None:
    """Field names, Decimals as strings, UUIDs, enums by value, base64 bytes: unchanged; datetimes are RFC 3339.

    (The survey is left out: it holds an Infinity, which the earlier codec wrote as a string and which
    is now refused at dispatch.)
    """
    earlier, new = json.loads(text), codec.encode(expected)
    assert new.keys() == earlier.keys()
    assert codec.decode(cls, new) == expected


@pytest.fixture(scope="module")
def jsonb(admin_dsn: str) -> Any:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        yield conn


def test_json_codec_is_a_codec_over_jobbus_encoding() -> None:
    assert isinstance(JsonCodec(), Codec)
    assert JsonCodec().name == "json"
    assert issubclass(CodecError, EncodingError)


def test_codec_errors_name_the_path() -> None:
    with pytest.raises(CodecError, match=r"message\[0\]: Object missing required field `street`"):
        codec.decode(list[Address], [{"city": "Lyon"}])
    with pytest.raises(CodecError, match=r"message\.owner: 2 validation errors for Signup\nat\n  Field required"):
        codec.decode(Basket, {"owner": {"email": "b@example.com"}, "items": []})
    with pytest.raises(CodecError, match=r"message\[0\]: cannot encode builtins\.complex values"):
        codec.encode([1j])
