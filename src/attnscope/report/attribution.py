"""The numbers of the latency attribution report, and the sentences that state them.

Every Amdahl number comes from `model/amdahl.py`: `carry` takes the attention part of the prefill
span, sped up by S, to the prefill boundary and then to the client TTFT boundary with the other
segments held fixed (an assumption the report states). Render only formats what is built here, so the
Markdown and the HTML say the same thing.

FLOP share (spec §5.1), per prompt token of a causal prefill of P tokens:
    dense  = 2 * params                          (one multiply-add per weight)
    attn   = attention_flops(1, heads, P, P, d, causal) / P * layers   (model/flops.py: 4·(P/2)·d·heads)
    share  = attn / (dense + attn)                (3.25 % at P = 2,048; 6.29 % at P = 4,096 for 8B)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnscope.model import amdahl, roofline, serving
from attnscope.model.flops import attention_flops
from attnscope.model.tiles import Grid
from attnscope.report import schema
from attnscope.report.schema import Trace

FLOP_SHARE_FORMULA = ("attn / (dense + attn); per prompt token dense = 2·params, "
                      "attn = 2·P·d·heads·layers FLOPs")


def val(x: float, projected: bool = False) -> str:
    """The one format of a time in ms (no unit): measured to 0.1 ms, projected to 0.01 ms. The report's
    tables, text and chart labels all use it."""
    return f"{x:,.{2 if projected else 1}f}"


def pct(x: float, nd: int = 1) -> str:
    return f"{100 * x:.{nd}f}%"


#: The workload dtypes the decode ledger takes for queries and a cache at their width (the trace's dtype is
#: free text; these spellings name fp16 and bf16).
KV_QUERY_DTYPES = {"fp16": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}


def fp8_kv(trace: Trace) -> tuple[str, dict | None]:
    """What an FP8 (e4m3) KV cache saves per decode step of this trace: the sentence, and its numbers
    (None where the model does not apply). Attention bytes per step (`model.serving.decode_step`: the
    decode ledger, all layers and the C sequences, mean over the steps) at the workload's dtype and at fp8,
    and their time at the device's DRAM bandwidth."""
    w = trace.workload
    dtype = KV_QUERY_DTYPES.get(w.dtype.lower())
    if dtype is None:
        return (f"FP8 KV cache: not modelled for workload dtype {w.dtype!r} (the decode ledger takes fp16 or "
                "bf16 queries).", None)
    if w.output_tokens < 2:
        return ("FP8 KV cache: no decode step to model (output_tokens = 1: the prefill makes the only "
                "token).", None)
    base, fp8 = (serving.decode_step(w.concurrency, w.prompt_tokens, w.output_tokens, layers=w.layers,
                                     heads=w.heads, kv_heads=w.kv_heads, d=w.d, dtype=dtype, kv_dtype=k,
                                     device=w.device, window=w.window, window_layers=w.window_layers)
                 for k in (dtype, "fp8"))
    dev = roofline.device(w.device)
    saved_ms = (base.ceiling_s - fp8.ceiling_s) * 1e3
    gib, mean = 2**30, w.prompt_tokens + w.output_tokens / 2  # mean of P + 1 .. P + O - 1
    text = (f"FP8 KV cache (model/serving.py): attention reads {base.nbytes / gib:,.2f} → "
            f"{fp8.nbytes / gib:,.2f} GiB per decode step ({dtype} → fp8; {w.concurrency:,} seq. × "
            f"{w.layers:,} layers{_windowed(w)}, mean cache {mean:,.{0 if mean.is_integer() else 1}f}), "
            f"{base.ceiling_s * 1e3:,.2f} → {fp8.ceiling_s * 1e3:,.2f} ms at the {dev.name.upper()}'s "
            f"{dev.hbm / 1e12:g} TB/s: −{saved_ms:,.2f} ms of the {trace.tpot_ms:.1f} ms TPOT (weights not "
            "counted).")
    return text, {"device": dev.name, "hbm_bytes_per_s": dev.hbm, "base": base.to_json(),
                  "fp8": fp8.to_json(), "saved_ms": saved_ms}


def _windowed(w) -> str:
    """`` (a W-key window on k)`` for a workload with a sliding window, else ``""``."""
    return "" if w.sliding_window is None else f" (a {w.sliding_window:,}-key window on {w.window_layers:,})"


def flop_share(params: float, prompt_tokens: int, d: int, heads: int, layers: int,
               window: tuple[int, int] | None = None, window_layers: int = 0) -> tuple[float, float, float]:
    """(dense FLOPs, causal attention FLOPs, attention share) per prompt token (module docstring); with a
    sliding ``window`` on ``window_layers`` of the layers, those count the (query, key) pairs it leaves
    visible (`model.tiles.Grid.visible_pairs`)."""
    dense = 2.0 * params
    # model/flops.py's causal count over the prompt, per token: 4 * (P/2) * d * heads per layer
    attn = (layers - window_layers) * attention_flops(1, heads, prompt_tokens, prompt_tokens, d,
                                                      causal=True) / prompt_tokens
    if window_layers:
        pairs = Grid(prompt_tokens, prompt_tokens, causal=True, window=window).visible_pairs()
        attn += window_layers * 4.0 * heads * pairs * d / prompt_tokens
    return dense, attn, attn / (dense + attn)


@dataclass(frozen=True)
class SegmentRow:
    name: str
    ms: float
    share: float  # of client TTFT
    projected_ms: float
    source: str
    note: str


@dataclass
class Report:
    trace: Trace
    rows: list[SegmentRow]
    attention_ms: float
    attention_source: str
    boundary: amdahl.Boundary
    naive_ms: float  # TTFT / S: the kernel-vs-end-to-end mistake
    flop_dense: float
    flop_attn: float
    flop_share: float
    flop_speedup: float  # what Amdahl at the FLOP share would (wrongly) predict for the prefill
    sensitivity: list[amdahl.Projection]
    ttft_meets_target: bool  # this trace only
    projected_meets_target: bool
    tpot_meets_target: bool
    fp8_kv: str = ""  # `fp8_kv`'s sentence
    fp8_kv_data: dict | None = None
    observations: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    boundary_errors: list[tuple[str, str]] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)
    samples: object = None  # evidence.SampleStats
    metrics: list = field(default_factory=list)  # evidence.HistogramDiff
    profile: object = None  # chrome_trace.Share


def attribute(trace: Trace, samples=None, metrics=None, profile=None) -> Report:
    """Build the report's numbers and sentences; evidence (from `evidence.py`) changes what it touches."""
    t, w = trace, trace.workload
    attention_ms, attention_source = t.attention_ms, t.prefill_source
    if profile is not None:  # a measured split replaces the trace's assumed one
        attention_ms = schema.attention_ms(profile.share, t.prefill_ms, "--profile")
        attention_source = (f"torch.profiler: {profile.share:.1%} of the prefill's kernel time "
                            f"({profile.span})")
    b = amdahl.carry(attention_ms, t.prefill_ms, t.ttft_ms, t.speedup)
    saved = attention_ms - attention_ms / t.speedup
    rows = [SegmentRow(s.name, s.ms, s.ms / t.ttft_ms, s.ms - saved if s.name == t.prefill_segment else s.ms,
                       s.source, s.note) for s in t.segments]
    u = t.unattributed_ms
    if u > 1e-9:
        rows.append(SegmentRow("Unattributed", u, u / t.ttft_ms, u, t.ttft_source,
                               "Client TTFT minus the serial segments"))
    dense, attn, fshare = flop_share(w.params, w.prompt_tokens, w.d, w.heads, w.layers, w.window,
                                     w.window_layers)
    fs = sorted(set(amdahl.DEFAULT_SENSITIVITY) | {round(b.f_inner, 6)})  # spec §5's rows and this trace
    r = Report(trace=t, rows=rows, attention_ms=attention_ms, attention_source=attention_source, boundary=b,
               naive_ms=t.ttft_ms / t.speedup, flop_dense=dense, flop_attn=attn, flop_share=fshare,
               flop_speedup=amdahl.speedup(fshare, t.speedup), sensitivity=amdahl.sensitivity(t.speedup, fs),
               ttft_meets_target=t.ttft_ms <= t.targets.p95_ttft_ms,
               projected_meets_target=b.outer_projected_ms <= t.targets.p95_ttft_ms,
               tpot_meets_target=t.tpot_ms <= t.targets.tpot_ms,
               samples=samples, metrics=list(metrics or []), profile=profile)
    r.fp8_kv, r.fp8_kv_data = fp8_kv(t)
    _sentences(r)
    return r


def _sentences(r: Report) -> None:
    t, b, tg, s = r.trace, r.boundary, r.trace.targets, r.samples
    pre = t.segment(t.prefill_segment)
    cmp_ttft = "meets (≤)" if r.ttft_meets_target else "is above"
    cmp_tpot = "meets (≤)" if r.tpot_meets_target else "is above"
    r.observations = [
        f"For this trace, TTFT {t.ttft_ms:.1f} ms {cmp_ttft} the p95 target of {tg.p95_ttft_ms:g} ms (one "
        f"request, not a p95); decode TPOT {t.tpot_ms:.1f} ms {cmp_tpot} the {tg.tpot_ms:.1f} ms budget.",
        f"{pre.name} is {pre.ms / t.ttft_ms:.1%} of TTFT; inside it, attention is {b.f_inner:.1%} "
        f"({r.attention_ms:.1f} ms).",
    ]
    if s is None:
        r.observations.append("A single trace says nothing about p95: service p95 compliance is unknown "
                              "without a distribution of requests.")
    else:
        word = {"accept": "met", "reject": "missed", "inconclusive": "undecided"}[s.verdict]
        r.observations.append(f"From {s.n} client samples the p95 TTFT target is {word} ({s.verdict}: "
                              f"p95 {s.p95:.1f} ms; see Evidence).")
    r.assumptions = [
        "TTFT is the sum of serial, non-overlapping segments (synchronized clocks)",
        f"S = {t.speedup:.2f}× holds over all {r.attention_ms:.1f} ms of attention on matching shapes",
        "the rest of the prefill and every other segment, queue dwell included, do not move",
    ]
    q = next((s for s in t.segments if "queue" in s.name.lower()), None)
    held = f"{q.name.lower()} at {q.ms:.1f} ms" if q else "the non-prefill segments fixed"
    queue_text = f"Holding {held} is a static assumption; queuing under load must be measured."
    qm = next((m for m in r.metrics if m.name == "vllm:request_queue_time_seconds"), None)
    if q is not None and qm is not None:
        queue_text += (f" Server histogram: queue p50 {qm.mark('p50')}{qm.p50_ms:.1f} ms, "
                       f"p95 {qm.mark('p95')}{qm.p95_ms:.1f} ms "
                       f"(trace {q.ms:.1f} ms).")
    r.boundary_errors = [
        ("Kernel vs. end-to-end",
         f"Applying {t.speedup:.2f}× to TTFT predicts {t.ttft_ms:.1f} / {t.speedup:.2f} = "
         f"{r.naive_ms:.1f} ms, ignoring non-attention compute and queue dwell; the projection is "
         f"{b.outer_projected_ms:.2f} ms."),
        ("FLOP share vs. time share",
         f"Attention is {r.flop_share:.1%} of prefill FLOPs at P = {t.workload.prompt_tokens:,}"
         f"{_windowed(t.workload)} (formula "
         f"below); Amdahl on it predicts {r.flop_speedup:.3f}× for the prefill, not {b.inner_speedup:.4f}×: "
         f"FLOPs omit the non-matmul work and stalls in the {b.f_inner:.1%} time share."),
        ("Unmeasured components", queue_text),
    ]
    pm = next((m for m in r.metrics if m.name == "vllm:request_prefill_time_seconds"), None)
    goal = f"to accept or reject p95 ≤ {tg.p95_ttft_ms:g} ms."
    if s is not None and s.verdict != "inconclusive":
        collect = f"Re-collect client TTFT samples after the change to confirm p95 ≤ {tg.p95_ttft_ms:g} ms."
    elif s is not None and s.needed:
        collect = f"Collect about {s.needed:,} independent client TTFT samples in all ({s.n:,} so far) {goal}"
    else:  # 59: the smallest n whose largest sample bounds p95 from above with 95 % confidence
        collect = f"Collect client TTFT samples (at least 59, independent) {goal}"
    r.plan = [
        "Confirm by kernel name that prefill dispatches the fused flash kernel (attnscope which).",
        f"Check GPU prefill against the {b.inner_projected_ms:.2f} ms projection with matched spans "
        "(CUDA events, torch.profiler; attnscope share), before and after interleaved (power-capped clocks)."
        + (f" Server prefill p50 now {pm.mark('p50')}{pm.p50_ms:.1f} ms." if pm else ""),
        "Diff server histograms request_prefill_time_seconds and request_queue_time_seconds per run.",
        collect,
        "Measure DRAM bytes with Nsight Compute (attnscope bytes): the logical byte model is an "
        "algorithmic count, not a hardware reading.",
    ]
