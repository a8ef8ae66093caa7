"""`jobbus worker`: run one worker process until it is stopped."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

import click

from jobbus.cli.errors import UsageProblem, probe_database, run
from jobbus.cli.loading import open_app
from jobbus.cli.options import FiniteFloatRange, check_names, seconds_range
from jobbus.redaction import redact_error
from jobbus.requests import INT32_MAX
from jobbus.settings import BOUNDS, DAY
from jobbus.worker import Worker, WorkerOptions
from jobbus.worker.cells import CellWorkers, select_cells
from jobbus.worker.memory import parse_size
from jobbus.worker.observer import WorkerObserver
from jobbus.worker.outcomes import MAX_TRACEBACK_BYTES, traceback_text
from jobbus.worker.runtime import hold_stop_signals

if TYPE_CHECKING:
    from jobbus.metrics import MetricsServer, PrometheusMetrics

#: Worker ids name rows of the worker registry and of jobs (`worker_id`): short, like a pod name.
MAX_WORKER_ID_BYTES = 255
#: More concurrent jobs than one event loop can usefully run; the registry stores it as an integer.
MAX_CONCURRENCY = 10_000


@click.command("worker")
@click.option("--app", "app_spec", required=True, metavar="MODULE:ATTR", help="The App, or a factory of one.")
@click.option("--queue", "queues", multiple=True, metavar="Q", help="Claim from this queue (repeatable); default all.")
@click.option("--type", "types", multiple=True, metavar="T", help="Claim only this job type (repeatable).")
@click.option(
    "--concurrency", type=click.IntRange(1, MAX_CONCURRENCY), default=10, show_default=True, help="Jobs at once."
)
@click.option("--worker-id", metavar="ID", help="Stable id, e.g. the pod name; default host-pid-random.")
@click.option(
    "--poll-interval", type=seconds_range(BOUNDS["poll_interval_seconds"]), metavar="S", help="Polling fallback."
)
@click.option("--memory-limit", metavar="SIZE", help="After a job, exit 75 if RSS exceeds this (e.g. 256M).")
@click.option("--run-once", is_flag=True, help="Process at most one job, then exit.")
@click.option("--limit", type=click.IntRange(1, INT32_MAX), metavar="N", help="Exit after N jobs finished.")
@click.option("--stop-when-empty", is_flag=True, help="Exit when no job is available.")
@click.option("--shutdown-timeout", type=FiniteFloatRange(min=0, max=DAY), default=30.0, show_default=True, metavar="S")
@click.option("--dsn", metavar="DSN", help="PostgreSQL DSN (default: the App's own dsn, else JOBBUS_DSN).")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING"]))
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics on /metrics (needs jobbus[metrics]; 0 picks a free port).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, metavar="HOST", help="Address of /metrics.")
@click.option(
    "--health-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve GET /livez and GET /readyz on this port (for liveness and readiness probes).",
)
@click.option(
    "--health-host", default="127.0.0.1", show_default=True, metavar="HOST", help="Address of /livez and /readyz."
)
@click.option(
    "--cell",
    "cells",
    multiple=True,
    metavar="NAME",
    help="Serve this cell of an App with cells (repeatable); default every cell.",
)
def worker_command(
    app_spec: str,
    queues: tuple[str, ...],
    types: tuple[str, ...],
    concurrency: int,
    worker_id: str | None,
    poll_interval: float | None,
    memory_limit: str | None,
    run_once: bool,
    limit: int | None,
    stop_when_empty: bool,
    shutdown_timeout: float,
    dsn: str | None,
    log_level: str,
    metrics_port: int | None,
    metrics_host: str,
    health_port: int | None,
    health_host: str,
    cells: tuple[str, ...],
) -> None:
    """Run a worker: claim jobs, run their handlers, write outcomes; stop on SIGTERM/SIGINT.

    \b
    Examples:
      jobbus worker --app myproject.jobs:app
      jobbus worker --app myproject.jobs:app --queue emails --concurrency 20
      jobbus worker --app myproject.jobs:app --memory-limit 512M --worker-id "$HOSTNAME"
      jobbus worker --app myproject.jobs:app --metrics-port 9464
      jobbus worker --app myproject.jobs:app --health-port 8080 --health-host 0.0.0.0
      jobbus worker --app myproject.jobs:app --cell eu --cell us --concurrency 40

    The database is --dsn when given, else the App's own `dsn`, else JOBBUS_DSN. An App with
    cells is served in every cell (or those given with --cell) within one --concurrency.

    Exit codes: 0 stopped, 75 restart requested (control command or memory limit),
    64 bad usage, 69 database unreachable (or --health-port taken), 70 internal error, 78 configuration error.
    """
    hold_stop_signals()
    try:
        memory = parse_size(memory_limit) if memory_limit else None
    except ValueError as exc:
        raise UsageProblem(f"--memory-limit: {exc}") from None
    check_names("--worker-id", [worker_id] if worker_id is not None else [], MAX_WORKER_ID_BYTES)
    check_names("--queue", queues)
    check_names("--type", types)
    check_names("--cell", cells)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(cell_tag)s%(message)s"))
    handler.addFilter(_cell_tag)
    logging.basicConfig(level=getattr(logging, log_level), handlers=[handler])
    options = dict(
        queues=list(queues) or None,
        types=list(types) or None,
        concurrency=concurrency,
        worker_id=worker_id,
        poll_interval=poll_interval,
        memory_limit=memory,
        run_once=run_once,
        limit=limit,
        stop_when_empty=stop_when_empty,
        shutdown_timeout=shutdown_timeout,
        install_signal_handlers=True,
        health_port=health_port,
        health_host=health_host,
    )

    metrics: PrometheusMetrics | None = None
    server: MetricsServer | None = None

    def serve_metrics(with_cells: bool) -> PrometheusMetrics | None:
        """Prometheus metrics on --metrics-port, their series labelled by cell for an App with cells."""
        nonlocal server
        if metrics_port is None:
            return None
        try:
            from jobbus.metrics import PrometheusMetrics
        except ImportError as exc:
            raise UsageProblem(f"--metrics-port: {exc}") from None
        served = PrometheusMetrics(cells=with_cells)
        try:
            server = served.serve(metrics_port, metrics_host)
        except OSError as exc:
            raise UsageProblem(f"--metrics-port: cannot listen on {metrics_host}:{metrics_port} ({exc})") from None
        logging.getLogger("jobbus.worker").info("Prometheus metrics on http://%s:%d/metrics", metrics_host, server.port)
        return served

    async def body() -> int:
        nonlocal metrics
        async with open_app(app_spec, dsn) as app:
            if app.cells:
                if dsn:
                    raise UsageProblem(
                        f"--dsn: the App has cells ({', '.join(app.cells)}), each with its own database; "
                        "give them in App(cells=...) or JOBBUS_CELLS"
                    )
                try:
                    cell_options = WorkerOptions(cells=list(cells) or None, **options)  # type: ignore[arg-type]
                    selected = select_cells(app.cells, cell_options.cells)
                except ValueError as exc:
                    raise UsageProblem(f"--cell: {exc}") from None
                metrics = serve_metrics(with_cells=True)
                cell_observers = {cell: [metrics.for_cell(cell)] for cell in selected} if metrics else {}
                workers = CellWorkers(app.cells, cell_options, observers=cell_observers)
                code = await workers.run()
                abandoned = workers.abandoned
            else:
                if cells:
                    raise UsageProblem(
                        f"--cell {cells[0]}: the App has no cells (it serves one database; see App(cells=...))"
                    )
                await probe_database(app.dsn)
                metrics = serve_metrics(with_cells=False)
                observers: list[WorkerObserver] = [metrics] if metrics else []
                worker = Worker(app, WorkerOptions(**options), observers=observers)  # type: ignore[arg-type]
                code = await worker.run()
                abandoned = worker.abandoned
        if abandoned:
            _exit_now(code)  # handlers that ignore cancellation would keep the event loop from closing
        return code

    try:
        code = run(body)
    finally:
        if server is not None:
            server.close()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        _exit_now(code)  # a sync handler's thread still runs: its lease was kept, the process ends it
    sys.exit(code)


#: A log record's message keeps at most this many bytes, its head: room for a final failure's error and
#: stored traceback, which the worker logs together.
MAX_LOG_MESSAGE_BYTES = 32 * 1024


class RedactingFormatter(logging.Formatter):
    """Log lines as jobbus prints errors (`redaction.redact_error`): secrets masked, the message at most
    `MAX_LOG_MESSAGE_BYTES` and a traceback or stack at most `MAX_TRACEBACK_BYTES` (its tail), each cut
    before it is masked. The worker logs from its event loop: a record of any size, from jobbus or from
    the application's code, costs what its bounded part does."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return redact_error(super().formatMessage(record), MAX_LOG_MESSAGE_BYTES)

    def formatException(self, ei: Any) -> str:
        if isinstance(ei[1], BaseException):  # formatted as the worker stores it: long messages cut first
            return traceback_text(ei[1]).rstrip("\n")
        return redact_error(super().formatException(ei), MAX_TRACEBACK_BYTES, keep="tail")

    def formatStack(self, stack_info: str) -> str:
        return redact_error(super().formatStack(stack_info), MAX_TRACEBACK_BYTES, keep="tail")


def _cell_tag(record: logging.LogRecord) -> bool:
    """A worker serving cells: each line of a cell's worker says which (`[cell NAME] `)."""
    cell = getattr(record, "cell", None)
    record.cell_tag = f"[cell {cell}] " if cell is not None else ""
    return True


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
