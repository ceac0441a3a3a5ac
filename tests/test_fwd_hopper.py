"""The Gluon Hopper forward: its dispatch rule (model/dispatch.py) and its score mods (window, softcap,
sinks).

CPU: the rule's shape (one rule for every dtype, what each threshold does), the mods' input checks, and a
build of each variant with every mod compiled for sm_90 (Triton's bundled ptxas, no GPU). GPU (sm_90): every
mod on every variant through `attnscope.flash_attention` against float64 (bound `checks.kernel_tolerance`
of PyTorch's own error at the same dtype; LSE within 1e-3; rows without a visible key give 0 and LSE -inf,
or the sink with sinks), outputs poisoned with NaN.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope import reference  # noqa: E402
from attnscope.checks import kernel_tolerance, torch_attention  # noqa: E402
from attnscope.model import dispatch  # noqa: E402
from test_fwd import _poisoned_empty  # noqa: E402 - NaN-filled outputs, as the portable kernel's tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# --- the dispatch rule ------------------------------------------------------------------------------------
def test_mean_keys_is_the_mean_over_rows_of_the_visible_keys():
    for nq, nk in ((1, 1), (7, 7), (100, 300), (300, 100), (1000, 1000), (5, 2)):
        for causal in (False, True):
            brute = sum(min(nk, max(0, r + nk - nq + 1)) if causal else nk for r in range(nq)) / nq
            assert dispatch.mean_keys(nq, nk, causal) == pytest.approx(brute), (nq, nk, causal)


def test_the_rule_reads_the_geometry_only():
    """d = 128: the persistent kernel; d = 64: three warpgroups once the KV loop is long, the grid fills
    the machine twice over and their 192-row tiles pad no more than 128-row ones, portable where the loop is
    short; no dtype in the rule."""
    rule = dispatch.hopper_variant
    assert {rule(128, c, b, 32, 8, n, n) for c in (False, True) for b, n in ((1, 1024), (4, 32768))} == \
        {"hopper_persist"}
    assert rule(64, False, 2, 32, 32, 8192, 8192) == rule(64, True, 2, 32, 32, 8192, 8192) == "hopper_wg3_pp"
    assert rule(64, True, 4, 32, 32, 4096, 4096) == "hopper_persist"  # causal needs the longer loop
    cut = dispatch.WG3_MIN_KEYS[True]
    assert rule(64, True, 8, 32, 32, 2 * cut + 192, 2 * cut + 192) == "hopper_wg3_pp"  # past the causal cut
    assert rule(64, True, 8, 32, 32, 2 * cut - 192, 2 * cut - 192) == "hopper_persist"  # before it
    # 192-row tiles that pad more rows than 128-row tiles lose: N = 1,024 pads 6 x 192 = 1,152 rows, not 1,024
    assert rule(64, False, 16, 32, 32, 1024, 1024) == "hopper_persist"
    assert rule(64, False, 16, 32, 32, 1152, 1152) == "hopper_wg3_pp"  # no padding either way
    assert rule(64, False, 4, 32, 32, 4096, 4096) == "hopper_wg3_pp"
    assert rule(64, True, 16, 32, 32, 1024, 1024) is None  # short causal loop: portable
    # too few 192-row CTAs for two waves: the 128-row persistent kernel instead
    assert rule(64, False, 1, 4, 4, 8192, 8192) == "hopper_persist"  # 172 CTAs on 132 SMs
    assert rule(64, False, 1, 4, 4, 8192, 8192, sms=16) == "hopper_wg3_pp"
    assert rule(256, False, 4, 32, 32, 4096, 4096) is None and rule(24, False, 4, 32, 32, 4096, 4096) is None
    assert rule(96, False, 4, 32, 32, 4096, 4096) == rule(128, False, 4, 32, 32, 4096, 4096)  # d 128's tiles
    # a window bounds the loop: W = 1k keys is a short loop (the caller runs the portable kernel)
    assert rule(64, True, 4, 32, 32, 8192, 8192, window=(1024, 0)) is None
    assert rule(64, True, 4, 32, 32, 8192, 8192, window=(-1, 0)) == "hopper_wg3_pp"
    # d = 64 windows leaving a row at most WINDOW_PORTABLE_KEYS[64] keys on average run the portable kernel,
    # unmasked ones too (1,025 keys is long enough for three warpgroups without a window, not with one)
    keys = dispatch.WINDOW_PORTABLE_KEYS[64]
    assert rule(64, False, 4, 32, 32, 8192, 8192, window=(512, 512)) is None
    assert rule(64, False, 4, 32, 32, 8192, 8192) == "hopper_wg3_pp"
    n = 32768  # a causal (W, 0) window leaves W + 1 keys but to the first W rows: W (W + 1) / 2 fewer in all
    mean = [(w, ((w + 1) * n - w * (w + 1) // 2) / n) for w in range(keys - 1, keys + 600)]
    at, past = next(w for w, m in mean if m > keys) - 1, next(w for w, m in mean if m > keys)
    mean_keys = functools.partial(dispatch.window_mean_keys, n, n, True)
    assert mean_keys((at, 0)) <= keys < mean_keys((past, 0))
    assert rule(64, True, 1, 32, 32, n, n, window=(at, 0)) is None
    assert rule(64, True, 1, 32, 32, n, n, window=(past, 0)) == "hopper_wg3_pp"
    # d = 128: the same at WINDOW_PORTABLE_KEYS[128], either side or both
    narrow = dispatch.WINDOW_PORTABLE_KEYS[128]
    assert rule(128, True, 4, 32, 32, 8192, 8192, window=(256, 0)) is None
    assert rule(128, True, 4, 32, 32, 8192, 8192, window=(narrow - 1, 0)) is None  # 640 keys
    assert rule(128, True, 4, 32, 32, 8192, 8192, window=(narrow + 100, 0)) == "hopper_persist"
    assert rule(128, False, 4, 32, 8, 8192, 8192, window=(narrow // 2 - 1, narrow // 2)) is None
    assert rule(128, False, 4, 32, 8, 8192, 8192, window=(narrow // 2 + 50, narrow // 2 + 50)) == \
        "hopper_persist"
    assert rule(128, True, 4, 32, 32, 1024, 1024, window=(narrow + 100, 0)) is None  # short rows on average
    assert rule(128, False, 4, 32, 32, 1000, 1000, window=(-1, 300)) == "hopper_persist"  # 755 a row
    assert rule(128, False, 4, 32, 32, 400, 400, window=(-1, 100)) is None  # 288 a row
    assert rule(256, False, 4, 32, 32, 8192, 8192, window=(8, 8)) is None  # no Gluon build at d = 256
    # a window that hides no key the mask shows is no window: the rule without one
    for d, causal, n, window in ((128, True, 1024, (5000, 0)), (128, False, 512, (600, 600)),
                                 (64, True, 8192, (-1, 0)), (64, False, 1024, (-1, 2000))):
        assert rule(d, causal, 4, 32, 32, n, n, window=window) == rule(d, causal, 4, 32, 32, n, n), window
    # GQA does not move the choice
    assert rule(64, False, 4, 32, 32, 4096, 4096) == rule(64, False, 4, 32, 4, 4096, 4096)


def test_the_rule_counts_the_kernels_rows():
    """The rule's rows per CTA are the variants' (NWG x BM of kernels/fwd_hopper.py VARIANTS)."""
    from attnscope.kernels import fwd_hopper

    rows = {name: {c.NWG * c.BM for c in v.configs.values()} for name, v in fwd_hopper.VARIANTS.items()}
    assert rows == {"hopper_persist": {dispatch.PERSIST_ROWS}, "hopper_wg3_pp": {dispatch.WG3_ROWS}}


# --- the score mods: input checks (CPU) ---------------------------------------------------------------------
def _qkv(d=64, nq=64, nk=64, dtype=torch.float16, device="cpu"):
    g = torch.Generator().manual_seed(nq + nk)
    return [torch.randn(1, 4, n, d, generator=g).to(device=device, dtype=dtype) for n in (nq, nk, nk)]


def test_mods_have_one_clear_error_each():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window: expected None or a pair"):
        attnscope.flash_attention(q, k, v, window=(-2, 0))
    with pytest.raises(ValueError, match="softcap"):
        attnscope.flash_attention(q, k, v, softcap=float("nan"))
    with pytest.raises(ValueError, match="sinks: expected a float32 tensor of shape"):
        attnscope.flash_attention(q, k, v, sinks=torch.zeros(3))


_COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from attnscope.kernels import fwd_hopper as hop
for spec in sys.argv[1:]:
    variant, d, causal, mods = spec.split(":")
    src = GluonASTSource(fn=hop.kernel(variant), signature=hop.signature(int(d), "bf16", variant),
                         constexprs=hop.constexprs(int(d), causal == "1", True, variant, int(mods)))
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": hop.NUM_WARPS})
    print(spec, "wgmma.mma_async" in k.asm["ptx"], k.asm["ptx"].count("tanh.approx"))
"""


def test_the_default_variant_builds_with_every_mod_for_sm90_on_the_cpu():
    """window | softcap | sinks compiled for sm_90 without a GPU (one child process; the default variant:
    each build costs ~20 s of CPU, and the GPU tests build every variant); softcap adds its tanh (one
    ``tanh.approx`` per score), which the plain build has none of."""
    pytest.importorskip("triton.experimental.gluon")
    flags = [f"{dispatch.DEFAULT_VARIANT}:64:0:{m}" for m in (0, 7)]
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _COMPILE, *flags], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}
    plain, modded = rows[flags[0]], rows[flags[1]]
    assert plain[0] == modded[0] == "True"
    assert int(plain[1]) == 0 < int(modded[1])


# --- the score mods against float64 (GPU) -------------------------------------------------------------------
MOD_CASES = [  # (causal, window, softcap, sinks scale or None, nq, nk)
    (True, (0, 0), 0.0, None, 300, 300), (True, (1, 0), 0.0, None, 300, 300),
    (True, (200, 0), 0.0, None, 1000, 1000), (False, (150, 150), 0.0, None, 700, 1100),
    (False, (-1, 130), 0.0, None, 1000, 700), (False, (5000, 5000), 0.0, None, 500, 500),
    (False, (0, 0), 0.0, None, 900, 700), (False, (0, 0), 0.0, 3.0, 900, 700),
    (True, None, 30.0, None, 1000, 1000), (False, None, 2.0, None, 600, 600),
    (False, None, 0.0, 30.0, 600, 800), (False, None, 0.0, 1.0, 800, 600),
    (True, (300, 0), 20.0, 2.0, 1000, 1000)]


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="the Gluon Hopper kernel needs an sm_90 GPU")
@pytest.mark.parametrize("variant,d", [(v, d) for v in dispatch.VARIANTS for d in (64, 128)
                                       if v != "hopper_wg3_pp" or d == 64])
@pytest.mark.parametrize("causal,window,softcap,sinks_scale,nq,nk", MOD_CASES)
def test_mods_match_float64(monkeypatch, variant, d, causal, window, softcap, sinks_scale, nq, nk):
    dtype = torch.bfloat16 if d == 128 else torch.float16
    torch.manual_seed(nq * 7 + nk)
    q = torch.randn(2, 8, nq, d, device="cuda", dtype=dtype) * (4.0 if softcap == 2.0 else 1.0)
    k, v = (torch.randn(2, 2, nk, d, device="cuda", dtype=dtype) for _ in range(2))
    sinks = None if sinks_scale is None else torch.randn(8, device="cuda") * sinks_scale
    _poisoned_empty(monkeypatch)
    o, lse = attnscope.flash_attention(q, k, v, causal=causal, return_lse=True, impl=variant, window=window,
                                       softcap=softcap, sinks=sinks)  # a variant's name forces it
    monkeypatch.undo()
    ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                         return_lse=True, window=window, softcap=softcap,
                                         sinks=None if sinks is None else sinks.double().cpu().numpy())
    on, ln = o.double().cpu().numpy(), lse.double().cpu().numpy()
    assert not np.isnan(on).any() and not np.isnan(ln).any(), "an element was not written"
    t_out = torch_attention(q, k, v, causal, window, softcap, sinks)[0]
    t_err = np.abs(t_out.double().cpu().numpy() - ro).max()
    err = np.abs(on - ro).max()
    assert err <= kernel_tolerance(t_err), f"error {err:.3g} > bound {kernel_tolerance(t_err):.3g}"
    fin = np.isfinite(rlse)
    assert np.abs(ln - rlse)[fin].max(initial=0.0) < 1e-3
    assert (ln[~fin] == -np.inf).all() and (on[np.broadcast_to(~fin[..., None], on.shape)] == 0).all()


# --- the kernel's window bounds against model.tiles (GPU) --------------------------------------------------
def _bounds_probe():
    """A one-warp Gluon kernel that writes `fwd_hopper._window`'s (lo, full_lo, full_hi, hi) for each row
    of an int32 [n, 5] table (row0, rows, nq, nk, left, right packed in the first six of 8 columns)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from attnscope.kernels import fwd_hopper as hop

    @gluon.jit
    def probe(T, BN: gl.constexpr):
        i = gl.program_id(0)
        row = T + i * 8
        row0, rows, nq, nk = gl.load(row), gl.load(row + 1), gl.load(row + 2), gl.load(row + 3)
        sc = (1.0, gl.load(row + 4), gl.load(row + 5), 0.0, 0.0, T)
        lo, full_lo, full_hi, hi = hop._window(row0, rows, nq, nk, sc, BN)
        gl.store(row + 4, lo)
        gl.store(row + 5, full_lo)
        gl.store(row + 6, full_hi)
        gl.store(row + 7, hi)

    return probe


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="Gluon kernels need an sm_90 GPU")
def test_kernel_window_bounds_are_the_model_closed_form():
    from attnscope.model.tiles import window_kv_bounds0

    cases = [(r0, rows, nq, nk, left, right) for nq, nk in ((1000, 1000), (700, 1100), (1100, 700))
             for rows in (64, 128, 192) for r0 in range(0, nq, 3 * rows)
             for left, right in ((-1, 0), (0, 0), (1, 0), (300, 0), (150, 150), (-1, 130), (5000, 5000))]
    t = torch.tensor([[*c, 0, 0] for c in cases], dtype=torch.int32, device="cuda")
    _bounds_probe()[(len(cases),)](t, BN=128, num_warps=1)
    for c, got in zip(cases, t[:, 4:].tolist(), strict=True):
        r0, rows, nq, nk, left, right = c
        want = window_kv_bounds0(r0, rows, nq, nk, 128, False, (left, right))
        assert tuple(got) == want, (c, got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="Gluon kernels need an sm_90 GPU")
def test_persistent_work_is_the_model_persistent_item():
    """The persistent kernel's ``_ramp`` and ``_work`` (every CTA, every round) equal `model.tiles`'
    `persistent_ramp` and `persistent_item`: causal, causal windows (an even and an odd ramp, a ramp of
    one, the whole head), windows it leaves unpaired (a right side, keys before the first query's), none."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from attnscope.kernels import fwd_hopper as hop
    from attnscope.model.tiles import persistent_item, persistent_ramp

    @gluon.jit
    def probe(T, R, NQ, NK, LEFT, RIGHT, BH, ROUNDS, CAUSAL: gl.constexpr, MODS: gl.constexpr):
        num_m = gl.cdiv(NQ, 128)
        ramp = hop._ramp(num_m, NQ, NK, LEFT, RIGHT, 128, CAUSAL, MODS)
        n_work = (num_m - ramp + (ramp + 1) // 2) * BH
        gl.store(R, ramp)
        p = gl.program_id(0)
        for i in range(ROUNDS):
            valid, pid_bh, start_m = hop._work(i, num_m, ramp, n_work)
            row = T + (i * gl.num_programs(0) + p) * 3
            gl.store(row, valid.to(gl.int32))
            gl.store(row + 1, pid_bh)
            gl.store(row + 2, start_m)

    ctas = 5
    for nq, nk, causal, window in ((1000, 1000, True, None), (1000, 1000, False, None),
                                   (3000, 3000, False, (900, 0)), (3000, 3000, False, (1000, 0)),
                                   (3000, 3000, False, (100, 0)), (3000, 3000, False, (-1, 0)),
                                   (3000, 3100, False, (700, 0)), (1000, 3000, False, (2500, 0)),
                                   (3000, 3000, False, (300, 40)), (2000, 2000, False, (5000, 0))):
        num_m, bh = -(-nq // 128), 3
        ramp = persistent_ramp(num_m, 128, nq, nk, causal, window)
        items = num_m - ramp + (ramp + 1) // 2
        rounds = -(-items * bh // ctas) * (2 if ramp else 1)
        t = torch.full((rounds * ctas, 3), -7, dtype=torch.int32, device="cuda")
        r = torch.full((1,), -7, dtype=torch.int32, device="cuda")
        left, right = window or (-1, -1)
        probe[(ctas,)](t, r, nq, nk, left, right, bh, rounds, causal, 1 if window else 0, num_warps=1)
        assert r.item() == ramp, (nq, nk, causal, window)
        want = []
        for i in range(rounds):
            for p in range(ctas):
                q = (i // 2 if ramp else i) * ctas + p
                if q >= items * bh:
                    want.append(None)
                    continue
                tile = persistent_item(q % items, num_m, ramp)[i % 2 if ramp else 0]
                want.append(None if tile is None else [1, q // items, tile])
        got = [row if row[0] == 1 else None for row in t.tolist()]
        assert got == want, (nq, nk, causal, window)


# --- the host path on the GPU: planned launches and CUDA-graph capture -----------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (compiled kernels)")
@pytest.mark.parametrize("impl,d", [("portable", 64), *((v, d) for v in dispatch.VARIANTS for d in (64, 128)
                                                         if v != "hopper_wg3_pp" or d == 64)])
def test_planned_launches_and_graph_replays_equal_a_fresh_plan(impl, d):
    """Per forced variant: a call of a planned layout with new values, and a CUDA-graph replay of a captured
    call on those values, give a freshly planned call's output and LSE bit for bit."""
    from attnscope.kernels import fwd

    if impl != "portable" and not _is_sm90():
        pytest.skip("the Gluon Hopper kernels need an sm_90 GPU")
    gen = torch.Generator(device="cuda").manual_seed(d)
    a, b = ([torch.randn(2, h, 300, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (8, 2, 2)]
            for _ in range(2))

    def call(*t):
        return attnscope.flash_attention(*t, causal=True, return_lse=True, impl=impl)

    fwd.clear_plan_cache()
    call(*a)  # plans the layout
    planned = call(*b)
    fwd.clear_plan_cache()
    fresh = call(*b)
    static = [t.clone() for t in a]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(*static)  # warm-up on a side stream, as torch.cuda.graph recommends
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(*static)
    for s, t in zip(static, b, strict=True):
        s.copy_(t)
    graph.replay()
    torch.cuda.synchronize()
    for name, x, y, z in zip(("o", "lse"), planned, fresh, captured, strict=True):
        assert torch.equal(x, y) and torch.equal(z, y), (impl, d, name)
