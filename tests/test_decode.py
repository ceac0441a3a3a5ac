"""Split-KV decode kernel (attnscope.kernels.decode) against a float64 reference.

On a machine without a GPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), so shapes are
small. The error bound is flash-attn's: the kernel's max error against float64 attention on the same
(low-precision) inputs is at most 2x PyTorch SDPA's own error at that dtype, plus 1e-3.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope import reference  # noqa: E402
from attnscope.checks import kernel_tolerance  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import _common, _direct, decode  # noqa: E402
from attnscope.kernels.decode import (  # noqa: E402
    _kernel,
    api,
    default_num_splits,
    flash_decode,
    heuristics,
    logical_bytes,
)
from attnscope.kernels.decode import plan as plan_mod  # noqa: E402
from kernel_env import fake_current_device  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


# --- helpers -------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _no_recorded_errors():
    """Each test starts with the device error word clear (a test that provokes one reads it)."""
    with contextlib.suppress(InputError):
        decode.check_errors()


def make_inputs(B, Hq, Hkv, L, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, 1, d, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, d, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, d, generator=g).to(dtype)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def reference_decode(q, k, v, lens, scale=None):
    """float64 masked attention: o [B, Hq, 1, d], natural-log lse [B, Hq, 1] (-inf for empty rows)."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    B, Hq, _, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # query head i reads kv head i // G
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(d))  # [B, Hq, 1, L]
    valid = torch.arange(L)[None, None, None, :] < lens.cpu().long()[:, None, None, None]
    s = s.masked_fill(~valid, -math.inf)
    lse = torch.logsumexp(s, -1)  # [B, Hq, 1]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows with no key: 0
    return p @ v, lse


def torch_error(q, k, v, lens, ref_o, scale=None):
    """Max |SDPA - reference| with SDPA run in the inputs' dtype, per sequence on its valid keys."""
    err = 0.0
    for b, n in enumerate(lens.tolist()):
        if n == 0:
            continue
        o = torch.nn.functional.scaled_dot_product_attention(
            q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], scale=scale, enable_gqa=True)
        err = max(err, (o.double().cpu() - ref_o[b:b + 1]).abs().max().item())
    return err


@contextlib.contextmanager
def poisoned_empty():
    """Make torch.empty return NaN-filled float tensors, so anything the kernels fail to write shows."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real


def tuned_decode(q, k, v, cache_seqlens=None, block_table=None, **kw):
    """`flash_decode` through a plan with the benchmarks' tuning knobs (use_dot, fuse_combine, config)."""
    return plan_mod._tuned_plan(q, k, v, cache_seqlens, block_table, **kw).run(q, k, v, cache_seqlens,
                                                                             block_table)


def run_and_check(q, k, v, lens, num_splits, scale=None, **kw):
    with poisoned_empty():
        o, lse = (tuned_decode if kw else flash_decode)(q, k, v, lens, num_splits=num_splits, scale=scale,
                                                         return_lse=True, **kw)
    B, Hq, _, d = q.shape
    assert o.shape == (B, Hq, 1, d) and o.dtype == q.dtype
    assert lse.shape == (B, Hq, 1) and lse.dtype == torch.float32
    assert not torch.isnan(o).any(), "output has unwritten (NaN) elements"
    assert not torch.isnan(lse).any(), "lse has unwritten (NaN) elements"
    lens_cpu = lens if lens is not None else torch.full((B,), k.shape[2], dtype=torch.int32)
    ref_o, ref_lse = reference_decode(q, k, v, lens_cpu, scale)
    err = (o.double().cpu() - ref_o).abs().max().item()
    bound = kernel_tolerance(torch_error(q, k, v, lens_cpu, ref_o, scale))
    assert err <= bound, f"max error {err:.3g} > bound {bound:.3g}"
    empty = lens_cpu.cpu() == 0
    assert (o.cpu()[empty] == 0).all(), "a sequence with no keys must give exactly 0"
    assert torch.isneginf(lse.cpu()[empty]).all(), "a sequence with no keys must give LSE = -inf"
    # LSE from fp32 accumulation of exact low-precision products: far tighter than the output's bound
    finite = ~empty
    lse_err = (lse.double().cpu()[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    assert lse_err <= 1e-3, f"lse error {lse_err:.3g}"
    return o, lse


# --- correctness over the grid ------------------------------------------------------------------
LENGTHS = (1, 7, 64, 1000)
GROUPS = (1, 4, 8)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("L", LENGTHS)
def test_matches_reference(L, group, dtype):
    # Ragged lengths in one batch, including 0 and 1; d and num_splits vary across the grid so that
    # both head dims meet every length and group, and the split counts 1..8 all occur.
    i, j, m = LENGTHS.index(L), GROUPS.index(group), list(DTYPES).index(dtype)
    d = (64, 128)[(i + j + m) % 2]
    num_splits = (3 * i + 2 * j + m) % 8 + 1
    Hkv = 2
    q, k, v = make_inputs(4, group * Hkv, Hkv, L, d, DTYPES[dtype], seed=100 * i + 10 * j + m)
    lens = torch.tensor([L, 0, 1, max(1, 2 * L // 3)], dtype=torch.int32, device=DEVICE)
    run_and_check(q, k, v, lens, num_splits)


@pytest.mark.parametrize("fuse", (True, False))
@pytest.mark.parametrize("d", (64, 128))
@pytest.mark.parametrize("num_splits", range(1, 9))
def test_every_split_count(num_splits, d, fuse):
    # 97 keys = 6 blocks of 16 + 1 under the interpreter's BLOCK_N: uneven splits, empty trailing splits;
    # the merge in the last program and in a separate kernel
    q, k, v = make_inputs(3, 8, 2, 97, d, torch.float16, seed=num_splits + d)
    lens = torch.tensor([97, 17, 0], dtype=torch.int32, device=DEVICE)
    run_and_check(q, k, v, lens, num_splits, fuse_combine=fuse)


@pytest.mark.parametrize("use_dot", (True, False))
@pytest.mark.parametrize("group", (1, 4, 32))
def test_dot_and_elementwise_paths(group, use_dot):
    # group 32 with one kv head is MQA: a 32-row group tile, no padding
    Hkv = 1 if group == 32 else 2
    q, k, v = make_inputs(2, group * Hkv, Hkv, 150, 64, torch.bfloat16, seed=group)
    lens = torch.tensor([150, 33], dtype=torch.int32, device=DEVICE)
    run_and_check(q, k, v, lens, 3, use_dot=use_dot)


def test_strided_caches_match_contiguous():
    # The cache as serving engines hold it: a [B, L_max, Hkv, d] buffer viewed as [B, Hkv, L_max, d],
    # with L_max larger than the keys in use; q a slice of a [B, 2, Hq, d] buffer.
    B, Hq, Hkv, L, d = 3, 8, 2, 200, 64
    g = torch.Generator().manual_seed(7)
    kbuf = torch.randn(B, L + 40, Hkv, d, generator=g).half().to(DEVICE)
    vbuf = torch.randn(B, L + 40, Hkv, d, generator=g).half().to(DEVICE)
    qbuf = torch.randn(B, 2, Hq, d, generator=g).half().to(DEVICE)
    k, v, q = kbuf.transpose(1, 2), vbuf.transpose(1, 2), qbuf[:, :1].transpose(1, 2)
    assert not k.is_contiguous() and not q.is_contiguous()
    lens = torch.tensor([200, 1, 131], dtype=torch.int32, device=DEVICE)
    o, lse = run_and_check(q, k, v, lens, 4)
    o_c, lse_c = flash_decode(q.contiguous(), k.contiguous(), v.contiguous(), lens, num_splits=4,
                              return_lse=True)
    assert torch.equal(o, o_c) and torch.equal(lse, lse_c)


def test_default_lengths_and_heuristic_split():
    # cache_seqlens=None means every sequence is L_max long; num_splits=None takes the heuristic, which
    # for B * Hkv = 2 programs and 1000 keys is 3 splits (1000 // 256), so phase 2 runs.
    q, k, v = make_inputs(2, 4, 1, 1000, 128, torch.float16, seed=3)
    assert default_num_splits(2, 1, 1000, _common.num_sms(torch, q.device)) == 3
    o, lse = run_and_check(q, k, v, None, None)
    full = torch.full((2,), 1000, dtype=torch.int32, device=DEVICE)
    o2, lse2 = flash_decode(q, k, v, full, num_splits=3, return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("num_splits", (1, 4))
def test_all_sequences_empty(num_splits):
    q, k, v = make_inputs(2, 4, 2, 10, 64, torch.float16, seed=5)
    lens = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    with poisoned_empty():
        o, lse = flash_decode(q, k, v, lens, num_splits=num_splits, return_lse=True)
    assert (o == 0).all() and torch.isneginf(lse).all()


def test_scale_and_return_shapes():
    q, k, v = make_inputs(2, 4, 4, 40, 64, torch.bfloat16, seed=9)
    lens = torch.tensor([40, 23], dtype=torch.int32, device=DEVICE)
    run_and_check(q, k, v, lens, 2, scale=0.3)
    o = flash_decode(q, k, v, lens, num_splits=2, scale=0.3)
    assert isinstance(o, torch.Tensor) and o.shape == (2, 4, 1, 64)


def test_public_entry_point():
    q, k, v = make_inputs(1, 8, 2, 50, 64, torch.float16, seed=11)
    assert torch.equal(attnscope.decode_plan(q, k, v, num_splits=2).run(q, k, v),
                       attnscope.flash_decode(q, k, v, num_splits=2))
    o = attnscope.flash_decode(q, k, v, num_splits=2)
    ref_o, _ = reference_decode(q, k, v, torch.tensor([50], dtype=torch.int32))
    assert (o.double().cpu() - ref_o).abs().max().item() < 1e-2


def test_one_split_skips_phase_two_and_the_fused_merge_skips_the_second_launch():
    q, k, v = make_inputs(1, 4, 2, 64, 64, torch.float16, seed=1)
    one = decode.decode_plan(q, k, v, num_splits=1)
    assert not one.split and one.o_part is None and one.sem is None  # phase 1 writes the output
    sep = plan_mod._tuned_plan(q, k, v, num_splits=3, fuse_combine=False)
    assert sep.split and not sep.fuse and tuple(sep.o_part.shape) == (4, 3, 64)  # partials [R, S, d]
    fused = decode.decode_plan(q, k, v, num_splits=3)  # the default merges in the last program
    assert fused.split and fused.fuse and tuple(fused.sem.shape) == (2,)  # a counter per (b, kv head)
    for plan in (one, sep, fused):
        o = plan.run(q, k, v)
        assert (o.double().cpu() - reference_decode(q, k, v, torch.tensor([64]))[0]).abs().max() < 1e-2


@pytest.mark.parametrize("fuse", (True, False))
def test_fused_and_separate_merge_agree_and_the_counters_reset(fuse):
    # The fused merge leaves its counters at 0 (else the next call's last program would never merge and
    # the NaN-poisoned output would show); repeated calls give the same bits; both merges agree.
    q, k, v = make_inputs(3, 8, 2, 300, 64, torch.bfloat16, seed=21)
    lens = torch.tensor([300, 0, 77], dtype=torch.int32, device=DEVICE)
    first = run_and_check(q, k, v, lens, 5, fuse_combine=fuse)
    for _ in range(2):
        again = run_and_check(q, k, v, lens, 5, fuse_combine=fuse)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    other = tuned_decode(q, k, v, lens, num_splits=5, fuse_combine=not fuse, return_lse=True)
    assert (other[0].float() - first[0].float()).abs().max().item() <= 1e-2
    assert (other[1] - first[1]).nan_to_num(0.0).abs().max().item() <= 1e-5
    plan = plan_mod._tuned_plan(q, k, v, lens, num_splits=5, fuse_combine=fuse, return_lse=True)
    for _ in range(2):
        o, lse = plan.run(q, k, v, lens)
        assert torch.equal(o, first[0]) and torch.equal(lse, first[1])
    if fuse:
        assert plan.sem.numel() == 6 and int(plan.sem.abs().sum()) == 0


def test_fused_merge_over_many_chunks():
    # MQA with 32 query heads at d = 128: a merge chunk holds 4096 // (32 * 128) = 1 split, so 8 splits
    # take 8 chunks; forced fused (the default would use the separate combine here).
    assert not heuristics._fuse_by_default(32, 8, 128)
    q, k, v = make_inputs(2, 32, 1, 260, 128, torch.float16, seed=33)
    lens = torch.tensor([260, 129], dtype=torch.int32, device=DEVICE)
    run_and_check(q, k, v, lens, 8, fuse_combine=True)


def test_fuse_by_default():
    assert heuristics._fuse_by_default(4, 16, 128)  # B = 1, Hq = 32, Hkv = 8: 32 KiB of partials
    assert heuristics._fuse_by_default(1, 128, 128)  # 64 KiB: the bound
    assert not heuristics._fuse_by_default(2, 128, 128)  # 128 KiB
    assert not heuristics._fuse_by_default(32, 128, 128)  # MQA with 128 splits: 2 MiB for one program
    fuse = heuristics._fuse_by_default
    assert fuse(3, 32, 128) == fuse(4, 32, 128)  # G padded to 2^k


@pytest.mark.parametrize("with_sinks", (False, True))
def test_combine_kernel_matches_reference_combine(with_sinks):
    # Phase 2 alone against its specification, reference.combine: random partials with empty splits
    # (lse = -inf) scattered, one head whose splits are all empty, and S = 20 > BLOCK_S = 16 so the
    # merge runs over two chunks; with sinks, one logit per head joins once (the row with no key: the sink)
    B, Hq, S, d = 2, 3, 20, 64
    rng = np.random.default_rng(0)
    o_part = rng.standard_normal((B, Hq, S, d)).astype(np.float32)
    lse_nat = (3 * rng.standard_normal((B, Hq, S))).astype(np.float32)
    lse_nat[rng.random((B, Hq, S)) < 0.3] = -np.inf
    lse_nat[1, 2, :] = -np.inf
    o_part[np.isneginf(lse_nat)] = 0.0  # as phase 1 writes an empty split
    sinks = np.array([4.0, -30.0, 1.5], dtype=np.float32)
    exp_o, exp_lse = reference.combine([(o_part[:, :, s], lse_nat[:, :, s]) for s in range(S)],
                                       sinks=sinks[None, :].astype(np.float64) if with_sinks else None)
    o = torch.empty(B, Hq, 1, d, dtype=torch.float32, device=DEVICE).fill_(float("nan"))
    lse = torch.empty(B, Hq, 1, dtype=torch.float32, device=DEVICE).fill_(float("nan"))
    lse2 = torch.from_numpy(lse_nat * np.float32(heuristics.LOG2E)).to(DEVICE)  # phase 1 writes base 2
    _kernel._attnscope_decode_combine_kernel[(B * Hq,)](
        torch.from_numpy(o_part).to(DEVICE), lse2, o, lse, torch.from_numpy(sinks).to(DEVICE), S, 1, Hq,
        HEAD_DIM=d, BLOCK_S=16, EMULATE_BF16=False, HAS_SINKS=with_sinks)
    np.testing.assert_allclose(o[:, :, 0].cpu().numpy(), exp_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse[:, :, 0].cpu().numpy(), exp_lse, rtol=1e-5, atol=1e-5)
    assert (o[1, 2] == 0).all()
    empty_lse = torch.tensor(1.5 if with_sinks else -math.inf)  # the sink's logit, or -inf
    assert torch.equal(lse[1, 2].cpu(), empty_lse.reshape(1)) or torch.allclose(lse[1, 2].cpu(), empty_lse)


# --- the one logsumexp merge: decode's split merge and kernels.merge.merge_ (the ring's) ------------------
def _partials(shape, d, n, seed, dtype=torch.bfloat16):
    """n random partials (o [*shape, d] in ``dtype``, natural-log lse [*shape] fp32) with -inf rows: row 0
    empty in every partial, another row empty in the first only."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for i in range(n):
        o = torch.randn(*shape, d, generator=g)
        lse = torch.randn(*shape, generator=g) * 4
        o.view(-1, d)[0], lse.view(-1)[0] = 0.0, -math.inf
        if i == 0:
            o.view(-1, d)[3], lse.view(-1)[3] = 0.0, -math.inf
        parts.append((o.to(dtype).to(DEVICE), lse.to(DEVICE)))
    return parts


def _check_against_combine(acc, acc_lse, parts):
    ro, rl = reference.combine([(o.double().cpu().numpy(), lse.double().cpu().numpy()) for o, lse in parts])
    assert not torch.isnan(acc).any() and not torch.isnan(acc_lse).any()
    np.testing.assert_allclose(acc.double().cpu().numpy(), ro, rtol=1e-5, atol=1e-5)
    fin = np.isfinite(rl)
    assert (np.isneginf(acc_lse.double().cpu().numpy()) == ~fin).all()  # -inf exactly where nothing was seen
    np.testing.assert_allclose(acc_lse.double().cpu().numpy()[fin], rl[fin], rtol=1e-5, atol=1e-5)
    assert (acc.reshape(-1, acc.shape[-1])[0] == 0).all()


@pytest.mark.parametrize("shape, d, dtype", [((2, 3, 37), 64, torch.bfloat16), ((5, 19), 80, torch.float16),
                                             ((2, 1, 2, 9), 16, torch.float32)])
def test_merge_matches_reference_combine(shape, d, dtype):
    # merge_ (the Triton kernel, here under the interpreter) folds three partials into an empty
    # accumulator; ranks 3..5, d not a power of two, fp16/bf16/fp32 partials, -inf rows
    from attnscope.kernels.merge import merge_

    parts = _partials(shape, d, 3, seed=d, dtype=dtype)
    acc = torch.full((*shape, d), float("nan"), device=DEVICE)
    acc.zero_()
    acc_lse = torch.full(shape, -math.inf, device=DEVICE)
    for o, lse in parts:
        assert merge_(acc, acc_lse, o, lse)[0] is acc
    _check_against_combine(acc, acc_lse, parts)


def test_merge_into_strided_views_touches_nothing_else():
    # the ring merges into o[:, :, lo:hi]: a strided view; rows outside it must keep their bits
    from attnscope.kernels.merge import merge_

    parts = _partials((2, 3, 11), 64, 2, seed=5)
    big = torch.randn(2, 3, 20, 64, device=DEVICE)
    big_lse = torch.randn(2, 3, 20, device=DEVICE)
    before, before_lse = big.clone(), big_lse.clone()
    view, view_lse = big[:, :, 4:15], big_lse[:, :, 4:15]
    view.zero_()
    view_lse.fill_(-math.inf)
    for o, lse in parts:
        merge_(view, view_lse, o, lse)
    _check_against_combine(view, view_lse, parts)
    assert torch.equal(big[:, :, :4], before[:, :, :4]) and torch.equal(big[:, :, 15:], before[:, :, 15:])
    assert torch.equal(big_lse[:, :, 15:], before_lse[:, :, 15:])


def test_merge_of_two_decode_halves_is_decode_of_the_whole():
    # decode's in-kernel merge and merge_ are one code path: splitting the keys by hand and merging the
    # two halves' (o, lse) with merge_ gives decode over all keys
    from attnscope.kernels.merge import merge_

    q, k, v = make_inputs(2, 8, 2, 90, 64, torch.float16, seed=81)
    whole, whole_lse = flash_decode(q, k, v, num_splits=1, return_lse=True)
    acc = torch.zeros(2, 8, 1, 64, device=DEVICE)
    acc_lse = torch.full((2, 8, 1), -math.inf, device=DEVICE)
    for lo, hi in ((0, 37), (37, 90)):
        merge_(acc, acc_lse, *flash_decode(q, k[:, :, lo:hi], v[:, :, lo:hi], num_splits=1, return_lse=True))
    assert (acc - whole.float()).abs().max().item() <= 2e-3  # whole was rounded to fp16 once, the halves too
    assert (acc_lse - whole_lse).abs().max().item() <= 1e-5


def test_merge_without_the_interpreter_uses_the_same_formula(monkeypatch):
    # CPU tensors without TRITON_INTERPRET cannot run a Triton kernel: merge_ evaluates the formula in torch
    from attnscope.kernels.merge import merge_

    if DEVICE != "cpu":
        pytest.skip("the torch formula serves CPU tensors only")
    parts = _partials((2, 3, 7), 16, 3, seed=9)
    results = []
    for env in ("1", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", env)
        acc, acc_lse = torch.zeros(2, 3, 7, 16), torch.full((2, 3, 7), -math.inf)
        for o, lse in parts:
            merge_(acc, acc_lse, o, lse)
        _check_against_combine(acc, acc_lse, parts)
        results.append((acc, acc_lse))
    assert (results[0][0] - results[1][0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("args, match", [
    (lambda o, l: (o.half(), l, o, l), "o: expected dtype torch.float32 .the accumulator., got torch.float1"),
    (lambda o, l: (o, l.half(), o, l), "lse: expected dtype torch.float32"),
    (lambda o, l: (o, l, o.int(), l), "o_part: expected a float32, float16 or bfloat16 tensor, got torch.i"),
    (lambda o, l: (o, l, o[:, :2], l), r"o_part: expected shape \(2, 3, 4\), got \(2, 2, 4\)"),
    (lambda o, l: (o, l, o, l[:, :2]), r"lse_part: expected shape \(2, 3\) .o without d."),
    (lambda o, l: (o, l, o.numpy(), l), "o_part: expected a torch.Tensor, got ndarray"),
    (lambda o, l: (o[0, 0], l[0, 0], o[0, 0], l[0, 0]), r"o: expected a tensor \[..., N, d\], got shape"),
    (lambda o, l: (o.transpose(0, 2).contiguous().transpose(0, 2), l, o, l),
     "o: expected unit stride in the last .d. dimension"),  # (checked where the kernel runs: always here)
])
def test_merge_bad_input(args, match):
    from attnscope.kernels.merge import merge_

    o, lse = torch.zeros(2, 3, 4, device=DEVICE), torch.zeros(2, 3, device=DEVICE)  # where the kernel runs
    if "ndarray" in match:
        o, lse = o.cpu(), lse.cpu()  # (numpy needs host memory)
    with pytest.raises(InputError, match=match):
        merge_(*args(o, lse))


# --- the split heuristic ---------------------------------------------------------------------------------
def test_default_num_splits_cases():
    # 4 waves on 132 SMs is 528 programs.
    assert default_num_splits(1, 8, 4096) == 16  # 132 // 8 = 16, and 4096 keys allow 16 x 256
    assert default_num_splits(1, 8, 1024) == 4  # wants 16, but 1024 keys allow only 4 x 256
    assert default_num_splits(1, 32, 131072) == 4  # 132 // 32
    assert default_num_splits(16, 8, 4096) == 1  # 128 programs already fill the SMs
    assert default_num_splits(64, 8, 131072) == 1  # 512 programs
    assert default_num_splits(128, 8, 131072) == 1  # 1024 programs already
    assert default_num_splits(1, 1, 10**8) == 128  # the cap
    assert default_num_splits(1, 8, 300) == 1 and default_num_splits(1, 8, 0) == 1  # too short to split
    assert default_num_splits(1, 8, 4096, sms=16) == 2  # 16 // 8
    # a wave or more of items: split only long keys whose last wave leaves most SMs idle
    assert default_num_splits(34, 32, 32768) == 3  # 1088 programs: 32 of 132 SMs busy last; x3: 96 (0.73)
    assert default_num_splits(34, 32, 16383) == 1  # shorter than TAIL_MIN_KEYS
    assert default_num_splits(64, 32, 32768) == 3  # 68 busy (0.52); x2 4, x3 72 (0.55), x4 8: the fullest
    assert default_num_splits(160, 8, 16384) == 1  # 1280 programs: 92 busy (0.70) already
    assert default_num_splits(33, 4, 10**6) == 1  # exactly one wave: no tail
    assert default_num_splits(68, 8, 24576) == 4  # 544: 16 busy (0.12); x2 32, x3 48, x4 64 (0.48) fullest
    assert heuristics._splits(34, 32, 32768, 132, tail=False) == 1  # chunk tiles (Nq > 1) keep 1 split


def test_chunk_plans_keep_one_split_past_a_wave():
    # Nq = 2 with G = 4: 8 rows, one tile per (b, kv head); 34 x 4 = 136 items, long keys, a 4-SM last wave:
    # decode (Nq = 1) would split it (the tail rule), chunk tiles were not measured that way and keep 1
    q = torch.zeros(34, 16, 2, 64, dtype=torch.float16, device=DEVICE)
    k = v = torch.zeros(34, 4, 16384, 64, dtype=torch.float16, device=DEVICE)
    assert decode.decode_plan(q, k, v, check_seqlens=False).num_splits == 1
    assert decode.decode_plan(q[:, :, :1], k, v, check_seqlens=False).num_splits == 4


def test_default_num_splits_properties():
    for B in (1, 2, 3, 8, 34, 64):
        for Hkv in (1, 4, 8, 32):
            prev = None
            for L in (0, 1, 255, 256, 1000, 4096, 32768, 131072, 10**6):
                s = default_num_splits(B, Hkv, L)
                assert 1 <= s <= heuristics.SPLIT_CAP
                assert s == 1 or L // s >= heuristics.MIN_KEYS_PER_SPLIT  # every split keeps >= 256 keys
                if B * Hkv < 132:
                    assert s == 1 or B * Hkv * s <= 132  # never more programs than one wave
                else:  # the tail rule: long keys only, a few splits
                    assert s == 1 or (L >= heuristics.TAIL_MIN_KEYS and s <= heuristics.TAIL_MAX_SPLITS)
                assert prev is None or s >= prev  # longer sequences never get fewer splits
                prev = s


@pytest.mark.parametrize("kwargs, match", [
    ({"batch": 0}, "batch: expected a positive integer, got 0"),
    ({"kv_heads": True}, "kv_heads: expected a positive integer, got True"),
    ({"seqlen": -1}, "seqlen: expected a non-negative integer, got -1"),
    ({"sms": 1.5}, "sms: expected a positive integer, got 1.5"),
])
def test_default_num_splits_errors(kwargs, match):
    args = {"batch": 1, "kv_heads": 8, "seqlen": 4096, **kwargs}
    with pytest.raises(InputError, match=match.replace("(", r"\(")):
        default_num_splits(**args)


def test_logical_bytes_ledger():
    # B = 1, Hq = 32, Hkv = 8, L = 4096, d = 128, bf16, 16 splits
    b = logical_bytes(1, 32, 8, 4096, 128, 2, 16, return_lse=True)
    assert b["kv_read"] == 2 * 8 * 4096 * 128 * 2 == 16 * 2**20
    assert b["q_read"] == 32 * 128 * 2
    assert b["partial_write"] == b["partial_read"] == 32 * 16 * 129 * 4
    assert b["out_write"] == 32 * 128 * 2 + 32 * 4
    assert b["total"] == sum(v for key, v in b.items() if key != "total")
    assert logical_bytes(1, 32, 8, 4096, 128, 2, 1)["partial_write"] == 0  # one split: no partials


# --- bad input ---------------------------------------------------------------------------------------------
def _ok(B=2, Hq=4, Hkv=2, L=8, d=64, dtype=torch.float16):
    q, k, v = make_inputs(B, Hq, Hkv, L, d, dtype, seed=0)
    return q, k, v


def _lens(values, dtype=torch.int32, device=DEVICE):
    return torch.tensor(values, dtype=dtype, device=device)



@pytest.mark.parametrize("build, exc, match", [
    (lambda q, k, v: (q[:, :, 0], k, v, {}), InputError, r"q: expected a 4-d tensor \[B, Hq, Nq, d\]"),
    (lambda q, k, v: (q, [1], v, {}), InputError, "k_cache: expected a torch.Tensor"),
    (lambda q, k, v: (q[:, :, :0], k, v, {}), InputError, "q: expected B >= 1, Hq >= 1 and Nq >= 1"),
    (lambda q, k, v: (q, k[:1], v[:1], {}), InputError, "k_cache: expected batch .as q. 2, got 1"),
    (lambda q, k, v: (q, k[..., :32], v[..., :32], {}), InputError, "k_cache: expected head_dim .as q. 64"),
    (lambda q, k, v: (q, k.bfloat16(), v.bfloat16(), {}), InputError, "k_cache: expected dtype .as q."),
    (lambda q, k, v: (q, k, v.bfloat16(), {}), InputError, "v_cache: expected dtype .as k_cache."),
    (lambda q, k, v: (q, k, v[:, :, :5], {}), InputError, "v_cache: expected shape .as k_cache."),
    (lambda q, k, v: (q[:, :3], k, v, {}), InputError, "multiple of the kv heads .2., got Hq = 3"),
    (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0], {}), InputError, "k_cache: expected L_max >= 1"),
    (lambda q, k, v: (q[:0], k[:0], v[:0], {}), InputError, "q: expected B >= 1, Hq >= 1 and Nq >= 1"),
    (lambda q, k, v: (q[..., :36].contiguous(), k[..., :36].contiguous(), v[..., :36].contiguous(), {}),
     NotImplementedError, "head_dim 36 is not supported; supported: 64, 128"),
    (lambda q, k, v: (q.float(), k.float(), v.float(), {}), NotImplementedError,
     "dtype torch.float32 is not supported; supported: torch.float16, torch.bfloat16"),
    (lambda q, k, v: (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, {}), InputError,
     "k_cache: expected unit stride in the last"),
    (lambda q, k, v: (q, k, v, {"cache_seqlens": [8, 8]}), InputError,
     "cache_seqlens: expected a torch.Tensor of int32"),
    (lambda q, k, v: (q, k, v, {"cache_seqlens": _lens([8, 8], torch.int64)}), InputError,
     "cache_seqlens: expected dtype torch.int32, got torch.int64"),
    (lambda q, k, v: (q, k, v, {"cache_seqlens": _lens([8, 8, 8])}), InputError,
     r"cache_seqlens: expected shape \(2,\) .one length per sequence., got \(3,\)"),
    (lambda q, k, v: (q, k, v, {"cache_seqlens": _lens([[8], [8]])}), InputError,
     r"cache_seqlens: expected shape \(2,\)"),
    (lambda q, k, v: (q, k, v, {"cache_seqlens": _lens([3, -1]), "check_seqlens": True}), InputError,
     r"cache_seqlens: expected values in \[0, L_max = 8\], got -1"),
    (lambda q, k, v: (q, k, v, {"cache_seqlens": _lens([9, 0]), "check_seqlens": True}), InputError,
     r"cache_seqlens: expected values in \[0, L_max = 8\], got 9"),
    (lambda q, k, v: (q, k, v, {"cache_seqlens": _lens([8, 8], device="meta")}), InputError,
     "cache_seqlens: expected device"),
    (lambda q, k, v: (q, k.to("meta"), v, {}), InputError, "k_cache: expected device"),
    (lambda q, k, v: (q, k, v, {"num_splits": 0}), InputError,
     "num_splits: expected a positive integer or None, got 0"),
    (lambda q, k, v: (q, k, v, {"num_splits": True}), InputError, "num_splits: expected a positive integer"),
    (lambda q, k, v: (q, k, v, {"num_splits": 2.0}), InputError, "num_splits: expected a positive integer"),
    (lambda q, k, v: (q, k, v, {"num_splits": 1025}), NotImplementedError,
     "num_splits: at most 1024 supported, got 1025"),
    (lambda q, k, v: (q, k, v, {"scale": 0.0}), InputError, "scale: expected a finite positive number"),
    (lambda q, k, v: (q, k, v, {"scale": float("nan")}), InputError, "scale: expected a finite positive"),
])
def test_bad_input(build, exc, match):
    q, k, v, kw = build(*_ok())
    with pytest.raises(exc, match=match):
        flash_decode(q, k, v, **kw)


def test_errors_are_value_errors():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_decode(q, k, v, cache_seqlens=_lens([9, 0]), check_seqlens=True)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    q, k, v = _ok()
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    with pytest.raises(InputError, match="q: expected CUDA tensors .or CPU tensors with TRITON_INTERPRET=1"):
        flash_decode(q.cpu(), k.cpu(), v.cpu())


def test_the_default_call_reads_nothing_back_and_check_seqlens_does(monkeypatch):
    def boom(*a):
        raise AssertionError("lengths were read back")

    monkeypatch.setattr(api, "_check_seqlen_values", boom)
    monkeypatch.setattr(plan_mod, "_check_seqlen_values", boom)
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda *a: pytest.fail("a device value was read back"))
    q, k, v = _ok()
    lens = _lens([8, 3])
    o = flash_decode(q, k, v, lens, num_splits=2)
    o_plan = decode.decode_plan(q, k, v, lens, num_splits=2).run(q, k, v, lens)
    monkeypatch.setattr(torch.Tensor, "item", item)
    ref_o, _ = reference_decode(q, k, v, lens)
    assert (o.double().cpu() - ref_o).abs().max().item() < 1e-2
    assert torch.equal(o, o_plan)
    with pytest.raises(AssertionError, match="read back"):
        flash_decode(q, k, v, lens, num_splits=2, check_seqlens=True)
    with pytest.raises(AssertionError, match="read back"):
        decode.decode_plan(q, k, v, lens, num_splits=2, check_seqlens=True).run(q, k, v, lens)


# --- the GPU build, checked without a GPU -----------------------------------------------------------------
SM90_COMPILE = r"""
import concurrent.futures
import inspect
import os
import re
import subprocess
import tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnscope.kernels.decode import _kernel, heuristics

split_kernel = _kernel._attnscope_decode_split_kernel
combine_kernel = _kernel._attnscope_decode_combine_kernel
target = GPUTarget("cuda", 90, 32)


def compile_(fn, types, constexprs, warps, stages):
    params = inspect.signature(fn.fn).parameters
    names = list(params)
    # constexprs with a default (MAX_UNSCALED) take it, as a launch that does not pass them does
    constexprs = {**{n: p.default for n, p in params.items() if p.default is not p.empty}, **constexprs}
    sig = {n: ("constexpr" if n in constexprs else types(n)) for n in names}
    # what the launcher's runtime specialisation gives contiguous caches: 16-aligned pointers and strides
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n in types.pointers or (n.startswith("stride_") and n != "stride_sb")}
    return triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), target=target,
                          options={"num_warps": warps, "num_stages": stages})


def split_types(n, kv="*bf16"):
    return {"Q": "*bf16", "K": kv, "V": kv, "SEQLENS": "*i32", "BT": "*i32", "O_PART": "*fp32",
            "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32", "SEM": "*i32", "ERR": "*i32",
            "K_SCALE": "*fp32", "V_SCALE": "*fp32", "SINKS": "*fp32", "qk_scale": "fp32",
            "softcap2": "fp32"}.get(n, "i32")


def fp8_types(n):
    return split_types(n, kv="*fp8e4nv")


split_types.pointers = fp8_types.pointers = ("Q", "K", "V", "SEQLENS", "BT", "O_PART", "LSE_PART", "O",
                                             "LSE", "SEM", "ERR", "K_SCALE", "V_SCALE", "SINKS")
# e4m3 K/V with every score mod on (names without "paged": their K/V tiles take half the shared memory)
MODS = dict(FP8=True, SCALE_PER_HEAD=True, FP8_WORDS=True, FP8_ASM=True, WINDOW=True, SOFTCAP=True,
            HAS_SINKS=True)
# name, use_dot, fuse, block_m, paged, page_size, chunk: decode (MMA, elementwise, fused merge), paged
# pages of 16 and 64, chunked prefill with 32- and 128-row tiles (dense and paged), each with the block
# config the plan picks for its row tile (heuristics._block_config); int32 offsets (OFF32) but where named
VARIANTS = [("decode", True, False, 16, False, 1, False),
            ("elementwise", False, False, 4, False, 1, False),
            ("fused", True, True, 16, False, 1, False), ("paged16", True, True, 16, True, 16, False),
            ("paged64", True, False, 16, True, 64, False), ("paged128", True, True, 16, True, 128, False),
            ("paged256", True, False, 16, True, 256, False), ("chunk32", True, True, 32, False, 1, True),
            ("chunk128", True, False, 128, False, 1, True),
            ("chunk128_paged", True, False, 128, True, 16, True),
            ("chunk128_paged64", True, False, 128, True, 64, True),
            ("fused_int64", True, True, 16, False, 1, False),
            ("paged16_int64", True, True, 16, True, 16, False),
            ("fp8_mods_p16", True, True, 16, True, 16, False),
            ("fp8_mods_dense", True, False, 16, False, 1, False),
            ("fp8_mods_chunk128", True, False, 128, False, 1, True)]
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def _spills(c):  # spill stores in bytes from ptxas -v on the kernel's PTX (-1 without ptxas)
    if not os.path.exists(PTXAS):
        return -1
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(c.asm["ptx"])
    r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                       text=True)
    os.unlink(f.name)
    return int(re.search(r"(\d+) bytes spill stores", r.stderr).group(1))


# ptxas runs for each kernel at once (threads waiting on processes): the lines print in order at the end
pool = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
lines = []


def spills(c):
    return pool.submit(_spills, c)


for name, use_dot, fuse, block_m, paged, page, chunk in VARIANTS:
    cfg = heuristics._block_config(block_m, page if paged else 0, name.startswith("fp8"))
    # e4m3 as the plan builds it: Q K^T in fp16 (F16QK, V per byte) where the config says, else V as words
    f16qk = name.startswith("fp8") and bool(cfg.get("F16QK"))
    mods = dict(MODS, FP8_WORDS=not f16qk, FP8_F16QK=f16qk) if name.startswith("fp8") else {}
    c = compile_(split_kernel, fp8_types if name.startswith("fp8") else split_types,
                 dict(**mods, GROUP=4, BLOCK_M=block_m, HEAD_DIM=128,
                      BLOCK_N=cfg["BLOCK_N"], STAGES=cfg["STAGES"],
                      USE_DOT=use_dot, EMULATE_BF16=False, SPLIT=True, FUSE=fuse,
                      MERGE_M=block_m if chunk else min(block_m, 4), MERGE_S=8 if block_m <= 16 else 1,
                      WRITE_LSE=True, HAS_SEQLENS=True, PAGED=paged, PAGE_SIZE=page, CHUNK=chunk,
                      OFF32=not name.endswith("int64")),
                 warps=cfg["num_warps"], stages=cfg["num_stages"])
    ptx = c.asm["ptx"]
    mma = "mma.sync" in ptx or "wgmma" in ptx
    lines.append(("split", name, use_dot, fuse, c.metadata.shared, "cp.async" in ptx, mma,
                  "atom.global.gpu.acq_rel.add" in ptx, "ld.global.cg" in ptx, spills(c)))


def combine_types(n):
    return {"O_PART": "*fp32", "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32",
            "SINKS": "*fp32"}.get(n, "i32")


combine_types.pointers = ("O_PART", "LSE_PART", "O", "LSE", "SINKS")
c = compile_(combine_kernel, combine_types, dict(HEAD_DIM=128, BLOCK_S=16, EMULATE_BF16=False), 4, 1)
lines.append(("combine", c.metadata.shared, spills(c)))
c = compile_(combine_kernel, combine_types,
             dict(HEAD_DIM=128, BLOCK_S=16, EMULATE_BF16=False, HAS_SINKS=True), 4, 1)
lines.append(("combine", c.metadata.shared, spills(c)))

from attnscope.kernels import merge  # noqa: E402


def merge_types(n):
    return {"O": "*fp32", "LSE": "*fp32", "O_PART": "*bf16", "LSE_PART": "*fp32"}.get(n, "i32")


merge_types.pointers = ("O", "LSE", "O_PART", "LSE_PART")
c = compile_(merge._attnscope_merge_kernel, merge_types, dict(BLOCK_R=merge.BLOCK_R, BLOCK_D=128), 4, 1)
lines.append(("merge", c.metadata.shared, spills(c)))
for line in lines:
    print(*line[:-1], line[-1].result())
"""


def test_kernels_compile_for_sm90_without_a_gpu():
    # The interpreter never runs Triton's compiler, so a kernel can pass every CPU test and still fail to
    # build for a GPU. Compile both kernels for sm_90 (the H200) in a subprocess without
    # TRITON_INTERPRET, and check the KV loop is software-pipelined (cp.async) and fits in shared memory.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0 and ("ptxas" in r.stderr or "backend" in r.stderr.lower()):
        pytest.skip(f"no sm_90 compiler toolchain here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.strip().splitlines()]
    splits = [row for row in rows if row[0] == "split"]
    assert len(splits) == 16 and sum(row[0] == "combine" for row in rows) == 2, r.stdout
    for row in rows:
        if row[0] in ("combine", "merge"):  # the logsumexp merge kernels, compiled and without spills
            assert int(row[2]) <= 0, rows
    shared_of = {row[1]: int(row[4]) for row in splits}
    for name in shared_of:
        if "paged" in name:
            # K/V read through the block table are buffered as deep as the dense cache's (the plan's
            # extra stages, see heuristics._block_config): the same tiles in shared memory
            dense = shared_of["chunk128" if name.startswith("chunk128") else "decode"]
            assert shared_of[name] >= dense, f"{name}: {shared_of[name]} B of shared memory < dense {dense}"
    for _, name, use_dot, fuse, shared, pipelined, mma, atomic, cg, spilled in splits:
        # every variant with the block config the plan picks fits its registers (elementwise: a knob)
        # (e4m3 pages of 16 under a 128-key block: the conversions spill a few bytes, 8 on Triton 3.6)
        limit = 64 if name.startswith("fp8") else 0
        assert name == "elementwise" or int(spilled) <= limit, f"{name} spills {spilled} bytes: {splits}"
        assert int(shared) <= 227 * 1024, splits
        assert pipelined == "True", f"KV loop not software-pipelined: {splits}"
        # the fused merge: a gpu-scope acq_rel ticket, and partials read at L2 (ld.global.cg)
        assert atomic == fuse and cg == fuse, splits
        assert mma == use_dot, splits  # the dot path uses tensor cores, the elementwise path does not


# --- the launcher: cached binaries and CUDA graphs ---------------------------------------------------
def test_a_misaligned_cache_view():
    # Triton specialises pointers on 16-byte alignment: the same shapes from a buffer offset by one
    # element get a binary without 16-byte vector loads, and the same result
    B, Hq, Hkv, L, d = 2, 8, 2, 300, 64
    q, k, v = make_inputs(B, Hq, Hkv, L, d, torch.float16, seed=41)
    lens = torch.tensor([300, 123], dtype=torch.int32, device=DEVICE)
    o = run_and_check(q, k, v, lens, 3)[0]
    kbuf = torch.empty(k.numel() + 1, dtype=k.dtype, device=DEVICE)
    k_odd = kbuf[1:].view_as(k)
    k_odd.copy_(k)
    assert k_odd.data_ptr() % 16 != 0
    # (not run_and_check: SDPA's own kernels fault on a misaligned cache, the reference needs them)
    o_odd = flash_decode(q, k_odd, v, lens, num_splits=3)
    assert (o_odd.float() - o.float()).abs().max().item() <= 1e-3




# --- the plan: reuse, layout identity, CUDA graphs ---------------------------------------------------------
def test_plan_reuse_gives_the_same_bits_and_follows_new_lengths():
    q, k, v = make_inputs(2, 8, 2, 90, 64, torch.bfloat16, seed=61)
    lens = torch.tensor([90, 40], dtype=torch.int32, device=DEVICE)
    plan = decode.decode_plan(q, k, v, lens, num_splits=3, return_lse=True, check_seqlens=False)
    o1, lse1 = plan.run(q, k, v, lens)
    o2, lse2 = plan.run(q, k, v, lens)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)
    assert torch.equal(o1, flash_decode(q, k, v, lens, num_splits=3))
    lens.copy_(torch.tensor([7, 0], dtype=torch.int32))  # new values, same tensor: the plan follows them
    with poisoned_empty():
        o3, lse3 = plan.run(q, k, v, lens)
    ref_o, ref_lse = reference_decode(q, k, v, lens)
    bound = kernel_tolerance(torch_error(q, k, v, lens, ref_o))
    assert (o3.double().cpu() - ref_o).abs().max().item() <= bound
    assert (o3[1] == 0).all() and torch.isneginf(lse3[1]).all()


def test_plan_rejects_a_changed_layout():
    q, k, v = make_inputs(2, 4, 2, 32, 64, torch.float16, seed=62)
    lens = _lens([32, 5])
    plan = decode.decode_plan(q, k, v, lens)
    with pytest.raises(InputError, match=r"k_cache: expected the planned layout .shape \(2, 2, 32, 64\)"):
        plan.run(q, k[:, :, :16], v[:, :, :16], lens)
    with pytest.raises(InputError, match="q: expected the planned layout"):
        plan.run(q.transpose(0, 1).contiguous().transpose(0, 1), k, v, lens)
    with pytest.raises(InputError, match="v_cache: expected the planned layout"):
        plan.run(q, k, v.bfloat16(), lens)
    with pytest.raises(InputError, match=r"cache_seqlens: expected the planned layout .* got None"):
        plan.run(q, k, v)
    plan.run(q, k, v, _lens([33, 0]))  # values are checked on the device, reported by plan.check
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max\]"):
        plan.check()
    checked = decode.decode_plan(q, k, v, lens, check_seqlens=True)  # checked on the host before the launch
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max = 32\], got 33"):
        checked.run(q, k, v, _lens([33, 0]))
    with pytest.raises(InputError, match=r"max_seqlen: expected an integer in \[0, L_max = 32\]"):
        decode.decode_plan(q, k, v, lens, max_seqlen=33)


def test_flash_decode_reuses_a_cached_plan_per_layout(monkeypatch):
    decode.clear_plan_cache()
    most = decode.PLAN_CACHE_LAYOUTS * decode.PLAN_CACHE_SPLITS
    assert decode.plan_cache_info() == (0, 0, 0, most)
    q, k, v = make_inputs(2, 4, 2, 48, 64, torch.float16, seed=64)
    lens = _lens([48, 9])
    o1 = flash_decode(q, k, v, lens, num_splits=3)
    o2 = flash_decode(q.clone(), k.clone(), v.clone(), lens.clone(), num_splits=3)  # same layout, new tensors
    assert torch.equal(o1, o2)
    assert decode.plan_cache_info()[:3] == (1, 1, 1)  # one plan built, reused once
    # a different layout, option or split count is a different plan: each builds its own
    flash_decode(q[:1], k[:1], v[:1], lens[:1], num_splits=3)  # a shape (the batch)
    o_lse = flash_decode(q, k, v, lens, num_splits=3, return_lse=True)  # an option
    flash_decode(q, k, v, lens, num_splits=2)  # the split count
    assert decode.plan_cache_info()[:3] == (1, 4, 4)
    assert torch.equal(o_lse[0], o1)
    # num_splits=None: the split count the heuristic picks for these lengths selects the plan (here 1)
    flash_decode(q, k, v, lens)
    flash_decode(q, k, v, lens)
    assert decode.plan_cache_info()[:2] == (2, 5)
    # a layout seen before skips the layout checks; its values are still checked on every call
    monkeypatch.setattr(api, "_check_inputs", lambda *a: pytest.fail("layout checked again"))
    flash_decode(q, k, v, lens)
    decode.check_errors()
    flash_decode(q, k, v, _lens([49, 0]))
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max\]"):
        decode.check_errors()
    with pytest.raises(InputError, match=r"cache_seqlens: expected values in \[0, L_max = 48\], got 49"):
        flash_decode(q, k, v, _lens([49, 0]), check_seqlens=True)
    monkeypatch.undo()
    # bounded: per layout the least recently used split counts, then the oldest layouts, are dropped
    for n in range(1, decode.PLAN_CACHE_SPLITS + 3):
        flash_decode(q, k, v, lens, num_splits=n)
    assert decode.plan_cache_info().size <= most
    scales = [0.1 + i / 64 for i in range(decode.PLAN_CACHE_LAYOUTS + 1)]  # an option: another key each
    for scale in scales:
        flash_decode(q, k, v, lens, scale=scale)
    hits, misses, size, maxsize = decode.plan_cache_info()
    assert size <= maxsize
    flash_decode(q, k, v, lens, scale=scales[-1])  # the latest layout: kept
    assert decode.plan_cache_info()[:2] == (hits + 1, misses)
    flash_decode(q, k, v, lens, num_splits=3)  # the first layout, 10 layouts ago: dropped, built again
    assert decode.plan_cache_info()[:2] == (hits + 1, misses + 1)
    decode.clear_plan_cache()
    assert decode.plan_cache_info() == (0, 0, 0, most)


@pytest.mark.parametrize("name,planned,refused", [
    ("num_splits", 2, 2.0), ("num_splits", 1, True), ("scale", 1, True), ("softcap", 1, True),
    ("softcap", 0.0, False), ("window", (3, 0), (3.0, 0)), ("window", (3, 0), (3, False))])
def test_an_option_refused_fresh_is_refused_after_an_equal_one_was_planned(name, planned, refused):
    """The plan cache keys the options with their types (as the forward's): 2.0 == 2 and True == 1 hash
    alike, so without the types a call the checks refuse ran the plan of an equal valid option once that
    one had been planned -- an error that depended on the calls before it."""
    q, k, v = make_inputs(2, 4, 2, 40, 64, torch.float16, seed=71)
    lens = _lens([40, 7])
    for first in (False, True):
        decode.clear_plan_cache()
        if first:
            flash_decode(q, k, v, lens, **{name: planned})
        with pytest.raises(InputError, match=name):
            flash_decode(q, k, v, lens, **{name: refused})


def test_threads_sharing_a_separate_merge_plan_never_mix_their_partials(monkeypatch):
    """Two threads on one stream share a layout's plan (here a growing dense cache at two lengths), whose
    separate merge reads the plan's partials in a second launch: a call's two launches stay adjacent, so
    each thread gets its own attention. The kernels run one at a time in the order the host issues them,
    as on one CUDA stream; a pause after the split kernel lets the other thread issue its launches there
    (before, the merge then read the other call's partials)."""
    import threading
    import time

    order = threading.Lock()

    class _Stream:  # ``kernel[grid](*args)`` run under one lock, as one stream runs kernels
        def __init__(self, kernel, pause):
            self.kernel, self.pause = kernel, pause

        def __getitem__(self, grid):
            def run(*args, **kw):
                with order:
                    self.kernel[grid](*args, **kw)
                time.sleep(self.pause)
            return run

    monkeypatch.setattr(plan_mod, "_attnscope_decode_split_kernel",
                        _Stream(plan_mod._attnscope_decode_split_kernel, 0.05))
    monkeypatch.setattr(plan_mod, "_attnscope_decode_combine_kernel",
                        _Stream(plan_mod._attnscope_decode_combine_kernel, 0.0))
    monkeypatch.setattr(plan_mod, "_fuse_by_default", lambda *a: False)  # the separate merge
    decode.clear_plan_cache()
    calls = []
    for seed, L in ((72, 40), (73, 56)):
        q, k, v = make_inputs(2, 4, 2, L, 64, torch.float16, seed=seed)
        calls.append((q, k, v, _lens([L, 9])))
    want = [reference_decode(*c) for c in calls]
    got = [[] for _ in calls]

    def worker(i):
        for _ in range(3):
            got[i].append(flash_decode(*calls[i], num_splits=3))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert decode.plan_cache_info()[1] == 1  # one plan, shared
    for (o_ref, _), outs in zip(want, got, strict=True):
        assert len(outs) == 3
        for o in outs:
            assert (o.double().cpu() - o_ref).abs().max().item() < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("fuse", (True, False))
def test_cuda_graph_capture_of_plan_run(fuse):
    q, k, v = make_inputs(2, 32, 8, 4096, 128, torch.bfloat16, seed=43)
    lens = torch.tensor([4096, 1000], dtype=torch.int32, device=DEVICE)
    plan = plan_mod._tuned_plan(q, k, v, lens, check_seqlens=False, fuse_combine=fuse)
    assert plan.split and plan.fuse == fuse
    eager = plan.run(q, k, v, lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(q, k, v, lens)  # warm-up on the side stream, as torch.cuda.graph recommends
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan.run(q, k, v, lens)
    lens.copy_(torch.tensor([17, 4096], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plan.run(q, k, v, lens))  # the replay read the new lengths
    lens.copy_(torch.tensor([4096, 1000], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_direct_launch_passes_every_parameter_in_order(monkeypatch):
    # _direct.DirectLaunch without a GPU: a stand-in for the JIT function and its compiled kernel records
    # what Triton would be given. The first aligned launch goes through kernel[grid]; later ones call the
    # launcher with (grid, stream, function, metadata, no hooks, then every kernel parameter in signature
    # order: the runtime arguments, then each constexpr as the plan sets it or its default); a misaligned
    # launch goes through kernel[grid] again.
    calls = []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def run(self, *a):
            calls.append(("direct", a))

    class Kernel:  # the parameters Triton's JIT function has (this one may be the interpreter's)
        params = triton.runtime.jit.JITFunction(plan_mod._attnscope_decode_split_kernel.fn).params

        def __getitem__(self, grid):
            def launch(*args, **kw):
                calls.append(("triton", grid, args, kw))
                return Compiled()
            return launch

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    params = Kernel.params
    n_args = next(i for i, p in enumerate(params) if p.is_constexpr)
    args = tuple(range(n_args))
    consts = {"GROUP": 4, "BLOCK_M": 16, "HEAD_DIM": 128, "FP8": True, "num_warps": 8}
    d = _direct.DirectLaunch(Kernel(), consts, 0)
    d.launch((6, 3), args, True)
    d.launch((6, 3), args, True)
    d.launch((6, 3), args, False)
    hooks = triton.knobs.runtime.launch_enter_hook
    hooks.add(print)  # a profiler's hook: Triton's launch, which calls it
    try:
        d.launch((6, 3), args, True)
    finally:
        hooks.remove(print)
    assert [c[0] for c in calls] == ["triton", "direct", "triton", "triton"]
    assert calls[0][2] == args and calls[0][3] == consts
    head, rest = calls[1][1][:9], calls[1][1][9:]
    assert head == (6, 3, 1, 1234, "fn", "meta", None, None, None)
    assert len(rest) == len(params) and rest[:n_args] == args
    for p, value in zip(params[n_args:], rest[n_args:], strict=True):
        assert p.is_constexpr and value == consts.get(p.name, p.default), p.name
    assert rest[params.index(next(p for p in params if p.name == "FP8"))] is True
    # a plan of device 1 launched while device 0 is current: device 1 made current around each launch
    # (Triton launches on the current device), the first through Triton, the next through the kept binary
    calls.clear()
    current, entered = fake_current_device(monkeypatch, 0)
    other = _direct.DirectLaunch(Kernel(), consts, 1)
    other.launch((6, 3), args, True)
    other.launch((6, 3), args, True)
    assert [c[0] for c in calls] == ["triton", "direct"] and other.compiled is not None
    assert entered == [1, 1] and current == [0]
    d.launch((6, 3), args, True)  # device 0's plan, device 0 current: no switch
    assert entered == [1, 1] and calls[-1][0] == "direct"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the direct launch needs a GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("fuse", (True, False))
def test_gpu_direct_launch_equals_tritons_and_falls_back_on_other_alignments(fuse):
    # a plan's second launch calls the compiled kernel's launcher itself (_direct.DirectLaunch): the same
    # bits as the first (through kernel[grid]); a misaligned view (another binary) goes through Triton
    q, k, v = make_inputs(2, 32, 8, 3000, 128, torch.bfloat16, seed=44)
    lens = torch.tensor([3000, 777], dtype=torch.int32, device=DEVICE)
    plan = plan_mod._tuned_plan(q, k, v, lens, return_lse=True, fuse_combine=fuse)
    first = plan.run(q, k, v, lens)
    split, combine = plan._direct
    assert split.compiled is not None and (combine.compiled is not None) == (plan.split and not fuse)
    for _ in range(3):
        again = plan.run(q, k, v, lens)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    ref_o, _ = reference_decode(q, k, v, lens)
    err = (first[0].double().cpu() - ref_o).abs().max().item()
    assert err <= kernel_tolerance(torch_error(q, k, v, lens, ref_o))
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEVICE)
    q_odd = buf[1:].view_as(q)
    q_odd.copy_(q)
    assert q_odd.data_ptr() % 16 != 0
    odd = plan.run(q_odd, k, v, lens)
    assert (odd[0].float() - first[0].float()).abs().max().item() <= 1e-3
    assert split.compiled is not None
    assert torch.equal(plan.run(q, k, v, lens)[0], first[0])  # aligned again: the kept binary
    decode.check_errors()


# --- paged KV cache and Nq >= 1 (chunked prefill / speculative verification) -------------------------------
def to_paged(k, v, lens, page_size, gen, shared_prefix_pages=0, spare=3):
    """Scatter dense caches [B, Hkv, L, d] into randomly permuted pages [P, page_size, Hkv, d] with a
    block table [B, max_pages]; optionally sequence 1.. share sequence 0's first pages (their dense
    keys are overwritten with sequence 0's, so the dense copy stays the reference). Unused table entries
    and spare pages hold garbage (-7 and NaN) that must never be read."""
    B, Hkv, L, d = k.shape
    k, v = k.clone(), v.clone()
    max_pages = -(-L // page_size)
    n_own = B * max_pages
    perm = torch.randperm(n_own + spare, generator=gen)
    table = torch.full((B, max_pages), -7, dtype=torch.int32)
    kp = torch.full((n_own + spare, page_size, Hkv, d), float("nan"), dtype=k.dtype)
    vp = kp.clone()
    for b in range(B):
        for j in range(-(-int(lens[b]) // page_size)):
            if b > 0 and j < shared_prefix_pages:
                table[b, j] = table[0, j]
                seg = slice(j * page_size, min((j + 1) * page_size, L))
                k[b, :, seg], v[b, :, seg] = k[0, :, seg], v[0, :, seg]
                continue
            page = int(perm[b * max_pages + j])
            table[b, j] = page
            n = min(page_size, L - j * page_size)
            kp[page, :n] = k[b, :, j * page_size:j * page_size + n].transpose(0, 1)
            vp[page, :n] = v[b, :, j * page_size:j * page_size + n].transpose(0, 1)
    return k, v, kp.to(DEVICE), vp.to(DEVICE), table.to(DEVICE)


def gather_pages(kp, table, b, n):
    """Sequence b's first n keys from a paged cache [P, page_size, Hkv, d] -> dense [Hkv, n, d]."""
    ps = kp.shape[1]
    idx = torch.arange(n)
    pages = table[b].cpu().long()[idx // ps]
    return kp.cpu()[pages, idx % ps].transpose(0, 1)


def reference_chunk(q, k, v, lens, scale=None, table=None):
    """float64 attention of q [B, Hq, Nq, d] (the last Nq positions of each sequence): per sequence,
    its keys (dense k, v [B, Hkv, L, d], or gathered from pages through ``table``) through
    `reference.naive_attention` with bottom-right causal; rows with no key -> 0 and LSE -inf."""
    B, Hq, Nq, d = q.shape
    o = torch.zeros(B, Hq, Nq, d, dtype=torch.float64)
    lse = torch.full((B, Hq, Nq), -math.inf, dtype=torch.float64)
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        if table is None:
            kb, vb = k[b, :, :n].cpu(), v[b, :, :n].cpu()
        else:
            kb, vb = gather_pages(k, table, b, n), gather_pages(v, table, b, n)
        ob, lb = reference.naive_attention(q[b].double().cpu().numpy(), kb.double().numpy(),
                                           vb.double().numpy(), causal=True, scale=scale, return_lse=True)
        o[b], lse[b] = torch.from_numpy(ob), torch.from_numpy(lb)
    return o, lse


def check_chunk(o, lse, q, k, v, lens, scale=None, paged=None):
    """``paged``: (k_pages, v_pages, table): the reference gathers from the pages; k, v are the dense
    copy (for SDPA's own error, and checked equal to the gathered keys)."""
    ref_o, ref_lse = reference_chunk(q, k, v, lens, scale)
    if paged is not None:
        gathered = reference_chunk(q, paged[0], paged[1], lens, scale, table=paged[2])
        assert torch.equal(gathered[0], ref_o) and torch.equal(gathered[1], ref_lse)
    # PyTorch's own error at this dtype: SDPA with the same bottom-right mask, per sequence
    B, Hq, Nq, d = q.shape
    torch_err = 0.0
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        pos = n - Nq + torch.arange(Nq, device=q.device)
        mask = torch.arange(n, device=q.device)[None, :] <= pos[:, None]
        low = torch.nn.functional.scaled_dot_product_attention(
            q[b:b + 1], k[b:b + 1, :, :n].to(q.device), v[b:b + 1, :, :n].to(q.device), attn_mask=mask,
            scale=scale, enable_gqa=True).double().cpu().nan_to_num(0.0)
        rows = pos >= 0
        torch_err = max(torch_err, (low[0][:, rows.cpu()] - ref_o[b][:, rows.cpu()]).abs().max().item())
    assert o.shape == (B, Hq, Nq, d) and lse.shape == (B, Hq, Nq)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    err = (o.double().cpu() - ref_o).abs().max().item()
    bound = kernel_tolerance(torch_err)
    assert err <= bound, f"max error {err:.3g} > bound {bound:.3g}"
    none = torch.isneginf(ref_lse)
    assert (o.cpu()[none] == 0).all() and torch.isneginf(lse.cpu()[none]).all()
    assert (lse.double().cpu()[~none] - ref_lse[~none]).abs().max().item() <= 1e-3 if (~none).any() else True


@pytest.mark.parametrize("page_size, group, dtype, num_splits, shared", [
    (16, 1, torch.float16, 1, 0), (16, 4, torch.bfloat16, 3, 1), (32, 4, torch.float16, 2, 2),
    (64, 1, torch.bfloat16, 4, 0), (128, 4, torch.float16, None, 1), (256, 1, torch.bfloat16, 2, 0),
])
def test_paged_decode_matches_reference(page_size, group, dtype, num_splits, shared):
    # lengths that do not divide the page size, an empty sequence, random page order, shared prefixes
    gen = torch.Generator().manual_seed(page_size + group)
    B, Hkv, d = 3, 2, 64
    L = 2 * page_size + 5
    q, k, v = make_inputs(B, group * Hkv, Hkv, L, d, dtype, seed=page_size)
    lens = torch.tensor([L, 0, page_size + 3], dtype=torch.int32)
    k, v, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, page_size, gen, shared_prefix_pages=shared)
    with poisoned_empty():
        o, lse = flash_decode(q, kp, vp, lens.to(DEVICE), num_splits=num_splits, return_lse=True,
                              block_table=table)
    check_chunk(o, lse, q, k, v, lens, paged=(kp, vp, table))
    dense = flash_decode(q, k.to(DEVICE), v.to(DEVICE), lens.to(DEVICE), num_splits=num_splits or 1)
    assert (o.float() - dense.float()).abs().max().item() <= 1e-2


@pytest.mark.parametrize("page_size, block_n", [(16, 64), (32, 64), (16, 16), (64, 32)])
def test_paged_block_sizes_spanning_and_inside_pages(page_size, block_n):
    # a block of several whole pages (64 keys over 4 or 2 pages: one table read per page, the last
    # pages of a block past the length read nothing) and blocks inside one page (one read per block)
    gen = torch.Generator().manual_seed(block_n)
    B, Hkv, d, group = 3, 2, 64, 4
    L = 3 * block_n + 7
    q, k, v = make_inputs(B, group * Hkv, Hkv, L, d, torch.float16, seed=page_size + block_n)
    lens = torch.tensor([L, block_n + page_size + 1, 5], dtype=torch.int32)
    k, v, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, page_size, gen, shared_prefix_pages=1)
    with poisoned_empty():
        o, lse = tuned_decode(q, kp, vp, lens.to(DEVICE), table, num_splits=2, return_lse=True,
                              config={"BLOCK_N": block_n, "STAGES": 1, "num_warps": 4, "num_stages": 1})
    check_chunk(o, lse, q, k, v, lens, paged=(kp, vp, table))


@pytest.mark.parametrize("nq, group, dtype, num_splits, paged", [
    (1, 4, torch.float16, 2, True), (2, 1, torch.bfloat16, 1, False), (3, 4, torch.float16, 3, False),
    (5, 4, torch.bfloat16, 2, True), (8, 1, torch.float16, 4, True), (17, 1, torch.bfloat16, 1, False),
    (17, 4, torch.float16, 3, True),
])
def test_chunked_queries_match_causal_reference(nq, group, dtype, num_splits, paged):
    # G x Nq rows over several 16-row tiles (the interpreter's cap), causal bottom-right per sequence;
    # a sequence shorter than Nq (queries at negative positions see nothing) and an empty one
    gen = torch.Generator().manual_seed(nq * 10 + group)
    B, Hkv, d, L = 4, 2, 64, 70
    g = torch.Generator().manual_seed(nq)
    q = torch.randn(B, group * Hkv, nq, d, generator=g).to(dtype).to(DEVICE)
    _, k, v = make_inputs(B, group * Hkv, Hkv, L, d, dtype, seed=nq + 1)
    lens = torch.tensor([L, max(nq - 2, 0), 0, 33], dtype=torch.int32)
    if paged:
        k, v, kc, vc, table = to_paged(k.cpu(), v.cpu(), lens, 16, gen, shared_prefix_pages=1)
    else:
        kc, vc, table = k, v, None
    with poisoned_empty():
        o, lse = flash_decode(q, kc, vc, lens.to(DEVICE), num_splits=num_splits, return_lse=True,
                              block_table=table)
    check_chunk(o, lse, q, k, v, lens, paged=(kc, vc, table) if paged else None)


def test_chunked_fused_and_separate_merge_agree():
    q = torch.randn(2, 8, 4, 64, generator=torch.Generator().manual_seed(3)).half().to(DEVICE)
    _, k, v = make_inputs(2, 8, 2, 100, 64, torch.float16, seed=4)
    lens = _lens([100, 9])
    a = tuned_decode(q, k, v, lens, num_splits=4, fuse_combine=True, return_lse=True)
    b = tuned_decode(q, k, v, lens, num_splits=4, fuse_combine=False, return_lse=True)
    check_chunk(*a, q, k, v, lens.cpu())
    assert (a[0].float() - b[0].float()).abs().max().item() <= 1e-2
    assert (a[1] - b[1]).nan_to_num(0.0).abs().max().item() <= 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU block configs need a GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", decode.PAGE_SIZES)
@pytest.mark.parametrize("nq", (1, 40))
def test_paged_equals_dense_with_the_gpu_block_configs(page_size, nq):
    # on a GPU the plan reads 128-key blocks (64 for chunk tiles) through the block table: several
    # pages per block below 128, one entry per block from 128 up, with extra pipeline stages; the
    # same arithmetic as the dense kernel, so the same output up to the order of nothing: compare
    gen = torch.Generator().manual_seed(page_size)
    B, Hkv, G, d, L = 3, 4, 4, 128, 3000
    q = torch.randn(B, Hkv * G, nq, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    _, k, v = make_inputs(B, Hkv * G, Hkv, L, d, torch.bfloat16, seed=page_size + nq)
    lens = torch.tensor([L, 1234, 77], dtype=torch.int32)
    k, v, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, page_size, gen, shared_prefix_pages=2)
    kp, vp, table, lens = kp.to(DEVICE), vp.to(DEVICE), table.to(DEVICE), lens.to(DEVICE)
    for splits in (1, 5):
        with poisoned_empty():
            o, lse = flash_decode(q, kp, vp, lens, num_splits=splits, return_lse=True, block_table=table)
        check_chunk(o, lse, q, k, v, lens.cpu(), paged=(kp, vp, table))
        dense = flash_decode(q, k.to(DEVICE), v.to(DEVICE), lens, num_splits=splits)
        assert (o.float() - dense.float()).abs().max().item() <= 1e-2


def _paged_ok():
    q, k, v = make_inputs(2, 4, 2, 32, 64, torch.float16, seed=71)
    gen = torch.Generator().manual_seed(0)
    _, _, kp, vp, table = to_paged(k.cpu(), v.cpu(), torch.tensor([32, 20]), 16, gen, spare=0)
    return q, kp, vp, table


@pytest.mark.parametrize("build, exc, match", [
    (lambda q, kp, vp, t: (q, kp, vp, {"block_table": t.long()}), InputError,
     "block_table: expected dtype torch.int32, got torch.int64"),
    (lambda q, kp, vp, t: (q, kp, vp, {"block_table": t[:1]}), InputError,
     r"block_table: expected shape \(2, max_pages >= 1\), got \(1, 2\)"),
    (lambda q, kp, vp, t: (q, kp, vp, {"block_table": t[:, :0]}), InputError,
     r"block_table: expected shape \(2, max_pages >= 1\)"),
    (lambda q, kp, vp, t: (q, kp, vp, {"block_table": t.t().contiguous().t()}), InputError,
     "block_table: expected unit stride in the last dimension"),
    (lambda q, kp, vp, t: (q, kp, vp, {"block_table": [[0, 1], [2, 3]]}), InputError,
     "block_table: expected a torch.Tensor of int32"),
    (lambda q, kp, vp, t: (q, kp[:, :8], vp[:, :8], {"block_table": t}), NotImplementedError,
     "k_cache: page_size 8 is not supported; supported: 16, 32, 64, 128, 256"),
    (lambda q, kp, vp, t: (q, kp[:0], vp[:0], {"block_table": t}), InputError,
     "k_cache: expected num_pages >= 1"),
    (lambda q, kp, vp, t: (q, kp, vp, {"block_table": t.clone().fill_(4), "check_seqlens": True}), InputError,
     r"block_table: expected page indices in \[0, num_pages = 4\) for the pages cache_seqlens uses, "
     r"got 4 at \[0, 0\]"),
    (lambda q, kp, vp, t: (q, kp, vp, {"block_table": t, "cache_seqlens": _lens([33, 0]),
                                       "check_seqlens": True}), InputError,
     r"cache_seqlens: expected values in \[0, L_max = 32\], got 33"),
    (lambda q, kp, vp, t: (q, kp[..., :32], vp[..., :32], {"block_table": t}), InputError,
     "k_cache: expected head_dim .as q. 64, got 32"),
    (lambda q, kp, vp, t: (q[:, :3], kp, vp, {"block_table": t}), InputError,
     r"multiple of the kv heads .2., got Hq = 3"),
])
def test_bad_paged_input(build, exc, match):
    q, kp, vp, kw = build(*_paged_ok())
    with pytest.raises(exc, match=match):
        flash_decode(q, kp, vp, **kw)


def test_block_table_entries_past_the_length_are_not_checked_or_read():
    q, kp, vp, table = _paged_ok()
    lens = _lens([32, 16])  # sequence 1 uses one page: its second entry may be anything
    table = table.clone()
    table[1, 1] = -7
    o = flash_decode(q, kp, vp, lens, block_table=table, check_seqlens=True)
    assert not torch.isnan(o).any()
    decode.check_errors()  # nothing recorded
    with pytest.raises(InputError, match=r"got -7 at \[1, 1\]"):
        flash_decode(q, kp, vp, _lens([32, 17]), block_table=table, check_seqlens=True)


def test_plan_run_writes_into_given_outputs():
    q, k, v = make_inputs(2, 4, 2, 40, 64, torch.float16, seed=63)
    lens = _lens([40, 3])
    plan = decode.decode_plan(q, k, v, lens, num_splits=2, return_lse=True)
    out = torch.full((2, 4, 1, 64), float("nan"), dtype=torch.float16, device=DEVICE)
    lse_out = torch.full((2, 4, 1), float("nan"), dtype=torch.float32, device=DEVICE)
    o, lse = plan.run(q, k, v, lens, out=out, lse_out=lse_out)
    assert o is out and lse is lse_out
    o2, lse2 = plan.run(q, k, v, lens)
    assert torch.equal(o2, out) and torch.equal(lse2, lse_out)
    with pytest.raises(InputError, match=r"out: expected a contiguous tensor of shape \(2, 4, 1, 64\)"):
        plan.run(q, k, v, lens, out=out.float())
    with pytest.raises(InputError, match="lse_out: expected a contiguous tensor"):
        plan.run(q, k, v, lens, lse_out=lse_out[:1])
    no_lse = decode.decode_plan(q, k, v, lens, num_splits=2)
    with pytest.raises(InputError, match="lse_out: expected None .the plan was made with return_lse=False."):
        no_lse.run(q, k, v, lens, lse_out=lse_out)


@pytest.mark.parametrize("call, match", [
    (lambda q, k, v, lens: flash_decode(q, k, v, lens, return_lse="no"),  # was a tuple
     "return_lse: expected True or False, got 'no'"),
    (lambda q, k, v, lens: flash_decode(q, k, v, lens, check_seqlens=None),  # was False: no check
     "check_seqlens: expected True or False, got None"),
    (lambda q, k, v, lens: decode.decode_plan(q, k, v, lens, return_lse=1),
     "return_lse: expected True or False, got 1"),
    (lambda q, k, v, lens: flash_decode(q, k, v, lens, scale=1e39),  # scale * log2 e was inf: NaN output
     r"scale: expected a finite positive number up to 2.36e\+38, or None, got 1e\+39"),
    (lambda q, k, v, lens: decode.decode_plan(q, k, v, lens).run([0], k, v, lens),  # was AttributeError
     "q: expected a torch.Tensor as planned, got list"),
    (lambda q, k, v, lens: decode.decode_plan(q, k, v, lens).run(q, k, v, [8, 3]),
     "cache_seqlens: expected a torch.Tensor as planned, got list"),
])
def test_flags_scale_and_run_arguments_are_checked(call, match):
    q, k, v = _ok()
    with pytest.raises(InputError, match=match):
        call(q, k, v, _lens([8, 3]))


def test_plan_run_refuses_outputs_sharing_memory_with_the_inputs_or_each_other():
    """An out= over the cache is overwritten while other programs still read it; an lse_out over out
    gave silently wrong output (each overwrote the other)."""
    q, k, v = make_inputs(1, 1, 1, 32, 64, torch.float16, seed=5)
    q = q.expand(1, 1, 16, 64).contiguous()
    plan = decode.decode_plan(q, k, v, num_splits=2, return_lse=True)
    with pytest.raises(InputError, match="out: expected a buffer that shares no memory with k_cache"):
        plan.run(q, k, v, out=k[:, :, :16])
    with pytest.raises(InputError, match="out: expected a buffer that shares no memory with q"):
        plan.run(q, k, v, out=q)
    out = torch.empty(1, 1, 16, 64, dtype=torch.float16, device=DEVICE)
    lse_over_out = out.view(-1)[:32].view(torch.float32).view(1, 1, 16)
    with pytest.raises(InputError, match="lse_out: expected a buffer that shares no memory with out"):
        plan.run(q, k, v, out=out, lse_out=lse_over_out)
    o, lse = plan.run(q, k, v, out=out, lse_out=torch.empty(1, 1, 16, device=DEVICE))
    assert o is out and not torch.isnan(o).any() and torch.isfinite(lse).all()


@pytest.mark.parametrize("layout", ["head-major", "token-major", "k-and-v-differ", "ragged-capacity"])
def test_dense_chunk_reads_through_a_table_of_key_pages(layout):
    # Chunk tiles on a dense cache run the paged loop over a plan-owned table (page b * R + j = keys
    # j * page .. of sequence b). The table's entries follow from the strides; when K and V do not share
    # R, or a sequence's span is not whole pages, the plan keeps the dense loop. Either way the output is
    # the float64 reference's.
    page = heuristics._block_config(16)["BLOCK_N"]  # the table's page: 16 keys here, 128 on a GPU
    B, Hkv, G, nq, L, d = 3, 2, 2, 5, 5 * page - (5 if layout == "ragged-capacity" else 0), 64
    q = torch.randn(B, G * Hkv, nq, d, generator=torch.Generator().manual_seed(8)).half().to(DEVICE)
    _, k, v = make_inputs(B, G * Hkv, Hkv, L, d, torch.float16, seed=9)
    if layout in ("token-major", "k-and-v-differ"):
        k = k.transpose(1, 2).contiguous().transpose(1, 2)  # a [B, L, Hkv, d] buffer
    if layout == "token-major":
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    lens = torch.tensor([L, 7, 40], dtype=torch.int32)
    plan = decode.decode_plan(q, k, v, lens.to(DEVICE), return_lse=True, check_seqlens=False)
    if layout in ("k-and-v-differ", "ragged-capacity"):
        assert plan.table is None
    else:
        R = k.stride(0) // (page * k.stride(2))
        n = -(-L // page)
        want = torch.arange(B)[:, None] * R + torch.arange(n)[None, :]
        assert plan.table is not None and torch.equal(plan.table.cpu().long(), want)
    with poisoned_empty():
        o, lse = plan.run(q, k, v, lens.to(DEVICE))
    check_chunk(o, lse, q, k, v, lens)


class _Shape:
    """Shape and strides only: the int32-offset check reads nothing else."""

    def __init__(self, shape, strides):
        self.shape, self._strides = shape, strides

    def stride(self, i):
        return self._strides[i]


@pytest.mark.parametrize("dims, shape, strides, fits", [
    # dense [B, Hkv, L, d] from a (batch, head) base: one head's keys, whatever B and Hkv
    ((2,), (64, 32, 2**24 - 1, 128), (2**36, 2**31, 128, 1), True),
    ((2,), (1, 1, 2**24, 128), (2**31, 2**31, 128, 1), False),
    # a token-major view [B, L, Hkv, d].transpose(1, 2): key stride Hkv x d
    ((2,), (1, 32, 2**19 + 1, 128), (2**31, 128, 32 * 128, 1), False),
    ((2,), (1, 32, 2**19, 128), (2**31, 128, 32 * 128, 1), True),
    # paged [num_pages, page_size, Hkv, d] from a head's base: every page
    ((0, 1), (2**14, 16, 8, 128), (16 * 8 * 128, 8 * 128, 128, 1), True),
    ((0, 1), (2**17, 16, 8, 128), (16 * 8 * 128, 8 * 128, 128, 1), True),
    ((0, 1), (2**17 + 1, 16, 8, 128), (16 * 8 * 128, 8 * 128, 128, 1), False),
])
def test_int32_offsets_only_where_every_offset_fits(dims, shape, strides, fits):
    # the largest offset is sum((size - 1) x stride) over the walked dims, + d; it must stay below 2**31
    t = _Shape(shape, strides)
    assert plan_mod._offsets_fit_int32(t, t, dims) is fits
    small = _Shape((1, 1, 16, 128), (2048, 2048, 128, 1))
    assert plan_mod._offsets_fit_int32(small, t, dims) is fits  # the larger of K and V decides


@pytest.mark.parametrize("layout", ["dense", "paged", "chunk-table"])
def test_int32_and_int64_offsets_give_the_same_bits(layout):
    # OFF32 (plan-checked) only narrows the offset arithmetic: both widths read the same keys
    gen = torch.Generator().manual_seed(5)
    B, Hkv, G, d = 3, 2, 4, 64
    L = 5 * heuristics._block_config(16)["BLOCK_N"]  # whole pages (16 here, 128 on a GPU): the chunk's table
    nq = 3 if layout == "chunk-table" else 1
    q = torch.randn(B, G * Hkv, nq, d, generator=gen).half().to(DEVICE)
    _, k, v = make_inputs(B, G * Hkv, Hkv, L, d, torch.float16, seed=6)
    lens = torch.tensor([L, 20, 0], dtype=torch.int32)
    args = (q, k, v, lens.to(DEVICE))
    if layout == "paged":
        _, _, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, 16, gen, shared_prefix_pages=1)
        args = (q, kp, vp, lens.to(DEVICE), table)
    plan = decode.decode_plan(*args, num_splits=2, check_seqlens=False)
    assert plan._consts["OFF32"] and (plan.table is not None) == (layout == "chunk-table")
    cfg = dict(heuristics._block_config(16, 16 if layout == "paged" else 0), OFF32=False)
    if layout == "chunk-table":
        cfg["BLOCK_N"] = plan._consts["BLOCK_N"]
    wide = plan_mod._tuned_plan(*args, num_splits=2, check_seqlens=False, config=cfg)
    assert not wide._consts["OFF32"]
    assert torch.equal(plan.run(*args), wide.run(*args))


@pytest.mark.parametrize("paged", (False, True))
@pytest.mark.parametrize("nq, num_splits", [(1, 1), (1, 3), (4, 2)])
def test_keys_past_the_length_are_never_read(paged, nq, num_splits):
    # Every K and V element at or past a sequence's length is NaN (the unused tail of its last page, the
    # rest of a dense cache): the loop loads only keys inside its range (rows past it repeat the last
    # one), so the output is the reference's and finite, at lengths that do not divide a block or a page
    gen = torch.Generator().manual_seed(11 + nq + num_splits)
    B, Hkv, G, d, L = 3, 2, 2, 64, 90
    q = torch.randn(B, G * Hkv, nq, d, generator=gen).half().to(DEVICE)
    _, k, v = make_inputs(B, G * Hkv, Hkv, L, d, torch.float16, seed=12)
    lens = torch.tensor([37, L, 5], dtype=torch.int32)
    past = torch.arange(L)[None, None, :] >= lens[:, None, None]  # [B, 1, L]
    k, v = (t.cpu().masked_fill(past[..., None], float("nan")) for t in (k, v))
    if paged:
        k, v, kc, vc, table = to_paged(k, v, lens, 16, gen)
    else:
        kc, vc, table = k.to(DEVICE), v.to(DEVICE), None
    with poisoned_empty():
        o, lse = flash_decode(q, kc, vc, lens.to(DEVICE), num_splits=num_splits, return_lse=True,
                              block_table=table)
    check_chunk(o, lse, q, k, v, lens, paged=(kc, vc, table) if paged else None)


@pytest.mark.parametrize("scale", [2e4, 1e37, 2.3e38])
@pytest.mark.parametrize("nq, paged, use_dot", [(1, False, None), (1, True, None), (3, False, None),
                                                (1, False, False)])
def test_huge_scale_is_finite_and_matches_float64(scale, nq, paged, use_dot):
    """Past `heuristics.RAW_SCORES_ABOVE` the running max keeps raw scores and the plan runs one split: a huge
    scale gives the row arg-max, finite output and an LSE that is +inf only where the true one passes fp32
    (scale 1e37 gave NaN rows when the kernel scaled the scores before the max)."""
    gen = torch.Generator().manual_seed(nq + 2 * paged)
    B, Hkv, group, d, L = 2, 2, 2, 64, 45
    q, k, v = make_inputs(B, group * Hkv, Hkv, L, d, torch.float16, seed=nq)
    q = torch.randn(B, group * Hkv, nq, d, generator=gen).to(torch.float16).to(DEVICE)
    lens = torch.tensor([L, 21], dtype=torch.int32)
    table = None
    if paged:
        k, v, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, 16, gen, shared_prefix_pages=0)
        kc, vc = kp, vp
    else:
        kc, vc = k, v
    plan = plan_mod._tuned_plan(q, kc, vc, lens.to(DEVICE), table, scale=scale, return_lse=True,
                                use_dot=use_dot)
    assert plan.num_splits == 1 and plan._consts["MAX_UNSCALED"] is True
    o, lse = plan.run(q, kc, vc, lens.to(DEVICE), table)
    assert torch.isfinite(o).all()
    ref_o, ref_lse = reference_chunk(q, k, v, lens, scale)
    assert (o.double().cpu() - ref_o).abs().max().item() < 1e-3
    lse_np, rlse = lse.double().cpu().numpy(), ref_lse.numpy()
    fits = np.abs(rlse) < 1e38  # representable in fp32: relative error small; beyond: +inf
    assert np.all(np.abs(lse_np[fits] - rlse[fits]) <= 1e-5 * np.abs(rlse[fits]) + 1e-4)
    assert np.all(np.isposinf(lse_np[~fits]) | (np.abs(lse_np[~fits] - rlse[~fits]) <= 1e-5 * rlse[~fits]))


def test_ordinary_scales_keep_the_scaled_running_max_and_the_split_heuristic():
    q, k, v = make_inputs(1, 8, 2, 4000, 64, torch.float16, seed=5)
    for scale in (None, 1.0, 0.999 * heuristics.RAW_SCORES_ABOVE / heuristics.LOG2E):  # just below the bound
        plan = decode.decode_plan(q, k, v, scale=scale)
        assert "MAX_UNSCALED" not in plan._consts  # the launch passes what it did before the raw path
    assert decode.decode_plan(q, k, v, scale=2 * heuristics.RAW_SCORES_ABOVE).num_splits == 1
    with pytest.raises(InputError, match=r"num_splits: expected 1 or None with scale above 6931 \(raw-score "
                                         r"softmax, one split\), got 4"):
        flash_decode(q, k, v, num_splits=4, scale=1e37)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_gpu_decode_under_compiled_cuda_graphs_keeps_nothing_in_the_graph_pool(monkeypatch):
    # torch.compile's CUDA graphs warm the compiled code up with this thread's allocations routed to the
    # graph's pool, and refuse a pool that holds tensors it does not own: the plan a first call makes (its
    # split buffers) and the error word are kept past the call, so they are allocated outside the pool
    # (`_common.kept_allocation`); without that the second call raised "not tracked as outputs"
    monkeypatch.setattr(_common, "_DEVICE_ERROR_FLAGS", {})  # the first decode call in this process
    decode.clear_plan_cache()
    B, Hq, Hkv, L, d = 2, 32, 8, 3000, 128
    _, k, v = make_inputs(B, Hq, Hkv, L, d, torch.bfloat16, seed=5)
    k, v = k.to(DEVICE), v.to(DEVICE)
    lens = torch.tensor([L, 1777], dtype=torch.int32, device=DEVICE)
    step = torch.compile(lambda q: attnscope.flash_decode(q, k, v, cache_seqlens=lens, return_lse=True),
                         mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator().manual_seed(6)
    for _ in range(4):  # warm-up, recording, replays
        q = torch.randn(B, Hq, 1, d, generator=gen).to(torch.bfloat16).to(DEVICE)
        o, lse = (t.clone() for t in step(q))
        check_chunk(o, lse, q, k.cpu(), v.cpu(), lens.cpu())
    assert decode.plan_cache_info().size >= 1  # the warm-up's plan, kept
    attnscope.check_errors()


def test_plan_cache_keeps_no_tensor_of_a_call():
    """`flash_decode` keeps a layout's plans and facts past the call, but no tensor the call was given (q,
    the cache, the lengths, the sinks): each is freed when the caller drops it. (A kept sinks tensor that
    torch.compile's CUDA-graph warm-up allocated sits in the graph's pool, which then refuses to record.)"""
    import gc
    import weakref

    decode.clear_plan_cache()
    B, Hq, Hkv, L, d = 2, 4, 2, 40, 64
    q, k, v = (t.to(DEVICE) for t in make_inputs(B, Hq, Hkv, L, d, torch.bfloat16, seed=7))
    lens = torch.tensor([L, 17], dtype=torch.int32, device=DEVICE)
    sinks = torch.randn(Hq, device=DEVICE)
    refs = [weakref.ref(t) for t in (q, k, v, lens, sinks)]
    for _ in range(2):  # the plan built, then the cached plan's launch
        attnscope.flash_decode(q, k, v, cache_seqlens=lens, sinks=sinks, window=(16, 0))
    assert decode.plan_cache_info().size >= 1
    del q, k, v, lens, sinks
    gc.collect()
    assert [r() is None for r in refs] == [True] * 5
