"""The dashboard's delete and run-now actions (SPEC 17): one job, in bulk, CSRF, read-only, confirmations."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import psycopg

import jobbus
from jobbus.dashboard import create_app
from tests.observability.test_dashboard import client, csrf_of, dashboard, seed

__all__ = ["dashboard"]  # the fixture, imported for these tests


def _count(dsn: str, sql: str, *params: Any) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql.encode(), params).fetchone()
    assert row is not None
    return int(row[0])


async def test_delete_and_run_now_buttons_on_the_job_page(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    data = seed(dsn)
    app, asgi = dashboard
    async with app:
        later = await app.schedule("mail.send", available_at=timedelta(hours=3))
    async with client(asgi) as http:
        html = (await http.get(f"/jobs/{later}")).text
        assert f'action="/jobs/{later}/run-now"' in html
        assert re.search(rf'action="/jobs/{later}/delete" class="inline" data-confirm="Delete this job\?', html)
        token = csrf_of(html)
        assert (await http.post(f"/jobs/{later}/run-now", data={"next": "/"})).status_code == 403  # no CSRF
        moved = await http.post(f"/jobs/{later}/run-now", data={"csrf": token, "next": f"/jobs/{later}"})
        assert moved.status_code == 303 and "available now" in (moved.cookies.get("jobbus_flash") or "")
        assert _count(dsn, "SELECT count(*) FROM jobbus.job WHERE id = %s AND available_at <= now()", later) == 1
        failed = data["failed"][0]
        failed_page = (await http.get(f"/jobs/{failed}")).text
        assert "/run-now" not in failed_page and f"/jobs/{failed}/delete" in failed_page
        gone = await http.post(f"/jobs/{failed}/delete", data={"csrf": token, "next": "/jobs"})
        assert gone.status_code == 303 and gone.headers["location"] == "/jobs"
        assert "deleted" in (gone.cookies.get("jobbus_flash") or "")
        assert _count(dsn, "SELECT count(*) FROM jobbus.job WHERE id = %s", failed) == 0
        again = await http.post(f"/jobs/{failed}/run-now", data={"csrf": token, "next": "/jobs"})
        assert "refused: job" in (again.cookies.get("jobbus_flash") or "")


async def test_a_running_job_has_no_delete_button_and_its_delete_is_refused(
    dsn: str, dashboard: tuple[jobbus.App, Any]
) -> None:
    data = seed(dsn)
    _, asgi = dashboard
    job_id = data["queued"][0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'running', attempts = 1 WHERE id = %s", (job_id,))
    async with client(asgi) as http:
        html = (await http.get(f"/jobs/{job_id}")).text
        assert "/delete" not in html and "/run-now" not in html
        refused = await http.post(f"/jobs/{job_id}/delete", data={"csrf": csrf_of(html), "next": "/jobs"})
        assert "refused" in (refused.cookies.get("jobbus_flash") or "")
    assert _count(dsn, "SELECT count(*) FROM jobbus.job WHERE id = %s", job_id) == 1


async def test_bulk_delete_skips_running_jobs_and_asks_first(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    data = seed(dsn)
    _, asgi = dashboard
    running = data["queued"][0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'running', attempts = 1 WHERE id = %s", (running,))
    chosen = [*data["queued"], *data["failed"]]
    async with client(asgi) as http:
        html = (await http.get("/jobs")).text
        assert re.search(r'value="delete"[^>]*data-confirm="Delete the selected jobs\?', html)
        assert re.search(r'value="cancel"[^>]*data-confirm="Cancel the selected jobs\?', html)
        response = await http.post(
            "/jobs/bulk",
            data={"csrf": csrf_of(html), "action": "delete", "ids": [str(i) for i in chosen], "next": "/jobs"},
        )
        assert response.status_code == 303
        assert "delete: 5 of 6 selected" in (response.cookies.get("jobbus_flash") or "")
    assert _count(dsn, "SELECT count(*) FROM jobbus.job WHERE id = ANY(%s)", chosen) == 1


async def test_read_only_refuses_delete_and_run_now(dsn: str) -> None:
    data = seed(dsn)
    asgi = create_app(jobbus.App(dsn=dsn), read_only=True)
    job_id = data["queued"][1]
    async with client(asgi) as http:
        html = (await http.get(f"/jobs/{job_id}")).text
        assert "/delete" not in html and "/run-now" not in html
        for url in [f"/jobs/{job_id}/delete", f"/jobs/{job_id}/run-now"]:
            assert (await http.post(url, data={}, follow_redirects=False)).status_code == 403
        bulk = await http.post("/jobs/bulk", data={"action": "delete", "ids": [str(job_id)]})
        assert bulk.status_code == 403
    await asgi.state.dashboard.close()
    assert _count(dsn, "SELECT count(*) FROM jobbus.job WHERE id = %s", job_id) == 1


async def test_destructive_worker_buttons_ask_for_confirmation(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    seed(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO jobbus.worker (id, host, pid, concurrency) VALUES ('w-1', 'h', 1, 4)")
    _, asgi = dashboard
    async with client(asgi) as http:
        html = (await http.get("/workers")).text
    row = html[html.index('data-worker="w-1"') :]
    row = row[: row.index("</tr>")]
    for verb in ("stop", "restart", "drain"):
        assert f'data-confirm="{verb} worker w-1?"' in row, verb
    assert 'data-confirm="pause worker' not in row
