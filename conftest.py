"""The examples of README.md and docs/*.md run as tests: see tests/docs/examples.py."""

from tests.docs.examples import pytest_collect_file, pytest_xdist_make_scheduler

__all__ = ["pytest_collect_file", "pytest_xdist_make_scheduler"]
