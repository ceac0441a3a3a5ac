"""What stands between the prefill kernel and CUDNN: the compiler's resource report for the chosen
config (kernels/fwd.py's table), and host overhead (public call vs a direct launch of the same config).

    PYTHONPATH=src python bench/diag_fwd.py
"""

import sys

import torch
import triton

import attnscope
from attnscope.kernels import fwd
from attnscope.measure.backends import sdpa
from attnscope.model.flops import attention_flops


def main():
    cudnn = sdpa("cudnn")
    for d, n in ((128, 4096), (128, 16384), (64, 4096)):
        for causal in (False, True):
            b = 16384 // n
            q, k, v = (torch.randn(b, 32, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = attention_flops(b, 32, n, n, d, causal)
            best = cfg = fwd.pick_config(d, causal, n)
            ck = fwd.launch(q, k, v, causal, config=cfg)[2]
            res = f"regs {ck.n_regs} spills {ck.n_spills} smem {ck.metadata.shared} B"

            def tf(fn, flops=flops):
                return flops / triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e9

            pub = tf(lambda q=q, k=k, v=v, c=causal: attnscope.flash_attention(q, k, v, causal=c))
            direct = tf(lambda q=q, k=k, v=v, c=causal, cfg=cfg: fwd.launch(q, k, v, c, config=cfg))
            g = triton.testing.do_bench_cudagraph(
                lambda q=q, k=k, v=v, c=causal: attnscope.flash_attention(q, k, v, causal=c), rep=200,
                return_mode="median")
            cu = tf(lambda q=q, k=k, v=v, c=causal: cudnn(q, k, v, c))
            print(f"d={d} N={n} causal={int(causal)}: best {best} | {res} | public {pub:.1f} "
                  f"direct {direct:.1f} graph {flops / g / 1e9:.1f} cudnn {cu:.1f} TFLOP/s | "
                  f"public/cudnn {pub / cu:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
