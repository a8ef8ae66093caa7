"""The store: the only package that speaks SQL. Every query is a named block in `jobbus/sql/queries/`."""

from jobbus.store.jobs import CancelResult, ExpiredLease, JobStore, Outcome
from jobbus.store.statements import Row, Statement, dumps, queries, run_async, run_sync
from jobbus.store.workers import ControlState, WorkerStore

__all__ = [
    "CancelResult",
    "ControlState",
    "ExpiredLease",
    "JobStore",
    "Outcome",
    "Row",
    "Statement",
    "WorkerStore",
    "dumps",
    "queries",
    "run_async",
    "run_sync",
]
