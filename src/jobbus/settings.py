"""Settings: defaults, `JOBBUS_*` environment variables and validation.

A keyword given to `App(...)` wins over the environment; every invalid value raises a `ValueError`
that names the setting.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def validate_identifier(what: str, name: str) -> str:
    """Schema and role names are plain lower-case identifiers; anything else is refused, never quoted around."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(
            f"{what}: {name!r} is not a valid name "
            "(lower-case letters, digits and underscores, starting with a letter or underscore, at most 63)"
        )
    return name


def validate_schema_name(name: str) -> str:
    return validate_identifier("schema", name)


@dataclass(frozen=True, slots=True)
class Settings:
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
    #: How long a producer or admin call waits for an unreachable database (a connection from the pool,
    #: repeats of statements that are safe to repeat) before raising `DatabaseUnavailableError`.
    database_wait_seconds: float = 10.0

    def __post_init__(self) -> None:
        validate_schema_name(self.schema)
        _require(self.default_max_attempts >= 1, "default_max_attempts", "must be >= 1", self.default_max_attempts)
        _require(self.lease_seconds > 0, "lease_seconds", "must be > 0", self.lease_seconds)
        _require(
            self.retry_base_delay_seconds >= 0,
            "retry_base_delay_seconds",
            "must be >= 0",
            self.retry_base_delay_seconds,
        )
        _require(
            self.retry_max_delay_seconds >= self.retry_base_delay_seconds,
            "retry_max_delay_seconds",
            "must be >= retry_base_delay_seconds",
            self.retry_max_delay_seconds,
        )
        _require(0 <= self.retry_jitter < 1, "retry_jitter", "must be in [0, 1)", self.retry_jitter)
        _require(self.poll_interval_seconds > 0, "poll_interval_seconds", "must be > 0", self.poll_interval_seconds)
        if self.heartbeat_interval_seconds is not None:
            _require(
                0 < self.heartbeat_interval_seconds < self.lease_seconds,
                "heartbeat_interval_seconds",
                "must be > 0 and < lease_seconds",
                self.heartbeat_interval_seconds,
            )
        _require(
            self.worker_dead_after_seconds >= 3 * self.heartbeat_seconds,
            "worker_dead_after_seconds",
            f"must be at least 3 heartbeat intervals ({3 * self.heartbeat_seconds:g} s)",
            self.worker_dead_after_seconds,
        )
        _require(self.database_wait_seconds >= 0, "database_wait_seconds", "must be >= 0", self.database_wait_seconds)
        _require(self.pool_max_size >= 2, "pool_max_size", "must be >= 2", self.pool_max_size)
        _require(self.max_payload_bytes >= 1024, "max_payload_bytes", "must be >= 1024", self.max_payload_bytes)

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
        """Build settings from keywords, then `JOBBUS_<NAME>` variables, then defaults."""
        env = os.environ if environ is None else environ
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}; known: {', '.join(fields)}")
        values: dict[str, Any] = {}
        for name, field in fields.items():
            if name in overrides and overrides[name] is not None:
                values[name] = _coerce(name, str(field.type), overrides[name])
            elif f"JOBBUS_{name.upper()}" in env:
                values[name] = _coerce(name, str(field.type), env[f"JOBBUS_{name.upper()}"])
        return cls(**values)


def _require(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} {rule}, got {value!r}")


def _coerce(name: str, type_name: str, value: Any) -> Any:
    """Turn keyword or environment values into the field's type, refusing what does not fit."""
    kind = type_name.split("|")[0].strip()
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
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a{'n integer' if kind == 'int' else ' number'}, got {value!r}") from None
