"""What the packed variable-length forward (kernels/varlen.py) and backward (kernels/varlen_bwd.py) share:
the input checks, the device-side sanitising of cu_seqlens and its error word, the work list of
(sequence, tile) items, the kernel arguments of the score mods, and the in-kernel window bounds."""

from __future__ import annotations

import math

from attnscope.errors import InputError, expect
from attnscope.kernels._common import (
    LOG2E,
    check_device,
    check_head_dim,
    check_mods,
    check_same,
    check_scale,
    check_tensor,
    device_error_flag,
    import_torch_triton,
)

torch, triton = import_torch_triton()

from attnscope.kernels.bwd import WINDOW_UNBOUNDED  # noqa: E402


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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
    check_device(torch, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k})
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
    check_head_dim(d)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not (_is_int(value) and value >= 0):
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
    1: "cu_seqlens_q: expected int32 values from 0 to total_q, non-decreasing, got others",
    2: "cu_seqlens_k: expected int32 values from 0 to total_k, non-decreasing, got others",
    4: "max_seqlen_q: expected >= the longest query sequence, got a smaller value",
    8: "max_seqlen_k: expected >= the longest key sequence, got a smaller value",
}


def _sanitize(cu, total: int, max_seqlen: int, flag, bit_cu: int, bit_max: int):
    """On the device, no host sync: ``cummax(clamp(cu, 0, total))`` with its ends forced to 0 and
    ``total``, so the sequences always partition ``[0, total)`` (a decreasing pair becomes an empty
    sequence, an out-of-range value is clamped): every row is read and written once, inside the tensors,
    whatever ``cu`` holds. Where ``cu`` differs from it, or a length exceeds ``max_seqlen``, the bit is
    ORed into ``flag`` (raised by `check_errors`)."""
    fixed = torch.cummax(cu.clamp(0, total), 0).values
    fixed[:1].zero_()  # fill_ of a slice: no host-to-device copy of a Python scalar (a sync)
    fixed[-1:].fill_(total)
    lens = fixed[1:] - fixed[:-1]
    bad = (cu != fixed).any().to(torch.int32) * bit_cu + (lens > max_seqlen).any().to(torch.int32) * bit_max
    flag.bitwise_or_(bad)
    return fixed


def _work_items(cu_q, cu_k, n_items: int, block_m: int, causal: bool, kv_tiles: bool = False):
    """(sequence, tile) pairs, heaviest first, padded with sequence -1 to ``n_items``; on the device, no
    host sync. Query tiles of ``block_m`` rows (weight: the K/V rows the tile loads, `_kv_bounds`'s
    ``hi``) or, with ``kv_tiles``, K/V tiles of ``block_m`` keys (weight: the query rows that see it)."""
    nq = (cu_q[1:] - cu_q[:-1]).long()  # [B]
    nk = (cu_k[1:] - cu_k[:-1]).long()
    n_own = nk if kv_tiles else nq
    tiles = (n_own + block_m - 1) // block_m  # [B] tiles per sequence
    ends = torch.cumsum(tiles, 0)  # [B] exclusive end of each sequence's items
    w = torch.arange(n_items, device=cu_q.device)
    seq = torch.searchsorted(ends, w, right=True).clamp_(max=nq.shape[0] - 1)  # [W]
    tile = w - (ends[seq] - tiles[seq])
    valid = w < ends[-1]
    if causal and kv_tiles:  # query rows r >= c - (Nk - Nq) of the tile's first key c
        weight = nq[seq] - (tile * block_m - nk[seq] + nq[seq]).clamp(min=0, max=None).minimum(nq[seq])
    elif causal:  # rows of the tile's last query + the diagonal offset, clamped to [0, Nk]
        r_last = torch.minimum((tile + 1) * block_m, nq[seq]) + nk[seq] - nq[seq]
        weight = torch.minimum(r_last.clamp(min=0), nk[seq])
    else:
        weight = nq[seq] if kv_tiles else nk[seq]
    weight = torch.where(valid, weight + 1, torch.zeros_like(weight))  # +1: an item with no keys still runs
    order = torch.argsort(weight, descending=True, stable=True)
    seq = torch.where(valid, seq, -1)[order].to(torch.int32)
    tile = torch.where(valid, tile, 0)[order].to(torch.int32)
    return seq, tile


def prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softcap, sinks,
            scale, check_seqlens):
    """The checks every varlen launch (forward and backward) makes: shapes, mods (`check_mods`), and the
    cu_seqlens values: on the host with ``check_seqlens`` (a sync), else sanitised on the device with the
    error word set (`_sanitize`). Returns ``(dims, mods, sm_scale, cu_q, cu_k)``."""
    dims = _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale)
    total_q, Hq, d, total_k, Hkv = dims
    mods = check_mods(torch, causal, window, softcap, sinks, Hq, q.device)
    if check_seqlens:
        _check_seqlens(cu_seqlens_q, "cu_seqlens_q", total_q, max_seqlen_q, "max_seqlen_q")
        _check_seqlens(cu_seqlens_k, "cu_seqlens_k", total_k, max_seqlen_k, "max_seqlen_k")
        cu_q, cu_k = cu_seqlens_q, cu_seqlens_k
    else:
        flag = device_error_flag(torch, q.device, "varlen")
        cu_q = _sanitize(cu_seqlens_q, total_q, max_seqlen_q, flag, 1, 4)
        cu_k = _sanitize(cu_seqlens_k, total_k, max_seqlen_k, flag, 2, 8)
    sm_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    return dims, mods, sm_scale, cu_q, cu_k


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
