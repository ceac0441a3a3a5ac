"""sm_90 resources of the decode kernels, compiled on any machine (no GPU): registers, spills, shared
memory, and whether the KV loop is pipelined with cp.async, for the split kernel with the block config
the plan picks (`attnscope.kernels.decode._block_config`) on a dense cache and on paged caches of every
supported page size, decode (16-row tiles, fused and separate merge) and chunked prefill (128-row
tiles); then the combine kernel and `kernels.merge`'s kernel.

    env -u TRITON_INTERPRET PYTHONPATH=src python bench/decode_resources.py

Paged blocks read through the block table should show the dense kernel's shared memory (the same K/V
buffering) and no spills; tests/test_decode.py asserts both for a subset.
"""

import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attnscope.kernels import decode, merge

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_(fn, types, pointers, constexprs, warps, stages):
    params = inspect.signature(fn.fn).parameters
    names = list(params)
    # constexprs with a default (MAX_UNSCALED) take it, as a launch that does not pass them does
    constexprs = {**{n: p.default for n, p in params.items() if p.default is not p.empty}, **constexprs}
    sig = {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in names}
    # what the launcher's specialisation sees for contiguous caches: 16-aligned pointers and strides
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n in pointers or (n.startswith("stride_") and n not in ("stride_sb", "stride_tb"))}
    return triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), target=TARGET,
                          options={"num_warps": warps, "num_stages": stages})


def ptxas(c):
    """(registers, spill-store bytes) from ptxas -v on the kernel's PTX."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(c.asm["ptx"])
    r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                       text=True)
    os.unlink(f.name)
    return (int(re.search(r"Used (\d+) registers", r.stderr).group(1)),
            int(re.search(r"(\d+) bytes spill stores", r.stderr).group(1)))


def main():
    split_kernel = decode._attnscope_decode_split_kernel
    combine_kernel = decode._attnscope_decode_combine_kernel
    types = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SEQLENS": "*i32", "BT": "*i32", "O_PART": "*fp32",
             "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32", "SEM": "*i32", "qk_scale": "fp32"}
    print(f"triton {triton.__version__}, sm_90, d = 128, bf16")
    for page in (0, *decode.PAGE_SIZES):
        for block_m, group, fuse in ((16, 4, True), (16, 4, False), (128, 8, False)):
            cfg = decode._block_config(block_m, page)
            c = compile_(split_kernel, types, [n for n, t in types.items() if t.startswith("*")],
                         dict(GROUP=group, BLOCK_M=block_m, HEAD_DIM=128, BLOCK_N=cfg["BLOCK_N"],
                              STAGES=cfg["STAGES"], USE_DOT=True, EMULATE_BF16=False, SPLIT=True, FUSE=fuse,
                              MERGE_M=min(block_m, 4) if block_m == 16 else block_m,
                              MERGE_S=8 if block_m <= 16 else 1, WRITE_LSE=True, HAS_SEQLENS=True,
                              PAGED=page > 0, PAGE_SIZE=max(page, 1), CHUNK=block_m > 16, OFF32=True),
                         cfg["num_warps"], cfg["num_stages"])
            regs, spill = ptxas(c)
            what = f"paged {page:3d}" if page else "dense    "
            kind = "chunk 128 rows" if block_m > 16 else f"decode 16 rows {'fused' if fuse else 'separate'}"
            print(f"split {what} {kind:28s} BLOCK_N {cfg['BLOCK_N']:3d} stages {cfg['STAGES']} "
                  f"warps {cfg['num_warps']}: {regs} registers, {spill} B spilled, "
                  f"shared {c.metadata.shared} B, cp.async {'cp.async' in c.asm['ptx']}", flush=True)
    ctypes = {"O_PART": "*fp32", "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32"}
    c = compile_(combine_kernel, ctypes, list(ctypes), dict(HEAD_DIM=128, BLOCK_S=16, EMULATE_BF16=False),
                 4, 1)
    print("combine: {} registers, {} B spilled, shared {} B".format(*ptxas(c), c.metadata.shared))
    mtypes = {"O": "*fp32", "LSE": "*fp32", "O_PART": "*bf16", "LSE_PART": "*fp32"}
    c = compile_(merge._attnscope_merge_kernel, mtypes, list(mtypes),
                 dict(BLOCK_R=merge.BLOCK_R, BLOCK_D=128), 4, 1)
    print("merge_: {} registers, {} B spilled, shared {} B".format(*ptxas(c), c.metadata.shared))


if __name__ == "__main__":
    main()
