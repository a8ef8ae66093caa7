"""Encode/decode speed of the bus's JSON codec: the earlier hand-written codec against jobbus.encoding.

    .venv/bin/python bench/codec.py                     # the table of docs/benchmarks.md, "Message encoding"
    .venv/bin/python bench/codec.py --baseline 301ce29  # the commit whose bus/codecs.py is the earlier codec

No database: pure CPU, one thread. The earlier codec is read from git (`git show REV:src/jobbus/bus/codecs.py`)
and imported beside the current one. Two operations per message, each what the bus does:

- *dispatch*: what `dispatch` does to a message before it writes anything. Earlier: encode, a JSON text
  round trip, decode back (which proved decodability, not equality). Now: `jobbus.encoding.encode`,
  which encodes, decodes back and proves the decoded message equal to the original.
- *worker decode*: what a worker does with the payload it reads from jsonb: `JsonCodec.decode`.

Each figure is the best of 5 runs of ~0.2 s (ops/s, higher is better).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import pydantic

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jobbus import encoding  # noqa: E402
from jobbus.bus import JsonCodec  # noqa: E402

#: The last commit whose src/jobbus/bus/codecs.py converted values by hand.
EARLIER_CODEC_COMMIT = "301ce29"


@dataclass(frozen=True)
class OrderPlaced:
    """Small: four scalar fields."""

    order_id: int
    customer: str
    total: Decimal
    placed_at: datetime


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    price: Decimal


@dataclass(frozen=True)
class Address:
    street: str
    city: str
    zip_code: str | None = None


@dataclass(frozen=True)
class Order:
    """Nested: a dataclass holding dataclasses, a list of ten of them, a dict and optionals."""

    order_id: uuid.UUID
    placed_at: datetime
    ship_to: Address
    bill_to: Address | None
    lines: list[Line]
    tags: dict[str, str] = field(default_factory=dict)


class Signup(pydantic.BaseModel):
    """A pydantic model with a nested list."""

    email: str
    at: datetime
    credit: Decimal
    tags: list[str] = []


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MESSAGES: list[tuple[str, type[Any], Any]] = [
    ("small dataclass", OrderPlaced, OrderPlaced(42, "a@example.com", Decimal("12.50"), NOW)),
    (
        "nested dataclass",
        Order,
        Order(
            uuid.UUID(int=42),
            NOW,
            Address("Main St 1", "Lyon", "69001"),
            None,
            [Line(f"SKU-{n}", n, Decimal(f"{n}.99")) for n in range(10)],
            {"channel": "web", "campaign": "spring"},
        ),
    ),
    ("pydantic model", Signup, Signup(email="a@example.com", at=NOW, credit=Decimal("10.50"), tags=["new", "vip"])),
]


def load_earlier_codec(commit: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{commit}:src/jobbus/bus/codecs.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "earlier_codecs.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("earlier_codecs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["earlier_codecs"] = module
    spec.loader.exec_module(module)
    return module


def ops_per_second(operation: Callable[[], object], *, runs: int = 5, seconds: float = 0.2) -> float:
    """Best of `runs`: loops sized so that one run takes about `seconds`."""
    loops = 1
    while True:
        started = time.perf_counter()
        for _ in range(loops):
            operation()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds / 10:
            break
        loops *= 10
    loops = max(1, int(loops * seconds / elapsed))
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(loops):
            operation()
        best = min(best, time.perf_counter() - started)
    return loops / best


def earlier_dispatch(codec: Any, cls: type[Any], message: Any) -> Callable[[], object]:
    def run() -> object:
        stored = json.loads(json.dumps(codec.encode(message), allow_nan=False, ensure_ascii=False))
        codec.decode(cls, stored)
        return stored

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=EARLIER_CODEC_COMMIT, help="commit holding the earlier codec")
    args = parser.parse_args()
    earlier = load_earlier_codec(args.baseline).JsonCodec()
    current = JsonCodec()

    rows: list[tuple[str, str, float, float]] = []
    for label, cls, message in MESSAGES:
        payload = json.loads(json.dumps(encoding.encode(message, cls)))
        earlier_payload = json.loads(json.dumps(earlier.encode(message)))
        assert current.decode(cls, payload) == message == earlier.decode(cls, earlier_payload)
        rows.append(
            (
                label,
                "dispatch",
                ops_per_second(earlier_dispatch(earlier, cls, message)),
                ops_per_second(functools.partial(encoding.encode, message, cls, what="message")),
            )
        )
        rows.append(
            (
                label,
                "worker decode",
                ops_per_second(functools.partial(earlier.decode, cls, earlier_payload)),
                ops_per_second(functools.partial(current.decode, cls, payload)),
            )
        )

    print(f"Python {sys.version.split()[0]}, earlier codec from {args.baseline}, ops/s (best of 5)\n")
    print("| message | operation | earlier codec | jobbus.encoding | ratio |\n|---|---|---:|---:|---:|")
    for label, operation, before, after in rows:
        print(f"| {label} | {operation} | {before:,.0f} | {after:,.0f} | {after / before:.1f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
