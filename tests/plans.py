"""The plans a statement executes, read two ways.

- Through auto_explain, where the server has it (the machine's PostgreSQL): the plan of every statement
  executed, nested ones too (the bodies of the functions the statement calls).
- Through ``EXPLAIN (ANALYZE, BUFFERS)`` of the statement prepared under ``plan_cache_mode =
  force_generic_plan`` (``PREPARE`` + ``EXPLAIN EXECUTE``), which every server can do (the embedded one
  ships no auto_explain). The generic plan is the one planned without the parameters' values: the plan
  a SQL function's body gets, and the one a long-lived prepared statement may switch to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg import sql

T = TypeVar("T")

#: Why a test that reads plans through auto_explain needs the machine's server.
NEEDS_AUTO_EXPLAIN = "reads executed plans through auto_explain, which the embedded server does not ship"


def has_auto_explain(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.errors.UndefinedFile:
        return False
    return True


def auto_explained(conn: psycopg.Connection[Any], run: Callable[[], T]) -> tuple[T, str]:
    """`run()`'s result and the executed plan of every statement it ran, nested ones included."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_analyze = on", "log_level = 'notice'"):
        conn.execute(f"SET auto_explain.{setting}")
    try:
        result = run()
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
    return result, "\n".join(notices)


def generic_plan(
    conn: psycopg.Connection[Any], query: str, params: Mapping[str, Any], types: Mapping[str, str] | None = None
) -> str:
    """The executed generic plan of `query` (``%(name)s`` placeholders), run with `params`.

    `types` are the parameters' types by name; without them PostgreSQL infers them. The statement runs:
    a DELETE deletes.
    """
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match[1] is None:
            return "%"
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    text = re.sub(r"%%|%\((\w+)\)s", placeholder, query)
    declared = f"({', '.join(types[n] for n in names)})" if types else ""
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE plan_under_test{declared} AS {text}".encode())
    try:
        # The values as literals: EXECUTE's own parameters would have no type to infer.
        values = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
        arguments = sql.SQL("({})").format(values) if names else sql.SQL("")
        rows = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE plan_under_test{}").format(arguments)
        ).fetchall()
    finally:
        conn.execute("DEALLOCATE plan_under_test")
        conn.execute("RESET plan_cache_mode")
    return "\n".join(row[0] for row in rows)


def sql_function_body(conn: psycopg.Connection[Any], function: str) -> tuple[str, dict[str, str]]:
    """The statement of a SQL function as installed, its parameters as ``%(name)s``, and their types."""
    row = conn.execute(
        "SELECT p.prosrc, p.proargnames, array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) AS t),"
        " l.lanname FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang WHERE p.oid = %s::regproc",
        (function,),
    ).fetchone()
    assert row is not None, function
    source, names, types, language = row
    assert language == "sql", f"{function} is written in {language}, not SQL: EXPLAIN cannot see into its body"
    body = source.strip().rstrip(";").replace("%", "%%")
    for name in names or ():
        body = re.sub(rf"\b{re.escape(name)}\b", f"%({name})s", body)
    return body, dict(zip(names or (), types, strict=True))
