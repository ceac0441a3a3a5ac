"""measure/ncu.py: the command line, CSV parsing, splitting at markers, and the one-line errors (CPU)."""

import gzip
import json
import os
from pathlib import Path

import pytest

from attnscope.measure import ncu
from attnscope.measure.ncu import KernelBytes, NcuError, parse_csv, split_at_markers

DATA = Path(__file__).parent / "data" / "measure"
RECORDED = DATA / "recorded"


def test_command_line():
    cmd = ncu.ncu_command(["python", "-m", "x"], "/tmp/log.csv", ncu="/opt/ncu")
    assert cmd[0] == "/opt/ncu" and cmd[-3:] == ["python", "-m", "x"]
    s = " ".join(cmd)
    assert "--metrics dram__bytes_read.sum,dram__bytes_write.sum" in s
    assert "--clock-control none" in s and "--profile-from-start off" in s and "--csv" in s
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
