"""`jobbus demo` on the embedded PostgreSQL, end to end, without a terminal; and its next steps."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from jobbus.cli import demo
from tests.cli import jobbus
from tests.docs.examples import parse_problem


@pytest.mark.smoke
def test_demo_runs_to_the_end_on_the_embedded_server(tmp_path: Path) -> None:
    pytest.importorskip("pgserver")
    result = jobbus(None, "demo", "--data-dir", str(tmp_path / "pgdata"), timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "using the embedded PostgreSQL" in result.stderr
    assert "Warning" not in result.stderr, result.stderr  # e.g. platformdirs' RuntimeDirWarning
    out = result.stdout
    assert "what happened" in out and "jobs that did not complete" in out
    assert "NonRetryableError" in out and "550 mailbox unavailable" in out and "cancelled while running" in out
    steps = _next_commands(out)
    assert steps[:2] == ["createdb app", "export JOBBUS_DSN=postgresql://localhost/app"]
    assert "in a second terminal" in out


def test_next_steps_are_a_consistent_walk_through_of_the_real_cli() -> None:
    text = demo._next_steps(True, ".venv/bin/jobbus").plain
    commands = [shlex.split(line) for line in _next_commands(text) if line.startswith(".venv/bin/jobbus ")]
    for argv in commands:
        assert parse_problem(argv[1:]) is None, argv
    by_verb = {" ".join(argv[1:3]): argv for argv in commands}
    assert by_verb["migrate"] and by_verb["worker --app"]
    scheduled = [argv for argv in commands if argv[1] == "schedule"]
    assert scheduled and all(argv[argv.index("--queue") + 1] == "emails" for argv in scheduled)
    assert any('"bounce": true' in argv[-1] for argv in scheduled)  # so `jobs list --status failed` finds one
    assert by_verb["jobs list"][-2:] == ["--status", "failed"]
    assert by_verb["pause --queue"][3] == "emails" and by_verb["resume --queue"][3] == "emails"
    verbs = [argv[1] for argv in commands]
    assert verbs.index("pause") < verbs.index("resume") < verbs.index("drain")


@pytest.mark.parametrize(
    ("argv0", "on_path", "expected"),
    [
        (".venv/bin/jobbus", None, ".venv/bin/jobbus"),  # after `make demo`
        (".venv/bin/jobbus", ".venv/bin/jobbus", "jobbus"),  # an activated venv
        ("/usr/local/bin/jobbus", "/usr/local/bin/jobbus", "jobbus"),
        ("venv/lib/python3.11/site-packages/jobbus/__main__.py", None, "venv/bin/python -m jobbus"),
    ],
)
def test_next_steps_name_the_jobbus_that_works_from_here(
    argv0: str, on_path: str | None, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [argv0, "demo"])
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setattr(shutil, "which", lambda name: str(Path(on_path).absolute()) if on_path else None)
    assert demo._jobbus_command() == expected


def _next_commands(out: str) -> list[str]:
    """The commands of the "Next" block: its lines indented by two spaces, without the comments."""
    block = out.split("Next, against your own PostgreSQL", 1)[1]
    return [line[2:] for line in block.splitlines() if re.match(r"  \S", line) and not line.startswith("  (")]
