"""`jobbus demo` on the embedded PostgreSQL, end to end, without a terminal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import jobbus


@pytest.mark.smoke
def test_demo_runs_to_the_end_on_the_embedded_server(tmp_path: Path) -> None:
    pytest.importorskip("pgserver")
    result = jobbus(None, "demo", "--data-dir", str(tmp_path / "pgdata"), timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "using the embedded PostgreSQL" in result.stderr
    out = result.stdout
    assert "what happened" in out and "jobs that did not complete" in out
    assert "NonRetryableError" in out and "550 mailbox unavailable" in out and "cancelled while running" in out
    assert "jobbus status" in out  # the next commands to try
