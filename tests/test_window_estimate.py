"""model/window_estimate.py: the DRAM-byte estimate of a sliding-window forward, its kernels, its floor, and
the re-read terms each distance decides (CPU, no torch)."""

import random

import pytest

from attnscope.errors import InputError
from attnscope.model import dispatch, traffic
from attnscope.model import window_estimate as we
from attnscope.model.family_estimate import FLEX_BLOCK, FLEX_KERNELS
from attnscope.model.l2_params import H200_L2_PARAMS, HOPPER_KERNELS, WINDOW_KERNELS, miss

MIB = 2**20


def _terms(est) -> dict:
    return {n: b for n, b, _ in est.terms}


def test_kernel_is_what_the_dispatch_runs():
    # a short window at d 64: the portable kernel in its 64 x 64 window tiles
    assert we.window_kernel("attnscope", 64, True, (256, 0), 2, 16, 4, 8192, 132)[1] == WINDOW_KERNELS[64]
    assert dispatch.portable_window(64, (256, 0), 8192, 8192, True)
    # a wide one at d 128: the Gluon variant the rule picks, one persistent CTA per SM
    name, ker = we.window_kernel("attnscope", 128, True, (4096, 0), 1, 32, 8, 32768, 132)
    assert name == dispatch.hopper_variant(128, True, 1, 32, 8, 32768, 32768, 132, (4096, 0))
    assert ker == HOPPER_KERNELS[name][128] and ker.persistent
    # Flex loads whole 128-key sparse blocks, its grid puts the batch between a group's heads
    _, flex = we.window_kernel("flex", 128, False, (100, 100), 2, 16, 4, 4096, 132)
    assert flex.block_kv == FLEX_BLOCK and flex.block_q == FLEX_KERNELS[128].block_q and flex.order == "bh"


@pytest.mark.parametrize("causal,window,match", [
    (False, (-1, -1), "a window bounding at least one side"),
    (True, (-1, 7), r"a window bounding the left side \(causal bounds the right one\)"),
    (False, (-2, 3), "window: expected None or a pair"),
    (False, "wide", "window: expected None or a pair"),
])
def test_a_window_that_hides_nothing_is_refused_in_one_line(causal, window, match):
    with pytest.raises(InputError, match=match):
        we.window_estimate("attnscope", 4096, window=window, causal=causal, d=64)


def test_head_dims_without_probes_are_not_modelled():
    with pytest.raises(NotImplementedError, match="head dim 96 is not modelled; supported: 64, 128"):
        we.window_estimate("flex", 4096, window=(64, 0), causal=True, d=96)


def test_a_small_call_is_its_compulsory_bytes_less_the_dirty_output():
    est = we.window_estimate("attnscope", 2048, window=(128, 0), causal=True, d=64, heads=8, dtype="fp16")
    t = _terms(est)
    assert est.compulsory == we.window_compulsory(2048, d=64, heads=8) == 4 * 2048 * 8 * 64 * 2
    assert t["kv_rereads"] == 0.0
    o = 2048 * 8 * 64 * 2
    assert -o <= t["dirty_o"] < 0 and est.credits == [(est.terms[-1][2], -t["dirty_o"])]
    assert est.total == pytest.approx(est.compulsory + t["dirty_o"])


def test_floor_and_ceiling_over_random_calls():
    """Every term is >= 0 but the named dirty-O credit (at most O), and the K/V re-reads are at most the
    ledger's K/V reads beyond one pass (the estimate never exceeds the logical bytes plus the mask)."""
    rng = random.Random(39)
    for _ in range(300):
        impl, d = rng.choice(we.WINDOW_IMPLS), rng.choice((64, 128))
        group = rng.choice((1, 2, 4, 8))
        h, n, b = group * rng.choice((1, 2, 4)), rng.randint(1, 70_000), rng.randint(1, 4)
        causal = rng.random() < 0.5
        w = rng.randint(0, n)
        window = (w, 0) if causal else rng.choice(((w, w), (w, -1), (-1, w), (w, rng.randint(0, n))))
        l2 = rng.choice((None, 8 * MIB, 50 * MIB))
        est = we.window_estimate(impl, n, window=window, causal=causal, d=d, dtype="bf16", batch=b, heads=h,
                                 kv_heads=h // group, l2_bytes=l2)
        t = _terms(est)
        assert all(v >= 0 for k, v in t.items() if k != "dirty_o")
        assert -b * h * n * d * 2 - 1 <= t["dirty_o"] <= 0
        logical, _ = we.window_ledger(impl, n, window=window, causal=causal, d=d, dtype="bf16", batch=b,
                                      heads=h, kv_heads=h // group)
        qo = 2 * b * h * n * d * 2
        kv_once = 2 * b * (h // group) * n * d * 2
        assert t["kv_rereads"] <= logical - qo - kv_once + 1
        assert est.total <= logical + t.get("block_mask", 0) + 1


def test_ledger_is_the_traffic_row_of_the_tiles_that_run():
    logical, name = we.window_ledger("attnscope", 8192, window=(256, 0), causal=True, d=64, heads=16,
                                     kv_heads=4, batch=2)
    row = traffic.traffic(8192, 64, "fp16", 64, 64, batch=2, heads=16, kv_heads=4, window=(256, 0),
                          rows=("flash-causal",))
    assert logical == row["flash-causal"].total * 32 and "64 x 64 tiles" in name


def test_one_kv_head_past_the_l2_is_re_read_by_every_later_head():
    # one head's pass over 64k keys at d 128 (32 MiB of K/V + its Q/O) is more than the L2 keeps, so each of
    # the 7 later query heads of the one K/V head reads the set again
    est = we.window_estimate("attnscope", 65536, window=(1024, 0), causal=True, d=128, dtype="bf16", heads=8,
                             kv_heads=1)
    room = est.facts["group_room_l2"] * 60 * MIB
    assert miss(room / (H200_L2_PARAMS.shared * 60 * MIB), H200_L2_PARAMS.shared_ramp) == 1.0
    assert _terms(est)["kv_rereads"] == pytest.approx(7 * 65536 * 2 * 128 * 2, rel=0.01)
    # at 4k keys the set and the pass fit: nothing re-read
    small = we.window_estimate("attnscope", 4096, window=(1024, 0), causal=True, d=128, dtype="bf16",
                               heads=8, kv_heads=1)
    assert _terms(small)["kv_rereads"] == 0.0


def test_flex_puts_the_batch_between_a_groups_heads():
    # attnscope's order keeps a group's heads adjacent; Flex's re-reads the set after the other batches
    args = dict(window=(512, 0), causal=True, d=128, dtype="bf16", heads=16, kv_heads=2, batch=4)
    a, f = (we.window_estimate(i, 12000, **args) for i in ("attnscope", "flex"))
    assert f.facts["group_room_l2"] > max(2 * a.facts["group_room_l2"], H200_L2_PARAMS.shared)
    assert _terms(f)["kv_rereads"] > 0 == _terms(a)["kv_rereads"]


def test_wave_boundaries_re_read_the_band_once_it_outgrows_the_l2():
    # on a small L2 a wide band misses at each of a head's wave boundaries; a narrow one does not
    def rr(w):
        est = we.window_estimate("attnscope", 32768, window=(w, 0), causal=True, d=128, dtype="bf16",
                                 heads=4, l2_bytes=12 * MIB)
        return _terms(est)["kv_rereads"], est.facts

    narrow, _ = rr(256)
    wide, facts = rr(8192)
    assert narrow < wide
    tiles, c = facts["tiles_per_head"], facts["concurrent_ctas"]
    rows = 4 * (tiles - 1) / c * (8192 + facts["block_kv"])  # boundaries x band, 4 heads
    assert wide >= rows * 2 * 128 * 2 * miss(facts["boundary_room_l2"] / H200_L2_PARAMS.shared,
                                             H200_L2_PARAMS.shared_ramp) * 0.99


def test_flex_reads_its_block_mask_once():
    est = we.window_estimate("flex", 8192, window=(1000, 0), causal=True, d=64, heads=8)
    blocks = 8192 // FLEX_BLOCK
    loaded = sum(min(i, 1000 // FLEX_BLOCK + 2) for i in range(1, blocks + 1))  # blocks i - 8 .. i
    mask = _terms(est)["block_mask"]
    assert blocks * 8 + loaded * 4 <= mask < blocks * 8 + loaded * 4 + 32


def test_cost_does_not_grow_with_n():
    # closed forms only: a call of 10^9 keys is estimated as quickly as one of 10^3 (a loop over tiles or
    # rows would not finish)
    est = we.window_estimate("attnscope", 10**9, window=(4096, 4096), d=128, dtype="bf16", heads=8,
                             kv_heads=1)
    assert est.total > est.compulsory


def _l2_sim():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "l2_sim.py"
    spec = importlib.util.spec_from_file_location("l2_sim", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_ideal_machine_agrees_where_the_schedule_stays_in_step():
    # bench/l2_sim.py --window: the same kernels (window_kernel) through an LRU of stack distances at the
    # shared lines' ramp; a narrow window on the portable kernel re-reads nothing in either, one K/V head
    # past the L2 makes every later head re-read the set in both, Flex's batch between a group's heads too
    sim = _l2_sim()
    ramp = H200_L2_PARAMS.shared_ramp
    cases = [("attnscope", 2, 16, 4, 8192, 64, True, (256, 0), 0.0),
             ("attnscope", 1, 8, 1, 65536, 128, True, (8192, 0), 7.0),
             ("flex", 4, 32, 8, 16384, 128, True, (2048, 0), 3.0)]
    for impl, b, h, hkv, n, d, causal, window, want in cases:
        got, name = sim.window_attention(impl, b, h, n, d, causal, window, H200_L2_PARAMS.shared,
                                         dtype="bf16", kv_heads=hkv, ramp=ramp)
        est = we.window_estimate(impl, n, window=window, causal=causal, d=d, dtype="bf16", batch=b, heads=h,
                                 kv_heads=hkv)
        sets = _terms(est)["kv_rereads"] / (b * hkv * 2 * n * d * 2)
        assert got == pytest.approx(want, abs=0.5), (name, got)
        assert sets == pytest.approx(want, abs=0.05), (name, sets)
    # hopper_persist's static schedule is what the machine runs for it: a causal window's ramp in pairs
    # (`tiles.persistent_ramp`), a two-sided window's tiles in turn (program p: tiles p, p + C, ...)
    for causal, window, kind in ((True, (16384, 0), "static, paired"), (False, (8192, 8192), "static")):
        _, name = sim.window_attention("attnscope", 1, 4, 32768, 128, causal, window, H200_L2_PARAMS.shared,
                                       dtype="bf16", ramp=ramp)
        assert name == f"hopper_persist ({kind})"


def test_the_ledger_refuses_an_unprobed_head_dim_as_the_estimate_does():
    for f in (we.window_ledger, we.window_estimate):
        with pytest.raises(NotImplementedError, match="head dim 256 is not modelled"):
            f("attnscope", 4096, window=(64, 0), causal=True, d=256)


def test_windowed_rereads_never_above_the_same_call_without_the_window():
    # a window's kernel walks a subset of the plain walk's tile pairs in the same order: each re-read term of
    # the packed and backward estimates is at most the plain call's (the band walk alone counted more near
    # full width: causal (6000, 0) over 8,192 keys was 1.63 GB against plain causal's 1.02 GB)
    from functools import partial

    from attnscope.model.backward_estimate import backward_estimate
    from attnscope.model.family_estimate import unwindowed_terms, varlen_estimate

    def check(fn, win, names):
        plain = unwindowed_terms(partial(fn, window=None))
        if plain is None:  # the plain call is not modelled: nothing to compare
            return 0
        t = _terms(fn(window=win))
        for name in names:
            assert t.get(name, 0.0) <= plain.get(name, 0.0) + 1e-6, (name, win, t, plain)
        return 1

    lens = [4096, 8192, 300]
    plain_causal = varlen_estimate("attnscope", lens, causal=True)
    assert varlen_estimate("attnscope", lens, causal=True, window=(6000, 0)).total <= plain_causal.total + 1
    rng, compared = random.Random(7), 0
    for _ in range(60):
        causal = rng.random() < 0.5
        n = rng.choice([1024, 4096, 8192, 16384, 30001])
        win = (rng.randint(0, n), 0 if causal else rng.choice([-1, rng.randint(0, n)]))
        shape = {"d": rng.choice([64, 128]), "heads": 32, "kv_heads": rng.choice([2, 8, 32]),
                 "causal": causal}
        lens = [rng.randint(1, n) for _ in range(rng.randint(1, 6))]
        compared += check(partial(varlen_estimate, "attnscope", lens, **shape), win, ["kv_rereads"])
        compared += check(partial(backward_estimate, "attnscope", n, batch=rng.randint(1, 4),
                                  deterministic=rng.random() < 0.5, **shape), win,
                          ["q_rereads", "dq_atomics", "kv_rereads"])
    assert compared >= 60


def test_partly_paired_wide_windows_count_the_round_boundaries():
    """hopper_persist, a causal MHA window wider than a quarter of the keys: the full tile a round boundary
    cuts re-reads its band one round after the tile above it read it, behind ~2 C B_r rows of other bands, so
    those re-reads miss once that room passes the shared capacity (`paired_band_rereads`); the in-wave rule
    alone counts none. A narrow window's boundaries stay in the L2; GQA keeps the group rule."""
    def sets(heads, kv_heads, n, w):
        est = we.window_estimate("attnscope", n, window=(w, 0), causal=True, d=128, dtype="bf16",
                                 heads=heads, kv_heads=kv_heads)
        assert est.facts["kernel"] == "hopper_persist"
        return _terms(est)["kv_rereads"] / (kv_heads * 2 * n * 128 * 2), est.facts
    wide, facts = sets(16, 16, 32768, 16384)
    assert 0.3 < wide < 1.0 and facts["boundary_room_l2"] > H200_L2_PARAMS.shared
    assert sets(32, 32, 32768, 4096)[0] == 0.0  # the band and the rounds fit: nothing re-read
    assert sets(16, 16, 32768, 12288)[0] < wide < sets(16, 16, 32768, 24000)[0]  # wider: more room, more
    assert sets(32, 4, 32768, 16384)[0] == 0.0  # GQA: a round's heads share the set (the group rule)


def test_the_wide_window_grid_is_what_its_header_command_draws():
    # committed before measurement: attnscope causal windows of N / 4 to N keys, half MHA, none of the first
    # window grid's points
    from grid_draws import assert_drawn

    rows = assert_drawn("heldout_window_wide.csv", "window_wide", 3990)
    assert len(rows) == 48 and {r["impl"] for r in rows} == {"attnscope"}
    assert all(int(r["n"]) // 4 <= int(r["window"].split(":")[0]) < int(r["n"]) for r in rows)
    assert sum(r["heads"] == r["kv_heads"] for r in rows) >= 24
