"""Statements about jobs: scheduling, claiming, fenced writes, admin and reads (`sql/queries/jobs.sql`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from operator import attrgetter
from typing import Any

import psycopg

from jobbus.errors import InvalidJobError, InvalidStateError
from jobbus.models import (
    JOB_COLUMNS,
    TRACE_KEY,
    ClaimedJob,
    GroupProgress,
    Job,
    JobSpec,
    JobStatus,
    SharedSpecs,
    options_of,
)
from jobbus.requests import spec_json
from jobbus.schema import SERVER_AND_VERSION_QUERY, SERVER_VERSION_QUERY, render
from jobbus.store.statements import Chain, Copy, Row, Statement, channel_name, queries
from jobbus.store.views import SEARCH, escape_like

#: SQLSTATE of the schema's refusal of a group (group_scheduled and the trigger job_grouped of
#: sql/current.sql): `schedule_group` on an id that has jobs, or a job added to a group that has a callback.
GROUP_REFUSED = "JB409"


def raise_group_refusal(exc: BaseException) -> None:
    """Raise the schema's refusal of a group (SQLSTATE `GROUP_REFUSED`) as `InvalidStateError`; any other
    error is left to the caller."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate == GROUP_REFUSED:
        raise InvalidStateError(exc.diag.message_primary or str(exc)) from None
    # The schema's refusals of weights, raised the same way: a job heavier than a limit of its queue
    # (refuse_heavy_jobs), a limit lowered below the weight of a queued job (refuse_limits_below_weights).
    if isinstance(exc, psycopg.Error) and exc.sqlstate == WEIGHT_REFUSED and exc.diag.column_name == "weight":
        raise InvalidJobError(exc.diag.message_primary or str(exc)) from None
    if isinstance(exc, psycopg.Error) and exc.sqlstate == LIMIT_REFUSED:
        raise InvalidStateError(exc.diag.message_primary or str(exc)) from None


#: SQLSTATE (invalid_parameter_value, with the column `weight`) of a job heavier than a limit of its queue.
WEIGHT_REFUSED = "22023"
#: SQLSTATE of `set_queue` lowering a limit below the weight of a job queued or running in the queue.
LIMIT_REFUSED = "JB412"


#: Expired jobs one claim cancels at most before it hands back what it leased: a claim behind a long run
#: of expired jobs stays short, and the claims after it (and the rescuer's sweep) take the rest.
CLAIM_EXPIRY_BUDGET = 1000


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claim leased; `expired_ahead` when it stopped at its expiry budget with expired jobs
    possibly left ahead, so a short claim does not mean that nothing is available: claim again."""

    jobs: list[ClaimedJob]
    expired_ahead: bool = False


@dataclass(slots=True)
class Outcome:
    """The fenced end of one attempt, as the worker hands it to `record_outcomes`. One per attempt:
    not frozen, for the same reason as `ClaimedJob`."""

    job_id: uuid.UUID
    lease_token: uuid.UUID
    status: JobStatus  # QUEUED means retry (or release, or snooze), the others are terminal
    result_json: str | None = None
    error: str | None = None
    delay_seconds: float = 0.0
    #: The attempt does not count (released at shutdown, snoozed): attempts goes back by one.
    released: bool = False
    #: What the job's history records (`completed`, `retried`, `snoozed`, `timed_out`, ...); the
    #: status when empty.
    kind: str = ""
    #: The formatted traceback of an attempt that raised (bounded and redacted by the worker).
    traceback: str | None = None
    #: What the handler logged, as JSON: `{"lines": [{"at", "level", "message"}, ...], "dropped": N}`
    #: (bounded and redacted by the worker); None when it logged nothing.
    logs: str | None = None


@dataclass(frozen=True, slots=True)
class RecoveredJob:
    """A job taken back from a worker that died or whose lease expired, and what became of it."""

    job_id: uuid.UUID
    type: str
    queue: str
    status: JobStatus
    attempts: int
    error: str


@dataclass(frozen=True, slots=True)
class CancelResult:
    before: JobStatus | None  # None: no such job
    after: JobStatus | None
    type: str | None
    queue: str | None


class JobStore:
    """Builds the statements of one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.channel = channel_name(schema)
        self.control_channel = channel_name(schema, "_control")
        self._q = queries(schema)

    def query(self, name: str) -> str:
        return self._q[name]

    # -- producers ---------------------------------------------------------------------------------

    def insert_jobs(
        self, specs: Sequence[JobSpec], *, callback: tuple[uuid.UUID, str | None] | None = None
    ) -> Statement[dict[tuple[str, str], uuid.UUID]] | Copy[dict[tuple[str, str], uuid.UUID]]:
        """Insert jobs in one round trip; returns, per unique (type, key), the id of the active job.

        Specs must not repeat a (type, unique_key); the caller folds repeats onto the first. A keyed
        spec missing from the result met an active job committed after the statement's snapshot: ask
        again. Safe to repeat after a lost connection (ids are the client's; no row is doubled, and
        neither is a follow-up or a group callback). `callback` is (group id, `spec_json` of the
        group's callback or None) of `schedule_group`: the members of a new group, refused (SQLSTATE
        `GROUP_REFUSED`) if the id already has jobs, and the callback written with them.
        """
        if callback is not None or any(
            s.then is not None or _expires(s) or s.weight != 1 or s.tags for s in options_of(specs)
        ):
            return self._insert_jobs(specs, callback)
        if len(specs) == 1:
            (spec,) = specs
            if spec.unique_for is not None or spec.debounce is not None:
                return self._schedule_keyed(specs)
            one = {
                "id": spec.id,
                "type": spec.type,
                "queue": spec.queue,
                "name": spec.name,
                "group_id": spec.group_id,
                "unique_key": spec.unique_key,
                "priority": spec.priority,
                "configuration": spec.configuration,
                "max_attempts": spec.max_attempts,
                "available_at": spec.available_at,
                "delay": float(spec.delay_seconds),
                "timeout": spec.timeout_seconds,
                "concurrency_key": spec.concurrency_key,
                "execution": spec.execution,
                "channel": self.channel,
            }
            return Statement(self._q["insert_job"], one, _decode_inserted)
        if len(specs) >= COPY_MIN_ROWS:
            copied = self._copy_jobs(specs)
            if copied is not None:
                return copied
        return self._insert_jobs(specs)

    def _insert_jobs(
        self, specs: Sequence[JobSpec], callback: tuple[uuid.UUID, str | None] | None = None
    ) -> Statement[dict[tuple[str, str], uuid.UUID]]:
        if callback is None and any(s.unique_for is not None or s.debounce is not None for s in options_of(specs)):
            return self._schedule_keyed(specs)  # a window or debounce (never by COPY: those jobs have keys)
        columns = _ARRAYS
        query = "insert_jobs"
        checks = None
        if callback is not None or any(
            s.then is not None or _expires(s) or s.weight != 1 or s.tags for s in options_of(specs)
        ):
            columns = _CHAINED_ARRAYS
            query = "insert_jobs_chained"
            checks = _weight_checks(specs, callback)  # plain jobs never come here: they pay nothing for weights
        if callback is not None:
            query = "insert_group"
        if checks is not None:
            columns = _WEIGHTED_ARRAYS
            query = "insert_jobs_weighted"
        params: dict[str, Any] = {**_arrays(specs, columns), "channel": self.channel}
        if callback is not None:
            params["callback_group"], params["callback_spec"] = callback
        if checks is not None:
            params["check_queues"], params["check_keyed"], params["check_weights"] = checks
            params.setdefault("callback_group", None)
            params.setdefault("callback_spec", None)
        return Statement(self._q[query], params, _decode_inserted, prepare=False)

    def _schedule_keyed(self, specs: Sequence[JobSpec]) -> Statement[dict[tuple[str, str], uuid.UUID]]:
        """Jobs of which one at least has a uniqueness window or debounce: each through the function
        schedule_keyed (sql/current.sql), in one round trip, keyed ones in (type, unique_key) order so that
        two batches take their keys' locks in one order. Returns what insert_jobs returns."""
        ordered = sorted(specs, key=lambda s: (s.unique_key is not None, s.type, s.unique_key or ""))
        texts = [_keyed_json(spec) for spec in ordered]
        params = {"specs": f"[{','.join(texts)}]", "channel": self.channel}
        return Statement(self._q["schedule_keyed_jobs"], params, _decode_inserted, prepare=False)

    def _copy_jobs(self, specs: Sequence[JobSpec]) -> Copy[dict[tuple[str, str], uuid.UUID]] | None:
        """A large batch without unique keys, streamed by COPY as one text: no arrays built and unnested,
        and no call per row into the driver.

        Only when every job starts now or every job has an absolute start: a delay is counted from the
        database's clock, which COPY cannot read, so mixed or delayed batches take the statement.
        """
        options = options_of(specs)
        if any(s.unique_key is not None or s.execution is not None for s in options):
            return None  # keys need ON CONFLICT; trace contexts are written by the statement
        if all(s.available_at is None and not s.delay_seconds for s in options):
            query, starts = "copy_jobs", False
        elif all(s.available_at is not None for s in options):
            query, starts = "copy_jobs_at", True
        else:
            return None
        pairs = [json.dumps(list(pair)) for pair in sorted({(s.queue, s.type) for s in options})]
        announce = Statement(self._q["announce_jobs"], {"channel": self.channel, "pairs": pairs}, _none_found)
        return Copy(
            self._q[query],
            _copy_rows(specs, starts),
            then=announce,
            instead=partial(self._insert_jobs, specs),
        )

    # -- worker ------------------------------------------------------------------------------------

    def claim_jobs(
        self,
        *,
        worker_id: str,
        limit: int,
        pairs: Sequence[tuple[str, str]],
        lease_seconds: float,
        max_payload_bytes: int,
        limited_queues: Sequence[str] = (),
    ) -> Statement[Claim]:
        """Lease up to `limit` jobs of the given (queue, type) pairs; queues are served in the order they
        first appear in `pairs`, each first with an equal share of `limit`. Jobs of `limited_queues` are
        claimed within their concurrency and rate limits. Jobs never started and past their expiry
        that the claim meets are cancelled, at most `CLAIM_EXPIRY_BUDGET` of them (`Claim.expired_ahead`)."""
        params = {
            "worker_id": worker_id,
            "limit": limit,
            "pair_queues": [queue for queue, _ in pairs],
            "pair_types": [job_type for _, job_type in pairs],
            "lease_seconds": lease_seconds,
            "max_payload_bytes": min(max_payload_bytes, 2**31 - 1),
            "limited_queues": list(limited_queues),
            "expiry_budget": CLAIM_EXPIRY_BUDGET,
        }

        def decode(rows: list[Row], _: int) -> Claim:
            if rows and rows[-1][0] is None:  # the claim's last row: it stopped at its expiry budget
                return Claim([_claimed(row) for row in rows[:-1]], expired_ahead=True)
            return Claim([_claimed(row) for row in rows])

        return Statement(self._q["claim_jobs"], params, decode)

    def recover_expired_leases(self, limit: int = 1000) -> Statement[list[RecoveredJob]]:
        return Statement(self._q["recover_expired_leases"], {"limit": limit, "channel": self.channel}, decode_recovered)

    def cancel_expired_jobs(self, limit: int = 1000) -> Statement[int]:
        """Cancel up to `limit` queued jobs past their expiry; returns how many."""
        return Statement(self._q["cancel_expired_jobs"], {"limit": limit}, lambda rows, _: len(rows))

    def heartbeat_leases(
        self, leases: Mapping[uuid.UUID, uuid.UUID], lease_seconds: float
    ) -> Statement[dict[uuid.UUID, float | None]]:
        """Renew many leases at once; the result maps each live job id to the seconds since its
        cancellation was asked for (None: it was not)."""
        ordered = sorted(leases.items())
        params = {
            "ids": [job_id for job_id, _ in ordered],
            "tokens": [token for _, token in ordered],
            "lease_seconds": lease_seconds,
        }
        return Statement(self._q["heartbeat_leases"], params, lambda rows, _: {r[0]: r[1] for r in rows}, prepare=False)

    def checkpoint_job(self, job_id: uuid.UUID, token: uuid.UUID, data_json: str) -> Statement[bool | None]:
        """Replace the checkpoint; returns the cancellation flag, or None when the lease is lost."""
        return Statement(self._q["checkpoint_job"], {"id": job_id, "token": token, "data": data_json}, _flag)

    def progress_job(
        self, job_id: uuid.UUID, token: uuid.UUID, current: float, total: float | None
    ) -> Statement[bool | None]:
        params = {"id": job_id, "token": token, "current": current, "total": total}
        return Statement(self._q["progress_job"], params, _flag)

    def heartbeat_job(self, job_id: uuid.UUID, token: uuid.UUID, lease_seconds: float) -> Statement[bool | None]:
        params = {"id": job_id, "token": token, "lease_seconds": lease_seconds}
        return Statement(self._q["heartbeat_job"], params, _flag)

    def job_steps(self, job_id: uuid.UUID) -> Statement[dict[str, Any]]:
        return Statement(self._q["job_steps"], {"id": job_id}, lambda rows, _: {name: result for name, result in rows})

    def record_step(
        self, job_id: uuid.UUID, token: uuid.UUID, name: str, result_json: str
    ) -> Statement[tuple[bool, bool]]:
        """Store a step's result, fenced by the lease; returns (lease held, stored by this call)."""
        params = {"id": job_id, "token": token, "name": name, "result": result_json}
        return Statement(self._q["record_step"], params, lambda rows, _: (bool(rows[0][0]), bool(rows[0][1])))

    # -- durable waits (functions in sql/current.sql; each fenced by the lease, each parks the job itself) --

    def sleep_job(
        self, job_id: uuid.UUID, token: uuid.UUID, step: str, seconds: float, logs: str | None = None
    ) -> Statement[str]:
        """'ready' once the stored wake-up time has passed, 'parked' (lease given back) or 'lost'. A
        parked job's history entry keeps `logs` (as `Outcome.logs`), as do the other durable waits'."""
        params = {"id": job_id, "token": token, "step": step, "seconds": seconds, "logs": logs}
        return Statement(self._q["sleep_job"], params, lambda rows, _: str(rows[0][0]))

    def wait_for_event(
        self, job_id: uuid.UUID, token: uuid.UUID, key: str, step: str, timeout: float | None, logs: str | None = None
    ) -> Statement[tuple[str, Any]]:
        """('ready', {"payload": ...}), ('timeout', ...), ('parked', ...) or ('lost', None)."""
        params = {"id": job_id, "token": token, "key": key, "step": step, "timeout": timeout, "logs": logs}
        return Statement(self._q["wait_for_event"], params, lambda rows, _: (str(rows[0][0]), rows[0][1]))

    def emit_event(self, key: str, payload_json: str) -> Statement[bool]:
        params = {"key": key, "payload": payload_json, "channel": self.channel}
        return Statement(self._q["emit_event"], params, lambda rows, _: bool(rows[0][0]))

    def spawn_child(
        self, job_id: uuid.UUID, token: uuid.UUID, step: str, spec_json: str
    ) -> Statement[tuple[str, uuid.UUID | None]]:
        params = {"id": job_id, "token": token, "step": step, "spec": spec_json, "channel": self.channel}
        return Statement(self._q["spawn_child"], params, lambda rows, _: (str(rows[0][0]), rows[0][1]))

    def wait_for_children(self, job_id: uuid.UUID, token: uuid.UUID, logs: str | None = None) -> Statement[str]:
        params = {"id": job_id, "token": token, "logs": logs}
        return Statement(self._q["wait_for_children"], params, lambda rows, _: str(rows[0][0]))

    def groups_with_callbacks(self, group_ids: Sequence[uuid.UUID]) -> Statement[list[uuid.UUID]]:
        """Which of `group_ids` have a callback (a row in `job_group`)."""
        return Statement(
            self._q["groups_with_callbacks"], {"ids": list(group_ids)}, lambda rows, _: [r[0] for r in rows]
        )

    def children_snapshot(self, job_id: uuid.UUID, token: uuid.UUID, index: int) -> Statement[tuple[str, list[Job]]]:
        """The children the `index`-th `wait_for_children` of a run answers, once none is active:
        ('ready', jobs) as stored by an earlier run, or as they are now (and stored), or ('lost', [])."""

        def decode(rows: list[Row], _: int) -> tuple[str, list[Job]]:
            state, children = rows[0]
            return str(state), [job_from_json(child) for child in children or ()]

        params = {"id": job_id, "token": token, "index": index}
        return Statement(self._q["children_snapshot"], params, decode)

    def parked_at(self, job_id: uuid.UUID, token: uuid.UUID, attempt: int, waiting_for: str) -> Statement[bool]:
        """Whether attempt `attempt` (lease `token`) parked the job at `waiting_for` and nothing
        changed its history since."""
        params = {"id": job_id, "token": token, "attempt": attempt, "waiting_for": waiting_for}
        return Statement(self._q["parked_at"], params, lambda rows, _: bool(rows and rows[0][0]))

    def record_outcomes(self, outcomes: Sequence[Outcome]) -> Statement[dict[uuid.UUID, JobStatus]]:
        """Fenced outcome writes for many jobs; returns the status written for each id whose write applied
        (not the one asked for when the job was cancelled meanwhile, or a retry had no attempt left).

        Rows are sent in id order, like `heartbeat_leases`, so that two multi-row updates of one worker
        lock their rows in the same order and cannot deadlock each other.
        """
        outcomes = sorted(outcomes, key=attrgetter("job_id"))
        if all(o.status is JobStatus.COMPLETED and o.logs is None for o in outcomes):
            plain = {
                "ids": [o.job_id for o in outcomes],
                "tokens": [o.lease_token for o in outcomes],
                "results": [o.result_json for o in outcomes],
            }
            return Statement(self._q["complete_jobs"], plain, _statuses_written, prepare=False)
        params = {
            "ids": [o.job_id for o in outcomes],
            "tokens": [o.lease_token for o in outcomes],
            "statuses": [o.status.value for o in outcomes],
            "results": [o.result_json for o in outcomes],
            "errors": [o.error for o in outcomes],
            "delays": [float(o.delay_seconds) for o in outcomes],
            "released": [o.released for o in outcomes],
            "kinds": [o.kind or o.status.value for o in outcomes],
            "tracebacks": [o.traceback for o in outcomes],
            "logs": [o.logs for o in outcomes],
            "channel": self.channel,
        }
        return Statement(self._q["record_outcomes"], params, _statuses_written, prepare=False)

    # -- admin -------------------------------------------------------------------------------------

    def cancel_job(self, job_id: uuid.UUID) -> Statement[CancelResult]:
        def decode(rows: list[Row], _: int) -> CancelResult:
            if not rows:
                return CancelResult(None, None, None, None)
            before, after, job_type, queue = rows[0]
            return CancelResult(JobStatus(before), JobStatus(after), job_type, queue)

        return Statement(self._q["cancel_job"], {"id": job_id}, decode)

    def retry_job(
        self, job_id: uuid.UUID, available_at: datetime | None, delay_seconds: float
    ) -> Statement[tuple[JobStatus | None, bool]]:
        """Requeue a failed job; returns (status before, whether it was requeued)."""
        params = {"id": job_id, "available_at": available_at, "delay": delay_seconds, "channel": self.channel}

        def decode(rows: list[Row], _: int) -> tuple[JobStatus | None, bool]:
            if not rows:
                return None, False
            return JobStatus(rows[0][0]), bool(rows[0][1])

        return Statement(self._q["retry_job"], params, decode)

    def retry_failure_group(
        self, pattern: str, *, skip: Sequence[uuid.UUID] = (), limit: int = 1000
    ) -> Statement[tuple[int, int, list[uuid.UUID]]]:
        """Requeue up to `limit` failed jobs of a failure group (not those of `skip`); returns how many
        were chosen, how many requeued, and the ids left failed because another active job holds their
        unique key."""

        def decode(rows: list[Row], _: int) -> tuple[int, int, list[uuid.UUID]]:
            chosen, done, kept, _notified = rows[0]
            return int(chosen), int(done), list(kept or [])

        params = {"group": pattern, "skip": list(skip), "limit": limit, "channel": self.channel}
        return Statement(self._q["retry_failure_group"], params, decode, prepare=False)

    def delete_job(self, job_id: uuid.UUID) -> Chain[JobStatus | None]:
        """Delete a queued or terminal job; returns its status before (None: no such job). A queued job is
        first ended as cancelled in the same transaction, so its group and its parent count it as done."""
        delete = Statement(self._q["delete_job"], {"id": job_id}, lambda _rows, _count: None)

        def decode(rows: list[Row], _: int) -> JobStatus | None:
            return JobStatus(rows[0][0]) if rows else None

        def then(before: JobStatus | None) -> Statement[None] | None:
            return None if before in (None, JobStatus.RUNNING) else delete

        return Chain(Statement(self._q["end_job_for_delete"], {"id": job_id}, decode), then)

    def run_job_now(self, job_id: uuid.UUID) -> Statement[tuple[JobStatus | None, bool]]:
        """Make a queued job available now; returns (status before, whether it was moved)."""

        def decode(rows: list[Row], _: int) -> tuple[JobStatus | None, bool]:
            if not rows:
                return None, False
            return JobStatus(rows[0][0]), bool(rows[0][1])

        return Statement(self._q["run_job_now"], {"id": job_id, "channel": self.channel}, decode)

    def update_job(
        self,
        job_id: uuid.UUID,
        *,
        priority: int | None,
        queue: str | None,
        available_at: datetime | None,
        delay_seconds: float | None,
        tags: Sequence[str] | None,
        set_tags: bool,
    ) -> Statement[tuple[JobStatus | None, bool]]:
        """Change a queued job; returns (status before, whether it was changed). Workers are told when
        the job moved queue or start."""
        params = {
            "id": job_id,
            "priority": priority,
            "queue": queue,
            "available_at": available_at,
            "delay": delay_seconds,
            "tags": list(tags) if tags else None,
            "set_tags": set_tags,
            "wake": queue is not None or available_at is not None or delay_seconds is not None,
            "channel": self.channel,
        }

        def decode(rows: list[Row], _: int) -> tuple[JobStatus | None, bool]:
            if not rows:
                return None, False
            return JobStatus(rows[0][0]), bool(rows[0][1])

        return Statement(self._q["update_job"], params, decode)

    def update_jobs(
        self,
        *,
        after: uuid.UUID,
        limit: int,
        queue: str | None,
        type: str | None,
        tags: Sequence[str] | None,
        set_priority: int | None,
        set_queue: str | None,
        available_at: datetime | None,
        delay_seconds: float | None,
        add_tags: Sequence[str] | None,
        ids: Sequence[uuid.UUID] | None = None,
    ) -> Statement[tuple[uuid.UUID | None, int, int]]:
        """One batch of a bulk edit: up to `limit` queued jobs after `after` (id order) that match (and
        are among `ids` when given) and that no other transaction holds; returns (last id chosen, how
        many chosen, how many changed)."""
        params = {
            "after": after,
            "limit": limit,
            "queue": queue,
            "type": type,
            "tags": list(tags) if tags else None,
            "set_priority": set_priority,
            "set_queue": set_queue,
            "available_at": available_at,
            "delay": delay_seconds,
            "add_tags": list(add_tags) if add_tags else None,
            "ids": list(ids) if ids is not None else None,
            "wake": set_queue is not None or available_at is not None or delay_seconds is not None,
            "channel": self.channel,
        }

        def decode(rows: list[Row], _: int) -> tuple[uuid.UUID | None, int, int]:
            last, chosen, changed, _notified = rows[0]
            return last, int(chosen), int(changed)

        return Statement(self._q["update_jobs"], params, decode, prepare=False)

    def find_job(self, job_id: uuid.UUID) -> Statement[Job | None]:
        """One job with its parent and steps."""
        return Statement(self._q["find_job"], {"id": job_id}, lambda rows, _: job_from_row(rows[0]) if rows else None)

    def find_jobs(self, ids: Sequence[uuid.UUID]) -> Statement[list[Job]]:
        """The jobs of `ids` that exist, in the order of `ids`."""

        def decode(rows: list[Row], _: int) -> list[Job]:
            found = {job.id: job for job in map(job_from_row, rows)}
            return [found[job_id] for job_id in ids if job_id in found]

        return Statement(self._q["find_jobs"], {"ids": list(ids)}, decode, prepare=False)

    def list_jobs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        views: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        group_id: uuid.UUID | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
        newest_first: bool = False,
        name: str | None = None,
        search: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> Statement[list[Job]]:
        """One page in creation order (UUIDv7 ids), along the primary key in either direction; with
        `tags`, of the jobs that have every one of them."""
        params = {
            "name": name,
            "text": f"%{escape_like(search)}%" if search else None,
            "statuses": list(statuses) if statuses else None,
            "views": list(views) if views else None,
            "queues": list(queues) if queues else None,
            "types": list(types) if types else None,
            "group_id": group_id,
            "after": after,
            "limit": limit,
            "tags": list(tags) if tags else None,
        }
        query = self._q["list_jobs_newest" if newest_first else "list_jobs"].replace("{search}", SEARCH)
        return Statement(query, params, lambda rows, _: [job_from_row(r) for r in rows], prepare=False)

    def group_progress(self, group_id: uuid.UUID) -> Statement[GroupProgress]:
        def decode(rows: list[Row], _: int) -> GroupProgress:
            counts = {status: int(count) for status, count in rows}
            return GroupProgress(*(counts.get(s.value, 0) for s in JobStatus))

        return Statement(self._q["group_progress"], {"group_id": group_id}, decode)

    def prune_jobs(self, *, older_than_seconds: float, statuses: Sequence[str], limit: int = 10_000) -> Statement[int]:
        params = {"older_than_seconds": older_than_seconds, "statuses": list(statuses), "limit": limit}
        return Statement(self._q["prune_jobs"], params, lambda _, rowcount: rowcount)

    def schema_version(self) -> Statement[tuple[int, int]]:
        """The server's `server_version_num` and the schema's version."""
        return Statement(
            render(SERVER_AND_VERSION_QUERY, self.schema), {}, lambda rows, _: (int(rows[0][0]), int(rows[0][1]))
        )

    def server_version(self) -> Statement[int]:
        """The server's `server_version_num` alone, for a database the schema is missing from."""
        return Statement(SERVER_VERSION_QUERY, {}, lambda rows, _: int(rows[0][0]))


#: From this many jobs without unique keys, a batch is copied rather than inserted by one statement. A
#: copy takes round trips the statement does not (BEGIN, the COPY's start, the notifications, COMMIT),
#: but a row costs far less: for one type's jobs, 200 a call went in at 55–76k jobs/s by COPY against
#: 39–48k by the statement (5.4 µs of client CPU a job against 6.6); 100 a call was a draw (medians of
#: 40 calls, 3 runs each, loaded 2-core machine).
COPY_MIN_ROWS = 200

#: The arrays insert_jobs unnests, and how each is read from a job.
_ARRAYS: dict[str, Callable[[JobSpec], Any]] = {
    "ids": attrgetter("id"),
    "types": attrgetter("type"),
    "queues": attrgetter("queue"),
    "names": attrgetter("name"),
    "group_ids": attrgetter("group_id"),
    "unique_keys": attrgetter("unique_key"),
    "priorities": attrgetter("priority"),
    "configurations": attrgetter("configuration"),
    "max_attempts": attrgetter("max_attempts"),
    "available_ats": attrgetter("available_at"),
    "delays": lambda s: float(s.delay_seconds),
    "timeouts": attrgetter("timeout_seconds"),
    "concurrency_keys": attrgetter("concurrency_key"),
    "executions": attrgetter("execution"),
}
#: Those of insert_jobs_chained and insert_group: follow-ups and expiry too.
_CHAINED_ARRAYS: dict[str, Callable[[JobSpec], Any]] = {
    **_ARRAYS,
    "thens": attrgetter("then"),
    "expires_ats": attrgetter("expires_at"),
    "expires_ins": attrgetter("expires_in"),
    "tags": lambda s: json.dumps(list(s.tags)) if s.tags else None,
}
#: Those of insert_jobs_weighted: the weights too.
_WEIGHTED_ARRAYS: dict[str, Callable[[JobSpec], Any]] = {
    **_CHAINED_ARRAYS,
    "weights": attrgetter("weight"),
}


def _weight_checks(
    specs: Sequence[JobSpec], callback: tuple[uuid.UUID, str | None] | None
) -> tuple[list[str], list[bool], list[int]] | None:
    """(queue, keyed, weight) of each job weighing more than 1 among `specs`, their follow-ups (`then=`,
    at any depth) and a group's callback, for refuse_heavy_jobs; None when there is none (the plain
    statements, which do not name the weight column, are used then)."""
    found: list[tuple[str, bool, int]] = []
    texts: list[str] = []
    for spec in options_of(specs):
        if spec.weight != 1:
            found.append((spec.queue, spec.concurrency_key is not None, spec.weight))
        if spec.then is not None and '"weight"' in spec.then:
            texts.append(spec.then)
    if callback is not None and callback[1] is not None and '"weight"' in callback[1]:
        texts.append(callback[1])
    for text in texts:
        then = json.loads(text)
        while isinstance(then, dict):
            if then.get("weight", 1) != 1:
                found.append((then["queue"], then.get("concurrency_key") is not None, then["weight"]))
            then = then.get("then")
    if not found:
        return None
    queues, keyed, weights = zip(*found, strict=True)
    return list(queues), list(keyed), list(weights)


def _arrays(specs: Sequence[JobSpec], columns: Mapping[str, Callable[[JobSpec], Any]]) -> dict[str, list[Any]]:
    """`columns` of `specs` as arrays. Keyed rows come in (type, unique_key) order: concurrent batches
    with overlapping keys then take the unique index's insertion locks in one order and cannot deadlock."""
    if isinstance(specs, SharedSpecs):  # no keys; the template's values repeated, ids and configurations as they are
        size, template = len(specs), specs.template
        arrays = {name: [read(template)] * size for name, read in columns.items()}
        arrays["ids"], arrays["configurations"] = list(specs.ids), list(specs.configurations)
        return arrays
    specs = sorted(specs, key=lambda s: (s.unique_key is not None, s.type, s.unique_key or ""))
    return {name: [read(s) for s in specs] for name, read in columns.items()}


#: A backslash, and how COPY's text format writes one.
_BACKSLASH, _ESCAPED = "\\", "\\\\"


def _copy_rows(specs: Sequence[JobSpec], starts: bool) -> str:
    """The rows of `specs` in copy_jobs's columns and COPY's text format: a row is the columns before its
    id (written once for `SharedSpecs`), its id and its configuration.

    One text, written whole: sent in blocks of 250 or 1,000 rows as they were made (for the server to
    parse a block while the next is made), 10,000 jobs went in at 86k and 96k jobs/s against 142k
    (medians of 8 calls, loaded 2-core machine)."""
    if isinstance(specs, SharedSpecs):
        head = _copy_head(specs.template, starts)
        rows = [
            f"{head}{job_id.int:032x}\t{text.replace(_BACKSLASH, _ESCAPED)}\n"
            for job_id, text in zip(specs.ids, specs.configurations, strict=True)
        ]
    else:
        rows = [
            f"{_copy_head(s, starts)}{s.id.int:032x}\t{s.configuration.replace(_BACKSLASH, _ESCAPED)}\n" for s in specs
        ]
    return "".join(rows)


def _copy_head(spec: JobSpec, starts: bool) -> str:
    """The columns of a copied row before its id (copy_jobs's order), as COPY's text format reads them,
    each followed by a tab.

    Text escapes backslash, newline, carriage return and tab (validated text may hold any of them), and
    `\\N` is NULL. The configuration is `json_text`'s: ASCII with every control character escaped, so
    only its backslashes need escaping.
    """
    values: tuple[object, ...] = (
        spec.type,
        spec.queue,
        spec.name,
        spec.group_id,
        spec.priority,
        spec.max_attempts,
        spec.timeout_seconds,
        spec.concurrency_key,
    )
    if starts and spec.available_at is not None:  # copy_jobs_at: every job has one
        values += (spec.available_at.astimezone(UTC).isoformat(),)
    return "".join(f"{_copy_text(value)}\t" for value in values)


def _copy_text(value: object) -> str:
    if value is None:
        return "\\N"
    return str(value).replace(_BACKSLASH, _ESCAPED).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _none_found(_rows: list[Row], _count: int) -> dict[tuple[str, str], uuid.UUID]:
    return {}


def _decode_inserted(rows: list[Row], _: int) -> dict[tuple[str, str], uuid.UUID]:
    """Per unique (type, key) the id of the active job holding it (jobs without a key keep their id).

    A key can come back twice when the job that held it finished concurrently: once as the row this
    statement inserted, once as the old row its snapshot still saw. The inserted row wins.
    """
    found: dict[tuple[str, str], uuid.UUID] = {}
    for job_id, job_type, unique_key, inserted, _notified in rows:
        if unique_key is not None and (inserted or (job_type, unique_key) not in found):
            found[(job_type, unique_key)] = job_id
    return found


def decode_recovered(rows: list[Row], _: int) -> list[RecoveredJob]:
    return [RecoveredJob(r[0], r[1], r[2], JobStatus(r[3]), r[4], r[5]) for r in rows]


def _flag(rows: list[Row], _: int) -> bool | None:
    return bool(rows[0][0]) if rows else None


def _keyed_json(spec: JobSpec) -> str:
    """A job as the function schedule_keyed reads it: `spec_json`'s object and its trace context."""
    text = spec_json(spec)
    return text if spec.execution is None else f'{text[:-1]},"execution":{spec.execution}}}'


def _expires(spec: JobSpec) -> bool:
    return spec.expires_at is not None or spec.expires_in is not None


def job_from_row(row: Row) -> Job:
    """A `Job` from a read of the job's columns followed by its parent, its steps, `expires_at`, `tags` and
    `weight`."""
    values = dict(zip(JOB_COLUMNS, row[:-5], strict=True))
    values["status"] = JobStatus(values["status"])
    values["parent_id"] = row[-5]
    values["steps"] = row[-4] or {}
    values["expires_at"] = row[-3]
    values["tags"] = tuple(row[-2] or ())
    values["weight"] = row[-1]
    return Job(**values)


def job_from_json(data: Mapping[str, Any]) -> Job:
    """A `Job` from a job row as PostgreSQL's `to_jsonb` writes it (with `parent_id` and `steps`): ids,
    times and numbers read back as a read of the row returns them; columns `Job` lacks are ignored."""
    values: dict[str, Any] = {}
    for name, spec in Job.__dataclass_fields__.items():
        value = data.get(name)
        kind = str(spec.type)
        if value is None:
            pass
        elif "uuid.UUID" in kind:
            value = uuid.UUID(value)
        elif "datetime" in kind:
            value = datetime.fromisoformat(value)
        elif kind.startswith("float"):
            value = float(value)
        values[name] = value
    values["status"] = JobStatus(values["status"])
    values["history"] = values["history"] or []
    values["steps"] = values["steps"] or {}
    values["tags"] = tuple(values["tags"] or ())
    values["weight"] = values["weight"] or 1
    return Job(**values)


_STATUSES = {status.value: status for status in JobStatus}


def _statuses_written(rows: list[Row], _: int) -> dict[uuid.UUID, JobStatus]:
    """Each job whose outcome applied, with the status written (a notification row has no id)."""
    return {row[0]: _STATUSES[row[1]] for row in rows if row[0] is not None}


def _claimed(row: Row) -> ClaimedJob:
    """A claimed job from its row, where an empty configuration or checkpoint came back NULL (a
    configuration not loaded because it is too large is NULL too, with its size)."""
    job = ClaimedJob(*row)
    if job.execution_data is None:
        job.execution_data = {}
    else:
        job = _take_trace_context(job)
    if job.configuration_data is None and job.oversized_bytes is None:
        job.configuration_data = {}
    return job


def _take_trace_context(job: ClaimedJob) -> ClaimedJob:
    """The producer's trace context moves out of `execution_data`: the handler never sees the reserved key."""
    data = job.execution_data
    if not isinstance(data, dict) or TRACE_KEY not in data:
        return job
    carrier = data[TRACE_KEY]
    rest = {k: v for k, v in data.items() if k != TRACE_KEY}
    return replace(job, execution_data=rest, trace_context=carrier if isinstance(carrier, dict) else None)
