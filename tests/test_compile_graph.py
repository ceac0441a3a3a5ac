"""What torch.compile puts around attnscope's custom ops in a training step (CPU: TRITON_INTERPRET=1).

A decoder layer's attention block shaped as bench/train.py's (fused QKV projection viewed [B, S, H, d] and
transposed, RoPE-style ``cat`` on q and k, ``v.contiguous()``, GQA, causal, output projection of
``o.transpose(1, 2).reshape``) is compiled with ``fullgraph=True``; the forward and backward FX graphs that
AOTAutograd hands its compilers are counted node by node around ``attnscope::flash_attention`` and
``attnscope::flash_attention_backward``. Every copy next to an op must be one the model itself asks for; the
backward gets the output gradient as a view (no ``contiguous``), no zero-filled LSE gradient, and the saved
q, k, v, O, LSE (no recomputed forward).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import attnscope  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

pytest.importorskip("attnscope.kernels.fwd")  # registers the ops (and, through kernels/bwd.py, the backward)

DEVICE = kernel_device()
aten = torch.ops.aten
FWD = torch.ops.attnscope.flash_attention.default
BWD = torch.ops.attnscope.flash_attention_backward.default
#: nodes that copy or fill memory: none may sit between the model and an op unless the model asks for it
COPIES = {aten.clone.default, aten._to_copy.default, aten.copy.default, aten.copy_.default,
          aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default, aten.full.default,
          aten.fill.Scalar, aten.empty_like.default, aten.new_empty.default}
#: nodes that only re-view memory
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.transpose.int, aten.permute.default,
         aten.t.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.slice.Tensor,
         aten.detach.default}
B, S, HQ, HKV, D, HIDDEN = 1, 48, 4, 2, 64, 128


def _aot_graphs(fn, *args):
    """``fn`` compiled with ``fullgraph=True`` (a graph break raises), run forward and backward; returns the
    forward and backward graphs AOTAutograd traced."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd  # torch's documented custom-backend helper

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm.graph
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    loss = torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=keep("fw"),
                                                                  bw_compiler=keep("bw")))(*args)
    loss.backward()
    return graphs["fw"], graphs["bw"]


def _layer(rope: bool):
    """One attention block: ``loss(x, wqkv, wo)``; with ``rope`` q and k come out of a ``cat`` (contiguous
    [B, H, S, d]), without it q is the projection's transposed view ([B, S, H, d] memory, as transformers
    passes it)."""
    def rot(t):  # RoPE's shape of computation: halves, scaled, concatenated
        t1, t2 = t.chunk(2, dim=-1)
        return torch.cat((t1 * 0.5 - t2 * 0.25, t2 * 0.5 + t1 * 0.25), dim=-1)

    def loss(x, wqkv, wo):
        qkv = x @ wqkv  # [B, S, (HQ + 2 HKV) d]
        q, k, v = qkv.view(B, S, HQ + 2 * HKV, D).transpose(1, 2).split((HQ, HKV, HKV), dim=1)
        if rope:
            q, k = rot(q), rot(k)
        v = v.contiguous()
        o = attnscope.flash_attention(q, k, v, causal=True)  # [B, HQ, S, d]
        return (o.transpose(1, 2).reshape(B, S, HQ * D) @ wo).float().square().mean()
    return loss


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, HIDDEN, generator=g).to(torch.float16).to(DEVICE)
    wqkv = (torch.randn(HIDDEN, (HQ + 2 * HKV) * D, generator=g) * HIDDEN ** -0.5).to(torch.float16)
    wo = (torch.randn(HQ * D, HIDDEN, generator=g) * (HQ * D) ** -0.5).to(torch.float16)
    return x, wqkv.to(DEVICE).requires_grad_(), wo.to(DEVICE).requires_grad_()


def _through_views(node):
    """The first node at or above ``node`` that is not a view."""
    while node.op == "call_function" and node.target in VIEWS:
        node = node.args[0]
    return node


def _copies_around(graph, op):
    """Copy/fill nodes that feed a tensor input of ``op``'s calls (through views) or read their outputs
    (through views and getitem), as (direction, node)."""
    found = []
    for call in graph.find_nodes(op="call_function", target=op):
        for arg in call.args:
            if isinstance(arg, torch.fx.Node):
                src = _through_views(arg)
                if src.op == "call_function" and src.target in COPIES:
                    found.append(("in", src))
        todo = list(call.users)
        while todo:
            user = todo.pop()
            if user.op != "call_function":
                continue
            if user.target in COPIES:
                found.append(("out", user))
            elif user.target in VIEWS or user.target.__name__ == "getitem":
                todo.extend(user.users)
    return found


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "projection-view"])
def test_compiled_step_puts_no_copy_or_fill_around_the_ops(rope):
    fw, bw = _aot_graphs(_layer(rope), *_inputs())
    (fcall,) = fw.find_nodes(op="call_function", target=FWD)
    (bcall,) = bw.find_nodes(op="call_function", target=BWD)
    # forward: the only copies next to the op are the model's own: v.contiguous() (of the split view) and,
    # when q is contiguous, o.transpose(1, 2).reshape; with q the projection's view the op's output takes
    # q's [B, S, H, d] memory order (the fake impl says so), and that reshape is a view
    fcopies = _copies_around(fw, FWD)
    assert [(way, n.target) for way, n in fcopies if way == "in"] == [("in", aten.clone.default)]
    assert fcall.args[2].target is aten.clone.default  # v
    out_copies = [n for way, n in fcopies if way == "out"]
    assert len(out_copies) == (1 if rope else 0), out_copies
    for n in out_copies:
        assert n.target is aten.clone.default and n.args[0].target is aten.transpose.int
    # backward: dO is the output projection's gradient seen through views, not copied; no zero-filled LSE
    # gradient (the LSE is not used: dlse is None); the saved q, k, v, O, LSE come in as graph inputs
    assert _copies_around(bw, BWD) == []
    do, q, k, v, o, lse, dlse = bcall.args[:7]
    assert dlse is None
    assert _through_views(do).target is aten.mm.default
    assert {_through_views(t).op for t in (q, k, v, o, lse)} == {"placeholder"}
    # no recomputation: the backward graph holds no forward op, the forward graph one call
    assert bw.find_nodes(op="call_function", target=FWD) == []
    assert len(fw.find_nodes(op="call_function", target=FWD)) == 1
