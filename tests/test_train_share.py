"""The attention share of a packed training step (bench/train.py, issue 36): every kernel attnscope's packed
forward + backward launches is attention by chrome_trace's name rule; the torch ops around them count
through the ``attnscope::attention_backward`` range, which bench/train.py's model opens per layer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from attnscope import chrome_trace as ct
from attnscope.measure import decoder

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def _launched_kernels(monkeypatch, fn):
    """Names of the Triton kernels ``fn()`` launches under TRITON_INTERPRET=1 (each ``kernel[grid](...)``)."""
    from triton.runtime.interpreter import InterpretedFunction

    names = []
    run = InterpretedFunction.run

    def recording(self, *args, **kwargs):
        if not kwargs.get("warmup"):
            names.append(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording)
    fn()
    return names


@pytest.mark.parametrize("deterministic", [False, True])
def test_packed_forward_backward_kernels_are_attention_by_name(monkeypatch, deterministic):
    from attnscope.kernels import _common
    from attnscope.kernels.varlen import flash_attention_varlen

    if not _common.interpreting():
        pytest.skip("records the launches of the Triton interpreter")
    lens = [3, 0, 5, 1]
    cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lens), 2, 64, generator=g).to(torch.float16).requires_grad_()
    k, v = (torch.randn(sum(lens), 1, 64, generator=g).to(torch.float16).requires_grad_() for _ in range(2))

    def step():
        o = flash_attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True,
                                   deterministic=deterministic)
        o.backward(torch.randn(o.shape, generator=g).to(o.dtype))

    names = _launched_kernels(monkeypatch, step)
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    # forward (plan + kernel), backward (Delta, plan, dK/dV, dQ): the portable path a CPU runs
    assert {"_attnscope_varlen_plan_kernel", "_attnscope_varlen_kernel", "_attnscope_bwd_preprocess",
            "_attnscope_varlen_dkdv_kernel", "_attnscope_varlen_dq_kernel"} <= set(names), names
    for name in names:
        assert ct.family(name) == "attnscope" and ct.is_attention_kernel(name), name


def test_hopper_packed_backward_kernels_are_attention_by_name():
    vh = pytest.importorskip("attnscope.kernels.varlen_bwd_hopper")
    for which in ("dkdv", "dq"):
        name = vh.kernel(which).__name__  # the name the compiled kernel carries in a CUDA trace
        assert ct.family(name) == "attnscope" and ct.is_attention_kernel(name), name


def _packed_training_step():
    """One layer of an attnscope packed step as the profiler records it: forward on thread 1 inside
    ``attnscope::attention``; backward on autograd's thread 2, its torch ops (dK/dV zeros, the scaled LSE,
    the padded rows) inside ``attnscope::attention_backward``, its kernels by name either way."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": n, "ts": ts, "dur": dur, "tid": tid}
          for n, ts, dur, tid in ((decoder.ANNOTATION, 10, 20, 1), (decoder.BACKWARD, 200, 40, 2))]
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>, ...>"
    kernels = [  # (name, start, duration us, launch thread, launch time)
        ("sm90_xmma_gemm_qkv", 1000, 100, 1, 5),
        ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", 1100, 10, 1, 12),
        ("_attnscope_varlen_plan_kernel", 1110, 5, 1, 14), ("_attnscope_varlen_kernel", 1115, 50, 1, 16),
        ("sm90_xmma_gemm_mlp", 1165, 300, 1, 40),
        ("sm90_xmma_gemm_mlp_bwd", 1465, 600, 2, 150),
        (fill, 2065, 5, 2, 205), (fill, 2070, 5, 2, 206), ("_attnscope_bwd_preprocess", 2075, 10, 2, 207),
        ("void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>", 2085, 5, 2, 208),
        ("_attnscope_varlen_plan_kernel", 2090, 5, 2, 209),
        ("void at::native::index_copy_kernel_impl<...>", 2095, 5, 2, 210),
        ("_attnscope_varlen_bwd_hopper_dkdv_kernel", 2100, 100, 2, 212),
        ("_attnscope_varlen_bwd_hopper_dq_kernel", 2200, 60, 2, 214),
        ("sm90_xmma_gemm_qkv_bwd", 2260, 200, 2, 250),
    ]
    for i, (name, ts, dur, tid, launch) in enumerate(kernels):
        ev += [{"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 9,
                "args": {"correlation": i + 1}},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 1,
                "tid": tid, "args": {"correlation": i + 1}}]
    return {"traceEvents": ev}


def test_packed_step_counts_named_kernels_and_the_backward_range():
    trace = _packed_training_step()
    s = ct.attention_share(trace)
    # forward range 10 + 5 + 50; backward range 5 + 5 + 10 + 5 + 5 + 5 + 100 + 60
    assert s.attention_kernels == 11 and s.attention_ms == pytest.approx(0.260)
    assert s.busy_ms == pytest.approx(1.460)
    for e in trace["traceEvents"]:  # without the backward range its torch ops are not attention
        if e["name"] == decoder.BACKWARD:
            e["name"] = "autograd::engine"
    s = ct.attention_share(trace)
    assert s.attention_kernels == 7 and s.attention_ms == pytest.approx(0.240)


def _bench_train():
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_train", mod)
    spec.loader.exec_module(mod)
    return mod


def test_bench_train_model_opens_one_backward_range_per_layer():
    """bench/train.py's decoder: each layer's attention backward runs inside ``attnscope::attention_backward``
    (a math attention here: its backward ops have names of their own) and nothing else does."""
    from torch.profiler import ProfilerActivity, profile

    train = _bench_train()
    args = train.parse_args(["--tiny", "--steps", "2"])
    params, forward = train.build_model(torch, args, 0, torch.device("cpu"))

    def math_attn(q, k, v, ctx):  # [B, Hq, S, d], GQA by repeating K/V
        g = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(g, dim=1) for t in (k, v))
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        causal = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        return torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v

    toks = torch.randint(0, args.vocab, (1, 16), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(16)[None]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward(toks, pos, math_attn, {}).float().square().mean().backward()
    assert all(p.grad is not None for p in params.values())
    evs = list(prof.profiler.function_events)
    ranges = [e for e in evs if e.name == decoder.BACKWARD]
    assert len(ranges) == args.layers
    ops = [e for e in evs if e.name.startswith("autograd::engine::evaluate_function: ")]
    for r in ranges:
        inside = {o.name.split(": ")[1] for o in ops if o.thread == r.thread
                  and r.time_range.start <= o.time_range.start < r.time_range.end}
        assert {"SoftmaxBackward0", "MaskedFillBackward0"} <= inside, inside
        assert not inside & {"SiluBackward0", "CatBackward0", "MmBackward0", "AddBackward0"}, inside


def test_share_lines_show_the_three_shares_and_what_is_missing():
    train = _bench_train()
    assert train.share_lines({"step_ms": 10.0}, 12) == []  # a CPU run: no share
    r = {"share_trace": 0.092, "attention_ms_trace": 17.3, "busy_ms_trace": 188.0, "span_ms_trace": 190.0,
         "share_alone_kernels": 0.0921, "attention_kernel_ms": 17.32, "share_timed": 0.241,
         "attention_ms": 45.4, "attention_host_ms": 44.0,
         "alone_unnamed_ms": [["void at::native::FillFunctor<c10::BFloat16>", 0.01], ["index_copy", 0.002]]}
    head, tail = train.share_lines(r, 12)
    assert "trace 0.092 (17.3 of 188.0 ms" in head
    assert "alone kernels 0.092 (12 layers x one call: 17.3 ms" in head
    assert "timed 0.241 (45.4 ms CUDA-event time" in head and "44.0 ms host time" in head
    assert "2 names, 0.012 ms" in tail
    r.update(share_trace=None, share_trace_error="trace: expected attention kernels")
    r.pop("share_alone_kernels")
    lines = train.share_lines(r, 12)
    assert "trace n/a" in lines[0] and "alone kernels n/a" in lines[0]
    assert "expected attention kernels" in lines[1]
