"""Key rotation (`jobbus keys rotate`): every stored payload re-encrypted with the newest key, online.

Pages of rows are read in key order without locks and written back by compare-and-set on the text read,
each page its own transaction: workers go on claiming, checkpointing and completing, a value one of them
wrote meanwhile is kept (it is sealed with the newest key, or read again by the next pass), and a
rotation killed at any point loses nothing and resumes where it stopped (rows already under the newest
key are not read again). Payloads sealed with a key that is not listed are left as they are and counted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobbus.encryption import BIND_ID, BIND_TYPE, Keyring, MissingKeyError, UnreadablePayloadError
from jobbus.execution import RESERVED_PREFIXES
from jobbus.jsontext import dumps, loads
from jobbus.models import TRACE_KEY
from jobbus.store import run_async
from jobbus.store.keys import FIRST, KeyStore, PayloadChange
from jobbus.store.statements import Row

if TYPE_CHECKING:
    from jobbus.app import App

#: What is rotated, in this order: jobs' own columns, step results, follow-ups and group callbacks not
#: scheduled yet, and the children kept for a parent's `wait_for_children`.
TABLES = ("jobs", "steps", "follow_ups", "groups", "snapshots")
MAX_PASSES = 20


@dataclass(frozen=True, slots=True)
class RotationProgress:
    """Where a rotation is: the table, rows read and rewritten in it so far, and the jobs to do at the start."""

    table: str
    read: int
    rewritten: int
    jobs_at_start: int


@dataclass(slots=True)
class RotationReport:
    """What a rotation did: rows rewritten per table, passes, and payloads it could not rotate."""

    key_id: str
    rewritten: Counter[str] = field(default_factory=Counter)
    passes: int = 0
    #: Payloads sealed with a key that is not listed, by key id: left as they are.
    missing: Counter[str] = field(default_factory=Counter)
    #: Payloads that no listed key opens (altered, or copied from another row): left as they are.
    unreadable: int = 0

    @property
    def complete(self) -> bool:
        return not self.missing and not self.unreadable


async def rotate_keys(
    app: App, *, batch_size: int = 500, progress: Callable[[RotationProgress], None] | None = None
) -> RotationReport:
    """Re-encrypt every stored payload with the newest of `app`'s keys, in pages of `batch_size` rows."""
    keyring = app.registry.keyring
    if keyring is None:
        raise ValueError("no encryption_keys to rotate to: set JOBBUS_ENCRYPTION_KEYS (newest first)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    store = KeyStore(app.settings.schema)
    done = f"1.{keyring.newest_id}.%"
    report = RotationReport(keyring.newest_id)
    async with app.pool.connection() as conn:
        at_start = await run_async(conn, store.jobs_left(done))
    for report.passes in range(1, MAX_PASSES + 1):
        lost = 0
        for table in TABLES:
            lost += await _rotate_table(app, store, keyring, table, done, batch_size, report, at_start, progress)
        if not lost:
            break
    # One entry in the audit trail, once every page is written: what was rewritten had committed. A
    # rotation killed before this point leaves its pages rewritten and no entry; the run that resumes
    # it records what it rewrote.
    async with app.pool.connection() as conn:
        await run_async(conn, app.audit_store.key_rotation(keyring.newest_id, sum(report.rewritten.values())))
    return report


async def _rotate_table(
    app: App,
    store: KeyStore,
    keyring: Keyring,
    table: str,
    done: str,
    batch_size: int,
    report: RotationReport,
    at_start: int,
    progress: Callable[[RotationProgress], None] | None,
) -> int:
    """One pass over `table`; returns how many rows changed meanwhile (written by a worker) and were kept."""
    after: tuple[Any, ...] = (FIRST, "") if table == "steps" else (FIRST,)
    read = lost = 0
    while True:
        async with app.pool.connection() as conn:
            rows = await run_async(conn, store.page(table, done, after, batch_size))
            if not rows:
                return lost
            changes = [change for row in rows if (change := _change(keyring, table, row, report)) is not None]
            taken = await run_async(conn, store.write(table, changes)) if changes else 0
        read += len(rows)
        lost += len(changes) - taken
        report.rewritten[table] += taken
        after = (rows[-1][0], rows[-1][1]) if table == "steps" else (rows[-1][0],)
        if progress is not None:
            progress(RotationProgress(table, read, report.rewritten[table], at_start))


def _change(keyring: Keyring, table: str, row: Row, report: RotationReport) -> PayloadChange | None:
    """The row's values re-encrypted, or None when there is nothing to write (or it cannot be read)."""
    try:
        if table == "jobs":
            job_id, job_type, configuration, execution, result = row
            new = (
                keyring.resealed(configuration, "configuration", job_id, job_type),
                None if _trace_only(execution) else keyring.resealed(execution, "execution", job_id, job_type),
                keyring.resealed(result, "result", job_id, job_type),
            )
            old = (configuration, execution, result)
            if all(value is None for value in new):
                return None
            return PayloadChange(
                (job_id,), old, tuple(n if n is not None else o for n, o in zip(new, old, strict=True))
            )
        if table == "steps":
            job_id, name, job_type, result = row
            resealed = keyring.resealed(result, f"step:{name}", job_id, job_type)
            return None if resealed is None else PayloadChange((job_id, name), (result,), (resealed,))
        key, text = row
        value = loads(text)
        changed = (
            _reseal_specs(keyring, value) if table in ("follow_ups", "groups") else _reseal_snapshots(keyring, value)
        )
        return PayloadChange((key,), (text,), (dumps(value),)) if changed else None
    except MissingKeyError as exc:
        report.missing[exc.key_id] += 1
    except UnreadablePayloadError:
        report.unreadable += 1
    return None


def _trace_only(text: str | None) -> bool:
    value = None if text is None else loads(text)
    return isinstance(value, dict) and set(value) <= {TRACE_KEY}


def _reseal_specs(keyring: Keyring, spec: Any) -> bool:
    """Re-encrypt, in place, the configuration of a stored job spec and of its chain of follow-ups."""
    changed = False
    while isinstance(spec, dict):
        configuration = spec.get("configuration")
        if isinstance(configuration, dict):
            bind = BIND_TYPE if spec.get("debounce") is not None else BIND_ID
            resealed = keyring.resealed(
                dumps(configuration), "configuration", spec["id"], spec["type"], clear_bind=bind
            )
            if resealed is not None:
                spec["configuration"] = json.loads(resealed)
                changed = True
        spec = spec.get("then")
    return changed


def _reseal_snapshots(keyring: Keyring, snapshots: Any) -> bool:
    """Re-encrypt, in place, the children kept for a parent's waits (rows as `to_jsonb` wrote them)."""
    changed = False
    for children in snapshots.values() if isinstance(snapshots, dict) else ():
        for child in children if isinstance(children, list) else ():
            job_id, job_type = child.get("id"), child.get("type")
            for column, what in (
                ("configuration_data", "configuration"),
                ("execution_data", "execution"),
                ("result", "result"),
            ):
                value = child.get(column)
                if column == "execution_data" and isinstance(value, dict) and set(value) <= {TRACE_KEY}:
                    continue
                resealed = keyring.resealed(None if value is None else dumps(value), what, job_id, job_type)
                if resealed is not None:
                    child[column] = json.loads(resealed)
                    changed = True
            steps = child.get("steps")
            for name, value in steps.items() if isinstance(steps, dict) else ():
                if name.startswith(RESERVED_PREFIXES):
                    continue  # a durable wait's step: the database's functions read it
                resealed = keyring.resealed(dumps(value), f"step:{name}", job_id, job_type)
                if resealed is not None:
                    steps[name] = json.loads(resealed)
                    changed = True
    return changed
