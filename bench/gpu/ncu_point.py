"""One prefill point for Nsight Compute (bench/gpu/hopper.sh): the portable kernel, then the Gluon Hopper
kernel, each launched once (compiled first, outside the profiled launches), bf16, B 2, H 32, N 8192, d 128.

    ncu --clock-control none -k regex:_attnscope_fwd -c 2 ... python bench/gpu/ncu_point.py [--causal]
"""

import sys

import torch

import attnscope

causal = "--causal" in sys.argv
q, k, v = (torch.randn(2, 32, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
small = [t[:, :1, :256] for t in (q, k, v)]
for impl in ("portable", "hopper"):  # compile, and the 2 launches ncu skips (-s 2)
    attnscope.flash_attention(*small, causal=causal, impl=impl)
torch.cuda.synchronize()
for impl in ("portable", "hopper"):  # the two profiled launches
    attnscope.flash_attention(q, k, v, causal=causal, impl=impl)
torch.cuda.synchronize()
print("ncu_point done")
