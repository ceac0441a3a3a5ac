"""Issue 18: the naive chain's DRAM bytes per kernel, measured (ncu) against model/l2.py's `_naive`, on a CPU.

    PYTHONPATH=src python bench/l2_naive.py [--causal | --unmasked] [--json PATH]

Every naive point of the development data (bench/l2_dev.py's sets: the recorded grid, held-out grids, reruns,
probes): per kernel of the chain (GEMM 1 S = QK^T, [masked_fill], softmax, GEMM 2 O = PV), the bytes read
beyond what the kernel must read once (GEMM 1: Q, K; masked_fill: the bool mask; softmax: nothing; GEMM 2: V)
and the bytes written, measured / estimated, in units of S (bh N^2 x dtype bytes), beside S over the L2, the
call's writes (measured / estimated) and its total error. Reads belong to the kernel that issues them; writes
do not: ncu counts a dirty line's write-back in the kernel running when it is evicted, the estimate books it
to the kernel that wrote it, so only the call's writes compare. A measured step can be several launches
(`measured_kernels`); their count is shown. Then, per step, the mean read error over the points whose S is
0.3-3 x the L2. ``--sweep`` adds GEMM 2's re-read of P if its CTAs walked P's columns in lockstep
(`sweep_reread`), beside the measured and estimated. Imports no torch; runs in about a second.
"""
import argparse
import gzip
import json
import sys
from pathlib import Path

from attnscope.measure import ncu, physical
from attnscope.model import l2, traffic

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l2_dev  # noqa: E402  (bench/l2_dev.py: the development sets)

CHAIN = ("gemm1", "mask", "softmax", "gemm2")


def measured_kernels(sweep_kernels):
    """{chain step: (read, write)} of one measured call; ``sweep_kernels``: (name, read, write), launch order.

    GEMM 1 is the first kernel, softmax the one named so; masked_fill is every kernel between them (PyTorch
    splits an elementwise op whose operands pass 2^31 bytes into several launches), GEMM 2 every kernel after
    softmax (cuBLAS's split-K reduction included)."""
    sm = next(i for i, k in enumerate(sweep_kernels) if "softmax" in k[0].lower())

    def total(ks):
        return sum(k[1] for k in ks), sum(k[2] for k in ks)
    out = {"gemm1": total(sweep_kernels[:1]), "softmax": total(sweep_kernels[sm:sm + 1]),
           "gemm2": total(sweep_kernels[sm + 1:])}
    if sm > 1:
        out["mask"] = total(sweep_kernels[1:sm])
    return out, len(sweep_kernels[1:sm]), len(sweep_kernels[sm + 1:])


def naive_points():
    """(set name, spec, env, [(name, read, write)] per measured kernel) of every naive development point."""
    for name, path in l2_dev.sweep_files().items():
        data = json.loads(path.read_text())
        for p in data["points"]:
            m = p.get("measured")
            if p["spec"].get("impl") == "naive" and isinstance(m, dict) and m.get("total"):
                yield name, p["spec"], data["env"], [(k["name"], k["read"], k["write"]) for k in m["kernels"]]
    with gzip.open(l2_dev.ROOT / "tests/data/measure/recorded/ncu.json.gz", "rt", encoding="utf-8") as f:
        rec = json.load(f)
    for run in rec["runs"]:
        if not run.get("csv") or run["cache_control"] != "none":
            continue
        for spec, ks in ncu.pair(run["status"], ncu.split_at_markers(ncu.parse_csv(run["csv"]))):
            if spec.get("ok") and ks and spec["impl"] == "naive":
                s = {k: spec[k] for k in ("impl", "batch", "heads", "n", "d", "causal", "dtype") if k in spec}
                yield "recorded", s, rec["env"], [(k.name, k.read, k.write) for k in ks]


def sweep_reread(s, v, o, rows, sms, cap, ramp, rows_per_sm=256, grid=48):
    """GEMM 2's misses re-reading P (fraction of P) if its resident CTAs (``rows_per_sm`` output rows per SM:
    an assumption) walk P's columns in lockstep, one sweep of their rows after another, instead of reading
    P in the order the softmax wrote it (what `_naive` assumes). Exact LRU stack distances: the byte at row
    fraction a, column fraction u of sweep g of G is re-read after the rest of the softmax (1 - w of S' and
    P, w = (g + a) / G), the earlier sweeps' P, V and O, and, in its own sweep, the columns before u of the
    rows written before it and of V; misses by `l2.miss`, averaged on a ``grid`` x ``grid`` midpoint grid
    per sweep (a development check, cost grows with G; not the model)."""
    sweeps = max(1, -(-rows // (sms * rows_per_sm)))
    total = 0.0
    for g in range(sweeps):
        for i in range(grid):
            a = (i + 0.5) / grid
            w = (g + a) / sweeps
            for j in range(grid):
                u = (j + 0.5) / grid
                d1 = 2 * s * (1 - w) + g / sweeps * (s + v + o) + u / sweeps * (a * s + v)
                total += l2.miss(d1 / cap, ramp)
    return total / (sweeps * grid * grid)


def rows(causal_only=None, sweep=False):
    """One dict per naive point: the geometry, measured and estimated (read, write) per chain step beyond
    what the step must move, in S, and the total error."""
    out = []
    for name, spec, env, ks in naive_points():
        causal = bool(spec.get("causal"))
        if causal_only is not None and causal != causal_only:
            continue
        batch, heads, n, d = spec.get("batch", 1), spec["heads"], spec["n"], spec["d"]
        b = traffic.DTYPE_BYTES[spec.get("dtype", "fp16")]
        bh = batch * heads
        s = bh * n * n * b
        floor = {"gemm1": (2 * bh * n * d * b, 0), "mask": (n * n, 0), "softmax": (0, 0),
                 "gemm2": (bh * n * d * b, 0)}
        meas, n_mask, n_gemm2 = measured_kernels(ks)
        est = physical.estimate_of(spec, env["l2_bytes"], env["sms"], [k[0] for k in ks])
        est_k = dict(zip([c for c in CHAIN if causal or c != "mask"], est.kernels, strict=True))
        row = {"set": name, "label": physical.Row(spec, 1, 1, 0, ()).label(), "bh": bh, "n": n,
               "causal": causal, "write": sum(k[2] for k in ks) / s, "est_write": est.write / s,
               "s_l2": s / env["l2_bytes"], "mask_l2": (n * n if causal else 0) / env["l2_bytes"],
               "launches": (n_mask, n_gemm2), "error": est.total / sum(k[1] + k[2] for k in ks) - 1}
        for step, (r, w) in meas.items():
            f = floor[step]
            k = est_k[step]
            row[step] = {"read": (r - f[0]) / s, "write": w / s, "est_read": (k.read - f[0]) / s,
                         "est_write": k.write / s}
        if sweep and s <= 4 * env["l2_bytes"]:
            par, vo = l2.H200_L2_PARAMS, bh * n * d * b
            cap, ramp = par.capacity * env["l2_bytes"], par.ramp
            row["gemm2"]["sweep_read"] = sweep_reread(s, vo, vo, bh * n, env["sms"], cap, ramp)
        out.append(row)
    return out


def summary(rs, lo=0.3, hi=3.0):
    """Per step: mean and mean |measured - estimated| read (in S) over the points with lo <= S/L2 <= hi."""
    near = [r for r in rs if lo <= r["s_l2"] <= hi]
    print(f"\nreads, measured - estimated, in S, over the {len(near)} points with {lo} <= S/L2 <= {hi}:")
    for step in CHAIN:
        ds = [r[step]["read"] - r[step]["est_read"] for r in near if step in r]
        if ds:
            print(f"  {step:8s} mean {sum(ds) / len(ds):+6.3f}  mean |.| {sum(map(abs, ds)) / len(ds):5.3f}  "
                  f"({len(ds)} points)")
        sw = [r[step]["read"] - r[step]["sweep_read"] for r in near if "sweep_read" in r.get(step, {})]
        if sw:
            print(f"  {step:8s} column sweep instead: mean {sum(sw) / len(sw):+6.3f}  mean |.| "
                  f"{sum(map(abs, sw)) / len(sw):5.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--causal", action="store_true", help="causal points only")
    g.add_argument("--unmasked", action="store_true", help="unmasked points only")
    ap.add_argument("--sweep", action="store_true", help="also GEMM 2's re-read of P if its resident CTAs "
                    "walked P's columns in lockstep (`sweep_reread`; a few seconds)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rs = rows(True if args.causal else False if args.unmasked else None, args.sweep)
    print("per kernel, in S (bh N^2 dtype bytes): reads beyond the step's own inputs once (GEMM 1: Q, K; "
          "masked_fill: the mask; GEMM 2: V), writes; measured/estimated")
    head = f"{'set':10s} {'point':42s} {'S/L2':>5s} {'err':>6s}"
    for step in CHAIN:
        head += f" | {step + ' rd':>11s} {step + ' wr':>11s}"
    print(head + " | all wr      | launches (masked_fill/GEMM 2)")
    for r in sorted(rs, key=lambda r: (r["causal"], r["s_l2"])):
        line = f"{r['set']:10s} {r['label']:42s} {r['s_l2']:5.2f} {r['error']:+6.1%}"
        for step in CHAIN:
            if step in r:
                k = r[step]
                line += f" | {k['read']:5.2f}/{k['est_read']:5.2f} {k['write']:5.2f}/{k['est_write']:5.2f}"
            else:
                line += f" | {'':11s} {'':11s}"
        sweep = r["gemm2"].get("sweep_read")
        print(line + f" | {r['write']:5.2f}/{r['est_write']:5.2f} | {r['launches'][0]}/{r['launches'][1]}"
              + (f" | sweep {sweep:5.2f}" if sweep is not None else ""))
    summary(rs)
    if args.json:
        Path(args.json).write_text(json.dumps(rs, indent=1))


if __name__ == "__main__":
    main()
