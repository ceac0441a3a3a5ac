"""Split-KV decode attention (Flash-Decoding) in Triton: dense or paged KV cache, 1..Nq new queries.

Algorithm: Dao, Haziza, Massa, Sizov, *Flash-Decoding* (2023); spec §6, §6.1. With few new queries per
sequence a prefill kernel launches only B x H programs, so the long axis, the KV sequence, is split:

- **phase 1** (`_kernel._attnscope_decode_split_kernel`), grid ``(B * Hkv * M_tiles, num_splits)``: a
  program streams one contiguous chunk of the keys of one (batch, kv head, row tile) through the online
  softmax (the tile's BLOCK_N blocks dealt evenly: none empty while there are as many blocks as splits).
  Rows pack the ``G = Hq / Hkv`` heads sharing the kv head and the ``Nq`` queries (row ``r = i * G + g``),
  so each K/V byte leaves HBM once per tile. Query i sits at position
  ``len - Nq + i`` and sees keys ``0 .. len - Nq + i`` (causal, bottom-right); a query at a negative
  position sees nothing.
- **phase 2**, the logsumexp merge of the splits (`_tl.lse_merge_step`, also the ring's; float64 spec:
  `attnscope.reference.combine`), fused into phase 1 (the last program of a tile, by a gpu-scope atomic
  ticket, merges) or a separate kernel (`_kernel._attnscope_decode_combine_kernel`). Empty splits weigh
  0; an empty row gives O = 0, LSE = -inf. With one split phase 1 writes the final output.

Layouts: dense ``k_cache [B, Hkv, L_max, d]`` (any strides, unit last); paged ``k_cache [num_pages,
page_size, Hkv, d]`` with ``block_table int32 [B, max_pages]`` (flash-attn / vLLM): key ``j`` of sequence
``b`` is row ``j % page_size`` of page ``block_table[b, j // page_size]``; a block of BLOCK_N keys reads
whole pages, in any order, possibly shared. Chunk tiles (Nq > 1) on a dense cache take the paged loop
over a plan-owned table of BLOCK_N-key pages (`plan._dense_pages`) when the strides allow: Triton
pipelines it better. K/V may be ``torch.float8_e4m3fn`` with fp32 scales (per tensor or per kv head):
the kernel converts each tile exactly to fp16 (or q's dtype), folds ``k_scale`` into the softmax scale
and multiplies the output by ``v_scale`` (`quantize_kv` makes such a cache).

Score mods (`_common.check_mods`' contract): a sliding window (decode is causal, so only
its left side bounds; a row tile's keys start at the block holding its first query's window,
`model.tiles.window_kv_bounds0`, so blocks before it are never loaded, and the split count is sized by the
keys the rows see, `heuristics._window_span`, not by L), softcap (``softcap * tanh``
of the scaled score, before the mask), and sinks (one logit per query head, joined once: in the merge,
or in phase 1 with one split). A dense cache's ``cache_leftpad`` (flash-attn's left padding) starts sequence
b at its own key: the keys before it are masked and their whole blocks skipped (the split count still
follows the length).

Values are checked on the device, never read back by default (`checks`): lengths clamped, out-of-range
block-table entries never dereferenced, bad scales flagged; `check_errors` raises what was recorded.

Modules: `_kernel` (the Triton kernels), `heuristics` (split count, blocks, merge, byte ledger), `checks`
(input checks, the device error word), `plan` (`DecodePlan`), `api` (`flash_decode` and its plan
cache), `append` (`kv_append`: new keys and values into the cache in one launch, flash-attn's in-place
append), `_op` (the custom ops `torch.compile` traces), `quantize` (`quantize_kv`).

Host side: `DecodePlan` (FlashInfer's plan/run) checks a layout once and picks the split count, blocks and
merge (`heuristics`, e4m3 tiles included); ``plan.run`` makes one launch (two with the separate merge), so it
can be captured in a CUDA graph. `flash_decode` keeps its plans in a bounded LRU cache (`api`). Scores are
base 2 (``qk_scale = scale * log2 e``, ``exp2``); the public LSE is natural-log. Measurements: BENCHMARKS.md.
"""

from attnscope.kernels.decode import _op  # noqa: F401 - registers torch.ops.attnscope.flash_decode, kv_append
from attnscope.kernels.decode.api import (
    PLAN_CACHE_LAYOUTS,
    PLAN_CACHE_SPLITS,
    PlanCacheInfo,
    clear_plan_cache,
    flash_decode,
    plan_cache_info,
)
from attnscope.kernels.decode.append import kv_append
from attnscope.kernels.decode.checks import check_errors
from attnscope.kernels.decode.heuristics import (
    MAX_NUM_SPLITS,
    PAGE_SIZES,
    RAW_SCORES_ABOVE,
    default_num_splits,
    logical_bytes,
)
from attnscope.kernels.decode.plan import DecodePlan, decode_plan
from attnscope.kernels.decode.quantize import quantize_kv

__all__ = ["MAX_NUM_SPLITS", "PAGE_SIZES", "PLAN_CACHE_LAYOUTS", "PLAN_CACHE_SPLITS", "RAW_SCORES_ABOVE",
           "DecodePlan", "PlanCacheInfo", "check_errors", "clear_plan_cache", "decode_plan",
           "default_num_splits", "flash_decode", "kv_append", "logical_bytes", "plan_cache_info",
           "quantize_kv"]
