"""The views of queued jobs (SPEC 17): `scheduled`, `retrying` and `waiting` beside the five statuses, in
`App.list_jobs`, `jobbus jobs list --status` and the dashboard's jobs page with a bounded count per tab."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus.store import run_sync
from tests.cli import jobbus_json
from tests.observability.test_dashboard import client, dashboard
from tests.storehelpers import claim, write

__all__ = ["dashboard"]


def _views(app: jobbus.App, dsn: str) -> dict[str, uuid.UUID]:
    """One queued job in each view, one available now, and one job of each other status."""
    ids = {
        "available": app.sync.schedule("t", {"k": "available"}),
        "scheduled": app.sync.schedule("t", {"k": "scheduled"}, available_at=timedelta(hours=1)),
    }
    retrying = app.sync.schedule("t", {"k": "retrying"})
    waiting = app.sync.schedule("t", {"k": "waiting"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET available_at = now() + interval '1 hour' WHERE id <> %s", (retrying,))
        conn.execute("UPDATE jobbus.job SET available_at = now() - interval '1 hour' WHERE id = %s", (retrying,))
        (job,) = claim(app, conn)
        assert job.id == retrying
        write(app, conn, job, jobbus.JobStatus.QUEUED, error="boom", delay_seconds=3600, kind="retried")
        conn.execute("UPDATE jobbus.job SET available_at = now() - interval '1 hour' WHERE id = %s", (waiting,))
        (job,) = claim(app, conn)
        assert job.id == waiting
        assert run_sync(conn, app.store.sleep_job(job.id, job.lease_token, "nap", 3600)) == "parked"
        conn.execute("UPDATE jobbus.job SET available_at = now() WHERE id = %s", (ids["available"],))
    ids["retrying"], ids["waiting"] = retrying, waiting
    return ids


def test_list_jobs_by_view_puts_each_queued_job_in_at_most_one(sync_app: jobbus.App, dsn: str) -> None:
    ids = _views(sync_app, dsn)
    for view in ("scheduled", "retrying", "waiting"):
        assert [j.id for j in sync_app.sync.list_jobs(status=view)] == [ids[view]], view
    assert {j.id for j in sync_app.sync.list_jobs(status=["queued"])} == set(ids.values())
    assert {j.id for j in sync_app.sync.list_jobs(status=["retrying", "waiting"])} == {ids["retrying"], ids["waiting"]}
    with pytest.raises(ValueError):
        sync_app.sync.list_jobs(status="sleeping")


def test_jobs_list_accepts_the_views(sync_app: jobbus.App, dsn: str) -> None:
    ids = _views(sync_app, dsn)
    for view in ("scheduled", "retrying", "waiting"):
        assert [j["id"] for j in jobbus_json(dsn, "jobs", "list", "--status", view)] == [str(ids[view])], view


async def test_the_jobs_page_has_a_tab_per_status_and_view_with_bounded_counts(
    sync_app: jobbus.App, dsn: str, dashboard: tuple[jobbus.App, Any]
) -> None:
    ids = _views(sync_app, dsn)
    _, asgi = dashboard
    async with client(asgi) as http:
        html = (await http.get("/jobs")).text
        tabs = dict(re.findall(r'data-tab="(\w+)"[^>]*>\w+ <span class="count">([\d,+]+)</span>', html))
        assert tabs == {
            "queued": "4",
            "running": "0",
            "completed": "0",
            "failed": "0",
            "cancelled": "0",
            "scheduled": "1",
            "retrying": "1",
            "waiting": "1",
        }
        for view in ("scheduled", "retrying", "waiting"):
            page = (await http.get(f"/jobs?status={view}")).text
            assert re.findall(r'<tr data-job="([0-9a-f-]+)"', page) == [str(ids[view])], view
            assert f'data-tab="{view}" aria-current="page"' in page
        assert (await http.get("/jobs?status=sleeping")).status_code == 400


async def test_counts_say_when_they_passed_their_bound(dsn: str, app: jobbus.App) -> None:
    """Past its bound a count is the planner's estimate and says so; below it, exact."""
    from jobbus import views

    await app.schedule_many("t", [{"n": n} for n in range(5)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE jobbus.job")
    estimated = await views.count(app, "queued", cap=3)
    assert estimated.estimated and estimated.value >= 4
    assert await views.count(app, "queued", cap=5) == views.Count(5)
    assert await views.count(app, "running", cap=3) == views.Count(0)
