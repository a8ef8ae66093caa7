"""Durations and start times as producers give them (seconds, timedeltas, aware datetimes), checked
against what jobbus stores and reads back: a clear `InvalidJobError`, or plain seconds and datetimes."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from jobbus.errors import InvalidJobError

#: The range of `available_at`, given as a datetime or as now + a delay: a year inside what Python's
#: datetime can read back (years 1 to 9999), so that a stored time can always be read, shown in any
#: local timezone, and compared, whatever the skew between this host's clock and the database's.
EARLIEST_AVAILABLE_AT = datetime(2, 1, 1, tzinfo=UTC)
LATEST_AVAILABLE_AT = datetime(9999, 1, 1, tzinfo=UTC)
_OUT_OF_RANGE = (
    f"is out of range: it must land between {EARLIEST_AVAILABLE_AT.date().isoformat()} "
    f"and {LATEST_AVAILABLE_AT.date().isoformat()} UTC"
)

#: The longest timeout or delay given in seconds that jobbus accepts (a year): beyond, a typo.
MAX_SECONDS = 365 * 86_400.0


def seconds_or_none(what: str, value: float | timedelta | None, *, allow_zero: bool = False) -> float | None:
    """A duration given as seconds or a timedelta: finite, positive (or zero), at most a year."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidJobError(f"{what} must be seconds (a number) or a timedelta, got {value!r}")
    low_ok = seconds >= 0 if allow_zero else seconds > 0
    if not (math.isfinite(seconds) and low_ok and seconds <= MAX_SECONDS):
        bound = "0" if allow_zero else "more than 0"
        raise InvalidJobError(f"{what} must be {bound} and at most {MAX_SECONDS:g} seconds (a year), got {value!r}")
    return seconds


def resolve_available_at(
    value: datetime | timedelta | None, what: str = "available_at"
) -> tuple[datetime | None, float]:
    """An aware datetime is absolute; a timedelta counts from the database clock at insert.

    Either must land between `EARLIEST_AVAILABLE_AT` and `LATEST_AVAILABLE_AT` (0002-01-01 and
    9999-01-01 UTC; a delay is measured from this host's clock).
    """
    if value is None:
        return None, 0.0
    if isinstance(value, timedelta):
        try:
            lands: datetime | None = datetime.now(UTC) + value
        except OverflowError:
            lands = None
        if lands is None or not EARLIEST_AVAILABLE_AT <= lands <= LATEST_AVAILABLE_AT:
            raise InvalidJobError(f"{what}: a delay of {value} {_OUT_OF_RANGE}")
        return None, value.total_seconds()
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise InvalidJobError(f"{what} must be an aware datetime (with a timezone), got naive {value.isoformat()}")
        try:
            in_range = EARLIEST_AVAILABLE_AT <= value.astimezone(UTC) <= LATEST_AVAILABLE_AT
        except OverflowError:  # beyond year 9999 (or before year 1) in UTC
            in_range = False
        if not in_range:
            raise InvalidJobError(f"{what} {value.isoformat()} {_OUT_OF_RANGE}")
        return value, 0.0
    raise InvalidJobError(f"{what} must be an aware datetime or a timedelta, got {value!r}")


def resolve_expires(value: float | timedelta | datetime | None) -> tuple[datetime | None, float | None]:
    """`expires` as (absolute, None) for an aware datetime or (None, seconds after the insert).

    Seconds and timedeltas must be more than 0 and at most a year; a datetime must be aware and land
    between `EARLIEST_AVAILABLE_AT` and `LATEST_AVAILABLE_AT`. A datetime already past is accepted: the
    job is cancelled as expired without running.
    """
    if value is None:
        return None, None
    if isinstance(value, datetime):
        absolute, _ = resolve_available_at(value, "expires")
        return absolute, None
    if not isinstance(value, int | float | timedelta) or isinstance(value, bool):
        raise InvalidJobError(f"expires must be seconds (a number), a timedelta or an aware datetime, got {value!r}")
    return None, seconds_or_none("expires", value)
