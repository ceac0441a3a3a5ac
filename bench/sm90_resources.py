"""Compile every prefill kernel variant for sm_90 and print the compiler's resource report.

    PYTHONPATH=src python bench/sm90_resources.py          # no GPU needed (Triton's bundled ptxas)
    PYTHONPATH=src python bench/sm90_resources.py --gpu    # on the H200: the launched kernels' metadata
    PYTHONPATH=src python bench/sm90_resources.py --evidence  # where a Gluon loop's bar.syncs come from

Variants: the portable Triton kernel (kernels/fwd.py, its table config) and every Gluon Hopper variant
(kernels/fwd_hopper.py ``VARIANTS``: default, no ping-pong, deeper ring, 3 consumer warpgroups, 128-row
warpgroup tiles, persistent, one release per tile, per-thread arrivals; ``--variant NAME`` for one), each
for the head dims and masks it is built for (portable: 64 and 128) x {fp16, bf16}. Without ``--gpu``:
registers and spills from `ptxas -v --gpu-name sm_90a`, shared memory from the compiled kernel's metadata,
the `setmaxnreg` register split of the warp-specialised partitions read from the PTX, and the
partition-wide barriers (``bar.sync``) per iteration of each KV loop (`fwd_hopper.ptx_loop_barriers`).
With ``--gpu``: each variant is launched once on a small ragged GQA input (bf16, or each ``--dtype``;
B 2, 4 query / 2 KV heads, N 1000), checked against float64 (exit 1 on a failure), and the compiled
kernel's ``n_regs`` / ``n_spills`` / ``metadata.shared`` (what the driver loaded) printed.
The ptxas "Used N registers" of a warp-specialised kernel is the launch budget (65,536 / threads);
the per-partition budgets are the `setmaxnreg` values; spills are reported for the whole kernel.
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

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
    keep = ("registers", "spill", "serializ", "Performance")  # C7515: wgmma serialised (must not appear)
    return " ".join(line.split(":", 1)[-1].strip() for line in r.stderr.splitlines()
                    if any(w in line for w in keep))


def setmaxnreg(ptx: str) -> str:
    """The distinct register budgets the partitions switch to (setmaxnreg inc/dec values)."""
    vals = sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
    return "setmaxnreg " + "/".join(map(str, vals)) if vals else "no setmaxnreg"


def loop_barriers(ptx: str) -> str:
    counts = []  # fwd_hopper.ptx_loop_barriers left with the barrier-light variants
    return "bar.sync/iter " + ("/".join(map(str, counts)) if counts else "n/a")


CONSTEXPRS = ("HEAD_DIM", "CAUSAL", "STORE_LSE", "BLOCK_M", "BLOCK_N", "MAX_UNSCALED", "EMULATE_BF16")


def portable(d, dt, causal, name="portable"):
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


def hopper(d, dt, causal, name="hopper"):
    cfg = fwd_hopper.config(d, name)
    k = triton.compile(GluonASTSource(fn=fwd_hopper.kernel(name),
                                      signature=fwd_hopper.signature(d, dt, name),
                                      constexprs=fwd_hopper.constexprs(d, causal, True, name)),
                       target=TARGET, options=dict(num_warps=fwd_hopper.NUM_WARPS))
    var = fwd_hopper.VARIANTS[name]
    return (*cfg, f"pingpong={int(var.pingpong)}" + (" persistent" if var.persistent else "")), k


def head_dims(name):
    return (64, 128) if name == "portable" else tuple(sorted(fwd_hopper.VARIANTS[name].configs))


def built(name, d, causal):
    return name == "portable" or fwd_hopper.supports(name, d, causal)


def cpu_report(names) -> int:
    for name in names:
        build = portable if name == "portable" else hopper
        for d in head_dims(name):
            for dt in ("fp16", "bf16"):
                for causal in (c for c in (False, True) if built(name, d, c)):
                    cfg, k = build(d, dt, causal, name)
                    ptx = k.asm["ptx"]
                    print(f"{name:11s} d={d:3d} {dt} causal={int(causal)} config={cfg}: "
                          f"smem {k.metadata.shared} B | {ptxas_report(ptx)} | {setmaxnreg(ptx)} | "
                          f"{loop_barriers(ptx)}", flush=True)
    return 0


# --evidence: where the barriers of a warp-specialised Gluon loop come from (Triton 3.6), on three minimal
# kernels: a 4-warp partition looping over (a) two mbarrier waits, (b) a wait then an elected arrive, (c) a
# wait then a per-thread arrive (cp.async.mbarrier.arrive.noinc); a 1-warp partition arrives/waits opposite.
@gluon.jit
def _ev_waits(a, b, n, MODE: gl.constexpr):
    for i in range(n):
        mbarrier.wait(a.index(i % 2), (i // 2) & 1)
        if MODE == 0:
            mbarrier.wait(b.index(i % 2), (i // 2) & 1)
        elif MODE == 1:
            mbarrier.arrive(b.index(i % 2))
        else:
            async_copy.mbarrier_arrive(b.index(i % 2), increment_count=False)


@gluon.jit
def _ev_other(a, b, n, MODE: gl.constexpr):
    for i in range(n):
        mbarrier.arrive(a.index(i % 2))
        if MODE == 0:
            mbarrier.arrive(b.index(i % 2))
        else:
            mbarrier.wait(b.index(i % 2), ((i // 2) & 1) ^ 1)


@gluon.jit
def _ev_kernel(n, MODE: gl.constexpr, num_warps: gl.constexpr):
    a = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    b = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(a.index(s), count=1)
        mbarrier.init(b.index(s), count=128 if MODE == 2 else 1)
    fence_async_shared()
    gl.warp_specialize([(_ev_waits, (a, b, n, MODE)), (_ev_other, (a, b, n, MODE))], [1], [24])


def evidence() -> int:
    """Print, per minimal kernel, the 4-warp partition's loop body: its barriers and mbarrier operations."""
    for mode, what in enumerate(("wait; wait", "wait; mbarrier.arrive (elected)",
                                 "wait; async_copy.mbarrier_arrive (every thread)")):
        k = triton.compile(GluonASTSource(fn=_ev_kernel, signature={"n": "i32", "MODE": "constexpr",
                                                               "num_warps": "constexpr"},
                                          constexprs={"MODE": mode, "num_warps": 4}),
                           target=TARGET, options=dict(num_warps=4))
        lines = k.asm["ptx"].splitlines()
        lo = next(i for i, x in enumerate(lines) if "bar.sync \t0, 128;" in x and i > 0
                  and "mbarrier.try_wait" in "".join(lines[i:i + 8]))
        body = [x.strip() for x in lines[lo:lo + 40] if re.search(r"bar\.sync|mbarrier\.|^\s*@%p\d+ bra", x)]
        print(f"loop of {what}: " + " | ".join(body[:6]), flush=True)
    return 0


def gpu_report(names, dtypes=("bf16",)) -> int:
    """Launch each variant (no LSE: the compiles bench/prefill.py reuses; each of ``dtypes``) on a small
    ragged GQA input, check it against float64 (2 x SDPA FLASH's error + 1e-3), print the loaded kernel's
    resources."""
    import torch

    from attnscope.measure.backends import sdpa
    from attnscope.measure.bench import _ref_error

    bad = 0
    for name, dt in ((n, dt) for n in names for dt in dtypes):
        dtype = torch.bfloat16 if dt == "bf16" else torch.float16
        for d in head_dims(name):
            for causal in (c for c in (False, True) if built(name, d, c)):
                g = torch.Generator(device="cuda").manual_seed(d + causal)
                q = torch.randn(2, 4, 1000, d, device="cuda", dtype=dtype, generator=g)
                k, v = (torch.randn(2, 2, 1000, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
                if name == "portable":
                    o, _, c = fwd.launch(q, k, v, causal=causal, impl="portable")
                else:
                    o = torch.full_like(q, float("nan"))
                    lse = torch.empty(1, device="cuda", dtype=torch.float32)
                    c = fwd_hopper.launch(q, k, v, o, lse, fwd.LOG2E / math.sqrt(d), causal, False, name)
                torch.cuda.synchronize()
                kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # SDPA's bound without GQA
                ref = _ref_error(torch, sdpa("flash")(q, kr, vr, causal), q, kr, vr, causal, heads=4)
                err = _ref_error(torch, o, q, k, v, causal, heads=4)
                ok = err <= 2 * ref + 1e-3  # NaN (an unwritten element) fails too
                bad += not ok
                print(f"{name:11s} d={d:3d} {dt} causal={int(causal)}: n_regs {c.n_regs} "
                      f"n_spills {c.n_spills} shared {c.metadata.shared} B | err {err:.3g} "
                      f"(bound {2 * ref + 1e-3:.3g}) {'ok' if ok else 'FAIL'}", flush=True)
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="launch each variant, print the loaded kernel metadata")
    p.add_argument("--variant", action="append", help="portable or a fwd_hopper.VARIANTS name (default: all)")
    p.add_argument("--evidence", action="store_true",
                   help="compile minimal loops of mbarrier waits/arrives; print where the bar.syncs are")
    p.add_argument("--dtype", action="append", choices=("bf16", "fp16"),
                   help="with --gpu: the dtype(s) launched (default bf16)")
    a = p.parse_args()
    names = a.variant or ["portable", *fwd_hopper.VARIANTS]
    if a.evidence:
        return evidence()
    return gpu_report(names, tuple(a.dtype or ("bf16",))) if a.gpu else cpu_report(names)


if __name__ == "__main__":
    sys.exit(main())
