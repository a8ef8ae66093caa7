"""The worker runtime."""

from jobbus.worker.runtime import EXIT_OK, EXIT_RESTART, Worker, WorkerOptions

__all__ = ["EXIT_OK", "EXIT_RESTART", "Worker", "WorkerOptions"]
