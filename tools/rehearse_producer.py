"""A producer of the upgrade rehearsal: schedules jobs at a steady rate until SIGTERM, one acknowledged id a line.

    python -m tools.rehearse_producer --via python --rate 50 --acks acks.txt --name old-python-1

It runs under either release (the repository root as the working directory, `JOBBUS_DSN` set), through
Python's `app.sync.schedule` or the SQL API's `jobbus.schedule(...)`. Every other job is scheduled the
way an application enqueues in its own transaction: one that first reads the job table (the producer's
previous job, as a status check would) and then schedules, so that it holds a lock on the table before
it writes it, the traffic a migration that strengthens its lock on the table mid-transaction deadlocks
with. An id is written, and flushed, only once its transaction committed, so the file holds exactly the
jobs the database acknowledged. A failed call
is logged as an error (the rehearsal fails on it) and the producer goes on. At the end it logs how many
jobs it scheduled and its slowest call.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tools.rehearse_app import JOB_TYPE, app

logger = logging.getLogger("rehearsal.producer")

#: One job in this many fails its first attempt on purpose, so that retries cross the upgrade too.
FAIL_FIRST_EVERY = 10


#: What an application's transaction reads before it schedules: the producer's previous job.
READ_PREVIOUS = "SELECT status FROM jobbus.job WHERE id = %s"


class Scheduler:
    """Schedules through Python or the SQL API; odd jobs in a transaction that reads the job table first."""

    def __init__(self, via: str) -> None:
        self._via = via
        self._conn = psycopg.connect(os.environ["JOBBUS_DSN"], autocommit=True)
        self._previous = uuid.UUID(int=0)

    def schedule(self, n: int, config: dict[str, Any]) -> uuid.UUID:
        if n % 2 == 0:
            job_id = self._schedule(config, None)
        else:
            with self._conn.transaction():
                self._conn.execute(READ_PREVIOUS, (self._previous,))
                job_id = self._schedule(config, self._conn)
        self._previous = job_id
        return job_id

    def _schedule(self, config: dict[str, Any], conn: psycopg.Connection[Any] | None) -> uuid.UUID:
        if self._via == "python":
            return app.sync.schedule(JOB_TYPE, config, connection=conn)
        row = self._conn.execute("SELECT jobbus.schedule(%s, %s)", (JOB_TYPE, Jsonb(config))).fetchone()
        assert row is not None
        return uuid.UUID(str(row[0]))

    def close(self) -> None:
        app.sync.close()
        self._conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.rehearse_producer", description=__doc__.split("\n")[0])
    parser.add_argument("--via", choices=["python", "sql"], required=True)
    parser.add_argument("--rate", type=float, required=True, help="jobs per second")
    parser.add_argument("--acks", type=Path, required=True, help="file the acknowledged ids are appended to")
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    if not args.rate > 0:
        parser.error(f"--rate must be above 0, got {args.rate}")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    scheduler = Scheduler(args.via)
    scheduled = failed = 0
    slowest = 0.0
    interval = 1 / args.rate
    due = time.monotonic()
    with args.acks.open("a") as acks:
        while not stopping.is_set():
            n = scheduled + failed
            config = {"n": n, "producer": args.name, "fail_first": n % FAIL_FIRST_EVERY == 3, "sleep_ms": n % 20}
            started = time.monotonic()
            try:
                job_id = scheduler.schedule(n, config)
            except Exception:
                failed += 1
                logger.exception("%s: scheduling job %d failed", args.name, n)
            else:
                acks.write(f"{job_id}\n")
                acks.flush()
                scheduled += 1
            slowest = max(slowest, time.monotonic() - started)
            due = max(due + interval, time.monotonic() - 1)  # after a stall, catch up for at most a second
            stopping.wait(max(0.0, due - time.monotonic()))
    scheduler.close()
    logger.info("%s: %d jobs scheduled, %d failed, slowest call %.0f ms", args.name, scheduled, failed, slowest * 1000)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
