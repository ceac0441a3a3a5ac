"""The measured callables of the backward, decode, varlen and window sweep points (measure/families.py).

`call(torch, spec)` returns ``(fn, keep)`` as measure/ncu.py's child wants them: everything ``fn`` needs is
built first (inputs, the forward whose gradient is asked, caches, block tables, Flex's block mask and its
compile, static for the point's shape, at the first warm-up call), so the profiled range holds only the
family's kernels -- the backward kernels alone for ``backward``. GPU only; imported by the child.
"""

from __future__ import annotations

from attnscope.measure.families import spec_window


def call(torch, spec: dict, device: str = "cuda"):
    """(fn, keep) for one family spec (validated by measure/physical.point), its tensors on ``device``
    (a CPU runs the attnscope and naive calls under ``TRITON_INTERPRET=1``: the tests)."""
    from attnscope.measure.backends import torch_dtype

    dt = torch_dtype(torch, spec["dtype"])
    h, d = spec["heads"], spec["d"]
    hkv = spec.get("kv_heads") or h
    return {"backward": _backward, "decode": _decode, "varlen": _varlen,
            "window": _window}[spec["pass"]](torch, spec, dt, h, hkv, d, device)


def _backward(torch, spec, dt, h, hkv, d, dev):
    import attnscope
    from attnscope.kernels.bwd import flash_attention_backward
    from attnscope.measure.backends import attention_fn

    b, n, causal, impl = spec["batch"], spec["n"], spec["causal"], spec["impl"]
    q = torch.randn((b, h, n, d), device=dev, dtype=dt, requires_grad=True)
    k, v = (torch.randn((b, hkv, n, d), device=dev, dtype=dt, requires_grad=True) for _ in range(2))
    do = torch.randn((b, h, n, d), device=dev, dtype=dt)
    if impl == "attnscope":  # the point's kernels (families.backward_kernels): by default atomic dQ in the
        # portable ones or dQ in its own pass (auto); auto with deterministic false: the dQ mode of autograd's
        # default (`atomic_dq_by_default`), the kernels the user's call runs
        from attnscope.kernels.bwd import atomic_dq_by_default
        from attnscope.measure.families import backward_kernels

        window = spec_window(spec)
        with torch.no_grad():
            o, lse = attnscope.flash_attention(q, k, v, causal=causal, return_lse=True, window=window)
        det, kernels = spec["deterministic"], backward_kernels(spec)
        if kernels == "auto" and not det:
            det = not atomic_dq_by_default(q, causal, None, window)
        return (lambda: flash_attention_backward(do, q, k, v, o, lse, causal, None, deterministic=det,
                                                 window=window, impl=kernels)), (q, k, v, o, lse, do)
    o = attention_fn(impl, causal)(q, k, v)  # naive: autograd through the 3 kernels; SDPA: its backward
    return (lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)), (q, k, v, o, do)


def _decode(torch, spec, dt, h, hkv, d, dev):
    import attnscope
    from attnscope.measure.backends import sdpa

    lens = spec["cache_lens"]
    b, cap = len(lens), max(lens)
    q = torch.randn((b, h, spec.get("nq", 1), d), device=dev, dtype=dt)  # the last nq positions
    if spec["impl"] != "attnscope":  # SDPA: a dense cache, every sequence `cap` long (parse_grid checks)
        k, v = (torch.randn((b, hkv, cap, d), device=dev, dtype=dt) for _ in range(2))
        run = sdpa(spec["impl"])
        return (lambda: run(q, k, v, False, hkv != h)), (q, k, v)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    page = spec.get("page_size")
    table = None
    if page is None:
        k, v = (torch.randn((b, hkv, cap, d), device=dev, dtype=dt) for _ in range(2))
        axis = -3
    else:  # each sequence's pages, in a shuffled order (a cache after churn)
        per = [-(-n // page) for n in lens]
        pages = torch.randperm(sum(per), device=dev).to(torch.int32)
        table = torch.zeros((b, max(per)), dtype=torch.int32, device=dev)
        at = 0
        for i, m in enumerate(per):
            table[i, :m] = pages[at:at + m]
            at += m
        k, v = (torch.randn((sum(per), page, hkv, d), device=dev, dtype=dt) for _ in range(2))
        axis = -2
    scales = {}
    if spec.get("kv_dtype") == "fp8":
        (k, ks), (v, vs) = (attnscope.quantize_kv(x, head_axis=axis) for x in (k, v))
        scales = {"k_scale": ks, "v_scale": vs}
    splits, window = spec["splits"], spec_window(spec)
    return (lambda: attnscope.flash_decode(q, k, v, seqlens, table, num_splits=splits, window=window,
                                           **scales)), (q, k, v, seqlens, table, scales)


def _varlen(torch, spec, dt, h, hkv, d, dev):
    import attnscope

    lens, causal = spec["lens"], spec["causal"]
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    q = torch.randn((total, h, d), device=dev, dtype=dt)
    k, v = (torch.randn((total, hkv, d), device=dev, dtype=dt) for _ in range(2))
    if spec["impl"] == "attnscope":
        m, window = max(lens), spec_window(spec)
        return (lambda: attnscope.flash_attention_varlen(q, k, v, cu, cu, m, m, causal=causal,
                                                         window=window)), (q, k, v, cu)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))

    def document(b, hh, qi, ki):
        same = doc[qi] == doc[ki]
        return same & (qi >= ki) if causal else same

    mask = create_block_mask(document, None, None, total, total, device=dev)
    # a fresh compile for this point's shape, whatever the process compiled before: without the reset a
    # later point recompiles with dynamic shapes (dynamo's automatic dynamic) and past dynamo's recompile
    # limit runs Flex unfused; with it a point's kernel, and its on-disk cache entry, depend on it alone
    torch.compiler.reset()
    flex = torch.compile(flex_attention)
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, total, d] views
    return (lambda: flex(qt, kt, vt, block_mask=mask, enable_gqa=hkv != h)), (q, k, v, mask, doc)


def _window(torch, spec, dt, h, hkv, d, dev):
    import attnscope

    b, n, causal = spec["batch"], spec["n"], spec["causal"]
    left, right = spec["window"]  # the effective window (measure/families.py: causal has right 0)
    q = torch.randn((b, h, n, d), device=dev, dtype=dt)
    k, v = (torch.randn((b, hkv, n, d), device=dev, dtype=dt) for _ in range(2))
    if spec["impl"] == "attnscope":  # the user's call: what impl="auto" dispatches to
        return (lambda: attnscope.flash_attention(q, k, v, causal=causal, window=(left, right))), (q, k, v)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(window_mask(left, right), None, None, n, n, device=dev)
    torch.compiler.reset()  # a fresh compile for this point's shape (as `_varlen`'s)
    flex = torch.compile(flex_attention)
    return (lambda: flex(q, k, v, block_mask=mask, enable_gqa=hkv != h)), (q, k, v, mask)


def window_mask(left: int, right: int):
    """Flex's ``mask_mod`` of flash-attn's ``window_size=(left, right)`` over n x n (the effective window,
    `model.tiles.bounded_window`; -1 unbounded): query qi sees keys qi - left .. qi + right."""
    def mask_mod(b, h, qi, ki):
        keep = qi >= 0
        if left >= 0:
            keep = keep & (qi - ki <= left)
        if right >= 0:
            keep = keep & (ki - qi <= right)
        return keep
    return mask_mod
