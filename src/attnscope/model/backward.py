"""Logical HBM traffic of attention's backward pass, per (batch, query head), itemised.

Naive: what autograd of the eager forward keeps (softmax saves its output P; the eager causal path also
keeps its bool mask) and the kernels its backward launches. FA-2 (Dao 2023, Algorithm 2;
kernels/bwd.py): nothing N x N is kept; the backward reads Q, K, V, O, dO, LSE and D, with dQ either
accumulated by FP32 atomics or computed by a separate pass. Same ledger as model/traffic.py.

Score mods (`Config.window`, ``softcap``, ``sinks``): a window shrinks the tile pairs both passes visit
(model/tiles.py); the naive backward keeps and reads the window's mask as the eager causal one does, and a
softcap adds its backward kernel (it keeps tanh's output). The flash backward's softcap moves no byte;
sinks add ``sinks[h]`` read and ``dsinks[h]`` accumulated by the preprocess (`_sink_grad`).
"""

from __future__ import annotations

from attnscope.model.traffic import (
    SOFTMAX_FLOPS_PER_ELEMENT,
    STAT_BYTES,
    Config,
    Kernel,
    Row,
    Traffic,
    Transfer,
    ledgers,
    mods_note,
    pairs,
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
    masked = causal or c.masked(causal)  # the eager path keeps a mask (causal: always, as the forward)
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
    if masked:
        kernels.append(Kernel(f"{len(kernels) + 1}. masked_fill backward", c.nq * c.nk, "elementwise", (
            read("dS", s, "dS [Nq, Nk]"),
            read("mask", c.nq * c.nk, "bool mask [Nq, Nk], kept by the forward"),
            write("dS'", s, "dS' = dS.masked_fill(~mask, 0) [Nq, Nk]"))))
    if c.softcap:
        src = kernels[-1].transfers[-1].tensor
        kernels.append(Kernel(f"{len(kernels) + 1}. softcap backward", 3 * c.nq * c.nk, "elementwise", (
            read(src, s, f"{src} [Nq, Nk]"),
            read("T", s, "T = tanh(S / softcap) [Nq, Nk], kept by the forward"),
            write("dS_raw", s, "dS_raw = dS' * (1 - T^2) [Nq, Nk]"))))
    if c.sinks:
        kernels.append(Kernel(f"{len(kernels) + 1}. dsinks", 2 * c.nq, "elementwise", (
            read("P_sink", c.nq * c.b, "the sink's probabilities [Nq], kept by the forward"),
            read("D", c.nq * c.b, "D = rowsum(dP * P) [Nq], the softmax backward's row sums"),
            write("dsinks", STAT_BYTES, "dsinks[h] = -sum P_sink * D, one FP32"))))
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
    label = "Naive backward, causal eager (mask kept)" if causal else \
        "Naive backward, masked (mask kept)" if masked else "Naive backward, unmasked"
    return Row(name, label, c.condition(causal), name, tuple(kernels), (
        "the forward keeps P [Nq, Nk] (softmax saves its output; S is freed) and, masked, the mask",
        *(["softcap: the forward also keeps T = tanh(S / softcap) [Nq, Nk]"] if c.softcap else []),
        *(["sinks: the forward keeps the sink's probabilities [Nq] (a fused softmax with the sink)"]
          if c.sinks else []),
        "every [Nq, Nk] intermediate is written once and read back once per consumer (no L2 reuse)",
        "GQA: the K/V gradients' reduction over the group is not counted"))


def _flash_backward(c: Config, causal: bool, deterministic: bool) -> Row:
    """FA-2 backward (kernels/bwd.py), per (batch, query head). dK/dV programs per KV tile reuse the
    forward's tile pairs (loaded iff the forward loads them), reading Q, dO, LSE, D per pair; dQ either
    by fp32 atomics per pair (read-modify-write) or by a separate pass that re-reads K and V."""
    g = c.grid(causal)
    tile_pairs, _ = g.loaded_pairs()
    last_rows = c.nq - (g.n_q_tiles - 1) * c.block_q
    last = g.kv_tiles(g.n_q_tiles)  # the ragged last query tile's KV tiles
    q_rows = c.block_q * tile_pairs - (c.block_q - last_rows) * max(0, last.last - last.first + 1)  # Q rows
    kv_rows = g.kv_rows_total()  # K rows the dQ pass reads: the forward's
    share = c.heads // c.kv_heads  # a kv head's program serves its group of query heads
    kv = -(-c.nk * c.d * c.b // share)  # K (or V, dK, dV) bytes per query head, rounded up
    q = c.nq * c.d * c.b
    pair_flops = 2 * pairs(c, causal) * c.d  # one GEMM over visible pairs
    kernels = [
        Kernel("1. preprocess D = rowsum(dO * O)", 2 * c.nq * c.d, "elementwise", (
            read("O", q, "O [Nq, d]"), read("dO", q, "dO [Nq, d]"),
            write("D", c.nq * STAT_BYTES, "D, FP32 per row"), *_sink_grad(c, g.n_q_tiles))),
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
    label = f"FA-2 backward, {c.condition(causal)}, " + ("separate dQ pass" if deterministic else "atomic dQ")
    return Row(name, label, c.condition(causal),
               "naive-causal-eager-backward" if causal else "naive-backward", tuple(kernels), (
                   "nothing [Nq, Nk] is kept or written: P and dS are recomputed per tile from Q, K, LSE",
                   f"one tiling for both passes, B_r = {c.block_q}, B_c = {c.block_kv} (the kernels' own "
                   "table may differ: pass --block-q/--block-kv)",
                   "atomics counted as one FP32 read and one write per row and tile pair (no L2 merging)",
                   "K/V and dK/dV are per kv head, shown as their share per query head (GQA)",
                   *([f"window {c.window}: both passes visit only the {tile_pairs:,} tile pairs the forward "
                      "loads"] if c.window is not None else []),
                   *mods_note(c)))


def _sink_grad(c: Config, programs: int) -> list[Transfer]:
    """The sinks' backward traffic: the preprocess, one program per query tile holding D and LSE of its
    rows, reads ``sinks[h]`` and adds ``-sum_rows exp(sink - LSE) D`` to ``dsinks[h]`` (FP32) by one
    atomic, a 4 B read and a 4 B write per program."""
    if not c.sinks:
        return []
    return [read("sinks", programs * STAT_BYTES, f"sinks[h], one FP32 per preprocess program ({programs})"),
            read("dsinks", programs * STAT_BYTES, "atomic add into dsinks[h] (FP32): the read"),
            write("dsinks", programs * STAT_BYTES, "atomic add into dsinks[h]: the write; softcap and sinks "
                                                    "move no other byte")]


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
                     heads: int = 1, kv_heads: int | None = None, rows=BACKWARD_ROWS, window=None,
                     softcap: float = 0.0, sinks: bool = False) -> Traffic:
    """Logical HBM bytes of the backward pass, per (batch, query head), for each row of ``rows``
    (`BACKWARD_ROWS`). Parameters as `traffic`; the forward's traffic is not included.

    Returns
    -------
    Traffic: ``t.ratio("naive-backward", "flash-backward")`` is the unmasked reduction; causal rows
    compare against ``naive-causal-eager-backward``. Cost is constant in N (closed forms).
    """
    return ledgers(_BACKWARD_BUILDERS, rows, n, nq, nk, d=d, dtype=dtype, block_q=block_q,
                    block_kv=block_kv, batch=batch, heads=heads, kv_heads=kv_heads, window=window,
                    softcap=softcap, sinks=sinks)
