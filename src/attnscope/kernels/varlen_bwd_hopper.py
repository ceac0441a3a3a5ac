"""Packed variable-length FlashAttention backward for Hopper (sm_90) in Gluon: kernels/bwd_hopper.py's dK/dV
and dQ kernels run over work lists of (sequence, tile) items.

Algorithm: the backward of FlashAttention-2 (Dao, arXiv:2307.08691, Algorithm 2) with FlashAttention-3's
machinery (Shah et al., arXiv:2407.08608), as kernels/bwd_hopper.py, whose @gluon.jit pieces run here with a
sequence's first packed row added to the TMA coordinates; tile indices and the mask (`bwd_hopper._keep`,
`_q_range`, `fwd_hopper._kv_range` / `_kv_full`) stay 0-based within the sequence.

- dK/dV (`_attnscope_varlen_bwd_hopper_dkdv_kernel`): one CTA per (work item = (sequence, 128-key tile),
  kv head); K/V of the tile resident, (Q, dO, -LSE2 / qk_scale, Delta) tiles of the group's query heads
  through the TMA ring, `bwd_hopper._step` per tile. A Q/dO tile may run past the sequence's last row into
  the next sequence's rows: the -LSE2 / qk_scale and Delta copies are laid out per sequence (`padded_rows`:
  sequence s's rows from `row_starts`' entry s, a multiple of `ROW_ALIGN`, followed by at least ``ROW_PAD``
  rows of -inf and 0), so those rows enter S^T as -inf and give P = 0 and dS = 0, as past Nq in the dense
  kernel. The rows are the TMA loads' innermost coordinate, which must be 16-byte aligned (an unaligned one
  is an illegal instruction on the GPU, not an error the host sees). dK, dV leave by TMA when
  the warpgroup's 64 keys are all inside the sequence, else by masked pointer stores (never a row of
  another sequence).
- dQ (`_attnscope_varlen_bwd_hopper_dq_kernel`): one CTA per (sequence, 128-row query tile) x query head,
  the K/V ring from the sequence's first key; LSE2 and Delta by masked loads (+inf and 0 past Nq: P = 0);
  dQ by TMA for whole 64-row warpgroup tiles, masked pointer stores for the ragged one.
Both kernels run the plain build (`bwd_hopper.config` without a dtype), never the lean one
(`bwd_hopper.LEAN_CONFIGS`): the lean step needs the masked and whole tiles in separate runs, rows of
log2(scale) - LSE2 and -Delta and a lean dQ kernel, none of which this path has.
Both grids are (work item, head) and launch the last heads interleaved item by item
(`model.tiles.launch_tail`, `_tl.cta_tile`), the lists' heaviest items first. No atomics: the
gradients are bitwise reproducible run to run. Causal is bottom-right per sequence. No score mods on this path
(window and softcap run the portable kernels of kernels/varlen_bwd.py; sinks need nothing here). Layout: q, dO
[total_q, Hq, d], k, v [total_k, Hkv, d] viewed as [1, H, total, d] for 4-D TMA descriptors; dq, dk, dv
contiguous. A head dim between the builds' (40-120) runs the build of its `head_block`: TMA reads zeros past
d and clips the stores, the ragged tiles' pointer stores take d's row stride and column bound (``DT``).
"""

from __future__ import annotations

import functools

from attnscope.kernels._common import import_torch_triton, num_sms
from attnscope.model.tiles import cdiv, head_block, launch_tail

torch, triton = import_torch_triton()
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    mbarrier,
    tma,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from attnscope.kernels._gluon_smem import buffers, dkdv_smem, kv_ring, load_kv  # noqa: E402
from attnscope.kernels._tl import cta_tile  # noqa: E402
from attnscope.kernels.bwd_hopper import (  # noqa: E402
    CONSUMER_REGS,
    ROW_PAD,
    _dkdv_tile,
    _producer,
    _q_range,
    _row_layout,
    _tma_ready,
    config,
)
from attnscope.kernels.bwd_hopper_dq import _dq_tile  # noqa: E402
from attnscope.kernels.fwd_hopper import (  # noqa: E402
    NUM_WARPS,
    PRODUCER_REGS,
    _kv_range,
    desc_type,
    descriptor,
    wgmma_layout,
)

#: The score mods this path builds (`fwd_hopper.mods_flags`): none.
PLAIN: gl.constexpr = gl.constexpr(0)
#: fp32 rows per 16 bytes: each sequence's first row in the padded -LSE2 / qk_scale and Delta copies is a
#: multiple of it (`row_starts`), and so is every row the dK/dV producer loads by TMA (BM is one too)
ROW_ALIGN = 4


@gluon.jit
def _seq(CU_Q, CU_K, WORK_SEQ, w):
    """(sequence, first query row, Nq, first key row, Nk) of work item ``w``; an idle item (sequence -1)
    reads sequence 0 with Nq = Nk = 0: no tile visited, nothing stored."""
    s = gl.load(WORK_SEQ + w)
    idle = s < 0
    s = gl.maximum(s, 0)
    q0 = gl.load(CU_Q + s)
    k0 = gl.load(CU_K + s)
    nq = gl.where(idle, 0, gl.load(CU_Q + s + 1) - q0)
    nk = gl.where(idle, 0, gl.load(CU_K + s + 1) - k0)
    return s, q0, nq, k0, nk


# --- dK/dV: per (sequence, K/V tile), the group's query tiles streamed (`bwd_hopper._producer`) ---------
@gluon.jit
def _consumer(desc_dk, desc_dv, DK, DV, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
              q_ready, q_empty, hk, HKV, group, start_n, k0, lo, f_lo, end, NQ, NK, sc, sm_scale,
              BM: gl.constexpr, BNW: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
              CAUSAL: gl.constexpr, DT: gl.constexpr):
    """Warpgroup WG's keys ``[start_n + WG BNW, + BNW)`` of the sequence: `bwd_hopper._dkdv_tile` (plain
    build, two kernels: no one-pass dQ), then dK x sm_scale and dV stored inside the sequence only."""
    acc_layout: gl.constexpr = wgmma_layout(D)  # dK, dV [BNW, D]
    dk, dv = _dkdv_tile(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, q_ready, q_empty,
                        k_smem, kv_bar, DK, 0, hk, 0, group, start_n, lo, f_lo, end, end, NQ, NK, sc,
                        sm_scale, BM, BNW, D, STAGES, WG, CAUSAL, PLAIN, 0, D, 2, 1, 0)
    n0 = start_n + WG * BNW
    dk = dk * sm_scale
    if n0 + BNW <= NK:  # every key inside the sequence: TMA through the dead K/V buffers
        v_smem.index(WG).reshape([BNW, D]).store(dv.to(desc_dv.dtype))
        k_smem.index(WG).reshape([BNW, D]).store(dk.to(desc_dk.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(desc_dv, [0, hk, k0 + n0, 0], v_smem.index(WG))
        tma.async_copy_shared_to_global(desc_dk, [0, hk, k0 + n0, 0], k_smem.index(WG))
        tma.store_wait(pendings=0)
    else:  # the ragged tile: the keys past Nk are the next sequence's rows, never written
        rows = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
        off = (k0 + rows).to(gl.int64)[:, None] * (HKV * DT) + (hk * DT + cols)[None, :]  # [total_k, Hkv, DT]
        ok = (rows[:, None] < NK) & (cols[None, :] < DT)
        gl.store(DK + off, dk.to(DK.dtype.element_ty), mask=ok)
        gl.store(DV + off, dv.to(DV.dtype.element_ty), mask=ok)


@gluon.jit(do_not_specialize=["H", "HKV", "qk_scale", "sm_scale", "TAIL"])
def _attnscope_varlen_bwd_hopper_dkdv_kernel(desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, desc_dk,
                                             desc_dv, DK, DV, CU_Q, CU_K, WORK_SEQ, WORK_TILE, ROW0, H, HKV,
                                             qk_scale, sm_scale, TAIL, CAUSAL: gl.constexpr,
                                             STAGES: gl.constexpr, NWG: gl.constexpr,
                                             CONSUMER_REGS: gl.constexpr, DT: gl.constexpr,
                                             num_warps: gl.constexpr):
    """dK, dV of ``NWG x BNW`` keys of one (sequence, kv head) per CTA: program (work item, kv head).
    ``ROW0``: `row_starts`, each sequence's first row in the padded copies ``desc_lse`` / ``desc_delta``."""
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BNW: gl.constexpr = desc_k.block_type.shape[2]  # keys per consumer warpgroup
    D: gl.constexpr = desc_q.block_type.shape[3]
    w, hk = cta_tile(TAIL)  # the list's heaviest items first, the last heads interleaved (`_tl.cta_tile`)
    s, q0, NQ, k0, NK = _seq(CU_Q, CU_K, WORK_SEQ, w)
    group = H // HKV
    start_n = gl.load(WORK_TILE + w) * (NWG * BNW)  # keys within the sequence
    sc = (qk_scale,)
    lo, f_lo, f_hi, end = _q_range(start_n, NQ, NK, sc, BM, NWG * BNW, CAUSAL, PLAIN)
    row_pad = gl.load(ROW0 + s)  # the sequence's first row in the padded -LSE2 / qk_scale and Delta copies

    smem = dkdv_smem(desc_k, desc_v, desc_q, desc_do, desc_lse, desc_delta, STAGES, NWG, 0, 0)
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, q_ready, q_empty, _, _ = smem

    gl.static_assert(NWG == 2, "two consumer warpgroups (bwd_hopper.CONFIGS)")
    gl.warp_specialize(
        [(_consumer, (desc_dk, desc_dv, DK, DV, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                      q_ready, q_empty, hk, HKV, group, start_n, k0, lo, f_lo, end, NQ, NK, sc, sm_scale,
                      BM, BNW, D, STAGES, 0, CAUSAL, DT)),
         (_consumer, (desc_dk, desc_dv, DK, DV, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                      q_ready, q_empty, hk, HKV, group, start_n, k0, lo, f_lo, end, NQ, NK, sc, sm_scale,
                      BM, BNW, D, STAGES, 1, CAUSAL, DT)),
         (_producer, (desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, k_smem, v_smem, q_smem, do_smem,
                      lse_smem, delta_smem, kv_bar, q_ready, q_empty, 0, hk, group, k0 + start_n, q0, row_pad,
                      lo, end, BM, BNW, STAGES, NWG))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --- dQ: per (sequence, query tile), K and V streamed -----------------------------------------------------
@gluon.jit
def _dq_producer(desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                 v_ready, k_empty, v_empty, h, hk, q_row, k0, n_tiles, BM: gl.constexpr, BN: gl.constexpr,
                 STAGES: gl.constexpr, NWG: gl.constexpr):
    """Q and dO of the CTA's rows (from packed row ``q_row``), then the K/V ring from the sequence's first
    key ``k0`` (`fwd_hopper._producer`'s order)."""
    for w in gl.static_range(NWG):
        mbarrier.expect(q_bar.index(w), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [0, h, q_row + w * BM, 0], q_bar.index(w), q_smem.index(w))
        mbarrier.expect(do_bar.index(w), desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_do, [0, h, q_row + w * BM, 0], do_bar.index(w), do_smem.index(w))
    for i in range(n_tiles):
        load_kv(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, i, 0, hk, k0, i, STAGES)


@gluon.jit
def _dq_consumer(desc_dq, DQ, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready, v_ready,
                 k_empty, v_empty, h, H, TOTAL_Q, q0, row0_cta, n_tiles, NQ, NK, sc, sm_scale,
                 BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
                 CAUSAL: gl.constexpr, DT: gl.constexpr):
    """Warpgroup WG's rows ``[row0_cta + WG BM, + BM)`` of the sequence: `bwd_hopper_dq._dq_tile` (plain
    build), LSE2 / Delta from the packed [Hq, total_q] rows; dQ stored inside the sequence only."""
    acc_layout: gl.constexpr = wgmma_layout(D)  # dQ [BM, D]
    row0 = row0_cta + WG * BM
    dq = _dq_tile(LSE2, DELTA, h.to(gl.int64), TOTAL_Q, q0, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar,
                  k_ready, v_ready, k_empty, v_empty, row0, 0, n_tiles, NQ, NK, sc, sm_scale, BM, BN, D,
                  STAGES, WG, CAUSAL, PLAIN, 0)  # LSE2, Delta: [Hq, total_q]
    if row0 + BM <= NQ:  # every row inside the sequence: TMA through the dead Q buffer
        q_smem.index(WG).reshape([BM, D]).store(dq.to(desc_dq.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(desc_dq, [0, h, q0 + row0, 0], q_smem.index(WG))
        tma.store_wait(pendings=0)
    else:  # the ragged tile: the rows past Nq are the next sequence's, never written
        rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
        off = (q0 + rows).to(gl.int64)[:, None] * (H * DT) + (h * DT + cols)[None, :]  # [total_q, Hq, DT]
        gl.store(DQ + off, dq.to(DQ.dtype.element_ty), mask=(rows[:, None] < NQ) & (cols[None, :] < DT))


@gluon.jit(do_not_specialize=["H", "HKV", "TOTAL_Q", "qk_scale", "sm_scale", "TAIL"])
def _attnscope_varlen_bwd_hopper_dq_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, DQ, LSE2, DELTA, CU_Q,
                                           CU_K, WORK_SEQ, WORK_TILE, H, HKV, TOTAL_Q, qk_scale, sm_scale,
                                           TAIL, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                                           NWG: gl.constexpr, CONSUMER_REGS: gl.constexpr, DT: gl.constexpr,
                                           num_warps: gl.constexpr):
    """dQ of ``NWG x BM`` query rows of one (sequence, query head) per CTA: program (work item, head)."""
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_q.block_type.shape[3]
    w, h = cta_tile(TAIL)  # the list's heaviest items first, the last heads interleaved (`_tl.cta_tile`)
    s, q0, NQ, k0, NK = _seq(CU_Q, CU_K, WORK_SEQ, w)
    hk = h // (H // HKV)
    row0 = gl.load(WORK_TILE + w) * (NWG * BM)  # rows within the sequence
    sc = (qk_scale,)
    n_tiles = _kv_range(row0, NWG * BM, NQ, NK, sc, BN, CAUSAL, PLAIN)[1]

    q_smem = buffers(desc_q, NWG)
    do_smem = buffers(desc_do, NWG)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, wg_bars = kv_ring(desc_k, desc_v, STAGES, NWG, 2)
    q_bar, do_bar = wg_bars

    gl.static_assert(NWG == 2, "two consumer warpgroups (bwd_hopper.CONFIGS)")
    gl.warp_specialize(
        [(_dq_consumer, (desc_dq, DQ, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                         v_ready, k_empty, v_empty, h, H, TOTAL_Q, q0, row0, n_tiles, NQ, NK, sc, sm_scale,
                         BM, BN, D, STAGES, 0, CAUSAL, DT)),
         (_dq_consumer, (desc_dq, DQ, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                         v_ready, k_empty, v_empty, h, H, TOTAL_Q, q0, row0, n_tiles, NQ, NK, sc, sm_scale,
                         BM, BN, D, STAGES, 1, CAUSAL, DT)),
         (_dq_producer, (desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar,
                         k_ready, v_ready, k_empty, v_empty, h, hk, q0 + row0, k0, n_tiles, BM, BN, STAGES,
                         NWG))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --- the host side ----------------------------------------------------------------------------------------
def tiles(d: int) -> dict:
    """Rows of one work item's tile per kernel for head dim ``d``: {"dkdv": keys, "dq": query rows}: the
    ``tile`` of `varlen_plan.plan`'s lists."""
    kv, dq = config(head_block(d), "dkdv"), config(head_block(d), "dq")
    return {"dkdv": kv.BN, "dq": dq.NWG * dq.BM}


def work_lists(total_q: int, total_k: int, batch: int, d: int, causal: bool) -> list:
    """The `varlen_plan.plan` lists of the two kernels, ``[(n_items, tile, causal, kv_tiles)]``: dK/dV over
    (sequence, K/V tile), dQ over (sequence, query tile). ``cdiv(total, tile) + batch`` items bound the
    tiles of any partition of ``total`` rows into ``batch`` sequences (the rest idle)."""
    t = tiles(d)
    return [(cdiv(total_k, t["dkdv"]) + batch, t["dkdv"], bool(causal), True),
            (cdiv(total_q, t["dq"]) + batch, t["dq"], bool(causal), False)]


def row_starts(cu_q):
    """Each sequence's first row in `padded_rows`' copies, int32 [B] on ``cu_q``'s device (no host sync):
    ``ROW_ALIGN ceil((cu_q[s] + s (ROW_PAD + ROW_ALIGN - 1)) / ROW_ALIGN)``, a multiple of `ROW_ALIGN`
    (16 bytes of fp32: the TMA loads' innermost coordinate), at least ``ROW_PAD`` rows after the previous
    sequence's last. ``cu_q``: the sanitised int32 [B + 1]."""
    B = cu_q.shape[0] - 1
    step = ROW_PAD + ROW_ALIGN - 1
    first = cu_q[:B] + torch.arange(B, device=cu_q.device, dtype=cu_q.dtype) * step
    return (first + (ROW_ALIGN - 1)).div(ROW_ALIGN, rounding_mode="floor").mul(ROW_ALIGN).to(torch.int32)


def padded_rows(xs, cu_q):
    """Each ``(x, pad)`` of ``xs`` (x [H, total_q]) laid out per sequence for the dK/dV kernel's TMA reads:
    ``(starts, [padded, ...])``, ``starts`` = `row_starts` and each padded [H, n_pad] float32 with sequence
    s's rows from ``starts[s]``, every other entry ``pad`` (at least ``ROW_PAD`` of them after each
    sequence), n_pad a multiple of `ROW_ALIGN` (16-byte row stride). ``cu_q``: the sanitised int32 [B + 1]
    on x's device; no host sync."""
    H, total_q = xs[0][0].shape
    dev = xs[0][0].device
    B = cu_q.shape[0] - 1
    n_pad = cdiv(total_q + B * (ROW_PAD + ROW_ALIGN - 1), ROW_ALIGN) * ROW_ALIGN  # holds `row_starts`' layout
    starts = row_starts(cu_q)
    rows = torch.arange(total_q, device=dev, dtype=torch.int32)
    seq = torch.searchsorted(cu_q, rows, right=True) - 1  # [total_q] the sequence of each packed row
    at = (rows + (starts - cu_q[:B])[seq]).long()  # [total_q] each packed row's place in the copies
    out = [torch.full((H, n_pad), pad, dtype=torch.float32, device=dev) for _, pad in xs]
    return starts, [o.index_copy_(1, at, x.to(torch.float32)) for o, (x, _) in zip(out, xs, strict=True)]


def _view(t):
    """[total, H, d] as the [1, H, total, d] view the 4-D TMA descriptors address (the caller's strides)."""
    return t.permute(1, 0, 2).unsqueeze(0)


def _descs(tensors: dict, blocks: dict, d: int) -> list:
    return [descriptor(tensors[name], rows, d) for name, rows in blocks.items()]


def constexprs(d: int, causal: bool, name: str) -> dict:
    """The constexpr arguments of kernel ``name`` ("dkdv" or "dq") for head dim ``d``: the build of its
    `head_block` (``DT``: ``d`` itself, the row stride and column bound of the ragged tiles' stores)."""
    cfg = config(head_block(d), name)
    return {"CAUSAL": bool(causal), "STAGES": cfg.STAGES, "NWG": cfg.NWG, "CONSUMER_REGS": CONSUMER_REGS,
            "DT": d, "num_warps": NUM_WARPS}


def kernel(name: str):
    """The Gluon kernel function of ``name`` ("dkdv" or "dq")."""
    kernels = {"dkdv": _attnscope_varlen_bwd_hopper_dkdv_kernel, "dq": _attnscope_varlen_bwd_hopper_dq_kernel}
    return kernels[name]


def signature(d: int, dtype: str, name: str = "dkdv") -> dict:
    """Signature of kernel ``name`` for ``triton.compile`` without a GPU (``dtype`` "fp16"/"bf16")."""
    cfg = config(head_block(d), name)
    ds = functools.partial(desc_type, dtype, d=head_block(d))
    ptrs = {n: "*i32" for n in ("CU_Q", "CU_K", "WORK_SEQ", "WORK_TILE")}
    if name == "dkdv":
        bnw = cfg.BN // cfg.NWG
        row = f"tensordesc<fp32[1,1,{cfg.BM}],{_row_layout(cfg.BM)!r}>"
        sig = {"desc_q": ds(cfg.BM), "desc_k": ds(bnw), "desc_v": ds(bnw), "desc_do": ds(cfg.BM),
               "desc_lse": row, "desc_delta": row, "desc_dk": ds(bnw), "desc_dv": ds(bnw),
               "DK": f"*{dtype}", "DV": f"*{dtype}", **ptrs, "ROW0": "*i32", "H": "i32", "HKV": "i32"}
    else:
        sig = {"desc_q": ds(cfg.BM), "desc_k": ds(cfg.BN), "desc_v": ds(cfg.BN), "desc_do": ds(cfg.BM),
               "desc_dq": ds(cfg.BM), "DQ": f"*{dtype}", "LSE2": "*fp32", "DELTA": "*fp32", **ptrs,
               "H": "i32", "HKV": "i32", "TOTAL_Q": "i32"}
    cx = {n: "constexpr" for n in constexprs(d, False, name)}
    return {**sig, "qk_scale": "fp32", "sm_scale": "fp32", "TAIL": "i32", **cx}


def launch(q, k, v, do, lse2, delta, cu_q, cu_k, items, dq, dk, dv, qk_scale: float, sm_scale: float,
           causal: bool):
    """dQ, dK, dV on inputs kernels/varlen_bwd.py checked, writing ``dq`` [total_q, Hq, d], ``dk``, ``dv``
    [total_k, Hkv, d] (contiguous) in place: the dK/dV kernel, then the dQ kernel.

    ``lse2``: the forward's LSE x log2(e), contiguous float32 [Hq, total_q]; ``delta``: rowsum(dO * O)
    (minus dLSE), contiguous float32 [Hq, total_q]; ``cu_q``, ``cu_k``: the sanitised cu_seqlens and
    ``items`` the two (seq, tile) lists of `varlen_plan.plan` on `work_lists`. Returns the two compiled
    kernels."""
    total_q, Hq, d_in = q.shape
    total_k, Hkv, d = k.shape[0], k.shape[1], head_block(d_in)  # the build's: TMA reads zeros past d_in
    assert all(t.is_contiguous() for t in (dq, dk, dv, lse2, delta)), "dq, dk, dv, lse2, delta: contiguous"
    views = {"desc_q": _view(_tma_ready(q)), "desc_k": _view(_tma_ready(k)), "desc_v": _view(_tma_ready(v)),
             "desc_do": _view(_tma_ready(do)), "desc_dk": _view(dk), "desc_dv": _view(dv),
             "desc_dq": _view(dq)}  # outputs: fresh contiguous tensors, written in place
    kv, qc = config(d, "dkdv"), config(d, "dq")
    bnw = kv.BN // kv.NWG
    assert ROW_PAD >= kv.BM and kv.BM % ROW_ALIGN == 0, (ROW_PAD, kv)  # padding only past a sequence's end
    if total_k == 0:  # no keys: every row's dQ is 0
        dq.zero_()
        return None, None
    # the S^T and dP^T initial values per query row: -LSE2 / qk_scale (-inf past each sequence: P = 0), Delta
    starts, rows = padded_rows([(lse2 / -qk_scale, float("-inf")), (delta, 0.0)], cu_q)
    rows = [TensorDescriptor(r.unsqueeze(0), [1, *r.shape], [r.numel(), *r.stride()], [1, 1, kv.BM],
                             _row_layout(kv.BM)) for r in rows]
    (seq_kv, tile_kv), (seq_q, tile_q) = items
    descs = _descs(views, {"desc_q": kv.BM, "desc_k": bnw, "desc_v": bnw, "desc_do": kv.BM}, d)
    outs = _descs(views, {"desc_dk": bnw, "desc_dv": bnw}, d)
    # a packed batch's items cost unequal amounts either way (sequence lengths; causal, the tiles too),
    # heaviest first in the lists (`varlen_plan`): the last heads interleave as a causal dense call's
    # (`launch_tail`)
    sms = num_sms(torch, q.device)
    tail_kv = launch_tail(True, seq_kv.shape[0], Hkv, sms)
    dkdv = _attnscope_varlen_bwd_hopper_dkdv_kernel[(seq_kv.shape[0], Hkv)](
        *descs, *rows, *outs, dk, dv, cu_q, cu_k, seq_kv, tile_kv, starts, Hq, Hkv, qk_scale, sm_scale,
        tail_kv, **constexprs(d_in, causal, "dkdv"))
    descs = _descs(views, {"desc_q": qc.BM, "desc_k": qc.BN, "desc_v": qc.BN, "desc_do": qc.BM,
                           "desc_dq": qc.BM}, d)
    dq_k = _attnscope_varlen_bwd_hopper_dq_kernel[(seq_q.shape[0], Hq)](
        *descs, dq, lse2, delta, cu_q, cu_k, seq_q, tile_q, Hq, Hkv, total_q, qk_scale, sm_scale,
        launch_tail(True, seq_q.shape[0], Hq, sms), **constexprs(d_in, causal, "dq"))
    return dkdv, dq_k
