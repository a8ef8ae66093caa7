"""The examples under examples/ run as the docs say. The FastAPI and Django ones are driven by
tests/contrib/test_asgi.py and tests/contrib/test_django.py; the pytest plugin's by tests/test_testing.py."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_typed_tasks_example(dsn: str) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBBUS_")}
    env["JOBBUS_DSN"] = dsn
    result = subprocess.run(
        [sys.executable, "-m", "examples.typed_tasks"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "refused: task billing.send_invoice: argument 'to': Expected `str`, got `int`"
    assert lines[1] == "drained: {'completed': 1}"
    status, _, stored = lines[2].partition(": ")
    assert status == "completed"
    assert ast.literal_eval(stored) == {"invoice": "INV-7", "to": ["a@example.com", "books@example.com"], "attempt": 1}
    assert lines[3].startswith("queued: not before ")
