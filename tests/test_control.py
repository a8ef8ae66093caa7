"""The control plane as a library: commands, targets, acknowledgements, the registry, status."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import control

WORKERS = """
INSERT INTO jobbus.worker (id, host, pid, queues, concurrency, state, last_seen_at, stopped_at)
VALUES ('w-a', 'h', 1, '{a}', 2, 'running', now(), NULL),
       ('w-all', 'h', 2, NULL, 2, 'running', now(), NULL),
       ('w-b', 'h', 3, '{b,c}', 2, 'paused', now(), NULL),
       ('w-gone', 'h', 4, '{a}', 2, 'running', now() - interval '1 hour', NULL),
       ('w-stopped', 'h', 5, '{a}', 2, 'stopped', now(), now())
"""
DEAD = """
INSERT INTO jobbus.worker (id, host, pid, queues, concurrency, state, last_seen_at, declared_dead_at)
VALUES ('w-dead', 'h', 6, NULL, 2, 'running', now() - interval '1 hour', now() - interval '59 minutes')
"""


async def _execute(app: jobbus.App, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with app.pool.connection() as conn:
        cursor = await conn.execute(query.encode(), params or None)
        return await cursor.fetchall() if cursor.description else []


async def test_a_target_addresses_running_and_silent_workers_serving_it_not_stopped_or_dead_ones(
    app: jobbus.App,
) -> None:
    await _execute(app, WORKERS)
    await _execute(app, DEAD)
    issued = await control.drain(app, queue="a")
    # a silent worker may be cut off from the database only: it is addressed and waited for
    assert issued.worker_ids == ("w-a", "w-all", "w-gone")
    assert issued.target == control.Target("queue", "a") and issued.action == "drain"
    assert (await control.stop(app, all=True)).worker_ids == ("w-a", "w-all", "w-b", "w-gone")
    assert (await control.restart(app, worker_id="w-b")).worker_ids == ("w-b",)
    assert (await control.restart(app, worker_id="w-gone")).worker_ids == ("w-gone",)
    rows = await _execute(app, "SELECT action, target_kind, target FROM jobbus.command ORDER BY generation")
    assert rows == [
        ("drain", "queue", "a"),
        ("stop", "all", ""),
        ("restart", "worker", "w-b"),
        ("restart", "worker", "w-gone"),
    ]


async def test_pause_is_durable_state_and_resume_lifts_it(app: jobbus.App) -> None:
    first = await control.pause(app, queue="emails")
    again = await control.pause(app, queue="emails")
    assert first.state_changed and not again.state_changed
    assert again.generation > first.generation
    await control.pause(app, all=True)
    await control.pause(app, worker_id="w-1")
    pauses = await _execute(app, "SELECT target_kind, target FROM jobbus.pause ORDER BY 1, 2")
    assert pauses == [("all", ""), ("queue", "emails"), ("worker", "w-1")]

    lifted = await control.resume(app, all=True)
    assert lifted.state_changed
    # resume --all lifts only the pause of every worker; named pauses stay until resumed by name
    assert len(await _execute(app, "SELECT 1 FROM jobbus.pause")) == 2
    assert (await control.resume(app, queue="emails")).state_changed
    assert not (await control.resume(app, queue="emails")).state_changed
    report = await control.queue_status(app)
    assert [(p.kind, p.target) for p in report.pauses] == [("worker", "w-1")]


@pytest.mark.parametrize(
    "target",
    [{}, {"queue": "a", "all": True}, {"worker_id": "w", "queue": "q"}, {"queue": ""}],
    ids=["none", "queue-and-all", "worker-and-queue", "empty-queue"],
)
async def test_a_command_needs_exactly_one_target(app: jobbus.App, target: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"target|queue"):
        await control.pause(app, **target)


async def test_issuing_notifies_the_control_channel(app: jobbus.App) -> None:
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as listener:
        await listener.execute("LISTEN jobbus_jobbus_control")
        issued = await control.stop(app, all=True)
        notify = await asyncio.wait_for(anext(listener.notifies()), 10)
    assert notify.payload == str(issued.generation)


async def test_concurrent_issuers_get_distinct_generations_in_commit_order(app: jobbus.App) -> None:
    issued = await asyncio.gather(*(control.drain(app, all=True) for _ in range(12)))
    generations = sorted(i.generation for i in issued)
    assert len(set(generations)) == 12
    committed = await _execute(app, "SELECT generation FROM jobbus.command ORDER BY xmin::text::bigint")
    assert [g for (g,) in committed] == generations


async def test_wait_for_acks_reports_acknowledged_missing_gone_and_unreachable(app: jobbus.App) -> None:
    await _execute(app, WORKERS)
    await _execute(app, "UPDATE jobbus.worker SET instance_id = gen_random_uuid()")
    issued = await control.pause(app, all=True)
    assert issued.worker_ids == ("w-a", "w-all", "w-b", "w-gone")
    await _execute(app, "UPDATE jobbus.worker SET acked_generation = %s WHERE id = 'w-a'", issued.generation)
    await _execute(app, "UPDATE jobbus.worker SET state = 'stopped', stopped_at = now() WHERE id = 'w-b'")
    report = await control.wait_for_acks(app, issued, timeout=0.3)
    assert (report.acknowledged, report.missing, report.gone) == (("w-a",), ("w-all",), ("w-b",))
    assert report.unreachable == ("w-gone",)  # silent: never reached, not a success
    assert not report.complete

    # a new process under w-gone's id acknowledges for itself, not for the process the command addressed
    await _execute(
        app,
        "UPDATE jobbus.worker SET instance_id = gen_random_uuid(), last_seen_at = now(), acked_generation = %s "
        "WHERE id = 'w-gone'",
        issued.generation,
    )
    report = await control.wait_for_acks(app, issued, timeout=0.3)
    assert report.unreachable == ("w-gone",) and "w-gone" not in report.acknowledged
    await _execute(app, "DELETE FROM jobbus.worker WHERE id = 'w-gone'")

    async def acknowledge_later() -> None:
        await asyncio.sleep(0.3)
        await _execute(app, "UPDATE jobbus.worker SET acked_generation = %s WHERE id = 'w-all'", issued.generation + 5)

    late = asyncio.create_task(acknowledge_later())
    report = await control.wait_for_acks(app, issued, timedelta(seconds=20))
    await late
    assert report.complete and report.acknowledged == ("w-a", "w-all")


async def test_list_workers_marks_gone_and_forgets_long_finished_rows(app: jobbus.App) -> None:
    await _execute(app, WORKERS)
    await _execute(
        app,
        "INSERT INTO jobbus.worker (id, host, pid, concurrency, state, last_seen_at, stopped_at) VALUES "
        "('old-stopped', 'h', 9, 1, 'stopped', now() - interval '2 days', now() - interval '2 days'), "
        "('old-gone', 'h', 9, 1, 'running', now() - interval '2 days', NULL)",
    )
    kept = await control.list_workers(app, forget_after=None)
    assert len(kept) == 7
    workers = {w.id: w for w in await control.list_workers(app)}
    assert sorted(workers) == ["w-a", "w-all", "w-b", "w-gone", "w-stopped"]
    assert workers["w-gone"].gone and workers["w-gone"].display_state == "gone" and not workers["w-gone"].live
    assert workers["w-stopped"].display_state == "stopped" and not workers["w-stopped"].gone
    assert workers["w-b"].queues == ("b", "c") and workers["w-all"].queues is None
    assert [w.live for w in workers.values()].count(True) == 3
    assert len(await _execute(app, "SELECT 1 FROM jobbus.worker")) == 5


async def test_queue_status_counts_jobs_and_measures_the_oldest_wait(app: jobbus.App) -> None:
    waiting = await app.schedule("t", queue="mail")
    await app.schedule("t", queue="mail", available_at=timedelta(hours=1))
    done = await app.schedule("t", queue="pdf")
    await _execute(app, "UPDATE jobbus.job SET available_at = now() - interval '5 minutes' WHERE id = %s", waiting)
    await _execute(app, "UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE id = %s", done)
    await _execute(app, WORKERS)
    report = await control.queue_status(app)
    mail, pdf = report.queues
    counts = (mail.available, mail.scheduled, mail.queued, mail.completed)
    assert (mail.queue, *(c.value for c in counts)) == ("mail", 1, 1, 2, 0)
    assert not any(c.estimated for c in counts)
    assert mail.oldest_waiting_seconds is not None and 300 <= mail.oldest_waiting_seconds < 400
    assert (pdf.completed.value, pdf.completed_last_minute.value, pdf.oldest_waiting_seconds) == (1, 1, None)
    assert (report.workers.live, report.workers.gone, report.workers.stopped) == (3, 1, 1)
    assert report.workers.by_state == {"running": 2, "paused": 1}
    assert not report.paused_all
