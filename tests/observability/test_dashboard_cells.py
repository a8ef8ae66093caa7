"""The dashboard over cells (SPEC 23): every cell shown, each page reading and acting in the cell its
address names, one login for every cell, a cell that is down named while the others serve."""

from __future__ import annotations

import asyncio
import html
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from starlette.routing import Mount, Route

import jobbus
from jobbus.dashboard import Role, create_app
from jobbus.dashboard.live import LiveUpdates, merged_events
from jobbus.dashboard.roles import PUBLIC, required_role
from tests.dbserver import fresh_database
from tests.observability.cells import cell_databases, cells_app, unreachable_dsn
from tests.observability.test_dashboard import BASE, csrf_of

TOKENS = {"admin": "adm1n-t0ken", "operator": "0per-t0ken", "viewer": "v1ew-t0ken"}
#: Jobs in cell a: more than the views count exactly, so that a count mixing cells, or an estimate
#: shown as exact, would show.
MANY = 20_000


@pytest.fixture
def cells(admin_dsn: str, template_db: str) -> Iterator[dict[str, str]]:
    with cell_databases(admin_dsn, template_db, ["a", "b", "c"]) as dsns:
        yield dsns


def sql(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def seed(cells: dict[str, str]) -> dict[str, list[uuid.UUID]]:
    """Cell a: MANY queued `bulk.a` jobs (the SQL API); b: three queued `mail.b`, two failed `report.b`;
    c: one queued `report.c`. Every job's configuration names its cell."""
    sql(
        cells["a"],
        "SELECT count(*) FROM jobbus.schedule_many((SELECT jsonb_agg(jsonb_build_object('type', 'bulk.a', "
        "'configuration', jsonb_build_object('cell', 'a', 'n', g))) FROM generate_series(1, %s) AS g))",
        MANY,
    )
    sql(cells["a"], "ANALYZE jobbus.job")
    made: dict[str, list[uuid.UUID]] = {}
    for name, jobs in (("b", [("mail.b", 3), ("report.b", 2)]), ("c", [("report.c", 1)])):
        app = jobbus.App(dsn=cells[name])
        with app.sync:
            for job_type, n in jobs:
                made[job_type] = app.sync.schedule_many(job_type, [{"cell": name, "n": i} for i in range(n)])
    sql(
        cells["b"],
        "UPDATE jobbus.job SET status = 'failed', attempts = 3, finished_at = now(), "
        "last_error = 'ReportMissingError: gone' WHERE type = 'report.b'",
    )
    return made


@pytest.fixture
async def dashboard(cells: dict[str, str]) -> AsyncIterator[Any]:
    asgi = create_app(cells_app(cells))
    yield asgi
    await asgi.state.dashboard.close()


def client(asgi: Any, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi, client=("127.0.0.1", 40000)), base_url=BASE, **kwargs
    )


def tab_counts(page: str) -> dict[str, str]:
    """Each tab's count on a jobs page, as shown."""
    found = re.findall(r'data-tab="(\w+)"[^>]*>\w+ <span class="count"[^>]*>([^<]*)</span>', page)
    return {tab: html.unescape(text) for tab, text in found}


def listed_types(page: str) -> set[str]:
    return set(re.findall(r'<tr data-job="[^"]+">.*?<td>[^<]*</td>\s*<td>([\w.]+)</td>', page, re.S))


def exact_or_marked(shown: str, exact: int) -> bool:
    """A count of `exact` jobs as a page may show it: exactly, or marked as an estimate."""
    return shown == f"{exact:,}" or shown.startswith("≈")


async def test_each_cells_jobs_page_lists_only_its_jobs_with_its_own_counts(
    cells: dict[str, str], dashboard: Any
) -> None:
    seed(cells)
    async with client(dashboard) as http:
        a = (await http.get("/cells/a/jobs?status=queued")).text
        b = (await http.get("/cells/b/jobs?status=queued")).text
        b_failed = (await http.get("/cells/b/jobs?status=failed")).text
        c = (await http.get("/cells/c/jobs")).text
        overview = (await http.get("/")).text
    assert listed_types(a) == {"bulk.a"} and a.count("<tr data-job=") == 50
    assert exact_or_marked(tab_counts(a)["queued"], MANY), tab_counts(a)
    assert tab_counts(a)["failed"] == "0"
    assert listed_types(b) == {"mail.b"} and tab_counts(b)["queued"] == "3" and tab_counts(b)["failed"] == "2"
    assert listed_types(b_failed) == {"report.b"}
    assert listed_types(c) == {"report.c"} and tab_counts(c)["queued"] == "1" and tab_counts(c)["failed"] == "0"
    # The switcher marks the cell shown and keeps the page's filters for the others.
    assert 'href="/cells/a/jobs?status=queued" data-cell="a">a</a>' in b
    assert 'href="/cells/b/jobs?status=queued" data-cell="b" aria-current="page">b</a>' in b
    # The overview shows every cell with its own counts.
    parts = dict(re.findall(r'<section class="cell[^"]*" data-cell="(\w)">(.*?)</section>', overview, re.S))
    assert set(parts) == {"a", "b", "c"}
    available = {
        name: html.unescape(re.findall(r"<b>([^<]*)</b></a> available", part)[0]) for name, part in parts.items()
    }
    assert exact_or_marked(available["a"], MANY) and available["b"] == "3" and available["c"] == "1"
    assert "failed" in parts["b"] and re.search(r"<b>2</b></a> failed", parts["b"])


def state(dsn: str) -> tuple[Any, ...]:
    """What an action can change in one cell: its jobs by status, limits, commands, audit entries."""
    (row,) = sql(
        dsn,
        "SELECT (SELECT jsonb_object_agg(status, n) FROM (SELECT status, count(*) AS n FROM jobbus.job "
        "GROUP BY status) s), (SELECT count(*) FROM jobbus.queue_setting), (SELECT count(*) FROM jobbus.command), "
        "(SELECT count(*) FROM jobbus.audit_log)",
    )
    return row


async def test_an_action_posted_in_cell_b_acts_in_b_and_is_audited_there(cells: dict[str, str], dashboard: Any) -> None:
    made = seed(cells)
    failed_b = made["report.b"]
    queued_c = made["report.c"][0]
    before_a, before_c = state(cells["a"]), state(cells["c"])
    async with client(dashboard) as http:
        csrf = csrf_of((await http.get("/cells/b/jobs?status=failed")).text)
        retried = await http.post(
            f"/cells/b/jobs/{failed_b[0]}/retry", data={"csrf": csrf, "next": "/jobs?status=failed"}
        )
        assert retried.status_code == 303 and retried.headers["location"] == "/cells/b/jobs?status=failed"
        landed = await http.get(retried.headers["location"])
        assert f"job {failed_b[0]} queued again" in landed.text
        paused = await http.post("/cells/b/queues/default/pause", data={"csrf": csrf, "next": "/queues"})
        assert paused.headers["location"] == "/cells/b/queues"
        limited = await http.post(
            "/cells/b/queues/default/limits", data={"csrf": csrf, "next": "/queues", "concurrency": "4"}
        )
        assert limited.status_code == 303
        bulk = await http.post(
            "/cells/b/jobs/bulk", data={"csrf": csrf, "next": "/jobs", "action": "retry", "ids": [str(failed_b[1])]}
        )
        assert bulk.status_code == 303
        # A job of another cell, posted from b's page: b holds no such job, nothing happens anywhere.
        foreign = await http.post(f"/cells/b/jobs/{queued_c}/cancel", data={"csrf": csrf, "next": "/jobs"})
        assert foreign.status_code == 303
        assert "refused" in (await http.get("/cells/b/jobs")).text
    assert state(cells["a"]) == before_a and state(cells["c"]) == before_c
    statuses, limits, commands, _ = state(cells["b"])
    assert statuses == {"queued": 5} and limits == 1 and commands == 1
    audit = sql(cells["b"], "SELECT action, target, source FROM jobbus.audit_log ORDER BY at, id")
    assert audit == [
        ("retry", f"job:{failed_b[0]}", "dashboard"),
        ("pause", "queue:default", "dashboard"),
        ("set_queue", "queue:default", "dashboard"),
        ("retry", "jobs", "dashboard"),  # the bulk retry's one entry, naming its jobs
    ]
    assert sql(cells["b"], "SELECT details->'jobs' FROM jobbus.audit_log WHERE target = 'jobs'") == [
        ([str(failed_b[1])],)
    ]
    assert sql(cells["a"], "SELECT count(*) FROM jobbus.audit_log") == [(0,)]
    assert sql(cells["c"], "SELECT status FROM jobbus.job WHERE id = %s", queued_c) == [("queued",)]


def cell_routes(asgi: Any) -> dict[str, list[Route]]:
    """Each cell's routes, by the path its mount adds."""
    return {
        mount.path: [route for route in mount.routes if isinstance(route, Route)]
        for mount in asgi.routes
        if isinstance(mount, Mount) and mount.path.startswith("/cells/")
    }


def concrete(path: str, params: dict[str, str]) -> str:
    """A route's path with its parameters filled in."""
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: params[m[1]], path)


def test_every_route_of_every_cell_declares_its_role(cells: dict[str, str]) -> None:
    asgi = create_app(cells_app(cells))
    mounts = cell_routes(asgi)
    assert list(mounts) == ["/cells/a", "/cells/b", "/cells/c"]
    single = create_app(jobbus.App(dsn=cells["a"]))
    expected = {
        route.path: required_role(route.endpoint)
        for route in single.routes
        if isinstance(route, Route) and required_role(route.endpoint) != PUBLIC
    }
    for routes in mounts.values():  # each cell has every page and action of one database, with its role
        assert {route.path: required_role(route.endpoint) for route in routes} == expected
    root = {route.path: required_role(route.endpoint) for route in asgi.routes if isinstance(route, Route)}
    assert root == {
        "/": Role.VIEWER,
        "/events": Role.VIEWER,
        "/login": PUBLIC,
        "/logout": PUBLIC,
        "/health": PUBLIC,
        "/{path:path}": Role.VIEWER,
    }


async def test_a_viewer_posts_nothing_in_any_cell_and_one_login_serves_every_cell(cells: dict[str, str]) -> None:
    made = seed(cells)
    asgi = create_app(
        cells_app(cells), token=TOKENS["admin"], operator_token=TOKENS["operator"], viewer_token=TOKENS["viewer"]
    )
    before = {name: state(dsn) for name, dsn in cells.items()}
    try:
        async with client(asgi) as browser:
            # Not logged in: a cell's page sends to the one login form, and back to that page after it.
            sent = await browser.get("/cells/b/jobs?status=failed", headers={"accept": "text/html"})
            assert (
                sent.status_code == 303
                and sent.headers["location"] == "/login?next=%2Fcells%2Fb%2Fjobs%3Fstatus%3Dfailed"
            )
            csrf = csrf_of((await browser.get("/login")).text)
            login = await browser.post(
                "/login", data={"csrf": csrf, "token": TOKENS["viewer"], "next": "/cells/b/jobs?status=failed"}
            )
            assert login.status_code == 303 and login.headers["location"] == "/cells/b/jobs?status=failed"
            for path in ("/", "/cells/a/jobs", "/cells/b/failures", "/cells/c/queues", "/cells/c/audit"):
                assert (await browser.get(path)).status_code == 200, path
            posts = 0
            for prefix, routes in cell_routes(asgi).items():
                for route in routes:
                    if "POST" not in (route.methods or ()):
                        continue
                    job_id = made["report.b"][0] if prefix == "/cells/b" else made["report.c"][0]
                    params = {"job_id": str(job_id), "queue": "default", "verb": "pause", "name": "nightly"}
                    path = concrete(route.path, params)
                    form = {"csrf": csrf, "next": "/", "action": "retry", "ids": [str(job_id)], "scope": "selected"}
                    form |= {"set_priority": "5", "concurrency": "1", "confirm": "1", "pattern": "x"}
                    refused = await browser.post(prefix + path, data=form)
                    assert refused.status_code == 403, (prefix + path, refused.status_code)
                    assert "needs the operator role" in refused.text or "needs the admin role" in refused.text
                    posts += 1
            assert posts == 3 * 11  # every action of every cell
        assert {name: state(dsn) for name, dsn in cells.items()} == before
        async with client(asgi) as operator:  # the operator's one login acts in every cell
            csrf = csrf_of((await operator.get("/login")).text)
            await operator.post("/login", data={"csrf": csrf, "token": TOKENS["operator"], "next": "/"})
            cancelled = await operator.post(
                f"/cells/c/jobs/{made['report.c'][0]}/cancel", data={"csrf": csrf, "next": "/jobs"}
            )
            assert cancelled.status_code == 303 and cancelled.headers["location"] == "/cells/c/jobs"
        assert sql(cells["c"], "SELECT status FROM jobbus.job") == [("cancelled",)]
    finally:
        await asgi.state.dashboard.close()


async def test_a_job_page_is_found_in_the_cell_that_holds_it(cells: dict[str, str], dashboard: Any) -> None:
    made = seed(cells)
    job_b = made["mail.b"][0]
    async with client(dashboard) as http:
        from_root = await http.get(f"/jobs/{job_b}")
        assert from_root.status_code == 303 and from_root.headers["location"] == f"/cells/b/jobs/{job_b}"
        from_a = await http.get(f"/cells/a/jobs/{job_b}")
        assert from_a.status_code == 303 and from_a.headers["location"] == f"/cells/b/jobs/{job_b}"
        searched = await http.get(f"/cells/c/jobs?q={job_b}")
        assert searched.status_code == 303 and searched.headers["location"] == f"/cells/b/jobs/{job_b}"
        page = await http.get(f"/cells/b/jobs/{job_b}")
        assert page.status_code == 200 and "mail.b" in page.text
        assert "<title>" in page.text and "cell b" in page.text
        unknown = uuid.uuid4()
        assert (await http.get(f"/jobs/{unknown}")).status_code == 404
        assert (await http.get(f"/cells/a/jobs/{unknown}")).status_code == 404
        # A page named without a cell opens in the first cell.
        first = await http.get("/failures?x=1")
        assert first.status_code == 303 and first.headers["location"] == "/cells/a/failures?x=1"


async def test_a_cell_that_is_down_is_named_while_the_others_serve(admin_dsn: str, template_db: str) -> None:
    with cell_databases(admin_dsn, template_db, ["a", "b"]) as dsns, fresh_database(admin_dsn, None) as bare:
        for name in dsns:
            app = jobbus.App(dsn=dsns[name])
            with app.sync:
                app.sync.schedule(f"job.{name}", {})
        asgi = create_app(cells_app({"a": dsns["a"], "down": unreachable_dsn(), "b": dsns["b"], "bare": bare}))
        try:
            async with client(asgi) as http:
                overview = await http.get("/")
                assert overview.status_code == 200
                parts = dict(
                    re.findall(r'<section class="cell[^"]*" data-cell="(\w+)">(.*?)</section>', overview.text, re.S)
                )
                assert set(parts) == {"a", "down", "b", "bare"}
                assert "cannot be reached" in parts["down"] and "Connection refused" in parts["down"]
                assert "cannot be reached" not in parts["a"] + parts["b"] + parts["bare"]
                assert "schema not ready" in parts["bare"] and "jobbus migrate --cell bare" in parts["bare"]
                assert "Schema not ready" in (await http.get("/cells/bare/jobs")).text
                assert "Traceback" not in overview.text and 'data-queue="default"' in parts["b"]
                started = time.monotonic()
                down = await http.get("/cells/down/jobs")
                assert time.monotonic() - started < 1.0  # said at once: the cell was tried a moment ago
                assert down.status_code == 503
                assert "Cell down cannot be reached" in down.text and "Connection refused" in down.text
                assert 'data-cell="down" aria-current="page"' in down.text and "Traceback" not in down.text
                assert (await http.get("/cells/down/jobs", headers={"accept": "application/json"})).json()[
                    "cell"
                ] == "down"
                assert (await http.get("/cells/b/jobs")).status_code == 200
                csrf = csrf_of((await http.get("/cells/b/jobs")).text)
                posted = await http.post("/cells/down/queues/default/pause", data={"csrf": csrf, "next": "/queues"})
                assert posted.status_code == 503 and "Cell down cannot be reached" in posted.text
                health = await http.get("/health")
                assert health.status_code == 200 and "down: " in health.text and "a: ok" in health.text
                found = await http.get(f"/jobs/{uuid.uuid4()}")  # asking every cell, the one down included
                assert found.status_code == 404
                unknown = await http.get("/cells/nowhere/jobs")
                assert (
                    unknown.status_code == 404
                    and "no cell named &#39;nowhere&#39;: the cells are a, down" in unknown.text
                )
        finally:
            await asgi.state.dashboard.close()


async def test_the_overviews_stream_tells_of_a_change_in_any_cell() -> None:
    async def pulse() -> int:
        return 0

    sources = [
        LiveUpdates(pulse=pulse, listen_dsn=None, job_channel="j", control_channel="c", interval=0.05) for _ in range(3)
    ]
    stream = merged_events(sources, lambda: asyncio.sleep(0, result=False))
    try:
        assert await anext(stream) == "retry: 2000\n\n"
        received = []
        for source in (sources[2], sources[0]):
            source._changed.set()
            received.append(await asyncio.wait_for(anext(stream), 5))
        assert received == ["event: change\ndata: 1\n\n", "event: change\ndata: 2\n\n"]
        assert all(source.subscribers == 1 for source in sources)
    finally:
        await stream.aclose()
        for source in sources:
            await source.close()
    assert all(source.subscribers == 0 for source in sources)


async def test_mounted_under_a_path_every_cell_keeps_the_mount_and_one_login(cells: dict[str, str]) -> None:
    from starlette.applications import Starlette

    seed(cells)
    asgi = create_app(cells_app(cells), token=TOKENS["admin"])
    host = Starlette(routes=[Mount("/ops", app=asgi)])
    try:
        async with client(host) as browser:
            sent = await browser.get("/ops/cells/b/jobs", headers={"accept": "text/html"})
            assert sent.headers["location"] == "/ops/login?next=%2Fcells%2Fb%2Fjobs"
            login_page = await browser.get(sent.headers["location"])
            assert 'action="/ops/login"' in login_page.text
            csrf = csrf_of(login_page.text)
            login = await browser.post(
                "/ops/login", data={"csrf": csrf, "token": TOKENS["admin"], "next": "/cells/b/jobs"}
            )
            assert login.headers["location"] == "/ops/cells/b/jobs"
            assert "Path=/ops" in login.headers["set-cookie"]
            page = (await browser.get("/ops/cells/b/jobs")).text
            assert 'href="/ops/cells/b/failures"' in page and 'href="/ops/cells/a/jobs" data-cell="a"' in page
            assert 'href="/ops/static/dashboard.css"' in page and 'data-events="/ops/cells/b/events"' in page
            paused = await browser.post("/ops/cells/b/queues/mail/pause", data={"csrf": csrf, "next": "/queues"})
            assert paused.headers["location"] == "/ops/cells/b/queues"
            assert "Path=/ops" in paused.headers["set-cookie"]  # the flash, read on any cell's page
            assert (await browser.get("/ops/")).status_code == 200
            assert (await browser.get("/ops/jobs")).headers["location"] == "/ops/cells/a/jobs"
        assert sql(cells["b"], "SELECT count(*) FROM jobbus.command") == [(1,)]
        assert sql(cells["a"], "SELECT count(*) FROM jobbus.command") == [(0,)]
    finally:
        await asgi.state.dashboard.close()


async def test_a_dashboard_of_one_database_mounted_under_a_path_logs_in_back_to_the_page(dsn: str) -> None:
    """The login's way back is relative to the mount (it once named the mount twice: /ops/ops/jobs)."""
    from starlette.applications import Starlette

    asgi = create_app(jobbus.App(dsn=dsn), token=TOKENS["admin"])
    try:
        async with client(Starlette(routes=[Mount("/ops", app=asgi)])) as browser:
            sent = await browser.get("/ops/jobs?status=failed", headers={"accept": "text/html"})
            assert sent.headers["location"] == "/ops/login?next=%2Fjobs%3Fstatus%3Dfailed"
            csrf = csrf_of((await browser.get(sent.headers["location"])).text)
            login = await browser.post(
                "/ops/login", data={"csrf": csrf, "token": TOKENS["admin"], "next": "/jobs?status=failed"}
            )
            assert login.headers["location"] == "/ops/jobs?status=failed"
            assert (await browser.get(login.headers["location"])).status_code == 200
            page = (await browser.get("/ops/jobs")).text
            assert 'nav class="cells"' not in page and 'href="/ops/static/dashboard.css"' in page
    finally:
        await asgi.state.dashboard.close()


async def test_with_two_cells_each_cells_failures_queues_and_workers_are_its_own(
    admin_dsn: str, template_db: str
) -> None:
    with cell_databases(admin_dsn, template_db, ["left", "right"]) as dsns:
        for name, queue in (("left", "billing"), ("right", "reports")):
            app = jobbus.App(dsn=dsns[name])
            with app.sync:
                app.sync.schedule_many(f"{queue}.run", [{"n": n} for n in range(4)], queue=queue)
        sql(
            dsns["right"],
            "UPDATE jobbus.job SET status = 'failed', attempts = 3, finished_at = now(), "
            "last_error = 'ReportMissingError: report ' || (configuration_data->>'n') || ' is missing'",
        )
        sql(
            dsns["left"],
            "INSERT INTO jobbus.worker (id, host, pid, queues, concurrency, state, last_seen_at) "
            "VALUES ('worker-left', 'h', 1, '{billing}', 4, 'running', now())",
        )
        asgi = create_app(cells_app(dsns))
        try:
            async with client(asgi) as http:
                left_failures = (await http.get("/cells/left/failures")).text
                right_failures = (await http.get("/cells/right/failures")).text
                left_queues = (await http.get("/cells/left/queues")).text
                right_queues = (await http.get("/cells/right/queues")).text
                left_workers = (await http.get("/cells/left/workers")).text
                right_workers = (await http.get("/cells/right/workers")).text
            assert "ReportMissingError" not in left_failures
            assert "ReportMissingError" in right_failures and 'href="/cells/right/jobs?status=failed' in right_failures
            assert 'data-queue="billing"' in left_queues and 'data-queue="reports"' not in left_queues
            assert 'data-queue="reports"' in right_queues and 'data-queue="billing"' not in right_queues
            assert "worker-left" in left_workers and "worker-left" not in right_workers
        finally:
            await asgi.state.dashboard.close()
