"""The producer and admin verbs, written once: `App` runs them, and `_sync.py` is generated from this file.

`tools/generate_sync.py` (`make sync`) writes the blocking twin by substitution (``async def`` → ``def``,
``await`` dropped, ``AsyncConnection`` → ``Connection``, ...); keep to what it rewrites, and leave what
differs between the flavours to the edges each one supplies (`_connection`, `_insert`,
`_finished_jobs`, `_migrate`).
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar, Unpack

import psycopg

from jobbus import schema as schema_module
from jobbus import tracing
from jobbus.audit import AuditEntry
from jobbus.durations import resolve_available_at, seconds_or_none
from jobbus.encryption import open_job
from jobbus.errors import DatabaseUnavailableError, InvalidJobError, InvalidStateError, SchemaError
from jobbus.events import JobCancelled
from jobbus.execution import check_event_key
from jobbus.limits import KEEP, Keep, QueueSettings, RateLimit
from jobbus.models import GroupProgress, Job, JobSpec, JobStatus
from jobbus.periodic import Periodic, PeriodicOptions
from jobbus.producer import plan
from jobbus.producer.plan import Found, JobItem, ProducerApp
from jobbus.requests import (
    MAX_TYPE_BYTES,
    JobOptions,
    JobRequest,
    follow_up_groups,
    json_text,
    new_job_id,
    refuse_follow_up_groups,
    validate_text,
)
from jobbus.resilience import pooler_misconfiguration
from jobbus.store import run_async
from jobbus.store.jobs import raise_group_refusal
from jobbus.store.statements import Operation
from jobbus.waiting import FinishedJobs, timeout_message, vanished_message

T = TypeVar("T")


class AsyncProducer(ABC):
    """The producer and admin verbs over an App's stores; each flavour supplies its I/O edges."""

    #: The App whose settings, stores, listeners and handlers the verbs read.
    _app: ProducerApp
    #: What `connection=` of the other flavour raises.
    _WRONG_CONNECTION: ClassVar[str]

    @abstractmethod
    def _connection(self, timeout: float) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection of this flavour's pool, waited for at most `timeout` seconds."""

    @abstractmethod
    async def _insert(self, specs: Sequence[JobSpec], connection: psycopg.AsyncConnection[Any] | None) -> Found:
        """Insert validated specs, in the caller's transaction when `connection` is given."""

    @abstractmethod
    def _finished_jobs(self) -> FinishedJobs:
        """The listener `wait` registers with (one per App and flavour)."""

    @abstractmethod
    async def _migrate(self) -> list[schema_module.Migration]: ...

    @abstractmethod
    def _in_cell(self, cell: str) -> AsyncProducer:
        """The same flavour's verbs of one cell's App (an App with cells hands its calls to them)."""

    # -- cells: an App with cells places each call in one cell, or finds the cell of a job id ---------

    def _cell(self, cell: str, connection: psycopg.AsyncConnection[Any] | None) -> AsyncProducer:
        """The verbs of `cell`, after checking that `connection=` (if given) is to that cell's database."""
        placement = self._app.registry.placement
        if connection is not None and placement is not None:
            placement.check_connection(cell, getattr(getattr(connection, "info", None), "dbname", None))
        return self._in_cell(cell)

    async def _holding(self, job_id: uuid.UUID) -> tuple[AsyncProducer, Job] | None:
        """The cell's verbs and the job, asking first the cells whose tag the id carries, then the others.

        A cell that cannot be reached is passed over; when no cell that answered has the job, its
        `DatabaseUnavailableError` is raised (the job may be there), naming the cell."""
        placement = self._app.registry.placement
        assert placement is not None, "called with cells"
        unreachable: tuple[str, DatabaseUnavailableError] | None = None
        for cell in placement.search_order(job_id):
            producer = self._in_cell(cell)
            try:
                job = await producer.find(job_id)
            except DatabaseUnavailableError as exc:
                unreachable = unreachable or (cell, exc)
                continue
            if job is not None:
                return producer, job
        if unreachable is not None:
            silent, error = unreachable
            raise DatabaseUnavailableError(
                f"job {job_id} is in no cell that answered, and cell {silent!r} did not: {error}"
            ) from error
        return None

    async def _located(self, job_id: uuid.UUID) -> AsyncProducer:
        """The verbs of the cell that holds `job_id`; `InvalidStateError` when no cell does."""
        holding = await self._holding(plan.as_uuid(job_id))
        if holding is None:
            raise InvalidStateError(f"job {job_id} does not exist")
        return holding[0]

    async def _run(
        self,
        statement: Operation[T],
        connection: psycopg.AsyncConnection[Any] | None = None,
        *,
        repeatable: bool = True,
    ) -> T:
        """Run one statement. On the App's pool, a lost connection or a busy server is waited out for at
        most `database_wait_seconds`, repeating the statement when that is safe (`repeatable`), then
        `DatabaseUnavailableError`. In the caller's own transaction nothing is repeated. A statement that
        meets a schema older than this code (or none) raises `SchemaError` saying to migrate; one that
        shows a transaction-mode pooler while `transaction_pooling` is off raises `TransactionPoolerError`."""
        try:
            return await self._execute(statement, connection, repeatable)
        except plan.SCHEMA_OUTDATED as exc:
            try:
                await self.check_schema()  # on the pool: the caller's transaction, if any, is aborted
            except SchemaError as outdated:
                raise outdated from exc
            raise
        except psycopg.Error as exc:
            misconfigured = pooler_misconfiguration(exc, self._app.settings.transaction_pooling)
            if misconfigured is not None:
                raise misconfigured from exc
            raise

    async def _execute(
        self, statement: Operation[T], connection: psycopg.AsyncConnection[Any] | None, repeatable: bool
    ) -> T:
        if connection is not None:
            if not isinstance(connection, psycopg.AsyncConnection):
                raise TypeError(self._WRONG_CONNECTION)
            try:
                return await run_async(connection, statement)
            except psycopg.Error as exc:
                raise_group_refusal(exc)
                raise
        waiting = plan.DatabaseWait(self._app.settings.database_wait_seconds)
        while True:
            try:
                async with self._connection(waiting.remaining()) as conn:
                    waiting.sent = True
                    return await run_async(conn, statement)
            except Exception as exc:
                await asyncio.sleep(waiting.after(exc, repeatable))

    # -- producers ---------------------------------------------------------------------------------

    async def schedule(
        self,
        type: str,
        configuration: Mapping[str, Any] | None = None,
        *,
        connection: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[JobOptions],
    ) -> uuid.UUID:
        """Enqueue one job and return its id, or the id of the active job holding `unique_key`.

        The options are those of `JobOptions`. `then`: a follow-up job, scheduled exactly once in the
        transaction that records this job `completed` (never on failure or cancellation). `expires`:
        seconds or a timedelta from now, or an aware datetime; a job not started by then never runs
        and ends `cancelled` ("expired"). `cell`: the cell it goes to, for an App with cells.
        """
        registry = self._app.registry
        if registry.placement is not None:
            cell = registry.cell_for(options.get("cell"), options.get("queue"), type, configuration)
            return await self._cell(cell, connection).schedule(type, configuration, connection=connection, **options)
        spec = registry.build_job_spec(JobRequest(type, configuration, **options))
        (job_id,) = await self.insert_specs([spec], connection=connection)
        return job_id

    async def schedule_many(
        self,
        jobs: Iterable[JobItem] | str,
        configurations: Iterable[Mapping[str, Any] | None] | None = None,
        *,
        connection: psycopg.AsyncConnection[Any] | None = None,
        **common: Unpack[JobOptions],
    ) -> list[uuid.UUID]:
        """Enqueue many jobs in one round trip; ids come back in input order.

        Either a list of ``JobRequest(...)``, ``{"type": ..., "configuration": ..., ...}`` or
        ``("type", configuration)`` items, or ``schedule_many("type", [config, ...], queue=..., ...)``;
        keyword options (those of `JobOptions`) apply to every job. With cells, every job of one call
        goes to one cell (one call is one transaction): jobs that would go to several raise `ValueError`.
        """
        if self._app.registry.placement is not None:
            jobs, configurations, cell = plan.cell_of_many(self._app.registry, jobs, configurations, common)
            return await self._cell(cell, connection).schedule_many(
                jobs, configurations, connection=connection, **common
            )
        specs, order = plan.job_specs(self._app, jobs, configurations, common)
        ids = await self.insert_specs(specs, connection=connection)
        return plan.in_input_order(ids, order)

    async def insert_specs(
        self, specs: Sequence[JobSpec], *, connection: psycopg.AsyncConnection[Any] | None = None
    ) -> list[uuid.UUID]:
        """Insert jobs already validated by `build_spec`, in one round trip; ids come back in input order.

        For producers that must validate before they act (the bus validates every job of a dispatch
        before its inline handlers run). A spec whose unique key an active job holds gets that job's id.
        """
        if not specs:
            return []
        if self._app.registry.placement is not None:
            cell = plan.cell_of_specs(self._app.registry, specs)
            return await self._cell(cell, connection).insert_specs(specs, connection=connection)
        await self._check_follow_up_groups(follow_up_groups(specs), connection)
        with tracing.producing(specs) as specs:
            found = await self._insert(specs, connection)
            for _ in range(plan.DEDUPE_ROUNDS):
                missing = plan.missing(specs, found)
                if not missing:
                    break
                found.update(await self._insert(missing, connection))
            else:
                raise plan.dedupe_contention(specs, found)
        events = self._app.registry.events
        if events:
            for event in plan.scheduled_events(specs, found):
                await events.emit(event)
        return plan.resolve_ids(specs, range(len(specs)), found)

    async def schedule_group(
        self,
        requests: Iterable[JobItem],
        *,
        group_id: uuid.UUID | None = None,
        then: JobRequest | None = None,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> tuple[uuid.UUID, list[uuid.UUID]]:
        """Schedule jobs as one group in one round trip; returns (group id, ids in input order).

        `then` is scheduled exactly once, in the transaction that makes the last member terminal,
        whatever the members' outcomes (a group has at most one callback). With cells, a group and its
        callback live in one cell: members that would go to several raise `ValueError`.
        """
        app = self._app
        if app.registry.placement is not None:
            members, cell = plan.cell_of_group(app.registry, requests)
            return await self._cell(cell, connection).schedule_group(
                members, group_id=group_id, then=then, connection=connection
            )
        group, specs, order, callback = plan.group_specs(app, requests, group_id, then)
        await self._check_follow_up_groups(follow_up_groups(specs, callback[1]), connection)
        found = await self._run(app.store.insert_jobs(specs, callback=callback), connection)
        if plan.missing(specs, found):
            found.update(await self._insert(plan.missing(specs, found), connection))
        events = app.registry.events
        if events:
            for event in plan.scheduled_events(specs, found):
                await events.emit(event)
        return group, plan.resolve_ids(specs, order, found)

    async def _check_follow_up_groups(
        self, groups: Sequence[uuid.UUID], connection: psycopg.AsyncConnection[Any] | None
    ) -> None:
        """`then=` (a group's callback's too) naming a group that has a callback is refused before
        anything is written (one more round trip, only for follow-ups that name a group)."""
        if groups:
            refuse_follow_up_groups(await self._run(self._app.store.groups_with_callbacks(groups), connection))

    # -- reads and admin ---------------------------------------------------------------------------

    async def find(self, job_id: uuid.UUID) -> Job | None:
        """The job (with its result, error and steps), or None when no job has this id. Payloads sealed with
        a key this App holds are opened; others stay sealed (`jobbus.encryption`)."""
        if self._app.registry.placement is not None:
            holding = await self._holding(plan.as_uuid(job_id))
            return None if holding is None else holding[1]
        job = await self._run(self._app.store.find_job(plan.as_uuid(job_id)))
        if job is not None and self._app.settings.encryption_keys:
            return open_job(job, self._app.registry.keyring)
        return job

    async def wait(self, job_id: uuid.UUID, timeout: float | timedelta | None = None) -> Job:
        """The job once it is terminal (with its result, error and steps); `TimeoutError` after `timeout`.

        Woken by the notification of the transaction that finished the job, through one listening
        connection per App however many callers wait; an unknown id raises `InvalidStateError`, and so
        does a job deleted before it was read terminal (retention, prune), saying so.
        """
        if self._app.registry.placement is not None:
            producer = await self._located(job_id)
            return await producer.wait(job_id, timeout)
        job_id = plan.as_uuid(job_id)
        settings = self._app.settings
        seconds = seconds_or_none("timeout", timeout)
        deadline = plan.deadline_after(seconds)
        finished = self._finished_jobs()
        await finished.started(settings.database_wait_seconds)
        seen = notified = False
        while True:
            woken = finished.register(job_id)
            try:
                job = await self.find(job_id)
                if job is None:
                    was_woken = notified or finished.is_woken(woken)
                    raise InvalidStateError(vanished_message(job_id, seen=seen, woken=was_woken))
                if job.status.is_terminal:
                    return job
                seen = True
                left = plan.seconds_until(deadline)
                if left is not None and left <= 0:
                    raise TimeoutError(timeout_message(job_id, job.status.value, seconds or 0.0))
                if finished.polling:
                    poll = settings.poll_interval_seconds
                    left = poll if left is None else min(left, poll)
                if await finished.wait(woken, left):
                    notified = True
                elif not finished.polling:
                    raise TimeoutError(timeout_message(job_id, job.status.value, seconds or 0.0))
            finally:
                finished.unregister(job_id, woken)

    async def emit_event(self, key: str, payload: Any = None) -> bool:
        """Emit an event for `job.wait_for_event(key)`: the first emit of a key wins and is kept (later
        ones change nothing); jobs waiting for it are due at once. Returns whether this was the first.
        With cells, it is emitted in every cell (a waiting job may be in any), in cell order; True when
        it was the first in at least one."""
        placement = self._app.registry.placement
        if placement is not None:
            firsts = [await self._in_cell(cell).emit_event(key, payload) for cell in placement.names]
            return any(firsts)
        check_event_key(key)
        text = json_text("the event's payload", payload, self._app.settings.max_payload_bytes)
        return await self._run(self._app.store.emit_event(key, text))

    async def list_jobs(
        self,
        *,
        status: Sequence[str | JobStatus] | str | JobStatus | None = None,
        queue: Sequence[str] | str | None = None,
        type: Sequence[str] | str | None = None,
        group_id: uuid.UUID | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
        newest_first: bool = False,
        name: str | None = None,
        search: str | None = None,
        tag: Sequence[str] | str | None = None,
    ) -> list[Job]:
        """Jobs in creation order (the newest first with `newest_first`), filtered; pass the last id
        seen as `after` for the next page in the same order.

        `status` takes statuses and the views of queued jobs (`scheduled`, `retrying`, `waiting`);
        `name` keeps the jobs of that name, `search` those holding the text (case-insensitively) in
        their type, name, unique_key, last error or configuration; `tag` (one or several) those that
        have every tag named. With cells, every cell's jobs, merged in the same order."""
        placement = self._app.registry.placement
        if placement is not None:
            found: list[Job] = []
            for cell in placement.names:
                found.extend(
                    await self._in_cell(cell).list_jobs(
                        status=status,
                        queue=queue,
                        type=type,
                        group_id=group_id,
                        after=after,
                        limit=limit,
                        newest_first=newest_first,
                        name=name,
                        search=search,
                        tag=tag,
                    )
                )
            found.sort(key=plan.job_order, reverse=newest_first)
            return found[:limit]
        filters = plan.list_filters(status, queue, type, group_id, after, limit, newest_first, name, search, tag)
        jobs = await self._run(self._app.store.list_jobs(**filters))
        if self._app.settings.encryption_keys:
            keyring = self._app.registry.keyring
            return [open_job(job, keyring) for job in jobs]
        return jobs

    async def group_progress(self, group_id: uuid.UUID) -> GroupProgress:
        """How many members of a group are in each status (with their `total` and `completion_percentage`).
        With cells, those of the first cell (its tag's first) that has members of the group."""
        placement = self._app.registry.placement
        if placement is not None:
            progress = GroupProgress(0, 0, 0, 0, 0)
            for cell in placement.search_order(plan.as_uuid(group_id)):
                progress = await self._in_cell(cell).group_progress(group_id)
                if progress.total:
                    return progress
            return progress
        return await self._run(self._app.store.group_progress(plan.as_uuid(group_id)))

    async def cancel(self, job_id: uuid.UUID) -> JobStatus:
        """Cancel a queued job at once, ask a running one to stop; returns the status after the call."""
        if self._app.registry.placement is not None:
            producer = await self._located(job_id)
            return await producer.cancel(job_id)
        job_id = plan.as_uuid(job_id)
        audited = self._app.audit_store.audited(
            self._app.store.cancel_job(job_id), "cancel", plan.job_target(job_id), plan.cancel_effect
        )
        result = await self._run(audited)
        status = plan.cancel_status(job_id, result)
        if result.before is JobStatus.QUEUED and result.type and result.queue:
            cancelled = JobCancelled(plan.as_uuid(job_id), result.type, result.queue, JobStatus.QUEUED)
            await self._app.registry.events.emit(cancelled)
        return status

    async def retry(self, job_id: uuid.UUID, available_at: datetime | timedelta | None = None) -> None:
        """Requeue a failed job with its attempts reset; anything else raises `InvalidStateError`."""
        if self._app.registry.placement is not None:
            producer = await self._located(job_id)
            return await producer.retry(job_id, available_at)
        at, delay = resolve_available_at(available_at)
        job_id = plan.as_uuid(job_id)
        statement = self._app.audit_store.audited(
            self._app.store.retry_job(job_id, at, delay), "retry", plan.job_target(job_id), plan.done_effect
        )
        try:
            before, done = await self._run(statement, repeatable=False)
        except psycopg.errors.UniqueViolation:
            raise InvalidStateError(
                f"job {job_id} cannot be retried: another active job holds its unique_key"
            ) from None
        plan.check_retry(job_id, before, done)

    async def delete(self, job_id: uuid.UUID) -> None:
        """Remove a queued or terminal job; a running one (or an unknown id) raises `InvalidStateError`.

        A queued job is ended as cancelled before it goes, in the same transaction: its group counts it
        as done (the group's callback fires once the other members are terminal), a parent waiting for
        its children no longer waits for it, and its own `then=` follow-up is not scheduled.
        """
        if self._app.registry.placement is not None:
            producer = await self._located(job_id)
            return await producer.delete(job_id)
        job_id = plan.as_uuid(job_id)
        statement = self._app.audit_store.audited(
            self._app.store.delete_job(job_id), "delete", plan.job_target(job_id), plan.delete_effect
        )
        before = await self._run(statement, repeatable=False)
        plan.check_delete(job_id, before)

    async def run_now(self, job_id: uuid.UUID) -> None:
        """Make a queued job available at once (a delayed, retrying or parked one); anything else raises
        `InvalidStateError`. A job parked in a durable wait that is not over parks again when it runs; a
        debounced job waiting for the run of its key to end starts as soon as it ends."""
        if self._app.registry.placement is not None:
            producer = await self._located(job_id)
            return await producer.run_now(job_id)
        job_id = plan.as_uuid(job_id)
        statement = self._app.audit_store.audited(
            self._app.store.run_job_now(job_id), "run_now", plan.job_target(job_id), plan.done_effect
        )
        before, done = await self._run(statement)
        plan.check_run_now(job_id, before, done)

    async def update(
        self,
        job_id: uuid.UUID,
        *,
        priority: int | None = None,
        queue: str | None = None,
        available_at: datetime | timedelta | None = None,
        tags: Sequence[str] | None = None,
    ) -> None:
        """Change a queued job: its priority, its queue, when it becomes available (an aware datetime,
        or a timedelta from now) or its tags (replaced; `[]` removes them). An option left None is
        kept. A job that is not queued (a worker claimed it, it finished) raises `InvalidStateError`
        and is left as it is, and so does an unknown id. A move to another queue or an earlier start
        wakes the workers that can take the job."""
        if self._app.registry.placement is not None:
            producer = await self._located(job_id)
            return await producer.update(job_id, priority=priority, queue=queue, available_at=available_at, tags=tags)
        changes = plan.update_changes("update", priority, queue, available_at, tags, "tags")
        job_id = plan.as_uuid(job_id)
        statement = self._app.audit_store.audited(
            self._app.store.update_job(job_id, set_tags=tags is not None, **changes),
            "update",
            plan.job_target(job_id),
            plan.done_effect_with(plan.described_changes(priority, queue, available_at, tags, "tags")),
        )
        before, done = await self._run(statement)
        plan.check_update(job_id, before, done)

    async def update_many(
        self,
        *,
        queue: str | None = None,
        type: str | None = None,
        tag: Sequence[str] | str | None = None,
        set_priority: int | None = None,
        set_queue: str | None = None,
        set_available_at: datetime | timedelta | None = None,
        add_tags: Sequence[str] | None = None,
        on_batch: Callable[[int], object] | None = None,
    ) -> int:
        """Change every queued job that matches the filters (`queue`, `type`, `tag`: one tag or several,
        all of which a job must have; at least one filter) and return how many were changed.

        The changes are those of `update` (`add_tags` adds tags to those a job has). Jobs are changed in
        batches of `plan.UPDATE_BATCH`, each one statement and its own transaction, in id order: a job
        claimed meanwhile is left as it is and not counted, and a refused batch (a job that would
        hold more than 16 tags) leaves the batches before it written. `on_batch` is called with the
        running count after each batch.

        The audit trail gets one entry for the call, written in the transaction of its last batch with
        the total (0 when nothing matched); a refused batch records the count of the batches before it
        and the refusal, in a transaction of its own."""
        filters = plan.update_filters(queue, type, tag)
        changes = plan.update_changes("update_many", set_priority, set_queue, set_available_at, add_tags, "add_tags")
        if add_tags is not None and not changes["tags"]:
            raise InvalidJobError("update_many: add_tags must name at least one tag")
        after, total = uuid.UUID(int=0), 0
        entry = plan.update_many_entry(self._app, queue, type, tag, set_priority, set_queue, set_available_at, add_tags)
        while True:
            batch = self._app.store.update_jobs(
                after=after,
                limit=plan.UPDATE_BATCH,
                queue=filters["queue"],
                type=filters["type"],
                tags=filters["tags"],
                set_priority=changes["priority"],
                set_queue=changes["queue"],
                available_at=changes["available_at"],
                delay_seconds=changes["delay_seconds"],
                add_tags=changes["tags"],
            )
            try:
                last, chosen, changed = await self._run(entry.last_batch(batch, total))
            except psycopg.errors.InvalidParameterValue as exc:
                refusal = f"update_many: {exc.diag.message_primary or exc}"
                if total:
                    await self._run(entry.refused(total, refusal))
                raise InvalidJobError(refusal) from None
            total += changed
            if on_batch is not None:
                on_batch(total)
            if last is None or chosen < plan.UPDATE_BATCH:
                return total
            after = last

    async def prune(
        self, older_than: timedelta, statuses: Sequence[str | JobStatus] = ("completed", "cancelled")
    ) -> int:
        """Delete finished jobs older than `older_than` (in batches); returns how many. With cells, in
        every cell, in cell order."""
        placement = self._app.registry.placement
        if placement is not None:
            return sum([await self._in_cell(cell).prune(older_than, statuses) for cell in placement.names])
        params = plan.prune_params(older_than, statuses)
        total = 0
        while True:
            deleted = await self._run(self._app.store.prune_jobs(**params))
            total += deleted
            if deleted < params["limit"]:
                return total

    # -- queues: flow control ----------------------------------------------------------------------

    async def set_queue(
        self,
        queue: str,
        *,
        concurrency: int | Keep | None = KEEP,
        concurrency_per_key: int | Keep | None = KEEP,
        rate_limit: RateLimit | Keep | None = KEEP,
        rate_limit_per_key: RateLimit | Keep | None = KEEP,
    ) -> QueueSettings:
        """Store a queue's limits, fleet-wide and durable; None removes one, an omitted one is kept.

        `concurrency`: at most that many of its jobs hold a valid lease at any instant;
        `concurrency_per_key`: the same per `concurrency_key` (1 serialises a key); `rate_limit` and
        `rate_limit_per_key`: at most `count` jobs started in any rolling `per` window. Running workers
        apply changes within one poll interval.
        """
        statement = plan.set_queue_statement(
            self._app, queue, concurrency, concurrency_per_key, rate_limit, rate_limit_per_key
        )
        await self._run(statement)
        return await self.get_queue(queue)

    async def consume(self, queue: str, units: int, *, key: str | None = None) -> bool:
        """Spend `units` of `queue`'s rate limit now, outside any job (the tokens an LLM call reported,
        say), and of `key`'s `rate_limit_per_key` when a key is given: they count in the rolling windows
        as starts of jobs of that weight do, so claims of the queue wait until the windows have room
        again. A spend may take a window past its count (it reports what was used); it never fails for
        that. Returns False, writing nothing, when no rate limit of the queue counts the spend (none is
        set, or only a per-key one and no key is given). Safe to repeat after a lost connection: the
        call's id is recorded with it, so a repeat spends nothing twice.
        """
        statement = plan.consume_statement(self._app, queue, units, key)
        return await self._run(statement)

    async def get_queue(self, queue: str) -> QueueSettings:
        """The limits of a queue (a queue without limits has them all None)."""
        statement = self._app.queue_store.list_settings(validate_text("queue", queue, MAX_TYPE_BYTES))
        found = await self._run(statement)
        return found[0] if found else QueueSettings(queue)

    async def list_queues(self) -> list[QueueSettings]:
        """Every queue that has limits."""
        return await self._run(self._app.queue_store.list_settings())

    async def queue_usage(self) -> dict[str, tuple[int, int | None]]:
        """Per queue with limits: jobs holding a valid lease now, and jobs started in its rate window (or
        None without a rate limit), each job counted by its weight and each `consume` by its units."""
        return await self._run(self._app.queue_store.usage())

    # -- periodic jobs -----------------------------------------------------------------------------

    async def add_periodic(self, name: str, *, type: str, **options: Unpack[PeriodicOptions]) -> Periodic:
        """Add (or redefine) a periodic job at run time, stored in the database; it survives restarts
        (the options are those of `App.periodic`)."""
        app = self._app
        spec = app.registry.periodic_spec(name, type, **options)
        now = await self._run(app.periodic_store.database_now())
        statement = app.audit_store.audited(
            app.periodic_store.upsert(spec, source="runtime", next_run_at=spec.schedule.next_after(now)),
            "add_periodic",
            plan.periodic_target(name),
            plan.periodic_effect(spec),
        )
        if not await self._run(statement):
            raise InvalidStateError(f"periodic job {name!r} is declared in code: change it there, or pick another name")
        (found,) = await self._run(app.periodic_store.list_periodic(name))
        return found

    async def remove_periodic(self, name: str) -> None:
        """Delete a periodic job (one declared in code comes back when a worker of that code starts)."""
        statement = self._app.audit_store.audited(
            self._app.periodic_store.remove(name), "remove_periodic", plan.periodic_target(name), plan.true_effect
        )
        if not await self._run(statement):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    async def pause_periodic(self, name: str) -> None:
        """Stop enqueuing its ticks until `resume_periodic`; durable, also across redefinitions."""
        statement = self._app.audit_store.audited(
            self._app.periodic_store.set_enabled(name, False),
            "pause_periodic",
            plan.periodic_target(name),
            plan.true_effect,
        )
        if not await self._run(statement):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    async def resume_periodic(self, name: str) -> None:
        """Enqueue its ticks again after `pause_periodic`."""
        statement = self._app.audit_store.audited(
            self._app.periodic_store.set_enabled(name, True),
            "resume_periodic",
            plan.periodic_target(name),
            plan.true_effect,
        )
        if not await self._run(statement):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    async def list_periodic(self) -> list[Periodic]:
        """Every stored periodic job, declared in code or added at run time."""
        return await self._run(self._app.periodic_store.list_periodic())

    async def run_periodic(self, name: str) -> uuid.UUID:
        """Enqueue one job of a periodic job now, beside its schedule; returns its id."""
        app = self._app
        job_type = await self._run(app.periodic_store.periodic_type(name))
        if job_type is None:
            raise InvalidStateError(f"no periodic job is named {name!r}")
        job_id = new_job_id()
        statement = app.audit_store.audited(
            app.periodic_store.run_now(name, job_id=job_id, max_attempts=app.registry.max_attempts_of(job_type)),
            "run_periodic",
            plan.periodic_target(name),
            lambda done: {"job_id": str(job_id)} if done else None,
        )
        if not await self._run(statement, repeatable=False):
            raise InvalidStateError(f"no periodic job is named {name!r}")
        return job_id

    # -- the audit trail ---------------------------------------------------------------------------

    async def list_audit(
        self, *, since: datetime | timedelta | None = None, after: AuditEntry | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        """Entries of the audit trail, newest first: those from `since` on (an aware datetime, or a
        timedelta before now), after the entry `after` (the last of the page before), at most `limit`."""
        start, before = plan.audit_window(since, after, limit)
        return await self._run(self._app.audit_store.entries(since=start, before=before, limit=limit))

    # -- schema ------------------------------------------------------------------------------------

    async def migrate(self) -> list[schema_module.Migration]:
        """Apply pending migrations (advisory-locked, idempotent); returns those applied. With cells, in
        every cell, in cell order (the same migration appears once per cell that applied it)."""
        placement = self._app.registry.placement
        if placement is not None:
            applied: list[schema_module.Migration] = []
            for cell in placement.names:
                applied.extend(await self._in_cell(cell).migrate())
            return applied
        return await self._migrate()

    async def check_schema(self) -> int:
        """Raise `SchemaError` unless the schema is current; returns its version. With cells, every cell's
        schema is checked."""
        placement = self._app.registry.placement
        if placement is not None:
            versions = [await self._in_cell(cell).check_schema() for cell in placement.names]
            return versions[0]
        try:
            server, version = await self._execute(self._app.store.schema_version(), None, True)
        except psycopg.errors.UndefinedTable:
            # Too old a server is named before a missing schema: `jobbus migrate` would refuse it too.
            server, version = await self._execute(self._app.store.server_version(), None, True), 0
        schema_module.check_server(server)
        schema_module.check_version(self._app.settings.schema, version)
        return version
