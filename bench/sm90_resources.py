"""Compile attnscope's kernels for sm_90 on any machine and print the compiler's resource report.

    PYTHONPATH=src python bench/sm90_resources.py [--kernel fwd|bwd|varlen|decode|all]  # no GPU needed
    PYTHONPATH=src python bench/sm90_resources.py --gpu    # on the H200: the launched forward kernels
    PYTHONPATH=src python bench/sm90_resources.py --evidence  # where a Gluon loop's bar.syncs come from
    PYTHONPATH=src python bench/sm90_resources.py --sass-per-kib  # decode KV loop: instructions per KiB

Without ``--gpu``: every kernel the dispatch can launch is compiled for ``GPUTarget("cuda", 90, 32)``
with the configs the launchers pick (no GPU: Triton 3.6 bundles ptxas), with the score-mod constexprs
off and on, d 64, 128 and (portable kernels) 256, bf16 (and fp16 where the kernel is built per dtype
without mods). One line per kernel: ptxas's registers and spill bytes (`ptxas -v --gpu-name sm_90a`), the
compiled kernel's shared memory, ptxas's performance warnings (C7511/C7515: wgmma serialised); a kernel that
fails to compile or needs more than `SMEM_LIMIT` bytes of shared memory is printed with FAIL and the run
exits 1.

- ``--kernel fwd`` (default): the portable kernel (kernels/fwd.py, its table config) and every Gluon
  Hopper variant (kernels/fwd_hopper.py ``VARIANTS``; ``--variant NAME`` for some), each for the head
  dims it is built for, `FWD_MODS` (causal, window, softcap, sinks), with the `setmaxnreg` register split
  of the warp-specialised partitions read from the PTX. The ptxas "Used N registers" of a
  warp-specialised kernel is the launch budget (65,536 / threads); spills are for the whole kernel.
- ``--kernel bwd``: kernels/bwd.py's dK/dV (with and without atomic dQ), dQ pass and preprocess at the
  table's configs (or ``--dkdv`` / ``--dq``), `BWD_MODS` (sinks have no kernel constexpr); the Gluon dK/dV
  and dQ kernels of kernels/bwd_hopper.py (``impl="hopper"``), bf16 and fp16, causal and not, and bf16 with
  the score mods (`HOPPER_BWD_MODS`: window, softcap, both), with their `setmaxnreg` split; its one-pass
  dK/dV builds (``deterministic=False``: "onepass", "onepass-wg"), causal and not, window + softcap, each
  also with ``RED=0`` (dQ by TMA reduce-adds).
- ``--kernel varlen``: kernels/varlen.py's forward (TMA and pointer K/V loads) and kernels/varlen_bwd.py's
  dK/dV and dQ pass, `VARLEN_MODS`; the Gluon dK/dV and dQ kernels of kernels/varlen_bwd_hopper.py, bf16 and
  fp16, causal and not.
- ``--kernel decode``: the split-KV decode kernel as `DecodePlan` builds it (`DECODE_SHAPES`: decode
  tiles with fused / separate merge, dense and paged, chunked prefill), bf16 and FP8 e4m3 caches, score
  mods off and on; the combine kernel and `kernels.merge`'s kernel; whether the KV loop uses cp.async.

``--sass-per-kib``: the decode tile of Hq/Hkv 32/8, one query, d 128, compiled as `DecodePlan` builds it
for the bf16 cache and each e4m3 config of `decode.heuristics.FP8_CONFIGS` (or ``--fp8-config NAME``),
dense and in pages of 64, 16 and 256 keys; the cubin disassembled (Triton's bundled nvdisasm), the KV loop
found (the loop with the most MMAs) and its instructions counted by class (`KIB_CLASSES`: loads and
stores, converts and bit operations, MMA, softmax float math, integer addressing, barriers and branches),
times the warps, over the bytes of K and V one iteration reads: warp instructions per KiB of K/V.

``--gpu``: each forward variant is launched once on a small ragged GQA input (bf16, or each ``--dtype``;
B 2, 4 query / 2 KV heads, N 1000), checked against float64 (exit 1 on a failure), and the compiled
kernel's ``n_regs`` / ``n_spills`` / ``metadata.shared`` (what the driver loaded) printed.
"""

import argparse
import inspect
import itertools
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

from attnscope.kernels import _common, fwd, fwd_hopper  # noqa: E402
from attnscope.model import dispatch  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
SMEM_LIMIT = 227 * 1024  # the H100/H200 per-CTA opt-in maximum of shared memory
FAILED = []  # labels of the kernels that failed to compile or exceed SMEM_LIMIT


def ptxas_info(ptx: str) -> dict:
    """``ptxas -v --gpu-name sm_90a`` on ``ptx``: registers, spill store / load bytes, warnings (C7515:
    wgmma serialised, must not appear), and the error text if it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "k.o")],
                           capture_output=True, text=True)

    def num(pat):
        m = re.search(pat, r.stderr)
        return int(m.group(1)) if m else None
    warn = [line.split(":", 1)[-1].strip() for line in r.stderr.splitlines()
            if "serializ" in line or "Performance" in line]
    return {"regs": num(r"Used (\d+) registers"), "stores": num(r"(\d+) bytes spill stores"),
            "loads": num(r"(\d+) bytes spill loads"), "warn": warn,
            "error": r.stderr.strip()[-400:] if r.returncode else None}


def setmaxnreg(ptx: str) -> str:
    """The distinct register budgets the partitions switch to (setmaxnreg inc/dec values)."""
    vals = sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
    return "setmaxnreg " + "/".join(map(str, vals)) if vals else "no setmaxnreg"


def _fmt(cx: dict) -> str:
    return " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in cx.items())


def report(label: str, build, *args, extra=None) -> None:
    """Compile (``build(*args)`` returns the compiled kernel), run ptxas, print one line; record a failure
    (compile or ptxas error, shared memory over `SMEM_LIMIT`) in `FAILED`."""
    try:
        k = build(*args)
    except Exception as e:  # noqa: BLE001 - every compile error is the report's content
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        FAILED.append(label)
        print(f"FAIL {label}: compile error: {msg[:1500]}", flush=True)
        return
    ptx = k.asm["ptx"]
    info = ptxas_info(ptx)
    smem = k.metadata.shared
    bad = []
    if info["error"]:
        bad.append("ptxas error: " + " ".join(info["error"].split()))
    if smem > SMEM_LIMIT:
        bad.append(f"shared {smem} B > {SMEM_LIMIT} B")
    extras = f" | {extra(ptx)}" if extra else ""
    warn = f" | {'; '.join(info['warn'])}" if info["warn"] else ""
    line = (f"{label}: regs {info['regs']}, spill stores {info['stores']} B, loads {info['loads']} B, "
            f"shared {smem} B{extras}{warn}")
    if bad:
        FAILED.append(label)
        print(f"FAIL {line} | {' | '.join(bad)}", flush=True)
    else:
        print(line, flush=True)


def compile_triton(fn, types: dict, constexprs: dict, warps: int, stages: int, unaligned=()):
    """``triton.compile`` of the @triton.jit ``fn`` for sm_90 without a GPU: ``types`` names each runtime
    argument's type (others i32); constexprs with a default take it, as a launch that does not pass them
    does; pointers and ``stride_*`` arguments (but ``unaligned``) 16-divisible, as the launcher's
    specialisation sees contiguous tensors."""
    params = inspect.signature(fn.fn).parameters
    names = list(params)
    cx = {**{n: p.default for n, p in params.items() if p.default is not p.empty}, **constexprs}
    sig = {n: ("constexpr" if n in cx else types.get(n, "i32")) for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in cx and n not in unaligned and (sig[n].startswith("*") or n.startswith("stride_"))}
    return triton.compile(triton.compiler.ASTSource(fn, sig, constexprs=cx, attrs=attrs), target=TARGET,
                          options={"num_warps": warps, "num_stages": stages})


# --- --kernel fwd ------------------------------------------------------------------------------------
#: (CAUSAL, WINDOW, SOFTCAP, SINKS) of the forward launches: a window carries the diagonal (CAUSAL off)
FWD_MODS = ((False, False, False, False), (True, False, False, False), (False, True, False, False),
            (True, False, True, False), (True, False, False, True), (False, True, True, True),
            (True, False, True, True))


def portable(d, dt, causal, window=False, softcap=False, sinks=False, lse=True, max_unscaled=False):
    bm, bn, warps, stages = fwd.pick_config(d, causal or window, 1, narrow_window=window)  # a short window
    types = {"desc_q": f"tensordesc<{dt}[1,1,{bm},{d}]>", "desc_k": f"tensordesc<{dt}[1,1,{bn},{d}]>",
             "desc_v": f"tensordesc<{dt}[1,1,{bn},{d}]>", "desc_o": f"tensordesc<{dt}[1,1,{bm},{d}]>",
             "LSE": "*fp32", "SINKS": "*fp32", "qk_scale": "fp32", "cap_in": "fp32"}
    cx = dict(HEAD_DIM=d, CAUSAL=causal, STORE_LSE=lse, BLOCK_M=bm, BLOCK_N=bn, MAX_UNSCALED=max_unscaled,
              EMULATE_BF16=False, WINDOW=window, SOFTCAP=softcap, HAS_SINKS=sinks)
    return (bm, bn, warps, stages), (fwd._attnscope_fwd_kernel, types, cx, warps, stages)


def compile_hopper(d, dt, causal, name, mods=0, lse=True):
    """A Gluon Hopper variant (`fwd_hopper.VARIANTS` ``name``) for sm_90 (``lse``: STORE_LSE)."""
    src = GluonASTSource(fn=fwd_hopper.kernel(name), signature=fwd_hopper.signature(d, dt, name),
                         constexprs=fwd_hopper.constexprs(d, causal, lse, name, mods))
    return triton.compile(src, target=TARGET, options=dict(num_warps=fwd_hopper.NUM_WARPS))


def head_dims(name):
    if name == "portable":
        return _common.SUPPORTED_HEAD_DIMS
    return tuple(sorted(fwd_hopper.VARIANTS[name].configs))


def built(name, d, causal):
    return name == "portable" or fwd_hopper.supports(name, d, causal)


def fwd_report(names) -> None:
    """Every forward kernel the dispatch can launch: the portable kernel and each Hopper variant, d 64 and
    128, with the score mods off and on (`FWD_MODS`), bf16 with the LSE stored; without mods also fp16,
    without the LSE, and (portable) MAX_UNSCALED (a softmax scale over 1 / log2(e))."""
    for name in names:
        for d in head_dims(name):
            for causal, window, softcap, sinks in FWD_MODS:
                plain = not (window or softcap or sinks)
                flavours = [("bf16", True, False)]  # dtype, STORE_LSE, MAX_UNSCALED
                if plain:
                    flavours += [("fp16", True, False), ("bf16", False, False)]
                    flavours += [("bf16", True, True)] if name == "portable" else []
                for dt, lse, raw in flavours:
                    what = _fmt(dict(CAUSAL=causal, WINDOW=window, SOFTCAP=softcap, SINKS=sinks,
                                     STORE_LSE=lse))
                    if name == "portable":
                        cfg, args = portable(d, dt, causal, window, softcap, sinks, lse, raw)
                        report(f"fwd {name:14s} d={d:3d} {dt} {what} MAX_UNSCALED={int(raw)} {cfg}",
                               compile_triton, *args)
                    else:
                        mods = fwd_hopper.mods_flags(window, 1.0 if softcap else 0.0, sinks)
                        var = fwd_hopper.VARIANTS[name]
                        cfg = tuple(fwd_hopper.config(d, name))
                        report(f"fwd {name:14s} d={d:3d} {dt} {what} MODS={mods} {cfg} "
                               f"pingpong={int(var.pingpong)} persistent={int(var.persistent)}",
                               compile_hopper, d, dt, causal, name, mods, lse, extra=setmaxnreg)


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
#: (CAUSAL, WINDOW, SOFTCAP) of the backward launches (sinks: torch, no kernel constexpr)
BWD_MODS = ((False, False, False), (True, False, False), (False, True, False), (True, False, True),
            (False, True, True))


def _bwd_types(dt, dq_fp32):
    t = {n: f"*{dt}" for n in ("Q", "K", "V", "O", "DO", "DK", "DV")}
    return {**t, "DQ": "*fp32" if dq_fp32 else f"*{dt}", "LSE2": "*fp32", "DELTA": "*fp32",
            "qk_scale": "fp32", "sm_scale": "fp32", "cap_in": "fp32"}


#: (CAUSAL, WINDOW, SOFTCAP) of the Gluon Hopper backward's score-mod builds (a window has CAUSAL off)
HOPPER_BWD_MODS = ((False, True, False), (False, False, True), (True, False, True), (False, True, True))


def compile_hopper_bwd(d, dt, causal, name, mods=0, mode="twokernel", cfg=None):
    """kernels/bwd_hopper.py's Gluon kernel ``name`` ("dkdv" or "dq") for sm_90 (``mods``: its ``MODS``;
    ``mode``: the dK/dV kernel's build, a ``bwd_hopper.MODES`` key; ``cfg``: a ``BwdConfig`` in place of
    ``bwd_hopper.config``'s)."""
    from attnscope.kernels import bwd_hopper

    src = GluonASTSource(fn=bwd_hopper.kernel(name),
                         signature=bwd_hopper.signature(d, dt, name, mods, cfg, mode),
                         constexprs=bwd_hopper.constexprs(d, causal, name, mods, mode, cfg))
    return triton.compile(src, target=TARGET, options=dict(num_warps=bwd_hopper.NUM_WARPS))


def bwd_report(dkdv=None, dq=None) -> None:
    """Every kernel of kernels/bwd.py: dK/dV with and without atomic dQ, the dQ pass, the preprocess, at
    the table's configs (or ``dkdv`` / ``dq``), each supported d, the score mods off and on (`BWD_MODS`);
    kernels/bwd_hopper.py's Gluon dK/dV and dQ kernels, bf16 and fp16, causal and not, and bf16 with the
    score mods (`HOPPER_BWD_MODS`)."""
    from attnscope.kernels import bwd, bwd_hopper

    dt = "bf16"
    for d in _common.SUPPORTED_HEAD_DIMS:
        for causal, window, softcap in BWD_MODS:
            mods = dict(CAUSAL=causal, WINDOW=window, SOFTCAP=softcap)
            for atomic in (False, True):
                bm, bn, w, s = dkdv or bwd.dkdv_config(d, atomic)
                cx = dict(HEAD_DIM=d, ATOMIC_DQ=atomic, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False, **mods)
                report(f"bwd dK/dV d={d:3d} {dt} {_fmt(mods)} ATOMIC_DQ={int(atomic)} {bm}x{bn} w{w} s{s}",
                       compile_triton, bwd._attnscope_bwd_dkdv_kernel, _bwd_types(dt, True), cx, w, s)
            bm, bn, w, s = dq or bwd.DQ_CONFIGS[d]
            cx = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False, **mods)
            report(f"bwd dQ    d={d:3d} {dt} {_fmt(mods)} {bm}x{bn} w{w} s{s}",
                   compile_triton, bwd._attnscope_bwd_dq_kernel, _bwd_types(dt, False), cx, w, s)
        for name in bwd_hopper.KERNELS if d in dispatch.HOPPER_BACKWARD_DIMS else ():  # the Gluon kernels
            cfg = bwd_hopper.config(d, name)
            shape = f"BM={cfg.BM} BN={cfg.BN} STAGES={cfg.STAGES} NWG={cfg.NWG}"
            for hdt in ("bf16", "fp16"):
                for causal in (False, True):
                    report(f"bwd hopper {name:4s} d={d:3d} {hdt} CAUSAL={int(causal)} MODS=0 {shape}",
                           compile_hopper_bwd, d, hdt, causal, name, extra=setmaxnreg)
            for causal, window, softcap in HOPPER_BWD_MODS:
                mods = fwd_hopper.mods_flags(window, 1.0 if softcap else 0.0, False)
                c = bwd_hopper.config(d, name, mods)
                report(f"bwd hopper {name:4s} d={d:3d} bf16 CAUSAL={int(causal)} MODS={mods} BM={c.BM} "
                       f"BN={c.BN} STAGES={c.STAGES} NWG={c.NWG}",
                       compile_hopper_bwd, d, "bf16", causal, name, mods, extra=setmaxnreg)
        for mode in ("onepass", "onepass-wg") if d in dispatch.HOPPER_BACKWARD_DIMS else ():  # one-pass
            cfg = bwd_hopper.config(d, "dkdv")
            for causal, mods in ((False, 0), (True, 0), (False, 3)):
                if not bwd_hopper.onepass_ok(d, _common.Mods(-1, -1, 1.0 if mods & 2 else 0.0, None)):
                    continue
                report(f"bwd hopper {mode} d={d:3d} bf16 CAUSAL={int(causal)} MODS={mods} BM={cfg.BM} "
                       f"BN={cfg.BN} STAGES={cfg.STAGES} DQ={cfg.DQ}",
                       compile_hopper_bwd, d, "bf16", causal, "dkdv", mods, mode, extra=setmaxnreg)
                tma = cfg._replace(RED=0)  # dQ by TMA reduce-adds (`_gluon_red.tma_reduce_add`)
                report(f"bwd hopper {mode} d={d:3d} bf16 CAUSAL={int(causal)} MODS={mods} BM={cfg.BM} "
                       f"BN={cfg.BN} STAGES={cfg.STAGES} DQ={cfg.DQ} RED=0",
                       compile_hopper_bwd, d, "bf16", causal, "dkdv", mods, mode, tma, extra=setmaxnreg)
        for name, table in bwd_hopper.LEAN_CONFIGS.items():  # the lean builds: the default where built
            if d not in table:
                continue
            cfg, windowed = table[d], fwd_hopper.mods_flags(True, 0.0, False)
            for mode in ("twokernel", bwd.HOPPER_ONEPASS_MODE) if name == "dkdv" else ("twokernel",):
                for causal, mods in ((False, 0), (True, 0), (False, windowed)):
                    for c in (cfg, cfg._replace(RED=0)) if mode != "twokernel" else (cfg,):
                        report(f"bwd hopper lean {name:4s} {mode} d={d:3d} bf16 CAUSAL={int(causal)} "
                               f"MODS={mods} BM={c.BM} BN={c.BN} STAGES={c.STAGES} RED={c.RED}",
                               compile_hopper_bwd, d, "bf16", causal, name, mods, mode, c, extra=setmaxnreg)
        for pdt, padded in itertools.product(("bf16", "fp16"), (False, True)):  # padded: the Hopper rows too
            cx = dict(HEAD_DIM=d, BLOCK_M=bwd.PRE_BLOCK_M, HAS_DLSE=False, PADDED=padded)
            types = {**_bwd_types(pdt, False), **dict.fromkeys(("LSE", "DLSE", "ROW0", "ROW1"), "*fp32"),
                     **dict.fromkeys(("row0_mul", "row0_add", "row1_mul"), "fp32")}
            report(f"bwd preprocess d={d:3d} {pdt} {bwd.PRE_BLOCK_M} rows PADDED={int(padded)} w4 s1",
                   compile_triton, bwd._attnscope_bwd_preprocess, types, cx, 4, 1)


# --- --sass-step: instructions per main-loop step of the Gluon backward's consumers --------------------
NVDISASM = os.path.join(os.path.dirname(PTXAS), "nvdisasm")
#: SASS opcode (its first dot-separated part, or the whole opcode) -> class, in the order printed
SASS_CLASSES = {
    "HGMMA": "HGMMA", "WARPGROUP.ARRIVE": "wgmma fence", "WARPGROUP.DEPBAR": "wgmma wait",
    "MUFU.EX2": "MUFU.EX2", "MUFU": "MUFU other", "FFMA": "FFMA", "FMUL": "FMUL", "FADD": "FADD",
    "FSEL": "FSEL/FMNMX", "FMNMX": "FSEL/FMNMX", "FSETP": "FSETP", "F2FP": "F2FP", "LDS": "LDS/LDSM",
    "LDSM": "LDS/LDSM", "STS": "STS/STSM", "STSM": "STS/STSM", "REDG": "RED/ATOM", "RED": "RED/ATOM",
    "ATOMG": "RED/ATOM", "ATOM": "RED/ATOM", "BAR": "BAR.SYNC", "SYNCS": "mbarrier", "MEMBAR": "fence",
    "FENCE": "fence", "BSSY": "BSSY/BSYNC", "BSYNC": "BSSY/BSYNC", "BRA": "BRA", "IMAD.MOV": "MOV",
    "MOV": "MOV", "UMOV": "uniform", "R2UR": "uniform", "S2UR": "uniform", "LDG": "LDG/STG", "STG": "LDG/STG",
    "ISETP": "int/pred", "PLOP3": "int/pred", "P2R": "int/pred", "R2P": "int/pred", "VOTE": "int/pred",
    "VOTEU": "uniform", "NOP": "NOP"}
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")


def _sass_class(op: str) -> str:
    for key in (op, ".".join(op.split(".")[:2]), op.split(".")[0]):
        if key in SASS_CLASSES:
            return SASS_CLASSES[key]
    head = op.split(".")[0]
    if head.startswith("U"):
        return "uniform"
    return "int/pred" if head[0] in "ILSPV" or head in ("SEL", "SHF", "LEA", "LOP3", "PRMT") else "other"


def sass_steps(cubin: bytes) -> list:
    """The loops of a compiled kernel that issue wgmma (``HGMMA``): for each, in program order, its
    instructions by class (`SASS_CLASSES`: opcodes of one loop trip, every instruction between the loop's
    head and its back-branch, both sides of a branch inside it counted), of which ``conditional`` (by class
    in ``conditional_classes``) a forward branch inside the loop may skip (the one-pass dS K product at
    d = 64 runs on every other trip of a warpgroup), and the MMA FLOPs of one trip (from the HGMMA shapes).
    A warp-specialised kernel has one such loop per consumer partition (more if the source splits the
    loop); the partitions' code is laid out in turn."""
    from collections import Counter

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, check=True).stdout
    insts, labels = [], {}
    for line in text.splitlines():
        if re.match(r"^\.L_x_\d+:", line):
            labels[line.split(":")[0]] = len(insts)
        m = _SASS_LINE.search(line)
        if m:
            insts.append((m.group(3), m.group(4)))
    edges = []  # (head, back-branch) of every backward branch whose span issues wgmma
    tail = max(i for i, (op, _) in enumerate(insts) if op == "EXIT")  # mbarrier retries are laid out after
    for i, (op, args) in enumerate(insts[:tail]):
        target = re.search(r"`\((\.L_x_\d+)\)", args) if op == "BRA" else None
        head = labels.get(target.group(1), i) if target else i
        if head < i and any(o.startswith("HGMMA") for o, _ in insts[head:i]):
            edges.append((head, i))
    loops = []
    for lo, hi in edges:  # innermost only
        if any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in edges):
            continue
        body = insts[lo:hi + 1]
        skipped = set()  # instructions a forward branch inside the loop jumps over (executed on some trips)
        for i, (op, args) in enumerate(body):
            target = re.search(r"`\((\.L_x_\d+)\)", args) if op == "BRA" else None
            if target and i < labels.get(target.group(1), -1) - lo <= len(body):
                skipped.update(range(i + 1, labels[target.group(1)] - lo))
        flops = sum(2 * math.prod(int(x) for x in o.split(".")[1].split("x")) for o, _ in body
                    if o.startswith("HGMMA"))
        loops.append({"classes": Counter(_sass_class(o) for o, _ in body), "total": len(body),
                      "mma_flops": flops, "span": (lo, hi), "conditional": len(skipped),
                      "conditional_classes": Counter(_sass_class(body[i][0]) for i in skipped)})
    return loops


def sass_step_report(d_list=(64, 128), dkdv_cfg=None) -> int:
    """Instructions per main-loop step of the Gluon backward's consumers, by class: the plain builds (d = 64:
    one-pass dK/dV for ``deterministic=False``, the dK/dV + dQ kernels for True; the fallback under softcap or
    fp16 with a small scale) and d = 128's two kernels, then the lean builds (`bwd_hopper.LEAN_CONFIGS`, the
    default at d = 64; the dK/dV one replaced by ``dkdv_cfg`` if given), bf16, not causal. Per step and per
    useful MFLOP of the step's tile pair (the backward's 2.5 x forward convention: 10 rows keys d FLOPs,
    whichever kernel does the product)."""
    from attnscope.kernels import bwd, bwd_hopper

    builds = []
    for d in d_list:
        if d in bwd.HOPPER_ONEPASS_DIMS:
            builds.append((d, "dkdv", bwd.HOPPER_ONEPASS_MODE, None))
        builds += [(d, "dkdv", "twokernel", None), (d, "dq", "twokernel", None)]
    for name, table in bwd_hopper.LEAN_CONFIGS.items():  # the lean builds (``dkdv_cfg``: another dK/dV one)
        for d, cfg in table.items():
            cfg = dkdv_cfg if dkdv_cfg is not None and name == "dkdv" else cfg
            modes = ["twokernel"] + ([bwd.HOPPER_ONEPASS_MODE] if name == "dkdv" else [])
            builds += [(d, name, mode, cfg) for mode in modes]
    classes = list(dict.fromkeys(SASS_CLASSES.values())) + ["int/pred", "other"]
    classes = list(dict.fromkeys(classes))
    for d, name, mode, cfg in builds:
        c = cfg or bwd_hopper.config(d, name)
        label = f"sass-step {name:4s} d={d:3d} {mode:10s} {tuple(c)}"
        try:
            k = compile_hopper_bwd(d, "bf16", False, name, 0, mode, cfg)
        except Exception as e:  # noqa: BLE001 - a compile error is the report's content
            FAILED.append(label)
            print(f"FAIL {label}: {type(e).__name__}: {' '.join(str(e).split())[:800]}", flush=True)
            continue
        info = ptxas_info(k.asm["ptx"])
        rows, keys = (c.BM, c.BN // c.NWG) if name == "dkdv" else (c.BM, c.BN)
        mflop = 10 * rows * keys * d / 1e6
        print(f"{label}: regs {info['regs']}, spill stores {info['stores']} B; step = {rows} rows x {keys} "
              f"keys x d {d} ({mflop:.2f} useful MFLOP)", flush=True)
        for w, loop in enumerate(sass_steps(k.asm["cubin"])):
            body = ", ".join(f"{cl} {loop['classes'][cl]}" for cl in classes if loop["classes"][cl])
            cond = ", ".join(f"{cl} {loop['conditional_classes'][cl]}" for cl in classes
                             if loop["conditional_classes"][cl])
            print(f"  loop {w}: {loop['total']} instructions ({loop['total'] / mflop:.0f} per MFLOP; "
                  f"non-HGMMA {loop['total'] - loop['classes']['HGMMA']}), MMA {loop['mma_flops'] / 1e6:.2f}"
                  f" MFLOP: {body}" + (f" | of which behind a branch {loop['conditional']}: {cond}" if cond
                                       else ""), flush=True)
    return 1 if FAILED else 0


# --- --kernel varlen ---------------------------------------------------------------------------------
#: (CAUSAL, WINDOW, SOFTCAP, SINKS) of the varlen launches (`varlen_plan.mod_args`: a window has CAUSAL off)
VARLEN_MODS = ((False, False, False, False), (True, False, False, False), (False, True, True, True),
               (True, False, True, True))


def _varlen_types(dt, dq_fp32):
    t = {n: f"*{dt}" for n in ("Q", "K", "V", "O", "DO", "DK", "DV")}
    return {**t, "DQ": "*fp32" if dq_fp32 else f"*{dt}", "LSE": "*fp32", "LSE2": "*fp32", "DELTA": "*fp32",
            "SINKS": "*fp32", "CU_Q": "*i32", "CU_K": "*i32", "WORK_SEQ": "*i32", "WORK_TILE": "*i32",
            "qk_scale": "fp32", "sm_scale": "fp32", "sc_in": "fp32", "sc_out": "fp32"}


def varlen_report() -> None:
    """The packed variable-length kernels: the forward (TMA and pointer K/V loads) and the backward's
    dK/dV (atomic dQ on and off) and dQ pass, each supported d, mods off and on (`VARLEN_MODS`); the
    preprocess is the dense backward's (``--kernel bwd``)."""
    from attnscope.kernels import bwd, varlen, varlen_bwd

    for d in _common.SUPPORTED_HEAD_DIMS:
        for causal, window, softcap, sinks in VARLEN_MODS:
            mods = dict(CAUSAL=causal, WINDOW=window, SOFTCAP=softcap)
            for dt in ("bf16", "fp16") if not (window or softcap) else ("bf16",):
                bm, bn, w, s = varlen.pick_config(d, causal or window, 1)
                # TMA builds the default takes (`varlen._tma_builds`: ptxas crashes on the others)
                for tma in (True, False) if varlen._tma_builds(d, causal or window) else (False,):
                    cx = dict(HEAD_DIM=d, STORE_LSE=True, BLOCK_M=bm, BLOCK_N=bn, USE_TMA=tma,
                              MAX_UNSCALED=False, EMULATE_BF16=False, HAS_SINKS=sinks, **mods)
                    desc = f"tensordesc<{dt}[{bn},1,{d}]>" if tma else f"*{dt}"  # host-built descriptors
                    report(f"varlen fwd d={d:3d} {dt} {_fmt(mods)} HAS_SINKS={int(sinks)} USE_TMA={int(tma)} "
                           f"{bm}x{bn} w{w} s{s}",
                           compile_triton, varlen._attnscope_varlen_kernel,
                           {**_varlen_types(dt, False), "desc_k": desc, "desc_v": desc}, cx, w, s)
            dt = "bf16"
            for atomic in (False, True):
                bm, bn, w, s = bwd.dkdv_config(d, atomic)
                cx = dict(HEAD_DIM=d, ATOMIC_DQ=atomic, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False, **mods)
                report(f"varlen dK/dV d={d:3d} {dt} {_fmt(mods)} ATOMIC_DQ={int(atomic)} {bm}x{bn} w{w} s{s}",
                       compile_triton, varlen_bwd._attnscope_varlen_dkdv_kernel, _varlen_types(dt, True), cx,
                       w, s)
            bm, bn, w, s = bwd.DQ_CONFIGS[d]
            cx = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False, **mods)
            report(f"varlen dQ    d={d:3d} {dt} {_fmt(mods)} {bm}x{bn} w{w} s{s}",
                   compile_triton, varlen_bwd._attnscope_varlen_dq_kernel, _varlen_types(dt, False), cx, w, s)
    for d in (64, 128):  # the Gluon backward `varlen_bwd.pick_impl` takes on sm_90 (no mods)
        for dt in ("bf16", "fp16"):
            for causal in (False, True):
                for name in ("dkdv", "dq"):
                    report(f"varlen gluon {name} d={d:3d} {dt} CAUSAL={int(causal)}",
                           compile_varlen_hopper_bwd, d, dt, causal, name, extra=setmaxnreg)


def compile_varlen_hopper_bwd(d, dt, causal, name):
    """kernels/varlen_bwd_hopper.py's Gluon kernel ``name`` ("dkdv" or "dq") for sm_90."""
    from attnscope.kernels import varlen_bwd_hopper as vh

    src = GluonASTSource(fn=vh.kernel(name), signature=vh.signature(d, dt, name),
                         constexprs=vh.constexprs(d, causal, name))
    return triton.compile(src, target=TARGET, options=dict(num_warps=vh.NUM_WARPS))


# --- --kernel decode ---------------------------------------------------------------------------------
#: (label, BLOCK_M, page size (0: dense), FUSE, CHUNK): decode row tiles (16 rows: fused / separate
#: merge), paged caches, chunked prefill (128 rows; on a dense cache the plan runs the paged loop over
#: pages of BLOCK_N keys, `DecodePlan`)
DECODE_SHAPES = (("decode dense fused", 16, 0, True, False), ("decode dense separate", 16, 0, False, False),
                 ("decode paged16 fused", 16, 16, True, False),
                 ("decode paged64 separate", 16, 64, False, False),
                 ("decode paged256 separate", 16, 256, False, False),
                 ("chunk32 dense(paged BLOCK_N) fused", 32, -1, True, True),
                 ("chunk64 paged64 separate", 64, 64, False, True),
                 ("chunk128 dense(paged BLOCK_N)", 128, -1, False, True),
                 ("chunk128 paged16", 128, 16, False, True))
#: every score mod on (`decode.plan`: optional constexprs passed only when on)
DECODE_MODS = dict(WINDOW=True, SOFTCAP=True, HAS_SINKS=True)


def _cp_async(ptx: str) -> str:
    """Whether the KV loop is software-pipelined with cp.async (tests/test_decode.py asserts it)."""
    return f"cp.async {'cp.async' in ptx}"


def _decode_types(kv):
    return {"Q": "*bf16", "K": kv, "V": kv, "SEQLENS": "*i32", "BT": "*i32", "O_PART": "*fp32",
            "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32", "SEM": "*i32", "ERR": "*i32",
            "K_SCALE": "*fp32", "V_SCALE": "*fp32", "SINKS": "*fp32", "qk_scale": "fp32", "softcap2": "fp32"}


def decode_report() -> None:
    """The split-KV decode kernel as `DecodePlan` builds it (`heuristics._block_config` per row tile and
    page size; `DECODE_SHAPES`), bf16 and FP8 e4m3 caches (per-tensor scales with the mods off, per-head
    with them on), score mods off and on, d 64, 128 and 256 (d 64 and 256: bf16 plain and FP8 with every mod;
    past d = 128 the plan's tiles hold fewer keys, `heuristics._keys_for_dim`); then the
    combine kernel (with and without sinks), `kernels.merge`'s kernel and the KV-cache append
    (`decode.append`)."""
    from attnscope.kernels import merge
    from attnscope.kernels.decode import _kernel, append, heuristics

    unaligned = ("stride_sb", "stride_tb")
    for d in (128, 64, 256):
        for kv in ("bf16", "fp8"):
            for mods in (False, True):
                if d != 128 and mods != (kv == "fp8"):
                    continue  # d 64 and 256: bf16 plain and FP8 with every mod
                # FP8: one scale per tensor with the mods off, one per kv head with them on
                opt = {**(DECODE_MODS if mods else {}),
                       **(dict(FP8=True, SCALE_PER_HEAD=mods, FP8_WORDS=True, FP8_ASM=True) if kv == "fp8"
                          else {})}
                for label, block_m, page, fuse, chunk in DECODE_SHAPES:
                    if page < 0:
                        page = heuristics._block_config(block_m, head_dim=d)["BLOCK_N"]
                    cfg = heuristics._block_config(block_m, page, kv == "fp8", head_dim=d)
                    f16qk = kv == "fp8" and bool(cfg.get("F16QK"))  # as the plan: fp16 Q K^T, V per byte
                    shape_opt = {**opt, "FP8_WORDS": False, "FP8_F16QK": True} if f16qk else opt
                    rows = block_m if chunk else 4  # GROUP 4 x 1 query (decode), 128 rows (chunk)
                    merge_m = min(block_m, triton.next_power_of_2(rows))
                    cx = dict(GROUP=4, BLOCK_M=block_m, HEAD_DIM=d, BLOCK_N=cfg["BLOCK_N"],
                              STAGES=cfg["STAGES"], USE_DOT=True, EMULATE_BF16=False, SPLIT=True, FUSE=fuse,
                              MERGE_M=merge_m, MERGE_S=max(1, min(8, heuristics.MERGE_ELEMS // merge_m // d)),
                              WRITE_LSE=True, HAS_SEQLENS=True, PAGED=page > 0, PAGE_SIZE=max(page, 1),
                              CHUNK=chunk, OFF32=True, **shape_opt)
                    types = _decode_types("*fp8e4nv" if kv == "fp8" else "*bf16")
                    report(f"decode split d={d:3d} kv {kv:4s} mods={int(mods)} {label:30s} "
                           f"BLOCK_N {cfg['BLOCK_N']} STAGES {cfg['STAGES']} w{cfg['num_warps']}",
                           compile_triton, _kernel._attnscope_decode_split_kernel, types, cx,
                           cfg["num_warps"], cfg["num_stages"], unaligned, extra=_cp_async)
        ctypes = {"O_PART": "*fp32", "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32", "SINKS": "*fp32"}
        for sinks in (False, True):
            cx = dict(HEAD_DIM=d, BLOCK_S=16, EMULATE_BF16=False, HAS_SINKS=sinks)
            report(f"decode combine d={d:3d} HAS_SINKS={int(sinks)}",
                   compile_triton, _kernel._attnscope_decode_combine_kernel, ctypes, cx, 4, 1)
        mtypes = {"O": "*fp32", "LSE": "*fp32", "O_PART": "*bf16", "LSE_PART": "*fp32"}
        report(f"merge_ d={d:3d}", compile_triton, merge._attnscope_merge_kernel, mtypes,
               dict(BLOCK_R=merge.BLOCK_R, BLOCK_D=d), 4, 1)
        atypes = {"K": "*bf16", "V": "*bf16", "K_CACHE": "*bf16", "V_CACHE": "*bf16", "SEQLENS": "*i32",
                  "BT": "*i32", "LENS_OUT": "*i32"}
        for page in (0, 64):  # flash_attn_with_kvcache's append (`decode.append`), 8 kv heads, one new key
            for lens in (True, False):
                cx = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_H=8, BLOCK_P=1, HAS_SEQLENS=lens, PAGED=page > 0,
                          PAGE_SIZE=max(page, 1))
                label = f"{'paged' if page else 'dense'} {'tensor' if lens else 'int'} lengths"
                report(f"kv_append d={d:3d} {label}", compile_triton, append._attnscope_kv_append_kernel,
                       atypes, cx, 2, 1, ("stride_tb",))  # 2 warps: `append._build` for 8 x d <= 1024


# --- --sass-per-kib: instructions per KiB of K/V in the decode KV loop --------------------------------
#: SASS opcode (the name before the first ".") -> class; a ``U``-prefixed uniform-datapath opcode counts
#: as "int" (loop counters and shared-memory bases), an opcode in no class as "other" (MOV, NOP, CS2R, ...)
KIB_CLASSES = {
    "ld/st": ("LDG", "LDGSTS", "LDS", "LDSM", "STS", "STSM", "STG", "LDC", "LDL", "STL"),
    "cvt/bit": ("F2FP", "F2F", "I2F", "F2I", "I2FP", "F2IP", "PRMT", "SHF", "LOP3", "SGXT", "BMSK", "HADD2",
                "HMUL2", "HFMA2"),
    "mma": ("HMMA", "HGMMA", "QMMA", "IMMA"),
    "softmax": ("FFMA", "FMUL", "FADD", "MUFU", "FMNMX", "FSEL", "FSETP", "SHFL", "FSWZADD"),
    "int": ("IMAD", "IADD3", "LEA", "VIADD", "VIADDMNMX", "IMNMX", "VIMNMX", "SEL", "ISETP", "IABS"),
    "sync/branch": ("BAR", "BRA", "BSSY", "BSYNC", "DEPBAR", "LDGDEPBAR", "WARPSYNC", "PLOP3", "ARRIVES",
                    "SYNCS", "EXIT"),
}
_KIB_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)[^;]*;")
_SASS_LABEL = re.compile(r"^(\.L_x_\d+):")


def sass_class(op: str) -> str:
    for cls, ops in KIB_CLASSES.items():
        if op in ops:
            return cls
    return "int" if op.startswith("U") else "other"


def sass_loop(sass: str) -> dict:
    """The hot loop of a kernel's SASS (``nvdisasm -c`` text): of the loops closed by a backward branch,
    the one with the most MMA instructions (the KV loop; the fused merge's loop has none). Returns its
    instruction count per class (`KIB_CLASSES`), per opcode, and in all, over the loop body from its
    label to the branch (every instruction once: the loop has no inner loop; its forward branches skip
    little)."""
    insts, labels, pending = [], {}, []
    for line in sass.splitlines():
        m = _SASS_LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _KIB_LINE.match(line)
        if m:
            for lab in pending:
                labels[lab] = len(insts)
            pending = []
            target = re.search(r"`\((\.L_x_\d+)\)", line)
            insts.append((m.group(2), target.group(1) if m.group(2) == "BRA" and target else None))
    loops = [(labels[t], i) for i, (op, t) in enumerate(insts) if t in labels and labels[t] <= i]
    if not loops:
        raise ValueError("no loop (backward branch) in the SASS")
    lo, hi = max(loops, key=lambda r: sum(sass_class(op) == "mma" for op, _ in insts[r[0]:r[1] + 1]))
    ops = [op for op, _ in insts[lo:hi + 1]]
    by_op = {}
    for op in ops:
        by_op[op] = by_op.get(op, 0) + 1
    by_class = {cls: 0 for cls in (*KIB_CLASSES, "other")}
    for op in ops:
        by_class[sass_class(op)] += 1
    return {"total": len(ops), "class": by_class, "op": by_op}


def sass_of(kernel) -> str:
    """``nvdisasm -c`` of a compiled kernel's cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, check=True).stdout


def loop_per_kib(kernel, block_n: int, head_dim: int, kv_bytes: int, warps: int) -> dict:
    """Warp instructions per KiB of K/V of the KV loop (`sass_loop`): each SASS instruction of the loop
    body issues once per warp per iteration, and an iteration reads ``block_n`` keys of K and of V
    (``2 * block_n * head_dim * kv_bytes`` bytes). Per class and in all, with the loop's raw counts."""
    loop = sass_loop(sass_of(kernel))
    kib = 2 * block_n * head_dim * kv_bytes / 1024
    return {"per_kib": loop["total"] * warps / kib,
            "class_per_kib": {c: n * warps / kib for c, n in loop["class"].items()}, **loop}


#: (label, page size (0: dense)) of `sass_report`: the decode tile of Hq/Hkv 32/8, Nq 1 (GROUP 4, 16 rows)
SASS_LAYOUTS = (("dense", 0), ("paged64", 64), ("paged16", 16), ("paged256", 256))


def sass_report(names=None) -> None:
    """Instructions per KiB of K/V in the decode KV loop (`loop_per_kib`) as the plan builds it for a
    decode tile (GROUP 4, one query, 16 rows, d 128, fused split merge, lengths read, int32 offsets): the
    bf16 cache at `heuristics._block_config`'s tile (paged: also with ``PAGE_PRECHECK`` on, "bf16
    precheck") and each e4m3 config of `heuristics.FP8_CONFIGS` (or ``names``), dense and paged
    (`SASS_LAYOUTS`); with ptxas's registers and spill bytes, the kernel's shared memory (bytes) and the
    loop's cp.async copies (LDGSTS: 0 if the loop is not pipelined)."""
    from attnscope.kernels.decode import _kernel, heuristics

    names = list(heuristics.FP8_CONFIGS) if names is None else names
    classes = (*KIB_CLASSES, "other")
    print(f"{'kernel':28s} {'layout':8s} {'BN':>4s} {'w':>2s} {'st':>2s} {'regs':>4s} {'spill':>5s} "
          f"{'smem':>6s} {'LDGSTS':>6s} {'loop':>5s} {'/KiB':>6s} | "
          + " ".join(f"{c:>11s}" for c in classes), flush=True)
    for kv, name in [("bf16", "bf16"), ("bf16", "precheck"), *(("fp8", n) for n in names)]:
        for layout, page in SASS_LAYOUTS:
            if kv == "fp8":
                cfg = heuristics._fp8_config(name, page)
                f16qk = bool(cfg.get("F16QK"))
                opt = dict(FP8=True, FP8_WORDS=not f16qk, FP8_F16QK=f16qk, FP8_ASM=True)
            elif name == "precheck":  # the paged loop with PAGE_PRECHECK on, whatever the shipped default
                if not page:
                    continue
                cfg, opt = heuristics._block_config(16, page), {"PAGE_PRECHECK": True}
            else:
                cfg = heuristics._block_config(16, page)
                opt = {"PAGE_PRECHECK": True} if cfg.get("PAGE_PRECHECK") else {}
            cx = dict(GROUP=4, BLOCK_M=16, HEAD_DIM=128, BLOCK_N=cfg["BLOCK_N"], STAGES=cfg["STAGES"],
                      USE_DOT=True, EMULATE_BF16=False, SPLIT=True, FUSE=True, MERGE_M=4, MERGE_S=8,
                      WRITE_LSE=False, HAS_SEQLENS=True, PAGED=page > 0, PAGE_SIZE=max(page, 1), CHUNK=False,
                      OFF32=True, **opt)
            label = f"{kv} {name}" if kv == "fp8" or name != "bf16" else "bf16"
            try:
                types = _decode_types("*fp8e4nv" if kv == "fp8" else "*bf16")
                k = compile_triton(_kernel._attnscope_decode_split_kernel, types, cx, cfg["num_warps"],
                                   cfg["num_stages"], ("stride_sb", "stride_tb"))
                r = loop_per_kib(k, cfg["BLOCK_N"], 128, 1 if kv == "fp8" else 2, cfg["num_warps"])
            except Exception as e:  # noqa: BLE001 - a failed build is the row's content
                FAILED.append(f"{label} {layout}")
                msg = " ".join(str(e).split())[:300]
                print(f"FAIL {label} {layout}: {type(e).__name__}: {msg}", flush=True)
                continue
            info = ptxas_info(k.asm["ptx"])
            print(f"{label:28s} {layout:8s} {cfg['BLOCK_N']:4d} {cfg['num_warps']:2d} {cfg['STAGES']:2d} "
                  f"{info['regs']:4d} {info['stores']:5d} {k.metadata.shared:6d} "
                  f"{r['op'].get('LDGSTS', 0):6d} {r['total']:5d} {r['per_kib']:6.1f} | "
                  + " ".join(f"{r['class_per_kib'][c]:11.1f}" for c in classes), flush=True)


def _config(flag):
    parts = flag.split(",")
    if len(parts) != 4 or not all(x.strip().isdigit() for x in parts):
        raise argparse.ArgumentTypeError(f"expected BM,BN,WARPS,STAGES (4 integers), got {flag!r}")
    return tuple(int(x) for x in parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=("fwd", "bwd", "varlen", "decode", "all"), default="fwd",
                   help="which kernels to compile (default: the forward kernels)")
    p.add_argument("--dkdv", type=_config, metavar="BM,BN,WARPS,STAGES",
                   help="--kernel bwd: a dK/dV config (default: the table's)")
    p.add_argument("--dq", type=_config, metavar="BM,BN,WARPS,STAGES",
                   help="--kernel bwd: a dQ-pass config (default: the table's)")
    p.add_argument("--gpu", action="store_true", help="launch each variant, print the loaded kernel metadata")
    p.add_argument("--variant", action="append", help="portable or a fwd_hopper.VARIANTS name (default: all)")
    p.add_argument("--evidence", action="store_true",
                   help="compile minimal loops of mbarrier waits/arrives; print where the bar.syncs are")
    p.add_argument("--sass-per-kib", action="store_true",
                   help="warp instructions per KiB of K/V in the decode KV loop by class (SASS), bf16 "
                        "and each e4m3 config of decode.heuristics.FP8_CONFIGS (or --fp8-config), dense and "
                        "paged")
    p.add_argument("--fp8-config", action="append", help="with --sass-per-kib: an FP8_CONFIGS name")
    p.add_argument("--dtype", action="append", choices=("bf16", "fp16"),
                   help="with --gpu: the dtype(s) launched (default bf16)")
    p.add_argument("--sass-step", action="store_true",
                   help="SASS instructions per main-loop step of the Gluon backward's consumers, by class "
                        "(nvdisasm), d 64 and 128")
    p.add_argument("--hopper-dkdv", metavar="BM,BN,STAGES[,NWG,DQ,RED,...]",
                   help="with --sass-step: this bwd_hopper.BwdConfig for the d = 64 dK/dV kernel in place of "
                        "the lean one (bwd_hopper.LEAN_CONFIGS)")
    a = p.parse_args()
    if a.sass_step:
        from attnscope.kernels import bwd_hopper

        cfg = bwd_hopper.BwdConfig(*map(int, a.hopper_dkdv.split(","))) if a.hopper_dkdv else None
        return sass_step_report(dkdv_cfg=cfg)
    names = a.variant or ["portable", *fwd_hopper.VARIANTS]
    if a.evidence:
        return evidence()
    if a.sass_per_kib:
        sass_report(a.fp8_config)
        return 1 if FAILED else 0
    if a.gpu:
        return gpu_report(names, tuple(a.dtype or ("bf16",)))
    print(f"triton {triton.__version__}, target sm_90 (ptxas --gpu-name sm_90a), no GPU; shared-memory limit "
          f"{SMEM_LIMIT} B", flush=True)
    kinds = ("fwd", "bwd", "varlen", "decode") if a.kernel == "all" else (a.kernel,)
    for kind in kinds:
        if kind == "fwd":
            fwd_report(names)
        elif kind == "bwd":
            bwd_report(a.dkdv, a.dq)
        elif kind == "varlen":
            varlen_report()
        else:
            decode_report()
    print(f"{len(FAILED)} failed" + (": " + "; ".join(FAILED) if FAILED else ""), flush=True)
    return 1 if FAILED else 0

if __name__ == "__main__":
    sys.exit(main())
