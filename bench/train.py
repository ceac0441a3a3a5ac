"""Training benchmark: a Llama-shaped decoder trained with attnscope, SDPA CUDNN or FlexAttention.

    PYTHONPATH=src python bench/train.py --setting dense  [--steps 500] [--json F] [--plot F] [--compile]
    PYTHONPATH=src python bench/train.py --setting packed [--steps 500] [--json F] [--plot F]
    PYTHONPATH=src python bench/train.py --tiny --backends attnscope --steps 2   # CPU, TRITON_INTERPRET=1
    PYTHONPATH=src python bench/train.py --grad-agreement [--agreement-steps 150] [--batch 1] [--json F]
    PYTHONPATH=src python bench/train.py --paired-steps 40 --backends attnscope,sdpa-cudnn [--json F]

Model: RMSNorm, RoPE, SwiGLU, GQA; 12 layers, hidden 2,048, 16 query heads / 4 KV heads of d = 128, MLP
5,632, vocabulary 32,768, untied embedding and LM head; bf16 autocast, AdamW (fp32 master weights).
Data: a fixed synthetic token stream, the same for every backend and seed (`token_stream`: phrases of a
seeded random phrase book drawn with Zipf weights, so the loss has structure to learn).

Settings:
- ``dense``: rows of ``--seq`` (8,192) tokens, causal attention over each row.
- ``packed``: each row of ``--seq`` tokens is filled with documents whose lengths are drawn from a
  long-tailed (log-normal) distribution; attention is causal within each document only (varlen with
  ``cu_seqlens`` for attnscope, a document block mask for Flex), RoPE positions restart at each document
  and no target crosses a document boundary.

Backends (``--backends``): ``attnscope`` (`attnscope.flash_attention` dense,
`attnscope.flash_attention_varlen(..., causal=True)` packed), ``sdpa-cudnn``, ``sdpa-flash``,
``sdpa-efficient``, ``sdpa-math`` (dense only: SDPA restricted to that backend, K/V repeated to the query
heads since cuDNN's SDPA takes no GQA) and ``flex`` (compiled FlexAttention, a causal block mask dense and a
causal document mask packed, GQA native).

Before training, each backend's attention is checked at the full size of one layer (forward output and
dQ, dK, dV on the first two heads against float64 attention, `attnscope.checks.kernel_tolerance`'s rule)
and a backend that fails is not run. Per backend and seed it reports the median step time (after
``--warmup`` steps), tokens/s, peak memory, the final loss (mean of the last 10 %), and the attention
share of a step (below). The loss curves are overlaid in one PNG.
With two or more ``--seeds`` it also prints each backend's final-loss spread over the seeds and whether
attnscope's final loss (first seed) lies within each peer's spread of that peer's first-seed loss.
``--tiny`` takes about 12 s for 2 steps on a CPU (no share there: it needs CUDA kernels).

``--grad-agreement [--agreement-steps K]`` (dense) trains nothing timed: do the backends train the same model?
On one batch, the loss and every parameter's gradient of the first seed's model with each ``--backends``
entry and with SDPA's backends as references (CUDA: CUDNN, FLASH, EFFICIENT; CPU: MATH, FLASH); per backend
the median / max over parameters of the relative L2 difference against the first reference, and the
references' spread among themselves; then K steps (150) with the first reference and the same again. PASS
when every candidate's max is within 2 x the references' spread + 1e-3 at both states, else FAIL (exit 1).

``--paired-steps K`` trains no curves either: one model per backend, the first batch, K rounds of one timed
step of each backend, the order reversed every other round, so each backend meets the same clocks (at the
power cap a series timed after another runs slower); per backend the median step, per other backend the
median of its step / the first backend's over the rounds (`paired_steps`).

Attention share (GPU), per backend, from the last step's batch and packing:
- ``share_trace``, the one to read: one profiled step through `attnscope.chrome_trace.attention_share`,
  attention kernel time / the step's kernel time (unions of intervals). Attention = the kernels launched
  inside each layer's ``attnscope::attention`` range (the forward, with the packing copies of the varlen
  wrapper), inside its ``attnscope::attention_backward`` range (the backward on autograd's thread: opened
  by `attnscope.measure.decoder.annotate_backward`, so Flex's compiled backward and the torch ops of
  attnscope's -- dK/dV zeros, the scaled LSE, the padded rows -- count), or named as fused attention
  kernels (every attnscope kernel, ``_attnscope_*``: forward, plan, Delta, dK/dV, dQ, portable and Gluon).
  Under ``--compile`` Dynamo drops both ranges and the hooks are not registered: only the names count
  (`chrome_trace.is_attention_kernel`: attnscope's, FA-2's, cuDNN's, efficient's, and any name holding the
  word attn or attention), so attnscope's backward torch ops are missed, and Flex's kernels unless Inductor
  names them after flex_attention.
  This is the Amdahl fraction of a GPU-bound step: the time attention's kernels hold the GPU.
- ``share_alone_kernels``: ``layers x`` the kernel time of one layer's attention forward + backward run
  alone (random inputs, the same shapes and packing) / the step's kernel time. It checks the trace's
  attribution: the two agree when every attention kernel of the step is found.
- ``share_timed``: ``layers x`` the CUDA-event time of that call alone / the median step time. The events
  also count the GPU's idle time inside the call, while the host prepares and launches its kernels
  (attnscope's packed backward: host checks, the plan, the padded rows' torch ops, TMA descriptors, two
  Gluon launches), which in a GPU-bound step overlaps the other layers' kernels. So it exceeds
  ``share_alone_kernels`` by the call's host-bound time, and is not the step's share when it does.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

SDPA = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",  # name -> SDPBackend member
        "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}
BACKENDS = ("attnscope", *SDPA, "flex")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=("dense", "packed"), default="dense")
    p.add_argument("--backends", default=None,
                   help="comma-separated, from " + ", ".join(BACKENDS) +
                   " (default: attnscope,sdpa-cudnn,flex dense; attnscope,flex packed)")
    p.add_argument("--seeds", default="0", help="model seeds, comma-separated (the data is the same)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the step time")
    p.add_argument("--batch", type=int, default=2, help="rows per step")
    p.add_argument("--seq", type=int, default=8192, help="tokens per row")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--mlp", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--data-seed", type=int, default=1234)
    p.add_argument("--compile", action="store_true",
                   help="torch.compile(fullgraph=True) the step's forward and loss "
                   "(AOTAutograd compiles their backward)")
    p.add_argument("--no-check", action="store_true", help="skip the float64 check before training")
    p.add_argument("--tiny", action="store_true",
                   help="2 layers, hidden 64, 2 heads / 1 KV head of d 64, seq 128, vocab 256, batch 1: "
                   "runs on a CPU under TRITON_INTERPRET=1")
    p.add_argument("--grad-agreement", action="store_true",
                   help="no timed training: the loss and every parameter's gradient on one batch with each "
                   "--backends entry against the SDPA references (CUDA: cudnn, flash, efficient; CPU: math, "
                   "flash), at init and after --agreement-steps steps; PASS or FAIL (exit 1)")
    p.add_argument("--agreement-steps", type=int, default=150, metavar="K",
                   help="--grad-agreement: AdamW steps with the first reference before the second comparison")
    p.add_argument("--paired-steps", type=int, default=0, metavar="K",
                   help="no training curves: K rounds of one timed step of each --backends entry on one "
                   "batch, interleaved; the median of each backend's step / the first's")
    p.add_argument("--json", metavar="PATH", help="write the runs (curves included) as JSON")
    p.add_argument("--plot", metavar="PATH", help="overlaid loss curves (PNG)")
    p.add_argument("--markdown", action="store_true", help="print the summary as a Markdown table")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.heads, args.kv_heads, args.head_dim = 2, 64, 2, 1, 64
        args.mlp, args.seq, args.vocab, args.batch = 128, 128, 256, 1
        args.warmup = min(args.warmup, max(0, args.steps - 1))
    args.backends = (args.backends or ("attnscope,sdpa-cudnn,flex" if args.setting == "dense"
                                       else "attnscope,flex")).split(",")
    for b in args.backends:
        if b not in BACKENDS:
            p.error(f"--backends: expected names from {', '.join(BACKENDS)}, got {b!r}")
    if args.setting == "packed" and any(b in SDPA for b in args.backends):
        p.error("--backends: SDPA has no document mask here; packed runs attnscope and flex")
    if args.grad_agreement and args.setting == "packed":
        p.error("--grad-agreement: expected --setting dense (its SDPA references have no document mask)")
    if args.paired_steps < 0 or (args.paired_steps and (len(args.backends) < 2 or args.grad_agreement)):
        p.error(f"--paired-steps: expected a positive K with two or more --backends and no --grad-agreement, "
                f"got {args.paired_steps} with {','.join(args.backends)}")
    if args.agreement_steps < 0:
        p.error(f"--agreement-steps: expected a non-negative integer, got {args.agreement_steps}")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    for name in ("steps", "batch", "seq", "layers", "hidden", "heads", "kv_heads", "head_dim", "mlp",
                 "vocab"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if args.heads % args.kv_heads:
        p.error(f"--kv-heads: expected a divisor of --heads ({args.heads}), got {args.kv_heads}")
    if args.warmup >= args.steps:
        p.error(f"--warmup: expected fewer than --steps ({args.steps}), got {args.warmup}")
    return args


# --- data (seeded, identical for every backend) ----------------------------------------------------
def token_stream(torch, n_tokens: int, vocab: int, seed: int):
    """[n_tokens] int64: phrases of a seeded phrase book (1,024 phrases of 3-12 tokens) drawn with Zipf
    weights and concatenated. Deterministic from ``seed`` (CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    n_phr = 1024
    lens = torch.randint(3, 13, (n_phr,), generator=g)
    book = torch.randint(0, vocab, (n_phr, 12), generator=g)
    zipf = 1.0 / torch.arange(1, n_phr + 1, dtype=torch.float64)
    draws = torch.multinomial(zipf, n_tokens // 3 + 1, replacement=True, generator=g)
    dl = lens[draws]
    keep = int(torch.searchsorted(dl.cumsum(0), torch.tensor(n_tokens)).item()) + 1
    draws, dl = draws[:keep], dl[:keep]
    mask = torch.arange(12)[None, :] < dl[:, None]
    return book[draws][mask][:n_tokens].clone()


def document_lengths(torch, rows: int, seq: int, seed: int, step: int):
    """Per row, document lengths summing to ``seq``: log-normal (median seq / 16, i.e. 512 for 8k rows;
    sigma 1.2), clipped to [16, seq]; the last document of a row is cut to fit. Deterministic from
    (seed, step)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    out = []
    for _ in range(rows):
        left, row = seq, []
        while left > 0:
            n = int(math.exp(math.log(seq / 16) + 1.2 * float(torch.randn((), generator=g))))
            n = min(max(n, 16), left)
            row.append(n)
            left -= n
        out.append(row)
    return out


def batches(torch, args):
    """Yields (tokens [B, S + 1] int64, doc lengths or None) for every step; the same for every run."""
    per = args.batch * (args.seq + 1)
    stream = token_stream(torch, per * args.steps, args.vocab, args.data_seed)
    for i in range(args.steps):
        toks = stream[i * per:(i + 1) * per].view(args.batch, args.seq + 1)
        packed = args.setting == "packed"
        docs = document_lengths(torch, args.batch, args.seq, args.data_seed, i) if packed else None
        yield toks, docs


def packing(torch, docs, seq, device):
    """For packed rows: cu_seqlens int32 [n_docs + 1] over the flattened batch, RoPE positions [B, S],
    a target mask [B, S] (False at each document's last token), document ids [B * S], the longest doc."""
    lens = [n for row in docs for n in row]
    cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    pos = torch.cat([torch.arange(n) for n in lens]).view(len(docs), seq)
    last = torch.zeros(len(docs) * seq, dtype=torch.bool)
    last[cu[1:].long() - 1] = True
    doc_id = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    return (cu.to(device), pos.to(device), (~last).view(len(docs), seq).to(device), doc_id.to(device),
            max(lens))


# --- attention backends ------------------------------------------------------------------------------
def attention_fn(torch, backend: str, setting: str, args):
    """``attn(q, k, v, ctx) -> o`` with q [B, Hq, S, d], k/v [B, Hkv, S, d]; ``ctx`` carries the packing."""
    import attnscope

    if backend == "attnscope" and setting == "dense":
        return lambda q, k, v, ctx: attnscope.flash_attention(q, k, v, causal=True)
    if backend == "attnscope":
        def varlen(q, k, v, ctx):
            B, H, S, d = q.shape
            flat = [t.transpose(1, 2).reshape(B * S, t.shape[1], d) for t in (q, k, v)]
            o = attnscope.flash_attention_varlen(*flat, ctx["cu"], ctx["cu"], ctx["max_len"], ctx["max_len"],
                                                 causal=True)
            return o.view(B, S, H, d).transpose(1, 2)
        return varlen
    if backend in SDPA:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        only = getattr(SDPBackend, SDPA[backend])

        def sdpa_fn(q, k, v, ctx):
            g = q.shape[1] // k.shape[1]
            k, v = (t.repeat_interleave(g, dim=1) for t in (k, v))  # cuDNN's SDPA takes no GQA
            with sdpa_kernel(only):
                return sdpa(q, k, v, is_causal=True)
        return sdpa_fn
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)

    def flex_fn(q, k, v, ctx):
        if setting == "dense":
            return flex(q, k, v, block_mask=ctx["block_mask"], enable_gqa=True)
        B, H, S, d = q.shape
        flat = [t.transpose(0, 1).reshape(1, t.shape[1], B * S, d) for t in (q, k, v)]  # one long sequence
        o = flex(*flat, block_mask=ctx["block_mask"], enable_gqa=True)
        return o.view(H, B, S, d).transpose(0, 1)
    return flex_fn


def flex_masker(torch, setting, B, S, device):
    """``mask(ctx) -> BlockMask`` for Flex: dense, one causal mask built once; packed, a causal document mask
    over the flattened batch rebuilt per step from ``ctx["doc_id"]``, through one mask function reading a
    persistent buffer (the same function object every step, so compiled code is reused)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if setting == "dense":
        bm = create_block_mask(lambda b, h, q, k: k <= q, None, None, S, S, device=device)
        return lambda ctx: bm
    doc = torch.zeros(B * S, dtype=torch.long, device=device)

    def same_doc_causal(b, h, q, k):
        return (doc[q] == doc[k]) & (k <= q)

    def mask(ctx):
        doc.copy_(ctx["doc_id"])
        return create_block_mask(same_doc_causal, None, None, B * S, B * S, device=device)
    return mask


# --- the model ---------------------------------------------------------------------------------------
def build_model(torch, args, seed: int, device):
    """Parameters (fp32) of the Llama-shaped decoder, drawn from ``seed``, and its forward."""
    import torch.nn.functional as F

    from attnscope.measure.decoder import ANNOTATION, annotate_backward

    g = torch.Generator().manual_seed(seed)
    h, hd, hq, hkv, m = args.hidden, args.head_dim, args.heads, args.kv_heads, args.mlp

    def w(*dims, std=None):
        return torch.nn.Parameter((torch.randn(*dims, generator=g) * (std or dims[-1] ** -0.5)).to(device))

    params = {"emb": w(args.vocab, h, std=0.02), "head": w(args.vocab, h), "norm": torch.nn.Parameter(
        torch.ones(h, device=device))}
    for i in range(args.layers):
        params.update({f"{i}.wqkv": w((hq + 2 * hkv) * hd, h),
                       f"{i}.wo": w(h, hq * hd, std=(2 * args.layers * hq * hd) ** -0.5),
                       f"{i}.w13": w(2 * m, h), f"{i}.w2": w(h, m, std=(2 * args.layers * m) ** -0.5),
                       f"{i}.n1": torch.nn.Parameter(torch.ones(h, device=device)),
                       f"{i}.n2": torch.nn.Parameter(torch.ones(h, device=device))})

    def rms(x, wt):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * wt.to(x.dtype)

    def rope(x, cos, sin):  # x [B, H, S, d]; cos/sin [B, 1, S, d/2]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(tokens, pos, attn, ctx):
        """tokens [B, S] int64, pos [B, S] -> logits [B, S, vocab] (autocast dtype)."""
        B, S = tokens.shape
        inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, device=device).float() / hd)
        ang = (pos.float()[..., None] * inv)[:, None]  # [B, 1, S, d/2]
        on = torch.is_autocast_enabled(device.type)
        dt = torch.get_autocast_dtype(device.type) if on else torch.float32
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)
        x = params["emb"][tokens]
        for i in range(args.layers):
            qkv = F.linear(rms(x, params[f"{i}.n1"]), params[f"{i}.wqkv"]).to(dt)
            q, k, v = qkv.view(B, S, hq + 2 * hkv, hd).transpose(1, 2).split((hq, hkv, hkv), dim=1)
            q, k = rope(q, cos, sin).to(dt), rope(k, cos, sin).to(dt)
            v = v.contiguous()
            with torch.profiler.record_function(ANNOTATION):
                o = attn(q, k, v, ctx)  # [B, Hq, S, d]
            if o.requires_grad and not torch.compiler.is_compiling():  # compiled: no hooks, no ranges
                annotate_backward(q, k, v, o)
            x = x + F.linear(o.transpose(1, 2).reshape(B, S, hq * hd), params[f"{i}.wo"])
            gate, up = F.linear(rms(x, params[f"{i}.n2"]), params[f"{i}.w13"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, params[f"{i}.w2"])
        return F.linear(rms(x, params["norm"]), params["head"])

    return params, forward


# --- correctness at full size ------------------------------------------------------------------------
def check(torch, backend, args, device, dt, ctx_for):
    """One layer's attention at the full shape (forward output, dQ, dK, dV) against float64 attention on
    batch row 0, KV head 0 and its query heads; the bound is `checks.kernel_tolerance` of PyTorch's own
    error at ``dt`` (math attention in ``dt``). Returns (ok, worst error / bound)."""
    from attnscope import checks

    B, S, hq, hkv, d = args.batch, args.seq, args.heads, args.kv_heads, args.head_dim
    g = torch.Generator(device=device).manual_seed(7)
    q = torch.randn(B, hq, S, d, generator=g, device=device).to(dt).requires_grad_()
    k, v = (torch.randn(B, hkv, S, d, generator=g, device=device).to(dt).requires_grad_() for _ in range(2))
    do = torch.randn(B, hq, S, d, generator=g, device=device).to(dt)
    ctx = ctx_for(B, S)
    o = attention_fn(torch, backend, args.setting, args)(q, k, v, ctx)
    if o.grad_fn is None:  # a forward without a backward would drop the gradients silently
        print(f"check {backend}: its output has no grad_fn (no backward)")
        return False, math.inf
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    grp = hq // hkv
    allowed = torch.ones(S, S, dtype=torch.bool, device=device).tril()
    if args.setting == "packed":
        doc = ctx["doc_id"][:S]
        allowed = allowed & (doc[:, None] == doc[None, :])
    inputs = [t.detach()[:1, :n] for t, n in ((q, grp), (k, 1), (v, 1))]  # [1, grp | 1, S, d]
    results = []
    for cast in (torch.float64, dt):  # float64, then PyTorch's own math at the input dtype
        qr, kr, vr = (t.to(cast).requires_grad_() for t in inputs)
        s = (qr @ kr.transpose(-1, -2)) * d ** -0.5  # K/V broadcast over the group: dK, dV sum over it
        pr = torch.softmax(s.masked_fill(~allowed, float("-inf")).to(torch.float64 if cast == torch.float64
                                                                          else torch.float32), -1).to(cast)
        ref = pr @ vr
        results.append((ref.detach(), *torch.autograd.grad(ref, (qr, kr, vr), do[:1, :grp].to(cast))))
        del s, pr, ref
    exact, lowp = results
    mine = (o[:1, :grp], dq[:1, :grp], dk[:1, :1], dv[:1, :1])
    worst = 0.0
    for i, (m, ex, lo) in enumerate(zip(mine, exact, lowp, strict=True)):
        torch_err = (lo.double() - ex).abs().max().item()
        bound = checks.kernel_tolerance(torch_err, checks.GRAD_FACTOR if i else 2.0)
        worst = max(worst, (m.double() - ex).abs().max().item() / bound)
    return worst <= 1.0, worst


# --- one run -----------------------------------------------------------------------------------------
def optimizer(torch, params, args, device):
    """AdamW on the fp32 parameters (fused on CUDA)."""
    return torch.optim.AdamW(params.values(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=device.type == "cuda")


def make_loss(torch, forward, attn, device):
    """``loss_of(tokens [B, S + 1], pos [B, S], tmask [B, S] or None, ctx)``: the mean next-token
    cross-entropy under bf16 autocast; ``tmask`` False drops a target (packed: each document's last token)."""
    def loss_of(tokens, pos, tmask, ctx):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = forward(tokens[:, :-1], pos, attn, ctx)
        target = tokens[:, 1:] if tmask is None else tokens[:, 1:].masked_fill(~tmask, -100)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten(),
                                                 ignore_index=-100)
    return loss_of


def trainer(torch, backend, seed, args, device):
    """The model of ``seed`` with ``backend``'s attention, its AdamW, and ``step(tokens, pos, tmask, ctx)``
    (forward, loss, backward, optimizer step; returns the loss); also the parameters, the loss function,
    the attention and Flex's block-mask maker (None for the others)."""
    params, forward = build_model(torch, args, seed, device)
    opt = optimizer(torch, params, args, device)
    attn = attention_fn(torch, backend, args.setting, args)
    loss_of = make_loss(torch, forward, attn, device)

    # --compile: the forward and the loss in one graph (fullgraph: a graph break is an error); AOTAutograd
    # compiles their backward; the optimizer step stays eager
    fwd_loss = torch.compile(loss_of, fullgraph=True) if args.compile else loss_of

    def step(tokens, pos, tmask, ctx):
        loss = fwd_loss(tokens, pos, tmask, ctx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    masker = flex_masker(torch, args.setting, args.batch, args.seq, device) if backend == "flex" else None
    return params, opt, step, loss_of, attn, masker


def step_inputs(torch, args, device, toks, docs, masker):
    """One batch's (tokens, positions, target mask, ctx) on the device: the packing of its documents
    (packed), Flex's block mask when ``masker``."""
    toks, ctx = toks.to(device), {}
    if docs is not None:
        cu, pos, tmask, doc_id, max_len = packing(torch, docs, args.seq, device)
        ctx = {"cu": cu, "max_len": max_len, "doc_id": doc_id}
    else:
        pos = torch.arange(args.seq, device=device).expand(args.batch, -1)
        tmask = None
    if masker is not None:
        ctx["block_mask"] = masker(ctx)
    return toks, pos, tmask, ctx


def paired_steps(torch, args, device) -> dict:
    """``--paired-steps K``: one model per backend (the first seed), the first batch, then K rounds of one
    timed step of each backend, the order reversed every other round (a GPU at its power cap slows the
    later of two series timed one after the other). Per backend the median step ms; per other backend
    the median over rounds of (its step / the first backend's step) and their range."""
    toks, docs = next(iter(batches(torch, args)))
    steps = {}
    for backend in args.backends:
        _, _, step, _, _, masker = trainer(torch, backend, args.seeds[0], args, device)
        inputs = step_inputs(torch, args, device, toks, docs, masker)
        steps[backend] = (step, inputs)
        for _ in range(args.warmup):
            step(*inputs)
    times = {b: [] for b in steps}
    order = list(steps)
    for k in range(args.paired_steps):
        for b in order if k % 2 == 0 else order[::-1]:
            step, inputs = steps[b]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[b].append(1e3 * (time.perf_counter() - t0))
    first = order[0]
    res = {"step_ms": {b: statistics.median(t) for b, t in times.items()}, "times_ms": times, "ratios": {}}
    for b in order[1:]:
        r = [x / y for x, y in zip(times[b], times[first], strict=True)]
        res["ratios"][b] = {"median": statistics.median(r), "min": min(r), "max": max(r)}
        print(f"paired: {b} step / {first} step, median of {len(r)} rounds {statistics.median(r):.3f} "
              f"(range {min(r):.3f}-{max(r):.3f}); medians {res['step_ms'][b]:.1f} / "
              f"{res['step_ms'][first]:.1f} ms")
    return res


def run(torch, backend, seed, args, device):
    params, opt, step, loss_of, attn, masker = trainer(torch, backend, seed, args, device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    losses, times, grads_seen = [], [], False
    for i, (toks, docs) in enumerate(batches(torch, args)):
        toks, pos, tmask, ctx = step_inputs(torch, args, device, toks, docs, masker)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if i == 0:  # the first step eagerly, to see the gradients reach every parameter
            loss = loss_of(toks, pos, tmask, ctx)
            loss.backward()
            grads_seen = all(p.grad is not None and bool(torch.isfinite(p.grad).all()) and
                             bool(p.grad.abs().sum() > 0) for p in params.values())
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss = loss.detach()
        else:
            loss = step(toks, pos, tmask, ctx)
        losses.append(float(loss))
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    out = {"backend": backend, "seed": seed, "losses": losses, "grads_seen": grads_seen,
           "step_ms": 1e3 * sorted(times[args.warmup:])[len(times[args.warmup:]) // 2],
           "tokens_per_step": args.batch * args.seq}
    out["tokens_per_s"] = out["tokens_per_step"] / (out["step_ms"] / 1e3)
    tail = losses[-max(1, len(losses) // 10):]
    out["final_loss"] = sum(tail) / len(tail)
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out.update(attention_share(torch, step, attn, args, device, ctx, toks, pos, tmask, out["step_ms"]))
    return out


def attention_share(torch, step, attn, args, device, ctx, toks, pos, tmask, step_ms):
    """The attention share of a step, two ways (module docstring): ``share_trace`` from one profiled step
    (chrome_trace's rule: attention kernel time / the step's kernel time) and ``share_timed`` = layers x one
    layer's attention forward + backward timed alone (CUDA events) / the median step time. Beside them, the
    same standalone call's kernel time (``attention_kernel_ms``: layers x the union of its kernels, one
    profiled call) and its share of the step's kernel time (``share_alone_kernels``): it agrees with
    ``share_trace`` when the trace finds every attention kernel; ``share_timed`` exceeds it by the time the
    GPU idles inside the standalone call (waiting for the host's launches), which a GPU-bound step hides.
    ``alone_unnamed_ms``: that call's kernels that are attention by range only, not by name;
    ``attention_host_ms``: layers x the host's time to issue that call (near ``attention_ms`` when the call
    is host-bound, or when it waits for the GPU inside)."""
    from attnscope import chrome_trace
    from attnscope.measure.backends import profile_trace
    from attnscope.measure.share import cuda_time_ms

    res = {}
    try:
        trace = profile_trace(lambda: step(toks, pos, tmask, ctx), "attnscope::step")
        s = chrome_trace.attention_share(trace)
        res.update(share_trace=s.share, attention_ms_trace=s.attention_ms, busy_ms_trace=s.busy_ms,
                   span_ms_trace=s.span_ms, trace_longest=[list(x) for x in s.longest])
    except Exception as e:  # a trace without recognisable attention kernels: say so, keep the run
        res["share_trace"] = None
        res["share_trace_error"] = str(e).splitlines()[0]
    B, S, d = args.batch, args.seq, args.head_dim
    q = torch.randn(B, args.heads, S, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, args.kv_heads, S, d, device=device, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    do = torch.randn_like(q)

    def alone():
        return torch.autograd.grad(attn(q, k, v, ctx), (q, k, v), do)
    ms = cuda_time_ms(alone)
    res["attention_ms"] = args.layers * ms
    host = []  # the host's time to issue the call from an idle, synchronised start (no sync inside it)
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        alone()
        host.append(1e3 * (time.perf_counter() - t0))
    torch.cuda.synchronize()
    res["attention_host_ms"] = args.layers * sorted(host)[len(host) // 2]
    res["share_timed"] = args.layers * ms / step_ms
    try:  # every kernel of the call counts: no prefill range, so attention_share's busy time is all of them
        trace = profile_trace(alone, "attnscope::attention")
        one = chrome_trace.attention_share(trace)
        res["attention_kernel_ms"] = args.layers * one.busy_ms
        unnamed = {}  # kernels of the call that only a range makes attention (lost under --compile)
        for kern in chrome_trace.kernels(trace):
            if not chrome_trace.is_attention_kernel(kern.name):
                unnamed[kern.name] = unnamed.get(kern.name, 0.0) + kern.dur_us / 1e3
        res["alone_unnamed_ms"] = sorted(([n[:160], t] for n, t in unnamed.items()), key=lambda x: -x[1])
        if res.get("busy_ms_trace"):
            res["share_alone_kernels"] = args.layers * one.busy_ms / res["busy_ms_trace"]
    except Exception as e:
        res["attention_kernel_error"] = str(e).splitlines()[0]
    return res


# --- gradient agreement ------------------------------------------------------------------------------
REFERENCES = {"cuda": ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient"), "cpu": ("sdpa-math", "sdpa-flash")}
AGREEMENT_FLOOR = 1e-3  # relative L2 added to the bound: references that agree to the bit still allow this


def rel_l2(torch, g, ref) -> float:
    """||g - ref|| / ||ref|| in float64; NaN (a non-finite gradient, or two zero ones) counts as infinite."""
    r = (torch.linalg.vector_norm((g - ref).double()) / torch.linalg.vector_norm(ref.double())).item()
    return r if r == r else math.inf


def grad_agreement(torch, args, device) -> dict:
    """Does each candidate (``--backends``, dense) give the model the same gradients as SDPA's backends?

    On the first seed's model and one batch: the loss and every parameter's gradient with each reference
    (`REFERENCES`, the first is the one compared against) and each candidate. Per backend: the median and max
    over parameters of the relative L2 gradient difference against the first reference; the references'
    spread: the max over their pairs. Done at init and again after ``--agreement-steps`` AdamW steps with the
    first reference (on the next batch). PASS when, at both states, every candidate's max is at most
    2 x the spread + `AGREEMENT_FLOOR` (the kernel checker's 2 x PyTorch's own error + a floor, applied
    to the whole model's gradients)."""
    refs = REFERENCES[device.type]
    cands = [b for b in args.backends if b not in refs]
    params, forward = build_model(torch, args, args.seeds[0], device)
    names = list(params)
    pos = torch.arange(args.seq, device=device).expand(args.batch, -1)
    ctx = {"block_mask": flex_masker(torch, "dense", args.batch, args.seq, device)({})} if "flex" in cands \
        else {}
    loss_fns = {b: make_loss(torch, forward, attention_fn(torch, b, "dense", args), device)
                for b in (*refs, *cands)}
    k = args.agreement_steps
    stream = [t for t, _ in batches(torch, argparse.Namespace(**{**vars(args), "steps": k + 1}))]

    def gradients(loss_of, toks):
        for p in params.values():
            p.grad = None
        loss = loss_of(toks, pos, None, ctx)
        loss.backward()
        out = [params[n].grad.detach().clone() for n in names]
        for p in params.values():
            p.grad = None
        return loss.item(), out

    def compare(step):
        toks = stream[step].to(device)
        res = {b: gradients(f, toks) for b, f in loss_fns.items()}
        ref = res[refs[0]][1]
        print(f"[step {step}] {refs[0]:15s} loss {res[refs[0]][0]:.5f} (the reference)")
        rows = {}
        for b, (loss, g) in list(res.items())[1:]:
            d = [rel_l2(torch, x, r) for x, r in zip(g, ref, strict=True)]
            worst = max(range(len(d)), key=d.__getitem__)
            rows[b] = {"median": sorted(d)[len(d) // 2], "max": d[worst], "worst": names[worst]}
            print(f"[step {step}] {b:15s} loss {loss:.5f}; gradients vs {refs[0]}: relative L2 median "
                  f"{rows[b]['median']:.4f} max {d[worst]:.4f} ({names[worst]})")
        spread = max((max(rel_l2(torch, x, r) for x, r in zip(res[a][1], res[b][1], strict=True))
                      for i, a in enumerate(refs) for b in refs[i + 1:]), default=0.0)
        bound = 2 * spread + AGREEMENT_FLOOR
        ok = all(rows[b]["max"] <= bound for b in cands)
        verdicts = (f"{b} {rows[b]['max']:.4f} {'ok' if rows[b]['max'] <= bound else 'OUTSIDE'}"
                    for b in cands)
        print(f"[step {step}] references' spread (max over pairs) {spread:.4f}; bound 2 x spread + "
              f"{AGREEMENT_FLOOR:g} = {bound:.4f}: " + ", ".join(verdicts))
        return {"step": step, "loss": {b: r[0] for b, r in res.items()}, "vs_reference": rows,
                "reference_spread": spread, "bound": bound, "pass": ok}

    phases = [compare(0)]
    if k:
        opt, train_loss = optimizer(torch, params, args, device), loss_fns[refs[0]]
        t0 = time.perf_counter()
        for i, toks in enumerate(stream[:-1]):
            loss = train_loss(toks.to(device), pos, None, ctx)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i == 0 or (i + 1) % 50 == 0 or i + 1 == k:
                print(f"  training with {refs[0]}: step {i + 1}/{k} loss {loss.item():.4f} "
                      f"({time.perf_counter() - t0:.0f} s)")
        phases.append(compare(k))
    ok = all(ph["pass"] for ph in phases)
    print(f"grad agreement: {'PASS' if ok else 'FAIL'} ({', '.join(cands)} against {', '.join(refs)})")
    return {"references": list(refs), "candidates": cands, "floor": AGREEMENT_FLOOR, "phases": phases,
            "pass": ok}


# --- reporting ---------------------------------------------------------------------------------------
COLUMNS = ("setting", "backend", "seed", "step ms", "tokens/s", "peak GiB",
           "attention share (trace / alone kernels / timed)",
           "final loss", "/ first backend's step time")


def rows(runs, setting):
    base = runs[0]["step_ms"]
    out = []
    for r in runs:
        tr, ak, tm = (f"{r[k]:.2f}" if r.get(k) is not None else "n/a"
                      for k in ("share_trace", "share_alone_kernels", "share_timed"))
        out.append((setting, r["backend"], str(r["seed"]), f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:,.0f}",
                    f"{r['peak_gib']:.1f}" if "peak_gib" in r else "n/a", f"{tr} / {ak} / {tm}",
                    f"{r['final_loss']:.3f}", f"{r['step_ms'] / base:.3f}"))
    return out


def share_lines(r, layers: int) -> list[str]:
    """The attention share of one run in ms and as the three shares (`attention_share`'s keys; none on a
    CPU), then the standalone call's kernels that are attention by range only."""
    if "share_timed" not in r:
        return []

    def f(key, fmt=".1f"):
        return "n/a" if r.get(key) is None else format(r[key], fmt)
    out = [f"  attention share: trace {f('share_trace', '.3f')} ({f('attention_ms_trace')} of "
           f"{f('busy_ms_trace')} ms kernel time in the step, span {f('span_ms_trace')} ms) | alone kernels "
           f"{f('share_alone_kernels', '.3f')} ({layers} layers x one call: {f('attention_kernel_ms')} ms "
           f"kernel time) | timed {f('share_timed', '.3f')} ({f('attention_ms')} ms CUDA-event time of "
           f"the {layers} calls, {f('attention_host_ms')} ms host time to issue them)"]
    if r.get("share_trace_error") or r.get("attention_kernel_error"):
        out.append(f"  share errors: {r.get('share_trace_error')} | {r.get('attention_kernel_error')}")
    unnamed = r.get("alone_unnamed_ms", [])
    longest = [(n[:60], round(t, 4)) for n, t in unnamed[:3]]
    out.append(f"  one call's kernels that are attention by range only (not by name): {len(unnamed)} names, "
               f"{sum(t for _, t in unnamed):.3f} ms; longest {longest}")
    return out


def loss_spread(runs) -> list[str]:
    """Per backend with several seeds: the final-loss spread; attnscope's gap to each such peer within it?"""
    by = {}
    for r in runs:
        by.setdefault(r["backend"], []).append(r["final_loss"])
    out = []
    for b, losses in by.items():
        if len(losses) > 1:
            spread = max(losses) - min(losses)
            out.append(f"{b}: final loss over {len(losses)} seeds {min(losses):.3f}-{max(losses):.3f} "
                       f"(spread {spread:.3f})")
            if b != "attnscope" and "attnscope" in by:
                gap = abs(by["attnscope"][0] - losses[0])
                out.append(f"attnscope vs {b} (first seeds): gap {gap:.3f}, "
                           f"{'within' if gap <= spread else 'outside'} {b}'s seed spread")
    return out


def smooth(xs, w=20):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= w:
            acc -= xs[i - w]
        out.append(acc / min(i + 1, w))
    return out


def plot(runs, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (pip install matplotlib)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        ax.plot(smooth(r["losses"]), label=f"{r['backend']} seed {r['seed']} ({r['step_ms']:.0f} ms/step)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (20-step mean)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        print("bench/train.py: needs a CUDA GPU (or --tiny on a CPU under TRITON_INTERPRET=1)",
              file=sys.stderr)
        return 2
    if device.type == "cpu" and not set(args.backends) <= {"attnscope", *REFERENCES["cpu"]}:
        print(f"bench/train.py: on a CPU only --backends attnscope, {', '.join(REFERENCES['cpu'])} run, got "
              f"{','.join(args.backends)}", file=sys.stderr)
        return 2
    env = {"torch": torch.__version__,
           "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"{env['device']}, torch {env['torch']}, {args.setting}, {args.layers} layers, "
          f"hidden {args.hidden}, "
          f"{args.heads}/{args.kv_heads} heads of {args.head_dim}, {args.batch} x {args.seq} tokens, "
          + (f"gradient agreement at init{f' and step {args.agreement_steps}' * bool(args.agreement_steps)}"
             if args.grad_agreement else f"{args.steps} steps"))
    if args.grad_agreement:
        if not set(args.backends) - set(REFERENCES[device.type]):
            print(f"bench/train.py: --grad-agreement: expected a backend besides the references "
                  f"{', '.join(REFERENCES[device.type])}, got {','.join(args.backends)}", file=sys.stderr)
            return 2
        res = grad_agreement(torch, args, device)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"env": env, "args": vars(args), "grad_agreement": res}, f, indent=1)
        return 0 if res["pass"] else 1

    if args.paired_steps:
        res = paired_steps(torch, args, device)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"env": env, "args": vars(args), "paired": res}, f, indent=1)
        return 0

    def ctx_for(B, S):  # the packing of step 0, for the check
        toks, docs = next(iter(batches(torch, args)))
        if docs is None:
            return {"block_mask": None}
        cu, _, _, doc_id, max_len = packing(torch, docs, S, device)
        return {"cu": cu, "max_len": max_len, "doc_id": doc_id}

    runs, failed = [], {}
    for backend in args.backends:
        if not args.no_check:
            def ctx_b(B, S, backend=backend):
                ctx = ctx_for(B, S)
                if backend == "flex":
                    ctx["block_mask"] = flex_masker(torch, args.setting, B, S, device)(ctx)
                return ctx
            ok, ratio = check(torch, backend, args, device, torch.bfloat16, ctx_b)
            print(f"check {backend}: max error / bound {ratio:.3f} ({'ok' if ok else 'FAILED: not run'})")
            if not ok:
                failed[backend] = ratio
                continue
        for seed in args.seeds:
            r = run(torch, backend, seed, args, device)
            runs.append(r)
            print(f"{backend} seed {seed}: loss {r['losses'][0]:.3f} -> {r['final_loss']:.3f}, "
                  f"{r['step_ms']:.1f} ms/step, grads on every parameter: {r['grads_seen']}")
            for line in share_lines(r, args.layers):
                print(line)
    if runs:
        table = rows(runs, args.setting)
        if args.markdown:
            print("| " + " | ".join(COLUMNS) + " |")
            print("|" + " --- |" * len(COLUMNS))
            for row in table:
                print("| " + " | ".join(row) + " |")
        else:
            for row in table:
                print("  ".join(f"{c}={v}" for c, v in zip(COLUMNS, row, strict=True)))
        for line in loss_spread(runs):
            print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "args": {k: v for k, v in vars(args).items()}, "runs": runs,
                       "failed_check": failed}, f, indent=1)
    if args.plot and runs:
        plot(runs, args.plot,
             f"{args.setting}: {args.layers} layers, hidden {args.hidden}, {args.seq} tokens/row")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
