"""flash-attn's rotary embedding for `flash_attn_with_kvcache` (``rotary_cos`` / ``rotary_sin``): q and the
new keys rotated at their cache positions with torch ops, before the append and the attention."""

from __future__ import annotations

from attnscope.errors import InputError, expect, is_int, short
from attnscope.kernels._common import check_rank, import_torch_triton

torch, _ = import_torch_triton()
Tensor = torch.Tensor


def check_rotary(q, k, rotary_cos, rotary_sin, cache_seqlens) -> None:
    """The rotary tables' metadata (no value is read): both given, with new keys, [seqlen_ro, rotary_dim / 2]
    of q's dtype and device, rotary_dim <= d; ``k`` [B, Nnew, Hkv, d] of q's batch, head dim and dtype;
    ``cache_seqlens`` the positions' base (an int >= 0 or an int32 [B] tensor on q's device); an int leaves
    every position used inside the tables."""
    for name, t, other in (("rotary_cos", rotary_cos, "rotary_sin"),
                           ("rotary_sin", rotary_sin, "rotary_cos")):
        if not isinstance(t, Tensor):
            raise InputError(f"{name}: expected a tensor [seqlen_ro, rotary_dim / 2] (with {other}: both or "
                             f"neither), got {short(t)}")
    if k is None:
        raise InputError("k: expected new keys with rotary_cos / rotary_sin (as flash-attn, rotary applies "
                         "to the new keys and the queries), got None")
    B, Nq, _, d = q.shape
    check_rank(torch, "k", k, 4, "[B, Nnew, Hkv, d]")
    if k.shape[0] != B or k.shape[3] != d or k.dtype != q.dtype:
        raise InputError(f"k: expected batch {B}, head_dim {d} and dtype {q.dtype} (q's), got "
                         f"{k.shape[0]}, {k.shape[3]}, {k.dtype}")
    check_rank(torch, "rotary_cos", rotary_cos, 2, "[seqlen_ro, rotary_dim / 2]")
    if not (0 < 2 * rotary_cos.shape[1] <= d and rotary_cos.shape[0] > 0):
        raise InputError(f"rotary_cos: expected [seqlen_ro, rotary_dim / 2] with seqlen_ro > 0 and 0 < "
                         f"rotary_dim <= head_dim = {d}, got shape {tuple(rotary_cos.shape)}")
    if rotary_sin.shape != rotary_cos.shape:
        raise InputError(f"rotary_sin: expected rotary_cos's shape {tuple(rotary_cos.shape)}, got "
                         f"{tuple(rotary_sin.shape)}")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if t.dtype != q.dtype or t.device != q.device:
            raise InputError(f"{name}: expected q's dtype {q.dtype} and device {q.device}, got {t.dtype}, "
                             f"{t.device}")
    if isinstance(cache_seqlens, Tensor):
        if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (B,) \
                or cache_seqlens.device != q.device:
            raise InputError(f"cache_seqlens: expected an int32 tensor [{B}] on {q.device}, got "
                             f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)} on {cache_seqlens.device}")
        return
    expect(is_int(cache_seqlens) and cache_seqlens >= 0, "cache_seqlens",
           "the current cache lengths with rotary (a non-negative int or an int32 tensor [B])", cache_seqlens)
    last = cache_seqlens + max(k.shape[1], Nq) - 1
    if last >= rotary_cos.shape[0]:
        raise InputError(f"rotary_cos: expected seqlen_ro > {last} (the last position rotated: cache_seqlens "
                         f"{cache_seqlens} + max(Nnew, Nq) - 1), got seqlen_ro = {rotary_cos.shape[0]}")


def _rotate(x: Tensor, pos: Tensor, rotary_cos: Tensor, rotary_sin: Tensor, interleaved: bool) -> Tensor:
    """x [B, N, H, d] rotated at positions ``pos`` [B, N] (flash-attn's rotary, in fp32, cast back); the
    dims past rotary_dim as they are. interleaved: pairs (2i, 2i + 1) (GPT-J); else (i, i + rotary_dim / 2)
    (GPT-NeoX)."""
    half = rotary_cos.shape[1]
    cos = rotary_cos[pos].float()[:, :, None]  # [B, N, 1, rotary_dim / 2]
    sin = rotary_sin[pos].float()[:, :, None]
    xr = x[..., :2 * half].float()
    x1, x2 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., :half], xr[..., half:])
    y1, y2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    y = torch.stack((y1, y2), -1).flatten(-2) if interleaved else torch.cat((y1, y2), -1)
    return torch.cat((y.to(x.dtype), x[..., 2 * half:]), -1)


def apply_rotary(q, k, rotary_cos, rotary_sin, cache_seqlens, interleaved) -> tuple[Tensor, Tensor]:
    """q and the new keys k rotated at their cache positions, as flash-attn: key j at ``cache_seqlens[b] +
    j``; query j at ``cache_seqlens[b] + j`` when causal or local, else all at ``cache_seqlens[b]`` — the
    same here, where Nq > 1 is causal. A tensor's positions stay on the device: one past the tables (its
    length is out of range, which the append records) is clamped to the tables' last row."""
    n = max(q.shape[1], k.shape[1])
    j = torch.arange(n, dtype=torch.int32, device=q.device)
    base = cache_seqlens[:, None] if isinstance(cache_seqlens, Tensor) else \
        torch.full((q.shape[0], 1), cache_seqlens, dtype=torch.int32, device=q.device)
    pos = (base + j).clamp_(0, rotary_cos.shape[0] - 1).long()  # [B, max(Nq, Nnew)]
    return (_rotate(q, pos[:, :q.shape[1]], rotary_cos, rotary_sin, interleaved),
            _rotate(k, pos[:, :k.shape[1]], rotary_cos, rotary_sin, interleaved))
