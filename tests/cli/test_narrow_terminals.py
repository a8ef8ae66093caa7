"""On an 80-column terminal (and narrower) the tables stay readable: an id is never cut short, a
header is never cut to a stub; the least important columns are left out instead."""

from __future__ import annotations

import pytest

from tests.cli import jobbus, running_workers


@pytest.mark.parametrize("columns", ["50", "80", "100", "200"])
def test_ids_and_headers_stay_whole_at_any_width(dsn: str, columns: str) -> None:
    scheduled = jobbus(dsn, "schedule", "report.render", "--queue", "reports-of-the-quarter")
    assert scheduled.returncode == 0, scheduled.stderr
    job_id = scheduled.stdout.strip()
    with running_workers(dsn, ("narrow-terminal-worker", ())):
        views = {args: jobbus(dsn, *args, COLUMNS=columns) for args in [("jobs", "list"), ("workers",), ("status",)]}
    for args, result in views.items():
        assert result.returncode == 0, (args, result.stderr)
        assert "…" not in result.stdout, (args, result.stdout)
        assert all(len(line) <= int(columns) for line in result.stdout.splitlines()), (args, result.stdout)
    assert job_id in views["jobs", "list"].stdout and "queued" in views["jobs", "list"].stdout
    assert "narrow-terminal-worker" in views["workers",].stdout
    assert "reports-of-the-quarter" in views["status",].stdout
    if columns == "200":
        for header in ("type", "queue", "attempts", "created", "when", "last error"):
            assert header in views["jobs", "list"].stdout
        for header in ("host", "pid", "last seen"):
            assert header in views["workers",].stdout
        assert "oldest wait" in views["status",].stdout
