"""attnscope as a Hugging Face transformers attention backend: ``attn_implementation="attnscope"``.

``register()`` adds `attention_forward` to transformers' ``AttentionInterface`` and, under the same name,
`padding_mask` (flash-attn's mask form) to ``AttentionMaskInterface``: the attention function receives
either no mask (every key of every sequence is visible, up to causality) or the 2-D padding mask
[B, <= kv_len] (True = a real token; keys beyond its length, a static cache's unfilled slots, are padding).
Then:

- no mask, one new token per sequence of a causal model (a decode step against the full cache K/V
  transformers passes): `attnscope.flash_decode`, or where the step needs a backward (grad mode on, an input
  requiring grad: `flash_decode` has none) the differentiable kernels, as the paths below without it;
- no mask otherwise (prefill, chunked prefill, non-causal): `attnscope.flash_attention`, bottom-right causal;
- a mask without padding over the first ``n`` cache slots (a static cache): the same kernels on the
  filled keys (a view; `flash_decode` with ``cache_seqlens``, filled once per mask tensor). `padding_mask`
  marks such a mask by its form, stride 0 (`filled`), so the attention call needs no host read to know it;
  eagerly it finds one by one host read of a static cache's mask per mask built (as transformers' own flash
  mask does for a dynamic cache's), under ``torch.compile`` it reads nothing and the mask takes the padded
  path. A decode step's such mask is `lengths` instead: int32 [B, 1, 1, 1], the filled lengths on the
  device (`flash_decode`'s ``cache_seqlens``), a shape that stays the same as the cache fills, so
  transformers' compiled decode step (a static cache under ``torch.compile``) is traced and recorded once;
  with left padding [B, 1, 1, 2], each row's first real key too (``cache_leftpad``: no gather);
- a padding mask: the tokens are permuted on the device into a packed batch, the real ones first in
  order, one sequence per row, then the padding as one more sequence (cu_seqlens from the mask's row
  sums, ``max_seqlen`` the packed sizes, known from the shapes), run through
  `attnscope.flash_attention_varlen`, and gathered back (padded query rows give 0). The queries are the
  last ``Nq`` mask columns; the packing is built once per mask tensor (transformers passes one mask to
  every layer; a one-entry cache, `_packing`). No host read, except with a sliding window: one read per
  mask tensor refuses a mask with holes. A decode step (one query, causal) eagerly reads the mask back once
  per mask tensor (`_spans`): left padding only (each row's real tokens end at its query) runs
  `flash_decode` with ``cache_leftpad`` (each row's first real key) on the cache as it is, no gather.
- a 4-D bool mask [B, 1, 1, kv_len] with one query per sequence (SDPA's sense: the keys each query sees;
  what `padding_mask` gives a padded batch's decode step over a static cache, a shape that stays the same as
  the cache fills): eagerly, rows that each mark one run of keys (`_spans`, one read per mask tensor) run
  `flash_decode` on their runs (``cache_seqlens`` its ends, ``cache_leftpad`` its starts, the query the last
  marked key); otherwise, and under ``torch.compile``, each row's marked keys are packed on the device,
  `flash_attention_varlen` (`_key_masked_step`; it gathers the marked keys of every row each call).
- a bidirectional mask (an encoder, cross-attention): an encoder's padding mask as above (non-causal); a
  cross-attention decode step's as the 4-D key mask.

The module's ``scaling``, ``sliding_window`` (transformers' window of W keys is ``window=(W - 1, 0)``),
``softcap`` and sinks (``s_aux``, or the module's ``sinks`` parameter, as gpt-oss) go to the kernels'
``scale=``, ``window=``, ``softcap=`` and ``sinks=`` keywords. Dropout during training, attention weights
(``output_attentions``), other 4-D masks (more than one query, not bool), a mask pattern the padding form
cannot hold (packed sequences that transformers finds in ``position_ids``, a model's extra mask function,
Llama 4's chunked attention past one chunk, a bidirectional sliding window, cross-attention of more than one
query to a padded encoder output: refused by `padding_mask`), and a sliding window over a padding mask
with holes raise NotImplementedError; nothing is ignored.

Host reads: `attention_forward` only those named above (a sliding window over a padding mask; eagerly, a
padded batch's decode step, `_spans`); `padding_mask` one per mask built where transformers' own flash mask
does, and eagerly for a static cache's mask. Packed sequences are found by transformers (its own read of
``position_ids`` in a forward without a cache, made for every implementation); with a cache transformers
takes positions as positions for every implementation, and so does attnscope.

transformers is an optional extra: ``pip install 'attnscope[transformers]'``.
"""

from __future__ import annotations

import weakref

from attnscope.errors import InputError, expect, is_int
from attnscope.kernels._common import import_torch_triton

torch, _ = import_torch_triton()
try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"attnscope.integrations.transformers needs transformers: "
                      f"pip install 'attnscope[transformers]' ({e})") from e

from attnscope.kernels.decode import flash_decode  # noqa: E402
from attnscope.kernels.decode.api import _cached  # noqa: E402
from attnscope.kernels.decode.checks import _requires_grad  # noqa: E402
from attnscope.kernels.fwd import flash_attention  # noqa: E402
from attnscope.kernels.varlen import flash_attention_varlen  # noqa: E402

Tensor = torch.Tensor


def register(name: str = "attnscope") -> str:
    """Register attnscope under ``name`` with transformers; returns ``name``.

    Afterwards ``AutoModelForCausalLM.from_pretrained(..., attn_implementation=name)`` (or ``from_config``,
    or ``model.set_attn_implementation(name)``) runs attention through attnscope's kernels.

    Example
    -------
    >>> from attnscope.integrations import transformers as hf
    >>> model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
    ...                                              attn_implementation=hf.register())
    """
    if not (isinstance(name, str) and name):
        raise InputError(f"name: expected a non-empty string, got {name!r}")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name


def filled(batch_size: int, n: int, device: torch.device | str | None = None) -> Tensor:
    """The padding mask [B, n] of ones in the form that says so without a read: stride 0 (one stored
    True). `attention_forward` takes a stride-0 mask as "no padding, keys [0, n) filled"."""
    return torch.ones((), dtype=torch.bool, device=device).expand(batch_size, n)


def _is_filled(mask: Tensor) -> bool:
    return mask.dtype == torch.bool and mask.stride() == (0, 0)


def lengths(lens: Tensor, starts: Tensor | None = None) -> Tensor:
    """The mask form of a decode step over a cache filled to lengths held on the device: ``lens`` (int [B])
    as int32 [B, 1, 1, 1], row b's keys [0, lens[b]) filled, no padding, one query each; with ``starts``
    (left padding) int32 [B, 1, 1, 2], row b's keys [starts[b], lens[b]). Its shape does not change as the
    cache fills, so a compiled decode step (a static cache under ``torch.compile``) records one graph, not
    one per length; transformers passes a 4-D mask to the attention function as it is."""
    cols = (lens,) if starts is None else (lens, starts)
    return torch.stack([c.reshape(-1).to(torch.int32) for c in cols], 1).reshape(-1, 1, 1, len(cols))


def _is_lengths(mask: Tensor) -> bool:
    return (mask.dim() == 4 and mask.dtype == torch.int32 and tuple(mask.shape[1:3]) == (1, 1)
            and mask.shape[3] in (1, 2))


#: The columns of the last `lengths` mask with starts (a weak reference to it, its version counter, device)
#: and the columns as contiguous tensors: every layer of a step shares the mask, so one split per step.
_LENGTH_COLUMNS = [lambda: None, None, None]


def _length_columns(mask: Tensor):
    """``(lens, starts)`` int32 [B] of a `lengths` mask (starts None without them), each contiguous (the
    kernel reads ``cache_leftpad`` at unit stride); kept for the mask tensor except when `_transient`."""
    B = mask.shape[0]
    if mask.shape[3] == 1:
        return mask.view(B), None
    transient = _transient(mask.device)
    key = (mask._version, mask.device)
    ref, known, cols = _LENGTH_COLUMNS
    if not transient and ref() is mask and known == key:
        return cols
    cols = (mask[:, 0, 0, 0].contiguous(), mask[:, 0, 0, 1].contiguous())
    if not transient:
        _LENGTH_COLUMNS[:] = [weakref.ref(mask), key, cols]
    return cols


def _is_key_mask(mask: Tensor) -> bool:
    """A 4-D bool mask [B, 1, 1, kv_len]: for one query per sequence, the keys it sees (True, as SDPA's)."""
    return mask.dim() == 4 and mask.dtype == torch.bool and mask.shape[1] == 1 and mask.shape[2] == 1


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 attention_mask: Tensor | None = None, device: torch.device | str | None = None,
                 allow_is_causal_skip: bool = True, **kwargs: object) -> Tensor | None:
    """The mask transformers builds for attnscope: flash-attn's form (None, or the 2-D padding mask
    [B, <= kv_length], True = a real token, the queries its last columns; keys beyond its length are
    padding). A static cache's mask (shorter than ``kv_length``) without padding becomes `filled`, or for a
    decode step `lengths`; with left padding a decode step's becomes `lengths` with the starts, with other
    padding the 4-D key mask [B, 1, 1, kv_length] (eagerly: one host read per mask; under ``torch.compile``
    none, and the mask stays as it is). Without a
    mask, the filled slots of a cache with unfilled ones: for a decode step where the cache keeps its offset
    on the device (a static cache), `lengths` computed there (no read); otherwise `filled` (one read of the
    offset). transformers may pass what this returns back in as ``attention_mask``.

    transformers clears ``allow_is_causal_skip`` for more than one query exactly when its mask holds more than
    causality, a sliding window and padding (packed sequences it found in ``position_ids``, a model's ``and``
    / ``or`` mask function); the padding form cannot hold that, so it is refused (NotImplementedError). A
    bidirectional mask (transformers passes ``allow_is_bidirectional_skip``: an encoder, cross-attention) is
    the padding mask for self-attention and the 4-D key mask for one cross-attention query; for more it is
    refused (the padding form's queries are its last columns, an encoder's keys are not the queries)."""
    bidirectional = "allow_is_bidirectional_skip" in kwargs  # only transformers' bidirectional masks pass it
    if bidirectional and kwargs.get("local_size") is not None:
        raise NotImplementedError("attention_mask: a bidirectional sliding-window mask is not supported; "
                                  "supported: causal masks (with or without a sliding window) and plain "
                                  "bidirectional ones")
    skip = kwargs["allow_is_bidirectional_skip"] if bidirectional else allow_is_causal_skip
    if not skip and q_length > 1:
        raise NotImplementedError("attention_mask: transformers asks for a mask beyond causal, sliding "
                                  "window and padding (packed sequences in position_ids, or a model's extra "
                                  "mask function); supported: a padded batch with a 2-D attention_mask")
    chunk = getattr(kwargs.get("config"), "attention_chunk_size", None)
    if chunk is not None and kwargs.get("local_size") == chunk and kv_length + kv_offset > chunk:
        # transformers refuses this for flash attention the same way: the padding form has no chunks
        raise NotImplementedError(f"attention_chunk_size: chunked attention (Llama 4's) over more than one "
                                  f"chunk is not supported; supported: at most attention_chunk_size = "
                                  f"{chunk} keys, got {kv_length + kv_offset}")
    mask = flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                                attention_mask=attention_mask, device=device, **kwargs)
    if bidirectional:  # an encoder's self-attention (q_length == kv_length) or cross-attention to one
        if mask is None or q_length == kv_length:
            return mask
        if q_length == 1:  # the keys the query sees, for every query: the 4-D key mask
            return mask.to(torch.bool)[:, None, None, :]
        raise NotImplementedError(f"attention_mask: cross-attention to a padded encoder output is supported "
                                  f"for one query at a time (a decode step), got q_length = {q_length} "
                                  f"queries over {kv_length} keys; supported: an encoder output without "
                                  f"padding, or q_length = 1")
    if mask is not None:
        if mask.shape[1] < kv_length and not torch.compiler.is_compiling():
            n = mask.shape[1]
            if bool(mask.all()):
                if q_length == 1:
                    return lengths(torch.full((batch_size,), n, dtype=torch.int32, device=mask.device))
                return filled(batch_size, n, mask.device)
            if q_length == 1:  # padding: left padding as starts, else the keys each row's query sees
                spans = _spans(mask)
                if spans is not None and spans[2]:
                    return lengths(spans[1], spans[0])
                return torch.nn.functional.pad(mask.to(torch.bool), (0, kv_length - n))[:, None, None, :]
        return mask
    if attention_mask is not None:  # transformers found it all ones over all kv_length slots
        return None
    if q_length == 1 and isinstance(q_offset, torch.Tensor):  # a static cache's decode step: no read
        n = (q_offset.reshape(-1)[:1] - kv_offset + 1).clamp(max=kv_length)
        return lengths(n.to(device=device).expand(batch_size))
    n = int(q_offset - kv_offset) + q_length  # positions written once this step's keys are in (one read)
    return filled(batch_size, n, device) if n < kv_length else None


def _module_sinks(module):
    """``getattr(module, "sinks", None)``, looked up in a torch module's own dicts first (its instance
    attributes, parameters, buffers, submodules: where ``nn.Module.__getattr__`` looks) and its classes', so a
    module without sinks raises and catches no AttributeError per call; a sinks attribute set or deleted
    between calls is seen on the next one."""
    d = getattr(module, "__dict__", None)
    if d is None or "sinks" in d or torch.compiler.is_compiling():
        return getattr(module, "sinks", None)
    for store in (d.get("_parameters"), d.get("_buffers"), d.get("_modules")):
        if isinstance(store, dict) and "sinks" in store:
            return store["sinks"]
    for c in type(module).__mro__:
        if "sinks" in c.__dict__:
            return getattr(module, "sinks", None)
    return None


def _mods(module, query, sliding_window, softcap, s_aux, causal) -> dict:
    """The module's score mods as the kernels' keywords (only those that are on)."""
    mods = {}
    if sliding_window is not None:  # transformers: key j visible to query i iff i - W < j <= i
        expect(is_int(sliding_window) and sliding_window >= 1, "sliding_window", "a positive int or None",
               sliding_window)
        mods["window"] = (sliding_window - 1, 0 if causal else sliding_window - 1)
    if softcap:
        mods["softcap"] = float(softcap)
    sinks = s_aux if s_aux is not None else _module_sinks(module)
    if sinks is not None:
        sinks = sinks.to(device=query.device, dtype=torch.float32)  # differentiable; fp32 [Hq]: itself
        mods["sinks"] = sinks if sinks.dim() == 1 else sinks.reshape(-1)
    return mods


def _refuse(dropout, attention_mask, kwargs) -> None:
    if dropout:
        raise NotImplementedError(f"dropout: attention dropout is not supported by attnscope (supported: "
                                  f"0.0, i.e. model.eval()), got {dropout}")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("output_attentions: attnscope never materialises the attention weights "
                                  "(supported: output_attentions=False)")
    mask = attention_mask
    if mask is not None and not (isinstance(mask, torch.Tensor)
                                 and (mask.dim() == 2 or _is_lengths(mask) or _is_key_mask(mask))):
        got = tuple(mask.shape) if hasattr(mask, "shape") else type(mask).__name__
        raise NotImplementedError(f"attention_mask: supported: None, a 2-D padding mask [B, kv_len] "
                                  f"(transformers' flash-attention mask form) or, for one query per "
                                  f"sequence, a 4-D bool mask [B, 1, 1, kv_len], got {got}")


def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, sliding_window: int | None = None,
                      softcap: float | None = None, is_causal: bool | None = None,
                      s_aux: Tensor | None = None, **kwargs: object) -> tuple[Tensor, None]:
    """transformers' attention-function contract over attnscope's kernels.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer (``is_causal``; ``sinks`` when present).
    query : torch.Tensor, [B, Hq, Nq, d]
    key, value : torch.Tensor, [B, Hkv, Nk, d]
        The whole cache's keys and values for a decode step; fp16 or bf16, d a multiple of 8 up to 256.
    attention_mask : torch.Tensor or None
        None or the bool padding mask [B, kv_len] (`register` asks transformers for this form).
    dropout, scaling, sliding_window, softcap, is_causal, s_aux
        As the module passes them (``scaling`` defaults to 1/sqrt(d); ``is_causal`` to ``module.is_causal``).

    Returns
    -------
    out : torch.Tensor, [B, Nq, Hq, d], query's dtype (the value's head dim where it is narrower: MLA)
    None (no attention weights)

    A value narrower than the query and key (DeepSeek's MLA: query and key 192, value 128) is zero-padded to
    their head dim and the output cropped to its own, as transformers' flash-attention path does: the zero
    columns add nothing to P V.
    """
    dv = value.shape[-1] if isinstance(value, Tensor) and value.dim() == 4 else None
    if dv is not None and isinstance(query, Tensor) and query.dim() == 4 and dv < query.shape[-1]:
        value = torch.nn.functional.pad(value, [0, query.shape[-1] - dv])
        out, _ = attention_forward(module, query, key, value, attention_mask, dropout, scaling,
                                   sliding_window, softcap, is_causal, s_aux, **kwargs)
        return out[..., :dv], None
    _refuse(dropout, attention_mask, kwargs)
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    mods = _mods(module, query, sliding_window, softcap, s_aux, causal)
    if attention_mask is not None and _is_lengths(attention_mask):
        B, Nq = query.shape[0], query.shape[2]
        if attention_mask.shape[0] != B or Nq != 1:
            raise InputError(f"attention_mask: a cache-lengths mask is for one query per sequence, [B = {B}, "
                             f"1, 1, 1 or 2]; got {tuple(attention_mask.shape)} with Nq = {Nq}")
        lens, starts = _length_columns(attention_mask)
        return _decode(query, key, value, lens, scaling, mods, starts), None
    if attention_mask is not None and attention_mask.dim() == 4:
        return _key_masked_step(query, key, value, attention_mask, scaling, mods), None
    if attention_mask is not None:
        return _padded(query, key, value, attention_mask, causal, scaling, mods), None
    if causal and query.shape[2] == 1 and not _grad(query, key, value, mods):  # a decode step: split-KV
        return _decode(query, key, value, None, scaling, mods), None
    return flash_attention(query, key, value, causal, scaling, **mods).transpose(1, 2), None


def _grad(query, key, value, mods) -> bool:
    """Whether the attention needs a backward (grad mode on, an input requires grad): then the
    differentiable kernels (`flash_attention`, `flash_attention_varlen`) run a one-query step, not `_decode`,
    which has none."""
    return _requires_grad((query, key, value, mods.get("sinks")))


def _decode(query, key, value, lens, scaling, mods, starts=None) -> Tensor:
    """``flash_decode(query, key, value, lens, scale=scaling, cache_leftpad=starts, **mods)`` as
    [B, 1, Hq, d]. Eagerly, a layout `flash_decode` has planned (`api._cached`: the same key it makes)
    launches its plan directly, the output allocated as [B, 1, Hq, d] (the same memory as [B, Hq, 1, d]):
    the one-liner's launch and allocation, without its argument handling or a transpose."""
    if not torch.compiler.is_compiling():
        sinks = mods.get("sinks")
        tensors = (query, key, value, lens, None, None, None, sinks, starts)
        layouts = ((query.shape, query.stride(), query.dtype, query.device),
                   (key.shape, key.stride(), key.dtype, key.device),
                   (value.shape, value.stride(), value.dtype, value.device),
                   None if lens is None else (lens.shape, lens.stride(), lens.dtype, lens.device),
                   None, None, None,
                   None if sinks is None else (sinks.shape, sinks.stride(), sinks.dtype, sinks.device),
                   None if starts is None else (starts.shape, starts.stride(), starts.dtype, starts.device))
        # flash_decode's options: (num_splits, scale, return_lse, window, softcap)
        options = (None, scaling, False, mods.get("window"), mods.get("softcap", 0.0))
        _, grown, plan = _cached(tensors, layouts, options)
        if plan is not None:
            return plan._launch(tensors, None, None, grown, True)  # (out, lse_out, grown, heads_last)
    return flash_decode(query, key, value, lens, scale=scaling, cache_leftpad=starts, **mods).transpose(1, 2)


#: The spans of the last padding mask read back (a weak reference to its base tensor, its version counter,
#: the view's shape, strides and offset in it, device) and the spans: transformers passes one mask tensor to
#: every layer of a forward, so `_spans` reads back once per mask, not once per layer.
_SPANS = [lambda: None, None, None]


def _spans(mask: Tensor):
    """For the bool mask [B, n]: None if a row has padding between real tokens; else ``(starts, ends,
    tail)``: each row's run of real tokens [starts, ends) (int32 [B]; a row without one: [n, n)) and whether
    every run ends at the last column (left padding only). One host read per mask tensor, kept for it except
    when `_transient` (then every call)."""
    transient = _transient(mask.device)
    base = mask._base if mask._base is not None else mask
    # the view in the base as well: two slices of one mask may share a shape
    key = (base._version, tuple(mask.shape), mask.stride(), mask.storage_offset(), mask.device)
    ref, known, spans = _SPANS
    if not transient and ref() is base and known == key:
        return spans
    real = mask.to(dtype=torch.bool)
    n = real.shape[1]
    count = real.sum(1, dtype=torch.int32)
    cols = torch.arange(n, device=mask.device, dtype=torch.int32)
    starts = torch.where(real, cols, n).amin(1).to(torch.int32)  # n for a row without a real token
    ends = torch.where(real, cols + 1, 0).amax(1).to(torch.int32)
    ends = torch.where(count > 0, ends, n).to(torch.int32)
    holes, tail = torch.stack([(ends - starts != count).any(), (ends == n).all()]).tolist()  # the read
    spans = None if holes else (starts, ends, bool(tail))
    if not transient:
        _SPANS[:] = [weakref.ref(base), key, spans]
    return spans


def _has_holes(mask: Tensor) -> bool:
    """Whether a row of the bool mask [B, n] has padding between real tokens (`_spans`)."""
    return _spans(mask) is None


def _pack_order(mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For a bool mask [B, N] (True = a real token): ``cu`` int32 [B + 2] (row b's real tokens, then all
    the padding as one more sequence), ``dest`` int64 [B * N] (each token's packed row: the real tokens
    first, in order, then the padding) and its inverse ``src``. On the device, no host read."""
    flat = mask.reshape(-1)
    n = mask.sum(1, dtype=torch.int32)
    total = torch.full((1,), flat.numel(), dtype=torch.int32, device=mask.device)  # a fill, not a copy
    cu = torch.cat([n.new_zeros(1), n.cumsum(0, dtype=torch.int32), total])
    real = flat.cumsum(0) - 1  # rank among the real tokens, row-major
    dest = torch.where(flat, real, cu[-2] + (~flat).cumsum(0) - 1)  # a permutation of [0, B * N)
    src = torch.empty_like(dest)
    src[dest] = torch.arange(flat.numel(), device=mask.device)
    return cu, dest, src


def _padded(query, key, value, mask, causal, scaling, mods) -> Tensor:
    """Attend over the real tokens of a padding mask: permute into a packed batch (`_pack_order`),
    attend per sequence (varlen), permute back; or, for a `filled` mask, the dense kernels on a view."""
    B, Hq, Nq, d = query.shape
    Nk = key.shape[2]
    if mask.shape[0] != B or mask.shape[1] > Nk or mask.shape[1] < Nq:
        raise InputError(f"attention_mask: expected shape [B = {B}, Nq = {Nq} .. Nk = {Nk}], "
                         f"got {tuple(mask.shape)}")
    if _is_filled(mask):  # keys [0, n) of every row, queries the last Nq of them: a view, no gather
        n = mask.shape[1]
        if causal and Nq == 1 and not _grad(query, key, value, mods):
            return _decode(query, key, value, _filled_lens(mask, query.device), scaling, mods)
        return flash_attention(query, key[:, :, :n], value[:, :, :n], causal, scaling, **mods).transpose(1, 2)
    if causal and Nq == 1 and not _transient(query.device) and not _grad(query, key, value, mods):
        # a decode step: left padding in place
        spans = _spans(mask)
        if spans is not None and spans[2]:  # each row's real keys [start, n): no gather
            return _decode(query, key, value, spans[1], scaling, mods, spans[0])
    if "window" in mods and _has_holes(mask):  # packing closes holes: the window would count across them
        raise NotImplementedError("attention_mask: a sliding window over a padding mask with holes "
                                  "(padding between real tokens) is not supported; supported: left or right "
                                  "padding")
    q_mask, cu_q, dest_q, (q_rows, q_cols), cu_k, (k_rows, k_cols) = _packing(mask, Nq, Nk, query.device)
    # the valid queries of a row are its last valid keys, so bottom-right causal per sequence is exact
    q = query[q_rows, :, q_cols]  # [B * Nq, Hq, d], packed order
    k = key[k_rows, :, k_cols]  # [B * Nk, Hkv, d]
    v = value[k_rows, :, k_cols]
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, B * Nq, B * Nk, causal, scaling, **mods)
    out = o[dest_q].view(B, Nq, Hq, d)  # padded query rows attended the padding sequence: zeroed
    return torch.where(q_mask[:, :, None, None], out, out.new_zeros(()))


def _key_masked_step(query, key, value, mask, scaling, mods) -> Tensor:
    """One query per sequence attending to the keys a 4-D bool mask [B, 1, 1, Nk] marks (a padded batch's
    decode step over a static cache: `padding_mask`): each row's marked keys packed in order on the device
    (`_pack_order`: the unmarked ones as one more sequence), its query their last position (it sees them
    all; a sliding window counts back over the marked keys, so a row whose marked keys have holes is
    refused), `flash_attention_varlen`; a row with no marked key gives 0. No host read but the holes check
    with a window."""
    B, Hq, Nq, d = query.shape
    Nk = key.shape[2]
    if Nq != 1 or tuple(mask.shape) != (B, 1, 1, Nk):
        raise InputError(f"attention_mask: a 4-D mask is for one query per sequence, [B = {B}, 1, 1, Nk = "
                         f"{Nk}]; got {tuple(mask.shape)} with Nq = {Nq}")
    keys = mask.view(B, Nk)
    if not (_transient(query.device) or _grad(query, key, value, mods)):  # rows of one run attend in place
        spans = _spans(keys)
        if spans is not None:
            return _decode(query, key, value, spans[1], scaling, mods, spans[0])
    if "window" in mods and _has_holes(keys):
        raise NotImplementedError("attention_mask: a sliding window over a padding mask with holes "
                                  "(padding between real tokens) is not supported; supported: left or right "
                                  "padding")
    cu_q, cu_k, (rows, cols) = _key_packing(keys, query.device)
    o = flash_attention_varlen(query[:, :, 0], key[rows, :, cols], value[rows, :, cols], cu_q, cu_k, 1,
                               B * Nk, True, scaling, **mods)
    return o.view(B, 1, Hq, d)


#: The packing of the last 4-D key mask (a weak reference to its [B, Nk] view's base, its version counter,
#: the view's shape, strides and offset in it, device) and the packing: transformers passes one mask to every
#: layer, so once per step, not per layer.
_KEY_PACKING = [lambda: None, None, None]


def _transient(device) -> bool:
    """Whether what this call computes must not be kept for later calls: while compiling (traced, not run)
    or capturing a CUDA graph (it runs only on replay)."""
    return torch.compiler.is_compiling() or (torch.device(device).type == "cuda"
                                             and torch.cuda.is_current_stream_capturing())


def _key_packing(keys: Tensor, device):
    """``cu_q`` (row b: query b), ``cu_k`` and the (row, position) gather indices of the keys a [B, Nk] key
    mask marks (`_pack_order`); kept for the mask tensor, except when `_transient`."""
    compiling = _transient(device)
    base = keys._base if keys._base is not None else keys  # the 4-D mask the caller holds
    # the view in the base as well: two slices of one mask may share a shape
    key = None if compiling else (base._version, tuple(keys.shape), keys.stride(), keys.storage_offset(),
                                  device)
    if not compiling and _KEY_PACKING[0]() is base and _KEY_PACKING[1] == key:
        return _KEY_PACKING[2]
    B, Nk = keys.shape
    cu_k, _, src_k = _pack_order(keys.to(device=device))
    cu_q = torch.arange(B + 2, dtype=torch.int32, device=device).clamp_(max=B)
    packing = (cu_q, cu_k, (src_k // Nk, src_k % Nk))
    if not compiling:
        _KEY_PACKING[:] = [weakref.ref(base), key, packing]
    return packing


#: The cache lengths of the last `filled` mask (a weak reference to it, its shape and device) and the lengths:
#: transformers passes one mask tensor to every layer, so a static cache's decode step fills them once per
#: forward, not once per layer.
_FILLED_LENS = [(lambda: None, None, None)]


def _filled_lens(mask: Tensor, device) -> Tensor:
    """int32 [B] of n for a `filled` mask [B, n] (keys [0, n) of every row): one fill per mask tensor, kept
    and reused except when `_transient` (a CUDA graph captured on a kept tensor would read freed memory once
    the entry is replaced)."""
    B, n = mask.shape
    if _transient(device):
        return torch.full((B,), n, dtype=torch.int32, device=device)
    ref, key, lens = _FILLED_LENS[0]  # one read of the entry: another thread replaces it whole
    if ref() is mask and key == (B, n, device):
        return lens
    lens = torch.full((B,), n, dtype=torch.int32, device=device)
    _FILLED_LENS[0] = (weakref.ref(mask), (B, n, device), lens)
    return lens


#: The packing of the last padding mask (a weak reference to it, its version counter, Nq, Nk, device) and
#: the packing: transformers passes one mask tensor to every layer of a forward, so `_packing` computes it
#: once per forward, not once per layer (about 30 small kernels).
_PACKING = [lambda: None, None, None]


def _packing(mask: Tensor, Nq: int, Nk: int, device):
    """For a padding mask [B, n] (n <= Nk): the query mask [B, Nq] (its last Nq columns), ``cu_q``, ``dest_q``
    and the (row, position) gather indices of the packed queries, ``cu_k`` and those of the packed keys
    (the slots past n are padding); see `_pack_order`. On the device, no host read; kept for the mask tensor,
    except when `_transient`."""
    compiling = _transient(device)
    key = None if compiling else (mask._version, Nq, Nk, device)
    if not compiling and _PACKING[0]() is mask and _PACKING[1] == key:
        return _PACKING[2]
    bool_mask = mask.to(device=device, dtype=torch.bool)
    q_mask = bool_mask[:, -Nq:]
    k_mask = torch.nn.functional.pad(bool_mask, (0, Nk - mask.shape[1]), value=False)  # unfilled: padding
    cu_q, dest_q, src_q = _pack_order(q_mask)
    cu_k, _, src_k = _pack_order(k_mask)
    packing = (q_mask, cu_q, dest_q, (src_q // Nq, src_q % Nq), cu_k, (src_k // Nk, src_k % Nk))
    if not compiling:
        _PACKING[:] = [weakref.ref(mask), key, packing]
    return packing
