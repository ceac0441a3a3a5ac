"""Issue 15: Nsight Compute evidence for every prefill variant at one point, beside SDPA CUDNN and FLASH.

    # under ncu (bench/gpu/ncu_variants.sh runs it): every variant built for (d, causal), launched once each
    ncu --clock-control none --profile-from-start off --csv --metrics M python bench/ncu_variants.py run \
        --d 64 --dtype bf16 --causal --n 4096 > ncu.csv
    python bench/ncu_variants.py table ncu.csv [...]   # the table: one row per kernel

``run``: builds q, k, v (B = tokens / N, H 32, randn), checks every implementation against float64 at
full size (`measure.bench._ref_error`, exit 1 on an error above 0.05), compiles/plans each outside the
profiled range, then launches each once between ``cudaProfilerStart``/``Stop``, in the order printed
("order: ..."). Implementations: ``portable`` (kernels/fwd.py, its table config), every
`fwd_hopper.VARIANTS` entry built for (d, causal), SDPA CUDNN, SDPA FLASH.
``table``: reads ncu's ``--csv`` output (and the order line) and prints per kernel: time under ncu, issue
slots busy, tensor (gmma) pipe and MUFU (xu) utilisation, warp cycles per issued instruction, the stall
reasons per issued instruction that exceed 0.1 (barrier, wait, long/short scoreboard, ...), registers per
thread at launch, dynamic shared memory, and the executed instruction count.
"""

import argparse
import csv
import io
import math
import sys

STALLS = ("barrier", "wait", "long_scoreboard", "short_scoreboard", "math_pipe_throttle", "mio_throttle",
          "membar", "sleeping", "dispatch_stall", "no_instruction", "branch_resolving", "lg_throttle",
          "not_selected", "selected", "misc", "drain", "imc_miss", "tex_throttle")
METRICS = {  # column -> ncu metric
    "us": "gpu__time_duration.sum",
    "issue%": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "tensor%": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor(any)%": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "mufu%": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "cyc/inst": "smsp__average_warp_latency_per_inst_issued.ratio",
    "regs": "launch__registers_per_thread",
    "smem": "launch__shared_mem_per_block_dynamic",
    "inst": "smsp__inst_executed.sum",
    **{s: f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS},
}


def metrics_arg() -> str:
    return ",".join(METRICS.values())


def run(a) -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import attnscope
    from attnscope.kernels import fwd
    from attnscope.kernels import fwd_hopper as h
    from attnscope.measure.bench import _ref_error

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    b = max(1, a.tokens // a.n)
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, a.heads, a.n, a.d, device="cuda", dtype=dt) for _ in range(3))
    scale = fwd.LOG2E / math.sqrt(a.d)

    def variant(name):
        def f():
            o, lse = torch.empty_like(q), torch.empty(1, device="cuda", dtype=torch.float32)
            h.launch(q, k, v, o, lse, scale, a.causal, False, name)
            return o
        return f

    def backend(be):
        def f():
            with sdpa_kernel(be):
                return sdpa(q, k, v, is_causal=a.causal)
        return f

    impls = {"portable": lambda: attnscope.flash_attention(q, k, v, causal=a.causal, impl="portable")}
    impls.update({n: variant(n) for n in h.VARIANTS if h.supports(n, a.d, a.causal)})
    impls["sdpa_cudnn"] = backend(SDPBackend.CUDNN_ATTENTION)
    impls["sdpa_flash"] = backend(SDPBackend.FLASH_ATTENTION)
    bad = []
    for name, f in impls.items():  # compile / plan, and the float64 check at full size
        err = _ref_error(torch, f(), q, k, v, a.causal)
        print(f"check {name}: max |err| vs float64 {err:.2e}", file=sys.stderr)
        if not err < 0.05:
            bad.append(name)
    if bad:
        print(f"FAIL: {', '.join(bad)} above 0.05 against float64", file=sys.stderr)
        return 1
    torch.cuda.synchronize()
    print("order: " + " ".join(impls), file=sys.stderr)
    torch.cuda.profiler.start()
    for f in impls.values():
        f()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


def table(paths) -> int:
    for path in paths:
        with open(path) as fh:
            text = fh.read()
        order = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("order:")), [])
        start = text.find('"ID"')
        if start < 0:
            print(f"{path}: no ncu CSV found")
            continue
        body = "\n".join(ln for ln in text[start:].splitlines() if ln.startswith('"'))
        rows = list(csv.DictReader(io.StringIO(body)))
        kernels = {}  # ID -> (name, {metric: value})
        for r in rows:
            kid = int(r["ID"])
            kernels.setdefault(kid, (r["Kernel Name"], {}))[1][r["Metric Name"]] = r["Metric Value"]
        ids = sorted(kernels)
        labels = order if len(order) == len(ids) else [kernels[i][0][:40] for i in ids]
        print(f"## {path}  ({len(ids)} kernels; names from the order line: {len(order) == len(ids)})")
        base = ["us", "issue%", "tensor%", "tensor(any)%", "mufu%", "cyc/inst", "regs", "smem", "inst"]
        base = [c for c in base if any(not math.isnan(_num(kernels[i][1].get(METRICS[c]))) for i in ids)]
        tensor = sorted({k for i in ids for k in kernels[i][1] if "tensor" in k} - set(METRICS.values()))
        for k in tensor:  # other tensor-pipe counters the run asked for (bench/gpu/ncu_variants_d64.sh)
            col = k.replace(".avg.pct_of_peak_sustained_active", "%").replace("sm__", "")
            METRICS[col] = k
            base.append(col)
        stalls = [s for s in STALLS
                  if any(_num(kernels[i][1].get(METRICS[s])) > 0.1 for i in ids)]
        print("| kernel | " + " | ".join(base + [f"stall {s}" for s in stalls]) + " |")
        print("| --- " * (1 + len(base) + len(stalls)) + "|")
        for label, i in zip(labels, ids, strict=False):
            m = kernels[i][1]
            cells = [_fmt(_num(m.get(METRICS[c])), c) for c in base + stalls]
            print(f"| {label} | " + " | ".join(cells) + " |")
        print()
    return 0


def _num(s) -> float:
    try:
        return float(str(s).replace(",", ""))
    except (TypeError, ValueError):
        return float("nan")


def _fmt(x: float, col: str) -> str:
    if math.isnan(x):
        return "n/a"
    if col == "us":
        return f"{x / 1000:.1f}"  # ncu reports gpu__time_duration in ns
    if col in ("regs", "smem"):
        return f"{x:.0f}"
    if col == "inst":
        return f"{x / 1e6:.1f} M"
    return f"{x:.2f}" if col == "cyc/inst" or col in STALLS else f"{x:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--d", type=int, default=64)
    r.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    r.add_argument("--causal", action="store_true")
    r.add_argument("--n", type=int, default=4096)
    r.add_argument("--tokens", type=int, default=16384)
    r.add_argument("--heads", type=int, default=32)
    r.add_argument("--metrics", action="store_true", help="print the ncu --metrics argument and exit")
    t = sub.add_parser("table")
    t.add_argument("paths", nargs="+")
    a = p.parse_args()
    if a.cmd == "table":
        return table(a.paths)
    if a.metrics:
        print(metrics_arg())
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
