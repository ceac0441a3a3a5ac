"""The forward's open class (issue 39: SDPA FLASH causal, few K/V heads, N > 20k, B > 1): model/l2.py's
hot-set curve for several K/V heads (`L2Params.hot_groups`, `hot_knots`), its fit
(bench/fit_family_params.py --hot) against the recorded sweeps, the held-out grids and the probe grid
(CPU)."""

import importlib.util
import json
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
FIT_INPUTS = [next(p for ext in (".json", ".json.gz")  # the larger two gzipped
                   if (p := RESULTS / f"h200-2026-12-01-bytes-{n}{ext}").exists())
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
    # `hot_groups`; its d 128 points with several K/V heads at a hot footprint of 0.3 x L2 or more have no
    # estimate (`l2.not_modelled`: 10 of those 17 are within 10 % under the curve, 7 are not), and 29 of the
    # other 31 are within 10 %
    rows, _ = physical.rows_from_json(OPEN1)
    assert len(rows) == 48
    refused = [r for r in rows if r.estimate is None]
    assert len(refused) == 17 and all(r.spec["d"] == 128 and r.spec["kv_heads"] > 1 and
                                      r.note.startswith("not modelled: FA-2 d 128 causal") for r in refused)
    assert sum(abs(r.error) <= 0.10 for r in rows if r.estimate is not None) == 29
    s = physical.summarize(rows)
    assert s["within"]["10%"] == 29 and len(s["not_modelled"]) == 17  # within no band
    assert any(line.startswith("not modelled (no estimate, within no band): 17: flash B=")
               for line in physical.summary_lines(s))
    assert not [r for r in rows if r.silently_below]


@pytest.mark.parametrize("call, refused", [
    ((2, 16, 2, 23000, 128, "fp16"), False),   # hot footprint 1.5 x 2 x 23000 x 256 B / 60 MiB = 0.281,
    ((2, 16, 2, 24000, 128, "bf16"), False),   # 0.293,
    ((2, 16, 2, 25000, 128, "fp16"), True),    # 0.305: the boundary (0.3) lies between
    ((3, 8, 2, 31031, 128, "bf16"), True),     # the second open-class grid's worst point (0.63)
    ((5, 16, 2, 4000, 128, "fp16"), False),    # B 5 at 0.15 x L2: below
    ((2, 16, 1, 39000, 128, "fp16"), False),   # one K/V head (`hot`): its runs repeat within 9.5 %
    ((2, 16, 16, 39000, 128, "fp16"), False),  # MHA: no hot set
    ((1, 16, 2, 39000, 128, "fp16"), False),   # B 1: no rotation of the batch's sets
    ((3, 16, 2, 39000, 64, "fp16"), False),    # d 64's kernel: its runs repeat within 1.1 %
])
def test_not_modelled_is_fa2_d128_causal_gqa_past_its_measured_footprint(call, refused):
    b, h, hkv, n, d, dtype = call
    why = l2.not_modelled("flash", n, d, h, b, dtype, True, kv_heads=hkv, l2_bytes=H200_L2)
    assert (why is not None) == refused
    if 1 < hkv < h and d == 128 and b > 1:  # in the class, the footprint alone decides
        foot = l2.hot_footprint(b, 2 * n * d * 2, H200_L2)
        assert refused == (foot >= H200_L2_PARAMS.hot_groups_modelled_below)
    for impl in ("cudnn", "efficient", "attnscope"):  # only FA-2's counters were seen to move so
        assert l2.not_modelled(impl, n, d, h, b, dtype, True, kv_heads=hkv, l2_bytes=H200_L2) is None
    assert l2.not_modelled("flash", n, d, h, b, dtype, False, kv_heads=hkv, l2_bytes=H200_L2) is None
    # the larger the L2, the smaller the footprint: never refused where it was not on a smaller one
    if why is None:
        assert l2.not_modelled("flash", n, d, h, b, dtype, True, kv_heads=hkv, l2_bytes=2 * H200_L2) is None


def test_a_not_modelled_point_has_no_estimate_in_a_single_call_or_a_sweep(capsys, tmp_path):
    from attnscope.cli import main

    argv = ["bytes", "--estimate-only", "--impl", "flash", "--causal", "--n", "30001", "--batch", "3",
            "--heads", "16", "--kv-heads", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"] is None and out["note"].startswith("not modelled: FA-2 d 128 causal at B 3")
    assert main(argv[:-1]) == 0
    assert "physical estimate: not modelled: FA-2 d 128" in capsys.readouterr().out
    grid = tmp_path / "g.csv"
    grid.write_text("impl,batch,heads,kv_heads,n,d,causal\nflash,3,16,2,30001,128,1\nflash,3,16,2,3001,128,1\n")
    assert main(["bytes", "--estimate-only", "--sweep", str(grid), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["estimate"] is None and "not modelled" in rows[0]["note"]
    assert rows[1]["estimate"] > 0


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


@pytest.mark.parametrize("name, seed", [("heldout_fwd_openclass2.csv", 393),
                                        ("heldout_fwd_openclass3.csv", 394)])
def test_later_open_class_grids_are_drawn_by_the_first_ones_rule_and_share_no_n(name, seed):
    fresh = physical.parse_grid(GRIDS / name)
    assert len(fresh) == 48
    assert all(s["impl"] == "flash" and s["causal"] and 20_000 < s["n"] <= 40_000 and 2 <= s["batch"] <= 4
               and s.get("kv_heads", s["heads"]) in (1, 2, 4) and s["heads"] // s["kv_heads"] >= 4
               for s in fresh)
    assert {(s["d"], s["dtype"]) for s in fresh} == {(64, "fp16"), (64, "bf16"), (128, "fp16"), (128, "bf16")}
    from grid_draws import assert_drawn

    assert_drawn(name, "fwd_openclass", seed)
    # no N in any other grid (the first open-class grid, the probes, issue 18's grids)
    fresh_n = {s["n"] for s in fresh}
    assert len(fresh_n) == 48
    others = [g for g in GRIDS.glob("*.csv") if g.name != name]
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
    assert len(rows) == 20 and all(s["impl"] == "flash" and s["causal"] for s in rows)
    d64 = [s for s in rows if s["d"] == 64]  # s: one footprint, several B
    assert len(d64) == 5
    feet = {(s["batch"], round(l2.hot_footprint(s["batch"], 2 * s["n"] * 64 * 2, H200_L2), 3)) for s in d64}
    assert feet == {(2, 0.2), (3, 0.2), (5, 0.2), (3, 0.4), (5, 0.4)}
    rows = [s for s in rows if s["d"] == 128]
    assert len(rows) == 15
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


def test_a_measured_sweep_reports_a_not_modelled_point_without_an_estimate(tmp_path, capsys, monkeypatch):
    from attnscope.cli import main
    from sweep_stub import point, stub_sweep

    stub_sweep(monkeypatch, lambda specs: [point(s, 10**9, 10**8, "flash_fwd_kernel") for s in specs])
    grid = tmp_path / "g.csv"
    grid.write_text("impl,batch,heads,kv_heads,n,d,causal\nflash,3,16,2,30001,128,1\nflash,3,16,2,3001,128,1\n")
    out = tmp_path / "s.json"
    argv = ["bytes", "--sweep", str(grid), "--l2-bytes", str(H200_L2), "--sms", "132", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "not modelled (no estimate, within no band): 1: flash B=3 H=16/2 N=30001" in text
    doc = json.loads(out.read_text())
    assert doc["rows"][0]["estimate"] is None and doc["rows"][0]["error"] is None
    assert doc["rows"][0]["note"].startswith("not modelled") and doc["rows"][1]["estimate"] > 0
    assert doc["summary"]["count"] == 2
    assert doc["summary"]["not_modelled"] == ["flash B=3 H=16/2 N=30001 d=128 fp16 causal"]
    # --from-json re-scores it the same way
    assert main(["bytes", "--from-json", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["rows"][0]["estimate"] is None and again["summary"]["not_modelled"] == \
        doc["summary"]["not_modelled"]
