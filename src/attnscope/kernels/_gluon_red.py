"""Gluon fp32 reduction into global memory (sm_90): the one-pass backward's dQ accumulation, from registers
(`red_add`) or from shared memory by the tensor map (`tma_reduce_add`).

``red_add(ptrs, vals, mask, VEC)`` adds ``vals`` at ``ptrs`` where ``mask`` is set, as fire-and-forget
reductions (relaxed, GPU scope: only the sum after the kernel is read): ``VEC = 1`` one element per
instruction (``gl.atomic_add``, which ptxas turns into ``RED``); ``VEC = 2`` two adjacent fp32 per
instruction (PTX ``red.global.add.v2.f32``, sm_90, PTX 8.1), for a register layout whose consecutive
elements of a thread pair adjacent columns at an 8-byte aligned address (a ``warpgroup_mma`` accumulator
layout: each thread holds columns 2t, 2t + 1 of a row), half the requests to L2.
"""

from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin

#: Two adjacent fp32 (the inline asm's pack of 2: outputs $0 $1 (unused), pointers $2 $3 (the first is the
#: pair's), values $4 $5, masks $6 $7 (one row: equal)).
_RED_V2 = gl.constexpr("{ .reg .pred p; setp.ne.b32 p, $6, 0; "
                       "@p red.relaxed.gpu.global.add.v2.f32 [$2], {$4, $5}; mov.b32 $0, 0; mov.b32 $1, 0; }")


@gluon.jit
def red_add(ptrs, vals, mask, VEC: gl.constexpr):
    """``*ptrs += vals`` where ``mask`` (broadcast to ``vals``), fp32, ``VEC`` elements per instruction."""
    gl.static_assert((VEC == 1) or (VEC == 2), "VEC: 1 or 2")
    if VEC == 2:
        gl.inline_asm_elementwise(_RED_V2, "=r,=r,l,l,f,f,r,r",
                                  [ptrs.to(gl.int64, bitcast=True), vals, mask.to(gl.int32)],
                                  dtype=gl.int32, is_pure=False, pack=2)
    else:
        gl.atomic_add(ptrs, vals, mask=mask, sem="relaxed")


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``global[coord + block] += src`` by the tensor map ``tensor_desc`` (PTX
    ``cp.reduce.async.bulk.tensor .add``, sm_90; Triton's ``ttng.async_tma_reduce``, which Gluon 3.6 builds
    but does not name): one bulk request per 128-byte box from the shared-memory block ``src`` (written and
    fenced by the caller), issued by elected threads, fire-and-forget; ``tma.store_wait`` before ``src`` is
    written again. Rows and columns past the tensor map's shape are clipped."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                              src.handle)
