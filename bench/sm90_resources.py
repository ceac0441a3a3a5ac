"""Compile every prefill kernel variant for sm_90 WITHOUT a GPU and print the compiler's resource report.

    PYTHONPATH=src python bench/sm90_resources.py

For the portable Triton kernel (kernels/fwd.py, its table config) and the Gluon Hopper kernel
(kernels/fwd_hopper.py): d in {64, 128} x {fp16, bf16} x causal. Registers and spills from Triton's
bundled `ptxas -v --gpu-name sm_90a`; shared memory from the compiled kernel's metadata.
"""

import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from attnscope.kernels import fwd, fwd_hopper

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_report(ptx: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "k.o")],
                           capture_output=True, text=True)
    return " ".join(line.split(":", 1)[-1].strip() for line in r.stderr.splitlines()
                    if "registers" in line or "spill" in line)


CONSTEXPRS = ("HEAD_DIM", "CAUSAL", "STORE_LSE", "BLOCK_M", "BLOCK_N", "MAX_UNSCALED", "EMULATE_BF16")


def portable(d, dt, causal):
    cfg = fwd.CONFIG_TABLE[[(r[0], r[1]) for r in fwd.CONFIG_TABLE].index((d, causal))][3]
    bm, bn = cfg.BLOCK_M, cfg.BLOCK_N
    sig = {"desc_q": f"tensordesc<{dt}[1,1,{bm},{d}]>", "desc_k": f"tensordesc<{dt}[1,1,{bn},{d}]>",
           "desc_v": f"tensordesc<{dt}[1,1,{bn},{d}]>", "desc_o": f"tensordesc<{dt}[1,1,{bm},{d}]>",
           "LSE": "*fp32", "B": "i32", "H": "i32", "HKV": "i32", "NQ": "i32", "NK": "i32", "qk_scale": "fp32",
           **{n: "constexpr" for n in CONSTEXPRS}}
    cx = dict(HEAD_DIM=d, CAUSAL=causal, STORE_LSE=True, BLOCK_M=bm, BLOCK_N=bn, MAX_UNSCALED=False,
              EMULATE_BF16=False)
    k = triton.compile(triton.compiler.ASTSource(fn=fwd._attnscope_fwd_kernel, signature=sig, constexprs=cx),
                       target=TARGET, options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return tuple(cfg), k


def hopper(d, dt, causal):
    k = triton.compile(GluonASTSource(fn=fwd_hopper._attnscope_fwd_hopper_kernel,
                                      signature=fwd_hopper.signature(d, dt),
                                      constexprs=fwd_hopper.constexprs(d, causal, True)),
                       target=TARGET, options=dict(num_warps=fwd_hopper.NUM_WARPS))
    return (fwd_hopper.BLOCK_M, *fwd_hopper.config(d)), k


def main() -> int:
    for name, build in (("portable", portable), ("hopper", hopper)):
        for d in (64, 128):
            for dt in ("fp16", "bf16"):
                for causal in (False, True):
                    cfg, k = build(d, dt, causal)
                    print(f"{name:8s} d={d:3d} {dt} causal={int(causal)} config={cfg}: "
                          f"smem {k.metadata.shared} B | {ptxas_report(k.asm['ptx'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
