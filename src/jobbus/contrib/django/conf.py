"""The App of a Django project, built from `settings.JOBBUS`, and Django's connection for enqueues."""

from __future__ import annotations

import getpass
import ipaddress
import os
import threading
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobbus.app import App
from jobbus.contrib.django.handler import register_handler

#: Keys of `JOBBUS` that are not App settings.
OWN_KEYS = frozenset({"app", "database"})
#: Connection parameters Django passes to psycopg that are not libpq's.
_NOT_LIBPQ = frozenset({"context", "cursor_factory", "prepare_threshold", "autocommit", "row_factory"})

_lock = threading.Lock()
_apps: dict[str, App] = {}


def config() -> dict[str, Any]:
    found = getattr(settings, "JOBBUS", {})
    if not isinstance(found, dict):
        raise TypeError(f"settings.JOBBUS must be a dict, got {type(found).__name__}")
    return found


def database_alias() -> str:
    return str(config().get("database", "default"))


def database_dsn(using: str | None = None) -> str:
    """The libpq DSN of a Django database (default: `JOBBUS["database"]`), as Django connects to it."""
    wrapper = connections[using or database_alias()]
    if wrapper.vendor != "postgresql":
        raise TypeError(f"jobbus needs a PostgreSQL database; Django's {wrapper.alias!r} is {wrapper.vendor}")
    params = {key: value for key, value in wrapper.get_connection_params().items() if key not in _NOT_LIBPQ}
    return make_conninfo(**{key: value for key, value in params.items() if value not in (None, "")})


def get_app() -> App:
    """The project's App: `JOBBUS["app"]` or a new one, with `JOBBUS`'s settings, on Django's database.

    One per process. Its `dsn` is the Django database's (under Django's test runner, the test
    database) unless `JOBBUS` names one. Django tasks' handler is registered on it.
    """
    with _lock:
        own = config()
        target = str(own.get("app", ""))
        app = _apps.get(target)
        if app is None:
            app = _load(target) if target else App(**_settings(own))
            if target:
                app.reconfigure(**_settings(own))
            register_handler(app)
            _apps[target] = app
        if app._pool is None:
            dsn = str(own["dsn"]) if "dsn" in own else database_dsn()
            if app.settings.dsn != dsn:
                app.reconfigure(dsn=dsn)
        return app


def joins_django_transactions() -> bool:
    """Whether jobs go through Django's connection: unless `JOBBUS["dsn"]` names another database
    than Django's (another server, port, database name or user)."""
    own = config()
    return "dsn" not in own or same_database(str(own["dsn"]), database_dsn())


def same_database(first: str, second: str) -> bool:
    """Whether two libpq DSNs (URIs or key=value strings) name the same database as the same user.

    Each is reduced to (host, port, database, user) with libpq's defaults filled in (`PGHOST`,
    `PGPORT`, `PGUSER`, `PGDATABASE`, else port 5432, the OS user, the user's name); host names
    compare case-insensitively, and ``localhost`` and loopback addresses are one host. A DSN that
    names a ``service`` is the same only as one naming the same service and parameters. The
    password, SSL and timeout parameters are not part of the comparison.
    """
    return _target(first) == _target(second)


def _target(dsn: str) -> tuple[str, ...]:
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "")
    port = ",".join(_port(p) for p in str(params.get("port") or os.environ.get("PGPORT") or "5432").split(","))
    user = str(params.get("user") or os.environ.get("PGUSER") or getpass.getuser())
    dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or user)
    service = str(params.get("service") or os.environ.get("PGSERVICE") or "")
    return (service, ",".join(_host(name) for name in host.split(",")), port, dbname, user)


def _port(text: str) -> str:
    """A port as libpq reads it: a number, leading zeros and blanks aside."""
    text = text.strip()
    return str(int(text)) if text.isdigit() else text


def _host(name: str) -> str:
    name = name.strip().lower().removesuffix(".")
    if name == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return name  # a name, or a socket directory
    return "127.0.0.1" if address.is_loopback else str(address)


def worker_app() -> App:
    """For the CLI's ``--app``: ``jobbus worker --app jobbus.contrib.django:worker_app`` (what
    ``manage.py jobbus worker`` passes)."""
    return get_app()


def connection(using: str | None = None) -> psycopg.Connection[Any]:
    """Django's own psycopg connection (of this thread) to `using`, for ``connection=``.

    Inside ``transaction.atomic()`` a job enqueued on it is part of Django's transaction: it commits
    with it, or is gone when it rolls back. Outside, Django's autocommit applies: it commits at once.
    """
    wrapper = connections[using or database_alias()]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError("jobbus joins Django's transactions through psycopg 3: install psycopg, not psycopg2")
    return raw


def _settings(own: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in own.items() if key not in OWN_KEYS}


def _load(target: str) -> App:
    from django.utils.module_loading import import_string

    found = import_string(target.replace(":", "."))
    if not isinstance(found, App):
        raise TypeError(f"JOBBUS['app'] = {target!r} is not a jobbus.App")
    return found


def migrate_schema(using: str | None = None) -> None:
    """Apply jobbus's pending migrations to the Django database `using` (the Django migration's step)."""
    from jobbus import schema

    with psycopg.connect(database_dsn(using), autocommit=True) as conn:
        schema.migrate(conn, get_app().settings.schema)


def drop_schema(using: str | None = None) -> None:
    """Drop jobbus's schema and every job in it (``manage.py migrate jobbus zero``)."""
    from psycopg import sql

    with psycopg.connect(database_dsn(using), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(get_app().settings.schema)))
