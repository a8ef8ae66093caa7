"""A producer of the upgrade rehearsal: schedules jobs at a steady rate until SIGTERM, one acknowledged id a line.

    python -m tools.rehearse_producer --via python --rate 50 --acks acks.txt --name old-python-1

It runs under either release (the repository root as the working directory, `JOBBUS_DSN` set), through
Python's `app.sync.schedule` or the SQL API's `jobbus.schedule(...)`. An id is written, and flushed, only
once `schedule` returned it, so the file holds exactly the jobs the database acknowledged. A failed call
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tools.rehearse_app import JOB_TYPE, app

logger = logging.getLogger("rehearsal.producer")

#: One job in this many fails its first attempt on purpose, so that retries cross the upgrade too.
FAIL_FIRST_EVERY = 10


def _python_schedule() -> tuple[Callable[[dict[str, Any]], uuid.UUID], Callable[[], None]]:
    return (lambda config: app.sync.schedule(JOB_TYPE, config)), app.sync.close


def _sql_schedule() -> tuple[Callable[[dict[str, Any]], uuid.UUID], Callable[[], None]]:
    conn = psycopg.connect(os.environ["JOBBUS_DSN"], autocommit=True)

    def schedule(config: dict[str, Any]) -> uuid.UUID:
        row = conn.execute("SELECT jobbus.schedule(%s, %s)", (JOB_TYPE, Jsonb(config))).fetchone()
        assert row is not None
        return uuid.UUID(str(row[0]))

    return schedule, conn.close


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

    schedule, close = _python_schedule() if args.via == "python" else _sql_schedule()
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
                job_id = schedule(config)
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
    close()
    logger.info("%s: %d jobs scheduled, %d failed, slowest call %.0f ms", args.name, scheduled, failed, slowest * 1000)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
