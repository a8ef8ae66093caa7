import jobbus


async def test_schedule_and_find(app: jobbus.App) -> None:
    job_id = await app.schedule("t", {"a": 1})
    job = await app.find(job_id)
    assert job is not None and job.status is jobbus.JobStatus.QUEUED
