"""No host sync in the default path of any public call (CPU, TRITON_INTERPRET=1, tiny shapes).

On a GPU a host read of a device value (``.item()``, ``bool(t)``, ``.tolist()``, ``nonzero``, a pageable
host-to-device copy, ...) stalls the host until the device drains: per layer of a transformer that is
the difference between a queued and a serialised forward. On CPU tensors nothing syncs, so
`sync_guard.count_syncs` records every such call with its call site; each test runs one user call with its
default arguments and asserts that none was made from attnscope's own frames. A call that needs one by
design (``check_seqlens=True``) shows that the guard sees it. transformers' own reads are counted apart
and compared with the ``"sdpa"`` implementation's on the same forward.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import attnscope  # noqa: E402
from kernel_env import kernel_device  # noqa: E402
from sync_guard import count_syncs, cuda_syncs  # noqa: E402

DEVICE = kernel_device()
DT = torch.float16


def _rnd(*shape, grad=False):
    return torch.randn(*shape, dtype=DT, device=DEVICE).requires_grad_(grad)


def _no_syncs(fn):
    """Run ``fn`` under the guard; fail naming every call site in attnscope that would sync."""
    with count_syncs() as s:
        out = fn()
    assert s.count("attnscope") == 0, s.report("attnscope")
    return out, s


def test_guard_sees_a_sync_by_design():
    """``check_seqlens=True`` reads cu_seqlens back (documented): the guard must report it, in attnscope."""
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    q, k, v = _rnd(7, 2, 64), _rnd(7, 1, 64), _rnd(7, 1, 64)
    with count_syncs() as s:
        attnscope.flash_attention_varlen(q, k, v, cu, cu, 4, 4, check_seqlens=True)
    assert s.count("attnscope") == 2 and "varlen_plan.py" in s.report("attnscope")
    with count_syncs() as s:  # quantize_kv's opt-in finiteness read-back
        attnscope.quantize_kv(k, check_finite=True)
    assert s.count("attnscope") == 1 and "quantize.py" in s.report("attnscope")
    with count_syncs() as s:
        bool(cu.any()), cu[cu > 0], torch.tensor([1], device=DEVICE)
    assert s.count("attnscope") == 0 and s.count("other") == 3


def test_guard_sees_host_to_device_copies():
    """A tensor made on the host (a factory without ``device``) and moved to the inputs' device is a
    pageable host-to-device copy on a GPU, which syncs: the guard reports each form of the move; moving a
    device tensor, keeping a host tensor on the host and assigning a 0-d host scalar are not such copies."""
    x = _rnd(4, 8)
    with count_syncs() as s:
        idx = torch.arange(2)
        idx.to(x.device), idx.to(x), x[idx]
        x[:2].copy_(torch.zeros(2, 8, dtype=DT))
        x[0] = torch.ones(8, dtype=DT)
    assert s.count("other") == 5 and s.count("attnscope") == 0, s.report()
    assert all("host" in h.op for h in s.of("other")), s.report()
    with count_syncs() as s:
        x.to(x.device), x[torch.arange(2, device=x.device)], torch.arange(3).to("cpu") + 1
        x[0] = torch.tensor(1.0, dtype=DT)
    assert s.count() == 0, s.report()


def test_flash_attention_forward_and_backward():
    q, k, v = _rnd(1, 4, 17, 64, grad=True), _rnd(1, 2, 17, 64, grad=True), _rnd(1, 2, 17, 64, grad=True)
    _no_syncs(lambda: attnscope.flash_attention(q.detach(), k.detach(), v.detach()))

    def train():
        attnscope.flash_attention(q, k, v, causal=True).sum().backward()

    _no_syncs(train)
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


def test_flash_attention_varlen_forward_and_backward():
    cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32, device=DEVICE)  # an empty sequence in the middle
    q, k, v = _rnd(17, 4, 64, grad=True), _rnd(17, 2, 64, grad=True), _rnd(17, 2, 64, grad=True)
    _no_syncs(lambda: attnscope.flash_attention_varlen(q.detach(), k.detach(), v.detach(), cu, cu, 12, 12))

    def train():
        attnscope.flash_attention_varlen(q, k, v, cu, cu, 12, 12).sum().backward()

    _no_syncs(train)
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


def test_flash_decode_and_plan_run():
    q, kc, vc = _rnd(2, 4, 1, 64), _rnd(2, 2, 40, 64), _rnd(2, 2, 40, 64)
    lens = torch.tensor([7, 40], dtype=torch.int32, device=DEVICE)
    o, _ = _no_syncs(lambda: attnscope.flash_decode(q, kc, vc, cache_seqlens=lens))
    plan = attnscope.kernels.decode.decode_plan(q, kc, vc, lens)
    o_plan, _ = _no_syncs(lambda: plan.run(q, kc, vc, lens))
    assert torch.equal(o, o_plan)


def test_flash_decode_paged_fp8_and_chunked():
    q = _rnd(2, 4, 1, 64)
    pages_k, pages_v = _rnd(6, 16, 2, 64), _rnd(6, 16, 2, 64)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 40], dtype=torch.int32, device=DEVICE)
    _no_syncs(lambda: attnscope.flash_decode(q, pages_k, pages_v, lens, block_table=table))
    kc, vc = _rnd(2, 2, 48, 64), _rnd(2, 2, 48, 64)
    ((k8, k_scale), (v8, v_scale)), _ = _no_syncs(lambda: tuple(map(attnscope.quantize_kv, (kc, vc))))
    _no_syncs(lambda: attnscope.quantize_kv(pages_k, head_axis=-2, per_head=False))
    _no_syncs(lambda: attnscope.flash_decode(q, k8, v8, lens, k_scale=k_scale, v_scale=v_scale))
    _no_syncs(lambda: attnscope.flash_decode(_rnd(2, 4, 3, 64), kc, vc, lens))


def test_flash_attn_interface_calls():
    fai = pytest.importorskip("attnscope.flash_attn_interface")
    q, k, v = _rnd(2, 9, 4, 64), _rnd(2, 9, 2, 64), _rnd(2, 9, 2, 64)
    _no_syncs(lambda: fai.flash_attn_func(q, k, v, causal=True))
    cu = torch.tensor([0, 9, 18], dtype=torch.int32, device=DEVICE)
    _no_syncs(lambda: fai.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu,
                                                 9, 9, causal=True))
    kc, vc = _rnd(2, 32, 2, 64), _rnd(2, 32, 2, 64)
    lens = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    k_new, v_new = _rnd(2, 1, 2, 64), _rnd(2, 1, 2, 64)
    _no_syncs(lambda: fai.flash_attn_with_kvcache(q[:, :1], kc, vc, k_new, v_new, cache_seqlens=lens,
                                                  causal=True))
    assert torch.equal(kc[1, 20], k_new[1, 0]) and torch.equal(vc[0, 3], v_new[0, 0])  # appended in place
    _no_syncs(lambda: fai.flash_attn_with_kvcache(q[:, :1], kc, vc, k_new, v_new, cache_seqlens=25))
    assert torch.equal(kc[0, 25], k_new[0, 0])
    pages_k, pages_v = _rnd(5, 16, 2, 64), _rnd(5, 16, 2, 64)
    table = torch.tensor([[4, 0], [1, 3]], dtype=torch.int32, device=DEVICE)
    k3, v3 = _rnd(2, 3, 2, 64), _rnd(2, 3, 2, 64)  # three new keys: 15 .. 17 cross a page
    lens3 = torch.tensor([15, 29], dtype=torch.int32, device=DEVICE)
    _no_syncs(lambda: fai.flash_attn_with_kvcache(q[:, :3], pages_k, pages_v, k3, v3, cache_seqlens=lens3,
                                                  block_table=table, causal=True))
    assert torch.equal(pages_k[4, 15], k3[0, 0]) and torch.equal(pages_v[0, 1], v3[0, 2])
    cos, sin = _rnd(32, 16), _rnd(32, 16)  # rotary: positions gathered on the device
    _no_syncs(lambda: fai.flash_attn_with_kvcache(q[:, :3], pages_k, pages_v, k3, v3, rotary_cos=cos,
                                                  rotary_sin=sin, cache_seqlens=lens3 - 12, block_table=table,
                                                  causal=True, rotary_interleaved=False))
    _no_syncs(lambda: fai.flash_attn_with_kvcache(q[:, :1], kc, vc, k_new, v_new, rotary_cos=cos,
                                                  rotary_sin=sin, cache_seqlens=26))
    attnscope.kernels.decode.check_errors()  # every length and page in range: nothing recorded


# --- transformers ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llamas():
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("attnscope.integrations.transformers")
    name = hf.register()
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                   max_position_embeddings=64, pad_token_id=0, eos_token_id=None,
                                   bos_token_id=None)
    out = {}
    for impl in ("sdpa", name):
        torch.manual_seed(0)  # from_config writes the implementation into its config: one copy each
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl,
                                                          dtype=torch.bfloat16)
        out[impl] = m.eval().to(DEVICE)
    return out


def _forwards(model, ids, mask):
    """Prefill (with a cache, as inference runs), then one decode step; the syncs of each."""
    with torch.no_grad():
        with count_syncs() as pre:
            out = model(ids, attention_mask=mask, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        mask2 = None if mask is None else torch.cat([mask, torch.ones_like(nxt)], 1)
        with count_syncs() as dec:
            model(nxt, attention_mask=mask2, past_key_values=out.past_key_values, use_cache=True)
    return pre, dec


@pytest.mark.parametrize("padded", [False, True], ids=["batch1-unpadded", "batch2-left-padded"])
def test_transformers_forward_syncs_no_more_than_sdpa(llamas, padded):
    """A tiny Llama's prefill and decode step through attention_forward: no sync in attnscope's frames but,
    in a left-padded batch's decode step, one read of the mask's runs of real keys for the whole forward
    (`_spans`, by design: it lets the step attend in place instead of gathering the cache in every layer);
    transformers' own (its mask and cache code) no more than with "sdpa"."""
    ids = torch.randint(1, 96, (2 if padded else 1, 12), device=DEVICE)
    mask = None
    if padded:
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
    counts = {}
    for impl, model in llamas.items():
        pre, dec = _forwards(model, ids, mask)
        counts[impl] = (pre.count("transformers"), dec.count("transformers"))
        if impl != "sdpa":
            assert pre.count("attnscope") == 0, pre.report("attnscope")
            assert dec.count("attnscope") == int(padded), dec.report("attnscope")  # two layers, one read
            if padded:
                assert "_spans" in dec.report("attnscope"), dec.report("attnscope")
    assert counts["attnscope"][0] <= counts["sdpa"][0] and counts["attnscope"][1] <= counts["sdpa"][1], counts


def test_transformers_sliding_window_padded_reads_once_per_forward():
    """A sliding window over a padding mask needs the holes check (a host read by design, documented in
    the module): once per mask tensor, not once per layer (two sliding layers here)."""
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("attnscope.integrations.transformers")
    cfg = transformers.MistralConfig(vocab_size=96, hidden_size=128, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                     head_dim=64, max_position_embeddings=64, sliding_window=5,
                                     pad_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=hf.register(),
                                                          dtype=torch.bfloat16).eval().to(DEVICE)
    ids = torch.randint(1, 96, (2, 12), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad(), count_syncs() as s:
        model(ids, attention_mask=mask)
    assert s.count("attnscope") == 1 and "_has_holes" in s.report("attnscope"), s.report("attnscope")


def test_transformers_packs_a_padding_mask_once_per_forward(llamas, monkeypatch):
    """transformers passes one padding mask to every layer: the packing (cu_seqlens, permutations, about 30
    small kernels) is built once per forward and mask shape, not per layer; a mask changed in place is
    packed again."""
    hf = pytest.importorskip("attnscope.integrations.transformers")
    built = []
    pack = hf._pack_order
    monkeypatch.setattr(hf, "_pack_order", lambda m: built.append(m.shape) or pack(m))
    q, k, v = (torch.randn(2, h, 6, 64, dtype=torch.bfloat16, device=DEVICE) for h in (4, 2, 2))
    mask = torch.ones(2, 6, dtype=torch.bool, device=DEVICE)
    mask[0, :2] = False

    class Attn(torch.nn.Module):
        is_causal = True

    outs = [hf.attention_forward(Attn(), q, k, v, mask)[0] for _ in range(3)]  # three layers
    assert len(built) == 2 and all(torch.equal(o, outs[0]) for o in outs)  # queries and keys, once
    mask[1, :3] = False  # in place: a new packing
    o = hf.attention_forward(Attn(), q, k, v, mask)[0]
    assert len(built) == 4 and not o[1, :3].any() and o[1, 3:].abs().sum() > 0
    ids = torch.randint(1, 96, (2, 12), device=DEVICE)
    ids_mask = torch.ones_like(ids)
    ids_mask[1, :4] = 0
    built.clear()
    with torch.no_grad():
        llamas[hf.register()](ids, attention_mask=ids_mask)  # two layers
    assert len(built) == 2

# --- on a GPU: CUDA's own detector, on shapes the Hopper kernels take ------------------------------------
def _gpu_calls():
    """(name, call) of each public call's default path, on shapes the sm_90 dispatch sends to its kernels."""
    from attnscope import flash_attn_interface as fai

    def rnd(*shape, grad=False):
        return torch.randn(*shape, dtype=torch.bfloat16, device="cuda").requires_grad_(grad)

    calls = []
    for d in (64, 128):
        q, k, v = rnd(1, 16, 1024, d, grad=True), rnd(1, 4, 1024, d, grad=True), rnd(1, 4, 1024, d, grad=True)
        calls.append((f"flash_attention d={d}", lambda q=q, k=k, v=v: attnscope.flash_attention(
            q.detach(), k.detach(), v.detach(), causal=True)))
        calls.append((f"flash_attention fwd+bwd d={d}", lambda q=q, k=k, v=v: attnscope.flash_attention(
            q, k, v, causal=True).sum().backward()))
    cu = torch.tensor([0, 700, 700, 2048], dtype=torch.int32, device="cuda")
    qv, kv, vv = rnd(2048, 16, 128, grad=True), rnd(2048, 4, 128, grad=True), rnd(2048, 4, 128, grad=True)
    calls.append(("flash_attention_varlen", lambda: attnscope.flash_attention_varlen(
        qv.detach(), kv.detach(), vv.detach(), cu, cu, 1348, 1348, causal=True)))
    calls.append(("flash_attention_varlen fwd+bwd", lambda: attnscope.flash_attention_varlen(
        qv, kv, vv, cu, cu, 1348, 1348, causal=True).sum().backward()))
    calls.append(("flash_attn_varlen_func", lambda: fai.flash_attn_varlen_func(
        qv.detach(), kv.detach(), vv.detach(), cu, cu, 1348, 1348, causal=True)))
    qd, kc, vc = rnd(4, 32, 1, 128), rnd(4, 8, 4096, 128), rnd(4, 8, 4096, 128)
    lens = torch.tensor([4096, 17, 0, 3000], dtype=torch.int32, device="cuda")
    calls.append(("flash_decode", lambda: attnscope.flash_decode(qd, kc, vc, cache_seqlens=lens)))
    plan = attnscope.kernels.decode.decode_plan(qd, kc, vc, lens)
    calls.append(("DecodePlan.run", lambda: plan.run(qd, kc, vc, lens)))
    kb, vb = kc.transpose(1, 2), vc.transpose(1, 2)  # [B, L, Hkv, d] views
    k_new, v_new = rnd(4, 1, 8, 128), rnd(4, 1, 8, 128)
    small = torch.tensor([5, 17, 0, 3000], dtype=torch.int32, device="cuda")
    calls.append(("flash_attn_with_kvcache append", lambda: fai.flash_attn_with_kvcache(
        qd.transpose(1, 2), kb, vb, k_new, v_new, cache_seqlens=small, causal=True)))
    calls.append(("flash_attn_with_kvcache append, int length", lambda: fai.flash_attn_with_kvcache(
        qd.transpose(1, 2), kb, vb, k_new, v_new, cache_seqlens=2000, causal=True)))
    pages_k, pages_v = rnd(4 * 64, 64, 8, 128), rnd(4 * 64, 64, 8, 128)
    table = torch.randperm(4 * 64, device="cuda").to(torch.int32).view(4, 64)
    calls.append(("flash_attn_with_kvcache paged append", lambda: fai.flash_attn_with_kvcache(
        qd.transpose(1, 2), pages_k, pages_v, k_new, v_new, cache_seqlens=small, block_table=table,
        causal=True)))
    cos, sin = rnd(4096, 64), rnd(4096, 64)
    calls.append(("flash_attn_with_kvcache append, rotary", lambda: fai.flash_attn_with_kvcache(
        qd.transpose(1, 2), kb, vb, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=small,
        causal=True)))
    return calls


@pytest.mark.gpu
def test_no_cuda_sync_in_default_paths():
    """Each call, warm (compiled, planned), makes no synchronising CUDA call at all (CUDA's detector: this
    covers the sm_90 paths the CPU never takes)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    failed = []
    for name, call in _gpu_calls():
        call()  # warm: compiles, plans
        with cuda_syncs() as s:
            call()
        if s.count():
            failed.append(f"{name}:\n{s.report()}")
    assert not failed, "\n".join(failed)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(8, 2, 128), (32, 8, 64)], ids=["d128", "d64-hf-bench"])
def test_no_cuda_sync_in_transformers_forward(heads):
    """A small Llama (2k prompt, batch 1: the prefill bench/hf.py times; its heads 32 / 8 of 64 and d 128)
    and its decode step: no synchronising CUDA call (CUDA's detector) and no host read or host-to-device copy
    (`count_syncs`) from attnscope's frames; transformers' own no more than with "sdpa"."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("attnscope.integrations.transformers")
    hq, hkv, d = heads
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=1024, intermediate_size=1024,
                                   num_hidden_layers=4, num_attention_heads=hq, num_key_value_heads=hkv,
                                   head_dim=d, max_position_embeddings=4096)
    ids = torch.randint(0, 256, (1, 2048), device="cuda")
    counts = {}
    for impl in ("sdpa", hf.register()):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl,
                                                              dtype=torch.bfloat16).eval().cuda()
        with torch.no_grad():
            out = model(ids, use_cache=True)  # warm
            model(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
            with cuda_syncs() as pre, count_syncs() as pre_py:
                out = model(ids, use_cache=True)
            with cuda_syncs() as dec, count_syncs() as dec_py:
                model(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
        counts[impl] = [s.count("transformers") + s.count("other") for s in (pre, dec, pre_py, dec_py)]
        if impl != "sdpa":
            for s in (pre, dec, pre_py, dec_py):
                assert s.count("attnscope") == 0, s.report()
    assert all(a <= b for a, b in zip(counts["attnscope"], counts["sdpa"], strict=True)), counts
