"""What each migration since the previous release costs the traffic on a big table: `make bench-migrate`.

    .venv/bin/python bench/migrate.py                       # 10,000,000 jobs
    .venv/bin/python bench/migrate.py --rows 1000000        # a smaller table

A database of its own on the server at BENCH_DSN (default: the test server) gets the schema of the
previous release, its migrations read from git at that release's commit (0.2.0, 149910a), and `--rows`
jobs: completed 95 %, failed 3 %, cancelled 2 %, finished over the last week, plus 20,000 queued for
tomorrow; then VACUUM ANALYZE. Then each later migration is applied on its own by `jobbus.schema.migrate`
(its locks first, as `jobbus migrate` takes them) while a producer calls the SQL API's `schedule` 50
times a second and a worker claims with the release's `claim_jobs` and completes what it claimed. A
watcher samples, every few milliseconds, the migrating session's table locks in pg_locks and the
producer's and worker's sessions waiting for a lock in pg_stat_activity (for how long their statement
has run). Per migration, the table prints the locks on the job table the record gives
(src/jobbus/sql/migration_locks.json) and those the watcher saw (a lock held for milliseconds can go
unseen), the longest lock wait seen of `schedule` and of a claim with the kind of lock it waited for,
the longest `schedule` and claim call that overlapped it (waits for the machine included) and its
duration. The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jobbus import schema  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
#: The previous release and its last migration.
RELEASE = ("0.2.0", "149910a", 14)
BATCH = 500_000
FUTURE_JOBS = 20_000
SCHEDULE_PER_SECOND = 50

FINISHED_SQL = """
INSERT INTO jobbus.job (id, type, queue, status, configuration_data, attempts, max_attempts, available_at,
                        created_at, started_at, finished_at, worker_id, last_error)
SELECT jobbus.uuid_generate_v7(), 'type.' || (n %% 20), 'queue-' || (n %% 5), s.status,
       jsonb_build_object('n', n), 1, 3, t.at, t.at, t.at, t.at + interval '1 second', 'bench',
       CASE WHEN s.status = 'failed' THEN 'error ' || (n %% 30) || ' for user ' || n END
FROM generate_series(%(low)s::bigint, %(high)s::bigint) AS n
CROSS JOIN LATERAL (SELECT CASE WHEN n %% 100 < 3 THEN 'failed' WHEN n %% 100 < 5 THEN 'cancelled'
                                ELSE 'completed' END AS status) AS s
CROSS JOIN LATERAL (SELECT now() - interval '7 days' * (n::double precision / %(rows)s) AS at) AS t
"""
FUTURE_SQL = """
INSERT INTO jobbus.job (id, type, queue, max_attempts, available_at)
SELECT jobbus.uuid_generate_v7(), 'type.' || (n %% 20), 'queue-' || (n %% 5), 3, now() + interval '1 day'
FROM generate_series(1, %(count)s) AS n
"""
SCHEDULE_SQL = "SELECT jobbus.schedule('bench.job', '{}'::jsonb, '{\"queue\": \"bench\"}'::jsonb)"
CLAIM_SQL = (
    "SELECT id, lease_token FROM jobbus.claim_jobs('bench-worker', 1, ARRAY['bench'], ARRAY['bench.job'],"
    " 60, 1000000, ARRAY[]::text[])"
)
COMPLETE_SQL = (
    "UPDATE jobbus.job SET status = 'completed', finished_at = now(), lease_token = NULL, lease_expires_at = NULL"
    " WHERE id = %s AND lease_token = %s"
)
WAITS_SQL = (
    "SELECT application_name, extract(epoch FROM clock_timestamp() - query_start), wait_event FROM pg_stat_activity"
    " WHERE application_name IN ('bench-producer', 'bench-worker') AND wait_event_type = 'Lock'"
)
LOCKS_SQL = (
    "SELECT c.relname, l.mode FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation"
    " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
    " WHERE l.pid = %s AND l.granted AND l.locktype = 'relation' AND n.nspname = 'jobbus' AND c.relkind = 'r'"
)


@dataclass
class Traffic:
    """Calls of the producer and the worker: (kind, started, ended), monotonic seconds."""

    calls: list[tuple[str, float, float]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def longest(self, kind: str, start: float, end: float) -> float:
        """The longest call of `kind` that overlapped [start, end] (0 when none did)."""
        return max((e - s for k, s, e in list(self.calls) if k == kind and s <= end and e >= start), default=0.0)

    def produce(self, dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True, application_name="bench-producer") as conn:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    conn.execute(SCHEDULE_SQL)
                except psycopg.Error as exc:
                    self.errors.append(exc)
                ended = time.monotonic()
                self.calls.append(("schedule", started, ended))
                time.sleep(max(0.0, 1 / SCHEDULE_PER_SECOND - (ended - started)))  # the producer's pace

    def work(self, dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True, application_name="bench-worker") as conn:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    row = conn.execute(CLAIM_SQL).fetchone()
                    ended = time.monotonic()
                    if row is not None:
                        conn.execute(COMPLETE_SQL, row)
                except psycopg.Error as exc:
                    self.errors.append(exc)
                    ended = time.monotonic()
                    row = None
                self.calls.append(("claim", started, ended))
                if row is None:
                    time.sleep(0.01)  # an idle worker's poll interval


def _release_migrations(commit: str, last: int) -> list[schema.Migration]:
    """The release's own migration files, as its `jobbus migrate` applied them."""
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{commit}:src/jobbus/sql/migrations"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    found = []
    for name in sorted(listing):
        version = int(name[:4])
        if version > last:
            continue
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:src/jobbus/sql/migrations/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        found.append(schema.Migration(version, name[5:-4], text))
    return found


def build(dsn: str, rows: int) -> None:
    """The release's schema and `rows` finished jobs plus the queued ones for tomorrow."""
    version, commit, last = RELEASE
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema.bookkeeping("jobbus").encode())
        for migration in _release_migrations(commit, last):
            with conn.transaction():
                conn.execute(migration.render("jobbus").encode())
                conn.execute(
                    "INSERT INTO jobbus.migration (version, name) VALUES (%s, %s)", (migration.version, migration.name)
                )
        print(f"schema of {version} ({commit}, migration {last}); inserting {rows:,} jobs", flush=True)
        started = time.monotonic()
        for low in range(1, rows + 1, BATCH):
            high = min(low + BATCH - 1, rows)
            conn.execute(FINISHED_SQL, {"low": low, "high": high, "rows": rows})
            print(f"  {high:,} / {rows:,} ({time.monotonic() - started:.0f} s)", flush=True)
        conn.execute(FUTURE_SQL, {"count": FUTURE_JOBS})
        conn.execute("VACUUM ANALYZE jobbus.job")
        print(f"built in {time.monotonic() - started:.0f} s", flush=True)


@dataclass
class Watch:
    """What the watcher saw during each migration (by version): the migrating session's modes on the
    job table, and the longest lock wait of the producer's and the worker's statements."""

    pid: int
    modes: dict[int, set[str]] = field(default_factory=dict)
    waits: dict[tuple[int, str], tuple[float, str]] = field(default_factory=dict)
    current: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, dsn: str) -> None:
        kinds = {"bench-producer": "schedule", "bench-worker": "claim"}
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                locks = conn.execute(LOCKS_SQL, (self.pid,)).fetchall()
                waits = conn.execute(WAITS_SQL).fetchall()
                version = self.current[0] if self.current else None
                if version is not None:
                    self.modes.setdefault(version, set()).update(mode for table, mode in locks if table == "job")
                    for application, seconds, event in waits:
                        key = (version, kinds[application])
                        self.waits[key] = max(self.waits.get(key, (0.0, "")), (float(seconds), event))
                time.sleep(0.002)


def run(dsn: str) -> list[dict[str, Any]]:
    """Apply each migration after the release's, one by one, under traffic; one result per migration."""
    traffic = Traffic()
    threads = [
        threading.Thread(target=traffic.produce, args=(dsn,)),
        threading.Thread(target=traffic.work, args=(dsn,)),
    ]
    for thread in threads:
        thread.start()
    results = []
    watch: Watch | None = None
    try:
        time.sleep(1.0)  # traffic under way before the first migration
        with psycopg.connect(dsn, autocommit=True) as conn:
            watch = Watch(conn.info.backend_pid)
            threads.append(threading.Thread(target=watch.run, args=(dsn,)))
            threads[-1].start()
            for migration in schema.migrations()[RELEASE[2] :]:
                watch.current[:] = [migration.version]
                started = time.monotonic()
                schema.migrate(conn, "jobbus", target=migration.version)
                ended = time.monotonic()
                watch.current.clear()
                results.append(
                    {
                        "migration": migration.key,
                        "recorded": [
                            mode for lock in migration.locks() or () if lock.table == "job" for mode in lock.modes
                        ],
                        "locks": sorted(watch.modes.get(migration.version, set()), key=schema.LOCK_MODES.index),
                        **_waits(watch, migration.version),
                        "schedule_ms": traffic.longest("schedule", started, ended) * 1000,
                        "claim_ms": traffic.longest("claim", started, ended) * 1000,
                        "seconds": ended - started,
                    }
                )
                print(_row(results[-1]), flush=True)
    finally:
        if watch is not None:
            watch.stop.set()
        traffic.stop.set()
        for thread in threads:
            thread.join()
    if traffic.errors:
        raise RuntimeError(f"{len(traffic.errors)} traffic call(s) failed, the first: {traffic.errors[0]}")
    return results


def _waits(watch: Watch, version: int) -> dict[str, Any]:
    """The longest lock wait seen of each kind of call, in ms, and the lock it waited for (pg_stat_activity's
    wait_event: `relation` a table or index lock, `extend` a file extension, `transactionid` a row)."""
    found: dict[str, Any] = {}
    for kind in ("schedule", "claim"):
        seconds, event = watch.waits.get((version, kind), (0.0, ""))
        found[f"{kind}_wait_ms"] = seconds * 1000
        found[f"{kind}_wait_event"] = event
    return found


def _wait(result: dict[str, Any], kind: str) -> str:
    event = result[f"{kind}_wait_event"]
    return f"{result[f'{kind}_wait_ms']:,.0f}" + (f" ({event})" if event else "")


def _row(result: dict[str, Any]) -> str:
    recorded = ", ".join(schema.lock_mode_sql(mode) for mode in result["recorded"]) or "none"
    seen = ", ".join(schema.lock_mode_sql(mode) for mode in result["locks"]) or "none seen"
    return (
        f"| {result['migration']} | {recorded} | {seen} | {_wait(result, 'schedule')}"
        f" | {_wait(result, 'claim')} | {result['schedule_ms']:,.0f} | {result['claim_ms']:,.0f}"
        f" | {result['seconds']:,.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="finished jobs in the table")
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN), help="the server (BENCH_DSN)")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    database = f"jbb_migrate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    target = make_conninfo(args.dsn, dbname=database)
    try:
        build(target, args.rows)
        print(f"\n{args.rows:,} finished jobs, {FUTURE_JOBS:,} queued for tomorrow, schedule {SCHEDULE_PER_SECOND}/s")
        print(
            "| migration | locks on job (recorded) | locks on job (seen) | lock wait of schedule, ms"
            " | lock wait of a claim, ms | longest schedule, ms | longest claim, ms | duration, s |"
        )
        print("|---|---|---|---:|---:|---:|---:|---:|")
        results = run(target)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
    worst = max(results, key=lambda r: max(r["schedule_wait_ms"], r["claim_wait_ms"]))
    waited = max(worst["schedule_wait_ms"], worst["claim_wait_ms"])
    print(f"\nlongest lock wait imposed on schedule or a claim: {waited:,.0f} ms ({worst['migration']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
