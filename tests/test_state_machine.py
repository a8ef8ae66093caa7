"""Random interleavings of every job operation against the real store, checked against a small model.

No illegal transition happens and no fenced write is ever accepted with a stale or expired token.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import jobbus
from jobbus.models import JobStatus
from jobbus.store import Outcome, run_sync
from tests.storehelpers import claim_statement


@dataclass
class ModelJob:
    status: JobStatus
    max_attempts: int
    attempts: int = 0
    token: uuid.UUID | None = None
    expired: bool = False
    cancel_requested: bool = False
    old_tokens: list[uuid.UUID] = field(default_factory=list)


class JobLifecycle(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.app = jobbus.App(dsn=dsn)
        self.conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
        self.model: dict[uuid.UUID, ModelJob] = {}

    @initialize()
    def empty_table(self) -> None:
        self.conn.execute("TRUNCATE jobbus.job")

    def teardown(self) -> None:
        self.conn.close()

    # -- operations ----------------------------------------------------------------------------------

    @rule(target=jobs, max_attempts=st.integers(min_value=1, max_value=3))
    def schedule(self, max_attempts: int) -> uuid.UUID:
        spec = jobbus.requests.build_spec(
            jobbus.JobRequest("t", max_attempts=max_attempts), jobbus.requests.JobDefaults(), 3
        )
        assert run_sync(self.conn, self.app.store.insert_jobs([spec])) == {}
        job_id = spec.id
        self.model[job_id] = ModelJob(JobStatus.QUEUED, max_attempts)
        return job_id

    @rule()
    def claim(self) -> None:
        claimed = run_sync(
            self.conn,
            claim_statement(self.app, self.conn, 1, worker_id="w", lease_seconds=3600),
        ).jobs
        queued = [i for i, j in self.model.items() if j.status is JobStatus.QUEUED]
        if not queued:
            assert claimed == []
            return
        assert len(claimed) == 1
        job = self.model[claimed[0].id]
        assert job.status is JobStatus.QUEUED, "claimed a job that was not queued"
        if job.token:
            job.old_tokens.append(job.token)
        job.status, job.attempts, job.token, job.expired = (
            JobStatus.RUNNING,
            job.attempts + 1,
            claimed[0].lease_token,
            False,
        )
        assert claimed[0].attempts == job.attempts
        assert claimed[0].cancellation_requested is False or job.cancel_requested

    def _token(self, job: ModelJob, stale: bool) -> uuid.UUID | None:
        if stale:
            return job.old_tokens[-1] if job.old_tokens else uuid.uuid4()
        return job.token

    def _holds_lease(self, job: ModelJob, stale: bool) -> bool:
        return not stale and job.status is JobStatus.RUNNING and not job.expired and job.token is not None

    @rule(
        job_id=jobs,
        status=st.sampled_from([JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.QUEUED]),
        stale=st.booleans(),
        released=st.booleans(),
    )
    def write_outcome(self, job_id: uuid.UUID, status: JobStatus, stale: bool, released: bool) -> None:
        job = self.model[job_id]
        token = self._token(job, stale)
        if token is None:
            return
        released = released and status is JobStatus.QUEUED
        applied = run_sync(
            self.conn, self.app.store.record_outcomes([Outcome(job_id, token, status, released=released)])
        )
        if self._holds_lease(job, stale):
            if job.token:
                job.old_tokens.append(job.token)
            if job.cancel_requested:  # the cancellation asked for wins over whatever the attempt ended with
                status = JobStatus.CANCELLED
            elif status is JobStatus.QUEUED and not released and job.attempts >= job.max_attempts:
                status = JobStatus.FAILED  # the store never retries past max_attempts
            assert applied == {job_id: status}
            job.status, job.token = status, None
            job.cancel_requested = job.cancel_requested and status is JobStatus.QUEUED
            if released:
                job.attempts -= 1
        else:
            assert applied == {}, f"a fenced write with a {'stale' if stale else 'lost'} lease was accepted"

    @rule(job_id=jobs, stale=st.booleans(), kind=st.sampled_from(["checkpoint", "progress", "heartbeat"]))
    def fenced_update(self, job_id: uuid.UUID, stale: bool, kind: str) -> None:
        job = self.model[job_id]
        token = self._token(job, stale)
        if token is None:
            return
        store = self.app.store
        statement = {
            "checkpoint": store.checkpoint_job(job_id, token, '{"at": 1}'),
            "progress": store.progress_job(job_id, token, 1, 2),
            "heartbeat": store.heartbeat_job(job_id, token, 3600),
        }[kind]
        flag = run_sync(self.conn, statement)
        if self._holds_lease(job, stale):
            assert flag is job.cancel_requested
        else:
            assert flag is None

    @rule(job_id=jobs)
    def cancel(self, job_id: uuid.UUID) -> None:
        job = self.model[job_id]
        status = run_sync(self.conn, self.app.store.cancel_job(job_id)).after
        if job.status is JobStatus.QUEUED:
            job.status = JobStatus.CANCELLED
        elif job.status is JobStatus.RUNNING:
            job.cancel_requested = True
        assert status is job.status

    @rule(job_id=jobs)
    def expire(self, job_id: uuid.UUID) -> None:
        job = self.model[job_id]
        self.conn.execute(
            "UPDATE jobbus.job SET lease_expires_at = now() - interval '1 second' WHERE id = %s AND status = 'running'",
            (job_id,),
        )
        if job.status is JobStatus.RUNNING:
            job.expired = True

    @rule()
    def recover(self) -> None:
        recovered = {r.job_id: r.status for r in run_sync(self.conn, self.app.store.recover_expired_leases())}
        expected = {i for i, j in self.model.items() if j.status is JobStatus.RUNNING and j.expired}
        assert set(recovered) == expected
        for job_id in expected:
            job = self.model[job_id]
            if job.cancel_requested:  # the cancellation asked for wins over a retry
                job.status = JobStatus.CANCELLED
            else:
                job.status = JobStatus.FAILED if job.attempts >= job.max_attempts else JobStatus.QUEUED
            if job.token:
                job.old_tokens.append(job.token)
            job.token, job.expired = None, False
            assert recovered[job_id] is job.status

    @rule(job_id=jobs)
    def manual_retry(self, job_id: uuid.UUID) -> None:
        job = self.model[job_id]
        before, done = run_sync(self.conn, self.app.store.retry_job(job_id, None, 0))
        assert before is job.status
        assert done is (job.status is JobStatus.FAILED)
        if done:
            job.status, job.attempts, job.cancel_requested = JobStatus.QUEUED, 0, False

    # -- the books -----------------------------------------------------------------------------------

    @invariant()
    def database_matches_the_model(self) -> None:
        rows = self.conn.execute(
            "SELECT id, status, attempts, lease_token, cancellation_requested_at IS NOT NULL,"
            " finished_at IS NOT NULL FROM jobbus.job"
        ).fetchall()
        assert len(rows) == len(self.model)
        for job_id, status, attempts, token, cancel_requested, finished in rows:
            job = self.model[job_id]
            assert (JobStatus(status), attempts) == (job.status, job.attempts)
            assert token == job.token
            assert finished is job.status.is_terminal
            if job.status is JobStatus.RUNNING:
                assert cancel_requested is job.cancel_requested
            assert 0 <= attempts <= job.max_attempts


@pytest.mark.smoke
def test_job_lifecycle_state_machine(dsn: str) -> None:
    run_state_machine_as_test(
        lambda: JobLifecycle(dsn),  # type: ignore[arg-type]
        settings=settings(max_examples=150, stateful_step_count=40, deadline=None),
    )
