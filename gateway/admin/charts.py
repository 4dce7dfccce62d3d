"""Server-rendered inline SVG line charts (no JavaScript, no CDN)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000 or a < 0.01:
        return f"{v:.2e}"
    return f"{v:.3g}"


def line_chart(
    title: str,
    series: dict[str, Sequence[float | None]],
    *,
    x_labels: Sequence[str] | None = None,
    width: int = 460,
    height: int = 180,
    chart_id: str | None = None,
) -> str:
    """An ``<svg>`` with one polyline per series; ``None`` values are gaps.

    x is the index of a value (a training step, a time bucket); ``x_labels`` names the
    first and last x on the axis."""
    pad_l, pad_r, pad_t, pad_b = 52, 10, 22, 26
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    values = [v for s in series.values() for v in s if v is not None and math.isfinite(v)]
    n = max((len(s) for s in series.values()), default=0)
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    out = [
        f'<svg class="chart"{ident} xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">',
        f'<text x="{pad_l}" y="14" class="ct">{escape(title)}</text>',
        f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" class="cbg"/>',
    ]
    if not values:
        out.append(
            f'<text x="{pad_l + w / 2}" y="{pad_t + h / 2}" text-anchor="middle" '
            'class="cl">no data</text></svg>'
        )
        return "".join(out)
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = lo - (abs(lo) * 0.1 or 1), hi + (abs(hi) * 0.1 or 1)

    def sx(i: int) -> float:
        return pad_l + (w * i / (n - 1) if n > 1 else w / 2)

    def sy(v: float) -> float:
        return pad_t + h - (v - lo) / (hi - lo) * h

    for frac in (0.0, 0.5, 1.0):
        v = lo + (hi - lo) * frac
        y = sy(v)
        out.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y:.1f}" y2="{y:.1f}" class="cg"/>')
        out.append(
            f'<text x="{pad_l - 4}" y="{y + 4:.1f}" text-anchor="end" class="cl">{_fmt(v)}</text>'
        )
    if x_labels:
        out.append(
            f'<text x="{pad_l}" y="{height - 8}" class="cl">{escape(str(x_labels[0]))}</text>'
        )
        out.append(
            f'<text x="{pad_l + w}" y="{height - 8}" text-anchor="end" class="cl">'
            f"{escape(str(x_labels[-1]))}</text>"
        )
    for k, (name, vals) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for i, v in enumerate(vals):
            if v is None or not math.isfinite(v):
                runs.append([])
                continue
            runs[-1].append(f"{sx(i):.1f},{sy(v):.1f}")
        for pts in runs:
            if len(pts) == 1:
                x, y = pts[0].split(",")
                out.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>')
            elif pts:
                out.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.8" '
                    f'points="{" ".join(pts)}"/>'
                )
        if len(series) > 1:
            lx = pad_l + w - 110 * (len(series) - k)
            out.append(f'<rect x="{lx}" y="5" width="10" height="3" fill="{color}"/>')
            out.append(f'<text x="{lx + 13}" y="10" class="cl">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)
