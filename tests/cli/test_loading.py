"""--app: what it may name (an App, a factory of one) and what it says of anything else; and which database
a command uses (the flag, then the App's keyword, then JOBBUS_DSN)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cli import UNREACHABLE_DSN, job_status, jobbus, query_value
from tests.dbserver import fresh_database

APP = "tests.cli.apps:app_with_its_own_dsn"  # App(dsn=os.environ["APP_DSN"])


@pytest.fixture
def other_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A second migrated database, so a test can tell which one a command used."""
    with fresh_database(admin_dsn, template_db) as url:
        yield url


def _one_job_each(app_dsn: str, env_dsn: str) -> tuple[str, str]:
    return jobbus(app_dsn, "schedule", "noop").stdout.strip(), jobbus(env_dsn, "schedule", "noop").stdout.strip()


def test_the_app_keyword_wins_over_jobbus_dsn(dsn: str, other_dsn: str) -> None:
    in_app_db, in_env_db = _one_job_each(dsn, other_dsn)
    result = jobbus(other_dsn, "worker", "--app", APP, "--stop-when-empty", APP_DSN=dsn)
    assert result.returncode == 0, result.stderr
    assert job_status(dsn, in_app_db) == "completed"
    assert job_status(other_dsn, in_env_db) == "queued"


def test_the_dsn_flag_wins_over_the_app_keyword(dsn: str, other_dsn: str) -> None:
    in_app_db, in_flag_db = _one_job_each(dsn, other_dsn)
    result = jobbus(None, "worker", "--app", APP, "--stop-when-empty", "--dsn", other_dsn, APP_DSN=dsn)
    assert result.returncode == 0, result.stderr
    assert job_status(other_dsn, in_flag_db) == "completed"
    assert job_status(dsn, in_app_db) == "queued"


def test_schedule_with_an_app_follows_the_same_precedence(dsn: str, other_dsn: str) -> None:
    by_keyword = jobbus(other_dsn, "schedule", "noop", "--app", APP, APP_DSN=dsn)
    assert by_keyword.returncode == 0, by_keyword.stderr
    assert job_status(dsn, by_keyword.stdout.strip()) == "queued"
    by_flag = jobbus(other_dsn, "schedule", "noop", "--app", APP, "--dsn", other_dsn, APP_DSN=dsn)
    assert by_flag.returncode == 0, by_flag.stderr
    assert job_status(other_dsn, by_flag.stdout.strip()) == "queued"
    assert query_value(dsn, "SELECT count(*) FROM jobbus.job") == 1


def test_without_a_keyword_or_a_flag_jobbus_dsn_is_used(dsn: str) -> None:
    job_id = jobbus(dsn, "schedule", "noop").stdout.strip()
    result = jobbus(dsn, "worker", "--app", "tests.cli.apps:app", "--stop-when-empty")
    assert result.returncode == 0, result.stderr
    assert job_status(dsn, job_id) == "completed"


MISTAKEN = "tests.cli.mistaken_apps"
NOT_AN_APP = "not a jobbus.App (nor a callable returning one, nor an async context manager factory yielding one)"
#: Each command that takes --app, with what it needs besides.
APP_COMMANDS = {"worker": ["worker"], "schedule": ["schedule", "mail.welcome"], "dashboard": ["dashboard"]}


@pytest.mark.parametrize("command", APP_COMMANDS)
@pytest.mark.parametrize(
    ("attribute", "found"),
    [
        ("welcome", "a function that takes an argument (job)"),  # a handler
        ("password_reset", "an async function that takes an argument (job)"),
        ("Mailer", "a class that takes an argument (host)"),
        ("make_number", "a function that returns an int"),
        ("yields_a_string", "a function that yields a str"),
        ("settings", "a dict"),
        ("contextlib", "a module"),
    ],
)
def test_an_app_that_names_no_app_is_a_configuration_error_of_one_line(
    command: str, attribute: str, found: str
) -> None:
    # The DSN is unreachable: reaching the database would exit 69, so 78 proves --app was refused first.
    result = jobbus(UNREACHABLE_DSN, *APP_COMMANDS[command], "--app", f"{MISTAKEN}:{attribute}")
    assert result.returncode == 78, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: --app '{MISTAKEN}:{attribute}' is {found}, {NOT_AN_APP}; "), line
    assert line.endswith(
        f"did you mean `--app {MISTAKEN}:app`, `--app {MISTAKEN}:many` or `--app {MISTAKEN}:producer`?"
    )


def test_a_missing_attribute_names_the_apps_of_its_module() -> None:
    result = jobbus(UNREACHABLE_DSN, "worker", "--app", f"{MISTAKEN}:ap")
    assert result.returncode == 78, result.stderr
    assert result.stderr.splitlines() == [
        f"error: --app '{MISTAKEN}:ap': module '{MISTAKEN}' has no attribute 'ap'; "
        f"did you mean `--app {MISTAKEN}:app`, `--app {MISTAKEN}:many` or `--app {MISTAKEN}:producer`?"
    ]


def test_a_type_error_inside_a_factory_is_its_bug_shown_with_its_traceback(dsn: str) -> None:
    result = jobbus(dsn, "schedule", "mail.welcome", "--app", f"{MISTAKEN}:broken_inside")
    assert result.returncode == 70, result.stderr
    assert "Traceback" in result.stderr and "return len(42)" in result.stderr
    assert NOT_AN_APP not in result.stderr


@pytest.mark.parametrize("attribute", ["app", "make_app", "make_app_async", "lifespan"])
def test_an_app_a_factory_and_an_async_context_manager_factory_still_load(dsn: str, attribute: str) -> None:
    result = jobbus(dsn, "schedule", "mail.welcome", "--app", f"{MISTAKEN}:{attribute}")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert job_status(dsn, result.stdout.strip()) == "queued"
