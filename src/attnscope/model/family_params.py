"""The constants of the decode, varlen and backward DRAM-byte estimates (`attnscope.model.family_estimate`,
`attnscope.model.backward_estimate`): one table, `FamilyParams`, each field naming the probe that measures it
(`PROBES`: rows of bench/grids/probe_decode.csv, probe_varlen.csv and probe_backward.csv). A
field that no probe has measured is None, and an estimate that needs it refuses (`NotMeasured`, naming the
field and its probe) rather than run on a guessed number; `H200_FAMILY_PARAMS` holds the values fitted from
the probes measured on the H200. The kernels' geometry that the estimate reads from their sources (split
counts, row tiles, block sizes) is not in this table: it is in `family_estimate`, each fact with the source
it was read from. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.model.l2_params import H200_L2_PARAMS


class NotMeasured(NotImplementedError):
    """An estimate that needs a constant of `FamilyParams` no probe has measured yet."""


@dataclass(frozen=True)
class FamilyParams:
    """The one table of the decode, varlen and backward estimates' measured constants (None: not measured
    yet; the estimates that need it refuse). Each field's probe is `PROBES[field]`."""

    #: attnscope `flash_decode` with S > 1 splits: the share of the fp32 partials' logical bytes (O_s, lse_s
    #: written by phase 1 and read back by the merge) that reaches DRAM grows by this much per L2 of bytes
    #: the call streams (its compulsory bytes and the window's edge) past `attnscope_partials_onset`, up to
    #: 1 (every byte to DRAM and back); below the onset the partials stay in the write-back L2.
    attnscope_partials_dram: float | None = None
    #: attnscope `flash_decode` with S > 1 splits: the bytes the call streams, in L2 sizes, below which the
    #: partials never leave the L2 (`attnscope_partials_dram`).
    attnscope_partials_onset: float | None = None
    #: attnscope `flash_decode` with more than one row tile per (sequence, kv head) (GQA group x nq above the
    #: row-tile cap): share of the extra tiles' K/V reads that reach DRAM (0: all hit the L2, as the tiles of
    #: one (sequence, kv head, split) are adjacent in the grid).
    row_tile_kv_miss: float | None = None
    #: SDPA FLASH decode (PyTorch's FA-2, split-KV kernel + combine) with S > 1: DRAM bytes per logical byte
    #: of its fp32 accumulators (out_accum, lse_accum written and read back by the combine kernel).
    flash_partials_dram: float | None = None
    #: SDPA CUDNN decode: DRAM bytes of K/V per byte of the valid K/V rows of one kv head, MHA (1: each read
    #: once; more: re-reads or padding of the cuDNN kernel, which is closed source).
    cudnn_kv_dram: float | None = None
    #: SDPA CUDNN decode with GQA: K/V DRAM bytes per kv-head byte, per query head of the group (0: the group
    #: shares one read; 1: each query head reads its own, K/V expanded or re-read from DRAM).
    cudnn_gqa_kv_dram: float | None = None
    #: SDPA CUDNN decode: DRAM bytes it moves beyond Q, K/V and O, per (sequence, query head) (workspace,
    #: statistics, partials of its own split).
    cudnn_other_per_row: float | None = None
    #: Backward, naive autograd: DRAM bytes per byte its kernels (`backward_estimate.NAIVE_BWD`: the [N, N]
    #: and [N, d] intermediates re-read and written back) move past the L2 at their reuse distances (the
    #: forward's miss rule; the saved P's cold read and the bool mask are exact terms).
    naive_bwd_s_dram: float | None = None
    #: Backward, causal: share of the re-reads a causal dK/dV kernel's walkers count (Q, dO, LSE2, Delta and
    #: the fp32 dQ rows its atomics add into, by later key tiles; K, V by the dQ kernel's later query tiles)
    #: that reach DRAM, per build: attnscope's portable kernels, its Hopper two-kernel build, its Hopper
    #: one-pass build (`l2_reuse.diagonal_walk_share`: walkers from the diagonal forward), SDPA FLASH (FA-2),
    #: SDPA CUDNN (FA-2's pattern assumed; `l2_reuse.wave_rereads`: walkers from the end). Unmasked, the
    #: lockstep waves' re-reads are the forward's measured rule as it stands: no constant. One constant per
    #: build: the rows' and the accumulator's re-reads share one reuse distance, so no probe tells them apart.
    portable_bwd_reread_dram: float | None = None
    hopper_bwd_reread_dram: float | None = None
    onepass_bwd_reread_dram: float | None = None
    flash_bwd_reread_dram: float | None = None
    cudnn_bwd_reread_dram: float | None = None
    #: attnscope varlen forward: bytes of register-spill frame each thread of a finished program writes
    #: back to DRAM (its dirty local-memory lines evicted before a later program re-dirties them), per build:
    #: d 128 unmasked (pointer K/V loads), d 128 causal (TMA), d 64 unmasked (128 x 128 tiles). d 64 causal
    #: has no stack frame (ptxas), so no constant.
    varlen_frame_d128: float | None = None
    varlen_frame_d128_causal: float | None = None
    varlen_frame_d64: float | None = None
    #: attnscope varlen forward: L2 room a byte of a resident program's Q and O tiles takes while a
    #: sequence's K/V waits for its next wave of programs, in K/V bytes (the wave rule's live set: K/V + the
    #: resident programs' Q/O x this). The dense forward measures its own per access pattern
    #: (`L2Params.qo_weight`, `lockstep_qo` 0.70, `wide_qo` 1.15). Not linear in the estimate: fitted by a
    #: search over the read counters (measure/family_fit.py; the H200 value: `H200_FAMILY_PARAMS`' note).
    varlen_qo_weight: float | None = None
    #: Flex attention (a varlen document mask, a sliding window): L2 room a byte of its Q and O takes in the
    #: dirty-O credit's stream (`family_estimate._dirty_o`), in K/V bytes, in place of the dense forward's
    #: `L2Params.qo_weight` (0.58, attnscope's and FA-2's pattern): Flex keeps less of O dirty at the end.
    #: Not linear: fitted by a search over Flex's write counters (measure/family_fit.py).
    flex_o_weight: float | None = None


#: The footprint (share of the L2) below which a re-read set is taken to stay in the L2 (Flex's heads): the
#: lowest capacity measured for any access pattern on the H200 (`L2Params.shared`, bench/l2_reuse.py --share,
#: probe 4; the script is in git at commit 5eeec86).
RESIDENT_BELOW = min(H200_L2_PARAMS.shared, H200_L2_PARAMS.lockstep, H200_L2_PARAMS.wide,
                     H200_L2_PARAMS.capacity)

#: The H200's constants, fitted on bench/results/h200-2026-12-02-probe-{decode,varlen,
#: backward}.json, h200-2026-12-02c-probe-backward-hmid.json and h200-2026-12-02d-probe-backward-onepass.json
#: (the h-onepass rows) (`python bench/fit_family_params.py F ...`:
#: non-negative least squares over the probe rows, relative errors; each value's probe rows in `PROBES`).
#: "measured ~0": the unconstrained least-squares value was below 0 (a byte term cannot be), so it is 0.
H200_FAMILY_PARAMS = FamilyParams(
    attnscope_partials_dram=0.21,  # the decode sweeps' split rows (PROBES)
    attnscope_partials_onset=0.4,  # searched with it
    row_tile_kv_miss=0.0,  # measured ~0 (least squares -0.0077): the second row tile's K/V hits the L2
    flash_partials_dram=0.0363,  # f-split vs f-nosplit
    cudnn_kv_dram=1.0,  # c-mha: K/V read once
    cudnn_gqa_kv_dram=0.0,  # measured ~0 (least squares -0.00013): the group shares one K/V read
    cudnn_other_per_row=0.0,  # measured ~0 (c-mha-wide vs c-mha: 0 under the non-negative fit; 336 B
    # unconstrained only beside the negative cudnn_gqa_kv_dram)
    naive_bwd_s_dram=0.982,  # n-big, n-causal (the kernel list of `backward_estimate.NAIVE_BWD`)
    portable_bwd_reread_dram=0.0569,  # p-group (p-resident has no counted re-read)
    # h-mid (h200-2026-12-02c-probe-backward-hmid.json; h-mid-unmasked's lockstep waves need no constant;
    # h-group's query set is larger than the L2, which the estimate does not model)
    hopper_bwd_reread_dram=0.489,
    onepass_bwd_reread_dram=0.176,  # h-onepass, h-onepass-unmasked
    flash_bwd_reread_dram=0.0,  # measured ~0 (least squares -0.0193), f-long
    cudnn_bwd_reread_dram=0.0,  # measured ~0 (least squares -0.00982), c-long
    # the varlen spill frames: fitted on the write counters of h200-2026-12-02-probe-varlen.json and
    # -probe-varlen-new.json (the same command with both files); ptxas's stack frames for comparison
    # (bench/results/sm90-varlen-compile-2026-12-02.txt): 352 B pointer-load causal, 200 B TMA causal
    varlen_frame_d128=109.0,  # v-multi, v-long1..2
    varlen_frame_d128_causal=27.9,  # v-gqa, v-long3
    varlen_frame_d64=27.7,  # v-d64
    # varlen_qo_weight: probe_varlen.csv's rows (v-qo1..6 in h200-2026-12-03-probe-varlen-qo.json too) leave
    # it flat: 12-13 of their 17 attnscope rows within 10 % at any value from 0.3 to 1.0; the 72 attnscope
    # rows of the varlen held-out grids 1-3 (h200-2026-12-02*-heldout-varlen*, now development data) have
    # their least mean |error| at 0.9 (3.9 %; 65-66 within 10 % from 0.7 to 1.1); a grid drawn before the fit
    # judges it (bench/grids/heldout_varlen4.csv)
    varlen_qo_weight=0.9,
    # flex_o_weight: searched on the write counters of the 62 Flex rows of probe_varlen.csv (h200-2026-12-02-
    # probe-varlen.json, -probe-varlen-new.json, h200-2026-12-02c-probe-varlen-last3.json) and the varlen
    # held-out grids 1-4 (development data); a grid drawn after the fit judges it (heldout_varlen5.csv)
    flex_o_weight=0.78,
)

#: field -> the probe rows that measure it (bench/grids/probe_*.csv, column ``probe``) and how.
PROBES = {
    "attnscope_partials_dram": "probe_decode.csv d-split1 vs d-split16, d-split16-mid and d-split16-small "
                               "(16 splits streaming 0.27-2.1 L2 sizes), fitted with the onset "
                               "on the totals (bench/fit_family_params.py, on the rows of h200-"
                               "2026-12-02-probe-decode, -heldout-decode and h200-2026-12-05-heldout_decode_"
                               "window, 58 of them with splits; the last two grids development data since)",
    "flex_o_weight": "probe_varlen.csv x-ragged, x-gqa, x-long, x-d64, x-write (Flex) and the Flex rows of "
                     "the varlen held-out grids 1-4, searched on the write counters (measure/family_fit.py "
                     "SEARCHED)",
    "attnscope_partials_onset": "searched with attnscope_partials_dram (measure/family_fit.py SEARCHED) on "
                                "the same rows",
    "row_tile_kv_miss": "probe_decode.csv d-chunk1 vs d-chunk2 (nq 16 vs 64 at group 4: one vs two row "
                        "tiles): the difference over the second tile's K/V bytes",
    "flash_partials_dram": "probe_decode.csv f-split (PyTorch's heuristic picks 32 splits) against "
                           "f-nosplit's excess: the excess over compulsory + LSE, over the accumulators",
    "cudnn_kv_dram": "probe_decode.csv c-mha (MHA): ncu bytes less Q and O, over the K/V bytes",
    "cudnn_gqa_kv_dram": "probe_decode.csv c-gqa (group 8, the same K/V bytes as c-mha): the excess over "
                         "c-mha's, over (group - 1) x the K/V bytes",
    "cudnn_other_per_row": "probe_decode.csv c-mha-wide (4 x c-mha's (sequence, head) rows, the same K/V "
                           "bytes): the excess over c-mha's, per extra row",
    "naive_bwd_s_dram": "probe_backward.csv n-big (one [B, H, N, N] tensor ~10 x L2) and n-causal: ncu less "
                        "compulsory and the saved P, over the counted intermediates; n-small and n-mid (one "
                        "tensor ~0.25 and ~0.8 x L2) check their reuse distances",
    "portable_bwd_reread_dram": "probe_backward.csv p-group (GQA 16, causal, the group's Q/dO set ~0.55 x "
                                "L2, atomic dQ, its 2 sets starting together) and p-stagger (6 sets, "
                                "staggered) against p-resident (no counted re-read): the excess over the "
                                "exact terms, over the counted re-reads and atomics",
    "hopper_bwd_reread_dram": "probe_backward.csv h-mid (causal GQA 8, the group's query set ~0.55 x L2, two "
                              "kernels) against h-resident and h-mid-unmasked: the excess over the exact "
                              "terms, over the counted re-reads",
    "onepass_bwd_reread_dram": "probe_backward.csv h-onepass (kernels=auto, deterministic 0, d 64: the "
                               "Hopper one-pass build, causal GQA 16, the group's query set ~0.55 x L2) "
                               "beside h-onepass-unmasked: the excess over the exact terms, over the counted "
                               "re-reads and atomics",
    "flash_bwd_reread_dram": "probe_backward.csv f-long (causal, N 32k, one head's Q/dO set ~0.3 x L2) "
                             "against f-gqa (no counted re-read): the excess over the exact terms, over the "
                             "counted re-reads and atomics",
    "cudnn_bwd_reread_dram": "probe_backward.csv c-long (as f-long) against c-short and c-gqa (no counted "
                             "re-read): the excess over the exact terms (FA-2's), over the counted re-reads "
                             "and atomics",
    "varlen_frame_d128": "probe_varlen.csv v-multi, v-long1..2 (d 128 unmasked, 512-2560 programs of which "
                         "all but 264 finish before the call ends): the writes beyond O less the dirty-O "
                         "credit, per thread of a finished program whose frame is evicted",
    "varlen_frame_d128_causal": "probe_varlen.csv v-gqa and v-long3 (d 128 causal, 2048 and 4096 programs): "
                                "as varlen_frame_d128",
    "varlen_frame_d64": "probe_varlen.csv v-d64 (d 64 unmasked, 2048 programs): as varlen_frame_d128",
    "varlen_qo_weight": "probe_varlen.csv v-qo1..6 (one unmasked sequence over two or three waves, its K/V "
                        "0.10-0.30 x L2 beside the resident programs' Q/O, ~0.27 x L2 at d 128, half that at "
                        "d 64): where the later wave's re-reads start to miss; a search over the read "
                        "counters of attnscope's varlen rows (with v-tail and v-tail-next: the causal last "
                        "wave); the H200's value from the attnscope rows of the varlen held-out grids 1-3, "
                        "where the probes left it flat",
}


def need(params: FamilyParams, field: str, what: str) -> float:
    """``params.field``, or `NotMeasured` naming the field, ``what`` needs it, and its probe."""
    value = getattr(params, field)
    if value is None:
        raise NotMeasured(f"{what}: the constant {field} is not measured yet (probe: {PROBES[field]}); "
                          "supported now: the calls whose terms need no unmeasured constant")
    return value
