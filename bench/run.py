"""jobbus and its peers, side by side, on one PostgreSQL server: `make bench`.

    .venv/bin/python bench/run.py                       # everything (20-30 min on 2 cores)
    .venv/bin/python bench/run.py --quick               # smaller sizes, a few minutes
    .venv/bin/python bench/run.py --scenario drain_10k --scenario latency --systems jobbus,pgqueuer
    .venv/bin/python bench/run.py --systems jobbus --scenario backlog --scale 1   # 1M / 10M-row backlogs

The capacity scenarios (drain_procs, backlog, retention) live in `bench/capacity.py`; their row
counts are 1M queued / 10M finished times `--scale` (0.1 by default, 0.02 with --quick).
`--merge FILE` adds the scenarios an earlier run measured (a copy of its bench/results/latest.json)
and this one did not, so a doc can be regenerated after re-measuring a few scenarios.

Every scenario gets its own fresh database per system on the server at BENCH_DSN (created here,
dropped at the end of the scenario); runs within a scenario reset the system's tables with
TRUNCATE. Each system runs through a driver subprocess (`bench/jobbus_driver.py` in this venv,
`bench/peers/*_driver.py` in `bench/.venv-peers`, which this script creates and fills from PyPI).
Runs are interleaved across systems so that noise on a shared server hits all of them alike.
Prints one table; with the full suite (or --output) it rewrites the generated part of
docs/benchmarks.md, between the `bench:begin` / `bench:end` markers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py` puts bench/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from bench import capacity, harness  # noqa: E402
from jobbus import schema as jobbus_schema  # noqa: E402

BENCH = ROOT / "bench"
PEERS_VENV = BENCH / ".venv-peers"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DOC = ROOT / "docs" / "benchmarks.md"
RAW = BENCH / "results" / "latest.json"
DB_PREFIX = "jbb_"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
DRIVER_TIMEOUT = 900.0

#: Peers and what to install for them (pinned, so that a rerun compares the same code).
PEERS: dict[str, list[str]] = {
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg"],
    "procrastinate": ["procrastinate==3.10.0"],
    "oban": ["oban"],
}

SCENARIOS = [
    "enqueue_single",
    "enqueue_bulk",
    "enqueue_bulk_100k",
    "enqueue_concurrent",
    "enqueue_4proc",
    "drain_10k",
    "drain_100k",
    "drain_2proc",
    "latency",
    "finished_1m",
    "drain_limited",
    "commits",
    "floor",
    "drain_procs",
    "backlog",
    "retention",
]


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
LIMITED_DRAINS = [("unlimited", ""), ("queue limit 100", "queue=100"), ("1,000 keys, 1 each", "keys=1000")]
#: Which limits each system has: pgqueuer's entrypoint `concurrency_limit`, procrastinate's `lock`.
LIMITS_SUPPORTED = {"jobbus": {"queue", "keys"}, "pgqueuer": {"queue"}, "procrastinate": {"keys"}, "oban": set()}


@dataclass(frozen=True)
class Setting:
    label: str
    concurrency: int
    batch: int = 0


@dataclass
class System:
    name: str
    python: Path
    driver: list[str]
    sweep: list[Setting]
    latency: Setting
    reset_sql: str
    unfinished_sql: str
    #: Largest drain this system gets (a slow peer would take minutes per run otherwise).
    drain_cap: int | None = None
    best: Setting | None = None
    version: str = ""

    def argv(self, op: str, dsn: str, **options: Any) -> list[str]:
        argv = [str(self.python), *self.driver, op, "--dsn", dsn]
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

    def execute(self, dbname: str, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connect(dbname) as conn:
            cursor = conn.execute(query.encode(), params)
            return cursor.fetchall() if cursor.description else []


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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBBUS_", "PGQUEUER_", "PROCRASTINATE_"))}
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


# -- systems -------------------------------------------------------------------------------------------


def jobbus_system(quick: bool) -> System:
    sweep = [Setting(f"c{c}", c) for c in ((50, 200) if quick else (10, 50, 200, 500))]
    return System(
        name="jobbus",
        python=Path(sys.executable),
        driver=["-m", "bench.jobbus_driver"],
        sweep=sweep,
        latency=Setting("c10", 10),
        reset_sql="TRUNCATE jobbus.job",
        unfinished_sql="SELECT count(*) FROM jobbus.job WHERE status <> 'completed'",
        version=package_version(Path(sys.executable), "jobbus"),
    )


def pgqueuer_system(python: Path, quick: bool) -> System:
    sweep = [Setting("b10 unlimited", 0, 10), Setting("b100 c200", 200, 100), Setting("b100 c500", 500, 100)]
    if quick:
        sweep = sweep[1:]
    return System(
        name="pgqueuer",
        python=python,
        driver=[str(BENCH / "peers" / "pgqueuer_driver.py")],
        sweep=sweep,
        latency=Setting("b10 unlimited", 0, 10),
        reset_sql="TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics",
        unfinished_sql="SELECT count(*) FROM pgqueuer",
        version=package_version(python, "pgqueuer"),
    )


def procrastinate_system(python: Path, quick: bool) -> System:
    sweep = [Setting("c50", 50)] if quick else [Setting("c10", 10), Setting("c50", 50)]
    return System(
        name="procrastinate",
        python=python,
        driver=[str(BENCH / "peers" / "procrastinate_driver.py")],
        sweep=sweep,
        latency=Setting("c10", 10),
        reset_sql="TRUNCATE procrastinate_jobs CASCADE",
        unfinished_sql="SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
        drain_cap=1_000 if quick else 2_000,
        version=package_version(python, "procrastinate"),
    )


def package_version(python: Path, name: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "?"


def ensure_peers(wanted: Sequence[str], reinstall: bool, notes: dict[str, str]) -> Path | None:
    """Create bench/.venv-peers and install each wanted peer; a peer that cannot be installed gets a note."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", None) or shutil.which("python3") or "python3"
        log(f"creating {PEERS_VENV.relative_to(ROOT)} with {base}")
        proc = subprocess.run([base, "-m", "venv", str(PEERS_VENV)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            for name in wanted:
                notes[name] = f"not run: could not create the peers' virtualenv ({proc.stderr.strip()[-200:]})"
            return None
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], capture_output=True, check=False
        )
    for name in wanted:
        ok, failed = PEERS_VENV / f".installed-{name}", PEERS_VENV / f".failed-{name}"
        if reinstall:
            ok.unlink(missing_ok=True)
            failed.unlink(missing_ok=True)
        if ok.exists():
            continue
        if failed.exists():
            notes[name] = failed.read_text(encoding="utf-8").strip()
            continue
        log(f"installing {' '.join(PEERS[name])} into {PEERS_VENV.relative_to(ROOT)}")
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PEERS[name]], capture_output=True, text=True, check=False
        )
        if proc.returncode == 0:
            ok.touch()
            continue
        note = install_failure_note(name, proc.stderr)
        failed.write_text(note + "\n", encoding="utf-8")
        notes[name] = note
    return python


def install_failure_note(name: str, stderr: str) -> str:
    needs = re.findall(r"Requires-Python (>=\s*[\d.]+)", stderr)
    if needs:
        return (
            f"not run: every {name} release on PyPI requires Python {needs[-1].replace(' ', '')}; "
            f"this machine has Python {platform.python_version()}"
        )
    lines = [line for line in stderr.strip().splitlines() if line.startswith("ERROR")]
    return f"not run: pip could not install {name}: {(lines or ['?'])[-1][:200]}"


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
        """A fresh database per system for this scenario, schema installed; dropped afterwards."""
        names: dict[str, str] = {}
        try:
            for system in list(self.systems):
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
    ) -> dict[str, float]:
        """Fill `jobs`, drain them with `processes` workers; returns the figures of this run.

        `limit` (`queue=N` or `keys=N`) is handed to the drivers' fill and drain: see bench/harness.py.
        """
        if reset:
            self.reset(system, dbname)
        dsn = self.dsn(dbname)
        limited = {"limit": limit} if limit else {}
        run_driver(system.argv("fill", dsn, jobs=jobs, **limited))
        self.server.sample_noise()
        commits0, wal0 = self.server.counters(dbname)
        if processes == 1:
            argv = system.argv("drain", dsn, concurrency=setting.concurrency, batch=setting.batch, **limited)
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
                argv = [str(system.python), "-m", "jobbus", "worker", "--app", "bench.apps:app", "--stop-when-empty"]
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


# -- targets, the table and the doc ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    text: str
    measured: str
    met: bool | None  # None: not measured in this invocation


def evaluate_targets(suite: Suite) -> list[Target]:
    def med(scenario: str, system: str, metric: str, setting: str | None = None) -> float:
        m = suite.find(scenario, system, metric, setting)
        return m.median if m else math.nan

    def best_drain(system: str) -> tuple[float, str]:
        for scenario in ("drain_100k", "drain_10k"):
            candidates = [
                m for m in suite.results if m.scenario == scenario and m.system == system and m.metric == "steady"
            ]
            if candidates:
                m = max(candidates, key=lambda c: c.median)
                return m.median, f"{scenario} {m.setting}"
        return math.nan, ""

    def target(text: str, measured: str, value: float, ok: Callable[[float], bool]) -> Target:
        return Target(
            text, measured if not math.isnan(value) else "not measured", None if math.isnan(value) else ok(value)
        )

    jb, jb_where = best_drain("jobbus")
    pq, _ = best_drain("pgqueuer")
    floor = med("floor", "SQL", "steady", "jobbus schema, fenced")
    two = med("drain_2proc", "jobbus", "steady")
    bulk, pq_bulk = med("enqueue_bulk", "jobbus", "enqueue"), med("enqueue_bulk", "pgqueuer", "enqueue")
    single, pq_single = med("enqueue_single", "jobbus", "enqueue"), med("enqueue_single", "pgqueuer", "enqueue")
    p50, p99 = med("latency", "jobbus", "p50"), med("latency", "jobbus", "p99")
    best = suite.systems[0].best_setting.label if suite.systems and suite.systems[0].name == "jobbus" else None
    with_1m = med("finished_1m", "jobbus", "steady")
    empty = med("drain_100k", "jobbus", "steady", best)
    if math.isnan(empty):
        empty = med("drain_10k", "jobbus", "steady", best)
    commits = med("drain_100k", "jobbus", "commits", best)
    ratio_1m = with_1m / empty
    return [
        target("drain, 1 process: ≥ 10,000 jobs/s", f"{jb:,.0f} jobs/s ({jb_where})", jb, lambda v: v >= 10_000),
        target(
            "drain: ≥ 2× pgqueuer at its best", f"{jb / pq:.2f}× ({jb:,.0f} vs {pq:,.0f})", jb / pq, lambda v: v >= 2
        ),
        target("drain: ≥ 50% of the SQL floor", f"{jb / floor:.0%} of {floor:,.0f}", jb / floor, lambda v: v >= 0.5),
        target("drain: 2 processes > 1", f"{two:,.0f} vs {jb:,.0f} jobs/s", two / jb, lambda v: v > 1),
        target("bulk enqueue: ≥ 50,000 jobs/s", f"{bulk:,.0f} jobs/s", bulk, lambda v: v >= 50_000),
        target(
            "bulk enqueue: ≥ 3× pgqueuer", f"{bulk / pq_bulk:.2f}× ({pq_bulk:,.0f})", bulk / pq_bulk, lambda v: v >= 3
        ),
        target(
            "single enqueue: ≥ 1.5× pgqueuer",
            f"{single / pq_single:.2f}× ({single:,.0f} vs {pq_single:,.0f})",
            single / pq_single,
            lambda v: v >= 1.5,
        ),
        target("idle latency p50 ≤ 5 ms", f"{p50:.2f} ms", p50, lambda v: v <= 5),
        target("idle latency p99 ≤ 12 ms", f"{p99:.2f} ms", p99, lambda v: v <= 12),
        target(
            "1M finished rows: ≥ 80% of the empty-table drain",
            f"{ratio_1m:.0%} ({with_1m:,.0f} vs {empty:,.0f})",
            ratio_1m,
            lambda v: v >= 0.8,
        ),
        target("commits per completed job ≤ 0.1", f"{commits:.3f}", commits, lambda v: v <= 0.1),
        *capacity_targets(suite, target, med, (jb, jb_where), floor, p99),
    ]


def capacity_targets(
    suite: Suite,
    target: Callable[[str, str, float, Callable[[float], bool]], Target],
    med: Callable[..., float],
    drain: tuple[float, str],
    floor: float,
    p99: float,
) -> list[Target]:
    """The targets of issue 12 ("Scale")."""
    jb, jb_where = drain
    one = two = math.nan
    ones = [m for m in suite.results if m.scenario == "drain_procs" and m.metric == "steady" and m.values]
    for m in ones:
        if m.setting.startswith("1 proc"):
            one = m.median
        if m.setting.startswith("2 proc"):
            two = m.median
    if not ones:
        one, two = jb, med("drain_2proc", "jobbus", "steady")
    bulk = med("enqueue_bulk_100k", "jobbus", "enqueue")
    bulk_where = "100k"
    if math.isnan(bulk):
        bulk, bulk_where = med("enqueue_bulk", "jobbus", "enqueue"), "10k"
    conc, pq_conc = med("enqueue_concurrent", "jobbus", "enqueue"), med("enqueue_concurrent", "pgqueuer", "enqueue")
    targets = [
        target(
            "drain: ≥ 75% of the SQL floor (12)",
            f"{jb / floor:.0%} of {floor:,.0f} ({jb_where})",
            jb / floor,
            lambda v: v >= 0.75,
        ),
        target(
            "drain: 2 processes ≥ 1.5× one (12)",
            f"{two / one:.2f}× ({two:,.0f} vs {one:,.0f})",
            two / one,
            lambda v: v >= 1.5,
        ),
        target(
            f"bulk enqueue ({bulk_where}): ≥ 150,000 jobs/s (12)", f"{bulk:,.0f} jobs/s", bulk, lambda v: v >= 150_000
        ),
        target(
            "concurrent single enqueue, 50 coroutines: ≥ 1.5× pgqueuer (12)",
            f"{conc / pq_conc:.2f}× ({conc:,.0f} vs {pq_conc:,.0f})",
            conc / pq_conc,
            lambda v: v >= 1.5,
        ),
        target("idle latency p99 ≤ 5 ms (12)", f"{p99:.2f} ms", p99, lambda v: v <= 5),
    ]
    backlog = {m.setting: m for m in suite.results if m.scenario == "backlog" and m.values}
    clean = med("backlog", "jobbus", "steady", "clean")
    for suffix in ("in a paused queue", "of an unserved type", "finished"):
        label = next((s for s in backlog if s.endswith(suffix)), None)
        if label is None:
            continue
        p50 = med("backlog", "jobbus", "claim p50", label)
        rate = med("backlog", "jobbus", "steady", label)
        targets.append(target(f"{label}: claim p50 ≤ 2 ms (12)", f"{p50:.2f} ms", p50, lambda v: v <= 2))
        targets.append(
            target(
                f"{label}: drain ≥ 90% of clean (12)",
                f"{rate / clean:.0%} ({rate:,.0f} vs {clean:,.0f})",
                rate / clean,
                lambda v: v >= 0.9,
            )
        )
    deletes = next(
        (
            m
            for m in suite.results
            if m.scenario == "retention" and m.metric == "rows/s" and m.setting.startswith("DELETE") and m.values
        ),
        None,
    )
    if deletes is not None:
        # The cleaner works ROUND_SECONDS (2 s) of every 10 s interval: a fifth of the batch rate.
        duty = deletes.median * 0.2
        targets.append(
            target(
                "retention: the cleaner's batched DELETE keeps up with 1,000 jobs/s (12)",
                f"{deletes.median:,.0f} rows/s, {duty:,.0f} rows/s at its 2 s per 10 s",
                duty,
                lambda v: v >= 1000,
            )
        )
    return targets


def fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit in ("commits/job", "cpu ms/job"):
        return f"{value:.3f}"
    if unit in ("ms", "cores", "fraction", "load", "s"):
        return f"{value:.2f}"
    return f"{value:,.0f}"


def table_rows(suite: Suite) -> list[list[str]]:
    """Every measurement: scenarios in suite order, systems in column order, settings in sweep order."""
    order = {name: i for i, name in enumerate(["enqueue_single", "enqueue_bulk", "enqueue_bulk_100k",
                                                "enqueue_concurrent", "enqueue_4proc", "drain_10k", "drain_100k",
                                                "drain_2proc", "drain_procs", "latency", "floor", "finished_1m",
                                                "backlog", "retention"])}  # fmt: skip
    systems = {s.name: i for i, s in enumerate(suite.systems)}
    settings = {(s.name, setting.label): i for s in suite.systems for i, setting in enumerate(s.sweep)}
    metrics = {name: i for i, name in enumerate(["enqueue", "steady", "wall", "commits", "wal", "p50", "p95", "p99"])}

    def key(m: Measurement) -> tuple[int, int, int, str, int]:
        where = settings.get((m.system, m.setting), 99)
        return order.get(m.scenario, 99), systems.get(m.system, 99), where, m.setting, metrics.get(m.metric, 99)

    rows = []
    for m in sorted((m for m in suite.results if m.values), key=key):
        spread = f"{fmt(m.low, m.unit)}–{fmt(m.high, m.unit)}"
        median = fmt(m.median, m.unit)
        rows.append(
            [m.scenario, m.system, m.setting, f"{m.jobs:,}", m.metric, m.unit, median, spread, str(len(m.values))]
        )
    return rows


HEADER = ["scenario", "system", "setting", "jobs", "metric", "unit", "median", "min–max", "runs"]


SUMMARY_ROWS = [
    ("enqueue, one call per job", "enqueue_single", "enqueue", False),
    ("enqueue, bulk call", "enqueue_bulk", "enqueue", False),
    ("enqueue, bulk call of 100k", "enqueue_bulk_100k", "enqueue", False),
    ("enqueue, 50 coroutines on one App/pool", "enqueue_concurrent", "enqueue", False),
    ("enqueue, 4 producer processes", "enqueue_4proc", "enqueue", False),
    ("drain 10k, best setting", "drain_10k", "steady", True),
    ("drain 100k, 1 process", "drain_100k", "steady", True),
    ("drain, 2 processes", "drain_2proc", "steady", True),
    ("drain, 1M finished rows present", "finished_1m", "steady", True),
    ("idle latency p50 (ms)", "latency", "p50", False),
    ("idle latency p95 (ms)", "latency", "p95", False),
    ("idle latency p99 (ms)", "latency", "p99", False),
    ("commits per job (drain)", "drain_100k", "commits", True),
    ("WAL bytes per job (drain)", "drain_100k", "wal", True),
]


def summary_table(suite: Suite) -> tuple[list[str], list[list[str]]]:
    """One row per figure, one column per system: the median (and, for drains, the setting used)."""
    names = [s.name for s in suite.systems]
    rows = []
    for label, scenario, metric, is_drain in SUMMARY_ROWS:
        cells = []
        for name in names:
            m = summary_cell(suite, scenario, name, metric, is_drain)
            if m is None and is_drain and scenario == "drain_100k":  # a slow peer runs no 100k drain
                m = summary_cell(suite, "drain_10k", name, metric, is_drain)
            if m is None:
                cells.append("-")
            else:
                cells.append(fmt(m.median, m.unit) + (f" ({m.setting}, {m.jobs:,} jobs)" if is_drain else ""))
        rows.append([label, *cells])
    for m in suite.results:
        if m.scenario == "floor" and m.values:
            rows.append([f"SQL floor, {m.setting} ({m.jobs:,} jobs)", fmt(m.median, m.unit), *["-"] * (len(names) - 1)])
    return ["figure", *names], rows


def summary_cell(suite: Suite, scenario: str, system: str, metric: str, is_drain: bool) -> Measurement | None:
    """The measurement for one cell; for drains, at the setting with the best steady rate."""
    setting = None
    if is_drain:
        steady = [m for m in suite.results if (m.scenario, m.system, m.metric) == (scenario, system, "steady")]
        if not steady:
            return None
        setting = max(steady, key=lambda m: m.median).setting
    return suite.find(scenario, system, metric, setting)


def render_text_table(rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADER)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    previous = ""
    for row in rows:
        if previous and row[0] != previous:
            lines.append("")
        previous = row[0]
        lines.append(
            "  ".join(c.rjust(w) if i >= 3 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    return "\n".join(lines)


def render_markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def environment(server: Server, suite: Suite, peers_python: Path | None) -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = subprocess.run(["free", "-h"], capture_output=True, text=True, check=False).stdout
    mem_total = next((line.split()[1] for line in memory.splitlines() if line.startswith("Mem:")), "?")
    versions = {s.name: s.version for s in suite.systems}
    versions["psycopg"] = package_version(Path(sys.executable), "psycopg")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True).stdout
    if peers_python is not None and "pgqueuer" in versions:
        versions["asyncpg (pgqueuer's driver)"] = package_version(peers_python, "asyncpg")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem_total,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": head.strip()
        + (f" with uncommitted changes in {len(dirty.splitlines())} file(s) under src/" if dirty else ""),
        "postgres": server.describe(),
        "versions": versions,
        "load": server.load,
        "busy": server.busy,
        "other_active": server.other_active,
    }


def render_doc_block(
    server: Server, suite: Suite, env: dict[str, Any], command: str, started: float, ended: float
) -> str:
    pg = env["postgres"]
    load = env["load"] or [math.nan]
    busy = env["busy"] or [math.nan]
    others = env["other_active"] or [0]
    lines = [
        BEGIN,
        "<!-- Generated by bench/run.py: edits between these markers are overwritten by the next run. -->",
        "",
        f"Run of {time.strftime('%Y-%m-%d %H:%M %Z', time.localtime(started))}, {(ended - started) / 60:.1f} minutes, "
        f"{suite.runs} runs per figure (median, min–max).",
        "",
        "### Machine and server",
        "",
        f"- CPU: {env['cpu']}, {env['cores']} cores; memory {env['memory']}; Linux {env['kernel']}; "
        f"Python {env['python']}",
        f"- PostgreSQL {pg['server_version']} on the same machine (127.0.0.1, TCP): fsync={pg['fsync']}, "
        f"synchronous_commit={pg['synchronous_commit']}, full_page_writes={pg['full_page_writes']}, "
        f"wal_level={pg['wal_level']}, shared_buffers={pg['shared_buffers']}, max_wal_size={pg['max_wal_size']}, "
        f"checkpoint_timeout={pg['checkpoint_timeout']}; every table logged (durable).",
        "- Versions: " + ", ".join(f"{name} {version}" for name, version in env["versions"].items()),
        f"- jobbus source: commit {env['commit']}",
        f"- Noise: machine and server are shared with other developers' test suites. Before each measurement the "
        f"suite waits up to {server.quiet_wait:.0f} s for the CPUs to be less than "
        f"{(server.quiet_threshold or 1):.0%} busy; the busy fraction then was {min(busy):.0%}–{max(busy):.0%} "
        f"(median {statistics.median(busy):.0%}), the 1-minute load average {min(load):.2f}–{max(load):.2f}, "
        f"other active sessions on the server {min(others)}–{max(others)}.",
        "",
        "### Command",
        "",
        "```",
        command,
        "```",
        "",
        "### Summary (medians; drains at each system's best setting, jobs/s between first and last handler start)",
        "",
        render_markdown_table(*summary_table(suite)),
        "",
        "The SQL floor rows are pure SQL (no queue library), shown in the first column for scale.",
        "",
        "### All figures",
        "",
        render_markdown_table(HEADER, table_rows(suite)),
        "",
    ]
    notes = [m for m in suite.results if m.note]
    peer_notes = [f"- {name}: {text}" for name, text in suite.notes.items()]
    if notes or peer_notes:
        lines += ["Notes from the run:", ""]
        lines += peer_notes
        lines += [f"- {m.scenario} / {m.system}: {m.note}" for m in notes]
        lines.append("")
    targets = evaluate_targets(suite)
    lines += ["### Targets (issues 6 and 12)", ""]
    verdict = {True: "met", False: "**missed**", None: "not measured"}
    lines.append(
        render_markdown_table(["target", "measured", ""], [[t.text, t.measured, verdict[t.met]] for t in targets])
    )
    lines += ["", END]
    return "\n".join(lines)


def write_doc(block: str, path: Path) -> None:
    if path.exists():
        text = path.read_text(encoding="utf-8")
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            path.write_text(head + block + tail, encoding="utf-8")
            return
        path.write_text(text.rstrip() + "\n\n## Latest run\n\n" + block + "\n", encoding="utf-8")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Benchmarks\n\n## Latest run\n\n" + block + "\n", encoding="utf-8")


def save_raw(suite: Suite, env: dict[str, Any], command: str, started: float, ended: float) -> None:
    RAW.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "command": command,
        "started": started,
        "ended": ended,
        "runs": suite.runs,
        "environment": env,
        "results": [
            {k: getattr(m, k) for k in ("scenario", "system", "setting", "jobs", "metric", "unit", "values", "note")}
            for m in suite.results
        ],
    }
    RAW.write_text(json.dumps(data, indent=1), encoding="utf-8")


# -- main ------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN), help="server (default BENCH_DSN)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and sweeps")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="run only this scenario (repeatable)")
    parser.add_argument("--systems", default="jobbus,pgqueuer,procrastinate,oban", help="comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--output", type=Path, help=f"doc to update (default {DOC.relative_to(ROOT)} for a full run)")
    parser.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.35,
        help="before each measurement wait (up to 20 s) until the CPUs are less busy than this (0 to 1; 1 = never)",
    )
    parser.add_argument("--reinstall-peers", action="store_true", help="retry installing peers that failed before")
    parser.add_argument(
        "--scale",
        type=float,
        help="capacity scenarios: 1M queued / 10M finished rows times this (default 0.1, --quick 0.02; 1 = full)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        help="raw figures of an earlier run (a copy of bench/results/latest.json): its scenarios that this "
        "run does not measure are added to the table, the targets and the doc, with a note saying so",
    )
    parser.add_argument(
        "--retention-budget", type=float, help="retention: seconds of batched DELETE at most (default 120)"
    )
    return parser.parse_args(argv)


def merge_earlier(suite: Suite, path: Path, measured: set[str]) -> None:
    """Adds an earlier run's figures of the scenarios not measured now, and each system's best drain setting."""
    data = json.loads(path.read_text(encoding="utf-8"))
    taken = sorted({r["scenario"] for r in data["results"] if r["scenario"] not in measured})
    for r in data["results"]:
        if r["scenario"] not in measured:
            suite.results.append(Measurement(**r))
    for system in suite.systems:
        steady = [m for m in suite.results if (m.scenario, m.system, m.metric) == ("drain_10k", system.name, "steady")]
        best = max(steady, key=lambda m: m.median, default=None)
        if best is not None and system.best is None:
            system.best = next((s for s in system.sweep if s.label == best.setting), None)
    started = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(float(data["started"])))
    suite.notes["merged"] = f"{', '.join(taken)}: from the run of {started} ({data['command']}), not measured again"
    log(f"merged {len(taken)} scenarios from {path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = sorted(set(wanted) - {"jobbus", *PEERS})
    if unknown:
        print(f"unknown system(s): {', '.join(unknown)}", file=sys.stderr)
        return 64
    scenarios = args.scenario or SCENARIOS
    sizes = QUICK if args.quick else Sizes()
    if args.scale is not None:
        sizes = replace(sizes, scale=args.scale)
    if args.retention_budget is not None:
        sizes = replace(sizes, retention_budget=args.retention_budget)
    server = Server(args.dsn, quiet_threshold=args.quiet_threshold if args.quiet_threshold < 1 else None)
    started = time.time()
    peer_notes: dict[str, str] = {}
    peers = [name for name in wanted if name in PEERS]
    peers_python = ensure_peers(peers, args.reinstall_peers, peer_notes) if peers else None
    systems: list[System] = []
    if "jobbus" in wanted:
        systems.append(jobbus_system(args.quick))
    if peers_python is not None:
        if "pgqueuer" in peers and "pgqueuer" not in peer_notes:
            systems.append(pgqueuer_system(peers_python, args.quick))
        if "procrastinate" in peers and "procrastinate" not in peer_notes:
            systems.append(procrastinate_system(peers_python, args.quick))
        if "oban" in peers and "oban" not in peer_notes:
            peer_notes["oban"] = "installed, but bench/peers has no oban driver for this version yet"
    suite = Suite(server, systems, sizes, args.runs)
    suite.notes = peer_notes
    for name, text in peer_notes.items():
        log(f"{name}: {text}")
    if args.merge is not None:  # before the run: the earlier best drain settings apply to this run's drains
        merge_earlier(suite, args.merge, set(scenarios) | ({"drain_100k"} if "commits" in scenarios else set()))
    try:
        if "enqueue_single" in scenarios:
            suite.enqueue("enqueue_single", "enqueue_single", sizes.single)
        if "enqueue_bulk" in scenarios:
            suite.enqueue("enqueue_bulk", "enqueue_bulk", sizes.bulk)
        if "enqueue_bulk_100k" in scenarios:
            suite.enqueue("enqueue_bulk_100k", "enqueue_bulk", sizes.bulk_large)
        if "enqueue_concurrent" in scenarios:
            suite.enqueue("enqueue_concurrent", "enqueue_concurrent", sizes.concurrent, concurrency=sizes.coroutines)
        if "enqueue_4proc" in scenarios:
            capacity.enqueue_processes(suite)
        if "drain_10k" in scenarios:
            suite.drain("drain_10k", sizes.drain_small, sweep=True)
        if "drain_100k" in scenarios or "commits" in scenarios:
            suite.drain("drain_100k", sizes.drain_large, sweep=False)
        if "drain_2proc" in scenarios:
            suite.drain("drain_2proc", sizes.drain_large, sweep=False, processes=2)
        if "latency" in scenarios:
            suite.latency()
        if "finished_1m" in scenarios:
            suite.finished()
        if "drain_limited" in scenarios:
            suite.limited()
        if "floor" in scenarios:
            suite.floor()
        if "drain_procs" in scenarios:
            capacity.drain_processes(suite)
        if "backlog" in scenarios:
            capacity.backlog(suite)
        if "retention" in scenarios:
            capacity.retention(suite)
    except KeyboardInterrupt:
        log("interrupted: dropping the benchmark databases")
        return 130
    finally:
        server.drop_all()
    ended = time.time()
    rows = table_rows(suite)
    print()
    print(render_text_table(rows))
    print()
    for t in evaluate_targets(suite):
        mark = {True: "met", False: "MISSED", None: "n/a"}[t.met]
        print(f"  [{mark:>6}] {t.text}: {t.measured}")
    for name, text in peer_notes.items():
        print(f"  note: {name}: {text}")
    env = environment(server, suite, peers_python)
    command = " ".join([".venv/bin/python bench/run.py", *(argv if argv is not None else sys.argv[1:])])
    save_raw(suite, env, command, started, ended)
    full = not args.scenario and not args.quick and args.merge is None
    output = args.output or (DOC if full else None)
    if output is not None:
        write_doc(render_doc_block(server, suite, env, command, started, ended), output)
        log(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
