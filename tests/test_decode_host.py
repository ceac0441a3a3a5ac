"""What each decode call a user writes issues per call, once its plans are warm: Triton launches and aten ops.

The bf16 one-liner ``flash_decode(q, k, v, cache_seqlens=lens)`` is the reference: after its first call
it makes one allocation (the output) and launches its plan's kernels through the kept binary
(`_direct.DirectLaunch`), never through Triton's per-call dispatch (``kernel[grid]``: argument binding,
specialisation key, cache lookup). The FP8 one-liner, `DecodePlan.run` and `flash_attn_with_kvcache`
(without new keys, and appending them) must take the same path: the same launches (plus the append's
one), no allocation but the output (plus the lengths the append writes for a tensor ``cache_seqlens``),
no other aten op.

On the CPU the plans launch through a `DirectLaunch` of a recording stand-in for each kernel on "device 0"
(the kernels do not run: the outputs are not looked at), so the test sees which mechanism each launch
takes; the aten ops are recorded with a `TorchDispatchMode`. On a GPU (`test_gpu_...`) the real kernels run
and Triton's dispatch is counted on the JIT functions themselves, with the CUDA caching allocator's count.
"""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import attnscope  # noqa: E402
from attnscope.kernels import _direct, decode  # noqa: E402
from attnscope.kernels.decode import append as append_mod  # noqa: E402
from attnscope.kernels.decode import plan as plan_mod  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

fai = pytest.importorskip("attnscope.flash_attn_interface")

DEVICE = kernel_device()
B, HQ, HKV, L, D, PAGE = 2, 8, 2, 256, 64, 64

KERNELS = {"split": plan_mod._attnscope_decode_split_kernel,
           "combine": plan_mod._attnscope_decode_combine_kernel,
           "append": append_mod._attnscope_kv_append_kernel}


class _Ops(TorchDispatchMode):
    """The aten ops dispatched inside it (Triton's interpreter does not run: the kernels are stand-ins)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _calls():
    """name -> the call, on one small cache: dense [B, Hkv, L, d], its flash-attn view [B, L, Hkv, d], a
    paged copy, an e4m3 copy with per-head scales; one appended key per sequence."""
    g = torch.Generator().manual_seed(37)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=torch.bfloat16)

    q, k, v = rnd(B, HQ, 1, D), rnd(B, HKV, L, D), rnd(B, HKV, L, D)
    lens = torch.tensor([L, L - 100], dtype=torch.int32, device=DEVICE)
    k8, ks = attnscope.quantize_kv(k)
    v8, vs = attnscope.quantize_kv(v)
    plan = attnscope.decode_plan(q, k, v, lens)
    qf, kc, vc = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # flash-attn's layouts, views
    kn, vn = kc[:, -1:].clone(), vc[:, -1:].clone()
    before = lens - 1
    kp = kc.reshape(B * L // PAGE, PAGE, HKV, D).clone()  # sequence b's pages b * L / PAGE .. in order
    vp = vc.reshape(B * L // PAGE, PAGE, HKV, D).clone()
    table = torch.arange(B * L // PAGE, dtype=torch.int32, device=DEVICE).reshape(B, -1)
    fd, fa = attnscope.flash_decode, fai.flash_attn_with_kvcache
    return {
        "one-liner": lambda: fd(q, k, v, cache_seqlens=lens),
        "plan.run": lambda: plan.run(q, k, v, lens),
        "fp8 one-liner": lambda: fd(q, k8, v8, lens, k_scale=ks, v_scale=vs),
        "with_kvcache": lambda: fa(qf, kc, vc, cache_seqlens=lens),
        "with_kvcache, int length": lambda: fa(qf, kc, vc, cache_seqlens=L),
        "with_kvcache + append": lambda: fa(qf, kc, vc, kn, vn, cache_seqlens=before),
        "with_kvcache + append, int length": lambda: fa(qf, kc, vc, kn, vn, cache_seqlens=L - 1),
        "with_kvcache paged + append": lambda: fa(qf, kp, vp, kn, vn, cache_seqlens=before,
                                                  block_table=table),
    }


#: what a warm call issues beyond the bf16 one-liner's launches and output: (launches, allocations)
EXTRA = {"one-liner": ([], 0), "plan.run": ([], 0), "fp8 one-liner": ([], 0), "with_kvcache": ([], 0),
         "with_kvcache, int length": ([], 0), "with_kvcache + append": (["append"], 1),
         "with_kvcache + append, int length": (["append"], 0), "with_kvcache paged + append": (["append"], 1)}


class _Stand:
    """A kernel's stand-in: ``[grid](...)`` records a launch through Triton's dispatch and returns a
    compiled kernel whose ``run`` records a launch through the kept binary."""

    def __init__(self, name, kernel, log):
        self.name, self.log = name, log
        self.params = triton.runtime.jit.JITFunction(getattr(kernel, "fn", kernel)).params
        stand = self

        class Compiled:
            function, packed_metadata = "fn", "meta"

            def run(self, *args):
                stand.log.append(("direct", stand.name))
        self.compiled = Compiled()

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.log.append(("triton", self.name))
            return self.compiled
        return launch


@pytest.fixture
def launches(monkeypatch):
    """Plans made while it is active launch through `DirectLaunch`es of recording stand-ins on "device
    0"; yields the list of launches ((mechanism, kernel) in order)."""
    log = []
    names = {id(kernel): name for name, kernel in KERNELS.items()}

    def direct_launch(kernel, constexprs, device):
        return _direct.DirectLaunch(_Stand(names[id(kernel)], kernel, log), constexprs, 0)

    decode.clear_plan_cache()
    append_mod._plan.cache_clear()
    monkeypatch.setattr(plan_mod, "direct_launch", direct_launch)
    monkeypatch.setattr(append_mod, "direct_launch", direct_launch)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
    yield log
    decode.clear_plan_cache()  # their plans hold the stand-ins
    append_mod._plan.cache_clear()


def _warm_call(fn, log):
    """(launches, aten ops) of a call after two warm-up calls (the first plans and launches through Triton,
    the second through the kept binary)."""
    fn()
    fn()
    log.clear()
    with torch.no_grad(), _Ops() as ops:
        fn()
    return list(log), ops.ops


@pytest.mark.skipif(DEVICE != "cpu", reason="the stand-in kernels replace the CPU's interpreter")
def test_each_call_issues_the_one_liners_launches_and_allocations(launches):
    calls = _calls()
    base_launches, base_ops = _warm_call(calls["one-liner"], launches)
    assert base_launches and all(how == "direct" for how, _ in base_launches), base_launches
    assert base_ops == {"aten.empty.memory_format": 1}, base_ops  # the output, nothing else
    for name, fn in calls.items():
        got, ops = _warm_call(fn, launches)
        extra, allocations = EXTRA[name]
        assert got == [("direct", k) for k in extra] + base_launches, f"{name}: {got}"
        assert ops == {"aten.empty.memory_format": 1 + allocations}, f"{name}: {dict(ops)}"


@pytest.mark.skipif(DEVICE != "cpu", reason="the stand-in kernels replace the CPU's interpreter")
def test_the_count_sees_tritons_dispatch_and_an_extra_op(launches):
    """The checks can fail: a call that goes through ``kernel[grid]`` every time (here: as with a profiler's
    launch hook), or casts its scales, is seen."""
    one_liner = _calls()["one-liner"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_direct, "no_launch_hooks", lambda: False)
        got, _ = _warm_call(one_liner, launches)
    assert got and all(how == "triton" for how, _ in got), got
    g = torch.Generator().manual_seed(1)
    k = torch.randn(B, HKV, L, D, generator=g).to(DEVICE)
    k8, ks = attnscope.quantize_kv(k)
    q = torch.randn(B, HQ, 1, D, generator=g).to(device=DEVICE, dtype=torch.bfloat16)
    _, ops = _warm_call(lambda: attnscope.flash_decode(q, k8, k8, k_scale=ks.double().float(), v_scale=ks),
                        launches)
    assert ops["aten._to_copy.default"] == 2, dict(ops)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_each_call_launches_the_kept_binaries_and_allocates_the_one_liners(monkeypatch):
    """On a GPU, a warm call of each of `_calls` goes through no Triton dispatch (``JITFunction.run``), and
    makes as many CUDA allocations and aten ops as the bf16 one-liner (`EXTRA`: plus the append's)."""
    dispatched = collections.Counter()
    for name, kernel in KERNELS.items():
        real = kernel.run

        def run(*args, _real=real, _name=name, **kw):
            dispatched[_name] += 1
            return _real(*args, **kw)
        monkeypatch.setattr(kernel, "run", run)
    decode.clear_plan_cache()
    append_mod._plan.cache_clear()
    calls = _calls()

    def warm(fn):
        fn()
        fn()
        torch.cuda.synchronize()
        dispatched.clear()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        with torch.no_grad(), _Ops() as ops:
            fn()
        allocated = torch.cuda.memory_stats()["allocation.all.allocated"] - before
        return dict(dispatched), allocated, ops.ops

    _, base_allocated, base_ops = warm(calls["one-liner"])
    assert base_allocated == 1 and base_ops == {"aten.empty.memory_format": 1}, (base_allocated, base_ops)
    for name, fn in calls.items():
        got, allocated, ops = warm(fn)
        extra = EXTRA[name][1]
        assert got == {}, f"{name}: launched through Triton's dispatch: {got}"
        assert allocated == 1 + extra and ops == {"aten.empty.memory_format": 1 + extra}, \
            f"{name}: {allocated} allocations, {dict(ops)}"
    torch.cuda.synchronize()
    decode.check_errors()


@pytest.mark.skipif(DEVICE != "cpu", reason="the stand-in kernels replace the CPU's interpreter")
def test_transformers_decode_call_issues_the_one_liners(launches):
    """A warm decode step through the transformers backend (`attention_forward`, as a Llama layer calls it: q
    a transposed view of [B, 1, Hq, d], the cache's K/V [B, Hkv, L, d], one key longer each step) issues the
    bf16 one-liner's launches and its one allocation, and no other aten op (no transpose, no cast, no lengths
    made): also with a sliding window, softcap, fp32 sinks (``s_aux``) and a static cache's `filled` mask."""
    hf = pytest.importorskip("attnscope.integrations.transformers")
    g = torch.Generator().manual_seed(41)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=torch.bfloat16)

    class Attn(torch.nn.Module):  # a transformers attention layer: is_causal, no sinks attribute
        is_causal = True

    layer = Attn()
    q = rnd(B, 1, HQ, D).transpose(1, 2)  # [B, Hq, 1, d], as transformers passes it
    kv = {n: (rnd(B, HKV, n, D), rnd(B, HKV, n, D)) for n in (L, L + 1)}  # a DynamicCache one step apart
    sinks = torch.randn(HQ, generator=g).to(DEVICE)
    base_launches, base_ops = _warm_call(lambda: attnscope.flash_decode(q, *kv[L], scale=0.125), launches)
    assert base_ops == {"aten.empty.memory_format": 1}, base_ops
    cases = {"no mods": {}, "window": {"sliding_window": 64}, "softcap": {"softcap": 30.0},
             "sinks": {"s_aux": sinks}}
    for name, mods in cases.items():
        for n in (L, L + 1):
            def call(n=n, mods=mods):
                return hf.attention_forward(layer, q, *kv[n], None, scaling=0.125, use_cache=True, **mods)[0]
            got, ops = _warm_call(call, launches)
            assert got == base_launches, f"{name}, L {n}: {got}"
            assert ops == base_ops, f"{name}, L {n}: {dict(ops)}"
    mask = hf.filled(B, L - 3, DEVICE)  # a static cache's first L - 3 slots
    got, ops = _warm_call(lambda: hf.attention_forward(layer, q, *kv[L], mask, scaling=0.125)[0], launches)
    assert got == base_launches and ops == base_ops, (got, dict(ops))
    out = hf.attention_forward(layer, q, *kv[L], None, scaling=0.125)[0]
    assert out.shape == (B, 1, HQ, D) and out.is_contiguous(), (out.shape, out.stride())
