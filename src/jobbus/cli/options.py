"""The options the commands share (--dsn, --json) and the parameter types that check values before
the database is reached.

Kept apart from `output.py`, which draws tables with rich: `jobbus worker` needs these and none of
that, and every module a worker process imports delays its first job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

import click

from jobbus.cli.errors import UsageProblem
from jobbus.errors import InvalidJobError
from jobbus.requests import MAX_TYPE_BYTES, validate_text
from jobbus.settings import Bounds

F = TypeVar("F", bound=Callable[..., Any])


def dsn_option(func: F) -> F:
    """--dsn; when absent the App reads JOBBUS_DSN (read there, not by click, so that with --app the
    precedence is the flag, then the App's own `dsn`, then the environment)."""
    return click.option("--dsn", metavar="DSN", help="PostgreSQL DSN (default: JOBBUS_DSN).")(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(func)


class FiniteFloatRange(click.FloatRange):
    """A float option within a range; NaN and infinities are refused (click's FloatRange lets NaN pass)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def check_names(option: str, values: Iterable[str], limit: int = MAX_TYPE_BYTES) -> None:
    """Option values that name things stored in the database (queues, types, worker ids): non-empty,
    encodable, within `limit` bytes; anything else is bad usage (exit 64) before the database is reached."""
    try:
        for value in values:
            validate_text(option, value, limit)
    except InvalidJobError as exc:
        raise UsageProblem(str(exc)) from None


def seconds_range(bounds: Bounds) -> FiniteFloatRange:
    """The option type of a duration in seconds that feeds the setting with these bounds."""
    return FiniteFloatRange(min=bounds.low, max=bounds.high, min_open=bounds.low_open, max_open=bounds.high_open)


_PART = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The longest duration accepted: a hundred years is "everything" for jobs, and `now() - interval`
#: stays far inside what PostgreSQL and Python can compute.
MAX_DURATION_DAYS = 36_500


def parse_duration(text: str, option: str) -> timedelta:
    """The value of a DURATION option: `30s`, `15m`, `12h`, `7d`, `2w`, or combined like `1h30m`; `0s` is
    zero; at most 36500d. Anything else is bad usage (exit 64) naming `option`."""
    compact = text.strip().lower().replace(" ", "")
    if not compact or _PART.sub("", compact):
        raise UsageProblem(f"{option} {text!r} is not a duration: write e.g. 30s, 15m, 12h, 7d or 1h30m")
    parts = [(number.lstrip("0") or "0", unit) for number, unit in _PART.findall(compact)]
    # More than 12 digits is too long in any unit, and int() would refuse thousands of them.
    seconds = sum(int(number) * _UNITS[unit] for number, unit in parts if len(number) <= 12)
    if seconds > MAX_DURATION_DAYS * _UNITS["d"] or any(len(number) > 12 for number, _ in parts):
        raise UsageProblem(f"{option} {text!r} is too long: at most {MAX_DURATION_DAYS}d (100 years)")
    return timedelta(seconds=seconds)
