"""Split-KV decode: the input checks that need no device read, and the opt-in host checks of the values of
``cache_seqlens`` and ``block_table``."""

from __future__ import annotations

from attnscope.errors import InputError, expect
from attnscope.kernels._common import (
    LOG2E,
    check_device,
    check_head_dim,
    check_same,
    check_scale,
    check_tensor,
    import_torch_triton,
)
from attnscope.kernels.decode.heuristics import (
    MAX_NUM_SPLITS,
    PAGE_SIZES,
    RAW_SCORES_ABOVE,
    _is_int,
    _raw_scores,
)

torch, _ = import_torch_triton()


def _check_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale):
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


def _layout(t):
    """What a plan fixes about a tensor: shape, strides, dtype, device (None for no tensor)."""
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device)


def _check_out(name, t, shape, dtype, device):
    if not (isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == dtype
            and t.device == device and t.is_contiguous()):
        got = f"shape {tuple(t.shape)}, {t.dtype}, {t.device}, contiguous={t.is_contiguous()}" \
            if isinstance(t, torch.Tensor) else type(t).__name__
        raise InputError(f"{name}: expected a contiguous tensor of shape {shape}, {dtype} on {device}, "
                         f"got {got}")
