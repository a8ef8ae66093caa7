"""Statements of the worker registry and the worker's side of the control plane (`sql/queries/workers.sql`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from jobbus.store.jobs import RecoveredJob, decode_recovered
from jobbus.store.statements import Row, Statement, queries


@dataclass(frozen=True, slots=True)
class ControlState:
    """What the control plane says to one worker."""

    paused_all: bool
    paused_worker: bool
    paused_queues: frozenset[str]
    commands: tuple[tuple[int, str], ...]  # (generation, action) addressed to this worker, in order
    latest_generation: int


@dataclass(frozen=True, slots=True)
class Registration:
    """Who a worker process is in the registry, and the timing others judge it by."""

    worker_id: str
    instance_id: uuid.UUID
    host: str
    pid: int
    queues: Sequence[str] | None
    types: Sequence[str]
    concurrency: int
    lease_seconds: float
    dead_after_seconds: float
    heartbeat_seconds: float
    #: The most connections the process may open to the database (its pools and its LISTEN connection).
    pool_size: int


@dataclass(frozen=True, slots=True)
class DeadWorker:
    """A worker the rescuer declared dead, how long it had been silent, and the jobs taken back from it."""

    worker_id: str
    silent_seconds: float
    recovered: list[RecoveredJob]


@dataclass(frozen=True, slots=True)
class IdHolder:
    """The live process that holds a worker id another process asked for."""

    host: str
    pid: int
    seen_seconds_ago: float
    state: str
    instance_id: uuid.UUID | None
    silent_after_seconds: float


def _decode_control(worker_id: str) -> Callable[[list[Row], int], ControlState]:
    def decode(rows: list[Row], _: int) -> ControlState:
        paused_all = paused_worker = False
        queues: set[str] = set()
        commands: list[tuple[int, str]] = []
        latest = 0
        for kind, a, b, generation in rows:
            if kind == "pause":
                if a == "all":
                    paused_all = True
                elif a == "worker" and b == worker_id:
                    paused_worker = True
                elif a == "queue":
                    queues.add(b)
            elif kind == "command":
                commands.append((int(generation), a))
            else:
                latest = int(generation)
        commands.sort()
        return ControlState(paused_all, paused_worker, frozenset(queues), tuple(commands), latest)

    return decode


class WorkerStore:
    """Builds the registry and control statements of one schema."""

    def __init__(self, schema: str, channel: str, control_channel: str) -> None:
        self.schema = schema
        self.channel = channel
        self.control_channel = control_channel
        self._q = queries(schema)

    def register_worker(
        self, registration: Registration, *, replaces: uuid.UUID | None = None
    ) -> Statement[int | None]:
        """Take the id for this instance; returns the generation it starts acknowledged at, or None when a
        live worker holds the id. `replaces` names an instance known to be dead (its process is gone)."""
        r = registration
        params = {
            "replaces": replaces,
            "id": r.worker_id,
            "instance_id": r.instance_id,
            "host": r.host,
            "pid": r.pid,
            "queues": list(r.queues) if r.queues is not None else None,
            "types": list(r.types),
            "concurrency": r.concurrency,
            "lease_seconds": r.lease_seconds,
            "dead_after_seconds": r.dead_after_seconds,
            "heartbeat_seconds": r.heartbeat_seconds,
            "pool_size": r.pool_size,
            "clock_at": datetime.now(UTC),
        }
        return Statement(self._q["register_worker"], params, lambda rows, _: int(rows[0][0]) if rows else None)

    def worker_holding_id(self, worker_id: str) -> Statement[IdHolder | None]:
        def decode(rows: list[Row], _: int) -> IdHolder | None:
            if not rows:
                return None
            host, pid, seen, state, instance_id, silent_after = rows[0]
            return IdHolder(host, int(pid), max(0.0, float(seen)), state, instance_id, float(silent_after))

        return Statement(self._q["worker_holding_id"], {"id": worker_id}, decode)

    def touch_worker(
        self,
        *,
        worker_id: str,
        instance_id: uuid.UUID,
        state: str,
        in_flight: int,
        completed: int,
        failed: int,
        acked_generation: int,
    ) -> Statement[bool | None]:
        """Refresh this instance's row: None when the id no longer belongs to it, else whether it had been
        declared dead (its jobs recovered) while it was silent."""
        params = {
            "id": worker_id,
            "instance_id": instance_id,
            "state": state,
            "in_flight": in_flight,
            "completed": completed,
            "failed": failed,
            "acked_generation": acked_generation,
            "clock_at": datetime.now(UTC),
        }
        return Statement(self._q["touch_worker"], params, lambda rows, _: bool(rows[0][0]) if rows else None)

    def read_control(
        self, worker_id: str, queues: Sequence[str] | None, acked_generation: int
    ) -> Statement[ControlState]:
        params = {
            "worker_id": worker_id,
            "queues": list(queues) if queues is not None else None,
            "acked_generation": acked_generation,
        }
        return Statement(self._q["read_control"], params, _decode_control(worker_id))

    def declare_dead_workers(self) -> Statement[list[DeadWorker]]:
        """Declare silent workers dead and take back the jobs they held since before that instant, in one
        statement: never a job claimed by a worker that came back, nor by a new process under its id."""

        def decode(rows: list[Row], _: int) -> list[DeadWorker]:
            dead: dict[str, DeadWorker] = {}
            for row in rows:
                worker = dead.setdefault(row[0], DeadWorker(row[0], float(row[1]), []))
                if row[2] is not None:
                    worker.recovered.extend(decode_recovered([row[2:]], 1))
            return list(dead.values())

        return Statement(self._q["declare_dead_workers"], {"channel": self.channel}, decode)

    def reclaim_predecessor_jobs(self, worker_id: str, instance_id: uuid.UUID) -> Statement[list[RecoveredJob]]:
        """Take back what earlier processes under this worker id left running: only jobs that started
        before `instance_id` registered."""
        params = {"worker_id": worker_id, "instance_id": instance_id, "channel": self.channel}
        return Statement(self._q["reclaim_predecessor_jobs"], params, decode_recovered, prepare=False)
