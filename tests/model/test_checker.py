"""The checker's own correctness: synthetic histories with one known violation each, and a clean one.

A checker that cannot fail proves nothing: each guarantee has a history that breaks it, and the
checker must name that guarantee (and only that one) for it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.model.history import (
    FAIRNESS_BOUND,
    Edit,
    Effect,
    History,
    Inserted,
    JobRow,
    KeyedCall,
    Limits,
    Op,
    Process,
    Run,
    Spend,
    Transition,
    Window,
    check,
)

T0 = 1_000_000.0
PID = 100


def job(n: int, *, queue: str = "q", key: str | None = None, status: str = "completed", **config: Any) -> JobRow:
    return JobRow(
        id=f"j{n}",
        type="model.work",
        queue=queue,
        key=key,
        status=status,
        name=config.pop("name", None),
        available_at=config.pop("available_at", T0),
        created_at=config.pop("created_at", T0),
        finished_at=config.pop("finished_at", None),
        group_id=config.pop("group_id", None),
        configuration=config,
        weight=config.pop("weight", 1),
    )


def run(n: int, start: float, end: float | None, *, queue: str = "q", key: str | None = None, **kw: Any) -> Run:
    return Run(
        run_id=kw.get("run_id", f"r{n}-{start}"),
        job_id=f"j{n}",
        type="model.work",
        queue=queue,
        key=key,
        attempt=kw.get("attempt", 1),
        worker=kw.get("worker", "w0"),
        pid=kw.get("pid", PID),
        start=T0 + start,
        end=None if end is None else T0 + end,
        outcome=kw.get("outcome", "returned"),
    )


def clean() -> History:
    """Two queues, one of them per key; a chain, a group with its callback, a periodic, a step, an event."""
    h = History()
    h.processes = [Process(PID, "w0", (), 4, T0 - 10, None)]
    h.limits = [
        Limits(T0 - 5, "q", concurrency=2, rate=(3, 2.0)),
        Limits(T0 - 5, "k", concurrency=3, per_key=1),
    ]
    h.jobs = [
        job(1, finished_at=T0 + 1, chain="c1"),
        job(2, finished_at=T0 + 1.5),
        job(3, finished_at=T0 + 2.5, after="c1", created_at=T0 + 1.01),
        job(4, queue="k", key="a", finished_at=T0 + 1),
        job(5, queue="k", key="b", finished_at=T0 + 1),
        job(6, queue="k", key="a", finished_at=T0 + 2.2),
        job(7, group_id="g", group_has_then=True, finished_at=T0 + 3.5),
        job(8, callback_of="g", created_at=T0 + 3.51, finished_at=T0 + 4.5),
        job(9, name="tick", available_at=T0 + 4.0, created_at=T0 + 4.0, finished_at=T0 + 5),
        job(10, name="tick", available_at=T0 + 6.0, created_at=T0 + 6.0, finished_at=T0 + 7),
        job(11, steps=["a"], finished_at=T0 + 8),
    ]
    h.runs = [
        run(1, 0.0, 1.0),
        run(2, 0.5, 1.5),
        run(3, 3.1, 3.3),  # the rate lets 3 + 1 starts in any 2 s: q has 4 by +3.1 (0, 0.5, 3.1, 3.2)
        run(4, 0.0, 1.0, queue="k", key="a"),
        run(5, 0.1, 1.0, queue="k", key="b"),
        run(6, 1.1, 2.2, queue="k", key="a"),
        run(7, 3.2, 3.5),
        run(8, 4.2, 4.5),
        run(9, 4.6, 5.0),
        run(10, 6.5, 7.0),
        run(11, 7.0, 7.5, outcome="parked", attempt=1),
        run(11, 7.6, 8.0, attempt=1, run_id="r11b"),
    ]
    h.completions = {j.id: [(j.finished_at or T0) + 0.01] for j in h.jobs}
    h.effects = [Effect("j11", "a", 1, PID, T0 + 7.1)]
    h.stored_steps = {("j11", "a"): T0 + 7.2}
    h.emitted = {"e": [{"n": 1}, {"n": 2}]}
    h.received = [("j11", "e", {"n": 1})]
    h.periodic_every = {"tick": 2.0}
    h.periodic_next = {"tick": (T0 + 8.0, T0 + 6.0)}
    h.expected = {j.id: "completed" for j in h.jobs if j.name is None and "after" not in j.configuration}
    h.late_group_adds = [("g", "refused")]
    h.quiet_from = T0 + 9
    return h


def broken(h: History) -> set[str]:
    report = check(h)
    return report.guarantees()


def test_a_clean_history_passes() -> None:
    report = check(clean())
    assert report.ok, report.text()
    assert report.measures["frozen_overrun_max_s"] == 0


def test_overlap_above_the_queue_limit() -> None:
    h = clean()
    h.runs.append(run(12, 0.6, 0.9))  # a third handler of q beside j1 and j2 under concurrency=2
    h.jobs.append(job(12))
    h.completions["j12"] = [T0 + 1]
    report = check(h)
    assert "concurrency" in report.guarantees()
    text = report.text()
    assert "handlers weighing 3 ran at once under a limit of 2" in text and "job j12" in text and "+0.60s" in text


def test_weights_count_against_the_queue_and_key_limits() -> None:
    h = clean()
    h.jobs[0] = replace(h.jobs[0], weight=2)  # j1 weighs 2: beside j2 that is 3 under concurrency=2
    report = check(h)
    assert report.guarantees() == {"concurrency"}
    assert "handlers weighing 3 ran at once under a limit of 2" in report.text()
    h = clean()
    h.limits[1] = replace(h.limits[1], per_key=2, concurrency=None)
    h.runs[5] = run(6, 0.9, 2.2, queue="k", key="a")  # beside j4 of key a: 2 under a per-key limit of 2
    assert broken(h) == set()
    h.jobs[5] = replace(h.jobs[5], weight=2)
    assert broken(h) == {"concurrency_per_key"}


def test_a_deleted_job_counts_its_weight_from_its_insert() -> None:
    h = clean()
    h.inserted["j1"] = Inserted("j1", T0 - 1, "model.work", weight=2)
    del h.jobs[0]
    h.expected.pop("j1")
    h.completions.pop("j1")
    assert "concurrency" in broken(h)


def test_spent_units_count_in_the_rate_window_of_the_starts_after_them() -> None:
    h = clean()
    # q allows 3 starts per 2 s (+1): j1 at +0, j2 at +0.5. Three units spent by +0.2 leave no room for j2.
    h.spends = [Spend("q", None, 3, T0 + 0.1, T0 + 0.2, True)]
    assert broken(h) == {"rate_limit"}
    # A spend still in flight when j2 started may come after it: not counted.
    h.spends = [Spend("q", None, 3, T0 + 0.4, T0 + 0.6, True)]
    assert broken(h) == set()
    # A spend that recorded nothing (no rate limit then) counts nothing.
    h.spends = [Spend("q", None, 3, T0 + 0.1, T0 + 0.2, False)]
    assert broken(h) == set()


def test_weighted_starts_count_in_the_rate_window() -> None:
    h = clean()
    h.limits[0] = replace(h.limits[0], concurrency=None)  # the rate alone
    h.jobs[1] = replace(h.jobs[1], weight=3)  # j1 (1) and j2 (3): 4 of 3 + one start of weight 3: within
    assert broken(h) == set()
    h.jobs[0] = replace(h.jobs[0], weight=3)  # 6 of 3 + 3: within; a third start of weight 3 is not
    h.jobs.append(job(20, weight=3))
    h.completions["j20"] = [T0 + 2]
    h.expected["j20"] = "completed"
    h.runs.append(run(20, 0.6, 0.7))
    assert broken(h) == {"rate_limit"}


def test_overlap_above_the_key_limit() -> None:
    h = clean()
    h.runs[5] = run(6, 0.9, 2.2, queue="k", key="a")  # starts while j4 (key a) still runs
    assert broken(h) == {"concurrency_per_key"}


def test_a_limit_lowered_at_runtime_binds_after_the_grace() -> None:
    h = clean()
    # Lowered to 1 just before j2 starts beside j1 (the old limit is still within the grace), raised at +2.
    h.limits += [Limits(T0 - 1, "q", concurrency=1, rate=(3, 2.0)), Limits(T0 + 2, "q", concurrency=2, rate=(3, 2.0))]
    assert broken(h) == set()
    # Lowered long before: j2 beside j1 breaks it.
    h.limits[0] = replace(h.limits[0], at=T0 - 40)
    h.limits[2] = replace(h.limits[2], at=T0 - 30)
    assert broken(h) == {"concurrency"}


def test_a_frozen_worker_is_left_out_of_the_overlap_and_measured() -> None:
    h = clean()
    # j1 ran on a frozen worker (pid 200) on and on; its re-run on pid 100 overlaps it.
    h.processes.append(Process(200, "w1", (), 4, T0 - 10, T0 + 20))
    h.frozen = [Window("200", T0 + 0.2, T0 + 8.0)]
    h.runs[0] = run(1, 0.0, 9.0, pid=200, worker="w1")
    h.runs.append(run(1, 8.5, 8.7, attempt=2, run_id="r1b"))
    h.jobs[2] = replace(h.jobs[2], created_at=T0 + 8.71, finished_at=T0 + 8.9)  # the re-run's follow-up
    h.runs[2] = run(3, 8.75, 8.85)
    report = check(h)
    assert report.ok, report.text()
    assert report.measures["frozen_overrun_max_s"] == pytest.approx(1.0)
    assert report.measures["frozen_duplicate_overlap_max_s"] == pytest.approx(0.2)


def test_two_live_attempts_at_once() -> None:
    h = clean()
    h.runs.append(run(1, 0.8, 1.2, attempt=2, run_id="r1b", pid=300))
    assert "exclusive" in broken(h)


def test_rate_exceeded() -> None:
    h = clean()
    for n in (20, 21, 22):
        h.jobs.append(job(n))
        h.completions[f"j{n}"] = [T0 + 2]
    h.runs += [run(20, 1.0, 1.05), run(21, 1.1, 1.15), run(22, 1.2, 1.25)]  # 5 starts in 1.2 s under 3 per 2 s
    assert broken(h) == {"rate_limit"}


def test_double_completion() -> None:
    h = clean()
    h.completions["j2"].append(T0 + 3)
    assert broken(h) == {"completed_once"}


def test_completed_without_a_handler_returning() -> None:
    h = clean()
    h.runs[1] = replace(h.runs[1], outcome="raised")
    assert broken(h) == {"completed_once"}


def test_duplicate_periodic_tick() -> None:
    h = clean()
    h.jobs.append(job(30, name="tick", available_at=T0 + 6.0, created_at=T0 + 6.3, finished_at=T0 + 7))
    h.runs.append(run(30, 6.4, 6.6))
    report = check(h)
    assert report.guarantees() == {"periodic_once"}
    assert "x2" in report.text()


def test_next_run_at_not_after_the_last_tick() -> None:
    h = clean()
    h.periodic_next["tick"] = (T0 + 6.0, T0 + 6.0)
    assert broken(h) == {"periodic_once"}


def test_early_callback() -> None:
    h = clean()
    h.jobs[7] = replace(h.jobs[7], created_at=T0 + 3.3)  # written before member j7 finished at +3.5
    assert broken(h) == {"callback"}


def test_callback_while_a_member_is_queued() -> None:
    h = clean()
    h.jobs.append(job(31, group_id="g", group_has_then=True, status="queued"))
    h.expected["j31"] = "completed"
    assert {"callback", "nothing_lost"} <= broken(h)


def test_a_group_that_takes_a_late_member() -> None:
    h = clean()
    h.late_group_adds.append(("g", "accepted as job j40"))
    assert broken(h) == {"group_closed"}


def test_follow_up_of_a_failed_job() -> None:
    h = clean()
    h.jobs[0] = replace(h.jobs[0], status="failed")
    h.expected["j1"] = "failed"
    assert broken(h) == {"follow_up"}


def test_missing_follow_up() -> None:
    h = clean()
    del h.jobs[2]
    del h.runs[2]
    assert broken(h) == {"follow_up"}


def test_step_side_effect_after_its_result_was_stored() -> None:
    h = clean()
    h.effects.append(Effect("j11", "a", 2, PID, T0 + 7.7))
    report = check(h)
    assert report.guarantees() == {"steps"}
    assert "after its result was stored" in report.text()


def test_step_stored_without_its_side_effect() -> None:
    h = clean()
    h.effects.clear()
    assert broken(h) == {"steps"}


def test_event_payload_not_the_first_emitted() -> None:
    h = clean()
    h.received = [("j11", "e", {"n": 2})]
    assert broken(h) == {"events"}


def test_lost_job() -> None:
    h = clean()
    h.expected["j99"] = "completed"
    report = check(h)
    assert report.guarantees() == {"nothing_lost"}
    assert "j99 was scheduled and is gone" in report.text()


def test_stuck_job() -> None:
    h = clean()
    h.jobs.append(job(50, name="tick", status="queued", available_at=T0 + 8.0))
    assert broken(h) == {"nothing_stuck"}


def test_job_started_in_a_paused_queue() -> None:
    h = clean()
    h.paused = [Window("q", T0 - 10, T0 + 5)]
    assert "pause" in broken(h)


def test_a_runnable_key_kept_waiting() -> None:
    h = clean()
    # Key b of queue k is below its limit, the queue has a free slot, the worker has free slots: yet
    # j60 waits far longer than the bound.
    wait = FAIRNESS_BOUND + 5
    h.jobs.append(job(60, queue="k", key="b", created_at=T0 + 1.0, finished_at=T0 + wait + 2))
    h.runs.append(run(60, 1.0 + wait, 1.5 + wait, queue="k", key="b"))
    h.completions["j60"] = [T0 + wait + 2]
    h.quiet_from = T0 + wait + 5
    report = check(h)
    assert report.guarantees() == {"fairness"}
    assert report.measures["fairness_blocked_max_s"] > FAIRNESS_BOUND


def test_a_key_at_its_limit_may_wait() -> None:
    h = clean()
    # j61 of key a waits while j62 of key a holds the only slot of its key: legitimate.
    wait = FAIRNESS_BOUND + 5
    h.jobs.append(job(62, queue="k", key="a", created_at=T0 + 2.3, finished_at=T0 + wait + 1))
    h.runs.append(run(62, 2.3, 1.0 + wait, queue="k", key="a"))
    h.jobs.append(job(61, queue="k", key="a", created_at=T0 + 2.4, finished_at=T0 + wait + 2))
    h.runs.append(run(61, 1.1 + wait, 1.5 + wait, queue="k", key="a"))
    h.completions.update({"j61": [T0 + wait + 2], "j62": [T0 + wait + 1]})
    h.quiet_from = T0 + wait + 5
    assert check(h).ok


def test_a_worker_that_exits_unasked() -> None:
    h = clean()
    h.unexpected_exits = [("w0", PID, 70)]
    assert broken(h) == {"workers_survive"}


def test_a_wait_right_after_a_fault_on_its_queue_is_not_unfair() -> None:
    h = clean()
    wait = FAIRNESS_BOUND + 3
    h.jobs.append(job(60, queue="k", key="b", created_at=T0 + 1.0, finished_at=T0 + wait + 2))
    h.runs.append(run(60, 1.0 + wait, 1.5 + wait, queue="k", key="b"))
    h.completions["j60"] = [T0 + wait + 2]
    h.quiet_from = T0 + wait + 5
    h.faults = [Window(f"kill {PID + 1}", T0 + 1.0, T0 + 1.0)]
    h.processes.append(Process(PID + 1, "w1", ("k",), 2, T0 - 10, T0 + 1.0))
    assert check(h).ok
    h.processes[-1] = Process(PID + 1, "w1", ("q",), 2, T0 - 10, T0 + 1.0)  # it did not serve k
    assert broken(h) == {"fairness"}


def test_a_retried_tick_is_judged_by_the_tick_it_was_enqueued_for() -> None:
    h = clean()
    # j10 was recovered and retried: the column moved to its retry time, its first attempt saw the tick.
    h.jobs[9] = replace(h.jobs[9], available_at=T0 + 6.37, attempts=2)
    h.first_available["j10"] = T0 + 6.0
    assert check(h).ok
    h.jobs.append(job(30, name="tick", available_at=T0 + 6.0, finished_at=T0 + 7))
    h.runs.append(run(30, 6.4, 6.6))
    assert broken(h) == {"periodic_once"}


def test_a_job_off_the_ticks() -> None:
    h = clean()
    h.jobs[9] = replace(h.jobs[9], available_at=T0 + 6.5)
    report = check(h)
    assert report.guarantees() == {"periodic_once"}
    assert "not ticks of every=2 s" in report.text()


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 4),
    durations=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=25),
    gaps=st.lists(st.floats(0.0, 0.5), min_size=25, max_size=25),
)
def test_a_scheduler_within_its_limit_passes_and_one_run_more_fails(
    limit: int, durations: list[float], gaps: list[float]
) -> None:
    """Histories of a correct scheduler (each job starts when one of `limit` slots is free) pass the
    concurrency check; one extra run at the busiest instant breaks it."""
    h = History()
    h.processes = [Process(PID, "w0", (), limit + 1, T0 - 10, None)]
    h.limits = [Limits(T0 - 10, "q", concurrency=limit)]
    free = [0.0] * limit
    for n, duration in enumerate(durations):
        slot = min(range(limit), key=lambda i: free[i])
        start = free[slot] + gaps[n] + 0.01
        free[slot] = start + duration
        h.jobs.append(job(n, finished_at=T0 + free[slot]))
        h.runs.append(run(n, start, start + duration))
        h.completions[f"j{n}"] = [T0 + free[slot]]
        h.expected[f"j{n}"] = "completed"
    assert check(h).ok
    busiest = max(h.runs, key=lambda r: sum(1 for o in h.runs if o.start <= r.start < (o.end or 0)))
    live = sum(1 for o in h.runs if o.start <= busiest.start < (o.end or 0))
    for extra in range(limit + 1 - live):
        n = 100 + extra
        h.jobs.append(job(n, finished_at=busiest.start + 0.02))
        h.runs.append(replace(busiest, run_id=f"x{n}", job_id=f"j{n}", end=busiest.start + 0.01))
        h.completions[f"j{n}"] = [busiest.start + 0.02]
    assert "concurrency" in broken(h)


# -- Part III: expiry, delete, cancel, run_now, unique keys, secrets, error outcomes ----------------


def expiring(n: int, expires: float, *, status: str = "completed", **kw: Any) -> JobRow:
    """Job j<n> with an `expires_at` of T0 + `expires`."""
    fields = {k: kw.pop(k) for k in ("last_error", "attempts", "history", "error_group") if k in kw}
    return replace(job(n, queue="x", status=status, **kw), expires_at=T0 + expires, **fields)


def changes(n: int, *steps: tuple[float, str], unique_key: str | None = None) -> list[Transition]:
    """The trigger's record of job j<n>: inserted queued at the first step's time, then each status
    (a claim counts an attempt)."""
    out = []
    old: str | None = None
    attempts = 0
    for at, new in steps:
        attempts += new == "running"
        out.append(Transition(f"j{n}", T0 + at, old, new, attempts))
        old = new
    return out


def with_job(h: History, row: JobRow, *runs: Run, expected: str | None = None) -> History:
    h.jobs.append(row)
    h.runs += runs
    if row.status == "completed":
        h.completions[row.id] = [(row.finished_at or T0) + 0.01]
    if expected is not None:
        h.expected[row.id] = expected
    return h


EXPIRED = "expired: not started by its expires_at"


def test_a_job_started_after_its_expiry() -> None:
    h = with_job(clean(), expiring(20, 1.0, finished_at=T0 + 2.5), run(20, 2.0, 2.5, queue="x"), expected="completed")
    h.transitions += changes(20, (0.0, "queued"), (2.0, "running"), (2.5, "completed"))
    report = check(h)
    assert report.guarantees() == {"expiry"}
    assert "first started at +2.00s, after its expires_at +1.00s" in report.text()


def test_a_retry_after_the_expiry_of_a_job_started_before_it_runs() -> None:
    h = with_job(
        clean(),
        expiring(20, 1.0, finished_at=T0 + 3.5, attempts=2),
        run(20, 0.5, 1.5, outcome="raised", queue="x"),
        run(20, 3.0, 3.5, attempt=2, queue="x"),
        expected="completed",
    )
    h.transitions += changes(20, (0.0, "queued"), (0.5, "running"), (1.5, "queued"), (3.0, "running"))
    h.transitions.append(Transition("j20", T0 + 3.5, "running", "completed", 2))
    assert check(h).ok, check(h).text()


def test_a_started_job_cancelled_as_expired() -> None:
    # Its first attempt failed before the expiry; the retry was claimed after it and cancelled.
    row = expiring(20, 1.0, status="cancelled", finished_at=T0 + 2.0, last_error=f"{EXPIRED} ...", attempts=1)
    h = with_job(clean(), row, run(20, 0.5, 1.5, outcome="raised", queue="x"), expected="completed")
    report = check(h)
    assert report.guarantees() == {"expiry"}
    assert "and was then cancelled as expired" in report.text()


def test_a_started_job_cancelled_by_its_producer_is_not_called_expired() -> None:
    # Its lease expired (a recovered attempt) and it was cancelled while queued: "lease expired" is
    # not the expiry of the job.
    row = expiring(
        20, 1.0, status="cancelled", finished_at=T0 + 3.0, last_error="lease expired: worker w9 stopped heartbeating"
    )
    h = with_job(clean(), row, run(20, 0.5, None, outcome="open", pid=999, queue="x"), expected="completed")
    h.ops.append(Op("cancel", "j20", T0 + 2.9, T0 + 3.0, "cancelled"))
    assert check(h).ok, check(h).text()


def test_a_job_never_started_must_end_expired() -> None:
    h = with_job(clean(), expiring(20, 2.0, status="queued", delayed=True), expected="completed")
    h.ended = T0 + 9
    report = check(h)
    assert report.guarantees() == {"expiry"}
    assert "never started, its expires_at +2.00s passed, and it ended queued" in report.text()
    h.jobs[-1] = replace(h.jobs[-1], status="cancelled", finished_at=T0 + 2.1, last_error=EXPIRED)
    assert check(h).ok, check(h).text()


def test_a_job_cancelled_as_expired_before_its_expiry() -> None:
    row = expiring(20, 2.0, status="cancelled", finished_at=T0 + 1.0, last_error=EXPIRED)
    h = with_job(clean(), row, expected="completed")
    h.ended = T0 + 9
    assert broken(h) == {"expiry"}


def test_a_handler_started_after_its_job_was_deleted() -> None:
    h = clean()
    h.ops.append(Op("delete", "j2", T0 + 0.2, T0 + 0.25, "ok"))
    del h.jobs[1]  # the row is gone at the end
    # j2's handler started at +0.5: after the delete returned.
    report = check(h)
    assert report.guarantees() == {"delete"}
    assert "was deleted at +0.25s and started after" in report.text()


def test_a_deleted_job_is_gone_and_not_lost() -> None:
    h = clean()
    h.ops.append(Op("delete", "j2", T0 + 1.6, T0 + 1.65, "ok"))
    del h.jobs[1]
    h.transitions += changes(2, (0.0, "queued"), (0.5, "running"), (1.5, "completed"), (1.6, "deleted"))
    assert check(h).ok, check(h).text()
    h.jobs.insert(1, job(2, finished_at=T0 + 1.5))  # its row still there at the end
    assert broken(h) == {"delete"}


def test_a_delete_refused_while_the_job_was_queued() -> None:
    h = with_job(clean(), job(20, queue="x", status="queued", delayed=True))
    h.jobs[-1] = replace(h.jobs[-1], status="cancelled", finished_at=T0 + 8)
    h.transitions += changes(20, (0.0, "queued"), (8.0, "cancelled"))
    h.ops.append(Op("delete", "j20", T0 + 4.0, T0 + 4.05, "error: job j20 is running"))
    assert broken(h) == {"delete"}
    h.transitions[1] = Transition("j20", T0 + 3.0, "queued", "running", 1)  # running then: refused rightly
    h.transitions.append(Transition("j20", T0 + 7.0, "running", "queued", 1))
    assert check(h).ok, check(h).text()


def test_a_job_cancelled_while_queued_that_starts_after() -> None:
    h = clean()
    h.ops.append(Op("cancel", "j2", T0 + 0.2, T0 + 0.25, "cancelled"))
    h.jobs[1] = replace(h.jobs[1], status="cancelled")
    del h.completions["j2"]
    h.runs[1] = replace(h.runs[1], outcome="returned")
    report = check(h)
    assert "cancel" in report.guarantees()
    assert "was cancelled (returned cancelled) at +0.25s and started after" in report.text()


def test_a_running_job_whose_cancel_returned_running_ends_completed() -> None:
    h = clean()
    h.ops.append(Op("cancel", "j2", T0 + 0.8, T0 + 0.85, "running"))
    report = check(h)
    assert report.guarantees() == {"cancel"}
    assert "cancel returned running at +0.85s, yet the job ended completed" in report.text()
    h.jobs[1] = replace(h.jobs[1], status="cancelled")  # as promised
    del h.completions["j2"]
    assert check(h).ok, check(h).text()


def test_a_job_made_available_now_that_is_lost() -> None:
    h = with_job(clean(), job(20, queue="x", status="queued", delayed=True, available_at=T0 + 30))
    h.ops.append(Op("run_now", "j20", T0 + 1.0, T0 + 1.05, "ok"))
    report = check(h)
    assert "run_now" in report.guarantees()
    assert "made available at +1.05s and is still queued at the end" in report.text()
    h.jobs[-1] = replace(h.jobs[-1], status="completed", finished_at=T0 + 1.6)
    h.runs.append(run(20, 1.1, 1.5, queue="x"))
    h.completions["j20"] = [T0 + 1.6]
    assert check(h).ok, check(h).text()
    h.jobs.pop()  # gone, never deleted
    assert "run_now" in broken(h)


def test_two_jobs_of_one_unique_key_active_at_once() -> None:
    h = clean()
    h.inserted = {
        "j1": Inserted("j1", T0 - 0.1, "model.work", "u0"),
        "j2": Inserted("j2", T0 + 0.4, "model.work", "u0"),
    }
    h.transitions += changes(1, (-0.1, "queued"), (0.0, "running"), (1.0, "completed"))
    h.transitions += changes(2, (0.4, "queued"), (0.5, "running"), (1.5, "completed"))
    report = check(h)
    assert report.guarantees() == {"unique"}
    assert "unique_key 'u0' were active at once" in report.text()
    h.inserted["j2"] = Inserted("j2", T0 + 1.01, "model.work", "u0")  # after j1 completed
    h.transitions[-3] = replace(h.transitions[-3], at=T0 + 1.01)
    assert check(h).ok, check(h).text()


def _debounced() -> History:
    """j21 ran 0..1 (debounced key d0); j22 was scheduled during that run by two calls, parked, and ran
    1.1..2 with the configuration of the last of them."""
    h = clean()
    h = with_job(h, job(21, queue="free", finished_at=T0 + 1, call="c1"), run(21, 0.0, 1.0, queue="free"))
    h = with_job(
        h, job(22, queue="free", finished_at=T0 + 2, created_at=T0 + 0.5, call="c3"), run(22, 1.1, 2.0, queue="free")
    )
    h.inserted.update(
        {"j21": Inserted("j21", T0 - 0.2, "model.work", "d0"), "j22": Inserted("j22", T0 + 0.5, "model.work", "d0")}
    )
    h.transitions += changes(21, (-0.2, "queued"), (0.0, "running"), (1.0, "completed"))
    h.transitions += changes(22, (0.5, "queued"), (1.1, "running"), (2.0, "completed"))
    h.keyed_calls = [
        KeyedCall("debounce", "model.work", "d0", "j21", "c1", 1, T0 - 0.2),
        KeyedCall("debounce", "model.work", "d0", "j22", "c2", 2, T0 + 0.5),
        KeyedCall("debounce", "model.work", "d0", "j22", "c3", 3, T0 + 0.6),
    ]
    return h


def test_debounce_allows_one_waiting_beside_one_running_and_holds_the_last_configuration() -> None:
    h = _debounced()
    assert check(h).ok, check(h).text()  # the unique check leaves the debounced key to debounce's
    h.jobs[-1] = replace(h.jobs[-1], configuration={"call": "c2"})
    report = check(h)
    assert report.guarantees() == {"debounce"}
    assert "not that of 'c3', the last of its 2 calls to commit" in report.text()


def test_two_runs_or_two_waiting_jobs_of_a_debounced_key_and_a_start_before_a_call() -> None:
    h = _debounced()
    h.transitions[-2] = replace(h.transitions[-2], at=T0 + 0.9)  # j22 claimed while j21 ran
    report = check(h)
    assert report.guarantees() == {"debounce"}
    assert "ran at once" in report.text()
    assert "started at +1.10s, before call 'c3'" not in report.text()
    h = _debounced()
    h.keyed_calls[-1] = replace(h.keyed_calls[-1], at=T0 + 1.2)
    assert "before call 'c3' that answered with it committed" in check(h).text()
    h = _debounced()
    h.inserted["j21"] = Inserted("j21", T0 - 0.2, "model.work", "d0")
    h.transitions[h.transitions.index(changes(21, (-0.2, "queued"), (0.0, "running"))[1])] = replace(
        changes(21, (-0.2, "queued"), (0.0, "running"))[1], at=T0 + 0.7
    )
    assert "both waited for their first start" in check(h).text()


def test_two_jobs_of_a_windowed_key_within_the_window() -> None:
    h = clean()
    h = with_job(h, job(31, queue="free", finished_at=T0 + 1), run(31, 0.0, 1.0, queue="free"))
    h = with_job(h, job(32, queue="free", finished_at=T0 + 5, created_at=T0 + 4.5), run(32, 4.5, 5.0, queue="free"))
    h.inserted.update(
        {"j31": Inserted("j31", T0, "model.work", "w0"), "j32": Inserted("j32", T0 + 4.5, "model.work", "w0")}
    )
    h.transitions += changes(31, (0.0, "queued"), (0.0, "running"), (1.0, "completed"))
    h.transitions += changes(32, (4.5, "queued"), (4.5, "running"), (5.0, "completed"))
    h.keyed_calls = [
        KeyedCall("window", "model.work", "w0", "j31", "c1", 1, T0, 4.0),
        KeyedCall("window", "model.work", "w0", "j31", "c2", 2, T0 + 3.9, 4.0),
        KeyedCall("window", "model.work", "w0", "j32", "c3", 3, T0 + 4.5, 4.0),
    ]
    assert check(h).ok, check(h).text()
    h.jobs[-1] = replace(h.jobs[-1], created_at=T0 + 3.5)
    report = check(h)
    assert report.guarantees() == {"window"}
    assert "scheduled 3.500 s apart, within the 4 s window" in report.text()


def test_a_secret_stored_in_an_error_field() -> None:
    failed = job(20, queue="x", status="failed", finished_at=T0 + 2)
    h = with_job(clean(), failed, run(20, 1.0, 1.5, outcome="raised", queue="x"), expected="failed")
    h.secrets["j20"] = [("bearer", "sk7q2marker"), ("password", "wsecondword")]
    h.jobs[-1] = replace(
        failed,
        last_error="RuntimeError: Authorization: Bearer ••••••",
        history=[{"attempt": 1, "error": "RuntimeError: ...", "traceback": 'password="•••••• wsecondword"'}],
    )
    report = check(h)
    assert report.guarantees() == {"secrets"}
    assert "password in history[0].traceback" in report.text()
    h.jobs[-1] = replace(h.jobs[-1], history=[{"attempt": 1, "traceback": 'password="••••••"'}])
    assert check(h).ok, check(h).text()
    h.jobs[-1] = replace(h.jobs[-1], error_group="RuntimeError: Authorization: Bearer sk7q2marker")
    assert broken(h) == {"secrets"}


def test_an_error_outcome_written_late_or_left_to_recovery() -> None:
    failed = job(20, queue="x", status="failed", finished_at=T0 + 20)
    h = with_job(clean(), failed, run(20, 1.0, 1.5, outcome="raised", queue="x"), expected="failed")
    h.transitions += changes(20, (0.0, "queued"), (1.0, "running"), (20.0, "failed"))
    report = check(h)
    assert report.guarantees() == {"error_written"}
    assert "its outcome was written 18.5 s later" in report.text()
    h.faults.append(Window(f"kill {PID}", T0 + 3, T0 + 3))  # its worker was killed: recovery is right
    assert check(h).ok, check(h).text()
    h.faults.clear()
    h.transitions[-1] = replace(h.transitions[-1], at=T0 + 1.6)
    assert check(h).ok, check(h).text()
    h.jobs[-1] = replace(failed, history=[{"attempt": 1, "outcome": "recovered", "error": "lease expired"}])
    assert broken(h) == {"error_written"}


def test_a_delete_that_succeeded_on_a_running_job() -> None:
    h = clean()
    h.ops.append(Op("delete", "j1", T0 + 0.4, T0 + 0.45, "ok"))
    del h.jobs[0]
    # Running from -3 s: since longer than a transition's stamp can precede its commit (CALL_SKEW).
    h.transitions += changes(1, (-5.0, "queued"), (-3.0, "running"), (1.0, "completed"))
    report = check(h)
    assert "delete" in report.guarantees()
    assert "while it was running throughout the call" in report.text()


def test_a_cancel_that_returns_a_status_the_job_never_had() -> None:
    h = clean()
    h.transitions += changes(2, (0.0, "queued"), (0.5, "running"), (1.5, "completed"))
    h.ops.append(Op("cancel", "j2", T0 + 3.0, T0 + 3.05, "failed"))
    report = check(h)
    assert report.guarantees() == {"cancel"}
    assert "returned 'failed' while the job was completed" in report.text()
    h.ops[-1] = Op("cancel", "j2", T0 + 3.0, T0 + 3.05, "completed")
    assert check(h).ok, check(h).text()


def test_an_error_outcome_late_around_terminated_backends_is_left_out() -> None:
    failed = job(20, queue="x", status="failed", finished_at=T0 + 20)
    h = with_job(clean(), failed, run(20, 1.0, 1.5, outcome="raised", queue="x"), expected="failed")
    h.transitions += changes(20, (0.0, "queued"), (1.0, "running"), (20.0, "failed"))
    h.faults.append(Window("terminate", T0 + 4.0, T0 + 4.0))
    assert check(h).ok, check(h).text()
    h.faults[-1] = Window("terminate", T0 + 15.0, T0 + 15.0)  # long after the handler's end
    assert broken(h) == {"error_written"}


def test_a_fault_long_after_the_handler_raised_does_not_excuse_its_unwritten_outcome() -> None:
    # The worker's event loop was stuck (a huge error redacted in quadratic time): its lease expired and
    # the job was recovered; the worker was frozen only 7 s after the handler raised.
    failed = job(20, queue="x", status="failed", finished_at=T0 + 9)
    h = with_job(clean(), failed, run(20, 1.0, 1.5, outcome="raised", queue="x"), expected="failed")
    h.transitions += changes(20, (0.0, "queued"), (1.0, "running"), (9.0, "failed"))
    h.jobs[-1] = replace(failed, history=[{"attempt": 1, "outcome": "recovered", "error": "lease expired"}])
    h.frozen = [Window(str(PID), T0 + 8.5, T0 + 12)]
    h.faults = [Window(f"freeze {PID}", T0 + 8.5, T0 + 12)]
    report = check(h)
    assert "error_written" in report.guarantees()
    assert "recovered after its lease lapsed 7.5 s later" in report.text()
    h.frozen = [Window(str(PID), T0 + 2.0, T0 + 12)]  # frozen right after it raised: excused
    h.faults = [Window(f"freeze {PID}", T0 + 2.0, T0 + 12)]
    assert "error_written" not in broken(h)


def test_an_expiry_is_judged_by_when_the_row_was_cancelled_not_by_its_finished_at() -> None:
    # A claim that waited for a lock cancels an expired job with the finished_at of its transaction's
    # start, before the expiry; the change itself came after it.
    row = expiring(20, 2.0, status="cancelled", finished_at=T0 + 1.0, last_error=EXPIRED)
    h = with_job(clean(), row, expected="completed")
    h.ended = T0 + 9
    h.transitions += changes(20, (0.0, "queued"), (2.3, "cancelled"))
    assert check(h).ok, check(h).text()
    h.transitions[-1] = replace(h.transitions[-1], at=T0 + 1.0)
    assert broken(h) == {"expiry"}


def test_a_parked_run_frees_its_slot_when_the_job_parks() -> None:
    # j2 parks at +0.95 (its slot given back) and logs its end at +1.5; j12 starts at +1.2 beside j1:
    # two handlers of q at once, within its limit of 2.
    h = clean()
    h.runs[1] = replace(h.runs[1], outcome="parked")
    h.runs.append(run(2, 2.5, 3.0, run_id="r2b"))  # woken, it completes
    h.jobs[1] = replace(h.jobs[1], finished_at=T0 + 3.0)
    h.completions["j2"] = [T0 + 3.01]
    h.jobs.append(job(12, finished_at=T0 + 1.3))
    h.runs.append(run(12, 0.97, 1.3))
    h.completions["j12"] = [T0 + 1.31]
    assert broken(h) == {"concurrency"}  # without the trigger's record, j2 held its slot until +1.5
    h.transitions += changes(2, (0.0, "queued"), (0.5, "running"), (0.95, "queued"), (2.5, "running"))
    h.transitions.append(Transition("j2", T0 + 3.0, "running", "completed", 2))
    assert check(h).ok, check(h).text()


# -- SPEC 21: update and update_many --------------------------------------------------------------------


def test_an_edit_of_a_job_that_is_not_queued_is_named() -> None:
    h = clean()
    h.edits.append(Edit("j2", T0 + 0.5, "queued", "queued", "q", "x", 5))
    assert check(h).ok, check(h).text()
    h.edits.append(Edit("j2", T0 + 0.9, "running", "running", "q", "q", 7))
    report = check(h)
    assert report.guarantees() == {"update"}
    assert "was changed at +0.90s" in report.text() and "while running" in report.text()


def test_an_update_many_whose_count_is_not_what_it_changed() -> None:
    h = clean()
    h.edits += [Edit(f"j{n}", T0 + 0.5, "queued", "queued", "q", "x", 1000) for n in (1, 2)]
    h.moves.append((1000, 2, T0 + 0.4, T0 + 0.6))
    assert check(h).ok, check(h).text()
    h.moves[0] = (1000, 3, T0 + 0.4, T0 + 0.6)
    report = check(h)
    assert report.guarantees() == {"update_many"}
    assert "returned 3 but changed 2 jobs" in report.text()


def test_an_update_that_succeeded_on_a_finished_job() -> None:
    h = clean()
    h.transitions += [Transition("j1", T0, None, "queued"), Transition("j1", T0 + 0.1, "queued", "running", 1)]
    h.transitions.append(Transition("j1", T0 + 0.3, "running", "completed", 1))
    h.ops.append(Op("update", "j1", T0 + 5.0, T0 + 5.05, "ok"))
    assert check(h).guarantees() == {"update"}


def test_a_batch_call_within_its_batch_size_and_of_one_type_passes_and_is_measured() -> None:
    h = clean()
    h.batch_sizes = {"model.batch": 3}
    h.batch_calls = {"c1": [("j1", "model.batch", 1), ("j2", "model.batch", 1)], "c2": [("j3", "model.batch", 1)]}
    report = check(h)
    assert report.ok, report.text()
    assert (report.measures["batch_calls"], report.measures["batched_jobs"], report.measures["batch_largest"]) == (
        2,
        3,
        2,
    )


def test_a_batch_call_over_its_batch_size_of_mixed_types_or_holding_a_job_twice_is_a_violation() -> None:
    h = clean()
    h.batch_sizes = {"model.batch": 2, "model.batch_sync": 2}
    h.batch_calls = {
        "big": [("j1", "model.batch", 1), ("j2", "model.batch", 1), ("j3", "model.batch", 1)],
        "mixed": [("j4", "model.batch", 1), ("j5", "model.batch_sync", 1)],
        "twice": [("j6", "model.batch", 1), ("j6", "model.batch", 1)],
    }
    report = check(h)
    assert report.guarantees() == {"batches"}
    text = report.text()
    assert "batch call big held 3 jobs, over its batch_size 2" in text
    assert "batch call mixed held jobs of several types" in text
    assert "batch call twice held a job twice" in text


def test_a_log_line_kept_in_another_attempts_entry() -> None:
    done = job(20, queue="x", finished_at=T0 + 4)
    h = with_job(clean(), done, run(20, 1.0, 1.5, queue="x", run_id="ra", outcome="raised"), expected="completed")
    h.runs.append(run(20, 2.0, 2.5, queue="x", run_id="rb", attempt=2))
    first = {"attempt": 1, "outcome": "retried", "at": "1970-01-12T13:46:41.600000+00:00"}
    second = {"attempt": 2, "outcome": "completed", "at": "1970-01-12T13:46:42.600000+00:00"}
    lines = [{"at": "1970-01-12T13:46:41+00:00", "level": "WARNING", "message": "model run ra"}]
    h.jobs[-1] = replace(done, history=[{**first, "logs": lines}, second])
    report = check(h)
    assert "log_lines_checked" in report.measures and "logs" not in report.guarantees(), report.text()
    h.jobs[-1] = replace(done, history=[first, {**second, "logs": lines}])  # attempt 1's line in attempt 2's entry
    assert "logs" in broken(h)
    h.jobs[-1] = replace(done, history=[{**first, "logs": lines}, {**second, "logs": lines}])  # kept twice
    assert "logs" in broken(h)
    h.jobs[-1] = replace(done, history=[{**first, "at": "1970-01-12T13:46:40+00:00", "logs": lines}, second])
    assert "logs" in broken(h)  # an entry written before its run started cannot hold its line


def test_an_admin_call_with_a_missing_or_extra_audit_entry_is_a_violation() -> None:
    h = with_job(clean(), job(20, queue="x", status="queued", delayed=True))
    h.jobs[-1] = replace(h.jobs[-1], status="cancelled", finished_at=T0 + 8)
    h.transitions += changes(20, (0.0, "queued"), (8.0, "cancelled"))
    h.ops += [
        Op("update", "j20", T0 + 1.0, T0 + 1.05, "ok"),
        Op("run_now", "j20", T0 + 2.0, T0 + 2.05, "error: job j20 is running"),
        Op("cancel", "j20", T0 + 8.0, T0 + 8.05, "cancelled"),
        Op("cancel", "j20", T0 + 9.0, T0 + 9.05, "cancelled"),
    ]
    h.transitions[1] = Transition("j20", T0 + 1.9, "queued", "running", 1)
    h.transitions.append(Transition("j20", T0 + 7.0, "running", "queued", 1))
    h.moves = []
    h.audit = [("update", "j20", {})]  # not the target the call names
    assert "audit" in broken(h)
    h.audit = [("update", "job:j20", {}), ("cancel", "job:j20", {})]
    assert "audit" not in broken(h), check(h).text()
    h.audit.append(("cancel", "job:j20", {}))  # the second cancel found it cancelled: it wrote nothing
    h.audit.append(("cancel", "job:j20", {}))
    assert "wrote 3 audit entries, not 0 to 2" in check(h).text()
    h.audit = [("update", "job:j20", {}), ("run_now", "job:j20", {})]  # the refused run_now wrote one
    assert "run_now of job:j20 (error: job j20 is running) wrote 1 audit entries, not 0" in check(h).text()
    h.audit = [("update", "job:j20", {}), ("delete", "job:j99", {})]
    assert "audit entries of delete of job:j99, which no call made" in check(h).text()


def test_an_update_many_without_its_one_audit_entry_is_a_violation() -> None:
    h = clean()
    h.moves = [(71, 3, T0 + 1.0, T0 + 1.1)]
    h.edits = [Edit(f"j{n}", T0 + 1.05, "queued", "queued", "a", "b", 71) for n in (1, 2, 3)]
    h.audit = [("update_many", "jobs", {"count": 3, "changes": {"priority": 71}})]
    assert "audit" not in broken(h), check(h).text()
    h.audit.append(("update_many", "jobs", {"count": 0, "changes": {"priority": 71}}))
    assert "returned 3; its audit entries say [3, 0]" in check(h).text()
    h.audit = []
    assert "returned 3; its audit entries say []" in check(h).text()
    # Refused in its first batch (a job too heavy for the target queue): nothing happened, no entry.
    h.moves, h.edits, h.refused_moves = [(72, 0, T0 + 2.0, T0 + 2.1)], [], {72}
    assert "audit" not in broken(h), check(h).text()
    h.audit = [("update_many", "jobs", {"count": 0, "changes": {"priority": 72}})]
    assert "returned 0; its audit entries say [0]" in check(h).text()
