"""FlashAttention-2 forward (prefill) in Triton.

Algorithm: Dao, *FlashAttention-2*, arXiv:2307.08691, Algorithm 1 and §3.1.1. One program per
(query tile, batch x query head); Q tile in registers, K/V tiles streamed through shared memory; the
online softmax keeps the running max ``m_i``, normaliser ``l_i`` and unnormalised accumulator ``acc``
on chip; one division at the end. Names match `attnscope.reference` (m, alpha, l, acc) and spec §3.

Causal attention runs the KV loop in two stages, as spec §2.1 insists: tiles ``[0, lo)`` are entirely
permitted for every row of the query tile and run without any mask arithmetic; tiles ``[lo, hi)``
straddle the diagonal (or are the ragged last tile) and are masked *before* the running max sees the
scores; tiles ``[hi, Nk)`` are skipped (the skip bound). ``lo`` and ``hi`` are the closed forms of
`attnscope.model.tiles.Grid.kv_bounds`, recomputed in-kernel per program (a kernel cannot call Python;
`tests/test_fwd.py` holds the two against each other). Alignment is
bottom-right: key c is visible to query r iff ``c <= r + (Nk - Nq)``; rows with no visible key produce
0 and LSE = -inf, never NaN.

What makes it fast on sm_90 (H100/H200):
- ``exp2`` with log2(e) folded into the softmax scale (one FMA per score instead of a multiply + exp);
- Q/K/V/O moved by tensor descriptors (TMA bulk copies; out-of-bounds rows of ragged tiles read as 0
  and are not written back), 4-D descriptors so any strides with a unit last dimension work, including
  a transposed [B, N, H, d] view, without a copy;
- software pipelining of the KV loop (``num_stages``) and, where it wins, warp specialisation
  (``tl.range(..., warp_specialize=True)``: producer warps issue TMA loads while consumer warpgroups
  run wgmma);
- causal query tiles launched heaviest first, so the short tiles fill the tail of the grid;
- a small pruned config set per (head_dim, causal), autotuned once per power-of-two bucket of the
  sequence lengths, not for every N.
"""

from __future__ import annotations

import math

from attnscope.errors import InputError
from attnscope.kernels._common import (
    LOG2E,
    check_device,
    check_head_dim,
    check_same,
    check_tensor,
    import_torch_triton,
    interpreting,
)
from attnscope.model.tiles import cdiv

torch, triton = import_torch_triton()  # kernels/ is the optional extra: ImportError names the install command
import triton.language as tl  # noqa: E402

from attnscope.kernels._tl import round_bf16  # noqa: E402

last_compiled = None  # set by every launch (registers, spills, shared memory: bench/diag_fwd.py)


# Candidate configs per head_dim: (BLOCK_M, BLOCK_N, num_warps, num_stages). Measured on the H200 with
# bench/tune_prefill.py (BENCHMARKS.md, "prefill config sweep"): for d = 128, BLOCK_M = 128 with 4 warps
# and 2 stages wins (512-532 TFLOP/s unmasked, 448-511 causal): its ~96 KiB of shared memory and one
# warpgroup per CTA let two CTAs share an SM, so one CTA's softmax overlaps the other's wgmma.
# BLOCK_N = 128 with 4 warps spills (<= 205 TFLOP/s) and is not listed; BLOCK_M = 64 (3-4 CTAs per SM)
# trails by 10-20 %. The lazy rescale (LAZY_RESCALE, FlashAttention-4's trick) costs 10-20 % here: its
# block-uniform branch needs a cross-warp reduction and breaks the loop's pipelining. Warp specialisation
# (tl.range(..., warp_specialize=True)) failed to compile with 4 warps and changed nothing measurable
# with 8 warps on sm_90 under Triton 3.6, so no config uses it.
CONFIGS = {
    128: [(128, 64, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3)],
    64: [(128, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3)],
}


def _configs(triton):
    """All candidates; `_prune` keeps those listed for the call's head_dim. Under the interpreter a single
    small config keeps CPU tests fast and still exercises multi-tile, ragged and diagonal paths."""
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "WARP_SPEC": False, "LAZY_RESCALE": False},
                              num_warps=4, num_stages=1)]
    seen = sorted({c for cs in CONFIGS.values() for c in cs})
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "WARP_SPEC": False, "LAZY_RESCALE": False},
                          num_warps=w, num_stages=s) for bm, bn, w, s in seen]


def _prune(configs, named_args, **kwargs):
    """Keep the configs listed for this head_dim."""
    if interpreting():
        return configs
    d = named_args.get("HEAD_DIM", kwargs.get("HEAD_DIM"))
    wanted = set(CONFIGS.get(d, ()))
    kept = [c for c in configs
            if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in wanted]
    return kept or configs[:1]


@triton.jit
def _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale, NQ, NK,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               CAUSAL: tl.constexpr, LAZY_RESCALE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """One KV tile of the online softmax (spec §3.1), FA-2 unnormalised form."""
    k = desc_k.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    # [BLOCK_M, BLOCK_N] scores in fp32, never leave the SM (fp32 operands: interpreter + bf16 only)
    qk = tl.dot(q.to(tl.float32), k.to(tl.float32).T) if EMULATE_BF16 else tl.dot(q, k.T)
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keep = offs_n[None, :] < NK  # ragged last tile: columns past Nk
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + (NK - NQ))  # bottom-right diagonal
        qk = tl.where(keep, qk * qk_scale, float("-inf"))  # mask BEFORE the running max (spec §2.1)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_ij = tl.where(m_ij == float("-inf"), 0.0, m_ij)  # no key yet: exp2(-inf - 0) = 0, not NaN
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)  # rescale of the old state onto the new max
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_ij
    elif LAZY_RESCALE:
        # Lazy rescale (as FlashAttention-4): move the base only when some row's max grew by more than
        # 8 in log2 units; otherwise keep the stale base (p <= 2^8, harmless in fp32 / bf16) and skip
        # the alpha exp2 and the acc multiply. Exact either way: l and acc share the base m_i.
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        if tl.max(m_ij - m_i, 0) > 8.0:
            alpha = tl.math.exp2(m_i - m_ij)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_ij
        p = tl.math.exp2(qk * qk_scale - m_i[:, None])
    else:
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_ij
    l_i = l_i + tl.sum(p, 1)
    v = desc_v.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    # P goes to the second matmul in the input dtype, as FA-2 and SDPA do
    acc = tl.dot(round_bf16(p), v.to(tl.float32), acc) if EMULATE_BF16 else tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _kv_bounds(start_m, NQ, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """KV columns of query tile ``start_m`` (0-based): ``[0, lo)`` run unmasked, ``[lo, hi)`` masked,
    ``[hi, Nk)`` skipped. The closed form of `model.tiles.Grid.kv_bounds` (via `causal_kv_bounds0`),
    except that the ragged last tile always goes to the masked stage (it needs a bounds check even when
    fully permitted). tests/test_fwd.py runs this helper under the interpreter against tiles.py.
    """
    if CAUSAL:
        r_first = start_m * BLOCK_M + 1 + (NK - NQ)  # first row (1-based) + diagonal offset
        r_last = start_m * BLOCK_M + BLOCK_M
        if r_last > NQ:
            r_last = NQ
        r_last = r_last + (NK - NQ)
        if r_last < 0:
            r_last = 0
        if r_first < 0:
            r_first = 0
        hi = tl.cdiv(r_last, BLOCK_N) * BLOCK_N  # skip bound: tiles past it are never loaded
        if hi > NK:
            hi = NK
        full = (r_first // BLOCK_N) * BLOCK_N  # tiles every row of the query tile sees whole
    else:
        hi = NK
        full = NK
    lo = (NK // BLOCK_N) * BLOCK_N  # the ragged last tile always goes to the masked stage
    if full < lo:
        lo = full
    return lo, hi


@triton.autotune(configs=_configs(triton), key=["HEAD_DIM", "CAUSAL", "N_BUCKET", "STORE_LSE"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _attnscope_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    B, H, HKV, NQ, NK, qk_scale,
    N_BUCKET,  # autotune key only: power-of-two bucket of max(Nq, Nk)
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WARP_SPEC: tl.constexpr,
    LAZY_RESCALE: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    start_m = pid_m
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - pid_m  # heaviest query tiles first
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // HKV)  # GQA: query heads h share kv head h // group

    desc_q = tl.make_tensor_descriptor(Q, shape=[B, H, NQ, HEAD_DIM],
                                       strides=[stride_qb, stride_qh, stride_qm, 1],
                                       block_shape=[1, 1, BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, shape=[B, HKV, NK, HEAD_DIM],
                                       strides=[stride_kb, stride_kh, stride_kn, 1],
                                       block_shape=[1, 1, BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, shape=[B, HKV, NK, HEAD_DIM],
                                       strides=[stride_vb, stride_vh, stride_vn, 1],
                                       block_shape=[1, 1, BLOCK_N, HEAD_DIM])
    desc_o = tl.make_tensor_descriptor(O, shape=[B, H, NQ, HEAD_DIM],
                                       strides=[H * NQ * HEAD_DIM, NQ * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, 1, BLOCK_M, HEAD_DIM])

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # 0-based query rows of this tile
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 domain, scaled)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running normaliser
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # unnormalised output
    q = desc_q.load([b, h, start_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)

    lo, hi = _kv_bounds(start_m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)

    # Stage 1: tiles every row may see entirely: no mask arithmetic.
    for start_n in tl.range(0, lo, BLOCK_N, warp_specialize=WARP_SPEC):
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale,
                                   NQ, NK, HEAD_DIM, BLOCK_N, False, CAUSAL, LAZY_RESCALE, EMULATE_BF16)
    # Stage 2: diagonal tiles and the ragged last tile: masked before the max.
    for start_n in tl.range(lo, hi, BLOCK_N):
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, start_n, qk_scale,
                                   NQ, NK, HEAD_DIM, BLOCK_N, True, CAUSAL, LAZY_RESCALE, EMULATE_BF16)

    # Epilogue: one division per row; empty rows (no visible key) give 0 and LSE = -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if EMULATE_BF16:
        o = round_bf16(o)
    desc_o.store([b, h, start_m * BLOCK_M, 0], o.to(O.dtype.element_ty).reshape(1, 1, BLOCK_M, HEAD_DIM))
    if STORE_LSE:
        lse = m_i * 0.6931471805599453 + tl.log(l_i)  # natural log; -inf + -inf = -inf for empty rows
        tl.store(LSE + pid_bh * NQ + offs_m, lse, mask=offs_m < NQ)



def _set_allocator(device) -> None:
    """Device-side tensor descriptors need a scratch allocator (128 B per descriptor per program)."""

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)


def _check_inputs(q, k, v, scale):
    check_tensor(torch, "q", q, 4, "[B, Hq, Nq, d]")
    check_tensor(torch, "k", k, 4, "[B, Hkv, Nk, d]")
    check_tensor(torch, "v", v, 4, "[B, Hkv, Nk, d]")
    check_device(torch, {"q": q, "k": k, "v": v})
    B, Hq, Nq, d = q.shape
    check_same("k", "batch", B, k.shape[0])
    check_same("v", "batch", B, v.shape[0])
    check_same("k", "head_dim", d, k.shape[3])
    check_same("v", "head_dim", d, v.shape[3])
    check_same("k", "dtype (as q)", q.dtype, k.dtype)
    check_same("v", "dtype (as q)", q.dtype, v.dtype)
    check_same("v", "shape (as k)", tuple(k.shape), tuple(v.shape))
    Hkv, Nk = k.shape[1], k.shape[2]
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"q: expected the number of query heads to be a multiple of the kv heads ({Hkv}), "
                         f"got Hq = {Hq}")
    if Nq == 0:
        raise InputError(f"q: expected Nq >= 1, got shape {tuple(q.shape)}")
    if Nk == 0:
        raise InputError(f"k: expected Nk >= 1, got shape {tuple(k.shape)}")
    if B == 0 or Hq == 0:
        raise InputError(f"q: expected B >= 1 and Hq >= 1, got shape {tuple(q.shape)}")
    check_head_dim(d)
    for name, t in (("q", q), ("k", k), ("v", v)):
        # TMA: every stride but the last must be a multiple of 16 bytes, and the base 16-byte aligned
        if any((s * t.element_size()) % 16 for s in (*t.stride()[:3], t.storage_offset())):
            raise NotImplementedError(
                f"{name}: strides {tuple(t.stride())} / base address are not 16-byte aligned; supported: "
                f"tensors whose strides (in elements) are multiples of {16 // t.element_size()} "
                f"(any contiguous tensor or transposed view of one)")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise InputError(f"scale: expected a finite positive number or None, got {scale!r}")
    return B, Hq, Nq, d, Hkv, Nk


def _launch(q, k, v, causal: bool, scale: float | None, return_lse: bool, config: dict | None = None):
    """Check, allocate, launch. ``config`` (BLOCK_M, BLOCK_N, WARP_SPEC, num_warps, num_stages) bypasses
    the autotuner: bench/tune_prefill.py times each candidate that way."""
    B, Hq, Nq, d, Hkv, Nk = _check_inputs(q, k, v, scale)
    sm_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    o = torch.empty((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq) if return_lse else (1,), dtype=torch.float32, device=q.device)
    _set_allocator(q.device)
    n_bucket = 1 << max(Nq, Nk).bit_length()

    def grid(meta):
        return (cdiv(Nq, meta["BLOCK_M"]), B * Hq)  # T_r query tiles x (batch, head)

    kernel = _attnscope_fwd_kernel if config is None else _attnscope_fwd_kernel.fn
    global last_compiled  # the CompiledKernel of the latest launch: bench/diag_fwd.py reads its resources
    last_compiled = kernel[grid](
        q, k, v, o, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        B, Hq, Hkv, Nq, Nk, sm_scale * LOG2E,
        n_bucket,
        HEAD_DIM=d, CAUSAL=bool(causal), STORE_LSE=bool(return_lse),
        EMULATE_BF16=interpreting() and q.dtype == torch.bfloat16,
        **(config or {}),
    )
    return o, lse


# Registered at import (torch.compile cannot trace a registration): `attnscope::flash_attention`, so
# torch.compile sees one opaque op with a fake (shape-only) implementation instead of a graph break.
_SCHEMA = "(Tensor q, Tensor k, Tensor v, bool causal, float scale, bool return_lse) -> (Tensor, Tensor)"


@torch.library.custom_op("attnscope::flash_attention", mutates_args=(), schema=_SCHEMA)
def _op(q, k, v, causal, scale, return_lse):
    return _launch(q, k, v, causal, scale, return_lse)


@_op.register_fake
def _(q, k, v, causal, scale, return_lse):
    B, Hq, Nq, d = q.shape
    o = q.new_empty((B, Hq, Nq, d))
    lse = q.new_empty((B, Hq, Nq) if return_lse else (1,), dtype=torch.float32)
    return o, lse


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False):
    """FlashAttention-2 forward.

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, Nq, d]
        Queries, fp16 or bf16, CUDA (or CPU under ``TRITON_INTERPRET=1``); any strides with a unit
        last stride (e.g. ``x.view(B, N, H, d).transpose(1, 2)`` works without a copy).
    k, v : torch.Tensor, [B, Hkv, Nk, d]
        Keys and values; ``Hq`` must be a multiple of ``Hkv`` (GQA / MQA).
    causal : bool
        Causal mask, bottom-right aligned: key c is visible to query r iff ``c <= r + (Nk - Nq)``
        (identical to SDPA's ``is_causal`` when Nq == Nk). Rows with no visible key give 0 and
        LSE = -inf.
    scale : float, optional
        Softmax scale; defaults to ``1/sqrt(d)``.
    return_lse : bool
        Also return the natural-log logsumexp of each row.

    Returns
    -------
    o : torch.Tensor, [B, Hq, Nq, d], q's dtype
    lse : torch.Tensor, [B, Hq, Nq], float32 — only when ``return_lse``.

    Supported: d in {64, 128}; fp16 and bf16. Anything else raises NotImplementedError; malformed input
    raises ValueError naming the argument.

    Example
    -------
    >>> q = k = v = torch.randn(1, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
    >>> o = attnscope.flash_attention(q, k, v, causal=True)
    """
    d = q.shape[-1] if hasattr(q, "shape") and len(q.shape) else 0
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise InputError(f"scale: expected a finite positive number or None, got {scale!r}")
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(max(d, 1))
    grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))
    if torch.compiler.is_compiling() or grad:
        # one opaque op for torch.compile (no graph break) and autograd (kernels/bwd.py); LSE kept for it
        o, lse = _op(q, k, v, bool(causal), sm_scale, bool(return_lse) or grad)
    else:
        # eager: the same launch without the custom-op dispatcher (~20 us of host time per call)
        o, lse = _launch(q, k, v, bool(causal), sm_scale, bool(return_lse))
    return (o, lse) if return_lse else o


from attnscope.kernels import bwd as _bwd  # noqa: E402,F401  registers the autograd formula of _op
