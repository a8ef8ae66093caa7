"""Validation of what producers ask for: a clear error and nothing written, or a ready `JobSpec`."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypedDict

from uuid_utils import uuid7

from jobbus.durations import resolve_available_at, resolve_expires, seconds_or_none
from jobbus.encryption import BIND_TYPE, Keyring
from jobbus.errors import InvalidJobError, InvalidStateError
from jobbus.jsontext import dumps
from jobbus.models import JobSpec, SharedSpecs, options_of

#: Limits in UTF-8 bytes. `type` and `queue` stay within the table's CHECK (at most 255 characters);
#: with those, an entry of the unique index on (type, unique_key) stays far below the ~2,700 bytes
#: a btree entry may take.
MAX_TYPE_BYTES = 255
MAX_NAME_BYTES = 1000
MAX_UNIQUE_KEY_BYTES = 1000
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: The heaviest job (`weight=`), as the CHECK of job.weight allows: far above any useful limit, and
#: sums of weights stay well within 32 bits.
MAX_WEIGHT = 1_000_000
#: Deepest JSON nesting accepted in configurations, checkpoints and results: PostgreSQL takes far
#: more, but reading a row back parses it recursively, and that must never hit Python's recursion limit.
MAX_JSON_DEPTH = 200
#: Tags a job may carry, and the characters of each (SPEC 21).
MAX_TAGS = 16
MAX_TAG_CHARACTERS = 64


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
    #: Seconds (or a timedelta) an attempt may run; None: the handler's timeout, if any.
    timeout: float | timedelta | None = None
    #: What per-key limits of the queue count this job by (`App.set_queue`).
    concurrency_key: str | None = None
    #: A follow-up, scheduled exactly once in the transaction that records this job `completed`
    #: (never on failure or cancellation); it may have a `then` of its own.
    then: JobRequest | None = None
    #: A job not started by then never runs and ends `cancelled`: seconds or a timedelta from the
    #: insert (the database clock), or an aware datetime.
    expires: float | timedelta | datetime | None = None
    #: What it counts against its queue's concurrency, concurrency_per_key, rate_limit and
    #: rate_limit_per_key (1 to `MAX_WEIGHT`; None: 1).
    weight: int | None = None
    #: A uniqueness window (needs `unique_key`): a job of the same (type, unique_key) scheduled less than
    #: this many seconds (or this timedelta) ago, in any status, answers the call; nothing is written.
    unique_for: float | timedelta | None = None
    #: Debounce (needs `unique_key`): while a job of the key waits unstarted, the call gives it this
    #: configuration and makes it available this many seconds (or this timedelta) from now.
    debounce: float | timedelta | None = None
    #: Labels to find the job by (`jobbus jobs list --tag`, the dashboard, `App.update_many(tag=...)`):
    #: at most `MAX_TAGS` non-blank strings of at most `MAX_TAG_CHARACTERS` characters each; repeats are
    #: dropped (the first kept, in order), and an empty list is no tags.
    tags: Sequence[str] | None = None
    #: The cell the job lives in, for an App with cells (SPEC 23): over `queue_cells`; None: its queue's
    #: cell, else the first. A follow-up, a child or a group member stays in its parent's cell.
    cell: str | None = None


class JobOptions(TypedDict, total=False):
    """The options of one job as keywords: of `App.schedule`, `schedule_many` (for each of its jobs),
    `Task.options` and `job.spawn`. Each is the `JobRequest` field of the same name; one left out (or
    None) takes the handler's default, then the settings'."""

    name: str | None
    group_id: uuid.UUID | None
    unique_key: str | None
    max_attempts: int | None
    available_at: datetime | timedelta | None
    queue: str | None
    priority: int | None
    timeout: float | timedelta | None
    concurrency_key: str | None
    then: JobRequest | None
    expires: float | timedelta | datetime | None
    weight: int | None
    unique_for: float | timedelta | None
    debounce: float | timedelta | None
    tags: Sequence[str] | None
    cell: str | None


def check_options(what: str, given: Mapping[str, object], known: frozenset[str]) -> None:
    """`TypeError` for a keyword that is not one of `known` (an options TypedDict's keys), as a
    signature that spells them out would raise: mypy sees it in checked code, this sees every call."""
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(f"{what}: unexpected keyword argument {unknown[0]!r} (it takes {', '.join(sorted(known))})")


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """What a registered handler says about its jobs when the producer does not."""

    queue: str = "default"
    max_attempts: int | None = None
    priority: int = 0


def new_job_id() -> uuid.UUID:
    """A UUIDv7 (increasing within the process) as a standard `uuid.UUID`."""
    return _standard_uuid(uuid7().int)


def new_job_ids(count: int) -> list[uuid.UUID]:
    """`count` UUIDv7s in increasing order, as `new_job_id` makes them."""
    return [_standard_uuid(uuid7().int) for _ in range(count)]


def _standard_uuid(value: int) -> uuid.UUID:
    """The `uuid.UUID` of a 128-bit value that is a UUID already, made without `UUID(int=...)`'s checks:
    0.5 µs a job id against 0.9 µs through `uuid_utils.compat.uuid7`, which wraps its ids the same way."""
    made = _new_object(uuid.UUID)
    _set_slot(made, "int", value)
    _set_slot(made, "is_safe", _UNKNOWN_SAFETY)
    return made


_new_object = object.__new__
_set_slot = object.__setattr__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown  # read once: an enum member read from its class is a Python call


def build_spec(
    request: JobRequest, defaults: JobDefaults, default_max_attempts: int, max_payload_bytes: int | None = None
) -> JobSpec:
    job_type = validate_text("type", request.type, MAX_TYPE_BYTES)
    queue = validate_text("queue", request.queue if request.queue is not None else defaults.queue, MAX_TYPE_BYTES)
    name = None if request.name is None else validate_text("name", request.name, MAX_NAME_BYTES)
    unique_key = (
        None if request.unique_key is None else validate_text("unique_key", request.unique_key, MAX_UNIQUE_KEY_BYTES)
    )
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
    if max_attempts > INT32_MAX:
        raise InvalidJobError(f"max_attempts must be at most {INT32_MAX} (32 bits), got {max_attempts}")
    priority = _int("priority", request.priority if request.priority is not None else defaults.priority)
    if not INT32_MIN <= priority <= INT32_MAX:
        raise InvalidJobError(f"priority must be between {INT32_MIN} and {INT32_MAX} (32 bits), got {priority}")
    group_id = request.group_id
    if group_id is not None and not isinstance(group_id, uuid.UUID):
        raise InvalidJobError(f"group_id must be a uuid.UUID, got {group_id!r}")
    available_at, delay = resolve_available_at(request.available_at)
    expires_at, expires_in = resolve_expires(request.expires)
    concurrency_key = (
        None
        if request.concurrency_key is None
        else validate_text("concurrency_key", request.concurrency_key, MAX_UNIQUE_KEY_BYTES)
    )
    weight = 1 if request.weight is None else _int("weight", request.weight)
    if not 1 <= weight <= MAX_WEIGHT:
        raise InvalidJobError(f"weight must be between 1 and {MAX_WEIGHT}, got {weight}")
    unique_for = debounce = None
    if request.unique_for is not None or request.debounce is not None:
        unique_for, debounce = keyed_options(request, unique_key)
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
        timeout_seconds=seconds_or_none("timeout", request.timeout),
        concurrency_key=concurrency_key,
        expires_at=expires_at,
        expires_in=expires_in,
        weight=weight,
        unique_for=unique_for,
        debounce=debounce,
        tags=None if request.tags is None else validate_tags("tags", request.tags),
    )


def keyed_options(request: JobRequest, unique_key: str | None) -> tuple[float | None, float | None]:
    """(unique_for, debounce) in seconds, or `InvalidJobError`: each needs a unique_key, they exclude each
    other, and debounce sets the start itself (no available_at)."""
    unique_for = seconds_or_none("unique_for", request.unique_for)
    debounce = seconds_or_none("debounce", request.debounce)
    if unique_for is None and debounce is None:
        return None, None
    what = "unique_for" if unique_for is not None else "debounce"
    if unique_key is None:
        raise InvalidJobError(f"{what} needs a unique_key: it deduplicates the jobs of one (type, unique_key)")
    if unique_for is not None and debounce is not None:
        raise InvalidJobError("debounce and unique_for exclude each other: give one")
    if debounce is not None and request.available_at is not None:
        raise InvalidJobError(
            "debounce sets when the job starts (debounce seconds from the last call): give no available_at"
        )
    return unique_for, debounce


def spec_json(spec: JobSpec) -> str:
    """A validated job as the JSON object the database schedules later (a follow-up, a group's callback):
    the keys the function `schedule_spec` of sql/current.sql reads. A relative start counts from when it
    is scheduled."""
    values: dict[str, Any] = {
        "id": str(spec.id),
        "type": spec.type,
        "queue": spec.queue,
        "name": spec.name,
        "group_id": None if spec.group_id is None else str(spec.group_id),
        "unique_key": spec.unique_key,
        "priority": spec.priority,
        "max_attempts": spec.max_attempts,
        "available_at": None if spec.available_at is None else spec.available_at.isoformat(),
        "delay": float(spec.delay_seconds),
        "timeout": spec.timeout_seconds,
        "concurrency_key": spec.concurrency_key,
    }
    if spec.expires_at is not None:
        values["expires_at"] = spec.expires_at.isoformat()
    if spec.expires_in is not None:
        values["expires_in"] = spec.expires_in
    if spec.weight != 1:
        values["weight"] = spec.weight
    if spec.unique_for is not None:
        values["unique_for"] = spec.unique_for
    if spec.debounce is not None:
        values["debounce"] = spec.debounce
    if spec.tags is not None:
        values["tags"] = list(spec.tags)
    text = dumps(values)
    # configuration and then are JSON text already: spliced in, not decoded and encoded again.
    text = f'{text[:-1]},"configuration":{spec.configuration}'
    if spec.then is not None:
        text += f',"then":{spec.then}'
    return text + "}"


def specs_sharing(
    template: JobSpec, configurations: Iterable[Mapping[str, Any] | None], limit: int | None
) -> SharedSpecs:
    """Jobs that differ from `template` only in id and configuration: the options were validated once.

    `schedule_many(type, configurations)` goes through here: per job, an id and the configuration's
    JSON text, and no `JobSpec` (see `SharedSpecs`).
    """
    texts = [configuration_json(configuration, limit) for configuration in configurations]
    return SharedSpecs(template, new_job_ids(len(texts)), texts)


def seal_spec(spec: JobSpec, keyring: Keyring, limit: int | None) -> JobSpec:
    """`spec` with its configuration sealed with the newest key (`jobbus.encryption`), bound to the job's
    id (to its type for a debounced job, whose configuration may land on another job of its key)."""
    if spec.debounce is not None:
        text = keyring.seal_text(spec.configuration, "configuration", spec.type, bind=BIND_TYPE)
    else:
        text = keyring.seal_text(spec.configuration, "configuration", spec.id)
    return replace(spec, configuration=sealed_within("configuration", text, len(spec.configuration), limit))


def seal_configurations(shared: SharedSpecs, keyring: Keyring, limit: int | None) -> SharedSpecs:
    """`seal_spec` for the jobs of a `SharedSpecs` (none is debounced: they have no unique key)."""
    texts = [
        sealed_within("configuration", keyring.seal_text(text, "configuration", job_id), len(text), limit)
        for job_id, text in zip(shared.ids, shared.configurations, strict=True)
    ]
    return SharedSpecs(shared.template, shared.ids, texts)


def sealed_within(what: str, sealed: str, clear_bytes: int, limit: int | None) -> str:
    """`sealed`, or `InvalidJobError` when it is over `limit`: max_payload_bytes bounds what is stored."""
    if limit is not None and len(sealed) > limit:
        raise InvalidJobError(
            f"{what} is {len(sealed)} bytes of JSON once encrypted ({clear_bytes} in clear), over the limit "
            f"of {limit} (setting max_payload_bytes); store large data elsewhere and pass a reference"
        )
    return sealed


def configuration_json(configuration: Mapping[str, Any] | None, limit: int | None = None) -> str:
    if configuration is None or (type(configuration) is dict and not configuration):
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
    """The JSON text of `value` that jsonb stores and jobbus reads back, or `InvalidJobError`.

    Refused, each with an error that names `what` (and the key path where one exists): values JSON
    cannot encode (NaN, infinities, sets, objects), NUL characters and lone surrogates (jsonb cannot
    hold either), nesting deeper than `MAX_JSON_DEPTH` levels, and more than `limit` bytes. The common
    case costs a few substring scans of the encoded text; the value is walked only to find a problem.
    """
    try:
        text = dumps(value)
    except RecursionError:
        raise InvalidJobError(f"{what} is nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None
    except (TypeError, ValueError) as exc:
        circular = "Circular reference" in str(exc)  # a walk of a cyclic value would not end
        found = None if circular else _find(what, value, _unencodable)
        if found is not None and isinstance(found[1], float):
            raise InvalidJobError(
                f"{found[0]} is {found[1]!r}: JSON has no NaN or Infinity; use None or a string"
            ) from None
        raise InvalidJobError(f"{found[0] if found else what} is not JSON serialisable: {exc}") from None
    # With ASCII-only output, NUL is always written `\u0000` and every non-BMP character as a
    # `\udXXX\udXXX` pair: a lone surrogate can only appear where the text has `\ud`.
    if "\\u0000" in text:
        _refuse(what, value, _has_nul, "contains a NUL character, which PostgreSQL jsonb cannot store")
    if "\\ud" in text and _LONE_SURROGATE.search(text):
        _refuse(
            what,
            value,
            _has_lone_surrogate,
            "contains a lone surrogate (half of a UTF-16 pair, not a character), which PostgreSQL jsonb cannot store",
        )
    # Nesting N deep takes 2N characters and N brackets: short texts skip the scan, most others the walk.
    if len(text) > 2 * MAX_JSON_DEPTH and text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(value):
        raise InvalidJobError(f"{what} is nested too deeply (at most {MAX_JSON_DEPTH} levels)")
    if limit is not None and len(text) > limit:  # ASCII-only: characters are bytes
        raise InvalidJobError(
            f"{what} is {len(text)} bytes of JSON, over the limit of {limit} (setting max_payload_bytes); "
            "store large data elsewhere and pass a reference"
        )
    return text


_LONE_SURROGATE = re.compile(r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}")
_SCALARS = (str, int, float, bool, type(None))


def _refuse(what: str, value: Any, predicate: Callable[[object], bool], problem: str) -> None:
    """Raise with the path of the first string that has the problem; a false alarm of the text scan
    (a literal backslash followed by `u0000` or `ud800`) finds none and returns."""
    found = _find(what, value, predicate)
    if found is not None:
        raise InvalidJobError(f"{found[0]} {problem}")


def _find(what: str, value: Any, predicate: Callable[[object], bool]) -> tuple[str, object] | None:
    """The first item (or dict key) for which `predicate` holds, if any, with `what` and its key path."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, Mapping):
            children = []
            for key, child in item.items():
                step = f"{path}[{json.dumps(key) if isinstance(key, str) else repr(key)}]"
                if predicate(key) or not isinstance(key, _SCALARS):
                    return f"{what} at {step} (a key)", key
                children.append((step, child))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{path}[{index}]", child) for index, child in enumerate(item)]))
        elif predicate(item):
            return (f"{what} at {path}" if path else what), item
    return None


def _unencodable(item: object) -> bool:
    if isinstance(item, float):
        return not math.isfinite(item)
    return not isinstance(item, (*_SCALARS, Mapping, list, tuple))


def _has_nul(item: object) -> bool:
    return isinstance(item, str) and "\x00" in item


def _has_lone_surrogate(item: object) -> bool:
    if not isinstance(item, str) or item.isascii():
        return False
    try:
        item.encode()
    except UnicodeEncodeError:
        return True
    return False


def _too_deep(value: Any) -> bool:
    """Whether containers in `value` nest more than `MAX_JSON_DEPTH` deep (found without recursion)."""
    stack: list[tuple[int, Any]] = [(1, value)]
    while stack:
        depth, item = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return True
        stack.extend((depth + 1, child) for child in children)
    return False


def validate_text(what: str, value: object, limit: int = MAX_NAME_BYTES) -> str:
    """A non-empty string without NUL or lone surrogates, at most `limit` bytes in UTF-8."""
    if not isinstance(value, str):
        raise InvalidJobError(f"{what} must be a string, got {value!r}")
    if not value.strip():
        raise InvalidJobError(f"{what} must not be empty")
    if "\x00" in value:
        raise InvalidJobError(f"{what} must not contain NUL characters")
    if value.isascii():
        size = len(value)
    else:
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise InvalidJobError(
                f"{what} contains a lone surrogate (half of a UTF-16 pair, not a character): {value!a:.80}"
            ) from None
    if size > limit:
        raise InvalidJobError(f"{what} is {size} bytes long in UTF-8, at most {limit} are allowed")
    return value


def validate_tags(what: str, value: object) -> tuple[str, ...] | None:
    """Tags as stored: a list (or tuple) of at most `MAX_TAGS` different non-blank strings without NUL
    of at most `MAX_TAG_CHARACTERS` characters each, repeats dropped (the first kept, in order); None
    for none. The SQL API's option_tags (sql/current.sql) takes the same and refuses the same."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidJobError(f"{what} must be a list of strings, got {value!r:.80}")
    tags: dict[str, None] = {}
    for index, tag in enumerate(value):
        if not isinstance(tag, str):
            raise InvalidJobError(f"{what} must hold strings only, item {index} is {tag!r:.80}")
        if not tag.strip():
            raise InvalidJobError(f"{what} must not hold an empty tag (item {index})")
        if len(tag) > MAX_TAG_CHARACTERS:
            raise InvalidJobError(
                f"{what} holds a tag of {len(tag)} characters (item {index}), at most {MAX_TAG_CHARACTERS} are allowed"
            )
        if "\x00" in tag:
            raise InvalidJobError(f"{what} must not hold NUL characters (item {index})")
        if not tag.isascii():
            try:
                tag.encode()
            except UnicodeEncodeError:
                raise InvalidJobError(
                    f"{what} item {index} contains a lone surrogate (half of a UTF-16 pair, not a character)"
                ) from None
        tags[tag] = None
    if len(tags) > MAX_TAGS:
        raise InvalidJobError(f"{what} has {len(tags)} different tags, at most {MAX_TAGS} are allowed")
    return tuple(tags) or None


def _int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(f"{what} must be an integer, got {value!r}")
    return value


def follow_up_groups(specs: Sequence[JobSpec], callback: str | None = None) -> list[uuid.UUID]:
    """The group ids the follow-ups (`then=`, at any depth) of `specs` name, and those of a group's
    `callback` (its spec as JSON) and its own follow-ups."""
    groups: set[uuid.UUID] = set()
    for then_json in [*(spec.then for spec in options_of(specs)), callback]:
        then = json.loads(then_json) if then_json is not None else None
        while isinstance(then, dict):
            if then.get("group_id") is not None:
                groups.add(uuid.UUID(then["group_id"]))
            then = then.get("then")
    return sorted(groups)


def refuse_follow_up_groups(groups: list[uuid.UUID]) -> None:
    if groups:
        raise InvalidStateError(
            f"group {groups[0]} has a callback: its members are the jobs schedule_group scheduled with it "
            "(a then= follow-up cannot join it)"
        )
