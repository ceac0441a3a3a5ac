"""The report's two figures as plain SVG shapes; the HTML template draws them (escaping every text).

- `bar(report)`: client TTFT as stacked segments, before and after the change, on one time axis; the
  prefill split into attention and the rest, the p95 target as a dashed line.
- `curve(report)`: Amdahl's prefill speedup against the attention time share for this S, with the
  trace's operating point and the (invalid) FLOP-share point.

Labels on the bars use attribution.val, the tables' format; no label is clipped at the chart's edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnscope.errors import InputError
from attnscope.model import amdahl
from attnscope.report.attribution import pct, val

# Muted, print-safe colours; attention is the saturated one because it is what the change touches.
PALETTE = ("#8da0cb", "#e5a15d", "#d99ac4", "#b9b37a", "#a6a6a6", "#7fb3d5", "#c9a27e", "#c6c6e8")
ATTENTION, REST = "#1f7a5a", "#a9d3c0"
CHAR_PX = 5.0  # a generous width of one 7.5 px sans character, for keeping labels inside the chart


@dataclass(frozen=True)
class Shape:
    tag: str
    attrs: tuple[tuple[str, str], ...]
    text: str = ""
    title: str = ""  # a tooltip


@dataclass(frozen=True)
class Figure:
    kind = "figure"
    label: str  # aria-label
    caption: str
    width: int
    height: float
    shapes: tuple[Shape, ...]


def _s(tag: str, text: str = "", title: str = "", **attrs) -> Shape:
    """A shape; attribute names drop a trailing '_' and turn '_' into '-', floats print to 0.01."""
    return Shape(tag, tuple((k.rstrip("_").replace("_", "-"), f"{v:.2f}" if isinstance(v, float) else str(v))
                            for k, v in attrs.items()), text, title)


def _finite(pairs) -> None:
    for x, what in pairs:
        if not math.isfinite(x):
            raise InputError(f"{what}: expected a finite number to draw, got {x}")


def _ticks(vmax: float, n: int = 5) -> list[float]:
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [k * step for k in range(int(vmax / step) + 1)]


def bar(r, width: int = 360) -> Figure:
    """Stacked TTFT bars, before and after (module docstring)."""
    t, b = r.trace, r.boundary
    left, right, bar_h, top = 40, 46, 19, 16  # the right margin holds a total like "1,018.75"
    _finite(((t.ttft_ms, "ttft_ms"), (b.outer_projected_ms, "projected TTFT (check speedup)"),
             (r.attention_ms, "attention_ms"), (t.targets.p95_ttft_ms, "targets.p95_ttft_ms")))
    vmax = max(t.ttft_ms, b.outer_projected_ms, t.targets.p95_ttft_ms)  # a slowdown (S < 1) still fits
    scale = (width - left - right) / vmax
    tx = left + t.targets.p95_ttft_ms * scale  # the target line
    others = [row.name for row in r.rows if row.name != t.prefill_segment]
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(others)}
    out = []
    for k, (label, after) in enumerate((("Before", False), ("After", True))):
        y, x = top + k * (bar_h + 8), left
        ymid = y + bar_h / 2 + 3.5
        out.append(_s("text", label, x=left - 4, y=ymid, text_anchor="end", class_="lbl"))
        for row in r.rows:
            if row.name == t.prefill_segment:
                attn = r.attention_ms / t.speedup if after else r.attention_ms
                pieces = [(f"{row.name}: attention", attn, ATTENTION), (f"{row.name}: rest",
                                                                        row.ms - r.attention_ms, REST)]
            else:
                pieces = [(row.name, row.ms, colors[row.name])]
            for name, ms, col in pieces:
                w = ms * scale
                out.append(_s("rect", title=f"{name}: {ms:.2f} ms", x=float(x), y=y, width=w, height=bar_h,
                              fill=col))
                text = val(ms, projected=after and col == ATTENTION)  # as the tables print it
                if w > 4.6 * len(text) + 4:  # room for the label
                    out.append(_s("text", text, x=x + w / 2, y=ymid, text_anchor="middle", class_="val",
                                  fill="#fff" if col == ATTENTION else "#222"))
                x += w
        total = val(b.outer_projected_ms if after else t.ttft_ms, projected=after)
        lx = x + 3
        if lx - 3 <= tx <= lx + CHAR_PX * len(total):  # the target line would cross the total: step past
            lx = tx + 3
        out.append(_s("text", total, x=float(lx), y=ymid, class_="lbl tot"))
    ya = top + 2 * (bar_h + 8) - 3  # the axis; the target's label anchored to stay inside the chart
    tlabel = f"p95 target {t.targets.p95_ttft_ms:g} ms"
    half = CHAR_PX / 2 * len(tlabel)
    anchor = "end" if tx + half > width - 2 else ("start" if tx - half < 2 else "middle")
    out += [_s("line", x1=tx, y1=top - 5, x2=tx, y2=ya, class_="target"),
            _s("text", tlabel, x=tx, y=top - 7, text_anchor=anchor, class_="tick tgt")]
    for v in _ticks(vmax):
        x = left + v * scale
        out += [_s("line", x1=float(x), y1=ya, x2=float(x), y2=ya + 3, class_="axis"),
                _s("text", f"{v:g}", x=float(x), y=ya + 11, text_anchor="middle", class_="tick")]
    out.append(_s("line", x1=left, y1=ya, x2=width - right, y2=ya, class_="axis"))
    legend = [(f"{t.prefill_segment}: attention", ATTENTION), (f"{t.prefill_segment}: rest", REST)]
    legend += list(colors.items())
    for k, (name, col) in enumerate(legend):  # two columns of at most 34 characters (160 px)
        lx, yy = left + (k % 2) * (width - left) / 2, ya + 23 + (k // 2) * 11
        out += [_s("rect", x=float(lx), y=yy - 7, width=8, height=8, fill=col),
                _s("text", name if len(name) <= 34 else name[:33] + "…", x=lx + 11, y=yy, class_="tick")]
    height = ya + 29 + ((len(legend) - 1) // 2) * 11
    return Figure("TTFT segments before and after (ms)",
                  "Client TTFT by segment (ms), before and after the change.", width, height,
                  tuple(out))


def curve(r, width: int = 360, height: int = 118) -> Figure:
    """Prefill speedup against attention time share (module docstring)."""
    s, b = r.trace.speedup, r.boundary
    _finite(((s, "speedup"), (b.inner_speedup, "prefill speedup"), (r.flop_speedup, "FLOP speedup")))
    if not 1e-6 <= s <= 1e6:
        raise InputError(f"speedup: expected a kernel speedup between 1e-06 and 1e+06 to draw, got {s:g}")
    left, right, top, bottom = 40, 10, 8, 24
    ymax, ymin = max(s, 1.0), min(1.0, s)

    def px(f):
        return left + f * (width - left - right)

    def py(v):
        return top + (ymax - v) / (ymax - ymin or 1.0) * (height - top - bottom)

    pts = " ".join(f"{px(k / 100):.1f},{py(amdahl.speedup(k / 100, s)):.1f}" for k in range(101))
    out = [_s("polyline", points=pts, class_="curve")]
    for v in (ymin + (ymax - ymin) * k / 4 for k in range(5)):
        out += [_s("line", x1=left, y1=py(v), x2=width - right, y2=py(v), class_="grid"),
                _s("text", f"{v:.2f}×", x=left - 3, y=py(v) + 3, text_anchor="end", class_="tick")]
    out += [_s("text", f"{k}%", x=px(k / 100), y=height - bottom + 11, text_anchor="middle", class_="tick")
            for k in range(0, 101, 20)]
    ymid = (top + height - bottom) / 2
    fx, fy, gx, gy = px(b.f_inner), py(b.inner_speedup), px(r.flop_share), py(r.flop_speedup)
    lx, ly = left + 8, (top + 10 if s >= 1 else height - bottom - 16)  # the corner the curve leaves empty
    out += [
        _s("text", f"attention time share of prefill (S = {s:.2f}×)", x=(left + width - right) / 2,
           y=height - 3, text_anchor="middle", class_="tick"),
        _s("text", "prefill speedup", x=9, y=ymid, text_anchor="middle", class_="tick",
           transform=f"rotate(-90 9 {ymid:.1f})"),
        _s("line", x1=fx, y1=fy, x2=fx, y2=py(ymin), class_="drop"),
        _s("circle", cx=fx, cy=fy, r=3.5, class_="op"),
        _s("circle", cx=gx, cy=gy, r=3, class_="ghost"),
        # a legend in the empty corner instead of labels that could cross the curve
        _s("circle", cx=float(lx), cy=ly - 3.0, r=3.5, class_="op"),
        _s("text", f"this trace: f = {pct(b.f_inner)} → {b.inner_speedup:.4f}×", x=lx + 7.0, y=float(ly),
           class_="lbl"),
        _s("circle", cx=float(lx), cy=ly + 9.0, r=3, class_="ghost"),
        _s("text", f"FLOP share {pct(r.flop_share)} → {r.flop_speedup:.3f}× (not a time share: invalid)",
           x=lx + 7.0, y=ly + 12.0, class_="tick"),
    ]
    return Figure("Amdahl sensitivity curve", "", width, height, tuple(out))
