"""The embedded PostgreSQL (the `embedded` extra): zero-setup for the demo and the test suite.

Production always names a real server; this exists so a new user on a bare laptop can run
`jobbus demo` and the tests without installing PostgreSQL.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger("jobbus.embedded")

_servers: dict[Path, Any] = {}


def start_embedded(data_dir: Path, *, announce: bool = True) -> str:
    """Start (or join) the embedded server for `data_dir` and return its DSN; it stops at exit."""
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
