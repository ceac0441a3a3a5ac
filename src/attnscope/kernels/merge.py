"""The logsumexp merge of partial attention outputs (Flash-Decoding's combine; ring attention's step).

Two partial results of the same queries over disjoint key sets, each normalised over its own keys
(``o_s`` and its natural-log logsumexp ``lse_s``), combine exactly (FlashAttention-2 §3.1 online
softmax, applied across blocks instead of tiles; Flash-Decoding's reduction; spec §6.1):

    lse = log(exp(lse_a) + exp(lse_b))
    o   = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

The float64 spec is `attnscope.reference.combine`. One implementation serves every caller: the
``@triton.jit`` helpers `lse_merge_step` / `lse_merge_finish` in kernels/_tl.py, which decode's split
merge (kernels/decode/) runs inside its kernels and `merge_` runs in `_attnscope_merge_kernel`
below (the ring, `attnscope.distributed`, calls `merge_`). A partial that saw no permitted key has
``lse = -inf`` and weight 0; when both are -inf the row stays o = 0, lse = -inf (no NaN).

Layout: o [..., N, d] (any strides, unit last, up to 4 dims; more when the leading ones can be viewed
as one), lse [..., N]; the accumulator is float32; the partial may be fp16/bf16/fp32 and is upcast.
The kernel runs on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1 (the CPU tests, the gloo
ring); CPU tensors without the interpreter cannot run a Triton kernel and use the same formula in torch.
"""

from __future__ import annotations

from attnscope.errors import InputError
from attnscope.kernels._common import import_torch_triton, interpreting

# The kernel resolves its helpers as module globals (Triton's JIT reads globals, not closures); _tl
# imports triton, or raises ImportError with the install command.
from attnscope.kernels._tl import lse_merge_finish, lse_merge_step, triton

tl = triton.language

BLOCK_R = 16  # rows per program


@triton.jit
def _attnscope_merge_kernel(
    O, LSE, O_PART, LSE_PART,
    stride_oa, stride_oh, stride_on,  # o [A, H, N, d] (unit last stride), likewise below
    stride_la, stride_lh, stride_ln,
    stride_pa, stride_ph, stride_pn,
    stride_qa, stride_qh, stride_qn,  # lse_part
    n_heads, n_rows, head_dim, n_row_blocks,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)  # (a * H + h) * row blocks + row block
    pid_ah = pid // n_row_blocks
    a = (pid_ah // n_heads).to(tl.int64)
    h = (pid_ah % n_heads).to(tl.int64)
    offs_r = (pid % n_row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R] rows
    offs_d = tl.arange(0, BLOCK_D)
    r_mask = offs_r < n_rows
    rd_mask = r_mask[:, None] & (offs_d < head_dim)[None, :]
    o_ptr = O + a * stride_oa + h * stride_oh + offs_r[:, None] * stride_on + offs_d[None, :]
    l_ptr = LSE + a * stride_la + h * stride_lh + offs_r * stride_ln
    # the accumulator as a merge state: (m, l, acc) = (lse, 1, o), or (-inf, 0, o) if empty
    lse = tl.load(l_ptr, mask=r_mask, other=float("-inf")).to(tl.float32) * 1.4426950408889634  # log2(e)
    m_i = lse  # [BLOCK_R] base 2
    l_i = tl.where(lse == float("-inf"), 0.0, 1.0)
    acc = tl.load(o_ptr, mask=rd_mask, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_D]
    # the partial: one more partial on the axis the helper merges over ([BLOCK_R, 1] and [BLOCK_R, 1, d])
    lse_p = tl.load(LSE_PART + a * stride_qa + h * stride_qh + offs_r * stride_qn, mask=r_mask,
                    other=float("-inf")).to(tl.float32) * 1.4426950408889634
    o_p = tl.load(O_PART + a * stride_pa + h * stride_ph + offs_r[:, None] * stride_pn + offs_d[None, :],
                  mask=rd_mask, other=0.0).to(tl.float32)
    m_i, l_i, acc = lse_merge_step(m_i, l_i, acc, lse_p[:, None], o_p[:, None, :], 1)
    o, lse2 = lse_merge_finish(m_i, l_i, acc)
    tl.store(o_ptr, o.to(O.dtype.element_ty), mask=rd_mask)
    tl.store(l_ptr, (lse2 * 0.6931471805599453).to(LSE.dtype.element_ty), mask=r_mask)  # ln(2)


def _as_4d(name, t, rank_extra):
    """A view of ``t`` [..., N(, d)] with exactly 4 (o) or 3 (lse) dims: leading 1s added, or the
    leading dims viewed as one; NotImplementedError if they cannot be (a copy would break in-place)."""
    want = 3 + rank_extra
    if t.dim() < want:
        return t[(None,) * (want - t.dim())]  # leading size-1 dims: always a view
    if t.dim() == want:
        return t
    try:
        return t.view(-1, *t.shape[t.dim() - want + 1:])
    except RuntimeError as e:
        raise NotImplementedError(f"{name}: its leading dimensions {tuple(t.shape[:-want + 1])} cannot be "
                                  f"viewed as one; supported: up to {want} dims, or leading dims that "
                                  f"can be flattened without a copy") from e


def merge_(o, lse, o_part, lse_part):
    """Merge a partial (o_part, lse_part) into the accumulator (o, lse), in place.

    Parameters
    ----------
    o : torch.Tensor, [..., N, d], float32 accumulator (updated in place); unit last stride
    lse : torch.Tensor, [..., N], float32 (updated in place); -inf where nothing was seen yet
    o_part : torch.Tensor, [..., N, d], float32, float16 or bfloat16 (upcast); unit last stride
    lse_part : torch.Tensor, [..., N], natural-log logsumexp of the partial; -inf for no key

    All four on one device: CUDA, or CPU (the Triton interpreter under TRITON_INTERPRET=1, else torch).

    Returns
    -------
    (o, lse): the same tensors, updated.

    Example
    -------
    >>> o = torch.zeros(1, 2, 5, 64); lse = torch.full((1, 2, 5), -float("inf"))
    >>> merge_(o, lse, *attnscope.flash_attention(q, k1, v1, return_lse=True))
    """
    torch, _ = import_torch_triton()

    for name, t in (("o", o), ("lse", lse), ("o_part", o_part), ("lse_part", lse_part)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if o.dim() < 2:
        raise InputError(f"o: expected a tensor [..., N, d], got shape {tuple(o.shape)}")
    if tuple(o.shape) != tuple(o_part.shape):
        raise InputError(f"o_part: expected shape {tuple(o.shape)}, got {tuple(o_part.shape)}")
    if tuple(lse.shape) != tuple(o.shape[:-1]) or tuple(lse_part.shape) != tuple(lse.shape):
        raise InputError(f"lse_part: expected shape {tuple(o.shape[:-1])} (o without d), "
                         f"got lse {tuple(lse.shape)}, lse_part {tuple(lse_part.shape)}")
    for name, t in (("o", o), ("lse", lse)):
        if t.dtype != torch.float32:
            raise InputError(f"{name}: expected dtype torch.float32 (the accumulator), got {t.dtype}")
    for name, t in (("o_part", o_part), ("lse_part", lse_part)):
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InputError(f"{name}: expected a float32, float16 or bfloat16 tensor, got {t.dtype}")
    for name, t in (("o_part", o_part), ("lse_part", lse_part), ("lse", lse)):
        if t.device != o.device:
            raise InputError(f"{name}: expected device {o.device} (as o), got {t.device}")
    if o.numel() == 0:
        return o, lse
    if o.device.type == "cpu" and not interpreting():
        # Triton compiles only for GPUs, and its CPU interpreter must be chosen before triton is imported
        # (TRITON_INTERPRET=1): a CPU run without it (e.g. the ring over gloo) evaluates the same formula
        # in torch, in float32 like the kernel.
        lp = lse_part.float()
        new = torch.logaddexp(lse, lp)  # [..., N]; -inf only when both are -inf
        safe = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
        o.mul_(torch.exp(lse - safe).unsqueeze(-1)).add_(torch.exp(lp - safe).unsqueeze(-1) * o_part.float())
        lse.copy_(new)
        return o, lse
    for name, t in (("o", o), ("o_part", o_part)):
        if t.stride(-1) != 1:
            raise InputError(f"{name}: expected unit stride in the last (d) dimension, got strides "
                             f"{tuple(t.stride())}")
    o4, p4 = _as_4d("o", o, 1), _as_4d("o_part", o_part, 1)
    l3, q3 = _as_4d("lse", lse, 0), _as_4d("lse_part", lse_part, 0)
    A, H, N, d = o4.shape
    row_blocks = -(-N // BLOCK_R)
    _attnscope_merge_kernel[(A * H * row_blocks,)](
        o4, l3, p4, q3, *o4.stride()[:3], *l3.stride(), *p4.stride()[:3], *q3.stride(), H, N, d, row_blocks,
        BLOCK_R=BLOCK_R, BLOCK_D=max(16, 1 << (d - 1).bit_length()))
    return o, lse


def merge(o, lse, o_part, lse_part):
    """Functional `merge_`: returns a new (o, lse) in float32, inputs untouched."""
    return merge_(o.float().clone(), lse.float().clone(), o_part, lse_part)


__all__ = ["merge", "merge_"]
