"""checks.py: the reference checks pass, each catches the bug it is there for, and the kernel checks'
run conditions and verdicts (with fake kernels, and with the real ones where they can run)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from attnscope import checks
from attnscope import reference as R
from attnscope.errors import InputError


def by_number(results):
    return {r.name.split()[0]: r for r in results}


@pytest.mark.parametrize("seed", [0, 7])
def test_reference_checks_pass(seed):
    res = checks.reference_checks(seed)
    assert [r.name.split()[0] for r in res] == [str(n) for n in range(1, 11)]
    assert all(r.passed is True for r in res), [(r.name, r.detail) for r in res]
    for r in res:
        assert r.error is not None and r.tolerance is not None
    r3 = by_number(res)["3"]
    assert r3.error > 0.1 and "detected" in r3.detail  # the omitted mask moves the output a lot


def test_omitted_mask_fails_check_1_and_is_detected_by_check_3(monkeypatch):
    monkeypatch.setattr(R, "_mask_tile", lambda s, row0, col0, offset, bounds=None: s)
    res = by_number(checks.reference_checks(0))
    assert res["1"].passed is False and res["1"].error > 1e-3 and "causal" in res["1"].detail
    assert res["2"].passed is False
    assert res["3"].passed is True and "detected" in res["3"].detail
    assert res["5"].passed is True  # FA-1 and FA-2 agree with each other, both wrong


def test_causal_only_mask_fails_check_8(monkeypatch):
    """A mask that keeps only the causal (right) edge lets rows see keys left of their window."""
    mask = R._mask_tile
    monkeypatch.setattr(R, "_mask_tile", lambda s, row0, col0, offset, bounds=(-1, 0):
                        mask(s, row0, col0, offset, (-1, max(bounds[1], -1))))
    r = checks.check_window_schedule(np.random.default_rng(0))
    assert r.passed is False and r.error > 1e-3 and "window" in r.detail


def test_loading_skipped_tiles_fails_check_8(monkeypatch):
    """A schedule that starts every query tile at KV tile 1 (no left skip) gives the right numbers, but
    visits tiles with no visible key: check 8 counts the tiles each row visits."""
    from attnscope.model import tiles

    kv_tiles = tiles.Grid.kv_tiles
    monkeypatch.setattr(tiles.Grid, "kv_tiles", lambda g, i: kv_tiles(g, i)._replace(first=1))
    r = checks.check_window_schedule(np.random.default_rng(0))
    assert r.passed is False and r.error < checks.REL_TOL and "visited" in r.detail


def test_dropped_softcap_or_sinks_fail_check_9(monkeypatch):
    tiled = R.tiled_attention
    monkeypatch.setattr(R, "tiled_attention", lambda *a, softcap=0.0, **kw: tiled(*a, **kw))
    r = checks.check_softcap_sinks(np.random.default_rng(0))
    assert r.passed is False and r.error > 1e-3 and "softcap=" in r.detail
    monkeypatch.setattr(R, "tiled_attention", lambda *a, sinks=None, **kw: tiled(*a, **kw))
    assert checks.check_softcap_sinks(np.random.default_rng(0)).passed is False


def test_sinks_merged_per_split_fail_check_10(monkeypatch):
    combine = R.combine

    def per_split(parts, sinks=None):  # the bug: the sink joins every split's denominator
        return combine([combine([p], sinks=sinks) for p in parts])

    monkeypatch.setattr(R, "combine", per_split)
    r = checks.check_combine_sinks(np.random.default_rng(0))
    assert r.passed is False and r.error > 1e-3


def test_check_3_fails_when_the_difference_is_not_there(monkeypatch):
    # a tiled path that ignores _apply_mask=False (always the right answer) leaves nothing to detect
    naive = R.naive_attention
    monkeypatch.setattr(R, "tiled_attention", lambda q, k, v, causal=False, **kw:
                        naive(q, k, v, causal=causal, return_lse=True))
    r = checks.check_mask_omitted(np.random.default_rng(0))
    assert r.passed is False and r.error == 0.0 and "NOT detected" in r.detail


def _online_update_without_rescale(m_i, l_i, acc, s, v_j):
    m_new = np.maximum(m_i, s.max(axis=-1))
    m_base = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.ones_like(m_i)  # the bug: the old state is not moved onto the new max
    p = np.exp(s - m_base[..., None])
    return m_new, alpha, alpha * l_i + p.sum(-1), alpha[..., None] * acc + p @ v_j


def _online_update_nan_on_empty_rows(m_i, l_i, acc, s, v_j):
    m_new = np.maximum(m_i, s.max(axis=-1))
    with np.errstate(invalid="ignore"):
        alpha = np.exp(m_i - m_new)  # the bug: -inf - (-inf) = NaN while a row has seen no key
        p = np.exp(s - m_new[..., None])
    return m_new, alpha, alpha * l_i + p.sum(-1), alpha[..., None] * acc + p @ v_j


def test_missing_rescale_fails_checks_1_2_6(monkeypatch):
    monkeypatch.setattr(R, "_online_update", _online_update_without_rescale)
    res = by_number(checks.reference_checks(0))
    for n in "126":
        assert res[n].passed is False, n


def test_nan_on_empty_rows_fails_check_4(monkeypatch):
    monkeypatch.setattr(R, "_online_update", _online_update_nan_on_empty_rows)
    r = checks.check_no_nan(np.random.default_rng(0))
    assert r.passed is False and r.error > 0 and "NaN" in r.detail


def test_wrong_combine_fails_check_6(monkeypatch):
    monkeypatch.setattr(R, "combine", lambda parts: list(parts)[-1])
    r = checks.check_combine(np.random.default_rng(0))
    assert r.passed is False


def test_rel_and_lse_error():
    assert checks.rel_error(np.array([1.0, 2.0]), np.array([1.0, 4.0])) == 0.5
    assert checks.rel_error(np.zeros(2), np.zeros(2)) == 0.0
    assert checks.rel_error(np.array([np.nan]), np.array([1.0])) == float("inf")
    assert checks.lse_error(np.array([-np.inf, 2.0]), np.array([-np.inf, 2.5])) == 0.2
    assert checks.lse_error(np.array([0.0, 2.0]), np.array([-np.inf, 2.0])) == float("inf")


# --- kernel run conditions ---------------------------------------------------------------------------
def test_kernel_mode_off_and_bad_mode():
    runnable, why, _ = checks.kernel_status("off")
    assert not runnable and "--kernels off" in why
    with pytest.raises(InputError, match="kernels: expected one of auto, on, off, got 'sometimes'"):
        checks.kernel_status("sometimes")
    with pytest.raises(InputError, match="kernels: expected one of auto, on, off"):
        list(checks.iter_checks(0, "yes"))


def test_kernel_modules_missing(monkeypatch):
    real = checks._module_exists
    monkeypatch.setattr(checks, "_module_exists",
                        lambda n: False if n.startswith("attnscope.kernels") else real(n))
    runnable, why, present = checks.kernel_status("auto")
    assert not runnable and present == [] and "are not present" in why
    [line] = checks.kernel_checks(0, "auto")
    assert line.passed is None and line.status == "SKIP"
    [line] = checks.kernel_checks(0, "on")
    assert line.passed is False and "are not present" in line.detail


def test_no_torch(monkeypatch):
    real = checks._module_exists
    monkeypatch.setattr(checks, "_module_exists", lambda n: n.startswith("attnscope") or
                        (real(n) if n != "torch" else False))
    runnable, why, _ = checks.kernel_status("auto")
    assert not runnable and "pip install 'attnscope[kernels]'" in why


def test_cpu_without_interpreter(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(checks, "_module_exists", lambda n: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(checks, "_nvidia_driver_present", lambda: False)
    runnable, why, _ = checks.kernel_status("auto")
    assert not runnable and "no NVIDIA driver" in why and "TRITON_INTERPRET is not set" in why
    monkeypatch.setattr(checks, "_nvidia_driver_present", lambda: True)  # a driver, but torch sees no GPU
    runnable, why, _ = checks.kernel_status("auto")
    assert not runnable and why.startswith("not run: no CUDA GPU and TRITON_INTERPRET is not set")
    # on: would turn the interpreter on, but triton is already imported in this process
    runnable, why, _ = checks.kernel_status("on")
    assert not runnable and "triton was imported before" in why
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    runnable, why, _ = checks.kernel_status("auto")
    assert runnable and "TRITON_INTERPRET=1" in why


# --- kernel verdicts with fake kernels (torch only, fast) --------------------------------------------
def _fake_kernels(monkeypatch, error=0.0, empty_rows_nan=False):
    """Install attention computed by torch in float32 (+ `error`) as attnscope's kernels."""
    torch = pytest.importorskip("torch")
    import attnscope

    def attn(q, k, v, permitted, scale, return_lse):
        g = q.shape[1] // k.shape[1]
        k, v = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
        s = (q.float() @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
        s = s.masked_fill(~torch.as_tensor(permitted), float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None])
        if not empty_rows_nan:
            p = torch.nan_to_num(p, nan=0.0)
        o = (p @ v + error).to(q.dtype)
        return (o, lse) if return_lse else o

    def flash_attention(q, k, v, causal=False, scale=None, return_lse=False):
        nq, nk = q.shape[2], k.shape[2]
        permitted = np.ones((nq, nk), bool)
        if causal:
            permitted = np.arange(nk)[None] <= np.arange(nq)[:, None] + nk - nq
        return attn(q, k, v, permitted, scale, return_lse)

    def flash_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits=None, scale=None, return_lse=False):
        lens = cache_seqlens.cpu().numpy()
        permitted = (np.arange(k_cache.shape[2])[None] < lens[:, None])[:, None, None, :]
        return attn(q, k_cache, v_cache, permitted, scale, return_lse)

    monkeypatch.setattr(attnscope, "flash_attention", flash_attention)
    monkeypatch.setattr(attnscope, "flash_decode", flash_decode)
    monkeypatch.setattr(checks, "kernel_status", lambda mode: (True, "fake", ["fwd", "decode"]))
    monkeypatch.setattr(checks, "FWD_SHAPES", ((1, 4, 2, 19, 19, 64, "float16"),
                                               (1, 2, 1, 9, 5, 64, "float16")))


def test_fake_correct_kernels_pass(monkeypatch):
    _fake_kernels(monkeypatch)
    res = list(checks.kernel_checks(0, "on"))
    assert [r.name.split()[0] for r in res] == ["K1", "K4", "K1", "K6"]
    assert all(r.passed for r in res), [(r.name, r.detail) for r in res]
    k1 = res[0]
    assert 0 < k1.error <= k1.tolerance and "torch's own error" in k1.detail


def test_fake_kernels_off_by_a_little_fail(monkeypatch):
    _fake_kernels(monkeypatch, error=0.01)
    res = list(checks.kernel_checks(0, "on"))
    assert [r.passed for r in res] == [False, False, False, False]  # K4: empty rows are not zeros
    assert res[0].error > res[0].tolerance


def test_fake_kernel_nan_on_empty_rows_fails_k4(monkeypatch):
    _fake_kernels(monkeypatch, empty_rows_nan=True)
    r = list(checks.kernel_checks(0, "on"))[1]
    assert r.name.startswith("K4") and r.passed is False and r.error > 0


def test_a_crashing_kernel_fails_its_line(monkeypatch):
    _fake_kernels(monkeypatch)
    import attnscope

    def boom(*a, **k):
        raise NotImplementedError("head_dim 64 is not supported; supported: 128")

    monkeypatch.setattr(attnscope, "flash_decode", boom)
    res = list(checks.kernel_checks(0, "on"))
    assert [r.passed for r in res] == [True, True, False, False]
    assert res[2].detail == "raised NotImplementedError: head_dim 64 is not supported; supported: 128"


# --- the real kernels, where they can run (TRITON_INTERPRET=1 is set by conftest without a GPU) ------
def test_real_kernels_pass_where_they_can_run():
    runnable, why, present = checks.kernel_status("auto")
    if not runnable or set(present) != {"fwd", "decode"}:
        pytest.skip(f"kernels {why}")
    res = list(checks.kernel_checks(0, "auto"))
    assert all(r.passed for r in res), [(r.name, r.detail) for r in res]


def test_auto_without_a_driver_does_not_import_torch():
    code = ("import sys; from attnscope import checks; checks._nvidia_driver_present = lambda: False; "
            "[r] = checks.kernel_checks(0, 'auto'); assert r.passed is None, r; "
            "assert 'torch' not in sys.modules")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- the one kernel-vs-reference rule; no environment writes -------------------------------------------
def test_kernel_tolerance_is_factor_times_torch_error_plus_slack():
    assert checks.kernel_tolerance(0.01) == pytest.approx(0.021)
    assert checks.kernel_tolerance(0.01, factor=checks.GRAD_FACTOR) == pytest.approx(0.031)
    assert checks.within_tolerance(0.021, 0.01) and not checks.within_tolerance(0.0211, 0.01)
    assert checks.within_tolerance(0.0305, 0.01, factor=3) and not checks.within_tolerance(float("nan"), 0.01)


def test_kernel_status_writes_no_environment(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    before = dict(os.environ)
    for mode in ("auto", "on", "off"):
        checks.kernel_status(mode)
    assert dict(os.environ) == before


def test_interpreter_wanted_only_for_on_without_a_gpu_before_triton_loads():
    assert not checks.interpreter_wanted("auto") and not checks.interpreter_wanted("off")
    code = ("import sys, os; from attnscope import checks; checks._nvidia_driver_present = lambda: False; "
            "assert checks.interpreter_wanted('on'); assert 'TRITON_INTERPRET' not in os.environ; "
            "import triton; assert not checks.interpreter_wanted('on')")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
