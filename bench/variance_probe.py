"""Issue 18: where the run-to-run spread of one shape's DRAM counters comes from. Run under ncu (see
bench/gpu/variance_probe.sh): for each shape, calls on the same tensors ("same": the same physical pages)
and calls on fresh tensors placed after a random-size padding allocation ("fresh": other pages), each from
a cold L2 (2 x L2 of clean lines read first, as `attnscope bytes` does), each in its own profiler range.
ncu reads the DRAM bytes, the kernel's duration and the SM and DRAM clocks of every call; ``--summary CSV``
(any machine) prints them per call, so a spread that follows the clocks, or the placement, shows.

    ncu --clock-control none --cache-control none --profile-from-start off --metrics ... --csv \\
        python bench/variance_probe.py --run > ncu.csv
    python bench/variance_probe.py --summary ncu.csv
"""
import argparse
import csv
import json
import random
import sys

# (impl, B, H, N): the widest spreads between sessions the decay probe saw (BENCHMARKS.md, eleventh session)
SHAPES = [
    ("efficient", 3, 25, 32079),
    ("flash", 4, 19, 26129),
]
SAME, FRESH = 4, 4
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum",
           "sm__cycles_elapsed.avg.per_second", "dram__cycles_elapsed.avg.per_second")


def run():
    import torch

    from attnscope.measure.ncu import _call

    cudart = torch.cuda.cudart()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    rng = random.Random(20261201)
    order = []

    def measure(fn):
        torch.cuda.synchronize()
        scratch.sum()
        torch.cuda.synchronize()
        cudart.cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()

    for impl, b, h, n in SHAPES:
        spec = {"impl": impl, "batch": b, "heads": h, "n": n, "d": 128, "dtype": "fp16", "causal": False}
        fn, keep = _call(torch, spec)
        fn()
        for _ in range(SAME):
            measure(fn)
            order.append({**spec, "trial": "same"})
        del fn, keep
        for _ in range(FRESH):
            torch.cuda.empty_cache()
            pad = torch.empty(rng.randrange(1, 512) * 2**20 + rng.randrange(0, 2**20, 256), dtype=torch.uint8,
                              device="cuda")
            fn, keep = _call(torch, spec)
            fn()
            measure(fn)
            order.append({**spec, "trial": "fresh", "pad_bytes": pad.numel()})
            del fn, keep, pad
    print("VARIANCE_ORDER " + json.dumps(order))


def summary(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    order = next(json.loads(line.split(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("VARIANCE_ORDER"))
    by = {}
    for r in csv.DictReader(line for line in text.splitlines() if line.startswith('"')):
        by.setdefault(int(r["ID"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", "") or 0)
    rows = [by[i] for i in sorted(by)]
    if len(rows) != len(order):
        sys.exit(f"expected {len(order)} profiled kernels, got {len(rows)}")
    last = None
    for spec, m in zip(order, rows, strict=True):
        key = (spec["impl"], spec["batch"], spec["heads"], spec["n"])
        if key != last:
            print(f"{spec['impl']} B={spec['batch']} H={spec['heads']} N={spec['n']} d=128 fp16 unmasked")
            last = key
        read, write, ns, sm, dram = (m[k] for k in METRICS)
        pad = f"  pad {spec['pad_bytes'] / 2**20:.1f} MiB" if "pad_bytes" in spec else ""
        print(f"  {spec['trial']:5s} read {read / 2**20:8.1f} MiB  write {write / 2**20:7.1f} MiB  "
              f"{ns / 1e3:8.1f} us  SM {sm / 1e9:.3f} GHz  DRAM {dram / 1e9:.3f} GHz{pad}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--run", action="store_true", help="the measured calls (under ncu, on the GPU)")
    g.add_argument("--summary", metavar="CSV", help="print ncu's CSV (with the order line) per call")
    a = ap.parse_args()
    run() if a.run else summary(a.summary)
