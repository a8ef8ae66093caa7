"""What recovery tells listeners: the lifecycle event of every job it took back."""

from __future__ import annotations

from collections.abc import Iterable

from jobbus.events import EventHub, JobCancelled, JobFailed, JobRetried
from jobbus.models import JobStatus
from jobbus.store import RecoveredJob


async def announce_recovered(events: EventHub, recovered: Iterable[RecoveredJob]) -> None:
    """`JobRetried`, `JobFailed` or `JobCancelled` for each job recovery decided about."""
    if not events:
        return
    for job in recovered:
        if job.status is JobStatus.QUEUED:
            await events.emit(JobRetried(job.job_id, job.type, job.queue, job.attempts, job.error, 0.0))
        elif job.status is JobStatus.FAILED:
            await events.emit(JobFailed(job.job_id, job.type, job.queue, job.attempts, job.error))
        elif job.status is JobStatus.CANCELLED:
            await events.emit(JobCancelled(job.job_id, job.type, job.queue, JobStatus.RUNNING))
