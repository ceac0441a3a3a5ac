"""The Gluon balanced-split decode kernel (attnscope.kernels.decode_stream) and the plan's choice of it.

Gluon kernels do not run under the interpreter: on a CPU-only machine these tests check the split
arithmetic against brute force, which layouts the plan sends to the kernel (pretending an sm_90 device),
and that the kernel compiles for sm_90 without spills; on an H200 (``-m gpu``) they check it against the
float64 reference of tests/test_decode.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope.kernels import decode, decode_stream  # noqa: E402
from test_decode import poisoned_empty, reference_decode, torch_error  # noqa: E402

CUDA = torch.cuda.is_available()
SM90 = CUDA and torch.cuda.get_device_capability() == (9, 0)


# --- the balanced split ----------------------------------------------------------------------------------
@pytest.mark.parametrize("items,tiles,programs", [(128, 256, 264), (32, 1024, 264), (512, 32, 264),
                                                  (7, 5, 3), (1, 40, 7), (3, 16, 48), (264, 1, 264)])
def test_split_arithmetic_matches_brute_force(items, tiles, programs):
    total = items * tiles
    owner = []
    for p in range(programs):
        lo, hi = decode_stream.program_range(p, programs, total)
        owner += [p] * (hi - lo)
    assert len(owner) == total  # the ranges tile [0, total) in order, no gap, no overlap
    assert all(decode_stream.program_of(g, programs, total) == owner[g] for g in range(total))
    segs = [len(set(owner[i * tiles:(i + 1) * tiles])) for i in range(items)]
    assert [decode_stream.segments(i, tiles, programs, total) for i in range(items)] == segs
    assert decode_stream.max_segments(items, tiles, programs) >= max(segs)  # the partial buffers' slots


def test_stream_programs_rule():
    # two programs per SM, unless each would get fewer than MIN_TILES_PER_PROGRAM tiles; forced: fewer
    assert decode_stream.stream_programs(128, 256, 132) == 264
    assert decode_stream.stream_programs(32, 1024, 132) == 264
    m = decode_stream.MIN_TILES_PER_PROGRAM
    assert decode_stream.stream_programs(264, m, 132) == 264
    assert decode_stream.stream_programs(264, m - 1, 132) == 0
    assert decode_stream.stream_programs(264, m - 1, 132, forced=True) == 264 * (m - 1) // m
    assert decode_stream.stream_programs(1, 10, 132) == 0
    assert decode_stream.stream_programs(1, 10, 132, forced=True) == 1


# --- which layouts the plan runs on the kernel -------------------------------------------------------------
def _layout(B=16, Hq=32, Hkv=8, L=32768, d=128, dtype=torch.bfloat16, Nq=1):
    q = torch.zeros(B, Hq, Nq, d, dtype=dtype)
    k = torch.zeros(B, Hkv, L, d, dtype=dtype)
    return q, k, k.clone()


@pytest.fixture
def pretend_sm90(monkeypatch):
    monkeypatch.setattr(decode, "hopper_possible", lambda q: None)


def _why(q, k, v, table=None, raw=False, splits=None, knobs=False, max_seqlen=None, impl="auto"):
    return decode._stream_why(impl, q, k, v, table, raw, splits, knobs, max_seqlen, k.shape[2])


def test_plan_picks_the_kernel_only_where_it_applies(pretend_sm90):
    q, k, v = _layout()
    assert _why(q, k, v) is None
    cases = {
        "paged caches": _why(*_layout(), table=torch.zeros(16, 1, dtype=torch.int32)),
        "Nq > 1": _why(*_layout(Nq=2)),
        "head_dim 96": _why(*_layout(d=96)),
        "dtype torch.float32": _why(*_layout(dtype=torch.float32)),
        "more than 16 query heads": _why(*_layout(Hq=32, Hkv=1)),
        "scales past RAW_SCORES_ABOVE": _why(*_layout(), raw=True),
        "explicit num_splits": _why(*_layout(), splits=4),
        "knobs": _why(*_layout(), knobs=True),
        "max_seqlen 1000 is under": _why(*_layout(), max_seqlen=1000),
        "fewer than 16 key tiles for each of 2 programs per SM": _why(*_layout(B=1, Hkv=32, L=4096)),
    }
    for want, got in cases.items():
        assert got is not None and want in got, (want, got)
    assert _why(*_layout(), max_seqlen=16384) is None  # half of L_max still runs it
    # a cache whose strides TMA cannot address (a 2-byte offset view) runs the portable kernel
    k2 = torch.zeros(16, 8, 32768 * 128 + 1, dtype=torch.bfloat16)[:, :, 1:].view(16, 8, 32768, 128)
    assert "TMA" in _why(q, k2, k2)


def test_impl_option(pretend_sm90):
    q, k, v = _layout(B=1, Hkv=32, L=4096)
    assert _why(q, k, v, impl="hopper") is None  # forced: fewer programs, still the Gluon kernel
    with pytest.raises(NotImplementedError, match="impl='hopper': Nq > 1 runs the portable kernel; "
                                                  "supported elsewhere: impl='portable'"):
        _why(*_layout(Nq=3), impl="hopper")
    with pytest.raises(ValueError, match="impl: expected one of auto, portable, hopper, got 'fast'"):
        attnscope.decode_plan(*_layout(B=1, L=256), impl="fast")


def test_plan_without_sm90_runs_the_portable_kernel():
    # on this machine (interpreter or another GPU) "auto" falls back, "hopper" says why
    q, k, v = _layout(B=1, Hq=8, Hkv=2, L=64, d=64)
    if CUDA:
        q, k, v = q.cuda(), k.cuda(), v.cuda()
    if not SM90:
        assert attnscope.decode_plan(q, k, v).impl == "portable"
        with pytest.raises(NotImplementedError, match="impl='hopper': it needs"):
            attnscope.decode_plan(q, k, v, impl="hopper")
    assert attnscope.decode_plan(q, k, v, impl="portable").impl == "portable"


# --- it compiles for sm_90 (no GPU needed) -----------------------------------------------------------------
SM90_COMPILE = """
import json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from attnscope.kernels import decode_stream as ds
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
for d, dtype, group, seqlens, lse in ((128, "bf16", 4, True, False), (64, "fp16", 16, False, True)):
    consts = {"GROUP": group, "HAS_SEQLENS": seqlens, "WRITE_LSE": lse, "MS": 64, "num_warps": ds.NUM_WARPS}
    src = GluonASTSource(fn=ds._attnscope_decode_stream_kernel, signature=ds.signature(d, dtype, group),
                         constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": ds.NUM_WARPS})
    ptx = k.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                       text=True)
    os.unlink(f.name)
    print(json.dumps({"case": [d, dtype, group], "rc": r.returncode, "smem": k.metadata.shared,
                      "regs": int(re.search(r"Used (\\d+) registers", r.stderr).group(1)),
                      "spills": int(re.search(r"(\\d+) bytes spill stores", r.stderr).group(1)),
                      "wgmma": "wgmma.mma_async" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
                      "ticket": "atom.global.gpu.acq_rel.add" in ptx}))
"""


def test_kernel_compiles_for_sm90_without_spills():
    # Gluon kernels never run under the interpreter: compile for sm_90 (the H200) in a subprocess without
    # TRITON_INTERPRET, then ptxas: no spills, and two programs' registers and shared memory fit an SM
    import json
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0 and ("ptxas" in r.stderr or "backend" in r.stderr.lower()):
        pytest.skip(f"no sm_90 compiler toolchain here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["rc"] == 0 and row["spills"] == 0, row
        assert row["wgmma"] and row["tma"] and row["ticket"], row  # wgmma on TMA tiles; the merge ticket
        assert row["smem"] <= 227 * 1024 // decode_stream.PROGRAMS_PER_SM, row
        assert row["regs"] * 128 * decode_stream.PROGRAMS_PER_SM <= 65536, row


# --- against float64 on an H200 --------------------------------------------------------------------------
def _check(B, Hq, Hkv, L, d, dtype, lens, seed, return_lse=True, runs=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, 1, d, generator=g).to(dtype).cuda()
    k = torch.randn(B, Hkv, L, d, generator=g).to(dtype).cuda()
    v = torch.randn(B, Hkv, L, d, generator=g).to(dtype).cuda()
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda") if lens is not None else None
    with poisoned_empty():
        plan = attnscope.decode_plan(q, k, v, sl, return_lse=return_lse, impl="hopper")
    assert plan.impl == "hopper"
    full = sl if sl is not None else torch.full((B,), L, dtype=torch.int32)
    ref_o, ref_lse = reference_decode(q, k, v, full)
    bound = 2 * torch_error(q, k, v, full, ref_o) + 1e-3
    first = None
    for _ in range(runs):  # again: the merge counters are back at 0, the result the same bits
        with poisoned_empty():
            out = plan.run(q, k, v, sl)
        o, lse = out if return_lse else (out, None)
        assert not torch.isnan(o).any()
        err = (o.double().cpu() - ref_o).abs().max().item()
        assert err <= bound, f"max error {err:.3g} > bound {bound:.3g}"
        empty = full.cpu() == 0
        assert (o.cpu()[empty] == 0).all()
        if return_lse:
            assert torch.isneginf(lse.cpu()[empty]).all()
            some = ~empty
            lse_err = (lse.double().cpu()[some] - ref_lse[some]).abs().max().item() if some.any() else 0.0
            assert lse_err <= 1e-3, f"lse error {lse_err:.3g}"
        if first is not None:
            assert torch.equal(o, first)
        first = o
    return plan


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon decode kernel needs an sm_90 GPU")
@pytest.mark.parametrize("B,Hq,Hkv,L,d,dtype,lens", [
    (16, 32, 8, 8192, 128, torch.bfloat16, None),  # items split between 2-3 programs: the merge
    (1, 32, 32, 65536, 128, torch.float16, None),  # 1,024-tile... items across ~8 programs
    (3, 16, 1, 40000, 128, torch.bfloat16, [40000, 1, 0]),  # MQA G = 16, L not a tile multiple, empty seq
    (5, 12, 4, 9000, 64, torch.float16, [9000, 8999, 4500, 129, 128]),  # G = 3, d = 64, ragged
    (64, 32, 8, 2048, 128, torch.bfloat16, None),  # many items per program
    (2, 8, 8, 30001, 64, torch.bfloat16, [30001, 15001]),
])
def test_matches_float64(B, Hq, Hkv, L, d, dtype, lens):
    _check(B, Hq, Hkv, L, d, dtype, lens, seed=B * 131 + L)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon decode kernel needs an sm_90 GPU")
def test_flash_decode_graph_capture_and_out():
    plan = _check(16, 32, 8, 8192, 128, torch.bfloat16, None, seed=5, return_lse=False, runs=1)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(16, 32, 1, 128, generator=g).to(torch.bfloat16).cuda()
    k = torch.randn(16, 8, 8192, 128, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn_like(k)
    lens = torch.full((16,), 8192, dtype=torch.int32, device="cuda")
    plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
    assert plan.impl == "hopper"  # "auto" on sm_90
    want = attnscope.flash_decode(q, k, v, lens, impl="portable")
    eager = plan.run(q, k, v, lens)
    assert (eager.float() - want.float()).abs().max().item() < 2e-2
    out = torch.empty_like(q)
    assert plan.run(q, k, v, lens, out=out) is out and torch.equal(out, eager)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(q, k, v, lens)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = plan.run(q, k, v, lens)
    lens.fill_(100)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(res, plan.run(q, k, v, lens))  # the replay read the new lengths
    assert torch.equal(attnscope.flash_decode(q, k, v, lens, check_seqlens=False), res)  # the one-liner
