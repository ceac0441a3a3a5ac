"""`flash_decode` and `append.kv_append` as PyTorch custom ops (``torch.ops.attnscope.flash_decode``,
``torch.ops.attnscope.kv_append``), the form they take inside `torch.compile`: the compiler sees one opaque
call with a fake (shape-only) implementation; at run time the op is the function itself (its checks, plan
cache and launch). The decode op always computes the LSE; the append op mutates the two caches."""

from attnscope.kernels._common import import_torch_triton
from attnscope.kernels.decode.api import flash_decode
from attnscope.kernels.decode.append import kv_append

torch, _ = import_torch_triton()
Tensor = torch.Tensor


@torch.library.custom_op("attnscope::flash_decode", mutates_args=())
def flash_decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor | None,
                    block_table: Tensor | None, k_scale: Tensor | None, v_scale: Tensor | None,
                    sinks: Tensor | None, cache_leftpad: Tensor | None, num_splits: int | None,
                    scale: float | None,
                    window_left: int, window_right: int, softcap: float) -> tuple[Tensor, Tensor]:
    """(o [B, Hq, Nq, d], lse [B, Hq, Nq] fp32): `api.flash_decode` with ``return_lse=True``."""
    window = None if window_left < 0 and window_right < 0 else (window_left, window_right)
    return flash_decode(q, k_cache, v_cache, cache_seqlens, block_table, num_splits=num_splits, scale=scale,
                        return_lse=True, k_scale=k_scale, v_scale=v_scale, window=window, softcap=softcap,
                        sinks=sinks, cache_leftpad=cache_leftpad)


@flash_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, sinks, cache_leftpad, num_splits,
      scale, window_left, window_right, softcap):
    # `DecodePlan` allocates o contiguous whatever q's layout (a transposed q included: flash-attn's [B, Nq,
    # Hq, d] seen as [B, Hq, Nq, d])
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("attnscope::kv_append", mutates_args=("k_cache", "v_cache"))
def kv_append_op(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, cache_seqlens: Tensor | None,
                 block_table: Tensor | None, fixed: int) -> Tensor:
    """lengths int32 [B]: `append.kv_append` with ``cache_seqlens``, or the int ``fixed`` where it is None."""
    return kv_append(k_cache, v_cache, k, v, fixed if cache_seqlens is None else cache_seqlens, block_table)


@kv_append_op.register_fake
def _(k_cache, v_cache, k, v, cache_seqlens, block_table, fixed):
    return k.new_empty(k.shape[:1], dtype=torch.int32)
