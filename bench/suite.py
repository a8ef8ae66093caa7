"""The machinery of `bench/run.py`: the PostgreSQL server, the systems' drivers run as subprocesses,
measurements, and the `Suite` that runs the scenarios every system has (the capacity scenarios,
jobbus's alone, are in `bench/capacity.py`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql

from bench import harness
from jobbus import schema as jobbus_schema

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DB_PREFIX = "jbb_"
DRIVER_TIMEOUT = 900.0


@dataclass(frozen=True)
class Sizes:
    single: int = 2_000
    bulk: int = 10_000
    drain_small: int = 10_000
    drain_large: int = 100_000
    latency: int = 200
    latency_interval: float = 0.02
    finished: int = 1_000_000
    floor: int = 100_000
    bulk_large: int = 100_000
    #: Jobs of the 50-coroutine concurrent enqueue (one App, one job per call).
    concurrent: int = 5_000
    coroutines: int = 50
    #: The capacity scenarios' sizes: 1M queued and 10M finished rows times this (`--scale`).
    scale: float = 0.1
    #: Seconds the retention scenario spends deleting at most.
    retention_budget: float = 120.0


QUICK = Sizes(single=500, drain_large=30_000, latency=100, finished=200_000, floor=30_000, concurrent=2_000, scale=0.02)


#: The flow-control drains: label and the drivers' `--limit` (see bench/harness.py).
#: The batched drain (`Suite.batched`): jobs per call of the batch handler, and the worker concurrencies
#: it is measured at (its best is compared, as the unbatched drain's best setting is).
BATCH_DRAIN_SIZE = 100
BATCH_DRAIN_CONCURRENCIES = (10, 20, 50)
#: The encryption scenario (`Suite.encrypted`): each job's payload, and the two variants (driver `--encrypt`).
ENCRYPTED_PAYLOAD_BYTES = 256
ENCRYPTION_VARIANTS = (("keys off", 0), ("keys on", 1))
LIMITED_DRAINS = [("unlimited", ""), ("queue limit 100", "queue=100"), ("1,000 keys, 1 each", "keys=1000")]
#: Which limits each system has: pgqueuer's entrypoint `concurrency_limit`, procrastinate's `lock`.
#: graphile-worker has no limit per queue, and its named queues (one job at a time each) cannot be drained
#: by `runOnce`: once every job left is in a locked queue it finds none runnable and exits (100 of 2,000
#: jobs in 100 queues, tried with 0.18.0).
LIMITS_SUPPORTED = {
    "jobbus": {"queue", "keys"},
    "pgqueuer": {"queue"},
    "procrastinate": {"keys"},
    "oban": set(),
    "graphile": set(),
}


@dataclass(frozen=True)
class Setting:
    label: str
    concurrency: int
    batch: int = 0


@dataclass
class System:
    name: str
    #: The interpreter the driver runs on: a Python, or node for a Node.js peer.
    runtime: Path
    driver: list[str]
    sweep: list[Setting]
    latency: Setting
    reset_sql: str
    unfinished_sql: str
    #: Largest drain this system gets (a slow peer would take minutes per run otherwise).
    drain_cap: int | None = None
    best: Setting | None = None
    version: str = ""
    #: Scenarios this system takes no part in, and why (the reason becomes a note of the run).
    sits_out: dict[str, str] = field(default_factory=dict)

    def argv(self, op: str, dsn: str, **options: Any) -> list[str]:
        argv = [str(self.runtime), *self.driver, op, "--dsn", dsn]
        for name, value in options.items():
            argv += [f"--{name}", str(value)]
        return argv

    def drain_size(self, wanted: int) -> int:
        return wanted if self.drain_cap is None else min(wanted, self.drain_cap)

    @property
    def best_setting(self) -> Setting:
        return self.best or self.sweep[len(self.sweep) // 2]


@dataclass
class Measurement:
    scenario: str
    system: str
    setting: str
    jobs: int
    metric: str
    unit: str
    values: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        good = [v for v in self.values if not math.isnan(v)]
        return statistics.median(good) if good else math.nan

    @property
    def low(self) -> float:
        return min(self.values, default=math.nan)

    @property
    def high(self) -> float:
        return max(self.values, default=math.nan)


class DriverError(RuntimeError):
    pass


# -- the server ----------------------------------------------------------------------------------------


class Server:
    """The PostgreSQL server at BENCH_DSN: fresh databases, counters, settings."""

    def __init__(
        self, dsn: str, *, quiet_threshold: float | None = 0.35, quiet_wait: float = 20.0, quiet_budget: float = 300.0
    ) -> None:
        self.admin_dsn = dsn
        self.created: set[str] = set()
        self.quiet_threshold = quiet_threshold
        self.quiet_wait = quiet_wait
        #: Total seconds the whole suite may spend waiting for quiet, so a busy machine cannot stall it.
        self.quiet_budget = quiet_budget
        self.load: list[float] = []
        self.busy: list[float] = []
        self.other_active: list[int] = []

    def connect(self, dbname: str | None = None) -> psycopg.Connection[Any]:
        kwargs: dict[str, Any] = {"autocommit": True}
        if dbname:
            kwargs["dbname"] = dbname
        return psycopg.connect(self.admin_dsn, **kwargs)

    def dsn_for(self, dbname: str) -> str:
        """The server DSN with another database, as a URL (asyncpg takes no key=value DSN)."""
        info = psycopg.conninfo.conninfo_to_dict(self.admin_dsn)
        info["dbname"] = dbname
        user = quote(str(info.pop("user", "")), safe="")
        password = info.pop("password", None)
        host = str(info.pop("host", "127.0.0.1"))
        port = info.pop("port", None)
        auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
        if host.startswith("/"):  # a Unix socket directory goes in the query string
            info["host"] = host
            host = ""
        netloc = f"{auth}[{host}]" if ":" in host else f"{auth}{host}"
        netloc += f":{port}" if port else ""
        name = quote(str(info.pop("dbname")), safe="")
        query = urlencode({k: str(v) for k, v in info.items()})
        return f"postgresql://{netloc}/{name}" + (f"?{query}" if query else "")

    def create_database(self, name: str) -> str:
        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.add(name)
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        self.created.discard(name)

    def drop_all(self) -> None:
        for name in sorted(self.created):
            with contextlib.suppress(psycopg.Error):
                self.drop_database(name)

    def counters(self, dbname: str) -> tuple[int, int]:
        """(xact_commit of the database, cluster WAL position in bytes), fresh from the stats system."""
        with self.connect() as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT d.xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn FROM pg_stat_database d WHERE datname = %s",
                (dbname,),
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def sample_noise(self) -> None:
        """Wait (bounded) for the machine to calm down, then note how busy it was, for the doc.

        The machine is shared: other developers' test suites come and go. Between two measurements
        nothing of ours runs, so the CPU busy fraction seen here is everybody else's.
        """
        waited = 0.0
        busy = cpu_busy()
        while (
            self.quiet_threshold is not None
            and busy > self.quiet_threshold
            and waited < min(self.quiet_wait, self.quiet_budget)
        ):
            busy = cpu_busy(1.0)
            waited += 1.0
        self.quiet_budget -= waited
        self.busy.append(busy)
        self.load.append(os.getloadavg()[0])
        with self.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() "
                "AND coalesce(datname, '') NOT LIKE %s",
                (DB_PREFIX + "%",),
            ).fetchone()
        self.other_active.append(int(row[0]) if row else 0)

    def describe(self) -> dict[str, str]:
        names = ["server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers"]
        names += ["max_wal_size", "checkpoint_timeout", "max_connections"]
        values: dict[str, str] = {}
        with self.connect() as conn:
            for name in names:
                row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
                values[name] = str(row[0]) if row else "?"
        return values

    def checkpoint(self) -> None:
        """Write out what a fill left dirty before a drain is timed: the drain then pays neither for the
        fill's pages nor for a timed checkpoint, which starts `checkpoint_timeout` after this one."""
        with self.connect() as conn:
            conn.execute(b"CHECKPOINT")

    def execute(self, dbname: str, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connect(dbname) as conn:
            cursor = conn.execute(query.encode(), params)
            return cursor.fetchall() if cursor.description else []


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The server to measure on and how quiet to wait for: the options of every script that runs a `Server`."""
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN), help="server (default BENCH_DSN)")
    parser.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.35,
        help="before each measurement wait (up to 20 s) until the CPUs are less busy than this (0 to 1; 1 = never)",
    )


def server_from(args: argparse.Namespace) -> Server:
    """The `Server` that `add_server_arguments`' options name."""
    return Server(args.dsn, quiet_threshold=args.quiet_threshold if args.quiet_threshold < 1 else None)


def cpu_busy(seconds: float = 0.5) -> float:
    """Fraction of all CPUs busy (not idle, not iowait) over the next `seconds`, from /proc/stat."""

    def snapshot() -> tuple[int, int]:
        try:
            values = [int(v) for v in Path("/proc/stat").read_text(encoding="utf-8").split("\n", 1)[0].split()[1:9]]
        except OSError:
            return 0, 0
        return sum(values), values[3] + values[4]

    total0, idle0 = snapshot()
    time.sleep(seconds)
    total1, idle1 = snapshot()
    return 1.0 - (idle1 - idle0) / (total1 - total0) if total1 > total0 else math.nan


# -- drivers -------------------------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    prefixes = ("JOBBUS_", "PGQUEUER_", "PROCRASTINATE_", "GRAPHILE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra)
    return env


def run_driver(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float = DRIVER_TIMEOUT
) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            argv, cwd=ROOT, env=env or clean_env(), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise DriverError(f"{' '.join(argv[:4])}: timed out after {timeout:.0f} s") from exc
    return parse_result(argv, proc.returncode, proc.stdout, proc.stderr)


def parse_result(argv: Sequence[str], code: int, stdout: str, stderr: str) -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith(harness.RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(harness.RESULT_PREFIX) :])
            return result
    tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
    raise DriverError(f"{' '.join(str(a) for a in argv[1:4])} exited {code}: {tail}")


def start_process(argv: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with out.open("wb") as handle:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


# -- the suite -----------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Suite:
    def __init__(self, server: Server, systems: list[System], sizes: Sizes, runs: int) -> None:
        self.server = server
        self.systems = systems
        self.sizes = sizes
        self.runs = runs
        self.results: list[Measurement] = []
        self.notes: dict[str, str] = {}
        self._tmp = Path(tempfile.mkdtemp(prefix="jobbus-bench-"))

    # -- bookkeeping

    def record(
        self, scenario: str, system: str, setting: str, jobs: int, metric: str, unit: str, value: float
    ) -> Measurement:
        for m in self.results:
            if (m.scenario, m.system, m.setting, m.jobs, m.metric) == (scenario, system, setting, jobs, metric):
                m.values.append(value)
                return m
        m = Measurement(scenario, system, setting, jobs, metric, unit, [value])
        self.results.append(m)
        return m

    def note(self, scenario: str, system: str, text: str) -> None:
        self.results.append(Measurement(scenario, system, "", 0, "", "", [], text))
        log(f"{scenario} {system}: {text}")

    def find(self, scenario: str, system: str, metric: str, setting: str | None = None) -> Measurement | None:
        for m in self.results:
            same = m.scenario == scenario and m.system == system and m.metric == metric
            if same and m.values and (setting is None or m.setting == setting):
                return m
        return None

    @contextlib.contextmanager
    def databases(self, scenario: str) -> Iterator[dict[str, str]]:
        """A fresh database per system for this scenario, schema installed; dropped afterwards.

        A system that sits the scenario out gets none (and a note saying why).
        """
        names: dict[str, str] = {}
        try:
            for system in list(self.systems):
                if scenario in system.sits_out:
                    self.note(scenario, system.name, f"sits out: {system.sits_out[scenario]}")
                    continue
                name = f"{DB_PREFIX}{os.getpid()}_{scenario}_{system.name}"
                dsn = self.server.create_database(name)
                try:
                    run_driver(system.argv("setup", dsn))
                except DriverError as exc:
                    self.note(scenario, system.name, f"setup failed: {exc}")
                    continue
                names[system.name] = name
            yield names
        finally:
            for name in names.values():
                self.server.drop_database(name)

    def dsn(self, dbname: str) -> str:
        return self.server.dsn_for(dbname)

    def reset(self, system: System, dbname: str) -> None:
        self.server.execute(dbname, system.reset_sql)

    @contextlib.contextmanager
    def guarded(self, scenario: str, system: System) -> Iterator[None]:
        """A failed run becomes a note in the results; the suite goes on."""
        try:
            yield
        except DriverError as exc:
            self.note(scenario, system.name, f"run failed: {exc}")

    # -- scenarios

    def enqueue(self, scenario: str, op: str, jobs: int, **options: Any) -> None:
        with self.databases(scenario) as dbs:
            for run in range(self.runs):
                for system in self.systems:
                    if system.name not in dbs:
                        continue

                    with self.guarded(scenario, system):
                        self.reset(system, dbs[system.name])
                        self.server.sample_noise()
                        result = run_driver(system.argv(op, self.dsn(dbs[system.name]), jobs=jobs, **options))
                        label = "c" + str(options["concurrency"]) if "concurrency" in options else "-"
                        m = self.record(scenario, system.name, label, jobs, "enqueue", "jobs/s", result["rate"])
                        rate = result["rate"]
                        log(f"{scenario} {system.name} run {run + 1}: {rate:,.0f} jobs/s (median {m.median:,.0f})")

    def drain_once(
        self,
        scenario: str,
        system: System,
        dbname: str,
        setting: Setting,
        jobs: int,
        processes: int = 1,
        reset: bool = True,
        limit: str = "",
        around: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        handler_batch: int = 0,
        options: dict[str, Any] | None = None,
    ) -> dict[str, float]:
        """Fill `jobs`, drain them with `processes` workers; returns the figures of this run.

        `limit` (`queue=N` or `keys=N`) and `options` (other driver options) are handed to the drivers' fill
        and drain: see bench/harness.py.
        `around` encloses the drain alone (not the fill), for a meter of what it costs. `worker_cpu` is
        the driver's CPU seconds per job, NaN when it does not read it (and for several processes).
        """
        if reset:
            self.reset(system, dbname)
        dsn = self.dsn(dbname)
        limited = {"limit": limit} if limit else {}
        limited.update(options or {})
        batching = {"handler-batch": handler_batch} if handler_batch else {}
        run_driver(system.argv("fill", dsn, jobs=jobs, **limited))
        self.server.checkpoint()
        self.server.sample_noise()
        commits0, wal0 = self.server.counters(dbname)
        with around():
            if processes == 1:
                argv = system.argv(
                    "drain", dsn, concurrency=setting.concurrency, batch=setting.batch, **limited, **batching
                )
                result = run_driver(argv)
            else:
                result = self.drain_processes(system, dsn, setting, processes)
        time.sleep(0.5)  # backends flush their statistics when they exit
        commits1, wal1 = self.server.counters(dbname)
        count = int(result["count"])
        unfinished = int(self.server.execute(dbname, system.unfinished_sql)[0][0])
        if unfinished or count != jobs:
            self.note(
                scenario, system.name, f"{setting.label}: {count} handler runs for {jobs} jobs, {unfinished} left"
            )
        return {
            "steady": float(result["steady"]),
            "wall": float(result["wall"]),
            "commits": (commits1 - commits0) / max(count, 1),
            "wal": (wal1 - wal0) / max(count, 1),
            "worker_cpu": float(result.get("cpu", math.nan)) / max(count, 1),
        }

    def drain_processes(self, system: System, dsn: str, setting: Setting, processes: int) -> dict[str, Any]:
        """Several worker processes at once; jobbus through its real CLI, peers through their driver."""
        procs: list[tuple[subprocess.Popen[bytes], Path, Path | None]] = []
        started = time.time()
        for index in range(processes):
            out = self._tmp / f"{system.name}-{index}.out"
            if system.name == "jobbus":
                stamps_file = self._tmp / f"stamps-{index}.json"
                stamps_file.unlink(missing_ok=True)
                argv = [str(system.runtime), "-m", "jobbus", "worker", "--app", "bench.apps:app", "--stop-when-empty"]
                argv += ["--concurrency", str(setting.concurrency), "--log-level", "WARNING"]
                env = clean_env(JOBBUS_DSN=dsn, BENCH_STAMPS_FILE=str(stamps_file))
                procs.append((start_process(argv, env, out), out, stamps_file))
            else:
                argv = system.argv("drain", dsn, concurrency=setting.concurrency, batch=setting.batch)
                procs.append((start_process(argv, clean_env(), out), out, None))
        parts: list[dict[str, Any]] = []
        for proc, out, stamps in procs:
            try:
                code = proc.wait(timeout=DRIVER_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise DriverError(f"{system.name} worker timed out") from None
            text = out.read_text(encoding="utf-8", errors="replace")
            if stamps is not None:
                if code != 0 or not stamps.exists():
                    raise DriverError(f"jobbus worker exited {code}: {' | '.join(text.strip().splitlines()[-3:])}")
                parts.append(json.loads(stamps.read_text(encoding="utf-8")))
            else:
                parts.append(parse_result([system.name, "drain"], code, text, text))
        ended = time.time()
        count = sum(int(p["count"]) for p in parts)
        first = min(float(p["first"]) for p in parts if p["count"])
        last = max(float(p["last"]) for p in parts if p["count"])
        return {"count": count, "steady": (count - 1) / (last - first), "wall": count / (ended - started)}

    def drain(self, scenario: str, jobs: int, *, sweep: bool, processes: int = 1) -> None:
        with self.databases(scenario) as dbs:
            for run in range(self.runs):
                for system in self.systems:
                    if system.name not in dbs:
                        continue
                    n = system.drain_size(jobs)
                    if n < jobs and scenario == "drain_100k":
                        if run == 0:
                            self.note(
                                scenario, system.name, f"skipped: a {jobs:,}-job drain takes minutes per run here"
                            )
                        continue
                    for setting in system.sweep if sweep else [system.best_setting]:
                        with self.guarded(scenario, system):
                            figures = self.drain_once(scenario, system, dbs[system.name], setting, n, processes)
                            self.record_drain(scenario, system, setting, n, figures, run)
        if sweep:
            for system in self.systems:
                best = max(
                    (
                        m
                        for m in self.results
                        if m.scenario == scenario and m.system == system.name and m.metric == "steady"
                    ),
                    key=lambda m: m.median,
                    default=None,
                )
                if best is not None:
                    system.best = next(s for s in system.sweep if s.label == best.setting)
                    log(f"{system.name}: best drain setting {best.setting} ({best.median:,.0f} jobs/s)")

    def record_drain(
        self, scenario: str, system: System, setting: Setting, n: int, figures: dict[str, float], run: int
    ) -> None:
        steady = self.record(scenario, system.name, setting.label, n, "steady", "jobs/s", figures["steady"])
        self.record(scenario, system.name, setting.label, n, "wall", "jobs/s", figures["wall"])
        self.record(scenario, system.name, setting.label, n, "commits", "commits/job", figures["commits"])
        self.record(scenario, system.name, setting.label, n, "wal", "WAL bytes/job", figures["wal"])
        log(
            f"{scenario} {system.name} {setting.label} run {run + 1}: {figures['steady']:,.0f} jobs/s steady, "
            f"{figures['wall']:,.0f} wall, {figures['commits']:.3f} commits/job, {figures['wal']:,.0f} WAL B/job "
            f"(median {steady.median:,.0f})"
        )

    def latency(self) -> None:
        sizes = self.sizes
        with self.databases("latency") as dbs:
            for run in range(self.runs):
                for system in self.systems:
                    if system.name not in dbs:
                        continue

                    with self.guarded("latency", system):
                        self.reset(system, dbs[system.name])
                        self.server.sample_noise()
                        argv = system.argv(
                            "latency",
                            self.dsn(dbs[system.name]),
                            jobs=sizes.latency,
                            interval=sizes.latency_interval,
                            concurrency=system.latency.concurrency,
                            batch=system.latency.batch,
                        )
                        result = run_driver(argv)
                        label = system.latency.label
                        for metric in ("p50", "p95", "p99"):
                            self.record("latency", system.name, label, sizes.latency, metric, "ms", result[metric])
                        if result["count"] != sizes.latency:
                            self.note("latency", system.name, f"{result['count']} of {sizes.latency} jobs started")
                        log(
                            f"latency {system.name} run {run + 1}: p50 {result['p50']:.2f} p95 {result['p95']:.2f} "
                            f"p99 {result['p99']:.2f} ms"
                        )

    def finished(self) -> None:
        """Drain with 1M finished rows present; the empty-table figure comes from drain_100k/10k."""
        sizes = self.sizes
        with self.databases("finished_1m") as dbs:
            for system in self.systems:
                if system.name not in dbs:
                    continue
                log(f"finished_1m {system.name}: inserting {sizes.finished:,} finished rows")
                try:
                    seeded = run_driver(system.argv("seed_finished", self.dsn(dbs[system.name]), jobs=sizes.finished))
                    log(f"finished_1m {system.name}: seeded in {seeded['seconds']:.1f} s")
                except DriverError as exc:
                    self.note("finished_1m", system.name, f"seeding failed: {exc}")
                    del dbs[system.name]
            for run in range(self.runs):
                for system in self.systems:
                    if system.name not in dbs:
                        continue
                    setting, n = system.best_setting, system.drain_size(sizes.drain_large)

                    with self.guarded("finished_1m", system):
                        figures = self.drain_once("finished_1m", system, dbs[system.name], setting, n, reset=False)
                        self.record_drain("finished_1m", system, setting, n, figures, run)

    def limited(self) -> None:
        """Drains of a queue with a fleet-wide limit of 100 and of 1,000 keys run one at a time each,
        beside the same drain unlimited, for each system that has the feature."""
        jobs = self.sizes.drain_small
        with self.databases("drain_limited") as dbs:
            for run in range(self.runs):
                for system in self.systems:
                    if system.name not in dbs:
                        continue
                    for label, limit in LIMITED_DRAINS:
                        if limit and limit.split("=")[0] not in LIMITS_SUPPORTED[system.name]:
                            if run == 0:
                                self.note("drain_limited", system.name, f"{label}: no equivalent feature")
                            continue
                        best = system.best_setting
                        setting = Setting(f"{label} ({best.label})", best.concurrency, best.batch)
                        with self.guarded("drain_limited", system):
                            n = system.drain_size(jobs)
                            dbname = dbs[system.name]
                            figures = self.drain_once("drain_limited", system, dbname, setting, n, limit=limit)
                            self.record_drain("drain_limited", system, setting, n, figures, run)

    def batched(self) -> None:
        """jobbus's drain of `drain_large` no-op jobs by a batch handler (`BATCH_DRAIN_SIZE` jobs a call)
        at each of `BATCH_DRAIN_CONCURRENCIES`, beside the same drain by a handler of one job at jobbus's
        best setting, interleaved run by run, on one database. A large drain, so that the steady window
        holds many waves of batches and start to exit is not mostly start-up."""
        jobs = self.sizes.drain_large
        with self.databases("drain_batched") as dbs:
            for run in range(self.runs):
                for system in self.systems:
                    if system.name != "jobbus" or system.name not in dbs:
                        continue
                    best = system.best_setting
                    settings = [(Setting(f"one job a call ({best.label})", best.concurrency, best.batch), 0)]
                    settings += [
                        (Setting(f"batch {BATCH_DRAIN_SIZE} (c{c})", c, best.batch), BATCH_DRAIN_SIZE)
                        for c in BATCH_DRAIN_CONCURRENCIES
                    ]
                    for setting, handler_batch in settings:
                        with self.guarded("drain_batched", system):
                            n = system.drain_size(jobs)
                            figures = self.drain_once(
                                "drain_batched", system, dbs[system.name], setting, n, handler_batch=handler_batch
                            )
                            self.record_drain("drain_batched", system, setting, n, figures, run)

    def encrypted(self) -> None:
        """jobbus with and without an encryption key, interleaved run by run on one database: one call per
        job (`single`), a bulk call (`bulk`) and a drain (`drain_large`, best setting), every job's
        configuration `ENCRYPTED_PAYLOAD_BYTES` characters of text, so that both variants carry the same
        payload and the key's run seals and opens every one of them."""
        with self.databases("encryption") as dbs:
            for run in range(self.runs):
                for system in self.systems:
                    if system.name == "jobbus" and system.name in dbs:
                        for label, encrypt in ENCRYPTION_VARIANTS:
                            with self.guarded("encryption", system):
                                self._encryption_run(system, dbs[system.name], label, encrypt, run)

    def _encryption_run(self, system: System, dbname: str, label: str, encrypt: int, run: int) -> None:
        options = {"payload-bytes": ENCRYPTED_PAYLOAD_BYTES, "encrypt": encrypt}
        dsn = self.dsn(dbname)
        for op, jobs in (("enqueue_single", self.sizes.single), ("enqueue_bulk", self.sizes.bulk)):
            self.reset(system, dbname)
            self.server.sample_noise()
            rate = run_driver(system.argv(op, dsn, jobs=jobs, **options))["rate"]
            m = self.record("encryption", system.name, f"{label}, {op}", jobs, "enqueue", "jobs/s", rate)
            log(f"encryption {label} {op} run {run + 1}: {rate:,.0f} jobs/s (median {m.median:,.0f})")
        best = system.best_setting
        setting = Setting(f"{label}, drain ({best.label})", best.concurrency, best.batch)
        n = system.drain_size(self.sizes.drain_large)
        figures = self.drain_once("encryption", system, dbname, setting, n, options=options)
        self.record_drain("encryption", system, setting, n, figures, run)

    def floor(self) -> None:
        """The SQL floor: claim 100 rows per statement, complete them with one UPDATE, one connection."""
        n = self.sizes.floor
        name = f"{DB_PREFIX}{os.getpid()}_floor"
        self.server.create_database(name)
        try:
            with self.server.connect(name) as conn:
                jobbus_schema.migrate(conn, "jobbus")
                conn.execute(FLOOR_MINIMAL_DDL)
            for run in range(self.runs):
                for variant in FLOOR_VARIANTS:
                    self.server.sample_noise()
                    with self.server.connect(name) as conn:
                        rate = floor_loop(conn, variant, n)
                    m = self.record("floor", "SQL", variant.label, n, "steady", "jobs/s", rate)
                    log(f"floor {variant.label} run {run + 1}: {rate:,.0f} jobs/s (median {m.median:,.0f})")
        finally:
            self.server.drop_database(name)


FLOOR_MINIMAL_DDL = """
CREATE TABLE floor_job (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL DEFAULT '{}',
    finished_at timestamptz
);
CREATE INDEX floor_job_queued_idx ON floor_job (id) WHERE status = 'queued';
"""


@dataclass(frozen=True)
class FloorVariant:
    label: str
    seed: list[str]
    claim: str
    complete: str


FLOOR_VARIANTS = [
    # One queue and one type, so the claim walks job_queue_claim_idx as the worker's claim does (since
    # migration 0006 dropped job_claim_idx, a claim without them sorted every queued row: 1,871 jobs/s).
    FloorVariant(
        "jobbus schema, fenced",
        [
            "TRUNCATE jobbus.job",
            "INSERT INTO jobbus.job (id, type, max_attempts) "
            "SELECT jobbus.uuid_generate_v7(), 'bench.noop', 3 FROM generate_series(1, %(n)s)",
            "ANALYZE jobbus.job",
        ],
        """
        WITH next AS (
            SELECT id FROM jobbus.job
            WHERE status = 'queued' AND queue = 'default' AND type = 'bench.noop' AND available_at <= now()
            ORDER BY priority DESC, available_at, id
            LIMIT 100
            FOR UPDATE SKIP LOCKED
        )
        UPDATE jobbus.job AS j
        SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
            lease_expires_at = now() + interval '5 minutes', started_at = now()
        FROM next WHERE j.id = next.id
        RETURNING j.id, j.type, j.configuration_data, j.attempts, j.max_attempts, j.lease_token
        """,
        """
        UPDATE jobbus.job AS j
        SET status = 'completed', finished_at = now(), lease_token = NULL, lease_expires_at = NULL
        FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS o(id, token)
        WHERE j.id = o.id AND j.lease_token = o.token AND j.status = 'running'
        """,
    ),
    FloorVariant(
        "minimal table",
        [
            "TRUNCATE floor_job",
            "INSERT INTO floor_job (payload) SELECT '{}' FROM generate_series(1, %(n)s)",
            "ANALYZE floor_job",
        ],
        """
        WITH next AS (
            SELECT id FROM floor_job WHERE status = 'queued' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
        )
        UPDATE floor_job AS f SET status = 'running' FROM next WHERE f.id = next.id
        RETURNING f.id, f.payload
        """,
        "UPDATE floor_job SET status = 'done', finished_at = now() WHERE id = ANY(%(ids)s)",
    ),
]


def floor_loop(conn: psycopg.Connection[Any], variant: FloorVariant, n: int) -> float:
    """Claim and complete until the table is empty; the rate over all `n` jobs.

    Autocommit, so two commits per 100 jobs; both statements are prepared.
    """
    for statement in variant.seed:
        conn.execute(statement.encode(), {"n": n} if "%(n)s" in statement else None)
    done = 0
    started = time.perf_counter()
    while True:
        rows = conn.execute(variant.claim.encode(), prepare=True).fetchall()
        if not rows:
            break
        params = {"ids": [row[0] for row in rows], "tokens": [row[-1] for row in rows]}
        conn.execute(variant.complete.encode(), params, prepare=True)
        done += len(rows)
    elapsed = time.perf_counter() - started
    if done != n:
        raise RuntimeError(f"SQL floor: drained {done} of {n} rows")
    return n / elapsed
