"""How unevenly do SMs stream? Per-program finish times of a contiguous read; a dynamic schedule beside it.

    PYTHONPATH=src python bench/read_tail.py [--json PATH]

The memory-bound decode kernel gives each of its ~128 programs one contiguous chunk of the KV cache. If
some SMs stream slower than others, the call lasts as long as the slowest chunk. This probe reads a bf16
buffer of 0.5, 2 and 8 GiB (rows of 256 bytes, tiles of 128 rows, 3 stages) two ways:
``contig`` (132 programs, one chunk each; each records its start and end on the global timer) and
``dynamic`` (132 programs take chunks of ``CHUNK`` tiles from an atomic counter until none is left).
Prints TB/s (CUDA-graph replay, best of 3) and the spread of the contiguous programs' finish times.
"""

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import graph_of, ms  # noqa: E402

ROWS = 128


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _contig(X, OUT, T0, T1, tiles_per_prog, ROWS: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(T0 + pid, _now())
    offs = tl.arange(0, ROWS)[:, None] * 128 + tl.arange(0, 128)[None, :]
    acc = tl.zeros([ROWS, 128], tl.float32)
    for i in tl.range(0, tiles_per_prog, num_stages=STAGES):
        t = pid * tiles_per_prog + i
        acc += tl.load(X + t.to(tl.int64) * (ROWS * 128) + offs).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc))
    tl.store(T1 + pid, _now())


@triton.jit
def _dynamic(X, OUT, CNT, n_chunks, CHUNK: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, ROWS)[:, None] * 128 + tl.arange(0, 128)[None, :]
    acc = tl.zeros([ROWS, 128], tl.float32)
    c = tl.atomic_add(CNT, 1)
    while c < n_chunks:
        for i in tl.range(0, CHUNK, num_stages=STAGES):
            t = c * CHUNK + i
            acc += tl.load(X + t.to(tl.int64) * (ROWS * 128) + offs).to(tl.float32)
        c = tl.atomic_add(CNT, 1)
    tl.store(OUT + pid, tl.sum(acc))
    # the last program out resets the counter for the next launch
    done = tl.atomic_add(CNT + 1, 1)
    if done == tl.num_programs(0) - 1:
        tl.atomic_xchg(CNT, 0)
        tl.atomic_xchg(CNT + 1, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args()
    rows_out = []
    P = torch.cuda.get_device_properties(0).multi_processor_count

    def best(fn):
        g = graph_of(fn)
        return min(ms(g.replay, 100) for _ in range(3))

    for gib in (0.5, 2, 8):
        n_rows = int(gib * 2**30) // 256
        x = torch.randn(n_rows, 128, device="cuda", dtype=torch.bfloat16)
        tiles = n_rows // ROWS
        per = tiles // P
        used = per * P * ROWS * 256
        want = x[: per * P * ROWS].float().sum().item()
        out = torch.zeros(P, device="cuda")
        t0 = torch.zeros(P, device="cuda", dtype=torch.int64)
        t1 = torch.zeros_like(t0)
        for stages in (3, 4):
            def contig(stages=stages, x=x, out=out, t0=t0, t1=t1, per=per):
                _contig[(P,)](x, out, t0, t1, per, ROWS=ROWS, STAGES=stages, num_warps=4)
            contig()
            assert abs(out.sum().item() - want) <= 1e-3 * abs(want) + 1, "contig mismatch"
            tc = best(contig)
            contig()
            torch.cuda.synchronize()
            start, end = t0.min().item(), (t1 - t0.min()).double() / 1e3  # µs after the first start
            finish = end.sort().values
            row = {"gib": gib, "stages": stages, "contig_tbs": used / tc / 1e9, "contig_ms": tc,
                   "finish_us": {"min": finish[0].item(), "p50": finish[P // 2].item(),
                                 "p90": finish[int(P * 0.9)].item(), "max": finish[-1].item()},
                   "start_spread_us": (t0.max() - t0.min()).item() / 1e3}
            del start
            for chunk in (4, 16, 64):
                n_chunks = tiles // chunk
                used_d = n_chunks * chunk * ROWS * 256
                cnt = torch.zeros(2, device="cuda", dtype=torch.int32)

                def dyn(chunk=chunk, n_chunks=n_chunks, cnt=cnt, stages=stages, x=x, out=out):
                    _dynamic[(P,)](x, out, cnt, n_chunks, CHUNK=chunk, ROWS=ROWS, STAGES=stages,
                                   num_warps=4)
                dyn()
                want_d = x[: n_chunks * chunk * ROWS].float().sum().item()
                assert abs(out.sum().item() - want_d) <= 1e-3 * abs(want_d) + 1, "dynamic mismatch"
                dyn()  # the counter was reset by the last program
                assert abs(out.sum().item() - want_d) <= 1e-3 * abs(want_d) + 1, "dynamic mismatch (2nd)"
                row[f"dynamic{chunk}_tbs"] = used_d / best(dyn) / 1e9
            print(json.dumps(row), flush=True)
            rows_out.append(row)
        x = None
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
