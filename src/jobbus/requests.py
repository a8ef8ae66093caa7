"""Validation of what producers ask for: a clear error and nothing written, or a ready `JobSpec`."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import uuid_utils.compat as uuid7_source

from jobbus.errors import InvalidJobError
from jobbus.models import JobSpec
from jobbus.store import dumps

MAX_NAME_LENGTH = 255
#: How far `available_at` may lie from now: PostgreSQL accepts more, but a time after year 9999 could not
#: be read back into a Python datetime.
MAX_DELAY = timedelta(days=365_250)  # 1000 years


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One job for `App.schedule_many`; options left as None take the handler's or the settings' default."""

    type: str
    configuration: Mapping[str, Any] | None = None
    name: str | None = None
    group_id: uuid.UUID | None = None
    unique_key: str | None = None
    max_attempts: int | None = None
    available_at: datetime | timedelta | None = None
    queue: str | None = None
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """What a registered handler says about its jobs when the producer does not."""

    queue: str = "default"
    max_attempts: int | None = None
    priority: int = 0


def new_job_id() -> uuid.UUID:
    return uuid7_source.uuid7()


def build_spec(
    request: JobRequest, defaults: JobDefaults, default_max_attempts: int, max_payload_bytes: int | None = None
) -> JobSpec:
    job_type = _text("type", request.type)
    queue = _text("queue", request.queue if request.queue is not None else defaults.queue)
    name = None if request.name is None else _text("name", request.name, limit=1000)
    unique_key = None if request.unique_key is None else _text("unique_key", request.unique_key, limit=1000)
    max_attempts = _int(
        "max_attempts",
        request.max_attempts
        if request.max_attempts is not None
        else defaults.max_attempts
        if defaults.max_attempts is not None
        else default_max_attempts,
    )
    if max_attempts < 1:
        raise InvalidJobError(f"max_attempts must be >= 1, got {max_attempts}")
    priority = _int("priority", request.priority if request.priority is not None else defaults.priority)
    if not -(2**31) <= priority < 2**31:
        raise InvalidJobError(f"priority must fit a 32-bit integer, got {priority}")
    group_id = request.group_id
    if group_id is not None and not isinstance(group_id, uuid.UUID):
        raise InvalidJobError(f"group_id must be a uuid.UUID, got {group_id!r}")
    available_at, delay = resolve_available_at(request.available_at)
    return JobSpec(
        id=new_job_id(),
        type=job_type,
        queue=queue,
        configuration=configuration_json(request.configuration, max_payload_bytes),
        name=name,
        group_id=group_id,
        unique_key=unique_key,
        priority=priority,
        max_attempts=max_attempts,
        available_at=available_at,
        delay_seconds=delay,
    )


def specs_sharing(
    template: JobSpec, configurations: Iterable[Mapping[str, Any] | None], limit: int | None
) -> list[JobSpec]:
    """Jobs that differ from `template` only in id and configuration: the options were validated once.

    `schedule_many(type, configurations)` goes through here: 6 µs per job less than `build_spec`.
    """
    t = template
    return [
        JobSpec(
            new_job_id(),
            t.type,
            t.queue,
            configuration_json(configuration, limit),
            t.name,
            t.group_id,
            t.unique_key,
            t.priority,
            t.max_attempts,
            t.available_at,
            t.delay_seconds,
        )
        for configuration in configurations
    ]


def configuration_json(configuration: Mapping[str, Any] | None, limit: int | None = None) -> str:
    if configuration is None:
        return "{}"
    if not isinstance(configuration, Mapping):
        raise InvalidJobError(
            f"configuration must be a JSON object (a dict), got {type(configuration).__name__}: {configuration!r:.80}"
        )
    bad_keys = [k for k in configuration if not isinstance(k, str)]
    if bad_keys:
        raise InvalidJobError(f"configuration keys must be strings, got {bad_keys[0]!r}")
    return json_text("configuration", dict(configuration), limit)


def json_text(what: str, value: Any, limit: int | None = None) -> str:
    try:
        text = dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJobError(f"{what} is not JSON serialisable: {exc}") from None
    if "\\u0000" in text:
        raise InvalidJobError(f"{what} contains a NUL character, which PostgreSQL jsonb cannot store")
    if limit is not None and len(text) > limit:
        size = len(text.encode())
        if size > limit:
            raise InvalidJobError(
                f"{what} is {size} bytes of JSON, over the limit of {limit} (setting max_payload_bytes); "
                "store large data elsewhere and pass a reference"
            )
    return text


def _text(what: str, value: object, limit: int = MAX_NAME_LENGTH) -> str:
    if not isinstance(value, str):
        raise InvalidJobError(f"{what} must be a string, got {value!r}")
    if not value.strip():
        raise InvalidJobError(f"{what} must not be empty")
    if len(value) > limit:
        raise InvalidJobError(f"{what} is {len(value)} characters long, at most {limit} are allowed")
    if "\x00" in value:
        raise InvalidJobError(f"{what} must not contain NUL characters")
    return value


def _int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(f"{what} must be an integer, got {value!r}")
    return value


def resolve_available_at(value: datetime | timedelta | None) -> tuple[datetime | None, float]:
    """An aware datetime is absolute; a timedelta counts from the database clock at insert."""
    if value is None:
        return None, 0.0
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if not math.isfinite(seconds) or abs(value) > MAX_DELAY:
            raise InvalidJobError(f"available_at must be at most 1000 years from now, got {value!r}")
        return None, seconds
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise InvalidJobError(
                f"available_at must be an aware datetime (with a timezone), got naive {value.isoformat()}"
            )
        try:
            value.astimezone(UTC)
        except OverflowError:
            raise InvalidJobError(f"available_at {value.isoformat()} is outside the years 1 to 9999 in UTC") from None
        return value, 0.0
    raise InvalidJobError(f"available_at must be an aware datetime or a timedelta, got {value!r}")
