"""The `jobbus` command: a thin layer over the library, with the exit codes of SPEC section 6."""

from __future__ import annotations

import importlib
import sys

import click

from jobbus.audit import acting_as, operating_system_user
from jobbus.cli import exit_codes
from jobbus.cli.errors import fail, internal_error, usage_error
from jobbus.cli.suggest import SuggestingGroup, closest

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}

#: Each command and where it lives: a command's module is imported only when that command runs (or the
#: help lists them all), so `jobbus worker` starts without the tables, the dashboard or the demo.
COMMANDS = {
    "worker": "jobbus.cli.worker:worker_command",
    "schema": "jobbus.cli.schema:schema_command",
    "migrate": "jobbus.cli.schema:migrate_command",
    "status": "jobbus.cli.status:status_command",
    "workers": "jobbus.cli.workers:workers_command",
    "doctor": "jobbus.cli.doctor:doctor_command",
    "audit": "jobbus.cli.audit:audit_command",
    "pause": "jobbus.cli.control:pause_command",
    "resume": "jobbus.cli.control:resume_command",
    "drain": "jobbus.cli.control:drain_command",
    "stop": "jobbus.cli.control:stop_command",
    "restart": "jobbus.cli.control:restart_command",
    "jobs": "jobbus.cli.jobs:jobs_group",
    "keys": "jobbus.cli.keys:keys_group",
    "periodic": "jobbus.cli.periodic:periodic_group",
    "queue": "jobbus.cli.queues:queue_group",
    "schedule": "jobbus.cli.schedule:schedule_command",
    "prune": "jobbus.cli.prune:prune_command",
    "search-index": "jobbus.cli.search:search_index_group",
    "demo": "jobbus.cli.demo:demo_command",
    "bench": "jobbus.cli.bench:bench_command",
    "dashboard": "jobbus.cli.dashboard:dashboard_command",
}


class LazyGroup(SuggestingGroup):
    """A group whose commands are imported when asked for by name (click's lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attribute = where.split(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def suggestions(self, ctx: click.Context, name: str) -> list[str]:
        """`jobbus retry` means `jobbus jobs retry` (a command of a group, given without its group);
        `jobbus wroker` means `jobbus worker` (the commands, and those of the groups, spelt most like it)."""
        paths: dict[str, list[str]] = {}
        for top in self.list_commands(ctx):
            paths.setdefault(top, []).append(top)
            if isinstance(command := self.get_command(ctx, top), click.Group):
                for sub in command.list_commands(ctx):
                    paths.setdefault(sub, []).append(f"{top} {sub}")
        meant = paths[name] if name in paths else [path for match in closest(name, paths) for path in paths[match]]
        return [f"{ctx.command_path} {command}" for command in meant]


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(package_name="jobbus")
def cli() -> None:
    """jobbus: durable background jobs on PostgreSQL.

    Every command takes --dsn or reads JOBBUS_DSN. Exit codes: 0 ok, 1 refused, 64 bad usage,
    69 database unreachable, 70 internal error, 75 restart requested, 78 configuration error.
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point: a usage error is one `error: ...` line and exit 64 (EX_USAGE), not click's
    three lines and exit 2; `jobbus` alone prints the help. The audit trail names the operating-system
    user as the actor of the command's actions."""
    try:
        with acting_as(operating_system_user(), source="cli"):
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
