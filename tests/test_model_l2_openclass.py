"""The forward's open class (issue 39: SDPA FLASH causal, few K/V heads, N > 20k, B > 1): model/l2.py's
hot-set curve for several K/V heads (`L2Params.hot_groups`, `hot_knots`), its fit
(bench/fit_family_params.py --hot) against the recorded sweeps, the held-out grids and the probe grid
(CPU)."""

import importlib.util
import time
from dataclasses import replace
from pathlib import Path

import pytest

from attnscope.measure import physical
from attnscope.model import l2
from attnscope.model.l2_params import H200_L2_PARAMS, hot_knots

ROOT = Path(__file__).resolve().parents[1]
GRIDS, RESULTS = ROOT / "bench" / "grids", ROOT / "bench" / "results"
OPEN1 = RESULTS / "h200-2026-12-02-heldout-fwd-openclass.json"
#: the sweeps `hot_groups` was fitted to (L2Params.hot_groups names them)
FIT_INPUTS = [RESULTS / f"h200-2026-12-01-bytes-{n}.json"
              for n in ("hotprobe", "heldout3", "heldout7", "heldout11", "heldout19", "heldout25")] + [OPEN1]
H200_L2 = 62_914_560


def _fit_hot():
    path = ROOT / "bench" / "fit_family_params.py"
    spec = importlib.util.spec_from_file_location("fit_family_params", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hot_knots_pick_one_curve_per_fa2_kernel_and_kv_head_count():
    p = H200_L2_PARAMS
    assert hot_knots(64, 1) == hot_knots(64, 4) == p.hot_d64
    assert hot_knots(128, 1) == p.hot
    assert hot_knots(128, 2) == hot_knots(128, 8) == p.hot_groups != p.hot
    # a rotation well inside the L2 is read once, as with one K/V head; both curves rise with the footprint
    assert l2.hot_miss(0.05, p.hot_groups) == 0.0
    ys = [l2.hot_miss(x / 100, p.hot_groups) for x in range(0, 130)]
    assert ys == sorted(ys) and ys[-1] == p.hot_groups[-1][1]


@pytest.mark.parametrize("call, moves", [
    ((28548, 128, 16, 2, "bf16", True, 2), True),    # FA-2 d 128 causal, B 2, Hkv 2: the class
    ((28548, 128, 16, 2, "bf16", True, 1), False),   # one K/V head: `hot`
    ((28548, 64, 16, 2, "bf16", True, 2), False),    # d 64's kernel: `hot_d64`
    ((28548, 128, 16, 1, "bf16", True, 2), False),   # B 1: no rotation of the batch's sets
    ((28548, 128, 16, 2, "bf16", False, 2), False),  # unmasked: the lockstep count
])
def test_hot_groups_moves_only_fa2_d128_causal_gqa_at_b_over_1_with_kv_heads(monkeypatch, call, moves):
    n, d, h, b, dtype, causal, hkv = call
    kw = {"kv_heads": hkv, "l2_bytes": H200_L2, "sms": 132}
    doubled = replace(H200_L2_PARAMS, hot_groups=((0.0, 2.0), (9.0, 2.0)))
    before = l2.estimate("flash", n, d, h, b, dtype, causal, **kw).total
    monkeypatch.setattr(l2, "H200_L2_PARAMS", doubled)
    after = l2.estimate("flash", n, d, h, b, dtype, causal, **kw).total
    assert (after > 1.2 * before) if moves else (after == before)
    # the other implementations never read it
    for impl in ("cudnn", "efficient", "attnscope"):
        monkeypatch.setattr(l2, "H200_L2_PARAMS", H200_L2_PARAMS)
        x = l2.estimate(impl, n, d, h, b, dtype, causal, **kw).total
        monkeypatch.setattr(l2, "H200_L2_PARAMS", doubled)
        assert l2.estimate(impl, n, d, h, b, dtype, causal, **kw).total == x


def test_the_shipped_hot_groups_are_the_fit_of_the_recorded_runs():
    fit_hot = _fit_hot()
    points = []
    for path in FIT_INPUTS:
        rows, _ = physical.rows_from_json(path)
        points += [(r.spec, m) for r in rows if fit_hot.in_class(r.spec) for m in (r.runs or (r.measured,))]
    assert len(points) == 41
    out = fit_hot.fit(points, H200_L2, 132)
    assert out["knots"] == H200_L2_PARAMS.hot_groups
    # in-sample: each run of the class against its own fit, far better than with one K/V head's curve
    errs = sorted(abs(r["error"]) for r in out["rows"])
    assert sum(e <= 0.10 for e in errs) == 29 and errs[len(errs) // 2] < 0.05


def test_first_open_class_grid_rescored_in_sample():
    # in-sample re-score, not a judgement: the grid that showed the miss (31 of 48 within 10 %) helped fit
    # `hot_groups`; its d 128 points with several K/V heads gain most
    rows, _ = physical.rows_from_json(OPEN1)
    assert len(rows) == 48
    assert sum(abs(r.error) <= 0.10 for r in rows) == 39
    gqa = [r for r in rows if r.spec["d"] == 128 and r.spec["kv_heads"] > 1]
    assert len(gqa) == 19 and sum(abs(r.error) for r in gqa) / len(gqa) < 0.09
    assert not [r for r in rows if r.silently_below]


def test_the_hot_path_costs_no_more_at_huge_n():
    def timed(n):
        t = time.perf_counter()
        for hkv in (1, 2, 4):
            l2.estimate("flash", n, 128, 16, 3, "fp16", True, kv_heads=hkv)
        return time.perf_counter() - t

    timed(2**18)
    mid, large = [], []
    for _ in range(5):  # interleaved, best of 5: a loaded machine slows both alike
        mid.append(timed(2**18))
        large.append(timed(2**24))
    assert min(large) < 1.5 * min(mid) + 0.002, (min(mid), min(large))


def test_second_open_class_grid_is_drawn_by_the_first_ones_rule_and_shares_no_n():
    fresh = physical.parse_grid(GRIDS / "heldout_fwd_openclass2.csv")
    assert len(fresh) == 48
    assert all(s["impl"] == "flash" and s["causal"] and 20_000 < s["n"] <= 40_000 and 2 <= s["batch"] <= 4
               and s.get("kv_heads", s["heads"]) in (1, 2, 4) and s["heads"] // s["kv_heads"] >= 4
               for s in fresh)
    assert {(s["d"], s["dtype"]) for s in fresh} == {(64, "fp16"), (64, "bf16"), (128, "fp16"), (128, "bf16")}
    header = (GRIDS / "heldout_fwd_openclass2.csv").read_text().splitlines()
    assert any("--draw 393 --family fwd_openclass" in line for line in header if line.startswith("#"))
    spec = importlib.util.spec_from_file_location("prefill", ROOT / "bench" / "prefill.py")
    prefill = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prefill)
    drawn = prefill.draw_sweep("fwd_openclass", 393)
    assert [(r["batch"], r["heads"], r["kv_heads"], r["n"], r["d"], r["dtype"]) for r in drawn] == \
        [(s["batch"], s["heads"], s["kv_heads"], s["n"], s["d"], s["dtype"]) for s in fresh]
    # no N in any other grid (the first open-class grid, the probes, issue 18's grids)
    fresh_n = {s["n"] for s in fresh}
    assert len(fresh_n) == 48
    others = [g for g in GRIDS.glob("*.csv") if g.name != "heldout_fwd_openclass2.csv"]
    assert len(others) > 40
    for g in others:
        try:
            ns = {s["n"] for s in physical.parse_grid(g) if "n" in s}
        except ValueError:  # dispatch_heldout.csv: prefill.py's shapes, not a sweep grid
            ns = {int(line.split(",")[3]) for line in g.read_text().splitlines()[1:]
                  if line and not line.startswith("#")}
        assert not fresh_n & ns, g.name


def test_probe_grid_parses_and_each_k_set_changes_only_the_kv_heads():
    rows = physical.parse_grid(GRIDS / "probe_fwd_openclass.csv")
    assert len(rows) == 12 and all(s["impl"] == "flash" and s["causal"] and s["d"] == 128 for s in rows)
    by_n = {}
    for s in rows:
        by_n.setdefault((s["batch"], s["n"]), []).append(s)
    for key in ((2, 27001), (2, 36871)):
        ks = by_n[key]
        assert sorted(s["kv_heads"] for s in ks) == [1, 2, 4]
        assert {s["heads"] // s["kv_heads"] for s in ks} == {8}
    # the t rows hold the footprint (B - 1/2) x (K + V of one kv head) at k2's within 2 %
    ratio = {(s["batch"], s["n"]): (s["batch"] - 0.5) * s["n"] for s in rows}
    ref = ratio[2, 36871]
    assert all(abs(ratio[k] / ref - 1) < 0.02 for k in ((3, 22121), (5, 12301)))
