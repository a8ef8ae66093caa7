"""`WorkerOptions`: what one worker process claims and how it runs (the `jobbus worker` flags)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    queues: Sequence[str] | None = None
    types: Sequence[str] | None = None
    concurrency: int = 10
    worker_id: str | None = None
    poll_interval: float | None = None
    memory_limit: int | None = None  # bytes
    run_once: bool = False
    limit: int | None = None
    stop_when_empty: bool = False
    shutdown_timeout: float = 30.0
    #: SIGTERM/SIGINT stop the worker, SIGUSR1 prints its tasks. The CLI installs them; a host
    #: process that embeds a worker keeps its own and calls `Worker.request_stop()`.
    install_signal_handlers: bool = False
    #: Serve `GET /livez` and `GET /readyz` on this port (off when None); see `worker/health.py`.
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    #: The cells a process serves with `run_cell_workers` (worker/cells.py); None: every cell of the App.
    cells: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {self.concurrency!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"limit must be an integer >= 1, got {self.limit!r}")
        if self.poll_interval is not None and not self.poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {self.poll_interval!r}")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError(f"memory_limit must be > 0 bytes, got {self.memory_limit!r}")
        if not self.shutdown_timeout >= 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout!r}")
        if self.worker_id is not None and not (0 < len(self.worker_id) <= 255):
            raise ValueError(f"worker_id must be 1 to 255 characters, got {self.worker_id!r}")
        if self.health_port is not None and (
            isinstance(self.health_port, bool)
            or not isinstance(self.health_port, int)
            or not 0 < self.health_port < 65536
        ):
            raise ValueError(
                f"health_port must be a TCP port from 1 to 65535, got {self.health_port!r} (a probe needs a fixed port)"
            )
        if not isinstance(self.health_host, str) or not self.health_host:
            raise ValueError(f"health_host must be a host name or address, got {self.health_host!r}")
        for name, values in (("queues", self.queues), ("types", self.types), ("cells", self.cells)):
            if values is not None and (isinstance(values, str) or not all(isinstance(v, str) and v for v in values)):
                raise ValueError(f"{name} must be a list of non-empty strings, got {values!r}")

    @property
    def job_limit(self) -> int | None:
        return 1 if self.run_once else self.limit
