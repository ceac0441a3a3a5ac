"""The report as one document: sections of paragraphs, lists, tables and figures, built once.

`build(report, source)` turns a `Report` (attribution.py) into a `Document`; render.py writes the same
`Document` as Markdown and as HTML, so every sentence and every number is formatted here, once, and the
two pages cannot disagree; `Document.data` holds the same numbers unformatted (`report --json`). The
blocks are plain data: text is unescaped (each renderer escapes it on the way out) and a figure is a
list of SVG shapes (figures.py) that only the HTML draws; its numbers are in the tables and the text of
the same section.

Layout hints the HTML uses and the Markdown ignores: a section's `aside` sits beside its blocks, a
`half` section shares a row with its neighbour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from attnscope.report import figures
from attnscope.report.attribution import FLOP_SHARE_FORMULA, Report, pct, val


@dataclass(frozen=True)
class Run:
    """A piece of text; style is "" (plain), "b" (bold), "good", "bad", "undecided" (coloured, bold) or
    "warn" (a caveat: coloured on the page, marked ⚠ in Markdown)."""

    text: str
    style: str = ""


def para(*parts) -> tuple[Run, ...]:
    """Runs from strings (plain) and (text, style) pairs."""
    return tuple(Run(p) if isinstance(p, str) else Run(*p) for p in parts)


@dataclass(frozen=True)
class Paragraph:
    kind: ClassVar[str] = "para"
    runs: tuple[Run, ...]
    small: bool = False


@dataclass(frozen=True)
class Bullets:
    kind: ClassVar[str] = "bullets"
    items: tuple[tuple[Run, ...], ...]
    cls: str = ""  # "kv": short key-value items, laid out in two columns on the page


@dataclass(frozen=True)
class Code:
    kind: ClassVar[str] = "code"
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    kind: ClassVar[str] = "table"
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]  # per column: right-aligned
    caption: str = ""
    strong: tuple[int, ...] = ()  # rows printed bold (a total)
    cls: str = ""


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple
    aside: tuple = ()
    half: bool = False


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    summary: tuple[Run, ...]
    sections: tuple[Section, ...]
    footer: tuple[Run, ...]
    data: dict = field(default_factory=dict)  # the numbers for machines: segments, boundaries, evidence


_TONE = {"accept": "good", "reject": "bad", "inconclusive": "undecided"}  # a verdict's colour


def _kernel_short(name: str) -> str:
    """'void ns::kern<...>(...)' -> 'ns::kern': template and argument lists dropped."""
    name = name.removeprefix("void ").strip()
    for ch in "<(":
        name = name.split(ch, 1)[0]
    return name[:60]


def build(r: Report, source: str = "the spec's Document QA trace") -> Document:
    """The whole report as a `Document`: sections 1-7, and 8 (Evidence) when evidence was given, from
    attribution.attribute's `Report`; ``source`` (what the trace was) is printed under the title."""
    t, b, tg, w = r.trace, r.boundary, r.trace.targets, r.trace.workload
    workload = Bullets(tuple(para((k, "b"), f": {v}") for k, v in (
        ("Model", f"{w.model}, {w.params / 1e9:g}B params, {w.dtype}"),
        ("Shape", f"{w.layers} layers · {w.heads} query heads · d = {w.d}"),
        ("Load", f"C = {w.concurrency} closed-loop · P = {w.prompt_tokens:,} · O = {w.output_tokens:,} "
                 "tokens"),
        ("Targets", f"p95 TTFT ≤ {tg.p95_ttft_ms:g} ms · decode ≥ {tg.tokens_per_s:g} tokens/s "
                    f"(TPOT ≤ {tg.tpot_ms:g} ms)"))), cls="kv")
    change = Paragraph(para(f"{t.change_description}: ", (f"S_kernel = {t.speedup:.2f}×", "b"),
                            f" on the attention part of {t.prefill_segment} ({val(r.attention_ms)} ms; split "
                            f"from {r.attention_source}; S from {t.change_source})."))
    sections = [
        Section("Workload and targets", (workload,)),
        Section("Trace timings (serial critical path)", (_timings(r), Paragraph(para(r.fp8_kv), small=True))),
        Section("Observations", (Bullets(tuple(para(o) for o in r.observations)),), aside=(figures.bar(r),)),
        Section("Proposed change", (change,)),
        Section("Projected impact (Amdahl, model/amdahl.py)", _impact(r), aside=(figures.curve(r), _sens(r))),
        Section("Boundary errors to avoid", (Bullets(tuple(para((f"{k}.", "b"), f" {v}")
                                                           for k, v in r.boundary_errors)),), half=True),
        Section("Next measurement plan", (Bullets(tuple(para(p) for p in r.plan)),), half=True),
        *_evidence(r),
    ]
    summary = para("TTFT ", (f"{val(t.ttft_ms)} ms", "good" if r.ttft_meets_target else "bad"),
                   f" vs {tg.p95_ttft_ms:g} ms target · TPOT ",
                   (f"{val(t.tpot_ms)} ms", "good" if r.tpot_meets_target else "bad"),
                   f" vs {tg.tpot_ms:g} ms · projected ",
                   (f"{val(b.outer_projected_ms, True)} ms ({b.outer_speedup:.4f}×)", "b"),
                   " · p95 compliance: ",
                   *(["unknown (single trace)"] if r.samples is None else
                     [(r.samples.verdict, _TONE[r.samples.verdict]), f" (n = {r.samples.n})"]))
    windowed = "" if t.workload.sliding_window is None else (
        f" (the {t.workload.window_layers:,} windowed layers: 4·d·heads·pairs / P, pairs the window leaves)")
    footer = para(f"FLOP share = {FLOP_SHARE_FORMULA}{windowed}: dense {r.flop_dense:.3g}, attention "
                  f"{r.flop_attn:.3g} "
                  "FLOPs per prompt token. Amdahl: speedup = 1 / ((1 − f) + f / S), f a measured time share "
                  "(model/amdahl.py).")
    return Document(t.title, f"Latency attribution report (attnscope) · input: {source} · one trace; "
                    "projections are conditional on it", summary, tuple(sections), footer, _data(r))


def _data(r: Report) -> dict:
    """The report's numbers for machines: segments, both boundaries, the boundary errors, the evidence."""
    t = r.trace
    out = {"ttft_ms": t.ttft_ms,
           "segments": [{"name": x.name, "ms": x.ms, "share": x.share, "projected_ms": x.projected_ms}
                        for x in r.rows],
           "attention_ms": r.attention_ms, "speedup": t.speedup, "boundary": r.boundary.to_json(),
           "naive_ms": r.naive_ms, "flop_share": r.flop_share,
           "ttft_meets_target_this_trace": r.ttft_meets_target, "tpot_ms": t.tpot_ms,
           "tpot_meets_target": r.tpot_meets_target, "fp8_kv": r.fp8_kv_data}
    if r.samples is not None:
        keys = ("n", "p50", "p95", "p99", "ci_low", "ci_high", "lower_bound", "upper_bound", "verdict",
                "needed")
        out["samples"] = {k: getattr(r.samples, k) for k in keys}
    if r.metrics:
        out["metrics"] = {m.name: {"count": m.hist.count, "p50_ms": m.p50_ms, "p95_ms": m.p95_ms,
                                   "p99_ms": m.p99_ms, "mean_ms": m.mean_ms, "meets": m.meets,
                                   "lower_bound_only": sorted(m.above)}
                          for m in r.metrics}
    if r.profile is not None:
        out["profile"] = {"span_ms": r.profile.span_ms, "attention_ms": r.profile.attention_ms,
                          "share": r.profile.share}
    return out


def _timings(r: Report) -> Table:
    """Section 2: the serial segments, the client TTFT they add up to, and decode TPOT."""
    t, b = r.trace, r.boundary
    rows = [(x.name, x.source, val(x.ms), pct(x.share), val(x.projected_ms, True), x.note) for x in r.rows]
    rows.append(("Client TTFT (this trace)", t.ttft_source, val(t.ttft_ms), "100.0%",
                 val(b.outer_projected_ms, True), "single trace"))
    rows.append(("Decode TPOT", t.decode_source, val(t.tpot_ms), "", "",
                 f"per token; budget {t.targets.tpot_ms:g} ms"))
    return Table(("Segment", "Measurement source", "Trace ms", "Share", "Projected ms", "Notes"), tuple(rows),
                 (False, False, True, True, True, False), strong=(len(rows) - 2,), cls="segs")


def _impact(r: Report) -> tuple:
    """Section 5: Amdahl worked through both boundaries, the verdict it allows, its assumptions. The worked
    arithmetic shows every time to 0.01 ms so that each line adds up as printed."""
    t, b, s = r.trace, r.boundary, r.trace.speedup
    f, rest, new = b.f_inner, val(t.prefill_ms - r.attention_ms, True), val(b.outer_projected_ms, True)
    attn, pre, inner = val(r.attention_ms, True), val(t.prefill_ms, True), val(b.inner_projected_ms, True)
    side = "below" if r.projected_meets_target else "above"
    return (
        Code((f"f_attn = {attn} / {pre} = {f:.2f} (rest {1 - f:.2f}), S_kernel = {s:.2f}×",
              f"S_prefill = 1 / ({1 - f:.2f} + {f:.2f} / {s:.2f}) = {b.inner_speedup:.4f}×",
              f"T_prefill = {rest} + {attn} / {s:.2f} = {rest} + {val(r.attention_ms / s, True)} = {inner} "
              f"ms ({pct(b.inner_reduction, 2)} reduction)",
              f"T_client = {val(t.ttft_ms - t.prefill_ms, True)} (held fixed) + {inner} = {new} ms",
              f"S_client = {val(t.ttft_ms, True)} / {new} = {b.outer_speedup:.4f}× "
              f"({pct(b.outer_reduction, 2)} reduction)")),
        Paragraph(para(f"Conditional projection for this single trace: {new} ms, {side} the "
                       f"{t.targets.p95_ttft_ms:g} ms target; service p95 compliance stays unverified until "
                       "a post-change distribution is collected.")),
        Paragraph(para("Assumes: " + "; ".join(r.assumptions) + "."), small=True),
    )


def _sens(r: Report) -> Table:
    """Prefill speedup and reduction at the spec's attention shares and this trace's, one column each."""
    cols = [(pct(p.f, 0) + (" (trace)" if abs(p.f - r.boundary.f_inner) < 1e-6 else ""), f"{p.speedup:.4f}×",
             pct(p.reduction, 2)) for p in r.sensitivity]
    head, speedups, reductions = zip(*cols, strict=True)
    return Table(("f_attn (time share)", *head), (("Prefill speedup", *speedups),
                                                  ("Prefill reduction", *reductions)),
                 (False,) + (True,) * len(cols), cls="sens",
                 caption=f"Sensitivity at the prefill boundary, S = {r.trace.speedup:.2f}×")


def _evidence(r: Report) -> tuple[Section, ...]:
    """Section 8, if evidence was given: the client samples and server histograms in one table, notes."""
    rows, notes = [], []
    if r.samples is not None:
        s = r.samples
        rows.append(("Client TTFT (samples)", f"{s.n:,}", val(s.p50), val(s.p95), val(s.p99), "",
                     f"{s.verdict} ({s.target_ms:g})"))
        ci = ("none" if s.ci_low is None else f"[{val(s.ci_low)}, no upper end]" if s.ci_high is None
              else f"[{val(s.ci_low)}, {val(s.ci_high)}] ms")
        up = "none (n < 59)" if s.upper_bound is None else f"{val(s.upper_bound)} ms"
        low = "none" if s.lower_bound is None else f"{val(s.lower_bound)} ms"
        need = (" The sample size to decide cannot be estimated (observed p95 at the target)."
                if s.verdict == "inconclusive" and not s.needed else "")  # else the plan says how many
        where = ("" if s.trace_percentile is None else
                 f" This trace's {val(r.trace.ttft_ms)} ms has percentile rank {s.trace_percentile:.0f} %.")
        notes.append(para(("Client TTFT samples (--samples)", "b"),
                          f": nearest rank; {pct(s.frac_le_target)} ≤ {s.target_ms:g} ms. p95 exact 95 % CI "
                          f"(order statistics, distribution-free) {ci}; one-sided 95 % bounds: lower "
                          f"{low}, upper {up}: ", (s.verdict.upper(), _TONE[s.verdict]),
                          f".{need}{where}", *((f" {x}", "warn") for x in s.warnings)))
    for m in r.metrics:
        rows.append((m.label, f"{m.hist.count:,.0f}", *(m.mark(k) + val(getattr(m, f"{k}_ms"))
                                                        for k in ("p50", "p95", "p99")),
                     "unknown (no sum)" if m.mean_ms is None else val(m.mean_ms),
                     "" if m.meets is None else f"{m.meets} ({m.target_ms:g})"))
    if r.metrics:
        notes.append(para(("Server histograms, AFTER − BEFORE (--metrics)", "b"),
                          ": no client network or serialization; quantiles interpolated within buckets, "
                          "exact only at bucket edges; \"> x\": the quantile lies in the +Inf bucket, above "
                          "the highest finite bound x.",
                          *((f" {m.label}: {m.warning}.", "warn") for m in r.metrics if m.warning)))
    if r.profile is not None:
        p, prefill_ms = r.profile, r.trace.prefill_ms
        top = ", ".join(f"{_kernel_short(n)} {val(ms)} ms" for n, ms in p.top) or "none"
        off = abs(p.span_ms - prefill_ms) > 0.1 * prefill_ms
        notes.append(para(
            ("Profiler split (--profile)", "b"),
            f": span {p.span}, {val(p.span_ms)} ms; kernels busy {val(p.busy_ms)} ms ({p.kernels} kernels). "
            f"Attention: {val(p.attention_ms)} ms in {p.attention_kernels} kernels = {pct(p.share)} of the "
            "prefill's kernel time (as `attnscope share`); this share replaces the trace's assumed split. "
            f"Largest: {top}.",
            *([(f" The profiled span ({val(p.span_ms)} ms) differs from the trace's prefill "
                f"({val(prefill_ms)} ms) by more than 10 %: profiler overhead or another shape.", "warn")]
              if off else [])))
    if not rows:
        return (Section("Evidence", (Bullets(tuple(notes)),)),) if notes else ()
    table = Table(("Source (ms)", "n", "p50", "p95", "p99", "Mean", "p95 ≤ target"), tuple(rows),
                  (False, True, True, True, True, True, False), cls="ev")
    # the profiler's note under the table, the samples' (the longest) and the histograms' beside it
    under = (Bullets((notes.pop(),)),) if r.profile is not None and len(notes) > 1 else ()
    return (Section("Evidence", (table, *under), aside=(Bullets(tuple(notes)),)),)
