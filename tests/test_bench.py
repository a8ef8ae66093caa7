"""The benchmark suite's own bookkeeping (bench/): merging an earlier run, CPU readings. No database."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench import capacity, harness, run, suite


def _suite() -> suite.Suite:
    server = suite.Server("postgresql://postgres@127.0.0.1:5432/test", quiet_threshold=None)
    return suite.Suite(server, [run.jobbus_system(quick=True)], suite.QUICK, runs=1)


def test_merge_adds_only_scenarios_not_measured_again_and_their_best_setting(tmp_path: Path) -> None:
    earlier = {
        "command": "bench/run.py",
        "started": 0.0,
        "results": [
            {"scenario": "drain_10k", "system": "jobbus", "setting": "c200", "jobs": 10, "metric": "steady",
             "unit": "jobs/s", "values": [5.0], "note": ""},
            {"scenario": "drain_10k", "system": "jobbus", "setting": "c50", "jobs": 10, "metric": "steady",
             "unit": "jobs/s", "values": [3.0], "note": ""},
            {"scenario": "floor", "system": "SQL", "setting": "minimal table", "jobs": 10, "metric": "steady",
             "unit": "jobs/s", "values": [1.0], "note": ""},
        ],
    }  # fmt: skip
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier), encoding="utf-8")
    suite = _suite()

    run.merge_earlier(suite, path, measured={"floor"})

    assert {(m.scenario, m.setting) for m in suite.results} == {("drain_10k", "c200"), ("drain_10k", "c50")}
    assert suite.systems[0].best_setting.label == "c200"
    assert "drain_10k" in suite.notes["merged"]


def test_process_cpu_reads_this_process_and_not_a_missing_one() -> None:
    sum(range(200_000))  # some CPU to read
    assert (capacity.process_cpu_seconds(os.getpid()) or 0.0) > 0.0
    assert capacity.process_cpu_seconds(2**22 + 12345) is None


def test_enqueue_result_pools_on_wall_clock_stamps() -> None:
    result = harness.enqueue_result(100, started=10.0, ended=10.5)
    assert result == {"rate": 200.0, "seconds": 0.5, "started": 10.0, "ended": 10.5}
    assert harness.wait_until(0.0) == 0.0
