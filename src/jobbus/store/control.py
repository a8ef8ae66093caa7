"""Statements of the operator control plane (`sql/queries/control.sql`) and the rows they read."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from jobbus.store.statements import Row, Statement, channel_name, queries


@dataclass(frozen=True, slots=True)
class IssuedRow:
    """What `issue_command` wrote: the generation, the workers (and instances) it addresses, when."""

    generation: int
    worker_ids: tuple[str, ...]
    instance_ids: tuple[uuid.UUID | None, ...]
    issued_at: datetime
    pause_changed: bool  # pause added a target / resume removed one (False: it was already so)


@dataclass(frozen=True, slots=True)
class WorkerAck:
    id: str
    instance_id: uuid.UUID | None
    acked_generation: int
    state: str
    silent: bool
    declared_dead: bool


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One row of the worker registry, as read at one instant.

    `state` is what the worker last reported (running, paused, draining, stopping, stopped); `gone` is
    true when a worker that did not stop has not refreshed its row within its own lease (or its own
    dead-after time, when shorter): it died, hangs, or lost its database connection. `display_state`
    folds the two for humans.
    """

    id: str
    host: str
    pid: int
    queues: tuple[str, ...] | None  # None: every queue
    types: tuple[str, ...]
    concurrency: int
    state: str
    in_flight: int
    completed: int
    failed: int
    acked_generation: int
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    gone: bool
    seen_seconds_ago: float
    #: Holds the leadership lease now: it runs recovery, retention and the other maintenance services.
    leader: bool = False

    @property
    def display_state(self) -> str:
        return "gone" if self.gone else self.state

    @property
    def live(self) -> bool:
        return not self.gone and self.state != "stopped"

    @property
    def done(self) -> int:
        """Jobs this worker finished (completed or failed) since it started."""
        return self.completed + self.failed


@dataclass(frozen=True, slots=True)
class UnhandledWork:
    """Queued jobs of one (queue, type) that no live worker can take: none handles the type in that
    queue, or none serves the queue, or no worker is alive at all. `queued` counts at most the cap
    the reader asked for (`capped` says it was reached)."""

    queue: str
    type: str
    queued: int
    capped: bool = False


@dataclass(frozen=True, slots=True)
class PauseTarget:
    kind: str  # all, queue or worker
    target: str  # '' for all
    paused_at: datetime


class ControlStore:
    """Builds the control-plane statements of one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.control_channel = channel_name(schema, "_control")
        self._q = queries(schema)

    def lock_commands(self) -> Statement[None]:
        return Statement(self._q["lock_commands"], {}, lambda rows, _: None)

    def issue_command(self, *, action: str, target_kind: str, target: str) -> Statement[IssuedRow]:
        """Change the durable pause state and record the command; run after `lock_commands`, same transaction."""
        params = {"action": action, "target_kind": target_kind, "target": target, "channel": self.control_channel}

        def decode(rows: list[Row], _: int) -> IssuedRow:
            generation, worker_ids, instance_ids, issued_at, changed, _notified = rows[0]
            return IssuedRow(int(generation), tuple(worker_ids), tuple(instance_ids), issued_at, bool(changed))

        return Statement(self._q["issue_command"], params, decode)

    def worker_acks(self, worker_ids: Sequence[str]) -> Statement[dict[str, WorkerAck]]:
        def decode(rows: list[Row], _: int) -> dict[str, WorkerAck]:
            return {r[0]: WorkerAck(r[0], r[1], int(r[2]), r[3], bool(r[4]), bool(r[5])) for r in rows}

        return Statement(self._q["worker_acks"], {"ids": list(worker_ids)}, decode)

    def forget_workers(self, *, forget_after_seconds: float) -> Statement[int]:
        params = {"forget_after_seconds": forget_after_seconds}
        return Statement(self._q["forget_workers"], params, lambda _, rowcount: rowcount)

    def list_workers(self) -> Statement[list[WorkerInfo]]:

        def decode(rows: list[Row], _: int) -> list[WorkerInfo]:
            return [
                WorkerInfo(
                    id=r[0],
                    host=r[1],
                    pid=int(r[2]),
                    queues=tuple(r[3]) if r[3] is not None else None,
                    types=tuple(r[4]),
                    concurrency=int(r[5]),
                    state=r[6],
                    in_flight=int(r[7]),
                    completed=int(r[8]),
                    failed=int(r[9]),
                    acked_generation=int(r[10]),
                    started_at=r[11],
                    last_seen_at=r[12],
                    stopped_at=r[13],
                    gone=bool(r[14]),
                    seen_seconds_ago=max(0.0, float(r[15])),
                    leader=bool(r[16]),
                )
                for r in rows
            ]

        return Statement(self._q["list_workers"], {}, decode)

    def unhandled_work(self, *, cap: int | None = None) -> Statement[list[UnhandledWork]]:
        """Every (queue, type) with queued jobs that no live worker takes, with its count (at most `cap`).
        One index probe per queued pair (`queued_pairs()`), then one bounded index count per pair left."""

        def decode(rows: list[Row], _: int) -> list[UnhandledWork]:
            return [UnhandledWork(r[0], r[1], int(r[2]), cap is not None and int(r[2]) >= cap) for r in rows]

        return Statement(self._q["unhandled_work"], {"cap": cap}, decode)

    def pause_targets(self) -> Statement[list[PauseTarget]]:
        return Statement(self._q["pause_targets"], {}, lambda rows, _: [PauseTarget(*r) for r in rows])

    def count_prunable(self, *, older_than_seconds: float, statuses: Sequence[str]) -> Statement[int]:
        params = {"older_than_seconds": older_than_seconds, "statuses": list(statuses)}
        return Statement(self._q["count_prunable"], params, lambda rows, _: int(rows[0][0]))
