"""Versioned SQL migrations shipped in the package: render, print, apply and verify.

Migrations are plain SQL files `sql/migrations/NNNN_name.sql` with `{schema}` where the schema
identifier goes. The name is validated (see `settings.validate_schema_name`) and quoted by psycopg,
never pasted into SQL as free text.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from jobbus.errors import MigrationLockError, SchemaError
from jobbus.settings import validate_identifier, validate_schema_name

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
#: First line of a migration whose statements must run outside a transaction (CREATE INDEX CONCURRENTLY).
_NO_TRANSACTION = "-- jobbus: no transaction"
#: A line of a transactional migration after which its statements run once its transaction has committed,
#: each on its own (a CHECK added NOT VALID, validated without the migration's table locks). Scripts
#: meant for one transaction run them inside it, as one more statement each.
_AFTER_COMMIT = "-- jobbus: after commit"
_CONCURRENT_INDEX = re.compile(r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.I)
#: Advisory lock key space for migrations: one lock per schema name.
_LOCK_NAMESPACE = "jobbus.migrate."
#: The oldest PostgreSQL jobbus runs on (`server_version_num`): 13 reached its end of life in November
#: 2025, and the claim measures compressed payloads with `pg_column_compression` (14).
MIN_SERVER_VERSION = 140000
#: Seconds `migrate` waits for one lock before it lets go and tries again: what `schedule` and a claim
#: queued behind its request wait at most. Below the server's `deadlock_timeout` (1 s by default), so a
#: wait that would close a cycle ends on the migration's side before the server picks a victim.
DEFAULT_LOCK_TIMEOUT = 0.5
#: Seconds `migrate` keeps trying for the locks of one migration before it gives up.
DEFAULT_LOCK_WAIT = 60.0
#: PostgreSQL's table lock modes as pg_locks names them, weakest first, each with the modes it conflicts
#: with (the table of "Explicit Locking" in PostgreSQL's documentation).
LOCK_MODES = (
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
)
LOCK_CONFLICTS: dict[str, frozenset[str]] = {
    mode: frozenset(LOCK_MODES[i] for i in conflicts)
    for mode, conflicts in zip(
        LOCK_MODES,
        # the indexes into LOCK_MODES of the modes each conflicts with
        ({7}, {6, 7}, {4, 5, 6, 7}, {3, 4, 5, 6, 7}, {2, 3, 5, 6, 7}, {2, 3, 4, 5, 6, 7}, {*range(1, 8)}, {*range(8)}),
        strict=True,
    )
}
#: The record of the locks each migration takes, made by tools/generate_migration_locks.py.
LOCK_RECORD = "sql/migration_locks.json"


def lock_mode_sql(mode: str) -> str:
    """`ShareRowExclusiveLock` -> `SHARE ROW EXCLUSIVE`, as LOCK TABLE and the documentation spell it."""
    if mode not in LOCK_CONFLICTS:
        raise ValueError(f"{mode!r} is not a table lock mode")
    return re.sub(r"(?<!^)(?=[A-Z])", " ", mode.removesuffix("Lock")).upper()


def covering_mode(modes: Iterable[str]) -> str:
    """The weakest mode that conflicts with everything any of `modes` conflicts with: held first, it
    lets the migration take each of `modes` afterwards without waiting for another session."""
    needed = frozenset().union(*(LOCK_CONFLICTS[mode] for mode in modes))
    return next(mode for mode in LOCK_MODES if LOCK_CONFLICTS[mode] >= needed)


@dataclass(frozen=True, slots=True)
class TableLock:
    """A table a migration locks, as recorded from pg_locks when it was applied to a scratch database."""

    table: str
    modes: tuple[str, ...]
    #: the migration creates the table: no other session can hold it
    created: bool
    #: the migration rewrites the table (its relfilenode changes): the lock lasts as long as the copy
    rewritten: bool

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "modes": list(self.modes), "created": self.created, "rewritten": self.rewritten}


@cache
def lock_record() -> dict[str, tuple[TableLock, ...]]:
    """`NNNN_name` -> the tables that migration locks (src/jobbus/sql/migration_locks.json)."""
    text = resources.files("jobbus").joinpath(LOCK_RECORD).read_text(encoding="utf-8")
    return {
        name: tuple(
            TableLock(entry["table"], tuple(entry["modes"]), bool(entry["created"]), bool(entry["rewritten"]))
            for entry in tables
        )
        for name, tables in json.loads(text).items()
    }


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

    @property
    def key(self) -> str:
        return f"{self.version:04d}_{self.name}"

    def locks(self) -> tuple[TableLock, ...] | None:
        """The tables this migration locks, from the record (`make schema` writes it); None for a
        migration not recorded yet (`make lint` and a test fail on one)."""
        return lock_record().get(self.key)

    def locks_up_front(self) -> list[tuple[str, str]]:
        """(table, mode) to lock before the migration's statements: each table it finds existing, in
        the mode that covers every lock the statements take on it, the strongest first; none for a
        migration not recorded (its statements take their locks as they go, each still bounded by
        the lock_timeout)."""
        order = list(LOCK_MODES)
        chosen = [(lock.table, covering_mode(lock.modes)) for lock in self.locks() or () if not lock.created]
        return sorted(chosen, key=lambda pair: (-order.index(pair[1]), pair[0]))

    def statements(self, schema: str) -> list[str]:
        """The statements of a non-transactional migration, each run on its own."""
        text = "\n".join(
            line for line in self.render(schema, concurrently=True).splitlines() if not line.startswith("--")
        )
        return [statement.strip() for statement in text.split(";") if statement.strip()]


def _statements(text: str) -> list[str]:
    """The statements of `text` (no function bodies), comment lines dropped."""
    kept = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return [statement.strip() for statement in kept.split(";") if statement.strip()]


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


def bookkeeping(schema: str) -> str:
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


def migrate(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    target: int | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    progress: Callable[[str], None] | None = None,
) -> list[Migration]:
    """Apply pending migrations (up to version `target`, default all) under an advisory lock; returns
    what was applied.

    Each migration commits on its own. One that runs in a transaction first takes, table by table, the
    locks `migration_locks.json` records for it (the strongest first, so it never asks for a stronger
    lock while holding a weaker one: no lock upgrade, no deadlock with the traffic), each waited for at
    most `lock_timeout` seconds so that `schedule` and a claim queued behind the request wait no longer;
    when one is not granted the transaction rolls back and is tried again with backoff until `lock_wait`
    seconds have passed, then `MigrationLockError` names the table and who held it. One that builds
    indexes CONCURRENTLY runs statement by statement outside a transaction (never blocking writes; an
    index a failed run left invalid is dropped and built again), each statement waiting for its locks at
    most `lock_wait` seconds. The session ignores a role's `statement_timeout`.

    `conn` must be in autocommit mode. The advisory lock is a session lock held across those
    transactions: run migrations on a direct connection, not through PgBouncer in transaction mode.
    Concurrent callers serialise on it; the second finds nothing to do. A schema at a newer version than
    this code raises `SchemaError` and changes nothing: this jobbus cannot tell what the newer migrations
    did. `progress` is called with a line for each lock retry and each migration applied.
    """
    if not conn.autocommit:
        raise ValueError("migrate needs a connection in autocommit mode (psycopg.connect(..., autocommit=True))")
    if not 0 < lock_timeout <= lock_wait:
        raise ValueError(f"lock_timeout ({lock_timeout} s) must be positive and at most lock_wait ({lock_wait} s)")
    check_server(conn.info.server_version)
    say = progress or (lambda line: None)
    conn.execute("SET statement_timeout = 0")
    lock = (_LOCK_NAMESPACE + schema,)
    # Polled, not waited for: a session waiting on the lock would hold a snapshot that a concurrent
    # CREATE INDEX CONCURRENTLY of the holder waits out, and the two would deadlock.
    while not conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", lock).fetchone()[0]:  # type: ignore[index]
        time.sleep(0.1)
    try:
        with conn.transaction():
            conn.execute(bookkeeping(schema).encode())
            applied = {
                row[0]
                for row in conn.execute(sql.SQL("SELECT version FROM {}.migration").format(sql.Identifier(schema)))
            }
        check_not_newer(schema, max(applied, default=0))
        last = latest_version() if target is None else target
        pending = [m for m in migrations() if m.version not in applied and m.version <= last]
        for migration in pending:
            if migration.transactional:
                _apply_in_transaction(conn, schema, migration, lock_timeout, lock_wait, say)
            else:
                _apply_concurrently(conn, schema, migration, lock_wait)
            say(f"applied {migration.version:04d}_{migration.name}")
    finally:
        conn.execute("RESET lock_timeout")  # the caller's session as it was
        conn.execute("RESET statement_timeout")
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", lock)
    return pending


def _apply_in_transaction(
    conn: psycopg.Connection[Any],
    schema: str,
    migration: Migration,
    lock_timeout: float,
    lock_wait: float,
    say: Callable[[str], None],
) -> None:
    """The migration and its record in one transaction, its locks taken first, retried with backoff."""
    deadline = time.monotonic() + lock_wait
    tables = migration.locks_up_front()
    for attempt in itertools.count(1):
        waiting_for = ("", "")
        try:
            with conn.transaction():
                conn.execute(b"SET LOCAL lock_timeout = %d" % max(1, round(lock_timeout * 1000)))
                for table, mode in tables:
                    waiting_for = (table, mode)
                    conn.execute(
                        sql.SQL("LOCK TABLE {}.{} IN {} MODE").format(
                            sql.Identifier(schema), sql.Identifier(table), sql.SQL(lock_mode_sql(mode))
                        )
                    )
                waiting_for = ("", "")
                text, _, after_commit = migration.render(schema).partition(_AFTER_COMMIT)
                conn.execute(text.encode())
                conn.execute(_record(schema, migration).encode())
            for statement in _statements(after_commit):
                conn.execute(statement.encode())
            return
        except psycopg.errors.LockNotAvailable:
            table, mode = waiting_for
            holders = _holders(conn, schema, table)
            what = f"{schema}.{table} in {lock_mode_sql(mode)} mode" if table else "a lock"
            if time.monotonic() + _backoff(attempt) >= deadline:
                raise MigrationLockError(
                    f"migration {migration.version:04d}_{migration.name} could not take {what} within "
                    f"{lock_wait:g} s ({attempt} tries of {lock_timeout:g} s each): held by {holders}; "
                    "nothing of it was applied, run `jobbus migrate` again once that session has ended",
                    table=f"{schema}.{table}" if table else "",
                    mode=mode,
                    holders=holders,
                ) from None
            say(f"waiting for {what} for {migration.version:04d}_{migration.name} (held by {holders}), try {attempt}")
            time.sleep(_backoff(attempt))


def _apply_concurrently(conn: psycopg.Connection[Any], schema: str, migration: Migration, lock_wait: float) -> None:
    """Statement by statement outside a transaction: CREATE INDEX CONCURRENTLY takes only a lock that
    `schedule` and a claim never wait for, so each statement waits up to `lock_wait` for its own."""
    conn.execute(b"SET lock_timeout = %d" % max(1, round(lock_wait * 1000)))
    for statement in migration.statements(schema):
        try:
            _drop_invalid_index(conn, schema, statement)
            conn.execute(statement.encode())
        except psycopg.errors.LockNotAvailable:
            holders = _holders(conn, schema, "job", or_oldest_transactions=True)
            raise MigrationLockError(
                f"migration {migration.version:04d}_{migration.name} waited {lock_wait:g} s for {schema}.job "
                f"and the transactions its index build waits out: held by {holders}; the index left behind "
                "is dropped and built again by the next `jobbus migrate`",
                table=f"{schema}.job",
                mode="ShareUpdateExclusiveLock",
                holders=holders,
            ) from None
    conn.execute(_record(schema, migration).encode())


def _backoff(attempt: int) -> float:
    """Seconds before try `attempt + 1`: doubling from 0.1 s up to 5 s, with jitter so that two
    migrators (or a migrator and a retrying client) do not keep meeting."""
    return min(0.1 * 2.0 ** min(attempt - 1, 6), 5.0) * (0.5 + random.random() / 2)


def _holders(conn: psycopg.Connection[Any], schema: str, table: str, *, or_oldest_transactions: bool = False) -> str:
    """The other sessions holding a lock on `table` (all of the schema's tables when not known), as
    one phrase: pid, mode, state and for how long, application name. With `or_oldest_transactions`,
    when none does, the oldest open transactions of the database instead: an index built
    CONCURRENTLY waits out every transaction older than its snapshots, whatever it locks."""
    rows = conn.execute(
        "SELECT l.pid, l.mode, a.state, a.application_name,"
        " extract(epoch FROM clock_timestamp() - coalesce(a.xact_start, a.backend_start))"
        " FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation"
        " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid"
        " WHERE l.granted AND l.locktype = 'relation' AND l.pid <> pg_backend_pid() AND n.nspname = %s"
        " AND (c.relname = %s OR %s = '') ORDER BY 5 DESC NULLS LAST, l.pid LIMIT 3",
        (schema, table, table),
    ).fetchall()
    if not rows and or_oldest_transactions:
        rows = conn.execute(
            "SELECT pid, 'an open transaction', state, application_name,"
            " extract(epoch FROM clock_timestamp() - xact_start) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
            " ORDER BY xact_start LIMIT 3"
        ).fetchall()
    if not rows:
        return "sessions that ended before they could be named"
    described = []
    for pid, mode, state, application, seconds in rows:
        who = f"pid {pid} ({mode}"
        if state:
            who += f", {state}"
        if seconds is not None:
            who += f" for {float(seconds):.1f} s"
        if application:
            who += f", application {application!r}"
        described.append(who + ")")
    return ", ".join(described)


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


def pending(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """The migrations `migrate` would apply now (after checking the server and the schema's version)."""
    check_server(conn.info.server_version)
    current = current_version_sync(conn, schema)
    check_not_newer(schema, current)
    return [m for m in migrations() if m.version > current]


def pending_sql(conn: psycopg.Connection[Any], schema: str) -> str:
    """What `migrate` would run now, as a script that applies on its own (`jobbus migrate --dry-run --sql`).

    Like `script`, it creates the schema and the migration table when they are missing and records
    each migration it contains; empty when nothing is pending.
    """
    chosen = pending(conn, schema)
    if not chosen:
        return ""
    return _migration_script(schema, f"from version {chosen[0].version - 1} to {latest_version()}", chosen)


def lock_plan(schema: str, chosen: Iterable[Migration]) -> str:
    """Per migration, the tables it locks, in which modes, and whether it rewrites one (`jobbus migrate
    --dry-run`): read from the record, no lock taken to find out."""
    lines = []
    for migration in chosen:
        how = "in one transaction" if migration.transactional else "statement by statement, CONCURRENTLY"
        lines.append(f"{migration.key} ({how})")
        recorded = migration.locks()
        if recorded is None:
            lines.append(f"  locks not recorded in {LOCK_RECORD}: run `make schema`")
            continue
        existing = [lock for lock in recorded if not lock.created]
        created = [lock.table for lock in recorded if lock.created]
        for lock in existing:
            modes = ", ".join(lock_mode_sql(mode) for mode in lock.modes)
            first = covering_mode(lock.modes)
            if migration.transactional and first != lock.modes[-1]:
                modes += f" (taken first as {lock_mode_sql(first)})"
            rewrite = "REWRITES the table" if lock.rewritten else "no rewrite"
            lines.append(f"  {schema}.{lock.table}: {modes}; {rewrite}")
        if created:
            lines.append(f"  creates {', '.join(f'{schema}.{table}' for table in created)}")
        if not existing:
            lines.append("  locks no existing table")
    return "\n".join(lines) + "\n" if lines else ""


def _migration_script(schema: str, versions: str, chosen: Iterable[Migration]) -> str:
    """Bookkeeping, then each migration followed by the row that records it."""
    parts = [
        f"-- jobbus schema {schema!r}, {versions}; run it in one transaction (psql -1 -f)\n",
        bookkeeping(schema),
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
