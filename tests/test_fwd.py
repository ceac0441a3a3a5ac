"""The Triton FA-2 forward kernel against the float64 reference (CPU: TRITON_INTERPRET=1, small shapes).

Bound (STYLE.md, flash-attn's test suite): the kernel's max error against float64 is at most twice
PyTorch's own attention error at the same dtype against the same reference, plus 1e-3 absolute.
"""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope import reference  # noqa: E402
from attnscope.checks import kernel_tolerance  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import _common  # noqa: E402
from attnscope.model.tiles import causal_kv_bounds0  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

fwd = pytest.importorskip("attnscope.kernels.fwd")
import attnscope  # noqa: E402

DEVICE = kernel_device()

NS = (1, 17, 64, 97, 128, 200)


def _inputs(b, hq, hkv, nq, nk, d, dtype, strided, seed):
    g = torch.Generator().manual_seed(seed)

    def make(h, n):
        if strided:  # a [B, N, H, d] buffer seen as [B, H, N, d]: no copy, non-contiguous
            return torch.randn(b, n, h, d, generator=g).to(dtype).to(DEVICE).transpose(1, 2)
        return torch.randn(b, h, n, d, generator=g).to(dtype).to(DEVICE)

    return make(hq, nq), make(hkv, nk), make(hkv, nk)


def _torch_attention(q, k, v, causal):
    """PyTorch's own attention at the input dtype (its error sets the bound); bottom-right causal mask."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    nq, nk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        r = torch.arange(nq, device=q.device)[:, None]
        c = torch.arange(nk, device=q.device)[None, :]
        mask = c <= r + (nk - nq)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _poisoned_empty(monkeypatch):
    """Make the launcher's torch.empty return NaN-filled tensors, so an unwritten element shows."""
    real_empty = torch.empty

    class _Torch:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*a, **kw):
            t = real_empty(*a, **kw)
            if t.is_floating_point():
                t.fill_(float("nan"))
            return t

    monkeypatch.setattr(fwd, "torch", _Torch())


# Every (Nq, Nk) pair of the list, causal both ways; GQA ratio, head dim, dtype and layout cycle
# through their values so each appears across many pairs (the full product is too slow interpreted).
CASES = []
for i, ((nq, nk), causal) in enumerate(itertools.product(itertools.product(NS, NS), (False, True))):
    CASES.append((nq, nk, causal, (1, 4)[i % 2], (64, 128)[(i // 2) % 2],
                  ("float16", "bfloat16")[(i // 4) % 2], i % 3 == 0))


@pytest.mark.parametrize("nq,nk,causal,group,d,dtype,strided", CASES)
def test_matches_float64_reference(monkeypatch, nq, nk, causal, group, d, dtype, strided):
    _check_against_float64(monkeypatch, nq, nk, causal, group, d, dtype, strided, impl="portable")


def _is_sm90():
    return DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)


# The Gluon kernel (GPU only): a small set that still hits each path of its schedule — CTAs of 2 x 64 rows
# whose warpgroups split the unmasked/masked loops differently, CTAs with no KV tile (Nq > Nk causal), the
# K/V ring wrapping many times (Nk >= 1000), ragged tiles on both sides, GQA, strided views, both dtypes
# and head dims. Eight compiled variants (d x dtype x causal), so a cold cache costs eight compiles.
HOPPER_CASES = [
    (1, 1, False, 1, 64, "float16", False),
    (1, 1, True, 4, 128, "bfloat16", True),
    (17, 200, True, 1, 128, "float16", False),
    (200, 17, True, 4, 64, "bfloat16", False),
    (200, 17, False, 1, 128, "bfloat16", True),
    (97, 64, False, 4, 64, "float16", True),
    (64, 97, True, 1, 64, "bfloat16", False),
    (128, 128, True, 1, 128, "float16", False),
    (129, 257, False, 4, 128, "bfloat16", False),
    (300, 300, True, 1, 64, "float16", True),
    (300, 300, True, 4, 128, "bfloat16", False),
    (300, 300, False, 1, 128, "float16", False),
    (640, 384, True, 1, 128, "bfloat16", False),
    (384, 640, True, 4, 64, "float16", False),
    (1000, 1000, True, 1, 128, "bfloat16", True),
    (1000, 1000, False, 4, 64, "bfloat16", False),
    (1000, 1500, True, 1, 64, "float16", False),
    (1500, 1000, False, 1, 128, "float16", False),
    (2048, 2048, True, 4, 128, "float16", False),
    (2048, 2048, False, 1, 64, "bfloat16", True),
]


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="the Gluon Hopper kernel needs an sm_90 GPU")
@pytest.mark.parametrize("nq,nk,causal,group,d,dtype,strided", HOPPER_CASES)
def test_hopper_matches_float64_reference(monkeypatch, nq, nk, causal, group, d, dtype, strided):
    _check_against_float64(monkeypatch, nq, nk, causal, group, d, dtype, strided, impl="hopper")


def _variant_cases():
    """One case per (Hopper variant other than the default, head dim it is built for): 2 x 16 query heads
    over 4 KV heads, ragged Nq != Nk, causal and dtype alternating: 256+ CTA tiles, so a persistent CTA
    walks several tiles (its K/V ring, Q hand-back and turn counters carry across tiles); causal cases have
    Nq - Nk = 300 > 2 x 128 rows, so whole CTA tiles have no key (no KV tile, empty rows)."""
    try:
        from attnscope.kernels import fwd_hopper as hop
    except ImportError:  # no Gluon: the test skips
        return []
    cases = []
    for name, var in hop.VARIANTS.items():
        for d in sorted(var.configs) if name != hop.DEFAULT_VARIANT else ():
            i = len(cases)
            causal = (bool(i % 2) and hop.supports(name, d, True)) or not hop.supports(name, d, False)
            cases.append((name, d, causal, ("bfloat16", "float16")[(i // 2) % 2], (1000, 1300)[causal],
                          (1100, 1000)[causal]))
    return cases


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="the Gluon Hopper kernel needs an sm_90 GPU")
@pytest.mark.parametrize("variant,d,causal,dtype,nq,nk", _variant_cases())
def test_hopper_variant_matches_float64_reference(variant, d, causal, dtype, nq, nk):
    """Every kernel variant (what impl='auto' may pick: `model.dispatch.hopper_variant`), O and LSE, poisoned
    outputs, against float64."""
    from attnscope.kernels import fwd_hopper as hop

    dt = getattr(torch, dtype)
    q, k, v = _inputs(2, 16, 4, nq, nk, d, dt, strided=causal, seed=nq + d)
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device, dtype=torch.float32)
    hop.launch(q, k, v, o, lse, _common.LOG2E / math.sqrt(d), causal, True, variant)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "an element was not written"
    ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                         return_lse=True)
    has_key = np.isfinite(rlse)  # rows with no visible key (Nq > Nk causal): 0 and LSE -inf
    on = o.double().cpu().numpy()
    err = np.abs(on - ro)[has_key].max(initial=0.0)
    t_out = _torch_attention(q, k, v, causal).double().cpu().numpy()
    torch_err = np.abs(t_out - ro)[has_key].max(initial=0.0)
    assert err <= kernel_tolerance(torch_err), f"{variant}: error {err:.3g} > 2 x torch's {torch_err:.3g}"
    assert np.abs(lse.cpu().numpy() - rlse)[has_key].max(initial=0.0) < 1e-3
    assert (on[~has_key] == 0).all() and (lse.cpu().numpy()[~has_key] == -np.inf).all()


def _check_against_float64(monkeypatch, nq, nk, causal, group, d, dtype, strided, impl):
    dt = getattr(torch, dtype)
    hkv = 1 if nq * nk > 10_000 else 2
    b = 1 if nq * nk > 10_000 else 2
    q, k, v = _inputs(b, hkv * group, hkv, nq, nk, d, dt, strided, seed=nq * 1000 + nk + causal)
    _poisoned_empty(monkeypatch)
    o, lse = attnscope.flash_attention(q, k, v, causal=causal, return_lse=True, impl=impl)
    monkeypatch.undo()
    assert o.shape == q.shape and o.dtype == dt and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert not torch.isnan(o).any(), "NaN in the output: an element was not written (or a 0/0)"
    assert not torch.isnan(lse).any()

    ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                         return_lse=True)
    has_key = np.isfinite(rlse)  # rows with no visible key (Nq > Nk, bottom-right causal)
    err = np.abs(o.double().cpu().numpy() - ro)[has_key].max(initial=0.0)
    t_out = _torch_attention(q, k, v, causal).double().cpu().numpy()
    torch_err = np.abs(t_out - ro)[has_key].max(initial=0.0)
    assert err <= kernel_tolerance(torch_err), f"kernel error {err:.3g} > 2 x torch's {torch_err:.3g} + 1e-3"
    lse_np = lse.cpu().numpy()
    assert np.abs(lse_np - rlse)[has_key].max(initial=0.0) < 1e-3
    # empty rows: exactly 0 and LSE = -inf, as the reference
    assert (o.double().cpu().numpy()[~has_key] == 0).all()
    assert (lse_np[~has_key] == -np.inf).all()


def test_scale_argument():
    q, k, v = _inputs(1, 2, 2, 33, 45, 64, torch.float16, False, seed=1)
    o = attnscope.flash_attention(q, k, v, scale=0.3)
    ro = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), scale=0.3)
    o_default = attnscope.flash_attention(q, k, v)
    assert np.abs(o.double().cpu().numpy() - ro).max() < 2e-3
    assert (o != o_default).any()


def test_causal_mask_changes_the_answer():
    q, k, v = _inputs(1, 1, 1, 40, 40, 64, torch.float16, False, seed=2)
    diff = attnscope.flash_attention(q, k, v, causal=True) - attnscope.flash_attention(q, k, v)
    assert diff.abs().max() > 0.1


def test_kv_bounds_helper_matches_tiles_py():
    """The in-kernel closed form of the skip bound (fwd._kv_bounds) equals model/tiles.py's."""
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def probe(OUT, NQ, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        m = tl.program_id(0)
        lo, hi = fwd._kv_bounds(m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)
        tl.store(OUT + 2 * m, lo)
        tl.store(OUT + 2 * m + 1, hi)

    rng = np.random.default_rng(0)
    for _ in range(60):
        nq, nk = (int(x) for x in rng.integers(1, 300, 2))
        bm, bn = int(rng.choice([16, 32, 64, 128])), int(rng.choice([16, 32, 64]))
        for causal in (False, True):
            tiles_q = math.ceil(nq / bm)
            out = torch.zeros(2 * tiles_q, dtype=torch.int32, device=DEVICE)
            probe[(tiles_q,)](out, nq, nk, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal)
            got = out.view(-1, 2).tolist()
            for m in range(tiles_q):
                if causal:
                    full, hi = causal_kv_bounds0(m, nq, nk, bm, bn)
                else:
                    full, hi = nk, nk
                lo = min(full, (nk // bn) * bn)  # the ragged last tile is always bounds-checked
                assert got[m] == [lo, hi], (nq, nk, bm, bn, causal, m)


def test_custom_op_registration_opcheck():
    q, k, v = _inputs(1, 2, 1, 20, 24, 64, torch.float16, False, seed=3)
    op = fwd._op
    assert torch.ops.attnscope.flash_attention.default is not None
    torch.library.opcheck(op, (q, k, v, True, 0.125, True, None, "auto"),
                          test_utils=("test_schema", "test_faketensor"))


def test_runs_inside_torch_compile_without_graph_break():
    q, k, v = _inputs(1, 2, 2, 20, 24, 64, torch.float16, False, seed=4)

    def f(q, k, v):
        return attnscope.flash_attention(q * 1.0, k, v, causal=True) + 1.0

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")  # fullgraph: a break would raise
    assert torch.equal(compiled(q, k, v), f(q, k, v))



def test_compiled_dynamic_with_float_arguments_and_shapes_matches_eager():
    # dynamic=True: sizes and the function's float arguments (scale, softcap) are symbolic; the checks
    # trace on them (no graph break under fullgraph) and each call, forward and backward, matches eager
    def f(q, k, v, scale, softcap):
        return attnscope.flash_attention(q, k, v, causal=True, scale=scale, softcap=softcap, return_lse=True)

    def run(fn, *args):
        o, lse = fn(*args)
        return o, lse, *torch.autograd.grad(o.float().square().sum() + lse.sum(), args[:3])

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for b, n, scale, softcap in ((1, 17, None, 0.0), (1, 33, 0.1, 5.0), (3, 40, 0.2, 7.0)):
        q, k, v = (t.requires_grad_() for t in _inputs(b, 4, 2, n, n + 3, 64, torch.float16, False, seed=n))
        want, got = run(f, q, k, v, scale, softcap), run(compiled, q, k, v, scale, softcap)
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    torch._dynamo.reset()



def test_compiled_call_after_a_refused_one_matches_eager():
    # a call whose checks raise makes the compiler give up on the frames it traced: later calls run them
    # eagerly inside the compiled region, and the launch runs untraced; before, the compiler traced each
    # launch frame (Triton's too) on its own and the next good call died in Triton's interpreter
    q, k, v = _inputs(1, 2, 2, 8, 8, 64, torch.float16, False, seed=8)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, s: attnscope.flash_attention(q, k, v, scale=s), backend="eager")
    want = attnscope.flash_attention(q, k, v, scale=0.3)
    assert torch.equal(compiled(q, k, v, 0.3), want)
    with pytest.raises(InputError, match="scale: expected a finite"):
        compiled(q, k, v, -1.0)
    assert torch.equal(compiled(q, k, v, 0.3), want)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["scale", "softcap"])
def test_compiled_dynamic_refuses_a_nan_float_argument_as_eager(name):
    # dynamic=True: a NaN scale or softcap is a symbolic float whose ordering comparisons fail inside the
    # compiler (a TorchRuntimeError); the checks rule NaN out with ``==`` first and raise eager's InputError
    q, k, v = _inputs(1, 2, 2, 8, 8, 64, torch.float16, False, seed=7)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, x: attnscope.flash_attention(q, k, v, **{name: x}),
                             backend="eager", dynamic=True)
    assert torch.equal(compiled(q, k, v, 0.5), attnscope.flash_attention(q, k, v, **{name: 0.5}))
    with pytest.raises(InputError, match=f"{name}: expected a finite"):
        compiled(q, k, v, float("nan"))
    torch._dynamo.reset()


@pytest.mark.parametrize("over,msg", [({"window": (-3, 2)}, "window: expected None or a pair"),
                                      ({"softcap": -1.0}, "softcap: expected a finite real number >= 0")])
def test_compiled_training_call_with_bad_mods_raises_their_error(over, msg):
    # under torch.compile with grad the compiler traces the backward at compile time: the mods are checked
    # in the trace, so the error is eager's InputError, not a BackendCompilerFailed from the backward
    q, k, v = _inputs(1, 4, 2, 8, 8, 64, torch.float16, False, seed=6)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attnscope.flash_attention(q, k, v, **over), backend="aot_eager")
    with pytest.raises(InputError, match=re.escape(msg)):
        compiled(q.requires_grad_(), k, v)
    torch._dynamo.reset()

# ---- errors: each documented error, with its message --------------------------------------------
def _good(**over):
    q, k, v = _inputs(1, 4, 2, 8, 8, 64, torch.float16, False, seed=5)
    args = {"q": q, "k": k, "v": v}
    args.update(over)
    return args


F16 = torch.float16


def _z(*shape, dtype=F16, device=None):
    return torch.zeros(*shape, dtype=dtype, device=device or DEVICE)


@pytest.mark.parametrize("over,exc,msg", [
    ({"q": _z(4, 8, 64)}, ValueError, "q: expected a 4-d tensor [B, Hq, Nq, d]"),
    ({"k": _z(2, 2, 8, 64)}, ValueError, "k: expected batch 1, got 2"),
    ({"v": _z(1, 2, 8, 128)}, ValueError, "v: expected head_dim 64, got 128"),
    ({"k": _z(1, 2, 8, 64, dtype=torch.bfloat16)}, ValueError, "k: expected dtype (as q)"),
    ({"k": _z(1, 3, 8, 64), "v": _z(1, 3, 8, 64)}, ValueError, "multiple of the kv heads (3), got Hq = 4"),
    ({"q": _z(1, 4, 0, 64)}, ValueError, "q: expected Nq >= 1"),
    ({"k": _z(1, 2, 0, 64), "v": _z(1, 2, 0, 64)}, ValueError, "k: expected Nk >= 1"),
    ({"q": _z(0, 4, 8, 64), "k": _z(0, 2, 8, 64), "v": _z(0, 2, 8, 64)}, ValueError,
     "q: expected B >= 1 and Hq >= 1, got shape (0, 4, 8, 64)"),
    ({"q": _z(1, 4, 8, 64, dtype=torch.float32)}, NotImplementedError,
     "supported: torch.float16, torch.bfloat16"),
    ({"q": _z(1, 4, 8, 100), "k": _z(1, 2, 8, 100), "v": _z(1, 2, 8, 100)}, NotImplementedError,
     "head_dim 100 is not supported"),
    ({"q": _z(1, 4, 8, 64, device="meta")}, ValueError, "k: expected device meta"),
    ({"q": "not a tensor"}, ValueError, "q: expected a torch.Tensor"),
    ({"q": _z(1, 4, 64, 8).transpose(2, 3)}, ValueError, "unit stride"),
])
def test_bad_input_is_a_clear_error(over, exc, msg):
    with pytest.raises(exc) as e:
        attnscope.flash_attention(**_good(**over))
    assert msg in str(e.value)


@pytest.mark.parametrize("kw,msg", [
    ({"scale": -1.0}, "scale: expected a finite positive number up to 2.36e+38, or None, got -1.0"),
    ({"scale": 0.0}, "scale: expected a finite positive number"),
    ({"scale": float("inf")}, "scale: expected a finite positive number"),
    ({"scale": float("nan")}, "scale: expected a finite positive number"),
    ({"scale": True}, "scale: expected a finite positive number up to 2.36e+38, or None, got True"),
    ({"scale": "0.1"}, "scale: expected a finite positive number"),
    ({"causal": "no"}, "causal: expected True or False, got 'no'"),
    ({"causal": 1}, "causal: expected True or False, got 1"),
    ({"return_lse": None}, "return_lse: expected True or False, got None"),
    ({"config": (128, 64)}, "config: expected FwdConfig(BLOCK_M, BLOCK_N, num_warps, num_stages)"),
    ({"config": (96, 64, 4, 2)}, "config: expected powers of two"),
    ({"config": (128, 64, 4, 0)}, "config: expected powers of two"),
])
def test_bad_flags_are_clear_errors(kw, msg):
    with pytest.raises(ValueError) as e:
        attnscope.flash_attention(**_good(), **kw)
    assert msg in str(e.value)


@pytest.mark.parametrize("kw,msg", [
    ({"scale": 1e39}, "scale: expected a finite positive number up to 2.36e+38, or None, got 1e+39"),
    ({"scale": 10**400}, "scale: expected a finite positive number up to 2.36e+38"),
    ({"config": (32, 16, 4, True)}, "config: expected powers of two"),
])
def test_scale_past_fp32_and_bool_config_are_refused(kw, msg):
    """scale * log2(e) is an fp32 kernel argument: past fp32 it was inf and the output NaN; a bool
    num_stages was taken as 1."""
    with pytest.raises(InputError) as e:
        attnscope.flash_attention(**_good(), **kw)
    assert msg in str(e.value)


@pytest.mark.parametrize("over,msg", [
    ({"k": "x"}, "k: expected a torch.Tensor"),  # was the dispatcher's RuntimeError
    ({"k": _z(1, 2, 8, 64, device="meta")}, "k: expected device cpu"),  # was a meta output, no launch
    ({"impl": 3}, "impl: expected one of auto, portable, hopper, got 3"),
])
def test_autograd_path_checks_its_inputs_first(over, msg):
    if DEVICE != "cpu":
        pytest.skip("the meta case names the cpu device")
    args = _good(**over)
    args["q"] = args["q"].clone().requires_grad_()
    with pytest.raises(InputError) as e:
        attnscope.flash_attention(**args)
    assert msg in str(e.value)


@pytest.mark.parametrize("scale", [1e30, 1e37])
@pytest.mark.parametrize("causal", [False, True])
def test_huge_scale_is_finite_and_matches_float64(scale, causal):
    """A huge finite scale turns softmax into a row arg-max: finite output, no inf - inf = NaN."""
    q, k, v = _inputs(1, 2, 1, 23, 37, 64, torch.float16, False, seed=11)
    o, lse = attnscope.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                         scale=scale, return_lse=True)
    assert torch.isfinite(o).all()
    assert np.abs(o.double().cpu().numpy() - ro).max() < 1e-3
    lse_np = lse.cpu().numpy()
    fits = np.abs(rlse) < 1e38  # the LSE itself is representable in fp32: relative error small
    assert np.all(np.abs(lse_np[fits] - rlse[fits]) <= 1e-5 * np.abs(rlse[fits]))
    assert np.all(np.isposinf(lse_np[~fits]) | (np.abs(lse_np[~fits] - rlse[~fits]) <= 1e-5 * rlse[~fits]))


def test_config_override_gives_the_same_answer():
    q, k, v = _inputs(1, 2, 2, 70, 90, 64, torch.float16, False, seed=12)
    ro = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=True)
    for cfg in (fwd.FwdConfig(16, 32, 4, 1), fwd.FwdConfig(64, 16, 4, 1)):
        o = attnscope.flash_attention(q, k, v, causal=True, config=cfg)
        assert np.abs(o.double().cpu().numpy() - ro).max() < 2e-3, cfg


def test_config_table_covers_every_supported_variant(monkeypatch):
    """Every (d, causal) the public call accepts has a measured row, for any N (no autotuning)."""
    monkeypatch.setattr(fwd, "interpreting", lambda: False)
    for d in _common.SUPPORTED_HEAD_DIMS:
        for causal in (False, True):
            for n in (1, 1000, 1 << 20):
                cfg = fwd.pick_config(d, causal, n)
                assert isinstance(cfg, fwd.FwdConfig) and cfg.BLOCK_M in (64, 128)
    with pytest.raises(NotImplementedError, match="head_dim 96: no measured config"):
        fwd.pick_config(96, False, 10)
    # a window narrow enough for the portable kernel, at a head dim with a window row: that row; elsewhere
    # (and for a wider window) the table's
    for d in _common.SUPPORTED_HEAD_DIMS:
        for n in (1000, 1 << 20):
            want = fwd.WINDOW_CONFIGS.get(d, fwd.pick_config(d, True, n))
            assert fwd.pick_config(d, True, n, narrow_window=True) == want, (d, n)
    assert fwd.pick_config(64, True, 8192, narrow_window=True) != fwd.pick_config(64, True, 8192)
    assert fwd.pick_config(128, True, 8192, narrow_window=True) != fwd.pick_config(128, True, 8192)


def test_a_short_window_picks_the_portable_tiles(monkeypatch):
    """The plan asks `pick_config` for the window tiles exactly when `dispatch.portable_window` takes the
    window: it hides a key the mask shows and leaves a row at most WINDOW_PORTABLE_KEYS[d] keys on average
    (`dispatch.window_mean_keys`: the model's visible pairs / Nq)."""
    from attnscope.model import dispatch

    n = 40
    assert dispatch.window_mean_keys(n, n, True, None) == dispatch.mean_keys(n, n, True) == 20.5
    assert dispatch.window_mean_keys(n, n, True, (8, 0)) == (36 + 32 * 9) / n  # rows 0-7: r + 1 keys
    assert dispatch.window_mean_keys(n, n, False, (4, 4)) == (n * 9 - 2 * 10) / n  # 4 + 3 + 2 + 1 each end
    seen = []
    real = fwd.pick_config

    def spy(d, causal, n, smem=None, narrow_window=False):
        seen.append(narrow_window)
        return real(d, causal, n, smem, narrow_window)
    monkeypatch.setattr(fwd, "pick_config", spy)
    monkeypatch.setitem(dispatch.WINDOW_PORTABLE_KEYS, 64, 10)  # at N = 40: a row's mean under 10 keys
    q, k, v = _inputs(1, 2, 2, n, n, 64, torch.float16, False, seed=3)
    for window, causal, narrow in (((4, 4), False, True), ((8, 0), True, True), ((12, 0), True, False),
                                   ((-1, 0), True, False), ((-1, 2), False, False), ((n, 0), True, False)):
        fwd.clear_plan_cache()
        attnscope.flash_attention(q, k, v, causal=causal, window=window, impl="portable")
        assert seen[-1] is narrow, (window, seen[-1])
    assert not dispatch.portable_window(24, (4, 4), n, n, False)  # no window tiles without a row for d
    monkeypatch.setitem(dispatch.WINDOW_PORTABLE_KEYS, 128, 10)  # a head dim between: its head_block's row
    assert all(dispatch.portable_window(x, (4, 4), n, n, False) for x in (96, 128))


def test_impl_argument_errors():
    with pytest.raises(ValueError, match="impl: expected one of auto, portable, hopper, got 'fast'"):
        attnscope.flash_attention(**_good(), impl="fast")
    if not _is_sm90():
        for impl in ("hopper", "hopper_persist", "hopper_wg3_pp"):  # a variant's name forces it (benchmarks)
            with pytest.raises(NotImplementedError, match=f"impl='{impl}': it needs .*supported elsewhere"):
                attnscope.flash_attention(**_good(), impl=impl)


# ---- the host path: a call layout's launch plan -------------------------------------------------------
def test_a_planned_layout_runs_new_values_as_a_fresh_plan_does():
    """A second call of a layout reuses its plan; its output is the one a freshly planned call gives, for
    new values, and for the same values in another layout (a transposed view: new strides, a new plan)."""
    fwd.clear_plan_cache()
    a = _inputs(1, 2, 1, 20, 24, 64, torch.float16, False, seed=21)
    b = _inputs(1, 2, 1, 20, 24, 64, torch.float16, False, seed=22)
    o_a, lse_a = attnscope.flash_attention(*a, causal=True, return_lse=True)
    o_b, lse_b = attnscope.flash_attention(*b, causal=True, return_lse=True)  # the planned layout
    assert not torch.equal(o_a, o_b)
    fwd.clear_plan_cache()
    fresh_b = attnscope.flash_attention(*b, causal=True, return_lse=True)
    assert torch.equal(o_b, fresh_b[0]) and torch.equal(lse_b, fresh_b[1])
    assert torch.equal(o_a, attnscope.flash_attention(*a, causal=True, return_lse=True)[0])
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in b]  # b's values, [B, N, H, d] memory
    assert strided[0].stride() != b[0].stride()
    o_s = attnscope.flash_attention(*strided, causal=True)
    assert torch.equal(o_s, o_b)
    # the output takes q's memory order: flash-attn's [B, N, H, d] back without a copy
    assert o_s.stride() == strided[0].stride() and o_s.transpose(1, 2).is_contiguous()
    assert o_b.is_contiguous()
    with torch.device("meta"):  # torch.compile's fake output has the real one's strides
        fake = attnscope.kernels.fwd._op._abstract_fn(*(t.to("meta") for t in strided), True, None, False,
                                                      None, "auto")
    assert fake[0].stride() == o_s.stride()


def test_a_planned_layout_still_refuses_bad_calls():
    """The plan's key holds the types of the flags and options and needs aligned tensors: a call that
    differs from a planned one only in what the checks refuse is refused."""
    q, k, v = _good().values()
    attnscope.flash_attention(q, k, v, causal=True, scale=0.125, window=(3, 0), softcap=5.0)  # planned
    with pytest.raises(ValueError, match="causal: expected True or False, got 1"):
        attnscope.flash_attention(q, k, v, causal=1, scale=0.125, window=(3, 0), softcap=5.0)
    with pytest.raises(ValueError, match="window: expected None or a pair"):
        attnscope.flash_attention(q, k, v, causal=True, scale=0.125, window=(3.0, 0), softcap=5.0)
    with pytest.raises(ValueError, match="softcap: expected a finite real"):
        attnscope.flash_attention(q, k, v, causal=True, scale=0.125, window=(3, 0), softcap=True)
    attnscope.flash_attention(q, k, v, scale=1.0)  # planned
    with pytest.raises(ValueError, match="scale: expected a finite positive number"):
        attnscope.flash_attention(q, k, v, scale=True)
    attnscope.flash_attention(q, k, v)  # planned
    off = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)  # base + 2 bytes
    assert off.stride() == q.stride()
    with pytest.raises(NotImplementedError, match="16-byte aligned"):
        attnscope.flash_attention(off, k, v)
    with pytest.raises(ValueError, match="k: expected device meta"):
        attnscope.flash_attention(q.to("meta"), k, v)


def test_the_plan_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(fwd, "PLAN_CACHE_SIZE", 2)
    fwd.clear_plan_cache()
    for n in (8, 9, 10):
        attnscope.flash_attention(*_inputs(1, 2, 1, n, n, 64, torch.float16, False, seed=n))
    assert len(fwd._PLANS) == 2
    fwd.clear_plan_cache()


def test_strided_sinks_are_refused_even_after_a_planned_call():
    """The kernels read sinks[h] at offset h: a strided [Hq] view is refused (it read other values), also
    when a contiguous sinks tensor of the same shape planned the layout first (the plan key has strides)."""
    q, k, v = _inputs(1, 4, 2, 16, 16, 64, torch.float16, False, seed=6)
    wide = torch.randn(4, 2, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    fwd.clear_plan_cache()
    attnscope.flash_attention(q, k, v, sinks=wide[:, 0].contiguous())
    with pytest.raises(ValueError, match=r"sinks: expected a contiguous \[Hq\] tensor, got stride 2"):
        attnscope.flash_attention(q, k, v, sinks=wide[:, 0])
    fwd.clear_plan_cache()


def test_past_the_grid_y_limit_is_refused_before_a_launch():
    """The portable kernel launches B x Hq programs on grid y, whose CUDA limit is 65535: past it, a
    NotImplementedError naming the limit, not a CUDA launch error."""
    q = torch.zeros(fwd.MAX_GRID_Y + 1, 1, 1, 64, dtype=torch.float16, device=DEVICE)
    with pytest.raises(NotImplementedError, match=r"= 65536 \(batch, head\).* supported: B x Hq <= 65535"):
        attnscope.flash_attention(q, q, q, impl="portable")
    at = q[: fwd.MAX_GRID_Y]  # at the limit: planned (not launched here: 65535 interpreted programs)
    plan = fwd._plan(at, at, at, False, None, False, None, "portable", None, 0.0, None)
    assert plan.o_shape == tuple(at.shape)


def test_eager_gradients_are_the_registered_ops():
    """With inputs that require grad, eager `flash_attention` runs its own autograd route (no op dispatcher):
    the same output, LSE and gradients, bit for bit, as the registered op `attnscope::flash_attention`."""
    base = _inputs(1, 2, 1, 20, 24, 64, torch.float16, False, seed=23)
    sinks0 = torch.randn(2, generator=torch.Generator().manual_seed(24)).to(DEVICE)
    do = torch.randn(1, 2, 20, 64, generator=torch.Generator().manual_seed(25)).to(torch.float16).to(DEVICE)
    got = []
    for route in ("eager", "op"):
        q, k, v, sinks = (t.clone().requires_grad_() for t in (*base, sinks0))
        if route == "eager":
            o, lse = attnscope.flash_attention(q, k, v, causal=True, return_lse=True, window=(5, 0),
                                               sinks=sinks)
        else:
            o, lse = fwd._op(q, k, v, True, 0.125, True, None, "auto", [5, 0], 0.0, sinks)
        (o.float() * do.float()).sum().backward()
        got.append([o, lse, q.grad, k.grad, v.grad, sinks.grad])
    assert got[0][0].grad_fn is not None
    for name, x, y in zip(("o", "lse", "dq", "dk", "dv", "dsinks"), *got, strict=True):
        assert torch.equal(x, y), name


def test_auto_picks_the_variant_of_the_dispatch_rule(monkeypatch):
    """impl='auto' runs the variant `model.dispatch.hopper_variant` names for the launch geometry (the same
    rule for fp16 and bf16), portable where it names none; impl='hopper' forces the default variant."""
    from types import SimpleNamespace

    from attnscope.model import dispatch

    monkeypatch.setattr(fwd, "_hopper_possible", lambda q: None)  # pretend sm_90
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: SimpleNamespace(multi_processor_count=132))
    seen = set()
    for d in (64, 128):
        for causal in (False, True):
            for dt in (torch.float16, torch.bfloat16):
                for b, hq, hkv, n in ((16, 32, 32, 1024), (8, 32, 8, 2048), (4, 32, 32, 4096),
                                      (1, 32, 4, 16384)):
                    q, k = torch.empty(b, hq, n, d, dtype=dt), torch.empty(b, hkv, n, d, dtype=dt)
                    want = dispatch.hopper_variant(d, causal, b, hq, hkv, n, n) or "portable"
                    assert fwd._pick_impl("auto", q, causal, 0.18, None, k) == want, (d, causal, dt, n)
                    seen.add(want)
    assert seen == {"portable", *dispatch.VARIANTS}  # the rule reaches every kept variant
    q, k = torch.empty(4, 32, 4096, 64), torch.empty(4, 32, 4096, 64)
    assert fwd._pick_impl("auto", q, False, 2.0, None, k) == "portable"  # huge scale: portable only
    assert fwd._pick_impl("auto", q, False, 0.18, fwd.FwdConfig(64, 64, 4, 2), k) == "portable"
    assert fwd._pick_impl("hopper", q, False, 0.18, None, k) == dispatch.DEFAULT_VARIANT  # forced
    for name in dispatch.VARIANTS:  # a variant forced by its name (benchmarks)
        assert fwd._pick_impl(name, q, True, 0.18, None, k) == name
    with pytest.raises(NotImplementedError, match="scale \\* log2\\(e\\) > 1"):
        fwd._pick_impl("hopper", q, False, 2.0, None, k)
    # a softcap past 2^60 x scale (tanh's argument could be subnormal): portable, which takes any cap
    scale = 0.125
    for cap, want in ((fwd.HOPPER_MAX_SOFTCAP * scale * 0.99, dispatch.DEFAULT_VARIANT),
                      (fwd.HOPPER_MAX_SOFTCAP * scale * 1.01, None)):
        mods = _common.Mods(-1, -1, cap, None)
        got = fwd._pick_impl("auto", q, True, scale * _common.LOG2E, None, k, mods)
        assert got == (dispatch.hopper_variant(64, True, 4, 32, 32, 4096, 4096) if want else "portable")
        if want:
            assert fwd._pick_impl("hopper", q, True, scale * _common.LOG2E, None, k, mods) == want
        else:
            with pytest.raises(NotImplementedError, match="softcap / scale > 2\\^60 .*impl='portable'"):
                fwd._pick_impl("hopper", q, True, scale * _common.LOG2E, None, k, mods)
    monkeypatch.setattr(fwd, "_hopper_possible", lambda q: "not sm_90")  # another GPU: the rule is moot
    assert fwd._pick_impl("auto", q, True, 0.18, None, k) == "portable"


def test_every_variant_the_rule_names_is_built_for_it():
    """Whatever the geometry, `hopper_variant` names a variant built for the head dim (or None)."""
    pytest.importorskip("triton.experimental.gluon")
    from attnscope.kernels import fwd_hopper as hop
    from attnscope.model import dispatch

    assert tuple(hop.VARIANTS) == dispatch.VARIANTS and hop.DEFAULT_VARIANT == dispatch.DEFAULT_VARIANT
    for d in _common.SUPPORTED_HEAD_DIMS:
        for causal in (False, True):
            for b, hq, hkv, nq, nk in ((1, 8, 8, 1, 4096), (16, 96, 12, 1000, 1000), (1, 8, 1, 32768, 32768),
                                       (3, 12, 4, 5000, 300), (2, 64, 8, 300, 5000)):
                v = dispatch.hopper_variant(d, causal, b, hq, hkv, nq, nk)
                assert v is None or isinstance(hop.config(d, v), hop.HopperConfig), (d, causal, nq, nk)


def test_hopper_variant_errors():
    """An unknown variant, or a head dim a variant is not built for: NotImplementedError naming what is."""
    pytest.importorskip("triton.experimental.gluon")
    from attnscope.kernels import fwd_hopper as hop

    with pytest.raises(NotImplementedError, match="'nope': supported: hopper_persist, hopper_wg3_pp"):
        hop.config(128, "nope")
    with pytest.raises(NotImplementedError,
                       match="'hopper_wg3_pp': head_dim 128 is not supported; supported: \\[64\\]"):
        hop.config(128, "hopper_wg3_pp")
    assert hop.supports("hopper_wg3_pp", 64, True) and not hop.supports("hopper_wg3_pp", 128, False)


_COMPILE_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from attnscope.kernels import fwd_hopper as hop
d, dtype, causal, variant = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4]
src = GluonASTSource(fn=hop.kernel(variant),
                     signature=hop.signature(d, dtype, variant),
                     constexprs=hop.constexprs(d, causal, True, variant))
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": hop.NUM_WARPS})
sys.stdout.write(k.asm["ptx"])
"""


def _compile_hopper_ptx(d, dtype, causal, variant):
    """The PTX of one Gluon variant compiled for sm_90 in a child process without TRITON_INTERPRET (which
    conftest sets: Gluon's code generator rejects the interpreter's versions of Triton's reductions)."""
    import os

    src = os.path.dirname(os.path.dirname(attnscope.__file__))  # this checkout's package, not an install
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-c", _COMPILE_HOPPER, str(d), dtype, str(int(causal)), variant],
                          env=env, capture_output=True, text=True, check=True, timeout=600).stdout


def test_hopper_kernel_compiles_for_sm90_on_the_cpu():
    """The Gluon kernel compiled for sm_90 without a GPU has FA-3's structure in its PTX: TMA, async wgmma
    with a wait that leaves one group in flight (softmax under P V), a 24-register producer and 240-register
    (two consumer warpgroups) or 160-register (three) consumers, no spills."""
    pytest.importorskip("triton.experimental.gluon")
    import os
    import re
    import tempfile

    import triton

    ptx = _compile_hopper_ptx(64, "bf16", False, "hopper_persist")
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "wgmma.wait_group.sync.aligned 1;" in ptx  # S_j waited for alone, P V still in flight
    assert "setmaxnreg.dec.sync.aligned.u32 \t24" in ptx  # the 1-warp TMA producer gives registers back
    assert "setmaxnreg.inc.sync.aligned.u32 \t240" in ptx  # consumer warpgroup 1 takes them
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "k.ptx"), "w") as f:
            f.write(ptx)
        rep = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True, check=True).stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in rep and "serialized" not in rep
    wg3 = _compile_hopper_ptx(64, "bf16", False, "hopper_wg3_pp")
    assert "setmaxnreg.inc.sync.aligned.u32 \t160" in wg3 and "wgmma.wait_group.sync.aligned 1;" in wg3
    assert len(re.findall(r"mbarrier\.try_wait", wg3)) > len(re.findall(r"mbarrier\.try_wait", ptx))


def test_hopper_kernel_does_not_specialise_on_runtime_integers():
    """Triton specialises an int argument equal to 1 (a constexpr) or divisible by 16 (an alignment hint)
    unless told not to; the Gluon kernel opts every runtime integer out, so N, the head counts and the
    scale never add a compile (the descriptors' key is dtype, block shape and layout only)."""
    pytest.importorskip("triton.experimental.gluon")
    from attnscope.kernels import fwd_hopper as hop

    for variant, ints, order in (("hopper_wg3_pp", ["H", "HKV", "NQ", "NK"], ["TAIL"]),
                                 ("hopper_persist", ["B", "H", "HKV", "NQ", "NK"], [])):
        params = {p.name: p for p in hop.kernel(variant).params}
        sig = hop.signature(64, "bf16", variant)
        runtime = [n for n in sig if sig[n] in ("i32", "fp32")]
        assert runtime == [*ints, "qk_scale", *order, "LEFT", "RIGHT", "cap_in", "cap_out"]
        assert all(params[n].do_not_specialize for n in runtime), variant


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU (compiled kernels)")
@pytest.mark.parametrize("impl", ["portable", "hopper"])
def test_one_compile_per_variant_on_gpu(impl):
    """Different N, B, head counts (1 and multiples of 16 among them) and strides reuse one compiled kernel
    per (variant, d, dtype, causal, lse)."""
    if impl == "hopper" and not _is_sm90():
        pytest.skip("the Gluon Hopper kernel needs an sm_90 GPU")
    seen = set()
    for b, hq, hkv, nq, nk, strided in ((1, 4, 2, 100, 300, False), (2, 8, 8, 4096, 4096, True),
                                        (3, 2, 1, 1, 17, False), (1, 16, 16, 16, 32, False)):
        q, k, v = _inputs(b, hq, hkv, nq, nk, 128, torch.bfloat16, strided, seed=nq)
        _, _, compiled = fwd.launch(q, k, v, causal=True, impl=impl)
        seen.add(id(compiled))
    assert len(seen) == 1


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU-tensor error only exists without a GPU")
def test_cpu_tensors_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="expected CUDA tensors .*TRITON_INTERPRET=1"):
        attnscope.flash_attention(**_good())


def test_missing_extra_gives_install_command():
    """Without torch/triton the kernels raise ImportError naming the install command."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "try:\n    import attnscope.kernels.fwd\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'attnscope[kernels]'" in out


def test_launchers_run_on_their_tensors_device(monkeypatch):
    """Triton launches on the current CUDA device: every launcher makes its first tensor's device current
    (`_common.device_guard`) when it is another one (tensors on cuda:1 while cuda:0 is current, as a model
    split over GPUs runs), and does nothing otherwise."""
    from types import SimpleNamespace

    from attnscope.kernels import _common, bwd, varlen, varlen_bwd
    from attnscope.kernels.decode import plan

    entered = []
    fake = SimpleNamespace(cuda=SimpleNamespace(current_device=lambda: 0,
                                                device=lambda dev: entered.append(dev) or _nullctx()))
    on = SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=1))
    same = SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=0))
    cpu = SimpleNamespace(is_cuda=False, device=SimpleNamespace(index=None))
    for t in (same, cpu):
        with _common.device_guard(fake, t):
            pass
    assert entered == []
    with _common.device_guard(fake, on):
        pass
    assert entered == [on.device]
    for launcher in (fwd._launch, bwd.flash_attention_backward, varlen._launch,
                     varlen_bwd.flash_attention_varlen_backward, plan.DecodePlan.run):
        assert hasattr(launcher, "__wrapped__"), launcher  # under `_common.on_tensor_device`
    seen = []
    monkeypatch.setattr(_common, "device_guard", lambda torch_, t: seen.append(t) or _nullctx())
    wrapped = _common.on_tensor_device(torch)(lambda name, x, y: (name, y))
    x, y = torch.zeros(1), torch.ones(1)
    assert wrapped("n", x, y) == ("n", y) and seen == [x]  # the first tensor argument decides


def _nullctx():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs")
def test_gpu_tensors_on_another_device_than_the_current_one():
    """flash_attention (forward and backward) and flash_decode on cuda:1 while cuda:0 is current equal the
    same calls with cuda:1 current."""
    g = torch.Generator(device="cuda:1").manual_seed(3)
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda:1", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    runs = []
    for current in (0, 1):
        with torch.cuda.device(current):
            o = attnscope.flash_attention(q, k, v, causal=True)
            grads = torch.autograd.grad(o.float().square().sum(), (q, k, v))
            dec = attnscope.flash_decode(q[:, :, -1:].detach(), k.detach(), v.detach())
            runs.append((o, *grads, dec))
    for a, b in zip(*runs, strict=True):
        assert a.device == b.device == torch.device("cuda:1") and torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_forward_under_compiled_cuda_graphs_keeps_nothing_in_the_graph_pool():
    """torch.compile's CUDA graphs (mode "reduce-overhead") warm the compiled code up with this thread's
    allocations routed to the graph's pool and refuse a pool holding tensors it does not own: the plan a
    first call makes (its placeholder LSE) is kept past the call, so it is allocated outside the pool."""
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA GPU")
    fwd.clear_plan_cache()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 8, 300, 64, generator=g).to(torch.bfloat16).to(DEVICE) for _ in range(3))
    sinks = torch.randn(8, generator=g).to(DEVICE)
    step = torch.compile(lambda q: attnscope.flash_attention(q, k, v, causal=True, sinks=sinks),
                         mode="reduce-overhead", fullgraph=True)
    want = attnscope.flash_attention(q, k, v, causal=True, sinks=sinks)
    fwd.clear_plan_cache()  # the compiled call's warm-up makes the plan
    for _ in range(4):  # warm-up, recording, replays
        torch.testing.assert_close(step(q).clone(), want, atol=0, rtol=0)


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attnscope.kernels._tl import cta_tile  # noqa: E402


@triton.jit
def _launch_order_probe(T, TAIL):
    """Writes `_tl.cta_tile`'s (rank, head) of each program at its launch position."""
    rank, head = cta_tile(TAIL)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(T + 2 * pid, rank)
    tl.store(T + 2 * pid + 1, head)


def test_triton_launch_order_is_the_model_launch_tile():
    """`_tl.cta_tile` (the (rank, head) of the portable forward and of the Gluon kernels, which call it as it
    is) at each program's launch position equals `model.tiles.launch_tile`: the grid's order (tail 1), every
    head interleaved, the last few."""
    from attnscope.model.tiles import launch_tile

    for blocks, heads, tail in ((7, 5, 1), (7, 5, 5), (7, 5, 2), (3, 4, 4), (1, 3, 3)):
        t = torch.full((blocks * heads, 2), -1, dtype=torch.int32, device=DEVICE)
        _launch_order_probe[(blocks, heads)](t, tail)
        assert t.tolist() == [list(launch_tile(p, blocks, heads, tail)) for p in range(blocks * heads)]


def test_the_portable_forwards_launch_order_changes_no_bit(monkeypatch):
    """The portable forward gives the same bits with the last heads interleaved (`model.tiles.launch_tail`)
    as in the grid's order: each program computes the same tile either way."""
    q, k, v = _inputs(2, 4, 2, 70, 70, 64, torch.float16, False, seed=5)
    got = {}
    for name, rule in (("grid", lambda causal, blocks, heads, sms: 1),
                       ("all", lambda causal, blocks, heads, sms: heads)):
        monkeypatch.setattr(fwd, "launch_tail", rule)
        fwd.clear_plan_cache()
        got[name] = attnscope.flash_attention(q, k, v, causal=True, return_lse=True, impl="portable")
    assert all(torch.equal(a, b) for a, b in zip(got["grid"], got["all"], strict=True))
