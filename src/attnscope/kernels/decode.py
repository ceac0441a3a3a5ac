"""Split-KV decode attention (Flash-Decoding) in Triton.

Algorithm: Dao, Haziza, Massa, Sizov, *Flash-Decoding for long-context inference* (2023); spec §6 and
§6.1. With one query token per sequence, FlashAttention-2's query blocking collapses to T_r = 1 tile, so
a prefill kernel launches only B x H programs and most of the GPU idles. Flash-Decoding parallelises
the axis that is long, the KV sequence:

- **phase 1** (`_attnscope_decode_split_kernel`), grid ``(B * Hkv, num_splits)``: each program takes
  one (batch, kv head) and one contiguous chunk of that sequence's keys, and streams the chunk through
  the online softmax for *all* ``G = Hq / Hkv`` query heads that share the kv head (GQA), so every K/V
  byte leaves HBM once. It writes a normalised partial output ``O_s`` (fp32) and the partial
  logsumexp ``lse_s`` of its chunk.
- **phase 2**, the logsumexp merge ``lse = log sum_s exp(lse_s)``, ``O = sum_s exp(lse_s - lse) O_s``,
  run with the same running state (``m_i``, ``l_i``, ``acc``) as the online softmax, over splits instead
  of keys. Two ways, same arithmetic: **fused** into phase 1 (each program takes a ticket from a
  gpu-scope atomic counter after writing its partials; the one that draws the last ticket for its
  (batch, kv head) merges that group's partials and resets the counter), so a call is one launch; or a
  **separate kernel** (`_attnscope_decode_combine_kernel`, grid ``(B * Hq,)``). `_fuse_by_default`
  picks: fused for eager calls with small partials (one launch saves tens of microseconds of host time
  at small shapes), separate under CUDA-graph capture (launches cost nothing there, and a separate
  kernel spreads the merge over more programs) and when one program would merge a lot (MQA, many
  splits).
  `attnscope.reference.combine` is its float64 specification: a split that saw no keys has
  ``lse_s = -inf`` and weight 0; if every split is empty the output is 0 and LSE = -inf, never NaN.
  With ``num_splits == 1`` phase 2 is skipped: phase 1 writes the final output in q's dtype.

Units. Scores are kept in base 2: ``qk_scale = sm_scale * log2(e)`` is folded into the scale so the
kernel calls ``exp2``; the running max ``m_i`` and the partial ``lse_s`` written by phase 1 are base-2
(``lse2``). Only the public LSE is natural-log: ``lse = lse2 * ln(2)``.

Split geometry (per sequence). Sequence b has ``cache_seqlens[b]`` keys, ``n_blocks = ceil(len /
BLOCK_N)`` key blocks, and split s takes blocks ``[s * bps, (s + 1) * bps)`` with ``bps = ceil(n_blocks
/ num_splits)``; so every split of a sequence but the last has the same whole number of blocks, only
the last block of the last non-empty split is ragged, and a short sequence's trailing splits are empty.
Splitting each sequence by its own length (not by L_max) keeps a ragged batch balanced.

Performance notes (measured numbers: BENCHMARKS.md, `bench/decode.py`, `bench/decode_variants.py`)
-----------------------------------------------------------------------------------------------------
Decode attention does ~2 FLOPs per byte of KV, far below the H200's ~200 FLOP/byte ridge: it is purely
bandwidth-bound, so the floor is the bytes (`logical_bytes`) over the measured read ceiling:

    KV read      2 * Hkv * sum_b(len_b) * d * elt   (K and V, once each: the GQA group shares them)
    q read       B * Hq * d * elt
    partials     B * Hq * S * (d + 1) * 4   written by phase 1, read again by phase 2   (S > 1 only)
    output       B * Hq * d * elt  (+ B * Hq * 4 for the LSE)

e.g. B = 1, Hkv = 8, L = 4096, d = 128, bf16: KV = 16 MiB -> 3.5 us at 4.8 TB/s, comparable to two
kernel launches, so small shapes are latency-bound and the split count matters more than the loop;
B = 64, Hkv = 8, L = 128k: KV = 32 GiB -> ~7 ms, where only streaming efficiency matters.

What the kernel does for bandwidth: BLOCK_N of 64-256 keys per iteration, the KV loop software-pipelined
``STAGES`` deep (cp.async multi-buffering: STAGES - 1 K/V tiles in flight per program), 16-byte loads
along d (unit last stride; Triton specialises strides divisible by 16), int64 addressing (a 128k-token
cache is > 2^31 elements), and enough programs (`default_num_splits`) to keep every SM streaming.

Group products: ``tl.dot`` on the group padded to 16 rows (the MMA minimum M; the pad rows read q = 0
and are never stored). Padding wastes tensor-core work (15/16 of it for G = 1), but tensor cores are idle
in a bandwidth-bound kernel anyway, and this is the default for every G: the MMA keeps register use low
and needs no [G, BLOCK_N, d] fp32 temporaries. The alternative, an elementwise multiply + ``tl.sum``
(``use_dot=False``), is exact in fp32 but holds a [BLOCK_N, d] fp32 product per group row in registers.
Compiled ahead of time for sm_90 on a CPU-only machine (triton.compile, GPUTarget("cuda", 90, 32), then
ptxas -v), bf16, d = 128, BLOCK_N = 128, 3 stages: the dot path uses mma.sync m16n8k16 (wgmma needs M
>= 64, not worth padding to), ~136 KiB shared memory and 135 registers (G = 1, 4 warps) / 86 (G = 8, 8
warps), no spills; the elementwise path ~130 KiB and 254 registers for G = 1, and spills at G = 4 (255
registers). Both are cp.async-pipelined. So the elementwise path is a knob for the benchmark to try on
G = 1 (MHA), not a default. Not tried: TMA tensor descriptors for K/V, an unmasked main loop with a
masked tail (the kernel already streams at the measured read ceiling at large sizes).

Host side (eager calls): one launch (fused merge), the partials and counters in a per-stream cached
scratch buffer (`_scratch`), one config (no autotuner), and a plan per input layout (`_plan_key`,
`_launch`): a repeat call with a layout already checked skips the checks and launches the
compiled binary directly. 91.6 -> 54.3 us of host time per call on the H200 host (bench/host_overhead.py),
which is what lets an eager call at the smallest shapes keep up with SDPA's C++ dispatch.
"""

from __future__ import annotations

import functools
import math

from attnscope.errors import InputError
from attnscope.kernels._common import (
    LOG2E,
    check_device,
    check_head_dim,
    check_same,
    check_tensor,
    import_torch_triton,
    interpreting,
    num_sms,
)

# The kernels below resolve helpers as module globals (Triton's JIT reads globals, not closures).
from attnscope.kernels._tl import round_bf16  # noqa: E402  (interpreter-only bf16 rounding)

MAX_NUM_SPLITS = 1024  # a launch-grid bound (grid axis 1 < 65536) with room; 128 is already plenty
MIN_KEYS_PER_SPLIT = 256  # shorter splits spend more on their partial write + prologue than they save
SPLIT_CAP = 128  # the heuristic's cap: 128 splits already fill 132 SMs from a single (batch, kv head)
WAVES = 1  # programs the heuristic aims for, in multiples of the SM count (measured: one wave wins)


def default_num_splits(batch: int, kv_heads: int, seqlen: int, sms: int = 132, *, waves: int = WAVES,
                       min_keys: int = MIN_KEYS_PER_SPLIT, cap: int = SPLIT_CAP) -> int:
    """How many KV splits phase 1 uses when ``num_splits`` is not given.

    Without splitting, decode launches ``batch * kv_heads`` programs. Split until about ``waves * sms``
    programs run (one wave: with 3 pipeline stages one program per SM already streams at the bandwidth
    ceiling, and every extra split costs a partial write, a longer combine and, at small sizes, more
    than it saves), but never so far that a split holds fewer than ``min_keys`` keys, and never more
    than ``cap``:

        num_splits = clamp(floor(waves * sms / (batch * kv_heads)), 1, min(cap, seqlen // min_keys))

    Measured on the H200 (bench/tune_decode.py, BENCHMARKS.md), the best split count over 1..128 was
    4 for B x Hkv = 32, 16 for 8, and 1 for 128 and 512 at L >= 32k: what this formula gives.

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
    >>> default_num_splits(64, 8, 131072)  # 512 programs already fill 132 SMs
    1
    """
    for name, value in (("batch", batch), ("kv_heads", kv_heads), ("sms", sms), ("waves", waves),
                        ("min_keys", min_keys), ("cap", cap)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise InputError(f"{name}: expected a positive integer, got {value!r}")
    if not (isinstance(seqlen, int) and not isinstance(seqlen, bool) and seqlen >= 0):
        raise InputError(f"seqlen: expected a non-negative integer, got {seqlen!r}")
    want = (waves * sms) // (batch * kv_heads)
    by_length = max(1, seqlen // min_keys)
    return max(1, min(want, by_length, cap))


def logical_bytes(batch: int, q_heads: int, kv_heads: int, total_keys: int, head_dim: int, elt: int,
                  num_splits: int, return_lse: bool = False) -> dict[str, int]:
    """Logical HBM bytes of one `flash_decode` call, itemised (the benchmark's napkin math).

    ``total_keys`` is ``sum_b cache_seqlens[b]`` (``B * L_max`` when all sequences are full); ``elt`` is
    the element size of q/K/V (2 for fp16/bf16). Partials exist only when ``num_splits > 1``.
    """
    kv = 2 * kv_heads * total_keys * head_dim * elt  # K and V, each byte once per step (GQA shared)
    q = batch * q_heads * head_dim * elt  # the one query row per head
    partial = batch * q_heads * num_splits * (head_dim + 1) * 4 if num_splits > 1 else 0  # O_s, lse_s fp32
    out = batch * q_heads * head_dim * elt + (batch * q_heads * 4 if return_lse else 0)
    return {
        "kv_read": kv,
        "q_read": q,
        "partial_write": partial,  # phase 1
        "partial_read": partial,  # phase 2
        "out_write": out,
        "total": kv + q + 2 * partial + out,
    }


def _block_config() -> dict:
    """The phase-1 block config: BLOCK_N keys per iteration, STAGES-deep KV pipeline, warps.

    Measured on the H200 (bench/tune_decode.py, BENCHMARKS.md): BLOCK_N = 128, 4 warps, 3 stages is the
    best or within 2 % of the best of 8 configs (BLOCK_N 64-256, 4/8 warps, 2-4 stages) at every point
    of the issue's grid, so it is the only one: no autotuner and no autotuner bookkeeping on the launch
    path. Bytes in flight per program: (STAGES - 1) x BLOCK_N x d x 2 (K and V) x 2 bytes = 128 KiB at
    d = 128. Under the interpreter one small block keeps CPU tests fast and still makes multi-block
    splits, ragged last blocks and empty splits common at the tested lengths.
    """
    if interpreting():
        return {"BLOCK_N": 16, "STAGES": 1, "num_warps": 4, "num_stages": 1}
    return {"BLOCK_N": 128, "STAGES": 3, "num_warps": 4, "num_stages": 3}


#: The fused merge (see `_fuse_by_default`) holds at most this many bytes of partials per last program.
FUSE_MAX_BYTES = 64 * 1024
#: Elements of one merge chunk [MERGE_G, MERGE_S, d] (fp32; 32 registers per thread at 4 warps).
MERGE_ELEMS = 4096


@functools.lru_cache(maxsize=1)
def _build():
    """Define the kernels; cached, so they are built once per process."""
    torch, triton = import_torch_triton()
    import triton.language as tl

    # n_kv_heads, l_max and num_splits vary per call but never need value specialisation (SPLIT and
    # HAS_SEQLENS are constexprs): not specialising them keeps one binary per layout.
    @triton.jit(do_not_specialize=["n_kv_heads", "l_max", "num_splits"])
    def _attnscope_decode_split_kernel(
        Q, K, V, SEQLENS, O_PART, LSE_PART, O, LSE, SEM,
        stride_qb, stride_qh,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_sb,
        n_kv_heads, l_max, num_splits, qk_scale,
        GROUP: tl.constexpr,  # G = Hq / Hkv query heads per kv head
        BLOCK_G: tl.constexpr,  # G padded: to a power of two, and to >= 16 rows for tl.dot
        HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,
        STAGES: tl.constexpr,  # software-pipeline depth of the KV loop (cp.async multi-buffering)
        USE_DOT: tl.constexpr,  # tl.dot on the padded group, else elementwise multiply + tl.sum
        EMULATE_BF16: tl.constexpr,  # interpreter + bf16 only: see _emulate_bf16
        SPLIT: tl.constexpr,  # True: write fp32 partials (O_s, base-2 lse_s); False: the final O and LSE
        FUSE: tl.constexpr,  # SPLIT only: the last program of each (batch, kv head) merges the partials
        MERGE_G: tl.constexpr,  # FUSE: G padded to a power of two
        MERGE_S: tl.constexpr,  # FUSE: splits merged per chunk
        WRITE_LSE: tl.constexpr,  # the caller asked for the LSE (else LSE is not written)
        HAS_SEQLENS: tl.constexpr,
    ):
        # Buffers attnscope allocates are contiguous, so their offsets are computed, not passed:
        # O_PART [B, Hq, S, d] and LSE_PART [B, Hq, S] fp32; O [B, Hq, 1, d]; LSE [B, Hq, 1]; SEM
        # [>= B * Hkv] int32, zero between calls. Row r = b * Hq + query head.
        pid_bh = tl.program_id(0)  # b * Hkv + kv head
        split = tl.program_id(1)
        b = (pid_bh // n_kv_heads).to(tl.int64)
        h_kv = (pid_bh % n_kv_heads).to(tl.int64)
        seqlen = tl.load(SEQLENS + b * stride_sb) if HAS_SEQLENS else l_max  # keys of sequence b

        # this split's keys [lo, hi): whole BLOCK_N blocks, the sequence's own length split evenly
        blocks_per_split = tl.cdiv(tl.cdiv(seqlen, BLOCK_N), num_splits)
        lo = split * blocks_per_split * BLOCK_N
        hi = tl.minimum(lo + blocks_per_split * BLOCK_N, seqlen)

        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_N)
        g_mask = offs_g < GROUP
        q_heads = h_kv * GROUP + offs_g  # [BLOCK_G] query heads sharing kv head h_kv
        q = tl.load(Q + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
                    mask=g_mask[:, None], other=0.0)  # [BLOCK_G, d]; pad rows are 0
        if not USE_DOT:
            q = q.to(tl.float32) * qk_scale  # exact enough: one fp32 rounding per element
        k_base = K + b * stride_kb + h_kv * stride_kh
        v_base = V + b * stride_vb + h_kv * stride_vh

        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max of the base-2 scores
        l_i = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)  # running unnormalised sum of p @ V
        # Each block iterated holds >= 1 valid key (lo + j * BLOCK_N < hi), so m_new is finite and
        # alpha = exp2(-inf - m_new) = 0 on the first block: no NaN without extra guards.
        for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):  # STAGES: K/V tiles in flight
            rows = start_n + offs_n  # [BLOCK_N] key positions
            n_mask = rows < hi
            rows64 = rows.to(tl.int64)
            k = tl.load(k_base + rows64[:, None] * stride_kn + offs_d[None, :], mask=n_mask[:, None],
                        other=0.0)  # [BLOCK_N, d]
            if USE_DOT:
                kt = tl.trans(k)  # [d, BLOCK_N]
                s = tl.dot(q.to(tl.float32), kt.to(tl.float32)) if EMULATE_BF16 else tl.dot(q, kt)
                s = s * qk_scale  # [BLOCK_G, BLOCK_N], base-2 scaled scores, fp32
            else:
                s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [BLOCK_G, BLOCK_N]
            s = tl.where(n_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_G]
            alpha = tl.exp2(m_i - m_new)  # rescale of the old state
            p = tl.exp2(s - m_new[:, None])  # [BLOCK_G, BLOCK_N]
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + rows64[:, None] * stride_vn + offs_d[None, :], mask=n_mask[:, None],
                        other=0.0)  # [BLOCK_N, d]
            if USE_DOT:
                if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
                    p = round_bf16(p)
                p_lo = p.to(v.dtype)  # P in the input dtype for the MMA, as FlashAttention does
                acc = acc * alpha[:, None]
                if EMULATE_BF16:
                    acc = tl.dot(p_lo.to(tl.float32), v.to(tl.float32), acc)  # [BLOCK_G, d]
                else:
                    acc = tl.dot(p_lo, v, acc)  # [BLOCK_G, d]
            else:
                acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
            m_i = m_new

        empty = l_i == 0.0  # this split saw no key (short sequence, or cache_seqlens[b] == 0)
        o = acc / tl.where(empty, 1.0, l_i)[:, None]  # [BLOCK_G, d]; 0 where empty
        lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # [BLOCK_G]
        n_q_heads = n_kv_heads * GROUP
        q_rows = b * n_q_heads + q_heads  # [BLOCK_G] rows b * Hq + h of the outputs
        if SPLIT:
            part = q_rows * num_splits + split  # [BLOCK_G] row of O_PART / LSE_PART
            tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=g_mask[:, None])
            tl.store(LSE_PART + part, lse2, mask=g_mask)  # partial lse_s, base 2
            if FUSE:
                # Phase 2 in the same launch: every program takes a ticket after its partials are out
                # (the barrier orders all its threads' stores before the release of the gpu-scope
                # acq_rel atomic); the program that draws the last ticket has seen, through the acquire,
                # every other program's partials, and merges them. It then resets the counter, so the
                # next launch on this stream finds it at 0 (CUTLASS's semaphore pattern).
                tl.debug_barrier()
                ticket = tl.atomic_add(SEM + pid_bh, 1, sem="acq_rel", scope="gpu")
                if ticket == num_splits - 1:
                    offs_mg = tl.arange(0, MERGE_G)
                    offs_ms = tl.arange(0, MERGE_S)
                    mg_mask = offs_mg < GROUP
                    rows_m = b * n_q_heads + h_kv * GROUP + offs_mg  # [MERGE_G]
                    # the online softmax again, over splits: lse_s plays the score, O_s the value row
                    mm = tl.full([MERGE_G], float("-inf"), tl.float32)  # running max of lse_s
                    ll = tl.zeros([MERGE_G], tl.float32)  # sum_s exp2(lse_s - mm)
                    aa = tl.zeros([MERGE_G, HEAD_DIM], tl.float32)  # sum_s exp2(lse_s - mm) * O_s
                    for s0 in range(0, num_splits, MERGE_S):
                        sp = s0 + offs_ms  # [MERGE_S]
                        ok = mg_mask[:, None] & (sp < num_splits)[None, :]  # [MERGE_G, MERGE_S]
                        idx = rows_m[:, None] * num_splits + sp[None, :]  # [MERGE_G, MERGE_S]
                        # .cg: read at L2, never from this SM's L1 (other SMs wrote these lines)
                        lse_s = tl.load(LSE_PART + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
                        o_s = tl.load(O_PART + idx[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                                      mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
                        m_new = tl.maximum(mm, tl.max(lse_s, 1))  # [MERGE_G]
                        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far
                        alpha = tl.exp2(mm - m_safe)
                        w = tl.exp2(lse_s - m_safe[:, None])  # [MERGE_G, MERGE_S]; 0 for empty splits
                        ll = ll * alpha + tl.sum(w, 1)
                        aa = aa * alpha[:, None] + tl.sum(w[:, :, None] * o_s, 1)
                        mm = m_new
                    done = ll == 0.0  # every split empty: cache_seqlens[b] == 0
                    o_f = aa / tl.where(done, 1.0, ll)[:, None]
                    if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
                        o_f = round_bf16(o_f)
                    tl.store(O + rows_m[:, None] * HEAD_DIM + offs_d[None, :], o_f.to(O.dtype.element_ty),
                             mask=mg_mask[:, None])
                    if WRITE_LSE:
                        lse_f = tl.where(done, float("-inf"), mm + tl.log2(tl.where(done, 1.0, ll)))
                        tl.store(LSE + rows_m, lse_f * 0.6931471805599453, mask=mg_mask)  # natural log
                    tl.atomic_xchg(SEM + pid_bh, 0)  # ready for the next launch
        else:
            if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
                o = round_bf16(o)
            tl.store(O + q_rows[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty),
                     mask=g_mask[:, None])
            if WRITE_LSE:
                tl.store(LSE + q_rows, lse2 * 0.6931471805599453, mask=g_mask)  # ln(2): natural-log LSE

    @triton.jit
    def _attnscope_decode_combine_kernel(
        O_PART, LSE_PART, O, LSE,
        stride_pb, stride_ph, stride_ps,
        stride_qb, stride_qh, stride_qs,
        stride_ob, stride_oh,
        stride_lb, stride_lh,
        n_q_heads, num_splits,
        HEAD_DIM: tl.constexpr,
        BLOCK_S: tl.constexpr,  # splits merged per iteration
        EMULATE_BF16: tl.constexpr,
    ):
        pid = tl.program_id(0)  # b * Hq + query head
        b = (pid // n_q_heads).to(tl.int64)
        h = (pid % n_q_heads).to(tl.int64)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, HEAD_DIM)

        # The online softmax again, over splits: lse_s plays the score, O_s the value row.
        m_i = tl.full([], float("-inf"), tl.float32)  # running max of lse_s (base 2)
        l_i = tl.zeros([], tl.float32)  # sum_s exp2(lse_s - m_i)
        acc = tl.zeros([HEAD_DIM], tl.float32)  # sum_s exp2(lse_s - m_i) * O_s
        for s0 in range(0, num_splits, BLOCK_S):
            s_mask = s0 + offs_s < num_splits
            lse_s = tl.load(LSE_PART + b * stride_qb + h * stride_qh + (s0 + offs_s) * stride_qs,
                            mask=s_mask, other=float("-inf"))  # [BLOCK_S]
            o_s = tl.load(O_PART + b * stride_pb + h * stride_ph + (s0 + offs_s)[:, None] * stride_ps
                          + offs_d[None, :], mask=s_mask[:, None], other=0.0)  # [BLOCK_S, d]
            m_new = tl.maximum(m_i, tl.max(lse_s, 0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: weights are 0
            alpha = tl.exp2(m_i - m_safe)
            w = tl.exp2(lse_s - m_safe)  # [BLOCK_S]; 0 for empty splits
            l_i = l_i * alpha + tl.sum(w, 0)
            acc = acc * alpha + tl.sum(w[:, None] * o_s, 0)
            m_i = m_new

        empty = l_i == 0.0  # every split empty: cache_seqlens[b] == 0
        o = acc / tl.where(empty, 1.0, l_i)
        lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
        if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
            o = round_bf16(o)
        tl.store(O + b * stride_ob + h * stride_oh + offs_d, o.to(O.dtype.element_ty))
        tl.store(LSE + b * stride_lb + h * stride_lh, lse)

    return torch, triton, _attnscope_decode_split_kernel, _attnscope_decode_combine_kernel


# --- launching ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _launchers():
    """(phase-1 kernel, combine kernel), as ``@triton.jit`` functions.

    The first call with a layout launches through ``JITFunction.run``; repeat calls take the planned
    path (`_launch`). Measured on the H200 host, one process (bench/host_overhead.py,
    2026-11-30): checks + ``JITFunction.run`` every call 91.6 us; checks skipped, ``JITFunction.run``
    55.2 us; checks skipped, the binary's launcher 54.3 us. So what pays is not re-checking a layout
    already checked; Triton 3.6's ``JITFunction.run`` (native argument specialisation) costs about what
    calling the binary's launcher does. (An earlier try that re-derived a specialisation key per call
    before the launcher measured slower than ``JITFunction.run``.)
    """
    _, _, split_kernel, combine_kernel = _build()
    return split_kernel, combine_kernel


_SCRATCH: dict = {}


def _scratch(torch, device, part_elems: int, lse_elems: int, sem_elems: int):
    """Flat fp32 partials (O_s, lse_s) and int32 counters, cached per (device, current stream).

    Why: at small decode shapes every host microsecond shows in an eager call, and the partials and the
    fused merge's counters are the same few hundred KiB call after call. Calls on one stream run in
    order, so they can share one set; another stream gets its own. The counters are zeroed once: the
    kernel leaves every counter it used at 0. During CUDA-graph capture `flash_decode` does not use this
    cache (a graph gets buffers of its own, allocated inside the capture), so a graph never shares
    scratch memory with eager calls. A replaced (too small) buffer is freed in stream order: only this
    stream used it.
    """
    index = device.index
    if device.type == "cuda" and index is None:  # torch.device("cuda"): the current device
        index = torch.cuda.current_device()
    stream = torch._C._cuda_getCurrentRawStream(index) if device.type == "cuda" else 0
    return _scratch_on(torch, device, index, stream, part_elems, lse_elems, sem_elems)


def _scratch_on(torch, device, index, stream: int, part_elems: int, lse_elems: int, sem_elems: int):
    """`_scratch` for a known device index and raw stream handle."""
    key = (device.type, index, stream)
    bufs = _SCRATCH.get(key)
    if bufs is None or bufs[0].numel() < part_elems or bufs[1].numel() < lse_elems \
            or bufs[2].numel() < sem_elems:
        old = bufs or (None, None, None)
        grow = [max(n, 1024) if (b is None or b.numel() < n) else None
                for n, b in zip((part_elems, lse_elems, sem_elems), old, strict=True)]
        bufs = (torch.empty(grow[0], dtype=torch.float32, device=device) if grow[0] else old[0],
                torch.empty(grow[1], dtype=torch.float32, device=device) if grow[1] else old[1],
                torch.zeros(grow[2], dtype=torch.int32, device=device) if grow[2] else old[2])
        _SCRATCH[key] = bufs
    return bufs


def _fuse_by_default(group: int, num_splits: int, head_dim: int) -> bool:
    """Merge in the last program (one launch) unless its share of partials is large.

    The fused merge runs in one program per (batch, kv head), which reads ``G x S x d`` fp32 partials
    alone; the separate combine kernel spreads them over B x Hq programs. Measured on the H200
    (bench/decode_variants.py, BENCHMARKS.md): up to `FUSE_MAX_BYTES` (64 KiB: e.g. G = 4 and 16
    splits at d = 128) the fused merge costs ~1 us of kernel time more than a second kernel, and saves
    a launch (tens of microseconds of host time, which is what an eager call at small shapes is made
    of); at MQA with 128 splits (2 MiB for one program) it costs 45 us. So: fused eagerly when the
    partials are small; never by default during CUDA-graph capture, where a second launch costs nothing
    on the host (`flash_decode` checks that).
    """
    return _next_pow2(group) * num_splits * head_dim * 4 <= FUSE_MAX_BYTES


def _check_inputs(torch, q, k_cache, v_cache, cache_seqlens, num_splits, scale, use_dot, fuse_combine):
    """Validate everything that needs no device read; return the shape facts."""
    check_tensor(torch, "q", q, 4, "[B, Hq, 1, d]")
    check_tensor(torch, "k_cache", k_cache, 4, "[B, Hkv, L_max, d]")
    check_tensor(torch, "v_cache", v_cache, 4, "[B, Hkv, L_max, d]")
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor):
            raise InputError(f"cache_seqlens: expected a torch.Tensor of int32 [B] or None, "
                             f"got {type(cache_seqlens).__name__}")
        tensors["cache_seqlens"] = cache_seqlens
    check_device(torch, tensors)
    B, Hq, Nq, d = q.shape
    if Nq != 1:
        raise InputError(f"q: expected one query token per sequence, shape [B, Hq, 1, d], got shape "
                         f"{tuple(q.shape)} (use attnscope.flash_attention for Nq > 1)")
    check_same("k_cache", "batch (as q)", B, k_cache.shape[0])
    check_same("k_cache", "head_dim (as q)", d, k_cache.shape[3])
    check_same("k_cache", "dtype (as q)", q.dtype, k_cache.dtype)
    check_same("v_cache", "dtype (as q)", q.dtype, v_cache.dtype)
    check_same("v_cache", "shape (as k_cache)", tuple(k_cache.shape), tuple(v_cache.shape))
    Hkv, L_max = k_cache.shape[1], k_cache.shape[2]
    if B == 0 or Hq == 0:
        raise InputError(f"q: expected B >= 1 and Hq >= 1, got shape {tuple(q.shape)}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"q: expected the number of query heads to be a multiple of the kv heads "
                         f"({Hkv}), got Hq = {Hq}")
    if L_max == 0:
        raise InputError(f"k_cache: expected L_max >= 1, got shape {tuple(k_cache.shape)}")
    check_head_dim(d)
    if cache_seqlens is not None:
        if cache_seqlens.dtype != torch.int32:
            raise InputError(f"cache_seqlens: expected dtype torch.int32, got {cache_seqlens.dtype}")
        if tuple(cache_seqlens.shape) != (B,):
            raise InputError(f"cache_seqlens: expected shape ({B},) (one length per sequence), "
                             f"got {tuple(cache_seqlens.shape)}")
    if num_splits is not None:
        if not (isinstance(num_splits, int) and not isinstance(num_splits, bool) and num_splits > 0):
            raise InputError(f"num_splits: expected a positive integer or None, got {num_splits!r}")
        if num_splits > MAX_NUM_SPLITS:
            raise NotImplementedError(f"num_splits: at most {MAX_NUM_SPLITS} supported, got {num_splits}")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale) and scale > 0):
        raise InputError(f"scale: expected a finite positive number or None, got {scale!r}")
    if use_dot is not None and not isinstance(use_dot, bool):
        raise InputError(f"use_dot: expected True, False or None, got {use_dot!r}")
    if fuse_combine is not None and not isinstance(fuse_combine, bool):
        raise InputError(f"fuse_combine: expected True, False or None, got {fuse_combine!r}")
    return B, Hq, d, Hkv, L_max


def _check_seqlen_values(cache_seqlens, L_max: int) -> int:
    """Read the lengths back to the host (one small device->host copy, a sync) and check them.

    Returns the longest length, which the split heuristic then uses instead of L_max.
    """
    lo, hi = (int(x) for x in cache_seqlens.aminmax())
    if lo < 0 or hi > L_max:
        bad = lo if lo < 0 else hi
        raise InputError(f"cache_seqlens: expected values in [0, L_max = {L_max}], got {bad}")
    return hi


@functools.lru_cache(maxsize=16)
def _sms(torch, device) -> int:
    return num_sms(torch, device)


def flash_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits=None, scale=None, return_lse=False,
                 *, check_seqlens: bool = True, use_dot: bool | None = None,
                 fuse_combine: bool | None = None, _config: dict | None = None):
    """Decode attention for one new token per sequence against a KV cache (split-KV, Flash-Decoding).

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, 1, d]
        The new token's queries, fp16 or bf16, CUDA (or CPU under ``TRITON_INTERPRET=1``).
    k_cache, v_cache : torch.Tensor, [B, Hkv, L_max, d]
        The caches, q's dtype; ``Hq`` a multiple of ``Hkv`` (GQA / MQA: query head ``i`` reads kv head
        ``i // (Hq / Hkv)``, as SDPA's ``enable_gqa``). Any strides with a unit last stride, e.g. a
        ``[B, L_max, Hkv, d]`` buffer viewed as ``buf.transpose(1, 2)``, without a copy.
    cache_seqlens : torch.Tensor, int32 [B], optional
        Valid keys of each sequence (positions ``0 .. len - 1`` are attended); defaults to L_max for
        all. A length of 0 gives output 0 and LSE = -inf.
    num_splits : int, optional
        KV splits per sequence; defaults to `default_num_splits` (of B, Hkv, the longest length and
        the SM count). 1 runs phase 1 only.
    scale : float, optional
        Softmax scale; defaults to ``1/sqrt(d)``.
    return_lse : bool
        Also return the natural-log logsumexp of each head's scores.
    check_seqlens : bool, keyword-only
        Check ``0 <= cache_seqlens <= L_max`` (default). That reads the lengths back to the host, a
        device sync that also breaks CUDA-graph capture; pass False to skip it (out-of-range lengths
        then give undefined results) and the heuristic uses L_max instead of the longest length.
    use_dot : bool, optional, keyword-only
        Compute the group's products with ``tl.dot`` on the group padded to 16 rows (default, every G)
        or elementwise in fp32 (False; see the module notes on why that is not the default). A
        benchmark knob.
    fuse_combine : bool, optional, keyword-only
        With more than one split: merge the partials in the last program of each (batch, kv head), in
        the same launch (True), or in a second kernel (False). Default: `_fuse_by_default`. A
        benchmark knob; both give the same result within rounding.

    Returns
    -------
    o : torch.Tensor, [B, Hq, 1, d], q's dtype
    lse : torch.Tensor, [B, Hq, 1], float32, natural log — only when ``return_lse``.

    Supported: d in {64, 128}; fp16 and bf16. Anything else raises NotImplementedError; malformed input
    raises ValueError naming the argument.

    Example
    -------
    >>> q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    >>> k = v = torch.randn(4, 8, 32768, 128, device="cuda", dtype=torch.bfloat16)
    >>> lens = torch.tensor([32768, 100, 0, 5000], device="cuda", dtype=torch.int32)
    >>> o = attnscope.flash_decode(q, k, v, cache_seqlens=lens)
    """
    torch, _ = import_torch_triton()
    key = _plan_key(q, k_cache, v_cache, cache_seqlens, num_splits, scale, return_lse, check_seqlens, use_dot,
                    fuse_combine) if _config is None and LAUNCH != "off" else None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        facts = _check_inputs(torch, q, k_cache, v_cache, cache_seqlens, num_splits, scale, use_dot,
                              fuse_combine)
    else:
        facts = plan.facts  # this layout was checked before: the key holds everything the checks read
    longest = facts[4]
    if cache_seqlens is not None and check_seqlens:
        longest = _check_seqlen_values(cache_seqlens, facts[4])
    device = q.device
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    rec = plan.records.get((longest, capturing)) if plan is not None else None
    if rec is None:
        rec = _record(torch, q, k_cache, v_cache, cache_seqlens, facts, longest, capturing, num_splits, scale,
                      return_lse, use_dot, fuse_combine, _config)
        if key is not None:
            if plan is None:
                if len(_PLANS) >= MAX_PLANS:
                    _PLANS.clear()
                plan = _PLANS[key] = _Plan(facts)
            plan.records[(longest, capturing)] = rec
    return _launch(torch, rec, q, k_cache, v_cache, cache_seqlens, return_lse, capturing)


# --- launching: a record per (input layout, longest length, capture), cached in a plan ------------------
#: "direct": repeat calls with a layout already checked skip the input checks and call the compiled
#: kernel's launcher; "jit": skip the checks, launch through JITFunction.run; "off": check and build the
#: launch record on every call. A benchmark knob (bench/host_overhead.py times the three in one process).
LAUNCH = "direct"
#: Layouts remembered (the cache is cleared when full; a serving loop sees a handful).
MAX_PLANS = 512
#: Triton versions whose CompiledKernel launcher signature `_launch` has been checked against on the H200
#: (tests/test_decode.py on CUDA tensors); others launch through JITFunction.run.
DIRECT_LAUNCH_TRITON = ("3.6.",)
_PLANS: dict = {}


class _Plan:
    """What one input layout checked to (``facts``: B, Hq, d, Hkv, L_max) and its launch records, keyed
    by (longest valid length, capturing a CUDA graph): the split count depends on the first, the merge
    and the scratch buffers on the second."""

    __slots__ = ("facts", "records")

    def __init__(self, facts):
        self.facts = facts
        self.records: dict = {}


class _Record:
    """Everything a launch needs that does not change between calls with the same layout."""

    __slots__ = ("device", "cuda", "index", "split", "fuse", "grid", "rest", "options", "compiled", "o_shape",
                 "n_rows", "d", "sem_elems", "part_shape")

    def __init__(self, device, split, fuse, grid, rest, options, o_shape, n_rows, d, sem_elems, part_shape):
        self.device, self.cuda = device, device.type == "cuda"
        self.index = device.index if device.index is not None or not self.cuda else 0
        self.split, self.fuse, self.grid, self.rest, self.options = split, fuse, grid, rest, options
        self.compiled = None  # the binary, once a JITFunction.run launch returned one that can be called
        self.o_shape, self.n_rows, self.d = o_shape, n_rows, d
        self.sem_elems, self.part_shape = sem_elems, part_shape


def _plan_key(q, k, v, seqlens, num_splits, scale, return_lse, check_seqlens, use_dot, fuse_combine):
    """A hashable description of everything the input checks and the compiled binary depend on: each
    tensor's type, shape, strides, dtype, device and 16-byte alignment (Triton specialises pointers on
    it), and each option with its type (``True == 1`` must not reuse the plan of ``1``). None when the
    input is not even tensors: the checks then run and raise."""
    try:
        parts = [(type(t), t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16) for t in (q, k, v)]
        if seqlens is not None:
            parts.append((type(seqlens), seqlens.shape, seqlens.stride(), seqlens.dtype, seqlens.device,
                          seqlens.data_ptr() % 16))
        parts.append((type(num_splits), num_splits, type(scale), scale, bool(return_lse), bool(check_seqlens),
                      type(use_dot), use_dot, type(fuse_combine), fuse_combine))
        key = tuple(parts)
        hash(key)
        return key
    except Exception:  # malformed input: let _check_inputs say what was expected
        return None


def _record(torch, q, k_cache, v_cache, cache_seqlens, facts, longest, capturing, num_splits, scale,
            return_lse, use_dot, fuse_combine, config):
    """The launch record of a checked call: split count, merge, block sizes, grid and the kernel's
    non-tensor arguments in signature order."""
    B, Hq, d, Hkv, L_max = facts
    group = Hq // Hkv
    device = q.device
    if num_splits is None:
        num_splits = default_num_splits(B, Hkv, longest, _sms(torch, device))
    if use_dot is None:
        use_dot = True  # see the module notes: pipelined MMA, low register use, for every G
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    split = num_splits > 1
    if fuse_combine is None:  # see _fuse_by_default; in a CUDA graph the second launch is free
        fuse_combine = not capturing and _fuse_by_default(group, num_splits, d)
    fuse = split and fuse_combine
    block_g = _next_pow2(group)
    if use_dot:
        block_g = max(16, block_g)  # tl.dot needs M >= 16
    merge_g = _next_pow2(group)
    merge_s = max(1, min(_next_pow2(num_splits), MERGE_ELEMS // (merge_g * d)))
    # config (BLOCK_N, STAGES, num_warps, num_stages) overrides the measured one: bench/tune_decode.py
    cfg = config or _block_config()
    split_kernel, _ = _launchers()
    named = {
        "stride_qb": q.stride(0), "stride_qh": q.stride(1),
        "stride_kb": k_cache.stride(0), "stride_kh": k_cache.stride(1), "stride_kn": k_cache.stride(2),
        "stride_vb": v_cache.stride(0), "stride_vh": v_cache.stride(1), "stride_vn": v_cache.stride(2),
        # without lengths SEQLENS is a placeholder (the output), never read
        "stride_sb": cache_seqlens.stride(0) if cache_seqlens is not None else Hq * d,
        "n_kv_heads": Hkv, "l_max": L_max, "num_splits": num_splits, "qk_scale": sm_scale * LOG2E,
        "GROUP": group, "BLOCK_G": block_g, "HEAD_DIM": d, "BLOCK_N": cfg["BLOCK_N"],
        "STAGES": cfg["STAGES"], "USE_DOT": use_dot, "EMULATE_BF16": _emulate_bf16(torch, q.dtype),
        "SPLIT": split, "FUSE": fuse, "MERGE_G": merge_g, "MERGE_S": merge_s, "WRITE_LSE": return_lse,
        "HAS_SEQLENS": cache_seqlens is not None,
    }
    rest = tuple(named[n] for n in split_kernel.arg_names[_N_TENSOR_ARGS:])
    return _Record(device, split, fuse, (B * Hkv, num_splits), rest,
                   {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}, (B, Hq, 1, d),
                   B * Hq * num_splits, d, B * Hkv if fuse else 0, (B, Hq, num_splits))


#: The kernel's leading tensor arguments: Q, K, V, SEQLENS, O_PART, LSE_PART, O, LSE, SEM.
_N_TENSOR_ARGS = 9
_KNOBS = None  # triton.knobs.runtime, once a direct launch is possible (its launch hooks are read per call)


def _direct_launch_ok(compiled) -> bool:
    global _KNOBS
    if LAUNCH != "direct" or compiled is None or interpreting():
        return False
    import triton

    if not (triton.__version__.startswith(DIRECT_LAUNCH_TRITON) and hasattr(compiled, "packed_metadata")):
        return False
    _KNOBS = triton.knobs.runtime
    return True


def _launch(torch, rec, q, k_cache, v_cache, cache_seqlens, return_lse, capturing):
    """Allocate the output, find the partials' buffers, launch phase 1 (and phase 2 if separate).

    Why a record: at small decode shapes the kernel runs for ~10 us and an eager call is made of host
    time. The first call with a layout launches through ``JITFunction.run``, which compiles (or finds)
    the binary and returns it; the record keeps it. A repeat call calls the binary's launcher on the
    current stream: the binary ``JITFunction.run`` would pick, since the plan key holds everything
    Triton specialises on (argument types, 16-byte alignment, the int arguments' values through the
    strides and shapes). While a launch hook is set (a profiler's), launches go through
    ``JITFunction.run``, which calls it.

    Partials: eagerly the per-stream cached scratch (`_scratch`); under CUDA-graph capture fresh buffers
    the graph owns.
    """
    device = rec.device
    o = torch.empty(rec.o_shape, dtype=q.dtype, device=device)
    need_lse = return_lse or (rec.split and not rec.fuse)  # the separate merge always writes the LSE
    lse = torch.empty(rec.o_shape[:3], dtype=torch.float32, device=device) if need_lse else o
    o_part = lse_part = sem = o  # placeholders, never touched without SPLIT / FUSE
    stream = torch._C._cuda_getCurrentRawStream(rec.index) if rec.cuda else 0
    if rec.split:
        n, d = rec.n_rows, rec.d
        if capturing:
            o_part = torch.empty(n * d, dtype=torch.float32, device=device)
            lse_part = torch.empty(n, dtype=torch.float32, device=device)
            sems = torch.zeros(rec.sem_elems, dtype=torch.int32, device=device) if rec.fuse else o
        else:
            o_part, lse_part, sems = _scratch_on(torch, device, rec.index, stream, n * d, n, rec.sem_elems)
        if rec.fuse:
            sem = sems
    seqlens = cache_seqlens if cache_seqlens is not None else o  # a placeholder pointer, never read
    c = rec.compiled
    if c is not None and LAUNCH == "direct" and _KNOBS.launch_enter_hook is None \
            and _KNOBS.launch_exit_hook is None:
        g0, g1 = rec.grid
        c.run(g0, g1, 1, stream, c.function, c.packed_metadata, None, None, None,
              q, k_cache, v_cache, seqlens, o_part, lse_part, o, lse, sem, *rec.rest)
    else:
        split_kernel, _ = _launchers()
        c = split_kernel[rec.grid](q, k_cache, v_cache, seqlens, o_part, lse_part, o, lse, sem, *rec.rest,
                                   **rec.options)
        if rec.compiled is None and _direct_launch_ok(c):
            rec.compiled = c
    if rec.split and not rec.fuse:
        (B, Hq, S), n, d = rec.part_shape, rec.n_rows, rec.d
        _combine(o_part[:n * d].view(B, Hq, S, d), lse_part[:n].view(B, Hq, S), o, lse)
    return (o, lse) if return_lse else o


def self_check(device=None, dtypes=("fp16", "bf16"), seed: int = 0) -> list[dict]:
    """Run `flash_decode` on a few small ragged cases and hold it against float64 attention.

    For `attnscope verify` and the benchmark's "check first" step. Cases: GQA 1, 4, 8; d 64 and 128;
    lengths (L, 0, 1, ...) in one batch; 1 split and the heuristic's. Bound (flash-attn's): max error
    <= 2 x SDPA's own error at that dtype on the same inputs + 1e-3. Returns one dict per case with
    ``case``, ``max_err``, ``bound``, ``ok`` (``ok`` also requires no NaN and exact zeros for empty
    sequences).

    device: defaults to CUDA when available, else CPU (needs TRITON_INTERPRET=1).
    """
    torch, _ = import_torch_triton()
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for dtype_name in dtypes:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
        for B, Hq, Hkv, L, d, num_splits in [(3, 4, 4, 333, 64, None), (3, 8, 2, 1000, 128, 1),
                                             (3, 16, 2, 1000, 128, None)]:
            q, k, v = (torch.randn(*shape, generator=gen).to(dtype).to(device)
                       for shape in ((B, Hq, 1, d), (B, Hkv, L, d), (B, Hkv, L, d)))
            lens = torch.tensor([L, 0, 1], dtype=torch.int32)
            o = flash_decode(q, k, v, lens.to(device), num_splits=num_splits)
            # float64 and low-precision references, one sequence at a time on its valid keys
            err, torch_err, empty_ok = 0.0, 0.0, True
            for b, n in enumerate(lens.tolist()):
                if n == 0:
                    empty_ok = bool((o[b] == 0).all())
                    continue
                args = (q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n])
                ref = torch.nn.functional.scaled_dot_product_attention(
                    *(t.cpu().double() for t in args), enable_gqa=True)
                low = torch.nn.functional.scaled_dot_product_attention(*args, enable_gqa=True)
                err = max(err, (o[b:b + 1].cpu().double() - ref).abs().max().item())
                torch_err = max(torch_err, (low.cpu().double() - ref).abs().max().item())
            bound = 2 * torch_err + 1e-3
            ok = empty_ok and not bool(torch.isnan(o).any()) and err <= bound
            rows.append({"case": f"{dtype_name} B={B} Hq={Hq} Hkv={Hkv} L={L} d={d} lens=[{L},0,1] "
                                 f"splits={num_splits or 'auto'}",
                         "max_err": err, "bound": bound, "ok": ok})
    return rows


def _combine(o_part, lse_part, o, lse) -> None:
    """Phase 2 as its own kernel: merge ``o_part`` [B, Hq, S, d] fp32 and base-2 ``lse_part`` [B, Hq, S]
    into ``o`` [B, Hq, 1, d] (its dtype) and the natural-log ``lse`` [B, Hq, 1] (fp32), in place."""
    torch, _ = import_torch_triton()
    _, combine_kernel = _launchers()
    B, Hq, S, d = o_part.shape
    combine_kernel[(B * Hq,)](
        o_part, lse_part, o, lse,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part.stride(0), lse_part.stride(1), lse_part.stride(2),
        o.stride(0), o.stride(1),
        lse.stride(0), lse.stride(1),
        Hq, S,
        HEAD_DIM=d, BLOCK_S=min(16, _next_pow2(S)), EMULATE_BF16=_emulate_bf16(torch, o.dtype),
    )


def _emulate_bf16(torch, dtype) -> bool:
    """Work around two bf16 defects of Triton 3.6's interpreter (CPU tests only; never on a GPU).

    Its ``tl.dot`` multiplies bf16 operands as their raw uint16 bit patterns, and its fp32 -> bf16 cast
    truncates instead of rounding to nearest even. So under the interpreter with bf16 the kernels
    multiply in fp32 (a product of two bf16 values is exact in fp32: what the tensor cores compute) and
    round to nearest even with integer arithmetic before each cast, making the cast exact.
    """
    return interpreting() and dtype == torch.bfloat16


def _next_pow2(n: int) -> int:
    """Smallest power of two >= n (triton.next_power_of_2 without importing triton)."""
    return 1 << max(0, n - 1).bit_length()
