"""Attention's time share of a transformer prefill or training step, measured, and the closed Amdahl loop
(spec §5, §5.1).

A prefill of P tokens runs through the Llama-shaped decoder of measure/decoder.py with one attention:
``naive`` (the explicit 3-kernel baseline, spec §1), one SDPA backend (``flash``, ``cudnn``,
``efficient``, ``math``; restricted, no fallback) or ``attnscope`` (this project's Triton kernel).

**f_time** = attention kernel time / the prefill's kernel time, from one torch.profiler trace, by
`attnscope.chrome_trace.attention_share` (the rule `report --profile` uses too: "attention" is the
kernels inside the ``attnscope::attention`` range: QK^T, mask, softmax, PV). The FLOP share is printed
beside it; it is not a time share.

**Training step** (``train``): the same decoder with weights that require grad, in the given dtype
(no autocast); one step is the forward, the loss sum(out * g) for a fixed random g [B, P, hidden], and
the backward; no optimizer step. f_time counts the forward's attention and each attention's backward
(its own range, measure/decoder.py); the FLOP share counts forward + backward (attention backward =
2.5 x forward, model/flops.py; the linear layers' backward = 2 x forward, so 3 x in all).

**Closed loop** (``project_to``): measure f_time(A) of the baseline A and the kernel speedup
S = t_A / t_B of attention alone ([1, 32, P, 128], causal; forward + backward for a training step),
project the step's speedup with Amdahl (model/amdahl.py), then swap B in, time both steps (prefills or
training steps), and report projected vs measured and the error. A and B are timed interleaved (alone and
in the step, `paired_time_ms`) on one input, and both steps are profiled one after the other, so that both
sides of every ratio meet the same clocks (a GPU at its power cap slows the later of two series); the steps
are timed once more back to back (sustained load: at the cap the faster step loses more clock). A
prefill is also timed as CUDA-graph replays (device time, no host path; beside it each eager step's idle
time, wall less kernel time): a short prefill can be host-bound, which Amdahl on kernel time cannot see.
So the loop also projects with the host beside the device (`ClosedLoop.projected_host_aware`: a step takes
max(host, device); the swap changes the host time by the two attention calls' host difference per layer).
Where the error comes from: B's step is profiled too, so its attention time *in the step* stands beside its
time alone (S in the step = attention_ms(A) / attention_ms(B), both from the profiler; Amdahl with that S),
and the rest of the step (kernel time outside attention) beside A's: a kernel slower in the step than
alone, or a rest of the step that changed with the swap, is what Amdahl's two numbers cannot see.
S is also taken on kernel time (`paired_kernel_ms`: each call alone profiled, the union of its kernels),
f_time's unit: events around a call alone also count the GPU idle before and between its launches (a
fused training call waits on the host between its forward and its backward), which the steps hide;
`ClosedLoop.projected_busy` is Amdahl with that S.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

from attnscope import chrome_trace
from attnscope.errors import choice, positive_int
from attnscope.measure.backends import (
    attention_fn,
    capture_graph,
    profile_trace,
    require_cuda,
    save_trace,
    torch_dtype,
)
from attnscope.measure.decoder import ATTENTIONS, PREFILL, LlamaShape, build_decoder
from attnscope.model import amdahl
from attnscope.model.flops import attention_flops

#: Steps run back to back per timed repetition of the closed loop's sustained-load timing.
SUSTAINED_BURST = 10
#: Query rows of the attention call whose host time the closed loop measures (its GPU work shorter than its
#: launch: what a host-bound step waits on), and the calls per timing.
HOST_ROWS, HOST_CALLS = 128, 200

#: The range around one profiled training step: no word "prefill", so the share counts all its kernels.
TRAIN_STEP = "attnscope::train_step"


# --- FLOPs (analytic, CPU) --------------------------------------------------------------------------
def flops(shape: LlamaShape, p: int, causal: bool = True, train: bool = False) -> dict:
    """FLOPs of a P-token prefill (or, with ``train``, a training step's forward + backward) through
    ``shape.layers`` layers, split attention core / the rest.

    Per layer: QKV projection 2*P*h*3h, output projection 2*P*h*h, SwiGLU MLP 3 x 2*P*h*m; attention
    core from `attnscope.model.flops.attention_flops` (4*P^2*d*H, halved when causal). Training: the
    linear layers x 3 (forward, then the gradients of the input and of the weight), attention forward +
    backward (x 3.5). Norms, RoPE and the softmax's elementwise work are not counted (they are
    FLOP-cheap; that is spec §5.1's point).
    """
    positive_int("p", p)
    h, m = shape.hidden, shape.mlp
    linear = (3 if train else 1) * (2 * p * h * 3 * h + 2 * p * h * h + 3 * 2 * p * h * m)
    attn = attention_flops(1, shape.heads, p, p, shape.head_dim, causal,
                           pass_="forward+backward" if train else "forward")
    total = shape.layers * (linear + attn)
    return {"attention": shape.layers * attn, "other": shape.layers * linear, "total": total,
            "share": shape.layers * attn / total}


# --- timing and the profile (GPU) --------------------------------------------------------------------
def cuda_time_ms(fn, warmup: int = 3, reps: int = 10) -> float:
    """Median device time of ``fn()`` in ms, CUDA events around each repetition, after warm-up."""
    return paired_time_ms({"fn": fn}, warmup, reps)["fn"]


def paired_time_ms(fns: dict, warmup: int = 3, reps: int = 10, burst: int = 1) -> dict:
    """Median device time in ms of each function in ``fns`` ({name: fn}), the repetitions interleaved (one
    of each per round, the order reversed every other round; CUDA events around each, synchronized), so
    that every function meets the same clocks: a GPU at its power cap (an H200 prefill at P 16k draws
    ~690 W of 700 and its SM clock falls from 1,980 to 1,260-1,700 MHz) slows the later of two series
    timed one after the other. ``burst``: each repetition runs the function that many times back to back
    (no synchronization between: sustained load, as a busy server runs it) and counts the mean."""
    import torch

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    order = list(fns)
    for rep in range(reps):
        for name in (order if rep % 2 == 0 else order[::-1]):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(burst):
                fns[name]()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) / burst)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def paired_kernel_ms(fns: dict, reps: int = 5) -> dict:
    """Median kernel time in ms of one call of each function in ``fns`` ({name: fn}): each call profiled
    alone (`profile_trace`, after one warm-up call), the union of its kernels' time
    (`chrome_trace.kernel_time_ms`: f_time's unit, no GPU idle), in interleaved rounds as `paired_time_ms`."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    order = list(fns)
    for rep in range(reps):
        for name in (order if rep % 2 == 0 else order[::-1]):
            times[name].append(chrome_trace.kernel_time_ms(profile_trace(fns[name]), f"{name}'s trace"))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


@dataclass
class ShareResult:
    """f_time of one prefill or training step (``train``): attention and total kernel device time (ms),
    the FLOP share beside it."""

    attention: str
    p: int
    layers: int
    attention_ms: float
    total_ms: float          # the prefill's kernel time (union; chrome_trace.Share.busy_ms)
    flop_share: float
    kernels: int
    top: list = field(default_factory=list)  # [(name, ms, is_attention)] the longest kernels
    span_ms: float | None = None  # the prefill's wall span on the GPU, idle gaps included
    train: bool = False      # a training step (forward + backward), not a prefill

    @property
    def f_time(self) -> float:  # as chrome_trace.Share.share
        return min(1.0, self.attention_ms / self.total_ms) if self.total_ms > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "f_time": self.f_time,
                "top": [{"name": n, "ms": ms, "attention": a} for n, ms, a in self.top]}


def _step_name(train: bool) -> str:
    return "training step" if train else "prefill"


def share_from_trace(trace, attention: str, p: int, shape: LlamaShape, train: bool = False) -> ShareResult:
    """f_time from a Chrome trace of one prefill, or of one training step with ``train`` (pure Python:
    recorded traces are tested on a CPU)."""
    s = chrome_trace.attention_share(trace, f"trace of the {attention} {_step_name(train)}")
    return ShareResult(attention, p, shape.layers, s.attention_ms, s.busy_ms,
                       flops(shape, p, train=train)["share"], s.kernels, list(s.longest), s.span_ms, train)


def step_fn(model, x, train: bool):
    """One step of ``model`` on ``x [B, P, hidden]``: the prefill ``model(x)``, or with ``train`` the
    training step of the module docstring (weight gradients cleared first, so none accumulates)."""
    import torch

    if not train:
        return functools.partial(model, x)
    g = torch.randn_like(x)  # d loss / d out: loss = sum(out * g)

    def step():
        for w in model.weights:
            w.grad = None
        model(x).backward(g)

    return step


def attention_step_fn(attention: str, qkv, train: bool):
    """Attention alone on ``qkv`` ([1, H, P, d] each, causal): the forward, or with ``train`` forward +
    backward against a fixed random dO (input gradients cleared first)."""
    import torch

    call = functools.partial(attention_fn(attention, True), *qkv)
    if not train:
        return call
    do = torch.randn_like(qkv[0])  # dO [1, H, P, d]

    def fwd_bwd():
        for t in qkv:
            t.grad = None
        call().backward(do)

    return fwd_bwd


def measure_share(attention: str = "flash", p: int = 4096, layers: int = 2, dtype: str = "fp16",
                  keep_trace: str | None = None, train: bool = False) -> ShareResult:
    """Build the decoder, warm it up, profile one prefill (or training step, ``train``), and return
    f_time (see module docstring)."""
    torch = require_cuda()
    positive_int("p", p)  # attention: checked by build_decoder, layers by LlamaShape
    shape = LlamaShape(layers=layers)
    dt = torch_dtype(torch, dtype)
    model = build_decoder(shape, attention, dtype=dt, train=train)
    x = torch.randn(1, p, shape.hidden, device="cuda", dtype=dt)  # [B, P, hidden]
    return _profiled_share(step_fn(model, x, train), attention, p, shape, train, keep_trace)


def _profiled_share(step, attention: str, p: int, shape: LlamaShape, train: bool,
                    keep_trace: str | None = None) -> ShareResult:
    """One warm-up ``step()`` (cuBLAS heuristics, Triton autotuning), then one profiled: its f_time."""
    import torch

    with torch.inference_mode(not train):
        step()
        torch.cuda.synchronize()
        trace = profile_trace(step, TRAIN_STEP if train else PREFILL)
    if keep_trace:
        save_trace(trace, keep_trace)
    return share_from_trace(trace, attention, p, shape, train)


def _error(projected: float | None, measured: float | None) -> float | None:
    """A projection's error, projected / measured - 1 (positive: it promised more); None without either."""
    return None if projected is None or measured is None else projected / measured - 1.0


@dataclass
class ClosedLoop:
    """Projected vs measured step speedup when attention ``baseline`` is swapped for ``candidate``; the
    step is a prefill, or a training step with ``train`` (then ``kernel_ms`` is attention's forward +
    backward and ``prefill_ms`` holds the training steps' times)."""

    baseline: str
    candidate: str
    p: int
    layers: int
    f_time: float
    kernel_ms: dict          # attention alone: {baseline: ms, candidate: ms}
    prefill_ms: dict         # the whole step: {baseline: ms, candidate: ms}
    share: ShareResult | None = None
    train: bool = False
    candidate_share: ShareResult | None = None  # the candidate's step profiled the same way
    graph_ms: dict | None = None  # the prefills replayed from CUDA graphs: device time, no host path
    graph_note: str | None = None  # why there are no replays (a capture that failed)
    sustained_ms: dict | None = None  # the steps under sustained load: `SUSTAINED_BURST` back to back, mean
    host_us: dict | None = None  # host µs per attention call alone (`HOST_ROWS` rows: the GPU waits on it)
    issue_ms: dict | None = None  # host ms to issue one whole step (its launches, no wait on the GPU)
    kernel_busy_ms: dict | None = None  # attention alone, its kernel time (`paired_kernel_ms`): f_time's unit

    @property
    def s_kernel(self) -> float:
        return self.kernel_ms[self.baseline] / self.kernel_ms[self.candidate]

    @property
    def s_in_step(self) -> float | None:
        """attention_ms(baseline) / attention_ms(candidate), each profiled in its own step (None without
        both profiles)."""
        if self.share is None or self.candidate_share is None or self.candidate_share.attention_ms <= 0:
            return None
        return self.share.attention_ms / self.candidate_share.attention_ms

    @property
    def projected_in_step(self) -> float | None:
        """Amdahl with the baseline's f_time and `s_in_step`: the projection had the kernel run in the step
        as fast as it did (what is left of the error is the rest of the step)."""
        s = self.s_in_step
        return None if s is None else amdahl.speedup(self.f_time, s)

    @property
    def rest_ms(self) -> dict | None:
        """Kernel time outside attention in each profiled step: {baseline: ms, candidate: ms}."""
        if self.share is None or self.candidate_share is None:
            return None
        return {self.baseline: self.share.total_ms - self.share.attention_ms,
                self.candidate: self.candidate_share.total_ms - self.candidate_share.attention_ms}

    @property
    def projected(self) -> float:
        return amdahl.speedup(self.f_time, self.s_kernel)

    @property
    def s_kernel_busy(self) -> float | None:
        """`s_kernel` on kernel time, the unit f_time counts in (events around a call alone also count the GPU
        idle before and between its launches); None without `kernel_busy_ms` or without the candidate's
        kernels in its profile."""
        b = self.kernel_busy_ms
        return None if not b or not b[self.candidate] > 0 else b[self.baseline] / b[self.candidate]

    @property
    def projected_busy(self) -> float | None:
        """Amdahl with f_time and `s_kernel_busy` (both on kernel time); None without them."""
        s = self.s_kernel_busy
        return None if s is None else amdahl.speedup(self.f_time, s)

    @property
    def error_busy(self) -> float | None:
        """projected_busy / measured - 1 (None without it)."""
        return _error(self.projected_busy, self.measured)

    @property
    def error_busy_graph(self) -> float | None:
        """projected_busy / measured_graph - 1: on device time alone (None without either)."""
        return _error(self.projected_busy, self.measured_graph)

    @property
    def measured(self) -> float:
        return self.prefill_ms[self.baseline] / self.prefill_ms[self.candidate]

    @property
    def error(self) -> float:
        """projected / measured - 1: positive when Amdahl promised more than the swap delivered."""
        return self.projected / self.measured - 1.0

    def _speedup(self, times: dict | None) -> float | None:
        """baseline / candidate of ``times`` ({name: ms}; None without them)."""
        return None if not times else times[self.baseline] / times[self.candidate]

    def _error_against(self, measured: float | None) -> float | None:
        """projected / ``measured`` - 1 (None without a measurement)."""
        return _error(self.projected, measured)

    @property
    def measured_graph(self) -> float | None:
        """The swap's speedup on CUDA-graph replays of both prefills (None without them)."""
        return self._speedup(self.graph_ms)

    @property
    def error_graph(self) -> float | None:
        """projected / measured_graph - 1: Amdahl's error on the device time alone."""
        return self._error_against(self.measured_graph)

    @property
    def measured_sustained(self) -> float | None:
        """The swap's speedup under sustained load (steps back to back; None without that timing)."""
        return self._speedup(self.sustained_ms)

    @property
    def error_sustained(self) -> float | None:
        """projected / measured_sustained - 1: Amdahl's error where the GPU stays at its power cap."""
        return self._error_against(self.measured_sustained)

    @property
    def projected_host_aware(self) -> float | None:
        """Amdahl with the host beside the device: a step takes max(host, device) time, the launches issued
        while the GPU runs the earlier ones. The baseline's step: max(issue_ms, device ms: its graph replay,
        else its profiled kernel time); the candidate's: the host time less ``layers`` x the two attention
        calls' host difference (`host_us`; a training step's call is forward + backward), the device time
        by Amdahl. Their ratio; None without the host timings."""
        if not self.host_us or not self.issue_ms or (self.graph_ms is None and self.share is None):
            return None
        a, b = self.baseline, self.candidate
        dev_a = self.graph_ms[a] if self.graph_ms else self.share.total_ms
        host_b = self.issue_ms[a] - self.layers * (self.host_us[a] - self.host_us[b]) / 1e3
        dev_b = dev_a * (1.0 - self.f_time + self.f_time / self.s_kernel)
        return max(self.issue_ms[a], dev_a) / max(host_b, dev_b)

    @property
    def error_host_aware(self) -> float | None:
        """projected_host_aware / measured - 1 (the eager steps' speedup)."""
        return _error(self.projected_host_aware, self.measured)

    @property
    def host_gap_ms(self) -> dict | None:
        """Per step, its measured time less its profiled kernel time: the GPU idle, waiting for the host's
        launches (where it is large, the step is host-bound: Amdahl on kernel time does not describe it)."""
        if self.share is None or self.candidate_share is None:
            return None
        return {self.baseline: self.prefill_ms[self.baseline] - self.share.total_ms,
                self.candidate: self.prefill_ms[self.candidate] - self.candidate_share.total_ms}

    def to_json(self) -> dict:
        return {**asdict(self), "s_kernel": self.s_kernel, "projected_speedup": self.projected,
                "measured_speedup": self.measured, "error": self.error,
                "share": self.share.to_json() if self.share else None,
                "candidate_share": self.candidate_share.to_json() if self.candidate_share else None,
                "s_in_step": self.s_in_step, "projected_in_step": self.projected_in_step,
                "rest_ms": self.rest_ms, "measured_graph": self.measured_graph,
                "error_graph": self.error_graph, "host_gap_ms": self.host_gap_ms,
                "measured_sustained": self.measured_sustained, "error_sustained": self.error_sustained,
                "projected_host_aware": self.projected_host_aware, "error_host_aware": self.error_host_aware,
                "s_kernel_busy": self.s_kernel_busy, "projected_busy": self.projected_busy,
                "error_busy": self.error_busy, "error_busy_graph": self.error_busy_graph}


def closed_loop(baseline: str = "naive", candidate: str = "attnscope", p: int = 4096, layers: int = 2,
                dtype: str = "fp16", reps: int = 10, train: bool = False) -> ClosedLoop:
    """The closed loop of the module docstring: f_time(baseline), S, Amdahl's projection, both steps
    (prefills, or training steps with ``train``)."""
    torch = require_cuda()
    choice("baseline", baseline, ATTENTIONS)
    choice("project_to", candidate, ATTENTIONS)
    positive_int("p", p)
    shape = LlamaShape(layers=layers)
    dt = torch_dtype(torch, dtype)
    names = (baseline, candidate)
    qkv = [torch.randn(1, shape.heads, p, shape.head_dim, device="cuda", dtype=dt, requires_grad=train)
           for _ in range(3)]
    tiny = [torch.randn(1, shape.heads, HOST_ROWS, shape.head_dim, device="cuda", dtype=dt,
                        requires_grad=train) for _ in range(3)]
    from attnscope.measure.bench import host_us_per_call

    with torch.inference_mode(not train):
        kernel_ms = paired_time_ms({n: attention_step_fn(n, qkv, train) for n in names}, reps=reps)
        kernel_busy_ms = paired_kernel_ms({n: attention_step_fn(n, qkv, train) for n in names},
                                          reps=max(3, reps // 2))
        host_us = host_us_per_call(torch, {n: attention_step_fn(n, tiny, train) for n in names}, HOST_CALLS)
    qkv.clear()  # free the attention-alone inputs before the steps
    x = torch.randn(1, p, shape.hidden, device="cuda", dtype=dt)  # one input for both steps
    steps = {n: step_fn(build_decoder(shape, n, dtype=dt, train=train), x, train) for n in names}
    shares = {n: _profiled_share(steps[n], n, p, shape, train) for n in names}  # one after the other
    with torch.inference_mode(not train):
        prefill_ms = paired_time_ms(steps, reps=reps)
        sustained_ms = paired_time_ms(steps, warmup=0, reps=max(2, reps // 3), burst=SUSTAINED_BURST)
        issue_ms = {n: us / 1e3 for n, us in host_us_per_call(torch, steps, 1, rounds=reps).items()}
        graph_ms, note = None, "a training step is not replayed" if train else None
        if not train:
            try:
                graph_ms = paired_time_ms({n: capture_graph(steps[n]).replay for n in names}, reps=reps)
            except RuntimeError as e:  # a capture refused: the eager loop stands, the reason printed
                torch.cuda.synchronize()
                note = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return ClosedLoop(baseline, candidate, p, layers, shares[baseline].f_time, kernel_ms, prefill_ms,
                      shares[baseline], train, shares[candidate], graph_ms, note, sustained_ms, host_us,
                      issue_ms, kernel_busy_ms)
