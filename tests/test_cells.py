"""Cells (SPEC 23): one App over several databases. Settings, placement, ids that name their cell, the by-id
verbs that find a job wherever it lives, and what stays in a parent's cell (follow-ups, children, groups)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jobbus
from jobbus.cells import TAG_MASK, Placement, cell_tag, tag_of, tagged
from jobbus.errors import DatabaseUnavailableError, InvalidStateError
from jobbus.requests import new_job_id
from jobbus.settings import Settings
from tests.conftest import FAST
from tests.dbserver import fresh_database

#: Two cell names whose tags are the same (the first two bytes of SHA-256 of each are 80 0f).
COLLIDING = ("c93", "c437")
#: A DSN nothing listens at: a cell that is down.
DOWN = "postgresql://postgres@127.0.0.1:1/jobbus_down?connect_timeout=1"


@pytest.fixture
def databases(admin_dsn: str, template_db: str) -> Iterator[list[str]]:
    """Three fresh, migrated databases of the test server, dropped afterwards."""
    with ExitStack() as stack:
        yield [stack.enter_context(fresh_database(admin_dsn, template_db)) for _ in range(3)]


@asynccontextmanager
async def opened(cells: dict[str, str], **settings: Any) -> AsyncIterator[jobbus.App]:
    app = jobbus.App(cells=cells, **{**FAST, **settings})
    try:
        async with app:
            yield app
    finally:
        app.sync.close()


def ids_in(dsn: str) -> set[uuid.UUID]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM jobbus.job")}


def sql_schedule(dsn: str, job_type: str) -> uuid.UUID:
    """A job inserted by the SQL API: its id carries no cell's tag."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT jobbus.schedule(%s)", (job_type,)).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


# -- settings --------------------------------------------------------------------------------------


def test_cells_and_dsn_together_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="dsn and cells are both given"):
        jobbus.App(dsn="postgresql://localhost/x", cells={"a": "postgresql://localhost/a"})
    with pytest.raises(ValueError, match="dsn and cells are both given"):
        Settings.load({}, {"JOBBUS_DSN": "postgresql:///x", "JOBBUS_CELLS": "a=postgresql:///a"})


def test_a_keyword_wins_over_the_other_forms_variable() -> None:
    settings = Settings.load({"cells": {"a": "postgresql:///a"}}, {"JOBBUS_DSN": "postgresql:///x"})
    assert settings.dsn is None and settings.cells == {"a": "postgresql:///a"}
    environ = {"JOBBUS_CELLS": "a=postgresql:///a", "JOBBUS_QUEUE_CELLS": "q=a"}
    settings = Settings.load({"dsn": "postgresql:///x"}, environ)
    assert settings.dsn == "postgresql:///x" and settings.cells is None and settings.queue_cells is None


@pytest.mark.parametrize("name", ["", "A", "a b", "a;b", "x" * 64, "é"])
def test_a_cell_name_outside_the_alphabet_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="cell name"):
        jobbus.App(cells={name: "postgresql://localhost/a"})


def test_queue_cells_naming_an_unknown_cell_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"queue_cells: queue 'reports' is placed in cell 'c'.*\(a, b\)"):
        jobbus.App(cells={"a": "postgresql:///a", "b": "postgresql:///b"}, queue_cells={"reports": "c"})
    with pytest.raises(ValueError, match=r"queue_cells .* needs cells"):
        jobbus.App(dsn="postgresql:///a", queue_cells={"reports": "a"})


def test_the_environment_gives_cells_and_queue_cells_in_order() -> None:
    environ = {
        "JOBBUS_CELLS": "eu=postgresql://u:secret@eu/app; us=host=us dbname=app;",
        "JOBBUS_QUEUE_CELLS": "reports=us;mail=eu",
    }
    settings = Settings.load({}, environ)
    assert settings.cells == {"eu": "postgresql://u:secret@eu/app", "us": "host=us dbname=app"}
    assert list(settings.cells) == ["eu", "us"]
    assert settings.queue_cells == {"reports": "us", "mail": "eu"}
    assert "secret" not in repr(settings)
    with pytest.raises(ValueError, match="'eu' is given twice"):
        Settings.load({}, {"JOBBUS_CELLS": "eu=postgresql:///a;eu=postgresql:///b"})
    with pytest.raises(ValueError, match="not a name=dsn pair"):
        Settings.load({}, {"JOBBUS_CELLS": "postgresql:///a"})


def test_an_app_without_cells_has_an_empty_mapping_and_refuses_cell() -> None:
    app = jobbus.App(dsn="postgresql:///nowhere")
    assert dict(app.cells) == {}
    with pytest.raises(ValueError, match="this App has no cells"):
        app.build_job_spec(jobbus.JobRequest("t", cell="a"))


def test_reconfigure_builds_the_cells_and_keeps_the_handlers() -> None:
    app = jobbus.App(dsn="postgresql:///one")

    @app.job("t")
    def handle(job: jobbus.SyncJobExecution) -> None: ...

    previous = app.reconfigure(dsn=None, cells={"a": "postgresql:///a", "b": "postgresql:///b"})
    assert list(app.cells) == ["a", "b"]
    assert "t" in app.cells["b"].handlers
    app.reconfigure(**previous.as_dict())
    assert dict(app.cells) == {}


# -- ids -------------------------------------------------------------------------------------------


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=63))
def test_a_tagged_id_is_a_valid_uuid7_carrying_the_tag(name: str) -> None:
    job_id = tagged(new_job_id(), cell_tag(name))
    assert job_id.version == 7
    assert job_id.variant == uuid.RFC_4122
    assert tag_of(job_id) == cell_tag(name)


def test_tagging_keeps_the_order_ids_were_made_in() -> None:
    ids = [new_job_id() for _ in range(2000)]
    tags = [random.Random(i).randrange(TAG_MASK + 1) for i in range(2000)]
    assert [tagged(i, t) for i, t in zip(ids, tags, strict=True)] == sorted(
        tagged(i, t) for i, t in zip(ids, tags, strict=True)
    )
    assert cell_tag(COLLIDING[0]) == cell_tag(COLLIDING[1])


@given(
    st.lists(st.sampled_from(["a", "b", "c", "d-1", "e_2", *COLLIDING]), min_size=1, max_size=5, unique=True),
    st.dictionaries(st.sampled_from(["q1", "q2", "q3"]), st.integers(0, 4)),
    st.sampled_from(["q1", "q2", "q3", "other", None]),
    st.integers(0, 5),
)
def test_placement_follows_cell_then_queue_cells_then_the_first(
    names: list[str], queue_at: dict[str, int], queue: str | None, pick: int
) -> None:
    queue_cells = {q: names[i % len(names)] for q, i in queue_at.items()}
    placement = Placement.of(dict.fromkeys(names, "postgresql:///x"), queue_cells)
    cell = names[pick] if pick < len(names) else None
    expected = cell or queue_cells.get(queue or "", names[0])
    assert placement.cell_for(cell, queue) == expected
    job_id = tagged(new_job_id(), cell_tag(expected))
    order = placement.search_order(job_id)
    assert sorted(order) == sorted(names) and order[0] == min(
        (n for n in names if cell_tag(n) == cell_tag(expected)), key=names.index
    )


def test_the_search_order_asks_the_tagged_cells_first() -> None:
    placement = Placement.of({"a": "x", COLLIDING[0]: "y", "b": "z", COLLIDING[1]: "w"}, None)
    job_id = tagged(new_job_id(), cell_tag(COLLIDING[1]))
    assert placement.search_order(job_id) == [COLLIDING[0], COLLIDING[1], "a", "b"]
    assert placement.cell_of_tag(job_id) is None  # two cells carry the tag


# -- placement and the by-id verbs, on real databases -------------------------------------------------


async def test_list_jobs_pages_through_24000_jobs_of_three_cells_each_once_in_order(databases: list[str]) -> None:
    """Three cells whose jobs interleave in creation order (ids made as the cells' producers would make
    them, at the same moments), 24,000 in all, paged 1,000 at a time both ways: a merge that dropped or
    repeated a job at a page's edge, or ordered one cell's page before another's, shows here."""
    rng = random.Random(11)
    names = ("a", "b", "c")
    placed: dict[uuid.UUID, str] = {}
    for _ in range(24_000):
        name = rng.choice(names)
        placed[tagged(new_job_id(), cell_tag(name))] = name
    for name, dsn in zip(names, databases, strict=True):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO jobbus.job (id, type, max_attempts) SELECT i, 'listed', 3 FROM unnest(%s::uuid[]) AS i",
                [[job_id for job_id, cell in placed.items() if cell == name]],
            )
    async with opened(dict(zip(names, databases, strict=True))) as app:
        for newest_first in (False, True):
            seen: list[uuid.UUID] = []
            after: uuid.UUID | None = None
            while page := await app.list_jobs(after=after, limit=1_000, newest_first=newest_first):
                assert len(page) == 1_000 or len(seen) + len(page) == len(placed)
                seen += [job.id for job in page]
                after = page[-1].id
            assert seen == sorted(placed, reverse=newest_first)
    assert len(placed) == 24_000 and {tag_of(job_id) for job_id in placed} == {cell_tag(n) for n in names}


async def test_jobs_go_to_their_cell_and_are_found_from_the_app(databases: list[str]) -> None:
    a, b, c = databases
    async with opened({"a": a, "b": b, "c": c}, queue_cells={"reports": "b", "mail": "c"}) as app:
        default = await app.schedule("t")
        report = await app.schedule("t", queue="reports")
        forced = await app.schedule("t", queue="reports", cell="c")
        many = await app.schedule_many("t", [{"n": 1}, {"n": 2}], queue="mail")
        assert ids_in(a) == {default}
        assert ids_in(b) == {report}
        assert ids_in(c) == {forced, *many}
        assert tag_of(report) == cell_tag("b") and tag_of(forced) == cell_tag("c")
        for job_id, queue in [(default, "default"), (report, "reports"), (forced, "reports"), (many[1], "mail")]:
            found = await app.find(job_id)
            assert found is not None and found.queue == queue
        listed = await app.list_jobs()
        assert [job.id for job in listed] == sorted([default, report, forced, *many])
        first_page = await app.list_jobs(limit=2, newest_first=True)
        second_page = await app.list_jobs(limit=2, newest_first=True, after=first_page[-1].id)
        assert [job.id for job in first_page + second_page] == sorted([default, report, forced, *many])[::-1][:4]
        assert await app.cancel(report) is jobbus.JobStatus.CANCELLED
        assert (await app.wait(report, timeout=5)).status is jobbus.JobStatus.CANCELLED
        await app.update(forced, priority=7)
        assert (await app.cells["c"].find(forced)).priority == 7  # type: ignore[union-attr]
        later = await app.schedule("t", queue="reports", available_at=timedelta(hours=1))
        await app.run_now(later)
        assert ids_in(b) == {report, later}
        await app.delete(default)
        assert ids_in(a) == set()
        assert await app.prune(timedelta(0)) == 1  # the cancelled report, in cell b
        assert report not in ids_in(b)
        with pytest.raises(InvalidStateError, match="does not exist"):
            await app.cancel(uuid.uuid4())
        assert await app.find(uuid.uuid4()) is None


async def test_an_unknown_cell_raises_and_writes_nothing_anywhere(databases: list[str]) -> None:
    a, b, _ = databases
    async with opened({"a": a, "b": b}) as app:
        with pytest.raises(ValueError, match=r"cell 'z' is not one of this App's cells \(a, b\)"):
            await app.schedule("t", cell="z")
        with pytest.raises(ValueError, match="cell 'z'"):
            await app.schedule_many([jobbus.JobRequest("t"), jobbus.JobRequest("t", cell="z")])
        with pytest.raises(ValueError, match="cell 'z'"):
            app.sync.schedule("t", cell="z")
        assert ids_in(a) == ids_in(b) == set()


async def test_schedule_many_over_several_cells_is_refused_and_writes_nothing(databases: list[str]) -> None:
    a, b, _ = databases
    async with opened({"a": a, "b": b}, queue_cells={"reports": "b"}) as app:
        with pytest.raises(ValueError, match=r"cells 'a', 'b'.*once per cell"):
            await app.schedule_many([jobbus.JobRequest("t"), jobbus.JobRequest("t", queue="reports")])
        with pytest.raises(ValueError, match=r"schedule_group: .*cells 'b', 'a'"):
            await app.schedule_group([jobbus.JobRequest("t", cell="b"), jobbus.JobRequest("t")])
        assert ids_in(a) == ids_in(b) == set()
        together = await app.schedule_many([jobbus.JobRequest("t"), jobbus.JobRequest("t", queue="reports")], cell="b")
        assert ids_in(b) == set(together) and ids_in(a) == set()


def test_the_blocking_twin_places_and_finds_as_the_app_does(databases: list[str]) -> None:
    a, b, _ = databases
    app = jobbus.App(cells={"a": a, "b": b}, **FAST)
    with app.sync:
        job_id = app.sync.schedule("t", cell="b")
        assert ids_in(b) == {job_id}
        found = app.sync.find(job_id)
        assert found is not None and found.id == job_id
        assert app.sync.cancel(job_id) is jobbus.JobStatus.CANCELLED
        with pytest.raises(jobbus.JobbusError, match="has no database of its own"):
            app.sync.list_queues()


async def test_jobs_the_sql_api_made_and_colliding_tags_are_still_found(databases: list[str]) -> None:
    a, b, c = databases
    cells = {"a": a, COLLIDING[0]: b, COLLIDING[1]: c}
    async with opened(cells) as app:
        in_c = await app.schedule("t", cell=COLLIDING[1])
        assert tag_of(in_c) == cell_tag(COLLIDING[0])  # the id names both colliding cells
        found = await app.find(in_c)
        assert found is not None and found.id == in_c
        assert await app.cancel(in_c) is jobbus.JobStatus.CANCELLED
        by_sql = sql_schedule(c, "sql.made")
        found = await app.find(by_sql)
        assert found is not None and found.type == "sql.made"
        await app.run_now(by_sql)
        await app.delete(by_sql)
        assert ids_in(c) == {in_c}
        # Specs built by the App and inserted later go to the cell their tag names; of two cells that
        # share it, to the queue's cell if it is one of them, else to the first of them.
        spec = app.build_job_spec(jobbus.JobRequest("t", cell="a"))
        (inserted,) = await app.insert_specs([spec])
        assert inserted in ids_in(a)
        spec = app.build_job_spec(jobbus.JobRequest("t", cell=COLLIDING[1]))
        (inserted,) = await app.insert_specs([spec])
        assert inserted in ids_in(b)  # documented: the first of the two cells that share the tag
        assert (await app.find(inserted)) is not None


async def test_a_cell_that_is_down_stops_only_its_own_work(databases: list[str]) -> None:
    a = databases[0]
    async with opened({"a": a, "down": DOWN}, queue_cells={"far": "down"}, database_wait_seconds=0.5) as app:
        job_id = await app.schedule("t")
        assert ids_in(a) == {job_id}
        found = await app.find(job_id)
        assert found is not None and found.status is jobbus.JobStatus.QUEUED
        await app.update(job_id, priority=3)
        assert await app.cancel(job_id) is jobbus.JobStatus.CANCELLED
        with pytest.raises(DatabaseUnavailableError):
            await app.schedule("t", queue="far")
        with pytest.raises(DatabaseUnavailableError, match="cell 'down' did not"):
            await app.find(uuid.uuid4())  # not in the cell that answered: the other one may have it
        assert app.sync.schedule("t") in ids_in(a)
        assert app.cells["down"].pool is not None  # opened with the App, connecting in the background
        with pytest.raises(RuntimeError, match="needs a closed App"):
            app.reconfigure(database_wait_seconds=1)
    with pytest.raises(RuntimeError, match="not open"):
        app.cells["a"].pool  # noqa: B018 - closed with the App


async def test_follow_ups_children_and_groups_stay_in_their_parents_cell(databases: list[str]) -> None:
    a, b, _ = databases
    app = jobbus.App(cells={"a": a, "b": b}, queue_cells={"next": "a"}, **FAST)
    children: list[uuid.UUID] = []
    async with app:
        assert "parent" not in app.cells["b"].handlers

        # Registered after the cells' Apps exist: they run it too.
        @app.job("parent")
        async def parent(job: jobbus.JobExecution) -> None:
            children.append(await job.spawn("child", {}, queue="next"))

        @app.job("child")
        async def child(job: jobbus.JobExecution) -> None: ...

        @app.job("next")
        async def follow(job: jobbus.JobExecution) -> None: ...

        with pytest.raises(ValueError, match="stays in its parent's cell"):
            await app.schedule("parent", cell="b", then=jobbus.JobRequest("next", cell="a"))
        first = await app.schedule("parent", cell="b", then=jobbus.JobRequest("next", queue="next"))
        group, members = await app.schedule_group(
            [jobbus.JobRequest("child", cell="b"), jobbus.JobRequest("child", cell="b")],
            then=jobbus.JobRequest("next", queue="next"),
        )
        assert tag_of(group) == cell_tag("b")
        assert ids_in(a) == set()
        outcomes = await app.drain()
        assert outcomes == {"completed": 6}  # parent, child, its follow-up; two members, the callback
        in_b = ids_in(b)
        assert {first, *children, *members} <= in_b and len(in_b) == 6 and ids_in(a) == set()
        assert all(tag_of(job_id) == cell_tag("b") for job_id in in_b)
        progress = await app.group_progress(group)
        assert progress.completed == 2 and progress.total == 2


async def test_the_job_scope_tasks_and_listeners_reach_every_cell(databases: list[str]) -> None:
    a, b, _ = databases
    app = jobbus.App(cells={"a": a, "b": b}, **FAST)

    @asynccontextmanager
    async def scope(job: Any) -> AsyncIterator[str]:
        yield "scoped"

    app.job_scope = scope
    assert app.cells["b"].job_scope is scope

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    scheduled: list[uuid.UUID] = []

    @app.on(jobbus.JobScheduled)
    def seen(event: jobbus.JobScheduled) -> None:
        scheduled.append(event.job_id)

    async with app:
        job_id = await add.options(cell="b").defer(1, 2)
        assert ids_in(b) == {job_id}
        assert scheduled == [job_id]  # the parent's listeners hear what its cells do
        assert await app.drain() == {"completed": 1}
        done = await app.wait(job_id, timeout=10)
        assert done.result == 3


async def test_connection_must_be_of_the_jobs_cell(databases: list[str]) -> None:
    a, b, _ = databases
    async with opened({"a": a, "b": b}) as app:
        async with await psycopg.AsyncConnection.connect(b) as conn:
            with pytest.raises(ValueError, match=r"connection= is to database .* cell 'a'"):
                await app.schedule("t", connection=conn)
            async with conn.transaction():
                job_id = await app.schedule("t", cell="b", connection=conn)
        assert ids_in(b) == {job_id} and ids_in(a) == set()


async def test_randomized_placement_puts_each_job_where_its_rules_say(databases: list[str]) -> None:
    """Random cells, queue_cells and cell= arguments: each job in exactly the database the rules name,
    and found by id from the App."""
    rng = random.Random(2339)
    for round_ in range(4):
        names = rng.sample(["a", "b", "c", "x-1", "y_2", *COLLIDING], k=rng.randint(1, 3))
        cells = dict(zip(names, databases, strict=False))
        queues = ["q1", "q2", "q3", "default"]
        queue_cells = {q: rng.choice(names) for q in queues if rng.random() < 0.5}
        expected: dict[uuid.UUID, str] = {}
        async with opened(cells, queue_cells=queue_cells) as app:
            for _ in range(12):
                queue = rng.choice([*queues, None])
                cell = rng.choice([*names, None, None])
                job_id = await app.schedule("t", queue=queue, cell=cell)
                expected[job_id] = cell or queue_cells.get(queue or "default", names[0])
            for job_id, cell in expected.items():
                assert job_id in ids_in(cells[cell]), f"round {round_}: {job_id} not in {cell}"
                found = await app.find(job_id)
                assert found is not None and found.id == job_id
                await app.delete(job_id)
        for dsn in databases:
            assert ids_in(dsn) == set()


async def test_a_failed_job_is_retried_in_its_cell(databases: list[str]) -> None:
    a, b, _ = databases
    app = jobbus.App(cells={"a": a, "b": b}, **FAST)

    @app.job("fails", max_attempts=1)
    async def fails(job: jobbus.JobExecution) -> None:
        raise jobbus.NonRetryableError("no")

    async with app:
        job_id = await app.schedule("fails", cell="b")
        assert await app.drain() == {"failed": 1}
        await app.retry(job_id)
        found = await app.cells["b"].find(job_id)
        assert found is not None and found.status is jobbus.JobStatus.QUEUED and found.attempts == 0
        with pytest.raises(InvalidStateError, match="only failed jobs"):
            await app.retry(job_id)


async def test_encrypted_jobs_are_sealed_under_their_tagged_ids(databases: list[str]) -> None:
    """The tag is written before the configuration is sealed (a sealed payload is bound to its job's id)."""
    pytest.importorskip("cryptography")
    from jobbus.encryption import generate_key

    a, b, _ = databases
    async with opened({"a": a, "b": b}, encryption_keys=[generate_key()]) as app:
        one = await app.schedule("t", {"secret": 1}, cell="b")
        many = await app.schedule_many("t", [{"secret": n} for n in range(3)], cell="b")
        for job_id, expected in [(one, {"secret": 1}), *((i, {"secret": n}) for n, i in enumerate(many))]:
            found = await app.find(job_id)
            assert found is not None and found.configuration_data == expected
        with psycopg.connect(b, autocommit=True) as conn:
            stored = conn.execute("SELECT configuration_data::text FROM jobbus.job").fetchall()
        assert stored and all("secret" not in row[0] for row in stored)


@dataclass
class OrderPlaced:
    order_id: int


async def test_the_bus_places_its_jobs_by_queue(databases: list[str]) -> None:
    a, b, _ = databases
    app = jobbus.App(cells={"a": a, "b": b}, queue_cells={"orders": "b"}, **FAST)
    bus = jobbus.MessageBus(app)
    bus.message("order.placed")(OrderPlaced)

    @bus.handler(OrderPlaced, queued=True, queue="orders", name="order.record")
    async def record(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    async with app:
        result = await bus.dispatch(OrderPlaced(7))
        assert len(result.job_ids) == 1 and set(result.job_ids) == ids_in(b) and ids_in(a) == set()
        assert tag_of(result.job_ids[0]) == cell_tag("b")
        assert await app.drain() == {"completed": 1}


# -- the routing function (a database per tenant) -------------------------------------------------


async def test_a_cell_router_places_each_tenants_jobs_in_its_cell_and_its_children_follow(
    databases: list[str],
) -> None:
    a, b, c = databases
    cells = {"acme": a, "globex": b, "shared": c}

    def by_tenant(job_type: str, configuration: Mapping[str, Any]) -> str | None:
        tenant = configuration.get("tenant")
        return None if tenant is None else str(tenant)

    app = jobbus.App(cells=cells, queue_cells={"ops": "shared"}, cell_router=by_tenant, **FAST)
    children: list[uuid.UUID] = []

    @app.job("invoice")
    async def invoice(job: jobbus.JobExecution) -> None:
        children.append(await job.spawn("receipt", {"for": str(job.id)}))  # no tenant: stays with its parent

    @app.job("receipt")
    async def receipt(job: jobbus.JobExecution) -> None: ...

    async with app:
        acme = [await app.schedule("invoice", {"tenant": "acme", "n": n}) for n in range(3)]
        globex = await app.schedule_many("invoice", [{"tenant": "globex", "n": n} for n in range(4)])
        synced = await asyncio.to_thread(app.sync.schedule, "invoice", {"tenant": "globex"})
        unrouted = await app.schedule("invoice", {"n": 9}, queue="ops")  # None: queue_cells decides
        overridden = await app.schedule("invoice", {"tenant": "acme"}, cell="shared")  # cell= wins
        assert await app.drain() == {"completed": 20}
    app.sync.close()
    assert ids_in(a) >= set(acme) and len(ids_in(a)) == 6
    assert ids_in(b) >= {*globex, synced} and len(ids_in(b)) == 10
    assert ids_in(c) >= {unrouted, overridden} and len(ids_in(c)) == 4
    assert all(tag_of(job_id) == cell_tag("acme") for job_id in ids_in(a))


async def test_a_router_answer_that_is_no_cell_or_a_router_that_raises_writes_nothing(databases: list[str]) -> None:
    a, b, _ = databases

    def route(job_type: str, configuration: Mapping[str, Any]) -> str | None:
        if configuration.get("boom"):
            raise LookupError("no such tenant")
        return str(configuration.get("tenant")) if "tenant" in configuration else None

    async with opened({"a": a, "b": b}, cell_router=route) as app:
        with pytest.raises(ValueError, match=r"cell_router placed a job of type 'invoice' in 'initech'.*\(a, b\)"):
            await app.schedule("invoice", {"tenant": "initech"})
        with pytest.raises(LookupError, match="no such tenant"):
            await app.schedule("invoice", {"boom": True})
        with pytest.raises(ValueError, match="would go to cells 'a', 'b'"):
            await app.schedule_many("invoice", [{"tenant": "a"}, {"tenant": "b"}])
        with pytest.raises(ValueError, match="would go to cells 'a', 'b'"):
            await app.schedule_many([jobbus.JobRequest("invoice", {"tenant": "a"}), ("invoice", {"tenant": "b"})])
    assert ids_in(a) == set() and ids_in(b) == set()


def test_a_cell_router_needs_cells_and_a_callable(dsn: str, databases: list[str]) -> None:
    with pytest.raises(ValueError, match="it needs cells"):
        jobbus.App(dsn=dsn, cell_router=lambda job_type, configuration: None)
    with pytest.raises(ValueError, match="must be a callable"):
        jobbus.App(cells={"a": databases[0]}, cell_router="tenant")  # type: ignore[arg-type]
