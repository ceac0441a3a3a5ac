"""The trace a report starts from: load YAML or JSON, validate it, name the field when it is wrong.

A trace is one request's critical path, assumed strictly serial (client TTFT = the sum of the
segments), the split of the GPU prefill segment into attention and the rest, decode TPOT, the service
targets, and a proposed change (a kernel speedup S on the prefill's attention part). Field by field:

    title            str, optional
    workload         model (str), params (float, default 8.0e9), dtype (str), layers, heads, d,
                     concurrency, prompt_tokens, output_tokens (positive ints), kv_heads (optional, a
                     divisor of heads, default heads), device (optional, model/roofline.py, default h200),
                     sliding_window (optional: W keys, transformers' meaning, a query sees itself and the
                     W - 1 keys before) on window_layers of the layers (optional, 1 to layers, default all)
    targets          p95_ttft_ms (> 0), and tpot_ms or tokens_per_s (> 0; both must agree if given)
    segments         list of {name (unique str), ms (>= 0), source (str), note (str, optional)}
    ttft             optional {ms, source}: the client timer; at least the segments' sum (a larger
                     value leaves an "unattributed" remainder, held fixed like the other segments)
    prefill          segment (a segment name), attention_ms or attention_share (in [0, 1]), source
    decode           tpot_ms (> 0), source (optional)
    change           description, segment (must be the prefill segment), speedup (S > 0), source

Unknown fields are errors (a typo must not be silently ignored). YAML is read by `attnscope.inputs`
(a SafeLoader without aliases or duplicate keys). Strings may not hold control or bidi-override
characters (they would reach the page raw); numbers are finite and bounded (`MAX_VALUE`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from attnscope.errors import InputError, choice, expect, finite_real, is_int, short
from attnscope.inputs import load_json, load_yaml, read_text
from attnscope.model import amdahl, roofline

DEFAULT_PARAMS = 8.0e9  # the spec's nominal 8B dense model
DEFAULT_DEVICE = "h200"  # the device table entry (model/roofline.py) of the decode ceiling


@dataclass(frozen=True)
class Workload:
    model: str
    dtype: str
    layers: int
    heads: int
    d: int
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    params: float = DEFAULT_PARAMS
    kv_heads: int | None = None  # None: as heads
    device: str = DEFAULT_DEVICE
    sliding_window: int | None = None  # W keys a query sees on the windowed layers (None: no window)
    window_layers: int = 0  # layers with the sliding window

    @property
    def window(self) -> tuple[int, int] | None:
        """The windowed layers' ``(left, right)`` (`model.tiles.normalize_window`), or None."""
        return None if self.sliding_window is None else (self.sliding_window - 1, 0)


@dataclass(frozen=True)
class Targets:
    p95_ttft_ms: float
    tpot_ms: float
    tokens_per_s: float


@dataclass(frozen=True)
class Segment:
    name: str
    ms: float
    source: str
    note: str = ""


@dataclass(frozen=True)
class Trace:
    title: str
    workload: Workload
    targets: Targets
    segments: tuple[Segment, ...]
    ttft_ms: float  # the client TTFT: the timer if given, else the segments' sum
    ttft_source: str
    prefill_segment: str
    attention_ms: float
    prefill_source: str
    tpot_ms: float
    decode_source: str
    change_description: str
    speedup: float
    change_source: str

    def segment(self, name: str) -> Segment:
        return {s.name: s for s in self.segments}[name]

    @property
    def prefill_ms(self) -> float:
        return self.segment(self.prefill_segment).ms

    @property
    def unattributed_ms(self) -> float:
        return self.ttft_ms - sum(s.ms for s in self.segments)


# ---------------------------------------------------------------------------------------------- load


def load(path: str | Path | None = None) -> Trace:
    """Read a trace file (.yaml, .yml or .json) through `attnscope.inputs` and validate it; None gives the
    spec's default trace. Every problem is one `InputError` naming TRACE."""
    if path is None:
        from attnscope.report.default_trace import DEFAULT_TRACE_YAML

        return parse(DEFAULT_TRACE_YAML, "default trace")
    text = read_text(path, "TRACE")
    return parse(text, str(path), as_json=Path(path).suffix.lower() == ".json")


def parse(text: str, where: str = "trace", as_json: bool = False) -> Trace:
    """Parse trace text (YAML, which includes JSON, unless `as_json`) and validate it."""
    data = load_json(where, "TRACE", text=text) if as_json else load_yaml(where, "TRACE", text=text)
    return validate(data)


# ------------------------------------------------------------------------------------------ validate


def _mapping(data, name: str, allowed: set[str], required: set[str]) -> dict:
    expect(isinstance(data, dict), name, "a mapping", type(data).__name__)
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        field = unknown[0] if unknown[0].isidentifier() and len(unknown[0]) <= 40 else short(unknown[0], 40)
        raise InputError(f"{name}.{field}: unknown field; expected one of {', '.join(sorted(allowed))}, "
                         "got this one (a typo?)")
    missing = sorted(required - set(data))
    if missing:
        raise InputError(f"{name}.{missing[0]}: missing required field; expected a value, got none")
    return data


#: Largest duration accepted anywhere in a trace (ms), as model/amdahl.py.
MAX_MS = amdahl.MAX_MS
#: Bounds of the positive numbers (name -> (lo, hi); a duration: [1e-6, MAX_MS]): outside them a product
#: or a reciprocal in the report would print 0, inf or nan.
BOUNDS = {"params": (1.0, 1e16), "tokens_per_s": (1e-3, 1e9), "speedup": (amdahl.S_MIN, amdahl.S_MAX)}


def _str(data: dict, key: str, name: str, default: str | None = None) -> str:
    """A string field without control characters (tab allowed) or bidi overrides (LRE..RLO, LRI..PDI,
    LRM/RLM, ALM: not printable either), which would reorder how the page reads."""
    v = data.get(key, default)
    expect(isinstance(v, str) and (v.strip() != "" or default == ""), f"{name}.{key}", "a non-empty string",
           v)
    for i, ch in enumerate(v):
        if ch != "\t" and not ch.isprintable():
            raise InputError(f"{name}.{key}: expected printable text without control or bidi-override "
                             f"characters, got U+{ord(ch):04X} at character {i}")
    return v


def _num(data: dict, key: str, name: str, positive: bool = False) -> float:
    """A JSON/YAML number (never a string: "15" or "１５" is refused), finite and bounded; a duration is
    0 or in [`amdahl.MIN_MS`, `MAX_MS`]. -0.0 is read as 0.0."""
    v = data.get(key)
    ok = finite_real(v)
    lo, hi = BOUNDS.get(key, (amdahl.MIN_MS, MAX_MS))
    if positive:
        expect(ok and lo <= v <= hi, f"{name}.{key}", f"a finite number in [{lo:g}, {hi:g}]", v)
    else:
        expect(ok and v >= 0, f"{name}.{key}", "a finite duration >= 0 ms", v)
        expect(v <= MAX_MS, f"{name}.{key}", f"a duration of at most {MAX_MS:g} ms", v)
        expect(v == 0 or v >= amdahl.MIN_MS, f"{name}.{key}",
               f"0 or a duration of at least {amdahl.MIN_MS:g} ms", v)
    return float(v) + 0.0  # -0.0 + 0.0 is 0.0: no "-0.0" on the page


def attention_ms(share: float, prefill_ms: float, name: str) -> float:
    """The attention time a share in [0, 1] gives of the prefill: 0 or at least `amdahl.MIN_MS` (below it,
    a duration the projection refuses), else one line naming `name` (the trace's field or --profile)."""
    attn = float(share) * prefill_ms + 0.0  # -0.0 read as 0.0
    expect(attn == 0 or attn >= amdahl.MIN_MS, name,
           f"0 or a share giving at least {amdahl.MIN_MS:g} ms of the prefill's {prefill_ms:g} ms", share)
    return attn


def _int(data: dict, key: str, name: str) -> int:
    v = data.get(key)
    expect(is_int(v) and 0 < v <= 10**12, f"{name}.{key}", "a positive integer up to 10^12", v)
    return v


def validate(data) -> Trace:
    """Check a parsed trace (a dict) and build a `Trace`; raises `InputError` naming the field."""
    required = {"workload", "targets", "segments", "prefill", "decode", "change"}
    top = _mapping(data, "trace", {"title", "ttft", *required}, required)
    title = _str(top, "title", "trace", default="Latency attribution report")

    ints = ("layers", "heads", "d", "concurrency", "prompt_tokens", "output_tokens")
    w = _mapping(top["workload"], "workload", {"model", "params", "dtype", "kv_heads", "device",
                                               "sliding_window", "window_layers", *ints},
                 {"model", "dtype", *ints})
    workload = Workload(
        model=_str(w, "model", "workload"), dtype=_str(w, "dtype", "workload"),
        **{k: _int(w, k, "workload") for k in ints},
        params=_num(w, "params", "workload", positive=True) if "params" in w else DEFAULT_PARAMS,
        kv_heads=_int(w, "kv_heads", "workload") if "kv_heads" in w else None,
        device=choice("workload.device", _str(w, "device", "workload"), roofline.DEVICES) if "device" in w
        else DEFAULT_DEVICE,
        sliding_window=_int(w, "sliding_window", "workload") if "sliding_window" in w else None,
        window_layers=_int(w, "window_layers", "workload") if "window_layers" in w else 0,
    )
    expect(workload.window_layers == 0 or workload.sliding_window is not None, "workload.window_layers",
           "none without workload.sliding_window", workload.window_layers)
    expect(workload.window_layers <= workload.layers, "workload.window_layers",
           f"at most workload.layers ({workload.layers})", workload.window_layers)
    if workload.sliding_window is not None and "window_layers" not in w:
        workload = replace(workload, window_layers=workload.layers)
    expect(workload.kv_heads is None or workload.heads % workload.kv_heads == 0, "workload.kv_heads",
           f"a divisor of heads ({workload.heads})", workload.kv_heads)

    t = _mapping(top["targets"], "targets", {"p95_ttft_ms", "tpot_ms", "tokens_per_s"}, {"p95_ttft_ms"})
    p95 = _num(t, "p95_ttft_ms", "targets", positive=True)
    expect("tpot_ms" in t or "tokens_per_s" in t, "targets", "tpot_ms or tokens_per_s", sorted(t))
    tpot = _num(t, "tpot_ms", "targets", positive=True) if "tpot_ms" in t else None
    tps = _num(t, "tokens_per_s", "targets", positive=True) if "tokens_per_s" in t else None
    if tpot is not None and tps is not None:
        expect(math.isclose(tpot * tps, 1000.0, rel_tol=1e-3), "targets.tokens_per_s",
               f"1000 / tpot_ms = {1000.0 / tpot:g} (tpot_ms is {tpot:g})", tps)
    tpot = tpot if tpot is not None else 1000.0 / tps
    targets = Targets(p95_ttft_ms=p95, tpot_ms=tpot, tokens_per_s=tps if tps is not None else 1000.0 / tpot)

    segs_raw = top["segments"]
    expect(isinstance(segs_raw, list) and len(segs_raw) > 0, "segments", "a non-empty list", segs_raw)
    by_name: dict[str, Segment] = {}
    for i, s in enumerate(segs_raw):
        name = f"segments[{i}]"
        s = _mapping(s, name, {"name", "ms", "source", "note"}, {"name", "ms", "source"})
        seg = Segment(name=_str(s, "name", name), ms=_num(s, "ms", name), source=_str(s, "source", name),
                      note=_str(s, "note", name, default=""))
        expect(seg.name not in by_name, f"{name}.name", "a unique segment name", seg.name)
        by_name[seg.name] = seg
    segments, names = tuple(by_name.values()), list(by_name)
    total = sum(s.ms for s in segments)
    expect(total > 0, "segments", "a total duration > 0 ms", total)
    expect(total <= MAX_MS, "segments", f"a total duration of at most {MAX_MS:g} ms", total)

    ttft_ms, ttft_source = total, "sum of the serial segments"
    if "ttft" in top:
        tt = _mapping(top["ttft"], "ttft", {"ms", "source"}, {"ms"})
        ttft_ms = _num(tt, "ms", "ttft", positive=True)
        ttft_source = _str(tt, "source", "ttft", default="client timer")
        # shares over 100 %: the serial segments cannot take longer than the client saw
        expect(total <= ttft_ms * (1 + 1e-9), "ttft.ms",
               f"at least the segments' sum {total:g} ms (their shares would exceed 100 %)", ttft_ms)

    p = _mapping(top["prefill"], "prefill", {"segment", "attention_ms", "attention_share", "source"},
                 {"segment"})
    pseg = _str(p, "segment", "prefill")
    expect(pseg in names, "prefill.segment", "one of the segment names (" + ", ".join(names) + ")", pseg)
    prefill_ms = by_name[pseg].ms
    expect(prefill_ms > 0, "prefill.segment", "a segment with a duration > 0 ms", pseg)
    expect(("attention_ms" in p) != ("attention_share" in p), "prefill",
           "exactly one of attention_ms or attention_share", sorted(p))
    if "attention_ms" in p:
        attn = _num(p, "attention_ms", "prefill")
        expect(attn <= prefill_ms, "prefill.attention_ms",
               f"at most the prefill segment's {prefill_ms:g} ms (a share over 100 %)", attn)
    else:
        v = p["attention_share"]
        expect(finite_real(v) and 0 <= v <= 1, "prefill.attention_share",
               "a fraction in [0, 1] (a share over 100 % is impossible)", v)
        attn = attention_ms(v, prefill_ms, "prefill.attention_share")

    dd = _mapping(top["decode"], "decode", {"tpot_ms", "source"}, {"tpot_ms"})
    c = _mapping(top["change"], "change", {"description", "segment", "speedup", "source"},
                 {"segment", "speedup"})
    cseg = _str(c, "segment", "change")
    expect(cseg in names, "change.segment", "one of the segment names (" + ", ".join(names) + ")", cseg)
    if cseg != pseg:
        raise NotImplementedError(f"change.segment: only the split prefill segment ({pseg!r}) is supported "
                                  f"(the speedup applies to its attention part), got {short(cseg)}")
    s = c.get("speedup")
    lo, hi = BOUNDS["speedup"]
    expect(finite_real(s) and lo <= s <= hi, "change.speedup", f"a kernel speedup S in [{lo:g}, {hi:g}]", s)

    return Trace(
        title=title, workload=workload, targets=targets, segments=segments,
        ttft_ms=ttft_ms, ttft_source=ttft_source,
        prefill_segment=pseg, attention_ms=attn, prefill_source=_str(p, "source", "prefill", default="trace"),
        tpot_ms=_num(dd, "tpot_ms", "decode", positive=True),
        decode_source=_str(dd, "source", "decode", default="trace"),
        change_description=_str(c, "description", "change", default="Faster attention kernel"),
        speedup=float(s), change_source=_str(c, "source", "change", default="assumed"),
    )
