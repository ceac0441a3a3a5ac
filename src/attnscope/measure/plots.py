"""PNG plots of a benchmark sweep (the JSON that `attnscope bench --json` writes).

- ``prefill_tflops.png``: TFLOP/s vs N per implementation, one panel per (head dim, causal);
- ``prefill_roofline.png``: each prefill kernel's measured point at N = 4,096 on the device's roofline.
  Its arithmetic intensity uses the *logical* bytes of `model.traffic` (FA-2 row for the fused kernels,
  the naive row for naive), so a point above the bandwidth roof is the L2 at work, not an error;
- ``decode_tbs.png``: decode TB/s per grid point and implementation, with the read ceiling measured in
  the same run.

Needs matplotlib (`pip install matplotlib`); pure plotting, no GPU: `attnscope bench --from-json FILE
--plots DIR` redraws a recorded run anywhere. Every PNG is drawn in memory first and then written through
`inputs.write_all` (atomic, never through a symlink, nothing written if any plot fails).
"""

from __future__ import annotations

import io
import warnings

from attnscope.errors import visible
from attnscope.inputs import out_dir as checked_dir
from attnscope.inputs import out_file, write_all
from attnscope.model import roofline, traffic
from attnscope.model.flops import attention_flops

IMPLS = ("attnscope", "flash", "cudnn", "efficient", "naive")
#: (naive?, causal) -> the model.traffic row whose logical bytes a measured point is placed by.
_TRAFFIC_ROW = {(False, False): "flash", (False, True): "flash-causal", (True, False): "naive",
                (True, True): "naive-causal-eager"}


def _title(env: dict) -> str:
    return (f"{env.get('gpu', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
            f"{env.get('date', '')}")


def prefill_tflops(plt, rows: list[dict], env: dict):
    panels = sorted({(r["d"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels, strict=True):
        sel = sorted((r for r in rows if r["d"] == d and r["causal"] == causal), key=lambda r: r["n"])
        for impl in IMPLS:
            pts = [(r["n"], r["tflops"][impl]) for r in sel if r["tflops"].get(impl)]
            if pts:
                ns, tfs = zip(*pts, strict=True)
                ax.plot(ns, tfs, marker="o", label=impl, linewidth=2.2 if impl == "attnscope" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d}, {'causal' if causal else 'unmasked'}", fontsize=10)
        ax.set_xlabel("N (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"Prefill, {rows[0]['dtype']}, H={rows[0]['heads']}, B*N={rows[0]['batch'] * rows[0]['n']}: "
                 + _title(env), fontsize=9)
    return fig


def prefill_roofline(plt, rows: list[dict], env: dict, device: str = "h200", n: int = 4096):
    dev = roofline.device(device)
    peak = roofline.peak(dev, "bf16") / 1e12
    bw = dev.hbm / 1e12
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    xs = [2**i for i in range(-2, 14)]
    ax.plot(xs, [min(peak, x * bw) for x in xs], color="black", linewidth=1)
    ax.text(xs[-1], peak, f"{dev.label}: {peak:.0f} TFLOP/s, {bw:.2f} TB/s (datasheet)", ha="right",
            va="bottom", fontsize=7)
    colors = {impl: f"C{i}" for i, impl in enumerate(IMPLS)}
    markers = {(64, False): "o", (64, True): "s", (128, False): "^", (128, True): "D"}
    for r in (r for r in rows if r["n"] == n):
        t = traffic.traffic(n=r["n"], d=r["d"], dtype="bf16" if r["dtype"] == "bfloat16" else "fp16",
                            rows=tuple(_TRAFFIC_ROW.values()))
        flops = attention_flops(1, 1, r["n"], r["n"], r["d"], r["causal"])  # per (batch, head), credited
        for impl, tf in r["tflops"].items():
            if tf:  # placed by the logical bytes of its model.traffic row
                ax.scatter([flops / t[_TRAFFIC_ROW[impl == "naive", r["causal"]]].total], [tf], s=28,
                           color=colors.get(impl, "gray"), marker=markers.get((r["d"], r["causal"]), "x"))
    for impl, c in colors.items():
        ax.scatter([], [], color=c, label=impl)
    for (d, causal), m in markers.items():
        ax.scatter([], [], color="gray", marker=m, label=f"d={d} {'causal' if causal else 'unmasked'}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("FLOP / logical HBM byte (model.traffic)")
    ax.set_ylabel("TFLOP/s (measured)")
    ax.set_title(f"Prefill at N={n} on the roofline: " + _title(env), fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    return fig


def decode_tbs(plt, rows: list[dict], env: dict, ceiling: float | None):
    impls = [i for i in ("attnscope", "attnscope_1split", "flash", "cudnn")
             if any(r["tbs"].get(i) for r in rows)]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        ax.bar([i + k * width for i in range(len(rows))], [r["tbs"].get(impl) or 0 for r in rows], width,
               label=impl)
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1,
                   label=f"read ceiling {ceiling:.2f} TB/s")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels([f"B{r['batch']} Hkv{r['hkv']}\nL{r['L'] // 1024}k" for r in rows], fontsize=7)
    ax.set_ylabel("TB/s (K+V bytes / time)")
    ax.set_title("Decode, bf16, d=128: " + _title(env), fontsize=8)
    ax.legend(fontsize=7, ncol=5)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _png(plt, fig) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


#: Every file `draw_plots` can write.
PLOT_NAMES = ("prefill_tflops.png", "prefill_roofline.png", "decode_tbs.png")


def draw_plots(result: dict, out_dir: str) -> dict:
    """Every plot the result has data for, drawn in memory: {path in `out_dir`: PNG bytes}."""
    out = checked_dir(out_dir, "--plots")  # one line for a file, a path under a file, an unwritable place
    names = (["prefill_tflops.png", "prefill_roofline.png"] if result.get("prefill") else []) + \
        (["decode_tbs.png"] if result.get("decode") else [])
    for name in names:  # before seconds of drawing
        out_file(out / name, "--plots")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"plots need matplotlib: pip install matplotlib ({e})") from e
    result = _plain(result)
    env = result.get("env", {})
    draw = {"prefill_tflops.png": lambda: prefill_tflops(plt, result["prefill"], env),
            "prefill_roofline.png": lambda: prefill_roofline(plt, result["prefill"], env),
            "decode_tbs.png": lambda: decode_tbs(plt, result["decode"], env, result.get("read_ceiling_tbs"))}
    # text from the file is data: no mathtext ("$\\undefined$" would raise), no TeX; a missing glyph's
    # warning is not printed (it would echo the text to stderr)
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {out / name: _png(plt, draw[name]()) for name in names}


def _plain(x):
    """`x` with every string (keys too) made visible (`errors.visible`): no control character reaches
    matplotlib's text or its warnings."""
    if isinstance(x, str):
        return visible(x)
    if isinstance(x, dict):
        return {_plain(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def write_plots(result: dict, out_dir: str) -> list[str]:
    """Write every plot the result has data for into `out_dir` (all or nothing); returns the paths."""
    return [str(path) for path in write_all(draw_plots(result, out_dir), "--plots")]
