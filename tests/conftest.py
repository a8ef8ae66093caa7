from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import jobbus
from tests.dbserver import ensure_template, fresh_database, server_dsn


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `server` need the machine's PostgreSQL: on the embedded server they skip, saying why."""
    if os.environ.get("JOBBUS_TEST_DSN"):
        return
    for item in items:
        marker = item.get_closest_marker("server")
        if marker is not None:
            why = marker.args[0] if marker.args else "needs what the embedded server lacks"
            item.add_marker(pytest.mark.skip(reason=f"needs a PostgreSQL server (JOBBUS_TEST_DSN): {why}"))


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    return server_dsn()


@pytest.fixture(scope="session")
def template_db(admin_dsn: str) -> str:
    return ensure_template(admin_dsn)


@pytest.fixture
def dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test alone."""
    with fresh_database(admin_dsn, template_db) as url:
        yield url


@pytest.fixture
def empty_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database without the jobbus schema."""
    with fresh_database(admin_dsn, None) as url:
        yield url


FAST: dict[str, Any] = {"retry_base_delay_seconds": 0.0, "retry_max_delay_seconds": 0.0, "poll_interval_seconds": 0.2}


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[jobbus.App]:
    application = jobbus.App(dsn=dsn, **FAST)
    async with application:
        yield application


@pytest.fixture
def sync_app(dsn: str) -> Iterator[jobbus.App]:
    application = jobbus.App(dsn=dsn, **FAST)
    with application.sync:
        yield application
