"""An L2-aware estimate of the DRAM bytes an attention call moves (what ``ncu`` measures; spec §6).

A byte is read from DRAM again when more than the L2 keeps was touched since its last use (its reuse
distance); `miss` maps distance / capacity to a miss fraction (0, then a ramp to 1). Closed forms, pure
Python, cost independent of N. Floor: Q, K, V read and O (+ LSE) written once from a cold L2 (ncu evicts
it); anything below is a named credit (O still dirty at the end). Naive attention (`_naive`): S (S', P)
written by one kernel and read back by the next: LRU stack distances in closed form, where they fit the
intermediates are re-read and left dirty in the L2 without reaching DRAM. Fused kernels
(`_fused`, `wave_rereads`): CTAs start in grid order (`KERNELS`, `kernel_of`), C = SMs x CTAs/SM at a time,
the CTAs of one (batch, kv head) consecutive. A K/V tile is read by CTAs on both L2 partitions, so each
partition holds a copy (`COPIES`): K/V re-reads miss from 0.43 of the L2, a CTA's Q and O take less room
(`L2Params.qo_weight`); unmasked MHA sets take the parameters bench/l2_reuse.py measured for that pattern,
read by at most C readers (`L2Params.for_lockstep`) or by more (`L2Params.for_wide`). Unmasked CTAs run in
lockstep waves: the set a wave boundary cuts is re-read after
the rest of the a sets of one wave and the start of the b sets of the next; boundaries fall at multiples of
gcd(C, T) in a set of T CTAs (`wave_pairs`, exact). Causal: forward walkers a launch interval apart; a set
of FA-2's backward walkers stays live over its longest CTA plus the span its CTAs start over (C per mean
lifetime), its re-reads a window of W = s C CTAs apart that holds W / T to W / T + 1 sets (a causal CTA
reads up to its diagonal only: the window's newest set only as far as its CTAs launched), and where a K/V
set's next query head starts, its top tiles after a gap that the resident
spill frames lengthen (`head_gap_rereads`); a static persistent schedule a diagonal step apart;
attnscope's persistent causal schedule in lockstep round pairs (`paired_rereads`). GQA heads split by the
batch re-read their set: unmasked, only where a wave boundary falls between the two heads' CTAs, after the
waves between (`batch_gap_rereads`); causal, its top tiles after a gap (B - 1) T launches longer, over which
the other batches' sets are touched (`head_gap_rereads` with ``batch``); those re-reads scale by the
share of them the H200 measured to miss at the B sets' footprint (`hot_miss`). Spills
(`spill_bytes`): dead dirty frames reach DRAM unless reused first; FA-2's d 64 causal MHA frames as the
L2 fills (`FRAME_FILL_SHARE`). FA-2's causal re-reads ramp up over the first waves after the launch, while
the L2 fills (`launch_fill_share`).
Writes (`_retained`): what is still dirty in the L2 at the end is not counted (counted in the same room
as the re-reads: Q, O and frames take less than K/V). Each constant says
whether it is measured on the H200 (BENCHMARKS.md "attnscope bytes"), read from a kernel's source, or
assumed; one is fitted to an attention kernel's own counters (`L2Params.hot`, FA-2's hot sets: the
class the microbenchmarks did not reproduce), and the structure was developed on the recorded sweeps, so
only a fresh grid tests it.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from attnscope.errors import choice, expect, positive_int
from attnscope.model import roofline
from attnscope.model import traffic as _traffic
from attnscope.model.tiles import Grid, cdiv, persistent_item

IMPLS = ("naive", "flash", "cudnn", "efficient", "attnscope")
STAT_BYTES = _traffic.STAT_BYTES


class Kernel(NamedTuple):
    """What the estimate assumes about one fused kernel (see the module docstring: measured or assumed)."""

    block_q: int  # query rows per CTA
    block_kv: int  # K/V rows per step
    ctas_per_sm: int  # co-resident CTAs per SM
    order: str  # grid dims after the query tile, fastest first: "hb" (heads, then batch: a GQA group's
    # heads adjacent) or "bh" (batch, then heads: the other batches come between a group's heads)
    backward: bool  # causal K/V walked from the diagonal down (FlashAttention-2)
    lse: bool  # writes the FP32 logsumexp in an inference forward
    persistent: bool = False  # SMs x ctas_per_sm programs, program p takes tiles p, p + C, ... (static)
    threads: int = 128  # threads per CTA
    frame: tuple = (0, 0)  # local-memory (register spill) bytes each thread touches: (N a multiple of both
    # blocks, ragged N), of the variant that runs (see `spill_bytes`)


#: FA-2's forward kernels spill (255 registers): the local-memory bytes each thread of a CTA touches,
#: (Is_even_MN kernel, ragged kernel), by (head dim, causal). Measured on the H200 (bench/gpu/spill_probe.sh:
#: ncu's L1 store misses of local lines per CTA / 128 threads); the compiler's frames (cuobjdump -res-usage
#: STACK, same probe: `FA2_STACK`) bound them. d 64 unmasked was not probed: none (no excess DRAM writes).
FA2_FRAME = {(128, True): (74, 274), (128, False): (87, 24), (64, True): (23, 58), (64, False): (0, 0)}
FA2_STACK = {(128, True): (136, 376), (128, False): (144, 64), (64, True): (136, 208), (64, False): (112, 88)}
#: attnscope's portable kernel: ptxas's stack frame (bench/sm90_resources.py; d 64 none); the bytes touched
#: were not measured: half the frame (FA-2's touched / STACK above: median 0.5).
ATTNSCOPE_STACK = {(128, False): 104, (128, True): 120}
ATTNSCOPE_FRAME = {key: (st // 2, st // 2) for key, st in ATTNSCOPE_STACK.items()}
#: CTA lifetimes between a finished CTA and the next one that takes its warp slots (and so re-dirties its
#: dead local lines in the L2 before they are written back): assumed.
SLOT_REUSE_LIFETIMES = 2.0
#: FA-2's d 64 causal MHA frames, re-dirtied at every K/V step, are written back more than once per CTA, and
#: more the longer the call. Measured on the H200 (bench/gpu/l2_counters_probe.sh, B 1 H 24, N 8k-24k): the
#: frame write-back bytes are FRAME_FILL_SHARE of the L2's fills past its first L2, the fills are
#: FILL_PER_READ x the DRAM reads (lines copied from the other partition included), and no development point
#: writes a frame back more than FRAME_WRITEBACKS_MAX times (bench/l2_dev.py --spill flash).
FRAME_FILL_SHARE = 0.135
FILL_PER_READ = 1.82
FRAME_WRITEBACKS_MAX = 2.0

#: impl -> {head dim: Kernel}; a head dim not listed takes the nearest listed one; -d: the causal kernel
#: where it differs. flash: PyTorch's FA-2 fwd traits (d 128: <128, 128, 64, 4>, d 64: <64, 128, 128, 4>),
#: grid (m_blocks, b, h), n_block loop from the diagonal down; its template Is_even_MN (N a multiple of
#: both blocks) picks another, smaller-framed kernel. efficient: CUTLASS mem-eff 64 x 128, grid (m_blocks,
#: h, b). cudnn: sm90 flash fprop wgmma, a persistent grid of one CTA per SM (ncu); 128-row tiles in
#: (m, h, b) order assumed. attnscope: the portable kernel (kernels/fwd.py CONFIG_TABLE), grid (T_r, B*H),
#: heads fastest; causal tiles heaviest first, each walking K/V forwards to its diagonal. CTAs per SM: ncu's
#: occupancy section on the H200 (bench/gpu/bytes.sh).
KERNELS = {
    "flash": {128: Kernel(128, 64, 2, "bh", True, True, frame=FA2_FRAME[128, False]),
              64: Kernel(128, 128, 2, "bh", True, True, frame=FA2_FRAME[64, False]),
              -128: Kernel(128, 64, 2, "bh", True, True, frame=FA2_FRAME[128, True]),
              -64: Kernel(128, 128, 2, "bh", True, True, frame=FA2_FRAME[64, True])},
    "efficient": {128: Kernel(64, 128, 2, "hb", False, False), 64: Kernel(64, 64, 2, "hb", False, False)},
    "cudnn": {128: Kernel(128, 128, 1, "hb", False, False, persistent=True),
              64: Kernel(128, 128, 1, "hb", False, False, persistent=True)},
    "attnscope": {128: Kernel(128, 64, 2, "hb", False, False, frame=ATTNSCOPE_FRAME[128, False]),
                  -128: Kernel(128, 64, 2, "hb", False, False, frame=ATTNSCOPE_FRAME[128, True]),
                  64: Kernel(128, 128, 2, "hb", False, False),
                  -64: Kernel(128, 64, 2, "hb", False, False)},
}

#: The Gluon Hopper variants (kernels/fwd_hopper.py VARIANTS) -> {head dim: Kernel}: NWG x BM query rows
#: and BN keys per CTA, grid (tiles, B*H) like the portable kernel (heads fastest), or persistent (one CTA
#: per SM, head-major tiles; causal tiles in pairs, heavy then light: `tiles.persistent_item`,
#: `paired_rereads`). One CTA per SM:
#: 168 (NWG 2) / 128 (NWG 3) registers x 9+ warps fill the register file. ptxas
#: (bench/sm90_resources.py): no spills.
#: The barrier-light (rel1, pt) and overlap (ov: two S tiles in flight per warpgroup) variants differ from
#: their base only in synchronisation: no memory traffic; the n64 ones take 64-key tiles.
_G = Kernel(128, 128, 1, "hb", False, False)
_BOTH, _PERSIST = {128: _G, 64: _G}, dict.fromkeys((128, 64), _G._replace(persistent=True))
_WG3, _N64 = {64: _G._replace(block_q=192)}, dict.fromkeys((128, 64), _G._replace(block_kv=64))
HOPPER_KERNELS = {
    "hopper": _BOTH, "hopper_nopp": _BOTH, "hopper_deep": _BOTH, "hopper_wg3": _WG3, "hopper_wg3_pp": _WG3,
    "hopper_m128": {64: _G._replace(block_q=256, block_kv=64)}, "hopper_persist": _PERSIST,
    "hopper_persist_pp": _PERSIST, "hopper_rel1": _BOTH, "hopper_rel1_nopp": _BOTH, "hopper_pt": _BOTH,
    "hopper_pt_nopp": _BOTH, "hopper_pt_deep": _BOTH, "hopper_pt_wg3_pp": _WG3, "hopper_pt_persist": _PERSIST,
    "hopper_ov_pt": {64: _G}, "hopper_ov_n64": _N64, "hopper_ov_n64_pt": _N64,
    "hopper_wg3_persist": {64: _G._replace(block_q=192, persistent=True)},
    "hopper_wg3_pp_persist": {64: _G._replace(block_q=192, persistent=True)},
}
_WRITES_LSE = {impl: k[128].lse for impl, k in KERNELS.items()}


#: Copies of a line read from both L2 partitions at once: each SM is attached to one of the H200's two
#: partitions, and a read from the side the line is not homed in leaves a copy in the near one too, so a K/V
#: tile, read by the CTAs of one head on all SMs, is held twice (`L2Params`: measured capacities).
COPIES = 2


@dataclass(frozen=True)
class L2Params:
    """The L2 behaviour the estimate assumes, as fractions of the L2: ``capacity`` (where re-reads start
    to miss) and ``ramp`` (they all miss from ``ramp`` x capacity) of lines re-read from one SM, then
    another (bench/l2_reuse.py A); ``shared`` and ``shared_ramp`` of lines read from both partitions at
    once, as the CTAs of one head read its K/V; ``private``: capacity of lines read by one SM (a CTA's Q).
    bench/l2_reuse.py --share measures all three (`COPIES`)."""

    capacity: float = 0.580
    ramp: float = 1.72
    shared: float = 0.434
    shared_ramp: float = 1.38
    private: float = 0.656
    lockstep: float = 0.51
    lockstep_ramp: float = 1.45
    lockstep_qo: float = 0.70
    wide: float = 0.45
    wide_ramp: float = 2.0
    wide_qo: float = 1.15
    #: FA-2's causal GQA at B > 1 (`hot_miss`): (hot footprint / L2, share of the re-reads the estimate
    #: counts as if the L2 kept nothing) measured on the kernel itself (bench/grids/hot_probe.csv), at d 128
    #: and at d 64
    hot: tuple = ((0.1, 0.0), (0.25, 0.25), (0.4, 0.43), (0.55, 0.96), (0.75, 0.98), (1.0, 1.79))
    hot_d64: tuple = ((0.1, 0.0), (0.2, 0.15), (0.3, 0.23), (0.5, 0.27))

    def for_shared(self) -> L2Params:
        """The parameters of K/V lines (read by CTAs on both partitions): ``shared``, ``shared_ramp``."""
        return replace(self, capacity=self.shared, ramp=self.shared_ramp)

    def for_lockstep(self) -> L2Params:
        """The parameters of K/V sets each read by one run of at most C consecutive, equal CTAs and never
        again (unmasked MHA with T <= C): ``lockstep``, ``lockstep_ramp``, with streamed Q/O bytes at
        ``lockstep_qo`` of a K/V byte. bench/l2_reuse.py E measured that pattern (16 sets of 128 readers,
        P = 132 and 264, with and without private Q/O streams; 2026-12-01,
        bench/results/h200-2026-12-01-l2-reuse-stream.json); its least-squares fit (``bench/l2_reuse.py
        --fit``) is these three numbers, RMS 0.040 in amplification. Such sets keep more room than
        ``shared`` gives lines re-read once after a stream (F)."""
        return replace(self, capacity=self.lockstep, ramp=self.lockstep_ramp)

    def for_wide(self) -> L2Params:
        """The parameters of K/V sets each read by one run of T > C consecutive, equal CTAs (unmasked MHA
        whose readers span more than one wave of slots): ``wide``, ``wide_ramp``, with streamed Q/O bytes at
        ``wide_qo`` of a K/V byte. bench/l2_reuse.py E-wide measured that pattern (8 sets of T = 2 P readers,
        P = 132 and 264, with and without private Q/O streams; 2026-12-01,
        bench/results/h200-2026-12-01-l2-reuse-wide.json); its least-squares fit (``bench/l2_reuse.py --fit``
        on that file) is these three numbers, RMS 0.007 in amplification (the ramp at the fit grid's edge).
        The later wave's readers re-read the cut set over a wider spread of distances than ``shared``'s ramp
        (a gentler miss curve), and a streamed byte takes more room than a K/V one."""
        return replace(self, capacity=self.wide, ramp=self.wide_ramp)

    def private_weight(self) -> float:
        """Room a byte read by one SM only takes in the L2, in K/V bytes: ``shared`` / ``private``."""
        return self.shared / self.private

    def qo_weight(self) -> float:
        """Room a byte of a CTA's Q and O tiles takes in the L2, in K/V bytes: Q is read by one SM (its
        capacity is ``private``), O written once to its home partition (one copy of the K/V's `COPIES`)."""
        return (self.private_weight() + 1.0 / COPIES) / 2.0


H200_L2_PARAMS = L2Params()


def miss(ratio: float, ramp: float = H200_L2_PARAMS.ramp) -> float:
    """Fraction of re-reads that miss when the data touched between two uses is ``ratio`` x capacity."""
    if ratio <= 1.0:
        return 0.0
    return min(1.0, (ratio - 1.0) / max(ramp - 1.0, 1e-9))


def hot_miss(ratio: float, knots: tuple = H200_L2_PARAMS.hot) -> float:
    """Re-reads of B hot K/V sets read in rotation (FA-2's (m, b, h) grid with GQA at B > 1: pair (h, b)
    reads set (b, h // group), so B sets take turns) that reach DRAM, as a share of those the estimate counts
    when the L2 keeps nothing (`wave_rereads` and `head_gap_rereads` at zero capacity), by the rotation's
    footprint ``ratio`` x the L2: the reuse distance of a line is the other B - 1 sets and, on average, half
    of its own, (B - 1/2) x (K + V of one kv head). Piecewise linear through ``knots`` ((footprint, share),
    ...), the first share below the first knot, the last above the last.

    The shipped knots (`L2Params.hot`) are the least-squares fit (robust: squared errors capped at 0.09)
    of the estimate's total to the H200's counters on every development point of that class at d 128:
    bench/grids/hot_probe.csv (22 shapes, B = 2-5, footprint 0.1-1.05 x L2, 2026-12-01,
    bench/results/h200-2026-12-01-bytes-hotprobe.json) and 18 shapes of held-out grids 1-22. The H200 loses
    the sets gradually from about 0.1 x L2 of footprint, all the counted re-reads by 0.55 x L2 (with the
    `COPIES` of both partitions, about the whole L2), and past 0.75 x L2 more than counted (1.8 x at 1.0:
    the walkers of one window also miss each other's tiles). The shared capacity's cliff (0.434, ramp
    1.38) had all of them miss from 0.3 x L2: grids 14 and 22's +80 % at B = 2, N = 26-29k.
    bench/l2_reuse.py H (a synthetic kernel of the same rotation) showed the same gradual loss at a lower
    level (its persistent readers run in lockstep).

    FA-2's d 64 kernel (`L2Params.hot_d64`: the same fit over that class's 14 development shapes: the hot
    probe's two, held-out grids 1-27's twelve, footprint 0.01-0.47 x L2) loses far fewer of its counted
    re-reads (its zero-capacity count is several times d 128's): 0.15 of them at 0.2 x L2, 0.27 at 0.5;
    held at 0.27 past the last measured point."""
    (x0, y0), (xn, yn) = knots[0], knots[-1]
    if ratio <= x0:
        return y0
    if ratio >= xn:
        return yn
    for (a, ya), (b, yb) in itertools.pairwise(knots):
        if a <= ratio <= b:
            return ya + (yb - ya) * (ratio - a) / (b - a)
    return yn


def mean_miss(lo: float, hi: float, ramp: float = H200_L2_PARAMS.ramp) -> float:
    """Mean of `miss` over ratios uniform between ``lo`` and ``hi``, given in either order (closed form: the
    integral of a clipped line)."""
    lo, hi = min(lo, hi), max(lo, hi)
    if hi - lo <= 1e-12 * max(1.0, hi):
        return miss(hi, ramp)
    w = max(ramp - 1.0, 1e-9)

    def integral(r):  # of miss from 1 to r, in ratio units
        u = (r - 1.0) / w
        return 0.0 if u <= 0 else w * (u * u / 2 if u <= 1 else u - 0.5)
    return (integral(hi) - integral(lo)) / (hi - lo)


def wave_rereads(sets: int, per_set: int, concurrent: int, kv_bytes: float, other_bytes: float = 0.0,
                 causal: bool = False, backward: bool = False, order: str = "head", *,
                 l2_bytes: int, spread: float | None = None, share: float = 1.0, heads_per_set: int = 1,
                 distinct_sets: int | None = None, schedule: str = "dynamic",
                 group_batch: tuple[int, int] | None = None, frame_bytes: float = 0.0,
                 params: L2Params = H200_L2_PARAMS) -> float:
    """K/V read amplification of a kernel: DRAM K/V bytes / (sets x kv_bytes) (>= 1).

    ``sets`` K/V sets of ``kv_bytes`` each, every set read by ``per_set`` CTAs; ``concurrent`` CTAs run
    at once; each CTA also moves ``other_bytes`` once (its Q and O tiles). ``order`` "head": a set's CTAs
    are consecutive in launch order (attention grids); "tile": consecutive CTAs read different sets.
    ``distinct_sets``: how many different sets there are (default ``sets``; fewer where a set is counted
    once per non-adjacent group of its readers): what a window can hold is bounded by them.
    ``causal`` + ``backward``: readers of unequal length that walk the set from its end, spread over the
    longest CTA's lifetime, ``spread`` x a wave (default 2: the longest causal CTA is twice the mean);
    with the "dynamic" schedule the set stays live ``per_set / concurrent`` waves longer (its readers
    start as slots free up, C per mean lifetime), and re-reads it once per wave of that span, after the
    K/V a window of ``spread`` x C consecutive CTAs touches: W / T to W / T + 1 sets (T = ``per_set``;
    the window's newest set only as far as the diagonals of its CTAs launched so far). Where
    ``heads_per_set`` > 1 query heads read the set one after the other (FA-2's GQA grid at B = 1), the top
    tiles are re-read across each head boundary after a gap: `head_gap_rereads` (``frame_bytes``: a CTA's
    spill frame, in K/V bytes of L2 room, resident over the gap).
    ``causal`` forwards: readers that walk the set from its start, each loading ``share`` of it on
    average, ``heads_per_set`` query heads of ``per_set / heads_per_set`` readers each (GQA).
    ``group_batch`` (g, B): the sets are (query head, batch) pairs, heads outer and the batch inner, g
    consecutive heads sharing one K/V set per batch (FLASH's GQA grid): w consecutive pairs hold only
    about w / g + B different sets.
    ``schedule``: "dynamic" (the next CTA goes to the first free slot: the hardware block scheduler, or
    a persistent kernel's tile counter) or "static" (persistent program p takes items p, p + C, ...:
    bench/l2_reuse.py's kernel); it matters for causal readers only.
    """
    choice("order", order, ("head", "tile"))
    choice("schedule", schedule, ("dynamic", "static"))
    cap = params.capacity * l2_bytes
    c = max(1, concurrent)
    distinct = sets if distinct_sets is None else max(1, min(sets, distinct_sets))

    def held(w: float) -> float:  # different sets among w consecutive ones
        g_b = min(w, distinct)
        return g_b if group_batch is None else min(g_b, w / group_batch[0] + group_batch[1])
    s = (spread if spread is not None else 2.0) if (causal and backward) else 1.0
    if order == "head":
        window = held(s * c / per_set + 1.0)  # sets a window of s C consecutive CTAs spans
        # extra waves a set's readers fall into (none when every CTA runs in the first wave, in step)
        live = s
        if causal and backward and schedule == "dynamic":
            # the block scheduler starts a set's readers as slots free up: C per mean CTA lifetime, so
            # they start over per_set / C lifetimes, and the set stays live that much longer than its
            # longest CTA (FA-2 at N = 32k: 256 readers, 264 slots, 2 + 0.97 lifetimes)
            live = s + per_set / c
        passes = min(live * (per_set - 1) / c, max(0.0, live * sets * per_set / c - 1.0))
    else:
        window = min(distinct, s * c)
        # sets > C: each reader is in another wave; else a wave reads every set once
        passes = per_set - 1 if sets > s * c else max(0.0, per_set * sets / c - 1)
    work = window * kv_bytes + min(c, sets * per_set) * other_bytes  # Q, O: the resident CTAs'
    gap = 0.0
    if causal and backward and schedule == "dynamic" and order == "head" and heads_per_set > 1:
        gap = head_gap_rereads(per_set / heads_per_set, c, kv_bytes, other_bytes, frame_bytes, s,
                               cap, params.ramp) * (heads_per_set - 1)
    if causal and schedule == "static" and order == "head":
        # bench/l2_reuse.py C: readers of one set are one diagonal step (kv / per_set bytes of their walk)
        # apart, so C such steps of the whole machine come between two readers' visits of a tile: backward
        # walkers always, forward ones from the second round on (the first round starts in step, and its
        # readers, still running, insert one tile per set, not per reader).
        rereads = max(0.0, per_set * share - 1.0)
        late = 1.0 if backward else max(0.0, 1.0 - c / (sets * per_set))
        return 1.0 + late * rereads * miss(min(late * c * kv_bytes / per_set, work) / cap, params.ramp)
    if causal and not backward and order == "head":
        # Forward walkers (bench/l2_reuse.py C): readers that start together read each tile in step (one
        # DRAM read); CTAs launched as slots free start one launch interval (mean CTA / C) apart, in which
        # the machine inserts about one CTA's K/V (share x kv) and Q/O: the reuse distance of a re-read by
        # the next reader, never more than the window holds. Where a kv set's next query head starts, its
        # first reader of tile t comes ~t/r launches after the last one: half a head's CTAs on average.
        heads = max(1, heads_per_set)
        per_head = per_set / heads
        near = min(share * kv_bytes + other_bytes, work)
        far = min(per_head / 2 * (share * kv_bytes + other_bytes), work)
        rereads_near = max(0.0, per_set * share - 1.0 - (heads - 1) * share)
        return 1.0 + rereads_near * miss(near / cap, params.ramp) + \
            (heads - 1) * share * miss(far / cap, params.ramp)
    if order == "head" and not causal:
        other = min(c, sets * per_set) * other_bytes
        return 1.0 + lockstep_rereads(sets, per_set, c, kv_bytes, other, cap, params.ramp, held)
    if order == "head" and window > 1.0:
        # (only causal backward walkers under the dynamic schedule get here: FA-2) the K/V bytes a window
        # of W = s C consecutive CTAs touches: it starts at offset o (uniform in [0, T)) of a set whose CTAs
        # o .. T - 1 in it are the heavy ones, which read all of it, and ends in a set whose CTAs 0 .. k - 1
        # launched so far read only its tiles 0 .. k - 1 (a causal CTA reads the tiles up to its diagonal,
        # and the grid launches a set's query tiles in order): (o + W) / T sets, uniform over
        # [W / T, W / T + 1], half a set fewer than the W / T + 1 sets it spans
        w = s * c / per_set
        lo, hi = max(kv_bytes, held(w) * kv_bytes), max(kv_bytes, held(w + 1.0) * kv_bytes)
        other = work - window * kv_bytes
        return 1.0 + passes * mean_miss((lo + other) / cap, (hi + other) / cap, params.ramp) + gap
    return 1.0 + passes * miss(work / cap, params.ramp) + gap


def head_gap_rereads(per_head: float, c: int, kv_bytes: float, qo_bytes: float, frame_bytes: float,
                     spread: float, cap: float, ramp: float, batch: int = 1) -> float:
    """K/V re-reads, in sets, where the next query head of a K/V set starts (FA-2's backward walkers, the
    set's query heads consecutive in launch order): the heads' CTAs launch lightest first, one launch
    interval (a mean lifetime / ``c``) apart, each walking from its diagonal down. Tile x (a fraction of the
    set) is read last in a head by its heaviest CTA, (1 - x) of the longest walk (``spread`` x the mean)
    after it starts, and first in the next head by that head's CTA x T, x T launches later: after
    G(x) = x T - spread c (1 - x) launches, a gap for the top x > spread c / (T + spread c) only (T =
    ``per_head``). Meanwhile the machine touches the tiles below x, G Q and O tiles (``qo_bytes`` per CTA)
    and the spill frames of the CTAs live then (``frame_bytes`` each; the c running ones and the G started,
    at most the (1 + `SLOT_REUSE_LIFETIMES`) c warp slots the frames cycle through): D(x) = x kv + G qo +
    min(c + G, (1 + SLOT_REUSE_LIFETIMES) c) frame. Each such tile misses with `miss` (D / ``cap``,
    ``ramp``); D is piecewise linear, so the mean is exact (`mean_miss` per piece). The same ramp on the
    exact LRU stack distances of the ideal schedule (bench/l2_sim.py --frames --ramp 1.38) gives these
    re-reads within 0.06 sets at FA-2 MQA B = 1, N 16-32k, and none without the frames; the H200's counters
    show 0.07-0.21 sets more (about 0.1 where none is estimated: N 16,385, 24,576 even, 20,481). The frames
    are what separates N = 24,577 (ragged kernel, 274 B a thread: 0.31 sets measured, 0.11 estimated) from
    24,576 (Is_even_MN, 74 B: 0.11 measured, none estimated) at H = 13/1.

    ``batch`` B > 1 (FA-2's (m, b, h) grid: the batch between a group's heads): the next head of the set
    starts (B - 1) T launches later, G(x) = (B - 1) T + x T - spread c (1 - x), and the B - 1 pairs (head,
    batch) of the other batches' sets come between. Pair q (q T launches after the set's, q = 1 .. B - 1)
    reads its tile y from q T + y T (its CTA y T's diagonal) to (q + 1) T + spread c (1 - y) (its heaviest
    CTA): inside the gap for y < x + q u, u = T / (spread c); the pair of the same batch one head earlier
    (q - B) only for y < x - (B - q) u, within that. So the gap also touches min(1, x + q u) of each other
    batch's set: D(x) gains the sum of those over q, piecewise linear with knots at x = 1 - q u. The exact
    LRU of the ideal schedule (bench/l2_sim.py --frames --ramp 1.38; the misses of a tile's first read by a
    later head) puts these re-reads at 7.74 / 2.65 / 1.53 / 27.31 / 0.24 sets at B = 2 GQA 19/1 N = 26,154,
    5 45/5 8,111, 5 21/3 7,353, 4 29/1 23,103, 5 9/3 5,755 (this form: 7.74 / 2.59 / 1.48 / 27.32 / 0.14),
    where counting the other batches' whole sets and B T Q/O tiles put them at 18.0 / 4.35 / 1.48 / 28.0 /
    0."""
    t, sc = per_head, spread * c
    lead = (batch - 1) * t  # launches from the set's pair to its next head's, less one pair
    slots = SLOT_REUSE_LIFETIMES * c  # G past which the frames cycle through every warp slot
    u = t / sc

    def gap(x):
        return max(0.0, lead + x * t - sc * (1.0 - x))

    def dist(x):
        others = sum(min(1.0, x + q * u) for q in range(1, batch))
        return (x + others) * kv_bytes + gap(x) * qo_bytes + min(c + gap(x), c + slots) * frame_bytes
    x0 = max(0.0, (sc - lead) / (t + sc))  # where G = 0
    xk = (slots + sc - lead) / (t + sc)  # where G = slots
    inner = [xk] + [1.0 - q * u for q in range(1, batch)]
    knots = [x0] + sorted(k for k in inner if x0 < k < 1.0) + [1.0]
    return sum((b - a) * mean_miss(dist(a) / cap, dist(b) / cap, ramp) for a, b in itertools.pairwise(knots))


#: Waves of CTAs over which FA-2's causal K/V re-reads ramp up after the launch (`launch_fill_share`)
LAUNCH_FILL_WAVES = 1.0


def launch_fill_share(waves: float, w0: float = LAUNCH_FILL_WAVES) -> float:
    """Share of the steady-state K/V re-reads a launch of ``waves`` waves of causal backward walkers (FA-2)
    makes: a re-read's reuse distance cannot exceed what the kernel touched since it started, and ncu starts
    each measured kernel from an empty L2, so the first wave's re-reads see less than the steady window
    (`wave_rereads`) and mostly hit. The miss share ramps as 1 - exp(-w / ``w0``) over the launch's waves w;
    its mean over W waves is 1 - (w0 / W) (1 - exp(-W / w0)).

    bench/grids/heads_probe.csv (FA-2 causal MHA, d 128, B = 1, the head count alone scaling the waves;
    2026-12-01, bench/results/h200-2026-12-01-bytes-headsprobe.json) measured the re-reads per K/V set
    growing with the waves and levelling off by about ten: at N = 15,033, 0.12 / 0.53 / 0.40 / 0.66 / 1.0 /
    1.05 sets at 1.3 / 2.7 / 5.4 / 10 / 21 / 41 waves, where the steady-state estimate is 1.07 at each.
    ``w0`` = 1 wave is the least-squares choice over FA-2's causal development points (0.5-1.5 all help:
    332 -> 343-354 of 408 rows within ±10 %; 2 and more lose the many-wave points)."""
    if waves <= 0:
        return 0.0
    return 1.0 - w0 / waves * (1.0 - math.exp(-waves / w0))


#: Samples of `paired_rereads`'s round pairs past which it stops summing every one (its cost bound)
PAIRED_ROUNDS = 128


def paired_rereads(sets: int, group: int, num_m: int, n_kv: int, c: int, tile_bytes: float, qo_bytes: float,
                   cap: float, walk, ramp: float = 1.0) -> float:
    """K/V reads beyond one pass, in sets, of attnscope's persistent causal schedule (kernels/fwd_hopper.py
    ``_work``, `tiles.persistent_item`): ``c`` programs take the items (pairs of query tiles) of
    ``sets`` K/V sets, ``group`` query heads of ``(num_m + 1) // 2`` items each per set, head-major, in
    rounds of ``c``; each runs its heavy tile then its light one, and every item loads the same number of
    KV tiles (``walk(t)``: KV tiles query tile t loads), so round pairs run in lockstep. Per round pair and
    set, with items k in [a, b]: the heavy walkers read tile j together at step j (one read; tiles
    0 .. walk(heavy(a)) - 1); the light readers re-read tiles 0 .. walk(light(b)) - 1, the first of them
    after walk(heavy(b)) steps; a set continued from the last round pair re-reads tile j after
    max(a', j) + 1 steps where the last pair's light readers read it last, else after a whole round pair.
    Steps become bytes at the round pair's insertion rate: every K/V tile its walks touch (heavy walks and
    light re-reads) and its programs' Q and O (``qo_bytes`` per item); bytes over ``cap`` become misses
    through `miss` with ``ramp`` (the shared K/V lines' measured ramp, `L2Params`). Counting the light
    re-reads as insertions overstates the distinct lines of an ideal LRU (which re-reads less than the
    H200: at GQA 7/1, B = 2, N = 24,973 an exact LRU of this schedule re-reads 0.17 sets, the counters
    0.65-0.90); it is the choice that matches the development points at an even ``num_m`` (bench/l2_dev.py:
    all within 3 %), and the held-out grids test it. With ``ramp`` 1 (a sharp LRU cliff) and MHA it tracks
    an exact-LRU simulation of the schedule (tests/test_model_l2.py). Past `PAIRED_ROUNDS` round pairs the
    inner ones are sampled evenly, so the cost is bounded and independent of N."""
    half = (num_m + 1) // 2
    per_set = group * half
    n_work = sets * per_set
    rounds = -(-n_work // c)
    length = walk(num_m - 1) + (walk(0) if num_m % 2 == 0 else 0)  # KV tiles of every item

    def cover(r, s):  # set s in round pair r: (a, heavy tiles, first light start, light tiles, items)
        q0, q1 = max(s * per_set, r * c), min((s + 1) * per_set, (r + 1) * c, n_work)
        if q0 >= q1:
            return None
        lo, hi = q0 - s * per_set, q1 - 1 - s * per_set
        a, b = (0, half - 1) if hi // half > lo // half else (lo % half, hi % half)
        w = walk(max(persistent_item(a, num_m)[0], persistent_item(b, num_m)[0]))
        kl = next((k for k in (b, b - 1) if k >= a and persistent_item(k, num_m)[1] is not None), None)
        if kl is None:
            return a, w, 0, 0, q1 - q0
        heavy, light = persistent_item(kl, num_m)
        return a, w, walk(heavy), walk(light), q1 - q0

    def round_pair(r):  # {set: cover}, insertion rate (bytes per step)
        if not 0 <= r < rounds:
            return {}, 0.0
        found = (cover(r, s) for s in range((r * c) // per_set, min(sets, -(-(r + 1) * c // per_set))))
        info = {(r * c) // per_set + i: v for i, v in enumerate(found)}
        info = {s: v for s, v in info.items() if v is not None}
        walked = sum(v[1] + v[3] for v in info.values())  # the heavy walks and the light re-reads
        return info, (walked * tile_bytes + 2 * sum(v[4] for v in info.values()) * qo_bytes) / length

    def over(steps, rate):
        return miss(steps * rate / cap, ramp)

    def extra(r):  # K/V tiles re-read in round pair r
        info, rate = round_pair(r)
        prev, prate = round_pair(r - 1)
        x = 0.0
        for s, (_, w, delay, n_light, _) in info.items():
            x += n_light * over(delay, rate)
            if s in prev:
                pa, _, _, p_light, _ = prev[s]
                rr = (rate + prate) / 2
                near = min(w, p_light)  # last read by the light readers: after max(pa, j) + 1 steps
                j1 = min(pa, near)
                x += j1 * over(pa + 1, rr)
                if near > j1:  # j in [j1, near): (j + 1) steps
                    x += (near - j1) * mean_miss((j1 + 1) * rr / cap, near * rr / cap, ramp)
                x += max(0, w - p_light) * over(length, rr)  # last read by the heavy walkers
        return x

    if rounds <= PAIRED_ROUNDS + 2:
        total = sum(extra(r) for r in range(rounds))
    else:
        inner = (1 + (i * (rounds - 2)) // PAIRED_ROUNDS for i in range(PAIRED_ROUNDS))
        total = extra(0) + extra(rounds - 1) + sum(extra(r) for r in inner) * (rounds - 2) / PAIRED_ROUNDS
    return total / (sets * n_kv)


def wave_pairs(c: int, per_set: int) -> tuple:
    """(a, b, probability): the K/V sets in the two waves of C = ``c`` CTAs either side of a wave boundary
    that cuts a set of ``per_set`` (T) CTAs, consecutive in launch order. Boundaries fall at CTAs w C, so
    their offsets in a set are the multiples of g = gcd(C, T) below T, each as often over T / g waves;
    offset 0 (a boundary between two sets: no set is cut) has the remaining probability. With C = q T + r,
    a boundary at offset o follows a wave over q + 2 sets when o < r (else q + 1) and precedes one over
    q + 1 sets when o <= T - r (else q + 2). Closed form: four counts of lattice points."""
    t = max(1, int(per_set))
    c = max(1, int(c))
    g = math.gcd(c, t)
    n = t // g  # offsets 0, g, ..., T - g, one per T / g consecutive boundaries
    q, r = divmod(c, t)
    rg = r // g
    a_hi = max(0, rg - 1)  # offsets k g, k = 1 .. n - 1, with k g < r
    b_lo = min(n - 1, n - rg)  # ... with k g <= T - r
    both = max(0, min(a_hi, b_lo))
    counts = {(q + 2, q + 1): both, (q + 2, q + 2): a_hi - both, (q + 1, q + 1): b_lo - both,
              (q + 1, q + 2): (n - 1) - a_hi - b_lo + both}
    return tuple((a, b, k / n) for (a, b), k in counts.items() if k > 0)


def batch_gap_rereads(batch: int, group: int, kv_heads: int, per_set: int, c: int, kv_bytes: float,
                      wave_other: float, cap: float, ramp: float) -> float:
    """Share of a K/V set fetched again, per later query head of a GQA group, where the batch comes between
    a group's heads in launch order (FA-2's (m, b, h) grid at B > 1) and the CTAs run in lockstep waves of
    ``c``: the last CTA of pair (head h, batch b) and the first of (h + 1, b) are D = (B - 1) T + 1 launches
    apart (T = ``per_set``), so k = floor(D / c) or that + 1 wave boundaries fall between them (the latter
    with probability frac(D / c), the pair ends spread evenly over a wave). k = 0: both read the set in the
    same wave, in step: no re-read. k >= 1: tile x is re-read after the rest (1 - x) of the sets of the
    earlier wave, the k - 1 waves between and the first x of the later wave's sets, about k c / T + 1 pairs
    (their different sets: at most B kv sets, fewer where a window ends within a group, as `wave_rereads`'s
    ``group_batch``), spread one set wide, plus the Q and O of k waves (``wave_other`` each, as
    `lockstep_rereads`). An exact LRU of the ideal schedule (bench/l2_sim.py --ramp 1.38) puts these
    re-reads at 17.2 / 11.1 / 11.5 / 12.2 sets at B = 2 GQA 23/1 N = 22,669, 2 7/1 29,753, 4 11/1 15,121,
    4 17/1 d = 64 25,628 (H200: 18.6 / 9.2 / 10.6 / 16.0) where counting B whole sets and B T Q/O tiles
    between the heads put them at 29.0 / 12.0 / 13.0 / 16.0."""
    t = max(1, int(per_set))
    gap = (batch - 1) * t + 1
    k0, f = divmod(gap / max(1, c), 1.0)

    def held(w):  # different kv sets among w consecutive (head, batch) pairs
        return min(w, batch * kv_heads, w / group + batch)

    def reread(k):
        if k < 1:
            return 0.0
        w = k * c / t + 1.0
        lo, hi = max(1.0, held(w - 0.5)) * kv_bytes, held(w + 0.5) * kv_bytes
        return mean_miss((lo + k * wave_other) / cap, (hi + k * wave_other) / cap, ramp)
    return (1.0 - f) * reread(int(k0)) + f * reread(int(k0) + 1)


def lockstep_rereads(sets: int, per_set: int, c: int, kv_bytes: float, other: float, cap: float, ramp: float,
                     held) -> float:
    """Extra K/V reads per set (in sets) of equal-length CTAs that run in waves of ``c``: the one set that
    straddles a wave boundary is read again by the next wave; its tile at fraction x of the walk is
    re-read after the rest (1 - x) of the a sets of the earlier wave and the first x of the b sets of the
    later one: a reuse distance uniform between a and b sets (plus the resident CTAs' Q/O, ``other``).
    `wave_pairs` gives (a, b) and how often a boundary cuts no set."""
    waves = math.ceil(sets * per_set / c)
    if waves <= 1:
        return 0.0
    pairs = wave_pairs(c, per_set)
    cut = sum(pr for *_, pr in pairs)  # share of the offsets that cut a set: all but 1 in T / gcd(C, T)
    if cut <= 0:
        return 0.0
    # boundaries w C (w = 1 .. waves - 1) between two sets: every (T / gcd(C, T))-th one
    period = int(per_set) // math.gcd(int(c), int(per_set))
    events = (waves - 1) - (waves - 1) // period
    m = 0.0
    for a, b, pr in pairs:
        a, b = held(a), held(b)
        m += pr / cut * mean_miss((a * kv_bytes + other) / cap, (b * kv_bytes + other) / cap, ramp)
    return events / sets * m


# --- the estimate --------------------------------------------------------------------------------------
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


def _survival(t_write: float, t_end: float, cap: float) -> float:
    """Probability that a byte inserted at insertion-time ``t_write`` is resident at ``t_end`` (random
    replacement once ``cap`` bytes have been inserted)."""
    return math.exp(-max(0.0, t_end - max(t_write, cap)) / cap)


def _retained(start: float, size: float, t_end: float, cap: float, total_span: float | None = None) -> float:
    """Bytes of a buffer of ``size`` written uniformly over insertion-times [start, start + span] still
    resident at ``t_end`` (closed form of the integral of `_survival`)."""
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


_FWD_SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "fwd.py"


@functools.lru_cache(maxsize=1)
def hopper_table() -> tuple:
    """kernels/fwd.py's ``HOPPER_VALIDATED`` rows ``(d, dtype name, causal, n_min, n_max, variant)``, read
    from its source with `ast` (the model never imports torch); () where the file or the table is absent.
    Cached once per process (the source does not change under a running process)."""
    try:
        tree = ast.parse(_FWD_SOURCE.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return ()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "HOPPER_VALIDATED" for t in targets) and node.value:
            return tuple(tuple(r) for r in ast.literal_eval(node.value))
    return ()


def kernel_of(impl: str, d: int, causal: bool, dtype: str = "fp16", n: int = 4096,
              attnscope_impl: str = "auto") -> tuple[str, Kernel]:
    """(name, `Kernel`) of what ``impl`` runs for head dim ``d``, ``causal``, ``dtype``, N = ``n`` on an sm_90
    GPU: for attnscope with ``attnscope_impl="auto"`` (what `attnscope.flash_attention` runs by default) the
    Gluon variant kernels/fwd.py's ``HOPPER_VALIDATED`` names, else (or with "portable") its portable
    kernel; ``KERNELS`` for the others."""
    choice("impl", impl, tuple(KERNELS))
    choice("attnscope_impl", attnscope_impl, ("auto", "portable"))
    if impl == "attnscope" and attnscope_impl == "auto":
        name = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(dtype, dtype)
        for td, tt, tc, lo, hi, variant in hopper_table():
            if td == d and tt == name and tc == causal and n >= lo and (hi is None or n <= hi):
                table = HOPPER_KERNELS.get(variant)
                if table is None:
                    raise NotImplementedError(f"attnscope variant {variant!r} (kernels/fwd.py "
                                              f"HOPPER_VALIDATED): not modelled; modelled: "
                                              f"{', '.join(HOPPER_KERNELS)}")
                return variant, table[min(table, key=lambda x: (abs(x - d), x))]
    impl_name = "attnscope portable" if impl == "attnscope" else impl
    table = KERNELS[impl]
    near = min((x for x in table if x > 0), key=lambda x: (abs(x - d), x))
    return impl_name, table.get(-near if causal else near) or table[near]


def spill_bytes(ker: Kernel, ctas: int, nq: int, nk: int) -> int:
    """Local-memory (register spill) bytes the CTAs of a kernel touch: each CTA's threads write their
    frame (``ker.frame``: FA-2's Is_even_MN kernel when N is a multiple of both blocks, else the ragged
    one). L1 writes local stores through to the L2, where the lines stay dirty."""
    even = nq % ker.block_q == 0 and nk % ker.block_kv == 0
    return ctas * ker.threads * ker.frame[0 if even else 1]


def dead_frame_evicted(inserted: float, ctas: int, concurrent: int, cap: float) -> float:
    """Fraction of the finished CTAs' dead (dirty) spill frames written back to DRAM: evicted before a new
    CTA takes the same warp slots and re-dirties them, `SLOT_REUSE_LIFETIMES` CTA lifetimes later. In one
    lifetime the machine inserts ``inserted`` x concurrent / ctas bytes; a line survives D inserted bytes
    with exp(-D / cap) (random replacement, `_survival`); a call whose insertions fit evicts nothing."""
    if inserted <= cap:
        return 0.0
    per_life = inserted * min(concurrent, ctas) / max(ctas, 1)
    return 1.0 - math.exp(-SLOT_REUSE_LIFETIMES * per_life / cap)


def _fused(est: Estimate, impl: str, nq: int, nk: int, d: int, b: int, batch: int, heads: int, kv_heads: int,
           causal: bool, l2: int, sms: int, cap: float, params: L2Params, per_sm: int | None,
           dtype: str = "fp16", attnscope_impl: str = "auto", kernel: Kernel | None = None) -> None:
    name, ker = kernel_of(impl, d, causal, dtype, max(nq, nk), attnscope_impl)
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
    # curve per FA-2 kernel (d 128: 128 x 64 tiles; d 64: 128 x 128, whose share is several times lower)
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
        extra *= hot_miss((batch - 0.5) * kv_set / l2, params.hot if d > 64 else params.hot_d64)
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
        fills = FILL_PER_READ * k.read - l2
        spill = max(dead, min(FRAME_WRITEBACKS_MAX * spill, FRAME_FILL_SHARE * max(0.0, fills)))
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
    b = _traffic.DTYPE_BYTES[dtype]
    hkv = heads if kv_heads is None else kv_heads
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
    attnscope_impl: "auto" (the Gluon variant kernels/fwd.py's HOPPER_VALIDATED names for the call, else the
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
    """Relative error of an estimate against a measurement: estimated / measured - 1."""
    expect(measured > 0, "measured", "a positive byte count", measured)
    return estimated / measured - 1.0
