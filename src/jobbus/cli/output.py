"""What the operator commands share: opening the App, and rendering.

Human output is rich (tables, colours when stdout is a terminal); ``--json`` output is one JSON
document on stdout with stable keys, ids as strings and timestamps in ISO 8601 (UTC). Messages for
humans that are not the result (warnings, "issued ...") go to stderr, so stdout stays parseable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich import box
from rich.console import Console, JustifyMethod, OverflowMethod
from rich.table import Table
from rich.text import Text

from jobbus.app import App
from jobbus.cli.errors import UsageProblem, probe_database
from jobbus.cli.text import visible
from jobbus.control import StatusReport, WorkerInfo
from jobbus.encryption import placeholder
from jobbus.errors import DatabaseUnavailableError, SchemaError
from jobbus.models import Job, JobStatus
from jobbus.redaction import redact_secrets

F = TypeVar("F", bound=Callable[..., Any])

STATUS_STYLES = {
    "queued": "cyan",
    "running": "yellow",
    "completed": "green",
    "failed": "red",
    "cancelled": "magenta",
    "paused": "yellow",
    "draining": "cyan",
    "stopping": "magenta",
    "stopped": "dim",
    "gone": "red",
}


# -- the App of an operator command ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def admin_app(dsn: str | None, *, check_schema: bool = True, app: App | None = None) -> AsyncIterator[App]:
    """An open App on the given database (--dsn, else JOBBUS_DSN; settings from JOBBUS_*), schema checked;
    `app`, when given, is that App already made (its settings read once).

    No database given → `UsageProblem` (exit 64); unreachable server → `DatabaseUnavailable` (exit 69);
    schema missing or outdated → `SchemaError` (exit 78), before anything is written.
    """
    app = App(dsn=dsn) if app is None else app
    if app.cells:
        async with _cells_app(app, check_schema) as opened:
            yield opened
        return
    if not app.settings.dsn:
        raise UsageProblem("no database: pass --dsn or set JOBBUS_DSN")
    await probe_database(app.settings.dsn)
    for_operators(app)
    async with app:
        if check_schema:
            await app.check_schema()
        yield app


@contextlib.asynccontextmanager
async def _cells_app(app: App, check_schema: bool) -> AsyncIterator[App]:
    """An App with cells (JOBBUS_CELLS), open, for the commands that find a job in its cell (`jobs show`,
    `cancel`, ...) or place one (`schedule`). A cell that cannot be reached is left to the call that needs
    it; a cell without its schema is `SchemaError` naming the cell (exit 78)."""
    for_operators(app)
    async with app:
        if check_schema:
            for name, cell in app.cells.items():
                try:
                    await cell.check_schema()
                except SchemaError as exc:
                    raise SchemaError(f"cell {name}: {exc}") from None
                except (psycopg.OperationalError, psycopg_pool.PoolTimeout, DatabaseUnavailableError):
                    continue
        yield app


def for_operators(app: App) -> None:
    """Every database of `app` (its one DSN, or each cell's) gets sessions without a statement timeout
    (`without_statement_timeout`); not through a pooler in transaction mode, which refuses startup options."""
    if app.settings.transaction_pooling:
        return
    if app.settings.cells:
        app.reconfigure(cells={name: without_statement_timeout(dsn) for name, dsn in app.settings.cells.items()})
    elif app.settings.dsn:
        app.reconfigure(dsn=without_statement_timeout(app.settings.dsn))


def without_statement_timeout(dsn: str) -> str:
    """`dsn` whose sessions start with `statement_timeout = 0`, whatever the role or database sets: an
    operator's count over millions of rows must not fail where a worker's statement would be cut short.
    Options the DSN already gives are kept (a later `-c` wins, so ours goes last)."""
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c statement_timeout=0".strip()
    return make_conninfo("", **params)


# -- consoles ---------------------------------------------------------------------------------------


def console(*, stderr: bool = False) -> Console:
    """A rich console; when not a terminal (pipes, CI) it is wide enough that ids never wrap."""
    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con.width = 200
    return con


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a fitted table; `flexible` columns may be cut short, the others never are."""

    header: str
    #: lower is more important; the highest is left out first when the table is too wide
    rank: int
    justify: JustifyMethod = "left"
    flexible: bool = False
    #: the header of the compact layout, when the full one is long
    short: str | None = None


def fitted_table(
    width: int,
    columns: list[Column],
    rows: list[list[str | Text]],
    *,
    title: str | None = None,
    footer: list[str | Text] | None = None,
) -> Table:
    """A table of `rows` (and a `footer` row below a rule) within `width`, every cell whole.

    When the bordered table is too wide it turns compact (no vertical borders, short headers), then
    leaves out the least important columns (highest rank) until the rest fit: a narrow terminal loses
    a column rather than seeing every column cut to a stub (an id cut short cannot be pasted back)."""
    cells = [[Text(c) if isinstance(c, str) else c for c in row] for row in [*rows, *([footer] if footer else [])]]

    def natural(i: int, compact: bool) -> int:
        header = (columns[i].short or columns[i].header) if compact else columns[i].header
        longest = max([len(header), *(row[i].cell_len for row in cells)])
        return min(longest, 20) if columns[i].flexible else longest

    def needed(indexes: list[int], compact: bool) -> int:
        # border and padding: three characters a column bordered, two compact, and the edges
        return sum(natural(i, compact) for i in indexes) + (2 if compact else 3) * len(indexes) + 2

    kept = sorted(range(len(columns)), key=lambda i: columns[i].rank)
    compact = needed(kept, compact=False) > width
    while len(kept) > 1 and needed(kept, compact) > width:
        kept.pop()
    kept.sort()
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
        collapse_padding=compact,
    )
    for i in kept:
        col = columns[i]
        header = (col.short or col.header) if compact else col.header
        overflow: OverflowMethod = "ellipsis" if col.flexible else "fold"
        table.add_column(header, justify=col.justify, no_wrap=not col.flexible, overflow=overflow)
    for n, row in enumerate(cells):
        if footer and n == len(cells) - 1:
            table.add_section()
        table.add_row(*(row[i] for i in kept))
    return table


def shown(text: str, style: str = "") -> Text:
    """A table cell or line that holds data: never parsed as markup, control characters escaped."""
    return Text(visible(text), style=style)


def styled(value: str) -> Text:
    return Text(value, style=STATUS_STYLES.get(value, ""))


# -- JSON -------------------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    click.echo(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def errors_masked(job: Job) -> Job:
    """The job as the command line prints it: its last error and each attempt's error and traceback
    masked as the dashboard masks them (`redaction.redact_secrets`), also in rows that a release
    before the worker masked them stored in clear."""
    last_error = redact_secrets("last_error", job.last_error)
    return dataclasses.replace(job, last_error=last_error, history=redact_secrets("history", job.history))


def job_dict(job: Job) -> dict[str, Any]:
    """Every column of the job, in table order, then its view (`retrying`, `waiting`, ...), when a queued
    one runs next and what a parked one waits for."""
    values: dict[str, Any] = to_jsonable(job)
    for column in ("configuration_data", "execution_data", "result"):  # sealed with a key not held here
        values[column] = placeholder(getattr(job, column)) or values[column]
    values["steps"] = {name: placeholder(value) or values["steps"][name] for name, value in job.steps.items()}
    values["view"] = job.view
    values["next_run_at"] = iso(job.next_run_at)
    values["waiting_for"] = job.waiting_for
    return values


def worker_dict(worker: WorkerInfo) -> dict[str, Any]:
    return {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "state": worker.display_state,
        "reported_state": worker.state,
        "gone": worker.gone,
        "leader": worker.leader,
        "queues": list(worker.queues) if worker.queues is not None else None,
        "types": list(worker.types),
        "concurrency": worker.concurrency,
        "in_flight": worker.in_flight,
        "done": worker.done,
        "completed": worker.completed,
        "failed": worker.failed,
        "acked_generation": worker.acked_generation,
        "started_at": iso(worker.started_at),
        "last_seen_at": iso(worker.last_seen_at),
        "last_seen_seconds_ago": round(worker.seen_seconds_ago, 3),
        "stopped_at": iso(worker.stopped_at),
    }


STATUS_COUNTS = ("queued", "available", "scheduled", "running", "completed", "failed", "cancelled")
TERMINAL = ("completed", "failed", "cancelled")


def status_dict(report: StatusReport) -> dict[str, Any]:
    """`jobbus status --json`: counts are numbers; a queue (and the totals) whose counts include an
    estimate carries `"estimated": true` and names them in `estimated_counts` (docs/cli.md)."""
    queues = []
    for q in report.queues:
        counts = {name: getattr(q, name) for name in (*STATUS_COUNTS, "completed_last_minute", "failed_last_hour")}
        estimated = [name for name, count in counts.items() if count.estimated]
        queues.append(
            {
                "queue": q.queue,
                "paused": q.paused or report.paused_all,
                **{name: count.value for name, count in counts.items()},
                "total": sum(counts[name].value for name in ("queued", "running", *TERMINAL)),
                "oldest_waiting_seconds": _round(q.oldest_waiting_seconds),
                "estimated": bool(estimated),
                "estimated_counts": estimated,
            }
        )
    keys = (*STATUS_COUNTS, "total", "completed_last_minute", "failed_last_hour")
    totals: dict[str, Any] = {key: sum(q[key] for q in queues) for key in keys}
    waits = [q.oldest_waiting_seconds for q in report.queues if q.oldest_waiting_seconds is not None]
    totals["oldest_waiting_seconds"] = _round(max(waits)) if waits else None
    totals_estimated = sorted({name for q in queues for name in q["estimated_counts"]})
    totals["estimated"] = bool(totals_estimated)
    totals["estimated_counts"] = totals_estimated
    w = report.workers
    return {
        "queues": queues,
        "totals": totals,
        "workers": {
            "live": w.live,
            "gone": w.gone,
            "stopped": w.stopped,
            "running": w.by_state.get("running", 0),
            "paused": w.by_state.get("paused", 0),
            "draining": w.by_state.get("draining", 0),
            "stopping": w.by_state.get("stopping", 0),
            "in_flight": w.in_flight,
            "capacity": w.capacity,
        },
        "paused": {
            "all": report.paused_all,
            "queues": [p.target for p in report.pauses if p.kind == "queue"],
            "workers": [p.target for p in report.pauses if p.kind == "worker"],
        },
        "limits": [
            {
                "queue": q.queue,
                "concurrency": q.concurrency,
                "concurrency_per_key": q.concurrency_per_key,
                "rate_limit": str(q.rate_limit) if q.rate_limit else None,
                "rate_limit_per_key": str(q.rate_limit_per_key) if q.rate_limit_per_key else None,
                "running": report.usage.get(q.queue, (0, None))[0],
                "started_in_window": report.usage.get(q.queue, (0, None))[1],
            }
            for q in report.limits
        ],
        "periodic": [
            {"name": p.name, "enabled": p.enabled, "next_run_at": iso(p.next_run_at), "last_run_at": iso(p.last_run_at)}
            for p in report.periodics
        ],
        "unhandled": [{"queue": u.queue, "type": u.type, "queued": u.queued} for u in report.unhandled],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# -- human formatting -------------------------------------------------------------------------------


def human_seconds(seconds: float | None) -> str:
    """3.2s, 4m 10s, 2h 5m, 3d 4h; '-' for None."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def human_time(value: datetime | None, zone: str | None = None) -> str:
    """The one way the command line shows a moment: `2026-12-02 03:00:00 Europe/Paris`, or
    `2026-12-02 02:00:00Z` in UTC; in `zone` (an IANA name) when given, else in the local time zone
    (`TZ`, else the system's). '-' for None."""
    if value is None:
        return "-"
    tz = _zone(zone) if zone else local_zone()
    moment = value.astimezone(tz)
    key = getattr(tz, "key", None)
    if key in _UTC_NAMES or tz is UTC or (key is None and moment.utcoffset() == timedelta(0)):
        return moment.strftime("%Y-%m-%d %H:%M:%SZ")
    return f"{moment.strftime('%Y-%m-%d %H:%M:%S')} {key or moment.isoformat()[-6:]}"


_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/Universal", "Universal", "Zulu", "Etc/Zulu", "GMT", "Etc/GMT"})


def _zone(name: str) -> tzinfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


@functools.cache
def local_zone() -> tzinfo:
    """The local time zone with its IANA name when it can be known (`TZ`, or where /etc/localtime
    points), else the fixed offset the system reports."""
    candidates = [os.environ.get("TZ", "").removeprefix(":")]
    with contextlib.suppress(OSError):
        target = os.path.realpath("/etc/localtime")
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    for name in candidates:
        if name and not name.startswith("/"):
            with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
                return ZoneInfo(name)
    local = datetime.now().astimezone().tzinfo
    return local if local is not None else UTC


def job_status_text(job: Job) -> Text:
    text = styled(job.view)
    if job.status is JobStatus.RUNNING and job.cancellation_requested_at is not None:
        text.append(" (cancel requested)", style="magenta")
    return text


def progress_text(job: Job) -> str:
    if job.progress_current is None:
        return "-"
    if job.progress_total:
        return (
            f"{job.progress_current:g}/{job.progress_total:g} ({job.progress_current * 100 / job.progress_total:.0f}%)"
        )
    return f"{job.progress_current:g}"


def one_line(text: str | None, limit: int = 80) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
