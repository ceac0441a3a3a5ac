"""A real training run with attnscope's backward (issue 13): a small GPT, SDPA vs attnscope.

    PYTHONPATH=src python bench/train.py [--steps 500] [--quick] [--json out.json] [--plot out.png]

Model: a GPT-style decoder (pre-norm, RoPE, GQA attention, GELU MLP, tied byte embeddings), 6 layers,
d_model 512, 8 query heads / 2 kv heads (head_dim 64), sequence 1024, batch 16, bf16 autocast, AdamW.
Data: a fixed synthetic byte stream, deterministic from --data-seed (a sparse random second-order
Markov chain over 256 symbols: learnable structure, nothing downloaded); every run sees the same batches.
Three runs: SDPA (model seeds 0 and 1: the run-to-run spread) and attnscope (seed 0, the same
initialisation and data as SDPA's first run). Reports the final loss (mean of the last 50 steps), the
largest gap between smoothed curves, whether attnscope's gap to SDPA seed 0 lies within the SDPA
two-seed spread, and the median step time of each run; writes the curves to JSON and an overlaid PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

VOCAB = 256


def _require_gpu():
    try:
        import torch
    except ImportError:
        print("bench/train.py: needs torch and a CUDA GPU: pip install 'attnscope[kernels]'", file=sys.stderr)
        raise SystemExit(2) from None
    if not torch.cuda.is_available():
        print("bench/train.py: needs a CUDA GPU; none is visible", file=sys.stderr)
        raise SystemExit(2)
    return torch


def token_stream(torch, n_tokens: int, seed: int):
    """A second-order Markov byte stream: each (prev2, prev1) context has 4 possible successors with
    fixed random probabilities. Deterministic from ``seed`` (CPU generator), returned on the GPU."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, VOCAB, (VOCAB, VOCAB, 4), generator=g)
    probs = torch.softmax(2.0 * torch.randn(VOCAB, VOCAB, 4, generator=g), -1)
    choice = torch.multinomial(probs.view(-1, 4), n_tokens // (VOCAB * VOCAB) + 2, replacement=True,
                               generator=g).view(VOCAB, VOCAB, -1)
    out = torch.empty(n_tokens, dtype=torch.long)
    a, b = 0, 1
    use = torch.zeros(VOCAB, VOCAB, dtype=torch.long)
    ch, sc = choice.tolist(), succ.tolist()
    used = use.tolist()
    buf = [0] * n_tokens
    for i in range(n_tokens):
        j = used[a][b] % len(ch[a][b])
        used[a][b] += 1
        c = sc[a][b][ch[a][b][j]]
        buf[i] = c
        a, b = b, c
    out[:] = torch.tensor(buf)
    return out.cuda()


def make_model(torch, attention, layers, d_model, heads, kv_heads, seq):
    nn = torch.nn
    hd = d_model // heads

    pos = torch.arange(seq, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = pos[:, None] * inv[None, :]  # [N, hd/2]
    cos, sin = ang.cos().cuda(), ang.sin().cuda()

    def rope(x):  # x [B, H, N, hd]
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
        y = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
        return y.to(torch.bfloat16)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, (heads + 2 * kv_heads) * hd, bias=False)
            self.proj = nn.Linear(d_model, d_model, bias=False)
            self.fc, self.out = nn.Linear(d_model, 4 * d_model, bias=False), nn.Linear(4 * d_model, d_model,
                                                                                         bias=False)

        def forward(self, x):
            b, n, _ = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, n, heads + 2 * kv_heads, hd).transpose(1, 2)  # [B, H', N, hd]
            q, k, v = qkv.split((heads, kv_heads, kv_heads), dim=1)
            y = attention(rope(q), rope(k), v.to(torch.bfloat16))  # [B, H, N, hd]
            x = x + self.proj(y.transpose(1, 2).reshape(b, n, d_model))
            return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, d_model)
            nn.init.normal_(self.emb.weight, std=0.02)  # GPT-2's init: tied logits start near uniform
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d_model)

        def forward(self, idx):
            x = self.emb(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.emb.weight.T  # tied output head, [B, N, VOCAB]

    return GPT().cuda()


def train(torch, attention, seed, data, args, label, log):
    torch.manual_seed(seed)
    model = make_model(torch, attention, args.layers, args.d_model, args.heads, args.kv_heads, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(args.data_seed + 1)  # the same batches for every run
    starts = torch.randint(0, data.numel() - args.seq - 1, (args.steps, args.batch), generator=g)
    losses, times = [], []
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = starts[step].cuda()[:, None] + torch.arange(args.seq + 1, device="cuda")[None, :]
        tok = data[idx]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tok[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise SystemExit(f"{label}: loss became {losses[-1]} at step {step}")
        if step % 100 == 0 or step == args.steps - 1:
            log(f"  {label} step {step:4d} loss {losses[-1]:.4f} ({times[-1] * 1e3:.1f} ms)")
    return losses, times


def smooth(xs, w=20):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - w] if i >= w else 0.0)
        out.append(acc / min(i + 1, w))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=500, help="optimizer steps per run (default 500)")
    p.add_argument("--quick", action="store_true", help="smoke run: 60 steps, 2 layers")
    p.add_argument("--layers", type=int, default=6, help="decoder layers (default 6)")
    p.add_argument("--d-model", type=int, default=512, help="model width (default 512)")
    p.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads, GQA (default 2)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--data-seed", type=int, default=1234, help="seed of the token stream and batches")
    p.add_argument("--json", metavar="PATH", help="write curves and step times as JSON to PATH")
    p.add_argument("--plot", metavar="PATH", default="train_loss.png", help="overlaid loss curves (PNG)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.layers = 60, 2
    torch = _require_gpu()
    import attnscope

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def ours(q, k, v):
        return attnscope.flash_attention(q, k, v, causal=True)

    t_start = time.time()
    data = token_stream(torch, 2_000_000, args.data_seed)
    print(f"GPT {args.layers} layers, d_model {args.d_model}, {args.heads}/{args.kv_heads} heads, "
          f"seq {args.seq}, batch {args.batch}, {args.steps} steps; Markov byte stream of {data.numel()} "
          "tokens", flush=True)
    runs = {}
    for label, fn, seed in (("sdpa_seed0", sdpa, 0), ("sdpa_seed1", sdpa, 1), ("attnscope_seed0", ours, 0)):
        losses, times = train(torch, fn, seed, data, args, label, lambda s: print(s, flush=True))
        runs[label] = {"loss": losses, "step_s": times}

    tail = min(50, args.steps)
    final = {k: sum(r["loss"][-tail:]) / tail for k, r in runs.items()}
    sm = {k: smooth(r["loss"]) for k, r in runs.items()}
    skip = min(50, args.steps // 5)  # the first steps move fast: compare curves after warm-up
    spread_final = abs(final["sdpa_seed0"] - final["sdpa_seed1"])
    gap_final = abs(final["attnscope_seed0"] - final["sdpa_seed0"])
    spread_curve = max(abs(a - b) for a, b in zip(sm["sdpa_seed0"][skip:], sm["sdpa_seed1"][skip:],
                                                  strict=True))
    gap_curve = max(abs(a - b) for a, b in zip(sm["attnscope_seed0"][skip:], sm["sdpa_seed0"][skip:],
                                               strict=True))
    med = {k: sorted(r["step_s"][10:])[len(r["step_s"][10:]) // 2] * 1e3 for k, r in runs.items()}
    ok = gap_final <= spread_final and gap_curve <= spread_curve
    for k in runs:
        print(f"{k:16s} final loss (mean of last {tail}) {final[k]:.4f}   median step {med[k]:.1f} ms")
    print(f"final-loss gap attnscope vs SDPA seed 0: {gap_final:.4f}; "
          f"SDPA two-seed spread {spread_final:.4f}")
    print(f"largest smoothed-curve gap after step {skip}: attnscope vs SDPA seed 0 {gap_curve:.4f}; "
          f"SDPA seed 0 vs seed 1 {spread_curve:.4f}")
    print("WITHIN the SDPA run-to-run spread" if ok else "OUTSIDE the SDPA run-to-run spread")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for k, style in (("sdpa_seed0", "-"), ("sdpa_seed1", ":"), ("attnscope_seed0", "--")):
            ax.plot(sm[k], style, label=f"{k} ({med[k]:.0f} ms/step)")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats, 20-step mean)")
        ax.set_title(f"GPT {args.layers}L d{args.d_model} GQA {args.heads}/{args.kv_heads}, "
                     f"seq {args.seq}: SDPA vs attnscope")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")
    except ImportError:
        print("matplotlib missing: no plot (pip install matplotlib)", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "runs": runs, "final_loss": final, "median_step_ms": med,
                       "gap_final": gap_final, "spread_final": spread_final, "gap_curve": gap_curve,
                       "spread_curve": spread_curve, "within_spread": ok, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                       "seconds": round(time.time() - t_start, 1)}, fh)
    print(f"done in {time.time() - t_start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
