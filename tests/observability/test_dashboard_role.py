"""The dashboard role of `roles_script(dashboard=...)` serves every page and action, and nothing more."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

import jobbus
from jobbus.dashboard import create_app
from tests.observability.test_dashboard import BASE, PAGES, csrf_of, seed
from tests.roles import granted_roles


@pytest.fixture
def roles(dsn: str) -> Iterator[dict[str, str]]:
    with granted_roles(dsn, ("worker", "operator", "observer", "dashboard")) as conninfos:
        yield conninfos


async def test_the_dashboard_role_serves_pages_and_actions(dsn: str, roles: dict[str, str]) -> None:
    data = seed(dsn)
    app = jobbus.App(dsn=roles["dashboard"])
    asgi = create_app(app)
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        for path in [*PAGES, f"/jobs/{data['failed'][0]}", f"/groups/{data['group']}", "/jobs?status=failed"]:
            response = await http.get(path)
            assert response.status_code == 200, (path, response.text[-500:])
        token = csrf_of((await http.get("/jobs")).text)
        for url, fields in [
            (f"/jobs/{data['failed'][0]}/retry", {}),
            (f"/jobs/{data['queued'][0]}/cancel", {}),
            (f"/jobs/{data['queued'][1]}/run-now", {}),
            (f"/jobs/{data['queued'][2]}/delete", {}),
            (f"/jobs/{data['grouped'][1]}/delete", {}),  # a group member: the group's count moves
            ("/queues/reports/pause", {}),
            ("/queues/reports/resume", {}),
            ("/queues/reports/limits", {"concurrency": "2"}),
            ("/workers/action", {"action": "drain"}),
            ("/periodic/nightly/pause", {}),
            ("/periodic/nightly/resume", {}),
            ("/periodic/nightly/run", {}),
        ]:
            response = await http.post(url, data={"csrf": token, "next": "/", **fields})
            assert response.status_code == 303, url
            flash = response.cookies.get("jobbus_flash") or ""
            assert "refused" not in flash, (url, flash)
            page = (await http.get("/")).text
            assert not re.search(r"permission denied|refused", page), (url, page[-800:])
    await asgi.state.dashboard.close()
    with psycopg.connect(dsn) as conn:
        statuses: dict[uuid.UUID, str] = dict(
            conn.execute(
                "SELECT id, status FROM jobbus.job WHERE id = ANY(%s)", ([data["failed"][0], data["queued"][0]],)
            ).fetchall()
        )
        gone = conn.execute(
            "SELECT count(*) FROM jobbus.job WHERE id = ANY(%s)", ([data["queued"][2], data["grouped"][1]],)
        ).fetchone()
    assert statuses == {data["failed"][0]: "queued", data["queued"][0]: "cancelled"}
    assert gone == (0,)


async def test_the_dashboard_role_cannot_change_inputs_or_take_leases(dsn: str, roles: dict[str, str]) -> None:
    data = seed(dsn)
    with psycopg.connect(roles["dashboard"], autocommit=True) as conn:
        for statement in [
            "UPDATE jobbus.job SET configuration_data = '{}'",
            "UPDATE jobbus.job SET lease_token = NULL",
            "UPDATE jobbus.worker SET state = 'stopped'",
            "DELETE FROM jobbus.worker",
            "CREATE TABLE jobbus.sneaky (x int)",
        ]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement.encode())
    assert data["failed"]


async def test_a_read_only_dashboard_works_with_the_observer_role(dsn: str, roles: dict[str, str]) -> None:
    seed(dsn)
    asgi = create_app(jobbus.App(dsn=roles["observer"]), read_only=True)
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        for path in PAGES:
            assert (await http.get(path)).status_code == 200, path
    await asgi.state.dashboard.close()


async def test_the_dashboard_role_can_cancel_the_last_member_of_a_group_with_a_callback(
    dsn: str, roles: dict[str, str]
) -> None:
    """Cancelling makes the member terminal: the callback is written in that transaction, as the dashboard role."""
    async with jobbus.App(dsn=dsn) as owner:
        group, (member,) = await owner.schedule_group(
            [jobbus.JobRequest("report.render", {"n": 1})], then=jobbus.JobRequest("report.done", {})
        )
    async with jobbus.App(dsn=roles["dashboard"]) as app:
        assert await app.cancel(member) == jobbus.JobStatus.CANCELLED
    with psycopg.connect(dsn) as conn:
        callbacks = conn.execute("SELECT count(*) FROM jobbus.job WHERE type = 'report.done'").fetchone()
    assert callbacks == (1,), group
