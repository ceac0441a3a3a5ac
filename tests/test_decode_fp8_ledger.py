"""The decode ledger with an FP8 (e4m3) KV cache (`model.serving.paged(kv_dtype="fp8")`) and `attnscope
traffic --cache-lens ... --kv-dtype fp8`: K/V at one byte per element plus one fp32 K and V scale per
program; everything else as at the queries' dtype. The same ledger in `bytes --estimate-only --cache-lens`
and, per decode step of a trace (`model.serving.decode_step`), in the report. Pure Python (no torch)."""

from __future__ import annotations

import json

import pytest
import yaml

from attnscope.cli import main
from attnscope.model import roofline
from attnscope.model import serving as sv
from attnscope.report.default_trace import DEFAULT_TRACE_YAML


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("page_size, splits", [(16, 1), (None, 4)])
def test_fp8_halves_the_kv_lines_and_adds_the_scales(page_size, splits):
    lens, kw = [4096, 100, 17], dict(heads=32, kv_heads=8, num_splits=splits, dtype="bf16", d=128)
    bf16 = sv.paged(lens, page_size, **kw)
    fp8 = sv.paged(lens, page_size, kv_dtype="fp8", **kw)
    same = sv.paged(lens, page_size, kv_dtype="bf16", **kw)
    assert same.row.total == bf16.row.total and same.tail == bf16.tail

    def line(g, name):
        return sum(t.nbytes for k in g.row.kernels for t in k.transfers if t.tensor == name)

    keys = sum(lens)
    assert line(fp8, "K") == line(fp8, "V") == 8 * keys * 128 * 1  # Hkv * keys * d, one byte each
    assert line(bf16, "K") == 2 * line(fp8, "K")
    scales = 3 * 8 * splits * 2 * 4  # one fp32 K and V scale per (sequence, kv head, split) program
    assert line(fp8, "k_scale, v_scale") == scales and line(bf16, "k_scale, v_scale") == 0
    assert bf16.row.total - fp8.row.total == line(bf16, "K") - scales
    assert fp8.tail * 2 == bf16.tail
    assert fp8.to_json()["params"]["kv_dtype"] == "fp8"


@pytest.mark.parametrize("kv_dtype, msg", [("fp32", "kv_dtype: expected one of"),
                                           ("fp16", r"kv_dtype: expected bf16 \(as dtype\) or fp8")])
def test_fp8_ledger_refuses_other_kv_dtypes(kv_dtype, msg):
    with pytest.raises(ValueError, match=msg):
        sv.paged([100], 16, dtype="bf16", kv_dtype=kv_dtype)


def test_cli_kv_dtype(capsys):
    argv = ["traffic", "--cache-lens", "100,4000", "--page-size", "16", "--heads", "32", "--kv-heads", "8",
            "--dtype", "bf16", "--kv-dtype", "fp8"]
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    g = sv.paged([100, 4000], 16, heads=32, kv_heads=8, dtype="bf16", kv_dtype="fp8", block_kv=64)
    j = json.loads(out)
    assert j["rows"][0]["total"] == g.row.total and j["params"]["kv_dtype"] == "fp8"
    rc, out, _ = _run(capsys, *argv)
    assert rc == 0 and f"{g.row.total:,}" in out and "K/V fp8" in out and "k_scale" in out
    for bad, msg in ((["--kv-dtype", "fp8"], "--kv-dtype: expected to come with --lengths or --cache-lens"),
                     (["--lengths", "3", "--kv-dtype", "fp8"],
                      "--kv-dtype: expected only with --cache-lens")):
        rc, out, err = _run(capsys, "traffic", *bad)
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("kv_dtype", [None, "fp8"])
def test_decode_step_is_the_mean_over_the_steps(kv_dtype):
    """The closed form (first and last step) equals the mean of every step's ledger, times B and layers."""
    batch, prompt, output, layers = 3, 97, 7, 2
    kw = dict(heads=8, kv_heads=2, d=64, dtype="bf16", kv_dtype=kv_dtype)
    steps = [sv.paged([prompt + t] * batch, **kw).row.total for t in range(1, output)]  # the 6 decode steps
    got = sv.decode_step(batch, prompt, output, layers=layers, device="h100", **kw)
    assert got.nbytes == layers * sum(steps) / len(steps)
    assert got.ceiling_s == got.nbytes / roofline.device("h100").hbm
    assert got.kv_dtype == (kv_dtype or "bf16")
    with pytest.raises(ValueError, match="output: expected at least 2 tokens"):
        sv.decode_step(batch, prompt, 1, layers=layers, **kw)


def test_bytes_estimate_only_takes_the_cache_ledger(capsys):
    argv = ["bytes", "--estimate-only", "--cache-lens", "100,4000", "--page-size", "16", "--heads", "32",
            "--kv-heads", "8", "--dtype", "bf16", "--device", "h100"]
    kw = dict(heads=32, kv_heads=8, dtype="bf16")
    fp8, bf16 = (sv.paged([100, 4000], 16, kv_dtype=k, **kw) for k in ("fp8", None))
    rc, out, err = _run(capsys, *argv, "--kv-dtype", "fp8", "--json")
    assert rc == 0, err
    j = json.loads(out)
    hbm = roofline.device("h100").hbm
    assert j["rows"][0]["total"] == fp8.row.total and j["params"]["kv_dtype"] == "fp8"
    assert j["ceiling_s"] == fp8.row.total / hbm
    assert j["vs_kv_dtype"] == {"kv_dtype": "bf16", "total": bf16.row.total,
                                "ceiling_s": bf16.row.total / hbm}
    rc, out, _ = _run(capsys, *argv, "--json")  # the queries' dtype: no comparison
    assert rc == 0 and json.loads(out)["rows"][0]["total"] == bf16.row.total and "vs_kv_dtype" not in out
    rc, out, _ = _run(capsys, *argv, "--kv-dtype", "fp8")
    saved = bf16.row.total - fp8.row.total
    assert rc == 0 and f"{fp8.row.total:,}" in out and "k_scale" in out
    assert f"fp8 saves {saved:,} B" in out and f"{saved / hbm * 1e6:,.2f} µs per call" in out


@pytest.mark.parametrize("argv, msg", [
    (["--cache-lens", "100"], "--cache-lens: ncu measurement of a decode call is not supported"),
    (["--estimate-only", "--cache-lens", "100", "--n", "8"], "--n: expected none with --cache-lens"),
    (["--estimate-only", "--cache-lens", "100", "--causal"], "--causal: expected none with --cache-lens"),
    (["--estimate-only", "--cache-lens", "100", "--sms", "100"], "--sms: expected none with --cache-lens"),
    (["--estimate-only", "--kv-dtype", "fp8"], "--kv-dtype: expected to come with --cache-lens"),
    (["--estimate-only", "--splits", "2"], "--splits: expected to come with --cache-lens"),
    (["--estimate-only", "--cache-lens", "100", "--kv-dtype", "fp16", "--dtype", "bf16"],
     "--kv-dtype: expected bf16 (as dtype) or fp8"),
])
def test_bytes_cache_flags_refused_by_name(capsys, argv, msg):
    rc, out, err = _run(capsys, "bytes", *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def _trace(tmp_path, **workload):
    data = yaml.safe_load(DEFAULT_TRACE_YAML)
    data["workload"].update(workload)
    p = tmp_path / "trace.yaml"
    p.write_text(yaml.safe_dump(data, allow_unicode=True))
    return p


def test_report_says_what_an_fp8_cache_saves(tmp_path, capsys):
    p = _trace(tmp_path, dtype="bf16", kv_heads=8, device="h100", prompt_tokens=8000, output_tokens=301)
    rc, out, err = _run(capsys, "report", str(p), "--out", str(tmp_path / "r"), "--json", "--format", "md")
    assert rc == 0, err
    d = json.loads(out)["fp8_kv"]
    kw = dict(layers=32, heads=32, kv_heads=8, d=128, dtype="bf16", device="h100")
    base, fp8 = (sv.decode_step(8, 8000, 301, kv_dtype=k, **kw) for k in ("bf16", "fp8"))
    assert d["base"] == base.to_json() and d["fp8"] == fp8.to_json() and d["device"] == "h100"
    assert 0.49 < fp8.nbytes / base.nbytes < 0.51  # K/V dominate: half the bytes, plus Q, O and scales
    assert d["saved_ms"] == pytest.approx((base.ceiling_s - fp8.ceiling_s) * 1e3)
    md = (tmp_path / "r" / "report.md").read_text()
    line = next(x for x in md.splitlines() if "FP8 KV cache" in x)
    assert f"{base.nbytes / 2**30:,.2f} → {fp8.nbytes / 2**30:,.2f} GiB" in line
    assert f"{base.ceiling_s * 1e3:,.2f} → {fp8.ceiling_s * 1e3:,.2f} ms at the H100's 3.35 TB/s" in line
    assert "mean cache 8,150.5" in line and "of the 32.0 ms TPOT" in line


@pytest.mark.parametrize("workload, expect", [
    ({"dtype": "int4"}, "FP8 KV cache: not modelled for workload dtype 'int4'"),
    ({"output_tokens": 1}, "FP8 KV cache: no decode step to model"),
])
def test_report_fp8_line_says_when_the_model_does_not_apply(tmp_path, capsys, workload, expect):
    rc, out, err = _run(capsys, "report", str(_trace(tmp_path, **workload)), "--out", str(tmp_path / "r"),
                        "--json", "--format", "md")
    assert rc == 0 and json.loads(out)["fp8_kv"] is None, err
    assert expect in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize("workload, msg", [
    ({"kv_heads": 5}, "workload.kv_heads: expected a divisor of heads (32), got 5"),
    ({"kv_heads": 0}, "workload.kv_heads: expected a positive integer"),
    ({"device": "b200"}, "workload.device: expected one of a100, h100, h200, got 'b200'"),
    ({"window_layers": 4}, "workload.window_layers: expected none without workload.sliding_window, got 4"),
    ({"sliding_window": 64, "window_layers": 40},
     "workload.window_layers: expected at most workload.layers (32)"),
    ({"sliding_window": 0}, "workload.sliding_window: expected a positive integer"),
])
def test_report_workload_kv_fields_refused_by_name(tmp_path, capsys, workload, msg):
    rc, out, err = _run(capsys, "report", str(_trace(tmp_path, **workload)), "--out", str(tmp_path / "r"))
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_windowed_decode_step_is_the_exact_mean_over_the_steps():
    """A window on some layers: those layers' mean over the steps is their ledgers' exact mean (the window's
    reads are not affine in the length: they stop growing and step with its 128-key block)."""
    kw = dict(heads=16, kv_heads=4, d=128, dtype="bf16")
    for prompt, output, left in ((1000, 500, 255), (10, 50, 200), (100, 3000, 1023), (4000, 5, 100)):
        got = sv.decode_step(3, prompt, output, layers=4, window=(left, 0), window_layers=3, **kw)
        full = sv.decode_step(3, prompt, output, layers=1, **kw)
        steps = [sv.paged([n], window=(left, 0), **kw).row.total for n in range(prompt + 1, prompt + output)]
        assert got.nbytes == pytest.approx(full.nbytes + 3 * 3 * sum(steps) / len(steps), rel=1e-12)
        assert got.nbytes < 4 * full.nbytes or prompt + output <= left + 1
    with pytest.raises(ValueError, match="window: expected a window for window_layers > 0"):
        sv.decode_step(3, 100, 10, layers=4, window_layers=2, **kw)
    with pytest.raises(ValueError, match="window_layers: expected an integer from 0 to layers"):
        sv.decode_step(3, 100, 10, layers=4, window=(5, 0), window_layers=5, **kw)


def test_report_counts_a_sliding_window_on_some_layers(tmp_path, capsys):
    from attnscope.report.attribution import flop_share

    p = _trace(tmp_path, dtype="bf16", kv_heads=8, prompt_tokens=8000, output_tokens=301,
               sliding_window=1024, window_layers=16)
    rc, out, err = _run(capsys, "report", str(p), "--out", str(tmp_path / "r"), "--json", "--format", "md")
    assert rc == 0, err
    d = json.loads(out)["fp8_kv"]
    kw = dict(layers=32, heads=32, kv_heads=8, d=128, dtype="bf16", window=(1023, 0), window_layers=16)
    base = sv.decode_step(8, 8000, 301, kv_dtype="bf16", **kw)
    plain = sv.decode_step(8, 8000, 301, kv_dtype="bf16", **{**kw, "window": None, "window_layers": 0})
    assert d["base"] == base.to_json() and base.nbytes < 0.65 * plain.nbytes  # half the layers read 1k keys
    md = (tmp_path / "r" / "report.md").read_text()
    assert "32 layers (a 1,024-key window on 16)" in md
    _, attn, share = flop_share(8e9, 8000, 128, 32, 32, (1023, 0), 16)
    _, attn_full, share_full = flop_share(8e9, 8000, 128, 32, 32)
    assert attn < 0.65 * attn_full and f"Attention is {share:.1%} of prefill FLOPs" in md
    # every layer windowed when window_layers is not given
    rc, out, err = _run(capsys, "report", str(_trace(tmp_path, sliding_window=4096)), "--out",
                        str(tmp_path / "r2"), "--json", "--format", "md")
    assert rc == 0 and "(a 4,096-key window on 32)" in (tmp_path / "r2" / "report.md").read_text(), err
