"""A real App with cells (`JOBBUS_CELLS`, `JOBBUS_QUEUE_CELLS`) that worker subprocesses load with
`--app tests.placed_cells_app:app`: its handlers, and a periodic job of the `reports` queue, are declared
once on the App and served in every cell."""

from __future__ import annotations

from datetime import timedelta

import jobbus

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)


@app.job("noop")
async def noop(job: jobbus.JobExecution) -> None:
    return None


@app.job("report", queue="reports")
async def report(job: jobbus.JobExecution) -> dict[str, str]:
    return {"rendered": str(job.id)}


app.periodic("reports.every-second", type="report", every=timedelta(seconds=1))
