"""What the producer verbs decide before and after a statement: specs, groups, dedupe ids, filters, waits.

Pure rules and values shared by `App` and its blocking twin; nothing here does I/O.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg

from jobbus.audit import Acting, AuditEntry, acting
from jobbus.cells import tagged
from jobbus.durations import resolve_available_at
from jobbus.errors import DatabaseUnavailableError, InvalidJobError, InvalidStateError, JobbusError
from jobbus.events import JobScheduled
from jobbus.limits import KEEP, Keep, RateLimit, check_count, check_rate
from jobbus.models import JOB_VIEWS, Job, JobSpec, JobStatus, SharedSpecs, options_of
from jobbus.periodic import PeriodicSpec
from jobbus.registry import Registry
from jobbus.requests import (
    INT32_MAX,
    INT32_MIN,
    MAX_NAME_BYTES,
    MAX_TYPE_BYTES,
    MAX_UNIQUE_KEY_BYTES,
    JobRequest,
    follow_up_groups,
    new_job_id,
    refuse_follow_up_groups,
    seal_configurations,
    spec_json,
    specs_sharing,
    validate_tags,
    validate_text,
)
from jobbus.resilience import Backoff, first_line, is_transient
from jobbus.settings import Settings
from jobbus.store import CancelResult, JobStore, Statement
from jobbus.store.audit import AuditStore
from jobbus.store.jobs import raise_group_refusal
from jobbus.store.periodic import PeriodicStore
from jobbus.store.queues import QueueStore
from jobbus.store.statements import Chain, Operation

#: One job for `schedule_many`: a JobRequest, a mapping of its fields, or a (type, configuration) pair.
JobItem = JobRequest | Mapping[str, Any] | tuple[str, Mapping[str, Any] | None]
#: Which ids the database gave keyed specs: (type, unique_key) → id.
Found = dict[tuple[str, str], uuid.UUID]
TERMINAL = ("completed", "failed", "cancelled")
#: A keyed insert that meets an active job committed after its snapshot asks again, this many times.
DEDUPE_ROUNDS = 10
#: What a statement raises on a schema older than this code, or none: a table, column or function it
#: names is missing (then `check_schema` says which version is there and what to run).
SCHEMA_OUTDATED = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InvalidSchemaName,
)


class ProducerApp(Protocol):
    """What the verbs read of their App: settings, stores, and the registry (job defaults, listeners)."""

    settings: Settings
    store: JobStore
    periodic_store: PeriodicStore
    queue_store: QueueStore
    audit_store: AuditStore
    registry: Registry


class DatabaseWait:
    """One App call waiting out an unreachable database, within `database_wait_seconds`."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.sent = False  # a statement went out at least once: it may have been applied
        self.backoff = Backoff(first=0.05, cap=1.0)

    def remaining(self) -> float:
        return max(0.05, self.deadline - time.monotonic())

    def after(self, exc: Exception, repeatable: bool) -> float:
        """Re-raise what cannot be waited out; otherwise how long to sleep before the next try."""
        raise_group_refusal(exc)
        if not is_transient(exc):
            raise exc
        left = self.deadline - time.monotonic()
        if left <= 0 or (self.sent and not repeatable):
            written = None if self.sent else False
            outcome = "its outcome is unknown" if self.sent else "nothing was written"
            raise DatabaseUnavailableError(
                f"the database is unavailable ({type(exc).__name__}: {first_line(exc)}); {outcome}",
                written=written,
            ) from exc
        return min(self.backoff.next_delay(), left)


def deadline_after(seconds: float | None) -> float | None:
    """The monotonic instant `seconds` from now (None: never)."""
    return None if seconds is None else time.monotonic() + seconds


def seconds_until(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


# -- specs -----------------------------------------------------------------------------------------


def job_specs(
    app: ProducerApp,
    jobs: Iterable[JobItem] | str,
    configurations: Iterable[Mapping[str, Any] | None] | None,
    common: Mapping[str, Any],
) -> tuple[Sequence[JobSpec], Sequence[int]]:
    """The specs to insert and, per input, the index of its spec (a repeated unique key folds onto the first;
    a range when there is none)."""
    registry = app.registry
    if (
        isinstance(jobs, str)
        and configurations is not None
        and common.get("unique_key") is None
        and common.get("then") is None  # every job needs a follow-up of its own
    ):
        # One type, shared options: validate the options once, then only each configuration.
        template = registry.build_job_spec(_request({**common, "type": jobs}))
        shared = specs_sharing(template, configurations, registry.settings.max_payload_bytes)
        if registry.cell is not None:  # a cell's App: its ids carry the cell's tag
            shared = SharedSpecs(template, [tagged(i, registry.cell_tag) for i in shared.ids], shared.configurations)
        if registry.settings.encryption_keys:
            shared = seal_configurations(shared, registry.keyring_or_fail(), registry.settings.max_payload_bytes)
        return shared, range(len(shared))
    specs: list[JobSpec] = []
    order: list[int] = []
    first_by_key: dict[tuple[str, str], int] = {}
    for request in list(_requests(jobs, configurations, common)):
        spec = registry.build_job_spec(request)
        if spec.unique_key is not None:
            key = (spec.type, spec.unique_key)
            if key in first_by_key:  # a repeat within the batch folds onto the first
                order.append(first_by_key[key])
                if spec.debounce is not None:  # debounce: the last call's configuration wins
                    specs[first_by_key[key]] = replace(spec, id=specs[first_by_key[key]].id)
                continue
            first_by_key[key] = len(specs)
        order.append(len(specs))
        specs.append(spec)
    return specs, order


def group_specs(
    app: ProducerApp, requests: Iterable[JobItem], group_id: uuid.UUID | None, then: JobRequest | None
) -> tuple[uuid.UUID, Sequence[JobSpec], Sequence[int], tuple[uuid.UUID, str | None]]:
    """(group id, specs, order, (group id, its callback's spec as JSON)) for `schedule_group`."""
    group = new_job_id() if group_id is None else as_uuid(group_id)
    if group_id is None and app.registry.cell is not None:  # found first in its cell by `group_progress`
        group = tagged(group, app.registry.cell_tag)
    specs, order = job_specs(app, requests, None, {"group_id": group})
    if not specs:
        raise InvalidJobError("schedule_group needs at least one job")
    if any(spec.group_id != group for spec in specs):
        raise InvalidJobError("schedule_group: a job of the group names another group_id")
    if any(spec.unique_for is not None or spec.debounce is not None for spec in options_of(specs)):
        raise InvalidJobError(
            "schedule_group: members cannot have unique_for or debounce (a member answered by another job "
            "of its key would not be one of the group)"
        )
    callback = None
    if then is not None:
        if not isinstance(then, JobRequest):
            raise InvalidJobError(f"then must be a jobbus.JobRequest, got {then!r:.80}")
        if any(spec.unique_key is not None for spec in specs):
            raise InvalidJobError("schedule_group with then=: members cannot have a unique_key")
        callback = spec_json(app.registry.build_job_spec(then))
        if group in follow_up_groups(specs, callback):
            refuse_follow_up_groups([group])
    return group, specs, order, (group, callback)


# -- cells: where a call's jobs go (an App with cells hands the call to that cell's App) -------------


def cell_of_many(
    registry: Registry,
    jobs: Iterable[JobItem] | str,
    configurations: Iterable[Mapping[str, Any] | None] | None,
    common: Mapping[str, Any],
) -> tuple[Iterable[JobItem] | str, Iterable[Mapping[str, Any] | None] | None, str]:
    """The jobs and configurations of `schedule_many` (iterables read once, kept as lists) and the one
    cell they all go to; `InvalidJobError` when they would go to several (nothing is written)."""
    placement = registry.placement
    assert placement is not None, "called with cells"
    if isinstance(jobs, str):
        if registry.cell_router is None or common.get("cell") is not None or configurations is None:
            return jobs, configurations, registry.cell_for(common.get("cell"), common.get("queue"), jobs)
        listed = list(configurations)
        cells = [registry.cell_for(None, common.get("queue"), jobs, c) for c in listed]
        return jobs, listed, placement.one_cell("schedule_many", cells)
    items = list(jobs)
    requests = _requests(items, configurations, common)
    cells = [registry.cell_for(r.cell, r.queue, r.type, r.configuration) for r in requests]
    return items, configurations, placement.one_cell("schedule_many", cells)


def cell_of_group(registry: Registry, requests: Iterable[JobItem]) -> tuple[list[JobItem], str]:
    """`schedule_group`'s members (kept as a list) and their one cell: a group lives in one cell."""
    placement = registry.placement
    assert placement is not None, "called with cells"
    items = list(requests)
    cells = [registry.cell_for(r.cell, r.queue, r.type, r.configuration) for r in _requests(items, None, {})]
    return items, placement.one_cell("schedule_group", cells)


def cell_of_specs(registry: Registry, specs: Sequence[JobSpec]) -> str:
    """The one cell of specs built already (`insert_specs`): the cell whose tag each id carries (the
    App's `build_job_spec` placed it; see `Placement.cell_of_spec` for a tag two cells share)."""
    placement = registry.placement
    assert placement is not None, "called with cells"
    cells = [placement.cell_of_spec(spec.id, spec.queue) for spec in options_of(specs)]
    return placement.one_cell("insert_specs", cells)


def _requests(
    jobs: Iterable[JobItem] | str,
    configurations: Iterable[Mapping[str, Any] | None] | None,
    common: Mapping[str, Any],
) -> Iterable[JobRequest]:
    if isinstance(jobs, str):
        if configurations is None:
            raise InvalidJobError("schedule_many(type, configurations): configurations are missing")
        for configuration in configurations:
            yield _request({**common, "type": jobs, "configuration": configuration})
        return
    if configurations is not None:
        raise InvalidJobError("schedule_many takes either (type, configurations) or a list of job requests")
    for job in jobs:
        if isinstance(job, JobRequest):
            yield job if not common else _request({**common, **_fields(job)})
        elif isinstance(job, Mapping):
            yield _request({**common, **job})
        elif isinstance(job, tuple) and 1 <= len(job) <= 2:  # ("type", configuration)
            yield _request({**common, **dict(zip(("type", "configuration"), job, strict=False))})
        else:
            raise InvalidJobError(
                f"schedule_many: each job must be a JobRequest, a mapping or a (type, configuration) tuple, "
                f"got {job!r:.80}"
            )


def _fields(request: JobRequest) -> dict[str, Any]:
    return {name: getattr(request, name) for name in JobRequest.__slots__ if getattr(request, name) is not None}


def _request(values: Mapping[str, Any]) -> JobRequest:
    try:
        return JobRequest(**values)
    except TypeError as exc:
        raise InvalidJobError(f"schedule_many: {exc}") from None


# -- follow-ups and deduplication ------------------------------------------------------------------


def missing(specs: Sequence[JobSpec], found: Mapping[tuple[str, str], uuid.UUID]) -> list[JobSpec]:
    """Keyed specs that met an active job this statement could not see: ask again in a new one."""
    if isinstance(specs, SharedSpecs):  # no keys
        return []
    return [s for s in specs if s.unique_key is not None and (s.type, s.unique_key) not in found]


def dedupe_contention(specs: Sequence[JobSpec], found: Mapping[tuple[str, str], uuid.UUID]) -> JobbusError:
    keys = ", ".join(f"{s.type}/{s.unique_key}" for s in missing(specs, found)[:3])
    return JobbusError(
        f"unique_key {keys}: an active job holds it but this transaction cannot see it (a REPEATABLE READ or "
        "SERIALIZABLE transaction that started before it): retry the transaction"
    )


def _job_id(spec: JobSpec, found: Mapping[tuple[str, str], uuid.UUID]) -> uuid.UUID:
    """The id a spec ended up with: its own, or that of the active job holding its unique key."""
    return spec.id if spec.unique_key is None else found.get((spec.type, spec.unique_key), spec.id)


def resolve_ids(
    specs: Sequence[JobSpec], order: Sequence[int], found: Mapping[tuple[str, str], uuid.UUID]
) -> list[uuid.UUID]:
    ids = list(specs.ids) if isinstance(specs, SharedSpecs) else [_job_id(spec, found) for spec in specs]
    return in_input_order(ids, order)


def in_input_order(ids: list[uuid.UUID], order: Sequence[int]) -> list[uuid.UUID]:
    """Per input, the id of its spec; `order` is `job_specs`'s, a range when each input has its own spec."""
    return ids if order == range(len(ids)) else [ids[index] for index in order]


def scheduled_events(specs: Sequence[JobSpec], found: Mapping[tuple[str, str], uuid.UUID]) -> list[JobScheduled]:
    """`JobScheduled` for each spec that became a new row (a deduplicated one maps to another job's id)."""
    if isinstance(specs, SharedSpecs):  # no keys: every job is new
        template = specs.template
        return [JobScheduled(job_id, template.type, template.queue) for job_id in specs.ids]
    return [JobScheduled(spec.id, spec.type, spec.queue) for spec in specs if _job_id(spec, found) == spec.id]


# -- admin -----------------------------------------------------------------------------------------


def job_order(job: Job) -> uuid.UUID:
    """What `list_jobs` orders by (creation order: UUIDv7 ids), to merge the pages of several cells."""
    return job.id


def as_uuid(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidJobError(f"not a job id (UUID): {value!r}") from None


def cancel_status(job_id: uuid.UUID, result: CancelResult) -> JobStatus:
    if result.after is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    return result.after


def check_retry(job_id: uuid.UUID, before: JobStatus | None, done: bool) -> None:
    if before is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    if not done:
        raise InvalidStateError(f"job {job_id} is {before.value}; only failed jobs can be retried")


def check_delete(job_id: uuid.UUID, before: JobStatus | None) -> None:
    if before is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    if before is JobStatus.RUNNING:
        raise InvalidStateError(f"job {job_id} is running; cancel it first, delete it once it has stopped")


def check_run_now(job_id: uuid.UUID, before: JobStatus | None, done: bool) -> None:
    if before is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    if not done:
        raise InvalidStateError(f"job {job_id} is {before.value}; only queued jobs can be run now")


def check_update(job_id: uuid.UUID, before: JobStatus | None, done: bool) -> None:
    if before is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    if not done:
        raise InvalidStateError(f"job {job_id} is {before.value}; only queued jobs can be updated")


#: Jobs one statement of `update_many` changes at most: each batch is its own short transaction, so a
#: bulk edit of a million jobs never holds a million row locks (nor blocks the claims for long).
UPDATE_BATCH = 1000


def update_changes(
    what: str,
    priority: int | None,
    queue: str | None,
    available_at: datetime | timedelta | None,
    tags: Sequence[str] | None,
    tags_name: str,
) -> dict[str, Any]:
    """The changes of `update` or `update_many`, validated as a job's options are; at least one."""
    if priority is None and queue is None and available_at is None and tags is None:
        prefix = "set_" if what == "update_many" else ""
        names = (f"{prefix}priority", f"{prefix}queue", f"{prefix}available_at", tags_name)
        raise InvalidJobError(f"{what}: give at least one change ({', '.join(names)})")
    prefix = "set_" if what == "update_many" else ""
    if priority is not None:
        priority = _priority(f"{prefix}priority", priority)
    if queue is not None:
        queue = validate_text(f"{prefix}queue", queue, MAX_TYPE_BYTES)
    at, delay = resolve_available_at(available_at) if available_at is not None else (None, None)
    return {
        "priority": priority,
        "queue": queue,
        "available_at": at,
        "delay_seconds": None if available_at is None or at is not None else float(delay or 0.0),
        "tags": None if tags is None else validate_tags(tags_name, tags),
    }


def _priority(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(f"{what} must be an integer, got {value!r}")
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidJobError(f"{what} must be between {INT32_MIN} and {INT32_MAX} (32 bits), got {value}")
    return value


def update_filters(queue: str | None, type: str | None, tag: Sequence[str] | str | None) -> dict[str, Any]:
    """The filters of `update_many`: at least one, each validated."""
    if queue is None and type is None and tag is None:
        raise InvalidJobError("update_many: give at least one filter (queue, type, tag)")
    tags = tag_filter(tag)
    if tag is not None and not tags:
        raise InvalidJobError("update_many: tag must name at least one tag")
    return {
        "queue": None if queue is None else validate_text("queue", queue, MAX_TYPE_BYTES),
        "type": None if type is None else validate_text("type", type, MAX_TYPE_BYTES),
        "tags": tags,
    }


def list_filters(
    status: Sequence[str | JobStatus] | str | JobStatus | None,
    queue: Sequence[str] | str | None,
    type: Sequence[str] | str | None,
    group_id: uuid.UUID | None,
    after: uuid.UUID | None,
    limit: int,
    newest_first: bool,
    name: str | None = None,
    search: str | None = None,
    tag: Sequence[str] | str | None = None,
) -> dict[str, Any]:
    def many(value: Any) -> list[str] | None:  # JobStatus is a StrEnum: str() gives its value
        if value is None:
            return None
        return [str(value)] if isinstance(value, str) else [str(v) for v in value]

    wanted = many(status)
    for s in wanted or []:
        if s not in JOB_VIEWS:
            JobStatus(s)
    statuses = [s for s in wanted or [] if s not in JOB_VIEWS] or None
    views = [s for s in wanted or [] if s in JOB_VIEWS] or None
    if not 1 <= limit <= 10_000:
        raise InvalidJobError(f"limit must be between 1 and 10000, got {limit}")
    return {
        "statuses": statuses,
        "views": views,
        "queues": many(queue),
        "types": many(type),
        "group_id": as_uuid(group_id) if group_id is not None else None,
        "after": as_uuid(after) if after is not None else None,
        "limit": limit,
        "newest_first": bool(newest_first),
        "name": validate_text("name", name, MAX_NAME_BYTES) if name is not None else None,
        "search": search or None,
        "tags": tag_filter(tag),
    }


def tag_filter(tag: Sequence[str] | str | None) -> list[str] | None:
    """Tags a job must all have, as a filter names them (one tag or several), validated as a job's."""
    if tag is None:
        return None
    tags = validate_tags("tag", [tag] if isinstance(tag, str) else list(tag))
    return list(tags) if tags else None


def prune_params(older_than: timedelta, statuses: Sequence[str | JobStatus]) -> dict[str, Any]:
    if not isinstance(older_than, timedelta) or older_than.total_seconds() < 0:
        raise InvalidJobError(f"older_than must be a non-negative timedelta, got {older_than!r}")
    names = [JobStatus(s).value for s in statuses]
    active = [s for s in names if s not in TERMINAL]
    if active:
        raise InvalidJobError(f"prune removes finished jobs only; {', '.join(active)} is not a finished status")
    return {"older_than_seconds": older_than.total_seconds(), "statuses": names, "limit": 10_000}


def consume_statement(app: ProducerApp, queue: str, units: int, key: str | None) -> Statement[bool]:
    """`App.consume`'s statement, its arguments checked (`InvalidJobError` naming the one at fault) and
    its id made here, once, so that every repeat of the statement carries the same one."""
    queue = validate_text("queue", queue, MAX_TYPE_BYTES)
    if isinstance(units, bool) or not isinstance(units, int):
        raise InvalidJobError(f"units must be an integer, got {units!r}")
    if not 1 <= units <= INT32_MAX:
        raise InvalidJobError(f"units must be between 1 and {INT32_MAX}, got {units}")
    if key is not None:
        key = validate_text("key", key, MAX_UNIQUE_KEY_BYTES)
    return app.queue_store.spend_units(new_job_id(), queue, key, units)


def set_queue_statement(
    app: ProducerApp,
    queue: str,
    concurrency: int | Keep | None,
    concurrency_per_key: int | Keep | None,
    rate_limit: RateLimit | Keep | None,
    rate_limit_per_key: RateLimit | Keep | None,
) -> Chain[None]:
    """The limits written and a row left empty dropped, with the audit entry, in one transaction."""
    queue = validate_text("queue", queue, MAX_TYPE_BYTES)
    counts = (check_count("concurrency", concurrency), check_count("concurrency_per_key", concurrency_per_key))
    rates = (check_rate("rate_limit", rate_limit), check_rate("rate_limit_per_key", rate_limit_per_key))
    write, drop_empty = app.queue_store.set_limits(
        queue, concurrency=counts[0], concurrency_per_key=counts[1], rate_limit=rates[0], rate_limit_per_key=rates[1]
    )
    names = ("concurrency", "concurrency_per_key", "rate_limit", "rate_limit_per_key")
    details = {
        name: str(value) if isinstance(value, RateLimit) else value
        for name, value in zip(names, (*counts, *rates), strict=True)
        if value is not KEEP
    }
    return app.audit_store.audited(Chain(write, lambda _: drop_empty), "set_queue", f"queue:{queue}", lambda _: details)


# -- the audit trail: what each action records once it took effect (None: it changed nothing) --------


def job_target(job_id: uuid.UUID) -> str:
    return f"job:{job_id}"


def periodic_target(name: str) -> str:
    return f"periodic:{name}"


def cancel_effect(result: CancelResult) -> dict[str, Any] | None:
    """A queued job cancelled, or a running one asked to stop; a finished one is left as it is."""
    if result.before in (JobStatus.QUEUED, JobStatus.RUNNING) and result.after is not None:
        return {"before": result.before.value, "after": result.after.value}
    return None


def done_effect(result: tuple[JobStatus | None, bool]) -> dict[str, Any] | None:
    before, done = result
    return {"before": before.value} if done and before is not None else None


def done_effect_with(changes: dict[str, Any]) -> Callable[[tuple[JobStatus | None, bool]], dict[str, Any] | None]:
    def effect(result: tuple[JobStatus | None, bool]) -> dict[str, Any] | None:
        found = done_effect(result)
        return None if found is None else {**found, "changes": changes}

    return effect


def delete_effect(before: JobStatus | None) -> dict[str, Any] | None:
    return None if before in (None, JobStatus.RUNNING) else {"before": before.value if before else None}


def true_effect(done: bool) -> dict[str, Any] | None:
    return {} if done else None


def periodic_effect(spec: PeriodicSpec) -> Callable[[bool], dict[str, Any] | None]:
    schedule = spec.schedule
    details = {"type": spec.type, "queue": spec.queue, "cron": schedule.cron, "every_seconds": schedule.every_seconds}
    return lambda done: details if done else None


def described_changes(
    priority: int | None,
    queue: str | None,
    available_at: datetime | timedelta | None,
    tags: Sequence[str] | None,
    tags_name: str,
) -> dict[str, Any]:
    """The changes an `update` or `update_many` asked for, as its audit entry shows them."""
    described: dict[str, Any] = {}
    if priority is not None:
        described["priority"] = priority
    if queue is not None:
        described["queue"] = queue
    if available_at is not None:
        described["available_at"] = str(available_at)
    if tags is not None:
        described[tags_name] = list(tags)
    return described


@dataclass(frozen=True, slots=True)
class BulkEntry:
    """The one audit entry of a bulk action run in batches (each batch its own transaction): written
    with the last batch, with the total, so it exists exactly when the whole action did."""

    app: ProducerApp
    action: str
    details: dict[str, Any]
    who: Acting
    entry_id: uuid.UUID

    def last_batch(
        self, batch: Statement[tuple[uuid.UUID | None, int, int]], total: int
    ) -> Chain[tuple[uuid.UUID | None, int, int]]:
        """`batch`, and the entry in its transaction when it is the last one (fewer than a full batch)."""

        def then(result: tuple[uuid.UUID | None, int, int]) -> Operation[None] | None:
            last, chosen, changed = result
            if last is not None and chosen >= UPDATE_BATCH:
                return None
            return self._record({"count": total + changed})

        return Chain(batch, then)

    def refused(self, total: int, refusal: str) -> Operation[None]:
        """The entry of a bulk action a batch refused after `total` jobs were changed by those before."""
        return self._record({"count": total, "refused": refusal})

    def _record(self, more: dict[str, Any]) -> Operation[None]:
        store = self.app.audit_store
        return store.record(self.action, "jobs", {**self.details, **more}, who=self.who, entry_id=self.entry_id)


def audit_window(
    since: datetime | timedelta | None, after: AuditEntry | None, limit: int
) -> tuple[datetime | None, tuple[datetime, uuid.UUID] | None]:
    """`list_audit`'s arguments checked: where its window starts, and the keyset of the page before."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise ValueError(f"list_audit: limit must be an integer from 1 to 10000, got {limit!r}")
    if isinstance(since, timedelta):
        since = datetime.now(UTC) - since
    elif since is not None and (not isinstance(since, datetime) or since.utcoffset() is None):
        raise ValueError(f"list_audit: since must be an aware datetime or a timedelta, got {since!r}")
    return since, None if after is None else (after.at, after.id)


def update_many_entry(
    app: ProducerApp,
    queue: str | None,
    type: str | None,
    tag: Sequence[str] | str | None,
    set_priority: int | None,
    set_queue: str | None,
    set_available_at: datetime | timedelta | None,
    add_tags: Sequence[str] | None,
) -> BulkEntry:
    given = {"queue": queue, "type": type, "tag": [tag] if isinstance(tag, str) else tag}
    details = {
        "filter": {name: list(value) if name == "tag" else value for name, value in given.items() if value},
        "changes": described_changes(set_priority, set_queue, set_available_at, add_tags, "add_tags"),
    }
    return BulkEntry(app, "update_many", details, acting(), new_job_id())
