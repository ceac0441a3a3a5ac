"""Decode and chunked-prefill block configs (BLOCK_N, warps, stages) x split counts, for `_block_config`.

    PYTHONPATH=src python bench/decode_configs.py [--json PATH]

Decode (one query, bf16, d = 128): the points where graph replay trailed SDPA CUDNN's graph on
2026-12-01 (bench/decode_splits.py), each config with the default split count and twice it (a config of
<= 96 KiB of shared memory fits two CTAs per SM), timed as graph replays beside CUDNN's graph (before and
after the configs, same inputs). Chunked prefill (bench/chunked.py's setup: B = 1, Hq = 32, Hkv = 8, a
32k cache, Nq = 512 and 2048, bottom-right causal): each config timed eagerly (``plan.run``, dense and
paged 64). Every config is checked against float64 first (2 x SDPA's error + 1e-3); a config that does
not compile or fails the check is reported and skipped.
"""

import argparse
import json
import sys

import torch

import attnscope
from attnscope.model.flops import attention_flops

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from chunked import check as chunk_check  # noqa: E402
from chunked import paged as chunk_paged  # noqa: E402
from decode import graph_of, inputs, ms, reference_error  # noqa: E402

DECODE_POINTS = [(1, 32, 32, 32768), (1, 32, 32, 131072), (16, 32, 8, 4096), (16, 32, 8, 32768),
                 (16, 32, 8, 131072), (1, 32, 8, 131072), (64, 32, 8, 4096)]
DECODE_CONFIGS = [(128, 4, 3), (64, 4, 3), (64, 4, 4), (64, 4, 5), (64, 4, 6), (64, 8, 4), (128, 8, 3),
                  (32, 4, 8), (128, 4, 2)]
CHUNK_CONFIGS = [(64, 8, 3), (64, 8, 4), (64, 8, 5), (64, 8, 6), (128, 8, 2), (128, 8, 3), (32, 8, 6),
                 (64, 4, 5), (128, 4, 3)]


def cfg_of(bn, w, st):
    return {"BLOCK_N": bn, "STAGES": st, "num_warps": w, "num_stages": st}


def decode_point(B, Hq, Hkv, L, log):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v, lens = inputs(B, Hq, Hkv, L)
    rep = 40 if B * L <= 2**20 else 100

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, enable_gqa=True)

    g_ref = graph_of(cudnn)
    ref = [ms(g_ref.replay, rep)]
    s0 = attnscope.decode_plan(q, k, v, lens, check_seqlens=False).num_splits
    res = {}
    for bn, w, st in DECODE_CONFIGS:
        for s in (s0, 2 * s0):
            name = f"{bn}/{w}/{st} s={s}"
            try:
                plan = attnscope.decode_plan(q, k, v, lens, num_splits=s, check_seqlens=False,
                                             _config=cfg_of(bn, w, st))
                err, bound = reference_error(plan.run(q, k, v, lens), q, k, v)
                if not err <= bound:
                    res[name] = f"MISMATCH {err:.2e} > {bound:.2e}"
                    continue
                g = graph_of(lambda plan=plan: plan.run(q, k, v, lens))
                res[name] = ms(g.replay, rep)
            except Exception as e:  # noqa: BLE001 - reported
                res[name] = f"failed: {type(e).__name__}: {str(e)[:80]}"
    ref.append(ms(g_ref.replay, rep))
    c = sum(ref) / 2
    timed = {n: t for n, t in res.items() if isinstance(t, float)}
    best = min(timed, key=timed.get)
    log(f"decode B={B} Hkv={Hkv} L={L}: CUDNN graph {ref[0]:.4f}/{ref[1]:.4f} ms; base "
        f"{c / timed[f'128/4/3 s={s0}']:.3f}x; best {best} {c / timed[best]:.3f}x | "
        + " ".join(f"[{n}] {c / t:.3f}" if isinstance(t, float) else f"[{n}] {t}" for n, t in res.items()))
    return {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "cudnn_graph_ms": ref, "configs": res}


def chunk_point(nq, log):
    B, HQ, HKV, D, L = 1, 32, 8, 128, 32768
    torch.manual_seed(0)
    k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    q = torch.randn(B, HQ, nq, D, device="cuda", dtype=torch.bfloat16)
    kp, vp, table = chunk_paged(k, v, 64)
    sample = torch.randperm(nq, device="cuda")[:64].sort().values
    flops = attention_flops(B, HQ, nq, L, D, True, "forward")
    res = {}
    for bn, w, st in CHUNK_CONFIGS:
        name = f"{bn}/{w}/{st}"
        try:
            plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False, _config=cfg_of(bn, w, st))
            err, bound = chunk_check(plan.run(q, k, v, lens), q, k, v, nq, sample)
            if not err <= bound:
                res[name] = f"MISMATCH {err:.2e} > {bound:.2e}"
                continue
            pplan = attnscope.decode_plan(q, kp, vp, lens, table, check_seqlens=False,
                                          _config=cfg_of(bn, w, st))
            t = ms(lambda plan=plan: plan.run(q, k, v, lens), 100)
            tp = ms(lambda pplan=pplan: pplan.run(q, kp, vp, lens, table), 100)
            res[name] = {"dense_tflops": flops / t / 1e9, "paged64_tflops": flops / tp / 1e9}
        except Exception as e:  # noqa: BLE001 - reported
            res[name] = f"failed: {type(e).__name__}: {str(e)[:80]}"
    log(f"chunk Nq={nq}: TFLOP/s dense / paged64 | " + " ".join(
        f"[{n}] {r['dense_tflops']:.0f}/{r['paged64_tflops']:.0f}" if isinstance(r, dict) else f"[{n}] {r}"
        for n, r in res.items()))
    return {"nq": nq, "configs": res}


def chunk_layouts(log):
    """Dense head-major [B, Hkv, L, d] vs dense token-major (a [B, L, Hkv, d] buffer viewed as
    ``buf.transpose(1, 2)``, flash-attn's and vLLM's cache layout) vs paged 64, same config."""
    B, HQ, HKV, D, L = 1, 32, 8, 128, 32768
    out = []
    for nq in (512, 2048):
        torch.manual_seed(0)
        k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
        kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))  # token-major storage
        lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
        q = torch.randn(B, HQ, nq, D, device="cuda", dtype=torch.bfloat16)
        kp, vp, table = chunk_paged(k, v, 64)
        flops = attention_flops(B, HQ, nq, L, D, True, "forward")
        sample = torch.randperm(nq, device="cuda")[:64].sort().values
        row = {"nq": nq}
        for st in (3, 5):
            cfg = cfg_of(64, 8, st)
            for name, (kk, vv, tb) in {"head-major": (k, v, None), "token-major": (kt, vt, None),
                                       "paged 64": (kp, vp, table)}.items():
                plan = attnscope.decode_plan(q, kk, vv, lens, tb, check_seqlens=False, _config=cfg)
                o = plan.run(q, kk, vv, lens, tb)
                err, bound = chunk_check(o, q, k, v, nq, sample)
                t = ms(lambda plan=plan, a=(q, kk, vv, lens, tb): plan.run(*a), 100)
                row[f"{name} stages {st}"] = {"tflops": flops / t / 1e9, "ok": err <= bound}
        log(f"chunk layouts Nq={nq}: " + " ".join(f"[{n}] {r['tflops']:.0f}{'' if r['ok'] else ' MISMATCH'}"
                                                   for n, r in row.items() if n != "nq"))
        out.append(row)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--layouts", action="store_true", help="only the chunk cache-layout comparison")
    a = p.parse_args()

    def log(s):
        print(s, flush=True)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if a.layouts:
        out["chunk_layouts"] = chunk_layouts(log)
    else:
        out["chunk"] = [chunk_point(nq, log) for nq in (512, 2048)]
        out["decode"] = [decode_point(*pt, log) for pt in DECODE_POINTS]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
