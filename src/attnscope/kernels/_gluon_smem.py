"""Shared memory of the Gluon Hopper kernels (sm_90): TMA-block buffers, mbarrier arrays, the K/V ring.

A kernel allocates its buffers and mbarriers (`kv_ring`, `dkdv_smem`: all allocated, then initialised and
fenced once), then forks into a TMA producer warp and consumer warpgroups (`gl.warp_specialize`).
The K/V ring is FlashAttention-3's producer-consumer pipeline (Shah et al., arXiv:2407.08608, §3.1):
``STAGES`` slots of K and V; ``k_ready`` / ``v_ready`` complete a phase on the TMA byte count (`load_kv`),
``k_empty`` / ``v_empty`` on one arrival from each of the ``NWG`` consumer warpgroups.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma


@gluon.jit
def buffers(desc, n: gl.constexpr):
    """``n`` blocks of the TMA descriptor ``desc`` in its shared layout: [n, *block]."""
    return gl.allocate_shared_memory(desc.dtype, [n] + desc.block_type.shape, desc.layout)


@gluon.jit
def barriers(n: gl.constexpr, k: gl.constexpr):
    """``k`` arrays of ``n`` mbarriers (a tuple), not yet initialised (`init`)."""
    bars = ()
    for _ in gl.static_range(k):
        bars = bars + (gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout()),)
    return bars


@gluon.jit
def init(bars, counts):
    """Initialise the mbarrier arrays ``bars``, array a's to complete a phase on ``counts[a]`` arrivals (1 for
    a TMA byte count), index by index: Gluon puts a CTA barrier between two writes to one array, so this
    order needs ``n - 1`` of them, not one per array and index. A kernel allocates all its buffers before the
    first init: an array no partition uses dies at its init, and a buffer allocated later could reuse it."""
    n: gl.constexpr = bars[0].shape[0]
    for i in gl.static_range(n):
        for a in gl.static_range(len(bars)):
            mbarrier.init(bars[a].index(i), count=counts[a])


@gluon.jit
def kv_ring(desc_k, desc_v, STAGES: gl.constexpr, NWG: gl.constexpr, N_WG: gl.constexpr):
    """The K/V ring of ``STAGES`` slots and ``N_WG`` arrays of ``NWG`` mbarriers (one per consumer warpgroup,
    count 1), initialised and fenced: ``(k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, arrays)``."""
    k_smem = buffers(desc_k, STAGES)
    v_smem = buffers(desc_v, STAGES)
    wg = barriers(NWG, N_WG)
    ring = barriers(STAGES, 4)
    init(wg, (1,) * N_WG)
    init(ring, (1, 1, NWG, NWG))  # empty: every consumer warpgroup's arrival
    fence_async_shared()
    return k_smem, v_smem, ring[0], ring[1], ring[2], ring[3], wg


@gluon.jit
def load_kv(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, it, b, hk, row0, t,
            STAGES: gl.constexpr):
    """Producer: K/V tile ``t`` (rows ``row0 + t BN`` on) of (batch ``b``, kv head ``hk``) into ring slot
    ``it % STAGES`` (``it``: slots filled so far), K and V each once the consumers handed the slot back."""
    BN: gl.constexpr = desc_k.block_type.shape[2]
    s = it % STAGES
    ph = ((it // STAGES) & 1) ^ 1  # a fresh barrier passes parity 1 at once: the first round is free
    mbarrier.wait(k_empty.index(s), ph)
    mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [b, hk, row0 + t * BN, 0], k_ready.index(s), k_smem.index(s))
    mbarrier.wait(v_empty.index(s), ph)
    mbarrier.expect(v_ready.index(s), desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_v, [b, hk, row0 + t * BN, 0], v_ready.index(s), v_smem.index(s))


@gluon.jit
def dkdv_smem(desc_k, desc_v, desc_q, desc_do, desc_lse, desc_delta, STAGES: gl.constexpr, NWG: gl.constexpr,
              ONEPASS: gl.constexpr, N_DS: gl.constexpr):
    """The dK/dV kernels' shared memory, initialised and fenced: ``(k_smem, v_smem, q_smem, do_smem, lse_smem,
    delta_smem, kv_bar, q_ready, q_empty, ds_smem, ds_bar)``. K and V of the CTA's keys, ``NWG`` blocks each,
    behind one mbarrier ``kv_bar``; the (Q, dO, LSE2, Delta) ring of ``STAGES`` slots, ``q_ready`` on the TMA
    byte count, ``q_empty`` on every consumer warpgroup's arrival; ``ONEPASS``: every warpgroup's dS^T in a
    ring of 2, ``ds_smem`` [2 NWG, keys, rows] (slot x NWG + warpgroup; the dQ product's A; else K stands
    in); ``ds_bar``: ``N_DS`` mbarriers of ``NWG`` arrivals (0: none, ``kv_bar`` stands in)."""
    k_smem = buffers(desc_k, NWG)
    v_smem = buffers(desc_v, NWG)
    q_smem = buffers(desc_q, STAGES)
    do_smem = buffers(desc_do, STAGES)
    lse_smem = buffers(desc_lse, STAGES)  # LSE2 and Delta per query tile
    delta_smem = buffers(desc_delta, STAGES)
    kv_bar = barriers(1, 1)
    ring = barriers(STAGES, 2)
    if ONEPASS:
        BNW: gl.constexpr = desc_k.block_type.shape[2]  # keys per consumer warpgroup
        BM: gl.constexpr = desc_q.block_type.shape[2]
        ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        ds_smem = gl.allocate_shared_memory(desc_q.dtype, [2 * NWG, BNW, BM], ds_layout)  # 128-byte rows
    else:
        ds_smem = k_smem  # not read
    if N_DS > 0:
        ds_bar = barriers(N_DS, 1)
        init(ds_bar, (NWG,))
    else:
        ds_bar = kv_bar  # not used
    init(kv_bar, (1,))
    init(ring, (1, NWG))
    fence_async_shared()
    return (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar[0], ring[0], ring[1], ds_smem,
            ds_bar[0])
