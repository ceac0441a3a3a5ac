"""Balanced split-KV decode for Hopper (sm_90) in Gluon: every SM busy, K and V copies staggered.

The portable decode kernel (`attnscope.kernels.decode`) splits each (batch, kv head) item's keys evenly; at
B x Hkv x splits = 128 programs on a 132-SM H200 four SMs idle, and Triton's pipeliner issues tile i + 2's
K and V copies together after tile i's arithmetic. Measured there (BENCHMARKS.md, fourteenth session), it
sits 0-1.7 % below SDPA CUDNN in CUDA-graph replay. This kernel (`_attnscope_decode_stream_kernel`):

- **Balanced split.** The items' key tiles (``T = cdiv(L_max, BN)`` per item) are laid end to end, ``W =
  items x T`` tiles in all, and program ``p`` of ``P`` streams tiles ``[p W / P, (p + 1) W / P)``
  (`program_range`), ``P`` about two per SM (`stream_programs`). The TMA copies of the next tiles run
  ahead across an item boundary like any other tile, so a program never drains its pipeline mid-way.
- **Staggered copies** (FlashAttention-2's order, as cuDNN's decode kernel): ``NK`` K and ``NV`` V buffers;
  after ``S^T = K_i Q^T`` has read K_i, K_{i + NK} is copied into its buffer, after ``O^T += V_i^T P^T``
  V_{i + NV}. One K and one V buffer (74 KiB of shared memory) let two programs share an SM.
- **Transposed MMAs.** Keys (then d) are wgmma's M = 128 and the ``BR`` = 16..64 query rows of the item
  (its G heads, padded) the N, so no 64-row query tile is wasted on G <= 8 (``warpgroup_mma`` reads K and
  V straight from the TMA buffers; P^T goes through a small shared buffer).
- **Segments and merge.** A program's range covers pieces ("segments") of one or more items. At a
  segment's end it writes the item's final O and LSE when the item lies inside its range, else its
  partial (O_s normalised, base-2 lse_s, fp32) into slot ``p - first program of the item`` and takes a
  ticket (gpu-scope acq_rel atomic, the portable kernel's fused-merge pattern); the last of the item's
  `segments` merges the partials by their logsumexp and resets the counter.

Keys past a sequence's length (``cache_seqlens``) are neither copied nor computed; an empty sequence gives
O = 0, LSE = -inf. One query per sequence (Nq = 1), dense cache ``[B, Hkv, L_max, d]`` with TMA-legal
strides, d 64 or 128, fp16/bf16, G <= 16: `stream_supported` says which layouts; `DecodePlan` runs this
kernel for them on sm_90 where the split is long enough (`stream_programs`), the portable kernel elsewhere.
"""

from __future__ import annotations

import math

from attnscope.kernels._common import import_torch_triton

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

BLOCK_N = 128  # keys per tile: wgmma's M of S^T
NUM_WARPS = 4  # one warpgroup
#: K and V buffers: one each (bench/decode_stream.py: two programs per SM then, measured best); the
#: kernel's copy logic is written for exactly these
NK, NV = 1, 1
PROGRAMS_PER_SM = 2
MAX_GROUP = 16  # query heads per kv head (wgmma's N = 16); 32 and 64 would spill (ptxas, sm_90)
MIN_TILES_PER_PROGRAM = 16  # shorter ranges split items into many partials: the portable kernel runs those
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


def program_range(p: int, programs: int, total: int) -> tuple[int, int]:
    """Tiles ``[lo, hi)`` of program ``p`` when ``total`` tiles are shared by ``programs`` (the kernel's
    split, written out for the host)."""
    return p * total // programs, (p + 1) * total // programs


def program_of(g: int, programs: int, total: int) -> int:
    """The program whose `program_range` holds tile ``g`` (the kernel's ``_program_of``)."""
    return ((g + 1) * programs - 1) // total


def segments(item: int, tiles: int, programs: int, total: int) -> int:
    """How many programs share item ``item`` (tiles ``[item * tiles, (item + 1) * tiles)``): its partials."""
    first = program_of(item * tiles, programs, total)
    return program_of(item * tiles + tiles - 1, programs, total) - first + 1


def stream_programs(items: int, tiles: int, sms: int, forced: bool = False) -> int:
    """Programs of a layout: about `PROGRAMS_PER_SM` per SM, each with at least `MIN_TILES_PER_PROGRAM` tiles
    (shorter ranges split items into many partials). Unless ``forced`` (``impl="hopper"``: at least one
    program), 0 when that leaves fewer than two programs per SM: the portable kernel's split runs then.

    >>> stream_programs(16 * 8, 256, 132)   # B 16, Hkv 8, L 32k: 264 programs of 124 tiles
    264
    >>> stream_programs(1 * 32, 32, 132)    # B 1, Hkv 32, L 4k: 1,024 tiles, 64 programs of 16
    0
    >>> stream_programs(1 * 32, 32, 132, forced=True)
    64
    """
    programs = min(PROGRAMS_PER_SM * sms, max(1, items * tiles // MIN_TILES_PER_PROGRAM))
    return programs if forced or programs == PROGRAMS_PER_SM * sms else 0


def max_segments(items: int, tiles: int, programs: int) -> int:
    """The most partials any item has (the partial buffers' slot count). Items of equal length: the first
    and the last item bound it, and so does the longest run of programs inside an item, which is at most
    ``ceil(tiles / floor(total / programs)) + 1``."""
    total = items * tiles
    per = total // programs
    bound = -(-tiles // per) + 1
    return min(bound, programs)


def _rows(group: int) -> int:
    """wgmma's N for ``group`` query heads per kv head: a power of two, at least 16."""
    return max(16, triton.next_power_of_2(group))


def _tma_ok(t) -> bool:
    """A tensor a TMA descriptor can address: unit last stride, 16-byte aligned base and other strides."""
    elt = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s * elt % 16 == 0 for s in t.stride()[:-1]))


def stream_supported(q, k_cache, v_cache, block_table, scale_raw: bool) -> str | None:
    """None if this kernel can run the layout (values aside), else why not (one line)."""
    if block_table is not None:
        return "paged caches run the portable kernel"
    B, Hq, Nq, d = q.shape
    if Nq != 1:
        return "Nq > 1 runs the portable kernel"
    if d not in (64, 128):
        return f"head_dim {d} (supported: 64, 128)"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype}"
    if Hq // k_cache.shape[1] > MAX_GROUP:
        return f"more than {MAX_GROUP} query heads per kv head"
    if scale_raw:
        return "scales past RAW_SCORES_ABOVE run the portable kernel"
    if not all(_tma_ok(t) for t in (q[:, :, 0, :], k_cache, v_cache)):
        return "strides or base pointers a TMA descriptor cannot address"
    return None


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def descriptors(q, k_cache, v_cache):
    """TMA descriptors of q's rows (``[B, Hq, d]``, blocks of `_rows` heads) and of the K / V caches
    (``[B, Hkv, L_max, d]``, blocks of `BLOCK_N` keys)."""
    B, Hq, _, d = q.shape
    q3 = q[:, :, 0, :]
    block_q = [1, _rows(Hq // k_cache.shape[1]), d]
    dq = TensorDescriptor(q3, list(q3.shape), list(q3.stride()), block_q, _layout(block_q, q.dtype))
    block = [1, 1, BLOCK_N, d]
    dk, dv = (TensorDescriptor(t, list(t.shape), list(t.stride()), block, _layout(block, t.dtype))
              for t in (k_cache, v_cache))
    return dq, dk, dv


@gluon.jit
def _program_of(g, P, W):
    return ((g + 1) * P - 1) // W


@gluon.jit
def _copy_tile(desc, smem, bar, g, T, n_kv_heads, BN: gl.constexpr, pred):
    item = g // T
    coord = [item // n_kv_heads, item % n_kv_heads, (g - item * T) * BN, 0]
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, coord, bar, smem, pred=pred)


@gluon.jit
def _copy_q(desc_q, smem, bar, item, n_kv_heads, GROUP: gl.constexpr, pred):
    mbarrier.expect(bar, desc_q.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc_q, [item // n_kv_heads, (item % n_kv_heads) * GROUP, 0], bar, smem,
                                    pred=pred)


@gluon.jit
def _length(SEQLENS, item, n_kv_heads, l_max, HAS_SEQLENS: gl.constexpr):
    """Keys of ``item``'s sequence: its ``cache_seqlens`` entry, else L_max."""
    if HAS_SEQLENS:
        return gl.load(SEQLENS + item // n_kv_heads)
    else:
        return l_max


@gluon.jit
def _merge(O_PART, LSE_PART, O, LSE, row0, nseg, S_MAX, GROUP: gl.constexpr, D: gl.constexpr,
           MS: gl.constexpr, WRITE_LSE: gl.constexpr):
    """The logsumexp merge of an item's ``nseg <= MS`` partials, one query row after another (rows
    ``row0 ..``, each row's partials loaded at once); writes O (and LSE, natural log). Empty partials
    (lse -inf) weigh 0; no key at all gives O = 0, LSE = -inf."""
    L2: gl.constexpr = gl.BlockedLayout([1, D // 32], [1, 32], [4, 1], [1, 0])  # [MS, D]
    offs_s = gl.arange(0, MS, layout=gl.SliceLayout(1, L2))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, L2))
    ok = offs_s < nseg
    for r in gl.static_range(GROUP):
        row = (row0 + r).to(gl.int64)
        # .cg: at L2, never from this SM's L1 (other SMs wrote these lines)
        lse_s = gl.load(LSE_PART + row * S_MAX + offs_s, mask=ok, other=float("-inf"), cache_modifier=".cg")
        o_s = gl.load(O_PART + (row * S_MAX + offs_s)[:, None] * D + offs_d[None, :], mask=ok[:, None],
                      other=0.0, cache_modifier=".cg")
        m = gl.max(lse_s, axis=0)
        m_safe = gl.where(m == float("-inf"), 0.0, m)
        w = gl.exp2(lse_s - m_safe)  # 0 for empty partials
        lw = gl.sum(w, axis=0)
        lw_safe = gl.where(lw == 0.0, 1.0, lw)
        o = gl.sum(w[:, None] * o_s, axis=0) / lw_safe
        gl.store(O + row * D + offs_d, o.to(O.dtype.element_ty))
        if WRITE_LSE:
            gl.store(LSE + row, gl.where(lw == 0.0, float("-inf"), m + gl.log2(lw_safe)) * LN2)


@gluon.jit
def _ticket(O_PART, LSE_PART, O, LSE, SEM, item, T, P, W, S_MAX, GROUP: gl.constexpr, D: gl.constexpr,
            MS: gl.constexpr, WRITE_LSE: gl.constexpr):
    """After this program's partial of ``item`` is out: its ticket (gpu-scope acq_rel atomic, the portable
    kernel's fused-merge pattern); the last of the item's programs merges and resets the counter."""
    nseg = _program_of(item * T + T - 1, P, W) - _program_of(item * T, P, W) + 1
    if nseg > 1:
        ticket = gl.atomic_add(SEM + item, 1, sem="acq_rel", scope="gpu")
        if ticket == nseg - 1:
            _merge(O_PART, LSE_PART, O, LSE, item * GROUP, nseg, S_MAX, GROUP, D, MS, WRITE_LSE)
            gl.atomic_xchg(SEM + item, 0)  # ready for the next launch


@gluon.jit(do_not_specialize=["n_kv_heads", "l_max", "T", "W", "P", "S_MAX", "qk_scale"])
def _attnscope_decode_stream_kernel(desc_q, desc_k, desc_v, SEQLENS, O_PART, LSE_PART, O, LSE, SEM,
                                    n_kv_heads, l_max, T, W, P, S_MAX, qk_scale, GROUP: gl.constexpr,
                                    HAS_SEQLENS: gl.constexpr, WRITE_LSE: gl.constexpr, MS: gl.constexpr,
                                    num_warps: gl.constexpr):
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_k.block_type.shape[3]
    BR: gl.constexpr = desc_q.block_type.shape[1]
    p = gl.program_id(0)
    lo = (p * W) // P
    hi = ((p + 1) * W) // P
    n = hi - lo

    # one K and one V buffer (`NK`, `NV`), two Q slots (this segment's, the next one's)
    q_smem = gl.allocate_shared_memory(desc_q.dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, desc_v.block_type.shape, desc_v.layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BR], desc_k.dtype)
    p_smem = gl.allocate_shared_memory(desc_k.dtype, [BN, BR], p_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # K, V
    for s in gl.static_range(2):
        mbarrier.init(q_bar.index(s), count=1)
        mbarrier.init(kv_bar.index(s), count=1)
    fence_async_shared()
    gl.thread_barrier()  # every warp sees the initialised barriers before it waits on one
    k_bar = kv_bar.index(0)
    v_bar = kv_bar.index(1)

    # Tiles past a sequence's length are neither copied nor computed. Each tile with keys is copied once:
    # by the prologue (the range's first tile), after the previous tile's MMA read the buffer (previous
    # tile with keys), or at the previous iteration's start (previous tile without keys).
    item0 = lo // T
    len0 = _length(SEQLENS, item0, n_kv_heads, l_max, HAS_SEQLENS)
    _copy_q(desc_q, q_smem.index(0), q_bar.index(0), item0, n_kv_heads, GROUP, n > 0)
    first_ok = (n > 0) & ((lo - item0 * T) * BN < len0)
    _copy_tile(desc_k, k_smem, k_bar, lo, T, n_kv_heads, BN, first_ok)
    _copy_tile(desc_v, v_smem, v_bar, lo, T, n_kv_heads, BN, first_ok)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BR, 16])
    col: gl.constexpr = gl.SliceLayout(0, s_layout)  # [BR]: one value per query row
    offs_r = gl.arange(0, BR, layout=col)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BR], float("-inf"), gl.float32, col)
    l_i = gl.zeros([BR], gl.float32, col)
    acc = gl.zeros([D, BR], gl.float32, s_layout)
    j = 0  # segments begun (Q slot j % 2)
    kw = 0  # tiles computed (the K / V barriers' phase)
    ln = len0  # keys of the current item
    for i in range(n):
        g = lo + i
        item = g // T
        t = g - item * T
        if (i > 0) & (t == 0):
            ln = _length(SEQLENS, item, n_kv_heads, l_max, HAS_SEQLENS)
        if (i == 0) | (t == 0):  # a segment begins: its Q is in slot j % 2, the next item's goes to the other
            mbarrier.wait(q_bar.index(j % 2), (j // 2) & 1)
            _copy_q(desc_q, q_smem.index((j + 1) % 2), q_bar.index((j + 1) % 2), item + 1, n_kv_heads, GROUP,
                    (item + 1) * T < hi)
        next_ok = i + 1 < n  # tile g + 1 is in the range: does it hold keys?
        if next_ok:
            if t + 1 < T:
                next_ok = (t + 1) * BN < ln
            else:
                next_ok = _length(SEQLENS, item + 1, n_kv_heads, l_max, HAS_SEQLENS) > 0
        if t * BN < ln:
            qt = q_smem.index(j % 2).reshape([BR, D]).permute((1, 0))  # [D, BR]: wgmma's B
            mbarrier.wait(k_bar, kw & 1)
            tok = warpgroup_mma(k_smem.reshape([BN, D]), qt, gl.zeros([BN, BR], gl.float32, s_layout),
                                use_acc=False, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
            gl.thread_barrier()  # every warp's share of the MMA has read K before TMA overwrites it
            _copy_tile(desc_k, k_smem, k_bar, g + 1, T, n_kv_heads, BN, next_ok)
            st = gl.where((t * BN + offs_n)[:, None] < ln, st * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(st, axis=0))
            m_new = gl.where(m_new == float("-inf"), 0.0, m_new)
            pt = gl.exp2(st - m_new[None, :])
            alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha + gl.sum(pt, axis=0)
            m_i = m_new
            acc = acc * alpha[None, :]
            p_smem.store(pt.to(desc_k.dtype))
            fence_async_shared()
            mbarrier.wait(v_bar, kw & 1)
            tok = warpgroup_mma(v_smem.reshape([BN, D]).permute((1, 0)), p_smem, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
            gl.thread_barrier()  # likewise V
            _copy_tile(desc_v, v_smem, v_bar, g + 1, T, n_kv_heads, BN, next_ok)
            kw += 1
        else:  # no keys here: the buffers are free, copy the next tile now
            _copy_tile(desc_k, k_smem, k_bar, g + 1, T, n_kv_heads, BN, next_ok)
            _copy_tile(desc_v, v_smem, v_bar, g + 1, T, n_kv_heads, BN, next_ok)
        if (i == n - 1) | (t == T - 1):  # the segment ends
            first = _program_of(item * T, P, W)
            nseg = _program_of(item * T + T - 1, P, W) - first + 1
            row0 = item * GROUP  # rows b * Hq + h of O for the item's heads h = hk * G ..
            rows = (row0 + offs_r).to(gl.int64)
            ok_r = offs_r < GROUP
            l_safe = gl.where(l_i == 0.0, 1.0, l_i)
            lse2 = gl.where(l_i == 0.0, float("-inf"), m_i + gl.log2(l_safe))  # base 2; -inf: no key
            o = acc / l_safe[None, :]
            if nseg == 1:
                o_ptr = O + rows[None, :] * D + offs_d[:, None]
                gl.store(o_ptr, o.to(O.dtype.element_ty), mask=ok_r[None, :])
                if WRITE_LSE:
                    gl.store(LSE + rows, lse2 * LN2, mask=ok_r)
            else:  # only the range's first and last segments can be partial: tickets after the loop
                part = rows * S_MAX + (p - first)
                gl.store(O_PART + part[None, :] * D + offs_d[:, None], o, mask=ok_r[None, :])
                gl.store(LSE_PART + part, lse2, mask=ok_r)
            m_i = gl.full([BR], float("-inf"), gl.float32, col)
            l_i = gl.zeros([BR], gl.float32, col)
            acc = gl.zeros([D, BR], gl.float32, s_layout)
            j += 1

    # The stream is done: the tickets (and merges) of the partial first and last items, off its path
    gl.thread_barrier()  # every warp's partial stores come before the gpu-scope release of the ticket
    if n > 0:
        first_item = lo // T
        last_item = (hi - 1) // T
        _ticket(O_PART, LSE_PART, O, LSE, SEM, first_item, T, P, W, S_MAX, GROUP, D, MS, WRITE_LSE)
        if last_item != first_item:
            _ticket(O_PART, LSE_PART, O, LSE, SEM, last_item, T, P, W, S_MAX, GROUP, D, MS, WRITE_LSE)


def signature(d: int, dtype: str, group: int) -> dict:
    """`_attnscope_decode_stream_kernel`'s signature for ``triton.compile`` without a GPU (``dtype``
    "fp16"/"bf16"): the CPU compile test and bench/decode_resources.py."""
    elem = gl.bfloat16 if dtype == "bf16" else gl.float16
    br = _rows(group)

    def ds(shape):
        layout = gl.NVMMASharedLayout.get_default_for(shape, elem)
        return f"tensordesc<{dtype}{list(shape)},{layout!r}>".replace(" ", "")

    return {"desc_q": ds([1, br, d]), "desc_k": ds([1, 1, BLOCK_N, d]), "desc_v": ds([1, 1, BLOCK_N, d]),
            "SEQLENS": "*i32", "O_PART": "*fp32", "LSE_PART": "*fp32", "O": f"*{dtype}", "LSE": "*fp32",
            "SEM": "*i32", **{n: "i32" for n in ("n_kv_heads", "l_max", "T", "W", "P", "S_MAX")},
            "qk_scale": "fp32",
            **{n: "constexpr" for n in ("GROUP", "HAS_SEQLENS", "WRITE_LSE", "MS", "num_warps")}}


class StreamLaunch:
    """What a plan fixes for this kernel: programs, partial buffers, counters, constexprs. ``run`` builds
    the TMA descriptors of the call's tensors (cached while their data pointers stay) and launches once."""

    def __init__(self, q, k_cache, v_cache, has_seqlens: bool, write_lse: bool, sm_scale: float, sms: int):
        B, Hq, _, d = q.shape
        Hkv, L_max = k_cache.shape[1], k_cache.shape[2]
        self.group = Hq // Hkv
        items, tiles = B * Hkv, -(-L_max // BLOCK_N)
        self.programs = stream_programs(items, tiles, sms, forced=True)
        self.total = items * tiles
        self.tiles = tiles
        self.s_max = max_segments(items, tiles, self.programs)
        dev = q.device
        self.o_part = torch.empty((B * Hq, self.s_max, d), dtype=torch.float32, device=dev)
        self.lse_part = torch.empty((B * Hq, self.s_max), dtype=torch.float32, device=dev)
        self.sem = torch.zeros(items, dtype=torch.int32, device=dev)
        self.hkv, self.l_max = Hkv, L_max
        self.qk_scale = sm_scale * math.log2(math.e)
        self.consts = {"GROUP": self.group, "HAS_SEQLENS": has_seqlens, "WRITE_LSE": write_lse,
                       "MS": max(4, triton.next_power_of_2(self.s_max)), "num_warps": NUM_WARPS}
        self._key = self._desc = None

    def run(self, q, k_cache, v_cache, cache_seqlens, o, lse):
        key = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())
        if key != self._key:
            self._desc, self._key = descriptors(q, k_cache, v_cache), key
        dq, dk, dv = self._desc
        seqlens = cache_seqlens if cache_seqlens is not None else self.sem  # placeholder, never read
        _attnscope_decode_stream_kernel[(self.programs,)](
            dq, dk, dv, seqlens, self.o_part, self.lse_part, o, lse, self.sem, self.hkv, self.l_max,
            self.tiles, self.total, self.programs, self.s_max, self.qk_scale, **self.consts)
