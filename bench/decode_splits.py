"""Decode split counts in CUDA-graph replay beside SDPA CUDNN's graph, for choosing `default_num_splits`.

    PYTHONPATH=src python bench/decode_splits.py [--json PATH] [--quick]

The decode kernel launches ``B * Hkv * splits`` programs of one CTA per SM (3 K/V stages fill shared
memory). When that count is a little under a multiple of the SM count (128 programs on 132 SMs) a few SMs
idle for the whole call; this script measures whether split counts that fill whole waves
(``B * Hkv * s`` a multiple of the SMs) pay for their extra partial writes. At every point of
bench/decode.py's grid it checks each candidate against float64 first (2 x SDPA's error + 1e-3), then
times graph replay and eager ``plan.run`` per candidate, with CUDNN's graph timed before and after the
candidates in the same run (its median is the reference). bf16, d = 128, one query token.
"""

import argparse
import math
import sys

import torch

import attnscope
from attnscope.kernels.decode import SPLIT_CAP, default_num_splits

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import GRID, LENS, graph_of, inputs, ms, reference_error, write_rows  # noqa: E402

BUDGET = 40 * 2**30  # K + V bytes per point


def candidates(programs: int, L: int, sms: int) -> list[int]:
    """The default, powers of two, and the split counts that fill 1..8 whole waves of ``sms``."""
    out = {default_num_splits(programs, 1, L, sms)}
    out |= {2**i for i in range(8)}
    out |= {math.ceil(k * sms / programs) for k in range(1, 9)}
    out |= {k * sms // math.gcd(programs, sms) for k in range(1, 5)}  # exactly whole waves
    return sorted(s for s in out if 1 <= s <= SPLIT_CAP and (s == 1 or L // s >= 128))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--quick", action="store_true", help="two points")
    a = p.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    points = [(b, hq, hkv, L) for b, hq, hkv in GRID for L in LENS if 2 * b * hkv * L * 128 * 2 <= BUDGET]
    if a.quick:
        points = [(1, 32, 32, 32768), (16, 32, 8, 4096)]
    rows = []
    for B, Hq, Hkv, L in points:
        q, k, v, lens = inputs(B, Hq, Hkv, L)
        P = B * Hkv
        rep = 40 if L * B <= 2**20 else 100

        def cudnn(q=q, k=k, v=v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(q, k, v, enable_gqa=True)

        g_ref = graph_of(cudnn)
        ref = [ms(g_ref.replay, rep)]
        row = {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "default": default_num_splits(B, Hkv, L, sms),
               "splits": {}}
        for s in candidates(P, L, sms):
            plan = attnscope.decode_plan(q, k, v, lens, num_splits=s, check_seqlens=False)
            o = plan.run(q, k, v, lens)
            err, bound = reference_error(o, q, k, v)
            if not err <= bound:
                print(f"B={B} Hkv={Hkv} L={L} s={s}: MISMATCH {err:.2e} > {bound:.2e}", flush=True)
                sys.exit(1)
            g = graph_of(lambda plan=plan, t=(q, k, v, lens): plan.run(*t))
            eager = ms(lambda plan=plan, t=(q, k, v, lens): plan.run(*t), rep)
            row["splits"][s] = {"graph_ms": ms(g.replay, rep), "eager_ms": eager, "fused": plan.fuse,
                                "waves": P * s / sms}
            del g, plan
        ref.append(ms(g_ref.replay, rep))
        row["cudnn_graph_ms"] = sum(ref) / len(ref)
        row["cudnn_graph_ms_runs"] = ref
        best = min(row["splits"], key=lambda s: row["splits"][s]["graph_ms"])
        c = row["cudnn_graph_ms"]
        d = row["splits"][row["default"]]["graph_ms"] if row["default"] in row["splits"] else float("nan")
        b = row["splits"][best]["graph_ms"]
        print(f"B={B:2d} Hq={Hq} Hkv={Hkv:2d} L={L:6d} CUDNN graph {ref[0]:.4f}/{ref[-1]:.4f} ms | default "
              f"s={row['default']} {d:.4f} ({c / d:.3f}x) | best s={best} {b:.4f} ({c / b:.3f}x) | "
              + " ".join(f"{s}:{r['graph_ms']:.4f}" for s, r in row["splits"].items()), flush=True)
        rows.append(row)
        del q, k, v, g_ref
        torch.cuda.empty_cache()
    if a.json:
        write_rows(a.json, rows)


if __name__ == "__main__":
    main()
