"""Charts as inline SVG, drawn on the server (no chart framework, no script): a line chart of one
or more series over time, with its scale and time span labelled."""

from __future__ import annotations

import time
from typing import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 320, 90
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 34, 6, 8, 16
COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def line_chart(title: str, series: dict[str, Sequence[tuple[float, float]]], *, unit: str = "",
               span: float | None = None, now: float | None = None) -> Markup:
    """An SVG line chart: `series` maps a label to (unix time, value) points, oldest first.

    `span` (seconds) fixes the time axis to the last `span` seconds (else the data's extent)."""
    now = time.time() if now is None else now
    points = [p for pts in series.values() for p in pts]
    t1 = now if span else max((t for t, _ in points), default=now)
    t0 = t1 - span if span else min((t for t, _ in points), default=t1 - 1)
    if t1 <= t0:
        t0 = t1 - 1
    top = max((v for _, v in points), default=0.0)
    top = top * 1.1 if top > 0 else 1.0
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM

    def x(t: float) -> float:
        return PAD_LEFT + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return PAD_TOP + plot_h - (v / top) * plot_h

    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH - PAD_RIGHT}" y2="{PAD_TOP + plot_h}" '
        'stroke="#999" stroke-width="1"/>',
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{PAD_TOP + plot_h}" stroke="#999" stroke-width="1"/>',
        f'<text x="{PAD_LEFT - 3}" y="{PAD_TOP + 8}" text-anchor="end" font-size="9">{escape(_fmt(top))}</text>',
        f'<text x="{PAD_LEFT - 3}" y="{PAD_TOP + plot_h}" text-anchor="end" font-size="9">0</text>',
        f'<text x="{PAD_LEFT}" y="{HEIGHT - 3}" font-size="9">-{escape(_span_label(t1 - t0))}</text>',
        f'<text x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 3}" text-anchor="end" font-size="9">now'
        f'{escape(" " + unit if unit else "")}</text>',
    ]
    for i, (label, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        inside = [(t, v) for t, v in pts if t0 <= t <= t1]
        if len(inside) == 1:
            t, v = inside[0]
            parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2" fill="{color}"/>')
        elif inside:
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in inside)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}">'
                         f"<title>{escape(label)}</title></polyline>")
        if len(series) > 1:
            parts.append(f'<text x="{PAD_LEFT + 4 + 70 * i}" y="{PAD_TOP + 8}" font-size="9" fill="{color}">'
                         f"{escape(label)}</text>")
    if not points:
        parts.append(f'<text x="{PAD_LEFT + plot_w / 2}" y="{PAD_TOP + plot_h / 2}" text-anchor="middle" '
                     'font-size="10" fill="#777">no data yet</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _span_label(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.0f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
