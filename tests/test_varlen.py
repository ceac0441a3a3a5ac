"""Packed variable-length FA-2 forward against a per-sequence float64 reference (CPU: TRITON_INTERPRET=1).

Bound (STYLE.md): per sequence, the kernel's max error against float64 (`reference.naive_attention`,
bottom-right causal) is at most twice PyTorch's own error (SDPA math at the input dtype, per sequence,
against the same reference) plus 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope import reference  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import _common  # noqa: E402

varlen = pytest.importorskip("attnscope.kernels.varlen")
import attnscope  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not _common.interpreting():
    pytest.skip("no GPU and TRITON_INTERPRET is not set", allow_module_level=True)


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
        assert err <= 2 * torch_err + 1e-3, f"seq {s}: kernel error {err:.3g} > 2 x torch's {torch_err:.3g}"
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


def test_check_seqlens_false_skips_the_value_checks_only():
    g = torch.Generator().manual_seed(4)
    q, k, v = (_packed(12, 1, 64, torch.float16, False, g) for _ in range(3))
    cu = _cu([5, 7])
    a = attnscope.flash_attention_varlen(q, k, v, cu, cu, 7, 7, check_seqlens=False)
    assert torch.equal(a, attnscope.flash_attention_varlen(q, k, v, cu, cu, 7, 7))
    with pytest.raises(ValueError, match="cu_seqlens_q: expected dtype torch.int32"):
        attnscope.flash_attention_varlen(q, k, v, cu.long(), cu, 7, 7, check_seqlens=False)


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


def test_work_items_cover_every_tile_once_heaviest_first():
    lq, lk = [100, 0, 7, 64, 33], [100, 5, 200, 10, 33]
    n_items = 20
    seq, tile = varlen._work_items(_cu(lq), _cu(lk), n_items, 32, causal=True)
    pairs = [(s, t) for s, t in zip(seq.tolist(), tile.tolist(), strict=True) if s >= 0]
    expected = {(s, t) for s, n in enumerate(lq) for t in range(-(-n // 32))}
    assert sorted(pairs) == sorted(expected) and len(pairs) == len(expected)
    assert seq.tolist()[len(pairs):] == [-1] * (n_items - len(pairs))  # idle items last

    def weight(s, t):  # K/V rows the tile loads (bottom-right causal)
        return min(max(min((t + 1) * 32, lq[s]) + lk[s] - lq[s], 0), lk[s])

    w = [weight(s, t) for s, t in pairs]
    assert w == sorted(w, reverse=True)


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
    ({"q": _z(12, 4, 96), "k": _z(10, 2, 96), "v": _z(10, 2, 96)}, NotImplementedError,
     "head_dim 96 is not supported"),
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
    with pytest.raises(exc) as e:
        attnscope.flash_attention_varlen(**_good(**over))
    assert msg in str(e.value)


@pytest.mark.parametrize("over,msg", [
    ({"causal": "no"}, "causal: expected True or False, got 'no'"),  # was read as True
    ({"return_lse": "False"}, "return_lse: expected True or False, got 'False'"),  # was a tuple
    ({"check_seqlens": None}, "check_seqlens: expected True or False, got None"),  # was False
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
        assert err <= 2 * torch_err + 1e-3, f"seq {s} ({nq}, {nk}): {err:.3g} > 2 x {torch_err:.3g} + 1e-3"
