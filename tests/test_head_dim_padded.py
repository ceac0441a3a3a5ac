"""Head dims between the built ones (a multiple of 8 up to 256): every entry point runs them in the next power
of two's tiles (`_common.head_block`): Triton kernels (TMA reads zeros past d and clips the stores, pointer
loads and stores are masked) and, on sm_90, the Gluon forward and backward of d 64 / 128 for 40-120 (TMA
alone). Checked against float64 by the one rule (outputs 2 x PyTorch's same-dtype error + 1e-3, gradients
3 x)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import numpy as np  # noqa: E402

import attnscope  # noqa: E402
from attnscope import checks, reference  # noqa: E402
from attnscope.kernels import _common  # noqa: E402
from test_bwd import _check_grads, _inputs, _ref_grads, _torch_grads  # noqa: E402


@pytest.mark.parametrize("d,causal,group,nq,nk,dtype,deterministic", [
    (96, True, 2, 37, 70, torch.bfloat16, True), (80, False, 1, 70, 37, torch.float16, False),
    (40, True, 1, 64, 64, torch.float16, True), (200, False, 2, 17, 33, torch.bfloat16, False),
    (8, True, 2, 33, 33, torch.float16, False)])
def test_a_padded_head_dim_matches_float64(d, causal, group, nq, nk, dtype, deterministic):
    q, k, v, do = _inputs(1, 2 * group, 2, nq, nk, d, dtype, d == 80, seed=d)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse = attnscope.flash_attention(*leaves, causal=causal, return_lse=True)
    assert o.shape == q.shape and o.dtype == dtype
    ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                         return_lse=True)
    kk, vv = (t.repeat_interleave(group, 1) for t in (k, v))
    s = (q @ kk.transpose(-1, -2)) * d ** -0.5
    if causal:
        mask = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
        s = s.masked_fill(~mask.to(s.device), float("-inf"))
    own = (torch.softmax(s.float(), -1).nan_to_num(0.0).to(dtype) @ vv).double().cpu().numpy()
    err, own_err = np.abs(o.detach().double().cpu().numpy() - ro).max(), np.abs(own - ro).max()
    assert err <= checks.kernel_tolerance(own_err), (err, own_err)
    fin = np.isfinite(rlse)
    assert np.abs(lse.detach().double().cpu().numpy() - rlse)[fin].max(initial=0.0) < 1e-3
    got = attnscope.kernels.bwd.flash_attention_backward(do, q, k, v, o.detach(), lse.detach(), causal, None,
                                                         deterministic=deterministic)
    ref, _ = _ref_grads(q, k, v, do, causal)
    _check_grads(got, _torch_grads(q, k, v, do, causal), ref)
    o.backward(do)  # autograd: the same gradients
    for a, b in zip([t.grad for t in leaves], got, strict=True):
        assert torch.equal(a, b) or deterministic is False


@pytest.mark.parametrize("d,causal,deterministic,dtype", [(96, True, True, torch.bfloat16),
                                                         (40, False, False, torch.float16),
                                                         (80, True, False, torch.float16)])
def test_varlen_at_a_padded_head_dim_matches_float64(d, causal, deterministic, dtype):
    """A packed batch (ragged lengths, GQA 2) at a padded head dim: each sequence's output, LSE and dQ, dK, dV
    (autograd) against float64 attention of that sequence alone, by the one rule."""
    from test_bwd import DEVICE

    lens, hq, hkv = [17, 40, 5], 4, 2
    g = torch.Generator().manual_seed(d)
    total = sum(lens)
    q, do = (torch.randn(total, hq, d, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    k, v = (torch.randn(total, hkv, d, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    cu = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32, device=DEVICE)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = attnscope.flash_attention_varlen(*leaves, cu, cu, max(lens), max(lens), causal=causal,
                                              return_lse=True, deterministic=deterministic)
    o.backward(do)
    at = 0
    for n in lens:
        sl = slice(at, at + n)
        one = [t[sl].transpose(0, 1)[None] for t in (q, k, v, do)]  # [1, H, n, d]
        ref, _ = _ref_grads(*one, causal)
        ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in one[:3]), causal=causal,
                                             return_lse=True)
        own = _torch_grads(*one, causal)
        kk, vv = (t.repeat_interleave(2, 1) for t in one[1:3])
        own_o = torch.softmax(((one[0] @ kk.transpose(-1, -2)) * d ** -0.5).float().masked_fill(
            ~(torch.ones(n, n, dtype=torch.bool, device=q.device).tril() if causal else
              torch.ones(n, n, dtype=torch.bool, device=q.device)), float("-inf")), -1).to(dtype) @ vv
        got_o = o[sl].transpose(0, 1)[None].detach().double().cpu().numpy()
        assert np.abs(got_o - ro).max() <= checks.kernel_tolerance(
            np.abs(own_o.double().cpu().numpy() - ro).max())
        assert np.abs(lse[:, sl].detach().double().cpu().numpy() - rlse[0]).max() < 1e-3
        got = [t.grad[sl].transpose(0, 1)[None] for t in leaves]
        _check_grads(got, own, ref)
        at += n


def _decode_reference(q, k, v, lens, nq):
    """float64 attention of each sequence's nq queries (bottom-right causal) over its first lens[b] keys:
    q [B, Hq, nq, d], k, v [B, Hkv, L, d]."""
    out = np.zeros(q.shape)
    for b, n in enumerate(lens):
        one = [t[b:b + 1].double().cpu().numpy() for t in (q, k[:, :, :n], v[:, :, :n])]
        out[b] = reference.naive_attention(*one, causal=True)[0]
    return out


@pytest.mark.parametrize("d,nq,paged,splits,dtype", [(96, 1, False, 1, torch.bfloat16),
                                                      (96, 1, True, 3, torch.float16),
                                                      (40, 3, False, 2, torch.float16),
                                                      (80, 1, False, 4, torch.bfloat16)])
def test_decode_at_a_padded_head_dim_matches_float64(d, nq, paged, splits, dtype):
    """flash_decode (dense and paged caches, ragged lengths, split and not, chunked Nq > 1, GQA 4) at a
    padded head dim against float64, by the one rule."""
    from test_bwd import DEVICE

    g = torch.Generator().manual_seed(d + nq)
    B, hq, hkv, L, page = 2, 8, 2, 70, 16
    lens = [70, 33]
    q = torch.randn(B, hq, nq, d, generator=g).to(dtype).to(DEVICE)
    k, v = (torch.randn(B, hkv, L, d, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if paged:  # pages of `page` keys in shuffled order: [pages, page, Hkv, d]
        per = -(-L // page)
        order = torch.randperm(B * per, generator=g)
        pages = torch.zeros(B * per, page, hkv, d, dtype=dtype, device=DEVICE)
        table = order.view(B, per).to(torch.int32).to(DEVICE)
        for b in range(B):
            for j in range(per):
                rows = k[b, :, j * page:(j + 1) * page].transpose(0, 1)
                pages[table[b, j], :rows.shape[0]] = rows
        vpages = torch.zeros_like(pages)
        for b in range(B):
            for j in range(per):
                rows = v[b, :, j * page:(j + 1) * page].transpose(0, 1)
                vpages[table[b, j], :rows.shape[0]] = rows
        o = attnscope.flash_decode(q, pages, vpages, seqlens, table, num_splits=splits)
    else:
        o = attnscope.flash_decode(q, k, v, seqlens, num_splits=splits)
    assert o.shape == q.shape
    ref = _decode_reference(q, k, v, lens, nq)
    kk, vv = (t.repeat_interleave(hq // hkv, 1) for t in (k, v))
    own = np.zeros(q.shape)
    for b, n in enumerate(lens):
        s = (q[b:b + 1] @ kk[b:b + 1, :, :n].transpose(-1, -2)) * d ** -0.5
        mask = (torch.arange(n, device=q.device)[None, :]
                <= torch.arange(nq, device=q.device)[:, None] + (n - nq))
        s = s.masked_fill(~mask, float("-inf"))
        own[b] = (torch.softmax(s.float(), -1).to(dtype) @ vv[b:b + 1, :, :n]).double().cpu().numpy()[0]
    err = np.abs(o.double().cpu().numpy() - ref).max()
    assert err <= checks.kernel_tolerance(np.abs(own - ref).max()), err


@pytest.mark.parametrize("d", [96, 40])
def test_fp8_decode_at_a_padded_head_dim_matches_its_dequantised_cache(d):
    """An e4m3 cache (`quantize_kv`, per-head scales) at a padded head dim: the output against float64
    attention over the dequantised cache (V by elements: its word loads need whole power-of-two rows)."""
    from attnscope.kernels.decode.quantize import quantize_kv
    from test_bwd import DEVICE

    g = torch.Generator().manual_seed(d)
    q = torch.randn(2, 8, 1, d, generator=g).half().to(DEVICE)
    k, v = (torch.randn(2, 2, 70, d, generator=g).half().to(DEVICE) for _ in range(2))
    (kq, ks), (vq, vs) = quantize_kv(k, head_axis=1), quantize_kv(v, head_axis=1)
    lens = [70, 33]
    o = attnscope.flash_decode(q, kq, vq, torch.tensor(lens, dtype=torch.int32, device=DEVICE), k_scale=ks,
                               v_scale=vs)
    kd, vd = (t.float() * sc.view(1, -1, 1, 1) for t, sc in ((kq, ks), (vq, vs)))
    ref = _decode_reference(q, kd, vd, lens, 1)
    assert np.abs(o.double().cpu().numpy() - ref).max() < 2e-3


def test_padded_head_dims_are_refused_where_they_do_not_run():
    """A head dim not a multiple of 8 (a TMA row must be 16-byte multiples) or past 256 gets one line; the
    decode entry point keeps the built dims; the Gluon kernels name their own."""
    q = torch.zeros(1, 2, 16, 100, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="head_dim 100 is not supported; supported: 64, 128, 256, "
                                                  "or a multiple of 8 up to 256"):
        attnscope.flash_attention(q, q, q)
    packed = torch.zeros(16, 2, 100, dtype=torch.float16)
    cu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="head_dim 100 is not supported; supported: 64, 128, 256,"):
        attnscope.flash_attention_varlen(packed, packed, packed, cu, cu, 16, 16)
    cache = torch.zeros(1, 2, 32, 100, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="head_dim 100 is not supported; supported: 64, 128, 256,"):
        attnscope.flash_decode(torch.zeros(1, 2, 1, 100, dtype=torch.float16), cache, cache)
    if torch.cuda.is_available():  # a forced Gluon variant names its own head dims (96 runs in d 128's)
        with pytest.raises(NotImplementedError, match="head_dim 24 is not supported"):
            attnscope.flash_attention(*(torch.zeros(1, 2, 16, 24, dtype=torch.float16, device="cuda"),) * 3,
                                      impl="hopper")
    with pytest.raises(NotImplementedError, match="head_dim 264 is not supported"):
        _common.check_head_dim(264, padded=True)
    _common.check_head_dim(96, padded=True)
    with pytest.raises(NotImplementedError, match="head_dim 96 is not supported; supported: 64, 128, 256 "):
        _common.check_head_dim(96)
    assert [_common.head_block(d) for d in (8, 40, 64, 72, 128, 136, 256)] == [16, 64, 64, 128, 128, 256, 256]


GPU_CASES = [  # d, nq, nk, group, causal, dtype, window, softcap, sinks
    (96, 1000, 1000, 4, True, "bfloat16", None, 0.0, False),
    (80, 777, 1537, 1, False, "float16", None, 0.0, False),
    (96, 1500, 1300, 2, True, "bfloat16", (300, 0), 30.0, True),
    (40, 1200, 1200, 2, False, "bfloat16", None, 0.0, False),
    (200, 600, 900, 1, True, "float16", None, 0.0, False),
    (24, 900, 1100, 3, True, "bfloat16", None, 0.0, False),  # a tile narrower than the builds' (MLA-sized)
    (8, 500, 700, 1, False, "float16", (100, 20), 0.0, True),
]
_ON_GPU = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a CUDA GPU (the compiled padded tiles)")
@pytest.mark.parametrize("d,nq,nk,group,causal,dtype,window,softcap,sinks", GPU_CASES)
def test_gpu_padded_forward_and_backward_match_float64(d, nq, nk, group, causal, dtype, window, softcap,
                                                       sinks):
    """On the GPU, `impl="auto"` at padded head dims (several tiles each way, ragged edges, GQA, window,
    softcap, sinks): the output, the LSE and autograd's dQ, dK, dV against float64."""
    from test_head_dim_256 import _fwd_backward_case

    _fwd_backward_case(nq, nk, group, causal, dtype, window, softcap, sinks, "cuda", "auto", d=d)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d,nq,nk,group,causal,dtype,window,softcap,sinks", [
    (96, 1000, 1000, 4, True, "bfloat16", None, 0.0, False),
    (80, 777, 1537, 1, False, "float16", None, 0.0, False),
    (40, 1500, 1300, 2, True, "bfloat16", (300, 0), 30.0, True),
    (120, 1200, 1200, 1, False, "float16", None, 0.0, True)])
def test_gpu_gluon_at_padded_dims_matches_float64(d, nq, nk, group, causal, dtype, window, softcap, sinks):
    """The Gluon forward forced (``impl="hopper"``: the d = 64 / 128 build in its tiles) and autograd's
    backward (the Gluon kernels at these dims) against float64."""
    from test_head_dim_256 import _fwd_backward_case

    _fwd_backward_case(nq, nk, group, causal, dtype, window, softcap, sinks, "cuda", "hopper", d=d)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a CUDA GPU (the compiled padded tiles)")
@pytest.mark.parametrize("d,causal", [(96, True), (80, False), (40, True), (24, True)])
def test_gpu_padded_varlen_matches_float64(d, causal):
    """The packed forward and backward on the GPU at padded head dims: sequences of several tiles, ragged
    ends, an empty and a one-token one."""
    from test_head_dim_256 import _varlen_case

    _varlen_case(causal, [700, 0, 1, 1300], [900, 5, 1, 1300], "cuda", d=d)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a CUDA GPU (the compiled padded tiles)")
@pytest.mark.parametrize("d,fp8", [(96, False), (96, True), (80, False), (40, True), (24, False)])
def test_gpu_padded_decode_matches_float64(d, fp8):
    """flash_decode on the GPU at padded head dims, a long ragged cache, bf16 and e4m3."""
    from test_head_dim_256 import _gpu_decode_case

    _gpu_decode_case(fp8, d)


def test_tiles_narrower_than_the_builds_run_the_narrowest_builds_config(monkeypatch):
    """The portable kernels' config tables are measured at d = 64, 128 and 256; a tile 8-32 wide (d 8-32)
    takes d = 64's tile config (the forward's, the backward's), as 40-56 in tiles 64 wide do; a width the
    tables lack otherwise is refused (no GPU: the tables, the interpreter's config off)."""
    from attnscope.kernels import bwd, fwd

    monkeypatch.setattr(fwd, "interpreting", lambda: False)
    monkeypatch.setattr(bwd, "interpreting", lambda: False)
    assert [_common.built_dim(d, (64, 128, 256)) for d in (8, 16, 32, 64, 96, 128, 256, 512)] == [
        64, 64, 64, 64, 96, 128, 256, 512]
    for tile in (8, 16, 32):
        for causal, n, window in ((True, 8192, False), (False, 1000, False), (True, 4096, True)):
            assert fwd.pick_config(tile, causal, n, narrow_window=window) == fwd.pick_config(64, causal, n,
                                                                                             narrow_window=window)
        for atomic in (False, True):
            assert bwd.configs(tile, torch.zeros(1), atomic) == bwd.configs(64, torch.zeros(1), atomic)
    for width in (96, 512):
        with pytest.raises(NotImplementedError, match=f"head_dim {width}: no measured config"):
            fwd.pick_config(width, True, 1024)


def test_the_gluon_builds_take_the_head_dims_between(monkeypatch):
    """Head dims between the built ones run the Gluon builds of their `head_block` (no GPU: the rule and the
    launch plans): the dispatch picks for d 40-56 what it picks for 64 and for 72-120 what for 128, nothing
    below 40 or past 128 (the portable kernels); the forward's and the backward's launchers build the d = 64 /
    128 kernels (their constexprs) with TMA blocks that wide over tensors of the true d (zeros read past it,
    stores clipped), and a one-pass dQ accumulates that wide, dQ its first d columns."""
    from attnscope.kernels import bwd, bwd_hopper, fwd_hopper
    from attnscope.model import dispatch
    from test_bwd import _record_launches

    for d, built in ((40, 64), (56, 64), (72, 128), (96, 128), (120, 128)):
        for causal, b, h, hkv, n in ((True, 1, 32, 8, 8192), (False, 4, 16, 16, 1500), (True, 2, 8, 1, 3000)):
            assert dispatch.hopper_variant(d, causal, b, h, hkv, n, n) == dispatch.hopper_variant(
                built, causal, b, h, hkv, n, n)
        assert dispatch.hopper_backward_ok(d, True)
        assert dispatch.hopper_backward_lean(d, "bf16") == (built == 64)
    for d in (8, 24, 32, 136, 200):
        assert dispatch.hopper_variant(d, True, 1, 32, 8, 8192, 8192) is None
        assert not dispatch.hopper_backward_ok(d, False)
    monkeypatch.setattr(bwd, "hopper_unavailable", lambda torch, q: None)  # pretend sm_90
    with pytest.raises(NotImplementedError, match="impl='hopper': head_dim 24 is not supported; supported: "
                                                  "40-128 in steps of 8"):
        bwd._pick_impl("hopper", torch.zeros(1, 2, 8, 24), True, _common.Mods(-1, -1, 0.0, None))
    q = torch.zeros(1, 2, 8, 24, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="'hopper_persist': head_dim 24 is not supported; "
                                                  r"supported: \[64, 128\] and the multiples of 8"):
        fwd_hopper.launcher(q, q, q, q, 0.2, True, True)

    seen = []
    monkeypatch.setattr(fwd_hopper, "planned_launch",
                        lambda kernel, grid, consts, dev: lambda args, aligned: seen.append((args, consts)))
    for d, built in ((96, 128), (40, 64)):
        q, k, v, o = (torch.zeros(2, 4 if t == "q" else 2, 300, d, dtype=torch.bfloat16) for t in "qkvo")
        lse = torch.zeros(2, 4, 300)
        seen.clear()
        fwd_hopper.launch(q, k, v, q.clone(), lse, 0.15, True, True)
        args, consts = seen[0]
        assert consts == fwd_hopper.constexprs(built, True, True)
        for desc in args[:4]:
            assert desc.block_shape[-1] == built and list(desc.shape)[-1] == d

    calls = {}

    def record(name, grid, a, kw):
        calls[name] = (a, kw)
        if kw.get("ONEPASS"):
            acc = a[8]
            acc += torch.arange(acc.numel(), dtype=torch.float32).view(acc.shape)

    _record_launches(monkeypatch, record)
    for d, built, mode in ((96, 128, "twokernel"), (96, 128, "onepass"), (40, 64, "onepass")):
        B, Hq, Hkv, Nq, Nk = 2, 4, 2, 100, 150
        q, do, dq = (torch.zeros(B, Hq, Nq, d, dtype=torch.bfloat16) for _ in range(3))
        k, v, dk, dv = (torch.zeros(B, Hkv, Nk, d, dtype=torch.bfloat16) for _ in range(4))
        lse2, delta = torch.zeros(B, Hq, Nq), torch.zeros(B, Hq, Nq)
        calls.clear()
        bwd_hopper.launch(q, k, v, do, lse2, delta, dq, dk, dv, 0.2, d ** -0.5, True, None, mode=mode)
        a, kw = calls["dkdv"]
        cfg = bwd_hopper.config(built, "dkdv", 0, "bf16", d ** -0.5)
        assert kw == bwd_hopper.constexprs(built, True, "dkdv", 0, mode, cfg)
        assert [t.block_shape[-1] for t in a[:6]] == [built] * 6 and [t.shape[-1] for t in a[:6]] == [d] * 6
        if mode == "onepass":
            acc = a[8]
            assert acc.shape[-1] == built and set(calls) == {"dkdv"}
            assert torch.equal(dq, acc[:, :, :Nq, :d].to(torch.bfloat16))
        else:
            assert [t.block_shape[-1] for t in calls["dq"][0][:5]] == [built] * 5
