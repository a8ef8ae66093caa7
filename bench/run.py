"""jobbus and its peers, side by side, on one PostgreSQL server: `make bench`.

    .venv/bin/python bench/run.py                       # everything (20-30 min on 2 cores)
    .venv/bin/python bench/run.py --quick               # smaller sizes, a few minutes
    .venv/bin/python bench/run.py --scenario drain_10k --scenario latency --systems jobbus,pgqueuer
    .venv/bin/python bench/run.py --systems jobbus --scenario backlog --scale 1   # 1M / 10M-row backlogs

The server, the drivers and the `Suite` that runs the scenarios are in `bench/suite.py`; the capacity
scenarios (drain_procs, backlog, retention) live in `bench/capacity.py`; their row
counts are 1M queued / 10M finished times `--scale` (0.1 by default, 0.02 with --quick).
`--merge FILE` adds the scenarios an earlier run measured (a copy of its bench/results/latest.json)
and this one did not, so a doc can be regenerated after re-measuring a few scenarios.

Every scenario gets its own fresh database per system on the server at BENCH_DSN (created here,
dropped at the end of the scenario); runs within a scenario reset the system's tables with
TRUNCATE. Each system runs through a driver subprocess (`bench/jobbus_driver.py` in this venv,
`bench/peers/*_driver.py` in `bench/.venv-peers`, which this script creates and fills from PyPI,
and `bench/peers/graphile_driver.mjs` on node with `bench/.node-peers`, which it fills from npm).
Runs are interleaved across systems so that noise on a shared server hits all of them alike.
Prints one table; with the full suite (or --output) it rewrites the generated part of
docs/benchmarks.md, between the `bench:begin` / `bench:end` markers.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import functools
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py` puts bench/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from bench import capacity  # noqa: E402
from bench.suite import (  # noqa: E402
    QUICK,
    Measurement,
    Server,
    Setting,
    Sizes,
    Suite,
    System,
    add_server_arguments,
    log,
    server_from,
)

BENCH = ROOT / "bench"
PEERS_VENV = BENCH / ".venv-peers"
NODE_PEERS_DIR = BENCH / ".node-peers"
DOC = ROOT / "docs" / "benchmarks.md"
RAW = BENCH / "results" / "latest.json"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

#: Peers and what to install for them (pinned, so that a rerun compares the same code).
PEERS: dict[str, list[str]] = {
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg"],
    "procrastinate": ["procrastinate==3.10.0"],
    "oban": ["oban"],
}
#: Peers that run on Node.js and the npm package to install for each (pinned, like PEERS). 0.18.0 declares
#: Node >= 22.18; npm installs it on older Node with a warning, and it runs there.
NODE_PEERS: dict[str, str] = {"graphile": "graphile-worker@0.18.0"}
#: graphile-worker's own perfTest configuration (perfTest/graphile.config.js): 24 concurrent jobs, a local
#: queue of 500; the driver adds the rest of that configuration (pool of 25, batched completion).
GRAPHILE_PERFTEST = Setting("c24 local queue 500", 24, 500)

SCENARIOS = [
    "enqueue_single",
    "enqueue_bulk",
    "enqueue_bulk_100k",
    "enqueue_concurrent",
    "enqueue_4proc",
    "drain_10k",
    "drain_100k",
    "drain_2proc",
    "latency",
    "finished_1m",
    "drain_limited",
    "drain_batched",
    "encryption",
    "commits",
    "floor",
    "drain_procs",
    "backlog",
    "retention",
]


# -- systems -------------------------------------------------------------------------------------------


def jobbus_system(quick: bool) -> System:
    """jobbus from this checkout. Its modules (and the benchmark's own) are compiled to bytecode first,
    as pip compiles an installed wheel's: with PYTHONDONTWRITEBYTECODE set, or a tree it cannot write,
    every worker process would otherwise compile them again (~0.2 s at each start that no installed
    jobbus pays, and that the start-to-exit figures of the CLI's processes would count)."""
    compileall.compile_dir(ROOT / "src" / "jobbus", quiet=1)
    compileall.compile_dir(BENCH, maxlevels=0, quiet=1)  # not the peers' environments below it
    sweep = [Setting(f"c{c}", c) for c in ((50, 200) if quick else (10, 50, 200, 500, 1000))]
    return System(
        name="jobbus",
        runtime=Path(sys.executable),
        driver=["-m", "bench.jobbus_driver"],
        sweep=sweep,
        latency=Setting("c10", 10),
        reset_sql="TRUNCATE jobbus.job",
        unfinished_sql="SELECT count(*) FROM jobbus.job WHERE status <> 'completed'",
        version=package_version(Path(sys.executable), "jobbus"),
    )


def pgqueuer_system(python: Path, quick: bool) -> System:
    sweep = [Setting("b10 unlimited", 0, 10), Setting("b100 c200", 200, 100), Setting("b100 c500", 500, 100)]
    if quick:
        sweep = sweep[1:]
    return System(
        name="pgqueuer",
        runtime=python,
        driver=[str(BENCH / "peers" / "pgqueuer_driver.py")],
        sweep=sweep,
        latency=Setting("b10 unlimited", 0, 10),
        reset_sql="TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics",
        unfinished_sql="SELECT count(*) FROM pgqueuer",
        version=package_version(python, "pgqueuer"),
    )


def procrastinate_system(python: Path, quick: bool) -> System:
    sweep = [Setting("c50", 50)] if quick else [Setting("c10", 10), Setting("c50", 50)]
    return System(
        name="procrastinate",
        runtime=python,
        driver=[str(BENCH / "peers" / "procrastinate_driver.py")],
        sweep=sweep,
        latency=Setting("c10", 10),
        reset_sql="TRUNCATE procrastinate_jobs CASCADE",
        unfinished_sql="SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
        drain_cap=1_000 if quick else 2_000,
        version=package_version(python, "procrastinate"),
    )


def graphile_system(node: Path) -> System:
    """graphile-worker in its perfTest configuration only: that is the figure it publishes."""
    return System(
        name="graphile",
        runtime=node,
        driver=[str(BENCH / "peers" / "graphile_driver.mjs")],
        sweep=[GRAPHILE_PERFTEST],
        latency=GRAPHILE_PERFTEST,
        reset_sql="TRUNCATE graphile_worker._private_jobs, graphile_worker._private_job_queues",
        unfinished_sql="SELECT count(*) FROM graphile_worker._private_jobs",
        version=node_package_version("graphile-worker"),
        sits_out={"finished_1m": "graphile-worker deletes a job when it completes: there are no finished rows"},
    )


def package_version(python: Path, name: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "?"


def node_package_version(name: str) -> str:
    with contextlib.suppress(OSError, ValueError, KeyError):
        manifest = NODE_PEERS_DIR / "node_modules" / name / "package.json"
        return str(json.loads(manifest.read_text(encoding="utf-8"))["version"])
    return "?"


def ensure_peers(wanted: Sequence[str], reinstall: bool, notes: dict[str, str]) -> Path | None:
    """Create bench/.venv-peers and install each wanted peer; a peer that cannot be installed gets a note."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", None) or shutil.which("python3") or "python3"
        log(f"creating {PEERS_VENV.relative_to(ROOT)} with {base}")
        proc = subprocess.run([base, "-m", "venv", str(PEERS_VENV)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            for name in wanted:
                notes[name] = f"not run: could not create the peers' virtualenv ({proc.stderr.strip()[-200:]})"
            return None
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], capture_output=True, check=False
        )
    for name in wanted:
        install = functools.partial(pip_install, python, name)
        install_once(PEERS_VENV, name, " ".join(PEERS[name]), reinstall, notes, install)
    return python


def ensure_node_peers(wanted: Sequence[str], reinstall: bool, notes: dict[str, str]) -> Path | None:
    """Install each wanted Node.js peer into bench/.node-peers from npm; the node to run them on, or None."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        for name in wanted:
            notes[name] = f"not run: {NODE_PEERS[name]} needs Node.js, and there is no node and npm on PATH"
        return None
    NODE_PEERS_DIR.mkdir(exist_ok=True)
    manifest = NODE_PEERS_DIR / "package.json"
    if not manifest.exists():
        manifest.write_text('{"private": true}\n', encoding="utf-8")
    for name in wanted:
        install = functools.partial(npm_install, npm, NODE_PEERS[name])
        install_once(NODE_PEERS_DIR, name, NODE_PEERS[name], reinstall, notes, install)
    return Path(node)


def install_once(
    folder: Path, name: str, pins: str, reinstall: bool, notes: dict[str, str], install: Callable[[], str | None]
) -> None:
    """Runs `install` (None on success, else the note to show) once per `pins`: markers in `folder` remember
    how it went, so a changed pin installs again and a failure is retried only with --reinstall-peers."""
    ok, failed = folder / f".installed-{name}", folder / f".failed-{name}"
    if reinstall:
        ok.unlink(missing_ok=True)
        failed.unlink(missing_ok=True)
    if ok.exists() and ok.read_text(encoding="utf-8") == pins:
        return
    if failed.exists():
        notes[name] = failed.read_text(encoding="utf-8").strip()
        return
    note = install()
    if note is None:
        ok.write_text(pins, encoding="utf-8")
        return
    failed.write_text(note + "\n", encoding="utf-8")
    notes[name] = note


def pip_install(python: Path, name: str) -> str | None:
    log(f"installing {' '.join(PEERS[name])} into {PEERS_VENV.relative_to(ROOT)}")
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *PEERS[name]], capture_output=True, text=True, check=False
    )
    return None if proc.returncode == 0 else install_failure_note(name, proc.stderr)


def npm_install(npm: str, spec: str) -> str | None:
    log(f"installing {spec} into {NODE_PEERS_DIR.relative_to(ROOT)}")
    argv = [npm, "install", "--prefix", str(NODE_PEERS_DIR), "--save-exact", "--no-audit", "--no-fund", spec]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return None
    errors = [line for line in proc.stderr.strip().splitlines() if "ERR" in line]
    return f"not run: npm could not install {spec}: {(errors or ['?'])[-1][:200]}"


def install_failure_note(name: str, stderr: str) -> str:
    needs = re.findall(r"Requires-Python (>=\s*[\d.]+)", stderr)
    if needs:
        return (
            f"not run: every {name} release on PyPI requires Python {needs[-1].replace(' ', '')}; "
            f"this machine has Python {platform.python_version()}"
        )
    lines = [line for line in stderr.strip().splitlines() if line.startswith("ERROR")]
    return f"not run: pip could not install {name}: {(lines or ['?'])[-1][:200]}"


# -- targets, the table and the doc ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    text: str
    measured: str
    met: bool | None  # None: not measured in this invocation


def evaluate_targets(suite: Suite) -> list[Target]:
    def med(scenario: str, system: str, metric: str, setting: str | None = None) -> float:
        m = suite.find(scenario, system, metric, setting)
        return m.median if m else math.nan

    def best_drain(system: str) -> tuple[float, str]:
        for scenario in ("drain_100k", "drain_10k"):
            candidates = [
                m for m in suite.results if m.scenario == scenario and m.system == system and m.metric == "steady"
            ]
            if candidates:
                m = max(candidates, key=lambda c: c.median)
                return m.median, f"{scenario} {m.setting}"
        return math.nan, ""

    def target(text: str, measured: str, value: float, ok: Callable[[float], bool]) -> Target:
        return Target(
            text, measured if not math.isnan(value) else "not measured", None if math.isnan(value) else ok(value)
        )

    jb, jb_where = best_drain("jobbus")
    pq, _ = best_drain("pgqueuer")
    floor = med("floor", "SQL", "steady", "jobbus schema, fenced")
    two = med("drain_2proc", "jobbus", "steady")
    bulk, pq_bulk = med("enqueue_bulk", "jobbus", "enqueue"), med("enqueue_bulk", "pgqueuer", "enqueue")
    single, pq_single = med("enqueue_single", "jobbus", "enqueue"), med("enqueue_single", "pgqueuer", "enqueue")
    p50, p99 = med("latency", "jobbus", "p50"), med("latency", "jobbus", "p99")
    best = suite.systems[0].best_setting.label if suite.systems and suite.systems[0].name == "jobbus" else None
    with_1m = med("finished_1m", "jobbus", "steady")
    empty = med("drain_100k", "jobbus", "steady", best)
    if math.isnan(empty):
        empty = med("drain_10k", "jobbus", "steady", best)
    commits = med("drain_100k", "jobbus", "commits", best)
    ratio_1m = with_1m / empty
    batched = [m for m in suite.results if m.scenario == "drain_batched" and m.metric == "steady" and m.values]
    by_one = next((m.median for m in batched if m.setting.startswith("one job")), math.nan)
    by_batch = max((m.median for m in batched if m.setting.startswith("batch")), default=math.nan)
    return [
        target("drain, 1 process: ≥ 10,000 jobs/s", f"{jb:,.0f} jobs/s ({jb_where})", jb, lambda v: v >= 10_000),
        target(
            "drain: ≥ 2× pgqueuer at its best", f"{jb / pq:.2f}× ({jb:,.0f} vs {pq:,.0f})", jb / pq, lambda v: v >= 2
        ),
        target("drain: ≥ 50% of the SQL floor", f"{jb / floor:.0%} of {floor:,.0f}", jb / floor, lambda v: v >= 0.5),
        target("drain: 2 processes > 1", f"{two:,.0f} vs {jb:,.0f} jobs/s", two / jb, lambda v: v > 1),
        target("bulk enqueue: ≥ 50,000 jobs/s", f"{bulk:,.0f} jobs/s", bulk, lambda v: v >= 50_000),
        target(
            "bulk enqueue: ≥ 3× pgqueuer", f"{bulk / pq_bulk:.2f}× ({pq_bulk:,.0f})", bulk / pq_bulk, lambda v: v >= 3
        ),
        target(
            "single enqueue: ≥ 1.5× pgqueuer",
            f"{single / pq_single:.2f}× ({single:,.0f} vs {pq_single:,.0f})",
            single / pq_single,
            lambda v: v >= 1.5,
        ),
        target("idle latency p50 ≤ 5 ms", f"{p50:.2f} ms", p50, lambda v: v <= 5),
        target("idle latency p99 ≤ 12 ms", f"{p99:.2f} ms", p99, lambda v: v <= 12),
        target(
            "1M finished rows: ≥ 80% of the empty-table drain",
            f"{ratio_1m:.0%} ({with_1m:,.0f} vs {empty:,.0f})",
            ratio_1m,
            lambda v: v >= 0.8,
        ),
        target("commits per completed job ≤ 0.1", f"{commits:.3f}", commits, lambda v: v <= 0.1),
        target(
            "batched drain (batch 100, its best concurrency): ≥ 2× the unbatched drain of the same run (21)",
            f"{by_batch / by_one:.2f}× ({by_batch:,.0f} vs {by_one:,.0f} jobs/s)",
            by_batch / by_one,
            lambda v: v >= 2,
        ),
        *capacity_targets(suite, target, med, (jb, jb_where), floor, p99),
        *graphile_targets(suite, target),
    ]


def capacity_targets(
    suite: Suite,
    target: Callable[[str, str, float, Callable[[float], bool]], Target],
    med: Callable[..., float],
    drain: tuple[float, str],
    floor: float,
    p99: float,
) -> list[Target]:
    """The targets of issue 12 ("Scale")."""
    jb, jb_where = drain
    one = two = math.nan
    ones = [m for m in suite.results if m.scenario == "drain_procs" and m.metric == "steady" and m.values]
    for m in ones:
        if m.setting.startswith("1 proc"):
            one = m.median
        if m.setting.startswith("2 proc"):
            two = m.median
    if not ones:
        one, two = jb, med("drain_2proc", "jobbus", "steady")
    bulk = med("enqueue_bulk_100k", "jobbus", "enqueue")
    bulk_where = "100k"
    if math.isnan(bulk):
        bulk, bulk_where = med("enqueue_bulk", "jobbus", "enqueue"), "10k"
    conc, pq_conc = med("enqueue_concurrent", "jobbus", "enqueue"), med("enqueue_concurrent", "pgqueuer", "enqueue")
    targets = [
        target(
            "drain: ≥ 75% of the SQL floor (12)",
            f"{jb / floor:.0%} of {floor:,.0f} ({jb_where})",
            jb / floor,
            lambda v: v >= 0.75,
        ),
        target(
            "drain: 2 processes ≥ 1.5× one (12)",
            f"{two / one:.2f}× ({two:,.0f} vs {one:,.0f})",
            two / one,
            lambda v: v >= 1.5,
        ),
        target(
            f"bulk enqueue ({bulk_where}): ≥ 150,000 jobs/s (12)", f"{bulk:,.0f} jobs/s", bulk, lambda v: v >= 150_000
        ),
        target(
            "concurrent single enqueue, 50 coroutines: ≥ 1.5× pgqueuer (12)",
            f"{conc / pq_conc:.2f}× ({conc:,.0f} vs {pq_conc:,.0f})",
            conc / pq_conc,
            lambda v: v >= 1.5,
        ),
        target("idle latency p99 ≤ 5 ms (12)", f"{p99:.2f} ms", p99, lambda v: v <= 5),
    ]
    backlog = {m.setting: m for m in suite.results if m.scenario == "backlog" and m.values}
    clean = med("backlog", "jobbus", "steady", "clean")
    for suffix in ("in a paused queue", "of an unserved type", "finished"):
        label = next((s for s in backlog if s.endswith(suffix)), None)
        if label is None:
            continue
        p50 = med("backlog", "jobbus", "claim p50", label)
        rate = med("backlog", "jobbus", "steady", label)
        targets.append(target(f"{label}: claim p50 ≤ 2 ms (12)", f"{p50:.2f} ms", p50, lambda v: v <= 2))
        targets.append(
            target(
                f"{label}: drain ≥ 90% of clean (12)",
                f"{rate / clean:.0%} ({rate:,.0f} vs {clean:,.0f})",
                rate / clean,
                lambda v: v >= 0.9,
            )
        )
    deletes = next(
        (
            m
            for m in suite.results
            if m.scenario == "retention" and m.metric == "rows/s" and m.setting.startswith("DELETE") and m.values
        ),
        None,
    )
    if deletes is not None:
        # The cleaner works ROUND_SECONDS (2 s) of every 10 s interval: a fifth of the batch rate.
        duty = deletes.median * 0.2
        targets.append(
            target(
                "retention: the cleaner's batched DELETE keeps up with 1,000 jobs/s (12)",
                f"{deletes.median:,.0f} rows/s, {duty:,.0f} rows/s at its 2 s per 10 s",
                duty,
                lambda v: v >= 1000,
            )
        )
    return targets


def graphile_targets(
    suite: Suite, target: Callable[[str, str, float, Callable[[float], bool]], Target]
) -> list[Target]:
    """The targets of issue 24 ("the fastest"): jobs / (worker start to exit), against graphile-worker."""
    targets = []
    for text, scenarios in (
        ("drain, 1 process: ≥ 1.0× graphile-worker 1 process (24)", ("drain_100k", "drain_10k")),
        ("drain, 2 processes: ≥ 1.0× graphile-worker 2 processes (24)", ("drain_2proc",)),
    ):
        ours, theirs, where = start_to_exit(suite, scenarios, "graphile")
        ratio = ours / theirs if theirs else math.nan
        measured = f"{ratio:.2f}× ({ours:,.0f} vs {theirs:,.0f} jobs/s start to exit, {where})"
        targets.append(target(text, measured, ratio, lambda v: v >= 1.0))
    return targets


def start_to_exit(suite: Suite, scenarios: Sequence[str], peer: str) -> tuple[float, float, str]:
    """jobbus's and `peer`'s wall rates (each at its best setting) in the first of `scenarios` both drained
    with the same number of jobs; NaN when there is none."""
    for scenario in scenarios:
        ours, theirs = best_wall(suite, scenario, "jobbus"), best_wall(suite, scenario, peer)
        if ours is not None and theirs is not None and ours.jobs == theirs.jobs:
            return ours.median, theirs.median, f"{scenario}, {ours.jobs:,} jobs, jobbus {ours.setting}"
    return math.nan, math.nan, ""


def best_wall(suite: Suite, scenario: str, system: str) -> Measurement | None:
    walls = [m for m in suite.results if (m.scenario, m.system, m.metric) == (scenario, system, "wall") and m.values]
    return max(walls, key=lambda m: m.median, default=None)


def fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit in ("commits/job", "cpu ms/job"):
        return f"{value:.3f}"
    if unit in ("ms", "cores", "fraction", "load", "s"):
        return f"{value:.2f}"
    return f"{value:,.0f}"


def table_rows(suite: Suite) -> list[list[str]]:
    """Every measurement: scenarios in suite order, systems in column order, settings in sweep order."""
    order = {name: i for i, name in enumerate(["enqueue_single", "enqueue_bulk", "enqueue_bulk_100k",
                                                "enqueue_concurrent", "enqueue_4proc", "drain_10k", "drain_100k",
                                                "drain_2proc", "drain_procs", "latency", "floor", "finished_1m",
                                                "backlog", "retention"])}  # fmt: skip
    systems = {s.name: i for i, s in enumerate(suite.systems)}
    settings = {(s.name, setting.label): i for s in suite.systems for i, setting in enumerate(s.sweep)}
    metrics = {name: i for i, name in enumerate(["enqueue", "steady", "wall", "commits", "wal", "p50", "p95", "p99"])}

    def key(m: Measurement) -> tuple[int, int, int, str, int]:
        where = settings.get((m.system, m.setting), 99)
        return order.get(m.scenario, 99), systems.get(m.system, 99), where, m.setting, metrics.get(m.metric, 99)

    rows = []
    for m in sorted((m for m in suite.results if m.values), key=key):
        spread = f"{fmt(m.low, m.unit)}–{fmt(m.high, m.unit)}"
        median = fmt(m.median, m.unit)
        rows.append(
            [m.scenario, m.system, m.setting, f"{m.jobs:,}", m.metric, m.unit, median, spread, str(len(m.values))]
        )
    return rows


HEADER = ["scenario", "system", "setting", "jobs", "metric", "unit", "median", "min–max", "runs"]


SUMMARY_ROWS = [
    ("enqueue, one call per job", "enqueue_single", "enqueue", False),
    ("enqueue, bulk call", "enqueue_bulk", "enqueue", False),
    ("enqueue, bulk call of 100k", "enqueue_bulk_100k", "enqueue", False),
    ("enqueue, 50 coroutines on one App/pool", "enqueue_concurrent", "enqueue", False),
    ("enqueue, 4 producer processes", "enqueue_4proc", "enqueue", False),
    ("drain 10k, best setting", "drain_10k", "steady", True),
    ("drain 100k, 1 process", "drain_100k", "steady", True),
    ("drain, 2 processes", "drain_2proc", "steady", True),
    ("drain 100k, 1 process, start to exit", "drain_100k", "wall", True),
    ("drain, 2 processes, start to exit", "drain_2proc", "wall", True),
    ("drain, 1M finished rows present", "finished_1m", "steady", True),
    ("drain by a batch handler (batch 100)", "drain_batched", "steady", True),
    ("idle latency p50 (ms)", "latency", "p50", False),
    ("idle latency p95 (ms)", "latency", "p95", False),
    ("idle latency p99 (ms)", "latency", "p99", False),
    ("commits per job (drain)", "drain_100k", "commits", True),
    ("WAL bytes per job (drain)", "drain_100k", "wal", True),
]


def summary_table(suite: Suite) -> tuple[list[str], list[list[str]]]:
    """One row per figure, one column per system: the median (and, for drains, the setting used)."""
    names = [s.name for s in suite.systems]
    rows = []
    for label, scenario, metric, is_drain in SUMMARY_ROWS:
        cells = []
        for name in names:
            m = summary_cell(suite, scenario, name, metric, is_drain)
            if m is None and is_drain and scenario == "drain_100k":  # a slow peer runs no 100k drain
                m = summary_cell(suite, "drain_10k", name, metric, is_drain)
            if m is None:
                cells.append("-")
            else:
                cells.append(fmt(m.median, m.unit) + (f" ({m.setting}, {m.jobs:,} jobs)" if is_drain else ""))
        rows.append([label, *cells])
    for m in suite.results:
        if m.scenario == "floor" and m.values:
            rows.append([f"SQL floor, {m.setting} ({m.jobs:,} jobs)", fmt(m.median, m.unit), *["-"] * (len(names) - 1)])
    return ["figure", *names], rows


def summary_cell(suite: Suite, scenario: str, system: str, metric: str, is_drain: bool) -> Measurement | None:
    """The measurement for one cell; for drains, at the setting with the best steady rate."""
    setting = None
    if is_drain:
        steady = [m for m in suite.results if (m.scenario, m.system, m.metric) == (scenario, system, "steady")]
        if not steady:
            return None
        setting = max(steady, key=lambda m: m.median).setting
    return suite.find(scenario, system, metric, setting)


def render_text_table(rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADER)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    previous = ""
    for row in rows:
        if previous and row[0] != previous:
            lines.append("")
        previous = row[0]
        lines.append(
            "  ".join(c.rjust(w) if i >= 3 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    return "\n".join(lines)


def render_markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def environment(server: Server, suite: Suite, peers_python: Path | None) -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = subprocess.run(["free", "-h"], capture_output=True, text=True, check=False).stdout
    mem_total = next((line.split()[1] for line in memory.splitlines() if line.startswith("Mem:")), "?")
    versions = {s.name: s.version for s in suite.systems}
    versions["psycopg"] = package_version(Path(sys.executable), "psycopg")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True).stdout
    if peers_python is not None and "pgqueuer" in versions:
        versions["asyncpg (pgqueuer's driver)"] = package_version(peers_python, "asyncpg")
    for system in suite.systems:
        if system.name == "graphile":
            node = subprocess.run([str(system.runtime), "--version"], capture_output=True, text=True, check=False)
            versions["Node.js (graphile-worker's runtime)"] = node.stdout.strip().lstrip("v") or "?"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem_total,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": head.strip()
        + (f" with uncommitted changes in {len(dirty.splitlines())} file(s) under src/" if dirty else ""),
        "postgres": server.describe(),
        "versions": versions,
        "load": server.load,
        "busy": server.busy,
        "other_active": server.other_active,
    }


def render_doc_block(
    server: Server, suite: Suite, env: dict[str, Any], command: str, started: float, ended: float
) -> str:
    pg = env["postgres"]
    load = env["load"] or [math.nan]
    busy = env["busy"] or [math.nan]
    others = env["other_active"] or [0]
    lines = [
        BEGIN,
        "<!-- Generated by bench/run.py: edits between these markers are overwritten by the next run. -->",
        "",
        f"Run of {time.strftime('%Y-%m-%d %H:%M %Z', time.localtime(started))}, {(ended - started) / 60:.1f} minutes, "
        f"{suite.runs} runs per figure (median, min–max).",
        "",
        "### Machine and server",
        "",
        f"- CPU: {env['cpu']}, {env['cores']} cores; memory {env['memory']}; Linux {env['kernel']}; "
        f"Python {env['python']}",
        f"- PostgreSQL {pg['server_version']} on the same machine (127.0.0.1, TCP): fsync={pg['fsync']}, "
        f"synchronous_commit={pg['synchronous_commit']}, full_page_writes={pg['full_page_writes']}, "
        f"wal_level={pg['wal_level']}, shared_buffers={pg['shared_buffers']}, max_wal_size={pg['max_wal_size']}, "
        f"checkpoint_timeout={pg['checkpoint_timeout']}; every table logged (durable).",
        "- Versions: " + ", ".join(f"{name} {version}" for name, version in env["versions"].items()),
        f"- jobbus source: commit {env['commit']}",
        f"- Noise: before each measurement the "
        f"suite waits up to {server.quiet_wait:.0f} s for the CPUs to be less than "
        f"{(server.quiet_threshold or 1):.0%} busy; the busy fraction then was {min(busy):.0%}–{max(busy):.0%} "
        f"(median {statistics.median(busy):.0%}), the 1-minute load average {min(load):.2f}–{max(load):.2f}, "
        f"other active sessions on the server {min(others)}–{max(others)}.",
        "",
        "### Command",
        "",
        "```",
        command,
        "```",
        "",
        "### Summary (medians; drains at each system's best setting, jobs/s between first and last handler start)",
        "",
        "Rows that say *start to exit* are jobs / (worker start to worker exit) instead.",
        "",
        render_markdown_table(*summary_table(suite)),
        "",
        "The SQL floor rows are pure SQL (no queue library), shown in the first column for scale.",
        "",
        "### All figures",
        "",
        render_markdown_table(HEADER, table_rows(suite)),
        "",
    ]
    notes = [m for m in suite.results if m.note]
    peer_notes = [f"- {name}: {text}" for name, text in suite.notes.items()]
    if notes or peer_notes:
        lines += ["Notes from the run:", ""]
        lines += peer_notes
        lines += [f"- {m.scenario} / {m.system}: {m.note}" for m in notes]
        lines.append("")
    targets = evaluate_targets(suite)
    lines += ["### Targets (issues 6, 12 and 24)", ""]
    verdict = {True: "met", False: "**missed**", None: "not measured"}
    lines.append(
        render_markdown_table(["target", "measured", ""], [[t.text, t.measured, verdict[t.met]] for t in targets])
    )
    lines += ["", END]
    return "\n".join(lines)


def write_doc(block: str, path: Path) -> None:
    if path.exists():
        text = path.read_text(encoding="utf-8")
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            path.write_text(head + block + tail, encoding="utf-8")
            return
        path.write_text(text.rstrip() + "\n\n## Latest run\n\n" + block + "\n", encoding="utf-8")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Benchmarks\n\n## Latest run\n\n" + block + "\n", encoding="utf-8")


def save_raw(suite: Suite, env: dict[str, Any], command: str, started: float, ended: float) -> None:
    RAW.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "command": command,
        "started": started,
        "ended": ended,
        "runs": suite.runs,
        "environment": env,
        "results": [
            {k: getattr(m, k) for k in ("scenario", "system", "setting", "jobs", "metric", "unit", "values", "note")}
            for m in suite.results
        ],
    }
    RAW.write_text(json.dumps(data, indent=1), encoding="utf-8")


# -- main ------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and sweeps")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="run only this scenario (repeatable)")
    parser.add_argument("--systems", default="jobbus,pgqueuer,procrastinate,oban,graphile", help="comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--output", type=Path, help=f"doc to update (default {DOC.relative_to(ROOT)} for a full run)")
    parser.add_argument("--reinstall-peers", action="store_true", help="retry installing peers that failed before")
    parser.add_argument(
        "--scale",
        type=float,
        help="capacity scenarios: 1M queued / 10M finished rows times this (default 0.1, --quick 0.02; 1 = full)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        help="raw figures of an earlier run (a copy of bench/results/latest.json): its scenarios that this "
        "run does not measure are added to the table, the targets and the doc, with a note saying so",
    )
    parser.add_argument(
        "--retention-budget", type=float, help="retention: seconds of batched DELETE at most (default 120)"
    )
    return parser.parse_args(argv)


def merge_earlier(suite: Suite, path: Path, measured: set[str]) -> None:
    """Adds an earlier run's figures of the scenarios not measured now, and each system's best drain setting."""
    data = json.loads(path.read_text(encoding="utf-8"))
    taken = sorted({r["scenario"] for r in data["results"] if r["scenario"] not in measured})
    for r in data["results"]:
        if r["scenario"] not in measured:
            suite.results.append(Measurement(**r))
    for system in suite.systems:
        steady = [m for m in suite.results if (m.scenario, m.system, m.metric) == ("drain_10k", system.name, "steady")]
        best = max(steady, key=lambda m: m.median, default=None)
        if best is not None and system.best is None:
            system.best = next((s for s in system.sweep if s.label == best.setting), None)
    started = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(float(data["started"])))
    suite.notes["merged"] = f"{', '.join(taken)}: from the run of {started} ({data['command']}), not measured again"
    log(f"merged {len(taken)} scenarios from {path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = sorted(set(wanted) - {"jobbus", *PEERS, *NODE_PEERS})
    if unknown:
        print(f"unknown system(s): {', '.join(unknown)}", file=sys.stderr)
        return 64
    scenarios = args.scenario or SCENARIOS
    sizes = QUICK if args.quick else Sizes()
    if args.scale is not None:
        sizes = replace(sizes, scale=args.scale)
    if args.retention_budget is not None:
        sizes = replace(sizes, retention_budget=args.retention_budget)
    server = server_from(args)
    started = time.time()
    peer_notes: dict[str, str] = {}
    peers = [name for name in wanted if name in PEERS]
    peers_python = ensure_peers(peers, args.reinstall_peers, peer_notes) if peers else None
    node_peers = [name for name in wanted if name in NODE_PEERS]
    node = ensure_node_peers(node_peers, args.reinstall_peers, peer_notes) if node_peers else None
    systems: list[System] = []
    if "jobbus" in wanted:
        systems.append(jobbus_system(args.quick))
    if peers_python is not None:
        if "pgqueuer" in peers and "pgqueuer" not in peer_notes:
            systems.append(pgqueuer_system(peers_python, args.quick))
        if "procrastinate" in peers and "procrastinate" not in peer_notes:
            systems.append(procrastinate_system(peers_python, args.quick))
        if "oban" in peers and "oban" not in peer_notes:
            peer_notes["oban"] = "installed, but bench/peers has no oban driver for this version yet"
    if node is not None and "graphile" in node_peers and "graphile" not in peer_notes:
        systems.append(graphile_system(node))
    suite = Suite(server, systems, sizes, args.runs)
    suite.notes = peer_notes
    for name, text in peer_notes.items():
        log(f"{name}: {text}")
    if args.merge is not None:  # before the run: the earlier best drain settings apply to this run's drains
        merge_earlier(suite, args.merge, set(scenarios) | ({"drain_100k"} if "commits" in scenarios else set()))
    try:
        if "enqueue_single" in scenarios:
            suite.enqueue("enqueue_single", "enqueue_single", sizes.single)
        if "enqueue_bulk" in scenarios:
            suite.enqueue("enqueue_bulk", "enqueue_bulk", sizes.bulk)
        if "enqueue_bulk_100k" in scenarios:
            suite.enqueue("enqueue_bulk_100k", "enqueue_bulk", sizes.bulk_large)
        if "enqueue_concurrent" in scenarios:
            suite.enqueue("enqueue_concurrent", "enqueue_concurrent", sizes.concurrent, concurrency=sizes.coroutines)
        if "enqueue_4proc" in scenarios:
            capacity.enqueue_processes(suite)
        if "drain_10k" in scenarios:
            suite.drain("drain_10k", sizes.drain_small, sweep=True)
        if "drain_100k" in scenarios or "commits" in scenarios:
            suite.drain("drain_100k", sizes.drain_large, sweep=False)
        if "drain_2proc" in scenarios:
            suite.drain("drain_2proc", sizes.drain_large, sweep=False, processes=2)
        if "latency" in scenarios:
            suite.latency()
        if "finished_1m" in scenarios:
            suite.finished()
        if "drain_limited" in scenarios:
            suite.limited()
        if "drain_batched" in scenarios:
            suite.batched()
        if "encryption" in scenarios:
            suite.encrypted()
        if "floor" in scenarios:
            suite.floor()
        if "drain_procs" in scenarios:
            capacity.drain_processes(suite)
        if "backlog" in scenarios:
            capacity.backlog(suite)
        if "retention" in scenarios:
            capacity.retention(suite)
    except KeyboardInterrupt:
        log("interrupted: dropping the benchmark databases")
        return 130
    finally:
        server.drop_all()
    ended = time.time()
    rows = table_rows(suite)
    print()
    print(render_text_table(rows))
    print()
    for t in evaluate_targets(suite):
        mark = {True: "met", False: "MISSED", None: "n/a"}[t.met]
        print(f"  [{mark:>6}] {t.text}: {t.measured}")
    for name, text in peer_notes.items():
        print(f"  note: {name}: {text}")
    env = environment(server, suite, peers_python)
    command = " ".join([".venv/bin/python bench/run.py", *(argv if argv is not None else sys.argv[1:])])
    save_raw(suite, env, command, started, ended)
    full = not args.scenario and not args.quick and args.merge is None
    output = args.output or (DOC if full else None)
    if output is not None:
        write_doc(render_doc_block(server, suite, env, command, started, ended), output)
        log(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
