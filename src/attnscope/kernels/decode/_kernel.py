"""The split-KV decode kernels (Flash-Decoding; spec §6, §6.1): phase 1 streams one split of the keys of
one (sequence, kv head, row tile) through the online softmax and writes fp32 partials (or, with one split,
the output); phase 2 merges the splits with the one logsumexp merge (`_tl.lse_merge_step`), fused into the
last program of a row tile or as a separate kernel. Layouts and the host side: `attnscope.kernels.decode`.
An e4m3 tile of one query with Q K^T in fp16 (``FP8_F16QK``) puts the keys on the MMA rows: S^T = K Q^T and
O^T = V^T P^T on the G <= 16 query rows padded to 8 or 16 (m16n8k16 pads N to 8 where M pads to 16).

Values are checked on the device: a length outside [0, L_max] is clamped into it (one in (0, Nq), shorter
than the queries it holds, runs as given) and a used block-table entry outside [0, num_pages) is never
dereferenced (its keys are masked out; in a tile of one query with keys as the MMA rows, or with
``PAGE_PRECHECK``, every key of its split: the entries are checked once before the loop); either sets a bit
of the int32 error word ``ERR`` (`ERR_SEQLENS`, `ERR_BLOCK_TABLE`), as does a K/V scale that is not finite
and positive, whose product with 448 (the largest dequantised value) or the softmax scale is not finite, or a
k_scale under which a score passes fp32 (its row's output would be NaN) (`ERR_SCALES`).
`checks.check_errors` reads the word. A sink is kept finite (`_tl.sink_log2`).
"""

from __future__ import annotations

from attnscope.kernels._common import import_torch_triton, interpreting

torch, triton = import_torch_triton()
import triton.language as tl  # noqa: E402

from attnscope.kernels._tl import lse_merge_finish, lse_merge_step, round_bf16, sink_log2, tanh_  # noqa: E402

# bits of the error word (constexpr globals: the kernels read them; the host reads ``.value``)
ERR_SEQLENS = tl.constexpr(1)  # a cache_seqlens value outside [0, L_max], or in (0, Nq)
ERR_BLOCK_TABLE = tl.constexpr(2)  # a used block_table entry outside [0, num_pages)
ERR_SCALES = tl.constexpr(4)  # k_scale / v_scale not finite and > 0; 448 x it, scale x k_scale or a score inf
ERR_QUANTIZE = tl.constexpr(8)  # NaN or inf in `quantize_kv`'s input (set by its torch ops, not a kernel)
ERR_LEFTPAD = tl.constexpr(16)  # a cache_leftpad value outside [0, the sequence's length]
E4M3_MAX = tl.constexpr(448.0)  # the largest finite torch.float8_e4m3fn
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): natural-log LSE = base-2 LSE * ln 2


@triton.jit
def _e4m3_to(x, dtype: tl.constexpr):
    """e4m3 -> fp16 / bf16 (exact): the packed e4m3x2 -> f16x2 convert, then f16 -> f32 -> bf16 for bf16
    (a direct e4m3 -> bf16 cast takes one slow f16 -> bf16 convert per element on sm_90)."""
    x = x.to(tl.float16)
    return x if dtype == tl.float16 else x.to(tl.float32).to(dtype)


#: e4m3x4 (one int32 word, byte i = element i) -> four fp16 halves: two packed e4m3x2 -> f16x2 converts
_E4M3X4_F16 = tl.constexpr("""{
    .reg .b16 lo, hi;
    .reg .b32 h0, h1;
    mov.b32 {lo, hi}, $4;
    cvt.rn.f16x2.e4m3x2 h0, lo;
    cvt.rn.f16x2.e4m3x2 h1, hi;
    mov.b32 {$0, $1}, h0;
    mov.b32 {$2, $3}, h1;
}""")


#: four e4m3 (one b32, byte i = element i) -> four fp16 (two f16x2): `_e4m3_to_f16_opaque`
_E4M3X4_F16X2 = tl.constexpr("""{
    .reg .b16 lo, hi;
    mov.b32 {lo, hi}, $2;
    cvt.rn.f16x2.e4m3x2 $0, lo;
    cvt.rn.f16x2.e4m3x2 $1, hi;
}""")


@triton.jit
def _e4m3_to_f16_opaque(x, ASM: tl.constexpr):
    """e4m3 (any shape, loaded as e4m3) -> fp16 (exact), four per two converts, in an asm statement Triton
    does not look through (``is_pure=False``): its choice of the MMA operand layout (``kWidth``) then sees
    16-bit operands, so Q / P stay in registers and ldmatrix loads them, where an 8-bit load upstream gives
    kWidth 4 (q re-read with 8-byte shared loads and register moves, P through shared memory). ``ASM``:
    the PTX (a GPU); else Triton's convert (the interpreter)."""
    if ASM:
        return tl.inline_asm_elementwise(_E4M3X4_F16X2, "=r,=r,r", [x.to(tl.uint8, bitcast=True)],
                                         dtype=tl.float16, is_pure=False, pack=4)
    return x.to(tl.float16)


@triton.jit
def _e4m3_words_to_f16(w, ASM: tl.constexpr):
    """[N, C] int32 words of four e4m3 each (byte i: element 4c + i) -> [N, 4C] fp16 (exact), converted in
    the words' register layout. Triton moves the convert of an e4m3 tile that feeds `tl.dot` into the
    dot-operand layout; for the K-major operand V of P @ V that means one 1-byte shared-memory load per
    element. Words keep the shared-memory loads 16 bytes wide and leave one fp16 round trip (stores +
    ldmatrix.trans). ``ASM``: the packed converts as PTX (a GPU); else per byte (the interpreter)."""
    if ASM:
        e0, e1, e2, e3 = tl.inline_asm_elementwise(_E4M3X4_F16, "=h,=h,=h,=h,r", [w], is_pure=True, pack=1,
                                                   dtype=(tl.float16, tl.float16, tl.float16, tl.float16))
    else:
        e0 = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        e1 = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        e2 = ((w >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        e3 = ((w >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    x = tl.join(tl.join(e0, e2), tl.join(e1, e3))  # [N, C, 2, 2]: element 4c + 2r + q at [n, c, r, q]
    return tl.reshape(x, [w.shape[0], w.shape[1] * 4])


@triton.jit
def _rows_to_f16(q):
    """bf16 rows [M, d] -> (fp16 rows, fp32 [M] factors): row i times 2^k_i, the power of two that brings
    its largest |value| into [2^14, 2^15), and 2^-k_i to undo it in the scores. Exact for every value at
    least 2^-31 of its row's largest (fp16's 11 bits hold bf16's 8 down to 2^-17); smaller ones round at
    2^-25 absolute (fp16 subnormals), 2^-39 of the row's largest, far below the bf16 scores' own rounding.
    A zero row gets 2^126 and stays 0. With an fp16 K, Q K^T then runs on the one-instruction e4m3 -> f16
    convert of each key instead of e4m3 -> f16 -> f32 -> bf16."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), 1)  # [M]
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent: |max| in [2^(e-127), 2^(e-126))
    up = tl.minimum(tl.maximum(268 - e, 1), 253)  # biased exponent of 2^(14 - (e - 127)), kept normal
    f_up = (up << 23).to(tl.float32, bitcast=True)
    f_down = ((254 - up) << 23).to(tl.float32, bitcast=True)  # 2^-k, normal as 2^k is
    return (qf * f_up[:, None]).to(tl.float16), f_down


@triton.jit
def _add_sink(m_i, l_i, acc, sink2):
    """Fold a sink (base-2 logit ``sink2`` per row, no value) into a merge state (m, l, acc): the partial
    (O = 0, LSE = sink), joined once (`attnscope.reference.combine`'s sinks)."""
    m_new = tl.maximum(m_i, sink2)  # finite: the sink is (`_tl.sink_log2`)
    alpha = tl.exp2(m_i - m_new)  # exp2(-inf) = 0 for a state with no key
    return m_new, l_i * alpha + tl.exp2(sink2 - m_new), acc * tl.expand_dims(alpha, -1)


@triton.jit
def _checked_split_end(bt_base, lo, hi, num_pages, ERR, PAGE_SIZE: tl.constexpr):
    """The end of a split's keys [lo, hi) after checking their block-table entries once, 64 per load: a
    split holding one outside [0, num_pages) reports it (`ERR_BLOCK_TABLE`) and attends to no key (``lo``),
    so its loop reads the entries with no per-key range check."""
    n_used = tl.cdiv(hi, PAGE_SIZE)
    bad = tl.zeros([64], tl.int32)
    for p0 in range(lo // PAGE_SIZE, n_used, 64):
        pidx = p0 + tl.arange(0, 64)
        e = tl.load(bt_base + pidx, mask=pidx < n_used, other=0)
        bad = bad | (e.to(tl.uint32, bitcast=True) >= num_pages.to(tl.uint32, bitcast=True)).to(tl.int32)
    if tl.max(bad, 0) != 0:
        tl.atomic_or(ERR, ERR_BLOCK_TABLE)
    return tl.where(tl.max(bad, 0) != 0, lo, hi)


# sizes that vary per call are not value-specialised: one binary per layout
@triton.jit(do_not_specialize=["n_kv_heads", "l_max", "num_splits", "n_q", "n_m_tiles", "num_pages",
                               "win_left"])
def _attnscope_decode_split_kernel(
    Q, K, V, SEQLENS, BT, O_PART, LSE_PART, O, LSE, SEM, ERR, K_SCALE, V_SCALE, SINKS, STARTS,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,  # dense: batch, head, position; paged: page, head, slot
    stride_vb, stride_vh, stride_vn,
    stride_sb, stride_tb,
    n_kv_heads, l_max, num_splits, n_q, n_m_tiles, num_pages, win_left, qk_scale, softcap2,
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
    FP8: tl.constexpr = False,  # K/V e4m3 with fp32 scales K_SCALE / V_SCALE (one, or one per kv head)
    SCALE_PER_HEAD: tl.constexpr = False,
    FP8_WORDS: tl.constexpr = False,  # FP8: V read as int32 words (`_e4m3_words_to_f16`; V aligned)
    FP8_ASM: tl.constexpr = False,  # FP8_WORDS: convert with PTX (not under the interpreter)
    FP8_F16QK: tl.constexpr = False,  # FP8, USE_DOT: Q K^T in fp16 (bf16 q: rows scaled, `_rows_to_f16`)
    WINDOW: tl.constexpr = False,  # sliding window: row at position p sees keys [p - win_left, p]
    SOFTCAP: tl.constexpr = False,  # base-2 scores s -> softcap2 * tanh(s / softcap2)
    HAS_SINKS: tl.constexpr = False,  # SINKS fp32 [Hq]: one logit per query head joins the denominator
    HAS_STARTS: tl.constexpr = False,  # dense: STARTS int32 [B], sequence b's keys are [STARTS[b], seqlen)
    PAGE_PRECHECK: tl.constexpr = False,  # PAGED: entries checked once per split (`_checked_split_end`)
    D: tl.constexpr = 0,  # the head dim when below its power-of-two tile HEAD_DIM (0: HEAD_DIM itself)
):
    # attnscope's own buffers are contiguous, so their offsets are computed: O_PART [R, S, d] and
    # LSE_PART [R, S] fp32, O [R, d], LSE [R] with R = B * Hq * Nq rows in (b, head, query) order.
    pid = tl.program_id(0)  # (b * Hkv + kv head) * M_tiles + row tile
    split = tl.program_id(1)
    m_tile = pid % n_m_tiles
    pid_bh = pid // n_m_tiles
    b = (pid_bh // n_kv_heads).to(tl.int64)
    h_kv = (pid_bh % n_kv_heads).to(tl.int64)
    if HAS_SEQLENS:
        seqlen = tl.load(SEQLENS + b * stride_sb)  # keys of sequence b, clamped to [0, L_max]: reported
        if (seqlen < 0) | (seqlen > l_max) | ((seqlen > 0) & (seqlen < n_q)):  # 0 < seqlen < Nq: too short
            tl.atomic_or(ERR, ERR_SEQLENS)
        seqlen = tl.minimum(tl.maximum(seqlen, 0), l_max)
    else:
        seqlen = l_max
    start = 0  # the sequence's first key (cache_leftpad); the keys before it are padding, never visible
    if HAS_STARTS:
        start = tl.load(STARTS + b)
        if (start < 0) | (start > seqlen):
            tl.atomic_or(ERR, ERR_LEFTPAD)
        start = tl.minimum(tl.maximum(start, 0), seqlen)
    if FP8:  # k_scale folds into the softmax scale, v_scale multiplies the output
        k_sc = tl.load(K_SCALE + h_kv) if SCALE_PER_HEAD else tl.load(K_SCALE)
        v_sc = tl.load(V_SCALE + h_kv) if SCALE_PER_HEAD else tl.load(V_SCALE)
        qk_scale = qk_scale * k_sc
        bad = (k_sc <= 0) | (v_sc <= 0) | (qk_scale == float("inf"))
        bad = bad | (k_sc * E4M3_MAX == float("inf")) | (v_sc * E4M3_MAX == float("inf"))  # dequantised K, V
        if bad | (k_sc != k_sc) | (v_sc != v_sc):  # x != x: NaN
            tl.atomic_or(ERR, ERR_SCALES)

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # packed rows r = i * G + g
    offs_d = tl.arange(0, HEAD_DIM)
    DIM: tl.constexpr = HEAD_DIM if D == 0 else D
    ODD: tl.constexpr = DIM != HEAD_DIM  # columns past DIM: loads read 0, stores skip them
    d_row = offs_d[None, :] < DIM
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
        lim = seqlen
    kv_lo = 0
    if WINDOW:  # keys before the first row's window are never loaded (whole BLOCK_N blocks)
        first_q = (m_tile * BLOCK_M) // GROUP
        kv_lo = tl.maximum(seqlen - n_q + first_q - win_left, 0)
        kv_lo = tl.minimum(kv_lo // BLOCK_N * BLOCK_N, kv_len)
    if HAS_STARTS:  # nor the padding's whole blocks
        kv_lo = tl.maximum(kv_lo, tl.minimum(start // BLOCK_N * BLOCK_N, kv_len))
    # this split's keys [lo, hi): whole BLOCK_N blocks, the row tile's n_blocks dealt evenly, the first
    # n_blocks % num_splits splits one more: no split is empty while n_blocks >= num_splits
    n_blocks = tl.cdiv(kv_len - kv_lo, BLOCK_N)
    per_split = n_blocks // num_splits
    extra = n_blocks % num_splits
    lo = kv_lo + (split * per_split + tl.minimum(split, extra)) * BLOCK_N
    hi = tl.minimum(lo + (per_split + (split < extra).to(tl.int32)) * BLOCK_N, kv_len)

    # e4m3 decode tiles (one query, 16 rows) run keys as the MMA rows: S^T = K Q^T [BLOCK_N, ROWS] and
    # O^T = V^T P^T [d, ROWS] on ROWS = 8 (GROUP <= 8) or 16 query rows, not 16 rows padded from G: the
    # m16n8k16 MMA pads N to 8, where M pads to 16, so half the MMAs and the softmax of half the scores
    KEYS_AS_ROWS: tl.constexpr = FP8_F16QK and not CHUNK and BLOCK_M == 16 and GROUP <= 16  # one row tile
    ROWS: tl.constexpr = 8 if GROUP <= 8 else 16
    # a paged split's entries checked once before its loop (keys as rows always; else PAGE_PRECHECK): rows
    # clamped, loads unmasked. Else each key's entry is range-checked and K/V loads are masked by n_mask
    PRECHECKED: tl.constexpr = PAGED and (KEYS_AS_ROWS or PAGE_PRECHECK)
    MASKED: tl.constexpr = PAGED and not PRECHECKED
    if KEYS_AS_ROWS:
        offs_r = tl.arange(0, ROWS)  # the GROUP query heads of the one query, then pad rows (0)
        r_heads = h_kv * GROUP + offs_r % GROUP
        q = tl.load(Q + b * stride_qb + r_heads[:, None] * stride_qh + offs_d[None, :],
                    mask=(offs_r < GROUP)[:, None] & d_row if ODD else (offs_r < GROUP)[:, None],
                    other=0.0)  # [ROWS, d]
    else:
        q = tl.load(Q + b * stride_qb + q_heads[:, None] * stride_qh + qi[:, None] * stride_qn
                    + offs_d[None, :], mask=m_mask[:, None] & d_row if ODD else m_mask[:, None],
                    other=0.0)  # [BLOCK_M, d]; pad rows 0
    if not USE_DOT:
        q = q.to(tl.float32)
        if not MAX_UNSCALED:
            q = q * qk_scale  # exact enough: one fp32 rounding per element
    if FP8_F16QK:  # K and V then convert in one instruction per two elements (`_e4m3_to_f16_opaque`)
        if Q.dtype.element_ty == tl.bfloat16:
            q, row_mul = _rows_to_f16(q)
        else:
            row_mul = tl.full([q.shape[0]], 1.0, tl.float32)
        s_mul = row_mul if MAX_UNSCALED else row_mul * qk_scale  # [BLOCK_M] (KEYS_AS_ROWS: [ROWS])
    # KEYS_AS_ROWS without softcap or raw maxima: s_mul > 0 multiplies the raw scores' max and folds into
    # the exponent (one FFMA per score); kept normal, so a masked score (-inf) times it stays -inf
    FOLD: tl.constexpr = KEYS_AS_ROWS and not SOFTCAP and not MAX_UNSCALED
    if FOLD:
        s_mul = tl.maximum(s_mul, 1.1754943508222875e-38)  # FLT_MIN
    if PAGED:
        k_base = K + h_kv * stride_kh
        v_base = V + h_kv * stride_vh
        bt_base = BT + b * stride_tb
    else:
        k_base = K + b * stride_kb + h_kv * stride_kh
        v_base = V + b * stride_vb + h_kv * stride_vh
    if PRECHECKED:
        hi = _checked_split_end(bt_base, lo, hi, num_pages, ERR, PAGE_SIZE)
    if FP8_WORDS:  # the plan checked: V's address and strides are multiples of 4 bytes
        vw_base = V.to(tl.pointer_type(tl.int32)) + (h_kv * stride_vh) // 4
        if not PAGED:
            vw_base += (b * stride_vb) // 4
        offs_w = tl.arange(0, HEAD_DIM // 4)

    # m_i: running max of base-2 (MAX_UNSCALED: raw) scores; l_i: running sum of exp2(s - m_i); acc: running
    # unnormalised sum of p @ V
    if KEYS_AS_ROWS:  # l_i per key slot [BLOCK_N, ROWS], summed after the loop (no reduction per block)
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_N, ROWS], tl.float32)
        acc = tl.zeros([HEAD_DIM, ROWS], tl.float32)  # O^T
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    bad_page = tl.zeros([BLOCK_N], tl.int1)  # keys whose block-table entry was out of range
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):  # STAGES: K/V tiles in flight
        rows = start_n + offs_n  # [BLOCK_N] key positions
        n_mask = rows < hi
        if PRECHECKED:
            # the entries were checked before the loop: rows past the range load the last key in it, as
            # the dense loop does, so the copies need no per-row predicate
            rows_c = tl.minimum(rows, hi - 1)
            if BLOCK_N <= PAGE_SIZE:  # inside one page (BLOCK_N divides PAGE_SIZE): one index
                page = tl.load(bt_base + start_n // PAGE_SIZE)  # scalar
            else:  # several pages per block: each row reads its page's entry (cached loads)
                page = tl.load(bt_base + rows_c // PAGE_SIZE)  # [BLOCK_N]
            slot = rows_c & (PAGE_SIZE - 1)  # [BLOCK_N] rows of the pages (rows_c >= 0: one AND)
            if not OFF32:
                page, slot = page.to(tl.int64), slot.to(tl.int64)
            k_off = page * stride_kb + slot * stride_kn
            v_off = page * stride_vb + slot * stride_vn
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :], mask=d_row if ODD else None,
                        other=0.0 if ODD else None)
        elif PAGED:
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
            out_of_range = (page < 0) | (page >= num_pages)  # such an entry is never dereferenced
            bad_page = bad_page | (n_mask & out_of_range)
            n_mask = n_mask & (page >= 0) & (page < num_pages)
            page = tl.where(out_of_range, 0, page)
            if not OFF32:
                page, slot = page.to(tl.int64), slot.to(tl.int64)
            k_off = page * stride_kb + slot * stride_kn
            v_off = page * stride_vb + slot * stride_vn
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :],
                        mask=n_mask[:, None] & d_row if ODD else n_mask[:, None], other=0.0)
        else:
            # Dense: rows past the range load the last key in it instead of a masked load. Every load is
            # a real key (finite V, so P = 0 there adds exactly 0) and the copies need no per-row
            # predicate. Paged tiles but prechecked ones (`PRECHECKED`) keep masked loads.
            rows_c = tl.minimum(rows, hi - 1)
            key = rows_c if OFF32 else rows_c.to(tl.int64)
            k_off = key * stride_kn
            v_off = key * stride_vn
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :], mask=d_row if ODD else None,
                        other=0.0 if ODD else None)
        if KEYS_AS_ROWS:
            # K is the row-major A operand of S^T: Triton converts it after loading the e4m3 bytes in the
            # MMA operand layout (ldmatrix), no fp16 round trip through shared memory; exact
            k = k.to(tl.float16)
        elif FP8_F16QK:
            k = _e4m3_to_f16_opaque(k, FP8_ASM)  # exact; k_scale is in s_mul
        elif FP8:
            k = _e4m3_to(k, Q.dtype.element_ty)  # exact; k_scale is in qk_scale
        if FOLD:
            s = tl.dot(k, tl.trans(q))  # [BLOCK_N, ROWS]: raw S^T (s_mul below)
        elif KEYS_AS_ROWS:
            s = tl.dot(k, tl.trans(q)) * s_mul[None, :]  # [BLOCK_N, ROWS]: S^T, q's rows scaled back
        elif FP8_F16QK:
            s = tl.dot(q, tl.trans(k)) * s_mul[:, None]  # [BLOCK_M, BLOCK_N]: q's rows scaled back
        elif USE_DOT:
            kt = tl.trans(k)  # [d, BLOCK_N]
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32)) if EMULATE_BF16 else tl.dot(q, kt)
            if not MAX_UNSCALED:
                s = s * qk_scale  # [BLOCK_M, BLOCK_N], base-2 scaled scores, fp32
        else:
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [BLOCK_M, BLOCK_N]
        if SOFTCAP:  # s' = softcap * tanh(s * scale / softcap), in base 2 (softcap2 = softcap * log2 e)
            s = softcap2 * tanh_(s / softcap2)
        seen = (n_mask & (rows >= start)) if HAS_STARTS else n_mask  # keys of the sequence in range
        if KEYS_AS_ROWS:  # one query: a key is visible to every row or to none
            visible = (seen & (rows >= lim - 1 - win_left))[:, None] if WINDOW else seen[:, None]
        elif CHUNK:
            visible = seen[None, :] & (rows[None, :] < lim[:, None])
            if WINDOW:
                visible = visible & (rows[None, :] >= (lim - 1 - win_left)[:, None])
        elif WINDOW:
            visible = seen[None, :] & (rows[None, :] >= lim - 1 - win_left)
        else:
            visible = seen[None, :]
        s = tl.where(visible, s, float("-inf"))
        if KEYS_AS_ROWS:  # the same online softmax over axis 0 of S^T
            # FOLD: max(s) * s_mul = max(s * s_mul), rounding is monotone and s_mul > 0
            m_new = tl.maximum(m_i, tl.max(s, 0) * s_mul if FOLD else tl.max(s, 0))  # [ROWS]
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            if MAX_UNSCALED:
                alpha = tl.exp2((m_i - m_safe) * qk_scale)
                p = tl.exp2((s - m_safe[None, :]) * qk_scale)
            elif FOLD:
                alpha = tl.exp2(m_i - m_safe)
                p = tl.exp2(s * s_mul[None, :] - m_safe[None, :])  # [BLOCK_N, ROWS]
            else:
                alpha = tl.exp2(m_i - m_safe)
                p = tl.exp2(s - m_safe[None, :])
            l_i = l_i * alpha[None, :] + p
        else:
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
        if FP8_WORDS:  # V as int32 words of four e4m3 (`_e4m3_words_to_f16`)
            if MASKED:
                w = tl.load(vw_base + (v_off // 4)[:, None] + offs_w[None, :], mask=n_mask[:, None], other=0)
            else:
                w = tl.load(vw_base + (v_off // 4)[:, None] + offs_w[None, :])
            v = _e4m3_words_to_f16(w, FP8_ASM)
        else:
            if MASKED:
                v = tl.load(v_base + v_off[:, None] + offs_d[None, :],
                            mask=n_mask[:, None] & d_row if ODD else n_mask[:, None], other=0.0)
            else:
                v = tl.load(v_base + v_off[:, None] + offs_d[None, :], mask=d_row if ODD else None,
                            other=0.0 if ODD else None)
            if FP8_F16QK:
                v = _e4m3_to_f16_opaque(v, FP8_ASM)
            elif FP8:
                v = v.to(tl.float16)
        if KEYS_AS_ROWS:
            acc = tl.dot(tl.trans(v), p.to(tl.float16), acc * alpha[None, :])  # O^T [d, ROWS]
        elif USE_DOT:
            if EMULATE_BF16 and not FP8:  # P rounded to nearest even (the interpreter's cast truncates)
                p, v = round_bf16(p), v.to(tl.float32)  # fp32 products
            # P in the input dtype, as FlashAttention; an e4m3 V is exact in fp16, and P in [0, 1] is
            # closer in fp16 than in bf16: P @ V in fp16 whatever q's dtype (the one-instruction convert)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m_i = m_new
    if MASKED:  # noqa: SIM102 - a constexpr branch around a runtime one
        if tl.max(bad_page.to(tl.int32), 0) != 0:
            tl.atomic_or(ERR, ERR_BLOCK_TABLE)
    if FP8 and not MAX_UNSCALED:  # noqa: SIM102 - a score past fp32 (k_scale too large for q, K): NaN rows
        if tl.max(m_i, 0) == float("inf"):
            tl.atomic_or(ERR, ERR_SCALES)

    if KEYS_AS_ROWS:  # back to [BLOCK_M] rows: rows ROWS.. repeat rows 0.. (pad rows, never stored)
        l_i = tl.sum(l_i, 0)  # [ROWS]
        acc = tl.trans(acc)  # [ROWS, d]
        if ROWS < BLOCK_M:
            acc = tl.reshape(tl.permute(tl.join(acc, acc), (2, 0, 1)), (BLOCK_M, HEAD_DIM))
            m_i = tl.reshape(tl.permute(tl.join(m_i, m_i), (1, 0)), (BLOCK_M,))
            l_i = tl.reshape(tl.permute(tl.join(l_i, l_i), (1, 0)), (BLOCK_M,))
    if FP8:
        acc = acc * v_sc
    if MAX_UNSCALED:
        m_i = m_i * qk_scale  # base 2 for the LSE: +inf past fp32, where the true LSE is too
    n_q_heads = n_kv_heads * GROUP
    if HAS_SINKS and not SPLIT:  # one split: the sink joins here, once
        sink2 = sink_log2(tl.load(SINKS + q_heads, mask=m_mask, other=0.0))
        m_i, l_i, acc = _add_sink(m_i, l_i, acc, sink2)
    o, lse2 = lse_merge_finish(m_i, l_i, acc)  # [BLOCK_M, d], [BLOCK_M] base 2; 0, -inf: no key
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
                heads_m = h_kv * GROUP + offs_mm % GROUP
                rows_m = (b * n_q_heads + heads_m) * n_q + offs_mm // GROUP
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
                if HAS_SINKS:  # the sink joins the merged splits once
                    sink2 = sink_log2(tl.load(SINKS + heads_m, mask=mm_mask, other=0.0))
                    mm, ll, aa = _add_sink(mm, ll, aa, sink2)
                o_f, lse_f = lse_merge_finish(mm, ll, aa)  # [MERGE_M, d], [MERGE_M] base 2
                if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
                    o_f = round_bf16(o_f)
                tl.store(O + rows_m[:, None] * DIM + offs_d[None, :], o_f.to(O.dtype.element_ty),
                         mask=mm_mask[:, None] & d_row if ODD else mm_mask[:, None])
                if WRITE_LSE:
                    tl.store(LSE + rows_m, lse_f * LN2, mask=mm_mask)  # natural log
                tl.atomic_xchg(SEM + pid, 0)  # ready for the next launch
    else:
        if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
            o = round_bf16(o)
        tl.store(O + out_rows[:, None] * DIM + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=m_mask[:, None] & d_row if ODD else m_mask[:, None])
        if WRITE_LSE:
            tl.store(LSE + out_rows, lse2 * LN2, mask=m_mask)  # natural log


@triton.jit
def _attnscope_decode_combine_kernel(
    O_PART, LSE_PART, O, LSE, SINKS,
    num_splits, n_q, n_q_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,  # splits merged per iteration
    EMULATE_BF16: tl.constexpr,
    HAS_SINKS: tl.constexpr = False,
    D: tl.constexpr = 0,  # the head dim when below its power-of-two tile HEAD_DIM (0: HEAD_DIM itself)
):
    # O_PART [R, S, HEAD_DIM], LSE_PART [R, S] (base 2), O [R, d], LSE [R] (natural log), all contiguous
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
    if HAS_SINKS:  # the sink joins the merged splits once: the partial (O = 0, LSE = sink)
        sink2 = sink_log2(tl.load(SINKS + (row // n_q) % n_q_heads))
        m_new = tl.maximum(m_i, sink2)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.exp2(sink2 - m_new)
        acc = acc * alpha
        m_i = m_new

    o, lse2 = lse_merge_finish(m_i, l_i, acc)  # [d], base-2 scalar; 0, -inf when every split is empty
    if EMULATE_BF16:  # round to nearest even first: the interpreter's cast truncates
        o = round_bf16(o)
    if D == 0 or D == HEAD_DIM:
        tl.store(O + row * HEAD_DIM + offs_d, o.to(O.dtype.element_ty))
    else:
        tl.store(O + row * D + offs_d, o.to(O.dtype.element_ty), mask=offs_d < D)
    tl.store(LSE + row, lse2 * LN2)  # natural log


def _emulate_bf16(dtype) -> bool:
    """bf16 under Triton 3.6's interpreter, whose bf16 ``tl.dot`` and casts are wrong: the kernels multiply
    in fp32 and round with `round_bf16` before each cast (see kernels/_tl.py); never on a GPU."""
    return interpreting() and dtype == torch.bfloat16
