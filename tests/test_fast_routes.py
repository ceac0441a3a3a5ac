"""The host fast routes give the public slow route's results, bit for bit (CPU: TRITON_INTERPRET=1).

flash_attn_interface's eager inference (`fwd._launch` with ``bnhd``, `varlen._launch` without the wrapper) is
compared with `flash_attention` / `flash_attention_varlen` on the same tensors; `flash_attn_with_kvcache`'s
planned launch and int-length append with `flash_decode` on the views and with a lengths tensor; the
transformers integration's `_decode` with the one-liner. Each pair runs the same kernel, so equality is
exact; plans are reused across calls whose tensors share shapes but differ in strides, offset or dtype.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import decode, varlen  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

fai = pytest.importorskip("attnscope.flash_attn_interface")

DEVICE = kernel_device()
DT = torch.bfloat16


def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DT).to(DEVICE)


def _native(q, k, v, causal=False, lse=False, **kw):
    """`flash_attention` on the [B, H, N, d] views, back in flash-attn's layout."""
    r = attnscope.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, None, lse,
                                  **kw)
    return (r[0].transpose(1, 2), r[1]) if lse else r.transpose(1, 2)


def test_dense_plan_reuse_across_layouts_dtypes_and_grad():
    """A packed qkv's views, then contiguous tensors of the same shape, a transposed storage, an aligned
    offset, fp16: each equals the native call; requires_grad switches to autograd (a grad_fn), no_grad and
    inference_mode back to the eager launch; a base off 16 bytes is refused as the native call refuses it."""
    B, N, H, d = 2, 17, 2, 64
    qkv = _randn(B, N, 3, H, d)
    q, k, v = qkv.unbind(2)
    assert torch.equal(fai.flash_attn_qkvpacked_func(qkv, causal=True), _native(q, k, v, True))
    for qq, kk, vv in ((q.contiguous(), k.contiguous(), v.contiguous()), (q, k, v),
                       (_randn(B, H, N, d, seed=1).transpose(1, 2), k, v),
                       (q.half(), k.half(), v.half())):
        o = fai.flash_attn_func(qq, kk, vv, causal=True)
        assert o.dtype == qq.dtype and torch.equal(o, _native(qq, kk, vv, True))
    buf = _randn(B * N * H * d + 16, seed=2)
    shifted = buf[8:8 + B * N * H * d].view(B, N, H, d)  # 16 bytes: aligned
    assert torch.equal(fai.flash_attn_func(shifted, k, v), _native(shifted, k, v))
    odd = buf[1:1 + B * N * H * d].view(B, N, H, d)  # 2 bytes
    with pytest.raises(NotImplementedError, match="16-byte aligned"):
        fai.flash_attn_func(odd, k, v)
    qg = q.detach().clone().requires_grad_()
    out = fai.flash_attn_func(qg, k, v, causal=True)
    assert out.grad_fn is not None and torch.equal(out.detach(), _native(q, k, v, True))
    out.float().sum().backward()
    assert qg.grad is not None and qg.grad.shape == q.shape
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            out = fai.flash_attn_func(qg, k, v, causal=True)
        assert out.grad_fn is None and torch.equal(out, _native(q, k, v, True))


@pytest.mark.parametrize("nq, nk", [(5, 19), (19, 5)])
def test_dense_lse_gqa_causal_and_mods(nq, nk):
    """return_attn_probs' (out, lse, None) with GQA and causal Nq != Nk, and window / softcap given as a list
    and an int, equal the native call."""
    q, k, v = _randn(3, nq, 4, 64), _randn(3, nk, 2, 64, seed=1), _randn(3, nk, 2, 64, seed=2)
    o, lse, none = fai.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    eo, e_lse = _native(q, k, v, True, True)
    assert none is None and lse.shape == (3, 4, nq) and torch.equal(o, eo) and torch.equal(lse, e_lse)
    o = fai.flash_attn_func(q, k, v, window_size=[3, 2], softcap=5)
    assert torch.equal(o, _native(q, k, v, window=(3, 2), softcap=5.0))
    o = fai.flash_attn_func(q, k, v, causal=True, window_size=[-1, -1], softcap=0, dropout_p=0)
    assert torch.equal(o, eo)


@pytest.mark.parametrize("kw, err", [(dict(dropout_p=0.1), NotImplementedError),
                                     (dict(alibi_slopes=torch.ones(2)), NotImplementedError),
                                     (dict(window_size=(-2, 0)), InputError),
                                     (dict(softcap=-1.0), InputError),
                                     (dict(causal=1), InputError), (dict(softmax_scale=0.0), InputError),
                                     (dict(return_attn_probs=1), InputError)])
def test_dense_and_varlen_refusals_on_both_routes(kw, err):
    """What the autograd route refuses, the eager route refuses with the same message (dense and varlen)."""
    q = _randn(2, 9, 2, 64)
    cu = torch.tensor([0, 5, 18], dtype=torch.int32, device=DEVICE)
    calls = (lambda t: fai.flash_attn_func(t, q, q, **kw),
             lambda t: fai.flash_attn_varlen_func(t.flatten(0, 1), q.flatten(0, 1), q.flatten(0, 1), cu, cu,
                                                  13, 13, **kw))
    for call in calls:
        messages = []
        for t in (q, q.detach().clone().requires_grad_()):
            with pytest.raises(err) as info:
                call(t)
            messages.append(str(info.value))
        assert messages[0] == messages[1]


@pytest.mark.parametrize("bad", [[0, 5, 30, 22], [0, -3, 5, 22], [0, 5, 5, 100], [5, 5, 5, 22]])
def test_varlen_bad_cu_seqlens_recorded_as_on_the_autograd_route(bad):
    """Bad cu_seqlens on the eager route: the same sanitised output as the autograd route, recorded on the
    device for `varlen.check_errors`."""
    q, k, v = _randn(22, 4, 64), _randn(22, 2, 64, seed=1), _randn(22, 2, 64, seed=2)
    cu = torch.tensor(bad, dtype=torch.int32, device=DEVICE)
    outs = []
    for t in (q, q.detach().clone().requires_grad_()):
        outs.append(fai.flash_attn_varlen_func(t, k, v, cu, cu, 17, 17, causal=True).detach())
        with pytest.raises(InputError):
            varlen.check_errors()
    assert torch.equal(outs[0], outs[1])


def _decode_native(q, kc, vc, lens, **kw):
    return decode.flash_decode(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), lens,
                               **kw).transpose(1, 2)


@pytest.mark.parametrize("kw", [dict(window_size=[-1, -1]), dict(softcap=0),
                                dict(window_size=(int("-1"), -1)),
                                dict(causal=True, window_size=[-1, -1], softcap=0)])
def test_kvcache_defaults_given_as_equal_objects(kw):
    """with_kvcache's defaults passed as equal but not identical objects act as the defaults (warm and
    cold), and a window / softcap on the planned route equals the native call."""
    kc, vc = _randn(2, 48, 2, 64), _randn(2, 48, 2, 64, seed=1)
    q = _randn(2, 1, 4, 64, seed=2)
    lens = torch.tensor([30, 41], dtype=torch.int32, device=DEVICE)
    base = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=kw.get("causal", False))
    for _ in range(2):
        assert torch.equal(fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, **kw), base)
    for _ in range(2):
        o = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, window_size=(5, -1), softcap=3.0)
        assert torch.equal(o, _decode_native(q, kc, vc, lens, window=(5, 0), softcap=3.0))


@pytest.mark.parametrize("n_new, nq, base", [(3, 1, 10), (2, 1, 46), (3, 3, 45), (0, 1, 48), (1, 1, 0)])
def test_kvcache_int_append_equals_the_tensor_append(n_new, nq, base):
    """An int cache_seqlens append (Nnew > 1, Nq > 1, up to the cache's end) writes what a lengths tensor's
    append writes and attends the same; one past the end is refused with nothing written."""
    kc, vc = _randn(2, 48, 2, 64), _randn(2, 48, 2, 64, seed=1)
    q, kn, vn = _randn(2, nq, 4, 64, seed=2), _randn(2, n_new, 2, 64, seed=3), _randn(2, n_new, 2, 64, seed=4)
    caches = [(kc.clone(), vc.clone()) for _ in range(2)]
    lens = torch.full((2,), base, dtype=torch.int32, device=DEVICE)
    outs = [fai.flash_attn_with_kvcache(q, *c, kn, vn, cache_seqlens=s, causal=True)
            for c, s in zip(caches, (base, lens), strict=True)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    assert torch.equal(caches[0][0][:, base:base + n_new], kn)
    full = torch.full((2,), base + n_new, dtype=torch.int32, device=DEVICE)
    assert torch.equal(outs[0], _decode_native(q, *caches[0], full))
    over = _randn(2, 49 - base, 2, 64, seed=5)  # one key past the end
    k2, v2 = kc.clone(), vc.clone()
    with pytest.raises(InputError, match=r"(cache_seqlens|k): expected .*<= 48"):
        fai.flash_attn_with_kvcache(q, k2, v2, over, over, cache_seqlens=base, causal=True)
    assert torch.equal(k2, kc) and torch.equal(v2, vc)


def test_kvcache_planned_launch_across_strides_offsets_and_dtypes():
    """A planned layout is not reused for another: a strided cache, then its contiguous copy, a q at a
    2-byte offset, fp16 tensors; each equals the native call."""
    big = _randn(2, 48, 4, 64)
    k1, v1 = big[:, :, :2], big[:, :, 2:]
    q = _randn(2, 1, 4, 64, seed=1)
    lens = torch.tensor([30, 41], dtype=torch.int32, device=DEVICE)
    buf = _randn(2 * 4 * 64 + 8, seed=2)
    q_odd = buf[1:1 + 2 * 4 * 64].view(2, 1, 4, 64)
    for qq, kk, vv in ((q, k1, v1), (q, k1.contiguous(), v1.contiguous()), (q, k1, v1), (q_odd, k1, v1),
                       (q.half(), k1.half(), v1.half())):
        for _ in range(2):
            o = fai.flash_attn_with_kvcache(qq, kk, vv, cache_seqlens=lens)
            assert o.dtype == qq.dtype and torch.equal(o, _decode_native(qq, kk, vv, lens))


def test_transformers_decode_planned_launch_equals_the_one_liner():
    """The integration's warm decode step (`_decode`: the cached plan's launch) equals `flash_decode` on a
    cache grown call to call, with window / softcap layers mixed, fp16 after bf16, and bf16 or fp32 sinks."""
    hf = pytest.importorskip("attnscope.integrations.transformers")

    class Attn(torch.nn.Module):
        is_causal = True

    module = Attn()
    sinks = 3.0 * torch.randn(4, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    k, v = _randn(2, 2, 5, 64), _randn(2, 2, 5, 64, seed=1)
    with torch.no_grad():
        for step in range(2):
            k = torch.cat([k, _randn(2, 2, 1, 64, seed=10 + step)], 2)
            v = torch.cat([v, _randn(2, 2, 1, 64, seed=30 + step)], 2)
            q = _randn(2, 4, 1, 64, seed=20 + step)
            layers = ((None, None, None), (3, None, sinks.to(DT)), (None, 5.0, sinks), (None, None, None))
            for sw, cap, s_aux in layers:
                kw = {"scale": 0.2, **({"window": (sw - 1, 0)} if sw else {}),
                      **({"softcap": cap} if cap else {}),
                      **({"sinks": s_aux.float()} if s_aux is not None else {})}
                want = decode.flash_decode(q, k, v, **kw).transpose(1, 2)
                for _ in range(2):
                    o = hf.attention_forward(module, q, k, v, None, scaling=0.2, sliding_window=sw,
                                             softcap=cap, s_aux=s_aux)[0]
                    assert o.shape == (2, 1, 4, 64) and torch.equal(o, want)
            o = hf.attention_forward(module, q.half(), k.half(), v.half(), None)[0]
            want = decode.flash_decode(q.half(), k.half(), v.half()).transpose(1, 2)
            assert o.dtype == torch.float16 and torch.equal(o, want)
