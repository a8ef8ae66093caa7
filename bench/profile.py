"""Profile a jobbus worker draining no-op jobs with py-spy, and summarise the cost per job.

    .venv/bin/pip install py-spy
    .venv/bin/python bench/profile.py --jobs 100000 --concurrency 200

Creates a fresh database on BENCH_DSN, fills it through `App.schedule_many`, then runs
`bench.jobbus_driver drain` under `py-spy record` (raw collapsed stacks, idle time excluded, so the
samples are CPU time of the worker process) and prints, per function, the self and inclusive time
in microseconds per completed job. The raw stacks (collapsed format, for any flame graph tool) land in bench/profile/.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.suite import DEFAULT_DSN, Server, parse_result  # noqa: E402

OUT = ROOT / "bench" / "profile"


def frame_name(frame: str) -> str:
    """`func (path/to/module.py:123)` → `func (module.py)`: lines merged, so a function is one row."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    marker = "site-packages/"
    if marker in path:
        path = path.split(marker, 1)[1]
    elif "/src/" in path:
        path = path.split("/src/", 1)[1]
    elif "/lib/python" in path:
        path = "stdlib:" + path.rsplit("/", 1)[-1]
    return f"{name} ({path})"


def summarise(raw: Path, jobs: int, rate: int, top: int) -> tuple[str, dict[str, float]]:
    self_samples: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        total += count
        if frames:
            self_samples[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    per_job = 1e6 / rate / jobs  # µs of CPU per sample, spread over the jobs
    lines = [f"{total} samples at {rate} Hz = {total / rate:.2f} s CPU = {total * per_job:.1f} µs per job", ""]
    lines.append("self time (µs/job)   function")
    for name, count in self_samples.most_common(top):
        lines.append(f"{count * per_job:10.2f}           {name}")
    lines += ["", "inclusive time (µs/job)   function"]
    for name, count in inclusive.most_common(top):
        lines.append(f"{count * per_job:10.2f}                {name}")
    return "\n".join(lines), {"total_us_per_job": total * per_job}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--handler-batch", type=int, default=0, help="the no-op as a batch handler of this size")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        print("py-spy is not installed: .venv/bin/pip install py-spy", file=sys.stderr)
        return 69
    OUT.mkdir(parents=True, exist_ok=True)
    server = Server(args.dsn, quiet_threshold=None)
    name = f"jbb_{os.getpid()}_profile"
    dsn = server.create_database(name)
    python = sys.executable
    driver = [python, "-m", "bench.jobbus_driver"]
    try:
        for op in (["setup"], ["fill", "--jobs", str(args.jobs)]):
            proc = subprocess.run([*driver, op[0], "--dsn", dsn, *op[1:]], cwd=ROOT, capture_output=True, text=True)
            parse_result(driver, proc.returncode, proc.stdout, proc.stderr)
        raw = OUT / "drain.raw.txt"
        drain = [*driver, "drain", "--dsn", dsn, "--concurrency", str(args.concurrency)]
        if args.handler_batch:
            drain += ["--handler-batch", str(args.handler_batch)]
        started = time.perf_counter()
        proc = subprocess.run(
            [py_spy, "record", "--rate", str(args.rate), "--format", "raw", "-o", str(raw), "--", *drain],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        result = parse_result(drain, proc.returncode, proc.stdout, proc.stderr)
        elapsed = time.perf_counter() - started
    finally:
        server.drop_database(name)
    text, totals = summarise(raw, int(result["count"]), args.rate, args.top)
    header = (
        f"drain of {result['count']:,} no-op jobs, concurrency {args.concurrency}"
        f"{f', batches of {args.handler_batch}' if args.handler_batch else ''}, under py-spy: "
        f"{result['steady']:,.0f} jobs/s steady, {elapsed:.1f} s in all"
    )
    report = header + "\n" + text
    (OUT / "summary.txt").write_text(report + "\n", encoding="utf-8")
    (OUT / "summary.json").write_text(json.dumps({**totals, **result}, indent=1), encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
