"""The pytest plugin `jobbus.testing`: a small project's own test suite run by a real pytest, in parallel.

The project's App is module-level (as in real projects); the plugin points it at a schema per test,
the project's tests enqueue through their own code and `drain`, and nothing is left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

import jobbus

PROJECT_JOBS = '''
from dataclasses import dataclass

import jobbus

app = jobbus.App(dsn="postgresql://nowhere.invalid/never", retry_base_delay_seconds=0, retry_max_delay_seconds=0)
sent: list[str] = []


@dataclass(frozen=True)
class Mail:
    to: str
    subject: str


@app.task("mail.send")
async def send(mail: Mail) -> None:
    sent.append(f"{mail.to}: {mail.subject} (job {jobbus.current_job().attempt})")


async def sign_up(email: str) -> None:
    """The code under test: it enqueues."""
    await send.defer(Mail(email, "welcome"))
'''

PROJECT_TESTS = """
import pytest

import jobs


@pytest.mark.parametrize("n", range(4))
async def test_sign_up_sends_a_welcome_mail(jobbus_app, n):
    assert jobbus_app is jobs.app and jobbus_app.settings.schema.startswith("jobbus_test_")
    jobs.sent.clear()
    async with jobbus_app:
        await jobs.sign_up(f"user{n}@example.com")
        assert len(await jobbus_app.list_jobs()) == 1  # only this test's job: its own schema
        assert await jobbus_app.drain() == {"completed": 1}
    assert jobs.sent == [f"user{n}@example.com: welcome (job 1)"]


def test_blocking_code_uses_app_sync(jobbus_app):
    jobs.send.defer_sync(jobs.Mail("b@example.com", "hello"))
    assert jobbus_app.sync.drain() == {"completed": 1}


def test_each_test_gets_a_migrated_schema(migrated_schema):
    pass
"""

CONFTEST = """
import pytest


@pytest.fixture
def migrated_schema(jobbus_schema, jobbus_dsn):
    import psycopg

    with psycopg.connect(jobbus_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", (jobbus_schema,)).fetchone()
    assert row[0] > 0
    return jobbus_schema
"""


def _run_project(tmp_path: Path, admin_dsn: str, ini: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "jobs.py").write_text(PROJECT_JOBS)
    if not args:
        (tmp_path / "test_signup.py").write_text(PROJECT_TESTS)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text(textwrap.dedent(ini))
    env = {**os.environ, "JOBBUS_TEST_DSN": admin_dsn, "PYTHONPATH": str(tmp_path)}
    env.pop("JOBBUS_DSN", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(args or ("-n", "2"))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
        timeout=170,
    )


def _test_schemas(admin_dsn: str) -> set[str]:
    with psycopg.connect(admin_dsn) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'jobbus_test_%'").fetchall()
    return {row[0] for row in rows}


@pytest.mark.timeout(180)
def test_jobbus_app_fixture_points_the_projects_app_at_a_schema_per_test(tmp_path: Path, admin_dsn: str) -> None:
    before = _test_schemas(admin_dsn)
    result = _run_project(tmp_path, admin_dsn, "[pytest]\nasyncio_mode = auto\njobbus_app = jobs:app\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout
    assert _test_schemas(admin_dsn) - before == set()  # every test's schema was dropped


RESTORE_TESTS = """
import jobs


def test_one(jobbus_app):
    assert jobbus_app.settings.schema.startswith("jobbus_test_")


def test_after():
    assert jobs.app.settings.schema == "jobbus"
    assert jobs.app.settings.dsn == "postgresql://nowhere.invalid/never"
    assert jobs.app.settings.retry_base_delay_seconds == 0
"""


def test_the_fixture_restores_the_apps_settings(tmp_path: Path, admin_dsn: str) -> None:
    (tmp_path / "test_restore.py").write_text(RESTORE_TESTS)
    result = _run_project(tmp_path, admin_dsn, "[pytest]\njobbus_app = jobs:app\n", "test_restore.py", "-n", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_reconfigure_refuses_an_open_app_and_unknown_settings(dsn: str) -> None:
    import asyncio

    app = jobbus.App(dsn=dsn)
    with pytest.raises(ValueError, match="unknown setting"):
        app.reconfigure(shema="x")
    with pytest.raises(ValueError, match="lease_seconds"):
        app.reconfigure(lease_seconds=-1)
    assert app.settings.lease_seconds == 300

    async def main() -> None:
        async with app:
            with pytest.raises(RuntimeError, match="closed App"):
                app.reconfigure(schema="other")

    asyncio.run(main())
