"""Ring attention: shard / unshard and the ring forward + backward (see the package docstring)."""

from __future__ import annotations

import functools
import struct
from typing import TYPE_CHECKING

from attnscope.errors import MAX_DIM, InputError, expect, is_int, positive_int, short

if TYPE_CHECKING:  # annotations only (torch is imported where it runs)
    import torch
    import torch.distributed

#: Most chunks `chunk_sizes` makes.
MAX_CHUNKS = 2**21


def chunk_sizes(n: int, chunks: int) -> list[int]:
    """Sizes of `chunks` pad-free chunks of n tokens: the first ``n % chunks`` get one more."""
    expect(is_int(n) and 0 <= n <= MAX_DIM, "n", "a non-negative integer up to 10^24", n)
    positive_int("chunks", chunks)
    if chunks > MAX_CHUNKS:  # 2 per rank: far beyond any process group, and a list memory holds
        raise InputError(f"chunks: expected at most {MAX_CHUNKS:,}, got {short(chunks)}")
    return [n // chunks + (1 if j < n % chunks else 0) for j in range(chunks)]


def _world(group):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise InputError("group: expected an initialised torch.distributed process group, got none "
                         "(call torch.distributed.init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _rank_chunks(rank: int, p: int, causal: bool) -> tuple[int, ...]:
    return (rank, 2 * p - 1 - rank) if causal else (rank,)


def _bounds(n: int, p: int, causal: bool):
    c = 2 * p if causal else p
    sizes = chunk_sizes(n, c)
    starts = [sum(sizes[:j]) for j in range(c)]
    return sizes, starts


def _check_x(x, name="x"):
    if not hasattr(x, "dim") or x.dim() != 4:
        raise InputError(f"{name}: expected a 4-D tensor [B, H, N, d], got "
                         f"{tuple(x.shape) if hasattr(x, 'shape') else type(x).__name__}")


def shard(x: torch.Tensor, causal: bool,
          group: torch.distributed.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's shard of the whole sequence x [B, H, N, d] (dim 2).

    Unmasked: contiguous slice i of P. Causal: chunks i and 2P-1-i of 2P, concatenated (load balance).
    Pad-free for any N (`chunk_sizes`). Returns a contiguous [B, H, N_local, d] tensor.
    """
    import torch

    _check_x(x)
    rank, p = _world(group)
    sizes, starts = _bounds(x.shape[2], p, causal)
    parts = [x[:, :, starts[j]:starts[j] + sizes[j]] for j in _rank_chunks(rank, p, causal)]
    return torch.cat(parts, dim=2).contiguous()


#: What every rank of a `ring_attention` must agree on besides the layout of `shard` (argument, what, kind),
#: and `unshard`'s: gathered with the shard lengths in one all_gather (`_agreed`), so a rank whose tensors or
#: options differ is an error on every rank, never a silently wrong result (P2P buffers of one size
#: reinterpreted) or a rank left waiting.
RING_FACTS = (("q", "batch size", "int"), ("q", "number of heads", "int"), ("k", "number of heads", "int"),
              ("q", "head dim", "int"), ("q", "dtype", "dtype"), ("k", "dtype", "dtype"),
              ("v", "dtype", "dtype"), ("causal", "value", "bool"), ("scale", "softmax scale", "float"),
              ("softcap", "value", "float"), ("window", "left side (-1: unbounded)", "int"),
              ("window", "right side (-1: unbounded)", "int"), ("sinks", "presence", "bool"),
              ("q", "need of gradients (q, k, v or sinks requires grad)", "bool"))
UNSHARD_FACTS = (("x", "batch size", "int"), ("x", "number of heads", "int"), ("x", "head dim", "int"),
                 ("x", "dtype", "dtype"))


@functools.cache
def _dtypes():
    """Every torch dtype in one order on every rank (of one torch version): `_encode`'s codes."""
    import torch

    return sorted({t for t in vars(torch).values() if isinstance(t, torch.dtype)}, key=str)


def _encode(kind: str, value) -> int:
    if kind == "dtype":
        return _dtypes().index(value)
    if kind == "float":
        return struct.unpack("<q", struct.pack("<d", float(value)))[0]  # the exact bits
    return int(value)


def _show(kind: str, code: int):
    if kind == "dtype":
        return _dtypes()[code]
    if kind == "float":
        return struct.unpack("<d", struct.pack("<q", code))[0]
    return bool(code) if kind == "bool" else code


def _agreed(x, group, specs, values, refused=None) -> tuple[int, int, list[int]]:
    """(rank, P, every rank's N_local) from one all_gather of this rank's N_local (``x.shape[2]``) and
    ``values`` of the facts ``specs`` ((argument, what, kind) each, `RING_FACTS`): raises `InputError` on
    every rank, the same message, naming the first fact two ranks disagree on. ``refused``: this rank's
    own error from its local checks, raised here after the gather (the other ranks raise naming this rank),
    so no rank waits on a collective the refusing rank never joins."""
    import torch
    import torch.distributed as dist

    if refused is not None and not (dist.is_available() and dist.is_initialized()):
        raise refused  # no process group: no rank to wait
    rank, p = _world(group)
    if refused is None:
        device = x.device
        mine = [0, x.shape[2], *(_encode(kind, v) for (_, _, kind), v in zip(specs, values, strict=True))]
    else:  # ``x`` may be anything: the device of the group's backend
        cuda = dist.get_backend(group) == "nccl"
        device = x.device if isinstance(x, torch.Tensor) else torch.device(
            "cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        mine = [1, 0] + [0] * len(specs)
    out = [torch.empty(len(mine), dtype=torch.int64, device=device) for _ in range(p)]
    dist.all_gather(out, torch.tensor(mine, dtype=torch.int64, device=device), group=group)
    rows = [t.tolist() for t in out]
    if refused is not None:
        raise refused
    bad = next((r for r in range(p) if rows[r][0]), None)
    if bad is not None:
        raise InputError(f"group: expected valid arguments on every rank, got a refusal on rank {bad} "
                         f"(raised there, naming the argument)")
    for i, (name, what, kind) in enumerate(specs, start=2):
        r = next((r for r in range(p) if rows[r][i] != rows[0][i]), None)
        if r is not None:
            raise InputError(f"{name}: expected the same {what} on every rank, got {_show(kind, rows[0][i])} "
                             f"on rank 0 and {_show(kind, rows[r][i])} on rank {r}")
    return rank, p, [row[1] for row in rows]


def unshard(x: torch.Tensor, causal: bool,
            group: torch.distributed.ProcessGroup | None = None) -> torch.Tensor:
    """Inverse of `shard`: all-gather every rank's [B, H, N_local, d] and return the whole [B, H, N, d]."""
    import torch
    import torch.distributed as dist

    try:
        _check_x(x)
        values = (*x.shape[:2], x.shape[3], x.dtype)
    except InputError as e:
        _agreed(x, group, UNSHARD_FACTS, None, refused=e)
    _, p, lens = _agreed(x, group, UNSHARD_FACTS, values)
    chunks = _chunk_sizes(lens, "x", causal, p)
    # gather into equal-size buffers (gloo and NCCL all_gather need equal shapes)
    m = max(sum(c) for c in chunks)
    buf = x.new_zeros(x.shape[0], x.shape[1], m, x.shape[3])
    buf[:, :, :x.shape[2]] = x
    bufs = [torch.empty_like(buf) for _ in range(p)]
    dist.all_gather(bufs, buf.contiguous(), group=group)
    pieces = [None] * (2 * p if causal else p)
    for r in range(p):
        off = 0
        for j, size in zip(_rank_chunks(r, p, causal), chunks[r], strict=True):
            pieces[j] = bufs[r][:, :, off:off + size]
            off += size
    return torch.cat(pieces, dim=2)


class _Ring:
    """One ring pass over a process group: post the exchange of the blocks held now, then wait."""

    def __init__(self, group, rank: int, p: int):
        import torch.distributed as dist

        self.dist, self.group, self.p = dist, group, p
        # global ranks of the neighbours (P2POp takes global ranks)
        self.nxt = dist.get_global_rank(group, (rank + 1) % p) if group is not None else (rank + 1) % p
        self.prv = dist.get_global_rank(group, (rank - 1) % p) if group is not None else (rank - 1) % p

    def start(self, sends, recvs):
        ops = [self.dist.P2POp(self.dist.isend, t, self.nxt, self.group) for t in sends]
        ops += [self.dist.P2POp(self.dist.irecv, t, self.prv, self.group) for t in recvs]
        return self.dist.batch_isend_irecv(ops)

    def pass_on(self, tensors, n_in: int):
        """Post the exchange of ``tensors`` ([B, H, n, d] each): the previous rank's, ``n_in`` rows each,
        arrive in fresh buffers. Returns (the buffers, the requests to wait on)."""
        bufs = [t.new_empty(t.shape[0], t.shape[1], n_in, t.shape[3]) for t in tensors]
        return bufs, self.start(tensors, bufs)


def _step_plan(r: int, s: int, causal: bool, lens_src: tuple[int, int] | None, n_q: tuple[int, int]):
    """Which sub-block rank r computes with the K/V of rank s.

    Returns (q_lo, q_hi, k_hi, causal_flag): queries [q_lo, q_hi) against keys [0, k_hi) (None: all).
    `n_q` = (low chunk, high chunk) lengths of rank r; `lens_src` = those of rank s.
    """
    nq = n_q[0] + n_q[1]
    if not causal:
        return 0, nq, None, False
    if s == r:
        return 0, nq, None, True
    if s < r:
        return 0, nq, lens_src[0], False  # all queries see chunk s; none see chunk 2P-1-s
    return n_q[0], nq, None, False  # s > r: only the high chunk's queries, all keys


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_x(t, name)
    if k.shape != v.shape:
        raise InputError(f"v: expected k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] != k.shape[2]:
        raise InputError(f"k: expected [B, Hkv, N_local, d] with q's B, N_local and d {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")


def _chunk_sizes(lens, name: str, causal: bool, p: int):
    """Every rank's chunk lengths in the layout of `shard` (rank r holds chunks `_rank_chunks(r, P, causal)`),
    checked against ``lens``, the lengths the ranks' [B, H, N_local, d] hold (`_agreed`); a mismatch raises
    naming ``name``."""
    n = sum(lens)
    sizes, _ = _bounds(n, p, causal)
    chunks = [tuple(sizes[j] for j in _rank_chunks(r, p, causal)) for r in range(p)]
    for r in range(p):
        if sum(chunks[r]) != lens[r]:
            raise InputError(f"{name}: expected rank {r} to hold {sum(chunks[r])} tokens of N = {n} "
                             f"(the {'causal' if causal else 'unmasked'} layout of `shard`), got {lens[r]}")
    return chunks


def _packed(x):
    """[B, H, n, d] -> the varlen layout [B * n, H, d] (a copy unless B == 1)."""
    return x.transpose(1, 2).reshape(x.shape[0] * x.shape[2], x.shape[1], x.shape[3])


def _unpacked(x, B):
    """The varlen layout [B * n, H, d] -> [B, H, n, d]."""
    return x.view(B, x.shape[0] // B, x.shape[1], x.shape[2]).transpose(1, 2)


def _cu(B, n, device):
    import torch

    return torch.arange(0, (B + 1) * n, n, dtype=torch.int32, device=device)


def _blocks(r: int, s: int, p: int, causal: bool, chunks, window):
    """The sub-blocks rank r computes with the K/V of rank s: ``[(q_lo, q_hi, k_lo, k_hi, causal_flag,
    bounds)]`` in local rows. Without a window, `_step_plan`'s one block (bounds None). With ``window =
    (left, right)`` (causal folded in as right = 0): one block per pair of a q chunk and a k chunk that
    shares a visible pair, with the signed band ``bounds`` of `kernels.bwd.window_keep` that puts the
    global window on the block's bottom-right diagonal; pairs wholly outside the window are skipped."""
    if window is None:
        lo, hi, kh, cflag = _step_plan(r, s, causal, chunks[s], chunks[r])
        nk = sum(chunks[s]) if kh is None else kh
        return [(lo, hi, 0, nk, cflag, None)] if hi > lo and nk > 0 else []
    from attnscope.kernels.bwd import WINDOW_UNBOUNDED

    left, right = window
    sizes, starts = _bounds(sum(sum(c) for c in chunks), p, causal)

    def parts(rank):  # (local offset, global start, size) of each chunk the rank holds
        out, off = [], 0
        for j in _rank_chunks(rank, p, causal):
            out.append((off, starts[j], sizes[j]))
            off += sizes[j]
        return out

    blocks = []
    for q_off, q_start, na in parts(r):
        for k_off, k_start, nb in parts(s):
            dd = q_start - k_start  # row i's own position, in the block's key indices: i + dd
            first = 0 if left < 0 else max(0, dd - left)
            last = nb - 1 if right < 0 else min(nb - 1, na - 1 + dd + right)
            if na == 0 or nb == 0 or first > last:
                continue
            off = nb - na  # the kernel's bottom-right diagonal: i + off
            bounds = (WINDOW_UNBOUNDED if left < 0 else left + off - dd,
                      WINDOW_UNBOUNDED if right < 0 else right + dd - off)
            blocks.append((q_off, q_off + na, k_off, k_off + nb, False, bounds))
    return blocks


def _block_forward(q, k, v, causal, scale, softcap, bounds):
    """(o, lse) of one block: the dense kernel; with softcap or a window band (`bounds`: signed, off the
    diagonal) the varlen kernel, one sequence per batch row."""
    if not softcap and bounds is None:
        from attnscope.kernels.fwd import flash_attention

        return flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    from attnscope.kernels import varlen

    B, nq, nk = q.shape[0], q.shape[2], k.shape[2]
    o, lse = varlen._launch(_packed(q), _packed(k), _packed(v), _cu(B, nq, q.device), _cu(B, nk, q.device),
                            nq, nk, causal, scale, True, False, softcap=softcap, bounds=bounds)
    return _unpacked(o, B), lse.view(lse.shape[0], B, nq).transpose(0, 1)


def _block_backward(do, q, k, v, o, lse, causal, scale, softcap, bounds, dlse=None):
    """(dq, dk, dv) of one block, the kernels of `_block_forward` (``lse``: the merged one; ``dlse``: its
    rows' gradient, None for none)."""
    if not softcap and bounds is None:
        from attnscope.kernels.bwd import flash_attention_backward

        return flash_attention_backward(do, q, k, v, o, lse, causal, scale,
                                        **({} if dlse is None else {"dlse": dlse}))
    from attnscope.kernels.varlen_bwd import flash_attention_varlen_backward

    B, nq, nk = q.shape[0], q.shape[2], k.shape[2]
    lse_p, dlse_p = (None if x is None else x.transpose(0, 1).reshape(x.shape[1], B * nq)
                     for x in (lse, dlse))
    dq, dk, dv, _ = flash_attention_varlen_backward(
        *(_packed(t) for t in (do, q, k, v, o)), lse_p, _cu(B, nq, q.device), _cu(B, nk, q.device), nq, nk,
        causal, scale, softcap=softcap, bounds=bounds, dlse=dlse_p)
    return _unpacked(dq, B), _unpacked(dk, B), _unpacked(dv, B)


def _ring_forward(q, k, v, causal, scale, group, layout, softcap=0.0, sinks=None, window=None):
    import torch

    from attnscope.kernels._common import finite_sinks
    from attnscope.kernels.merge import merge_

    rank, p, chunks = layout  # `ring_attention`'s: (rank, P, each rank's (low, high) chunk lengths)
    ring = _Ring(group, rank, p)
    B, Hq, nq, d = q.shape
    o = torch.zeros(B, Hq, nq, d, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, nq), -float("inf"), dtype=torch.float32, device=q.device)
    kc, vc = k.contiguous(), v.contiguous()
    fresh = True  # nothing merged yet
    for step in range(p):
        src = (rank - step) % p
        reqs = None
        if step + 1 < p:  # post the exchange first so it overlaps this step's kernel
            (kn, vn), reqs = ring.pass_on([kc, vc], sum(chunks[(rank - step - 1) % p]))
        for lo, hi, k_lo, k_hi, cflag, bounds in _blocks(rank, src, p, causal, chunks, window):
            ob, lb = _block_forward(q[:, :, lo:hi], kc[:, :, k_lo:k_hi], vc[:, :, k_lo:k_hi], cflag, scale,
                                    softcap, bounds)
            if fresh and lo == 0 and hi == nq:  # the first block covers every row: no merge needed
                o.copy_(ob)
                lse.copy_(lb)
            else:
                merge_(o[:, :, lo:hi], lse[:, :, lo:hi], ob, lb)
            fresh = False
        if reqs is not None:
            for r_ in reqs:
                r_.wait()
            kc, vc = kn, vn
    if sinks is not None:  # the sink joins once, as one more partial (O = 0, LSE = sink): reference.combine
        sink_lse = finite_sinks(torch, sinks)[None, :, None].expand(B, Hq, nq).contiguous()
        merge_(o, lse, torch.zeros_like(o), sink_lse)
    return o.to(q.dtype), lse, chunks


def _ring_backward(do, q, k, v, o, lse, causal, scale, group, chunks, softcap=0.0, window=None, dlse=None):
    """Ring pass of dK/dV: dK/dV accumulators travel with their K/V and hop home after P steps. The blocks
    recompute P from the merged LSE (sink included), so a sink needs nothing here (`_sinks_grad`); the LSE's
    gradient ``dlse`` (None: none) joins each block's rows (``dS = P (dP - rowsum(dO O) + dLSE)``)."""
    import torch

    rank, p = _world(group)
    ring = _Ring(group, rank, p)
    dq = torch.zeros_like(q, dtype=torch.float32)
    kc, vc = k.contiguous(), v.contiguous()
    dkc = torch.zeros_like(kc, dtype=torch.float32)
    dvc = torch.zeros_like(vc, dtype=torch.float32)
    do = do.contiguous()
    for step in range(p):
        src = (rank - step) % p
        blocks = _blocks(rank, src, p, causal, chunks, window)
        reqs = None
        n_in = sum(chunks[(rank - step - 1) % p])
        if step + 1 < p:  # K/V for the next step can move now; dK/dV only after this step's kernel
            (kn, vn), reqs = ring.pass_on([kc, vc], n_in)
        for lo, hi, k_lo, k_hi, cflag, bounds in blocks:
            # sub-blocks as contiguous tensors: the block backward may assume a packed layout
            rows = [None if t is None else t[:, :, lo:hi].contiguous() for t in (do, q, o, lse, dlse)]
            dqb, dkb, dvb = _block_backward(rows[0], rows[1], kc[:, :, k_lo:k_hi].contiguous(),
                                            vc[:, :, k_lo:k_hi].contiguous(), rows[2], rows[3], cflag, scale,
                                            softcap, bounds, rows[4])
            dq[:, :, lo:hi] += dqb.float()
            dkc[:, :, k_lo:k_hi] += dkb.float()
            dvc[:, :, k_lo:k_hi] += dvb.float()
        greqs = []
        if p > 1:  # pass dK/dV on (after P-1 passes plus this final one they are home)
            (dkn, dvn), greqs = ring.pass_on([dkc, dvc], n_in)
        for r_ in list(reqs or []) + greqs:
            r_.wait()
        if p > 1:
            dkc, dvc = dkn, dvn
        if reqs is not None:
            kc, vc = kn, vn
    return dq.to(q.dtype), dkc.to(k.dtype), dvc.to(v.dtype)


def _sinks_grad(do, o, lse, sinks, dlse=None):
    """This rank's rows' share of dsinks[h] = -sum_rows exp(sink_h - LSE) (rowsum(dO * O) - dLSE); the
    ranks' shares add up to the whole (as every weight's gradient under context parallelism)."""
    import torch

    from attnscope.kernels._common import sink_weight

    delta = (do.float() * o.float()).sum(-1)  # [B, Hq, N_local]
    if dlse is not None:
        delta = delta - dlse
    return -(sink_weight(torch, sinks[None, :, None], lse) * delta).sum((0, 2))


def _autograd_fn():
    import torch

    class _RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, sinks, causal, scale, group, layout, softcap, window):
            o, lse, chunks = _ring_forward(q, k, v, causal, scale, group, layout, softcap, sinks, window)
            ctx.save_for_backward(q, k, v, o, lse, sinks)
            ctx.causal, ctx.scale, ctx.group, ctx.chunks = causal, scale, group, chunks
            ctx.softcap, ctx.window = softcap, window
            ctx.set_materialize_grads(False)  # an output the loss leaves out: None, not zeros
            return o, lse

        @staticmethod
        def backward(ctx, do, dlse):
            q, k, v, o, lse, sinks = ctx.saved_tensors
            do = torch.zeros_like(o) if do is None else do  # the loss reads only the LSE
            dq, dk, dv = _ring_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.group, ctx.chunks,
                                        ctx.softcap, ctx.window, dlse)
            dsinks = None if sinks is None else _sinks_grad(do, o, lse, sinks, dlse)
            grads = (dq, dk, dv, dsinks, None, None, None, None, None, None)
            if not torch.is_grad_enabled():
                return grads
            from attnscope.kernels.bwd_autograd import FirstOrderOnly  # create_graph=True: no 2nd derivative

            return FirstOrderOnly.wrap(grads, (*ctx.saved_tensors, do, dlse), "ring_attention")

    return _RingAttention


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scale: float | None = None, group: torch.distributed.ProcessGroup | None = None,
                   return_lse: bool = False, *, window: tuple[int, int] | None = None, softcap: float = 0.0,
                   sinks: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over a sequence sharded across the ranks of `group` (ring attention).

    Parameters
    ----------
    q : torch.Tensor, [B, Hq, N_local, d] — this rank's shard (`shard(q, causal)`), fp16 or bf16.
    k, v : torch.Tensor, [B, Hkv, N_local, d] — shards in the same layout; Hq a multiple of Hkv.
    causal : bool — token-level causal over the whole sequence (needs the causal layout of `shard`).
    scale : float, optional — softmax scale; defaults to 1/sqrt(d).
    group : torch.distributed ProcessGroup, optional — defaults to the world.
    return_lse : bool — also return the natural-log logsumexp of each local row (differentiable too).
    window : (left, right) or None, keyword-only — a sliding window over the whole sequence (flash-attn's
        ``window_size``; causal forces right = 0): each pair of a q chunk and a k chunk runs as one block
        with the window's band on it (the varlen kernels), pairs wholly outside the window are skipped.
    softcap : float, keyword-only — each block's scores capped as ``softcap * tanh(s / softcap)``.
    sinks : torch.Tensor, float32 [Hq], optional, keyword-only — counted once per row (merged as one
        extra partial after the ring, not per block); its gradient on each rank is that rank's rows' share.

    Returns
    -------
    o : [B, Hq, N_local, d], q's dtype (this rank's rows of the whole attention output);
    lse : [B, Hq, N_local], float32 — only when ``return_lse``.

    Every rank must pass the same B, heads, d, dtypes and options (one all_gather with the shard lengths
    checks them): a rank that differs, or whose own checks refuse its arguments, is an `InputError` on every
    rank naming the argument (or, on the others, the refusing rank), never a wrong result or a hang.

    Differentiable (w.r.t. q, k, v and sinks) when `attnscope.kernels.bwd` exists (ring pass of dK/dV);
    otherwise backward raises NotImplementedError. Example:
    ``o = unshard(ring_attention(*(shard(t, True) for t in (q, k, v)), causal=True), True)``.
    """
    import math

    import torch

    from attnscope.kernels._common import check_flags, check_mods, check_scale

    try:  # a rank whose own checks refuse still joins the gather, so no rank waits for it (`_agreed`)
        check_flags(causal=causal, return_lse=return_lse)
        check_scale(scale)
        _check_qkv(q, k, v)
        mods = check_mods(torch, causal, window, softcap, sinks, q.shape[1], q.device)
    except (InputError, NotImplementedError) as e:
        _agreed(q, group, RING_FACTS, None, refused=e)
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    band = (mods.left, mods.right) if mods.windowed else None
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    values = (q.shape[0], q.shape[1], k.shape[1], q.shape[3], q.dtype, k.dtype, v.dtype, causal, sm_scale,
              mods.softcap, *(band or (-1, -1)), sinks is not None, grad)
    rank, p, lens = _agreed(q, group, RING_FACTS, values)
    chunks = _chunk_sizes(lens, "q", causal, p)
    layout = (rank, p, chunks if causal else [(c[0], 0) for c in chunks])
    o, lse = _autograd_fn().apply(q, k, v, sinks, causal, sm_scale, group, layout, mods.softcap, band)
    return (o, lse) if return_lse else o
