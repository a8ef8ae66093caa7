"""A DSN naming several hosts works everywhere a DSN does: the first host here is a server that is gone
(a failed primary), the second the test database, as after a failover."""

from __future__ import annotations

import json
import socket
import uuid

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import jobbus
from tests.cli import jobbus as run_jobbus
from tests.cli import start_worker
from tests.processes import finish


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def multi_host(dsn: str, form: str) -> str:
    """`dsn` behind a first host that refuses connections, in key/value or URL form."""
    params = conninfo_to_dict(dsn)
    host, port = str(params.get("host", "127.0.0.1")), str(params.get("port", ""))  # "" is libpq's default
    if form == "keyword":
        return make_conninfo(
            dsn, host=f"127.0.0.1,{host}", port=f"{_closed_port()},{port}", target_session_attrs="read-write"
        )
    if host.startswith("/"):
        pytest.skip("the URL form of this test needs a test server on TCP, not a Unix socket")
    return (
        f"postgresql://{params.get('user', 'postgres')}@127.0.0.1:{_closed_port()},{host}:{port or 5432}"
        f"/{params['dbname']}?target_session_attrs=read-write&connect_timeout=5"
    )


@pytest.mark.parametrize("form", ["keyword", "url"])
def test_cli_producers_and_workers_take_a_dsn_naming_several_hosts(dsn: str, form: str) -> None:
    several = multi_host(dsn, form)
    migrate = run_jobbus(several, "migrate")
    assert migrate.returncode == 0, migrate.stderr
    scheduled = run_jobbus(several, "schedule", "noop")
    assert scheduled.returncode == 0, scheduled.stderr
    app = jobbus.App(dsn=several)
    with app.sync:
        second = app.sync.schedule("noop")
    worker = start_worker(several, "w-hosts", "--stop-when-empty")
    code, output = finish(worker)
    assert code == 0, output
    with app.sync:
        for job_id in (uuid.UUID(scheduled.stdout.strip()), second):
            job = app.sync.find(job_id)
            assert job is not None and job.status is jobbus.JobStatus.COMPLETED, job
    status = run_jobbus(several, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert {q["queue"] for q in json.loads(status.stdout)["queues"]} >= {"default"}
