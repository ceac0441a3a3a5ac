"""Head dim 256 (Gemma's) on every portable kernel: the forward, its backward, the packed (varlen) forward and
backward, and decode on dense, paged and e4m3 caches with chunked queries, against float64 (CPU:
TRITON_INTERPRET=1, small shapes; on a GPU the `gpu` tests run the table configs at larger shapes).

Bound (STYLE.md, flash-attn's test suite): the kernel's max error against float64 is at most twice PyTorch's
own attention error at the same dtype against the same reference, plus 1e-3 (3 x for gradients).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope import checks, reference  # noqa: E402
from attnscope.kernels import _common, bwd, fwd  # noqa: E402
from attnscope.kernels.decode import heuristics  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

DEVICE = kernel_device()
D = 256


def _n(t):
    return t.detach().double().cpu().numpy()


def _rand(shape, dtype, g, scale=1.0, device=DEVICE):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


def _check(name, got, torch_out, ref, factor=2.0):
    got, ref = _n(got), np.asarray(ref)
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    assert np.isfinite(got).all(), f"{name}: NaN/inf"
    err = np.abs(got - ref).max()
    torch_err = np.abs(_n(torch_out) - ref).max()
    assert err <= checks.kernel_tolerance(torch_err, factor), \
        f"{name}: kernel error {err:.3g} > {factor:g} x torch's {torch_err:.3g} + 1e-3"


def test_256_is_supported_and_every_table_has_a_config(monkeypatch):
    """d = 256 is accepted by the one head-dim check and has a config in each kernel's table (forward, the
    two backward kernels, decode tiles of d = 128's bytes: half the keys), not only in the interpreter's."""
    assert D in _common.SUPPORTED_HEAD_DIMS
    _common.check_head_dim(D)
    monkeypatch.setattr(fwd, "interpreting", lambda: False)
    monkeypatch.setattr(heuristics, "interpreting", lambda: False)
    for d in _common.SUPPORTED_HEAD_DIMS:
        assert d in bwd.DKDV_CONFIGS and d in bwd.DQ_CONFIGS
        for causal in (False, True):
            assert fwd.pick_config(d, causal, 1 << 20).BLOCK_N >= 16
    for block_m, page, fp8, programs in ((16, 0, False, 1), (16, 64, False, 1), (128, 16, False, 1),
                                         (16, 0, True, 1), (16, 0, True, 500), (16, 16, True, 1)):
        at128 = heuristics._block_config(block_m, page, fp8, programs, 132, 128)
        at256 = heuristics._block_config(block_m, page, fp8, programs, 132, 256)
        assert at256["BLOCK_N"] == at128["BLOCK_N"] // 2, (block_m, page, fp8)
        assert at256["num_warps"] == at128["num_warps"]
    assert heuristics._block_config(16, 0, head_dim=64) == heuristics._block_config(16, 0)
    with pytest.raises(NotImplementedError, match="head_dim 96 is not supported; supported: 64, 128, 256"):
        _common.check_head_dim(96)


def test_an_unbuilt_head_dims_error_names_an_exact_workaround():
    """head_dim 96's error says: zero-pad q, k, v to 128 and pass scale = 96**-0.5. Done as it says (through
    autograd), the output's first 96 columns and the gradients match float64 attention at d = 96 (causal),
    within the one rule."""
    import re

    with pytest.raises(NotImplementedError) as e:
        _common.check_head_dim(96)
    to = int(re.search(r"zero-padding q, k and v to (\d+) .* scale=96\*\*-0\.5", str(e.value)).group(1))
    g = torch.Generator().manual_seed(96)
    q, k, v, do = (_rand((1, 2, 40, 96), torch.bfloat16, g) for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    pad = [torch.nn.functional.pad(t, (0, to - 96)) for t in leaves]
    out = attnscope.flash_attention(*pad, causal=True, scale=96 ** -0.5)[..., :96]
    out.backward(do)
    assert out.shape == (1, 2, 40, 96)

    def attention(dtype):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        s = (x[0] @ x[1].transpose(-1, -2)) * 96 ** -0.5
        s = s.masked_fill(torch.ones(40, 40, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        o = torch.softmax(s.float(), -1).to(dtype) @ x[2]
        o.backward(do.to(dtype))
        return o, [t.grad for t in x]
    ref, ref_grads = attention(torch.float64)
    own, own_grads = attention(torch.bfloat16)
    _check("out", out, own, _n(ref))
    for name, got, mine, want in zip("qkv", leaves, own_grads, ref_grads, strict=True):
        _check(f"d{name}", got.grad, mine, _n(want), factor=3.0)


FWD_CASES = [  # nq, nk, group, causal, dtype, window, softcap, sinks
    (37, 70, 2, True, "bfloat16", None, 0.0, False),
    (70, 37, 1, False, "float16", None, 0.0, False),
    (50, 50, 2, False, "bfloat16", (20, 5), 30.0, True),
    (45, 61, 1, True, "float16", (16, 0), 0.0, True),
]


def _fwd_backward_case(nq, nk, group, causal, dtype, window, softcap, sinks, device, impl, d=D):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(nq * 31 + nk + group)
    q = _rand((2, 2 * group, nq, d), dt, g, device=device).requires_grad_()
    k = _rand((2, 2, nk, d), dt, g, device=device).requires_grad_()
    v = _rand((2, 2, nk, d), dt, g, device=device).requires_grad_()
    do = _rand((2, 2 * group, nq, d), dt, g, device=device)
    sk = torch.tensor([0.5, -1.0, 2.0, 0.0][:2 * group], device=device) if sinks else None  # fp32
    leaves = (q, k, v) if sk is None else (q, k, v, sk.requires_grad_())
    mods = dict(window=window, softcap=softcap)
    o, lse = attnscope.flash_attention(q, k, v, causal=causal, return_lse=True, sinks=sk, impl=impl, **mods)
    got = torch.autograd.grad(o, leaves, do)

    sk64 = None if sk is None else _n(sk)
    ro, rlse = reference.naive_attention(_n(q), _n(k), _n(v), causal=causal, return_lse=True, sinks=sk64,
                                         **mods)
    ref = reference.attention_backward(_n(do), _n(q), _n(k), _n(v), ro, rlse, causal=causal, sinks=sk64,
                                       **mods)
    copies = [t.detach().clone().requires_grad_() for t in leaves]
    to, _ = checks.torch_attention(*copies[:3], causal, window, softcap, copies[3] if sinks else None)
    torch_g = torch.autograd.grad(to, copies, do)
    _check("o", o, to, ro)
    finite = np.isfinite(rlse)
    assert np.abs(_n(lse)[finite] - rlse[finite]).max() < 1e-3 and (~np.isfinite(_n(lse)[~finite])).all()
    for name, a, t, r in zip(("q", "k", "v", "sinks")[:len(got)], got, torch_g, ref, strict=True):
        _check(f"d{name}", a, t, r, checks.GRAD_FACTOR)


@pytest.mark.parametrize("nq,nk,group,causal,dtype,window,softcap,sinks", FWD_CASES)
def test_forward_and_backward_match_float64(nq, nk, group, causal, dtype, window, softcap, sinks):
    """flash_attention at d = 256 (GQA, ragged Nq != Nk, both masks and dtypes, window, softcap, sinks):
    the output, the LSE and autograd's dQ, dK, dV against float64."""
    _fwd_backward_case(nq, nk, group, causal, dtype, window, softcap, sinks, DEVICE, "portable")


def test_auto_runs_the_portable_kernels_at_256(monkeypatch):
    """No Gluon Hopper kernel is built for d = 256: on sm_90 `impl="auto"` takes the portable forward and
    backward (dense and packed)."""
    from types import SimpleNamespace

    from attnscope.kernels import fwd_hopper, varlen_bwd
    from attnscope.model import dispatch

    assert not any(fwd_hopper.supports(name, D, c) for name in dispatch.VARIANTS for c in (False, True))
    for causal in (False, True):
        assert dispatch.hopper_variant(D, causal, 1, 32, 8, 8192, 8192) is None
        assert not dispatch.hopper_backward_ok(D, causal)
    monkeypatch.setattr(fwd, "_hopper_possible", lambda q: None)  # pretend sm_90
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: SimpleNamespace(multi_processor_count=132))
    q = torch.empty(1, 8, 512, D, dtype=torch.bfloat16)
    assert fwd._pick_impl("auto", q, True, D ** -0.5, None, q) == "portable"
    monkeypatch.setattr(varlen_bwd, "hopper_unavailable", lambda torch, q: None)
    mods = _common.Mods(-1, -1, 0.0, None)
    assert varlen_bwd.pick_impl("auto", q[0].transpose(0, 1), True, mods, D ** -0.5) == "portable"


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_forward_and_backward_match_float64(causal):
    """flash_attention_varlen at d = 256, a packed batch with an empty and a one-token sequence, GQA: each
    sequence's output and dQ, dK, dV against float64 attention on that sequence alone."""
    _varlen_case(causal, [23, 0, 1, 40], [30, 5, 1, 40], DEVICE)


def _varlen_case(causal, lens_q, lens_k, device, d=D):
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32, device=device)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(256)
    q = _rand((sum(lens_q), 4, d), torch.bfloat16, g, device=device).requires_grad_()
    k = _rand((sum(lens_k), 2, d), torch.bfloat16, g, device=device).requires_grad_()
    v = _rand((sum(lens_k), 2, d), torch.bfloat16, g, device=device).requires_grad_()
    do = _rand((sum(lens_q), 4, d), torch.bfloat16, g, device=device)
    o = attnscope.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    for i in range(len(lens_q)):
        sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        if lens_q[i] == 0:
            continue

        def head_first(t):
            return t.transpose(0, 1).unsqueeze(0)  # [n, H, d] -> [1, H, n, d]

        qs, ks, vs, dos = (head_first(t[s]) for t, s in ((q, sq), (k, sk), (v, sk), (do, sq)))
        ro, rlse = reference.naive_attention(_n(qs), _n(ks), _n(vs), causal=causal, return_lse=True)
        ref = reference.attention_backward(_n(dos), _n(qs), _n(ks), _n(vs), ro, rlse, causal=causal)
        leaves = [t.detach().clone().requires_grad_() for t in (qs, ks, vs)]
        to, _ = checks.torch_attention(*leaves, causal)
        torch_g = torch.autograd.grad(to, leaves, dos)
        _check(f"o[{i}]", head_first(o[sq]), to, ro)
        for name, a, t, r in zip("qkv", (dq[sq], dk[sk], dv[sk]), torch_g, ref, strict=True):
            _check(f"d{name}[{i}]", head_first(a), t, r, checks.GRAD_FACTOR)


def _decode_reference(q, k_dense, v_dense, lens, window=None, softcap=0.0, sinks=None):
    """float64 per sequence: the Nq queries are the last Nq positions of its first lens[b] keys (bottom-right
    causal among themselves); [B, Hq, Nq, d]."""
    out = np.zeros(q.shape)
    for b, n in enumerate(lens):
        if n == 0:
            continue
        out[b] = reference.naive_attention(q[b], k_dense[b, :, :n], v_dense[b, :, :n], causal=True,
                                           window=window, softcap=softcap, sinks=sinks)
    return out


def _torch_decode(q, k_dense, v_dense, lens, window=None, softcap=0.0, sinks=None):
    """PyTorch's own attention at q's dtype on the same per-sequence slices (its error sets the bound)."""
    out = torch.zeros(q.shape, dtype=q.dtype)
    for b, n in enumerate(lens):
        if n == 0:
            continue
        o, _ = checks.torch_attention(q[b:b + 1], k_dense[b:b + 1, :, :n], v_dense[b:b + 1, :, :n], True,
                                      window, softcap, sinks)
        out[b] = o[0]
    return out


@pytest.mark.parametrize("layout", ["dense", "paged", "fp8", "fp8-paged"])
@pytest.mark.parametrize("nq", [1, 5])
def test_decode_matches_float64(layout, nq):
    """flash_decode at d = 256, GQA, ragged lengths (0 and 1 included), one or several queries per sequence
    (chunked), dense, paged (pages of 16 in shuffled order) and e4m3 caches (per-head scales, against float64
    on the dequantised cache); split into several splits; sinks and softcap on the chunked calls."""
    g = torch.Generator().manual_seed(nq * 7 + len(layout))
    lens = [0 if nq == 1 else nq, 1 if nq == 1 else nq + 1, 70, 45]
    B, Hq, Hkv, L, page = 4, 4, 2, 80, 16
    q = _rand((B, Hq, nq, D), torch.bfloat16, g)
    k = _rand((B, Hkv, L, D), torch.bfloat16, g)
    v = _rand((B, Hkv, L, D), torch.bfloat16, g)
    mods = dict(softcap=20.0, sinks=torch.tensor([1.0, -2.0, 0.0, 0.5], device=DEVICE)) if nq > 1 else {}
    kw = {}
    k_ref, v_ref = k.cpu().float(), v.cpu().float()
    if layout.startswith("fp8"):
        (k8, ks), (v8, vs) = attnscope.quantize_kv(k), attnscope.quantize_kv(v)
        k, v, kw = k8, v8, dict(k_scale=ks, v_scale=vs)
        k_ref = k8.cpu().float() * ks.cpu().view(1, -1, 1, 1)
        v_ref = v8.cpu().float() * vs.cpu().view(1, -1, 1, 1)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    args = (q, k, v, lens_t)
    if layout.endswith("paged"):
        pages_per = L // page
        perm = torch.randperm(B * pages_per, generator=g)
        kp = torch.empty(B * pages_per, page, Hkv, D, dtype=k.dtype, device=DEVICE)
        vp = torch.empty_like(kp)
        kp[perm] = k.permute(0, 2, 1, 3).reshape(B * pages_per, page, Hkv, D)
        vp[perm] = v.permute(0, 2, 1, 3).reshape(B * pages_per, page, Hkv, D)
        table = perm.view(B, pages_per).to(torch.int32).to(DEVICE)
        args = (q, kp, vp, lens_t, table)
    o = attnscope.flash_decode(*args, num_splits=3, **kw, **mods)
    attnscope.check_errors()
    sinks = mods.get("sinks")
    ref = _decode_reference(_n(q), k_ref.double().numpy(), v_ref.double().numpy(), lens,
                            softcap=mods.get("softcap", 0.0), sinks=None if sinks is None else _n(sinks))
    qb = q.cpu()
    to = _torch_decode(qb, k_ref.to(qb.dtype), v_ref.to(qb.dtype), lens, softcap=mods.get("softcap", 0.0),
                       sinks=None if sinks is None else sinks.cpu())
    _check(f"decode {layout}", o, to, ref)


GPU_CASES = [  # nq, nk, group, causal, dtype, window, softcap, sinks
    (1000, 1000, 4, True, "bfloat16", None, 0.0, False),
    (777, 1537, 1, False, "float16", None, 0.0, False),
    (1500, 1300, 2, True, "bfloat16", (300, 0), 30.0, True),
]


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (the table configs)")
@pytest.mark.parametrize("nq,nk,group,causal,dtype,window,softcap,sinks", GPU_CASES)
def test_gpu_forward_and_backward_match_float64(nq, nk, group, causal, dtype, window, softcap, sinks):
    """The same check on the GPU at the table's d = 256 configs (several tiles each way, ragged edges), with
    `impl="auto"`: the kernels a user's call takes."""
    _fwd_backward_case(nq, nk, group, causal, dtype, window, softcap, sinks, "cuda", "auto")


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (the table configs)")
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_varlen_forward_and_backward_match_float64(causal):
    """The packed check on the GPU at the table's d = 256 tiles: sequences of several 128-row tiles, ragged
    ends, an empty and a one-token one."""
    _varlen_case(causal, [700, 0, 1, 1300], [900, 5, 1, 1300], "cuda")


def test_a_smaller_shared_memory_takes_the_fallback_tiles(monkeypatch):
    """The d = 256 table tiles need 193 KiB of shared memory; a device offering a block less (an A100's 163
    KiB) gets each table's smaller config, one whose own need `SMEM_NEEDS` does not list; the table's own
    where the device has enough or is unknown."""
    monkeypatch.setattr(fwd, "interpreting", lambda: False)
    monkeypatch.setattr(bwd, "interpreting", lambda: False)
    a100, h200 = 163 * 1024, 227 * 1024
    for causal in (False, True):
        table = fwd.pick_config(D, causal, 4096)
        assert fwd.pick_config(D, causal, 4096, h200) == fwd.pick_config(D, causal, 4096, None) == table
        small = fwd.pick_config(D, causal, 4096, a100)
        assert table in fwd.SMEM_NEEDS and fwd.SMEM_NEEDS[table][0] > a100 >= 0
        assert small == fwd.SMEM_NEEDS[table][1] and small not in fwd.SMEM_NEEDS
        assert small.BLOCK_N < table.BLOCK_N
    for tables in (bwd.DKDV_CONFIGS, bwd.DQ_CONFIGS):
        cfg = tables[D]
        assert _common.fitting(cfg, bwd.SMEM_NEEDS, h200) == _common.fitting(cfg, bwd.SMEM_NEEDS, None) == cfg
        small = _common.fitting(cfg, bwd.SMEM_NEEDS, a100)
        assert small == bwd.SMEM_NEEDS[cfg][1] != cfg and small not in bwd.SMEM_NEEDS
    monkeypatch.setattr(bwd, "smem_per_block", lambda torch, t: None)  # the atomic dK/dV kernel: own tiles
    assert bwd.configs(D, None, atomic=True)[0] == bwd.ATOMIC_DKDV_CONFIGS[D] != bwd.DKDV_CONFIGS[D]
    assert bwd.configs(128, None, atomic=True)[0] == bwd.DKDV_CONFIGS[128] == bwd.configs(128, None)[0]
    for d in (64, 128):  # their tiles fit an A100
        assert fwd.pick_config(d, True, 4096, a100) == fwd.pick_config(d, True, 4096)
        assert _common.fitting(bwd.DKDV_CONFIGS[d], bwd.SMEM_NEEDS, a100) == bwd.DKDV_CONFIGS[d]


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (the table configs)")
def test_gpu_the_fallback_tiles_match_float64(monkeypatch):
    """The smaller tiles a device of 163 KiB per block runs (forced here on this GPU), dense and packed."""
    from attnscope.kernels import varlen

    for mod in (fwd, bwd, varlen):
        monkeypatch.setattr(mod, "smem_per_block", lambda torch, t: 163 * 1024)
    _fwd_backward_case(*GPU_CASES[2], "cuda", "portable")
    _varlen_case(True, [300, 1, 650], [300, 7, 650], "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (the table configs)")
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_decode_matches_float64(fp8):
    """flash_decode at d = 256 on the GPU, the plan's tiles (half d = 128's keys), a long ragged cache."""
    _gpu_decode_case(fp8, D)


def _gpu_decode_case(fp8, d):
    g = torch.Generator().manual_seed(2560 + fp8)
    lens = [5000, 1, 3333, 0]
    B, Hq, Hkv, L = 4, 8, 2, 5000
    q = _rand((B, Hq, 1, d), torch.bfloat16, g, device="cuda")
    k = _rand((B, Hkv, L, d), torch.bfloat16, g, device="cuda")
    v = _rand((B, Hkv, L, d), torch.bfloat16, g, device="cuda")
    kw, k_ref, v_ref = {}, k.cpu().float(), v.cpu().float()
    if fp8:
        (k8, ks), (v8, vs) = attnscope.quantize_kv(k), attnscope.quantize_kv(v)
        k, v, kw = k8, v8, dict(k_scale=ks, v_scale=vs)
        k_ref = k8.cpu().float() * ks.cpu().view(1, -1, 1, 1)
        v_ref = v8.cpu().float() * vs.cpu().view(1, -1, 1, 1)
    o = attnscope.flash_decode(q, k, v, torch.tensor(lens, dtype=torch.int32, device="cuda"), **kw)
    attnscope.check_errors()
    ref = _decode_reference(_n(q), k_ref.double().numpy(), v_ref.double().numpy(), lens)
    to = _torch_decode(q.cpu(), k_ref.to(torch.bfloat16), v_ref.to(torch.bfloat16), lens)
    _check("decode", o, to, ref)
