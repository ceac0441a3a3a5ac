"""flash_decode on a dense cache whose length changes call to call (a cache grown by torch.cat, as
transformers' DynamicCache): one plan per layout whatever the length, the same output as a fresh plan, and
the same errors for bad input."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from attnscope.checks import kernel_tolerance  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import _direct, decode  # noqa: E402
from attnscope.kernels.decode import api  # noqa: E402
from attnscope.kernels.decode import plan as plan_mod  # noqa: E402
from test_decode import reference_decode, torch_error  # noqa: E402 - the decode tests' float64 reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _grow(k, v, n, g):
    """k, v [B, Hkv, L, d] -> [B, Hkv, L + n, d] by torch.cat, as DynamicCache: new shape and strides."""
    B, Hkv, _, d = k.shape
    new = torch.randn(2, B, Hkv, n, d, generator=g).to(k.dtype).to(DEVICE)
    return torch.cat([k, new[0]], 2), torch.cat([v, new[1]], 2)


def _inputs(B, Hq, Hkv, L, d, seed, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, 1, d, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(B, Hkv, L, d, generator=g).to(dtype).to(DEVICE)
    v = torch.randn(B, Hkv, L, d, generator=g).to(dtype).to(DEVICE)
    return q, k, v, g


# steps of growth: short caches (L = 1: a length Triton specialises as a constant), then across 512, where
# the split heuristic of B x Hkv = 2 programs goes from one split to two (and L passes a multiple of 16)
STEPS = [(1, 0), (2, 1), (509, 507), (510, 1), (512, 2), (513, 1)]


@pytest.mark.parametrize("mods, seqlens", [({}, False), ({}, True),
                                          ({"window": (40, 0), "softcap": 20.0, "sinks": True}, True)],
                         ids=["dense", "seqlens", "window-softcap-sinks"])
def test_growing_cache_equals_a_fresh_plan_and_reuses_its_plans(mods, seqlens):
    decode.clear_plan_cache()
    B, Hq, Hkv, d = 1, 8, 2, 64  # GQA 4
    q, k, v, g = _inputs(B, Hq, Hkv, STEPS[0][0], d, seed=7)
    if mods.get("sinks"):
        mods = {**mods, "sinks": torch.randn(Hq, generator=g).float().to(DEVICE)}
    splits = []
    for L, n in STEPS:
        if n:
            k, v = _grow(k, v, n, g)
        assert k.shape[2] == L
        q = torch.randn(q.shape, generator=g).to(q.dtype).to(DEVICE)
        lens = torch.full((B,), L - (L > 300), dtype=torch.int32, device=DEVICE) if seqlens else None
        hits, misses = decode.plan_cache_info()[:2]
        o, lse = decode.flash_decode(q, k, v, lens, return_lse=True, **mods)
        fresh = decode.DecodePlan(q, k, v, lens, return_lse=True, **mods)
        splits.append(fresh.num_splits)
        o_ref, lse_ref = fresh.run(q, k, v, lens, sinks=mods.get("sinks"))
        assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref), (L, mods)
        new_split = len(splits) == 1 or splits[-1] not in splits[:-1]
        # a plan per split count, whatever the length: a new one only for a split count not seen before
        assert decode.plan_cache_info()[:2] == ((hits, misses + 1) if new_split else (hits + 1, misses)), L
    assert sorted(set(splits)) == ([1, 2] if not mods else [1]), splits  # the window bounds the keys read
    decode.check_errors()
    if not mods:  # and against float64 attention at the last length
        lens = lens if seqlens else torch.full((B,), k.shape[2], dtype=torch.int32, device=DEVICE)
        ref_o, _ = reference_decode(q, k, v, lens)
        err = (o.double().cpu() - ref_o).abs().max().item()
        assert err <= kernel_tolerance(torch_error(q, k, v, lens, ref_o))


def test_growing_flash_attn_layout_cache_through_the_interface():
    # flash-attn's [B, L, Hkv, d] cache grown by torch.cat along L: its [B, Hkv, L, d] view has a batch
    # stride that follows L and a fixed key stride; one plan serves every length
    from attnscope.flash_attn_interface import flash_attn_with_kvcache

    decode.clear_plan_cache()
    B, Hq, Hkv, d = 2, 4, 2, 64
    g = torch.Generator().manual_seed(11)
    k = torch.randn(B, 20, Hkv, d, generator=g).half().to(DEVICE)
    v = torch.randn(B, 20, Hkv, d, generator=g).half().to(DEVICE)
    for step in range(4):
        q = torch.randn(B, 1, Hq, d, generator=g).half().to(DEVICE)
        lens = torch.tensor([k.shape[1], k.shape[1] - 3], dtype=torch.int32, device=DEVICE)
        out = flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
        fresh = decode.DecodePlan(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), lens)
        assert torch.equal(out, fresh.run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          lens).transpose(1, 2)), step
        k = torch.cat([k, torch.randn(B, 1, Hkv, d, generator=g).half().to(DEVICE)], 1)
        v = torch.cat([v, torch.randn(B, 1, Hkv, d, generator=g).half().to(DEVICE)], 1)
    assert decode.plan_cache_info()[:3] == (3, 1, 1)
    decode.check_errors()


def _strided_last(k):
    """k's values with a last stride of 2 (a view of a buffer twice as wide)."""
    wide = torch.empty(*k.shape[:3], 2 * k.shape[3], dtype=k.dtype, device=k.device)
    wide[..., ::2] = k
    return wide[..., ::2]


@pytest.mark.parametrize("build, exc, match", [
    (lambda q, k, v: (q, k, v[:, :, :-1], {}), InputError, r"v_cache: expected shape \(as k_cache\)"),
    (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0], {}), InputError, "k_cache: expected L_max >= 1"),
    (lambda q, k, v: (q, _strided_last(k), v, {}), InputError, "k_cache: expected unit stride in the last"),
    (lambda q, k, v: (q, k, v.bfloat16(), {}), InputError, r"v_cache: expected dtype \(as k_cache\)"),
    (lambda q, k, v: (q, torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1), {}), InputError,
     "q: expected the number of query heads"),
    (lambda q, k, v: (q.expand(-1, -1, 2, -1), k[:, :, :1], v[:, :, :1], {}), InputError,
     "q: expected Nq <= L_max = 1"),
    (lambda q, k, v: (q, k.requires_grad_(), v, {}), NotImplementedError, "k_cache: decode has no backward"),
    (lambda q, k, v: (q, k, v, {"scale": -1.0}), InputError, "scale: expected a finite positive"),
    (lambda q, k, v: (q, k, v, {"num_splits": 0}), InputError, "num_splits: expected a positive integer"),
])
def test_bad_input_to_a_growing_cache_still_raises(build, exc, match):
    decode.clear_plan_cache()
    q, k, v, g = _inputs(2, 4, 2, 33, 64, seed=3)
    decode.flash_decode(q, k, v)  # the layout is known from here on, at any length
    k, v = _grow(k, v, 1, g)
    decode.flash_decode(q, k, v)
    assert decode.plan_cache_info()[:2] == (1, 1)
    q2, k2, v2, kw = build(q, k, v)
    with pytest.raises(exc, match=match):
        decode.flash_decode(q2, k2, v2, **kw)


def test_values_of_a_growing_cache_are_still_checked():
    decode.clear_plan_cache()
    q, k, v, g = _inputs(2, 4, 2, 33, 64, seed=5)
    lens = torch.tensor([33, 1], dtype=torch.int32, device=DEVICE)
    decode.flash_decode(q, k, v, lens)
    k, v = _grow(k, v, 2, g)  # L = 35: a length past it is out of range, at this call's L
    decode.flash_decode(q, k, v, torch.tensor([36, 1], dtype=torch.int32, device=DEVICE))
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max\]"):
        decode.check_errors()
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max = 35\], got 36"):
        decode.flash_decode(q, k, v, torch.tensor([36, 1], dtype=torch.int32, device=DEVICE),
                            check_seqlens=True)
    o = decode.flash_decode(q, k, v, torch.tensor([35, 1], dtype=torch.int32, device=DEVICE),
                            check_seqlens=True)
    assert torch.isfinite(o.float()).all()
    assert decode.plan_cache_info()[:2] == (2, 1)  # checked or not, the layout's one plan


def _layouts(L, strides, d=64, dtype=torch.float16):
    q = ((1, 4, 1, d), (4 * d, d, d, 1), dtype, torch.device("cpu"))
    kv = (torch.Size((1, 2, L, d)), strides, dtype, torch.device("cpu"))
    return (q, kv, kv, None, None, None, None, None)


def test_grown_key_keeps_what_a_plan_derives_from_length_and_strides():
    # one key for every length of a contiguous cache; a different key where the K/V element offsets no
    # longer fit int32 (the kernel's OFF32), where V's strides stop being words (e4m3 FP8_WORDS), for a
    # paged cache, Nq > 1 or K and V of two lengths (left to the checks)
    def key(L, strides):
        return api._grown_key(_layouts(L, strides))

    a, grown_a = key(100, (2 * 100 * 64, 100 * 64, 64, 1))
    b, grown_b = key(101, (2 * 101 * 64, 101 * 64, 64, 1))
    assert a == b and grown_a == (12800, 6400, 64, 12800, 6400, 64, 100) and grown_b[6] == 101
    wide, _ = key(2**31 // 64, (2**32, 2**31, 64, 1))  # (L - 1) x 64 + 64 = 2^31 elements: int64 offsets
    fits, _ = key(2**31 // 64 - 1, (2**32, 2**31, 64, 1))
    assert wide != a and fits == a and wide[-2:] == (False, True)
    odd, _ = key(100, (2 * 100 * 64 + 2, 100 * 64, 64, 1))
    assert odd != a and odd[-1] is False
    layouts = _layouts(100, (12800, 6400, 64, 1))
    for changed in (layouts[:4] + ((("page",),),) + layouts[5:],  # a block table
                    (((1, 4, 2, 64),) + layouts[0][1:],) + layouts[1:],  # Nq = 2
                    layouts[:2] + ((torch.Size((1, 2, 99, 64)),) + layouts[2][1:],) + layouts[3:]):
        assert api._grown_key(changed) == (changed, None)


def test_int_classes_and_a_binary_per_class(monkeypatch):
    # Triton compiles a binary per class of each integer argument (1, a multiple of 16, past int32, other);
    # a plan serving every length keeps one per class and never launches one class's binary for another
    assert _direct.int_classes((1, 16, 17, 2**31, 2**31 + 1, 0)) == (-1, 1, 0, 3, 2, 1)
    calls = []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def __init__(self, spec):
            self.spec = spec

        def run(self, *a):
            calls.append(("direct", self.spec))

    current = [None]

    class Kernel:
        params = triton.runtime.jit.JITFunction(plan_mod._attnscope_decode_split_kernel.fn).params

        def __getitem__(self, grid):
            def launch(*args, **kw):
                calls.append(("triton", current[0]))
                return Compiled(current[0])
            return launch

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1, raising=False)
    n_args = next(i for i, p in enumerate(Kernel.params) if p.is_constexpr)
    d = _direct.DirectLaunch(Kernel(), {"GROUP": 4}, 0)
    for spec in ((1,), (0,), (1,), (0,), (-1,)):
        current[0] = spec
        d.launch((2, 1), tuple(range(n_args)), True, spec)
    assert calls == [("triton", (1,)), ("triton", (0,)), ("direct", (1,)), ("direct", (0,)),
                     ("triton", (-1,))]
    assert d.compiled is None and set(d.by_spec) == {(1,), (0,), (-1,)}
