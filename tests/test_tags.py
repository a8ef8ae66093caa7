"""Tags and bulk edits (SPEC 21): tags as given wherever job options are, the tag filter of
`list_jobs` at tens of thousands of rows, `update` and `update_many` only ever changing queued jobs
(a job claimed meanwhile is left as it is and not counted), batches, the per-key bookkeeping of a
job moved to another queue, and the wake-up of workers."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jobbus
from jobbus import schema
from jobbus.models import JobStatus
from jobbus.requests import validate_tags
from tests.processes import finish, prepare, query, start_worker, status_of, wait_until
from tests.roles import AUDIT_OF_MIGRATION_36, before_tags, granted_roles, without_lines
from tests.storehelpers import claim, write


def _tags(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> Any:
    row = conn.execute("SELECT tags FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


def test_tags_are_kept_in_order_without_repeats_and_read_back(dsn: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("t", {}, tags=["b", "a", "b"])
    plain = sync_app.sync.schedule("t", {})
    empty = sync_app.sync.schedule("t", {}, tags=[])
    job = sync_app.sync.find(job_id)
    assert job is not None and job.tags == ("b", "a")
    assert sync_app.sync.find(plain).tags == ()  # type: ignore[union-attr]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _tags(conn, plain) is None  # a job without tags stores nothing
        assert _tags(conn, empty) is None


@pytest.mark.parametrize(
    ("tags", "problem"),
    [
        ("a", "must be a list of strings"),
        ([1], "must hold strings only, item 0"),
        (["ok", "  "], "must not hold an empty tag (item 1)"),
        (["x" * 65], "holds a tag of 65 characters (item 0)"),
        ([f"t{n}" for n in range(17)], "has 17 different tags, at most 16"),
        (["a\x00"], "NUL"),
        (["\ud800"], "lone surrogate"),
    ],
)
def test_bad_tags_are_refused_with_the_problem_named_and_nothing_written(
    dsn: str, sync_app: jobbus.App, tags: Any, problem: str
) -> None:
    for call in (
        lambda: sync_app.sync.schedule("t", {}, tags=tags),
        lambda: sync_app.sync.schedule_many("t", [{}, {}], tags=tags),
        lambda: sync_app.sync.schedule_many([jobbus.JobRequest("t", tags=tags)]),
        lambda: sync_app.sync.schedule("t", {}, then=jobbus.JobRequest("u", tags=tags)),
    ):
        with pytest.raises(jobbus.InvalidJobError, match="tags") as refused:
            call()
        assert problem in str(refused.value)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobbus.job").fetchone() == (0,)


@given(st.lists(st.text(max_size=70), max_size=20))
@settings(max_examples=200)
def test_validated_tags_are_the_given_ones_once_each_in_order(given_tags: list[str]) -> None:
    try:
        tags = validate_tags("tags", given_tags)
    except jobbus.InvalidJobError:
        distinct = list(dict.fromkeys(given_tags))
        assert (
            len(distinct) > 16
            or any(not t.strip() or len(t) > 64 or "\x00" in t for t in given_tags)
            or any(not t.isascii() and not _encodes(t) for t in given_tags)
        )
        return
    assert list(tags or ()) == list(dict.fromkeys(given_tags))


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def test_tags_travel_with_follow_ups_groups_and_many(dsn: str, sync_app: jobbus.App) -> None:
    first = sync_app.sync.schedule("t", {}, tags=["a"], then=jobbus.JobRequest("u", tags=["next", "next"]))
    many = sync_app.sync.schedule_many("t", [{"n": n} for n in range(300)], tags=["bulk"])  # past the COPY size
    _, members = sync_app.sync.schedule_group([jobbus.JobRequest("t", tags=["member"])])
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _tags(conn, first) == ["a"]
        assert {tuple(_tags(conn, job_id)) for job_id in many} == {("bulk",)}
        assert _tags(conn, members[0]) == ["member"]
        (job,) = claim(sync_app, conn, 1, types=("t",))
        while job.id != first:
            assert write(sync_app, conn, job, JobStatus.COMPLETED)
            (job,) = claim(sync_app, conn, 1, types=("t",))
        assert write(sync_app, conn, job, JobStatus.COMPLETED)
        follow_up = conn.execute("SELECT tags FROM jobbus.job WHERE type = 'u'").fetchone()
        assert follow_up == (["next"],)


def test_the_tag_filter_is_exact_at_twenty_thousand_jobs(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.schedule_many("t", [{}] * 12_000, tags=["tenant:1"])
    sync_app.sync.schedule_many("t", [{}] * 6_000, tags=["tenant:1", "vip"])
    sync_app.sync.schedule_many("t", [{}] * 2_500, tags=["vip"])
    sync_app.sync.schedule_many("t", [{}] * 500)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE jobbus.job")

    def count(tag: Any) -> int:
        seen, after = 0, None
        while True:
            page = sync_app.sync.list_jobs(tag=tag, after=after, limit=10_000)
            seen += len(page)
            if len(page) < 10_000:
                return seen
            after = page[-1].id

    assert count("tenant:1") == 18_000
    assert count(["tenant:1", "vip"]) == 6_000
    assert count(["vip"]) == 8_500
    assert count("nobody") == 0
    assert all("vip" in job.tags for job in sync_app.sync.list_jobs(tag="vip", newest_first=True, limit=50))


def test_update_changes_a_queued_job_and_refuses_every_other(dsn: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("t", {}, tags=["a"], available_at=timedelta(hours=1))
    at = datetime(2031, 1, 2, tzinfo=UTC)
    sync_app.sync.update(job_id, priority=7, queue="other", available_at=at, tags=["b", "c"])
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert (job.priority, job.queue, job.available_at, job.tags) == (7, "other", at, ("b", "c"))
    sync_app.sync.update(job_id, tags=[])
    assert sync_app.sync.find(job_id).tags == ()  # type: ignore[union-attr]
    with pytest.raises(jobbus.InvalidStateError, match="does not exist"):
        sync_app.sync.update(uuid.uuid4(), priority=1)
    with pytest.raises(jobbus.InvalidJobError, match="at least one change"):
        sync_app.sync.update(job_id)
    with pytest.raises(jobbus.InvalidJobError, match="priority"):
        sync_app.sync.update(job_id, priority=2**31)
    with pytest.raises(jobbus.InvalidJobError, match="queue"):
        sync_app.sync.update(job_id, queue="")
    with pytest.raises(jobbus.InvalidJobError, match="tags"):
        sync_app.sync.update(job_id, tags=["x" * 65])
    running = sync_app.sync.schedule("t", {})
    with psycopg.connect(dsn, autocommit=True) as conn:
        (claimed,) = claim(sync_app, conn, 1, queues=["default"])
        assert claimed.id == running
        before = conn.execute("SELECT priority, queue, tags FROM jobbus.job WHERE id = %s", (running,)).fetchone()
        with pytest.raises(jobbus.InvalidStateError, match="is running; only queued jobs can be updated"):
            sync_app.sync.update(running, priority=5, tags=["x"])
        assert write(sync_app, conn, claimed, JobStatus.COMPLETED)
        with pytest.raises(jobbus.InvalidStateError, match="is completed"):
            sync_app.sync.update(running, queue="q")
        after = conn.execute("SELECT priority, queue, tags FROM jobbus.job WHERE id = %s", (running,)).fetchone()
        assert before == after


def test_update_many_changes_every_match_in_batches_and_counts_them(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.schedule_many("t", [{}] * 2_345, queue="a", tags=["x"])
    sync_app.sync.schedule_many("t", [{}] * 10, queue="a")
    sync_app.sync.schedule_many("u", [{}] * 20, queue="a", tags=["x"])
    sync_app.sync.schedule_many("t", [{}] * 30, queue="b", tags=["x"])
    batches: list[int] = []
    changed = sync_app.sync.update_many(
        queue="a", type="t", tag="x", set_priority=3, set_queue="c", add_tags=["y", "x"], on_batch=batches.append
    )
    assert changed == 2_345
    assert batches == [1_000, 2_000, 2_345]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT queue, type, priority, tags, count(*) FROM jobbus.job GROUP BY 1, 2, 3, 4"
        ).fetchall()
    assert sorted(rows, key=str) == sorted(
        [("c", "t", 3, ["x", "y"], 2_345), ("a", "t", 0, None, 10), ("a", "u", 0, ["x"], 20), ("b", "t", 0, ["x"], 30)],
        key=str,
    )
    assert sync_app.sync.update_many(tag=["x", "y"], set_available_at=timedelta(hours=2)) == 2_345
    assert sync_app.sync.update_many(queue="nowhere", set_priority=1) == 0


def test_update_many_refuses_what_it_cannot_do_before_writing(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.schedule("t", {}, tags=[f"t{n}" for n in range(16)])
    with pytest.raises(jobbus.InvalidJobError, match="at least one filter"):
        sync_app.sync.update_many(set_priority=1)
    with pytest.raises(jobbus.InvalidJobError, match="at least one change"):
        sync_app.sync.update_many(queue="default")
    with pytest.raises(jobbus.InvalidJobError, match="set_priority"):
        sync_app.sync.update_many(queue="default", set_priority="high")  # type: ignore[arg-type]
    with pytest.raises(jobbus.InvalidJobError, match="add_tags"):
        sync_app.sync.update_many(queue="default", add_tags=[""])
    with pytest.raises(jobbus.InvalidJobError, match="add_tags"):
        sync_app.sync.update_many(queue="default", add_tags=[])
    with pytest.raises(jobbus.InvalidJobError, match="would have 17 different tags"):
        sync_app.sync.update_many(queue="default", add_tags=["one more"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT cardinality(tags), priority FROM jobbus.job").fetchone() == (16, 0)


def test_update_racing_claims_never_touches_a_claimed_job_nor_counts_it(dsn: str, sync_app: jobbus.App) -> None:
    """Claims of 7 run while update_many moves the queue's jobs: every job ends either claimed with its
    old values or queued with the new ones, and the count is exactly the jobs changed."""
    sync_app.sync.schedule_many("t", [{}] * 3_000, queue="a")
    stop = threading.Event()
    claimed: list[uuid.UUID] = []

    def claims() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                jobs = claim(sync_app, conn, 7, queues=["a"])
                claimed.extend(j.id for j in jobs)
                if not jobs:
                    return

    thread = threading.Thread(target=claims)
    thread.start()
    try:
        changed = sync_app.sync.update_many(queue="a", set_priority=9, set_queue="moved")
    finally:
        stop.set()
        thread.join()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id, status, queue, priority FROM jobbus.job").fetchall()
    by_status = Counter((status, queue, priority) for _, status, queue, priority in rows)
    assert by_status[("running", "a", 0)] == len(claimed)
    assert by_status[("queued", "moved", 9)] == changed
    assert len(claimed) + changed == 3_000
    assert {job_id for job_id, status, *_ in rows if status == "running"} == set(claimed)


def test_a_job_moved_to_a_queue_with_per_key_limits_is_claimed_there_within_them(
    dsn: str, sync_app: jobbus.App
) -> None:
    sync_app.sync.set_queue("limited", concurrency_per_key=1)
    keyed = [sync_app.sync.schedule("t", {}, queue="plain", concurrency_key=k) for k in ("k1", "k1", "k2")]
    sync_app.sync.schedule("t", {}, queue="limited", concurrency_key="k1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        (held,) = claim(sync_app, conn, 10, queues=["limited"])  # k1 is now at its limit in "limited"
        sync_app.sync.update(keyed[0], queue="limited")
        assert sync_app.sync.update_many(queue="plain", set_queue="limited") == 2
        taken = claim(sync_app, conn, 10, queues=["limited"])
        assert [j.id for j in taken] == [keyed[2]]  # k2 is claimable there; k1 waits for its slot
        assert write(sync_app, conn, held, JobStatus.COMPLETED)
        again = claim(sync_app, conn, 10, queues=["limited"])
        assert len(again) == 1 and again[0].id in keyed[:2]
        assert claim(sync_app, conn, 10, queues=["limited"]) == []
        assert write(sync_app, conn, again[0], JobStatus.COMPLETED)
        last = claim(sync_app, conn, 10, queues=["limited"])
        assert [j.id for j in last] == [k for k in keyed[:2] if k != again[0].id]


def test_a_move_to_another_queue_wakes_an_idle_worker_of_that_queue(dsn: str, sync_app: jobbus.App) -> None:
    prepare(dsn)
    job_id = sync_app.sync.schedule("record", {}, queue="parked")
    proc = start_worker(dsn, "--poll-interval", "30", "--queue", "live")
    try:
        wait_until(lambda: query(dsn, "SELECT 1 FROM jobbus.worker WHERE state = 'running'"), what="the worker")
        # Idle past its first (empty) claim: only the notification can wake it within the poll interval.
        seen = "SELECT 1 FROM jobbus.worker WHERE last_seen_at > started_at"
        wait_until(lambda: query(dsn, seen), what="a heartbeat")
        moved = time.monotonic()
        sync_app.sync.update(job_id, queue="live")
        wait_until(lambda: status_of(dsn, job_id) == "completed", timeout=25, what="the moved job to run")
        assert time.monotonic() - moved < 25
    finally:
        proc.terminate()
        finish(proc)


async def test_tags_of_a_spawned_child_and_of_a_task_options(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, poll_interval_seconds=0.2)

    @app.job("parent")
    async def parent(job: jobbus.JobExecution) -> None:
        await job.spawn("child", {}, tags=["spawned", "spawned"], queue="kids")

    @app.task(queue="tasks")
    def add(a: int, b: int) -> int:
        return a + b

    async with app:
        parent_id = await app.schedule("parent", {})
        task_id = await add.options(tags=["task"]).defer(1, 2)
        assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False, queues=["default"]) == 0
        (child,) = await app.list_jobs(type="child")
        assert child.tags == ("spawned",) and child.parent_id == parent_id
        task = await app.find(task_id)
        assert task is not None and task.tags == ("task",)


def test_the_dashboard_role_edits_queued_jobs_also_when_granted_before_tags(empty_dsn: str) -> None:
    """The dashboard role of docs/security.md may change priority, queue and tags; one granted before
    migration 31 (without those columns) is granted them by it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").split("\n-- 0031_")[0].encode())

    def grants_before_tags(grants: str) -> str:
        earlier = before_tags(grants)
        assert earlier != grants
        return without_lines(earlier, AUDIT_OF_MIGRATION_36)

    with granted_roles(empty_dsn, ("worker", "operator", "observer", "dashboard"), edit=grants_before_tags) as roles:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            assert min(m.version for m in schema.migrate(conn, "jobbus")) == 31
        owner = jobbus.App(dsn=empty_dsn)
        with owner.sync:
            ids = owner.sync.schedule_many("t", [{}] * 3, tags=["x"])
        app = jobbus.App(dsn=roles["dashboard"])
        with app.sync:
            app.sync.update(ids[0], priority=4, queue="q", tags=["y"])
            assert app.sync.update_many(tag="x", set_queue="r", add_tags=["z"]) == 2
        with psycopg.connect(empty_dsn) as conn:
            rows = conn.execute("SELECT queue, priority, tags FROM jobbus.job ORDER BY id").fetchall()
        assert rows == [("q", 4, ["y"]), ("r", 0, ["x", "z"]), ("r", 0, ["x", "z"])]


def test_update_racing_a_claim_either_moves_the_queued_job_or_leaves_the_claimed_one_as_it_is(
    dsn: str, sync_app: jobbus.App
) -> None:
    """An update that moves a job out of queue a races a claim of queue a, round after round: exactly one
    of them wins, and the loser leaves no trace (a refused update changes nothing, a claim that comes
    second finds nothing)."""
    outcomes: Counter[str] = Counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(40):
            job_id = sync_app.sync.schedule("t", {}, queue="a")
            barrier = threading.Barrier(2)
            claimed: list[Any] = []
            refused: list[Exception] = []

            def take(barrier: threading.Barrier, claimed: list[Any]) -> None:
                with psycopg.connect(dsn, autocommit=True) as own:
                    barrier.wait()
                    claimed.extend(claim(sync_app, own, 1, queues=["a"]))

            thread = threading.Thread(target=take, args=(barrier, claimed))
            thread.start()
            barrier.wait()
            try:
                sync_app.sync.update(job_id, queue="b", priority=5)
            except jobbus.InvalidStateError as exc:
                refused.append(exc)
            thread.join()
            row = conn.execute("SELECT status, queue, priority FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
            if refused:
                assert [j.id for j in claimed] == [job_id] and row == ("running", "a", 0)
                outcomes["claimed"] += 1
            else:
                assert claimed == [] and row == ("queued", "b", 5)
                outcomes["moved"] += 1
            conn.execute("DELETE FROM jobbus.job WHERE id = %s AND status = 'queued'", (job_id,))
            conn.execute("UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE id = %s", (job_id,))
    assert sum(outcomes.values()) == 40, outcomes


def test_tags_travel_with_weights_windows_and_debounce(dsn: str, sync_app: jobbus.App) -> None:
    """Each of SPEC 21's options goes through its own insert (weighted, keyed): the tags go with them, from
    Python and from the SQL API."""
    producer = sync_app.sync
    weighted = producer.schedule("t", tags=["w"], weight=2)
    windowed = producer.schedule("t", tags=["u"], unique_key="k1", unique_for=60)
    debounced = producer.schedule("t", tags=["d"], unique_key="k2", debounce=5, weight=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        via_sql = conn.execute(
            'SELECT jobbus.schedule(\'t\', \'{}\', \'{"tags": ["s"], "weight": 2, "unique_key": "k3", "debounce": 5}\')'
        ).fetchone()
        assert via_sql is not None
        rows: dict[uuid.UUID, str] = dict(conn.execute("SELECT id, (tags, weight)::text FROM jobbus.job").fetchall())
        assert rows == {
            weighted: "({w},2)",
            windowed: "({u},1)",
            debounced: "({d},3)",
            via_sql[0]: "({s},2)",
        }


def test_a_parked_debounced_job_keeps_waiting_for_its_run_and_a_heavy_job_is_not_moved_past_a_limit(
    dsn: str, sync_app: jobbus.App
) -> None:
    """A bulk edit meets the jobs of weights (0028) and debounce (0030): a new start of a job parked behind
    the run of its key becomes the start it is released at, and a move of a job heavier than the target
    queue's limit is refused with nothing changed."""
    producer = sync_app.sync
    producer.set_queue("narrow", concurrency=2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        producer.schedule("t", unique_key="k", debounce=0.01)
        (running,) = wait_until(lambda: claim(sync_app, conn, 1, types=("t",)) or None, what="the first run")
        parked = producer.schedule("t", {"n": 2}, unique_key="k", debounce=60)
        assert parked != running.id
        producer.update(parked, available_at=timedelta(hours=2), priority=5)
        row = conn.execute(
            "SELECT available_at = jobbus.never(), debounce_until > now() + interval '1 hour', priority"
            " FROM jobbus.job WHERE id = %s",
            (parked,),
        ).fetchone()
        assert row == (True, True, 5)
        assert producer.update_many(type="t", set_available_at=timedelta(hours=3)) == 1
        heavy = producer.schedule("t", weight=3)
        with pytest.raises(jobbus.InvalidJobError, match="weight 3 is more than the concurrency of queue narrow"):
            producer.update(heavy, queue="narrow")
        with pytest.raises(jobbus.InvalidJobError, match="weight 3"):
            producer.update_many(type="t", set_queue="narrow")
        queues: dict[uuid.UUID, str] = dict(
            conn.execute("SELECT id, queue FROM jobbus.job WHERE status = 'queued'").fetchall()
        )
        assert queues == {parked: "default", heavy: "default"}
        assert write(sync_app, conn, running, JobStatus.COMPLETED)
        released = conn.execute(
            "SELECT available_at > now() + interval '2 hours' FROM jobbus.job WHERE id = %s", (parked,)
        )
        assert released.fetchone() == (True,)
