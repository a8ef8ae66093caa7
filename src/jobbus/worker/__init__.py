"""The worker runtime."""

from jobbus.worker.options import WorkerOptions
from jobbus.worker.runtime import EXIT_OK, EXIT_RESTART, Worker, WorkerIdInUseError

__all__ = ["EXIT_OK", "EXIT_RESTART", "Worker", "WorkerIdInUseError", "WorkerOptions"]
