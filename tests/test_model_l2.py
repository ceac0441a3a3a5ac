"""model/l2.py: the L2-aware DRAM estimate against the H200 measurements, and its limits (CPU).

The three measured numbers are issue 7's (H200, ncu, 2026-11-29; N = 4,096, d = 128, fp16, unmasked):
naive 32 heads 130.7 MiB per head, naive 1 head 85.6 MiB, SDPA FLASH 32 heads 4.0 MiB. The goal is
+-15 % at every point; recorded grids (tests/data/measure/recorded/ncu.json.gz) are checked the same way.
"""

import gzip
import json
from pathlib import Path

import pytest

from attnscope.measure import ncu
from attnscope.model import l2 as physical
from attnscope.model.l2 import error, estimate, logical
from attnscope.model.traffic import traffic

MiB = 2**20
H200_L2 = 60 * 10**6  # "60 MB", the figure for this H200
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
def test_no_useful_l2_gives_the_logical_model(impl, causal):
    # one CTA at a time and an L2 of one K tile: nothing is ever re-read from L2
    e = estimate(impl, 256, 64, 2, causal=causal, l2_bytes=8192, sms=1, ctas_per_sm=1, l2_fraction=1.0,
                 writes="through")
    assert e.total == logical(impl, 256, 64, 2, causal=causal)
    # and kernel by kernel: every byte each kernel touches is a DRAM byte, read as read, write as write
    assert [(k.read, k.write) for k in e.kernels] == [(k.logical_read, k.logical_write) for k in e.kernels]


@pytest.mark.parametrize("impl, causal", [("naive", False), ("naive", True), ("flash", False),
                                          ("cudnn", True)])
def test_an_l2_that_holds_everything_reads_each_input_once(impl, causal):
    n, d, heads = 512, 64, 4
    e = estimate(impl, n, d, heads, causal=causal, l2_bytes=2**30, writes="through")
    qkv = 3 * heads * n * d * 2
    mask = n * n if (impl == "naive" and causal) else 0
    assert e.read == qkv + mask
    lg = logical(impl, n, d, heads, causal=causal)
    assert e.write == sum(k.logical_write for k in e.kernels)  # write-through: every write reaches DRAM
    assert e.total < lg
    back = estimate(impl, n, d, heads, causal=causal, l2_bytes=2**30)  # the default: write-back
    assert back.write == 0 and back.read == e.read  # write-back: nothing is evicted during the call
    rnd = estimate(impl, n, d, heads, causal=causal, l2_bytes=2**30, policy="random")
    assert rnd.total == back.total  # nothing is ever evicted, whatever the policy


def test_half_the_l2_per_copy():
    # one head of naive at N = 2,048, d = 128: S, P are 8 MiB each; Q, K, V 0.5 MiB each
    full = estimate("naive", 2048, 128, 1, l2_bytes=24 * MiB, l2_fraction=1.0)
    half = estimate("naive", 2048, 128, 1, l2_bytes=24 * MiB)
    assert half.params["l2_fraction"] == 0.5 and half.total == estimate(
        "naive", 2048, 128, 1, l2_bytes=12 * MiB, l2_fraction=1.0).total
    assert full.read == 3 * 2048 * 128 * 2 and full.write == 0  # 18 MiB touched fit in 24 MiB
    assert half.total > full.total  # but not in 12 MiB: S/P chunks are evicted dirty or re-read


def test_writes_reach_dram_only_when_evicted():
    # 32 heads of flash at N = 4,096: O is 32 MiB; the last heads' O is still dirty in L2 at the end
    back = estimate("flash", 4096, 128, 32, l2_bytes=60 * MiB, sms=132)
    through = estimate("flash", 4096, 128, 32, l2_bytes=60 * MiB, sms=132, writes="through")
    o_and_lse = 32 * 4096 * (128 * 2 + 4)
    assert through.write == o_and_lse
    assert 0 < back.write < o_and_lse - 4 * MiB and back.read == through.read


def test_more_l2_never_costs_more():
    totals = [estimate("naive", 2048, 128, 1, l2_bytes=mb * MiB).total for mb in (4, 8, 16, 24, 32, 64)]
    assert totals == sorted(totals, reverse=True)
    assert totals[0] > totals[-1]


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
    with pytest.raises(ValueError, match=r"writes: expected one of through, back, got 'sometimes'"):
        estimate("flash", writes="sometimes")
    with pytest.raises(ValueError, match=r"policy: expected one of random, lru, got 'fifo'"):
        estimate("flash", policy="fifo")
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
                points.append((spec, sum(k.total for k in ks), env["l2_bytes"], env["sms"]))
    return points


# The recorded points the estimate does not reach within +-15 % (issue 7's goal), each held to its
# measured band so that a change there (better or worse) is seen:
# - flash, N = 16,384, d = 128, 32 heads, causal: measured 24.99 MiB per head, estimated -31.5 %: the H200
#   reads K and V about twice there (causal CTAs of unequal length fall out of step); neither LRU nor
#   random replacement with dynamic CTA scheduling reproduces it.
# - cudnn / efficient / attnscope, N = 16,384, d = 128, 32 heads, unmasked: measured exactly Q + K + V + O
#   (15.8-16.0 MiB per head), estimated +22 to +23 % (attnscope +15 %: two CTAs per SM cover more
#   heads): the resident CTAs cover about one head per wave, the next head's K/V (8 MiB) is re-read
#   about 24 MiB of traffic later, and random replacement evicts about
#   half of it; the H200 keeps all of it. LRU for the fused kernels fits these (185 of 186 points) but
#   breaks the naive producer->consumer points that random replacement fits, and no single policy tried
#   (LRU, random, random among the older part, set-associative LRU, RRIP with hit promotion) fits both.
KNOWN_MISS = {("flash", 16384, 128, 32, True): (-0.35, -0.25),
              ("cudnn", 16384, 128, 32, False): (0.15, 0.28),
              ("efficient", 16384, 128, 32, False): (0.15, 0.28),
              ("attnscope", 16384, 128, 32, False): (0.10, 0.20)}  # +15.0 %: two CTAs per SM (fwd.py)


@pytest.mark.skipif(not _recorded_points(), reason="no recorded ncu grid yet")
def test_recorded_grid_within_15_percent():
    """Every recorded ncu point within +-15 % of the estimate, except the documented misses, each held
    to its measured band so that a change there (better or worse) is seen."""
    misses = []
    for spec, measured, l2, sms in _recorded_points():
        e = physical.estimate(spec["impl"], spec["n"], spec["d"], spec["heads"], spec["batch"], spec["dtype"],
                              spec["causal"], l2_bytes=l2, sms=sms)
        err = error(e.total, measured)
        key = (spec["impl"], spec["n"], spec["d"], spec["heads"], spec["causal"])
        lo, hi = KNOWN_MISS.get(key, (-0.15, 0.15))
        if not lo <= err <= hi:
            misses.append(f"{spec['impl']} n={spec['n']} d={spec['d']} h={spec['heads']} "
                          f"causal={spec['causal']}: {err:+.1%} (allowed {lo:+.0%}..{hi:+.0%})")
    assert not misses, "\n".join(misses)


def test_random_replacement_keeps_part_of_a_just_too_large_output():
    # one head, N = 4,096: S is 32 MiB, one copy of the data gets 30 MiB of the H200's L2. LRU evicts
    # each line of S just before the softmax reads it back; a random replacement (and the H200, which
    # read 17.64 of the 32 MiB from DRAM) keeps part of it.
    lru = estimate("naive", 4096, 128, 1, l2_bytes=60 * MiB, sms=132, policy="lru")
    rnd = estimate("naive", 4096, 128, 1, l2_bytes=60 * MiB, sms=132)
    softmax_read = {e.params["policy"]: e.kernels[1].read for e in (lru, rnd)}
    assert [k.name for k in rnd.kernels][1] == "softmax"
    assert softmax_read["lru"] == 32 * MiB
    assert 8 * MiB < softmax_read["random"] < 24 * MiB
    assert rnd.total == estimate("naive", 4096, 128, 1, l2_bytes=60 * MiB, sms=132).total  # seeded
