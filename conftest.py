"""The examples of README.md and docs/*.md run as tests: see tests/docs/examples.py."""

from tests.docs.examples import collect_documents as pytest_collect_file

__all__ = ["pytest_collect_file"]
