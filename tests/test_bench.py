"""The benchmark suite's own bookkeeping (bench/): merging an earlier run, CPU readings, the edits of the
shipped SQL that bench/unused_features.py measures without (no database), and the statement
bench/round_trips.py sends (a test database)."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from bench import apps, capacity, harness, round_trips, run, suite, unused_features

from jobbus import schema
from jobbus.requests import JobRequest
from jobbus.store import Statement
from jobbus.store.statements import queries
from jobbus.worker.producer import Producer

ROOT = Path(__file__).resolve().parent.parent


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


def _code(sql_text: str) -> str:
    return re.sub(r"--[^\n]*", "", sql_text)


def test_the_claim_edits_take_flow_control_and_expiry_out_of_the_latest_shipped_claim_function() -> None:
    shipped, where = unused_features.claim_function_template()
    version = int(where.split()[1][:4])
    assert not [
        m.name
        for m in schema.migrations()
        if m.version > version and re.search(r"FUNCTION\s+\{schema\}\.claim_jobs\b", m.template)
    ]

    stripped = unused_features.stripped_claim_function()

    for word in ("take_limited", "queue_start", "expires_at"):
        assert re.search(rf"\b{word}\b", _code(shipped))
        assert not re.search(rf"\b{word}\b", _code(stripped))
    assert stripped.startswith('CREATE OR REPLACE FUNCTION "jobbus".claim_jobs(')
    assert 'v_ids := v_ids || "jobbus".take_from_queue(v_queue, v_types, v_want, v_ids);' in stripped
    assert "SET status = 'running',\n                attempts = j.attempts + 1," in stripped


def test_a_claim_function_the_edits_no_longer_fit_stops_the_benchmark() -> None:
    shipped, where = unused_features.claim_function_template()
    renamed = shipped.replace("take_from_queue", "take_queued")
    expiry_elsewhere = shipped.replace("WHERE j.id = ANY(v_ids)", "WHERE j.id = ANY(v_ids) AND j.expires_at IS NULL")
    assert shipped not in (renamed, expiry_elsewhere)

    with pytest.raises(unused_features.SqlChanged, match="the limited branch"):
        unused_features.strip_claim_function(renamed, where)
    with pytest.raises(unused_features.SqlChanged, match="still names expires_at"):
        unused_features.strip_claim_function(expiry_elsewhere, where)


def test_the_weights_edit_records_starts_without_their_weight_and_composes_with_the_limits_edit() -> None:
    shipped, where = unused_features.claim_function_template()
    assert re.search(r"\bc\.weight\b", _code(shipped))

    unweighted = unused_features.stripped_claim_function(("weights",))
    both = unused_features.stripped_claim_function(("weights", "limits"))

    assert not re.search(r"\b(weight|units)\b", _code(unweighted))
    assert 'INSERT INTO "jobbus".queue_start (queue, concurrency_key, started_at)\n' in unweighted
    assert "take_limited" in unweighted and "expires_at" in unweighted  # flow control and expiry stay
    assert both == unused_features.stripped_claim_function(("limits", "weights"))  # one order, whatever the variant's
    for word in ("weight", "units", "take_limited", "queue_start", "expires_at"):
        assert not re.search(rf"\b{word}\b", _code(both))
    with pytest.raises(unused_features.SqlChanged, match="the units of the starts recorded"):
        unused_features.edit_claim_function(shipped.replace("c.weight", "j.weight"), where, ("weights",))


async def test_the_spec_21_schema_strips_apply_to_the_shipped_schema_and_a_plain_drain_runs_on_it(dsn: str) -> None:
    removed = ("weights", "debounce", "tags", "limits", "workflows")
    with psycopg.connect(dsn, autocommit=True) as conn:
        unused_features.strip_claim(conn, removed)
        for name in removed:
            strip = unused_features.FEATURES[name].database
            if strip is not None:
                strip(conn)
        triggers = {
            row[0] for row in conn.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'jobbus.job'::regclass")
        }
        constraints = {
            row[0] for row in conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'jobbus.job'::regclass")
        }
        columns = {
            row[0]
            for row in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'jobbus.job'::regclass AND NOT attisdropped"
            )
        }
        claim = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'claim_jobs' AND pronargs = 8").fetchone()
    assert not triggers & {"job_debounce_finished", "job_debounce_deleted", "job_key_moved"}
    assert not constraints & {"job_debounce_parked_check", "job_weight_check"}
    assert "weight" not in columns and {"tags", "unique_key", "debounce_until"} <= columns
    assert claim is not None and "weight" not in claim[0] and "take_limited" not in claim[0]

    app = apps.make_app(dsn)
    async with app:
        await app.schedule_many(harness.NOOP, [{}] * 30)
        await app.run_worker(concurrency=10, stop_when_empty=True, install_signal_handlers=False)
    with psycopg.connect(dsn) as conn:
        statuses = conn.execute("SELECT status, count(*) FROM jobbus.job GROUP BY status").fetchall()
    assert statuses == [("completed", 30)]
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.UndefinedObject):
        unused_features.strip_tags(conn)  # gone already: a renamed trigger fails the strip the same way


def test_the_batches_edit_takes_only_the_batch_diversion_out_of_the_shipped_start() -> None:
    shipped = inspect.getsource(Producer._start)

    edited = unused_features.start_without_batches()

    assert "batch_size" in shipped and "batch_size" not in edited
    assert "_start_batches" not in edited and "self.executor.start(attempt, tracer)" in edited
    assert len(edited.splitlines()) == len(shipped.splitlines()) - 6
    with pytest.raises(unused_features.SourceChanged, match="expected these lines once"):
        unused_features.start_without_batches(shipped.replace("batched.append(claimed)", "batched += [claimed]"))


def test_the_history_edit_cuts_only_the_history_entry_of_each_shipped_outcome_statement() -> None:
    shipped = queries("jobbus")

    edited = unused_features.statements_without_history()

    assert "record_outcomes" in edited
    for name, text in edited.items():
        before, after = " ".join(shipped[name].split()), " ".join(text.split())
        head = before.index(", history =")
        assert after.startswith(before[:head])
        assert before.endswith(after[head:])
        assert ", history =" not in " ".join(_code(text).split())
        with pytest.raises(unused_features.SqlChanged, match=f"query {name}: the history assignment"):
            unused_features.strip_history_entry(text, name)


def test_the_worker_process_strips_apply_to_the_shipped_worker() -> None:
    check = (
        "from bench import unused_features as u\n"
        "for feature in u.FEATURES.values():\n"
        "    if feature.process is not None:\n"
        "        feature.process()\n"
        "import jobbus\n"
        "from bench import apps\n"
        "worker = jobbus.Worker(apps.make_app('postgresql://unused.invalid/bench'))\n"
        "from jobbus.worker.producer import Producer\n"
        "print(type(worker.observers).__name__, bool(worker.observers), jobbus.tracing.current_tracer(),\n"
        "      '_start_batches' in Producer._start.__code__.co_names)\n"
    )
    strips = ",".join(unused_features.FEATURES)

    probe = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=False)
    driver = subprocess.run(
        [sys.executable, "-m", "bench.unused_features", "driver", "--strip", strips, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )

    assert (probe.returncode, probe.stdout) == (0, "NoObservers False None False\n"), probe.stderr
    assert driver.returncode == 0, driver.stderr
    assert driver.stdout.startswith("usage: ")


def test_the_pgbench_text_of_the_one_job_insert_runs_and_inserts_one_queued_job(dsn: str) -> None:
    app = apps.make_app(dsn)
    spec = app.registry.build_job_spec(JobRequest(harness.NOOP, {}))
    statement = app.store.insert_jobs([spec])
    assert isinstance(statement, Statement)

    text = round_trips.libpq_statement(statement.query, statement.params)

    assert "%(" not in text and "--" not in text and text.endswith(";\n")
    with psycopg.connect(dsn, autocommit=True) as conn:
        inserted = conn.execute(text.encode()).fetchall()
        rows = conn.execute("SELECT type, queue, status FROM jobbus.job").fetchall()
    assert len(inserted) == 1 and inserted[0][3] is True  # one row, newly inserted
    assert rows == [(harness.NOOP, "default", "queued")]


async def test_round_trips_measures_every_call_it_names(dsn: str) -> None:
    figures = await round_trips.measure(dsn, calls=5, rounds=2, gap=0.0)

    names = {"SELECT 1, psycopg", "jobbus's insert, bare psycopg", "app.schedule"}
    assert names <= set(figures)
    assert all(len(figures[name]) == 2 and all(wall > 0 for wall, _ in figures[name]) for name in names)
    with psycopg.connect(dsn) as conn:
        (jobs,) = conn.execute("SELECT count(*) FROM jobbus.job").fetchone() or (0,)
    # warm-up 20 + 2 rounds of 5, for each of the two inserting calls; pgbench's inserts on top
    pgbench = "jobbus's insert, pgbench (libpq)" in figures
    assert jobs == 60 if not pgbench else jobs > 60


def test_the_encryption_scenario_seals_every_payload_and_its_drain_opens_them(dsn: str) -> None:
    options = ["--dsn", dsn, "--payload-bytes", "64", "--encrypt", "1"]

    suite.run_driver([sys.executable, "-m", "bench.jobbus_driver", "fill", "--jobs", "40", *options])
    with psycopg.connect(dsn) as conn:
        stored = [text for (text,) in conn.execute("SELECT configuration_data::text FROM jobbus.job")]
    drained = suite.run_driver(
        [sys.executable, "-m", "bench.jobbus_driver", "drain", "--jobs", "40", "--concurrency", "10", *options]
    )
    with psycopg.connect(dsn) as conn:
        statuses = conn.execute("SELECT status, count(*) FROM jobbus.job GROUP BY status").fetchall()

    assert len(stored) == 40 and all(
        text.startswith('{"$jobbus.encrypted"') and "x" * 64 not in text for text in stored
    )
    assert drained["count"] == 40 and statuses == [("completed", 40)]  # each opened before its handler
