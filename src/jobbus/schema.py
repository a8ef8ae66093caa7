"""Versioned SQL migrations shipped in the package: render, print, apply and verify.

Migrations are plain SQL files `sql/migrations/NNNN_name.sql` with `{schema}` where the schema
identifier goes. The name is validated (see `settings.validate_schema_name`) and quoted by psycopg,
never pasted into SQL as free text.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from jobbus.errors import SchemaError
from jobbus.settings import validate_identifier, validate_schema_name

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
#: First line of a migration whose statements must run outside a transaction (CREATE INDEX CONCURRENTLY).
_NO_TRANSACTION = "-- jobbus: no transaction"
_CONCURRENT_INDEX = re.compile(r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.I)
#: Advisory lock key space for migrations: one lock per schema name.
_LOCK_NAMESPACE = "jobbus.migrate."
#: The oldest PostgreSQL jobbus runs on (`server_version_num`): 13 reached its end of life in November
#: 2025, and the claim measures compressed payloads with `pg_column_compression` (14).
MIN_SERVER_VERSION = 140000


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    template: str = field(repr=False)

    @property
    def transactional(self) -> bool:
        """False for a migration that builds or drops indexes CONCURRENTLY (never blocking writes)."""
        return not self.template.startswith(_NO_TRANSACTION)

    def render(self, schema: str, *, concurrently: bool = False) -> str:
        """The migration's SQL. Scripts meant for one transaction (`jobbus schema`, the dry run) build
        indexes plainly; `migrate` builds them CONCURRENTLY, one statement at a time."""
        keyword = "CONCURRENTLY" if concurrently else ""
        return render(self.template.replace("{concurrently}", keyword), schema)

    def statements(self, schema: str) -> list[str]:
        """The statements of a non-transactional migration, each run on its own."""
        text = "\n".join(
            line for line in self.render(schema, concurrently=True).splitlines() if not line.startswith("--")
        )
        return [statement.strip() for statement in text.split(";") if statement.strip()]


def render(template: str, schema: str) -> str:
    """Put the quoted schema identifier where the template says `{schema}`."""
    quoted = sql.Identifier(validate_schema_name(schema)).as_string(None)
    return (
        template.replace("{{", "\x00")
        .replace("}}", "\x01")
        .replace("{schema}", quoted)
        .replace("\x00", "{")
        .replace("\x01", "}")
    )


@cache
def migrations() -> tuple[Migration, ...]:
    found = []
    for entry in resources.files("jobbus").joinpath("sql/migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(f"migration numbering has a gap before {migration.version:04d}_{migration.name}")
    return tuple(found)


def latest_version() -> int:
    return migrations()[-1].version


def _bookkeeping(schema: str) -> str:
    return render(
        "CREATE SCHEMA IF NOT EXISTS {schema};\n"
        "CREATE TABLE IF NOT EXISTS {schema}.migration (\n"
        "    version integer PRIMARY KEY,\n"
        "    name text NOT NULL,\n"
        "    applied_at timestamptz NOT NULL DEFAULT now()\n"
        ");\n",
        schema,
    )


def _record(schema: str, migration: Migration) -> str:
    return render(
        f"INSERT INTO {{schema}}.migration (version, name) VALUES ({migration.version}, '{migration.name}');\n",
        schema,
    )


def script(schema: str = "jobbus") -> str:
    """The whole DDL as one script that also records the migrations it contains.

    It has no BEGIN/COMMIT of its own, so Alembic, Django or Flyway can run it inside their migration
    transaction; with psql, run it in one transaction with `psql -1 -f`.
    """
    return _migration_script(schema, f"version {latest_version()}", migrations())


def roles_script(
    schema: str,
    *,
    worker: str,
    operator: str,
    observer: str,
    producer: str | None = None,
    dashboard: str | None = None,
) -> str:
    """GRANTs giving existing roles exactly what workers, operators, observers and (optionally) producers
    and the web dashboard need (docs/security.md). Without `producer`, producers use the worker role; a
    read-only dashboard uses the observer role."""
    sql_dir = resources.files("jobbus").joinpath("sql")
    template = sql_dir.joinpath("roles.sql").read_text(encoding="utf-8")
    if producer is not None:
        template += "\n" + sql_dir.joinpath("roles_producer.sql").read_text(encoding="utf-8")
    if dashboard is not None:
        template += "\n" + sql_dir.joinpath("roles_dashboard.sql").read_text(encoding="utf-8")
    roles = (
        ("worker", worker),
        ("operator", operator),
        ("observer", observer),
        ("producer", producer),
        ("dashboard", dashboard),
    )
    for kind, role in roles:
        if role is None:
            continue
        quoted = sql.Identifier(validate_identifier(f"{kind} role", role)).as_string(None)
        template = template.replace("{" + kind + "}", quoted)
    return render(template, schema)


def migrate(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """Apply pending migrations under an advisory lock; returns what was applied.

    Consecutive migrations run in one transaction each together; one that builds indexes
    CONCURRENTLY runs statement by statement outside a transaction (never blocking writes; an index a
    failed run left invalid is dropped and built again). `conn` must be in autocommit mode. The
    advisory lock is a session lock held across those transactions: run migrations on a direct
    connection, not through PgBouncer in transaction mode. Concurrent callers serialise on it; the
    second finds nothing to do. A schema at a newer version than this code raises `SchemaError` and
    changes nothing: this jobbus cannot tell what the newer migrations did.
    """
    if not conn.autocommit:
        raise ValueError("migrate needs a connection in autocommit mode (psycopg.connect(..., autocommit=True))")
    check_server(conn.info.server_version)
    lock = (_LOCK_NAMESPACE + schema,)
    # Polled, not waited for: a session waiting on the lock would hold a snapshot that a concurrent
    # CREATE INDEX CONCURRENTLY of the holder waits out, and the two would deadlock.
    while not conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", lock).fetchone()[0]:  # type: ignore[index]
        time.sleep(0.1)
    try:
        with conn.transaction():
            conn.execute(_bookkeeping(schema).encode())
            applied = {
                row[0]
                for row in conn.execute(sql.SQL("SELECT version FROM {}.migration").format(sql.Identifier(schema)))
            }
        check_not_newer(schema, max(applied, default=0))
        pending = [m for m in migrations() if m.version not in applied]
        batch: list[Migration] = []
        for migration in [*pending, None]:
            if migration is not None and migration.transactional:
                batch.append(migration)
                continue
            if batch:
                with conn.transaction():
                    for done in batch:
                        conn.execute(done.render(schema).encode())
                        conn.execute(_record(schema, done).encode())
                batch = []
            if migration is not None:
                for statement in migration.statements(schema):
                    _drop_invalid_index(conn, schema, statement)
                    conn.execute(statement.encode())
                conn.execute(_record(schema, migration).encode())
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", lock)
    return pending


def _drop_invalid_index(conn: psycopg.Connection[Any], schema: str, statement: str) -> None:
    """A CREATE INDEX CONCURRENTLY that failed leaves an invalid index IF NOT EXISTS would keep."""
    match = _CONCURRENT_INDEX.search(statement)
    if match is None:
        return
    invalid = conn.execute(
        "SELECT 1 FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
        "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND NOT i.indisvalid",
        (schema, match[1]),
    ).fetchone()
    if invalid:
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY {}.{}").format(sql.Identifier(schema), sql.Identifier(match[1])))


def pending_sql(conn: psycopg.Connection[Any], schema: str) -> str:
    """What `migrate` would run now, as a script that applies on its own (`jobbus migrate --dry-run`).

    Like `script`, it creates the schema and the migration table when they are missing and records
    each migration it contains; empty when nothing is pending.
    """
    check_server(conn.info.server_version)
    current = current_version_sync(conn, schema)
    check_not_newer(schema, current)
    pending = [m for m in migrations() if m.version > current]
    if not pending:
        return ""
    return _migration_script(schema, f"from version {current} to {latest_version()}", pending)


def _migration_script(schema: str, versions: str, chosen: Iterable[Migration]) -> str:
    """Bookkeeping, then each migration followed by the row that records it."""
    parts = [
        f"-- jobbus schema {schema!r}, {versions}; run it in one transaction (psql -1 -f)\n",
        _bookkeeping(schema),
    ]
    for migration in chosen:
        parts.append(f"\n-- {migration.version:04d}_{migration.name}\n")
        if not migration.transactional:
            parts.append(
                "-- (`jobbus migrate` builds these indexes CONCURRENTLY, outside a transaction, so a large job\n"
                "-- table stays writable; in this script they are built inside its transaction)\n"
            )
        parts.append(migration.render(schema).rstrip() + "\n")
        parts.append(_record(schema, migration))
    return "".join(parts)


VERSION_QUERY = "SELECT coalesce(max(version), 0) FROM {schema}.migration"
#: The server's `server_version_num`, where the schema (and its migration table) may be missing.
SERVER_VERSION_QUERY = "SELECT current_setting('server_version_num')::int"
#: The server's `server_version_num` and the schema's version, in one round trip.
SERVER_AND_VERSION_QUERY = (
    "SELECT current_setting('server_version_num')::int, coalesce(max(version), 0) FROM {schema}.migration"
)


def current_version_sync(conn: psycopg.Connection[Any], schema: str) -> int:
    try:
        with conn.transaction():
            row = conn.execute(render(VERSION_QUERY, schema).encode()).fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row[0]) if row else 0


def check_server(server_version: int) -> None:
    """Raise `SchemaError` on a PostgreSQL older than `MIN_SERVER_VERSION`, naming both versions."""
    if server_version < MIN_SERVER_VERSION:
        major, minor = divmod(server_version, 10000)
        found = f"{major}.{minor}" if major >= 10 else f"{server_version // 10000}.{server_version // 100 % 100}"
        raise SchemaError(
            f"PostgreSQL {found} is too old for jobbus: it needs PostgreSQL {MIN_SERVER_VERSION // 10000} or newer"
        )


def check_version(schema: str, version: int) -> None:
    """Raise `SchemaError` telling the user what to run unless the schema is exactly current."""
    needed = latest_version()
    if version == 0:
        raise SchemaError(f"schema {schema} is missing: run `jobbus migrate` (or apply the output of `jobbus schema`)")
    if version < needed:
        raise SchemaError(f"schema {schema} is at version {version}, this code needs {needed}: run `jobbus migrate`")
    # A newer schema is accepted: migrations are additive, so old code keeps working during a rollout.


def check_not_newer(schema: str, version: int) -> None:
    """Raise `SchemaError` when the schema is newer than this code: it must not be migrated by it."""
    if version > latest_version():
        raise SchemaError(
            f"schema {schema} is at version {version}, newer than this jobbus knows (up to {latest_version()}): "
            "upgrade jobbus to migrate it"
        )
