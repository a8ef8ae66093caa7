"""An ASGI application served by uvicorn on a free port, in a thread of its own: real HTTP for the
tests of applications that mount the dashboard (its event stream never ends, which an in-memory
transport cannot deliver)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn


@contextmanager
def served(
    asgi: Any, *, lifespan: Literal["on", "off"] = "off", cleanup: Callable[[], Awaitable[None]] | None = None
) -> Iterator[str]:
    """The base URL of `asgi` served on 127.0.0.1; `cleanup` runs in the server's loop once it stopped."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        asgi, host="127.0.0.1", port=port, lifespan=lifespan, log_level="warning", timeout_graceful_shutdown=3
    )
    server = uvicorn.Server(config)
    failed: list[BaseException] = []

    async def main() -> None:
        try:
            await server.serve()
        finally:
            if cleanup is not None:
                await cleanup()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert not failed and thread.is_alive(), f"the server did not start: {failed}"
        assert time.monotonic() < deadline, "the server did not start within 30 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"
        assert not failed, failed
