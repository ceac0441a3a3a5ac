"""BENCHMARKS.md's figures, drawn from the result files its tables cite (no GPU, no new measurement).

    python bench/plots.py [--out bench/results/plots]

- ``forward.png``: TFLOP/s against N, ``impl="auto"``, the portable kernel, SDPA CUDNN and FLASH, bf16, per
  head dim and mask (`FORWARD`, the B·N = 16k grid);
- ``backward.png``: the same panels for the backward: the Gluon Hopper backward (the default on sm_90), the
  portable kernels, SDPA CUDNN and FLASH (`BACKWARD`);
- ``decode.png``: per decode point, speed relative to SDPA CUDNN's eager call (t_CUDNN / t) of the eager
  one-liner, its CUDA-graph replay, the FP8 cache, SDPA FLASH and CUDNN's graph (`DECODE`);
- ``varlen.png``: the packed batch's forward and forward + backward TFLOP/s per implementation (`VARLEN`).

Each figure's numbers are exactly its table's; re-run this after a table's file changes. Needs matplotlib (the
``kernels`` extra).
"""

from __future__ import annotations

import argparse
import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
FORWARD = RESULTS / "h200-2026-12-01-prefill-dispatch-16k.json"
BACKWARD = RESULTS / "h200-2026-12-02-backward-hopper-first.json"
DECODE = RESULTS / "h200-2026-12-03d-decode.json"
VARLEN = RESULTS / "h200-2026-12-02-varlen.json"


def _panels(plt, rows, series, title, ylabel):
    """A 2 x 2 grid (d 64 / 128 x unmasked / causal) of TFLOP/s against N, one line per series."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for i, d in enumerate((64, 128)):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            pts = sorted((r["n"], r) for r in rows if r["d"] == d and r["causal"] == causal)
            for label, get in series.items():
                ax.plot([n for n, _ in pts], [get(r) for _, r in pts], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_title(f"d = {d}, {'causal' if causal else 'no mask'}")
            ax.set_xlabel("N")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def forward(plt):
    rows = [r for r in json.loads(FORWARD.read_text())["grid"] if r["dtype"] == "bfloat16"]
    series = {"attnscope auto": lambda r: r["tflops"]["auto"], "portable": lambda r: r["tflops"]["portable"],
              "SDPA CUDNN": lambda r: r["tflops"]["cudnn"], "SDPA FLASH": lambda r: r["tflops"]["flash"]}
    return _panels(plt, rows, series, "Forward, H200, bf16, H = 32, B·N = 16k", "TFLOP/s")


def backward(plt):
    rows = json.loads(BACKWARD.read_text())["rows"]
    t = "backward_tflops"
    series = {"attnscope (Gluon Hopper)": lambda r: r[t]["attnscope_hopper"],
              "portable": lambda r: r[t]["attnscope"], "SDPA CUDNN": lambda r: r[t]["sdpa_cudnn"],
              "SDPA FLASH": lambda r: r[t]["sdpa_flash"]}
    title = "Backward, H200, bf16, H = 32, B·N = 16k (2.5 x forward FLOPs)"
    return _panels(plt, rows, series, title, "TFLOP/s")


def decode(plt):
    rows = json.loads(DECODE.read_text())["rows"]
    names = ["one-liner", "graph", "fp8", "FLASH", "CUDNN graph"]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs = [i + (k - len(names) / 2) * width for i in range(len(rows))]
        ys = [r["us"]["CUDNN"] / r["us"][name] if name in r["us"] else 0.0 for r in rows]
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), [f"B{b} H{hq}/{hkv}\nL{L // 1024}k" for b, hq, hkv, L in
                                     (r["point"] for r in rows)], fontsize=7)
    ax.set_ylabel("speed vs SDPA CUDNN eager (t_CUDNN / t)")
    ax.set_title("Decode, H200, bf16 queries, d = 128 (0: not run at that point)")
    ax.legend(fontsize=8, ncol=len(names))
    fig.tight_layout()
    return fig


def varlen(plt):
    data = json.loads(VARLEN.read_text())
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["fwd_tflops"] for r in rows], 0.4, label="forward")
    ax.bar([x + 0.2 for x in xs], [r["fwdbwd_tflops"] for r in rows], 0.4, label="forward + backward")
    ax.set_xticks(list(xs), [r["impl"] for r in rows], fontsize=8)
    ax.set_ylabel("useful TFLOP/s")
    ax.set_title(f"Packed batch: {len(data['lengths'])} prompts, {sum(data['lengths']):,} tokens, causal, "
                 f"Hq {data['hq']} / Hkv {data['hkv']}, d {data['d']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


FIGURES = {"forward": forward, "backward": backward, "decode": decode, "varlen": varlen}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS / "plots"), help="folder for the PNGs")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        fig = draw(plt)
        fig.savefig(out / f"{name}.png", dpi=90)
        plt.close(fig)
        print(out / f"{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
