"""flash-attn 2.x's interface against flash-attn's documented semantics (CPU: TRITON_INTERPRET=1).

The reference is written here in flash-attn's layout ([B, N, H, d]), in float64: bottom-right aligned
causal mask and window (key j visible to query i iff ``i' - left <= j <= i' + right`` with
``i' = i + Nk - Nq``, -1 unbounded, causal forcing right = 0), softcap ``c * tanh(s / c)`` after scaling,
natural-log LSE [B, H, N]. Bound (`attnscope.checks.kernel_tolerance`): the max error against float64 is at
most 2 x PyTorch's own error at the input dtype (SDPA with the same mask; eager attention at the dtype when
softcap is on, which SDPA cannot express) plus 1e-3; 3 x for gradients.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope import checks  # noqa: E402
from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import decode  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

fai = pytest.importorskip("attnscope.flash_attn_interface")

DEVICE = kernel_device()
DT = torch.bfloat16


# --- the reference, in flash-attn's layout ---------------------------------------------------------
def _visible(nq, nk, lens, causal, window):
    """[B, Nq, Nk] bool: which keys each query sees (lens: valid keys per sequence, queries the last Nq)."""
    lens = torch.as_tensor(lens, dtype=torch.long)
    i = torch.arange(nq)[None, :, None] + (lens[:, None, None] - nq)  # aligned query position
    j = torch.arange(nk)[None, None, :]
    ok = j < lens[:, None, None]
    left, right = window
    right = 0 if causal else right
    if right >= 0:
        ok = ok & (j <= i + right)
    if left >= 0:
        ok = ok & (j >= i - left)
    return ok.expand(len(lens), nq, nk)


def _attend(q, k, v, ok, softcap=0.0, scale=None):
    """Attention in flash-attn's layout at the tensors' dtype: q [B, Nq, Hq, d], k, v [B, Nk, Hkv, d],
    ok [B, Nq, Nk]. Returns out [B, Nq, Hq, d] (0 on rows with no key) and LSE [B, Hq, Nq] (-inf there)."""
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or q.shape[-1] ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~ok[:, None].to(s.device), float("-inf"))
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def _reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, lens=None):
    lens = [k.shape[1]] * q.shape[0] if lens is None else lens
    ok = _visible(q.shape[1], k.shape[1], lens, causal, window)
    o, lse = _attend(q.double(), k.double(), v.double(), ok, softcap, scale)
    return o.cpu(), lse.cpu(), ok.cpu()


def _torch_own(q, k, v, ok, softcap=0.0, scale=None):
    """PyTorch at q's dtype: SDPA with the boolean mask (eager attention when softcap is on)."""
    if softcap:
        return _attend(q, k, v, ok, softcap, scale)[0]
    g = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)))
    o = torch.nn.functional.scaled_dot_product_attention(qt.cpu(), kt.cpu(), vt.cpu(), attn_mask=ok[:, None],
                                                         scale=scale)
    return o.transpose(1, 2).nan_to_num(0.0)


def _assert_close(o, o_ref, o_torch, ok, factor=2.0, what="out"):
    """Rows with a visible key (o [B, Nq, H, d]): kernel error <= kernel_tolerance(torch's own error)."""
    rows = ok.any(-1)  # [B, Nq]
    err = (o.double().cpu() - o_ref)[rows].abs().max().item()
    torch_err = (o_torch.double().cpu() - o_ref)[rows].abs().max().item()
    tol = checks.kernel_tolerance(torch_err, factor)
    assert err <= tol, f"{what}: error {err:.3g} > tol {tol:.3g} (torch's own {torch_err:.3g})"
    empty = ~rows
    if empty.any():
        assert not o.cpu()[empty].any(), f"{what}: rows with no key are not 0"


def _assert_lse(lse, lse_ref):
    err = checks.lse_error(lse.double().cpu().numpy(), lse_ref.numpy())
    assert err <= checks.KERNEL_LSE_TOL, f"LSE error {err:.3g}"


def _randn(*shape, g, scale=1.0):
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(DT).to(DEVICE)


# --- signatures: flash-attn 2.x's names, order and defaults ----------------------------------------
_DENSE_TAIL = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
               ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
               ("return_attn_probs", False)]
FLASH_ATTN_SIGNATURES = {
    "flash_attn_func": ["q", "k", "v", *_DENSE_TAIL],
    "flash_attn_qkvpacked_func": ["qkv", *_DENSE_TAIL],
    "flash_attn_kvpacked_func": ["q", "kv", *_DENSE_TAIL],
    "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                               *_DENSE_TAIL, ("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen", *_DENSE_TAIL],
    "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                        "max_seqlen_k", *_DENSE_TAIL],
    "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", ("k", None), ("v", None), ("rotary_cos", None),
                                ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None),
                                ("cache_leftpad", None), ("block_table", None), ("softmax_scale", None),
                                ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
                                ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
                                ("return_softmax_lse", False)],
}


def test_every_public_function_has_its_flash_attn_signature_listed():
    assert sorted(FLASH_ATTN_SIGNATURES) == sorted(fai.__all__)


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_SIGNATURES))
def test_signature_is_flash_attn_2(name):
    params = list(inspect.signature(getattr(fai, name)).parameters.values())
    got = [p.name if p.default is inspect.Parameter.empty else (p.name, p.default) for p in params]
    assert got == FLASH_ATTN_SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


# --- dense -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal, hq, hkv, nq, nk", [(False, 4, 2, 37, 50), (True, 2, 2, 50, 37)])
def test_func_forward_and_lse(causal, hq, hkv, nq, nk, monkeypatch):
    g = torch.Generator().manual_seed(1)
    q, k, v = _randn(2, nq, hq, 64, g=g, scale=2.0), _randn(2, nk, hkv, 64, g=g), _randn(2, nk, hkv, 64, g=g)
    seen = []
    real = fai._launch_fwd
    monkeypatch.setattr(fai, "_launch_fwd", lambda *a, **kw: seen.append(a[:3]) or real(*a, **kw))
    o, lse, probs = fai.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    # the caller's buffers went to the kernel's launch: no copy
    assert [t.data_ptr() for t in seen[0]] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    assert probs is None and o.shape == q.shape and lse.shape == (2, hq, nq) and lse.dtype == torch.float32
    o_ref, lse_ref, ok = _reference(q, k, v, causal)
    _assert_close(o, o_ref, _torch_own(q, k, v, ok), ok)
    _assert_lse(lse, lse_ref)
    assert torch.equal(fai.flash_attn_func(q, k, v, causal=causal), o)  # the plain call: same bits


def _grads(fn, inputs, dout):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out.backward(dout.to(out.device))
    return [t.grad.cpu() for t in inputs]


def test_qkvpacked_backward():
    """The gradient flows through the unbind views back into the packed tensor."""
    g = torch.Generator().manual_seed(2)
    qkv, dout = _randn(1, 33, 3, 2, 64, g=g), _randn(1, 33, 2, 64, g=g)
    (dqkv,) = _grads(lambda t: fai.flash_attn_qkvpacked_func(t, causal=True), [qkv], dout)
    (dref,) = _grads(lambda t: _reference(*t.unbind(2), causal=True)[0], [qkv.double()], dout.double())
    ok = _visible(33, 33, [33], True, (-1, -1))
    (dtorch,) = _grads(lambda t: _torch_own(*t.unbind(2), ok), [qkv], dout)
    for i in range(3):
        _assert_close(dqkv[:, :, i], dref[:, :, i], dtorch[:, :, i], torch.ones(1, 33, 1, dtype=torch.bool),
                      checks.GRAD_FACTOR, f"d{'qkv'[i]}")
    o = fai.flash_attn_qkvpacked_func(qkv, causal=True)
    _assert_close(o, _reference(*qkv.unbind(2), causal=True)[0], _torch_own(*qkv.unbind(2), ok), ok)


def test_kvpacked_backward_gqa():
    g = torch.Generator().manual_seed(3)
    q, kv, dout = _randn(2, 20, 4, 64, g=g), _randn(2, 29, 2, 1, 64, g=g), _randn(2, 20, 4, 64, g=g)
    got = _grads(lambda a, b: fai.flash_attn_kvpacked_func(a, b, softmax_scale=0.2), [q, kv], dout)
    ref = _grads(lambda a, b: _reference(a, *b.unbind(2), scale=0.2)[0], [q.double(), kv.double()],
                 dout.double())
    ok = _visible(20, 29, [29, 29], False, (-1, -1))
    own = _grads(lambda a, b: _torch_own(a, *b.unbind(2), ok, scale=0.2), [q, kv], dout)
    rows = torch.ones(2, 29, 1, dtype=torch.bool)
    _assert_close(got[0], ref[0], own[0], torch.ones(2, 20, 1, dtype=torch.bool), checks.GRAD_FACTOR, "dq")
    for i in range(2):
        _assert_close(got[1][:, :, i], ref[1][:, :, i], own[1][:, :, i], rows, checks.GRAD_FACTOR, "dkv")


@pytest.mark.parametrize("causal, window, softcap", [(True, (16, 0), 0.0), (False, (7, 5), 0.0),
                                                    (True, (-1, -1), 5.0)])
def test_func_window_and_softcap(causal, window, softcap):
    """window_size and softcap reach the kernel (needs its window= / softcap= keywords)."""
    g = torch.Generator().manual_seed(4)
    q, k, v = _randn(1, 45, 2, 64, g=g, scale=3.0), _randn(1, 45, 2, 64, g=g), _randn(1, 45, 2, 64, g=g)
    o, lse, _ = fai.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                    return_attn_probs=True)
    o_ref, lse_ref, ok = _reference(q, k, v, causal, window, softcap)
    _assert_close(o, o_ref, _torch_own(q, k, v, ok, softcap), ok)
    _assert_lse(lse, lse_ref)


@pytest.mark.parametrize("kw, passed", [
    ({}, {}),
    ({"causal": True, "window_size": (-1, 5)}, {}),  # causal forces right = 0: plain causal
    ({"window_size": (-1, -1), "softcap": 0.0, "deterministic": False}, {}),
    ({"causal": True, "window_size": (8, 3)}, {"window": (8, 0)}),
    ({"window_size": (-1, 3)}, {"window": (-1, 3)}),
    ({"softcap": 30, "deterministic": True}, {"softcap": 30.0, "deterministic": True}),
])
@pytest.mark.parametrize("grad", [True, False])
def test_keywords_reach_the_kernels(kw, passed, grad, monkeypatch):
    """flash-attn's window_size / softcap / deterministic become the kernels' keywords, only where they are on
    (a call with defaults passes none, so it runs on kernels without them): through autograd (inputs that
    require grad) and through the eager launch (the window and softcap; deterministic is the backward's)."""
    seen = []
    for name in ("flash_attention", "flash_attention_varlen"):
        monkeypatch.setattr(fai, name, lambda *a, **k: seen.append(k) or a[0])
    # the eager launches: fwd._launch(q, k, v, causal, scale, return_lse, config, impl, window, softcap, ..)
    monkeypatch.setattr(fai, "_launch_fwd", lambda *a: seen.append(dict(window=a[8], softcap=a[9])) or a[:3])
    monkeypatch.setattr(fai, "_launch_varlen", lambda *a, **k: seen.append(k) or a[:2])
    q, k, v = (t.requires_grad_(grad) for t in _small(torch.Generator().manual_seed(0)))
    fai.flash_attn_func(q, k, v, **kw)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    fai.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8, **kw)
    if not grad:
        passed = {"window": passed.get("window"), "softcap": passed.get("softcap", 0.0)}
    assert seen == [passed, passed]


# --- varlen ----------------------------------------------------------------------------------------
def _packed(lengths_q, lengths_k, hq, hkv, g):
    q = _randn(sum(lengths_q), hq, 64, g=g, scale=2.0)
    k, v = _randn(sum(lengths_k), hkv, 64, g=g), _randn(sum(lengths_k), hkv, 64, g=g)
    cu = [torch.tensor([0, *np.cumsum(n).tolist()], dtype=torch.int32, device=DEVICE)
          for n in (lengths_q, lengths_k)]
    return q, k, v, *cu


def _per_sequence(fn, tensors, cus):
    """Apply fn to each sequence's slices ([1, N, H, d]) and pack the results back along dim 0."""
    outs = []
    for s in range(len(cus[0]) - 1):
        parts = [t[c[s]:c[s + 1]][None] for t, c in zip(tensors, cus, strict=True)]
        outs.append(fn(*parts))
    return outs


@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (False, (-1, -1)), (True, (9, 0))])
def test_varlen_forward_and_lse(causal, window):
    g = torch.Generator().manual_seed(5)
    lq, lk = [17, 1, 40], [30, 5, 40]
    q, k, v, cq, ck = _packed(lq, lk, 4, 2, g)
    o, lse, probs = fai.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                                               window_size=window, return_attn_probs=True)
    assert probs is None and o.shape == q.shape and lse.shape == (4, sum(lq))
    refs = _per_sequence(lambda a, b, c: _reference(a, b, c, causal, window), (q, k, v), (cq, ck, ck))
    for s, (o_ref, lse_ref, ok) in enumerate(refs):
        a, b = int(cq[s]), int(cq[s + 1])
        qs, ks, vs = q[a:b][None], k[int(ck[s]):int(ck[s + 1])][None], v[int(ck[s]):int(ck[s + 1])][None]
        _assert_close(o[a:b][None], o_ref, _torch_own(qs, ks, vs, ok), ok, what=f"sequence {s}")
        _assert_lse(lse[:, a:b][None], lse_ref)


def test_varlen_backward():
    """Gradients through flash_attention_varlen (needs its backward)."""
    g = torch.Generator().manual_seed(6)
    lq = [13, 20]
    q, k, v, cq, _ = _packed(lq, lq, 2, 2, g)
    dout = _randn(*q.shape, g=g)
    got = _grads(lambda a, b, c: fai.flash_attn_varlen_func(a, b, c, cq, cq, 20, 20, causal=True), [q, k, v],
                 dout)
    ref = _grads(lambda a, b, c: torch.cat([_reference(a[x:y][None], b[x:y][None], c[x:y][None], True)[0][0]
                                            for x, y in ((0, 13), (13, 33))]), [q.double(), k.double(),
                                                                                 v.double()], dout.double())
    causal = [_visible(y - x, y - x, [y - x], True, (-1, -1)) for x, y in ((0, 13), (13, 33))]
    own = _grads(lambda a, b, c: torch.cat([_torch_own(a[x:y][None], b[x:y][None], c[x:y][None], m)[0]
                                            for (x, y), m in zip(((0, 13), (13, 33)), causal, strict=True)]),
                 [q, k, v], dout)
    rows = torch.ones(1, 33, 1, dtype=torch.bool)
    for name, a, b, c in zip("qkv", got, ref, own, strict=True):
        _assert_close(a[None], b[None], c[None], rows, checks.GRAD_FACTOR, f"d{name}")


def test_varlen_kvpacked_forward_and_lse():
    """kv [total_k, 2, Hkv, d]: the same result as flash_attn_varlen_func on its unbind views, GQA."""
    g = torch.Generator().manual_seed(8)
    lq, lk = [17, 1, 40], [30, 5, 40]
    q, k, v, cq, ck = _packed(lq, lk, 4, 2, g)
    kv = torch.stack([k, v], 1)
    o, lse, probs = fai.flash_attn_varlen_kvpacked_func(q, kv, cq, ck, max(lq), max(lk), causal=True,
                                                        return_attn_probs=True)
    assert probs is None and o.shape == q.shape and lse.shape == (4, sum(lq))
    for s, (o_ref, lse_ref, ok) in enumerate(_per_sequence(lambda a, b, c: _reference(a, b, c, True),
                                                           (q, k, v), (cq, ck, ck))):
        a, b, x, y = int(cq[s]), int(cq[s + 1]), int(ck[s]), int(ck[s + 1])
        _assert_close(o[a:b][None], o_ref, _torch_own(q[a:b][None], k[x:y][None], v[x:y][None], ok), ok,
                      what=f"sequence {s}")
        _assert_lse(lse[:, a:b][None], lse_ref)


def test_varlen_qkvpacked_backward():
    """qkv [total, 3, H, d], one cu_seqlens: the gradient flows through the unbind views into qkv."""
    g = torch.Generator().manual_seed(9)
    spans = ((0, 13), (13, 33))
    qkv, dout = _randn(33, 3, 2, 64, g=g), _randn(33, 2, 64, g=g)
    cu = torch.tensor([0, 13, 33], dtype=torch.int32, device=DEVICE)
    (got,) = _grads(lambda t: fai.flash_attn_varlen_qkvpacked_func(t, cu, 20, causal=True,
                                                                   window_size=(9, 0)), [qkv], dout)

    def per_sequence(fn, t):  # fn(q, k, v, mask) on each sequence's [1, n, H, d] views
        return torch.cat([fn(*(x[a:b][None] for x in t.unbind(1)),
                             _visible(b - a, b - a, [b - a], True, (9, 0)))[0] for a, b in spans])
    (ref,) = _grads(lambda t: per_sequence(lambda a, b, c, _: _reference(a, b, c, True, (9, 0))[0], t),
                    [qkv.double()], dout.double())
    (own,) = _grads(lambda t: per_sequence(_torch_own, t), [qkv], dout)
    rows = torch.ones(1, 33, 1, dtype=torch.bool)
    for i in range(3):
        _assert_close(got[None, :, i], ref[None, :, i], own[None, :, i], rows, checks.GRAD_FACTOR,
                      f"d{'qkv'[i]}")


@pytest.mark.parametrize("fn, args, match", [
    ("flash_attn_varlen_qkvpacked_func", lambda q, cu: (torch.stack([q, q], 1), cu, 8), r"qkv: .*\[total, 3"),
    ("flash_attn_varlen_qkvpacked_func", lambda q, cu: (q, cu, 8), r"qkv: expected a 4-d"),
    ("flash_attn_varlen_kvpacked_func", lambda q, cu: (q, torch.stack([q] * 3, 1), cu, cu, 8, 8),
     r"kv: .*\[total_k, 2"),
    ("flash_attn_qkvpacked_func", lambda q, cu: (torch.stack([q, q], 1)[None],), r"qkv: .*\[B, N, 3"),
    ("flash_attn_kvpacked_func", lambda q, cu: (q[None], torch.stack([q] * 3, 1)[None]),
     r"kv: .*\[B, Nk, 2")])
def test_packed_layouts_refused(fn, args, match):
    q = _small(torch.Generator().manual_seed(0))[0][0]  # [8, 2, 64]
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(InputError, match=match):
        getattr(fai, fn)(*args(q, cu))


# --- with_kvcache ----------------------------------------------------------------------------------
def _cache(b, length, hkv, g):
    return _randn(b, length, hkv, 64, g=g), _randn(b, length, hkv, 64, g=g)


def _paged(k_cache, v_cache, page, g):
    """The same cache as pages [num_pages, page, Hkv, d] in shuffled order, and its block table."""
    b, length, hkv, d = k_cache.shape
    per = length // page
    perm = torch.randperm(b * per, generator=g)
    kp, vp = (_randn(b * per + 1, page, hkv, d, g=g) for _ in range(2))  # + 1: a page no sequence owns
    table = perm.view(b, per).to(torch.int32).to(DEVICE)
    for x in range(b):
        for j in range(per):
            kp[table[x, j]] = k_cache[x, j * page:(j + 1) * page]
            vp[table[x, j]] = v_cache[x, j * page:(j + 1) * page]
    return kp, vp, table


def _gather(pages, table, length):
    """The dense view [B, length, Hkv, d] of a paged cache."""
    return torch.stack([pages[table[x].long()].flatten(0, 1)[:length] for x in range(table.shape[0])])


@pytest.mark.parametrize("paged, nq", [(False, 1), (False, 3), (True, 1), (True, 4)])
def test_kvcache_append_then_attend(paged, nq):
    """New k/v land at cache_seqlens (ragged, incl. 0) in place; attention sees the updated cache."""
    g = torch.Generator().manual_seed(7)
    b, length, hq, hkv = 3, 64, 4, 2
    k_cache, v_cache = _cache(b, length, hkv, g)
    lens = torch.tensor([0, 17, 64 - nq], dtype=torch.int32, device=DEVICE)
    q, k_new, v_new = _randn(b, nq, hq, 64, g=g, scale=2.0), *_cache(b, nq, hkv, g)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for x in range(b):
        expected_k[x, lens[x]:lens[x] + nq], expected_v[x, lens[x]:lens[x] + nq] = k_new[x], v_new[x]
    if paged:
        kc, vc, table = _paged(k_cache, v_cache, 16, g)
        spare = kc[-1].clone()  # a page no sequence owns: never written
    else:
        kc, vc, table = k_cache, v_cache, None
    o, lse = fai.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                         causal=True, return_softmax_lse=True)
    got_k, got_v = (_gather(kc, table, length), _gather(vc, table, length)) if paged else (kc, vc)
    assert torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)
    if paged:
        assert torch.equal(kc[-1], spare)
    o_ref, lse_ref, ok = _reference(q, expected_k, expected_v, True, lens=(lens + nq).tolist())
    assert o.shape == q.shape and lse.shape == (b, hq, nq)
    _assert_close(o, o_ref, _torch_own(q, expected_k, expected_v, ok), ok)
    _assert_lse(lse, lse_ref)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("lens_kind", ["tensor", "strided", "int"])
def test_kvcache_append_steps_launch_the_kept_plan_on_the_new_lengths(paged, lens_kind):
    """Decode steps with an append: from the second step the attention launches the plan its check found
    before the append (one lookup), on the lengths the append wrote; a lengths tensor laid out unlike the new
    one (strided) takes the plain path. Each step equals the native flash_decode on the updated cache."""
    g = torch.Generator().manual_seed(29)
    b, length, hq, hkv = 2, 48, 4, 2
    k_cache, v_cache = _cache(b, length, hkv, g)
    kc, vc, table = _paged(k_cache, v_cache, 16, g) if paged else (k_cache, v_cache, None)
    start = [7, 7] if lens_kind == "int" else [7, 20]
    for step in range(3):
        q, k_new, v_new = _randn(b, 1, hq, 64, g=g, scale=2.0), *_cache(b, 1, hkv, g)
        now = [x + step for x in start]
        if lens_kind == "int":
            lens = now[0]
        elif lens_kind == "strided":
            lens = torch.tensor([now[0], -1, now[1], -1], dtype=torch.int32, device=DEVICE)[::2]
        else:
            lens = torch.tensor(now, dtype=torch.int32, device=DEVICE)
        o = fai.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table)
        after = torch.tensor([x + 1 for x in now], dtype=torch.int32, device=DEVICE)
        native = attnscope.flash_decode(q.transpose(1, 2), kc if paged else kc.transpose(1, 2),
                                        vc if paged else vc.transpose(1, 2), after, table)
        assert torch.equal(o, native.transpose(1, 2)), f"step {step}"
        got_k = _gather(kc, table, length) if paged else kc
        assert all(torch.equal(got_k[x, now[x]], k_new[x, 0]) for x in range(b))


@pytest.mark.parametrize("n_new", [0, 1, 2])
def test_kvcache_int_seqlens_append_then_attend(n_new):
    """An int cache_seqlens with new k/v on a dense cache, one query per sequence (no lengths tensor is made:
    the append writes only the keys, the attention takes cache_seqlens + Nnew as an int): the new rows land
    at cache_seqlens, nothing else changes, and the output is the native call's on the first cache_seqlens
    + Nnew keys, bit for bit, within the float64 bound."""
    g = torch.Generator().manual_seed(9)
    b, length, hq, hkv, base = 3, 48, 4, 2, 29
    k_cache, v_cache = _cache(b, length, hkv, g)
    q, k_new, v_new = _randn(b, 1, hq, 64, g=g, scale=2.0), *_cache(b, n_new, hkv, g)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k[:, base:base + n_new], expected_v[:, base:base + n_new] = k_new, v_new
    o = fai.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=base)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    n = base + n_new
    native = decode.flash_decode(q.transpose(1, 2), k_cache[:, :n].transpose(1, 2),
                                 v_cache[:, :n].transpose(1, 2))
    assert torch.equal(o, native.transpose(1, 2))
    o_ref, _, ok = _reference(q, expected_k, expected_v, lens=[n] * b)
    _assert_close(o, o_ref, _torch_own(q, expected_k, expected_v, ok), ok)


def test_kvcache_int_seqlens_and_no_append():
    g = torch.Generator().manual_seed(8)
    k_cache, v_cache = _cache(2, 48, 1, g)
    q = _randn(2, 1, 4, 64, g=g)
    before = k_cache.clone()
    o = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=30, softmax_scale=0.3)
    assert torch.equal(k_cache, before)
    o_ref, _, ok = _reference(q, k_cache, v_cache, scale=0.3, lens=[30, 30])
    _assert_close(o, o_ref, _torch_own(q, k_cache, v_cache, ok, scale=0.3), ok)
    o_full = fai.flash_attn_with_kvcache(q, k_cache, v_cache)  # no lengths: the whole cache
    o_ref, _, ok = _reference(q, k_cache, v_cache)
    _assert_close(o_full, o_ref, _torch_own(q, k_cache, v_cache, ok), ok)


@pytest.mark.parametrize("paged, nq", [(False, 1), (False, 3), (True, 1), (True, 2)])
@pytest.mark.parametrize("return_lse", [False, True])
def test_kvcache_known_layout_launches_as_the_first_call(paged, nq, return_lse):
    """A layout flash_decode has planned is launched on flash-attn's tensors as given: the same bits as the
    first call (which plans through the views) and as the native call on the views, one plan for all three;
    out [B, Nq, Hq, d] (contiguous with one query per sequence)."""
    g = torch.Generator().manual_seed(21)
    k_cache, v_cache = _cache(2, 64, 2, g)
    q = _randn(2, nq, 4, 64, g=g)
    lens = torch.tensor([40, 64], dtype=torch.int32, device=DEVICE)
    kc, vc, table = _paged(k_cache, v_cache, 16, g) if paged else (k_cache, v_cache, None)
    decode.clear_plan_cache()
    calls = [fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                         return_softmax_lse=return_lse) for _ in range(2)]
    native = decode.flash_decode(q.transpose(1, 2), kc if paged else kc.transpose(1, 2),
                                 vc if paged else vc.transpose(1, 2), lens, table, return_lse=return_lse)
    assert decode.plan_cache_info()[:2] == (2, 1)  # planned once, then served from the cache
    native = (native[0].transpose(1, 2), native[1]) if return_lse else native.transpose(1, 2)
    for got in calls:
        o = got[0] if return_lse else got
        assert o.shape == q.shape and (nq > 1 or o.is_contiguous())
        for a, b in zip(got if return_lse else (got,), native if return_lse else (native,), strict=True):
            assert torch.equal(a, b)
    o_ref, _, ok = _reference(q, k_cache, v_cache, True, lens=lens.tolist())
    _assert_close(calls[1][0] if return_lse else calls[1], o_ref, _torch_own(q, k_cache, v_cache, ok), ok)


def test_kvcache_int_seqlens_one_plan_for_every_length():
    """An int cache_seqlens of a dense cache, one query per sequence: every sequence's first that many keys
    (checked against float64 at 1, 17, 30, 47, 48 = L), served by one plan (a plan per split count: one
    here), the same bits call to call."""
    g = torch.Generator().manual_seed(22)
    k_cache, v_cache = _cache(2, 48, 2, g)
    q = _randn(2, 1, 4, 64, g=g)
    decode.clear_plan_cache()
    for n in (1, 17, 30, 47, 48):
        o = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=n)
        o_ref, _, ok = _reference(q, k_cache, v_cache, lens=[n, n])
        _assert_close(o, o_ref, _torch_own(q, k_cache, v_cache, ok), ok)
        again = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=n)
        assert torch.equal(o, again)
    assert decode.plan_cache_info()[:2] == (9, 1)  # one split at every length: one plan
    decode.check_errors()  # every length was in range: nothing recorded


def test_kvcache_int_seqlens_outside_the_cache_as_before():
    """An int 0 attends to nothing (out 0, LSE -inf); one past L is refused on the host (an int is known
    there; a lengths tensor is checked on the device); caches of two shapes are named with their shapes as
    given."""
    g = torch.Generator().manual_seed(23)
    k_cache, v_cache = _cache(2, 48, 2, g)
    q = _randn(2, 1, 4, 64, g=g)
    o, lse = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=0, return_softmax_lse=True)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()
    decode.check_errors()
    with pytest.raises(InputError, match=r"^cache_seqlens: expected 0 or an int from Nq = 1 to the cache's "
                                         r"capacity 48, got 49$"):
        fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=49)
    decode.check_errors()  # refused before any launch: nothing recorded
    with pytest.raises(InputError, match=r"v_cache: expected shape \(as k_cache\) \(2, 2, 48, 64\), got "
                                         r"\(2, 2, 40, 64\)"):
        fai.flash_attn_with_kvcache(q, k_cache, v_cache[:, :40], cache_seqlens=30)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_window_and_softcap(paged):
    """window_size / softcap reach flash_decode (needs its window= / softcap= keywords)."""
    g = torch.Generator().manual_seed(9)
    k_cache, v_cache = _cache(2, 64, 2, g)
    lens = torch.tensor([40, 63], dtype=torch.int32, device=DEVICE)
    q = _randn(2, 2, 2, 64, g=g, scale=3.0)
    kc, vc, table = _paged(k_cache, v_cache, 16, g) if paged else (k_cache, v_cache, None)
    o = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                    window_size=(10, 0), softcap=4.0)
    o_ref, _, ok = _reference(q, k_cache, v_cache, True, (10, 0), 4.0, lens=lens.tolist())
    _assert_close(o, o_ref, _torch_own(q, k_cache, v_cache, ok, 4.0), ok)


def _attended(o, q, k_cache, v_cache, lens, rows):
    """The outputs of ``rows`` are their attention over the first ``lens`` keys (causal)."""
    o_ref, _, ok = _reference(q[rows], k_cache[rows], v_cache[rows], True, lens=lens)
    _assert_close(o[rows], o_ref, _torch_own(q[rows], k_cache[rows], v_cache[rows], ok), ok)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_append_that_does_not_fit_is_not_written_and_is_recorded(paged):
    """A tensor cache_seqlens is checked on the device (no host read): a sequence whose new keys do not
    fit (63 + 2 > 64; -1) is left as it was, the others are appended and attended, check_errors raises."""
    g = torch.Generator().manual_seed(11)
    b, length, hq, hkv, nq = 3, 64, 4, 2, 2
    k_cache, v_cache = _cache(b, length, hkv, g)
    lens = torch.tensor([10, 63, -1], dtype=torch.int32, device=DEVICE)
    q, k_new, v_new = _randn(b, nq, hq, 64, g=g), *_cache(b, nq, hkv, g)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k[0, 10:12], expected_v[0, 10:12] = k_new[0], v_new[0]
    kc, vc, table = _paged(k_cache, v_cache, 16, g) if paged else (k_cache, v_cache, None)
    pages_before = kc.clone()
    decode.check_errors()  # nothing pending from other tests
    o = fai.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                    causal=True)
    got_k, got_v = (_gather(kc, table, length), _gather(vc, table, length)) if paged else (kc, vc)
    assert torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)
    if paged:
        assert torch.equal(kc[-1], pages_before[-1])  # the page no sequence owns
    with pytest.raises(InputError, match="cache_seqlens: expected values in"):
        decode.check_errors()
    _attended(o, q, expected_k, expected_v, [12], [0])


@pytest.mark.parametrize("as_int", [False, True])
def test_kvcache_append_to_a_page_outside_the_cache_is_not_written_and_is_recorded(as_int):
    """A block-table entry outside [0, num_pages) where a new key would go: that sequence is not written
    (no page changes but the other sequence's), the other is appended and attended, check_errors raises."""
    g = torch.Generator().manual_seed(12)
    b, length, hq, hkv, nq = 2, 64, 2, 2, 1
    k_cache, v_cache = _cache(b, length, hkv, g)
    q, k_new, v_new = _randn(b, nq, hq, 64, g=g), *_cache(b, nq, hkv, g)
    kc, vc, table = _paged(k_cache, v_cache, 16, g)
    table[1, 1] = kc.shape[0] + 5  # sequence 1's new key (position 20) would go to page table[1, 1]
    k_before, v_before = kc.clone(), vc.clone()
    decode.check_errors()
    lens = 20 if as_int else torch.tensor([20, 20], dtype=torch.int32, device=DEVICE)
    o = fai.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table)
    page, slot = int(table[0, 1]), 20 % 16
    k_before[page, slot], v_before[page, slot] = k_new[0, 0], v_new[0, 0]
    assert torch.equal(kc, k_before) and torch.equal(vc, v_before)
    with pytest.raises(InputError, match="block_table: expected used page indices"):
        decode.check_errors()
    _attended(o, q, _gather(kc, table[:1], 21).expand(b, -1, -1, -1),
              _gather(vc, table[:1], 21).expand(b, -1, -1, -1), [21], [0])


@pytest.mark.parametrize("nq, n_new, as_int", [(1, 0, False), (1, 1, False), (3, 3, False), (1, 1, True)])
def test_kvcache_batch_idx_reads_and_appends_the_rows_named(nq, n_new, as_int):
    """cache_batch_idx: query row b reads (and appends to) row cache_batch_idx[b] of the dense cache, in
    place; the other rows are untouched; the output is the attention over those rows' updated keys."""
    g = torch.Generator().manual_seed(13)
    rows, b, length, hq, hkv = 4, 3, 48, 4, 2  # L 48: pages of 16
    k_cache, v_cache = _cache(rows, length, hkv, g)
    idx = torch.tensor([2, 0, 3], dtype=torch.int64, device=DEVICE)
    lens_list = [20, 20, 20] if as_int else [5, 20, 40]
    lens = 20 if as_int else torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    q = _randn(b, nq, hq, 64, g=g, scale=2.0)
    new = _cache(b, n_new, hkv, g) if n_new else (None, None)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for x in range(b):
        if n_new:
            r, n = int(idx[x]), lens_list[x]
            want_k[r, n:n + n_new], want_v[r, n:n + n_new] = new[0][x], new[1][x]
    o = fai.flash_attn_with_kvcache(q, k_cache, v_cache, *new, cache_seqlens=lens, cache_batch_idx=idx,
                                    causal=True)
    decode.check_errors()
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # row 1 untouched too
    seen = [n + n_new for n in lens_list]
    o_ref, _, ok = _reference(q, want_k[idx], want_v[idx], True, lens=seen)
    _assert_close(o, o_ref, _torch_own(q, want_k[idx], want_v[idx], ok), ok)


def test_kvcache_batch_idx_refusals_and_an_index_outside_the_cache():
    """cache_batch_idx: one clear line for a paged cache, a length that is not whole pages, strides the
    pages cannot follow and a wrong index tensor; an index outside [0, B_c) is not followed (nothing is
    written) and check_errors reports it."""
    g = torch.Generator().manual_seed(14)
    k_cache, v_cache = _cache(2, 32, 2, g)
    q = _randn(2, 1, 2, 64, g=g)
    idx = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    table = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match="cache_batch_idx: supported with a dense cache"):
        fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4, block_table=table,
                                    cache_batch_idx=idx)
    short_k, short_v = _cache(2, 40, 2, g)
    with pytest.raises(NotImplementedError, match="a multiple of 16 .* got L = 40"):
        fai.flash_attn_with_kvcache(q, short_k, short_v, cache_seqlens=4, cache_batch_idx=idx)
    wide_k, wide_v = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (k_cache, v_cache))
    with pytest.raises(NotImplementedError, match="rows follow each other"):
        fai.flash_attn_with_kvcache(q, wide_k, wide_v, cache_seqlens=4, cache_batch_idx=idx)
    for bad in (idx[:1], idx.float(), [1, 0]):
        with pytest.raises(InputError, match="cache_batch_idx: expected an int32 or int64 tensor"):
            fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4, cache_batch_idx=bad)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    k_new, v_new = _cache(2, 1, 2, g)
    far = torch.tensor([1, 2**32], dtype=torch.int64, device=DEVICE)  # 2**32: wraps to 0 as int32
    fai.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=4, cache_batch_idx=far)
    before_k[1, 4], before_v[1, 4] = k_new[0, 0], v_new[0, 0]  # row 0 of q appended to cache row 1 only
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)
    with pytest.raises(InputError, match=r"block_table: .* cache_batch_idx rows in \[0, the cache's batch\)"):
        decode.check_errors()


@pytest.mark.parametrize("nq, n_new", [(1, 0), (1, 1), (3, 3)])
def test_kvcache_leftpad_attends_from_each_start(nq, n_new):
    """cache_leftpad: sequence b attends to its cache positions [cache_leftpad[b], cache_seqlens[b] + Nnew),
    the new keys appended at cache_seqlens[b] as without it (flash-attn's left-padded batch)."""
    g = torch.Generator().manual_seed(15)
    b, length, hq, hkv = 3, 48, 4, 2
    k_cache, v_cache = _cache(b, length, hkv, g)
    lens_list, starts_list = [30, 12, 40], [0, 9, 25]
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    starts = torch.tensor(starts_list, dtype=torch.int32, device=DEVICE)
    q = _randn(b, nq, hq, 64, g=g, scale=2.0)
    new = _cache(b, n_new, hkv, g) if n_new else (None, None)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for x in range(b):
        if n_new:
            n = lens_list[x]
            want_k[x, n:n + n_new], want_v[x, n:n + n_new] = new[0][x], new[1][x]
    o = fai.flash_attn_with_kvcache(q, k_cache, v_cache, *new, cache_seqlens=lens, cache_leftpad=starts,
                                    causal=True)
    decode.check_errors()
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    moved_k, moved_v = torch.zeros_like(want_k), torch.zeros_like(want_v)  # each sequence from its start
    for x, (s0, n) in enumerate(zip(starts_list, lens_list, strict=True)):
        e = n + n_new
        moved_k[x, :e - s0], moved_v[x, :e - s0] = want_k[x, s0:e], want_v[x, s0:e]
    seen = [n + n_new - s0 for s0, n in zip(starts_list, lens_list, strict=True)]
    o_ref, _, ok = _reference(q, moved_k, moved_v, True, lens=seen)
    _assert_close(o, o_ref, _torch_own(q, moved_k, moved_v, ok), ok)
    with pytest.raises(NotImplementedError, match="cache_leftpad: supported without cache_batch_idx"):
        fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=starts,
                                    cache_batch_idx=torch.arange(b, device=DEVICE))


# --- with_kvcache: rotary embedding ---------------------------------------------------------------
def _tables(seqlen_ro, rotary_dim):
    """flash-attn's cos / sin tables [seqlen_ro, rotary_dim / 2] at DT (RoPE's frequencies, base 10000)."""
    inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angle = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angle.cos().to(DT).to(DEVICE), angle.sin().to(DT).to(DEVICE)


def _rope(x, pos, cos, sin, interleaved):
    """float64 reference of flash-attn's rotary: x [B, N, H, d] at positions pos [B, N]; pair i of the
    first rotary_dim dims is (2i, 2i + 1) interleaved, else (i, i + rotary_dim / 2); the rest untouched."""
    half = cos.shape[1]
    x, c, s = x.double().cpu(), cos.double().cpu()[pos], sin.double().cpu()[pos]  # c, s: [B, N, half]
    out = x.clone()
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        ci, si = c[..., i, None], s[..., i, None]  # [B, N, 1]: every head
        out[..., a] = x[..., a] * ci - x[..., b] * si
        out[..., b] = x[..., a] * si + x[..., b] * ci
    return out


@pytest.mark.parametrize("paged, nq, n_new, interleaved, rotary_dim, as_int, causal", [
    (False, 1, 1, True, 64, False, True),     # the whole head rotated, GPT-J pairs
    (False, 3, 3, False, 32, False, True),    # chunked prefill, GPT-NeoX halves, half the head rotated
    (False, 1, 3, True, 16, False, True),     # three new keys, one query: it sits at cache_seqlens + 0
    (False, 1, 1, False, 48, True, False),    # int lengths; non-causal: the query at cache_seqlens
    (True, 1, 1, False, 16, True, True),
    (True, 4, 4, True, 48, False, True),
])
def test_kvcache_rotary_then_append_then_attend(paged, nq, n_new, interleaved, rotary_dim, as_int, causal):
    """flash-attn's rotary: new key j rotated at cache_seqlens[b] + j before it is appended, query j at
    cache_seqlens[b] + j (causal / local) or cache_seqlens[b]; the cache's old keys as they were."""
    g = torch.Generator().manual_seed(21)
    b, length, hq, hkv, d = 3, 64, 4, 2, 64
    k_cache, v_cache = _cache(b, length, hkv, g)
    base = [13] * b if as_int else [0, 17, length - n_new]
    lens = 13 if as_int else torch.tensor(base, dtype=torch.int32, device=DEVICE)
    q, k_new, v_new = _randn(b, nq, hq, d, g=g, scale=2.0), *_cache(b, n_new, hkv, g)
    cos, sin = _tables(length, rotary_dim)
    k_pos = torch.tensor(base)[:, None] + torch.arange(n_new)
    q_pos = torch.tensor(base)[:, None] + (torch.arange(nq) if causal else torch.zeros(nq, dtype=torch.long))
    k_rot, q_rot = _rope(k_new, k_pos, cos, sin, interleaved), _rope(q, q_pos, cos, sin, interleaved)
    assert not torch.allclose(k_rot, k_new.double().cpu())  # the rotation moves the keys
    expected_k, expected_v = k_cache.double().cpu(), v_cache.double().cpu()
    for x in range(b):
        expected_k[x, base[x]:base[x] + n_new], expected_v[x, base[x]:base[x] + n_new] = k_rot[x], v_new[x]
    kc, vc, table = _paged(k_cache, v_cache, 16, g) if paged else (k_cache.clone(), v_cache.clone(), None)
    q_before, k_before = q.clone(), k_new.clone()
    o, lse = fai.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                         cache_seqlens=lens, block_table=table, causal=causal,
                                         rotary_interleaved=interleaved, return_softmax_lse=True)
    assert torch.equal(q, q_before) and torch.equal(k_new, k_before)  # the inputs are not rotated in place
    got_k, got_v = (_gather(kc, table, length), _gather(vc, table, length)) if paged else (kc, vc)
    assert torch.equal(got_v.double().cpu(), expected_v)
    # the appended keys: the fp32 rotation rounded once to DT (half an ulp of |k| <= ~8: 2^-5)
    assert (got_k.double().cpu() - expected_k).abs().max() <= 2.0 ** -5
    assert torch.equal(got_k[..., rotary_dim:].double().cpu(), expected_k[..., rotary_dim:])
    # attention over the rotated q and k as held at DT (flash-attn's kernel holds them at q's dtype too):
    # the LSE bound is for the attention, not for the rounding of a rotated q of |q| ~ 2
    q_rot, expected_k = q_rot.to(DT).double(), expected_k.to(DT).double()
    o_ref, lse_ref, ok = _reference(q_rot, expected_k, expected_v, causal, lens=[n + n_new for n in base])
    _assert_close(o, o_ref, _torch_own(q_rot.to(DT), expected_k.to(DT), expected_v.to(DT), ok), ok)
    _assert_lse(lse, lse_ref)


def test_kvcache_rotary_positions_outside_the_tables_are_clamped():
    """A tensor length whose new keys do not fit (63 + 2 > 64; -1) is not read back: its positions are
    clamped into the tables (never a read outside them), the append records it, the other sequence is
    rotated, appended and attended as flash-attn would."""
    g = torch.Generator().manual_seed(22)
    b, length, hq, hkv, nq = 3, 64, 4, 2, 2
    k_cache, v_cache = _cache(b, length, hkv, g)
    lens = torch.tensor([10, 63, -1], dtype=torch.int32, device=DEVICE)
    q, k_new, v_new = _randn(b, nq, hq, 64, g=g), *_cache(b, nq, hkv, g)
    cos, sin = _tables(length, 64)
    decode.check_errors()
    o = fai.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                    cache_seqlens=lens, causal=True)
    with pytest.raises(InputError, match="cache_seqlens: expected values in"):
        decode.check_errors()
    pos = torch.tensor([[10, 11]])
    k_rot, q_rot = _rope(k_new[:1], pos, cos, sin, True), _rope(q[:1], pos, cos, sin, True)
    assert (k_cache[:1, 10:12].double().cpu() - k_rot).abs().max() <= 2.0 ** -5
    expected_k = k_cache[:1].double().cpu()
    o_ref, _, ok = _reference(q_rot, expected_k, v_cache[:1].cpu(), True, lens=[12])
    _assert_close(o[:1], o_ref, _torch_own(q_rot.to(DT), expected_k.to(DT), v_cache[:1].cpu(), ok), ok)


def _rotary_bad(g):
    q, kc, vc = _small(g)
    cos, sin = _tables(6, 32)  # seqlen_ro 6 < the cache's 8
    return q[:, :1], kc, vc, kc[:, :1], vc[:, :1], cos, sin


@pytest.mark.parametrize("kw, match", [
    ({"rotary_sin": None}, "rotary_sin: expected a tensor \\[seqlen_ro, rotary_dim / 2\\] \\(with rotary_c"),
    ({"rotary_cos": None}, "rotary_cos: expected a tensor"),
    ({"k": None, "v": None}, "k: expected new keys with rotary_cos / rotary_sin"),
    ({"rotary_cos": "cos"}, "rotary_cos: expected a tensor"),
    ({"rotary_cos": torch.ones(8, 40, dtype=DT), "rotary_sin": torch.ones(8, 40, dtype=DT)},
     "rotary_cos: expected \\[seqlen_ro, rotary_dim / 2\\] with seqlen_ro > 0 and 0 < rotary_dim <= head_dim "
     "= 64, got shape \\(8, 40\\)"),
    ({"rotary_cos": torch.ones(0, 8, dtype=DT), "rotary_sin": torch.ones(0, 8, dtype=DT)},
     "rotary_cos: expected \\[seqlen_ro, rotary_dim / 2\\] with seqlen_ro > 0"),
    ({"rotary_cos": torch.ones(8, dtype=DT)}, "rotary_cos: expected a 2-d tensor"),
    ({"rotary_sin": torch.ones(6, 8, dtype=DT)}, "rotary_sin: expected rotary_cos's shape \\(6, 16\\)"),
    ({"rotary_cos": torch.ones(6, 16)}, "rotary_cos: expected q's dtype torch.bfloat16"),
    ({"cache_seqlens": 6}, "rotary_cos: expected seqlen_ro > 6 \\(the last position rotated: cache_seqlens 6 "
     "\\+ max\\(Nnew, Nq\\) - 1\\), got seqlen_ro = 6"),
    ({"cache_seqlens": None}, "cache_seqlens: expected the current cache lengths with rotary"),
    ({"cache_seqlens": torch.zeros(1)}, "cache_seqlens: expected an int32 tensor \\[1\\]"),
    ({"k": torch.ones(1, 1, 2, 32, dtype=DT)}, "k: expected batch 1, head_dim 64 and dtype torch.bfloat16"),
])
def test_kvcache_rotary_bad_arguments_refused_before_writing(kw, match):
    q, kc, vc, k, v, cos, sin = _rotary_bad(torch.Generator().manual_seed(23))
    args = {"k": k, "v": v, "rotary_cos": cos, "rotary_sin": sin, "cache_seqlens": 2, **kw}
    if isinstance(args["rotary_cos"], torch.Tensor):
        args["rotary_cos"] = args["rotary_cos"].to(DEVICE)
    before = kc.clone()
    with pytest.raises(InputError, match=match):
        fai.flash_attn_with_kvcache(q, kc, vc, **args)
    assert torch.equal(kc, before)


# --- what attnscope refuses ------------------------------------------------------------------------
def _small(g):
    return _randn(1, 8, 2, 64, g=g), _randn(1, 8, 2, 64, g=g), _randn(1, 8, 2, 64, g=g)


@pytest.mark.parametrize("kw, name", [({"dropout_p": 0.1}, "dropout_p"),
                                      ({"alibi_slopes": torch.zeros(2)}, "alibi_slopes")])
def test_dense_unsupported_named(kw, name):
    q, k, v = _small(torch.Generator().manual_seed(0))
    with pytest.raises(NotImplementedError, match=name):
        fai.flash_attn_func(q, k, v, **kw)


@pytest.mark.parametrize("kw, name", [({"block_table": torch.zeros(1, 1, dtype=torch.int32)}, "block_table"),
                                      ({"dropout_p": 0.5}, "dropout_p"),
                                      ({"alibi_slopes": torch.zeros(2)}, "alibi_slopes")])
def test_varlen_unsupported_named(kw, name):
    q, k, v = (t[0] for t in _small(torch.Generator().manual_seed(0)))
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match=name):
        fai.flash_attn_varlen_func(q, k, v, cu, cu, 8, 8, **kw)


@pytest.mark.parametrize("name", ["alibi_slopes"])
def test_kvcache_unsupported_named(name):
    q, k, v = _small(torch.Generator().manual_seed(0))
    with pytest.raises(NotImplementedError, match=name):
        fai.flash_attn_with_kvcache(q[:, :1], k, v, **{name: torch.zeros(1, dtype=torch.int32)})


def test_kvcache_refusals():
    g = torch.Generator().manual_seed(0)
    q, kc, vc = _small(g)
    with pytest.raises(NotImplementedError, match="causal"):  # several new queries, non-causal
        fai.flash_attn_with_kvcache(q[:, :2], kc, vc, cache_seqlens=4)
    before = kc.clone()
    with pytest.raises(InputError, match="cache_seqlens: expected cache_seqlens \\+ Nnew <= 8"):
        fai.flash_attn_with_kvcache(q[:, :2], kc, vc, kc[:, :2], vc[:, :2], cache_seqlens=7, causal=True)
    assert torch.equal(kc, before)  # refused before anything was written
    with pytest.raises(InputError, match="k_cache: expected q's dtype torch.float16"):
        fai.flash_attn_with_kvcache(q[:, :1].half(), kc, vc, kc[:, :1], vc[:, :1], cache_seqlens=2)
    assert torch.equal(kc, before)
    q32, kc32, vc32 = q[:, :1].float(), kc.float(), vc.float()  # a dtype the kernel refuses: nothing written
    before32 = kc32.clone()
    with pytest.raises(NotImplementedError, match="q: dtype torch.float32 is not supported"):
        fai.flash_attn_with_kvcache(q32, kc32, vc32, kc32[:, :1] + 1, vc32[:, :1] + 1, cache_seqlens=2)
    assert torch.equal(kc32, before32)
    with pytest.raises(InputError, match="v: expected a tensor"):
        fai.flash_attn_with_kvcache(q[:, :1], kc, vc, k=kc[:, :1], cache_seqlens=2)
    with pytest.raises(InputError, match="cache_seqlens: expected the current cache lengths"):
        fai.flash_attn_with_kvcache(q[:, :1], kc, vc, kc[:, :1], vc[:, :1])


@pytest.mark.parametrize("what, match", [
    ("v_cache", "v_cache: expected the shape of k_cache"), ("v dtype", "v: expected \\[B, Nnew, 2, 64\\]"),
    ("batch", "k_cache: expected \\[B = 2, L, Hkv, d\\]"), ("table", "block_table: expected an int32 tensor"),
    ("Nnew", "k: expected Nnew <= 8")])
def test_kvcache_append_bad_layouts_refused_before_writing(what, match):
    g = torch.Generator().manual_seed(13)
    q, kc, vc = _randn(2, 1, 2, 64, g=g), _randn(2, 8, 2, 64, g=g), _randn(2, 8, 2, 64, g=g)
    k, v, table = kc[:, :1].clone(), vc[:, :1].clone(), None
    lens = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    if what == "v_cache":
        vc = vc[:, :7]
    elif what == "v dtype":
        v = v.half()
    elif what == "batch":
        q, k, v, lens = q[:1].expand(2, -1, -1, -1), k, v, lens
        kc, vc = _randn(3, 8, 2, 64, g=g), _randn(3, 8, 2, 64, g=g)
    elif what == "table":
        kc, vc = _randn(4, 16, 2, 64, g=g), _randn(4, 16, 2, 64, g=g)
        table = torch.zeros(2, 1, dtype=torch.int64, device=DEVICE)
    else:
        k, v = _randn(2, 9, 2, 64, g=g), _randn(2, 9, 2, 64, g=g)
    before = kc.clone()
    with pytest.raises(InputError, match=match):
        fai.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)
    assert torch.equal(kc, before)


@pytest.mark.parametrize("kw, exc, match", [
    ({"softmax_scale": -1.0}, InputError, "scale: expected a finite positive number"),
    ({"softmax_scale": float("nan")}, InputError, "scale: expected a finite positive number"),
    ({"num_splits": 5000}, NotImplementedError, "num_splits: at most 1024 supported"),
    ({"softcap": 1e-40}, NotImplementedError, "softcap: 1e-40 is not supported"),
    ({"cache_leftpad": "int64"}, InputError, "cache_leftpad: expected dtype torch.int32"),
    ({"q": "Hq=3"}, InputError, "q: expected the number of query heads to be a multiple of the kv heads"),
    ({"q": "B=3"}, InputError, r"k_cache: expected batch \(as q\) 3, got 2"),
    ({"q": "grad"}, NotImplementedError, "q: decode has no backward"),
])
@pytest.mark.parametrize("as_int", [False, True])
def test_kvcache_append_refused_by_the_attention_writes_nothing(kw, exc, match, as_int):
    """What the attention after the append checks (the scale, the split count, the softcap's range,
    cache_leftpad, the heads, the batch, an input that requires grad) is refused before the new keys are
    written: a refused call leaves the cache as it was."""
    g = torch.Generator().manual_seed(17)
    q, (kc, vc) = _randn(2, 1, 4, 64, g=g), _cache(2, 16, 2, g)
    k, v = _randn(2, 2, 2, 64, g=g), _randn(2, 2, 2, 64, g=g)
    kw = dict(kw)
    shape = {"Hq=3": (2, 1, 3, 64), "B=3": (3, 1, 4, 64)}.get(kw.get("q"))
    if shape:
        q = _randn(*shape, g=g)
    if kw.pop("q", None) == "grad":
        q.requires_grad_(True)
    if kw.get("cache_leftpad") == "int64":
        kw["cache_leftpad"] = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    lens = 5 if as_int else torch.tensor([5, 9], dtype=torch.int32, device=DEVICE)
    before_k, before_v = kc.clone(), vc.clone()
    with pytest.raises(exc, match=match):
        fai.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, **kw)
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)


def test_bad_layout_and_values():
    q, k, v = _small(torch.Generator().manual_seed(0))
    with pytest.raises(InputError, match=r"q: expected a 4-d tensor \[B, Nq, Hq, d\]"):
        fai.flash_attn_func(q[0], k, v)
    with pytest.raises(InputError, match="window_size"):
        fai.flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(InputError, match="softcap"):
        fai.flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(InputError, match="qkv: expected shape"):
        fai.flash_attn_qkvpacked_func(torch.stack([q, k], 2))


@pytest.mark.parametrize("fn, kw, match", [
    ("func", {"window_size": (-1.0, -1)}, "window_size: expected a pair"),
    ("func", {"softcap": False}, "softcap: expected a finite number"),
    ("func", {"causal": 1}, "causal: expected True or False"),
    ("func", {"dropout_p": False}, "dropout_p: expected a number"),
    ("func", {"return_attn_probs": 0}, "return_attn_probs: expected True or False"),
    ("func", {"deterministic": 0}, "deterministic: expected True or False"),
    ("varlen", {"return_attn_probs": 0}, "return_attn_probs: expected True or False"),
    ("varlen", {"deterministic": 0}, "deterministic: expected True or False"),
    ("varlen", {"causal": 1}, "causal: expected True or False"),
    ("kvcache", {"num_splits": False}, "num_splits: expected an int >= 0"),
    ("kvcache", {"return_softmax_lse": 0}, "return_softmax_lse: expected True or False"),
    ("kvcache", {"rotary_interleaved": 1}, "rotary_interleaved: expected True or False"),
    ("kvcache", {"window_size": (-1.0, -1)}, "window_size: expected a pair"),
    ("kvcache", {"causal": None}, "causal: expected True or False"),
    # past the kernels' bound: named as the caller's window_size, not as the kernels' `window`
    ("func", {"window_size": (10**30, 0)}, r"^window_size: expected a pair .* from -1 to 10\^24"),
    ("varlen", {"window_size": (0, 10**25)}, r"^window_size: expected a pair .* from -1 to 10\^24"),
    ("kvcache", {"window_size": (10**30, 0)}, r"^window_size: expected a pair .* from -1 to 10\^24"),
])
def test_values_that_equal_the_defaults_but_are_not_them_are_refused(fn, kw, match):
    """The default options skip the option checks by their types and values: a look-alike (-1.0, False
    for 0, 1 for True) still gets its one-line error."""
    q, k, v = _small(torch.Generator().manual_seed(0))
    with pytest.raises(InputError, match=match):
        if fn == "func":
            fai.flash_attn_func(q, k, v, **kw)
        elif fn == "varlen":
            cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
            fai.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8, **kw)
        else:
            fai.flash_attn_with_kvcache(q[:, :1], k, v, **kw)


# --- packaging -------------------------------------------------------------------------------------
def test_help_lists_the_public_api():
    """help(attnscope) shows the lazily imported kernels (via __dir__), and the docstring names each entry."""
    import pydoc

    import attnscope

    text = pydoc.render_doc(attnscope, renderer=pydoc.plaintext)
    functions = text[text.index("FUNCTIONS"):]
    for name in ("flash_attention", "flash_attention_varlen", "flash_decode", "decode_plan", "quantize_kv"):
        assert name in dir(attnscope) and f"\n    {name}(" in functions
    assert "DecodePlan" in dir(attnscope) and "class DecodePlan" in text
    for entry in ("flash_attn_interface", "integrations.transformers.register()",
                  "distributed.ring_attention"):
        assert entry in attnscope.__doc__


def test_public_functions_carry_type_hints():
    """Every parameter and return of the public API (attnscope's entries, DecodePlan's methods, the flash-attn
    interface, ring attention, the transformers integration) is annotated."""
    import importlib.util
    import inspect

    import attnscope

    def bare(f):
        sig = inspect.signature(f)
        missing = [p for p, v in sig.parameters.items()
                   if p not in ("self", "cls") and v.annotation is v.empty]
        return missing + (["return"] if sig.return_annotation is sig.empty else [])
    funcs = {n: getattr(attnscope, n) for n in attnscope.__all__ if inspect.isfunction(getattr(attnscope, n))}
    funcs |= {f"DecodePlan.{n}": f for n, f in vars(attnscope.DecodePlan).items()
              if inspect.isfunction(f) and not n.startswith("_")}
    funcs |= {n: getattr(fai, n) for n in fai.__all__}
    from attnscope.distributed import ring
    funcs |= {f"ring.{n}": getattr(ring, n) for n in ("ring_attention", "shard", "unshard")}
    if importlib.util.find_spec("transformers") is not None:
        from attnscope.integrations import transformers as hf
        funcs |= {f"hf.{n}": getattr(hf, n)
                  for n in ("register", "filled", "padding_mask", "attention_forward")}
    assert len(funcs) >= 13 and {n: bare(f) for n, f in funcs.items() if bare(f)} == {}


def test_optional_dependencies():
    """The kernels extra pins a numpy Triton's interpreter accepts; one module imports transformers."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    root = Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "numpy<2.4" in extras["kernels"]
    assert any(r.startswith("transformers") for r in extras["transformers"])
    users = sorted(str(p.relative_to(root)) for p in (root / "src").rglob("*.py")
                   if "from transformers" in p.read_text() or "import transformers" in p.read_text())
    assert users == ["src/attnscope/integrations/transformers.py"]


# --- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("paged, rotary", [(False, False), (True, False), (False, True), (True, True)])
def test_gpu_kvcache_append_captured_in_a_cuda_graph(paged, rotary):
    """The append (and the rotary embedding's gather) reads nothing back to the host: a decode step with
    new k/v captures in a CUDA graph, and each replay appends at the lengths the tensor holds then (rotated
    at those positions), as the eager call does."""
    g = torch.Generator().manual_seed(14)
    b, length, hq, hkv = 4, 512, 8, 2
    k_cache, v_cache = _cache(b, length, hkv, g)
    kc, vc, table = _paged(k_cache, v_cache, 64, g) if paged else (k_cache, v_cache, None)
    q, k_new, v_new = _randn(b, 1, hq, 64, g=g), *_cache(b, 1, hkv, g)
    lens = torch.tensor([0, 17, 300, 510], dtype=torch.int32, device=DEVICE)
    cos, sin = _tables(length, 32)
    kw = {"rotary_cos": cos, "rotary_sin": sin, "rotary_interleaved": False} if rotary else {}
    eager_k, eager_v, eager_lens = kc.clone(), vc.clone(), lens.clone()
    expected = []
    for _ in range(2):  # eager: two steps on copies
        expected.append(fai.flash_attn_with_kvcache(q, eager_k, eager_v, k_new, v_new,
                                                    cache_seqlens=eager_lens, block_table=table, **kw))
        eager_lens += 1
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the capture (plans, compiled kernels, the index cache)
        fai.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), k_new, v_new, cache_seqlens=lens,
                                    block_table=table, **kw)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fai.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                          **kw)
    for step in range(2):
        graph.replay()
        torch.cuda.synchronize()
        # the capture's private plan may split the keys otherwise than the eager call's: not bitwise
        torch.testing.assert_close(out, expected[step], atol=1e-2, rtol=1e-2)
        lens += 1
    assert torch.equal(kc, eager_k) and torch.equal(vc, eager_v)
    decode.check_errors()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("lens", ["tensor", "int", "paged"])
def test_gpu_kvcache_known_layout_same_bits_as_the_native_call(lens):
    """On a GPU a planned layout launches through the kept binary (`_direct.DirectLaunch`) on flash-attn's
    tensors as given: the bits of the native call on the views (an int length: on the cache's first that
    many keys), call after call, the output contiguous in flash-attn's layout."""
    g = torch.Generator().manual_seed(15)
    b, length, hq, hkv, n = 4, 4096, 32, 8, 3001
    k_cache, v_cache = _cache(b, length, hkv, g)
    q = _randn(b, 1, hq, 64, g=g)
    seqlens = torch.tensor([n, 17, 4096, 1000], dtype=torch.int32, device=DEVICE)
    table = None
    if lens == "paged":
        k_cache, v_cache, table = _paged(k_cache, v_cache, 64, g)
        native = decode.flash_decode(q.transpose(1, 2), k_cache, v_cache, seqlens, table)
    elif lens == "int":
        native = decode.flash_decode(q.transpose(1, 2), k_cache[:, :n].transpose(1, 2),
                                     v_cache[:, :n].transpose(1, 2))
    else:
        native = decode.flash_decode(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                     seqlens)
    for _ in range(3):  # the first plans (through Triton), the others launch the kept binary
        o = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=n if lens == "int" else seqlens,
                                        block_table=table)
        assert o.is_contiguous() and torch.equal(o, native.transpose(1, 2))
    decode.check_errors()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fn", ["func", "kvpacked", "qkvpacked"])
@pytest.mark.parametrize("d, return_lse", [(128, False), (64, True)])
def test_gpu_dense_same_bits_as_the_native_call(fn, d, return_lse):
    """On a GPU the eager dense call launches on flash-attn's tensors as given, through the kept binary after
    the first call (the kernel `flash_attention`'s dispatch rule picks: a Hopper one on sm_90): the bits of
    `flash_attention` on the [B, H, N, d] views, call after call, the output [B, N, H, d] with the strides
    of the native output's transpose."""
    g = torch.Generator().manual_seed(16)
    b, n, hq = 2, 2048, 8
    hkv = hq if fn == "qkvpacked" else 2
    qkv = _randn(b, n, 3, hq, d, g=g)  # [B, N, 3, H, d]
    kv = _randn(b, n, 2, hkv, d, g=g)  # [B, N, 2, Hkv, d]
    q = _randn(b, n, hq, d, g=g)
    kw = {"causal": True, "return_attn_probs": return_lse}
    if fn == "qkvpacked":
        views, call = qkv.unbind(2), lambda: fai.flash_attn_qkvpacked_func(qkv, **kw)
    elif fn == "kvpacked":
        views, call = (q, *kv.unbind(2)), lambda: fai.flash_attn_kvpacked_func(q, kv, **kw)
    else:
        views, call = (q, *kv.unbind(2)), lambda: fai.flash_attn_func(q, *kv.unbind(2), **kw)
    native = attnscope.flash_attention(*(t.transpose(1, 2) for t in views), causal=True,
                                       return_lse=return_lse)
    o_native = (native[0] if return_lse else native).transpose(1, 2)
    for _ in range(3):  # the first plans (through Triton), the others launch the kept binary
        res = call()
        o = res[0] if return_lse else res
        assert o.shape == (b, n, hq, d) and o.stride() == o_native.stride() and torch.equal(o, o_native)
        if return_lse:
            assert res[2] is None and torch.equal(res[1], native[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fn", ["varlen_kvpacked", "varlen_qkvpacked"])
def test_gpu_varlen_packed_same_bits_as_the_native_call(fn):
    """On a GPU the varlen packed calls give the bits of `flash_attention_varlen` on their unbind views, with
    gradients into the packed tensor equal to the views' (deterministic mode on both)."""
    g = torch.Generator().manual_seed(17)
    lens = [700, 1, 2048, 1500]
    cu = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32, device="cuda")
    total, h, d = sum(lens), 8, 128
    packed = _randn(total, 3 if fn == "varlen_qkvpacked" else 2, h, d, g=g).requires_grad_()
    q = _randn(total, h, d, g=g).requires_grad_()
    dout = _randn(total, h, d, g=g)
    kw = {"causal": True, "deterministic": True}  # atomics-free dQ: bitwise-repeatable gradients
    leaves = [packed] if fn == "varlen_qkvpacked" else [q, packed]

    def call():
        if fn == "varlen_qkvpacked":
            return fai.flash_attn_varlen_qkvpacked_func(packed, cu, max(lens), **kw)
        return fai.flash_attn_varlen_kvpacked_func(q, packed, cu, cu, max(lens), max(lens), **kw)
    views = [t.detach().clone().requires_grad_() for t in leaves]
    qkv = views[0].unbind(1) if fn == "varlen_qkvpacked" else (views[0], *views[1].unbind(1))
    native = attnscope.flash_attention_varlen(*qkv, cu, cu, max(lens), max(lens), **kw)
    native.backward(dout)
    o = call()
    o.backward(dout)
    assert torch.equal(o, native)
    for got, ref in zip(leaves, views, strict=True):
        assert torch.equal(got.grad, ref.grad)


@pytest.mark.parametrize("causal, window, softcap, deterministic", [(True, (6, 0), 0.0, True),
                                                                     (False, (-1, 4), 5.0, False)])
def test_func_autograd_semantics_with_softmax_lse(causal, window, softcap, deterministic):
    """`grad_semantics.check_semantics` through flash_attn_func's [B, N, H, d] layout, the loss reading the
    softmax_lse of ``return_attn_probs=True`` too."""
    from grad_semantics import attention, check_semantics

    g = torch.Generator().manual_seed(8)
    q, k, v = _randn(2, 17, 4, 64, g=g), _randn(2, 33, 2, 64, g=g), _randn(2, 33, 2, 64, g=g)

    def kernel(q, k, v, _):
        o, lse, _ = fai.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                        deterministic=deterministic, return_attn_probs=True)
        return o, lse

    def ref(q, k, v, _, f64):
        o, lse = attention(*(t.transpose(1, 2) for t in (q, k, v)), None, f64, causal, window, softcap)
        return o.transpose(1, 2), lse

    check_semantics(kernel, ref, (q, k, v, None), (2, 17, 4, 64), (2, 4, 17), seed=9)
