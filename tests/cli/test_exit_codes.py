"""Every exit code of SPEC section 6, provoked through the real executable."""

from __future__ import annotations

import uuid

import pytest

from tests.cli import UNREACHABLE_DSN, jobbus


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["pause"], id="no-target"),
        pytest.param(["drain", "--all", "--queue", "emails"], id="two-targets"),
        pytest.param(["stop", "--worker-id", "w1", "--queue", "q"], id="worker-and-queue"),
        pytest.param(["schedule", "t", "--config", "{not json"], id="invalid-config-json"),
        pytest.param(["schedule", "t", "--config", "[1, 2]"], id="config-not-an-object"),
        pytest.param(["schedule", "t", "--at", "2030-01-01T09:00:00"], id="naive-at"),
        pytest.param(["schedule", "t", "--at", "next tuesday"], id="unparseable-at"),
        pytest.param(["prune", "--older-than", "seven days"], id="bad-duration"),
        pytest.param(["prune", "--older-than", "1d", "--status", "queued"], id="prune-active-status"),
        pytest.param(["jobs", "show", "not-a-uuid"], id="bad-job-id"),
        pytest.param(["jobs", "list", "--status", "sleeping"], id="unknown-status"),
        pytest.param(["status", "--bogus"], id="unknown-option"),
        pytest.param(["no-such-command"], id="unknown-command"),
    ],
)
def test_bad_usage_exits_64_before_touching_the_database(args: list[str]) -> None:
    # The DSN is unreachable: reaching the database would exit 69, so 64 proves it was refused first.
    result = jobbus(UNREACHABLE_DSN, *args)
    assert result.returncode == 64, (result.stdout, result.stderr)
    assert result.stderr.strip()


def test_no_database_given_is_bad_usage() -> None:
    result = jobbus(None, "status")
    assert result.returncode == 64
    assert "JOBBUS_DSN" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["workers"],
        ["pause", "--all"],
        ["schedule", "noop"],
        ["jobs", "list"],
        ["prune", "--older-than", "7d"],
        ["worker", "--app", "tests.cli.apps:app"],
    ],
    ids=lambda args: args[0],
)
def test_unreachable_database_exits_69(args: list[str]) -> None:
    result = jobbus(UNREACHABLE_DSN, *args)
    assert result.returncode == 69, (result.stdout, result.stderr)
    assert "cannot reach the database" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["workers"],
        ["resume", "--all"],
        ["schedule", "noop", "--config", "{}"],
        ["jobs", "list"],
        ["worker", "--app", "tests.cli.apps:app", "--run-once"],
    ],
    ids=lambda args: args[0],
)
def test_missing_schema_exits_78_and_says_to_migrate(empty_dsn: str, args: list[str]) -> None:
    result = jobbus(empty_dsn, *args)
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert "jobbus migrate" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--app", "tests.cli.no_such_module:app"],
        ["worker", "--app", "tests.cli.apps:no_such_attr"],
        ["worker", "--app", "tests.cli.apps:not_an_app"],
        ["worker", "--app", "no-colon"],
        ["schedule", "noop", "--app", "tests.cli.apps:no_such_attr"],
    ],
    ids=["missing-module", "missing-attr", "not-an-app", "no-colon", "schedule"],
)
def test_bad_app_exits_78(dsn: str, args: list[str]) -> None:
    result = jobbus(dsn, *args)
    assert result.returncode == 78, (result.stdout, result.stderr)


def test_an_exploding_app_factory_is_an_internal_error_70(dsn: str) -> None:
    result = jobbus(dsn, "worker", "--app", "tests.cli.apps:broken_factory")
    assert result.returncode == 70, (result.stdout, result.stderr)
    assert "the factory exploded" in result.stderr


def test_invalid_state_exits_1_with_its_message(dsn: str) -> None:
    job_id = jobbus(dsn, "schedule", "noop").stdout.strip()
    retried = jobbus(dsn, "jobs", "retry", job_id)
    assert retried.returncode == 1
    assert f"job {job_id} is queued; only failed jobs can be retried" in retried.stderr

    unknown = str(uuid.uuid4())
    for command in ("cancel", "retry", "show"):
        result = jobbus(dsn, "jobs", command, unknown)
        assert result.returncode == 1, (command, result.stderr)
        assert f"job {unknown} does not exist" in result.stderr


@pytest.mark.parametrize("command", [["status"], ["worker", "--app", "tests.cli.apps:app"], ["migrate"]])
def test_passwords_in_the_dsn_never_reach_the_output(command: list[str]) -> None:
    secret_dsn = "postgresql://jobbus:hunter2-s3cret@127.0.0.1:1/app"
    result = jobbus(None, *command, "--dsn", secret_dsn)
    assert result.returncode == 69
    assert "hunter2-s3cret" not in result.stdout + result.stderr
