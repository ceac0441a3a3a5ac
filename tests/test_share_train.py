"""`share --train`: backward kernel names, a training step's share, its FLOPs, the loop, the CLI (CPU)."""

import json

import pytest

from attnscope import chrome_trace as ct
from attnscope.cli import main
from attnscope.measure import decoder
from attnscope.measure.share import ClosedLoop, LlamaShape, flops, share_from_trace
from attnscope.model.amdahl import speedup
from attnscope.model.flops import attention_flops


@pytest.mark.parametrize("name, fam", [
    ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8>, true>",
     "flash"),
    ("void flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>>", "flash"),
    ("void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>>", "flash"),
    ("fmha_cutlassB_f16_aligned_64x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<...>)",
     "efficient"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_20_64x128x128_4x1x1_kernel0_0",
     "cudnn"),
    ("_attnscope_bwd_preprocess", "attnscope"), ("_attnscope_bwd_dkdv_kernel", "attnscope"),
    ("_attnscope_bwd_hopper_dq_kernel", "attnscope"),
    # a naive backward: GEMMs and the softmax's backward, attention only through its range
    ("void (anonymous namespace)::softmax_warp_backward<c10::Half, c10::Half, float, 11, false>", "softmax"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_nt_n_tilesize128x128x64_cublas", "gemm"),
    ("cudnn_batchnorm_bwd_kernel", "other"),  # cuDNN, but no attention kernel
])
def test_backward_kernel_names(name, fam):
    assert ct.family(name) == fam
    assert ct.is_attention_kernel(name) is (fam in ct.FUSED)


def _k(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 9,
            "args": {"correlation": corr}}


def _launch(ts, corr, tid):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "tid": tid,
            "args": {"correlation": corr}}


def _range(name, ts, dur, tid):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": tid}


def _naive_training_step():
    """One layer's training step as the profiler records it: the forward on thread 1, the backward on
    autograd's thread 2; the naive attention's backward kernels have generic names."""
    ev = [_range("attnscope::train_step", 0, 100, 1), _range(decoder.ANNOTATION, 10, 20, 1),
          _range(decoder.BACKWARD, 200, 30, 2)]
    kernels = [  # (name, start, duration us, launch thread, launch time)
        ("gemm_qkv_fwd", 1000, 100, 1, 5), ("sm90_xmma_gemm_scores", 1100, 40, 1, 12),
        ("softmax_warp_forward", 1140, 20, 1, 14), ("sm90_xmma_gemm_pv", 1160, 40, 1, 16),
        ("gemm_mlp_fwd", 1200, 300, 1, 40),
        ("gemm_mlp_bwd", 1500, 600, 2, 150),                      # before the attention's backward
        ("sm90_xmma_gemm_dp", 2100, 80, 2, 205), ("softmax_warp_backward", 2180, 40, 2, 210),
        ("elementwise_where_mask_bwd", 2220, 20, 2, 215), ("sm90_xmma_gemm_dqdk", 2240, 100, 2, 220),
        ("gemm_qkv_bwd", 2340, 200, 2, 240),                      # after it: the QKV projection's
        ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<>", 2540, 60, 2, 260),  # by name, no range
    ]
    for i, (name, ts, dur, tid, launch) in enumerate(kernels):
        ev += [_k(name, ts, dur, i + 1), _launch(launch, i + 1, tid)]
    return {"traceEvents": ev}


def test_training_step_share_counts_forward_and_backward_attention():
    trace = _naive_training_step()
    s = ct.attention_share(trace)
    assert s.span.startswith("all kernels") and s.kernels == 12
    # forward 40 + 20 + 40; backward range 80 + 40 + 20 + 100; the flash_bwd kernel by its name 60
    assert s.attention_kernels == 8
    assert s.attention_ms == pytest.approx(0.400) and s.busy_ms == pytest.approx(1.600)
    shape = LlamaShape(layers=1)
    r = share_from_trace(trace, "naive", 1024, shape, train=True)
    assert r.train and r.f_time == pytest.approx(0.25)
    assert r.flop_share == flops(shape, 1024, train=True)["share"]
    assert r.to_json()["train"] is True
    # without its backward range the naive backward is not attention: only the forward and flash_bwd
    for e in trace["traceEvents"]:
        if e["name"] == decoder.BACKWARD:
            e["name"] = "autograd::engine"
    assert ct.attention_share(trace).attention_ms == pytest.approx(0.160)


def test_training_flops_are_forward_plus_backward():
    shape = LlamaShape(layers=2)
    fwd, step = flops(shape, 4096), flops(shape, 4096, train=True)
    assert step["attention"] == 3.5 * fwd["attention"]  # backward = 2.5 x forward (model/flops.py)
    assert step["attention"] == 2 * attention_flops(1, 32, 4096, 4096, 128, True, pass_="forward+backward")
    assert step["other"] == 3 * fwd["other"]  # a linear layer's backward: dX and dW, 2 x its forward
    assert step["total"] == step["attention"] + step["other"]
    assert step["share"] > fwd["share"]  # attention's backward costs more, relative to its forward
    a, o = 3.5 * fwd["attention"], 3 * fwd["other"]
    assert step["share"] == pytest.approx(a / (a + o))


def test_training_closed_loop_arithmetic():
    # f = 0.30 of the step; attention fwd+bwd 12 ms -> 4 ms (S = 3): 1 / (0.7 + 0.1) = 1.25x
    loop = ClosedLoop("naive", "attnscope", 4096, 2, 0.30, {"naive": 12.0, "attnscope": 4.0},
                      {"naive": 500.0, "attnscope": 420.0}, train=True)
    assert loop.s_kernel == 3.0 and loop.projected == pytest.approx(1.25)
    assert loop.projected == speedup(0.30, 3.0)
    assert loop.measured == pytest.approx(500 / 420)
    assert loop.error == pytest.approx(1.25 / (500 / 420) - 1)
    j = loop.to_json()
    assert j["train"] is True and j["projected_speedup"] == pytest.approx(1.25)


def _cpu_ops_by_range(att):
    """The autograd functions run inside each attention-backward range of a tiny CPU training step."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    small = LlamaShape(hidden=64, heads=4, head_dim=16, mlp=96, layers=2)
    model = decoder.build_decoder(small, att, device="cpu", dtype=torch.float64, train=True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 37, 64, dtype=torch.float64, generator=g)
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("attnscope::train_step"):
        model(x).backward(torch.randn(1, 37, 64, dtype=torch.float64, generator=g))
    assert all(w.grad is not None and torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0
               for w in model.weights)
    evs = list(prof.profiler.function_events)
    ranges = [e for e in evs if e.name == decoder.BACKWARD]
    ops = [e for e in evs if e.name.startswith("autograd::engine::evaluate_function: ")]
    return model, ranges, [{o.name.split(": ")[1] for o in ops if o.thread == r.thread
                            and r.time_range.start <= o.time_range.start < r.time_range.end}
                           for r in ranges]


def test_decoder_backward_range_holds_the_attention_backward_only():
    model, ranges, inside = _cpu_ops_by_range("naive")
    assert len(ranges) == 2  # one per layer
    for names in inside:
        assert {"BmmBackward0", "SoftmaxBackward0", "MaskedFillBackward0", "BaddbmmBackward0"} <= names
        # neither the MLP's, the projections' nor RoPE's backward
        assert not names & {"SiluBackward0", "MulBackward0", "CatBackward0", "MmBackward0",
                            "UnsafeViewBackward0", "AddBackward0"}, names


def test_training_decoder_computes_what_the_inference_decoder_does():
    torch = pytest.importorskip("torch")
    small = LlamaShape(hidden=64, heads=4, head_dim=16, mlp=96, layers=1)
    x = torch.randn(1, 19, 64, dtype=torch.float64)
    with torch.inference_mode():
        ref = decoder.build_decoder(small, "math", device="cpu", dtype=torch.float64)(x)
    trained = decoder.build_decoder(small, "math", device="cpu", dtype=torch.float64, train=True)
    assert all(w.requires_grad and w.is_leaf for w in trained.weights) and len(trained.weights) == 4
    assert (trained(x) - ref).abs().max().item() < 1e-12


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU message")
@pytest.mark.parametrize("argv", [["share", "--train"],
                                  ["share", "--train", "--attention", "naive", "--project-to", "attnscope"]])
def test_train_without_a_gpu_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("attnscope share: error: ") and ("CUDA" in err or "torch" in err)


@pytest.mark.parametrize("argv, needle", [
    (["share", "--train", "--prefill", "0"], "--prefill: expected a positive integer, got 0"),
    (["share", "--train", "--layers", "-2"], "--layers: expected a positive integer, got -2"),
    (["share", "--train", "--attention", "cudnn", "--project-to", "cudnn"],
     "--project-to: expected an attention other than --attention (cudnn), got 'cudnn'"),
])
def test_train_bad_arguments_one_line_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("attnscope share: error: ") and needle in err


def test_train_is_passed_on_and_labelled(monkeypatch, capsys):
    from attnscope.cli import gpu
    from attnscope.measure import share

    monkeypatch.setattr(gpu, "gpu_problem", lambda: None)
    seen = {}
    r = share.ShareResult("flash", 1024, 2, 30.0, 100.0, 0.05, 80, [("flash_bwd_dq_dk_dv", 9.0, True)],
                          train=True)

    def fake_loop(*a, **k):
        seen.update(k, args=a)
        return ClosedLoop("flash", "attnscope", 1024, 2, 0.30, {"flash": 3.0, "attnscope": 2.0},
                          {"flash": 100.0, "attnscope": 90.0}, r, train=True)

    monkeypatch.setattr(share, "closed_loop", fake_loop)
    assert main(["share", "--train", "-P", "1024", "--project-to", "attnscope"]) == 0
    out = capsys.readouterr().out
    assert seen["train"] is True and seen["args"][:3] == ("flash", "attnscope", 1024)
    assert "one training step" in out and "measured training step speedup" in out
    assert "forward + backward" in out and "1.111x" in out  # 100 / 90
    assert main(["share", "--train", "-P", "1024", "--project-to", "attnscope", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["train"] is True and doc["share"]["train"] is True
    assert doc["projected_speedup"] == pytest.approx(speedup(0.30, 1.5))


def test_step_functions_clear_gradients_between_steps():
    # the timed training step and attention-alone forward + backward: the same gradients on every call
    torch = pytest.importorskip("torch")
    from attnscope.measure.share import attention_step_fn, step_fn

    small = LlamaShape(hidden=64, heads=4, head_dim=16, mlp=96, layers=1)
    model = decoder.build_decoder(small, "naive", device="cpu", dtype=torch.float64, train=True)
    step = step_fn(model, torch.randn(1, 23, 64, dtype=torch.float64), train=True)
    step()
    first = [w.grad.clone() for w in model.weights]
    step()
    assert all(torch.equal(a, w.grad) for a, w in zip(first, model.weights, strict=True))
    qkv = [torch.randn(1, 4, 23, 16, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    fwd_bwd = attention_step_fn("naive", qkv, train=True)
    fwd_bwd()
    dq = qkv[0].grad.clone()
    fwd_bwd()
    assert torch.equal(dq, qkv[0].grad) and dq.abs().sum() > 0
    with torch.inference_mode():
        o = attention_step_fn("naive", [t.detach() for t in qkv], train=False)()
    assert o.shape == (1, 4, 23, 16)


def test_naive_mask_cached_in_inference_mode_serves_a_later_backward():
    # the serving loop (inference mode) and the training loop share naive's cached causal mask
    torch = pytest.importorskip("torch")
    from attnscope.measure.backends import naive_attention

    q, k, v = (torch.randn(1, 2, 41, 8, dtype=torch.float64) for _ in range(3))
    with torch.inference_mode():
        ref = naive_attention(q, k, v, causal=True)
    qg = q.clone().requires_grad_()
    out = naive_attention(qg, k, v, causal=True)
    out.sum().backward()
    assert torch.equal(out.detach(), ref) and torch.isfinite(qg.grad).all()
