"""`jobbus schedule`: enqueue one job from the shell (no --app needed)."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime, timedelta
from typing import Any

import click

from jobbus import control
from jobbus.app import App
from jobbus.cli import exit_codes
from jobbus.cli.errors import UsageProblem, probe_database, run
from jobbus.cli.loading import open_app
from jobbus.cli.options import dsn_option, parse_duration
from jobbus.cli.output import admin_app
from jobbus.cli.suggest import closest
from jobbus.cli.text import visible
from jobbus.durations import resolve_available_at
from jobbus.errors import InvalidJobError
from jobbus.models import JobStatus
from jobbus.requests import (
    INT32_MAX,
    INT32_MIN,
    MAX_JSON_DEPTH,
    JobDefaults,
    JobOptions,
    JobRequest,
    build_spec,
)

#: How many of its types a warning lists when none is spelt like the one scheduled.
TYPES_LISTED = 5


def parse_when(text: str, option: str = "--at") -> datetime:
    """An aware ISO 8601 timestamp within the range jobs accept; a naive one is refused (whose local
    time would it be?)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageProblem(f"{option} {text!r} is not an ISO 8601 timestamp, e.g. 2026-05-01T09:00:00+02:00") from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise UsageProblem(
            f"{option} {text!r} has no timezone: add an offset or Z, e.g. {value.isoformat()}+00:00 or {text}Z"
        )
    try:
        resolve_available_at(value, option)
    except InvalidJobError as exc:
        raise UsageProblem(str(exc)) from None
    return value


def parse_expires(text: str) -> float | datetime:
    """--expires: seconds from now (a number), or an ISO 8601 timestamp with a timezone."""
    try:
        return float(text)
    except ValueError:
        return parse_when(text, "--expires")


def parse_config(text: str | None) -> dict[str, Any]:
    """The --config JSON object; `-` reads it from stdin. Not JSON, too deep, or not an object: exit 64."""
    if text is None:
        return {}
    if text == "-":
        text = sys.stdin.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageProblem(f"--config is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageProblem(f"--config is nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None
    if not isinstance(value, dict):
        raise UsageProblem(f"--config must be a JSON object like '{{\"id\": 42}}', got {type(value).__name__}")
    return value


@click.command("schedule")
@click.argument("job_type", metavar="TYPE")
@click.option("--config", "config_json", metavar="JSON", help="The job's configuration, a JSON object ('-' = stdin).")
@click.option("--queue", metavar="Q", help="Queue (default: the handler's with --app, else 'default').")
@click.option("--unique-key", metavar="K", help="Deduplicate: while a job of TYPE with K is active, print its id.")
@click.option("--at", "at_text", metavar="ISO8601", help="Run no earlier than this (with a timezone offset).")
@click.option("--in", "in_text", metavar="DURATION", help="Run no earlier than this long from now: 30s, 15m, 1h, 2d.")
@click.option(
    "--priority",
    type=click.IntRange(INT32_MIN, INT32_MAX),
    metavar="N",
    help="Higher runs first within its queue (default 0).",
)
@click.option(
    "--max-attempts", type=click.IntRange(1, INT32_MAX), metavar="N", help="Attempts before the job fails (default 3)."
)
@click.option(
    "--expires",
    "expires_text",
    metavar="SECONDS|ISO8601",
    help="Cancel the job instead if it has not started by then: seconds from now, or a timestamp with an offset.",
)
@click.option("--name", metavar="NAME", help="A label for humans.")
@click.option("--group-id", metavar="UUID", help="Group the job with others (see group progress).")
@click.option("--tag", "tags", multiple=True, metavar="TAG", help="A tag to find the job by (repeatable, at most 16).")
@click.option(
    "--weight", type=click.IntRange(1, 1_000_000), metavar="N", help="What it counts against its queue's limits (1)."
)
@click.option(
    "--unique-for",
    "unique_for_text",
    metavar="DURATION",
    help="With --unique-key: a job of the key scheduled less than this long ago answers the call.",
)
@click.option(
    "--debounce",
    "debounce_text",
    metavar="DURATION",
    help="With --unique-key: a queued job of the key takes this call's configuration and starts this long from now.",
)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE:ATTR",
    help="Optional: take queue/priority defaults from its handler, and its database unless --dsn is given.",
)
@dsn_option
def schedule_command(
    job_type: str,
    config_json: str | None,
    queue: str | None,
    unique_key: str | None,
    at_text: str | None,
    in_text: str | None,
    priority: int | None,
    max_attempts: int | None,
    expires_text: str | None,
    name: str | None,
    group_id: str | None,
    tags: tuple[str, ...],
    weight: int | None,
    unique_for_text: str | None,
    debounce_text: str | None,
    app_spec: str | None,
    dsn: str | None,
) -> None:
    """Enqueue one job of TYPE and print its id.

    No --app is needed: a producer may schedule types that no handler in its process knows (a worker
    with a handler for TYPE runs it). With --unique-key, scheduling again while the first job is
    queued or running prints the id of that job instead of adding one.

    \b
    Examples:
      jobbus schedule report.render --config '{"report_id": 42}'
      jobbus schedule catalog.reindex --config '{"catalog_id": "summer"}' --queue catalog \\
          --unique-key catalog:summer --at 2026-05-01T02:00:00Z
      jobbus schedule digest.send --config '{"user_id": 7}' --expires 3600
      jobbus schedule invoice.remind --config '{"invoice": 1042}' --in 2d
      jobbus schedule report.render --config '{"report_id": 7}' --tag tenant:42 --tag nightly
      echo '{"to": "a@example.com"}' | jobbus schedule email.send --config -

    With --app, a TYPE that the App has no handler for is scheduled all the same, with a warning on
    stderr naming the types it handles that are spelt most like TYPE.

    Exit codes: 0 scheduled, 64 bad usage (invalid JSON, a config that is not an object, a naive
    --at or --expires, --at with --in, a bad --in duration, a value out of range, an --expires that
    is neither seconds nor a timestamp), 69 database unreachable, 78 schema missing or bad --app.
    """
    configuration = parse_config(config_json)
    if at_text is not None and in_text is not None:
        raise UsageProblem("--at and --in exclude each other: give a time with --at or a delay with --in")
    available_at: datetime | timedelta | None = None
    if at_text:
        available_at = parse_when(at_text)
    elif in_text is not None:
        available_at = parse_duration(in_text, "--in")
    try:
        group = uuid.UUID(group_id) if group_id else None
    except ValueError:
        raise UsageProblem(f"--group-id {group_id!r} is not a UUID") from None
    options: JobOptions = {
        "queue": queue,
        "unique_key": unique_key,
        "available_at": available_at,
        "priority": priority,
        "max_attempts": max_attempts,
        "name": name,
        "group_id": group,
        "expires": parse_expires(expires_text) if expires_text else None,
        "tags": list(tags) or None,
        "weight": weight,
        "unique_for": parse_duration(unique_for_text, "--unique-for") if unique_for_text else None,
        "debounce": parse_duration(debounce_text, "--debounce") if debounce_text else None,
    }
    try:  # everything the library would refuse (a configuration it cannot store too) before the database
        build_spec(JobRequest(job_type, configuration, **options), JobDefaults(), default_max_attempts=1)
    except InvalidJobError as exc:
        raise UsageProblem(str(exc)) from None

    async def schedule(app: App) -> int:
        job_id = await app.schedule(job_type, configuration, **options)
        click.echo(str(job_id))
        if app_spec is not None:
            _warn_if_unhandled(app, app_spec, job_type)
        if queue is None:
            await _warn_if_elsewhere(app, job_id, job_type)
        return exit_codes.OK

    async def body() -> int:
        if app_spec is None:
            async with admin_app(dsn) as app:
                return await schedule(app)
        async with open_app(app_spec, dsn) as app:
            await probe_database(app.dsn)
            async with app:
                await app.check_schema()
                return await schedule(app)

    sys.exit(run(body))


def _warn_if_unhandled(app: App, app_spec: str, job_type: str) -> None:
    """With --app: when its App has handlers but none for TYPE (a typo?), say so on stderr and name the
    types spelt most like it. The job is scheduled all the same: another process may handle TYPE."""
    known = sorted(app.handlers)
    if not known or job_type in app.handlers:
        return  # an App without handlers is a producer's: it knows no types to compare with
    near = closest(job_type, known)
    if near:
        found = f"closest: {', '.join(near)}"
    else:
        more = len(known) - TYPES_LISTED
        found = f"no close match; it handles {', '.join(known[:TYPES_LISTED])}{f' and {more} more' if more > 0 else ''}"
    warn(f"warning: the app {app_spec} has no handler for {job_type} ({found}); scheduled anyway")


async def _warn_if_elsewhere(app: App, job_id: uuid.UUID, job_type: str) -> None:
    """Without --queue: when live workers handle the type only in other queues than the one the job
    landed in, say so (on stderr), so that a job does not wait where nobody looks."""
    workers = [w for w in await control.list_workers(app) if w.live and job_type in w.types]
    job = await app.find(job_id)
    if not workers or job is None or job.status is not JobStatus.QUEUED:
        return
    if any(w.queues is None or job.queue in w.queues for w in workers):
        return
    elsewhere = sorted({q for w in workers for q in w.queues or ()})
    message = (
        f"warning: job {job_id} is in queue {job.queue}, but the live workers that handle {job_type} serve "
        f"queue {', '.join(elsewhere)} only: it waits until a worker serves {job.queue} "
        f"(pass --queue {elsewhere[0]} to schedule it there)"
    )
    warn(message)


def warn(message: str) -> None:
    """One warning line on stderr (stdout holds the job's id alone)."""
    click.secho(visible(message), fg="yellow", err=True)
