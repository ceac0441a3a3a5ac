"""Does decode stream faster when every SM holds a program? Equal work per program, 128 vs 132 programs.

    PYTHONPATH=src python bench/decode_fill.py [--json PATH]

The decode kernel runs one CTA per SM. At B * Hkv * splits = 128 programs (e.g. B = 1, Hkv = 32, 4 splits)
4 of the H200's 132 SMs idle for the whole call. This probe times (CUDA-graph replay) pairs of layouts
whose programs do the same work each, 128 vs 132 of them, and reports K/V TB/s of each; a balanced split
(every SM busy) can gain at most the ratio. Printed beside: a plain read of the same bytes (``k.sum() +
v.sum()``, two kernels), ``kv_read`` (decode's own loads, programs and pipeline without its arithmetic:
the ceiling of its access pattern) and SDPA CUDNN at the 128-program layout. bf16, d = 128, one query token.
"""

import argparse
import sys

import torch
import triton
import triton.language as tl

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import each_point, graph_of, inputs, ms, reference_error, write_rows  # noqa: E402


@triton.jit
def _kv_read(K, V, OUT, L, num_splits, BLOCK_N: tl.constexpr, D: tl.constexpr, STAGES: tl.constexpr,
             EV: tl.constexpr = ""):
    """Decode's loads without its arithmetic: program (head, split) sums its chunk of K and V (``STAGES = 1``:
    plain loads into registers, no cp.async; ``EV``: their eviction policy)."""
    head, split = tl.program_id(0), tl.program_id(1)
    per = tl.cdiv(tl.cdiv(L, BLOCK_N), num_splits) * BLOCK_N
    lo = split * per
    hi = tl.minimum(lo + per, L)
    offs = tl.arange(0, BLOCK_N)[:, None] * D + tl.arange(0, D)[None, :]
    base = head.to(tl.int64) * L * D
    acc = tl.zeros([BLOCK_N, D], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        acc += tl.load(K + base + start * D + offs, eviction_policy=EV).to(tl.float32)
        acc += tl.load(V + base + start * D + offs, eviction_policy=EV).to(tl.float32)
    tl.store(OUT + head * num_splits + split, tl.sum(acc))


# (name, (B, Hq, Hkv, L, splits) with 128 programs, the same with 132 programs)
PAIRS = [
    ("B1 Hkv32 L128k", (1, 32, 32, 131072, 4), (1, 33, 33, 131072, 4)),
    ("B1 Hkv32 L32k", (1, 32, 32, 32768, 4), (1, 33, 33, 32768, 4)),
    ("B16 Hkv8 L32k", (16, 32, 8, 32768, 1), (33, 16, 4, 32768, 1)),
    ("B16 Hkv8 L128k", (16, 32, 8, 131072, 1), (33, 16, 4, 131072, 1)),
]


def main():
    p = bench_parser(__doc__)
    p.add_argument("--variants", action="store_true",
                   help="instead: VARIANTS (block configs, splits, merge) at the 128-program layouts")
    a = p.parse_args()
    if a.variants:
        return variants(a)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for name, *layouts in PAIRS:
        row = {"name": name}
        for tag, (B, Hq, Hkv, L, s) in zip(("p128", "p132"), layouts, strict=True):
            q, k, v, lens = inputs(B, Hq, Hkv, L)
            plan = attnscope.decode_plan(q, k, v, lens, num_splits=s, check_seqlens=False)
            err, bound = reference_error(plan.run(q, k, v, lens), q, k, v)
            if not err <= bound:
                sys.exit(f"{name} {tag}: MISMATCH {err:.2e} > {bound:.2e}")
            g = graph_of(lambda plan=plan, t=(q, k, v, lens): plan.run(*t))
            gs = graph_of(lambda k=k, v=v: (k.sum(), v.sum()))
            part = torch.empty(B * Hkv * s, device="cuda")
            kv = graph_of(lambda k=k, v=v, part=part, s=s, B=B, Hkv=Hkv, L=L: _kv_read[(B * Hkv, s)](
                k, v, part, L, s, BLOCK_N=128, D=128, STAGES=3, num_warps=4))
            want = (k.float().sum() + v.float().sum()).item()
            assert abs(part.sum().item() - want) <= 1e-3 * abs(want) + 10, "kv_read mismatch"
            nbytes = 2 * k.numel() * k.element_size()
            times = {"attnscope": [], "read": [], "kv_read": [], "cudnn": []}
            if tag == "p128":
                def cudnn(q=q, k=k, v=v):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return sdpa(q, k, v, enable_gqa=True)
                gc = graph_of(cudnn)
            for _ in range(a.rounds):
                times["attnscope"].append(ms(g.replay, 100))
                times["read"].append(ms(gs.replay, 100))
                times["kv_read"].append(ms(kv.replay, 100))
                if tag == "p128":
                    times["cudnn"].append(ms(gc.replay, 100))
            tbs = {key: nbytes / min(t) / 1e9 for key, t in times.items() if t}
            row[tag] = {"layout": [B, Hq, Hkv, L, s], "programs": B * Hkv * s, "bytes": nbytes,
                        "ms": times, "tbs_best": tbs}
            print(f"{name:16s} {tag} programs={B * Hkv * s:3d} " + " ".join(
                f"{key} {val:.3f} TB/s" for key, val in tbs.items()), flush=True)
            del q, k, v, g, gs, kv, plan
            torch.cuda.empty_cache()
        gain = row["p132"]["tbs_best"]["attnscope"] / row["p128"]["tbs_best"]["attnscope"]
        print(f"{name:16s} 132/128 programs: {gain:.3f}x TB/s; 128-program attnscope / CUDNN "
              f"{row['p128']['tbs_best']['attnscope'] / row['p128']['tbs_best']['cudnn']:.3f}", flush=True)
        rows.append(row)
    if a.json:
        write_rows(a.json, rows)


VARIANTS = {
    "default": {},
    "no_dot": {"use_dot": False},
    "128/8/3": {"_config": {"BLOCK_N": 128, "num_warps": 8, "STAGES": 3, "num_stages": 3}},
    "128/4/4": {"_config": {"BLOCK_N": 128, "num_warps": 4, "STAGES": 4, "num_stages": 4}},
    "128/8/4": {"_config": {"BLOCK_N": 128, "num_warps": 8, "STAGES": 4, "num_stages": 4}},
    "2x splits": {"splits": 2},
    "separate merge": {"fuse_combine": False},
    "64/4/5": {"_config": {"BLOCK_N": 64, "num_warps": 4, "STAGES": 5, "num_stages": 5}},
}


def time_beside_peers(graphs, q, k, v, splits, rounds):
    """Add ``kv_read`` (``splits`` per head) and SDPA CUDNN's graph to ``graphs`` {name: CUDA graph}, replay
    them all in ``rounds`` interleaved rounds; return ({name: [ms per round]}, {name: median ms})."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    B, Hkv, L, d = k.shape
    part = torch.empty(B * Hkv * splits, device="cuda")
    graphs["kv_read"] = graph_of(lambda: _kv_read[(B * Hkv, splits)](k, v, part, L, splits, BLOCK_N=128, D=d,
                                                                     STAGES=3, num_warps=4))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, enable_gqa=True)
    graphs["cudnn"] = graph_of(cudnn)
    times = {key: [] for key in graphs}
    for _ in range(rounds):
        for key, g in graphs.items():
            times[key].append(ms(g.replay, 100))
    return times, {key: sorted(t)[len(t) // 2] for key, t in times.items()}


def plan_graphs(point, q, k, v, lens, plans, runs=1):
    """{name: CUDA graph of ``plan.run``} for {name: plan}; exit unless each plan's output passes the float64
    check ``runs`` times (twice: a fused merge's counters are back at 0 after a run)."""
    graphs = {}
    for name, plan in plans.items():
        seq = lens if plan.layout[3] is not None else None  # a plan made without lengths runs without
        for _ in range(runs):
            err, bound = reference_error(plan.run(q, k, v, seq), q, k, v)
            if not err <= bound:
                sys.exit(f"{point} {name}: MISMATCH {err:.2e} > {bound:.2e}")
        graphs[name] = graph_of(lambda plan=plan, seq=seq: plan.run(q, k, v, seq))
    return graphs


def time_point(point, graphs, q, k, v, kv_splits, rounds, **row):
    """`time_beside_peers` at a (B, Hq, Hkv, L) point (kv_read with ``kv_splits``), one printed line of
    ratios; the point's JSON row (``row`` added)."""
    times, med = time_beside_peers(graphs, q, k, v, kv_splits, rounds)
    B, Hq, Hkv, L = point
    nbytes = 2 * k.numel() * k.element_size()
    print_ratios(f"B{B} Hq{Hq} Hkv{Hkv} L{L} s{kv_splits}", nbytes, med)
    return {"point": list(point), **row, "bytes": nbytes, "ms": times}


def bench_parser(doc):
    """The decode experiments' command line: ``--json PATH`` and ``--rounds`` (interleaved timing rounds)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--rounds", type=int, default=3)
    return p


def check_beside(o, ref, q, k, v, what):
    """Exit unless ``o`` passes the float64 check (sequence 0) and every row is within 2 % (of the largest
    |value|) of the portable kernel's output ``ref``."""
    err, bound = reference_error(o, q, k, v)
    diff = (o.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
    if not (err <= bound and diff <= 2e-2):
        sys.exit(f"{what}: MISMATCH err {err:.2e} (bound {bound:.2e}), max diff to portable {diff:.2e} "
                 f"of its largest value")


def print_ratios(label, nbytes, med):
    """One line: K/V TB/s of each median time and its ratio to CUDNN's."""
    print(f"{label} " + " | ".join(f"{key} {nbytes / t / 1e9:.3f} ({med['cudnn'] / t:.3f}x)"
                                   for key, t in med.items()), flush=True)


def variants(a):
    """Each of `VARIANTS` beside kv_read and CUDNN, CUDA-graph replay, ``a.rounds`` interleaved rounds."""

    def measure(pair, q, k, v, lens):
        name, (B, Hq, Hkv, L, s), _ = pair
        nbytes = 2 * k.numel() * k.element_size()
        graphs = {}
        for vname, opts in VARIANTS.items():
            opts = dict(opts)
            splits = s * opts.pop("splits", 1)
            plan = attnscope.decode_plan(q, k, v, lens, num_splits=splits, check_seqlens=False, **opts)
            err, bound = reference_error(plan.run(q, k, v, lens), q, k, v)
            if not err <= bound:
                sys.exit(f"{name} {vname}: MISMATCH {err:.2e} > {bound:.2e}")
            graphs[vname] = graph_of(lambda plan=plan, t=(q, k, v, lens): plan.run(*t))
        times, med = time_beside_peers(graphs, q, k, v, s, a.rounds)
        print_ratios(f"{name:16s}", nbytes, med)
        return {"name": name, "layout": [B, Hq, Hkv, L, s], "bytes": nbytes, "ms": times}
    each_point(PAIRS, measure, a.json, shape=lambda pair: pair[1][:4])

if __name__ == "__main__":
    main()
