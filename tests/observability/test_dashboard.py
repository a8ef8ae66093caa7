"""The dashboard over HTTP (no browser): pages, bounded lists, actions, CSRF, token, read-only, redaction."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest

import jobbus
from jobbus.dashboard import MASK, create_app
from jobbus.dashboard.live import LiveUpdates
from jobbus.store.dashboard import DashboardStore
from jobbus.store.statements import run_async
from tests.processes import ROOT

BASE = "http://127.0.0.1:8787"
PAGES = ["/", "/jobs", "/failures", "/workers", "/queues", "/periodic", "/groups", "/audit"]


def seed(dsn: str) -> dict[str, Any]:
    """Jobs in every state, a group, a periodic job, queue samples and a worker row, written directly."""
    app = jobbus.App(dsn=dsn)
    group = uuid.uuid4()
    with app.sync:
        queued = app.sync.schedule_many("mail.send", [{"to": f"u{n}", "password": "hunter2"} for n in range(3)])
        grouped = app.sync.schedule_many("report.render", [{"n": n} for n in range(4)], group_id=group)
        failed = app.sync.schedule_many("report.render", [{"n": n} for n in range(3)], queue="reports")
        app.sync.add_periodic("nightly", type="report.render", every=timedelta(hours=24))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobbus.job SET status = 'failed', attempts = 3, finished_at = now(), "
            "last_error = 'ReportMissingError: report ' || (configuration_data->>'n') || ' is missing' "
            "WHERE id = ANY(%s)",
            (failed,),
        )
        conn.execute(
            "UPDATE jobbus.job SET status = 'completed', attempts = 1, started_at = now(), finished_at = now(), "
            'result = \'{"token": "tok-9f7e", "pages": 3}\' WHERE id = %s',
            (grouped[0],),
        )
        conn.execute(
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled, oldest_available_seconds) SELECT now() - make_interval(mins => m), 'default', 10 + m, 0, "
            "1, m, m % 3, 0, m * 2 FROM generate_series(0, 59) AS m"
        )
    return {"queued": queued, "grouped": grouped, "failed": failed, "group": group}


@pytest.fixture
async def dashboard(dsn: str) -> AsyncIterator[tuple[jobbus.App, Any]]:
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app)
    yield app, asgi
    await asgi.state.dashboard.close()


def client(asgi: Any, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=BASE, **kwargs)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


async def test_every_page_renders_with_data(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    data = seed(dsn)
    _, asgi = dashboard
    async with client(asgi) as http:
        for path in [
            *PAGES,
            f"/jobs/{data['failed'][0]}",
            f"/groups/{data['group']}",
            "/jobs?status=failed",
            "/jobs?status=queued&queue=default",
            "/jobs?status=running",
            "/jobs?status=finished",
            f"/jobs?group={data['group']}",
            "/jobs?q=missing",
        ]:
            response = await http.get(path)
            assert response.status_code == 200, (path, response.text[:500])
            assert response.headers["cache-control"] == "no-store"
            assert response.headers["x-frame-options"] == "DENY"
            assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        overview = (await http.get("/")).text
        assert "<svg" in overview and "Completed per minute" in overview
        assert "job table not analyzed yet" in overview  # an estimate or nothing, never a count(*)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ANALYZE jobbus.job")
        assert "<b>~10</b> jobs in the table (estimate)" in (await http.get("/")).text
        failures = (await http.get("/failures")).text
        assert failures.count("data-pattern=") == 1  # three messages, one group: numbers are folded
        assert "ReportMissingError" in failures
        group = (await http.get(f"/groups/{data['group']}")).text
        assert "25.0 %" in group
        assert (await http.get(f"/jobs/{uuid.uuid4()}")).status_code == 404
        assert (await http.get("/jobs?status=bogus")).status_code == 400


async def test_secrets_are_masked_and_a_redaction_hook_decides(dsn: str) -> None:
    data = seed(dsn)
    app = jobbus.App(dsn=dsn)
    default = create_app(app)
    async with client(default) as http:
        page = (await http.get(f"/jobs/{data['queued'][0]}")).text
        assert "hunter2" not in page and MASK in page
        page = (await http.get(f"/jobs/{data['grouped'][0]}")).text
        assert "tok-9f7e" not in page and "&#34;pages&#34;: 3" in page
    await default.state.dashboard.close()

    def hide_everything(field: str, value: Any) -> Any:
        return f"<{field} hidden>"

    custom = create_app(app, redact=hide_everything)
    async with client(custom) as http:
        page = (await http.get(f"/jobs/{data['failed'][0]}")).text
        assert "report 0 is missing" not in page
        assert "&lt;configuration hidden&gt;" in page and "&lt;last_error hidden&gt;" in page
    await custom.state.dashboard.close()


async def test_errors_stored_in_clear_by_an_earlier_release_are_masked_on_every_page(
    dsn: str, dashboard: tuple[jobbus.App, Any]
) -> None:
    app, asgi = dashboard
    async with app:
        job_id = await app.schedule("report.render", {})
    history = [
        {
            "attempt": 1,
            "outcome": "failed",
            "at": "2026-12-02T02:00:00+00:00",
            "error": "token=SVold01 was refused",
            "traceback": "Traceback (most recent call last):\nValueError: api_key=SVold02\n",
        }
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobbus.job SET status = 'failed', attempts = 1, finished_at = now(), last_error = %s, "
            "error_group = %s, history = %s::jsonb WHERE id = %s",
            ("token=SVold01 was refused", "token=SVold01 was refused", json.dumps(history), job_id),
        )
    async with client(asgi) as http:
        for path in ("/failures", f"/jobs/{job_id}", "/jobs?status=failed"):
            page = (await http.get(path)).text
            assert "SVold" not in page and f"token={MASK} was refused" in page, path


async def test_keyset_pages_walk_every_job_once(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    app, asgi = dashboard
    async with app:
        ids = await app.schedule_many("bulk", [{} for _ in range(120)])
    seen: list[str] = []
    async with client(asgi) as http:
        url: str | None = "/jobs"
        while url:
            html = (await http.get(url)).text
            seen += re.findall(r'data-job="([0-9a-f-]{36})"', html)
            found = re.search(r'href="([^"]+)" rel="next"', html)
            url = found.group(1).replace("&amp;", "&") if found else None
    assert len(seen) == 120 and set(seen) == {str(i) for i in ids}
    assert seen == sorted(seen)  # the queued tab, in the order they run: all due at once, by id


async def test_actions_need_the_csrf_token_of_the_browser(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    data = seed(dsn)
    app, asgi = dashboard
    job_id = data["failed"][0]
    async with client(asgi) as http:
        html = (await http.get(f"/jobs/{job_id}")).text
        token = csrf_of(html)
        assert http.cookies.get("jobbus_csrf") == token
        refused = await http.post(f"/jobs/{job_id}/retry", data={"next": "/"})
        assert refused.status_code == 403
        refused = await http.post(f"/jobs/{job_id}/retry", data={"csrf": "0" * 64, "next": "/"})
        assert refused.status_code == 403
        foreign = await http.post(
            f"/jobs/{job_id}/retry", data={"csrf": token}, headers={"origin": "https://evil.example"}
        )
        assert foreign.status_code == 403
        async with app:
            assert (await app.find(job_id)).status is jobbus.JobStatus.FAILED  # type: ignore[union-attr]
        done = await http.post(
            f"/jobs/{job_id}/retry", data={"csrf": token, "next": "//evil.example/"}, headers={"origin": BASE}
        )
        assert done.status_code == 303 and done.headers["location"] == "/"
        async with app:
            assert (await app.find(job_id)).status is jobbus.JobStatus.QUEUED  # type: ignore[union-attr]
        assert "queued again" in (await http.get("/")).text  # the flash message


async def test_bulk_retry_of_a_failure_group_and_bulk_cancel(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    data = seed(dsn)
    app, asgi = dashboard
    async with client(asgi) as http:
        html = (await http.get("/failures")).text
        pattern = re.search(r'data-pattern="([^"]+)"', html).group(1)  # type: ignore[union-attr]
        response = await http.post(
            "/failures/retry",
            data={"csrf": csrf_of(html), "pattern": pattern.replace("&#39;", "'"), "next": "/failures"},
        )
        assert response.status_code == 303
        response = await http.post(
            "/jobs/bulk",
            data={"csrf": csrf_of(html), "action": "cancel", "ids": [str(i) for i in data["queued"]], "next": "/jobs"},
        )
        assert response.status_code == 303
    async with app:
        assert {(await app.find(i)).status for i in data["failed"]} == {jobbus.JobStatus.QUEUED}  # type: ignore[union-attr]
        assert {(await app.find(i)).status for i in data["queued"]} == {jobbus.JobStatus.CANCELLED}  # type: ignore[union-attr]


async def test_queue_worker_and_periodic_actions(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    seed(dsn)
    app, asgi = dashboard
    async with client(asgi) as http:
        token = csrf_of((await http.get("/queues")).text)
        for url, fields in [
            ("/queues/reports/pause", {}),
            ("/queues/reports/limits", {"concurrency": "3", "rate_limit": "100/1m", "rate_limit_per_key": ""}),
            ("/workers/action", {"action": "drain"}),
            ("/periodic/nightly/pause", {}),
            ("/periodic/nightly/run", {}),
        ]:
            response = await http.post(url, data={"csrf": token, "next": "/queues", **fields})
            assert response.status_code == 303, (url, response.text)
        queues = (await http.get("/queues")).text
        assert 'data-queue="reports"' in queues and "paused" in queues
        assert 'name="rate_limit" size="8" placeholder="none" value="100/60s"' in queues
        response = await http.post("/queues/reports/limits", data={"csrf": token, "rate_limit": "fast", "next": "/"})
        assert "refused" in (response.cookies.get("jobbus_flash") or "")
        workers = (await http.get("/workers")).text
        assert "drain" in workers and "all workers" in workers
    async with app:
        limits = await app.get_queue("reports")
        assert limits.concurrency == 3 and limits.rate_limit == jobbus.RateLimit(100, timedelta(minutes=1))
        assert limits.concurrency_per_key is None and limits.rate_limit_per_key is None
        (nightly,) = await app.list_periodic()
        assert not nightly.enabled and nightly.last_job_id is not None
        assert len(await app.list_jobs(type="report.render", status="queued")) == 3 + 1  # the group, run now


async def test_read_only_refuses_every_action_and_shows_none(dsn: str) -> None:
    data = seed(dsn)
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app, read_only=True)
    async with client(asgi) as http:
        for path in PAGES:
            html = (await http.get(path)).text
            assert 'method="post"' not in html, path
        html = (await http.get(f"/jobs/{data['failed'][0]}")).text
        assert "Retry" not in html
        for url in [f"/jobs/{data['failed'][0]}/retry", "/workers/action", "/queues/default/pause", "/jobs/bulk"]:
            assert (await http.post(url, data={"action": "stop"})).status_code == 403
    await asgi.state.dashboard.close()
    async with app:
        assert (await app.find(data["failed"][0])).status is jobbus.JobStatus.FAILED  # type: ignore[union-attr]


async def test_with_a_token_every_request_needs_it(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app, token="s3cret-token")
    async with client(asgi) as http:
        assert (await http.get("/jobs")).status_code == 401
        assert (await http.get("/events")).status_code == 401
        redirect = await http.get("/jobs?status=failed", headers={"accept": "text/html"})
        assert redirect.status_code == 303 and redirect.headers["location"].startswith("/login?next=")
        assert (await http.get("/jobs", headers={"authorization": "Bearer wrong"})).status_code == 401
        assert (await http.get("/jobs", headers={"authorization": "Bearer s3cret-token"})).status_code == 200
        login = await http.get("/login")
        token = csrf_of(login.text)
        wrong = await http.post("/login", data={"csrf": token, "token": "guess", "next": "/jobs"})
        assert wrong.status_code == 401 and "jobbus_session" not in wrong.headers.get("set-cookie", "")
        right = await http.post("/login", data={"csrf": token, "token": "s3cret-token", "next": "/jobs"})
        assert right.status_code == 303 and right.headers["location"] == "/jobs"
        cookie = right.headers["set-cookie"]
        assert "jobbus_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "s3cret-token" not in cookie
        assert (await http.get("/jobs")).status_code == 200
    # A bearer client needs no CSRF token (browsers never add that header by themselves).
    async with client(asgi) as api:
        response = await api.post("/queues/default/pause", headers={"authorization": "Bearer s3cret-token"})
        assert response.status_code == 303
        assert (await api.post("/queues/default/resume")).status_code == 401
    await asgi.state.dashboard.close()


def test_the_command_refuses_a_public_address_without_a_token(dsn: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobbus", "dashboard", "--dsn", dsn, "--host", "0.0.0.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 64, result.stderr
    assert "--token" in result.stderr


async def test_one_listener_and_one_pulse_feed_every_tab(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    pulses = 0
    store = DashboardStore("jobbus")

    async def pulse() -> Any:
        nonlocal pulses
        pulses += 1
        async with app.pool.connection() as conn:
            return await run_async(conn, store.pulse())

    async with app:
        live = LiveUpdates(
            pulse=pulse,
            listen_dsn=app.settings.notification_dsn,
            job_channel=app.store.channel,
            control_channel=app.store.control_channel,
            interval=0.2,
        )

        async def never() -> bool:
            return False

        tabs = [live.events(never) for _ in range(5)]
        for tab in tabs:
            assert await anext(tab) == "retry: 2000\n\n"
        first = [asyncio.ensure_future(anext(tab)) for tab in tabs]
        await asyncio.sleep(0.5)
        for task in first:
            task.cancel()
        await asyncio.gather(*first, return_exceptions=True)
        before = pulses
        waiting: list[asyncio.Future[str]] = [asyncio.ensure_future(anext(tab)) for tab in tabs]
        await asyncio.sleep(0.3)
        await app.schedule("mail.send", {})
        events = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        assert all(event.startswith("event: change\n") for event in events)
        assert live.subscribers == 5
        # Five tabs, one pulse per interval: a second of five tabs costs about five pulses, not 25.
        await asyncio.sleep(1.0)
        assert pulses - before <= 8
        for tab in tabs:
            await tab.aclose()
        assert live.subscribers == 0
        # A stopping server ends the open streams (uvicorn would wait for them forever).
        last = live.events(never)
        await anext(last)
        pending = asyncio.ensure_future(anext(last))
        await asyncio.sleep(0.1)
        live.end_streams()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(pending, 5)
        await live.close()


async def test_job_detail_shows_every_attempt_a_worker_recorded(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)

    @app.job("flaky")
    async def flaky(job: jobbus.JobExecution) -> str:
        if job.attempt == 1:
            raise ConnectionError("smtp timed out")
        await job.progress(2, 2)
        return "sent"

    asgi = create_app(app)
    async with app:
        job_id = await app.schedule("flaky", {})
        assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False) == 0
        async with client(asgi) as http:
            html = (await http.get(f"/jobs/{job_id}")).text
    await asgi.state.dashboard.close()
    rows = re.findall(r'<tr><td class="num">(\d)</td><td><span class="status (\w+)">', html)
    assert rows == [("1", "retried"), ("2", "completed")]
    assert "ConnectionError: smtp timed out" in html and "again in" in html
    assert "&#34;sent&#34;" in html and "100 %" in html


async def test_job_page_shows_each_attempts_traceback_collapsed_and_redacted(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)

    @app.job("mailer")
    async def mailer(job: jobbus.JobExecution) -> None:
        try:
            raise OSError(f"attempt {job.attempt}: connection refused")
        except OSError as exc:
            raise ConnectionError("smtp://mailer:hunter2@smtp.example is down") from exc

    asgi = create_app(app)
    async with app:
        job_id = await app.schedule("mailer", {}, max_attempts=2)
        assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False) == 0
        async with client(asgi) as http:
            html = (await http.get(f"/jobs/{job_id}")).text
    await asgi.state.dashboard.close()
    blocks = re.findall(
        r'<details class="traceback" data-key="traceback-\d"><summary>traceback</summary>'
        r"<pre>(.*?)</pre></details>",
        html,
        re.S,
    )
    assert len(blocks) == 2  # one per attempt, collapsed until opened
    for number, block in enumerate(blocks, start=1):
        assert f"OSError: attempt {number}: connection refused" in block
        assert "The above exception was the direct cause of the following exception" in block
        assert "ConnectionError: smtp://mailer:••••••@smtp.example is down" in block
    assert "hunter2" not in html
    # Times in one format, with their zone: UTC with Z, as the command line shows them in UTC.
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ</td>", html)
    assert re.search(r"<dt>created</dt><dd>\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \(", html)


async def test_job_page_shows_each_attempts_logs_escaped_masked_and_to_the_millisecond(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    lines = [
        {"at": "2026-12-02T02:00:00.250000+00:00", "level": "INFO", "message": "fetching page 1"},
        {"at": "2026-12-02T02:00:00.5+00:00", "level": "ERROR", "message": "<b>bold</b> password=hunter2"},
    ]
    history = [
        {"attempt": 1, "outcome": "completed", "at": "2026-12-02T02:00:01+00:00", "logs": lines, "logs_dropped": 3}
    ]
    asgi = create_app(app)
    async with app:
        job_id = await app.schedule("mailer", {})
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("UPDATE jobbus.job SET history = %s::jsonb WHERE id = %s", (json.dumps(history), job_id))
        async with client(asgi) as http:
            html = (await http.get(f"/jobs/{job_id}")).text
    await asgi.state.dashboard.close()
    assert '<details class="logs" data-key="logs-1"><summary>logs (2 lines, 3 earlier dropped)</summary>' in html
    assert '<td class="when">2026-12-02 02:00:00.250Z</td><td class="level">INFO</td>' in html
    assert f"&lt;b&gt;bold&lt;/b&gt; password={MASK}" in html
    assert "<b>bold</b>" not in html and "hunter2" not in html


async def test_counts_are_read_now_whatever_the_samples_say(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    """The overview and the queues page count the jobs now, as `jobbus status` does: a stale or wrong
    sample changes no count, and the charts' note says how old the samples are."""
    app, asgi = dashboard
    async with app:
        await app.schedule_many("mail.send", [{"n": n} for n in range(5)], queue="mail")
        await app.schedule("mail.send", {}, queue="mail", available_at=timedelta(hours=1))
    async with client(asgi) as http:
        # No worker ever ran: no sample at all.
        overview = (await http.get("/")).text
        assert re.search(r"<b>5</b> available", overview) and re.search(r"<b>1</b> scheduled", overview)
        assert "(none yet: is a worker running?)" in overview
        queues = (await http.get("/queues")).text
        row = re.search(r'<tr data-queue="mail">(.*?)</tr>', queues, re.S)
        cells = re.findall(r'<td class="num">(?:<a [^>]*>)?([^<]*)', row.group(1)) if row else []
        assert cells == ["5", "1", "0", "0"]
        # Nobody is alive to take them: the overview names them.
        assert "Queued jobs nobody can take" in overview and "no worker is alive" in overview
        assert "6 of type <code>mail.send</code> in queue <code>mail</code>" in overview
        # A sample older than three sampling intervals (a leader that died): the charts say so.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed,"
                " cancelled) VALUES (now() - interval '1 hour', 'mail', 0, 0, 0, 0, 0, 0)"
            )
        overview = (await http.get("/")).text
        assert "<b>5</b> available" in overview and "60 min old: <b>stale</b>" in overview
        # A fresh sample that disagrees changes no count.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed,"
                " cancelled) VALUES (now(), 'mail', 4, 1, 0, 0, 0, 0)"
            )
        overview = (await http.get("/")).text
        assert "<b>5</b> available" in overview and "stale" not in overview


async def test_mounted_under_a_path_its_links_actions_and_cookies_follow(dsn: str) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    data = seed(dsn)
    app = jobbus.App(dsn=dsn)
    dashboard = create_app(app)
    host = Starlette(routes=[Mount("/ops/jobs", app=dashboard)])
    async with client(host) as http:
        html = (await http.get("/ops/jobs/jobs?status=failed")).text
        assert 'href="/ops/jobs/static/dashboard.css"' in html and 'data-events="/ops/jobs/events"' in html
        assert f'href="/ops/jobs/jobs/{data["failed"][0]}"' in html
        assert (await http.get("/ops/jobs/static/live.js")).status_code == 200
        response = await http.post(
            f"/ops/jobs/jobs/{data['failed'][0]}/retry", data={"csrf": csrf_of(html), "next": "/jobs?status=failed"}
        )
        assert response.status_code == 303 and response.headers["location"] == "/ops/jobs/jobs?status=failed"
        assert "Path=/ops/jobs" in response.headers["set-cookie"]
    await dashboard.state.dashboard.close()


async def test_a_job_page_shows_its_steps_redacted_and_its_parent(dsn: str, dashboard: tuple[jobbus.App, Any]) -> None:
    data = seed(dsn)
    parent, child = data["queued"][0], data["queued"][1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job_step (job_id, name, result, attempt) VALUES "
            '(%s, \'charge\', \'{"charge_id": "ch_41", "api_key": "sk-live-7"}\', 1)',
            (child,),
        )
        conn.execute("INSERT INTO jobbus.job_child (child_id, parent_id) VALUES (%s, %s)", (child, parent))
    _, asgi = dashboard
    async with client(asgi) as http:
        page = (await http.get(f"/jobs/{child}")).text
    assert '<h2>Steps <span class="count">1</span></h2>' in page and "ch_41" in page
    assert "sk-live-7" not in page and MASK in page
    assert f'href="/jobs/{parent}"' in page


async def test_the_limits_form_keeps_what_it_does_not_send_and_clears_what_it_sends_empty(
    dsn: str, dashboard: tuple[jobbus.App, Any]
) -> None:
    app, asgi = dashboard
    async with app:
        await app.set_queue(
            "reports",
            concurrency=4,
            concurrency_per_key=1,
            rate_limit=jobbus.RateLimit(10, timedelta(minutes=1)),
            rate_limit_per_key=jobbus.RateLimit(2, timedelta(minutes=1)),
        )
    async with client(asgi) as http:
        token = csrf_of((await http.get("/queues")).text)

        async def post(**fields: str) -> jobbus.QueueSettings:
            response = await http.post("/queues/reports/limits", data={"csrf": token, "next": "/queues", **fields})
            assert response.status_code == 303
            assert "refused" not in (response.cookies.get("jobbus_flash") or "")
            async with app:
                return await app.get_queue("reports")

        limits = await post(concurrency="6")
        assert (limits.concurrency, limits.concurrency_per_key) == (6, 1)
        assert limits.rate_limit == jobbus.RateLimit(10, timedelta(minutes=1))
        assert limits.rate_limit_per_key == jobbus.RateLimit(2, timedelta(minutes=1))
        limits = await post(rate_limit_per_key="", concurrency_per_key="none")
        assert (limits.concurrency, limits.concurrency_per_key, limits.rate_limit_per_key) == (6, None, None)
        assert limits.rate_limit == jobbus.RateLimit(10, timedelta(minutes=1))
        limits = await post()
        assert (limits.concurrency, limits.rate_limit) == (6, jobbus.RateLimit(10, timedelta(minutes=1)))
        limits = await post(concurrency=" ", rate_limit="None")
        assert limits == jobbus.QueueSettings("reports")


async def test_queue_and_periodic_names_with_a_slash_have_their_pages_and_actions(
    dsn: str, dashboard: tuple[jobbus.App, Any]
) -> None:
    app, asgi = dashboard
    async with app:
        job_id = await app.schedule("report.render", {}, queue="a/b")
        await app.add_periodic("x/y", type="report.render", every=timedelta(hours=1))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled, oldest_available_seconds) VALUES (now(), 'a/b', 1, 0, 0, 0, 0, 0, 0)"
        )
    async with client(asgi) as http:
        queues = (await http.get("/queues")).text
        assert 'action="/queues/a/b/limits"' in queues and 'action="/queues/a/b/pause"' in queues
        periodic = (await http.get("/periodic")).text
        assert 'action="/periodic/x/y/pause"' in periodic and 'action="/periodic/x/y/run"' in periodic
        jobs = (await http.get("/jobs", params={"queue": "a/b"})).text
        assert str(job_id) in jobs
        token = csrf_of(queues)
        for url, fields in [
            ("/queues/a/b/limits", {"concurrency": "2"}),
            ("/queues/a/b/pause", {}),
            ("/periodic/x/y/pause", {}),
            ("/periodic/x/y/resume", {}),
            ("/periodic/x/y/run", {}),
            ("/periodic/x/y/pause", {}),
        ]:
            response = await http.post(url, data={"csrf": token, "next": "/queues", **fields})
            assert response.status_code == 303, (url, response.text)
            assert "refused" not in (response.cookies.get("jobbus_flash") or ""), url
        assert (await http.post("/queues/a/b/bogus", data={"csrf": token})).status_code == 404
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT target_kind, target FROM jobbus.pause").fetchall() == [("queue", "a/b")]
    async with app:
        assert (await app.get_queue("a/b")).concurrency == 2
        (periodic_job,) = await app.list_periodic()
        assert periodic_job.name == "x/y" and not periodic_job.enabled and periodic_job.last_job_id is not None


async def test_logout_needs_the_csrf_token(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app, token="s3cret-token")
    async with client(asgi) as http:
        token = csrf_of((await http.get("/login")).text)
        assert (await http.post("/login", data={"csrf": token, "token": "s3cret-token"})).status_code == 303
        page = (await http.get("/jobs", headers={"accept": "text/html"})).text
        assert re.search(r'action="/logout"[^>]*><input type="hidden" name="csrf" value="' + token, page)
        for fields, headers in [
            ({}, {}),
            ({"csrf": "0" * 64}, {}),
            ({"csrf": token}, {"origin": "https://evil.example"}),
        ]:
            refused = await http.post("/logout", data=fields, headers=headers)
            assert refused.status_code == 403
            assert "jobbus_session" not in refused.headers.get("set-cookie", "")
            assert (await http.get("/jobs")).status_code == 200  # still logged in
        done = await http.post("/logout", data={"csrf": token}, headers={"origin": BASE})
        assert done.status_code == 303 and done.headers["location"] == "/login"
        assert 'jobbus_session=""' in done.headers["set-cookie"]
        assert (await http.get("/jobs")).status_code == 401
    await asgi.state.dashboard.close()
