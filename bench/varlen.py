"""Packed variable-length prefill (issue 14): attnscope varlen vs SDPA FLASH on nested jagged tensors, Flex
attention with a document mask, and padded dense attnscope, on the same inputs in the same run.

    PYTHONPATH=src python bench/varlen.py [--quick] [--no-flex] [--json out.json]
    PYTHONPATH=src python bench/varlen.py --compile-only   # no GPU: sm_90 registers / spills / smem

A realistic length mix: 64 sequences with lengths drawn uniformly from 128 to 8,192 (seed 0; --quick:
16 sequences, 128 to 2,048), bf16, d = 128, Hq = 32 with Hkv = 32 and 8 (GQA), causal and not.
TFLOP/s count useful FLOPs only: `attnscope.model.flops.attention_flops` summed per sequence (padding
and cross-document blocks are not credited). Peers:

- sdpa-flash-njt: SDPA with the FLASH backend on torch.nested jagged tensors (layout=torch.jagged),
  unmasked only: torch's nested SDPA refuses is_causal=True ("Nested tensors for query / key are not
  supported when is_causal=True") and takes no mask. It has no GQA on nested tensors, so K/V are
  expanded to Hq heads beforehand (the copy is not timed);
- flex: FlexAttention on [1, H, total, d] with a document mask (and causal within a document),
  torch.compile'd; the block mask is built once, outside the timing;
- attnscope-padded: attnscope.flash_attention on [B, H, max_len, d], right-padded. Causal is exact on the
  valid rows (padding keys lie in every valid row's future); unmasked, the padding keys are attended,
  so its output is wrong there: it is timed for the cost of padding only and marked "unchecked".

attnscope-varlen-ptr is the same kernel with K/V by pointer loads instead of TMA (what unaligned inputs
get), timed to show what TMA buys.

Before timing, every output is compared per sequence with float64 attention on the GPU (the shortest,
the longest and two random sequences; heads 0 and 1): attnscope varlen must be within 2 x the error of
PyTorch's own SDPA at bf16 (dense, per sequence) + 1e-3, else it is not timed and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time


def lengths(n_seq: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n_seq)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="16 sequences of 128..2048, MHA only: a smoke run")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON to FILE")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes ~10-30 s)")
    p.add_argument("--compile-only", action="store_true",
                   help="no GPU needed: compile every kernel variant for sm_90 and print registers, spills "
                        "and shared memory (ptxas -v), then exit")
    args = p.parse_args(argv)
    if args.compile_only:
        return compile_report()

    import torch
    import triton

    if not torch.cuda.is_available():
        print("bench/varlen.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    import attnscope
    from attnscope.measure.bench import environment
    from attnscope.model.flops import attention_flops

    t_start = time.time()
    lens = lengths(16, 128, 2048) if args.quick else lengths(64, 128, 8192)
    B, d, hq, dtype = len(lens), 128, 32, torch.bfloat16
    total, max_len = sum(lens), max(lens)
    dev = torch.device("cuda")
    cu = torch.tensor([0, *itertools_accumulate(lens)], dtype=torch.int32, device=dev)
    print(f"{B} sequences, {total:,} tokens, lengths {min(lens)}..{max_len}, bf16, d = {d}", flush=True)
    rng = random.Random(1)
    sample = sorted({lens.index(min(lens)), lens.index(max(lens)), *rng.sample(range(B), 2)})

    def rep_ms(fn) -> float:
        return float(triton.testing.do_bench(fn, warmup=50, rep=400, return_mode="median"))

    results = []
    failed = False
    for hkv in ((32,) if args.quick else (32, 8)):
        g = hq // hkv
        torch.manual_seed(hkv)
        q = torch.randn(total, hq, d, device=dev, dtype=dtype)
        k = torch.randn(total, hkv, d, device=dev, dtype=dtype)
        v = torch.randn(total, hkv, d, device=dev, dtype=dtype)
        for causal in (False, True):
            useful = sum(attention_flops(1, hq, n, n, d, causal) for n in lens)
            row = {"hq": hq, "hkv": hkv, "causal": causal, "sequences": B, "tokens": total,
                   "useful_flops": useful, "ms": {}, "tflops": {}, "err": {}}
            impls = _impls(torch, attnscope, q, k, v, cu, lens, causal, g, args.no_flex)

            # correctness first: float64 per sequence on sampled sequences and heads
            case = (torch, q, k, v, cu.tolist(), lens, sample, causal, g)
            torch_err = _ref_err(case, lambda s, case=case: _torch_own(case, s))
            bound = 2 * torch_err + 1e-3
            row["torch_err"], row["bound"] = torch_err, bound
            for name, (fn, per_seq, checked) in impls.items():
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    err = _ref_err(case, lambda s, out=out, f=per_seq: f(out, s)) if checked else None
                    row["err"][name] = err
                    del out
                    if name.startswith("attnscope-varlen") and not err <= bound:
                        print(f"  FAIL attnscope varlen hkv={hkv} causal={causal}: err {err:.3g} > "
                              f"bound {bound:.3g}; not timed", flush=True)
                        failed = True
                        continue
                    ms = rep_ms(fn)
                    row["ms"][name] = ms
                    row["tflops"][name] = useful / ms / 1e9
                except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                    print(f"  {name} n/a (hkv={hkv} causal={causal}): {type(e).__name__}: {str(e)[:160]}",
                          flush=True)
                torch.cuda.empty_cache()
            a = row["tflops"].get("attnscope-varlen")
            row["vs"] = {n: (a / t if a and t else None) for n, t in row["tflops"].items()}
            results.append(row)
            print(f"Hq={hq} Hkv={hkv:2d} causal={int(causal)} | " + " ".join(
                f"{n}={t:.1f}" for n, t in row["tflops"].items()) + " TFLOP/s (useful) | err " + " ".join(
                f"{n}={'unchecked' if e is None else f'{e:.2g}'}" for n, e in row["err"].items())
                + f" (bound {bound:.2g})", flush=True)
            del impls
            torch.cuda.empty_cache()
    if not failed:
        print("all attnscope results matched the float64 reference", flush=True)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": environment(torch), "lengths": lens, "d": d, "dtype": "bf16",
                       "results": results}, f, indent=2)
    return 1 if failed else 0


def compile_report() -> int:
    """Compile each (head_dim, causal, TMA) variant for sm_90 without a GPU; print ptxas's resource use."""
    import os
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnscope.kernels import varlen

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    fn = varlen._attnscope_varlen_kernel
    names = fn.arg_names
    types = ["*bf16"] * 4 + ["*fp32"] + ["*i32"] * 4 + ["i32"] * 8 + ["i32"] * 4 + ["fp32"]
    sig = dict(zip(names, types, strict=False)) | {n: "constexpr" for n in names[len(types):]}
    # what the launcher's specialisation sees at run time: pointers and strides divisible by 16
    div16 = [i for i, n in enumerate(names[:len(types)])
             if n.startswith("stride") or (types[i].startswith("*"))]
    attrs = {(i,): [["tt.divisibility", 16]] for i in div16}
    for d, (bm, bn, warps, stages) in varlen.CONFIGS.items():
        for tma in (True, False):
            for causal in (False, True):
                cx = {"HEAD_DIM": d, "CAUSAL": causal, "STORE_LSE": True, "BLOCK_M": bm, "BLOCK_N": bn,
                      "USE_TMA": tma, "MAX_UNSCALED": False, "EMULATE_BF16": False}
                k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs),
                                   target=GPUTarget("cuda", 90, 32),
                                   options={"num_warps": warps, "num_stages": stages})
                with tempfile.TemporaryDirectory() as t:
                    with open(os.path.join(t, "k.ptx"), "w") as f:
                        f.write(k.asm["ptx"])
                    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(t, "k.ptx"), "-o",
                                        os.path.join(t, "k.cubin")], capture_output=True, text=True)
                info = " | ".join(x.split("info    :")[-1].strip() for x in r.stderr.splitlines()
                                  if "spill" in x or "Used" in x)
                print(f"bf16 d={d} {'causal' if causal else 'unmasked'} {'tma' if tma else 'pointer'} "
                      f"BLOCK {bm}x{bn} {warps} warps {stages} stages: shared {k.metadata.shared} B | {info}",
                      flush=True)
    return 0


def _ref_err(case, out_of) -> float:
    """Max abs error of ``out_of(s)`` ([H, n, d], heads 0 and 1) against float64 attention over the sampled
    sequences."""
    torch, q, k, v, starts, lens, sample, causal, g = case
    err = 0.0
    heads = [0, 1]
    for s in sample:
        a, n = starts[s], lens[s]
        qs = q[a:a + n, heads].transpose(0, 1).double()
        ks = k[a:a + n, [h // g for h in heads]].transpose(0, 1).double()
        vs = v[a:a + n, [h // g for h in heads]].transpose(0, 1).double()
        sc = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        ref = torch.softmax(sc, -1) @ vs
        err = max(err, (out_of(s)[:2].double() - ref).abs().max().item())
    return err


def _torch_own(case, s):
    """PyTorch's own attention for sequence s at the input dtype (dense SDPA): its error sets the bound."""
    torch, q, k, v, starts, lens, _, causal, g = case
    a, n = starts[s], lens[s]
    qs, ks, vs = (t[a:a + n].transpose(0, 1)[None] for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=g > 1)[0]


def itertools_accumulate(xs):
    import itertools

    return list(itertools.accumulate(xs))


def _impls(torch, attnscope, q, k, v, cu, lens, causal, g, no_flex):
    """name -> (call, per-sequence [H, n, d] view of its output, checked)."""
    total, hq, d = q.shape
    B, max_len = len(lens), max(lens)
    starts = cu[:-1].tolist()
    impls = {}

    def packed_view(out, s):  # [total, H, d] -> [H, n, d] of sequence s
        return out[starts[s]:starts[s] + lens[s]].transpose(0, 1)

    impls["attnscope-varlen"] = (
        lambda: attnscope.flash_attention_varlen(q, k, v, cu, cu, max_len, max_len, causal=causal,
                                                 check_seqlens=False),
        packed_view, True)
    # the same kernel with K/V by predicated pointer loads instead of TMA (the path unaligned inputs take)
    from attnscope.kernels import varlen as _varlen

    impls["attnscope-varlen-ptr"] = (
        lambda: _varlen._launch(q, k, v, cu, cu, max_len, max_len, causal, None, False, False, tma=False)[0],
        packed_view, True)

    # SDPA FLASH on nested jagged tensors; K/V expanded to Hq heads (no GQA on nested tensors)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    offsets = cu.long()
    ke, ve = (k, v) if g == 1 else (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))
    qn, kn, vn = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, ke, ve))

    def njt():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qn, kn, vn, is_causal=causal)

    if not causal:  # nested SDPA has no causal path (module docstring)
        impls["sdpa-flash-njt"] = (njt, lambda out, s: packed_view(out.transpose(1, 2).values(), s), True)

    if not no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(torch.arange(B, device=q.device), torch.tensor(lens, device=q.device))

        def doc_mask(b, h, q_idx, kv_idx):
            same = doc[q_idx] == doc[kv_idx]
            return (same & (q_idx >= kv_idx)) if causal else same

        block_mask = create_block_mask(doc_mask, None, None, total, total, device=q.device, _compile=True)
        flex = torch.compile(flex_attention, dynamic=False)
        qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))  # [1, H, total, d]
        impls["flex"] = (lambda: flex(qf, kf, vf, block_mask=block_mask, enable_gqa=g > 1),
                         lambda out, s: packed_view(out[0].transpose(0, 1), s), True)

    # padded dense: [B, H, max_len, d], right-padded with zeros
    def pad(t):
        out = t.new_zeros(B, t.shape[1], max_len, d)
        for s in range(B):
            out[s, :, :lens[s]] = t[starts[s]:starts[s] + lens[s]].transpose(0, 1)
        return out

    qp, kp, vp = pad(q), pad(k), pad(v)
    impls["attnscope-padded"] = (lambda: attnscope.flash_attention(qp, kp, vp, causal=causal),
                                 lambda out, s: out[s, :, :lens[s]], causal)
    return impls


if __name__ == "__main__":
    sys.exit(main())
