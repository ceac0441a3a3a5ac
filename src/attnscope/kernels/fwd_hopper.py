"""FlashAttention forward for Hopper (sm_90) in Gluon, with FlashAttention-3's structure.

Algorithm: the online softmax of FlashAttention-2 (Dao, arXiv:2307.08691, Algorithm 1) scheduled as in
FlashAttention-3 (Shah et al., arXiv:2407.08608): a CTA owns ``NWG x BM`` query rows of one (batch, head)
and runs ``NWG + 1`` partitions (`gl.warp_specialize`):

- producer (1 warp, ``PRODUCER_REGS`` registers after `setmaxnreg`): TMA loads of the Q tiles, then K
  and V tiles into a ``STAGES``-deep shared-memory ring; ``k_ready``/``v_ready`` mbarriers (TMA byte
  counts) hand a slot to the consumers, ``k_empty``/``v_empty`` (NWG arrivals) hand it back.
- NWG = 2 or 3 consumer warpgroups (4 warps each, ``CONSUMER_REGS``), warpgroup ``w`` owning query rows
  ``[w BM, (w+1) BM)`` of the CTA tile: S = Q K^T and O += P V with asynchronous `warpgroup_mma`
  (Q and K, V from shared memory, P from registers), base-2 online softmax with log2 e in the scale.

Overlap inside a warpgroup (§3.2, "intra-warpgroup pipelining"): iteration j issues S_j = Q K_j^T and
then O += P_{j-1} V_{j-1}, waits for S_j alone (`warpgroup_mma_wait(num_outstanding=1)`), computes the
softmax of S_j while the P V product runs, then waits for it and rescales O. Ping-pong (§3.1): the issue
of each iteration's two GEMMs is a critical section passed round robin through ``turn`` mbarriers (FA-3
uses named barriers; Gluon 3.6 has none), so one warpgroup's softmax runs under another's GEMMs.
The persistent variant (one CTA per SM, causal tiles in balanced pairs) overlaps a tile's epilogue with
the next tile's loads (``q_empty`` returns the Q buffers; O has its own buffer). `VARIANTS` lists the
variants; `attnscope.model.dispatch.hopper_variant` picks one for ``impl="auto"``.

Causal: the producer streams the CTA's KV range; each warpgroup runs its tiles ``[0, lo_w)`` without
mask arithmetic and the rest masked before the running max (bottom-right: key c visible to query r iff
``c <= r + Nk - Nq``); tile 0 is always masked (the pipeline's prologue). Empty rows give 0, LSE -inf.
Score mods (constexpr ``MODS``, `_common.check_mods`' contract): a window loads only the tiles of
`model.tiles.window_kv_bounds0` (`_window`), masked at its left edge, unmasked inside, masked at its right
edge and the ragged tile; softcap caps the scaled scores with tanh (``tanh.approx``); a sink joins each row's
denominator at the epilogue (in log2 units, so the LSE includes it). A build without mods is the plain kernel.
Layout: 4-D TMA descriptors ``[B, H, N, d]`` over the caller's strides (ragged tiles read 0, clipped on
store). Contract as `attnscope.kernels.fwd`; ``impl="hopper"`` runs the default variant.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from attnscope.kernels._common import descriptor_over, import_torch_triton, num_sms
from attnscope.kernels._direct import planned_launch
from attnscope.kernels._gluon_smem import buffers, kv_ring, load_kv
from attnscope.kernels._tl import cta_tile
from attnscope.model.tiles import head_block, launch_tail, persistent_ramp

torch, triton = import_torch_triton()
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

NUM_WARPS = 4  # the default partition = consumer warpgroup 0
PRODUCER_REGS = gl.constexpr(24)  # setmaxnreg of the TMA producer warp
#: setmaxnreg of the consumer warpgroups that are worker partitions, by consumer-warpgroup count
CONSUMER_REGS = {2: 240, 3: 160}
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
FP32_MAX: gl.constexpr = gl.constexpr(3.4028234663852886e38)
#: Bits of the constexpr ``MODS`` (`mods_flags`): which score mods a build carries (none: the plain kernel).
WINDOW: gl.constexpr = gl.constexpr(1)
SOFTCAP: gl.constexpr = gl.constexpr(2)
SINKS: gl.constexpr = gl.constexpr(4)


class HopperConfig(NamedTuple):
    """One block configuration: the CTA covers ``NWG x BM`` query rows."""

    BM: int  # query rows per consumer warpgroup (64: one m64 wgmma; 128: two)
    BN: int  # keys per K/V tile
    STAGES: int  # depth of the shared-memory K/V ring
    NWG: int = 2  # consumer warpgroups (2 or 3)


class Variant(NamedTuple):
    """A kernel variant: ping-pong on/off, the block configuration per head dim it is built for, and
    whether the CTAs are persistent (one per SM, walking tiles)."""

    pingpong: bool
    configs: dict  # head_dim -> HopperConfig
    persistent: bool = False


#: The variants (name -> Variant); `attnscope.model.dispatch` names them and picks one per launch. Shared
#: memory: NWG Q tiles + STAGES x (K + V) tiles (+ the persistent kernel's O tiles, + barriers).
#: - hopper_persist (the default): persistent CTAs (one per SM), the next tile's loads overlapping the last
#:   tile's epilogue, no ping-pong (d = 128: 197,000 B of shared memory; ptxas spills 4 B stores / 12 B
#:   loads causal at d = 128, none elsewhere).
#: - hopper_wg3_pp (d = 64 only): three consumer warpgroups in ping-pong, 192 query rows per CTA (FA-3's
#:   d = 64 tile): a K/V tile feeds 1.5x the rows, and three warpgroups hide each other's softmax. A grid
#:   (tiles, B*H); causal, heaviest tiles first and the last heads interleaved rank by rank
#:   (`model.tiles.launch_tail`, `_tl.cta_tile`).
VARIANTS = {
    "hopper_persist": Variant(False, {128: HopperConfig(64, 128, 2), 64: HopperConfig(64, 128, 3)},
                              persistent=True),
    "hopper_wg3_pp": Variant(True, {64: HopperConfig(64, 128, 3, 3)}),
}
DEFAULT_VARIANT = "hopper_persist"


def config(d: int, variant: str = DEFAULT_VARIANT) -> HopperConfig:
    """The block configuration of ``variant`` for head dim ``d`` (NotImplementedError if not built for it)."""
    if variant not in VARIANTS:
        raise NotImplementedError(f"Hopper variant {variant!r}: supported: {', '.join(VARIANTS)}")
    if d not in VARIANTS[variant].configs:
        raise NotImplementedError(f"Hopper variant {variant!r}: head_dim {d} is not supported; supported: "
                                  f"{sorted(VARIANTS[variant].configs)}")
    return VARIANTS[variant].configs[d]


def supports(variant: str, d: int, causal: bool) -> bool:
    """Whether ``variant`` runs head dim ``d`` (either mask): built for it or for its `head_block`."""
    return head_block(d) in VARIANTS[variant].configs


@gluon.jit
def _window(row0, rows, NQ, NK, sc, BN: gl.constexpr):
    """`model.tiles.window_kv_bounds0` in-kernel for rows ``[row0, row0 + rows)`` under the window
    ``(sc[1], sc[2])`` (-1 unbounded): ``(lo, full_lo, full_hi, hi)`` keys, tile-aligned; keys
    ``[full_lo, full_hi)`` need no mask."""
    left = sc[1]
    right = sc[2]
    off = NK - NQ
    r1 = row0 + rows - 1
    first = gl.where(left < 0, 0, gl.maximum(row0 + off - left, 0))
    last = gl.where(right < 0, NK - 1, gl.minimum(r1 + off + right, NK - 1))
    lo = (first // BN) * BN
    hi = gl.minimum(gl.cdiv(last + 1, BN) * BN, NK)
    f0 = gl.where(left < 0, 0, gl.maximum(r1 + off - left, 0))
    f1 = gl.where(right < 0, NK - 1, gl.minimum(row0 + off + right, NK - 1))
    full_lo = gl.maximum(gl.cdiv(f0, BN) * BN, lo)
    full_hi = gl.minimum(gl.where(f1 == NK - 1, NK, (gl.maximum(f1 + 1, 0) // BN) * BN), hi)
    empty = first > last
    lo = gl.where(empty, 0, lo)
    hi = gl.where(empty, 0, hi)
    none_full = full_lo >= full_hi
    full_lo = gl.where(none_full, hi, full_lo)
    full_hi = gl.where(none_full, hi, full_hi)
    return lo, full_lo, full_hi, hi


@gluon.jit
def _kv_range(row0, rows, NQ, NK, sc, BN: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr):
    """(first KV tile, number of KV tiles) the CTA of query rows ``[row0, row0 + rows)`` loads: causal,
    up to the diagonal; windowed (``MODS & WINDOW``), the window's tiles only (`_window`)."""
    t_lo = 0
    hi = NK
    if MODS & WINDOW:
        lo, f_lo, f_hi, hi = _window(row0, rows, NQ, NK, sc, BN)
        t_lo = lo // BN
    elif CAUSAL:
        r_last = gl.maximum(gl.minimum(row0 + rows, NQ) + (NK - NQ), 0)
        hi = gl.minimum(gl.cdiv(r_last, BN) * BN, NK)
    return t_lo, gl.cdiv(hi, BN) - t_lo


@gluon.jit
def _kv_full(row0, rows, NQ, NK, sc, BN: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr):
    """Tiles ``[a, b)`` (absolute) that every row from ``row0`` sees whole: no mask (the ragged last tile
    never is one)."""
    a = 0
    full = NK
    if MODS & WINDOW:
        lo, f_lo, f_hi, hi = _window(row0, rows, NQ, NK, sc, BN)
        a = f_lo // BN
        full = f_hi
    elif CAUSAL:
        full = (gl.maximum(row0 + 1 + (NK - NQ), 0) // BN) * BN
    return a, gl.minimum(full, (NK // BN) * BN) // BN


@gluon.jit
def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              b, h, hk, row0, t_lo, n_tiles, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              NWG: gl.constexpr):
    for w in gl.static_range(NWG):
        mbarrier.expect(q_bar.index(w), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [b, h, row0 + w * BM, 0], q_bar.index(w), q_smem.index(w))
    for i in range(n_tiles):
        load_kv(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, i, b, hk, 0, t_lo + i,
                STAGES)


@gluon.jit
def _turn_wait(turn, k, WG: gl.constexpr, NWG: gl.constexpr, PINGPONG: gl.constexpr):
    """Start of warpgroup WG's k-th GEMM-issue section: round robin 0, 1, .., NWG-1, warpgroup 0 first.

    ``turn[WG]`` (`_turn_barriers`) completes a phase when the previous warpgroup passes the turn;
    warpgroup 0's first section waits on parity 1, which a fresh barrier passes at once."""
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turn.index(WG), (k + 1) & 1)
        else:
            mbarrier.wait(turn.index(WG), k & 1)


@gluon.jit
def _turn_pass(turn, WG: gl.constexpr, NWG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index((WG + 1) % NWG))


@gluon.jit
def _tanh(x):
    """tanh by ``tanh.approx.f32``: one MUFU op (relative error ~2^-11, below a bf16 score's rounding; exp2
    form: two); x = s scale / softcap is not subnormal for a score that matters (HOPPER_MAX_SOFTCAP)."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _softmax(s, m_i, l_i, offs_m, j, sc, NQ, NK, s_layout: gl.constexpr, BN: gl.constexpr,
             MASKED: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr):
    """Online-softmax update of score tile ``j`` (absolute): (p, alpha, m_new, l_new), base 2, max before
    exp. ``sc`` = (qk_scale, left, right, cap_in, cap_out, sinks): softcap (``MODS & SOFTCAP``) makes the
    log2-unit score cap_out * tanh(s * cap_in); the window (``MODS & WINDOW``) masks keys
    outside ``[r + off - left, r + off + right]``. ``m_i`` stays -inf on a row that has seen no visible key
    (the exponent then uses 0: p = 0, not NaN)."""
    if MODS & SOFTCAP:
        s = sc[4] * _tanh(s * sc[3])
    if MASKED:
        if not (MODS & SOFTCAP):
            s = s * sc[0]
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        keep = offs_n[None, :] < NK
        diag = offs_m[:, None] + (NK - NQ)  # the key on a row's bottom-right diagonal
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= diag)
        if MODS & WINDOW:
            keep = keep & ((sc[1] < 0) | (offs_n[None, :] >= diag - sc[1]))
            keep = keep & ((sc[2] < 0) | (offs_n[None, :] <= diag + sc[2]))
        s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        if MODS & WINDOW:  # a row may see keys only in a later tile: keep its max -inf until then
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(s - m_use[:, None])
            alpha = gl.exp2(m_i - m_use)
        else:
            m_new = gl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: p = 0, not NaN
            p = gl.exp2(s - m_new[:, None])
            alpha = gl.exp2(m_i - m_new)
    elif MODS & SOFTCAP:
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        p = gl.exp2(s - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * sc[0])
        p = gl.exp2(s * sc[0] - m_new[:, None])  # one FMA per score
        alpha = gl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.constexpr_function
def wgmma_layout(n):
    """Register layout of a warpgroup's ``warpgroup_mma`` accumulator ``[rows, n]`` (4 warps on the rows)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _step(j, it, kt, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, offs_m,
          sc, NQ, NK, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
          BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
          NWG: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr,
          PINGPONG: gl.constexpr):
    """KV tile j >= 1 (ring slot counter ``it``, turn counter ``kt``): issue S_j and O += P_{j-1} V_{j-1};
    softmax(S_j) under the P V product. K_j's slot goes back once S_j is done, V_{j-1}'s once P V is."""
    sj = it % STAGES
    sp = (it - 1) % STAGES
    mbarrier.wait(k_ready.index(sj), (it // STAGES) & 1)
    mbarrier.wait(v_ready.index(sp), ((it - 1) // STAGES) & 1)
    _turn_wait(turn, kt, WG, NWG, PINGPONG)
    kmat = k_smem.index(sj).reshape([BN, D]).permute((1, 0))
    s_tok = warpgroup_mma(q, kmat, gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False, is_async=True)
    o_tok = warpgroup_mma(p_op, v_smem.index(sp).reshape([BN, D]), acc, is_async=True)
    _turn_pass(turn, WG, NWG, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # S_j done, P V still running
    mbarrier.arrive(k_empty.index(sj))
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, offs_m, j, sc, NQ, NK, s_layout, BN, MASKED, CAUSAL, MODS)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))  # p_op: the async A operand
    mbarrier.arrive(v_empty.index(sp))  # V_{j-1} read: its slot goes back
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
    return acc, p_op, m_i, l_i


@gluon.jit
def _consumer_tile(desc_o, LSE, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, k_empty,
                   v_empty, turn, b, h, pid_bh, row0_cta, t_lo, n_tiles, kv_base, turn_base, q_phase, NQ, NK,
                   sc, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                   WG: gl.constexpr, NWG: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr,
                   STORE_LSE: gl.constexpr,
                   PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr):
    """Warpgroup WG's rows of one CTA tile. K/V ring slots count on from ``kv_base`` and ping-pong sections
    from ``turn_base`` (the tiles this CTA ran before: persistent kernel); Q is ready at phase ``q_phase``.
    O is staged in ``o_smem`` for the TMA store (the non-persistent kernel passes the Q buffer)."""
    s_layout: gl.constexpr = wgmma_layout(BN)
    o_layout: gl.constexpr = wgmma_layout(D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    row0 = row0_cta + WG * BM
    offs_m = row0 + gl.arange(0, BM, layout=row_layout)
    m_i = gl.full([BM], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([BM], gl.float32, row_layout)
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    q = q_smem.index(WG).reshape([BM, D])
    mbarrier.wait(q_bar.index(WG), q_phase)
    if n_tiles > 0:
        t0 = 0  # the first tile's index: tile j of this CTA is tile t0 + j of the head
        n_a = 1  # masked [1, n_a) (the window's left edge), unmasked [n_a, n_lo), masked [n_lo, n_tiles)
        if MODS & WINDOW:
            t0 = t_lo
            f_lo, f_hi = _kv_full(row0, BM, NQ, NK, sc, BN, CAUSAL, MODS)  # this warpgroup's unmasked tiles
            n_a = gl.minimum(gl.maximum(f_lo - t_lo, 1), n_tiles)
            n_lo = gl.minimum(gl.maximum(f_hi - t_lo, n_a), n_tiles)
        else:
            n_lo = gl.maximum(gl.minimum(_kv_full(row0, BM, NQ, NK, sc, BN, CAUSAL, MODS)[1], n_tiles), 1)
        # prologue, tile 0 (masked: it may be the diagonal or ragged tile)
        s0 = kv_base % STAGES
        mbarrier.wait(k_ready.index(s0), (kv_base // STAGES) & 1)
        _turn_wait(turn, turn_base, WG, NWG, PINGPONG)
        kmat = k_smem.index(s0).reshape([BN, D]).permute((1, 0))
        s_tok = warpgroup_mma(q, kmat, gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False, is_async=True)
        _turn_pass(turn, WG, NWG, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(s0))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, offs_m, t0, sc, NQ, NK, s_layout, BN, True, CAUSAL, MODS)
        p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
        if MODS & WINDOW:
            for j in range(1, n_a):  # the window's left edge: masked
                acc, p_op, m_i, l_i = _step(t0 + j, kv_base + j, turn_base + j, acc, p_op, m_i, l_i, q,
                                            k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, offs_m,
                                            sc,
                                            NQ, NK, s_layout, o_layout, p_layout, BM, BN, D, STAGES, WG, NWG,
                                            True, CAUSAL, MODS, PINGPONG)
        for j in range(n_a, n_lo):  # tiles every row of this warpgroup sees whole: no mask
            acc, p_op, m_i, l_i = _step(t0 + j, kv_base + j, turn_base + j, acc, p_op, m_i, l_i, q, k_smem,
                                        v_smem, k_ready, v_ready, k_empty, v_empty, turn, offs_m, sc,
                                        NQ, NK, s_layout, o_layout, p_layout, BM, BN, D, STAGES, WG, NWG,
                                        False, CAUSAL, MODS, PINGPONG)
        for j in range(n_lo, n_tiles):  # diagonal (window's right edge) and ragged tiles: masked
            acc, p_op, m_i, l_i = _step(t0 + j, kv_base + j, turn_base + j, acc, p_op, m_i, l_i, q, k_smem,
                                        v_smem, k_ready, v_ready, k_empty, v_empty, turn, offs_m, sc,
                                        NQ, NK, s_layout, o_layout, p_layout, BM, BN, D, STAGES, WG, NWG,
                                        True, CAUSAL, MODS, PINGPONG)
        if PERSISTENT:
            mbarrier.arrive(q_empty.index(WG))  # the last Q K^T is done: the next tile's Q may land
        # epilogue: O += P_last V_last
        last = kv_base + n_tiles - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        _turn_wait(turn, turn_base + n_tiles, WG, NWG, PINGPONG)
        o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES).reshape([BN, D]), acc, is_async=True)
        _turn_pass(turn, WG, NWG, PINGPONG)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        mbarrier.arrive(v_empty.index(last % STAGES))
    else:
        if PERSISTENT:
            mbarrier.arrive(q_empty.index(WG))  # no KV tile (all rows empty): Q was never read

    if MODS & SINKS:  # the sink joins the denominator: m = max(m, sink2), l = l 2^(m_old - m) + 2^(sink2 - m)
        sink2 = gl.load(sc[5] + h) * LOG2E  # kept finite, as `_tl.sink_log2`: NaN -> -max, +-inf -> +-max
        sink2 = gl.minimum(gl.maximum(gl.where(sink2 == sink2, sink2, -FP32_MAX), -FP32_MAX), FP32_MAX)
        m_old = gl.where(l_i == 0.0, float("-inf"), m_i)
        m_i = gl.maximum(m_old, sink2)
        alpha = gl.exp2(m_old - m_i)
        l_i = l_i * alpha + gl.exp2(sink2 - m_i)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)  # empty rows: acc = 0 -> o = 0
    o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    if PERSISTENT:
        tma.store_wait(pendings=0)  # the previous tile's O has left o_smem
    o_smem.index(WG).reshape([BM, D]).store(o.to(desc_o.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_o, [b, h, row0, 0], o_smem.index(WG))
    if not PERSISTENT:
        tma.store_wait(pendings=0)
    if STORE_LSE:
        lse = m_i * LN2 + gl.log(l_i)  # -inf for empty rows
        gl.store(LSE + pid_bh * NQ + offs_m, lse, mask=offs_m < NQ)


@gluon.jit
def _work(i, num_m, ramp, n_work):
    """Persistent kernel: (valid, b*H + h, query tile) of this CTA's round ``i``
    (`model.tiles.persistent_item`, its Python twin). ``ramp`` 0: round i covers tiles [i P, (i + 1) P) of
    the P CTAs, head-major. Else items of about equal cost, head-major, two rounds each, so the CTAs stay in
    lockstep every two rounds: a head's tiles past its first ``ramp`` alone (the last first), then its first
    ``ramp`` tiles (1 to ``ramp`` KV tiles each: every tile causal, the rows whose window reaches before key
    0 with a causal window) in pairs, heavy in the even round, light in the odd one; CTA p runs item
    (i // 2) P + p."""
    p = gl.program_id(0)
    n = gl.num_programs(0)
    if ramp > 0:
        uniform = num_m - ramp
        half = (ramp + 1) // 2
        q = (i // 2) * n + p
        k = q % (uniform + half)
        j = k - uniform
        odd = ramp % 2
        start_m = num_m - 1 - k
        if k >= uniform:
            start_m = ramp - 1 - odd - j
        if (k >= uniform) & (odd == 1) & (j == half - 1):  # odd ramp: its last tile runs alone
            start_m = ramp - 1
        if i % 2 == 1:
            start_m = j
        valid = (q < n_work) & ((i % 2 == 0) | ((k >= uniform) & ((odd == 0) | (j != half - 1))))
        pid_bh = q // (uniform + half)
    else:
        t = i * n + p
        valid = t < n_work
        pid_bh = t // num_m
        start_m = t % num_m
    return valid, pid_bh, start_m


@gluon.jit
def _rounds(n_work, ramp):
    """Persistent kernel: the rounds of `_work` (two per item when it pairs tiles)."""
    r = gl.cdiv(n_work, gl.num_programs(0))
    if ramp > 0:
        r = 2 * r
    return r


@gluon.jit
def _ramp(num_m, NQ, NK, LEFT, RIGHT, ROWS: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr):
    """The tiles of a head `_work` pairs (`model.tiles.persistent_ramp`, its Python twin): all causal; with a
    window (left, 0) and fewer than ROWS keys before the first query's, those whose rows' windows reach
    before key 0; else none."""
    ramp = num_m * 0
    if CAUSAL:
        ramp = num_m
    if MODS & WINDOW:  # noqa: SIM102 (a constexpr test, then a runtime one)
        if RIGHT == 0:
            if LEFT < 0:
                ramp = num_m
            if (LEFT >= 0) & (NK - NQ < ROWS):
                ramp = gl.minimum(gl.maximum(gl.cdiv(LEFT - (NK - NQ), ROWS), 0), num_m)
    return ramp


@gluon.jit
def _tile(pid_bh, start_m, H, HKV, NQ, NK, sc, ROWS: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
          MODS: gl.constexpr):
    """Persistent kernel: (b*H + h, query tile) -> (b, h, kv head, b*H + h, first query row, first KV tile,
    KV tiles)."""
    h = pid_bh % H
    row0 = start_m * ROWS
    t_lo, n_tiles = _kv_range(row0, ROWS, NQ, NK, sc, BN, CAUSAL, MODS)
    return pid_bh // H, h, h // (H // HKV), pid_bh, row0, t_lo, n_tiles


@gluon.jit
def _load_q(desc_q, q_smem, q_bar, q_empty, i, b, h, row0, BM: gl.constexpr, NWG: gl.constexpr):
    """The Q tiles of this CTA's i-th tile, each once its warpgroup handed the buffer back."""
    for w in gl.static_range(NWG):
        mbarrier.wait(q_empty.index(w), (i & 1) ^ 1)  # warpgroup w is done with the last tile's Q
        mbarrier.expect(q_bar.index(w), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [b, h, row0 + w * BM, 0], q_bar.index(w), q_smem.index(w))


@gluon.jit
def _producer_persistent(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                         k_empty, v_empty, num_m, ramp, n_work, H, HKV, NQ, NK, sc, BM: gl.constexpr,
                         BN: gl.constexpr,
                         STAGES: gl.constexpr, NWG: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr):
    kv_base = 0
    c = 0  # tiles this CTA ran so far: Q's phase
    for i in range(_rounds(n_work, ramp)):
        valid, pid_bh, start_m = _work(i, num_m, ramp, n_work)
        if valid:
            b, h, hk, pid_bh, row0, t_lo, n_tiles = _tile(pid_bh, start_m, H, HKV, NQ, NK, sc, NWG * BM, BN,
                                                          CAUSAL, MODS)
            # K_0, V_0 first (their slots free up while the consumers finish the last tile), then Q, whose
            # buffers come back only when the consumers' last Q K^T of the last tile is done
            for j in range(n_tiles):
                load_kv(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_base + j, b,
                        hk, 0, t_lo + j, STAGES)
                if j == 0:
                    _load_q(desc_q, q_smem, q_bar, q_empty, c, b, h, row0, BM, NWG)
            if n_tiles == 0:
                _load_q(desc_q, q_smem, q_bar, q_empty, c, b, h, row0, BM, NWG)
            kv_base += n_tiles
            c += 1


@gluon.jit
def _consumer_persistent(desc_o, LSE, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                         k_empty, v_empty, turn, num_m, ramp, n_work, H, HKV, NQ, NK, sc,
                         BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                         WG: gl.constexpr, NWG: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr,
                         STORE_LSE: gl.constexpr,
                         PINGPONG: gl.constexpr):
    kv_base = 0
    turn_base = 0
    c = 0  # as _producer_persistent
    for i in range(_rounds(n_work, ramp)):
        valid, pid_bh, start_m = _work(i, num_m, ramp, n_work)
        if valid:
            b, h, hk, pid_bh, row0, t_lo, n_tiles = _tile(pid_bh, start_m, H, HKV, NQ, NK, sc, NWG * BM, BN,
                                                          CAUSAL, MODS)
            _consumer_tile(desc_o, LSE, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                           k_empty, v_empty, turn, b, h, pid_bh, row0, t_lo, n_tiles, kv_base, turn_base,
                           c & 1, NQ, NK, sc, BM, BN, D, STAGES, WG, NWG, CAUSAL, MODS, STORE_LSE,
                           PINGPONG, True)
            kv_base += n_tiles
            c += 1
            if n_tiles > 0:
                turn_base += n_tiles + 1
    tma.store_wait(pendings=0)


#: Runtime integers are not specialised (Triton would compile a separate kernel when one is 1 or a multiple
#: of 16): one compile per shape class. The TMA descriptors specialise only on dtype, block shape and shared
#: layout; the LSE pointer's 16-byte alignment always holds (a fresh torch allocation).
@gluon.jit(do_not_specialize=["H", "HKV", "NQ", "NK", "qk_scale", "TAIL", "LEFT", "RIGHT", "cap_in",
                              "cap_out"])
def _attnscope_fwd_hopper_kernel(desc_q, desc_k, desc_v, desc_o, LSE, H, HKV, NQ, NK, qk_scale, TAIL,
                                 LEFT, RIGHT, cap_in, cap_out, SINKS,
                                 CAUSAL: gl.constexpr, MODS: gl.constexpr, STORE_LSE: gl.constexpr,
                                 STAGES: gl.constexpr, PINGPONG: gl.constexpr, NWG: gl.constexpr,
                                 CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_q.block_type.shape[3]
    sc = (qk_scale, LEFT, RIGHT, cap_in, cap_out, SINKS)  # the scale and the score mods' runtime values
    start_m, pid_bh = cta_tile(TAIL)  # causal: rank 0 the heaviest (`_tl.cta_tile`)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - start_m
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // HKV)
    row0 = start_m * (NWG * BM)
    t_lo, n_tiles = _kv_range(row0, NWG * BM, NQ, NK, sc, BN, CAUSAL, MODS)  # every warpgroup runs every tile

    q_smem = buffers(desc_q, NWG)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, wg_bars = kv_ring(desc_k, desc_v, STAGES, NWG, 2)
    q_bar, turn = wg_bars  # turn: ping-pong

    gl.static_assert(NWG == 3, "one CTA per tile: three consumer warpgroups (VARIANTS)")
    # consumers: O is staged in the dead Q buffer (no q_empty hand-back: q_bar stands in)
    gl.warp_specialize(
        [(_consumer_tile, (desc_o, LSE, q_smem, q_smem, k_smem, v_smem, q_bar, q_bar, k_ready, v_ready,
                           k_empty, v_empty, turn, b, h, pid_bh, row0, t_lo, n_tiles, 0, 0, 0, NQ, NK, sc,
                           BM, BN, D, STAGES, 0, NWG, CAUSAL, MODS, STORE_LSE, PINGPONG, False)),
         (_consumer_tile, (desc_o, LSE, q_smem, q_smem, k_smem, v_smem, q_bar, q_bar, k_ready, v_ready,
                           k_empty, v_empty, turn, b, h, pid_bh, row0, t_lo, n_tiles, 0, 0, 0, NQ, NK, sc,
                           BM, BN, D, STAGES, 1, NWG, CAUSAL, MODS, STORE_LSE, PINGPONG, False)),
         (_consumer_tile, (desc_o, LSE, q_smem, q_smem, k_smem, v_smem, q_bar, q_bar, k_ready, v_ready,
                           k_empty, v_empty, turn, b, h, pid_bh, row0, t_lo, n_tiles, 0, 0, 0, NQ, NK, sc,
                           BM, BN, D, STAGES, 2, NWG, CAUSAL, MODS, STORE_LSE, PINGPONG, False)),
         (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                      v_empty, b, h, hk, row0, t_lo, n_tiles, BM, BN, STAGES, NWG))],
        [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


@gluon.jit(do_not_specialize=["B", "H", "HKV", "NQ", "NK", "qk_scale", "LEFT", "RIGHT", "cap_in", "cap_out"])
def _attnscope_fwd_hopper_persistent_kernel(desc_q, desc_k, desc_v, desc_o, LSE, B, H, HKV, NQ, NK, qk_scale,
                                            LEFT, RIGHT, cap_in, cap_out, SINKS,
                                            CAUSAL: gl.constexpr, MODS: gl.constexpr, STORE_LSE: gl.constexpr,
                                            STAGES: gl.constexpr, PINGPONG: gl.constexpr, NWG: gl.constexpr,
                                            CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """Persistent form: one CTA per SM walks the tiles of `_work`; the producer loads the next
    tile's Q and K/V while the consumers finish the last one (epilogue, O store) — the fill and drain of
    the pipeline are paid once per CTA instead of once per tile. O has its own buffer (TMA store in flight
    while the next Q arrives); ``q_empty`` hands each Q buffer back to the producer."""
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_q.block_type.shape[3]
    sc = (qk_scale, LEFT, RIGHT, cap_in, cap_out, SINKS)  # the scale and the score mods' runtime values
    num_m = gl.cdiv(NQ, NWG * BM)
    ramp = _ramp(num_m, NQ, NK, LEFT, RIGHT, NWG * BM, CAUSAL, MODS)
    n_work = (num_m - ramp + (ramp + 1) // 2) * B * H  # items (`_work`): tiles alone and pairs of tiles

    q_smem = buffers(desc_q, NWG)
    o_smem = buffers(desc_o, NWG)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, wg_bars = kv_ring(desc_k, desc_v, STAGES, NWG, 3)
    q_bar, q_empty, turn = wg_bars  # turn: ping-pong

    gl.static_assert(NWG == 2, "persistent: two consumer warpgroups (VARIANTS)")
    gl.warp_specialize(
        [(_consumer_persistent, (desc_o, LSE, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                 v_ready, k_empty, v_empty, turn, num_m, ramp, n_work, H, HKV, NQ, NK, sc,
                                 BM, BN, D, STAGES, 0, NWG, CAUSAL, MODS, STORE_LSE, PINGPONG)),
         (_consumer_persistent, (desc_o, LSE, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                 v_ready, k_empty, v_empty, turn, num_m, ramp, n_work, H, HKV, NQ, NK, sc,
                                 BM, BN, D, STAGES, 1, NWG, CAUSAL, MODS, STORE_LSE, PINGPONG)),
         (_producer_persistent, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                 v_ready, k_empty, v_empty, num_m, ramp, n_work, H, HKV, NQ, NK, sc, BM, BN,
                                 STAGES, NWG, CAUSAL, MODS))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def kernel(variant: str = DEFAULT_VARIANT):
    """The Gluon kernel function of ``variant`` (persistent or one CTA per tile)."""
    return (_attnscope_fwd_hopper_persistent_kernel if VARIANTS[variant].persistent
            else _attnscope_fwd_hopper_kernel)


@functools.lru_cache(maxsize=16)  # (block, element type): a handful, each ~10 us of Python to build
def _layout(block: tuple, elem):
    return gl.NVMMASharedLayout.get_default_for(list(block), elem)


def desc_type(dtype: str, rows: int, d: int) -> str:
    """``triton.compile``'s type of a TMA descriptor of ``dtype`` ("fp16"/"bf16") with [1, 1, rows, d] blocks
    in the default shared layout (`descriptor`'s)."""
    lay = _layout((1, 1, rows, d), gl.bfloat16 if dtype == "bf16" else gl.float16)
    return f"tensordesc<{dtype}[1,1,{rows},{d}],{lay!r}>"


def descriptor(t, rows: int, d: int):
    """The Gluon TMA descriptor of ``t`` (fp16/bf16; its shape and strides) with [1, 1, rows, d] blocks in the
    default shared layout."""
    block = (1, 1, rows, d)
    elem = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), _layout(block, elem))


def signature(d: int, dtype: str, variant: str = DEFAULT_VARIANT):
    """Signature of `kernel` (``variant``) for ``triton.compile`` without a GPU (``dtype`` "fp16"/"bf16"):
    resource reports (bench/sm90_resources.py)."""
    bm, bn = config(d, variant)[:2]
    persistent = VARIANTS[variant].persistent
    ds = functools.partial(desc_type, dtype, d=d)
    return {"desc_q": ds(bm), "desc_k": ds(bn), "desc_v": ds(bn), "desc_o": ds(bm), "LSE": "*fp32",
            **({"B": "i32"} if persistent else {}), "H": "i32", "HKV": "i32", "NQ": "i32", "NK": "i32",
            "qk_scale": "fp32", **({} if persistent else {"TAIL": "i32"}), "LEFT": "i32", "RIGHT": "i32",
            "cap_in": "fp32", "cap_out": "fp32",
            "SINKS": "*fp32",
            **{n: "constexpr" for n in ("CAUSAL", "MODS", "STORE_LSE", "STAGES", "PINGPONG", "NWG",
                                        "CONSUMER_REGS", "num_warps")}}


def mods_flags(windowed: bool, softcap: float, sinks: bool) -> int:
    """The constexpr ``MODS`` of a call: `WINDOW` | `SOFTCAP` | `SINKS` bits of the mods it uses."""
    return (1 if windowed else 0) | (2 if softcap > 0 else 0) | (4 if sinks else 0)


def constexprs(d: int, causal: bool, return_lse: bool, variant: str = DEFAULT_VARIANT, mods: int = 0):
    """The constexpr arguments of ``variant`` (a `VARIANTS` name) for head dim ``d`` (``mods``: `mods_flags`;
    a windowed call has ``causal`` False, its right bound carrying the diagonal)."""
    cfg = config(d, variant)
    return {"CAUSAL": causal, "MODS": mods, "STORE_LSE": return_lse, "STAGES": cfg.STAGES,
            "PINGPONG": VARIANTS[variant].pingpong, "NWG": cfg.NWG, "CONSUMER_REGS": CONSUMER_REGS[cfg.NWG],
            "num_warps": NUM_WARPS}


def launcher(q, k, v, o, qk_scale: float, causal: bool, return_lse: bool, variant: str = DEFAULT_VARIANT,
             mods=None):
    """``run(q, k, v, o, lse, sinks=None)``: `launch` on tensors of these layouts (shapes, strides, dtype),
    its grid, constexprs, scalars and shared layouts worked out once (kernels/fwd.py keeps one per layout). A
    head dim between the built ones runs the build of its `head_block` (TMA reads zeros past d, clips O)."""
    (B, Hq, Nq, d_in), (Hkv, Nk), d = q.shape, k.shape[1:3], head_block(q.shape[3])
    if variant in VARIANTS and d not in VARIANTS[variant].configs:
        built = sorted(VARIANTS[variant].configs)
        raise NotImplementedError(f"Hopper variant {variant!r}: head_dim {d_in} is not supported; supported: "
                                  f"{built} and the multiples of 8 that run in their tiles (`head_block`)")
    cfg = config(d, variant)
    windowed, softcap = (mods.windowed, mods.softcap) if mods is not None else (False, 0.0)
    flags = mods_flags(windowed, softcap, mods is not None and mods.sinks is not None)
    causal = causal and not windowed  # a window carries the diagonal in its right bound
    left, right = (mods.left, mods.right) if windowed else (-1, -1)
    # softcap: log2-unit score = cap log2(e) tanh(s scale / cap) (`_softmax`, the hardware tanh)
    cap_in, cap_out = (qk_scale / LOG2E.value / softcap, softcap * LOG2E.value) if softcap > 0 else (0.0, 0.0)
    descs = [descriptor_over(descriptor(t, r, d), None)  # templates: `run` puts the tensors in
             for t, r in ((q, cfg.BM), (k, cfg.BN), (v, cfg.BN), (o, cfg.BM))]
    tiles, consts = triton.cdiv(Nq, cfg.NWG * cfg.BM), constexprs(d, causal, return_lse, variant, flags)
    if VARIANTS[variant].persistent:
        ramp = persistent_ramp(tiles, cfg.NWG * cfg.BM, Nq, Nk, causal, (left, right) if windowed else None)
        items = tiles - ramp + (ramp + 1) // 2  # `_work`: the ramp's tiles go in pairs
        grid, sizes = (min(items * B * Hq, num_sms(torch, q.device)),), (B, Hq, Hkv, Nq, Nk, qk_scale)
    else:
        tail = launch_tail(causal, tiles, B * Hq, num_sms(torch, q.device))
        grid, sizes = (tiles, B * Hq), (Hq, Hkv, Nq, Nk, qk_scale, tail)
    launch = planned_launch(kernel(variant), grid, consts, q.device)

    def run(q, k, v, o, lse, sinks=None):
        s = lse if sinks is None else sinks  # an unused SINKS pointer: any fp32
        args = (*map(descriptor_over, descs, (q, k, v, o)), lse, *sizes, left, right, cap_in, cap_out, s)
        return launch(args, (lse.data_ptr() | s.data_ptr()) % 16 == 0)  # a descriptor's key has no address
    return run


def launch(q, k, v, o, lse, qk_scale: float, causal: bool, return_lse: bool, variant: str = DEFAULT_VARIANT,
           mods=None):
    """Launch ``variant`` (a `VARIANTS` name) on inputs fwd.launch checked, writing ``o`` and ``lse``;
    ``mods``: a `_common.Mods` or None. Each (variant, d, dtype, causal, mods used, return_lse) compiles once
    per process. Returns the compiled kernel (``.n_regs``, ``.n_spills``, ``.metadata.shared``)."""
    run = launcher(q, k, v, o, qk_scale, causal, return_lse, variant, mods)
    return run(q, k, v, o, lse, None if mods is None else mods.sinks)
