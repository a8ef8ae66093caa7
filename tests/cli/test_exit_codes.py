"""Every exit code of SPEC section 6, provoked through the real executable."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from jobbus.cli.errors import run
from jobbus.cli.worker import MAX_LOG_MESSAGE_BYTES, RedactingFormatter
from jobbus.redaction import MASK
from jobbus.worker.outcomes import MAX_TRACEBACK_BYTES
from tests.cli import ROOT, UNREACHABLE_DSN, cli_env, job_status, jobbus, query_value
from tests.cli.apps import SECRET_DSN
from tests.test_producer import RANDOM_CJK


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
        pytest.param(["schedule", "t", "--in", "soon"], id="unparseable-in"),
        pytest.param(["schedule", "t", "--in", "36501d"], id="in-over-100-years"),
        pytest.param(["schedule", "t", "--at", "2030-01-01T09:00:00Z", "--in", "1h"], id="at-and-in"),
        pytest.param(["prune", "--older-than", "seven days"], id="bad-duration"),
        pytest.param(["prune", "--older-than", "1d", "--status", "queued"], id="prune-active-status"),
        pytest.param(["jobs", "show", "not-a-uuid"], id="bad-job-id"),
        pytest.param(["jobs", "list", "--status", "sleeping"], id="unknown-status"),
        pytest.param(["status", "--bogus"], id="unknown-option"),
        pytest.param(["no-such-command"], id="unknown-command"),
        pytest.param(["jobs", "show"], id="missing-argument"),
        pytest.param(["schedule", "t", "--max-attempts", str(2**40)], id="max-attempts-over-int32"),
        pytest.param(["schedule", "t", "--priority", str(2**40)], id="priority-over-int32"),
        pytest.param(["schedule", "t", "--unique-key", RANDOM_CJK[:1000]], id="unique-key-over-1000-bytes"),
        pytest.param(["schedule", "é" * 128], id="type-over-255-bytes"),
        pytest.param(["schedule", "t", "--queue", ""], id="empty-queue"),
        pytest.param(["schedule", "t", "--config", "[" * 5000 + "]" * 5000], id="config-nested-5000"),
        pytest.param(["schedule", "t", "--config", '{"a":' * 5000 + "1" + "}" * 5000], id="object-nested-5000"),
        pytest.param(["schedule", "t", "--config", '{"a":' * 300 + "1" + "}" * 300], id="config-nested-300"),
        pytest.param(["schedule", "t", "--config", '{"prompt": "\\ud800"}'], id="config-lone-surrogate"),
        pytest.param(["schedule", "t", "--config", '{"s": "\\u0000"}'], id="config-nul"),
        pytest.param(["schedule", "t", "--at", "9999-12-31T23:00:00-14:00"], id="at-year-10000-in-utc"),
        pytest.param(["jobs", "retry", str(uuid.uuid4()), "--at", "9999-12-31T23:00:00-14:00"], id="retry-at"),
        pytest.param(["prune", "--older-than", "99999999999d"], id="duration-overflowing-timedelta"),
        pytest.param(["prune", "--older-than", "100000000d"], id="duration-overflowing-postgres"),
        pytest.param(["prune", "--older-than", "9" * 5000 + "s"], id="duration-of-5000-digits"),
        pytest.param(["migrate", "--schema", "pg_jobs"], id="reserved-schema"),
        pytest.param(["worker", "--app", "tests.cli.apps:app", "--worker-id", "w" * 256], id="long-worker-id"),
        pytest.param(["worker", "--app", "tests.cli.apps:app", "--queue", ""], id="empty-worker-queue"),
        pytest.param(["worker", "--app", "tests.cli.apps:app", "--poll-interval", "nan"], id="poll-interval-nan"),
        pytest.param(["worker", "--app", "tests.cli.apps:app", "--poll-interval", "1e-12"], id="poll-interval-tiny"),
        pytest.param(["worker", "--app", "tests.cli.apps:app", "--shutdown-timeout", "inf"], id="shutdown-inf"),
        pytest.param(["worker", "--app", "tests.cli.apps:app", "--concurrency", str(2**40)], id="concurrency"),
        pytest.param(["worker", "--app", "tests.cli.apps:app", "--type", ""], id="empty-worker-type"),
        pytest.param(["status", "--watch", "--interval", "nan"], id="interval-nan"),
        pytest.param(["jobs", "list", "--queue", "\udcff"], id="filter-not-utf8"),  # the byte 0xff in argv
        pytest.param(["schedule", "t", "--name", "\udcff"], id="name-not-utf8"),
    ],
)
def test_bad_usage_exits_64_with_one_error_line_before_touching_the_database(args: list[str]) -> None:
    # The DSN is unreachable: reaching the database would exit 69, so 64 proves it was refused first.
    result = jobbus(UNREACHABLE_DSN, *args)
    assert result.returncode == 64, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and lines[0].endswith(" --help)"), lines[0]
    assert "Traceback" not in result.stderr and "Usage:" not in result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--in", "soon"], "--in 'soon' is not a duration"),
        (["--in", "-5m"], "--in '-5m' is not a duration"),
        (["--at", "2030-01-01T09:00:00Z", "--in", "1h"], "--at and --in exclude each other"),
    ],
)
def test_schedule_names_the_flag_it_refuses(args: list[str], named: str) -> None:
    result = jobbus(UNREACHABLE_DSN, "schedule", "t", *args)
    assert result.returncode == 64, result.stderr
    assert result.stderr.startswith(f"error: {named}"), result.stderr


def test_a_usage_error_names_the_command_to_ask_for_help() -> None:
    result = jobbus(UNREACHABLE_DSN, "jobs", "list", "--limit", "0")
    assert result.returncode == 64
    assert result.stderr.startswith("error: Invalid value for '--limit': 0 is not in the range 1<=x<=10000.")
    assert result.stderr.rstrip().endswith("(see jobbus jobs list --help)")


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
def test_bad_app_exits_78_with_one_error_line(dsn: str, args: list[str]) -> None:
    result = jobbus(dsn, *args)
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: --app ") and len(result.stderr.splitlines()) == 1, result.stderr


def test_an_import_error_inside_the_app_module_shows_its_traceback_then_the_error(dsn: str) -> None:
    result = jobbus(dsn, "worker", "--app", "tests.cli.app_with_a_bug:app")
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert result.stderr.startswith("Traceback")
    assert "No module named 'jobbus_dependency_that_is_not_installed'" in result.stderr
    assert result.stderr.splitlines()[-1] == "error: could not import the --app module (traceback above)"


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


def test_a_malformed_dsn_is_a_configuration_error_without_its_password() -> None:
    result = jobbus(None, "status", "--dsn", "postgresql://jobbus:hunter2-s3cret@127.0.0.1:1/app?no_such_option=1")
    assert result.returncode == 78, result.stderr
    assert result.stderr.startswith("error: the database DSN is not valid: ")
    assert "hunter2-s3cret" not in result.stdout + result.stderr


def test_a_traceback_never_shows_a_password(dsn: str) -> None:
    result = jobbus(dsn, "worker", "--app", "tests.cli.apps:leaky_factory")
    assert result.returncode == 70, result.stderr
    assert "Traceback" in result.stderr and "the factory exploded connecting to" in result.stderr
    assert "postgresql://app:***@db.internal:5432/app" in result.stderr
    assert "hunter2-s3cret" not in result.stdout + result.stderr


def test_worker_logs_never_show_a_password(dsn: str) -> None:
    job_id = jobbus(dsn, "schedule", "leak", "--max-attempts", "1").stdout.strip()
    result = jobbus(dsn, "worker", "--app", "tests.cli.apps:app", "--stop-when-empty")
    assert result.returncode == 0, result.stderr
    assert job_status(dsn, job_id) == "failed"
    assert f"job {job_id} failed on its last attempt" in result.stderr
    assert f"could not reach postgresql://app:{MASK}@db.internal:5432/app (password={MASK}" in result.stderr
    assert "hunter2-s3cret" not in result.stdout + result.stderr


def _huge_record(size: int) -> logging.LogRecord:
    try:
        raise ValueError("token=SVexc " + "a://b:" * (size // 6) + " api_key=SVend")
    except ValueError:
        raised = sys.exc_info()
    message = "password=SVmsg " + '{"url":"https://h:443/x"},' * (size // 26)
    return logging.LogRecord("app", logging.ERROR, __file__, 1, "failed: %s", (message,), raised)


@pytest.mark.timeout(60)  # a guard, not a measure: before, formatting one such record took hours
def test_the_worker_log_formatter_masks_and_bounds_a_record_of_any_size() -> None:
    formatter = RedactingFormatter("%(levelname)s %(name)s: %(message)s")
    line = formatter.format(_huge_record(16 << 20))
    assert "SV" not in line and f"password={MASK}" in line and line.rstrip().endswith(f"api_key={MASK}")
    assert len(line.encode()) <= MAX_LOG_MESSAGE_BYTES + MAX_TRACEBACK_BYTES + 1

    def cpu(size: int) -> float:
        records = [_huge_record(size) for _ in range(3)]  # each formats its exception once, then keeps it
        spent = []
        for record in records:
            started = time.process_time()
            formatter.format(record)
            spent.append(time.process_time() - started)
        return max(min(spent), 1e-6)

    ratio = cpu(16 << 20) / cpu(1 << 20)
    assert ratio < 40, f"a record 16 times longer took {ratio:.0f} times the CPU time (linear: ~16 at most)"


def test_database_errors_after_the_start_never_show_a_password(capsys: pytest.CaptureFixture[str]) -> None:
    async def body() -> int:
        raise psycopg.OperationalError(f"connection to {SECRET_DSN} lost; conninfo password=hunter2-s3cret")

    assert run(body) == 69
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: database error: connection to postgresql://app:***@db.internal")
    assert "hunter2-s3cret" not in stderr


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        (["worker", "--app", "tests.cli.apps:app", "--run-once"], "JOBBUS_LEASE_SECONDS", "inf"),
        (["worker", "--app", "tests.cli.apps:app", "--run-once"], "JOBBUS_POOL_MAX_SIZE", str(2**40)),
        (["schedule", "noop"], "JOBBUS_DEFAULT_MAX_ATTEMPTS", str(2**40)),
        (["status"], "JOBBUS_SCHEMA", "public"),
    ],
)
def test_invalid_settings_exit_78_naming_the_setting_and_write_nothing(
    dsn: str, command: list[str], variable: str, value: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobbus", *command],
        cwd=ROOT,
        env=cli_env(dsn, **{variable: value}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"error: {variable.removeprefix('JOBBUS_').lower()} ")
    assert query_value(dsn, "SELECT count(*) FROM jobbus.job") == 0
    assert query_value(dsn, "SELECT count(*) FROM jobbus.worker") == 0


def test_a_misspelt_setting_is_warned_naming_the_right_one(dsn: str) -> None:
    result = jobbus(dsn, "status", "--json", JOBBUS_LEASE_SECOND="5")
    assert result.returncode == 0, result.stderr
    assert "JOBBUS_LEASE_SECOND (did you mean JOBBUS_LEASE_SECONDS?)" in result.stderr
    assert result.stderr.count("JOBBUS_LEASE_SECOND ") == 1  # once, although the command builds settings twice
