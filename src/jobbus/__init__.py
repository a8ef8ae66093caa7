"""jobbus: durable background jobs on PostgreSQL, with an asyncio worker and a small message bus."""

from jobbus.app import App, SyncApp
from jobbus.audit import AuditEntry, acting_as
from jobbus.bus import Codec, DispatchResult, JsonCodec, MessageBus
from jobbus.encryption import MissingKeyError
from jobbus.errors import (
    DatabaseUnavailableError,
    InvalidJobError,
    InvalidStateError,
    JobbusError,
    LeaseLostError,
    NonRetryableError,
    SchemaError,
    Snooze,
    TransactionPoolerError,
)
from jobbus.events import (
    JobCancelled,
    JobCompleted,
    JobEvent,
    JobFailed,
    JobRetried,
    JobScheduled,
    JobStarted,
)
from jobbus.execution import JobBatch, JobExecution, JobParked, SyncJobExecution, current_job, current_sync_job
from jobbus.limits import QueueSettings, RateLimit
from jobbus.models import GroupProgress, Job, JobStatus
from jobbus.periodic import Periodic, PeriodicOptions
from jobbus.registry import HandlerOptions
from jobbus.requests import JobOptions, JobRequest
from jobbus.settings import Settings
from jobbus.tasks import Task, TaskOptions
from jobbus.worker import Worker, WorkerOptions

__all__ = [
    "App",
    "AuditEntry",
    "Codec",
    "DatabaseUnavailableError",
    "DispatchResult",
    "GroupProgress",
    "HandlerOptions",
    "InvalidJobError",
    "InvalidStateError",
    "Job",
    "JobBatch",
    "JobCancelled",
    "JobCompleted",
    "JobEvent",
    "JobExecution",
    "JobFailed",
    "JobOptions",
    "JobParked",
    "JobRequest",
    "JobRetried",
    "JobScheduled",
    "JobStarted",
    "JobStatus",
    "JobbusError",
    "JsonCodec",
    "LeaseLostError",
    "MessageBus",
    "MissingKeyError",
    "NonRetryableError",
    "Periodic",
    "PeriodicOptions",
    "QueueSettings",
    "RateLimit",
    "SchemaError",
    "Settings",
    "Snooze",
    "SyncApp",
    "SyncJobExecution",
    "Task",
    "TaskOptions",
    "TransactionPoolerError",
    "Worker",
    "WorkerOptions",
    "acting_as",
    "current_job",
    "current_sync_job",
]
