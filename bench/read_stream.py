"""What read pattern streams HBM fastest on this GPU? A ceiling probe for the memory-bound decode kernel.

    PYTHONPATH=src python bench/read_stream.py [--json PATH] [--gib 4]

A Triton kernel sums a bf16 buffer viewed as rows of 256 bytes (one d = 128 key row), tile by tile, with
Triton's software pipeline (cp.async, ``num_stages`` tiles in flight). Variants: programs (128, 132, 264),
rows per tile, stages, warps, and the order of tiles: ``contig`` (each program streams one contiguous
chunk, as a decode split does) or ``interleave`` (tile i of program p is tile ``i * P + p``: programs
read neighbouring tiles at the same time). Every sum is checked against torch's; TB/s = buffer bytes /
CUDA-graph replay time (best of 3 rounds). ``x.sum()`` and a device-to-device copy (read + write bytes)
are printed beside.
"""

import argparse
import itertools
import json
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import graph_of, ms  # noqa: E402


@triton.jit
def _read_kernel(X, OUT, tiles_per_prog, n_progs, ROWS: tl.constexpr, INTERLEAVE: tl.constexpr,
                 STAGES: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, ROWS)[:, None] * 128 + tl.arange(0, 128)[None, :]
    acc = tl.zeros([ROWS, 128], tl.float32)
    for i in tl.range(0, tiles_per_prog, num_stages=STAGES):
        t = i * n_progs + pid if INTERLEAVE else pid * tiles_per_prog + i
        x = tl.load(X + t.to(tl.int64) * (ROWS * 128) + offs)
        acc += x.to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--gib", type=float, default=4.0)
    a = p.parse_args()
    rows_total = int(a.gib * 2**30) // 256
    x = torch.randn(rows_total, 128, device="cuda", dtype=torch.bfloat16)
    nbytes = x.numel() * 2
    results = []

    def best(fn):
        g = graph_of(fn)
        return min(ms(g.replay, 100) for _ in range(3))

    t = best(lambda: x.sum())
    print(f"x.sum(): {nbytes / t / 1e9:.3f} TB/s", flush=True)
    y = torch.empty_like(x)
    t = best(lambda: y.copy_(x))
    print(f"copy (read + write): {2 * nbytes / t / 1e9:.3f} TB/s", flush=True)
    y = None
    ref = x.float().sum().item()
    for progs, rows, stages, warps, inter in itertools.product((128, 132, 264), (64, 128), (2, 3, 4), (4, 8),
                                                                (False, True)):
        if rows * 256 * stages > 200 * 1024:
            continue
        tiles = rows_total // rows
        per = tiles // progs
        used = per * progs * rows * 256
        out = torch.zeros(progs, device="cuda", dtype=torch.float32)

        def fn(out=out, per=per, progs=progs, rows=rows, stages=stages, warps=warps, inter=inter):
            _read_kernel[(progs,)](x, out, per, progs, ROWS=rows, INTERLEAVE=inter, STAGES=stages,
                                   num_warps=warps)
        fn()
        got = out.sum().item()
        want = x[: per * progs * rows].float().sum().item() if used != nbytes else ref
        if abs(got - want) > 1e-3 * abs(want) + 1.0:
            sys.exit(f"MISMATCH {progs} {rows} {stages} {warps} {inter}: {got} vs {want}")
        t = best(fn)
        r = {"programs": progs, "rows": rows, "stages": stages, "warps": warps,
             "order": "interleave" if inter else "contig", "ms": t, "tbs": used / t / 1e9}
        results.append(r)
        print(" ".join(f"{k}={v}" for k, v in r.items() if k != "ms") + f" {r['tbs']:.3f}", flush=True)
    results.sort(key=lambda r: -r["tbs"])
    print("best:", results[:5])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
