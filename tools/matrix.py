"""The version matrix: the database-facing suites on every supported PostgreSQL major and Python.

Each leg pairs a PostgreSQL major with a Python. It downloads the major's server binaries once
(tests/pgbinaries.py), starts a throwaway cluster of them on a free port, points `JOBBUS_TEST_DSN` at
it and `JOBBUS_TEST_PG_BINDIR` at the binaries (the fault tests' own clusters run the same major), and
runs `SUITES` with that Python's venv. The legs cover every major 14-18 and every Python 3.11-3.13
(the full suite runs on 3.11 in `make test`). The leg of 13 runs the tests marked `matrix`: a real
PostgreSQL 13, which `jobbus migrate` and a worker must refuse. A leg whose binaries or Python cannot
be had fails, saying why. Every leg prints its duration; the run ends with one line per leg.

    python tools/matrix.py                      every leg (`make matrix`)
    python tools/matrix.py --pg 17              the legs of PostgreSQL 17 (`make matrix PG=17`)
    python tools/matrix.py --pg 17 --py 3.13    that pair, listed or not (`make matrix PG=17 PY=3.13`)
    python tools/matrix.py --list               the legs, one `PG=.. PY=..` a line (what .ci/run loops over)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/matrix.py` puts tools/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from tests import pgbinaries  # noqa: E402
from tests.cluster import throwaway_cluster  # noqa: E402

#: What a leg of a supported major runs, within CI's time (about three minutes a leg on its 2-core
#: machine): the store and the schema, current.sql as each major prints it, the worker's tests of what
#: the database decides (attempts, fencing, claims under limits, rescue, statistics, errors,
#: cancellation, maintenance), a crash and recovery of the server under load, and the model check's
#: shortest fixed seed. The rest of the worker, fault and model tests run on the full suite's server.
SUITES = (
    "tests/test_store.py",
    "tests/test_schema.py",
    "tests/test_current_sql.py",
    "tests/worker/test_attempts.py",
    "tests/worker/test_fencing.py",
    "tests/worker/test_flow_claims.py",
    "tests/worker/test_rescuer.py",
    "tests/worker/test_queue_stats.py",
    "tests/worker/test_database_errors.py",
    "tests/worker/test_cancellation.py",
    "tests/worker/test_maintainer.py",
    "tests/faults/test_faults.py::test_postgres_restart_and_crash_while_busy[immediate]",
    "tests/model/test_model_check.py::test_model_check[1]",
)
#: What the leg of an unsupported major runs: the refusal tests.
REFUSAL = ("-m", "matrix", "tests/test_old_server.py")
#: The pytest options of every leg: both cores, no cache written into the checkout.
PYTEST_OPTIONS = ("-n", "2", "-q", "-p", "no:cacheprovider")

OLDEST_SUPPORTED = 14


@dataclass(frozen=True)
class Leg:
    major: int
    python: str

    def __str__(self) -> str:
        return f"PostgreSQL {self.major}, Python {self.python}"

    def tests(self) -> tuple[str, ...]:
        return SUITES if self.major >= OLDEST_SUPPORTED else REFUSAL


#: Every supported major once, every Python at least once beside the full suite's 3.11, and 13's refusal.
LEGS = (
    Leg(14, "3.11"),
    Leg(15, "3.13"),
    Leg(16, "3.12"),
    Leg(17, "3.12"),
    Leg(18, "3.13"),
    Leg(13, "3.11"),
)


class LegUnavailable(RuntimeError):
    """What a leg needs (server binaries, a Python) cannot be had."""


def chosen_legs(major: int | None, python: str | None) -> list[Leg]:
    if major is not None and python is not None:
        return [Leg(major, python)]
    legs = [leg for leg in LEGS if major in (None, leg.major) and python in (None, leg.python)]
    if not legs:
        raise SystemExit(f"matrix: no leg has {'PostgreSQL ' + str(major) if major else 'Python ' + str(python)}")
    return legs


def interpreter(version: str) -> Path:
    """pyenv's newest X.Y, else the `pythonX.Y` on PATH: the first that runs and is that version (a
    pyenv shim of a version pyenv does not enable fails)."""
    versions = Path("~/.pyenv/versions").expanduser()
    candidates = sorted(versions.glob(f"{version}.*/bin/python{version}"), key=_patch_level, reverse=True)
    on_path = shutil.which(f"python{version}")
    for candidate in [*candidates, *([Path(on_path)] if on_path else [])]:
        if _version_of(candidate) == version:
            return candidate
    raise LegUnavailable(
        f"Python {version} is not installed (no working python{version} in ~/.pyenv/versions or on PATH)"
    )


def _patch_level(python: Path) -> int:
    """3.12.10 after 3.12.9: the patch number of pyenv's `X.Y.Z/bin/pythonX.Y`."""
    patch = python.parent.parent.name.rsplit(".", 1)[-1]
    return int(patch) if patch.isdigit() else -1


def venv_for(version: str) -> Path:
    """A venv of `version` with jobbus and its development extras: `.venv` when it is that Python
    (`make venv` built it), else `.venv-pyX.Y`, built or refreshed when pyproject.toml is newer."""
    main = ROOT / ".venv"
    if (main / ".installed").exists() and _version_of(main / "bin" / "python") == version:
        return main
    venv = ROOT / f".venv-py{version}"
    installed = venv / ".installed"
    if installed.exists() and installed.stat().st_mtime >= (ROOT / "pyproject.toml").stat().st_mtime:
        return venv
    python = interpreter(version)
    print(f"matrix: building {venv.name} with {python}", flush=True)
    started = time.monotonic()
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run([*pip, "-e", f"{ROOT}[dev]"], capture_output=True, text=True)
    if done.returncode != 0:  # pip's output only then: its warnings about index settings drown a leg's
        print(done.stdout + done.stderr, file=sys.stderr)
        raise LegUnavailable(f"installing jobbus[dev] into {venv.name} failed (pip's output above)")
    installed.touch()
    print(f"matrix: {venv.name} built in {time.monotonic() - started:.0f}s", flush=True)
    return venv


def _version_of(python: Path) -> str:
    """X.Y of an interpreter, or "" when it does not run."""
    done = subprocess.run(
        [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    )
    return done.stdout.strip()


def run_leg(leg: Leg) -> bool:
    """Run one leg; True when its tests passed."""
    print(f"=== matrix: {leg}: {' '.join(leg.tests())}", flush=True)
    tarball = pgbinaries.download(leg.major)  # first: a download that fails fails the leg at once
    venv = venv_for(leg.python)
    command = [str(venv / "bin" / "python"), "-m", "pytest", *PYTEST_OPTIONS, *leg.tests()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBBUS_")}
    if leg.major < OLDEST_SUPPORTED:  # the refusal tests start their own server
        return subprocess.run(command, cwd=ROOT, env=env).returncode == 0
    with tempfile.TemporaryDirectory(prefix=f"jobbus-pg{leg.major}-") as unpacked:
        bindir = pgbinaries.unpack(tarball, Path(unpacked))
        with throwaway_cluster(bindir) as cluster:
            env["JOBBUS_TEST_DSN"] = cluster.dsn
            env["JOBBUS_TEST_PG_BINDIR"] = str(bindir)
            return subprocess.run(command, cwd=ROOT, env=env).returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--pg", type=int, help="a PostgreSQL major (13 runs the refusal tests)")
    parser.add_argument("--py", help="a Python version, X.Y")
    parser.add_argument("--list", action="store_true", help="print the legs and exit")
    args = parser.parse_args(argv)
    legs = chosen_legs(args.pg, args.py)
    if args.list:
        for leg in legs:
            print(f"PG={leg.major} PY={leg.python}")
        return 0
    results = []
    for leg in legs:
        started = time.monotonic()
        try:
            result = "ok" if run_leg(leg) else "FAILED (tests)"
        except (LegUnavailable, pgbinaries.BinariesUnavailable) as exc:
            print(f"matrix: {leg}: {exc}", file=sys.stderr, flush=True)
            result = "FAILED (unavailable)"
        seconds = time.monotonic() - started
        print(f"=== matrix: {leg}: {result} in {seconds:.0f}s", flush=True)
        results.append((leg, result, seconds))
    if len(results) > 1:
        print("=== matrix summary")
        for leg, result, seconds in results:
            print(f"{leg!s:32} {result:22} {seconds:5.0f}s")
    return 0 if all(result == "ok" for _, result, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
