"""Logical HBM traffic of attention's backward pass, per (batch, query head), itemised.

Naive: what autograd of the eager forward keeps (softmax saves its output P; the eager causal path also
keeps its bool mask) and the kernels its backward launches. FA-2 (Dao 2023, Algorithm 2;
kernels/bwd.py): nothing N x N is kept; the backward reads Q, K, V, O, dO, LSE and D, with dQ either
accumulated by FP32 atomics or computed by a separate pass. Same ledger as model/traffic.py.
"""

from __future__ import annotations

from attnscope.model.traffic import (
    CAUSAL,
    SOFTMAX_FLOPS_PER_ELEMENT,
    STAT_BYTES,
    UNMASKED,
    Config,
    Kernel,
    Row,
    Traffic,
    causal_pairs,
    ledgers,
    read,
    write,
)


def _naive_backward(c: Config, causal: bool) -> Row:
    """Autograd of the eager forward: dP = dO V^T, dV = P^T dO, softmax backward, dQ = dS K, dK = dS^T Q
    (the scale folded into the GEMMs); causal eager adds the masked_fill backward, which reads the mask."""
    q = c.nq * c.d * c.b
    kv = c.nk * c.d * c.b
    s = c.nq * c.nk * c.b
    gemm = 2 * c.nq * c.nk * c.d
    kernels = [
        Kernel("1. GEMM dP = dO V^T", gemm, "tensor", (
            read("dO", q, "dO [Nq, d]"), read("V", kv, "V [Nk, d], saved by the forward"),
            write("dP", s, "dP [Nq, Nk], materialised"))),
        Kernel("2. GEMM dV = P^T dO", gemm, "tensor", (
            read("P", s, "P [Nq, Nk], saved by the forward (softmax keeps its output)"),
            read("dO", q, "dO [Nq, d]"), write("dV", kv, "dV [Nk, d]"))),
        Kernel("3. Softmax backward", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
            read("P", s, "P [Nq, Nk] read again"), read("dP", s, "dP [Nq, Nk] read back"),
            write("dS", s, "dS = P * (dP - rowsum(dP * P)) [Nq, Nk]"))),
    ]
    if causal:
        kernels.append(Kernel("4. masked_fill backward", c.nq * c.nk, "elementwise", (
            read("dS", s, "dS [Nq, Nk]"),
            read("mask", c.nq * c.nk, "bool mask [Nq, Nk], kept by the forward"),
            write("dS'", s, "dS' = dS.masked_fill(~mask, 0) [Nq, Nk]"))))
    n = len(kernels)
    kernels += [
        Kernel(f"{n + 1}. GEMM dQ = dS K", gemm, "tensor", (
            read("dS", s, "dS [Nq, Nk]"), read("K", kv, "K [Nk, d], saved by the forward"),
            write("dQ", q, "dQ [Nq, d]"))),
        Kernel(f"{n + 2}. GEMM dK = dS^T Q", gemm, "tensor", (
            read("dS", s, "dS [Nq, Nk] read again"), read("Q", q, "Q [Nq, d], saved by the forward"),
            write("dK", kv, "dK [Nk, d]"))),
    ]
    name = "naive-causal-eager-backward" if causal else "naive-backward"
    label = "Naive backward, causal eager (mask kept)" if causal else "Naive backward, unmasked"
    return Row(name, label, CAUSAL if causal else UNMASKED, name, tuple(kernels), (
        "the forward keeps P [Nq, Nk] (softmax saves its output; S is freed) and, causal eager, the mask",
        "every [Nq, Nk] intermediate is written once and read back once per consumer (no L2 reuse)",
        "GQA: the K/V gradients' reduction over the group is not counted"))


def _flash_backward(c: Config, causal: bool, deterministic: bool) -> Row:
    """FA-2 backward (kernels/bwd.py), per (batch, query head). dK/dV programs per KV tile reuse the
    forward's tile pairs (loaded iff the forward loads them), reading Q, dO, LSE, D per pair; dQ either
    by fp32 atomics per pair (read-modify-write) or by a separate pass that re-reads K and V."""
    g = c.grid(causal)
    pairs, _ = g.loaded_pairs()
    last_rows = c.nq - (g.n_q_tiles - 1) * c.block_q
    q_rows = c.block_q * pairs - (c.block_q - last_rows) * g.kv_bounds(g.n_q_tiles)[1]  # Q rows read
    kv_rows = g.kv_rows_total()  # K rows the dQ pass reads: the forward's
    share = c.heads // c.kv_heads  # a kv head's program serves its group of query heads
    kv = -(-c.nk * c.d * c.b // share)  # K (or V, dK, dV) bytes per query head, rounded up
    q = c.nq * c.d * c.b
    pair_flops = 2 * (causal_pairs(c) if causal else c.nq * c.nk) * c.d  # one GEMM over visible pairs
    kernels = [
        Kernel("1. preprocess D = rowsum(dO * O)", 2 * c.nq * c.d, "elementwise", (
            read("O", q, "O [Nq, d]"), read("dO", q, "dO [Nq, d]"),
            write("D", c.nq * STAT_BYTES, "D, FP32 per row"))),
        Kernel("2. LSE -> log2 domain", c.nq, "elementwise", (
            read("LSE", c.nq * STAT_BYTES, "LSE, FP32 per row"),
            write("LSE2", c.nq * STAT_BYTES, "LSE * log2(e), FP32 per row"))),
    ]
    t = [read("K", kv, "K [Nk, d], read once per kv head (shared by the group)"),
         read("V", kv, "V [Nk, d], read once per kv head"),
         read("Q", q_rows * c.d * c.b, f"Q rows of every loaded tile pair ({q_rows / c.nq:g} passes over Q)"),
         read("dO", q_rows * c.d * c.b, "dO, the same rows as Q"),
         read("LSE2", q_rows * STAT_BYTES, "LSE2, the same rows"),
         read("D", q_rows * STAT_BYTES, "D, the same rows"),
         write("dK", kv, "dK [Nk, d], reduced over the group in registers"),
         write("dV", kv, "dV [Nk, d]")]
    if deterministic:
        kernels.append(Kernel("3. dK/dV (per KV tile)", 4 * pair_flops, "tensor", tuple(t)))
        kernels.append(Kernel("4. dQ pass (per query tile)", 3 * pair_flops, "tensor", (
            read("Q", q, "Q [Nq, d]"), read("dO", q, "dO [Nq, d]"),
            read("LSE2", c.nq * STAT_BYTES, "LSE2"), read("D", c.nq * STAT_BYTES, "D"),
            read("K", kv_rows * c.d * c.b, f"K rows of every loaded KV tile ({kv_rows / c.nk:g} passes)"),
            read("V", kv_rows * c.d * c.b, "V, the same rows as K"),
            write("dQ", q, "dQ [Nq, d]"))))
    else:
        acc = c.nq * c.d * STAT_BYTES
        kernels.insert(0, Kernel("0. zero the FP32 dQ accumulator", 0, "elementwise", (
            write("dQacc", acc, "dQ accumulator [Nq, d], FP32"),)))
        t += [read("dQacc", q_rows * c.d * STAT_BYTES, "atomic add: FP32 dQ rows read per loaded tile pair"),
              write("dQacc", q_rows * c.d * STAT_BYTES, "atomic add: the same rows written back")]
        kernels.append(Kernel("3. dK/dV + atomic dQ (per KV tile)", 5 * pair_flops, "tensor", tuple(t)))
        kernels.append(Kernel("4. dQ FP32 -> input dtype", c.nq * c.d, "elementwise", (
            read("dQacc", acc, "dQ accumulator [Nq, d], FP32"), write("dQ", q, "dQ [Nq, d]"))))
    name = ("flash-causal-backward" if causal else "flash-backward") + ("-det" if deterministic else "")
    label = (f"FA-2 backward, {'causal' if causal else 'unmasked'}, "
             + ("separate dQ pass" if deterministic else "atomic dQ"))
    return Row(name, label, CAUSAL if causal else UNMASKED,
               "naive-causal-eager-backward" if causal else "naive-backward", tuple(kernels), (
                   "nothing [Nq, Nk] is kept or written: P and dS are recomputed per tile from Q, K, LSE",
                   f"one tiling for both passes, B_r = {c.block_q}, B_c = {c.block_kv} (the kernels' own "
                   "table may differ: pass --block-q/--block-kv)",
                   "atomics counted as one FP32 read and one write per row and tile pair (no L2 merging)",
                   "K/V and dK/dV are per kv head, shown as their share per query head (GQA)"))


_BACKWARD_BUILDERS = {
    "naive-backward": lambda c: _naive_backward(c, False),
    "flash-backward": lambda c: _flash_backward(c, False, False),
    "flash-backward-det": lambda c: _flash_backward(c, False, True),
    "naive-causal-eager-backward": lambda c: _naive_backward(c, True),
    "flash-causal-backward": lambda c: _flash_backward(c, True, False),
    "flash-causal-backward-det": lambda c: _flash_backward(c, True, True),
}
BACKWARD_ROWS = tuple(_BACKWARD_BUILDERS)


def backward_traffic(n: int | None = 4096, d: int = 128, dtype: str = "fp16", block_q: int = 128,
                     block_kv: int = 64, *, nq: int | None = None, nk: int | None = None, batch: int = 1,
                     heads: int = 1, kv_heads: int | None = None, rows=BACKWARD_ROWS) -> Traffic:
    """Logical HBM bytes of the backward pass, per (batch, query head), for each row of ``rows``
    (`BACKWARD_ROWS`). Parameters as `traffic`; the forward's traffic is not included.

    Returns
    -------
    Traffic: ``t.ratio("naive-backward", "flash-backward")`` is the unmasked reduction; causal rows
    compare against ``naive-causal-eager-backward``. Cost is constant in N (closed forms).
    """
    return ledgers(_BACKWARD_BUILDERS, rows, n, nq, nk, d=d, dtype=dtype, block_q=block_q,
                    block_kv=block_kv, batch=batch, heads=heads, kv_heads=kv_heads)
