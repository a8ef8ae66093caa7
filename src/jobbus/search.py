"""The search index, optional: a trigram index (PostgreSQL's pg_trgm) of each finished job's search
document, so that a search of the finished tabs reads the jobs holding the text instead of walking
every finished job.

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
from jobbus.store.views import SEARCH_DOCUMENT

if TYPE_CHECKING:
    from jobbus.app import App

__all__ = ["INDEX", "SearchIndexUnavailable", "create_search_index", "drop_search_index", "search_index_state"]

#: The index's name, in the jobs' schema.
INDEX = "job_search_idx"
State = Literal["ready", "invalid", "absent", "unavailable"]


class SearchIndexUnavailable(JobbusError):
    """The server cannot hold the search index (no pg_trgm, or no right to create it)."""


async def search_index_state(app: App) -> State:
    """`ready`, `invalid` (a build cut short: drop it and create it again), `absent`, or `unavailable`
    (the server has no pg_trgm)."""
    async with app.pool.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT (SELECT bool_and(i.indisvalid) FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
                "        WHERE c.relnamespace = %s::regnamespace AND c.relname = %s),"
                " EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm')",
                (app.settings.schema, INDEX),
            )
        ).fetchone()
    valid, available = row if row else (None, False)
    if valid is None:
        return "absent" if available else "unavailable"
    return "ready" if valid else "invalid"


async def create_search_index(app: App, progress: Callable[[str], None] = lambda _: None) -> None:
    """Create pg_trgm if it is missing, then the index, CONCURRENTLY (writes go on); an invalid index a
    build cut short left is dropped first. `progress` hears the build's phase every second."""
    state = await search_index_state(app)
    if state == "unavailable":
        raise SearchIndexUnavailable(
            "this server has no pg_trgm extension (PostgreSQL's contrib): searches work without the index, "
            "testing each job they meet"
        )
    if state == "ready":
        return
    schema = sql.Identifier(app.settings.schema)
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
        if state == "invalid":
            await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(schema, sql.Identifier(INDEX)))
        document = SEARCH_DOCUMENT.replace("j.", "")
        statement = sql.SQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {schema}.job USING gin (({document}) {ops})"
            " WHERE finished_at IS NOT NULL"
        ).format(
            index=sql.Identifier(INDEX),
            schema=schema,
            document=sql.SQL(document),
            ops=sql.SQL("{}.gin_trgm_ops").format(sql.Identifier(extension_schema[0])),
        )
        pid = conn.info.backend_pid
        watcher = asyncio.create_task(_watch(app, pid, progress))
        try:
            await conn.execute(statement)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def drop_search_index(app: App) -> None:
    """Drop the index (CONCURRENTLY); searches go on without it. pg_trgm stays."""
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(
                sql.Identifier(app.settings.schema), sql.Identifier(INDEX)
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
