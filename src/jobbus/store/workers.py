"""Statements of the worker registry and the control plane (`sql/queries/workers.sql`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobbus.store.statements import Row, Statement, queries


@dataclass(frozen=True, slots=True)
class ControlState:
    """What the control plane says to one worker."""

    paused_all: bool
    paused_worker: bool
    paused_queues: frozenset[str]
    commands: tuple[tuple[int, str], ...]  # (generation, action) addressed to this worker, in order
    latest_generation: int


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

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.control_channel = f"jobbus_{schema}_control"
        self._q = queries(schema)

    def reclaim_own_orphans(self, worker_id: str) -> Statement[int]:
        return Statement(self._q["reclaim_own_orphans"], {"worker_id": worker_id}, lambda rows, _: len(rows))

    def register_worker(
        self,
        *,
        worker_id: str,
        host: str,
        pid: int,
        queues: Sequence[str] | None,
        types: Sequence[str],
        concurrency: int,
    ) -> Statement[int]:
        """Upsert the registry row; returns the generation the worker starts acknowledged at."""
        params = {
            "id": worker_id,
            "host": host,
            "pid": pid,
            "queues": list(queues) if queues is not None else None,
            "types": list(types),
            "concurrency": concurrency,
        }
        return Statement(self._q["register_worker"], params, lambda rows, _: int(rows[0][0]))

    def touch_worker(
        self,
        *,
        worker_id: str,
        state: str,
        in_flight: int,
        completed: int,
        failed: int,
        acked_generation: int,
    ) -> Statement[None]:
        params = {
            "id": worker_id,
            "state": state,
            "in_flight": in_flight,
            "completed": completed,
            "failed": failed,
            "acked_generation": acked_generation,
        }
        return Statement(self._q["touch_worker"], params, lambda rows, _: None)

    def read_control(self, worker_id: str, acked_generation: int) -> Statement[ControlState]:
        params = {"worker_id": worker_id, "acked_generation": acked_generation}
        return Statement(self._q["read_control"], params, _decode_control(worker_id))
