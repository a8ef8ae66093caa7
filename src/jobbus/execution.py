"""What a handler sees: `JobExecution` (async handlers) and `SyncJobExecution` (sync handlers).

Every write is fenced by the attempt's lease token: once the lease is gone (expired, re-claimed, or
released at shutdown) the write is rejected and `LeaseLostError` is raised.

Why the worker wants an attempt to stop lives in one place, `AttemptSignals`: the worker sets reasons
on it, the handler reads them through `cancellation_requested` and `lease_lost`.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import hashlib
import inspect
import json
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Generic, TypeVar, Unpack, overload

from jobbus.encryption import SEALED_PREFIX, Keyring, MissingKeyError, open_job, sealed_key_id
from jobbus.errors import LeaseLostError
from jobbus.joblog import JOB_LOGGER, AttemptLog
from jobbus.models import ClaimedJob, Job, JobSpec
from jobbus.requests import (
    JobOptions,
    JobRequest,
    configuration_json,
    follow_up_groups,
    json_text,
    refuse_follow_up_groups,
    sealed_within,
    spec_json,
)
from jobbus.store import JobStore, Statement
from jobbus.store.jobs import raise_group_refusal

T = TypeVar("T")
Runner = Callable[[Statement[Any]], Awaitable[Any]]


class StopReason(enum.Enum):
    """Why an attempt should stop before its handler is done."""

    #: `cancel()` was called: the attempt ends as `cancelled`, whatever the handler does next.
    CANCELLED = "cancelled"
    #: The worker is shutting down: a handler that saw this and returned gives the job back.
    SHUTDOWN = "shutdown"
    #: The attempt ran past its timeout: it fails (and is retried) with "timed out".
    TIMEOUT = "timed out"
    #: The worker could not reach the database for long enough that the job may be recovered by
    #: another worker at any moment: nothing the handler does is written; the job is given up.
    FENCED = "fenced"
    #: The lease expired or was taken over: nothing more of this attempt is written.
    LEASE_LOST = "lease lost"


_LOSING = frozenset({StopReason.FENCED, StopReason.LEASE_LOST})
_NO_REASON: frozenset[StopReason] = frozenset()
_CANCELLED = frozenset({StopReason.CANCELLED})


class AttemptSignals:
    """The stop reasons of one attempt: set by the worker, read by the handler.

    Plain attribute updates under the GIL, so a sync handler's thread reads them safely.
    """

    __slots__ = ("_closed", "_observed", "_reasons")

    def __init__(self, *, cancelled: bool = False) -> None:
        self._reasons = _CANCELLED if cancelled else _NO_REASON
        self._observed = False
        self._closed = False

    def request(self, reason: StopReason) -> bool:
        """Add a reason; returns True if it is new."""
        if reason in self._reasons:
            return False
        self._reasons = self._reasons | {reason}
        return True

    def __contains__(self, reason: StopReason) -> bool:
        return reason in self._reasons

    @property
    def reasons(self) -> frozenset[StopReason]:
        return self._reasons

    @property
    def requested(self) -> bool:
        return bool(self._reasons)

    def observe(self) -> bool:
        """What the handler reads: remembers that it saw a stop request (so returning then means it stopped)."""
        if self._reasons:
            self._observed = True
            return True
        return False

    @property
    def observed(self) -> bool:
        return self._observed

    @property
    def lease_lost(self) -> bool:
        return not self._reasons.isdisjoint(_LOSING)

    def close(self) -> None:
        """The attempt is over: later fenced writes are refused without asking the database."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


class JobParked(BaseException):
    """Raised by a durable wait that parked the job (lease given back, queued until its wake-up).

    A `BaseException`, so that a handler's ``except Exception`` does not swallow it: the handler must
    let it through; the worker then writes nothing more for the attempt, which does not count.
    """


class JobExecution:
    """One attempt of one job, as its async handler sees it."""

    __slots__ = (
        "_build",
        "_children_waits",
        "_claimed",
        "_configuration",
        "_execution_data",
        "_keyring",
        "_lease_seconds",
        "_log",
        "_max_payload_bytes",
        "_run",
        "_signals",
        "_spawned",
        "_steps",
        "_store",
        "scope",
    )

    def __init__(
        self,
        claimed: ClaimedJob,
        store: JobStore,
        run: Runner,
        lease_seconds: float,
        max_payload_bytes: int,
        signals: AttemptSignals | None = None,
        build: Callable[[JobRequest], JobSpec] | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self._claimed = claimed
        self._keyring = keyring
        self._build = build
        self._max_payload_bytes = max_payload_bytes
        self._store = store
        self._run = run
        self._lease_seconds = lease_seconds
        # Both are the claim's own dicts, decoded for this attempt only: the checkpoint is replaced, never
        # changed in place, and the configuration is only ever read through the proxy.
        self._execution_data: dict[str, Any] = claimed.execution_data
        self._configuration = MappingProxyType(claimed.configuration_data or {})
        self._signals = signals if signals is not None else AttemptSignals(cancelled=claimed.cancellation_requested)
        self.scope: Any = None
        #: Stored step results, read at the first `step` of the attempt.
        self._steps: dict[str, Any] | None = None
        #: `spawn` calls so far in this run of the handler, per spawned (type, configuration).
        self._spawned: dict[str, int] = {}
        #: `wait_for_children` calls so far in this run of the handler.
        self._children_waits = 0
        #: What the handler logged, made at its first line (`_attempt_log`); the worker reads it once the
        #: attempt is decided, to store it with the outcome.
        self._log: AttemptLog | None = None

    def open_payloads(self) -> None:
        """Open the claimed configuration and checkpoint where they are sealed (`jobbus.encryption`), before
        the handler runs: `MissingKeyError` names a key this worker does not hold, and nothing is written."""
        claimed = self._claimed
        configuration, data = claimed.configuration_data, claimed.execution_data
        self._configuration = MappingProxyType(self._open(configuration, "configuration", "configuration") or {})
        self._execution_data = self._open(data, "execution", "execution data")

    def _open(self, value: Any, field: str, what: str) -> Any:
        kid = sealed_key_id(value)
        if kid is None:
            return value
        if self._keyring is None:
            raise MissingKeyError(kid, f"the {what} of job {self.id}")
        return self._keyring.open(value, field, self.id, self.type, f"the {what} of job {self.id}")

    def _sealed(self, text: str, field: str, what: str) -> str:
        """`text` sealed with the newest key (this worker has keys); bounded by max_payload_bytes as stored."""
        assert self._keyring is not None
        return sealed_within(what, self._keyring.seal_text(text, field, self.id), len(text), self._max_payload_bytes)

    # -- identity ----------------------------------------------------------------------------------
    @property
    def id(self) -> uuid.UUID:
        return self._claimed.id

    @property
    def type(self) -> str:
        return self._claimed.type

    @property
    def queue(self) -> str:
        return self._claimed.queue

    @property
    def name(self) -> str | None:
        return self._claimed.name

    @property
    def group_id(self) -> uuid.UUID | None:
        return self._claimed.group_id

    @property
    def attempt(self) -> int:
        """1-based number of this attempt."""
        return self._claimed.attempts

    @property
    def max_attempts(self) -> int:
        return self._claimed.max_attempts

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose lines are kept with this attempt in its `Job.history` entry (`logs`), also from
        a batch handler or a task the handler started, and go to the application's handlers as every
        record does (the `jobbus.job` logger; its level decides what is logged)."""
        return JobLogger(self)

    def _attempt_log(self) -> AttemptLog:
        """Where this attempt's lines are kept, made at its first one."""
        log = self._log
        if log is None:
            with _MAKING_LOG:  # a sync handler's thread and a task it started on the loop may race
                log = self._log
                if log is None:
                    log = self._log = AttemptLog()
        return log

    @property
    def lease_token(self) -> uuid.UUID:
        return self._claimed.lease_token

    @property
    def created_at(self) -> datetime:
        """When the job was scheduled (database clock)."""
        return self._claimed.created_at

    @property
    def available_at(self) -> datetime:
        """When the job became available to run: `created_at` or its delay, or the last retry's backoff."""
        return self._claimed.available_at

    @property
    def configuration(self) -> Mapping[str, Any]:
        """The job's input, read-only: configuration never changes after scheduling."""
        return self._configuration

    @property
    def execution_data(self) -> dict[str, Any]:
        """The latest checkpoint (a copy: change it through `checkpoint`)."""
        return dict(self._execution_data)

    # -- cancellation ------------------------------------------------------------------------------
    @property
    def cancellation_requested(self) -> bool:
        """True once the job was cancelled, the worker is stopping, the attempt timed out, or the lease
        is lost. Return (or raise) soon: what happens next depends on why (docs/worker.md)."""
        return self._signals.observe()

    @property
    def lease_lost(self) -> bool:
        """True once this attempt can no longer write anything: another attempt may own the job."""
        return self._signals.lease_lost

    # -- fenced writes -----------------------------------------------------------------------------
    def _refuse(self, what: str) -> LeaseLostError:
        if self._signals.closed and not self._signals.lease_lost:
            return LeaseLostError(f"job {self.id}: {what} rejected, attempt {self.attempt} is over")
        return LeaseLostError(f"job {self.id}: {what} rejected, the lease of attempt {self.attempt} is lost")

    def check_open(self, what: str) -> None:
        """Raise `LeaseLostError` once the attempt is over (its handler returned or parked, or its lease
        is lost): a leaked task, or a handler that swallowed `JobParked`, runs nothing more."""
        if self._signals.lease_lost or self._signals.closed:
            raise self._refuse(what)

    async def _fenced(self, statement: Statement[bool | None], what: str) -> None:
        self.check_open(what)
        flag = await self._run(statement)
        if flag is None:
            self._signals.request(StopReason.LEASE_LOST)
            raise self._refuse(what)
        if flag:
            self._signals.request(StopReason.CANCELLED)

    async def checkpoint(self, data: Mapping[str, Any]) -> None:
        """Replace the checkpoint with `data` (a JSON object); durable when this returns."""
        if not isinstance(data, Mapping):
            raise TypeError(f"checkpoint data must be a JSON object (a dict), got {type(data).__name__}")
        text = json_text("checkpoint data", dict(data), self._max_payload_bytes)
        if self._keyring is not None:
            text = self._sealed(text, "execution", "checkpoint data")
        await self._fenced(self._store.checkpoint_job(self.id, self.lease_token, text), "checkpoint")
        self._execution_data = dict(data)

    async def progress(self, current: float, total: float | None = None) -> None:
        """Record progress beside the checkpoint (not inside it)."""
        for value in (current, total):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise TypeError(f"progress values must be numbers, got {value!r}")
        statement = self._store.progress_job(self.id, self.lease_token, float(current), _opt_float(total))
        await self._fenced(statement, "progress")

    async def heartbeat(self) -> None:
        """Extend the lease now (the worker also does this for every job in the background)."""
        statement = self._store.heartbeat_job(self.id, self.lease_token, self._lease_seconds)
        await self._fenced(statement, "heartbeat")

    # -- durable steps -----------------------------------------------------------------------------

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` (async, or sync in a thread) once and keep its JSON result under `name`.

        A later attempt of the job gets the stored result back without calling `fn`. The result is
        stored only while this attempt holds the lease (else `LeaseLostError`); a worker that dies
        after `fn` ran but before its result was stored runs it again in the next attempt
        (at-least-once, like the job itself). Called once the attempt is over, it raises
        `LeaseLostError` before calling `fn`.
        """
        self.check_open(f"step {name!r}")
        found, result = await self.stored_step(check_step_name(name, user=True))
        if found:
            return result
        self.check_open(f"step {name!r}")
        if inspect.iscoroutinefunction(fn):
            value = await fn(*args)
        else:
            value = await asyncio.to_thread(fn, *args)
            if inspect.isawaitable(value):
                value = await value
        return await self.store_step(name, value)

    def _opened_steps(self, steps: dict[str, Any]) -> dict[str, Any]:
        for name, value in steps.items():
            if sealed_key_id(value) is not None:
                steps[name] = self._open(value, f"step:{name}", f"result of step {name!r}")
        return steps

    async def stored_step(self, name: str) -> tuple[bool, Any]:
        """(True, result) if a step of this name is stored (by any attempt), else (False, None)."""
        check_step_name(name)
        if self._steps is None:
            self._steps = self._opened_steps(await self._run(self._store.job_steps(self.id)))
        if name in self._steps:
            return True, self._steps[name]
        return False, None

    # -- durable waits ------------------------------------------------------------------------------

    def _logs_so_far(self) -> str | None:
        """What the attempt logged so far, for a durable wait that may park it (and so end it)."""
        return None if self._log is None else self._log.stored(close=False)

    def _parked(self, what: str) -> JobParked:
        self._signals.close()
        return JobParked(f"job {self.id} waits for {what}")

    async def sleep(self, name: str, delay: float | timedelta) -> None:
        """Sleep durably: the first call stores the wake-up time (database clock) under `name` and
        parks the job (its slot and lease given back, the attempt not counted); the handler runs again
        from the top once it is due, and then this returns at once."""
        check_step_name(name, user=True)
        seconds = wait_seconds("delay", delay)
        self.check_open(f"sleep {name!r}")
        step = f"sleep:{name}"
        statement = self._store.sleep_job(self.id, self.lease_token, step, seconds, self._logs_so_far())
        await self._wait(statement, f"sleep {name!r}", step)

    async def wait_for_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """The payload of the first `app.emit_event(key, ...)`, emitted before or after this call; parks
        the job until then (or until `timeout`, counted from the first call, then `TimeoutError`)."""
        check_event_key(key)
        self.check_open(f"event {key!r}")
        step = f"event:{key}"
        found, stored = await self.stored_step(step)
        if not found or not isinstance(stored, dict) or not ({"payload", "timed_out"} & stored.keys()):
            timeout_seconds = None if timeout is None else wait_seconds("timeout", timeout)
            statement = self._store.wait_for_event(
                self.id, self.lease_token, key, step, timeout_seconds, self._logs_so_far()
            )
            _, stored = await self._wait(statement, f"event {key!r}", f"event {key}")
            assert self._steps is not None
            self._steps[step] = stored
        if "timed_out" in stored:
            raise TimeoutError(f"job {self.id}: no event {key!r} before the wait's timeout")
        return stored["payload"]

    async def spawn(
        self, type: str, configuration: Mapping[str, Any] | None = None, **options: Unpack[JobOptions]
    ) -> uuid.UUID:
        """Schedule a child job (its `parent_id` is this job's id) once; returns its id. The k-th spawn
        of one (type, configuration) in a run of the handler is the same child in every run. A `group_id`
        of a group that has a callback, for the child or a `then=` follow-up of it, raises
        `InvalidStateError` (nothing is written)."""
        if self._build is None:
            raise RuntimeError("spawn needs the App's handlers: run the job in a jobbus worker")
        if options.get("unique_key") is not None:
            raise ValueError("spawn: a child cannot have a unique_key (it would not be scheduled if taken)")
        spec = self._build(JobRequest(type, configuration, **options))
        self.check_open("spawn")
        then_groups = follow_up_groups([spec])
        if then_groups:  # a follow-up cannot join a group that has a callback, as with `schedule`
            refuse_follow_up_groups(await self._run(self._store.groups_with_callbacks(then_groups)))
        # Keyed by what is spawned, not by position: a deploy that adds or removes other spawns does not
        # hand this call another call's child. The k-th identical spawn of a run is the k-th child.
        # The clear configuration: a sealed one differs in every run (a fresh nonce each time).
        clear = (
            configuration_json(configuration) if spec.configuration.startswith(SEALED_PREFIX) else spec.configuration
        )
        what = hashlib.sha256(f"{spec.type}\x00{clear}".encode()).hexdigest()[:16]
        self._spawned[what] = count = self._spawned.get(what, 0) + 1
        step = f"spawn:{spec.type[:200]}:{what}:{count}"
        found, stored = await self.stored_step(step)
        if found:
            return uuid.UUID(str(stored))
        try:
            state, child = await self._run(self._store.spawn_child(self.id, self.lease_token, step, spec_json(spec)))
        except Exception as exc:
            raise_group_refusal(exc)  # a child cannot join a group that has a callback
            raise
        self._after_wait(state, "spawn")
        assert child is not None and self._steps is not None
        self._steps[step] = str(child)
        return uuid.UUID(str(child))

    async def wait_for_children(self) -> list[Job]:
        """The terminal `Job`s of every child once none is queued or running; parks the job until then.

        The answer is kept with the job when the wait resolves: the k-th call of every later run of the
        handler returns the same children (ids, statuses, results), also after retention deleted them.
        """
        self.check_open("wait for its children")
        index = self._children_waits
        self._children_waits += 1
        statement = self._store.wait_for_children(self.id, self.lease_token, self._logs_so_far())
        await self._wait(statement, "its children", "children")
        taken: tuple[str, list[Job]] = await self._run(self._store.children_snapshot(self.id, self.lease_token, index))
        self._after_wait(taken[0], "its children")
        return [open_job(child, self._keyring, strict=True) for child in taken[1]]

    async def _wait(self, statement: Statement[Any], what: str, waiting_for: str) -> Any:
        """Run a durable wait's statement: its answer, once 'parked' is raised as `JobParked` and 'lost'
        as `LeaseLostError`. A wait that parked the job but whose answer was lost with its connection
        is run again by the worker and finds the lease given back: the job's history then shows that
        this attempt parked it at this wait, and the handler is told it parked, as it would have been."""
        try:
            answer = await self._run(statement)
        except LeaseLostError:
            if await self._parked_at(waiting_for):
                raise self._parked(what) from None
            raise
        state = answer if isinstance(answer, str) else answer[0]
        if state == "lost" and await self._parked_at(waiting_for):
            state = "parked"
        self._after_wait(state, what)
        return answer

    async def _parked_at(self, waiting_for: str) -> bool:
        """Whether this attempt parked the job at `waiting_for` (False when that cannot be read)."""
        statement = self._store.parked_at(self.id, self.lease_token, self.attempt, waiting_for)
        try:
            return bool(await self._run(statement))
        except Exception:  # the database is away or the lease is surely gone: the lease counts as lost
            return False

    def _after_wait(self, state: str, what: str) -> None:
        if state == "lost":
            self._signals.request(StopReason.LEASE_LOST)
            raise self._refuse(what)
        if state == "parked":
            raise self._parked(what)

    async def store_step(self, name: str, value: Any) -> Any:
        """Store a step's result, fenced by the lease; returns the result as later attempts will see it."""
        text = json_text(f"the result of step {name!r}", value, self._max_payload_bytes)
        sealed = text if self._keyring is None else self._sealed(text, f"step:{name}", f"the result of step {name!r}")
        self.check_open(f"step {name!r}")
        held, stored = await self._run(self._store.record_step(self.id, self.lease_token, name, sealed))
        if not held:
            self._signals.request(StopReason.LEASE_LOST)
            raise self._refuse(f"step {name!r}")
        if not stored:  # stored meanwhile by this same attempt (two calls of one name at once): keep that
            self._steps = self._opened_steps(await self._run(self._store.job_steps(self.id)))
            return self._steps.get(name)
        result = json.loads(text)
        assert self._steps is not None
        self._steps[name] = result
        return result


class SyncJobExecution:
    """The same attempt for a sync handler running in a worker thread: the methods block."""

    def __init__(self, execution: JobExecution, loop: asyncio.AbstractEventLoop) -> None:
        self._execution = execution
        self._loop = loop

    @property
    def id(self) -> uuid.UUID:
        return self._execution.id

    @property
    def type(self) -> str:
        return self._execution.type

    @property
    def queue(self) -> str:
        return self._execution.queue

    @property
    def name(self) -> str | None:
        return self._execution.name

    @property
    def group_id(self) -> uuid.UUID | None:
        return self._execution.group_id

    @property
    def attempt(self) -> int:
        return self._execution.attempt

    @property
    def max_attempts(self) -> int:
        return self._execution.max_attempts

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """See `JobExecution.logger`: its lines are kept with this attempt."""
        return self._execution.logger

    @property
    def created_at(self) -> datetime:
        return self._execution.created_at

    @property
    def available_at(self) -> datetime:
        return self._execution.available_at

    @property
    def scope(self) -> Any:
        return self._execution.scope

    @property
    def cancellation_requested(self) -> bool:
        return self._execution.cancellation_requested

    @property
    def lease_lost(self) -> bool:
        return self._execution.lease_lost

    @property
    def execution_data(self) -> dict[str, Any]:
        return self._execution.execution_data

    @property
    def configuration(self) -> Mapping[str, Any]:
        return self._execution.configuration

    def _wait(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run one of the attempt's calls on the worker's loop and wait for it. Once the attempt is over
        `LeaseLostError`, before anything is started: a thread that outlived its worker finds no loop."""
        self._execution.check_open(what)
        return asyncio.run_coroutine_threadsafe(_as_coroutine(call()), self._loop).result()

    def checkpoint(self, data: Mapping[str, Any]) -> None:
        self._wait("checkpoint", lambda: self._execution.checkpoint(data))

    def progress(self, current: float, total: float | None = None) -> None:
        self._wait("progress", lambda: self._execution.progress(current, total))

    def heartbeat(self) -> None:
        self._wait("heartbeat", self._execution.heartbeat)

    def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """The blocking twin of `JobExecution.step`: `fn` runs in this thread, once."""
        execution = self._execution
        what = f"step {name!r}"
        found, result = self._wait(what, lambda: execution.stored_step(check_step_name(name, user=True)))
        if found:
            return result
        execution.check_open(what)
        value = fn(*args)
        return self._wait(what, lambda: execution.store_step(name, value))

    def sleep(self, name: str, delay: float | timedelta) -> None:
        self._wait(f"sleep {name!r}", lambda: self._execution.sleep(name, delay))

    def wait_for_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        return self._wait(f"event {key!r}", lambda: self._execution.wait_for_event(key, timeout))

    def spawn(
        self, type: str, configuration: Mapping[str, Any] | None = None, **options: Unpack[JobOptions]
    ) -> uuid.UUID:
        return self._wait("spawn", lambda: self._execution.spawn(type, configuration, **options))

    def wait_for_children(self) -> list[Job]:
        return self._wait("wait for its children", self._execution.wait_for_children)


#: Step names (and sleep names) are text of 1 to 200 characters: stored with a prefix for sleeps, events
#: and spawns, they stay within the 255 of the table's CHECK.
MAX_STEP_NAME = 200
#: Names that sleeps, event waits and spawns store their state under: not for `step`.
RESERVED_PREFIXES = ("sleep:", "event:", "spawn:")


#: The jobs of a batch: `JobExecution` for an async batch handler, `SyncJobExecution` for a sync one.
E = TypeVar("E", JobExecution, SyncJobExecution)


class JobBatch(Sequence[E], Generic[E]):
    """The jobs a batch handler (`App.job(type, batch_size=N)`) is called with: up to N jobs of its type
    claimed together, in claim order, each one attempt with its own lease, heartbeat, cancellation,
    timeout and retries. The handler returns None (every job completes), a list of one item per job
    in this order (each job completes with its item as result, or fails alone when its item is an
    `Exception`), or raises (every job fails, one attempt each)."""

    __slots__ = ("_jobs",)

    def __init__(self, jobs: Iterable[E]) -> None:
        self._jobs: tuple[E, ...] = tuple(jobs)

    @overload
    def __getitem__(self, index: int) -> E: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[E]: ...

    def __getitem__(self, index: int | slice) -> E | Sequence[E]:
        return self._jobs[index]

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[E]:
        return iter(self._jobs)

    def __repr__(self) -> str:
        return f"<jobbus.JobBatch of {len(self._jobs)} job(s)>"

    @property
    def configurations(self) -> list[Mapping[str, Any]]:
        """Each job's input (`configuration`), in batch order."""
        return [job.configuration for job in self._jobs]


#: The longest durable wait: a hundred years (a wake-up time must stay a date Python can read back).
MAX_WAIT_SECONDS = 100 * 365 * 86400.0


def wait_seconds(what: str, value: float | timedelta) -> float:
    """Seconds of a durable wait: a non-negative number or timedelta."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_WAIT_SECONDS:
        raise ValueError(f"{what} must be seconds (or a timedelta) from 0 to a hundred years, got {value!r}")
    return float(seconds)


#: Event keys are text of 1 to 200 characters (a wait stores its outcome under `event:<key>`).
MAX_EVENT_KEY = 200


def check_event_key(key: str) -> None:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_EVENT_KEY or "\x00" in key:
        raise ValueError(f"an event key must be text of 1 to {MAX_EVENT_KEY} characters, got {key!r:.80}")


def check_step_name(name: str, *, user: bool = False) -> str:
    """`name` if it can name a step; `user`: a name a handler chose (not one of the reserved prefixes)."""
    limit = MAX_STEP_NAME if user else 255
    if not isinstance(name, str) or not 1 <= len(name) <= limit or "\x00" in name:
        raise ValueError(f"a step name must be text of 1 to {limit} characters, got {name!r:.80}")
    if user and name.startswith(RESERVED_PREFIXES):
        raise ValueError(f"step name {name!r:.80}: names starting with {', '.join(RESERVED_PREFIXES)} are reserved")
    return name


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


# -- the running job ------------------------------------------------------------------------------

#: The attempt whose handler is running in this context: each job runs in its own asyncio task (async
#: handlers) or has its thread's context set for the call (sync handlers), so concurrent jobs never see
#: each other's.
_CURRENT: contextvars.ContextVar[JobExecution | SyncJobExecution] = contextvars.ContextVar("jobbus_current_job")


def current_job() -> JobExecution:
    """The `JobExecution` of the async handler (or typed task) running now, from any code it calls.

    Raises `RuntimeError` outside a job, and in a sync handler, which has `current_sync_job()`.
    """
    job = _CURRENT.get(None)
    if isinstance(job, JobExecution):
        return job
    if job is None:
        raise RuntimeError("current_job() is called outside a job: only code run by a worker's handler has one")
    raise RuntimeError("current_job() is called in a sync handler: use jobbus.current_sync_job(), its blocking twin")


def current_sync_job() -> SyncJobExecution:
    """The `SyncJobExecution` of the sync handler (or typed task) running now; see `current_job()`."""
    job = _CURRENT.get(None)
    if isinstance(job, SyncJobExecution):
        return job
    if job is None:
        raise RuntimeError("current_sync_job() is called outside a job: only code run by a worker's handler has one")
    raise RuntimeError("current_sync_job() is called in an async handler: use jobbus.current_job()")


#: The jobs of the batch handler's call running in this context: what is logged there, other than
#: through one job's `logger`, is kept with each of them.
_BATCH: contextvars.ContextVar[Sequence[JobExecution]] = contextvars.ContextVar("jobbus_current_batch")
_MAKING_LOG = threading.Lock()


def logging_attempts() -> Sequence[JobExecution]:
    """The attempts whose log a record made in this context belongs to: the running job's (its
    handler's task or thread, or a task it started), every job of a running batch call, or none."""
    job = _CURRENT.get(None)
    if job is not None:
        return (job._execution if isinstance(job, SyncJobExecution) else job,)
    return _BATCH.get(())


def enter_batch(jobs: Sequence[JobExecution]) -> contextvars.Token[Sequence[JobExecution]]:
    """Make `jobs` the running batch call's in this context (the worker's batch call)."""
    return _BATCH.set(jobs)


def leave_batch(token: contextvars.Token[Sequence[JobExecution]]) -> None:
    _BATCH.reset(token)


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """`job.logger`: the `jobbus.job` logger whose records name their attempt (`job_id`, `job_type`,
    `attempt`), so that they are kept with it wherever they are logged from. The caller's `extra` is
    kept beside."""

    def __init__(self, job: JobExecution) -> None:
        super().__init__(logging.getLogger(JOB_LOGGER), {"job_id": str(job.id), "job_type": job.type})
        self._job = job

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        job = self._job
        extra = dict(kwargs.get("extra") or ())
        extra.update(job_id=str(job.id), job_type=job.type, attempt=job.attempt, jobbus_attempt=job)
        kwargs["extra"] = extra
        return msg, kwargs


def enter_job(job: JobExecution | SyncJobExecution) -> contextvars.Token[JobExecution | SyncJobExecution]:
    """Make `job` the current one in this context (the worker's executor, and `drain`)."""
    return _CURRENT.set(job)


def leave_job(token: contextvars.Token[JobExecution | SyncJobExecution]) -> None:
    _CURRENT.reset(token)
