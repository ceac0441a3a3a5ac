"""model/footprint.py against the spec's memory scopes (§1.2, §3.3), tile sizes (§2) and §6."""

from __future__ import annotations

import pytest

from attnscope.errors import InputError
from attnscope.model.footprint import footprint

KiB, MiB, GiB = 1024, 1024**2, 1024**3
F = footprint()  # spec defaults: N = 4,096, d = 128, FP16, 32 heads, 32 layers, B_r = 128, B_c = 64


def test_spec_1_2_scopes():
    assert F["per-head S+P"].nbytes == 64 * MiB                        # "S plus P is 64.00 MiB per head"
    assert f"{F['inference peak, one layer'].nbytes / GiB:.1f}" == "2.0"   # 32 heads in parallel
    assert f"{F['training retention, all layers'].nbytes / GiB:.1f}" == "64.0"  # 32 layers, no checkpointing
    # "the two answers differ by 32x"
    assert F["training retention, all layers"].nbytes == 32 * F["inference peak, one layer"].nbytes


def test_spec_3_3_scopes():
    assert F["running statistics, one head"].nbytes == 32_768      # 2 x 4,096 x 4 bytes = 32 KiB
    assert F["live state, one CTA: m, l"].nbytes == 1 * KiB         # 2 x 128 x 4 B
    assert F["live state, one CTA: accumulator"].nbytes == 64 * KiB  # 128 x 128 x 4 B
    assert F["exported logsumexp, one head"].nbytes == 16 * KiB     # 4,096 x 4 B


def test_spec_2_tile_sizes_and_fit():
    assert F["Q tile"].nbytes == 32 * KiB   # 128 x 128 x 2 B
    assert F["K tile"].nbytes == 16 * KiB   # 64 x 128 x 2 B
    assert F["V tile"].nbytes == 16 * KiB
    assert F["S tile"].nbytes == 16 * KiB   # 128 x 64 x 2 B
    fits = {(x.device, x.what): x for x in F.fits}
    assert fits[("a100", "Q, K, V, S tiles")].carveout == 164 * KiB
    assert fits[("h100", "Q, K, V, S tiles")].carveout == 228 * KiB
    assert fits[("h200", "Q, K, V, S tiles")].carveout == 228 * KiB
    assert all(x.fits for x in F.fits)  # "Those fit inside an SM's shared memory"


def test_large_head_dim_does_not_fit():
    # §6 "large head dimension": tiles that fit at d = 128 stop fitting as d grows.
    f = footprint(d=512, dtype="fp32", block_q=128, block_kv=128, devices=["a100"])
    tiles = (128 * 512 + 2 * 128 * 512 + 128 * 128) * 4
    assert f.fits[0].nbytes == tiles and not f.fits[0].fits


def test_spec_6_s_at_256():
    assert footprint(n=256)["per-head S"].nbytes == 131_072


def test_every_scope_states_its_assumption():
    for s in F.scopes + F.tiles:
        assert s.assumption and s.counts
    assert "parallel" in F["inference peak, one layer"].assumption
    assert "checkpointing" in F["training retention, all layers"].assumption


def test_ragged_short_sequence_tiles_are_clipped():
    f = footprint(n=50, d=64, block_q=128, block_kv=64)
    assert f["Q tile"].nbytes == 50 * 64 * 2
    assert f["live state, one CTA: accumulator"].nbytes == 50 * 64 * 4


@pytest.mark.parametrize("kw, msg", [
    (dict(n=0), r"nq: expected a positive integer, got 0"),
    (dict(heads=0), r"heads: expected a positive integer, got 0"),
    (dict(layers=-2), r"layers: expected a positive integer, got -2"),
    (dict(dtype="int4"), r"dtype: expected one of fp16, bf16, fp32, fp8, got 'int4'"),
    (dict(devices=["v100"]), r"device: expected one of a100, h100, h200, got 'v100'"),
])
def test_bad_input(kw, msg):
    with pytest.raises(InputError, match=msg):
        footprint(**kw)
