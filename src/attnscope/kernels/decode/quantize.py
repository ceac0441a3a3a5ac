"""FP8 (e4m3) KV cache quantisation with per-head or per-tensor amax scales, for `flash_decode`."""

from __future__ import annotations

from attnscope.errors import InputError, expect
from attnscope.kernels._common import check_flags, import_torch_triton
from attnscope.kernels.decode._kernel import E4M3_MAX as _E4M3_MAX
from attnscope.kernels.decode._kernel import ERR_QUANTIZE
from attnscope.kernels.decode.checks import _check_no_grad, _error_word

torch, _ = import_torch_triton()

E4M3_MAX = _E4M3_MAX.value  # the largest finite torch.float8_e4m3fn
CHUNK_ELEMENTS = 1 << 26  # elements converted at a time (256 MiB of fp32 temporaries)


def quantize_kv(x: torch.Tensor, per_head: bool = True, *, head_axis: int = -3,
                check_finite: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a K or V cache (or new tokens) to ``torch.float8_e4m3fn`` with amax scales.

    ``scale = amax(|x|) / 448`` over each kv head (``per_head``) or the whole tensor, 1 where that quotient
    is 0 (an amax of 0, or an fp32 one below 448 x its smallest subnormal: those values round to 0), never 0;
    ``x_fp8 = x / scale`` rounded to nearest e4m3. Dequantised, ``x_fp8.float() * scale`` (per head:
    broadcast along ``head_axis``) is what `flash_decode` attends to with ``k_scale`` / ``v_scale``.
    No backward: an ``x`` that requires grad (with grad mode on) raises NotImplementedError, as decode does.
    No host sync: NaN or inf in ``x`` (which make its head's scale NaN or inf) is recorded on the device
    and raised by the next `attnscope.kernels.decode.check_errors` (a `flash_decode` with such a scale
    records that too), unless ``check_finite``.

    Parameters
    ----------
    x : torch.Tensor, float16 / bfloat16 / float32, e.g. a dense cache [B, Hkv, L, d] (head axis -3, the
        default) or a paged cache [num_pages, page_size, Hkv, d] (pass ``head_axis=-2``).
    per_head : bool
        One scale per kv head ([Hkv]) or one for the tensor (0-d).
    head_axis : int
        The kv-head axis of ``x`` (``per_head`` only).
    check_finite : bool
        Read back whether ``x`` is finite and raise `InputError` here if not: a host sync (default False:
        recorded on the device only).

    Returns
    -------
    x_fp8 : torch.Tensor, float8_e4m3fn, x's shape
    scale : torch.Tensor, float32, [Hkv] or 0-d, on x's device

    Example
    -------
    >>> k8, k_scale = attnscope.quantize_kv(k)  # k [B, Hkv, L, d] bf16
    >>> o = attnscope.flash_decode(q, k8, v8, lens, k_scale=k_scale, v_scale=v_scale)
    """
    if not isinstance(x, torch.Tensor):
        raise InputError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise NotImplementedError(f"x: dtype {x.dtype} is not supported; supported: torch.float16, "
                                  f"torch.bfloat16, torch.float32")
    check_flags(per_head=per_head, check_finite=check_finite)
    if x.dim() == 0 or x.numel() == 0:
        raise InputError(f"x: expected a non-empty tensor with at least one dimension, got shape "
                         f"{tuple(x.shape)}")
    _check_no_grad(x=x)  # rounding to e4m3 has no backward: refused, never a gradient silently detached
    x = x.detach()
    if check_finite and not bool(torch.isfinite(x).all()):  # the opt-in host sync
        raise InputError("x: expected finite values, got NaN or inf")
    if per_head:
        ok = type(head_axis) is int and -x.dim() <= head_axis < x.dim()
        expect(ok, "head_axis", f"an axis of x (rank {x.dim()})", head_axis)
        axis = head_axis % x.dim()
        amax = x.abs().amax(dim=[i for i in range(x.dim()) if i != axis]).float()  # [Hkv]; |x| is exact
        shape = [1] * x.dim()
        shape[axis] = -1
    else:
        amax = x.abs().amax().float()
        shape = []
    if not check_finite:  # amax propagates NaN and inf: finite exactly when x is; recorded, no sync
        err = _error_word(x.device)
        err.bitwise_or_(torch.isfinite(amax).logical_not().any().to(torch.int32) * ERR_QUANTIZE.value)
    scale = amax / E4M3_MAX  # 0 for amax 0, and for an fp32 amax under 448 x 2^-149 (underflow)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # NaN / inf stay in the scale
    x8 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    inv = scale.reshape(shape)
    step = max(1, CHUNK_ELEMENTS // max(1, x[0].numel()))  # fp32 temporaries of a chunk, not of the cache
    for i in range(0, x.shape[0], step):
        div = inv[i:i + step] if per_head and axis == 0 else inv
        x8[i:i + step] = (x[i:i + step].float() / div).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return x8, scale
