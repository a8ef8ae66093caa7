"""Least privilege: the worker, operator and observer roles of docs/security.md can do their job, and no more."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

import jobbus
from jobbus import control, schema
from jobbus.store.jobs import COPY_MIN_ROWS
from tests.roles import (
    AUDIT_OF_MIGRATION_36,
    CLAIM_OF_MIGRATION_23,
    WEIGHTS_OF_MIGRATION_28,
    before_tags,
    granted_roles,
    without_lines,
)


@pytest.fixture
def roles(dsn: str) -> Iterator[dict[str, str]]:
    with granted_roles(dsn, ("worker", "operator", "observer", "producer")) as conninfos:
        yield conninfos


def _app(dsn: str) -> jobbus.App:
    app = jobbus.App(dsn=dsn, poll_interval_seconds=0.2, retry_base_delay_seconds=0, retry_max_delay_seconds=0)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> int:
        await job.checkpoint({"ok": True})
        await job.progress(1, 1)
        return 1

    return app


async def test_worker_role_produces_and_runs_jobs_but_cannot_delete_or_migrate(roles: dict[str, str]) -> None:
    app = _app(roles["worker"])
    async with app:
        ids = await app.schedule_many("t", [{}, {}, {}])
        assert await app.schedule("t", unique_key="k") == await app.schedule("t", unique_key="k")
        assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False, worker_id="w") == 0
        jobs = [await app.find(i) for i in ids]
        assert [j.result for j in jobs if j] == [1, 1, 1]
        assert await app.cancel(await app.schedule("t")) is jobbus.JobStatus.CANCELLED
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await app.prune(timedelta(0))
    with psycopg.connect(roles["worker"], autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE TABLE jobbus.sneaky (x int)")


async def test_operator_role_steers_workers_and_prunes(roles: dict[str, str]) -> None:
    app = _app(roles["operator"])
    async with app:
        job_id = await app.schedule("t")
        await app.cancel(job_id)
        issued = await control.pause(app, queue="default")
        assert issued.generation > 0
        await control.resume(app, queue="default")
        assert await app.prune(timedelta(0)) == 1
        assert await app.find(job_id) is None


async def test_observer_role_reads_but_cannot_write(roles: dict[str, str], sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("t", {"visible": True})
    app = _app(roles["observer"])
    async with app:
        job = await app.find(job_id)
        assert job is not None and job.configuration_data == {"visible": True}
        assert len(await app.list_jobs()) == 1
        await control.queue_status(app)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await app.schedule("t")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await app.cancel(job_id)


async def test_producer_role_schedules_and_deduplicates_with_insert_and_select_only(
    roles: dict[str, str], sync_app: jobbus.App
) -> None:
    running_id = sync_app.sync.schedule("t", unique_key="busy")
    with psycopg.connect(sync_app.dsn, autocommit=True) as conn:  # the key's job is running
        conn.execute(
            "UPDATE jobbus.job SET status = 'running', lease_token = gen_random_uuid() WHERE id = %s", (running_id,)
        )
    app = _app(roles["producer"])
    async with app:
        ids = await app.schedule_many("t", [{}, {}])
        copied = await app.schedule_many("t", [{}] * COPY_MIN_ROWS)  # COPY needs only INSERT
        assert len(set(copied)) == COPY_MIN_ROWS
        assert await app.schedule("t", unique_key="k") == await app.schedule("t", unique_key="k")
        assert await app.schedule("t", unique_key="busy") == running_id
        assert app.sync.schedule("t", unique_key="busy") == running_id
        assert {j.id for j in await app.list_jobs()} >= set(ids)
        assert (await app.find(ids[0])) is not None
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await app.cancel(ids[0])
    app.sync.close()
    with (
        psycopg.connect(roles["producer"], autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT * FROM jobbus.claim_jobs('x', 1, '{default}', '{t}', 60, 1000000, '{}')")


def test_role_names_are_validated() -> None:
    with pytest.raises(ValueError, match="worker role"):
        schema.roles_script("jobbus", worker='x"; DROP TABLE jobbus.job; --', operator="o", observer="r")


async def test_hostile_queue_and_type_names_are_data_not_sql(app: jobbus.App) -> None:
    evil = "x'); DROP TABLE jobbus.job; --"

    @app.job(evil, queue=evil)
    async def handler(job: jobbus.JobExecution) -> str:
        return job.type

    job_id = await app.schedule(evil, {"k": evil}, unique_key=evil, name=evil)
    assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False) == 0
    job = await app.find(job_id)
    assert job is not None and (job.queue, job.result, job.status) == (evil, evil, jobbus.JobStatus.COMPLETED)


async def test_a_producer_may_name_a_group_in_a_follow_up_and_is_told_when_the_group_has_a_callback(
    roles: dict[str, str],
) -> None:
    producer = _app(roles["producer"])
    async with producer:
        group, _ = await producer.schedule_group([("t", {})], then=jobbus.JobRequest("t", {"callback": True}))
        assert await producer.schedule("t", then=jobbus.JobRequest("t", group_id=uuid.uuid4()))
        with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
            await producer.schedule("t", then=jobbus.JobRequest("t", group_id=group))


async def test_workflows_run_under_the_worker_role_and_producers_chain_group_and_emit(roles: dict[str, str]) -> None:
    producer = _app(roles["producer"])
    async with producer:
        first = await producer.schedule("t", then=jobbus.JobRequest("t", {"chained": True}))
        await producer.schedule_group([("t", {})], then=jobbus.JobRequest("t", {"callback": True}))
        assert await producer.emit_event("paid", {"ok": True})
    worker = _app(roles["worker"])

    @worker.job("w")
    async def waits(job: jobbus.JobExecution) -> object:
        await job.step("s", lambda: 1)
        return await job.wait_for_event("paid")

    async with worker:
        waiting = await worker.schedule("w")
        await worker.run_worker(stop_when_empty=True, install_signal_handlers=False, worker_id="w")
        assert (await worker.find(first)).status is jobbus.JobStatus.COMPLETED  # type: ignore[union-attr]
        assert len(await worker.list_jobs(type="t", status="completed")) == 4
    async with producer:
        job = await producer.wait(waiting, timeout=5)
    assert job.result == {"ok": True} and job.steps["s"] == 1


def test_a_dashboard_role_granted_before_failure_groups_still_retries_after_their_migration(empty_dsn: str) -> None:
    """A retry clears `error_group` (migration 15): the migration lets a role granted the columns a retry
    changed before it (the dashboard role's grants of an earlier release) change that one too."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").split("\n-- 0015_")[0].encode())
    earlier = ("worker", "operator", "observer", "dashboard")

    def grants_before_failure_groups(grants: str) -> str:  # nor sample_queues, of migration 16
        return without_lines(
            before_tags(grants).replace(", error_group", ""),
            "sample_queues",
            CLAIM_OF_MIGRATION_23,
            *WEIGHTS_OF_MIGRATION_28,
            "schedule_keyed",
            AUDIT_OF_MIGRATION_36,
        )

    with granted_roles(empty_dsn, earlier, edit=grants_before_failure_groups) as roles:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            assert min(m.version for m in schema.migrate(conn, "jobbus")) == 15
            job_id = conn.execute(
                "INSERT INTO jobbus.job (id, type, max_attempts, status, finished_at, last_error, error_group) "
                "VALUES (gen_random_uuid(), 't', 1, 'failed', now(), 'user 7 not found', 'user <n> not found') "
                "RETURNING id"
            ).fetchone()[0]  # type: ignore[index]
        app = jobbus.App(dsn=roles["dashboard"])
        with app.sync:
            app.sync.retry(job_id)
        with psycopg.connect(empty_dsn) as conn:
            row = conn.execute("SELECT status, error_group FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
        assert row == ("queued", None)


#: The functions that run as the schema's owner and may be called directly, with arguments that make a
#: call harmless when it is allowed.
OWNER_FUNCTIONS = {
    "delete_finished_jobs": "SELECT jobbus.delete_finished_jobs('completed', 86400, 1)",
    "delete_old_events": "SELECT jobbus.delete_old_events(86400, 1)",
    "delete_finished_groups": "SELECT jobbus.delete_finished_groups(86400, 1)",
    "sample_queues": "SELECT jobbus.sample_queues(10, 1, 60)",
    "emit_event": "SELECT jobbus.emit_event('k', 'null', NULL)",
    "group_scheduled": "SELECT jobbus.group_scheduled(gen_random_uuid(), '{}', 0, NULL)",
    "refuse_callback_group": "SELECT jobbus.refuse_callback_group(gen_random_uuid(), '')",
}
LEADER_FUNCTIONS = {"delete_finished_jobs", "delete_old_events", "delete_finished_groups", "sample_queues"}


def _may_call(conninfo: str) -> set[str]:
    allowed = set()
    with psycopg.connect(conninfo) as conn:
        for name, query in OWNER_FUNCTIONS.items():
            try:
                conn.execute(query.encode())
            except psycopg.errors.InsufficientPrivilege:
                conn.rollback()
            else:
                conn.rollback()
                allowed.add(name)
    return allowed


def test_functions_that_run_as_the_owner_are_executable_only_by_the_roles_granted_them(dsn: str) -> None:
    """An observer could delete finished jobs and emit events through the owner's functions (PUBLIC kept
    EXECUTE on them until migration 19)."""
    with granted_roles(dsn, ("worker", "operator", "observer", "producer", "dashboard")) as roles:
        may = {kind: _may_call(conninfo) for kind, conninfo in roles.items()}
    assert may["observer"] == set()
    assert may["dashboard"] == set()
    assert may["producer"] == set(OWNER_FUNCTIONS) - LEADER_FUNCTIONS
    assert may["worker"] == may["operator"] == set(OWNER_FUNCTIONS)


def test_roles_granted_before_migration_19_keep_what_they_used_and_an_observer_loses_the_rest(
    empty_dsn: str,
) -> None:
    """Before migration 19 the grants named none of the event and group functions (PUBLIC could run
    them): the migration grants them by each role's rights on the job table."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").split("\n-- 0019_")[0].encode())

    def grants_before_migration_19(grants: str) -> str:
        kept, skipping = [], False
        for line in grants.splitlines():
            skipping = skipping or line.startswith("GRANT EXECUTE ON FUNCTION jobbus.emit_event")
            if not skipping:
                kept.append(line)
            skipping = skipping and not line.rstrip().endswith(";")
        return without_lines(
            before_tags("\n".join(kept)),
            CLAIM_OF_MIGRATION_23,
            *WEIGHTS_OF_MIGRATION_28,
            "schedule_keyed",
            AUDIT_OF_MIGRATION_36,
        )

    kinds = ("worker", "operator", "observer", "producer", "dashboard")
    with granted_roles(empty_dsn, kinds, edit=grants_before_migration_19) as roles:
        assert _may_call(roles["observer"]) == set(OWNER_FUNCTIONS)  # the hole
        assert "emit_event" in _may_call(roles["producer"])  # through PUBLIC only
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            assert [m.version for m in schema.migrate(conn, "jobbus")] == list(range(19, schema.latest_version() + 1))
        may = {kind: _may_call(conninfo) for kind, conninfo in roles.items()}
    assert may["observer"] == set()
    assert may["producer"] == set(OWNER_FUNCTIONS) - LEADER_FUNCTIONS
    assert may["dashboard"] == set(OWNER_FUNCTIONS) - LEADER_FUNCTIONS  # it inserts jobs (a periodic's run now)
    assert may["worker"] == may["operator"] == set(OWNER_FUNCTIONS)
