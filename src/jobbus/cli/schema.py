"""`jobbus schema` and `jobbus migrate`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import click
import psycopg

from jobbus import schema as schema_module
from jobbus.cli import exit_codes
from jobbus.cli.errors import fail, probe_database, run
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
    "--dry-run", is_flag=True, help="Print the SQL that would run (a script that applies as is), change nothing."
)
def migrate_command(dsn: str | None, schema_name: str | None, dry_run: bool) -> None:
    """Apply pending schema migrations (idempotent; safe to run from several hosts at once).

    A schema at a newer version than this jobbus is left alone: the command exits 78 and says to
    upgrade jobbus.

    \b
    Example:
      JOBBUS_DSN=postgresql://app@db/app jobbus migrate
      jobbus migrate --dry-run > pending.sql && psql -1 -f pending.sql

    Exit codes: 0 migrated (or nothing to do), 64 bad usage, 69 database unreachable, 78 the schema is
    newer than this jobbus or a setting is invalid.
    """
    settings = _env_settings(dsn)
    name = _schema_name(schema_name, lambda: settings.schema)
    if not settings.dsn:
        raise click.UsageError("no database: pass --dsn or set JOBBUS_DSN")
    target_dsn = settings.dsn

    async def body() -> int:
        await probe_database(target_dsn)
        return await asyncio.to_thread(_migrate, target_dsn, name, dry_run)

    sys.exit(run(body))


def _migrate(dsn: str, name: str, dry_run: bool) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if dry_run:
            pending = schema_module.pending_sql(conn, name)
            sys.stdout.write(pending or f"-- schema {name} is up to date (version {schema_module.latest_version()})\n")
            return exit_codes.OK
        applied = schema_module.migrate(conn, name)
    if applied:
        for migration in applied:
            click.echo(f"applied {migration.version:04d}_{migration.name}")
        click.echo(f"schema {name} is now at version {applied[-1].version}")
    else:
        click.echo(f"schema {name} is up to date (version {schema_module.latest_version()}); nothing to do")
    return exit_codes.OK
