"""The health endpoints: `GET /livez` and `GET /readyz` for Kubernetes probes and load balancers.

They are served from a thread, not from the worker's event loop: a handler that blocks the loop
(`time.sleep` in an `async def`) must turn `/livez` to 503, which a server on that loop could never
answer. The thread reads what the loop last wrote (the loop watchdog's tick, the monitor's last
registry refresh), never calls into it, and so answers in microseconds whatever the loop is doing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jobbus.errors import JobbusError
from jobbus.worker.options import WorkerOptions

logger = logging.getLogger("jobbus.worker")


class HealthServerError(JobbusError):
    """The health server cannot listen where it was told to (the port is taken, the host unknown)."""


@dataclass(frozen=True, slots=True)
class HealthReport:
    """What the worker is, as read from the health thread at one moment."""

    worker_id: str
    state: str  # starting, running, paused, draining, stopping, stopped
    in_flight: int
    loop_silent_seconds: float  # since the event loop last ticked
    database_silent_seconds: float | None  # since the registry row was last refreshed; None before
    registered: bool
    #: A process serving cells: the state of each cell's worker (or `unreachable`, `starting`, `stopped`).
    cells: Mapping[str, str] | None = None


class HealthServer:
    """`/livez` and `/readyz` of one worker, on `host:port`, answered from a thread.

    `/livez`: 200 while the event loop ticked less than `heartbeat_seconds` ago and the worker is not
    stopping. `/readyz`: 200 while the worker is registered, not stopping, and refreshed its registry
    row (a database round trip) within two heartbeat intervals. Both answer a JSON object with
    `status`, `worker_id`, `in_flight` and what the verdict was made of. A process serving cells is
    ready while the worker of at least one cell is, and its answer has the state of each cell (`cells`).
    """

    @classmethod
    def asked_for(
        cls, report: Callable[[], HealthReport], options: WorkerOptions, heartbeat_seconds: float
    ) -> HealthServer | None:
        """The endpoints the worker's options ask for (`health_port`), or None when they ask for none."""
        if options.health_port is None:
            return None
        return cls(report, host=options.health_host, port=options.health_port, heartbeat_seconds=heartbeat_seconds)

    def __init__(self, report: Callable[[], HealthReport], *, host: str, port: int, heartbeat_seconds: float) -> None:
        self._report = report
        self.heartbeat_seconds = heartbeat_seconds
        try:
            self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        except OSError as exc:
            raise HealthServerError(
                f"--health-port: cannot listen on {host}:{port} ({exc.strerror or exc}): pick a free port, or "
                "stop what holds it"
            ) from None
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="jobbus-health", daemon=True)

    def start(self) -> None:
        self._thread.start()
        logger.info("health endpoints on http://%s:%d/livez and /readyz", self.host, self.port)

    def close(self) -> None:
        """Stop answering and free the port (the requests being answered finish on their own)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        """The status code and body for `path` (`/livez` or `/readyz`)."""
        report = self._report()
        body: dict[str, Any] = {
            "worker_id": report.worker_id,
            "state": report.state,
            "in_flight": report.in_flight,
            "loop_silent_seconds": round(report.loop_silent_seconds, 3),
            "database_silent_seconds": (
                None if report.database_silent_seconds is None else round(report.database_silent_seconds, 3)
            ),
        }
        if report.cells is not None:
            body["cells"] = dict(report.cells)
        if path == "/livez":
            problem = self._liveness_problem(report)
        else:
            problem = self._liveness_problem(report) or self._readiness_problem(report)
        body = {"status": problem or "ok", **body}
        return (503 if problem else 200), body

    def _liveness_problem(self, report: HealthReport) -> str | None:
        if report.state in ("stopping", "stopped"):
            return report.state
        if report.loop_silent_seconds >= self.heartbeat_seconds:
            return "event loop blocked"
        return None

    def _readiness_problem(self, report: HealthReport) -> str | None:
        if not report.registered:
            return "starting"
        silent = report.database_silent_seconds
        if silent is None or silent >= 2 * self.heartbeat_seconds:
            return "database unreachable"
        return None


def _handler_for(server: HealthServer) -> type[BaseHTTPRequestHandler]:
    class HealthRequest(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in ("/livez", "/readyz"):
                self._send(404, {"status": "not found", "endpoints": ["/livez", "/readyz"]})
                return
            self._send(*server.answer(path))

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes every few seconds are not worth a log line each."""

    return HealthRequest
