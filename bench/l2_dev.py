"""Issue 18: the L2-aware byte estimate (model/l2.py) against every DEVELOPMENT measurement, on a CPU.

    PYTHONPATH=src python bench/l2_dev.py [--worst 0.10] [--json PATH]

Sets: the recorded 186-point grid (tests/data/measure/recorded/ncu.json.gz, cache-control none), the held-out
sweeps already measured (bench/results/*bytes-heldout*.json: once measured, development data), the spill
probe, the lockstep probe (bench/results/*bytes-lockstep*.json), the reruns of measured points
(bench/results/*bytes-rerun*.json), the frames probe (bench/results/*bytes-frames*.json), the
persistent-schedule probe (bench/results/*bytes-persist*.json), sweeps measured with --repeat
(bench/results/*bytes-repeat*.json: each point against its median run) and the wave-count probe
(bench/results/*bytes-decay*.json, also with --repeat) and the hot-set probe
(bench/results/*bytes-hotprobe*.json: FA-2's causal GQA at B > 1, --repeat 2) and the head-count probe
(bench/results/*bytes-headsprobe*.json: FA-2's causal MHA at fixed N, --repeat 2).
Each sweep is re-evaluated exactly as `attnscope bytes --from-json FILE` does (the kernel names the
measurement recorded pick the attnscope variant); the recorded grid's attnscope calls, which ran the
portable kernel while it was autotuned, with the config ncu's block size and grid name
(`physical.RECORDED_PORTABLE`).
Prints per set the points within ±5/10/15 %, the mean
|error| and the points past ``--worst``. Imports no torch; runs in about a second.

    PYTHONPATH=src python bench/l2_dev.py --repeats

instead lists every shape measured more than once (several sets, or a rerun) with the spread of its measured
bytes and the estimate's error per run.

    PYTHONPATH=src python bench/l2_dev.py --spill flash [--min-spill 5]

instead lists the points whose register-spill frames touch at least 5 MiB: the spill bytes written to DRAM, as
a fraction of those touched, estimated against measured, by mask, N even / ragged and L2 turnover.

    PYTHONPATH=src python bench/l2_dev.py --excess flash:unmasked [--min-kv 0.12]

instead lists one fused implementation's points (causal or unmasked) by the size of a K/V set: the DRAM reads
beyond Q, K and V read once, in K/V sets (K + V of every kv head, once), measured and estimated, beside the
geometry the re-read model works on (a set over the L2's shared capacity, query tiles T per set, C / T with C
the co-resident CTAs, waves of C, N a multiple of both blocks or ragged).
"""
import argparse
import glob
import gzip
import json
import math
from pathlib import Path

from attnscope.measure import ncu, physical
from attnscope.model import l2, traffic

ROOT = Path(__file__).resolve().parents[1]


def recorded_points():
    """(spec, measured read, measured total, kernel names, kernel) of the recorded grid, and its env;
    kernel: `physical.recorded_kernel`."""
    with gzip.open(ROOT / "tests/data/measure/recorded/ncu.json.gz", "rt", encoding="utf-8") as f:
        rec = json.load(f)
    points = []
    for run in rec["runs"]:
        if not run.get("csv") or run["cache_control"] != "none":
            continue
        for spec, ks in ncu.pair(run["status"], ncu.split_at_markers(ncu.parse_csv(run["csv"]))):
            if spec.get("ok") and ks:
                s = {k: spec[k] for k in ("impl", "batch", "heads", "n", "d", "causal", "dtype") if k in spec}
                if spec.get("kv_heads") and spec["kv_heads"] != spec["heads"]:
                    s["kv_heads"] = spec["kv_heads"]
                points.append((s, sum(k.read for k in ks), sum(k.total for k in ks), [k.name for k in ks],
                               physical.recorded_kernel(s, ks)))
    return points, rec["env"]


def recorded_rows():
    points, env = recorded_points()
    rows = []
    for s, _, total, names, kernel in points:
        e = physical.estimate_of(s, env["l2_bytes"], env["sms"], names, kernel)
        rows.append(physical.Row(s, int(total), e.total, e.compulsory, tuple(e.credits)))
    return rows


def sweep_files():
    """{set name: path} of the measured held-out sweeps and the spill probe."""
    found = glob.glob(str(ROOT / "bench/results/*bytes-heldout*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-lockstep*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-rerun*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-frames*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-persist*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-repeat*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-decay*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-hotprobe*.json")) + \
        glob.glob(str(ROOT / "bench/results/*bytes-headsprobe*.json"))
    files = {Path(f).stem.split("bytes-")[-1]: Path(f) for f in sorted(found)}
    files["spill-probe"] = ROOT / "bench/results/h200-2026-12-01-spill-probe.json"
    return files


def all_points():
    """(set name, spec, measured read, measured total, kernel names, env, kernel) of every development point
    (kernel: `physical.recorded_kernel`, else None)."""
    for name, path in sweep_files().items():
        data = json.loads(path.read_text())
        for p in data["points"]:
            m = p.get("measured")
            if isinstance(m, dict) and m.get("total"):
                names = [k.get("name", "") for k in m.get("kernels", [])]
                yield name, p["spec"], m["read"], m["total"], names, data["env"], None
    points, env = recorded_points()
    for s, read, total, names, kernel in points:
        yield "recorded", s, read, total, names, env, kernel


def excess(impl, causal, min_kv):
    """Print ``impl``'s points (``causal`` or unmasked) by K/V set size: reads beyond Q, K, V once, in K/V
    sets, measured against estimated, with the geometry of the re-read model (module docstring)."""
    rows = []
    for name, s, read, total, names, env, kernel in all_points():
        if s["impl"] != impl or bool(s.get("causal")) != causal:
            continue
        batch, heads, n, d = s.get("batch", 1), s["heads"], s["n"], s["d"]
        hkv, dtype = s.get("kv_heads") or heads, s.get("dtype", "fp16")
        b = traffic.DTYPE_BYTES[dtype]
        kv_set, q = 2 * n * d * b, batch * heads * n * d * b
        kv = batch * hkv * kv_set
        est = physical.estimate_of(s, env["l2_bytes"], env["sms"], names, kernel)
        ker = kernel or l2.kernel_of(impl, d, causal, dtype, n, physical.attnscope_impl_of(s, names))[1]
        size = kv_set / (l2.H200_L2_PARAMS.shared * env["l2_bytes"])
        if size < min_kv:
            continue
        t, c = math.ceil(n / ker.block_q), env["sms"] * ker.ctas_per_sm
        even = n % ker.block_q == 0 and n % ker.block_kv == 0
        rows.append((size, name, physical.Row(s, total, est.total, est.compulsory, ()).label(), t, c,
                     batch * heads * t / c, even, (read - q - kv) / kv, (est.read - q - kv) / kv,
                     est.total / total - 1))
    mask = "causal" if causal else "unmasked"
    print(f"{impl} {mask}: reads beyond Q, K, V once, in K/V sets; kv/cap: a set over the shared L2 capacity")
    for size, name, label, t, c, waves, even, meas, est, err in sorted(rows, key=lambda r: r[0]):
        print(f"  kv/cap {size:4.2f}  {name:10s} {label:42s} T {t:4d}  C/T {c / t:5.2f}  waves {waves:6.1f}  "
              f"{'even  ' if even else 'ragged'}  measured {meas:7.3f}  estimated {est:7.3f}  "
              f"error {err:+6.1%}")


def spill(impl, min_mib):
    """Print ``impl``'s points whose register-spill frames (`l2.spill_bytes`) touch at least ``min_mib`` MiB,
    by the L2 turnover of one mean CTA lifetime: the spill bytes written to DRAM as a fraction of those
    touched, estimated and measured (the writes beyond O and LSE, with the estimate's O credit added back),
    and the read error in the same unit (so a read miss is not mistaken for a spill one)."""
    rows = []
    for name, s, read, total, names, env, kernel in all_points():
        if s["impl"] != impl:
            continue
        batch, heads, n, d = s.get("batch", 1), s["heads"], s["n"], s["d"]
        causal, dtype = bool(s.get("causal")), s.get("dtype", "fp16")
        ker = kernel or l2.kernel_of(impl, d, causal, dtype, n, physical.attnscope_impl_of(s, names))[1]
        t = math.ceil(n / ker.block_q)
        ctas, c = batch * heads * t, env["sms"] * ker.ctas_per_sm
        touched = l2.spill_bytes(ker, ctas, n, n)
        if touched == 0 or touched < min_mib * 2**20:  # no frames: nothing to divide by
            continue
        est = physical.estimate_of(s, env["l2_bytes"], env["sms"], names, kernel)
        kept = sum(x for _, x in est.credits)
        lse = batch * heads * n * l2.STAT_BYTES if ker.lse else 0
        out = batch * heads * n * d * traffic.DTYPE_BYTES[dtype] + lse
        life = (est.read + out) * min(c, ctas) / ctas / (l2.H200_L2_PARAMS.capacity * env["l2_bytes"])
        even = n % ker.block_q == 0 and n % ker.block_kv == 0
        rows.append((causal, even, life, name, physical.Row(s, total, est.total, est.compulsory, ()).label(),
                     ctas / c, (est.write - out + kept) / touched, (total - read - out + kept) / touched,
                     (est.read - read) / touched, est.total / total - 1))
    print(f"{impl}: spill bytes written to DRAM / touched; life: a mean CTA lifetime's insertions over the "
          "L2 capacity; gens: CTAs / C")
    for _, even, life, name, label, gens, e, m, rerr, err in sorted(rows, key=lambda r: r[:3]):
        print(f"  {'even  ' if even else 'ragged'} life {life:4.2f} gens {gens:5.1f}  {name:11s} {label:46s} "
              f"written: estimated {e:5.2f} measured {m:5.2f}  read error {rerr:+5.2f}  error {err:+6.1%}")


def repeats():
    """Print every shape measured more than once (the same spec in several sets, or rerun): its measured
    bytes per run, their spread (max / min - 1) and the estimate's error per run: how much of an error is
    run-to-run variation of the hardware rather than the model."""
    runs = {}
    for name, s, read, total, names, env, kernel in all_points():
        key = tuple(sorted((k, v) for k, v in s.items() if not (k == "kv_heads" and v == s["heads"])))
        runs.setdefault(key, []).append((name, read, total, names, env, s, kernel))
    print("shapes measured more than once: measured MiB (read + write) per run, spread, error per run")
    rows = []
    for rs in runs.values():
        if len(rs) < 2:
            continue
        s = rs[0][5]
        totals = [t for _, _, t, *_ in rs]
        errs = [physical.estimate_of(s, env["l2_bytes"], env["sms"], names, kernel).total / t - 1
                for _, _, t, names, env, _, kernel in rs]
        label = physical.Row(s, totals[0], totals[0], 0, ()).label()
        rows.append((max(totals) / min(totals) - 1, label, rs, totals, errs))
    for spread, label, rs, totals, errs in sorted(rows, key=lambda r: -r[0]):
        meas = " ".join(f"{t / 2**20:8.1f}" for t in totals)
        err = " ".join(f"{e:+6.1%}" for e in errs)
        print(f"  spread {spread:6.1%}  {label:44s} {' '.join(r[0] for r in rs):40s} {meas}   error {err}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worst", type=float, default=0.10, help="list points with |error| above this")
    ap.add_argument("--json", help="write the per-set summaries here")
    ap.add_argument("--excess", metavar="IMPL:MASK", help="instead: the excess-read table of one fused "
                    "implementation, e.g. flash:unmasked, efficient:causal")
    ap.add_argument("--min-kv", type=float, default=0.12, help="--excess: smallest K/V set, in shared L2 "
                    "capacities")
    ap.add_argument("--spill", metavar="IMPL", help="instead: IMPL's points with register-spill frames, the "
                    "spill bytes written to DRAM estimated against measured")
    ap.add_argument("--min-spill", type=float, default=5.0, help="--spill: smallest frame total, MiB")
    ap.add_argument("--repeats", action="store_true", help="instead: the shapes measured more than once, "
                    "with the run-to-run spread of their measured bytes")
    args = ap.parse_args()
    if args.repeats:
        repeats()
        return
    if args.spill:
        spill(args.spill, args.min_spill)
        return
    if args.excess:
        impl, _, mask = args.excess.partition(":")
        if impl not in l2.IMPLS[1:] or mask not in ("causal", "unmasked"):
            ap.error(f"--excess: expected IMPL:MASK, IMPL one of {', '.join(l2.IMPLS[1:])}, MASK causal or "
                     f"unmasked, got {args.excess!r}")
        excess(impl, mask == "causal", args.min_kv)
        return
    sets = {name: physical.rows_from_json(path)[0] for name, path in sweep_files().items()}
    sets["recorded"] = recorded_rows()
    out, total = {}, [0, 0, 0, 0]
    for name, rows in sets.items():
        s = physical.summarize(rows)
        w = s["within"]
        out[name] = s
        total = [total[0] + w["5%"], total[1] + w["10%"], total[2] + w["15%"], total[3] + s["count"]]
        below = len(s["silently_below_compulsory"])
        print(f"{name:12s} ±5/10/15 %: {w['5%']}/{w['10%']}/{w['15%']} of {s['count']}, mean |error| "
              f"{s['mean_abs_error']:.1%}, below compulsory without a reason: {below}")
        for r in sorted(rows, key=lambda r: r.error):
            if abs(r.error) > args.worst:
                print(f"    {r.error:+7.1%}  {r.label()}")
    print(f"{'all':12s} ±5/10/15 %: {total[0]}/{total[1]}/{total[2]} of {total[3]}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
