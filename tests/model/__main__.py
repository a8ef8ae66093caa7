"""Sweep the model check over seeds until time is up: `python -m tests.model --minutes 20`.

Each seed runs on a fresh database of the server under test (`JOBBUS_TEST_DSN`, else the embedded
server); every result is printed as it ends, then a summary of the guarantees that broke and the seeds
that reproduce each. `--seed N` runs one seed (what a failure says to run). Exits 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from collections.abc import Iterator

from tests.dbserver import ensure_template, fresh_database, server_dsn
from tests.model.run import check_seed, explain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="sweep new seeds until this much time is up")
    parser.add_argument("--seed", type=int, action="append", help="run this seed (repeatable) instead of a sweep")
    parser.add_argument("--duration", type=float, default=25.0, help="seconds of load and faults per seed")
    parser.add_argument("--start", type=int, help="first seed of the sweep (default: random)")
    parser.add_argument(
        "--single-queue-workers", action="store_true", help="give each worker one queue (a narrower model)"
    )
    args = parser.parse_args(argv)

    admin = server_dsn()
    template = ensure_template(admin)
    failures: dict[str, list[int]] = defaultdict(list)
    seeds_run = 0
    deadline = time.monotonic() + args.minutes * 60
    seeds = iter(args.seed) if args.seed else _sweep(args.start)
    for seed in seeds:
        if not args.seed and time.monotonic() > deadline:
            break
        with fresh_database(admin, template) as dsn:
            topology, report = check_seed(seed, dsn, args.duration, single_queue_workers=args.single_queue_workers)
        seeds_run += 1
        print(explain(topology, report), flush=True)
        print(flush=True)
        for guarantee in report.guarantees():
            failures[guarantee].append(seed)
    print(f"summary: {seeds_run} seeds, {sum(1 for _ in failures)} guarantees broken")
    for guarantee, broken in sorted(failures.items()):
        print(f"  {guarantee}: seeds {' '.join(map(str, sorted(set(broken))))}")
    return 1 if failures else 0


def _sweep(start: int | None) -> Iterator[int]:
    seed = random.randrange(1, 10**6) if start is None else start
    while True:
        yield seed
        seed += 1


if __name__ == "__main__":
    sys.exit(main())
