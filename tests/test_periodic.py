"""Periodic jobs: schedules (cron with time zones and DST, intervals), the runtime API, and the enqueuer's
exactly-once ticks, catch-up after a failover, the latest tick after downtime, and overlap."""

from __future__ import annotations

import asyncio
import itertools
import logging
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jobbus
from jobbus.errors import InvalidJobError, InvalidStateError
from jobbus.periodic import Schedule
from jobbus.store import run_async
from jobbus.worker.services.periodic import PeriodicEnqueuer
from tests.conftest import FAST

PARIS = ZoneInfo("Europe/Paris")


def _runs(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    out = [schedule.next_after(start)]
    while len(out) < count:
        out.append(schedule.next_after(out[-1]))
    return out


def test_a_daily_0230_job_in_paris_runs_once_on_both_dst_days() -> None:
    schedule = Schedule.of(cron="30 2 * * *", every=None, timezone="Europe/Paris")
    spring = [t.astimezone(PARIS) for t in _runs(schedule, datetime(2026, 3, 27, 12, tzinfo=PARIS), 4)]
    autumn = [t.astimezone(PARIS) for t in _runs(schedule, datetime(2026, 10, 23, 12, tzinfo=PARIS), 4)]
    assert [t.date().day for t in spring] == [28, 29, 30, 31]  # once a day, 29 March included
    assert spring[1].hour == 3  # 02:30 does not exist on 29 March: it runs at 03:00, once
    assert [t.date().day for t in autumn] == [24, 25, 26, 27]  # 02:30 happens twice on 25 October: once
    assert all(t.hour == 2 and t.minute == 30 for t in autumn)


@given(every=st.integers(1, 86_400), moment=st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1)))
def test_interval_ticks_are_whole_multiples_and_bracket_any_moment(every: int, moment: datetime) -> None:
    schedule = Schedule.of(cron=None, every=every)
    moment = moment.replace(tzinfo=UTC)
    latest, following = schedule.latest_until(moment), schedule.next_after(moment)
    assert latest <= moment < following
    assert following - latest == timedelta(seconds=every)
    assert latest.timestamp() % every == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": None, "every": None}, "exactly one of"),
        ({"cron": "* * * * *", "every": 5}, "exactly one of"),
        ({"cron": "0 3 * *", "every": None}, "5 fields"),
        ({"cron": "61 3 * * *", "every": None}, "not a valid expression"),
        ({"cron": None, "every": 0.5}, "at least 1 s"),
        ({"cron": None, "every": float("nan")}, "every must be"),
        ({"cron": "0 3 * * *", "every": None, "timezone": "Mars/Olympus"}, "not a known IANA time zone"),
    ],
)
def test_bad_schedules_are_refused_naming_the_problem(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        Schedule.of(**options)


async def test_runtime_periodic_jobs_are_added_paused_resumed_run_and_removed(app: jobbus.App) -> None:
    added = await app.add_periodic("nightly", type="report.render", cron="0 3 * * *", timezone="Europe/Paris")
    assert (added.name, added.cron, added.enabled, added.source) == ("nightly", "0 3 * * *", True, "runtime")
    assert added.next_run_at.astimezone(PARIS).hour == 3
    await app.pause_periodic("nightly")
    assert [p.enabled for p in await app.list_periodic()] == [False]
    again = await app.add_periodic("nightly", type="report.render", cron="0 3 * * *", timezone="Europe/Paris")
    assert not again.enabled  # a redefinition keeps the pause
    await app.resume_periodic("nightly")
    job_id = await app.run_periodic("nightly")
    job = await app.find(job_id)
    assert job is not None and (job.type, job.name, job.status) == ("report.render", "nightly", "queued")
    assert (await app.list_periodic())[0].last_job_id == job_id
    await app.remove_periodic("nightly")
    assert await app.list_periodic() == []
    for verb in (app.remove_periodic, app.pause_periodic, app.resume_periodic, app.run_periodic):
        with pytest.raises(InvalidStateError, match="no periodic job is named 'nightly'"):
            await verb("nightly")
    with pytest.raises(InvalidJobError, match="exactly one of"):
        await app.add_periodic("bad", type="t")


def test_the_blocking_twins_do_the_same(sync_app: jobbus.App) -> None:
    sync_app.sync.add_periodic("ping", type="ops.ping", every=timedelta(seconds=30), configuration={"a": 1})
    (ping,) = sync_app.sync.list_periodic()
    assert (ping.every, ping.configuration) == (timedelta(seconds=30), {"a": 1})
    sync_app.sync.pause_periodic("ping")
    sync_app.sync.resume_periodic("ping")
    assert sync_app.sync.find(sync_app.sync.run_periodic("ping")) is not None
    sync_app.sync.remove_periodic("ping")
    assert sync_app.sync.list_periodic() == []


def _enqueuer(app: jobbus.App, catch_up: float = 30) -> PeriodicEnqueuer:
    async def run(statement: Any) -> Any:
        async with app.pool.connection() as conn:
            return await run_async(conn, statement)

    return PeriodicEnqueuer(
        store=app.periodic_store, run=run, max_attempts_of=app.max_attempts_of, catch_up_seconds=catch_up
    )


async def _set_next_run(dsn: str, name: str, seconds_ago: float) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE jobbus.periodic SET next_run_at = to_timestamp("
            "floor(extract(epoch FROM now() - make_interval(secs => %s)))) WHERE name = %s",
            (seconds_ago, name),
        )


async def _jobs_of(app: jobbus.App, name: str) -> list[jobbus.Job]:
    return [j for j in await app.list_jobs(limit=10_000) if j.name == name]


async def test_concurrent_enqueuers_enqueue_each_tick_exactly_once(app: jobbus.App, dsn: str) -> None:
    await app.add_periodic("tick", type="t", every=1, overlap=True)
    await _set_next_run(dsn, "tick", 10)  # ten ticks missed, within the catch-up window
    await asyncio.gather(*(_enqueuer(app).run_once() for _ in range(6)))  # six leaders at once
    jobs = await _jobs_of(app, "tick")
    ticks = sorted(j.available_at for j in jobs)
    assert len(ticks) == len(set(ticks)) >= 10  # no tick twice
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ticks))  # no gap
    (stored,) = await app.list_periodic()
    assert stored.next_run_at > ticks[-1] and stored.last_run_at == ticks[-1]


async def test_after_a_long_downtime_only_the_latest_missed_tick_runs(app: jobbus.App, dsn: str) -> None:
    await app.add_periodic("hourly", type="t", cron="0 * * * *")
    await _set_next_run(dsn, "hourly", 3 * 86_400)  # three days of ticks missed
    await _enqueuer(app).run_once()
    (job,) = await _jobs_of(app, "hourly")
    now = datetime.now(UTC)
    assert job.available_at <= now and now - job.available_at < timedelta(hours=1)
    assert job.available_at.minute == 0 and job.available_at.second == 0


async def test_without_overlap_a_tick_is_skipped_while_the_previous_job_waits(app: jobbus.App, dsn: str) -> None:
    await app.add_periodic("slow", type="t", every=1)
    await _set_next_run(dsn, "slow", 0)
    await _enqueuer(app).run_once()
    await _set_next_run(dsn, "slow", 0)
    await _enqueuer(app).run_once()  # the first job is still queued: skipped
    assert len(await _jobs_of(app, "slow")) == 1
    await app.add_periodic("eager", type="t", every=1, overlap=True)
    for _ in range(2):
        await _set_next_run(dsn, "eager", 0)
        await _enqueuer(app).run_once()
    assert len(await _jobs_of(app, "eager")) == 2


async def test_code_declared_schedules_follow_the_code_and_runtime_ones_survive(dsn: str) -> None:
    first = jobbus.App(dsn=dsn, **FAST)
    first.periodic("report", type="report", cron="0 3 * * *", configuration={"kind": "nightly"})
    first.periodic("cleanup", type="report", every=timedelta(minutes=5))

    @first.job("report")
    async def report(job: jobbus.JobExecution) -> None:
        return None

    async with first:
        await first.add_periodic("adhoc", type="report", every=60)
        await jobbus.Worker(first, stop_when_empty=True).run()
        names = {p.name: p.source for p in await first.list_periodic()}
        assert names == {"report": "code", "cleanup": "code", "adhoc": "runtime"}
        await first.pause_periodic("report")
        with pytest.raises(InvalidStateError, match="declared in code"):
            await first.add_periodic("report", type="report", every=60)

    second = jobbus.App(dsn=dsn, **FAST)  # the next deploy: "cleanup" is gone from the code
    second.periodic("report", type="report", cron="0 4 * * *", configuration={"kind": "nightly"})

    @second.job("report")
    async def report_again(job: jobbus.JobExecution) -> None:
        return None

    async with second:
        await jobbus.Worker(second, stop_when_empty=True).run()
        stored = {p.name: p for p in await second.list_periodic()}
    assert set(stored) == {"report", "adhoc"}  # no zombie schedule; the runtime one survives
    assert stored["report"].cron == "0 4 * * *" and not stored["report"].enabled  # redefined, still paused


async def test_a_worker_leaves_periodic_jobs_of_types_it_does_not_handle_alone(dsn: str) -> None:
    owner = jobbus.App(dsn=dsn, **FAST)
    owner.periodic("theirs", type="theirs", every=60)

    @owner.job("theirs")
    async def theirs(job: jobbus.JobExecution) -> None:
        return None

    other = jobbus.App(dsn=dsn, **FAST)

    @other.job("mine")
    async def mine(job: jobbus.JobExecution) -> None:
        return None

    async with owner, other:
        await jobbus.Worker(owner, stop_when_empty=True).run()
        await jobbus.Worker(other, stop_when_empty=True).run()
        assert [p.name for p in await other.list_periodic()] == ["theirs"]


async def test_a_worker_warns_at_start_of_each_periodic_job_whose_type_it_does_not_serve(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = jobbus.App(dsn=dsn, **FAST)
    app.periodic("typo", type="report.rendr", every=60)
    app.periodic("left-out", type="mail.send", every=60)  # handled by the app, not by this worker (--type)
    app.periodic("served", type="report.render", every=60)

    @app.job("report.render")
    async def render(job: jobbus.JobExecution) -> None:
        return None

    @app.job("mail.send")
    async def send(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        with caplog.at_level(logging.WARNING, logger="jobbus.worker"):
            await jobbus.Worker(app, stop_when_empty=True, types=["report.render"]).run()
    warned = {record.__dict__["periodic"] for record in caplog.records if "periodic" in record.__dict__}
    assert warned == {"typo", "left-out"}
