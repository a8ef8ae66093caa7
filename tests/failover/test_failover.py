"""Failover to a promoted standby under load, with synchronous and with asynchronous replication.

Worker processes and producers run on one DSN naming both servers (`host=a,b port=p1,p2
target_session_attrs=read-write`). Mid-load the primary is killed (SIGKILL to the postmaster and
every process it started, as when its machine is lost) and the standby is promoted (`pg_ctl promote`).

- Synchronous replication: every acknowledged job is on the new primary and completes.
- Asynchronous replication, the primary's WAL sender stopped for a while before the failure (a
  standby fallen behind, as over a stalled link): only jobs acknowledged after the standby's last
  replayed commit may be missing, and only periodic ticks enqueued after it may run twice.
- Both: the outcome stored for each job is the newest run's (no stale attempt overwrites it), no run
  starts after its job's outcome was written, every job on the new primary ends `completed` within a
  bound, and no worker or producer is restarted: they ride the failover.

Each mode prints a `FAULT FIGURES` line and appends it to .jobbus/fault-figures.jsonl; docs/reliability.md
has the full run (JOBBUS_FULL_FAULTS=1, `make faults`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import jobbus
from jobbus import schema
from tests.cluster import Cluster, replicated_clusters
from tests.faults.harness import Figures, Fleet, scale
from tests.processes import wait_until

KINDS = ("python", "sql", "then", "keyed")
#: A lease shorter than a failover, so that jobs whose outcome was lost run again within the test.
LEASE = {"JOBBUS_LEASE_SECONDS": "3", "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5"}
#: Clocks of the ledger (each process's `time.time()`) and of the database are one machine's clock;
#: commit timestamps are taken a little before the commit record is written.
CLOCK_SLACK = 0.05


def multi_host_dsn(primary: Cluster, standby: Cluster) -> str:
    return (
        f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres dbname=postgres"
        " target_session_attrs=read-write connect_timeout=2"
    )


@dataclass(frozen=True, slots=True)
class Ack:
    """A job a producer was told is enqueued, and when (after the answer came back)."""

    kind: str
    job_id: uuid.UUID
    label: str
    at: float


@dataclass(slots=True)
class Run:
    """One run of a handler, from the ledger: one lease token, its start and (if it returned) end."""

    job_id: uuid.UUID
    attempt: int
    lease_token: str
    name: str
    tick: float
    started: float
    ended: float | None = None


class Producers:
    """One thread per way of enqueueing, each scheduling until stopped and recording what it was told.

    A producer never restarts: a refused enqueue (`DatabaseUnavailableError`, a dropped connection on
    the SQL API) is counted and not acknowledged, and the producer goes on.
    """

    def __init__(self, dsn: str, interval: float) -> None:
        self.dsn = dsn
        self.interval = interval
        self.acks: list[Ack] = []
        self.refused: Counter[str] = Counter()
        self.crashes: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._guarded, args=(kind,), daemon=True) for kind in KINDS]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _acknowledge(self, kind: str, job_id: uuid.UUID, label: str) -> None:
        with self._lock:
            self.acks.append(Ack(kind, job_id, label, time.time()))

    def _guarded(self, kind: str) -> None:
        try:
            self._produce_sql() if kind == "sql" else self._produce_python(kind)
        except BaseException as exc:  # reported by the test instead of dying silently
            self.crashes.append(f"{kind}: {type(exc).__name__}: {exc}")

    def _produce_python(self, kind: str) -> None:
        app = jobbus.App(dsn=self.dsn)
        with app.sync:
            for n in range(10**9):
                if self._stop.is_set():
                    return
                label = f"{kind}-{n}"
                options: dict[str, Any] = {"max_attempts": 50}
                if kind == "then":
                    options["then"] = jobbus.JobRequest("ledger", {"follows": label}, max_attempts=50)
                elif kind == "keyed":
                    options["unique_key"] = label
                try:
                    job_id = app.sync.schedule("ledger", {"label": label}, **options)
                except jobbus.DatabaseUnavailableError:
                    self.refused[kind] += 1
                    continue
                self._acknowledge(kind, job_id, label)
                self._stop.wait(self.interval)

    def _produce_sql(self) -> None:
        conn: psycopg.Connection[tuple[Any, ...]] | None = None
        for n in range(10**9):
            if self._stop.is_set():
                break
            label = f"sql-{n}"
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, autocommit=True)
                row = conn.execute(
                    "SELECT jobbus.schedule('ledger', %s, %s)", (Jsonb({"label": label}), Jsonb({"max_attempts": 50}))
                ).fetchone()
            except psycopg.OperationalError:
                self.refused["sql"] += 1
                if conn is not None:
                    conn.close()
                conn = None
                self._stop.wait(0.1)
                continue
            assert row is not None
            self._acknowledge("sql", row[0], label)
            self._stop.wait(self.interval)
        if conn is not None:
            conn.close()


def read_ledger(path: Path) -> dict[uuid.UUID, list[Run]]:
    runs: dict[tuple[uuid.UUID, str], Run] = {}
    for line in path.read_text().splitlines():
        event, job_id, attempt, token, name, tick, at = line.split(" ")
        key = (uuid.UUID(job_id), token)
        if event == "start":
            runs[key] = Run(key[0], int(attempt), token, name, float(tick), float(at))
        else:
            runs[key].ended = float(at)
    by_job: dict[uuid.UUID, list[Run]] = defaultdict(list)
    for run in sorted(runs.values(), key=lambda r: r.started):
        by_job[run.job_id].append(run)
    return by_job


def statuses(dsn: str) -> Counter[str]:
    with psycopg.connect(dsn, connect_timeout=2) as conn:
        return Counter(s for (s,) in conn.execute("SELECT status FROM jobbus.job").fetchall())


def _one(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql.encode()).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.timeout(scale(180, 900))
@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "asynchronous"])
def test_workers_and_producers_ride_a_failover_to_the_promoted_standby(synchronous: bool, tmp_path: Path) -> None:
    load_seconds = scale(3, 60)
    behind_seconds = scale(2, 3)  # asynchronous: how long the primary sends no WAL before it fails
    after_seconds = scale(3, 20)
    mode = "synchronous" if synchronous else "asynchronous"
    figures = Figures(f"failover to a promoted standby ({mode} replication)", jobs=0, faults=1)
    ledger = tmp_path / "runs"
    ledger.touch()
    with replicated_clusters(synchronous=synchronous) as (primary, standby):
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            schema.migrate(conn, "jobbus")
        dsn = multi_host_dsn(primary, standby)
        started = time.monotonic()
        fleet = Fleet(
            dsn,
            2,
            "--concurrency",
            "4",
            app="tests.failover.apps:app",
            env={**LEASE, "FAILOVER_LEDGER": str(ledger)},
        )
        producers = Producers(dsn, interval=0.05)
        behind_since: float | None = None
        sender = int(_one(primary.dsn, "SELECT pid FROM pg_stat_replication WHERE application_name = 'standby'"))
        try:
            wait_until(lambda: ledger.stat().st_size > 0, 60, "the fleet to run a job")
            time.sleep(load_seconds)  # the load runs: nothing to wait for but time
            if not synchronous:
                behind_since = time.time()
                os.kill(sender, signal.SIGSTOP)
                time.sleep(behind_seconds)  # the standby falls behind (a stalled link) while the load goes on
            primary_lsn = _one(primary.dsn, "SELECT pg_current_wal_lsn()::text")
            primary.kill()
            failed_at = time.time()  # every process of the primary is gone
            standby.promote()
            promoted_at = time.time()
            replay_lsn = _one(standby.dsn, "SELECT pg_last_wal_replay_lsn()::text")
            replayed_until = float(_one(standby.dsn, "SELECT extract(epoch FROM pg_last_xact_replay_timestamp())"))
            # WAL the primary had written (by the last LSN read from it) that the standby never replayed.
            behind_bytes = max(0, int(_one(standby.dsn, f"SELECT pg_wal_lsn_diff('{primary_lsn}', '{replay_lsn}')")))
            time.sleep(after_seconds)  # the load goes on against the new primary
            producers.stop()
            admin = jobbus.App(dsn=dsn)
            with admin.sync:
                admin.sync.pause_periodic("failover-tick")  # no new tick while the books are drawn up
            wait_until(lambda: not {"queued", "running"} & set(statuses(standby.dsn)), scale(90, 300), "no job left")
        finally:
            with contextlib.suppress(ProcessLookupError):  # never leave a stopped process behind
                os.kill(sender, signal.SIGKILL)
            producers.stop()
            codes = fleet.stop()
        figures.seconds = round(time.monotonic() - started, 1)
        figures.max_recovery_seconds = round(promoted_at - failed_at, 1)
        with psycopg.connect(standby.dsn, autocommit=True) as conn:
            jobs = {
                row[0]: row[1:]
                for row in conn.execute(
                    "SELECT id, status, result, extract(epoch FROM finished_at), configuration_data, name,"
                    " extract(epoch FROM available_at) FROM jobbus.job"
                ).fetchall()
            }
    runs = read_ledger(ledger)

    # Producers and workers rode the failover: none restarted, all kept going on the new primary.
    assert not producers.crashes, f"a producer died: {producers.crashes}"
    assert fleet.restarts == 0 and codes == [0, 0], (fleet.restarts, codes)
    for kind in KINDS:
        assert any(a.kind == kind and a.at > promoted_at for a in producers.acks), f"{kind} went on after the promotion"

    # What was lost: nothing (synchronous), or only what was acknowledged after the last replayed commit.
    lost = [a for a in producers.acks if a.job_id not in jobs]
    figures.jobs = len(producers.acks)
    figures.lost = len(lost)
    if synchronous:
        assert lost == [], f"{len(lost)} acknowledged jobs lost with a synchronous standby"
    else:
        early = [a for a in lost if a.at < replayed_until - CLOCK_SLACK]
        assert early == [], f"lost though acknowledged before the standby's last replayed commit: {early[:5]}"
        late = [a for a in lost if a.at > promoted_at]
        assert late == [], f"lost though acknowledged by the new primary: {late[:5]}"

    # Every job on the new primary completed; a follow-up exists for every completed parent with `then=`.
    assert Counter(status for status, *_ in jobs.values()) == Counter(completed=len(jobs))
    follows = {config.get("follows") for _, _, _, config, _, _ in jobs.values()}
    parents = [a for a in producers.acks if a.kind == "then" and a.job_id in jobs]
    assert all(a.label in follows for a in parents), "a completed job with then= has its follow-up"

    # No stale attempt overwrote a newer one, and no handler ran after its job's outcome was written.
    reran = 0
    for job_id, (_, result, finished_at, _, _, _) in jobs.items():
        job_runs = runs.get(job_id, [])
        assert job_runs, f"job {job_id} completed without a run"
        newest = job_runs[-1]
        assert result["lease_token"] == newest.lease_token, f"job {job_id}: an older run's outcome was stored"
        assert newest.started <= float(finished_at) + CLOCK_SLACK, f"job {job_id} ran after its outcome"
        reran += len(job_runs) > 1
    figures.duplicates = reran
    # Never twice at once: a run of a job starts only after the one before it ended. Guaranteed while the
    # new primary knows every lease (synchronous); reported for the asynchronous run, whose handlers are
    # shorter than a failover, so that a lost claim is never run beside the handler that held it.
    overlapping = [
        job_id
        for job_id, job_runs in runs.items()
        if any(before.ended is None or before.ended > after.started for before, after in itertools.pairwise(job_runs))
    ]
    if synchronous:
        assert overlapping == [], f"runs of one job overlapped: {overlapping[:5]}"

    # Periodic ticks: each runs once, unless its enqueue was lost with the primary (asynchronous only).
    ticks: dict[float, set[uuid.UUID]] = defaultdict(set)
    for job_runs in runs.values():
        for run in job_runs:
            if run.name == "failover-tick":
                ticks[run.tick].add(run.job_id)
    doubled = {tick: ids for tick, ids in ticks.items() if len(ids) > 1}
    assert any(r.name == "failover-tick" and r.started > promoted_at for rs in runs.values() for r in rs), (
        "periodic ticks went on after the promotion"
    )
    if synchronous:
        assert doubled == {}, f"periodic ticks ran twice: {doubled}"
    else:
        for ids in doubled.values():
            first = min(runs[i][0].started for i in ids)
            assert first >= replayed_until - CLOCK_SLACK, "a tick ran twice though enqueued before the last replay"

    figures.executions = sum(len(r) for r in runs.values())
    figures.notes = {
        "acknowledged": dict(Counter(a.kind for a in producers.acks)),
        "lost": dict(Counter(a.kind for a in lost)),
        "refused": dict(producers.refused),
        "overlapping_runs": len(overlapping),
        "ticks": len(ticks),
        "tick_jobs": sum(1 for j in jobs.values() if j[4] == "failover-tick"),
        "ticks_ran_twice": len(doubled),
        "standby_behind_bytes": behind_bytes,
        "standby_behind_seconds": round(failed_at - replayed_until, 2),
        "stopped_sending_seconds": None if behind_since is None else round(failed_at - behind_since, 2),
        "replay_lsn": replay_lsn,
        "primary_lsn": primary_lsn,
    }
    figures.report()
