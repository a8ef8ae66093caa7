"""``manage.py jobbus <command> ...``: the `jobbus` command line with Django set up.

The database and every setting come from `JOBBUS` (and the Django database), and ``worker`` runs the
project's App (``--app`` defaults to it), so ``manage.py jobbus worker --queue mail`` is all it takes.
``manage.py jobbus migrate`` applies jobbus's schema like ``manage.py migrate jobbus`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobbus.contrib.django.conf import get_app

#: What ``--app`` defaults to for ``worker``.
WORKER_APP = "jobbus.contrib.django:worker_app"


class Command(BaseCommand):
    help = "Run a jobbus command (worker, status, jobs, migrate, ...) with this project's settings."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.prefix_chars = "\0"  # every argument, options included, belongs to jobbus
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("jobbus_args", nargs=argparse.REMAINDER, help="a jobbus command and its options")

    def run_from_argv(self, argv: list[str]) -> None:
        """``manage.py jobbus ...``: jobbus's own exit code, output and errors, unchanged."""
        from jobbus.cli import main

        with project_environment():
            main(command_line(argv[2:]))

    def handle(self, *args: Any, **options: Any) -> None:
        """``call_command("jobbus", "status")``: a non-zero exit becomes a `CommandError`."""
        from jobbus.cli import main

        try:
            with project_environment():
                main(command_line([*args, *options.get("jobbus_args", [])]))
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise CommandError(f"jobbus exited with {exc.code}", returncode=int(exc.code or 1)) from None


def command_line(args: list[str]) -> list[str]:
    """`args` for jobbus's CLI: ``worker`` runs the project's App unless ``--app`` says otherwise."""
    if args[:1] == ["worker"] and not any(arg == "--app" or arg.startswith("--app=") for arg in args):
        return ["worker", "--app", WORKER_APP, *args[1:]]
    return args


@contextlib.contextmanager
def project_environment() -> Iterator[None]:
    """The project's settings as ``JOBBUS_*`` variables (the CLI's commands read them) while it runs."""
    saved = dict(os.environ)
    for name, value in get_app().settings.as_dict().items():
        if value is not None:
            os.environ[f"JOBBUS_{name.upper()}"] = _as_variable(value)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _as_variable(value: object) -> str:
    """A setting as its JOBBUS_* variable writes it: keys comma-separated, cells `name=dsn` pairs by `;`."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return ";".join(f"{key}={item}" for key, item in value.items())
    return str(value)
