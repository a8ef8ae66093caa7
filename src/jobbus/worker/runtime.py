"""`Worker`: one asyncio event loop running up to `concurrency` jobs at once, until it is stopped.

The runtime wires the parts and owns the lifecycle (start, serve, stop, the exit's housekeeping);
each part is its own module. The producer runs the claim loop: claimer (what and when to claim) →
executor (one attempt) → completer (batched, fenced outcomes), with the monitor (leases, registry,
fencing), the control reader, the listener and the leader election on the side; registration takes
the worker id, the pools run the statements, and shutdown ends the jobs still in flight.
See docs/worker.md for the timeline of a job and of a shutdown.

A host process embeds a worker with the same object the CLI uses::

    worker = jobbus.Worker(app, concurrency=20)
    task = worker.start()           # runs in the current event loop
    ...
    worker.request_stop()           # or request_drain()
    exit_code = await task          # 0, 75 (restart asked for), 70 (fatal database error)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from jobbus.errors import TransactionPoolerError
from jobbus.resilience import Outage, first_line, retrying
from jobbus.store import MaintenanceStore, Registration, WorkerStore
from jobbus.worker.app_view import AppView
from jobbus.worker.attempt import Attempt
from jobbus.worker.claimer import Claimer
from jobbus.worker.collector import worker_pace
from jobbus.worker.completer import Completer
from jobbus.worker.control import ControlReader
from jobbus.worker.health import HealthReport, HealthServer
from jobbus.worker.joblogs import capturing_job_logs
from jobbus.worker.leader import Leadership
from jobbus.worker.listener import Listener
from jobbus.worker.memory import rss_bytes
from jobbus.worker.monitor import Monitor
from jobbus.worker.observer import Observers, WorkerObserver
from jobbus.worker.options import WorkerOptions
from jobbus.worker.outcomes import OutcomePolicy
from jobbus.worker.periodic_sync import sync_periodics
from jobbus.worker.pools import Pools
from jobbus.worker.producer import Producer
from jobbus.worker.recovery import announce_recovered
from jobbus.worker.registration import Registrar, WorkerIdInUseError
from jobbus.worker.services.cleaner import Cleaner
from jobbus.worker.services.maintainer import Maintainer
from jobbus.worker.services.periodic import PeriodicEnqueuer
from jobbus.worker.services.queue_stats import QueueSampler
from jobbus.worker.services.rescuer import Rescuer
from jobbus.worker.shutdown import Shutdown
from jobbus.worker.watchdog import LoopWatchdog

logger = logging.getLogger("jobbus.worker")
T = TypeVar("T")

EXIT_OK = 0
EXIT_SOFTWARE = 70
EXIT_RESTART = 75
EXIT_CONFIG = 78
#: Everything the worker does at exit after its jobs ended (stopping its loops, handing leadership
#: back, marking its registry row stopped, closing its pools) takes this long at most, in all: during
#: an outage none of it can reach the database, and none of it may keep the worker from exiting.
HOUSEKEEPING_TIMEOUT_SECONDS = 5.0
#: How long start-up statements are retried when the connection drops (the server was reachable).
STARTUP_RETRY_SECONDS = 60.0


class Worker:
    """One worker: claims, runs and completes jobs in this event loop until it is stopped.

    `Worker(app, options)` or `Worker(app, concurrency=..., queues=[...], ...)` (the fields of
    `WorkerOptions`). `run()` returns the exit code: 0 (stopped or drained), 75 (a restart was asked
    for: control command or memory limit), 70 (a fatal database error; what it held was given back).
    """

    def __init__(
        self,
        app: AppView,
        options: WorkerOptions | None = None,
        *,
        observers: Sequence[WorkerObserver] = (),
        **kwargs: Any,
    ) -> None:
        if options is not None and kwargs:
            raise TypeError("pass either WorkerOptions or keyword options, not both")
        self.observers = Observers(observers)
        self.app = app
        self.registry = app.registry
        self.options = options if options is not None else WorkerOptions(**kwargs)
        if self.options.cells is not None:
            raise ValueError("cells: a Worker serves one database; a process serves cells with run_cell_workers")
        self.settings = app.settings
        self.store = app.store
        self.worker_id = self.options.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.instance_id = uuid.uuid4()
        self.poll_interval = self.options.poll_interval or self.settings.poll_interval_seconds
        self.types = self._types()
        self.abandoned = 0
        self._exit_code = EXIT_OK
        self._signals_received = 0
        self._ready = asyncio.Event()
        self._registered = False
        self._finished = False
        self._task: asyncio.Task[int] | None = None
        self._write_lock = asyncio.Lock()
        self._housekeeping_deadline: float | None = None
        self._threads = ThreadPoolExecutor(max_workers=self.options.concurrency, thread_name_prefix="jobbus-job")
        self.pools = Pools(self.settings, stopping=lambda: self.producer.stopping, on_misconfigured=self._misconfigured)
        self.workers = WorkerStore(self.settings.schema, self.store.channel, self.store.control_channel)
        self.maintenance = MaintenanceStore(self.settings.schema)
        self.policy = OutcomePolicy(self.settings, self.worker_id, self.registry.events)
        self.completer = Completer(self.store, self.pools.run, write_lock=self._write_lock, on_fatal=self._fatal)
        self.claimer = self._new_claimer(
            store=self.store,
            maintenance=self.maintenance,
            queue_settings=app.queue_store,
            run=self.pools.run_unless_stopping,
            settings=self.settings,
            worker_id=self.worker_id,
            types=self.types,
            queues=self.options.queues,
            concurrency=self.options.concurrency,
            poll_interval=self.poll_interval,
            batch_sizes={
                handler.type: handler.batch_size
                for handler in self.registry.handlers.values()
                if handler.batch_size is not None
            },
        )
        self.control = ControlReader(
            store=self.workers,
            run=self.pools.run_unless_stopping,
            worker_id=self.worker_id,
            queues=self.options.queues,
            on_drain=self.request_drain,
            on_stop=self.request_stop,
            on_acked=self._acknowledge,
        )
        self.registrar = Registrar(
            Registration(
                worker_id=self.worker_id,
                instance_id=self.instance_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                queues=self.options.queues,
                types=self.types,
                concurrency=self.options.concurrency,
                lease_seconds=self.settings.lease_seconds,
                dead_after_seconds=self.settings.worker_dead_after_seconds,
                heartbeat_seconds=self.settings.heartbeat_seconds,
                # Its two pools, the App's pool (handlers may use it) and the LISTEN connection.
                pool_size=self.pools.max_connections
                + self.settings.pool_max_size
                + (1 if self.settings.notification_dsn else 0),
            ),
            workers=self.workers,
            run=self.pools.run,
            starting=self._starting,
            on_id_taken=functools.partial(self._fatal, "worker registry", exit_code=EXIT_CONFIG),
        )
        # The attempts from their claim to their written outcome: the producer starts and ends them,
        # the monitor and the watchdog watch them, the shutdown waits for them.
        in_flight: dict[uuid.UUID, Attempt] = {}
        self.monitor = Monitor(
            settings=self.settings,
            store=self.store,
            run=self.pools.run,
            attempts=in_flight.values,
            touch=self._touch,
            write_lock=self._write_lock,
            worker_id=self.worker_id,
            on_fatal=self._fatal,
            on_registration_lost=self._registration_lost,
        )
        self.watchdog = LoopWatchdog(in_flight.values, self.worker_id, on_freeze=self.monitor.after_freeze)
        self.producer = self._new_producer(
            app,
            self.options,
            in_flight=in_flight,
            claimer=self.claimer,
            control=self.control,
            monitor=self.monitor,
            policy=self.policy,
            completer=self.completer,
            threads=self._threads,
            observers=self.observers,
            worker_id=self.worker_id,
            poll_interval=self.poll_interval,
            run_for_handler=self.pools.run_for_handler,
            on_fatal=self._fatal,
            check_memory=self._check_memory if self.options.memory_limit is not None else None,
        )
        self._shutdown = Shutdown(self.producer, timeout=self.options.shutdown_timeout, worker_id=self.worker_id)
        self.leadership = Leadership(
            settings=self.settings,
            store=self.maintenance,
            run=self.pools.run,
            worker_id=self.worker_id,
            instance_id=self.instance_id,
            maintainer=Maintainer(
                [
                    Rescuer(
                        jobs=self.store,
                        workers=self.workers,
                        run=self.pools.run,
                        events=self.registry.events,
                        interval=self.poll_interval,
                    ),
                    Cleaner(settings=self.settings, maintenance=self.maintenance, run=self.pools.run),
                    QueueSampler(
                        maintenance=self.maintenance,
                        run=self.pools.run,
                        interval=self.settings.stats_interval_seconds,
                        on_sample=self.observers.queues_sampled,
                    ),
                    PeriodicEnqueuer(
                        store=app.periodic_store,
                        run=self.pools.run,
                        max_attempts_of=self.registry.max_attempts_of,
                        catch_up_seconds=2 * self.settings.worker_dead_after_seconds,
                    ),
                ]
            ),
            on_change=self.observers.leadership_changed,
        )
        listen_dsn = self.settings.notification_dsn
        self._listener = (
            Listener(
                listen_dsn,
                self.store.channel,
                self.store.control_channel,
                on_jobs=self.producer.jobs_notified,
                on_control=self.producer.control_notified,
            )
            if listen_dsn
            else None
        )

    def _new_claimer(self, **parts: Any) -> Claimer:
        """The claimer; a worker serving one cell of several shares a budget through its own (worker/cells.py)."""
        return Claimer(**parts)

    def _new_producer(self, app: AppView, options: WorkerOptions, **parts: Any) -> Producer:
        """The claim loop; a worker serving one cell of several shares a budget through its own."""
        return Producer(app, options, **parts)

    # -- the public handle --------------------------------------------------------------------------

    def start(self) -> asyncio.Task[int]:
        """Run the worker in the current event loop; await the task for the exit code."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"jobbus-worker-{self.worker_id}")
        return self._task

    async def wait(self) -> int:
        """The exit code, once the worker started with `start()` has stopped."""
        return await self.start()

    async def ready(self) -> None:
        """Wait until the worker is registered and claiming."""
        await self._ready.wait()

    def request_stop(self, exit_code: int = EXIT_OK) -> None:
        """Stop claiming, let in-flight jobs finish (the shutdown sequence), then exit with `exit_code`."""
        if self._exit_code not in (EXIT_SOFTWARE, EXIT_CONFIG):
            self._exit_code = max(self._exit_code, exit_code)
        self.producer.stop()

    def request_drain(self) -> None:
        """Run until no job is available for this worker, then stop with exit code 0."""
        self.producer.drain()

    @property
    def state(self) -> str:
        if self.producer.stopping:
            return "stopping"
        if self.producer.draining:
            return "draining"
        return "paused" if self.control.paused else "running"

    @property
    def completed(self) -> int:
        """Jobs this worker has completed so far."""
        return self.producer.completed

    @property
    def failed(self) -> int:
        """Jobs this worker has failed for good so far."""
        return self.producer.failed

    # -- lifecycle ----------------------------------------------------------------------------------

    def _types(self) -> list[str]:
        known = sorted(self.registry.handlers)
        if not known:
            raise ValueError("the app has no job handlers: register some with @app.job(...)")
        if self.options.types is None:
            return known
        unknown = sorted(set(self.options.types) - set(known))
        if unknown:
            raise ValueError(f"--type {', '.join(unknown)}: no handler for it in this app (known: {', '.join(known)})")
        return sorted(set(self.options.types))

    async def run(self) -> int:
        """Run until stopped; returns the exit code (0, 70 or 75)."""
        # Before anything opens: a port in use is a start-up error.
        health = HealthServer.asked_for(self._health_report, self.options, self.settings.heartbeat_seconds)
        self.watchdog.start()
        if health is not None:
            health.start()
        try:
            await self.app.open()
            try:
                await self.pools.open(self.app.dsn)
                await self._starting(self.app.check_schema)
                await self._register()
                with worker_pace(), capturing_job_logs():
                    return await self._serve()
            finally:
                self._threads.shutdown(wait=False, cancel_futures=True)
                await self.pools.close(self._housekeeping_left)
                await self.app.close()
        finally:
            self._finished = True
            self.watchdog.stop()
            if health is not None:
                health.close()

    def _health_report(self) -> HealthReport:
        """What the health endpoints answer from: read from any thread, never waiting for the loop."""
        now = time.monotonic()
        if self._finished:
            state = "stopped"
        elif not self._registered:
            state = "stopping" if self.producer.stopping else "starting"
        else:
            state = self.state
        return HealthReport(
            worker_id=self.worker_id,
            state=state,
            in_flight=len(self.producer.in_flight),
            loop_silent_seconds=max(0.0, now - self.watchdog.last_tick),
            database_silent_seconds=max(0.0, now - self.monitor.last_contact) if self._registered else None,
            registered=self._registered,
        )

    def _housekeeping_left(self) -> float:
        """Seconds left of the exit's housekeeping (all of it before the exit started)."""
        if self._housekeeping_deadline is None:
            return HOUSEKEEPING_TIMEOUT_SECONDS
        return max(0.0, self._housekeeping_deadline - time.monotonic())

    async def _starting(self, call: Callable[[], Awaitable[T]]) -> T:
        """Start-up statements ride out a connection lost right after the server was reached."""
        return await retrying(call, Outage("worker start"), deadline=time.monotonic() + STARTUP_RETRY_SECONDS)

    async def _register(self) -> None:
        """Take the worker id (refused while a live process holds it), then take back what a dead
        predecessor under the same id left running."""
        self.control.acked_generation = await self.registrar.register()
        self.monitor.last_contact = time.monotonic()
        self._registered = True
        recovered = await self.registrar.reclaim_predecessor_jobs()
        await self._starting(self._sync_periodics)
        if recovered:
            await announce_recovered(self.registry.events, recovered)

    async def _registration_lost(self) -> None:
        """Our registry row is gone, and with it, maybe, what this worker stored at its start: after a
        failover to a standby that was behind, or a restore, the periodic jobs too. Store them again
        (first, so that a failure tries both again at the next refresh), then register again."""
        await self._sync_periodics()
        await self.registrar.register_again()

    async def _sync_periodics(self) -> None:
        await sync_periodics(self.app, self.pools.run, types=self.types, worker_id=self.worker_id)

    async def _serve(self) -> int:
        logger.info(
            "worker %s started: queues=%s types=%s concurrency=%d",
            self.worker_id,
            ",".join(self.options.queues) if self.options.queues else "*",
            ",".join(self.types),
            self.options.concurrency,
            extra={"worker_id": self.worker_id},
        )
        if self._listener is not None:
            self._listener.start()
        self.completer.start()
        self.monitor.start()
        self.leadership.start()
        installed = install_stop_signals(self.options.install_signal_handlers, self._on_signal)
        self._ready.set()
        try:
            await self.producer.run()
            await self._shutdown.run()
        finally:
            # Housekeeping, within one deadline: it never keeps a stopping worker from exiting.
            # The loops first (no database call), then the writes, side by side.
            self._housekeeping_deadline = time.monotonic() + HOUSEKEEPING_TIMEOUT_SECONDS
            await self.leadership.close(self._housekeeping_left())
            await self.monitor.close(self._housekeeping_left())
            if self._listener is not None:
                await self._listener.close(self._housekeeping_left())
            remove_signals(installed)
            await self.completer.close(self._housekeeping_left())
            self.abandoned = len(self.producer.in_flight)
            # Jobs still running in threads keep their leases until this process exits: the row is not
            # marked stopped, so it goes silent and the leader recovers them once the process is gone.
            final_state = "stopped" if not self.abandoned else "stopping"
            await asyncio.gather(self.leadership.resign(self._housekeeping_left()), self._final_touch(final_state))
        logger.info(
            "worker %s stopped: %d completed, %d failed, exit %d",
            self.worker_id,
            self.completed,
            self.failed,
            self._exit_code,
            extra={"worker_id": self.worker_id},
        )
        return self._exit_code

    # -- stopping on its own ------------------------------------------------------------------------

    def _fatal(self, component: str, exc: BaseException, exit_code: int = EXIT_SOFTWARE) -> None:
        """A non-transient error: stop claiming, give back what is held within a bounded time, exit 70."""
        if self._exit_code not in (EXIT_SOFTWARE, EXIT_CONFIG):
            logger.error(
                "%s failed with a non-transient database error (%s: %s): stopping the worker, giving back "
                "its jobs, exit %d",
                component,
                type(exc).__name__,
                first_line(exc),
                exit_code,
                exc_info=exc,
                extra={"worker_id": self.worker_id},
            )
            self._exit_code = exit_code
        self._shutdown.hurry = True
        self.producer.stop()

    def _misconfigured(self, error: TransactionPoolerError) -> None:
        """A configuration that cannot work (a transaction-mode pooler without `transaction_pooling`):
        one line, no traceback, then the fatal path's stop with exit 78."""
        if self._exit_code not in (EXIT_SOFTWARE, EXIT_CONFIG):
            logger.error("worker %s: %s: stopping, exit %d", self.worker_id, error, EXIT_CONFIG)
            self._exit_code = EXIT_CONFIG
        self._shutdown.hurry = True
        self.producer.stop()

    def _check_memory(self) -> None:
        """After a job: over `--memory-limit`, stop claiming, finish in-flight jobs, then exit 75."""
        limit = self.options.memory_limit
        if limit is not None and not self.producer.stopping:
            rss = rss_bytes()
            if rss > limit:
                logger.warning(
                    "worker %s uses %d MiB, over its memory limit of %d MiB: finishing in-flight jobs, then "
                    "exiting %d for a restart",
                    self.worker_id,
                    rss // 2**20,
                    limit // 2**20,
                    EXIT_RESTART,
                )
                self.request_stop(EXIT_RESTART)

    # -- signals ------------------------------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        """The first signal stops the worker gracefully; the second skips every remaining wait."""
        self._signals_received += 1
        if self._signals_received >= 2:
            if not self._shutdown.hurry:
                logger.warning("second %s: skipping the wait for in-flight jobs", sig.name)
            self._shutdown.hurry = True
        else:
            logger.info(
                "%s: stopping; %d job(s) in flight get %.0f s to finish",
                sig.name,
                len(self.producer.in_flight),
                self.options.shutdown_timeout,
            )
        self.request_stop()

    # -- the registry row ---------------------------------------------------------------------------

    async def _acknowledge(self) -> None:
        await self._touch()

    async def _final_touch(self, state: str) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._touch(state), self._housekeeping_left())

    async def _touch(self, state: str | None = None) -> bool | None:
        return await self.pools.run(
            self.workers.touch_worker(
                worker_id=self.worker_id,
                instance_id=self.instance_id,
                state=state or self.state,
                in_flight=len(self.producer.in_flight),
                completed=self.producer.completed,
                failed=self.producer.failed,
                acked_generation=self.control.acked_generation,
            )
        )


def install_stop_signals(enabled: bool, on_signal: Callable[[signal.Signals], None]) -> list[signal.Signals]:
    """SIGTERM and SIGINT call `on_signal`, SIGUSR1 prints where the tasks wait; a stop signal held while the
    process started (`hold_stop_signals`) is acted on now. Nothing unless `enabled` and in the main thread
    (a host process that embeds a worker keeps its own handlers). Returns what to `remove_signals`."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        return []
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
        installed.append(sig)
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    installed.append(signal.SIGUSR1)
    for sig in _held_signals:
        loop.call_soon(on_signal, sig)
    _held_signals.clear()
    return installed


def remove_signals(installed: list[signal.Signals]) -> None:
    loop = asyncio.get_running_loop()
    for sig in installed:
        loop.remove_signal_handler(sig)


def _dump_tasks() -> None:
    """SIGUSR1: print where every task of the worker is waiting, for diagnosing a stuck worker."""
    tasks = asyncio.all_tasks()
    print(f"jobbus: {len(tasks)} task(s)", file=sys.stderr)
    for task in tasks:
        task.print_stack(limit=8, file=sys.stderr)


__all__ = [
    "EXIT_CONFIG",
    "EXIT_OK",
    "EXIT_RESTART",
    "EXIT_SOFTWARE",
    "Worker",
    "WorkerIdInUseError",
    "WorkerOptions",
]


#: SIGTERM and SIGINT received while a `jobbus worker` process was starting (`hold_stop_signals`).
_held_signals: list[signal.Signals] = []


def hold_stop_signals() -> None:
    """Until a worker installs its own handlers, keep SIGTERM and SIGINT for it instead of letting them end
    the process: a supervisor that stops a worker still loading its application or connecting gets the
    same clean stop (exit 0) as one that stops a running worker. A second such signal before then ends the
    process as it would have."""

    def held(number: int, _frame: Any) -> None:
        sig = signal.Signals(number)
        if _held_signals:
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)
        _held_signals.append(sig)
        # Unbuffered (a handler may run while the process writes to stderr), and before logging is set up.
        os.write(2, f"jobbus: {sig.name} while starting: the worker stops once it has started\n".encode())

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, held)
