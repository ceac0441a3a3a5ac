"""`DecodePlan`: a checked decode layout with its split count, blocks, merge and scratch (FlashInfer's
plan/run split); ``plan.run`` makes one launch (two with the separate merge) and can be captured in a CUDA
graph."""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

from attnscope.errors import InputError, expect, is_int
from attnscope.kernels._common import (
    LOG2E,
    check_disjoint,
    check_flags,
    dynamo_watching,
    head_block,
    import_torch_triton,
    interpreting,
    on_tensor_device,
    outside_dynamo,
)
from attnscope.kernels._direct import direct_launch, int_classes
from attnscope.kernels.decode._kernel import (
    _attnscope_decode_combine_kernel,
    _attnscope_decode_split_kernel,
    _emulate_bf16,
)
from attnscope.kernels.decode.checks import (
    _check_block_table_values,
    _check_inputs,
    _check_no_grad,
    _check_out,
    _check_scale_values,
    _check_seqlen_values,
    _error_word,
    _layout,
    _requires_grad,
    check_errors,
)
from attnscope.kernels.decode.heuristics import (
    MERGE_ELEMS,
    _block_config,
    _fuse_by_default,
    _raw_scores,
    _sms,
    _split_min_keys,
    _split_waves,
    _tiling,
    _window_span,
)

torch, triton = import_torch_triton()
Tensor = torch.Tensor


NAMES = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "k_scale", "v_scale", "sinks",
         "cache_leftpad")


class DecodePlan:
    """A checked decode layout with its split count, block sizes, merge and scratch: plan once, run often.

    Built from example tensors (FlashInfer's plan/run split): every input check, the split choice and
    the allocation of the fp32 partials and merge counters happen here, once. `run` then only compares
    each tensor's layout (shape, strides, dtype, device) with the plan's, raising `InputError` if one
    changed, and launches: no host sync unless ``check_seqlens``, no allocation but the output, so a run
    can be captured in a CUDA graph. From the second run on a GPU the launch skips Triton's per-call
    dispatch (`_direct.DirectLaunch`). The values of the lengths, block-table entries and K/V scales are
    checked on the device (see `attnscope.kernels.decode.checks`); `check` raises what they recorded. The
    partials belong to the plan: runs of one plan must be ordered (one stream, or synchronised), as with
    FlashInfer's workspace.

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, Nq, d]
        fp16 or bf16; Nq >= 1 new queries per sequence (the last Nq positions, causal among themselves).
    k_cache, v_cache : torch.Tensor
        Dense ``[B, Hkv, L_max, d]`` (any strides, unit last), or with ``block_table`` paged
        ``[num_pages, page_size, Hkv, d]``, page_size a power of two in 16..256; q's dtype, or
        ``torch.float8_e4m3fn`` with ``k_scale`` and ``v_scale``.
    cache_seqlens : torch.Tensor, int32 [B], optional
        Keys of each sequence, the Nq new ones included; default L_max for all.
    block_table : torch.Tensor, int32 [B, max_pages], optional
        Page of each block of ``page_size`` keys; pages may be in any order and shared. L_max is
        ``max_pages * page_size``.
    num_splits : int, optional
        KV splits; default `default_num_splits` of (B x row tiles, Hkv, ``max_seqlen``, SMs); on an e4m3
        dense cache with one query per sequence, toward `heuristics.FP8_DENSE_WAVES` programs per SM.
    scale : float, optional
        Softmax scale, default ``1/sqrt(d)``; positive, at most ``_common.MAX_SCALE``. Past
        ``RAW_SCORES_ABOVE / log2(e)`` (about 7e3) the kernel keeps its running max in raw scores and the
        plan runs one split (``num_splits`` must then be 1 or None): a huge scale gives the row arg-max, with
        an LSE of +inf where the true one passes fp32, never NaN.
    return_lse : bool
        `run` also returns the natural-log LSE [B, Hq, Nq] (fp32).
    k_scale, v_scale : torch.Tensor, float32, one element or [Hkv], optional
        The dequantisation scales of an e4m3 cache (required with one, refused without): key ``j`` of kv
        head ``h`` is ``k_cache[..] * k_scale[h]`` (`attnscope.quantize_kv` makes them).
    window : (left, right) or None
        Sliding window (flash-attn's ``window_size``, -1 unbounded): the query at position ``p`` sees keys
        ``p - left .. p`` (decode is causal, so ``right`` is 0 whatever is given); keys before the first
        query's window are never read.
    softcap : float
        Scores become ``softcap * tanh(s * scale / softcap)``; 0 (default) disables.
    sinks : torch.Tensor, float32 [Hq], optional
        One logit per query head joining each row's softmax denominator (no value; the LSE includes it).
    cache_leftpad : torch.Tensor, int32 [B], optional
        A dense cache only: sequence b's keys start at ``cache_leftpad[b]`` (flash-attn's argument: the
        positions before it are padding, never attended, and their whole key blocks never read); a value
        outside [0, its length] is clamped into it and recorded (`check`).
    max_seqlen : int, optional
        Longest length expected, for the split heuristic only (default L_max); results never depend
        on it.
    check_seqlens : bool
        `run` also reads cache_seqlens, the used block-table entries and the K/V scales back to check them
        before the launch: a host sync that breaks CUDA-graph capture (default False: device checks only).

    The split count, merge and block config follow `heuristics`; a benchmark overrides them through
    `_tuned_plan`.
    """

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None, *,
                 num_splits: int | None = None, scale: float | None = None, return_lse: bool = False,
                 k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                 window: tuple[int, int] | None = None, softcap: float = 0.0,
                 sinks: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                 max_seqlen: int | None = None,
                 check_seqlens: bool = False) -> None:
        self._build((q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, sinks, cache_leftpad),
                    num_splits,
                    scale, return_lse, window, softcap, max_seqlen, check_seqlens, _Tuning())

    def _build(self, tensors, num_splits, scale, return_lse, window, softcap, max_seqlen, check_seqlens,
               tuning):
        check_flags(return_lse=return_lse, check_seqlens=check_seqlens)
        use_dot, fuse_combine, _config = tuning
        q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, sinks, cache_leftpad = tensors
        facts = _check_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, k_scale,
                              v_scale, window, softcap, sinks, cache_leftpad)
        B, Hq, Nq, d, Hkv, L_max, page_size, mods = facts[:8]
        expect(max_seqlen is None or is_int(max_seqlen) and 0 <= max_seqlen <= L_max, "max_seqlen",
               f"an integer in [0, L_max = {L_max}] or None", max_seqlen)
        self.layout = tuple(_layout(t) for t in tensors)
        self.check_seqlens, self.return_lse, self.scale = check_seqlens, return_lse, scale
        self.L_max, self.page_size, self.d = L_max, page_size, d
        self.num_pages = k_cache.shape[0] if block_table is not None else 0
        group = Hq // Hkv
        rows = group * Nq
        dp = head_block(d)  # the kernels' head-dim tile: d, or the next power of two (columns past d read 0)
        use_dot = True if use_dot is None else use_dot  # pipelined MMA, low register use, every G
        raw = _raw_scores(scale, d, mods.softcap)
        span = _window_span(Nq, mods.left)  # a window: the split grid covers the keys a row sees, not L
        if span is not None:
            max_seqlen = min(L_max if max_seqlen is None else max_seqlen, span)
        block_m, m_tiles, num_splits = _tiling(q.device, B, Hq, Nq, Hkv, L_max, max_seqlen, num_splits,
                                               use_dot, raw, _split_min_keys(facts.fp8),
                                               _split_waves(facts.fp8, block_table is not None, Nq))
        paged = block_table is not None
        # Chunk tiles (Nq > 1) on a dense cache run the paged loop over a plan-owned table of "pages"
        # of BLOCK_N consecutive keys: Triton 3.6 pipelines that loop (K/V addresses from a table load)
        # 1.3 x better at the same tile (BENCHMARKS.md)
        page, self.table = page_size, None
        if Nq > 1 and not paged and _config is None:
            page = _block_config(block_m, head_dim=dp)["BLOCK_N"]
            self.table = _dense_pages(k_cache, v_cache, L_max, page)
            page = page if self.table is not None else page_size
        cfg = dict(_config or _block_config(block_m, page, facts.fp8, B * Hkv * m_tiles * num_splits,
                                            _sms(q.device), dp))
        self.num_splits = num_splits
        split = num_splits > 1
        merge_m = min(block_m, triton.next_power_of_2(rows))
        if fuse_combine is None:
            fuse_combine = _fuse_by_default(merge_m, num_splits, dp)
        fuse = split and fuse_combine
        merge_s = max(1, min(triton.next_power_of_2(num_splits), MERGE_ELEMS // (merge_m * dp)))
        n_rows = B * Hq * Nq
        device = q.device
        self.o_shape, self.lse_shape, self.dtype, self.device = (B, Hq, Nq, d), (B, Hq, Nq), q.dtype, device
        self.o_heads_last = (B, 1, Hq, d) if Nq == 1 else None  # `_launch`'s ``heads_last``
        self.split, self.fuse = split, fuse
        self.need_lse = return_lse or (split and not fuse)  # the separate merge always writes the LSE
        # scratch, owned by the plan: fp32 partials and the fused merge's counters (left at 0 by the kernel)
        f32 = torch.float32
        self.o_part = torch.empty((n_rows, num_splits, dp), dtype=f32, device=device) if split else None
        self.lse_part = torch.empty((n_rows, num_splits), dtype=f32, device=device) if split else None
        self.sem = torch.zeros(B * Hkv * m_tiles, dtype=torch.int32, device=device) if fuse else None
        self.err = _error_word(device)
        sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
        self._grid = (B * Hkv * m_tiles, num_splits)
        if self.table is not None:  # page stride = page x key stride; heads and keys as in the dense cache
            kst = (page * k_cache.stride(2), k_cache.stride(1), k_cache.stride(2))
            vst = (page * v_cache.stride(2), v_cache.stride(1), v_cache.stride(2))
        else:
            kst = (k_cache.stride(0), k_cache.stride(2 if paged else 1), k_cache.stride(1 if paged else 2))
            vst = (v_cache.stride(0), v_cache.stride(2 if paged else 1), v_cache.stride(1 if paged else 2))
        self._scalars = (
            q.stride(0), q.stride(1), q.stride(2), *kst, *vst,
            cache_seqlens.stride(0) if cache_seqlens is not None else 0,
            block_table.stride(0) if paged else (self.table.stride(0) if self.table is not None else 0),
            Hkv, L_max, num_splits, Nq, m_tiles,
            self.num_pages if paged else 2**31 - 1,  # the plan's own table of a dense cache is in range
            max(mods.left, 0), sm_scale * LOG2E, mods.softcap * LOG2E,
        )
        self._consts = {
            "GROUP": group, "BLOCK_M": block_m, "HEAD_DIM": dp, "BLOCK_N": cfg["BLOCK_N"],
            "STAGES": cfg["STAGES"], "USE_DOT": use_dot, "EMULATE_BF16": _emulate_bf16(q.dtype),
            "SPLIT": split, "FUSE": fuse, "MERGE_M": merge_m, "MERGE_S": merge_s,
            "WRITE_LSE": self.return_lse, "HAS_SEQLENS": cache_seqlens is not None,
            "PAGED": paged or self.table is not None, "PAGE_SIZE": max(page, 1), "CHUNK": Nq > 1,
            "OFF32": cfg.get("OFF32", _offsets_fit_int32(
                k_cache, v_cache, (0, 1) if paged else (0, 2) if self.table is not None else (2,))),
            "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
        }
        # the optional constexprs are passed only when on: the plain launch passes what it always did.
        # e4m3 with Q K^T in fp16 (F16QK) converts K and V per byte; else V is read as words where aligned
        f16qk = facts.fp8 and use_dot and bool(cfg.get("F16QK", False))
        words = facts.fp8 and not f16qk and _words_aligned(v_cache) and d == dp  # words: whole rows of d
        for name, on in (("MAX_UNSCALED", raw), ("FP8", facts.fp8), ("SCALE_PER_HEAD", facts.scale_per_head),
                         ("FP8_WORDS", words), ("FP8_F16QK", f16qk),
                         ("FP8_ASM", (words or f16qk) and not interpreting()),
                         ("WINDOW", mods.windowed), ("SOFTCAP", mods.softcap > 0),
                         ("HAS_SINKS", sinks is not None), ("HAS_STARTS", cache_leftpad is not None),
                         ("PAGE_PRECHECK", paged and bool(cfg.get("PAGE_PRECHECK", False)))):
            if on:
                self._consts[name] = True
        if d != dp:
            self._consts["D"] = d
        self._combine_grid = (n_rows,)
        self._combine_consts = {"HEAD_DIM": dp, "BLOCK_S": min(16, triton.next_power_of_2(num_splits)),
                                "EMULATE_BF16": _emulate_bf16(q.dtype), **({"D": d} if d != dp else {})}
        if sinks is not None:
            self._combine_consts["HAS_SINKS"] = True
        self._combine_scalars = (num_splits, Nq, Hq)
        self._words = words
        # the separate merge's two launches read the plan's partials between them: a call's pair must not
        # interleave with another thread's on the stream (a fused call is one launch)
        self._pair = threading.Lock() if split and not fuse else None
        self._last = (None, None, None)  # the last ``grown`` of `_launch`, its scalars, `_direct.int_classes`
        split_kernel = direct_launch(_attnscope_decode_split_kernel, self._consts, device)
        self._direct = None if split_kernel is None else (
            split_kernel, direct_launch(_attnscope_decode_combine_kernel, self._combine_consts, device))

    def _mismatch(self, tensors):
        for name, want, t in zip(NAMES, self.layout, tensors, strict=True):
            if t is not None and not isinstance(t, torch.Tensor):
                return InputError(f"{name}: expected a torch.Tensor as planned, got {type(t).__name__}")
            got = _layout(t)
            if got != want:
                what = "None" if want is None else f"shape {want[0]}, strides {want[1]}, {want[2]}, {want[3]}"
                seen = "None" if got is None else f"shape {got[0]}, strides {got[1]}, {got[2]}, {got[3]}"
                return InputError(f"{name}: expected the planned layout ({what}), got {seen}; "
                                  f"make a new plan")
        return None

    @on_tensor_device(torch, watch=False)  # a traced call runs `_run_eager`, and `_launch` watches
    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor | None = None,
            block_table: Tensor | None = None, *, k_scale: Tensor | None = None,
            v_scale: Tensor | None = None, sinks: Tensor | None = None, cache_leftpad: Tensor | None = None,
            out: Tensor | None = None, lse_out: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Launch on tensors with the planned layouts (values may change freely).

        Returns ``o`` [B, Hq, Nq, d] in q's dtype, and ``lse`` [B, Hq, Nq] fp32 (natural log) when the
        plan was made with ``return_lse``. ``out`` / ``lse_out``: contiguous tensors of those shapes and
        dtypes to write into instead of allocating (``lse_out`` only with ``return_lse``), sharing no
        memory with the inputs or each other. Raises `InputError` if a tensor's shape, strides, dtype or
        device differ from the plan's, an e4m3 ``v_cache`` planned at an address that is a multiple of 4
        bytes is not at one now (its values are read as int32 words), or (``check_seqlens``) a length,
        used page index or K/V scale is out of range; `NotImplementedError` if an input requires grad
        (decode has no backward). Values are checked on the device: `check` raises what they recorded.
        Inside torch.compile it runs eagerly (a graph break; refused under ``fullgraph=True``): a compiled
        region calls `attnscope.flash_decode`, one custom op.
        """
        if torch.compiler.is_compiling():  # a plan launches directly: eagerly, outside the graph
            return _run_eager(self, q, k_cache, v_cache, cache_seqlens, block_table, k_scale=k_scale,
                              v_scale=v_scale, sinks=sinks, cache_leftpad=cache_leftpad, out=out,
                              lse_out=lse_out)
        tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, sinks, cache_leftpad)
        for t, want in zip(tensors, self.layout, strict=True):
            if (t is None) != (want is None) or t is not None and (
                    not isinstance(t, torch.Tensor) or (t.shape, t.stride(), t.dtype, t.device) != want):
                raise self._mismatch(tensors)
        if _requires_grad(tensors):
            _check_no_grad(**dict(zip(NAMES, tensors, strict=True)))
        if self.check_seqlens:
            self._check_values(tensors)
        if isinstance(out, torch.Tensor) or isinstance(lse_out, torch.Tensor):  # not on the common path
            inputs = dict(zip(NAMES, tensors, strict=True))
            if isinstance(out, torch.Tensor):
                check_disjoint(torch, "out", out, inputs)
            if isinstance(lse_out, torch.Tensor):
                check_disjoint(torch, "lse_out", lse_out, {**inputs, "out": out})
        return self._launch(tensors, out, lse_out)

    def check(self) -> None:
        """Raise `InputError` if a decode call on this plan's device met an out-of-range length, block-table
        entry or K/V scale since the last check (`checks.check_errors`; one device sync)."""
        check_errors(self.device)

    def _check_values(self, tensors):
        """The eager host checks of ``check_seqlens=True`` (a device sync)."""
        q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, _, _ = tensors
        longest = None
        if cache_seqlens is not None:
            longest = _check_seqlen_values(cache_seqlens, self.L_max, block_table, self.page_size,
                                           self.num_pages, q.shape[2])
        elif block_table is not None:
            _check_block_table_values(block_table, self.page_size, self.num_pages, self.L_max)
        if k_scale is not None:
            _check_scale_values(k_scale, v_scale, self.scale, self.d)
        return longest

    def _launch(self, tensors, out=None, lse_out=None, grown=None, heads_last=False):
        """Allocate (or check) the outputs and launch; the layouts are already known to match, or (a
        dense cache, Nq = 1: `api._grown_key` says what else a plan fixes of them) to differ from the
        plan's only in K's and V's length and strides, passed as ``grown`` (K's and V's strides of dims 0-2,
        then L). ``heads_last`` (Nq = 1, no ``out``): o allocated as [B, 1, Hq, d], flash-attn's layout
        (the same memory as [B, Hq, 1, d])."""
        if _watching() is not None:  # eager inside a compiled region's graph break: never traced
            return _launch_untraced(self, tensors, out, lse_out, grown, heads_last)
        q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, sinks, starts = tensors
        scalars, spec = self._scalars, None
        if grown is not None:
            last = self._last
            if last[0] != grown:
                s = self._scalars
                # the binary depends on how Triton classes these integers
                last = self._last = (grown, (*s[:3], *grown[:6], *s[9:12], grown[6], *s[13:]),
                                     int_classes(grown) if self._direct is not None else None)
            scalars, spec = last[1], last[2]
        if out is None:
            o = torch.empty(self.o_heads_last if heads_last else self.o_shape, dtype=self.dtype,
                            device=self.device)
        else:
            _check_out("out", out, self.o_shape, self.dtype, self.device)
            o = out
        if lse_out is not None:
            if not self.return_lse:
                raise InputError("lse_out: expected None (the plan was made with return_lse=False), "
                                 "got a tensor")
            _check_out("lse_out", lse_out, self.lse_shape, torch.float32, self.device)
            lse = lse_out
        else:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device) if self.need_lse else o
        o_part = self.o_part if self.split else o  # placeholders are never touched
        lse_part = self.lse_part if self.split else o
        sem = self.sem if self.fuse else o
        table = block_table if block_table is not None else self.table
        if self._words and v_cache.data_ptr() % 4:
            raise InputError(f"v_cache: expected an address that is a multiple of 4 bytes, as planned (its "
                             f"e4m3 values are read as int32 words), got {v_cache.data_ptr():#x}; make a new "
                             f"plan")
        args = (q, k_cache, v_cache, cache_seqlens if cache_seqlens is not None else o,
                table if table is not None else o, o_part, lse_part, o, lse, sem, self.err,
                k_scale if k_scale is not None else o, v_scale if v_scale is not None else o,
                sinks if sinks is not None else o, starts if starts is not None else o, *scalars)
        pair = self._pair  # None: one launch per call
        if pair is not None:
            pair.acquire()
        try:
            if self._direct is None:  # the interpreter, a CPU tensor
                _attnscope_decode_split_kernel[self._grid](*args, **self._consts)
            else:
                # the tensors whose addresses may change between runs (the plan's scratch never does)
                bits = q.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr() | o.data_ptr() | lse.data_ptr()
                for t in (cache_seqlens, block_table, k_scale, v_scale, sinks, starts):
                    if t is not None:
                        bits |= t.data_ptr()
                aligned = bits % 16 == 0
                self._direct[0].launch(self._grid, args, aligned, spec)
            if self.split and not self.fuse:
                args = (o_part, lse_part, o, lse, sinks if sinks is not None else o, *self._combine_scalars)
                if self._direct is None:
                    _attnscope_decode_combine_kernel[self._combine_grid](*args, **self._combine_consts)
                else:
                    self._direct[1].launch(self._combine_grid, args, aligned)
        finally:
            if pair is not None:
                pair.release()
        return (o, lse) if self.return_lse else o


_watching = dynamo_watching(torch)
_launch_untraced = outside_dynamo(torch, DecodePlan._launch)


@torch.compiler.disable(reason="DecodePlan.run launches its kernels directly: inside torch.compile call "
                       "attnscope.flash_decode (one custom op, no graph break)")
def _run_eager(plan, *args, **kwargs):
    """`DecodePlan.run` reached from a compiled region: run eagerly (a graph break; ``fullgraph=True``
    names this reason)."""
    return plan.run(*args, **kwargs)


def _dense_pages(k_cache, v_cache, L_max: int, page: int):
    """A dense cache as pages of ``page`` keys: int32 [B, ceil(L_max / page)] with entry ``b * R + j``,
    R = batch stride / (page x key stride), so page ``b * R + j`` at stride ``page x key stride`` is keys
    ``j * page ..`` of sequence b. None when the strides do not allow it (K and V must share R) or
    the page indices would not fit in int32."""
    B = k_cache.shape[0]
    spans = [(t.stride(0), page * t.stride(2)) for t in (k_cache, v_cache)]
    if any(span <= 0 or batch % span for batch, span in spans) or len({b // s for b, s in spans}) != 1:
        return None
    R, n = spans[0][0] // spans[0][1], -(-L_max // page)
    if B * R + n >= 2**31:
        return None
    j = torch.arange(n, dtype=torch.int32, device=k_cache.device)
    return torch.arange(B, dtype=torch.int32, device=k_cache.device)[:, None] * R + j[None, :]


def _words_aligned(v_cache) -> bool:
    """Whether an e4m3 V cache can be read as int32 words of four elements (the kernel's ``FP8_WORDS``):
    its address and strides are multiples of 4 bytes (16 for 16-byte loads, which Triton specialises)."""
    return v_cache.data_ptr() % 4 == 0 and all(st % 4 == 0 for st in v_cache.stride()[:3])


def _offsets_fit_int32(k_cache, v_cache, dims) -> bool:
    """Whether every K/V element offset the split kernel adds to its base pointers fits in int32: the
    offsets walk the cache dims ``dims`` (dense: the keys, (2,), from a (batch, head) base; paged: pages
    and slots, (0, 1); a dense cache through `_dense_pages`: batch and keys, (0, 2), from a head's base)
    plus d. Dense rows never pass the last key (clamped); paged lanes past it are masked and never loaded,
    whatever their wrapped address."""
    def span(t):
        return sum((t.shape[i] - 1) * t.stride(i) for i in dims) + t.shape[3]
    return max(span(k_cache), span(v_cache)) < 2**31


def decode_plan(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                **options: Any) -> DecodePlan:
    """`DecodePlan` (same arguments): ``plan = decode_plan(q, k, v, lens); o = plan.run(q, k, v, lens)``."""
    return DecodePlan(q, k_cache, v_cache, cache_seqlens, block_table, **options)


class _Tuning(NamedTuple):
    """A plan's tuning knobs (benchmarks): ``use_dot`` tl.dot (default) or elementwise products;
    ``fuse_combine`` fused (default when small, `heuristics._fuse_by_default`) or separate merge;
    ``config`` a phase-1 block config (``BLOCK_N``, ``STAGES``, ``num_warps``, ``num_stages``, optional
    ``OFF32``, ``PAGE_PRECHECK`` (a paged cache: `heuristics.PAGE_PRECHECK`), and for e4m3 K/V ``F16QK``:
    `heuristics.FP8_CONFIGS`) in place of
    `heuristics._block_config`."""

    use_dot: bool | None = None
    fuse_combine: bool | None = None
    config: dict | None = None


def _tuned_plan(q, k_cache, v_cache, cache_seqlens=None, block_table=None, *, num_splits=None, scale=None,
                return_lse=False, k_scale=None, v_scale=None, window=None, softcap=0.0, sinks=None,
                cache_leftpad=None, max_seqlen=None, check_seqlens=False, use_dot=None, fuse_combine=None,
                config=None) -> DecodePlan:
    """A `DecodePlan` with its tuning knobs set (`_Tuning`): the benchmarks' entry point."""
    for name, value in (("use_dot", use_dot), ("fuse_combine", fuse_combine)):
        expect(value is None or isinstance(value, bool), name, "True, False or None", value)
    expect(config is None or isinstance(config, dict), "config", "a dict or None", config)
    plan = DecodePlan.__new__(DecodePlan)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, sinks, cache_leftpad)
    plan._build(tensors, num_splits, scale, return_lse, window, softcap, max_seqlen, check_seqlens,
                _Tuning(use_dot, fuse_combine, config))
    return plan
