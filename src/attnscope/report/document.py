"""The report as one document: sections of paragraphs, lists, tables and figures, built once.

`build(report, source)` turns a `Report` (attribution.py) into a `Document`; render.py writes the same
`Document` as Markdown and as HTML, so every sentence and every number is formatted here, once, and the
two pages cannot disagree. The blocks are plain data: text is unescaped (each renderer escapes it on
the way out) and a figure is a list of SVG shapes (figures.py) that only the HTML draws; its numbers
are in the tables and the text of the same section.

Layout hints the HTML uses and the Markdown ignores: a section's `aside` sits beside its blocks, a
`half` section shares a row with its neighbour.
"""

from __future__ import annotations

from dataclasses import dataclass
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


_TONE = {"accept": "good", "reject": "bad", "inconclusive": "undecided"}  # a verdict's colour


def _kernel_short(name: str) -> str:
    """'void ns::kern<...>(...)' -> 'ns::kern': template and argument lists dropped."""
    name = name.removeprefix("void ").strip()
    for ch in "<(":
        name = name.split(ch, 1)[0]
    return name[:60]


def build(r: Report, source: str = "the spec's Document QA trace") -> Document:
    """The whole report as a `Document` (module docstring); `source` names the trace on the page."""
    t, b, tg, w = r.trace, r.boundary, r.trace.targets, r.trace.workload
    summary = para("TTFT ", (f"{val(t.ttft_ms)} ms", "good" if r.ttft_meets_target else "bad"),
                   f" vs {tg.p95_ttft_ms:g} ms target · TPOT ",
                   (f"{val(t.tpot_ms)} ms", "good" if r.tpot_meets_target else "bad"),
                   f" vs {tg.tpot_ms:g} ms · projected ",
                   (f"{val(b.outer_projected_ms, True)} ms ({b.outer_speedup:.4f}×)", "b"), " · p95 compliance: ")
    if r.samples is None:
        summary += para("unknown (single trace)")
    else:
        summary += para((r.samples.verdict, _TONE[r.samples.verdict]), f" (n = {r.samples.n})")
    workload = Bullets(tuple(para((k, "b"), f": {v}") for k, v in (
        ("Model", f"{w.model}, {w.params / 1e9:g}B params, {w.dtype}"),
        ("Shape", f"{w.layers} layers · {w.heads} query heads · d = {w.d}"),
        ("Load", f"C = {w.concurrency} closed-loop · P = {w.prompt_tokens:,} · O = {w.output_tokens:,} tokens"),
        ("Targets", f"p95 TTFT ≤ {tg.p95_ttft_ms:g} ms · decode ≥ {tg.tokens_per_s:g} tokens/s "
                    f"(TPOT ≤ {tg.tpot_ms:g} ms)"))), cls="kv")
    rows = [(x.name, x.source, val(x.ms), pct(x.share), val(x.projected_ms, True), x.note) for x in r.rows]
    rows.append(("Client TTFT (this trace)", t.ttft_source, val(t.ttft_ms), "100.0%",
                 val(b.outer_projected_ms, True), "single trace"))
    rows.append(("Decode TPOT", t.decode_source, val(t.tpot_ms), "", "", f"per token; budget {tg.tpot_ms:g} ms"))
    timings = Table(("Segment", "Measurement source", "Trace ms", "Share", "Projected ms", "Notes"),
                    tuple(rows), (False, False, True, True, True, False), strong=(len(rows) - 2,), cls="segs")
    change = Paragraph(para(f"{t.change_description}: ", (f"S_kernel = {t.speedup:.2f}×", "b"),
                            f" on the attention part of {t.prefill_segment} ({val(r.attention_ms)} ms; split "
                            f"from {r.attention_source}; S from {t.change_source})."))
    sens = [(pct(p.f, 0) + (" (trace)" if abs(p.f - b.f_inner) < 1e-6 else ""), f"{p.speedup:.4f}×",
             pct(p.reduction, 2)) for p in r.sensitivity]
    sens_table = Table(("f_attn (time share)",) + tuple(c[0] for c in sens),
                       (("Prefill speedup",) + tuple(c[1] for c in sens),
                        ("Prefill reduction",) + tuple(c[2] for c in sens)),
                       (False,) + (True,) * len(sens),
                       caption=f"Sensitivity at the prefill boundary, S = {t.speedup:.2f}×", cls="sens")
    f, rest = b.f_inner, t.prefill_ms - r.attention_ms
    side = "below" if r.projected_meets_target else "above"
    impact = (
        Code((f"f_attn = {val(r.attention_ms)} / {val(t.prefill_ms)} = {f:.2f} (rest {1 - f:.2f}), "
              f"S_kernel = {t.speedup:.2f}×",
              f"S_prefill = 1 / ({1 - f:.2f} + {f:.2f} / {t.speedup:.2f}) = {b.inner_speedup:.4f}×",
              f"T_prefill = {val(rest)} + {val(r.attention_ms)} / {t.speedup:.2f} = {val(rest)} + "
              f"{val(r.attention_ms / t.speedup, True)} = {val(b.inner_projected_ms, True)} ms "
              f"({pct(b.inner_reduction, 2)} reduction)",
              f"T_client = {val(t.ttft_ms - t.prefill_ms)} (held fixed) + {val(b.inner_projected_ms, True)} = "
              f"{val(b.outer_projected_ms, True)} ms",
              f"S_client = {val(t.ttft_ms)} / {val(b.outer_projected_ms, True)} = {b.outer_speedup:.4f}× "
              f"({pct(b.outer_reduction, 2)} reduction)")),
        Paragraph(para(f"Conditional projection for this single trace: {val(b.outer_projected_ms, True)} ms, "
                       f"{side} the {tg.p95_ttft_ms:g} ms target; service p95 compliance stays unverified "
                       "until a post-change distribution is collected.")),
        Paragraph(para("Assumes: " + "; ".join(r.assumptions) + "."), small=True),
    )
    sections = [
        Section("Workload and targets", (workload,)),
        Section("Trace timings (serial critical path)", (timings,)),
        Section("Observations", (Bullets(tuple(para(o) for o in r.observations)),), aside=(figures.bar(r),)),
        Section("Proposed change", (change,)),
        Section("Projected impact (Amdahl, model/amdahl.py)", impact, aside=(figures.curve(r), sens_table)),
        Section("Boundary errors to avoid", (Bullets(tuple(para((f"{k}.", "b"), f" {v}")
                                                           for k, v in r.boundary_errors)),), half=True),
        Section("Next measurement plan", (Bullets(tuple(para(p) for p in r.plan)),), half=True),
    ]
    evidence = _evidence(r)
    if evidence is not None:
        sections.append(evidence)
    footer = para(f"FLOP share = {FLOP_SHARE_FORMULA}: dense {r.flop_dense:.3g}, attention {r.flop_attn:.3g} "
                  "FLOPs per prompt token. Amdahl: speedup = 1 / ((1 − f) + f / S), f a measured time share "
                  "(model/amdahl.py).")
    return Document(t.title, f"Latency attribution report (attnscope) · input: {source} · one trace; "
                    "projections are conditional on it", summary, tuple(sections), footer)


def _evidence(r: Report) -> Section | None:
    """Section 8: the client samples and the server histograms in one table, the rest as notes."""
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
        rows.append((m.label, f"{m.hist.count:,.0f}", val(m.p50_ms), val(m.p95_ms), val(m.p99_ms),
                     val(m.mean_ms), "" if m.meets is None else f"{m.meets} ({m.target_ms:g})"))
    if r.metrics:
        notes.append(para(("Server histograms, AFTER − BEFORE (--metrics)", "b"),
                          ": no client network or serialization; quantiles interpolated within buckets, "
                          "exact only at bucket edges.",
                          *((f" {m.label}: {m.warning}.", "warn") for m in r.metrics if m.warning)))
    if r.profile is not None:
        p = r.profile
        top = ", ".join(f"{_kernel_short(n)} {val(ms)} ms" for n, ms in p.top) or "none"
        off = abs(p.span_ms - r.trace.prefill_ms) > 0.1 * r.trace.prefill_ms
        notes.append(para(("Profiler split (--profile)", "b"),
                          f": span {p.span}, {val(p.span_ms)} ms; kernels busy {val(p.busy_ms)} ms ({p.kernels} "
                          f"kernels). Attention: {val(p.attention_ms)} ms in {p.attention_kernels} kernels = "
                          f"{pct(p.share)} of the prefill's kernel time (as `attnscope share`); this share replaces "
                          f"the trace's assumed split. Largest: {top}.",
                          *([(f" The profiled span ({val(p.span_ms)} ms) differs from the trace's prefill "
                              f"({val(r.trace.prefill_ms)} ms) by more than 10 %: profiler overhead or another "
                              "shape.", "warn")] if off else [])))
    if not notes:
        return None
    if not rows:
        return Section("Evidence", (Bullets(tuple(notes)),))
    table = Table(("Source (ms)", "n", "p50", "p95", "p99", "Mean", "p95 ≤ target"), tuple(rows),
                  (False, True, True, True, True, True, False), cls="ev")
    # the profiler's note under the table, the samples' (the longest) and the histograms' beside it
    under = (Bullets((notes.pop(),)),) if r.profile is not None and len(notes) > 1 else ()
    return Section("Evidence", (table, *under), aside=(Bullets(tuple(notes)),))
