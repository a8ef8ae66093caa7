"""pause / resume / drain / stop / restart against real worker processes."""

from __future__ import annotations

import json
import time

from tests.cli import (
    execute,
    job_status,
    jobbus,
    jobbus_json,
    query_value,
    running_workers,
    wait_exit,
    wait_until,
)


def _schedule(dsn: str, *args: str) -> str:
    result = jobbus(dsn, "schedule", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _worker_state(dsn: str, worker_id: str) -> str | None:
    state: str | None = query_value(dsn, "SELECT state FROM jobbus.worker WHERE id = %s", worker_id)
    return state


def test_a_paused_queue_keeps_its_job_queued_until_resume_while_other_queues_run(dsn: str) -> None:
    with running_workers(dsn, ("w-pause", [])) as (worker,):
        paused = jobbus_json(dsn, "pause", "--queue", "slow", "--wait")
        assert paused["worker_ids"] == ["w-pause"]
        assert paused["acknowledged"] == ["w-pause"] and paused["missing"] == []
        # --wait returned only after the worker acknowledged the generation.
        acked = query_value(dsn, "SELECT acked_generation FROM jobbus.worker WHERE id = 'w-pause'")
        assert acked >= paused["generation"]

        held = _schedule(dsn, "noop", "--queue", "slow")
        other = _schedule(dsn, "noop", "--queue", "fast")
        wait_until(lambda: job_status(dsn, other) == "completed", what="job in the other queue completed")
        time.sleep(1.0)  # five poll intervals: had the pause not held, the job would have run by now
        assert job_status(dsn, held) == "queued"
        status = jobbus_json(dsn, "status")
        assert {q["queue"]: q["paused"] for q in status["queues"]} == {"fast": False, "slow": True}

        resumed = jobbus(dsn, "resume", "--queue", "slow", "--wait")
        assert resumed.returncode == 0, resumed.stderr
        assert "acknowledged by: w-pause" in resumed.stdout
        wait_until(lambda: job_status(dsn, held) == "completed", what="held job ran after resume")
        assert worker.poll() is None


def test_a_worker_started_under_a_paused_target_starts_paused(dsn: str) -> None:
    issued = jobbus(dsn, "pause", "--all")
    assert issued.returncode == 0, issued.stderr
    assert "no running worker is targeted now" in issued.stdout
    job = _schedule(dsn, "noop")
    with running_workers(dsn, ("w-late", [])) as (worker,):
        wait_until(lambda: _worker_state(dsn, "w-late") == "paused", what="worker reports paused")
        assert job_status(dsn, job) == "queued"
        workers = jobbus_json(dsn, "workers")
        assert [(w["id"], w["state"]) for w in workers] == [("w-late", "paused")]

        assert jobbus(dsn, "resume", "--all", "--wait").returncode == 0
        wait_until(lambda: job_status(dsn, job) == "completed", what="job ran after resume")

        stopped = jobbus(dsn, "stop", "--all", "--wait")
        assert stopped.returncode == 0, stopped.stderr
        assert wait_exit(worker) == 0
    assert _worker_state(dsn, "w-late") == "stopped"


def test_drain_processes_what_is_available_then_exits_0(dsn: str) -> None:
    with running_workers(dsn, ("w-drain", [])) as (worker,):
        assert jobbus(dsn, "pause", "--worker-id", "w-drain", "--wait").returncode == 0
        jobs = [_schedule(dsn, "noop") for _ in range(3)]
        assert jobbus(dsn, "resume", "--worker-id", "w-drain").returncode == 0
        drained = jobbus(dsn, "drain", "--all", "--wait")
        assert drained.returncode == 0, drained.stderr
        assert wait_exit(worker) == 0
    assert [job_status(dsn, job) for job in jobs] == ["completed"] * 3


def test_stop_lets_the_in_flight_job_finish_then_exits_0(dsn: str) -> None:
    with running_workers(dsn, ("w-stop", [])) as (worker,):
        job = _schedule(dsn, "sleep", "--config", '{"seconds": 1.5}')
        wait_until(lambda: job_status(dsn, job) == "running", what="job running")
        stopped = jobbus(dsn, "stop", "--worker-id", "w-stop", "--wait")
        assert stopped.returncode == 0, stopped.stderr
        assert "acknowledged by: w-stop" in stopped.stdout
        assert wait_exit(worker) == 0
    assert job_status(dsn, job) == "completed"
    result = query_value(dsn, "SELECT result FROM jobbus.job WHERE id = %s", job)
    assert result == "slept"


def test_targets_reach_only_their_workers_and_restart_exits_75(dsn: str) -> None:
    with running_workers(dsn, ("w-a", ["--queue", "a"]), ("w-b", ["--queue", "b"])) as (worker_a, worker_b):
        restart = jobbus_json(dsn, "restart", "--queue", "b", "--wait")
        assert restart["worker_ids"] == ["w-b"] and restart["acknowledged"] == ["w-b"]
        assert wait_exit(worker_b) == 75

        job = _schedule(dsn, "noop", "--queue", "a")
        wait_until(lambda: job_status(dsn, job) == "completed", what="worker a still serves its queue")
        assert worker_a.poll() is None

        paused = jobbus_json(dsn, "pause", "--worker-id", "w-a", "--wait")
        assert paused["worker_ids"] == ["w-a"] and paused["acknowledged"] == ["w-a"]
        stop = jobbus_json(dsn, "stop", "--worker-id", "w-a", "--wait")
        assert stop["acknowledged"] == ["w-a"]
        assert wait_exit(worker_a) == 0
    # a queue target reaches no worker when none serves the queue
    nobody = jobbus(dsn, "drain", "--queue", "c", "--json")
    assert json.loads(nobody.stdout)["worker_ids"] == []


def test_wait_times_out_with_exit_1_naming_the_workers_that_did_not_acknowledge(dsn: str) -> None:
    # A registered, live-looking worker that never reads its commands.
    execute(
        dsn,
        "INSERT INTO jobbus.worker (id, host, pid, concurrency, last_seen_at) "
        "VALUES ('ghost', 'h', 1, 1, now() + interval '1 hour')",
    )
    result = jobbus(dsn, "drain", "--all", "--wait", "--timeout", "0.5")
    assert result.returncode == 1
    assert "addressed to 1 worker(s): ghost" in result.stdout
    assert "not acknowledged within 0.5 s by: ghost" in result.stderr
