"""Serving ledgers of model/serving.py: packed variable-length prefill and a step against a paged KV cache.

Checked against brute force on small cases: the packed ledger is the line-by-line sum of the dense
ledgers of its sequences; K/V rows counted from the permitted (query, key) pairs directly; block-table
entries and page tails counted key by key.
"""

from __future__ import annotations

import json
import time

import pytest

from attnscope.cli import main
from attnscope.model import serving as sv
from attnscope.model import traffic as tr

MIXES = [
    ([128, 4096, 17], None),
    ([5, 0, 40, 17], [5, 3, 70, 0]),
    ([1, 300, 129], [64, 200, 129]),
    ([5, 40, 5, 5, 40, 5], [5, 70, 5, 5, 70, 9]),  # repeated shapes: each built once, counted every time
]


def _lines(row):
    return [(k.name, t.tensor, t.direction, t.nbytes) for k in row.kernels for t in k.transfers]


@pytest.mark.parametrize("lq,lk", MIXES)
@pytest.mark.parametrize("lse", [False, True])
def test_packed_is_the_sum_of_dense_ledgers(lq, lk, lse):
    lk_ = lq if lk is None else lk
    p = sv.packed(lq, lk, d=64, dtype="bf16", block_q=32, block_kv=16, heads=4, kv_heads=2, lse=lse,
                  rows=tr.ROW_NAMES, tma=False)  # pointer loads: nothing past a sequence is read
    items = sum(-(-a // 32) for a in lq)
    assert p.work_items == items
    for name in tr.ROW_NAMES:
        want = {}
        flops = 0
        for a, b in zip(lq, lk_, strict=True):
            if a == 0:
                continue
            if b == 0:  # queries with no keys: Q read, O (and LSE) written
                want[("Q", "read")] = want.get(("Q", "read"), 0) + a * 64 * 2
                want[("O", "write")] = want.get(("O", "write"), 0) + a * 64 * 2
                if lse and name.startswith("flash"):
                    want[("LSE", "write")] = want.get(("LSE", "write"), 0) + a * 4
                continue
            dense = tr.traffic(nq=a, nk=b, d=64, dtype="bf16", block_q=32, block_kv=16, heads=4, kv_heads=2,
                               lse=lse, rows=[name])[name]
            flops += dense.flops
            for _, tensor, direction, nbytes in _lines(dense):
                want[(tensor, direction)] = want.get((tensor, direction), 0) + nbytes
        if name.startswith("flash"):
            want[("meta", "read")] = items * 24
        got = {}
        for _, tensor, direction, nbytes in _lines(p[name]):
            got[(tensor, direction)] = got.get((tensor, direction), 0) + nbytes
        assert got == want, name
        assert p[name].flops == flops
        assert p[name].total == sum(want.values())


def _brute_kv_rows(nq, nk, bq, bkv, causal):
    """K rows one query head's FA-2 programs load, counted from the permitted pairs themselves."""
    rows = 0
    for t in range(-(-nq // bq)):
        last = -1
        for r in range(t * bq, min((t + 1) * bq, nq)):
            for c in range(nk):
                if not causal or c <= r + nk - nq:
                    last = max(last, c)
        if last >= 0:
            rows += min((last // bkv + 1) * bkv, nk)
    return rows


def _brute_tma_rows(lq, lk, bq, bkv, causal):
    """K rows TMA reads: every loaded KV tile whole, up to the end of the packed tensor."""
    total_k, k0, rows = sum(lk), 0, 0
    for nq, nk in zip(lq, lk, strict=True):
        for t in range(-(-nq // bq)) if nk else ():
            last = max((c for r in range(t * bq, min((t + 1) * bq, nq)) for c in range(nk)
                        if not causal or c <= r + nk - nq), default=-1)
            for j in range(last // bkv + 1 if last >= 0 else 0):
                rows += min(k0 + (j + 1) * bkv, total_k) - (k0 + j * bkv)
        k0 += nk
    return rows


MIXES_KV = [([5, 0, 40, 17, 33], [5, 3, 70, 0, 20]), ([50, 7, 64, 100], [50, 90, 30, 100]),
            ([3, 33, 1], [40, 9, 77]), ([20, 50, 9], [89, 50, 9])]


@pytest.mark.parametrize("lq,lk", MIXES_KV)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq,bkv", [(16, 8), (8, 32)])  # (8, 32): several query tiles load a ragged tile
def test_packed_flash_kv_bytes_brute_force(lq, lk, causal, bq, bkv):
    name = "flash-causal" if causal else "flash"
    for tma in (False, True):
        row = sv.packed(lq, lk, d=64, dtype="fp16", block_q=bq, block_kv=bkv, rows=[name], tma=tma)[name]
        k_bytes = sum(t.nbytes for k in row.kernels for t in k.transfers if t.tensor == "K")
        v_bytes = sum(t.nbytes for k in row.kernels for t in k.transfers if t.tensor == "V")
        if tma:
            want = _brute_tma_rows(lq, lk, bq, bkv, causal) * 64 * 2
        else:
            pairs = [(a, b) for a, b in zip(lq, lk, strict=True) if a and b]
            want = sum(_brute_kv_rows(a, b, bq, bkv, causal) for a, b in pairs) * 64 * 2
        assert k_bytes == v_bytes == want, (tma, k_bytes, want)


def test_packed_single_sequence_equals_dense():
    p = sv.packed([4096], d=128, rows=["naive", "flash"])
    t = tr.traffic(4096, rows=["naive", "flash"])
    assert p["naive"].total == t["naive"].total
    assert p["flash"].total == t["flash"].total + 32 * 24  # 32 query tiles of work-list metadata


# --- paged / dense cache ------------------------------------------------------------------------------
def _brute_table_entries(n, page, block):
    pairs = {(c // block, c // page) for c in range(n)}
    return len(pairs)


@pytest.mark.parametrize("page", [16, 64, 256])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("nq", [1, 5])
def test_paged_is_dense_plus_table_reads(page, splits, nq):
    lens = [5, 100, 129, 1000, 64]
    hq, hkv, d, blk = 8, 2, 64, 128
    pg = sv.paged(lens, page, nq=nq, d=d, dtype="fp16", heads=hq, kv_heads=hkv, num_splits=splits,
                  block_kv=blk, lse=True)
    dn = sv.paged(lens, None, nq=nq, d=d, dtype="fp16", heads=hq, kv_heads=hkv, num_splits=splits,
                  block_kv=blk, lse=True)
    entries = sum(_brute_table_entries(n, page, blk) for n in lens)
    assert pg.row.total - dn.row.total == hkv * entries * 4
    table = [t for k in pg.row.kernels for t in k.transfers if t.tensor == "block_table"]
    assert len(table) == 1 and table[0].nbytes == hkv * entries * 4
    # K and V: the valid rows only, once per kv head
    kv = sum(t.nbytes for k in pg.row.kernels for t in k.transfers if t.tensor in ("K", "V"))
    assert kv == 2 * hkv * sum(lens) * d * 2
    # tails: pages allocated minus keys, key by key; a dense cache sized to the longest sequence
    pages = sum(len({c // page for c in range(n)}) for n in lens)
    assert pg.pages == pages
    assert pg.tail == 2 * hkv * (pages * page - sum(lens)) * d * 2
    assert dn.tail == 2 * hkv * sum(max(lens) - n for n in lens) * d * 2
    # partials only with splits; written once and read once
    parts = [t.nbytes for k in pg.row.kernels for t in k.transfers if t.tensor == "partials"]
    assert parts == ([] if splits == 1 else [len(lens) * hq * nq * splits * (d + 1) * 4] * 2)
    q = sum(t.nbytes for k in pg.row.kernels for t in k.transfers if t.tensor == "Q")
    assert q == len(lens) * hq * nq * d * 2 * splits
    o = [t.nbytes for k in pg.row.kernels for t in k.transfers
         if t.direction == "write" and t.tensor != "partials"]
    assert sorted(o) == sorted([len(lens) * hq * nq * d * 2, len(lens) * hq * nq * 4])
    # FLOPs: 4 * Hq * d per visible pair, bottom-right causal among the nq queries
    pairs = sum(1 for n in lens for r in range(nq) for c in range(n) if c <= r + n - nq)
    assert pg.row.flops == 4 * hq * d * pairs


def test_dense_cache_capacity_counts_as_tail():
    a = sv.paged([10, 20], None, capacity=64, heads=4, kv_heads=4, d=64, dtype="bf16")
    assert a.tail == 2 * 4 * (128 - 30) * 64 * 2


def test_paged_cost_is_constant_in_length():
    t0 = time.perf_counter()
    g = sv.paged([10**12, 3 * 10**11], 16, heads=32, kv_heads=8, num_splits=64)
    assert time.perf_counter() - t0 < 0.05
    assert g.pages == 10**12 // 16 + 3 * 10**11 // 16


@pytest.mark.parametrize("call,msg", [
    (lambda: sv.packed([]), "lengths_q: expected at least one length"),
    (lambda: sv.packed([3, -1]), "lengths_q: expected a list of non-negative integers"),
    (lambda: sv.packed([3, True]), "lengths_q: expected a list of non-negative integers"),
    (lambda: sv.packed(5), "lengths_q: expected a list of non-negative integers"),
    (lambda: sv.packed([3, 4], [3]), "lengths_k: expected 2 lengths"),
    (lambda: sv.packed([0, 3], [4, 0]), "lengths_q: expected at least one sequence with Nq >= 1 and Nk >= 1"),
    (lambda: sv.packed([3], rows=["fast"]), "row: expected one of"),
    (lambda: sv.packed([3], rows=[]), "rows: expected at least one of"),
    (lambda: sv.packed([3], dtype="int4"), "dtype: expected one of"),
    (lambda: sv.packed([8], heads=4, kv_heads=3), "kv_heads: expected a divisor of heads"),
    (lambda: sv.paged([]), "cache_lens: expected at least one length"),
    (lambda: sv.paged([10], 24), "page_size: expected a power of two"),
    (lambda: sv.paged([10], 0), "page_size: expected a positive integer"),
    (lambda: sv.paged([10], 16, block_kv=96), "block_kv: expected a power of two"),
    (lambda: sv.paged([10, 3], nq=4), "cache_lens: expected lengths >= nq (4)"),
    (lambda: sv.paged([10], nq=0), "nq: expected a positive integer"),
    (lambda: sv.paged([10], num_splits=0), "num_splits: expected a positive integer"),
    (lambda: sv.paged([10], None, capacity=5), "capacity: expected >= the longest cache length (10)"),
    (lambda: sv.paged([10], 16, capacity=32), "capacity: expected None with a paged cache"),
    (lambda: sv.paged([10], heads=4, kv_heads=3), "kv_heads: expected a divisor of heads"),
])
def test_bad_inputs(call, msg):
    with pytest.raises(ValueError) as e:
        call()
    assert msg in str(e.value)


# --- CLI ----------------------------------------------------------------------------------------------
def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_packed_json_matches_model(capsys):
    rc, out, err = _run(capsys, "traffic", "--lengths", "128,0,300", "--kv-lengths", "128,5,200",
                        "--heads", "8", "--kv-heads", "2", "--rows", "all", "--json")
    assert rc == 0, err
    j = json.loads(out)
    p = sv.packed([128, 0, 300], [128, 5, 200], heads=8, kv_heads=2, rows=tr.ROW_NAMES)
    assert j["params"]["layout"] == "packed" and j["params"]["work_items"] == p.work_items
    assert [(r["name"], r["total"], r["total_all"]) for r in j["rows"]] == \
        [(r.name, r.total, 8 * r.total) for r in p.rows.values()]


def test_cli_packed_no_tma(capsys):
    rc, out, err = _run(capsys, "traffic", "--lengths", "100,30", "--no-tma", "--rows", "flash", "--json")
    assert rc == 0, err
    no_tma = sv.packed([100, 30], rows=["flash"], tma=False)["flash"].total
    assert json.loads(out)["rows"][0]["total"] == no_tma
    # 100 keys in 64-row tiles: the ragged tile reads 28 rows of the next sequence, K and V, fp16, d = 128
    assert sv.packed([100, 30], rows=["flash"])["flash"].total - no_tma == 2 * 28 * 128 * 2


def test_cli_packed_table(capsys):
    rc, out, _ = _run(capsys, "traffic", "--lengths", "4096")
    p = sv.packed([4096])
    assert rc == 0 and f"{p['flash'].total:,}" in out and "2.00x vs naive" in out


def test_cli_paged_json_and_table(capsys):
    argv = ["traffic", "--cache-lens", "100,4000,17", "--page-size", "16", "--heads", "32", "--kv-heads", "8",
            "--splits", "4", "--dtype", "bf16", "--block-kv", "128"]
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    j = json.loads(out)
    g = sv.paged([100, 4000, 17], 16, heads=32, kv_heads=8, num_splits=4, dtype="bf16", block_kv=128)
    assert j["rows"][0]["total"] == g.row.total and j["rows"][0]["allocated_not_read"] == g.tail
    rc, out, _ = _run(capsys, *argv)
    assert rc == 0 and f"{g.row.total:,}" in out and f"{g.tail:,}" in out and "block_table" in out


@pytest.mark.parametrize("argv,msg", [
    (["--lengths", "3,x"], "--lengths: expected comma-separated integers"),
    (["--lengths", "3,4", "--kv-lengths", "3"], "--kv-lengths: expected 2 lengths"),
    (["--lengths", "0,0"], "--lengths: expected at least one sequence with Nq >= 1"),
    (["--lengths", "3", "--cache-lens", "3"], "--cache-lens: expected not together with --lengths"),
    (["--lengths", "3", "--page-size", "16"], "--page-size: expected only with --cache-lens"),
    (["--cache-lens", "3", "--kv-lengths", "3"], "--kv-lengths: expected only with --lengths"),
    (["--cache-lens", "3", "--no-tma"], "--no-tma: expected only with --lengths"),
    (["--cache-lens", "30", "--page-size", "12"], "--page-size: expected a power of two"),
    (["--page-size", "16"], "--page-size: expected to come with --lengths or --cache-lens"),
    (["--lengths", "3", "--device", "h200"], "--device: expected no --device / --ratio"),
    (["--cache-lens", "30", "--nq", "0"], "--nq: expected a positive integer, got 0"),  # not a silent 1
    (["--cache-lens", "30", "--splits", "0"], "--splits: expected a positive integer, got 0"),
])
def test_cli_errors_are_one_line_exit_2(capsys, argv, msg):
    rc, out, err = _run(capsys, "traffic", *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
