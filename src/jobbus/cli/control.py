"""`jobbus pause|resume|drain|stop|restart`: steer workers through the database."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from jobbus import control
from jobbus.app import App
from jobbus.cli import exit_codes
from jobbus.cli.cells import CellTarget, admin_cells, cell_option, reachable, report_unreachable
from jobbus.cli.errors import UsageProblem, fail, run
from jobbus.cli.options import dsn_option, json_option
from jobbus.cli.output import print_json

_SHORT: dict[control.Action, str] = {
    "pause": "Stop claiming on a target; durable until resume.",
    "resume": "Lift a pause of the same target.",
    "drain": "Run until no job is available, then exit 0.",
    "stop": "Finish in-flight jobs, then exit 0.",
    "restart": "Finish in-flight jobs, then exit 75 to be restarted.",
}
_HELP: dict[control.Action, tuple[str, str]] = {
    "pause": (
        "Stop claiming on the target; workers stay alive and finish the jobs they hold.",
        "The pause is durable: it holds until `jobbus resume` of the same target, and a worker started\n"
        "later under a paused target starts paused. Pausing a queue stops claiming from that queue only;\n"
        "workers keep serving their other queues.",
    ),
    "resume": (
        "Lift a pause of the same target.",
        "`resume --all` lifts `pause --all` only; a queue or worker paused by name stays paused until it\n"
        "is resumed by name (`jobbus status` lists what is paused).",
    ),
    "drain": (
        "Targeted workers run until no job is available for them, then exit 0.",
        "One-shot: it applies to the worker processes running now (also to one cut off from the database,\n"
        "when it is back), not to workers started later.",
    ),
    "stop": (
        "Targeted workers stop claiming, finish their in-flight jobs and exit 0.",
        "One-shot: it applies to the worker processes running now. In-flight jobs get the worker's\n"
        "--shutdown-timeout, like on SIGTERM. A supervisor that restarts on any exit will start them again.",
    ),
    "restart": (
        "Targeted workers finish their in-flight jobs and exit 75 so their supervisor restarts them.",
        "One-shot: it applies to the worker processes running now. Configure the supervisor to restart on\n"
        "exit 75 "
        "(systemd Restart=on-failure, Kubernetes restartPolicy Always; see docs/operations.md).",
    ),
}


def _control_command(action: control.Action) -> click.Command:
    summary, details = _HELP[action]

    @click.command(action)
    @click.option("--worker-id", metavar="ID", help="Target one worker by id (see `jobbus workers`).")
    @click.option("--queue", metavar="Q", help="Target the workers serving queue Q (and workers serving all queues).")
    @click.option("--all", "all_workers", is_flag=True, help="Target every worker.")
    @click.option("--wait", is_flag=True, help="Wait until every targeted worker acknowledged the command.")
    @click.option(
        "--timeout",
        type=click.FloatRange(min=0),
        default=30.0,
        show_default=True,
        metavar="S",
        help="With --wait: give up after S seconds, exit 1 and name the workers that did not acknowledge.",
    )
    @json_option
    @cell_option
    @dsn_option
    def command(
        worker_id: str | None,
        queue: str | None,
        all_workers: bool,
        wait: bool,
        timeout: float,
        as_json: bool,
        cells: tuple[str, ...],
        dsn: str | None,
    ) -> None:
        try:
            target = control.Target.of(worker_id=worker_id, queue=queue, all=all_workers)
        except ValueError:
            raise UsageProblem(f"{action} needs exactly one target: --worker-id ID, --queue Q or --all") from None

        async def issue(app: App) -> tuple[control.CommandIssued, control.AckReport | None]:
            issued = await control.issue(app, action, target)
            return issued, await control.wait_for_acks(app, issued, timeout) if wait else None

        async def body() -> int:
            async with admin_cells(dsn, cells) as targets:
                open_targets = reachable(targets)
                results = await asyncio.gather(*(issue(app) for _, app in open_targets))
            done = [(where, issued, report) for (where, _), (issued, report) in zip(open_targets, results, strict=True)]
            if as_json:
                entries = [where.tagged(_issued_dict(issued, report)) for where, issued, report in done]
                print_json(entries[0] if targets[0].name is None else entries)
            codes = [_report(where, issued, report, timeout, as_json) for where, issued, report in done]
            return report_unreachable(targets) or max(codes, default=exit_codes.OK)

        sys.exit(run(body))

    command.help = (
        f"{summary}\n\n{details}\n\nExactly one target: --worker-id ID, --queue Q or --all. With --wait the\n"
        "command returns once every targeted worker applied it (or stopped), at most --timeout seconds.\n\n"
        "\b\nExamples:\n"
        f"  jobbus {action} --queue emails\n"
        f"  jobbus {action} --all --wait --timeout 60\n"
        f"  jobbus {action} --worker-id worker-7f9c --wait\n\n"
        "With cells (JOBBUS_CELLS) it acts in every cell, or in those given with --cell; --json prints one\n"
        "object per cell, each with its `cell`.\n\n"
        "Exit codes: 0 issued (and acknowledged with --wait), 1 --wait timed out, 64 bad usage (no target or\n"
        "several), 69 database (or a cell's) unreachable, 78 schema missing."
    )
    command.short_help = _SHORT[action]
    return command


def _report(
    where: CellTarget, issued: control.CommandIssued, report: control.AckReport | None, timeout: float, as_json: bool
) -> int:
    code = exit_codes.OK if report is None or report.complete else exit_codes.FAILURE
    if not as_json:
        if where.name is not None:
            click.echo(f"cell {where.name}:")
        _echo_human(issued, report)
    if report is not None and not report.complete:
        parts = []
        if report.missing:
            parts.append(
                f"{', '.join(report.missing)} (alive: check their logs, or whether they are stuck in a long job)"
            )
        if report.unreachable:
            parts.append(
                f"{', '.join(report.unreachable)} (not reached: silent, or restarted under the same id before "
                "applying it; a silent worker applies it when it is back)"
            )
        within = "" if where.name is None else f" in cell {where.name}"
        return fail(f"{issued.action} not acknowledged{within} within {timeout:g} s by: {'; '.join(parts)}", code)
    return code


def _echo_human(issued: control.CommandIssued, report: control.AckReport | None) -> None:
    echo = click.echo
    target = issued.target
    if issued.action == "pause":
        state = "paused" if issued.state_changed else "was already paused"
        echo(f"{target} {state} (generation {issued.generation}); durable until `jobbus resume`")
    elif issued.action == "resume":
        state = "resumed" if issued.state_changed else "was not paused by this target; nothing to lift"
        echo(f"{target} {state} (generation {issued.generation})")
    else:
        echo(f"{issued.action} issued to {target} (generation {issued.generation})")
    if issued.worker_ids:
        echo(f"addressed to {len(issued.worker_ids)} worker(s): {', '.join(issued.worker_ids)}")
    elif issued.action in ("pause", "resume"):
        echo("no running worker is targeted now; workers started later will follow the pause state")
    else:
        echo("no running worker is targeted: nothing to do (one-shot commands apply to running workers only)")
    if report is not None:
        if report.acknowledged:
            echo(f"acknowledged by: {', '.join(report.acknowledged)}")
        if report.gone:
            echo(f"stopped or gone before acknowledging: {', '.join(report.gone)}")


def _issued_dict(issued: control.CommandIssued, report: control.AckReport | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "action": issued.action,
        "target": {"kind": issued.target.kind, "name": issued.target.name or None},
        "generation": issued.generation,
        "worker_ids": list(issued.worker_ids),
        "issued_at": issued.issued_at,
        "state_changed": issued.state_changed,
        "acknowledged": None,
        "missing": None,
        "gone": None,
        "unreachable": None,
    }
    if report is not None:
        data.update(
            acknowledged=list(report.acknowledged),
            missing=list(report.missing),
            gone=list(report.gone),
            unreachable=list(report.unreachable),
        )
    return data


pause_command = _control_command("pause")
resume_command = _control_command("resume")
drain_command = _control_command("drain")
stop_command = _control_command("stop")
restart_command = _control_command("restart")
