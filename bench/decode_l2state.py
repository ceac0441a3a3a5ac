"""Does decode's standing against CUDNN depend on what the L2 holds when it starts?

    PYTHONPATH=src python bench/decode_l2state.py [--json PATH] [--rounds 3] [--reps 40]

`triton.testing.do_bench` (every decode benchmark here) writes zeros over a 256 MB buffer before each timed
call, so a kernel starts with the L2 full of dirty lines that its own reads must evict, i.e. write back to
DRAM, while it streams. Under ncu (whose cache control leaves a clean L2) the shipped kernel ran 466.9 us at
B 16, Hkv 8, L 32k against cuDNN's 468.3 (bench/gpu/ncu_decode2.sh), while graph replays after the flush had
it 1.2 % behind. This probe times CUDA-graph replays of the shipped plan, ``kv_read`` (its loads alone),
``kv_ld`` (``kv_read`` with STAGES = 1: plain loads into registers, no cp.async, with and without
``evict_first``) and SDPA CUDNN under three L2 states, ``--reps`` events each, ``--rounds`` interleaved
rounds, median:

- ``dirty``: zeros written over 256 MB, then the call (do_bench's protocol);
- ``clean``: the same zeros, then a read of another 256 MB (the write-backs happen there, untimed);
- ``warm``: back to back, no flush (the L2 holds the end of the previous call's K/V, clean).

Measured (fourteenth session, bench/results/h200-2026-12-01-s14-decode-l2state.*): the dirty L2 costs every
kernel about 2 % alike; the ratios to CUDNN stay within 0.01 across the three states. ``evict_first`` on
plain loads changed nothing.
"""

import sys

import torch

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import PARITY, each_point, graph_of  # noqa: E402
from decode_fill import _kv_read, bench_parser, plan_graphs  # noqa: E402


def time_states(graphs, reps, rounds):
    """{state: {name: median ms}} over ``rounds`` interleaved rounds of ``reps`` timed replays each."""
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    other = torch.ones(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    prep = {"dirty": lambda: flush.zero_(),
            "clean": lambda: (flush.zero_(), other.sum()),
            "warm": lambda: None}
    times = {st: {n: [] for n in graphs} for st in prep}
    for _ in range(rounds):
        for st, before in prep.items():
            for name, g in graphs.items():
                for _ in range(3):  # untimed: the state settles (warm: the previous call's lines)
                    before()
                    g.replay()
                ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(reps)]
                for s, e in ev:
                    before()
                    s.record()
                    g.replay()
                    e.record()
                torch.cuda.synchronize()
                ts = sorted(s.elapsed_time(e) for s, e in ev)
                times[st][name].append(ts[len(ts) // 2])
    return times


POINTS = PARITY + [(64, 32, 8, 32768)]  # and a point with four waves of programs


def main():
    p = bench_parser(__doc__)
    p.add_argument("--reps", type=int, default=40)
    a = p.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def measure(point, q, k, v, lens):
        B, Hq, Hkv, L = point
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = plan.num_splits
        graphs = plan_graphs(point, q, k, v, lens, {"shipped": plan}, runs=2)
        part = torch.empty(B * Hkv * s, device="cuda")
        want = (k.float().sum() + v.float().sum()).item()
        graphs["kv_read"] = graph_of(lambda: _kv_read[(B * Hkv, s)](k, v, part, L, s, BLOCK_N=128, D=128,
                                                                    STAGES=3, num_warps=4))
        assert abs(part.sum().item() - want) <= 1e-3 * abs(want) + 10, "kv_read mismatch"
        for ev in ("", "evict_first"):
            graphs[f"kv_ld{' ' + ev if ev else ''}"] = graph_of(
                lambda ev=ev: _kv_read[(B * Hkv, s)](k, v, part, L, s, BLOCK_N=128, D=128, STAGES=1, EV=ev,
                                                     num_warps=8))
            assert abs(part.sum().item() - want) <= 1e-3 * abs(want) + 10, "kv_ld mismatch"

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(q, k, v, enable_gqa=True)
        graphs["cudnn"] = graph_of(cudnn)
        times = time_states(graphs, a.reps, a.rounds)
        nbytes = 2 * k.numel() * k.element_size()
        for st, t in times.items():
            med = {n: sorted(x)[len(x) // 2] for n, x in t.items()}
            print(f"B{B} Hkv{Hkv} L{L} s{s} {st:5s} " + " | ".join(
                f"{n} {nbytes / m / 1e9:.3f} ({med['cudnn'] / m:.3f}x)" for n, m in med.items()), flush=True)
        return {"point": list(point), "splits": s, "bytes": nbytes, "ms": times}
    each_point(POINTS, measure, a.json)


if __name__ == "__main__":
    main()
