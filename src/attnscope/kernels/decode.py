"""Split-KV decode attention (Flash-Decoding) in Triton: dense or paged KV cache, 1..Nq new queries.

Algorithm: Dao, Haziza, Massa, Sizov, *Flash-Decoding* (2023); spec §6, §6.1. With few new queries per
sequence a prefill kernel launches only B x H programs, so the long axis, the KV sequence, is split:

- **phase 1** (`_attnscope_decode_split_kernel`), grid ``(B * Hkv * M_tiles, num_splits)``: a program
  streams one contiguous chunk of the keys of one (batch, kv head, row tile) through the online softmax.
  Rows pack the ``G = Hq / Hkv`` heads sharing the kv head and the ``Nq`` queries (row ``r = i * G + g``),
  so each K/V byte leaves HBM once per tile. Query i sits at position ``len - Nq + i`` and sees keys
  ``0 .. len - Nq + i`` (causal, bottom-right); a query at a negative position sees nothing.
- **phase 2**, the logsumexp merge of the splits (`_tl.lse_merge_step`, also the ring's; float64 spec:
  `attnscope.reference.combine`), fused into phase 1 (the last program of a tile, by a gpu-scope atomic
  ticket, merges) or a separate kernel (`_attnscope_decode_combine_kernel`). Empty splits weigh 0; an
  empty row gives O = 0, LSE = -inf. With one split phase 1 writes the final output.

Layouts: dense ``k_cache [B, Hkv, L_max, d]`` (any strides, unit last); paged ``k_cache [num_pages,
page_size, Hkv, d]`` with ``block_table int32 [B, max_pages]`` (flash-attn / vLLM): key ``j`` of sequence
``b`` is row ``j % page_size`` of page ``block_table[b, j // page_size]``; a block of BLOCK_N keys reads
whole pages, in any order, possibly shared. Chunk tiles (Nq > 1) on a dense cache take the paged loop over
a plan-owned table of BLOCK_N-key pages (`_dense_pages`) when the strides allow: Triton pipelines it better.

Host side: `DecodePlan` (FlashInfer's plan/run) checks a layout, picks the split count, blocks and merge,
and allocates the partials once; ``plan.run`` makes one launch (two with the separate merge), so it can be
captured in a CUDA graph. `flash_decode` keeps its plans in a bounded LRU cache. K/V offsets from the
loop's base pointers are int32 where the plan's span check allows (`_offsets_fit_int32`), else int64.
Scores are base 2 (``qk_scale = scale * log2 e``, ``exp2``); the public LSE is natural-log. Measurements:
BENCHMARKS.md.
"""

from __future__ import annotations

import collections
import functools
import math
import threading

from attnscope.errors import InputError, expect
from attnscope.kernels._common import (
    LOG2E,
    check_device,
    check_disjoint,
    check_flags,
    check_head_dim,
    check_same,
    check_scale,
    check_tensor,
    import_torch_triton,
    interpreting,
    num_sms,
)

torch, triton = import_torch_triton()  # kernels/ is the optional extra: ImportError names the install command
import triton.language as tl  # noqa: E402

from attnscope.kernels._tl import lse_merge_finish, lse_merge_step, round_bf16  # noqa: E402

MAX_NUM_SPLITS = 1024  # a launch-grid bound (grid axis 1 < 65536) with room; 128 is already plenty
MIN_KEYS_PER_SPLIT = 256  # shorter splits spend more on their partial write + prologue than they save
SPLIT_CAP = 128  # the heuristic's cap: 128 splits already fill 132 SMs from a single (batch, kv head)
WAVES = 1  # programs the heuristic aims for, in multiples of the SM count (measured: one wave wins)
# Many (batch, kv head) items, long keys: split when the last wave would leave most SMs idle (`_tail_splits`)
TAIL_MIN_KEYS = 16384  # shorter programs lose more to the extra programs' fill than the tail costs
TAIL_FILL = 0.6  # a last wave with at least this share of the SMs busy keeps the bandwidth
TAIL_MAX_SPLITS = 4
#: ``scale * log2 e`` above which the kernel keeps its running max in raw scores (``MAX_UNSCALED``, as the
#: dense forward does past 1) and runs one split: base-2 scores ``s * qk_scale`` of unit-size inputs would
#: pass fp32 from about 1e37 on (inf - inf = NaN), and split partials carry base-2 LSEs that may be +inf
RAW_SCORES_ABOVE = 1e4


def default_num_splits(batch: int, kv_heads: int, seqlen: int, sms: int = 132, *, waves: int = WAVES,
                       min_keys: int = MIN_KEYS_PER_SPLIT, cap: int = SPLIT_CAP) -> int:
    """How many KV splits phase 1 uses when ``num_splits`` is not given.

    Without splitting, decode launches ``batch * kv_heads`` programs. Split until about ``waves * sms``
    programs run (one program per SM already streams at the bandwidth ceiling; each extra split costs a
    partial write and a longer merge), never below ``min_keys`` keys per split, never above ``cap``
    (measured: bench/decode_splits.py, BENCHMARKS.md):

        num_splits = clamp(floor(waves * sms / (batch * kv_heads)), 1, min(cap, seqlen // min_keys))

    With ``waves * sms`` items or more that formula gives 1 split, unless the keys are long (at least
    `TAIL_MIN_KEYS`) and the last wave of programs would keep fewer than `TAIL_FILL` of the SMs busy: then
    the fewest splits (2 .. `TAIL_MAX_SPLITS`) that fill it that far, else the fullest (`_tail_splits`).
    Measured (bench/decode_coresident.py --tail): B = 34, Hkv = 32, L = 32k runs 1,088 programs, 32 SMs busy
    in the last wave, at 0.953 x CUDNN; 3 splits fill it and reach 1.004 x. (Plans for Nq > 1, whose 128-row
    chunk tiles were not measured this way, keep 1 split there.)

    Parameters
    ----------
    batch, kv_heads : int
        B and Hkv; ``batch * kv_heads`` programs per split.
    seqlen : int
        The longest sequence (max of ``cache_seqlens``, or L_max when the lengths are not read).
    sms : int
        Streaming multiprocessors (132 on an H100/H200).

    Examples
    --------
    >>> default_num_splits(1, 8, 4096)     # 8 programs: 16 splits fill 128 SMs, 256 keys each
    16
    >>> default_num_splits(64, 8, 131072)  # 512 programs already fill 132 SMs; the 4th wave 116 of them
    1
    >>> default_num_splits(34, 32, 32768)  # 1,088 programs: 32 SMs busy in the 9th wave; 3 splits: 96
    3
    """
    for name, value in (("batch", batch), ("kv_heads", kv_heads), ("sms", sms), ("waves", waves),
                        ("min_keys", min_keys), ("cap", cap)):
        expect(_is_int(value) and value > 0, name, "a positive integer", value)
    expect(_is_int(seqlen) and seqlen >= 0, "seqlen", "a non-negative integer", seqlen)
    return _splits(batch, kv_heads, seqlen, sms, waves, min_keys, cap)


def _splits(batch, kv_heads, seqlen, sms, waves=WAVES, min_keys=MIN_KEYS_PER_SPLIT, cap=SPLIT_CAP,
            tail=True) -> int:
    """`default_num_splits`'s formula on checked values (the plan's call path; ``tail=False``: without the
    tail rule, for chunk tiles, where it was not measured)."""
    items = batch * kv_heads
    if items >= waves * sms:
        return _tail_splits(items, seqlen, sms) if tail else 1
    return max(1, min((waves * sms) // items, seqlen // min_keys, cap))


def _tail_splits(items: int, seqlen: int, sms: int) -> int:
    """Splits of a layout with a wave or more of items: 1, unless the keys are long and the last wave of
    ``items * s`` programs (one per SM) would keep fewer than `TAIL_FILL` of the SMs busy."""
    def fill(s):  # share of the SMs busy in the last wave of items * s programs
        rest = items * s % sms
        return 1.0 if rest == 0 else rest / sms
    if seqlen < TAIL_MIN_KEYS or fill(1) >= TAIL_FILL:
        return 1
    fits = [s for s in range(2, TAIL_MAX_SPLITS + 1) if fill(s) >= TAIL_FILL]
    return fits[0] if fits else max(range(1, TAIL_MAX_SPLITS + 1), key=fill)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def logical_bytes(batch: int, q_heads: int, kv_heads: int, total_keys: int, head_dim: int, elt: int,
                  num_splits: int, return_lse: bool = False) -> dict[str, int]:
    """Logical HBM bytes of one Nq = 1 `flash_decode` call on a dense cache, itemised.

    ``total_keys`` is ``sum_b cache_seqlens[b]``; ``elt`` the element size of q/K/V (2 for fp16/bf16).
    Partials exist only when ``num_splits > 1``. (A paged cache adds 4 bytes per page used.)
    """
    kv = 2 * kv_heads * total_keys * head_dim * elt  # K and V, each byte once per step (GQA shared)
    q = batch * q_heads * head_dim * elt  # the one query row per head
    partial = batch * q_heads * num_splits * (head_dim + 1) * 4 if num_splits > 1 else 0  # O_s, lse_s fp32
    out = batch * q_heads * head_dim * elt + (batch * q_heads * 4 if return_lse else 0)
    return {"kv_read": kv, "q_read": q, "partial_write": partial, "partial_read": partial, "out_write": out,
            "total": kv + q + 2 * partial + out}


def _block_config(block_m: int = 16, page_size: int = 0) -> dict:
    """The phase-1 block config (BLOCK_N, STAGES, warps) for a row tile of ``block_m`` rows and pages of
    ``page_size`` keys (0: dense): one measured config per tile kind (bench/decode_configs.py), no
    autotuner. Interpreter: small blocks, still multi-block splits and (pages of 16) pages per block.
    """
    if interpreting():
        return {"BLOCK_N": 32 if page_size == 16 else 16, "STAGES": 1, "num_warps": 4, "num_stages": 1}
    cfg = {"BLOCK_N": 64, "num_warps": 8} if block_m > 32 else {"BLOCK_N": 128, "num_warps": 4}
    # Triton's pipeliner gives K/V loads addressed through a (block) table only part of the stages:
    # 3 would buffer one K and one V tile, 5 the dense kernel's two of each
    stages = 5 if page_size else 3
    return {**cfg, "STAGES": stages, "num_stages": stages}


#: The fused merge (see `_fuse_by_default`) holds at most this many bytes of partials per last program.
FUSE_MAX_BYTES = 64 * 1024
#: Elements of one merge chunk [MERGE_M, MERGE_S, d] (fp32; 32 registers per thread at 4 warps).
MERGE_ELEMS = 4096
#: Row-tile cap (heads x queries per program); 16 under the interpreter, so CPU tests run several tiles.
BLOCK_M_MAX = 128
PAGE_SIZES = (16, 32, 64, 128, 256)


# sizes that vary per call are not value-specialised: one binary per layout
@triton.jit(do_not_specialize=["n_kv_heads", "l_max", "num_splits", "n_q", "n_m_tiles"])
def _attnscope_decode_split_kernel(
    Q, K, V, SEQLENS, BT, O_PART, LSE_PART, O, LSE, SEM,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,  # dense: batch, head, position; paged: page, head, slot
    stride_vb, stride_vh, stride_vn,
    stride_sb, stride_tb,
    n_kv_heads, l_max, num_splits, n_q, n_m_tiles, qk_scale,
    GROUP: tl.constexpr,  # G = Hq / Hkv query heads per kv head
    BLOCK_M: tl.constexpr,  # rows per program (G x Nq packed), a power of two, >= 16 for tl.dot
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,  # software-pipeline depth of the KV loop (cp.async multi-buffering)
    USE_DOT: tl.constexpr,  # tl.dot on the padded rows, else elementwise multiply + tl.sum
    EMULATE_BF16: tl.constexpr,  # interpreter + bf16 only: see _emulate_bf16
    SPLIT: tl.constexpr,  # True: write fp32 partials (O_s, base-2 lse_s); False: the final O and LSE
    FUSE: tl.constexpr,  # SPLIT only: the last program of each row tile merges the partials
    MERGE_M: tl.constexpr,  # FUSE: rows merged (the tile's rows, padded to a power of two)
    MERGE_S: tl.constexpr,  # FUSE: splits merged per chunk
    WRITE_LSE: tl.constexpr,  # the caller asked for the LSE (else LSE is not written)
    HAS_SEQLENS: tl.constexpr,
    PAGED: tl.constexpr,  # K/V are [num_pages, PAGE_SIZE, Hkv, d] addressed through BT [B, max_pages]
    PAGE_SIZE: tl.constexpr,
    CHUNK: tl.constexpr,  # Nq > 1: causal (bottom-right) among the new queries
    OFF32: tl.constexpr,  # K/V element offsets from the loop's base pointers fit in int32 (plan-checked)
    MAX_UNSCALED: tl.constexpr = False,  # qk_scale > RAW_SCORES_ABOVE: running max of raw scores, 1 split
):
    # attnscope's own buffers are contiguous, so their offsets are computed: O_PART [R, S, d] and
    # LSE_PART [R, S] fp32, O [R, d], LSE [R] with R = B * Hq * Nq rows in (b, head, query) order.
    pid = tl.program_id(0)  # (b * Hkv + kv head) * M_tiles + row tile
    split = tl.program_id(1)
    m_tile = pid % n_m_tiles
    pid_bh = pid // n_m_tiles
    b = (pid_bh // n_kv_heads).to(tl.int64)
    h_kv = (pid_bh % n_kv_heads).to(tl.int64)
    seqlen = tl.load(SEQLENS + b * stride_sb) if HAS_SEQLENS else l_max  # keys of sequence b

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # packed rows r = i * G + g
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    qi = offs_m // GROUP  # query index in 0 .. Nq - 1
    q_heads = h_kv * GROUP + offs_m % GROUP  # query head
    m_mask = offs_m < GROUP * n_q
    if CHUNK:
        # keys this tile can see: up to its last query's position; split that range, not seqlen
        last_q = tl.minimum(n_q - 1, (m_tile * BLOCK_M + BLOCK_M - 1) // GROUP)
        kv_len = tl.maximum(tl.minimum(seqlen, seqlen - n_q + last_q + 1), 0)
        lim = seqlen - n_q + qi + 1  # [BLOCK_M] exclusive key limit of each row
    else:
        kv_len = seqlen
    # this split's keys [lo, hi): whole BLOCK_N blocks, the row tile's key range split evenly
    blocks_per_split = tl.cdiv(tl.cdiv(kv_len, BLOCK_N), num_splits)
    lo = split * blocks_per_split * BLOCK_N
    hi = tl.minimum(lo + blocks_per_split * BLOCK_N, kv_len)

    q = tl.load(Q + b * stride_qb + q_heads[:, None] * stride_qh + qi[:, None] * stride_qn
                + offs_d[None, :], mask=m_mask[:, None], other=0.0)  # [BLOCK_M, d]; pad rows 0
    if not USE_DOT:
        q = q.to(tl.float32)
        if not MAX_UNSCALED:
            q = q * qk_scale  # exact enough: one fp32 rounding per element
    if PAGED:
        k_base = K + h_kv * stride_kh
        v_base = V + h_kv * stride_vh
        bt_base = BT + b * stride_tb
    else:
        k_base = K + b * stride_kb + h_kv * stride_kh
        v_base = V + b * stride_vb + h_kv * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of base-2 (MAX_UNSCALED: raw) scores
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running unnormalised sum of p @ V
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):  # STAGES: K/V tiles in flight
        rows = start_n + offs_n  # [BLOCK_N] key positions
        n_mask = rows < hi
        if PAGED:
            if BLOCK_N <= PAGE_SIZE:
                # inside one page (BLOCK_N divides PAGE_SIZE): one index, then contiguous rows
                page = tl.load(bt_base + start_n // PAGE_SIZE)  # scalar
                slot = start_n % PAGE_SIZE + offs_n  # [BLOCK_N] rows of the page
            else:
                # BLOCK_N // PAGE_SIZE whole pages, one index each (past the length: page 0, masked),
                # spread over the rows by a select-and-sum (a reshape would lose the alignment facts
                # that the 16-byte cp.async copies need)
                pidx = start_n // PAGE_SIZE + tl.arange(0, BLOCK_N // PAGE_SIZE)  # block-table entries
                pages = tl.load(bt_base + pidx, mask=pidx * PAGE_SIZE < hi, other=0)
                pick = (offs_n // PAGE_SIZE)[:, None] == tl.arange(0, BLOCK_N // PAGE_SIZE)[None, :]
                page = tl.sum(tl.where(pick, pages[None, :], 0), 1)  # [BLOCK_N]
                slot = offs_n % PAGE_SIZE  # [BLOCK_N]
            if not OFF32:
                page, slot = page.to(tl.int64), slot.to(tl.int64)
            k_off = page * stride_kb + slot * stride_kn
            v_off = page * stride_vb + slot * stride_vn
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        else:
            # Dense: rows past the range load the last key in it instead of a masked load. Every load is
            # a real key (finite V, so P = 0 there adds exactly 0) and the copies need no per-row
            # predicate: +0.2-0.6 % in graph replay (BENCHMARKS.md). Paged blocks keep masked loads:
            # clamped rows cost them 1-2 % (their page and slot arithmetic loses its constant pattern).
            rows_c = tl.minimum(rows, hi - 1)
            key = rows_c if OFF32 else rows_c.to(tl.int64)
            k_off = key * stride_kn
            v_off = key * stride_vn
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :])
        if USE_DOT:
            kt = tl.trans(k)  # [d, BLOCK_N]
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32)) if EMULATE_BF16 else tl.dot(q, kt)
            if not MAX_UNSCALED:
                s = s * qk_scale  # [BLOCK_M, BLOCK_N], base-2 scaled scores, fp32
        else:
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [BLOCK_M, BLOCK_N]
        visible = n_mask[None, :] & (rows[None, :] < lim[:, None]) if CHUNK else n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M]
        # a row with no visible key yet (causal) keeps m = -inf: shift by 0 there, so no NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        if MAX_UNSCALED:  # the scale multiplies differences <= 0: exp2(-inf) = 0, never inf - inf
            alpha = tl.exp2((m_i - m_safe) * qk_scale)
            p = tl.exp2((s - m_safe[:, None]) * qk_scale)
        else:
            alpha = tl.exp2(m_i - m_safe)  # rescale of the old state
            p = tl.exp2(s - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        if PAGED:
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        else:
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :])
        if USE_DOT:
            if EMULATE_BF16:  # P rounded to nearest even (the interpreter's cast truncates), fp32 products
                p, v = round_bf16(p), v.to(tl.float32)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # P in the input dtype, as FlashAttention
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m_i = m_new

    if MAX_UNSCALED:
        m_i = m_i * qk_scale  # base 2 for the LSE: +inf past fp32, where the true LSE is too
    o, lse2 = lse_merge_finish(m_i, l_i, acc)  # [BLOCK_M, d], [BLOCK_M] base 2; 0, -inf: no key
    n_q_heads = n_kv_heads * GROUP
    out_rows = (b * n_q_heads + q_heads) * n_q + qi  # [BLOCK_M] rows of O / LSE
    if SPLIT:
        part = out_rows * num_splits + split  # [BLOCK_M] row of O_PART / LSE_PART
        tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=m_mask[:, None])
        tl.store(LSE_PART + part, lse2, mask=m_mask)  # partial lse_s, base 2
        if FUSE:
            # Phase 2 in the same launch (CUTLASS's semaphore pattern): a ticket after the partials are
            # out (barrier, then a gpu-scope acq_rel atomic); the last ticket of a tile has seen every
            # other program's partials through the acquire, merges them and resets the counter.
            tl.debug_barrier()
            ticket = tl.atomic_add(SEM + pid, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:
                offs_mm = m_tile * BLOCK_M + tl.arange(0, MERGE_M)
                offs_ms = tl.arange(0, MERGE_S)
                mm_mask = (offs_mm < GROUP * n_q) & (offs_mm < m_tile * BLOCK_M + BLOCK_M)
                rows_m = (b * n_q_heads + h_kv * GROUP + offs_mm % GROUP) * n_q + offs_mm // GROUP
                # the online softmax again, over splits: lse_s plays the score, O_s the value row
                mm = tl.full([MERGE_M], float("-inf"), tl.float32)  # running max of lse_s
                ll = tl.zeros([MERGE_M], tl.float32)  # sum_s exp2(lse_s - mm)
                aa = tl.zeros([MERGE_M, HEAD_DIM], tl.float32)  # sum_s exp2(lse_s - mm) * O_s
                for s0 in range(0, num_splits, MERGE_S):
                    sp = s0 + offs_ms  # [MERGE_S]
                    ok = mm_mask[:, None] & (sp < num_splits)[None, :]  # [MERGE_M, MERGE_S]
                    idx = rows_m[:, None] * num_splits + sp[None, :]  # [MERGE_M, MERGE_S]
                    # .cg: read at L2, never from this SM's L1 (other SMs wrote these lines)
                    lse_s = tl.load(LSE_PART + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
                    o_s = tl.load(O_PART + idx[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                                  mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
                    mm, ll, aa = lse_merge_step(mm, ll, aa, lse_s, o_s, 1)  # empty splits weigh 0
                o_f, lse_f = lse_merge_finish(mm, ll, aa)  # [MERGE_M, d], [MERGE_M] base 2
                if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
                    o_f = round_bf16(o_f)
                tl.store(O + rows_m[:, None] * HEAD_DIM + offs_d[None, :], o_f.to(O.dtype.element_ty),
                         mask=mm_mask[:, None])
                if WRITE_LSE:
                    tl.store(LSE + rows_m, lse_f * 0.6931471805599453, mask=mm_mask)  # natural log
                tl.atomic_xchg(SEM + pid, 0)  # ready for the next launch
    else:
        if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
            o = round_bf16(o)
        tl.store(O + out_rows[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=m_mask[:, None])
        if WRITE_LSE:
            tl.store(LSE + out_rows, lse2 * 0.6931471805599453, mask=m_mask)  # ln(2): natural log


@triton.jit
def _attnscope_decode_combine_kernel(
    O_PART, LSE_PART, O, LSE,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,  # splits merged per iteration
    EMULATE_BF16: tl.constexpr,
):
    # O_PART [R, S, d], LSE_PART [R, S] (base 2), O [R, d], LSE [R] (natural log), all contiguous
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)

    # The online softmax again, over splits: lse_s plays the score, O_s the value row.
    m_i = tl.full([], float("-inf"), tl.float32)  # running max of lse_s (base 2)
    l_i = tl.zeros([], tl.float32)  # sum_s exp2(lse_s - m_i)
    acc = tl.zeros([HEAD_DIM], tl.float32)  # sum_s exp2(lse_s - m_i) * O_s
    for s0 in range(0, num_splits, BLOCK_S):
        s_mask = s0 + offs_s < num_splits
        lse_s = tl.load(LSE_PART + row * num_splits + s0 + offs_s, mask=s_mask,
                        other=float("-inf"))  # [BLOCK_S]
        o_s = tl.load(O_PART + (row * num_splits + s0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                      mask=s_mask[:, None], other=0.0)  # [BLOCK_S, d]
        m_i, l_i, acc = lse_merge_step(m_i, l_i, acc, lse_s, o_s, 0)  # empty splits weigh 0

    o, lse2 = lse_merge_finish(m_i, l_i, acc)  # [d], base-2 scalar; 0, -inf when every split is empty
    lse = lse2 * 0.6931471805599453  # ln(2): natural log
    if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
        o = round_bf16(o)
    tl.store(O + row * HEAD_DIM + offs_d, o.to(O.dtype.element_ty))
    tl.store(LSE + row, lse)


def _fuse_by_default(rows: int, num_splits: int, head_dim: int) -> bool:
    """Merge in the last program (one launch) while its ``rows x S x d`` fp32 partials stay within
    `FUSE_MAX_BYTES` (beyond, the separate kernel's B x Hq x Nq programs win; bench/decode_variants.py)."""
    return triton.next_power_of_2(rows) * num_splits * head_dim * 4 <= FUSE_MAX_BYTES


def _check_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, use_dot, fuse_combine):
    """Validate everything that needs no device read; return (B, Hq, Nq, d, Hkv, L_max, page_size)."""
    paged = block_table is not None
    layout = "[num_pages, page_size, Hkv, d]" if paged else "[B, Hkv, L_max, d]"
    check_tensor(torch, "q", q, 4, "[B, Hq, Nq, d]")
    check_tensor(torch, "k_cache", k_cache, 4, layout)
    check_tensor(torch, "v_cache", v_cache, 4, layout)
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    for name, t, shape in (("cache_seqlens", cache_seqlens, "[B]"),
                           ("block_table", block_table, "[B, max_pages]")):
        if t is not None:
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{name}: expected a torch.Tensor of int32 {shape} or None, "
                                 f"got {type(t).__name__}")
            expect(t.dtype == torch.int32, name, "dtype torch.int32", t.dtype)
            tensors[name] = t
    check_device(torch, tensors)
    B, Hq, Nq, d = q.shape
    if B == 0 or Hq == 0 or Nq == 0:
        raise InputError(f"q: expected B >= 1, Hq >= 1 and Nq >= 1, got shape {tuple(q.shape)}")
    check_same("k_cache", "head_dim (as q)", d, k_cache.shape[3])
    check_same("k_cache", "dtype (as q)", q.dtype, k_cache.dtype)
    check_same("v_cache", "dtype (as q)", q.dtype, v_cache.dtype)
    check_same("v_cache", "shape (as k_cache)", tuple(k_cache.shape), tuple(v_cache.shape))
    if paged:
        num_pages, page_size, Hkv = k_cache.shape[:3]
        if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] == 0:
            raise InputError(f"block_table: expected shape ({B}, max_pages >= 1), "
                             f"got {tuple(block_table.shape)}")
        if block_table.stride(1) != 1:
            raise InputError(f"block_table: expected unit stride in the last dimension, got strides "
                             f"{tuple(block_table.stride())}")
        if num_pages == 0:
            raise InputError(f"k_cache: expected num_pages >= 1, got shape {tuple(k_cache.shape)}")
        if page_size not in PAGE_SIZES:
            raise NotImplementedError(f"k_cache: page_size {page_size} is not supported; supported: "
                                      f"{', '.join(map(str, PAGE_SIZES))}")
        L_max = block_table.shape[1] * page_size
    else:
        check_same("k_cache", "batch (as q)", B, k_cache.shape[0])
        Hkv, L_max, page_size = k_cache.shape[1], k_cache.shape[2], 0
        if L_max == 0:
            raise InputError(f"k_cache: expected L_max >= 1, got shape {tuple(k_cache.shape)}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"q: expected the number of query heads to be a multiple of the kv heads "
                         f"({Hkv}), got Hq = {Hq}")
    check_head_dim(d)
    if cache_seqlens is not None and tuple(cache_seqlens.shape) != (B,):
        raise InputError(f"cache_seqlens: expected shape ({B},) (one length per sequence), "
                         f"got {tuple(cache_seqlens.shape)}")
    if num_splits is not None:
        expect(_is_int(num_splits) and num_splits > 0, "num_splits", "a positive integer or None", num_splits)
        if num_splits > MAX_NUM_SPLITS:
            raise NotImplementedError(f"num_splits: at most {MAX_NUM_SPLITS} supported, got {num_splits}")
    check_scale(scale)
    if num_splits not in (None, 1) and _raw_scores(scale, d):
        raise InputError(f"num_splits: expected 1 or None with scale above {RAW_SCORES_ABOVE / LOG2E:.4g} "
                         f"(raw-score softmax, one split), got {num_splits}")
    for name, value in (("use_dot", use_dot), ("fuse_combine", fuse_combine)):
        expect(value is None or isinstance(value, bool), name, "True, False or None", value)
    return B, Hq, Nq, d, Hkv, L_max, page_size


def _check_seqlen_values(cache_seqlens, L_max: int, block_table, page_size: int, num_pages: int) -> int:
    """Read the lengths (and the used block-table entries) back to the host and check them: a device
    sync. Returns the longest length."""
    lo, hi = (int(x) for x in cache_seqlens.aminmax())
    if lo < 0 or hi > L_max:
        bad = lo if lo < 0 else hi
        raise InputError(f"cache_seqlens: expected values in [0, L_max = {L_max}], got {bad}")
    if block_table is not None:
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] \
            < ((cache_seqlens.long() + page_size - 1) // page_size)[:, None]  # pages holding keys
        bad = used & ((block_table < 0) | (block_table >= num_pages))
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise InputError(f"block_table: expected page indices in [0, num_pages = {num_pages}) for the "
                             f"pages cache_seqlens uses, got {int(block_table[b, j])} at [{b}, {j}]")
    return hi


def _check_block_table_values(block_table, page_size, num_pages, L_max):
    """Without lengths every entry is used: check them all (a device sync)."""
    full = torch.full((block_table.shape[0],), L_max, dtype=torch.int32, device=block_table.device)
    _check_seqlen_values(full, L_max, block_table, page_size, num_pages)


@functools.lru_cache(maxsize=16)
def _sms(device) -> int:
    return num_sms(torch, device)


def _layout(t):
    """What a plan fixes about a tensor: shape, strides, dtype, device (None for no tensor)."""
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device)


def _raw_scores(scale, d) -> bool:
    """Whether a plan with this ``scale`` (None: 1/sqrt(d)) keeps raw scores (`RAW_SCORES_ABOVE`)."""
    return (float(scale) if scale is not None else 1.0 / math.sqrt(d)) * LOG2E > RAW_SCORES_ABOVE


def _tiling(device, B, Hq, Nq, Hkv, L_max, max_seqlen, num_splits, use_dot, raw=False):
    """(rows per tile BLOCK_M, row tiles, split count) of a layout: the plan's only choices that
    depend on sizes (``max_seqlen``: the longest length, for the split heuristic; None: L_max); ``raw``
    (`_raw_scores`): one split."""
    rows = (Hq // Hkv) * Nq
    cap = 16 if interpreting() else BLOCK_M_MAX
    block_m = min(triton.next_power_of_2(rows), cap)
    if use_dot is None or use_dot:
        block_m = max(16, block_m)  # tl.dot needs M >= 16
    m_tiles = -(-rows // block_m)
    if num_splits is None and raw:
        num_splits = 1
    if num_splits is None:
        longest = L_max if max_seqlen is None else max_seqlen
        num_splits = _splits(B * m_tiles, Hkv, longest, _sms(device), tail=Nq == 1)
    return block_m, m_tiles, num_splits


class DecodePlan:
    """A checked decode layout with its split count, block sizes, merge and scratch: plan once, run often.

    Built from example tensors (FlashInfer's plan/run split): every input check, the split choice and
    the allocation of the fp32 partials and merge counters happen here, once. `run` then only compares
    each tensor's layout (shape, strides, dtype, device) with the plan's, raising `InputError` if one
    changed, and launches: no host sync unless ``check_seqlens``, no allocation but the output, so a run
    can be captured in a CUDA graph. The partials belong to the plan: runs of one plan must be ordered
    (one stream, or synchronised), as with FlashInfer's workspace.

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, Nq, d]
        fp16 or bf16; Nq >= 1 new queries per sequence (the last Nq positions, causal among themselves).
    k_cache, v_cache : torch.Tensor
        Dense ``[B, Hkv, L_max, d]`` (any strides, unit last), or with ``block_table`` paged
        ``[num_pages, page_size, Hkv, d]``, page_size a power of two in 16..256.
    cache_seqlens : torch.Tensor, int32 [B], optional
        Keys of each sequence, the Nq new ones included; default L_max for all.
    block_table : torch.Tensor, int32 [B, max_pages], optional
        Page of each block of ``page_size`` keys; pages may be in any order and shared. L_max is
        ``max_pages * page_size``.
    num_splits : int, optional
        KV splits; default `default_num_splits` of (B x row tiles, Hkv, ``max_seqlen``, SMs).
    scale : float, optional
        Softmax scale, default ``1/sqrt(d)``; positive, at most ``_common.MAX_SCALE``. Past
        ``RAW_SCORES_ABOVE / log2(e)`` (about 7e3) the kernel keeps its running max in raw scores and the
        plan runs one split (``num_splits`` must then be 1 or None): a huge scale gives the row arg-max, with
        an LSE of +inf where the true one passes fp32, never NaN.
    return_lse : bool
        `run` also returns the natural-log LSE [B, Hq, Nq] (fp32).
    max_seqlen : int, optional
        Longest length expected, for the split heuristic only (default L_max); results never depend
        on it.
    check_seqlens : bool
        `run` reads cache_seqlens (and the used block-table entries) back to check them: a host sync that
        breaks CUDA-graph capture. False skips it (out-of-range values give undefined results).
    use_dot, fuse_combine : bool, optional
        Benchmark knobs: tl.dot (default) or elementwise products; fused (default when small, see
        `_fuse_by_default`) or separate merge.
    """

    def __init__(self, q, k_cache, v_cache, cache_seqlens=None, block_table=None, *, num_splits=None,
                 scale=None, return_lse=False, max_seqlen=None, check_seqlens=True, use_dot=None,
                 fuse_combine=None, _config=None):
        check_flags(return_lse=return_lse, check_seqlens=check_seqlens)
        B, Hq, Nq, d, Hkv, L_max, page_size = _check_inputs(
            q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, use_dot, fuse_combine)
        expect(max_seqlen is None or _is_int(max_seqlen) and 0 <= max_seqlen <= L_max, "max_seqlen",
               f"an integer in [0, L_max = {L_max}] or None", max_seqlen)
        self.layout = tuple(_layout(t) for t in (q, k_cache, v_cache, cache_seqlens, block_table))
        self.check_seqlens, self.return_lse = check_seqlens, return_lse
        self.L_max, self.page_size = L_max, page_size
        self.num_pages = k_cache.shape[0] if block_table is not None else 0
        group = Hq // Hkv
        rows = group * Nq
        use_dot = True if use_dot is None else use_dot  # pipelined MMA, low register use, every G
        raw = _raw_scores(scale, d)
        block_m, m_tiles, num_splits = _tiling(q.device, B, Hq, Nq, Hkv, L_max, max_seqlen, num_splits,
                                               use_dot, raw)
        paged = block_table is not None
        # Chunk tiles (Nq > 1) on a dense cache run the paged loop over a plan-owned table of "pages"
        # of BLOCK_N consecutive keys: Triton 3.6 pipelines that loop (K/V addresses from a table load)
        # 1.3 x better at the same tile (bench/decode_configs.py --layouts, BENCHMARKS.md)
        page, self.table = page_size, None
        if Nq > 1 and not paged and _config is None:
            page = _block_config(block_m)["BLOCK_N"]
            self.table = _dense_pages(k_cache, v_cache, L_max, page)
            page = page if self.table is not None else page_size
        cfg = dict(_config or _block_config(block_m, page))  # overrides: bench/decode_configs.py
        self.num_splits = num_splits
        split = num_splits > 1
        merge_m = min(block_m, triton.next_power_of_2(rows))
        if fuse_combine is None:
            fuse_combine = _fuse_by_default(merge_m, num_splits, d)
        fuse = split and fuse_combine
        merge_s = max(1, min(triton.next_power_of_2(num_splits), MERGE_ELEMS // (merge_m * d)))
        n_rows = B * Hq * Nq
        device = q.device
        self.o_shape, self.lse_shape, self.dtype, self.device = (B, Hq, Nq, d), (B, Hq, Nq), q.dtype, device
        self.split, self.fuse = split, fuse
        self.need_lse = return_lse or (split and not fuse)  # the separate merge always writes the LSE
        # scratch, owned by the plan: fp32 partials and the fused merge's counters (left at 0 by the kernel)
        f32 = torch.float32
        self.o_part = torch.empty((n_rows, num_splits, d), dtype=f32, device=device) if split else None
        self.lse_part = torch.empty((n_rows, num_splits), dtype=f32, device=device) if split else None
        self.sem = torch.zeros(B * Hkv * m_tiles, dtype=torch.int32, device=device) if fuse else None
        sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
        self._grid = (B * Hkv * m_tiles, num_splits)
        if self.table is not None:  # page stride = page x key stride; heads and keys as in the dense cache
            kst = (page * k_cache.stride(2), k_cache.stride(1), k_cache.stride(2))
            vst = (page * v_cache.stride(2), v_cache.stride(1), v_cache.stride(2))
        else:
            kst = (k_cache.stride(0), k_cache.stride(2 if paged else 1), k_cache.stride(1 if paged else 2))
            vst = (v_cache.stride(0), v_cache.stride(2 if paged else 1), v_cache.stride(1 if paged else 2))
        self._scalars = (
            q.stride(0), q.stride(1), q.stride(2), *kst, *vst,
            cache_seqlens.stride(0) if cache_seqlens is not None else 0,
            block_table.stride(0) if paged else (self.table.stride(0) if self.table is not None else 0),
            Hkv, L_max, num_splits, Nq, m_tiles, sm_scale * LOG2E,
        )
        self._consts = {
            "GROUP": group, "BLOCK_M": block_m, "HEAD_DIM": d, "BLOCK_N": cfg["BLOCK_N"],
            "STAGES": cfg["STAGES"], "USE_DOT": use_dot, "EMULATE_BF16": _emulate_bf16(q.dtype),
            "SPLIT": split, "FUSE": fuse, "MERGE_M": merge_m, "MERGE_S": merge_s,
            "WRITE_LSE": self.return_lse, "HAS_SEQLENS": cache_seqlens is not None,
            "PAGED": paged or self.table is not None, "PAGE_SIZE": max(page, 1), "CHUNK": Nq > 1,
            "OFF32": cfg.get("OFF32", _offsets_fit_int32(
                k_cache, v_cache, (0, 1) if paged else (0, 2) if self.table is not None else (2,))),
            "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
        }
        if raw:  # only then: the default launch passes what it always did
            self._consts["MAX_UNSCALED"] = True
        self._combine_grid = (n_rows,)
        self._combine_consts = {"HEAD_DIM": d, "BLOCK_S": min(16, triton.next_power_of_2(num_splits)),
                                "EMULATE_BF16": _emulate_bf16(q.dtype)}

    def _mismatch(self, tensors):
        names = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table")
        for name, want, t in zip(names, self.layout, tensors, strict=True):
            if t is not None and not isinstance(t, torch.Tensor):
                return InputError(f"{name}: expected a torch.Tensor as planned, got {type(t).__name__}")
            got = _layout(t)
            if got != want:
                what = "None" if want is None else f"shape {want[0]}, strides {want[1]}, {want[2]}, {want[3]}"
                seen = "None" if got is None else f"shape {got[0]}, strides {got[1]}, {got[2]}, {got[3]}"
                return InputError(f"{name}: expected the planned layout ({what}), got {seen}; "
                                  f"make a new plan")
        return None

    def run(self, q, k_cache, v_cache, cache_seqlens=None, block_table=None, *, out=None, lse_out=None):
        """Launch on tensors with the planned layouts (values may change freely).

        Returns ``o`` [B, Hq, Nq, d] in q's dtype, and ``lse`` [B, Hq, Nq] fp32 (natural log) when the
        plan was made with ``return_lse``. ``out`` / ``lse_out``: contiguous tensors of those shapes and
        dtypes to write into instead of allocating (``lse_out`` only with ``return_lse``), sharing no
        memory with the inputs or each other. Raises
        `InputError` if a tensor's shape, strides, dtype or device differ from the plan's, or
        (``check_seqlens``) a length or used page index is out of range.
        """
        layout = self.layout
        if (not all(isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache))
                or (q.shape, q.stride(), q.dtype, q.device) != layout[0]
                or (k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device) != layout[1]
                or (v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device) != layout[2]
                or (cache_seqlens is None) != (layout[3] is None)
                or (block_table is None) != (layout[4] is None)
                or (cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor))
                or (block_table is not None and not isinstance(block_table, torch.Tensor))
                or (cache_seqlens is not None and _layout(cache_seqlens) != layout[3])
                or (block_table is not None and _layout(block_table) != layout[4])):
            raise self._mismatch((q, k_cache, v_cache, cache_seqlens, block_table)) or \
                InputError("q: expected the planned layout")  # pragma: no cover - _mismatch names it
        if self.check_seqlens:
            if cache_seqlens is not None:
                _check_seqlen_values(cache_seqlens, self.L_max, block_table, self.page_size, self.num_pages)
            elif block_table is not None:
                _check_block_table_values(block_table, self.page_size, self.num_pages, self.L_max)
        if isinstance(out, torch.Tensor) or isinstance(lse_out, torch.Tensor):  # not on the common path
            inputs = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": cache_seqlens,
                      "block_table": block_table}
            if isinstance(out, torch.Tensor):
                check_disjoint(torch, "out", out, inputs)
            if isinstance(lse_out, torch.Tensor):
                check_disjoint(torch, "lse_out", lse_out, {**inputs, "out": out})
        return self._launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse_out)

    def _launch(self, q, k_cache, v_cache, cache_seqlens, block_table, out=None, lse_out=None):
        """Allocate (or check) the outputs and launch; the layouts are already known to match."""
        if out is None:
            o = torch.empty(self.o_shape, dtype=self.dtype, device=self.device)
        else:
            _check_out("out", out, self.o_shape, self.dtype, self.device)
            o = out
        if lse_out is not None:
            if not self.return_lse:
                raise InputError("lse_out: expected None (the plan was made with return_lse=False), "
                                 "got a tensor")
            _check_out("lse_out", lse_out, self.lse_shape, torch.float32, self.device)
            lse = lse_out
        else:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device) if self.need_lse else o
        o_part = self.o_part if self.split else o  # placeholders are never touched
        lse_part = self.lse_part if self.split else o
        sem = self.sem if self.fuse else o
        table = block_table if block_table is not None else self.table
        _attnscope_decode_split_kernel[self._grid](
            q, k_cache, v_cache, cache_seqlens if cache_seqlens is not None else o,
            table if table is not None else o, o_part, lse_part, o, lse, sem,
            *self._scalars, **self._consts)
        if self.split and not self.fuse:
            _attnscope_decode_combine_kernel[self._combine_grid](o_part, lse_part, o, lse, self.num_splits,
                                                               **self._combine_consts)
        return (o, lse) if self.return_lse else o


def _dense_pages(k_cache, v_cache, L_max: int, page: int):
    """A dense cache as pages of ``page`` keys: int32 [B, ceil(L_max / page)] with entry ``b * R + j``,
    R = batch stride / (page x key stride), so page ``b * R + j`` at stride ``page x key stride`` is keys
    ``j * page ..`` of sequence b. None when the strides do not allow it (K and V must share R) or
    the page indices would not fit in int32."""
    B = k_cache.shape[0]
    spans = [(t.stride(0), page * t.stride(2)) for t in (k_cache, v_cache)]
    if any(span <= 0 or batch % span for batch, span in spans) or len({b // s for b, s in spans}) != 1:
        return None
    R, n = spans[0][0] // spans[0][1], -(-L_max // page)
    if B * R + n >= 2**31:
        return None
    j = torch.arange(n, dtype=torch.int32, device=k_cache.device)
    return torch.arange(B, dtype=torch.int32, device=k_cache.device)[:, None] * R + j[None, :]


def _offsets_fit_int32(k_cache, v_cache, dims) -> bool:
    """Whether every K/V element offset the split kernel adds to its base pointers fits in int32: the
    offsets walk the cache dims ``dims`` (dense: the keys, (2,), from a (batch, head) base; paged: pages
    and slots, (0, 1); a dense cache through `_dense_pages`: batch and keys, (0, 2), from a head's base)
    plus d. Dense rows never pass the last key (clamped); paged lanes past it are masked and never loaded,
    whatever their wrapped address."""
    def span(t):
        return sum((t.shape[i] - 1) * t.stride(i) for i in dims) + t.shape[3]
    return max(span(k_cache), span(v_cache)) < 2**31


def _check_out(name, t, shape, dtype, device):
    if not (isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == dtype
            and t.device == device and t.is_contiguous()):
        got = f"shape {tuple(t.shape)}, {t.dtype}, {t.device}, contiguous={t.is_contiguous()}" \
            if isinstance(t, torch.Tensor) else type(t).__name__
        raise InputError(f"{name}: expected a contiguous tensor of shape {shape}, {dtype} on {device}, "
                         f"got {got}")


def decode_plan(q, k_cache, v_cache, cache_seqlens=None, block_table=None, **options) -> DecodePlan:
    """`DecodePlan` (same arguments): ``plan = decode_plan(q, k, v, lens); o = plan.run(q, k, v, lens)``."""
    return DecodePlan(q, k_cache, v_cache, cache_seqlens, block_table, **options)


def flash_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits=None, scale=None, return_lse=False,
                 *, block_table=None, check_seqlens: bool = True, use_dot: bool | None = None,
                 fuse_combine: bool | None = None, _config: dict | None = None):
    """Decode (or chunked-prefill) attention of Nq new queries per sequence against a KV cache.

    The one-line convenience over `DecodePlan`, with a bounded plan cache: plans for the
    `PLAN_CACHE_LAYOUTS` most recent layouts (tensor shapes, strides, dtypes, devices, the options, the
    CUDA stream), per layout for the `PLAN_CACHE_SPLITS` most recent split counts (`plan_cache_info`,
    `clear_plan_cache`). A known layout skips the layout checks and the plan build; ``check_seqlens``
    runs on every call. Inside CUDA-graph capture it builds a private plan (the graph keeps its scratch).

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, Nq, d]
        The new queries, fp16 or bf16, CUDA (or CPU under ``TRITON_INTERPRET=1``). They are the last Nq
        positions of each sequence (``cache_seqlens`` counts them), causal among themselves
        (bottom-right); queries at a negative position (``cache_seqlens < Nq``) see no key.
    k_cache, v_cache : torch.Tensor
        Dense ``[B, Hkv, L_max, d]``: any strides with a unit last stride (e.g. a ``[B, L_max, Hkv, d]``
        buffer viewed as ``buf.transpose(1, 2)``). Paged (with ``block_table``): ``[num_pages,
        page_size, Hkv, d]``, page_size in {16, 32, 64, 128, 256}. Hq a multiple of Hkv (GQA / MQA: query
        head i reads kv head ``i // (Hq / Hkv)``).
    cache_seqlens : torch.Tensor, int32 [B], optional
        Valid keys per sequence (positions ``0 .. len - 1``); default L_max for all. A sequence of length
        0 gives output 0 and LSE = -inf.
    num_splits : int, optional
        KV splits per sequence; default `default_num_splits`. 1 runs phase 1 only.
    scale : float, optional
        Softmax scale; default ``1/sqrt(d)``; see `DecodePlan` for its range.
    return_lse : bool
        Also return the natural-log logsumexp of each query row.
    block_table : torch.Tensor, int32 [B, max_pages], optional, keyword-only
        The paged cache's page of each block of page_size keys; any order, pages may be shared.
    check_seqlens : bool, keyword-only
        Check ``0 <= cache_seqlens <= L_max`` and the used block-table entries (default; a host sync that
        breaks CUDA-graph capture, and the split heuristic then uses the longest length). False skips
        it: out-of-range values give undefined results.
    use_dot, fuse_combine : bool, optional, keyword-only
        Benchmark knobs, see `DecodePlan`.

    Returns
    -------
    o : torch.Tensor, [B, Hq, Nq, d], q's dtype
    lse : torch.Tensor, [B, Hq, Nq], float32, natural log — only when ``return_lse``.

    Supported: d in {64, 128}; fp16 and bf16; anything else raises NotImplementedError. Malformed input
    raises `InputError` (a ValueError) naming the argument.

    Example
    -------
    >>> q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    >>> k = v = torch.randn(4, 8, 32768, 128, device="cuda", dtype=torch.bfloat16)
    >>> lens = torch.tensor([32768, 100, 0, 5000], device="cuda", dtype=torch.int32)
    >>> o = attnscope.flash_decode(q, k, v, cache_seqlens=lens)
    """
    check_flags(return_lse=return_lse, check_seqlens=check_seqlens)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table)
    options = {"num_splits": num_splits, "scale": scale, "return_lse": return_lse, "use_dot": use_dot,
               "fuse_combine": fuse_combine, "_config": _config}
    key = None
    if all(isinstance(t, torch.Tensor) for t in tensors[:3]) and all(
            t is None or isinstance(t, torch.Tensor) for t in tensors[3:]):
        cuda = q.device.type == "cuda"
        if not (cuda and torch.cuda.is_current_stream_capturing()):  # capture: a private plan, no key
            # all a plan fixes but the split count; the stream, as a plan's partials serve one at a time
            key = (tuple(_layout(t) for t in tensors), tuple(options.values())[:-1],
                   tuple(sorted(_config.items())) if _config else None,
                   torch.cuda.current_stream(q.device).cuda_stream if cuda else None)
    # a layout seen before passed these checks with these options: its facts are kept with its plans
    facts = _PLAN_CACHE.facts(key) if key is not None else None
    if facts is None:
        facts = _check_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale,
                              use_dot, fuse_combine)
    B, Hq, Nq, _, Hkv, L_max, page_size = facts
    longest = None
    if check_seqlens:
        num_pages = k_cache.shape[0] if block_table is not None else 0
        if cache_seqlens is not None:
            longest = _check_seqlen_values(cache_seqlens, L_max, block_table, page_size, num_pages)
        elif block_table is not None:
            _check_block_table_values(block_table, page_size, num_pages, L_max)
    if key is None:
        plan = DecodePlan(*tensors, max_seqlen=longest, check_seqlens=False, **options)
    else:
        # the split count the heuristic picks for these lengths completes the key
        options["num_splits"] = _tiling(q.device, B, Hq, Nq, Hkv, L_max, longest, num_splits, use_dot,
                                        _raw_scores(scale, facts[3]))[2]
        plan = _PLAN_CACHE.plan(key, facts, options["num_splits"], lambda: DecodePlan(
            *tensors, max_seqlen=longest, check_seqlens=False, **options))
    return plan._launch(*tensors)


class _PlanCache:
    """`flash_decode`'s plans (thread-safe): an LRU of `layouts` layouts (key: shapes, strides, dtypes
    and devices of the tensors, the options, the stream), each with its checked facts and an LRU of
    plans for up to `per_layout` split counts."""

    def __init__(self, layouts: int, per_layout: int):
        self.layouts, self.per_layout = layouts, per_layout
        self._entries: collections.OrderedDict = collections.OrderedDict()  # key -> (facts, {splits: plan})
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def facts(self, key):
        with self._lock:
            return self._entries.get(key, (None,))[0]

    def plan(self, key, facts, splits, build):
        with self._lock:
            plans = self._entries.setdefault(key, (facts, collections.OrderedDict()))[1]
            self._entries.move_to_end(key)
            if len(self._entries) > self.layouts:
                self._entries.popitem(last=False)  # least recently used layout: its scratch is freed
            if splits in plans:
                self.hits += 1
                plans.move_to_end(splits)
            else:
                self.misses += 1
                plans[splits] = build()
                if len(plans) > self.per_layout:
                    plans.popitem(last=False)
            return plans[splits]

    def info(self):
        with self._lock:
            size = sum(len(plans) for _, plans in self._entries.values())
            return PlanCacheInfo(self.hits, self.misses, size, self.layouts * self.per_layout)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


#: `flash_decode` keeps plans for this many layouts (least recently used dropped first) and, per layout,
#: split counts. A plan holds its fp32 partials and merge counters, no user tensor.
PLAN_CACHE_LAYOUTS = 8
PLAN_CACHE_SPLITS = 4
_PLAN_CACHE = _PlanCache(PLAN_CACHE_LAYOUTS, PLAN_CACHE_SPLITS)

PlanCacheInfo = collections.namedtuple("PlanCacheInfo", "hits misses size maxsize")


def plan_cache_info() -> PlanCacheInfo:
    """`flash_decode`'s plan cache: calls served by a cached plan (hits), plans built (misses), plans
    held, and the most it holds (``PLAN_CACHE_LAYOUTS * PLAN_CACHE_SPLITS``), as functools' cache_info."""
    return _PLAN_CACHE.info()


def clear_plan_cache() -> None:
    """Drop every plan `flash_decode` cached (freeing their scratch) and reset the counters."""
    _PLAN_CACHE.clear()


def _emulate_bf16(dtype) -> bool:
    """bf16 under Triton 3.6's interpreter, whose bf16 ``tl.dot`` and casts are wrong: the kernels multiply
    in fp32 and round with `round_bf16` before each cast (see kernels/_tl.py); never on a GPU."""
    return interpreting() and dtype == torch.bfloat16
