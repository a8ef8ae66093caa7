"""A real PostgreSQL 13 is refused: `jobbus migrate` and a worker's start exit 78 with one line naming
the server's version and the minimum, and leave the database as they found it.

The server is a throwaway cluster of the 13 binaries the version matrix downloads (`make matrix PG=13`,
tests/pgbinaries.py); without them these tests skip, saying so.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import pgbinaries
from tests.cli import jobbus
from tests.cluster import throwaway_cluster

pytestmark = pytest.mark.matrix

REFUSAL = re.compile(r"PostgreSQL 13\.\d+ is too old for jobbus: it needs PostgreSQL 14 or newer")


@pytest.fixture(scope="module")
def postgres_13() -> Iterator[str]:
    tarball = pgbinaries.tarball_path(13)
    if not tarball.is_file():
        pytest.skip(f"needs the PostgreSQL 13 binaries in {tarball.parent} (`make matrix PG=13` downloads them)")
    with tempfile.TemporaryDirectory(prefix="jobbus-pg13-") as unpacked:
        bindir = pgbinaries.unpack(tarball, Path(unpacked))
        with throwaway_cluster(bindir) as cluster:
            with psycopg.connect(cluster.dsn) as conn:
                assert conn.info.server_version // 10000 == 13
            yield cluster.dsn


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def jobbus_schemas(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = 'jobbus'").fetchall()
    return [row[0] for row in rows]


def test_migrate_exits_78_naming_the_version_and_the_minimum(postgres_13: str) -> None:
    result = jobbus(postgres_13, "migrate")
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert REFUSAL.search(one_line(result.stderr)), result.stderr
    assert jobbus_schemas(postgres_13) == []


def test_migrate_dry_run_exits_78_too(postgres_13: str) -> None:
    result = jobbus(postgres_13, "migrate", "--dry-run")
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert REFUSAL.search(one_line(result.stderr)), result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("args", [["--run-once"], []], ids=["run-once", "long-running"])
def test_a_worker_start_exits_78_naming_the_version_and_the_minimum(postgres_13: str, args: list[str]) -> None:
    """The schema is missing too (migrate refused to build it): the version comes first, since
    `jobbus migrate`, what a missing schema asks for, would be refused."""
    result = jobbus(postgres_13, "worker", "--app", "tests.cli.apps:app", *args)
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert REFUSAL.search(one_line(result.stderr)), result.stderr
    assert jobbus_schemas(postgres_13) == []
