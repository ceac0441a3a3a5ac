"""@triton.jit helpers shared by the prefill (dense, varlen), backward and decode kernels: the causal
and sliding-window KV-tile bounds (`_kv_bounds`, `_kv_bounds_window`: the twins of model/tiles.py), one
online-softmax step of a score tile (`softmax_tile`, the dense and varlen forward tiles; optional
softcap through `tanh_`), the one logsumexp merge of partial results (`lse_merge_step` /
`lse_merge_finish`; float64 spec: `attnscope.reference.combine`), and `round_bf16`.

Triton 3.6's CPU interpreter computes bf16 `tl.dot` wrongly and truncates fp32 -> bf16 casts
(triton-lang/triton#11584), so under the interpreter with bf16 inputs the kernels multiply in fp32 and
round with `round_bf16` before casting, which reproduces the GPU. On a GPU that path is never compiled.
"""

from attnscope.kernels._common import LOG2E, check_softcap, import_torch_triton, interpreting

_, triton = import_torch_triton()  # ImportError names the install command when the extra is missing
import triton.language as tl  # noqa: E402


@triton.jit
def round_bf16(x):
    """fp32 -> fp32 rounded to the nearest bf16 (ties to even), so a following cast is exact."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


def window_args(left: int, right: int, nq: int, nk: int) -> tuple[int, int]:
    """The kernels' ``(LEFT, RIGHT)`` of a window (`_common.Mods`, -1 = unbounded): an unbounded side becomes
    ``nq + nk``, which no (row, key) pair reaches, so the in-kernel bounds and masks need no -1 case."""
    return (left if left >= 0 else nq + nk), (right if right >= 0 else nq + nk)


def mod_args(mods, sm_scale: float, nq: int, nk: int) -> dict:
    """The kernels' mod arguments of one call (`_common.Mods`): ``LEFT``/``RIGHT`` (`_tl.window_args`),
    ``qk_scale`` (``softcap * log2(e)`` under softcap, else ``scale * log2(e)``), ``cap_in`` (``scale /
    softcap``) and the constexprs ``WINDOW`` and ``SOFTCAP``; all off is the plain kernel."""
    left, right = window_args(mods.left, mods.right, nq, nk)
    if mods.softcap > 0:
        check_softcap(mods.softcap, sm_scale)
        return dict(LEFT=left, RIGHT=right, qk_scale=mods.softcap * LOG2E, cap_in=sm_scale / mods.softcap,
                    WINDOW=mods.windowed, SOFTCAP=True)
    return dict(LEFT=left, RIGHT=right, qk_scale=sm_scale * LOG2E, cap_in=1.0, WINDOW=mods.windowed,
                SOFTCAP=False)


@triton.jit
def _tanh_exp2(x):
    """tanh in fp32 from one exp2 (no overflow: ``t = exp2(-2|x| log2 e)`` is in (0, 1]); below |x| = 1/16,
    where ``1 - t`` cancels (a huge softcap makes every x tiny), the series x (1 - x^2/3 + 2 x^4/15),
    relative error < 4e-9 there."""
    t = tl.math.exp2(tl.abs(x) * -2.8853900817779268)
    y = (1.0 - t) / (1.0 + t)
    y = tl.where(x < 0, -y, y)
    x2 = x * x
    series = x * (1.0 - x2 * (0.3333333333333333 - x2 * 0.13333333333333333))
    return tl.where(x2 < 0.00390625, series, y)


@triton.jit
def _tanh_approx(x):
    """tanh in fp32 by ``tanh.approx.f32``: one MUFU op (relative error about 2^-11, below an fp16/bf16
    score's own rounding) where `_tanh_exp2` takes two (ex2, rcp), the softmax's exp2 being a third. A tiny
    (subnormal) x the hardware may flush to 0 gives x itself, which is then tanh(x) exactly."""
    t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                  pack=1)
    return tl.where(t == 0.0, x, t)


#: The kernels' tanh (softcap): the hardware's on a GPU; the CPU interpreter runs no PTX, so there the
#: exp2 form (the float64 tests check both against the same bound, the GPU one in tests marked gpu).
tanh_ = _tanh_exp2 if interpreting() else _tanh_approx


@triton.jit
def softmax_tile(s, keep, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr, MAX_UNSCALED: tl.constexpr,
                 SOFTCAP: tl.constexpr = False, cap_in=1.0):
    """One tile of the online softmax (spec §3.1, FA-2 unnormalised form) on raw scores ``s`` [M, N]:
    returns (p, m_new, l_i, acc) with ``acc`` rescaled onto the new max (P V is the caller's). ``MASKED``:
    scores where ``keep`` is False become -inf BEFORE the running max (spec §2.1), and a row with no key
    yet shifts by 0 (exp2(-inf - 0) = 0, not NaN; its returned max is then 0, so a caller whose rows can
    meet masked-out tiles BEFORE their first key, as a window's, resets it to -inf where ``l_i == 0``, or
    the next tile's max is floored at 0 and small scores underflow). The running max is in log2 units
    (scores x ``qk_scale``), except with ``MAX_UNSCALED`` (``qk_scale > 1``): then it is of the raw
    scores and the scale multiplies the differences ``s - m <= 0``, so a huge scale gives exp2(-inf) = 0,
    never inf - inf = NaN. ``SOFTCAP``: the scores become ``tanh(s * cap_in)`` first (``cap_in = scale /
    softcap``; the caller passes ``qk_scale = softcap * log2(e)`` and ``MAX_UNSCALED`` False)."""
    if SOFTCAP:
        s = tanh_(s * cap_in)
    if MASKED:
        if not MAX_UNSCALED:
            s = s * qk_scale
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        if MAX_UNSCALED:
            p = tl.math.exp2((s - m_new[:, None]) * qk_scale)
        else:
            p = tl.math.exp2(s - m_new[:, None])
    elif MAX_UNSCALED:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2((s - m_new[:, None]) * qk_scale)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])  # one FMA per score
    alpha = tl.math.exp2((m_i - m_new) * qk_scale) if MAX_UNSCALED else tl.math.exp2(m_i - m_new)
    acc = acc * alpha[:, None]
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, m_new, l_i, acc


@triton.jit
def _kv_bounds(start_m, NQ, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """KV columns of query tile ``start_m`` (0-based): ``[0, lo)`` run unmasked, ``[lo, hi)`` masked,
    ``[hi, Nk)`` skipped: `model.tiles.causal_kv_bounds0`, except that the ragged last tile is always
    masked (it needs a bounds check even when fully permitted)."""
    hi = NK
    full = NK
    if CAUSAL:  # rows (1-based) plus the diagonal offset Nk - Nq, clamped at 0
        r_first = tl.maximum(start_m * BLOCK_M + 1 + (NK - NQ), 0)
        r_last = tl.maximum(tl.minimum(start_m * BLOCK_M + BLOCK_M, NQ) + (NK - NQ), 0)
        hi = tl.minimum(tl.cdiv(r_last, BLOCK_N) * BLOCK_N, NK)  # skip bound: tiles past it never load
        full = (r_first // BLOCK_N) * BLOCK_N  # tiles every row of the query tile sees whole
    lo = (NK // BLOCK_N) * BLOCK_N  # the ragged last tile always goes to the masked stage
    if full < lo:
        lo = full
    return lo, hi


@triton.jit
def _window_bounds(row0, NQ, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, left, right):
    """`model.tiles.window_kv_bounds0` in-kernel (the one in-kernel copy) for the rows ``[row0, min(row0 +
    BLOCK_M, NQ))`` and the signed bounds ``(left, right)`` of `bwd.window_keep` (an open side: any value
    past every offset, `_tl.window_args` / `bwd.WINDOW_UNBOUNDED`):
    ``(lo, full_lo, full_hi, hi)``, keys ``[lo, hi)`` loaded, ``[full_lo, full_hi)`` visible to every row.
    With the roles swapped (rows <-> keys, NQ <-> NK, left <-> right) it gives the query rows that see a
    KV tile (the dK/dV kernel)."""
    off = NK - NQ
    r1 = tl.minimum(row0 + BLOCK_M, NQ) - 1
    first = tl.maximum(row0 + off - left, 0)  # the first key any row sees
    last = tl.minimum(r1 + off + right, NK - 1)  # the last one
    lo = (first // BLOCK_N) * BLOCK_N  # operands >= 0: floor and truncation agree
    hi = tl.minimum(tl.cdiv(tl.maximum(last + 1, 0), BLOCK_N) * BLOCK_N, NK)
    f0 = tl.maximum(r1 + off - left, 0)  # keys every row sees: [f0, f1]
    f1 = tl.minimum(row0 + off + right, NK - 1)
    full_lo = tl.maximum(tl.cdiv(f0, BLOCK_N) * BLOCK_N, lo)
    full_hi = tl.minimum(tl.where(f1 == NK - 1, NK, (tl.maximum(f1 + 1, 0) // BLOCK_N) * BLOCK_N), hi)
    none_full = full_lo >= full_hi
    full_lo = tl.where(none_full, hi, full_lo)
    full_hi = tl.where(none_full, hi, full_hi)
    empty = first > last
    return (tl.where(empty, 0, lo), tl.where(empty, 0, full_lo), tl.where(empty, 0, full_hi),
            tl.where(empty, 0, hi))


@triton.jit
def _kv_bounds_window(start_m, NQ, NK, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """KV columns of query tile ``start_m`` (0-based) under a window (``LEFT``, ``RIGHT`` from
    `window_args`): `_window_bounds`, except that the ragged last tile is always masked
    (``full_hi <= (Nk // BLOCK_N) * BLOCK_N``)."""
    lo, full_lo, full_hi, hi = _window_bounds(start_m * BLOCK_M, NQ, NK, BLOCK_M, BLOCK_N, LEFT, RIGHT)
    full_hi = tl.minimum(full_hi, (NK // BLOCK_N) * BLOCK_N)
    none_full = full_lo >= full_hi
    return lo, tl.where(none_full, hi, full_lo), tl.where(none_full, hi, full_hi), hi


@triton.jit
def lse_merge_step(m_i, l_i, acc, lse_s, o_s, AXIS: tl.constexpr):
    """Fold partials into a merge state: the online softmax over partials, each partial's base-2 LSE the
    score and its normalised output the value row. State: ``m_i`` (max of the LSEs; -inf: none yet),
    ``l_i = sum_s exp2(lse_s - m_i)``, ``acc = sum_s exp2(lse_s - m_i) * O_s``; ``lse_s`` and ``o_s`` have
    the partials' axis inserted at AXIS. A partial with ``lse_s = -inf`` (no key, padding) weighs 0; a
    state that has seen only such partials stays (-inf, 0, 0), never NaN."""
    m_new = tl.maximum(m_i, tl.max(lse_s, AXIS))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: every weight is 0
    alpha = tl.exp2(m_i - m_safe)  # rescale of the old state
    w = tl.exp2(lse_s - tl.expand_dims(m_safe, AXIS))  # the partials' weights
    l_i = l_i * alpha + tl.sum(w, AXIS)
    acc = acc * tl.expand_dims(alpha, AXIS) + tl.sum(tl.expand_dims(w, AXIS + 1) * o_s, AXIS)
    return m_new, l_i, acc


@triton.jit
def sink_log2(sink):
    """A sink logit (natural log, fp32, as loaded) in base 2, kept finite: ``sink * log2(e)`` clamped to
    +-FP32_MAX, NaN taken as -FP32_MAX. A +inf sink then takes all the weight (O = 0), a -inf or NaN one
    none, and no softmax state meets inf - inf."""
    s2 = sink * 1.4426950408889634
    s2 = tl.where(s2 == s2, s2, -3.4028234663852886e38)  # x != x: NaN
    return tl.minimum(tl.maximum(s2, -3.4028234663852886e38), 3.4028234663852886e38)


@triton.jit
def lse_merge_finish(m_i, l_i, acc):
    """(O, base-2 LSE) of a state: ``O = acc / l``, ``LSE = m + log2 l``; no weight: O = 0, LSE = -inf."""
    empty = l_i == 0.0
    o = acc / tl.expand_dims(tl.where(empty, 1.0, l_i), -1)
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    return o, lse


__all__ = ["_kv_bounds", "_kv_bounds_window", "_window_bounds", "lse_merge_finish", "lse_merge_step",
           "round_bf16", "mod_args", "sink_log2", "softmax_tile", "tanh_", "triton", "window_args"]


@triton.jit
def cta_tile(TAIL):
    """(rank, head) of this program of a (blocks, heads) grid: `model.tiles.launch_tile` (the one definition;
    `model.tiles.launch_tail` picks ``TAIL``) with ``pid`` the program's launch position (x fastest) and the
    last ``TAIL`` heads interleaved rank by rank (1: the grid's own order). Causal, the last heads go rank by
    rank, heaviest tiles first: in the grid's order the last head's heaviest tile started when little work was
    left and ran alone at the end. Scalars only, so the Gluon kernels call it as it is."""
    blocks = tl.num_programs(0)
    pid = tl.program_id(1) * blocks + tl.program_id(0)
    lead = (tl.num_programs(1) - TAIL) * blocks
    if pid < lead:
        rank = pid % blocks
        head = pid // blocks
    else:
        rank = (pid - lead) // TAIL
        head = tl.num_programs(1) - TAIL + (pid - lead) % TAIL
    return rank, head
