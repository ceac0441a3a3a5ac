"""cli/gpu.py: `which`, `bytes`, `share`, `bench` without a GPU, and `bytes --estimate-only` (CPU)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnscope.cli import main


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


no_gpu = pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU message")


@no_gpu
@pytest.mark.parametrize("argv", [["which"], ["which", "--backend", "math", "--causal"], ["bytes"],
                                  ["bytes", "--impl", "naive"], ["share"],
                                  ["share", "--attention", "naive", "--project-to", "attnscope"], ["bench"]])
def test_without_a_gpu_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"attnscope {argv[0]}: error: ")
    assert "CUDA" in lines[0] or "torch" in lines[0]


def test_bytes_estimate_only_json(capsys):
    from attnscope.model.l2 import estimate

    assert main(["bytes", "--estimate-only", "--impl", "naive", "--heads", "1", "--l2-bytes", "60000000",
                 "--sms", "132", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["logical"] == 138_412_032  # spec §1.1, one head
    assert out["measured"] is None
    assert out["estimate"]["total"] == estimate("naive", 4096, 128, 1, l2_bytes=60_000_000, sms=132).total
    assert out["params"]["l2_bytes"] == 60_000_000


def test_bytes_estimate_only_table(capsys):
    assert main(["bytes", "--estimate-only", "--impl", "flash", "--causal", "--n", "2048"]) == 0
    out = capsys.readouterr().out
    assert "logical model" in out and "physical estimate" in out and "measured" in out  # column "vs measured"
    assert "flash, [1, 32, 2048, 128] fp16, causal" in out


def test_bytes_estimate_only_takes_kv_heads_as_a_sweep_point_does(capsys, tmp_path):
    # GQA/MQA through the one-call command: the same estimate a --sweep point with that Hkv gets (grid 18's
    # cuDNN MQA point), and it differs from the MHA one
    from attnscope.measure import physical
    from attnscope.model.l2 import estimate

    argv = ["bytes", "--estimate-only", "--impl", "cudnn", "--n", "1812", "--heads", "17", "--batch", "4",
            "--dtype", "bf16", "--json"]
    assert main([*argv, "--kv-heads", "1"]) == 0
    gqa = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    mha = json.loads(capsys.readouterr().out)
    grid = tmp_path / "g.csv"
    grid.write_text("impl,B,H,Hkv,N,d,causal,dtype\ncudnn,4,17,1,1812,128,false,bf16\n")
    spec, = physical.parse_grid(grid)
    point = physical.estimate_of(spec, 62_914_560, 132)
    assert gqa["params"]["kv_heads"] == 1 and mha["params"]["kv_heads"] == 17
    assert gqa["estimate"]["total"] == point.total == estimate(
        "cudnn", 1812, 128, 17, 4, "bf16", kv_heads=1, l2_bytes=62_914_560, sms=132).total
    assert gqa["estimate"]["total"] < mha["estimate"]["total"]
    assert main(["bytes", "--estimate-only", "--heads", "8", "--kv-heads", "2"]) == 0
    assert "flash, [1, 8/2, 4096, 128] fp16, unmasked" in capsys.readouterr().out


def test_bytes_refuses_bad_input(capsys):
    assert main(["bytes", "--estimate-only", "--heads", "0"]) == 2
    assert "attnscope bytes: error: --heads: expected a positive integer, got 0" in capsys.readouterr().err


def test_share_project_to_itself_is_refused(capsys):
    assert main(["share", "--attention", "flash", "--project-to", "flash"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("attnscope share: error: --project-to: expected an attention other than --attention "
                   "(flash), got 'flash'")


def test_unknown_backend_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["which", "--backend", "fast"])
    assert e.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_parser_builds_without_torch():
    code = ("import sys; from attnscope.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def test_bench_from_json_needs_no_gpu_and_redraws_plots(tmp_path, capsys):
    """`attnscope bench --from-json` prints a recorded run and draws its plots on a CPU."""
    prefill = RESULTS / "h200-2026-11-29-prefill.json"
    rc = main(["bench", "--from-json", str(prefill), "--plots", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "bfloat16 d=128 causal=1 N=16384 B= 1 | attnscope=535.5" in out  # the recorded number
    assert " TFLOP/s | /cudnn=" in out  # with its unit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prefill_roofline.png", "prefill_tflops.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in tmp_path.iterdir())
    decode = RESULTS / "h200-2026-11-30-decode.json"
    rc = main(["bench", "--from-json", str(decode), "--plots", str(tmp_path)])
    assert rc == 0 and (tmp_path / "decode_tbs.png").exists()
    out = capsys.readouterr().out
    assert re.search(r"decode B= 1 Hq=32 Hkv= 8 L=  4096 KV= +[0-9.]+ MiB \| graph: attnscope=1\.94", out)
    assert "TB/s" in out  # recorded, with its unit


def test_bench_from_json_bad_file(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert main(["bench", "--from-json", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--from-json: expected a result with 'prefill' or 'decode' rows, got list" in err
    assert main(["bench", "--from-json", str(tmp_path / "missing.json")]) == 2
    assert "--from-json: expected a readable file" in capsys.readouterr().err


# --- the GPU paths, with the measurement replaced by recorded-shape stand-ins ---------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    from attnscope.cli import gpu

    monkeypatch.setattr(gpu, "gpu_problem", lambda: None)


@pytest.mark.parametrize("asked, ran, code", [("flash", "flash", 0), ("flash", "math", 1),
                                              ("auto", "cudnn", 0)])
def test_which_output_and_exit_code(fake_gpu, monkeypatch, capsys, asked, ran, code):
    from attnscope.measure import backends

    def fake_which(backend, n, d, heads, batch, dtype, causal):
        ks = [backends.KernelEvent("void pytorch_flash::flash_fwd_kernel<...>", 0.0, 812.5)]
        return backends.WhichResult(backend, ran, backend == "auto" or ran == backend,
                                    {"n": n, "d": d, "heads": heads}, ks)

    monkeypatch.setattr(backends, "which", fake_which)
    assert main(["which", "--backend", asked, "--causal"]) == code
    out = capsys.readouterr().out
    assert f"asked: {asked}   ran: {ran}" in out
    assert "[1, 32, 4096, 128] fp16, causal" in out and "812.5" in out
    assert ("NOT the backend asked for" in out) == (code == 1)


def test_which_refused_input(fake_gpu, monkeypatch, capsys):
    from attnscope.measure import backends

    monkeypatch.setattr(backends, "which", lambda *a: backends.WhichResult(
        "flash", "none", False, {}, [], "No available kernel. Aborting execution."))
    assert main(["which", "--backend", "flash", "--d", "512"]) == 1
    out = capsys.readouterr().out
    assert "flash refused this input: No available kernel. Aborting execution." in out


def test_bytes_with_a_measurement(fake_gpu, monkeypatch, capsys):
    from pathlib import Path

    from attnscope.measure import ncu

    csv = (Path(__file__).parent / "data" / "measure" / "ncu_handmade.csv").read_text()
    flash_call = ncu.split_at_markers(ncu.parse_csv(csv))[1]  # read 96 MiB, write 32 MiB
    monkeypatch.setattr(ncu, "measure", lambda *a, **k: ncu.Measured(flash_call, "none", "ncu 2025.3"))
    assert main(["bytes", "--impl", "flash", "--l2-bytes", "60000000", "--sms", "132", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"]["total"] == 128 * 2**20
    assert out["estimate_error"] == pytest.approx(out["estimate"]["total"] / (128 * 2**20) - 1)
    assert main(["bytes", "--impl", "flash", "--l2-bytes", "60000000", "--sms", "132"]) == 0
    text = capsys.readouterr().out
    assert "measured (ncu, cache-control none)" in text and "ncu 2025.3" in text


def test_bytes_ncu_missing_is_one_line(fake_gpu, monkeypatch, capsys):
    from attnscope.measure import ncu

    def missing(*a, **k):
        raise ncu.NcuError("ncu (Nsight Compute CLI) not found on PATH or in $CUDA_HOME/bin")

    monkeypatch.setattr(ncu, "measure", missing)
    assert main(["bytes", "--l2-bytes", "60000000", "--sms", "132"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "attnscope bytes: error: ncu (Nsight Compute CLI) not found on PATH or in " \
                                "$CUDA_HOME/bin\n"


def test_share_and_closed_loop_output(fake_gpu, monkeypatch, capsys):
    from attnscope.measure import share

    r = share.ShareResult("naive", 4096, 2, 40.0, 100.0, 0.0645, 50, [("softmax_warp_forward", 12.0, True)])
    monkeypatch.setattr(share, "measure_share", lambda *a, **k: r)
    assert main(["share", "--attention", "naive"]) == 0
    out = capsys.readouterr().out
    assert "f_time = 40.000 ms attention / 100.000 ms of kernels = 0.400" in out and "FLOP share 0.065" in out
    loop = share.ClosedLoop("naive", "attnscope", 4096, 2, 0.40, {"naive": 3.0, "attnscope": 1.0},
                            {"naive": 100.0, "attnscope": 80.0}, r)
    monkeypatch.setattr(share, "closed_loop", lambda *a, **k: loop)
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    out = capsys.readouterr().out
    assert "1.364x" in out and "1.250x" in out and "+9.1%" in out  # 1.3636 / 1.25 - 1
    assert "S in the prefill" not in out  # without the candidate's profile: no split
    cand = share.ShareResult("attnscope", 4096, 2, 16.0, 70.0, 0.0645, 40)
    loop.candidate_share = cand
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    out = capsys.readouterr().out
    assert "40.000 / 16.000" in out and "2.500x" in out  # attention in the step, S in it: 40 / 16
    assert "1.316x" in out and "60.000 / 54.000" in out  # Amdahl with it: 1 / (0.6 + 0.4 / 2.5); the rest
    assert "0.000 / 10.000" in out and "graph" not in out  # GPU idle: 100 - 100, 80 - 70; no replays
    assert "sustained" not in out
    loop.sustained_ms = {"naive": 104.0, "attnscope": 86.0}
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    out = capsys.readouterr().out
    assert "104.000 / 86.000" in out and "1.209x" in out and "+12.8%" in out  # 1.3636 / (104 / 86) - 1
    assert "host-aware" not in out
    loop.host_us, loop.issue_ms = {"naive": 30.0, "attnscope": 40.0}, {"naive": 5.0, "attnscope": 5.1}
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    out = capsys.readouterr().out
    assert "30.0 / 40.0" in out and "5.000 / 5.100" in out  # device-bound (100 ms of kernels): Amdahl again
    assert "error, host-aware" in out and "1.364x" in out
    loop.graph_ms = {"naive": 99.0, "attnscope": 72.0}
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    out = capsys.readouterr().out
    assert "99.000 / 72.000" in out and "1.375x" in out and "-0.8%" in out  # 1.3636 / 1.375 - 1
    assert "S_kernel on kernel time" not in out
    loop.kernel_busy_ms = {"naive": 2.8, "attnscope": 0.0}  # no candidate kernel in its profile: no rows
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    assert "S_kernel on kernel time" not in capsys.readouterr().out
    loop.kernel_busy_ms = {"naive": 2.8, "attnscope": 0.7}  # alone on kernel time: S = 4, Amdahl 1.4286
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    out = capsys.readouterr().out
    assert "2.800 / 0.700" in out and "4.000x" in out and "1.429x" in out
    assert "+14.3%" in out and "+3.9%" in out  # 1.4286 / 1.25 - 1, and against the replays' 1.375
    loop.graph_ms, loop.graph_note = None, "capture failed: RuntimeError: operation not permitted"
    assert main(["share", "--attention", "naive", "--project-to", "attnscope"]) == 0
    assert "capture failed: RuntimeError: operation not permitted" in capsys.readouterr().out


def test_runtime_failure_is_one_line_exit_1(fake_gpu, monkeypatch, capsys):
    from attnscope.measure import share

    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB\nmore detail")

    monkeypatch.setattr(share, "measure_share", oom)
    assert main(["share", "--prefill", "65536"]) == 1
    assert capsys.readouterr().err == "attnscope share: error: RuntimeError: CUDA out of memory. Tried to " \
                                      "allocate 16.00 GiB\n"


# --- the sweep's progress (measure/bench.py, rich.progress) ----------------------------------------------
@pytest.mark.parametrize("argv, total", [(["--kind", "all"], 2 * 2 * 6 + 2 + 12),
                                         (["--kind", "decode", "--quick"], 4),
                                         (["--kind", "prefill", "--d", "128", "--n", "4096"], 2 + 2)])
def test_bench_run_counts_every_point_of_the_sweep(monkeypatch, capsys, argv, total):
    # run() sizes the bar from its arguments; each sweep steps it once per point it measures
    import argparse

    from attnscope.measure import bench

    seen = []

    def fake_prefill(torch, ns, ds, tokens, heads, naive=True, dtypes=None, log=print, progress=None):
        for _ in range(len(ns) * len(ds) * 2 * len(dtypes or [None])):
            progress.step()
        seen.append(progress)
        return []

    def fake_decode(torch, grid, ls, log=print, progress=None):
        for _ in range(len(grid) * len(ls)):
            progress.step()
        seen.append(progress)
        return []

    monkeypatch.setattr(bench, "require_cuda", lambda: argparse.Namespace(float16="fp16"))
    monkeypatch.setattr(bench, "environment", lambda torch: {})
    monkeypatch.setattr(bench, "read_ceiling", lambda torch: 4.0)
    monkeypatch.setattr(bench, "prefill_sweep", fake_prefill)
    monkeypatch.setattr(bench, "decode_sweep", fake_decode)
    from attnscope.cli import build_parser

    assert bench.run(build_parser().parse_args(["bench", *argv])) == 0
    assert seen and seen[-1].total == total and seen[-1].done == total


def test_bytes_window_estimate_only_is_the_window_familys_row(capsys):
    from attnscope.measure import families
    from attnscope.model import window_estimate as we

    argv = ["bytes", "--estimate-only", "--impl", "attnscope", "--n", "8192", "--heads", "16", "--kv-heads",
            "4", "--batch", "2", "--causal", "--dtype", "bf16", "--window", "1024,9", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spec"]["window"] == [1024, 0] and out["measured"] is None  # causal: R = 0
    est = we.window_estimate("attnscope", 8192, window=(1024, 0), causal=True, d=128, dtype="bf16", batch=2,
                             heads=16, kv_heads=4)
    assert out["estimate"] == est.total and out["compulsory"] == est.compulsory
    assert out["logical"] == families.ledger(out["spec"])[0] and "64 x 64" not in out["ledger"]
    assert main(["bytes", "--estimate-only", "--impl", "flex", "--n", "4096", "--d", "64",
                 "--window=-1,300"]) == 0
    text = capsys.readouterr().out
    assert "window flex H=32 d=64 fp16 B=1 N=4096 window -1:300" in text and "block_mask:" in text


@pytest.mark.parametrize("argv,err", [
    (["--impl", "flex"], "--window: expected L,R with --impl flex"),
    (["--impl", "flash", "--window", "8,8"],
     "--impl: expected one of attnscope, flex with pass window, got 'flash'"),
    (["--impl", "attnscope", "--window=-1,-1"], "--window: expected a window bounding at least one side"),
    (["--impl", "attnscope", "--d", "96", "--window", "8,0"],
     "--d: 96 is not measured; supported: 64, 128"),
    (["--sweep", "bench/grids/heldout_window.csv", "--window", "3,3"],
     "--window: expected none with --sweep"),
    (["--cache-lens", "4096", "--window=-1,0"], "--window: expected L,R with L >= 0 (decode is causal"),
])
def test_bytes_window_refuses_in_one_line(argv, err, capsys):
    assert main(["bytes", "--estimate-only", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"attnscope bytes: error: {err}"), lines


def test_bytes_decode_window_counts_the_windows_keys(capsys):
    from attnscope.model import family_estimate as fe
    from attnscope.model.serving import paged

    argv = ["bytes", "--estimate-only", "--cache-lens", "32768,1000", "--kv-heads", "8", "--dtype", "bf16",
            "--splits", "4", "--window", "4096,0", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    g = paged([32768, 1000], None, d=128, dtype="bf16", heads=32, kv_heads=8, num_splits=4, window=(4096, 0))
    assert out["ceiling_s"] * out["hbm_bytes_per_s"] == pytest.approx(g.row.total)
    est = out["dram_estimate"]["estimate"]
    assert est["compulsory"] == fe.decode_compulsory([32768, 1000], d=128, dtype="bf16", heads=32, kv_heads=8,
                                                     window=(4096, 0))
    assert "window_edge" in {t["name"] for t in est["terms"]}


def test_bytes_window_with_a_measurement(fake_gpu, monkeypatch, capsys):
    from attnscope.measure import ncu

    csv = (Path(__file__).parent / "data" / "measure" / "ncu_handmade.csv").read_text()
    call = ncu.split_at_markers(ncu.parse_csv(csv))[1]  # read 96 MiB, write 32 MiB
    seen = []
    monkeypatch.setattr(ncu, "measure_spec",
                        lambda spec, **k: seen.append(spec) or ncu.Measured(call, "none"))
    assert main(["bytes", "--impl", "attnscope", "--window", "256,256", "--l2-bytes", "60000000", "--sms",
                 "132", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert seen == [out["spec"]] and seen[0]["pass"] == "window"
    assert out["measured"]["total"] == 128 * 2**20
    assert out["estimate_error"] == pytest.approx(out["estimate"] / (128 * 2**20) - 1)
    assert out["env"] == {"l2_bytes": 60_000_000, "sms": 132}


def test_bytes_window_and_family_estimates_import_neither_torch_nor_triton():
    code = ("import sys, attnscope.cli\n"
            "a = attnscope.cli.main(['bytes', '--estimate-only', '--impl', 'attnscope',\n"
            "                        '--window', '512,0', '--causal', '--json'])\n"
            "b = attnscope.cli.main(['bytes', '--estimate-only', '--json', '-',\n"
            "                        '--sweep', 'bench/grids/heldout_window.csv'])\n"
            "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')), a, b)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "HEAVY [] 0 0"


@pytest.mark.parametrize("argv, row", [
    (["--family", "backward", "--impl", "attnscope", "--n", "4096", "--causal", "--heads", "16", "--kv-heads",
      "4", "--deterministic", "--window", "512,0"],
     "pass,impl,heads,kv_heads,n,d,causal,deterministic,window\nbackward,attnscope,16,4,4096,128,1,1,512:0\n"),
    (["--family", "backward", "--impl", "cudnn", "--n", "2048", "--heads", "8", "--d", "64"],
     "pass,impl,heads,n,d\nbackward,cudnn,8,2048,64\n"),
    (["--family", "varlen", "--impl", "flex", "--lengths", "1000,300", "--heads", "8", "--kv-heads", "2",
      "--causal"], "pass,impl,heads,kv_heads,d,causal,lens\nvarlen,flex,8,2,128,1,1000;300\n"),
    (["--family", "varlen", "--impl", "attnscope", "--lengths", "700,64,2000", "--window", "100,100",
      "--dtype", "bf16"],
     "pass,impl,heads,d,dtype,lens,window\nvarlen,attnscope,32,128,bf16,700;64;2000,100:100\n"),
])
def test_bytes_family_point_is_its_sweep_row(argv, row, capsys):
    """`bytes --family F` (one backward or varlen point, windowed or not) reports what the same grid row
    gets from the sweep: its spec, ledger, compulsory bytes and estimate."""
    from attnscope.measure import families, physical

    assert main(["bytes", "--estimate-only", *argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (spec,) = physical.parse_grid("g.csv", text=row)
    r = families.row(spec, [1])
    assert out["spec"] == spec
    assert (out["logical"], out["compulsory"], out["estimate"]) == (r.logical, r.compulsory, r.estimate)
    assert main(["bytes", "--estimate-only", *argv]) == 0
    assert families.ESTIMATES[spec["pass"]] in capsys.readouterr().out


@pytest.mark.parametrize("argv, err", [
    (["--lengths", "100"], "--lengths: expected to come with --family varlen"),
    (["--deterministic"], "--deterministic: expected to come with --family backward"),
    (["--kernels", "auto"], "--kernels: expected to come with --family backward"),
    (["--family", "varlen", "--impl", "attnscope"], "--lengths: expected a value, got none"),
    (["--family", "varlen", "--impl", "attnscope", "--lengths", "100", "--n", "50"],
     "--n: expected no value with pass varlen"),
    (["--family", "backward", "--impl", "flash", "--deterministic"],
     "--deterministic: true with impl flash is not measured"),
    (["--family", "backward", "--sweep", "bench/grids/heldout_backward4.csv"],
     "--family: expected none with"),
    # once ignored: --cache-lens is the decode's ledger, a grid's rows name their own shapes
    (["--cache-lens", "100", "--family", "varlen"],
     "--family: expected none with --cache-lens, got 'varlen'"),
    (["--cache-lens", "100", "--lengths", "4"], "--lengths: expected none with --cache-lens, got '4'"),
    (["--cache-lens", "100", "--deterministic"], "--deterministic: expected none with --cache-lens"),
    (["--cache-lens", "100", "--kernels", "auto"], "--kernels: expected none with --cache-lens"),
    (["--sweep", "bench/grids/heldout_backward4.csv", "--n", "5"], "--n: expected none with --sweep"),
    (["--sweep", "bench/grids/heldout_backward4.csv", "--causal"], "--causal: expected none with --sweep"),
    (["--sweep", "bench/grids/heldout_backward4.csv", "--heads", "8"], "--heads: expected none with --sweep"),
    (["--sweep", "bench/grids/heldout_window.csv", "--impl", "flex"],
     "--impl: expected none with --sweep, --from-json or --calibrate (a grid row names its own), got 'flex'"),
    # once taken as --heads (the grid's "unset"), as no other bytes command takes it
    (["--family", "backward", "--impl", "attnscope", "--kv-heads", "0"],
     "--kv-heads: expected a positive integer"),
    (["--impl", "attnscope", "--window", "8,8", "--kv-heads", "0"],
     "--kv-heads: expected a positive integer"),
    # once named --impl flex for a --family window given with --impl attnscope
    (["--family", "window", "--impl", "attnscope"], "--window: expected L,R with --family window, got None"),
    # --lengths reads as `traffic --lengths` does (its message once showed ';;' for ',,')
    (["--family", "varlen", "--impl", "attnscope", "--lengths", ",,"],
     "--lengths: expected comma-separated integers, got ',,'"),
    (["--family", "varlen", "--impl", "attnscope", "--lengths", "1;2"],
     "--lengths: expected comma-separated integers, got '1;2'"),
    (["--family", "varlen", "--impl", "attnscope", "--lengths", "0,5"],
     "--lengths: expected a positive integer up to 10^9, got 0"),
])
def test_bytes_family_flags_refused_in_one_line(argv, err, capsys):
    assert main(["bytes", "--estimate-only", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"attnscope bytes: error: {err}"), lines
