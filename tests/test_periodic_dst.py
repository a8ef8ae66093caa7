"""Periodic ticks on every day of the year, the days clocks change included (SPEC 16): schedules checked
against a brute-force walk of the wall clock in many zones, and the leader's enqueuer driven by a
database clock set to the night clocks go back, through downtime, clock jumps and two leaders at once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import make_conninfo

import jobbus
from jobbus.periodic import Schedule
from jobbus.requests import new_job_id
from jobbus.store import Statement, run_async
from jobbus.store.periodic import DuePeriodic
from jobbus.worker.services.periodic import PeriodicEnqueuer
from tests.conftest import FAST

ZONES = [
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",  # clocks move by 30 minutes
    "America/Sao_Paulo",
    "Asia/Kolkata",
    "UTC",
    "Pacific/Chatham",  # +12:45 / +13:45, changing at 02:45 and 03:45
]
#: Daily expressions, each on a skipped or a repeated local time somewhere among ZONES.
DAILY = ["30 2 * * *", "0 1 * * *", "0 0 * * *", "0 3 * * *", "45 1 * * *"]
CRONS = [*DAILY, "*/15 * * * *", "0 * * * *", "15,45 1-3 * * *", "0 2 * * 0"]
FIRST_DAY, LAST_DAY = date(2024, 1, 1), date(2030, 12, 31)
UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PARIS = ZoneInfo("Europe/Paris")


# -- the oracle: the documented rules, applied by brute force on the wall clock -------------------------


def _cron_field(text: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            first, last = low, high
        elif "-" in base:
            first, last = (int(v) for v in base.split("-"))
        else:
            first = int(base)
            last = high if step else first
        values.update(range(first, last + 1, int(step or 1)))
    return values


def _exists(wall: datetime, zone: ZoneInfo) -> bool:
    return wall.replace(tzinfo=zone).astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall


def oracle_ticks(cron: str, zone_name: str, first: date, last: date) -> list[datetime]:
    """Every tick of the local days `first`..`last`, walking each day's wall-clock minutes.

    Fixed times (neither minute nor hour starts with `*`) follow the wall clock: a repeated time runs at
    its first occurrence, a skipped one at the first minute that exists after it. Others follow real
    time: every instant whose local time matches, in both passes of a repeated hour."""
    zone = ZoneInfo(zone_name)
    minute, hour, dom, month, dow = cron.split()
    minutes, hours = _cron_field(minute, 0, 59), _cron_field(hour, 0, 23)
    doms, months = _cron_field(dom, 1, 31), _cron_field(month, 1, 12)
    dows = {d % 7 for d in _cron_field(dow, 0, 7)}
    both = dom.startswith("*") or dow.startswith("*")
    wall_clock = not minute.startswith("*") and not hour.startswith("*")
    ticks: set[datetime] = set()
    day = first
    while day <= last:
        in_dom, in_dow = day.day in doms, day.isoweekday() % 7 in dows
        if day.month in months and ((in_dom and in_dow) if both else (in_dom or in_dow)):
            for h, m in itertools.product(sorted(hours), sorted(minutes)):  # the day's minutes that match
                wall = datetime(day.year, day.month, day.day, h, m)
                if wall_clock:
                    while not _exists(wall, zone):
                        wall += timedelta(minutes=1)
                    ticks.add(wall.replace(tzinfo=zone, fold=0).astimezone(UTC))
                elif _exists(wall, zone):
                    ticks.update(wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1))
        day += timedelta(days=1)
    return sorted(ticks)


def oracle_interval_ticks(every_ms: int, start: datetime, end: datetime) -> list[datetime]:
    """The whole multiples of the interval since the epoch in [start, end], with exact fractions."""
    every = Fraction(every_ms, 1000)
    first = int(Fraction((start - UTC_EPOCH) // timedelta(microseconds=1), 1_000_000) // every)
    out: list[datetime] = []
    for k in itertools.count(first):
        seconds = k * every
        tick = UTC_EPOCH + timedelta(microseconds=int(seconds * 1_000_000))
        if tick > end:
            return out
        if tick >= start:
            out.append(tick)
    raise AssertionError("unreachable")


def _transition_days(zone_name: str) -> list[date]:
    """The local days on which the zone's offset changes."""
    zone, days, day = ZoneInfo(zone_name), [], FIRST_DAY
    while day <= LAST_DAY:
        start = datetime(day.year, day.month, day.day, tzinfo=zone)
        if start.utcoffset() != (start + timedelta(days=1)).utcoffset():
            days.append(day)
        day += timedelta(days=1)
    return days


TRANSITIONS = {zone: _transition_days(zone) for zone in ZONES}


def _local_midnight(day: date, zone: str) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=ZoneInfo(zone)).astimezone(UTC)


def _iterate(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The ticks in (start, end] by `next_after`, checking that each is strictly later."""
    out: list[datetime] = []
    moment = start
    while (moment := schedule.next_after(moment)) <= end:
        assert not out or moment > out[-1]
        out.append(moment)
    return out


def test_the_zones_change_their_clocks_in_the_years_checked() -> None:
    assert all(len(TRANSITIONS[zone]) == 14 for zone in ["Europe/Paris", "America/New_York", "Pacific/Chatham"])
    assert len(TRANSITIONS["Australia/Lord_Howe"]) == 14
    assert TRANSITIONS["UTC"] == TRANSITIONS["Asia/Kolkata"] == TRANSITIONS["America/Sao_Paulo"] == []


def test_the_reproduction_the_second_0230_of_paris_is_not_a_tick_in_the_past() -> None:
    schedule = Schedule.of(cron="30 2 * * *", every=None, timezone="Europe/Paris")
    first_pass_tick = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 summer time
    moment = datetime(2026, 10, 25, 1, tzinfo=UTC)  # 02:00 winter time: the hour starts again
    while moment <= datetime(2026, 10, 25, 1, 30, tzinfo=UTC):
        assert schedule.next_after(moment) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
        assert schedule.latest_until(moment) == first_pass_tick
        moment += timedelta(seconds=37)


@pytest.mark.parametrize("cron", DAILY)
@pytest.mark.parametrize("zone", ZONES)
def test_every_day_of_seven_years_has_one_tick_of_a_daily_schedule(zone: str, cron: str) -> None:
    schedule = Schedule.of(cron=cron, every=None, timezone=zone)
    start, end = _local_midnight(FIRST_DAY, zone), _local_midnight(LAST_DAY + timedelta(days=1), zone)
    ticks = _iterate(schedule, start - timedelta(microseconds=1), end - timedelta(microseconds=1))
    assert ticks == oracle_ticks(cron, zone, FIRST_DAY, LAST_DAY)
    days = [t.astimezone(ZoneInfo(zone)).date() for t in ticks]
    assert days == [FIRST_DAY + timedelta(days=n) for n in range((LAST_DAY - FIRST_DAY).days + 1)]


@pytest.mark.parametrize("zone", [z for z in ZONES if TRANSITIONS[z]])
def test_every_clock_change_of_seven_years_matches_the_wall_clock_walk(zone: str) -> None:
    for cron in CRONS:
        schedule = Schedule.of(cron=cron, every=None, timezone=zone)
        for day in TRANSITIONS[zone]:
            start, end = _local_midnight(day - timedelta(days=1), zone), _local_midnight(day + timedelta(days=2), zone)
            expected = oracle_ticks(cron, zone, day - timedelta(days=1), day + timedelta(days=1))
            assert _iterate(schedule, start - timedelta(microseconds=1), end - timedelta(microseconds=1)) == expected


@st.composite
def _schedules_and_days(draw: st.DrawFn) -> tuple[Schedule, str, date]:
    zone = draw(st.sampled_from(ZONES))
    days = st.dates(FIRST_DAY + timedelta(days=2), LAST_DAY - timedelta(days=2))
    if TRANSITIONS[zone]:
        days = st.sampled_from(TRANSITIONS[zone]) | days
    day = draw(days)
    if draw(st.booleans()):
        return Schedule.of(cron=draw(st.sampled_from(CRONS)), every=None, timezone=zone), zone, day
    every_ms = draw(st.sampled_from([59_999, 61_100, 900_000, 3_600_000, 5_400_000, 86_400_000]))
    return Schedule.of(cron=None, every=timedelta(milliseconds=every_ms), timezone=zone), zone, day


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=_schedules_and_days(), data=st.data())
def test_next_after_is_strictly_later_never_repeats_and_matches_the_brute_force_walk(
    drawn: tuple[Schedule, str, date], data: st.DataObject
) -> None:
    schedule, zone, day = drawn
    start, end = _local_midnight(day - timedelta(days=1), zone), _local_midnight(day + timedelta(days=1), zone)
    if schedule.cron is not None:
        margin = timedelta(days=2 if schedule.cron.endswith("* * *") else 8)  # a weekly one: a week either side
        known = oracle_ticks(schedule.cron, zone, day - margin, day + margin)
    else:
        assert schedule.every_seconds is not None
        every_ms = round(schedule.every_seconds * 1000)
        known = oracle_interval_ticks(every_ms, start - timedelta(days=2), end + timedelta(days=2))
    inside = [t for t in known if start <= t <= end]
    ticks = _iterate(schedule, start - timedelta(microseconds=1), end)
    assert ticks == inside and len(set(ticks)) == len(ticks)
    if inside:  # moments on, and a microsecond either side of, a tick
        tick = data.draw(st.sampled_from(inside))
        moments = [tick + timedelta(microseconds=d) for d in (-1, 0, 1)]
    else:
        moments = []
    span = (end - start) // timedelta(microseconds=1)
    moments += [start + timedelta(microseconds=n) for n in data.draw(st.lists(st.integers(0, span), max_size=5))]
    for moment in moments:
        following = schedule.next_after(moment)
        latest = schedule.latest_until(moment)
        assert following > moment >= latest
        assert following == min(t for t in known if t > moment)
        assert latest == max(t for t in known if t <= moment)


@given(
    every_ms=st.integers(1000, 100_000),
    moment=st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1)).map(lambda m: m.replace(tzinfo=UTC)),
)
def test_fractional_intervals_tick_strictly_forward(every_ms: int, moment: datetime) -> None:
    """`every=1.1` ticks at whole multiples of 1.1 s; float seconds once made a tick its own next."""
    schedule = Schedule.of(cron=None, every=every_ms / 1000)
    following = schedule.next_after(moment)
    elapsed = Fraction((following - UTC_EPOCH) // timedelta(microseconds=1), 1_000_000)
    assert following > moment and elapsed % Fraction(every_ms, 1000) == 0
    assert following - moment <= timedelta(milliseconds=every_ms)
    assert schedule.latest_until(following) == following
    assert schedule.next_after(following) - following == timedelta(milliseconds=every_ms)


# -- the enqueuer, under a database clock the test sets ---------------------------------------------------


@dataclass
class Clocked:
    """An app whose database sessions read `now()` from a clock the test sets."""

    app: jobbus.App
    dsn: str
    real_dsn: str
    admin: psycopg.AsyncConnection[Any]  # on the real clock

    async def set(self, moment: datetime) -> None:
        await self.admin.execute("UPDATE testclock.clock SET at = %s", (moment,))

    async def finish_jobs(self) -> None:
        """As a worker would: each job completes before the next round (so overlap=False skips nothing)."""
        await self.admin.execute(
            "UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE finished_at IS NULL"
        )

    async def ticks(self, name: str) -> list[datetime]:
        cursor = await self.admin.execute("SELECT available_at FROM jobbus.job WHERE name = %s ORDER BY 1", (name,))
        return [row[0] for row in await cursor.fetchall()]


@pytest.fixture
async def clocked(dsn: str) -> AsyncIterator[Clocked]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(
            "CREATE SCHEMA testclock; CREATE TABLE testclock.clock (at timestamptz NOT NULL);"
            "INSERT INTO testclock.clock VALUES (now());"
            "CREATE FUNCTION testclock.now() RETURNS timestamptz LANGUAGE sql STABLE"
            " AS 'SELECT at FROM testclock.clock'"
        )
        # pg_catalog named in the path is searched in its place: testclock.now() comes first.
        clocked_dsn = make_conninfo(dsn, options="-c search_path=testclock,pg_catalog,public")
        app = jobbus.App(dsn=clocked_dsn, **FAST)
        async with app:
            yield Clocked(app, clocked_dsn, dsn, admin)


def _enqueuer(
    clocked: Clocked, connection: psycopg.AsyncConnection[Any] | None = None, after_due: Any = None
) -> PeriodicEnqueuer:
    async def run(statement: Statement[Any]) -> Any:
        if connection is not None:
            result = await run_async(connection, statement)
        else:
            async with clocked.app.pool.connection() as conn:
                result = await run_async(conn, statement)
        if after_due is not None and result and isinstance(result, list) and isinstance(result[0], DuePeriodic):
            await after_due()
        return result

    app = clocked.app
    return PeriodicEnqueuer(store=app.periodic_store, run=run, max_attempts_of=app.max_attempts_of, catch_up_seconds=30)


def _at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize(
    ("added_at", "start", "stop", "tick"),
    [
        # The night clocks go back in Paris, a leader starting at 02:10 of the second pass after downtime.
        (_at(2026, 10, 24, 12), _at(2026, 10, 25, 1, 10), _at(2026, 10, 25, 1, 50), _at(2026, 10, 25, 0, 30)),
        # The same night, a leader up all along.
        (_at(2026, 10, 24, 12), _at(2026, 10, 25, 0, 20), _at(2026, 10, 25, 1, 50), _at(2026, 10, 25, 0, 30)),
        # The night they go forward: 02:30 does not exist, the tick is 03:00 summer time.
        (_at(2026, 3, 28, 12), _at(2026, 3, 29, 0, 20), _at(2026, 3, 29, 1, 40), _at(2026, 3, 29, 1)),
    ],
)
async def test_a_leader_through_a_dst_night_enqueues_the_tick_once(
    clocked: Clocked, overlap: bool, added_at: datetime, start: datetime, stop: datetime, tick: datetime
) -> None:
    await clocked.set(added_at)
    await clocked.app.add_periodic("paris", type="t", cron="30 2 * * *", timezone="Europe/Paris", overlap=overlap)
    enqueuer, moment = _enqueuer(clocked), start
    while moment <= stop:
        await clocked.set(moment)
        await enqueuer.run_once()
        await clocked.finish_jobs()
        (stored,) = await clocked.app.list_periodic()
        assert stored.next_run_at > moment
        moment += timedelta(minutes=1)
    assert await clocked.ticks("paris") == [tick]
    assert stored.last_run_at == tick and stored.next_run_at == Schedule.of(
        cron="30 2 * * *", every=None, timezone="Europe/Paris"
    ).next_after(tick)


async def test_add_periodic_in_the_repeated_half_hour_stores_a_future_next_run(clocked: Clocked) -> None:
    await clocked.set(_at(2026, 10, 25, 1, 10))  # 02:10 winter time, after the first 02:30
    added = await clocked.app.add_periodic("paris", type="t", cron="30 2 * * *", timezone="Europe/Paris")
    assert added.next_run_at == _at(2026, 10, 26, 1, 30)
    await clocked.set(_at(2026, 10, 25, 1, 20))
    blocking = await asyncio.to_thread(
        lambda: jobbus.App(dsn=clocked.dsn).sync.add_periodic(
            "blocking", type="t", cron="45 2 * * *", timezone="Europe/Paris"
        )
    )
    assert blocking.next_run_at == _at(2026, 10, 26, 1, 45)


async def test_periodics_declared_in_code_are_stored_with_a_future_next_run_in_the_repeated_hour(
    clocked: Clocked,
) -> None:
    await clocked.set(_at(2026, 10, 25, 1, 10))
    worker_app = jobbus.App(dsn=clocked.dsn, **FAST)
    worker_app.periodic("paris", type="t", cron="30 2 * * *", timezone="Europe/Paris")

    @worker_app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    async with worker_app:
        await jobbus.Worker(worker_app, stop_when_empty=True).run()
    (stored,) = await clocked.app.list_periodic()
    assert stored.next_run_at == _at(2026, 10, 26, 1, 30)


async def test_the_tick_guard_refuses_a_next_run_that_is_not_later_than_the_tick(clocked: Clocked) -> None:
    await clocked.set(_at(2026, 10, 25, 1, 10))
    await clocked.app.add_periodic("paris", type="t", cron="30 2 * * *", timezone="Europe/Paris")
    await clocked.set(_at(2026, 10, 26, 1, 40))
    store = clocked.app.periodic_store
    async with clocked.app.pool.connection() as conn:
        (due,) = await run_async(conn, store.due())
        tick = due.next_run_at

        async def enqueue(tick: datetime, next_run_at: datetime) -> tuple[bool, bool]:
            statement = store.enqueue_tick(due, tick=tick, next_run_at=next_run_at, job_id=new_job_id(), max_attempts=3)
            return await run_async(conn, statement)

        assert await enqueue(tick, tick) == (False, False)  # stays at its tick: it would come back
        assert await enqueue(tick, tick - timedelta(hours=1)) == (False, False)  # goes back
        assert await enqueue(tick - timedelta(days=1), tick) == (False, False)  # a tick it is already past
        assert await clocked.ticks("paris") == []
        assert await enqueue(tick, tick + timedelta(days=1)) == (True, True)
        assert await enqueue(tick, tick + timedelta(days=1)) == (False, False)  # moved: once
    assert await clocked.ticks("paris") == [tick]


async def test_two_leaders_racing_from_two_connections_enqueue_each_tick_once(clocked: Clocked) -> None:
    await clocked.set(_at(2026, 10, 25, 0))
    await clocked.app.add_periodic("quarter", type="t", cron="*/15 * * * *", timezone="Europe/Paris", overlap=True)
    await clocked.app.add_periodic("paris", type="t", cron="30 2 * * *", timezone="Europe/Paris", overlap=True)
    both_read = asyncio.Barrier(2)

    async def after_due() -> None:  # both leaders have read what is due before either enqueues
        await asyncio.wait_for(both_read.wait(), 60)

    async with (
        await psycopg.AsyncConnection.connect(clocked.dsn, autocommit=True) as first,
        await psycopg.AsyncConnection.connect(clocked.dsn, autocommit=True) as second,
    ):
        leaders = [_enqueuer(clocked, conn, after_due) for conn in (first, second)]
        moment = _at(2026, 10, 25, 0, 0, 20)
        while moment < _at(2026, 10, 25, 2, 20):  # through both passes of the repeated hour, 20 s missed a round
            await clocked.set(moment)
            await asyncio.gather(*(leader.run_once() for leader in leaders))
            moment += timedelta(seconds=20 + 13 * (moment.minute % 3))
    quarter = await clocked.ticks("quarter")
    expected = oracle_ticks("*/15 * * * *", "Europe/Paris", date(2026, 10, 25), date(2026, 10, 25))
    assert quarter == [t for t in expected if _at(2026, 10, 25, 0) < t < _at(2026, 10, 25, 2, 20)]
    assert len(quarter) == 9  # 00:15 to 02:15 UTC: 02:15 to 02:45 summer time, then 02:00 to 03:15 winter time
    assert await clocked.ticks("paris") == [_at(2026, 10, 25, 0, 30)]


async def test_a_leader_blocked_behind_another_leaders_enqueue_does_not_enqueue_its_tick_again(
    clocked: Clocked,
) -> None:
    await clocked.set(_at(2026, 10, 25, 12))
    await clocked.app.add_periodic("paris", type="t", cron="30 2 * * *", timezone="Europe/Paris", overlap=True)
    await clocked.set(_at(2026, 10, 26, 1, 30, 5))
    store = clocked.app.periodic_store
    async with (
        await psycopg.AsyncConnection.connect(clocked.dsn) as first,
        await psycopg.AsyncConnection.connect(clocked.dsn, autocommit=True) as second,
    ):
        (due,) = await run_async(first, store.due())
        statement = store.enqueue_tick(
            due, tick=due.next_run_at, next_run_at=_at(2026, 10, 27, 1, 30), job_id=new_job_id(), max_attempts=3
        )
        assert await run_async(first, statement) == (True, True)  # not committed: the row stays locked
        blocked = asyncio.create_task(_enqueuer(clocked, second).run_once())
        await _until(lambda: _waits_for_a_lock(clocked, second.info.backend_pid))
        await first.commit()
        await asyncio.wait_for(blocked, 60)
    assert await clocked.ticks("paris") == [_at(2026, 10, 26, 1, 30)]


async def _waits_for_a_lock(clocked: Clocked, pid: int) -> bool:
    async with await psycopg.AsyncConnection.connect(clocked.real_dsn, autocommit=True) as conn:
        row = await (
            await conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
        ).fetchone()
    return row is not None and row[0] == "Lock"


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


_CLOCK_STEPS = st.lists(
    st.one_of(
        st.integers(1, 600).map(lambda s: timedelta(seconds=s)),  # a round later
        st.integers(600, 4 * 3600).map(lambda s: timedelta(seconds=s)),  # downtime
        st.integers(1, 2 * 3600).map(lambda s: -timedelta(seconds=s)),  # the database's clock goes back
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cron=st.sampled_from(["30 2 * * *", "0 * * * *", "*/15 * * * *", "15,45 1-3 * * *"]),
    start=st.integers(-3 * 3600, 3600).map(lambda s: _at(2026, 10, 25, 0) + timedelta(seconds=s)),
    steps=_CLOCK_STEPS,
    leaders=st.integers(1, 2),
)
async def test_whatever_the_database_clock_does_no_tick_is_enqueued_twice(
    clocked: Clocked, cron: str, start: datetime, steps: list[timedelta], leaders: int
) -> None:
    await clocked.admin.execute("DELETE FROM jobbus.job; DELETE FROM jobbus.periodic")
    await clocked.set(start)
    await clocked.app.add_periodic("p", type="t", cron=cron, timezone="Europe/Paris", overlap=True)
    schedule = Schedule.of(cron=cron, every=None, timezone="Europe/Paris")
    enqueuers = [_enqueuer(clocked) for _ in range(leaders)]
    moment, latest = start, start
    for step in steps:
        moment += step
        latest = max(latest, moment)
        await clocked.set(moment)
        await asyncio.gather(*(e.run_once() for e in enqueuers))
        ticks = await clocked.ticks("p")
        (stored,) = await clocked.app.list_periodic()
        assert not ticks or stored.next_run_at > ticks[-1]
    assert len(ticks) == len(set(ticks))
    known = oracle_ticks(cron, "Europe/Paris", (start - timedelta(days=1)).date(), (latest + timedelta(days=1)).date())
    assert set(ticks) <= {t for t in known if start < t <= latest}
    assert all(b > a for a, b in itertools.pairwise(ticks))
    assert ticks == sorted(ticks) and schedule.next_after(start) <= (ticks or [stored.next_run_at])[0]
