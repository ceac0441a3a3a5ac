"""One reader of torch.profiler Chrome traces, one rule for "what is attention", one share (spec §5, §6.2).

Used by `attnscope share` (measure/share.py), `attnscope which` (measure/backends.py) and
`attnscope report --profile` (report/evidence.py), so the three cannot disagree. Pure Python: no torch.

Events read (``ph`` "X", complete events; a begin/end pair in these categories is refused, never
skipped; instants are skipped; microseconds): ``kernel`` (GPU kernels), ``cuda_runtime``/``cuda_driver``
(their launches; ``args.correlation`` links a launch to its kernel), ``user_annotation`` (a
``record_function`` range on the CPU) and ``gpu_user_annotation`` (its projection on the GPU).
Every such event is checked: ``ts`` and ``dur`` bounded (`MAX_TS_US`, `MAX_DUR_US`; ``dur`` >= 0),
``args`` an object, ``name`` a string, ``tid`` an integer or a string, ``args.correlation`` an integer
(and ``cat`` and ``ph`` of every event a string); anything else is an InputError naming the event and
the field.

- **Prefill span**: the ranges whose name contains the word ``prefill`` (``attnscope::prefill``,
  ``prefill``). Their GPU projection when the trace has one (span = its duration, kernels = those
  inside it); else the kernels launched inside the CPU range (span = their extent); else all kernels.
- **Attention**: a kernel launched inside (CPU range, by correlation) or running inside (GPU range)
  a range whose name contains the word ``attention`` or ``attn`` -- whole words only, so
  ``attnscope::prefill`` is not attention but ``attnscope::attention`` and ``self_attn`` are; or a
  kernel whose name is a fused attention kernel (`family` below) or contains the word attn/attention.
  A training step (``share --train``) is profiled with no prefill range, so all its kernels count; its
  backward's attention kernels are those launched in ``attnscope::attention_backward`` (measure/decoder.py).
- **Share** = attention kernel time / the prefill's kernel time (both a union of intervals, so
  overlapping streams count once). Kernel time, not the wall span: under the profiler the CPU launch
  path slows and the GPU idles between kernels, gaps that an unprofiled prefill does not have. Applied
  to a measured prefill time it assumes a GPU-bound prefill; the span is reported beside it.

Range matching is sorted intervals + bisection: O(n log n) in the number of events.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from attnscope.errors import InputError, finite_real, visible
from attnscope.inputs import load_json, read_text

#: Kernel families, fused attention ones first.
FUSED = ("attnscope", "flash", "efficient", "cudnn")

#: (family, predicate on the lower-cased kernel name); first match wins (torch 2.x, SM80/SM90), forward
#: and backward: flash_fwd_* / flash_bwd_* (FA-2 in SDPA), fmha_cutlassF/B (efficient), cuDNN's
#: *_sdpa_*_fprop/_bprop, _attnscope_*_fwd/_bwd. A naive backward (GEMMs, softmax backward, the mask's
#: backward) has no such name: the attention range counts it.
#: Fused families come before gemm/softmax because fused kernels' names can contain "cutlass" or "flash".
_TABLE = (
    ("attnscope", lambda s: s.startswith("_attnscope_")),
    ("flash", lambda s: ("flash_fwd" in s or "flash_bwd" in s) and "cudnn" not in s),
    ("efficient", lambda s: "fmha_cutlass" in s or "pytorchmemeffattention" in s or "attentionkernel" in s),
    ("cudnn", lambda s: "cudnn" in s and any(t in s for t in ("sdpa", "fmha", "flash", "fprop"))),
    ("softmax", lambda s: "softmax" in s),
    ("gemm", lambda s: any(t in s for t in ("gemm", "xmma", "cutlass", "bmm", "s16816", "s1688", "nvjet"))),
)

_ATTENTION_WORD = re.compile(r"(?<![a-z0-9])(attn|attention)(?![a-z0-9])", re.IGNORECASE)
_PREFILL_WORD = re.compile(r"(?<![a-z0-9])prefill(?![a-z0-9])", re.IGNORECASE)
_LAUNCH = ("cuda_runtime", "cuda_driver")
_CHECKED = ("kernel", "user_annotation", "gpu_user_annotation") + _LAUNCH
#: Begin/end ``ph`` of durations (sync and async): not read, so refused in the categories above.
_PAIRED = ("B", "E", "b", "e")
#: Largest |ts| (about 317 years of microseconds: epoch timestamps fit, at sub-microsecond precision)
#: and dur (about 11.6 days) read; past them ts + dur loses its digits or leaves the float range.
MAX_TS_US = 1e16
MAX_DUR_US = 1e12


def family(name: str) -> str:
    """The family of one kernel name (see the table above); ``other`` when nothing matches."""
    s = name.strip().lower()
    for fam, match in _TABLE:
        if match(s):
            return fam
    return "other"


def backend_of(names) -> str:
    """The backend a list of kernel names shows: the fused family when exactly one appears; ``mixed``
    for two; ``math`` for GEMM + softmax and no fused kernel; else ``unknown``."""
    fams = {family(n) for n in names}
    fused = [f for f in FUSED if f in fams]
    if len(fused) == 1:
        return fused[0]
    if len(fused) > 1:
        return "mixed"
    return "math" if "gemm" in fams and "softmax" in fams else "unknown"


def is_attention_range(name: str) -> bool:
    """True when a range's name contains the whole word ``attention`` or ``attn``."""
    return bool(_ATTENTION_WORD.search(name))


def is_attention_kernel(name: str) -> bool:
    """True for a fused attention kernel's name, or one containing the whole word attn/attention."""
    return family(name) in FUSED or bool(_ATTENTION_WORD.search(name))


@dataclass(frozen=True)
class KernelEvent:
    """One GPU kernel: name, start and duration in microseconds, the launch's correlation id."""

    name: str
    ts_us: float
    dur_us: float
    correlation: int | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "family": family(self.name), "ts_us": self.ts_us, "dur_us": self.dur_us}


# --- reading and checking ---------------------------------------------------------------------------
def load(path, where: str = "trace"):
    """Read a Chrome trace (``.json`` or ``.json.gz``) through `attnscope.inputs` (UTF-8, size, depth,
    giant integers, NaN/inf); a bad file is an InputError naming ``where``."""
    text = read_text(path, where, gz=str(path).endswith(".gz"))
    return load_json(path, where, text=text)


def events(trace, where: str = "trace") -> list[dict]:
    """The checked ``X`` events of the categories this module reads (see the module docstring)."""
    evs = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(evs, list):
        raise InputError(f"{where}: expected a Chrome trace with a traceEvents list, "
                         f"got {type(trace).__name__}")
    out = []
    for i, e in enumerate(evs):
        if not isinstance(e, dict):
            continue
        field = f"{where}: traceEvents[{i}]"
        for key in ("cat", "ph"):  # a non-string would make the event silently not one of ours
            if not isinstance(e.get(key, ""), str):
                raise InputError(f"{field}.{key}: expected a string, got {type(e[key]).__name__}")
        if e.get("cat") not in _CHECKED:
            continue
        if e.get("ph") in _PAIRED:  # a begin/end pair: skipped, it would change the share unseen
            raise InputError(f"{field}.ph: expected 'X' (a complete event: ts and dur) for a {e['cat']} "
                             f"event, got {e['ph']!r}")
        if e.get("ph", "X") != "X":  # an instant (no duration) or metadata
            continue
        if not finite_real(e.get("ts")) or abs(e["ts"]) > MAX_TS_US:
            raise InputError(f"{field}.ts: expected a finite number within ±{MAX_TS_US:g} µs, "
                             f"got {visible(str(e.get('ts'))[:40])}")
        dur = e.get("dur", 0 if e["cat"] in _LAUNCH else None)  # a launch's own length is not used
        if not finite_real(dur) or not 0 <= dur <= MAX_DUR_US:
            raise InputError(f"{field}.dur: expected a finite number >= 0, at most {MAX_DUR_US:g} µs, got "
                             f"{visible(str(dur)[:40])}")
        if not isinstance(e.get("args", {}), dict):
            raise InputError(f"{field}.args: expected an object, got {type(e['args']).__name__}")
        tid = e.get("tid")
        if not (tid is None or isinstance(tid, (int, str))) or isinstance(tid, bool):
            raise InputError(f"{field}.tid: expected an integer or a string, got {type(tid).__name__}")
        corr = (e.get("args") or {}).get("correlation")
        if not (corr is None or isinstance(corr, int)) or isinstance(corr, bool):
            raise InputError(f"{field}.args.correlation: expected an integer, got {type(corr).__name__}")
        if not isinstance(e.get("name", ""), str):
            raise InputError(f"{field}.name: expected a string, got {type(e['name']).__name__}")
        out.append(e)
    return out


def _kernels(evs) -> list[KernelEvent]:
    ks = [KernelEvent(e.get("name", ""), float(e["ts"]), float(e.get("dur", 0)),
                      (e.get("args") or {}).get("correlation")) for e in evs if e["cat"] == "kernel"]
    return sorted(ks, key=lambda k: k.ts_us)


def kernels(trace, where: str = "trace") -> list[KernelEvent]:
    """GPU kernels of a Chrome trace, in start order."""
    return _kernels(events(trace, where))


# --- ranges: merged intervals and bisection ----------------------------------------------------------
class _Ranges:
    """Disjoint [a, b] intervals (merged), keyed by thread; `covers` is one bisection."""

    def __init__(self, spans):
        by_key: dict = {}
        for key, a, b in spans:
            by_key.setdefault(key, []).append((a, b))
        self.merged = {}
        for key, ivs in by_key.items():
            out: list[list[float]] = []
            for a, b in sorted(ivs):
                if out and a <= out[-1][1]:
                    out[-1][1] = max(out[-1][1], b)
                else:
                    out.append([a, b])
            self.merged[key] = ([a for a, _ in out], [b for _, b in out])

    def covers(self, key, a: float, b: float) -> bool:
        starts, ends = self.merged.get(key, ((), ()))
        i = bisect.bisect_right(starts, a) - 1
        return i >= 0 and b <= ends[i]

    def total(self) -> float:
        return sum(b - a for starts, ends in self.merged.values() for a, b in zip(starts, ends, strict=True))


def _ranges(evs, cat: str, match, by_thread: bool) -> _Ranges:
    return _Ranges(((e.get("tid") if by_thread else None), float(e["ts"]),
                    float(e["ts"]) + float(e.get("dur", 0)))
                   for e in evs if e["cat"] == cat and match(e.get("name", "")))


def _within(evs, ks, match) -> list[KernelEvent]:
    """Kernels launched inside a CPU range whose name satisfies ``match`` (by correlation); if no launch
    is linked (a build that does not trace driver launches), those inside its GPU projection."""
    cpu = _ranges(evs, "user_annotation", match, True)
    corr = {(e.get("args") or {}).get("correlation") for e in evs
            if e["cat"] in _LAUNCH and cpu.covers(e.get("tid"), float(e["ts"]), float(e["ts"]))}
    found = [k for k in ks if k.correlation is not None and k.correlation in corr]
    if found:
        return found
    gpu = _ranges(evs, "gpu_user_annotation", match, False)
    return [k for k in ks if gpu.covers(None, k.ts_us, k.ts_us + k.dur_us)]


def kernels_within(trace, annotation: str, where: str = "trace") -> list[KernelEvent]:
    """Kernels launched inside any ``record_function(annotation)`` range (exact name)."""
    evs = events(trace, where)
    return _within(evs, _kernels(evs), lambda n: n == annotation)


# --- the share ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Share:
    """Attention's share of one prefill (see the module docstring for every rule)."""

    span: str                # how the prefill span was found
    span_ms: float           # the prefill's wall span on the GPU
    busy_ms: float           # union of the prefill's kernel time
    attention_ms: float      # union of the attention kernels' time
    kernels: int
    attention_kernels: int
    top: tuple               # ((name, ms), ...) the largest attention kernels by total time
    longest: tuple           # ((name, ms, is_attention), ...) the 8 longest kernels of the prefill

    @property
    def share(self) -> float:
        """attention_ms / busy_ms: the one definition of attention's time share."""
        return min(1.0, self.attention_ms / self.busy_ms) if self.busy_ms > 0 else 0.0


def _union_ms(ks) -> float:
    return _Ranges((None, k.ts_us, k.ts_us + k.dur_us) for k in ks).total() / 1e3


def kernel_time_ms(trace, where: str = "trace") -> float:
    """The union of every GPU kernel's time in a trace, ms (overlapping kernels counted once): `Share`'s
    ``busy_ms`` of a trace that holds one call."""
    return _union_ms(kernels(trace, where))


def attention_share(trace, where: str = "trace") -> Share:
    """Attention's share of the prefill in a Chrome trace (a dict, or the traceEvents list).

    Raises InputError (naming ``where``) when the trace has no kernels, no kernel in the prefill span,
    no kernel time in it (0 / 0 is no share), or no attention kernel (or attention kernels of zero time).
    """
    evs = events(trace, where)
    ks = _kernels(evs)
    if not ks:
        raise InputError(f'{where}: expected GPU kernel events (cat "kernel"), got none; '
                         "profile with ProfilerActivity.CUDA")
    named = [e for e in evs if _PREFILL_WORD.search(e.get("name", ""))]
    gpu_prefill = [e for e in named if e["cat"] == "gpu_user_annotation"]
    cpu_prefill = [e for e in named if e["cat"] == "user_annotation"]
    if gpu_prefill:
        rng = _ranges(evs, "gpu_user_annotation", _PREFILL_WORD.search, False)
        in_span = [k for k in ks if rng.covers(None, k.ts_us, k.ts_us + k.dur_us)]
        span_us, how = rng.total(), f"GPU range {gpu_prefill[0]['name']!r}"
    else:
        if cpu_prefill:
            in_span = _within(evs, ks, _PREFILL_WORD.search)
            how = f"kernels launched in CPU range {cpu_prefill[0]['name']!r}"
        else:
            in_span, how = ks, "all kernels (no range named with the word 'prefill')"
        span_us = max(k.ts_us + k.dur_us for k in in_span) - min(k.ts_us for k in in_span) if in_span else 0.0
    if not in_span:
        raise InputError(f"{where}: expected kernels inside the prefill span ({how}), got none")
    busy_ms = _union_ms(in_span)
    if not busy_ms > 0:  # 0 / 0 is no share: it would replace the trace's split with 0 %
        raise InputError(f"{where}: expected kernel time > 0 in the prefill, got 0")
    ranged = {id(k) for k in _within(evs, in_span, is_attention_range)}
    attn = [k for k in in_span if id(k) in ranged or is_attention_kernel(k.name)]
    if not attn:
        raise InputError(f"{where}: expected attention kernels in the prefill (a fused attention kernel, or "
                         "kernels inside a range named with the word 'attention'), got none")
    attention_ms = _union_ms(attn)
    if not attention_ms > 0:
        raise InputError(f"{where}: expected attention kernel time > 0 in the prefill, got 0 "
                         f"({len(attn)} attention kernels of zero duration)")
    by_name: dict[str, float] = {}
    for k in attn:
        by_name[k.name] = by_name.get(k.name, 0.0) + k.dur_us / 1e3
    attn_ids = {id(k) for k in attn}
    longest = sorted(in_span, key=lambda k: -k.dur_us)[:8]
    return Share(span=how, span_ms=span_us / 1e3, busy_ms=busy_ms, attention_ms=attention_ms,
                 kernels=len(in_span), attention_kernels=len(attn),
                 top=tuple(sorted(by_name.items(), key=lambda kv: -kv[1])[:3]),
                 longest=tuple((k.name, k.dur_us / 1e3, id(k) in attn_ids) for k in longest))
