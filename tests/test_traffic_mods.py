"""The ledgers under the score mods (issue 35): a sliding window's K/V reads counted exactly against
brute-force sums over a dense visibility mask (forward, backward, packed, decode), the sinks' bytes,
softcap's none, closed-form cost, and the CLI flags (`traffic`/`tiles` --window, --softcap, --sinks)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from attnscope.cli import main
from attnscope.model import backward as bw
from attnscope.model import serving as sv
from attnscope.model import traffic as tr


def _visible(nq, nk, causal, window):
    """[Nq, Nk] bool, the mods contract written out: c in [r + off - left, r + off + right]."""
    left, right = (-1, -1) if window is None else window
    right = 0 if causal else right
    d = np.arange(nk)[None, :] - (np.arange(nq)[:, None] + nk - nq)
    return ((left < 0) | (d >= -left)) & ((right < 0) | (d <= right))


def _brute(nq, nk, bq, bk, causal, window):
    """From the dense mask: (K rows the forward streams, Q rows the dK/dV pass reads, tile pairs), a
    tile pair loaded iff some row of the query tile sees some key of the KV tile."""
    vis = _visible(nq, nk, causal, window)
    kv_rows = q_rows = pairs = 0
    for r0 in range(0, nq, bq):
        for c0 in range(0, nk, bk):
            if vis[r0:r0 + bq, c0:c0 + bk].any():
                kv_rows += min(bk, nk - c0)
                q_rows += min(bq, nq - r0)
                pairs += 1
    return kv_rows, q_rows, pairs


def _bytes(row, tensor, direction="read", kernel=""):
    return sum(t.nbytes for k in row.kernels if k.name.startswith(kernel) for t in k.transfers
               if t.tensor == tensor and t.direction == direction)


SHAPES = [(1024, 1024, 128, 64), (1000, 1537, 128, 64), (1537, 1000, 64, 128), (97, 300, 16, 32),
          (300, 97, 32, 16)]
WINDOWS = [(0, 0), (1, 0), (1024, 0), (100, 100), (-1, 37), (513, -1), (5000, 5000)]


@pytest.mark.parametrize("nq,nk,bq,bk", SHAPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_forward_kv_reads_are_the_visited_tiles(nq, nk, bq, bk, window):
    d, b = 64, 2
    t = tr.traffic(nq=nq, nk=nk, d=d, dtype="bf16", block_q=bq, block_kv=bk, rows=["flash", "flash-causal"],
                   window=window)
    for name, causal in (("flash", False), ("flash-causal", True)):
        kv_rows, _, _ = _brute(nq, nk, bq, bk, causal, window)
        row = t[name]
        assert _bytes(row, "K") == _bytes(row, "V") == kv_rows * d * b, (name, window)
        assert _bytes(row, "Q") == _bytes(row, "O", "write") == nq * d * b  # Q once, O once
        assert row.flops == 4 * int(_visible(nq, nk, causal, window).sum()) * d  # the visible pairs


@pytest.mark.parametrize("nq,nk,bq,bk", SHAPES[1:])
@pytest.mark.parametrize("window", WINDOWS[:5])
def test_backward_rows_are_the_visited_tile_pairs(nq, nk, bq, bk, window):
    d, b = 64, 2
    t = bw.backward_traffic(nq=nq, nk=nk, d=d, dtype="bf16", block_q=bq, block_kv=bk, window=window)
    for causal in (False, True):
        kv_rows, q_rows, _ = _brute(nq, nk, bq, bk, causal, window)
        pre = "flash-causal-backward" if causal else "flash-backward"
        atomic, det = t[pre], t[pre + "-det"]
        assert _bytes(det, "Q", kernel="3.") == _bytes(det, "dO", kernel="3.") == q_rows * d * b
        assert _bytes(det, "K", kernel="4.") == _bytes(det, "V", kernel="4.") == kv_rows * d * b
        assert _bytes(atomic, "dQacc", kernel="3.") == q_rows * d * 4
        assert _bytes(atomic, "dQacc", "write", "3.") == q_rows * d * 4
        gemm = 2 * int(_visible(nq, nk, causal, window).sum()) * d  # one GEMM over the visible pairs
        assert next(k.flops for k in atomic.kernels if k.name.startswith("3.")) == 5 * gemm


def test_a_window_shrinks_the_flash_bytes_and_not_the_naive_ones():
    base = tr.traffic(rows=tr.ROW_NAMES)
    w = tr.traffic(rows=tr.ROW_NAMES, window=(1024, 0))
    assert w["flash-causal"].total < base["flash-causal"].total
    # causal N = 4,096, W = 1,024: 504 of 2,048 tile pairs, 7.875 passes over K/V (16.5 without)
    assert w.kv_passes(True) == 7.875 and base.kv_passes(True) == 16.5
    for name in ("naive", "naive-causal-eager"):  # the full S is materialised; the window is a bool mask
        assert _bytes(w[name], "mask") == 4096 * 4096 and _bytes(w[name], "S", "write") == 4096 * 4096 * 2
    assert _bytes(base["naive"], "mask") == 0
    assert w["naive-causal-eager"].total == base["naive-causal-eager"].total  # same kernels, other mask
    band = int(_visible(4096, 4096, True, (1024, 0)).sum())
    assert _bytes(w["naive-causal-ideal"], "S", "write") == band * 2  # the ideal stores the band only
    assert w["flash"].condition == "window (1024, 0)" and w.matched_ratio("flash") > 1


@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_softcap_and_sinks_move_only_the_sink_vector(pass_):
    """Forward: sinks[h] read once per query-tile program (T_r x 4 B per (batch, head)); backward: the
    preprocess reads it and accumulates dsinks (4 B read + 4 B write per program); softcap: 0 B."""
    count = tr.traffic if pass_ == "forward" else bw.backward_traffic
    names = ["flash", "flash-causal"] if pass_ == "forward" else list(bw.BACKWARD_ROWS[1:3])
    plain = count(nq=1000, nk=1537, rows=names)
    capped = count(nq=1000, nk=1537, rows=names, softcap=30.0)
    sunk = count(nq=1000, nk=1537, rows=names, softcap=30.0, sinks=True)
    tiles = -(-1000 // 128)
    for name in names:
        assert capped[name].total == plain[name].total
        extra = tiles * 4 if pass_ == "forward" else 3 * tiles * 4
        assert sunk[name].total == plain[name].total + extra
        assert _bytes(sunk[name], "sinks") == tiles * 4
        if pass_ == "backward":
            assert _bytes(sunk[name], "dsinks", "write") == tiles * 4
        note = [a for a in sunk[name].assumptions if "no HBM traffic beyond the sink vector" in a]
        assert len(note) == 1 and "softcap 30" in note[0]


def test_naive_softcap_adds_its_elementwise_kernel():
    plain, capped = tr.traffic(rows=["naive"]), tr.traffic(rows=["naive"], softcap=50.0)
    s = 4096 * 4096 * 2
    assert capped["naive"].total - plain["naive"].total == 2 * s  # read S, write S_cap
    assert [k.name for k in capped["naive"].kernels][1] == "2. softcap"


def test_cost_never_grows_with_n():
    t0 = time.perf_counter()
    for n in (10**6, 10**12, 10**18):
        tr.traffic(n, rows=tr.ROW_NAMES, window=(4096, 0), sinks=True)
        bw.backward_traffic(n, window=(4096, 4096))
    assert time.perf_counter() - t0 < 0.5


# --- packed (varlen) and decode -------------------------------------------------------------------
@pytest.mark.parametrize("window", [(0, 0), (30, 0), (7, 9), (-1, 5)])
def test_packed_window_is_the_sum_of_visited_tiles(window):
    lq, lk, bq, bk, d = [5, 0, 40, 17, 33], [5, 3, 70, 0, 20], 16, 8, 64
    for name, causal in (("flash", False), ("flash-causal", True)):
        row = sv.packed(lq, lk, d=d, block_q=bq, block_kv=bk, rows=[name], tma=False, window=window,
                        sinks=True)[name]
        want = sum(_brute(a, b, bq, bk, causal, window)[0] for a, b in zip(lq, lk, strict=True) if a and b)
        assert _bytes(row, "K") == _bytes(row, "V") == want * d * 2
        assert _bytes(row, "sinks") == sum(-(-a // bq) for a in lq) * 4  # every query tile's program


@pytest.mark.parametrize("window", [(0, 0), (100, 0), (1000, 3), (-1, 0)])
@pytest.mark.parametrize("nq", [1, 5])
def test_decode_reads_only_the_window_blocks(window, nq):
    lens, page, blk, hq, hkv, d = [5, 100, 129, 1000, 4097], 16, 64, 8, 2, 64
    g = sv.paged(lens, page, nq=nq, d=d, dtype="fp16", heads=hq, kv_heads=hkv, block_kv=blk, window=window,
                 sinks=True)
    rows = entries = 0
    for n in lens:  # the loaded blocks: those holding a key one of the nq queries sees
        vis = _visible(nq, n, True, window).any(axis=0)
        blocks = [j for j in range(-(-n // blk)) if vis[j * blk:(j + 1) * blk].any()]
        rows += sum(min(blk, n - j * blk) for j in blocks)
        entries += len({(c // page) for j in blocks for c in range(j * blk, min((j + 1) * blk, n))})
    assert _bytes(g.row, "K") == _bytes(g.row, "V") == hkv * rows * d * 2
    assert _bytes(g.row, "block_table") == hkv * entries * 4  # page <= block: one entry per page touched
    assert _bytes(g.row, "sinks") == len(lens) * hq * 4
    pairs = sum(int(_visible(nq, n, True, window).sum()) for n in lens)
    assert g.row.flops == 4 * hq * d * pairs
    if window == (-1, 0):  # causal alone: what it was without a window
        assert g.row.total == sv.paged(lens, page, nq=nq, d=d, dtype="fp16", heads=hq, kv_heads=hkv,
                                       block_kv=blk).row.total + len(lens) * hq * 4


# --- the CLI --------------------------------------------------------------------------------------
def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_traffic_window_json_matches_the_model(capsys):
    rc, out, err = _run(capsys, "traffic", "--window", "1024,0", "--sinks", "--softcap", "30", "--json")
    assert rc == 0, err
    j = json.loads(out)
    t = tr.traffic(window=(1024, 0), softcap=30.0, sinks=True)
    assert j["params"]["window"] == [1024, 0] and j["params"]["softcap"] == 30.0 and j["params"]["sinks"]
    assert {r["name"]: r["total"] for r in j["rows"]} == {k: r.total for k, r in t.rows.items()}


def test_cli_traffic_says_the_mods_line(capsys):
    rc, out, _ = _run(capsys, "traffic", "--softcap", "50", "--sinks")
    assert rc == 0 and "no HBM traffic beyond the sink vector" in out.replace("\n", " ")


def test_cli_backward_decode_varlen_take_the_window(capsys):
    for argv, model in (
            (["--pass", "backward"], bw.backward_traffic(window=(256, 0))["flash-causal-backward"].total),
            (["--cache-lens", "1000,5000", "--page-size", "16"],
             sv.paged([1000, 5000], 16, block_kv=64, heads=1, d=128, dtype="fp16",
                      window=(256, 0)).row.total),
            (["--lengths", "100,300", "--rows", "flash-causal"],
             sv.packed([100, 300], rows=["flash-causal"], window=(256, 0))["flash-causal"].total)):
        rc, out, err = _run(capsys, "traffic", "--window", "256,0", *argv, "--json")
        assert rc == 0, err
        j = json.loads(out)
        totals = [r["total"] for r in j["rows"]]
        assert model in totals, argv


@pytest.mark.parametrize("argv,msg", [
    (["traffic", "--window", "5"], "--window: expected L,R: two integers >= -1 (-1 = unbounded), got '5'"),
    (["traffic", "--window=-2,0"], "--window: expected comma-separated integers >= -1, got '-2,0'"),
    (["traffic", "--window", "1,2,3"], "--window: expected at most 2 values, got 3"),
    (["traffic", "--softcap", "-1"], "--softcap: expected a finite real number >= 0 (0 disables), got -1.0"),
    (["traffic", "--softcap", "inf"], "--softcap: expected a finite real number >= 0"),
    (["tiles", "--window", "a,b"], "--window: expected comma-separated integers >= -1"),
])
def test_cli_bad_mods_one_line_exit_2(capsys, argv, msg):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and msg in err, err


def test_cli_tiles_window_json(capsys):
    rc, out, err = _run(capsys, "tiles", "--window", "1024,5", "--query-tile", "20", "--json")
    assert rc == 0, err
    j = json.loads(out)
    assert j["loaded"] == list(range(23, 41)) and j["full"] == list(range(25, 39))
    assert j["left_masked"] == [23, 24] and j["right_masked"] == [39, 40] and j["masked"] == [23, 24, 39, 40]
    assert j["skipped"] == list(range(1, 23)) + list(range(41, 65))
    assert j["skipped_span"] == {"first": 1, "last": 64, "count": 46}
    assert j["skipped_runs"] == [[1, 22], [41, 64]] and j["masked_runs"] == [[23, 24], [39, 40]]
    assert j["tile_pairs"] == 504 and j["kv_passes"] == 7.875
    assert set(j["row_classes"]["23"]) == {"masked", "triangular", "permitted", "left_edge", "left_masked"}
    assert j["row_classes"]["23"]["left_masked"] == [2497, 2560]  # rows whose window starts past 1,472


def test_cli_tiles_window_text(capsys):
    rc, out, _ = _run(capsys, "tiles", "--window", "1024,0", "--query-tile", "20")
    assert rc == 0
    assert "skips   KV tiles 1..22 and 41..64 (46: every column outside the window" in out
    assert "23..24 (left-masked" in out and "39..40 (right-masked" in out
    assert "504 of 2,048 tile pairs visited" in out


@pytest.mark.parametrize("window", [(0, 0), (30, 0), (7, 9)])
def test_packed_tma_overread_under_a_window(window):
    """TMA reads every loaded KV tile whole, up to the packed tensor's end: counted from the dense mask."""
    lq, lk, bq, bk, d = [20, 50, 9, 33], [89, 50, 9, 20], 8, 32, 64
    total_k, k0, rows = sum(lk), 0, 0
    for nq, nk in zip(lq, lk, strict=True):
        vis = _visible(nq, nk, True, window)
        for r0 in range(0, nq, bq):
            rows += sum(min(k0 + c0 + bk, total_k) - (k0 + c0) for c0 in range(0, nk, bk)
                        if vis[r0:r0 + bq, c0:c0 + bk].any())
        k0 += nk
    p = sv.packed(lq, lk, d=d, block_q=bq, block_kv=bk, rows=["flash-causal"], window=window)
    row = p["flash-causal"]
    assert _bytes(row, "K") == _bytes(row, "V") == rows * d * 2
