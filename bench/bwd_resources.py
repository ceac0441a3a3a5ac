"""Compile every variant of the FA-2 backward kernels for sm_90 on any machine (no GPU needed) and print
ptxas's registers, spill stores and the shared memory per CTA: the resource report behind the config
table in kernels/bwd.py.

    PYTHONPATH=src python bench/bwd_resources.py [--dkdv BM,BN,WARPS,STAGES] [--dq BM,BN,WARPS,STAGES]

Uses triton.compile with an explicit GPUTarget("cuda", 90, 32) and the ptxas binary Triton ships.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, never interpret


def _signature(fn, ptrs16, ptrs32):
    sig = {}
    for a in fn.arg_names:
        if a in ptrs16:
            sig[a] = "*bf16"
        elif a in ptrs32:
            sig[a] = "*fp32"
        elif a in ("qk_scale", "sm_scale"):
            sig[a] = "fp32"
        elif a.isupper() and a not in ("O", "H", "HKV", "NQ", "NK"):
            sig[a] = "constexpr"
        else:
            sig[a] = "i32"
    return sig


def report(triton, name, fn, sig, constexprs, warps, stages) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    try:
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                           text=True, check=False)
    finally:
        os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    return (f"{name:44s} warps {warps} stages {stages}: registers {regs.group(1) if regs else '?':>3}, "
            f"spill stores {spill.group(1) if spill else '?':>5} B, shared {k.metadata.shared:>6} B")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dkdv", metavar="BM,BN,WARPS,STAGES", help="a dK/dV config (default: the table's)")
    p.add_argument("--dq", metavar="BM,BN,WARPS,STAGES", help="a dQ-pass config (default: the table's)")
    args = p.parse_args(argv)
    import triton

    from attnscope.kernels import bwd

    def parse(flag):
        return tuple(int(x) for x in flag.split(",")) if flag else None

    for d in (64, 128):
        for causal in (False, True):
            bm, bn, w, s = parse(args.dkdv) or bwd.DKDV_CONFIGS[d]
            sig = _signature(bwd._bwd_dkdv_kernel, ["Q", "K", "V", "DO", "DK", "DV"], ["LSE2", "DELTA", "DQ"])
            for atomic in (False, True):
                print(report(triton, f"dK/dV d={d} causal={causal} atomic_dq={atomic} {bm}x{bn}",
                             bwd._bwd_dkdv_kernel, sig, dict(HEAD_DIM=d, CAUSAL=causal, ATOMIC_DQ=atomic,
                                                             BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False),
                             w, s), flush=True)
            bm, bn, w, s = parse(args.dq) or bwd.DQ_CONFIGS[d]
            sig = _signature(bwd._bwd_dq_kernel, ["Q", "K", "V", "DO", "DQ"], ["LSE2", "DELTA"])
            print(report(triton, f"dQ pass d={d} causal={causal} {bm}x{bn}", bwd._bwd_dq_kernel, sig,
                         dict(HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False), w, s),
                  flush=True)
        sig = _signature(bwd._bwd_preprocess, ["O", "DO"], ["DELTA"])
        sig.update(HEAD_DIM="constexpr", BLOCK_M="constexpr")
        print(report(triton, f"preprocess d={d} {bwd.PRE_BLOCK_M} rows", bwd._bwd_preprocess, sig,
                     dict(HEAD_DIM=d, BLOCK_M=bwd.PRE_BLOCK_M), 4, 1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
