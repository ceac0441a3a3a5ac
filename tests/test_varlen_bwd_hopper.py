"""The Gluon sm_90 varlen backward (kernels/varlen_bwd_hopper.py) and its routing (kernels/varlen_bwd.py
`pick_impl`): on the CPU the host side (work lists, the padded LSE / Delta rows, the rule and its refusals);
on an sm_90 GPU the gradients per sequence against float64 (`checks.kernel_tolerance`, factor 3), ragged
lengths with 0 and 1, Nq != Nk, GQA, causal and not, through the default autograd call."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import _common, varlen_bwd, varlen_plan  # noqa: E402

vh = pytest.importorskip("attnscope.kernels.varlen_bwd_hopper")
from test_varlen import DEVICE, _check_varlen_grads, _cu, _packed  # noqa: E402 - the varlen tests' helpers

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not SM90 or _common.interpreting(), reason="needs an sm_90 GPU")


# --- host side (CPU) -----------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_work_lists_hold_every_tile_of_every_sequence_once(causal):
    """`work_lists` through `varlen_plan.plan`: dK/dV items are (sequence, 128-key tile), dQ items
    (sequence, 128-row query tile), each tile once, empty sequences none, the rest idle (-1)."""
    lq = [0, 1, 127, 128, 129, 300, 5]
    lk = [6, 0, 1, 128, 257, 300, 0]
    dims = (sum(lq), 8, 128, sum(lk), 2)
    lists = vh.work_lists(sum(lq), sum(lk), len(lq), 128, causal)
    assert [t for _, t, _, _ in lists] == [128, 128] and [kv for *_, kv in lists] == [True, False]
    _, _, items = varlen_plan.plan(_cu(lq), _cu(lk), dims, max(lq), max(lk), lists)
    for (n_items, tile, _, kv), (seq, til) in zip(lists, items, strict=True):
        lens = lk if kv else lq
        want = sorted((s, t) for s, n in enumerate(lens) for t in range(-(-n // tile)))
        seq, til = seq.cpu().tolist(), til.cpu().tolist()
        got = sorted((s, t) for s, t in zip(seq, til, strict=True) if s >= 0)
        assert got == want
        assert len(seq) == n_items and seq.count(-1) == n_items - len(want)


def test_padded_rows_put_each_sequence_at_an_aligned_row_before_row_pad_rows_of_padding():
    """Sequence s's rows from ``row_starts[s]``, a multiple of ROW_ALIGN (16 bytes of fp32: the TMA
    loads' innermost coordinate; lengths that make ``cu[s] + s ROW_PAD`` unaligned), at least ROW_PAD pad
    rows after each sequence (the last's inside n_pad), everything else the pad value: a tile of up to
    ROW_PAD rows from inside a sequence reads only its rows and the pad."""
    lens = [3, 0, 130, 1, 64, 5, 2]
    cu = _cu(lens)
    x = torch.randn(3, sum(lens), device=DEVICE)
    starts, (out, zero) = vh.padded_rows([(x, float("-inf")), (x * 2, 0.0)], cu)
    assert torch.equal(starts, vh.row_starts(cu)) and starts.dtype == torch.int32
    starts = starts.tolist()
    assert all(a % vh.ROW_ALIGN == 0 for a in starts) and vh.ROW_ALIGN * 4 == 16
    assert any((int(cu[s]) + s * vh.ROW_PAD) % vh.ROW_ALIGN for s in range(len(lens)))  # the old layout's
    assert torch.equal(torch.where(torch.isneginf(out), 0.0, out * 2), zero)
    assert out.shape[0] == 3 and out.shape[1] % vh.ROW_ALIGN == 0
    expected = torch.full_like(out, float("-inf"))
    for s, n in enumerate(lens):
        a, c = starts[s], int(cu[s])
        expected[:, a:a + n] = x[:, c:c + n]
        nxt = starts[s + 1] if s + 1 < len(lens) else out.shape[1]
        assert nxt - (a + n) >= vh.ROW_PAD
    assert torch.equal(out, expected)


def test_every_row_the_dkdv_producer_loads_by_tma_is_16_byte_aligned():
    """The producer's -LSE2 / Delta TMA coordinates ``row_starts[s] + m BM`` (m a query tile of sequence s)
    are multiples of 4 fp32 for any lengths (an unaligned innermost coordinate is an illegal instruction on
    the H200), and each tile stays inside its sequence's rows and padding."""
    g = torch.Generator().manual_seed(11)
    for _ in range(20):
        lens = torch.randint(0, 300, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        cu = _cu(lens)
        starts = vh.row_starts(cu).tolist()
        for d in (64, 128):
            bm = vh.config(d, "dkdv").BM
            for s, n in enumerate(lens):
                for m in range(-(-n // bm)):
                    row = starts[s] + m * bm
                    assert row * 4 % 16 == 0, (lens, s, m)
                    nxt = starts[s + 1] if s + 1 < len(lens) else None
                    assert nxt is None or row + bm <= nxt, (lens, s, m)


def _mods(causal=True, window=None, softcap=0.0):
    return _common.check_mods(torch, causal, window, softcap, None, 4, torch.device(DEVICE))


def test_pick_impl_rule_and_refusals(monkeypatch):
    """Without sm_90: auto is portable, impl="hopper" refuses naming sm_90. With the device check passing
    (monkeypatched): auto takes the Gluon kernels for d 40-128 (64 and 128 built, the multiples of 8 between
    in their tiles), fp16 / bf16, no window / softcap, and impl="hopper" refuses every other case saying what
    is supported."""
    q = torch.empty(5, 4, 128, dtype=torch.bfloat16, device=DEVICE)
    assert varlen_bwd.pick_impl("auto", q, True, _mods(), 0.088) == "portable"
    with pytest.raises(NotImplementedError, match="impl='hopper': it needs .*sm_90"):
        varlen_bwd.pick_impl("hopper", q, True, _mods(), 0.088)
    with pytest.raises(ValueError, match="impl"):
        varlen_bwd.pick_impl("fast", q, True, _mods(), 0.088)
    assert varlen_bwd.pick_impl("portable", q, True, _mods(), 0.088) == "portable"

    monkeypatch.setattr(varlen_bwd, "hopper_unavailable", lambda torch, t: None)
    for d in (64, 128, 40, 96):
        for dt in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                qd = torch.empty(5, 4, d, dtype=dt, device=DEVICE)
                assert varlen_bwd.pick_impl("auto", qd, causal, _mods(causal), d ** -0.5) == "hopper"
    refused = [
        (torch.empty(5, 4, 32, dtype=torch.bfloat16), _mods(), None, 0.17,
         "head_dim 32 is not supported; supported: 40-128 in steps of 8"),
        (torch.empty(5, 4, 64, dtype=torch.float32), _mods(), None, 0.125, "dtype torch.float32"),
        (q, _mods(False, window=(16, 0)), None, 0.088, "window or softcap"),
        (q, _mods(softcap=30.0), None, 0.088, "window or softcap"),
        (q, _mods(False), (-3, 5), 0.088, "window or softcap"),
        (q, _mods(), None, 10.0, "scale"),
    ]
    for qq, mods, bounds, scale, msg in refused:
        qq = qq.to(DEVICE)
        assert varlen_bwd.pick_impl("auto", qq, True, mods, scale, bounds) == "portable", msg
        with pytest.raises(NotImplementedError, match=msg):
            varlen_bwd.pick_impl("hopper", qq, True, mods, scale, bounds)


def test_public_backward_takes_impl_and_refuses_hopper_without_sm90():
    """`flash_attention_varlen_backward(impl=...)`: "portable" equals the default call bit for bit off
    sm_90; "hopper" raises NotImplementedError there; a bad value names ``impl``."""
    if SM90:
        pytest.skip("checks the CPU / non-sm_90 routing")
    lq, lk = [3, 0, 18], [5, 2, 9]
    g = torch.Generator().manual_seed(3)
    q, do = (_packed(sum(lq), 2, 64, torch.float16, False, g) for _ in range(2))
    k, v = (_packed(sum(lk), 1, 64, torch.float16, False, g) for _ in range(2))
    import attnscope

    o, lse = attnscope.flash_attention_varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), causal=True,
                                              return_lse=True)
    args = (do, q, k, v, o, lse, _cu(lq), _cu(lk), max(lq), max(lk), True)
    auto = varlen_bwd.flash_attention_varlen_backward(*args)
    port = varlen_bwd.flash_attention_varlen_backward(*args, impl="portable")
    assert all(torch.equal(a, b) for a, b in zip(auto, port, strict=True))
    with pytest.raises(NotImplementedError, match="impl='hopper'"):
        varlen_bwd.flash_attention_varlen_backward(*args, impl="hopper")
    with pytest.raises((ValueError, InputError), match="impl"):
        varlen_bwd.flash_attention_varlen_backward(*args, impl="gluon")


# --- sm_90 ---------------------------------------------------------------------------------------------
# Ragged lengths around the 64-row warpgroup tile and the 128-row / 128-key work-item tiles, empty query or
# key sides, length 1, Nq != Nk both ways (causal rows with no visible key when Nq > Nk).
LQ = [0, 1, 63, 64, 65, 127, 129, 300, 517, 1000, 40, 3]
LK = [7, 1, 0, 64, 200, 127, 129, 250, 600, 1000, 0, 190]


def _spy(monkeypatch):
    calls = []
    real = vh.launch
    monkeypatch.setattr(vh, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("d,causal,dtype,group,strided", [
    (128, True, torch.bfloat16, 4, False), (128, False, torch.bfloat16, 4, True),
    (64, True, torch.float16, 2, False), (64, False, torch.bfloat16, 1, False),
    (128, True, torch.float16, 1, True)])
def test_gpu_default_backward_runs_gluon_and_matches_float64(monkeypatch, d, causal, dtype, group,
                                                            strided):
    """The default autograd call on sm_90 runs the Gluon kernels; per sequence within 3 x PyTorch's own
    gradient error + 1e-3 of float64 (`test_varlen._check_varlen_grads`), empty sides exactly 0."""
    calls = _spy(monkeypatch)
    hkv = 2
    g = torch.Generator().manual_seed(d + 7 * causal + group)
    q = _packed(sum(LQ), hkv * group, d, dtype, strided, g)
    k = _packed(sum(LK), hkv, d, dtype, strided, g)
    v = _packed(sum(LK), hkv, d, dtype, False, g)
    do = _packed(sum(LQ), hkv * group, d, dtype, False, g)
    _check_varlen_grads(q, k, v, do, LQ, LK, causal)
    assert calls, "the default backward did not run kernels/varlen_bwd_hopper.py"


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_backward_is_bitwise_repeatable_and_writes_only_its_rows():
    """Two calls give the same bits (no atomics), and no tile writes into a neighbour's rows: each
    sequence's dq / dk / dv in the batch equal those of the sequence run alone (bit for bit)."""
    lq, lk = [65, 0, 130, 1], [129, 3, 70, 64]
    g = torch.Generator().manual_seed(5)
    q, do = (_packed(sum(lq), 8, 128, torch.bfloat16, False, g) for _ in range(2))
    k, v = (_packed(sum(lk), 2, 128, torch.bfloat16, False, g) for _ in range(2))
    import attnscope

    o, lse = attnscope.flash_attention_varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), causal=True,
                                              return_lse=True)

    def grads(q, k, v, do, o, lse, lq, lk):
        return varlen_bwd.flash_attention_varlen_backward(do, q, k, v, o, lse, _cu(lq), _cu(lk), max(lq),
                                                          max(lk), True, impl="hopper")[:3]

    a, b = grads(q, k, v, do, o, lse, lq, lk), grads(q, k, v, do, o, lse, lq, lk)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    cq, ck = np.cumsum([0, *lq]), np.cumsum([0, *lk])
    for s, (nq, nk) in enumerate(zip(lq, lk, strict=True)):
        if nq == 0:
            continue
        rq, rk = slice(cq[s], cq[s] + nq), slice(ck[s], ck[s] + nk)
        alone = grads(q[rq], k[rk], v[rk], do[rq], o[rq], lse[:, rq].contiguous(), [nq], [nk])
        for x, y in zip((a[0][rq], a[1][rk], a[2][rk]), alone, strict=True):
            assert torch.equal(x, y), s


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 4)])
def test_gpu_issue36_lengths_with_unaligned_sequence_starts(monkeypatch, d, causal, hq, hkv):
    """Issue 36's H200 case (an illegal instruction before the fix): packed lengths 300, 1, 0, 777, whose
    last sequence starts at row 301 (its -LSE2 / Delta rows once at an unaligned TMA coordinate), bf16,
    GQA and not, through the default autograd call: the Gluon kernels run and every gradient is within
    3 x PyTorch's error + 1e-3 of float64 per sequence."""
    calls = _spy(monkeypatch)
    lens = [300, 1, 0, 777]
    g = torch.Generator().manual_seed(d + hq + causal)
    q, do = (_packed(sum(lens), hq, d, torch.bfloat16, False, g) for _ in range(2))
    k, v = (_packed(sum(lens), hkv, d, torch.bfloat16, False, g) for _ in range(2))
    _check_varlen_grads(q, k, v, do, lens, lens, causal)
    assert calls, "the default backward did not run kernels/varlen_bwd_hopper.py"


class _Recorder:
    """Stands in for a Gluon kernel on the CPU: records ``kernel[grid](*args, **constexprs)``."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))


@pytest.mark.parametrize("d", [64, 96])
def test_launch_hands_the_kernels_packed_views_padded_rows_and_work_lists(monkeypatch, d):
    """The host side of ``impl="hopper"`` (the kernels recorded, not run): grids (work items, kv heads) and
    (work items, heads); Q/K/V/dO and the outputs as [1, H, total, d] views of the caller's memory with
    the configs' blocks (d 96: the d 128 build's, 128 columns wide; ``DT`` 96, the ragged stores' row
    stride); the -LSE2 / qk_scale and Delta copies padded per sequence; the plan's lists."""
    monkeypatch.setattr(varlen_bwd, "hopper_unavailable", lambda torch, t: None)
    rec = {name: _Recorder() for name in ("dkdv", "dq")}
    monkeypatch.setattr(vh, "_attnscope_varlen_bwd_hopper_dkdv_kernel", rec["dkdv"])
    monkeypatch.setattr(vh, "_attnscope_varlen_bwd_hopper_dq_kernel", rec["dq"])
    lq, lk = [3, 0, 150, 1], [5, 2, 129, 0]
    hq, hkv, db = 4, 2, _common.head_block(d)
    g = torch.Generator().manual_seed(1)
    q = _packed(sum(lq), hq, d, torch.bfloat16, True, g)  # strided: [H, total, d] memory
    do = _packed(sum(lq), hq, d, torch.bfloat16, False, g)
    k, v = (_packed(sum(lk), hkv, d, torch.bfloat16, False, g) for _ in range(2))
    o = torch.randn(sum(lq), hq, d, generator=g).to(torch.bfloat16)
    lse = torch.randn(hq, sum(lq), generator=g)
    dq, dk, dv, _ = varlen_bwd.flash_attention_varlen_backward(do, q, k, v, o, lse, _cu(lq), _cu(lk), max(lq),
                                                               max(lk), True, impl="hopper")
    (grid_kv, a_kv, kw_kv), = rec["dkdv"].calls
    (grid_q, a_q, kw_q), = rec["dq"].calls
    lists = vh.work_lists(sum(lq), sum(lk), len(lq), d, True)
    assert grid_kv == (lists[0][0], hkv) and grid_q == (lists[1][0], hq)
    assert kw_kv["CAUSAL"] is True and "ROWS_PAD" not in kw_kv and kw_q["CAUSAL"] is True
    assert kw_kv["DT"] == kw_q["DT"] == d
    cfg_kv, cfg_q = vh.config(db, "dkdv"), vh.config(db, "dq")

    def same_memory(desc, t, rows):
        assert desc.base.data_ptr() == t.data_ptr() and desc.shape == [1, t.shape[1], t.shape[0], d]
        assert desc.strides[1:] == [t.stride(1), t.stride(0), 1] and desc.block_shape == [1, 1, rows, db]

    bnw = cfg_kv.BN // cfg_kv.NWG
    for desc, t, rows in zip(a_kv[:4], (q, k, v, do), (cfg_kv.BM, bnw, bnw, cfg_kv.BM), strict=True):
        same_memory(desc, t, rows)
    same_memory(a_kv[6], dk, bnw)
    same_memory(a_kv[7], dv, bnw)
    assert a_kv[8] is dk and a_kv[9] is dv
    for desc, t, rows in zip(a_q[:5], (q, k, v, do, dq), (cfg_q.BM, cfg_q.BN, cfg_q.BN, cfg_q.BM, cfg_q.BM),
                             strict=True):
        same_memory(desc, t, rows)
    assert a_q[5] is dq
    qk_scale = d ** -0.5 * _common.LOG2E
    neg_lse = a_kv[4].base[0]  # [Hq, n_pad]
    assert a_kv[4].block_shape == [1, 1, cfg_kv.BM] and a_kv[5].block_shape == [1, 1, cfg_kv.BM]
    cq = np.cumsum([0, *lq])
    starts = a_kv[14]  # ROW0: each sequence's first row in the copies, 16-byte aligned (TMA coordinate)
    assert torch.equal(starts, vh.row_starts(_cu(lq))) and all(a % vh.ROW_ALIGN == 0 for a in starts.tolist())
    for s, n in enumerate(lq):
        at = int(starts[s])
        torch.testing.assert_close(neg_lse[:, at:at + n], lse[:, cq[s]:cq[s] + n] * _common.LOG2E / -qk_scale)
        assert torch.isneginf(neg_lse[:, at + n:at + n + vh.ROW_PAD]).all()
    # the work lists: every (sequence, 128-key tile) and (sequence, 128-row tile) once
    seq_kv, seq_q = a_kv[12].tolist(), a_q[10].tolist()
    assert sorted(s for s in seq_kv if s >= 0) == [0, 1, 2, 2]
    assert sorted(s for s in seq_q if s >= 0) == [0, 2, 2, 3]


_COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from attnscope.kernels import varlen_bwd_hopper as vh
for name, d in (("dkdv", 64), ("dq", 64), ("dkdv", 96), ("dq", 96)):
    src = GluonASTSource(fn=vh.kernel(name), signature=vh.signature(d, "bf16", name),
                         constexprs=vh.constexprs(d, True, name))
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": vh.NUM_WARPS})
    print(name, d, k.asm["ptx"].count("wgmma.mma_async"), k.metadata.shared)
"""


def test_both_kernels_build_for_sm90_on_the_cpu():
    """Both Gluon kernels compile for sm_90 without a GPU (a child process; d 64, and 96 in d 128's build with
    its own row stride): the build reaches ptx with
    wgmma products and stays inside the 227 KB of shared memory a CTA may have. This kernel's pieces come
    from kernels/bwd_hopper.py, so a change of their signatures shows here, not first on a GPU."""
    pytest.importorskip("triton.experimental.gluon")
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(root, "src")
    out = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [r[:2] for r in rows] == [["dkdv", "64"], ["dq", "64"], ["dkdv", "96"], ["dq", "96"]]
    for _, _, wgmma, shared in rows:
        assert int(wgmma) > 0 and 0 < int(shared) <= 227 * 1024
