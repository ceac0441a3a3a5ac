"""@triton.jit helpers shared by the prefill and decode kernels.

Only the interpreter workaround lives here: Triton 3.6's CPU interpreter (TRITON_INTERPRET=1, used by
the CPU tests) computes bf16 `tl.dot` wrongly and truncates fp32 -> bf16 casts instead of rounding to
nearest even (triton-lang/triton#11584). Under the interpreter with bf16 inputs the kernels therefore
multiply in fp32 and round with `round_bf16` before casting, which reproduces what the GPU computes.
On a GPU the flag that selects this path is always False and none of it is compiled.
"""

from attnscope.kernels._common import import_torch_triton

_, triton = import_torch_triton()  # ImportError names the install command when the extra is missing
import triton.language as tl  # noqa: E402


@triton.jit
def round_bf16(x):
    """fp32 -> fp32 rounded to the nearest bf16 (ties to even), so a following cast is exact."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


__all__ = ["round_bf16", "triton"]
