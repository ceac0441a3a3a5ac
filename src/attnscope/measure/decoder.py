"""A Llama-shaped decoder in plain torch, whose attention core is swappable (spec §5).

8B-like by default: hidden 4,096, 32 heads of d = 128 (as many K/V heads as query heads), SwiGLU MLP
14,336, RMSNorm, RoPE; random weights, nothing downloaded; no embedding and no LM head, so a prefill is
the decoder layers only. The attention core of every layer runs inside
``record_function("attnscope::attention")`` and a whole prefill inside ``"attnscope::prefill"``: the
ranges `attnscope.chrome_trace` reads. Layout: x [B, P, hidden]; q, k, v [B, H, P, d].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnscope.errors import InputError, choice, positive_int
from attnscope.measure.backends import attention_fn

ATTENTIONS = ("naive", "flash", "cudnn", "efficient", "math", "attnscope")
ANNOTATION = "attnscope::attention"
PREFILL = "attnscope::prefill"


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


def build_decoder(shape: LlamaShape, attention: str, device="cuda", dtype=None, seed: int = 0):
    """A ``torch.nn.Module`` decoder with random weights whose attention core is ``attention``."""
    import torch
    from torch import nn

    choice("attention", attention, ATTENTIONS)
    dtype = dtype or torch.float16
    attn = attention_fn(attention, causal=True)
    gen = torch.Generator(device=device).manual_seed(seed)

    def weight(*dims):  # N(0, 1/fan_in), drawn on the device (fast), then cast
        w = torch.randn(*dims, generator=gen, device=device) * (1.0 / math.sqrt(dims[-1]))
        return nn.Parameter(w.to(dtype), requires_grad=False)

    def rms_norm(x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + shape.eps)).to(x.dtype) * w

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            h, m = shape.hidden, shape.mlp
            self.norm1 = nn.Parameter(torch.ones(h, device=device, dtype=dtype), requires_grad=False)
            self.norm2 = nn.Parameter(torch.ones(h, device=device, dtype=dtype), requires_grad=False)
            self.wqkv = weight(3 * h, h)     # [3h, h]
            self.wo = weight(h, h)           # [h, h]
            self.w_gate_up = weight(2 * m, h)  # [2m, h]
            self.w_down = weight(h, m)       # [h, m]

        def forward(self, x, cos, sin):  # x [B, P, h]
            B, P, _ = x.shape
            qkv = nn.functional.linear(rms_norm(x, self.norm1), self.wqkv)  # [B, P, 3h]
            q, k, v = qkv.view(B, P, 3, shape.heads, shape.head_dim).permute(2, 0, 3, 1, 4)  # [B, H, P, d]
            q, k, v = rope(q, cos, sin), rope(k, cos, sin), v.contiguous()  # all contiguous, every impl alike
            with torch.profiler.record_function(ANNOTATION):
                o = attn(q, k, v)  # [B, H, P, d]
            x = x + nn.functional.linear(o.transpose(1, 2).reshape(B, P, -1), self.wo)
            gate, up = nn.functional.linear(rms_norm(x, self.norm2), self.w_gate_up).chunk(2, dim=-1)
            return x + nn.functional.linear(nn.functional.silu(gate) * up, self.w_down)

    def rope(x, cos, sin):  # x [B, H, P, d]; rotate pairs (x_i, x_{i+d/2})
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(shape.layers))
            self.norm = nn.Parameter(torch.ones(shape.hidden, device=device, dtype=dtype),
                                     requires_grad=False)

        def forward(self, x):  # x [B, P, h] -> [B, P, h]
            P = x.shape[1]
            inv = 1.0 / shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, device=device).float()
                                              / shape.head_dim)
            ang = torch.outer(torch.arange(P, device=device).float(), inv)  # [P, d/2]
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return rms_norm(x, self.norm)

    return Decoder().eval()


