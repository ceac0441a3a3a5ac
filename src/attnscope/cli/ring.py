"""`attnscope ring`: the context-parallel ring's communication model (model/ring.py), no torch."""

from __future__ import annotations

from attnscope.cli._out import console, int_list, print_json, table

#: Most rank counts in one --ranks (one table row each: a 5,000-row table took seconds to print).
MAX_RANK_COUNTS = 256


def configure(sub) -> None:
    """Add `ring` to `sub` (argparse subparsers)."""
    p = sub.add_parser("ring", help="context parallelism: per-step compute vs K/V transfer of ring attention",
                       description="Ring attention's model over P ranks: per-step compute (attention FLOPs / "
                                   "kernel rate), per-step K/V transfer (bytes / link), compute- or "
                                   "link-bound, "
                                   "predicted total, and the crossover N below which the ring is link-bound.")
    p.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts P (default 2,4,8)")
    p.add_argument("--n", type=int, default=131072, help="whole sequence length N (default 131072)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--heads", type=int, default=32, help="query heads (default 32)")
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (GQA; default --heads)")
    p.add_argument("--d", type=int, default=128, help="head dimension (default 128)")
    p.add_argument("--dtype", default="bf16", help="fp16, bf16 or fp32 (default bf16)")
    p.add_argument("--causal", action="store_true", help="causal, load-balanced layout")
    p.add_argument("--device", default="h200", help="device from the roofline table (default h200)")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="link GB/s per direction (default: the measured size-dependent H200 NVLink curve)")
    p.add_argument("--tflops", type=float, default=None,
                   help="kernel TFLOP/s (default: attnscope's measured H200 forward, BENCHMARKS.md)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_ring)


def cmd_ring(args) -> int:
    from attnscope.model.ring import predict

    ranks = int_list("--ranks", args.ranks, least=1, most=MAX_RANK_COUNTS)
    preds = [predict(r, args.n, args.heads, args.kv_heads, args.d, args.dtype, args.causal, args.device,
                     args.batch, args.tflops, args.link_gbps) for r in ranks]
    if args.json:
        print_json({"model": "predicted, not measured", "predictions": [x.to_json() for x in preds]})
        return 0
    rows = [[x.ranks, f"{x.n_local:,}", f"{x.compute_s * 1e3:.3f}", f"{x.kv_bytes / 2**20:,.1f}",
             f"{x.link_gbps:.0f}", f"{x.transfer_s * 1e3:.3f}", x.bound, f"{x.step_s * 1e3:.3f}",
             f"{x.total_s * 1e3:.2f}", f"{x.tflops_total:,.0f}", f"{x.efficiency:.3f}", f"{x.crossover_n:,}"]
            for x in preds]
    console().print(table(
        f"Ring attention model (predicted, not measured): N = {args.n:,}, B = {args.batch}, "
        f"H = {args.heads}, "
        f"Hkv = {args.kv_heads or args.heads}, d = {args.d}, {args.dtype}, "
        f"{'causal (load-balanced)' if args.causal else 'unmasked'}, {args.device}",
        ["P", "N/P", "comp ms", "K+V MiB", "GB/s", "xfer ms", "bound", "step ms", "total ms", "TFLOP/s",
         "eff", "link-bound < N"], rows,
        caption="per step: comp = compute, xfer = K/V transfer; TFLOP/s over all ranks; eff vs one GPU. "
                "step = max(compute, transfer) (the last step: compute), + merge + assumed 10 us overhead; "
                "link: measured 2xH200 NVLink curve unless --link-gbps."))
    return 0
