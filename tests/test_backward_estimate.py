"""model/backward_estimate.py: the backward family's DRAM estimate, its constants, its probe grid and its
place in `attnscope bytes` (CPU; no GPU, ncu stood in for)."""

import json
import time
from dataclasses import fields
from pathlib import Path

import pytest

from attnscope.cli import main
from attnscope.errors import InputError
from attnscope.measure import families, physical
from attnscope.model import backward_estimate as be
from attnscope.model import l2_reuse
from attnscope.model.family_params import PROBES, FamilyParams, NotMeasured

GRIDS = Path(__file__).resolve().parents[1] / "bench" / "grids"
#: Test values for every constant (never shipped; the shipped ones are `H200_FAMILY_PARAMS`).
SET = FamilyParams(**{f.name: 0.5 for f in fields(FamilyParams)})
NONE = FamilyParams()  # nothing measured: every estimate that needs a constant refuses
BWD = ("naive_bwd_s_dram", "portable_bwd_reread_dram", "hopper_bwd_reread_dram", "onepass_bwd_reread_dram",
       "flash_bwd_reread_dram", "cudnn_bwd_reread_dram")

CASES = [("naive", dict(heads=8)), ("naive", dict(heads=8, causal=True, d=64)),
         ("flash", dict(heads=8, kv_heads=2, causal=True)), ("flash", dict(heads=4, d=64)),
         ("cudnn", dict(heads=16, kv_heads=4)), ("cudnn", dict(heads=8, causal=True, dtype="bf16")),
         ("attnscope", dict(heads=32, kv_heads=16, causal=True, kernels="portable")),
         ("attnscope", dict(heads=32, kv_heads=16, causal=True, deterministic=True)),
         ("attnscope", dict(heads=16, d=64, deterministic=True, kernels="portable")),
         ("attnscope", dict(heads=16, kv_heads=8, kernels="hopper"))]  # d 128: two kernels


@pytest.mark.parametrize("impl,kw", CASES)
def test_estimate_is_compulsory_plus_nonnegative_terms_and_grows_with_n(impl, kw):
    totals = []
    for n in (512, 1000, 4096, 8192, 20000, 40000):
        e = be.backward_estimate(impl, n, batch=2, params=SET, **kw)
        assert e.family == "backward" and e.compulsory == be.backward_compulsory(
            impl, n, d=kw.get("d", 128), dtype=kw.get("dtype", "fp16"), batch=2, heads=kw["heads"],
            kv_heads=kw.get("kv_heads"))
        for name, b, _ in e.terms:  # only the named credit may go below zero
            assert b >= 0 or name == "dirty_o", (name, b)
        assert e.total + sum(b for _, b in e.credits) >= e.compulsory  # below it only by the credit
        totals.append(e.total)
    assert all(a < b for a, b in zip(totals, totals[1:], strict=False)), totals


def test_compulsory_is_the_sweeps():
    (s,) = physical.parse_grid("g.csv", text="pass,impl,batch,heads,kv_heads,n,d,causal\n"
                                             "backward,flash,3,8,2,1500,64,1\n")
    # Q, dO, K, V read; dQ, dK, dV written; O and LSE read
    comp = be.backward_compulsory("flash", 1500, d=64, batch=3, heads=8, kv_heads=2)
    assert families.ledger(s)[1] == comp == \
        3 * 1500 * 64 * 2 * (2 * 8 + 2 * 2 + 8 + 2 * 2) + 3 * 8 * 1500 * (64 * 2 + 4)
    assert be.backward_compulsory("naive", 1500, d=64, heads=8) == 1500 * 64 * 2 * (4 * 8 + 3 * 8)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_past_the_l2_moves_every_tensor_of_its_kernels(causal):
    # far past the L2 every re-read misses and every write is written back: the estimate is the sum of the
    # kernels' reads and writes (PyTorch's: softmax's backward a product then the reduction, baddbmm's scale
    # a product on dQ and on dK), the bool mask read per (batch, head) once one head's [N, N] is past it too,
    # but for the part of the last kernel's output (dK) still dirty when the call ends
    n, bsz, h, d = 16384, 2, 8, 64
    e = be.backward_estimate("naive", n, batch=bsz, heads=h, d=d, causal=causal,
                             params=FamilyParams(naive_bwd_s_dram=1.0))
    s, q = bsz * h * n * n * 2, bsz * h * n * d * 2
    kernels = be.naive_kernels(causal)
    assert len(kernels) == 8 + causal
    moved = sum(n * n * bsz * h if t == "mask" else s if t in ("P", "dP", "T", "dS", "dS'") else q
                for _, r, w in kernels for t in (*r, *w))
    (credit,) = [b for _, b in e.credits]
    assert 0 < credit < q and e.total + credit == pytest.approx(moved, rel=1e-9)
    # unmasked: seven [N, N] reads (P three times, dP, T, dS twice) and three writes (dP, T, dS)
    assert not causal and moved == 10 * s + 12 * q or causal and moved == 12 * s + 12 * q + bsz * h * n * n


def test_naive_within_the_l2_reads_its_inputs_and_the_saved_p_only():
    # resident intermediates (a tiny [N, N]): no re-read misses and nothing is written back, so the call
    # reads Q, K, V, dO, the saved P (causal: the mask, once for every head) and writes nothing
    for causal in (False, True):
        n, h, d = 256, 2, 64
        e = be.backward_estimate("naive", n, heads=h, d=d, causal=causal)
        terms = {name: b for name, b, _ in e.terms}
        assert "intermediates" not in terms  # nothing past the L2: no term, no constant needed
        assert e.total == pytest.approx(4 * h * n * d * 2 + h * n * n * 2 + causal * n * n)
        (why,) = [w for w, _ in e.credits]
        assert why == be.DIRTY_NAIVE
    # the bool mask reaches DRAM once while one head's dS, dS' and the mask stay within the L2
    n, bsz, h = 2048, 2, 16
    e = be.backward_estimate("naive", n, batch=bsz, heads=h, causal=True)
    assert {name: b for name, b, _ in e.terms}["mask"] == n * n


def test_stream_reuse_counts_misses_by_the_bytes_between():
    size = {"A": 10.0, "B": 40.0, "C": 40.0, "X": 5.0}
    chain = (("k0", ("A",), ("X",)), ("k1", ("B",), ()), ("k2", ("C",), ()), ("k3", ("A", "X"), ()))
    cold = ("A", "B", "C")
    big, small = be.stream_reuse(chain, size, cold, 1.0, 1.5), be.stream_reuse(chain, size, cold, 1e3, 1.5)
    assert big["cold"] == small["cold"] == 90.0  # A, B, C read once each, whatever the L2
    assert big["rereads"] == 15.0 and big["writebacks"] == {"X": 1.0}  # A and X re-read, X evicted dirty
    assert small["rereads"] == 0.0 and small["writebacks"] == {"X": 0.0}
    # the miss share grows with the bytes between the two uses
    shares = [be.stream_reuse(chain, size | {"B": b}, cold, 60.0, 1.5)["rereads"] for b in (1, 30, 60, 90)]
    assert shares == sorted(shares) and shares[0] == 0 and shares[-1] == 15.0


def _l2_sim():
    import importlib.util

    spec = importlib.util.spec_from_file_location("l2_sim", GRIDS.parent / "l2_sim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("sets,per_set,q_tiles,step,heads,c", [(2, 16, 64, 4, 4, 32), (6, 16, 64, 4, 4, 32),
                                                              (2, 16, 32, 2, 8, 32), (3, 8, 32, 4, 8, 16)])
def test_diagonal_walk_share_tracks_the_ideal_schedules_stack_distances(sets, per_set, q_tiles, step, heads,
                                                                        c):
    # the closed form against bench/l2_sim.py's exact LRU stack distances of the same walk (sets starting
    # together, and staggered by the block scheduler), with the shared lines' ramp: the same regime (all hit
    # when the band fits, most miss when a head's rows alone pass the capacity) and within 0.35 between
    sim = _l2_sim().backward_walk
    for cap in (100.0, 200.0, 1000.0):
        want = sim(sets, per_set, q_tiles, step, heads, c, 1.0, cap, 1.38)
        got = l2_reuse.diagonal_walk_share(sets, per_set, q_tiles, step, heads, c, 1.0, cap, 1.38)
        assert 0.0 <= got <= 1.0 and abs(got - want) <= 0.35, (cap, got, want)
        assert (got < 0.01) == (want < 0.01), (cap, got, want)


def test_diagonal_walk_share_grows_with_the_band_and_costs_the_same_at_any_n():
    shares = [l2_reuse.diagonal_walk_share(4, 64, 256, 2, 8, 132, tile, 27e6, 1.38)
              for tile in (1e3, 1e4, 3e4, 1e5, 1e6)]
    assert shares == sorted(shares) and shares[0] == 0.0 and shares[-1] == 1.0
    assert l2_reuse.diagonal_walk_share(4, 1, 256, 2, 8, 132, 1e6, 27e6, 1.38) == 0.0  # one reader

    def timed(per_set):
        t0 = time.perf_counter()
        l2_reuse.diagonal_walk_share(4, per_set, 4 * per_set, 2, 32, 132, 1e4, 27e6, 1.38)
        return time.perf_counter() - t0

    small, large = min(timed(64) for _ in range(3)), min(timed(10**6) for _ in range(3))
    assert large < 3 * small + 0.01, (small, large)


def test_attnscope_causal_rereads_follow_the_diagonal_walkers_unmasked_the_waves_at_face_value():
    # causal: the key tiles walk from their diagonal (the build's constant scales the walk's misses); the
    # one-pass build has a constant of its own (h-onepass); unmasked: the forward's lockstep wave rule on the
    # rows and their fp32 dQ together, as measured (no constant to refuse on)
    e = be.backward_estimate("attnscope", 8192, heads=32, kv_heads=4, d=128, causal=True, deterministic=True)
    assert 0 < e.facts["walk_miss"] <= 1
    for kw, field in ((dict(kernels="portable", d=128, batch=2), "portable"),
                      (dict(deterministic=True, d=128, batch=2), "hopper"),
                      (dict(d=64, kv_heads=2), "onepass")):
        kw = {"kv_heads": 4} | kw
        assert be.backward_estimate("attnscope", 8192, heads=32, causal=True, **kw).facts["walk_miss"] > 0
        with pytest.raises(NotMeasured, match=f"{field}_bwd_reread_dram"):
            be.backward_estimate("attnscope", 8192, heads=32, causal=True, params=NONE, **kw)
        u = be.backward_estimate("attnscope", 8192, heads=32, params=NONE, **kw)
        assert "walk_miss" not in u.facts
    wide = be.backward_estimate("attnscope", 16384, batch=4, heads=32, kv_heads=4, d=64, kernels="portable",
                                params=NONE)
    terms = {name: b for name, b, _ in wide.terms}
    assert terms["q_rereads"] > 0 and terms["dq_atomics"] > 0  # a wave boundary cuts a set past the L2


def test_query_rows_per_key_pass_is_the_brute_force_count():
    for n, q, kv, causal in [(1000, 64, 128, True), (777, 32, 128, False), (4096, 64, 128, True),
                             (130, 64, 128, True)]:
        brute = 0
        for j in range(-(-n // kv)):
            for i in range(-(-n // q)):
                r0, r1 = i * q, min(n, (i + 1) * q) - 1
                if not causal or r1 >= j * kv:  # key tile j: a row that sees its first key
                    brute += r1 - r0 + 1
        assert be.q_rows_per_key_pass(n, q, kv, causal) == brute


def test_exact_terms_of_small_sets():
    # small sets: every re-read hits, no constant is needed, and the terms are the kernels' own buffers
    n, h, d = 1024, 8, 64
    e = be.backward_estimate("attnscope", n, heads=h, d=d, deterministic=True, kernels="hopper")
    terms = {name: b for name, b, _ in e.terms}
    stats = h * n * 4
    assert terms["delta"] == terms["lse2"] == stats
    # d = 64: the lean build (log2(scale) - LSE2 and -Delta, written by the preprocess), rows padded to 128
    assert (e.facts["build"], e.facts["mode"]) == ("lean", "twokernel")
    assert terms["padded_rows"] == h * 2 * 1024 * 4
    assert set(terms) == {"delta", "lse2", "padded_rows", "dirty_o"}
    e = be.backward_estimate("attnscope", n, heads=h, d=128, deterministic=True, kernels="hopper")
    terms = {name: b for name, b, _ in e.terms}
    assert (e.facts["build"], e.facts["mode"]) == ("plain", "twokernel")
    assert terms["padded_rows"] == h * 2 * 1024 * 4  # LSE2 / -qk_scale and Delta
    # the default (deterministic=False) at d = 64: the one-pass lean build, its fp32 dQ rows padded to 128
    for kw in ({"kernels": "hopper"}, {}):
        e = be.backward_estimate("attnscope", 1000, heads=h, d=d, **kw)
        terms = {name: b for name, b, _ in e.terms}
        assert (e.facts["kernels"], e.facts["build"], e.facts["mode"]) == ("hopper", "lean", "onepass")
        assert terms["dq_acc"] == 0  # the accumulator never leaves the L2 (its padded rows: see below)
        assert terms["padded_rows"] == h * 2 * 1024 * 4
        assert set(terms) == {"delta", "lse2", "padded_rows", "dq_acc", "dirty_o"}
    e = be.backward_estimate("attnscope", 1000, heads=h, d=128, kernels="hopper")  # d = 128: two kernels
    assert (e.facts["build"], e.facts["mode"]) == ("plain", "twokernel") and "dq_acc" not in dict(
        (name, b) for name, b, _ in e.terms)
    f = be.backward_estimate("flash", 1000, heads=h, kv_heads=2, d=d)
    terms = {name: b for name, b, _ in f.terms}
    assert terms["dq_acc"] == 0  # the accumulator never leaves the L2
    assert terms["gqa_expand"] == 2 * h * 1000 * d * 2 - 2 * 2 * 1000 * d * 2  # dK, dV per query head
    assert terms["layout_copies"] == 4 * h * 1000 * d * 2  # dO and O copied: each read and written
    c = be.backward_estimate("cudnn", 1000, heads=h, kv_heads=2, d=d)  # FA-2's structure, no layout copies
    assert {name for name, *_ in c.terms} == {"delta", "dq_acc", "gqa_expand", "dirty_o"}


@pytest.mark.parametrize("impl,kw", [c for c in CASES if c[0] != "naive"])  # naive: its [N, N] L2 rule
def test_a_call_within_the_l2_moves_its_compulsory_reads_only(impl, kw):
    # footprint far below the L2: every write stays dirty and every re-read hits, whatever the build;
    # far above it: no residency credit, the dirty dQ's only
    h, hkv, d = kw["heads"], kw.get("kv_heads") or kw["heads"], kw.get("d", 128)
    b = 2
    small = be.backward_estimate(impl, 256, batch=1, params=SET, **kw)
    comp = be.backward_compulsory(impl, 256, d=d, dtype=kw.get("dtype", "fp16"), heads=h, kv_heads=hkv)
    reads = comp - 256 * d * b * (h + 2 * hkv)  # less dQ, dK, dV
    assert small.total == pytest.approx(reads)
    assert small.facts["footprint_l2"] < be.H200_L2_PARAMS.capacity
    (why,) = [w for w, _ in small.credits]
    assert why.startswith(be.RESIDENT)
    big = be.backward_estimate(impl, 8192, batch=4, params=SET, **kw)
    assert big.facts["footprint_l2"] > 1 and [w for w, _ in big.credits] == [be.DIRTY_DQ]


def test_the_dq_accumulator_makes_two_round_trips_when_the_l2_cannot_hold_it():
    # fp32 dQ of 268 MB (>> L2): zeroed and written back, every line re-read by its first atomic add, written
    # back after the last and read again by the cast: 4 x the accumulator
    n, h, d = 8192, 32, 128
    for impl, kw in (("attnscope", dict(kernels="portable")), ("flash", {})):
        e = be.backward_estimate(impl, n, heads=h, d=d, batch=2, params=SET, **kw)
        terms = {name: b for name, b, _ in e.terms}
        assert terms["dq_acc"] == pytest.approx(4 * 2 * h * n * d * 4), impl
        assert (e.facts["acc_first_touch_miss"], e.facts["acc_cast_miss"]) == pytest.approx((1.0, 1.0))
    # the Hopper one-pass lean build (the default at d = 64): the same rule on its buffer of padded rows
    e = be.backward_estimate("attnscope", 8000, heads=h, d=64, batch=2, params=SET)
    assert (e.facts["build"], e.facts["mode"]) == ("lean", "onepass")
    assert {name: b for name, b, _ in e.terms}["dq_acc"] == pytest.approx(4 * 2 * h * 8064 * 64 * 4)
    # one that the L2 holds (an MHA head set of a few MiB) never reaches DRAM
    e = be.backward_estimate("attnscope", 2048, heads=8, d=64, kernels="portable", params=SET)
    assert {name: b for name, b, _ in e.terms}["dq_acc"] == 0


def test_unmeasured_constants_refuse_naming_the_field_and_its_probe():
    with pytest.raises(NotMeasured, match="naive_bwd_s_dram is not measured yet.*n-big"):
        be.backward_estimate("naive", 4096, heads=16, params=NONE)
    with pytest.raises(NotMeasured, match="cudnn_bwd_reread_dram.*c-long"):
        be.backward_estimate("cudnn", 32768, heads=2, causal=True, params=NONE)
    with pytest.raises(NotMeasured, match="portable_bwd_reread_dram.*p-group"):
        be.backward_estimate("attnscope", 8192, heads=32, kv_heads=2, d=64, causal=True, kernels="portable",
                              params=NONE)
    with pytest.raises(NotMeasured, match="hopper_bwd_reread_dram.*h-mid"):
        be.backward_estimate("attnscope", 8192, heads=32, kv_heads=4, causal=True, deterministic=True,
                              params=NONE)
    # a GQA group's query set larger than the L2 (h-group's, 1.08 x): not modelled, whatever the constants
    for kernels in ("auto", "portable"):
        with pytest.raises(NotImplementedError, match=r"1\.08 x the L2\) is larger than the L2.*supported: "
                                                      "query sets within the L2"):
            be.backward_estimate("attnscope", 8192, heads=32, kv_heads=2, causal=True, deterministic=True,
                                  kernels=kernels, params=SET)
    with pytest.raises(NotMeasured, match="flash_bwd_reread_dram.*f-long"):
        be.backward_estimate("flash", 32768, heads=2, causal=True, params=NONE)
    assert set(BWD) <= set(PROBES)
    with pytest.raises(NotMeasured, match="onepass_bwd_reread_dram.*h-onepass"):  # the one-pass build's own
        be.backward_estimate("attnscope", 8192, heads=32, kv_heads=2, d=64, causal=True, params=NONE)
    # not modelled, or bad input: one line naming what
    with pytest.raises(NotImplementedError, match="built for head dims"):
        be.backward_estimate("attnscope", 1024, heads=8, d=96, kernels="hopper", deterministic=True)
    with pytest.raises(NotImplementedError, match=r"head dim 96 is not modelled; supported: \[64, 128\]"):
        be.backward_estimate("flash", 1024, heads=8, d=96)
    with pytest.raises(NotImplementedError, match="supported: MHA"):
        be.backward_estimate("naive", 1024, heads=8, kv_heads=2)
    with pytest.raises((ValueError, InputError), match="kv_heads"):
        be.backward_estimate("flash", 1024, heads=8, kv_heads=3)
    with pytest.raises((ValueError, InputError), match="kernels"):
        be.backward_estimate("attnscope", 1024, heads=8, kernels="gluon")
    with pytest.raises((ValueError, InputError), match="n"):
        be.backward_estimate("flash", 0, heads=8)


def test_dq_by_atomics_is_the_estimates_mode():
    # the rule the sweep's ledger reads (measure/families.py) and the estimate's dQ terms: atomic dQ for
    # deterministic=False in the portable kernels and the Hopper one-pass build (d 64); dQ in its own kernel
    # for deterministic=True and the Hopper two-kernel build (d 128, either mode)
    for kernels in be.KERNEL_CHOICES:
        for d in (64, 128):
            for det in (False, True):
                atomic = be.dq_by_atomics(kernels, d, True, det)
                assert atomic == (not det and (kernels == "portable" or d == 64)), (kernels, d, det)
                e = be.backward_estimate("attnscope", 8192, heads=32, kv_heads=4, d=d, causal=True,
                                         deterministic=det, kernels=kernels, params=SET)
                names = {name for name, _, _ in e.terms}  # the accumulator, or the dQ kernel's pass
                assert ("dq_acc" in names) == atomic and ("dq_pass" in names) == (not atomic)
                if "mode" in e.facts:
                    assert (e.facts["mode"] == "onepass") == atomic
    with pytest.raises((ValueError, InputError), match="kernels"):
        be.dq_by_atomics("gluon", 64, True, False)


def test_the_kernel_geometry_is_the_kernels():
    pytest.importorskip("triton")
    from attnscope.kernels import bwd, bwd_hopper

    for d in (64, 128):
        (bm, bn, *_), (qm, qn, *_) = bwd.DKDV_CONFIGS[d], bwd.DQ_CONFIGS[d]
        assert be.BWD_KERNELS["portable"][d][:4] == (bm, bn, qm, qn)
        dk, dq = bwd_hopper.CONFIGS["dkdv"][d], bwd_hopper.CONFIGS["dq"][d]
        assert be.BWD_KERNELS["hopper"][d][:4] == (dk.BM, dk.BN, dq.NWG * dq.BM, dq.BN)
        for name, table in bwd_hopper.CONFIGS.items():  # the lean build (d = 64) has the plain one's tiles
            lean, cfg = bwd_hopper.config(d, name, 0, "bf16"), table[d]
            assert (lean.BM, lean.BN, lean.NWG) == (cfg.BM, cfg.BN, cfg.NWG)
    assert be.HOPPER_ONEPASS_DIMS == bwd.HOPPER_ONEPASS_DIMS and be.ROW_PAD == bwd_hopper.ROW_PAD


def test_cost_does_not_grow_with_n():
    def timed(n):
        t0 = time.perf_counter()
        for impl, kw in CASES:
            try:
                be.backward_estimate(impl, n, params=SET, **kw)
            except NotImplementedError:  # attnscope at N 1e8: its query set is larger than the L2
                assert impl == "attnscope" and n > 10**6

        return time.perf_counter() - t0

    timed(1000)
    small, large = min(timed(1000) for _ in range(3)), min(timed(10**8) for _ in range(3))
    assert large < 3 * small + 0.01, (small, large)


def _keys(name: str) -> set:
    return {json.dumps(s, sort_keys=True) for s in physical.parse_grid(GRIDS / name)}


def test_probe_grid_isolates_each_constant_and_misses_the_heldout_grids():
    probe = physical.parse_grid(GRIDS / "probe_backward.csv")
    assert 6 <= len(probe) <= 24 and {s["impl"] for s in probe} == set(families.IMPLS["backward"])
    held, held2, held3 = (_keys(f"heldout_backward{i}.csv") for i in ("", "2", "3"))
    assert len(held2) == len(held3) == 48 and not _keys("probe_backward.csv") & (held | held2 | held3)
    assert not held & held2 and not held3 & (held | held2)
    # every backward constant is informed by some probe row the estimate models: its term moves that row
    zero = FamilyParams(**dict.fromkeys(BWD, 0.0))
    modelled = []
    for s in probe:
        try:
            be.backward_estimate(**families.backward_args(s), params=zero)
            modelled.append(s)
        except NotImplementedError:  # h-group, h-onepass-group: query sets larger than the L2
            assert (s["heads"], s["kv_heads"], s["n"], s["d"]) in ((32, 2, 8192, 128), (32, 2, 16384, 64))
    for f in BWD:
        one = FamilyParams(**(dict.fromkeys(BWD, 0.0) | {f: 1.0}))
        moved = [s for s in modelled if be.backward_estimate(**families.backward_args(s), params=one).total >
                 be.backward_estimate(**families.backward_args(s), params=zero).total]
        assert moved, f
    # the h-onepass rows: the user's default call (kernels=auto, deterministic 0) at d 64, GQA, estimated as
    # the Hopper one-pass lean build; two with the group's query set within the L2, one past it
    onepass = [s for s in probe if s.get("kernels") == "auto"]
    assert len(onepass) == 3 and all(s["d"] == 64 and not s["deterministic"] and s["kv_heads"] < s["heads"]
                                     for s in onepass)
    sets = []
    for s in onepass:
        args = families.backward_args(s)
        assert (args["kernels"], args["deterministic"]) == ("auto", False)
        if s in modelled:
            e = be.backward_estimate(**args, params=zero)
            assert (e.facts["build"], e.facts["mode"]) == ("lean", "onepass")
            sets.append(e.facts["q_set_l2"])
    assert len(sets) == 2 and all(0.5 < x < 0.6 for x in sets)


def test_the_third_heldout_grid_is_what_its_header_command_draws():
    # committed before measurement: the seed in its header reproduces it row for row, the first two grids'
    # distribution (prefill.py's backward rule), every point estimated by the model it judges
    from grid_draws import assert_drawn

    assert_drawn("heldout_backward3.csv", "backward", 4639)
    for s in physical.parse_grid(GRIDS / "heldout_backward3.csv"):
        assert be.backward_estimate(**families.backward_args(s)).total > 0


def test_estimate_only_sweep_estimates_or_says_why(capsys):
    assert main(["bytes", "--estimate-only", "--sweep", str(GRIDS / "probe_backward.csv"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == len(physical.parse_grid(GRIDS / "probe_backward.csv"))
    why = {}
    for r in rows:  # the compulsory bytes plus the terms, or one line saying why not
        if r["estimate"] is None:
            why[(r["spec"]["n"], r["spec"]["d"])] = r["note"]
            continue
        assert r["estimate"] == pytest.approx(r["compulsory"] + sum(t["bytes"] for t in r["estimate_terms"]))
    # h-group and h-onepass-group: their query sets are larger than the L2
    assert set(why) == {(8192, 128), (16384, 64)}
    assert all("larger than the L2" in w and "\n" not in w for w in why.values())


def test_a_window_mirrors_into_the_key_tiles_query_bands():
    from attnscope.model.tiles import Grid

    # brute force: key tile j (kv keys) reads every q-row query tile holding a row r with r - left <= key <=
    # r + right for one of its keys
    n, q, kv = 700, 64, 128
    for causal, window in ((True, (100, 0)), (False, (37, 250)), (False, (-1, 64)), (True, None)):
        g = Grid(n, n, q, kv, causal=causal, window=window)
        rows = 0
        for j in range(-(-n // kv)):
            keys = range(j * kv, min(n, (j + 1) * kv))
            tiles = {r // q for r in range(n) for c in keys if g.permitted(r + 1, c + 1)}
            rows += sum(min(n, (t + 1) * q) - t * q for t in tiles)
        assert be.q_rows_per_key_pass(n, q, kv, causal, window) == rows, (causal, window)


def test_windowed_backward_is_attnscopes_and_reads_its_bands():
    base = dict(d=128, dtype="bf16", batch=2, heads=32, kv_heads=8, deterministic=True)
    full = be.backward_estimate("attnscope", 16384, **base)
    win = be.backward_estimate("attnscope", 16384, window=(512, 512), **base)
    assert win.compulsory == full.compulsory and win.facts["window"] == [512, 512]
    terms = {n: b for n, b, _ in win.terms}
    assert terms.get("q_rereads", 0) <= {n: b for n, b, _ in full.terms}.get("q_rereads", 0) + 1
    # a band the L2 cannot hold across a wave boundary is re-read there
    wide = be.backward_estimate("attnscope", 16384, window=(6000, 6000), **base)
    assert {n: b for n, b, _ in wide.terms}["q_rereads"] > terms.get("q_rereads", 0)
    with pytest.raises(NotImplementedError, match="a window is not modelled; supported: attnscope"):
        be.backward_estimate("cudnn", 4096, window=(64, 0), causal=True, d=128, heads=8)
    with pytest.raises(InputError, match="window: expected a window bounding the left side"):
        be.backward_estimate("attnscope", 4096, window=(-1, 9), causal=True, d=128, heads=8)


@pytest.mark.parametrize("causal, window", [(False, (4095, 4095)), (False, (10**6, 10**6)),
                                            (False, (-1, 4095)), (True, (4095, 0)), (True, (10**6, 0))])
@pytest.mark.parametrize("deterministic", [False, True])
def test_a_window_hiding_no_key_is_estimated_as_no_window(causal, window, deterministic):
    """A window at least as wide as the call leaves every pair the mask shows: the kernels walk what they walk
    without one, so the estimate is the unwindowed one (the band walk had counted 19 % more at N 4096)."""
    base = dict(causal=causal, d=128, heads=32, kv_heads=8, deterministic=deterministic)
    full = be.backward_estimate("attnscope", 4096, **base)
    win = be.backward_estimate("attnscope", 4096, window=window, **base)
    assert win.total == pytest.approx(full.total) and win.facts["window"] == list(window)
    assert {n for n, _, _ in win.terms} == {n for n, _, _ in full.terms}
    narrower = be.backward_estimate("attnscope", 4096, window=(4094, 4094 if not causal else 0), **base)
    assert any(k.startswith("band_") for k in narrower.facts)  # one key fewer is a window: its band walk
