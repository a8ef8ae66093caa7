"""mypy on one file of tests/typing_fixtures, strict and without the project's configuration, as in a user's project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mypy_output(fixture: str) -> str:
    """What mypy prints about `tests/typing_fixtures/<fixture>`, which must have errors."""
    command = ["mypy", "--strict", "--no-incremental", "--config-file", "/dev/null", f"tests/typing_fixtures/{fixture}"]
    result = subprocess.run(
        [sys.executable, "-m", *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stdout
