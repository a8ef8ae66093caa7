"""The capacity scenarios of `bench/run.py`: what one PostgreSQL carries, and what does not slow it down.

    .venv/bin/python bench/run.py --scenario drain_procs --scenario backlog --scenario retention --systems jobbus
    make bench-capacity                                   # the same at full size (--scale 1)

- `drain_procs`: one backlog drained by 1, 2 and 4 worker processes (the real CLI), with the
  database's CPU (its backends for the scenario's database, read from /proc: the server runs on this
  machine), the workers' CPU, commits and WAL per job: where the drain saturates.
- `backlog`: claim latency (the claim statement alone, one job per claim, as a worker issues it) and a
  one-process drain against four tables: clean; 1M queued jobs in a paused queue; 1M queued jobs of a
  type no worker serves; 10M finished rows. Sizes times `--scale`. Rows are loaded by `INSERT ...
  SELECT generate_series` (never the API), then `VACUUM ANALYZE` stands in for autovacuum.
- `retention`: 10M finished rows (times `--scale`) deleted by the cleaner's own batched statement
  (`delete_finished_jobs`, batches of 1,000, oldest first) for at most `--retention-budget` seconds,
  then `VACUUM`; against the same rows in a partition of a table partitioned by `finished_at`,
  removed by `DETACH PARTITION` + `DROP TABLE`. Rows/s, the backend's CPU per row, WAL per row.

CPU is read from /proc/<pid>/stat (utime + stime) of the server processes, so these scenarios need
the server on this machine; elsewhere they record no CPU figures.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import harness
from bench.suite import DB_PREFIX, Suite, System, clean_env, parse_result, run_driver

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROCESS_COUNTS = (1, 2, 4)
#: Claims timed per table (each claims one job, as a worker with one free slot does).
CLAIMS = 400
#: The cleaner's batch (worker/services/cleaner.py).
RETENTION_BATCH = 1000


# -- CPU of the server's processes -------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process, in seconds; None when it is gone or not on this machine."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class DatabaseCpu:
    """CPU seconds the server spends for one database: its backends, sampled every `interval`.

    A backend's CPU is read until it exits; its last `interval` of work before exit can be lost (a
    worker's pool closes at the end of a drain, when it has nothing left to do). The WAL writer and
    the checkpointer work for the whole cluster and are counted apart (`background`).
    """

    QUERY = """
        SELECT pid, datname = %(db)s FROM pg_stat_activity
        WHERE datname = %(db)s OR backend_type IN ('walwriter', 'checkpointer', 'background writer')
    """

    def __init__(self, admin_dsn: str, dbname: str, interval: float = 0.2) -> None:
        self.admin_dsn = admin_dsn
        self.dbname = dbname
        self.interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._ours: dict[int, bool] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = True

    def _sample(self, conn: psycopg.Connection[Any], initial: bool) -> None:
        for pid, ours in conn.execute(self.QUERY, {"db": self.dbname}).fetchall():
            cpu = process_cpu_seconds(int(pid))
            if cpu is None:
                self.available = self.available and not initial
                continue
            self._first.setdefault(pid, cpu if initial else 0.0)
            self._last[pid] = cpu
            self._ours[pid] = bool(ours)

    def _loop(self, conn: psycopg.Connection[Any]) -> None:
        with conn:
            while not self._stop.wait(self.interval):
                self._sample(conn, initial=False)
            self._sample(conn, initial=False)

    def start(self) -> None:
        conn = psycopg.connect(self.admin_dsn, autocommit=True)
        self._sample(conn, initial=True)
        self._thread = threading.Thread(target=self._loop, args=(conn,), daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float, float]:
        """(seconds of the database's backends, seconds of the cluster's WAL writer/checkpointer/bgwriter)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        ours = sum(self._last[p] - self._first[p] for p in self._last if self._ours[p])
        background = sum(self._last[p] - self._first[p] for p in self._last if not self._ours[p])
        return ours, background


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_ticks() -> tuple[int, int]:
    """(all ticks, idle + iowait ticks) of every CPU, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0].split()[1:9]]
    return sum(values), values[3] + values[4]


@dataclass
class CpuReading:
    seconds: float
    db: float
    background: float
    workers: float
    machine_busy: float  # fraction of all CPUs


@contextmanager
def cpu_meter(
    admin_dsn: str, dbname: str, readings: list[CpuReading] | None = None, *, interval: float = 0.2
) -> Iterator[list[CpuReading]]:
    """Measures the enclosed block; the reading is appended to the yielded list (`readings` when given) on
    exit. The database's backends are read every `interval` seconds (what one does after its last reading
    before it exits is lost)."""
    readings = [] if readings is None else readings
    meter = DatabaseCpu(admin_dsn, dbname, interval)
    meter.start()
    children0, (total0, idle0) = children_cpu_seconds(), machine_ticks()
    started = time.perf_counter()
    try:
        yield readings
    finally:
        elapsed = time.perf_counter() - started
        db, background = meter.stop()
        total1, idle1 = machine_ticks()
        busy = 1.0 - (idle1 - idle0) / (total1 - total0) if total1 > total0 else float("nan")
        readings.append(CpuReading(elapsed, db, background, children_cpu_seconds() - children0, busy))


# -- loading rows directly ---------------------------------------------------------------------------

SEED_QUEUED = """
INSERT INTO jobbus.job (id, type, queue, max_attempts)
SELECT jobbus.uuid_generate_v7(), %(type)s, %(queue)s, 3 FROM generate_series(1, %(jobs)s)
"""

SEED_FINISHED = """
INSERT INTO jobbus.job (id, type, queue, status, configuration_data, attempts, max_attempts,
                        available_at, created_at, started_at, finished_at)
SELECT jobbus.uuid_generate_v7(), %(type)s, 'default', 'completed', '{}', 1, 3,
       now() - make_interval(secs => n), now() - make_interval(secs => n), now() - make_interval(secs => n),
       now() - make_interval(secs => n)
FROM generate_series(1, %(jobs)s) AS n
"""

#: Rows per INSERT when loading, so that a 10M load is many moderate transactions.
SEED_CHUNK = 1_000_000


def seed(conn: psycopg.Connection[Any], statement: str, jobs: int, **params: Any) -> float:
    """Load `jobs` rows in chunks, then VACUUM ANALYZE (autovacuum's stand-in); returns the seconds taken."""
    started = time.perf_counter()
    left = jobs
    while left > 0:
        chunk = min(left, SEED_CHUNK)
        conn.execute(statement.encode(), {"jobs": chunk, **params})
        left -= chunk
    conn.execute("VACUUM ANALYZE jobbus.job")
    return time.perf_counter() - started


# -- the scenarios -----------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True, file=sys.stderr)


def jobbus_of(suite: Suite) -> System | None:
    return next((s for s in suite.systems if s.name == "jobbus"), None)


@contextmanager
def jobbus_database(suite: Suite, system: System, label: str) -> Iterator[str]:
    """A fresh database with the jobbus schema; its name. Dropped afterwards."""
    name = f"{DB_PREFIX}{os.getpid()}_{label}"
    dsn = suite.server.create_database(name)
    try:
        run_driver(system.argv("setup", dsn))
        yield name
    finally:
        suite.server.drop_database(name)


def drain_processes(suite: Suite) -> None:
    """One backlog, drained by 1, 2 and 4 worker processes: rate, and the CPU and I/O behind it."""
    system = jobbus_of(suite)
    if system is None:
        return
    jobs, setting, scenario = suite.sizes.drain_large, system.best_setting, "drain_procs"
    with jobbus_database(suite, system, scenario) as db:
        dsn = suite.dsn(db)
        for run in range(suite.runs):
            for processes in PROCESS_COUNTS:
                with suite.guarded(scenario, system):
                    suite.reset(system, db)
                    run_driver(system.argv("fill", dsn, jobs=jobs))
                    suite.server.execute(db, "VACUUM ANALYZE jobbus.job")
                    suite.server.checkpoint()
                    suite.server.sample_noise()
                    load = os.getloadavg()[0]
                    commits0, wal0 = suite.server.counters(db)
                    with cpu_meter(suite.server.admin_dsn, db) as readings:
                        result = suite.drain_processes(system, dsn, setting, processes)
                    time.sleep(0.5)
                    commits1, wal1 = suite.server.counters(db)
                    count = int(result["count"])
                    if count != jobs:
                        suite.note(scenario, system.name, f"{processes} processes: {count} handler runs for {jobs}")
                    cpu = readings[0]
                    label = f"{processes} proc × {setting.label}"
                    figures = {
                        ("steady", "jobs/s"): float(result["steady"]),
                        ("commits", "commits/job"): (commits1 - commits0) / max(count, 1),
                        ("wal", "WAL bytes/job"): (wal1 - wal0) / max(count, 1),
                        ("db cpu", "cpu ms/job"): cpu.db * 1000 / max(count, 1),
                        ("worker cpu", "cpu ms/job"): cpu.workers * 1000 / max(count, 1),
                        # CPU per job times the steady rate: the cores each side uses while the drain runs.
                        ("db cores", "cores"): cpu.db / max(count, 1) * float(result["steady"]),
                        ("worker cores", "cores"): cpu.workers / max(count, 1) * float(result["steady"]),
                        ("wal writer etc.", "cores"): cpu.background / cpu.seconds,
                        ("machine busy", "fraction"): cpu.machine_busy,
                        ("load1 before", "load"): load,
                    }
                    for (metric, unit), value in figures.items():
                        suite.record(scenario, system.name, label, jobs, metric, unit, value)
                    m = suite.find(scenario, system.name, "steady", label)
                    assert m is not None
                    shown = ", ".join(f"{metric} {value:,.3f}" for (metric, _), value in figures.items())
                    log(f"{scenario} {processes} proc run {run + 1}: {shown} (median {m.median:,.0f} jobs/s)")


@dataclass(frozen=True)
class Backlog:
    label: str
    seed_sql: str
    rows: int
    params: dict[str, str]
    paused_queue: str | None = None


def backlogs(scale: float) -> list[Backlog]:
    queued, finished = int(1_000_000 * scale), int(10_000_000 * scale)
    return [
        Backlog("clean", "", 0, {}),
        Backlog(
            f"{queued:,} in a paused queue", SEED_QUEUED, queued, {"type": harness.NOOP, "queue": "paused"}, "paused"
        ),
        Backlog(f"{queued:,} of an unserved type", SEED_QUEUED, queued, {"type": "bench.unserved", "queue": "default"}),
        Backlog(f"{finished:,} finished", SEED_FINISHED, finished, {"type": harness.NOOP}),
    ]


CLAIM_ONE = """
SELECT id FROM jobbus.claim_jobs('bench-probe', 1, ARRAY['default'], ARRAY[%(type)s], 300, 1048576, '{}')
"""


@dataclass
class ClaimProbe:
    claim_ms: list[float]
    pairs_ms: list[float]
    #: CPU of the probing backend per poll (queued_pairs() and one claim), from /proc; NaN elsewhere.
    backend_cpu_ms: float
    #: Median shared buffers (hit + read) per claim, from EXPLAIN (ANALYZE, BUFFERS) of the claim: the
    #: work it does, which the machine's load does not change.
    buffers: float


EXPLAIN_CLAIM = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_ONE
EXPLAINED = 20


def time_claims(conn: psycopg.Connection[Any], claims: int) -> ClaimProbe:
    """`claims` polls as a worker with one free slot makes them (queued_pairs(), then a claim of one job),
    each timed, in autocommit; then `EXPLAINED` claims under EXPLAIN for the buffers they touch."""
    conn.execute(SEED_QUEUED.encode(), {"type": harness.NOOP, "queue": "default", "jobs": claims + EXPLAINED})
    pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
    claim_ms, pairs_ms = [], []
    cpu0 = process_cpu_seconds(pid)
    for _ in range(claims):
        t0 = time.perf_counter()
        conn.execute(b"SELECT queue, type FROM jobbus.queued_pairs()", prepare=True).fetchall()
        t1 = time.perf_counter()
        rows = conn.execute(CLAIM_ONE.encode(), {"type": harness.NOOP}, prepare=True).fetchall()
        t2 = time.perf_counter()
        if len(rows) != 1:
            raise RuntimeError(f"probe claim returned {len(rows)} rows")
        pairs_ms.append((t1 - t0) * 1000)
        claim_ms.append((t2 - t1) * 1000)
    cpu1 = process_cpu_seconds(pid)
    cpu_ms = (cpu1 - cpu0) * 1000 / claims if cpu0 is not None and cpu1 is not None else float("nan")
    buffers = []
    for _ in range(EXPLAINED):
        plan = conn.execute(EXPLAIN_CLAIM.encode(), {"type": harness.NOOP}).fetchone()[0][0]["Plan"]  # type: ignore[index]
        buffers.append(float(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]))
    return ClaimProbe(claim_ms, pairs_ms, cpu_ms, statistics.median(buffers))


CLEAN_UP = """
DELETE FROM jobbus.job WHERE created_at >= %(mark)s AND queue = 'default' AND type = %(type)s
"""


def backlog(suite: Suite) -> None:
    """Claim latency and drain rate against a clean table and three backlogs the worker cannot take."""
    system = jobbus_of(suite)
    if system is None:
        return
    scenario, scale = "backlog", suite.sizes.scale
    jobs, setting = suite.sizes.drain_large, system.best_setting
    dbs: dict[str, tuple[str, Any]] = {}
    try:
        for index, case in enumerate(backlogs(scale)):
            db = f"{DB_PREFIX}{os.getpid()}_{scenario}{index}"
            dsn = suite.server.create_database(db)
            run_driver(system.argv("setup", dsn))
            with suite.server.connect(db) as conn:
                if case.rows:
                    log(f"{scenario}: loading {case.label}")
                    seconds = seed(conn, case.seed_sql, case.rows, **case.params)
                    suite.record(scenario, "jobbus", case.label, case.rows, "load", "rows/s", case.rows / seconds)
                    log(f"{scenario}: loaded {case.rows:,} rows in {seconds:.1f} s")
                else:
                    conn.execute("VACUUM ANALYZE jobbus.job")
                if case.paused_queue:
                    conn.execute(
                        "INSERT INTO jobbus.pause (target_kind, target) VALUES ('queue', %s)", (case.paused_queue,)
                    )
                mark = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            dbs[case.label] = (db, mark)
        for run in range(suite.runs):
            for case in backlogs(scale):
                db, mark = dbs[case.label]
                with suite.guarded(scenario, system):
                    suite.server.sample_noise()
                    load = os.getloadavg()[0]
                    with suite.server.connect(db) as conn:
                        probe = time_claims(conn, CLAIMS)
                        conn.execute(CLEAN_UP.encode(), {"mark": mark, "type": harness.NOOP})
                    claim_ms, pairs_ms = probe.claim_ms, probe.pairs_ms
                    p50 = statistics.median(claim_ms)
                    suite.record(scenario, "jobbus", case.label, case.rows, "claim p50", "ms", p50)
                    suite.record(scenario, "jobbus", case.label, case.rows, "claim p99", "ms",
                                 harness.percentile(claim_ms, 0.99))  # fmt: skip
                    suite.record(scenario, "jobbus", case.label, case.rows, "pairs p50", "ms",
                                 statistics.median(pairs_ms))  # fmt: skip
                    suite.record(scenario, "jobbus", case.label, case.rows, "poll backend cpu", "ms",
                                 probe.backend_cpu_ms)  # fmt: skip
                    suite.record(scenario, "jobbus", case.label, case.rows, "claim buffers", "blocks", probe.buffers)
                    dsn = suite.dsn(db)
                    run_driver(system.argv("fill", dsn, jobs=jobs))
                    suite.server.checkpoint()
                    suite.server.sample_noise()
                    result = run_driver(system.argv("drain", dsn, concurrency=setting.concurrency, batch=0))
                    with suite.server.connect(db) as conn:
                        conn.execute(CLEAN_UP.encode(), {"mark": mark, "type": harness.NOOP})
                        conn.execute("VACUUM jobbus.job")
                    steady = float(result["steady"])
                    m = suite.record(scenario, "jobbus", case.label, case.rows, "steady", "jobs/s", steady)
                    suite.record(scenario, "jobbus", case.label, case.rows, "load1 before", "load", load)
                    if int(result["count"]) != jobs:
                        suite.note(scenario, "jobbus", f"{case.label}: {result['count']} handler runs for {jobs}")
                    log(
                        f"{scenario} {case.label} run {run + 1}: claim p50 {p50:.2f} ms, {probe.buffers:.0f} buffers, "
                        f"poll cpu {probe.backend_cpu_ms:.3f} ms, pairs p50 "
                        f"{statistics.median(pairs_ms):.2f} ms, drain {steady:,.0f} jobs/s (median {m.median:,.0f}), "
                        f"load {load:.2f}"
                    )
    finally:
        for db, _ in dbs.values():
            suite.server.drop_database(db)


#: The same rows in one partition of a table partitioned by finished_at, indexed like the job table's
#: finished rows (primary key, job_finished_idx).
PARTITIONED_DDL = [
    "CREATE TABLE finished_part (LIKE jobbus.job INCLUDING DEFAULTS) PARTITION BY RANGE (finished_at)",
    "CREATE TABLE finished_part_old PARTITION OF finished_part FOR VALUES FROM (MINVALUE) TO (MAXVALUE)",
    "CREATE INDEX ON finished_part (id)",
    "CREATE INDEX ON finished_part (finished_at)",
]


def retention(suite: Suite) -> None:
    """Batched retention DELETE against dropping a partition holding the same rows."""
    system = jobbus_of(suite)
    if system is None:
        return
    scenario = "retention"
    rows = int(10_000_000 * suite.sizes.scale)
    budget = suite.sizes.retention_budget
    with jobbus_database(suite, system, scenario) as db:
        measure_retention(suite, db, rows, budget)


def measure_retention(suite: Suite, db: str, rows: int, budget: float) -> None:
    scenario = "retention"
    with suite.server.connect(db) as conn:
        log(f"{scenario}: loading {rows:,} finished rows")
        seconds = seed(conn, SEED_FINISHED, rows, type=harness.NOOP)
        suite.record(scenario, "jobbus", "load", rows, "load", "rows/s", rows / seconds)
        log(f"{scenario}: loaded in {seconds:.1f} s; copying them into a partition")
        for statement in PARTITIONED_DDL:
            conn.execute(statement.encode())
        conn.execute("INSERT INTO finished_part SELECT * FROM jobbus.job")
        conn.execute("VACUUM ANALYZE finished_part")
        table_mib = conn.execute("SELECT pg_total_relation_size('jobbus.job') / 1048576.0").fetchone()[0]  # type: ignore[index]
        suite.record(scenario, "jobbus", "table", rows, "job table + indexes", "MiB", float(table_mib))

        suite.server.sample_noise()
        load = os.getloadavg()[0]
        suite.record(scenario, "jobbus", "load", rows, "load1 before", "load", load)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        cpu0, wal0, t0 = process_cpu_seconds(pid), wal(conn), time.perf_counter()
        conn.execute("ALTER TABLE finished_part DETACH PARTITION finished_part_old")
        conn.execute("DROP TABLE finished_part_old")
        t1, cpu1, wal1 = time.perf_counter(), process_cpu_seconds(pid), wal(conn)
        suite.record(scenario, "jobbus", "DETACH + DROP partition", rows, "seconds", "s", t1 - t0)
        suite.record(scenario, "jobbus", "DETACH + DROP partition", rows, "WAL", "bytes", wal1 - wal0)
        if cpu0 is not None and cpu1 is not None:
            suite.record(scenario, "jobbus", "DETACH + DROP partition", rows, "backend cpu", "s", cpu1 - cpu0)
        log(f"{scenario}: DETACH + DROP of {rows:,} rows: {t1 - t0:.3f} s, {wal1 - wal0:,} WAL bytes")

        deleted = 0
        for label, statement in RETENTION_STATEMENTS:
            deleted += timed_deletes(suite, conn, pid, label, statement, rows - deleted, budget)
        cpu0, wal0, t0 = process_cpu_seconds(pid), wal(conn), time.perf_counter()
        conn.execute("VACUUM jobbus.job")
        t1, cpu1, wal1 = time.perf_counter(), process_cpu_seconds(pid), wal(conn)
        suite.record(scenario, "jobbus", "VACUUM after the DELETE", deleted, "seconds", "s", t1 - t0)
        suite.record(scenario, "jobbus", "VACUUM after the DELETE", deleted, "rows/s", "rows/s",
                     deleted / (t1 - t0))  # fmt: skip
        if cpu0 is not None and cpu1 is not None:
            suite.record(
                scenario, "jobbus", "VACUUM after the DELETE", deleted, "backend cpu", "cpu ms/job",
                (cpu1 - cpu0) * 1000 / max(deleted, 1),
            )  # fmt: skip
        log(f"{scenario}: VACUUM after deleting {deleted:,} rows: {t1 - t0:.1f} s")


#: The leader's cleaner: `delete_finished_jobs` deletes `WHERE id = ANY(ARRAY(...))` (migration 0011),
#: which keeps the primary key's index scan whatever the planner estimates, and runs without JIT
#: (migration 0018).
RETENTION_STATEMENTS = [
    (f"DELETE, batches of {RETENTION_BATCH:,} (delete_finished_jobs)",
     "SELECT jobbus.delete_finished_jobs('completed', 0, %(limit)s)"),
]  # fmt: skip


def timed_deletes(
    suite: Suite, conn: psycopg.Connection[Any], pid: int, label: str, statement: str, rows: int, budget: float
) -> int:
    """Deletes in batches of RETENTION_BATCH for at most `budget` seconds; records and returns the rows deleted."""
    scenario = "retention"
    deleted, batch_ms = 0, []
    cpu0, wal0, t0 = process_cpu_seconds(pid), wal(conn), time.perf_counter()
    while time.perf_counter() - t0 < budget:
        b0 = time.perf_counter()
        n = int(conn.execute(statement.encode(), {"limit": RETENTION_BATCH}, prepare=True).fetchone()[0])  # type: ignore[index]
        batch_ms.append((time.perf_counter() - b0) * 1000)
        deleted += n
        if n < RETENTION_BATCH:
            break
    t1, cpu1, wal1 = time.perf_counter(), process_cpu_seconds(pid), wal(conn)
    suite.record(scenario, "jobbus", label, rows, "rows/s", "rows/s", deleted / (t1 - t0))
    suite.record(scenario, "jobbus", label, rows, "rows deleted", "rows", deleted)
    suite.record(scenario, "jobbus", label, rows, "batch p50", "ms", statistics.median(batch_ms))
    suite.record(scenario, "jobbus", label, rows, "batch max", "ms", max(batch_ms))
    suite.record(scenario, "jobbus", label, rows, "WAL (cluster-wide)", "bytes/row", (wal1 - wal0) / max(deleted, 1))
    if cpu0 is not None and cpu1 is not None:
        cpu_per_row = (cpu1 - cpu0) / max(deleted, 1)
        suite.record(scenario, "jobbus", label, rows, "backend cpu", "cpu ms/job", cpu_per_row * 1000)
        suite.record(scenario, "jobbus", label, rows, "cores at 1,000 rows/s", "cores", cpu_per_row * 1000)
    log(
        f"{scenario}: {label}: {deleted:,} of {rows:,} rows in {t1 - t0:.1f} s ({deleted / (t1 - t0):,.0f} rows/s, "
        f"batch p50 {statistics.median(batch_ms):.1f} ms, {(wal1 - wal0) / max(deleted, 1):,.0f} WAL B/row)"
    )
    return deleted


def wal(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]


def enqueue_processes(suite: Suite, processes: int = 4) -> None:
    """`processes` producer processes at once, each scheduling one job per call; the pooled rate."""
    scenario, jobs = "enqueue_4proc", suite.sizes.single
    with suite.databases(scenario) as dbs:
        for run in range(suite.runs):
            for system in suite.systems:
                if system.name not in dbs:
                    continue
                with suite.guarded(scenario, system):
                    suite.reset(system, dbs[system.name])
                    suite.server.sample_noise()
                    start_at = time.time() + 4.0  # every process imported and warmed up by then
                    argv = system.argv(
                        "enqueue_single", suite.dsn(dbs[system.name]), jobs=jobs, **{"start-at": start_at}
                    )
                    procs = [
                        subprocess.Popen(
                            argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                        )
                        for _ in range(processes)
                    ]
                    parts = []
                    for proc in procs:
                        out, err = proc.communicate(timeout=600)
                        parts.append(parse_result(argv, proc.returncode, out, err))
                    started = min(float(p["started"]) for p in parts)
                    ended = max(float(p["ended"]) for p in parts)
                    rate = processes * jobs / (ended - started)
                    label = f"{processes} processes"
                    m = suite.record(scenario, system.name, label, processes * jobs, "enqueue", "jobs/s", rate)
                    log(f"{scenario} {system.name} run {run + 1}: {rate:,.0f} jobs/s (median {m.median:,.0f})")
