"""Who acts: the actor and source that operator actions record in the audit trail (`{schema}.audit_log`).

The admin verbs (`cancel`, `retry`, `set_queue`, the control commands, ...) read them from a context
variable, so every caller records through the same verbs: an application names its user with
`acting_as`, the command line names the operating-system user, the dashboard the request's user.
"""

from __future__ import annotations

import getpass
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: The longest actor and source `audit_log` takes.
MAX_ACTOR = 255
MAX_SOURCE = 64


@dataclass(frozen=True, slots=True)
class Acting:
    """Who acts (`actor`: a user's or a role's name) and through what (`source`: `api`, `cli`, `dashboard`)."""

    actor: str
    source: str


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the audit trail: an operator action that took effect."""

    id: uuid.UUID
    at: datetime
    actor: str
    source: str
    action: str
    target: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "at": self.at.isoformat(),
            "actor": self.actor,
            "source": self.source,
            "action": self.action,
            "target": self.target,
            "details": dict(self.details),
        }


#: What an action records when nobody said who acts: the Python API.
API = Acting("api", "api")

_ACTING: ContextVar[Acting] = ContextVar("jobbus_acting", default=API)
_GATHERING: ContextVar[list[str] | None] = ContextVar("jobbus_audit_gathering", default=None)


@contextmanager
def acting_as(actor: str, *, source: str = "api") -> Iterator[Acting]:
    """Record the operator actions made inside the block (in this task or thread) as `actor`'s, made
    through `source`::

        with jobbus.acting_as(request.user.username):
            await app.cancel(job_id)

    Without it an action records actor `api`, source `api`. Blocks nest; the innermost wins.
    """
    acting = Acting(_checked("actor", actor, MAX_ACTOR), _checked("source", source, MAX_SOURCE))
    token = _ACTING.set(acting)
    try:
        yield acting
    finally:
        _ACTING.reset(token)


def acting() -> Acting:
    """Who the actions made now are recorded as."""
    return _ACTING.get()


def operating_system_user() -> str:
    """The command line's actor: the user running it (its uid when the system has no name for it)."""
    try:
        return getpass.getuser()[:MAX_ACTOR] or f"uid:{os.getuid()}"
    except (OSError, KeyError):
        return f"uid:{os.getuid()}"


@contextmanager
def gathering() -> Iterator[list[str]]:
    """One entry for many actions: inside the block each action records no row of its own but adds its
    target to the list yielded, once it took effect; the caller records one row for all of them."""
    targets: list[str] = []
    token = _GATHERING.set(targets)
    try:
        yield targets
    finally:
        _GATHERING.reset(token)


def gathered() -> list[str] | None:
    """The list of an enclosing `gathering` block, or None."""
    return _GATHERING.get()


def _checked(what: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise ValueError(f"acting_as: {what} must be a non-empty string of at most {limit} characters, got {value!r}")
    return value
