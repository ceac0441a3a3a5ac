"""The logsumexp merge of partial attention outputs (Flash-Decoding's combine; ring attention's step).

Two partial results of the same queries over disjoint key sets, each normalised over its own keys
(``o_s`` and its natural-log logsumexp ``lse_s``), combine exactly (FlashAttention-2 §3.1 online
softmax, applied across blocks instead of tiles; Flash-Decoding's reduction; spec §6.1):

    lse = log(exp(lse_a) + exp(lse_b))
    o   = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

It is the same formula as `attnscope.reference.combine` (float64, the readable spec). A partial that
saw no permitted key has ``lse = -inf`` and weight 0; when both are -inf the row stays o = 0,
lse = -inf (no NaN). decode.py's in-kernel split merge applies the same formula inside its kernel;
the ring (`attnscope.distributed`) calls this function.

Layout: o [B, H, N, d] (any leading dims), lse [B, H, N]; the accumulator is fp32 (caller's choice of
dtype, fp32 recommended); the partial may be fp16/bf16 and is upcast. Plain torch: runs on CPU and GPU.
"""

from __future__ import annotations

from attnscope.errors import InputError


def merge_(o, lse, o_part, lse_part):
    """Merge a partial (o_part, lse_part) into the accumulator (o, lse), in place.

    Parameters
    ----------
    o : torch.Tensor, [..., N, d], float32 accumulator (updated in place)
    lse : torch.Tensor, [..., N], float32 (updated in place); -inf where nothing was seen yet
    o_part : torch.Tensor, [..., N, d], any float dtype (upcast to o's dtype)
    lse_part : torch.Tensor, [..., N], natural-log logsumexp of the partial

    Returns
    -------
    (o, lse): the same tensors, updated.

    Example
    -------
    >>> o = torch.zeros(1, 2, 5, 64); lse = torch.full((1, 2, 5), -float("inf"))
    >>> merge_(o, lse, *attnscope.flash_attention(q, k1, v1, return_lse=True))
    """
    import torch

    if tuple(o.shape) != tuple(o_part.shape):
        raise InputError(f"o_part: expected shape {tuple(o.shape)}, got {tuple(o_part.shape)}")
    if tuple(lse.shape) != tuple(o.shape[:-1]) or tuple(lse_part.shape) != tuple(lse.shape):
        raise InputError(f"lse_part: expected shape {tuple(o.shape[:-1])} (o without d), "
                         f"got lse {tuple(lse.shape)}, lse_part {tuple(lse_part.shape)}")
    lp = lse_part.to(lse.dtype)
    new = torch.logaddexp(lse, lp)  # [..., N]; -inf only when both are -inf
    safe = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    w_old = torch.exp(lse - safe).unsqueeze(-1)  # exp(-inf) = 0 for an empty side
    w_new = torch.exp(lp - safe).unsqueeze(-1)
    o.mul_(w_old).add_(w_new * o_part.to(o.dtype))
    lse.copy_(new)
    return o, lse


def merge(o, lse, o_part, lse_part):
    """Functional `merge_`: returns a new (o, lse) in float32, inputs untouched."""
    return merge_(o.float().clone(), lse.float().clone(), o_part, lse_part)
