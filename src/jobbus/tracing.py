"""OpenTelemetry tracing (extra `otel`, the API only): a PRODUCER span per scheduled batch and queue, a
CONSUMER span per attempt that continues the producer's trace.

Nothing happens until the application configures a tracer provider (the SDK, an exporter): without one,
or without `opentelemetry-api` installed, `schedule` writes no trace context and the worker starts no
span, so the cost is one check per call.

The producer's context travels in the job itself, under the reserved key `_trace` of its
`execution_data` (a W3C `traceparent`, and `tracestate` when there is one). It is written by the same
INSERT as the job (no extra round trip), kept by checkpoints, and never shown to the handler: the claim
takes it out of `execution_data` before the handler sees it. Span names and attributes follow the
messaging semantic conventions: `create {queue}` / `process {queue}`, `messaging.system = "jobbus"`,
`messaging.destination.name`, `messaging.message.id` (the job id), `messaging.operation.type`, and
`jobbus.job.type`, `jobbus.job.attempt`; a failed attempt records its exception and an error status.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jobbus.models import TRACE_KEY, ClaimedJob, JobSpec, SharedSpecs, options_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - depends on the installed extras
    trace = None  # type: ignore[assignment]
# `opentelemetry.propagate` is imported on first use: importing it loads the propagators that the
# environment names, which an application that never traces should not pay for.

SYSTEM = "jobbus"
#: Outcomes of an attempt that mark its span as an error.
ERROR_OUTCOMES = frozenset({"failed", "retried", "timed_out"})


def current_tracer() -> Tracer | None:
    """The jobbus tracer, or None when no tracer provider is configured (then tracing costs nothing).

    The worker asks once per claim (not per job: without a provider, OpenTelemetry looks the
    environment up on every call), so a provider configured while it runs serves its next claim."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        return None
    return provider.get_tracer("jobbus")


@contextlib.contextmanager
def producing(specs: Sequence[JobSpec]) -> Iterator[Sequence[JobSpec]]:
    """Around the insert of `specs`: one `create {queue}` span per queue of the batch, ended when the jobs
    are written; yields the specs carrying their span's context."""
    tracer = current_tracer()
    if tracer is None or not specs:
        yield specs
        return
    from opentelemetry import propagate

    by_queue: Mapping[str, Sequence[JobSpec]]
    if isinstance(specs, SharedSpecs):  # one queue and one type, no JobSpec made per job
        by_queue = {specs.template.queue: specs}
    else:
        grouped: dict[str, list[JobSpec]] = {}
        for spec in specs:
            grouped.setdefault(spec.queue, []).append(spec)
        by_queue = grouped
    base = otel_context.get_current()
    spans: list[Span] = []
    carriers: dict[str, str] = {}
    try:
        for queue, batch in by_queue.items():
            attributes: dict[str, Any] = {
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue,
                "messaging.operation.type": "create",
                "messaging.operation.name": "create",
            }
            if len(batch) == 1:
                attributes["messaging.message.id"] = str(batch[0].id)
            else:
                attributes["messaging.batch.message_count"] = len(batch)
            types = {s.type for s in options_of(batch)}
            if len(types) == 1:
                attributes["jobbus.job.type"] = next(iter(types))
            # One span per queue, siblings under the caller's span.
            span = tracer.start_span(f"create {queue}", context=base, kind=SpanKind.PRODUCER, attributes=attributes)
            spans.append(span)
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=trace.set_span_in_context(span, base))
            if carrier:
                carriers[queue] = json.dumps({TRACE_KEY: carrier})
        if isinstance(specs, SharedSpecs):
            yield replace(specs, template=replace(specs.template, execution=carriers.get(specs.template.queue)))
        else:
            yield [replace(s, execution=carriers.get(s.queue)) for s in specs]
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        for span in spans:
            span.end()


@contextlib.contextmanager
def processing(job: ClaimedJob, tracer: Tracer) -> Iterator[Span]:
    """Around one attempt: a `process {queue}` CONSUMER span, child of the producer's span when the job
    carries its context, current while the handler runs."""
    from opentelemetry import propagate

    parent = propagate.extract(job.trace_context) if job.trace_context else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": job.queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(job.id),
        "jobbus.job.type": job.type,
        "jobbus.job.attempt": job.attempts,
    }
    with tracer.start_as_current_span(
        f"process {job.queue}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def attempt_ended(
    span: Span | None,
    outcome: str,
    error: BaseException | None,
    stored_error: str | None = None,
    stored_traceback: str | None = None,
) -> None:
    """Record how the attempt ended on its span: the outcome, and the exception of a failed attempt as
    the worker stored it (`stored_error`, `stored_traceback`: secrets masked, bounded), so a span
    carries no more of an error than the job's history, and formatting it costs nothing more."""
    if span is None:
        return
    span.set_attribute("jobbus.job.outcome", outcome)
    if error is not None and outcome != "completed":
        module, name = type(error).__module__, type(error).__qualname__
        span.add_event(  # what `Span.record_exception` writes, from the stored texts
            "exception",
            {
                "exception.type": f"{module}.{name}" if module and module != "builtins" else name,
                "exception.message": stored_error or name,
                "exception.stacktrace": stored_traceback or "",
                "exception.escaped": "False",
            },
        )
    if outcome in ERROR_OUTCOMES:
        span.set_status(Status(StatusCode.ERROR, stored_error or outcome))


__all__ = ["TRACE_KEY", "attempt_ended", "current_tracer", "processing", "producing"]
