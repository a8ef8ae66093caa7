"""A command that does not exist names the one probably meant: the group it belongs to, or the closest spelling."""

from __future__ import annotations

import uuid

import pytest

from tests.cli import UNREACHABLE_DSN, jobbus

JOB_ID = str(uuid.uuid4())


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (["retry", JOB_ID], "`jobbus jobs retry`"),
        (["cancel", JOB_ID], "`jobbus jobs cancel`"),
        (["show", JOB_ID], "`jobbus jobs show`"),
        (["delete", JOB_ID], "`jobbus jobs delete`"),
        (["run-now", JOB_ID], "`jobbus jobs run-now`"),
        (["list"], "`jobbus jobs list`, `jobbus periodic list` or `jobbus queue list`"),
        (["wroker", "--app", "tests.cli.apps:app"], "`jobbus worker` or `jobbus workers`"),
        (["migrat"], "`jobbus migrate`"),
        (["retyr", JOB_ID], "`jobbus jobs retry` or `jobbus restart`"),
        (["jobs", "retyr", JOB_ID], "`jobbus jobs retry`"),
        (["periodic", "paus", "nightly"], "`jobbus periodic pause`"),
        (["queue", "lisst"], "`jobbus queue list`"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else None,
)
def test_an_unknown_command_exits_64_naming_the_command_meant(args: list[str], meant: str) -> None:
    # The DSN is unreachable: reaching the database would exit 69.
    result = jobbus(UNREACHABLE_DSN, *args)
    assert result.returncode == 64, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("error: No such command '") and f"'; did you mean {meant}? (see jobbus" in line, line


def test_an_unknown_command_like_no_other_gets_no_guess() -> None:
    result = jobbus(UNREACHABLE_DSN, "xyzzy")
    assert result.returncode == 64
    assert result.stderr.splitlines() == ["error: No such command 'xyzzy'. (see jobbus --help)"]
