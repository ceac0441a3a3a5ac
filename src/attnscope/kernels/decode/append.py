"""`kv_append`: new keys and values written into a KV cache in place, every sequence in one Triton launch.

flash-attn's ``flash_attn_with_kvcache(..., k=, v=, cache_seqlens=)`` appends before it attends: new key j
of sequence b goes to position ``pos = cache_seqlens[b] + j``. One program per (sequence b, new key j, block
of kv heads) copies the rows ``k[b, j], v[b, j]`` ([Hkv, d]) to position ``pos`` of the dense cache
``[B, L, Hkv, d]`` or, through ``block_table``, to slot ``pos % page_size`` of page
``block_table[b, pos // page_size]`` of the paged cache ``[num_pages, page_size, Hkv, d]`` (the layout
`flash_decode` reads); the (j = 0, first head block) program writes the sequence's length after the append
(unless the caller has it: an int length, `_append`).

Checked on the host, metadata only (shapes, strides, dtypes, devices), once per layout (`_plan`, a bounded
cache): the rest of the call is a key, an allocation (the lengths out; none where `_append` is told the
caller keeps an int length) and the launch. A length given as an int is checked on the host (room for the
new keys, else refused before anything is written) and passed as a kernel scalar. A tensor's values are
checked on the device, per sequence: a length with no room for the new keys (below 0, above capacity -
Nnew), or a block-table entry outside [0, num_pages) among the pages the new keys go to, and the sequence is
not written at all. Its length out is -1 for the former and its length +
Nnew for the latter, so the decode kernel that reads them records either (out-of-range length; the bad
entry met) for `attnscope.kernels.decode.check_errors`. Nothing is read or written outside the tensors.

Inside `torch.compile` the call is the custom op ``torch.ops.attnscope.kv_append`` (`_op`, mutating the
caches); an eager call launches directly (on a GPU through the kept binary, `_direct.DirectLaunch`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from attnscope.errors import InputError, short
from attnscope.kernels._common import dynamo_watching, import_torch_triton, outside_dynamo
from attnscope.kernels._direct import direct_launch
from attnscope.kernels.decode.checks import _check_no_grad

torch, triton = import_torch_triton()
import triton.language as tl  # noqa: E402

Tensor = torch.Tensor

#: kv heads per program: with d = 128 a [16, 128] tile, 4 KiB of bf16 read and written per tensor
MAX_BLOCK_H = 16
#: block-table entries checked per loop step (the pages Nnew new keys touch: one for a decode step)
MAX_BLOCK_P = 64


# the int length varies call to call: not value-specialised, one binary per layout
@triton.jit(do_not_specialize=["fixed"])
def _attnscope_kv_append_kernel(
    K, V, K_CACHE, V_CACHE, SEQLENS, BT, LENS_OUT,
    fixed, n_new, capacity, num_pages, n_kv_heads,
    stride_kb, stride_kn, stride_kh,  # new keys [B, Nnew, Hkv, d]
    stride_vb, stride_vn, stride_vh,
    stride_cp, stride_cs, stride_ch,  # K cache: dense (batch, position, head); paged (page, slot, head)
    stride_dp, stride_ds, stride_dh,  # V cache, the same
    stride_tb,
    stride_sb,  # lengths int32 [B]
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM padded to a power of two
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HAS_SEQLENS: tl.constexpr,  # lengths from SEQLENS int32 [B], else the scalar ``fixed`` (host-checked)
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    WRITE_LENGTHS: tl.constexpr = True,  # LENS_OUT written (else an int length's caller knows them)
):
    row = tl.program_id(0)  # b * max(Nnew, 1) + j
    h_block = tl.program_id(1)
    rows = tl.maximum(n_new, 1)
    b = row // rows
    j = row - b * rows
    length = tl.load(SEQLENS + b * stride_sb) if HAS_SEQLENS else tl.zeros([], dtype=tl.int32) + fixed
    fits = (length >= 0) & (length <= capacity - n_new)  # positions length .. length + Nnew - 1 fit
    start = tl.where(fits, length, 0)  # a sequence that does not fit is not written: any in-range base
    ok = fits & (j < n_new)  # (Nnew = 0: the program only writes the length)
    if PAGED:  # every block-table entry the sequence's new keys go to must be a page of the cache
        first = start // PAGE_SIZE
        # entries first .. first + count - 1
        count = tl.where(ok, (start + n_new - 1) // PAGE_SIZE + 1 - first, 0)
        n_bad = tl.zeros([BLOCK_P], dtype=tl.int32)
        for p0 in range(0, count, BLOCK_P):
            offs_p = p0 + tl.arange(0, BLOCK_P)
            used = offs_p < count
            page = tl.load(BT + b * stride_tb + first + offs_p, mask=used, other=0)
            n_bad += (used & ((page < 0) | (page >= num_pages))).to(tl.int32)
        ok = ok & (tl.sum(n_bad, 0) == 0)
        pos = start + j
        page = tl.load(BT + b * stride_tb + pos // PAGE_SIZE, mask=ok, other=0).to(tl.int64)
        slot = pos % PAGE_SIZE
        dst_k = page * stride_cp + slot * stride_cs
        dst_v = page * stride_dp + slot * stride_ds
    else:
        pos = (start + j).to(tl.int64)
        dst_k = b.to(tl.int64) * stride_cp + pos * stride_cs
        dst_v = b.to(tl.int64) * stride_dp + pos * stride_ds
    offs_h = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < n_kv_heads) & (offs_d[None, :] < HEAD_DIM) & ok  # [BLOCK_H, BLOCK_D]
    src_k = b.to(tl.int64) * stride_kb + j * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = b.to(tl.int64) * stride_vb + j * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :]
    tl.store(K_CACHE + dst_k + offs_h[:, None] * stride_ch + offs_d[None, :], tl.load(K + src_k, mask=mask),
             mask=mask)
    tl.store(V_CACHE + dst_v + offs_h[:, None] * stride_dh + offs_d[None, :], tl.load(V + src_v, mask=mask),
             mask=mask)
    if WRITE_LENGTHS:  # the length after the append; -1 (out of range, recorded by decode) if it does not fit
        tl.store(LENS_OUT + b, tl.where(fits, length + n_new, -1), mask=(j == 0) & (h_block == 0))


class _Plan(NamedTuple):
    """What a layout fixes of a launch: the batch, Nnew, the capacity (keys a sequence can hold), the grid,
    the scalars after ``fixed``, the constexprs and the launcher (None: ``kernel[grid]`` each call)."""

    B: int
    n_new: int
    capacity: int
    grid: tuple
    scalars: tuple
    constexprs: dict
    direct: object


class _Meta(NamedTuple):
    """What a plan fixes of a tensor."""

    shape: tuple
    stride: tuple
    dtype: object
    device: object


def kv_append(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, cache_seqlens: int | Tensor,
              block_table: Tensor | None = None) -> Tensor:
    """Write ``k``, ``v`` into the cache at positions ``cache_seqlens[b] .. cache_seqlens[b] + Nnew - 1`` of
    each sequence, in place, in one launch; return the lengths after the append.

    Parameters
    ----------
    k_cache, v_cache : torch.Tensor
        Dense ``[B, L, Hkv, d]``, or paged ``[num_pages, page_size, Hkv, d]`` with ``block_table``; any
        strides with a unit last stride.
    k, v : torch.Tensor, [B, Nnew, Hkv, d]
        The new keys and values: the caches' dtype and device, unit last stride.
    cache_seqlens : int or torch.Tensor int32 [B]
        Keys already in each sequence. An int is checked on the host (refused when ``cache_seqlens + Nnew``
        passes the capacity, before anything is written); a tensor's values on the device (module
        docstring: a sequence without room, or whose new keys would go to a page outside the cache, is not
        written, and its length out makes the decode kernel record it).
    block_table : torch.Tensor, int32 [B, max_pages], optional
        The page of each block of page_size keys: capacity ``max_pages * page_size`` (dense: L).

    Returns
    -------
    lengths : torch.Tensor, int32 [B]
        ``cache_seqlens + Nnew``; -1 for a sequence whose new keys do not fit. No value is read back to the
        host: the call can be captured in a CUDA graph.

    Example
    -------
    >>> lens = kv_append(k_cache, v_cache, k_new, v_new, cache_seqlens)  # then flash_decode(..., lens)
    """
    return _append(k_cache, v_cache, k, v, cache_seqlens, block_table, True)


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table, lengths: bool, before_write=None):
    """`kv_append`; with an int ``cache_seqlens`` and ``lengths`` False (eager) no lengths tensor is made or
    written and None is returned: they are ``cache_seqlens + Nnew`` (the caller knows them).
    ``before_write``: called once the append's own checks pass, before anything is written (the caller's
    checks of what follows the append)."""
    fixed = None
    if not isinstance(cache_seqlens, Tensor):
        fixed = cache_seqlens
        if type(fixed) is not int and not isinstance(fixed, torch.SymInt) or fixed < 0:
            raise InputError(f"cache_seqlens: expected the current cache lengths when k and v are appended "
                             f"(a non-negative int or an int32 tensor [B]), got {short(fixed)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            want = "[B, Nnew, Hkv, d]" if len(name) == 1 else \
                "[num_pages, page_size, Hkv, d]" if block_table is not None else "[B, L, Hkv, d]"
            raise InputError(f"{name}: expected a torch.Tensor {want}, got {type(t).__name__}")
    if block_table is not None and not isinstance(block_table, Tensor):
        raise InputError(f"block_table: expected an int32 tensor [B, max_pages] or None, got "
                         f"{short(block_table)}")
    key = (*((t.shape, t.stride(), t.dtype, t.device) for t in (k_cache, v_cache, k, v)),
           None if block_table is None else (block_table.shape, block_table.stride(), block_table.dtype,
                                             block_table.device),
           None if fixed is not None else (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device,
                                           cache_seqlens.stride()),
           lengths or fixed is None)
    compiling = torch.compiler.is_compiling()
    plan = _build(*key) if compiling else _plan(*key)  # symbolic shapes are not kept
    if fixed is not None and fixed + plan.n_new > plan.capacity:
        raise InputError(f"cache_seqlens: expected cache_seqlens + Nnew <= {plan.capacity} (the cache's "
                         f"capacity), got {fixed} + {plan.n_new}")
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        _check_no_grad(k=k, v=v)
    if before_write is not None:
        before_write()
    if compiling:  # torch.compile traces the custom op (`_op`); it runs this function
        return torch.ops.attnscope.kv_append(k_cache, v_cache, k, v, None if fixed is not None else
                                             cache_seqlens, block_table, 0 if fixed is None else fixed)
    if _watching() is not None:  # eager inside a compiled region's graph break: never traced
        return _write_untraced(plan, k_cache, v_cache, k, v, cache_seqlens, block_table, fixed)
    return _write(plan, k_cache, v_cache, k, v, cache_seqlens, block_table, fixed)


def _write(plan, k_cache, v_cache, k, v, cache_seqlens, block_table, fixed):
    """`_append`'s launch of a checked ``plan``; returns the lengths (None where none are written)."""
    if plan.constexprs["WRITE_LENGTHS"]:
        lengths = out = torch.empty(plan.B, dtype=torch.int32, device=k.device)
    else:  # nothing to write but the new keys; ``k`` stands in for the pointers never read
        lengths, out = None, k
    if plan.grid[0] == 0:  # nothing to write
        return lengths
    args = (k, v, k_cache, v_cache, cache_seqlens if fixed is None else out,
            block_table if block_table is not None else out, out, 0 if fixed is None else fixed,
            *plan.scalars)
    if plan.direct is None:  # the interpreter, a CPU tensor
        _attnscope_kv_append_kernel[plan.grid](*args, **plan.constexprs)
        return lengths
    bits = k.data_ptr() | v.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr() | out.data_ptr()
    if fixed is None:
        bits |= cache_seqlens.data_ptr()
    if block_table is not None:
        bits |= block_table.data_ptr()
    plan.direct.launch(plan.grid, args, bits % 16 == 0)  # on the cache's device, whichever is current
    return lengths


_watching = dynamo_watching(torch)
_write_untraced = outside_dynamo(torch, _write)


def _build(kc, vc, k, v, table, lens, write_lengths=True) -> _Plan:
    """Check the layouts (each tensor's (shape, strides, dtype, device); ``lens`` the lengths tensor's
    (shape, dtype, device, strides), None for an int) and derive the launch (``write_lengths``: the lengths
    out)."""
    kc, vc, k, v = (_Meta(*x) for x in (kc, vc, k, v))
    paged = table is not None
    layout = "[num_pages, page_size, Hkv, d]" if paged else "[B, L, Hkv, d]"
    for name, t, want in (("k_cache", kc, layout), ("v_cache", vc, layout), ("k", k, "[B, Nnew, Hkv, d]"),
                          ("v", v, "[B, Nnew, Hkv, d]")):
        if len(t.shape) != 4:
            raise InputError(f"{name}: expected a 4-d tensor {want}, got shape {tuple(t.shape)}")
    B, n_new, Hkv, d = k.shape
    device = kc.device
    if lens is not None and not (lens[1] == torch.int32 and tuple(lens[0]) == (B,) and lens[2] == device):
        raise InputError(f"cache_seqlens: expected an int32 tensor [B = {B}] on {device}, got a tensor of "
                         f"shape {tuple(lens[0])}, {lens[1]} on {lens[2]}")
    if v.shape != k.shape:
        raise InputError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if vc.shape != kc.shape:
        raise InputError(f"v_cache: expected the shape of k_cache {tuple(kc.shape)}, got {tuple(vc.shape)}")
    for name, t, cache in (("k", k, kc), ("v", v, vc)):
        if t.shape[2:] != cache.shape[2:] or t.dtype != cache.dtype or t.device != cache.device:
            raise InputError(f"{name}: expected [B, Nnew, {cache.shape[2]}, {cache.shape[3]}] {cache.dtype} "
                             f"on {cache.device} (as {name}_cache), got {tuple(t.shape)} {t.dtype} on "
                             f"{t.device}")
    if Hkv == 0 or d == 0:
        raise InputError(f"k: expected Hkv >= 1 and d >= 1, got shape {tuple(k.shape)}")
    for name, t in (("k_cache", kc), ("v_cache", vc), ("k", k), ("v", v)):
        if t.stride[3] != 1:
            raise InputError(f"{name}: expected unit stride in the last (head_dim) dimension, got strides "
                             f"{tuple(t.stride)}")
    if not paged:
        if kc.shape[0] != B:
            raise InputError(f"k_cache: expected [B = {B}, L, Hkv, d] (B as k), got {tuple(kc.shape)}")
        capacity, page, num_pages, stride_tb = kc.shape[1], 1, 0, 0
    else:
        shape, stride, dtype, where = table
        if not (dtype == torch.int32 and len(shape) == 2 and shape[0] == B and where == device):
            raise InputError(f"block_table: expected an int32 tensor [B = {B}, max_pages] on {device}, got a "
                             f"tensor of shape {tuple(shape)}, {dtype} on {where}")
        if stride[1] != 1:
            raise InputError(f"block_table: expected unit stride in the last dimension, got strides "
                             f"{tuple(stride)}")
        if kc.shape[0] == 0:
            raise InputError(f"k_cache: expected num_pages >= 1, got shape {tuple(kc.shape)}")
        num_pages, page = kc.shape[:2]
        capacity, stride_tb = shape[1] * page, stride[0]
    if n_new > capacity:
        raise InputError(f"k: expected Nnew <= {capacity} (the cache's capacity), got shape {tuple(k.shape)}")
    if capacity >= 2**31:  # lengths and positions are int32
        raise NotImplementedError(f"k_cache: supported: a capacity below 2**31 keys per sequence, got "
                                  f"{capacity}")
    block_h = min(triton.next_power_of_2(Hkv), MAX_BLOCK_H)
    touched = (n_new + page - 2) // page + 1  # block-table entries Nnew keys can touch (Nnew >= 1)
    constexprs = {"HEAD_DIM": d, "BLOCK_D": triton.next_power_of_2(d), "BLOCK_H": block_h,
                  "BLOCK_P": min(triton.next_power_of_2(max(touched, 1)), MAX_BLOCK_P),
                  "HAS_SEQLENS": lens is not None, "PAGED": paged, "PAGE_SIZE": page,
                  "WRITE_LENGTHS": write_lengths, "num_warps": 4 if block_h * d >= 2048 else 2}
    scalars = (n_new, capacity, num_pages, Hkv, *k.stride[:3], *v.stride[:3], *kc.stride[:3], *vc.stride[:3],
               stride_tb, 0 if lens is None else lens[3][0])
    # one program per (sequence, new key; with Nnew = 0 only the lengths, if written), block of kv heads
    grid = (B * max(n_new, int(write_lengths)), triton.cdiv(Hkv, block_h))
    return _Plan(B, n_new, capacity, grid, scalars, constexprs,
                 direct_launch(_attnscope_kv_append_kernel, constexprs, device))


#: a decode loop appends with the same few layouts every step: their checked plans, bounded (least recently
#: used dropped first); a plan holds no tensor, and a refused layout raises again each call
_plan = functools.lru_cache(maxsize=16)(_build)
