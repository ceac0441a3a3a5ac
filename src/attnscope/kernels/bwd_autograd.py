"""Autograd of `attnscope::flash_attention` (kernels/fwd.py registers it, and its eager `_Attention` runs it):
the saved context, and the backward as a custom op of its own, ``attnscope::flash_attention_backward``, so
torch.compile sees one opaque node (no graph break) and torch.library.opcheck can test it; the eager path
calls `bwd.flash_attention_backward` without that op's dispatch."""

from __future__ import annotations

from attnscope.kernels import bwd
from attnscope.kernels._common import import_torch_triton

torch, triton = import_torch_triton()

_BWD_SCHEMA = ("(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor? dlse, bool causal, "
               "float scale, bool deterministic, int[]? window=None, float softcap=0.0, Tensor? sinks=None) "
               "-> (Tensor, Tensor, Tensor, Tensor)")


@torch.library.custom_op("attnscope::flash_attention_backward", mutates_args=(), schema=_BWD_SCHEMA)
def _bwd_op(do, q, k, v, o, lse, dlse, causal, scale, deterministic, window=None, softcap=0.0, sinks=None):
    """(dq, dk, dv, dsinks); dsinks is an empty float32 tensor without sinks."""
    grads = _grads(do, q, k, v, o, lse, dlse, causal, scale, deterministic, window, softcap, sinks)
    return grads if sinks is not None else (*grads[:3], lse.new_empty((0,)))


def _grads(do, q, k, v, o, lse, dlse, causal, scale, deterministic, window=None, softcap=0.0, sinks=None):
    """`_bwd_op`'s gradients, dsinks None without sinks."""
    grads = bwd.flash_attention_backward(do, q, k, v, o, lse, causal, scale, deterministic=deterministic,
                                         dlse=dlse, window=None if window is None else tuple(window),
                                         softcap=softcap, sinks=sinks)
    return grads if sinks is not None else (*grads, None)


@_bwd_op.register_fake
def _(do, q, k, v, o, lse, dlse, causal, scale, deterministic, window=None, softcap=0.0, sinks=None):
    dsinks = lse.new_empty((0,)) if sinks is None else sinks.new_empty(sinks.shape)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


_OP_DEFAULTS = (None, 0.0, None, False)  # window, softcap, sinks, deterministic of the forward op's schema


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, return_lse = inputs[:6]  # then config, impl (no gradient)
    window, softcap, sinks, deterministic = (*inputs[8:], *_OP_DEFAULTS[len(inputs) - 8:])
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, sinks)
    # an output without a gradient (the LSE, unless returned and used) comes as None, not a zero-filled
    # tensor: no fill and no ``delta - dlse`` pass in the backward of the common call
    ctx.set_materialize_grads(False)
    ctx.causal, ctx.scale, ctx.return_lse = causal, scale, return_lse
    ctx.window, ctx.softcap, ctx.deterministic = window, softcap, deterministic
    ctx.n_inputs = len(inputs)


def _backward(ctx, grad_o, grad_lse):
    """The autograd formula of `_op`: torch.compile traces `_bwd_op`, one opaque node."""
    return _autograd_grads(ctx, grad_o, grad_lse, _bwd_op)


def _eager_backward(ctx, grad_o, grad_lse):
    """`_backward` of kernels/fwd.py's eager `_Attention`: the same gradients without the custom op's
    dispatch (its per-call host time). Under ``create_graph=True`` they go through `FirstOrderOnly`, so a
    second derivative raises, as `_bwd_op`'s does, and is never silently zero."""
    grads = _autograd_grads(ctx, grad_o, grad_lse, _grads)
    if not torch.is_grad_enabled():  # the common backward: nothing will differentiate the gradients
        return grads
    return FirstOrderOnly.wrap(grads, (*ctx.saved_tensors, grad_o, grad_lse), "attnscope.flash_attention")


class FirstOrderOnly(torch.autograd.Function):
    """The identity on a backward's gradients, whose own backward raises NotImplementedError: a backward
    computed by kernels has no derivative of its own, and without this node its gradients would be
    constants to autograd (a loss on them, built with ``create_graph=True``, would lose that term)."""

    @staticmethod
    def forward(ctx, name, n, *tensors):  # the first n tensors: the gradients; the rest: what they depend on
        ctx.name = name
        return tuple(t.view_as(t) for t in tensors[:n])

    @staticmethod
    def backward(ctx, *_):
        raise NotImplementedError(f"{ctx.name}: second derivatives (a loss on gradients taken with "
                                  "create_graph=True) are not supported; supported: first derivatives")

    @staticmethod
    def wrap(grads, depends_on, name: str) -> tuple:
        """`grads` (a tuple with None for inputs without a gradient) through the node, when any of
        `depends_on` requires grad (otherwise nothing could differentiate them)."""
        inputs = [t for t in depends_on if isinstance(t, torch.Tensor) and t.requires_grad]
        present = [g for g in grads if g is not None]
        if not inputs or not present:
            return grads
        wrapped = iter(FirstOrderOnly.apply(name, len(present), *present, *inputs))
        return tuple(None if g is None else next(wrapped) for g in grads)


def _autograd_grads(ctx, grad_o, grad_lse, grads_fn):
    q, k, v, o, lse, sinks = ctx.saved_tensors
    if not ctx.return_lse:
        raise RuntimeError("attnscope::flash_attention: the backward needs the LSE; call the op with "
                           "return_lse=True (attnscope.flash_attention does so when an input requires grad)")
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    elif grad_o.stride(-1) != 1:  # e.g. the expanded gradient of a sum: the kernels need a unit last stride
        grad_o = grad_o.contiguous()
    deterministic = ctx.deterministic or not bwd.atomic_dq_by_default(q, ctx.causal, ctx.scale, ctx.window,
                                                                      ctx.softcap)
    dq, dk, dv, dsinks = grads_fn(grad_o, q, k, v, o, lse, grad_lse, ctx.causal, ctx.scale, deterministic,
                                  ctx.window, ctx.softcap, sinks)
    dsinks = dsinks if sinks is not None else None  # `_bwd_op`'s is an empty tensor
    grads = [dq, dk, dv, None, None, None, None, None, None, None, dsinks, None]
    return tuple(grads[:ctx.n_inputs])
