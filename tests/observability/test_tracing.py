"""OpenTelemetry: `create {queue}` and `process {queue}` spans, linked through the trace context the job carries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import jobbus
from jobbus.models import TRACE_KEY
from tests.conftest import FAST


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider for this test alone (the global one is never set, so other tests see none)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield exporter
    provider.shutdown()


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_the_process_span_continues_the_create_span_of_its_job(dsn: str, exporter: InMemorySpanExporter) -> None:
    app = jobbus.App(dsn=dsn, **FAST)
    seen: dict[str, Any] = {}

    @app.job("mail.send", queue="mail")
    async def send(job: jobbus.JobExecution) -> None:
        seen["execution_data"] = job.execution_data
        with trace.get_tracer_provider().get_tracer("app").start_as_current_span("smtp"):
            pass

    async with app:
        with trace.get_tracer_provider().get_tracer("app").start_as_current_span("request") as request:
            job_id = await app.schedule("mail.send", {"to": "a@example.com"}, queue="mail")
        assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False) == 0
        job = await app.find(job_id)
    assert job is not None and job.status is jobbus.JobStatus.COMPLETED
    assert seen["execution_data"] == {}  # the carrier is not the handler's business
    assert TRACE_KEY in job.execution_data

    (create,) = spans(exporter, "create mail")
    (process,) = spans(exporter, "process mail")
    (smtp,) = spans(exporter, "smtp")
    assert create.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert create.parent is not None and create.parent.span_id == request.get_span_context().span_id
    assert process.context.trace_id == create.context.trace_id == request.get_span_context().trace_id
    assert process.parent is not None and process.parent.span_id == create.context.span_id
    assert smtp.parent is not None and smtp.parent.span_id == process.context.span_id
    assert dict(create.attributes or {}) == {
        "messaging.system": "jobbus",
        "messaging.destination.name": "mail",
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.message.id": str(job_id),
        "jobbus.job.type": "mail.send",
    }
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "jobbus"
    assert attributes["messaging.destination.name"] == "mail"
    assert attributes["messaging.message.id"] == str(job_id)
    assert attributes["jobbus.job.type"] == "mail.send"
    assert attributes["jobbus.job.attempt"] == 1
    assert attributes["jobbus.job.outcome"] == "completed"


class ReportMissingError(Exception):
    pass


async def test_each_failed_attempt_records_its_exception_and_checkpoints_keep_the_context(
    dsn: str, exporter: InMemorySpanExporter
) -> None:
    app = jobbus.App(dsn=dsn, **FAST)

    @app.job("report.render", max_attempts=2)
    async def render(job: jobbus.JobExecution) -> None:
        await job.checkpoint({"page": job.attempt})
        raise ReportMissingError(f"attempt {job.attempt}: report 7 is missing (api_key=SVspan)")

    async with app:
        job_id = await app.schedule("report.render", {})
        assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False) == 0
        job = await app.find(job_id)
    assert job is not None and job.status is jobbus.JobStatus.FAILED
    assert job.execution_data["page"] == 2

    (create,) = spans(exporter, "create default")
    attempts = sorted(spans(exporter, "process default"), key=lambda s: s.start_time or 0)
    assert [dict(s.attributes or {})["jobbus.job.outcome"] for s in attempts] == ["retried", "failed"]
    for number, span in enumerate(attempts, start=1):
        assert span.parent is not None and span.parent.span_id == create.context.span_id
        assert span.status.status_code is StatusCode.ERROR
        (event,) = [e for e in span.events if e.name == "exception"]
        assert str(dict(event.attributes or {})["exception.type"]).endswith("ReportMissingError")
        attributes = dict(event.attributes or {})
        assert f"attempt {number}" in str(attributes["exception.message"])
        # What the job's history keeps of the error, secrets masked: nothing more leaves in a span.
        assert attributes["exception.message"] == job.history[number - 1]["error"]
        assert attributes["exception.stacktrace"] == job.history[number - 1]["traceback"]
        assert "SVspan" not in str(attributes) + str(span.status.description)


async def test_a_batch_gets_one_create_span_per_queue_and_every_job_its_context(
    dsn: str, exporter: InMemorySpanExporter
) -> None:
    async with jobbus.App(dsn=dsn) as app:
        with trace.get_tracer_provider().get_tracer("app").start_as_current_span("import"):
            ids = await app.schedule_many(
                [jobbus.JobRequest("a", {}, queue="q1"), jobbus.JobRequest("b", {}, queue="q1"), ("c", {})]
            )
            big = await app.schedule_many("bulk", [{} for _ in range(1500)], queue="q2")
    (q1,) = spans(exporter, "create q1")
    (q2,) = spans(exporter, "create q2")
    (default,) = spans(exporter, "create default")
    assert dict(default.attributes or {})["jobbus.job.type"] == "c"
    assert "jobbus.job.type" not in dict(q1.attributes or {})
    assert dict(q1.attributes or {})["messaging.batch.message_count"] == 2
    assert dict(q2.attributes or {})["messaging.batch.message_count"] == 1500
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT execution_data -> '_trace' ->> 'traceparent' FROM jobbus.job WHERE id = ANY(%s)",
            ([*ids, big[0], big[-1]],),
        ).fetchall()
    assert all(row[0] and row[0].split("-")[1] == format(q1.context.trace_id, "032x") for row in rows)


async def test_without_a_tracer_provider_nothing_is_written(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        job_id = await app.schedule("a", {})
        job = await app.find(job_id)
    assert job is not None and job.execution_data == {}


async def test_spans_of_a_sync_handler_are_children_of_its_attempt(dsn: str, exporter: InMemorySpanExporter) -> None:
    app = jobbus.App(dsn=dsn, **FAST)

    @app.job("resize")
    def resize(job: jobbus.SyncJobExecution) -> None:
        with trace.get_tracer_provider().get_tracer("app").start_as_current_span("pillow"):
            pass

    async with app:
        await app.schedule("resize", {})
        assert await app.run_worker(stop_when_empty=True, install_signal_handlers=False) == 0
    (process,) = spans(exporter, "process default")
    (pillow,) = spans(exporter, "pillow")
    assert pillow.parent is not None and pillow.parent.span_id == process.context.span_id
