"""Issue 18: the L2-aware byte estimate (model/l2.py) against every DEVELOPMENT measurement, on a CPU.

    PYTHONPATH=src python bench/l2_dev.py [--worst 0.10] [--json PATH]

Sets: the recorded 186-point grid (tests/data/measure/recorded/ncu.json.gz, cache-control none), the
held-out sweeps already measured (bench/results/*bytes-heldout*.json: once measured, development data) and
the spill probe. Each sweep is re-evaluated exactly as `attnscope bytes --from-json FILE` does (the kernel
names the measurement recorded pick the attnscope variant); prints per set the points within ±5/10/15 %,
the mean |error| and the points past ``--worst``. Imports no torch; runs in about a second.
"""
import argparse
import glob
import gzip
import json
from pathlib import Path

from attnscope.measure import ncu, physical

ROOT = Path(__file__).resolve().parents[1]


def recorded_rows():
    with gzip.open(ROOT / "tests/data/measure/recorded/ncu.json.gz", "rt", encoding="utf-8") as f:
        rec = json.load(f)
    pairs = []
    for run in rec["runs"]:
        if not run.get("csv") or run["cache_control"] != "none":
            continue
        for spec, ks in ncu.pair(run["status"], ncu.split_at_markers(ncu.parse_csv(run["csv"]))):
            if spec.get("ok") and ks:
                s = {k: spec[k] for k in ("impl", "batch", "heads", "n", "d", "causal", "dtype") if k in spec}
                if spec.get("kv_heads") and spec["kv_heads"] != spec["heads"]:
                    s["kv_heads"] = spec["kv_heads"]
                pairs.append((s, sum(k.total for k in ks), [k.name for k in ks]))
    return physical.compare(pairs, rec["env"]["l2_bytes"], rec["env"]["sms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worst", type=float, default=0.10, help="list points with |error| above this")
    ap.add_argument("--json", help="write the per-set summaries here")
    args = ap.parse_args()
    sets = {}
    for f in sorted(glob.glob(str(ROOT / "bench/results/*bytes-heldout*.json"))):
        sets[Path(f).stem.split("bytes-")[-1]] = physical.rows_from_json(f)[0]
    sets["spill-probe"] = physical.rows_from_json(ROOT / "bench/results/h200-2026-12-01-spill-probe.json")[0]
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
