"""`MessageBus`: messages under stable wire names, inline and queued bindings, and dispatch.

`dispatch` first validates everything, builds every job it will write and proves that the payload
decodes back into an equal message; only then does it run the message's inline bindings, in
registration order, and insert one job per queued binding in a single round trip (inside the
caller's transaction when `connection=` is given). A bad dispatch has no effect.

Each queued binding is its own job type, `binding_job_type(name)` (``jobbus.message:<binding name>``),
registered on the App as an ordinary handler: sync for a sync binding (it runs in the worker's
threads, within `concurrency`), async for an async one. A worker therefore claims only the bus jobs
whose binding it has, and runs exactly that binding, never dispatching again. Jobs of the single type
`BUS_JOB_TYPE` that earlier releases wrote still run, through a compatibility handler.

`bus.sync` is the blocking twin for Django, Flask and scripts. Both front-ends share one planning step
(`MessageBus._plan`) and differ only in how they run inline handlers and which insert they call.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from jobbus import encoding
from jobbus.bus.codecs import Codec, CodecError, JsonCodec, is_typeddict
from jobbus.bus.envelope import CORRELATION_ID, DEFAULT_CODEC, Envelope, EnvelopeError, correlation_scope, make_headers
from jobbus.durations import resolve_available_at
from jobbus.encoding import EncodingError
from jobbus.errors import InvalidJobError
from jobbus.execution import JobExecution, SyncJobExecution
from jobbus.models import JobSpec
from jobbus.requests import JobRequest

if TYPE_CHECKING:
    from jobbus.app import App

logger = logging.getLogger("jobbus.bus")

#: The job type that all queued bindings shared before each got its own; workers still run jobs stored under it.
BUS_JOB_TYPE = "jobbus.message"
JOB_TYPE_PREFIX = f"{BUS_JOB_TYPE}:"
MAX_NAME_LENGTH = 255
#: Job types are at most 255 bytes, and a queued binding's type is its name behind `JOB_TYPE_PREFIX`.
MAX_BINDING_NAME_BYTES = MAX_NAME_LENGTH - len(JOB_TYPE_PREFIX.encode())

M = TypeVar("M")
F = TypeVar("F", bound=Callable[..., Any])
UniqueKey = str | Mapping[str, str]


@dataclass(frozen=True, slots=True)
class MessageType:
    """A registered message class, the wire name it travels under and the codec that encodes it."""

    name: str
    cls: type[Any]
    codec: Codec


@dataclass(frozen=True, slots=True)
class Binding:
    """A handler bound to a message: inline (runs inside dispatch) or queued (runs as its own job)."""

    name: str
    message: MessageType
    func: Callable[..., Any]
    is_async: bool
    queued: bool
    queue: str = "default"
    max_attempts: int | None = None
    priority: int = 0

    @property
    def job_type(self) -> str:
        """The job type of this binding's jobs (queued bindings only): see `binding_job_type`."""
        return binding_job_type(self.name)


def binding_job_type(binding_name: str) -> str:
    """The job type of a queued binding: ``"jobbus.message:" + binding_name``, stable as the name is.

    A worker claims only the job types it has handlers for, so a worker without the binding leaves
    its jobs queued for one that has it (a rolling deploy), instead of failing them.
    """
    return JOB_TYPE_PREFIX + binding_name


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What `dispatch` did: the job of each queued binding, and the correlation id the message carries.

    `job_ids` lists one job id per queued binding, in binding (registration) order; `jobs_by_binding`
    maps each queued binding's name to its job id. Both are empty when the message has no queued binding.
    """

    job_ids: list[uuid.UUID]
    jobs_by_binding: dict[str, uuid.UUID]
    correlation_id: str


@dataclass(frozen=True, slots=True)
class _Plan:
    """One validated dispatch, ready to run: nothing has run and nothing is written yet."""

    message: MessageType
    inline: tuple[Binding, ...]
    queued: tuple[Binding, ...]
    specs: tuple[JobSpec, ...]
    correlation_id: str

    def result(self, ids: list[uuid.UUID]) -> DispatchResult:
        jobs = dict(zip((binding.name for binding in self.queued), ids, strict=True))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "dispatched %s: %d inline binding(s) ran, %d job(s) enqueued",
                self.message.name,
                len(self.inline),
                len(jobs),
                extra={
                    "bus_message": self.message.name,
                    "correlation_id": self.correlation_id,
                    "job_ids": {name: str(job_id) for name, job_id in jobs.items()},
                },
            )
        return DispatchResult(list(ids), jobs, self.correlation_id)


class MessageBus:
    """Messages and their handlers on top of one `App`; create exactly one per App.

    The producer and the worker must build the same bus (import the same module): the producer needs
    the queued bindings to know which jobs to create, the worker needs them to run those jobs.
    """

    def __init__(self, app: App, *, codecs: Iterable[Codec] = (), default_codec: Codec | None = None) -> None:
        if BUS_JOB_TYPE in app.handlers:
            raise ValueError(
                f"this App already has a MessageBus (job type {BUS_JOB_TYPE!r} is registered): create one "
                f"MessageBus per App and import it wherever you register messages and handlers"
            )
        self.app = app
        self._messages: dict[str, MessageType] = {}
        self._messages_by_class: dict[type[Any], MessageType] = {}
        self._bindings: dict[str, Binding] = {}
        self._bindings_by_message: dict[str, list[Binding]] = {}
        self._codecs: dict[str, Codec] = {}
        self.default_codec = self.register_codec(default_codec if default_codec is not None else JsonCodec())
        if DEFAULT_CODEC not in self._codecs:  # envelopes that name no codec decode with JSON
            self.register_codec(JsonCodec())
        for codec in codecs:
            self.register_codec(codec)
        app.job(BUS_JOB_TYPE)(self._run_stored_job)
        self.sync = SyncMessageBus(self)

    # -- registry ----------------------------------------------------------------------------------

    @property
    def messages(self) -> Mapping[str, MessageType]:
        """Registered messages by wire name (read-only)."""
        return MappingProxyType(self._messages)

    @property
    def bindings(self) -> Mapping[str, Binding]:
        """Registered bindings by binding name (read-only)."""
        return MappingProxyType(self._bindings)

    @property
    def codecs(self) -> Mapping[str, Codec]:
        """Codecs by name: a worker decodes each envelope with the codec it names (read-only)."""
        return MappingProxyType(self._codecs)

    def register_codec(self, codec: Codec) -> Codec:
        """Make `codec` available by its name, for encoding and for decoding envelopes that name it."""
        name = getattr(codec, "name", None)
        if not isinstance(codec, Codec) or not isinstance(name, str) or not name.strip():
            raise TypeError(
                f"a codec needs a non-empty str `name` and methods `encode(obj)` and `decode(cls, data)`, got {codec!r}"
            )
        existing = self._codecs.get(name)
        if existing is not None and existing is not codec and type(existing) is not type(codec):
            raise ValueError(f"codec name {name!r} is already taken by {existing!r}: give {codec!r} another name")
        return self._codecs.setdefault(name, codec)

    def message(self, name: str, *, codec: Codec | None = None) -> Callable[[type[M]], type[M]]:
        """Register a class as a message under the wire name `name`.

        The wire name, not the class name, is what envelopes store: rename or move the class freely,
        but keep the wire name, or queued jobs written under the old one will fail as unknown.
        """
        _check_name("message name", name)

        def register(cls: type[M]) -> type[M]:
            if not isinstance(cls, type):
                raise TypeError(f"@bus.message({name!r}) decorates a class, got {cls!r}")
            taken = self._messages.get(name)
            if taken is not None:
                raise ValueError(
                    f"message name {name!r} is already registered for {_class_path(taken.cls)}; "
                    f"each wire name names one class: pick another name for {_class_path(cls)}"
                )
            known = self._messages_by_class.get(cls)
            if known is not None:
                raise ValueError(
                    f"{_class_path(cls)} is already registered as message {known.name!r}; a class travels "
                    f"under one wire name"
                )
            message_type = MessageType(name, cls, self.default_codec if codec is None else self.register_codec(codec))
            self._messages[name] = message_type
            self._messages_by_class[cls] = message_type
            return cls

        return register

    def handler(
        self,
        message: type[Any] | str,
        *,
        queued: bool = False,
        queue: str | None = None,
        name: str | None = None,
        max_attempts: int | None = None,
        priority: int | None = None,
    ) -> Callable[[F], F]:
        """Bind a function to a message (its class or wire name).

        Inline (default): ``func(message)``, sync or async, runs inside `dispatch`, in registration order.
        Queued: ``func(message, job)`` runs as its own job, of type `binding_job_type(name)`, in a
        worker; an async function gets a `JobExecution`, a sync one a `SyncJobExecution` and runs in
        the worker's threads, like any sync handler. Its return value is the job's result. `name` is
        the binding's stable identity in job types and envelopes (at most `MAX_BINDING_NAME_BYTES`
        bytes): it defaults to ``module.qualname`` of the function, so pin it with ``name=`` before you
        move or rename the function while jobs may be queued.
        """
        message_type = self._message_type(message)
        options = _binding_options(queued, queue, max_attempts, priority)

        def register(func: F) -> F:
            if not callable(func):
                raise TypeError(f"@bus.handler({message_type.name!r}) decorates a function, got {func!r}")
            binding_name = name if name is not None else f"{func.__module__}.{func.__qualname__}"
            _check_binding_name(binding_name)
            taken = self._bindings.get(binding_name)
            if taken is not None:
                raise ValueError(
                    f"binding name {binding_name!r} is already used by {taken.func.__qualname__} "
                    f"(message {taken.message.name!r}); pass name= to give this binding its own stable name"
                )
            _check_signature(func, queued=queued, binding_name=binding_name)
            binding = Binding(binding_name, message_type, func, inspect.iscoroutinefunction(func), queued, *options)
            if queued:
                self.app.job(
                    binding.job_type, queue=binding.queue, max_attempts=binding.max_attempts, priority=binding.priority
                )(self._job_handler(binding))
            self._bindings[binding_name] = binding
            self._bindings_by_message.setdefault(message_type.name, []).append(binding)
            return func

        return register

    def _message_type(self, message: type[Any] | str) -> MessageType:
        if isinstance(message, str):
            found = self._messages.get(message)
            if found is None:
                raise ValueError(
                    f"no message is registered under the wire name {message!r}: decorate its class with "
                    f"@bus.message({message!r}) first"
                )
            return found
        found = self._messages_by_class.get(message)
        if found is None:
            raise ValueError(
                f"{_class_path(message)} is not a registered message: decorate the class with "
                f"@bus.message('some.wire_name') before binding handlers to it"
            )
        return found

    # -- dispatch ----------------------------------------------------------------------------------

    async def dispatch(
        self,
        message: object,
        *,
        connection: psycopg.AsyncConnection[Any] | None = None,
        available_at: datetime | timedelta | None = None,
        unique_key: UniqueKey | None = None,
        headers: Mapping[str, str] | None = None,
        message_type: type[Any] | str | None = None,
    ) -> DispatchResult:
        """Validate, run the inline bindings, then enqueue one job per queued binding in one round trip.

        Every job is built and validated (options, payload size, unique keys, `available_at`) and the
        payload proven to decode back equal before any inline binding runs: a bad dispatch raises and
        has no effect. If an inline binding raises, nothing is enqueued and the error propagates. With
        `connection=` (an async psycopg connection inside your open transaction) the jobs are written in
        that transaction: workers see them when it commits, and they vanish if it rolls back; inline
        bindings have run either way. `unique_key` is a str applied to every queued binding, or a
        mapping binding name → key. `message_type` (class or wire name) is needed only for messages
        that do not carry their class, such as TypedDicts.
        """
        if connection is not None and not isinstance(connection, psycopg.AsyncConnection):
            raise TypeError(
                "connection= must be a psycopg.AsyncConnection here (use bus.sync.dispatch with a sync one)"
            )
        plan = self._plan(message, message_type, available_at, unique_key, headers)
        await self._run_inline(plan, message)
        return plan.result(await self.app.insert_specs(plan.specs, connection=connection))

    def _plan(
        self,
        message: object,
        message_type: type[Any] | str | None,
        available_at: datetime | timedelta | None,
        unique_key: UniqueKey | None,
        headers: Mapping[str, str] | None,
    ) -> _Plan:
        """Resolve, validate and build every job before any handler runs, so a bad dispatch has no effect."""
        registered = self._message_of(message, message_type)
        bindings = self._bindings_by_message.get(registered.name, [])
        inline = tuple(b for b in bindings if not b.queued)
        queued = tuple(b for b in bindings if b.queued)
        header_map = make_headers(headers)
        keys = _unique_keys(unique_key, queued, registered)
        specs: tuple[JobSpec, ...] = ()
        if queued:
            payload = _encode_checked(registered, message)
            specs = tuple(
                self._job_spec(
                    b, Envelope(registered.name, b.name, registered.codec.name, payload, header_map), keys, available_at
                )
                for b in queued
            )
        elif available_at is not None:
            resolve_available_at(available_at)  # validated even when no job is written
        return _Plan(registered, inline, queued, specs, header_map[CORRELATION_ID])

    def _job_spec(
        self,
        binding: Binding,
        envelope: Envelope,
        unique_keys: Mapping[str, str],
        available_at: datetime | timedelta | None,
    ) -> JobSpec:
        """One queued binding's job, validated by the App exactly as `schedule_many` validates a job."""
        request = JobRequest(
            binding.job_type,
            envelope.to_configuration(),
            name=binding.name,
            unique_key=unique_keys.get(binding.name),
            available_at=available_at,
        )
        return self.app.registry.build_job_spec(request)

    def _message_of(self, message: object, message_type: type[Any] | str | None) -> MessageType:
        if message_type is not None:
            registered = self._message_type(message_type)
            expected = dict if is_typeddict(registered.cls) else registered.cls
            if not isinstance(message, expected):
                raise TypeError(
                    f"message_type={registered.name!r} expects {_class_path(registered.cls)}, "
                    f"got {type(message).__qualname__}"
                )
            return registered
        found = self._messages_by_class.get(type(message))
        if found is not None:
            return found
        if isinstance(message, dict):
            raise TypeError(
                "a dict (or TypedDict) message does not carry its class: pass message_type= with the "
                "registered class or its wire name"
            )
        raise TypeError(
            f"{_class_path(type(message))} is not a registered message: decorate the class with "
            f"@bus.message('some.wire_name')"
        )

    async def _run_inline(self, plan: _Plan, message: object) -> None:
        with correlation_scope(plan.correlation_id):
            for binding in plan.inline:
                outcome = binding.func(message)
                if inspect.isawaitable(outcome):
                    await outcome

    def _run_inline_blocking(self, plan: _Plan, message: object) -> None:
        if any(binding.is_async for binding in plan.inline):
            if _loop_running():
                names = ", ".join(b.name for b in plan.inline if b.is_async)
                raise TypeError(
                    f"inline binding(s) {names} are async and this thread runs an event loop: "
                    f"use `await bus.dispatch(...)` here instead of bus.sync.dispatch"
                )
            asyncio.run(self._run_inline(plan, message))
            return
        with correlation_scope(plan.correlation_id):
            for binding in plan.inline:
                binding.func(message)

    # -- worker side -------------------------------------------------------------------------------

    def _job_handler(self, binding: Binding) -> Callable[..., Any]:
        """The App handler of a queued binding: async for an async binding, sync (run in the worker's
        threads, within its `concurrency`) for a sync one."""
        if binding.is_async:

            async def run_async_binding(job: JobExecution) -> Any:
                envelope, message = self._open(job, binding)
                with self._handling(job, binding, envelope):
                    return await binding.func(message, job)

            return run_async_binding

        def run_sync_binding(job: SyncJobExecution) -> Any:
            envelope, message = self._open(job, binding)
            with self._handling(job, binding, envelope):
                return binding.func(message, job)

        return run_sync_binding

    def _open(self, job: JobExecution | SyncJobExecution, binding: Binding) -> tuple[Envelope, Any]:
        """The job's envelope and its decoded message; anything unresolvable fails the job at once."""
        envelope = Envelope.from_configuration(job.configuration, binding=binding.name)
        if envelope.binding != binding.name:
            raise EnvelopeError(
                f"job type {job.type!r} runs binding {binding.name!r}, but its envelope names binding "
                f"{envelope.binding!r}"
            )
        if envelope.message != binding.message.name:
            self._registered_message(envelope)
            raise EnvelopeError(
                f"binding {binding.name!r} handles message {binding.message.name!r} in this worker, "
                f"not {envelope.message!r}"
            )
        codec = self._codecs.get(envelope.codec)
        if codec is None:
            raise EnvelopeError(
                f"codec {envelope.codec!r} of message {envelope.message!r} is not registered in this worker "
                f"(known: {_names(self._codecs)}): pass it to MessageBus(app, codecs=[...])"
            )
        try:
            return envelope, codec.decode(binding.message.cls, envelope.payload)
        except Exception as exc:
            raise EnvelopeError(
                f"the payload of message {envelope.message!r} (binding {envelope.binding!r}) does not decode "
                f"into {_class_path(binding.message.cls)} with codec {codec.name!r}: {exc}"
            ) from exc

    @contextmanager
    def _handling(self, job: JobExecution | SyncJobExecution, binding: Binding, envelope: Envelope) -> Iterator[None]:
        """Make the envelope's correlation id current and log the binding's outcome."""
        extra = {
            "job_id": str(job.id),
            "job_type": job.type,
            "attempt": job.attempt,
            "bus_message": envelope.message,
            "bus_binding": binding.name,
            "correlation_id": envelope.correlation_id,
        }
        logger.debug("job %s: binding %s handles %s", job.id, binding.name, envelope.message, extra=extra)
        with correlation_scope(envelope.correlation_id):
            try:
                yield
            except Exception as exc:
                logger.info(
                    "job %s: binding %s raised %s (correlation %s)",
                    job.id,
                    binding.name,
                    type(exc).__name__,
                    envelope.correlation_id,
                    extra=extra,
                )
                raise
        logger.info(
            "job %s: binding %s handled %s (correlation %s)",
            job.id,
            binding.name,
            envelope.message,
            envelope.correlation_id,
            extra=extra,
        )

    async def _run_stored_job(self, job: JobExecution) -> Any:
        """Jobs of type `BUS_JOB_TYPE`, which releases before per-binding job types wrote: run the
        binding the envelope names, through that binding's own handler."""
        envelope = Envelope.from_configuration(job.configuration)
        binding = self._stored_binding(envelope)
        handler = self.app.handlers[binding.job_type].func
        if binding.is_async:
            return await handler(job)
        return await asyncio.to_thread(handler, SyncJobExecution(job, asyncio.get_running_loop()))

    def _registered_message(self, envelope: Envelope) -> MessageType:
        registered = self._messages.get(envelope.message)
        if registered is None:
            raise EnvelopeError(
                f"message {envelope.message!r} is not registered in this worker (known: "
                f"{_names(self._messages)}): register it with @bus.message({envelope.message!r}) in the "
                f"worker's app, then retry the job"
            )
        return registered

    def _stored_binding(self, envelope: Envelope) -> Binding:
        registered = self._registered_message(envelope)
        binding = self._bindings.get(envelope.binding)
        if binding is None:
            queued = [b.name for b in self._bindings_by_message.get(registered.name, []) if b.queued]
            raise EnvelopeError(
                f"binding {envelope.binding!r} of message {envelope.message!r} is not registered in this worker "
                f"(queued bindings of that message here: {_names(queued)}): register it with "
                f"@bus.handler(..., queued=True, name={envelope.binding!r}), then retry the job"
            )
        if not binding.queued:
            raise EnvelopeError(f"binding {envelope.binding!r} is inline in this worker, not queued")
        return binding


class SyncMessageBus:
    """The blocking twin of `MessageBus.dispatch`, over `app.sync`; `connection=` takes a sync connection."""

    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus

    def dispatch(
        self,
        message: object,
        *,
        connection: psycopg.Connection[Any] | None = None,
        available_at: datetime | timedelta | None = None,
        unique_key: UniqueKey | None = None,
        headers: Mapping[str, str] | None = None,
        message_type: type[Any] | str | None = None,
    ) -> DispatchResult:
        """Same contract as `MessageBus.dispatch`; async inline bindings run in a fresh event loop."""
        if connection is not None and not isinstance(connection, psycopg.Connection):
            raise TypeError("connection= must be a sync psycopg.Connection here (use await bus.dispatch otherwise)")
        bus = self._bus
        plan = bus._plan(message, message_type, available_at, unique_key, headers)
        bus._run_inline_blocking(plan, message)
        return plan.result(bus.app.sync.insert_specs(plan.specs, connection=connection))


# -- helpers ----------------------------------------------------------------------------------------


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_LENGTH or "\x00" in value:
        raise ValueError(f"{what} {value[:60]!r}... must be at most {MAX_NAME_LENGTH} characters, without NUL")
    return value


def _check_binding_name(value: object) -> str:
    name = _check_name("binding name", value)
    size = len(name.encode())
    if size > MAX_BINDING_NAME_BYTES:
        raise ValueError(
            f"binding name {name[:60]!r}... is {size} bytes in UTF-8, at most {MAX_BINDING_NAME_BYTES} are "
            f"allowed: a queued binding's jobs have the type {JOB_TYPE_PREFIX!r} + its name, and job types "
            f"are at most {MAX_NAME_LENGTH} bytes"
        )
    return name


def _binding_options(
    queued: bool, queue: str | None, max_attempts: int | None, priority: int | None
) -> tuple[str, int | None, int]:
    """The job options of a binding; the App validates a queued binding's when it registers its job type."""
    if not queued:
        options = (("queue", queue), ("max_attempts", max_attempts), ("priority", priority))
        given = [option for option, value in options if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to queued bindings: pass queued=True or drop them")
    return "default" if queue is None else queue, max_attempts, 0 if priority is None else priority


def _check_signature(func: Callable[..., Any], *, queued: bool, binding_name: str) -> None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # some builtins have no signature: trust them
    shape = "(message, job)" if queued else "(message)"
    try:
        signature.bind(*((None, None) if queued else (None,)))
    except TypeError:
        kind = "a queued" if queued else "an inline"
        raise TypeError(
            f"binding {binding_name!r}: {getattr(func, '__qualname__', func)!s}{signature} cannot be called as "
            f"{shape}, which is what {kind} binding receives"
        ) from None


def _unique_keys(unique_key: UniqueKey | None, queued: tuple[Binding, ...], message: MessageType) -> dict[str, str]:
    """The unique key of each queued binding's job; each binding has its own job type, so keys stay apart."""
    if unique_key is None:
        return {}
    if isinstance(unique_key, str):
        return {b.name: unique_key for b in queued}
    if not isinstance(unique_key, Mapping):
        raise InvalidJobError(f"unique_key must be a str or a mapping binding name -> str, got {unique_key!r}")
    names = [b.name for b in queued]
    unknown = sorted(set(unique_key) - set(names))
    if unknown:
        raise InvalidJobError(
            f"unique_key names {unknown[0]!r}, which is not a queued binding of message {message.name!r} "
            f"(its queued bindings: {_names(names)})"
        )
    return dict(unique_key)


def _encode_checked(message_type: MessageType, message: object) -> Any:
    """The payload, proven to be storable JSON that decodes back into a message equal to `message`.

    A worker can then never meet a payload its own producer could not read, nor receive a message
    other than the one dispatched.
    """
    codec, name = message_type.codec, message_type.name
    if type(codec) is JsonCodec:
        try:
            return encoding.encode(message, message_type.cls, what="message")
        except EncodingError as exc:
            raise CodecError(
                f"message {name!r} cannot travel as JSON exactly, so nothing was dispatched: {exc}"
            ) from None
    try:
        payload = codec.encode(message)
    except Exception as exc:
        raise CodecError(f"codec {codec.name!r} could not encode message {name!r}: {exc}") from exc
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # lone surrogates cannot be stored
    except (TypeError, ValueError) as exc:
        raise CodecError(
            f"codec {codec.name!r} turned message {name!r} into data that is not storable JSON: {exc}"
        ) from exc
    stored = json.loads(text)
    try:
        decoded = codec.decode(message_type.cls, stored)
    except Exception as exc:
        raise CodecError(
            f"the payload of message {name!r} does not decode back into {_class_path(message_type.cls)} with "
            f"codec {codec.name!r} ({exc}); a worker would fail the job, so nothing was dispatched"
        ) from exc
    try:
        encoding.require_same(message, decoded, what="message")
    except EncodingError as exc:
        raise CodecError(f"codec {codec.name!r} does not round-trip message {name!r} exactly: {exc}") from None
    return stored


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _class_path(cls: object) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}"


def _names(names: Iterable[str], limit: int = 10) -> str:
    listed = sorted(names)
    if not listed:
        return "none"
    more = f", and {len(listed) - limit} more" if len(listed) > limit else ""
    return ", ".join(listed[:limit]) + more
