"""attnscope as a transformers attention backend (CPU: TRITON_INTERPRET=1; no download: ``from_config``).

Random-initialised tiny Llama, Mistral (sliding window), gpt-oss (sinks, alternating sliding/full layers)
and Gemma 2 (head dim 256, logit softcap, alternating layers) models, each built three times from copies of
one config and one set of weights: float64 with the reference implementation ("sdpa"; "eager" for gpt-oss,
which has no sdpa path, and for Gemma 2, whose softcap sdpa lacks), and bf16 with the reference and with
"attnscope". Bound (the kernel rule, `attnscope.checks.kernel_tolerance`, at the model's output):
attnscope's bf16 logits differ from the float64 model's by at most 2 x the reference implementation's own
bf16 error + 1e-3, over the real (non-padding) positions, on an unpadded and a left-padded batch; and
greedy generation of 8 tokens gives the reference implementation's tokens (up to a tie at bf16
precision, see `test_greedy_generate_same_tokens`). Logits are O(1) here
(initializer_range 0.2), so a wrong attention shows as an error of O(1), far above the bound.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernel_env import kernel_device  # noqa: E402

transformers = pytest.importorskip("transformers")

from attnscope import checks  # noqa: E402
from attnscope.errors import InputError  # noqa: E402

hf = pytest.importorskip("attnscope.integrations.transformers")

DEVICE = kernel_device()
NAME = hf.register()
SEQ, NEW = 12, 8
COMMON = dict(vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=64,
              initializer_range=0.2,
              pad_token_id=0, eos_token_id=None, bos_token_id=None)


def _sinks(model):
    for m in model.modules():
        if hasattr(m, "sinks"):  # gpt-oss: one learned logit per head; make it matter
            with torch.no_grad():
                m.sinks.copy_(1.5 * torch.randn(m.sinks.shape, dtype=m.sinks.dtype))


CONFIGS = {
    "llama": (lambda: transformers.LlamaConfig(**COMMON), "sdpa", None, {}),
    "mistral": (lambda: transformers.MistralConfig(sliding_window=5, **COMMON), "sdpa", None, {}),
    # Phi-3's head dim (96): the portable kernels in 128-wide tiles (`_common.head_block`)
    "llama_d96": (lambda: transformers.LlamaConfig(**{**COMMON, "head_dim": 96, "hidden_size": 192}), "sdpa",
                  None, {}),
    "gpt_oss": (lambda: transformers.GptOssConfig(
        sliding_window=5, num_local_experts=2, num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"], **{**COMMON, "num_hidden_layers": 2}),
        "eager", _sinks, {"experts_implementation": "eager"}),  # grouped_mm has no float64
    # DeepSeek-V3's MLA: query and key 24 wide (16 + 8 rotary), value 16 (zero-padded to 24, output cropped)
    "deepseek_v3": (lambda: transformers.DeepseekV3Config(
        moe_intermediate_size=32, n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, **{**{k: v for k, v in COMMON.items() if k != "head_dim"}, "num_hidden_layers": 2,
                          "num_key_value_heads": 2}), "sdpa", None,
        {"experts_implementation": "eager"}),
    # Gemma 2: head dim 256, logit softcap, query_pre_attn_scalar's scale, alternating sliding/full layers
    # ("sdpa" has no softcap: the eager implementation is the reference)
    "gemma2": (lambda: transformers.Gemma2Config(
        sliding_window=5, attn_logit_softcapping=20.0, query_pre_attn_scalar=144,
        layer_types=["sliding_attention", "full_attention"],
        **{**COMMON, "num_hidden_layers": 2, "head_dim": 256}), "eager", None, {}),
}


#: models whose reference cannot run a left-padded batch (`test_prefill_logits_match_reference`)
UNPADDED_REFERENCE = {"gemma2"}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request):
    make, ref_impl, tweak, options = CONFIGS[request.param]
    cfg = make()
    torch.manual_seed(0)
    # from_config writes the implementation into the config it is given: each model gets its own copy
    m64 = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=ref_impl,
                                                        dtype=torch.float64, **options)
    if tweak:
        tweak(m64)
    out = [m64.eval().to(DEVICE)]
    for impl in (ref_impl, NAME):
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl,
                                                          dtype=torch.bfloat16, **options)
        m.load_state_dict(m64.state_dict())
        out.append(m.eval().to(DEVICE))
    assert [m.config._attn_implementation for m in out] == [ref_impl, ref_impl, NAME]
    return request.param, out


@pytest.fixture
def calls(monkeypatch):
    """Which attnscope kernels the backend called (so a test knows attnscope ran, and which path); a decode
    step is `hf._decode` (`flash_decode`, or its planned launch)."""
    seen = []
    spied = {"flash_attention": "flash_attention", "flash_attention_varlen": "flash_attention_varlen",
             "_decode": "flash_decode"}
    for attr, name in spied.items():
        real = getattr(hf, attr)
        monkeypatch.setattr(hf, attr, lambda *a, _n=name, _f=real, **kw: seen.append(_n) or _f(*a, **kw))
    return seen


def _batch(padded: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, COMMON["vocab_size"], (2, SEQ), generator=g).to(DEVICE)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :4] = 0  # left padding: sequence 0 has SEQ - 4 real tokens
        ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


@pytest.mark.parametrize("padded", [False, True])
def test_prefill_logits_match_reference(models, padded, calls):
    name, (m64, ref, ours) = models
    ids, mask = _batch(padded)
    with torch.no_grad():
        l64, l_ref, l_ours = (m(ids, attention_mask=mask).logits.double() for m in (m64, ref, ours))
        if name in UNPADDED_REFERENCE and padded:
            # the reference's padded batch is NaN from its second layer on (an all-masked pad row's NaN
            # reaches every row through P V): each row's real tokens alone instead (RoPE is relative, so
            # the left shift changes no score)
            for m, out in ((m64, l64), (ref, l_ref)):
                for row in range(ids.shape[0]):
                    keep = mask[row].bool()
                    out[row, keep] = m(ids[row:row + 1, keep]).logits.double()[0]
    real = mask.bool()
    ref_err = (l_ref - l64)[real].abs().max().item()
    err = (l_ours - l64)[real].abs().max().item()
    tol = checks.kernel_tolerance(ref_err)
    assert err <= tol, f"attnscope logits error {err:.3g} > {tol:.3g} (reference bf16: {ref_err:.3g})"
    kernel = "flash_attention_varlen" if padded else "flash_attention"
    assert calls == [kernel] * ours.config.num_hidden_layers


#: (padded, cache) each model generates with: the decode paths (flash_decode unpadded, varlen padded) and a
#: static cache (transformers passes all its slots; the mask says which are filled)
GENERATE = {"llama": ((False, "dynamic"), (True, "dynamic"), (False, "static"), (True, "static")),
            "mistral": ((True, "dynamic"), (False, "static"), (True, "static")),
            "llama_d96": ((False, "dynamic"), (True, "dynamic")),
            "deepseek_v3": ((False, "dynamic"), (True, "dynamic"), (False, "static")),
            "gpt_oss": ((False, "dynamic"), (False, "static"), (True, "static")),
            "gemma2": ((False, "dynamic"), (False, "static"))}  # padded: its eager reference gives NaN


def _assert_same_tokens(m64, ref, ours, padded, cache, before_ours=lambda: None):
    """``ours.generate`` gives the greedy tokens of ``ref.generate`` (8 new, a batch of 2), up to a tie at
    bf16 precision (`test_greedy_generate_same_tokens`); ``before_ours`` runs between the two generations."""
    ids, mask = _batch(padded)
    kw = dict(attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
              cache_implementation=cache)
    with torch.no_grad():
        real = mask.bool()
        tol = checks.kernel_tolerance((ref(ids, attention_mask=mask).logits.double()
                                       - m64(ids, attention_mask=mask).logits)[real].abs().max().item())
        want = ref.generate(ids, output_logits=True, return_dict_in_generate=True, **kw)
        before_ours()
        got = ours.generate(ids, **kw)[:, SEQ:]
    assert got.shape == (2, NEW)
    for row in range(2):
        differ = (got[row] != want.sequences[row, SEQ:]).nonzero()
        if len(differ):
            t = int(differ[0])
            a, b = int(want.sequences[row, SEQ + t]), int(got[row, t])
            gap = (want.logits[t][row, a] - want.logits[t][row, b]).item()
            assert gap <= tol, (f"padded={padded}, {cache} cache, row {row}, token {t}: attnscope chose "
                                f"{b}, the reference {a} by a logit margin {gap:.3g} > {tol:.3g}: "
                                f"{got.tolist()} vs {want.sequences[:, SEQ:].tolist()}")


def test_greedy_generate_same_tokens(models, calls):
    """Greedy tokens equal the reference implementation's. The one exception is a tie at bf16 precision: at
    the first step where a row differs, the reference's own logits of the two tokens must lie within the
    logit tolerance of the prefill test (there, 2 x the reference's bf16 logit error + 1e-3); a wrong
    attention diverges at a step with a clear winner."""
    name, (m64, ref, ours) = models
    for padded, cache in GENERATE[name]:
        _assert_same_tokens(m64, ref, ours, padded, cache, calls.clear)
        layers = ours.config.num_hidden_layers
        assert len(calls) == NEW * layers  # every layer of the prefill and of each decode step
        prefill = ["flash_attention_varlen" if padded else "flash_attention"] * layers
        if cache == "static" and len(set(getattr(ours.config, "layer_types", None) or ())) > 1:
            # layers of two kinds: transformers builds a dict of masks once per step and makes each
            # contiguous, which turns a full layer's `filled` mask into an all-ones padding mask (the packed
            # path: the same keys); a decode step's `lengths` is contiguous already
            prefill = [c if c == "flash_attention_varlen" else p
                       for c, p in zip(calls[:layers], prefill, strict=True)]
        assert calls[:layers] == prefill
        # a decode step: split-KV decode over the whole cache (left padding: from each row's first key)
        assert calls[layers:] == ["flash_decode"] * (NEW - 1) * layers


@pytest.mark.gpu
def test_gpu_compiled_static_cache_generate_same_tokens(models):
    """On CUDA transformers compiles a static cache's decode step (torch.compile, CUDA graphs): the compiled
    step gives the reference's tokens (unpadded and left-padded), for each model kind (full attention, sliding
    window, sinks with layers of two kinds)."""
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA GPU")
    name, (m64, ref, ours) = models
    for padded in (False, True):
        _assert_same_tokens(m64, ref, ours, padded, "static")
    assert getattr(ours, "_compiled_call", None) is not None  # the decode steps ran compiled


# --- the attention function called directly --------------------------------------------------------
class _Attn(torch.nn.Module):
    is_causal = True


def _qkv(b, hq, hkv, nq, nk, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, 64, generator=g).to(torch.bfloat16).to(DEVICE)
            for h, n in ((hq, nq), (hkv, nk), (hkv, nk))]


def test_module_sinks_without_s_aux():
    """A module's own ``sinks`` (a model that does not pass ``s_aux``) is used on every call, decode and
    prefill, as if passed as ``s_aux``; a module without one attends without sinks."""
    class WithSinks(_Attn):
        def __init__(self, sinks):
            super().__init__()
            self.sinks = torch.nn.Parameter(sinks)

    sinks = (3.0 * torch.randn(4, generator=torch.Generator().manual_seed(5))).to(torch.bfloat16).to(DEVICE)
    with_sinks, without = WithSinks(sinks), _Attn()
    for nq in (1, 6):
        q, k, v = _qkv(2, 4, 2, nq, 10)
        with torch.no_grad():
            want = hf.attention_forward(without, q, k, v, None, s_aux=sinks)[0]
            plain = hf.attention_forward(without, q, k, v, None)[0]
            for _ in range(2):  # the first call and a cached one
                assert torch.equal(hf.attention_forward(with_sinks, q, k, v, None)[0], want)
                assert torch.equal(hf.attention_forward(without, q, k, v, None)[0], plain)
        assert not torch.equal(want, plain)


def test_key_mask_decode_step_is_exact():
    """A 4-D bool mask [B, 1, 1, Nk] for one query per sequence (a padded batch's static-cache decode step):
    each row's query attends to the keys it marks, whatever they are (left padding, unfilled slots, holes),
    as SDPA with that mask; a row marking none gives 0. With a window: exact without holes (the window counts
    back from the query, the last marked key), refused with them; a mask for more queries is refused."""
    q, k, v = _qkv(3, 4, 2, 1, 10)
    keys = torch.zeros(3, 10, dtype=torch.bool, device=DEVICE)
    keys[0, 3:8] = True  # left padding 3, 2 slots unfilled
    keys[1, [0, 2, 3, 5]] = True  # holes
    keys[2, :10] = True
    kr, vr = (t.repeat_interleave(2, 1).double() for t in (k, v))

    def want(allowed, like):
        o64 = torch.nn.functional.scaled_dot_product_attention(q.double(), kr, vr, allowed[:, None, None, :],
                                                               scale=0.2).transpose(1, 2)
        o16 = torch.nn.functional.scaled_dot_product_attention(q, *(t.to(q.dtype) for t in (kr, vr)),
                                                               allowed[:, None, None, :], scale=0.2)
        err = (like.double() - o64).abs().max().item()
        assert err <= checks.kernel_tolerance((o16.transpose(1, 2).double() - o64).abs().max().item())

    o, _ = hf.attention_forward(_Attn(), q, k, v, keys[:, None, None, :], scaling=0.2)
    assert o.shape == (3, 1, 4, 64)
    want(keys, o)
    none = keys.clone()
    none[1] = False
    o, _ = hf.attention_forward(_Attn(), q, k, v, none[:, None, None, :], scaling=0.2)
    assert not o[1].any()
    no_holes = keys[[0, 2, 0]]
    o, _ = hf.attention_forward(_Attn(), q, k, v, no_holes[:, None, None, :], scaling=0.2, sliding_window=3)
    last = torch.tensor([7, 9, 7], device=DEVICE)[:, None]  # each query's position: its last marked key
    pos = torch.arange(10, device=DEVICE)[None]
    want(no_holes & (pos > last - 3), o)
    with pytest.raises(NotImplementedError, match="sliding window over a padding mask with holes"):
        hf.attention_forward(_Attn(), q, k, v, keys[:, None, None, :], sliding_window=3)
    q2, _, _ = _qkv(3, 4, 2, 2, 10)
    with pytest.raises(InputError, match="a 4-D mask is for one query per sequence"):
        hf.attention_forward(_Attn(), q2, k, v, keys[:, None, None, :])


def test_key_mask_is_packed_once_per_mask(monkeypatch):
    """transformers passes one mask to every layer: a key mask with holes is packed once for all of them (and
    again for a new mask, or the same one changed in place)."""
    packed = []
    real = hf._pack_order
    monkeypatch.setattr(hf, "_pack_order", lambda m: packed.append(1) or real(m))
    q, k, v = _qkv(2, 4, 2, 1, 10)
    keys = torch.ones(2, 1, 1, 10, dtype=torch.bool, device=DEVICE)
    keys[0, ..., [1, 4]] = False  # holes
    outs = [hf.attention_forward(_Attn(), q, k, v, keys)[0] for _ in range(3)]
    assert len(packed) == 1 and all(torch.equal(o, outs[0]) for o in outs)
    keys[1, ..., 9] = False  # in place: packed again, and seen
    o = hf.attention_forward(_Attn(), q, k, v, keys)[0]
    assert len(packed) == 2 and not torch.equal(o[1], outs[0][1]) and torch.equal(o[0], outs[0][0])


@pytest.mark.parametrize("four_d", [False, True])
def test_left_padded_decode_step_attends_in_place(monkeypatch, four_d):
    """A decode step whose mask rows each hold one run of real keys (left padding; the 4-D key mask also
    unfilled slots after it) runs `flash_decode` with ``cache_leftpad`` on the cache as it is: no packing,
    the mask read back once for every layer, the bits of the packed path's attention within tolerance."""
    q, k, v = _qkv(3, 4, 2, 1, 10)
    mask = torch.ones(3, 10, dtype=torch.bool, device=DEVICE)
    mask[0, :4] = False
    mask[1, :9] = False
    if four_d:
        mask[:, 8:] = False  # two slots not yet filled
        mask[1, 7] = True
    form = mask[:, None, None, :] if four_d else mask
    kept, packs = [], []
    real_spans, real_pack = hf._spans, hf._pack_order
    monkeypatch.setattr(hf, "_pack_order", lambda m: packs.append(1) or real_pack(m))
    outs = []
    for _ in range(3):  # three layers share the mask
        outs.append(hf.attention_forward(_Attn(), q, k, v, form, scaling=0.2)[0])
        kept.append(hf._SPANS[2])
    assert not packs and all(torch.equal(o, outs[0]) for o in outs)
    assert kept[0] is not None and all(x is kept[0] for x in kept)  # read back once, kept for the mask
    monkeypatch.setattr(hf, "_spans", lambda m: None)  # the packed path, for reference
    want = hf.attention_forward(_Attn(), q, k, v, form, scaling=0.2)[0]
    assert packs
    torch.testing.assert_close(outs[0].float(), want.float(), atol=2e-2, rtol=0)
    monkeypatch.setattr(hf, "_spans", real_spans)


@pytest.mark.parametrize("four_d", [False, True])
def test_two_slices_of_one_mask_are_two_masks(four_d):
    """The spans and the key packing kept for a mask are kept for its base tensor: two slices of one base
    of the same shape (the same version) are still two masks, each attended as if it came first (before,
    the second slice got the first one's spans or packing)."""
    q, k, v = _qkv(2, 4, 2, 1, 8, seed=3)
    base = torch.ones(2, 16, dtype=torch.bool, device=DEVICE)
    base[0, :3] = False  # left padding in the first slice, none in the second
    if four_d:
        base[1, 2] = False  # and a hole: the 4-D key mask's packed path
    halves = (base[:, :8], base[:, 8:])
    forms = [m[:, None, None, :] for m in halves] if four_d else halves

    def attend(mask):
        return hf.attention_forward(_Attn(), q, k, v, mask, scaling=0.2)[0]

    alone = []
    for mask in forms:
        for cache in (hf._SPANS, hf._KEY_PACKING, hf._PACKING):
            cache[:] = [lambda: None, None, None]
        alone.append(attend(mask))
    assert not torch.equal(alone[0], alone[1])
    assert all(torch.equal(attend(m), a) for m, a in zip(forms, alone, strict=True))


@pytest.mark.parametrize("holes", [False, True])
def test_compiled_padded_static_decode_step_compiles_once(holes):
    """A padded batch's static-cache decode step: `padding_mask` gives a fixed-shape form, `lengths` with
    the starts for left padding, else the key mask [B, 1, 1, kv_len] (the padding and the slots not yet
    filled unmarked), so the compiled step runs for each new length without a recompile, with the eager
    call's bits, which are the attention over the real keys."""
    q, k, v = _qkv(2, 4, 2, 1, 10)
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compiler.reset()
    f = torch.compile(lambda *a: hf.attention_forward(_Attn(), *a)[0], backend=count, fullgraph=True)
    for n in (6, 7, 9):
        pad = torch.ones(2, n, dtype=torch.bool, device=DEVICE)
        pad[1, :2] = False  # left padding
        if holes:
            pad[0, 3] = False
        mask = hf.padding_mask(2, 1, 10, n - 1, 0, attention_mask=pad, device=DEVICE)
        if holes:
            assert mask.shape == (2, 1, 1, 10) and torch.equal(mask[:, 0, 0, :n], pad)
            assert not mask[..., n:].any()
        else:
            assert mask.shape == (2, 1, 1, 2) and mask[:, 0, 0].tolist() == [[n, 0], [n, 2]]
        got = f(q, k, v, mask)
        assert torch.equal(got, hf.attention_forward(_Attn(), q, k, v, mask)[0])
        keys = torch.nn.functional.pad(pad, (0, 10 - n))[:, None, None, :]  # the same keys, packed
        torch.testing.assert_close(got.float(), hf.attention_forward(_Attn(), q, k, v, keys)[0].float(),
                                   atol=2e-2, rtol=0)
    assert len(graphs) == 1


def test_padding_mask_with_holes_is_exact():
    """Any 2-D padding mask (here: holes between real tokens) gives the masked causal attention."""
    q, k, v = _qkv(2, 4, 2, 6, 10)
    mask = torch.ones(2, 10, dtype=torch.bool, device=DEVICE)
    mask[0, [1, 2, 6]] = False
    mask[1, :3] = False
    o, weights = hf.attention_forward(_Attn(), q, k, v, mask, scaling=0.2)
    assert weights is None and o.shape == (2, 6, 4, 64)
    pos = torch.arange(10, device=DEVICE)
    allowed = mask[:, None, None, :] & (pos[None, None, None, :] <= pos[-6:, None][None, None])  # [B,1,Nq,Nk]
    rows = mask[:, -6:]  # real queries
    kr, vr = (t.repeat_interleave(2, 1) for t in (k, v))
    o64 = torch.nn.functional.scaled_dot_product_attention(q.double(), kr.double(), vr.double(), allowed,
                                                           scale=0.2).transpose(1, 2)
    o16 = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, allowed, scale=0.2).transpose(1, 2)
    err, own = ((x.double() - o64)[rows].abs().max().item() for x in (o, o16))
    assert err <= checks.kernel_tolerance(own)
    assert not o[~rows].any()  # padded query rows: 0


def test_refusals():
    q, k, v = _qkv(1, 2, 2, 4, 4)
    with pytest.raises(NotImplementedError, match="dropout"):
        hf.attention_forward(_Attn(), q, k, v, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="output_attentions"):
        hf.attention_forward(_Attn(), q, k, v, None, output_attentions=True)
    with pytest.raises(NotImplementedError, match="attention_mask: supported: None, a 2-D padding mask"):
        hf.attention_forward(_Attn(), q, k, v, torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="attention_mask: transformers asks for a mask beyond"):
        hf.padding_mask(1, 4, 4, attention_mask=None, device=DEVICE, allow_is_causal_skip=False)
    holes = torch.tensor([[True, False, True, True]], device=DEVICE)
    with pytest.raises(NotImplementedError, match="sliding window over a padding mask with holes"):
        hf.attention_forward(_Attn(), q, k, v, holes, sliding_window=2)
    with pytest.raises(InputError, match="attention_mask: expected shape"):
        hf.attention_forward(_Attn(), q, k, v, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(InputError, match="name"):
        hf.register("")
    for bad in (True, 0, 2.0, "4"):  # a bool is no window width
        with pytest.raises(InputError, match="sliding_window: expected a positive int or None"):
            hf.attention_forward(_Attn(), q, k, v, None, sliding_window=bad)


_HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")


def test_padded_path_reads_nothing_back(monkeypatch):
    """The padded path builds cu_seqlens and the packed order on the device: no tensor value reaches the
    host (every Tensor method that would read one raises), ``max_seqlen`` are the packed sizes (B * N, known
    from the shapes). The kernel is replaced by a recorder here; the tests above check the results."""
    q, k, v = _qkv(3, 4, 2, 5, 9)
    mask = torch.ones(3, 9, dtype=torch.bool, device=DEVICE)
    mask[0, :4] = False  # left padding
    mask[2, [2, 5]] = False  # holes
    seen = {}

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, **mods):
        seen.update(cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, q=q, k=k)
        return torch.zeros_like(q)

    monkeypatch.setattr(hf, "flash_attention_varlen", varlen)
    with monkeypatch.context() as m:
        for name in _HOST_READS:
            m.setattr(torch.Tensor, name, lambda *a, _n=name, **kw: pytest.fail(f"host read: Tensor.{_n}"))
        m.setattr(torch, "nonzero", lambda *a, **kw: pytest.fail("host read: torch.nonzero"))
        o, _ = hf.attention_forward(_Attn(), q, k, v, mask)
    assert o.shape == (3, 5, 4, 64) and (seen["max_q"], seen["max_k"]) == (15, 27)
    # each row's real tokens, then one sequence of all the padding (queries: the last 5 mask columns)
    assert seen["cu_q"].tolist() == [0, 5, 10, 14, 15] and seen["cu_k"].tolist() == [0, 5, 14, 21, 27]
    assert torch.equal(seen["q"][:14], q.transpose(1, 2)[mask[:, -5:]])  # packed in order
    assert torch.equal(seen["k"][:21], k.transpose(1, 2)[mask])


def test_static_cache_mask_is_filled_without_padding():
    """`padding_mask` gives a static cache's all-ones mask (shorter than the cache) in a form that
    `attention_forward` reads as "no padding": stride 0 (`filled`: the dense kernels on a view) for a chunk of
    queries, the lengths on the device (`lengths`) for a decode step; a chunk's mask with padding stays."""
    ones = torch.ones(2, 6, dtype=torch.bool, device=DEVICE)
    got = hf.padding_mask(2, 3, 10, 3, 0, attention_mask=ones, device=DEVICE)
    assert got.shape == (2, 6) and got.stride() == (0, 0) and bool(got.all())
    step = hf.padding_mask(2, 1, 10, 5, 0, attention_mask=ones, device=DEVICE)
    assert step.dtype == torch.int32 and step.shape == (2, 1, 1, 1) and step.flatten().tolist() == [6, 6]
    pad = ones.clone()
    pad[1, 0] = False
    assert torch.equal(hf.padding_mask(2, 3, 10, 3, 0, attention_mask=pad, device=DEVICE), pad)
    # a decode step: left padding as the lengths and starts (test_compiled_padded_static_decode_step_...)
    left = hf.padding_mask(2, 1, 10, 5, 0, attention_mask=pad, device=DEVICE)
    assert left.shape == (2, 1, 1, 2) and left[:, 0, 0].tolist() == [[6, 0], [6, 1]]
    # no mask given, the offset on the device (a static cache): no read for a decode step
    assert hf.padding_mask(2, 3, 10, torch.tensor(3), 0, device=DEVICE).stride() == (0, 0)
    assert hf.padding_mask(2, 1, 10, torch.tensor(5), 0, device=DEVICE).flatten().tolist() == [6, 6]
    assert hf.padding_mask(2, 1, 6, 5, 0, attention_mask=ones, device=DEVICE) is None  # every slot filled
    q, k, v = _qkv(2, 4, 2, 3, 10)
    o, _ = hf.attention_forward(_Attn(), q, k, v, got)
    o_ref, _ = hf.attention_forward(_Attn(), q, k[:, :, :6], v[:, :, :6], None)
    assert torch.equal(o, o_ref)
    o, _ = hf.attention_forward(_Attn(), q[:, :, :1], k, v, step)
    o_ref, _ = hf.attention_forward(_Attn(), q[:, :, :1], k[:, :, :6], v[:, :, :6], None)
    assert torch.equal(o, o_ref)


def test_lengths_mask_is_per_row_and_refused_off_a_decode_step():
    """A `lengths` mask attends row b over keys [0, lens[b]) (each row as its own dense call); with more than
    one query, or another batch size, it is refused in one line."""
    q, k, v = _qkv(2, 4, 2, 1, 10)
    o, _ = hf.attention_forward(_Attn(), q, k, v, hf.lengths(torch.tensor([4, 9], device=DEVICE)))
    for b, n in enumerate((4, 9)):
        want, _ = hf.attention_forward(_Attn(), q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], None)
        torch.testing.assert_close(o[b:b + 1], want, atol=0, rtol=0)
    with pytest.raises(InputError, match="attention_mask: a cache-lengths mask"):
        hf.attention_forward(_Attn(), q, k, v, hf.lengths(torch.tensor([4], device=DEVICE)))
    q3, _, _ = _qkv(2, 4, 2, 3, 10)
    with pytest.raises(InputError, match="Nq = 3"):
        hf.attention_forward(_Attn(), q3, k, v, hf.lengths(torch.tensor([4, 9], device=DEVICE)))


def test_compiled_static_decode_step_compiles_once_as_the_cache_fills():
    """A static cache's decode step under torch.compile: the mask (`padding_mask` with the offset on the
    device, as transformers' static layer gives it) and the attention trace into one graph, without a
    graph break, and the next steps (one key more each) run it again: no recompile, the eager bits."""
    q, k, v = _qkv(2, 4, 2, 1, 10)
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(q, k, v, offset):
        mask = hf.padding_mask(2, 1, 10, offset, 0, device=DEVICE)
        return hf.attention_forward(_Attn(), q, k, v, mask)[0]

    torch.compiler.reset()
    f = torch.compile(step, backend=count, fullgraph=True, dynamic=False)
    for n in (5, 6, 7, 9):
        offset = torch.tensor(n - 1)
        assert torch.equal(f(q, k, v, offset), step(q, k, v, offset))
        want, _ = hf.attention_forward(_Attn(), q, k[:, :, :n], v[:, :, :n], None)
        assert torch.equal(f(q, k, v, offset), want)
    assert len(graphs) == 1


def test_static_cache_decode_fills_the_lengths_once_per_mask(monkeypatch):
    """transformers passes one `filled` mask to every layer of a static cache's decode step: every layer's
    decode call (`hf._decode`: `flash_decode` or its planned launch) gets the same lengths tensor (one fill
    per forward, not per layer), with the output of the dense call on the filled keys; the next step's mask
    (one key more) gets its own lengths."""
    lengths = []
    real = hf._decode
    monkeypatch.setattr(hf, "_decode",
                        lambda q, k, v, lens, *a: lengths.append(lens) or real(q, k, v, lens, *a))
    q, k, v = _qkv(2, 4, 2, 1, 10)
    for n in (6, 7):
        mask = hf.filled(2, n, DEVICE)  # a static cache's mask: n of 10 slots
        lengths.clear()
        outs = [hf.attention_forward(_Attn(), q, k, v, mask)[0] for _ in range(3)]  # three layers
        assert len(lengths) == 3 and all(t is lengths[0] for t in lengths) and lengths[0].tolist() == [n, n]
        want = hf.attention_forward(_Attn(), q, k[:, :, :n], v[:, :, :n], None)[0]
        assert all(torch.equal(o, want) for o in outs)


def test_padded_and_filled_paths_compile_without_a_graph_break():
    """torch.compile(fullgraph=True) traces both mask paths (a host read would break the graph); the compiled
    call gives the eager call's bits (dynamo only: the eager backend)."""
    q, k, v = _qkv(2, 4, 2, 6, 10)
    mask = torch.ones(2, 10, dtype=torch.bool, device=DEVICE)
    mask[0, :3] = False
    mask[1, 4] = False
    for args in ((q, k, v, mask), (q[:, :, :1], k, v, hf.filled(2, 7, DEVICE))):
        torch.compiler.reset()
        f = torch.compile(lambda *a: hf.attention_forward(_Attn(), *a)[0], backend="eager", fullgraph=True)
        assert torch.equal(f(*args), hf.attention_forward(_Attn(), *args)[0])


@pytest.mark.gpu
def test_padded_path_does_not_sync_on_the_gpu():
    """CUDA's own sync detector: the padded path (varlen) raises no synchronising call once warm."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v = _qkv(3, 8, 2, 64, 64)
    mask = torch.ones(3, 64, dtype=torch.bool, device=DEVICE)
    mask[0, :17] = False
    hf.attention_forward(_Attn(), q, k, v, mask)  # warm: compiles, builds caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, _ = hf.attention_forward(_Attn(), q, k, v, mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert o.shape == (3, 64, 8, 64)


def test_packed_position_ids_are_refused_not_read():
    """Packed sequences in ``position_ids`` (a forward without a cache): transformers finds them (its own
    read, for every implementation) and asks for a mask beyond the padding form: refused at the mask, and
    attnscope reads nothing; with a cache transformers takes positions as positions, as with "sdpa"."""
    cfg = transformers.LlamaConfig(**COMMON)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=NAME, dtype=torch.bfloat16)
    m = m.eval().to(DEVICE)
    ids = torch.randint(1, 96, (1, 6), device=DEVICE)
    packed = torch.tensor([[0, 1, 2, 0, 1, 2]], device=DEVICE)
    with torch.no_grad():
        with pytest.raises(NotImplementedError, match="packed sequences in position_ids"):
            m(ids, position_ids=packed, use_cache=False)
        m(ids, position_ids=torch.arange(6, device=DEVICE)[None], use_cache=False)  # one sequence: runs


def test_module_sinks_set_or_deleted_between_calls_are_seen():
    """A module's ``sinks`` is looked up on every call, as ``getattr``: one set after the module's first
    call is used from the next call on (not ignored), one deleted is no longer used (no AttributeError);
    a class attribute (a property) counts as well."""
    class WithProperty(_Attn):
        @property
        def sinks(self):
            return self.logits

    q, k, v = _qkv(2, 4, 2, 1, 10)
    sinks = 3.0 * torch.randn(4, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    module = _Attn()
    with torch.no_grad():
        plain = hf.attention_forward(module, q, k, v, None)[0]
        want = hf.attention_forward(_Attn(), q, k, v, None, s_aux=sinks)[0]
        assert not torch.equal(want, plain)
        module.sinks = torch.nn.Parameter(sinks)  # gained after the first call
        assert torch.equal(hf.attention_forward(module, q, k, v, None)[0], want)
        del module.sinks
        assert torch.equal(hf.attention_forward(module, q, k, v, None)[0], plain)
        module.register_buffer("sinks", sinks)
        assert torch.equal(hf.attention_forward(module, q, k, v, None)[0], want)
        prop = WithProperty()
        prop.logits = sinks
        assert torch.equal(hf.attention_forward(prop, q, k, v, None)[0], want)


def test_mask_caches_are_neither_read_nor_kept_while_transient(monkeypatch):
    """While compiling or capturing a CUDA graph (`hf._transient`) the per-mask caches (packing, key packing,
    filled lengths, runs of real keys, lengths and starts) are neither read nor written: a graph captured on
    a kept tensor would read freed memory once the entry is replaced. Eagerly each is computed once per mask
    tensor."""
    mask = torch.ones(2, 10, dtype=torch.bool, device=DEVICE)
    mask[0, :3] = False
    keys = mask[:, None, None, :]
    filled = hf.filled(2, 7, DEVICE)
    dev = torch.device(DEVICE)
    starts = hf.lengths(torch.tensor([5, 7], device=DEVICE), torch.tensor([0, 2], device=DEVICE))
    calls = (lambda: hf._packing(mask, 1, 10, dev), lambda: hf._key_packing(keys.view(2, 10), dev),
             lambda: hf._filled_lens(filled, dev), lambda: hf._spans(mask),
             lambda: hf._length_columns(starts))
    kept = [f() for f in calls]
    assert all(f() is k for f, k in zip(calls, kept, strict=True))  # eagerly: kept
    monkeypatch.setattr(hf, "_transient", lambda device: True)
    for f, k in zip(calls, kept, strict=True):
        a, b = f(), f()
        assert a is not b and k is not a and k is not b  # not read
    monkeypatch.undo()
    assert all(f() is k for f, k in zip(calls, kept, strict=True))  # and not written


def test_one_query_step_with_grad_runs_the_differentiable_kernels():
    """A one-query causal step that needs a backward (a one-token training sequence, a step after a cache
    under grad; unpadded, `filled` or left-padded) gives SDPA's output and gradients, not `flash_decode`'s
    refusal (it has no backward)."""
    q, k, v = (t.requires_grad_() for t in _qkv(2, 4, 2, 1, 10))
    left = torch.ones(2, 10, dtype=torch.bool, device=DEVICE)
    left[0, :3] = False
    kr, vr = (t.repeat_interleave(2, 1) for t in (k, v))
    for mask, n in ((None, 10), (hf.filled(2, 7, DEVICE), 7), (left, 10)):
        o = hf.attention_forward(_Attn(), q, k, v, mask, scaling=0.2)[0]
        keys = left[:, None, None, :] if mask is left else None
        want = torch.nn.functional.scaled_dot_product_attention(q, kr[:, :, :n], vr[:, :, :n], keys,
                                                                scale=0.2)
        do = torch.randn_like(o)
        got, ref = (torch.autograd.grad(x, (q, k, v), dy) for x, dy in ((o, do), (want.transpose(1, 2), do)))
        for a, b in zip((o, *got), (want.transpose(1, 2), *ref), strict=True):
            assert (a.float() - b.float()).abs().max().item() <= 2e-2  # bf16 rounding of O(1) values


def test_bidirectional_masks_encoder_and_cross_attention():
    """Bidirectional masks (transformers' ``create_bidirectional_mask``: an encoder, cross-attention): an
    encoder's padded self-attention gives its float64 SDPA output over the real tokens (a tiny BERT); a
    cross-attention decode step over a padded encoder output gets the 4-D key mask; more queries over a padded
    encoder output, and a bidirectional sliding window, are refused by name."""
    cfg = transformers.BertConfig(vocab_size=96, hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    m64, ours = (transformers.BertModel._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=dt)
                 for impl, dt in (("sdpa", torch.float64), (NAME, torch.bfloat16)))
    ours.load_state_dict(m64.state_dict())
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    mask = torch.ones(3, 12, dtype=torch.long, device=DEVICE)
    mask[0, 8:], mask[1, :3], mask[2, 4:6] = 0, 0, 0
    with torch.no_grad():
        want, got = (m.eval().to(DEVICE)(ids, attention_mask=mask).last_hidden_state for m in (m64, ours))
    assert (got.double() - want)[mask.bool()].abs().max().item() <= 5e-2  # bf16 rounding of O(1) states
    pad = mask.bool()
    kw = dict(allow_is_causal_skip=False, allow_is_bidirectional_skip=True, device=DEVICE)
    keys = hf.padding_mask(3, 1, 12, attention_mask=pad, **kw)
    assert keys.shape == (3, 1, 1, 12) and torch.equal(keys[:, 0, 0], pad)
    assert hf.padding_mask(3, 5, 12, attention_mask=None, **kw) is None  # no padding: all keys
    with pytest.raises(NotImplementedError, match="cross-attention to a padded encoder output"):
        hf.padding_mask(3, 5, 12, attention_mask=pad, **kw)
    with pytest.raises(NotImplementedError, match="bidirectional sliding-window mask"):
        hf.padding_mask(3, 12, 12, attention_mask=pad, local_size=4, **kw)


def test_chunked_attention_is_refused_past_one_chunk():
    """Llama 4's chunked attention (``attention_chunk_size``): the padding form has no chunks, so keys past
    one chunk are refused naming it (transformers refuses flash attention the same way), never attended as
    full causal attention; within one chunk it is plain causal attention and runs."""
    cfg = transformers.Llama4TextConfig(**{**COMMON, "num_hidden_layers": 2}, attention_chunk_size=4,
                                        intermediate_size_mlp=128, num_local_experts=2, no_rope_layers=[1, 1],
                                        moe_layers=[], interleave_moe_layer_step=0)
    m = transformers.Llama4ForCausalLM._from_config(cfg, attn_implementation=NAME, dtype=torch.bfloat16)
    ids = torch.randint(1, 96, (1, 6), device=DEVICE)
    with torch.no_grad():
        with pytest.raises(NotImplementedError, match="attention_chunk_size: chunked attention"):
            m.eval().to(DEVICE)(ids)
        m(ids[:, :4])
