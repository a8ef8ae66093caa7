"""The store: the only package that speaks SQL. Every query is a named block in `jobbus/sql/queries/`."""

from jobbus.store.jobs import CancelResult, Claim, JobStore, Outcome, RecoveredJob
from jobbus.store.maintenance import MaintenanceStore, QueueSample
from jobbus.store.statements import Copy, Row, Statement, queries, run_async, run_sync
from jobbus.store.workers import ControlState, DeadWorker, Registration, WorkerStore

__all__ = [
    "CancelResult",
    "Claim",
    "ControlState",
    "Copy",
    "DeadWorker",
    "JobStore",
    "MaintenanceStore",
    "Outcome",
    "QueueSample",
    "RecoveredJob",
    "Registration",
    "Row",
    "Statement",
    "WorkerStore",
    "queries",
    "run_async",
    "run_sync",
]
