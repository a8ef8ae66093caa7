"""The embedded PostgreSQL (the `embedded` extra): zero-setup for the demo and the test suite.

Production always names a real server; this exists so a new user on a bare laptop can run
`jobbus demo` and the tests without installing PostgreSQL.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger("jobbus.embedded")

_servers: dict[Path, Any] = {}


def start_embedded(data_dir: Path, *, announce: bool = True) -> str:
    """Start (or join) the embedded server for `data_dir` and return its DSN; it stops at exit."""
    with warnings.catch_warnings():
        _ignore_runtime_dir_warning()
        try:
            import pgserver
        except ImportError:
            raise RuntimeError(
                "no database given (dsn / JOBBUS_DSN) and the embedded PostgreSQL is not installed: "
                "pip install 'jobbus[embedded]', or point JOBBUS_DSN at a server"
            ) from None
        data_dir = data_dir.resolve()
        if data_dir not in _servers:
            data_dir.mkdir(parents=True, exist_ok=True)
            _servers[data_dir] = pgserver.get_server(  # type: ignore[attr-defined]
                data_dir, cleanup_mode="stop"
            )
        if announce:
            print(f"jobbus: using the embedded PostgreSQL in {data_dir}", file=sys.stderr)
    uri: str = _servers[data_dir].get_uri()
    return uri


def _ignore_runtime_dir_warning() -> None:
    """pgserver keeps its lock file and socket in platformdirs' runtime directory; where there is no
    private XDG_RUNTIME_DIR (root, containers, CI) platformdirs warns about its fallback on every run,
    which tells a demo user nothing they can act on."""
    try:
        from platformdirs import RuntimeDirWarning
    except ImportError:  # platformdirs before the warning existed, or pgserver without it
        return
    warnings.simplefilter("ignore", RuntimeDirWarning)
