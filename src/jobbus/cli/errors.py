"""Turning what went wrong into one clear line on stderr and the exit code SPEC section 6 fixes.

Everything printed here passes through `redact` (no password of a DSN ever reaches the output, not
even inside a traceback) and `visible` (no control sequence from data reaches the terminal).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
import psycopg
import psycopg_pool

from jobbus.cli import exit_codes
from jobbus.cli.loading import AppLoadError
from jobbus.cli.text import visible
from jobbus.encryption import EncryptionUnavailableError
from jobbus.errors import (
    CellRequiredError,
    DatabaseUnavailableError,
    InvalidJobError,
    InvalidStateError,
    MigrationLockError,
    SchemaError,
    TransactionPoolerError,
)
from jobbus.settings import redact
from jobbus.worker import WorkerIdInUseError
from jobbus.worker.health import HealthServerError

T = TypeVar("T")


class DatabaseUnavailable(Exception):
    """The database could not be reached when the command started."""


class BadDsn(Exception):
    """The DSN itself cannot be used (a malformed connection string): a configuration error."""


class PortInUse(Exception):
    """A server command cannot listen where it was told to (the port is taken): exit 69."""


class UsageProblem(click.UsageError):
    """Bad input found after parsing (invalid JSON, a bad duration): exit 64."""


def fail(message: str, code: int) -> int:
    click.secho(f"error: {visible(redact(message))}", fg="red", err=True)
    return code


def usage_error(exc: click.UsageError) -> int:
    """One line, `error: <what> (see jobbus COMMAND --help)`, and exit 64."""
    message = " ".join(line.strip() for line in exc.format_message().splitlines() if line.strip())
    if exc.ctx is not None:
        message += f" (see {exc.ctx.command_path} --help)"
    return fail(message, exit_codes.USAGE)


def print_traceback() -> None:
    """The current exception's traceback on stderr, with passwords redacted."""
    sys.stderr.write(redact(traceback.format_exc()))
    sys.stderr.flush()


def internal_error() -> int:
    """A bug (ours or in the user's code): its traceback, then the error line; exit 70."""
    logging.getLogger("jobbus.cli").debug("internal error", exc_info=True)
    print_traceback()
    return fail("internal error (traceback above)", exit_codes.SOFTWARE)


def run(coroutine_factory: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run an async command body; map known failures to exit codes."""
    try:
        return asyncio.run(coroutine_factory())
    except click.UsageError:
        raise
    except (AppLoadError, BadDsn, SchemaError, TransactionPoolerError, WorkerIdInUseError) as exc:
        return fail(str(exc), exit_codes.CONFIG)
    except (DatabaseUnavailable, DatabaseUnavailableError, PortInUse, HealthServerError) as exc:
        return fail(str(exc), exit_codes.UNAVAILABLE)
    except MigrationLockError as exc:
        return fail(str(exc), exit_codes.LOCKED)
    except InvalidStateError as exc:
        return fail(str(exc), exit_codes.FAILURE)
    except InvalidJobError as exc:
        return fail(str(exc), exit_codes.USAGE)
    except CellRequiredError:
        return fail(
            "this command acts on one database and JOBBUS_CELLS names several: give the database of one cell "
            "with --dsn (or JOBBUS_DSN without JOBBUS_CELLS)",
            exit_codes.USAGE,
        )
    except EncryptionUnavailableError as exc:
        return fail(str(exc), exit_codes.CONFIG)
    except ImportError:  # raised inside the --app module: the user's bug, so its traceback helps
        print_traceback()
        return fail("could not import the --app module (traceback above)", exit_codes.CONFIG)
    except ValueError as exc:  # settings and options validated by the library
        return fail(str(exc), exit_codes.CONFIG)
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
        return fail(f"database error: {exc}", exit_codes.UNAVAILABLE)
    except KeyboardInterrupt:
        return fail("interrupted", exit_codes.SOFTWARE)
    except Exception:
        return internal_error()


async def probe_database(dsn: str, timeout: float = 10.0, attempts: int = 3) -> None:
    """Fail fast with exit 69 when the server cannot be reached at start (after a few quick tries, so
    one dropped connection is not mistaken for an unreachable server); exit 78 for a malformed DSN."""
    for attempt in range(1, attempts + 1):
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, int(timeout)))
        except psycopg.OperationalError as exc:
            if attempt < attempts:
                await asyncio.sleep(0.2 * attempt)
                continue
            raise DatabaseUnavailable(f"cannot reach the database: {first_line(exc)}") from None
        except psycopg.ProgrammingError as exc:  # libpq refused the connection string itself
            raise BadDsn(f"the database DSN is not valid: {first_line(exc)}") from None
        await conn.close()
        return


def first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__
