"""What every benchmark driver shares: its command line, its clock and how it reports.

Pure standard library, so the peers' drivers (which run in `bench/.venv-peers`, without jobbus) can
import it too. A driver runs one operation per invocation and prints one line `RESULT {json}` on
stdout; `bench/run.py` starts the drivers as subprocesses and reads that line.

Clocks: drain stamps use `time.time()` so that stamps of two worker processes can be compared;
latency uses `time.perf_counter()` inside one process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "
#: Every driver registers its no-op handler under this job type / entrypoint / task name.
NOOP = "bench.noop"
#: The encryption key of the `--encrypt 1` runs (made by `jobbus keys generate`; a benchmark's only).
BENCH_ENCRYPTION_KEY = "xJ0sQxv3yK8bQm1D9wF2ZtA7pLhR4nEoUcVgYiJk5Ws="
#: Idle time after a worker starts and before the latency producer sends its first job.
IDLE_SECONDS = 1.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The operations a driver offers, and their knobs."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "op",
        choices=[
            "setup",
            "enqueue_single",
            "enqueue_bulk",
            "enqueue_concurrent",
            "fill",
            "drain",
            "latency",
            "seed_finished",
        ],
    )
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=0, help="claim batch size, for queues that have one")
    parser.add_argument("--interval", type=float, default=0.02, help="latency: seconds between two jobs")
    parser.add_argument(
        "--handler-batch",
        type=int,
        default=0,
        help="drain: the no-op handler is a batch handler of this batch_size (jobbus; 0: a handler of one job)",
    )
    parser.add_argument(
        "--limit",
        default="",
        help="flow control for fill and drain: queue=N (at most N running fleet-wide) or keys=N (N keys, one each)",
    )
    parser.add_argument(
        "--payload-bytes",
        type=int,
        default=0,
        help="enqueue, fill: each job's configuration holds a string of this many characters (0: `{}`)",
    )
    parser.add_argument(
        "--encrypt",
        type=int,
        default=0,
        help="jobbus: 1 to run with `BENCH_ENCRYPTION_KEY` as the App's encryption key (producer and worker)",
    )
    parser.add_argument(
        "--start-at",
        type=float,
        default=0.0,
        help="enqueue: time.time() at which the measured part begins (several producer processes start together)",
    )
    return parser.parse_args(argv)


def payload(size: int) -> dict[str, Any]:
    """A job's configuration of `size` characters of text (`--payload-bytes`); `{}` for 0."""
    return {"data": "x" * size} if size else {}


def parse_limit(text: str) -> tuple[str, int] | None:
    """`queue=100` -> ("queue", 100); empty -> None (no limit)."""
    if not text:
        return None
    kind, _, value = text.partition("=")
    if kind not in ("queue", "keys") or not value.isdigit():
        raise SystemExit(f"--limit must be queue=N or keys=N, not {text!r}")
    return kind, int(value)


def emit(**values: Any) -> None:
    """Print the single result line the orchestrator reads."""
    print(RESULT_PREFIX + json.dumps(values), flush=True)


def drain_result(stamps: Sequence[float], started: float, ended: float, cpu: float = math.nan) -> dict[str, Any]:
    """A drain's figures from the handler start stamps (time.time()) and the worker's run time.

    `steady` is the rate between the first and the last handler start: startup (schema checks,
    registration, first claim) and the final flush/shutdown are outside it. `wall` includes both.
    `cpu` is the CPU seconds the driver's process spent from start to exit (`cpu_seconds`), NaN when
    the driver does not read it.
    """
    count = len(stamps)
    first = min(stamps) if stamps else math.nan
    last = max(stamps) if stamps else math.nan
    steady = (count - 1) / (last - first) if count > 1 and last > first else math.nan
    return {
        "count": count,
        "first": first,
        "last": last,
        "steady": steady,
        "wall": count / (ended - started) if ended > started else math.nan,
        "started": started,
        "ended": ended,
        "cpu": cpu,
    }


def cpu_seconds() -> float:
    """User + system CPU of this process so far (every thread), from getrusage."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation): the value a reader can find in the sample."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def latency_result(latencies_seconds: Sequence[float], expected: int) -> dict[str, Any]:
    ms = [value * 1000.0 for value in latencies_seconds]
    return {
        "count": len(ms),
        "expected": expected,
        "p50": percentile(ms, 0.50),
        "p95": percentile(ms, 0.95),
        "p99": percentile(ms, 0.99),
        "max": max(ms) if ms else math.nan,
    }


def dump_stamps(path: str, stamps: Sequence[float]) -> None:
    """Used by worker processes that are not drivers (the jobbus CLI): first/last/count to a file."""
    summary = {"count": len(stamps), "first": min(stamps, default=math.nan), "last": max(stamps, default=math.nan)}
    Path(path).write_text(json.dumps(summary), encoding="utf-8")


def wait_until(at: float) -> float:
    """Seconds to sleep until `time.time()` reaches `at` (0 when it has passed or `at` is 0)."""
    return max(0.0, at - time.time()) if at else 0.0


def enqueue_result(jobs: int, started: float, ended: float) -> dict[str, Any]:
    """An enqueue run's figures; `started`/`ended` are time.time(), so runs of several processes pool."""
    return {"rate": jobs / (ended - started), "seconds": ended - started, "started": started, "ended": ended}


def now() -> float:
    return time.time()


def paced(start: float, index: int, interval: float) -> float:
    """Seconds to sleep so that job `index` goes out at `start + index * interval` (no drift)."""
    return max(0.0, start + index * interval - time.perf_counter())


def getenv_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default
