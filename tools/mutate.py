"""Break each promise on purpose and check that its tests notice: `make mutate` (a release runs it).

Every break of tools/mutations.py is applied, one at a time, to a scratch copy of the tree (the files git
tracks or would track, uncommitted edits included; never the working tree), and the break's tests run
there against the tests' server (`JOBBUS_TEST_DSN`, else the embedded one). A break whose tests all pass
is *missed*: a promise that can break without a test failing. A break of a migration builds its own
template database from the broken migrations, dropped after its run.

    python tools/mutate.py                 # every break; exit 1 when one is missed
    python tools/mutate.py --only NAME     # one break (repeatable)
    python tools/mutate.py --list          # the breaks, their promises and tests
    python tools/mutate.py --check         # only that every break still finds its text (no tests run)

Before any break the tests run once on the unbroken copy: they must pass, or a failure would be taken
for a catch (exit 2).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/mutate.py` puts tools/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from tools.mutations import BREAKS, MIGRATIONS, Break  # noqa: E402

#: Longest a break's tests may run before the break counts as an error (pytest's own timeout is 180 s
#: per test).
RUN_TIMEOUT = 900.0
_DROP_TEMPLATE = "from tests.dbserver import drop_template, server_dsn; drop_template(server_dsn())"


class BreakError(Exception):
    """A break that no longer applies: its text is not where it says."""


@dataclass(frozen=True, slots=True)
class Result:
    brk: Break
    verdict: str  # "caught", "missed" or "error"
    seconds: float
    detail: str


def check_break(brk: Break, tree: Path) -> None:
    """Raise BreakError unless `brk.original` occurs exactly `brk.count` times in its file, and (for a
    migration) no later migration repeats it, which would undo the break."""
    path = tree / brk.file
    if not path.is_file():
        raise BreakError(f"{brk.name}: {brk.file} does not exist")
    found = path.read_text().count(brk.original)
    if found != brk.count:
        raise BreakError(
            f"{brk.name}: its original text occurs {found} times in {brk.file}, not {brk.count}: "
            "update tools/mutations.py to the code as it is"
        )
    if brk.file.startswith(MIGRATIONS + "/"):
        later = sorted(p for p in (tree / MIGRATIONS).glob("*.sql") if p.name > path.name)
        for migration in later:
            if brk.original in migration.read_text():
                raise BreakError(
                    f"{brk.name}: {MIGRATIONS}/{migration.name} repeats its text after {brk.file}: "
                    "break the later migration instead"
                )


def scratch_copy(destination: Path) -> None:
    """Copy the files git tracks or would track (uncommitted edits included) into `destination`."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _environment(tree: Path) -> dict[str, str]:
    """The scratch tree's code first on the path: the tests and every worker process they start import it."""
    path = os.pathsep.join([str(tree / "src"), str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}


def run_tests(tree: Path, tests: Sequence[str]) -> tuple[int | None, str]:
    """Run `tests` in `tree`, stopping at the first failure: pytest's exit code (None on timeout) and output."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0", *tests]
    try:
        done = subprocess.run(
            command, cwd=tree, env=_environment(tree), capture_output=True, text=True, timeout=RUN_TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout if isinstance(exc.stdout, str) else ""
        return None, output
    return done.returncode, done.stdout + done.stderr


def _failed(output: str) -> str:
    """The tests pytest's summary names as failed or in error."""
    names = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)
    return ", ".join(names) or "(no test named)"


def apply(brk: Break, tree: Path) -> str:
    """Write the break into the scratch tree; returns the file's original text, written back after."""
    path = tree / brk.file
    text = path.read_text()
    path.write_text(text.replace(brk.original, brk.replacement))
    return text


def try_break(brk: Break, tree: Path) -> Result:
    original = apply(brk, tree)
    started = time.monotonic()
    try:
        code, output = run_tests(tree, brk.tests)
    finally:
        if brk.file.startswith(MIGRATIONS + "/"):
            # Drop the broken template while the broken migrations name it.
            subprocess.run(
                [sys.executable, "-c", _DROP_TEMPLATE],
                cwd=tree,
                env=_environment(tree),
                check=False,
                capture_output=True,
            )
        (tree / brk.file).write_text(original)
    seconds = time.monotonic() - started
    if code == 1:
        return Result(brk, "caught", seconds, _failed(output))
    if code == 0:
        return Result(brk, "missed", seconds, "every test passed with the break in place")
    tail = "\n".join(output.strip().splitlines()[-5:])
    why = "timed out" if code is None else f"pytest exited {code}"
    return Result(brk, "error", seconds, f"{why}: {tail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/mutate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this break (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the breaks and exit")
    parser.add_argument("--check", action="store_true", help="check that every break finds its text, run nothing")
    args = parser.parse_args(argv)

    known = {b.name: b for b in BREAKS}
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        parser.error(f"no break named {', '.join(unknown)}; `--list` shows them")
    chosen = [known[name] for name in args.only] if args.only else list(BREAKS)
    if args.list:
        for brk in chosen:
            print(f"{brk.name}\n  promise: {brk.promise}\n  breaks:  {brk.file}\n  tests:   {', '.join(brk.tests)}")
        return 0
    try:
        for brk in chosen:
            check_break(brk, ROOT)
    except BreakError as exc:
        print(f"mutate: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(chosen)} breaks find their text")
        return 0

    with tempfile.TemporaryDirectory(prefix="jobbus-mutate-") as scratch:
        tree = Path(scratch)
        scratch_copy(tree)
        tests = sorted({test for brk in chosen for test in brk.tests})
        print(f"unbroken: {len(tests)} test targets ...", flush=True)
        started = time.monotonic()
        code, output = run_tests(tree, tests)
        if code != 0:
            print(output, file=sys.stderr)
            print(f"mutate: the tests fail without any break ({_failed(output)}): fix them first", file=sys.stderr)
            return 2
        print(f"unbroken: pass ({time.monotonic() - started:.0f} s)", flush=True)
        results = []
        for n, brk in enumerate(chosen, 1):
            print(f"[{n}/{len(chosen)}] {brk.name} ...", end=" ", flush=True)
            result = try_break(brk, tree)
            results.append(result)
            print(f"{result.verdict} ({result.seconds:.0f} s): {result.detail}", flush=True)
    missed = [r for r in results if r.verdict != "caught"]
    print(f"\n{len(results) - len(missed)} of {len(results)} breaks caught")
    for result in missed:
        print(f"  {result.verdict}: {result.brk.name} ({result.brk.promise}): {result.detail}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
