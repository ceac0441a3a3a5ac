"""Time candidate block configurations of the prefill or decode kernel (the tables bypassed), beside SDPA.

    PYTHONPATH=src python bench/tune.py prefill [--d 128] [--n 4096 --n 16384] [--causal 0 --causal 1]
        [--bm 128] [--bn 64 --bn 128] [--warps 4 --warps 8] [--stages 2 --stages 3] [--window L,R]
        [--out FILE.json]
    PYTHONPATH=src python bench/tune.py backward [--d 256] [--n 4096] [--causal 0 --causal 1]
        [--dkdv BM,BN,WARPS,STAGES ...] [--dq BM,BN,WARPS,STAGES ...] [--out FILE.json]
    PYTHONPATH=src python bench/tune.py decode [--out FILE.json]

``prefill``: for the rows of kernels/fwd.py's ``CONFIG_TABLE`` (the portable kernel). bf16, H = 32,
B * N = ``--tokens``; each config is checked against float64 attention (heads 0-1 of batch 0, the last
1,024 query rows; `attnscope.checks.kernel_tolerance` of SDPA FLASH's own error) and only then timed
(median of ``triton.testing.do_bench``); SDPA FLASH and CUDNN on the same tensors. About 1 minute per
(d, causal, N) with the default 12 configs on an H200. ``--window L,R``: a sliding window on every call
(the sweep behind kernels/fwd.py ``WINDOW_CONFIGS``, first run as a probe); the error bound is then
PyTorch's own error with the window (`checks.torch_attention`), no SDPA peer (it has no window), and
TFLOP/s count the visible query-key pairs.

``backward``: for kernels/bwd.py's ``DKDV_CONFIGS`` and ``DQ_CONFIGS`` (the portable backward, dQ in its
own pass: the default mode). bf16, H = ``--heads``, B * N = ``--tokens``. The dK/dV candidates
run with the table's dQ config, then the dQ candidates with the fastest dK/dV one; each is checked against
float64 gradients (head 0 of batch 0; 3 x SDPA FLASH's own error + 1e-3, as bench/backward.py) and only then
timed (the backward call alone, median); SDPA FLASH and CUDNN's backward (a retained graph) beside it.

``decode``: for the decode kernel's block configs and split heuristic. bf16, d = 128, the issue's
(B, Hq, Hkv) x L grid (`attnscope.measure.bench.DECODE_GRID` / ``DECODE_LS``); at each point the default
plan's output and each (BLOCK_N, warps, stages) x split count's (a plan from `decode.plan._tuned_plan`,
timed as ``plan.run``) are checked against float64 (batch 0), then timed beside SDPA CUDNN (and the
one-liner, ``auto``); effective TB/s = K and V bytes / time. About 10 minutes on an H200.
"""

import argparse
import itertools
import json
import math
import sys
import time

DECODE_CONFIGS = [(64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 4, 4), (256, 8, 2), (256, 8, 3), (64, 4, 3),
                  (32, 4, 4)]
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)


#: default candidates of ``backward`` per head dim: (BLOCK_M query rows, BLOCK_N keys, warps, stages)
BWD_DKDV = {64: [(32, 128, 8, 2), (64, 128, 8, 2), (32, 64, 4, 2), (64, 64, 4, 2)],
            128: [(32, 128, 8, 2), (64, 128, 8, 2), (32, 64, 4, 2), (64, 64, 8, 2)],
            256: [(64, 64, 8, 2), (64, 64, 8, 1), (16, 64, 8, 2), (32, 64, 8, 2), (128, 64, 8, 1),
                  (128, 32, 8, 1), (32, 128, 8, 1), (32, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 1)]}
BWD_DQ = {64: [(128, 64, 8, 2), (64, 64, 4, 2), (128, 128, 8, 2)],
          128: [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 2)],
          256: [(64, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 1), (64, 32, 4, 2),
                (32, 64, 4, 2), (128, 32, 8, 1)]}


def _config(text):
    try:
        cfg = tuple(int(x) for x in text.split(","))
    except ValueError:
        cfg = ()
    if len(cfg) != 4:
        raise argparse.ArgumentTypeError(f"expected BM,BN,WARPS,STAGES (four integers), got {text!r}")
    return cfg


def _window(text):
    try:
        window = tuple(int(x) for x in text.split(","))
    except ValueError:
        window = ()
    if len(window) != 2 or min(window) < -1:
        raise argparse.ArgumentTypeError(f"expected L,R (two integers >= -1; -1 unbounded), got {text!r}")
    return window


def _shape_args(sp, heads: int):
    """The shape flags ``prefill`` and ``backward`` share: head dims, lengths, masks, tokens, heads."""
    sp.add_argument("--d", type=int, action="append")
    sp.add_argument("--n", type=int, action="append")
    sp.add_argument("--causal", type=int, action="append", choices=(0, 1))
    sp.add_argument("--tokens", type=int, default=16384)
    sp.add_argument("--heads", type=int, default=heads)
    return sp


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kernel", required=True)
    pf = _shape_args(sub.add_parser("prefill", help="portable prefill kernel configs"), heads=32)
    for flag in ("--bm", "--bn", "--warps", "--stages"):
        pf.add_argument(flag, type=int, action="append")
    pf.add_argument("--window", type=_window, metavar="L,R", help="a sliding window (window_size)")
    pf.add_argument("--out", metavar="FILE.json")
    bw = _shape_args(sub.add_parser("backward", help="portable backward kernel configs"), heads=16)
    bw.add_argument("--dkdv", type=_config, action="append", metavar="BM,BN,WARPS,STAGES")
    bw.add_argument("--dq", type=_config, action="append", metavar="BM,BN,WARPS,STAGES")
    bw.add_argument("--out", metavar="FILE.json")
    dc = sub.add_parser("decode", help="decode kernel configs and split counts")
    dc.add_argument("--out", metavar="FILE.json")
    return p.parse_args(argv)


def _exact_error(torch, o, q, k, v, causal, rows=1024, window=None):
    """max |o - float64 attention| over heads 0-1 of batch 0 and the last ``rows`` query rows, under
    ``causal`` and ``window`` (bottom-right aligned: those rows see what they see in the whole call)."""
    from attnscope import reference

    n, d = k.shape[2], q.shape[3]
    qs = q[0, :2, -rows:].double()
    s = qs @ k[0, :2].double().transpose(-1, -2) / math.sqrt(d)
    keep = torch.as_tensor(reference.permitted(qs.shape[1], n, bool(causal), window), device=q.device)
    ref = torch.softmax(s.masked_fill(~keep, -math.inf), -1).nan_to_num(0.0) @ v[0, :2].double()
    return (o[0, :2, -rows:].double() - ref).abs().max().item()


def _visible_pairs(n: int, causal: bool, window) -> int:
    """Query-key pairs an n x n call sees under ``causal`` and ``window`` (`Grid.visible_pairs`)."""
    from attnscope.model.tiles import Grid

    return Grid(n, n, causal=bool(causal), window=window).visible_pairs()


def prefill(a) -> int:
    import torch
    import triton

    from attnscope import checks
    from attnscope.kernels import fwd
    from attnscope.measure.backends import sdpa

    results, bad = [], 0
    flash, cudnn = sdpa("flash"), sdpa("cudnn")
    for d, causal, n in itertools.product(a.d or [128], a.causal or [0, 1], a.n or [4096, 16384]):
        b = max(1, a.tokens // n)
        q, k, v = (torch.randn(b, a.heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        win = a.window
        pairs = _visible_pairs(n, causal, win) if win else n * n * (0.5 if causal else 1)
        flops = 4 * b * a.heads * d * pairs
        if win:  # PyTorch's own error with the window, on the rows _exact_error checks
            qs, ks, vs = q[:1, :2, -1024:], k[:1, :2], v[:1, :2]
            t_err = _exact_error(torch, checks.torch_attention(qs, ks, vs, bool(causal), win)[0], qs, ks, vs,
                                 causal, window=win)
        else:
            t_err = _exact_error(torch, flash(q, k, v, bool(causal)), q, k, v, causal)
        bound = checks.kernel_tolerance(t_err)
        peers = {}  # SDPA has no window: no peer then
        for name, fn in () if win else (("flash", flash), ("cudnn", cudnn)):
            ms = triton.testing.do_bench(lambda fn=fn, q=q, k=k, v=v, c=bool(causal): fn(q, k, v, c),
                                         warmup=25, rep=100, return_mode="median")
            peers[name] = flops / ms / 1e9
        print(f"d={d} causal={causal} N={n} B={b} window={win}: "
              + "".join(f"{x} {t:.0f} " for x, t in peers.items()) + f"TFLOP/s; bound {bound:.2e}",
              flush=True)
        for bm, bn, w, s in itertools.product(a.bm or [128], a.bn or [64, 128], a.warps or [4, 8],
                                              a.stages or [2, 3, 4]):
            cfg = fwd.FwdConfig(bm, bn, w, s)
            t0 = time.time()
            try:
                o = fwd.flash_attention(q, k, v, bool(causal), config=cfg, window=win)
                err = _exact_error(torch, o, q, k, v, causal, window=win)
                if not err <= bound:
                    bad += 1
                    row = dict(d=d, causal=causal, n=n, cfg=cfg._asdict(), err=err, bound=bound, ok=False)
                    print(f"  bm={bm} bn={bn} w={w} s={s}: error {err:.2e} > bound: not timed", flush=True)
                    results.append(row)
                    continue
                ms = triton.testing.do_bench(
                    lambda cfg=cfg, q=q, k=k, v=v, c=bool(causal), win=win: fwd.flash_attention(
                        q, k, v, c, config=cfg, window=win),
                    warmup=25, rep=100, return_mode="median")
                tf = flops / ms / 1e9
                row = dict(d=d, causal=causal, n=n, window=win, cfg=cfg._asdict(), tflops=tf, err=err,
                           bound=bound, ok=True, **{f"vs_{x}": tf / t for x, t in peers.items()})
                print(f"  bm={bm} bn={bn} w={w} s={s}: {tf:6.1f} TFLOP/s  "
                      + "".join(f"/{x} {tf / t:.3f} " for x, t in peers.items())
                      + f" err {err:.2e} ({time.time() - t0:.1f}s)", flush=True)
            except Exception as e:  # noqa: BLE001 - a config the compiler refuses is reported, the rest run
                row = dict(d=d, causal=causal, n=n, cfg=cfg._asdict(),
                           error=f"{type(e).__name__}: {str(e)[:200]}")
                print(f"  bm={bm} bn={bn} w={w} s={s}: FAILED {row['error'][:150]}", flush=True)
            results.append(row)
        results.append(dict(d=d, causal=causal, n=n, peers=peers))
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


def decode(a) -> int:
    import torch
    import triton

    from attnscope import checks
    from attnscope.kernels import decode as dec
    from attnscope.kernels.decode.plan import _tuned_plan
    from attnscope.measure.backends import sdpa
    from attnscope.measure.bench import DECODE_GRID, DECODE_LS

    cudnn = sdpa("cudnn")
    rows, bad = [], 0
    for b, hq, hkv in DECODE_GRID:
        for L in DECODE_LS:
            q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
            kv = 2 * k.numel() * 2
            g = hq // hkv
            kk, vv = (t[:1].double().repeat_interleave(g, 1) for t in (k, v))  # batch 0, float64
            exact = torch.softmax(q[:1].double() @ kk.transpose(-1, -2) / math.sqrt(128), -1) @ vv
            low = torch.nn.functional.scaled_dot_product_attention(q[:1], k[:1], v[:1], enable_gqa=True)
            bound = checks.kernel_tolerance((low.double() - exact).abs().max().item())
            err = (dec.flash_decode(q, k, v)[:1].double() - exact).abs().max().item()
            if not err <= bound:
                bad += 1
                print(f"B={b} Hq={hq} Hkv={hkv} L={L}: error {err:.2e} > bound {bound:.2e}: not timed",
                      flush=True)
                continue

            def tbs(fn, kv=kv):
                return kv / triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") / 1e9

            ref = tbs(lambda q=q, k=k, v=v, g=hq != hkv: cudnn(q, k, v, False, gqa=g))
            auto = tbs(lambda q=q, k=k, v=v: dec.flash_decode(q, k, v))
            default_s = dec.decode_plan(q, k, v).num_splits  # what the one-liner runs
            best = (0.0, None)
            for bn, w, st in DECODE_CONFIGS:
                for s in SPLITS:
                    if L // s < 256 and s > 1:
                        continue
                    cfg = dict(BLOCK_N=bn, STAGES=st, num_warps=w, num_stages=st)

                    try:
                        plan = _tuned_plan(q, k, v, num_splits=s, config=cfg)

                        def call(q=q, k=k, v=v, plan=plan):
                            return plan.run(q, k, v)
                        e_cfg = (call()[:1].double() - exact).abs().max().item()
                        if not e_cfg <= bound:
                            bad += 1
                            print(f"   cfg {cfg} s={s}: error {e_cfg:.2e} > bound {bound:.2e}: not timed")
                            continue
                        t = tbs(call)
                    except Exception as e:  # noqa: BLE001 - a config the compiler refuses is reported
                        print(f"   cfg {cfg} s={s} failed: {str(e)[:100]}")
                        continue
                    rows.append(dict(b=b, hq=hq, hkv=hkv, L=L, bn=bn, w=w, st=st, s=s, tbs=t))
                    if t > best[0]:
                        best = (t, (bn, w, st, s))
            print(f"B={b:2d} Hq={hq} Hkv={hkv:2d} L={L:6d}: cudnn {ref:.2f}  auto(s={default_s}) {auto:.2f}  "
                  f"best {best[0]:.2f} at (BN, warps, stages, splits)={best[1]}", flush=True)
            rows.append(dict(b=b, hq=hq, hkv=hkv, L=L, cudnn=ref, auto=auto, best=best, err=err, bound=bound))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


def backward(a) -> int:
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from attnscope.kernels import bwd, bwd_plan, fwd
    from attnscope.model.flops import attention_flops

    def ms(fn):
        return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))

    results, bad = [], 0
    for d, causal, n in itertools.product(a.d or [128], a.causal or [0, 1], a.n or [4096]):
        b, hq = max(1, a.tokens // n), a.heads
        hkv = hq
        gen = torch.Generator(device="cuda").manual_seed(n + d + causal)
        q, do = (torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                 for _ in range(2))
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        tflop = attention_flops(b, hq, n, n, d, bool(causal), pass_="backward") / 1e9
        g = 1  # float64 gradients of head 0 of batch 0
        qs, ks, vs = (t[:1, :h].double().requires_grad_() for t, h in ((q, g), (k, 1), (v, 1)))
        s = qs @ ks.transpose(-1, -2) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        (torch.softmax(s, -1) @ vs).backward(do[:1, :g].double())
        ref = (qs.grad, ks.grad, vs.grad)

        def err(grads, ref=ref, g=g):
            return max((x[:1, :h].double() - r).abs().max().item()
                       for x, r, h in zip(grads[:3], ref, (g, 1, 1), strict=True))

        peers, bound = {}, None
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            with sdpa_kernel(backend):
                o = sdpa(*leaves, is_causal=bool(causal))
            if name == "flash":
                bound = 3 * err(torch.autograd.grad(o, leaves, do, retain_graph=True)) + 1e-3
            peers[name] = tflop / ms(lambda o=o, leaves=leaves, do=do: torch.autograd.grad(o, leaves, do,
                                                                                          retain_graph=True))
        o, lse = fwd.flash_attention(q, k, v, causal=bool(causal), return_lse=True)
        print(f"d={d} causal={causal} N={n} B={b} Hq={hq} Hkv={hkv}: flash {peers['flash']:.0f} "
              f"cudnn {peers['cudnn']:.0f} TFLOP/s; bound {bound:.2e}", flush=True)
        saved = bwd.DKDV_CONFIGS.get(d), bwd.DQ_CONFIGS.get(d)
        best = {}
        for table, cands in (("dkdv", a.dkdv or BWD_DKDV.get(d, [])), ("dq", a.dq or BWD_DQ.get(d, []))):
            for cfg in cands:
                bwd.DKDV_CONFIGS[d] = best.get("dkdv", (None, saved[0]))[1] if table == "dq" else cfg
                bwd.DQ_CONFIGS[d] = cfg if table == "dq" else saved[1]
                bwd_plan.clear_plan_cache()  # a kept launch plan holds the tables' configs of its first call
                row = dict(d=d, causal=causal, n=n, table=table, cfg=cfg)
                try:
                    def call(q=q, k=k, v=v, o=o, lse=lse, do=do, c=bool(causal)):
                        return bwd.flash_attention_backward(do, q, k, v, o, lse, c, None, impl="portable")
                    e = err(call())
                    row.update(err=e, bound=bound)
                    if not e <= bound:
                        bad += 1
                        print(f"  {table} {cfg}: error {e:.2e} > bound {bound:.2e}: not timed", flush=True)
                        results.append(row)
                        continue
                    tf = tflop / ms(call)
                    row.update(tflops=tf, vs_cudnn=tf / peers["cudnn"], vs_flash=tf / peers["flash"])
                    print(f"  {table} {cfg}: {tf:6.1f} TFLOP/s  /cudnn {tf / peers['cudnn']:.3f}  /flash "
                          f"{tf / peers['flash']:.3f}  err {e:.1e}", flush=True)
                    if tf > best.get(table, (0.0, None))[0]:
                        best[table] = (tf, cfg)
                except Exception as e:  # noqa: BLE001 - a config the compiler refuses is reported, the rest run
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    print(f"  {table} {cfg}: FAILED {row['error'][:150]}", flush=True)
                results.append(row)
        bwd.DKDV_CONFIGS[d], bwd.DQ_CONFIGS[d] = saved
        bwd_plan.clear_plan_cache()
        print(f"  best: dK/dV {best.get('dkdv')}, dQ {best.get('dq')}", flush=True)
        results.append(dict(d=d, causal=causal, n=n, peers=peers, best=best))
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


def main(argv=None) -> int:
    a = parse_args(argv)
    return {"prefill": prefill, "decode": decode, "backward": backward}[a.kernel](a)


if __name__ == "__main__":
    sys.exit(main())
