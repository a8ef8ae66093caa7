"""`jobbus bench`: measures in a throwaway schema and leaves the application's schema alone."""

from __future__ import annotations

import json

import psycopg

from tests.cli import jobbus


def _schemas(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def test_burn_down_reports_figures_and_drops_its_schema(dsn: str) -> None:
    result = jobbus(dsn, "bench", "--jobs", "300", "--concurrency", "20", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["mode"], report["jobs"], report["jobs_run"]) == ("burn-down", 300, 300)
    assert report["jobs_per_second"] > 0 and report["latency_ms"]["p99"] >= report["latency_ms"]["p50"] > 0
    assert "jobbus_bench" not in _schemas(dsn)
    assert "jobbus" in _schemas(dsn)


def test_steady_mode_runs(dsn: str) -> None:
    result = jobbus(dsn, "bench", "--mode", "steady", "--rate", "200", "--jobs", "200", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["mode"], report["jobs_run"], report["offered_rate"]) == ("steady", 200, 200)


def test_refuses_the_application_schema(dsn: str) -> None:
    result = jobbus(dsn, "bench", "--schema", "jobbus", "--jobs", "10")
    assert result.returncode == 64, (result.stdout, result.stderr)
