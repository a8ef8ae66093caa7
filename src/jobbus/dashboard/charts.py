"""Charts drawn on the server as inline SVG: no script, no build step, nothing fetched by the browser.

Each chart has a time axis (labels in UTC at round instants of its range) and a count axis (a scale
from 0 to a round number above the highest value, with grid lines).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from markupsafe import Markup, escape

WIDTH = 360
HEIGHT = 130
LEFT = 40  # room for the scale's labels
RIGHT = 8
TOP = 8
BOTTOM = 18  # room for the time labels


@dataclass(frozen=True, slots=True)
class Range:
    """A range of the overview's charts: `buckets` buckets of `step` seconds, time labels every `tick`."""

    key: str
    label: str
    step: int
    buckets: int
    tick: int
    tick_format: str

    @property
    def seconds(self) -> int:
        return self.step * self.buckets

    @property
    def per(self) -> str:
        """What one bucket is, for the charts' titles: "minute", "10 min", "hour"."""
        return {60: "minute", 3600: "hour"}.get(self.step, f"{self.step // 60} min")


#: The ranges offered on the overview. The leader keeps every sample of the last hour and one row per
#: queue and 10 minutes for seven days (jobbus.worker.services.queue_stats), so each range reads at
#: most about 1,400 rows per queue.
RANGES = {
    "1h": Range("1h", "1 h", 60, 60, 15 * 60, "%H:%M"),
    "24h": Range("24h", "24 h", 600, 144, 6 * 3600, "%H:%M"),
    "7d": Range("7d", "7 d", 3600, 168, 86400, "%a %d"),
}


def line_chart(
    title: str,
    values: Sequence[float | None],
    *,
    since: datetime,
    range_: Range,
    unit: str = "",
    css_class: str = "",
) -> Markup:
    """A line over `values` (one per bucket of `range_`, oldest first, the first starting at `since`;
    None = no sample) with its axes, its title, and the latest and highest values."""
    points = [v for v in values if v is not None]
    top = _nice(max(points, default=0.0), unit)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    n = max(len(values), 1)

    def y_of(value: float) -> float:
        return TOP + plot_h - (value / top) * plot_h

    coords = [
        f"{LEFT + (i + 0.5) * plot_w / n:.1f},{y_of(value):.1f}" for i, value in enumerate(values) if value is not None
    ]
    parts: list[str] = []
    for fraction in (0.0, 0.5, 1.0):  # the scale: 0, half, top, each with a grid line
        y = y_of(top * fraction)
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}"/>')
        label = escape(_fmt(top * fraction, unit, short=True))
        parts.append(f'<text class="y" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{label}</text>')
    end = since + timedelta(seconds=range_.seconds)
    tick = _first_tick(since, range_.tick)
    while tick <= end:
        x = LEFT + (tick - since).total_seconds() / range_.seconds * plot_w
        parts.append(f'<line class="tick" x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 3}"/>')
        if LEFT + 14 <= x <= WIDTH - RIGHT - 14:  # a label that would not fit inside is left out
            label = escape(tick.strftime(range_.tick_format))
            parts.append(f'<text class="x" x="{x:.1f}" y="{HEIGHT - 4}" text-anchor="middle">{label}</text>')
        tick += timedelta(seconds=range_.tick)
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}"/>')
    if coords:
        parts.append(f'<polyline fill="none" points="{" ".join(coords)}"/>')
        last_x, last_y = coords[-1].split(",")  # the latest value as a dot, so a single sample shows too
        parts.append(f'<circle cx="{last_x}" cy="{last_y}" r="3"/>')
    latest = _fmt(points[-1], unit) if points else "no samples"
    peak = f"max {_fmt(max(points), unit)}" if points else ""
    return Markup(
        '<figure class="chart {cls}"><figcaption>{title} <span class="latest">{latest}</span>'
        '<span class="peak">{peak}</span></figcaption>'
        '<svg viewBox="0 0 {w} {h}" role="img" aria-label="{title}, last {range} (UTC)">{body}</svg></figure>'
    ).format(
        cls=css_class,
        title=title,
        latest=latest,
        peak=peak,
        range=range_.label,
        w=WIDTH,
        h=HEIGHT,
        body=Markup("".join(parts)),
    )


def _first_tick(since: datetime, every: int) -> datetime:
    """The first round instant (a multiple of `every` seconds since the epoch, UTC) at or after `since`."""
    epoch = since.timestamp()
    return datetime.fromtimestamp(math.ceil(epoch / every) * every, UTC)


def _nice(value: float, unit: str) -> float:
    """The top of the scale: 1, 2 or 4 times a power of ten at or above `value`, at least 2, so that its
    middle is a whole number too (for durations, a round number of seconds, minutes or hours)."""
    if value <= 0:
        return 2.0  # an empty chart's scale: 0, 1, 2
    if unit == "s":
        for top in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400):
            if value <= top:
                return float(top)
        return math.ceil(value / 86400) * 86400.0
    if value <= 2:
        return 2.0  # a count's scale has a whole number at its middle
    power = 10.0 ** math.floor(math.log10(value))
    for factor in (1, 2, 4, 10):
        if value <= factor * power:
            return float(factor * power)
    return 10.0 * power  # pragma: no cover - the loop always returns


def _fmt(value: float, unit: str, *, short: bool = False) -> str:
    if unit == "s":
        if value >= 3600:
            return f"{value / 3600:.1f} h" if not short else f"{value / 3600:g} h"
        if value >= 60:
            return f"{value / 60:.1f} min" if not short else f"{value / 60:g} min"
        return f"{value:.1f} s" if not short else f"{value:g} s"
    if short and value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if short and value >= 10_000:
        return f"{value / 1000:g}k"
    if short and value != int(value):
        return f"{value:g}"
    return f"{value:,.0f}{unit}"


__all__ = ["RANGES", "Range", "escape", "line_chart"]
