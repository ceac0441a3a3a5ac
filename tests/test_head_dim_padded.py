"""Head dims between the built ones (a multiple of 8 up to 256): `flash_attention` and its backward run them
on the portable kernels in the next power of two's tiles (`_common.head_block`: TMA reads zeros past d and
clips the stores, the backward's pointer loads and stores are masked). Checked against float64 by the one
rule (outputs 2 x PyTorch's same-dtype error + 1e-3, gradients 3 x); the other entry points keep the built
dims."""

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
    cache = torch.zeros(1, 2, 32, 96, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="head_dim 96 is not supported; supported: 64, 128, 256 "):
        attnscope.flash_decode(torch.zeros(1, 2, 1, 96, dtype=torch.float16), cache, cache)
    if torch.cuda.is_available():  # a forced Gluon variant names its own head dims
        with pytest.raises(NotImplementedError, match="head_dim 96 is not supported"):
            attnscope.flash_attention(*(torch.zeros(1, 2, 16, 96, dtype=torch.float16, device="cuda"),) * 3,
                                      impl="hopper")
    with pytest.raises(NotImplementedError, match="head_dim 264 is not supported"):
        _common.check_head_dim(264, padded=True)
    _common.check_head_dim(96, padded=True)
    with pytest.raises(NotImplementedError, match="head_dim 96 is not supported; supported: 64, 128, 256 "):
        _common.check_head_dim(96)
    assert [_common.head_block(d) for d in (8, 40, 64, 72, 128, 136, 256)] == [8, 64, 64, 128, 128, 256, 256]
