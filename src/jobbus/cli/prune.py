"""`jobbus prune`: delete finished jobs older than a duration."""

from __future__ import annotations

import sys

import click

from jobbus import control
from jobbus.cli import exit_codes
from jobbus.cli.errors import run
from jobbus.cli.options import dsn_option, json_option, parse_duration
from jobbus.cli.output import admin_app, console, print_json, shown

FINISHED = ("completed", "failed", "cancelled")


@click.command("prune")
@click.option("--older-than", "older_than", required=True, metavar="DURATION", help="e.g. 30s, 15m, 12h, 7d.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(FINISHED),
    help="Which finished statuses to delete (repeatable; default completed and cancelled).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted, delete nothing.")
@json_option
@dsn_option
def prune_command(older_than: str, statuses: tuple[str, ...], dry_run: bool, as_json: bool, dsn: str | None) -> None:
    """Delete finished jobs that finished more than DURATION ago, in batches.

    By default completed and cancelled jobs go; failed jobs stay until you name them, so their errors
    can be read and retried. `--older-than 0s` deletes every matching job that finished before now.
    Deleting runs in batches of 10,000 rows, so it never holds locks for long; run it from cron or a
    scheduled job.

    \b
    Examples:
      jobbus prune --older-than 7d
      jobbus prune --older-than 30d --status failed
      jobbus prune --older-than 12h --status completed --status cancelled --dry-run

    Exit codes: 0 ok, 64 bad usage (a bad duration), 69 database unreachable, 78 schema missing.
    """
    age = parse_duration(older_than, "--older-than")
    chosen = statuses or ("completed", "cancelled")

    async def body() -> int:
        con = console(stderr=True)
        async with admin_app(dsn) as app:
            if dry_run:
                count = await control.count_prunable(app, age, chosen)
            else:
                with con.status(shown(f"pruning {', '.join(chosen)} jobs finished more than {older_than} ago…")):
                    count = await app.prune(age, chosen)
        if as_json:
            print_json(
                {
                    "deleted": 0 if dry_run else count,
                    "matched": count,
                    "dry_run": dry_run,
                    "statuses": list(chosen),
                    "older_than_seconds": age.total_seconds(),
                }
            )
        else:
            verb = "would delete" if dry_run else "deleted"
            click.echo(f"{verb} {count} job(s) ({', '.join(chosen)}) finished more than {older_than} ago")
        return exit_codes.OK

    sys.exit(run(body))
