"""The decode ledger with an FP8 (e4m3) KV cache (`model.serving.paged(kv_dtype="fp8")`) and `attnscope
traffic --cache-lens ... --kv-dtype fp8`: K/V at one byte per element plus one fp32 K and V scale per
program; everything else as at the queries' dtype. Pure Python (no torch)."""

from __future__ import annotations

import json

import pytest

from attnscope.cli import main
from attnscope.model import serving as sv


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
