"""`jobbus search-index create|drop|status`: the optional index that makes searches of finished jobs fast."""

from __future__ import annotations

import sys

import click

from jobbus import search
from jobbus.cli import exit_codes
from jobbus.cli.errors import fail, run
from jobbus.cli.options import dsn_option
from jobbus.cli.output import admin_app, console, shown

STATES = {
    "ready": "the search index is ready: searches of finished jobs read it",
    "invalid": "the search index is invalid (a build was cut short): `jobbus search-index create` builds it again",
    "absent": "no search index: searches test each job they meet (`jobbus search-index create` to build one)",
    "unavailable": "this server has no pg_trgm: searches test each job they meet, and no index can be built",
}


@click.group("search-index")
def search_index_group() -> None:
    """The optional search index of finished jobs (PostgreSQL's pg_trgm), for fast searches of big tables.

    Without it, a search (`jobs list --search`, the dashboard's search field) is complete but tests each
    job it meets, which on millions of finished jobs takes long for a rare text. With it, a finished job
    costs the database about twice as much to record (docs/dashboard.md, "Search").

    \b
    Examples:
      jobbus search-index status
      jobbus search-index create
      jobbus search-index drop
    """


@search_index_group.command("status")
@dsn_option
def status_command(dsn: str | None) -> None:
    """Say whether the search index is ready. Exit codes: 0 ready, 1 not, 69 database unreachable."""

    async def body() -> int:
        async with admin_app(dsn) as app:
            state = await search.search_index_state(app)
        console().print(shown(STATES[state]))
        return exit_codes.OK if state == "ready" else exit_codes.FAILURE

    sys.exit(run(body))


@search_index_group.command("create")
@dsn_option
def create_command(dsn: str | None) -> None:
    """Build the search index, CONCURRENTLY (jobs are written meanwhile), showing how far it is.

    Exit codes: 0 built (or there already), 1 the server cannot hold it, 69 database unreachable.
    """

    async def body() -> int:
        con = console(stderr=True)
        async with admin_app(dsn) as app:
            with con.status("building the search index…") as status:
                try:
                    await search.create_search_index(
                        app, lambda line: status.update(shown(f"building the search index: {line}"))
                    )
                except search.SearchIndexUnavailable as exc:
                    return fail(str(exc), exit_codes.FAILURE)
        console().print("the search index is ready")
        return exit_codes.OK

    sys.exit(run(body))


@search_index_group.command("drop")
@dsn_option
def drop_command(dsn: str | None) -> None:
    """Drop the search index; searches go on without it. Exit codes: 0 ok, 69 database unreachable."""

    async def body() -> int:
        async with admin_app(dsn) as app:
            await search.drop_search_index(app)
        console().print("no search index: searches test each job they meet")
        return exit_codes.OK

    sys.exit(run(body))
