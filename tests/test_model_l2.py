"""model/l2.py: the L2-aware DRAM estimate against the H200 measurements, and its limits (CPU).

The three measured numbers are issue 7's (H200, ncu, 2026-11-29; N = 4,096, d = 128, fp16, unmasked):
naive 32 heads 130.7 MiB per head, naive 1 head 85.6 MiB, SDPA FLASH 32 heads 4.0 MiB. The goal is
+-15 % at every point; recorded grids (tests/data/measure/recorded/ncu.json.gz) are checked the same way.
The probes and result files under bench/ that comments here cite (other than bench/l2_sim.py and the
held-out grids) are in commit 5eeec86: ``git show 5eeec86:bench/l2_reuse.py``.
"""

import gzip
import json
import math
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.measure import ncu
from attnscope.measure.physical import estimate_of, recorded_kernel
from attnscope.model import l2 as physical
from attnscope.model.l2 import error, estimate, logical
from attnscope.model.traffic import traffic

MiB = 2**20
H200_L2 = 62_914_560  # the recorded H200's L2_cache_size (tests/data/measure/recorded/env.json): 60 MiB
RECORDED = Path(__file__).parent / "data" / "measure" / "recorded"


@pytest.mark.parametrize("impl, heads, measured_mib", [
    ("naive", 32, 130.7),
    ("naive", 1, 85.6),   # S (32 MiB) fits in L2: much of the softmax's read of S and GEMM 2's of P hit
    ("flash", 32, 4.0),   # K/V re-reads are served by L2: about Q + K + V + O
])
def test_explains_the_h200_measurements(impl, heads, measured_mib):
    e = estimate(impl, 4096, 128, heads, l2_bytes=H200_L2, sms=132)
    assert abs(error(e.per_head(e.total), measured_mib * MiB)) <= 0.15
    # and the logical model does not, for the two L2 cases
    if (impl, heads) != ("naive", 32):
        assert abs(error(logical(impl, 4096, 128, heads) / heads, measured_mib * MiB)) > 0.15


def test_logical_is_the_traffic_model_for_what_runs():
    assert logical("naive", 4096, 128, 1) == 138_412_032                      # spec §1.1: 132.00 MiB
    # efficient's tiles are the recorded kernel's: fmha_cutlassF_f16_aligned_64x128 (64 queries, 128 keys)
    assert logical("efficient", 4096, 128, 1) == traffic(4096, 128, "fp16", 64, 128)["flash"].total
    assert logical("flash", 4096, 128, 1) == 69_206_016 + 4096 * 4           # spec §4.1 + FP32 logsumexp
    eager = traffic(4096, 128, rows=("naive-causal-eager",))["naive-causal-eager"].total
    assert logical("naive", 4096, 128, 32, causal=True) == 32 * eager


@pytest.mark.parametrize("impl, causal", [("naive", False), ("naive", True), ("flash", False),
                                          ("flash", True), ("attnscope", True), ("efficient", False)])
def test_a_tiny_l2_reads_every_reread_from_dram(impl, causal):
    # an L2 of a few KiB and one CTA at a time: every K/V re-read and every read-back misses
    n, d, heads = 1024, 64, 2
    e = estimate(impl, n, d, heads, causal=causal, l2_bytes=8192, sms=1, ctas_per_sm=1)
    lg = logical(impl, n, d, heads, causal=causal)
    assert e.total >= 0.97 * lg, (e.total, lg)
    assert e.total <= lg + 2 * heads * n * d * 2  # never more than every touched byte (+ split-KV partials)
    assert e.credits == [] or sum(b for _, b in e.credits) < 8192


@pytest.mark.parametrize("impl, causal", [("naive", False), ("naive", True), ("flash", False),
                                          ("cudnn", True), ("efficient", False), ("attnscope", True)])
def test_an_l2_that_holds_everything_reads_each_input_once(impl, causal):
    n, d, heads = 512, 64, 4
    e = estimate(impl, n, d, heads, causal=causal, l2_bytes=2**30)
    qkv = 3 * heads * n * d * 2
    mask = n * n if (impl == "naive" and causal) else 0
    assert e.read == qkv + mask
    assert e.write == 0  # write-back: nothing is evicted during the call ...
    assert e.credits and e.credits[0][0].startswith("O still dirty")  # ... and the output's absence is named
    assert e.total + sum(b for _, b in e.credits) >= e.compulsory - 1


def test_one_copy_gets_the_measured_fraction_of_the_l2():
    # one head of naive at N = 2,048, d = 128: S, P are 8 MiB each; Q, K, V 0.5 MiB each
    frac = physical.H200_L2_PARAMS.capacity
    assert 0.5 <= frac <= 0.7  # bench/l2_reuse.py A on the H200: misses start at 0.58 x L2
    full = estimate("naive", 2048, 128, 1, l2_bytes=20 * MiB, l2_fraction=1.0)
    part = estimate("naive", 2048, 128, 1, l2_bytes=20 * MiB)
    assert part.params["l2_fraction"] == frac and part.total == pytest.approx(estimate(
        "naive", 2048, 128, 1, l2_bytes=round(frac * 20 * MiB), l2_fraction=1.0).total, rel=1e-6)
    assert full.read == 3 * 2048 * 128 * 2 and full.write == 0  # 18 MiB touched fit in 20 MiB
    assert part.total > full.total  # but not in 11.6 MiB: S/P pieces are evicted dirty or re-read


def test_writes_reach_dram_only_when_evicted():
    # 32 heads of EFFICIENT at N = 4,096 (no logsumexp, no spills): O is 32 MiB; the last heads' O is still
    # dirty in L2 at the end
    e = estimate("efficient", 4096, 128, 32, l2_bytes=60 * MiB, sms=132)
    o = 32 * 4096 * 128 * 2
    assert 0 < e.write < o - 4 * MiB
    assert sum(b for _, b in e.credits) == pytest.approx(o - e.write, abs=2)


def test_more_l2_never_costs_more():
    for impl, n, heads, causal in (("naive", 2048, 1, False), ("naive", 4096, 2, True),
                                   ("flash", 16384, 32, True), ("cudnn", 8192, 32, False)):
        totals = [estimate(impl, n, 128, heads, causal=causal, l2_bytes=mb * MiB).total
                  for mb in (4, 8, 16, 24, 32, 64, 128)]
        assert totals == sorted(totals, reverse=True), (impl, totals)
        assert totals[0] > totals[-1]


def test_cost_does_not_grow_with_n():
    import time

    def timed(n):
        t = time.perf_counter()
        for impl in physical.IMPLS:
            estimate(impl, n, 128, 32, causal=True)
        return time.perf_counter() - t

    # the estimate's loops are capped (a few ms from N ~ 2^17 on): 64 x the keys must not cost more; both
    # sizes timed interleaved, best of 5, so a loaded machine slows both alike
    timed(2**18)
    mid, large = [], []
    for _ in range(5):
        mid.append(timed(2**18))
        large.append(timed(2**24))
    assert min(large) < 1.5 * min(mid) + 0.002, (min(mid), min(large))


def test_wave_rereads_head_major_vs_tile_major():
    l2 = 60 * MiB
    # 32 sets of 8 MiB, 128 readers each (N = 16k, d = 128), 264 at a time: head-major keeps a wave on ~3
    # sets (24 MiB fits the 30 MiB one copy gets): read once; tile-major spans all 32 sets (256 MiB): every
    # wave of 264 readers re-reads every set
    head = physical.wave_rereads(32, 128, 264, 8 * MiB, l2_bytes=l2, order="head")
    tile = physical.wave_rereads(32, 128, 264, 8 * MiB, l2_bytes=l2, order="tile")
    assert head == 1.0 and tile == pytest.approx(32 * 128 / 264)
    # 16 readers per set: 512 readers run in 2 waves of ~17 sets (136 MiB): the one set the wave boundary
    # cuts is re-read, all from DRAM: the boundary, CTA 264, is 264 mod 16 = 8 readers into its set
    assert physical.wave_rereads(32, 16, 264, 8 * MiB, l2_bytes=l2) == pytest.approx(1 + 1 / 32)
    # 24 readers per set: the boundary is 264 mod 24 = 0 readers into one, between two sets: nothing re-read
    assert physical.wave_rereads(22, 24, 264, 8 * MiB, l2_bytes=l2) == 1.0
    # a set bigger than the L2 share: the readers that start a wave later re-read it
    assert physical.wave_rereads(4, 200, 132, 40 * MiB, l2_bytes=l2) > 1.0
    # backwards causal readers spread over twice a wave: more re-reads than forwards ones
    fwd = physical.wave_rereads(32, 128, 264, 8 * MiB, 64 * 1024, causal=True, l2_bytes=l2)
    bwd = physical.wave_rereads(32, 128, 264, 8 * MiB, 64 * 1024, causal=True, backward=True, l2_bytes=l2)
    assert 1.0 <= fwd < bwd


def test_miss_curve():
    assert physical.miss(0.5) == 0.0 and physical.miss(1.0) == 0.0
    assert physical.miss(1.15, ramp=1.3) == pytest.approx(0.5)
    assert physical.miss(2.0) == 1.0


@settings(max_examples=150, deadline=None)
@given(impl=st.sampled_from(physical.IMPLS), n=st.integers(1, 40_000),
       d=st.sampled_from([32, 64, 80, 128, 256]), heads=st.integers(1, 64),
       group=st.sampled_from([1, 2, 3, 4, 8]), batch=st.integers(1, 9),
       causal=st.booleans(), dtype=st.sampled_from(["fp16", "bf16", "fp32"]),
       l2_mib=st.sampled_from([1, 6, 40, 60, 256]), sms=st.sampled_from([1, 13, 108, 132]))
def test_never_below_compulsory_without_saying_why(impl, n, d, heads, group, batch, causal, dtype, l2_mib,
                                                   sms):
    kv = heads if impl == "naive" else max(1, heads // group)
    heads = heads if heads % kv == 0 else kv * group
    e = estimate(impl, n, d, heads, batch, dtype, causal, kv_heads=kv, l2_bytes=l2_mib * MiB, sms=sms)
    b = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    qkv = batch * n * d * b * (heads + 2 * kv)
    out = batch * heads * n * d * b + (batch * heads * n * 4 if impl == "flash" else 0)
    assert e.compulsory == qkv + out
    assert e.read >= qkv - 4  # inputs are read at least once: nothing is resident from an earlier kernel
    credited = sum(x for _, x in e.credits)
    assert all(why and x > 0 for why, x in e.credits)
    assert e.total >= e.compulsory - credited - 4, (e.total, e.compulsory, e.credits)
    assert credited <= out + 4  # only output can be credited (dirty in L2 at the end)
    assert e.total <= 1.05 * logical_bound(impl, n, d, heads, batch, b, causal, kv) + 4 * e.compulsory


def logical_bound(impl, n, d, heads, batch, b, causal, kv):
    """Every byte the call touches, read or written, once per touch (no cache at all)."""
    if impl == "naive":
        return logical(impl, n, d, heads, batch, "fp16" if b == 2 else "fp32", causal) * (2 if b == 4 else 1)
    bh = batch * heads
    return bh * n * d * b * 2 + 2 * bh * n * n * d * b / 64 + batch * kv * 2 * n * d * b


def test_per_kernel_ledger_names():
    e = estimate("naive", 1024, 64, 2, causal=True, l2_bytes=H200_L2)
    assert [k.name for k in e.kernels] == ["GEMM (QK^T)", "masked_fill", "softmax", "GEMM (PV)"]
    assert e.to_json()["total"] == e.total and e.params["l2_bytes"] == H200_L2


def test_device_defaults_come_from_the_roofline_table():
    from attnscope.model.roofline import device

    e = estimate("flash", 1024, 64, 1)
    assert e.params["l2_bytes"] == device("h200").l2 and e.params["sms"] == device("h200").sms


def test_errors():
    with pytest.raises(ValueError, match=r"impl: expected one of naive, flash, cudnn, efficient, attnscope, "
                                         r"got 'math'"):
        estimate("math")
    with pytest.raises(ValueError, match=r"ramp: expected a number > 1, got 1"):
        estimate("flash", ramp=1)
    with pytest.raises(ValueError, match=r"kv_heads: expected a divisor of heads \(32\), got 5"):
        estimate("flash", kv_heads=5)
    with pytest.raises(NotImplementedError, match=r"kv_heads: naive attention with kv_heads != heads"):
        estimate("naive", kv_heads=8)
    with pytest.raises(ValueError, match=r"order: expected one of head, tile, got 'random'"):
        physical.wave_rereads(2, 2, 2, 1, order="random", l2_bytes=10)
    with pytest.raises(ValueError, match=r"l2_fraction: expected a fraction in \(0, 1\], got 0"):
        estimate("flash", l2_fraction=0)
    with pytest.raises(ValueError, match=r"dtype: expected one of fp16, bf16, fp32, got 'fp8'"):
        estimate("flash", dtype="fp8")
    with pytest.raises(ValueError, match=r"l2_bytes: expected a positive integer, got 0"):
        estimate("flash", l2_bytes=0)
    with pytest.raises(ValueError, match=r"measured: expected a positive byte count, got 0"):
        error(1.0, 0)


def _recorded_points():
    path = RECORDED / "ncu.json.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rec = json.load(f)
    env = rec["env"]
    points = []
    for run in rec["runs"]:
        if not run.get("csv") or run["cache_control"] != "none":
            continue
        calls = ncu.split_at_markers(ncu.parse_csv(run["csv"]))
        for spec, ks in ncu.pair(run["status"], calls):
            if spec.get("ok") and ks:
                points.append((spec, sum(k.total for k in ks), env["l2_bytes"], env["sms"],
                               [k.name for k in ks], recorded_kernel(spec, ks)))
    return points


# Recorded points the estimate does not reach within +-15 %, each held to its measured band so that a
# change there (better or worse) is seen. None since the measured L2 parameters (bench/l2_reuse.py A:
# capacity 0.58 x L2, ramp 1.72): attnscope N = 16,384, 32 heads, unmasked, was +23 % with the assumed
# 0.5 / 1.3 and is now within +-5 %.
KNOWN_MISS: dict = {}


@pytest.mark.skipif(not _recorded_points(), reason="no recorded ncu grid yet")
def test_recorded_grid_within_15_percent():
    """Every recorded ncu point within +-15 % of the estimate, except the documented misses, each held
    to its measured band so that a change there (better or worse) is seen. attnscope's calls are estimated
    for the autotuned portable config ncu saw them run (`recorded_kernel`), as bench/l2_dev.py
    does."""
    misses = []
    portable = autotuned = 0
    for spec, measured, l2, sms, names, kernel in _recorded_points():
        e = estimate_of(spec, l2, sms, names, kernel)
        portable += spec["impl"] == "attnscope" and e.kernels[0].name.startswith("attnscope portable")
        autotuned += kernel is not None
        err = error(e.total, measured)
        key = (spec["impl"], spec["n"], spec["d"], spec["heads"], spec["causal"])
        lo, hi = KNOWN_MISS.get(key, (-0.15, 0.15))
        if not lo <= err <= hi:
            misses.append(f"{spec['impl']} n={spec['n']} d={spec['d']} h={spec['heads']} "
                          f"causal={spec['causal']}: {err:+.1%} (allowed {lo:+.0%}..{hi:+.0%})")
    assert not misses, "\n".join(misses)
    # every recorded attnscope call ran (and is estimated for) the portable kernel; those that ran another
    # autotuned config than the table's own are estimated for that config
    assert portable == sum(s["impl"] == "attnscope" for s, *_ in _recorded_points()) > 0 and autotuned > 0


def test_a_measured_kernel_geometry_replaces_the_table():
    # the recorded H = 32, N = 16,384 unmasked point ran the portable kernel's autotuned 8-warp config (ncu:
    # 256 threads, grid 128 x 32; 128 KiB of shared memory: one CTA per SM) and read + wrote 537,067,776
    # bytes; with the table's two CTAs per SM a wave boundary cuts a K/V set and the estimate is 11 % high
    measured = 409_860_864 + 127_206_912
    ran = physical.Kernel(128, 64, 1, "hb", False, False, threads=256)
    call = {"l2_bytes": H200_L2, "sms": 132, "attnscope_impl": "portable"}
    table = estimate("attnscope", 16384, 128, 32, **call)
    e = estimate("attnscope", 16384, 128, 32, **call, kernel=ran)
    assert error(table.total, measured) > 0.08
    assert abs(error(e.total, measured)) < 0.05
    with pytest.raises(ValueError, match=r"kernel: expected an l2.Kernel or None, got \(128, 64\)"):
        estimate("attnscope", kernel=(128, 64))


#: Calls either side of the measured-pattern parameters' domains: FA-2 unmasked MHA at N = 16,384
#: (T = 128 <= C = 264: `L2Params.for_lockstep`), EFFICIENT's 64-row tiles at N = 32,079 (T = 502 > C = 264:
#: `L2Params.for_wide`), and the causal and GQA calls of both geometries, which keep the shared parameters.
PATTERN_CALLS = {"lockstep": ("flash", 16384, 128, 32, 5, "fp16", False, None),
                 "wide": ("efficient", 32079, 128, 25, 3, "fp16", False, None),
                 "lockstep causal": ("flash", 16384, 128, 32, 5, "fp16", True, None),
                 "lockstep gqa": ("flash", 16384, 128, 32, 5, "fp16", False, 8),
                 "wide causal": ("efficient", 32079, 128, 25, 3, "fp16", True, None),
                 "wide gqa": ("efficient", 32079, 128, 25, 3, "fp16", False, 5)}


@pytest.mark.parametrize("domain, measured, shared_over", [
    # E (16 sets of 128 readers): with the shared parameters FA-2 B = 5 H = 32 is 8-12 % over the H200's
    # counters (lockstep and wave-count probes: 18.37 MiB per head), E's put it within 5 %
    ("lockstep", (18.37 * MiB * 5 * 32,), 0.05),
    # E-wide (sets of T = 2 P readers): EFFICIENT B = 3 H = 25, two runs of the wave-count probe (2,996.7 and
    # 2,890.7 MB); the shared parameters put the estimate 10-14 % over them, E-wide's within 5 %
    ("wide", (2_996_707_840, 2_890_728_960), 0.09)])
def test_measured_pattern_parameters_apply_to_their_unmasked_mha_domain_only(monkeypatch, domain, measured,
                                                                             shared_over):
    # bench/l2_reuse.py measured K/V sets read by one run of readers and never again, T <= C (E) and T > C
    # (E-wide); each fit replaces the shared parameters in its own domain only
    kw = {"l2_bytes": H200_L2, "sms": 132}

    def totals():
        return {k: estimate(*c[:7], kv_heads=c[7], **kw).total for k, c in PATTERN_CALLS.items()}
    shipped = totals()
    p = physical.H200_L2_PARAMS
    monkeypatch.setattr(physical, "H200_L2_PARAMS", replace(
        p, **{domain: p.shared, f"{domain}_ramp": p.shared_ramp, f"{domain}_qo": p.qo_weight()}))
    as_shared = totals()
    assert shipped[domain] < as_shared[domain]  # more room, or a gentler miss curve: fewer re-reads
    others = [k for k in PATTERN_CALLS if k != domain]
    assert {k: shipped[k] for k in others} == {k: as_shared[k] for k in others}
    for m in measured:
        assert abs(error(shipped[domain], m)) < 0.05
        assert error(as_shared[domain], m) > shared_over


@pytest.mark.parametrize("call, runs", [
    # grid 18's cuDNN MQA point and grid 17's FA-2 GQA one (bench/results/*bytes-heldout1[78]*: three runs
    # each): calls of about one L2 made mostly of Q and O; O's retention in raw bytes had them 10-11 % over
    (("cudnn", 1812, 128, 17, 4, "bf16", 1), (44_952_064, 45_024_256, 44_991_744)),
    (("flash", 3793, 128, 25, 1, "fp16", 5), (40_393_216, 40_318_976, 40_172_032))])
def test_dirty_o_is_kept_in_the_reread_models_room(call, runs):
    # Q and O lines live on one L2 partition, K/V lines on both (`COPIES`): a call of mostly Q and O keeps
    # more of its O dirty at the end than the same call with a K/V head per query head
    impl, n, d, h, b, dtype, hkv = call
    e = estimate(impl, n, d, h, b, dtype, kv_heads=hkv, l2_bytes=H200_L2, sms=132)
    for measured in runs:
        assert abs(error(e.total, measured)) < 0.06
    kept = dict(e.credits)[physical.DIRTY_O]
    out = b * h * n * d * 2 + (b * h * n * 4 if physical.KERNELS[impl][128].lse else 0)
    mha = estimate(impl, n, d, h, b, dtype, l2_bytes=H200_L2, sms=132)
    assert kept / out > dict(mha.credits).get(physical.DIRTY_O, 0) / out


def test_fa2_d64_causal_mha_frames_are_written_back_as_the_l2_fills(monkeypatch):
    # FA-2's d 64 causal MHA frames are written back more than once per CTA, in proportion to the L2's
    # fills past one L2 (`L2Params.frame_fill_share`, `fill_per_read`: bench/gpu/l2_counters_probe.sh).
    # Grid 20's B = 1, H = 41, N = 14,269 bf16 (three runs): the dead-frame term alone was 10 % low, this
    # within 3 %.
    kw = {"l2_bytes": H200_L2, "sms": 132}
    calls = {"d64": ("flash", 14269, 64, 41, 1, "bf16", True, None),
             "d64 gqa": ("flash", 14269, 64, 41, 1, "bf16", True, 41),  # MHA spelt with kv_heads: the same
             "d64 mqa": ("flash", 14269, 64, 41, 1, "bf16", True, 1),
             "d128": ("flash", 14269, 128, 41, 1, "bf16", True, None),
             "d64 unmasked": ("flash", 14269, 64, 41, 1, "bf16", False, None)}

    def totals():
        return {k: estimate(*c[:7], kv_heads=c[7], **kw).total for k, c in calls.items()}
    shipped = totals()
    no_fill = replace(physical.H200_L2_PARAMS, frame_fill_share=0.0)
    monkeypatch.setattr(physical, "H200_L2_PARAMS", no_fill)
    dead_only = totals()
    assert shipped["d64"] == shipped["d64 gqa"] > dead_only["d64"]
    assert {k: shipped[k] for k in ("d64 mqa", "d128", "d64 unmasked")} == \
        {k: dead_only[k] for k in ("d64 mqa", "d128", "d64 unmasked")}
    for measured in (348_058_112, 348_812_800, 348_067_072):
        assert abs(error(shipped["d64"], measured)) < 0.03
        assert error(dead_only["d64"], measured) < -0.09


def test_the_reread_curve_keeps_part_of_a_just_too_large_output():
    # one head, N = 4,096: S is 32 MiB; the softmax re-reads S[x] after the rest of S and x of S and P
    # (32-64 MiB, LRU stack distance): exact LRU with one copy's 34.8 MiB would miss 91 % of it; the H200
    # read 17.64 of the 32 MiB from DRAM, and the measured re-read curve (misses from 0.58 to 1.0 x L2)
    # keeps about half
    e = estimate("naive", 4096, 128, 1, l2_bytes=H200_L2, sms=132)
    assert [k.name for k in e.kernels][1] == "softmax"
    assert 0.35 * 32 * MiB < e.kernels[1].read < 0.75 * 32 * MiB


def lru_naive(n, d, bh, causal, l2, line=1024, b=2):
    """DRAM (read, write) bytes of an exact LRU, write-back, write-allocate cache of ``l2`` bytes, lines of
    ``line`` bytes, over the naive path's access trace: GEMM 1 reads Q, K and writes S; [masked_fill reads S
    and head h's slice of the shared bool mask, writes S']; softmax reads S (S') and writes P; GEMM 2 reads
    P and V and writes O; each kernel walks its buffers in order, in proportion. Dirty lines still cached
    at the end are not counted (what ncu sees)."""
    s, qk, vo, m = bh * n * n * b, 2 * bh * n * d * b, bh * n * d * b, n * n
    cache, cap, dram = OrderedDict(), l2 // line, [0, 0]

    def touch(buf, lo, hi, write):  # the lines of bytes [lo, hi) of buffer ``buf``
        for ln in range(lo // line, -(-hi // line)):
            key = (buf, ln)
            if key in cache:
                cache.move_to_end(key)
                cache[key] = cache[key] or write
                continue
            dram[0] += 0 if write else line
            cache[key] = write
            if len(cache) > cap:
                dram[1] += line if cache.popitem(last=False)[1] else 0

    steps = s // line

    def kernel(*streams):  # (buffer, size, write): step i touches the i-th 1/steps slice of each
        for i in range(steps):
            for buf, size, write in streams:
                if buf == "mask":  # head h re-reads the mask from its start: its slice of the head
                    h0, h1 = i * bh / steps, (i + 1) * bh / steps
                    lo, hi = round((h0 - int(h0)) * m), round((h1 - int(h0)) * m)
                    touch("mask", lo, min(hi, m), False)
                    if hi > m:
                        touch("mask", 0, hi - m, False)
                else:
                    touch(buf, i * size // steps, (i + 1) * size // steps, write)
    kernel(("Q,K", qk, False), ("S", s, True))
    if causal:
        kernel(("S", s, False), ("mask", m, False), ("S'", s, True))
    kernel(("S'" if causal else "S", s, False), ("P", s, True))
    kernel(("P", s, False), ("V", vo, False), ("O", vo, True))
    return tuple(dram)


@pytest.mark.parametrize("n, bh, causal", [(512, 2, False), (384, 3, True), (512, 1, True)])
def test_naive_is_exact_lru_with_a_step_curve(n, bh, causal):
    # the closed-form stack distances against a brute-force LRU of the same trace, from an L2 that holds
    # nothing to one that holds everything (S = 2 n^2 bh bytes; the knee is at 2-3 S)
    s = 2 * bh * n * n
    for ratio in (0.5, 1.5, 1.9, 2.2, 2.6, 3.0, 3.4, 5.0):
        l2 = int(ratio * s) // 1024 * 1024
        read, write = lru_naive(n, 64, bh, causal, l2)
        e = estimate("naive", n, 64, bh, causal=causal, l2_bytes=l2, l2_fraction=1.0, ramp=1.0 + 1e-9)
        assert e.read == pytest.approx(read, rel=0.01, abs=4096), (ratio, e.read / s, read / s)
        assert e.write == pytest.approx(write, rel=0.01, abs=4096), (ratio, e.write / s, write / s)


def test_naive_intermediates_that_fit_are_never_reread_from_dram():
    # held-out grid 5's naive point: 3 heads, N = 1,553, causal: S, S' and P are 13.8 MiB each; each is
    # re-read after at most two of them and the mask (29.9 MiB < the 34.8 MiB where re-reads start to miss):
    # the H200 read Q, K, V and the mask only (6.19 MB); the estimate reads exactly those
    n, d, h = 1553, 128, 3
    e = estimate("naive", n, d, h, causal=True, l2_bytes=H200_L2, sms=132)
    s, mask = h * n * n * 2, n * n
    assert 2 * s + mask < physical.H200_L2_PARAMS.capacity * H200_L2
    assert e.read == pytest.approx(3 * h * n * d * 2 + mask, abs=8)
    # what reaches DRAM dirty is S: re-read from the L2, then evicted by the 32-46 MiB touched after it (S',
    # P, V, O and the rest of S and S') where that passes the capacity; S' and P stay. The H200 wrote
    # 10.51 MB (measured, bench/results/h200-2026-12-01-bytes-heldout5.json) of 16.70 MB in all
    assert 0 < e.write < s
    assert e.write == pytest.approx(10_512_896, rel=0.15) and e.total == pytest.approx(16_703_232, rel=0.05)
    # every byte here is re-read within the capacity, so the re-read curve's ramp plays no part: exact LRU
    # at the same capacity gives the same bytes
    lru = estimate("naive", n, d, h, causal=True, l2_bytes=H200_L2, sms=132, ramp=1.0 + 1e-9)
    assert lru.read == e.read and lru.write == pytest.approx(e.write, rel=0.01)


def test_one_wave_in_step_reads_each_set_once():
    # 256 CTAs of one 16 MiB set all start in the first of 264 slots: no wave re-reads it
    assert physical.wave_rereads(1, 256, 264, 16 * MiB, 64 * 1024, l2_bytes=60 * MiB) == 1.0
    # 2 sets of 256: the second set's CTAs straddle the wave boundary; its 16 MiB + 16.5 MiB of Q/O exceed
    # the 30 MiB: re-read
    assert physical.wave_rereads(2, 256, 264, 16 * MiB, 64 * 1024, l2_bytes=60 * MiB) > 1.0


def test_gqa_heads_split_by_the_batch_reread_their_kv_set():
    # FLASH's grid is (m, b, h): with batch > 1 the 8 query heads of a kv head are B T_r CTAs apart. At
    # B = 1 they are adjacent (one set, read once); at B = 16 the 15 other batches' 8 MiB sets come between
    def kv_read(batch):
        e = estimate("flash", 16384, 128, 8, batch, kv_heads=1, l2_bytes=H200_L2, sms=132)
        return e.read / batch - 8 * 16384 * 128 * 2  # K/V bytes read per batch
    assert kv_read(1) == pytest.approx(8 * MiB, rel=0.02)
    assert kv_read(16) > 4 * 8 * MiB
    # EFFICIENT's grid is (m, h, b) and attnscope's program b * H + h: the group stays adjacent whatever
    # the batch
    for impl in ("efficient", "attnscope"):
        e = estimate(impl, 16384, 128, 8, 16, kv_heads=1, l2_bytes=H200_L2, sms=132)
        assert e.read / 16 - 8 * 16384 * 128 * 2 == pytest.approx(8 * MiB, rel=0.02), impl


def test_forward_causal_readers_reread_only_what_one_launch_interval_evicts():
    l2 = 60 * MiB
    cap = physical.H200_L2_PARAMS.capacity * l2
    # 32 sets of 16 MiB (N = 32k, d = 128), 256 causal readers each loading half on average: consecutive
    # readers start one launch interval apart, in which ~8 MiB + a Q/O tile come in: every re-read hits
    fwd = physical.wave_rereads(32, 256, 264, 16 * MiB, 64 * 1024, causal=True, l2_bytes=l2, share=0.5)
    assert fwd == 1.0
    # a set so large that one CTA's share of it exceeds what the L2 keeps: every re-read misses
    big = physical.wave_rereads(4, 8, 264, 4 * cap, causal=True, l2_bytes=l2, share=0.5)
    assert big == pytest.approx(1 + 8 * 0.5 - 1)
    # the next head of a GQA group starts half a head of launches later; bounded by the window
    assert physical.wave_rereads(8, 4 * 64, 264, 16 * MiB, 64 * 1024, causal=True, l2_bytes=l2, share=0.5,
                                 heads_per_set=4) >= fwd


def test_a_static_schedule_separates_causal_readers_by_a_diagonal_step():
    # bench/l2_reuse.py C: 32 sets, 16 readers each, 264 persistent programs. Two visits of a tile are
    # 264 diagonal steps (kv / 16 each) apart: 33 MiB at 2 MiB sets (under the 34.8 MiB the L2 keeps: no
    # re-read misses), 66 MiB at 4 MiB (past the ramp's end: every re-read misses)
    def amp(kv_mib, backward):
        share = sum(i + 1 for i in range(16)) / 16 / 16
        return physical.wave_rereads(32, 16, 264, kv_mib * MiB, causal=True, backward=backward,
                                     l2_bytes=60 * MiB, share=share, schedule="static")
    assert amp(2, True) == 1.0 and amp(4, True) == pytest.approx(1 + 16 * 8.5 / 16 - 1)
    # forward walkers: the first round of 264 readers starts in step; the later ones re-read
    assert amp(2, False) == 1.0 and 1.0 < amp(16, False) < amp(16, True)
    with pytest.raises(ValueError, match="schedule: expected one of dynamic, static"):
        physical.wave_rereads(1, 1, 1, 1.0, l2_bytes=1, schedule="round-robin")


def test_cudnn_is_a_persistent_grid_of_one_cta_per_sm():
    # ncu on the H200: cudnn's sm90 fprop kernel runs a grid of 132 CTAs (the SMs), one per SM
    assert all(k.persistent and k.ctas_per_sm == 1 for k in physical.KERNELS["cudnn"].values())
    assert not any(k.persistent for impl in ("flash", "efficient", "attnscope")
                   for k in physical.KERNELS[impl].values())


def test_kv_that_fits_the_l2_is_read_once_whatever_the_grid_order():
    # FLASH, GQA with the batch between a group's heads: 2 batches x 2 kv heads of 2 MiB (N = 4,000,
    # d = 128) = 8 MiB of K/V in all, well inside the L2: each kv set is read from DRAM once
    n, d, b, h, hkv = 4000, 128, 2, 16, 2
    e = estimate("flash", n, d, h, b, kv_heads=hkv, causal=True, l2_bytes=H200_L2, sms=132)
    assert e.read == pytest.approx(b * n * d * 2 * (h + 2 * hkv), rel=1e-3)


# --- issue 18: what runs (attnscope's dispatch), spills, the spread of the reuse distance ---------------
def test_attnscope_kernel_follows_the_dispatch_rule():
    """kernel_of picks what impl='auto' picks (`model.dispatch.hopper_variant`, the one rule: no torch, the
    same for every dtype); every Gluon variant is modelled with the tiles and schedule its source has."""
    from attnscope.model import dispatch

    for d in (64, 128):
        for dtype in ("fp16", "bf16", "fp32"):
            for causal in (False, True):
                for n, batch, heads, hkv in ((777, 4, 8, 8), (1024, 16, 32, 32), (2047, 3, 12, 4),
                                             (4096, 4, 32, 8), (8192, 2, 32, 32), (31_999, 1, 8, 1)):
                    want = dispatch.hopper_variant(d, causal, batch, heads, hkv, n, n) or \
                        "attnscope portable"
                    name, _ = physical.kernel_of("attnscope", d, causal, dtype, n, "auto", batch, heads, hkv)
                    assert name == want, (d, dtype, causal, n)
                    assert physical.kernel_of("attnscope", d, causal, dtype, n, "portable")[0] == \
                        "attnscope portable"
    assert set(physical.HOPPER_KERNELS) == set(dispatch.VARIANTS)
    fwd = pytest.importorskip("attnscope.kernels.fwd")
    fwd_hopper = pytest.importorskip("attnscope.kernels.fwd_hopper")
    assert tuple(fwd_hopper.VARIANTS) == dispatch.VARIANTS
    assert fwd_hopper.DEFAULT_VARIANT == dispatch.DEFAULT_VARIANT
    for variant, var in fwd_hopper.VARIANTS.items():
        table = physical.HOPPER_KERNELS[variant]
        assert set(table) == set(var.configs), variant
        for d, cfg in var.configs.items():
            assert (table[d].block_q, table[d].block_kv, table[d].persistent) == \
                (cfg.NWG * cfg.BM, cfg.BN, var.persistent), (variant, d)
    # the portable kernel's tiles are its CONFIG_TABLE rows
    for d, causal, _, cfg in fwd.CONFIG_TABLE:
        ker = physical.kernel_of("attnscope", d, causal, "fp16", 512, "portable")[1]
        assert (ker.block_q, ker.block_kv) == (cfg.BLOCK_M, cfg.BLOCK_N), (d, causal)


def test_spills_are_the_touched_frames_of_the_variant_that_runs():
    for key, touched in physical.FA2_FRAME.items():  # a thread touches at most its compiler-reserved frame
        assert all(0 <= t <= st for t, st in zip(touched, physical.FA2_STACK[key], strict=True)), key
    ker = physical.KERNELS["flash"][-128]
    even, ragged = ker.frame
    assert even < ragged  # FA-2's Is_even_MN causal kernel spills less than the ragged one
    # N = 8,192 is a multiple of both blocks (128, 64): 2 x 64 CTAs of 128 threads, the even frame each;
    # 8,191, or 8,256 (a multiple of 64 only), take the ragged kernel
    assert physical.spill_bytes(ker, 128, 8192, 8192) == 128 * 128 * even
    assert physical.spill_bytes(ker, 128, 8191, 8191) == physical.spill_bytes(ker, 128, 8256, 8256) == \
        128 * 128 * ragged
    assert physical.spill_bytes(physical.KERNELS["cudnn"][128], 128, 8191, 8191) == 0
    assert physical.spill_bytes(physical.HOPPER_KERNELS["hopper_persist"][128], 128, 8191, 8191) == 0


def test_dead_frames_reach_dram_unless_reused_first():
    cap = 30 * MiB
    f = physical.dead_frame_evicted
    assert f(cap, 1000, 264, cap) == 0.0  # all the call inserts fits: every dead frame is re-dirtied in L2
    # one CTA lifetime inserts inserted x C / CTAs; survival over `L2Params.slot_reuse_lifetimes` of them
    life = 100 * MiB * 264 / 2640
    assert f(100 * MiB, 2640, 264, cap) == pytest.approx(
        1 - math.exp(-physical.H200_L2_PARAMS.slot_reuse_lifetimes * life / cap))
    assert f(1e12, 2640, 264, cap) == pytest.approx(1.0)
    # the estimate: the causal ragged call writes back more than the same call with no spills, at most
    # the touched frames; GQA (K/V read once, fewer insertions) writes back a smaller share of them
    n, h = 8191, 16
    frames = h * 64 * 128 * physical.KERNELS["flash"][-128].frame[1]
    no_spill = dict(physical.KERNELS["flash"])
    no_spill[-128] = no_spill[-128]._replace(frame=(0, 0))

    def extra(kv_heads):
        base = estimate("flash", n, 128, h, causal=True, kv_heads=kv_heads, l2_bytes=H200_L2, sms=132)
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(physical.KERNELS, "flash", no_spill)
            plain = estimate("flash", n, 128, h, causal=True, kv_heads=kv_heads, l2_bytes=H200_L2, sms=132)
        assert base.read == plain.read and base.compulsory == plain.compulsory
        return base.write - plain.write
    assert 0.5 * frames < extra(h) <= frames
    assert 0 < extra(1) < extra(h)
    assert estimate("flash", n, 128, h, causal=True, l2_bytes=2**34).write == 0  # a huge L2 keeps all


def test_mean_miss_is_the_average_of_the_miss_curve():
    ramp = physical.H200_L2_PARAMS.ramp
    for lo, hi in ((0.2, 0.9), (0.8, 1.3), (1.1, 1.5), (0.5, 2.5), (1.8, 2.2)):
        steps = 20_000
        numeric = sum(physical.miss(lo + (i + 0.5) * (hi - lo) / steps, ramp) for i in range(steps)) / steps
        assert physical.mean_miss(lo, hi, ramp) == pytest.approx(numeric, abs=1e-6), (lo, hi)
        # the same interval given far end first (a lockstep (q + 2, q + 1) wave pair): the same mean
        assert physical.mean_miss(hi, lo, ramp) == pytest.approx(numeric, abs=1e-6), (hi, lo)
    assert physical.mean_miss(1.2, 1.2, ramp) == physical.miss(1.2, ramp)


def test_a_set_straddling_waves_sees_one_set_more_or_less_than_the_mean():
    # 1 set per 1.94 waves (EFFICIENT, N = 32,747, d = 128: 512 CTAs of a 16.8 MB set, 264 at a time): the
    # mean distance (1.52 sets + a wave's Q/O, 34 MB) is under the 36.5 MB one copy keeps, but a set that
    # shares both waves with others has two sets between the reads of a tile: some re-reads miss
    l2 = 62_914_560
    kv, qo = 2 * 32747 * 128 * 2, 2 * 64 * 128 * 2
    amp = physical.wave_rereads(17, 512, 264, kv, qo, l2_bytes=l2)
    work = (264 / 512 + 1) * kv + 264 * qo
    assert work < physical.H200_L2_PARAMS.capacity * l2 and amp > 1.0


def test_a_causal_window_reads_its_newest_set_only_up_to_the_launched_diagonals():
    # FA-2's causal window of W = spread x C consecutive CTAs: the heavy CTAs of its oldest set read all of
    # that set, the light ones launched so far of its newest set only their tiles: W / T to W / T + 1 sets,
    # not the W / T + 1 it spans (half a set fewer on average). A step curve at the mean shows it: with the
    # capacity between the two, the old count re-read every pass, the new one about half of them
    c, t, spread, kv = 264, 200, 2.0, 1 * MiB
    w = spread * c / t  # 2.64 sets
    cap = (w + 0.75) * kv  # between W / T + 0.5 (the new mean) and W / T + 1 (the old one)
    params = physical.L2Params(shared=1.0, shared_ramp=1.0 + 1e-6)
    amp = physical.wave_rereads(64, t, c, kv, causal=True, backward=True, spread=spread, l2_bytes=int(cap),
                                params=params.for_shared())
    passes = (spread + t / c) * (t - 1) / c
    assert amp - 1 == pytest.approx(passes * 0.25, rel=1e-3)
    # FA-2 d = 64 causal at N = 27,389 (B = 3, H = 3, bf16; heldout6 and the lockstep probe): the H200 re-read
    # 0.01-0.03 K/V sets; the half set the window does not hold is what kept the estimate at 0.46
    e = estimate("flash", 27389, 64, 3, batch=3, dtype="bf16", causal=True, l2_bytes=H200_L2, sms=132)
    kv_all = 3 * 3 * 2 * 27389 * 64 * 2
    assert (e.read - 3 * 3 * 27389 * 64 * 2 - kv_all) / kv_all < 0.1


def test_fa2_causal_sets_stay_live_while_their_readers_start():
    # FA-2's backward walkers under the block scheduler: C slots, a new CTA whenever one frees, so in the
    # steady state C CTAs start per mean CTA lifetime (a wave). A set's T readers start over T / C waves
    # and the last one runs the longest CTA's lifetime (`spread` waves): the set is live for spread + T / C
    # waves, and each wave of it re-reads the set. With no L2 every re-read misses:
    c, spread = 264, 2.0
    for t in (12, 97, 256, 600):
        live = spread + t / c
        amp = physical.wave_rereads(64, t, c, 16 * MiB, causal=True, backward=True, spread=spread,
                                    l2_bytes=1)
        assert amp == pytest.approx(1 + live * (t - 1) / c), t
    # a persistent static schedule has no launch span (bench/l2_reuse.py C): a diagonal step apart instead
    static = physical.wave_rereads(64, 256, c, 16 * MiB, causal=True, backward=True, spread=spread,
                                   l2_bytes=1, schedule="static")
    assert static == pytest.approx(1 + (256 * 1.0 - 1))
    # FA-2 at N = 32,768, d = 128 (the heldout1 point): 256 readers of a 16 MiB set, 264 slots: the set is
    # live ~3 waves, not the longest CTA's 2; the launch's 6.8 waves make their share of the steady re-reads
    e = estimate("flash", 32768, 128, 7, causal=True, l2_bytes=H200_L2, sms=132)
    kv_extra = e.read - 3 * 7 * 32768 * 128 * 2  # beyond Q, K, V once
    g = physical.Grid(32768, 32768, 128, 64, causal=True)
    s = g.kv_rows_loaded(g.n_q_tiles) / (g.kv_rows_total() / g.n_q_tiles)
    steady = 7 * 2 * 32768 * 128 * 2 * (s + 256 / 264) * 255 / 264
    assert kv_extra == pytest.approx(steady * physical.launch_fill_share(7 * 256 / 264), rel=0.01)


def test_kernel_of_reads_the_dispatch_rule_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys; from attnscope.model import l2; "
            "l2.estimate('attnscope', 8192, 128, 8, dtype='bf16'); "
            "l2.kernel_of('attnscope', 64, True, 'bf16', 9000); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip() == "[]"


def _boundaries(c, t, waves):
    """Brute force: for the wave boundaries at CTAs w c (w = 1 .. waves - 1) in sets of t consecutive CTAs,
    the sets the waves either side touch, or None where the boundary falls between two sets."""
    out = []
    for w in range(1, waves):
        o = w * c
        if o % t == 0:
            out.append(None)
            continue
        a = (o - 1) // t - (o - c) // t + 1  # sets touched by CTAs o - c .. o - 1
        b = (o + c - 1) // t - o // t + 1  # ... by CTAs o .. o + c - 1
        out.append((a, b))
    return out


@pytest.mark.parametrize("c, t", [(264, 500), (264, 484), (264, 502), (264, 128), (264, 264), (132, 216),
                                  (264, 97), (264, 1000), (264, 12)])
def test_wave_pairs_are_the_boundaries_of_a_full_period_of_waves(c, t):
    # over T / gcd(C, T) consecutive boundaries every offset k gcd(C, T) in a set occurs once: counting the
    # sets either side of each boundary by brute force gives wave_pairs' distribution exactly
    period = t // math.gcd(c, t)
    seen = _boundaries(c, t, period + 1)
    pairs = physical.wave_pairs(c, t)
    assert sum(p for *_, p in pairs) == pytest.approx(1 - seen.count(None) / period)
    for a, b, p in pairs:
        assert p == pytest.approx(seen.count((a, b)) / period), (a, b)
    # a wave of C CTAs spans C / T sets and one more for each set boundary it crosses: on average over
    # the boundaries that cut a set, both neighbours span 1 + C / T sets
    cut = 1 - seen.count(None) / period
    if cut:
        assert sum(a * p for a, _, p in pairs) / cut == pytest.approx(
            sum(x[0] for x in seen if x) / (period - seen.count(None)))


def test_lockstep_waves_reread_the_set_each_boundary_cuts():
    # with no L2 every re-read misses: one CTA at a time re-reads its set for every CTA but the first
    assert physical.wave_rereads(3, 8, 1, 1 * MiB, l2_bytes=1) == pytest.approx(8.0)
    # 4 sets of 500 CTAs, 264 at a time: 8 waves, 7 boundaries, each re-reads the set it cuts (their
    # offsets in a set are multiples of gcd(264, 500) = 4; the first between two sets is the 125th)
    for sets, t, c in ((4, 500, 264), (2, 8, 1), (5, 100, 264), (7, 216, 132)):
        waves = math.ceil(sets * t / c)
        cuts = sum(x is not None for x in _boundaries(c, t, waves))
        assert physical.wave_rereads(sets, t, c, 16 * MiB, l2_bytes=1) == pytest.approx(1 + cuts / sets)
    # sets of 132 CTAs, waves of 264: every boundary falls between two sets, nothing is re-read
    assert physical.wave_rereads(6, 132, 264, 16 * MiB, l2_bytes=1) == 1.0
    # everything fits: no re-read from DRAM
    assert physical.wave_rereads(4, 500, 264, 1 * MiB, l2_bytes=60 * MiB) == 1.0


def test_kv_read_from_both_partitions_gets_half_the_l2():
    # a K/V line is read by CTAs on both L2 partitions and held in each (COPIES = 2): its re-reads miss
    # around half the L2 (bench/l2_reuse.py --share: from 0.434 to 0.60 x L2), before lines re-read from
    # one SM, then another (1.72 copies: 0.58) and lines re-read by one SM (1.5 copies: 0.656)
    p = physical.H200_L2_PARAMS
    kv = p.for_shared()
    assert kv.capacity < 1 / physical.COPIES < kv.capacity * kv.ramp
    assert kv.capacity < p.capacity < p.private
    # Q (one SM) and O (written once, one copy) take less L2 room per byte than K/V
    assert 1 / physical.COPIES < p.qo_weight() < 1
    # sets of 13 MB, 1.5 waves each (EFFICIENT at N 25,390): two sets and a wave's Q/O (34.6 MB) come between
    # the re-reads of a tile in the worst case: they fit 0.58 of the 60 MiB L2 (36.5 MB), not K/V's share
    l2, kv_set, qo = 62_914_560, 2 * 25390 * 128 * 2, 2 * 64 * 128 * 2
    assert kv.capacity * l2 < 2 * kv_set + 264 * qo < p.capacity * l2
    assert physical.wave_rereads(17, 397, 264, kv_set, qo, l2_bytes=l2) == 1.0
    assert physical.wave_rereads(17, 397, 264, kv_set, qo, l2_bytes=l2, params=kv) > 1.0
    e = estimate("efficient", 25390, 128, 17, l2_bytes=l2, sms=132)
    assert e.read > e.compulsory - 17 * 25390 * 128 * 2  # K/V re-read beyond Q, K, V once


def test_a_window_of_gqa_heads_split_by_the_batch_holds_few_sets():
    # FLASH's (m, b, h) grid, 2 batches, groups of 7 query heads: 12 consecutive (head, batch) pairs read
    # the K/V of at most 2 kv heads per batch, ~12 / 7 + 2 = 3.7 different sets (11 MiB with 3 MiB sets),
    # not 8: with the readers' Q/O (16.5 MiB) they fit the 34.8 MiB the default parameters keep
    args = (56, 47, 264, 3 * MiB, 64 * 1024)
    kw = {"causal": True, "backward": True, "l2_bytes": 60 * MiB, "spread": 2.0, "distinct_sets": 8}
    assert physical.wave_rereads(*args, **kw) > 1.0
    assert physical.wave_rereads(*args, **kw, group_batch=(7, 2)) == 1.0


def _l2_sim():
    import importlib.util

    spec = importlib.util.spec_from_file_location("l2_sim", Path(__file__).parents[1] / "bench" / "l2_sim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_lru_simulation_of_bench_l2_sim_counts_rereads_from_first_principles():
    sim = _l2_sim().simulate
    tiles = list(range(9))[::-1]

    def run(sets, t, slots, capacity, qo=0.0):
        walks = [[tiles] * t for _ in range(sets)]
        return sim(walks, [(s, i) for s in range(sets) for i in range(t)], slots, 1.0, qo, capacity)

    # everything fits: each tile comes from DRAM once
    assert run(5, 4, 3, capacity=5 * 9 + 40 * 1.0, qo=1.0) == 0.0
    # one slot and an L2 of less than a set: every reader after a set's first reads it all again
    assert run(3, 4, 1, capacity=8) == pytest.approx(3.0)
    # waves of exactly one set in step (slots = readers per set): all readers read a tile in one step, so
    # even a one-tile L2 re-reads nothing
    assert run(4, 6, 6, capacity=1) == 0.0
    # a wave boundary cuts a set (6 readers, 4 slots): the second wave re-reads the cut set after a whole
    # lifetime of the first wave, which a one-set L2 cannot hold; an L2 of both sets can
    assert run(2, 6, 4, capacity=9) > 0.0
    assert run(2, 6, 4, capacity=2 * 9) == 0.0


def test_the_lru_simulation_walks_fa2s_causal_tiles_from_the_diagonal_down():
    # FA-2 causal at a size whose whole K/V fits: no re-read; in an L2 smaller than one tile every load
    # misses: the re-reads are the tiles the causal walks load beyond one pass (Grid.kv_bounds)
    from attnscope.model.tiles import Grid

    mod = _l2_sim()
    assert mod.attention("flash", 1, 2, 700, 64, True, cap_fraction=0.434) == 0.0
    _, ker = physical.kernel_of("flash", 64, True, "fp16", 700)
    g = Grid(700, 700, ker.block_q, ker.block_kv, causal=True)
    loads = sum(g.kv_bounds(i)[1] for i in range(1, g.n_q_tiles + 1))
    assert mod.attention("flash", 1, 2, 700, 64, True, cap_fraction=1e-4, sms=1) == \
        pytest.approx(loads / g.n_kv_tiles - 1)


def test_the_lru_simulation_shares_a_kv_set_between_the_query_heads_of_a_gqa_group():
    # GQA 4/1: the four query heads of each batch read one K/V set. In an L2 smaller than one tile every load
    # misses, so the re-reads (in sets) are the group's loads over one set's tiles, 4x the one-head count;
    # with a whole-K/V L2 each set comes from DRAM once however many heads read it
    from attnscope.model.tiles import Grid

    mod = _l2_sim()
    for impl in ("flash", "attnscope"):  # FA-2's (m, b, h) order; attnscope's heaviest-first (b, h) order
        _, ker = physical.kernel_of(impl, 64, True, "fp16", 700, "portable")
        g = Grid(700, 700, ker.block_q, ker.block_kv, causal=True)
        loads = sum(g.kv_bounds(i)[1] for i in range(1, g.n_q_tiles + 1))
        assert mod.attention(impl, 2, 4, 700, 64, True, cap_fraction=1e-4, sms=1, kv_heads=1) == \
            pytest.approx(4 * loads / g.n_kv_tiles - 1)
        assert mod.attention(impl, 2, 4, 700, 64, True, cap_fraction=0.434, kv_heads=1) == 0.0
    # in between, one set read by four heads never costs more DRAM loads than four sets read by one head each
    for cap in (1e-3, 2e-3, 5e-3):
        shared = mod.attention("attnscope", 1, 4, 2000, 64, True, cap_fraction=cap, sms=4, kv_heads=1)
        separate = mod.attention("attnscope", 1, 4, 2000, 64, True, cap_fraction=cap, sms=4)
        assert 0.0 < shared + 1 <= 4 * (separate + 1)


@pytest.mark.parametrize("sets,num_m,cap", [(6, 109, 129), (4, 121, 103), (5, 188, 156), (5, 160, 176)])
def test_paired_rereads_track_an_exact_lru_of_the_persistent_schedule(sets, num_m, cap):
    """The closed form with a sharp cliff (ramp 1) against an exact-LRU simulation of the same schedule
    (bench/l2_sim.py; 48 programs, MHA, capacity near one round pair's K/V): within 0.15 sets, where
    re-reads are 1-2 sets."""
    sim = _l2_sim().lockstep_persistent(sets, 1, num_m, 48, 1.0, 0.3, cap)
    form = physical.paired_rereads(sets, 1, num_m, num_m, 48, 1.0, 0.6, cap, lambda t: t + 1, ramp=1.0)
    assert 0.9 < sim < 2.0
    assert form == pytest.approx(sim, abs=0.15)


def test_paired_rereads_vanish_when_the_l2_holds_a_round_pair_and_cost_no_more_at_huge_n():
    walk = lambda t: t + 1  # noqa: E731
    assert physical.paired_rereads(4, 2, 200, 200, 132, 1.0, 0.6, 10_000, walk, ramp=1.38) == 0.0
    more = [physical.paired_rereads(4, 2, 200, 200, 132, 1.0, 0.6, cap, walk, ramp=1.38)
            for cap in (300, 200, 150)]
    assert 0 < more[0] <= more[1] <= more[2]  # less room: more re-reads
    calls = []

    def counted(t):
        calls.append(t)
        return t + 1
    for num_m in (10**4, 10**6):  # cost bounded by PAIRED_ROUNDS samples, not by N
        calls.clear()
        physical.paired_rereads(64, 4, num_m, num_m, 132, 1.0, 0.6, 5 * num_m, counted, ramp=1.38)
        assert len(calls) < 40 * (physical.PAIRED_ROUNDS + 3)


def test_the_estimate_follows_attnscopes_persistent_schedule():
    """impl="auto" runs hopper_persist at d = 128 (`model.dispatch`): its
    re-reads come from `paired_rereads`; at a small N every K/V set stays resident."""
    name, ker = physical.kernel_of("attnscope", 128, True, "fp16", 27163)
    assert name == "hopper_persist" and ker.persistent
    big = physical.estimate("attnscope", 27163, 128, 13, 5, "fp16", causal=True)
    kv = 5 * 13 * 2 * 27163 * 128 * 2
    q = kv // 2
    assert big.read - q > 1.3 * kv  # K/V re-read (development: 1.7 sets measured with the old order)
    small = physical.estimate("attnscope", 4539, 128, 41, 5, "fp16", causal=True)
    assert small.read - 5 * 41 * 3 * 4539 * 128 * 2 < 0.1 * 5 * 41 * 2 * 4539 * 128 * 2


def _fa2_causal_geometry(n):
    """FA-2 causal fp16 d 128 at N = n (ragged kernel): query tiles T, the longest walk over the mean
    (spread), a CTA's spill frame and its Q and O tiles, both in K/V bytes of L2 room."""
    from attnscope.model.tiles import Grid

    p = physical.H200_L2_PARAMS
    _, ker = physical.kernel_of("flash", 128, True, "fp16", n)
    g = Grid(n, n, ker.block_q, ker.block_kv, causal=True)
    t = g.n_q_tiles
    return (t, g.kv_rows_loaded(t) / (g.kv_rows_total() / t), ker.threads * ker.frame[1] * p.private_weight(),
            2 * 128 * 128 * 2 * p.qo_weight())


@pytest.mark.parametrize("sms, n, heads, l2_div", [(33, 7597, 5, 4), (33, 7597, 3, 4), (22, 5065, 4, 6)])
def test_head_gap_rereads_track_the_ramp_on_exact_lru_distances(sms, n, heads, l2_div):
    """FA-2 MQA at B = 1, a 30k point scaled down (SMs, N and the L2 alike): where the next query head
    starts, its first readers of the top tiles come after a gap. The closed form against the measured ramp
    applied to the exact LRU stack distances of the ideal schedule, spill frames resident (bench/l2_sim.py
    --frames --ramp): within 0.03 sets; without the frames neither re-reads anything."""
    p, l2b = physical.H200_L2_PARAMS, H200_L2 // l2_div
    sim = _l2_sim().attention("flash", 1, heads, n, 128, True, p.shared, l2_bytes=l2b, sms=sms, kv_heads=1,
                              frames=True, ramp=p.shared_ramp)
    t, spread, frame, qo = _fa2_causal_geometry(n)

    def form(f):
        return (heads - 1) * physical.head_gap_rereads(t, 2 * sms, 2 * n * 128 * 2, qo, f, spread,
                                                       p.shared * l2b, p.shared_ramp)
    assert 0.1 < sim < 0.3
    assert form(frame) == pytest.approx(sim, abs=0.03)
    assert form(0.0) == 0.0
    assert _l2_sim().attention("flash", 1, heads, n, 128, True, p.shared, l2_bytes=l2b, sms=sms, kv_heads=1,
                               ramp=p.shared_ramp) == 0.0


@pytest.mark.parametrize("batch, heads, kv_heads, n", [(5, 45, 5, 2028), (3, 9, 1, 2028)])
def test_causal_gqa_heads_split_by_the_batch_track_the_exact_lru(batch, heads, kv_heads, n):
    """FA-2 causal GQA at B > 1 ((m, b, h) grid), grid 11's B = 5 H = 45/5 N = 8,111 scaled down (33 SMs,
    a quarter of the L2, a quarter of N): a later query head re-reads its set's top tiles after
    `head_gap_rereads`' gap, (B - 1) T launches longer, over which the other batches' tiles are touched. The
    closed form against the measured ramp on the exact LRU stack distances of the ideal schedule, spill
    frames resident (bench/l2_sim.py --frames --ramp; all its re-reads but 0.13 sets at 45/5 are a later
    head's): within 0.4 sets (the whole-set form before: 4.35 at 45/5, none at 9/1)."""
    p, l2b, sms = physical.H200_L2_PARAMS, H200_L2 // 4, 33
    sim = _l2_sim().attention("flash", batch, heads, n, 128, True, p.shared, l2_bytes=l2b, sms=sms,
                              kv_heads=kv_heads, frames=True, ramp=p.shared_ramp)
    t, spread, frame, qo = _fa2_causal_geometry(n)
    form = (heads // kv_heads - 1) * physical.head_gap_rereads(
        t, 2 * sms, 2 * n * 128 * 2, qo, frame, spread, p.shared * l2b, p.shared_ramp, batch)
    assert sim > 0.1
    assert form == pytest.approx(sim, abs=0.4)


def test_fa2_mqa_rereads_its_top_tiles_where_each_query_head_starts():
    # H200 counters (bench/l2_dev.py --excess flash:causal), FA-2 B = 1, H = 13/1: N = 24,577 (ragged kernel,
    # 274 B of spill frame a thread) re-reads 0.31 K/V sets, 24,576 (Is_even_MN, 74 B) 0.11; at 16,385 the
    # gap is short: none estimated (0.11 measured)
    def extra(n, heads):
        e = estimate("flash", n, 128, heads, kv_heads=1, causal=True, l2_bytes=H200_L2, sms=132)
        return (e.read - (heads + 2) * n * 128 * 2) / (2 * n * 128 * 2)
    assert extra(24577, 13) == pytest.approx(0.11, abs=0.03)
    assert extra(24576, 13) == 0.0
    assert extra(16385, 19) == 0.0
    assert 0.5 < extra(32001, 9) < 0.8  # 0.76 measured
    # MHA (one query head per set) has no head boundary within a set; nor does a set split by the batch
    args = (64, 238, 264, 16 * MiB, 64 * 1024)
    kw = {"causal": True, "backward": True, "spread": 2.0, "l2_bytes": H200_L2, "frame_bytes": 20e3}
    assert physical.wave_rereads(*args, **kw) == physical.wave_rereads(*args, **{**kw, "frame_bytes": 0.0})


@pytest.mark.parametrize("batch, heads, n", [(2, 7, 5667), (4, 5, 3780)])
def test_gqa_heads_split_by_the_batch_track_the_exact_lru_of_lockstep_waves(batch, heads, n):
    """FA-2 unmasked MQA at B > 1 ((m, b, h) grid), scaled down (33 SMs, a quarter of the L2): a later query
    head re-reads its batch's K/V set only where a wave boundary falls between the two (head, batch) pairs,
    after the waves between them (`batch_gap_rereads`); the estimate's K/V reads beyond one pass against the
    measured ramp on the exact LRU stack distances of the ideal schedule (bench/l2_sim.py --ramp): within
    0.5 sets (counting B whole sets and B T Q/O tiles between the heads was 3.6 and 1.0 sets over)."""
    p, l2b = physical.H200_L2_PARAMS, H200_L2 // 4
    sim = _l2_sim().attention("flash", batch, heads, n, 128, False, p.shared, l2_bytes=l2b, sms=33,
                              kv_heads=1, ramp=p.shared_ramp)
    e = estimate("flash", n, 128, heads, batch, kv_heads=1, l2_bytes=l2b, sms=33)
    kv = batch * 2 * n * 128 * 2
    assert sim > 4.0
    assert (e.read - batch * heads * n * 128 * 2 - kv) / kv == pytest.approx(sim, abs=0.5)


def test_hot_miss_is_piecewise_linear_through_its_knots():
    knots = ((0.1, 0.0), (0.3, 0.5), (0.5, 1.5))
    assert physical.hot_miss(0.0, knots) == 0.0 and physical.hot_miss(0.1, knots) == 0.0
    assert physical.hot_miss(0.2, knots) == pytest.approx(0.25)
    assert physical.hot_miss(0.4, knots) == pytest.approx(1.0)
    assert physical.hot_miss(9.0, knots) == 1.5
    shipped = physical.H200_L2_PARAMS.hot
    xs = [i / 100 for i in range(0, 130)]
    ys = [physical.hot_miss(x) for x in xs]
    assert ys == sorted(ys) and ys[0] == 0.0 and ys[-1] == shipped[-1][1]


@pytest.mark.parametrize("call, runs", [
    # grid 22's miss (B = 2, H = 41/1, N = 29,207: three runs) and grid 14's (B = 2, H = 19/1,
    # N = 26,154), both +80 % with the shared capacity's cliff; and the hot probe's B = 4, H = 8/1,
    # N = 24,576 (two runs), -26 %; at d 64, grid 27's B = 4, H = 25/1, N = 18,587 (three runs), -27 %
    (("flash", 29207, 128, 41, 2, "fp16", 1), (3_050_631_680, 3_053_858_304, 3_250_530_304)),
    (("flash", 26154, 128, 19, 2, "fp16", 1), (1_100_908_032,)),
    (("flash", 24576, 128, 8, 4, "fp16", 1), (1_705_630_976, 1_709_451_264)),
    (("flash", 18587, 64, 25, 4, "fp16", 1), (790_773_248, 791_154_432, 791_990_272))])
def test_fa2_hot_sets_lose_their_rereads_gradually(monkeypatch, call, runs):
    # FA-2's causal GQA at B > 1 reads the batch's B K/V sets in rotation: the H200 loses them gradually with
    # their footprint (`hot_miss`), where the shared capacity's cliff had every re-read miss from 0.3 x L2
    impl, n, d, h, b, dtype, hkv = call
    kw = {"kv_heads": hkv, "l2_bytes": H200_L2, "sms": 132}
    e = estimate(impl, n, d, h, b, dtype, True, **kw)
    for measured in runs:
        assert abs(error(e.total, measured)) < 0.11
    other = 64 if d == 128 else 128
    before = estimate(impl, n, other, h, b, dtype, True, **kw).total
    every = replace(physical.H200_L2_PARAMS, **{"hot" if d == 128 else "hot_d64": ((0.0, 1.0), (9.0, 1.0))})
    monkeypatch.setattr(physical, "H200_L2_PARAMS", every)
    counted = estimate(impl, n, d, h, b, dtype, True, **kw)  # every re-read of the zero-capacity count
    # d 128 at B = 2 (0.35-0.4 x L2 of footprint) and d 64 (0.26 x L2): the H200 keeps most of them; d 128
    # at B = 4 (0.7 x L2) keeps none
    assert counted.total > 1.5 * e.total if (b == 2 or d == 64) else abs(error(counted.total, e.total)) < 0.02
    # each head dim's kernel has its own curve
    assert estimate(impl, n, other, h, b, dtype, True, **kw).total == before


def test_launch_fill_share_ramps_from_none_to_all():
    assert physical.launch_fill_share(0.0) == 0.0
    shares = [physical.launch_fill_share(w) for w in (0.25, 1, 2, 5, 10, 40, 1e6)]
    assert shares == sorted(shares) and shares[0] < 0.15 and shares[-1] == pytest.approx(1.0, abs=1e-5)
    # the mean of 1 - exp(-w / w0) over W waves, by a midpoint sum
    w, w0, k = 3.0, 1.0, 20000
    mean = sum(1 - math.exp(-(i + 0.5) * w / k / w0) for i in range(k)) / k
    assert physical.launch_fill_share(w, w0) == pytest.approx(mean, rel=1e-6)


# bench/results/h200-2026-12-01-bytes-headsprobe.json: FA-2 causal MHA, B = 1, N = 15,033 d 128 fp16, two runs
HEADS_PROBE_15033 = {3: (48_609_024, 50_176_512), 6: (133_465_856, 130_915_840),
                     23: (565_281_792, 566_135_040), 92: (2_563_395_840, 2_575_147_520)}


def test_fa2_causal_rereads_ramp_up_with_the_waves_after_the_launch():
    # the head count alone scales the waves: the H200's re-reads per K/V set grow with them (the first waves
    # start from the empty L2 ncu leaves), where the steady-state window is the same at every head count
    kw = {"l2_bytes": H200_L2, "sms": 132}
    excess = {}
    for h, runs in HEADS_PROBE_15033.items():
        e = estimate("flash", 15033, 128, h, 1, "fp16", True, **kw)
        for measured in runs:
            assert abs(error(e.total, measured)) < 0.07
        k = e.kernels[0]
        kv_set = 2 * 15033 * 128 * 2
        excess[h] = (k.read - h * 15033 * 128 * 2 - h * kv_set) / (h * kv_set)
    assert excess[3] < 0.5 * excess[23] < excess[92] < 1.1


def test_no_promise_at_a_head_dim_no_probe_measured():
    """`not_modelled` names a head dim outside `VALIDATED_HEAD_DIMS` (d 256 runs attnscope's kernels, but no
    probe or held-out grid measured its bytes), for every implementation; at d 64 and 128 the unmasked call
    keeps its promise. The sweeps' dims are the same constant."""
    from attnscope.measure import physical as sweeps

    assert sweeps.HEAD_DIMS == physical.VALIDATED_HEAD_DIMS == (64, 128)
    for impl in ("naive", "flash", "cudnn", "efficient", "attnscope"):
        for d in (32, 96, 256):
            why = physical.not_modelled(impl, 4096, d, 32)
            assert why is not None and f"head dim {d}" in why and "64 and 128" in why, (impl, d)
        for d in physical.VALIDATED_HEAD_DIMS:
            assert physical.not_modelled(impl, 4096, d, 32) is None, (impl, d)
