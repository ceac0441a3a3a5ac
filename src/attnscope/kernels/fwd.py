"""FlashAttention-2 forward (prefill) in Triton: the portable kernel (any sm_80+ GPU, and the CPU tests).

Algorithm: Dao, *FlashAttention-2*, arXiv:2307.08691, Algorithm 1 and §3.1.1. One program per
(query tile, batch x query head); Q tile in registers, K/V tiles streamed through shared memory; the
online softmax keeps the running max ``m_i``, normaliser ``l_i`` and unnormalised accumulator ``acc``
on chip (the names of `attnscope.reference` and spec §3); one division at the end.

Causal attention runs the KV loop in two stages (spec §2.1): tiles ``[0, lo)`` are permitted for every
row of the query tile and run without mask arithmetic; tiles ``[lo, hi)`` straddle the diagonal (or are
the ragged last tile) and are masked *before* the running max sees the scores; tiles ``[hi, Nk)`` are
skipped. ``lo``/``hi`` are the closed forms of `attnscope.model.tiles.Grid.kv_bounds`, recomputed
in-kernel (`tests/test_fwd.py` holds the two against each other). Alignment is bottom-right: key c is
visible to query r iff ``c <= r + (Nk - Nq)``; rows with no visible key give 0 and LSE = -inf.

Score mods (`_common.check_mods`' contract), constexpr-gated so the kernel without them is unchanged: a
sliding window (``WINDOW``) runs the unmasked tiles, then the left- and right-masked ones in one loop,
between the bounds of `_tl._kv_bounds_window` (`model.tiles.window_kv_bounds0`; tiles outside are never
loaded); softcap (``SOFTCAP``) caps the scores with tanh before the online softmax; sinks (``HAS_SINKS``) join
the final normalisation in base 2 (``m = max(m, sink log2 e)``), so the LSE includes them.

Layout: q, o ``[B, Hq, Nq, d]``, k, v ``[B, Hkv, Nk, d]``, any strides with a unit last stride (e.g. a
transposed ``[B, N, H, d]`` buffer), moved by host-built 4-D TMA tensor descriptors: out-of-bounds rows
of ragged tiles read as 0 and are not written back. Softmax in base 2 with log2(e) folded into the
scale (one FMA per score). Causal query tiles launch heaviest first, the last heads interleaved rank by
rank (`model.tiles.launch_tail`, `_tl.cta_tile`).

Block configurations come from a measured table (`CONFIG_TABLE`), not runtime autotuning: one compile
per variant, no timing sweep; ``config=FwdConfig(...)`` overrides it. `launch` returns the compiled kernel.
Host path: the first call of a layout (shapes, strides, dtypes, devices, flags) is checked and leaves a
launch plan (`_plan_key`, `PLAN_CACHE_SIZE`); a later call of it allocates the output and, on a GPU, calls the
launcher of the binary Triton's first launch picked (`_direct.DirectLaunch`), not Triton's dispatch.
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

from attnscope.errors import InputError, choice, expect, is_int
from attnscope.kernels import _common
from attnscope.kernels._common import (
    HOPPER_MAX_SOFTCAP,
    LOG2E,
    MAX_GRID_Y,
    built_dim,
    check_device,
    check_flags,
    check_head_dim,
    check_mods,
    check_same,
    check_scale,
    check_softcap,
    check_tensor,
    descriptor_over,
    descriptor_template,
    fitting,
    head_block,
    hopper_unavailable,
    import_torch_triton,
    interpreting,
    kept_allocation,
    num_sms,
    on_tensor_device,
    smem_per_block,
)
from attnscope.model import dispatch
from attnscope.model.tiles import cdiv, launch_tail

torch, triton = import_torch_triton()  # kernels/ is the optional extra: ImportError names the install command
Tensor = torch.Tensor
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from attnscope.kernels._direct import planned_launch  # noqa: E402
from attnscope.kernels._tl import (  # noqa: E402
    _kv_bounds,
    _kv_bounds_window,
    cta_tile,
    mod_args,
    round_bf16,
    sink_log2,
    softmax_tile,
)

LN2 = tl.constexpr(0.6931471805599453)  # ln(2): natural-log LSE from the base-2 running max


class FwdConfig(NamedTuple):
    """One block configuration of the portable forward kernel."""

    BLOCK_M: int  # query rows per program
    BLOCK_N: int  # key/value rows per loop iteration
    num_warps: int
    num_stages: int  # software-pipelining depth of the KV loop


#: Measured config table (`bench/tune.py prefill`; BENCHMARKS.md): (head_dim, causal, largest max(Nq, Nk)
#: the row covers or None = any) -> config, first matching row wins; fp16 and bf16 alike.
CONFIG_TABLE = (
    (128, False, None, FwdConfig(128, 64, 4, 2)),
    (128, True, None, FwdConfig(128, 64, 4, 2)),
    (64, False, None, FwdConfig(128, 128, 4, 3)),
    (64, True, None, FwdConfig(128, 64, 4, 3)),
    # d = 256: twice d = 128's warps for the 128 x 256 fp32 accumulator (`bench/tune.py prefill --d 256`,
    # H200: 492-543 TFLOP/s against 340 with 32 keys per tile); 193 KiB of shared memory (`SMEM_NEEDS`)
    (256, False, None, FwdConfig(128, 64, 8, 2)),
    (256, True, None, FwdConfig(128, 64, 8, 2)),
)
#: table config -> (its shared memory, compiled for sm_90, bytes; the config run on a device that offers a
#: block less, e.g. an A100's 163 KiB: 128 KiB with 32 keys per tile); `_common.fitting`
SMEM_NEEDS = {FwdConfig(128, 64, 8, 2): (197632, FwdConfig(128, 32, 8, 2))}
#: Sliding windows short enough for the portable kernel (`dispatch.portable_window`), head dim -> config, in
#: place of the table's (`pick_config`): 64-row query tiles halve the masked work at the window's edges and
#: a short KV loop's fixed cost per tile. H200, bf16: d = 64 (causal W = 1k, N = 8k, 36 configs): 0.737 ms
#: against 0.817 for the table's 128 x 64, 3 stages, 1.01-1.27 x the table's at W = 256-8k (bench/results/
#: h200-2026-12-04-window-rule.json); d = 128, 3 stages: 1.02-1.12 x the table's 128 x 64 at widths 129-513,
#: 0.99 x at 769 (bench/results/h200-2026-12-04c-window-d128.json); ptxas: 157 registers, no spills, against
#: the table config's 255 with 100-124 B spilled (bench/sm90_resources.py --kernel fwd).
WINDOW_CONFIGS = {64: FwdConfig(64, 64, 4, 2), 128: FwdConfig(64, 64, 4, 3)}
#: Interpreter: small tiles keep CPU tests fast and still cover multi-tile, ragged and diagonal paths.
INTERPRETER_CONFIG = FwdConfig(32, 16, 4, 1)


IMPLS = ("auto", "portable", "hopper")


def _hopper_possible(q) -> str | None:
    """None when the Gluon Hopper kernel can run on ``q``'s device, else the reason it cannot."""
    return hopper_unavailable(torch, q)


def pick_config(d: int, causal: bool, n: int, smem: int | None = None,
                narrow_window: bool = False) -> FwdConfig:
    """The table's config for head dim ``d``, ``causal``, ``n = max(Nq, Nk)`` (interpreter: a small one;
    ``narrow_window``, a window `dispatch.portable_window` takes: `WINDOW_CONFIGS`' where it has ``d``), or
    its `SMEM_NEEDS` fallback on a device with ``smem`` bytes of shared memory per block
    (`smem_per_block`)."""
    if interpreting():
        return INTERPRETER_CONFIG
    d = built_dim(d, {row[0] for row in CONFIG_TABLE})
    if narrow_window and d in WINDOW_CONFIGS:
        return fitting(WINDOW_CONFIGS[d], SMEM_NEEDS, smem)
    for td, tc, n_max, cfg in CONFIG_TABLE:
        if td == d and tc == causal and (n_max is None or n <= n_max):
            return fitting(cfg, SMEM_NEEDS, smem)
    raise NotImplementedError(f"head_dim {d}: no measured config; supported: "
                              f"{sorted({row[0] for row in CONFIG_TABLE})}")


@triton.jit
def _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale, NQ, NK, LEFT, RIGHT,
               cap_in, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
               MAX_UNSCALED: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """One KV tile of the online softmax (spec §3.1), FA-2 unnormalised form; returns (acc, l_i, m_i).

    ``m_i`` is the running max in log2 units (scores x ``qk_scale``), except with ``MAX_UNSCALED``
    (``qk_scale > 1``): then it is of the raw scores (`_tl.softmax_tile`, which does the step).
    ``WINDOW``: the masked tiles keep keys ``r + off - LEFT <= c <= r + off + RIGHT``; ``SOFTCAP``: the
    scores are capped (``tanh(s * cap_in)`` with ``qk_scale = softcap * log2(e)``).
    """
    k = desc_k.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    # [BLOCK_M, BLOCK_N] scores in fp32, never leave the SM (fp32 operands: interpreter + bf16 only)
    s = tl.dot(q.to(tl.float32), k.to(tl.float32).T) if EMULATE_BF16 else tl.dot(q, k.T)
    keep = None
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keep = offs_n[None, :] < NK  # ragged last tile: columns past Nk
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + (NK - NQ))  # bottom-right diagonal
        if WINDOW:
            rel = offs_n[None, :] - (offs_m[:, None] + (NK - NQ))  # key minus the row's diagonal key
            keep = keep & (rel >= -LEFT) & (rel <= RIGHT)
    p, m_new, l_i, acc = softmax_tile(s, keep, m_i, l_i, acc, qk_scale, MASKED, MAX_UNSCALED, SOFTCAP, cap_in)
    m_i = m_new
    if WINDOW and MASKED:  # a row with no key yet keeps max -inf, not softmax_tile's 0: a later tile's
        m_i = tl.where(l_i == 0.0, float("-inf"), m_i)  # max must not be floored at 0 (underflow of p)
    v = desc_v.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    # P goes to the second matmul in the input dtype, as FA-2 and SDPA do
    acc = tl.dot(round_bf16(p), v.to(tl.float32), acc) if EMULATE_BF16 else tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["B", "H", "HKV", "NQ", "NK", "qk_scale", "LEFT", "RIGHT", "cap_in", "TAIL"])
def _attnscope_fwd_kernel(
    desc_q, desc_k, desc_v, desc_o, LSE, SINKS,
    B, H, HKV, NQ, NK, qk_scale, LEFT, RIGHT, cap_in, TAIL,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MAX_UNSCALED: tl.constexpr, EMULATE_BF16: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    if CAUSAL:  # rank 0 the heaviest query tile, the last heads interleaved (`_tl.cta_tile`)
        start_m, pid_bh = cta_tile(TAIL)
        start_m = tl.num_programs(0) - 1 - start_m
    else:
        start_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // HKV)  # GQA: query heads h share kv head h // group

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # 0-based query rows of this tile
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (see _attn_tile for its units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running normaliser
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # unnormalised output
    q = desc_q.load([b, h, start_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)

    if WINDOW:
        # keys [full_lo, full_hi) unmasked first, then the masked ones, [lo, full_lo) and [full_hi, hi), in
        # one loop (two tile bodies, as without a window); the rest are never loaded
        lo, full_lo, full_hi, hi = _kv_bounds_window(start_m, NQ, NK, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        for start_n in tl.range(full_lo, full_hi, BLOCK_N):
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale,
                                       NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, False, False, True,
                                       SOFTCAP, MAX_UNSCALED, EMULATE_BF16)
        n_left = full_lo - lo
        for i in tl.range(0, n_left + (hi - full_hi), BLOCK_N):
            start_n = tl.where(i < n_left, lo + i, full_hi + (i - n_left))
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale,
                                       NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, True, False, True,
                                       SOFTCAP, MAX_UNSCALED, EMULATE_BF16)
    else:
        lo, hi = _kv_bounds(start_m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)
        # Stage 1: tiles every row may see entirely: no mask arithmetic.
        for start_n in tl.range(0, lo, BLOCK_N):
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale,
                                       NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, False, CAUSAL, False,
                                       SOFTCAP, MAX_UNSCALED, EMULATE_BF16)
        # Stage 2: diagonal tiles and the ragged last tile: masked before the max.
        for start_n in tl.range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale,
                                       NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, True, CAUSAL, False,
                                       SOFTCAP, MAX_UNSCALED, EMULATE_BF16)

    m_log2 = m_i * qk_scale if MAX_UNSCALED else m_i
    if HAS_SINKS:
        # the sink joins the denominator only: m = max(m, sink2), l = l 2^(m_old - m) + 2^(sink2 - m)
        sink2 = sink_log2(tl.load(SINKS + h))  # finite: an inf or NaN sink is clamped
        m_row = tl.where(l_i == 0.0, float("-inf"), m_log2)  # a row with no key yet: the sink alone
        m_new = tl.maximum(m_row, sink2)
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.where(m_row == m_new, 1.0, tl.math.exp2(m_row - m_new))
        acc = acc * alpha[:, None]
        l_i = l_i * alpha + tl.math.exp2(sink2 - m_new)
        m_log2 = m_new
    # Epilogue: one division per row; empty rows (no visible key) give 0 and LSE = -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if EMULATE_BF16:
        o = round_bf16(o)
    desc_o.store([b, h, start_m * BLOCK_M, 0], o.to(desc_o.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    if STORE_LSE:
        lse = m_log2 * LN2 + tl.log(l_i)  # natural log; -inf + -inf = -inf for empty rows
        tl.store(LSE + pid_bh * NQ + offs_m, lse, mask=offs_m < NQ)


def _check_flags(causal, scale, return_lse) -> None:
    """The non-tensor arguments: real bools, and a finite positive real scale (not a bool)."""
    check_flags(causal=causal, return_lse=return_lse)
    check_scale(scale)


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(torch, name, t, 4, "[B, Hq, Nq, d]" if name == "q" else "[B, Hkv, Nk, d]")
    check_device({"q": q, "k": k, "v": v})
    B, Hq, Nq, d = q.shape
    for name, t in (("k", k), ("v", v)):
        check_same(name, "batch", B, t.shape[0])
        check_same(name, "head_dim", d, t.shape[3])
        check_same(name, "dtype (as q)", q.dtype, t.dtype)
    check_same("v", "shape (as k)", tuple(k.shape), tuple(v.shape))
    Hkv, Nk = k.shape[1], k.shape[2]
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"q: expected the number of query heads to be a multiple of the kv heads ({Hkv}), "
                         f"got Hq = {Hq}")
    for name, t, what, size in (("q", q, "Nq", Nq), ("k", k, "Nk", Nk), ("q", q, "B >= 1 and Hq", B * Hq)):
        if size == 0:
            raise InputError(f"{name}: expected {what} >= 1, got shape {tuple(t.shape)}")
    check_head_dim(d, padded=True)
    return B, Hq, Nq, d, Hkv, Nk


def _check_aligned(q, k, v):
    """TMA: every stride but the last a multiple of 16 bytes, the base 16-byte aligned. Apart from
    `_check_inputs`: torch.compile cannot trace ``storage_offset`` (the op checks it when it runs)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if any((s * t.element_size()) % 16 for s in (*t.stride()[:3], t.storage_offset())):
            raise NotImplementedError(
                f"{name}: strides {tuple(t.stride())} / base address are not 16-byte aligned; supported: "
                f"tensors whose strides (in elements) are multiples of {16 // t.element_size()} "
                f"(any contiguous tensor or transposed view of one)")


def _check_config(config) -> FwdConfig:
    if config is None:
        return None
    try:
        cfg = FwdConfig(*config)
    except TypeError:
        raise InputError(f"config: expected FwdConfig(BLOCK_M, BLOCK_N, num_warps, num_stages), "
                         f"got {config!r}") from None
    ints = all(is_int(x) for x in cfg)
    pow2 = ints and all(x >= 1 and not x & (x - 1) for x in (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps))
    expect(pow2 and 16 <= cfg.BLOCK_M <= 256 and 16 <= cfg.BLOCK_N <= 256 and 1 <= cfg.num_stages <= 8,
           "config",
           "powers of two BLOCK_M, BLOCK_N in [16, 256], num_warps, and num_stages in [1, 8]", tuple(cfg))
    return cfg


def _pick_impl(impl, q, causal, qk_scale, cfg, k, mods=None) -> str:
    """"portable", or the `fwd_hopper.VARIANTS` name to run: ``impl="hopper"`` its default variant, a
    variant's name that variant, ``impl="auto"`` on sm_90 the variant of `model.dispatch.hopper_variant`,
    else portable (both kernels carry the score mods)."""
    if impl not in dispatch.VARIANTS:
        choice("impl", impl, IMPLS)
    huge_cap = mods is not None and mods.softcap > HOPPER_MAX_SOFTCAP * (qk_scale / LOG2E)
    if impl == "hopper" or impl in dispatch.VARIANTS:
        if why := _hopper_possible(q):
            raise NotImplementedError(f"impl={impl!r}: {why}; supported elsewhere: impl='portable'")
        if qk_scale > 1.0:
            raise NotImplementedError(f"impl={impl!r}: scale * log2(e) > 1 is not supported; "
                                      "supported: impl='portable' (any finite scale)")
        if huge_cap:
            raise NotImplementedError("impl='hopper': softcap / scale > 2^60 is not supported; supported: "
                                      "impl='portable' (any softcap)")
        if cfg is not None:
            raise InputError(f"config: applies to impl='portable' only, got impl={impl!r}")
        return dispatch.DEFAULT_VARIANT if impl == "hopper" else impl
    if impl == "auto" and cfg is None and qk_scale <= 1.0 and not huge_cap and _hopper_possible(q) is None:
        (B, Hq, Nq, d), (Hkv, Nk) = q.shape, k.shape[1:3]
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        window = (mods.left, mods.right) if mods is not None and mods.windowed else None
        return dispatch.hopper_variant(d, causal, B, Hq, Hkv, Nq, Nk, sms, window) or "portable"
    return "portable"


def _portable_launcher(q, k, v, o, cfg: FwdConfig, causal: bool, return_lse: bool, sm_scale: float, mods):
    """``run(q, k, v, o, lse, sinks=None)``: the portable kernel on tensors of these layouts (shapes, strides,
    dtype), its grid, constexprs and scalars fixed once (`_plan`); launched by `_direct.planned_launch`."""
    (B, Hq, Nq, d), (Hkv, Nk) = q.shape, k.shape[1:3]
    bm, bn, num_warps, num_stages = cfg
    margs = mod_args(mods, sm_scale, Nq, Nk)
    # host-built 4-D TMA descriptors (no device scratch, no allocator), head_block(d) columns wide: past d
    # they read zeros (no term of Q K^T or P V) and clip O's store
    dp = head_block(d)
    descs = [descriptor_template(TensorDescriptor, t, [1, 1, rows, dp])
             for t, rows in ((q, bm), (k, bn), (v, bn), (o, bm))]
    tail = launch_tail(causal and not mods.windowed, cdiv(Nq, bm), B * Hq, num_sms(torch, q.device))
    scalars = (B, Hq, Hkv, Nq, Nk, margs["qk_scale"], margs["LEFT"], margs["RIGHT"], margs["cap_in"], tail)
    consts = dict(
        HEAD_DIM=dp, CAUSAL=causal and not mods.windowed,  # a window folds causal in as right = 0
        STORE_LSE=return_lse, BLOCK_M=bm, BLOCK_N=bn,
        MAX_UNSCALED=margs["qk_scale"] > 1.0 and not margs["SOFTCAP"],  # see _attn_tile: huge scales
        EMULATE_BF16=interpreting() and q.dtype == torch.bfloat16,
        WINDOW=margs["WINDOW"], SOFTCAP=margs["SOFTCAP"], HAS_SINKS=mods.sinks is not None,
        num_warps=num_warps, num_stages=num_stages)
    # T_r query tiles x (batch, head)
    launch = planned_launch(_attnscope_fwd_kernel, (cdiv(Nq, bm), B * Hq), consts, q.device)

    def run(q, k, v, o, lse, sinks=None):
        s = lse if sinks is None else sinks
        # the binary's key: the descriptors' dtypes and blocks (fixed) and the pointers' 16-byte alignment
        return launch((*map(descriptor_over, descs, (q, k, v, o)), lse, s, *scalars),
                      (lse.data_ptr() | s.data_ptr()) % 16 == 0)
    return run


class _Plan(NamedTuple):
    """The launch of one call layout (`_plan_key`): output shapes and the kernel's ``run(q, k, v, o, lse,
    sinks)`` with grid, constexprs and scalars fixed. It holds no user tensor."""

    o_shape: tuple
    o_stride: tuple  # q's layout (`_out_like`)
    lse_shape: tuple  # (1,) without return_lse: a placeholder the kernel never touches
    dtype: object
    device: object
    run: object
    placeholder: object  # a 1-element float32 tensor: the LSE argument of a call that drops the LSE


#: Plans of the most recent call layouts, at most `PLAN_CACHE_SIZE` (the oldest dropped first): a call whose
#: layout was planned skips the input checks, the dispatch rule and the argument packing (`launch`).
PLAN_CACHE_SIZE = 64
_PLANS: dict = {}
_PLANS_LOCK = threading.Lock()


def _plan_key(q, k, v, causal, scale, return_lse, config, impl, window, softcap, sinks, bnhd=False):
    """All a plan depends on: the shapes, strides, dtypes and devices of q, k, v (and sinks), and the flags
    and options with their types (``scale=1`` and ``scale=1.0`` are two keys), and whether q, k, v are
    given as [B, N, H, d] (``bnhd``, `_launch`); None when the checks must see the call (a flag that is not a
    bool, an input that is not a tensor, a base address not 16-byte aligned). Raises TypeError for an
    unhashable option."""
    if type(causal) is not bool or type(return_lse) is not bool or not (
            isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)) or (
            (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15):
        return None
    if sinks is not None:
        if not isinstance(sinks, Tensor):
            return None
        sinks = (sinks.shape, sinks.stride(), sinks.dtype, sinks.device)
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape,
           v.stride(), v.dtype, v.device, causal, return_lse, scale, type(scale), impl, softcap,
           type(softcap), sinks, bnhd)
    if config is not None or window is not None:  # 1.0 == 1: the checks refuse a float block size or side
        key += (config, window, *(tuple(map(type, x)) for x in (config, window) if x is not None))
    if q.device.type != "cuda":  # CPU tensors run under the interpreter only
        key += (_common.interpreting(),)
    return key


#: Largest grid y (CUDA's limit): the portable and the one-CTA-per-tile Hopper kernels launch B x Hq there.


def _refuse_grid(B: int, Hq: int, chosen: str):
    raise NotImplementedError(
        f"q: B x Hq = {B} x {Hq} = {B * Hq} (batch, head) programs is past the launch grid's {MAX_GRID_Y} "
        f"for impl {chosen!r}; supported: B x Hq <= {MAX_GRID_Y}, or on sm_90 impl='hopper' (its persistent "
        f"kernel's grid is one SM each)")


def _out_like(q, device=None):
    """The output [B, Hq, Nq, d] in q's layout: flash-attn's [B, N, H, d] memory order when q is a transposed
    view of it (as transformers passes q), so the caller's ``transpose(1, 2)`` back is contiguous, no copy
    (``torch.empty_like``'s rule: dense strides in the order of q's)."""
    return torch.empty_like(q, device=device if device is not None else q.device)


def _check_layout_and_mods(q, k, v, causal, scale, window, softcap, sinks):
    """`_plan`'s checks of the tensors and the score mods; torch.compile's trace runs them too, so a bad
    one raises its own error there, not inside the compiler's trace of the backward. Returns
    ``((B, Hq, Nq, d, Hkv, Nk), mods, sm_scale)``."""
    dims = _check_inputs(q, k, v)
    mods = check_mods(torch, causal, window, softcap, sinks, dims[1], q.device)
    sm_scale = scale if scale is not None else 1.0 / math.sqrt(dims[3])
    if mods.softcap:
        check_softcap(mods.softcap, sm_scale)
    return dims, mods, sm_scale


def _plan(q, k, v, causal, scale, return_lse, config, impl, window, softcap, sinks) -> _Plan:
    """Check the call (every documented error) and plan its launch."""
    _check_flags(causal, scale, return_lse)
    cfg = _check_config(config)
    (B, Hq, Nq, d, Hkv, Nk), mods, sm_scale = _check_layout_and_mods(q, k, v, causal, scale, window, softcap,
                                                                     sinks)
    _check_aligned(q, k, v)
    qk_scale = sm_scale * LOG2E
    chosen = _pick_impl(impl, q, causal, qk_scale, cfg, k, mods)
    o = _out_like(q, "meta")  # the output's layout
    if chosen != "portable":  # a fwd_hopper.VARIANTS name
        from attnscope.kernels import fwd_hopper  # Gluon: imported only when used

        if B * Hq > MAX_GRID_Y and not fwd_hopper.VARIANTS[chosen].persistent:
            _refuse_grid(B, Hq, chosen)
        run = fwd_hopper.launcher(q, k, v, o, qk_scale, causal, return_lse, chosen, mods)
    else:
        if B * Hq > MAX_GRID_Y:
            _refuse_grid(B, Hq, chosen)
        narrow = mods.windowed and dispatch.portable_window(d, (mods.left, mods.right), Nq, Nk, causal)
        cfg = cfg or pick_config(head_block(d), causal or mods.windowed, max(Nq, Nk),
                                 smem_per_block(torch, q), narrow)
        run = _portable_launcher(q, k, v, o, cfg, causal, return_lse, sm_scale, mods)
    return _Plan((B, Hq, Nq, d), o.stride(), (B, Hq, Nq) if return_lse else (1,), q.dtype, q.device, run,
                 torch.empty((1,), dtype=torch.float32, device=q.device))


def _plan_bnhd(q, k, v, *options) -> _Plan:
    """`_plan` of the [B, H, N, d] views of flash-attn's q [B, Nq, Hq, d], k, v [B, Nk, Hkv, d], its output
    [B, Nq, Hq, d]: the same memory as the views' output (`_out_like`), so its ``run`` takes the
    [B, N, H, d] tensors as they are (it reads only their addresses: the descriptors' layouts are the
    views')."""
    plan = _plan(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), *options)
    (B, Hq, Nq, d), st = plan.o_shape, plan.o_stride
    return plan._replace(o_shape=(B, Nq, Hq, d), o_stride=(st[0], st[2], st[1], st[3]))


@on_tensor_device(torch)
def _launch(q, k, v, causal, scale, return_lse, config, impl, window, softcap, sinks, placeholder_lse,
            bnhd=False):
    """`launch`; ``placeholder_lse``: without ``return_lse``, pass the plan's placeholder, not a fresh LSE
    (the caller drops it). ``bnhd``: q, k, v and o are flash-attn's [B, N, H, d] (the kernel runs on their
    [B, H, N, d] views, which a planned layout never makes: `_plan_bnhd`); the LSE is [B, Hq, Nq] either
    way."""
    try:
        key = _plan_key(q, k, v, causal, scale, return_lse, config, impl, window, softcap, sinks, bnhd)
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable option: the checks name it
        key = plan = None
    if plan is None:
        def build():
            return (_plan_bnhd if bnhd else _plan)(q, k, v, causal, scale, return_lse, config, impl, window,
                                                   softcap, sinks)
        # a kept plan's placeholder LSE outside any CUDA-graph pool (`kept_allocation`)
        plan = build() if key is None else kept_allocation(torch, q.device, build)
        if key is not None:
            with _PLANS_LOCK:
                _PLANS[key] = plan
                if len(_PLANS) > PLAN_CACHE_SIZE:
                    del _PLANS[next(iter(_PLANS))]
    o = torch.empty_strided(plan.o_shape, plan.o_stride, dtype=plan.dtype, device=plan.device)
    if placeholder_lse and not return_lse:
        lse = plan.placeholder
    else:
        lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=plan.device)
    return o, lse, plan.run(q, k, v, o, lse, sinks)


def clear_plan_cache() -> None:
    """Drop every launch plan `launch` kept (`PLAN_CACHE_SIZE`)."""
    with _PLANS_LOCK:
        _PLANS.clear()


def launch(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False,
           config: FwdConfig | None = None, impl: str = "auto", *, window=None, softcap: float = 0.0,
           sinks=None):
    """Check, allocate, launch; returns ``(o, lse, compiled)``.

    ``compiled`` is Triton's compiled kernel of this launch (``.n_regs``, ``.n_spills``,
    ``.metadata.shared``: what bench/sm90_resources.py reports). ``lse`` is a 1-element dummy
    unless ``return_lse``. Arguments as `flash_attention`. The first call of a layout (`_plan_key`: shapes,
    strides, dtypes, devices, flags, options) checks it and keeps its launch plan (`PLAN_CACHE_SIZE`); a
    later call of that layout allocates the outputs and launches.
    """
    return _launch(q, k, v, causal, scale, return_lse, config, impl, window, softcap, sinks, False)


# Registered at import (torch.compile cannot trace a registration): `attnscope::flash_attention`, so
# torch.compile sees one opaque op with a fake (shape-only) implementation instead of a graph break.
# ``deterministic`` is the backward's (kernels/bwd.py), kept here for autograd.
_SCHEMA = ("(Tensor q, Tensor k, Tensor v, bool causal, float scale, bool return_lse, int[]? config, "
           "str impl, int[]? window=None, float softcap=0.0, Tensor? sinks=None, bool deterministic=False) "
           "-> (Tensor, Tensor)")


@torch.library.custom_op("attnscope::flash_attention", mutates_args=(), schema=_SCHEMA)
def _op(q, k, v, causal, scale, return_lse, config, impl, window=None, softcap=0.0, sinks=None,
        deterministic=False):
    return launch(q, k, v, causal, scale, return_lse, None if config is None else tuple(config), impl,
                  window=None if window is None else tuple(window), softcap=softcap, sinks=sinks)[:2]


@_op.register_fake
def _(q, k, v, causal, scale, return_lse, config, impl, window=None, softcap=0.0, sinks=None,
      deterministic=False):
    return _out_like(q), q.new_empty(q.shape[:3] if return_lse else (1,), dtype=torch.float32)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: float | None = None,
                    return_lse: bool = False, config: FwdConfig | None = None, impl: str = "auto", *,
                    window: tuple[int, int] | None = None, softcap: float = 0.0, sinks: Tensor | None = None,
                    deterministic: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """FlashAttention-2 forward (differentiable: the backward is kernels/bwd.py).

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, Nq, d]
        Queries, fp16 or bf16, CUDA (or CPU under ``TRITON_INTERPRET=1``); any strides with a unit
        last stride (e.g. ``x.view(B, N, H, d).transpose(1, 2)`` works without a copy).
    k, v : torch.Tensor, [B, Hkv, Nk, d]
        Keys and values; ``Hq`` must be a multiple of ``Hkv`` (GQA / MQA).
    causal : bool
        Causal mask, bottom-right aligned: key c is visible to query r iff ``c <= r + (Nk - Nq)``
        (identical to SDPA's ``is_causal`` when Nq == Nk). Rows with no visible key give 0 and
        LSE = -inf.
    scale : float, optional
        Softmax scale, positive and at most ``_common.MAX_SCALE`` (about 2.36e38: ``scale * log2(e)``
        must fit in fp32); defaults to ``1/sqrt(d)``. Any such scale gives a finite output (a huge one
        tends to the arg-max row); the LSE is +inf where its true value exceeds fp32.
    return_lse : bool
        Also return the natural-log logsumexp of each row.
    config : FwdConfig, optional
        Block configuration ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` instead of the measured
        table's (`CONFIG_TABLE`); each distinct config compiles once per process.
    impl : {"auto", "portable", "hopper"}
        ``"portable"``: the Triton kernel of this module; ``"hopper"``: the Gluon sm_90 kernel with
        FlashAttention-3's warp-specialised schedule, its default (persistent) variant (kernels/fwd_hopper.py;
        needs an sm_90 GPU, ``scale * log2(e) <= 1`` and ``softcap <= 2^60 scale``); ``"auto"``: on sm_90,
        the Hopper variant `attnscope.model.dispatch.hopper_variant` picks from the launch geometry, else
        portable. A `fwd_hopper.VARIANTS` name (e.g. ``"hopper_wg3_pp"``) forces that variant: for
        benchmarks and tests, not a stable option.
    window : (left, right) or None
        Sliding window, flash-attn's ``window_size``: key c is visible to row r iff
        ``r + off - left <= c <= r + off + right`` (``off = Nk - Nq``; -1 = unbounded on that side;
        ``causal=True`` forces right = 0). KV tiles wholly outside the window are never loaded.
    softcap : float
        Logit cap, 0 = off: the scaled scores become ``softcap * tanh(s * scale / softcap)``. A cap whose
        fp32 arguments would overflow or underflow (`_common.check_softcap`) raises NotImplementedError.
    sinks : torch.Tensor, [Hq], float32, optional
        One logit per query head (natural-log units, neither scaled nor capped) in every row's softmax
        denominator with no value: a row with no visible key gives 0 and LSE = ``sinks[h]``. It receives a
        gradient when it requires one.
        The mods run on every kernel of the forward and the backward; on sm_90 the backward runs the Gluon
        Hopper kernels with any of them (`model.dispatch.hopper_backward_ok`).
    deterministic : bool, default False
        The backward's mode. True: dQ in a separate pass, no atomics, gradients bitwise identical run to
        run. False (the default): the faster mode where the two differ -- on sm_90 at the head dims of
        `kernels.bwd.HOPPER_ONEPASS_DIMS` (64) the Gluon one-pass kernel, dQ by fp32 atomics (not bitwise
        reproducible); elsewhere the separate pass (`kernels.bwd.ATOMIC_DQ_BY_DEFAULT` for the portable
        kernels), so bitwise reproducible there too. On sm_90 at d = 64 both modes run the Gluon kernels'
        lean build (plain under softcap, or fp16 with a scale under 2^-4:
        `model.dispatch.hopper_backward_lean`). In either mode the backward's row term ``D = rowsum(dO * O)``
        reads O as stored, in q's dtype (as FlashAttention does). Against float64 that rounding can dominate
        the gradients' error, up to ~1,000 x that of PyTorch's math backward (which differentiates through P,
        not O), mostly where a sink holds much of a row's weight; against a float64 backward given the same
        D the gradients are within `checks.kernel_tolerance`.

    Returns
    -------
    o : torch.Tensor, [B, Hq, Nq, d], q's dtype
    lse : torch.Tensor, [B, Hq, Nq], float32 — only when ``return_lse``.

    Supported: d a multiple of 8 up to 256 (`_common.head_block`: 64, 128 and 256 are built, others run in
    the next one's tiles); fp16 and bf16. Anything else raises NotImplementedError; malformed input raises
    ValueError naming the argument.

    Example
    -------
    >>> q = k = v = torch.randn(1, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
    >>> o = attnscope.flash_attention(q, k, v, causal=True, window=(1024, 0), softcap=50.0)
    """
    grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v, sinks))
    compiling = torch.compiler.is_compiling()
    if not (grad or compiling):  # eager inference: the launch (a planned layout: no checks beyond its key)
        if type(deterministic) is not bool:
            check_flags(deterministic=deterministic)
        o, lse, _ = _launch(q, k, v, causal, scale, return_lse, config, impl, window, softcap, sinks, True)
        return (o, lse) if return_lse else o
    if type(causal) is not bool or type(return_lse) is not bool or type(deterministic) is not bool:
        check_flags(causal=causal, return_lse=return_lse, deterministic=deterministic)
    check_scale(scale)  # the op takes the scale as a float
    d = q.shape[-1] if hasattr(q, "shape") and len(q.shape) else 0
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(max(d, 1))
    if compiling:  # one opaque op for torch.compile (no graph break; autograd through its registration)
        cfg = _check_config(config)
        _check_layout_and_mods(q, k, v, causal, scale, window, softcap, sinks)
        o, lse = _op(q, k, v, causal, sm_scale, return_lse or grad, None if cfg is None else list(cfg), impl,
                     None if window is None else list(window), softcap, sinks, deterministic)
    else:  # eager autograd: the same launch and backward, without the op dispatcher's per-call cost
        o, lse = _Attention.apply(q, k, v, causal, sm_scale, True, config, impl, window, softcap, sinks,
                                  deterministic)
    return (o, lse) if return_lse else o


from attnscope.kernels import bwd_autograd as _bwd  # noqa: E402  the autograd formula of _op

torch.library.register_autograd("attnscope::flash_attention", _bwd._backward,
                               setup_context=_bwd._setup_context)


class _Attention(torch.autograd.Function):
    """Eager autograd of `flash_attention`: `_launch` forward, and the backward of `_op`'s formula
    (`bwd_autograd._setup_context`; `._eager_backward`: the kernels without the backward op's dispatch),
    without the custom-op dispatcher, whose autograd wrapper re-fills the schema's defaults on every call.
    ``forward(ctx, ...)``, as that wrapper's: a ``setup_context`` would have `Function.apply` bind the
    arguments to the signature on every call. torch.compile sees `_op`."""

    @staticmethod
    def forward(ctx, *inputs):  # the 12 of `_op`: q, k, v, causal, scale, return_lse, .., deterministic
        o, lse, _ = _launch(*inputs[:11], False)
        _bwd._setup_context(ctx, inputs, (o, lse))
        return o, lse

    backward = staticmethod(_bwd._eager_backward)
