"""The operator's views (jobbus.views): every list reaches every matching job, in its view's order, page
after page without an empty page, whatever the filters; counts are exact up to their bound and an
estimate (said so) past it. Checked against the rows themselves on tables where a window would lie."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

import jobbus
from jobbus import views
from jobbus.dashboard import create_app
from jobbus.store.views import Count, Filters, JobSummary

#: The rows the tests compare with: what each job is, read back from the table.
ROWS = (
    "SELECT id, status, queue, type, name, unique_key, attempts, available_at, started_at, finished_at,"
    " coalesce(last_error, ''), configuration_data::text, history -> -1 ->> 'outcome', now() FROM jobbus.job"
)


def _truth(dsn: str) -> list[dict[str, Any]]:
    keys = ["id", "status", "queue", "type", "name", "unique_key", "attempts", "available_at", "started_at"]
    keys += ["finished_at", "last_error", "config", "outcome", "now"]
    with psycopg.connect(dsn) as conn:
        return [dict(zip(keys, row, strict=True)) for row in conn.execute(ROWS)]


def _in_view(row: dict[str, Any], view: str) -> bool:
    status, outcome = row["status"], row["outcome"] if row["status"] == "queued" else None
    if view == "finished":
        return status in ("completed", "failed", "cancelled")
    if view == "scheduled":
        return status == "queued" and row["available_at"] > row["now"] and row["attempts"] == 0 and outcome != "waiting"
    if view == "retrying":
        return status == "queued" and row["attempts"] > 0 and outcome != "waiting"
    if view == "waiting":
        return status == "queued" and outcome == "waiting"
    return bool(status == view)


def _matches(row: dict[str, Any], filters: Filters) -> bool:
    if filters.queues and row["queue"] not in filters.queues:
        return False
    if filters.types and row["type"] not in filters.types:
        return False
    if filters.name is not None and row["name"] != filters.name:
        return False
    if filters.text:
        needle = filters.text.lower()
        fields = (row["type"], row["name"], row["unique_key"], row["last_error"], row["config"])
        return any(needle in (field or "").lower() for field in fields)
    return True


def _order(view: str) -> Callable[[dict[str, Any]], Any]:
    if view in ("completed", "failed", "cancelled", "finished"):
        return lambda r: (-r["finished_at"].timestamp(), _desc(r["id"]))
    if view == "running":
        return lambda r: (-r["started_at"].timestamp(), _desc(r["id"]))
    return lambda r: (r["available_at"], r["id"])


def _desc(job_id: uuid.UUID) -> bytes:
    return bytes(255 - b for b in job_id.bytes)


def _expected(rows: list[dict[str, Any]], view: str, filters: Filters) -> list[uuid.UUID]:
    chosen = [r for r in rows if _in_view(r, view) and _matches(r, filters)]
    return [r["id"] for r in sorted(chosen, key=_order(view))]


async def _walk(app: jobbus.App, view: str, filters: Filters, limit: int) -> list[list[JobSummary]]:
    pages: list[list[JobSummary]] = []
    cursor = None
    while True:
        page = await views.page(app, view, filters, cursor=cursor, limit=limit)
        pages.append(page.jobs)
        if page.next is None:
            return pages
        cursor = page.next
        assert len(pages) < 10_000, "the pages never end"


def _fill(dsn: str, seed: int, size: int) -> None:
    """`size` jobs of every kind a view tells apart, with times and names drawn from `seed`: finished ones
    spread over days, queued ones due now, later, after a failed attempt, parked, and running ones."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    rows = []
    for n in range(size):
        kind = rng.choice(["completed", "completed", "failed", "cancelled", "queued", "scheduled", "retrying",
                           "waiting", "running"])  # fmt: skip
        queue, job_type = (
            rng.choice(["a", "b", "c"]),
            rng.choice(["mail.send", "report", "rare"] if n % 50 else ["odd"]),
        )
        at = now + timedelta(seconds=rng.randint(-86_400, 86_400))
        past = now - timedelta(seconds=rng.randint(1, 5 * 86_400), microseconds=rng.randint(0, 999_999))
        status, attempts, history = kind, 0, "[]"
        available, started, finished = now - timedelta(seconds=1), None, None
        if kind in ("completed", "failed", "cancelled"):
            attempts, started, finished = 1, past - timedelta(seconds=1), past
        elif kind == "scheduled":  # far enough ahead to stay scheduled while the test runs
            status, available = "queued", now + timedelta(minutes=10, seconds=rng.randint(0, 86_400))
        elif kind == "retrying":
            status, attempts, available = "queued", 1, at
            history = '[{"attempt": 1, "outcome": "retried"}]'
        elif kind == "waiting":
            status, available = "queued", at
            history = '[{"attempt": 1, "outcome": "waiting", "waiting_for": "cool-off"}]'
        elif kind == "running":
            attempts, started = 1, past
        error = f"sku-{rng.randint(1, 40)} not found" if kind in ("failed", "retrying") else None
        name = rng.choice([None, None, "nightly", "hourly"])
        key = f"order-{n}" if rng.random() < 0.2 else None
        rows.append((uuid.uuid4(), job_type, queue, name, key, status, attempts, rng.randint(-1, 1), available,
                     started, finished, error, f'{{"sku": "sku-{n % 97}"}}', history))  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY jobbus.job (id, type, queue, name, unique_key, status, attempts, priority, available_at, started_at,"
            " finished_at, last_error, configuration_data, history, max_attempts) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row((*row, 3))
        cur.execute("ANALYZE jobbus.job")


FILTERS = [
    Filters(),
    Filters(queues=("b",)),
    Filters(types=("odd",)),
    Filters(queues=("a", "c"), types=("report",)),
    Filters(name="nightly"),
    Filters(text="sku-7"),
    Filters(queues=("c",), text="NOT FOUND"),
    Filters(text="ODD"),  # a type's name: the jobs of a few triples only, spread over days
    Filters(types=("report",), text="sku-1"),
]


@pytest.mark.parametrize("seed", [1, 2])
async def test_every_view_reaches_every_matching_job_in_order_without_an_empty_page(
    dsn: str, app: jobbus.App, seed: int
) -> None:
    _fill(dsn, seed, 3_000)
    rows = _truth(dsn)
    rng = random.Random(seed)
    for view in views.VIEWS:
        for filters in FILTERS:
            limit = rng.choice([1, 7, 50, 500])
            pages = await _walk(app, view, filters, limit)
            got = [job.id for page in pages for job in page]
            assert got == _expected(rows, view, filters), (view, filters, limit)
            assert all(len(page) == limit for page in pages[:-1]), (view, filters, "a short page before the end")
            assert pages[-1] or len(pages) == 1, (view, filters, "an empty last page")


async def test_a_rare_type_among_tens_of_thousands_is_listed_whole_on_its_first_page(dsn: str, app: jobbus.App) -> None:
    """The review's case: a window of recent entries said "0+" of the jobs behind it. Here the rare ones
    are the oldest of 40,000 completed jobs, and the first page holds all of them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, status, attempts, started_at, finished_at)"
            " SELECT jobbus.uuid_generate_v7(), CASE WHEN n <= 20 THEN 'rare' ELSE 'common' END, 1, 'completed', 1,"
            " now() - interval '1 day' + n * interval '1 ms', now() - interval '1 day' + n * interval '1 ms'"
            " FROM generate_series(1, 40000) AS n"
        )
        conn.execute("ANALYZE jobbus.job")
    page = await views.page(app, "completed", Filters(types=("rare",)), limit=50)
    assert len(page.jobs) == 20 and page.next is None
    finished = [j.finished_at for j in page.jobs if j.finished_at is not None]
    assert len(finished) == 20 and finished == sorted(finished, reverse=True)
    assert await views.count(app, "completed", Filters(types=("rare",))) == Count(20)
    everything = await views.count(app, "completed")
    assert everything.estimated and everything.value > views.COUNT_CAP


async def test_counts_are_exact_up_to_their_bound_and_an_estimate_past_it(dsn: str, app: jobbus.App) -> None:
    """Past its bound a count is the planner's estimate (never below what was read); a search's says only
    that there are more (the planner cannot estimate a text's matches)."""
    _fill(dsn, 3, 2_000)
    rows = _truth(dsn)
    for view in views.VIEWS:
        for filters in FILTERS:
            exact = len(_expected(rows, view, filters))
            assert await views.count(app, view, filters, cap=exact) == Count(exact), (view, filters)
            if exact:
                bounded = await views.count(app, view, filters, cap=exact - 1)
                if filters.text:
                    assert bounded == Count(exact, at_least=True) and str(bounded) == f"> {exact - 1:,}"
                else:
                    assert bounded.estimated and bounded.value >= exact, (view, filters, bounded)


async def test_a_search_reaches_jobs_finished_at_the_same_instant_across_pages(dsn: str, app: jobbus.App) -> None:
    """Ties at one finish time, some of them on a window's edge: pages split them by id, none twice."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, status, attempts, started_at, finished_at, last_error)"
            " SELECT gen_random_uuid(), 't' || (n % 3), 1, 'failed', 1, at, at, 'tie ' || n"
            " FROM generate_series(1, 60) AS n, LATERAL (SELECT date_trunc('minute', now())"
            " - (n % 2) * interval '1 minute' - (n % 4 / 2) * interval '5 days' AS at) AS t"
        )
    rows = _truth(dsn)
    for filters in (Filters(text="tie"), Filters(text="tie 1")):
        pages = await _walk(app, "failed", filters, 7)
        assert [job.id for page in pages for job in page] == _expected(rows, "failed", filters)
        assert await views.count(app, "finished", filters) == Count(len(_expected(rows, "finished", filters)))


async def test_a_search_walks_from_the_newest_finish_not_from_now(dsn: str, app: jobbus.App) -> None:
    """After three quiet hours the first window of a search is the minute before the newest finish:
    windows counted from now would have grown to four hours (five windows, the last one walking every
    triple's jobs of those hours) before meeting a job."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, status, attempts, started_at, finished_at, last_error)"
            " SELECT gen_random_uuid(), 't' || (n % 3), 1, 'failed', 1, at, at, 'quiet ' || n"
            " FROM generate_series(0, 599) AS n,"
            " LATERAL (SELECT now() - interval '3 hours' - n * interval '1 second' AS at) AS t"
        )
        newest, oldest = conn.execute("SELECT max(finished_at), min(finished_at) FROM jobbus.job").fetchone()  # type: ignore[misc]
    windows = [w async for w in views._windows(app, Filters(text="quiet"), None, None)]
    assert [w.filters.finished_after for w in windows] == [newest - timedelta(minutes=m) for m in (1, 4 + 1, 16 + 5)]
    assert windows[-1].filters.finished_after < oldest  # ten minutes of jobs: three windows cover them
    page = await views.page(app, "failed", Filters(text="quiet 1"))
    assert [j.last_error for j in page.jobs][:2] == ["quiet 1", "quiet 10"]


async def test_django_tasks_are_told_apart_by_their_import_path(dsn: str, app: jobbus.App) -> None:
    """Every Django task has the type django.task and its import path as its name: the name field suggests
    the paths of the tab's latest tasks, and a path lists that task's jobs, all of them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, name, max_attempts, status, attempts, started_at, finished_at)"
            " SELECT gen_random_uuid(), 'django.task',"
            " 'shop.tasks.' || (ARRAY['send_receipt', 'refund', 'restock'])[n % 3 + 1], 1,"
            " CASE WHEN n % 4 = 0 THEN 'failed' ELSE 'completed' END, 1, now() - n * interval '1 s',"
            " now() - n * interval '1 s'"
            " FROM generate_series(1, 3000) AS n"
        )
        conn.execute(
            "INSERT INTO jobbus.job (id, type, name, max_attempts) SELECT gen_random_uuid(), 'django.task',"
            " 'shop.tasks.' || (ARRAY['nightly_report', 'refund'])[n % 2 + 1], 1 FROM generate_series(1, 40) AS n"
        )
        conn.execute(
            "INSERT INTO jobbus.job (id, type, name, max_attempts, status, attempts, started_at, finished_at)"
            " SELECT gen_random_uuid(), 'mail.send', 'other ' || n, 1, 'completed', 1, now(), now()"
            " FROM generate_series(1, 500) AS n"
        )
    django = Filters(types=("django.task",))
    assert await views.names(app, "completed", django) == [
        "shop.tasks.refund", "shop.tasks.restock", "shop.tasks.send_receipt"
    ]  # fmt: skip
    assert await views.names(app, "queued", django) == ["shop.tasks.nightly_report", "shop.tasks.refund"]
    refunds = Filters(types=("django.task",), name="shop.tasks.refund")
    pages = await _walk(app, "completed", refunds, 200)
    rows = _truth(dsn)
    assert [job.id for page in pages for job in page] == _expected(rows, "completed", refunds)
    assert len(_expected(rows, "completed", refunds)) == 750
    app_ = create_app(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_), base_url="http://127.0.0.1") as http:
        html = (await http.get("/jobs?status=completed&type=django.task")).text
    await app_.state.dashboard.close()
    assert '<datalist id="name-choices"><option value="shop.tasks.refund">' in html
