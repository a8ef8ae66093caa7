"""`lifespan(app)`: the App opened and closed with an ASGI application (FastAPI, Starlette).

``FastAPI(lifespan=jobbus.contrib.asgi.lifespan(app))`` opens the App's pool at startup, so
endpoints can ``await task.defer(...)`` and ``await app.schedule(...)``, and closes it at shutdown.
With ``worker=True`` (or `WorkerOptions`) a worker also runs in the server's event loop: handy for
development and small deployments; production runs ``jobbus worker`` processes beside the web ones.
An application with a lifespan of its own passes it as `then`; its state is what the server sees.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from jobbus.app import App
from jobbus.worker import Worker, WorkerOptions

__all__ = ["lifespan"]

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


def lifespan(
    app: App,
    *,
    worker: bool | WorkerOptions = False,
    then: Lifespan | None = None,
) -> Lifespan:
    """A lifespan function for ``FastAPI(lifespan=...)`` / ``Starlette(lifespan=...)``.

    Startup opens the App (and starts the worker, waiting until it claims); shutdown stops the worker
    (in-flight jobs finish, or are given back after its `shutdown_timeout`) and closes the App.
    """
    options = worker if isinstance(worker, WorkerOptions) else WorkerOptions() if worker else None

    @contextlib.asynccontextmanager
    async def run(asgi_app: Any) -> AsyncIterator[Any]:
        async with app:
            running = None if options is None else await _start(app, options)
            try:
                if then is None:
                    yield None
                else:
                    async with then(asgi_app) as state:
                        yield state
            finally:
                if running is not None:
                    running.request_stop()
                    await running.wait()

    return run


async def _start(app: App, options: WorkerOptions) -> Worker:
    worker = Worker(app, options)
    task = worker.start()
    ready = asyncio.ensure_future(worker.ready())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        await task  # it stopped before claiming: its exception (a missing schema, say) is the startup's
        raise RuntimeError(f"the in-process jobbus worker stopped at startup with exit code {task.result()}")
    return worker
