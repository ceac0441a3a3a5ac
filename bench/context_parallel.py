"""Context parallelism (issues 16, 17): attnscope ring vs PyTorch `context_parallel` (SDPA FLASH, CUDNN).

    torchrun --nproc_per_node P bench/context_parallel.py [--quick] [--json out.json] [--n 32768,65536]
        [--markdown]

Same GPUs, same inputs: B = 1, H = 32 (--heads), d = 128, bf16, forward; N in 32k..256k (OOM points
are recorded, not fatal), causal and unmasked. Also attnscope on one GPU (rank 0, same N) for the
scaling efficiency = P-GPU throughput / (P x 1-GPU throughput). Beside each ring measurement: the
model's predicted mean step time (attnscope.model.ring, size-dependent NVLink curve unless
--link-gbps) and the measured one (total / P).

Correctness first, at a small N (--check-n, default 8192): the rank-gathered ring output against
single-GPU attnscope on the whole sequence, and a few query rows against float64 (tolerance 2 x
SDPA's own error on those rows + 1e-3); any mismatch exits 1 before timing.

Timing: a fixed number of iterations per point on every rank (the same count everywhere, so the
collectives inside never desynchronise; triton's do_bench picks its count per rank), CUDA events,
after a barrier; a point's time is the slowest rank's median. PyTorch's unmasked `context_parallel`
needs load balancing off (`_cp_options.enable_load_balance = False`, the only switch torch 2.11
exposes); a configuration torch refuses is recorded as "refused" with its message.
Works unchanged for P = 2, 4, 8. About 3 minutes on 2 x H200. ``--markdown`` prints BENCHMARKS.md's
context-parallel table (its columns, in its order).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def _args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", default=None, help="comma-separated N (default 32768,65536,131072,262144)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None, help="GQA K/V heads for attnscope (default --heads)")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--check-n", type=int, default=8192, help="N of the correctness check")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per point (default 5; quick 3)")
    p.add_argument("--masks", default="causal,unmasked", help="causal,unmasked")
    p.add_argument("--cp-rotate", default=None, choices=["allgather", "alltoall"],
                   help="torch context_parallel rotate method (default: torch's default)")
    p.add_argument("--link-gbps", type=float, default=None, help="model link GB/s (default measured curve)")
    p.add_argument("--tflops", type=float, default=None, help="model kernel TFLOP/s (default measured)")
    p.add_argument("--no-single", action="store_true", help="skip the 1-GPU attnscope run")
    p.add_argument("--quick", action="store_true", help="smoke run: N = 32768, causal, 3 iterations")
    p.add_argument("--json", default=None, help="write results to this path (rank 0)")
    p.add_argument("--markdown", action="store_true", help="print BENCHMARKS.md's table at the end (rank 0)")
    return p.parse_args()


def _time(fn, iters, dist, torch):
    """Median ms over `iters` calls (after 2 warm-ups), max over ranks."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    t = torch.tensor([ts[len(ts) // 2]], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _inputs(torch, n, h, hkv, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)  # same on every rank
    q = torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def _check(args, torch, dist, ad, attnscope, rank):
    n, h, d = args.check_n, args.heads, args.d
    hkv = args.kv_heads or h
    q, k, v = _inputs(torch, n, h, hkv, d, 1234)
    bad = []
    for causal in (True, False):
        o = ad.unshard(ad.ring_attention(*(ad.shard(t, causal) for t in (q, k, v)), causal=causal), causal)
        if rank == 0:
            one = attnscope.flash_attention(q, k, v, causal=causal)
            rows = torch.tensor([0, 1, n // 3, n // 2 + 1, n - 2, n - 1], device="cuda")
            g = h // hkv
            kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            s = (q[:, :, rows].double() @ kk.double().transpose(-1, -2)) / math.sqrt(d)
            if causal:
                s = s.masked_fill(torch.arange(n, device="cuda")[None, :] > rows[:, None], -float("inf"))
            ref = torch.softmax(s, -1) @ vv.double()
            sdpa = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
            tol = 2 * float((sdpa[:, :, rows].double() - ref).abs().max()) + 1e-3
            err64 = float((o[:, :, rows].double() - ref).abs().max())
            err1 = float((o.float() - one.float()).abs().max())
            tol1 = 2 * float((one[:, :, rows].double() - ref).abs().max()) + 2e-3
            ok = err64 <= tol and err1 <= 2 * tol1 and bool(torch.isfinite(o).all())
            print(f"check N = {n} {'causal' if causal else 'unmasked'}: ring vs float64 rows {err64:.2e} "
                  f"(tol {tol:.2e}), ring vs 1-GPU attnscope {err1:.2e}: {'ok' if ok else 'MISMATCH'}",
                  flush=True)
            if not ok:
                bad.append(causal)
    flag = torch.tensor([len(bad)], device="cuda")
    dist.broadcast(flag, 0)
    return int(flag.item()) == 0


def _cp_run(torch, dist, mesh, q, k, v, causal, backend, iters):
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options
    from torch.nn.attention import sdpa_kernel

    _cp_options.enable_load_balance = bool(causal)
    qc, kc, vc = q.clone(), k.clone(), v.clone()
    with sdpa_kernel(backend), context_parallel(mesh, buffers=[qc, kc, vc], buffer_seq_dims=[2, 2, 2]):
        def fn():
            return torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)
        return _time(fn, iters, dist, torch)


def _point(row, args, torch, dist, mesh, ad, attnscope, predict, world, rank, n, h, hkv, d, causal, iters):
    """Fill `row` with the ring, both context_parallel backends and 1-GPU attnscope at one (N, mask)."""
    from torch.nn.attention import SDPBackend

    try:
        q, k, v = _inputs(torch, n, h, hkv, d, n)
    except torch.OutOfMemoryError:
        row["attnscope_ms"] = row["cp_flash_ms"] = row["cp_cudnn_ms"] = row["single_ms"] = "OOM"
        return
    try:
        ql, kl, vl = (ad.shard(t, causal) for t in (q, k, v))
        ms = _time(lambda: ad.ring_attention(ql, kl, vl, causal=causal), iters, dist, torch)
        row["attnscope_ms"] = ms
        pred = predict(world, n, h, hkv, d, "bf16", causal, "h200", 1, args.tflops, args.link_gbps)
        row.update(pred_step_ms=pred.step_s * 1e3, meas_step_ms=ms / world, pred_bound=pred.bound,
                   pred_total_ms=pred.total_s * 1e3, pred_crossover_n=pred.crossover_n)
        ql = kl = vl = None
    except torch.OutOfMemoryError:
        row["attnscope_ms"] = "OOM"
    for name, be in (("cp_flash", SDPBackend.FLASH_ATTENTION), ("cp_cudnn", SDPBackend.CUDNN_ATTENTION)):
        if hkv != h:
            row[name + "_ms"] = "n/a (GQA)"
            continue
        try:
            row[name + "_ms"] = _cp_run(torch, dist, mesh, q, k, v, causal, be, iters)
        except torch.OutOfMemoryError:
            row[name + "_ms"] = "OOM"
        except (RuntimeError, NotImplementedError, ValueError) as e:
            row[name + "_ms"] = f"refused: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}"
    if args.no_single:
        return
    single = torch.tensor([0.0], device="cuda")
    if rank == 0:
        try:
            def fn():
                return attnscope.flash_attention(q, k, v, causal=causal)
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            ts = []
            for _ in range(iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                ts.append(s.elapsed_time(e))
            single[0] = sorted(ts)[len(ts) // 2]
        except torch.OutOfMemoryError:
            single[0] = -1.0
    dist.broadcast(single, 0)
    row["single_ms"] = float(single.item()) if single.item() > 0 else "OOM"


def main() -> int:
    args = _args()
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import attnscope
    from attnscope import distributed as ad
    from attnscope.model.flops import attention_flops
    from attnscope.model.ring import predict

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (world,))
    if args.cp_rotate:
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        set_rotate_method(args.cp_rotate)
    ns = [32768] if args.quick else [int(x) for x in (args.n or "32768,65536,131072,262144").split(",")]
    masks = ["causal"] if args.quick else args.masks.split(",")
    iters = args.iters or (3 if args.quick else 5)
    h, d = args.heads, args.d
    hkv = args.kv_heads or h
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    say(f"P = {world}, {torch.cuda.get_device_name()}, torch {torch.__version__}, H = {h}, Hkv = {hkv}, "
        f"d = {d}, bf16, iters = {iters}")
    t0 = time.time()
    if not _check(args, torch, dist, ad, attnscope, rank):
        say("correctness check FAILED: not timing")
        return 1
    from torch.distributed.tensor.experimental._attention import _cp_options
    say(f"all results match, starting benchmarks (torch context_parallel rotate method: "
        f"{_cp_options.rotate_method.name})")
    rows = []
    for mask in masks:
        causal = mask == "causal"
        for n in ns:
            row = {"P": world, "N": n, "causal": causal}
            flops = attention_flops(1, h, n, n, d, causal)
            _point(row, args, torch, dist, mesh, ad, attnscope, predict, world, rank, n, h, hkv, d, causal,
                   iters)
            torch.cuda.empty_cache()
            for key in ("attnscope", "cp_flash", "cp_cudnn", "single"):
                t = row.get(key + "_ms")
                if isinstance(t, float):
                    row[key + "_tflops"] = flops / (t * 1e-3) / 1e12
            if isinstance(row.get("attnscope_tflops"), float) and isinstance(row.get("single_tflops"), float):
                row["efficiency"] = row["attnscope_tflops"] / (world * row["single_tflops"])
            if isinstance(row.get("attnscope_ms"), float):
                row["pred_err"] = row["pred_step_ms"] / row["meas_step_ms"] - 1
            rows.append(row)
            say(_line(row))
    say(f"done in {time.time() - t0:.0f} s (TFLOP/s: whole-sequence FLOPs / time, over all {world} GPUs; "
        "predicted = model, not measured)")
    if args.markdown:
        say(markdown(rows))
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"P": world, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "heads": h, "kv_heads": hkv, "d": d, "dtype": "bf16", "rows": rows}, f, indent=2)
    dist.destroy_process_group()
    return 0


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) else "n/a"


def markdown(rows) -> str:
    """BENCHMARKS.md's context-parallel table (TFLOP/s over all GPUs; step ms predicted / measured)."""
    lines = ["| mask | N | attnscope ring | CP + FLASH | CP + CUDNN | 1-GPU attnscope | × CP-FLASH "
             "| × CP-CUDNN | scaling eff. | step ms predicted / measured |", "|" + " --- |" * 10]
    for r in rows:
        a, fl, cu = (r.get(k + "_tflops") for k in ("attnscope", "cp_flash", "cp_cudnn"))
        lines.append(f"| {'causal' if r['causal'] else 'unmasked'} | {r['N'] // 1024}k | {_fmt(a)} "
                     f"| {_fmt(fl)} | {_fmt(cu)} | {_fmt(r.get('single_tflops'))} | {_ratio(a, fl)} "
                     f"| {_ratio(a, cu)} | {_fmt(r.get('efficiency', 'n/a'), '.3f')} "
                     f"| {_fmt(r.get('pred_step_ms', 'n/a'), '.2f')} / "
                     f"{_fmt(r.get('meas_step_ms', 'n/a'), '.2f')} |")
    return "\n".join(lines)


def _fmt(x, spec=".1f"):
    return format(x, spec) if isinstance(x, float) else str(x)


def _line(r):
    return (f"P={r['P']} N={r['N']:>7} {'causal  ' if r['causal'] else 'unmasked'} TFLOP/s: "
            f"attnscope {_fmt(r.get('attnscope_tflops', r.get('attnscope_ms')))}  "
            f"CP-FLASH {_fmt(r.get('cp_flash_tflops', r.get('cp_flash_ms')))}  "
            f"CP-CUDNN {_fmt(r.get('cp_cudnn_tflops', r.get('cp_cudnn_ms')))}  "
            f"1-GPU {_fmt(r.get('single_tflops', r.get('single_ms')))}  "
            f"eff {_fmt(r.get('efficiency', '-'), '.3f')}  "
            f"step ms predicted {_fmt(r.get('pred_step_ms', '-'), '.2f')} / measured "
            f"{_fmt(r.get('meas_step_ms', '-'), '.2f')} ({r.get('pred_bound', '-')})")


if __name__ == "__main__":
    sys.exit(main())
