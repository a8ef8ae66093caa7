"""Encryption at rest (SPEC 22) seen from the server: on a throwaway cluster that logs every statement with
its parameters, the clear text of an encrypted job reaches neither the server's log nor any WAL record,
while the clear text of a job scheduled without keys is found in both (the search can find what it seeks)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg

import jobbus
from jobbus import schema
from jobbus.encryption import generate_key
from tests.cluster import throwaway_cluster
from tests.conftest import FAST


def wal_bytes(data: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted((data / "pg_wal").iterdir()) if path.is_file())


async def test_the_clear_text_reaches_no_wal_record_and_no_statement_the_server_sees() -> None:
    sealed_word, clear_word = f"sealed-{uuid.uuid4().hex}", f"clear-{uuid.uuid4().hex}"
    with throwaway_cluster() as cluster:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET log_statement = 'all'")
            conn.execute("ALTER SYSTEM SET log_min_duration_statement = 0")
            conn.execute("SELECT pg_reload_conf()")
            schema.migrate(conn, "jobbus")
        app = jobbus.App(dsn=cluster.dsn, encryption_keys=[generate_key()], **FAST)
        plain = jobbus.App(dsn=cluster.dsn, **FAST)
        seen: list[Any] = []

        @app.job("wal.job")
        async def handler(job: jobbus.JobExecution) -> Any:
            seen.append(dict(job.configuration))
            await job.checkpoint({"checkpoint": sealed_word})
            await job.step("step", lambda: sealed_word)
            return {"result": sealed_word}

        async with app:
            await app.schedule("wal.job", {"word": sealed_word})
            await app.schedule_many("wal.job", [{"word": sealed_word, "n": n} for n in range(300)])  # COPY
            await app.schedule(
                "wal.job", {"first": sealed_word}, then=jobbus.JobRequest("wal.job", {"then": sealed_word})
            )
            while await app.drain(concurrency=8):
                pass
        async with plain:
            await plain.schedule("wal.other", {"word": clear_word})
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
            conn.execute("SELECT pg_switch_wal()")
        assert len(seen) == 303 and {"word": sealed_word} in seen  # the handlers read the clear text
        wal = wal_bytes(cluster.data)
        log = (cluster.root / "log").read_bytes()
        assert clear_word.encode() in wal and clear_word.encode() in log  # the search works
        assert sealed_word.encode() not in wal
        assert sealed_word.encode() not in log
