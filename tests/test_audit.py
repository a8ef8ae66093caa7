"""The audit trail (SPEC 22): every operator action writes exactly one entry, in the action's own
transaction, naming who acted (`acting_as`, the command line's user, the dashboard's) and through what.

The actions are a table: each row says how to prepare, perform and find an action through the Python
API, the command line and the dashboard. A new admin verb of the App fails
`test_every_admin_verb_of_the_app_is_in_the_table` until it is audited and listed here.
"""

from __future__ import annotations

import asyncio
import getpass
import inspect
import itertools
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import control
from jobbus.dashboard import create_app
from jobbus.limits import RateLimit
from jobbus.producer._async import AsyncProducer
from jobbus.store import run_async
from tests.cli import jobbus as run_cli
from tests.observability.test_dashboard import client, csrf_of

Ctx = dict[str, Any]


def entries(dsn: str) -> list[dict[str, Any]]:
    """The whole trail, oldest first, read as the schema's owner."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT actor, source, action, target, details FROM jobbus.audit_log ORDER BY at, id"
        ).fetchall()
    return [{"actor": r[0], "source": r[1], "action": r[2], "target": r[3], "details": r[4]} for r in rows]


def sql(dsn: str, statement: str, *params: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode(), params)


async def _queued(app: jobbus.App, dsn: str) -> Ctx:
    return {"id": await app.schedule("mail.send", {"to": "a"}, queue="mail")}


async def _failed(app: jobbus.App, dsn: str) -> Ctx:
    job_id = await app.schedule("mail.send", {"to": "a"}, queue="mail")
    sql(dsn, "UPDATE jobbus.job SET status = 'failed', attempts = 3, finished_at = now() WHERE id = %s", job_id)
    return {"id": job_id}


async def _delayed(app: jobbus.App, dsn: str) -> Ctx:
    return {"id": await app.schedule("mail.send", {"to": "a"}, queue="mail", available_at=timedelta(hours=1))}


async def _nothing(app: jobbus.App, dsn: str) -> Ctx:
    return {}


async def _periodic(app: jobbus.App, dsn: str) -> Ctx:
    await app.add_periodic("nightly", type="report.render", every=timedelta(hours=1))
    sql(dsn, "DELETE FROM jobbus.audit_log")  # the periodic job's own entry is not the action tested
    return {}


@dataclass(frozen=True)
class Action:
    """One operator action: how to prepare for it, perform it through each source, and its target."""

    name: str
    prepare: Callable[[jobbus.App, str], Awaitable[Ctx]]
    api: Callable[[jobbus.App, Ctx], Awaitable[object]]
    target: Callable[[Ctx], str]
    cli: Callable[[Ctx], list[str]] | None = None
    #: (path, form) of the dashboard's POST; None when the dashboard does not offer the action.
    dashboard: Callable[[Ctx], tuple[str, dict[str, Any]]] | None = None


def _job(ctx: Ctx) -> str:
    return f"job:{ctx['id']}"


def _control(verb: str) -> Action:
    async def api(app: jobbus.App, ctx: Ctx) -> object:
        return await getattr(control, verb)(app, all=True)

    def cli(ctx: Ctx) -> list[str]:
        return [verb, "--all"]

    def dashboard(ctx: Ctx) -> tuple[str, dict[str, Any]]:
        return "/workers/action", {"action": verb}

    return Action(verb, _nothing, api, lambda ctx: "all", cli=cli, dashboard=dashboard)


ACTIONS = [
    *[_control(verb) for verb in ("pause", "resume", "drain", "stop", "restart")],
    Action(
        "retry",
        _failed,
        lambda app, ctx: app.retry(ctx["id"]),
        _job,
        cli=lambda ctx: ["jobs", "retry", str(ctx["id"])],
        dashboard=lambda ctx: (f"/jobs/{ctx['id']}/retry", {}),
    ),
    Action(
        "cancel",
        _queued,
        lambda app, ctx: app.cancel(ctx["id"]),
        _job,
        cli=lambda ctx: ["jobs", "cancel", str(ctx["id"])],
        dashboard=lambda ctx: (f"/jobs/{ctx['id']}/cancel", {}),
    ),
    Action(
        "delete",
        _queued,
        lambda app, ctx: app.delete(ctx["id"]),
        _job,
        cli=lambda ctx: ["jobs", "delete", str(ctx["id"])],
        dashboard=lambda ctx: (f"/jobs/{ctx['id']}/delete", {}),
    ),
    Action(
        "run_now",
        _delayed,
        lambda app, ctx: app.run_now(ctx["id"]),
        _job,
        cli=lambda ctx: ["jobs", "run-now", str(ctx["id"])],
        dashboard=lambda ctx: (f"/jobs/{ctx['id']}/run-now", {}),
    ),
    Action(
        "update",
        _queued,
        lambda app, ctx: app.update(ctx["id"], priority=5),
        _job,
        cli=lambda ctx: ["jobs", "update", str(ctx["id"]), "--set-priority", "5"],
    ),
    Action(
        "update_many",
        _queued,
        lambda app, ctx: app.update_many(queue="mail", set_priority=5),
        lambda ctx: "jobs",
        cli=lambda ctx: ["jobs", "update", "--queue", "mail", "--set-priority", "5"],
        dashboard=lambda ctx: (
            "/jobs/update",
            {"scope": "filter", "filter_queue": "mail", "set_priority": "5", "confirm": "1"},
        ),
    ),
    Action(
        "set_queue",
        _nothing,
        lambda app, ctx: app.set_queue("mail", concurrency=3, rate_limit=RateLimit(10, per=timedelta(minutes=1))),
        lambda ctx: "queue:mail",
        cli=lambda ctx: ["queue", "set", "mail", "--concurrency", "3"],
        dashboard=lambda ctx: ("/queues/mail/limits", {"concurrency": "3"}),
    ),
    Action(
        "add_periodic",
        _nothing,
        lambda app, ctx: app.add_periodic("nightly", type="report.render", every=timedelta(hours=1)),
        lambda ctx: "periodic:nightly",
        cli=lambda ctx: ["periodic", "add", "nightly", "--type", "report.render", "--every", "1h"],
    ),
    Action(
        "remove_periodic",
        _periodic,
        lambda app, ctx: app.remove_periodic("nightly"),
        lambda ctx: "periodic:nightly",
        cli=lambda ctx: ["periodic", "remove", "nightly"],
    ),
    Action(
        "pause_periodic",
        _periodic,
        lambda app, ctx: app.pause_periodic("nightly"),
        lambda ctx: "periodic:nightly",
        cli=lambda ctx: ["periodic", "pause", "nightly"],
        dashboard=lambda ctx: ("/periodic/nightly/pause", {}),
    ),
    Action(
        "resume_periodic",
        _periodic,
        lambda app, ctx: app.resume_periodic("nightly"),
        lambda ctx: "periodic:nightly",
        cli=lambda ctx: ["periodic", "resume", "nightly"],
        dashboard=lambda ctx: ("/periodic/nightly/resume", {}),
    ),
    Action(
        "run_periodic",
        _periodic,
        lambda app, ctx: app.run_periodic("nightly"),
        lambda ctx: "periodic:nightly",
        cli=lambda ctx: ["periodic", "run", "nightly"],
        dashboard=lambda ctx: ("/periodic/nightly/run", {}),
    ),
]
BY_NAME = {action.name: action for action in ACTIONS}

#: The App's verbs that change nothing an operator would audit: reads, producers, schema, waits.
NOT_AUDITED = {
    "schedule",
    "schedule_many",
    "insert_specs",
    "schedule_group",
    "find",
    "wait",
    "emit_event",
    "list_jobs",
    "group_progress",
    "prune",
    "consume",
    "get_queue",
    "list_queues",
    "queue_usage",
    "list_periodic",
    "list_audit",
    "migrate",
    "check_schema",
}


def test_every_admin_verb_of_the_app_is_in_the_table() -> None:
    verbs = {
        name for name, _ in inspect.getmembers(AsyncProducer, inspect.iscoroutinefunction) if not name.startswith("_")
    }
    audited = {action.name for action in ACTIONS} - {"pause", "resume", "drain", "stop", "restart"}
    assert verbs - NOT_AUDITED == audited, "a new admin verb: audit it and add it to ACTIONS, or to NOT_AUDITED"
    commands = {name for name in dir(control) if callable(getattr(control, name))}
    assert {"pause", "resume", "drain", "stop", "restart"} <= commands


@pytest.mark.parametrize("actor", [None, "alice@example.com"], ids=["default", "acting_as"])
@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.name)
async def test_an_api_action_writes_one_entry(dsn: str, action: Action, actor: str | None) -> None:
    async with jobbus.App(dsn=dsn) as app:
        ctx = await action.prepare(app, dsn)
        if actor is None:
            await action.api(app, ctx)
        else:
            with jobbus.acting_as(actor):
                await action.api(app, ctx)
    assert [(e["actor"], e["source"], e["action"], e["target"]) for e in entries(dsn)] == [
        (actor or "api", "api", action.name, action.target(ctx))
    ]


@pytest.mark.parametrize("action", [a for a in ACTIONS if a.cli is not None], ids=lambda a: a.name)
def test_a_cli_action_writes_one_entry_naming_the_operating_system_user(dsn: str, action: Action) -> None:
    async def prepare() -> Ctx:
        async with jobbus.App(dsn=dsn) as app:
            return await action.prepare(app, dsn)

    ctx = asyncio.run(prepare())
    assert action.cli is not None
    result = run_cli(dsn, *action.cli(ctx))
    assert result.returncode == 0, result.stderr
    assert [(e["actor"], e["source"], e["action"], e["target"]) for e in entries(dsn)] == [
        (getpass.getuser(), "cli", action.name, action.target(ctx))
    ]


@pytest.mark.parametrize("action", [a for a in ACTIONS if a.dashboard is not None], ids=lambda a: a.name)
@pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])
async def test_a_dashboard_action_writes_one_entry_naming_the_dashboard_user(
    dsn: str, action: Action, token: str | None
) -> None:
    app = jobbus.App(dsn=dsn)
    async with app:
        ctx = await action.prepare(app, dsn)
    asgi = create_app(app, token=token)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        async with client(asgi, headers=headers) as http:
            html = (await http.get("/jobs")).text
            assert action.dashboard is not None
            path, form = action.dashboard(ctx)
            answer = await http.post(path, data={**form, "csrf": csrf_of(html), "next": "/"})
            assert answer.status_code == 303
            assert "refused" not in (answer.cookies.get("jobbus_flash") or "")
    finally:
        await asgi.state.dashboard.close()
    actor = "admin-token" if token else "anonymous"
    assert [(e["actor"], e["source"], e["action"], e["target"]) for e in entries(dsn)] == [
        (actor, "dashboard", action.name, action.target(ctx))
    ]


async def test_a_queue_pause_from_the_dashboard_names_the_queue(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app)
    try:
        async with client(asgi) as http:
            html = (await http.get("/jobs")).text
            await http.post("/queues/mail/pause", data={"csrf": csrf_of(html), "next": "/queues"})
    finally:
        await asgi.state.dashboard.close()
    assert [(e["action"], e["target"], e["source"]) for e in entries(dsn)] == [("pause", "queue:mail", "dashboard")]


# -- nothing is recorded of what did not happen ------------------------------------------------------


async def test_refused_actions_write_nothing(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        unknown = uuid.uuid4()
        queued = await app.schedule("mail.send", {}, queue="mail")
        done = await app.schedule("mail.send", {}, queue="mail")
        sql(dsn, "UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE id = %s", done)
        running = await app.schedule("mail.send", {}, queue="mail")
        sql(dsn, "UPDATE jobbus.job SET status = 'running', attempts = 1 WHERE id = %s", running)
        for refused in (
            app.retry(queued),
            app.retry(unknown),
            app.cancel(unknown),
            app.delete(running),
            app.delete(unknown),
            app.run_now(done),
            app.update(done, priority=1),
            app.remove_periodic("none"),
            app.pause_periodic("none"),
            app.resume_periodic("none"),
            app.run_periodic("none"),
        ):
            with pytest.raises(jobbus.InvalidStateError):
                await refused
        assert await app.cancel(done) is jobbus.JobStatus.COMPLETED  # a finished job is left as it is
        with pytest.raises(ValueError):
            await app.set_queue("mail", concurrency=-1)
    assert entries(dsn) == []


async def test_a_retry_refused_by_the_database_writes_nothing(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        failed = await app.schedule("mail.send", {}, unique_key="k")
        sql(dsn, "UPDATE jobbus.job SET status = 'failed', finished_at = now() WHERE id = %s", failed)
        await app.schedule("mail.send", {}, unique_key="k")  # another active job holds the key now
        with pytest.raises(jobbus.InvalidStateError, match="unique_key"):
            await app.retry(failed)
    assert entries(dsn) == []


async def test_an_entry_that_cannot_be_written_undoes_its_action(dsn: str) -> None:
    """The entry is written in the action's transaction: when it fails, the action is rolled back."""
    async with jobbus.App(dsn=dsn) as app:
        job_id = await app.schedule("mail.send", {}, queue="mail")
        sql(dsn, "ALTER TABLE jobbus.audit_log ADD CONSTRAINT no_cancel CHECK (action <> 'cancel')")
        with pytest.raises(psycopg.errors.CheckViolation):
            await app.cancel(job_id)
        found = await app.find(job_id)
        assert found is not None and found.status is jobbus.JobStatus.QUEUED
        sql(dsn, "ALTER TABLE jobbus.audit_log ADD CONSTRAINT no_pause CHECK (action <> 'pause')")
        with pytest.raises(psycopg.errors.CheckViolation):
            await control.pause(app, queue="mail")
        assert (await control.queue_status(app)).pauses == ()
        sql(dsn, "ALTER TABLE jobbus.audit_log ADD CONSTRAINT no_limits CHECK (action <> 'set_queue')")
        with pytest.raises(psycopg.errors.CheckViolation):
            await app.set_queue("mail", concurrency=2)
        assert await app.list_queues() == []
    assert entries(dsn) == []


async def test_an_action_repeated_after_a_lost_connection_writes_one_entry(dsn: str) -> None:
    """The entry's id is made once per call: a statement repeated after its commit went through (as
    `_run` repeats one after a lost connection) writes no second entry."""
    async with jobbus.App(dsn=dsn) as app:
        job_id = await app.schedule("mail.send", {}, queue="mail")
        operation = app.audit_store.audited(
            app.store.update_job(
                job_id, priority=3, queue=None, available_at=None, delay_seconds=None, tags=None, set_tags=False
            ),
            "update",
            f"job:{job_id}",
            lambda result: {"before": "queued"},
        )
        async with app.pool.connection() as conn:
            await run_async(conn, operation)
        async with app.pool.connection() as conn:
            await run_async(conn, operation)
    assert [e["action"] for e in entries(dsn)] == ["update"]


def test_the_sync_twin_records_as_the_async_verbs_do(sync_app: jobbus.App, dsn: str) -> None:
    job_id = sync_app.sync.schedule("mail.send", {}, queue="mail")
    with jobbus.acting_as("cron-script"):
        sync_app.sync.cancel(job_id)
    assert [(e["actor"], e["action"], e["target"]) for e in entries(dsn)] == [
        ("cron-script", "cancel", f"job:{job_id}")
    ]


# -- bulk actions: one entry with the count and the filter -------------------------------------------


async def test_update_many_writes_one_entry_with_the_total_and_the_filter(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        await app.schedule_many("mail.send", [{"n": n} for n in range(2500)], queue="mail")
        assert await app.update_many(queue="mail", type="mail.send", set_priority=7) == 2500
        assert await app.update_many(queue="nothing-here", set_priority=7) == 0
    found = entries(dsn)
    assert [(e["action"], e["target"], e["details"]["count"]) for e in found] == [
        ("update_many", "jobs", 2500),
        ("update_many", "jobs", 0),
    ]
    assert found[0]["details"]["filter"] == {"queue": "mail", "type": "mail.send"}
    assert found[0]["details"]["changes"] == {"priority": 7}


async def test_an_update_many_refused_half_way_records_what_the_batches_before_changed(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        await app.schedule_many("mail.send", [{"n": n} for n in range(1500)], queue="mail")
        # The last job (in id order, the second batch) cannot take 2 more tags: it has 15.
        sql(
            dsn,
            "UPDATE jobbus.job SET tags = (SELECT array_agg('t' || i) FROM generate_series(1, 15) i) "
            "WHERE id = (SELECT id FROM jobbus.job ORDER BY id DESC LIMIT 1)",
        )
        with pytest.raises(jobbus.InvalidJobError):
            await app.update_many(queue="mail", add_tags=["a", "b"])
    (entry,) = entries(dsn)
    assert entry["action"] == "update_many" and entry["details"]["count"] == 1000
    assert "16" in entry["details"]["refused"]


async def test_a_dashboard_bulk_action_writes_one_entry_naming_the_jobs_it_acted_on(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    async with app:
        ids = await app.schedule_many("mail.send", [{"n": n} for n in range(5)], queue="mail")
        sql(dsn, "UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE id = %s", ids[0])
    asgi = create_app(app)
    try:
        async with client(asgi) as http:
            token = csrf_of((await http.get("/jobs")).text)
            form = {"csrf": token, "action": "cancel", "ids": [str(i) for i in ids], "next": "/jobs"}
            await http.post("/jobs/bulk", data=form)
            form = {
                "csrf": token,
                "scope": "selected",
                "ids": [str(i) for i in ids],
                "set_priority": "4",
                "confirm": "1",
            }
            await http.post("/jobs/update", data={**form, "next": "/jobs"})
    finally:
        await asgi.state.dashboard.close()
    cancel, update = entries(dsn)
    assert (cancel["action"], cancel["source"], cancel["details"]["count"]) == ("cancel", "dashboard", 4)
    assert sorted(cancel["details"]["jobs"]) == sorted(str(i) for i in ids[1:])  # not the finished one
    assert (update["action"], update["details"]["count"]) == ("update_many", 0)  # all cancelled by then


async def test_retrying_a_failure_group_writes_one_entry(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        ids = await app.schedule_many("mail.send", [{"n": n} for n in range(2100)], queue="mail")
        sql(
            dsn,
            "UPDATE jobbus.job SET status = 'failed', finished_at = now(), last_error = 'SMTPError: down', "
            "error_group = 'SMTPError: down' WHERE id = ANY(%s)",
            ids,
        )
        from jobbus import views

        retried, kept = await views.retry_failure_group(app, "SMTPError: down")
    assert (retried, kept) == (2100, 0)
    (entry,) = entries(dsn)
    assert (entry["action"], entry["target"], entry["details"]["count"]) == ("retry", "jobs", 2100)


# -- key rotation records through the same statement -------------------------------------------------


async def test_the_key_rotation_entry_is_written_in_the_callers_transaction(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        async with app.pool.connection() as conn:
            async with conn.transaction():
                await run_async(conn, app.audit_store.key_rotation("k2", 1234))
                raise_after = False
            assert not raise_after
        async with app.pool.connection() as conn:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await run_async(conn, app.audit_store.key_rotation("k3", 1))
                    raise RuntimeError("the rotation's last batch failed")
    assert [(e["action"], e["target"], e["details"]) for e in entries(dsn)] == [
        ("rotate_keys", "key:k2", {"count": 1234})
    ]


# -- who acts ---------------------------------------------------------------------------------------


def test_acting_as_checks_its_names_and_nests() -> None:
    from jobbus.audit import acting

    with pytest.raises(ValueError, match="actor"), jobbus.acting_as(""):
        pass
    with pytest.raises(ValueError, match="source"), jobbus.acting_as("bob", source="x" * 65):
        pass
    assert acting().actor == "api"
    with jobbus.acting_as("bob", source="admin-panel"):
        with jobbus.acting_as("carol"):
            assert (acting().actor, acting().source) == ("carol", "api")
        assert (acting().actor, acting().source) == ("bob", "admin-panel")
    assert acting().actor == "api"


# -- reading the trail ------------------------------------------------------------------------------


def _fill(dsn: str, count: int) -> datetime:
    """`count` entries, one a second going back from the time returned (the newest `job:1`), written as
    the owner."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "WITH filled AS (INSERT INTO jobbus.audit_log (id, at, actor, source, action, target, details) "
            "SELECT gen_random_uuid(), now() - make_interval(secs => i), 'ops', 'api', 'cancel', 'job:' || i, "
            "jsonb_build_object('n', i) FROM generate_series(1, %s) AS i RETURNING 1) "
            "SELECT now() FROM filled LIMIT 1",
            (count,),
        ).fetchone()
    assert row is not None
    filled_at: datetime = row[0]
    return filled_at


async def test_list_audit_pages_newest_first(dsn: str) -> None:
    filled_at = _fill(dsn, 250)
    async with jobbus.App(dsn=dsn) as app:
        seen, last = [], None
        while page := await app.list_audit(after=last, limit=100):
            seen += page
            last = page[-1]
        assert [e.target for e in seen] == [f"job:{i}" for i in range(1, 251)]
        recent = await app.list_audit(since=filled_at - timedelta(seconds=50, milliseconds=500))
        assert [e.target for e in recent] == [f"job:{i}" for i in range(1, 51)]
        with pytest.raises(ValueError, match="limit"):
            await app.list_audit(limit=0)
        with pytest.raises(ValueError, match="aware"):
            await app.list_audit(since=datetime(2026, 1, 1))


def test_jobbus_audit_lists_100000_entries_newest_first(dsn: str) -> None:
    filled_at = _fill(dsn, 100_000)
    result = run_cli(dsn, "audit", "--limit", "0", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert len(listed) == 100_000
    assert [e["target"] for e in listed[:3]] == ["job:1", "job:2", "job:3"] and listed[-1]["target"] == "job:100000"
    assert all(a["at"] >= b["at"] for a, b in itertools.pairwise(listed))
    assert set(listed[0]) == {"id", "at", "actor", "source", "action", "target", "details"}
    three = run_cli(dsn, "audit", "--limit", "3")
    assert three.returncode == 0 and len(three.stdout.splitlines()) == 3 and "job:1 " in three.stdout
    hour = json.loads(run_cli(dsn, "audit", "--since", "1h", "--limit", "0", "--json").stdout)
    assert 3000 < len(hour) <= 3600 and [e["target"] for e in hour] == [f"job:{i}" for i in range(1, len(hour) + 1)]
    since = (filled_at - timedelta(seconds=10, milliseconds=500)).isoformat()
    assert len(json.loads(run_cli(dsn, "audit", "--since", since, "--json").stdout)) == 10
    bad = run_cli(dsn, "audit", "--since", "yesterday")
    assert bad.returncode == 64 and "--since" in bad.stderr
    naive = run_cli(dsn, "audit", "--since", "2026-01-01T00:00:00")
    assert naive.returncode == 64 and "timezone" in naive.stderr


def test_jobbus_audit_escapes_what_it_prints(sync_app: jobbus.App, dsn: str) -> None:
    job_id = sync_app.sync.schedule("mail.send", {})
    with jobbus.acting_as("eve\x1b[31m"):
        sync_app.sync.cancel(job_id)
    shown = run_cli(dsn, "audit")
    assert shown.returncode == 0 and "\x1b" not in shown.stdout and "eve" in shown.stdout


# -- append-only for every role but the owner --------------------------------------------------------

ALL_ROLES = ("worker", "operator", "observer", "producer", "dashboard")


def _tamper(conninfo: str) -> dict[str, bool]:
    """Which writes of the trail a role is allowed (each tried, then rolled back)."""
    attempts = {
        "insert": "INSERT INTO jobbus.audit_log (id, actor, source, action, target) "
        "VALUES (gen_random_uuid(), 'x', 'api', 'cancel', 'job:x')",
        "update": "UPDATE jobbus.audit_log SET actor = 'someone else'",
        "delete": "DELETE FROM jobbus.audit_log",
        "truncate": "TRUNCATE jobbus.audit_log",
        "record": "SELECT jobbus.record_audit(gen_random_uuid(), 'x', 'api', 'cancel', 'job:x', '{}')",
        "retention": "SELECT jobbus.delete_old_audit(86400, 10)",
        "read": "SELECT count(*) FROM jobbus.audit_log",
    }
    allowed = {}
    with psycopg.connect(conninfo) as conn:
        for name, statement in attempts.items():
            try:
                conn.execute(statement.encode())
            except psycopg.errors.InsufficientPrivilege:
                allowed[name] = False
            else:
                allowed[name] = True
            conn.rollback()
    return allowed


def _expected(kind: str) -> dict[str, bool]:
    acts = kind in ("worker", "operator", "dashboard")
    return {
        "insert": False,
        "update": False,
        "delete": False,
        "truncate": False,
        "record": acts,
        "retention": kind in ("worker", "operator"),
        "read": kind != "producer",
    }


def test_no_role_but_the_owner_can_change_or_delete_an_entry(dsn: str) -> None:
    from tests.roles import granted_roles

    async def act() -> None:
        async with jobbus.App(dsn=dsn) as app:
            await app.cancel(await app.schedule("mail.send", {}))

    asyncio.run(act())
    with granted_roles(dsn, ALL_ROLES) as roles:
        allowed = {kind: _tamper(conninfo) for kind, conninfo in roles.items()}
        for kind in ("worker", "operator", "dashboard"):  # each records its own actions
            app = jobbus.App(dsn=roles[kind])
            with app.sync:
                app.sync.cancel(app.sync.schedule("mail.send", {}) if kind != "dashboard" else _queued_job(dsn))
    assert allowed == {kind: _expected(kind) for kind in ALL_ROLES}
    assert [e["action"] for e in entries(dsn)] == ["cancel"] * 4


def _queued_job(dsn: str) -> uuid.UUID:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        return app.sync.schedule("mail.send", {})


def test_the_retention_function_refuses_to_delete_the_last_day(dsn: str) -> None:
    _fill(dsn, 10)
    with psycopg.connect(dsn) as conn, pytest.raises(psycopg.errors.InvalidParameterValue, match="at least a day"):
        conn.execute("SELECT jobbus.delete_old_audit(0, 100)")
    assert len(entries(dsn)) == 10


def test_roles_granted_before_the_audit_trail_record_and_read_it_after_its_migration(empty_dsn: str) -> None:
    """Grants of an earlier release name no audit function: the migration grants them by each role's
    rights on the job and command tables, and none may change the trail."""
    from jobbus import schema
    from tests.roles import AUDIT_OF_MIGRATION_36, granted_roles, without_lines

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").split("\n-- 0036_")[0].encode())

    def grants_before_the_audit_trail(grants: str) -> str:
        return without_lines(grants, AUDIT_OF_MIGRATION_36)

    with granted_roles(empty_dsn, ALL_ROLES, edit=grants_before_the_audit_trail) as roles:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            assert [m.version for m in schema.migrate(conn, "jobbus")] == [36]
        allowed = {kind: _tamper(conninfo) for kind, conninfo in roles.items()}
    assert allowed == {kind: _expected(kind) for kind in ALL_ROLES}


# -- retention ---------------------------------------------------------------------------------------


async def test_the_leader_deletes_entries_past_retention_audit_seconds(dsn: str) -> None:
    from jobbus.settings import Settings
    from jobbus.store import MaintenanceStore
    from jobbus.worker.services.cleaner import BATCH, Cleaner

    sql(
        dsn,
        "INSERT INTO jobbus.audit_log (id, at, actor, source, action, target) "
        "SELECT gen_random_uuid(), now() - make_interval(days => 100) - make_interval(secs => i), 'ops', 'api', "
        "'cancel', 'job:old' FROM generate_series(1, %s) AS i",
        BATCH + 10,
    )
    _fill(dsn, 5)  # the last seconds

    async with jobbus.App(dsn=dsn) as app:

        async def run(statement: Any) -> Any:
            async with app.pool.connection() as conn:
                return await run_async(conn, statement)

        kept = Cleaner(
            settings=Settings.load({"retention_audit_seconds": None}), maintenance=MaintenanceStore("jobbus"), run=run
        )
        await kept.run_once()
        assert len(entries(dsn)) == BATCH + 15
        cleaner = Cleaner(settings=Settings.load({}), maintenance=MaintenanceStore("jobbus"), run=run)
        await cleaner.run_once()
    assert [e["target"] for e in entries(dsn)] == [f"job:{i}" for i in range(5, 0, -1)]


def test_retention_audit_seconds_is_at_least_a_day() -> None:
    from jobbus.settings import Settings

    assert Settings.load({}).retention_audit_seconds == 7776000
    with pytest.raises(ValueError, match="retention_audit_seconds"):
        Settings.load({"retention_audit_seconds": 3600})
    assert Settings.load({"retention_audit_seconds": None}).retention_audit_seconds is None


# -- the dashboard's Audit page ---------------------------------------------------------------------


async def test_the_audit_page_pages_newest_first_and_escapes_what_it_shows(dsn: str) -> None:
    _fill(dsn, 120)
    app = jobbus.App(dsn=dsn)
    async with app:
        with jobbus.acting_as("<script>alert(1)</script>"):
            await app.cancel(await app.schedule("mail.send", {}))
    asgi = create_app(app)
    try:
        async with client(asgi) as http:
            seen: list[str] = []
            url: str | None = "/audit"
            pages = 0
            while url is not None:
                html = (await http.get(url)).text
                pages += 1
                seen += re.findall(r'<td class="target">(?:<a [^>]*>)?([^<]*)<', html)
                if pages == 1:
                    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
                found = re.search(r'href="([^"]+)" rel="next"', html)
                url = found.group(1).replace("&amp;", "&") if found else None
            assert pages == 3
            assert seen[0].startswith("job:") and seen[1:] == [f"job:{i}" for i in range(1, 121)]
            assert (await http.get("/audit?after=yesterday")).status_code == 400
    finally:
        await asgi.state.dashboard.close()
