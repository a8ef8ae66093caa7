"""Flow control values: `RateLimit` and `QueueSettings`, with the validation of what `set_queue` takes."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from datetime import timedelta

from jobbus.errors import InvalidJobError

#: Limits above these are typos, not limits.
MAX_CONCURRENCY = 1_000_000
MAX_RATE_PERIOD = timedelta(days=7)


class Keep(enum.Enum):
    """`set_queue` leaves a limit it is not given as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `count` jobs started in any rolling window of `per` (a sliding window, never a fixed one
    that bursts at its edges)."""

    count: int
    per: timedelta = timedelta(seconds=1)

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not 1 <= self.count <= MAX_CONCURRENCY:
            raise InvalidJobError(
                f"a rate limit's count must be an integer from 1 to {MAX_CONCURRENCY}, got {self.count!r}"
            )
        if not isinstance(self.per, timedelta):
            raise InvalidJobError(f"a rate limit's per must be a timedelta, got {self.per!r}")
        seconds = self.per.total_seconds()
        if not (math.isfinite(seconds) and 0.001 <= seconds <= MAX_RATE_PERIOD.total_seconds()):
            raise InvalidJobError(f"a rate limit's period must be from 1 ms to 7 days, got {self.per}")

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """`100/1m`, `50/s`, `10/30s`: a count, a slash, a period (a unit alone means one of it)."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|m|h|d)\s*", text)
        if not match:
            raise InvalidJobError(f"{text!r} is not a rate: write COUNT/PERIOD, e.g. 100/1m, 50/s or 10/30s")
        number = float(match[2]) if match[2] else 1.0
        unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[3]]
        return cls(int(match[1]), timedelta(seconds=number * unit))

    def __str__(self) -> str:
        return f"{self.count}/{self.per.total_seconds():g}s"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """The limits of one queue (None: no such limit)."""

    queue: str
    concurrency: int | None = None
    concurrency_per_key: int | None = None
    rate_limit: RateLimit | None = None
    rate_limit_per_key: RateLimit | None = None


def check_count(what: str, value: int | Keep | None) -> int | Keep | None:
    if value is None or value is KEEP:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise InvalidJobError(
            f"{what} must be an integer from 1 to {MAX_CONCURRENCY}, or None to remove it, got {value!r}"
        )
    return value


def check_rate(what: str, value: RateLimit | Keep | None) -> RateLimit | Keep | None:
    if value is None or value is KEEP or isinstance(value, RateLimit):
        return value
    raise InvalidJobError(f"{what} must be a jobbus.RateLimit(count, per=timedelta(...)), or None to remove it")
