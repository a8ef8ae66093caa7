"""Operating workers from anywhere: pause, resume, drain, stop, restart, and what is going on.

Plain async functions over an open `App` (``async with app:``); the `jobbus` command line is a thin
layer over them. Everything goes through PostgreSQL, so it works across hosts and without signals:

- `pause` / `resume` change a **durable** desired state (table ``pause``): a worker started later under
  a paused target starts paused. Pausing a queue stops claiming from that queue only.
- `drain` (run until no job is available, then exit 0), `stop` (finish in-flight jobs, exit 0) and
  `restart` (the same, exit 75) are **one-shot** commands for the worker processes alive when they
  are issued (a process started later does not apply them).

Each call is one transaction that records a command numbered by a generation and the workers it
addresses now, and sends a NOTIFY so they apply it within one poll interval. A worker reads every
command issued since it started whose target matches it, so one cut off from the database applies
the command when it is back. Workers acknowledge the generation they applied, per process (a worker
restarted under the same id does not acknowledge for its predecessor); `wait_for_acks` waits for that.

    async with app:
        issued = await jobbus.control.pause(app, queue="emails")
        report = await jobbus.control.wait_for_acks(app, issued, timeout=30)
        assert report.complete, report.missing
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal, TypeVar

import psycopg

from jobbus import views
from jobbus.limits import QueueSettings
from jobbus.periodic import Periodic
from jobbus.store.control import ControlStore, PauseTarget, UnhandledWork, WorkerInfo
from jobbus.store.statements import Statement, run_async
from jobbus.views import QueueStatus

if TYPE_CHECKING:
    from jobbus.app import App

__all__ = [
    "FORGET_WORKERS_AFTER",
    "AckReport",
    "Action",
    "CommandIssued",
    "PauseTarget",
    "QueueStatus",
    "StatusReport",
    "Target",
    "UnhandledWork",
    "WorkerInfo",
    "WorkersSummary",
    "count_prunable",
    "drain",
    "issue",
    "list_workers",
    "pause",
    "queue_status",
    "restart",
    "resume",
    "stop",
    "summarize_workers",
    "unhandled_work",
    "wait_for_acks",
]

_T = TypeVar("_T")
Action = Literal["pause", "resume", "drain", "stop", "restart"]
#: Stopped or gone workers are forgotten (their registry row deleted) this long after they were last seen.
FORGET_WORKERS_AFTER = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class Target:
    """Whom a command is for: one worker id, one queue, or every worker."""

    kind: Literal["all", "queue", "worker"]
    name: str = ""

    @classmethod
    def of(cls, *, worker_id: str | None = None, queue: str | None = None, all: bool = False) -> Target:
        """Exactly one of `worker_id`, `queue`, `all`; anything else raises `ValueError`."""
        given = [name for name, value in (("worker_id", worker_id), ("queue", queue), ("all", all)) if value]
        if len(given) != 1:
            raise ValueError(
                "a control command needs exactly one target: worker_id=..., queue=... or all=True"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if all:
            return cls("all")
        if worker_id is not None:
            return cls("worker", _name("worker_id", worker_id))
        return cls("queue", _name("queue", queue or ""))

    def __str__(self) -> str:
        return "all workers" if self.kind == "all" else f"{self.kind} {self.name}"

    @property
    def audited(self) -> str:
        """The target as the audit trail names it: `all`, `queue:NAME` or `worker:ID`."""
        return "all" if self.kind == "all" else f"{self.kind}:{self.name}"


@dataclass(frozen=True, slots=True)
class CommandIssued:
    """A recorded command: its generation and the workers (with their process instances) it addresses."""

    action: Action
    target: Target
    generation: int
    worker_ids: tuple[str, ...]
    instance_ids: tuple[uuid.UUID | None, ...]
    issued_at: datetime
    #: pause/resume only: whether the durable state changed (False: the target was already paused/resumed).
    state_changed: bool


@dataclass(frozen=True, slots=True)
class AckReport:
    """Where the addressed workers stand after `wait_for_acks`."""

    generation: int
    acknowledged: tuple[str, ...]  # the process addressed applied the command
    missing: tuple[str, ...]  # live, but did not acknowledge in time
    gone: tuple[str, ...]  # stopped, declared dead or forgotten without acknowledging: nothing to wait for
    #: Never reached: silent since (cut off from the database, hung, or killed and not yet declared
    #: dead), or restarted under the same id before applying the command. It applies the command if
    #: it comes back; its predecessor's restart does not count.
    unreachable: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.missing and not self.unreachable


@dataclass(frozen=True, slots=True)
class WorkersSummary:
    live: int
    gone: int
    stopped: int
    by_state: dict[str, int]  # live workers by reported state
    in_flight: int
    capacity: int  # sum of live workers' concurrency


@dataclass(frozen=True, slots=True)
class StatusReport:
    """`queue_status`: every queue, the workers, and what is paused."""

    queues: tuple[QueueStatus, ...]
    workers: WorkersSummary
    pauses: tuple[PauseTarget, ...]
    periodics: tuple[Periodic, ...] = ()
    limits: tuple[QueueSettings, ...] = ()
    #: Per queue with limits: (jobs holding a valid lease, starts in its rate window or None).
    usage: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    #: Queued jobs no live worker can take, per (queue, type) (`unhandled_work`).
    unhandled: tuple[UnhandledWork, ...] = ()

    @property
    def paused_all(self) -> bool:
        return any(p.kind == "all" for p in self.pauses)


# -- commands ---------------------------------------------------------------------------------------


async def pause(
    app: App, *, worker_id: str | None = None, queue: str | None = None, all: bool = False
) -> CommandIssued:
    """Stop claiming on the target; workers stay alive and finish what they hold. Durable until `resume`."""
    return await issue(app, "pause", Target.of(worker_id=worker_id, queue=queue, all=all))


async def resume(
    app: App, *, worker_id: str | None = None, queue: str | None = None, all: bool = False
) -> CommandIssued:
    """Undo a `pause` of the same target (``resume(all=True)`` does not lift a queue or worker pause)."""
    return await issue(app, "resume", Target.of(worker_id=worker_id, queue=queue, all=all))


async def drain(
    app: App, *, worker_id: str | None = None, queue: str | None = None, all: bool = False
) -> CommandIssued:
    """Targeted live workers process until no job is available for them, then exit 0."""
    return await issue(app, "drain", Target.of(worker_id=worker_id, queue=queue, all=all))


async def stop(app: App, *, worker_id: str | None = None, queue: str | None = None, all: bool = False) -> CommandIssued:
    """Targeted live workers stop claiming, finish in-flight jobs and exit 0."""
    return await issue(app, "stop", Target.of(worker_id=worker_id, queue=queue, all=all))


async def restart(
    app: App, *, worker_id: str | None = None, queue: str | None = None, all: bool = False
) -> CommandIssued:
    """Like `stop`, but the workers exit 75 so their supervisor starts them again."""
    return await issue(app, "restart", Target.of(worker_id=worker_id, queue=queue, all=all))


async def issue(app: App, action: Action, target: Target) -> CommandIssued:
    """Record one command and its audit entry in one transaction and notify the workers (what the five
    verbs call)."""
    store = _store(app)
    async with app.pool.connection() as conn, conn.transaction():
        await run_async(conn, store.lock_commands())
        row = await run_async(conn, store.issue_command(action=action, target_kind=target.kind, target=target.name))
        details = {"generation": row.generation, "workers": len(row.worker_ids)}
        if action in ("pause", "resume"):
            details["changed"] = row.pause_changed
        await run_async(conn, app.audit_store.record(action, target.audited, details))
    return CommandIssued(
        action, target, row.generation, row.worker_ids, row.instance_ids, row.issued_at, row.pause_changed
    )


async def wait_for_acks(
    app: App, issued: CommandIssued, timeout: float | timedelta = 30.0, *, poll_interval: float = 0.2
) -> AckReport:
    """Wait until every addressed worker acknowledged `issued` or is gone, at most `timeout`.

    Never raises on timeout: the report names who acknowledged, who is `missing` (live, late) and who
    is `unreachable` (silent, or replaced by a new process under its id before applying it).
    """
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    deadline = time.monotonic() + max(0.0, seconds)
    store = _store(app)
    instances = dict(zip(issued.worker_ids, issued.instance_ids, strict=True))
    while True:
        acks = await _run(app, store.worker_acks(issued.worker_ids))
        acknowledged, missing, gone, unreachable = [], [], [], []
        for worker_id in issued.worker_ids:
            ack = acks.get(worker_id)
            replaced = ack is not None and ack.instance_id != instances[worker_id]
            if ack is None or ack.declared_dead or (ack.state == "stopped" and not replaced):
                if ack is not None and ack.acked_generation >= issued.generation and not replaced:
                    acknowledged.append(worker_id)
                else:
                    gone.append(worker_id)
            elif replaced or ack.silent:
                unreachable.append(worker_id)
            elif ack.acked_generation >= issued.generation:
                acknowledged.append(worker_id)
            else:
                missing.append(worker_id)
        waiting = missing or unreachable
        if not waiting or time.monotonic() >= deadline:
            return AckReport(issued.generation, tuple(acknowledged), tuple(missing), tuple(gone), tuple(unreachable))
        await asyncio.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))


# -- reads ------------------------------------------------------------------------------------------


async def list_workers(app: App, *, forget_after: timedelta | None = FORGET_WORKERS_AFTER) -> list[WorkerInfo]:
    """The worker registry, oldest first; gone = silent (by the worker's own timing) and not stopped.

    Rows of workers that stopped or went gone longer ago than `forget_after` are deleted on the way
    (None keeps them), so the registry does not grow with every deploy; a read-only role skips that.
    """
    store = _store(app)
    if forget_after is not None:
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            await _run(app, store.forget_workers(forget_after_seconds=forget_after.total_seconds()))
    return await _run(app, store.list_workers())


async def queue_status(app: App) -> StatusReport:
    """Per queue: counts by status (read now, as the dashboard reads them), the oldest waiting job,
    throughput; plus the workers and the pauses."""
    store = _store(app)
    pauses = await _run(app, store.pause_targets())
    limits = await app.list_queues()
    queues = await views.queue_table(
        app, paused=[p.target for p in pauses if p.kind == "queue"], also=[q.queue for q in limits]
    )
    workers = await list_workers(app)
    periodics = await app.list_periodic()
    usage = await app.queue_usage() if limits else {}
    unhandled = await unhandled_work(app)
    return StatusReport(
        tuple(queues),
        summarize_workers(workers),
        tuple(pauses),
        tuple(periodics),
        tuple(limits),
        usage,
        tuple(unhandled),
    )


async def unhandled_work(app: App, *, cap: int | None = None) -> list[UnhandledWork]:
    """Queued jobs that no live worker can take, per (queue, type): no live worker handles the type in
    that queue, or none serves the queue. A paused worker counts as live (it takes them once resumed);
    with no live worker at all, everything queued is listed. Counts stop at `cap` when given."""
    return await _run(app, _store(app).unhandled_work(cap=cap))


def summarize_workers(workers: list[WorkerInfo]) -> WorkersSummary:
    live = [w for w in workers if w.live]
    by_state: dict[str, int] = {}
    for worker in live:
        by_state[worker.state] = by_state.get(worker.state, 0) + 1
    return WorkersSummary(
        live=len(live),
        gone=sum(1 for w in workers if w.gone),
        stopped=sum(1 for w in workers if w.state == "stopped"),
        by_state=by_state,
        in_flight=sum(w.in_flight for w in live),
        capacity=sum(w.concurrency for w in live),
    )


async def count_prunable(app: App, older_than: timedelta, statuses: tuple[str, ...]) -> int:
    """How many jobs `App.prune(older_than, statuses)` would delete now (for a dry run)."""
    statement = _store(app).count_prunable(older_than_seconds=older_than.total_seconds(), statuses=statuses)
    return await _run(app, statement)


# -- helpers ----------------------------------------------------------------------------------------


def _store(app: App) -> ControlStore:
    return ControlStore(app.settings.schema)


async def _run(app: App, statement: Statement[_T]) -> _T:
    async with app.pool.connection() as conn:
        return await run_async(conn, statement)


def _name(what: str, value: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise ValueError(f"{what} must be a non-empty string of at most 255 characters, got {value!r}")
    return value
