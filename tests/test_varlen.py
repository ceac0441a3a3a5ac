"""Packed variable-length FA-2 forward against a per-sequence float64 reference (CPU: TRITON_INTERPRET=1).

Bound (STYLE.md): per sequence, the kernel's max error against float64 (`reference.naive_attention`,
bottom-right causal) is at most twice PyTorch's own error (SDPA math at the input dtype, per sequence,
against the same reference) plus 1e-3.
"""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope import reference  # noqa: E402
from attnscope.checks import kernel_tolerance  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import _tl, bwd  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

varlen = pytest.importorskip("attnscope.kernels.varlen")
import attnscope  # noqa: E402
from attnscope.kernels import varlen_plan  # noqa: E402
from attnscope.kernels._common import device_error_flag  # noqa: E402

DEVICE = kernel_device()


def _cu(lengths):
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32, device=DEVICE)


def _packed(total, h, d, dtype, strided, g):
    if strided:  # a [h, total, d] buffer seen as [total, h, d]: non-contiguous, unit last stride
        return torch.randn(h, total, d, generator=g).to(dtype).to(DEVICE).transpose(0, 1)
    return torch.randn(total, h, d, generator=g).to(dtype).to(DEVICE)


def _torch_attention(q, k, v, causal):
    """SDPA (math) at the input dtype for one sequence: q [Hq, Nq, d], k, v [Hkv, Nk, d]."""
    g = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    nq, nk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        mask = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
    return torch.nn.functional.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), attn_mask=mask)


def _poison(monkeypatch):
    """The launcher's torch.empty returns NaN-filled tensors, so an unwritten element shows."""
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

    monkeypatch.setattr(varlen, "torch", _Torch())


# Length mixes: 0-length sequences (no queries; queries but no keys; neither), lengths that are not
# multiples of the interpreter's tiles (32 x 16), Nq != Nk per sequence both ways, a single sequence.
MIXES = [
    ([5, 0, 40, 17], [5, 3, 70, 0]),
    ([1, 33, 64, 0], [1, 33, 64, 0]),
    ([70], [23]),
    ([0, 9, 0], [4, 100, 0]),
    ([31, 2, 50, 17, 8], [31, 47, 50, 1, 8]),
]
CASES = []
for i, (lq, lk) in enumerate(MIXES):
    for causal in (False, True):
        j = 2 * i + causal
        CASES.append((lq, lk, causal, (1, 4)[j % 2], (64, 128)[(j // 2) % 2],
                      ("float16", "bfloat16")[(j // 3) % 2], j % 3 == 0))


@pytest.mark.parametrize("lq,lk,causal,group,d,dtype,strided", CASES)
def test_matches_per_sequence_float64_reference(monkeypatch, lq, lk, causal, group, d, dtype, strided):
    dt = getattr(torch, dtype)
    hkv = 2 if group == 1 else 1
    hq = hkv * group
    g = torch.Generator().manual_seed(sum(lq) * 7 + sum(lk) + causal)
    q = _packed(sum(lq), hq, d, dt, strided, g)
    k = _packed(sum(lk), hkv, d, dt, strided, g)
    v = _packed(sum(lk), hkv, d, dt, not strided, g)
    cq, ck = _cu(lq), _cu(lk)
    _poison(monkeypatch)
    o, lse = attnscope.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                                              return_lse=True)
    monkeypatch.undo()
    assert o.shape == q.shape and o.dtype == dt and lse.shape == (hq, sum(lq)) and lse.dtype == torch.float32
    assert not torch.isnan(o).any(), "NaN in the output: an element was not written (or a 0/0)"
    assert not torch.isnan(lse).any()
    for s, (nq, nk) in enumerate(zip(lq, lk, strict=True)):
        if nq == 0:
            continue
        a, c = int(cq[s]), int(ck[s])
        qs, os_, ls = q[a:a + nq].transpose(0, 1), o[a:a + nq].transpose(0, 1), lse[:, a:a + nq]
        if nk == 0:  # queries but no keys: 0 output, LSE -inf
            assert (os_ == 0).all() and (ls == -torch.inf).all(), s
            continue
        ks, vs = k[c:c + nk].transpose(0, 1), v[c:c + nk].transpose(0, 1)
        ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (qs, ks, vs)),
                                             causal=causal, return_lse=True)
        has_key = np.isfinite(rlse)
        err = np.abs(os_.double().cpu().numpy() - ro)[has_key].max(initial=0.0)
        t_out = _torch_attention(qs, ks, vs, causal).double().numpy()
        torch_err = np.abs(t_out - ro)[has_key].max(initial=0.0)
        assert err <= kernel_tolerance(torch_err), f"seq {s}: error {err:.3g}, torch's {torch_err:.3g}"
        lse_np = ls.cpu().numpy()
        with np.errstate(invalid="ignore"):  # -inf - -inf on rows with no key, excluded by has_key
            assert np.abs(lse_np - rlse)[has_key].max(initial=0.0) < 1e-3, s
        assert (os_.double().cpu().numpy()[~has_key] == 0).all() and (lse_np[~has_key] == -np.inf).all()


def test_packed_equals_dense_calls_and_scale():
    """A packed call gives the same bits as running each sequence alone (packing is invisible), and the
    scale argument reaches the kernel."""
    g = torch.Generator().manual_seed(3)
    lq, lk = [19, 40], [19, 40]
    q, k, v = (_packed(sum(lq), 2, 64, torch.float16, False, g) for _ in range(3))
    o = attnscope.flash_attention_varlen(q, k, v, _cu(lq), _cu(lk), 40, 40, causal=True, scale=0.3)
    for a, n in ((0, 19), (19, 40)):
        alone = attnscope.flash_attention_varlen(q[a:a + n], k[a:a + n], v[a:a + n], _cu([n]), _cu([n]), n, n,
                                                 causal=True, scale=0.3)
        assert torch.equal(o[a:a + n], alone)
    ro = reference.naive_attention(*(t[:19].transpose(0, 1).double().cpu().numpy() for t in (q, k, v)),
                                   causal=True, scale=0.3)
    assert np.abs(o[:19].transpose(0, 1).double().cpu().numpy() - ro).max() < 2e-3


@pytest.mark.parametrize("scale", [2.0, 1e37, 2.3e38])
@pytest.mark.parametrize("causal", [False, True])
def test_huge_scale_is_finite_and_matches_float64(scale, causal):
    """A huge finite scale turns softmax into a row arg-max (as the dense forward): finite output, no
    inf - inf = NaN (scale 1e37 gave NaN rows before the running max kept raw scores)."""
    g = torch.Generator().manual_seed(8)
    lq, lk = [23, 9], [37, 40]
    q = _packed(sum(lq), 2, 64, torch.float16, False, g)
    k, v = (_packed(sum(lk), 1, 64, torch.float16, False, g) for _ in range(2))
    o, lse = attnscope.flash_attention_varlen(q, k, v, _cu(lq), _cu(lk), 23, 40, causal=causal, scale=scale,
                                              return_lse=True)
    assert torch.isfinite(o).all()
    for a, c, nq, nk in ((0, 0, 23, 37), (23, 37, 9, 40)):
        qs, ks, vs = (t[r:r + n].transpose(0, 1) for t, r, n in ((q, a, nq), (k, c, nk), (v, c, nk)))
        ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (qs, ks, vs)),
                                             causal=causal, scale=scale, return_lse=True)
        assert np.abs(o[a:a + nq].transpose(0, 1).double().cpu().numpy() - ro).max() < 1e-3
        lse_np = lse[:, a:a + nq].cpu().numpy()
        fits = np.abs(rlse) < 1e38  # representable in fp32: relative error small; beyond: +inf
        assert np.all(np.abs(lse_np[fits] - rlse[fits]) <= 1e-5 * np.abs(rlse[fits]) + 1e-4)
        big, rbig = lse_np[~fits], rlse[~fits]
        assert np.all(np.isposinf(big) | (np.abs(big - rbig) <= 1e-5 * rbig))


def test_check_seqlens_host_check_is_opt_in_and_changes_nothing_else():
    g = torch.Generator().manual_seed(4)
    q, k, v = (_packed(12, 1, 64, torch.float16, False, g) for _ in range(3))
    cu = _cu([5, 7])
    a = attnscope.flash_attention_varlen(q, k, v, cu, cu, 7, 7, check_seqlens=True)
    assert torch.equal(a, attnscope.flash_attention_varlen(q, k, v, cu, cu, 7, 7))
    with pytest.raises(ValueError, match="cu_seqlens_q: expected dtype torch.int32"):
        attnscope.flash_attention_varlen(q, k, v, cu.long(), cu, 7, 7)
    bad = _i(0, 13, 12)
    attnscope.flash_attention_varlen(q, k, v, bad, cu, 13, 7)  # default: no host check, reported later
    with pytest.raises(ValueError, match="cu_seqlens_q: expected int32 values from 0 to total_q"):
        varlen.check_errors()


def test_all_sequences_empty_gives_empty_output():
    q = torch.zeros(0, 2, 64, dtype=torch.float16, device=DEVICE)
    k = v = torch.randn(3, 2, 64).half().to(DEVICE)
    o, lse = attnscope.flash_attention_varlen(q, k, v, _cu([0, 0]), _cu([3, 0]), 0, 3, return_lse=True)
    assert o.shape == (0, 2, 64) and lse.shape == (2, 0)


def test_no_keys_at_all_gives_zeros_and_minus_inf():
    g = torch.Generator().manual_seed(8)
    q = _packed(8, 2, 64, torch.float16, False, g)
    k = v = torch.zeros(0, 1, 64, dtype=torch.float16, device=DEVICE)
    o, lse = attnscope.flash_attention_varlen(q, k, v, _cu([3, 5]), _cu([0, 0]), 5, 0, causal=True,
                                              return_lse=True)
    assert (o == 0).all() and (lse == -torch.inf).all()


def _expected_items(lq, lk, block, causal, kv_tiles):
    """The documented order of `varlen_plan._work_items`, in Python: sequences by their heaviest tile's
    weight (Nk_s for query tiles, Nq_s for K/V tiles) descending, ties by index; tiles heaviest first."""
    own, weight = (lk, lq) if kv_tiles else (lq, lk)
    order = sorted(range(len(lq)), key=lambda s: (-weight[s], s))
    items = []
    for s in order:
        n = -(-own[s] // block)
        ts = range(n - 1, -1, -1) if causal and not kv_tiles else range(n)
        items += [(s, t) for t in ts]
    return items


@pytest.mark.parametrize("kv_tiles", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_work_items_sequence_major_heaviest_first(causal, kv_tiles):
    lq, lk = [100, 0, 7, 64, 33, 64], [100, 5, 200, 10, 33, 10]
    n_items = 20
    expected = _expected_items(lq, lk, 32, causal, kv_tiles)
    seq, tile = varlen._work_items(_cu(lq), _cu(lk), n_items, 32, causal, kv_tiles)
    got = list(zip(seq.tolist(), tile.tolist(), strict=True))
    assert got[:len(expected)] == expected
    assert got[len(expected):] == [(-1, 0)] * (n_items - len(expected))  # idle items last


@pytest.mark.parametrize("seed", range(4))
def test_plan_kernel_equals_the_torch_forms(seed):
    """`varlen_plan.plan` (one Triton program) gives the torch forms' sanitised cu_seqlens, error bits and
    work lists, on good and bad values (out of range, decreasing, too small max_seqlen)."""
    rng = random.Random(seed)
    B = rng.randint(1, 9)
    lq = [rng.choice([0, 1, 5, 33, 64, 100]) for _ in range(B)]
    lk = [rng.choice([0, 1, 7, 40, 200]) for _ in range(B)]
    cq, ck = _cu(lq), _cu(lk)
    if seed % 2:
        cq[rng.randint(0, B)] += rng.choice([-50, -3, 9, 1000])
        ck[rng.randint(0, B)] = -7
    max_q = max(lq) - (seed == 3)
    dims = (sum(lq), 4, 64, sum(lk), 2)
    flag = device_error_flag(torch, DEVICE, "varlen")
    lists = [(-(-sum(lq) // 32) + B, 32, True, False), (-(-sum(lk) // 16) + B, 16, True, True),
             (-(-sum(lq) // 32) + B, 32, False, False)]
    flag.zero_()
    cu_q, cu_k, items = varlen_plan.plan(cq, ck, dims, max_q, max(lk), lists)
    bits = flag.item()
    flag.zero_()
    ref_q = varlen_plan._sanitize(cq, dims[0], max_q, flag, 1, 4)
    ref_k = varlen_plan._sanitize(ck, dims[3], max(lk), flag, 2, 8)
    assert bits == flag.item() and (bits != 0) == (seed % 2 == 1 or seed == 3)
    flag.zero_()
    assert cu_q.tolist() == ref_q.tolist() and cu_k.tolist() == ref_k.tolist()
    for (n, block, causal, kv_tiles), (seq, tile) in zip(lists, items, strict=True):
        rs, rt = varlen_plan._work_items(ref_q, ref_k, n, block, causal, kv_tiles)
        assert seq.tolist() == rs.tolist() and tile.tolist() == rt.tolist()


def test_many_sequences_take_the_torch_forms_with_the_same_result(monkeypatch):
    """Above `varlen_plan.PLAN_MAX_B` sequences the torch forms build the list: same output, same errors."""
    lq = [5, 0, 40, 17]
    g = torch.Generator().manual_seed(14)
    q = _packed(sum(lq), 2, 64, torch.float16, False, g)
    k, v = (_packed(sum(lq), 1, 64, torch.float16, False, g) for _ in range(2))
    bad = _cu(lq)
    bad[2] = 99  # out of range: clamped, reported
    outs = []
    for limit in (varlen_plan.PLAN_MAX_B, 2):
        monkeypatch.setattr(varlen_plan, "PLAN_MAX_B", limit)
        outs.append(attnscope.flash_attention_varlen(q, k, v, _cu(lq), _cu(lq), 40, 40, causal=True))
        attnscope.flash_attention_varlen(q, k, v, bad, _cu(lq), 40, 40, causal=True)
        with pytest.raises(ValueError, match="cu_seqlens_q: expected int32 values from 0 to total_q"):
            varlen.check_errors()
        short = _cu(lq)
        short[-1] -= 1  # the packed rows not all covered (flash-attn leaves such rows unwritten): reported
        attnscope.flash_attention_varlen(q, k, v, short, _cu(lq), 40, 40, causal=True)
        with pytest.raises(ValueError, match=r"cu_seqlens_q: .*the last total_q \(q.shape\[0\]\)"):
            varlen.check_errors()
    assert torch.equal(outs[0], outs[1])


# ---- errors: each documented error, with its message --------------------------------------------
def _good(**over):
    g = torch.Generator().manual_seed(5)
    args = {"q": _packed(12, 4, 64, torch.float16, False, g),
            "k": _packed(10, 2, 64, torch.float16, False, g),
            "v": _packed(10, 2, 64, torch.float16, False, g), "cu_seqlens_q": _cu([5, 7]),
            "cu_seqlens_k": _cu([4, 6]), "max_seqlen_q": 7, "max_seqlen_k": 6}
    args.update(over)
    return args


def _z(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


def _i(*vals):
    return torch.tensor(vals, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("over,exc,msg", [
    ({"q": _z(1, 12, 4, 64)}, ValueError, "q: expected a 3-d tensor [total_q, Hq, d]"),
    ({"k": "x"}, ValueError, "k: expected a torch.Tensor"),
    ({"q": _z(12, 4, 64, dtype=torch.float32)}, NotImplementedError,
     "supported: torch.float16, torch.bfloat16"),
    ({"q": _z(12, 4, 128)}, ValueError, "k: expected head_dim 128, got 64"),
    ({"q": _z(12, 4, 100), "k": _z(10, 2, 100), "v": _z(10, 2, 100)}, NotImplementedError,
     "head_dim 100 is not supported"),
    ({"k": _z(10, 2, 64, dtype=torch.bfloat16)}, ValueError, "k: expected dtype (as q)"),
    ({"v": _z(11, 2, 64)}, ValueError, "v: expected shape (as k)"),
    ({"k": _z(10, 3, 64), "v": _z(10, 3, 64)}, ValueError,
     "query heads (4) to be a positive multiple of the kv"),
    ({"q": _z(12, 4, 128)[..., ::2]}, ValueError, "q: expected unit stride in the last"),
    ({"cu_seqlens_q": [0, 5, 12]}, ValueError, "cu_seqlens_q: expected an int32 torch.Tensor"),
    ({"cu_seqlens_k": _cu([4, 6]).long()}, ValueError, "cu_seqlens_k: expected dtype torch.int32"),
    ({"cu_seqlens_q": _i(0)}, ValueError, "cu_seqlens_q: expected a 1-d tensor [B + 1] with B >= 1"),
    ({"cu_seqlens_q": _i(0, 5, 12).view(1, 3)}, ValueError, "cu_seqlens_q: expected a 1-d tensor"),
    ({"cu_seqlens_k": _i(0, 4, 8, 10)}, ValueError,
     "cu_seqlens_k: expected length (B + 1, as cu_seqlens_q) 3"),
    ({"cu_seqlens_q": _i(1, 5, 12)}, ValueError, "cu_seqlens_q: expected cu_seqlens[0] == 0, got 1"),
    ({"cu_seqlens_k": _i(0, 6, 4)}, ValueError, "cu_seqlens_k: expected non-decreasing values, got 6 then 4"),
    ({"cu_seqlens_q": _i(0, 5, 11)}, ValueError, "cu_seqlens_q: expected the last value to equal the packed "
                                                 "length 12, got 11"),
    ({"max_seqlen_q": 6}, ValueError, "max_seqlen_q: expected >= the longest sequence (7), got 6"),
    ({"max_seqlen_k": 5}, ValueError, "max_seqlen_k: expected >= the longest sequence (6), got 5"),
    ({"max_seqlen_q": -1}, ValueError, "max_seqlen_q: expected a non-negative int, got -1"),
    ({"max_seqlen_k": True}, ValueError, "max_seqlen_k: expected a non-negative int, got True"),
    ({"scale": -1.0}, ValueError, "scale: expected a finite positive number up to 2.36e+38, or None, got -1"),
    ({"scale": float("nan")}, ValueError, "scale: expected a finite positive number up to 2.36e+38, or None"),
])
def test_documented_errors(over, exc, msg):
    with pytest.raises(exc) as e:  # the value errors of cu_seqlens / max_seqlen: the opt-in host check
        attnscope.flash_attention_varlen(**_good(**over), check_seqlens=True)
    assert msg in str(e.value)


@pytest.mark.parametrize("over,msg", [
    ({"causal": "no"}, "causal: expected True or False, got 'no'"),  # was read as True
    ({"return_lse": "False"}, "return_lse: expected True or False, got 'False'"),  # was a tuple
    ({"check_seqlens": None}, "check_seqlens: expected True or False, got None"),
    ({"scale": 10**400}, "scale: expected a finite positive number up to 2.36e+38"),  # was OverflowError
    ({"scale": 1e39}, "scale: expected a finite positive number up to 2.36e+38"),  # was NaN output
    # the kernel reads cu[s] at offset s: a strided view read other memory (a crash under the interpreter)
    ({"cu_seqlens_q": _i(0, 99, 5, 99, 12)[::2]}, "cu_seqlens_q: expected a contiguous tensor, got stride 2"),
    ({"cu_seqlens_k": _i(0, 99, 4, 99, 10)[::2], "check_seqlens": False},
     "cu_seqlens_k: expected a contiguous tensor, got stride 2"),
])
def test_flags_scale_and_strided_cu_seqlens_are_refused(over, msg):
    with pytest.raises(InputError) as e:
        attnscope.flash_attention_varlen(**_good(**over))
    assert msg in str(e.value)


def test_device_mismatch_error():
    if DEVICE == "cpu":
        pytest.skip("needs a CUDA device to mix devices")
    with pytest.raises(ValueError, match="cu_seqlens_q: expected device"):
        attnscope.flash_attention_varlen(**_good(cu_seqlens_q=_cu([5, 7]).cpu()))


def test_cpu_tensors_without_interpreter_error():
    import subprocess
    import sys
    code = ("import torch, attnscope\n"
            "q = torch.zeros(4, 1, 64, dtype=torch.float16); cu = torch.tensor([0, 4], dtype=torch.int32)\n"
            "try:\n    attnscope.flash_attention_varlen(q, q, q, cu, cu, 4, 4)\n"
            "except ValueError as e:\n    print(e)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "q: expected CUDA tensors" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("d, causal, window, tma", [(128, False, None, False), (128, True, None, True),
                                                     (128, False, (8, 8), True), (64, False, None, True),
                                                     (256, False, None, False), (256, True, None, True)])
def test_default_load_path_avoids_the_tma_build_ptxas_crashes_on(monkeypatch, d, causal, window, tma):
    """The default K/V loads: TMA, except d >= 128 without a mask, whose TMA build ptxas (sm_90a) crashes on:
    there the pointer loads (`varlen._tma_builds`)."""
    seen = []

    class Grid:
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(kw["USE_TMA"])

    monkeypatch.setattr(varlen, "_attnscope_varlen_kernel", Grid())
    lq = [5, 9]
    g = torch.Generator().manual_seed(3)
    q = _packed(sum(lq), 2, d, torch.float16, False, g)
    k, v = (_packed(sum(lq), 2, d, torch.float16, False, g) for _ in range(2))
    varlen._launch(q, k, v, _cu(lq), _cu(lq), 9, 9, causal, None, True, True, window=window)
    assert seen == [tma]


@pytest.mark.parametrize("causal", [False, True])
def test_tma_and_pointer_paths_agree(causal):
    """Whole K/V tiles by TMA (aligned K/V, the default) or by pointer loads (forced, or a K/V whose base
    is not 16-byte aligned) give the same bits."""
    lq, lk = [37, 0, 70], [50, 9, 70]
    g = torch.Generator().manual_seed(6)
    q = _packed(sum(lq), 2, 64, torch.float16, False, g)
    k, v = (_packed(sum(lk), 2, 64, torch.float16, False, g) for _ in range(2))
    args = (q, k, v, _cu(lq), _cu(lk), 70, 70, causal, None, True, True)
    o_tma, lse_tma = varlen._launch(*args, tma=True)
    o_ptr, lse_ptr = varlen._launch(*args, tma=False)
    assert torch.equal(o_tma, o_ptr) and torch.equal(lse_tma, lse_ptr)
    # an odd base address (2 bytes past a 16-byte boundary): the launcher must take the pointer path
    buf = torch.empty(k.numel() + 1, dtype=k.dtype, device=DEVICE)
    k_odd = buf[1:].view(k.shape)
    k_odd.copy_(k)
    assert not varlen._tma_ok(k_odd, v) and varlen._tma_ok(k, v)
    o_odd = attnscope.flash_attention_varlen(q, k_odd, v, _cu(lq), _cu(lk), 70, 70, causal=causal)
    assert torch.equal(o_odd, o_tma)


@pytest.mark.parametrize("tma", [True, False])
def test_no_leak_from_neighbouring_sequences(tma):
    """Rows a ragged tile reads past its sequence's end (TMA) must not reach the result, not even inf/NaN:
    poisoning one sequence's K/V leaves the others' outputs bit-identical."""
    lq = [20, 13, 30]  # ragged for the interpreter's 16-key tiles
    g = torch.Generator().manual_seed(7)
    q, k, v = (_packed(63, 2, 64, torch.float16, False, g) for _ in range(3))
    cu = _cu(lq)
    args = (cu, cu, 30, 30, True, None, False, True)
    clean, _ = varlen._launch(q, k, v, *args, tma=tma)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[20:33] = float("nan")  # sequence 1 (rows 20..32), right after sequence 0's ragged last tile
    k2[20:33] = float("nan")
    v2[20:33] = float("inf")
    dirty, _ = varlen._launch(q2, k2, v2, *args, tma=tma)
    assert torch.equal(dirty[:20], clean[:20]) and torch.equal(dirty[33:], clean[33:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_real_tiles_length_mix(d, causal):
    """The GPU configs (128-row query tiles, TMA): a mix of 0..1500-token sequences with Nq != Nk, GQA 4,
    bf16, per sequence against float64 (2 x SDPA's own error + 1e-3)."""
    rng = np.random.default_rng(d + causal)
    lq = [int(x) for x in rng.integers(0, 1500, 10)] + [0, 1, 129]
    lk = [max(0, n + int(rng.integers(-200, 300))) for n in lq]
    g = torch.Generator().manual_seed(11)
    q = _packed(sum(lq), 8, d, torch.bfloat16, False, g)
    k, v = (_packed(sum(lk), 2, d, torch.bfloat16, False, g) for _ in range(2))
    cq, ck = _cu(lq), _cu(lk)
    o, lse = attnscope.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                                              return_lse=True)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    for s, (nq, nk) in enumerate(zip(lq, lk, strict=True)):
        if nq == 0 or nk == 0:
            continue
        a, c = int(cq[s]), int(ck[s])
        qs, ks, vs = q[a:a + nq].transpose(0, 1), k[c:c + nk].transpose(0, 1), v[c:c + nk].transpose(0, 1)
        ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (qs, ks, vs)),
                                             causal=causal, return_lse=True)
        has_key = np.isfinite(rlse)
        err = np.abs(o[a:a + nq].transpose(0, 1).double().cpu().numpy() - ro)[has_key].max(initial=0.0)
        t_out = _torch_attention(qs, ks, vs, causal).double().numpy()
        torch_err = np.abs(t_out - ro)[has_key].max(initial=0.0)
        assert err <= kernel_tolerance(torch_err), f"seq {s} ({nq}, {nk}): {err:.3g}, torch's {torch_err:.3g}"


# ---- backward, score mods, device-side validation ------------------------------------------------
def _torch_seq(qs, ks, vs, do, causal, window, softcap, sinks, scale):
    """PyTorch's own forward + gradients for one sequence at the input dtype (q [Hq, Nq, d], k, v
    [Hkv, Nk, d]): scores, softcap and P V in that dtype, softmax in fp32 with the sink as one more
    column; rows with no visible key and no sink give 0. Returns (o, dq, dk, dv, dsinks or None)."""
    q, k, v = (t.detach().cpu().clone().requires_grad_() for t in (qs, ks, vs))
    sk = None if sinks is None else sinks.detach().cpu().clone().requires_grad_()
    g = q.shape[0] // k.shape[0]
    kk, vv = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    s = (q @ kk.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    mask = torch.from_numpy(reference.permitted(q.shape[1], k.shape[1], causal, window))
    s = s.float().masked_fill(~mask, float("-inf"))
    if sk is not None:
        s = torch.cat([s, sk[:, None, None].expand(-1, s.shape[1], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sk is not None:
        p = p[..., :-1]
    o = p.to(q.dtype) @ vv
    o.backward(do.cpu())
    return o.detach(), q.grad, k.grad, v.grad, None if sk is None else sk.grad


def _err(a, r, rows=None):
    a = a.detach().double().cpu().numpy() if hasattr(a, "double") else a
    d = np.abs(a - r)
    return (d[..., rows, :] if rows is not None else d).max(initial=0.0)


def _check_varlen_grads(q, k, v, do, lq, lk, causal, window=None, softcap=0.0, sinks=None, scale=None,
                        deterministic=False, got=None):
    """Forward + backward through autograd against float64 per sequence (`reference.naive_attention`,
    `reference.attention_backward`): the output within `checks.kernel_tolerance` (2 x torch's error),
    dQ, dK, dV and dsinks within factor 3; empty sequences zero gradient."""
    from attnscope import checks

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.detach().clone().requires_grad_()
    cq, ck = _cu(lq), _cu(lk)
    o, lse = attnscope.flash_attention_varlen(*leaves, cq, ck, max(lq), max(lk), causal=causal, scale=scale,
                                              return_lse=True, window=window, softcap=softcap,
                                              sinks=sink_leaf, deterministic=deterministic)
    grads = torch.autograd.grad(o, leaves + ([sink_leaf] if sinks is not None else []), do)
    dq, dk, dv = grads[:3]
    o, lse = o.detach(), lse.detach()
    assert all(torch.isfinite(t).all() for t in (o, *grads)), "NaN/inf in the output or a gradient"
    sm = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    dsinks_ref, dsinks_torch = 0.0, 0.0
    for s, (nq, nk) in enumerate(zip(lq, lk, strict=True)):
        a, c = int(cq[s]), int(ck[s])
        if nq == 0 or nk == 0:  # an empty side: the other side's gradient is exactly 0 (or the sink's)
            assert (dk[c:c + nk] == 0).all() and (dv[c:c + nk] == 0).all(), s
            if sinks is None:
                assert (dq[a:a + nq] == 0).all() and (o[a:a + nq] == 0).all(), s
            continue
        qs, ks, vs, dos = (t[r:r + n].transpose(0, 1) for t, r, n in ((q, a, nq), (k, c, nk), (v, c, nk),
                                                                      (do, a, nq)))
        f64 = [t.double().cpu().numpy() for t in (qs, ks, vs, dos)]
        sk64 = None if sinks is None else sinks.double().cpu().numpy()
        mods = dict(window=window, softcap=softcap, sinks=sk64)
        ro, rlse = reference.naive_attention(*f64[:3], causal=causal, scale=scale, return_lse=True, **mods)
        ref = reference.attention_backward(f64[3], *f64[:3], ro, rlse, causal=causal, scale=scale, **mods)
        t_o, *t_g = _torch_seq(qs, ks, vs, dos, causal, window, softcap, sinks, sm)
        os_ = o[a:a + nq].transpose(0, 1)
        assert _err(os_, ro) <= checks.kernel_tolerance(_err(t_o, ro)), f"seq {s}: output"
        ls = lse[:, a:a + nq].double().cpu().numpy()
        fin = np.isfinite(rlse)
        assert (np.isneginf(ls) == ~fin).all() and np.abs(ls - rlse)[fin].max(initial=0.0) < 1e-3, s
        got_g = (dq[a:a + nq].transpose(0, 1), dk[c:c + nk].transpose(0, 1), dv[c:c + nk].transpose(0, 1))
        for name, gk, gt, gr in zip("qkv", got_g, t_g[:3], ref[:3], strict=True):
            tol = checks.kernel_tolerance(_err(gt, gr), factor=3)
            assert _err(gk, gr) <= tol, f"seq {s}: d{name} error {_err(gk, gr):.3g} > {tol:.3g}"
        if sinks is not None:
            dsinks_ref = dsinks_ref + ref[3]
            dsinks_torch = dsinks_torch + t_g[3].double().numpy()
    if sinks is not None:
        # Looser at bf16 (factor 5): dsinks sums P_sink * D over every row, with D = rowsum(dO * O) from
        # the bf16 O (flash-attn's learnable-sink backward does the same), while PyTorch's autograd takes
        # D through its fp32 softmax; dQ/dK/dV use the same D and keep factor 3.
        factor = 5 if q.dtype == torch.bfloat16 else 3
        err_s = np.abs(grads[3].double().cpu().numpy() - dsinks_ref).max()
        assert err_s <= checks.kernel_tolerance(np.abs(dsinks_torch - dsinks_ref).max(), factor), err_s
    return o, lse, grads


# Empty sequences (no queries / no keys / neither), length 1, ragged against the interpreter's tiles
# (fwd 32 x 16, dK/dV 16 x 32, dQ 32 x 16), causal with Nq_s > Nk_s and Nq_s < Nk_s, GQA, both dtypes,
# deterministic both ways, a strided layout; mods: windows (W not a tile multiple, larger than N, rows
# with no key in their window), softcap with large logits, sinks very negative and very positive.
GRAD_CASES = [
    # lq, lk, causal, group, dtype, deterministic, strided, window, softcap, sinks
    ([5, 0, 33, 17], [5, 3, 40, 0], True, 2, "float16", False, False, None, 0.0, None),
    ([33, 1, 20, 0], [9, 1, 50, 0], True, 1, "bfloat16", True, True, None, 0.0, None),
    ([17, 0, 30], [25, 6, 30], False, 2, "float16", True, False, (8, 4), 5.0, (-30.0, 2.0, 0.5, 40.0)),
    ([40, 3], [21, 70], True, 2, "bfloat16", False, False, (10, -1), 0.0, (1.0, -2.0, 0.0, 3.0)),
    ([26, 9], [26, 40], False, 1, "float16", False, True, (0, 0), 2.0, None),
    ([30], [12], False, 2, "float16", True, False, (-1, 3), 0.0, None),  # first 15 rows see no key
]


@pytest.mark.parametrize("lq,lk,causal,group,dtype,deterministic,strided,window,softcap,sinks", GRAD_CASES)
def test_backward_matches_per_sequence_float64(monkeypatch, lq, lk, causal, group, dtype, deterministic,
                                               strided, window, softcap, sinks):
    """deterministic=False cases run the atomic-dQ kernel (`bwd.ATOMIC_DQ_BY_DEFAULT` set True), the
    others the separate dQ pass (what autograd runs by default while that switch is False)."""
    monkeypatch.setattr(bwd, "ATOMIC_DQ_BY_DEFAULT", not deterministic)
    dt = getattr(torch, dtype)
    hkv = 2 if group == 1 else 1
    hq = hkv * group
    g = torch.Generator().manual_seed(sum(lq) * 3 + sum(lk))
    q = _packed(sum(lq), hq, 64, dt, strided, g)
    k = _packed(sum(lk), hkv, 64, dt, strided, g)
    v = _packed(sum(lk), hkv, 64, dt, False, g)
    if softcap:
        q = q * 4  # large logits: the cap matters
    do = _packed(sum(lq), hq, 64, dt, False, g)
    sk = None if sinks is None else torch.tensor(sinks[:hq], dtype=torch.float32, device=DEVICE)
    _check_varlen_grads(q, k, v, do, lq, lk, causal, window, softcap, sk, deterministic=deterministic)


@pytest.mark.parametrize("atomic_default", [False, True])
def test_deterministic_backward_is_bitwise_repeatable_and_agrees_with_atomic(monkeypatch, atomic_default):
    """deterministic=True: bitwise repeatable; deterministic=False runs `bwd.ATOMIC_DQ_BY_DEFAULT`'s mode
    (atomic dQ when True, else the same separate pass: then bitwise equal too)."""
    monkeypatch.setattr(bwd, "ATOMIC_DQ_BY_DEFAULT", atomic_default)
    g = torch.Generator().manual_seed(12)
    lq, lk = [19, 0, 34], [23, 7, 34]
    q = _packed(sum(lq), 2, 64, torch.float16, False, g)
    k, v = (_packed(sum(lk), 1, 64, torch.float16, False, g) for _ in range(2))
    do = _packed(sum(lq), 2, 64, torch.float16, False, g)

    def grads(det):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = attnscope.flash_attention_varlen(*leaves, _cu(lq), _cu(lk), 34, 34, causal=True,
                                             deterministic=det)
        return torch.autograd.grad(o, leaves, do)

    a, b, c = grads(True), grads(True), grads(False)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all((x.float() - y.float()).abs().max() < 2e-3 for x, y in zip(a, c, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a, c, strict=True)) or atomic_default


def test_compiled_step_has_no_graph_break_and_matches_eager():
    g = torch.Generator().manual_seed(13)
    lq = [9, 14]
    q, k, v = (_packed(23, 2, 64, torch.float16, False, g) for _ in range(3))
    w = torch.randn(64, 64, generator=g).half().to(DEVICE).requires_grad_()
    sinks = torch.zeros(2, device=DEVICE, requires_grad=True)
    cu = _cu(lq)

    def loss_fn(q, k, v, w, sinks):
        o = attnscope.flash_attention_varlen(q @ w, k, v, cu, cu, 14, 14, causal=True, window=(4, -1),
                                             sinks=sinks)
        return o.float().square().sum()

    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")  # fullgraph: a break raises
    compiled(q, k, v, w, sinks).backward()
    gw, gs = w.grad.clone(), sinks.grad.clone()
    w.grad = sinks.grad = None
    loss_fn(q, k, v, w, sinks).backward()
    assert torch.equal(gw, w.grad) and torch.equal(gs, sinks.grad)


def test_compiled_call_checks_the_layout_as_eager():
    # torch.compile's trace runs the layout checks (the fake impl would index a malformed q's shape: an
    # IndexError deep in the compiler), forward-only and with grad
    g = torch.Generator().manual_seed(14)
    q, k, v = (_packed(12, 2, 64, torch.float16, False, g) for _ in range(3))
    cu = _cu([5, 7])
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attnscope.flash_attention_varlen(q, k, v, cu, cu, 7, 7),
                             backend="aot_eager")
    for grad in (False, True):
        with pytest.raises(InputError, match=re.escape("q: expected a 3-d tensor [total_q, Hq, d]")):
            compiled(q[:, 0, 0].detach().requires_grad_(grad), k, v)
    torch._dynamo.reset()

def test_ops_opcheck():
    """The custom ops' fake implementations and schemas, and the forward's autograd registration
    (torch.library.opcheck; its aot_dispatch test is left to test_compiled_step_..., which traces both)."""
    from attnscope.kernels import varlen_bwd

    g = torch.Generator().manual_seed(16)
    q, k, v, do = (_packed(n, h, 64, torch.float16, False, g) for n, h in ((9, 2), (11, 1), (11, 1), (9, 2)))
    cq, ck = _cu([4, 5]), _cu([6, 5])
    sinks = torch.zeros(2, device=DEVICE)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    tests = ("test_schema", "test_faketensor", "test_autograd_registration")  # not the slow aot_dispatch
    torch.library.opcheck(varlen._op, (*leaves, cq, ck, 5, 6, True, 0.125, True, [3, -1], 1.5,
                                       sinks.requires_grad_(), False, False), test_utils=tests)
    o, lse = varlen._op(q, k, v, cq, ck, 5, 6, True, 0.125, True, None, 0.0, None, False, False)
    torch.library.opcheck(varlen_bwd._bwd_op, (do, q, k, v, o, lse, None, cq, ck, 5, 6, True, 0.125, None,
                                               0.0, None, True, False), test_utils=tests[:2])


def test_window_bounds_helper_matches_tiles_py():
    """The in-kernel `_window_bounds` (and its swapped use for the dK/dV kernel) against
    `model.tiles.window_kv_bounds0` over a sweep of rows, lengths and windows."""
    import itertools

    import triton
    import triton.language as tl

    from attnscope.model.tiles import window_kv_bounds0

    @triton.jit
    def probe(IN, OUT, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, OPEN: tl.constexpr):
        i = tl.arange(0, N)
        row0, nq, nk = tl.load(IN + i * 5), tl.load(IN + i * 5 + 1), tl.load(IN + i * 5 + 2)
        left, right = tl.load(IN + i * 5 + 3), tl.load(IN + i * 5 + 4)  # -1: open, as the launcher passes it
        left = tl.where(left < 0, OPEN, left)
        right = tl.where(right < 0, OPEN, right)
        lo, flo, fhi, hi = _tl._window_bounds(row0, nq, nk, BLOCK_M, BLOCK_N, left, right)
        tl.store(OUT + i * 4, lo)
        tl.store(OUT + i * 4 + 1, flo)
        tl.store(OUT + i * 4 + 2, fhi)
        tl.store(OUT + i * 4 + 3, hi)

    bm, bn = 16, 8
    rows = []
    for nq, nk, left, right in itertools.product((1, 13, 40), (1, 9, 40), (-1, 0, 5, 17), (-1, 0, 3, 20)):
        rows += [(r0, nq, nk, left, right) for r0 in range(0, nq, bm)]
    n = triton.next_power_of_2(len(rows))
    rows += [rows[0]] * (n - len(rows))
    inp = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    out = torch.empty(n, 4, dtype=torch.int32, device=DEVICE)
    probe[(1,)](inp, out, N=n, BLOCK_M=bm, BLOCK_N=bn, OPEN=varlen.WINDOW_UNBOUNDED)
    for (r0, nq, nk, left, right), got in zip(rows, out.tolist(), strict=True):
        want = window_kv_bounds0(r0, min(bm, nq - r0), nq, nk, bn, False, (left, right))
        assert tuple(got) == want, (r0, nq, nk, left, right, got, want)


def _carved(n, h, d, dtype, g, pad=7):
    """A [n, h, d] tensor inside a NaN-filled buffer with ``pad`` poisoned rows on each side."""
    buf = torch.full((n + 2 * pad, h, d), float("nan"), dtype=dtype, device=DEVICE)
    buf[pad:pad + n] = torch.randn(n, h, d, generator=g).to(dtype).to(DEVICE)
    return buf[pad:pad + n], buf


def _carve_outputs(monkeypatch, pad=7):
    """The launchers' torch.empty / torch.zeros return views inside NaN-filled buffers; returns the list of
    (view, buffer) pairs so a test can check that nothing outside a view was written."""
    made = []

    class _Torch:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*a, **kw):
            return _make(torch.empty, a, kw)

        @staticmethod
        def zeros(*a, **kw):
            return _make(torch.zeros, a, kw)

    def _make(fn, a, kw):
        t = fn(*a, **kw)
        if not t.is_floating_point() or t.dim() == 0 or t.shape[0] == 0:
            return t
        buf = torch.full((t.shape[0] + 2 * pad, *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device)
        view = buf[pad:pad + t.shape[0]]
        view.copy_(t)
        made.append((view, buf))
        return view

    from attnscope.kernels import varlen_bwd

    monkeypatch.setattr(varlen, "torch", _Torch())
    monkeypatch.setattr(varlen_bwd, "torch", _Torch())
    return made


@pytest.mark.parametrize("cu_q,cu_k,bad", [
    ([0, 50, 12], [0, 4, 10], "cu_seqlens_q"),  # past total_q, then back
    ([3, 1, 12], [0, 4, 10], "cu_seqlens_q"),  # not starting at 0, decreasing
    ([0, 5, 12], [0, -5, 9], "cu_seqlens_k"),  # negative, and not ending at total_k
    ([0, 5, 12], [0, 2**31 - 1, 10], "cu_seqlens_k"),  # int32 max
])
def test_bad_cu_seqlens_stay_inside_the_tensors_and_are_reported(monkeypatch, cu_q, cu_k, bad):
    """The default call: no host check; whatever cu_seqlens hold, every read and write stays inside q, k,
    v and the outputs (poisoned NaN neighbours never reach the result, and are never overwritten), the
    output and gradients are finite, and `check_errors` raises naming the argument."""
    varlen.check_errors()  # a clean word
    g = torch.Generator().manual_seed(14)
    q, _ = _carved(12, 2, 64, torch.float16, g)
    k, _ = _carved(10, 1, 64, torch.float16, g)
    v, _ = _carved(10, 1, 64, torch.float16, g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    made = _carve_outputs(monkeypatch)
    o = attnscope.flash_attention_varlen(*leaves, _i(*cu_q), _i(*cu_k), 12, 10, causal=True)
    grads = torch.autograd.grad(o, leaves, torch.ones_like(o))
    monkeypatch.undo()
    assert torch.isfinite(o).all() and all(torch.isfinite(t).all() for t in grads)
    assert made, "the launchers' outputs were not carved"
    for view, buf in made:
        pad = view.data_ptr() - buf.data_ptr()
        n = pad // (view[0].numel() * view.element_size())
        assert torch.isnan(buf[:n]).all() and torch.isnan(buf[n + view.shape[0]:]).all(), "written outside"
    with pytest.raises(InputError, match=f"{bad}: expected int32 values"):
        varlen.check_errors()
    varlen.check_errors()  # cleared by the raise


def test_small_max_seqlen_is_reported_and_good_calls_are_not():
    varlen.check_errors()
    g = torch.Generator().manual_seed(15)
    q, k, v = (_packed(12, 1, 64, torch.float16, False, g) for _ in range(3))
    attnscope.flash_attention_varlen(q, k, v, _cu([5, 7]), _cu([5, 7]), 7, 7)
    varlen.check_errors()  # nothing to raise
    o = attnscope.flash_attention_varlen(q, k, v, _cu([5, 7]), _cu([5, 7]), 3, 7)
    assert torch.equal(o, attnscope.flash_attention_varlen(q, k, v, _cu([5, 7]), _cu([5, 7]), 7, 7))
    with pytest.raises(InputError, match="max_seqlen_q: expected >= the longest"):
        varlen.check_errors()


@pytest.mark.parametrize("over,msg", [
    ({"window": (3, -2)}, "window: expected None or a pair (left, right) of integers from -1"),
    ({"softcap": -1.0}, "softcap: expected a finite real number >= 0"),
    ({"softcap": float("inf")}, "softcap: expected a finite real number >= 0"),
    ({"sinks": torch.zeros(3)}, "sinks: expected a float32 tensor of shape [Hq] = [4]"),
    ({"sinks": torch.zeros(4, dtype=torch.float64)}, "sinks: expected a float32 tensor"),
    ({"deterministic": 1}, "deterministic: expected True or False, got 1"),
])
def test_bad_mods_are_a_clear_error(over, msg):
    with pytest.raises(InputError) as e:
        attnscope.flash_attention_varlen(**_good(**over))
    assert msg in str(e.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mods", [{}, {"window": (256, 0)}, {"softcap": 30.0, "sinks": True}])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_backward_full_size(d, mods):
    """The GPU configs: 8 prompts of 0..1500 tokens, causal, GQA 4, bf16, forward and backward (both dQ
    modes) per sequence against float64 (2 x / 3 x torch's own error + 1e-3)."""
    rng = np.random.default_rng(d)
    lq = [int(x) for x in rng.integers(1, 1500, 6)] + [0, 1]
    g = torch.Generator().manual_seed(21)
    q = _packed(sum(lq), 8, d, torch.bfloat16, False, g)
    k, v = (_packed(sum(lq), 2, d, torch.bfloat16, False, g) for _ in range(2))
    do = _packed(sum(lq), 8, d, torch.bfloat16, False, g)
    sinks = torch.linspace(-3, 3, 8, device=DEVICE) if mods.get("sinks") else None
    kw = {"window": mods.get("window"), "softcap": mods.get("softcap", 0.0), "sinks": sinks}
    for det in (False, True):
        _check_varlen_grads(q, k, v, do, lq, lq, True, deterministic=det, **kw)


def test_top_level_check_errors_raises_each_familys_record_once():
    # attnscope.check_errors(): the one call after a step that raises what any kernel's device-side check met
    import attnscope.kernels.decode as decode

    attnscope.check_errors()  # nothing recorded yet (or what earlier tests left: cleared here)
    g = torch.Generator().manual_seed(5)
    q, k, v = (_packed(12, 1, 64, torch.float16, False, g) for _ in range(3))
    attnscope.flash_attention_varlen(q, k, v, _i(0, 13, 12), _cu([5, 7]), 13, 7)  # bad cu_seqlens_q
    with pytest.raises(ValueError, match="cu_seqlens_q: expected int32 values from 0 to total_q"):
        attnscope.check_errors()
    attnscope.check_errors()  # cleared
    qd = torch.randn(2, 4, 1, 64, generator=g).half()
    kd, vd = (torch.randn(2, 2, 48, 64, generator=g).half() for _ in range(2))
    attnscope.flash_decode(qd, kd, vd, torch.tensor([49, 0], dtype=torch.int32))  # past L_max = 48
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max\]"):
        attnscope.check_errors()
    decode.check_errors()  # the family's own check sees the record cleared too


@pytest.mark.parametrize("dtype,causal,window,softcap,sinks,deterministic", [
    ("float16", True, None, 0.0, (0.5, -1.0, 2.0, 0.0), False),
    ("bfloat16", False, (4, 4), 5.0, None, True),
])
def test_autograd_semantics_with_empty_and_length_one_sequences(dtype, causal, window, softcap, sinks,
                                                                deterministic):
    """`grad_semantics.check_semantics` over a packed batch with an empty sequence, one with no keys and
    length-1 sequences: the reference is `grad_semantics.attention` per sequence, concatenated."""
    from grad_semantics import attention, check_semantics

    lq, lk = [17, 0, 1, 5, 1], [9, 4, 1, 0, 17]
    g = torch.Generator().manual_seed(31)
    q = _packed(sum(lq), 4, 64, getattr(torch, dtype), True, g)
    k, v = (_packed(sum(lk), 2, 64, getattr(torch, dtype), False, g) for _ in range(2))
    sk = None if sinks is None else torch.tensor(sinks, dtype=torch.float32, device=DEVICE)
    mods = dict(causal=causal, window=window, softcap=softcap)

    def kernel(q, k, v, s):
        return attnscope.flash_attention_varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), return_lse=True,
                                                sinks=s, deterministic=deterministic, **mods)

    def per_sequence(q, k, v, s, f64):
        outs, lses, a, c = [], [], 0, 0
        for nq, nk in zip(lq, lk, strict=True):
            o, lse = attention(*(t[r:r + n].transpose(0, 1)[None] for t, r, n in ((q, a, nq), (k, c, nk),
                                                                                (v, c, nk))), s, f64, **mods)
            outs.append(o[0].transpose(0, 1))
            lses.append(lse[0])
            a, c = a + nq, c + nk
        return torch.cat(outs), torch.cat(lses, 1)

    check_semantics(kernel, per_sequence, (q, k, v, sk), (sum(lq), 4, 64), (4, sum(lq)), seed=5)
