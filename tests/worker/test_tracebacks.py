"""Every attempt that raised keeps its traceback in the job's history: chained, bounded, redacted."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jobbus
from jobbus import JobStatus
from jobbus.redaction import MASK, redact_text
from jobbus.settings import redact
from jobbus.worker.outcomes import MAX_TRACEBACK_BYTES, traceback_text


async def drain(app: jobbus.App, **options: Any) -> int:
    options = {"stop_when_empty": True, "concurrency": 2} | options
    return await jobbus.Worker(app, **options).run()


class LookupFailed(Exception):
    pass


async def test_each_failed_attempt_stores_its_chained_traceback_and_a_completed_one_none(app: jobbus.App) -> None:
    @app.job("chained")
    async def chained(job: jobbus.JobExecution) -> str:
        if job.attempt == 3:
            return "done"
        customers: dict[str, str] = {}
        try:
            customers["customer"]
        except KeyError as exc:
            raise LookupFailed(f"attempt {job.attempt}: no customer") from exc
        return "unreachable"

    @app.job("refused")
    async def refused(job: jobbus.JobExecution) -> None:
        raise jobbus.NonRetryableError("the order was deleted")

    job_id = await app.schedule("chained", max_attempts=3)
    refused_id = await app.schedule("refused")
    assert await drain(app) == 0

    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED
    assert [entry["outcome"] for entry in job.history] == ["retried", "retried", "completed"]
    for number, entry in enumerate(job.history[:2], start=1):
        trace = entry["traceback"]
        assert trace.startswith("Traceback (most recent call last):")
        assert "KeyError: 'customer'" in trace
        assert "The above exception was the direct cause of the following exception" in trace
        assert f"LookupFailed: attempt {number}: no customer" in trace.rstrip().splitlines()[-1]
        assert "in chained" in trace
    assert "traceback" not in job.history[-1]  # a completed attempt stores none

    failed = await app.find(refused_id)
    assert failed is not None and failed.status is JobStatus.FAILED
    assert "NonRetryableError: the order was deleted" in failed.history[-1]["traceback"]


async def test_a_huge_traceback_is_cut_to_16_kib_keeping_its_tail(app: jobbus.App) -> None:
    @app.job("deep")
    async def deep(job: jobbus.JobExecution) -> None:
        def down(n: int) -> None:
            if n == 0:
                raise ValueError("the bottom " + "é" * 12000)
            down(n - 1)

        try:
            down(40)
        except ValueError as exc:
            raise RuntimeError("gave up at the end") from exc

    job_id = await app.schedule("deep", max_attempts=1)
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    trace = job.history[-1]["traceback"]
    assert len(trace.encode()) <= MAX_TRACEBACK_BYTES
    assert trace.splitlines()[0] == "... (cut to its last 16,384 bytes)"
    assert trace.rstrip().endswith("RuntimeError: gave up at the end")  # the tail is what is kept


@pytest.mark.timeout(60)  # a guard, not a measure: before the fix, masking this message took minutes
async def test_a_100_kib_message_is_cut_to_its_tail_and_masked_without_stalling_the_worker(app: jobbus.App) -> None:
    @app.job("huge")
    async def huge(job: jobbus.JobExecution) -> None:
        raise ValueError("x" * (100 * 1024) + " via postgresql://billing:hunter2@db.internal/billing api_key=ak_99")

    job_id = await app.schedule("huge", max_attempts=1)
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    trace = job.history[-1]["traceback"]
    assert len(trace.encode()) <= MAX_TRACEBACK_BYTES and "cut to its last" in trace.splitlines()[0]
    assert trace.rstrip().endswith(f"postgresql://billing:{MASK}@db.internal/billing api_key={MASK}")
    assert "hunter2" not in trace and "ak_99" not in trace


@pytest.mark.timeout(60)
def test_masking_takes_time_linear_in_long_words() -> None:
    word = "x" * 200_000
    assert redact_text(f"{word} secret={word}") == f"{word} secret={MASK}"
    assert redact(f"{word}x://{word} postgresql://u:pw@h") == f"{word}x://{word} postgresql://u:***@h"
    assert redact_text("a1" * 100_000 + " token: t") == "a1" * 100_000 + f" token: {MASK}"


async def test_secrets_in_a_traceback_are_masked_as_the_dashboard_masks_them(app: jobbus.App) -> None:
    @app.job("leaky")
    async def leaky(job: jobbus.JobExecution) -> None:
        raise ConnectionError(
            "cannot reach postgresql://billing:hunter2@db.internal/billing (password=s3cr3t api_key=ak_live_123)"
        )

    job_id = await app.schedule("leaky", max_attempts=1)
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None
    trace = job.history[-1]["traceback"]
    assert "ConnectionError" in trace and "db.internal/billing" in trace
    for secret in ("hunter2", "s3cr3t", "ak_live_123"):
        assert secret not in trace


def test_formatting_survives_a_hostile_exception_and_nul_characters() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    assert "Hostile" in traceback_text(Hostile())
    text = traceback_text(ValueError("a\x00b \ud800"))
    assert "\x00" not in text
    text.encode("utf-8")  # storable: no unpaired surrogate left


#: Secret values; the mask's own character is left out (a "secret" of "•" is found in the mask).
_SECRETS = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Z"), blacklist_characters="'\"/?#[]@:,;&)}*•"),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(_SECRETS, st.text(max_size=30))
def test_redacted_text_never_keeps_a_dsn_password_or_a_secret_value(secret: str, around: str) -> None:
    assert f":{secret}@" not in redact_text(f"{around} postgresql://user:{secret}@host:5432/db {around}")
    assert secret not in redact_text(f"password={secret}").removeprefix("password=")
    # A secret ending in a backslash escapes its closing quote: masked to the end of the line.
    assert redact_text(f"{around}, api_key: '{secret}'").endswith((f"api_key: '{MASK}'", f"api_key: '{MASK}"))


async def test_a_retry_logs_one_line_and_a_final_failure_the_traceback_it_stored(
    app: jobbus.App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.job("flaky")
    async def flaky(job: jobbus.JobExecution) -> None:
        raise ConnectionError(f"cannot reach postgresql://billing:SVpw@db/billing token={'SV' * 1000} " + "x" * 100_000)

    caplog.set_level(logging.DEBUG, logger="jobbus.worker")
    job_id = await app.schedule("flaky", max_attempts=2)
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    records = [record for record in caplog.records if str(job_id) in record.getMessage()]
    assert all(record.exc_info is None for record in records)  # never formatted again from the exception
    assert all("SV" not in record.getMessage() and len(record.getMessage()) < 24 * 1024 for record in records)
    [retry] = [record for record in records if record.levelno == logging.WARNING]
    assert "\n" not in retry.getMessage() and retry.getMessage().endswith(job.history[0]["error"])
    [trace] = [record for record in records if record.levelno == logging.DEBUG and "traceback" in record.msg]
    assert trace.getMessage().endswith(job.history[0]["traceback"].rstrip("\n"))
    [final] = [record for record in records if record.levelno == logging.ERROR]
    assert final.getMessage().endswith(job.history[1]["traceback"].rstrip("\n"))


async def test_a_job_scope_that_fails_on_exit_is_logged_masked_and_bounded(
    app: jobbus.App, caplog: pytest.LogCaptureFixture
) -> None:
    @contextlib.asynccontextmanager
    async def scope(job: jobbus.JobExecution) -> AsyncIterator[None]:
        yield None
        raise RuntimeError("session close failed: password=SVscope " + "x" * 1_000_000)

    app.job_scope = scope

    @app.job("fine")
    async def fine(job: jobbus.JobExecution) -> str:
        return "done"

    job_id = await app.schedule("fine")
    assert await drain(app) == 0
    [record] = [record for record in caplog.records if "exiting the job scope failed" in record.getMessage()]
    assert record.exc_info is None and str(job_id) in record.getMessage()
    assert "SVscope" not in record.getMessage() and len(record.getMessage()) < 24 * 1024
