"""The search index, optional: trigram indexes (PostgreSQL's pg_trgm) of each finished job's search
document, so that a search of the finished tabs reads the jobs holding the text instead of walking
every finished job. One index per finished status: a search of one tab reads its own jobs' entries
only, so a text common among the failed jobs costs nothing to a search of the completed ones.

It is off by default because every job would pay for it when it finishes: a completion took 26 µs of
the database's time instead of 12 with it (docs/dashboard.md, "Search"). Without it a search is still
complete (it tests each job the tab's walk meets), and fast when matches are frequent. Create it with
`jobbus search-index create` (built CONCURRENTLY: writes go on while it builds), drop it with `drop`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import psycopg
from psycopg import sql

from jobbus.errors import JobbusError
from jobbus.store.views import FINISHED, SEARCH_DOCUMENT

if TYPE_CHECKING:
    from jobbus.app import App

__all__ = ["INDEXES", "SearchIndexUnavailable", "create_search_index", "drop_search_index", "search_index_state"]

#: Each finished status's index, in the jobs' schema: the search index is the three of them.
INDEXES = {status: f"job_search_{status}_idx" for status in FINISHED}
State = Literal["ready", "invalid", "absent", "unavailable"]


class SearchIndexUnavailable(JobbusError):
    """The server cannot hold the search index (no pg_trgm, or no right to create it)."""


async def search_index_state(app: App) -> State:
    """`ready`, `invalid` (a build cut short, or some of the three missing: create it again), `absent`,
    or `unavailable` (the server has no pg_trgm)."""
    async with app.pool.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT (SELECT count(*) FILTER (WHERE i.indisvalid) FROM pg_index AS i"
                "        JOIN pg_class AS c ON c.oid = i.indexrelid"
                "        WHERE c.relnamespace = %s::regnamespace AND c.relname = ANY(%s)),"
                " (SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace AND relname = ANY(%s)),"
                " EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm')",
                (app.settings.schema, list(INDEXES.values())) * 2,
            )
        ).fetchone()
    valid, present, available = row if row else (0, 0, False)
    if present == 0:
        return "absent" if available else "unavailable"
    return "ready" if valid == len(INDEXES) else "invalid"


async def create_search_index(app: App, progress: Callable[[str], None] = lambda _: None) -> None:
    """Create pg_trgm if it is missing, then each status's index that is not ready, CONCURRENTLY (writes
    go on). `progress` hears the build's status and phase every second."""
    state = await search_index_state(app)
    if state == "unavailable":
        raise SearchIndexUnavailable(
            "this server has no pg_trgm extension (PostgreSQL's contrib): searches work without the index, "
            "testing each job they meet"
        )
    if state == "ready":
        return
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except psycopg.errors.InsufficientPrivilege as exc:
            raise SearchIndexUnavailable(
                f"creating the extension pg_trgm was refused ({exc.diag.message_primary}): a role that may (the "
                "database's owner) runs CREATE EXTENSION pg_trgm once, then create the index again"
            ) from None
        extension_schema = await (
            await conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_trgm'")
        ).fetchone()
        assert extension_schema is not None
        document = sql.SQL(SEARCH_DOCUMENT.replace("j.", ""))
        ops = sql.SQL("{}.gin_trgm_ops").format(sql.Identifier(extension_schema[0]))
        for status, index in INDEXES.items():
            await _build(app, conn, status, index, document, ops, progress)


async def _build(
    app: App,
    conn: psycopg.AsyncConnection[object],
    status: str,
    index: str,
    document: sql.Composable,
    ops: sql.Composable,
    progress: Callable[[str], None],
) -> None:
    """One status's index, CONCURRENTLY; an invalid one a build cut short left is dropped first."""
    schema = sql.Identifier(app.settings.schema)
    invalid = await (
        await conn.execute(
            "SELECT 1 FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " WHERE c.relnamespace = %s::regnamespace AND c.relname = %s AND NOT i.indisvalid",
            (app.settings.schema, index),
        )
    ).fetchone()
    if invalid:
        await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(schema, sql.Identifier(index)))
    statement = sql.SQL(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {schema}.job USING gin (({document}) {ops})"
        " WHERE status = {status}"
    ).format(index=sql.Identifier(index), schema=schema, document=document, ops=ops, status=sql.Literal(status))
    watcher = asyncio.create_task(_watch(app, conn.info.backend_pid, lambda line: progress(f"{status} jobs, {line}")))
    try:
        await conn.execute(statement)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def drop_search_index(app: App) -> None:
    """Drop the indexes (CONCURRENTLY); searches go on without them. pg_trgm stays."""
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        for index in INDEXES.values():
            await conn.execute(
                sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(
                    sql.Identifier(app.settings.schema), sql.Identifier(index)
                )
            )


async def _watch(app: App, pid: int, progress: Callable[[str], None]) -> None:
    """Every second, the build's phase and how far it is (pg_stat_progress_create_index)."""
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        while True:
            await asyncio.sleep(1.0)
            row = await (
                await conn.execute(
                    "SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total"
                    " FROM pg_stat_progress_create_index WHERE pid = %s",
                    (pid,),
                )
            ).fetchone()
            if row is None:
                continue
            phase, blocks_done, blocks_total, tuples_done, tuples_total = row
            if blocks_total:
                progress(f"{phase}: {blocks_done:,} of {blocks_total:,} blocks ({100 * blocks_done // blocks_total}%)")
            elif tuples_total:
                progress(f"{phase}: {tuples_done:,} of {tuples_total:,} rows ({100 * tuples_done // tuples_total}%)")
            else:
                progress(str(phase))
