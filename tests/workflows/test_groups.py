"""Group callbacks: `then` is written exactly once, in the transaction that makes the last member terminal."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import uuid
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobOptions, JobRequest, JobStatus
from jobbus.models import ClaimedJob
from jobbus.store import Outcome, run_sync
from tests.processes import query, wait_until, workers
from tests.storehelpers import claim, write


def _drain(proc: subprocess.Popen[str], into: list[str]) -> None:
    """Read a worker's output as it comes, so that a full pipe never blocks its logging."""
    assert proc.stdout is not None
    for line in proc.stdout:
        into.append(line)


def _callbacks(dsn: str) -> list[str]:
    return [row[0] for row in query(dsn, "SELECT configuration_data->>'group' FROM jobbus.job WHERE type = 'merge'")]


async def test_callback_follows_the_last_member_whatever_the_outcomes(app: jobbus.App, dsn: str) -> None:
    group_id, ids = await app.schedule_group(
        [JobRequest("t", {"i": i}) for i in range(3)], then=JobRequest("merge", {"group": "g"})
    )
    assert len(ids) == 3
    assert {job.group_id for job in await app.list_jobs(type="t")} == {group_id}
    with psycopg.connect(dsn, autocommit=True) as conn:
        first, second = claim(app, conn, limit=2)
        assert write(app, conn, first, JobStatus.FAILED, error="no")
        assert await app.cancel(ids[2]) is JobStatus.CANCELLED
        assert _callbacks(dsn) == []
        assert write(app, conn, second, JobStatus.COMPLETED)
        assert not write(app, conn, second, JobStatus.COMPLETED)
    assert _callbacks(dsn) == ["g"]
    # a failed member retried and finished again does not schedule the callback a second time
    await app.retry(first.id)
    with psycopg.connect(dsn, autocommit=True) as conn:
        (again,) = claim(app, conn)
        assert write(app, conn, again, JobStatus.COMPLETED)
    assert _callbacks(dsn) == ["g"]


async def test_a_group_without_callback_and_bad_input(app: jobbus.App) -> None:
    group_id = uuid.uuid4()
    assert (await app.schedule_group([("t", {})], group_id=group_id))[0] == group_id
    with pytest.raises(jobbus.InvalidJobError):
        await app.schedule_group([])
    with pytest.raises(jobbus.InvalidJobError):
        await app.schedule_group([JobRequest("t", group_id=uuid.uuid4())], group_id=group_id)


def test_sync_schedule_group(sync_app: jobbus.App, dsn: str) -> None:
    group_id, ids = sync_app.sync.schedule_group([("t", {}), ("t", {})], then=JobRequest("merge", {"group": "s"}))
    for job_id in ids:
        sync_app.sync.cancel(job_id)
    assert _callbacks(dsn) == ["s"]
    assert sync_app.sync.group_progress(group_id).cancelled == 2


async def test_thousands_of_groups_completing_concurrently_get_one_callback_each(app: jobbus.App, dsn: str) -> None:
    """2,000 groups of two members (one completes, one fails) run by two worker processes, 16 jobs at a
    time each: members of a group finish concurrently in different outcome batches."""
    groups = 2000
    requests = [
        app.schedule_group(
            [JobRequest("wf.noop", {"value": g}), JobRequest("wf.fail", {"value": g})],
            then=JobRequest("merge", {"group": str(g)}),
        )
        for g in range(groups)
    ]
    for start in range(0, groups, 200):
        await asyncio.gather(*requests[start : start + 200])
    with workers(dsn, 2, "--app", "tests.workflow_apps:app", "--concurrency", "16") as procs:
        output: list[str] = []
        readers = [threading.Thread(target=_drain, args=(proc, output), daemon=True) for proc in procs]
        for reader in readers:
            reader.start()
        wait_until(
            lambda: (
                query(dsn, "SELECT count(*) FROM jobbus.job WHERE type LIKE 'wf.%%' AND status = 'queued'")[0][0] == 0
                and query(dsn, "SELECT count(*) FROM jobbus.job WHERE status = 'running'")[0][0] == 0
            ),
            timeout=240,
            what="every member finished",
        )
        for proc in procs:
            assert proc.poll() is None
    assert not [line for line in output if "deadlock" in line.lower()]
    callbacks = _callbacks(dsn)
    assert len(callbacks) == groups
    assert sorted(map(int, callbacks)) == list(range(groups))
    assert query(dsn, "SELECT count(*) FROM jobbus.job_group WHERE scheduled_at IS NULL") == [(0,)]


def test_last_two_members_finished_at_the_same_instant_schedule_one_callback(sync_app: jobbus.App, dsn: str) -> None:
    """Both last members of a group written by two connections at once, 100 times (with and without a
    second group in each batch, in opposite orders, which would deadlock a lock taken row by row)."""
    app = sync_app
    rounds = 100
    for r in range(rounds):
        app.sync.schedule_group([("t", {}), ("t", {})], then=JobRequest("merge", {"group": str(r)}))
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        for _ in range(rounds // 2):
            g1m1, g1m2, g2m1, g2m2 = claim(app, a, limit=4)
            barrier = threading.Barrier(2)

            def finish(
                conn: psycopg.Connection[object], outcomes: list[Outcome], barrier: threading.Barrier = barrier
            ) -> None:
                barrier.wait()
                run_sync(conn, app.store.record_outcomes(outcomes))

            threads = [
                threading.Thread(target=finish, args=(a, [_done(g1m1), _done(g2m2, JobStatus.FAILED)])),
                threading.Thread(target=finish, args=(b, [_done(g1m2, JobStatus.FAILED), _done(g2m1)])),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert sorted(map(int, _callbacks(dsn))) == list(range(rounds))


def _done(job: ClaimedJob, status: JobStatus = JobStatus.COMPLETED) -> Outcome:
    return Outcome(job.id, job.lease_token, status, error=None if status is JobStatus.COMPLETED else "no")


async def test_a_failed_member_retried_before_the_others_finish_is_waited_for(app: jobbus.App, dsn: str) -> None:
    await app.schedule_group([("t", {}), ("t", {})], then=JobRequest("merge", {"group": "r"}))
    with psycopg.connect(dsn, autocommit=True) as conn:
        first, second = claim(app, conn, limit=2)
        assert write(app, conn, first, JobStatus.FAILED, error="no")
        await app.retry(first.id)  # the group has two active members again
        assert write(app, conn, second, JobStatus.COMPLETED)
        assert _callbacks(dsn) == []
        (again,) = claim(app, conn)
        assert write(app, conn, again, JobStatus.COMPLETED)
    assert _callbacks(dsn) == ["r"]
    with pytest.raises(jobbus.InvalidJobError, match="unique_key"):
        await app.schedule_group([JobRequest("t", unique_key="k")], then=JobRequest("merge"))


def _jobs_of(dsn: str, group_id: uuid.UUID) -> int:
    return int(query(dsn, "SELECT count(*) FROM jobbus.job WHERE group_id = %s", (group_id,))[0][0])


async def test_no_job_joins_a_group_that_has_a_callback(app: jobbus.App, dsn: str) -> None:
    """`schedule`, `schedule_many` and a plain SQL insert naming a group with a callback are refused and
    write nothing; the callback still follows its own members only."""
    group_id, (member,) = await app.schedule_group([JobRequest("t")], then=JobRequest("merge", {"group": "g"}))
    with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
        await app.schedule("t", group_id=group_id)
    with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
        await app.schedule_many([JobRequest("t"), JobRequest("t", group_id=group_id)])
    with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
        await asyncio.to_thread(app.sync.schedule, "t", group_id=group_id)
    with pytest.raises(jobbus.InvalidStateError, match="already has jobs"):
        await app.schedule_group([JobRequest("t")], group_id=group_id, then=JobRequest("merge", {"group": "h"}))
    with pytest.raises(jobbus.InvalidStateError, match="already has jobs"):
        await app.schedule_group([JobRequest("t")], group_id=group_id)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="has a callback") as raw:
            conn.execute(
                "INSERT INTO jobbus.job (id, type, queue, group_id, configuration_data, max_attempts)"
                " VALUES (gen_random_uuid(), 't', 'default', %s, '{}', 3)",
                (group_id,),
            )
        assert raw.value.sqlstate == "JB409"
    assert _jobs_of(dsn, group_id) == 1 and len(await app.list_jobs()) == 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        (claimed,) = claim(app, conn)
        assert claimed.id == member and write(app, conn, claimed, JobStatus.COMPLETED)
    assert _callbacks(dsn) == ["g"]


async def test_schedule_group_refuses_an_id_that_already_has_jobs(app: jobbus.App, dsn: str) -> None:
    """A group id first used by plain `schedule(group_id=...)`: schedule_group on it is refused (with or
    without a callback) and nothing is written; plain jobs may still join a group without callback."""
    group_id = uuid.uuid4()
    await app.schedule("t", group_id=group_id)
    for then in (None, JobRequest("merge", {"group": "late"})):
        with pytest.raises(jobbus.InvalidStateError, match="already has jobs"):
            await app.schedule_group([JobRequest("t"), JobRequest("t")], group_id=group_id, then=then)
    assert _jobs_of(dsn, group_id) == 1
    assert query(dsn, "SELECT count(*) FROM jobbus.job_group")[0][0] == 0
    plain, _ = await app.schedule_group([JobRequest("t")])
    await app.schedule("t", group_id=plain)  # no callback: the group is a label, and it may grow
    assert _jobs_of(dsn, plain) == 2


@pytest.mark.parametrize(
    "first, second",
    [
        ("group+then", "group+then"),
        ("group", "group"),
        ("group+then", "schedule"),
        ("schedule", "group+then"),
        ("schedule", "group"),
    ],
)
def test_concurrent_calls_on_one_group_id_cannot_both_win(
    sync_app: jobbus.App, dsn: str, first: str, second: str
) -> None:
    """The first call's transaction is held open while the second is sent: the second waits for the
    group's lock, then sees what the first committed and is refused."""
    app = sync_app
    group_id = uuid.uuid4()

    def call(kind: str, conn: psycopg.Connection[Any]) -> None:
        if kind == "schedule":
            app.sync.schedule("t", group_id=group_id, connection=conn)
        else:
            then = JobRequest("merge", {"group": kind}) if kind.endswith("then") else None
            app.sync.schedule_group([JobRequest("t"), JobRequest("t")], group_id=group_id, then=then, connection=conn)

    errors: list[BaseException] = []
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        call(first, a)

        def racing() -> None:
            try:
                call(second, b)
                b.commit()
            except BaseException as exc:
                errors.append(exc)
                b.rollback()

        thread = threading.Thread(target=racing)
        thread.start()
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        wait_until(
            lambda: query(dsn, waiting)[0][0] == 1,
            timeout=30,
            what="the second call waiting for the group's lock",
        )
        a.commit()
        thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], jobbus.InvalidStateError), errors
    expected = 1 if first == "schedule" else 2
    assert _jobs_of(dsn, group_id) == expected
    callbacks = query(dsn, "SELECT remaining FROM jobbus.job_group WHERE group_id = %s", (group_id,))
    assert callbacks == ([(2,)] if first == "group+then" else [])


async def test_a_follow_up_cannot_name_a_group_with_a_callback(app: jobbus.App, dsn: str) -> None:
    group_id, _ = await app.schedule_group([JobRequest("t")], then=JobRequest("merge", {"group": "g"}))
    deep = JobRequest("t", then=JobRequest("t", then=JobRequest("t", group_id=group_id)))
    for then in (JobRequest("t", group_id=group_id), deep):
        with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
            await app.schedule("t", then=then)
        with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
            await asyncio.to_thread(app.sync.schedule, "t", then=then)
        with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
            await app.schedule_group([JobRequest("t", then=then)])
    assert len(await app.list_jobs()) == 1


async def test_a_follow_up_that_joins_a_group_after_its_callback_was_set_is_counted(app: jobbus.App, dsn: str) -> None:
    """The follow-up was scheduled before the group had a callback; it is inserted when its parent
    completes: it is counted, and the callback waits for it."""
    group_id = uuid.uuid4()
    await app.schedule("first", then=JobRequest("t", {"follow": True}, group_id=group_id))
    await app.schedule_group([JobRequest("t")], group_id=group_id, then=JobRequest("merge", {"group": "g"}))
    with psycopg.connect(dsn, autocommit=True) as conn:
        (parent,) = claim(app, conn, types=("first",))
        assert write(app, conn, parent, JobStatus.COMPLETED)
        assert _jobs_of(dsn, group_id) == 2
        member, follow_up = sorted(claim(app, conn, limit=2), key=lambda job: bool(job.configuration_data))
        assert follow_up.configuration_data == {"follow": True}
        assert write(app, conn, member, JobStatus.COMPLETED)
        assert _callbacks(dsn) == []  # the follow-up is still running
        assert write(app, conn, follow_up, JobStatus.COMPLETED)
    assert _callbacks(dsn) == ["g"]


def _sql_refusal(dsn: str, statement: str, *params: Any) -> psycopg.Error:
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.Error, match="has a callback") as raised:
        conn.execute(statement, params)
    return raised.value


async def test_no_job_of_the_sql_api_or_of_a_users_trigger_joins_a_group_that_has_a_callback(
    app: jobbus.App, dsn: str
) -> None:
    """The SQL API is meant for triggers: a job a user's trigger schedules (or inserts) naming a group that
    has a callback is refused like any other, and the row that fired the trigger is not written either."""
    group_id, _ = await app.schedule_group([JobRequest("t")], then=JobRequest("merge", {"group": "g"}))
    options = f'{{"group_id": "{group_id}"}}'
    refusals = [
        _sql_refusal(dsn, "SELECT jobbus.schedule('t', '{}', %s::jsonb)", options),
        _sql_refusal(
            dsn, "SELECT * FROM jobbus.schedule_many(%s::jsonb)", f'[{{"type": "t"}}, {{"type": "t", {options[1:]}]'
        ),
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.orders (id serial PRIMARY KEY, group_id uuid, plain boolean)")
        conn.execute(
            """CREATE FUNCTION public.order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.plain THEN
                    INSERT INTO jobbus.job (id, type, queue, group_id, configuration_data, max_attempts)
                    VALUES (gen_random_uuid(), 't', 'default', NEW.group_id, '{}', 3);
                ELSE
                    PERFORM jobbus.schedule('t', '{}', jsonb_build_object('group_id', NEW.group_id));
                END IF;
                RETURN NEW;
            END $$"""
        )
        conn.execute(
            "CREATE TRIGGER order_placed AFTER INSERT ON public.orders"
            " FOR EACH ROW EXECUTE FUNCTION public.order_placed()"
        )
    for plain in (False, True):
        refusals.append(
            _sql_refusal(dsn, "INSERT INTO public.orders (group_id, plain) VALUES (%s, %s)", group_id, plain)
        )
    assert [(r.sqlstate, r.diag.column_name) for r in refusals] == [("JB409", "group_id")] * 4
    assert _jobs_of(dsn, group_id) == 1 and len(await app.list_jobs()) == 1
    assert query(dsn, "SELECT count(*) FROM public.orders") == [(0,)]
    other = uuid.uuid4()  # a group without a callback is a label: a trigger's job may join it
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public.orders (group_id, plain) VALUES (%s, false)", (other,))
    assert _jobs_of(dsn, other) == 1


async def test_a_groups_callback_cannot_join_its_own_group_nor_another_that_has_a_callback(
    app: jobbus.App, dsn: str
) -> None:
    """`schedule_group(..., then=)` whose callback (or a member's follow-up) names the group it makes, or a
    group that has a callback, would add a job to a group after its callback: refused, nothing written."""
    closed, _ = await app.schedule_group([JobRequest("t")], then=JobRequest("merge", {"group": "g"}))
    own = uuid.uuid4()
    cases = [
        ([JobRequest("t")], None, JobRequest("merge", {"group": "h"}, group_id=closed)),
        ([JobRequest("t")], own, JobRequest("merge", {"group": "h"}, group_id=own)),
        ([JobRequest("t")], own, JobRequest("merge", {"group": "h"}, then=JobRequest("t", group_id=own))),
        ([JobRequest("t", then=JobRequest("t", group_id=own))], own, JobRequest("merge", {"group": "h"})),
    ]
    for members, group_id, then in cases:
        with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
            await app.schedule_group(members, group_id=group_id, then=then)
        with pytest.raises(jobbus.InvalidStateError, match="has a callback"):
            await asyncio.to_thread(app.sync.schedule_group, members, group_id=group_id, then=then)
    assert len(await app.list_jobs()) == 1
    assert query(dsn, "SELECT count(*) FROM jobbus.job_group") == [(1,)]


@pytest.mark.parametrize("flavour", ["async", "sync"])
@pytest.mark.parametrize("joins", ["child", "follow-up"])
async def test_a_child_cannot_be_spawned_into_a_group_that_has_a_callback(
    app: jobbus.App, dsn: str, flavour: str, joins: str
) -> None:
    """Neither the child nor its `then=` follow-up may name a group that has a callback."""
    group_id, _ = await app.schedule_group([JobRequest("t")], then=JobRequest("merge", {"group": "g"}))
    raised: list[BaseException] = []
    options: JobOptions = (
        {"group_id": group_id} if joins == "child" else {"then": JobRequest("t", {"late": True}, group_id=group_id)}
    )

    if flavour == "async":

        @app.job("parent", max_attempts=1)
        async def parent(job: jobbus.JobExecution) -> None:
            try:
                await job.spawn("t", {"child": True}, **options)
            except Exception as exc:
                raised.append(exc)
                raise

    else:

        @app.job("parent", max_attempts=1)
        def parent_sync(job: jobbus.SyncJobExecution) -> None:
            try:
                job.spawn("t", {"child": True}, **options)
            except Exception as exc:
                raised.append(exc)
                raise

    job_id = await app.schedule("parent")
    assert await jobbus.Worker(app, types=["parent"], stop_when_empty=True).run() == 0
    assert len(raised) == 1 and isinstance(raised[0], jobbus.InvalidStateError), raised
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.FAILED and "has a callback" in (job.last_error or "")
    assert _jobs_of(dsn, group_id) == 1 and not job.steps


async def test_schedule_group_refuses_an_id_that_has_jobs_even_when_every_member_is_deduplicated(
    app: jobbus.App, dsn: str
) -> None:
    """Every member's unique key is held by an active job, so the call would insert nothing: the id that
    already has other jobs is still refused, not taken without a word."""
    group_id = uuid.uuid4()
    await app.schedule("t", group_id=group_id)
    held = await app.schedule("t", unique_key="k")
    with pytest.raises(jobbus.InvalidStateError, match="already has jobs"):
        await app.schedule_group([JobRequest("t", unique_key="k")], group_id=group_id)
    assert _jobs_of(dsn, group_id) == 1
    fresh = uuid.uuid4()  # a new id whose members are all deduplicated: nothing to refuse
    assert await app.schedule_group([JobRequest("t", unique_key="k")], group_id=fresh) == (fresh, [held])
