"""Packed variable-length FlashAttention-2 forward (a batch of prompts of different lengths); its backward
is kernels/varlen_bwd.py, joined through the custom op ``attnscope::flash_attention_varlen``.

Algorithm: the FA-2 forward of `attnscope.kernels.fwd` (Dao, *FlashAttention-2*, arXiv:2307.08691,
Algorithm 1, §3.1.1: online softmax, two-stage causal KV loop, skip bound, exp2 with log2(e) folded into
the scale), run per sequence of a packed batch.

Layout, masks and the checks of cu_seqlens: `flash_attention_varlen`'s docstring. Score mods
(`_common.check_mods`): a window per sequence runs a three-stage loop (masked, unmasked, masked; tiles outside
it skipped, bounds by `_tl._kv_bounds_window` = `model.tiles.window_kv_bounds0`), softcap caps the scores, a
sink per head joins the final normalisation; each is a constexpr, so with the mods off the kernel compiles to
the plain one. Unchecked cu_seqlens are clamped on the device by `varlen_plan.plan` into a partition of the
packed rows, so every output row is written once.

Scheduling: no padding to ``max_seqlen``. The same `varlen_plan.plan` launch (one Triton program, no
host sync) builds a flat list of work items (sequence, query tile) -- ``sum_s ceil(Nq_s / BLOCK_M)`` of
them, padded to the bound ``ceil(total_q / BLOCK_M) + B`` with idle items that exit at once --
sequence-major (sequences by Nk_s descending, each sequence's query tiles last to first, i.e. heaviest
first), and the kernel runs a 1-D grid over work items x query heads (heads fastest, so GQA heads sharing
a K/V head run side by side). The programs running at once thus read one or two sequences' K/V (L2
hits), and the list ends with the lightest tiles of the shortest sequences (a short tail).

Loads: K and V tiles come by TMA, through host-built descriptors over the whole packed
``[total_k, Hkv, d]`` (kernel arguments: no per-program descriptor set-up), when K and V are 16-byte
aligned (any contiguous tensor), else by predicated pointer loads. A descriptor cannot stop at a
sequence boundary, so a ragged last tile reads rows of the next sequence (zeros past the tensor's end);
the masked stage gives them score -inf and V row 0 by selects, so nothing leaks, not even a NaN. Q (once
per program) and O use predicated pointer loads and stores: Q by TMA compiled to more spills on sm_90.
Any strides with a unit last stride work. Row offsets are computed in int64.
Tile configs: the dense forward's measured table (`pick_config`; no autotuning). Under TRITON_INTERPRET=1
bf16 products run in fp32 with `round_bf16`, as in the dense forward.
"""

from __future__ import annotations

import math

from attnscope.kernels._common import (
    LOG2E,
    check_flags,
    check_scale,
    head_block,
    import_torch_triton,
    interpreting,
    on_tensor_device,
    raise_device_errors,
    smem_per_block,
)

torch, triton = import_torch_triton()  # kernels/ is the optional extra: ImportError names the install command
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from attnscope.kernels import fwd as _fwd  # noqa: E402
from attnscope.kernels._tl import (  # noqa: E402
    _kv_bounds,
    _kv_bounds_window,
    round_bf16,
    sink_log2,
    softmax_tile,
    tanh_,
)
from attnscope.kernels.bwd import WINDOW_UNBOUNDED, window_keep  # noqa: E402, F401
from attnscope.kernels.varlen_plan import (  # noqa: E402, F401
    ERROR_BITS,
    _check_inputs,
    _check_seqlens,
    _sanitize,
    _work_items,
    mod_args,
    plan,
    prepare,
)


def pick_config(d: int, masked: bool, n: int, smem: int | None = None):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for head dim ``d``, ``masked`` (causal or a window) and
    the longest sequence ``n``: the dense forward's measured table (`fwd.pick_config`; the small
    interpreter tiles under TRITON_INTERPRET=1): the inner loop is the same, K/V by TMA too. Compiled
    for sm_90 on a CPU (Triton 3.6, ptxas, bf16, TMA): bench/sm90_resources.py --kernel varlen."""
    return tuple(_fwd.pick_config(d, masked, n, smem))



@triton.jit
def _varlen_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, k0, hk, offs_m, offs_n, start_n, stride_kn,
                 stride_vn, qk_scale, NQ, NK, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                 MAX_UNSCALED: tl.constexpr, EMULATE_BF16: tl.constexpr, left, right, sc_in, sc_out,
                 WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, RAGGED: tl.constexpr, D: tl.constexpr = 0):
    """One KV tile [start_n, start_n + BLOCK_N) of the online softmax (spec §3.1), FA-2 unnormalised form.
    With TMA the ragged last tile (``RAGGED``, masked) reads rows past the sequence's end (the next
    sequence's, or zeros past the tensor): their scores are replaced by -inf and their V rows by 0 with
    selects, so nothing of them, not even a NaN, reaches the result; V goes through registers only in
    that tile (the select costs a shared-memory round trip and V's pipelining; the window's masked
    stages pass ``RAGGED`` for all their tiles). Without TMA the loads are predicated instead. The
    softmax step, with ``MAX_UNSCALED`` for huge scales, is `_tl.softmax_tile` (as
    `attnscope.kernels.fwd._attn_tile`).
    ``SOFTCAP``: scores become ``tanh(s * sc_in) * sc_out`` in log2 units (the launcher passes
    ``qk_scale = 1``); ``WINDOW``: masked tiles also apply `bwd.window_keep`. ``D``: a head dim below
    its power-of-two tile ``HEAD_DIM`` (0: ``HEAD_DIM`` itself): TMA reads zeros past it, pointers mask it."""
    cols = start_n + offs_n  # [BLOCK_N] key rows of this sequence
    rows64 = cols.to(tl.int64)
    in_seq = cols < NK
    ODD: tl.constexpr = D != 0 and D != HEAD_DIM
    d_ok = (tl.arange(0, HEAD_DIM) < D)[None, :]
    kv_mask = in_seq[:, None] & d_ok if ODD else in_seq[:, None]
    if USE_TMA:
        k = desc_k.load([k0 + start_n, hk, 0]).reshape(BLOCK_N, HEAD_DIM)
    elif MASKED:
        k = tl.load(k_ptrs + rows64[:, None] * stride_kn, mask=kv_mask, other=0.0)
    elif ODD:
        k = tl.load(k_ptrs + rows64[:, None] * stride_kn, mask=d_ok, other=0.0)
    else:
        k = tl.load(k_ptrs + rows64[:, None] * stride_kn)
    # [BLOCK_M, BLOCK_N] scores in fp32, never leave the SM
    qk = tl.dot(q.to(tl.float32), k.to(tl.float32).T) if EMULATE_BF16 else tl.dot(q, k.T)
    if SOFTCAP:
        qk = tanh_(qk * sc_in) * sc_out
    keep = None
    if MASKED:
        keep = in_seq[None, :]  # ragged last tile: columns past Nk_s
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + (NK - NQ))  # bottom-right diagonal
        if WINDOW:
            keep = keep & window_keep(offs_m[:, None], cols[None, :], NQ, NK, left, right)
    p, m_ij, l_i, acc = softmax_tile(qk, keep, m_i, l_i, acc, qk_scale, MASKED, MAX_UNSCALED)
    if MASKED and WINDOW:  # a row with no key yet keeps m = -inf (softmax_tile shifts it by 0), so its first
        m_ij = tl.where(l_i == 0.0, float("-inf"), m_ij)  # key gets p = 1 exactly, as without a window
    if USE_TMA:
        v = desc_v.load([k0 + start_n, hk, 0]).reshape(BLOCK_N, HEAD_DIM)
        if RAGGED:
            v = tl.where(in_seq[:, None], v, 0.0)  # rows of the next sequence: 0 * inf would be NaN
    elif MASKED:
        v = tl.load(v_ptrs + rows64[:, None] * stride_vn, mask=kv_mask, other=0.0)
    elif ODD:
        v = tl.load(v_ptrs + rows64[:, None] * stride_vn, mask=d_ok, other=0.0)
    else:
        v = tl.load(v_ptrs + rows64[:, None] * stride_vn)
    # P goes to the second matmul in the input dtype, as FA-2 and SDPA do
    acc = tl.dot(round_bf16(p), v.to(tl.float32), acc) if EMULATE_BF16 else tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_ij


@triton.jit
def _attnscope_varlen_kernel(
    Q, K, V, desc_k, desc_v, O, LSE, CU_Q, CU_K, WORK_SEQ, WORK_TILE, SINKS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    H, HKV, TOTAL_Q, qk_scale, left, right, sc_in, sc_out,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr, MAX_UNSCALED: tl.constexpr,
    EMULATE_BF16: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    D: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    w = pid // H  # work item (heaviest first); heads fastest so GQA siblings run together
    h = pid % H
    s = tl.load(WORK_SEQ + w)
    if s < 0:  # idle item: the grid is sized by a host-known bound, not the device-side count
        return
    start_m = tl.load(WORK_TILE + w)
    hk = h // (H // HKV)  # GQA: query heads h share kv head h // group
    h64 = h.to(tl.int64)  # head offsets in int64 too: a [H, total, d] buffer seen as [total, H, d] is legal
    hk64 = hk.to(tl.int64)
    q0 = tl.load(CU_Q + s)
    NQ = tl.load(CU_Q + s + 1) - q0
    k0 = tl.load(CU_K + s)
    NK = tl.load(CU_K + s + 1) - k0

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # 0-based query rows of this tile, in the sequence
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < NQ
    DIM: tl.constexpr = HEAD_DIM if D == 0 else D  # the head dim (HEAD_DIM: its power-of-two tile)
    rows = row_ok[:, None] if DIM == HEAD_DIM else row_ok[:, None] & (offs_d[None, :] < DIM)
    q_rows = (q0 + offs_m).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + h64 * stride_qh + offs_d[None, :], mask=rows, other=0.0)
    k_ptrs = K + k0.to(tl.int64) * stride_kt + hk64 * stride_kh + offs_d[None, :]
    v_ptrs = V + k0.to(tl.int64) * stride_vt + hk64 * stride_vh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 domain, scaled)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running normaliser
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # unnormalised output

    if WINDOW:  # window (left, right) per sequence: masked, unmasked, masked; tiles outside it skipped
        lo, full_lo, full_hi, hi = _kv_bounds_window(start_m, NQ, NK, left, right, BLOCK_M, BLOCK_N)
        for start_n in range(lo, full_lo, BLOCK_N):
            acc, l_i, m_i = _varlen_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, k0, hk, offs_m,
                                         offs_n, start_n, stride_kt, stride_vt, qk_scale, NQ, NK, HEAD_DIM,
                                         BLOCK_N, True, False, USE_TMA, MAX_UNSCALED, EMULATE_BF16,
                                         left, right, sc_in, sc_out, True, SOFTCAP, True, DIM)
        for start_n in range(full_lo, full_hi, BLOCK_N):
            acc, l_i, m_i = _varlen_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, k0, hk, offs_m,
                                         offs_n, start_n, stride_kt, stride_vt, qk_scale, NQ, NK, HEAD_DIM,
                                         BLOCK_N, False, False, USE_TMA, MAX_UNSCALED, EMULATE_BF16,
                                         left, right, sc_in, sc_out, True, SOFTCAP, False, DIM)
        for start_n in range(full_hi, hi, BLOCK_N):
            acc, l_i, m_i = _varlen_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, k0, hk, offs_m,
                                         offs_n, start_n, stride_kt, stride_vt, qk_scale, NQ, NK, HEAD_DIM,
                                         BLOCK_N, True, False, USE_TMA, MAX_UNSCALED, EMULATE_BF16,
                                         left, right, sc_in, sc_out, True, SOFTCAP, True, DIM)
    else:
        lo, hi = _kv_bounds(start_m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)
        whole = tl.maximum(lo, tl.minimum(hi, (NK // BLOCK_N) * BLOCK_N))  # [lo, whole): inside the sequence
        # Stage 1: tiles every row may see entirely: no mask arithmetic, no bounds check.
        for start_n in range(0, lo, BLOCK_N):
            acc, l_i, m_i = _varlen_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, k0, hk, offs_m,
                                         offs_n, start_n, stride_kt, stride_vt, qk_scale, NQ, NK, HEAD_DIM,
                                         BLOCK_N, False, CAUSAL, USE_TMA, MAX_UNSCALED, EMULATE_BF16,
                                         left, right, sc_in, sc_out, False, SOFTCAP, False, DIM)
        # Stage 2: diagonal tiles: masked before the max.
        for start_n in range(lo, whole, BLOCK_N):
            acc, l_i, m_i = _varlen_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, k0, hk, offs_m,
                                         offs_n, start_n, stride_kt, stride_vt, qk_scale, NQ, NK, HEAD_DIM,
                                         BLOCK_N, True, CAUSAL, USE_TMA, MAX_UNSCALED, EMULATE_BF16,
                                         left, right, sc_in, sc_out, False, SOFTCAP, False, DIM)
        # Stage 3: the ragged last tile (at most one; diagonal too when causal): columns past Nk_s masked.
        for start_n in range(whole, hi, BLOCK_N):
            acc, l_i, m_i = _varlen_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, k0, hk, offs_m,
                                         offs_n, start_n, stride_kt, stride_vt, qk_scale, NQ, NK, HEAD_DIM,
                                         BLOCK_N, True, CAUSAL, USE_TMA, MAX_UNSCALED, EMULATE_BF16,
                                         left, right, sc_in, sc_out, False, SOFTCAP, True, DIM)

    # Epilogue: one division per row; empty rows (no visible key) give 0 and LSE = -inf.
    m_log2 = m_i * qk_scale if MAX_UNSCALED else m_i
    if HAS_SINKS:  # the sink joins the denominator once, with no value (base 2: sink * log2(e))
        sink2 = sink_log2(tl.load(SINKS + h))  # finite: an inf or NaN sink is clamped
        m_f = tl.maximum(m_log2, sink2)
        alpha = tl.math.exp2(m_log2 - m_f)
        l_i = l_i * alpha + tl.math.exp2(sink2 - m_f)
        acc = acc * alpha[:, None]
        m_log2 = m_f
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if EMULATE_BF16:
        o = round_bf16(o)
    tl.store(O + q_rows[:, None] * stride_ot + h64 * stride_oh + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=rows)
    if STORE_LSE:
        lse = m_log2 * 0.6931471805599453 + tl.log(l_i)  # natural log; -inf for rows with no key
        tl.store(LSE + h64 * TOTAL_Q + q_rows, lse, mask=row_ok)


# --- the launcher: check, build the work list, allocate, launch ---------------------------------------
def _tma_ok(k, v) -> bool:
    """TMA needs 16-byte aligned strides and base addresses (true of any contiguous [total, H, d])."""
    return all((x * t.element_size()) % 16 == 0
               for t in (k, v) for x in (*t.stride()[:2], t.storage_offset()))


def _tma_builds(d: int, masked: bool) -> bool:
    """Whether the default takes TMA K/V loads: not for d >= 128 without a mask (causal or window), whose TMA
    build ptxas (Triton 3.6's, sm_90a) crashes on (SIGSEGV; d = 128: every tile config tried, d = 256: the
    table's; bench/sm90_resources.py --kernel varlen shows it); the pointer-load build of that case compiles
    and runs."""
    return d < 128 or masked


def _desc(t, block_n: int):
    """Host-built TMA descriptor over the whole packed ``[total_k, Hkv, d]`` (a kernel argument: no device
    scratch, no per-program descriptor set-up), blocks of ``[block_n, 1, head_block(d)]`` (zeros past d)."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [block_n, 1, head_block(t.shape[2])])


@on_tensor_device(torch)
def _launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse,
            check_seqlens, config=None, tma=None, window=None, softcap=0.0, sinks=None, bounds=None,
            items=None):
    """Check, build the work list, allocate, launch. ``config`` (BLOCK_M, BLOCK_N, num_warps, num_stages),
    ``tma`` (whole K/V tiles by TMA: default when K and V are 16-byte aligned) and ``items`` (a
    ``(seq, tile)`` work list of the config's BLOCK_M instead of `plan`'s, covering every tile once) are
    for the benchmark and the tests; all give the same result. ``bounds``: see `mod_args` (``causal``
    must then be False: the bounds say all)."""
    dims, mods, sm_scale = prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                   window, softcap, sinks, scale, check_seqlens)
    total_q, Hq, d, total_k, Hkv = dims
    o = torch.empty((total_q, Hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((Hq, total_q) if return_lse else (1,), dtype=torch.float32, device=q.device)
    if total_q == 0:
        return o, lse
    kw = mod_args(mods, sm_scale, causal, bounds)
    masked = kw["WINDOW"] or bool(causal)
    if config is None:
        config = pick_config(head_block(d), masked, max(max_seqlen_q, max_seqlen_k), smem_per_block(torch, q))
    block_m, block_n, num_warps, num_stages = config
    B = cu_seqlens_q.shape[0] - 1
    n_items = -(-total_q // block_m) + B  # >= sum_s ceil(Nq_s / BLOCK_M) for any partition of total_q
    if check_seqlens:  # values known good: the tighter bound of max_seqlen_q holds too
        n_items = min(n_items, B * -(-max(max_seqlen_q, 1) // block_m))
    cu_q, cu_k, [(seq, tile)] = plan(cu_seqlens_q, cu_seqlens_k, dims, max_seqlen_q, max_seqlen_k,
                                     [(n_items, block_m, masked, False)],
                                     sanitize=not check_seqlens)
    if items is not None:
        seq, tile = items
        n_items = seq.shape[0]
    use_tma = (_tma_ok(k, v) and _tma_builds(head_block(d), masked) if tma is None else bool(tma)) \
        and total_k > 0
    desc_k, desc_v = (_desc(t, block_n) for t in (k, v)) if use_tma else (k, v)  # pointers: placeholders
    qk_scale = 1.0 if mods.softcap else sm_scale * LOG2E  # softcap: scores arrive in log2 units
    _attnscope_varlen_kernel[(n_items * Hq,)](
        q, k, v, desc_k, desc_v, o, lse, cu_q, cu_k, seq, tile, q if mods.sinks is None else mods.sinks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1),
        Hq, Hkv, total_q, qk_scale, **kw,
        HEAD_DIM=head_block(d), D=d, STORE_LSE=bool(return_lse), BLOCK_M=block_m, BLOCK_N=block_n,
        USE_TMA=use_tma, MAX_UNSCALED=qk_scale > 1.0,  # see _varlen_tile: huge scales stay NaN-free
        EMULATE_BF16=interpreting() and q.dtype == torch.bfloat16, HAS_SINKS=mods.sinks is not None,
        num_warps=num_warps, num_stages=num_stages,
    )
    return o, lse


def check_errors(device: torch.device | str | int | None = None) -> None:
    """Raise `InputError` if a `flash_attention_varlen` call (forward or backward) since the last check
    got bad ``cu_seqlens_q`` / ``cu_seqlens_k`` values or too small ``max_seqlen_*`` (the default call
    checks them on the device, without a host sync; this reads the error word: one sync), and clear it.
    Such a call computed the sanitised partition (`_sanitize`): finite, inside the tensors, but not what
    was asked. ``device``: one device, or every device used."""
    raise_device_errors(torch, "varlen", ERROR_BITS, device)


# Registered at import, as `attnscope::flash_attention`: one opaque op for torch.compile and autograd.
_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
           "int max_seqlen_k, bool causal, float scale, bool return_lse, int[]? window, float softcap, "
           "Tensor? sinks, bool deterministic, bool check_seqlens) -> (Tensor, Tensor)")


@torch.library.custom_op("attnscope::flash_attention_varlen", mutates_args=(), schema=_SCHEMA)
def _op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse, window,
        softcap, sinks, deterministic, check_seqlens):
    return _launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                   return_lse, check_seqlens, window=window, softcap=softcap, sinks=sinks)


@_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse, window,
      softcap, sinks, deterministic, check_seqlens):
    lse_shape = (q.shape[1], q.shape[0]) if return_lse else (1,)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           causal: bool = False, scale: float | None = None, return_lse: bool = False, *,
                           window: tuple[int, int] | None = None, softcap: float = 0.0,
                           sinks: torch.Tensor | None = None, deterministic: bool = False,
                           check_seqlens: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2 over a packed batch of variable-length sequences (flash-attn's varlen API),
    differentiable w.r.t. q, k, v and sinks (kernels/varlen_bwd.py).

    Parameters
    ----------
    q : torch.Tensor, [total_q, Hq, d]
        Queries of all sequences, packed along dim 0; fp16 or bf16, CUDA (or CPU under
        ``TRITON_INTERPRET=1``); any strides with a unit last stride.
    k, v : torch.Tensor, [total_k, Hkv, d]
        Keys and values, packed the same way; ``Hq`` a multiple of ``Hkv`` (GQA / MQA).
    cu_seqlens_q, cu_seqlens_k : torch.Tensor, int32 [B + 1], contiguous, on the tensors' device
        Cumulative lengths: sequence ``s`` owns q rows ``cu_seqlens_q[s]:cu_seqlens_q[s+1]`` and k/v rows
        ``cu_seqlens_k[s]:cu_seqlens_k[s+1]``; starts at 0, non-decreasing, ends at total_q / total_k.
        Empty sequences are allowed (a sequence with queries but no keys gives 0 and LSE = -inf).
    max_seqlen_q, max_seqlen_k : int
        Upper bounds of the per-sequence lengths (need not be exact).
    causal : bool
        Bottom-right causal mask per sequence: key c visible to query r iff ``c <= r + Nk_s - Nq_s``.
    scale : float, optional
        Softmax scale, positive and at most ``_common.MAX_SCALE`` (about 2.36e38); defaults to
        ``1/sqrt(d)``. Any such scale gives a finite output (a huge one tends to the arg-max row).
    return_lse : bool
        Also return the natural-log logsumexp, [Hq, total_q] float32 (flash-attn's varlen layout).
    window : (left, right) or None, keyword-only
        Sliding window per sequence, flash-attn's ``window_size`` (-1 unbounded), bottom-right aligned:
        key c visible to row r iff ``r + off - left <= c <= r + off + right``, ``off = Nk_s - Nq_s``;
        causal forces right = 0. K/V tiles wholly outside it are skipped.
    softcap : float, keyword-only
        Scaled scores become ``softcap * tanh(s / softcap)``; 0 disables.
    sinks : torch.Tensor, float32 [Hq], optional, keyword-only
        One logit per query head in every row's softmax denominator, with no value; the LSE includes it.
    deterministic : bool, keyword-only
        Backward only. True: dQ in a separate pass, no atomics: bitwise-identical gradients run to run.
        False (default): the faster mode by the dense backward's rule, `kernels.bwd.ATOMIC_DQ_BY_DEFAULT`:
        while it is False (the separate pass measured faster, here too: bench/varlen.py), the same pass;
        else fp32 atomics inside the dK/dV kernel. On sm_90 (d 64 / 128, fp16 / bf16, no window or
        softcap) the backward runs the Gluon kernels of kernels/varlen_bwd_hopper.py, deterministic either
        way.
    check_seqlens : bool, keyword-only
        False (default): the cu_seqlens *values* are checked on the device without a host sync: any
        values are clamped into a partition of the packed rows (never a read or write outside the
        tensors, every output row written) and bad ones are raised as `InputError` by
        `attnscope.kernels.varlen.check_errors()`. True: checked on the host before the launch (copies
        both arrays to the host: a sync per call) and raised by this call.

    Returns
    -------
    o : torch.Tensor, [total_q, Hq, d], q's dtype (contiguous)
    lse : torch.Tensor, [Hq, total_q], float32 — only when ``return_lse``.

    Supported: d a multiple of 8 up to 256 (`_common.head_block`); fp16 and bf16 (NotImplementedError
    otherwise); malformed input raises ValueError naming the argument.

    Example
    -------
    >>> cu = torch.tensor([0, 100, 4196], dtype=torch.int32, device="cuda")
    >>> q = k = v = torch.randn(4196, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> o = attnscope.flash_attention_varlen(q, k, v, cu, cu, 4096, 4096, causal=True)
    >>> attnscope.kernels.varlen.check_errors()  # raises if cu held bad values
    """
    check_flags(causal=causal, return_lse=return_lse, check_seqlens=check_seqlens,
                deterministic=deterministic)
    check_scale(scale)
    grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v, sinks))
    compiling = torch.compiler.is_compiling()
    if grad or compiling:  # autograd, or torch.compile's trace (its fake impl reads the shapes): checks first
        prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softcap,
                sinks, scale, False)
    if compiling or grad:
        d = q.shape[-1] if hasattr(q, "shape") and len(q.shape) else 0
        sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(max(d, 1))
        o, lse = _op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale,
                     return_lse or grad, None if window is None else list(window), softcap, sinks,
                     deterministic, check_seqlens)
    else:  # eager without autograd: the same launch without the dispatcher
        o, lse = _launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                         return_lse, check_seqlens, window=window, softcap=softcap, sinks=sinks)
    return (o, lse) if return_lse else o


from attnscope.kernels import varlen_bwd as _bwd  # noqa: E402  the backward: the autograd formula of _op

torch.library.register_autograd("attnscope::flash_attention_varlen", _bwd.backward,
                               setup_context=_bwd.setup_context)
