"""flash_decode / DecodePlan: device-side value checks (no host sync), FP8 (e4m3) KV caches, and the score
mods (window, softcap, sinks), against the float64 reference with `checks.kernel_tolerance`.

Under TRITON_INTERPRET=1 (tests/conftest.py) the shapes are tiny. The PyTorch error that sets each bound
is PyTorch's own attention at q's dtype on the same (for FP8: dequantised) cache, with the same mods.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope import reference  # noqa: E402
from attnscope.checks import kernel_tolerance  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import decode  # noqa: E402
from attnscope.kernels.decode import flash_decode, heuristics, quantize  # noqa: E402
from attnscope.kernels.decode import plan as plan_mod  # noqa: E402
from attnscope.model.tiles import window_kv_bounds0  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn


# --- helpers -------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _no_recorded_errors():
    """Each test starts with the device error word clear (a test that provokes one reads it)."""
    with contextlib.suppress(InputError):
        decode.check_errors()


def inputs(B, Hq, Hkv, Nq, L, d=64, dtype=torch.float16, seed=0, q_mult=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, Nq, d, generator=g) * q_mult).to(dtype)
    k = torch.randn(B, Hkv, L, d, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, d, generator=g).to(dtype)
    return q, k, v


def to_paged(k, v, page_size, gen):
    """Dense k, v [B, Hkv, L, d] (CPU) -> randomly permuted pages [P, page_size, Hkv, d] (the spare pages
    NaN) and a block table [B, ceil(L / page_size)] int32."""
    B, Hkv, L, d = k.shape
    n = -(-L // page_size)
    perm = torch.randperm(B * n + 2, generator=gen)
    kp = torch.full((B * n + 2, page_size, Hkv, d), float("nan"), dtype=k.dtype)
    vp = kp.clone()
    table = torch.empty(B, n, dtype=torch.int32)
    for b in range(B):
        for j in range(n):
            page = int(perm[b * n + j])
            table[b, j] = page
            m = min(page_size, L - j * page_size)
            kp[page, :m] = k[b, :, j * page_size:j * page_size + m].transpose(0, 1)
            vp[page, :m] = v[b, :, j * page_size:j * page_size + m].transpose(0, 1)
    return kp, vp, table


def visible(Nq, n, window):
    """[Nq, n] bool: the keys each of the last Nq positions of a sequence of n keys sees (causal, window)."""
    left = -1 if window is None else window[0]
    r = np.arange(Nq)[:, None] + n - Nq
    c = np.arange(n)[None, :]
    return (c <= r) & ((left < 0) | (c >= r - left))


def expected(q, k, v, lens, *, scale=None, window=None, softcap=0.0, sinks=None):
    """float64 (o [B, Hq, Nq, d], natural-log lse [B, Hq, Nq]) from `reference.naive_attention`, per
    sequence over its first lens[b] keys; no key: o = 0, lse = sinks[h] or -inf."""
    B, Hq, Nq, d = q.shape
    G = Hq // k.shape[1]
    sk = None if sinks is None else sinks.double().cpu().numpy()
    o = np.zeros((B, Hq, Nq, d))
    lse = np.full((B, Hq, Nq), -np.inf)
    if sk is not None:
        lse[:] = sk[None, :, None]
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        kb = k[b, :, :n].double().cpu().numpy().repeat(G, 0)
        vb = v[b, :, :n].double().cpu().numpy().repeat(G, 0)
        qb = q[b].double().cpu().numpy()
        o[b], lse[b] = reference.naive_attention(qb, kb, vb, causal=True, scale=scale, return_lse=True,
                                                 window=window, softcap=softcap, sinks=sk)
    return o, lse


def torch_attention(q, k, v, lens, *, scale=None, window=None, softcap=0.0, sinks=None):
    """PyTorch's attention at q's dtype (k, v cast to it), masked as `expected`: o [B, Hq, Nq, d] (NaN rows
    where no key is visible and no sink)."""
    B, Hq, Nq, d = q.shape
    G = Hq // k.shape[1]
    k, v = (t.to(q.dtype).cpu().repeat_interleave(G, 1) for t in (k, v))
    s = (q.cpu() @ k.transpose(-1, -2)) * (scale if scale is not None else d ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    mask = torch.zeros(B, 1, Nq, k.shape[2], dtype=torch.bool)
    for b in range(B):
        n = int(lens[b])
        mask[b, 0, :, :n] = torch.from_numpy(visible(Nq, n, window))
    s = s.masked_fill(~mask, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.to(q.dtype).cpu()[None, :, None, None].expand(B, Hq, Nq, 1)], -1)
        v = torch.cat([v, torch.zeros(B, Hq, 1, d, dtype=v.dtype)], 2)
    return torch.softmax(s, -1) @ v


def check(o, lse, q, k, v, lens, **mods):
    """o, lse against float64 within kernel_tolerance of PyTorch's error at q's dtype; rows with no key
    (and no sink) exactly 0 and -inf."""
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert torch.isfinite(o).all(), "output not finite"
    ref_o, ref_lse = expected(q, k, v, lens, **mods)
    ref_t = torch_attention(q, k, v, lens, **mods).double().numpy()
    rows = np.isfinite(ref_lse)
    torch_err = float(np.abs(ref_t - ref_o)[rows].max(initial=0.0))
    err = float(np.abs(o.double().cpu().numpy() - ref_o).max())
    assert err <= kernel_tolerance(torch_err), f"error {err:.3g} > bound {kernel_tolerance(torch_err):.3g}"
    got_lse = lse.double().cpu().numpy()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(ref_lse)), "rows with no key"
    assert (o.float().cpu().numpy()[~rows] == 0).all()
    assert np.abs(got_lse[rows] - ref_lse[rows]).max(initial=0.0) <= 1e-3


def lens_t(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def dev(*ts):
    return tuple(None if t is None else t.to(DEVICE) for t in ts)


# --- values checked on the device: nothing read or written outside the tensors, reported ----------------
def carve(t, fill, pad=3, dim=0):
    """``t`` as a view into the middle of a larger buffer filled with ``fill`` (its neighbours)."""
    shape = list(t.shape)
    shape[dim] += 2 * pad
    buf = torch.full(shape, fill, dtype=t.dtype, device=DEVICE)
    view = buf.narrow(dim, pad, t.shape[dim])
    view.copy_(t)
    return buf, view


@pytest.mark.parametrize("nq, num_splits", [(1, 1), (1, 3), (3, 2)])
def test_out_of_range_lengths_are_clamped_on_the_device_and_reported(nq, num_splits):
    decode.check_errors()
    B, Hq, Hkv, L = 3, 4, 2, 40
    q, k, v = inputs(B, Hq, Hkv, nq, L, seed=nq + num_splits)
    q, k, v = dev(q, k, v)
    k_buf, kc = carve(k, float("nan"), dim=2)  # keys -3..-1 and L..L+2 of every head: NaN
    v_buf, vc = carve(v, float("nan"), dim=2)
    bad = lens_t([L + 7, -5, 9])
    plan = decode.decode_plan(q, kc, vc, bad, num_splits=num_splits, return_lse=True)
    out_buf, out = carve(torch.empty(B, Hq, nq, 64, dtype=q.dtype, device=DEVICE), 7.0)
    lse_buf, lse_out = carve(torch.empty(B, Hq, nq, device=DEVICE), 7.0)
    o, lse = plan.run(q, kc, vc, bad, out=out, lse_out=lse_out)
    assert torch.isfinite(o).all() and not torch.isnan(lse).any()
    assert (out_buf[:3] == 7).all() and (out_buf[-3:] == 7).all()
    assert (lse_buf[:3] == 7).all() and (lse_buf[-3:] == 7).all()
    check(o, lse, q, k, v, [L, 0, 9])  # clamped to [0, L_max]: what the kernel attended to
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max\]"):
        plan.check()
    decode.check_errors()  # cleared by the check that raised
    plan.run(q, kc, vc, lens_t([L, 0, 9]))
    plan.check()  # in range: nothing recorded


@pytest.mark.parametrize("nq, num_splits, fp8", [(1, 1, False), (1, 2, False), (2, 2, False), (1, 2, True)])
def test_out_of_range_block_table_entries_are_never_dereferenced_and_reported(nq, num_splits, fp8):
    decode.check_errors()
    gen = torch.Generator().manual_seed(3)
    B, Hq, Hkv, L, ps = 3, 4, 2, 48, 16
    q, k, v = inputs(B, Hq, Hkv, nq, L, seed=5 + nq)
    scales = {}
    if fp8:  # an e4m3 cache at unit scales (e4m3 values are exact in fp16: the reference reads them)
        k, v = k.to(FP8).to(q.dtype), v.to(FP8).to(q.dtype)
        one = torch.ones((), dtype=torch.float32, device=DEVICE)
        scales = {"k_scale": one, "v_scale": one}
    kp, vp, table = to_paged(k, v, ps, gen)
    P = kp.shape[0]
    dt = FP8 if fp8 else kp.dtype
    kp_buf, kpc = carve(kp.to(DEVICE, dt), float("nan"))  # the pages before and after: NaN
    vp_buf, vpc = carve(vp.to(DEVICE, dt), float("nan"))
    bad = table.clone()
    bad[0, 1], bad[2, 2] = -1, P  # the page before / after the cache
    tab_buf, tab = carve(bad.to(DEVICE), 2**30, dim=1)  # entries around the table: huge
    lens = lens_t([L, 20, 40])  # sequence 1 uses 2 pages: its third entry may be anything
    tab[1, 2] = -(2**30)
    o, lse = flash_decode(q.to(DEVICE), kpc, vpc, lens, tab, num_splits=num_splits, return_lse=True, **scales)
    assert torch.isfinite(o).all() and not torch.isnan(lse).any()
    assert torch.isnan(kp_buf[:3].float()).all() and torch.isnan(kp_buf[-3:].float()).all()
    ok = [1]  # sequence 1's used pages are all valid: its result is the reference's
    check(o[ok], lse[ok], q[ok], k[ok], v[ok], [20])
    with pytest.raises(InputError, match=r"block_table: expected used page indices in \[0, num_pages\)"):
        decode.check_errors()
    flash_decode(q.to(DEVICE), kpc, vpc, lens, table.to(DEVICE), num_splits=num_splits, **scales)
    decode.check_errors()  # valid entries: nothing recorded
    with pytest.raises(InputError, match=r"block_table: expected page indices in \[0, num_pages = 11\)"):
        flash_decode(q.to(DEVICE), kpc, vpc, lens, tab, check_seqlens=True, **scales)


def test_inputs_that_require_grad_are_refused():
    q, k, v = dev(*inputs(2, 4, 2, 1, 16))
    plan = decode.decode_plan(q, k, v)
    for name, t in (("q", q), ("k_cache", k), ("v_cache", v)):
        t.requires_grad_(True)
        with pytest.raises(NotImplementedError, match=f"{name}: decode has no backward"):
            flash_decode(q, k, v)
        with pytest.raises(NotImplementedError, match=f"{name}: decode has no backward"):
            plan.run(q, k, v)
        with torch.no_grad():
            assert flash_decode(q, k, v).grad_fn is None
        t.requires_grad_(False)
    sinks = torch.zeros(4, device=DEVICE, requires_grad=True)
    with pytest.raises(NotImplementedError, match="sinks: decode has no backward"):
        flash_decode(q, k, v, sinks=sinks)
    # quantize_kv rounds to e4m3 (no backward): refused too, not its input's gradient silently detached
    with pytest.raises(NotImplementedError, match="x: decode has no backward"):
        attnscope.quantize_kv(k.clone().requires_grad_(True))
    with torch.no_grad():
        attnscope.quantize_kv(k.clone().requires_grad_(True))


@pytest.mark.parametrize("kw, exc, match", [
    ({"max_seqlen": 17}, InputError, r"max_seqlen: expected an integer in \[0, L_max = 16\] or None"),
    ({"max_seqlen": 2.0}, InputError, "max_seqlen: expected an integer"),
    ({"num_splits": True}, InputError, "num_splits: expected a positive integer or None, got True"),
    ({"window": (-2, 0)}, InputError, "window"),
    ({"window": (1.5, 0)}, InputError, "window"),
    ({"softcap": -1.0}, InputError, "softcap: expected a finite real number >= 0"),
    ({"softcap": float("inf")}, InputError, "softcap"),
    ({"sinks": torch.zeros(3)}, InputError, r"sinks: expected a float32 tensor of shape \[Hq\] = \[4\]"),
    ({"sinks": torch.zeros(4, dtype=torch.float64)}, InputError, "sinks: expected a float32 tensor"),
    ({"sinks": [0.0] * 4}, InputError, "sinks: expected None or a torch.Tensor"),
    ({"sinks": torch.zeros(4, 2, device=DEVICE)[:, 0]}, InputError,
     r"sinks: expected a contiguous \[Hq\] tensor, got stride 2"),
    ({"check_seqlens": 1}, InputError, "check_seqlens: expected True or False, got 1"),
])
def test_numeric_arguments_are_checked(kw, exc, match):
    q, k, v = dev(*inputs(2, 4, 2, 1, 16))
    kw = {n: (x.to(DEVICE) if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
    with pytest.raises(exc, match=match):
        decode.decode_plan(q, k, v, **kw)
    if "max_seqlen" not in kw:  # a plan option only
        with pytest.raises(exc, match=match):
            flash_decode(q, k, v, **kw)


# --- FP8 (e4m3) KV cache --------------------------------------------------------------------------------
def dequantised(x8, scale, head_axis):
    shape = [1] * x8.dim()
    if scale.dim() == 1:
        shape[head_axis] = -1
    return x8.float() * scale.reshape(shape).float()


def fp8_cache(k, v, per_head, page_size, gen):
    """k, v [B, Hkv, L, d] as an e4m3 cache (`attnscope.quantize_kv`, per head or per tensor), in pages of
    ``page_size`` keys (`to_paged`; 0: dense): (k cache, v cache, block table or None, k_scale, v_scale,
    and the dequantised dense k, v in fp32, the reference's inputs)."""
    k8, k_scale = attnscope.quantize_kv(k, per_head=per_head)
    v8, v_scale = attnscope.quantize_kv(v, per_head=per_head)
    kd, vd = dequantised(k8, k_scale, 1), dequantised(v8, v_scale, 1)  # fp32 [B, Hkv, L, d]
    if not page_size:
        return k8, v8, None, k_scale, v_scale, kd, vd
    kc, vc, table = to_paged(k8.float(), v8.float(), page_size, gen)
    return kc.to(FP8), vc.to(FP8), table, k_scale, v_scale, kd, vd


@pytest.mark.parametrize("paged, nq, per_head, dtype, num_splits, group", [
    (False, 1, True, torch.bfloat16, 1, 2), (False, 1, False, torch.float16, 3, 4),
    (True, 1, True, torch.float16, 2, 2), (True, 1, False, torch.bfloat16, 1, 1),
    (False, 3, True, torch.float16, 2, 2), (True, 3, False, torch.bfloat16, 1, 2),
])
def test_fp8_cache_matches_float64_on_the_dequantised_cache(paged, nq, per_head, dtype, num_splits, group):
    gen = torch.Generator().manual_seed(7)
    B, Hkv, L = 4, 2, 37
    q, k, v = inputs(B, group * Hkv, Hkv, nq, L, dtype=dtype, seed=nq + group)
    k = k * (torch.arange(1, Hkv + 1, dtype=dtype)[None, :, None, None] * 3)  # per-head ranges differ
    kc, vc, table, k_scale, v_scale, kd, vd = fp8_cache(k, v, per_head, 16 if paged else 0, gen)
    lens = [L, nq, 0, 20]  # a nonzero length holds its nq queries
    kc, vc, table, k_scale, v_scale, qd = dev(kc, vc, table, k_scale, v_scale, q)
    o, lse = flash_decode(qd, kc, vc, lens_t(lens), table, num_splits=num_splits, return_lse=True,
                          k_scale=k_scale, v_scale=v_scale)
    check(o, lse, q, kd, vd, lens)
    plan = decode.decode_plan(qd, kc, vc, lens_t(lens), table, num_splits=num_splits, return_lse=True,
                              k_scale=k_scale, v_scale=v_scale)
    o2, lse2 = plan.run(qd, kc, vc, lens_t(lens), table, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    decode.check_errors()


def _bf16qk_config(page):
    """The interpreter's block config for pages of ``page`` keys, with e4m3 -> q's dtype converts and Q K^T
    in q's dtype (`heuristics.FP8_CONFIGS` "bf16qk-w8"'s path) instead of the default fp16 Q K^T."""
    return {**heuristics._block_config(16, page, fp8=True), "F16QK": False}


@pytest.mark.parametrize("paged", (False, True))
def test_fp8_v_read_as_words_or_as_bytes_gives_the_same_bits(paged):
    # Q K^T in q's dtype (F16QK off): an aligned e4m3 V is read as int32 words of four elements
    # (FP8_WORDS), one that is not (a view one byte into its buffer) element by element: both convert
    # exactly, so the outputs are the same bits
    gen = torch.Generator().manual_seed(3)
    q, k, v = inputs(2, 4, 2, 1, 40, dtype=torch.bfloat16, seed=5)
    k8, k_scale = attnscope.quantize_kv(k)
    v8, v_scale = attnscope.quantize_kv(v)
    table = None
    if paged:
        k8, v8, table = to_paged(k8.float(), v8.float(), 16, gen)
        k8, v8 = k8.to(FP8), v8.to(FP8)
    k8, v8, table, k_scale, v_scale, qd = dev(k8, v8, table, k_scale, v_scale, q)
    buf = torch.empty(v8.numel() + 1, dtype=FP8, device=DEVICE)
    v_odd = buf[1:].view(v8.shape)
    v_odd.copy_(v8)
    lens = lens_t([40, 23])
    cfg = _bf16qk_config(16 if paged else 0)
    outs = []
    for vc, words in ((v8, True), (v_odd, False)):
        plan = plan_mod._tuned_plan(qd, k8, vc, lens, table, num_splits=2, return_lse=True, k_scale=k_scale,
                                    v_scale=v_scale, config=cfg)
        assert plan._consts.get("FP8_WORDS", False) is words and "FP8_F16QK" not in plan._consts
        outs.append(plan.run(qd, k8, vc, lens, table, k_scale=k_scale, v_scale=v_scale))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    words_plan = plan_mod._tuned_plan(qd, k8, v8, lens, table, num_splits=2, k_scale=k_scale, v_scale=v_scale,
                                      config=cfg)
    with pytest.raises(InputError, match="v_cache: expected an address that is a multiple of 4 bytes"):
        words_plan.run(qd, k8, v_odd, lens, table, k_scale=k_scale, v_scale=v_scale)  # same layout
    # the default (fp16 Q K^T) reads V per byte at any address: one result for both, no refusal
    plan = decode.decode_plan(qd, k8, v8, lens, table, num_splits=2, k_scale=k_scale, v_scale=v_scale)
    assert plan._consts.get("FP8_F16QK") is True and "FP8_WORDS" not in plan._consts
    o_default = plan.run(qd, k8, v8, lens, table, k_scale=k_scale, v_scale=v_scale)
    for vc in (v8, v_odd, v8):  # the one-liner keys its plans on it
        o = flash_decode(qd, k8, vc, lens, table, num_splits=2, k_scale=k_scale, v_scale=v_scale)
        assert torch.equal(o, o_default)
    if not paged:
        kd, vd = dequantised(k8.cpu(), k_scale.cpu(), 1), dequantised(v8.cpu(), v_scale.cpu(), 1)
        check(*outs[0], q, kd, vd, [40, 23])
        check(o_default, outs[0][1], q, kd, vd, [40, 23])


@pytest.mark.parametrize("paged, nq, per_head", [(False, 1, True), (True, 1, False), (False, 3, False),
                                                 (True, 3, True)])
def test_fp8_bf16qk_config_matches_float64(paged, nq, per_head):
    # the e4m3 -> bf16 path (`FP8_CONFIGS` "bf16qk-w8", a benchmark candidate) stays correct: dense and
    # paged, one and several queries, per-tensor and per-head scales, ragged lengths with 0
    gen = torch.Generator().manual_seed(11)
    B, Hkv, L = 3, 2, 45
    q, k, v = inputs(B, 4, Hkv, nq, L, dtype=torch.bfloat16, seed=20 + nq)
    kc, vc, table, k_scale, v_scale, kd, vd = fp8_cache(k * 5, v, per_head, 16 if paged else 0, gen)
    lens = [L, 0, 17]
    kc, vc, table, k_scale, v_scale, qd = dev(kc, vc, table, k_scale, v_scale, q)
    plan = plan_mod._tuned_plan(qd, kc, vc, lens_t(lens), table, num_splits=2, return_lse=True,
                                k_scale=k_scale, v_scale=v_scale, config=_bf16qk_config(16 if paged else 0))
    assert "FP8_F16QK" not in plan._consts
    check(*plan.run(qd, kc, vc, lens_t(lens), table, k_scale=k_scale, v_scale=v_scale), q, kd, vd, lens)
    decode.check_errors()


def test_fp8_dense_decode_splits_for_two_programs_per_sm():
    # e4m3 on a dense cache, one query per sequence: the split heuristic aims for FP8_DENSE_WAVES programs
    # per SM (in FP8_MANY's config); a bf16 cache, a paged cache and chunk tiles keep one wave
    assert heuristics._split_waves(True, False, 1) == heuristics.FP8_DENSE_WAVES
    assert heuristics._split_waves(True, True, 1) == heuristics.WAVES
    assert heuristics._split_waves(False, False, 1) == heuristics.WAVES
    assert heuristics._split_waves(True, False, 3) == heuristics.WAVES
    # the H200's (132 SMs) measured points, Hq 32: (B, Hkv, L) -> splits of one wave, of the e4m3 rule
    waves = heuristics.FP8_DENSE_WAVES
    for (b, hkv, length), want in {(1, 8, 32768): (16, 16), (1, 8, 131072): (16, 33), (1, 32, 32768): (4, 8),
                                   (8, 8, 32768): (2, 4), (16, 8, 131072): (1, 2), (32, 8, 32768): (1, 1),
                                   (1, 8, 4096): (16, 16), (34, 32, 32768): (3, 3)}.items():
        got = tuple(heuristics._splits(b, hkv, length, 132, w) for w in (heuristics.WAVES, waves))
        assert got == want, (b, hkv, length, got)
    B, Hq, Hkv, L = 16, 8, 4, 8192  # 64 items: one wave 2 splits, two waves 4 (of 2,048 keys)
    q, k, v = dev(*inputs(B, Hq, Hkv, 1, L, dtype=torch.bfloat16)[:3])
    k8, ks = attnscope.quantize_kv(k)
    v8, vs = attnscope.quantize_kv(v)
    sms, items = heuristics._sms(q.device), B * Hkv
    bf16 = attnscope.decode_plan(q, k, v)
    fp8 = attnscope.decode_plan(q, k8, v8, k_scale=ks, v_scale=vs)
    assert bf16.num_splits == min(heuristics.WAVES * sms // items, L // heuristics.MIN_KEYS_PER_SPLIT)
    most = L // heuristics.WAVE_MIN_KEYS
    assert fp8.num_splits == min(heuristics.FP8_DENSE_WAVES * sms // items, most)
    assert fp8.num_splits > bf16.num_splits
    assert items * fp8.num_splits > sms and heuristics._fp8_config_name(items * fp8.num_splits, sms) == \
        heuristics.FP8_MANY  # the config two programs per SM fit in (the interpreter runs its own)
    # the one-liner's plan (the split rule kept for a layout that reads no lengths) agrees
    assert decode.api._SplitRule.of(q.device, decode.api._check_inputs(
        q, k8, v8, None, None, None, None, ks, vs, None, 0.0, None, None), None, None, None).splits(L) == \
        fp8.num_splits
    decode.check_errors()


def test_fp8_tile_config_rule_and_paged_stages():
    # e4m3 decode tiles: FP8_DEFAULT up to one program per SM, FP8_MANY past it; the candidates are
    # complete block configs, dense tiles at their own stages, paged ones at most the bf16 paged rule's
    # (5 for blocks of several pages, 3 inside one page)
    assert heuristics.FP8_DEFAULT in heuristics.FP8_CONFIGS and heuristics.FP8_MANY in heuristics.FP8_CONFIGS
    assert heuristics._fp8_config_name(132, 132) == heuristics.FP8_DEFAULT
    assert heuristics._fp8_config_name(133, 132) == heuristics.FP8_MANY
    assert heuristics._fp8_config_name(133, 132, paged=True) == heuristics.FP8_DEFAULT
    for name, want in heuristics.FP8_CONFIGS.items():
        dense = heuristics._fp8_config(name)
        assert dense["STAGES"] == dense["num_stages"] == want["STAGES"]
        assert {k: dense[k] for k in ("BLOCK_N", "num_warps", "F16QK")} == \
            {k: want[k] for k in ("BLOCK_N", "num_warps", "F16QK")}
        for page in heuristics.PAGE_SIZES:
            paged = heuristics._fp8_config(name, page)
            rule = 5 if want["BLOCK_N"] > page else 3
            assert paged["STAGES"] == paged["num_stages"] == min(want["STAGES"], rule), (name, page)
    # splits sized on bytes: twice the keys per split for e4m3, bf16 unchanged
    assert heuristics._split_min_keys(True, True) == 2 * heuristics.MIN_KEYS_PER_SPLIT
    assert heuristics._split_min_keys(False, True) == heuristics._split_min_keys(True, False) == \
        heuristics.MIN_KEYS_PER_SPLIT


@pytest.mark.parametrize("name", sorted(heuristics.FP8_CONFIGS))
@pytest.mark.parametrize("page", (0, 64, 256))
def test_each_fp8_tile_config_matches_float64(name, page):
    # every e4m3 candidate a benchmark can pick (heuristics.FP8_CONFIGS) at its own block size, one query:
    # dense, pages of 64 (several per block) and of 256 (a block inside one page); lengths that end inside
    # a block and inside a page, ragged, 0; one split and several. (The slots past a length are NaN, but
    # the interpreter converts an e4m3 NaN to 480: that no such slot is loaded, `test_gpu_*` checks.)
    gen = torch.Generator().manual_seed(len(name) + page)
    B, Hkv, L = 3, 2, 600
    q, k, v = inputs(B, 8, Hkv, 1, L, dtype=torch.bfloat16, seed=page + 1, q_mult=2.0)
    kc, vc, table, k_scale, v_scale, kd, vd = fp8_cache(k * 4, v, True, page, gen)
    lens = [L, 0, 299]
    kc, vc, table, k_scale, v_scale, qd = dev(kc, vc, table, k_scale, v_scale, q)
    cfg = heuristics._fp8_config(name, page)
    for splits in (1, 3):
        plan = plan_mod._tuned_plan(qd, kc, vc, lens_t(lens), table, num_splits=splits, return_lse=True,
                                    k_scale=k_scale, v_scale=v_scale, config=cfg)
        assert plan._consts["BLOCK_N"] == cfg["BLOCK_N"]
        assert plan._consts.get("FP8_F16QK", False) is cfg["F16QK"]
        check(*plan.run(qd, kc, vc, lens_t(lens), table, k_scale=k_scale, v_scale=v_scale), q, kd, vd, lens)
    decode.check_errors()


@pytest.mark.parametrize("q_mult", (3e4, 1e-25, 1.0))
def test_fp8_f16qk_scales_bf16_query_rows_of_any_magnitude(q_mult):
    # F16QK runs Q K^T in fp16 on bf16 rows scaled by powers of two (`_kernel._rows_to_f16`): rows far past
    # fp16's range (3e4 x randn reaches 1e5 > 65504) or far below it (1e-25) give the float64 answer, as
    # does a row of zeros (the padded rows); the scale folds back into the scores
    B, Hkv, L = 2, 2, 40
    q, k, v = inputs(B, 8, Hkv, 1, L, dtype=torch.bfloat16, seed=31, q_mult=q_mult)
    q[1, 3] = 0  # an all-zero row: uniform attention
    k8, k_scale = attnscope.quantize_kv(k)
    v8, v_scale = attnscope.quantize_kv(v)
    kd, vd = dequantised(k8, k_scale, 1), dequantised(v8, v_scale, 1)
    lens = [L, 29]
    scale = 1.0 / (q_mult * 8) if q_mult > 1 else None  # keep the softmax soft for the large rows
    k8, v8, k_scale, v_scale, qd = dev(k8, v8, k_scale, v_scale, q)
    plan = decode.decode_plan(qd, k8, v8, lens_t(lens), num_splits=2, return_lse=True, k_scale=k_scale,
                              v_scale=v_scale, scale=scale)
    assert plan._consts.get("FP8_F16QK") is True
    o, lse = plan.run(qd, k8, v8, lens_t(lens), k_scale=k_scale, v_scale=v_scale)
    check(o, lse, q, kd, vd, lens, scale=scale)


@pytest.mark.parametrize("head_axis", (-3, 0, -2))
def test_quantize_kv_in_chunks_gives_the_same_bits(monkeypatch, head_axis):
    x = torch.randn(5, 3, 7, 64, dtype=torch.float16)
    whole = attnscope.quantize_kv(x, head_axis=head_axis)
    monkeypatch.setattr(quantize, "CHUNK_ELEMENTS", 100)  # 1 slice of dim 0 at a time
    parts = attnscope.quantize_kv(x, head_axis=head_axis)
    assert torch.equal(whole[0].view(torch.uint8), parts[0].view(torch.uint8))
    assert torch.equal(whole[1], parts[1])


def test_quantize_kv_scales_and_round_trip():
    x = (torch.randn(2, 3, 10, 64) * torch.tensor([1.0, 100.0, 0.0])[None, :, None, None]).bfloat16()
    x8, s = attnscope.quantize_kv(x)
    assert x8.dtype == FP8 and x8.shape == x.shape and s.shape == (3,) and s.dtype == torch.float32
    assert s[2] == 1.0  # an all-zero head: scale 1
    assert torch.allclose(x8.float().abs().amax(dim=(0, 2, 3))[:2], torch.tensor([448.0, 448.0]))
    back = dequantised(x8, s, 1)
    assert ((back - x.float()).abs() <= x.float().abs() * 2**-4 + s[None, :, None, None] * 2**-9).all()
    x8t, st = attnscope.quantize_kv(x, per_head=False)
    assert st.dim() == 0 and torch.isclose(st, x.float().abs().max() / 448)
    kp = x.permute(0, 2, 1, 3).contiguous()  # a paged cache [P, page_size, Hkv, d]
    assert torch.equal(attnscope.quantize_kv(kp, head_axis=-2)[1], s)
    with pytest.raises(InputError, match="head_axis: expected an axis of x"):
        attnscope.quantize_kv(x, head_axis=4)
    with pytest.raises(NotImplementedError, match="x: dtype torch.int32 is not supported"):
        attnscope.quantize_kv(torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(InputError, match="check_finite: expected True or False"):
        attnscope.quantize_kv(x, check_finite=1)


@pytest.mark.parametrize("per_head", (True, False))
def test_quantize_kv_extreme_finite_values_give_positive_scales_and_no_nan(per_head):
    # heads of: zeros (and -0.0), fp32 values so tiny that amax / 448 underflows to 0 (scale 1, they round
    # to 0: never a 0 scale and 0 / 0 = NaN codes), fp32 subnormals, values far past e4m3's 448, and one
    # huge outlier among ordinary values; each dequantises within e4m3's rounding (2^-4 relative) plus
    # half its smallest step
    x = torch.randn(2, 5, 6, 64, generator=torch.Generator().manual_seed(3))
    x[:, 0] = 0.0
    x[0, 0, 0, :8] = -0.0
    x[:, 1] = x[:, 1].sign() * 1e-44
    x[:, 2] *= 1e-40
    x[:, 3] *= 3e36
    x[1, 4, 2, 5] = -3e38
    x8, s = attnscope.quantize_kv(x, per_head=per_head)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert not x8.float().isnan().any()
    back = dequantised(x8, s, 1)
    step = (s[None, :, None, None] if per_head else s) * 2**-9
    assert ((back - x).abs() <= x.abs() * 2**-4 + step).all()
    if per_head:
        assert s[0] == 1.0 and s[1] == 1.0 and (back[:, 1] == 0).all()
    decode.check_errors()  # finite input: nothing recorded


@pytest.mark.parametrize("bad", (float("nan"), float("inf"), -float("inf")))
def test_quantize_kv_records_a_non_finite_input_on_the_device(bad):
    # no host sync by default: NaN / inf in x stays in its head's scale and is raised by the next
    # check_errors; check_finite=True raises at once (a sync) and records nothing
    x = torch.randn(2, 3, 5, 64, dtype=torch.bfloat16)
    x[1, 2, 4, 7] = bad
    x8, s = attnscope.quantize_kv(x.to(DEVICE))
    s = s.cpu()
    assert torch.isfinite(s[:2]).all() and not torch.isfinite(s[2])  # the other heads as without it
    ok8 = attnscope.quantize_kv(x[:, :2].to(DEVICE))[0]
    assert torch.equal(x8[:, :2].view(torch.uint8), ok8.view(torch.uint8))
    with pytest.raises(InputError, match="x: expected finite values, got NaN or inf in a quantize_kv call"):
        decode.check_errors()
    decode.check_errors()  # cleared by the check that raised
    for per_head in (True, False):
        with pytest.raises(InputError, match="x: expected finite values, got NaN or inf"):
            attnscope.quantize_kv(x.to(DEVICE), per_head=per_head, check_finite=True)
    decode.check_errors()  # nothing recorded
    _, s = attnscope.quantize_kv(x.to(DEVICE), per_head=False)
    assert not torch.isfinite(s.cpu())
    with pytest.raises(InputError, match="quantize_kv"):
        decode.check_errors()


def _fp8_ok():
    q, k, v = inputs(2, 4, 2, 1, 16)
    k8, ks = attnscope.quantize_kv(k)
    v8, vs = attnscope.quantize_kv(v)
    return dev(q, k, v, k8, v8, ks, vs)


@pytest.mark.parametrize("build, exc, match", [
    (lambda q, k, v, k8, v8, ks, vs: (q.to(FP8), k8, v8, {"k_scale": ks, "v_scale": vs}), NotImplementedError,
     "q: dtype torch.float8_e4m3fn is not supported; supported: torch.float16, torch.bfloat16"),
    (lambda q, k, v, k8, v8, ks, vs: (q, k.to(torch.float8_e5m2), v.to(torch.float8_e5m2),
                                      {"k_scale": ks, "v_scale": vs}), NotImplementedError,
     "k_cache: dtype torch.float8_e5m2 is not supported; supported: q's dtype .* or torch.float8_e4m3fn"),
    (lambda q, k, v, k8, v8, ks, vs: (q, k8, v8, {}), InputError,
     r"k_scale: expected a float32 tensor of one element or of shape \[Hkv\] = \[2\] .a float8_e4m3fn cache "
     r"needs it., got None"),
    (lambda q, k, v, k8, v8, ks, vs: (q, k8, v8, {"k_scale": ks, "v_scale": vs[:1].double()}), InputError,
     "v_scale: expected a float32 tensor .*, got torch.float64 of shape"),
    (lambda q, k, v, k8, v8, ks, vs: (q, k8, v8, {"k_scale": ks.repeat(2), "v_scale": vs}), InputError,
     r"k_scale: expected a float32 tensor of one element or of shape \[Hkv\] = \[2\].*got torch.float32 of "
     r"shape \(4,\)"),
    (lambda q, k, v, k8, v8, ks, vs: (q, k8, v8, {"k_scale": ks, "v_scale": vs[:1]}), NotImplementedError,
     "k_scale, v_scale: supported: both per tensor"),
    (lambda q, k, v, k8, v8, ks, vs: (q, k, v, {"k_scale": ks, "v_scale": vs}), InputError,
     "k_scale: expected None .scales apply to a torch.float8_e4m3fn cache only."),
    (lambda q, k, v, k8, v8, ks, vs: (q, k8, v, {"k_scale": ks, "v_scale": vs}), InputError,
     "v_cache: expected dtype .as k_cache. torch.float8_e4m3fn, got torch.float16"),
])
def test_unsupported_fp8_combinations(build, exc, match):
    q, kc, vc, kw = build(*_fp8_ok())
    with pytest.raises(exc, match=match):
        flash_decode(q, kc, vc, **kw)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0, 1e38])  # 448 x 1e38: past fp32
def test_bad_scale_values_are_reported(bad):
    decode.check_errors()
    q, k, v, k8, v8, ks, vs = _fp8_ok()
    for name in ("k_scale", "v_scale"):
        kw = {"k_scale": ks.clone(), "v_scale": vs.clone()}
        kw[name][1] = bad
        o = flash_decode(q, k8, v8, **kw)
        assert o.shape == q.shape
        with pytest.raises(InputError, match="k_scale/v_scale: expected finite positive values"):
            decode.check_errors()
        with pytest.raises(InputError, match=f"{name}: expected finite positive values"):
            flash_decode(q, k8, v8, **kw, check_seqlens=True)
    decode.check_errors()


@pytest.mark.parametrize("nq, num_splits", [(1, 1), (1, 3), (4, 2)])
def test_a_k_scale_that_overflows_the_scores_is_reported_and_tiny_scales_stay_finite(nq, num_splits):
    # k_scale = 1e35 passes the static checks (448 x it and scale x it are finite fp32), but with queries
    # of 1e3 the scores pass fp32 and the rows are NaN: recorded on the device, never silently. With
    # ordinary queries the same scale runs (nothing recorded) and gives the float64 arg-max rows (PyTorch
    # at fp16 overflows on that K, so the bound is the output's fp16 rounding + 1e-3); tiny positive
    # scales (1e-30, 1e-40) give a finite output within tolerance of the float64 attention
    B, Hkv, L = 2, 2, 40
    q, k, v = inputs(B, 4, Hkv, nq, L, seed=17)
    k8, v8 = attnscope.quantize_kv(k)[0], attnscope.quantize_kv(v)[0]
    lens = [L, 21]
    for q_mult, scales in ((1e3, (1e35, 1.0)), (1.0, (1e35, 1.0)), (1.0, (1e-30, 1e-40)),
                           (1.0, (1e-40, 1e-30))):
        ks, vs = (torch.tensor(x, dtype=torch.float32) for x in scales)
        qq = (q.float() * q_mult).half()
        kd, vd = dequantised(k8, ks, 1), dequantised(v8, vs, 1)
        o, lse = flash_decode(*dev(qq, k8, v8), lens_t(lens), num_splits=num_splits, return_lse=True,
                              k_scale=ks.to(DEVICE), v_scale=vs.to(DEVICE))
        if q_mult > 1:
            with pytest.raises(InputError, match="k_scale/v_scale: expected finite positive values"):
                decode.check_errors()
            continue
        decode.check_errors()
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()
        if scales[0] > 1:
            ref_o = expected(qq, kd, vd, lens)[0]
            assert np.abs(o.double().cpu().numpy() - ref_o).max() <= np.abs(ref_o).max() * 2**-11 + 1e-3
        else:
            check(o, lse, qq, kd, vd, lens)


@pytest.mark.parametrize("group, paged, per_head, num_splits, scale, window, softcap, sink", [
    (16, False, True, 2, None, None, 0.0, None),  # 16 query rows: no pad rows in the keys-as-rows tile
    (8, True, False, 3, None, (9, 0), 5.0, 1.0),  # every mod, pages of 16 (two per 32-key block)
    (3, True, True, 1, None, (20, 0), 0.0, -2.0),  # three query rows of eight; one split: the sink here
    (4, False, False, 1, 1e4, None, 0.0, None),  # scale * log2 e > 1e4: the running max of raw scores
    (32, True, True, 2, None, None, 0.0, None),  # 32 rows: the 16-row tiles (interpreter) keep Q K^T
])
def test_fp8_decode_tiles_match_float64(group, paged, per_head, num_splits, scale, window, softcap, sink):
    # e4m3 decode tiles (one query, F16QK) compute S^T = K Q^T and O^T = V^T P^T on 8 or 16 query rows:
    # GQA groups that fill 16 rows, 8 and fewer, every score mod, raw-score maxima; ragged lengths incl. 0, 1
    gen = torch.Generator().manual_seed(group)
    B, Hkv, L = 3, 2, 41
    q, k, v = inputs(B, group * Hkv, Hkv, 1, L, dtype=torch.bfloat16, seed=50 + group,
                     q_mult=1e-4 if scale else 3.0)
    kc, vc, table, k_scale, v_scale, kd, vd = fp8_cache(k * 2, v, per_head, 16 if paged else 0, gen)
    sinks = None if sink is None else sink + torch.randn(group * Hkv, generator=gen)
    lens = [L, 0, 1]
    kc, vc, table, k_scale, v_scale, qd, sd = dev(kc, vc, table, k_scale, v_scale, q, sinks)
    mods = {"window": window, "softcap": softcap, "sinks": sd}
    plan = decode.decode_plan(qd, kc, vc, lens_t(lens), table, num_splits=num_splits, return_lse=True,
                              k_scale=k_scale, v_scale=v_scale, scale=scale, **mods)
    assert plan._consts["FP8_F16QK"] and plan._consts["BLOCK_M"] == 16 and not plan._consts["CHUNK"]
    assert plan._consts.get("MAX_UNSCALED", False) == (scale is not None)
    o, lse = plan.run(qd, kc, vc, lens_t(lens), table, k_scale=k_scale, v_scale=v_scale, sinks=sd)
    check(o, lse, q, kd, vd, lens, scale=scale, window=window, softcap=softcap, sinks=sinks)
    decode.check_errors()


# --- score mods: window, softcap, sinks -------------------------------------------------------------------
@pytest.mark.parametrize("paged, nq, group, num_splits, window, softcap, sink", [
    (False, 1, 2, 1, (5, 0), 0.0, None),
    (False, 1, 2, 3, (0, 0), 0.0, None),
    (True, 1, 1, 2, (17, 3), 0.0, None),  # right > 0: decode is causal (right = 0)
    (False, 1, 2, 3, None, 1.5, None),
    (True, 1, 2, 1, None, 0.0, -30.0),
    (False, 1, 4, 3, None, 0.0, 4.0),
    (False, 3, 2, 2, (1, 0), 2.0, 0.5),
    (True, 3, 2, 3, (6, 0), 0.0, 3.0),
    (False, 3, 1, 1, (100, 0), 30.0, None),  # a window longer than the cache
    (True, 1, 2, 3, (9, 0), 5.0, -1.0),
])
def test_mods_match_the_float64_reference(paged, nq, group, num_splits, window, softcap, sink):
    gen = torch.Generator().manual_seed(nq * 10 + group)
    B, Hkv, L = 4, 2, 45
    q, k, v = inputs(B, group * Hkv, Hkv, nq, L, seed=num_splits + nq, q_mult=4.0 if softcap else 1.0)
    sinks = None if sink is None else sink + torch.randn(group * Hkv, generator=gen)
    lens = [L, 1, 0, 23]
    if paged:
        kc, vc, table = to_paged(k, v, 16, gen)
    else:
        kc, vc, table = k, v, None
    kc, vc, table, qd, sd = dev(kc, vc, table, q, sinks)
    mods = {"window": window, "softcap": softcap, "sinks": sd}
    o, lse = flash_decode(qd, kc, vc, lens_t(lens), table, num_splits=num_splits, return_lse=True, **mods)
    check(o, lse, q, k, v, lens, window=window, softcap=softcap, sinks=sinks)
    if sinks is not None:
        assert torch.allclose(lse[2].cpu(), sinks[:, None].expand(-1, nq), rtol=1e-6), "no key: the sink"


@pytest.mark.parametrize("paged", (False, True))
def test_a_window_reads_only_its_blocks(paged):
    # Keys outside the blocks `model.tiles.window_kv_bounds0` loads for the row tile (the closed form the
    # kernel recomputes) are NaN, K and V: a kernel that loaded one would give NaN; the result is the
    # reference's, so the kernel's bounds are at least as tight as the model's
    gen = torch.Generator().manual_seed(2)
    B, Hkv, G, L, nq, left = 2, 2, 2, 80, 2, 9
    q, k, v = inputs(B, G * Hkv, Hkv, nq, L, seed=4)
    lens = [L, 61]
    block = heuristics._block_config(16, 16 if paged or nq > 1 else 0)["BLOCK_N"]  # whole pages of 16
    kn, vn = k.clone(), v.clone()
    for b, n in enumerate(lens):
        lo, _, _, hi = window_kv_bounds0(0, nq, nq, n, block, True, (left, 0))  # one row tile: G x Nq rows
        assert 0 < lo < hi <= n
        for t in (kn, vn):
            t[b, :, :lo], t[b, :, hi:] = float("nan"), float("nan")
    if paged:
        kc, vc, table = to_paged(kn, vn, 16, gen)
    else:
        kc, vc, table = kn, vn, None
    kc, vc, table, qd = dev(kc, vc, table, q)
    for splits in (1, 3):
        o, lse = flash_decode(qd, kc, vc, lens_t(lens), table, num_splits=splits, return_lse=True,
                              window=(left, 0))
        check(o, lse, q, k, v, lens, window=(left, 0))


def window_cache(paged, B, Hkv, L, d, gen):
    """A cache of L keys per sequence whose values are never read (plans only): dense [B, Hkv, L, d] or
    pages of 16 [B * L / 16, 16, Hkv, d] with a block table in order."""
    if not paged:
        k = torch.empty(B, Hkv, L, d, dtype=torch.float16, device=DEVICE)
        return k, k, None
    k = torch.empty(B * L // 16, 16, Hkv, d, dtype=torch.float16, device=DEVICE)
    return k, k, torch.arange(B * L // 16, dtype=torch.int32, device=DEVICE).view(B, L // 16)


@pytest.mark.parametrize("paged, nq", [(False, 1), (True, 1), (False, 3), (True, 3)])
def test_a_window_sizes_the_split_grid_by_the_keys_its_rows_see(paged, nq):
    # The rows of a call see min(L, left + Nq) keys (`model.tiles.window_kv_bounds0`): the split count is
    # the heuristic's at that length (max_seqlen, the heuristic's input), not at L, whatever the lengths
    # (cache_seqlens is never read to plan: ragged, the grid covers the longest), and the one-liner's plan
    # has it too (same bits as the plan's)
    gen = torch.Generator().manual_seed(nq)
    B, Hkv, G, d, left = 2, 2, 2, 64, 1000
    for n in (1, nq, 500, left + nq - 1, left + nq, left + nq + 1, 4 * left + 17):
        lo, _, _, hi = window_kv_bounds0(0, nq, nq, n, 1, True, (left, 0))
        assert min(n, heuristics._window_span(nq, left)) == hi - lo, n
    assert heuristics._window_span(nq, -1) is None
    q = dev(inputs(B, G * Hkv, Hkv, nq, 16, seed=nq)[0])[0]
    for L in (16384, 4096, 1024):
        kc, vc, table = window_cache(paged, B, Hkv, L, d, gen)
        lens = lens_t([L, 40])
        seen = min(L, left + nq)
        for window in ((left, 0), (left, -1), (left, 7)):  # decode is causal: the right side is 0
            plan = decode.decode_plan(q, kc, vc, lens, table, window=window)
            assert plan.num_splits == decode.decode_plan(q, kc, vc, lens, table, max_seqlen=seen).num_splits
        full = decode.decode_plan(q, kc, vc, lens, table).num_splits  # sized by L
        assert plan.num_splits == 3 and full == {16384: 33, 4096: 16, 1024: 4}[L], (L, plan.num_splits, full)
    q, k, v = inputs(B, G * Hkv, Hkv, nq, 1024, seed=nq + 1)  # at L = 1,024 with values: 3 splits
    kc, vc, table = (k, v, None) if not paged else to_paged(k, v, 16, gen)
    qd, kc, vc, table = dev(q, kc, vc, table)
    plan = decode.decode_plan(qd, kc, vc, lens_t([1024, 40]), table, window=(left, 0), return_lse=True)
    o, lse = flash_decode(qd, kc, vc, lens_t([1024, 40]), table, window=(left, 0), return_lse=True)
    assert torch.equal(o, plan.run(qd, kc, vc, lens_t([1024, 40]), table)[0])
    check(o, lse, q, k, v, [1024, 40], window=(left, 0))


@pytest.mark.parametrize("paged", (False, True))
def test_every_split_of_a_window_loads_keys(paged):
    # The kernel deals a row tile's window blocks evenly over the splits (n_blocks // S each, the first
    # n_blocks % S one more): 9 blocks over 4 splits are 3, 2, 2, 2, never 3, 3, 3, 0. Each split of the
    # longest sequence then has a key: its partial LSE is finite (the fp32 partials, kept by the separate
    # merge). Keys outside the window's blocks are NaN: none is loaded.
    gen = torch.Generator().manual_seed(6)
    B, Hkv, G, L, nq = 2, 2, 2, 400, 1
    block = heuristics._block_config(16, 16 if paged else 0)["BLOCK_N"]
    left = L - 1 - (-(-L // block) - 9) * block  # the last 9 blocks, from a block's first key
    lo, _, _, hi = window_kv_bounds0(0, nq, nq, L, block, True, (left, 0))
    assert -(-(hi - lo) // block) == 9 and lo == L - 1 - left
    q, k, v = inputs(B, G * Hkv, Hkv, nq, L, seed=6)
    lens = [L, 20]
    kn, vn = k.clone(), v.clone()
    for t in (kn, vn):
        t[0, :, :lo] = float("nan")
    kc, vc, table = (kn, vn, None) if not paged else to_paged(kn, vn, 16, gen)
    kc, vc, table, qd = dev(kc, vc, table, q)
    plan = plan_mod._tuned_plan(qd, kc, vc, lens_t(lens), table, num_splits=4, return_lse=True,
                                window=(left, 0), fuse_combine=False)
    o, lse = plan.run(qd, kc, vc, lens_t(lens), table)
    rows = G * Hkv * nq  # sequence 0's rows of the partials [B * Hq * Nq, S]
    assert torch.isfinite(plan.lse_part[:rows]).all(), plan.lse_part[:rows]
    check(o, lse, q, k, v, lens, window=(left, 0))


def test_sinks_join_once_whatever_the_split_count_and_merge():
    B, Hkv, G, L = 2, 2, 2, 64
    q, k, v = dev(*inputs(B, G * Hkv, Hkv, 1, L, seed=9))
    sinks = torch.tensor([2.0, -1.0, 5.0, 0.0], device=DEVICE)
    lens = lens_t([L, 40])
    ref = flash_decode(q, k, v, lens, num_splits=1, return_lse=True, sinks=sinks)
    for splits, fuse in ((4, True), (4, False), (7, False)):
        plan = plan_mod._tuned_plan(q, k, v, lens, num_splits=splits, return_lse=True, sinks=sinks,
                                       fuse_combine=fuse)
        o, lse = plan.run(q, k, v, lens, sinks=sinks)
        assert (o.float() - ref[0].float()).abs().max() <= 2e-3
        assert (lse - ref[1]).abs().max() <= 1e-4
    check(*ref, q, k, v, [L, 40], sinks=sinks)


def test_plan_run_checks_the_mod_tensors_layout():
    q, k, v = dev(*inputs(2, 4, 2, 1, 16))
    sinks = torch.zeros(4, device=DEVICE)
    plan = decode.decode_plan(q, k, v, sinks=sinks)
    with pytest.raises(InputError, match="sinks: expected the planned layout"):
        plan.run(q, k, v)
    with pytest.raises(InputError, match="sinks: expected the planned layout"):
        plan.run(q, k, v, sinks=torch.zeros(2, 2, device=DEVICE)[:, 0])


def test_torch_compile_fullgraph_traces_the_custom_op():
    # Inside torch.compile flash_decode is one custom op (torch.ops.attnscope.flash_decode); backend
    # "eager" checks the trace (fullgraph: no graph break) without a C++ toolchain
    q, k, v = dev(*inputs(2, 4, 2, 1, 32))
    lens = lens_t([32, 7])
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], device=DEVICE)

    def step(q, k, v, lens):
        o, lse = flash_decode(q, k, v, lens, return_lse=True, window=(9, 0), softcap=3.0, sinks=sinks)
        return o.float() * 2, lse

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    o, lse = compiled(q, k, v, lens)
    o_ref, lse_ref = step(q, k, v, lens)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    torch._dynamo.reset()



@pytest.mark.parametrize("over,msg", [({"window": (3, 0, 1)}, "window: expected None or a pair"),
                                      ({"window": (2.5, 0)}, "window: expected None or a pair"),
                                      ({"num_splits": True}, "num_splits: expected a positive integer"),
                                      ({"num_splits": 2.0}, "num_splits: expected a positive integer"),
                                      ({"scale": True}, "scale: expected a finite positive number"),
                                      ({"softcap": None}, "softcap: expected a finite real number")])
def test_torch_compile_refuses_bad_options_as_eager(over, msg):
    # the trace runs eager's checks before the custom op: the op's schema took True as 1 and a window's
    # first two entries, and refused a float window side, a float num_splits or softcap=None with an
    # unrelated TorchRuntimeError
    q, k, v = dev(*inputs(2, 4, 2, 1, 16))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: flash_decode(q, k, v, **over), backend="eager")
    with pytest.raises(InputError, match=re.escape(msg)):
        flash_decode(q, k, v, **over)
    with pytest.raises(InputError, match=re.escape(msg)):
        compiled(q, k, v)
    torch._dynamo.reset()


def test_torch_compile_call_after_a_refused_one_matches_eager():
    # a call whose checks raise makes the compiler give up on the frames it traced: later calls run them
    # eagerly inside the compiled region, and the plan's launch runs untraced; before, the compiler traced
    # each launch frame (Triton's too) on its own and the next good call died with an unrelated error
    q, k, v = dev(*inputs(2, 4, 2, 1, 16))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, s: flash_decode(q, k, v, scale=s), backend="eager")
    want = flash_decode(q, k, v, scale=0.3)
    assert torch.equal(compiled(q, k, v, 0.3), want)
    with pytest.raises(InputError, match="scale: expected a finite"):
        compiled(q, k, v, -1.0)
    assert torch.equal(compiled(q, k, v, 0.3), want)
    torch._dynamo.reset()


def test_torch_compile_refuses_grad_as_eager():
    # decode has no backward: under torch.compile the trace refuses an input that requires grad with
    # eager's NotImplementedError (not a BackendCompilerFailed: "no autograd formula was registered")
    q, k, v = dev(*inputs(2, 4, 2, 1, 16))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: flash_decode(q, k, v), backend="aot_eager")
    with pytest.raises(NotImplementedError, match="q: decode has no backward"):
        compiled(q.requires_grad_(), k, v)
    torch._dynamo.reset()


def test_torch_compile_runs_check_seqlens_eagerly_and_fullgraph_names_it():
    # check_seqlens=True is a host sync: in a compiled region the call runs eagerly outside the graph (a
    # graph break: eager's output, eager's InputError on a bad length); before, the compiler fell back into
    # the kernels' launch code and died with an unrelated error. fullgraph=True names check_seqlens
    q, k, v = dev(*inputs(2, 4, 2, 1, 32))

    def step(q, k, v, lens):
        return flash_decode(q, k, v, lens, check_seqlens=True).float() * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager")
    lens = lens_t([32, 7])
    assert torch.equal(compiled(q, k, v, lens), step(q, k, v, lens))
    with pytest.raises(InputError, match="cache_seqlens"):
        compiled(q, k, v, lens_t([33, 7]))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="check_seqlens=False inside torch.compile"):
        torch.compile(step, backend="eager", fullgraph=True)(q, k, v, lens)
    torch._dynamo.reset()


def test_torch_compile_runs_a_plan_eagerly_and_fullgraph_names_flash_decode():
    # a plan launches its kernels directly: in a compiled region DecodePlan.run runs eagerly outside the
    # graph (before, the compiler traced into the launch code and died); fullgraph=True points to flash_decode
    q, k, v = dev(*inputs(2, 4, 2, 1, 32))
    lens = lens_t([32, 7])
    plan = decode.decode_plan(q, k, v, lens, return_lse=True)

    def step(q, k, v, lens):
        o, lse = plan.run(q, k, v, lens)
        return o.float() * 2, lse

    torch._dynamo.reset()
    got, want = torch.compile(step, backend="eager")(q, k, v, lens), step(q, k, v, lens)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch._dynamo.reset()
    with pytest.raises(Exception, match="call attnscope.flash_decode"):
        torch.compile(step, backend="eager", fullgraph=True)(q, k, v, lens)
    torch._dynamo.reset()


@pytest.mark.parametrize("nq", (1, 3))
def test_torch_compile_fake_output_has_the_real_layout(nq):
    # the fake (meta) impl's o and LSE have the real op's strides for q contiguous, q a transposed
    # [B, Nq, Hq, d] buffer (flash_attn_with_kvcache's view) and q sliced; a mismatch corrupts compiled
    # graphs (inductor asserts it, or reads the output with the fake's strides)
    from torch._subclasses.fake_tensor import FakeTensorMode

    k, v = dev(*inputs(2, 4, 2, nq, 32)[1:])
    lens = lens_t([32, 7])
    for q in (torch.randn(2, 4, nq, 64), torch.randn(2, nq, 4, 64).transpose(1, 2),
              torch.randn(2, 4, nq, 128)[..., :64]):
        args = (q.to(DEVICE, torch.float16), k, v, lens, *[None] * 7, -1, -1, 0.0)
        real = torch.ops.attnscope.flash_decode(*args)
        with FakeTensorMode() as mode:
            fake = torch.ops.attnscope.flash_decode(*(mode.from_tensor(a) if isinstance(a, torch.Tensor)
                                                      else a for a in args))
        def layout(ts):
            return [(t.shape, t.stride(), t.dtype) for t in ts]
        assert layout(fake) == layout(real)


@pytest.mark.skipif(DEVICE == "cpu" and not any(map(shutil.which, ("c++", "g++", "clang++"))),
                    reason="inductor on the CPU needs a C++ compiler")
def test_torch_compile_inductor_chunked_kvcache_step_matches_eager():
    # flash_attn_with_kvcache with Nq > 1 hands the op a transposed q; inductor then checks the op's
    # output strides against the fake impl's (a mismatch raised "expected ... stride" here)
    from attnscope.flash_attn_interface import flash_attn_with_kvcache

    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 4, 64, generator=g).to(DEVICE, torch.float16)
    kc, vc = (torch.randn(2, 40, 2, 64, generator=g).to(DEVICE, torch.float16) for _ in "kv")
    lens = lens_t([20, 40])

    def step(q, kc, vc, lens):
        return flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, return_softmax_lse=True)

    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):  # its disk cache does not key on fake impls
        got = torch.compile(step, fullgraph=True)(q, kc, vc, lens)
    want = step(q, kc, vc, lens)
    assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(got, want, strict=True))
    torch._dynamo.reset()

# --- at full size on the GPU (the block configs the plan picks there) -------------------------------------
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size decode needs a GPU")


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("paged", (False, True))
@pytest.mark.parametrize("nq", (1, 4))
def test_gpu_fp8_and_mods_at_full_size(paged, nq):
    gen = torch.Generator().manual_seed(nq)
    B, Hq, Hkv, L, d = 3, 32, 8, 16384, 128
    q, k, v = inputs(B, Hq, Hkv, nq, L, d=d, dtype=torch.bfloat16, seed=nq, q_mult=3.0)
    lens = [L, 1000, nq]
    kc, vc, table, ks, vs, kd, vd = fp8_cache(k, v, True, 64 if paged else 0, gen)
    sinks = torch.randn(Hq, generator=gen) * 2
    kc, vc, table, ksd, vsd, qd, sd = dev(kc, vc, table, ks, vs, q, sinks)
    for mods in ({}, {"window": (4000, 0), "softcap": 50.0, "sinks": sd}):
        o, lse = flash_decode(qd, kc, vc, lens_t(lens), table, return_lse=True, k_scale=ksd, v_scale=vsd,
                              **mods)
        ref_mods = {**mods, "sinks": sinks} if mods else {}
        check(o, lse, q, kd, vd, lens, **ref_mods)
    decode.check_errors()


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(heuristics.FP8_CONFIGS))
@pytest.mark.parametrize("paged, nq, per_head", [(False, 1, True), (True, 1, True), (True, 4, False)])
def test_gpu_each_fp8_tile_config_matches_float64(name, paged, nq, per_head):
    # every e4m3 candidate config a benchmark can pick (heuristics.FP8_CONFIGS), compiled for the GPU:
    # dense and paged (pages of 64) with one query and per-head scales, paged with four and a per-tensor
    # scale; ragged lengths with 0 (the slots past them NaN, `to_paged`), one split and several, bf16 queries
    gen = torch.Generator().manual_seed(len(name) + nq)
    B, Hq, Hkv, L, d = 3, 32, 8, 5000, 128
    q, k, v = inputs(B, Hq, Hkv, nq, L, d=d, dtype=torch.bfloat16, seed=nq, q_mult=2.0)
    lens = [L, 0, 1777]
    kc, vc, table, ks, vs, kd, vd = fp8_cache(k * 4, v, per_head, 64 if paged else 0, gen)
    kc, vc, table, ksd, vsd, qd = dev(kc, vc, table, ks, vs, q)
    cfg = heuristics._fp8_config(name, 64 if paged else 0)
    for splits in (1, 6):
        plan = plan_mod._tuned_plan(qd, kc, vc, lens_t(lens), table, num_splits=splits, return_lse=True,
                                    k_scale=ksd, v_scale=vsd, config=cfg)
        assert plan._consts.get("FP8_F16QK", False) is cfg["F16QK"]
        o, lse = plan.run(qd, kc, vc, lens_t(lens), table, k_scale=ksd, v_scale=vsd)
        check(o, lse, q, kd, vd, lens)
    decode.check_errors()


@GPU
@pytest.mark.gpu
def test_gpu_graph_replay_reports_out_of_range_values_and_stays_in_bounds():
    B, Hq, Hkv, L = 4, 32, 8, 8192
    q, k, v = dev(*inputs(B, Hq, Hkv, 1, L, d=128, dtype=torch.bfloat16))
    k_buf, kc = carve(k, float("nan"), dim=2)
    v_buf, vc = carve(v, float("nan"), dim=2)
    lens = lens_t([L, 100, 0, 4000])
    plan = decode.decode_plan(q, kc, vc, lens)
    plan.run(q, kc, vc, lens)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan.run(q, kc, vc, lens)
    graph.replay()
    plan.check()  # in range: nothing recorded
    lens.copy_(lens_t([L + 100, -1, 2**31 - 1, 4000]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    with pytest.raises(InputError, match="cache_seqlens"):
        plan.check()


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("paged", (False, True))
@pytest.mark.parametrize("nq", (1, 4))
def test_gpu_window_decode_replays_in_a_cuda_graph(paged, nq):
    # At full size (BLOCK_N 128: a 4k window is 33 blocks, dealt over the splits the visible keys size), a
    # windowed plan captured in a CUDA graph and replayed with new lengths (never read on the host) gives
    # float64's result and the one-liner's bits
    gen = torch.Generator().manual_seed(nq + 7)
    B, Hq, Hkv, L, d, W = 3, 32, 8, 16384, 128, 4096
    q, k, v = inputs(B, Hq, Hkv, nq, L, d=d, dtype=torch.bfloat16, seed=nq)
    kc, vc, table = (k, v, None) if not paged else to_paged(k, v, 64, gen)
    kc, vc, table, qd = dev(kc, vc, table, q)
    lens = lens_t([L, 5000, nq])
    plan = decode.decode_plan(qd, kc, vc, lens, table, window=(W, 0), return_lse=True)
    plan.run(qd, kc, vc, lens, table)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = plan.run(qd, kc, vc, lens, table)
    for values in ([L, 5000, nq], [9000, L, W + 3]):
        lens.copy_(lens_t(values))
        graph.replay()
        torch.cuda.synchronize()
        check(o, lse, q, k, v, values, window=(W, 0))
        one = flash_decode(qd, kc, vc, lens, table, window=(W, 0), return_lse=True)
        assert torch.equal(one[0], o) and torch.equal(one[1], lse)
    plan.check()


# --- cache_leftpad: each sequence's keys start at its own position ---------------------------------------
def _from_starts(k, starts, lens):
    """k [B, Hkv, L, d] with sequence b's keys [starts[b], lens[b]) moved to its front (the rest 0): the
    cache a call without left padding would attend to, with lengths lens - starts."""
    out = torch.zeros_like(k)
    for b, (s, n) in enumerate(zip(starts, lens, strict=True)):
        out[b, :, :n - s] = k[b, :, s:n]
    return out


@pytest.mark.parametrize("nq, num_splits, window, fp8", [
    (1, None, None, False), (1, 3, None, False), (3, 2, None, False), (1, 2, (6, 0), False),
    (3, None, (4, 0), False), (1, 2, None, True), (3, 1, None, True),
])
def test_cache_leftpad_attends_from_each_sequences_start(nq, num_splits, window, fp8):
    """cache_leftpad: sequence b attends to its keys [starts[b], lens[b]) only (the float64 attention over
    those keys moved to the front, the window counted from the query as before); a start of 0 changes
    nothing, a start at the length leaves no key (0 and -inf); `DecodePlan.run` gives the same bits."""
    gen = torch.Generator().manual_seed(11)
    B, Hkv, L, G = 4, 2, 45, 2
    q, k, v = inputs(B, G * Hkv, Hkv, nq, L, seed=nq + 2 * fp8)
    lens, starts = [45, 30, 20, 12], [0, 7, 17, 12]
    if fp8:
        kc, vc, _, k_scale, v_scale, kd, vd = fp8_cache(k, v, True, 0, gen)
        scales = dict(k_scale=k_scale.to(DEVICE), v_scale=v_scale.to(DEVICE))
    else:
        kc, vc, kd, vd, scales = k, v, k, v, {}
    qd, kc, vc = dev(q, kc, vc)
    o, lse = flash_decode(qd, kc, vc, lens_t(lens), num_splits=num_splits, return_lse=True, window=window,
                          cache_leftpad=lens_t(starts), **scales)
    decode.check_errors()
    moved = [n - s for s, n in zip(starts, lens, strict=True)]
    check(o, lse, q, _from_starts(kd, starts, lens), _from_starts(vd, starts, lens), moved, window=window)
    plan = decode.decode_plan(qd, kc, vc, lens_t(lens), num_splits=num_splits, return_lse=True, window=window,
                              cache_leftpad=lens_t(starts), **scales)
    o2, lse2 = plan.run(qd, kc, vc, lens_t(lens), cache_leftpad=lens_t(starts), **scales)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    plain = flash_decode(qd, kc, vc, lens_t(lens), num_splits=num_splits, window=window, **scales)
    assert torch.equal(o[0], plain[0])  # start 0: the call without left padding


def test_cache_leftpad_out_of_range_is_clamped_and_reported_and_refused_forms():
    """A start outside [0, length] is clamped (a negative one to 0, one past the length to it: no key) and
    recorded for check_errors; a paged cache, another dtype or shape are refused in one line."""
    q, k, v = dev(*inputs(2, 2, 2, 1, 24))
    lens = lens_t([24, 10])
    o, lse = flash_decode(q, k, v, lens, return_lse=True, cache_leftpad=lens_t([-3, 11]))
    with pytest.raises(InputError, match="cache_leftpad: expected values in"):
        decode.check_errors()
    assert torch.equal(o[0], flash_decode(q, k, v, lens)[0]) and not o[1].any()
    assert torch.isneginf(lse[1]).all()
    # the opt-in host check refuses them before the launch
    for pad, got in (([-3, 0], "got -3 at [0]"), ([0, 11], "got 11 at [1] (length 10)")):
        want = re.escape(f"cache_leftpad: expected values in [0, the sequence's length], {got}")
        with pytest.raises(InputError, match=want):
            flash_decode(q, k, v, lens, cache_leftpad=lens_t(pad), check_seqlens=True)
    edge = flash_decode(q, k, v, lens, cache_leftpad=lens_t([0, 10]), check_seqlens=True)
    assert torch.equal(edge[0], o[0])
    with pytest.raises(InputError, match="cache_leftpad: expected dtype torch.int32"):
        flash_decode(q, k, v, lens, cache_leftpad=lens.long())
    with pytest.raises(InputError, match="cache_leftpad: expected a contiguous shape"):
        flash_decode(q, k, v, lens, cache_leftpad=lens_t([0]))
    kp = k.permute(0, 2, 1, 3).reshape(-1, 16, 2, 64)  # 3 pages of 16 keys
    table = torch.arange(3, dtype=torch.int32, device=DEVICE).view(1, 3).expand(2, 3).contiguous()
    with pytest.raises(NotImplementedError, match="cache_leftpad: supported with a dense cache"):
        flash_decode(q, kp, kp, lens, table, cache_leftpad=lens_t([0, 0]))
