"""attnscope as a Hugging Face transformers attention backend: ``attn_implementation="attnscope"``.

``register()`` adds `attention_forward` to transformers' ``AttentionInterface`` and, under the same name,
`padding_mask` (flash-attn's mask form) to ``AttentionMaskInterface``: the attention function receives
either no mask (every key of every sequence is visible, up to causality) or the 2-D padding mask
[B, <= kv_len] (True = a real token; keys beyond its length, a static cache's unfilled slots, are padding).
Then:

- no mask, one new token per sequence of a causal model (a decode step against the full cache K/V
  transformers passes): `attnscope.flash_decode`;
- no mask otherwise (prefill, chunked prefill, non-causal): `attnscope.flash_attention`, bottom-right causal;
- a mask without padding (a static cache): the same kernels on the filled keys (a view; `flash_decode`
  with ``cache_seqlens``);
- a padding mask: the real tokens are gathered into a packed batch (cu_seqlens) and run through
  `attnscope.flash_attention_varlen`, then scattered back (padded query rows give 0). The queries are the
  last ``Nq`` mask columns. One host sync per call reads the packed lengths.

The module's ``scaling``, ``sliding_window`` (transformers' window of W keys is ``window=(W - 1, 0)``),
``softcap`` and sinks (``s_aux``, or the module's ``sinks`` parameter, as gpt-oss) go to the kernels'
``scale=``, ``window=``, ``softcap=`` and ``sinks=`` keywords. Dropout during training, attention weights
(``output_attentions``), 4-D custom masks, packed sequences given by ``position_ids`` alone, and a sliding
window over a padding mask with holes raise NotImplementedError; nothing is ignored.

transformers is an optional extra: ``pip install 'attnscope[transformers]'``.
"""

from __future__ import annotations

from attnscope.errors import InputError
from attnscope.kernels._common import import_torch_triton

torch, _ = import_torch_triton()
try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"attnscope.integrations.transformers needs transformers: "
                      f"pip install 'attnscope[transformers]' ({e})") from e

from attnscope.kernels.decode import flash_decode  # noqa: E402
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


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                 attention_mask: Tensor | None = None, device=None, **kwargs) -> Tensor | None:
    """The mask transformers builds for attnscope: flash-attn's form (None, or the 2-D padding mask
    [B, <= kv_length], True = a real token), and where transformers drops the mask but the cache holds
    unfilled slots (a static cache), a mask of ones over the filled positions: keys beyond a mask's
    length are padding."""
    mask = flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                                attention_mask=attention_mask, device=device, **kwargs)
    if mask is None:
        filled = int(q_offset) + q_length - int(kv_offset)  # positions written once this step's keys are in
        if filled < kv_length:
            mask = torch.ones(batch_size, filled, dtype=torch.bool, device=device)
    return mask


def _mods(module, query, sliding_window, softcap, s_aux, causal) -> dict:
    """The module's score mods as the kernels' keywords (only those that are on)."""
    mods = {}
    if sliding_window is not None:  # transformers: key j visible to query i iff i - W < j <= i
        if not (isinstance(sliding_window, int) and sliding_window >= 1):
            raise InputError(f"sliding_window: expected a positive int or None, got {sliding_window!r}")
        mods["window"] = (sliding_window - 1, 0 if causal else sliding_window - 1)
    if softcap:
        mods["softcap"] = float(softcap)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    if sinks is not None:
        mods["sinks"] = sinks.to(device=query.device, dtype=torch.float32).reshape(-1)  # differentiable
    return mods


def _refuse(dropout, attention_mask, kwargs, query) -> None:
    if dropout:
        raise NotImplementedError(f"dropout: attention dropout is not supported by attnscope (supported: "
                                  f"0.0, i.e. model.eval()), got {dropout}")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("output_attentions: attnscope never materialises the attention weights "
                                  "(supported: output_attentions=False)")
    mask = attention_mask
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 2):
        got = tuple(mask.shape) if hasattr(mask, "shape") else type(mask).__name__
        raise NotImplementedError(f"attention_mask: supported: None or a 2-D padding mask [B, kv_len] "
                                  f"(transformers' flash-attention mask form), got {got}")
    pos = kwargs.get("position_ids")
    if (mask is None and isinstance(pos, torch.Tensor) and query.shape[0] == 1 and query.shape[2] > 1
            and pos.dim() == 2 and bool((pos.diff(dim=-1) != 1).any())):
        raise NotImplementedError("position_ids: packed sequences (positions restarting inside one row) are "
                                  "not supported; pass a padded batch with an attention_mask instead")


def attention_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, sliding_window: int | None = None,
                      softcap: float | None = None, is_causal: bool | None = None,
                      s_aux: Tensor | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention-function contract over attnscope's kernels.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer (``is_causal``; ``sinks`` when present).
    query : torch.Tensor, [B, Hq, Nq, d]
    key, value : torch.Tensor, [B, Hkv, Nk, d]
        The whole cache's keys and values for a decode step; fp16 or bf16, d in {64, 128}.
    attention_mask : torch.Tensor or None
        None or the bool padding mask [B, kv_len] (`register` asks transformers for this form).
    dropout, scaling, sliding_window, softcap, is_causal, s_aux
        As the module passes them (``scaling`` defaults to 1/sqrt(d); ``is_causal`` to ``module.is_causal``).

    Returns
    -------
    out : torch.Tensor, [B, Nq, Hq, d], query's dtype
    None (no attention weights)
    """
    _refuse(dropout, attention_mask, kwargs, query)
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    mods = _mods(module, query, sliding_window, softcap, s_aux, causal)
    if attention_mask is not None:
        return _padded(query, key, value, attention_mask, causal, scaling, mods), None
    if causal and query.shape[2] == 1:  # a decode step: split-KV over the whole cache
        o = flash_decode(query, key, value, scale=scaling, **mods)
    else:
        o = flash_attention(query, key, value, causal, scaling, **mods)
    return o.transpose(1, 2), None


def _padded(query, key, value, mask, causal, scaling, mods) -> Tensor:
    """Gather the real tokens into a packed batch, attend per sequence (varlen), scatter back."""
    B, Hq, Nq, d = query.shape
    Nk = key.shape[2]
    if mask.shape[0] != B or mask.shape[1] > Nk or mask.shape[1] < Nq:
        raise InputError(f"attention_mask: expected shape [B = {B}, Nq = {Nq} .. Nk = {Nk}], "
                         f"got {tuple(mask.shape)}")
    mask = mask.to(device=query.device, dtype=torch.bool)
    q_mask = mask[:, -Nq:]  # the queries are the last Nq positions the mask covers
    k_mask = torch.nn.functional.pad(mask, (0, Nk - mask.shape[1]), value=False)  # unfilled slots: padding
    n_q, n_k = q_mask.sum(1, dtype=torch.int32), k_mask.sum(1, dtype=torch.int32)
    cols = torch.arange(Nk, device=mask.device)
    first = torch.where(k_mask, cols, Nk).amin(1)
    last = torch.where(k_mask, cols, -1).amax(1)
    holes = ((last - first + 1 != n_k) & (n_k > 0)).any()  # padding between real tokens in some row
    full = (n_k == mask.shape[1]).all() & (n_q == Nq).all()  # no padding: only unfilled slots after the mask
    max_q, max_k, holes, full = torch.stack([n_q.max(), n_k.max(), holes, full]).tolist()  # the one host sync
    if full:  # keys [0, n) of every row, queries the last Nq of them: a view, no gather
        n = mask.shape[1]
        if causal and Nq == 1:
            lens = torch.full((B,), n, dtype=torch.int32, device=query.device)
            o = flash_decode(query, key, value, lens, scale=scaling, **mods)
        else:
            o = flash_attention(query, key[:, :, :n], value[:, :, :n], causal, scaling, **mods)
        return o.transpose(1, 2)
    if holes and "window" in mods:
        raise NotImplementedError("attention_mask: a sliding window over a padding mask with holes (padding "
                                  "between real tokens) is not supported; supported: left or right padding")
    # the valid queries of a row are its last valid keys, so bottom-right causal per sequence is exact
    cu_q = torch.nn.functional.pad(n_q.cumsum(0, dtype=torch.int32), (1, 0))
    cu_k = torch.nn.functional.pad(n_k.cumsum(0, dtype=torch.int32), (1, 0))
    q_idx, k_idx = q_mask.flatten().nonzero().squeeze(1), k_mask.flatten().nonzero().squeeze(1)
    q = query.transpose(1, 2).reshape(B * Nq, Hq, d)[q_idx]  # [total_q, Hq, d]
    k = key.transpose(1, 2).reshape(B * Nk, -1, d)[k_idx]  # [total_k, Hkv, d]
    v = value.transpose(1, 2).reshape(B * Nk, -1, d)[k_idx]
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, max(max_q, 1), max(max_k, 1), causal, scaling, **mods)
    out = o.new_zeros(B * Nq, Hq, d)
    out[q_idx] = o
    return out.view(B, Nq, Hq, d)
