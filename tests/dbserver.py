"""The PostgreSQL server under test: `JOBBUS_TEST_DSN`, or the embedded server when it is unset.

Every test gets its own database, cloned from a template that is migrated once per run, so tests are
isolated from each other and run in parallel (pytest-xdist).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobbus import schema

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_DIR = ROOT / ".jobbus" / "test-pgdata"


def server_dsn() -> str:
    dsn = os.environ.get("JOBBUS_TEST_DSN")
    if dsn:
        return dsn
    from jobbus import embedded

    if embedded.data_dir_major(EMBEDDED_DIR) not in (None, embedded.server_major()):
        embedded.remove_data_dir(EMBEDDED_DIR)  # scratch of an earlier embedded major: the template is rebuilt
    return embedded.start_embedded(EMBEDDED_DIR)


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def template_name() -> str:
    digest = hashlib.sha1("".join(m.template for m in schema.migrations()).encode()).hexdigest()[:10]
    return f"jobbus_tmpl_{digest}"


def ensure_template(admin_dsn: str) -> str:
    """Create the migrated template database once per server and migration set."""
    name = template_name()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext('jobbus-test-template'))")
        try:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                building = f"{name}_build_{uuid.uuid4().hex[:6]}"
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
                with psycopg.connect(with_dbname(admin_dsn, building), autocommit=True) as target:
                    schema.migrate(target, "jobbus")
                conn.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(building), sql.Identifier(name))
                )
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext('jobbus-test-template'))")
    return name


def drop_template(admin_dsn: str) -> None:
    """Drop the template of this migration set, if there is one (`make mutate` builds one per broken
    migration)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template_name())))


@contextlib.contextmanager
def fresh_database(admin_dsn: str, template: str | None) -> Iterator[str]:
    """A new database (migrated when `template` is given), dropped afterwards."""
    name = f"jobbus_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if template:
            query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        else:
            query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        conn.execute(query)
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
