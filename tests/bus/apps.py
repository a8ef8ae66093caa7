"""Importable bus apps for the tests that need a worker in a separate process.

``python -m tests.bus.apps VERSION DSN`` builds app VERSION on DSN and runs its worker until no job is
left, logging to stderr with the correlation id on every line. Both versions register the wire name
`WIRE_NAME` and the same two queued bindings; "v2" renamed the class (`AddressChanged` became
`CustomerRelocated`) and added an optional field, as a later release of the same service would. Every
execution appends a row to `bus_record` (create it with `RECORD_TABLE`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg

import jobbus
from jobbus.bus import CorrelationIdFilter, MessageBus

WIRE_NAME = "customer.address_changed"

RECORD_TABLE = """
CREATE TABLE IF NOT EXISTS bus_record (
    id bigserial PRIMARY KEY,
    binding text NOT NULL,
    message_class text NOT NULL,
    customer_id bigint NOT NULL,
    address text NOT NULL,
    moved_at text NOT NULL,
    deposit text NOT NULL,
    job_id uuid NOT NULL,
    job_view text NOT NULL,
    attempt int NOT NULL,
    correlation_id text,
    pid int NOT NULL
)
"""

INSERT_RECORD = """
INSERT INTO bus_record (binding, message_class, customer_id, address, moved_at, deposit, job_id, job_view,
                        attempt, correlation_id, pid)
VALUES (%(binding)s, %(message_class)s, %(customer_id)s, %(address)s, %(moved_at)s, %(deposit)s, %(job_id)s,
        %(job_view)s, %(attempt)s, %(correlation_id)s, %(pid)s)
"""

FAST_RETRIES: dict[str, Any] = {
    "retry_base_delay_seconds": 0.0,
    "retry_max_delay_seconds": 0.0,
    "poll_interval_seconds": 0.2,
}


@dataclass(frozen=True)
class AddressChanged:
    """v1 of the message."""

    customer_id: int
    address: str
    moved_at: datetime
    deposit: Decimal


@dataclass(frozen=True)
class CustomerRelocated:
    """v2: the same wire name, a new class name and one more (optional) field."""

    customer_id: int
    address: str
    moved_at: datetime
    deposit: Decimal
    note: str | None = None


Moved = AddressChanged | CustomerRelocated


def record_values(binding: str, message: Moved, job: jobbus.JobExecution | jobbus.SyncJobExecution) -> dict[str, Any]:
    headers = job.configuration.get("headers", {})
    return {
        "binding": binding,
        "message_class": type(message).__name__,
        "customer_id": message.customer_id,
        "address": message.address,
        "moved_at": f"{message.moved_at.isoformat()} {message.moved_at.tzinfo}",
        "deposit": str(message.deposit),
        "job_id": job.id,
        "job_view": type(job).__name__,
        "attempt": job.attempt,
        "correlation_id": headers.get("correlation_id"),
        "pid": os.getpid(),
    }


def build(version: str, dsn: str) -> tuple[jobbus.App, MessageBus]:
    """The app of one release: its message class, a queued async and a queued sync binding."""
    app = jobbus.App(dsn=dsn, **FAST_RETRIES)
    bus = MessageBus(app)
    message_class: type[AddressChanged] | type[CustomerRelocated] = {
        "v1": AddressChanged,
        "v2": CustomerRelocated,
    }[version]
    bus.message(WIRE_NAME)(message_class)

    @bus.handler(message_class, queued=True, queue="addresses", name="geocode")
    async def geocode(message: Moved, job: jobbus.JobExecution) -> dict[str, Any]:
        async with app.pool.connection() as conn:
            await conn.execute(INSERT_RECORD, record_values("geocode", message, job))
        return {"customer_id": message.customer_id, "handled_by": type(message).__name__}

    @bus.handler(message_class, queued=True, name="crm.sync")
    def crm_sync(message: Moved, job: jobbus.SyncJobExecution) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(INSERT_RECORD, record_values("crm.sync", message, job))

    return app, bus


def main(argv: list[str]) -> int:
    version, dsn = argv[1], argv[2]
    handler = logging.StreamHandler()
    handler.addFilter(CorrelationIdFilter())
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s correlation=%(correlation_id)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    app, _ = build(version, dsn)
    return asyncio.run(app.run_worker(stop_when_empty=True, concurrency=4, install_signal_handlers=False))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
