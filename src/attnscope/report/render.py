"""Render a `Report` as Markdown and as one self-contained HTML page (inline CSS, inline SVG).

The HTML fetches nothing and fits one printed A4 or Letter page. Every string that came from an input
file goes through `html.escape` (HTML) or `_md` (Markdown) on its way out; the numbers are formatted
here and nowhere else.
"""

from __future__ import annotations

import html
import math
import re

from attnscope.errors import InputError
from attnscope.report.attribution import FLOP_SHARE_FORMULA, Report

# Muted, print-safe colours; attention is the saturated one because it is what the change touches.
PALETTE = ("#8da0cb", "#e5a15d", "#d99ac4", "#b9b37a", "#a6a6a6", "#7fb3d5", "#c9a27e", "#c6c6e8")
ATTENTION = "#1f7a5a"


# Control characters (C0, DEL, C1) and the bidi controls that reorder what follows them (U+202A-U+202E,
# U+2066-U+2069, U+200E/F, U+061C): shown as a visible <U+XXXX> instead of acting on the page.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Markdown syntax that would make text from an input file into a link, an image, code or a tag.
_MD_SYNTAX = re.compile(r"([\\`*_\[\]!|])")


def _visible(s: object) -> str:
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group()):04X}>", str(s))


def _e(s: object) -> str:
    """HTML-safe text: escaped, control and bidi characters shown as <U+XXXX>."""
    return html.escape(_visible(s), quote=True)


def _md(s: object) -> str:
    """Markdown-safe text: control and bidi characters shown as <U+XXXX>, raw HTML escaped, and every
    character Markdown reads as link, image, code or emphasis syntax (and table pipes) backslash-escaped,
    so no input string becomes a link or a tag."""
    return _MD_SYNTAX.sub(r"\\\1", html.escape(_visible(s), quote=False)).replace("\n", " ")


def _finite(x: float, what: str) -> float:
    """A number an SVG coordinate is computed from; inf or NaN is refused with one line."""
    if not math.isfinite(x):
        raise InputError(f"{what}: expected a finite number to draw, got {x}")
    return x


def _val(x: float, projected: bool = False) -> str:
    """The one format of a time in ms (no unit): measured to 0.1 ms, projected to 0.01 ms. The tables
    and the chart's labels both use it."""
    return f"{x:,.{2 if projected else 1}f}"


def _ms(x: float, nd: int = 1) -> str:
    return f"{_val(x, projected=nd == 2)} ms" if nd in (1, 2) else f"{x:,.{nd}f} ms"


def _pct(x: float, nd: int = 1) -> str:
    return f"{100 * x:.{nd}f}%"


# ------------------------------------------------------------------------------------ shared content


def _workload_rows(r: Report) -> list[tuple[str, str]]:
    w, tg = r.trace.workload, r.trace.targets
    return [
        ("Model", f"{w.model}, {w.params / 1e9:g}B params, {w.dtype}"),
        ("Shape", f"{w.layers} layers · {w.heads} query heads · d = {w.d}"),
        (
            "Load",
            f"C = {w.concurrency} closed-loop · P = {w.prompt_tokens:,} · O = {w.output_tokens:,} tokens",
        ),
        (
            "Targets",
            f"p95 TTFT ≤ {tg.p95_ttft_ms:g} ms · decode ≥ {tg.tokens_per_s:g} tokens/s "
            f"(TPOT ≤ {tg.tpot_ms:g} ms)",
        ),
    ]


def _impact_lines(r: Report) -> list[str]:
    t, b = r.trace, r.boundary
    f = b.f_inner
    rest = t.prefill_ms - r.attention_ms
    return [
        f"f_attn = {r.attention_ms:.1f} / {t.prefill_ms:.1f} = {f:.2f} (rest {1 - f:.2f}), "
        f"S_kernel = {t.speedup:.2f}×",
        f"S_prefill = 1 / ({1 - f:.2f} + {f:.2f} / {t.speedup:.2f}) = {b.inner_speedup:.4f}×",
        f"T_prefill = {rest:.1f} + {r.attention_ms:.1f} / {t.speedup:.2f} = {rest:.1f} + "
        f"{_val(r.attention_ms / t.speedup, projected=True)} = {b.inner_projected_ms:.2f} ms "
        f"({_pct(b.inner_reduction, 2)} reduction)",
        f"T_client = {t.ttft_ms - t.prefill_ms:.1f} (held fixed) + {b.inner_projected_ms:.2f} = "
        f"{b.outer_projected_ms:.2f} ms",
        f"S_client = {t.ttft_ms:.1f} / {b.outer_projected_ms:.2f} = {b.outer_speedup:.4f}× "
        f"({_pct(b.outer_reduction, 2)} reduction)",
    ]


def _verdict_line(r: Report) -> str:
    b, tg = r.boundary, r.trace.targets
    side = "below" if r.projected_meets_target else "above"
    return (
        f"Conditional projection for this single trace: {b.outer_projected_ms:.2f} ms, {side} the "
        f"{tg.p95_ttft_ms:g} ms target; service p95 compliance stays unverified until a post-change "
        "distribution is collected."
    )


def _kernel_short(name: str) -> str:
    """'void ns::kern<...>(...)' -> 'ns::kern': template and argument lists dropped."""
    name = name.removeprefix("void ").strip()
    for ch in "<(":
        name = name.split(ch, 1)[0]
    return name[:60]


def _p95_bounds(s, unit: str, lt: str = "<") -> tuple[str, str, str]:
    """The p95 interval, one-sided upper and lower bounds as text (``lt`` is '<' or its HTML escape)."""
    if s.ci_low is not None and s.ci_high is not None:
        ci = f"[{s.ci_low:.1f}, {s.ci_high:.1f}]{unit}"
    elif s.ci_low is not None:
        ci = f"[{s.ci_low:.1f}{unit}, no upper end]"
    else:
        ci = "none"
    up = f"{s.upper_bound:.1f}{unit}" if s.upper_bound is not None else f"none (n {lt} 59)"
    low = f"{s.lower_bound:.1f}{unit}" if s.lower_bound is not None else "none"
    return ci, up, low


def _profile_text(r: Report) -> tuple[list[str], list[str]]:
    """The --profile evidence, (lines, warnings), for both pages."""
    p = r.profile
    top = ", ".join(f"{_kernel_short(n)} {ms:.1f} ms" for n, ms in p.top) or "none"
    lines = [f"Span: {p.span}, {p.span_ms:.1f} ms; kernels busy {p.busy_ms:.1f} ms ({p.kernels} kernels).",
             f"Attention: {p.attention_ms:.1f} ms in {p.attention_kernels} kernels = {_pct(p.share)} of the "
             f"prefill's kernel time (as `attnscope share`); this share replaces the trace's assumed split. "
             f"Largest: {top}."]
    warns = []
    if abs(p.span_ms - r.trace.prefill_ms) > 0.1 * r.trace.prefill_ms:
        warns.append(f"The profiled span ({p.span_ms:.1f} ms) differs from the trace's prefill "
                     f"({r.trace.prefill_ms:.1f} ms) by more than 10 %: profiler overhead or another shape.")
    return lines, warns


def _evidence_items(r: Report) -> list[tuple[str, list[str], list[str]]]:
    """(heading, lines, warnings) per evidence input given."""
    out = []
    if r.samples is not None:
        s = r.samples
        ci, up, low = _p95_bounds(s, unit=" ms")
        lines = [
            f"n = {s.n}: p50 {s.p50:.1f} ms · p95 {s.p95:.1f} ms · p99 {s.p99:.1f} ms (nearest rank); "
            f"{_pct(s.frac_le_target)} of samples ≤ {s.target_ms:g} ms.",
            f"p95 exact 95 % CI (binomial order statistics, distribution-free): {ci}; one-sided 95 % bounds: "
            f"lower {low}, upper {up}.",
            f"Verdict vs p95 ≤ {s.target_ms:g} ms: {s.verdict.upper()}"
            + (
                f"; about {s.needed:,} samples in total would decide it if the distribution held."
                if s.needed
                else "; the sample size to decide cannot be estimated (observed p95 at the target)."
                if s.verdict == "inconclusive"
                else "."
            ),
        ]
        if s.trace_percentile is not None:
            lines.append(
                f"This trace's {r.trace.ttft_ms:.1f} ms has percentile rank {s.trace_percentile:.0f} % "
                "among the samples."
            )
        out.append(("Client TTFT samples (--samples)", lines, list(s.warnings)))
    if r.metrics:
        lines, warns = [], []
        for m in r.metrics:
            extra = ""
            if m.target_ms is not None:
                extra = f"; p95 ≤ {m.target_ms:g} ms: {m.meets}"
            lines.append(
                f"{m.label} ({m.name}, {m.hist.count:g} obs.): p50 {m.p50_ms:.1f} · p95 {m.p95_ms:.1f} · "
                f"p99 {m.p99_ms:.1f} · mean {m.mean_ms:.1f} ms{extra}"
            )
            if m.warning:
                warns.append(f"{m.label}: {m.warning}.")
        warns.append(
            "Server histograms exclude client network and serialization; quantiles are interpolated "
            "within buckets (histogram_quantile), exact only at bucket edges."
        )
        out.append(("Server histograms, AFTER − BEFORE (--metrics)", lines, warns))
    if r.profile is not None:
        lines, warns = _profile_text(r)
        out.append(("Profiler split (--profile)", lines, warns))
    return out


# ----------------------------------------------------------------------------------------- Markdown


def markdown(r: Report) -> str:
    t, b = r.trace, r.boundary
    L = [
        f"# {_md(t.title)}",
        "",
        "*Latency attribution report (attnscope). One trace; projections are conditional on it.*",
        "",
        "## 1. Workload and targets",
        "",
    ]
    L += [f"- **{k}**: {_md(v)}" for k, v in _workload_rows(r)]
    L += [
        "",
        "## 2. Trace timings",
        "",
        "| Segment | Measurement source | Trace | Share of TTFT | Projected | Notes |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row in r.rows:
        L.append(
            f"| {_md(row.name)} | {_md(row.source)} | {_ms(row.ms)} | {_pct(row.share)} | "
            f"{_ms(row.projected_ms, 2)} | {_md(row.note)} |"
        )
    L.append(
        f"| **Client TTFT (this trace)** | {_md(t.ttft_source)} | **{_ms(t.ttft_ms)}** | 100.0% | "
        f"**{_ms(b.outer_projected_ms, 2)}** | single trace |"
    )
    L.append(
        f"| Decode TPOT | {_md(t.decode_source)} | {_ms(t.tpot_ms)} | | | budget {t.targets.tpot_ms:g} ms |"
    )
    L += ["", "## 3. Observations", ""] + [f"- {_md(o)}" for o in r.observations]
    L += (
        [
            "",
            "## 4. Proposed change",
            "",
            f"{_md(t.change_description)}: S_kernel = {t.speedup:.2f}× on the attention part of "
            f"{_md(t.prefill_segment)} ({r.attention_ms:.1f} ms; split from {_md(r.attention_source)}; "
            f"S from {_md(t.change_source)}).",
            "",
            "## 5. Projected impact (Amdahl, model/amdahl.py)",
            "",
            "```",
        ]
        + _impact_lines(r)
        + ["```", "", _md(_verdict_line(r)), "", "Assumptions:", ""]
        + [f"- {_md(a)}" for a in r.assumptions]
    )
    L += [
        "",
        f"Sensitivity at the prefill boundary, S = {t.speedup:.2f}×:",
        "",
        "| f_attn (time share) | Prefill speedup | Prefill reduction |",
        "| ---: | ---: | ---: |",
    ]
    for p in r.sensitivity:
        mark = " (this trace)" if math.isclose(p.f, b.f_inner, abs_tol=1e-6) else ""
        L.append(f"| {_pct(p.f)}{mark} | {p.speedup:.4f}× | {_pct(p.reduction, 2)} |")
    L += ["", "## 6. Boundary errors to avoid", ""]
    L += [f"- **{_md(k)}**: {_md(v)}" for k, v in r.boundary_errors]
    L += ["", "## 7. Next measurement plan", ""] + [f"- {_md(p)}" for p in r.plan]
    ev = _evidence_items(r)
    if ev:
        L += ["", "## 8. Evidence", ""]
        for head, lines, warns in ev:
            L += (
                [f"**{_md(head)}**", ""]
                + [f"- {_md(x)}" for x in lines]
                + [f"- ⚠ {_md(w)}" for w in warns]
                + [""]
            )
    L += ["", "---", "",
          f"*FLOP share = {_md(FLOP_SHARE_FORMULA)}: dense {r.flop_dense:.3g}, attention "
          f"{r.flop_attn:.3g} FLOPs per prompt token. Amdahl: speedup = 1 / ((1 − f) + f / S), "
          "f a measured time share (model/amdahl.py).*"]
    return "\n".join(L).rstrip() + "\n"


# -------------------------------------------------------------------------------------------- SVG


def _bar_svg(r: Report, width: int = 360) -> str:
    """Stacked TTFT bars, before and after, on one time axis; the prefill split into attention and rest."""
    t, b = r.trace, r.boundary
    left, right, bar_h, top = 40, 46, 22, 16  # the right margin holds a total like "1,018.75"
    for x, what in ((t.ttft_ms, "ttft_ms"), (b.outer_projected_ms, "projected TTFT (check speedup)"),
                    (r.attention_ms, "attention_ms"), (t.targets.p95_ttft_ms, "targets.p95_ttft_ms")):
        _finite(x, what)
    vmax = max(t.ttft_ms, b.outer_projected_ms, t.targets.p95_ttft_ms)  # a slowdown (S < 1) still fits
    scale = (width - left - right) / vmax
    tx = left + t.targets.p95_ttft_ms * scale  # the target line
    colors = {}
    i = 0
    for row in r.rows:
        if row.name != t.prefill_segment:
            colors[row.name] = PALETTE[i % len(PALETTE)]
            i += 1
    rest_color = "#a9d3c0"

    def pieces(after: bool):
        out = []
        for row in r.rows:
            if row.name == t.prefill_segment:
                attn = r.attention_ms / t.speedup if after else r.attention_ms
                out.append((f"{row.name}: attention", attn, ATTENTION))
                out.append((f"{row.name}: rest", row.ms - r.attention_ms, rest_color))
            else:
                out.append((row.name, row.ms, colors[row.name]))
        return out

    parts = []
    for k, (label, after) in enumerate((("Before", False), ("After", True))):
        y = top + k * (bar_h + 10)
        total = b.outer_projected_ms if after else t.ttft_ms
        parts.append(
            f'<text x="{left - 4}" y="{y + bar_h / 2 + 3.5:.1f}" text-anchor="end" class="lbl">{label}</text>'
        )
        x = left
        for name, ms, col in pieces(after):
            w = ms * scale
            parts.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{col}">'
                f"<title>{_e(name)}: {ms:.2f} ms</title></rect>"
            )
            text = _val(ms, projected=after and col == ATTENTION)  # as the tables print it
            if w > 4.6 * len(text) + 4:  # room for the label at 7.5 px
                fg = "#fff" if col == ATTENTION else "#222"
                parts.append(
                    f'<text x="{x + w / 2:.2f}" y="{y + bar_h / 2 + 3.5:.1f}" text-anchor="middle" '
                    f'class="val" fill="{fg}">{text}</text>'
                )
            x += w
        label = _val(total, projected=after)
        lx = x + 3
        if lx - 3 <= tx <= lx + 5 * len(label):  # the target line would cross the total: step past it
            lx = tx + 3
        parts.append(
            f'<text x="{lx:.2f}" y="{y + bar_h / 2 + 3.5:.1f}" class="lbl tot">{label}</text>'
        )
    # axis and target line; its label anchored so it stays inside the chart
    ya = top + 2 * (bar_h + 10) - 4
    tlabel = f"p95 target {t.targets.p95_ttft_ms:g} ms"
    half = 2.5 * len(tlabel)  # 7 pt sans: under 5 px a character
    anchor = "end" if tx + half > width - 2 else ("start" if tx - half < 2 else "middle")
    parts.append(
        f'<line x1="{tx:.2f}" y1="{top - 5}" x2="{tx:.2f}" y2="{ya}" class="target"/>'
        f'<text x="{tx:.2f}" y="{top - 7}" text-anchor="{anchor}" class="tick tgt">{tlabel}</text>'
    )
    for v in _ticks(vmax):
        x = left + v * scale
        parts.append(
            f'<line x1="{x:.2f}" y1="{ya}" x2="{x:.2f}" y2="{ya + 3}" class="axis"/>'
            f'<text x="{x:.2f}" y="{ya + 11}" text-anchor="middle" class="tick">{v:g}</text>'
        )
    parts.append(f'<line x1="{left}" y1="{ya}" x2="{width - right}" y2="{ya}" class="axis"/>')
    # legend: two columns
    legend = [(f"{t.prefill_segment}: attention", ATTENTION), (f"{t.prefill_segment}: rest", rest_color)]
    legend += [(n, c) for n, c in colors.items()]
    col_w = (width - left) / 2
    ly = ya + 23
    for k, (name, col) in enumerate(legend):
        text = name if len(name) <= 40 else name[:39] + "…"
        lx, yy = left + (k % 2) * col_w, ly + (k // 2) * 11
        parts.append(
            f'<rect x="{lx:.1f}" y="{yy - 7}" width="8" height="8" fill="{col}"/>'
            f'<text x="{lx + 11:.1f}" y="{yy}" class="tick">{_e(text)}</text>'
        )
    ly = ly + ((len(legend) - 1) // 2) * 11
    height = ly + 6
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
        f'role="img" aria-label="TTFT segments before and after (ms)">' + "".join(parts) + "</svg>"
    )


def _ticks(vmax: float, n: int = 5) -> list[float]:
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [k * step for k in range(int(vmax / step) + 1)]


def _curve_svg(r: Report, width: int = 360, height: int = 136) -> str:
    """Prefill speedup against attention time share for this S; the operating point and the FLOP-share
    point marked."""
    from attnscope.model import amdahl

    s, b = r.trace.speedup, r.boundary
    for x, what in ((s, "speedup"), (b.inner_speedup, "prefill speedup"), (r.flop_speedup, "FLOP speedup")):
        _finite(x, what)
    if not 1e-6 <= s <= 1e6:
        raise InputError(f"speedup: expected a kernel speedup between 1e-06 and 1e+06 to draw, got {s:g}")
    left, right, top, bottom = 40, 10, 8, 24
    ymax = max(s, 1.0)
    ymin = min(1.0, s)
    ticks_y = [ymin + (ymax - ymin) * k / 4 for k in range(5)]

    def px(f):
        return left + f * (width - left - right)

    def py(v):
        return top + (ymax - v) / (ymax - ymin or 1.0) * (height - top - bottom)

    pts = " ".join(f"{px(k / 100):.1f},{py(amdahl.speedup(k / 100, s)):.1f}" for k in range(101))
    parts = [f'<polyline points="{pts}" class="curve"/>']
    for v in ticks_y:
        parts.append(
            f'<line x1="{left}" y1="{py(v):.1f}" x2="{width - right}" y2="{py(v):.1f}" class="grid"/>'
            f'<text x="{left - 3}" y="{py(v) + 3:.1f}" text-anchor="end" class="tick">{v:.2f}×</text>'
        )
    for k in range(0, 101, 20):
        parts.append(
            f'<text x="{px(k / 100):.1f}" y="{height - bottom + 11}" text-anchor="middle" '
            f'class="tick">{k}%</text>'
        )
    parts.append(
        f'<text x="{(left + width - right) / 2:.1f}" y="{height - 3}" text-anchor="middle" class="tick">'
        f"attention time share of prefill (S = {s:.2f}×)</text>"
    )
    parts.append(f'<text x="9" y="{(top + height - bottom) / 2:.1f}" text-anchor="middle" class="tick" '
                 f'transform="rotate(-90 9 {(top + height - bottom) / 2:.1f})">prefill speedup</text>')
    fx, fy = px(b.f_inner), py(b.inner_speedup)
    gx, gy = px(r.flop_share), py(r.flop_speedup)
    parts.append(
        f'<line x1="{fx:.1f}" y1="{fy:.1f}" x2="{fx:.1f}" y2="{py(ymin):.1f}" class="drop"/>'
        f'<circle cx="{fx:.1f}" cy="{fy:.1f}" r="3.5" class="op"/>'
        f'<circle cx="{gx:.1f}" cy="{gy:.1f}" r="3" class="ghost"/>'
    )
    # a legend in the empty upper-left corner instead of labels that could cross the curve
    lx, ly = left + 8, (top + 10 if s >= 1 else height - bottom - 16)  # the corner the curve leaves empty
    parts.append(
        f'<circle cx="{lx:.1f}" cy="{ly - 3:.1f}" r="3.5" class="op"/>'
        f'<text x="{lx + 7:.1f}" y="{ly:.1f}" class="lbl">this trace: f = {_pct(b.f_inner)} → '
        f"{b.inner_speedup:.4f}×</text>"
        f'<circle cx="{lx:.1f}" cy="{ly + 9:.1f}" r="3" class="ghost"/>'
        f'<text x="{lx + 7:.1f}" y="{ly + 12:.1f}" class="tick">FLOP share {_pct(r.flop_share)} → '
        f"{r.flop_speedup:.3f}× (not a time share: invalid)</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="Amdahl sensitivity curve">' + "".join(parts) + "</svg>"
    )


# ------------------------------------------------------------------------------------------- HTML

CSS = """
@page { margin: 8mm 9mm; }
* { box-sizing: border-box; }
body { font: 7.3pt/1.24 "DejaVu Sans", "Liberation Sans", Helvetica, Arial, sans-serif; color: #1d2329;
       margin: 0 auto; max-width: 190mm; padding: 0; }
header { border-bottom: 2px solid #1d2329; padding-bottom: 2px; margin-bottom: 4px; }
h1 { font-size: 12pt; margin: 0; letter-spacing: -0.01em; }
header .meta { color: #5b6670; font-size: 7pt; }
h2 { font-size: 8pt; margin: 4px 0 1px; text-transform: uppercase; letter-spacing: 0.04em; color: #2b4c6f;
     border-bottom: 1px solid #c9d3dc; padding-bottom: 1px; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 0 12px; }
.grid5 { display: grid; grid-template-columns: 1.22fr 1fr; gap: 0 14px; align-items: start; }
.grid3 { display: grid; grid-template-columns: 1fr 1fr; gap: 0 14px; align-items: start; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 1.2px 4px; border-bottom: 1px solid #e3e8ec; vertical-align: top; text-align: left; }
th { font-weight: 600; color: #44505b; border-bottom: 1px solid #9aa7b3; font-size: 7.2pt; }
td.n, th.n { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: 700; border-top: 1px solid #1d2329; }
.kv td { width: 42%; } .kv th { width: 8%; border: none; color: #5b6670; font-weight: 600; }
.kv td { border: none; }
ul { margin: 1px 0 0; padding-left: 13px; }
li { margin: 0 0 1.5px; }
.math { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 6.9pt; background: #f3f6f8;
        border-left: 3px solid #2b4c6f; padding: 3px 6px; margin: 2px 0 3px; white-space: pre-wrap; }
.verdict { border: 1px solid #2b4c6f; background: #eef3f8; padding: 3px 6px; margin: 3px 0; }
.bad { color: #a3261b; font-weight: 700; }
.good { color: #1f6b3a; font-weight: 700; }
.warn { color: #7a4a00; }
.small { font-size: 7pt; color: #5b6670; }
figure { margin: 2px 0 0; }
figcaption { font-size: 7pt; color: #5b6670; margin-top: 1px; }
svg text { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
svg .lbl { font-size: 8.5px; fill: #1d2329; } svg .tot { font-weight: 700; }
svg .val { font-size: 7.5px; } svg .tick { font-size: 7.5px; fill: #44505b; } svg .tgt { fill: #a3261b; }
svg .axis { stroke: #44505b; stroke-width: 0.8; } svg .grid { stroke: #e3e8ec; stroke-width: 0.8; }
svg .target { stroke: #a3261b; stroke-width: 1; stroke-dasharray: 3 2; }
svg .curve { fill: none; stroke: #2b4c6f; stroke-width: 1.6; }
svg .op { fill: #a3261b; } svg .ghost { fill: #fff; stroke: #7a4a00; stroke-width: 1.2; }
svg .drop { stroke: #a3261b; stroke-width: 0.8; stroke-dasharray: 2 2; }
.sub { font-weight: 600; color: #2b4c6f; margin-top: 3px; }
.sens th { width: 31%; white-space: nowrap; border-bottom: 1px solid #e3e8ec; } .sens td { width: 23%; }
table.segs th:nth-child(1) { width: 21%; } table.segs th:nth-child(2) { width: 27%; }
.grid > div > div + div { margin-top: 2px; }
table.hist td, table.hist th { padding: 0.5px 3px; white-space: nowrap; }
footer { margin-top: 5px; border-top: 1px solid #c9d3dc; padding-top: 2px; font-size: 6.8pt; color: #5b6670; }
@media screen { body { padding: 12px; } }
"""


def _table(head, rows, total=None, cls: str = "", after=()) -> str:
    """An HTML table; each cell is (text, numeric): numeric cells right-aligned. ``total`` is bold."""
    def tr(row, tag="td", klass=""):
        cells = "".join(f'<{tag} class="n">{_e(c)}</{tag}>' if num else f"<{tag}>{_e(c)}</{tag}>"
                        for c, num in row)
        return f'<tr class="{klass}">{cells}</tr>' if klass else f"<tr>{cells}</tr>"

    body = [tr(row) for row in rows] + ([tr(total, klass="total")] if total else []) + [tr(a) for a in after]
    return f'<table class="{cls}"><thead>{tr(head, "th")}</thead><tbody>{"".join(body)}</tbody></table>'


def _ul(items, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return "<ul>" + "".join(f"<li{c}>{x}</li>" for x in items) + "</ul>"


def _evidence_html(r: Report) -> str:
    """Section 8, compact enough to share the page: samples and profile left, histograms right."""
    left, right = [], []
    if r.samples is not None:
        s = r.samples
        ci, up, low = _p95_bounds(s, unit="", lt="&lt;")
        cls = {"accept": "good", "reject": "bad"}.get(s.verdict, "warn")
        need = (
            f" About {s.needed:,} samples in all would decide it if the distribution held."
            if s.needed
            else ""
        )
        where = (
            f" This trace's {r.trace.ttft_ms:.1f} ms has percentile rank {s.trace_percentile:.0f} %."
            if s.trace_percentile is not None
            else ""
        )
        left.append(
            f"<div><b>Client TTFT samples</b> (n = {s.n}): p50 {s.p50:.1f} · p95 {s.p95:.1f} · "
            f"p99 {s.p99:.1f} ms (nearest rank). p95 exact 95 % CI (binomial order statistics) {ci} ms; "
            "one-sided 95 % bounds "
            f'{low} / {up} ms. Verdict on p95 ≤ {s.target_ms:g} ms: <span class="{cls}">{s.verdict.upper()}'
            f'</span>.{_e(need)}{_e(where)} <span class="warn">{_e(" ".join(s.warnings))}</span></div>'
        )
    if r.profile is not None:
        lines, warns = _profile_text(r)
        left.append(f"<div><b>Profiler split</b>: {_e(' '.join(lines))}"
                    f' <span class="warn">{_e(" ".join(warns))}</span></div>')
    if r.metrics:
        rows = [[(m.label, False), (f"{m.hist.count:,.0f}", True)]
                + [(f"{v:.1f}", True) for v in (m.p50_ms, m.p95_ms, m.p99_ms, m.mean_ms)]
                + [("" if m.meets is None else f"{m.meets} ({m.target_ms:g})", False)] for m in r.metrics]
        warns = [f"{m.label}: {m.warning}." for m in r.metrics if m.warning]
        warns.append("Server-side: no client network or serialization; quantiles interpolated within "
                     "buckets.")
        head = [("Histogram", False)] + [(c, True) for c in ("Obs.", "p50", "p95", "p99", "Mean")] \
            + [("p95 ≤ target", False)]
        right.append("<div><b>vLLM histograms, AFTER − BEFORE</b> (ms)" + _table(head, rows, cls="hist")
                     + f'<span class="warn">{_e(" ".join(warns))}</span></div>')
    if not left and not right:
        return ""
    if left and right:
        return (
            f'<h2>8 · Evidence</h2><div class="grid"><div>{"".join(left)}</div>'
            f"<div>{''.join(right)}</div></div>"
        )
    return f'<h2>8 · Evidence</h2><div class="grid">{"".join(left + right)}</div>'


def html_page(r: Report, source: str = "the spec's Document QA trace") -> str:
    t, b, tg = r.trace, r.boundary, r.trace.targets
    seg_rows = [[(x.name, False), (x.source, False), (_val(x.ms), True), (_pct(x.share), True),
                 (_val(x.projected_ms, projected=True), True), (x.note, False)] for x in r.rows]
    decode_row = ([("Decode TPOT", False), (t.decode_source, False), (_val(t.tpot_ms), True), ("", True),
                   ("", True), (f"per token; budget {tg.tpot_ms:g} ms", False)],)
    head = [("Serial segment", False), ("Measurement source", False), ("Trace ms", True), ("Share", True),
            ("Projected", True), ("Notes", False)]
    total = [("Client TTFT (this trace)", False), (t.ttft_source, False), (_val(t.ttft_ms), True),
             ("100.0%", True), (_val(b.outer_projected_ms, projected=True), True), ("single trace", False)]
    segs = _table(head, seg_rows, total=total, cls="segs", after=decode_row)
    obs = [_e(o) for o in r.observations]
    ttft_cls = "good" if r.ttft_meets_target else "bad"
    tpot_cls = "good" if r.tpot_meets_target else "bad"
    status = (
        f'TTFT <span class="{ttft_cls}">{t.ttft_ms:.1f} ms</span> vs {tg.p95_ttft_ms:g} ms target · '
        f'TPOT <span class="{tpot_cls}">{t.tpot_ms:.1f} ms</span> vs {tg.tpot_ms:g} ms · '
        f"projected TTFT <b>{b.outer_projected_ms:.2f} ms</b> ({b.outer_speedup:.4f}×) · p95 compliance: "
    )
    if r.samples is None:
        status += "unknown (single trace)"
    else:
        cls = {"accept": "good", "reject": "bad"}.get(r.samples.verdict, "warn")
        status += f'<span class="{cls}">{r.samples.verdict}</span> from {r.samples.n} samples'
    cells = [
        (
            _pct(p.f, 0) + (" (trace)" if math.isclose(p.f, b.f_inner, abs_tol=1e-6) else ""),
            f"{p.speedup:.4f}×",
            _pct(p.reduction, 2),
        )
        for p in r.sensitivity
    ]
    sens = (
        '<table class="sens"><tr><th>f_attn (time)</th>'
        + "".join(f'<td class="n">{_e(c[0])}</td>' for c in cells)
        + "</tr><tr><th>S_prefill</th>"
        + "".join(f'<td class="n">{_e(c[1])}</td>' for c in cells)
        + "</tr><tr><th>Prefill reduction</th>"
        + "".join(f'<td class="n">{_e(c[2])}</td>' for c in cells)
        + "</tr></table>"
    )
    errors = [f"<b>{_e(k)}.</b> {_e(v)}" for k, v in r.boundary_errors]
    evidence = _evidence_html(r)
    wl = _workload_rows(r)
    kv = "".join(
        f"<tr><th>{_e(wl[i][0])}</th><td>{_e(wl[i][1])}</td><th>{_e(wl[i + 1][0])}</th>"
        f"<td>{_e(wl[i + 1][1])}</td></tr>"
        for i in range(0, len(wl), 2)
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(t.title)}</title><style>{CSS}</style></head><body>",
        f'<header><h1>{_e(t.title)}</h1><div class="meta">Latency attribution report (attnscope) · '
        f"input: {_e(source)}</div></header>",
        f'<div class="verdict">{status}</div>',
        f'<h2>1 · Workload &amp; targets</h2><table class="kv">{kv}</table>',
        f"<h2>2 · Trace timings (serial critical path)</h2>{segs}",
        f'<div class="grid3"><div><h2>3 · Observations</h2>{_ul(obs)}',
        "<h2>4 · Proposed change</h2>"
        f"<div>{_e(t.change_description)}: <b>S_kernel = {t.speedup:.2f}×</b> on the attention part of "
        f"{_e(t.prefill_segment)} ({r.attention_ms:.1f} ms). Split: {_e(r.attention_source)}. "
        f"S: {_e(t.change_source)}.</div></div>",
        f"<div><figure>{_bar_svg(r)}<figcaption>Client TTFT by segment (ms), this trace, before and "
        "after the change.</figcaption></figure></div></div>",
        '<div class="grid5"><div><h2>5 · Projected impact (Amdahl)</h2>'
        f'<div class="math">{_e(chr(10).join(_impact_lines(r)))}</div>'
        f"<div>{_e(_verdict_line(r))}</div>"
        f'<div class="small">Assumes: {_e("; ".join(r.assumptions))}.</div></div>',
        f"<div><figure>{_curve_svg(r)}</figure>"
        f'<div class="sub">Sensitivity at the prefill boundary, S = {t.speedup:.2f}×</div>{sens}</div></div>',
        '<div class="grid"><div><h2>6 · Boundary errors to avoid</h2>' + _ul(errors) + "</div>",
        "<div><h2>7 · Next measurement plan</h2>" + _ul([_e(p) for p in r.plan]) + "</div></div>",
        evidence,
        f"<footer>FLOP share = {_e(FLOP_SHARE_FORMULA)}. Amdahl: 1 / ((1 − f) + f / S), f a time share."
        "</footer>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
