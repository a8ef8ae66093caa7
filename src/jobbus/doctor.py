"""`examine`: what `jobbus doctor` finds wrong with a database and the fleet working on it, and the fix.

Each finding is one line with a level (`ok`, `warning` or `error`) and what to do about it. The checks
read the server's settings and statistics views and the worker registry; nothing is written or locked,
so it is safe to run against a busy production database at any time.

    async with app:
        for finding in await jobbus.doctor.examine(app):
            print(finding.level, finding.check, finding.message)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

import psycopg

from jobbus import schema
from jobbus.store.doctor import DoctorStore, IdleTransaction, LiveWorker, ServerFacts, Standby
from jobbus.store.statements import Statement, run_async

if TYPE_CHECKING:
    from jobbus.app import App

T = TypeVar("T")

Level = Literal["ok", "warning", "error"]
LEVELS: tuple[Level, ...] = ("ok", "warning", "error")

#: A worker's clock further than this from the database's is reported.
CLOCK_SKEW_SECONDS = 1.0
#: Live workers' pools above this share of the server's connections are reported before they overflow it.
CONNECTIONS_WARNING_SHARE = 0.8
#: The schema version whose registry rows carry `pool_size` and `clock_at`.
FLEET_COLUMNS_VERSION = 27


@dataclass(frozen=True, slots=True)
class Finding:
    check: str  # server, migrations, replication, connections, autovacuum, clock, idle_transactions
    level: Level
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level, "message": self.message}


async def examine(app: App) -> list[Finding]:
    """Every check, in a fixed order; a check that cannot run says why instead of failing the others."""
    store = DoctorStore(app.settings.schema)
    name = app.settings.schema

    async def run(statement: Statement[T]) -> T:
        async with app.pool.connection() as conn:
            return await run_async(conn, statement)

    server = await run(store.server())
    try:
        version = await run(store.schema_version())
    except psycopg.errors.UndefinedTable:
        version = 0
    findings = [check_server(server), check_migrations(name, version), check_replication(await run(store.standbys()))]
    if version < FLEET_COLUMNS_VERSION:
        why = (
            f"the schema is at version {version}; workers report their pools and clocks from version "
            f"{FLEET_COLUMNS_VERSION}: run `jobbus migrate`"
        )
        findings.append(Finding("connections", "warning", f"not checked: {why}"))
        findings.append(check_autovacuum(name, server))
        findings.append(Finding("clock", "warning", f"not checked: {why}"))
    else:
        workers = await run(store.live_workers())
        findings += [check_connections(server, workers), check_autovacuum(name, server), *check_clocks(workers)]
    lease = app.settings.lease_seconds
    findings += check_idle_transactions(await run(store.idle_transactions(lease)), lease)
    return findings


def check_server(server: ServerFacts) -> Finding:
    needed = schema.MIN_SERVER_VERSION // 10000
    if server.version_num < schema.MIN_SERVER_VERSION:
        return Finding(
            "server",
            "error",
            f"PostgreSQL {server.version} is too old: jobbus needs PostgreSQL {needed} or newer; upgrade the server",
        )
    return Finding("server", "ok", f"PostgreSQL {server.version} (jobbus needs {needed} or newer)")


def check_migrations(name: str, version: int) -> Finding:
    latest = schema.latest_version()
    if version == 0:
        return Finding("migrations", "error", f"schema {name} is missing: run `jobbus migrate`")
    if version < latest:
        pending = ", ".join(str(v) for v in range(version + 1, latest + 1))
        return Finding(
            "migrations",
            "error",
            f"schema {name} is at version {version}, {latest - version} migration(s) pending ({pending}): run "
            "`jobbus migrate` (workers of this release refuse to start until then)",
        )
    if version > latest:
        return Finding(
            "migrations",
            "warning",
            f"schema {name} is at version {version}, newer than this jobbus knows ({latest}): upgrade jobbus here",
        )
    return Finding("migrations", "ok", f"schema {name} is at version {version}, nothing pending")


def check_replication(standbys: list[Standby]) -> Finding:
    if not standbys:
        return Finding(
            "replication",
            "ok",
            "no standby streams from this server: nothing to fail over to (the jobs are as safe as its backups)",
        )
    unknown = [s.name for s in standbys if s.sync_state is None]
    if unknown:
        return Finding(
            "replication",
            "warning",
            f"{len(standbys)} standby(s) stream from this server, but this role cannot see whether "
            f"{', '.join(unknown)} are synchronous: run `jobbus doctor` as a role with pg_monitor",
        )
    asynchronous = [s.name for s in standbys if s.sync_state not in ("sync", "quorum")]
    if asynchronous:
        return Finding(
            "replication",
            "warning",
            f"standby {', '.join(asynchronous)} is asynchronous: a failover to it can lose acknowledged enqueues "
            "and outcomes, and periodic ticks (docs/reliability.md); name it in synchronous_standby_names "
            "if that loss matters",
        )
    names = ", ".join(s.name for s in standbys)
    return Finding("replication", "ok", f"standby {names} is synchronous: a failover to it loses no acknowledged work")


def check_connections(server: ServerFacts, workers: list[LiveWorker]) -> Finding:
    budget = server.max_connections - server.reserved_connections
    known = [w.pool_size for w in workers if w.pool_size is not None]
    if not workers:
        return Finding("connections", "ok", f"no live worker; the server allows {budget} connections")
    total = sum(known)
    uncounted = len(workers) - len(known)
    note = f" ({uncounted} worker(s) of an earlier release not counted)" if uncounted else ""
    facts = (
        f"{len(known)} live worker(s) may open {total} connections, of the {budget} the server allows "
        f"(max_connections {server.max_connections}, {server.reserved_connections} reserved){note}"
    )
    fix = (
        "lower pool_max_size or run fewer workers, raise max_connections, or put PgBouncer in front "
        "(with transaction_pooling=True)"
    )
    if total > budget:
        return Finding("connections", "error", f"{facts}: under load they are refused connections; {fix}")
    if total > CONNECTIONS_WARNING_SHARE * budget:
        return Finding("connections", "warning", f"{facts}: little room is left for anything else; {fix}")
    return Finding("connections", "ok", facts)


def check_autovacuum(name: str, server: ServerFacts) -> Finding:
    if not server.job_table_exists:
        return Finding("autovacuum", "warning", f"not checked: {name}.job does not exist (run `jobbus migrate`)")
    if not server.autovacuum:
        return Finding(
            "autovacuum",
            "warning",
            "autovacuum is off for the server (autovacuum or track_counts): the job table bloats with every "
            "finished job and claims slow down; turn it on",
        )
    if not server.job_autovacuum:
        return Finding(
            "autovacuum",
            "warning",
            f"autovacuum is off for {name}.job (autovacuum_enabled = false): it bloats with every finished job and "
            f"claims slow down; run ALTER TABLE {name}.job RESET (autovacuum_enabled)",
        )
    return Finding("autovacuum", "ok", f"autovacuum is on for {name}.job")


def check_clocks(workers: list[LiveWorker]) -> list[Finding]:
    skewed = [w for w in workers if w.clock_lead_seconds is not None and abs(w.clock_lead_seconds) > CLOCK_SKEW_SECONDS]
    findings = [
        Finding(
            "clock",
            "warning",
            f"worker {w.worker_id} (host {w.host}) has a clock {abs(lead):.1f} s "
            f"{'ahead of' if lead > 0 else 'behind'} the database's: its logs and the times its handlers read "
            "disagree with the jobs' (jobbus times leases by the database); synchronise that host's clock (NTP)",
        )
        for w in skewed
        if (lead := w.clock_lead_seconds) is not None
    ]
    if findings:
        return findings
    reported = sum(1 for w in workers if w.clock_lead_seconds is not None)
    if not reported:
        return [Finding("clock", "ok", "no live worker reports its clock")]
    return [
        Finding("clock", "ok", f"{reported} live worker(s) within {CLOCK_SKEW_SECONDS:g} s of the database's clock")
    ]


def check_idle_transactions(sessions: list[IdleTransaction], lease_seconds: float) -> list[Finding]:
    if not sessions:
        return [
            Finding(
                "idle_transactions",
                "ok",
                f"no session idle in a transaction for longer than the lease ({lease_seconds:g} s)",
            )
        ]
    return [
        Finding(
            "idle_transactions",
            "warning",
            f"session {s.pid} (user {s.user}, from {s.client}) has been idle in a transaction for "
            f"{s.idle_seconds:.0f} s, longer than the lease ({lease_seconds:g} s): it holds its locks and keeps "
            f"vacuum from removing finished jobs; end it (SELECT pg_terminate_backend({s.pid})) and fix what leaves "
            "it open, or set idle_in_transaction_session_timeout",
        )
        for s in sessions
    ]


def summary(findings: list[Finding]) -> dict[Level, int]:
    """How many findings of each level, for the command's closing line."""
    return {level: sum(1 for f in findings if f.level == level) for level in LEVELS}
