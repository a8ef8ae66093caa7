"""The overview's charts over a range with axes and totals, the samples merged as they age, the jobs
page's queue and type choices with their counts, and the arguments preview."""

from __future__ import annotations

import html
import re
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

import jobbus
from jobbus.dashboard import create_app
from jobbus.store.maintenance import MaintenanceStore
from jobbus.store.statements import run_async, run_sync
from tests.storehelpers import behind_a_lock

BASE = "http://127.0.0.1:8787"


@pytest.fixture
async def http(dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    asgi = create_app(jobbus.App(dsn=dsn))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=BASE) as client:
        yield client
    await asgi.state.dashboard.close()


def _sample(conn: psycopg.Connection[Any], minutes_ago: float, completed: int, failed: int, queue: str = "q") -> None:
    conn.execute(
        "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
        "cancelled, oldest_available_seconds) VALUES (now() - make_interval(secs => %s), %s, 4, 0, 1, %s, %s, 0, 2)",
        (minutes_ago * 60, queue, completed, failed),
    )


def _totals(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-total="(\w+)">([0-9,]+)<', html))


async def test_the_charts_range_has_axes_and_the_totals_of_that_range(dsn: str, http: httpx.AsyncClient) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        _sample(conn, 0.2, 1, 0)  # the latest sample: fresh, so the overview is not stale
        _sample(conn, 20, 5, 2)
        _sample(conn, 5 * 60, 100, 10)
        _sample(conn, 3 * 24 * 60, 1000, 50, queue="other")
        _sample(conn, 8 * 24 * 60, 99999, 99999)  # older than every range
    expected = {"1h": (8, 2), "24h": (118, 12), "7d": (1168, 62)}
    for key, (processed, failed) in expected.items():
        page = await http.get(f"/?range={key}")
        assert page.status_code == 200
        totals = _totals(page.text)
        assert (totals["processed"], totals["failed"]) == (f"{processed:,}", f"{failed:,}"), key
        assert re.search(rf'data-range="{key}" aria-current="page"', page.text)
        # Axes: a scale (0 and a round top) and time labels in every chart.
        assert page.text.count('<text class="y"') == 4 * 3
        assert page.text.count('<text class="x"') >= 4 * 3
    default = await http.get("/")
    assert re.search(r'data-range="1h" aria-current="page"', default.text)
    assert ">Last 1 h<" in default.text and "Completed per minute" in default.text
    assert "Completed per 10 min" in (await http.get("/?range=24h")).text
    week = (await http.get("/?range=7d")).text
    assert "Completed per hour" in week and "samples only since" in week  # a week not covered yet
    assert (await http.get("/?range=1y")).status_code == 400
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM jobbus.queue_stat")
    empty = (await http.get("/?range=24h")).text
    assert "no samples in this range" in empty and _totals(empty)["processed"] == "0"
    assert '<text class="y" x="36" y="63.0" text-anchor="end">1</text>' in empty  # a scale of 0, 1, 2


async def test_old_samples_merge_into_ten_minute_rows_without_losing_a_count(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Two hours ago, one sample every 10 s of a whole 10-minute step (and the next step's first).
        conn.execute(
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled, oldest_available_seconds) "
            "SELECT to_timestamp(floor(extract(epoch FROM now() - interval '2 hours') / 600) * 600) "
            "       + make_interval(secs => 10 * s), 'q', s, 1, 2, 1, s % 2, 0, s "
            "FROM generate_series(0, 60) AS s"
        )
        for minutes in range(0, 50, 5):  # the last hour stays as sampled
            _sample(conn, minutes, 3, 1)
        before = conn.execute("SELECT sum(completed), sum(failed), count(*) FROM jobbus.queue_stat").fetchone()
    store = MaintenanceStore("jobbus")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        merged = await run_async(conn, store.compact_queue_stats(raw_seconds=3600, step_seconds=600))
        again = await run_async(conn, store.compact_queue_stats(raw_seconds=3600, step_seconds=600))
    assert (merged, again) == (1, 0)
    with psycopg.connect(dsn) as conn:
        after = conn.execute("SELECT sum(completed), sum(failed), count(*) FROM jobbus.queue_stat").fetchone()
        step = conn.execute(
            "SELECT completed, failed, available, oldest_available_seconds, extract(epoch FROM sampled_at)::int % 600 "
            "FROM jobbus.queue_stat WHERE sampled_at < now() - interval '90 minutes' ORDER BY sampled_at"
        ).fetchall()
    assert before is not None and after is not None
    assert after[:2] == before[:2]  # every finished job still counted
    assert after[2] == before[2] - 59  # 60 samples became one; the next step's first and the last hour stay
    assert step[0] == (60, 30, 59, 59.0, 590)  # sums, the last sample's gauges, the longest wait, its instant


BucketTotals = dict[tuple[str, int], tuple[int, int, int]]


def _step_samples(conn: psycopg.Connection[Any], since: str, count: int, *, seed: int = 0) -> None:
    """`count` samples 10 s apart from `since` (an SQL expression) for queues a and b, counts varying."""
    conn.execute(
        (
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled, oldest_available_seconds) "
            f"SELECT {since} + make_interval(secs => 10 * s), q, s, 0, 1, (s * 7 + %(seed)s) %% 11, "
            "(s + %(seed)s) %% 3, s %% 2, s FROM generate_series(0, %(count)s - 1) AS s, unnest('{a,b}'::text[]) AS q"
        ).encode(),
        {"count": count, "seed": seed},
    )


def _bucket_totals(conn: psycopg.Connection[Any]) -> BucketTotals:
    """The jobs finished per queue and 10-minute bucket, as the samples count them."""
    rows = conn.execute(
        "SELECT queue, floor(extract(epoch FROM sampled_at) / 600)::int, sum(completed)::int, sum(failed)::int, "
        "sum(cancelled)::int FROM jobbus.queue_stat GROUP BY 1, 2"
    ).fetchall()
    return {(queue, bucket): (completed, failed, cancelled) for queue, bucket, completed, failed, cancelled in rows}


COMPACT = MaintenanceStore("jobbus").compact_queue_stats(raw_seconds=3600, step_seconds=600)


def _compact(conn: psycopg.Connection[Any]) -> int:
    return int(run_sync(conn, COMPACT))


def test_two_leaders_compacting_at_once_merge_every_sample_once(dsn: str) -> None:
    """Two leaders for a moment: the second compaction starts while the first holds its rows
    uncommitted, then both run freely at once. Every bucket's totals stay exact; each merged once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _step_samples(conn, "to_timestamp(floor(extract(epoch FROM now() - interval '4 hours') / 600) * 600)", 720)
        before = _bucket_totals(conn)
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        assert _compact(first) == 2 * 12  # two queues, twelve whole steps; not committed yet
        merged = behind_a_lock(dsn, first, second, COMPACT)  # waits for the rows the first deleted
    assert merged == 0
    failures: list[BaseException] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _bucket_totals(conn) == before
        _step_samples(
            conn, "to_timestamp(floor(extract(epoch FROM now() - interval '6 hours') / 600) * 600)", 90, seed=5
        )
        before = _bucket_totals(conn)

    def compact() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for _ in range(5):
                    _compact(conn)
        except BaseException as exc:
            failures.append(exc)

    racing = [threading.Thread(target=compact) for _ in range(4)]
    for thread in racing:
        thread.start()
    for thread in racing:
        thread.join()
    assert failures == []
    with psycopg.connect(dsn) as conn:
        assert _bucket_totals(conn) == before
        rows_per_bucket = conn.execute(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM jobbus.queue_stat GROUP BY queue, "
            "floor(extract(epoch FROM sampled_at) / 600)) AS b"
        ).fetchone()
    assert rows_per_bucket == (1,)


def test_samples_from_before_and_after_a_clock_jump_merge_exactly(dsn: str) -> None:
    """The clock went back: the newest samples lie ahead of now(), and samples written since land in
    10-minute steps merged before. Future samples are left as they are; every bucket's totals stay
    exact and the merged rows keep the gauges of their step's latest sample."""
    old_step = "to_timestamp(floor(extract(epoch FROM now() - interval '2 hours') / 600) * 600)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        _step_samples(conn, old_step, 30)  # the first half of the step
        assert _compact(conn) == 2
        _step_samples(conn, f"{old_step} + interval '5 minutes'", 30, seed=3)  # after the jump, same step
        _step_samples(conn, "now() + interval '90 minutes'", 60, seed=1)  # written before the jump
        before = _bucket_totals(conn)
        future = conn.execute("SELECT count(*) FROM jobbus.queue_stat WHERE sampled_at > now()").fetchone()
        assert _compact(conn) == 2
        assert _compact(conn) == 0
        assert _bucket_totals(conn) == before
        assert conn.execute("SELECT count(*) FROM jobbus.queue_stat WHERE sampled_at > now()").fetchone() == future
        merged = conn.execute(
            f"SELECT queue, available, oldest_available_seconds, sampled_at = {old_step} + interval '590 seconds' "
            f"FROM jobbus.queue_stat WHERE sampled_at < {old_step} + interval '10 minutes' ORDER BY queue"
        ).fetchall()
    assert merged == [("a", 29, 29.0, True), ("b", 29, 29.0, True)]


async def _jobs(dsn: str) -> dict[str, list[uuid.UUID]]:
    app = jobbus.App(dsn=dsn)
    async with app:
        a = await app.schedule_many("mail.send", [{"to": f"u{n}"} for n in range(3)], queue="mail")
        b = await app.schedule_many("mail.digest", [{"n": n} for n in range(2)], queue="mail")
        c = await app.schedule_many("report.render", [{"n": n} for n in range(4)], queue="reports")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobbus.job SET status = 'failed', attempts = 1, finished_at = now(), last_error = 'boom' "
            "WHERE id = ANY(%s)",
            (c[:3],),
        )
    return {"send": a, "digest": b, "render": c}


def _options(html: str, name: str) -> list[str]:
    select = re.search(rf'<select name="{name}".*?</select>', html, re.S)
    assert select is not None, name
    return re.findall(r'<option value="([^"]+)"', select.group(0))


async def test_queue_and_type_choices_are_those_of_the_tab_and_of_each_other(dsn: str, http: httpx.AsyncClient) -> None:
    """Every queue and type of the tab's jobs is a choice (whatever their number), narrowed by the other
    choice; the counts are the tabs'."""
    jobs = await _jobs(dsn)
    queued = (await http.get("/jobs?status=queued")).text
    assert _options(queued, "queue") == ["mail", "reports"]
    assert _options(queued, "type") == ["mail.digest", "mail.send", "report.render"]
    failed = (await http.get("/jobs?status=failed")).text
    assert _options(failed, "queue") == ["reports"] and _options(failed, "type") == ["report.render"]
    # A chosen queue narrows the types, a chosen type the queues.
    in_mail = (await http.get("/jobs?status=queued&queue=mail")).text
    assert _options(in_mail, "type") == ["mail.digest", "mail.send"]
    assert re.search(r'data-tab="queued"[^>]*>queued <span class="count">5</span>', in_mail)
    assert re.search(r'data-tab="failed"[^>]*>failed <span class="count">0</span>', in_mail)
    of_digest = (await http.get("/jobs?status=queued&type=mail.digest")).text
    assert _options(of_digest, "queue") == ["mail"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET attempts = 1 WHERE id = %s", (jobs["send"][0],))
    retrying = (await http.get("/jobs?status=retrying")).text
    assert re.search(r'data-tab="retrying"[^>]*>retrying <span class="count">1</span>', retrying)
    # A chosen queue that holds nothing stays chosen.
    empty = (await http.get("/jobs?queue=nowhere")).text
    assert '<option value="nowhere" selected>nowhere</option>' in empty and "No job matches." in empty


async def test_each_row_previews_its_arguments_redacted_cut_and_escaped(dsn: str, http: httpx.AsyncClient) -> None:
    app = jobbus.App(dsn=dsn)
    async with app:
        await app.schedule("mail.send", {"to": "<b>x</b>", "password": "hunter2", "z": "y" * 400})
        await app.schedule("big.one", {"ids": [str(uuid.uuid4()) for _ in range(200)]})
    page = (await http.get("/jobs")).text
    cells = re.findall(r'<td class="args"><code>(.*?)</code></td>', page)
    assert len(cells) == 2
    small, big = cells  # the queued tab, in the order they run
    assert re.fullmatch(r"\(\d+ KiB\)", big)  # too big to read for a list: its size instead
    assert "hunter2" not in page and "••••••" in small
    assert "&lt;b&gt;x&lt;/b&gt;" in small and "<b>x</b>" not in page
    assert small.endswith("…") and len(html.unescape(small)) == 120
