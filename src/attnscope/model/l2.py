"""An L2-aware estimate of the DRAM bytes an attention call moves (what ``ncu`` measures; spec §6).

A byte is read from DRAM again when more than the L2 keeps was touched since its last use (its reuse
distance); `miss` maps distance / capacity to a miss fraction (0, then a ramp to 1). Closed forms, pure
Python, cost independent of N. Floor: Q, K, V read and O (+ LSE) written once from a cold L2 (ncu evicts
it); anything below is a named credit (O still dirty at the end).

- Naive attention (`_naive`): S (S', P) written by one kernel and read back by the next; LRU stack
  distances in closed form decide which intermediates are re-read from the L2 and left dirty there.
- Fused kernels (`_fused`): CTAs start in grid order (`KERNELS`, `kernel_of`), C = SMs x CTAs/SM at a
  time, the CTAs of one (batch, kv head) consecutive; model/l2_reuse.py counts the K/V re-reads of each
  launch order: lockstep waves (`wave_pairs`, `lockstep_rereads`), causal forward and backward walkers
  (`wave_rereads`, `head_gap_rereads`, `launch_fill_share`), attnscope's persistent causal schedule
  (`paired_rereads`), GQA heads split by the batch (`batch_gap_rereads`, `hot_miss`).
- Room: a K/V tile read by CTAs on both L2 partitions is held twice (`COPIES`: re-reads miss from
  `L2Params.shared` of the L2; unmasked MHA sets: `L2Params.for_lockstep`, `for_wide`); a CTA's Q and O
  take less room (`L2Params.qo_weight`); dead dirty spill frames (`spill_bytes`) reach DRAM unless reused
  first (`L2Params.frame_fill_share`).
- Writes (`_retained`): what is still dirty in the L2 at the end is not counted.
- Where it makes no +-10 % promise (`not_modelled`): FA-2's d 128 causal GQA at B > 1 from a hot footprint
  on, where the H200's counters of one call move more than that between runs.

The constants (model/l2_params.py: `L2Params`, the one table of them, and the kernels' geometry) each say
whether they are measured on the H200, read from a kernel's source, or assumed; `L2Params.hot` is fitted
to an attention kernel's own counters, and the structure was developed on the recorded sweeps, so only a
fresh grid tests it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from attnscope.errors import choice, expect, finite_real, positive_int
from attnscope.model import dispatch, roofline
from attnscope.model import traffic as _traffic
from attnscope.model.l2_params import (  # noqa: F401 - the estimate's parameters, reachable as l2.X
    COPIES,
    FA2_FRAME,
    FA2_STACK,
    H200_L2_PARAMS,
    HOPPER_KERNELS,
    KERNELS,
    Kernel,
    L2Params,
    hot_knots,
    hot_miss,
    mean_miss,
    miss,
)
from attnscope.model.l2_reuse import (  # noqa: F401 - its re-read terms, reachable as l2.X
    PAIRED_ROUNDS,
    batch_gap_rereads,
    head_gap_rereads,
    launch_fill_share,
    lockstep_rereads,
    paired_rereads,
    wave_pairs,
    wave_rereads,
)
from attnscope.model.tiles import Grid, cdiv

IMPLS = ("naive", "flash", "cudnn", "efficient", "attnscope")
STAT_BYTES = _traffic.STAT_BYTES

_WRITES_LSE = {impl: k[128].lse for impl, k in KERNELS.items()}


@dataclass
class KernelEstimate:
    """One kernel of the call: logical bytes (cold cache) and the L2-aware DRAM estimate, whole call."""

    name: str
    logical_read: int = 0
    logical_write: int = 0
    read: int = 0
    write: int = 0

    @property
    def total(self) -> int:
        return self.read + self.write

    def to_json(self) -> dict:
        return {"kernel": self.name, "logical_read": self.logical_read, "logical_write": self.logical_write,
                "read": self.read, "write": self.write, "total": self.total}


class KernelTotals:
    """Read, write and total bytes summed over ``self.kernels`` (each with ``read`` and ``write``): the one
    definition shared by the estimate here and the ncu measurement (`measure.ncu.Measured`)."""

    @property
    def read(self) -> int:
        return sum(k.read for k in self.kernels)

    @property
    def write(self) -> int:
        return sum(k.write for k in self.kernels)

    @property
    def total(self) -> int:
        return self.read + self.write


@dataclass
class Estimate(KernelTotals):
    """The estimate for one call (bytes for the whole call; ``per_head`` divides by batch x heads).

    ``compulsory``: Q, K, V read once and O (+ LSE) written once. ``credits``: (reason, bytes) by which the
    estimate is below the compulsory bytes, each named; ``total >= compulsory - sum(credits)`` always.
    """

    impl: str
    params: dict
    kernels: list[KernelEstimate] = field(default_factory=list)
    compulsory: int = 0
    credits: list[tuple[str, int]] = field(default_factory=list)

    @property
    def logical_total(self) -> int:
        return sum(k.logical_read + k.logical_write for k in self.kernels)

    def per_head(self, nbytes: int) -> float:
        return nbytes / (self.params["batch"] * self.params["heads"])

    def to_json(self) -> dict:
        return {"impl": self.impl, "params": self.params, "read": self.read, "write": self.write,
                "total": self.total, "logical_total": self.logical_total, "compulsory": self.compulsory,
                "credits": [list(c) for c in self.credits], "kernels": [k.to_json() for k in self.kernels]}


def _retained(start: float, size: float, t_end: float, cap: float, total_span: float | None = None) -> float:
    """Bytes of a buffer of ``size`` written uniformly over insertion-times [start, start + span] still
    resident at ``t_end`` under random replacement once ``cap`` bytes have been inserted: a byte inserted at
    t survives to ``t_end`` with exp(-max(0, t_end - max(t, cap)) / cap), integrated in closed form."""
    span = size if total_span is None else total_span
    if size <= 0 or span <= 0:
        return 0.0
    a, b = start, start + span
    # below cap the survival is exp(-(t_end - cap)/cap), constant; above it exp(-(t_end - t)/cap)
    lo = min(max(a, 0.0), cap)
    hi = min(b, cap)
    part1 = max(0.0, hi - lo) * math.exp(-max(0.0, t_end - cap) / cap)
    a2, b2 = max(a, cap), max(b, cap)
    part2 = 0.0
    if b2 > a2:
        part2 = cap * (math.exp(-max(0.0, t_end - b2) / cap) - math.exp(-max(0.0, t_end - a2) / cap))
    return size / span * (part1 + part2)


def kernel_of(impl: str, d: int, causal: bool, dtype: str = "fp16", n: int = 4096,
              attnscope_impl: str = "auto", batch: int = 1, heads: int = 32, kv_heads: int | None = None,
              sms: int = 132) -> tuple[str, Kernel]:
    """(name, `Kernel`) of what ``impl`` runs for head dim ``d``, ``causal``, N = ``n`` (Nq = Nk) on an
    sm_90 GPU with ``sms`` SMs: for attnscope with ``attnscope_impl="auto"`` (what
    `attnscope.flash_attention` runs by default) the Gluon variant `model.dispatch.hopper_variant` picks for
    the launch (``batch``, ``heads``, ``kv_heads``; the same for every ``dtype``), else (or with "portable")
    its portable kernel; ``KERNELS`` for the others."""
    choice("impl", impl, tuple(KERNELS))
    choice("attnscope_impl", attnscope_impl, ("auto", "portable"))
    if impl == "attnscope" and attnscope_impl == "auto":
        hkv = heads if kv_heads is None else kv_heads
        variant = dispatch.hopper_variant(d, causal, batch, heads, hkv, n, n, sms)
        if variant is not None:
            table = HOPPER_KERNELS[variant]
            return variant, table[min(table, key=lambda x: (abs(x - d), x))]
    impl_name = "attnscope portable" if impl == "attnscope" else impl
    table = KERNELS[impl]
    near = min((x for x in table if x > 0), key=lambda x: (abs(x - d), x))
    return impl_name, table.get(-near if causal else near) or table[near]


def hot_footprint(batch: int, kv_set: float, l2_bytes: float) -> float:
    """FA-2's hot-set footprint with GQA at B > 1, a share of the L2 (`hot_miss`'s argument): a line of one
    kv head's K/V set (``kv_set`` bytes) is re-used after the other B - 1 batches' sets and half its own."""
    return (batch - 0.5) * kv_set / l2_bytes


#: Head dims the estimate's probes and held-out grids measured (`measure.physical` sweeps only these).
VALIDATED_HEAD_DIMS = (64, 128)


def not_modelled(impl: str, n: int, d: int, heads: int, batch: int = 1, dtype: str = "fp16",
                 causal: bool = False, *, kv_heads: int | None = None, l2_bytes: int | None = None,
                 device: str = "h200", params: L2Params = H200_L2_PARAMS) -> str | None:
    """Why `estimate` makes no +-10 % promise for this call (one line), or None where it does: a head dim
    outside `VALIDATED_HEAD_DIMS` (no probe or held-out point measured one); SDPA FLASH (FA-2's d 128
    kernel) causal at B > 1 with several K/V heads (`hot_knots`' ``hot_groups``) at a hot footprint
    (`hot_footprint`) of ``params.hot_groups_modelled_below`` x the L2 or more, where repeated runs of one
    call move by more than a +-10 % band can hold (`L2Params.hot_groups_modelled_below` names them).
    `estimate` still computes the call (what the curve gives); the sweeps report no estimate for it."""
    if d not in VALIDATED_HEAD_DIMS:
        return (f"not modelled: head dim {d}: the estimate's constants were fitted and checked at d "
                f"{' and '.join(map(str, VALIDATED_HEAD_DIMS))} only (probes and held-out grids, H200)")
    hkv = heads if kv_heads is None else kv_heads
    if not (impl == "flash" and causal and d > 64 and batch > 1 and 1 < hkv < heads):
        return None
    l2 = roofline.device(device).l2 if l2_bytes is None else l2_bytes
    foot = hot_footprint(batch, 2 * n * d * _traffic.DTYPE_BYTES[dtype], l2)
    if foot < params.hot_groups_modelled_below:
        return None
    return (f"not modelled: FA-2 d {d} causal at B {batch} with {hkv} K/V heads, a hot footprint of "
            f"{foot:.2f} x L2 (>= {params.hot_groups_modelled_below}): repeated runs of one such call moved "
            "by up to 32 % on the H200, more than a +-10 % estimate can hold "
            "(L2Params.hot_groups_modelled_below)")


def spill_bytes(ker: Kernel, ctas: int, nq: int, nk: int) -> int:
    """Local-memory (register spill) bytes the CTAs of a kernel touch: each CTA's threads write their
    frame (``ker.frame``: FA-2's Is_even_MN kernel when N is a multiple of both blocks, else the ragged
    one). L1 writes local stores through to the L2, where the lines stay dirty."""
    even = nq % ker.block_q == 0 and nk % ker.block_kv == 0
    return ctas * ker.threads * ker.frame[0 if even else 1]


def dead_frame_evicted(inserted: float, ctas: int, concurrent: int, cap: float) -> float:
    """Fraction of the finished CTAs' dead (dirty) spill frames written back to DRAM: evicted before a new
    CTA takes the same warp slots and re-dirties them, `L2Params.slot_reuse_lifetimes` CTA lifetimes later.
    In one lifetime the machine inserts ``inserted`` x concurrent / ctas bytes; a line survives D inserted
    bytes with exp(-D / cap) (random replacement, `_retained`); a call whose insertions fit evicts nothing."""
    for name, x in (("inserted", inserted), ("cap", cap)):
        expect(finite_real(x) and x >= 0, name, "a finite number >= 0", x)
    positive_int("ctas", ctas)
    positive_int("concurrent", concurrent)
    expect(cap > 0 or inserted == 0, "cap", "a positive capacity when inserted > 0", cap)
    if inserted <= cap:
        return 0.0
    per_life = inserted * min(concurrent, ctas) / max(ctas, 1)
    return 1.0 - math.exp(-H200_L2_PARAMS.slot_reuse_lifetimes * per_life / cap)


def _fused(est: Estimate, impl: str, nq: int, nk: int, d: int, b: int, batch: int, heads: int, kv_heads: int,
           causal: bool, l2: int, sms: int, cap: float, params: L2Params, per_sm: int | None,
           dtype: str = "fp16", attnscope_impl: str = "auto", kernel: Kernel | None = None) -> None:
    name, ker = kernel_of(impl, d, causal, dtype, max(nq, nk), attnscope_impl, batch, heads, kv_heads, sms)
    ker = ker if kernel is None else kernel
    per_sm = ker.ctas_per_sm if per_sm is None else per_sm
    c = sms * per_sm
    g = Grid(nq, nk, ker.block_q, ker.block_kv, causal=causal)
    tr = g.n_q_tiles
    bh = batch * heads
    group = heads // kv_heads
    adjacent = group if (ker.order == "hb" or batch == 1) else 1  # GQA heads adjacent in the launch order
    sets = batch * kv_heads * (group // adjacent)  # K/V sets as the order sees them (a set re-used later
    per_set = tr * adjacent  # by non-adjacent query heads counts as another set)
    kv_set = 2 * nk * d * b
    mean_rows = g.kv_rows_total() / tr
    frac = mean_rows / nk  # mean share of K/V a CTA loads
    spread = g.kv_rows_loaded(tr) / mean_rows if causal else 1.0
    spill = spill_bytes(ker, bh * tr, nq, nk)
    q_o = 2 * ker.block_q * d * b * params.qo_weight()  # a CTA's Q and O tiles, in K/V bytes of L2 room
    # a CTA's spill frame: stored and re-loaded by one SM, the room of lines read by one SM
    frame = ker.threads * ker.frame[0 if nq % ker.block_q == 0 and nk % ker.block_kv == 0 else 1] * \
        params.private_weight()
    # unmasked MHA whose sets' readers fit in one wave of slots: E's pattern (`L2Params.for_lockstep`); more
    # readers than slots: E-wide's (`L2Params.for_wide`); GQA sets (read again by the group's other heads)
    # keep the shared parameters
    lockstep = not causal and group == 1 and per_set <= c
    wide = not causal and group == 1 and per_set > c
    kv_params = params.for_lockstep() if lockstep else params.for_wide() if wide else params.for_shared()
    q_o_kv = 2 * ker.block_q * d * b * (params.lockstep_qo if lockstep else params.wide_qo) \
        if lockstep or wide else q_o
    # FA-2's (m, b, h) grid with GQA at B > 1 (the batch's B sets in rotation): `hot_miss`, one measured
    # curve per FA-2 kernel (d 128: 128 x 64 tiles, one K/V head or several; d 64: 128 x 128, whose share is
    # several times lower): `hot_knots`
    hot = causal and adjacent < group
    if hot:  # the re-reads as if the L2 kept nothing, scaled by the measured share below (`hot_miss`)
        kv_params = replace(kv_params, capacity=1e-9)
    if impl == "attnscope" and causal and ker.persistent:  # kernels/fwd_hopper.py `_work`: lockstep pairs
        amp = 1.0 + paired_rereads(sets, group, tr, g.n_kv_tiles, c, 2 * ker.block_kv * d * b, q_o,
                                   kv_params.capacity * l2, lambda t: g.kv_bounds(t + 1)[1], kv_params.ramp)
    else:
        amp = wave_rereads(sets, per_set, c, kv_set, q_o_kv, causal, ker.backward, "head", l2_bytes=l2,
                           spread=spread, share=frac if causal else 1.0, heads_per_set=adjacent,
                           distinct_sets=batch * kv_heads, schedule="static" if ker.persistent else "dynamic",
                           group_batch=(group, batch) if adjacent < group else None,
                           frame_bytes=frame, params=kv_params)
    kq, ko = bh * nq * d * b, bh * nq * d * b
    kv_once = batch * kv_heads * kv_set
    extra = (amp - 1.0) * sets * kv_set
    if adjacent < group and not causal:  # GQA with the batch between a group's heads, lockstep waves
        extra += (group - 1) * batch * kv_heads * kv_set * \
            batch_gap_rereads(batch, group, kv_heads, tr, c, kv_set, c * q_o, kv_params.capacity * l2,
                              kv_params.ramp)
    elif adjacent < group:  # causal: each later head re-reads the top of the set after a gap of the other
        # batches' pairs (B - 1) T launches long, over which the machine touches their sets' tiles, Q/O and
        # frames (`head_gap_rereads` with ``batch``)
        extra += (group - 1) * batch * kv_heads * kv_set * head_gap_rereads(
            tr, c, kv_set, q_o, frame, spread, kv_params.capacity * l2, kv_params.ramp, batch)
    if hot:
        extra *= hot_miss(hot_footprint(batch, kv_set, l2), hot_knots(d, kv_heads, params))
    elif impl == "flash" and causal:  # the re-reads ramp up as the L2 fills after the launch
        extra *= launch_fill_share(bh * tr / c)
    lse = bh * nq * STAT_BYTES if ker.lse else 0
    k = KernelEstimate(f"{name} forward (fused)")
    k.logical_read = kq + bh * 2 * g.kv_rows_total() * d * b
    k.logical_write = ko + lse + spill
    k.read = int(round(kq + kv_once + min(extra, k.logical_read - kq - kv_once)))
    out = ko + lse
    if impl == "flash" and bh * tr < 0.8 * 2 * sms:  # FA-2's split-KV heuristic: fp32 partial O + LSE per
        # split, read back by the combine kernel: resident when they fit
        n_splits = max(1, min(128, int(0.8 * 2 * sms) // max(1, bh * tr), cdiv(nk, 128)))
        partial = n_splits * bh * nq * (d * 4 + STAT_BYTES) if n_splits > 1 else 0
        overflow = max(0.0, partial - cap)
        k.read += int(overflow)
        k.write += int(overflow)
    # the frames of the last C CTAs are live (and dirty) when the kernel ends: only the others die early
    ctas = bh * tr
    dead = spill * max(0, ctas - c) / ctas * dead_frame_evicted(k.read + out, ctas, c, cap)
    if impl == "flash" and causal and d == 64 and group == 1:  # the measured domain of the fill-driven term
        fills = params.fill_per_read * k.read - l2
        spill = max(dead, min(params.frame_writebacks_max * spill, params.frame_fill_share * max(0.0, fills)))
    else:
        spill = dead
    # O is written as the CTAs finish: spread over the kernel's whole stream of insertions; what is still
    # dirty in the L2 at the end is not counted (credited). The stream is counted in the re-read model's room
    # (K/V bytes: a line on both partitions; Q and O at `L2Params.qo_weight`, frames at `private_weight`)
    # against the shared capacity, so a call of mostly Q and O (MQA) keeps more of O than one of K/V
    w = params.qo_weight()
    room = (k.read - kq) + (kq + out) * w + spill * params.private_weight()
    kept = _retained(0.0, out * w, room, params.shared * l2, total_span=room) / w
    k.write += int(round(out + spill - kept))
    est.kernels.append(k)
    if kept >= 1:
        est.credits.append((DIRTY_O, int(round(kept))))


def _naive(est: Estimate, nq: int, nk: int, d: int, b: int, bh: int, causal: bool, cap: float,
           ramp: float = H200_L2_PARAMS.ramp) -> None:
    """GEMM 1 (S = QK^T), [masked_fill], softmax, GEMM 2 (O = PV), each over all (batch, head) in order.

    LRU stack distances (the distinct bytes touched between two uses of a byte), closed form. Each kernel
    after GEMM 1 reads the previous one's buffer B_j in the order it was written and writes its own (S',
    P: the same size; O). The byte at fraction x of B_j is re-read after the rest of its writer ((1 - x)
    of the writer's input and of B_j) and the start of its reader (x of B_j and of the reader's output and
    extras): D1(x), linear in x; that re-read misses with `miss` (D1 / cap). A dirty byte reaches DRAM
    when it is evicted before the call ends: its re-read missed, or it hit and D2, the distinct bytes from
    its re-read to the end, passes the capacity (`_mean_miss_pl`: LRU after a hit); what is still
    dirty at the end is not counted (O: `DIRTY_O`). The causal bool mask (1 B per element, the same for
    every head) is cold once, then re-read one head's S and S' later. With a step curve (``ramp`` -> 1)
    this is exact LRU (tests: a brute-force LRU of the same trace).
    """
    s = bh * nq * nk * b
    qk, v, o = 2 * bh * nq * d * b, bh * nk * d * b, bh * nq * d * b
    m = nq * nk if causal else 0

    def mask(x):  # distinct mask bytes a window over fraction x of the masked_fill touches
        return m * min(1.0, max(0.0, x) * bh)

    # the chain: (kernel, cold input read besides the previous buffer, output bytes, extra distinct bytes
    # a window over fraction x of the kernel touches)
    chain = [("GEMM (QK^T)", qk, s, lambda x: 0.0)] + ([("masked_fill", 0, s, mask)] if causal else []) + \
        [("softmax", 0, s, lambda x: 0.0), ("GEMM (PV)", v, o, lambda x: v * x)]
    kinks = (0.0, 1.0 / bh, 1.0 - 1.0 / bh, 1.0)  # where the mask's window saturates
    ks = [KernelEstimate(name, inp + (s if i else 0) + (bh * m if name == "masked_fill" else 0), out)
          for i, (name, inp, out, _) in enumerate(chain)]
    est.kernels.extend(ks)
    ks[0].read, ks[-1].read = qk, v
    # distinct bytes of kernels i.. in full (outputs and extras; each one's input is counted before it)
    after = [sum(c[2] + c[3](1.0) for c in chain[i:]) for i in range(len(chain))] + [0.0]
    for j in range(len(chain) - 1):  # B_j: written by kernel j, read by kernel j + 1
        with_bj = chain[j][1] if j == 0 else s  # what kernel j reads while writing B_j
        e_w, (_, _, out_r, e_r) = chain[j][3], chain[j + 1]

        def d1(x, with_bj=with_bj, e_w=e_w, e_r=e_r, out_r=out_r):
            return (1 - x) * (with_bj + s) + e_w(1 - x) + x * (s + out_r) + e_r(x)

        def d2(x, e_r=e_r, out_r=out_r, j=j):  # the rest of the reader; the next kernel re-reads its start
            nxt = x * out_r + after[j + 2] if j + 2 < len(chain) else 0.0
            return (1 - x) * (s + out_r) + e_r(1 - x) + nxt

        ks[j + 1].read += int(round(s * _mean_miss_pl(d1, kinks, cap, ramp)))
        ks[j].write += int(round(s * _mean_miss_pl(d1, kinks, cap, ramp, d2)))
    if causal:  # the mask: cold once, then re-read after one head's S and S' (and the mask)
        ks[1].read += int(round(m + (bh - 1) * m * miss((2 * s / bh + m) / cap, ramp)))
    # O: the byte at x is followed by the rest of GEMM 2, (1 - x) of P, V and O, and nothing else
    wb = o * _mean_miss_pl(lambda x: (1 - x) * (s + v + o), kinks, cap, ramp)
    ks[-1].write += int(round(wb))
    if o - wb >= 1:
        est.credits.append((DIRTY_O, int(round(o - wb))))


def _mean_miss_pl(d1, knots: tuple, cap: float, ramp: float, d2=None) -> float:
    """Mean over x in [0, 1] of the fraction of a byte that reaches DRAM: its re-read after D1 = d1(x)
    misses (`miss`), or, given ``d2``, it hit and was then evicted before the end, D2 = d2(x) > cap (a byte
    re-read from the L2 is promoted and ages like LRU, a step at the capacity; the measured ramp past the
    capacity is that of bytes not re-used since they were inserted). d1, d2 linear between the ``knots``;
    the segments are split where d2 crosses the capacity: exact (`mean_miss` per piece)."""
    xs = sorted({min(1.0, max(0.0, k)) for k in knots} | {0.0, 1.0})
    cuts = set(xs)
    for a, c in itertools.pairwise(xs):
        da, dc = (d2(a) - cap, d2(c) - cap) if d2 else (0.0, 0.0)
        if da * dc < 0:
            cuts.add(a + (c - a) * da / (da - dc))
    total = 0.0
    for a, c in itertools.pairwise(sorted(cuts)):
        if c <= a:
            continue
        if d2 and d2((a + c) / 2) > cap:
            total += c - a
        else:
            fa, fc = d1(a) / cap, d1(c) / cap
            total += (c - a) * mean_miss(min(fa, fc), max(fa, fc), ramp)
    return total


DIRTY_O = ("O still dirty in the write-back L2 when the call ends (ncu counts a write only when its line is "
           "evicted)")


def compulsory(impl: str, n: int, d: int, heads: int, batch: int = 1, dtype: str = "fp16",
               kv_heads: int | None = None) -> int:
    """Q, K, V read once and O (+ the implementation's LSE) written once, bytes for the whole call."""
    choice("impl", impl, IMPLS)
    b = _traffic.DTYPE_BYTES[choice("dtype", dtype, _traffic.DTYPE_BYTES)]
    hkv = heads if kv_heads is None else kv_heads
    for name, v in (("n", n), ("d", d), ("heads", heads), ("batch", batch), ("kv_heads", hkv)):
        positive_int(name, v)
    lse = batch * heads * n * STAT_BYTES if _WRITES_LSE.get(impl, False) else 0
    return batch * n * d * b * (2 * heads + 2 * hkv) + lse


def estimate(impl: str, n: int = 4096, d: int = 128, heads: int = 32, batch: int = 1, dtype: str = "fp16",
             causal: bool = False, *, kv_heads: int | None = None, l2_bytes: int | None = None,
             sms: int | None = None, device: str = "h200", ctas_per_sm: int | None = None,
             l2_fraction: float | None = None, ramp: float | None = None,
             attnscope_impl: str = "auto", kernel: Kernel | None = None) -> Estimate:
    """L2-aware estimate of the DRAM bytes of one attention call (whole call; see the module docstring).

    Parameters
    ----------
    impl: naive (the explicit 3-kernel baseline; causal adds a masked_fill kernel), flash, cudnn,
        efficient or attnscope (fused).
    n, d, heads, batch, dtype, causal: the call, inputs ``[batch, heads, n, d]`` (4096, 128, 32, 1, fp16).
    kv_heads: K/V heads (GQA; default ``heads``); naive needs ``kv_heads == heads``.
    l2_bytes, sms: the device's L2 capacity and SM count; default to ``device``'s entry in
        model/roofline.py (pass the values read from the running GPU where there is one).
    ctas_per_sm: co-resident CTAs per SM of a fused kernel (default: `KERNELS`).
    l2_fraction, ramp: override `H200_L2_PARAMS` (capacity as a fraction of the L2; see `miss`).
    attnscope_impl: "auto" (the Gluon variant `model.dispatch.hopper_variant` picks for the call, else the
        portable kernel: what ``attnscope.flash_attention`` runs) or "portable" (measurements taken while
        that table was empty); `kernel_of`.
    kernel: a fused kernel's geometry (`Kernel`) where a measurement shows it ran another one than
        `kernel_of` names (default: `kernel_of`'s), e.g. an ncu record's block size and grid.

    Returns
    -------
    Estimate: ``.total`` bytes for the call, ``.per_head(.total)``, ``.kernels``, ``.compulsory``,
    ``.credits``.
    """
    choice("impl", impl, IMPLS)
    for name, v in (("n", n), ("d", d), ("heads", heads), ("batch", batch)):
        positive_int(name, v)
    hkv = heads if kv_heads is None else positive_int("kv_heads", kv_heads)
    expect(heads % hkv == 0, "kv_heads", f"a divisor of heads ({heads})", hkv)
    if impl == "naive" and hkv != heads:
        raise NotImplementedError("kv_heads: naive attention with kv_heads != heads is not modelled; "
                                  "supported: flash, cudnn, efficient, attnscope")
    b = _traffic.DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16", "fp32"))]
    frac = H200_L2_PARAMS.capacity if l2_fraction is None else l2_fraction
    expect(isinstance(frac, (int, float)) and 0 < frac <= 1, "l2_fraction", "a fraction in (0, 1]", frac)
    rp = H200_L2_PARAMS.ramp if ramp is None else ramp
    expect(isinstance(rp, (int, float)) and rp > 1, "ramp", "a number > 1", rp)
    scale = frac / H200_L2_PARAMS.capacity  # a given cyclic capacity scales the others alike
    h = H200_L2_PARAMS
    # a given ramp replaces every measured one
    params = replace(h, capacity=frac, ramp=rp, shared=min(1.0, h.shared * scale),
                     private=min(1.0, h.private * scale), lockstep=min(1.0, h.lockstep * scale),
                     wide=min(1.0, h.wide * scale),
                     **({} if ramp is None else {"shared_ramp": rp, "lockstep_ramp": rp, "wide_ramp": rp}))
    dev = roofline.device(device)
    l2 = dev.l2 if l2_bytes is None else positive_int("l2_bytes", l2_bytes)
    sms = dev.sms if sms is None else positive_int("sms", sms)
    per_sm = None if ctas_per_sm is None else positive_int("ctas_per_sm", ctas_per_sm)
    expect(kernel is None or isinstance(kernel, Kernel), "kernel", "an l2.Kernel or None", kernel)
    cap = frac * l2
    info = {"n": n, "d": d, "heads": heads, "kv_heads": hkv, "batch": batch, "dtype": dtype, "causal": causal,
            "l2_bytes": l2, "sms": sms, "l2_fraction": frac, "ramp": rp}
    est = Estimate(impl, info, compulsory=compulsory(impl, n, d, heads, batch, dtype, hkv))
    if impl == "naive":
        _naive(est, n, n, d, b, batch * heads, causal, cap, rp)
    else:
        _fused(est, impl, n, n, d, b, batch, heads, hkv, causal, l2, sms, cap, params, per_sm, dtype,
               attnscope_impl, kernel)
    # the floor: inputs are read at least once (cold L2); anything below the compulsory bytes is credited
    qkv = batch * n * d * b * (heads + 2 * hkv)
    assert est.read >= qkv - len(est.kernels), (est.read, qkv)
    assert est.total >= est.compulsory - sum(x for _, x in est.credits) - len(est.kernels) - 1, \
        (est.total, est.compulsory, est.credits)
    return est


def logical(impl: str, n: int = 4096, d: int = 128, heads: int = 32, batch: int = 1, dtype: str = "fp16",
            causal: bool = False) -> int:
    """Logical bytes of the call from model/traffic.py (whole call): the row that describes what runs.

    naive -> ``naive`` or ``naive-causal-eager`` (what `naive_attention` does: full S, a bool mask and
    an out-of-place masked_fill); fused -> ``flash`` or ``flash-causal`` with that implementation's
    tiles and its logsumexp write.
    """
    choice("impl", impl, IMPLS)
    if impl == "naive":
        row = "naive-causal-eager" if causal else "naive"
        t = _traffic.traffic(n, d, dtype, batch=batch, heads=heads, rows=(row,))
    else:
        ker = KERNELS[impl][128]
        row = "flash-causal" if causal else "flash"
        t = _traffic.traffic(n, d, dtype, ker.block_q, ker.block_kv, batch=batch, heads=heads,
                             lse=_WRITES_LSE[impl], rows=(row,))
    return t[row].total * t.config.batch_heads


def error(estimated: float, measured: float) -> float:
    """Relative error of an estimate against a measurement: estimated / measured - 1 (both finite reals,
    ``estimated >= 0``, ``measured > 0``, else `InputError` naming the argument)."""
    expect(finite_real(estimated) and estimated >= 0, "estimated", "a byte count >= 0", estimated)
    expect(finite_real(measured) and measured > 0, "measured", "a positive byte count", measured)
    return estimated / measured - 1.0
