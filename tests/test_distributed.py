"""Context parallelism on CPU: two gloo processes, kernels under TRITON_INTERPRET=1, vs float64.

One spawn (two ranks) runs every case, so the file costs one process start-up; a bounded join makes a
hang fail fast instead of stalling the suite.
"""

from __future__ import annotations

import os
import socket
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

from attnscope import reference  # noqa: E402
from attnscope.checks import GRAD_FACTOR, kernel_tolerance  # noqa: E402
from attnscope.errors import InputError  # noqa: E402

WORLD = 2
TIMEOUT_S = 240

# (name, B, Hq, Hkv, N, d, dtype, causal): N = 13 and 11 are not divisible by 2P = 4 (ragged chunks)
CASES = [
    ("causal_ragged_fp16", 1, 2, 2, 13, 64, "float16", True),
    ("unmasked_ragged_fp16", 1, 2, 2, 11, 64, "float16", False),
    ("causal_gqa_bf16", 1, 4, 2, 16, 64, "bfloat16", True),
    ("unmasked_gqa_bf16", 2, 4, 1, 9, 64, "bfloat16", False),
]


# (name, B, Hq, Hkv, N, d, dtype, causal, softcap, sinks, window): score mods through the ring, forward and
# backward; windows that cross the chunk boundaries (causal: chunks of 4, 3, 3, 3 rows) and skip blocks
MOD_CASES = [
    ("causal_softcap_sinks_fp16", 1, 2, 1, 13, 64, "float16", True, 2.0, (-1.0, 3.0), None),
    ("unmasked_sinks_bf16", 1, 2, 2, 11, 64, "bfloat16", False, 0.0, (0.5, -20.0), None),
    ("causal_window_fp16", 1, 2, 1, 13, 64, "float16", True, 0.0, None, (2, -1)),
    ("unmasked_window_softcap_sinks_bf16", 1, 2, 2, 11, 64, "bfloat16", False, 3.0, (1.0, 0.0), (1, 3)),
]


def _torch_mods(q, k, v, do, causal, softcap, sinks, window):
    """PyTorch's own output and gradients at the input dtype (scores, softcap and P V in that dtype,
    softmax in fp32 with the sink as one more column)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    sk = None if sinks is None else sinks.detach().clone().requires_grad_()
    g = q.shape[1] // k.shape[1]
    s = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    n = s.shape[-1]
    s = s.float().masked_fill(~torch.from_numpy(reference.permitted(n, n, causal, window)), -float("inf"))
    if sk is not None:
        s = torch.cat([s, sk[None, :, None, None].expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = (p if sk is None else p[..., :-1]).to(q.dtype) @ v.repeat_interleave(g, 1)
    o.backward(do)
    return o.detach(), (q.grad, k.grad, v.grad) + (() if sk is None else (sk.grad,))


def _mods_case(ad, dist, rank, i, case, device):
    """One MOD_CASES case on every rank; on rank 0 the errors against float64 and PyTorch's own."""
    name, B, Hq, Hkv, N, d, dt, causal, softcap, sinks, window = case
    g = torch.Generator().manual_seed(3000 + i)
    dtype = getattr(torch, dt)
    q, k, v, do = (torch.randn(B, h, N, d, generator=g).to(device, dtype) for h in (Hq, Hkv, Hkv, Hq))
    sk = None if sinks is None else torch.tensor(sinks, dtype=torch.float32, device=device).requires_grad_()
    ql, kl, vl = (ad.shard(t, causal).requires_grad_() for t in (q, k, v))
    o_loc = ad.ring_attention(ql, kl, vl, causal=causal, softcap=softcap, sinks=sk, window=window)
    o_loc.backward(ad.shard(do, causal))
    if sk is not None:
        dist.all_reduce(sk.grad)  # each rank holds its rows' share
    o = ad.unshard(o_loc.detach(), causal)
    grads = [ad.unshard(t.grad, causal) for t in (ql, kl, vl)] + ([] if sk is None else [sk.grad])
    if rank != 0:
        return None
    q64, k64, v64, do64 = (t.double().cpu().numpy() for t in (q, k, v, do))
    mods = dict(softcap=softcap, window=window,
                sinks=None if sinks is None else np.asarray(sinks, dtype=np.float64))
    o_ref, lse_ref = reference.naive_attention(q64, k64, v64, causal=causal, return_lse=True, **mods)
    ref = reference.attention_backward(do64, q64, k64, v64, o_ref, lse_ref, causal=causal, **mods)
    o_t, g_t = _torch_mods(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal, softcap,
                           None if sk is None else sk.detach().cpu(), window)
    err = lambda a, r: float(np.abs(a.double().cpu().numpy() - r).max())  # noqa: E731
    names = "qkvs"[:len(grads)]
    return {"o": (err(o, o_ref), err(o_t, o_ref)),
            **{f"d{w}": (err(a, r), err(t, r)) for w, a, t, r in zip(names, grads, g_t, ref, strict=True)}}


# (name, causal, softcap, sinks, window): a loss that reads the returned LSE too (a ring's output merged
# with another partial, as ring attention inside a larger ring); the plain blocks and the varlen blocks
LSE_CASES = [
    ("lse_grad_causal_sinks", True, 0.0, (0.5, -1.0), None),
    ("lse_grad_softcap_window", False, 2.0, None, (2, 3)),
]


def _lse_grad_case(ad, dist, rank, i, case):
    """The gradients of ``sum(o dO) + sum(lse dLSE)`` (the LSE was non-differentiable: its part of the loss
    was dropped in silence) against float64; and a loss of the LSE alone."""
    name, causal, softcap, sinks, window = case
    g = torch.Generator().manual_seed(4000 + i)
    q, k, v, do = (torch.randn(1, 2, 13, 64, generator=g).half() for _ in range(4))
    dlse = torch.randn(1, 2, 13, generator=g)
    sk = None if sinks is None else torch.tensor(sinks, dtype=torch.float32).requires_grad_()
    ql, kl, vl = (ad.shard(t, causal).requires_grad_() for t in (q, k, v))
    o, lse = ad.ring_attention(ql, kl, vl, causal=causal, softcap=softcap, sinks=sk, window=window,
                               return_lse=True)
    dlse_l = ad.shard(dlse[..., None], causal)[..., 0]
    torch.autograd.backward((o, lse), (ad.shard(do, causal), dlse_l))
    if sk is not None:
        dist.all_reduce(sk.grad)
    grads = [ad.unshard(t.grad, causal) for t in (ql, kl, vl)] + ([] if sk is None else [sk.grad])
    lse_only = [t.detach().clone().requires_grad_() for t in (ql, kl, vl)]
    ad.ring_attention(*lse_only, causal=causal, return_lse=True)[1].sum().backward()
    lse_only_ok = all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in lse_only)
    if rank != 0:
        return None
    mods = dict(softcap=softcap, window=window, sinks=None if sinks is None else np.asarray(sinks, float))
    q64, k64, v64, do64 = (t.double().numpy() for t in (q, k, v, do))
    o_ref, lse_ref = reference.naive_attention(q64, k64, v64, causal=causal, return_lse=True, **mods)
    ref = reference.attention_backward(do64, q64, k64, v64, o_ref, lse_ref, causal=causal,
                                       dlse=dlse.double().numpy(), **mods)
    err = [float(np.abs(a.double().numpy() - r).max()) for a, r in zip(grads, ref, strict=True)]
    return {"err": err, "scale": [float(np.abs(r).max()) for r in ref], "lse_only": lse_only_ok}


def _odd_sinks(ad, dist):
    """+inf, NaN and -inf sinks through the ring, as through the kernels (`_tl.sink_log2`): finite o and
    LSE (+inf: O = 0 and LSE the largest finite base-2 logit, in ln), finite dsinks."""
    g = torch.Generator().manual_seed(5000)
    q, k, v = (torch.randn(1, 2, 11, 64, generator=g).half() for _ in range(3))
    ql, kl, vl = (ad.shard(t, False) for t in (q, k, v))
    out = {}
    for value in (float("inf"), float("nan"), -float("inf")):
        sk = torch.tensor([value, 0.0]).requires_grad_()
        o, lse = ad.ring_attention(ql, kl, vl, sinks=sk, return_lse=True)
        (o.float().sum() + lse.sum()).backward()
        dist.all_reduce(sk.grad)
        out[str(value)] = dict(finite=bool(torch.isfinite(o).all() and torch.isfinite(lse).all()
                                           and torch.isfinite(sk.grad).all()),
                               o0_zero=bool((o[:, 0] == 0).all()), lse0=float(lse[0, 0, 0].detach()),
                               dsink0=float(sk.grad[0]))
    return out


# (name, what rank 1 passes differently): ranks that disagree, or one that refuses its own arguments
MISMATCH_CASES = [
    ("dtype", "q, k, v in bf16 (rank 0: fp16): the P2P buffers are as large"),
    ("batch_heads", "B x Hq = 1 x 2 (rank 0: 2 x 1): the P2P buffers are as large"),
    ("causal", "causal=False (the lengths 7 and 6 of N = 13 fit both layouts)"),
    ("grad", "q requires grad (rank 0's does not: only rank 1 would run the ring backward)"),
    ("refused", "a window refused by rank 1's own checks"),
    ("unshard_dtype", "x in bf16"),
]


def _mismatches(ad, dist, rank):
    """Each MISMATCH_CASES call on both ranks: every rank's error message (None: none), gathered."""
    out = {}
    for name, _ in MISMATCH_CASES:
        g = torch.Generator().manual_seed(6000)
        q, k, v = (torch.randn(1, 2, 13, 64, generator=g) for _ in range(3))
        dtype = torch.bfloat16 if rank == 1 and name in ("dtype", "unshard_dtype") else torch.float16
        ql, kl, vl = (ad.shard(t, True).to(dtype) for t in (q, k, v))
        kw = {"causal": not (rank == 1 and name == "causal")}
        if name == "batch_heads" and rank == 0:
            ql, kl, vl = (t.reshape(2, 1, *t.shape[2:]) for t in (ql, kl, vl))
        if name == "grad" and rank == 1:
            ql.requires_grad_()
        if name == "refused" and rank == 1:
            kw["window"] = (4, -3)
        try:
            ad.unshard(ql, True) if name == "unshard_dtype" else ad.ring_attention(ql, kl, vl, **kw)
            msg = None
        except InputError as e:
            msg = str(e)
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, msg)
        out[name] = gathered
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(q, k, v, causal):
    g = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(g, 1).numpy()
    v64 = v.double().repeat_interleave(g, 1).numpy()
    return reference.naive_attention(q.double().numpy(), k64, v64, causal=causal, return_lse=True)


def _torch_error(q, k, v, causal, o_ref):
    g = q.shape[1] // k.shape[1]
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)
    return float(np.abs(o.double().numpy() - o_ref).max())


GPU_CASES = [("gpu_causal_ragged_bf16", 1, 4, 4, 4099, 128, "bfloat16", True),
             ("gpu_unmasked_gqa_fp16", 2, 8, 2, 2053, 64, "float16", False)]


def _worker(rank, port, qout, cases=CASES, device="cpu"):
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        import fast_interpreter  # as conftest does in the test process

        fast_interpreter.install()
    else:
        torch.cuda.set_device(rank)
    import torch.distributed as dist

    from attnscope import distributed as ad

    results = {}
    try:
        dist.init_process_group("gloo" if device == "cpu" else "nccl", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=WORLD)
        for i, (name, B, Hq, Hkv, N, d, dt, causal) in enumerate(cases):
            g = torch.Generator().manual_seed(1000 + i)  # same inputs on both ranks
            dtype = getattr(torch, dt)
            q, k, v = (torch.randn(B, h, N, d, generator=g).to(dtype).to(device) for h in (Hq, Hkv, Hkv))
            # shard / unshard round trip, bit-exact
            rt = all(torch.equal(ad.unshard(ad.shard(t, causal), causal), t) for t in (q, k, v))
            ql, kl, vl = (ad.shard(t, causal) for t in (q, k, v))
            o_loc, lse_loc = ad.ring_attention(ql, kl, vl, causal=causal, return_lse=True)
            o = ad.unshard(o_loc, causal)
            lse = ad.unshard(lse_loc.unsqueeze(-1), causal).squeeze(-1)
            if rank == 0:
                q, k, v, o, lse = (t.cpu() for t in (q, k, v, o, lse))
                o_ref, lse_ref = _reference(q, k, v, causal)
                results[name] = dict(
                    roundtrip=rt, dtype=str(o.dtype), shape=tuple(o.shape), local=tuple(o_loc.shape),
                    err=float(np.abs(o.double().numpy() - o_ref).max()),
                    lse_err=float(np.abs(lse.double().numpy() - lse_ref).max()),
                    torch_err=_torch_error(q, k, v, causal, o_ref),
                    finite=bool(torch.isfinite(o).all()))
        if device == "cpu":
            for i, case in enumerate(MOD_CASES):
                res = _mods_case(ad, dist, rank, i, case, device)
                if rank == 0:
                    results[case[0]] = res
            for i, case in enumerate(LSE_CASES):
                res = _lse_grad_case(ad, dist, rank, i, case)
                if rank == 0:
                    results[case[0]] = res
            res = _odd_sinks(ad, dist)
            if rank == 0:
                results["odd_sinks"] = res
        # bad input: a shard that does not match the layout of `shard`
        try:
            x = torch.randn(1, 2, 5 + 3 * rank, 64, dtype=torch.float16, device=device)
            ad.ring_attention(x, x, x, causal=True)
            results["bad_layout"] = "no error"
        except InputError as e:
            results["bad_layout"] = str(e)
        try:
            ad.unshard(x, causal=False)
            results["bad_unshard"] = "no error"
        except InputError as e:
            results["bad_unshard"] = str(e)
        if device == "cpu":
            results["mismatch"] = _mismatches(ad, dist, rank)
            results["bwd"] = _bwd_cases(ad, rank, device)
            results["second_derivative"] = _second_derivative(ad, dist, rank)
            import attnscope.kernels.bwd as real  # the ring's dK/dV pass with a float64 block backward
            kernel, real.flash_attention_backward = real.flash_attention_backward, _block_backward64
            try:  # `ring._block_backward` imports it at each call: the stand-in runs every plain block
                results["bwd_fake"] = _bwd_cases(ad, rank, device)
            finally:
                real.flash_attention_backward = kernel
        dist.destroy_process_group()
    except Exception:  # report to the parent instead of hanging it
        results["error"] = traceback.format_exc()
    if rank == 0:
        qout.put(results)


def _spawn(cases, device):
    ctx = mp.get_context("spawn")
    qout = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, qout, cases, device)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        res = qout.get(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert "error" not in res, res.get("error")
    return res


@pytest.fixture(scope="module")
def ring_results():
    return _spawn(CASES, "cpu")


def _check_case(results, case):
    name, B, Hq, _, N, d, dt, _ = case
    r = results[name]
    assert r["roundtrip"], "unshard(shard(x)) != x"
    assert r["shape"] == (B, Hq, N, d) and r["dtype"] == f"torch.{dt}"
    assert r["local"][2] in (N // WORLD, N - N // WORLD)
    assert r["finite"]
    tol = kernel_tolerance(r["torch_err"])
    assert r["err"] <= tol, (r["err"], tol)
    assert r["lse_err"] <= 1e-2, r["lse_err"]  # fp32 LSE of fp16/bf16 scores


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ring_matches_float64(ring_results, case):
    _check_case(ring_results, case)


@pytest.mark.gpu
def test_ring_nccl_two_gpus():
    """Two GPUs over NCCL (the lead's GPU run): ragged N, GQA, both masks, vs float64."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    res = _spawn(GPU_CASES, "cuda")
    for case in GPU_CASES:
        _check_case(res, case)
    assert "q: expected rank" in res["bad_layout"], res["bad_layout"]


@pytest.mark.parametrize("case", MOD_CASES, ids=[c[0] for c in MOD_CASES])
def test_ring_mods_match_float64(ring_results, case):
    """softcap through every block and the sink counted once (not once per rank or block), forward and
    backward (dsinks summed over the ranks) against float64: 2 x / 3 x PyTorch's own error + 1e-3."""
    from attnscope import checks

    for what, (err, torch_err) in ring_results[case[0]].items():
        factor = 2 if what == "o" else 3
        assert err <= checks.kernel_tolerance(torch_err, factor), (what, err, torch_err)


@pytest.mark.parametrize("case", LSE_CASES, ids=[c[0] for c in LSE_CASES])
def test_ring_lse_gradient_is_not_dropped(ring_results, case):
    r = ring_results[case[0]]
    assert r["lse_only"], "a loss of the LSE alone has no gradient"
    for err, scale in zip(r["err"], r["scale"], strict=True):
        assert err <= 5e-3 * max(scale, 1.0), (err, scale)  # fp16 inputs: about 5e-4 here


def test_ring_infinite_and_nan_sinks_stay_finite(ring_results):
    r = ring_results["odd_sinks"]
    assert all(x["finite"] for x in r.values()), r
    assert r["inf"]["o0_zero"] and r["inf"]["lse0"] == pytest.approx(3.4028234663852886e38 * np.log(2),
                                                                      rel=1e-6)
    assert r["inf"]["dsink0"] == 11.0  # d(sum LSE)/dsink: all the weight on each of the 11 rows
    assert r["nan"]["dsink0"] == 0.0 and r["-inf"]["dsink0"] == 0.0


def test_ring_bad_mods_are_a_clear_error():
    x = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    from attnscope import distributed as ad

    with pytest.raises(InputError, match="window: expected None or a pair"):
        ad.ring_attention(x, x, x, causal=True, window=(4, -3))
    with pytest.raises(InputError, match="softcap: expected a finite real number >= 0"):
        ad.ring_attention(x, x, x, softcap=-1.0)
    with pytest.raises(InputError, match="sinks: expected a float32 tensor of shape"):
        ad.ring_attention(x, x, x, sinks=torch.zeros(3))


def test_ring_second_derivatives_raise_never_a_dropped_gradient(ring_results):
    """A loss on gradients taken with create_graph=True: the ring backward's dq, dk, dv were constants to
    autograd, so the penalty's term was silently left out. One rank (a ring of one: rank 0's own group)."""
    out = ring_results["second_derivative"]
    assert "ring_attention: second derivatives" in out and "supported: first derivatives" in out, out


def test_ring_window_blocks_skip_pairs_outside_the_window():
    """The block plan of a window: every visible (query, key) pair of the whole sequence is covered by
    exactly one block, and blocks with no visible pair are not planned (float64 check of the plan)."""
    from attnscope.distributed import ring

    for n, p, causal, window in ((13, 2, True, (2, 0)), (40, 4, False, (3, 1)), (40, 4, True, (-1, 0)),
                                 (9, 3, False, (0, 0))):
        sizes, starts = ring._bounds(n, p, causal)
        chunks = [tuple(sizes[j] for j in ring._rank_chunks(r, p, causal)) for r in range(p)]
        if not causal:
            chunks = [(c[0], 0) for c in chunks]
        glob = [[starts[j] + i for j in ring._rank_chunks(r, p, causal) for i in range(sizes[j])]
                for r in range(p)]  # global position of each local row of each rank
        want = reference.permitted(n, n, causal, window)
        got = np.zeros((n, n), int)
        planned = 0
        for r in range(p):
            for s in range(p):
                for lo, hi, k_lo, k_hi, _, (bl, br) in ring._blocks(r, s, p, causal, chunks, window):
                    i, c = np.arange(lo, hi)[:, None] - lo, np.arange(k_lo, k_hi)[None, :] - k_lo
                    diag = i + (k_hi - k_lo) - (hi - lo)
                    keep = (c >= diag - bl) & (c <= diag + br)  # kernels.bwd.window_keep
                    assert keep.any(), (r, s, lo, k_lo)  # a planned block sees something
                    rows = np.broadcast_to(np.array(glob[r][lo:hi])[:, None], keep.shape)
                    cols = np.broadcast_to(np.array(glob[s][k_lo:k_hi])[None, :], keep.shape)
                    np.add.at(got, (rows[keep], cols[keep]), 1)
                    planned += 1
        assert (got == want).all(), (n, p, causal, window)
        assert planned < p * p * (4 if causal else 1) or window == (-1, 0), "no block was skipped"


def test_ring_bad_layout(ring_results):
    """A shard of the wrong length is refused by `ring_attention` (q) and by `unshard` (x), with one
    message: ranks 0 and 1 hold 5 and 8 tokens of N = 13, `shard`'s layout 7 and 6 (either mask)."""
    for key, name, layout in (("bad_layout", "q", "causal"), ("bad_unshard", "x", "unmasked")):
        assert ring_results[key] == (f"{name}: expected rank 0 to hold 7 tokens of N = 13 (the {layout} "
                                     "layout of `shard`), got 5"), ring_results[key]


def test_ring_ranks_that_disagree_are_an_error_on_every_rank(ring_results):
    """Ranks whose B, heads, dtypes or options differ got a silently wrong output (fp16 bits read as bf16,
    [2, 1] read as [1, 2]), an aborted process (buffers of other sizes) or a hang: now the same InputError on
    every rank, from the all_gather of the lengths; a rank whose own checks refuse still joins it."""
    got = ring_results["mismatch"]
    same = {
        "dtype": "q: expected the same dtype on every rank, got torch.float16 on rank 0 and "
                 "torch.bfloat16 on rank 1",
        "batch_heads": "q: expected the same batch size on every rank, got 2 on rank 0 and 1 on rank 1",
        "causal": "causal: expected the same value on every rank, got True on rank 0 and False on rank 1",
        "grad": "q: expected the same need of gradients (q, k, v or sinks requires grad) on every rank, got "
                "False on rank 0 and True on rank 1",
        "unshard_dtype": "x: expected the same dtype on every rank, got torch.float16 on rank 0 and "
                         "torch.bfloat16 on rank 1",
    }
    assert set(got) == {name for name, _ in MISMATCH_CASES}
    for name, msg in same.items():
        assert got[name] == [msg] * WORLD, (name, got[name])
    assert got["refused"][0] == ("group: expected valid arguments on every rank, got a refusal on rank 1 "
                                 "(raised there, naming the argument)")
    assert got["refused"][1].startswith("window: expected None or a pair"), got["refused"]


def test_chunk_sizes_pad_free():
    from attnscope.distributed import chunk_sizes

    for n in (0, 1, 13, 1000):
        for c in (2, 4, 8):
            s = chunk_sizes(n, c)
            assert sum(s) == n and max(s) - min(s) <= 1 and s == sorted(s, reverse=True)


def test_merge_matches_reference_combine_and_empty_rows():
    from attnscope.kernels.merge import merge_

    g = torch.Generator().manual_seed(3)
    parts = []
    for _ in range(3):
        o = torch.randn(2, 3, 7, 16, generator=g)
        lse = torch.randn(2, 3, 7, generator=g) * 4
        o[0, 0, 0], lse[0, 0, 0] = 0.0, -float("inf")  # row 0 empty in every partial
        o[1, 2, 3], lse[1, 2, 3] = 0.0, -float("inf") if not parts else lse[1, 2, 3]
        parts.append((o, lse))
    acc = torch.zeros(2, 3, 7, 16)
    acc_lse = torch.full((2, 3, 7), -float("inf"))
    for o, lse in parts:
        merge_(acc, acc_lse, o.half(), lse)
    # the partials went in as fp16: the reference combines the same rounded values
    ro, rl = reference.combine([(o.half().double().numpy(), lse.double().numpy()) for o, lse in parts])
    assert not torch.isnan(acc).any()
    assert float(np.abs(acc.double().numpy() - ro).max()) < 1e-5
    assert torch.isneginf(acc_lse[0, 0, 0]) and torch.all(acc[0, 0, 0] == 0)
    fin = np.isfinite(rl)
    assert float(np.abs(acc_lse.double().numpy()[fin] - rl[fin]).max()) < 1e-5


def test_merge_bad_shape():
    from attnscope.kernels.merge import merge_

    with pytest.raises(InputError, match="o_part: expected shape"):
        merge_(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3), torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4))


BWD_CASES = [("causal_ragged_bwd_fp16", 1, 2, 1, 13, 64, "float16", True),
             ("unmasked_bwd_bf16", 1, 2, 2, 11, 64, "bfloat16", False)]


def _grads64(q, k, v, do, causal):
    """float64 autograd of plain attention (GQA by repeating K/V heads): the gradient reference."""
    g = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(
        q64, k64.repeat_interleave(g, 1), v64.repeat_interleave(g, 1), is_causal=causal)
    o.backward(do.double())
    return q64.grad, k64.grad, v64.grad


def _block_backward64(do, q, k, v, o, lse, causal, scale, deterministic=False):
    """Stand-in for kernels.bwd.flash_attention_backward (same signature), in float64 torch: the
    FlashAttention-2 backward of one block given the FINAL o and lse (Algorithm 2's recomputation)."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale                       # [B, Hq, Nq, Nk]
    if causal:
        nq, nk = s.shape[-2:]
        keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)  # bottom-right
        s = s.masked_fill(~keep, -float("inf"))
    p = torch.exp(s - lse.double().unsqueeze(-1))
    dv = p.transpose(-1, -2) @ do.double()
    dp = do.double() @ vv.transpose(-1, -2)
    delta = (do.double() * o.double()).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    dq = ds @ kk * scale
    dk = ds.transpose(-1, -2) @ q.double() * scale
    fold = lambda t: t.unflatten(1, (k.shape[1], g)).sum(2)  # noqa: E731  GQA: sum the group's heads
    return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)


GPU_BWD_CASES = [("causal_ragged_bwd_bf16_gpu", 1, 8, 2, 3001, 128, "bfloat16", True),
                 ("unmasked_bwd_fp16_gpu", 2, 4, 4, 2047, 64, "float16", False)]


def _bwd_cases(ad, rank, device):
    """BWD_CASES (GPU_BWD_CASES on CUDA) through the ring's backward on every rank; on rank 0, per case, the
    (kernel's, PyTorch's own) max error of dq, dk, dv against float64."""
    results = {}
    cases = BWD_CASES if device == "cpu" else GPU_BWD_CASES
    for i, (name, B, Hq, Hkv, N, d, dt, causal) in enumerate(cases):
        g = torch.Generator().manual_seed(2000 + i)
        dtype = getattr(torch, dt)
        q, k, v, do = (torch.randn(B, h, N, d, generator=g).to(device, dtype) for h in (Hq, Hkv, Hkv, Hq))
        ql, kl, vl = (ad.shard(t, causal).requires_grad_() for t in (q, k, v))
        o = ad.ring_attention(ql, kl, vl, causal=causal)
        o.backward(ad.shard(do, causal))
        grads = [ad.unshard(t.grad, causal) for t in (ql, kl, vl)]
        if rank == 0:
            ref = _grads64(q, k, v, do, causal)
            # PyTorch's own gradient error at this dtype (math SDPA, same inputs)
            qt, kt, vt = (t.detach().clone().requires_grad_() for t in (q, k, v))
            gg = Hq // Hkv
            ot = torch.nn.functional.scaled_dot_product_attention(
                qt, kt.repeat_interleave(gg, 1), vt.repeat_interleave(gg, 1), is_causal=causal)
            ot.backward(do)
            results[name] = [(float((a.double() - r).abs().max()),
                              float((t.grad.double() - r).abs().max()))
                             for a, r, t in zip(grads, ref, (qt, kt, vt), strict=True)]
    return results


def _second_derivative(ad, dist, rank):
    """A loss on gradients taken with create_graph=True through a ring of one (rank 0's own group): the
    error message, or a note that the penalty's gradient was dropped. None on the other rank."""
    one = dist.new_group([0])  # collective: every rank calls it
    if rank != 0:
        return None
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 64).half().requires_grad_() for _ in range(3))
    sinks = torch.zeros(2, requires_grad=True)
    o = ad.ring_attention(q, k, v, causal=True, sinks=sinks, group=one)
    g = torch.autograd.grad(o.float().sum(), q, create_graph=True)[0]
    try:
        (o.float().sum() + (g.float() ** 2).sum()).backward()
        return "no error: the penalty's gradient was dropped"
    except NotImplementedError as e:
        return str(e)


def _bwd_worker(rank, port, qout, device):
    torch.cuda.set_device(rank)
    import torch.distributed as dist

    from attnscope import distributed as ad

    results = {}
    try:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        results = _bwd_cases(ad, rank, device)
        dist.destroy_process_group()
    except Exception:
        results["error"] = traceback.format_exc()
    if rank == 0:
        qout.put(results)


def _check_bwd(res, cases):
    for name, *_ in cases:
        for which, (err, torch_err) in zip("qkv", res[name], strict=True):
            assert err <= kernel_tolerance(torch_err, GRAD_FACTOR), (name, "d" + which, err, torch_err)


def test_ring_backward(ring_results):
    _check_bwd(ring_results["bwd"], BWD_CASES)


@pytest.mark.gpu
def test_ring_backward_nccl_two_gpus():
    """The ring's backward over NCCL on two GPUs with the real block backward: ragged N, GQA, vs float64."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    ctx = mp.get_context("spawn")
    qout = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_bwd_worker, args=(r, port, qout, "cuda")) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        res = qout.get(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert "error" not in res, res.get("error")
    _check_bwd(res, GPU_BWD_CASES)


def test_ring_backward_pass_with_float64_block_backward(ring_results):
    """The ring's dK/dV rotation and sub-block plan, with a float64 stand-in for the block kernel (the
    ring's plain blocks call it: `kernels.bwd.flash_attention_backward` patched in the CPU ranks)."""
    _check_bwd(ring_results["bwd_fake"], BWD_CASES)
