"""The flash-attn interface dispatches what the native call it wraps does (TRITON_INTERPRET=1).

Each interface function and the native attnscope call it wraps, on the same views of flash-attn's layout
(the pairs `bench/hf.py` times), run under a `TorchDispatchMode` that records every aten op they dispatch;
the Triton launches themselves are not aten ops, and what Triton's interpreter dispatches while it stands in
for the GPU (its copies of the kernel arguments) is left out. The interface's ops are the native call's plus
`EXTRA`: the views of a packed ``qkv`` / ``kv`` (its q, k, v at their offsets); no copy, cast, cat,
contiguous, fill, allocation or layout change of its own (it launches on flash-attn's tensors as they are and
allocates the output in flash-attn's layout). The Triton kernels launched are the native call's, counted at
the interpreter. ``flash_attn_with_kvcache`` with new ``k``/``v`` adds the append flash-attn's semantics ask
for: `test_kvcache_append_adds_one_launch` names what it may dispatch.
"""

from __future__ import annotations

import collections
import os
import sys

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import attnscope  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

fai = pytest.importorskip("attnscope.flash_attn_interface")

DEVICE = kernel_device()


_TRITON = os.path.dirname(os.path.abspath(triton.__file__)) + os.sep


def _in_triton() -> bool:
    """Whether a frame of Triton's (its interpreter running a kernel on the CPU) is on the stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename).startswith(_TRITON):
            return True
        frame = frame.f_back
    return False


class _Ops(TorchDispatchMode):
    """Records the aten ops dispatched inside it but not by Triton's interpreter: (name, whether the op only
    makes a view)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _in_triton():
            self.ops[(str(func), func.is_view)] += 1
        return func(*args, **(kwargs or {}))


def _dispatched(fn) -> collections.Counter:
    fn()  # plan caches and compiled kernels warm: the second call is the steady state
    with torch.no_grad(), _Ops() as log:
        fn()
    return log.ops


def _extra(interface, native) -> collections.Counter:
    return _dispatched(interface) - _dispatched(native)


def _data_ops(ops: collections.Counter) -> dict:
    return {name: n for (name, view), n in ops.items() if not view}


def _rnd(*shape, g):
    return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=torch.bfloat16)


def _calls(return_lse: bool):
    """The (interface, native) pairs of bench/hf.py's interface table at a tiny shape, with or without LSE."""
    g = torch.Generator().manual_seed(1)
    B, N, Hq, Hkv, d = 1, 32, 4, 2, 64
    q, k, v = _rnd(B, N, Hq, d, g=g), _rnd(B, N, Hkv, d, g=g), _rnd(B, N, Hkv, d, g=g)
    kv, qkv = torch.stack([k, v], 2), _rnd(B, N, 3, Hq, d, g=g)
    cu = torch.tensor([0, 13, N], dtype=torch.int32, device=DEVICE)
    qp, kp, vp, kvp = (t[0] for t in (q, k, v, kv))
    qkvp = qkv[0]
    kvu, qkvu = kvp.unbind(1), qkvp.unbind(1)  # varlen packed views: kv, qkv [total, 2|3, H, d]
    qd, kc, vc = _rnd(2, 1, Hq, d, g=g), _rnd(2, 40, Hkv, d, g=g), _rnd(2, 40, Hkv, d, g=g)
    lens = torch.tensor([40, 17], dtype=torch.int32, device=DEVICE)
    kp_, vp_ = _rnd(5, 16, Hkv, d, g=g), _rnd(5, 16, Hkv, d, g=g)  # paged: 5 pages of 16
    table = torch.tensor([[4, 0, 2], [1, 3, 0]], dtype=torch.int32, device=DEVICE)
    t = [x.transpose(1, 2) for x in (q, k, v, kv[:, :, 0], kv[:, :, 1], *qkv.unbind(2), qd, kc, vc)]
    qv, kv_, vv, kkv, vkv, qq, kq, vq, qdv, kcv, vcv = t  # the views the interface hands the kernels
    lse = {"return_attn_probs": True} if return_lse else {}
    lse_n = {"return_lse": True} if return_lse else {}
    lse_d = {"return_softmax_lse": True} if return_lse else {}
    return {
        "flash_attn_func": (lambda: fai.flash_attn_func(q, k, v, causal=True, **lse),
                            lambda: attnscope.flash_attention(qv, kv_, vv, causal=True, **lse_n)),
        "flash_attn_kvpacked_func": (lambda: fai.flash_attn_kvpacked_func(q, kv, causal=True, **lse),
                                     lambda: attnscope.flash_attention(qv, kkv, vkv, causal=True, **lse_n)),
        "flash_attn_qkvpacked_func": (lambda: fai.flash_attn_qkvpacked_func(qkv, causal=True, **lse),
                                      lambda: attnscope.flash_attention(qq, kq, vq, causal=True, **lse_n)),
        "flash_attn_varlen_func": (
            lambda: fai.flash_attn_varlen_func(qp, kp, vp, cu, cu, 19, 19, causal=True, **lse),
            lambda: attnscope.flash_attention_varlen(qp, kp, vp, cu, cu, 19, 19, causal=True, **lse_n)),
        "flash_attn_varlen_kvpacked_func": (
            lambda: fai.flash_attn_varlen_kvpacked_func(qp, kvp, cu, cu, 19, 19, causal=True, **lse),
            lambda: attnscope.flash_attention_varlen(qp, *kvu, cu, cu, 19, 19, causal=True, **lse_n)),
        "flash_attn_varlen_qkvpacked_func": (
            lambda: fai.flash_attn_varlen_qkvpacked_func(qkvp, cu, 19, causal=True, **lse),
            lambda: attnscope.flash_attention_varlen(*qkvu, cu, cu, 19, 19, causal=True, **lse_n)),
        "flash_attn_with_kvcache": (
            lambda: fai.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, **lse_d),
            lambda: attnscope.flash_decode(qdv, kcv, vcv, cache_seqlens=lens, **lse_n)),
        "flash_attn_with_kvcache paged": (
            lambda: fai.flash_attn_with_kvcache(qd, kp_, vp_, cache_seqlens=lens, block_table=table, **lse_d),
            lambda: attnscope.flash_decode(qdv, kp_, vp_, cache_seqlens=lens, block_table=table, **lse_n)),
    }


def _launches(fn, monkeypatch) -> collections.Counter:
    """The Triton kernels ``fn()`` launches, by name, counted at the interpreter (after a warm call)."""
    from triton.runtime.interpreter import InterpretedFunction

    fn()
    seen = collections.Counter()
    real = InterpretedFunction.run

    def run(self, *args, **kwargs):
        seen[self.fn.__name__] += 1
        return real(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(InterpretedFunction, "run", run)
        with torch.no_grad():
            fn()
    return seen


#: What an interface call dispatches beyond its native call: the views of a packed tensor (one unbind gives
#: the kernels' [B, N, H, d] q, k, v at their offsets in qkv / kv, whose addresses the launch reads).
EXTRA = {"flash_attn_kvpacked_func": {("aten.unbind.int", True): 1},
         "flash_attn_qkvpacked_func": {("aten.unbind.int", True): 1},
         "flash_attn_varlen_kvpacked_func": {("aten.unbind.int", True): 1},
         "flash_attn_varlen_qkvpacked_func": {("aten.unbind.int", True): 1}}
NAMES = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
         "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
         "flash_attn_with_kvcache paged"]


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_interface_dispatches_what_the_native_call_does(name, return_lse):
    """No copy, cast, allocation or layout change of the interface's own: the native call's ops and `EXTRA`;
    a planned one-query kvcache layout not even a view (it launches on flash-attn's tensors as given)."""
    interface, native = _calls(return_lse)[name]
    ops, native_ops = _dispatched(interface), _dispatched(native)
    assert ops == native_ops + collections.Counter(EXTRA.get(name, {})), \
        f"{name}: beyond the native call {ops - native_ops}, short of it {native_ops - ops}"


@pytest.mark.skipif(DEVICE != "cpu", reason="counts launches at Triton's interpreter")
@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_interface_launches_what_the_native_call_does(name, return_lse, monkeypatch):
    interface, native = _calls(return_lse)[name]
    launched = _launches(interface, monkeypatch)
    assert launched and launched == _launches(native, monkeypatch), launched


@pytest.mark.skipif(DEVICE != "cpu", reason="counts launches at Triton's interpreter")
def test_the_launch_count_sees_an_extra_launch(monkeypatch):
    """The launch check can fail: a wrapper that launches the kernel twice is caught."""
    interface, native = _calls(False)["flash_attn_func"]
    assert _launches(lambda: (native(), native()), monkeypatch) != _launches(native, monkeypatch)


def test_the_log_sees_a_copy():
    """The check can fail: a wrapper that makes the kernels' inputs contiguous is caught."""
    g = torch.Generator().manual_seed(2)
    q, k, v = _rnd(1, 32, 4, 64, g=g), _rnd(1, 32, 2, 64, g=g), _rnd(1, 32, 2, 64, g=g)
    extra = _extra(lambda: attnscope.flash_attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v))),
                   lambda: attnscope.flash_attention(*(t.transpose(1, 2) for t in (q, k, v))))
    assert _data_ops(extra), extra
    assert any("clone" in name or "copy" in name or "empty" in name for name in _data_ops(extra))


@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("lens", ["int", "tensor"])
def test_kvcache_append_adds_one_launch(layout, lens):
    """flash_attn_with_kvcache with new k/v over flash_decode on the appended lengths: the append's one
    launch (`decode.kv_append`) and the allocation of the lengths it writes — none for an int length on a
    dense cache with one query per sequence, which the decode takes as an int; no index arithmetic, no
    lengths tensor built from an int, no host read (``_local_scalar_dense``: ``.item()``, ``bool()``)."""
    g = torch.Generator().manual_seed(3)
    q, kn, vn = _rnd(2, 1, 4, 64, g=g), _rnd(2, 1, 2, 64, g=g), _rnd(2, 1, 2, 64, g=g)
    seqlens = torch.tensor([30, 17], dtype=torch.int32, device=DEVICE)
    table = None
    if layout == "dense":
        kc, vc = _rnd(2, 40, 2, 64, g=g), _rnd(2, 40, 2, 64, g=g)
        native = (q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2))
    else:
        kc, vc = _rnd(5, 16, 2, 64, g=g), _rnd(5, 16, 2, 64, g=g)
        table = torch.tensor([[4, 0, 2], [1, 3, 0]], dtype=torch.int32, device=DEVICE)
        native = (q.transpose(1, 2), kc, vc)
    after = seqlens + 1
    extra = _extra(lambda: fai.flash_attn_with_kvcache(q, kc, vc, kn, vn, block_table=table,
                                                       cache_seqlens=seqlens if lens == "tensor" else 30),
                   lambda: attnscope.flash_decode(*native, after, table))
    lengths_out = not (lens == "int" and layout == "dense")
    assert _data_ops(extra) == ({"aten.empty.memory_format": 1} if lengths_out else {}), extra
    assert sum(n for (_, view), n in extra.items() if view) <= 5, f"more views than the layout needs: {extra}"


def test_kvcache_int_seqlens_builds_no_lengths_tensor():
    """An int cache_seqlens (dense cache, one query per sequence) builds no int32 [B] tensor per call: the
    call dispatches what the native call on the cache's first that many keys does."""
    g = torch.Generator().manual_seed(4)
    q, kc, vc = _rnd(2, 1, 4, 64, g=g), _rnd(2, 40, 2, 64, g=g), _rnd(2, 40, 2, 64, g=g)
    native = (q.transpose(1, 2), kc[:, :17].transpose(1, 2), vc[:, :17].transpose(1, 2))
    ops = _dispatched(lambda: fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=17))
    assert ops == _dispatched(lambda: attnscope.flash_decode(*native)), ops
