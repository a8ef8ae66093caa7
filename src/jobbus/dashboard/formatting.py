"""How the dashboard writes values (moments, durations, counts, ids, arguments, progress, charts) and
reads an id back from its URLs.

Pure functions: the templates use the short ones as Jinja2 filters, the pages the others.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from jobbus.dashboard.charts import Range, line_chart
from jobbus.dashboard.security import Redactor
from jobbus.store.dashboard import Series
from jobbus.store.views import Count

#: How much of a job's configuration the jobs list shows.
PREVIEW_CHARS = 120


def progress(current: float | None, total: float | None) -> float | None:
    if current is None or not total:
        return None
    return max(0.0, min(100.0, current * 100.0 / total))


def charts(series: Series, range_: Range) -> list[Any]:
    by_bucket = {p.bucket: p for p in series.points}
    points = [by_bucket.get(i) for i in range(range_.buckets)]
    lines: list[tuple[str, list[float | None], str, str]] = [
        (f"Completed per {range_.per}", [p.completed if p else None for p in points], "", "ok"),
        (f"Failed per {range_.per}", [p.failed if p else None for p in points], "", "bad"),
        ("Queue depth (available)", [p.available if p else None for p in points], "", "depth"),
        ("Longest wait", [p.oldest_available_seconds or 0.0 if p else None for p in points], "s", "wait"),
    ]
    return [
        line_chart(title, values, since=series.since, range_=range_, unit=unit, css_class=css)
        for title, values, unit, css in lines
    ]


def range_totals(series: Series, range_: Range) -> dict[str, Any]:
    """The jobs finished in the chosen range, by outcome, and since when the samples cover it (a
    leader that started an hour ago has no samples of the day before)."""
    completed = sum(p.completed for p in series.points)
    failed = sum(p.failed for p in series.points)
    first = min((p.first_sampled_at for p in series.points), default=None)
    partial = first is None or (first - series.since).total_seconds() > range_.step
    return {
        "processed": completed + failed,
        "completed": completed,
        "failed": failed,
        "cancelled": sum(p.cancelled for p in series.points),
        "covered_since": first if partial else None,
        "sampled": first is not None,
    }


def preview(redact: Redactor, configuration: dict[str, Any] | str | None, stored_bytes: int) -> str:
    """A job's arguments on one line, redacted first, then cut (the template escapes it); a placeholder
    (a payload sealed with a key not held) as it is."""
    if configuration is None:
        return f"({stored_bytes / 1024:.0f} KiB)"
    if isinstance(configuration, str):
        return configuration
    text = json.dumps(redact("configuration", configuration), sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def ago(value: datetime | None) -> str:
    if value is None:
        return "—"
    elapsed = (datetime.now(UTC) - value).total_seconds()
    if elapsed < 0:
        return "in " + seconds(-elapsed)
    return seconds(elapsed) + " ago"


def next_run(value: datetime) -> str:
    """When a queued job runs: "runs in 5 min", or "due 3 s ago" once it is available."""
    elapsed = (datetime.now(UTC) - value).total_seconds()
    return f"due {seconds(elapsed)} ago" if elapsed >= 0 else f"runs in {seconds(-elapsed)}"


def when(value: datetime | str | None) -> str:
    """A moment as the command line shows it in UTC: 2026-12-02 02:00:00Z (history entries hold ISO text)."""
    if isinstance(value, str):
        text = value
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            return text
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def instant(value: str | None) -> str:
    """A logged line's moment in UTC to the millisecond, 2026-12-02 02:00:00.250Z (lines come fast)."""
    if value is None:
        return "—"
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return str(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def bounded(value: int, bound: int) -> str:
    """A count read up to `bound`: exact below it, "> bound - 1" at it (a lower bound, said so)."""
    return str(Count(value, estimated=True, at_least=True) if value >= bound else Count(value))


def count(value: int | Count) -> str:
    """1,234; a `Count` as it says it is (≈ 1,234 for an estimate, > 10,000 for a lower bound)."""
    return str(value) if isinstance(value, Count) else f"{value:,}"


def seconds(value: float | timedelta | None) -> str:
    if value is None:
        return "—"
    total = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(total):
        return "—"
    if total < 1:
        return f"{total * 1000:.0f} ms"
    if total < 120:
        return f"{total:.0f} s"
    if total < 7200:
        return f"{total / 60:.0f} min"
    if total < 172800:
        return f"{total / 3600:.1f} h"
    return f"{total / 86400:.1f} d"


def short_id(value: uuid.UUID) -> str:
    """A UUIDv7 shortened to what tells jobs apart: its first 8 digits (time) and its last 6 (random)."""
    text = str(value)
    return f"{text[:8]}…{text[-6:]}"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def compact(value: Any) -> str:
    """JSON on one line (an audit entry's details)."""
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False, separators=(", ", ": "))


def parse_uuid(value: Any) -> uuid.UUID | None:
    """The id a URL or form field holds, or None when it holds none (or not a UUID)."""
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None
