"""Score mods (sliding window, softcap, sinks; issue 35) in the portable forward and the backward, and the
``deterministic`` keyword of `attnscope.flash_attention`, against the float64 reference.

Bound: `checks.kernel_tolerance`: outputs within 2 x PyTorch's own error at the same dtype (math attention
with the same mask, cap and sink column) plus 1e-3; gradients (dQ, dK, dV, dsinks) within 3 x. The in-kernel
window bounds are held against `model.tiles.window_kv_bounds0` (forward, dQ) and `reference.permitted`
(the dK/dV kernel's mirror bounds). CPU: TRITON_INTERPRET=1 and tiny shapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope import checks, reference  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import _common  # noqa: E402
from attnscope.model.tiles import window_kv_bounds0  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

fwd = pytest.importorskip("attnscope.kernels.fwd")
bwd = pytest.importorskip("attnscope.kernels.bwd")
import attnscope  # noqa: E402
from attnscope.kernels import _tl  # noqa: E402

DEVICE = kernel_device()


def _inputs(b, hq, hkv, nq, nk, d, dtype, seed, amp=1.0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, hq, nq, d, generator=g) * amp).to(dtype).to(device)
    k = (torch.randn(b, hkv, nk, d, generator=g) * amp).to(dtype).to(device)
    v, do = torch.randn(b, hkv, nk, d, generator=g), torch.randn(b, hq, nq, d, generator=g)
    return q, k, v.to(dtype).to(device), do.to(dtype).to(device)


def _n(t):
    return t.detach().double().cpu().numpy()


def _err(a, r):
    a = _n(a)
    assert np.isfinite(a).all(), "NaN/inf"
    return float(np.abs(a - r).max(initial=0.0))


def _check_case(b, group, nq, nk, d, dtype, causal, window, softcap, sink_vals, amp, seed, deterministic,
                device=DEVICE):
    """Forward and backward (autograd, with an LSE gradient) of one call against float64."""
    dt = getattr(torch, dtype)
    q, k, v, do = _inputs(b, group, 1, nq, nk, d, dt, seed, amp, device)
    sinks = None if sink_vals is None else torch.tensor(sink_vals, dtype=torch.float32, device=device)
    mods = dict(window=window, softcap=softcap)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s_leaf = None if sinks is None else sinks.clone().requires_grad_()
    o, lse = attnscope.flash_attention(*leaves, causal=causal, return_lse=True, sinks=s_leaf,
                                       deterministic=deterministic, **mods)
    dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device) * 0.3
    torch.autograd.backward((o, lse), (do, dlse))

    sk64 = None if sinks is None else _n(sinks)
    ro, rlse = reference.naive_attention(_n(q), _n(k), _n(v), causal=causal, return_lse=True, sinks=sk64,
                                         **mods)
    ref_g = reference.attention_backward(_n(do), _n(q), _n(k), _n(v), ro, rlse, causal=causal, sinks=sk64,
                                         dlse=_n(dlse), **mods)
    t_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    t_sink = None if sinks is None else sinks.clone().requires_grad_()
    to, tlse = checks.torch_attention(*t_leaves, causal, window, softcap, t_sink)
    torch.autograd.backward((to, tlse), (do, dlse.masked_fill(torch.isinf(tlse), 0.0)))

    assert o.shape == q.shape and o.dtype == dt and lse.dtype == torch.float32
    err, t_err = _err(o, ro), _err(to, ro)
    assert err <= checks.kernel_tolerance(t_err), f"o: {err:.3g} > 2 x torch's {t_err:.3g} + 1e-3"
    lse_np = _n(lse)
    empty = ~reference.permitted(nq, nk, causal, window).any(-1)  # [Nq] rows with no visible key
    fin = np.isfinite(rlse)
    assert (np.isfinite(lse_np) == fin).all() and not np.isnan(lse_np).any()
    assert np.abs(lse_np[fin] - rlse[fin]).max(initial=0.0) <= 1e-3 * max(1.0, np.abs(rlse[fin]).max())
    assert (_n(o)[:, :, empty] == 0).all()  # no key: output 0 (with sinks too: the sink has no value)
    if sinks is None:
        assert (lse_np[:, :, empty] == -np.inf).all()
    else:  # the sink alone
        assert np.allclose(lse_np[:, :, empty], sk64[None, :, None], atol=1e-5)
    got = [t.grad for t in leaves] + ([] if sinks is None else [s_leaf.grad])
    want = [t.grad for t in t_leaves] + ([] if sinks is None else [t_sink.grad])
    for name, a, t, r in zip(("dq", "dk", "dv", "dsinks")[:len(got)], got, want, ref_g, strict=True):
        assert a.shape == t.shape and a.dtype == t.dtype, name
        err, t_err = _err(a, r), _err(t, r)
        assert err <= checks.kernel_tolerance(t_err, checks.GRAD_FACTOR), \
            f"{name}: {err:.3g} > 3 x torch's {t_err:.3g} + 1e-3"


W = 20  # a window that is not a multiple of the interpreter's tiles (16 and 32)
# (b, group, nq, nk, dtype, causal, window, softcap, sinks, input amplitude)
CASES = [
    (1, 1, 64, 64, "float16", False, (0, 0), 0.0, None, 1.0),
    (1, 2, 48, 48, "bfloat16", False, (1, 0), 0.0, None, 1.0),
    (2, 1, 80, 80, "float16", False, (W, 0), 0.0, None, 1.0),
    (1, 2, 70, 70, "bfloat16", False, (13, 13), 0.0, None, 1.0),
    (1, 1, 57, 80, "float16", False, (-1, 7), 0.0, None, 1.0),  # Nq != Nk, right side only
    (1, 2, 40, 40, "float16", True, (100, 5), 0.0, None, 1.0),  # window > N; causal forces right = 0
    (1, 1, 80, 30, "bfloat16", False, (2, 0), 0.0, None, 1.0),  # Nq > Nk: rows with no key: 0, -inf
    (1, 2, 80, 30, "float16", False, (2, 0), 0.0, [0.7, -1.5], 1.0),  # ... with sinks: the sink alone
    (1, 1, 64, 64, "float16", True, None, 10.0, None, 4.0),  # softcap on large logits
    (1, 2, 50, 70, "bfloat16", True, (16, 0), 30.0, None, 3.0),  # softcap + window + GQA, ragged
    (1, 2, 64, 64, "float16", False, None, 0.0, [-30.0, 10.0], 1.0),  # sinks very negative / positive
    (1, 4, 33, 77, "bfloat16", True, (9, 0), 5.0, [0.5, -2.0, 3.0, 1.0], 2.0),  # all three, causal, GQA
    (1, 2, 20, 45, "float16", False, (0, 0), 0.0, [-30.0, 10.0], 1.0),  # (0, 0) with Nq != Nk and sinks
    # a band whose two edges each straddle several tiles, with whole tiles between: the one masked loop
    # walks left-edge then right-edge tiles (forward, dQ and dK/dV)
    (1, 2, 96, 96, "bfloat16", False, (37, 21), 0.0, None, 1.0),
]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_mods_forward_and_backward_match_float64(monkeypatch, i):
    b, group, nq, nk, dtype, causal, window, softcap, sinks, amp = CASES[i]
    deterministic = i % 2 == 0
    if not deterministic:  # deterministic=False takes the atomic dQ here (covers the mods in that path)
        monkeypatch.setattr(bwd, "ATOMIC_DQ_BY_DEFAULT", True)
    _check_case(b, group, nq, nk, 64, dtype, causal, window, softcap, sinks, amp, 100 + i, deterministic)


def test_unbounded_window_is_the_plain_kernel():
    """window (-1, -1) and causal with (-1, x) are today's kernels, bit for bit; (-1, 0) alone is causal."""
    q, k, v, _ = _inputs(1, 2, 1, 40, 56, 64, torch.float16, 1)
    plain, causal = attnscope.flash_attention(q, k, v), attnscope.flash_attention(q, k, v, causal=True)
    assert torch.equal(attnscope.flash_attention(q, k, v, window=(-1, -1)), plain)
    assert torch.equal(attnscope.flash_attention(q, k, v, causal=True, window=(-1, 9)), causal)
    assert (attnscope.flash_attention(q, k, v, window=(-1, 0)).float() - causal.float()).abs().max() < 1e-3


def test_window_rows_whose_first_tiles_are_masked_keep_small_scores():
    """Every score very negative (s * scale * log2(e) ~ -370): a row whose first loaded KV tile is wholly
    masked must not floor its running max at 0 (every weight would underflow to 0, the output to 0)."""
    q, k, v, _ = _inputs(1, 1, 1, 64, 64, 64, torch.float16, 9)
    q, k = -torch.ones_like(q), torch.ones_like(k)
    for window, causal in (((3, 0), False), ((5, 5), False), ((20, 0), True)):
        o = attnscope.flash_attention(q, k, v, causal=causal, scale=4.0, window=window)
        ro = reference.naive_attention(_n(q), _n(k), _n(v), causal=causal, scale=4.0, window=window)
        assert np.abs(_n(o) - ro).max() < 1e-2, window


def _probe_bounds(fn, n_tiles, *args, **const):
    triton, tl = _tl.triton, pytest.importorskip("triton.language")

    @triton.jit
    def probe(OUT, NQ, NK, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV: tl.constexpr):
        i = tl.program_id(0)
        if KV:
            a, b_, c, d = bwd._q_bounds_window(i * BLOCK_N, NQ, NK, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        else:
            a, b_, c, d = _tl._kv_bounds_window(i, NQ, NK, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        tl.store(OUT + 4 * i, a)
        tl.store(OUT + 4 * i + 1, b_)
        tl.store(OUT + 4 * i + 2, c)
        tl.store(OUT + 4 * i + 3, d)

    out = torch.full((4 * n_tiles,), -7, dtype=torch.int32, device=DEVICE)
    probe[(n_tiles,)](out, *args, KV=fn == "q", **const)
    return out.view(-1, 4).tolist()


def _random_windows(rng, count):
    for _ in range(count):
        nq, nk = (int(x) for x in rng.integers(1, 200, 2))
        bm, bn = int(rng.choice([16, 32, 64])), int(rng.choice([16, 32, 64]))
        causal = bool(rng.integers(2))
        window = tuple(int(rng.choice([-1, 0, 1, int(rng.integers(0, 90)), 300])) for _ in range(2))
        if window == (-1, -1) or (causal and window[0] == -1):
            window = (int(rng.integers(0, 90)), window[1])
        yield nq, nk, bm, bn, causal, window


def test_kv_bounds_window_matches_tiles_py():
    """The forward's (and dQ's) in-kernel window bounds equal `model.tiles.window_kv_bounds0`, with the
    ragged last KV tile always masked."""
    rng = np.random.default_rng(0)
    for nq, nk, bm, bn, causal, window in _random_windows(rng, 30):
        mods = _common.check_mods(torch, causal, window, 0.0, None, 1, torch.device(DEVICE))
        left, right = _tl.window_args(mods.left, mods.right, nq, nk)
        tiles = math.ceil(nq / bm)
        got = _probe_bounds("kv", tiles, nq, nk, left, right, BLOCK_M=bm, BLOCK_N=bn)
        for m in range(tiles):
            lo, full_lo, full_hi, hi = window_kv_bounds0(m * bm, min(bm, nq - m * bm), nq, nk, bn, causal,
                                                         window)
            full_hi = min(full_hi, (nk // bn) * bn)  # the ragged last tile is bounds-checked
            if full_lo >= full_hi:
                full_lo = full_hi = hi
            assert got[m] == [lo, full_lo, full_hi, hi], (nq, nk, bm, bn, causal, window, m, got[m])


def test_q_bounds_window_mirror_matches_permitted():
    """The dK/dV kernel's per-KV-tile query bounds: it loads exactly the query tiles that see some key of
    the tile (`reference.permitted`), and runs unmasked exactly those whose rows see all of it."""
    rng = np.random.default_rng(1)
    for nq, nk, bm, bn, causal, window in _random_windows(rng, 30):
        mods = _common.check_mods(torch, causal, window, 0.0, None, 1, torch.device(DEVICE))
        left, right = _tl.window_args(mods.left, mods.right, nq, nk)
        perm = reference.permitted(nq, nk, causal, window)
        tiles_q, tiles_k = math.ceil(nq / bm), math.ceil(nk / bn)
        got = _probe_bounds("q", tiles_k, nq, nk, left, right, BLOCK_M=bm, BLOCK_N=bn)
        for j in range(tiles_k):
            blk = [perm[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn] for i in range(tiles_q)]
            seen = [i * bm for i in range(tiles_q) if blk[i].any()]
            whole = [i * bm for i in range(tiles_q) if blk[i].all() and (j + 1) * bn <= nk]
            lo, full_lo, full_hi, hi = got[j]
            assert lo <= full_lo <= full_hi <= hi and lo % bm == 0 and hi % bm == 0, (got[j], j)
            assert list(range(lo, hi, bm)) == seen, (nq, nk, bm, bn, causal, window, j, got[j])
            assert list(range(full_lo, full_hi, bm)) == whole, (nq, nk, bm, bn, causal, window, j, got[j])


def test_mods_inside_torch_compile_and_opcheck():
    q, k, v, _ = _inputs(1, 2, 1, 20, 24, 64, torch.float16, 4)
    sinks = torch.tensor([0.5, -1.0], device=DEVICE, requires_grad=True)
    w = torch.randn(64, 64, dtype=torch.float16, device=DEVICE, requires_grad=True)

    def loss_fn(q, k, v, w, sinks):
        o = attnscope.flash_attention(q @ w, k, v, causal=True, window=(5, 0), softcap=20.0, sinks=sinks,
                                      deterministic=True)
        return o.float().square().sum()

    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")  # fullgraph: a break raises
    compiled(q, k, v, w, sinks).backward()
    g_w, g_s = w.grad.clone(), sinks.grad.clone()
    w.grad = sinks.grad = None
    loss_fn(q, k, v, w, sinks).backward()
    assert torch.equal(g_w, w.grad) and torch.equal(g_s, sinks.grad) and g_s.abs().min() > 0
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    s_leaf = sinks.detach().clone().requires_grad_()
    torch.library.opcheck(fwd._op, (*leaves, False, 0.125, True, None, "auto", [3, 2], 7.0, s_leaf, False),
                          test_utils=("test_schema", "test_faketensor"))


def _record_backward_mode(monkeypatch):
    seen = []
    real = bwd.flash_attention_backward

    def spy(*a, **kw):
        seen.append(kw["deterministic"])
        return real(*a, **kw)

    monkeypatch.setattr(bwd, "flash_attention_backward", spy)
    return seen


@pytest.mark.parametrize("atomic_default", [False, True])
def test_deterministic_keyword_picks_the_backward_mode(monkeypatch, atomic_default):
    """deterministic=True always runs the separate dQ pass (bit-reproducible: two runs, identical bits);
    False runs `bwd.ATOMIC_DQ_BY_DEFAULT`'s mode; both give the same gradients within fp32 rounding."""
    monkeypatch.setattr(bwd, "ATOMIC_DQ_BY_DEFAULT", atomic_default)
    seen = _record_backward_mode(monkeypatch)
    q, k, v, do = _inputs(1, 2, 1, 24, 40, 64, torch.float16, 7)
    grads = {}
    for det in (True, True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        attnscope.flash_attention(*leaves, causal=True, window=(12, 0), deterministic=det).backward(do)
        grads.setdefault(det, []).append([t.grad for t in leaves])
    assert seen == [True, True, not atomic_default]
    assert all(torch.equal(a, b) for a, b in zip(*grads[True], strict=True))
    for a, b in zip(grads[True][0], grads[False][0], strict=True):
        assert (a.float() - b.float()).abs().max() <= 2e-3 * b.float().abs().max()


def _z(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(window=(-2, 0)), InputError, "window"),
    (dict(window=(3, 1.5)), InputError, "window"),
    (dict(window=(3,)), InputError, "window"),
    (dict(window="3,3"), InputError, "window"),
    (dict(softcap=-1.0), InputError, "softcap"),
    (dict(softcap=float("nan")), InputError, "softcap"),
    (dict(softcap=float("inf")), InputError, "softcap"),
    (dict(sinks=torch.zeros(3)), InputError, "sinks"),
    (dict(sinks=torch.zeros(2, dtype=torch.float16)), InputError, "sinks"),
    (dict(sinks=[0.0, 0.0]), InputError, "sinks"),
    (dict(sinks=torch.zeros(2, device="meta")), InputError, "sinks"),
    (dict(deterministic=1), InputError, "deterministic"),
])
@pytest.mark.parametrize("grad", [False, True])
def test_bad_mods_are_clear_errors(kw, exc, msg, grad):
    q, k, v = (_z(1, 2, 16, 64).requires_grad_(grad), _z(1, 1, 16, 64), _z(1, 1, 16, 64))
    with pytest.raises(exc, match=msg):
        attnscope.flash_attention(q, k, v, **kw)


def test_backward_launcher_checks_mods():
    q, k, v, do = _inputs(1, 2, 1, 16, 16, 64, torch.float16, 3)
    o, lse = attnscope.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(InputError, match="sinks"):
        bwd.flash_attention_backward(do, q, k, v, o, lse, False, None, sinks=torch.zeros(3))
    with pytest.raises(InputError, match="window"):
        bwd.flash_attention_backward(do, q, k, v, o, lse, False, None, window=(0, -3))


# ---- GPU: full size -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal,window,softcap,sinks", [
    (True, (256, 0), 0.0, None),
    (False, (300, 77), 0.0, None),
    (True, None, 50.0, None),
    (True, None, 0.0, [-30.0, 10.0, 0.5, -1.0]),
    (True, (1000, 0), 30.0, [0.0, 1.0, -2.0, 3.0]),
])
def test_gpu_mods_full_size(d, dtype, causal, window, softcap, sinks):
    amp = 3.0 if softcap else 1.0
    _check_case(1, 4, 2048, 2048, d, dtype, causal, window, softcap, sinks, amp, d, True, device="cuda")
    _check_case(1, 4, 1000, 1537, d, dtype, causal, window, softcap, sinks, amp, d + 1, False,
                device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_tanh_is_the_hardware_one_within_its_bound():
    """The kernels' tanh on a GPU (`_tl._tanh_approx`, ``tanh.approx.f32``) against float64: relative error
    below 2^-10 over [-20, 20] and at tiny and huge x, exactly x for a subnormal x (a huge softcap)."""
    triton, tl = _tl.triton, pytest.importorskip("triton.language")

    @triton.jit
    def probe(X, Y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(Y + offs, _tl.tanh_(tl.load(X + offs)))

    assert _tl.tanh_ is _tl._tanh_approx
    grid = np.concatenate([np.linspace(-20, 20, 3001), [1e-39, -3e-42, 1e-30, 2e-4, 60.0, -1e30, 0.0]])
    x = torch.zeros(4096, dtype=torch.float32, device="cuda")
    x[:grid.size] = torch.tensor(grid, dtype=torch.float32)
    y = torch.empty_like(x)
    probe[(1,)](x, y, N=4096)
    xs, ys = x.double().cpu().numpy(), y.double().cpu().numpy()
    want = np.tanh(xs)
    tiny = np.abs(xs) < 2.0 ** -126  # subnormal (and 0)
    assert (ys[tiny] == xs[tiny]).all()
    big = ~tiny
    assert (np.abs(ys[big] - want[big]) <= 2.0 ** -10 * np.abs(want[big])).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_auto_runs_the_rules_kernel_with_mods():
    """With a window, impl='auto' launches the kernel `model.dispatch.hopper_variant` names (window-aware)."""
    from attnscope.model import dispatch

    sm90 = torch.cuda.get_device_capability() == (9, 0)
    # d = 64 at W = 1k and d = 128 at W = 256: the portable kernel in the window's tiles
    for d, window in ((128, (1024, 0)), (64, (1024, 0)), (128, (256, 0))):
        q, k, v, _ = _inputs(1, 4, 4, 4096, 4096, d, torch.bfloat16, 5, device="cuda")
        _, _, compiled = fwd.launch(q, k, v, True, None, False, None, "auto", window=window)
        want = dispatch.hopper_variant(d, True, 1, 4, 4, 4096, 4096, window=window) if sm90 else None
        hopper = compiled.name.startswith("_attnscope_fwd_hopper")
        assert hopper == (want is not None), (d, window, compiled.name, want)
        if sm90:
            assert hopper == (window[0] > dispatch.WINDOW_PORTABLE_KEYS[d]), (d, window, compiled.name)


@pytest.mark.parametrize("softcap", [1e3, 1e6, 1e10, 1e38])
def test_a_huge_softcap_is_no_softcap(softcap):
    """softcap * tanh(s / softcap) -> s as softcap grows: the kernels' tanh must not cancel to 0 for tiny
    arguments (a huge cap once gave the plain average of V). Forward, backward and decode against float64,
    with the one rule; PyTorch's own error is that of the uncapped attention it tends to."""
    q, k, v, do = _inputs(1, 2, 1, 24, 24, 64, torch.float16, 11)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = attnscope.flash_attention(*leaves, causal=True, softcap=softcap)
    o.backward(do)
    t_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    t_o, _ = checks.torch_attention(*t_leaves, True)  # PyTorch's error bar: no cap (1e10 overflows fp16)
    t_o.backward(do)
    n = [_n(t) for t in (q, k, v, do)]
    ro, rlse = reference.naive_attention(*n[:3], causal=True, softcap=softcap, return_lse=True)
    rg = reference.attention_backward(n[3], *n[:3], ro, rlse, causal=True, softcap=softcap)
    t_err = _err(t_o, ro)
    assert _err(o, ro) <= checks.kernel_tolerance(t_err), (_err(o, ro), t_err)
    for g, tg, r in zip((x.grad for x in leaves), (x.grad for x in t_leaves), rg, strict=True):
        bound = checks.kernel_tolerance(_err(tg, r), checks.GRAD_FACTOR)
        assert _err(g, r) <= bound, (_err(g, r), bound)
    lens = torch.tensor([24], dtype=torch.int32, device=DEVICE)
    od = attnscope.flash_decode(q[:, :, -1:], k, v, lens, softcap=softcap)
    rd = reference.naive_attention(n[0][:, :, -1:], n[1], n[2], softcap=softcap)
    assert _err(od, rd) <= checks.kernel_tolerance(t_err), _err(od, rd)


# (Hq, Hkv, Nq, Nk, dtype, causal, window, softcap, sinks, deterministic, strided q/k/v views)
SEMANTICS = [
    (4, 2, 17, 33, "float16", False, (5, 0), 0.0, (0.5, -1.0, 2.0, 0.0), False, True),
    (4, 1, 33, 17, "bfloat16", True, None, 5.0, None, True, False),  # rows with no key: LSE -inf
    (4, 4, 17, 17, "float16", False, (-1, 6), 0.0, (3.0, 0.0, -2.0, 1.0), True, False),
    (2, 1, 33, 33, "float16", True, (4, 4), 10.0, (1.0, -1.0), False, True),
]


@pytest.mark.parametrize("i", range(len(SEMANTICS)))
def test_autograd_semantics_every_output_and_input_against_float64(i):
    """`grad_semantics.check_semantics`: some of q, k, v, sinks requiring grad, a non-contiguous dO and an
    expanded dLSE, two backward passes, autograd.grad with allow_unused, a call under no_grad."""
    from grad_semantics import attention, check_semantics

    hq, hkv, nq, nk, dtype, causal, window, softcap, sinks, det, strided = SEMANTICS[i]
    q, k, v, _ = _inputs(2, hq, hkv, nq, nk, 64, getattr(torch, dtype), 700 + i)
    if strided:  # [B, N, H, d] buffers seen as [B, H, N, d]
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    sk = None if sinks is None else torch.tensor(sinks, dtype=torch.float32, device=DEVICE)
    mods = dict(causal=causal, window=window, softcap=softcap)

    def kernel(q, k, v, s):
        return attnscope.flash_attention(q, k, v, return_lse=True, sinks=s, deterministic=det, **mods)

    check_semantics(kernel, lambda q, k, v, s, f64: attention(q, k, v, s, f64, **mods), (q, k, v, sk),
                    (2, hq, nq, 64), (2, hq, nq), seed=i)
