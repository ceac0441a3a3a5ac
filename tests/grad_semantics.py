"""Autograd semantics of a differentiable attention call, shared by the kernels' tests: the gradients of
``sum(o dO) + sum(lse dLSE)`` (every output; rows whose LSE is -inf left out of the second sum) against a
float64 autograd reference, by the one rule (`checks.kernel_tolerance` with `checks.GRAD_FACTOR`: 3 x
PyTorch's own error at the input dtype, plus 1e-3), for the ways a training loop asks for them.

`check_semantics(kernel, reference, tensors)`: ``kernel(q, k, v, sinks) -> (o, lse)`` is the call under test,
``reference(q, k, v, sinks, f64) -> (o, lse)`` the same attention in plain torch ops of the same layouts
(`attention` for [B, H, N, d]), in float64 (``f64``) or at the inputs' dtype (PyTorch's own error).
"""

from __future__ import annotations

import math

import torch

from attnscope import checks, reference


def attention(q, k, v, sinks=None, f64=True, causal=False, window=None, softcap=0.0):
    """Softmax attention on q [B, Hq, Nq, d], k, v [B, Hkv, Nk, d] -> (o, lse [B, Hq, Nq]), differentiable
    in all four: in float64, or (``f64=False``) PyTorch's own at q's dtype (`checks.torch_attention`)."""
    if not f64:
        return checks.torch_attention(q, k, v, causal, window, softcap, sinks)
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, Hq, Nq, Nk]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = torch.as_tensor(reference.permitted(q.shape[2], k.shape[2], causal, window), device=s.device)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:  # one more column with no value
        s = torch.cat([s, sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a row with no key and no sink: 0
    return (p[..., :-1] if sinks is not None else p) @ vv, lse


def _grads(fn, tensors, want, do, dlse, times=1, cast=None):
    """The .grad of each of ``tensors`` (a fresh leaf that requires grad where ``want``) after ``times``
    backward passes of ``sum(o do) + sum(lse dlse)`` over one graph."""
    leaves = [None if t is None else (t if cast is None else cast(t)).detach().clone().requires_grad_(w)
              for t, w in zip(tensors, want, strict=True)]
    o, lse = fn(*leaves)
    finite = torch.isfinite(lse.detach())
    lse = lse if finite.all() else torch.where(finite, lse, 0.0)
    pairs = [(x, dx.to(x.dtype)) for x, dx in ((o, do), (lse, dlse)) if x.requires_grad]  # v alone: no LSE
    for i in range(times):
        torch.autograd.backward(*zip(*pairs, strict=True), retain_graph=i + 1 < times)
    return [None if t is None else t.grad for t in leaves]


def _assert_close(got, own, ref, what, factor=checks.GRAD_FACTOR, names=("dq", "dk", "dv")):
    for name, a, t, r in zip(names, got, own, ref, strict=False):
        if r is None:
            assert a is None, f"{what}: {name} should stay None, got a tensor"
            continue
        assert a is not None, f"{what}: {name} is None (a dropped gradient)"
        assert a.shape == r.shape and a.dtype == t.dtype, (what, name, a.shape, a.dtype)
        assert torch.isfinite(a).all(), f"{what}: {name} NaN/inf"
        err, t_err = (float((x.double() - r).abs().amax()) if r.numel() else 0.0 for x in (a, t))
        tol = checks.kernel_tolerance(t_err, factor)
        assert err <= tol, f"{what}: {name} error {err:.3g} > {tol:.3g} (torch's {t_err:.3g})"


def check_semantics(kernel, reference_fn, tensors, o_shape, lse_shape, seed=0):
    """``tensors``: (q, k, v, sinks or None). Asserts, against `reference_fn` in float64:

    - each one input requiring grad (q, k, v, sinks alone; then all but q): its gradient is right, the
      others' .grad stays None;
    - a non-contiguous dO (last stride not 1), an expanded dLSE, and two backward passes over one graph
      (``retain_graph=True``): the gradients accumulate to twice the reference;
    - ``torch.autograd.grad`` with ``allow_unused`` and an input the call never saw: None for it;
    - a call under ``torch.no_grad()`` has no graph: backward raises, never zero gradients.
    """
    g = torch.Generator().manual_seed(seed)
    dev = tensors[0].device
    do = torch.randn(tuple(reversed(o_shape)), generator=g).to(dev).permute(*reversed(range(len(o_shape))))
    assert do.stride(-1) != 1
    dlse = torch.randn(*lse_shape[:-1], 1, generator=g).to(dev).expand(lse_shape)
    n = 4 if tensors[3] is not None else 3
    low = tensors[0].dtype
    factor = 5 if low == torch.bfloat16 and n == 4 else checks.GRAD_FACTOR  # test_varlen: dsinks' D at bf16
    subsets = [tuple(i == j for j in range(4)) for i in range(n)] + [(False, True, True, True)]
    for want in subsets:
        want = tuple(w and t is not None for w, t in zip(want, tensors, strict=True))
        args = (tensors, want, do, dlse)
        got = _grads(kernel, *args)
        own = _grads(lambda *t: reference_fn(*t, False), *args)
        ref = _grads(lambda *t: reference_fn(*t, True), *args, cast=torch.Tensor.double)
        _assert_close(got[:3], own[:3], ref[:3], f"requires_grad {want}")
        _assert_close(got[3:], own[3:], ref[3:], f"requires_grad {want}", factor, ["dsinks"])
    want = tuple(t is not None for t in tensors)
    got = _grads(kernel, tensors, want, do, dlse, times=2)
    own = _grads(lambda *t: reference_fn(*t, False), tensors, want, do, dlse)
    ref = _grads(lambda *t: reference_fn(*t, True), tensors, want, do, dlse, cast=torch.Tensor.double)
    halves = [None if x is None else x / 2 for x in got]  # exact: a power of two
    _assert_close(halves[:3], own[:3], ref[:3], "backward twice")
    _assert_close(halves[3:], own[3:], ref[3:], "backward twice", factor, ["dsinks"])

    q = tensors[0].clone().requires_grad_()
    unrelated = torch.zeros(3, device=dev, requires_grad=True)
    o, _ = kernel(q, *tensors[1:])
    dq, none = torch.autograd.grad(o, [q, unrelated], do.to(o.dtype), allow_unused=True)
    assert none is None
    own = _grads(lambda *t: reference_fn(*t, False), tensors, (True, False, False, False), do, dlse * 0)
    ref = _grads(lambda *t: reference_fn(*t, True), tensors, (True, False, False, False), do, dlse * 0,
                 cast=torch.Tensor.double)
    _assert_close([dq], own[:1], ref[:1], "autograd.grad(allow_unused=True)")

    leaves = [None if t is None else t.clone().requires_grad_() for t in tensors]
    with torch.no_grad():
        o, lse = kernel(*leaves)
    assert not o.requires_grad and not lse.requires_grad
    try:
        o.sum().backward()
    except RuntimeError as e:
        assert "does not require grad" in str(e)
    else:
        raise AssertionError("backward through a call made under torch.no_grad() did not raise")
