"""model/traffic.py against the spec (§1.1, §4, §4.2, §6, exercise 1) and the issue's properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.errors import InputError
from attnscope.model.traffic import ROW_NAMES, traffic

MiB = 1024**2
T = traffic(rows=ROW_NAMES)  # spec defaults: N = 4,096, d = 128, FP16, B_r = 128, B_c = 64


def _kernel(row, name):
    return next(k for k in row.kernels if k.name.startswith(name))


def _bytes(kernel, tensor, direction):
    return sum(t.nbytes for t in kernel.transfers if t.tensor == tensor and t.direction == direction)


# --- §1.1 -------------------------------------------------------------------------------------------
def test_spec_1_1_tensor_sizes():
    gemm1 = _kernel(T["naive"], "1.")
    assert _bytes(gemm1, "Q", "read") == 1_048_576   # 4,096 x 128 x 2 bytes = 1.00 MiB
    assert _bytes(gemm1, "S", "write") == 33_554_432  # 4,096 x 4,096 x 2 bytes = 32.00 MiB


def test_spec_1_1_each_kernel():
    row = T["naive"]
    k1, k2, k3 = row.kernels
    # 1. GEMM: reads Q 1.00 + K 1.00 MiB, writes S 32.00 MiB, 34.00 MiB
    assert (k1.reads, k1.writes, k1.total) == (2 * MiB, 32 * MiB, 34 * MiB)
    # 2. Softmax: reads S 32.00, writes P 32.00, 64.00 MiB
    assert (k2.reads, k2.writes, k2.total) == (32 * MiB, 32 * MiB, 64 * MiB)
    # 3. GEMM: reads P 32.00 + V 1.00, writes O 1.00, 34.00 MiB
    assert (k3.reads, k3.writes, k3.total) == (33 * MiB, 1 * MiB, 34 * MiB)


def test_spec_1_1_totals():
    row = T["naive"]
    assert (row.reads, row.writes, row.total) == (70_254_592, 68_157_440, 138_412_032)
    assert (f"{row.reads / MiB:.2f}", f"{row.writes / MiB:.2f}", f"{row.total / MiB:.2f}") == \
        ("67.00", "65.00", "132.00")


def test_spec_payload_share():
    # Key takeaways: the Q/K/V/O payload is 4 MiB of the 132, 3.0 % of the traffic; 128 MiB round-trips.
    row = T["naive"]
    payload = sum(t.nbytes for k in row.kernels for t in k.transfers if t.tensor in "QKVO")
    assert payload == 4 * MiB
    assert f"{payload / row.total * 100:.1f}" == "3.0"
    assert row.total - payload == 128 * MiB


# --- §4 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, reads, writes, total", [
    ("naive", "67.00", "65.00", "132.00"),
    ("flash", "65.00", "1.00", "66.00"),
    ("naive-causal-ideal", "35.00", "33.00", "68.00"),
    ("flash-causal", "34.00", "1.00", "35.00"),
])
def test_spec_4_table(name, reads, writes, total):
    r = T[name]
    assert (f"{r.reads / MiB:.2f}", f"{r.writes / MiB:.2f}", f"{r.total / MiB:.2f}") == (reads, writes, total)


def test_spec_4_exact_bytes_and_ratios():
    assert T["flash"].total == 69_206_016        # §4.1
    assert T["flash-causal"].total == 36_700_160  # §4.2
    assert f"{T.ratio('naive', 'flash'):.2f}" == "2.00"
    assert f"{T.ratio('naive-causal-ideal', 'flash-causal'):.2f}" == "1.94"
    assert f"{T.matched_ratio('flash'):.2f}" == "2.00"
    assert f"{T.matched_ratio('flash-causal'):.2f}" == "1.94"
    assert T.matched_ratio("naive") == 1.0


def test_spec_4_1_kv_reads():
    # KV reads = 32 x (1.00 + 1.00) MiB = 64.00 MiB; Q read once, O written once.
    k = T["flash"].kernels[0]
    assert _bytes(k, "K", "read") + _bytes(k, "V", "read") == 64 * MiB
    assert _bytes(k, "Q", "read") == MiB and _bytes(k, "O", "write") == MiB


def test_spec_4_2_passes():
    assert T.kv_passes(causal=True) == 16.5   # sum_{i=1}^{32} i / 32
    assert T.kv_passes(causal=False) == 32
    k = T["flash-causal"].kernels[0]
    assert _bytes(k, "K", "read") + _bytes(k, "V", "read") == 33 * MiB


def test_spec_4_2_ideal_baseline_triangles():
    # 4 x 16.00 (S, P round-trips) + 3.00 (Q, K, V) + 1.00 (O) = 68.00 MiB
    row = T["naive-causal-ideal"]
    sp = sum(t.nbytes for k in row.kernels for t in k.transfers if t.tensor in ("S", "P"))
    assert sp == 4 * 16 * MiB


def test_spec_4_2_cross_condition_ratio_refused():
    for a, b in [("naive", "flash-causal"), ("naive-causal-ideal", "flash"), ("naive", "naive-causal-eager")]:
        with pytest.raises(InputError, match=r"ratio: expected two configurations of one masking condition"
                                             r".*cross-condition ratio"):
            T.ratio(a, b)


def test_lse_adds_4_bytes_per_query_row():
    # §3.3: add 4N bytes per head: 16 KiB here, roughly 0.01 % of the 132 MiB baseline.
    t = traffic(lse=True)
    assert t["flash"].writes - T["flash"].writes == 16_384
    assert t["flash-causal"].writes - T["flash-causal"].writes == 16_384
    assert f"{16_384 / T['naive'].total * 100:.2f}" == "0.01"
    assert t["naive"].total == T["naive"].total


# --- §6, exercise 1 -----------------------------------------------------------------------------------
def test_spec_6_s_at_256():
    t = traffic(n=256)
    assert _bytes(t["naive"].kernels[0], "S", "write") == 131_072
    assert _bytes(t["naive"].kernels[0], "S", "write") / MiB == 0.125


def test_exercise1():
    n, f = T["naive"], T["flash"]
    assert (n.reads / MiB, n.writes / MiB, n.total / MiB) == (67, 65, 132)
    assert (f.reads / MiB, f.writes / MiB, f.total / MiB) == (65, 1, 66)
    assert T.ratio("naive", "flash") == 2.0


# --- the eager baseline, from its printed assumptions -------------------------------------------------
def test_eager_follows_its_assumptions():
    n, d, b = 4096, 128, 2
    s, mask, x = n * n * b, n * n * 1, n * d * b
    reads = (x + x) + (s + mask) + s + (s + x)   # GEMM1, masked_fill, softmax, GEMM2
    writes = s + s + s + x                        # S, S', P, O
    row = T["naive-causal-eager"]
    assert (row.reads, row.writes) == (reads, writes)
    assert row.condition == "causal" and any("masked_fill" in a for a in row.assumptions)
    assert any("bool" in a for a in row.assumptions)


# --- properties ---------------------------------------------------------------------------------------
shapes = st.fixed_dictionaries({
    "nq": st.integers(1, 300), "nk": st.integers(1, 300), "d": st.integers(1, 160),
    "dtype": st.sampled_from(["fp16", "bf16", "fp32", "fp8"]),
    "block_q": st.integers(1, 130), "block_kv": st.integers(1, 130),
})
BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}


@settings(max_examples=80, deadline=None)
@given(shapes)
def test_unmasked_kv_reads_are_tr_times_kv(p):
    t = traffic(None, **p, rows=["flash"])
    k = t["flash"].kernels[0]
    kv = p["nk"] * p["d"] * BYTES[p["dtype"]]
    assert _bytes(k, "K", "read") == math.ceil(p["nq"] / p["block_q"]) * kv
    assert _bytes(k, "V", "read") == _bytes(k, "K", "read")


@settings(max_examples=80, deadline=None)
@given(shapes)
def test_causal_le_unmasked_and_brute_force(p):
    t = traffic(None, **p, rows=["flash", "flash-causal"])
    assert t["flash-causal"].total <= t["flash"].total
    # brute force: a KV tile is read by a query tile iff the dense mask permits any entry of their block
    r = np.arange(1, p["nq"] + 1)[:, None]
    c = np.arange(1, p["nk"] + 1)[None, :]
    allowed = c <= r + (p["nk"] - p["nq"])
    rows = 0
    for i0 in range(0, p["nq"], p["block_q"]):
        for j0 in range(0, p["nk"], p["block_kv"]):
            if allowed[i0:i0 + p["block_q"], j0:j0 + p["block_kv"]].any():
                rows += min(p["block_kv"], p["nk"] - j0)
    assert _bytes(t["flash-causal"].kernels[0], "K", "read") == rows * p["d"] * BYTES[p["dtype"]]


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(1, 5), st.sampled_from([(8, 8), (8, 2), (8, 1), (4, 4)]))
def test_linear_in_batch_heads_and_per_query_head_under_gqa(p, batch, hk):
    heads, kv_heads = hk
    one = traffic(None, **p, rows=ROW_NAMES)
    many = traffic(None, **p, batch=batch, heads=heads, kv_heads=kv_heads, rows=ROW_NAMES)
    js = many.to_json()["rows"]
    for row in js:
        per = one[row["name"]]
        assert (row["reads"], row["writes"], row["total"]) == (per.reads, per.writes, per.total)
        if batch * heads != 1:
            assert row["total_all"] == batch * heads * per.total
            assert row["reads_all"] == batch * heads * per.reads


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 200), st.integers(1, 200))
def test_causal_flops_count_permitted_pairs(nq, nk):
    # DESIGN: 4 Nq Nk d halved for causal when Nq == Nk; otherwise the exact permitted (row, key) pairs.
    t = traffic(None, nq=nq, nk=nk, d=8, rows=["flash-causal"])
    r = np.arange(1, nq + 1)[:, None]
    c = np.arange(1, nk + 1)[None, :]
    pairs = nq * nk // 2 if nq == nk else int((c <= r + (nk - nq)).sum())
    assert t["flash-causal"].flops == 4 * pairs * 8


def test_json_shape():
    j = traffic().to_json()
    assert set(j) == {"params", "rows"}
    assert [r["name"] for r in j["rows"]] == ["naive", "flash", "naive-causal-ideal", "flash-causal"]
    r0 = j["rows"][0]
    assert (r0["reads"], r0["writes"], r0["total"]) == (70254592, 68157440, 138412032)
    assert isinstance(r0["items"], list) and r0["items"][0]["transfers"][0]["tensor"] == "Q"
    assert j["params"]["nq"] == 4096 and j["params"]["dtype"] == "fp16"


# --- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, msg", [
    (dict(n=0), r"nq: expected a positive integer, got 0"),
    (dict(nk=-1), r"nk: expected a positive integer, got -1"),
    (dict(d=0), r"d: expected a positive integer, got 0"),
    (dict(block_q=0), r"block_q: expected a positive integer"),
    (dict(block_kv=-64), r"block_kv: expected a positive integer"),
    (dict(batch=0), r"batch: expected a positive integer"),
    (dict(heads=8, kv_heads=3), r"kv_heads: expected a divisor of heads \(8\), got 3"),
    (dict(dtype="fp64"), r"dtype: expected one of fp16, bf16, fp32, fp8, got 'fp64'"),
    (dict(rows=["flash", "sdpa"]), r"row: expected one of naive, flash, .*naive-causal-eager, got 'sdpa'"),
    (dict(rows=[]), r"rows: expected at least one of"),
])
def test_bad_input(kw, msg):
    with pytest.raises(InputError, match=msg):
        traffic(**kw)
