"""`MessageBus`: messages under stable wire names, inline and queued bindings, and dispatch.

`dispatch` runs a message's inline bindings at once, in registration order, then persists one job per
queued binding in a single `schedule_many` round trip (inside the caller's transaction when
`connection=` is given). Every bus job has the type `BUS_JOB_TYPE` and an `Envelope` as configuration;
the worker runs exactly the binding the envelope names, never dispatching again.

`bus.sync` is the blocking twin for Django, Flask and scripts. Both front-ends share one planning step
(`MessageBus._plan`: resolve, validate, encode, build the job requests) and differ only in how they run
inline handlers and which `schedule_many` they call.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from jobbus.bus.codecs import Codec, CodecError, JsonCodec, is_typeddict
from jobbus.bus.envelope import CORRELATION_ID, DEFAULT_CODEC, Envelope, EnvelopeError, correlation_scope, make_headers
from jobbus.errors import InvalidJobError
from jobbus.execution import JobExecution, SyncJobExecution
from jobbus.requests import JobRequest

if TYPE_CHECKING:
    from jobbus.app import App

logger = logging.getLogger("jobbus.bus")

#: The one job type of every queued binding; a worker with a `MessageBus` claims all of them.
BUS_JOB_TYPE = "jobbus.message"
MAX_NAME_LENGTH = 255

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


class JobIds(dict[str, uuid.UUID]):
    """The jobs one dispatch created: binding name → job id, one per queued binding, in binding order.

    A dict keyed by binding name (``ids["geocode"]``, ``ids.items()``), which also reads as the list of
    job ids that ``result.job_ids`` is in the SPEC: iterating yields the ids, ``ids[0]`` is the first
    queued binding's job, and ``job_id in ids`` accepts an id as well as a binding name.
    """

    def __iter__(self) -> Iterator[uuid.UUID]:  # type: ignore[override]
        return iter(self.values())

    def __reversed__(self) -> Iterator[uuid.UUID]:  # type: ignore[override]
        return reversed(self.values())

    def __getitem__(self, key: str | int) -> uuid.UUID:
        if isinstance(key, str):
            return super().__getitem__(key)
        if isinstance(key, int) and not isinstance(key, bool):
            return list(self.values())[key]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, uuid.UUID):
            return key in self.values()
        return super().__contains__(key)


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What `dispatch` did: the job of each queued binding, and the correlation id the message carries."""

    job_ids: JobIds
    correlation_id: str


@dataclass(frozen=True, slots=True)
class _Plan:
    """One validated dispatch, ready to run: nothing has run and nothing is written yet."""

    message: MessageType
    inline: tuple[Binding, ...]
    queued: tuple[Binding, ...]
    requests: tuple[JobRequest, ...]
    correlation_id: str

    def result(self, ids: Iterable[uuid.UUID]) -> DispatchResult:
        job_ids = JobIds(zip((binding.name for binding in self.queued), ids, strict=True))
        logger.debug(
            "dispatched %s: %d inline binding(s) ran, %d job(s) enqueued",
            self.message.name,
            len(self.inline),
            len(job_ids),
            extra={
                "bus_message": self.message.name,
                "correlation_id": self.correlation_id,
                "job_ids": {name: str(job_id) for name, job_id in job_ids.items()},
            },
        )
        return DispatchResult(job_ids, self.correlation_id)


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
        app.job(BUS_JOB_TYPE)(self._run_job)
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
        Queued: ``func(message, job)`` runs as its own job in a worker; an async function gets a
        `JobExecution`, a sync one a `SyncJobExecution` (and runs in a thread). Its return value is the
        job's result. `name` is the binding's stable identity in stored envelopes: it defaults to
        ``module.qualname`` of the function, so pin it with ``name=`` before you move or rename the
        function while jobs may be queued.
        """
        message_type = self._message_type(message)
        options = _binding_options(queued, queue, max_attempts, priority)

        def register(func: F) -> F:
            if not callable(func):
                raise TypeError(f"@bus.handler({message_type.name!r}) decorates a function, got {func!r}")
            binding_name = name if name is not None else f"{func.__module__}.{func.__qualname__}"
            _check_name("binding name", binding_name)
            taken = self._bindings.get(binding_name)
            if taken is not None:
                raise ValueError(
                    f"binding name {binding_name!r} is already used by {taken.func.__qualname__} "
                    f"(message {taken.message.name!r}); pass name= to give this binding its own stable name"
                )
            _check_signature(func, queued=queued, binding_name=binding_name)
            binding = Binding(binding_name, message_type, func, inspect.iscoroutinefunction(func), queued, *options)
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
        """Run the inline bindings, then enqueue one job per queued binding in one round trip.

        If an inline binding raises, nothing is enqueued and the error propagates. With `connection=`
        (an async psycopg connection inside your open transaction) the jobs are written in that
        transaction: workers see them when it commits, and they vanish if it rolls back; inline
        bindings have run either way. `unique_key` is a str applied to every queued binding, or a
        mapping binding name → key; the stored key is ``f"{binding}:{key}"``. `message_type` (class or
        wire name) is needed only for messages that do not carry their class, such as TypedDicts.
        """
        if connection is not None and not isinstance(connection, psycopg.AsyncConnection):
            raise TypeError(
                "connection= must be a psycopg.AsyncConnection here (use bus.sync.dispatch with a sync one)"
            )
        plan = self._plan(message, message_type, available_at, unique_key, headers)
        await self._run_inline(plan, message)
        ids = await self.app.schedule_many(plan.requests, connection=connection) if plan.requests else []
        return plan.result(ids)

    def _plan(
        self,
        message: object,
        message_type: type[Any] | str | None,
        available_at: datetime | timedelta | None,
        unique_key: UniqueKey | None,
        headers: Mapping[str, str] | None,
    ) -> _Plan:
        """Resolve and validate everything before any handler runs, so a bad dispatch has no effect."""
        registered = self._message_of(message, message_type)
        bindings = self._bindings_by_message.get(registered.name, [])
        inline = tuple(b for b in bindings if not b.queued)
        queued = tuple(b for b in bindings if b.queued)
        header_map = make_headers(headers)
        keys = _unique_keys(unique_key, queued, registered)
        _check_available_at(available_at)
        requests: tuple[JobRequest, ...] = ()
        if queued:
            payload = _encode_checked(registered, message)
            requests = tuple(
                JobRequest(
                    BUS_JOB_TYPE,
                    Envelope(registered.name, b.name, registered.codec.name, payload, header_map).to_configuration(),
                    name=b.name,
                    unique_key=keys.get(b.name),
                    max_attempts=b.max_attempts,
                    available_at=available_at,
                    queue=b.queue,
                    priority=b.priority,
                )
                for b in queued
            )
        return _Plan(registered, inline, queued, requests, header_map[CORRELATION_ID])

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

    async def _run_job(self, job: JobExecution) -> Any:
        """Run exactly the binding the job's envelope names; unresolvable envelopes fail at once."""
        envelope = Envelope.from_configuration(job.configuration)
        binding, codec = self._resolve(envelope)
        try:
            message = codec.decode(binding.message.cls, envelope.payload)
        except Exception as exc:
            raise EnvelopeError(
                f"the payload of message {envelope.message!r} (binding {envelope.binding!r}) does not decode "
                f"into {_class_path(binding.message.cls)} with codec {codec.name!r}: {exc}"
            ) from exc
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
                if binding.is_async:
                    result = await binding.func(message, job)
                else:
                    sync_job = SyncJobExecution(job, asyncio.get_running_loop())
                    result = await asyncio.to_thread(binding.func, message, sync_job)
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
        return result

    def _resolve(self, envelope: Envelope) -> tuple[Binding, Codec]:
        registered = self._messages.get(envelope.message)
        if registered is None:
            raise EnvelopeError(
                f"message {envelope.message!r} is not registered in this worker (known: "
                f"{_names(self._messages)}): register it with @bus.message({envelope.message!r}) in the "
                f"worker's app, then retry the job"
            )
        binding = self._bindings.get(envelope.binding)
        if binding is None:
            queued = [b.name for b in self._bindings_by_message.get(registered.name, []) if b.queued]
            raise EnvelopeError(
                f"binding {envelope.binding!r} of message {envelope.message!r} is not registered in this worker "
                f"(queued bindings of that message here: {_names(queued)}): register it with "
                f"@bus.handler(..., queued=True, name={envelope.binding!r}), then retry the job"
            )
        if binding.message is not registered:
            raise EnvelopeError(
                f"binding {envelope.binding!r} handles message {binding.message.name!r} in this worker, "
                f"not {envelope.message!r}"
            )
        if not binding.queued:
            raise EnvelopeError(f"binding {envelope.binding!r} is inline in this worker, not queued")
        codec = self._codecs.get(envelope.codec)
        if codec is None:
            raise EnvelopeError(
                f"codec {envelope.codec!r} of message {envelope.message!r} is not registered in this worker "
                f"(known: {_names(self._codecs)}): pass it to MessageBus(app, codecs=[...])"
            )
        return binding, codec


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
        ids = bus.app.sync.schedule_many(plan.requests, connection=connection) if plan.requests else []
        return plan.result(ids)


# -- helpers ----------------------------------------------------------------------------------------


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_LENGTH or "\x00" in value:
        raise ValueError(f"{what} {value[:60]!r}... must be at most {MAX_NAME_LENGTH} characters, without NUL")
    return value


def _binding_options(
    queued: bool, queue: str | None, max_attempts: int | None, priority: int | None
) -> tuple[str, int | None, int]:
    if not queued:
        options = (("queue", queue), ("max_attempts", max_attempts), ("priority", priority))
        given = [option for option, value in options if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to queued bindings: pass queued=True or drop them")
        return "default", None, 0
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31
    ):
        raise ValueError(f"priority must be an integer that fits 32 bits, got {priority!r}")
    return _check_name("queue", "default" if queue is None else queue), max_attempts, priority or 0


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
    if unique_key is None:
        return {}
    if isinstance(unique_key, str):
        given: Mapping[str, str] = {b.name: unique_key for b in queued}
    elif isinstance(unique_key, Mapping):
        names = [b.name for b in queued]
        unknown = sorted(set(unique_key) - set(names))
        if unknown:
            raise InvalidJobError(
                f"unique_key names {unknown[0]!r}, which is not a queued binding of message {message.name!r} "
                f"(its queued bindings: {_names(names)})"
            )
        given = unique_key
    else:
        raise InvalidJobError(f"unique_key must be a str or a mapping binding name -> str, got {unique_key!r}")
    keys: dict[str, str] = {}
    for binding_name, key in given.items():
        if not isinstance(key, str) or not key:
            raise InvalidJobError(f"unique_key for binding {binding_name!r} must be a non-empty string, got {key!r}")
        keys[binding_name] = f"{binding_name}:{key}"  # bus jobs share one type: keep bindings apart
    return keys


def _check_available_at(value: datetime | timedelta | None) -> None:
    if value is None or isinstance(value, timedelta):
        return
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidJobError(f"available_at must be an aware datetime (with a timezone), got naive {value}")
        return
    raise InvalidJobError(f"available_at must be an aware datetime or a timedelta, got {value!r}")


def _encode_checked(message_type: MessageType, message: object) -> Any:
    """Encode, then prove the payload is storable JSON that decodes back, so no worker fails on it later."""
    codec = message_type.codec
    try:
        payload = codec.encode(message)
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"codec {codec.name!r} could not encode message {message_type.name!r}: {exc}") from exc
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # lone surrogates cannot be stored
    except (TypeError, ValueError) as exc:
        raise CodecError(
            f"codec {codec.name!r} turned message {message_type.name!r} into data that is not storable JSON: {exc}"
        ) from exc
    stored = json.loads(text)
    if _has_nul(stored):
        raise CodecError(f"message {message_type.name!r} contains a NUL character, which PostgreSQL jsonb cannot store")
    try:
        codec.decode(message_type.cls, stored)
    except Exception as exc:
        raise CodecError(
            f"the payload of message {message_type.name!r} does not decode back into "
            f"{_class_path(message_type.cls)} with codec {codec.name!r} ({exc}); a worker would fail the job, "
            f"so nothing was dispatched"
        ) from exc
    return stored


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


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
