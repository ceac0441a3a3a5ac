"""A Llama-shaped decoder in plain torch, whose attention core is swappable (spec §5).

8B-like by default: hidden 4,096, 32 heads of d = 128 (as many K/V heads as query heads), SwiGLU MLP
14,336, RMSNorm, RoPE; random weights, nothing downloaded; no embedding and no LM head, so a prefill is
the decoder layers only. The attention core of every layer runs inside
``record_function("attnscope::attention")`` and a whole prefill inside ``"attnscope::prefill"``: the
ranges `attnscope.chrome_trace` reads. Layout: x [B, P, hidden]; q, k, v [B, H, P, d].

Training (``train=True``): the weights are leaf tensors that require grad. Autograd runs the backward
on its own thread, outside the forward's ranges, so each attention core's backward gets a range of its
own, ``"attnscope::attention_backward"``: opened by a hook on the output o when its gradient arrives and
closed by the first hook on q, k or v. Autograd runs the ready node of the highest sequence number
first, and every node of the attention's backward was created after q, k and v, so the range holds that
backward and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnscope.errors import InputError, choice, positive_int
from attnscope.measure.backends import attention_fn

ATTENTIONS = ("naive", "flash", "cudnn", "efficient", "math", "attnscope")
ANNOTATION = "attnscope::attention"
PREFILL = "attnscope::prefill"
BACKWARD = "attnscope::attention_backward"


@dataclass(frozen=True)
class LlamaShape:
    """Dimensions of the decoder (Llama-3-8B-like, with as many K/V heads as query heads)."""

    hidden: int = 4096
    heads: int = 32
    head_dim: int = 128
    mlp: int = 14336
    layers: int = 2
    eps: float = 1e-5
    rope_theta: float = 500000.0

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "head_dim", "mlp", "layers"):
            positive_int(name, getattr(self, name))
        if self.heads * self.head_dim != self.hidden:
            raise InputError(f"heads: expected heads x head_dim == hidden ({self.hidden}), "
                             f"got {self.heads} x {self.head_dim}")


def annotate_backward(q, k, v, o) -> None:
    """Put the backward of ``o = attention(q, k, v)`` inside ``record_function(BACKWARD)`` (module
    docstring): open at o's gradient, close at the first of q's, k's and v's."""
    import torch

    open_range = []

    def start(grad):
        rf = torch.profiler.record_function(BACKWARD)
        rf.__enter__()
        open_range.append(rf)

    def stop(grad):
        while open_range:
            open_range.pop().__exit__(None, None, None)

    o.register_hook(start)
    for t in (q, k, v):
        t.register_hook(stop)


def build_decoder(shape: LlamaShape, attention: str, device="cuda", dtype=None, seed: int = 0,
                  train: bool = False):
    """The decoder with random weights whose attention core is ``attention``: ``x [B, P, hidden] -> same``.

    ``train``: the weights require grad (listed in the returned function's ``weights``) and each
    attention's backward runs inside ``record_function(BACKWARD)``. The weights are in ``dtype``.
    """
    import torch
    from torch.nn.functional import linear, silu

    choice("attention", attention, ATTENTIONS)
    dtype = dtype or torch.float16
    attn = attention_fn(attention, causal=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, m, heads, d = shape.hidden, shape.mlp, shape.heads, shape.head_dim

    def weight(*dims):  # N(0, 1/fan_in), drawn on the device (fast), then cast
        return (torch.randn(*dims, generator=gen, device=device) * (1.0 / math.sqrt(dims[-1]))).to(dtype)

    # per layer: wqkv [3h, h], wo [h, h], w_gate_up [2m, h], w_down [h, m]; RMSNorm weights are ones
    layers = [(weight(3 * h, h), weight(h, h), weight(2 * m, h), weight(h, m)) for _ in range(shape.layers)]
    weights = [w.requires_grad_(train) for layer in layers for w in layer]
    ones = torch.ones(h, device=device, dtype=dtype)

    def rms_norm(x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + shape.eps)).to(x.dtype) * ones

    def rope(x, cos, sin):  # x [B, H, P, d]; rotate pairs (x_i, x_{i+d/2})
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def decoder(x):  # x [B, P, h] -> [B, P, h]
        B, P, _ = x.shape
        inv = 1.0 / shape.rope_theta ** (torch.arange(0, d, 2, device=device).float() / d)
        ang = torch.outer(torch.arange(P, device=device).float(), inv)  # [P, d/2]
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        for wqkv, wo, w_gate_up, w_down in layers:
            q, k, v = linear(rms_norm(x), wqkv).view(B, P, 3, heads, d).permute(2, 0, 3, 1, 4)  # [B, H, P, d]
            q, k, v = rope(q, cos, sin), rope(k, cos, sin), v.contiguous()  # all contiguous, every impl alike
            with torch.profiler.record_function(ANNOTATION):
                o = attn(q, k, v)  # [B, H, P, d]
            if o.requires_grad:
                annotate_backward(q, k, v, o)
            x = x + linear(o.transpose(1, 2).reshape(B, P, -1), wo)
            gate, up = linear(rms_norm(x), w_gate_up).chunk(2, dim=-1)
            x = x + linear(silu(gate) * up, w_down)
        return rms_norm(x)

    decoder.weights = weights
    return decoder
