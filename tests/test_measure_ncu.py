"""measure/ncu.py: the command line, CSV parsing, splitting at markers, and the one-line errors (CPU)."""

import gzip
import json
import os
from pathlib import Path

import pytest

from attnscope.cli import main
from attnscope.errors import InputError
from attnscope.measure import ncu, physical
from attnscope.measure.ncu import KernelBytes, NcuError, parse_csv, split_at_markers

DATA = Path(__file__).parent / "data" / "measure"
RECORDED = DATA / "recorded"


def test_command_line():
    cmd = ncu.ncu_command(["python", "-m", "x"], "/tmp/log.csv", ncu="/opt/ncu")
    assert cmd[0] == "/opt/ncu" and cmd[-3:] == ["python", "-m", "x"]
    s = " ".join(cmd)
    assert "--metrics dram__bytes_read.sum,dram__bytes_write.sum" in s
    assert "--clock-control none" in s and "--profile-from-start off" in s and "--csv" in s
    assert "--target-processes application-only" in s  # inductor's compile workers are not injected
    assert "--cache-control none" in s and "--print-units base" in s and "--log-file /tmp/log.csv" in s
    assert "--cache-control all" in " ".join(ncu.ncu_command(["x"], "l", cache_control="all"))
    with pytest.raises(ValueError, match=r"cache_control: expected one of none, all, got 'some'"):
        ncu.ncu_command(["x"], "l", cache_control="some")


def test_child_command_carries_the_specs():
    specs = [{"impl": "flash", "n": 4096, "d": 128, "heads": 32, "causal": True}]
    cmd = ncu.child_command(specs)
    assert cmd[1:4] == ["-m", "attnscope.measure.ncu", "--child"]
    assert json.loads(cmd[4]) == specs


def test_parse_handmade_csv():
    ks = parse_csv((DATA / "ncu_handmade.csv").read_text())
    assert [k.id for k in ks] == [0, 1, 2, 3, 4]
    gemm = ks[1]
    assert gemm.read == 2_097_152 and gemm.write == 33_554_432  # thousands separators
    softmax = ks[2]
    assert softmax.read == 6_500_000 and softmax.write == 32_768_500  # Mbyte / Kbyte are decimal
    assert ks[4].total == 100_663_296 + 33_554_432
    assert "flash_fwd_kernel" in ks[4].name
    assert (ks[4].threads, ks[4].grid) == (128, 32)  # the x of "(128, 1, 1)" and "(32, 1, 32)"


def test_split_at_markers_and_pair():
    ks = parse_csv((DATA / "ncu_handmade.csv").read_text())
    calls = split_at_markers(ks)
    assert [[k.id for k in c] for c in calls] == [[1, 2], [4]]
    status = [{"impl": "naive", "marked": True}, {"impl": "cudnn", "marked": False, "ok": False},
              {"impl": "flash", "marked": True}]
    paired = ncu.pair(status, calls)
    assert [(s["impl"], [k.id for k in c]) for s, c in paired] == [("naive", [1, 2]), ("flash", [4])]
    # without any marker the whole list is one call; kernels before the first marker are dropped
    plain = [KernelBytes(7, "gemm", 1, 2), KernelBytes(8, "softmax", 3, 4)]
    assert split_at_markers(plain) == [plain]
    stray = [KernelBytes(1, "stray", 1, 1), KernelBytes(2, "spin_kernel(long)", 0, 0)]
    assert split_at_markers(stray) == [[]]


def test_counters_not_permitted_is_one_clear_line():
    text = ("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission "
            "to access NVIDIA GPU Performance Counters on the target device 0.\n")
    with pytest.raises(NcuError, match=r"^ncu: access to GPU performance counters is not permitted "
                                       r"\(ERR_NVGPUCTRPERM\); run as root, or load the driver with "
                                       r"NVreg_RestrictProfilingToAdminUsers=0$"):
        parse_csv(text)


def test_no_table_and_no_kernels():
    with pytest.raises(NcuError, match=r"^ncu: no CSV metric table in the output"):
        parse_csv("==PROF== Disconnected from process 1\n")
    with pytest.raises(NcuError, match=r"^ncu: no kernels were profiled"):
        parse_csv("==WARNING== No kernels were profiled.\n")


def test_unknown_unit_is_refused():
    text = (DATA / "ncu_handmade.csv").read_text().replace('"Mbyte"', '"furlong"')
    with pytest.raises(ValueError, match="unknown unit 'furlong'"):
        parse_csv(text)


def test_missing_ncu_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    if os.access("/usr/local/cuda/bin/ncu", os.X_OK):
        pytest.skip("this machine has /usr/local/cuda/bin/ncu")
    with pytest.raises(NcuError, match=r"^ncu \(Nsight Compute CLI\) not found on PATH or in "
                                       r"\$CUDA_HOME/bin"):
        ncu.find_ncu()


def test_child_status_line():
    out = 'noise\nATTNSCOPE_STATUS [{"impl": "flash", "ok": true, "marked": true}]\nmore\n'
    assert ncu.child_status(out) == [{"impl": "flash", "ok": True, "marked": True}]
    assert ncu.child_status("nothing here") == []


def test_measure_validates_impl():
    with pytest.raises(ValueError, match=r"impl: expected one of naive, flash, cudnn, efficient, attnscope, "
                                         r"got 'math'"):
        ncu.measure("math")


def _recorded_runs():
    path = RECORDED / "ncu.json.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [r for r in json.load(f)["runs"] if r.get("csv")]


@pytest.mark.skipif(not _recorded_runs(), reason="no recorded ncu output yet")
def test_recorded_csv_parses_into_one_segment_per_marked_call():
    for run in _recorded_runs():
        calls = split_at_markers(parse_csv(run["csv"]))
        marked = [s for s in run["status"] if s.get("marked")]
        assert len(calls) == len(marked), run["name"]
        for spec, ks in ncu.pair(run["status"], calls):
            if spec.get("ok"):
                assert ks, spec
                assert all(k.read >= 0 and k.write >= 0 for k in ks)
                # the child starts each call from an L2 full of clean scratch lines, so every call reads
                # its inputs Q, K, V ([B, H, N, d] each, 2-byte elements) from DRAM at least once. (Writes
                # have no such floor: the L2 is write-back and what fits stays dirty in it past the call.)
                qkv = 3 * spec["batch"] * spec["heads"] * spec["n"] * spec["d"] * 2
                assert sum(k.read for k in ks) >= 0.95 * qkv, (spec, [k.to_json() for k in ks])


# --- attnscope bytes --sweep / --from-json / --calibrate (measure/physical.py) ---------------------------

HELDOUT = Path(__file__).resolve().parents[1] / "bench" / "grids" / "heldout.csv"
HELDOUT2 = HELDOUT.with_name("heldout2.csv")  # drawn after run 1 of heldout.csv: shares no shape with it
HELDOUT3 = HELDOUT.with_name("heldout3.csv")  # drawn after run 2 and the spill probe: no N shared with them
HELDOUT4 = HELDOUT.with_name("heldout4.csv")  # drawn after grid 3 ran (its N reach 30,965 only)
HELDOUT5 = HELDOUT.with_name("heldout5.csv")  # drawn after grid 4's run, before r18e's model changes
HELDOUT6 = HELDOUT.with_name("heldout6.csv")  # drawn after grid 5's run, before r18f's model changes
HELDOUT7 = HELDOUT.with_name("heldout7.csv")  # drawn after grid 6's run, before r18g's model work
PROBE = HELDOUT.with_name("spill_probe.csv")  # development data (bench/gpu/spill_probe.sh at 5eeec86)
LOCKSTEP = HELDOUT.with_name("lockstep_probe.csv")  # development data (bench/gpu/bytes_lockstep.sh, 5eeec86)
HELDOUT8 = HELDOUT.with_name("heldout8.csv")  # drawn before r18h's model work
HELDOUT9 = HELDOUT.with_name("heldout9.csv")  # drawn 2026-12-01 with the model grids 7 and 8 ran against
HELDOUT10 = HELDOUT.with_name("heldout10.csv")  # drawn after `l2.paired_rereads`, before its run
HELDOUT11 = HELDOUT.with_name("heldout11.csv")  # drawn after `l2.head_gap_rereads`, before its run
HELDOUT12 = HELDOUT.with_name("heldout12.csv")  # drawn after `l2.batch_gap_rereads`, before its run
HELDOUT13 = HELDOUT.with_name("heldout13.csv")  # drawn after r18c's causal window, before its run
HELDOUT14 = HELDOUT.with_name("heldout14.csv")  # drawn after the symmetric `l2.mean_miss`, before its run
HELDOUT15 = HELDOUT.with_name("heldout15.csv")  # drawn after r18w's causal GQA batch term, before its run
HELDOUT16 = HELDOUT.with_name("heldout16.csv")  # drawn with grid 15's model, for its first --repeat 3 run
HELDOUT17 = HELDOUT.with_name("heldout17.csv")  # drawn after `L2Params.for_lockstep`, before its run
HELDOUT18 = HELDOUT.with_name("heldout18.csv")  # drawn after `L2Params.for_wide`, before its run
HELDOUT19 = HELDOUT.with_name("heldout19.csv")  # drawn after the ncu child's primer range, before its run
HELDOUT20 = HELDOUT.with_name("heldout20.csv")  # drawn after dirty O's room retention, before its run
HELDOUT21 = HELDOUT.with_name("heldout21.csv")  # drawn after FA-2's fill-driven frames, before its run
HELDOUT22 = HELDOUT.with_name("heldout22.csv")  # grid 21's estimate again (a replication), before its run
HELDOUT23 = HELDOUT.with_name("heldout23.csv")  # drawn after `l2.hot_miss`, before its run
HELDOUT24 = HELDOUT.with_name("heldout24.csv")  # grid 23's estimate again (a replication), before its run
HELDOUT25 = HELDOUT.with_name("heldout25.csv")  # drawn after `l2.launch_fill_share`, before its run
HELDOUT26 = HELDOUT.with_name("heldout26.csv")  # grid 25's estimate again (a replication), before its run
HELDOUT27, HELDOUT28 = (HELDOUT.with_name(f"heldout{i}.csv") for i in (27, 28))  # grid 25 again, pre-run
HELDOUT29 = HELDOUT.with_name("heldout29.csv")  # drawn after `L2Params.hot_d64`, before its run
HELDOUT30 = HELDOUT.with_name("heldout30.csv")  # grid 29's estimate again (a replication), before its run
RERUN17 = HELDOUT.with_name("rerun17.csv")  # development data (reruns of grid 17's misses)
RERUN10 = HELDOUT.with_name("rerun10.csv")  # development data (reruns of grid 10's worst points)
RERUN7, FRAMES, PERSIST = (HELDOUT.with_name(n) for n in ("rerun7.csv", "frames_probe.csv",
                                                           "persist_probe.csv"))  # development data
LATER_PROBES = tuple(HELDOUT.with_name(n) for n in (  # development data, sessions 10-11
    "repeat_smoke.csv", "spill_n_probe.csv", "local15_probe.csv", "decay_probe.csv"))
PROBES12 = tuple(HELDOUT.with_name(n) for n in ("l2_counters_probe.csv", "first_probe.csv"))  # session 12
HOT_PROBE, HEADS_PROBE = (HELDOUT.with_name(n) for n in ("hot_probe.csv", "heads_probe.csv"))  # session 13
GRID = "impl,B,H,Hkv,N,d,causal,dtype\nflash,2,12,4,3001,128,true,bf16\nnaive,1,3,,777,64,0,fp16\n"


def test_grid_csv_parses_into_specs(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("# a comment line\n" + GRID)
    specs = physical.parse_grid(p)
    assert specs == [{"impl": "flash", "batch": 2, "heads": 12, "n": 3001, "d": 128, "causal": True,
                      "dtype": "bf16", "kv_heads": 4},
                     {"impl": "naive", "batch": 1, "heads": 3, "n": 777, "d": 64, "causal": False,
                      "dtype": "fp16"}]
    # the same points as JSON and as YAML
    js = tmp_path / "g.json"
    js.write_text(json.dumps({"points": [{"impl": "flash", "b": 2, "h": 12, "hkv": 4, "n": 3001, "d": 128,
                                          "causal": True, "dtype": "bf16"},
                                         {"impl": "naive", "heads": 3, "n": 777, "d": 64}]}))
    assert physical.parse_grid(js) == specs
    ym = tmp_path / "g.yaml"
    ym.write_text("- {impl: flash, B: 2, H: 12, Hkv: 4, N: 3001, d: 128, causal: yes, dtype: bf16}\n"
                  "- {impl: naive, H: 3, N: 777, d: 64}\n")
    assert physical.parse_grid(ym) == specs


@pytest.mark.parametrize("grid", [HELDOUT, HELDOUT2, HELDOUT3, HELDOUT5])
def test_the_heldout_grid_is_fresh_and_complete(grid):
    specs = physical.parse_grid(grid)
    assert len(specs) >= 40
    assert {s["impl"] for s in specs} == set(physical.ncu.IMPLS)
    assert max(s["n"] for s in specs) >= 32000
    assert any(s["n"] % 2 for s in specs) and any(s["heads"] % 2 for s in specs)
    assert any(s["batch"] > 1 for s in specs) and any(s.get("kv_heads") for s in specs)
    # not the development grid (recorded ncu points) nor the 22 shapes it named
    dev = {(s["impl"], s["n"], s["heads"], s["batch"]) for s, *_ in _dev_points()}
    assert not {(s["impl"], s["n"], s["heads"], s["batch"]) for s in specs} & dev
    assert not {(s["n"], s["heads"]) for s in specs} & {(3000, 12), (6144, 24), (12288, 40), (24576, 8)}
    assert len({tuple(sorted(s.items())) for s in specs}) == len(specs)


def test_the_second_heldout_grid_shares_no_shape_with_the_first():
    first = {(s["n"], s["heads"]) for s in physical.parse_grid(HELDOUT)}
    second = physical.parse_grid(HELDOUT2)
    assert not {(s["n"], s["heads"]) for s in second} & first
    assert not {s["n"] for s in second} & {s["n"] for s in physical.parse_grid(HELDOUT)}
    # SDPA refuses EFFICIENT with GQA + causal: such a point would measure nothing
    assert not [s for s in second if s["impl"] == "efficient" and s.get("kv_heads") and s["causal"]]


def test_the_third_heldout_grid_shares_no_n_with_any_earlier_grid_or_probe():
    third = physical.parse_grid(HELDOUT3)
    assert len(third) >= 44 and max(s["n"] for s in third) <= 32768
    earlier = {s["n"] for g in (HELDOUT, HELDOUT2, PROBE) for s in physical.parse_grid(g)}
    earlier |= {s["n"] for s, *_ in _dev_points()} | {3000, 6144, 12288, 24576}
    assert not {s["n"] for s in third} & earlier
    assert {s["causal"] for s in third} == {True, False} and {s["d"] for s in third} == {64, 128}
    assert {s["dtype"] for s in third} == {"fp16", "bf16"}
    assert not [s for s in third if s["impl"] == "efficient" and s.get("kv_heads") and s["causal"]]


@pytest.mark.parametrize("grid, earlier", [
    (HELDOUT4, (HELDOUT, HELDOUT2, HELDOUT3, PROBE)),
    (HELDOUT5, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, PROBE)),
    (HELDOUT6, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, PROBE)),
    (HELDOUT7, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, PROBE)),
    (HELDOUT8, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, PROBE, RERUN7,
                LOCKSTEP)),
    (HELDOUT9, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, PROBE,
                RERUN7, LOCKSTEP, FRAMES)),
    (HELDOUT10, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 PROBE, RERUN7, LOCKSTEP, FRAMES, PERSIST)),
    (HELDOUT11, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, PROBE, RERUN7, RERUN10, LOCKSTEP, FRAMES, PERSIST)),
    (HELDOUT12, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, PROBE, RERUN7, RERUN10, LOCKSTEP, FRAMES, PERSIST)),
    (HELDOUT13, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, PROBE, RERUN7, RERUN10, LOCKSTEP, FRAMES, PERSIST)),
    (HELDOUT14, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, PROBE, RERUN7, RERUN10, LOCKSTEP, FRAMES,
                 PERSIST)),
    (HELDOUT15, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, PROBE, RERUN7, RERUN10, LOCKSTEP,
                 FRAMES, PERSIST)),
    (HELDOUT16, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, PROBE, RERUN7, RERUN10,
                 LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES)),
    (HELDOUT17, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, PROBE, RERUN7,
                 RERUN10, LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES)),
    (HELDOUT18, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES)),
    (HELDOUT19, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES,
                 *PROBES12)),
    (HELDOUT20, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST,
                 *LATER_PROBES, *PROBES12)),
    (HELDOUT21, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST,
                 *LATER_PROBES, *PROBES12)),
    (HELDOUT22, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP,
                 FRAMES, PERSIST, *LATER_PROBES, *PROBES12)),
    (HELDOUT23, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, PROBE, RERUN7, RERUN10, RERUN17,
                 LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES, *PROBES12, HOT_PROBE)),
    (HELDOUT24, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, HELDOUT23, PROBE, RERUN7, RERUN10,
                 RERUN17, LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES, *PROBES12, HOT_PROBE)),
    (HELDOUT25, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, HELDOUT23, HELDOUT24, PROBE,
                 RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES, *PROBES12, HOT_PROBE,
                 HEADS_PROBE)),
    (HELDOUT26, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, HELDOUT23, HELDOUT24, HELDOUT25,
                 PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES, *PROBES12,
                 HOT_PROBE, HEADS_PROBE)),
    (HELDOUT27, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, HELDOUT23, HELDOUT24, HELDOUT25,
                 HELDOUT26, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST, *LATER_PROBES,
                 *PROBES12, HOT_PROBE, HEADS_PROBE)),
    (HELDOUT28, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, HELDOUT23, HELDOUT24, HELDOUT25,
                 HELDOUT26, HELDOUT27, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST,
                 *LATER_PROBES, *PROBES12, HOT_PROBE, HEADS_PROBE)),
    (HELDOUT29, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, HELDOUT23, HELDOUT24, HELDOUT25,
                 HELDOUT26, HELDOUT27, HELDOUT28, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP, FRAMES, PERSIST,
                 *LATER_PROBES, *PROBES12, HOT_PROBE, HEADS_PROBE)),
    (HELDOUT30, (HELDOUT, HELDOUT2, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6, HELDOUT7, HELDOUT8, HELDOUT9,
                 HELDOUT10, HELDOUT11, HELDOUT12, HELDOUT13, HELDOUT14, HELDOUT15, HELDOUT16, HELDOUT17,
                 HELDOUT18, HELDOUT19, HELDOUT20, HELDOUT21, HELDOUT22, HELDOUT23, HELDOUT24, HELDOUT25,
                 HELDOUT26, HELDOUT27, HELDOUT28, HELDOUT29, PROBE, RERUN7, RERUN10, RERUN17, LOCKSTEP,
                 FRAMES, PERSIST, *LATER_PROBES, *PROBES12, HOT_PROBE, HEADS_PROBE))])
def test_the_later_heldout_grids_share_no_n_with_any_earlier_grid(grid, earlier):
    specs = physical.parse_grid(grid)
    seen = {s["n"] for g in earlier for s in physical.parse_grid(g)}
    seen |= {s["n"] for s, *_ in _dev_points()} | {3000, 6144, 12288, 24576}
    assert not {s["n"] for s in specs} & seen
    assert len({s["n"] for s in specs}) == len(specs)
    # a quarter of the points at N 16k-32k, the rest below
    assert 4 * sum(s["n"] >= 16000 for s in specs) >= len(specs) and max(s["n"] for s in specs) <= 32768
    assert not [s for s in specs if s["impl"] == "efficient" and s.get("kv_heads") and s["causal"]]
    assert not [s for s in specs if s["impl"] == "cudnn" and s.get("kv_heads") and s["causal"]]


def test_the_lockstep_probe_pairs_each_fa2_miss_with_partners_that_change_one_factor():
    specs = physical.parse_grid(LOCKSTEP)
    assert {s["impl"] for s in specs} == {"flash"}
    assert len({tuple(sorted(s.items())) for s in specs}) == len(specs)
    assert all(s["batch"] * s["heads"] * s["n"] <= 3e6 for s in specs)  # _draw.py's cap on fused kernels

    def key(s, *drop):
        return tuple(sorted((k, v) for k, v in s.items() if k not in drop))

    # grid 5/6's FA-2 misses, each measured again (run-to-run spread)
    misses = [dict(impl="flash", batch=5, heads=27, n=15809, d=128, causal=False, dtype="bf16"),
              dict(impl="flash", batch=4, heads=19, n=26129, d=128, causal=False, dtype="fp16"),
              dict(impl="flash", batch=5, heads=3, n=20173, d=128, causal=True, dtype="bf16"),
              dict(impl="flash", batch=3, heads=3, n=27389, d=64, causal=True, dtype="bf16")]
    for miss in misses:
        same = [s for s in specs if key(s, "kv_heads") == key(miss)]
        assert same, miss
        # the same K/V sets with the batch folded into the heads: B = 1, H = B x H
        folded = [s for s in specs if s["batch"] == 1 and s["heads"] == miss["batch"] * miss["heads"]
                  and key(s, "batch", "heads", "kv_heads") == key(miss, "batch", "heads")]
        assert folded, miss
    # the other dtype at one unmasked and one causal miss, N a multiple of both FA-2 blocks beside a ragged N
    assert sum(1 for s in specs if s["dtype"] == "fp16" and s["n"] in (15809, 20173) and s["batch"] == 5) == 2
    assert any(s["n"] % 128 == 0 and s["n"] > 15000 and not s["causal"] for s in specs)


def test_an_attnscope_point_is_estimated_for_the_kernel_that_ran():
    # a sweep recorded while kernels/fwd.py's Hopper table was empty ran the portable kernel at a point
    # the table now gives to a Gluon variant: --from-json estimates the kernel the measurement names
    from attnscope.model import l2

    spec = {"impl": "attnscope", "batch": 1, "heads": 8, "n": 8192, "d": 128, "causal": False,
            "dtype": "bf16"}
    variant, _ = l2.kernel_of("attnscope", 128, False, "bf16", 8192)
    if variant == "attnscope portable":
        pytest.skip("kernels/fwd.py's Hopper table names no variant for bf16 d = 128 at 8k")
    portable = l2.estimate("attnscope", 8192, 128, 8, dtype="bf16", l2_bytes=50 * 2**20, sms=132,
                           attnscope_impl="portable")
    auto = l2.estimate("attnscope", 8192, 128, 8, dtype="bf16", l2_bytes=50 * 2**20, sms=132)
    assert portable.total != auto.total
    ran = physical.estimate_of(spec, 50 * 2**20, 132, ["_attnscope_fwd_kernel"])
    assert ran.total == portable.total and ran.kernels[0].name.startswith("attnscope portable")
    for names in (None, [], ["_attnscope_fwd_hopper_kernel"]):
        assert physical.estimate_of(spec, 50 * 2**20, 132, names).total == auto.total
    (row,) = physical.compare([(spec, 10**8, ["_attnscope_fwd_kernel"])], 50 * 2**20, 132)
    assert row.estimate == portable.total


def _dev_points():
    path = RECORDED / "ncu.json.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rec = json.load(f)
    return [(s,) for run in rec["runs"] for s in run["status"]]


@pytest.mark.parametrize("text, words", [
    ("impl,H,N,d\nmath,8,1024,64\n", "GRID row 2: impl: expected one of naive, flash"),
    ("impl,H,N,d\nflash,0,1024,64\n", "GRID row 2: heads: expected a positive integer"),
    ("impl,H,N,d\nflash,8,1e3,64\n", "GRID row 2: n: expected a positive integer"),
    ("impl,H,N,d\nflash,8,-5,64\n", "GRID row 2: n: expected a positive integer"),
    ("impl,H,N,d\nflash,8," + "9" * 400 + ",64\n", "GRID row 2: n: expected a positive integer"),
    ("impl,H,N,d,causal\nflash,8,64,64,maybe\n", "GRID row 2: causal: expected true or false"),
    ("impl,H,N,d,dtype\nflash,8,64,64,fp8\n", "GRID row 2: dtype: expected one of fp16, bf16"),
    ("impl,H,Hkv,N,d\nflash,8,3,64,64\n", "GRID row 2: kv_heads: expected a divisor of heads (8)"),
    ("impl,H,N,d,colour\nflash,8,64,64,red\n", "GRID row 2: expected columns impl, batch"),
    ("impl,H,N,d,h\nflash,8,64,64,8\n", "GRID row 2: expected each column once"),
    ("impl,H,N\nflash,8,64\n", "GRID row 2: d: expected a value, got none"),
    ("impl,H,N,d\nflash,8,64\n", "GRID row 2: expected 4 fields"),
    ("impl,H,N,d\n", "GRID: expected at least one point"),
    ("", "GRID: expected a header row"),
    ("impl,H,N,d\nnaive,64,1000000,128\n", "GRID row 2: n: expected the point's tensors to fit one GPU"),
    ("impl,H,N,d\n" + "flash,8,64,64\n" * 401, "GRID: expected at most 400 points"),
])
def test_bad_grids_are_one_line(tmp_path, text, words):
    p = tmp_path / "g.csv"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        physical.parse_grid(p)
    assert words in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 300


@pytest.mark.parametrize("name, content, words", [
    ("g.json", '{"points": 5}', "GRID: expected a list of points"),
    ("g.json", '[1, 2]', "GRID row 1: expected a mapping"),
    ("g.json", '[{"impl": "flash", "h": 8, "n": 64, "d": 64, "causal": "nan"}]', "causal: expected true"),
    ("g.json", '[{"impl": "flash", "h": 8, "n": 64, "d": 64, "causal": 2}]', "causal: expected true"),
    ("g.json", '[{"impl": "flash", "h": 8.5, "n": 64, "d": 64}]', "heads: expected a positive integer"),
    ("g.json", '[{"impl": "flash", "h": true, "n": 64, "d": 64}]', "heads: expected a positive integer"),
    ("g.json", "[" * 200 + "]" * 200, "GRID: expected JSON nested at most"),
    ("g.yaml", "- &a {impl: flash}\n- *a\n", "GRID: expected no YAML anchors"),
    ("g.csv", b"impl,H,N,d\nflash,8,\xff,64\n", "GRID: expected UTF-8 text"),
])
def test_hostile_grid_files(tmp_path, name, content, words):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError) as e:
        physical.parse_grid(p)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_valid_but_unmeasured_points_are_not_implemented(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("impl,H,Hkv,N,d\nnaive,8,2,64,64\n")
    with pytest.raises(NotImplementedError, match=r"GRID row 2: naive with kv_heads != heads is not"):
        physical.parse_grid(p)
    p.write_text("impl,H,N,d\nflash,8,64,96\n")
    with pytest.raises(NotImplementedError, match=r"GRID row 2: d: 96 is not measured; supported: 64, 128"):
        physical.parse_grid(p)


def _row(err, compulsory=100, credits=()):
    return physical.Row({"impl": "flash", "batch": 1, "heads": 8, "n": 1000 + int(err * 1000), "d": 64},
                        1000, int(round(1000 * (1 + err))), compulsory, credits)


def test_distribution_counts_and_worst_points():
    rows = [_row(e) for e in (0.0, 0.04, -0.05, 0.07, -0.12, 0.15, 0.3)]
    s = physical.summarize(rows, worst=3)
    assert s["count"] == 7
    assert s["within"] == {"5%": 3, "10%": 4, "15%": 6}
    assert [w["error"] for w in s["worst"]] == pytest.approx([0.3, 0.15, -0.12])
    assert s["mean_abs_error"] == pytest.approx((0 + 0.04 + 0.05 + 0.07 + 0.12 + 0.15 + 0.3) / 7)
    lines = physical.summary_lines(s)
    assert lines[0].startswith("estimate vs ncu over 7 points: ±5%: 3/7, ±10%: 4/7, ±15%: 6/7")
    assert "(+30.0%)" in lines[1] and lines[2] == "below the compulsory bytes without a stated reason: 0"


def test_distribution_flags_an_estimate_below_compulsory_without_a_reason():
    silent = _row(-0.5, compulsory=900)
    said = _row(-0.5, compulsory=900, credits=(("O still dirty", 400),))
    s = physical.summarize([silent, said])
    assert s["silently_below_compulsory"] == [silent.label()]
    assert physical.summary_lines(physical.summarize([])) == ["no measured points"]


def test_compare_uses_the_estimate_and_its_floor():
    spec = {"impl": "cudnn", "batch": 2, "heads": 6, "kv_heads": 2, "n": 1500, "d": 64, "causal": True,
            "dtype": "fp16"}
    (row,) = physical.compare([(spec, 5_000_000), (spec, 0)], 62_914_560, 132)
    from attnscope.model import l2

    e = l2.estimate("cudnn", 1500, 64, 6, 2, "fp16", True, kv_heads=2, l2_bytes=62_914_560, sms=132)
    assert (row.estimate, row.compulsory, row.measured) == (e.total, e.compulsory, 5_000_000)
    assert row.error == pytest.approx(e.total / 5_000_000 - 1) and not row.silently_below


def _sweep_file(tmp_path, points):
    data = physical.sweep_json(points, [], {"l2_bytes": 62_914_560, "sms": 132, "gpu": "NVIDIA H200"})
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps(data))
    return p


def _point(spec, read, write):
    return ncu.Point(spec, ncu.Measured([KernelBytes(1, "k", read, write)], "none", "ncu x"))


def test_from_json_reevaluates_a_recorded_sweep(tmp_path, capsys):
    a = {"impl": "flash", "batch": 1, "heads": 8, "n": 4096, "d": 128, "causal": False, "dtype": "fp16"}
    b = {**a, "impl": "naive", "causal": True}
    p = _sweep_file(tmp_path, [_point(a, 3 * 8 * 2**20, 8 * 2**20), ncu.Point(b, None, "OOM")])
    rows, env = physical.rows_from_json(p)
    assert [r.spec["impl"] for r in rows] == ["flash"] and env["gpu"] == "NVIDIA H200"
    out = tmp_path / "re.json"
    assert main(["bytes", "--from-json", str(p), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "estimate vs ncu over 1 points" in text and "flash B=1 H=8 N=4096 d=128 fp16 unmasked" in text
    saved = json.loads(out.read_text())
    assert saved["summary"]["count"] == 1 and saved["rows"][0]["measured"] == 4 * 8 * 2**20


def test_a_repeated_sweep_compares_each_point_with_its_median_run(tmp_path, capsys):
    """`bytes --sweep --repeat K` measures the grid K times: one row per point, measured = the median run
    (the lower of two: a measured value), its runs and their spread kept; without the repeat, rows stay one
    per measurement."""
    a = {"impl": "flash", "batch": 1, "heads": 8, "n": 4096, "d": 128, "causal": False, "dtype": "fp16"}
    b = {**a, "impl": "naive", "causal": True}
    mib = 2**20
    runs = [(a, 40 * mib), (b, 900 * mib), (a, 44 * mib), (b, 1000 * mib), (a, 41 * mib), (b, 950 * mib)]
    rows = physical.compare(runs, 62_914_560, 132, repeated=True)
    assert [r.spec["impl"] for r in rows] == ["flash", "naive"]  # first appearance
    assert [r.measured for r in rows] == [41 * mib, 950 * mib]  # medians
    assert rows[0].runs == (40 * mib, 44 * mib, 41 * mib) and abs(rows[0].spread - 0.1) < 1e-12
    assert rows[0].error == rows[0].estimate / (41 * mib) - 1
    assert physical.compare(runs[:4], 62_914_560, 132, repeated=True)[0].measured == 40 * mib  # median_low
    assert len(physical.compare(runs, 62_914_560, 132)) == 6  # not repeated: every measurement a row
    s = physical.summarize(rows)
    rs = s["run_spread"]
    assert s["count"] == 2 and rs["points"] == 2 and abs(rs["max"] - (1000 / 900 - 1)) < 1e-12
    assert rs["max_point"].startswith("naive") and abs(rs["median"] - (0.1 + 1000 / 900 - 1) / 2) < 1e-12
    assert rs["over"] == {"5%": 2, "10%": 1, "15%": 0}  # 10.0 % is not over 10 %, 11.1 % is
    assert any(line.startswith("run-to-run spread") and "max 11.1% (naive" in line
               for line in physical.summary_lines(s))
    assert "run_spread" not in physical.summarize(physical.compare(runs[:2], 62_914_560, 132))
    # the sweep file records the repeat, and --from-json groups by it
    points = [_point(spec, total - 8 * mib, 8 * mib) for spec, total in runs]
    data = physical.sweep_json(points, rows, {"l2_bytes": 62_914_560, "sms": 132, "repeat": 3})
    p = tmp_path / "rep.json"
    p.write_text(json.dumps(data))
    again, env = physical.rows_from_json(p)
    assert [r.measured for r in again] == [41 * mib, 950 * mib] and env["repeat"] == 3
    data["env"]["repeat"] = 0
    p.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"env.repeat: expected an integer in \[1, 5\], got 0"):
        physical.rows_from_json(p)


@pytest.mark.parametrize("content, words", [
    ('{"kind": "something else"}', "--from-json: expected a file `attnscope bytes --sweep --json` wrote"),
    ('{"kind": "attnscope-bytes-sweep", "env": {"l2_bytes": 0, "sms": 132}, "points": []}',
     "--from-json: env.l2_bytes: expected a positive integer"),
    ('{"kind": "attnscope-bytes-sweep", "env": {"l2_bytes": 1048576, "sms": 1}, "points": [{"spec": '
     '{"impl": "flash", "heads": 8, "n": 64, "d": 64}, "measured": {"total": -1}}]}',
     "measured.total: expected a byte count"),
    ('{"kind": "attnscope-bytes-sweep", "env": {"l2_bytes": 1048576, "sms": 1}, "points": [{"spec": '
     '{"impl": "x", "heads": 8, "n": 64, "d": 64}, "measured": {"total": 5}}]}',
     "--from-json point 1: impl: expected one of"),
])
def test_from_json_refuses_bad_files(tmp_path, capsys, content, words):
    p = tmp_path / "bad.json"
    p.write_text(content)
    assert main(["bytes", "--from-json", str(p)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and words in err


def test_sweep_without_a_gpu_is_one_line(tmp_path, capsys, monkeypatch):
    from attnscope.cli import gpu

    monkeypatch.setattr(gpu, "gpu_problem", lambda: "needs a CUDA GPU; none is visible")
    p = tmp_path / "g.csv"
    p.write_text(GRID)
    for argv in (["bytes", "--sweep", str(p)], ["bytes", "--calibrate"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == "attnscope bytes: error: needs a CUDA GPU; none is visible\n"
    # a bad grid is refused before the GPU is asked for
    p.write_text("impl,H,N,d\nflash,8,64\n")
    assert main(["bytes", "--sweep", str(p)]) == 2
    assert "GRID row 2: expected 4 fields" in capsys.readouterr().err
    assert main(["bytes", "--sweep", str(p), "--calibrate"]) == 2
    assert "expected one of --sweep, --from-json, --calibrate" in capsys.readouterr().err
    assert main(["bytes", "--json", "x.json"]) == 2
    assert "--json: expected no file name without --sweep" in capsys.readouterr().err


def test_measure_many_pairs_groups_and_keeps_failures(monkeypatch):
    specs = [{"impl": "flash", "heads": 1, "n": 64, "d": 64, "i": i} for i in range(5)]
    csv_text = (DATA / "ncu_handmade.csv").read_text()  # two marked calls: [gemm, softmax], [flash]
    calls = []

    def fake_run(group, cache_control="none", timeout_s=0):
        calls.append(len(group))
        if group[0]["i"] == 4:
            raise NcuError("ncu: timed out after 1 s")
        oom = "OutOfMemoryError: CUDA out of memory"
        status = [{**group[0], "ok": True, "marked": True},
                  {**group[1], "ok": False, "marked": False, "error": oom}]
        status += [{**s, "ok": True, "marked": True} for s in group[2:]]
        return csv_text, "ATTNSCOPE_STATUS " + json.dumps(status)

    monkeypatch.setattr(ncu, "run", fake_run)
    monkeypatch.setattr(ncu, "find_ncu", lambda: "ncu")
    monkeypatch.setattr(ncu, "ncu_version", lambda n: "ncu 2025")
    seen = []
    pts = ncu.measure_many(specs, per_child=4, progress=lambda done, total: seen.append((len(done), total)))
    assert calls == [4, 1] and seen == [(4, 5), (5, 5)]
    assert [p.measured.total if p.measured else p.error for p in pts] == [
        2_097_152 + 33_554_432 + 6_500_000 + 32_768_500, "OutOfMemoryError: CUDA out of memory",
        100_663_296 + 33_554_432, "no profiled kernels for this call", "ncu: timed out after 1 s"]


def test_calibration_ratios_and_slope():
    def pt(kind, size, read, write):
        return _point({"kind": kind, "bytes": size}, read, write)

    g = 2**30
    rows = physical.calibration_rows([
        pt("copy", g, g, g - 20 * 2**20), pt("copy", 4 * g, 4 * g, 4 * g - 20 * 2**20),
        pt("sum", g, int(1.02 * g), 0), ncu.Point({"kind": "fill", "bytes": g}, None, "ncu: timed out")])
    by = {(r["kind"], r["bytes"]): r for r in rows}
    assert by[("copy", g)]["ratio"] == pytest.approx((2 * g - 20 * 2**20) / (2 * g))
    assert by[("copy", "slope")]["ratio"] == pytest.approx(1.0)  # the dirty residue cancels
    assert by[("sum", g)]["ratio"] == pytest.approx(1.02) and ("sum", "slope") not in by
    assert by[("fill", g)]["error"] == "ncu: timed out"
    # a stream with no profiled kernel (copy_'s copy-engine memcpy, run 1) is an error, not a ratio of 0
    empty = ncu.Point({"kind": "copy", "bytes": g}, ncu.Measured([], "none", "ncu x"))
    assert physical.calibration_rows([empty]) == [{"kind": "copy", "bytes": g, "error": physical.NO_KERNEL}]
    assert ncu.exact_bytes({"kind": "copy", "bytes": 8}) == (8, 8)
    assert ncu.exact_bytes({"kind": "sum", "bytes": 8}) == (8, 0)
    with pytest.raises(ValueError, match=r"kind: expected one of copy, sum, fill, got 'move'"):
        ncu.exact_bytes({"kind": "move", "bytes": 8})
    with pytest.raises(ValueError, match=r"bytes: expected a positive multiple of 4, got 6"):
        ncu.exact_bytes({"kind": "sum", "bytes": 6})
    assert [(s["kind"], s["bytes"]) for s in physical.CALIBRATION] == [
        (k, s * g) for k in ("copy", "sum", "fill") for s in (1, 4)]


def test_sweep_end_to_end_with_a_stand_in_for_ncu(tmp_path, capsys, monkeypatch):
    from attnscope.cli import gpu

    monkeypatch.setattr(gpu, "gpu_problem", lambda: None)
    grid = tmp_path / "g.csv"
    grid.write_text("impl,B,H,N,d,causal\nflash,1,8,4096,128,false\ncudnn,2,3,999,64,true\n")
    written = []

    def fake_many(specs, cache_control="none", per_child=8, timeout_s=None, progress=None,
                  **kw):
        pts = [_point(specs[0], 3 * 8 * 2**20, 8 * 2**20), ncu.Point(specs[1], None, "RuntimeError: refused")]
        progress(pts[:1], 2)
        written.append(json.loads((tmp_path / "s.json").read_text()))  # the partial file, after group 1
        progress(pts, 2)
        return pts

    monkeypatch.setattr(ncu, "measure_many", fake_many)
    out = tmp_path / "s.json"
    argv = ["bytes", "--sweep", str(grid), "--l2-bytes", "62914560", "--sms", "132", "--json", str(out)]
    assert main(argv) == 1  # a point could not be measured
    text = capsys.readouterr().out
    assert "estimate vs ncu over 1 points" in text
    assert "not measured: cudnn B=2 H=3 N=999 d=64 fp16 causal: RuntimeError: refused" in text
    assert written[0]["env"]["partial"] == "1/2"
    saved = json.loads(out.read_text())
    assert [p["error"] for p in saved["points"]] == [None, "RuntimeError: refused"]
    assert saved["summary"]["count"] == 1 and "partial" not in saved["env"]
    rows, _ = physical.rows_from_json(out)  # and it reads back
    assert rows[0].measured == 4 * 8 * 2**20
    argv = ["bytes", "--sweep", str(grid), "--per-child", "0", "--l2-bytes", "1048576", "--sms", "1"]
    assert main(argv) == 2
    assert "--per-child: expected a positive integer, got 0" in capsys.readouterr().err


def test_calibrate_end_to_end_with_a_stand_in_for_ncu(tmp_path, capsys, monkeypatch):
    from attnscope.cli import gpu

    monkeypatch.setattr(gpu, "gpu_problem", lambda: None)

    def fake_many(specs, **kw):
        assert specs == list(physical.CALIBRATION)
        return [_point(s, *(int(0.98 * x) for x in ncu.exact_bytes(s))) for s in specs]

    monkeypatch.setattr(ncu, "measure_many", fake_many)
    out = tmp_path / "c.json"
    assert main(["bytes", "--calibrate", "--l2-bytes", "62914560", "--sms", "132", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "counter / exact" in text and "0.9800" in text
    saved = json.loads(out.read_text())
    assert saved["kind"] == "attnscope-bytes-calibration"
    assert {r["bytes"] for r in saved["rows"] if r["kind"] == "copy"} == {2**30, 4 * 2**30, "slope"}
