"""Turning what went wrong into one clear line on stderr and the exit code SPEC section 6 fixes."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
import psycopg
import psycopg_pool

from jobbus.cli import exit_codes
from jobbus.cli.loading import AppLoadError
from jobbus.errors import InvalidJobError, InvalidStateError, SchemaError
from jobbus.worker import WorkerIdInUseError

T = TypeVar("T")


class DatabaseUnavailable(Exception):
    """The database could not be reached when the command started."""


class UsageProblem(click.UsageError):
    """Bad input found after parsing (invalid JSON, a bad duration): exit 64."""


def fail(message: str, code: int) -> int:
    click.secho(f"error: {message}", fg="red", err=True)
    return code


def run(coroutine_factory: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run an async command body; map known failures to exit codes."""
    try:
        return asyncio.run(coroutine_factory())
    except click.UsageError:
        raise
    except AppLoadError as exc:
        return fail(str(exc), exit_codes.CONFIG)
    except (SchemaError, WorkerIdInUseError) as exc:
        return fail(str(exc), exit_codes.CONFIG)
    except DatabaseUnavailable as exc:
        return fail(str(exc), exit_codes.UNAVAILABLE)
    except InvalidStateError as exc:
        return fail(str(exc), exit_codes.FAILURE)
    except InvalidJobError as exc:
        return fail(str(exc), exit_codes.USAGE)
    except ImportError:
        traceback.print_exc()
        return fail("could not import the --app module (traceback above)", exit_codes.CONFIG)
    except ValueError as exc:  # settings and options validated by the library
        return fail(str(exc), exit_codes.CONFIG)
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
        return fail(f"database error: {exc}", exit_codes.UNAVAILABLE)
    except KeyboardInterrupt:
        return fail("interrupted", exit_codes.SOFTWARE)
    except Exception:
        logging.getLogger("jobbus.cli").debug("internal error", exc_info=True)
        traceback.print_exc()
        return fail("internal error (traceback above)", exit_codes.SOFTWARE)


async def probe_database(dsn: str, timeout: float = 10.0, attempts: int = 3) -> None:
    """Fail fast with exit 69 when the server cannot be reached at start (after a few quick tries, so
    one dropped connection is not mistaken for an unreachable server)."""
    for attempt in range(1, attempts + 1):
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, int(timeout)))
        except psycopg.OperationalError as exc:
            if attempt < attempts:
                await asyncio.sleep(0.2 * attempt)
                continue
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DatabaseUnavailable(f"cannot reach the database: {_redact(first_line)}") from None
        await conn.close()
        return


def _redact(text: str) -> str:
    """Connection errors may echo the DSN; never print a password."""
    import re

    return re.sub(r"(password=|://[^:/@\s]+:)[^@\s]+", r"\1***", text)
