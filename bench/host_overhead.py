"""Host-side cost of one eager call of each launcher (no GPU work waited on): cProfile over many calls.

    PYTHONPATH=src python bench/host_overhead.py
"""

import cProfile
import pstats
import sys
import time

import torch

import attnscope


def main():
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    qp = torch.randn(1, 32, 256, 128, device="cuda", dtype=torch.bfloat16)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, k, v, enable_gqa=True)

    calls = {"flash_decode": lambda: attnscope.flash_decode(q, k, v),
             "flash_decode 1 split": lambda: attnscope.flash_decode(q, k, v, num_splits=1),
             "flash_attention": lambda: attnscope.flash_attention(qp, qp, qp),
             "sdpa flash (decode shape)": flash}
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
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    sys.exit(main())
