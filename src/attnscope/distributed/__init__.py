"""Context parallelism over torch.distributed: shard the sequence, pass K/V around a ring, merge.

Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers") in the load-balanced
causal layout of Megatron-LM CP / PyTorch `context_parallel`: `shard` gives rank i of P a contiguous
slice (unmasked) or chunks i and 2P-1-i of 2P (causal; any N, pad-free), `ring_attention` runs P steps
of `attnscope.flash_attention` while the next K/V block moves (`torch.distributed.batch_isend_irecv`),
merging the partials with the logsumexp combine of `attnscope.kernels.merge`, and `unshard` gathers the
result. docs/context-parallel.md describes the layout, the per-step masks and the backward. NCCL on
GPUs, gloo on CPU; torch is imported lazily.
"""

from attnscope.distributed.ring import chunk_sizes, ring_attention, shard, unshard

__all__ = ["chunk_sizes", "ring_attention", "shard", "unshard"]
