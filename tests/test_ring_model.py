"""The ring's communication model (model/ring.py) and `attnscope ring`: closed forms, bad input."""

from __future__ import annotations

import json
import math

import pytest

from attnscope.cli import main
from attnscope.errors import InputError
from attnscope.model import ring
from attnscope.model.roofline import device


def test_link_curve_hits_the_anchors_and_clamps():
    for size, bw in ring.NVLINK_H200:
        assert ring.link_bandwidth(size) == pytest.approx(bw)
    assert ring.link_bandwidth(1) == ring.NVLINK_H200[0][1]
    assert ring.link_bandwidth(10 * ring.GiB) == ring.NVLINK_H200[-1][1]
    mid = ring.link_bandwidth(128 * ring.MiB)  # halfway in log(size) between 64 and 256 MiB
    assert mid == pytest.approx((212e9 + 291e9) / 2)
    assert ring.link_bandwidth(5, link_gbps=50.0) == 50e9


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_prediction_closed_form(p, causal):
    n, h, hkv, d, b, rate, gbps = 65536 + 3, 32, 8, 128, 2, 500.0, 100.0
    x = ring.predict(p, n, h, hkv, d, "bf16", causal, "h200", b, tflops=rate, link_gbps=gbps)
    m = -(-n // p)
    pairs = m * m / 2 if causal else m * m
    assert x.step_flops == pytest.approx(4 * b * h * pairs * d)
    assert x.compute_s == pytest.approx(x.step_flops / (rate * 1e12))
    assert x.kv_bytes == 2 * b * hkv * m * d * 2
    assert x.transfer_s == pytest.approx(x.kv_bytes / (gbps * 1e9))
    merge = b * h * m * (d * 10 + 12) / device("h200").hbm
    want = (p - 1) * (max(x.compute_s, x.transfer_s) + merge) + x.compute_s + p * ring.STEP_OVERHEAD_S
    assert x.total_s == pytest.approx(want)
    assert x.bound == ("link" if x.transfer_s > x.compute_s else "compute")
    # the P steps add up to the whole sequence's work (equal steps in the balanced layout)
    whole = 4 * b * h * n * n * d / (2 if causal else 1)
    assert p * p * x.step_flops == pytest.approx(whole, rel=3 * p / n)


def test_crossover_is_the_compute_equals_transfer_point():
    # constant link: n_local* = Hkv * elt * rate / (2 * f * Hq * bw)
    for causal, f in ((False, 1.0), (True, 0.5)):
        n = ring.crossover_n(4, 32, 8, 128, "bf16", causal, tflops=400.0, link_gbps=100.0)
        want = 8 * 2 * 400e12 / (2 * f * 32 * 100e9)
        assert n / 4 == pytest.approx(want, abs=1)
        below = ring.predict(4, n - 8, 32, 8, causal=causal, tflops=400.0, link_gbps=100.0)
        above = ring.predict(4, n + 8, 32, 8, causal=causal, tflops=400.0, link_gbps=100.0)
        assert below.bound == "link" and above.bound == "compute"


def test_more_ranks_turn_link_bound_sooner():
    xs = [ring.predict(p, 32768, 32, causal=True, link_gbps=50.0) for p in (2, 4, 8)]
    ratios = [x.transfer_s / x.compute_s for x in xs]
    assert ratios[0] < ratios[1] < ratios[2]
    assert all(x.efficiency <= 1.0 for x in xs)


@pytest.mark.parametrize("kw, name", [
    (dict(ranks=0), "ranks"), (dict(n=-1), "n"), (dict(kv_heads=5), "kv_heads"), (dict(dtype="fp8"), "dtype"),
    (dict(tflops=float("nan")), "tflops"), (dict(link_gbps=0), "link_gbps"),
])
def test_bad_input(kw, name):
    args = dict(ranks=2, n=4096, heads=32, kv_heads=32, d=128, dtype="bf16", causal=True)
    args.update(kw)
    with pytest.raises(InputError, match=f"^{name}: expected"):
        ring.predict(**args)


def test_unmeasured_device_needs_rates():
    with pytest.raises(InputError, match="tflops: expected"):
        ring.predict(2, 4096, 32, dev="a100")
    with pytest.raises(InputError, match=r"d = 96; measured: h200 with d in 64, 128, 256\)"):
        ring.predict(2, 4096, 32, d=96)  # the message lists the rates the table holds
    assert ring.kernel_rate("h200", 256, True) == ring.KERNEL_RATE["h200", 256, True]
    with pytest.raises(InputError, match="link_gbps: expected"):
        ring.predict(2, 4096, 32, dev="a100", tflops=200.0)


def test_cli_json(capsys):
    assert main(["ring", "--ranks", "2,4,8", "--n", "131072", "--heads", "32", "--kv-heads", "8", "--causal",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    preds = out["predictions"]
    assert [x["ranks"] for x in preds] == [2, 4, 8]
    direct = ring.predict(4, 131072, 32, 8, causal=True)
    assert math.isclose(preds[1]["total_s"], direct.total_s)


def test_cli_table(capsys):
    assert main(["ring", "--ranks", "2", "--n", "65536", "--causal"]) == 0
    assert "predicted, not measured" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["ring", "--ranks", "2,x"], "ranks: expected"),
    (["ring", "--heads", "32", "--kv-heads", "5"], "--kv-heads: expected"),
    (["ring", "--device", "tpu"], "tpu"),
])
def test_cli_bad_input_one_line_exit_2(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
