"""bench/migrate.py at a tiny size: every migration since the previous release is applied under traffic."""

from __future__ import annotations

import pytest
from bench import migrate as bench_migrate

from jobbus import schema


def test_the_migration_bench_applies_each_later_migration_and_prints_its_row(
    admin_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_migrate.main(["--rows", "3000", "--dsn", admin_dsn]) == 0
    out = capsys.readouterr().out
    assert "schema of 0.2.0 (149910a, migration 14); inserting 3,000 jobs" in out
    rows = [line for line in out.splitlines() if line.startswith("| 00")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [
        m.key for m in schema.migrations() if m.version > bench_migrate.RELEASE[2]
    ]
    assert "| 0015_failure_groups | ACCESS EXCLUSIVE |" in out
    assert "| 0026_view_indexes | SHARE UPDATE EXCLUSIVE |" in out  # recorded; a short build can go unseen
    assert "longest lock wait imposed on schedule or a claim:" in out
    for row in rows:
        waits_and_calls = [float(cell.split(" (")[0].replace(",", "")) for cell in row.split(" | ")[3:7]]
        assert all(0 <= value < 5_000 for value in waits_and_calls), row
