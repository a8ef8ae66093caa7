"""--app and --dsn: which database a command uses (the flag, then the App's keyword, then JOBBUS_DSN)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cli import job_status, jobbus, query_value
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
