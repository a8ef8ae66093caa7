"""Settings: defaults, `JOBBUS_*` environment variables and validation.

A keyword given to `App(...)` wins over the environment, including an explicit ``None``; every invalid
value raises a `ValueError` that names the setting. Numeric settings have finite ranges (`BOUNDS`), so a
value that validates here never fails later as an interval, timestamp or integer out of range.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("jobbus.settings")

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: A cell's name (SPEC 23): 1 to 63 of lower-case letters, digits, `_` and `-`.
_CELL_NAME = re.compile(r"^[a-z0-9_-]{1,63}$")
#: Schemas PostgreSQL keeps for itself (`pg_*` cannot be created) or that every role shares.
_RESERVED_SCHEMAS = frozenset({"public", "information_schema"})

INT32_MAX = 2**31 - 1
DAY = 86_400.0
YEAR = 365 * DAY

#: `JOBBUS_*` variables the project reads that are not settings: never reported as unknown.
NON_SETTING_VARIABLES = frozenset(
    {"JOBBUS_TEST_DSN", "JOBBUS_FULL_FAULTS", "JOBBUS_DASHBOARD_TOKEN", "JOBBUS_BROWSER_FULL", "JOBBUS_CHROMIUM"}
)
#: What an environment variable writes for None in a setting that accepts it.
_NONE_WORDS = frozenset({"", "none", "null"})

#: Passwords of DSNs, in pieces that `jobbus.redaction` builds its own pattern from. Every repetition is
#: bounded and nothing taken is given back, so a match tried at any point reads a bounded stretch of the
#: text (the unbounded forms read to the end of the text from every `a://b:` of it: 31 s for 180 KB).
#: `scheme://user:`, tried only where a run of scheme characters starts; schemes and users longer
#: than these bounds are not DSNs.
DSN_URI_USER = r"(?<![a-z0-9+.-])[0-9+.-]{0,32}+[a-z][a-z0-9+.-]{0,32}+://[^:/@\s]{0,256}+:"
#: The password after `DSN_URI_USER`, up to 1024 characters, ended by `@`. It never crosses white
#: space, a double quote or another `://`: a URI that names no password (`https://host:443/...`) is
#: not read on into the next one, nor into the next JSON string.
DSN_URI_PASSWORD = r"""(?:[^@\s:"]|:(?!//)){0,1024}+"""
#: `password=...` (key/value DSNs and URI queries), quoted or not, its value up to 1024 characters.
_PASSWORD_PARAMETER = re.compile(
    r"(password\s{0,16}+=\s{0,16}+)('(?:[^'\\]|\\.){0,1024}+'?|[^\s&'\"]{1,1024}+)", re.IGNORECASE
)
_URI_PASSWORD = re.compile(f"({DSN_URI_USER}){DSN_URI_PASSWORD}@", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with every password of a DSN in it replaced by `***` (for reprs, errors and logs), in
    time linear in its length. `jobbus.redaction.redact_text` masks these and every other secret."""
    if "password" not in text.lower() and "://" not in text:
        return text
    text = _PASSWORD_PARAMETER.sub(r"\1***", text)
    return _URI_PASSWORD.sub(r"\1***@", text)


def validate_identifier(what: str, name: str) -> str:
    """Schema and role names are plain lower-case identifiers; anything else is refused, never quoted around."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(
            f"{what}: {name!r} is not a valid name "
            "(lower-case letters, digits and underscores, starting with a letter or underscore, at most 63)"
        )
    return name


def validate_schema_name(name: str) -> str:
    """A schema jobbus may own: a plain identifier, and not one PostgreSQL reserves or every role shares."""
    validate_identifier("schema", name)
    if name in _RESERVED_SCHEMAS or name.startswith("pg_"):
        raise ValueError(
            f"schema {name!r} is reserved (pg_*, public and information_schema belong to PostgreSQL "
            "or to every role); choose a schema of jobbus's own, e.g. jobbus"
        )
    return name


@dataclass(frozen=True, slots=True)
class Bounds:
    """The finite range of a numeric setting; a bound is included unless marked open."""

    low: float
    high: float
    unit: str = ""
    low_open: bool = False
    high_open: bool = False

    def check(self, name: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number, got {value!r}")
        above_low = value > self.low if self.low_open else value >= self.low
        below_high = value < self.high if self.high_open else value <= self.high
        if not (above_low and below_high):  # also refuses NaN
            raise ValueError(f"{name} must be {self.describe()}, got {value!r}")

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        low = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        high = f"< {self.high:g}" if self.high_open else f"<= {self.high:g}"
        return f"{low} and {high}{unit}"


#: Every numeric setting and its range; adding a setting is one line here. The upper bounds keep
#: `now() + interval` and 32-bit columns far from overflow; the lower ones keep loops from spinning.
BOUNDS: dict[str, Bounds] = {
    "default_max_attempts": Bounds(1, INT32_MAX),
    "lease_seconds": Bounds(0.1, 7 * DAY, "seconds"),
    "retry_base_delay_seconds": Bounds(0, YEAR, "seconds"),
    "retry_max_delay_seconds": Bounds(0, YEAR, "seconds"),
    "retry_jitter": Bounds(0, 1, high_open=True),
    "poll_interval_seconds": Bounds(0.01, DAY, "seconds"),
    "heartbeat_interval_seconds": Bounds(0.01, 7 * DAY, "seconds"),
    "pool_max_size": Bounds(2, 10_000),
    "max_payload_bytes": Bounds(1024, 128 * 1024 * 1024, "bytes"),
    "worker_dead_after_seconds": Bounds(0.1, 7 * DAY, "seconds"),
    "database_wait_seconds": Bounds(0, DAY, "seconds"),
    "retention_completed_seconds": Bounds(0, 100 * YEAR, "seconds"),
    "retention_cancelled_seconds": Bounds(0, 100 * YEAR, "seconds"),
    "retention_failed_seconds": Bounds(0, 100 * YEAR, "seconds"),
    "retention_event_seconds": Bounds(0, 100 * YEAR, "seconds"),
    # At least a day: `delete_old_audit` refuses less, so no role can erase the recent trail.
    "retention_audit_seconds": Bounds(DAY, 100 * YEAR, "seconds"),
    "stats_interval_seconds": Bounds(0.1, DAY, "seconds"),
    "cancel_grace_seconds": Bounds(0, 7 * DAY, "seconds"),
}


@dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """Everything an App needs to know, validated at once.

    Precedence: a keyword given to `App(...)` / `Settings.load`, then `JOBBUS_<NAME>` in the
    environment, then the default. An explicit keyword always wins, ``None`` included: for settings
    where None means something (`heartbeat_interval_seconds`, `listen_dsn`) it selects that meaning,
    for the others it is refused. The one exception is `dsn`: ``dsn=None`` means "not given", so
    ``App(dsn=os.environ.get("DATABASE_URL"))`` still falls back to `JOBBUS_DSN`. In the environment,
    an empty value or ``none`` stands for None.

    `repr()` and `str()` never show a password of `dsn` or `listen_dsn`.
    """

    dsn: str | None = None
    schema: str = "jobbus"
    default_max_attempts: int = 3
    lease_seconds: float = 300.0
    retry_base_delay_seconds: float = 30.0
    retry_max_delay_seconds: float = 1800.0
    retry_jitter: float = 0.20
    poll_interval_seconds: float = 1.0
    #: How often a worker renews its leases and reads cancellation flags and control commands.
    #: None means min(lease_seconds / 3, 5).
    heartbeat_interval_seconds: float | None = None
    #: Connections per App pool (producers and workers).
    pool_max_size: int = 10
    #: Largest JSON accepted for a job's configuration, a checkpoint or a result, in bytes.
    max_payload_bytes: int = 1_048_576
    #: Behind PgBouncer in transaction mode: no prepared statements and no session state on pooled
    #: connections; LISTEN only on `listen_dsn` (a direct server DSN), else polling only.
    transaction_pooling: bool = False
    #: DSN for the worker's LISTEN connection; defaults to `dsn` (unless `transaction_pooling`).
    listen_dsn: str | None = None
    #: A worker whose registry row stays silent this long is declared dead and its jobs are recovered,
    #: long before their leases expire. A worker that cannot refresh its row stops its handlers'
    #: outcomes after two thirds of this, before anyone can declare it dead.
    worker_dead_after_seconds: float = 15.0
    #: How long finished jobs are kept before the leader deletes them; None keeps them forever.
    retention_completed_seconds: float | None = 86400.0
    retention_cancelled_seconds: float | None = 86400.0
    retention_failed_seconds: float | None = 604800.0
    #: How long emitted events and the bookkeeping of finished groups (their callback scheduled) are
    #: kept before the leader deletes them; None keeps them forever.
    retention_event_seconds: float | None = 604800.0
    #: How often the leader samples every queue's counts into `queue_stat` (metrics, dashboard).
    stats_interval_seconds: float = 10.0
    #: How long a producer or admin call waits for an unreachable database (a connection from the pool,
    #: repeats of statements that are safe to repeat) before raising `DatabaseUnavailableError`.
    database_wait_seconds: float = 10.0
    #: How long an async handler may run on after `cancel()` is seen (its `cancellation_requested` is
    #: true) before its task is cancelled; None never cancels it. Sync handlers are never interrupted.
    cancel_grace_seconds: float | None = 30.0
    #: Keys that encrypt payloads at rest, newest first (`jobbus.encryption`; `JOBBUS_ENCRYPTION_KEYS`
    #: comma-separated): the newest seals what is written, any of them opens what it sealed. Never shown.
    encryption_keys: tuple[str, ...] = ()
    #: How long entries of the audit trail are kept before the leader deletes them (at least a day,
    #: default 90 days); None keeps them forever.
    retention_audit_seconds: float | None = 7776000.0
    #: Cells (SPEC 23): name → DSN, in order, the first the default, instead of `dsn`; None: one database.
    #: `JOBBUS_CELLS` writes them as `name=dsn` pairs separated by `;`.
    cells: dict[str, str] | None = None
    #: Queue → the cell its jobs live in (needs `cells`); a queue not named lives in the first cell.
    #: `JOBBUS_QUEUE_CELLS` writes them as `queue=cell` pairs separated by `;`.
    queue_cells: dict[str, str] | None = None

    def __post_init__(self) -> None:
        validate_schema_name(self.schema)
        if self.cells is not None or self.queue_cells is not None:
            cells, queue_cells = validate_cells(self.cells, self.queue_cells, self.dsn, self.listen_dsn)
            object.__setattr__(self, "cells", cells)
            object.__setattr__(self, "queue_cells", queue_cells)
        if not isinstance(self.encryption_keys, tuple):  # dataclasses.replace (App.reconfigure) does not coerce
            object.__setattr__(self, "encryption_keys", _keys("encryption_keys", self.encryption_keys))
        for name, bounds in BOUNDS.items():
            value = getattr(self, name)
            if value is not None or not _nullable(name):
                bounds.check(name, value)
        _require(
            self.retry_max_delay_seconds >= self.retry_base_delay_seconds,
            "retry_max_delay_seconds",
            "must be >= retry_base_delay_seconds",
            self.retry_max_delay_seconds,
        )
        if self.heartbeat_interval_seconds is not None:
            _require(
                self.heartbeat_interval_seconds < self.lease_seconds,
                "heartbeat_interval_seconds",
                "must be < lease_seconds",
                self.heartbeat_interval_seconds,
            )
        _require(
            self.worker_dead_after_seconds >= 3 * self.heartbeat_seconds,
            "worker_dead_after_seconds",
            f"must be at least 3 heartbeat intervals ({3 * self.heartbeat_seconds:g} s)",
            self.worker_dead_after_seconds,
        )

    def __repr__(self) -> str:
        values = ", ".join(
            f"{f.name}={_shown(f.name, getattr(self, f.name))}" for f in dataclasses.fields(self) if f.repr
        )
        return f"Settings({values})"

    def as_dict(self) -> dict[str, Any]:
        """Every setting by name: ``App(**settings.as_dict())`` builds an App with the same settings."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def connection_kwargs(self) -> dict[str, Any]:
        """psycopg connection options: autocommit always; server-side prepared statements unless pooled."""
        return {"autocommit": True, "prepare_threshold": None if self.transaction_pooling else 5}

    @property
    def notification_dsn(self) -> str | None:
        """Where a worker LISTENs, or None for polling only."""
        if self.listen_dsn:
            return self.listen_dsn
        return None if self.transaction_pooling else self.dsn

    @property
    def fence_after_seconds(self) -> float:
        """A worker that could not refresh its registry row this long stops its handlers' outcomes."""
        return self.worker_dead_after_seconds * 2.0 / 3.0

    @property
    def heartbeat_seconds(self) -> float:
        if self.heartbeat_interval_seconds is not None:
            return self.heartbeat_interval_seconds
        return min(self.lease_seconds / 3.0, 5.0)

    @classmethod
    def load(cls, overrides: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from keywords, then `JOBBUS_<NAME>` variables, then defaults.

        Unknown `JOBBUS_*` variables (a misspelt setting is otherwise silently ignored) are logged as one
        WARNING per call that names the closest setting.
        """
        env = os.environ if environ is None else environ
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}; known: {', '.join(fields)}")
        _warn_unknown_variables(env, fields)
        values: dict[str, Any] = {}
        for name, field in fields.items():
            variable = f"JOBBUS_{name.upper()}"
            if name in overrides and not (name == "dsn" and overrides[name] is None):
                values[name] = _coerce(name, str(field.type), overrides[name], variable)
            elif variable in env:
                values[name] = _coerce(name, str(field.type), env[variable], variable, from_environment=True)
        if values.get("dsn") and values.get("cells"):
            # One database or cells: a keyword wins over the other's variable, as it does for any setting.
            if overrides.get("cells") is not None and overrides.get("dsn") is None:
                del values["dsn"]
            elif overrides.get("dsn") is not None and overrides.get("cells") is None:
                del values["cells"]
                if overrides.get("queue_cells") is None:
                    values.pop("queue_cells", None)
        return cls(**values)


def validate_cells(
    cells: object, queue_cells: object, dsn: str | None, listen_dsn: str | None
) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """`cells` and `queue_cells` checked and copied (a `name=dsn;...` string is read as the environment
    writes it), or a `ValueError` that names the setting at fault."""
    cell_map = _pairs("cells", "name=dsn", cells) if cells is not None else None
    queue_map = _pairs("queue_cells", "queue=cell", queue_cells) if queue_cells is not None else None
    if not cell_map:
        if cells is not None:
            raise ValueError("cells must name at least one cell (name → dsn); leave it out for one database")
        if queue_map:
            raise ValueError("queue_cells places queues in cells: it needs cells too")
        return None, None
    if dsn:
        raise ValueError("dsn and cells are both given: give cells (several databases) or dsn (one), not both")
    if listen_dsn:
        raise ValueError("listen_dsn names one database and cells are several: leave listen_dsn out with cells")
    for name, cell_dsn in cell_map.items():
        if not _CELL_NAME.match(name):
            raise ValueError(
                f"cells: {name!r} is not a valid cell name (1 to 63 of lower-case letters, digits, '_' and '-')"
            )
        if not cell_dsn.strip():
            raise ValueError(f"cells: cell {name!r} has an empty dsn")
    for queue, cell in (queue_map or {}).items():
        if not queue.strip() or len(queue.encode(errors="replace")) > 255:
            raise ValueError(f"queue_cells: {queue!r} is not a queue name (1 to 255 bytes)")
        if cell not in cell_map:
            raise ValueError(
                f"queue_cells: queue {queue!r} is placed in cell {cell!r}, which is not one of the cells "
                f"({', '.join(cell_map)})"
            )
    return cell_map, queue_map


def _pairs(name: str, form: str, value: object) -> dict[str, str]:
    """A mapping of strings to strings, in order, from a mapping or from `a=x;b=y` text (repeats refused)."""
    if isinstance(value, str):
        pairs: dict[str, str] = {}
        for part in value.split(";"):
            if not part.strip():
                continue
            key, equals, text = part.partition("=")
            key = key.strip()
            if not equals or not key:
                raise ValueError(f"{name}: {redact(part.strip())!r} is not a {form} pair (pairs are separated by ';')")
            if key in pairs:
                raise ValueError(f"{name}: {key!r} is given twice")
            pairs[key] = text.strip()
        return pairs
    if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    raise ValueError(f"{name} must be a mapping of strings ({form}) or '{form};...' text, got {type(value).__name__}")


def _nullable(name: str) -> bool:
    return "None" in str(Settings.__dataclass_fields__[name].type)


def _shown(name: str, value: object) -> str:
    if name in ("dsn", "listen_dsn") and isinstance(value, str):
        return repr(redact(value))
    if name == "cells" and isinstance(value, dict):
        return repr({cell: redact(dsn) for cell, dsn in value.items()})
    if name == "encryption_keys" and isinstance(value, tuple):
        return f"<{len(value)} key{'' if len(value) == 1 else 's'}>"
    return repr(value)


def _warn_unknown_variables(env: Mapping[str, str], fields: Mapping[str, Any]) -> None:
    known = [f"JOBBUS_{name.upper()}" for name in fields]
    unknown = sorted(
        name for name in env if name.startswith("JOBBUS_") and name not in known and name not in NON_SETTING_VARIABLES
    )
    if not unknown:
        return
    described = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        described.append(f"{name} (did you mean {close[0]}?)" if close else name)
    logger.warning(
        "ignoring unknown environment variable(s) %s; settings are %s",
        ", ".join(described),
        ", ".join(known),
        extra={"unknown_variables": unknown},
    )


def _require(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} {rule}, got {value!r}")


def _keys(name: str, value: Any) -> tuple[str, ...]:
    """A comma-separated string (newest first) or a list of strings; checked as keys by `jobbus.encryption`."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ValueError(f"{name} must be a list of keys (strings), newest first, got a {type(value).__name__}")


def _coerce(name: str, type_name: str, value: Any, variable: str, *, from_environment: bool = False) -> Any:
    """Turn keyword or environment values into the field's type, refusing what does not fit."""
    kinds = [part.strip() for part in type_name.split("|")]
    kind = kinds[0]
    if kind.startswith("tuple"):
        return _keys(name, value)
    if kind.startswith("dict"):
        if value is None or (from_environment and value.strip().lower() in _NONE_WORDS):
            return None
        return value  # checked by validate_cells
    if value is None or (from_environment and "None" in kinds and value.strip().lower() in _NONE_WORDS):
        if "None" in kinds:
            return None
        raise ValueError(f"{name} cannot be None: omit it to use {variable} or the default")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        return value
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a{'n integer' if kind == 'int' else ' number'}, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number
