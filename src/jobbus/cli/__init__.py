"""The `jobbus` command line."""

from jobbus.cli.main import cli, main

__all__ = ["cli", "main"]
