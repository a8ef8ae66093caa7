"""`jobbus schema` and `jobbus migrate`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import click
import psycopg

from jobbus import schema as schema_module
from jobbus.cli import exit_codes
from jobbus.cli.cells import cell_option
from jobbus.cli.errors import BadDsn, DatabaseUnavailable, fail, probe_database, run
from jobbus.cli.loading import settings_from_env
from jobbus.settings import Settings, validate_schema_name


def _env_settings(dsn: str | None) -> Settings:
    """Settings from --dsn and JOBBUS_*; an invalid one is a configuration error (exit 78)."""
    try:
        return settings_from_env(dsn)
    except ValueError as exc:
        sys.exit(fail(str(exc), exit_codes.CONFIG))


def _schema_name(option: str | None, default: Callable[[], str]) -> str:
    """--schema when given (a bad or reserved name is bad usage, exit 64), else `default()`."""
    if option is None:
        return default()
    try:
        return validate_schema_name(option)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--schema") from None


@click.command("schema")
@click.option(
    "--schema", "schema_name", default=None, metavar="NAME", help="Schema name (default: JOBBUS_SCHEMA or jobbus)."
)
def schema_command(schema_name: str | None) -> None:
    """Print the full DDL as one script, for your own migration tool.

    The script also records the migrations it contains, so workers accept a database created from it
    and a later `jobbus migrate` has nothing to do.

    \b
    Example:
      jobbus schema --schema jobs > migrations/0042_jobbus.sql
    """
    name = _schema_name(schema_name, lambda: _env_settings(None).schema)
    sys.stdout.write(schema_module.script(name))


@click.command("migrate")
@click.option("--dsn", metavar="DSN", help="PostgreSQL DSN (default: JOBBUS_DSN).")
@click.option(
    "--schema", "schema_name", default=None, metavar="NAME", help="Schema name (default: JOBBUS_SCHEMA or jobbus)."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print each pending migration's table locks (mode, rewrite), change nothing; with --sql, its SQL.",
)
@click.option("--sql", "as_sql", is_flag=True, help="With --dry-run: print the SQL, a script that applies as is.")
@cell_option
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0.01, max=60),
    default=schema_module.DEFAULT_LOCK_TIMEOUT,
    show_default=True,
    metavar="S",
    help="Seconds to wait for one lock before letting go and trying again (what traffic waits at most).",
)
@click.option(
    "--lock-wait",
    type=click.FloatRange(min=0.01, max=86400),
    default=schema_module.DEFAULT_LOCK_WAIT,
    show_default=True,
    metavar="S",
    help="Seconds to keep trying for one migration's locks before exiting 73.",
)
def migrate_command(
    dsn: str | None,
    schema_name: str | None,
    dry_run: bool,
    as_sql: bool,
    cells: tuple[str, ...],
    lock_timeout: float,
    lock_wait: float,
) -> None:
    """Apply pending schema migrations (idempotent; safe to run from several hosts at once, and while
    workers and producers run).

    Each migration commits on its own and takes its table locks first, each waited for at most
    --lock-timeout seconds (so `schedule` and a claim queued behind it wait no longer); when a lock is
    not granted the migration is rolled back and tried again with backoff for up to --lock-wait
    seconds. A role's statement_timeout does not apply to this session. A schema at a newer version
    than this jobbus is left alone: the command exits 78 and says to upgrade jobbus.

    \b
    Example:
      JOBBUS_DSN=postgresql://app@db/app jobbus migrate
      jobbus migrate --dry-run                  # the locks each pending migration takes
      jobbus migrate --dry-run --sql > pending.sql && psql -1 -f pending.sql

    With cells (JOBBUS_CELLS) it migrates every cell in turn, or those given with --cell; a cell that
    cannot be reached is named and the others are migrated.

    Exit codes: 0 migrated (or nothing to do), 64 bad usage, 69 database (or a cell's) unreachable, 73 a migration's
    locks were held by another session for all of --lock-wait (nothing of that migration was applied;
    run again), 78 the schema is newer than this jobbus or a setting is invalid.
    """
    if as_sql and not dry_run:
        raise click.UsageError("--sql goes with --dry-run")
    if lock_timeout > lock_wait:
        raise click.UsageError(f"--lock-timeout ({lock_timeout:g}) must not exceed --lock-wait ({lock_wait:g})")
    settings = _env_settings(dsn)
    name = _schema_name(schema_name, lambda: settings.schema)
    databases = _databases(settings, cells)

    async def migrate(target_dsn: str) -> int:
        await probe_database(target_dsn)
        if dry_run:
            return await asyncio.to_thread(_dry_run, target_dsn, name, as_sql)
        return await asyncio.to_thread(_migrate, target_dsn, name, lock_timeout, lock_wait)

    async def body() -> int:
        if list(databases) == [None]:
            return await migrate(databases[None])
        codes = []
        for cell, target_dsn in databases.items():
            click.echo(f"{'-- ' if as_sql else ''}cell {cell}:")
            try:
                codes.append(await migrate(target_dsn))
            except (DatabaseUnavailable, BadDsn) as exc:
                code = exit_codes.UNAVAILABLE if isinstance(exc, DatabaseUnavailable) else exit_codes.CONFIG
                codes.append(fail(f"cell {cell}: {exc}", code))
        return exit_codes.UNAVAILABLE if exit_codes.UNAVAILABLE in codes else max(codes, default=exit_codes.OK)

    sys.exit(run(body))


def _databases(settings: Settings, cells: tuple[str, ...]) -> dict[str | None, str]:
    """The databases a command migrates: {None: dsn} for one database, else {cell: dsn} of the cells
    named by --cell (every cell when none is)."""
    if not settings.cells:
        if cells:
            raise click.UsageError("--cell: no cells are configured (JOBBUS_CELLS, or --dsn names one database)")
        if not settings.dsn:
            raise click.UsageError("no database: pass --dsn or set JOBBUS_DSN (or JOBBUS_CELLS)")
        return {None: settings.dsn}
    unknown = [cell for cell in cells if cell not in settings.cells]
    if unknown:
        raise click.UsageError(f"--cell {unknown[0]!r}: no such cell (the cells are {', '.join(settings.cells)})")
    return {cell: dsn for cell, dsn in settings.cells.items() if not cells or cell in cells}


def _dry_run(dsn: str, name: str, as_sql: bool) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET statement_timeout = 0")
        if as_sql:
            text = schema_module.pending_sql(conn, name)
        else:
            text = schema_module.lock_plan(name, schema_module.pending(conn, name))
    sys.stdout.write(text or f"-- schema {name} is up to date (version {schema_module.latest_version()})\n")
    return exit_codes.OK


def _migrate(dsn: str, name: str, lock_timeout: float, lock_wait: float) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        applied = schema_module.migrate(conn, name, lock_timeout=lock_timeout, lock_wait=lock_wait, progress=click.echo)
    if applied:
        click.echo(f"schema {name} is now at version {applied[-1].version}")
    else:
        click.echo(f"schema {name} is up to date (version {schema_module.latest_version()}); nothing to do")
    return exit_codes.OK
