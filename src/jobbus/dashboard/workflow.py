"""What the job page shows of a workflow: its durable steps as rows, and why a parked job waits.

The step names follow `jobbus.execution`: a handler's own steps by their names, `sleep:NAME` for
`job.sleep` (result `{"until": ...}`), `event:KEY` for `job.wait_for_event` (`{"until": ...}` while it
waits, then `{"payload": ...}` or `{"timed_out": true}`). A parked attempt's history entry says what it
waits for in `waiting_for`: the sleep's step name, `event KEY` or `children`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobbus.models import Job
from jobbus.store.dashboard import STEP_RESULT_BYTES, StepRow

#: A step's result is previewed in at most this many characters.
PREVIEW_CHARS = 160
#: `available_at` of a job parked without a deadline: the schema's `never()`, an instant (read in the
#: session's time zone it may fall on the last day of 8999).
NEVER = datetime(9000, 1, 1, tzinfo=UTC)


def parked_without_deadline(at: datetime) -> bool:
    return at >= NEVER


@dataclass(frozen=True, slots=True)
class StepView:
    name: str
    #: step, sleep or event
    kind: str
    #: done, sleeping, woke, waiting, received or timed out
    state: str
    #: A preview of the result, or what the wait received.
    detail: str
    #: The moment a sleep or a wait ends (None: not one, or no deadline).
    until: datetime | None
    attempt: int
    at: datetime


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a parked attempt waits: "sleeping until X", "waiting for event E", "waiting for 3 children"."""

    text: str
    until: datetime | None = None


def step_views(rows: list[StepRow], results: Any, now: datetime) -> list[StepView]:
    """The rows of the steps table; `results` is what the redaction hook left of {name: result} (when
    it left no mapping, each row shows that instead of a result)."""
    views = []
    for row in rows:
        kind, name = _kind(row.name)
        if not isinstance(results, Mapping):
            views.append(_view(row, name, kind, "", preview(results), None))
            continue
        value = results.get(row.name)
        if kind == "sleep":
            until = _until(value)
            views.append(_view(row, name, kind, "sleeping" if until and until > now else "woke", "", until))
        elif kind == "event" and isinstance(value, Mapping) and "payload" in value:
            views.append(_view(row, name, kind, "received", preview(value["payload"]), None))
        elif kind == "event" and isinstance(value, Mapping) and value.get("timed_out"):
            views.append(_view(row, name, kind, "timed out", "", None))
        elif kind == "event":
            views.append(_view(row, name, kind, "waiting", "", _until(value)))
        elif row.size > STEP_RESULT_BYTES:
            views.append(_view(row, name, kind, "done", f"({row.size:,} bytes, not shown)", None))
        else:
            views.append(_view(row, name, kind, "done", preview(value), None))
    return views


def waiting_reason(
    entry: Mapping[str, Any], *, current: bool, job: Job, steps: Mapping[str, StepRow], active: int | None
) -> Reason | None:
    """What a history entry of a parked attempt waited for; `current`: the job is parked in it now."""
    what = entry.get("waiting_for")
    if entry.get("outcome") != "waiting" or not isinstance(what, str):
        return None
    deadline = job.available_at if current and not parked_without_deadline(job.available_at) else None
    if what.startswith("sleep:"):
        step = steps.get(what)
        until = _until(step.result) if step else deadline
        return Reason(f"sleeping ({what[6:]})" if current else f"slept ({what[6:]})", until)
    if what.startswith("event "):
        step = steps.get("event:" + what[6:])
        until = _until(step.result) if step else deadline
        return Reason(f"{'waiting' if current else 'waited'} for event {what[6:]}", until)
    if what == "children":
        if not current:
            return Reason("waited for its children")
        if active is None:
            return Reason("waiting for its children")
        return Reason(f"waiting for {active:,} child{'' if active == 1 else 'ren'}")
    return Reason(f"{'waiting' if current else 'waited'} for {what}", deadline)


def preview(value: Any) -> str:
    """A value as compact JSON, cut to `PREVIEW_CHARS`."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _kind(name: str) -> tuple[str, str]:
    for prefix in ("sleep:", "event:"):
        if name.startswith(prefix):
            return prefix[:-1], name[len(prefix) :]
    return "step", name


def _view(row: StepRow, name: str, kind: str, state: str, detail: str, until: datetime | None) -> StepView:
    return StepView(name, kind, state, detail, until, row.attempt, row.created_at)


def _until(value: Any) -> datetime | None:
    """The deadline of a sleep's or a wait's step ({"until": ISO text}); None without one."""
    text = value.get("until") if isinstance(value, Mapping) else None
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
