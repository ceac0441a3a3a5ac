"""measure/backends.py: the kernel-name table, the backend rule, and reading profiler traces (CPU).

Recorded fixtures (tests/data/measure/recorded/, written on the H200 by bench/record_fixtures.py) are
used when present; the handmade ones (*_handmade*) hold names in the shapes torch builds print.
"""

import json
from pathlib import Path

import pytest

from attnscope import chrome_trace
from attnscope.measure import backends
from attnscope.measure.backends import backend_of, family, kernels, kernels_within

DATA = Path(__file__).parent / "data" / "measure"
RECORDED = DATA / "recorded"

FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
         "cutlass::half_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t> >, false, true, false, "
         "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
SPLITKV = "void pytorch_flash::flash_fwd_splitkv_kernel<...>(pytorch_flash::Flash_fwd_params)"
EFFICIENT = ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
             "cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)")
CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"
GEMM = "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
SOFTMAX = ("void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 12, false, false>"
           "(c10::Half *, const c10::Half *, int, int, int, const bool *, int, bool)")
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>"


@pytest.mark.parametrize("name, fam", [
    (FLASH, "flash"), (SPLITKV, "flash"), ("flash_fwd_splitkv_combine_kernel", "flash"),
    (EFFICIENT, "efficient"), (CUDNN, "cudnn"), ("_attnscope_fwd_kernel", "attnscope"),
    ("_attnscope_decode_split_kernel", "attnscope"), (GEMM, "gemm"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nt", "gemm"),
    ("cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x3_nn_align8", "gemm"),
    (SOFTMAX, "softmax"), ("void at::native::cunn_SoftMaxForward<8, c10::Half, float>(...)", "softmax"),
    (ELEMENTWISE, "other"), ("triton_poi_fused_add_0", "other"),
])
def test_family_table(name, fam):
    assert family(name) == fam


def test_fused_names_win_over_their_gemm_like_parts():
    # the mem-eff kernel's name says "cutlass" and cuDNN's says "flash": the fused family must win
    assert "cutlass" in EFFICIENT.lower() and family(EFFICIENT) == "efficient"
    assert "flash" in CUDNN.lower() and family(CUDNN) == "cudnn"


@pytest.mark.parametrize("names, backend", [
    ([FLASH], "flash"), ([SPLITKV, "flash_fwd_splitkv_combine_kernel"], "flash"),
    ([ELEMENTWISE, EFFICIENT], "efficient"), ([CUDNN], "cudnn"), (["_attnscope_fwd_kernel"], "attnscope"),
    ([GEMM, ELEMENTWISE, SOFTMAX, GEMM], "math"),
    ([GEMM, GEMM], "unknown"), ([SOFTMAX], "unknown"), ([], "unknown"),
    ([FLASH, EFFICIENT], "mixed"),
])
def test_backend_rule(names, backend):
    assert backend_of(names) == backend


def test_trace_kernels_and_annotation_ranges():
    trace = json.loads((DATA / "trace_handmade.json").read_text())
    ks = kernels(trace)
    assert [k.correlation for k in ks] == [1, 2, 3, 4, 6, 5]  # start order; the instant event is ignored
    assert ks[0].dur_us == 300.0
    inside = kernels_within(trace, "attnscope::attention")
    # launched at ts 150 (runtime) and 250 (driver, Triton) on the annotation's thread; not corr 6,
    # launched in the same time window but on another thread
    assert [k.correlation for k in inside] == [2, 3]
    assert backend_of([k.name for k in inside]) == "mixed"
    prefill = kernels_within(trace, "attnscope::prefill")
    assert sorted(k.correlation for k in prefill) == [1, 2, 3, 4]
    assert kernels_within(trace, "no such range") == []


def test_load_trace_gz_roundtrip(tmp_path):
    trace = json.loads((DATA / "trace_handmade.json").read_text())
    backends.save_trace(trace, str(tmp_path / "t.json.gz"))
    assert chrome_trace.load(tmp_path / "t.json.gz") == trace


def test_which_validates_before_touching_the_gpu():
    with pytest.raises(ValueError, match=r"backend: expected one of flash, cudnn, efficient, math, "
                                         r"attnscope, auto, got 'fast'"):
        backends.which("fast")
    with pytest.raises(ValueError, match=r"heads: expected a positive integer, got 0"):
        backends.which("flash", heads=0)


@pytest.mark.skipif(not (RECORDED / "kernels.json").exists(), reason="no recorded kernel names yet")
def test_recorded_kernel_names_classify_as_the_backend_that_ran():
    calls = json.loads((RECORDED / "kernels.json").read_text())["calls"]
    checked = 0
    for c in calls:
        names = [k["name"] for k in c.get("kernels", [])]
        if not names:
            continue
        asked = c["asked"]
        want = {"naive": "math"}.get(asked, asked)
        if asked == "auto":
            assert backend_of(names) in ("flash", "efficient", "cudnn", "math"), names
        else:
            assert backend_of(names) == want, (asked, c["shape"], names)
        if "ok" in c:
            assert c["ok"] == (asked == "auto" or c["ran"] == asked)
        checked += 1
    assert checked >= 8


@pytest.mark.skipif(not (RECORDED / "traces.json.gz").exists(), reason="no recorded traces yet")
def test_recorded_which_trace():
    traces = chrome_trace.load(RECORDED / "traces.json.gz")
    t = traces["which_flash_fp16"]
    ks = kernels_within(t["trace"], t["annotation"])
    assert ks and backend_of([k.name for k in ks]) == "flash"
    assert all(k.dur_us > 0 for k in ks)


def test_annotation_falls_back_to_its_gpu_range_when_no_launch_is_linked():
    # a trace without driver-API launch events (Triton kernels then have no CPU-side launch): the
    # range's GPU projection decides
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "attnscope::attention", "tid": 1, "ts": 10, "dur": 5},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "attnscope::attention", "tid": 7, "ts": 100,
         "dur": 60},
        {"ph": "X", "cat": "kernel", "name": "_attnscope_fwd_kernel", "ts": 110, "dur": 40, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "gemm_after", "ts": 170, "dur": 40, "args": {"correlation": 9}},
    ]}
    assert [k.name for k in kernels_within(trace, "attnscope::attention")] == ["_attnscope_fwd_kernel"]


@pytest.mark.parametrize("impl", ["math", "naive"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_fn_on_the_cpu(impl, causal):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(2, 3, 33, 16, dtype=torch.float64) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = backends.attention_fn(impl, causal)(q, k, v)
    assert (out - ref).abs().max().item() < 1e-12


def test_host_us_per_call_times_back_to_back_calls():
    """`measure.bench.host_us_per_call`: 20 warm-up calls per callable, then rounds of ``n`` timed calls of
    each in turn, synchronised around each timed loop; the median round's µs per call."""
    import time
    from types import SimpleNamespace

    from attnscope.measure.bench import host_us_per_call

    order, syncs, counts = [], [], {"a": 0, "b": 0}
    fake = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: syncs.append(1)))

    def call(name):
        counts[name] += 1
        if not order or order[-1] != name:
            order.append(name)
        if name == "b" and len(order) == 4:  # b's first timed round: one slow loop, left out by the median
            time.sleep(0.002)
    calls = {name: (lambda name=name: call(name)) for name in counts}
    out = host_us_per_call(fake, calls, 50, rounds=3)
    assert counts == {"a": 170, "b": 170} and len(syncs) == 12
    assert order == ["a", "b"] * 4  # warm-ups, then the rounds interleaved
    assert set(out) == {"a", "b"} and all(0 < us < 30 for us in out.values()), out


def test_ref_error_with_a_window_checks_the_last_rows_under_the_one_mask():
    """`measure.bench._ref_error(window=...)`: the benchmarks' float64 check of a windowed call, the last rows
    of a longer key range bottom-right aligned (`reference.permitted`), GQA heads mapped; 0 for the exact
    answer, large for the answer of another window; without a window the causal path is unchanged."""
    torch = pytest.importorskip("torch")
    from attnscope import reference
    from attnscope.measure.bench import _ref_error

    torch.manual_seed(1)
    q = torch.randn(1, 4, 50, 16, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 70, 16, dtype=torch.float64) for _ in range(2))
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)

    def exact(causal, window):
        keep = torch.as_tensor(reference.permitted(50, 70, causal, window))
        s = (q @ kk.transpose(-1, -2) / 4).masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1).nan_to_num(0.0) @ vv

    for causal, window in ((True, (9, 0)), (False, (3, 5)), (False, (0, 0))):
        o = exact(causal, window)
        assert _ref_error(torch, o, q, k, v, causal, rows=20, window=window) < 1e-12
        assert _ref_error(torch, exact(causal, (30, 30)), q, k, v, causal, rows=20, window=window) > 1e-2
    o = exact(True, None)
    assert _ref_error(torch, o, q, k, v, True, rows=20) < 1e-12
