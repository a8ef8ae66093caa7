"""Write src/jobbus/sql/migration_locks.json: the tables each migration locks, in which modes, and
whether it rewrites one, as pg_locks shows them while the migration is applied to a scratch database.

`jobbus migrate` takes those locks first (the strongest first, under a short lock_timeout) and
`jobbus migrate --dry-run` prints them, so neither has to take a lock on a production database to find
out. A migration in a transaction is read from pg_locks just before its commit (every lock it took is
still held); one that builds indexes CONCURRENTLY is watched from a second session while a third holds
an old snapshot that each build waits out, so its locks are seen while it runs (a lock it waits for
counts: it is taken once the holder lets go, maybe too briefly for the watcher to see it granted). A table whose
relfilenode changed was rewritten.

    python tools/generate_migration_locks.py            # write it (`make schema` does)
    python tools/generate_migration_locks.py --check    # exit 1 if it is stale
    python tools/generate_migration_locks.py --check-migrations   # no server: exit 1 unless it names each migration

The server is the tests' (`JOBBUS_TEST_DSN`, else the embedded one), or `--dsn`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/...` puts tools/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from tests.dbserver import fresh_database, server_dsn  # noqa: E402

from jobbus import schema  # noqa: E402

TARGET = ROOT / "src/jobbus/sql" / Path(schema.LOCK_RECORD).name
SCHEMA = "jobbus"

_TABLES = (
    "SELECT c.relname, c.relfilenode FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
    " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND c.relname <> 'migration'"
)
_HELD = (
    "SELECT c.relname, l.mode FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation"
    " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
    " WHERE l.pid = %s AND l.locktype = 'relation' AND n.nspname = %s"
    " AND c.relkind IN ('r', 'p') AND c.relname <> 'migration'"
)
_WAITING = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"


def _tables(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {name: node for name, node in conn.execute(_TABLES, (SCHEMA,)).fetchall()}


def _record(held: set[tuple[str, str]], before: dict[str, int], after: dict[str, int]) -> list[schema.TableLock]:
    order = list(schema.LOCK_MODES)
    modes: dict[str, set[str]] = {}
    for table, mode in held:
        modes.setdefault(table, set()).add(mode)
    return [
        schema.TableLock(
            table=table,
            modes=tuple(sorted(found, key=order.index)),
            created=table not in before,
            rewritten=table in before and table in after and before[table] != after[table],
        )
        for table, found in sorted(modes.items())
    ]


def observe_in_transaction(conn: psycopg.Connection[Any], migration: schema.Migration) -> list[schema.TableLock]:
    """Apply `migration` in a transaction and read the locks it holds before the commit."""
    with conn.transaction():
        before = _tables(conn)
        conn.execute(migration.render(SCHEMA).encode())
        held = set(conn.execute(_HELD, (conn.info.backend_pid, SCHEMA)).fetchall())
        after = _tables(conn)
        conn.execute(
            sql.SQL("INSERT INTO {}.migration (version, name) VALUES (%s, %s)").format(sql.Identifier(SCHEMA)),
            (migration.version, migration.name),
        )
    return _record(held, before, after)


def observe_concurrently(
    dsn: str, conn: psycopg.Connection[Any], migration: schema.Migration
) -> list[schema.TableLock]:
    """Apply `migration` statement by statement, watched from a second session while a third holds an
    old snapshot (and a share lock on the job table) that each statement has to wait out."""
    before = _tables(conn)
    held: set[tuple[str, str]] = set()
    for statement in migration.statements(SCHEMA):
        held |= _watch(dsn, conn, statement)
    conn.execute(
        sql.SQL("INSERT INTO {}.migration (version, name) VALUES (%s, %s)").format(sql.Identifier(SCHEMA)),
        (migration.version, migration.name),
    )
    return _record(held, before, _tables(conn))


def _watch(dsn: str, conn: psycopg.Connection[Any], statement: str) -> set[tuple[str, str]]:
    """Run `statement` on `conn` and return the table locks a watcher saw it hold."""
    held: set[tuple[str, str]] = set()
    failures: list[BaseException] = []
    done = threading.Event()
    pid = conn.info.backend_pid

    def run() -> None:
        try:
            conn.execute(statement.encode())
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    with psycopg.connect(dsn, autocommit=True) as holder, psycopg.connect(dsn, autocommit=True) as watcher:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute(sql.SQL("SELECT count(*) FROM {}.job").format(sql.Identifier(SCHEMA)))
        holder.execute("SELECT txid_current()")
        runner = threading.Thread(target=run)
        runner.start()
        released = False
        while not done.is_set():
            held |= set(watcher.execute(_HELD, (pid, SCHEMA)).fetchall())
            waiting = watcher.execute(_WAITING, (pid,)).fetchone()
            if not released and waiting and waiting[0]:
                held |= set(watcher.execute(_HELD, (pid, SCHEMA)).fetchall())
                holder.execute("COMMIT")
                released = True
        if not released:
            holder.execute("COMMIT")
        runner.join()
    if failures:
        raise failures[0]
    return held


def observe(dsn: str) -> dict[str, list[schema.TableLock]]:
    """Every migration's locks, applied one by one to the empty database `dsn`."""
    found: dict[str, list[schema.TableLock]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema.bookkeeping(SCHEMA).encode())
        for migration in schema.migrations():
            if migration.transactional:
                found[migration.key] = observe_in_transaction(conn, migration)
            else:
                found[migration.key] = observe_concurrently(dsn, conn, migration)
    return found


def as_json(found: dict[str, list[schema.TableLock]]) -> str:
    return json.dumps({key: [lock.as_dict() for lock in locks] for key, locks in found.items()}, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the record on disk is stale")
    mode.add_argument("--check-migrations", action="store_true", help="exit 1 unless it names each migration")
    parser.add_argument("--dsn", help="a server to record on (default: the tests')")
    args = parser.parse_args(argv)
    if args.check_migrations:
        recorded = list(json.loads(TARGET.read_text())) if TARGET.exists() else []
        if recorded != [m.key for m in schema.migrations()]:
            print(f"generate_migration_locks: {TARGET} is stale (other migrations): run `make schema`", file=sys.stderr)
            return 1
        return 0
    with fresh_database(args.dsn or server_dsn(), None) as dsn:
        text = as_json(observe(dsn))
    if not args.check:
        TARGET.write_text(text)
        return 0
    if not TARGET.exists() or TARGET.read_text() != text:
        print(f"generate_migration_locks: {TARGET} is stale: run `make schema`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
