"""An App that worker subprocesses load with `--app tests.encryption_apps:app`: its keys come from
JOBBUS_ENCRYPTION_KEYS, and its handler writes every kind of payload (checkpoint, step result, result)."""

from __future__ import annotations

from typing import Any

import jobbus

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)


@app.job("enc.echo")
async def echo(job: jobbus.JobExecution) -> Any:
    configuration = dict(job.configuration)
    await job.checkpoint({"seen": configuration})
    stepped = await job.step("copy", lambda: configuration)
    return {"echo": stepped, "checkpoint": job.execution_data}
