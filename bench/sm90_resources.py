"""Compile attnscope's kernels for sm_90 on any machine and print the compiler's resource report.

    PYTHONPATH=src python bench/sm90_resources.py          # forward variants, no GPU (Triton's bundled ptxas)
    PYTHONPATH=src python bench/sm90_resources.py --gpu    # on the H200: the launched kernels' metadata
    PYTHONPATH=src python bench/sm90_resources.py --evidence  # where a Gluon loop's bar.syncs come from
    PYTHONPATH=src python bench/sm90_resources.py --kernel bwd [--dkdv BM,BN,WARPS,STAGES] [--dq ...]
    PYTHONPATH=src python bench/sm90_resources.py --kernel decode

Takes 1-5 minutes on a CPU (each kernel compiles once); ``--gpu`` about a minute.

``--kernel fwd`` (default):

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

``--kernel bwd``: every FA-2 backward kernel (dK/dV with and without atomic dQ, the dQ pass, the
preprocess) at the table's configs of kernels/bwd.py (or ``--dkdv`` / ``--dq``), d 64 and 128, both masks:
registers, spill stores, shared memory per CTA.

``--kernel decode``: the split-KV decode kernel with the block config the plan picks, dense and paged at
every supported page size, decode (16-row tiles, fused and separate merge) and chunked prefill (128-row
tiles); then the combine kernel and `kernels.merge`'s kernel: registers, spills, shared memory, and
whether the KV loop is pipelined with cp.async (tests/test_decode.py asserts a subset).
"""

import argparse
import inspect
import math
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, never interpret

import triton  # noqa: E402 - after TRITON_INTERPRET is cleared
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier  # noqa: E402

from attnscope.kernels import fwd, fwd_hopper  # noqa: E402

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


# --- --kernel bwd ------------------------------------------------------------------------------------
def _ptxas_regs_spills(ptx: str) -> tuple:
    """(registers, spill-store bytes) from ``ptxas -v`` on a kernel's PTX ('?' when absent)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", src, "-o", os.devnull], capture_output=True,
                           text=True)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    return (regs.group(1) if regs else "?"), (spill.group(1) if spill else "?")


def _bwd_signature(fn, ptrs16, ptrs32):
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


def _bwd_line(name, fn, sig, constexprs, warps, stages) -> str:
    k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=TARGET,
                       options={"num_warps": warps, "num_stages": stages})
    regs, spill = _ptxas_regs_spills(k.asm["ptx"])
    return (f"{name:44s} warps {warps} stages {stages}: registers {regs:>3}, "
            f"spill stores {spill:>5} B, shared {k.metadata.shared:>6} B")


def bwd_report(dkdv=None, dq=None) -> int:
    from attnscope.kernels import bwd

    for d in (64, 128):
        for causal in (False, True):
            bm, bn, w, s = dkdv or bwd.DKDV_CONFIGS[d]
            sig = _bwd_signature(bwd._bwd_dkdv_kernel, ["Q", "K", "V", "DO", "DK", "DV"],
                                 ["LSE2", "DELTA", "DQ"])
            for atomic in (False, True):
                print(_bwd_line(f"dK/dV d={d} causal={causal} atomic_dq={atomic} {bm}x{bn}",
                                bwd._bwd_dkdv_kernel, sig,
                                dict(HEAD_DIM=d, CAUSAL=causal, ATOMIC_DQ=atomic, BLOCK_M=bm, BLOCK_N=bn,
                                     EMULATE_BF16=False), w, s), flush=True)
            bm, bn, w, s = dq or bwd.DQ_CONFIGS[d]
            sig = _bwd_signature(bwd._bwd_dq_kernel, ["Q", "K", "V", "DO", "DQ"], ["LSE2", "DELTA"])
            print(_bwd_line(f"dQ pass d={d} causal={causal} {bm}x{bn}", bwd._bwd_dq_kernel, sig,
                            dict(HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False),
                            w, s),
                  flush=True)
        sig = _bwd_signature(bwd._bwd_preprocess, ["O", "DO"], ["DELTA"])
        sig.update(HEAD_DIM="constexpr", BLOCK_M="constexpr")
        print(_bwd_line(f"preprocess d={d} {bwd.PRE_BLOCK_M} rows", bwd._bwd_preprocess, sig,
                        dict(HEAD_DIM=d, BLOCK_M=bwd.PRE_BLOCK_M), 4, 1), flush=True)
    return 0


# --- --kernel decode ---------------------------------------------------------------------------------
def _decode_compile(fn, types, pointers, constexprs, warps, stages):
    params = inspect.signature(fn.fn).parameters
    names = list(params)
    # constexprs with a default (MAX_UNSCALED) take it, as a launch that does not pass them does
    constexprs = {**{n: p.default for n, p in params.items() if p.default is not p.empty}, **constexprs}
    sig = {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in names}
    # what the launcher's specialisation sees for contiguous caches: 16-aligned pointers and strides
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n in pointers or (n.startswith("stride_") and n not in ("stride_sb", "stride_tb"))}
    return triton.compile(triton.compiler.ASTSource(fn, sig, constexprs=constexprs, attrs=attrs),
                          target=TARGET, options={"num_warps": warps, "num_stages": stages})


def decode_report() -> int:
    from attnscope.kernels import decode, merge

    types = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SEQLENS": "*i32", "BT": "*i32", "O_PART": "*fp32",
             "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32", "SEM": "*i32", "qk_scale": "fp32"}
    print(f"triton {triton.__version__}, sm_90, d = 128, bf16")
    for page in (0, *decode.PAGE_SIZES):
        for block_m, group, fuse in ((16, 4, True), (16, 4, False), (128, 8, False)):
            cfg = decode._block_config(block_m, page)
            c = _decode_compile(decode._attnscope_decode_split_kernel, types,
                                [n for n, t in types.items() if t.startswith("*")],
                                dict(GROUP=group, BLOCK_M=block_m, HEAD_DIM=128, BLOCK_N=cfg["BLOCK_N"],
                                     STAGES=cfg["STAGES"], USE_DOT=True, EMULATE_BF16=False, SPLIT=True,
                                     FUSE=fuse,
                                     MERGE_M=min(block_m, 4) if block_m == 16 else block_m,
                                     MERGE_S=8 if block_m <= 16 else 1, WRITE_LSE=True, HAS_SEQLENS=True,
                                     PAGED=page > 0, PAGE_SIZE=max(page, 1), CHUNK=block_m > 16, OFF32=True),
                                cfg["num_warps"], cfg["num_stages"])
            regs, spill = _ptxas_regs_spills(c.asm["ptx"])
            what = f"paged {page:3d}" if page else "dense    "
            kind = "chunk 128 rows" if block_m > 16 else f"decode 16 rows {'fused' if fuse else 'separate'}"
            print(f"split {what} {kind:28s} BLOCK_N {cfg['BLOCK_N']:3d} stages {cfg['STAGES']} "
                  f"warps {cfg['num_warps']}: {regs} registers, {spill} B spilled, "
                  f"shared {c.metadata.shared} B, cp.async {'cp.async' in c.asm['ptx']}", flush=True)
    ctypes = {"O_PART": "*fp32", "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32"}
    c = _decode_compile(decode._attnscope_decode_combine_kernel, ctypes, list(ctypes),
                        dict(HEAD_DIM=128, BLOCK_S=16, EMULATE_BF16=False), 4, 1)
    print("combine: {} registers, {} B spilled, shared {} B".format(*_ptxas_regs_spills(c.asm["ptx"]),
                                                                    c.metadata.shared))
    mtypes = {"O": "*fp32", "LSE": "*fp32", "O_PART": "*bf16", "LSE_PART": "*fp32"}
    c = _decode_compile(merge._attnscope_merge_kernel, mtypes, list(mtypes),
                        dict(BLOCK_R=merge.BLOCK_R, BLOCK_D=128), 4, 1)
    print("merge_: {} registers, {} B spilled, shared {} B".format(*_ptxas_regs_spills(c.asm["ptx"]),
                                                                   c.metadata.shared))
    return 0


def _config(flag):
    parts = flag.split(",")
    if len(parts) != 4 or not all(x.strip().isdigit() for x in parts):
        raise argparse.ArgumentTypeError(f"expected BM,BN,WARPS,STAGES (4 integers), got {flag!r}")
    return tuple(int(x) for x in parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=("fwd", "bwd", "decode"), default="fwd",
                   help="which kernels to compile (default: the forward variants)")
    p.add_argument("--dkdv", type=_config, metavar="BM,BN,WARPS,STAGES",
                   help="--kernel bwd: a dK/dV config (default: the table's)")
    p.add_argument("--dq", type=_config, metavar="BM,BN,WARPS,STAGES",
                   help="--kernel bwd: a dQ-pass config (default: the table's)")
    p.add_argument("--gpu", action="store_true", help="launch each variant, print the loaded kernel metadata")
    p.add_argument("--variant", action="append", help="portable or a fwd_hopper.VARIANTS name (default: all)")
    p.add_argument("--evidence", action="store_true",
                   help="compile minimal loops of mbarrier waits/arrives; print where the bar.syncs are")
    p.add_argument("--dtype", action="append", choices=("bf16", "fp16"),
                   help="with --gpu: the dtype(s) launched (default bf16)")
    a = p.parse_args()
    if a.kernel == "bwd":
        return bwd_report(a.dkdv, a.dq)
    if a.kernel == "decode":
        return decode_report()
    names = a.variant or ["portable", *fwd_hopper.VARIANTS]
    if a.evidence:
        return evidence()
    return gpu_report(names, tuple(a.dtype or ("bf16",))) if a.gpu else cpu_report(names)


if __name__ == "__main__":
    sys.exit(main())
