"""The `jobbus` command imports a subcommand's module only when that subcommand runs."""

from __future__ import annotations

import subprocess
import sys

import click

from jobbus.cli.main import COMMANDS, cli
from tests.cli import ROOT


def test_every_listed_command_loads_under_its_own_name() -> None:
    context = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(context, name)
        assert command is not None and command.name == name
    assert cli.get_command(context, "no-such-command") is None
    assert cli.list_commands(context) == sorted(COMMANDS)


def test_the_worker_command_starts_without_the_tables_the_dashboard_or_the_demo() -> None:
    """Every module a worker process imports delays its first job; rich alone costs ~25 ms."""
    probe = (
        "import sys, click\n"
        "from jobbus.cli.main import cli\n"
        "cli.get_command(click.Context(cli), 'worker')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich' or m in {\n"
        "    'jobbus.cli.output', 'jobbus.cli.dashboard', 'jobbus.cli.demo', 'jobbus.cli.bench'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
