"""The fault-injection harness: a producer, supervised worker processes, a fault, and the books.

Every scenario runs on a throwaway cluster (never the shared server). Handlers record every
execution; at the end the books must show every job in its expected terminal state, no job lost,
and re-executions only for jobs that were in flight when a fault hit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

import jobbus
from jobbus import schema
from tests.cluster import Cluster, throwaway_cluster
from tests.processes import ROOT, prepare, start_worker

FULL = os.environ.get("JOBBUS_FULL_FAULTS") == "1"
FIGURES = ROOT / ".jobbus" / "fault-figures.jsonl"
LOGS = ROOT / ".jobbus" / "fault-logs"
FAST_LEASE = {"JOBBUS_LEASE_SECONDS": "2", "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5"}


def scale(ci: int, full: int) -> int:
    return full if FULL else ci


@dataclass
class Figures:
    scenario: str
    jobs: int
    faults: int = 0
    executions: int = 0
    duplicates: int = 0
    lost: int = 0
    seconds: float = 0.0
    max_recovery_seconds: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def report(self) -> None:
        line = json.dumps(asdict(self))
        print(f"\nFAULT FIGURES {line}")
        FIGURES.parent.mkdir(parents=True, exist_ok=True)
        with FIGURES.open("a") as out:
            out.write(line + "\n")


class Fleet:
    """Worker processes kept alive like a supervisor would: a dead one is restarted under its id."""

    def __init__(
        self, dsn: str, count: int, *args: str, env: dict[str, str] | None = None, app: str = "tests.apps:app"
    ) -> None:
        self.dsn = dsn
        self.args = args
        self.env = env or {}
        self.app = app
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.logs: dict[str, Path] = {}
        self.restarts = 0
        #: What the database held when the fleet was told to stop: printed with the logs if the test fails.
        self.state_at_stop = ""
        STARTED.append(self)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        for n in range(count):
            self._spawn(f"w{n}")
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def _spawn(self, worker_id: str) -> None:
        proc = start_worker(self.dsn, "--worker-id", worker_id, *self.args, env=self.env, app=self.app)
        # Copy output in the background so a chatty worker never blocks on a full pipe; the logs stay
        # in .jobbus/fault-logs for when a scenario fails.
        LOGS.mkdir(parents=True, exist_ok=True)
        ports = str(conninfo_to_dict(self.dsn).get("port", "")).replace(",", "+")
        log = LOGS / f"{ports}-{worker_id}.log"
        threading.Thread(target=_copy_output, args=(proc, log), daemon=True).start()
        self.procs[worker_id] = proc
        self.logs[worker_id] = log

    def _supervise(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                for worker_id, proc in list(self.procs.items()):
                    if proc.poll() is not None:
                        self.restarts += 1
                        self._spawn(worker_id)

    def explain(self, lines: int = 40) -> str:
        """The database's state at stop and the end of each worker's log."""
        parts = [self.state_at_stop]
        for worker_id, log in self.logs.items():
            tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
            parts.append(f"--- {worker_id} ({log}), last {len(tail)} lines:\n" + "\n".join(tail))
        return "\n".join(parts)

    def signal_one(self, worker_id: str, sig: signal.Signals) -> None:
        with self._lock:
            proc = self.procs[worker_id]
            if proc.poll() is None:
                proc.send_signal(sig)

    def stop(self) -> list[int]:
        self.state_at_stop = database_state(self.dsn)
        self._stop.set()
        self._supervisor.join()
        codes = []
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                codes.append(proc.wait(30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes


#: Fleets started by the running test (tests/faults/conftest.py prints them when it fails).
STARTED: list[Fleet] = []


def database_state(dsn: str) -> str:
    """Jobs by status (running ones by lease), the leader and the worker rows: why a wait may have timed out."""
    try:
        with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
            jobs = conn.execute(
                "SELECT status, CASE WHEN status <> 'running' THEN '' WHEN lease_expires_at < now()"
                " THEN 'lease expired' ELSE 'lease live' END, count(*), min(available_at) - now()"
                " FROM jobbus.job GROUP BY 1, 2 ORDER BY 1, 2"
            ).fetchall()
            leader = conn.execute("SELECT worker_id, expires_at - now() FROM jobbus.leader").fetchall()
            workers = conn.execute(
                "SELECT id, state, in_flight, now() - last_seen_at FROM jobbus.worker ORDER BY id"
            ).fetchall()
    except psycopg.Error as exc:
        return f"database state at stop: unreadable ({exc})"
    return f"database state at stop: jobs {jobs}; leader {leader}; workers {workers}"


def _copy_output(proc: subprocess.Popen[str], log: Path) -> None:
    assert proc.stdout is not None
    with log.open("a") as out:
        for line in proc.stdout:
            out.write(line)


@contextmanager
def cluster_with_schema() -> Iterator[Cluster]:
    with throwaway_cluster() as cluster:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            schema.migrate(conn, "jobbus")
        prepare(cluster.dsn)
        yield cluster


def schedule(dsn: str, count: int, job_type: str = "record", **config: Any) -> list[uuid.UUID]:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        return app.sync.schedule_many(job_type, [dict(config) for _ in range(count)], max_attempts=50)


def completed(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'completed'").fetchone()
        return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return -1


def time_to_progress(dsn: str, total: int, timeout: float = 120) -> float:
    """Seconds until one more job completes (or all are done): how long the fleet took to recover."""
    start = time.monotonic()
    before = completed(dsn)
    while True:
        now = completed(dsn)
        if before < 0 <= now:
            before = now  # the server was still down: count from when it answers again
        elif now > before >= 0 or now == total:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError("no progress after the fault")
        time.sleep(0.05)


def books(dsn: str, ids: list[uuid.UUID], figures: Figures, *, max_duplicates: int) -> Figures:
    """Check that every job completed exactly as expected and fill in the figures."""
    with psycopg.connect(dsn) as conn:
        statuses = Counter(
            s for (s,) in conn.execute("SELECT status FROM jobbus.job WHERE id = ANY(%s)", (ids,)).fetchall()
        )
        runs = Counter(
            r[0] for r in conn.execute("SELECT job_id FROM public.executions WHERE job_id = ANY(%s)", (ids,)).fetchall()
        )
    figures.executions = sum(runs.values())
    figures.lost = sum(1 for i in ids if runs[i] == 0) + sum(n for s, n in statuses.items() if s != "completed")
    figures.duplicates = sum(n - 1 for n in runs.values() if n > 1)
    figures.report()
    assert statuses == Counter(completed=len(ids)), f"not every job completed: {statuses}"
    assert figures.lost == 0
    assert set(runs) == set(ids)
    assert figures.duplicates <= max_duplicates, "re-executions beyond the jobs in flight at the faults"
    return figures
