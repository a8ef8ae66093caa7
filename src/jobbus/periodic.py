"""Periodic jobs: when they run (`Schedule`), what they are (`PeriodicSpec`), what is stored (`Periodic`).

A schedule is either a standard 5-field cron expression evaluated in an IANA time zone, or a fixed
interval. Cron expressions are evaluated by `cronsim`, a small, maintained library written for a
service that evaluates millions of cron schedules, with the rules of Debian's (Vixie) cron on DST days:

- An expression at fixed times (neither its minute nor its hour field starts with `*`, e.g. `30 2 * * *`)
  follows the wall clock. A time that happens twice when clocks go back runs once, at its first
  occurrence (02:30 summer time in Europe/Paris); a time that does not exist when clocks go forward
  runs once, at the first minute that exists after it (03:00 in Europe/Paris).
- An expression with `*` in its minute or hour field (e.g. `*/15 * * * *`, `0 * * * *`) follows real
  time: it runs at every instant whose local time matches, so the ticks of a repeated hour run in
  both passes (each pass is its own instants), and a skipped hour has none.

Intervals tick at whole multiples of the interval since the Unix epoch (counted in microseconds), so
every worker, and every restart, agrees on the ticks without storing an anchor. Either way
`next_after` is strictly later than the moment it is given: the enqueuer relies on it to move a
periodic job past every tick it enqueues.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, Unpack
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobbus.durations import seconds_or_none
from jobbus.errors import InvalidJobError
from jobbus.requests import INT32_MAX, INT32_MIN, MAX_TYPE_BYTES, configuration_json, validate_text

#: The shortest interval a periodic job may have.
MIN_EVERY_SECONDS = 1.0

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


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
            return self._interval_tick(moment, 1)
        assert self.cron is not None
        # cronsim walks a fixed-time expression on the wall clock from the wall time of `moment`, which
        # forgets which pass of a repeated hour `moment` is in: from 02:10 of the second pass, the
        # 02:30 it finds is the first pass's, already over. Ticks come in order, so the first one
        # later than `moment` is the answer.
        for tick in CronSim(self.cron, moment.astimezone(_zone(self.timezone))):
            if (found := tick.astimezone(UTC)) > moment:
                return found
        raise InvalidJobError(f"cron {self.cron!r} has no tick in the 50 years after {moment.isoformat()}")

    def latest_until(self, moment: datetime) -> datetime:
        """The last tick at or before `moment` (after downtime: the one tick that still runs)."""
        if self.every_seconds is not None:
            return self._interval_tick(moment, 0)
        assert self.cron is not None
        # Walking back from the wall time of `moment` may land a tick too early (the first pass of a
        # repeated hour is missed from its second pass) and never includes `moment` itself: take a tick
        # at or before `moment`, then walk forward with `next_after`, so both directions agree.
        for tick in CronSim(self.cron, moment.astimezone(_zone(self.timezone)), reverse=True):
            if (latest := tick.astimezone(UTC)) <= moment:
                break
        else:
            raise InvalidJobError(f"cron {self.cron!r} has no tick in the 50 years before {moment.isoformat()}")
        while (following := self.next_after(latest)) <= moment:
            latest = following
        return latest

    def _interval_tick(self, moment: datetime, ahead: int) -> datetime:
        """The interval's tick at or before `moment` (`ahead` = 0) or the one after it (1), counted in
        whole microseconds: float seconds would make `next_after` of a tick of `every=1.1` that tick."""
        assert self.every_seconds is not None
        every = max(1, round(self.every_seconds * 1_000_000))
        elapsed = (moment - _EPOCH) // _MICROSECOND
        return _EPOCH + (elapsed // every + ahead) * every * _MICROSECOND


class PeriodicOptions(TypedDict, total=False):
    """What `App.periodic` and `add_periodic` take beside the name and the job type: exactly one of
    `cron` (5 fields, in `timezone`, "UTC" unless given) or `every` (seconds or a timedelta); the jobs'
    `configuration`, `queue` and `priority` (None: the handler's); `overlap` (False unless given: a
    tick is skipped while the previous job of the periodic job is queued or running)."""

    cron: str | None
    every: float | timedelta | None
    configuration: Mapping[str, Any] | None
    timezone: str
    queue: str | None
    priority: int | None
    overlap: bool


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
        default_queue: str = "default",
        default_priority: int = 0,
        max_payload_bytes: int | None = None,
        **options: Unpack[PeriodicOptions],
    ) -> PeriodicSpec:
        """Validate a periodic job; its queue and priority default to `default_queue`/`default_priority`."""
        priority = options.get("priority")
        priority = default_priority if priority is None else priority
        if isinstance(priority, bool) or not isinstance(priority, int) or not INT32_MIN <= priority <= INT32_MAX:
            raise InvalidJobError(f"priority must be a 32-bit integer, got {priority!r}")
        overlap = options.get("overlap", False)
        if not isinstance(overlap, bool):
            raise InvalidJobError(f"overlap must be True or False, got {overlap!r}")
        configuration = options.get("configuration")
        queue = options.get("queue")
        return cls(
            name=validate_text("periodic name", name, MAX_TYPE_BYTES),
            type=validate_text("type", type, MAX_TYPE_BYTES),
            schedule=Schedule.of(
                cron=options.get("cron"), every=options.get("every"), timezone=options.get("timezone", "UTC")
            ),
            configuration=configuration_json(
                dict(configuration) if configuration is not None else None, max_payload_bytes
            ),
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
