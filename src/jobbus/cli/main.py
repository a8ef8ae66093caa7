"""The `jobbus` command: a thin layer over the library, with the exit codes of SPEC section 6."""

from __future__ import annotations

import sys

import click

from jobbus.cli import exit_codes
from jobbus.cli.bench import bench_command
from jobbus.cli.control import drain_command, pause_command, restart_command, resume_command, stop_command
from jobbus.cli.dashboard import dashboard_command
from jobbus.cli.demo import demo_command
from jobbus.cli.errors import fail, internal_error, usage_error
from jobbus.cli.jobs import jobs_group
from jobbus.cli.periodic import periodic_group
from jobbus.cli.prune import prune_command
from jobbus.cli.queues import queue_group
from jobbus.cli.schedule import schedule_command
from jobbus.cli.schema import migrate_command, schema_command
from jobbus.cli.status import status_command
from jobbus.cli.worker import worker_command
from jobbus.cli.workers import workers_command

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="jobbus")
def cli() -> None:
    """jobbus: durable background jobs on PostgreSQL.

    Every command takes --dsn or reads JOBBUS_DSN. Exit codes: 0 ok, 1 refused, 64 bad usage,
    69 database unreachable, 70 internal error, 75 restart requested, 78 configuration error.
    """


for command in (
    worker_command,
    schema_command,
    migrate_command,
    status_command,
    workers_command,
    pause_command,
    resume_command,
    drain_command,
    stop_command,
    restart_command,
    jobs_group,
    periodic_group,
    queue_group,
    schedule_command,
    prune_command,
    demo_command,
    bench_command,
    dashboard_command,
):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: a usage error is one `error: ...` line and exit 64 (EX_USAGE), not click's
    three lines and exit 2; `jobbus` alone prints the help."""
    try:
        result = cli.main(args=argv, prog_name="jobbus", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(exit_codes.USAGE)
    except click.UsageError as exc:
        sys.exit(usage_error(exc))
    except click.exceptions.Abort:
        sys.exit(fail("aborted", exit_codes.FAILURE))
    except click.ClickException as exc:
        sys.exit(fail(exc.format_message(), exit_codes.USAGE))
    except Exception:  # outside a command's run(): still one error line, no password
        sys.exit(internal_error())
    sys.exit(result if isinstance(result, int) else exit_codes.OK)
