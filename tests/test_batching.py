"""Concurrent schedule calls of one App share statements, and each caller still gets exactly its answer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import psycopg
import pytest

import jobbus
from jobbus.models import JobSpec

# A trigger that lets tests make one job's insert slow or refused.
TRIGGER = """
CREATE FUNCTION public.producer_trap() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.configuration_data ? 'poison' THEN
        RAISE EXCEPTION 'poisoned job %', NEW.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.configuration_data ? 'slow' THEN
        PERFORM pg_sleep((NEW.configuration_data->>'slow')::float8);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER producer_trap BEFORE INSERT ON jobbus.job FOR EACH ROW EXECUTE FUNCTION public.producer_trap();
"""


def _rows(dsn: str) -> dict[uuid.UUID, int]:
    with psycopg.connect(dsn) as conn:
        return {job_id: int(n) for job_id, n in conn.execute("SELECT id, configuration_data->>'n' FROM jobbus.job")}


def _count_statements(app: jobbus.App) -> list[int]:
    """Wraps the App's one insert path: the sizes of the statements it sends."""
    sizes: list[int] = []
    batcher = app._batcher
    assert batcher is not None
    send = batcher._insert

    async def counted(specs: Sequence[JobSpec]) -> dict[tuple[str, str], uuid.UUID]:
        sizes.append(len(specs))
        return await send(specs)

    batcher._insert = counted
    return sizes


async def test_fifty_concurrent_callers_share_statements_and_get_their_own_ids(app: jobbus.App, dsn: str) -> None:
    sizes = _count_statements(app)
    ids = await asyncio.gather(*(app.schedule("report", {"n": n}) for n in range(50)))
    assert _rows(dsn) == {job_id: n for n, job_id in enumerate(ids)}
    assert sum(sizes) == 50
    assert len(sizes) < 50  # callers arriving while statements were in flight went in together
    assert max(sizes) > 1


async def test_a_lone_caller_is_sent_at_once(app: jobbus.App) -> None:
    sizes = _count_statements(app)
    for n in range(3):
        await app.schedule("report", {"n": n})
    assert sizes == [1, 1, 1]


async def test_callers_of_one_unique_key_in_a_shared_statement_get_one_job(app: jobbus.App, dsn: str) -> None:
    sizes = _count_statements(app)
    ids = await asyncio.gather(
        *(app.schedule("report", {"n": n}, unique_key="daily" if n % 2 else None) for n in range(40))
    )
    keyed = {ids[n] for n in range(1, 40, 2)}
    assert len(keyed) == 1
    rows = _rows(dsn)
    assert len(rows) == 21 and keyed <= rows.keys()
    assert max(sizes) > 1


async def test_a_refused_job_fails_its_caller_alone(app: jobbus.App, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TRIGGER)
    sizes = _count_statements(app)
    results = await asyncio.gather(
        *(app.schedule("report", {"n": n, **({"poison": True} if n == 7 else {})}) for n in range(30)),
        return_exceptions=True,
    )
    failed = [n for n, result in enumerate(results) if isinstance(result, BaseException)]
    assert failed == [7]
    assert isinstance(results[7], psycopg.errors.CheckViolation)
    assert "poisoned job" in str(results[7])
    assert sorted(_rows(dsn).values()) == [n for n in range(30) if n != 7]
    assert max(sizes) > 1  # the poison was in a shared statement, which was then sent per caller


async def test_a_caller_cancelled_while_waiting_for_a_statement_writes_nothing(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TRIGGER)
    app = jobbus.App(dsn=dsn, pool_max_size=2)  # two statements in flight at most
    async with app:
        slow = [asyncio.create_task(app.schedule("report", {"n": n, "slow": 1.0})) for n in range(2)]
        await asyncio.sleep(0.3)  # both slow statements are in flight
        waiting = asyncio.create_task(app.schedule("report", {"n": 99}))
        kept = asyncio.create_task(app.schedule("report", {"n": 100}))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.gather(*slow, kept)
    assert sorted(_rows(dsn).values()) == [0, 1, 100]


async def test_a_lone_caller_cancelled_in_its_statement_leaves_the_app_sharing_as_before(
    app: jobbus.App, dsn: str
) -> None:
    """A lone caller's statement runs in the caller's own task: cancelling the caller cancels it, and the
    statements in flight are counted down, so later callers are sent at once and still share."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TRIGGER)
    sizes = _count_statements(app)
    lone = asyncio.create_task(app.schedule("report", {"n": 0, "slow": 5.0}))
    await asyncio.sleep(0.5)
    lone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lone
    assert sizes == [1]
    job_id = await app.schedule("report", {"n": 1})
    assert sizes == [1, 1] and _rows(dsn)[job_id] == 1
    ids = await asyncio.gather(*(app.schedule("report", {"n": n}) for n in range(2, 42)))
    assert {n: _rows(dsn)[job_id] for n, job_id in zip(range(2, 42), ids, strict=True)} == {n: n for n in range(2, 42)}
    assert max(sizes) > 1


async def test_an_unreachable_database_fails_every_caller_of_a_shared_statement(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, database_wait_seconds=0.5)
    async with app:
        assert app._batcher is not None

        async def unreachable(specs: Sequence[JobSpec]) -> dict[tuple[str, str], uuid.UUID]:
            await asyncio.sleep(0.05)
            raise jobbus.DatabaseUnavailableError("gone", written=False)

        sizes: list[int] = []

        async def counted(specs: Sequence[JobSpec]) -> dict[tuple[str, str], uuid.UUID]:
            sizes.append(len(specs))
            return await unreachable(specs)

        app._batcher._insert = counted
        results = await asyncio.gather(*(app.schedule("report", {"n": n}) for n in range(20)), return_exceptions=True)
    assert all(isinstance(result, jobbus.DatabaseUnavailableError) for result in results)
    assert sum(sizes) == 20  # shared statements were not sent again per caller
    assert _rows(dsn) == {}
