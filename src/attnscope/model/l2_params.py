"""The constants of the L2-aware byte estimate (`attnscope.model.l2`): the fused kernels' geometry
(`Kernel`, `KERNELS`, `HOPPER_KERNELS`: read from their sources or measured with ncu) and `L2Params`, the one
table of the L2's measured and fitted behaviour (each field names the probe and result that gave it), with
its miss curves (`miss`, `hot_miss`, `mean_miss`). Pure Python. The probe scripts and result files named
here (bench/*.py, bench/gpu/*.sh, bench/results/*) that are not in the tree are in git at commit 5eeec86,
where bench/ last held the probes."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import NamedTuple

from attnscope.errors import expect, finite_real


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
#: impl -> {head dim: Kernel}; a head dim not listed takes the nearest listed one; -d: the causal kernel
#: where it differs. flash: PyTorch's FA-2 fwd traits (d 128: <128, 128, 64, 4>, d 64: <64, 128, 128, 4>),
#: grid (m_blocks, b, h), n_block loop from the diagonal down; its template Is_even_MN (N a multiple of
#: both blocks) picks another, smaller-framed kernel. efficient: CUTLASS mem-eff 64 x 128, grid (m_blocks,
#: h, b). cudnn: sm90 flash fprop wgmma, a persistent grid of one CTA per SM (ncu); 128-row tiles in
#: (m, h, b) order assumed. attnscope: the portable kernel (kernels/fwd.py CONFIG_TABLE), grid (T_r, B*H),
#: heads fastest; causal tiles heaviest first, each walking K/V forwards to its diagonal (the last
#: `tiles.launch_tail` heads interleaved, not modelled). CTAs per SM: ncu's
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
                  -64: Kernel(128, 64, 2, "hb", False, False),
                  # d 256: the table's tiles, one CTA per SM by its 193 KiB of shared memory (not measured:
                  # `l2.not_modelled` makes no promise at this head dim)
                  256: Kernel(128, 64, 1, "hb", False, False)},
}

#: The Gluon Hopper variants (kernels/fwd_hopper.py VARIANTS, `attnscope.model.dispatch`) -> {head dim:
#: Kernel}: NWG x BM query rows and BN keys per CTA; hopper_persist one CTA per SM over head-major tiles,
#: causal tiles in pairs, heavy then light (`tiles.persistent_item`, `paired_rereads`); hopper_wg3_pp a grid
#: (tiles, B*H) like the portable kernel (heads fastest; causal, its last `tiles.launch_tail` heads start
#: interleaved, which the estimate does not model: re-measured, its 28 held-out points stayed within 10 %,
#: bench/grids/rerun_order_fwd.csv). One CTA per SM: 168 (NWG 2) / 128 (NWG 3) registers x 9+ warps fill the
#: register file.
_G = Kernel(128, 128, 1, "hb", False, False)
#: attnscope's portable kernel in its sliding-window tiles (kernels/fwd.py ``WINDOW_CONFIGS``: 64 x 64, 4
#: warps; `dispatch.portable_window`), grid (T_r, B*H) as the table's: CTAs per SM from ptxas
#: (bench/sm90_resources.py --kernel fwd, not measured on the GPU): d 64 122 registers, 42 KiB of shared
#: memory (4 by registers); d 128 157 registers, 113 KiB (2 by shared memory); no spills.
WINDOW_KERNELS = {64: Kernel(64, 64, 4, "hb", False, False), 128: Kernel(64, 64, 2, "hb", False, False)}
HOPPER_KERNELS = {"hopper_persist": dict.fromkeys((128, 64), _G._replace(persistent=True)),
                  "hopper_wg3_pp": {64: _G._replace(block_q=192)}}


#: Copies of a line read from both L2 partitions at once: each SM is attached to one of the H200's two
#: partitions, and a read from the side the line is not homed in leaves a copy in the near one too, so a K/V
#: tile, read by the CTAs of one head on all SMs, is held twice (`L2Params`: measured capacities).
COPIES = 2


@dataclass(frozen=True)
class L2Params:
    """The one table of the estimate's measured and fitted constants (each field names its probe). The L2's
    behaviour, as fractions of the L2: ``capacity`` (where re-reads start
    to miss) and ``ramp`` (they all miss from ``ramp`` x capacity) of lines re-read from one SM, then
    another (bench/l2_reuse.py A); ``shared`` and ``shared_ramp`` of lines read from both partitions at
    once, as the CTAs of one head read its K/V; ``private``: capacity of lines read by one SM (a CTA's Q).
    bench/l2_reuse.py --share measures all three (`COPIES`)."""

    # lines re-read from one SM, then another: bench/l2_reuse.py A (commit 03afacc)
    capacity: float = 0.580
    ramp: float = 1.72
    # lines read from both partitions / by one SM: bench/l2_reuse.py --share (probe 4, commit 3e3e9ca;
    # bench/results/h200-2026-12-01-l2-share-probe4.json)
    shared: float = 0.434
    shared_ramp: float = 1.38
    private: float = 0.656
    # unmasked MHA sets read by <= C readers (`for_lockstep`): bench/l2_reuse.py E --fit, RMS 0.040 in
    # amplification (bench/results/h200-2026-12-01-l2-reuse-stream.json)
    lockstep: float = 0.51
    lockstep_ramp: float = 1.45
    lockstep_qo: float = 0.70
    # ... by > C readers (`for_wide`): bench/l2_reuse.py E-wide --fit, RMS 0.007
    # (bench/results/h200-2026-12-01-l2-reuse-wide.json)
    wide: float = 0.45
    wide_ramp: float = 2.0
    wide_qo: float = 1.15
    #: FA-2's causal GQA at B > 1 (`hot_miss`): (hot footprint / L2, share of the re-reads the estimate
    #: counts as if the L2 kept nothing), at d 128 and at d 64: least-squares fits (squared errors capped at
    #: 0.09) to the H200's counters on the kernel itself, bench/grids/hot_probe.csv and held-out grids 1-27
    #: (bench/results/h200-2026-12-01-bytes-hotprobe.json)
    hot: tuple = ((0.1, 0.0), (0.25, 0.25), (0.4, 0.43), (0.55, 0.96), (0.75, 0.98), (1.0, 1.79))
    hot_d64: tuple = ((0.1, 0.0), (0.2, 0.15), (0.3, 0.23), (0.5, 0.27))
    #: ... at d 128 with several K/V heads (Hkv > 1), which lose more of their counted re-reads at 0.2-0.5 x
    #: L2 of footprint and fewer past 0.75 x L2 than one K/V head's: `hot`'s footprints, the shares fitted by
    #: bench/fit_family_params.py --hot (non-negative least squares) to the class's 41 runs in bench/results:
    #: the hot probe's and held-out grids 3, 7, 11, 19, 25's (h200-2026-12-01-bytes-*.json) and the first
    #: open-class grid's 19 (h200-2026-12-02-heldout-fwd-openclass.json)
    hot_groups: tuple = ((0.1, 0.0), (0.25, 0.34), (0.4, 0.8), (0.55, 1.0), (0.75, 1.06), (1.0, 1.57))
    #: ... and the footprint from which that class is not modelled to +-10 % (`model.l2.not_modelled`): from
    #: 0.3 x L2 on, repeated runs of one call moved by up to 31.6 %
    #: (bench/results/h200-2026-12-02c-probe-fwd-openclass.json, --repeat 3: k1's B 2 H 16/2 N 27,001 31.6 %,
    #: t's B 3 H 16/2 N 22,121 30.2 %, k2's B 2 H 32/4 N 36,871 19.3 %; the hot probe's B 5 H 8/2 N 16,385
    #: 20.0 %, N 28,673 18.5 %), past the 22.2 % beyond which no one number is within +-10 % of every run, and
    #: `hot_groups`, fitted to them, leaves 35 of the class's 63 runs there in bench/results outside +-10 %;
    #: below it, repeated points moved 1.0 % at most and 9 of 9 runs were within (one K/V head: 9.5 % at most)
    hot_groups_modelled_below: float = 0.3
    #: CTA lifetimes between a finished CTA and the next one that takes its warp slots (and so re-dirties
    #: its dead local lines in the L2 before they are written back): assumed, not measured.
    slot_reuse_lifetimes: float = 2.0
    #: FA-2's d 64 causal MHA frames, re-dirtied at every K/V step, are written back more than once per CTA:
    #: the frame write-back bytes are ``frame_fill_share`` of the L2's fills past its first L2, the fills
    #: ``fill_per_read`` x the DRAM reads (bench/gpu/l2_counters_probe.sh, B 1 H 24, N 8k-24k,
    #: bench/results/h200-2026-12-01-l2counters.csv; commit 94636f5), at most ``frame_writebacks_max`` times
    #: a frame (bench/l2_dev.py --spill flash over the development points).
    frame_fill_share: float = 0.135
    fill_per_read: float = 1.82
    frame_writebacks_max: float = 2.0
    #: Waves over which FA-2's causal K/V re-reads ramp up after the launch (`launch_fill_share`): the
    #: least-squares choice over FA-2's causal development points, from bench/grids/heads_probe.csv
    #: (bench/results/h200-2026-12-01-bytes-headsprobe.json; commit 74793f4).
    launch_fill_waves: float = 1.0

    def for_shared(self) -> L2Params:
        """The parameters of K/V lines (read by CTAs on both partitions): ``shared``, ``shared_ramp``."""
        return replace(self, capacity=self.shared, ramp=self.shared_ramp)

    def for_lockstep(self) -> L2Params:
        """The parameters of K/V sets each read by one run of at most C consecutive, equal CTAs and never
        again (unmasked MHA with T <= C): ``lockstep``, ``lockstep_ramp`` (Q/O bytes at ``lockstep_qo``)."""
        return replace(self, capacity=self.lockstep, ramp=self.lockstep_ramp)

    def for_wide(self) -> L2Params:
        """The parameters of K/V sets each read by one run of T > C consecutive, equal CTAs (unmasked MHA
        spanning more than one wave of slots): ``wide``, ``wide_ramp`` (Q/O bytes at ``wide_qo``)."""
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
    expect(finite_real(ratio), "ratio", "a finite number", ratio)
    if ratio <= 1.0:
        return 0.0
    return min(1.0, (ratio - 1.0) / max(ramp - 1.0, 1e-9))


def hot_miss(ratio: float, knots: tuple = H200_L2_PARAMS.hot) -> float:
    """Re-reads of B hot K/V sets read in rotation (FA-2's (m, b, h) grid with GQA at B > 1: pair (h, b)
    reads set (b, h // group), so B sets take turns) that reach DRAM, as a share of those the estimate counts
    when the L2 keeps nothing (`wave_rereads` and `head_gap_rereads` at zero capacity), by the rotation's
    footprint ``ratio`` x the L2: the reuse distance of a line is the other B - 1 sets and, on average, half
    of its own, (B - 1/2) x (K + V of one kv head). Piecewise linear through ``knots`` ((footprint, share),
    ...), the first share below the first knot, the last above the last; `hot_knots` picks them.
    """
    (x0, y0), (xn, yn) = knots[0], knots[-1]
    if ratio <= x0:
        return y0
    if ratio >= xn:
        return yn
    for (a, ya), (b, yb) in itertools.pairwise(knots):
        if a <= ratio <= b:
            return ya + (yb - ya) * (ratio - a) / (b - a)
    return yn


def hot_knots(d: int, kv_heads: int, params: L2Params = H200_L2_PARAMS) -> tuple:
    """The `hot_miss` knots of FA-2's causal GQA at B > 1 for head dim ``d`` and ``kv_heads`` K/V heads:
    the d 64 kernel's (`L2Params.hot_d64`), else the d 128 kernel's with one K/V head (`hot`) or several
    (`hot_groups`)."""
    if d <= 64:
        return params.hot_d64
    return params.hot_groups if kv_heads > 1 else params.hot


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
