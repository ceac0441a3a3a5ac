"""Probe (H200): the one-pass Hopper backward with dQ by TMA reduce-adds (``RED = 0``, `_gluon_red.tma_reduce_add`)
against dQ by red instructions (RED 1 / 2) and the two-kernel build, d 128 (plain) and d 64 (lean), bf16.
Per shape: every build's dQ, dK, dV against float64 on heads 0-1 of batch 0 (3 x SDPA FLASH's error + 1e-3,
`checks.kernel_tolerance`), then the backward alone timed (triton.testing.do_bench, median) in interleaved
rounds, SDPA CUDNN's backward (retained graph) beside; TFLOP/s with the 2.5 x forward convention.
    PYTHONPATH=src python probes/onepass_tma_probe.py [rounds]"""
import os
import sys

import torch
import triton

from attnscope import checks, reference
from attnscope.kernels import bwd, bwd_hopper, bwd_plan, fwd
from attnscope.model.flops import attention_flops

OUT = os.environ.get("OUT", "/tmp")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
SHAPES = [(16, 32, 32, 1024, 128, False), (4, 32, 32, 4096, 128, False), (1, 32, 32, 16384, 128, False),
          (16, 32, 32, 1024, 128, True), (4, 32, 32, 4096, 128, True), (1, 32, 32, 16384, 128, True),
          (1, 16, 4, 8192, 128, True), (2, 32, 8, 8192, 128, False),
          (4, 32, 32, 4096, 64, False), (1, 32, 32, 16384, 64, False), (4, 32, 32, 4096, 64, True),
          (1, 32, 32, 16384, 64, True), (1, 32, 8, 8192, 64, True)]  # B, Hq, Hkv, N, d, causal
PLAIN = {d: bwd_hopper.CONFIGS["dkdv"][d] for d in (64, 128)}
LEAN = dict(bwd_hopper.LEAN_CONFIGS["dkdv"])
#: name -> (deterministic, dK/dV config per d or None for the table's); d 64 keeps the lean build (its default)
BUILDS = {"twokernel": (True, {}), "onepass-red": (False, {128: PLAIN[128], 64: LEAN[64]}),
          "onepass-tma": (False, {128: PLAIN[128]._replace(RED=0), 64: LEAN[64]._replace(RED=0)})}
log = open(f"{OUT}/onepass_tma_probe.txt", "w")


def say(s):
    print(s, flush=True)
    log.write(s + "\n")
    log.flush()


def use(name, d):
    det, cfgs = BUILDS[name]
    bwd.HOPPER_ONEPASS_DIMS = (64, 128)
    if d in cfgs:
        (bwd_hopper.LEAN_CONFIGS if cfgs[d].LEAN else bwd_hopper.CONFIGS)["dkdv"][d] = cfgs[d]
    bwd_plan.clear_plan_cache()
    return det


def err64(got, q, k, v, do, causal):
    """max |grad - float64| over heads 0-1 of batch 0 (the KV heads they read)."""
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    qs, dos = q[0, :2].double().cpu().numpy(), do[0, :2].double().cpu().numpy()
    ks, vs = (t[0, [0, 1 // g]].double().cpu().numpy() for t in (k, v))
    ro, rlse = reference.naive_attention(qs, ks, vs, causal=causal, return_lse=True)
    dq, dk, dv = reference.attention_backward(dos, qs, ks, vs, ro, rlse, causal=causal)
    e = abs(got[0][0, :2].double().cpu().numpy() - dq).max()
    if g == 1:  # dK, dV of heads 0-1 are those heads' alone
        e = max(e, abs(got[1][0, :2].double().cpu().numpy() - dk).max(),
                abs(got[2][0, :2].double().cpu().numpy() - dv).max())
    return e


for B, Hq, Hkv, N, d, causal in SHAPES:
    gen = torch.Generator(device="cuda").manual_seed(N + d)
    q, do = (torch.randn(B, Hq, N, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k, v = (torch.randn(B, Hkv, N, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    o, lse = fwd.flash_attention(q, k, v, causal=causal, return_lse=True)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        ref_o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=Hq != Hkv)
    torch_err = err64(torch.autograd.grad(ref_o, leaves, do), q, k, v, do, causal) if N <= 4096 else None
    bound = None if torch_err is None else checks.kernel_tolerance(torch_err, checks.GRAD_FACTOR)
    calls, res = {}, {}
    for name in BUILDS:
        det = use(name, d)
        got = bwd.flash_attention_backward(do, q, k, v, o, lse, causal, None, deterministic=det, impl="hopper")
        torch.cuda.synchronize()
        e = err64(got, q, k, v, do, causal) if N <= 4096 else float("nan")
        if name == "twokernel":
            base = got
        diff = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(got, base))
        ok = (bound is None or e <= bound) and diff <= 1e-2
        res[name] = f"err64 {e:.2e} rel-vs-twokernel {diff:.1e} {'PASS' if ok else 'FAIL'}"
        if ok:
            calls[name] = (det, lambda det=det: bwd.flash_attention_backward(do, q, k, v, o, lse, causal, None,
                                                                             deterministic=det, impl="hopper"))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        lv = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*lv, is_causal=causal, enable_gqa=Hq != Hkv)
    calls["cudnn"] = (None, lambda: torch.autograd.grad(out, lv, do, retain_graph=True))
    times = {n: [] for n in calls}
    names = list(calls)
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            if n in BUILDS:
                use(n, d)
            times[n].append(triton.testing.do_bench(calls[n][1], warmup=50, rep=200))
    flops = 2.5 * attention_flops(B, Hq, N, N, d, causal)
    med = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
    tf = {n: flops / (m * 1e-3) / 1e12 for n, m in med.items()}
    say(f"B {B} H {Hq}/{Hkv} N {N} d {d} causal {int(causal)} | " + " | ".join(f"{n} {res[n]}" for n in res))
    say("   TFLOP/s " + "  ".join(f"{n} {tf[n]:.0f}" for n in tf)
        + "  | / cudnn " + "  ".join(f"{n} {tf[n] / tf['cudnn']:.3f}" for n in tf if n != "cudnn")
        + ("  | tma / red %.3f" % (tf["onepass-tma"] / tf["onepass-red"]) if "onepass-tma" in tf and "onepass-red" in tf else "")
        + ("  | tma / twokernel %.3f" % (tf["onepass-tma"] / tf["twokernel"]) if "onepass-tma" in tf else ""))
