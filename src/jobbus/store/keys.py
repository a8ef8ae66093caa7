"""Statements of key rotation (`sql/queries/keys.sql`): pages of stored payloads, written back by compare-and-set."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobbus.store.statements import Row, Statement, queries

#: Where a page starts when none was read yet (below every UUID).
FIRST = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class PayloadChange:
    """One row's values as read (`old`) and as they are to be (`new`), as JSON text."""

    key: tuple[Any, ...]
    old: tuple[str | None, ...]
    new: tuple[str | None, ...]


class KeyStore:
    """Builds the statements of one schema's key rotation."""

    def __init__(self, schema: str) -> None:
        self._q = queries(schema)

    def jobs_left(self, done: str) -> Statement[int]:
        return Statement(self._q["rekey_jobs_left"], {"done": done}, lambda rows, _: int(rows[0][0]))

    def page(self, table: str, done: str, after: tuple[Any, ...], limit: int) -> Statement[list[Row]]:
        """The next rows of `table` (jobs, steps, follow_ups, groups, snapshots) after the key `after`."""
        params: dict[str, Any] = {"done": done, "limit": limit}
        if table == "steps":
            params["after_job"], params["after_name"] = after
        else:
            params["after"] = after[0]
        return Statement(self._q[f"rekey_{table}_page"], params, lambda rows, _: rows, prepare=False)

    def write(self, table: str, changes: Sequence[PayloadChange]) -> Statement[int]:
        """Compare-and-set of `changes`; returns how many rows took every new value."""
        if table == "jobs":
            params: dict[str, Any] = {"ids": [c.key[0] for c in changes]}
            for index, column in enumerate(("c", "e", "r")):
                params[f"old_{column}"] = [c.old[index] for c in changes]
                params[f"new_{column}"] = [c.new[index] for c in changes]

            def taken(rows: list[Row], _: int) -> int:
                return sum(1 for row in rows if row[1])

            return Statement(self._q["rekey_jobs"], params, taken, prepare=False)
        params = {"old": [c.old[0] for c in changes], "new": [c.new[0] for c in changes]}
        if table == "steps":
            params["ids"] = [c.key[0] for c in changes]
            params["names"] = [c.key[1] for c in changes]
        else:
            params["ids"] = [c.key[0] for c in changes]
        return Statement(self._q[f"rekey_{table}"], params, lambda rows, _: len(rows), prepare=False)
