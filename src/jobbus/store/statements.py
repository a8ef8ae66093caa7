"""Named queries and the two ways to run them.

Every query is a block of `sql/queries/*.sql` starting with `-- name: <query_name>`, rendered once per
schema. An operation is a `Statement`: query text, parameters and a decoder for the rows. The async
and the blocking front-ends run the same statements through `run_async` / `run_sync`, so there is
one source of truth for the SQL and two thin ways to execute it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import pq
from psycopg.types.json import set_json_loads

from jobbus.jsontext import loads
from jobbus.models import JOB_COLUMNS
from jobbus.schema import render

T = TypeVar("T")
Row = tuple[Any, ...]

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def _templates() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in sorted(resources.files("jobbus").joinpath("sql/queries").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _BLOCK.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise RuntimeError(f"query {name} is defined twice (second time in {entry.name})")
            found[name] = body.strip().rstrip(";")
    return found


@cache
def queries(schema: str) -> dict[str, str]:
    """Every named query, rendered for `schema`."""
    columns = ", ".join(JOB_COLUMNS)
    return {name: render(text.replace("{columns}", columns), schema) for name, text in _templates().items()}


@dataclass(frozen=True, slots=True)
class Statement(Generic[T]):
    """One round trip: the query, its parameters and how to read its result.

    `prepare=False` keeps a statement from becoming a server-side prepared statement. That matters
    for statements driven by arrays: after a few executions PostgreSQL may switch a prepared
    statement to a generic plan that cannot see the array sizes, and for `record_outcomes` on a table
    with 1M finished rows that plan took 66 ms per 500 outcomes against 7.5 ms planned per call.
    """

    query: str
    params: Mapping[str, Any]
    decode: Callable[[list[Row], int], T]
    prepare: bool | None = None


@dataclass(frozen=True, slots=True)
class Copy(Generic[T]):
    """Rows streamed by ``COPY`` (`rows`, the whole text in COPY's text format), then `then`, in one
    transaction: the caller's, or the pool's.

    Rows carry client-made primary keys, so the only way one can already exist is an earlier attempt of
    the same operation whose commit went through while its connection was lost: the copy is then undone
    (a savepoint) and `instead()`, an ``ON CONFLICT DO NOTHING`` statement for the same rows, runs in its
    place, which makes a repeated operation as safe as a repeated statement. It is built only then.
    """

    copy: str
    rows: str
    then: Statement[T]
    instead: Callable[[], Statement[T]]


@dataclass(frozen=True, slots=True)
class Chain(Generic[T]):
    """Two operations in one transaction (the caller's, or the pool's): `first`, then `then(result)` when
    it gives one. For an operation that needs a trigger of the first statement to have run before the
    second (`App.delete`), and for an action and its audit entry."""

    first: Operation[T]
    then: Callable[[T], Operation[Any] | None]


@dataclass(frozen=True, slots=True)
class UnlessMissing(Generic[T]):
    """`statement` in a savepoint, or nothing (`default`) when the schema predates what it names: a
    function or table that a later migration creates. For what new code adds beside an action that
    must keep working on the previous schema during a rolling deploy (an audit entry)."""

    statement: Statement[T]
    default: T


Operation = Statement[T] | Copy[T] | Chain[T] | UnlessMissing[T]

#: What a statement meets on a schema older than the code: the function or table is not there yet.
_MISSING = (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedTable)


async def run_async(conn: psycopg.AsyncConnection[Any], statement: Operation[T]) -> T:
    if isinstance(statement, Copy):
        return await _copy_async(conn, statement)
    if isinstance(statement, Chain):
        return await _chain_async(conn, statement)
    if isinstance(statement, UnlessMissing):
        try:
            async with conn.transaction():
                return await run_async(conn, statement.statement)
        except _MISSING:
            return statement.default
    cursor = await conn.execute(statement.query.encode(), statement.params, prepare=statement.prepare)
    rows = await cursor.fetchall() if _has_rows(cursor) else []
    return statement.decode(rows, cursor.rowcount)


async def run_read_async(
    conn: psycopg.AsyncConnection[Any], statement: Statement[T], *, seconds: float | None = None
) -> T:
    """Run one of the operator's reads (a list, a count, a table of counts) without JIT compilation, and
    for at most `seconds` when given (then `psycopg.errors.QueryCanceled` says it stopped).

    The planner prices their capped index probes as whole scans, and above `jit_above_cost` it compiles
    them first: 700 ms of an 830 ms read of the queue table at 10 million jobs. The settings are sent
    pipelined with the statement, so they cost no round trip of their own.
    """
    async with conn.pipeline() as pipeline, conn.transaction():
        await conn.execute(_NO_JIT)
        if seconds is not None:
            await conn.execute(b"SET LOCAL statement_timeout = %d" % max(1, round(seconds * 1000)))
        cursor = await conn.execute(statement.query.encode(), statement.params, prepare=statement.prepare)
        await pipeline.sync()
        rows = await cursor.fetchall() if _has_rows(cursor) else []
    return statement.decode(rows, cursor.rowcount)


_NO_JIT = b"SET LOCAL jit = off"


def run_sync(conn: psycopg.Connection[Any], statement: Operation[T]) -> T:
    if isinstance(statement, Copy):
        return _copy_sync(conn, statement)
    if isinstance(statement, Chain):
        return _chain_sync(conn, statement)
    if isinstance(statement, UnlessMissing):
        try:
            with conn.transaction():
                return run_sync(conn, statement.statement)
        except _MISSING:
            return statement.default
    cursor = conn.execute(statement.query.encode(), statement.params, prepare=statement.prepare)
    rows = cursor.fetchall() if _has_rows(cursor) else []
    return statement.decode(rows, cursor.rowcount)


def _has_rows(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned rows to fetch, read from its result's status: `cursor.description`
    makes a `Column` per column first, 42 Python calls for the 5 columns a one-job insert returns."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


#: Opens the transaction a savepoint needs, on a connection that has none yet (not in autocommit: there
#: the savepoint's block is the transaction).
_OPEN = b"SELECT"


async def _copy_async(conn: psycopg.AsyncConnection[Any], op: Copy[T]) -> T:
    if not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        await conn.execute(_OPEN)
    try:
        async with conn.transaction():
            async with conn.cursor() as cursor, cursor.copy(op.copy.encode()) as copy:
                await copy.write(op.rows)
            return await run_async(conn, op.then)
    except psycopg.errors.UniqueViolation:
        return await run_async(conn, op.instead())


def _copy_sync(conn: psycopg.Connection[Any], op: Copy[T]) -> T:
    if not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        conn.execute(_OPEN)
    try:
        with conn.transaction():
            with conn.cursor() as cursor, cursor.copy(op.copy.encode()) as copy:
                copy.write(op.rows)
            return run_sync(conn, op.then)
    except psycopg.errors.UniqueViolation:
        return run_sync(conn, op.instead())


async def _chain_async(conn: psycopg.AsyncConnection[Any], op: Chain[T]) -> T:
    if not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        await conn.execute(_OPEN)
    async with conn.transaction():
        result = await run_async(conn, op.first)
        second = op.then(result)
        if second is not None:
            await run_async(conn, second)
    return result


def _chain_sync(conn: psycopg.Connection[Any], op: Chain[T]) -> T:
    if not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        conn.execute(_OPEN)
    with conn.transaction():
        result = run_sync(conn, op.first)
        second = op.then(result)
        if second is not None:
            run_sync(conn, second)
    return result


def configure_connection(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """What every connection of jobbus needs: JSON decoding that hostile rows cannot break."""
    set_json_loads(loads, conn)


async def configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    configure_connection(conn)


#: PostgreSQL truncates identifiers, channel names included, to 63 bytes.
MAX_IDENTIFIER_BYTES = 63


def channel_name(schema: str, suffix: str = "") -> str:
    """The NOTIFY channel of a schema (`suffix` tells channels apart); always within 63 bytes.

    Readable (``jobbus_<schema><suffix>``) when that fits; a long schema name is cut and a digest of
    the whole name keeps two long names apart.
    """
    name = f"jobbus_{schema}{suffix}"
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(schema.encode()).hexdigest()[:12]
    room = MAX_IDENTIFIER_BYTES - len("jobbus__") - len(digest) - len(suffix)
    return f"jobbus_{schema[:room]}_{digest}{suffix}"
