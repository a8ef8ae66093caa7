"""Charts drawn on the server as inline SVG: no script, no build step, nothing fetched by the browser."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH = 360
HEIGHT = 90
PAD = 4


def line_chart(title: str, values: Sequence[float | None], *, unit: str = "", css_class: str = "") -> Markup:
    """A line over `values` (one per bucket, oldest first; None = no sample), its title, and the latest
    and highest values."""
    points = [v for v in values if v is not None]
    top = max(points, default=0.0) or 1.0
    n = max(len(values) - 1, 1)
    coords = []
    for i, value in enumerate(values):
        if value is None:
            continue
        x = PAD + i * (WIDTH - 2 * PAD) / n
        y = HEIGHT - PAD - (value / top) * (HEIGHT - 2 * PAD)
        coords.append(f"{x:.1f},{y:.1f}")
    latest = _fmt(points[-1], unit) if points else "no samples"
    peak = _fmt(max(points), unit) if points else ""
    polyline = f'<polyline fill="none" points="{" ".join(coords)}"/>' if coords else ""
    if coords:  # the latest value as a dot, so a single sample shows too
        last_x, last_y = coords[-1].split(",")
        polyline += f'<circle cx="{last_x}" cy="{last_y}" r="3"/>'
    return Markup(
        '<figure class="chart {cls}"><figcaption>{title} <span class="latest">{latest}</span>'
        '<span class="peak">{peak}</span></figcaption>'
        '<svg viewBox="0 0 {w} {h}" role="img" aria-label="{title}, last hour">'
        '<line class="axis" x1="0" y1="{base}" x2="{w}" y2="{base}"/>{polyline}</svg></figure>'
    ).format(
        cls=css_class,
        title=title,
        latest=latest,
        peak=f"max {peak}" if peak else "",
        w=WIDTH,
        h=HEIGHT,
        base=HEIGHT - PAD,
        polyline=Markup(polyline),
    )


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        if value >= 3600:
            return f"{value / 3600:.1f} h"
        if value >= 60:
            return f"{value / 60:.1f} min"
        return f"{value:.1f} s"
    return f"{value:,.0f}{unit}"


__all__ = ["escape", "line_chart"]
