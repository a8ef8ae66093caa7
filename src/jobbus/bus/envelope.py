"""The envelope: what a queued binding's job stores as its configuration, and the headers it carries.

The envelope is versioned (`"v": 1`) so a worker can tell an envelope it does not understand from a
broken one, and it names the message, the binding and the codec by their stable names rather than by
Python import paths: renaming a class or moving a module never strands queued jobs.

The correlation id rides in the headers. While a binding runs, it is also the *current* correlation id
(a context variable), so a message dispatched from inside a handler joins the same correlation, and
`CorrelationIdFilter` can stamp it on every log record.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from jobbus.errors import InvalidJobError, NonRetryableError

ENVELOPE_VERSION = 1
DEFAULT_CODEC = "json"
CORRELATION_ID = "correlation_id"
MAX_HEADER_LENGTH = 1000

_current_correlation_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jobbus_correlation_id", default=None
)


class EnvelopeError(NonRetryableError):
    """This worker cannot resolve a job's envelope; the job fails at once with this message as `last_error`."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One queued binding's job input: which message, for which binding, encoded how, plus headers."""

    message: str
    binding: str
    codec: str
    payload: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    version: int = ENVELOPE_VERSION

    @property
    def correlation_id(self) -> str | None:
        return self.headers.get(CORRELATION_ID)

    def to_configuration(self) -> dict[str, Any]:
        """The job configuration (a JSON object) that stores this envelope."""
        return {
            "v": self.version,
            "message": self.message,
            "binding": self.binding,
            "codec": self.codec,
            "payload": self.payload,
            "headers": dict(self.headers),
        }

    @classmethod
    def from_configuration(cls, configuration: Mapping[str, Any], *, binding: str | None = None) -> Envelope:
        """Read an envelope back; anything malformed raises `EnvelopeError` naming the faulty part.

        `binding` is the binding the job's type names: a hand-written envelope may then leave it out.
        """
        if not isinstance(configuration, Mapping):
            raise EnvelopeError(
                f"the job configuration is not a message envelope (a JSON object): {configuration!r:.80}"
            )
        version = configuration.get("v", ENVELOPE_VERSION)  # hand-written envelopes may leave out v and codec
        if version != ENVELOPE_VERSION:
            raise EnvelopeError(
                f"envelope version {version!r} is unknown to this worker, which reads version {ENVELOPE_VERSION}: "
                f"upgrade the worker, then retry the job"
            )
        if "message" not in configuration and "payload" not in configuration:
            keys = ", ".join(sorted(configuration)) or "none"
            raise EnvelopeError(f"the job configuration is not a message envelope (keys: {keys})")
        names = {
            key: _name_field(configuration, key) if key in configuration or default is None else default
            for key, default in (("message", None), ("binding", binding), ("codec", DEFAULT_CODEC))
        }
        if "payload" not in configuration:
            raise EnvelopeError(f"the envelope of message {names['message']!r} has no 'payload'")
        headers = configuration.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise EnvelopeError(f"the envelope headers must be an object of strings, got {headers!r:.80}")
        return cls(
            message=names["message"],
            binding=names["binding"],
            codec=names["codec"],
            payload=configuration["payload"],
            headers=dict(headers),
        )


def _name_field(configuration: Mapping[str, Any], key: str) -> str:
    value = configuration.get(key)
    if not isinstance(value, str) or not value:
        raise EnvelopeError(f"the envelope has no valid {key!r} name (got {value!r:.80})")
    return value


def make_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Validated headers with a correlation id: the given one, else the current one, else a new uuid4 hex."""
    result: dict[str, str] = {}
    for key, value in (headers or {}).items():
        if not isinstance(key, str) or not key:
            raise InvalidJobError(f"headers: keys must be non-empty strings, got {key!r}")
        if not isinstance(value, str):
            raise InvalidJobError(f"headers: {key!r} must be a string, got {type(value).__name__} {value!r:.60}")
        if len(value) > MAX_HEADER_LENGTH or "\x00" in value:
            raise InvalidJobError(f"headers: {key!r} must be at most {MAX_HEADER_LENGTH} characters, without NUL")
        result[key] = value
    if not result.get(CORRELATION_ID):
        result[CORRELATION_ID] = current_correlation_id() or uuid.uuid4().hex
    return result


def current_correlation_id() -> str | None:
    """The correlation id of the dispatch or queued binding running in this context, if any."""
    return _current_correlation_id.get()


@contextmanager
def correlation_scope(correlation_id: str | None) -> Iterator[None]:
    """Make `correlation_id` current for the duration (messages dispatched inside inherit it)."""
    token = _current_correlation_id.set(correlation_id)
    try:
        yield
    finally:
        _current_correlation_id.reset(token)


class CorrelationIdFilter(logging.Filter):
    """A logging filter that sets `record.correlation_id` from the current bus context (None outside one).

    Attach it to a handler (``handler.addFilter(CorrelationIdFilter())``) to put the correlation id of
    the message being handled on every line your own code logs, not only on jobbus's lines.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, CORRELATION_ID, None) is None:
            setattr(record, CORRELATION_ID, current_correlation_id())
        return True
