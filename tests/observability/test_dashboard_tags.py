"""The dashboard's tag filter and bulk edit over HTTP: lists and tab counts under a tag at 20,000+ jobs
(exact up to the count's bound, an estimate said as such past it), tags on the lists and the job page,
the bulk edit's confirmation naming how many jobs it touches before anything changes, the change of a
selection and of every queued job of a filter, and the CSRF refusal."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

import jobbus
from jobbus.dashboard import create_app

BASE = "http://127.0.0.1:8787"


@pytest.fixture
async def dashboard(dsn: str) -> AsyncIterator[tuple[jobbus.App, Any]]:
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app)
    yield app, asgi
    await asgi.state.dashboard.close()


def client(asgi: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=BASE)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def _tab_count(html: str, tab: str) -> str:
    match = re.search(rf'data-tab="{tab}"[^>]*>{tab} <span class="count"([^>]*)>([^<]*)</span>', html)
    assert match, f"no count on the {tab} tab"
    return match.group(2) + ("|estimated" if "estimated" in match.group(1) else "")


def _fill(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        app.sync.schedule_many("t", [{}] * 14_000, tags=["bulk"])
        app.sync.schedule_many("t", [{}] * 6_000, tags=["bulk", "vip"], queue="q2")
        app.sync.schedule_many("u", [{}] * 1_200, tags=["vip"])
        app.sync.schedule_many("u", [{}] * 300)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobbus.job SET status = 'failed', finished_at = now(), attempts = 3, last_error = 'x' "
            "WHERE id IN (SELECT id FROM jobbus.job WHERE type = 'u' AND tags IS NOT NULL LIMIT 200)"
        )
        conn.execute("ANALYZE jobbus.job")


async def test_tag_filter_lists_and_counts_at_twenty_thousand_jobs(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    _fill(dsn)
    _, asgi = dashboard
    async with client(asgi) as http:
        vip = (await http.get("/jobs", params={"tag": "vip"})).text
        assert _tab_count(vip, "queued") == "7,000"
        assert _tab_count(vip, "failed") == "200"
        both = (await http.get("/jobs", params={"tag": "bulk, vip", "status": "queued"})).text
        assert _tab_count(both, "queued") == "6,000"
        assert both.count('class="tag"') >= 2 * 50 and "q2" in both
        bulk = (await http.get("/jobs", params={"tag": "bulk"})).text
        queued = _tab_count(bulk, "queued")
        assert queued.endswith("|estimated") and queued.startswith("≈"), queued  # past the bound of 10,000
        failed = (await http.get("/jobs", params={"tag": "vip", "status": "failed"})).text
        assert failed.count('data-job="') == 50
        seen, url = 0, "/jobs?tag=vip&status=failed"
        while url:
            page = (await http.get(url)).text
            seen += page.count('data-job="')
            found = re.search(r'href="([^"]+)" rel="next"', page)
            url = found.group(1).replace("&amp;", "&") if found else ""
        assert seen == 200
        bad = await http.get("/jobs", params={"tag": "x" * 65})
        assert bad.status_code == 400 and "65 characters" in bad.text


async def test_bulk_edit_confirms_with_the_count_then_changes_only_queued_jobs(
    dsn: str, dashboard: tuple[jobbus.App, Any]
) -> None:
    app, asgi = dashboard
    async with app:
        ids = await app.schedule_many("t", [{}] * 30, queue="a", tags=["move"])
        await app.schedule_many("t", [{}] * 5, queue="a")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'running', attempts = 1 WHERE id = %s", (ids[0],))
    async with client(asgi) as http:
        html = (await http.get("/jobs", params={"tag": "move", "queue": "a"})).text
        assert "Change every queued job of this filter" in html
        form = {
            "csrf": csrf_of(html),
            "next": "/jobs?tag=move",
            "scope": "filter",
            "filter_queue": "a",
            "filter_type": "",
            "filter_tag": "move",
            "filter_other": "",
            "set_priority": "5",
            "set_queue": "b",
            "set_available_at": "",
            "add_tags": "moved",
        }
        refused = await http.post("/jobs/update", data={**form, "csrf": "0" * 64, "confirm": "yes"})
        assert refused.status_code == 403
        confirm = await http.post("/jobs/update", data=form)
        assert confirm.status_code == 200
        assert re.search(r"<strong data-count>29</strong> queued jobs of queue a with tags move", confirm.text)
        assert "move to queue b" in confirm.text and "priority 5" in confirm.text
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM jobbus.job WHERE queue = 'b'").fetchone() == (0,)
        done = await http.post("/jobs/update", data={**form, "csrf": csrf_of(confirm.text), "confirm": "yes"})
        assert done.status_code == 303 and done.headers["location"] == "/jobs?tag=move"
        assert "changed 29 queued job(s)" in (await http.get("/jobs?tag=move")).text
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT queue, priority, tags, count(*) FROM jobbus.job GROUP BY 1, 2, 3").fetchall()
        assert sorted(rows, key=str) == sorted(
            [("b", 5, ["move", "moved"], 29), ("a", 0, ["move"], 1), ("a", 0, None, 5)], key=str
        )
        selected = {
            "csrf": csrf_of(done.text or html),
            "next": "/jobs",
            "scope": "selected",
            "ids": [str(i) for i in ids[:3]],
            "set_available_at": "2h",
        }
        confirm = await http.post("/jobs/update", data=selected)
        assert "<strong data-count>2</strong> of the 3 selected jobs (those still queued)" in confirm.text
        done = await http.post("/jobs/update", data={**selected, "confirm": "yes"})
        assert done.status_code == 303
        with psycopg.connect(dsn, autocommit=True) as conn:
            later = conn.execute(
                "SELECT count(*) FROM jobbus.job WHERE available_at > now() + interval '1 hour'"
            ).fetchone()
        assert later == (2,)
        for bad, problem in [
            ({**form, "set_priority": "", "set_queue": "", "add_tags": ""}, "give at least one change"),
            ({**form, "filter_queue": "", "filter_tag": ""}, "choose a queue, a type or a tag first"),
            ({**form, "filter_other": "yes"}, "a queue, a type and tags only"),
            ({**form, "set_available_at": "soon"}, "not now, a delay"),
        ]:
            answer = await http.post("/jobs/update", data=bad)
            assert answer.status_code == 303, problem
            assert problem in (await http.get("/jobs")).text.replace("&#39;", "'"), problem
