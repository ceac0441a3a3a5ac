"""flash-attn 2.x's Python interface over attnscope's kernels: same names, argument order, defaults, layouts.

Code written for ``flash_attn`` (``from flash_attn import flash_attn_func, ...``) runs on attnscope by
changing the import to ``from attnscope.flash_attn_interface import ...``. Each function converts
flash-attn's layouts to the kernels' with views, never a copy where the strides allow, and calls one kernel:

==============================  ==========================================  ============================
function                        flash-attn layout                           kernel
==============================  ==========================================  ============================
`flash_attn_func`               q [B, Nq, Hq, d], k, v [B, Nk, Hkv, d]      `flash_attention` + backward
`flash_attn_qkvpacked_func`     qkv [B, N, 3, H, d]                         `flash_attention` + backward
`flash_attn_kvpacked_func`      q [B, Nq, Hq, d], kv [B, Nk, 2, Hkv, d]     `flash_attention` + backward
`flash_attn_varlen_func`        q [total_q, Hq, d], k, v [total_k, Hkv, d]  `flash_attention_varlen` + bwd
`flash_attn_varlen_qkvpacked_   qkv [total, 3, H, d]; kvpacked: q, kv       `flash_attention_varlen` + bwd
func`, ``..._kvpacked_func``    [total_k, 2, Hkv, d]
`flash_attn_with_kvcache`       q [B, Nq, Hq, d]; cache [B, L, Hkv, d]      `flash_decode`
                                or paged [pages, page, Hkv, d]
==============================  ==========================================  ============================

Eager inference (no input requires grad, outside torch.compile) launches the kernel's plan on flash-attn's
tensors as given and allocates the output in flash-attn's layout: no view of the caller's tensors but the
q, k, v of a packed one (`_infer`, `_launch_varlen`; `flash_attn_with_kvcache` on a layout `flash_decode`
has planned: `_attend`). With autograd or under torch.compile the kernels get ``[B, H, N, d]`` views and the
outputs are views of theirs (`_autograd`). ``return_attn_probs=True`` returns
``(out, softmax_lse, None)``: the natural-log LSE, float32 ``[B, Hq, Nq]`` (``[Hq, total_q]`` for
varlen); attention probabilities are never materialised. ``causal`` is bottom-right aligned (flash-attn >=
2.1); ``window_size`` and ``softcap`` go to the kernels' ``window=`` / ``softcap=`` keywords.

`flash_attn_with_kvcache`'s rotary embedding (``rotary_cos`` / ``rotary_sin``) is applied with torch ops
before the append and the attention (`kernels.rotary`), not in the kernels. What flash-attn has and attnscope
lacks (dropout, ALiBi, a paged varlen call) raises NotImplementedError naming the argument; none is ignored.
"""

from __future__ import annotations

import functools

from attnscope.errors import MAX_DIM, InputError, expect, finite_real, is_int, short
from attnscope.kernels._common import check_rank, check_tensor, import_torch_triton
from attnscope.model.tiles import normalize_window

torch, _ = import_torch_triton()

from attnscope.kernels.decode import flash_decode  # noqa: E402
from attnscope.kernels.decode.api import _cached  # noqa: E402
from attnscope.kernels.decode.append import _append  # noqa: E402
from attnscope.kernels.decode.checks import _check_inputs, _layout  # noqa: E402
from attnscope.kernels.fwd import _launch as _launch_fwd  # noqa: E402
from attnscope.kernels.fwd import flash_attention  # noqa: E402
from attnscope.kernels.rotary import apply_rotary, check_rotary  # noqa: E402
from attnscope.kernels.varlen import _launch as _launch_varlen  # noqa: E402
from attnscope.kernels.varlen import flash_attention_varlen  # noqa: E402

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_with_kvcache"]

Tensor = torch.Tensor


# --- argument translation ------------------------------------------------------------------------
def _unsupported(**args) -> None:
    """Each keyword is ``(value, default)``: a value other than the default raises NotImplementedError."""
    for name, (value, default) in args.items():
        off = value is None if default is None else value == default
        if not off:
            raise NotImplementedError(f"{name}: not supported by attnscope (supported: {name}={default!r}), "
                                      f"got {_short(value)}")


def _short(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


def _mods(causal, window_size, softcap, dropout_p=0.0) -> dict:
    """flash-attn's ``window_size`` / ``softcap`` as the kernels' keywords, only where they change anything.

    window_size (left, right): key j visible to query i (bottom-right aligned position i') iff
    ``i' - left <= j <= i' + right``, -1 unbounded; ``causal`` forces right = 0. (-1, -1), or causal with
    left = -1, is no window. softcap 0 is off."""
    if _defaults(causal, window_size, softcap, dropout_p):  # the common call: nothing to pass
        return {}
    expect(isinstance(causal, bool), "causal", "True or False", causal)
    expect(finite_real(dropout_p) and 0.0 <= dropout_p <= 1.0, "dropout_p", "a number in [0, 1]", dropout_p)
    _unsupported(dropout_p=(float(dropout_p), 0.0))
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(is_int(w) and -1 <= w <= MAX_DIM for w in window_size))
    expect(ok, "window_size", "a pair (left, right) of ints from -1 to 10^24 (-1: unbounded)", window_size)
    expect(finite_real(softcap) and softcap >= 0, "softcap", "a finite number >= 0 (0: off)", softcap)
    left, right = normalize_window(causal, tuple(window_size))
    mods = {}
    if left != -1 or (right != -1 and not causal):  # causal's own right = 0 is no window
        mods["window"] = (left, right)
    if softcap != 0:
        mods["softcap"] = float(softcap)
    return mods


#: The signatures' default window_size, softcap and dropout_p: a call that leaves them passes these objects,
#: which `_defaults` recognises before any type or value test.
_NO_WINDOW, _OFF = (-1, -1), 0.0


def _defaults(causal, window_size, softcap, dropout_p) -> bool:
    """Whether the score options are exactly their off values (a bool ``causal``, the int pair (-1, -1),
    softcap and dropout_p 0), which need no further check: a few type tests in place of `_mods`' checks,
    none for an argument left at its default (the signature's object)."""
    return ((causal is True or causal is False)
            and (window_size is _NO_WINDOW or type(window_size) is tuple and window_size == (-1, -1)
                 and type(window_size[0]) is int and type(window_size[1]) is int)
            and (softcap is _OFF or type(softcap) in (int, float) and softcap == 0)
            and (dropout_p is _OFF or type(dropout_p) in (int, float) and dropout_p == 0))


def _deterministic(deterministic) -> dict:
    """The backward's mode as the kernels' keyword, passed only when asked for (False is their default)."""
    expect(isinstance(deterministic, bool), "deterministic", "True or False", deterministic)
    return {"deterministic": True} if deterministic else {}


_check_rank = functools.partial(check_rank, torch)  # flash-attn's layouts in messages (kernels: [B, H, N, d])


def _check_packed(name: str, t, rank: int, count: int, layout: str) -> None:
    """A packed tensor: ``rank`` dims, ``count`` (3: q, k, v; 2: k, v) along dim ``rank - 3``."""
    _check_rank(name, t, rank, layout)
    if t.shape[rank - 3] != count:
        raise InputError(f"{name}: expected shape {layout}, got {tuple(t.shape)}")


def _bhnd(t: Tensor) -> Tensor:
    """[B, N, H, d] -> [B, H, N, d], a view (the kernels take any strides with a unit last stride)."""
    return t.transpose(1, 2)


def _train_mods(causal, window_size, softcap, dropout_p, alibi_slopes, deterministic, return_attn_probs,
                block_table=None) -> dict:
    """The kernels' keywords of the differentiable functions' flash-attn options, checked: `_mods`,
    ``alibi_slopes`` and ``block_table`` refused, ``deterministic`` (`_deterministic`), a bool
    ``return_attn_probs``."""
    mods = _mods(causal, window_size, softcap, dropout_p)
    if alibi_slopes is not None or block_table is not None:
        _unsupported(alibi_slopes=(alibi_slopes, None), block_table=(block_table, None))
    if deterministic is not False:
        mods.update(_deterministic(deterministic))
    if type(return_attn_probs) is not bool:
        expect(isinstance(return_attn_probs, bool), "return_attn_probs", "True or False", return_attn_probs)
    return mods


def _eager(*tensors) -> bool:
    """Whether the call is eager inference (outside torch.compile; no input requires grad, or grad mode is
    off): `_infer` on flash-attn's tensors as they are, else `_autograd` on [B, H, N, d] views."""
    if torch.compiler.is_compiling():
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t.requires_grad:
                return False
    return True


def _infer(q, k, v, causal, scale, return_lse, mods):
    """Eager inference on flash-attn's q [B, Nq, Hq, d], k, v [B, Nk, Hkv, d] (any strides with a unit last
    stride): the forward's launch of their [B, H, N, d] layout (`fwd._launch` with ``bnhd``: a planned
    layout makes no view), o allocated as [B, Nq, Hq, d]. ``mods``: `_train_mods`' keywords (the backward's
    ``deterministic`` has nothing to do here)."""
    o, lse, _ = _launch_fwd(q, k, v, causal, scale, return_lse, None, "auto", mods.get("window"),
                            mods.get("softcap", 0.0), None, True, True)
    return (o, lse, None) if return_lse else o


def _autograd(q, k, v, causal, scale, return_lse, mods):
    """`flash_attention` (differentiable; torch.compile's op) on q [B, Hq, Nq, d], k, v [B, Hkv, Nk, d],
    views of flash-attn's tensors; o back as [B, Nq, Hq, d]."""
    res = flash_attention(q, k, v, causal, scale, return_lse, **mods)
    if not return_lse:
        return _bhnd(res)
    o, lse = res
    return _bhnd(o), lse, None


# --- the dense functions -------------------------------------------------------------------------
def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = _OFF,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = _NO_WINDOW, softcap: float = _OFF,
                    alibi_slopes: Tensor | None = None, deterministic: bool = False,
                    return_attn_probs: bool = False) -> Tensor | tuple[Tensor, Tensor, None]:
    """Attention in flash-attn's layout, differentiable (through `attnscope.flash_attention`).

    Parameters
    ----------
    q : torch.Tensor, [B, Nq, Hq, d]
        fp16 or bf16, d a multiple of 8 up to 256; any strides with a unit last stride.
    k, v : torch.Tensor, [B, Nk, Hkv, d]
        Hq a multiple of Hkv (GQA / MQA).
    dropout_p : float
        Only 0.0 (NotImplementedError otherwise).
    softmax_scale : float, optional
        Defaults to ``1/sqrt(d)``.
    causal : bool
        Bottom-right aligned causal mask (key j visible to query i iff ``j <= i + Nk - Nq``).
    window_size : (int, int)
        Local attention (left, right), -1 unbounded; ``(-1, -1)`` is off.
    softcap : float
        Scores become ``softcap * tanh(s / softcap)`` after scaling; 0 is off.
    alibi_slopes : None
        Not supported (NotImplementedError).
    deterministic : bool
        True: a backward whose gradients are bitwise identical run to run (the kernels' separate dQ pass).
    return_attn_probs : bool
        Also return the LSE (as flash-attn, the third element is the dropout mask: None here).

    Returns
    -------
    out : torch.Tensor, [B, Nq, Hq, d], q's dtype (a view of a [B, Hq, Nq, d] buffer)
    softmax_lse : torch.Tensor, [B, Hq, Nq], float32, natural log — only with ``return_attn_probs``
    None — only with ``return_attn_probs``

    Example
    -------
    >>> q = k = v = torch.randn(2, 4096, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> out = flash_attn_func(q, k, v, causal=True)
    """
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_rank(name, t, 4, "[B, Nq, Hq, d]" if name == "q" else "[B, Nk, Hkv, d]")
    mods = _train_mods(causal, window_size, softcap, dropout_p, alibi_slopes, deterministic,
                       return_attn_probs)
    if _eager(q, k, v):
        return _infer(q, k, v, causal, softmax_scale, return_attn_probs, mods)
    return _autograd(_bhnd(q), _bhnd(k), _bhnd(v), causal, softmax_scale, return_attn_probs, mods)


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = _OFF, softmax_scale: float | None = None,
                              causal: bool = False, window_size: tuple[int, int] = _NO_WINDOW,
                              softcap: float = _OFF, alibi_slopes: Tensor | None = None,
                              deterministic: bool = False,
                              return_attn_probs: bool = False) -> Tensor | tuple[Tensor, Tensor, None]:
    """`flash_attn_func` with q, k, v packed: ``qkv`` [B, N, 3, H, d] (q, k, v = qkv.unbind(2), as views).

    Returns out [B, N, H, d] (and, with ``return_attn_probs``, softmax_lse [B, H, N] and None); the
    gradient flows back into ``qkv``."""
    _check_packed("qkv", qkv, 5, 3, "[B, N, 3, H, d]")
    mods = _train_mods(causal, window_size, softcap, dropout_p, alibi_slopes, deterministic,
                       return_attn_probs)
    if _eager(qkv):
        return _infer(*qkv.unbind(2), causal, softmax_scale, return_attn_probs, mods)  # [B, N, H, d] views
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, N, d] views: two ops, not four
    return _autograd(q, k, v, causal, softmax_scale, return_attn_probs, mods)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = _OFF,
                             softmax_scale: float | None = None, causal: bool = False,
                             window_size: tuple[int, int] = _NO_WINDOW,
                             softcap: float = _OFF, alibi_slopes: Tensor | None = None,
                             deterministic: bool = False,
                             return_attn_probs: bool = False) -> Tensor | tuple[Tensor, Tensor, None]:
    """`flash_attn_func` with k, v packed: q [B, Nq, Hq, d], ``kv`` [B, Nk, 2, Hkv, d] (views, no copy).

    Returns out [B, Nq, Hq, d] (and, with ``return_attn_probs``, softmax_lse [B, Hq, Nq] and None)."""
    _check_rank("q", q, 4, "[B, Nq, Hq, d]")
    _check_packed("kv", kv, 5, 2, "[B, Nk, 2, Hkv, d]")
    mods = _train_mods(causal, window_size, softcap, dropout_p, alibi_slopes, deterministic,
                       return_attn_probs)
    if _eager(q, kv):
        return _infer(q, *kv.unbind(2), causal, softmax_scale, return_attn_probs, mods)  # [B, Nk, Hkv, d]
    k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, Hkv, Nk, d] views: two ops, not three
    return _autograd(_bhnd(q), k, v, causal, softmax_scale, return_attn_probs, mods)


# --- varlen --------------------------------------------------------------------------------------
def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = _OFF,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = _NO_WINDOW, softcap: float = _OFF,
                           alibi_slopes: Tensor | None = None, deterministic: bool = False,
                           return_attn_probs: bool = False,
                           block_table: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor, None]:
    """Attention over a packed batch of variable-length sequences (`attnscope.flash_attention_varlen`).

    Parameters
    ----------
    q : torch.Tensor, [total_q, Hq, d]
    k, v : torch.Tensor, [total_k, Hkv, d]
    cu_seqlens_q, cu_seqlens_k : torch.Tensor, int32 [B + 1]
        Cumulative sequence lengths (sequence s owns rows ``cu[s]:cu[s+1]``).
    max_seqlen_q, max_seqlen_k : int
        The longest sequence of each.
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs
        As `flash_attn_func` (causal and windows per sequence, bottom-right aligned).
    deterministic : bool
        As `flash_attn_func`.
    block_table : None
        A paged KV cache in the varlen call is not supported (use `flash_attn_with_kvcache`).

    Returns
    -------
    out : torch.Tensor, [total_q, Hq, d], q's dtype
    softmax_lse : torch.Tensor, [Hq, total_q], float32, natural log — only with ``return_attn_probs``
    None — only with ``return_attn_probs``

    Example
    -------
    >>> cu = torch.tensor([0, 100, 4196], dtype=torch.int32, device="cuda")
    >>> q = k = v = torch.randn(4196, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> out = flash_attn_varlen_func(q, k, v, cu, cu, 4096, 4096, causal=True)
    """
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and q.dim() == 3 and k.dim() == 3 and v.dim() == 3):
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_rank(name, t, 3, "[total_q, Hq, d]" if name == "q" else "[total_k, Hkv, d]")
    mods = _train_mods(causal, window_size, softcap, dropout_p, alibi_slopes, deterministic,
                       return_attn_probs, block_table)
    if _eager(q, k, v):  # flash_attention_varlen's eager launch (its checks) without its wrapper's
        res = _launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                             softmax_scale, return_attn_probs, False, window=mods.get("window"),
                             softcap=mods.get("softcap", 0.0))
        return (*res, None) if return_attn_probs else res[0]
    res = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                 softmax_scale, return_attn_probs, **mods)
    return (*res, None) if return_attn_probs else res


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                     dropout_p: float = _OFF, softmax_scale: float | None = None,
                                     causal: bool = False, window_size: tuple[int, int] = _NO_WINDOW,
                                     softcap: float = _OFF, alibi_slopes: Tensor | None = None,
                                     deterministic: bool = False,
                                     return_attn_probs: bool = False) -> Tensor | tuple[Tensor, Tensor, None]:
    """`flash_attn_varlen_func` with q, k, v packed: ``qkv`` [total, 3, H, d] (``qkv.unbind(1)``, views), one
    ``cu_seqlens`` (int32 [B + 1]) and ``max_seqlen`` for q and k. Returns out [total, H, d] (and, with
    ``return_attn_probs``, softmax_lse [H, total] and None); the gradient flows back into ``qkv``."""
    _check_packed("qkv", qkv, 4, 3, "[total, 3, H, d]")
    return flash_attn_varlen_func(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = _OFF,
                                    softmax_scale: float | None = None, causal: bool = False,
                                    window_size: tuple[int, int] = _NO_WINDOW, softcap: float = _OFF,
                                    alibi_slopes: Tensor | None = None, deterministic: bool = False,
                                    return_attn_probs: bool = False) -> Tensor | tuple[Tensor, Tensor, None]:
    """`flash_attn_varlen_func` with k, v packed: q [total_q, Hq, d], ``kv`` [total_k, 2, Hkv, d] (views).
    Returns out [total_q, Hq, d] (and, with ``return_attn_probs``, softmax_lse [Hq, total_q] and None)."""
    _check_packed("kv", kv, 4, 2, "[total_k, 2, Hkv, d]")
    return flash_attn_varlen_func(q, *kv.unbind(1), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs)


# --- decode with a KV cache ----------------------------------------------------------------------
def _seqlens(cache_seqlens, B: int, device) -> Tensor | None:
    """An int (same length for all) as the int32 [B] tensor the kernel takes."""
    if cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens
    expect(is_int(cache_seqlens) and cache_seqlens >= 0,
           "cache_seqlens", "a non-negative int, an int32 tensor [B] or None", cache_seqlens)
    return torch.full((B,), cache_seqlens, dtype=torch.int32, device=device)


def _check_int_length(cache_seqlens: int, k, nq: int, k_cache, block_table) -> None:
    """An int ``cache_seqlens`` (plus the ``k`` appended, if any) is 0 or from Nq to the cache's capacity, as
    the kernels' device check wants each length (a tensor's values are checked there). A negative one, and
    new keys past the capacity, are named by `_seqlens` and the append."""
    n_new = k.shape[1] if isinstance(k, Tensor) and k.dim() == 4 else 0
    if block_table is None:
        capacity = k_cache.shape[1]
    elif isinstance(block_table, Tensor) and block_table.dim() == 2:
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        return  # the checks name block_table
    total = cache_seqlens + n_new
    if cache_seqlens >= 0 and total != 0 and (total < nq or total > capacity and not n_new):
        got = f"{short(cache_seqlens)} + Nnew = {n_new}" if n_new else short(cache_seqlens)
        raise InputError(f"cache_seqlens: expected 0 or an int from Nq = {nq} to the cache's capacity "
                         f"{capacity}{' (with the new keys)' if n_new else ''}, got {got}")


#: page sizes `_batch_pages` tries, largest first (the paged kernel's)
_BATCH_PAGES = (256, 128, 64, 32, 16)


def _batch_pages(q, k_cache, v_cache, cache_batch_idx, block_table):
    """``cache_batch_idx`` (query row b uses cache row ``cache_batch_idx[b]`` of a dense cache [B_c, L, Hkv,
    d]) as the paged kernels' form: the cache viewed as pages of the largest size in `_BATCH_PAGES` dividing
    L (no copy) and a block table [B, L / page] of row ``cache_batch_idx[b]``'s pages, built on the device. An
    index outside [0, B_c) becomes an entry outside the pages: the call's device check reports it
    (`attnscope.check_errors`), nothing is read or written through it."""
    if block_table is not None:
        raise NotImplementedError("cache_batch_idx: supported with a dense cache [B_c, L, Hkv, d] (as "
                                  "flash-attn), got a block_table too")
    B = q.shape[0]
    if not (isinstance(cache_batch_idx, Tensor) and cache_batch_idx.dtype in (torch.int32, torch.int64)
            and tuple(cache_batch_idx.shape) == (B,) and cache_batch_idx.device == q.device):
        got = (f"{cache_batch_idx.dtype} of shape {tuple(cache_batch_idx.shape)} on {cache_batch_idx.device}"
               if isinstance(cache_batch_idx, Tensor) else _short(cache_batch_idx))
        raise InputError(f"cache_batch_idx: expected an int32 or int64 tensor [B = {B}] on {q.device}, got "
                         f"{got}")
    if k_cache.shape != v_cache.shape:
        raise InputError(f"v_cache: expected k_cache's shape {tuple(k_cache.shape)}, got "
                         f"{tuple(v_cache.shape)}")
    rows, L, hkv, d = k_cache.shape
    page = next((p for p in _BATCH_PAGES if L % p == 0), None)
    if page is None:
        raise NotImplementedError(f"cache_batch_idx: supported with a cache length L that is a multiple of "
                                  f"{_BATCH_PAGES[-1]} (the paged kernel's pages), got L = {L}")
    pages = []
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        st = t.stride()
        if st[0] != L * st[1]:
            raise NotImplementedError(f"cache_batch_idx: supported with a cache whose rows follow each other "
                                      f"(stride(0) = L x stride(1)); {name} has strides {tuple(st)}")
        pages.append(t.as_strided((rows * L // page, page, hkv, d), (page * st[1], st[1], st[2], st[3])))
    per_row = L // page
    idx = cache_batch_idx.to(torch.int64)
    table = idx[:, None] * per_row + torch.arange(per_row, device=q.device)
    table = torch.where(((idx >= 0) & (idx < rows))[:, None], table, -1).to(torch.int32)  # no wrap-around
    return pages[0], pages[1], table


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor | None = None,
                            v: Tensor | None = None, rotary_cos: Tensor | None = None,
                            rotary_sin: Tensor | None = None, cache_seqlens: int | Tensor | None = None,
                            cache_batch_idx: Tensor | None = None, cache_leftpad: Tensor | None = None,
                            block_table: Tensor | None = None, softmax_scale: float | None = None,
                            causal: bool = False, window_size: tuple[int, int] = _NO_WINDOW,
                            softcap: float = _OFF, rotary_interleaved: bool = True,
                            alibi_slopes: Tensor | None = None, num_splits: int = 0,
                            return_softmax_lse: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Decode / chunked prefill against a KV cache, appending new keys and values first (in place).

    If ``k`` and ``v`` are given they are written into ``k_cache`` / ``v_cache`` at positions
    ``cache_seqlens[b] .. cache_seqlens[b] + Nnew - 1`` of each sequence (one launch for all sequences,
    `attnscope.kernels.decode.kv_append`), then the Nq queries attend to the first ``cache_seqlens[b] +
    Nnew`` keys (``cache_seqlens[b]`` without new keys; the whole cache without ``cache_seqlens``) through
    `attnscope.flash_decode`. The queries are the last Nq positions of each sequence; with Nq > 1 they are
    causal among themselves. No backward (as flash-attn). No value is read back to the host (the call can
    be captured in a CUDA graph): an int ``cache_seqlens`` that leaves no room for the new keys is refused
    before anything is written; a tensor's values are checked on the device, as `attnscope.flash_decode`
    checks its inputs: a sequence whose new keys do not fit (a length below 0 or above the capacity minus
    Nnew) or would go to a block-table entry outside [0, num_pages) is not written, its output is not its
    attention, and `attnscope.kernels.decode.check_errors` raises for the call (paged: a slot that new
    keys of two sequences target in one call keeps either value).

    Parameters
    ----------
    q : torch.Tensor, [B, Nq, Hq, d]
        fp16 or bf16, d a multiple of 8 up to 256.
    k_cache, v_cache : torch.Tensor
        Dense ``[B, L, Hkv, d]``, or paged ``[num_pages, page_size, Hkv, d]`` with ``block_table``
        (page_size in {16, 32, 64, 128, 256}); q's dtype.
    k, v : torch.Tensor, [B, Nnew, Hkv, d], optional
        New keys and values to append (both or neither; needs ``cache_seqlens``).
    rotary_cos, rotary_sin : torch.Tensor, [seqlen_ro, rotary_dim / 2], optional
        Rotary embedding (both or neither; q's dtype and device; rotary_dim <= d; needs ``k``, ``v`` and
        ``cache_seqlens``): the new keys are rotated at their cache positions ``cache_seqlens[b] + j``
        before they are appended, and query j at ``cache_seqlens[b] + j`` (flash-attn: with Nq = 1 and
        neither causal nor local, at ``cache_seqlens[b]``: the same position). Computed in fp32 with
        torch ops, cast back; dims past rotary_dim are left as they are. An int ``cache_seqlens`` whose
        positions pass seqlen_ro is refused; a tensor's positions are clamped into the tables (a valid
        length needs seqlen_ro > its last position; an invalid one is recorded by the append).
    rotary_interleaved : bool
        True: rotate dims (0, 1), (2, 3), ... (GPT-J); False: dims i and i + rotary_dim / 2 (GPT-NeoX).
    cache_batch_idx : torch.Tensor, int32 or int64 [B], optional
        Query row b uses row ``cache_batch_idx[b]`` of a dense cache ``[B_c, L, Hkv, d]`` (L a multiple of
        16, rows stride(0) = L x stride(1) apart): the cache read, and written by an append, through the
        paged kernels (`_batch_pages`, no copy); an index outside [0, B_c) is reported by
        `attnscope.check_errors`, never followed. With duplicate indices and new keys, which row's keys a
        shared slot keeps is unspecified (as flash-attn).
    cache_leftpad : torch.Tensor, int32 [B], optional
        A dense cache only (without rotary or cache_batch_idx): sequence b's keys start at
        ``cache_leftpad[b]``, the positions before it are left padding, never attended (`flash_decode`'s
        ``cache_leftpad``); new keys still go to ``cache_seqlens[b]``.
    alibi_slopes : None
        Not supported (NotImplementedError).
    cache_seqlens : int or torch.Tensor int32 [B], optional
        Keys already in the cache per sequence.
    block_table : torch.Tensor, int32 [B, max_pages], optional
        The page of each block of page_size keys of each sequence.
    softmax_scale : float, optional
        Defaults to ``1/sqrt(d)``.
    causal : bool
        With Nq > 1 only True is supported (the chunked-prefill kernel is causal); with Nq = 1 either.
    window_size, softcap
        As `flash_attn_func`.
    num_splits : int
        KV splits per sequence; 0 picks them by the kernel's heuristic.
    return_softmax_lse : bool
        Also return the natural-log LSE.

    Returns
    -------
    out : torch.Tensor, [B, Nq, Hq, d], q's dtype
    softmax_lse : torch.Tensor, [B, Hq, Nq], float32 — only with ``return_softmax_lse``

    Example
    -------
    >>> k_cache = v_cache = torch.zeros(4, 8192, 8, 128, device="cuda", dtype=torch.bfloat16)
    >>> lens = torch.tensor([100, 0, 5000, 7], dtype=torch.int32, device="cuda")
    >>> out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens, causal=True)
    """
    if not (isinstance(q, Tensor) and isinstance(k_cache, Tensor) and isinstance(v_cache, Tensor)
            and q.dim() == 4 and k_cache.dim() == 4 and v_cache.dim() == 4):
        _check_rank("q", q, 4, "[B, Nq, Hq, d]")
        layout = "[num_pages, page_size, Hkv, d]" if block_table is not None else "[B, L, Hkv, d]"
        _check_rank("k_cache", k_cache, 4, layout)
        _check_rank("v_cache", v_cache, 4, layout)
    if alibi_slopes is not None:
        _unsupported(alibi_slopes=(alibi_slopes, None))
    if cache_leftpad is not None and (cache_batch_idx is not None or rotary_cos is not None
                                      or rotary_sin is not None):
        other = "cache_batch_idx" if cache_batch_idx is not None else "rotary_cos/rotary_sin"
        raise NotImplementedError(f"cache_leftpad: supported without {other} (a dense cache, keys at their "
                                  f"cache positions)")
    if cache_batch_idx is not None:  # the dense cache's rows as pages, in q's batch order
        k_cache, v_cache, block_table = _batch_pages(q, k_cache, v_cache, cache_batch_idx, block_table)
    if not (type(rotary_interleaved) is bool and type(num_splits) is int and num_splits >= 0
            and type(return_softmax_lse) is bool):
        expect(isinstance(rotary_interleaved, bool), "rotary_interleaved", "True or False",
               rotary_interleaved)
        expect(is_int(num_splits) and num_splits >= 0,
               "num_splits", "an int >= 0 (0: the kernel's heuristic)", num_splits)
        expect(isinstance(return_softmax_lse, bool), "return_softmax_lse", "True or False",
               return_softmax_lse)
    if window_size is _NO_WINDOW and softcap is _OFF and (causal is True or causal is False):  # the defaults
        mods = {}
    else:
        mods = {} if _defaults(causal, window_size, softcap, _OFF) else _decode_mods(causal, window_size,
                                                                                      softcap)
    nq = q.shape[1]
    if nq > 1 and not causal:
        raise NotImplementedError(f"causal: with Nq > 1 new queries only causal=True is supported (the "
                                  f"chunked kernel is causal among the new queries), got causal=False and "
                                  f"Nq = {nq}")
    if type(cache_seqlens) is int:  # known on the host: checked before anything is written
        _check_int_length(cache_seqlens, k, nq, k_cache, block_table)
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary:
        check_rotary(q, k, rotary_cos, rotary_sin, cache_seqlens)
    if (k is None) != (v is None):
        raise InputError(f"{'v' if k is not None else 'k'}: expected a tensor when "
                         f"{'k' if k is not None else 'v'} is given (append both or neither), got None")
    if k is not None:  # what the kernel would refuse after the append is refused before it
        check_tensor(torch, "q", q, 4, "[B, Nq, Hq, d]")
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dtype != q.dtype or t.shape[3] != q.shape[3] or t.device != q.device:
                raise InputError(f"{name}: expected q's dtype {q.dtype}, head_dim {q.shape[3]} and device "
                                 f"{q.device}, got {t.dtype}, {t.shape[3]}, {t.device}")
        if rotary:
            q, k = apply_rotary(q, k, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved)
        # the lengths after it: int32 [B]; an int stays an int where `_attend` takes one (no tensor made)
        int_length = type(cache_seqlens) is int and block_table is None and q.shape[1] == 1
        after = cache_seqlens + k.shape[1] if type(cache_seqlens) is int else cache_seqlens
        found = []  # the attention's kept plan, looked up once
        check = functools.partial(_check_attention, q, k_cache, v_cache, after, block_table,
                                  num_splits or None, softmax_scale, return_softmax_lse, mods, nq == 1,
                                  cache_leftpad, found)
        lengths = _append(k_cache, v_cache, k, v, cache_seqlens, block_table, not int_length, check)
        if found:  # planned on the lengths' layout: the int itself, or a tensor laid out as the new one
            _, lens, tensors, grown, plan = found[0]
            if lengths is None or _layout(lens) == _layout(lengths):
                tensors = tensors if lengths is None else (*tensors[:3], lengths, *tensors[4:])
                return _launch_planned(plan, tensors, grown, nq == 1, return_softmax_lse)
        cache_seqlens = cache_seqlens + k.shape[1] if lengths is None else lengths
    return _attend(q, k_cache, v_cache, cache_seqlens, block_table, num_splits or None, softmax_scale,
                   return_softmax_lse, mods, nq == 1, cache_leftpad)


def _decode_mods(causal, window_size, softcap) -> dict:
    """`_mods` for queries that are their sequence's last positions: no key lies to their right, so a window
    is (left, 0)."""
    mods = _mods(causal, window_size, softcap)
    left = mods.pop("window", (-1, 0))[0]
    if left != -1:
        mods["window"] = (left, 0)
    return mods


def _kernel_layout(t, shape=None):
    """(shape, strides, dtype, device) of ``_bhnd(t)`` for a 4-D ``t``, the view not made (``shape``: the
    view's, given). Unpacked and re-packed in place: a call of every decode step (an itemgetter per tuple
    cost ~0.2 us more)."""
    n0, n1, n2, n3 = t.shape
    s0, s1, s2, s3 = t.stride()
    return shape or (n0, n2, n1, n3), (s0, s2, s1, s3), t.dtype, t.device


def _planned(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, return_lse, mods, nq1,
             cache_leftpad=None):
    """`_attend`'s plan lookup: (length, cache_seqlens, tensors, grown, plan); plan None where none is kept
    for the call's layout (then the checks run at the launch) or under torch.compile."""
    dense = block_table is None
    compiling = torch.compiler.is_compiling()
    length = None  # keys every sequence attends to, in place of an int cache_seqlens
    if type(cache_seqlens) is int and dense and nq1 and not compiling and cache_seqlens > 0 \
            and cache_seqlens <= (shape := k_cache.shape)[1] and shape == v_cache.shape:  # (else the checks)
        length, cache_seqlens = cache_seqlens, None
    elif not (cache_seqlens is None or isinstance(cache_seqlens, Tensor)):
        cache_seqlens = _seqlens(cache_seqlens, q.shape[0], q.device)
    if compiling or not (dense or isinstance(block_table, Tensor)):
        return length, cache_seqlens, None, None, None
    window, softcap = (mods.get("window"), mods.get("softcap", 0.0)) if mods else (None, 0.0)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, None, None, None, cache_leftpad)
    lens = None if cache_seqlens is None else \
        (cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype, cache_seqlens.device)
    if dense:  # with a length, the views [:, :length]
        shape = None if length is None else (shape[0], shape[2], length, shape[3])
        kv = (_kernel_layout(k_cache, shape), _kernel_layout(v_cache, shape), lens, None)
    else:
        kv = (_layout(k_cache), _layout(v_cache), lens, _layout(block_table))
    layouts = (_kernel_layout(q), *kv, None, None, None, None if cache_leftpad is None else (
        (cache_leftpad.shape, cache_leftpad.stride(), cache_leftpad.dtype, cache_leftpad.device)
        if isinstance(cache_leftpad, Tensor) else False))
    _, grown, plan = _cached(tensors, layouts, (num_splits, scale, return_lse, window, softcap))
    return length, cache_seqlens, tensors, grown, plan


def _check_attention(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, return_lse, mods,
                     nq1, cache_leftpad, found: list) -> None:
    """Refuse, before anything is written, what `_attend` would refuse with these arguments (the lengths
    after the append): a layout with a kept plan passed its checks when planned (`_planned`'s answer goes
    to ``found``, for the launch after the append); another runs them."""
    length, lens, plan = None, None, None  # an int the append turns into a tensor: the checks, no tensor made
    if type(cache_seqlens) is not int or (block_table is None and nq1):
        planned = _planned(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, return_lse,
                           mods, nq1, cache_leftpad)
        length, lens, _, _, plan = planned
        if plan is not None:
            found.append(planned)
    if plan is None:
        if block_table is None:  # [B, L, Hkv, d] -> [B, Hkv, L, d], views
            k_cache, v_cache = _bhnd(k_cache[:, :length]), _bhnd(v_cache[:, :length])
        window, softcap = mods.get("window"), mods.get("softcap", 0.0)
        _check_inputs(_bhnd(q), k_cache, v_cache, lens, block_table, num_splits, scale, window=window,
                      softcap=softcap, cache_leftpad=cache_leftpad)


def _launch_planned(plan, tensors, grown, nq1: bool, return_lse: bool):
    """A kept plan's launch on flash-attn's tensors: o [B, Nq, Hq, d] (and the LSE)."""
    res = plan._launch(tensors, None, None, grown, nq1)  # (out, lse_out, grown, heads_last)
    if nq1:
        return res
    return (_bhnd(res[0]), res[1]) if return_lse else _bhnd(res)


def _attend(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, return_lse, mods, nq1,
            cache_leftpad=None):
    """`flash_decode` on flash-attn's layouts: q [B, Nq, Hq, d], a dense cache [B, L, Hkv, d] (`_bhnd`
    views) or a paged one; o [B, Nq, Hq, d] (with ``return_lse`` also the LSE [B, Hq, Nq]).

    An int ``cache_seqlens`` in 1 .. L of a dense cache with one query per sequence attends to every
    sequence's first that many keys: the cache's first that many positions with no lengths (a plan keeps a
    dense one-query cache's length a launch argument, so one plan serves every such int); another int is
    the int32 [B] tensor `_seqlens`. Outside torch.compile a layout `flash_decode` has planned (`api._cached`,
    given the views' layouts) launches on the tensors as they are: no view is made, and with Nq = 1 o is
    allocated in flash-attn's layout (the same memory as the kernel's [B, Hq, 1, d])."""
    length, cache_seqlens, tensors, grown, plan = _planned(q, k_cache, v_cache, cache_seqlens, block_table,
                                                           num_splits, scale, return_lse, mods, nq1,
                                                           cache_leftpad)
    if plan is not None:
        return _launch_planned(plan, tensors, grown, nq1, return_lse)
    if length is not None:
        k_cache, v_cache = k_cache[:, :length], v_cache[:, :length]
    if block_table is None:  # [B, L, Hkv, d] -> [B, Hkv, L, d], views
        k_cache, v_cache = _bhnd(k_cache), _bhnd(v_cache)
    res = flash_decode(_bhnd(q), k_cache, v_cache, cache_seqlens, block_table, num_splits=num_splits,
                       scale=scale, return_lse=return_lse, cache_leftpad=cache_leftpad, **mods)
    if not return_lse:
        return _bhnd(res)
    o, lse = res
    return _bhnd(o), lse
