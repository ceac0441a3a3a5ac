"""Host-side cost of one eager call of each launcher (no GPU work waited on), and where it goes.

    PYTHONPATH=src python bench/host_overhead.py

Each call is made 500 times in a loop after warm-up and the loop's wall time divided by 500: at these
small shapes the GPU finishes each kernel before the host has issued the next, so this is the host's
time per call. Variants: `flash_decode` as shipped (fused merge, one launch), with the separate combine
kernel (two launches), with one split, and each launch mode of `decode.LAUNCH` ("direct": repeat calls
skip the checks and call the compiled kernel's launcher; "jit": skip the checks, launch through
JITFunction.run; "off": check and launch through JITFunction.run every call); SDPA inside
``sdpa_kernel(...)`` (how the benchmark pins a backend) and with default dispatch. A cProfile of the
shipped call follows.
"""

import cProfile
import pstats
import sys
import time

import torch

import attnscope
from attnscope.kernels import decode


def main():
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    qp = torch.randn(1, 32, 256, 128, device="cuda", dtype=torch.bfloat16)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def pinned(backend):
        def call():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=True)
        return call

    def mode(m, **kw):
        def call():
            decode.LAUNCH = m
            try:
                return attnscope.flash_decode(q, k, v, **kw)
            finally:
                decode.LAUNCH = shipped
        return call

    shipped = decode.LAUNCH
    calls = {
        f"flash_decode (fused merge, one launch; LAUNCH={shipped!r}, as shipped)":
            lambda: attnscope.flash_decode(q, k, v),
        "flash_decode LAUNCH='direct'": mode("direct"),
        "flash_decode LAUNCH='jit'": mode("jit"),
        "flash_decode LAUNCH='off'": mode("off"),
        "flash_decode num_splits=1 LAUNCH='direct'": mode("direct", num_splits=1),
        "flash_decode num_splits=1 LAUNCH='off'": mode("off", num_splits=1),
        "flash_decode fuse_combine=False (2 launches)": lambda: attnscope.flash_decode(q, k, v,
                                                                                        fuse_combine=False),
        "flash_decode num_splits=1": lambda: attnscope.flash_decode(q, k, v, num_splits=1),
        "flash_attention (prefill, N=256)": lambda: attnscope.flash_attention(qp, qp, qp),
        "sdpa FLASH in sdpa_kernel (decode shape)": pinned(SDPBackend.FLASH_ATTENTION),
        "sdpa CUDNN in sdpa_kernel (decode shape)": pinned(SDPBackend.CUDNN_ATTENTION),
        "sdpa default dispatch (decode shape)": lambda: sdpa(q, k, v, enable_gqa=True),
    }
    for name, fn in calls.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(500):
            fn()
        host = (time.perf_counter() - t) / 500 * 1e6
        torch.cuda.synchronize()
        print(f"{name}: {host:.1f} us host time per call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        attnscope.flash_decode(q, k, v)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    sys.exit(main())
