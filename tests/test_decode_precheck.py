"""The paged decode loop with each split's block-table entries checked once before it (``PAGE_PRECHECK``,
`heuristics.PAGE_PRECHECK`): on good tables the same bits as the per-key check and the float64 reference;
a split holding an entry outside [0, num_pages) attends to no key, reports it and reads nothing outside
the cache. CPU under TRITON_INTERPRET=1 on small shapes, or a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels.decode import check_errors, flash_decode, heuristics  # noqa: E402
from attnscope.kernels.decode import plan as plan_mod  # noqa: E402
from test_decode import DEVICE, check_chunk, make_inputs, poisoned_empty, to_paged  # noqa: E402
from test_decode_features import carve  # noqa: E402


def _config(block_n, precheck):
    cfg = {"BLOCK_N": block_n, "STAGES": 1, "num_warps": 4, "num_stages": 1}
    return {**cfg, "PAGE_PRECHECK": True} if precheck else cfg


def _run(q, kp, vp, lens, table, num_splits, block_n, precheck):
    plan = plan_mod._tuned_plan(q, kp, vp, lens, table, num_splits=num_splits, return_lse=True,
                                config=_config(block_n, precheck))
    assert plan._consts.get("PAGE_PRECHECK", False) == precheck
    with poisoned_empty():
        return plan.run(q, kp, vp, lens, table)


# page size, BLOCK_N (several pages per block, or inside one page), Nq, GQA group, dtype, splits
@pytest.mark.parametrize("page_size, block_n, nq, group, dtype, num_splits", [
    (16, 64, 1, 4, torch.float16, 2), (32, 64, 1, 1, torch.bfloat16, 3), (16, 32, 1, 4, torch.bfloat16, 1),
    (16, 16, 1, 4, torch.float16, 3), (64, 32, 1, 2, torch.bfloat16, 2), (16, 16, 3, 4, torch.float16, 2),
    (16, 32, 2, 2, torch.bfloat16, 1), (32, 16, 3, 1, torch.float16, 3),
])
def test_prechecked_paged_loop_matches_the_per_key_check_and_dense(page_size, block_n, nq, group, dtype,
                                                                   num_splits):
    # ragged lengths (0, 1, a page and a bit, the whole cache; >= Nq where not 0), random page order, a
    # shared prefix page, spare pages NaN: rows past a split's end load its last key (P = 0 there)
    gen = torch.Generator().manual_seed(page_size + block_n + nq)
    B, Hkv, d = 4, 2, 64
    L = 3 * max(block_n, page_size) + 5
    q, k, v = make_inputs(B, group * Hkv, Hkv, L, d, dtype, seed=block_n + group)
    if nq > 1:
        q = torch.randn(B, group * Hkv, nq, d, generator=gen).to(dtype).to(DEVICE)
    lens = torch.tensor([L, 0, max(1, nq), page_size + 3], dtype=torch.int32)
    k, v, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, page_size, gen, shared_prefix_pages=1)
    lens_d = lens.to(DEVICE)
    o, lse = _run(q, kp, vp, lens_d, table, num_splits, block_n, True)
    o_off, lse_off = _run(q, kp, vp, lens_d, table, num_splits, block_n, False)
    check_errors()  # good tables: nothing recorded
    check_chunk(o, lse, q, k, v, lens, paged=(kp, vp, table))
    assert torch.equal(o, o_off) and torch.equal(lse, lse_off)  # P = 0 on the clamped rows adds exactly 0
    dense = flash_decode(q, k.to(DEVICE), v.to(DEVICE), lens_d, num_splits=num_splits)
    assert (o.float() - dense.float()).abs().max().item() <= 1e-2


@pytest.mark.parametrize("nq, num_splits, block_n", [(1, 1, 32), (1, 2, 16), (2, 2, 32), (3, 1, 16)])
def test_prechecked_split_with_a_bad_entry_attends_to_no_key_and_reads_nothing_outside(nq, num_splits,
                                                                                       block_n):
    check_errors()
    gen = torch.Generator().manual_seed(11 + nq)
    B, Hq, Hkv, L, ps, d = 3, 4, 2, 48, 16, 64
    q, k, v = make_inputs(B, Hq, Hkv, L, d, torch.float16, seed=7 + nq)
    if nq > 1:
        q = torch.randn(B, Hq, nq, d, generator=gen).half().to(DEVICE)
    lens = torch.tensor([L, 20, 40], dtype=torch.int32)
    k, v, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, ps, gen, spare=0)
    P = kp.shape[0]
    kp_buf, kpc = carve(kp.to(DEVICE), float("nan"))  # the pages before and after: NaN
    vp_buf, vpc = carve(vp.to(DEVICE), float("nan"))
    bad = table.clone()
    bad[0, 1], bad[2, 2] = -1, P  # the page before / after the cache
    tab_buf, tab = carve(bad.to(DEVICE), 2**30, dim=1)  # entries around the table: huge
    tab[1, 2] = -(2**30)  # sequence 1 uses 2 pages: its third entry may be anything
    lens_d = lens.to(DEVICE)
    o, lse = _run(q, kpc, vpc, lens_d, tab, num_splits, block_n, True)
    assert torch.isfinite(o).all() and not torch.isnan(lse).any()  # a NaN neighbour read would show
    assert torch.isnan(kp_buf[:3].float()).all() and torch.isnan(kp_buf[-3:].float()).all()
    check_chunk(o[1:2], lse[1:2], q[1:2], k[1:2], v[1:2], lens[1:2])  # used entries valid: the reference
    if num_splits == 1:  # one split holds every key: sequences 0 and 2 attend to none
        assert (o[[0, 2]] == 0).all() and torch.isneginf(lse[[0, 2]]).all()
    with pytest.raises(InputError, match=r"block_table: expected used page indices in \[0, num_pages\)"):
        check_errors()
    _run(q, kpc, vpc, lens_d, table.to(DEVICE), num_splits, block_n, True)
    check_errors()  # valid entries: nothing recorded


def test_precheck_is_off_by_default_and_set_from_the_block_config(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    q, k, v = make_inputs(2, 4, 2, 40, 64, torch.float16, seed=5)
    lens = torch.tensor([40, 17], dtype=torch.int32)
    k, v, kp, vp, table = to_paged(k.cpu(), v.cpu(), lens, 16, gen)
    lens_d = lens.to(DEVICE)
    assert "PAGE_PRECHECK" not in plan_mod.DecodePlan(q, kp, vp, lens_d, table)._consts
    assert "PAGE_PRECHECK" not in heuristics._block_config(16, 16)
    monkeypatch.setattr(heuristics, "PAGE_PRECHECK", True)
    assert heuristics._block_config(16, 16)["PAGE_PRECHECK"]
    assert "PAGE_PRECHECK" not in heuristics._block_config()  # dense
    plan = plan_mod.DecodePlan(q, kp, vp, lens_d, table, return_lse=True)
    assert plan._consts["PAGE_PRECHECK"] is True
    assert "PAGE_PRECHECK" not in plan_mod.DecodePlan(q, k.to(DEVICE), v.to(DEVICE), lens_d)._consts  # dense
    o, lse = plan.run(q, kp, vp, lens_d, table)
    check_chunk(o, lse, q, k, v, lens, paged=(kp, vp, table))
