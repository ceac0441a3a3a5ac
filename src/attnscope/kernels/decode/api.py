"""`flash_decode`, the one-line decode call over `DecodePlan`, with its bounded plan cache."""

from __future__ import annotations

import collections
import threading
from typing import NamedTuple

from attnscope.kernels._common import check_flags, import_torch_triton, kept_allocation
from attnscope.kernels.decode.checks import (
    _check_block_table_values,
    _check_inputs,
    _check_leftpad_values,
    _check_no_grad,
    _check_scale_values,
    _check_seqlen_values,
    _requires_grad,
)
from attnscope.kernels.decode.heuristics import (
    _raw_scores,
    _sms,
    _split_min_keys,
    _split_waves,
    _splits,
    _tiling,
    _window_span,
)
from attnscope.kernels.decode.plan import NAMES, DecodePlan

torch, _ = import_torch_triton()
Tensor = torch.Tensor


def flash_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor | None = None,
                 block_table: Tensor | None = None, *, num_splits: int | None = None,
                 scale: float | None = None, return_lse: bool = False, k_scale: Tensor | None = None,
                 v_scale: Tensor | None = None, window: tuple[int, int] | None = None, softcap: float = 0.0,
                 sinks: Tensor | None = None, cache_leftpad: Tensor | None = None,
                 check_seqlens: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Decode (or chunked-prefill) attention of Nq new queries per sequence against a KV cache.

    The one-line convenience over `DecodePlan`, with a bounded plan cache: plans for the `PLAN_CACHE_LAYOUTS`
    most recent layouts (tensor shapes, strides, dtypes, devices, the options, whether V's address is a
    multiple of 4 bytes, the CUDA stream), per layout for the `PLAN_CACHE_SPLITS` most recent split counts
    (`plan_cache_info`, `clear_plan_cache`). A known layout skips the layout checks and the plan build. A
    dense cache with one query per sequence is keyed without its length L and the strides that follow it, so
    a cache that grows call to call (transformers' DynamicCache appends by ``torch.cat``) reuses its plans:
    L and those strides are launch arguments, and the split count follows L by `default_num_splits`' rule
    (a new plan only for a split count not yet held). Inside CUDA-graph capture it builds a private plan
    (the graph keeps its scratch). No call reads a device value back unless ``check_seqlens``: the values
    are checked on the device and `check_errors` reports them.

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, Nq, d]
        The new queries, fp16 or bf16, CUDA (or CPU under ``TRITON_INTERPRET=1``). They are the last Nq
        positions of each sequence (``cache_seqlens`` counts them), causal among themselves
        (bottom-right); queries at a negative position (``cache_seqlens < Nq``) see no key.
    k_cache, v_cache : torch.Tensor
        Dense ``[B, Hkv, L_max, d]``: any strides with a unit last stride (e.g. a ``[B, L_max, Hkv, d]``
        buffer viewed as ``buf.transpose(1, 2)``). Paged (with ``block_table``): ``[num_pages,
        page_size, Hkv, d]``, page_size in {16, 32, 64, 128, 256}. Hq a multiple of Hkv (GQA / MQA: query
        head i reads kv head ``i // (Hq / Hkv)``). q's dtype, or ``torch.float8_e4m3fn`` with scales.
    cache_seqlens : torch.Tensor, int32 [B], optional
        Valid keys per sequence (positions ``0 .. len - 1``); default L_max for all. A sequence of length
        0 gives output 0 and LSE = -inf; any other is at least Nq (the queries are its last Nq
        positions). Checked on the device: a value outside [0, L_max] is clamped into it, one in
        (0, Nq) runs as given; both are recorded for `check_errors` (``check_seqlens=True``: refused).
    block_table : torch.Tensor, int32 [B, max_pages], optional
        The paged cache's page of each block of page_size keys; any order, pages may be shared. Checked
        on the device: a used entry outside [0, num_pages) is never read (its keys are left out) and is
        recorded for `check_errors`; entries past a sequence's length are never read at all.
    num_splits : int, optional, keyword-only
        KV splits per sequence; default `default_num_splits` (an e4m3 dense cache: `DecodePlan`'s rule).
        1 runs phase 1 only.
    scale : float, optional, keyword-only
        Softmax scale; default ``1/sqrt(d)``; see `DecodePlan` for its range.
    return_lse : bool, keyword-only
        Also return the natural-log logsumexp of each query row.
    k_scale, v_scale : torch.Tensor, float32, one element or [Hkv], keyword-only
        Dequantisation scales of an e4m3 cache (`attnscope.quantize_kv`); required with one, refused
        without. Their values are checked on the device (finite, positive, 448 x each finite in fp32, no
        score past fp32) and recorded for `check_errors`.
    window, softcap, sinks : keyword-only
        The score mods (`DecodePlan`): a sliding window ``(left, right)`` (decode is causal:
        right is 0), logit softcapping, one sink logit per query head (fp32 [Hq]).
    cache_leftpad : torch.Tensor, int32 [B], keyword-only
        A dense cache only: sequence b's keys start at ``cache_leftpad[b]``, the positions before it are
        left padding (never attended; their whole key blocks never read). Checked on the device (a value
        outside [0, its length] is clamped and recorded for `check_errors`; ``check_seqlens=True``: refused).
    check_seqlens : bool, keyword-only
        Also check the lengths, left pads, used block-table entries and scales on the host before the
        launch: a device sync per call that breaks CUDA-graph capture (default False); the split heuristic
        then uses the longest length. Inside torch.compile the call runs eagerly (a graph break; refused
        under ``fullgraph=True``).

    Returns
    -------
    o : torch.Tensor, [B, Hq, Nq, d], q's dtype
    lse : torch.Tensor, [B, Hq, Nq], float32, natural log — only when ``return_lse``.

    Supported: d a multiple of 8 up to 256; fp16 and bf16 queries; anything else raises NotImplementedError,
    as does an input that requires grad (decode has no backward). Malformed input raises `InputError` (a
    ValueError) naming the argument.

    Example
    -------
    >>> q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    >>> k = v = torch.randn(4, 8, 32768, 128, device="cuda", dtype=torch.bfloat16)
    >>> lens = torch.tensor([32768, 100, 0, 5000], device="cuda", dtype=torch.int32)
    >>> o = attnscope.flash_decode(q, k, v, cache_seqlens=lens)
    >>> attnscope.kernels.decode.check_errors()  # when a sync is cheap: raises on an out-of-range value
    """
    if type(return_lse) is not bool or type(check_seqlens) is not bool:
        check_flags(return_lse=return_lse, check_seqlens=check_seqlens)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, sinks, cache_leftpad)
    if torch.compiler.is_compiling():  # torch.compile traces the custom op (`_op`); it runs this function
        if check_seqlens:  # a host sync: the call runs eagerly, outside the graph (a graph break)
            return _checked_eager(*tensors[:5], num_splits=num_splits, scale=scale, return_lse=return_lse,
                                  k_scale=k_scale, v_scale=v_scale, window=window, softcap=softcap,
                                  sinks=sinks, cache_leftpad=cache_leftpad, check_seqlens=True)
        # the op has no autograd formula: refused as eager refuses it, not in the compiler's backward trace
        _check_no_grad(**dict(zip(NAMES, tensors, strict=True)))
        # the trace runs eager's checks: the op's schema would refuse a bad option with an unrelated error (or
        # take True as 1, or a window's first two entries)
        _check_inputs(*tensors[:5], num_splits, scale, k_scale, v_scale, window, softcap, sinks,
                      cache_leftpad)
        w = (-1, -1) if window is None else tuple(window)
        o, lse = torch.ops.attnscope.flash_decode(*tensors, num_splits, scale, w[0], w[1], softcap)
        return (o, lse) if return_lse else o
    options = (num_splits, scale, return_lse, window, softcap)
    # what a plan fixes about each tensor; False for an argument that is not a tensor (the checks name it)
    layouts = tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device)
                     if isinstance(t, Tensor) else False for t in tensors])
    key, grown, plan = _cached(tensors, layouts, options, check_seqlens)
    if plan is not None:
        return plan._launch(tensors, grown=grown)
    options = dict(zip(("num_splits", "scale", "return_lse", "window", "softcap"), options, strict=True))
    # a layout seen before passed these checks with these options: its facts are kept with its plans
    facts = _PLAN_CACHE.facts(key) if key is not None else None
    if facts is None:
        facts = _check_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, k_scale,
                              v_scale, window, softcap, sinks, cache_leftpad)
    elif grown is not None:  # the layout's facts, at this call's length
        facts = facts._replace(L_max=grown[6])
    longest = None
    if check_seqlens:
        num_pages = k_cache.shape[0] if block_table is not None else 0
        if cache_seqlens is not None:
            longest = _check_seqlen_values(cache_seqlens, facts.L_max, block_table, facts.page_size,
                                           num_pages, facts.Nq)
        elif block_table is not None:
            _check_block_table_values(block_table, facts.page_size, num_pages, facts.L_max)
        if cache_leftpad is not None:
            _check_leftpad_values(cache_leftpad, cache_seqlens, facts.L_max)
        if k_scale is not None:
            _check_scale_values(k_scale, v_scale, scale, facts.d)
    if key is None:
        plan = DecodePlan(*tensors[:5], k_scale=k_scale, v_scale=v_scale, sinks=sinks,
                          cache_leftpad=cache_leftpad, max_seqlen=longest, **options)
        return plan._launch(tensors)
    rule = _SplitRule.of(q.device, facts, num_splits, scale, longest)
    def make(splits):  # a kept plan's buffers outside any CUDA-graph pool (`kept_allocation`)
        return kept_allocation(torch, q.device, lambda: DecodePlan(
            *tensors[:5], k_scale=k_scale, v_scale=v_scale, sinks=sinks, cache_leftpad=cache_leftpad,
            max_seqlen=longest, **{**options, "num_splits": splits}))
    plan = _PLAN_CACHE.plan(key, facts, rule, make, default=not check_seqlens, length=grown and grown[6])
    return plan._launch(tensors, grown=grown)


def _cached(tensors, layouts, options, check_seqlens=False):
    """``(key, grown, plan)`` of a call: its plan-cache key (None: a private plan, inside CUDA-graph capture,
    or an argument the checks must name), `_grown_key`'s ``grown``, and the cached plan of the key's default
    split count (None: none yet, or ``check_seqlens``). ``layouts``: each tensor's (shape, strides, dtype,
    device) as the kernel reads it, None for no tensor, False for an argument that is not one; ``tensors``
    hold those values (any views of them: a plan reads their addresses)."""
    if False in layouts or None in layouts[:3]:
        return None, None, None
    if _requires_grad(tensors):
        _check_no_grad(**dict(zip(NAMES, tensors, strict=True)))
    device = layouts[0][3]
    cuda = device.type == "cuda"
    if cuda and torch.cuda.is_current_stream_capturing():  # capture: a private plan, no key
        return None, None, None
    # all a plan fixes but the split count: the layouts, the options, whether V can be read as words (an e4m3
    # V's address, `plan._words_aligned`); the stream, as a plan's partials serve one launch at a time. A
    # cache whose length changes call to call (grown by torch.cat) keeps its plans: its key leaves the length
    # out
    layouts, grown = _grown_key(layouts)
    try:  # hashing the key also vets the options
        # with their types, as the forward's key: 2 == 2.0 == True, and the checks refuse a float or bool
        num_splits, scale, _, window, softcap = options
        key = (layouts, options, type(num_splits), type(scale), type(softcap),
               window if window is None else tuple(map(type, window)), tensors[2].data_ptr() % 4 == 0,
               torch._C._cuda_getCurrentRawStream(device.index) if cuda else None)
        if check_seqlens:
            hash(key)
            return key, grown, None
        return key, grown, _PLAN_CACHE.fast(key, grown[6] if grown else None)  # a known layout, no value read
    except TypeError:  # an unhashable option (a list window): the checks name it
        return None, None, None


@torch.compiler.disable(reason="flash_decode(check_seqlens=True) reads cache_seqlens back to the host: pass "
                       "check_seqlens=False inside torch.compile and check_errors() outside it")
def _checked_eager(*args, **kwargs):
    """`flash_decode` with ``check_seqlens=True`` reached from a compiled region: run eagerly (the kernels'
    launches are not traced), a graph break; under ``fullgraph=True`` the compiler names this reason."""
    return flash_decode(*args, **kwargs)


def _grown_key(layouts):
    """``(layouts, grown)``: for a dense cache of one query per sequence (no block table, K and V of one
    length L >= 1: all the layout checks ask of L), the layouts with K's and V's length and strides left
    out, and in their place what a plan derives from them: the last stride (unit, checked), whether the
    K/V element offsets fit int32 (`plan._offsets_fit_int32`) and whether V's strides allow int32 words
    (`plan._words_aligned`); ``grown`` K's and V's strides of dims 0-2 and L, for `DecodePlan._launch`.
    Else ``(layouts, None)``."""
    (qs, _, _, _), (kshape, ks, kt, kd), (vshape, vs, vt, vd) = layouts[:3]
    if layouts[4] is not None or len(qs) != 4 or qs[2] != 1 or len(kshape) != 4 or len(vshape) != 4:
        return layouts, None
    length = kshape[2]
    if length < 1 or vshape[2] != length:
        return layouts, None
    off32 = (length - 1) * max(ks[2], vs[2]) + kshape[3] < 2**31
    words = (vs[0] | vs[1] | vs[2]) % 4 == 0
    key = (layouts[0], (kshape[:2], kshape[3], ks[3], kt, kd), (vshape[:2], vshape[3], vs[3], vt, vd),
           *layouts[3:], off32, words)
    return key, (ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], length)


class _SplitRule(NamedTuple):
    """The split count of a layout's calls, from their length in O(1): ``fixed`` (given, or one split for
    raw scores, or the longest length read with ``check_seqlens``), else the heuristic (`heuristics._splits`)
    on the length, capped at the keys a window lets the call's rows see (``span``,
    `heuristics._window_span`)."""

    fixed: int | None
    items: int
    kv_heads: int
    sms: int
    min_keys: int
    waves: int
    tail: bool
    span: int | None

    @staticmethod
    def of(device, facts, num_splits, scale, longest):
        raw = _raw_scores(scale, facts.d, facts.mods.softcap)
        span = _window_span(facts.Nq, facts.mods.left)
        waves = _split_waves(facts.fp8, bool(facts.page_size), facts.Nq)
        fixed = None
        if num_splits is not None or raw or longest is not None:
            if longest is not None and span is not None:
                longest = min(longest, span)
            fixed = _tiling(device, facts.B, facts.Hq, facts.Nq, facts.Hkv, facts.L_max, longest, num_splits,
                            None, raw, _split_min_keys(facts.fp8), waves)[2]
        m_tiles = _tiling(device, facts.B, facts.Hq, facts.Nq, facts.Hkv, 1, None, 1, None)[1]
        return _SplitRule(fixed, facts.B * m_tiles, facts.Hkv, _sms(device), _split_min_keys(facts.fp8),
                          waves, facts.Nq == 1, span)

    def splits(self, length: int) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.span is not None and self.span < length:
            length = self.span
        return _splits(self.items, self.kv_heads, length, self.sms, self.waves, self.min_keys, tail=self.tail)


class _PlanCache:
    """`flash_decode`'s plans (thread-safe): an LRU of `layouts` layouts (key: shapes, strides, dtypes
    and devices of the tensors, the options, the stream; a dense cache of one query per sequence without
    its length, `_grown_key`), each with its checked facts, an LRU of plans for up to `per_layout` split
    counts, and the split rule of a call that reads no lengths (`_SplitRule`: `fast`)."""

    def __init__(self, layouts: int, per_layout: int):
        self.layouts, self.per_layout = layouts, per_layout
        # key -> [facts, {splits: plan}, the split rule of calls that read no lengths or None, the last
        # length `fast` was asked for and its split count]
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def facts(self, key):
        with self._lock:
            return self._entries.get(key, (None,))[0]

    def fast(self, key, length=None):
        """The plan of a known layout's default split count at ``length`` keys (None: the layout's L_max),
        or None: a dict lookup and the split rule, no checks."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[2] is None:
                return None
            n = entry[0].L_max if length is None else length
            if n != entry[3]:  # the split count of the last length asked, kept
                entry[3:] = n, entry[2].splits(n)
            splits = entry[4]
            plan = entry[1].get(splits)
            if plan is None:
                return None
            self._entries.move_to_end(key)
            entry[1].move_to_end(splits)
            self.hits += 1
            return plan

    def plan(self, key, facts, rule, build, default=False, length=None):
        """The plan of ``key`` for the split count ``rule`` gives at ``length`` (None: ``facts.L_max``),
        built by ``build(splits)`` if missing; ``default``: ``rule`` serves `fast` from now on."""
        splits = rule.splits(facts.L_max if length is None else length)
        with self._lock:
            entry = self._entries.setdefault(key, [facts, collections.OrderedDict(), None, None, None])
            plans = entry[1]
            if default:
                entry[2:] = rule, None, None
            self._entries.move_to_end(key)
            if len(self._entries) > self.layouts:
                self._entries.popitem(last=False)  # least recently used layout: its scratch is freed
            if splits in plans:
                self.hits += 1
                plans.move_to_end(splits)
            else:
                self.misses += 1
                plans[splits] = build(splits)
                if len(plans) > self.per_layout:
                    plans.popitem(last=False)
            return plans[splits]

    def info(self):
        with self._lock:
            size = sum(len(entry[1]) for entry in self._entries.values())
            return PlanCacheInfo(self.hits, self.misses, size, self.layouts * self.per_layout)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


#: `flash_decode` keeps plans for this many layouts (least recently used dropped first) and, per layout,
#: split counts. A plan holds its fp32 partials and merge counters, no user tensor.
PLAN_CACHE_LAYOUTS = 8
PLAN_CACHE_SPLITS = 4
_PLAN_CACHE = _PlanCache(PLAN_CACHE_LAYOUTS, PLAN_CACHE_SPLITS)

PlanCacheInfo = collections.namedtuple("PlanCacheInfo", "hits misses size maxsize")


def plan_cache_info() -> PlanCacheInfo:
    """`flash_decode`'s plan cache: calls served by a cached plan (hits), plans built (misses), plans
    held, and the most it holds (``PLAN_CACHE_LAYOUTS * PLAN_CACHE_SPLITS``), as functools' cache_info."""
    return _PLAN_CACHE.info()


def clear_plan_cache() -> None:
    """Drop every plan `flash_decode` cached (freeing their scratch) and reset the counters."""
    _PLAN_CACHE.clear()
