"""The optional search index (jobbus.search, `jobbus search-index`): searches find the same jobs with it
and without it, it is built and dropped while the table is written, a build cut short is built again,
and a server without pg_trgm says so."""

from __future__ import annotations

import re
import uuid

import httpx
import psycopg
import pytest
from psycopg import ClientCursor

import jobbus
from jobbus import search, views
from jobbus.dashboard import create_app, pages
from jobbus.store.views import ViewStore
from tests.cli import jobbus as run_cli


def _has_trgm(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'").fetchone() is not None


def _fill(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, status, attempts, started_at, finished_at,"
            " configuration_data, last_error) SELECT jobbus.uuid_generate_v7(), 'report', 3,"
            " CASE WHEN n % 10 = 0 THEN 'failed' ELSE 'completed' END, 1,"
            " now() - n * interval '1 s', now() - n * interval '1 s',"
            " jsonb_build_object('order', 'ORD-' || n), CASE WHEN n % 10 = 0 THEN 'timeout at gate ' || n END"
            " FROM generate_series(1, 40000) AS n"
        )
        conn.execute("ANALYZE jobbus.job")


async def _found(app: jobbus.App, view: str, text: str) -> list[str]:
    page = await views.page(app, view, views.Filters(text=text), limit=100)
    return [str(job.id) for job in page.jobs]


async def test_a_search_finds_the_same_jobs_with_and_without_the_index(dsn: str, app: jobbus.App) -> None:
    if not _has_trgm(dsn):
        pytest.skip("this server has no pg_trgm")
    _fill(dsn)
    cases = [("completed", "ord-39999"), ("finished", "ORD-1234"), ("failed", "gate 39990"), ("completed", "no such")]
    without = {case: await _found(app, *case) for case in cases}
    assert [len(v) for v in without.values()] == [1, 11, 1, 0]  # ORD-1234 and ORD-12340..12349
    assert await search.search_index_state(app) == "absent"
    assert run_cli(dsn, "search-index", "status").returncode == 1
    created = run_cli(dsn, "search-index", "create")
    assert created.returncode == 0, created.stderr
    assert await search.search_index_state(app) == "ready"
    assert run_cli(dsn, "search-index", "status").returncode == 0
    assert {case: await _found(app, *case) for case in cases} == without
    assert await views.count(app, "finished", views.Filters(text="ORD-1234")) == views.Count(11)
    # The planner reads the index for a rare text.
    statement = ViewStore("jobbus").page("completed", views.Filters(text="ORD-39999"), search_index=True)
    with psycopg.connect(dsn, cursor_factory=ClientCursor) as conn:
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement.query, statement.params))
    assert "job_search_completed_idx" in plan, plan
    assert run_cli(dsn, "search-index", "drop").returncode == 0
    assert await search.search_index_state(app) == "absent"


async def test_a_text_too_frequent_for_the_index_is_walked_and_remembered(
    dsn: str, app: jobbus.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of the index past INDEX_FIRST_SECONDS gives way to the walk, which finds the same jobs; the
    text is then walked at once, without trying the index again."""
    if not _has_trgm(dsn):
        pytest.skip("this server has no pg_trgm")
    _fill(dsn)
    assert run_cli(dsn, "search-index", "create").returncode == 0
    cases = [("completed", "ORD-3"), ("failed", "timeout at gate"), ("finished", "ORD-1234")]
    through_index = {case: await _found(app, *case) for case in cases}
    counts = {case: await views.count(app, case[0], views.Filters(text=case[1])) for case in cases}
    assert [len(v) for v in through_index.values()] == [100, 100, 11]
    # 11,111 completed jobs hold ORD-3: a search says only that there are more than it counts.
    assert [str(c) for c in counts.values()] == ["> 1,000", "> 1,000", "11"]
    monkeypatch.setattr(views, "INDEX_FIRST_SECONDS", 0.000001)
    monkeypatch.setattr(views, "_frequent", {})
    assert {case: await _found(app, *case) for case in cases} == through_index
    assert {case: await views.count(app, case[0], views.Filters(text=case[1])) for case in cases} == counts
    # 11,111 and 4,000 jobs hold these: their index reads cannot end within the 1 ms a timeout allows.
    assert {("completed", "ord-3"), ("failed", "timeout at gate")} <= {
        (view, text) for _dsn, _schema, view, text in views._frequent
    }


@pytest.fixture
def indexed(dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The filled table with its search index, and no text remembered as frequent."""
    if not _has_trgm(dsn):
        pytest.skip("this server has no pg_trgm")
    _fill(dsn)
    assert run_cli(dsn, "search-index", "create").returncode == 0
    monkeypatch.setattr(views, "_frequent", {})
    return dsn


async def test_a_text_frequent_in_one_tab_is_read_through_the_index_in_the_others(
    indexed: str, app: jobbus.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each finished status has its own index and its own memory of frequent texts: 4,000 failed jobs
    hold "timeout at gate", no completed one does, and the completed tab's count still reads its index
    (no walk of the completed jobs, which a bound of a microsecond would cut to `?`)."""
    text = views.Filters(text="timeout at gate")
    monkeypatch.setattr(views, "INDEX_FIRST_SECONDS", 0.000001)
    assert str(await views.count(app, "failed", text)) == "> 1,000"  # walked: the index read was cut
    assert [view for _dsn, _schema, view, _text in views._frequent] == ["failed"]
    monkeypatch.setattr(views, "INDEX_FIRST_SECONDS", 30)
    completed = await views.count(app, "completed", text, search_seconds=0.000001)
    assert completed.counted and completed == views.Count(0)
    assert [view for _dsn, _schema, view, _text in views._frequent] == ["failed"]


async def test_an_index_read_that_ran_out_before_a_slow_walk_is_tried_again(
    indexed: str, app: jobbus.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index read cut short by its time is not enough to call a text frequent: a rare text's first
    read of a cold index can take longer than `INDEX_FIRST_SECONDS`. Only a walk that then meets its
    answer quickly makes the text walked next time; after a slow one the index is tried again."""
    # 4,000 failed jobs hold the text: its index read cannot end within the 1 ms a timeout allows.
    text = views.Filters(text="timeout at gate")
    monkeypatch.setattr(views, "INDEX_FIRST_SECONDS", 0.000001)
    monkeypatch.setattr(views, "FREQUENT_WALK_SECONDS", 0.0)  # every walk is slower than this
    assert len((await views.page(app, "failed", text)).jobs) == 50
    assert str(await views.count(app, "failed", text)) == "> 1,000"
    assert views._frequent == {}
    monkeypatch.setattr(views, "FREQUENT_WALK_SECONDS", 60.0)  # every walk is quicker than this
    assert len((await views.page(app, "failed", text)).jobs) == 50
    assert [(view, text) for _dsn, _schema, view, text in views._frequent] == [("failed", "timeout at gate")]


async def test_an_index_a_build_left_invalid_is_built_again(dsn: str, app: jobbus.App) -> None:
    if not _has_trgm(dsn):
        pytest.skip("this server has no pg_trgm")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        conn.execute("CREATE INDEX job_search_failed_idx ON jobbus.job (id)")  # a stand-in for a build cut short
        conn.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'jobbus.job_search_failed_idx'::regclass"
        )
    assert await search.search_index_state(app) == "invalid"
    await search.create_search_index(app)
    assert await search.search_index_state(app) == "ready"
    with psycopg.connect(dsn) as conn:
        built = conn.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
            " WHERE indrelid = 'jobbus.job'::regclass AND indexrelid::regclass::text LIKE 'jobbus.job_search_%'"
        ).fetchall()
    assert sorted(name for name, _ in built) == [f"jobbus.{name}" for name in sorted(search.INDEXES.values())]
    assert all("gin" in definition and "gin_trgm_ops" in definition for _, definition in built), built
    # A build cut between two statuses leaves the others: the state says so, and create builds the rest.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX jobbus.job_search_cancelled_idx")
    assert await search.search_index_state(app) == "invalid"
    assert not await views.search_indexed(app, "cancelled", views.Filters(text="x"))
    assert await views.search_indexed(app, "failed", views.Filters(text="x"))
    await search.create_search_index(app)
    assert await search.search_index_state(app) == "ready"


async def test_without_pg_trgm_the_server_says_so(dsn: str, app: jobbus.App) -> None:
    if _has_trgm(dsn):
        pytest.skip("this server has pg_trgm")
    assert await search.search_index_state(app) == "unavailable"
    result = run_cli(dsn, "search-index", "create")
    assert result.returncode == 1 and "no pg_trgm" in result.stderr


async def test_a_search_without_the_index_stops_after_its_seconds_and_counts_nothing_it_did_not_finish(
    dsn: str, app: jobbus.App
) -> None:
    _fill(dsn)
    rare = views.Filters(text="gate 39990")
    with pytest.raises(views.SearchStopped, match=r"stopped after 0\.001 s testing each job of failed"):
        await views.page(app, "failed", rare, search_seconds=0.001)
    stopped = await views.count(app, "completed", rare, search_seconds=0.001)
    assert not stopped.counted and str(stopped) == "?" and stopped.as_json()["count"] is None
    # Given time, the same search finds and counts its job; without a bound it always does (the CLI).
    assert len((await views.page(app, "failed", rare, search_seconds=30)).jobs) == 1
    assert await views.count(app, "failed", rare, search_seconds=30) == views.Count(1)
    assert len((await views.page(app, "failed", rare)).jobs) == 1
    # No search, no bound: a list of 36,000 jobs is not cut by a search's seconds.
    whole = await views.count(app, "completed", views.ANY, search_seconds=0.001)
    assert whole.counted and whole.estimated


async def test_the_jobs_page_says_where_a_search_without_the_index_stopped(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(dsn)
    monkeypatch.setattr(pages, "SEARCH_SECONDS", 0.001)
    monkeypatch.setattr(pages, "SEARCH_COUNT_SECONDS", 0.001)
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://127.0.0.1") as http:
            html = (await http.get("/jobs?status=completed&q=ORD-1234")).text
            assert "The search stopped after 0.001 s before it found a page of matches." in html
            assert "jobbus search-index create</code> builds the index" in html
            assert "No job matches." not in html
            # A search's counts come after the page, which names where to ask for them.
            assert 'completed <span class="count" data-later' in html
            asked = re.search(r'data-counts="([^"]+)"', html).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
            assert asked == "/jobs/counts?q=ORD-1234"
            counts = (await http.get(asked)).json()
            assert set(counts) == set(pages.TABS)
            assert counts["completed"]["text"] == "?" and counts["completed"]["title"].startswith("not counted")
            monkeypatch.setattr(pages, "SEARCH_SECONDS", 30)
            monkeypatch.setattr(pages, "SEARCH_COUNT_SECONDS", 30)
            html = (await http.get("/jobs?status=failed&q=gate 39990")).text
            # The search ran to its end on one page: its own tab is counted from it, the others after.
            assert html.count('data-job="') == 1 and 'failed <span class="count">1</span>' in html
            assert 'completed <span class="count" data-later' in html
            counts = (await http.get("/jobs/counts?q=gate 39990")).json()
            assert counts["failed"] == {"text": "1", "title": ""} and counts["completed"]["text"] == "0"
            assert "Searched without the search index" in html
            # A job's whole id opens that job; an id no job has is searched as text (and found nowhere).
            job_id = re.search(r'data-job="([0-9a-f-]{36})"', html).group(1)  # type: ignore[union-attr]
            opened = await http.get(f"/jobs?status=completed&q= {job_id.upper()} ")
            assert opened.status_code == 303 and opened.headers["location"] == f"/jobs/{job_id}"
            missing = await http.get(f"/jobs?status=failed&q={uuid.uuid4()}")
            assert missing.status_code == 200 and "No job matches." in missing.text
    finally:
        await asgi.state.dashboard.close()
