"""The breaks `make mutate` applies one at a time (tools/mutate.py), each with the tests that must catch it.

A break is a small, plausible mistake in one promise: a lock clause dropped, a fencing condition gone, a
limit that forgets what the claim took. Each names the exact text it replaces, so a change to the code it
breaks makes the run stop and say so instead of silently testing nothing. A break of the database
program edits the migration that last defines the function or index (the tests' template database is
built from the migrations), never a released file outside a scratch copy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Break:
    """One break: `original` (found exactly `count` times in `file`) becomes `replacement`."""

    name: str
    promise: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    count: int = 1


MIGRATIONS = "src/jobbus/sql/migrations"
QUERIES = "src/jobbus/sql/queries"

BREAKS: tuple[Break, ...] = (
    Break(
        name="claim-waits-for-locked-jobs",
        promise="a claim skips jobs another transaction holds (SKIP LOCKED) and takes the free ones at once",
        file=f"{MIGRATIONS}/0033_claim_past_held_rows.sql",
        original="            LIMIT v_counts[v_group]\n            FOR UPDATE SKIP LOCKED",
        replacement="            LIMIT v_counts[v_group]\n            FOR UPDATE",
        tests=("tests/test_store.py::test_a_claim_takes_the_free_jobs_at_once_past_one_another_transaction_holds",),
    ),
    Break(
        name="claim-stops-at-held-heads",
        promise="a claim over several groups takes from the next group the jobs another transaction holds in the first",
        file=f"{MIGRATIONS}/0033_claim_past_held_rows.sql",
        original="    IF v_short AND cardinality(v_types) > 1 THEN",
        replacement="    IF false THEN",
        tests=(
            "tests/test_store.py::test_a_claim_takes_the_next_group_when_another_transaction_holds_the_first",
            "tests/test_store.py::test_a_claim_takes_every_free_job_it_can_whatever_other_transactions_hold",
        ),
    ),
    Break(
        name="per-key-limit-forgets-the-first-pass",
        promise="concurrency_per_key counts the jobs of the key the same claim took in an earlier pass",
        file=f"{MIGRATIONS}/0028_job_weights.sql",
        original="                v_held := v_held + coalesce((v_mine ->> v_key)::integer, 0);\n",
        replacement="",
        tests=(
            "tests/worker/test_flow_claims.py::"
            "test_a_per_key_limit_counts_the_jobs_of_the_key_this_claim_took_in_its_first_pass",
        ),
    ),
    Break(
        name="concurrency-forgets-the-first-pass",
        promise="a queue's concurrency counts the jobs the same claim took in an earlier pass",
        file=f"{MIGRATIONS}/0012_exact_limits.sql",
        original="v_want := least(v_want, v_setting.concurrency - v_count - v_mine);",
        replacement="v_want := least(v_want, v_setting.concurrency - v_count);",
        tests=(
            "tests/worker/test_flow_claims.py::test_a_concurrency_limit_holds_when_the_worker_serves_another_queue",
        ),
    ),
    Break(
        name="rate-limit-without-its-window",
        promise="a queue's rate_limit counts the starts within its window",
        file=f"{MIGRATIONS}/0028_job_weights.sql",
        original="s.started_at > v_now - make_interval(secs => v_setting.rate_period_seconds);",
        replacement="s.started_at > v_now;",
        tests=("tests/worker/test_flow_claims.py::test_a_rate_limit_holds_when_the_worker_serves_another_queue",),
    ),
    Break(
        name="rescuer-takes-attempts-started-after-the-declaration",
        promise="the rescuer takes back only jobs that started before their worker was declared dead",
        file=f"{QUERIES}/workers.sql",
        original="    WHERE j.status = 'running' AND j.started_at < d.declared_dead_at\n",
        replacement="    WHERE j.status = 'running'\n",
        tests=(
            "tests/worker/test_rescuer.py::"
            "test_a_job_reclaimed_while_the_declaration_waits_for_the_worker_row_is_left_to_its_new_attempt",
        ),
    ),
    Break(
        name="successor-reclaims-its-own-jobs",
        promise="a new process under a worker id takes back only what started before it registered",
        file=f"{QUERIES}/workers.sql",
        original="      AND j.status = 'running' AND j.started_at < w.started_at\n",
        replacement="      AND j.status = 'running'\n",
        tests=(
            "tests/worker/test_rescuer.py::"
            "test_a_new_process_under_the_id_reclaims_only_what_started_before_it_registered",
        ),
    ),
    Break(
        name="outcome-without-its-lease-token",
        promise="an outcome (fail, retry, release) of a stale attempt is refused: fenced by its lease token",
        file=f"{QUERIES}/jobs.sql",
        original="WHERE j.id = o.id AND j.lease_token = o.token AND j.status = 'running'",
        replacement="WHERE j.id = o.id AND j.status = 'running'",
        tests=("tests/test_store.py::test_stale_worker_outcomes_are_rejected_after_reclaim",),
    ),
    Break(
        name="completion-without-its-lease-token",
        promise="a completion of a stale attempt is refused: fenced by its lease token",
        file=f"{QUERIES}/jobs.sql",
        original="WHERE j.id = i.id AND j.lease_token = i.token AND j.status = 'running'",
        replacement="WHERE j.id = i.id AND j.status = 'running'",
        tests=("tests/test_store.py::test_stale_worker_outcomes_are_rejected_after_reclaim",),
    ),
    Break(
        name="completion-past-its-lease",
        promise="a completion after its lease expired is refused, also before anyone reclaims the job",
        file=f"{QUERIES}/jobs.sql",
        original="j.lease_token = i.token AND j.status = 'running' AND j.lease_expires_at > now()",
        replacement="j.lease_token = i.token AND j.status = 'running'",
        tests=("tests/test_store.py::test_expired_lease_cannot_complete_even_before_anyone_reclaims",),
    ),
    Break(
        name="checkpoint-progress-heartbeat-step-without-their-lease-token",
        promise="a checkpoint, progress, heartbeat or step of a stale attempt is refused: fenced by its lease token",
        file=f"{QUERIES}/jobs.sql",
        original="lease_token = %(token)s AND ",
        replacement="",
        count=4,
        tests=(
            "tests/test_store.py::test_stale_worker_checkpoint_progress_and_heartbeat_are_rejected",
            "tests/workflows/test_steps.py::test_a_stale_attempt_cannot_store_a_step",
        ),
    ),
    Break(
        name="lease-renewal-without-its-lease-token",
        promise="a worker's batched heartbeat renews only the leases it holds: fenced by their tokens",
        file=f"{QUERIES}/jobs.sql",
        original="WHERE j.id = l.id AND j.lease_token = l.token AND j.status = 'running'",
        replacement="WHERE j.id = l.id AND j.status = 'running'",
        tests=("tests/test_store.py::test_stale_worker_checkpoint_progress_and_heartbeat_are_rejected",),
    ),
    Break(
        name="recovery-of-live-leases",
        promise="lease recovery takes back only expired leases",
        file=f"{QUERIES}/jobs.sql",
        original="    WHERE status = 'running' AND lease_expires_at < now()\n    ORDER BY id\n    LIMIT %(limit)s",
        replacement="    WHERE status = 'running'\n    ORDER BY id\n    LIMIT %(limit)s",
        tests=("tests/test_store.py::test_recovery_leaves_live_leases_alone",),
    ),
    Break(
        name="expiry-cancels-a-started-job",
        promise="expiry concerns only a job's first start: a retry after it runs",
        file=f"{MIGRATIONS}/0028_job_weights.sql",
        original="j.expires_at <= v_clock AND j.started_at IS NULL",
        replacement="j.expires_at <= v_clock",
        count=8,
        tests=("tests/test_expiry.py::test_a_job_retrying_after_its_expiry_runs_its_retry",),
    ),
    Break(
        name="expired-job-starts",
        promise="a job past its expiry before its first start is never claimed and ends cancelled",
        file=f"{MIGRATIONS}/0028_job_weights.sql",
        original="j.expires_at <= v_clock AND j.started_at IS NULL",
        replacement="false",
        count=8,
        tests=("tests/test_expiry.py::test_an_expired_job_is_never_claimed_and_ends_cancelled",),
    ),
    Break(
        name="dedupe-ignores-running-jobs",
        promise="a queued or running job of a (type, unique_key) deduplicates a new one",
        file=f"{MIGRATIONS}/0029_unique_windows_and_debounce.sql",
        original="    WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') AND debounce_until IS NULL;",
        replacement="    WHERE unique_key IS NOT NULL AND status IN ('queued') AND debounce_until IS NULL;",
        tests=("tests/test_producer.py::test_a_running_job_of_the_key_deduplicates_until_it_ends",),
    ),
    Break(
        name="dedupe-without-its-unique-index",
        promise="concurrent producers of one (type, unique_key) get one job",
        file=f"{MIGRATIONS}/0029_unique_windows_and_debounce.sql",
        original="CREATE UNIQUE INDEX {concurrently} IF NOT EXISTS job_unique_active_debounce_idx",
        replacement="CREATE INDEX {concurrently} IF NOT EXISTS job_unique_active_debounce_idx",
        tests=("tests/test_producer.py::test_concurrent_schedules_of_one_key_give_one_row_and_one_id",),
    ),
    Break(
        name="unique-window-without-its-lock",
        promise="calls with a uniqueness window on one key, racing, schedule one job per window",
        file=f"{MIGRATIONS}/0031_tags.sql",
        original="PERFORM pg_advisory_xact_lock({schema}.wait_lock('unique:'",
        replacement="PERFORM length({schema}.wait_lock('unique:'",
        tests=("tests/test_unique_and_debounce.py::test_racing_window_calls_from_python_and_sql_schedule_one_job",),
    ),
    Break(
        name="debounce-job-never-parked",
        promise="a debounced call during a run of its key waits for that run's end (never two runs at once)",
        file=f"{MIGRATIONS}/0031_tags.sql",
        original="                CASE WHEN v_parked THEN {schema}.never()\n",
        replacement="                CASE WHEN false THEN {schema}.never()\n",
        tests=("tests/test_unique_and_debounce.py::test_a_call_during_a_run_waits_for_its_end_and_is_not_lost",),
    ),
    Break(
        name="configuration-data-mutable",
        promise="configuration_data never changes after scheduling (a trigger refuses it)",
        file=f"{MIGRATIONS}/0035_encrypted_payloads.sql",
        original="    IF NEW.configuration_data::text IS DISTINCT FROM OLD.configuration_data::text\n",
        replacement="    IF false\n",
        tests=("tests/test_schema.py::test_configuration_data_cannot_be_updated_but_execution_data_can",),
    ),
    Break(
        name="retention-ignores-the-status",
        promise="retention deletes a finished job only after its own status's retention",
        file=f"{MIGRATIONS}/0030_unique_windows_and_debounce_functions.sql",
        original=(
            "            WHERE j.status = p_status\n"
            "              AND p_status IN ('completed', 'failed', 'cancelled')\n"
            "              AND j.finished_at"
        ),
        replacement="            WHERE j.finished_at",
        tests=("tests/worker/test_leader.py::test_retention_deletes_expired_finished_jobs_and_keeps_the_rest",),
    ),
    Break(
        name="periodic-tick-unguarded",
        promise="each tick of a periodic job is enqueued exactly once, whatever leaders race",
        file=f"{QUERIES}/periodic.sql",
        original=(
            "    WHERE p.name = %(name)s AND p.next_run_at = %(expected)s AND p.enabled\n"
            "      AND %(tick)s::timestamptz >= p.next_run_at AND"
        ),
        replacement="    WHERE p.name = %(name)s AND p.enabled\n      AND",
        tests=("tests/test_periodic.py::test_concurrent_enqueuers_enqueue_each_tick_exactly_once",),
    ),
    Break(
        name="last-error-unmasked",
        promise="secrets in an error are masked before last_error stores it",
        file="src/jobbus/worker/outcomes.py",
        original="    return redact_error(text, MAX_ERROR_BYTES)\n",
        replacement="    return text.replace('\\x00', '')[:MAX_ERROR_BYTES]\n",
        tests=("tests/cli/test_jobs_cli.py::test_no_secret_a_handler_raises_is_stored_printed_or_logged",),
    ),
    Break(
        name="traceback-unmasked",
        promise="secrets in a traceback are masked before the history stores it",
        file="src/jobbus/worker/outcomes.py",
        original='    return redact_error(text, MAX_TRACEBACK_BYTES, keep="tail")\n',
        replacement="    return text.replace('\\x00', '')[-MAX_TRACEBACK_BYTES:]\n",
        tests=("tests/worker/test_tracebacks.py::test_secrets_in_a_traceback_are_masked_as_the_dashboard_masks_them",),
    ),
    Break(
        name="csrf-token-not-compared",
        promise="a dashboard action needs the browser's CSRF token",
        file="src/jobbus/dashboard/security.py",
        original='and hmac.compare_digest(cookie.encode(), (submitted or "").encode())',
        replacement="or True",
        tests=("tests/observability/test_dashboard.py::test_actions_need_the_csrf_token_of_the_browser",),
    ),
    Break(
        name="csrf-origin-not-checked",
        promise="a dashboard action posted from another site is refused",
        file="src/jobbus/dashboard/security.py",
        original='            return False  # another site (or an opaque "null" origin) posting into this one',
        replacement="            pass",
        tests=("tests/observability/test_dashboard.py::test_actions_need_the_csrf_token_of_the_browser",),
    ),
    Break(
        name="host-not-checked",
        promise="without a token the dashboard answers only to loopback names (no DNS rebinding)",
        file="src/jobbus/dashboard/security.py",
        original='            if not self.allows(raw.decode("latin-1") if raw is not None else None):',
        replacement="            if False:",
        tests=("tests/observability/test_dashboard_hosts.py::test_without_a_token_only_loopback_names_are_answered",),
    ),
)
