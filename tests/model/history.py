"""The history a model run records, and the checker that holds it against the model.

A history is what happened, read back after the run: every handler execution (start and end by the
database clock), every step side effect, every event emitted and received, every completion a worker
reported, every fault injected, every limit in force, every status change of a job row (a trigger's
record), every cancel, delete and run_now call with its outcome, the secrets put into errors, and the
job rows at the end. The checker knows nothing of how jobbus works inside: it checks the promises of
SPEC sections 1, 12, 13, 16, 17 and 18 against what the handlers and the rows went through, and returns
each broken one as a `Violation` that names the jobs and intervals.

Where a promise is at-least-once by design (a frozen worker's handler running on after its lease was
taken back), the checker measures the window (`Report.measures`) and leaves the frozen worker's
intervals out of the overlap checks, never out of the report.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any

#: Limits apply to running workers within one poll interval (SPEC 12); a change is given this long.
LIMIT_GRACE = 3.0
#: A worker applies a pause when it next reads its control commands (every heartbeat, 1 s in the run).
PAUSE_GRACE = 5.0
#: The rate check counts starts (by their claim's database time) in windows this much shorter than `per`:
#: a claim's statement reads the clock once while its start times are stamped row by row.
START_SKEW = 0.25
#: A runnable job that could have run (free slot on a live worker, its queue and key below their
#: limits, no fault in the air) may wait this long before the checker calls the claims unfair.
FAIRNESS_BOUND = 10.0
#: After a worker serving the queue is killed or frozen, its leases hold their slots until they are
#: recovered (the run's lease and dead-worker timeouts are 6 s): the fairness check ignores that long.
FAULT_SETTLE = 15.0
#: After terminated backends, workers reconnect with a backoff of up to 5 s.
RECONNECT_SETTLE = 8.0
#: A worker process claims this long after its app was loaded (`Process.started`).
WORKER_WARMUP = 4.0
FAIRNESS_STEP = 0.25
#: A claim reads the clock once and stamps `started_at` row by row: a claim this close to a job's
#: `expires_at` is not called late.
EXPIRY_SKEW = 0.5
#: Statuses a producer call (cancel, delete, run_now) may have seen: those in force from this long
#: before the call (a transition is stamped before its transaction commits) until it returned.
CALL_SKEW = 2.0
#: A handler that raised has its outcome written by its own worker within this long (the redaction of
#: a huge error included, which must take time linear in its length), unless a fault hit the worker.
ERROR_WRITE_BOUND = 15.0
#: Backends terminated this close to a handler's end may cost its worker its lease before the outcome is
#: written (the run's leases are 6 s, reconnecting takes up to 5 s).
ERROR_FAULT_SETTLE = 8.0
#: A worker writes a raised handler's outcome within milliseconds: a kill or freeze of its process that
#: began later than this after the handler raised does not excuse an outcome still unwritten.
OUTCOME_GRACE = 5.0
#: The run's lease and dead-worker timeouts (`WORKER_ENV` of run.py): a worker silent this long has its
#: jobs recovered.
LEASE_LAPSE = 6.0


@dataclass(frozen=True)
class Run:
    """One execution of a handler: `end` is None when its process died or the run never reported."""

    run_id: str
    job_id: str
    type: str
    queue: str
    key: str | None
    attempt: int
    worker: str
    pid: int
    start: float
    end: float | None
    outcome: str  # returned, parked, raised, cancelled, or open
    #: When the claim started this attempt, by the database's clock (what rate limits count); `start`
    #: when unknown.
    claimed: float | None = None

    @property
    def started(self) -> float:
        return self.start if self.claimed is None else self.claimed


@dataclass(frozen=True)
class Effect:
    job_id: str
    step: str
    attempt: int
    pid: int
    at: float


@dataclass(frozen=True)
class Limits:
    """The limits of a queue from `at` on (None: no limit)."""

    at: float
    queue: str
    concurrency: int | None = None
    per_key: int | None = None
    rate: tuple[int, float] | None = None
    rate_per_key: tuple[int, float] | None = None


@dataclass(frozen=True)
class Process:
    """A worker process: the queues it serves (empty: all), its concurrency, when it lived."""

    pid: int
    worker: str
    queues: tuple[str, ...]
    concurrency: int
    started: float
    gone: float | None


@dataclass(frozen=True)
class Window:
    """A time window of something: a frozen process (`subject` its pid), a paused queue (its name), a
    fault (`kill <pid>`, `freeze <pid>` or `terminate`)."""

    subject: str
    start: float
    end: float


@dataclass(frozen=True)
class JobRow:
    id: str
    type: str
    queue: str
    key: str | None
    status: str
    name: str | None
    available_at: float
    created_at: float
    finished_at: float | None
    group_id: str | None
    configuration: dict[str, Any]
    attempts: int = 1
    last_error: str | None = None
    expires_at: float | None = None
    started_at: float | None = None
    error_group: str | None = None
    #: the job's `history` column: one entry per attempt's outcome (`error`, `traceback`, ...).
    history: list[dict[str, Any]] = field(default_factory=list)
    unique_key: str | None = None
    #: What it counts against its queue's limits (`weight=`).
    weight: int = 1


@dataclass(frozen=True)
class Transition:
    """A change of a job row, recorded by a trigger in the transaction that made it: `new` is the status
    after (`inserted` rows have `old` None; a deleted row has `new` `deleted`), `at` the database clock
    (for a claim, the row's `started_at`)."""

    job_id: str
    at: float
    old: str | None
    new: str
    attempts: int = 0


@dataclass(frozen=True)
class Inserted:
    """What a job was scheduled as, recorded by the insert trigger (also for rows deleted later)."""

    job_id: str
    at: float
    type: str
    unique_key: str | None = None
    expires_at: float | None = None
    weight: int = 1


@dataclass(frozen=True)
class Spend:
    """An `App.consume` call: `units` of `queue`'s rate windows (and of `key`'s), spent at a moment of
    [before, after] by the database clock; `recorded` what the call returned."""

    queue: str
    key: str | None
    units: int
    before: float
    after: float
    recorded: bool


@dataclass(frozen=True)
class KeyedCall:
    """A call with a uniqueness window (`kind` `window`, `window` its seconds) or debounce (`debounce`),
    from Python or the SQL API, made in a transaction of its own: the id it returned, the token of its
    configuration, its place in the commit order of its key's calls (`seq`, read after the call and
    before the commit) and the database clock then (`at`: the call's job cannot have started before)."""

    kind: str
    type: str
    key: str
    job_id: str
    token: str
    seq: int
    at: float
    window: float = 0.0


@dataclass(frozen=True)
class Edit:
    """A change of a job's queue, priority or tags, recorded by a trigger in the transaction that made
    it: the statuses before and after, the queues, the priority after, the database clock."""

    job_id: str
    at: float
    old_status: str
    new_status: str
    old_queue: str
    new_queue: str
    priority: int


@dataclass(frozen=True)
class Op:
    """A producer call on a job racing the workers: `cancel`, `delete` or `run_now`; `before` and
    `after` are the database clock around the call, `outcome` what it returned (the status for cancel,
    `ok` for delete and run_now) or `error: ...`."""

    kind: str
    job_id: str
    before: float
    after: float
    outcome: str

    @property
    def ok(self) -> bool:
        return not self.outcome.startswith("error")


@dataclass
class History:
    runs: list[Run] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    limits: list[Limits] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    frozen: list[Window] = field(default_factory=list)
    paused: list[Window] = field(default_factory=list)
    faults: list[Window] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)
    #: job id -> times its worker reported it completed (the `JobCompleted` event, after the commit).
    completions: dict[str, list[float]] = field(default_factory=dict)
    #: job id -> its `available_at` as its first attempt saw it (a retry moves the column).
    first_available: dict[str, float] = field(default_factory=dict)
    #: (job id, step name) -> when the step's result was stored.
    stored_steps: dict[tuple[str, str], float] = field(default_factory=dict)
    #: event key -> payloads emitted, in order (the first one wins).
    emitted: dict[str, list[Any]] = field(default_factory=dict)
    #: (job id, event key, payload) as each waiting handler received it.
    received: list[tuple[str, str, Any]] = field(default_factory=list)
    #: periodic name -> interval in seconds; and (name, next_run_at, last tick) at the end.
    periodic_every: dict[str, float] = field(default_factory=dict)
    periodic_next: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    #: ids the producer scheduled (and what status each must end in).
    expected: dict[str, str] = field(default_factory=dict)
    #: (group id, outcome) of producer attempts to add a job to a group that has a callback.
    late_group_adds: list[tuple[str, str]] = field(default_factory=list)
    #: (worker id, pid, exit code) of worker processes that exited when nobody asked them to.
    unexpected_exits: list[tuple[str, int, int]] = field(default_factory=list)
    #: the moment the run's quiet phase began (faults over, every worker back): jobs must end by the end.
    quiet_from: float = 0.0
    #: when the job rows were read (the end of the run's settle time); 0: unknown (the checker's horizon).
    ended: float = 0.0
    #: every status change of every job row, by the trigger the run installs (empty: not recorded).
    transitions: list[Transition] = field(default_factory=list)
    inserted: dict[str, Inserted] = field(default_factory=dict)
    #: cancel, delete and run_now calls on random jobs, as they returned.
    ops: list[Op] = field(default_factory=list)
    #: job id -> (shape, marker) of each secret its handler put into its errors: none may be stored.
    secrets: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: what the driver's Part III operations did, by kind (and outcome): how many of each.
    exercised: dict[str, int] = field(default_factory=dict)
    #: `App.consume` calls, as they returned.
    spends: list[Spend] = field(default_factory=list)
    #: the calls with a uniqueness window or debounce, as they committed.
    keyed_calls: list[KeyedCall] = field(default_factory=list)
    #: every change of a job's queue, priority or tags (`update`, `update_many`), by a trigger.
    edits: list[Edit] = field(default_factory=list)
    #: (marker priority, count returned, db clock before, after) of each `update_many`.
    moves: list[tuple[int, int, float, float]] = field(default_factory=list)
    #: The markers of the `update_many` calls refused before they changed a job (a job too heavy for the
    #: target queue in their first batch): no audit entry, since nothing happened.
    refused_moves: set[int] = field(default_factory=set)
    #: batch handler call id -> the (job id, type, attempt) of each job it was called with.
    batch_calls: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    #: job type -> the `batch_size` its batch handler was registered with.
    batch_sizes: dict[str, int] = field(default_factory=dict)
    #: (action, target, details) of every audit entry at the end (None: not recorded).
    audit: list[tuple[str, str, dict[str, Any]]] | None = None


@dataclass(frozen=True)
class Violation:
    guarantee: str
    explanation: str

    def __str__(self) -> str:
        return f"[{self.guarantee}] {self.explanation}"


@dataclass
class Report:
    violations: list[Violation]
    measures: dict[str, float]
    #: what the run's Part III operations did (`History.exercised`): the coverage a seed gave.
    exercised: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def guarantees(self) -> set[str]:
        return {v.guarantee for v in self.violations}

    def text(self) -> str:
        lines = [str(v) for v in self.violations] or ["every guarantee held"]
        lines.append("measures: " + ", ".join(f"{k}={v:.2f}" for k, v in sorted(self.measures.items())))
        if self.exercised:
            lines.append("exercised: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.exercised.items())))
        return "\n".join(lines)


def check(history: History) -> Report:
    """Every check of the model over one history."""
    measures: dict[str, float] = {}
    checker = _Checker(history, measures)
    violations = [
        *checker.concurrency(),
        *checker.rates(),
        *checker.exclusive(),
        *checker.completed_once(),
        *checker.follow_ups(),
        *checker.callbacks(),
        *checker.late_group_adds(),
        *checker.periodic(),
        *checker.steps(),
        *checker.events(),
        *checker.paused(),
        *checker.fairness(),
        *checker.expiry(),
        *checker.deletes(),
        *checker.cancels(),
        *checker.run_nows(),
        *checker.updates(),
        *checker.audit_trail(),
        *checker.unique(),
        *checker.debounce(),
        *checker.windows(),
        *checker.secrets(),
        *checker.logs(),
        *checker.errors_written(),
        *checker.batches(),
        *checker.end_state(),
    ]
    return Report(violations, measures, dict(history.exercised))


#: The line each handler run logs through `job.logger` (tests/model/app.py).
RUN_LINE = re.compile(r"model run (\S+)")


def _timestamp(value: Any) -> float | None:
    """A history entry's `at` (ISO 8601) as seconds, None when absent."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _says_expired(error: str | None) -> bool:
    """`last_error` says the job expired (not that a lease did)."""
    return error is not None and "expired" in re.sub("lease expired", "", error, flags=re.IGNORECASE).lower()


def _fmt(t: float, origin: float) -> str:
    return f"{t - origin:+.2f}s"


class _Checker:
    def __init__(self, history: History, measures: dict[str, float]) -> None:
        self.h = history
        self.measures = measures
        starts = [r.start for r in history.runs] + [j.created_at for j in history.jobs]
        self.origin = min(starts) if starts else 0.0
        self.gone = {p.pid: p.gone for p in history.processes}
        self.frozen_by_pid: dict[int, list[Window]] = defaultdict(list)
        for w in history.frozen:
            self.frozen_by_pid[int(w.subject)].append(w)
        self.jobs = {j.id: j for j in history.jobs}
        #: Each job's weight: from its row, or from its insert for a row deleted since.
        self.weight = {i.job_id: i.weight for i in history.inserted.values()} | {j.id: j.weight for j in history.jobs}
        self.runs_by_job: dict[str, list[Run]] = defaultdict(list)
        for r in history.runs:
            self.runs_by_job[r.job_id].append(r)
        self.horizon = max([r.end or r.start for r in history.runs] + [self.origin]) + 1.0
        self.transitions: dict[str, list[Transition]] = defaultdict(list)
        for t in sorted(history.transitions, key=lambda t: t.at):
            self.transitions[t.job_id].append(t)
        self.ops_by_job: dict[str, list[Op]] = defaultdict(list)
        for op in sorted(history.ops, key=lambda op: op.before):
            self.ops_by_job[op.job_id].append(op)
        # A durable wait parks the job (its lease and slot given back) before its handler unwinds and
        # logs its end: where the trigger recorded the park, a parked run ends there.
        self.parked_at: dict[str, float] = {}
        for r in history.runs:
            if r.outcome == "parked" and r.end is not None:
                claim = self.claim_of(r)
                park = next(
                    (t.at for t in self.transitions.get(r.job_id, []) if t.old == "running" and t.at >= claim), None
                )
                if park is not None and park < r.end:
                    self.parked_at[r.run_id] = park

    # -- intervals ----------------------------------------------------------------------------------

    def end_of(self, run: Run) -> float:
        """When the run stopped: its end (a parked run's park), else when its process was gone, else the
        end of the history."""
        if run.end is not None:
            return self.parked_at.get(run.run_id, run.end)
        gone = self.gone.get(run.pid)
        return gone if gone is not None else self.horizon

    def frozen_during(self, run: Run) -> Window | None:
        for w in self.frozen_by_pid.get(run.pid, []):
            if w.start < self.end_of(run) and run.start < w.end:
                return w
        return None

    def interval(self, run: Run) -> str:
        end = "open" if run.end is None else _fmt(run.end, self.origin)
        return (
            f"job {run.job_id} attempt {run.attempt} on {run.worker} (pid {run.pid}) "
            f"{_fmt(run.start, self.origin)}..{end}"
        )

    def limits_at(self, queue: str, start: float, end: float) -> list[Limits]:
        """The limits of `queue` in force at some moment of [start - grace, end]."""
        ordered = sorted((lim for lim in self.h.limits if lim.queue == queue), key=lambda lim: lim.at)
        found: list[Limits] = []
        for i, lim in enumerate(ordered):
            until = ordered[i + 1].at if i + 1 < len(ordered) else math.inf
            if lim.at <= end and until >= start - LIMIT_GRACE:
                found.append(lim)
        return found

    # -- limits -------------------------------------------------------------------------------------

    def concurrency(self) -> Iterator[Violation]:
        counted = [r for r in self.h.runs if self.frozen_during(r) is None]
        by_queue: dict[str, list[Run]] = defaultdict(list)
        by_key: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for r in counted:
            by_queue[r.queue].append(r)
            if r.key is not None:
                by_key[(r.queue, r.key)].append(r)

        def worst(groups: dict[Any, list[Run]], limit_of: Any, what: str, guarantee: str) -> Iterator[Violation]:
            for name, runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
                queue = name if isinstance(name, str) else name[0]
                breaches: list[tuple[int, int | None, Run, list[Run]]] = []
                for run in runs:
                    limits = [limit_of(lim) for lim in self.limits_at(queue, run.start, run.start)]
                    if not limits or any(lim is None for lim in limits):
                        continue
                    limit = max(limits)
                    live = [o for o in runs if o.start <= run.start < self.end_of(o)]
                    # Each run counts its job's weight.
                    held = sum(self.weight_of(o) for o in live)
                    if held > limit:
                        breaches.append((held, limit, run, live))
                if breaches:
                    count, limit, run, live = max(breaches, key=lambda b: b[0])
                    listing = "; ".join(self.interval(o) for o in sorted(live, key=lambda o: o.start))
                    yield Violation(
                        guarantee,
                        f"{what} {name}: handlers weighing {count} ran at once under a limit of {limit} "
                        f"(at {_fmt(run.start, self.origin)}, {len(breaches)} starts over the limit): {listing}",
                    )

        yield from worst(by_queue, lambda lim: lim.concurrency, "queue", "concurrency")
        yield from worst(by_key, lambda lim: lim.per_key, "key", "concurrency_per_key")

    def weight_of(self, run: Run) -> int:
        return self.weight.get(run.job_id, 1)

    def spent(self, queue: str, key: str | None, since: float, until: float) -> int:
        """Units spent (`App.consume`) in `queue` (of `key` only, when given) surely after `since` and
        surely recorded by `until`."""
        return sum(
            s.units
            for s in self.h.spends
            if s.recorded
            and s.queue == queue
            and (key is None or s.key == key)
            and s.before > since
            and s.after <= until
        )

    def rates(self) -> Iterator[Violation]:
        """When a job starts, what its rate windows hold (the weights of the starts before it and with it,
        the units spent surely before it) stays within the count, plus one start's weight for clock
        granularity between claims. A spend may take a window past its count by itself (it reports what
        was used); the claims after it must wait."""
        by_queue: dict[str, list[Run]] = defaultdict(list)
        by_key: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for r in self.h.runs:
            by_queue[r.queue].append(r)
            if r.key is not None:
                by_key[(r.queue, r.key)].append(r)

        def windows(groups: dict[Any, list[Run]], rate_of: Any, what: str, guarantee: str) -> Iterator[Violation]:
            for name, runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
                queue, key = (name, None) if isinstance(name, str) else name
                starts = sorted(runs, key=lambda r: r.started)
                worst: tuple[int, int, float, list[Run], int] | None = None
                for run in starts:
                    rates = [rate_of(lim) for lim in self.limits_at(queue, run.started, run.started)]
                    if not rates or any(rate is None for rate in rates):
                        continue
                    count = max(rate[0] for rate in rates)
                    per = max(rate[1] for rate in rates)
                    since = run.started - per + START_SKEW
                    inside = [r for r in starts if since < r.started <= run.started]
                    spent = self.spent(queue, key, since, run.started)
                    held = sum(self.weight_of(r) for r in inside) + spent
                    slack = max(self.weight_of(r) for r in inside)
                    if held > count + slack and (worst is None or held - count > worst[0] - worst[1]):
                        worst = (held, count, per, inside, spent)
                if worst is not None:
                    held, count, per, inside, spent = worst
                    listing = "; ".join(f"{self.interval(r)} weight {self.weight_of(r)}" for r in inside)
                    yield Violation(
                        guarantee,
                        f"{what} {name}: {held} units ({spent} spent) within {per - START_SKEW:g} s under a rate "
                        f"of {count} per {per:g} s (allowed {count} + one start): {listing}",
                    )

        yield from windows(by_queue, lambda lim: lim.rate, "queue", "rate_limit")
        yield from windows(by_key, lambda lim: lim.rate_per_key, "key", "rate_limit_per_key")

    # -- jobs ---------------------------------------------------------------------------------------

    def exclusive(self) -> Iterator[Violation]:
        """No job runs in two live attempts at once; a frozen worker's overrun is measured."""
        overlap_max = 0.0
        overrun_max = 0.0
        for w in self.h.frozen:
            for r in self.h.runs:
                if r.pid == int(w.subject) and r.start < w.end and self.end_of(r) > w.end:
                    overrun_max = max(overrun_max, self.end_of(r) - w.end)
        for job_id, runs in sorted(self.runs_by_job.items()):
            ordered = sorted(runs, key=lambda r: r.start)
            for i, a in enumerate(ordered):
                for b in ordered[i + 1 :]:
                    if b.start >= self.end_of(a):
                        continue
                    both = min(self.end_of(a), self.end_of(b)) - b.start
                    if self.frozen_during(a) is not None:
                        overlap_max = max(overlap_max, both)
                        continue
                    yield Violation(
                        "exclusive",
                        f"job {job_id} ran in two live attempts at once for {both:.2f} s: "
                        f"{self.interval(a)}; {self.interval(b)}",
                    )
        self.measures["frozen_overrun_max_s"] = overrun_max
        self.measures["frozen_duplicate_overlap_max_s"] = overlap_max
        self.measures["reruns"] = float(
            sum(
                len({r.attempt for r in runs if r.outcome != "parked"}) - 1
                for runs in self.runs_by_job.values()
                if runs
            )
        )

    def completed_once(self) -> Iterator[Violation]:
        for job_id, times in sorted(self.h.completions.items()):
            if len(times) > 1:
                at = ", ".join(_fmt(t, self.origin) for t in times)
                yield Violation("completed_once", f"job {job_id} was reported completed {len(times)} times (at {at})")
        for job in self.h.jobs:
            if job.status == "completed" and not any(r.outcome == "returned" for r in self.runs_by_job[job.id]):
                yield Violation("completed_once", f"job {job.id} ({job.type}) is completed but no handler returned")

    def first_return(self, job_id: str) -> float | None:
        ends = [r.end for r in self.runs_by_job[job_id] if r.outcome == "returned" and r.end is not None]
        return min(ends) if ends else None

    def follow_ups(self) -> Iterator[Violation]:
        """A job scheduled with `then=` (its configuration names a `chain` token, its follow-up's `after`
        the same token) has exactly one follow-up if it completed, none otherwise, written after it returned."""
        by_token: dict[str, list[JobRow]] = defaultdict(list)
        for job in self.h.jobs:
            if "after" in job.configuration:
                by_token[str(job.configuration["after"])].append(job)
        for parent in self.h.jobs:
            token = parent.configuration.get("chain")
            if token is None:
                continue
            follow = by_token.get(str(token), [])
            if parent.status == "completed":
                if len(follow) != 1:
                    yield Violation(
                        "follow_up",
                        f"job {parent.id} completed and has {len(follow)} follow-ups (exactly 1 expected)",
                    )
                returned = self.first_return(parent.id)
                for f in follow:
                    if returned is None or f.created_at < returned:
                        when = "never" if returned is None else _fmt(returned, self.origin)
                        yield Violation(
                            "follow_up",
                            f"follow-up {f.id} of job {parent.id} was written at {_fmt(f.created_at, self.origin)}, "
                            f"before its parent's handler returned ({when})",
                        )
            elif follow:
                yield Violation(
                    "follow_up",
                    f"job {parent.id} ended {parent.status} yet has {len(follow)} follow-ups (none expected)",
                )

    def callbacks(self) -> Iterator[Violation]:
        members: dict[str, list[JobRow]] = defaultdict(list)
        callbacks: dict[str, list[JobRow]] = defaultdict(list)
        with_callback: set[str] = set()
        for job in self.h.jobs:
            if "callback_of" in job.configuration:
                callbacks[str(job.configuration["callback_of"])].append(job)
            if job.group_id is not None:
                members[job.group_id].append(job)
                if job.configuration.get("group_has_then"):
                    with_callback.add(job.group_id)
        for group in sorted(with_callback):
            found = callbacks.get(group, [])
            group_members = members[group]
            terminal = [m for m in group_members if m.status in ("completed", "failed", "cancelled")]
            if len(terminal) == len(group_members) and len(found) != 1:
                yield Violation(
                    "callback",
                    f"group {group}: all {len(group_members)} members are terminal and it has {len(found)} "
                    "callbacks (exactly 1 expected)",
                )
            if len(terminal) < len(group_members) and found:
                yield Violation(
                    "callback",
                    f"group {group}: a callback exists while {len(group_members) - len(terminal)} members are "
                    "not terminal",
                )
            for cb in found:
                early = [
                    m
                    for m in group_members
                    if (m.finished_at is not None and m.finished_at > cb.created_at)
                    or any(r.start > cb.created_at and self.frozen_during(r) is None for r in self.runs_by_job[m.id])
                ]
                if early:
                    listing = "; ".join(
                        f"member {m.id} finished {_fmt(m.finished_at, self.origin) if m.finished_at else 'never'}"
                        for m in early
                    )
                    yield Violation(
                        "callback",
                        f"group {group}: callback {cb.id} was written at {_fmt(cb.created_at, self.origin)}, "
                        f"before its last member was terminal: {listing}",
                    )

    def late_group_adds(self) -> Iterator[Violation]:
        for group, outcome in self.h.late_group_adds:
            if outcome != "refused":
                yield Violation(
                    "group_closed",
                    f"a job was added to group {group}, which has a callback: {outcome} (InvalidStateError expected)",
                )

    def periodic(self) -> Iterator[Violation]:
        ticks: dict[str, list[JobRow]] = defaultdict(list)
        for job in self.h.jobs:
            if job.name in self.h.periodic_every:
                ticks[job.name].append(job)
        self.measures["periodic_ticks"] = float(sum(len(t) for t in ticks.values()))
        for name, every in sorted(self.h.periodic_every.items()):
            # A tick is the job's available_at as enqueued: what its first attempt saw, else the column
            # if the job was never retried (a recovered attempt moves the column to its retry time).
            known = [
                (j, self.h.first_available.get(j.id, j.available_at if j.attempts <= 1 else None)) for j in ticks[name]
            ]
            seen = Counter(round(t, 3) for _, t in known if t is not None)
            twice = sorted(t for t, n in seen.items() if n > 1)
            if twice:
                listing = ", ".join(f"{_fmt(t, self.origin)} x{seen[t]}" for t in twice)
                yield Violation("periodic_once", f"periodic {name}: ticks enqueued more than once: {listing}")
            off = [(j, t) for j, t in known if t is not None and min(t % every, every - t % every) > 2e-3]
            if off:
                listing = "; ".join(f"job {j.id} at {_fmt(t, self.origin)} ({t:.3f})" for j, t in off[:5])
                yield Violation(
                    "periodic_once",
                    f"periodic {name}: {len(off)} jobs at instants that are not ticks of every={every:g} s: {listing}",
                )
            next_run, last_tick = self.h.periodic_next.get(name, (None, None))
            if next_run is not None and last_tick is not None and next_run <= last_tick:
                yield Violation(
                    "periodic_once",
                    f"periodic {name}: next_run_at {_fmt(next_run, self.origin)} is not after its last tick "
                    f"{_fmt(last_tick, self.origin)}",
                )

    def steps(self) -> Iterator[Violation]:
        effects: dict[tuple[str, str], list[Effect]] = defaultdict(list)
        for e in self.h.effects:
            effects[(e.job_id, e.step)].append(e)
        late_max = 0.0
        duplicates = 0
        for (job_id, step), stored_at in sorted(self.h.stored_steps.items()):
            done = effects.get((job_id, step), [])
            if not done:
                yield Violation("steps", f"job {job_id}: step {step!r} is stored but its side effect never ran")
                continue
            duplicates += len(done) - 1
            for e in done:
                if e.at <= stored_at:
                    continue
                run = next((r for r in self.runs_by_job[job_id] if r.pid == e.pid and r.attempt == e.attempt), None)
                if run is not None and self.frozen_during(run) is not None:
                    late_max = max(late_max, e.at - stored_at)
                    continue
                yield Violation(
                    "steps",
                    f"job {job_id}: step {step!r} ran its side effect again at {_fmt(e.at, self.origin)} "
                    f"(attempt {e.attempt}, pid {e.pid}) after its result was stored at "
                    f"{_fmt(stored_at, self.origin)}",
                )
        for job in self.h.jobs:
            if job.status != "completed":
                continue
            for step in job.configuration.get("steps", []):
                if (job.id, step) not in self.h.stored_steps:
                    yield Violation("steps", f"job {job.id} completed without storing its step {step!r}")
        self.measures["step_reruns"] = float(duplicates)
        self.measures["frozen_step_after_store_max_s"] = late_max

    def events(self) -> Iterator[Violation]:
        for job_id, key, payload in self.h.received:
            emitted = self.h.emitted.get(key, [])
            if not emitted:
                yield Violation("events", f"job {job_id} received {payload!r} for {key!r}, which was never emitted")
            elif payload != emitted[0]:
                yield Violation(
                    "events",
                    f"job {job_id} received {payload!r} for {key!r}; the first emit was {emitted[0]!r}",
                )

    # -- fairness -----------------------------------------------------------------------------------

    def fairness(self) -> Iterator[Violation]:
        """A job that could run (a live, unfrozen worker serving its queue has a free slot; its queue
        and key are below every limit; no fault or limit change in the air; the queue not paused)
        waits at most FAIRNESS_BOUND in total: the claims must not leave it behind another key."""
        keyed_queues = {lim.queue for lim in self.h.limits if lim.per_key is not None or lim.rate_per_key is not None}
        worst = 0.0
        found: list[tuple[float, JobRow, float]] = []
        runs_by_queue: dict[str, list[Run]] = defaultdict(list)
        for r in self.h.runs:
            runs_by_queue[r.queue].append(r)
        for job in self.h.jobs:
            if job.queue not in keyed_queues or job.key is None or job.configuration.get("delayed"):
                continue
            first = min((r.start for r in self.runs_by_job[job.id]), default=None)
            until = first if first is not None else self.h.quiet_from
            if first is None and job.finished_at is not None:
                until = min(until, job.finished_at)  # cancelled or expired without running
            blocked = 0.0
            t = job.created_at + FAIRNESS_STEP
            while t < until:
                if self.could_run(job, t, runs_by_queue[job.queue]):
                    blocked += FAIRNESS_STEP
                t += FAIRNESS_STEP
            worst = max(worst, blocked)
            if blocked > FAIRNESS_BOUND:
                found.append((blocked, job, until))
        self.measures["fairness_blocked_max_s"] = worst
        for blocked, job, until in sorted(found, key=lambda f: -f[0])[:5]:
            yield Violation(
                "fairness",
                f"job {job.id} of key {job.key!r} in queue {job.queue} could have run for {blocked:.1f} s "
                f"(free slot, key and queue below their limits) but waited from {_fmt(job.created_at, self.origin)} "
                f"to {_fmt(until, self.origin)}",
            )
        if len(found) > 5:
            yield Violation("fairness", f"... and {len(found) - 5} more jobs kept waiting like these")

    def could_run(self, job: JobRow, t: float, queue_runs: list[Run]) -> bool:
        for w in self.h.faults:
            if w.subject == "terminate":
                if w.start - 1.0 <= t <= w.end + RECONNECT_SETTLE:
                    return False
            elif w.start - 1.0 <= t <= w.end + FAULT_SETTLE and self.serves(int(w.subject.split()[1]), job.queue):
                return False
        for w in self.h.paused:
            if w.subject == job.queue and w.start - 1.0 <= t <= w.end + LIMIT_GRACE:
                return False
        limits = self.limits_at(job.queue, t, t)
        if len(limits) != 1:
            return False  # a change in the air
        lim = limits[0]
        running = [r for r in queue_runs if r.start <= t < self.end_of(r)]
        mine = [r for r in running if r.key == job.key]
        weight = self.weight.get(job.id, 1)
        if lim.concurrency is not None and sum(self.weight_of(r) for r in running) + weight > lim.concurrency:
            return False
        if lim.per_key is not None and sum(self.weight_of(r) for r in mine) + weight > lim.per_key:
            return False
        for rate, runs, key in (
            (lim.rate, queue_runs, None),
            (lim.rate_per_key, [r for r in queue_runs if r.key == job.key], job.key),
        ):
            if rate is not None:
                count, per = rate
                # Spends count from their call's start on (the claims may see them that early).
                spent = sum(
                    s.units
                    for s in self.h.spends
                    if s.recorded
                    and s.queue == job.queue
                    and (key is None or s.key == key)
                    and t - per - 1.0 < s.after
                    and s.before <= t
                )
                started = sum(self.weight_of(r) for r in runs if t - per - 1.0 < r.start <= t)
                if started + spent + weight > count:
                    return False
        for p in self.h.processes:
            if p.queues and job.queue not in p.queues:
                continue
            if not (p.started + WORKER_WARMUP <= t and (p.gone is None or t < p.gone)):
                continue
            if any(w.start <= t <= w.end for w in self.frozen_by_pid.get(p.pid, [])):
                continue
            busy = sum(1 for r in self.h.runs if r.pid == p.pid and r.start <= t < self.end_of(r))
            if busy < p.concurrency:
                return True
        return False

    def paused(self) -> Iterator[Violation]:
        """A paused queue starts nothing (a worker applies the pause within PAUSE_GRACE)."""
        for w in self.h.paused:
            started = [r for r in self.h.runs if r.queue == w.subject and w.start + PAUSE_GRACE < r.start < w.end]
            if started:
                listing = "; ".join(self.interval(r) for r in started[:5])
                yield Violation(
                    "pause",
                    f"queue {w.subject} paused {_fmt(w.start, self.origin)}..{_fmt(w.end, self.origin)} "
                    f"started {len(started)} jobs: {listing}",
                )

    def serves(self, pid: int, queue: str) -> bool:
        return any(p.pid == pid and (not p.queues or queue in p.queues) for p in self.h.processes)

    # -- Part III: expiry, cancel, delete, run_now, uniqueness, secrets, errors ---------------------

    def claim_times(self, job_id: str) -> list[float]:
        """When the job's attempts were claimed (database clock): from the trigger's record of the row,
        and from what the handlers logged (a history built without the trigger has only those)."""
        times = [t.at for t in self.transitions.get(job_id, []) if t.new == "running"]
        times += [r.started for r in self.runs_by_job[job_id]]
        return sorted(times)

    def claim_of(self, run: Run) -> float:
        """The claim that started `run`: the trigger's latest claim of its attempt before it, else its own."""
        claims = [
            t.at
            for t in self.transitions.get(run.job_id, [])
            if t.new == "running" and t.attempts == run.attempt and t.at <= run.start + EXPIRY_SKEW
        ]
        return max(claims) if claims else run.started

    def statuses_during(self, job_id: str, start: float, end: float) -> set[str] | None:
        """The statuses the row had at some moment of [start, end] (`deleted` once it is gone); None when
        its changes were not recorded."""
        changes = self.transitions.get(job_id)
        if not changes:
            return None
        found: set[str] = set()
        current: str | None = None
        for t in changes:
            if t.at <= start:
                current = t.new
            elif t.at <= end:
                found.add(t.new)
        if current is not None:
            found.add(current)
        return found

    def expires_of(self, job_id: str) -> float | None:
        job = self.jobs.get(job_id)
        if job is not None and job.expires_at is not None:
            return job.expires_at
        inserted = self.h.inserted.get(job_id)
        return inserted.expires_at if inserted is not None else None

    def deleted(self, job_id: str) -> Op | None:
        return next((op for op in self.ops_by_job.get(job_id, []) if op.kind == "delete" and op.ok), None)

    def cancelled(self, job_id: str) -> Op | None:
        """The first cancel of the job that found it queued (`cancelled`) or running (`running`)."""
        return next(
            (
                op
                for op in self.ops_by_job.get(job_id, [])
                if op.kind == "cancel" and op.outcome in ("cancelled", "running")
            ),
            None,
        )

    def end_time(self) -> float:
        return self.h.ended or self.horizon

    def expired(self, job: JobRow) -> bool:
        """The job ended cancelled as expired (SPEC 18: `last_error` says `expired`; a lease's expiry
        is another matter)."""
        return job.status == "cancelled" and _says_expired(job.last_error)

    def owned_by_expiry(self, job: JobRow) -> bool:
        """Whether the job's end is the expiry rule's to judge: it ended cancelled as expired, or it never
        started and its `expires_at` passed during the run."""
        expires = self.expires_of(job.id)
        if expires is None:
            return False
        return self.expired(job) or (not self.claim_times(job.id) and expires < self.end_time())

    def cancelled_at(self, job: JobRow) -> float:
        """When the job was cancelled: the trigger's time of the change (a claim's `finished_at` is its
        transaction's start, which may be before the claim compared the clock with `expires_at`), else
        its `finished_at`."""
        changes = [t.at for t in self.transitions.get(job.id, []) if t.new == "cancelled"]
        if changes:
            return changes[-1]
        return job.finished_at if job.finished_at is not None else math.inf

    def expiry(self) -> Iterator[Violation]:
        """SPEC 18 (Part IV clarification): a job with `expires_at` is never first started after it; once
        started, nothing cancels it as expired (its retries, durable sleeps and recovery after a crash run
        as without `expires`); a job never started whose `expires_at` passed ends cancelled, "expired",
        unless it was cancelled or deleted otherwise, and never before its `expires_at`."""
        ids = {j.id for j in self.h.jobs if j.expires_at is not None}
        ids |= {job_id for job_id, i in self.h.inserted.items() if i.expires_at is not None}
        self.measures["expiring_jobs"] = float(len(ids))
        self.measures["expired_jobs"] = float(sum(1 for j in self.h.jobs if j.id in ids and self.expired(j)))
        for job_id in sorted(ids):
            expires = self.expires_of(job_id)
            assert expires is not None
            at = _fmt(expires, self.origin)
            claims = self.claim_times(job_id)
            runs = "; ".join(self.interval(r) for r in sorted(self.runs_by_job[job_id], key=lambda r: r.start))
            if claims and claims[0] > expires + EXPIRY_SKEW:
                yield Violation(
                    "expiry",
                    f"job {job_id} was first started at {_fmt(claims[0], self.origin)}, after its expires_at {at}: "
                    f"{runs or 'no handler ran'}",
                )
            job = self.jobs.get(job_id)
            if job is None:
                continue
            if self.expired(job) and self.runs_by_job[job_id]:
                first = min(r.started for r in self.runs_by_job[job_id])
                yield Violation(
                    "expiry",
                    f"job {job_id} started at {_fmt(first, self.origin)} (expires_at {at}) and was then cancelled "
                    f"as expired (attempts {job.attempts}, last error {job.last_error!r}): {runs}",
                )
            elif self.expired(job) and (cancelled := self.cancelled_at(job)) < expires - EXPIRY_SKEW:
                yield Violation(
                    "expiry",
                    f"job {job_id} was cancelled as expired at {_fmt(cancelled, self.origin)}, before its "
                    f"expires_at {at}",
                )
            elif not claims and expires < self.end_time() and not self.expired(job) and not self.cancelled(job_id):
                error = f", last error {job.last_error[:200]!r}" if job.last_error else ""
                yield Violation(
                    "expiry",
                    f"job {job_id} ({job.type} in {job.queue}) never started, its expires_at {at} passed, and it "
                    f"ended {job.status}{error}, not cancelled as expired",
                )

    def started_after(self, op: Op) -> list[str]:
        """The claims and handler starts of `op`'s job after `op` returned. A handler whose process was
        frozen between its claim and its start is not counted: it started before, and logged it late."""
        found = [
            f"claimed at {_fmt(t.at, self.origin)} (attempt {t.attempts})"
            for t in self.transitions.get(op.job_id, [])
            if t.new == "running" and t.at > op.after
        ]
        for r in self.runs_by_job[op.job_id]:
            claim = self.claim_of(r)
            frozen = any(w.start <= r.start and w.end >= claim for w in self.frozen_by_pid.get(r.pid, []))
            if claim > op.after or (r.start > op.after and not frozen):
                found.append(f"handler ran: {self.interval(r)}")
        return found

    def deletes(self) -> Iterator[Violation]:
        """SPEC 17: `delete` removes a queued or terminal job and refuses a running one; no handler of a
        deleted job starts after the delete returned, and its row is gone at the end."""
        for op in self.h.ops:
            if op.kind != "delete":
                continue
            statuses = self.statuses_during(op.job_id, op.before - CALL_SKEW, op.after)
            when = _fmt(op.after, self.origin)
            if op.ok:
                job = self.jobs.get(op.job_id)
                if job is not None:
                    yield Violation("delete", f"job {op.job_id} was deleted at {when} and its row is still there")
                late = self.started_after(op)
                if late:
                    yield Violation(
                        "delete", f"job {op.job_id} was deleted at {when} and started after: {'; '.join(late)}"
                    )
                if statuses is not None and statuses <= {"running"}:
                    yield Violation(
                        "delete", f"job {op.job_id} was deleted at {when} while it was running throughout the call"
                    )
            elif statuses is not None and not statuses & {"running", "deleted"}:
                yield Violation(
                    "delete",
                    f"delete of job {op.job_id} at {when} was refused ({op.outcome[:200]}) while the job was "
                    f"{'/'.join(sorted(statuses))}",
                )

    def cancels(self) -> Iterator[Violation]:
        """SPEC 2 and 16: a job that `cancel` found queued (it returned `cancelled`) never starts after;
        one it found running (it returned `running`) never ends completed."""
        for op in self.h.ops:
            if op.kind != "cancel":
                continue
            statuses = self.statuses_during(op.job_id, op.before - CALL_SKEW, op.after)
            when = _fmt(op.after, self.origin)
            job = self.jobs.get(op.job_id)
            if op.outcome == "cancelled":
                late = self.started_after(op)
                if late:
                    yield Violation(
                        "cancel",
                        f"job {op.job_id} was cancelled (returned cancelled) at {when} and started after: "
                        f"{'; '.join(late)}",
                    )
                seen = {"queued", "cancelled"}
            elif op.outcome == "running":
                if job is not None and job.status == "completed":
                    runs = "; ".join(self.interval(r) for r in self.runs_by_job[op.job_id])
                    yield Violation(
                        "cancel",
                        f"job {op.job_id}: cancel returned running at {when}, yet the job ended completed: {runs}",
                    )
                seen = {"running"}
            elif op.ok:
                seen = {op.outcome}
            else:
                seen = {"deleted"}
            if statuses is not None and not statuses & seen:
                yield Violation(
                    "cancel",
                    f"cancel of job {op.job_id} at {when} returned {op.outcome[:200]!r} while the job was "
                    f"{'/'.join(sorted(statuses))}",
                )

    def run_nows(self) -> Iterator[Violation]:
        """SPEC 17: `run_now` makes a queued job available now and refuses anything else; a job it made
        available is not lost: it ends in a terminal status (or was deleted)."""
        for op in self.h.ops:
            if op.kind != "run_now":
                continue
            statuses = self.statuses_during(op.job_id, op.before - CALL_SKEW, op.after)
            when = _fmt(op.after, self.origin)
            if not op.ok:
                if statuses is not None and statuses <= {"queued"}:
                    yield Violation(
                        "run_now",
                        f"run_now of job {op.job_id} at {when} was refused ({op.outcome[:200]}) while it was queued",
                    )
                continue
            if statuses is not None and "queued" not in statuses:
                yield Violation(
                    "run_now",
                    f"run_now of job {op.job_id} at {when} succeeded while it was {'/'.join(sorted(statuses))}",
                )
            if self.deleted(op.job_id) is not None:
                continue
            job = self.jobs.get(op.job_id)
            if job is None:
                yield Violation("run_now", f"job {op.job_id} was made available at {when} and is gone")
            elif job.status in ("queued", "running"):
                yield Violation(
                    "run_now", f"job {op.job_id} was made available at {when} and is still {job.status} at the end"
                )

    def updates(self) -> Iterator[Violation]:
        """SPEC 21: `update` and `update_many` change queued jobs only: every change of a job's queue,
        priority or tags finds it queued and leaves it queued; an
        `update` refused says the job was not queued, one that succeeded found it queued; the count an
        `update_many` returns is the number of jobs it changed (those with its marker priority); a moved
        job is claimed in its new queue within that queue's limits (`concurrency` counts runs by the
        queue they were claimed from). The statuses are the row's own, before and after the change, in
        its transaction: a job running (or finished) is never altered."""
        for edit in self.h.edits:
            when = _fmt(edit.at, self.origin)
            if edit.old_status != "queued" or edit.new_status != "queued":
                yield Violation(
                    "update",
                    f"job {edit.job_id} was changed at {when} ({edit.old_queue} -> {edit.new_queue}, priority "
                    f"{edit.priority}) while {edit.old_status} (now {edit.new_status}): only queued jobs change",
                )
        for op in self.h.ops:
            if op.kind != "update":
                continue
            statuses = self.statuses_during(op.job_id, op.before - CALL_SKEW, op.after)
            when = _fmt(op.after, self.origin)
            if not op.ok and statuses is not None and statuses <= {"queued"}:
                yield Violation("update", f"update of job {op.job_id} at {when} was refused while it was queued")
            if op.ok and statuses is not None and "queued" not in statuses:
                yield Violation(
                    "update", f"update of job {op.job_id} at {when} succeeded while it was {'/'.join(sorted(statuses))}"
                )
        for marker, count, before, after in self.h.moves:
            changed = [e for e in self.h.edits if e.priority == marker]
            if len(changed) != count:
                yield Violation(
                    "update_many",
                    f"update_many (marker {marker}) at {_fmt(after, self.origin)} returned {count} but changed "
                    f"{len(changed)} jobs",
                )
            late = [e for e in changed if not before - CALL_SKEW <= e.at <= after + CALL_SKEW]
            if late:
                yield Violation(
                    "update_many", f"update_many (marker {marker}) changed job {late[0].job_id} outside its call"
                )

    def audit_trail(self) -> Iterator[Violation]:
        """SPEC 22: each `cancel`, `delete`, `run_now` and `update` of the run that took effect wrote one
        audit entry for its job, and one that was refused none; each `update_many` one entry with the
        count it returned. A cancel that returned `cancelled` found the job queued (an entry) or already
        cancelled (none): such calls bound the entries from above only."""
        if self.h.audit is None:
            return
        written = Counter((action, target) for action, target, _ in self.h.audit)
        calls: dict[tuple[str, str], list[Op]] = defaultdict(list)
        for op in self.h.ops:
            calls[(op.kind, f"job:{op.job_id}")].append(op)
        for (kind, target), ops in calls.items():
            if kind == "cancel":
                low = sum(op.outcome == "running" for op in ops)
                high = low + sum(op.outcome == "cancelled" for op in ops)
            else:
                low = high = sum(op.ok for op in ops)
            if not low <= written[(kind, target)] <= high:
                outcomes = ", ".join(op.outcome[:60] for op in ops)
                yield Violation(
                    "audit",
                    f"{kind} of {target} ({outcomes}) wrote {written[(kind, target)]} audit entries, not "
                    + (f"{low}" if low == high else f"{low} to {high}"),
                )
        for (action, target), count in written.items():
            if action in ("cancel", "delete", "run_now", "update") and (action, target) not in calls:
                yield Violation("audit", f"{count} audit entries of {action} of {target}, which no call made")
        for marker, count, _, after in self.h.moves:
            found = [
                d.get("count")
                for action, _, d in self.h.audit
                if action == "update_many" and d.get("changes", {}).get("priority") == marker
            ]
            if found != ([] if marker in self.h.refused_moves else [count]):
                yield Violation(
                    "audit",
                    f"update_many (marker {marker}) at {_fmt(after, self.origin)} returned {count}; "
                    f"its audit entries say {found}",
                )

    def unique(self) -> Iterator[Violation]:
        """SPEC 2: two jobs of one (type, unique_key) are never queued or running at once (from its insert
        until it is terminal or deleted), whichever front end (Python or SQL) scheduled them."""
        active: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
        debounced = {(c.type, c.key) for c in self.h.keyed_calls if c.kind == "debounce"}
        for job_id, i in self.h.inserted.items():
            if i.unique_key is None or (i.type, i.unique_key) in debounced:
                continue  # a debounced key may have one job queued beside one running: debounce() checks it
            ends = [
                t.at
                for t in self.transitions.get(job_id, [])
                if t.new in ("completed", "failed", "cancelled", "deleted") and t.at >= i.at
            ]
            active[(i.type, i.unique_key)].append((i.at, min(ends, default=math.inf), job_id))
        for (type_, key), spans in sorted(active.items()):
            spans.sort()
            for n, (start, end, job_id) in enumerate(spans):
                for other_start, _, other in spans[n + 1 :]:
                    if other_start < end:
                        yield Violation(
                            "unique",
                            f"jobs {job_id} and {other} of type {type_} and unique_key {key!r} were active at once "
                            f"from {_fmt(other_start, self.origin)} (the first active "
                            f"{_fmt(start, self.origin)}..{_fmt(end, self.origin) if end < math.inf else 'the end'})",
                        )

    def _spans(self, job_id: str) -> tuple[tuple[float, float], list[tuple[float, float]]]:
        """A job's wait for its first start (from its insert) and its runs (from a claim until its next
        change), by the recorded transitions; an open end is infinite."""
        changes = self.transitions.get(job_id, [])
        inserted = self.h.inserted.get(job_id)
        start = inserted.at if inserted is not None else -math.inf
        first = next((t.at for t in changes if t.new != "queued"), math.inf)
        runs = []
        for n, t in enumerate(changes):
            if t.new == "running":
                end = next((later.at for later in changes[n + 1 :]), math.inf)
                runs.append((t.at, end))
        return (start, first), runs

    def debounce(self) -> Iterator[Violation]:
        """SPEC 21, debounce: each job of a debounced call holds the configuration of the last call to
        commit that answered with it, started after each of those calls and completed; a debounced key
        never has two jobs waiting for their first start at once, nor two running at once (one waiting
        while one runs is the exception)."""
        calls = [c for c in self.h.keyed_calls if c.kind == "debounce"]
        by_job: dict[str, list[KeyedCall]] = defaultdict(list)
        for c in calls:
            by_job[c.job_id].append(c)
        for job_id, answered in sorted(by_job.items()):
            last = max(answered, key=lambda c: c.seq)
            job = self.jobs.get(job_id)
            if job is None:
                yield Violation("debounce", f"job {job_id} answered {len(answered)} debounced calls and is gone")
                continue
            if job.configuration.get("call") != last.token:
                yield Violation(
                    "debounce",
                    f"job {job_id} holds the configuration of call {job.configuration.get('call')!r}, not that of "
                    f"{last.token!r}, the last of its {len(answered)} calls to commit",
                )
            if job.status != "completed":
                yield Violation("debounce", f"job {job_id} of debounced calls ended {job.status}")
            (_, first), _ = self._spans(job_id)
            early = [c for c in answered if first < c.at]
            if early:
                yield Violation(
                    "debounce",
                    f"job {job_id} started at {_fmt(first, self.origin)}, before call {early[0].token!r} that "
                    f"answered with it committed (after {_fmt(early[0].at, self.origin)})",
                )
        for type_, key in sorted({(c.type, c.key) for c in calls}):
            jobs = sorted(j for j, i in self.h.inserted.items() if (i.type, i.unique_key) == (type_, key))
            spans = {job_id: self._spans(job_id) for job_id in jobs}
            for n, a in enumerate(jobs):
                for b in jobs[n + 1 :]:
                    (a0, a1), a_runs = spans[a]
                    (b0, b1), b_runs = spans[b]
                    if max(a0, b0) < min(a1, b1):
                        yield Violation(
                            "debounce",
                            f"jobs {a} and {b} of debounced key {key!r} both waited for their first start from "
                            f"{_fmt(max(a0, b0), self.origin)}",
                        )
                    for r0, r1 in a_runs:
                        for s0, s1 in b_runs:
                            if max(r0, s0) < min(r1, s1):
                                yield Violation(
                                    "debounce",
                                    f"jobs {a} and {b} of debounced key {key!r} ran at once from "
                                    f"{_fmt(max(r0, s0), self.origin)}",
                                )
        self.measures["debounce_calls"] = len(calls)
        self.measures["debounce_jobs"] = len(by_job)

    def windows(self) -> Iterator[Violation]:
        """SPEC 21, uniqueness windows: two jobs of a windowed key are scheduled at least the window apart
        (a call within the window of a job, in any status, is answered by it); each call is answered by a
        job that exists, scheduled before the call committed, and that job completed."""
        calls = [c for c in self.h.keyed_calls if c.kind == "window"]
        for (type_, key), window in sorted({(c.type, c.key): c.window for c in calls}.items()):
            created = sorted(
                (self.jobs[j].created_at, j)
                for j, i in self.h.inserted.items()
                if (i.type, i.unique_key) == (type_, key) and j in self.jobs
            )
            for (t0, a), (t1, b) in pairwise(created):
                if t1 - t0 < window - 1e-3:
                    yield Violation(
                        "window",
                        f"jobs {a} and {b} of key {key!r} were scheduled {t1 - t0:.3f} s apart, within the "
                        f"{window:g} s window",
                    )
        for c in calls:
            job = self.jobs.get(c.job_id)
            if job is None:
                yield Violation("window", f"call {c.token!r} was answered by job {c.job_id}, which is gone")
            elif job.created_at > c.at:
                yield Violation("window", f"call {c.token!r} was answered by job {c.job_id}, scheduled after it")
            elif job.status != "completed":
                yield Violation("window", f"job {c.job_id} of a windowed call ended {job.status}")
        self.measures["window_calls"] = len(calls)

    def secrets(self) -> Iterator[Violation]:
        """SPEC 17: no secret a handler's error carried is stored in clear: not in `last_error`,
        `error_group`, nor in any `history` entry's `error` or `traceback`."""
        checked = 0
        for job_id, secrets in sorted(self.h.secrets.items()):
            job = self.jobs.get(job_id)
            if job is None:
                continue
            fields: list[tuple[str, Any]] = [("last_error", job.last_error), ("error_group", job.error_group)]
            for n, entry in enumerate(job.history):
                fields += [
                    (f"history[{n}].error", entry.get("error")),
                    (f"history[{n}].traceback", entry.get("traceback")),
                ]
            leaks: dict[str, list[str]] = defaultdict(list)
            for shape, marker in secrets:
                checked += 1
                for name, text in fields:
                    if isinstance(text, str) and marker in text:
                        leaks[shape].append(name)
            if leaks:
                listing = "; ".join(
                    f"{shape} in {', '.join(sorted(set(names)))}" for shape, names in sorted(leaks.items())
                )
                yield Violation("secrets", f"job {job_id} ({job.type}) stores secrets in clear: {listing}")
        self.measures["secrets_checked"] = float(checked)

    def logs(self) -> Iterator[Violation]:
        """SPEC 22: what a handler logged during an attempt is kept only in that attempt's history entry.
        Each handler run logs `model run <run id>` through `job.logger`; such a line may appear in one
        entry only, of the run's own job, with the run's attempt number, written after the run started
        (a line in another job's entry, another attempt's, or twice, is a leak between attempts)."""
        runs = {r.run_id: r for r in self.h.runs}
        seen: Counter[str] = Counter()
        for job_id, job in sorted(self.jobs.items()):
            for n, entry in enumerate(job.history):
                logs = entry.get("logs") if isinstance(entry, dict) else None
                for line in logs if isinstance(logs, list) else []:
                    match = RUN_LINE.fullmatch(str(line.get("message", ""))) if isinstance(line, dict) else None
                    if match is None:
                        continue
                    run_id = match[1]
                    seen[run_id] += 1
                    run = runs.get(run_id)
                    if run is None:
                        yield Violation(
                            "logs", f"job {job_id} history[{n}] keeps a line of run {run_id}, never started"
                        )
                        continue
                    at = _timestamp(entry.get("at"))
                    if (
                        run.job_id != job_id
                        or run.attempt != entry.get("attempt")
                        or (at is not None and at < run.start)
                    ):
                        yield Violation(
                            "logs",
                            f"job {job_id} history[{n}] (attempt {entry.get('attempt')}) keeps a line of run "
                            f"{run_id}: job {run.job_id}, attempt {run.attempt}, "
                            f"started {_fmt(run.start, self.origin)}",
                        )
        for run_id, count in sorted(seen.items()):
            if count > 1:
                yield Violation("logs", f"run {run_id}'s line is kept {count} times")
        self.measures["log_lines_checked"] = float(sum(seen.values()))

    def errors_written(self) -> Iterator[Violation]:
        """A handler that raised has its outcome written by its own worker within ERROR_WRITE_BOUND, a huge
        error too (SPEC 17: redaction takes time linear in the text): not left to a lease's recovery.
        A late or recovered outcome is excused by a fault that could have caused it (`excused`)."""
        worst = 0.0
        for r in self.h.runs:
            if r.outcome != "raised" or r.end is None or r.job_id not in self.transitions:
                continue
            claim = self.claim_of(r)
            written = next((t for t in self.transitions[r.job_id] if t.old == "running" and t.at >= claim), None)
            written_at = written.at if written is not None else self.end_time()
            delay = written_at - r.end
            job = self.jobs.get(r.job_id)
            recovered = job is not None and any(
                e.get("attempt") == r.attempt and e.get("outcome") == "recovered" for e in job.history
            )
            if not (delay > ERROR_WRITE_BOUND or recovered):
                worst = max(worst, delay)
                continue
            if self.excused(r, written_at, recovered):
                continue
            worst = max(worst, delay)
            how = "recovered after its lease lapsed" if recovered else "written"
            yield Violation(
                "error_written",
                f"job {r.job_id} ({r.type}): its handler raised at {_fmt(r.end, self.origin)} and its outcome was "
                f"{how} {delay:.1f} s later (bound {ERROR_WRITE_BOUND:g} s), no fault on its worker that could "
                f"cause it: {self.interval(r)}",
            )
        self.measures["error_write_max_s"] = worst

    def excused(self, r: Run, written_at: float, recovered: bool) -> bool:
        """Whether a fault explains why `r`'s outcome was late or recovered: its process killed or gone
        between its start and OUTCOME_GRACE after it raised (a restart under its id reclaims its jobs at
        once); frozen from a moment before then (a freeze makes a lease lapse only LEASE_LAPSE later, so
        for a recovered outcome the freeze must have begun LEASE_LAPSE before the recovery, a heartbeat
        to spare); or backends terminated from its start until ERROR_FAULT_SETTLE after its end."""
        assert r.end is not None
        start = r.start - 1.0
        until = min(written_at, r.end + OUTCOME_GRACE)
        frozen_by = min(until, written_at - LEASE_LAPSE + 1.0) if recovered else until
        gone = self.gone.get(r.pid)
        if gone is not None and start <= gone <= until:
            return True
        for w in self.h.faults:
            kind, _, subject = w.subject.partition(" ")
            if kind == "terminate" and start <= w.start <= r.end + ERROR_FAULT_SETTLE:
                return True
            if subject != str(r.pid):
                continue
            if kind == "kill" and start <= w.start <= until:
                return True
            if kind == "freeze" and w.start <= frozen_by and w.end >= start:
                return True
        return False

    # -- the end ------------------------------------------------------------------------------------

    def batches(self) -> Iterator[Violation]:
        """SPEC 21: a batch handler's call holds at most `batch_size` jobs, all of its own type, each once
        (and, through the other checks, each job of a batch keeps its own limits, lease and end state)."""
        h = self.h
        jobs = 0
        biggest = 0
        for call, members in sorted(h.batch_calls.items()):
            jobs += len(members)
            biggest = max(biggest, len(members))
            types = {job_type for _, job_type, _ in members}
            ids = [job_id for job_id, _, _ in members]
            size = min((h.batch_sizes.get(job_type, 0) for job_type in types), default=0)
            if len(types) != 1:
                yield Violation("batches", f"batch call {call} held jobs of several types: {sorted(types)}")
            if len(members) > size:
                yield Violation(
                    "batches", f"batch call {call} held {len(members)} jobs, over its batch_size {size}: {ids}"
                )
            if len(set(ids)) != len(ids):
                yield Violation("batches", f"batch call {call} held a job twice: {ids}")
        self.measures["batch_calls"] = float(len(h.batch_calls))
        self.measures["batched_jobs"] = float(jobs)
        self.measures["batch_largest"] = float(biggest)

    def end_state(self) -> Iterator[Violation]:
        for worker, pid, code in self.h.unexpected_exits:
            yield Violation("workers_survive", f"worker {worker} (pid {pid}) exited {code} without being asked to")
        for job_id, status in sorted(self.h.expected.items()):
            if self.deleted(job_id) is not None:
                continue  # the delete rule's
            job = self.jobs.get(job_id)
            cancel = self.cancelled(job_id)
            if cancel is not None:
                status = "cancelled"
            if job is None:
                yield Violation("nothing_lost", f"job {job_id} was scheduled and is gone")
            elif self.owned_by_expiry(job) or (cancel is not None and job.status == "completed"):
                continue  # the expiry rule's, the cancel rule's
            elif job.status != status:
                runs = "; ".join(self.interval(r) for r in self.runs_by_job[job_id]) or "never ran"
                yield Violation(
                    "nothing_lost",
                    f"job {job_id} ({job.type} in {job.queue}) ended {job.status}, expected {status}"
                    f"{f' (last error: {job.last_error[:300]!r})' if job.last_error else ''}: {runs}",
                )
        stuck = [j for j in self.h.jobs if j.id not in self.h.expected and j.status in ("queued", "running")]
        for job in stuck[:10]:
            yield Violation(
                "nothing_stuck",
                f"job {job.id} ({job.type} in {job.queue}, name {job.name}) is still {job.status} at the end",
            )
        if len(stuck) > 10:
            yield Violation("nothing_stuck", f"... and {len(stuck) - 10} more jobs still queued or running")
