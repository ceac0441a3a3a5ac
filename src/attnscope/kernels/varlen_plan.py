"""What the packed variable-length forward (kernels/varlen.py) and backward (kernels/varlen_bwd.py) share:
the input checks, the device-side sanitising of cu_seqlens and its error word and the work lists of
(sequence, tile) items (`plan`: one Triton program per list, no host sync), the kernel arguments of the
score mods."""

from __future__ import annotations

import math

from attnscope.errors import InputError, expect, is_int
from attnscope.kernels._common import (
    LOG2E,
    check_device,
    check_head_dim,
    check_mods,
    check_same,
    check_scale,
    check_softcap,
    check_tensor,
    device_error_flag,
    import_torch_triton,
)

torch, triton = import_torch_triton()
import triton.language as tl  # noqa: E402

from attnscope.kernels.bwd import WINDOW_UNBOUNDED  # noqa: E402


def _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale):
    check_scale(scale)
    check_tensor(torch, "q", q, 3, "[total_q, Hq, d]")
    check_tensor(torch, "k", k, 3, "[total_k, Hkv, d]")
    check_tensor(torch, "v", v, 3, "[total_k, Hkv, d]")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise InputError(f"{name}: expected an int32 torch.Tensor [B + 1], got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise InputError(f"{name}: expected dtype torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise InputError(f"{name}: expected a 1-d tensor [B + 1] with B >= 1, "
                             f"got shape {tuple(cu.shape)}")
        if cu.stride(0) != 1:  # the kernel reads cu[s] at offset s
            raise InputError(f"{name}: expected a contiguous tensor, got stride {cu.stride(0)}")
    check_device({"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k})
    check_same("cu_seqlens_k", "length (B + 1, as cu_seqlens_q)", cu_seqlens_q.shape[0],
               cu_seqlens_k.shape[0])
    total_q, Hq, d = q.shape
    total_k, Hkv = k.shape[0], k.shape[1]
    check_same("k", "head_dim", d, k.shape[2])
    check_same("k", "dtype (as q)", q.dtype, k.dtype)
    check_same("v", "dtype (as q)", q.dtype, v.dtype)
    check_same("v", "shape (as k)", tuple(k.shape), tuple(v.shape))
    if Hq == 0 or Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"q: expected the number of query heads ({Hq}) to be a positive multiple of the "
                         f"kv heads ({Hkv})")
    check_head_dim(d, padded=True)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not (is_int(value) and value >= 0):
            raise InputError(f"{name}: expected a non-negative int, got {value!r}")
        expect(value <= 2**31 - 1, name, "at most 2**31 - 1 (int32 on the device)", value)
    return total_q, Hq, d, total_k, Hkv


def _check_seqlens(cu, name: str, total: int, max_seqlen: int, max_name: str) -> None:
    """The value checks of one cu_seqlens: one device -> host copy of the whole array (a sync)."""
    vals = cu.tolist()
    if vals[0] != 0:
        raise InputError(f"{name}: expected cu_seqlens[0] == 0, got {vals[0]}")
    lens = [b - a for a, b in zip(vals[:-1], vals[1:], strict=True)]
    bad = next((i for i, n in enumerate(lens) if n < 0), None)
    if bad is not None:
        raise InputError(f"{name}: expected non-decreasing values, got {vals[bad]} then {vals[bad + 1]} "
                         f"at index {bad}")
    if vals[-1] != total:
        raise InputError(f"{name}: expected the last value to equal the packed length {total}, "
                         f"got {vals[-1]}")
    if max(lens) > max_seqlen:
        raise InputError(f"{max_name}: expected >= the longest sequence ({max(lens)}), got {max_seqlen}")


#: Bits of the device error word (`_common.device_error_flag(..., "varlen")`), one per argument.
ERROR_BITS = {
    1: "cu_seqlens_q: expected int32 values from 0 to total_q, non-decreasing, the first 0 and the last "
       "total_q (q.shape[0]), got others",
    2: "cu_seqlens_k: expected int32 values from 0 to total_k, non-decreasing, the first 0 and the last "
       "total_k (k.shape[0]), got others",
    4: "max_seqlen_q: expected >= the longest query sequence, got a smaller value",
    8: "max_seqlen_k: expected >= the longest key sequence, got a smaller value",
}


def _sanitize(cu, total: int, max_seqlen: int, flag, bit_cu: int, bit_max: int):
    """On the device, no host sync: ``cummax(clamp(cu, 0, total))`` with its ends forced to 0 and
    ``total``, so the sequences always partition ``[0, total)`` (a decreasing pair becomes an empty
    sequence, an out-of-range value is clamped): every row is read and written once, inside the tensors,
    whatever ``cu`` holds. Where ``cu`` differs from it, or a length exceeds ``max_seqlen``, the bit is
    ORed into ``flag`` (raised by `check_errors`). The torch form of `_attnscope_varlen_plan_kernel`'s
    sanitising (used for batches of more than `PLAN_MAX_B` sequences, and by the tests as its reference)."""
    fixed = torch.cummax(cu.clamp(0, total), 0).values
    fixed[:1].zero_()  # fill_ of a slice: no host-to-device copy of a Python scalar (a sync)
    fixed[-1:].fill_(total)
    lens = fixed[1:] - fixed[:-1]
    bad = (cu != fixed).any().to(torch.int32) * bit_cu + (lens > max_seqlen).any().to(torch.int32) * bit_max
    flag.bitwise_or_(bad)
    return fixed


def _work_items(cu_q, cu_k, n_items: int, block_m: int, causal: bool, kv_tiles: bool = False):
    """(sequence, tile) work items, padded with sequence -1 to ``n_items``; on the device, no host sync.
    The torch form of `_attnscope_varlen_plan_kernel`'s list (the same order; used above `PLAN_MAX_B`
    sequences and by the tests as its reference).

    Order: sequence-major, the sequences by their heaviest tile (the K/V rows a query tile loads:
    ``Nk_s``; with ``kv_tiles``, the query rows that see a K/V tile: ``Nq_s``) descending, ties by index;
    within a sequence its tiles heaviest first (causal query tiles last to first, K/V tiles first to last).
    So the programs running at once share one sequence's K/V in L2, and the list ends with the lightest
    tiles of the shortest sequences. Tiles are of ``block_m`` query rows (or, with ``kv_tiles``, keys)."""
    nq = (cu_q[1:] - cu_q[:-1]).long()  # [B]
    nk = (cu_k[1:] - cu_k[:-1]).long()
    B = nq.shape[0]
    tiles = ((nk if kv_tiles else nq) + block_m - 1) // block_m  # [B] tiles per sequence
    weight = nq if kv_tiles else nk
    key = weight * (1 << 32) + (B - 1 - torch.arange(B, device=cu_q.device))
    order = torch.argsort(key, descending=True)  # keys are distinct: ties broken by the index
    ends = torch.cumsum(tiles[order], 0)  # [B] exclusive end of each sorted sequence's items
    w = torch.arange(n_items, device=cu_q.device)
    j = torch.searchsorted(ends, w, right=True).clamp_(max=B - 1)  # [W] position in the sorted order
    valid = w < ends[-1]
    t = w - (ends[j] - tiles[order][j])
    if causal and not kv_tiles:
        t = tiles[order][j] - 1 - t  # the last query tile loads the most keys
    seq = torch.where(valid, order[j], -1).to(torch.int32)
    tile = torch.where(valid, t, 0).to(torch.int32)
    return seq, tile


#: The most sequences `_attnscope_varlen_plan_kernel` (one program) takes; larger batches run the torch forms
#: above.
PLAN_MAX_B = 4096


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _fix_cu(CU, i, B, TOTAL, MAX_SEQLEN):
    """`_sanitize` on a block ``i`` of indices: (fixed cu[i], fixed cu[i + 1], bad-values flag, too-long
    flag); lanes ``i > B`` are padding."""
    raw = tl.load(CU + i, mask=i <= B, other=0)
    a = tl.minimum(tl.maximum(raw, 0), TOTAL)
    fixed = tl.associative_scan(a, 0, _max_combine)  # padding lanes (0) come after B: no effect
    fixed = tl.where(i == 0, 0, tl.where(i == B, TOTAL, fixed))
    a0 = tl.max(tl.where(i == 0, a, 0), 0)  # clamp(cu[0])
    nxt = tl.minimum(tl.maximum(tl.load(CU + i + 1, mask=i + 1 <= B, other=0), 0), TOTAL)
    nxt = tl.maximum(tl.associative_scan(nxt, 0, _max_combine), a0)  # cummax(clamp(cu))[i + 1]
    nxt = tl.where(i + 1 == B, TOTAL, nxt)
    bad = tl.max(((raw != fixed) & (i <= B)).to(tl.int32), 0)
    too_long = tl.max(((nxt - fixed > MAX_SEQLEN) & (i < B)).to(tl.int32), 0)
    return fixed, nxt, bad, too_long


@triton.jit
def _attnscope_varlen_plan_kernel(CU_Q, CU_K, FIX_Q, FIX_K, FLAG, ORDER, ENDS, WORK_SEQ, WORK_TILE,
                 B, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, N_ITEMS, TILE,
                 CAUSAL: tl.constexpr, KV_TILES: tl.constexpr, BLOCK_B: tl.constexpr, LOG_B: tl.constexpr,
                 BLOCK_W: tl.constexpr):
    """One program: `_sanitize` of both cu_seqlens into FIX_Q / FIX_K (error bits ORed into FLAG), then
    `_work_items`' list into WORK_SEQ / WORK_TILE (ORDER, ENDS: [B] scratch). One launch instead of a
    few dozen torch ops."""
    i = tl.arange(0, BLOCK_B)
    fq, fq1, bad_q, long_q = _fix_cu(CU_Q, i, B, TOTAL_Q, MAX_Q)
    fk, fk1, bad_k, long_k = _fix_cu(CU_K, i, B, TOTAL_K, MAX_K)
    tl.store(FIX_Q + i, fq, mask=i <= B)
    tl.store(FIX_K + i, fk, mask=i <= B)
    bits = bad_q * 1 + bad_k * 2 + long_q * 4 + long_k * 8  # `ERROR_BITS`
    if bits != 0:
        tl.atomic_or(FLAG, bits)
    nq = fq1 - fq
    nk = fk1 - fk
    weight = nq if KV_TILES else nk
    weight = tl.where(i < B, weight, -1).to(tl.int64)
    key = weight * 4294967296 + (B - 1 - i)  # descending weight, ties by ascending index; padding last
    key = tl.sort(key, 0, descending=True)
    order = (B - 1 - (key & 4294967295)).to(tl.int32)  # [BLOCK_B] sequence ids in list order
    order_ok = i < B
    order = tl.where(order_ok, order, 0)
    tl.store(ORDER + i, order, mask=order_ok)
    tl.debug_barrier()  # FIX_* visible to every thread of the program
    FIX_OWN = FIX_K if KV_TILES else FIX_Q  # the rows the tiles cut: keys or queries
    n_own = (tl.load(FIX_OWN + order + 1, mask=order_ok, other=0)
             - tl.load(FIX_OWN + order, mask=order_ok, other=0))
    ends = tl.cumsum((n_own + TILE - 1) // TILE, 0)
    tl.store(ENDS + i, ends, mask=order_ok)
    tl.debug_barrier()
    for w0 in range(0, N_ITEMS, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        lo = tl.zeros([BLOCK_W], tl.int32)
        hi = tl.zeros([BLOCK_W], tl.int32) + B
        for _ in tl.static_range(LOG_B):  # lo = the first sorted position whose items end after w
            mid = (lo + hi) // 2
            e = tl.load(ENDS + mid, mask=lo < hi, other=0)
            right = (lo < hi) & (e <= w)
            hi = tl.where((lo < hi) & (e > w), mid, hi)
            lo = tl.where(right, mid + 1, lo)
        valid = lo < B
        j = tl.minimum(lo, B - 1)
        end = tl.load(ENDS + j)
        start = tl.load(ENDS + j - 1, mask=j > 0, other=0)
        t = w - start
        if CAUSAL and not KV_TILES:
            t = end - start - 1 - t  # the last query tile loads the most keys
        seq = tl.load(ORDER + j)
        tl.store(WORK_SEQ + w, tl.where(valid, seq, -1), mask=w < N_ITEMS)
        tl.store(WORK_TILE + w, tl.where(valid, t, 0), mask=w < N_ITEMS)


def plan(cu_seqlens_q, cu_seqlens_k, dims, max_seqlen_q: int, max_seqlen_k: int, lists,
         sanitize: bool = True):
    """The sanitised cu_seqlens and the work lists of one launch, on the device, without a host sync:
    ``(cu_q, cu_k, [(seq, tile), ...])``, one pair per ``(n_items, tile, causal, kv_tiles)`` of ``lists``.
    Up to `PLAN_MAX_B` sequences one `_attnscope_varlen_plan_kernel` launch per list (each also sanitises,
    the same values); above, the torch forms `_sanitize` and `_work_items`. ``sanitize=False``: the values
    were checked on the host, used as given."""
    total_q, _, _, total_k, _ = dims
    B = cu_seqlens_q.shape[0] - 1
    dev = cu_seqlens_q.device
    flag = device_error_flag(torch, dev, "varlen")
    if B + 1 > PLAN_MAX_B:
        if sanitize:
            cu_q = _sanitize(cu_seqlens_q, total_q, max_seqlen_q, flag, 1, 4)
            cu_k = _sanitize(cu_seqlens_k, total_k, max_seqlen_k, flag, 2, 8)
        else:
            cu_q, cu_k = cu_seqlens_q, cu_seqlens_k
        return cu_q, cu_k, [_work_items(cu_q, cu_k, n, t, c, kv) for n, t, c, kv in lists]
    block_b = max(16, triton.next_power_of_2(B + 1))
    n_all = sum(n for n, *_ in lists)
    buf = torch.empty(2 * (B + 1) + 2 * B + 2 * n_all, dtype=torch.int32, device=dev)
    fix_q, fix_k = buf[:B + 1], buf[B + 1:2 * B + 2]
    order, ends = buf[2 * B + 2:3 * B + 2], buf[3 * B + 2:4 * B + 2]
    out, at = [], 4 * B + 2
    warps = max(4, min(16, block_b // 256))  # the sort's block: 32 keys per thread at most
    for n, tile, causal, kv_tiles in lists:
        seq, til = buf[at:at + n], buf[at + n_all:at + n_all + n]
        at += n
        # each launch sanitises the given arrays again (the same values; the same bits ORed, idempotent)
        _attnscope_varlen_plan_kernel[(1,)](
            cu_seqlens_q, cu_seqlens_k, fix_q, fix_k, flag, order, ends, seq, til, B, total_q, total_k,
            max_seqlen_q, max_seqlen_k, n, tile, CAUSAL=bool(causal), KV_TILES=bool(kv_tiles),
            BLOCK_B=block_b, LOG_B=block_b.bit_length(), BLOCK_W=1024, num_warps=warps)
        out.append((seq, til))
    if not sanitize:
        return cu_seqlens_q, cu_seqlens_k, out
    return fix_q, fix_k, out


def prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softcap, sinks,
            scale, check_seqlens):
    """The host checks every varlen launch (forward and backward) makes: shapes, mods (`check_mods`), and,
    with ``check_seqlens``, the cu_seqlens values (a sync; else `plan` sanitises them on the device and
    sets the error word). Returns ``(dims, mods, sm_scale)``."""
    dims = _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale)
    total_q, Hq, d, total_k, Hkv = dims
    mods = check_mods(torch, causal, window, softcap, sinks, Hq, q.device)
    if check_seqlens:
        _check_seqlens(cu_seqlens_q, "cu_seqlens_q", total_q, max_seqlen_q, "max_seqlen_q")
        _check_seqlens(cu_seqlens_k, "cu_seqlens_k", total_k, max_seqlen_k, "max_seqlen_k")
    sm_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    if mods.softcap:
        check_softcap(mods.softcap, sm_scale)
    return dims, mods, sm_scale


def mod_args(mods, sm_scale: float, causal: bool, bounds=None) -> dict:
    """Kernel arguments of the score mods: runtime window bounds (-1 -> `WINDOW_UNBOUNDED`) and softcap
    scalars, and their constexprs (plain causal without a window keeps the CAUSAL path; mods off compile to
    the plain kernel). ``bounds``: signed (left, right) of `bwd.window_keep` instead of the window's (the
    ring's blocks, whose band need not hold the diagonal)."""
    cap = mods.softcap
    windowed = mods.windowed or bounds is not None
    left, right = bounds if bounds is not None else (
        WINDOW_UNBOUNDED if x < 0 else x for x in (mods.left, mods.right))
    return dict(left=left, right=right, sc_in=sm_scale / cap if cap else 0.0,
                sc_out=cap * LOG2E, WINDOW=windowed, SOFTCAP=cap > 0,
                CAUSAL=bool(causal) and not windowed)
