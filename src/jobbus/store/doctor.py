"""Statements of `jobbus doctor` (`sql/queries/doctor.sql`): the server, its standbys, its sessions and
the worker registry, read for a health check."""

from __future__ import annotations

from dataclasses import dataclass

from jobbus.store.statements import Row, Statement, queries


@dataclass(frozen=True, slots=True)
class ServerFacts:
    version_num: int
    version: str
    max_connections: int
    reserved_connections: int
    autovacuum: bool  # on for the server (and `track_counts` with it)
    job_autovacuum: bool  # not turned off on the job table by a storage parameter
    job_table_exists: bool


@dataclass(frozen=True, slots=True)
class Standby:
    name: str
    sync_state: str | None  # async, potential, sync, quorum; None when the role may not see it


@dataclass(frozen=True, slots=True)
class LiveWorker:
    worker_id: str
    host: str
    pool_size: int | None
    clock_lead_seconds: float | None  # the worker's clock minus the database's, at its last refresh


@dataclass(frozen=True, slots=True)
class IdleTransaction:
    pid: int
    user: str
    client: str
    idle_seconds: float


class DoctorStore:
    """Builds the read-only statements of one schema's health check."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._q = queries(schema)

    def server(self) -> Statement[ServerFacts]:
        def decode(rows: list[Row], _: int) -> ServerFacts:
            num, version, max_conn, reserved, autovacuum, job_autovacuum, exists = rows[0]
            return ServerFacts(
                int(num), str(version), int(max_conn), int(reserved), bool(autovacuum), bool(job_autovacuum), exists
            )

        return Statement(self._q["doctor_server"], {"job_table": f'"{self.schema}".job'}, decode)

    def schema_version(self) -> Statement[int]:
        return Statement(self._q["doctor_schema_version"], {}, lambda rows, _: int(rows[0][0]))

    def standbys(self) -> Statement[list[Standby]]:
        return Statement(self._q["doctor_standbys"], {}, lambda rows, _: [Standby(str(n), s) for n, s in rows])

    def live_workers(self) -> Statement[list[LiveWorker]]:
        def decode(rows: list[Row], _: int) -> list[LiveWorker]:
            return [
                LiveWorker(str(i), str(h), None if p is None else int(p), None if c is None else float(c))
                for i, h, p, c in rows
            ]

        return Statement(self._q["doctor_workers"], {}, decode)

    def idle_transactions(self, longer_than_seconds: float) -> Statement[list[IdleTransaction]]:
        def decode(rows: list[Row], _: int) -> list[IdleTransaction]:
            return [IdleTransaction(int(p), str(u), str(c), float(s)) for p, u, c, s in rows]

        return Statement(self._q["doctor_idle_transactions"], {"seconds": longer_than_seconds}, decode)
