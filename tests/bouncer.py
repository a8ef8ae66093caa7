"""A real PgBouncer in transaction-pooling mode in front of the test server, started by the tests."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
    )


@contextlib.contextmanager
def pgbouncer(server_dsn: str) -> Iterator[str]:
    """Yield a DSN like `server_dsn` but through PgBouncer (pool_mode = transaction)."""
    binary = pgbouncer_binary()
    assert binary, "pgbouncer is not installed"
    target = conninfo_to_dict(server_dsn)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(tempfile.mkdtemp(prefix="jobbus-bouncer-"))
    root.chmod(0o777)
    user = "postgres" if os.geteuid() == 0 and _user_exists("postgres") else None
    (root / "userlist.txt").write_text('"postgres" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target.get('host', '127.0.0.1')} port={target.get('port', 5432)}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root / 'userlist.txt'}\n"
        "pool_mode = transaction\nmax_client_conn = 500\ndefault_pool_size = 8\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {root / 'pgbouncer.log'}\npidfile = {root / 'pgbouncer.pid'}\n"
    )
    for f in root.iterdir():
        f.chmod(0o666)
    process = subprocess.Popen([binary, str(root / "pgbouncer.ini")], user=user)
    dsn = make_conninfo(server_dsn, host="127.0.0.1", port=str(port))
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(dsn, connect_timeout=2, prepare_threshold=None):
                    break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
        yield dsn
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
