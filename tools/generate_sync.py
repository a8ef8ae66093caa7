"""Write the blocking twin of the producer verbs, src/jobbus/producer/_sync.py, from _async.py.

Each rule replaces a run of tokens (``async def`` → ``def``, ``await`` → nothing, ``AsyncConnection`` →
``Connection``, ...); strings and comments are left as written, so the twin keeps every docstring.
ruff then sorts the imports and formats the result, so the generated file is lint-clean as written.

    python tools/generate_sync.py            # write the twin (`make sync`)
    python tools/generate_sync.py --check    # exit 1 if it is stale or a rule matched nothing (`make lint`)
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src/jobbus/producer/_async.py"
TARGET = ROOT / "src/jobbus/producer/_sync.py"
HEADER = (
    "# GENERATED from _async.py by tools/generate_sync.py: do not edit; run `make sync` after changing _async.py.\n"
)
DOCSTRING = '"""The blocking producer and admin verbs that `SyncApp` runs: the twin of `_async.py`, generated."""'
#: A name still holding one of these after the rules ran needs a rule of its own.
LEFTOVER = re.compile(r"async|await", re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    """Consecutive tokens to find, and the text they become ("" deletes them and the spaces after)."""

    tokens: tuple[str, ...]
    replacement: str


RULES = (
    Rule(("async", "def"), "def"),
    Rule(("async", "with"), "with"),
    Rule(("await",), ""),
    Rule(("import", "asyncio"), "import time"),
    Rule(("asyncio", ".", "sleep"), "time.sleep"),
    Rule(("AsyncProducer",), "SyncProducer"),
    Rule(("AsyncConnection",), "Connection"),
    Rule(("AbstractAsyncContextManager",), "AbstractContextManager"),
    Rule(("run_async",), "run_sync"),
    Rule(("FinishedJobs",), "SyncFinishedJobs"),
    Rule(("emit",), "emit_sync"),
)


class GenerationError(Exception):
    pass


def generate(source: str) -> tuple[str, list[Rule]]:
    """The twin's text (before ruff) and the rules that matched nothing."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(position: tuple[int, int]) -> int:
        return starts[position[0] - 1] + position[1]

    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.NL]
    edits: list[tuple[int, int, str]] = []
    docstring = next((t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NEWLINE)), None)
    if docstring is None or docstring.type != tokenize.STRING:
        raise GenerationError("the source must start with its module docstring")
    edits.append((offset(docstring.start), offset(docstring.end), DOCSTRING))
    unused = []
    for rule in RULES:
        width = len(rule.tokens)
        matched = False
        for index in range(len(tokens) - width + 1):
            window = tokens[index : index + width]
            if tuple(t.string for t in window) != rule.tokens or window[0].type not in (tokenize.NAME, tokenize.OP):
                continue
            start, end = offset(window[0].start), offset(window[-1].end)
            if not rule.replacement:
                while source[end] == " ":
                    end += 1
            edits.append((start, end, rule.replacement))
            matched = True
        if not matched:
            unused.append(rule)
    text = source
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and LEFTOVER.search(token.string):
            raise GenerationError(f"line {token.start[0]} keeps {token.string!r}: add a rule for it")
    return HEADER + text, unused


def ruff(text: str, *args: str) -> str:
    """`text` through ruff with the project's configuration, as if it were the target file."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise GenerationError(f"ruff {' '.join(args)} failed:\n{done.stderr}{done.stdout}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is stale or a rule is unused")
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--target", type=Path, default=TARGET)
    args = parser.parse_args(argv)
    try:
        text, unused = generate(args.source.read_text())
        text = ruff(ruff(text, "check", "--select", "I", "--fix", "--quiet"), "format", "--quiet")
    except GenerationError as exc:
        print(f"generate_sync: {exc}", file=sys.stderr)
        return 1
    for rule in unused:
        print(f"generate_sync: the rule {' '.join(rule.tokens)!r} matched nothing in {args.source}", file=sys.stderr)
    if args.check:
        current = args.target.read_text() if args.target.exists() else ""
        if current != text:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), "on disk", "generated", lineterm="")
            print("\n".join(list(diff)[:40]), file=sys.stderr)
            print(f"generate_sync: {args.target} is stale: run `make sync`", file=sys.stderr)
            return 1
        return 1 if unused else 0
    if unused:
        return 1
    args.target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
