"""Periodic jobs: when they run (`Schedule`), what they are (`PeriodicSpec`), what is stored (`Periodic`).

A schedule is either a standard 5-field cron expression evaluated in an IANA time zone, or a fixed
interval. Cron expressions are evaluated by `cronsim`, a small, maintained library written for a
service that evaluates millions of cron schedules: it takes the standard syntax, and on DST days it
behaves like cron (a 02:30 job in Europe/Paris runs once at 03:00 when 02:30 does not exist, and once
when 02:30 happens twice). Intervals tick at whole multiples of the interval since the Unix epoch, so
every worker, and every restart, agrees on the ticks without storing an anchor.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobbus.errors import InvalidJobError
from jobbus.requests import INT32_MAX, INT32_MIN, MAX_TYPE_BYTES, configuration_json, seconds_or_none, validate_text

#: The shortest interval a periodic job may have.
MIN_EVERY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a periodic job is due: a cron expression in a time zone, or a fixed interval."""

    cron: str | None
    every_seconds: float | None
    timezone: str = "UTC"

    @classmethod
    def of(cls, *, cron: str | None, every: float | timedelta | None, timezone: str = "UTC") -> Schedule:
        """Validate: exactly one of `cron` (5 fields) and `every` (seconds or a timedelta, at least 1 s),
        and a known time zone. Errors name the problem."""
        if (cron is None) == (every is None):
            raise InvalidJobError("a periodic job needs exactly one of cron= (5 fields) or every= (an interval)")
        zone = _zone(timezone)
        if cron is not None:
            if not isinstance(cron, str) or len(cron.split()) != 5:
                raise InvalidJobError(f"cron must have 5 fields (minute hour day month weekday), got {cron!r}")
            try:
                next(CronSim(cron, datetime.now(zone)))
            except (CronSimError, StopIteration) as exc:
                raise InvalidJobError(f"cron {cron!r} is not a valid expression: {exc}") from None
            return cls(" ".join(cron.split()), None, timezone)
        seconds = seconds_or_none("every", every)
        assert seconds is not None
        if seconds < MIN_EVERY_SECONDS:
            raise InvalidJobError(f"every must be at least {MIN_EVERY_SECONDS:g} s, got {seconds:g} s")
        return cls(None, seconds, timezone)

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment`."""
        if self.every_seconds is not None:
            ticks = math.floor(moment.timestamp() / self.every_seconds) + 1
            return datetime.fromtimestamp(ticks * self.every_seconds, UTC)
        assert self.cron is not None
        local = moment.astimezone(_zone(self.timezone))
        return next(CronSim(self.cron, local)).astimezone(UTC)

    def latest_until(self, moment: datetime) -> datetime:
        """The last tick at or before `moment` (after downtime: the one tick that still runs)."""
        if self.every_seconds is not None:
            ticks = math.floor(moment.timestamp() / self.every_seconds)
            return datetime.fromtimestamp(ticks * self.every_seconds, UTC)
        assert self.cron is not None
        local = moment.astimezone(_zone(self.timezone))
        return next(CronSim(self.cron, local, reverse=True)).astimezone(UTC)


@dataclass(frozen=True, slots=True)
class PeriodicSpec:
    """A validated periodic job definition, ready to store."""

    name: str
    type: str
    schedule: Schedule
    configuration: str  # JSON text of an object
    queue: str
    priority: int
    overlap: bool

    @classmethod
    def build(
        cls,
        name: str,
        *,
        type: str,
        cron: str | None = None,
        every: float | timedelta | None = None,
        configuration: dict[str, Any] | None = None,
        timezone: str = "UTC",
        queue: str | None = None,
        priority: int | None = None,
        overlap: bool = False,
        default_queue: str = "default",
        max_payload_bytes: int | None = None,
    ) -> PeriodicSpec:
        priority = 0 if priority is None else priority
        if isinstance(priority, bool) or not isinstance(priority, int) or not INT32_MIN <= priority <= INT32_MAX:
            raise InvalidJobError(f"priority must be a 32-bit integer, got {priority!r}")
        if not isinstance(overlap, bool):
            raise InvalidJobError(f"overlap must be True or False, got {overlap!r}")
        return cls(
            name=validate_text("periodic name", name, MAX_TYPE_BYTES),
            type=validate_text("type", type, MAX_TYPE_BYTES),
            schedule=Schedule.of(cron=cron, every=every, timezone=timezone),
            configuration=configuration_json(configuration, max_payload_bytes),
            queue=validate_text("queue", queue if queue is not None else default_queue, MAX_TYPE_BYTES),
            priority=priority,
            overlap=overlap,
        )


@dataclass(frozen=True, slots=True)
class Periodic:
    """A periodic job as stored, and where it stands."""

    name: str
    type: str
    cron: str | None
    every: timedelta | None
    timezone: str
    enabled: bool
    next_run_at: datetime
    last_run_at: datetime | None
    last_job_id: uuid.UUID | None
    queue: str
    priority: int
    overlap: bool
    configuration: dict[str, Any]
    #: `code` (declared with `app.periodic`, kept in step with the code by workers) or `runtime`.
    source: str


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidJobError(f"timezone {name!r} is not a known IANA time zone (e.g. UTC, Europe/Paris)") from None
