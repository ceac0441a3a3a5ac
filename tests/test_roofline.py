"""model/roofline.py: the device table, ridge points (spec §1.1, sources table) and time floors."""

from __future__ import annotations

import pytest

from attnscope.errors import InputError
from attnscope.model import roofline as rl
from attnscope.model.traffic import traffic

T = traffic()


def test_spec_ridge_points():
    # H100 SXM: 989 TFLOPS / 3.35 TB/s ~ 295 FLOP/byte; A100: 312 / 2.039 ~ 153.
    assert round(rl.ridge(rl.device("h100"))) == 295
    assert round(rl.ridge(rl.device("a100"))) == 153
    # H200: same 989 TFLOP/s dense at 4.8 TB/s.
    assert round(rl.ridge(rl.device("h200"))) == 206


def test_device_table_facts_and_sources():
    a, h, h2 = rl.device("a100"), rl.device("h100"), rl.device("h200")
    assert (a.tensor_fp16, a.fp32, a.hbm) == (312e12, 19.5e12, 2.039e12)   # spec sources table
    assert (h.tensor_fp16, h.hbm) == (989e12, 3.35e12)
    assert (h2.tensor_fp16, h2.hbm, h2.sms) == (989e12, 4.8e12, 132)
    assert (a.smem_carveout, h.smem_carveout, h2.smem_carveout) == (164 * 1024, 228 * 1024, 228 * 1024)
    assert a.sms == 108 and h.sms == 132
    for dev in rl.DEVICES.values():
        assert set(dev.sources) >= {"flops", "hbm", "l2", "sms", "smem"}
        assert all(isinstance(v, str) and v for v in dev.sources.values())
        assert dev.smem_per_block <= dev.smem_carveout


def test_softmax_intensity_is_about_one_flop_per_byte():
    # §1.1: about 4N^2 FLOPs against 2N^2 b bytes -> ~1 FLOP/byte, > 2 orders of magnitude below the ridge.
    pts = rl.roofline(T["naive"], rl.device("h100"))
    softmax = pts[1]
    assert softmax.intensity == 1.0
    assert softmax.bound == "memory"
    assert rl.ridge(rl.device("h100")) / softmax.intensity > 100


def test_fused_kernel_flops_and_floor():
    dev = rl.device("h100")
    (p,) = rl.roofline(T["flash"], dev)
    assert p.flops == 4 * 4096 * 4096 * 128                 # DESIGN: 4 Nq Nk d
    (pc,) = rl.roofline(T["flash-causal"], dev)
    assert pc.flops == p.flops // 2                         # halved for causal when Nq == Nk
    assert p.nbytes == 69_206_016
    assert p.floor_s == max(p.flops / 989e12, 69_206_016 / 3.35e12)


def test_time_floor_sums_kernels_and_scales():
    dev = rl.device("a100")
    pts = rl.roofline(T["naive"], dev)
    assert rl.time_floor(pts) == pytest.approx(sum(max(p.flops / p.peak, p.nbytes / 2.039e12) for p in pts))
    many = rl.roofline(T["naive"], dev, scale=64)
    assert [m.intensity for m in many] == [p.intensity for p in pts]
    assert rl.time_floor(many) == pytest.approx(64 * rl.time_floor(pts))


def test_elementwise_uses_fp32_peak():
    dev = rl.device("a100")
    assert rl.peak(dev, "fp16", "elementwise") == 19.5e12
    assert rl.peak(dev, "fp16", "tensor") == 312e12


def test_unknown_device_lists_valid():
    with pytest.raises(InputError, match=r"device: expected one of a100, h100, h200, got 'tpu'"):
        rl.device("tpu")


def test_fp8_on_a100_is_unsupported():
    with pytest.raises(NotImplementedError, match=r"a100.*supported on h100, h200"):
        rl.peak(rl.device("a100"), "fp8")
    assert rl.peak(rl.device("h100"), "fp8") == 1979e12
