"""A TCP proxy in front of PostgreSQL that loses one answer: the statement runs and commits, then the
connection drops before its result reaches the client. What a failover or a network cut does to a
statement whose commit went through, reproduced at will, to prove that running a call again is safe.

Speaks just enough of the wire protocol to find message boundaries (a type byte and a length after the
startup message); connect with ``sslmode=disable`` so that the stream stays readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: ReadyForQuery: the server is done with the statement (in autocommit: committed).
READY = b"Z"


class CuttingProxy:
    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        self._target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self._dsn = dsn
        self._server: asyncio.Server | None = None
        self._marks: tuple[bytes, ...] | None = None
        self._dark = False
        self._open: set[asyncio.StreamWriter] = set()
        #: Statements whose answer was lost, by the first of their marks.
        self.cut: list[bytes] = []

    @property
    def dsn(self) -> str:
        """The DSN of the database through this proxy."""
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return make_conninfo(self._dsn, host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable")

    def black_out(self, on: bool = True) -> None:
        """Drop every connection and refuse new ones (the server is unreachable), until called with False."""
        self._dark = on
        if on:
            for writer in list(self._open):
                writer.close()

    def arm(self, *marks: bytes) -> None:
        """Lose the answer of the next statement whose text contains every one of `marks` (once)."""
        self._marks = marks

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        if self._dark:
            client_out.close()
            return
        server_in, server_out = await asyncio.open_connection(*self._target)
        self._open.update((client_out, server_out))
        cutting = asyncio.Event()
        up = asyncio.create_task(self._client_to_server(client_in, server_out, cutting))
        down = asyncio.create_task(self._server_to_client(server_in, client_out, cutting))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            for writer in (client_out, server_out):
                self._open.discard(writer)
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _client_to_server(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, cutting: asyncio.Event
    ) -> None:
        (length,) = struct.unpack("!i", await source.readexactly(4))  # the startup message has no type byte
        sink.write(struct.pack("!i", length) + await source.readexactly(length - 4))
        async for kind, body in _messages(source):
            marks = self._marks
            if marks is not None and kind in (b"P", b"Q") and all(mark in body for mark in marks):
                self._marks = None
                self.cut.append(marks[0])
                cutting.set()
            sink.write(kind + struct.pack("!i", len(body) + 4) + body)
            await sink.drain()

    async def _server_to_client(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, cutting: asyncio.Event
    ) -> None:
        async for kind, body in _messages(source):
            if cutting.is_set():
                if kind == READY:
                    return  # the statement is done and committed: drop the connection, its answer unsent
                continue
            sink.write(kind + struct.pack("!i", len(body) + 4) + body)
            await sink.drain()


async def _messages(source: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, bytes]]:
    while True:
        try:
            kind = await source.readexactly(1)
            (length,) = struct.unpack("!i", await source.readexactly(4))
            body = await source.readexactly(length - 4)
        except asyncio.IncompleteReadError:
            return
        yield kind, body
