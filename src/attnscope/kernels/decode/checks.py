"""Split-KV decode: the input checks that need no device read, the device-side error word and its explicit
check (`check_errors`), and the opt-in host checks of the values of ``cache_seqlens`` and ``block_table``.

What is checked where:

- on the host, every call (no device read): types, ranks, shapes, strides, dtypes, devices, the
  options, the score mods (`_common.check_mods`), that no input requires grad, and (an e4m3 cache whose
  plan reads V as int32 words) that V's address is still a multiple of 4 bytes;
- on the device, every launch: each ``cache_seqlens`` value in [0, L_max] (else clamped into it) and 0 or
  at least Nq (the queries are the last Nq positions; a shorter one is reported, not refused), each
  block-table entry a sequence uses in [0, num_pages) (else its keys are masked out, never read; an e4m3
  tile of one query masks every key of the split holding it), and ``k_scale`` / ``v_scale`` finite and
  positive with ``448 * k_scale``, ``448 * v_scale`` (the largest dequantised values) and ``scale * k_scale``
  finite in fp32, and no score past fp32 under that k_scale (such a row's output would be NaN). A
  violation sets a bit of a per-device int32 error word; nothing is read or written outside the tensors.
  `quantize_kv` sets a bit of the same word when its input holds NaN or inf (`_kernel.ERR_QUANTIZE`);
- `check_errors` (and ``DecodePlan.check``) reads that word (one device sync, when the caller asks),
  clears it and raises `InputError` naming ``cache_seqlens``, ``block_table``, ``k_scale/v_scale`` or
  `quantize_kv`'s ``x``;
- with ``check_seqlens=True``, the same value checks run eagerly on the host before the launch (a
  device sync per call, which also breaks CUDA-graph capture).
"""

from __future__ import annotations

from typing import NamedTuple

from attnscope.errors import InputError, expect, is_int, short
from attnscope.kernels._common import (
    FP32_MAX,
    LOG2E,
    Mods,
    check_device,
    check_head_dim,
    check_mods,
    check_same,
    check_scale,
    check_softcap,
    check_tensor,
    device_error_flag,
    import_torch_triton,
    raise_device_errors,
)
from attnscope.kernels.decode._kernel import (
    E4M3_MAX,
    ERR_BLOCK_TABLE,
    ERR_LEFTPAD,
    ERR_QUANTIZE,
    ERR_SCALES,
    ERR_SEQLENS,
)
from attnscope.kernels.decode.heuristics import (
    MAX_NUM_SPLITS,
    PAGE_SIZES,
    RAW_SCORES_ABOVE,
    _raw_scores,
)

torch, _ = import_torch_triton()


FP8 = torch.float8_e4m3fn
CACHE_DTYPES = "q's dtype (torch.float16 or torch.bfloat16) or torch.float8_e4m3fn"


class Facts(NamedTuple):
    """What `_check_inputs` learns about a call: sizes, the page size (0: dense), the mods (their sinks left
    out: `flash_decode` keeps a layout's facts with its plans, and a kept tensor of one call would outlive it,
    e.g. in a CUDA-graph pool; each launch takes its call's sinks), fp8 scales."""

    B: int
    Hq: int
    Nq: int
    d: int
    Hkv: int
    L_max: int
    page_size: int
    mods: Mods
    fp8: bool
    scale_per_head: bool


def _check_cache(name, t, layout):
    """A K or V cache: fp16 / bf16 (`check_tensor`) or e4m3."""
    if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.itemsize == 1:
        if t.dtype != FP8:
            raise NotImplementedError(f"{name}: dtype {t.dtype} is not supported; supported: {CACHE_DTYPES}")
        if t.dim() != 4:
            raise InputError(f"{name}: expected a 4-d tensor {layout}, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise InputError(f"{name}: expected unit stride in the last (head_dim) dimension, "
                             f"got strides {tuple(t.stride())}")
    else:
        check_tensor(torch, name, t, 4, layout)


def _check_scales(k_scale, v_scale, fp8: bool, Hkv: int, device) -> bool:
    """The K/V scales of an e4m3 cache (fp32, one element or [Hkv], on the cache's device; their values
    are checked on the device); None without one. Returns whether they are per kv head."""
    if not fp8:
        for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
            expect(t is None, name, "None (scales apply to a torch.float8_e4m3fn cache only)", t)
        return False
    per_head = []
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        want = f"a float32 tensor of one element or of shape [Hkv] = [{Hkv}] (a float8_e4m3fn cache needs it)"
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected {want}, got {short(t)}")
        if t.dtype != torch.float32 or not (t.numel() == 1 or tuple(t.shape) == (Hkv,)):
            raise InputError(f"{name}: expected {want}, got {t.dtype} of shape {tuple(t.shape)}")
        if t.device != device:
            raise InputError(f"{name}: expected device {device} (as k_cache), got {t.device}")
        per_head.append(t.dim() == 1 and Hkv > 1 and t.shape[0] == Hkv)
        if per_head[-1] and t.stride(0) != 1:
            raise InputError(f"{name}: expected a contiguous [Hkv] tensor, got stride {t.stride(0)}")
    if per_head[0] != per_head[1]:
        raise NotImplementedError(f"k_scale, v_scale: supported: both per tensor (one element) or both per "
                                  f"kv head [{Hkv}], got shapes {tuple(k_scale.shape)} and "
                                  f"{tuple(v_scale.shape)}")
    return per_head[0]


def _check_no_grad(**tensors) -> None:
    """Decode has no backward: an input that requires grad would get an output without a grad_fn."""
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise NotImplementedError(f"{name}: decode has no backward, got a tensor that requires grad; "
                                          "supported: inputs that do not require grad (detach them, or call "
                                          "under torch.no_grad())")


def _requires_grad(tensors) -> bool:
    """Whether grad mode is on and a tensor of ``tensors`` (None entries skipped) requires grad."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def _check_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, k_scale=None,
                  v_scale=None, window=None, softcap=0.0, sinks=None, cache_leftpad=None) -> Facts:
    """Validate everything that needs no device read; return the call's `Facts`."""
    paged = block_table is not None
    layout = "[num_pages, page_size, Hkv, d]" if paged else "[B, Hkv, L_max, d]"
    check_tensor(torch, "q", q, 4, "[B, Hq, Nq, d]")
    _check_cache("k_cache", k_cache, layout)
    _check_cache("v_cache", v_cache, layout)
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    for name, t, shape in (("cache_seqlens", cache_seqlens, "[B]"),
                           ("block_table", block_table, "[B, max_pages]"),
                           ("cache_leftpad", cache_leftpad, "[B]")):
        if t is not None:
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{name}: expected a torch.Tensor of int32 {shape} or None, "
                                 f"got {type(t).__name__}")
            expect(t.dtype == torch.int32, name, "dtype torch.int32", t.dtype)
            tensors[name] = t
    check_device(tensors)
    B, Hq, Nq, d = q.shape
    if B == 0 or Hq == 0 or Nq == 0:
        raise InputError(f"q: expected B >= 1, Hq >= 1 and Nq >= 1, got shape {tuple(q.shape)}")
    check_same("k_cache", "head_dim (as q)", d, k_cache.shape[3])
    fp8 = k_cache.dtype == FP8
    if not fp8:
        check_same("k_cache", "dtype (as q)", q.dtype, k_cache.dtype)
    check_same("v_cache", "dtype (as k_cache)", k_cache.dtype, v_cache.dtype)
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
    check_head_dim(d, padded=True)
    if cache_seqlens is not None and tuple(cache_seqlens.shape) != (B,):
        raise InputError(f"cache_seqlens: expected shape ({B},) (one length per sequence), "
                         f"got {tuple(cache_seqlens.shape)}")
    if cache_leftpad is not None:
        if paged:
            raise NotImplementedError("cache_leftpad: supported with a dense cache (as flash-attn), got a "
                                      "block_table too")
        if tuple(cache_leftpad.shape) != (B,) or cache_leftpad.stride(0) != 1 and B > 1:
            raise InputError(f"cache_leftpad: expected a contiguous shape ({B},) (one start per "
                             f"sequence), got shape {tuple(cache_leftpad.shape)}, strides "
                             f"{tuple(cache_leftpad.stride())}")
    if cache_seqlens is None and Nq > L_max:
        raise InputError(f"q: expected Nq <= L_max = {L_max} (cache_seqlens None: every length is L_max), "
                         f"got Nq = {Nq}")
    if num_splits is not None:
        expect(is_int(num_splits) and num_splits > 0, "num_splits", "a positive integer or None", num_splits)
        if num_splits > MAX_NUM_SPLITS:
            raise NotImplementedError(f"num_splits: at most {MAX_NUM_SPLITS} supported, got {num_splits}")
    check_scale(scale)
    mods = check_mods(torch, True, window, softcap, sinks, Hq, q.device)  # decode is causal: right = 0
    if mods.softcap:
        check_softcap(mods.softcap, scale if scale is not None else d ** -0.5)
    if num_splits not in (None, 1) and _raw_scores(scale, d, mods.softcap):
        raise InputError(f"num_splits: expected 1 or None with scale above {RAW_SCORES_ABOVE / LOG2E:.4g} "
                         f"(raw-score softmax, one split), got {num_splits}")
    per_head = _check_scales(k_scale, v_scale, fp8, Hkv, q.device)
    return Facts(B, Hq, Nq, d, Hkv, L_max, page_size, mods._replace(sinks=None), fp8, per_head)


def _check_scale_values(k_scale, v_scale, scale, d) -> None:
    """Read the K/V scales back and check them (a device sync; ``check_seqlens=True`` only)."""
    sm_scale = float(scale) if scale is not None else d ** -0.5
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        values = t.detach().reshape(-1).cpu().tolist()
        bad = [x for x in values if not (x > 0 and x * E4M3_MAX.value < FP32_MAX)]
        if bad or name == "k_scale" and max(values) * sm_scale * LOG2E >= FP32_MAX:
            raise InputError(f"{name}: expected finite positive values (with 448 x {name} and scale * "
                             f"k_scale * log2(e) finite in fp32), got {bad[0] if bad else max(values)}")


def _error_word(device):
    """The decode error word of ``device`` (bits: `_kernel.ERR_SEQLENS`, `ERR_BLOCK_TABLE`, `ERR_SCALES`,
    `ERR_QUANTIZE`), set by the kernels with an atomic or, and by `quantize_kv` (`_common.device_error_flag`;
    make a plan before graph capture)."""
    return device_error_flag(torch, device, "decode")


def check_errors(device: torch.device | str | int | None = None) -> None:
    """Raise `InputError` if a decode launch or a `quantize_kv` call on ``device`` (default: every device
    used) since the last check met an out-of-range value, and clear the record.

    The kernels check every value on the device (`attnscope.kernels.decode.checks`): a length outside
    [0, L_max] was clamped into it (one in (0, Nq) ran as given, fewer keys than queries), a used
    block-table entry outside [0, num_pages) was masked out (its keys, or its split's, not read), a K/V
    scale was not finite and positive, or 448 x it or a score under it passed fp32; those calls' outputs are
    not the attention of the inputs as given.
    `quantize_kv` records NaN or inf in its input (its scales are then not finite). Reading the record is
    one device sync: call it where a sync is cheap (after a generation step, in tests), never inside
    CUDA-graph capture.
    """
    messages = {
        bit: f"{name}: expected {want}, got an out-of-range value in a decode call since the last check"
        for bit, name, want in (
            (ERR_SEQLENS.value, "cache_seqlens", "values in [0, L_max], each 0 or >= Nq"),
            (ERR_BLOCK_TABLE.value, "block_table",
             "used page indices in [0, num_pages) (flash_attn_with_kvcache's cache_batch_idx, made a block "
             "table: cache_batch_idx rows in [0, the cache's batch))"),
            (ERR_SCALES.value, "k_scale/v_scale", "finite positive values (448 x each, the largest "
             "dequantised value, finite in fp32; the scores scale * k_scale * q.k too)"),
            (ERR_LEFTPAD.value, "cache_leftpad", "values in [0, the sequence's length]"))}
    messages[ERR_QUANTIZE.value] = ("x: expected finite values, got NaN or inf in a quantize_kv call since "
                                    "the last check")
    raise_device_errors(torch, "decode", messages, device)


def _check_seqlen_values(cache_seqlens, L_max: int, block_table, page_size: int, num_pages: int,
                         nq: int = 1) -> int:
    """Read the lengths (and the used block-table entries) back to the host and check them: a device
    sync. Each length is 0 (an empty slot) or in [Nq, L_max] (a sequence holds its ``nq`` new queries,
    its last positions). Returns the longest length."""
    lo, hi = (int(x) for x in cache_seqlens.aminmax())
    if lo < 0 or hi > L_max:
        bad = lo if lo < 0 else hi
        raise InputError(f"cache_seqlens: expected values in [0, L_max = {L_max}], got {bad}")
    if nq > 1:
        short_ = cache_seqlens[(cache_seqlens > 0) & (cache_seqlens < nq)]
        if short_.numel():
            raise InputError(f"cache_seqlens: expected 0 or a length >= Nq = {nq} (the queries are the last "
                             f"Nq positions of each sequence), got {int(short_[0])}")
    if block_table is not None:
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] \
            < ((cache_seqlens.long() + page_size - 1) // page_size)[:, None]  # pages holding keys
        bad = used & ((block_table < 0) | (block_table >= num_pages))
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise InputError(f"block_table: expected page indices in [0, num_pages = {num_pages}) for the "
                             f"pages cache_seqlens uses, got {int(block_table[b, j])} at [{b}, {j}]")
    return hi


def _check_leftpad_values(cache_leftpad, cache_seqlens, L_max: int) -> None:
    """Read the left pads back to the host and check them (a device sync): each in [0, its sequence's
    length] (``cache_seqlens[b]``, or L_max without lengths)."""
    ends = cache_seqlens.long() if cache_seqlens is not None else torch.full_like(cache_leftpad, L_max).long()
    bad = (cache_leftpad < 0) | (cache_leftpad.long() > ends)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise InputError(f"cache_leftpad: expected values in [0, the sequence's length], got "
                         f"{int(cache_leftpad[b])} at [{b}] (length {int(ends[b])})")


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
