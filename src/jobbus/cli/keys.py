"""`jobbus keys`: make encryption keys and re-encrypt stored payloads with the newest (SPEC 22)."""

from __future__ import annotations

import sys

import click

from jobbus.cli import exit_codes
from jobbus.cli.errors import run
from jobbus.cli.options import dsn_option, json_option
from jobbus.cli.output import admin_app, print_json
from jobbus.encryption import generate_key
from jobbus.rotation import RotationProgress, rotate_keys


@click.group("keys")
def keys_group() -> None:
    """Encryption keys of payloads at rest (JOBBUS_ENCRYPTION_KEYS, newest first).

    \b
    Examples:
      jobbus keys generate
      JOBBUS_ENCRYPTION_KEYS="$NEW,$OLD" jobbus keys rotate
    """


@keys_group.command("generate")
def generate_command() -> None:
    """Print a new key: url-safe base64 of 32 random bytes.

    Put it first in JOBBUS_ENCRYPTION_KEYS (or App(encryption_keys=[...])) of every producer and worker,
    keeping the older keys after it until `jobbus keys rotate` has run. Keep it secret: whoever holds it
    reads every payload it seals.
    """
    click.echo(generate_key())


@keys_group.command("rotate")
@click.option(
    "--batch-size", type=click.IntRange(1, 10_000), default=500, show_default=True, help="Rows read and written a page."
)
@json_option
@dsn_option
def rotate_command(batch_size: int, as_json: bool, dsn: str | None) -> None:
    """Re-encrypt every stored payload with the newest key, online, in batches.

    Configurations, checkpoints, results and step results of every job, follow-ups and group callbacks
    not scheduled yet, and the children kept for `wait_for_children`, are re-encrypted with the first key
    of JOBBUS_ENCRYPTION_KEYS (those stored in clear are encrypted). Workers keep running: a value one of
    them writes meanwhile is kept. Killed, it loses nothing; run it again to go on. Progress goes to
    stderr. Payloads sealed with a key that is not listed are left as they are and reported.

    Exit codes: 0 every payload under the newest key, 1 some left (a key not listed, or unreadable),
    69 database unreachable, 78 no keys configured or schema missing.
    """

    def shown(step: RotationProgress) -> None:
        if not as_json:
            click.echo(
                f"{step.table}: {step.read} read, {step.rewritten} re-encrypted"
                + (f" (jobs to do at the start: {step.jobs_at_start})" if step.table == "jobs" else ""),
                err=True,
            )

    async def body() -> int:
        async with admin_app(dsn) as app:
            if app.registry.keyring is None:
                raise ValueError("no encryption_keys to rotate to: set JOBBUS_ENCRYPTION_KEYS (newest first)")
            report = await rotate_keys(app, batch_size=batch_size, progress=shown)
        if as_json:
            print_json(
                {
                    "key_id": report.key_id,
                    "rewritten": dict(report.rewritten),
                    "passes": report.passes,
                    "missing_keys": dict(report.missing),
                    "unreadable": report.unreadable,
                    "complete": report.complete,
                }
            )
        else:
            total = sum(report.rewritten.values())
            click.echo(f"re-encrypted {total} row(s) with key {report.key_id} in {report.passes} pass(es)")
            for key_id, count in sorted(report.missing.items()):
                click.echo(f"left {count} row(s) encrypted with key {key_id}, which is not listed", err=True)
            if report.unreadable:
                click.echo(f"left {report.unreadable} row(s) that no listed key opens", err=True)
        return exit_codes.OK if report.complete else exit_codes.FAILURE

    sys.exit(run(body))
