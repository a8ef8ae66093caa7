"""`jobbus doctor`: one line per finding about the database and the fleet, with what to do."""

from __future__ import annotations

import sys

import click

from jobbus import doctor
from jobbus.cli import exit_codes
from jobbus.cli.errors import run
from jobbus.cli.options import dsn_option, json_option
from jobbus.cli.output import admin_app, print_json
from jobbus.cli.text import visible

COLOURS = {"ok": "green", "warning": "yellow", "error": "red"}


@click.command("doctor")
@json_option
@dsn_option
def doctor_command(as_json: bool, dsn: str | None) -> None:
    """Check the database and the workers on it; print one line per finding with what to do.

    \b
    Checks: the server's version, pending migrations, the replication mode (an asynchronous
    standby can lose acknowledged work in a failover), max_connections against the live workers'
    pools, autovacuum on the job table, each live worker's clock against the database's, and
    sessions idle in a transaction for longer than the lease (lease_seconds).

    \b
    Examples:
      jobbus doctor
      jobbus doctor --json | jq '.[] | select(.level != "ok")'

    Exit codes: 0 nothing to fix, 1 a warning or an error found, 64 bad usage, 69 database unreachable.
    """

    async def body() -> int:
        async with admin_app(dsn, check_schema=False) as app:
            findings = await doctor.examine(app)
        if as_json:
            print_json([finding.as_dict() for finding in findings])
        else:
            width = max(len(f.check) for f in findings)
            for finding in findings:
                level = click.style(f"{finding.level:<7}", fg=COLOURS[finding.level], bold=finding.level != "ok")
                click.echo(f"{level} {finding.check:<{width}}  {visible(finding.message)}")
            counts = doctor.summary(findings)
            click.echo(f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['error']} error(s)")
        clean = all(finding.level == "ok" for finding in findings)
        return exit_codes.OK if clean else exit_codes.FAILURE

    sys.exit(run(body))
