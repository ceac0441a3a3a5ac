"""Context parallelism over torch.distributed: shard the sequence, pass K/V around a ring, merge.

Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; the load-balanced
causal layout of Megatron-LM CP / PyTorch `context_parallel`): each of P ranks holds a slice of the
sequence (dim 2 of [B, H, N, d]). For P steps every rank runs `attnscope.flash_attention` of its
queries against the K/V block it holds, while that block is already being sent to the next rank and
the following one received from the previous (`torch.distributed.batch_isend_irecv`); the partial
outputs are merged with the logsumexp combine of `attnscope.kernels.merge` (the formula of
`reference.combine`, FlashAttention-2 §3.1 applied across blocks).

Layout (`shard` / `unshard`): unmasked — contiguous slices. Causal — the sequence is cut into 2P
chunks and rank i holds chunks i and 2P-1-i, so every rank does the same causal work. N need not be
divisible by 2P: pad-free, chunk j has ``N // C + (j < N % C)`` tokens (C = P or 2P), so ranks hold
shards differing by at most one or two tokens; `ring_attention` learns every rank's length with one
small all_gather per call.

Causal masking in the balanced layout, for rank r holding K/V of rank s (chunks s and 2P-1-s):
s == r: one causal call of the local queries against the local keys (chunk r < chunk 2P-1-r, so
the ordinary causal mask on the concatenation is exact); s < r: all local queries see chunk s fully
and chunk 2P-1-s not at all (one unmasked call on the first chunk); s > r: only the high chunk's
queries see anything, and they see both chunks fully (one unmasked call). Every step is one kernel call.

Transport: NCCL on GPUs, gloo on CPU; torch's NCCL process group runs P2P on its own stream, ordered
after the compute stream when issued and joined by `work.wait()`, so the transfer overlaps the kernel.
torch is imported lazily.
"""

from attnscope.distributed.ring import chunk_sizes, ring_attention, shard, unshard

__all__ = ["chunk_sizes", "ring_attention", "shard", "unshard"]
