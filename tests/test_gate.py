"""The per-job cost gate (bench/gate.py): its verdict, and one real measured drain."""

from __future__ import annotations

import pytest
from bench import gate

BASELINE = {
    "calls_per_job": 200.0,
    "enqueue_bulk_calls_per_job": 5.0,
    "enqueue_single_calls_per_job": 400.0,
    "cpu_us_per_job": 100.0,
    "commit": "abc1234",
}
PRODUCER = {"enqueue_bulk_calls_per_job": 5.5, "enqueue_single_calls_per_job": 390.0}


def test_within_the_tolerance_passes() -> None:
    figures = {"calls_per_job": 229.9, "cpu_us_per_job": 500.0, **PRODUCER}
    assert gate.compare(figures, BASELINE, 0.15, gate.COUNTS) == []


def test_a_regression_names_the_figure() -> None:
    figures = {"calls_per_job": 231.0, "cpu_us_per_job": 90.0, **PRODUCER}
    [failure] = gate.compare(figures, BASELINE, 0.15, (*gate.COUNTS, "cpu_us_per_job"))
    assert failure.startswith("gate: calls_per_job regressed: 231.0 per job against a baseline of 200.0")
    assert "+15.5 %" in failure and "abc1234" in failure


def test_objects_left_to_the_cyclic_collector_fail_past_the_ceiling_whatever_the_baseline() -> None:
    assert gate.cycles({"cycle_objects_per_job": 0.03}) == []
    [failure] = gate.cycles({"cycle_objects_per_job": 12.7})
    assert failure.startswith("gate: cycle_objects_per_job is 12.7: the drain left 12.7 objects per job")
    [failure] = gate.cycles({"cycle_objects_per_job": 0.03, "batched_cycle_objects_per_job": 9.0})
    assert failure.startswith("gate: batched_cycle_objects_per_job is 9.0: the drain left 9.0 objects per job")


@pytest.mark.timeout(300)
def test_a_measured_drain_counts_calls_per_job(admin_dsn: str) -> None:
    figures = gate.measure(admin_dsn, 300, 20)
    # Every job costs the worker at least its claim, its handler call and its outcome: far more than 50 calls.
    assert figures["calls_per_job"] > 50
    assert figures["cpu_us_per_job"] > 0
    # Reference counting frees every attempt: next to nothing is left to the cyclic collector.
    assert 0 <= figures["cycle_objects_per_job"] <= gate.CYCLE_OBJECTS_CEILING
    # A batch handler's attempts too (a batch and its attempts refer to each other until its slot is freed).
    assert 0 <= figures["batched_cycle_objects_per_job"] <= gate.CYCLE_OBJECTS_CEILING
    # A job scheduled alone pays for a whole statement; one of a batch shares it.
    assert figures["enqueue_single_calls_per_job"] > 5 * figures["enqueue_bulk_calls_per_job"] > 0
