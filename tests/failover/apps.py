"""The app that worker processes run in the failover tests: every run goes to a ledger file.

The ledger is a file (`FAILOVER_LEDGER`), not a table, so that it survives the primary it
would otherwise have been written to. Each line is one event of one run, written with a single
`write` on a file opened for appending, so lines of concurrent workers never interleave.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

import jobbus

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)
# Its own queue, so that ticks are claimed beside the backlog; every tick enqueued (`overlap=True`).
app.periodic("failover-tick", type="ledger", every=timedelta(seconds=1), queue="ticks", overlap=True)


def note(event: str, job: jobbus.JobExecution) -> None:
    line = (
        f"{event} {job.id} {job.attempt} {job.lease_token} {job.name or '-'} "
        f"{job.available_at.timestamp()!r} {time.time()!r}\n"
    )
    fd = os.open(os.environ["FAILOVER_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.job("ledger")
async def ledger(job: jobbus.JobExecution) -> dict[str, Any]:
    """Note the start, sleep `sleep` seconds, note the end; the result names the run that wrote it."""
    note("start", job)
    await asyncio.sleep(float(job.configuration.get("sleep", 0.02)))
    note("end", job)
    return {"lease_token": str(job.lease_token), "attempt": job.attempt}
