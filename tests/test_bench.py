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


def test_a_system_that_sits_out_a_scenario_gets_no_database_and_a_note() -> None:
    suite = _suite()
    suite.systems = [run.graphile_system(Path("node"))]

    with suite.databases("finished_1m") as dbs:
        assert dbs == {}

    (note,) = [m for m in suite.results if m.note]
    assert (note.scenario, note.system) == ("finished_1m", "graphile")
    assert note.note.startswith("sits out: graphile-worker deletes a job when it completes")


def test_graphile_targets_compare_start_to_exit_rates_of_the_same_job_count() -> None:
    suite = _suite()
    for scenario, system, setting, jobs, wall in [
        ("drain_10k", "jobbus", "c50", 10_000, 4_000.0),
        ("drain_10k", "jobbus", "c200", 10_000, 6_000.0),
        ("drain_10k", "graphile", "c24 local queue 500", 10_000, 5_000.0),
        ("drain_2proc", "jobbus", "c200", 100_000, 9_000.0),
        ("drain_2proc", "graphile", "c24 local queue 500", 30_000, 9_000.0),
    ]:
        suite.record(scenario, system, setting, jobs, "wall", "jobs/s", wall)
        suite.record(scenario, system, setting, jobs, "steady", "jobs/s", wall * 2)

    one, two = run.evaluate_targets(suite)[-2:]

    assert one.text == "drain, 1 process: ≥ 1.0× graphile-worker 1 process (24)"
    assert one.met is True
    assert one.measured.startswith("1.20× (6,000 vs 5,000 jobs/s start to exit, drain_10k, 10,000 jobs, jobbus c200)")
    assert two.text == "drain, 2 processes: ≥ 1.0× graphile-worker 2 processes (24)"
    assert (two.met, two.measured) == (None, "not measured")  # 100,000 jobs against 30,000: no comparison


def test_a_peer_is_installed_once_per_pin_and_a_failure_is_remembered(tmp_path: Path) -> None:
    calls: list[str] = []

    def install(note: str | None) -> str | None:
        calls.append(note or "ok")
        return note

    notes: dict[str, str] = {}
    run.install_once(tmp_path, "graphile", "graphile-worker@0.18.0", False, notes, lambda: install(None))
    run.install_once(tmp_path, "graphile", "graphile-worker@0.18.0", False, notes, lambda: install(None))
    assert calls == ["ok"]
    run.install_once(tmp_path, "graphile", "graphile-worker@0.19.0", False, notes, lambda: install("not run: no"))
    run.install_once(tmp_path, "graphile", "graphile-worker@0.19.0", False, notes, lambda: install(None))
    assert calls == ["ok", "not run: no"]
    assert notes == {"graphile": "not run: no"}
    run.install_once(tmp_path, "graphile", "graphile-worker@0.19.0", True, notes, lambda: install(None))
    assert calls == ["ok", "not run: no", "ok"]
