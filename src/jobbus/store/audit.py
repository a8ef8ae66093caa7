"""Statements of the audit trail (`sql/queries/audit.sql`): recording an action in its own transaction,
reading the trail newest first (the leader's retention is in `maintenance.py`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from jobbus.audit import Acting, AuditEntry, acting, gathered
from jobbus.requests import new_job_id
from jobbus.store.statements import Chain, Operation, Row, Statement, UnlessMissing, queries

T = TypeVar("T")

#: The keyset's ends: after every entry, before every entry.
_NEWEST = (datetime(9999, 12, 31, tzinfo=UTC), uuid.UUID(int=(1 << 128) - 1))
_OLDEST = datetime(1, 1, 2, tzinfo=UTC)


class AuditStore:
    """Builds the audit statements of one schema."""

    def __init__(self, schema: str) -> None:
        self._q = queries(schema)

    def record(
        self,
        action: str,
        target: str,
        details: Mapping[str, Any] | None = None,
        *,
        who: Acting | None = None,
        entry_id: uuid.UUID | None = None,
    ) -> UnlessMissing[None]:
        """One entry, written as the schema's owner (`record_audit`) and dated by the transaction it runs
        in: run it in the transaction of the action it describes. `who` defaults to `jobbus.acting_as`'s;
        an entry repeated with the same `entry_id` is written once. On a schema that has no audit trail
        yet (new code before `jobbus migrate`, in a rolling deploy) it writes nothing and the action
        goes on."""
        who = who or acting()
        params = {
            "id": entry_id or new_job_id(),
            "actor": who.actor,
            "source": who.source,
            "action": action,
            "target": target,
            "details": json.dumps(dict(details or {}), default=str, separators=(",", ":")),
        }
        return UnlessMissing(Statement(self._q["record_audit"], params, lambda _rows, _count: None), None)

    def audited(
        self,
        operation: Operation[T],
        action: str,
        target: str,
        effect: Callable[[T], Mapping[str, Any] | None],
    ) -> Chain[T]:
        """`operation`, then in its transaction its entry when it took effect: `effect(result)` gives
        the entry's details, or None when the action changed nothing (then nothing is recorded). Who
        acts is read now, from the caller's context; a repeat of the operation writes no second entry."""
        who, entry_id, gathering = acting(), new_job_id(), gathered()

        def then(result: T) -> UnlessMissing[None] | None:
            details = effect(result)
            if details is None:
                return None
            if gathering is not None:
                gathering.append(target)
                return None
            return self.record(action, target, details, who=who, entry_id=entry_id)

        return Chain(operation, then)

    def key_rotation(self, key_id: str, rewritten: int, *, entry_id: uuid.UUID | None = None) -> UnlessMissing[None]:
        """The entry of `jobbus keys rotate`: every stored payload re-encrypted with key `key_id`
        (`rewritten` of them). Run it in the transaction of the rotation's last batch."""
        return self.record("rotate_keys", f"key:{key_id}", {"count": rewritten}, entry_id=entry_id)

    def entries(
        self,
        *,
        since: datetime | None = None,
        before: tuple[datetime, uuid.UUID] | None = None,
        limit: int = 100,
    ) -> Statement[list[AuditEntry]]:
        """Up to `limit` entries newest first, from `since` on, after the entry `before` (its `at` and
        `id`) of the page before: one index range scan however long the trail."""
        before_at, before_id = before or _NEWEST
        params = {
            "since": since or _OLDEST,
            "before_at": before_at,
            "before_id": before_id,
            "limit": limit,
        }

        def decode(rows: list[Row], _: int) -> list[AuditEntry]:
            return [AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6] or {}) for r in rows]

        return Statement(self._q["list_audit"], params, decode)
