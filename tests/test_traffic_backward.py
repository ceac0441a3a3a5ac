"""The backward ledger (model/backward.py, `attnscope traffic --pass backward`): counts held against
brute-force sums over model/tiles.py's Grid, structure (nothing N x N in FA-2), closed-form cost."""

from __future__ import annotations

import json
import random
import time

import pytest

from attnscope.cli import main
from attnscope.model import backward as bw
from attnscope.model.tiles import Grid


def _brute(g: Grid):
    loaded = [g.kv_bounds(i)[1] for i in range(1, g.n_q_tiles + 1)]
    rows = [g.rows(i)[1] - g.rows(i)[0] + 1 for i in range(1, g.n_q_tiles + 1)]
    q_rows = sum(r * n for r, n in zip(rows, loaded, strict=True))  # Q rows the dK/dV pass reads
    k_rows = sum(g.kv_rows_loaded(i) for i in range(1, g.n_q_tiles + 1))  # K rows the dQ pass reads
    return sum(loaded), sum(n == g.n_kv_tiles for n in loaded), q_rows, k_rows


def _bytes(row, kernel_prefix, tensor, direction="read"):
    return sum(t.nbytes for k in row.kernels if k.name.startswith(kernel_prefix) for t in k.transfers
               if t.tensor == tensor and t.direction == direction)


def test_loaded_pairs_closed_form_equals_the_sum_over_tiles():
    rng = random.Random(0)
    for _ in range(2000):
        nq, nk = rng.randint(1, 900), rng.randint(1, 900)
        bq, bk = rng.choice([16, 32, 64, 128]), rng.choice([16, 32, 64, 128])
        g = Grid(nq, nk, bq, bk, causal=rng.random() < 0.8)
        assert g.loaded_pairs() == _brute(g)[:2], (nq, nk, g.block_q, g.block_kv, g.causal)


@pytest.mark.parametrize("nq,nk,causal", [(4096, 4096, False), (4096, 4096, True), (1000, 1537, True),
                                          (1537, 1000, True), (97, 17, False), (1, 200, True)])
def test_flash_backward_rows_match_the_tile_sums(nq, nk, causal):
    d, b, bq, bk = 128, 2, 128, 64
    t = bw.backward_traffic(nq=nq, nk=nk, d=d, dtype="bf16", block_q=bq, block_kv=bk)
    _, _, q_rows, k_rows = _brute(Grid(nq, nk, bq, bk, causal=causal))
    atomic = t["flash-causal-backward" if causal else "flash-backward"]
    det = t["flash-causal-backward-det" if causal else "flash-backward-det"]
    assert _bytes(det, "3.", "Q") == q_rows * d * b and _bytes(det, "3.", "dO") == q_rows * d * b
    assert _bytes(det, "4.", "K") == k_rows * d * b and _bytes(det, "4.", "V") == k_rows * d * b
    assert _bytes(atomic, "3.", "dQacc") == q_rows * d * 4  # FP32 read per tile pair ...
    assert _bytes(atomic, "3.", "dQacc", "write") == q_rows * d * 4  # ... and written back
    for row in (atomic, det):  # everything K/V-sized once, nothing [Nq, Nk]
        assert _bytes(row, "", "dK", "write") == nk * d * b and _bytes(row, "", "dQ", "write") == nq * d * b
        assert not any(t.tensor in ("S", "P", "dS", "dP") for k in row.kernels for t in k.transfers)
    naive = t["naive-causal-eager-backward" if causal else "naive-backward"]
    assert _bytes(naive, "", "P") == 2 * nq * nk * b  # P kept by the forward, read by dV and softmax bwd
    assert _bytes(naive, "", "mask") == (nq * nk if causal else 0)


def test_gqa_counts_kv_once_per_kv_head():
    t1 = bw.backward_traffic(n=1024, heads=8, kv_heads=8)
    t4 = bw.backward_traffic(n=1024, heads=8, kv_heads=2)
    k1 = _bytes(t1["flash-backward"], "3.", "K")
    assert _bytes(t4["flash-backward"], "3.", "K") * 4 == k1


def test_cost_is_constant_in_n():
    start = time.perf_counter()
    t = bw.backward_traffic(n=1 << 40, d=128)
    assert t["flash-causal-backward-det"].total > 0
    assert time.perf_counter() - start < 0.5


def test_ratio_refused_across_conditions():
    t = bw.backward_traffic(n=256)
    with pytest.raises(ValueError, match="one masking condition"):
        t.ratio("naive-backward", "flash-causal-backward")


def test_cli_traffic_pass_backward(capsys):
    assert main(["traffic", "--pass", "backward", "--n", "1000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["rows"]] == list(bw.BACKWARD_ROWS)
    assert main(["traffic", "--pass", "backward", "--rows", "all", "--json"]) == 0  # all: the backward rows
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["rows"]] == list(bw.BACKWARD_ROWS)
    assert main(["traffic", "--pass", "backward", "--rows", "flash-backward,bogus"]) == 2
    assert "rows: expected one of naive-backward" in capsys.readouterr().err
