"""The upgrade rehearsal: the previous release's workers and producers under load while this release's
`jobbus migrate` runs, then new workers replace the old ones one by one (`make rehearse-upgrade`).

    python -m tools.rehearse_upgrade --jobs 1000000 --seconds 60

On a fresh database (created on JOBBUS_TEST_DSN's server, else the embedded one, and dropped at the end):
the previous release's wheel, built from its commit into `.rehearse/` and installed into a venv of its own,
runs `jobbus migrate`; a fill of finished and future jobs; that release's workers and producers (Python's
`schedule` and the SQL API's) at a steady rate; this release's `jobbus migrate` while they run; then each
old worker is replaced by a new one (the new one starts a job first, the old one is stopped with SIGTERM),
the producers are switched to this release, and the load drains. Then the verdict: every acknowledged job
completed, once; every attempt ran its handler once, none after another attempt's outcome; every old
worker went on claiming after the migration until it was stopped; no process exited non-zero or logged an
error. Exit 0 when all of that holds, 1 otherwise (each problem named with its step and process), 2 on
bad usage. The logs of every process stay in `.rehearse/runs/`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/rehearse_upgrade.py` puts tools/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from tests.dbserver import fresh_database, server_dsn  # noqa: E402

from tools.api_check import parse_changelog  # noqa: E402
from tools.rehearse_app import JOB_TYPE, STARTS_DDL  # noqa: E402
from tools.rehearse_checks import (  # noqa: E402
    JobRow,
    Outcome,
    Start,
    check_attempts,
    check_jobs,
    scan_log,
)

#: Where the previous release's source, wheel and venv, and every run's logs, are kept (gitignored).
CACHE = ROOT / ".rehearse"
APP = "tools.rehearse_app:app"
#: Every session of a process the rehearsal started is named `rehearsal:<its name>`.
APPLICATION_PREFIX = "rehearsal:"
TERMINAL = ("completed", "failed", "cancelled")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NEW_MIGRATE = "this release's jobbus migrate (under load)"


def last_recorded_release() -> str:
    """The commit of the newest release CHANGELOG.md records: the release before this tree (docs/releasing.md)."""
    commit = parse_changelog((ROOT / "CHANGELOG.md").read_text()).baseline.commit
    assert commit is not None  # the baseline is the newest release with its commit
    return commit


class RehearsalError(Exception):
    """A step could not run at all (the previous release could not be built, a process did not start)."""


# ---------------------------------------------------------------------------------------------------------
# The previous release


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def previous_release(commit: str) -> tuple[Path, str]:
    """The venv of the release at `commit` (built once: its wheel from `git archive`, then installed with
    its dependencies from the package index) and the commit's full hash."""
    try:
        full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except subprocess.CalledProcessError:
        raise RehearsalError(f"--previous {commit!r} is not a commit of this repository") from None
    short = full[:7]
    venv = CACHE / f"venv-{short}"
    if (venv / ".installed").exists():
        return venv, full
    print(f"building the previous release's wheel from {short} into {CACHE.relative_to(ROOT)}/", flush=True)
    source, wheels = CACHE / f"src-{short}", CACHE / f"wheels-{short}"
    for stale in (source, wheels, venv):
        shutil.rmtree(stale, ignore_errors=True)
    source.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", full], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(source)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RehearsalError(f"git archive {short} failed")
    _quiet([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)])
    (wheel,) = wheels.glob("jobbus-*.whl")
    _quiet([sys.executable, "-m", "venv", str(venv)])
    _quiet([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", str(wheel)])
    (venv / ".installed").touch()
    return venv, full


def _quiet(command: Sequence[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RehearsalError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")


# ---------------------------------------------------------------------------------------------------------
# Processes


@dataclass
class Process:
    """One process the rehearsal started: its output goes to a log file of its own."""

    name: str
    release: str  # "old" or "new"
    popen: subprocess.Popen[bytes]
    log: Path
    exit_code: int | None = None
    #: Set when the rehearsal killed it for running past its time.
    killed_after: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self, timeout: float) -> float:
        """SIGTERM, then wait for the exit; returns how long it took. A process still running after
        `timeout` is killed and counted as exiting -9."""
        started = time.monotonic()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.exit_code = self.popen.wait()
        return time.monotonic() - started


@dataclass
class Rehearsal:
    """What the run needs to start processes and what it found along the way."""

    args: argparse.Namespace
    dsn: str
    old_venv: Path
    run_dir: Path
    server: str
    started: float = field(default_factory=time.monotonic)
    phase: str = "setup"
    #: When each phase began, on the local clock the processes' log lines carry.
    phases: list[tuple[datetime, str]] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def environment(self, name: str, release: str) -> dict[str, str]:
        """The process's own: its sessions carry its name as `application_name`, so that a lock the
        server reports (`Process 5767 waits for ...`) is traced back to the process that held it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBBUS_") and k != "PYTHONPATH"}
        dsn = make_conninfo(self.dsn, application_name=f"{APPLICATION_PREFIX}{name}")
        return {**env, "JOBBUS_DSN": dsn, "REHEARSAL_ROLE": release, "PYTHONUNBUFFERED": "1"}

    def python(self, release: str) -> str:
        return str(self.old_venv / "bin/python") if release == "old" else sys.executable

    def start(self, name: str, release: str, *args: str) -> Process:
        log = self.run_dir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [self.python(release), *args], cwd=ROOT, env=self.environment(name, release), stdout=out, stderr=out
            )
        process = Process(name, release, popen, log)
        self.processes.append(process)
        return process

    def run(self, name: str, release: str, *args: str, timeout: float) -> Process:
        """Run a command to its end (killed after `timeout`), its output in its log."""
        process = self.start(name, release, *args)
        try:
            process.exit_code = process.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.exit_code = process.popen.wait()
            process.killed_after = timeout
        return process

    def worker(self, name: str, release: str) -> Process:
        return self.start(
            name, release, "-m", "jobbus", "worker", "--app", APP, "--worker-id", name,
            "--concurrency", str(self.args.concurrency), "--poll-interval", "0.5", "--shutdown-timeout", "30",
        )  # fmt: skip

    def producer(self, name: str, release: str, via: str, rate: float) -> Process:
        acks = self.run_dir / f"{name}.acks"
        return self.start(
            name, release, "-m", "tools.rehearse_producer",
            "--via", via, "--rate", f"{rate:g}", "--acks", str(acks), "--name", name,
        )  # fmt: skip

    def expect_acks(self, step: str, producers: Sequence[Process]) -> None:
        """Wait until each producer has a job acknowledged (60 s at most)."""
        for producer in producers:
            if not wait_until(partial(_has_acks, self.run_dir / f"{producer.name}.acks"), 60):
                self.problems.append(f"step {step}: {self._who(producer)} scheduled no job within 60 s")

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.phases.append((datetime.now(), phase))

    def phase_at(self, line: str) -> str:
        """The phase a log line's time falls in, for a line that starts with one."""
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            return ""
        during = [phase for began, phase in self.phases if began <= at]
        return f" during {during[-1]}" if during else ""

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f} s] {text}", flush=True)

    def timed(self, what: str) -> _Timer:
        return _Timer(self, what)

    def _who(self, process: Process) -> str:
        release = "previous release" if process.release == "old" else "this release"
        return f"{process.name} (pid {process.pid}, {release})"

    def stop(self, process: Process, step: str) -> float:
        took = process.stop(timeout=60)
        if process.exit_code != 0:
            self.problems.append(f"step {step}: {self._who(process)} exited {process.exit_code}; see {process.log}")
        return took

    def stop_everything(self) -> None:
        for process in self.processes:
            if process.popen.poll() is None:
                process.popen.kill()
                process.popen.wait()


class _Timer:
    def __init__(self, rehearsal: Rehearsal, what: str) -> None:
        self._rehearsal, self._what = rehearsal, what

    def __enter__(self) -> None:
        self._started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self._rehearsal.durations[self._what] = time.monotonic() - self._started


# ---------------------------------------------------------------------------------------------------------
# The database


def query(dsn: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.encode(), params).fetchall()


def fill(rehearsal: Rehearsal, finished: int, future: int) -> None:
    """Finished jobs of the last twelve hours (inside the default retention of a day, so that the cleaner
    leaves them) and jobs due in a month, in batches, with the previous release's columns: the workers
    never run them, the migrations meet them."""
    batch = 100_000
    with psycopg.connect(rehearsal.dsn, autocommit=True) as conn:
        for first in range(0, finished, batch):
            count = min(batch, finished - first)
            conn.execute(
                b"""
                INSERT INTO jobbus.job (id, type, status, configuration_data, result, attempts, max_attempts,
                                        created_at, available_at, started_at, finished_at, history)
                SELECT gen_random_uuid(), 'rehearsal.fill', 'completed', jsonb_build_object('n', i), '{}', 1, 3,
                       t, t, t, t + interval '1 second',
                       jsonb_build_array(jsonb_build_object('attempt', 1, 'outcome', 'completed',
                                                            'at', t + interval '1 second'))
                FROM generate_series(%s::int, %s::int) AS i,
                     LATERAL (SELECT now() - interval '12 hours' + i * interval '1 millisecond' / 50) AS at(t)
                """,
                (first, first + count - 1),
            )
            rehearsal.say(f"fill: {first + count:,} of {finished:,} finished jobs")
        conn.execute(
            b"""
            INSERT INTO jobbus.job (id, type, status, configuration_data, max_attempts, created_at, available_at)
            SELECT gen_random_uuid(), 'rehearsal.fill', 'queued', jsonb_build_object('n', i), 3,
                   now(), now() + interval '30 days' + i * interval '1 millisecond'
            FROM generate_series(1, %s::int) AS i
            """,
            (future,),
        )
        conn.execute("ANALYZE jobbus.job")
        conn.execute(STARTS_DDL.encode())


def backends(dsn: str, error: str) -> list[str]:
    """Which of the rehearsal's processes each server process an error names (`Process 5767 waits for
    ...`) belongs to, and what it runs now; read at once, while they still hold their sessions."""
    pids = sorted({int(pid) for pid in re.findall(r"\bProcess (\d+)", error)})
    if not pids:
        return []
    rows = query(
        dsn,
        "SELECT pid, application_name, state, left(regexp_replace(query, '\\s+', ' ', 'g'), 100)"
        " FROM pg_stat_activity WHERE pid = ANY(%s)",
        (pids,),
    )
    found = {
        pid: f"{name.removeprefix(APPLICATION_PREFIX) or '?'} ({state}: {text})" for pid, name, state, text in rows
    }
    return [f"server process {pid}: {found.get(pid, 'no longer connected')}" for pid in pids]


def fill_counts(dsn: str) -> tuple[int, int]:
    """(finished, future) jobs of the fill as they are now: both must be what the fill wrote."""
    ((finished, future),) = query(
        dsn,
        "SELECT count(*) FILTER (WHERE status = 'completed'), "
        "count(*) FILTER (WHERE status = 'queued' AND attempts = 0 AND available_at > now() + interval '29 days') "
        "FROM jobbus.job WHERE type = 'rehearsal.fill'",
    )
    return int(finished), int(future)


def unfinished(dsn: str) -> int:
    placeholders = ", ".join(["%s"] * len(TERMINAL))
    sql = f"SELECT count(*) FROM jobbus.job WHERE type = %s AND status NOT IN ({placeholders})"
    return int(query(dsn, sql, (JOB_TYPE, *TERMINAL))[0][0])


def starts_since(dsn: str, pid: int, since: datetime) -> int:
    sql = "SELECT count(*) FROM public.rehearsal_start WHERE pid = %s AND started_at > %s"
    return int(query(dsn, sql, (pid, since))[0][0])


def database_now(dsn: str) -> datetime:
    value: datetime = query(dsn, "SELECT clock_timestamp()")[0][0]
    return value


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


@contextmanager
def progress(rehearsal: Rehearsal, every: float) -> Iterator[None]:
    """A line every `every` seconds: the phase, the acknowledged jobs, handler starts per release, the
    load's finished jobs (`?` while the job table is locked past 200 ms: the migration holds it)."""
    stopping = threading.Event()

    def line(conn: psycopg.Connection[Any]) -> str:
        acked = sum(_count_lines(path) for path in rehearsal.run_dir.glob("*.acks"))
        by_role: dict[str, int] = dict(conn.execute("SELECT role, count(*) FROM public.rehearsal_start GROUP BY role"))
        try:
            row = conn.execute(
                "SELECT count(*) FROM jobbus.job WHERE type = %s AND status = 'completed'", (JOB_TYPE,)
            ).fetchone()
            done = f"{row[0]:,}" if row else "?"
        except psycopg.errors.LockNotAvailable:
            done = "? (job table locked)"
        return (
            f"{rehearsal.phase}: {acked:,} scheduled, {done} completed; handler starts "
            f"old {by_role.get('old', 0):,}, new {by_role.get('new', 0):,}"
        )

    def report() -> None:
        conn: psycopg.Connection[Any] | None = None
        while not stopping.wait(every):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(rehearsal.dsn, autocommit=True)
                    conn.execute("SET lock_timeout = '200ms'")
                rehearsal.say(line(conn))
            except psycopg.Error as exc:  # the rehearsal goes on; the next line tries again
                rehearsal.say(f"{rehearsal.phase}: progress unknown ({type(exc).__name__}: {exc})")
                if conn is not None:
                    conn.close()
        if conn is not None:
            conn.close()

    thread = threading.Thread(target=report, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        thread.join()


def _has_acks(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def _count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


# ---------------------------------------------------------------------------------------------------------
# The rehearsal


def rehearse(rehearsal: Rehearsal) -> dict[str, Any]:
    """Run every step; problems land in `rehearsal.problems`. Returns the figures of the summary."""
    args, dsn = rehearsal.args, rehearsal.dsn
    figures: dict[str, Any] = {}
    rehearsal.enter("previous release's migrate")
    with rehearsal.timed("previous release's jobbus migrate"):
        old_migrate = rehearsal.run("migrate-old", "old", "-m", "jobbus", "migrate", timeout=args.migrate_timeout)
    if old_migrate.exit_code != 0:
        raise RehearsalError(
            f"the previous release's jobbus migrate exited {old_migrate.exit_code}: see {old_migrate.log}"
        )
    rehearsal.enter("fill")
    with rehearsal.timed("fill"):
        fill(rehearsal, args.jobs, args.future)
    rehearsal.say(f"fill: {args.jobs:,} finished and {args.future:,} future jobs")

    per_producer = args.rate / args.producers
    vias = ["python", "sql"]
    rehearsal.enter("old load")
    old_workers = [rehearsal.worker(f"old-worker-{i + 1}", "old") for i in range(args.workers)]
    producers = [
        rehearsal.producer(f"old-producer-{i + 1}-{vias[i % 2]}", "old", vias[i % 2], per_producer)
        for i in range(args.producers)
    ]
    new_workers: list[Process] = []
    with progress(rehearsal, args.progress_every):
        # The load counts from when every old producer has scheduled and every old worker has run a job.
        rehearsal.expect_acks("old load", producers)
        for worker in old_workers:
            if not wait_until(partial(starts_since, dsn, worker.pid, EPOCH), 60):
                rehearsal.problems.append(f"step old load: {rehearsal._who(worker)} started no job within 60 s")
        load_started = time.monotonic()
        rehearsal.say(f"load: {args.workers} old workers, {args.producers} old producers at {args.rate:g} jobs/s")
        time.sleep(max(0.0, load_started + args.seconds * 0.3 - time.monotonic()))

        rehearsal.enter("this release's migrate")
        rehearsal.say("this release's jobbus migrate starts")
        with rehearsal.timed(NEW_MIGRATE):
            new_migrate = rehearsal.run("migrate-new", "new", "-m", "jobbus", "migrate", timeout=args.migrate_timeout)
        migrated_at = database_now(dsn)
        migrate_output = new_migrate.log.read_text(errors="replace").strip()
        if new_migrate.exit_code != 0:
            ended = (
                f"was killed after {new_migrate.killed_after:g} s (--migrate-timeout)"
                if new_migrate.killed_after is not None
                else f"exited {new_migrate.exit_code}"
            )
            last = "\n    ".join([*migrate_output.splitlines()[-12:], *backends(dsn, migrate_output)]) or "(nothing)"
            rehearsal.problems.append(
                f"step this release's jobbus migrate: {rehearsal._who(new_migrate)} {ended} under the previous "
                f"release's load; its last output:\n    {last}"
            )
            rehearsal.say(f"this release's jobbus migrate FAILED ({ended}): no rolling replacement")
        else:
            rehearsal.say(f"this release's jobbus migrate done in {rehearsal.durations[NEW_MIGRATE]:.1f} s")
            rehearsal.enter("rolling replacement")
            for index, old in enumerate(old_workers):
                new = rehearsal.worker(f"new-worker-{index + 1}", "new")
                new_workers.append(new)
                step = f"rolling replacement {index + 1}"
                with rehearsal.timed(f"{step}: the new worker's first job"):
                    if not wait_until(partial(starts_since, dsn, new.pid, migrated_at), 60):
                        rehearsal.problems.append(f"step {step}: {rehearsal._who(new)} started no job within 60 s")
                if not wait_until(partial(starts_since, dsn, old.pid, migrated_at), 30):
                    rehearsal.problems.append(
                        f"step {step}: {rehearsal._who(old)} started no job after the migration (30 s)"
                    )
                rehearsal.durations[f"{step}: the old worker's graceful stop"] = rehearsal.stop(old, step)
                rehearsal.say(f"{step}: {new.name} runs jobs, {old.name} stopped (exit {old.exit_code})")

            rehearsal.enter("producers switched")
            new_producers = [
                rehearsal.producer(f"new-producer-{i + 1}-{vias[i % 2]}", "new", vias[i % 2], per_producer)
                for i in range(args.producers)
            ]
            rehearsal.expect_acks("producers switched", new_producers)
            for producer in producers:
                rehearsal.stop(producer, "producers switched")
            producers = new_producers
            rehearsal.say("producers switched to this release")
            time.sleep(max(args.seconds * 0.2, load_started + args.seconds - time.monotonic()))

        rehearsal.enter("drain")
        for producer in producers:
            rehearsal.stop(producer, "drain")
        figures["load seconds"] = time.monotonic() - load_started
        with rehearsal.timed("drain"):
            if not wait_until(lambda: unfinished(dsn) == 0, args.drain_timeout, interval=0.5):
                rehearsal.problems.append(
                    f"step drain: {unfinished(dsn):,} jobs of the load still unfinished after {args.drain_timeout:g} s"
                )
        for worker in [*old_workers, *new_workers]:
            if worker.exit_code is None:
                rehearsal.stop(worker, "drain")
    return figures


def verdict(rehearsal: Rehearsal, figures: dict[str, Any]) -> dict[str, Any]:
    """Read what the run left, check it, and return the counts of the summary."""
    dsn = rehearsal.dsn
    acked: list[uuid.UUID] = []
    per_producer: dict[str, int] = {}
    for path in sorted(rehearsal.run_dir.glob("*.acks")):
        ids = [uuid.UUID(line) for line in path.read_text().split()]
        per_producer[path.stem] = len(ids)
        acked += ids
    duplicates = len(acked) - len(set(acked))
    if duplicates:
        rehearsal.problems.append(f"check: {duplicates} ids were acknowledged twice")
    rows = [
        JobRow(id, status, attempts, finished_at, tuple(_history(history)))
        for id, status, attempts, finished_at, history in query(
            dsn, "SELECT id, status, attempts, finished_at, history FROM jobbus.job WHERE type = %s", (JOB_TYPE,)
        )
    ]
    starts = [
        Start(*row) for row in query(dsn, "SELECT job_id, attempt, role, pid, started_at FROM public.rehearsal_start")
    ]
    rehearsal.problems += [f"check jobs: {p}" for p in _first(check_jobs(acked, [r.id for r in rows], rows))]
    rehearsal.problems += [f"check attempts: {p}" for p in _first(check_attempts(rows, starts))]
    finished, future = fill_counts(dsn)
    if (finished, future) != (rehearsal.args.jobs, rehearsal.args.future):
        rehearsal.problems.append(
            f"check fill: {finished:,} finished and {future:,} future jobs, "
            f"the fill wrote {rehearsal.args.jobs:,} and {rehearsal.args.future:,}"
        )
    for process in rehearsal.processes:
        for line in _first(scan_log(process.log.read_text(errors="replace"))):
            rehearsal.problems.append(f"check logs: {rehearsal._who(process)} logged{rehearsal.phase_at(line)}: {line}")
    by_role = Counter(start.role for start in starts)
    return {
        "jobs scheduled (acknowledged)": len(set(acked)),
        "jobs per second scheduled": round(len(acked) / figures["load seconds"], 1),
        "per producer": per_producer,
        "completed": sum(row.status == "completed" for row in rows),
        "attempts": sum(row.attempts for row in rows),
        "jobs retried": sum(row.attempts > 1 for row in rows),
        "handler starts by the previous release": by_role["old"],
        "handler starts by this release": by_role["new"],
        "slowest schedule call per producer": _slowest_calls(rehearsal),
    }


def _history(entries: list[dict[str, Any]]) -> Iterator[Outcome]:
    for entry in entries:
        yield Outcome(int(entry["attempt"]), str(entry["outcome"]), datetime.fromisoformat(entry["at"]))


def _first(problems: list[str], limit: int = 20) -> list[str]:
    if len(problems) <= limit:
        return problems
    return [*problems[:limit], f"... and {len(problems) - limit} more"]


def _slowest_calls(rehearsal: Rehearsal) -> dict[str, str]:
    found = {}
    for process in rehearsal.processes:
        for line in process.log.read_text(errors="replace").splitlines():
            if "slowest call" in line:
                found[process.name] = line.rsplit("slowest call ", 1)[1]
    return found


def this_release() -> str:
    """The commit under test, and whether the work tree differs from it."""
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain", "--untracked-files=no") else ""
    return _git("rev-parse", "--short", "HEAD") + dirty


def summary(rehearsal: Rehearsal, figures: dict[str, Any], previous: str, current: str) -> str:
    args = rehearsal.args
    lines = [
        "=== upgrade rehearsal summary",
        f"previous release {previous[:7]} -> this release {current}",
        f"server {rehearsal.server}; fill {args.jobs:,} finished and "
        f"{args.future:,} future jobs; {args.rate:g} jobs/s asked of {args.producers} producer(s) "
        f"for {figures.get('load seconds', 0):.0f} s, {args.workers} workers of concurrency {args.concurrency}",
    ]
    lines += [f"{name}: {seconds:.1f} s" for name, seconds in rehearsal.durations.items()]
    for name, value in figures.items():
        if name == "load seconds":
            continue
        lines.append(f"{name}: {json.dumps(value) if isinstance(value, dict) else f'{value:,}'}")
    lines.append(f"logs: {rehearsal.run_dir}")
    if rehearsal.problems:
        lines.append(f"FAILED: {len(rehearsal.problems)} problems")
        lines += [f"  - {problem}" for problem in rehearsal.problems]
    else:
        lines.append("OK: every job completed once, no attempt ran after another's outcome, no process erred")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# The command


def _positive(kind: Callable[[str], float | int]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
        return value

    return parse


def _not_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.rehearse_upgrade", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--jobs", type=_not_negative, default=20_000, help="finished jobs filled before the load")
    parser.add_argument("--future", type=_not_negative, help="jobs due in a month filled too (default: --jobs / 10)")
    parser.add_argument("--seconds", type=_positive(float), default=20.0, help="how long the load runs")
    parser.add_argument("--rate", type=_positive(float), default=40.0, help="jobs per second from all producers")
    parser.add_argument("--workers", type=_positive(int), default=2, help="workers of each release")
    parser.add_argument("--producers", type=_positive(int), default=2, help="producers (Python and SQL in turn)")
    parser.add_argument("--concurrency", type=_positive(int), default=10, help="each worker's --concurrency")
    parser.add_argument(
        "--previous",
        default=last_recorded_release(),
        metavar="COMMIT",
        help="the previous release (default: the newest release CHANGELOG.md names with its commit)",
    )
    parser.add_argument("--dsn", help="the server (default: JOBBUS_TEST_DSN, else the embedded server)")
    parser.add_argument("--progress-every", type=_positive(float), default=5.0, metavar="S")
    parser.add_argument("--migrate-timeout", type=_positive(float), default=600.0, metavar="S")
    parser.add_argument("--drain-timeout", type=_positive(float), default=120.0, metavar="S")
    args = parser.parse_args(argv)
    if args.future is None:
        args.future = args.jobs // 10
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    current = this_release()
    try:
        old_venv, previous = previous_release(args.previous)
    except RehearsalError as exc:
        print(f"rehearse-upgrade: {exc}", file=sys.stderr)
        return 1
    run_dir = CACHE / "runs" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with fresh_database(args.dsn or server_dsn(), None) as dsn:
            rehearsal = Rehearsal(args, dsn, old_venv, run_dir, server=query(dsn, "SHOW server_version")[0][0])
            figures: dict[str, Any] = {}
            try:
                figures = rehearse(rehearsal)
                figures.update(verdict(rehearsal, figures))
            except (RehearsalError, psycopg.Error) as exc:
                rehearsal.problems.append(f"step {rehearsal.phase}: the rehearsal itself failed: {exc}")
            finally:
                rehearsal.stop_everything()
            rehearsal.durations["total"] = time.monotonic() - rehearsal.started
            print(summary(rehearsal, figures, previous, current), flush=True)
    except psycopg.OperationalError as exc:
        print(f"rehearse-upgrade: the database server: {exc}", file=sys.stderr)
        return 1
    return 1 if rehearsal.problems else 0


if __name__ == "__main__":
    sys.exit(main())
