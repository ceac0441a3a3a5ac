"""The plan's two decode kernels beside SDPA CUDNN, CUDA-graph replay, at the issue's decode grid.

    git checkout 78676f3 && PYTHONPATH=src python bench/decode_impls.py [--json PATH] [--rounds 3] [--diag]

Needs the ``impl`` option and `attnscope.kernels.decode_stream` of 3b966a1..0307294 (78676f3: merge tickets
inside the stream; 0307294: after it). Not merged (fourteenth session, BENCHMARKS.md): the Gluon kernel with
its fused merge ran 0.980-1.007 x CUDNN at the 128-program points, no better than the portable kernel.

``attnscope.decode_plan`` with ``impl="auto"`` (on sm_90: the Gluon balanced-split kernel of
`attnscope.kernels.decode_stream` where it applies, else the portable Triton kernel) and with
``impl="portable"``, each checked against float64 twice (a fused merge's counters are back at 0) before
they are timed beside ``kv_read`` (the portable kernel's loads alone) and SDPA CUDNN in ``--rounds``
interleaved rounds of CUDA-graph replays; printed: K/V TB/s of each median and its ratio to CUDNN's, and
which kernel "auto" ran. bf16, d = 128, one query token, ``cache_seqlens`` at full length (as
bench/decode.py).
"""

import sys

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import PARITY, POINTS, each_point  # noqa: E402
from decode_fill import bench_parser, plan_graphs, time_point  # noqa: E402


def main():
    p = bench_parser(__doc__)
    p.add_argument("--points", choices=("all", "parity"), default="all")
    p.add_argument("--diag", action="store_true", help="also: auto without cache_seqlens, and the ceiling "
                   "probe of bench/decode_stream.py (its host merge untimed)")
    a = p.parse_args()

    def measure(point, q, k, v, lens):
        plans = {impl: attnscope.decode_plan(q, k, v, lens, check_seqlens=False, impl=impl)
                 for impl in ("auto", "portable")}
        if a.diag:
            plans["auto no lens"] = attnscope.decode_plan(q, k, v, None, check_seqlens=False)
        s = plans["portable"].num_splits
        graphs = plan_graphs(point, q, k, v, lens, plans, runs=2)
        if a.diag:
            from decode import graph_of, reference_error
            from decode_stream import stream_runner

            run, merged, _, _ = stream_runner(q, k, v, 264, 1, 1)
            run()
            err, bound = reference_error(merged(), q, k, v)
            assert err <= bound, f"probe mismatch {err} > {bound}"
            graphs["probe"] = graph_of(run)
        print(f"{point}: auto runs {plans['auto'].impl}", flush=True)
        return time_point(point, graphs, q, k, v, s, a.rounds, splits=s, auto=plans["auto"].impl)
    each_point(PARITY if a.points == "parity" else POINTS, measure, a.json)


if __name__ == "__main__":
    main()
