"""`jobbus audit`: the audit trail, newest first."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import click

from jobbus.audit import AuditEntry
from jobbus.cli import exit_codes
from jobbus.cli.errors import UsageProblem, run
from jobbus.cli.options import dsn_option, json_option, parse_duration
from jobbus.cli.output import admin_app, human_time
from jobbus.cli.text import visible

#: Entries read per round trip (one keyset page) however many are printed.
PAGE = 1000


@click.command("audit")
@click.option(
    "--since",
    "since_text",
    metavar="WHEN",
    help="Only entries from WHEN on: a duration ago (7d, 12h) or an ISO 8601 time.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="Print at most N entries (0: every entry).",
)
@json_option
@dsn_option
def audit_command(since_text: str | None, limit: int, as_json: bool, dsn: str | None) -> None:
    """List the audit trail newest first: when, who (actor and source), what action, on what target.

    \b
    Every operator action of the command line, the dashboard and the Python API is recorded in the
    transaction of the action (docs/security.md, "Audit trail"). --json prints one JSON array of
    objects with id, at, actor, source, action, target and details.

    \b
    Examples:
      jobbus audit --since 1d
      jobbus audit --since 2026-05-01T00:00:00Z --limit 0 --json | jq '.[] | select(.source == "dashboard")'

    Exit codes: 0 ok, 64 bad usage, 69 database unreachable, 78 schema missing.
    """
    since = parse_since(since_text) if since_text is not None else None

    async def body() -> int:
        async with admin_app(dsn) as app:
            printed, last = 0, None
            if as_json:
                click.echo("[", nl=False)
            while limit == 0 or printed < limit:
                want = PAGE if limit == 0 else min(PAGE, limit - printed)
                page = await app.list_audit(since=since, after=last, limit=want)
                for entry in page:
                    if as_json:
                        click.echo(
                            ("," if printed else "") + "\n  " + json.dumps(entry.as_dict(), ensure_ascii=False),
                            nl=False,
                        )
                    else:
                        click.echo(line(entry))
                    printed += 1
                if len(page) < want:
                    break
                last = page[-1]
            if as_json:
                click.echo("\n]" if printed else "]")
            elif not printed:
                click.echo("no audit entries" + (" since then" if since else ""))
        return exit_codes.OK

    sys.exit(run(body))


def parse_since(text: str) -> datetime:
    """--since: a duration before now (`7d`, `1h30m`) or an aware ISO 8601 time."""
    try:
        return datetime.now(UTC) - parse_duration(text, "--since")
    except UsageProblem:
        pass
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageProblem(f"--since {text!r} is neither a duration (7d, 12h) nor an ISO 8601 time") from None
    if value.utcoffset() is None:
        raise UsageProblem(f"--since {text!r} has no timezone: add an offset or Z")
    return value


def line(entry: AuditEntry) -> str:
    """One entry on one line; text from the database with its control characters escaped."""
    details = json.dumps(dict(entry.details), ensure_ascii=False, separators=(", ", ": ")) if entry.details else ""
    fields = (human_time(entry.at), f"{entry.actor} ({entry.source})", entry.action, entry.target, details)
    return "  ".join(visible(field) for field in fields if field)
