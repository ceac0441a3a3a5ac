"""Probe (H200): the portable forward's causal launch order (the backward keeps the grid's: its causal builds
spilled 36-60 B more with it, sm90_resources), grid (TAIL = 1) vs the last heads
interleaved (shipped on feat/odd-head-dims), at few-head shapes; outputs and gradients must be bitwise equal.
    PYTHONPATH=src python probes/portable_order_probe.py [rounds]"""
import os, sys
import torch, triton
import attnscope
from attnscope.kernels import bwd, bwd_plan, fwd
from attnscope.model import tiles

OUT = os.environ.get("OUT", "/tmp")
rules = {"grid": lambda causal, blocks, heads, sms: 1, "tail": tiles.launch_tail}
def use(name):
    fwd.launch_tail = rules[name]
    fwd.clear_plan_cache(); bwd_plan.clear_plan_cache()
SHAPES = [(1, 32, 8, 2048, 64), (1, 32, 8, 4096, 96), (1, 32, 32, 4096, 96), (1, 16, 8, 8192, 256),
          (2, 16, 4, 4096, 128), (1, 32, 8, 8192, 80)]  # (B, Hq, Hkv, N, d), causal, bf16
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
log = open(f"{OUT}/portable_order_probe.txt", "w")
for B, Hq, Hkv, N, d in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, N, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, Hkv, N, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn_like(q)
    outs = {}
    for name in rules:
        use(name)
        o, lse = attnscope.flash_attention(q, k, v, causal=True, return_lse=True, impl="portable")
        outs[name] = (o, lse, *bwd.flash_attention_backward(do, q, k, v, o, lse, True, None, impl="portable"))
    same = all(torch.equal(a, b) for a, b in zip(outs["grid"], outs["tail"]))
    o, lse = outs["grid"][:2]
    t = {(n, w): [] for n in rules for w in ("fwd", "bwd")}
    for r in range(rounds):
        for name in (list(rules) if r % 2 == 0 else list(rules)[::-1]):
            use(name)
            t[name, "fwd"].append(triton.testing.do_bench(lambda: attnscope.flash_attention(q, k, v, causal=True, impl="portable")))
            t[name, "bwd"].append(triton.testing.do_bench(lambda: bwd.flash_attention_backward(do, q, k, v, o, lse, True, None, impl="portable")))
    med = {key: sorted(val)[len(val) // 2] for key, val in t.items()}
    line = (f"B{B} {Hq}/{Hkv} N{N} d{d} causal bitwise-equal {same}: fwd grid {med['grid', 'fwd']*1e3:.1f} us "
            f"tail/grid speed {med['grid', 'fwd'] / med['tail', 'fwd']:.3f}; bwd grid {med['grid', 'bwd']*1e3:.1f} us "
            f"speed {med['grid', 'bwd'] / med['tail', 'bwd']:.3f}")
    print(line, flush=True); log.write(line + "\n")
