"""measure/share.py: FLOP share, the naive baseline, the decoder, f_time from a trace, the closed loop."""

import gzip
import json
from pathlib import Path

import pytest

from attnscope.measure import backends, decoder
from attnscope.measure.backends import backend_of, kernels_within
from attnscope.measure.share import ClosedLoop, LlamaShape, ShareResult, flops, share_from_trace

DATA = Path(__file__).parent / "data" / "measure"
RECORDED = DATA / "recorded"


def test_flop_share_matches_the_lessons_figures():
    s8b = LlamaShape(layers=32)
    # spec exit task: "Attention is ~6% of FLOPs at P = 4,096"; §5.1: 3.2 % at P = 2,048
    assert 0.055 < flops(s8b, 4096)["share"] < 0.07
    assert abs(flops(s8b, 2048)["share"] - 0.032) < 0.005
    # attention grows as P^2 and the rest as P: the attention/rest ratio doubles with P
    r = [flops(s8b, p)["attention"] / flops(s8b, p)["other"] for p in (4096, 8192)]
    assert r[1] == pytest.approx(2 * r[0], rel=1e-12)
    assert flops(s8b, 4096, causal=False)["attention"] == 2 * flops(s8b, 4096)["attention"]
    f = flops(s8b, 1024)
    assert f["total"] == f["attention"] + f["other"]


def test_shape_errors():
    with pytest.raises(ValueError, match=r"heads: expected heads x head_dim == hidden \(4096\), "
                                         r"got 30 x 128"):
        LlamaShape(heads=30)
    with pytest.raises(ValueError, match=r"layers: expected a positive integer, got 0"):
        LlamaShape(layers=0)
    with pytest.raises(ValueError, match=r"p: expected a positive integer, got -1"):
        flops(LlamaShape(), -1)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_attention_matches_sdpa(causal):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 97, 16, generator=g, dtype=torch.float64) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = backends.naive_attention(q, k, v, causal=causal)
    assert out.shape == (3, 2, 97, 16)
    assert (out - ref).abs().max().item() < 1e-12


def test_decoder_runs_and_uses_its_attention():
    torch = pytest.importorskip("torch")
    small = LlamaShape(hidden=64, heads=4, head_dim=16, mlp=96, layers=2)
    x = torch.randn(1, 37, 64, dtype=torch.float64)
    outs = {}
    with torch.inference_mode():
        for a in ("naive", "math"):
            outs[a] = decoder.build_decoder(small, a, device="cpu", dtype=torch.float64)(x)
    assert outs["naive"].shape == (1, 37, 64) and torch.isfinite(outs["naive"]).all()
    assert (outs["naive"] - outs["math"]).abs().max().item() < 1e-10  # same weights (seed), same math
    # causal: the first token's output cannot depend on later tokens
    y = x.clone()
    y[:, 10:] += 1.0
    with torch.inference_mode():
        out_y = decoder.build_decoder(small, "naive", device="cpu", dtype=torch.float64)(y)
    assert (out_y[:, :10] - outs["naive"][:, :10]).abs().max().item() < 1e-10
    assert (out_y[:, 10:] - outs["naive"][:, 10:]).abs().max().item() > 1e-3


def test_build_decoder_refuses_unknown_attention():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"attention: expected one of naive, flash, cudnn, efficient, math, "
                                         r"attnscope, got 'sdpa'"):
        decoder.build_decoder(LlamaShape(hidden=64, heads=4, head_dim=16, mlp=96, layers=1), "sdpa",
                            device="cpu")


def test_share_from_handmade_trace():
    trace = json.loads((DATA / "trace_handmade.json").read_text())
    r = share_from_trace(trace, "flash", 4096, LlamaShape(layers=1))
    # prefill kernels: correlation 1-4 (300 + 150 + 50 + 100 us); attention: 2 and 3 (150 + 50 us)
    assert r.kernels == 4
    assert r.total_ms == pytest.approx(0.6) and r.attention_ms == pytest.approx(0.2)
    assert r.f_time == pytest.approx(1 / 3)
    assert r.top[0][1] == pytest.approx(0.3) and r.top[0][2] is False
    assert [a for _, _, a in r.top].count(True) == 2
    assert r.flop_share == flops(LlamaShape(layers=1), 4096)["share"]
    assert r.to_json()["f_time"] == pytest.approx(1 / 3)


def test_closed_loop_arithmetic_is_the_exit_task():
    # spec exit task: f = 0.40, S = 3.00 -> 1.3636x; a prefill of 290.0 ms going to 212.67 ms
    loop = ClosedLoop("naive", "attnscope", 4096, 32, 0.40, {"naive": 3.0, "attnscope": 1.0},
                      {"naive": 290.0, "attnscope": 212.67})
    assert loop.s_kernel == 3.0
    assert loop.projected == pytest.approx(1.3636, abs=1e-4)
    assert loop.measured == pytest.approx(290.0 / 212.67)
    assert abs(loop.error) < 1e-4
    slower = ClosedLoop("naive", "attnscope", 4096, 32, 0.40, {"naive": 3.0, "attnscope": 1.0},
                        {"naive": 290.0, "attnscope": 250.0})
    assert slower.error > 0  # Amdahl promised more than the swap delivered
    assert slower.to_json()["projected_speedup"] == pytest.approx(1.3636, abs=1e-4)


def test_closed_loop_splits_its_error_between_the_kernel_in_the_step_and_the_rest():
    # the kernel times alone and the steps of FLASH -> attnscope at P = 16k as measured (bench/results/
    # h200-2026-12-02c-closed-loops.json: 1.94 x alone, the step 1.09 x against Amdahl's 1.16 x); the
    # candidate's profile is made up: its attention 1.59 x in its step, the rest of its step 0.3 ms longer
    base = ShareResult("flash", 16384, 2, 12.73, 43.93, 0.22, 104)
    cand = ShareResult("attnscope", 16384, 2, 8.0, 39.5, 0.22, 100)
    loop = ClosedLoop("flash", "attnscope", 16384, 2, base.f_time, {"flash": 6.734, "attnscope": 3.469},
                      {"flash": 46.96, "attnscope": 42.98}, base, False, cand)
    assert loop.s_in_step == pytest.approx(12.73 / 8.0)
    assert loop.projected_in_step == pytest.approx(1 / (1 - base.f_time + base.f_time * 8.0 / 12.73))
    assert loop.projected > loop.projected_in_step > loop.measured  # most of it: the kernel in the step
    assert loop.rest_ms == pytest.approx({"flash": 43.93 - 12.73, "attnscope": 39.5 - 8.0})
    j = loop.to_json()
    assert j["s_in_step"] == loop.s_in_step and j["candidate_share"]["attention_ms"] == 8.0
    assert loop.host_gap_ms == pytest.approx({"flash": 46.96 - 43.93, "attnscope": 42.98 - 39.5})
    assert loop.measured_graph is None and j["error_graph"] is None  # no replays timed
    assert loop.measured_sustained is None and j["error_sustained"] is None
    loop.sustained_ms = {"flash": 48.3, "attnscope": 44.3}
    assert loop.measured_sustained == pytest.approx(48.3 / 44.3)
    assert loop.to_json()["error_sustained"] == pytest.approx(loop.projected / (48.3 / 44.3) - 1)
    loop.graph_ms = {"flash": 44.0, "attnscope": 38.0}
    assert loop.measured_graph == pytest.approx(44.0 / 38.0)
    assert loop.to_json()["error_graph"] == pytest.approx(loop.projected / (44.0 / 38.0) - 1)
    alone = ClosedLoop("flash", "attnscope", 16384, 2, 0.29, {"flash": 6.7, "attnscope": 3.5},
                       {"flash": 47.0, "attnscope": 43.0}, base)
    assert alone.s_in_step is None and alone.projected_in_step is None and alone.rest_ms is None
    assert alone.host_gap_ms is None
    assert alone.to_json()["candidate_share"] is None


def test_projection_on_kernel_time_is_amdahl_with_s_in_f_times_unit():
    # the training loop naive -> attnscope at P 4k as measured (bench/results/h200-2026-12-04-train-loops
    # .txt): alone, events 9.49 / 1.56 ms; on kernel time made up here as 9.2 / 1.15 ms
    loop = ClosedLoop("naive", "attnscope", 4096, 2, 0.4353, {"naive": 9.487, "attnscope": 1.561},
                      {"naive": 42.15, "attnscope": 25.02}, train=True)
    assert loop.s_kernel_busy is None and loop.projected_busy is None and loop.error_busy is None
    assert loop.to_json()["error_busy"] is None and loop.error_busy_graph is None
    loop.kernel_busy_ms = {"naive": 9.2, "attnscope": 0.0}  # a profile without the candidate's kernels
    assert loop.s_kernel_busy is None and loop.to_json()["error_busy"] is None
    loop.kernel_busy_ms = {"naive": 9.2, "attnscope": 1.15}
    assert loop.s_kernel_busy == pytest.approx(8.0)
    assert loop.projected_busy == pytest.approx(1 / (1 - 0.4353 + 0.4353 / 8.0))
    assert loop.error_busy == pytest.approx(loop.projected_busy / (42.15 / 25.02) - 1)
    assert loop.projected < loop.projected_busy  # the events' S (6.08) counts the GPU idle of a call alone
    assert abs(loop.error_busy) < abs(loop.error)
    assert loop.error_busy_graph is None  # a training step is not replayed
    loop.graph_ms = {"naive": 40.0, "attnscope": 24.0}
    assert loop.to_json()["error_busy_graph"] == pytest.approx(loop.projected_busy / (40.0 / 24.0) - 1)


def test_paired_kernel_time_profiles_each_call_alone_interleaved_and_counts_overlaps_once(monkeypatch):
    from attnscope.measure import share

    calls = []

    def fn(name, kernels):  # each call's kernels: [(start us, duration us)], one list per call
        it = iter(kernels)

        def run():
            calls.append(name)
            return next(it)
        return run

    def profile(f, annotation="attnscope::call"):  # the trace of one call: its kernels as X events
        return {"traceEvents": [{"cat": "kernel", "ph": "X", "name": f"k{i}", "ts": ts, "dur": dur}
                                for i, (ts, dur) in enumerate(f())]}

    monkeypatch.setattr(share, "profile_trace", profile)
    a = fn("a", [[(0, 1)], [(0, 100), (50, 100)], [(0, 300)], [(10, 100), (500, 100)]])  # warm-up, 3 timed
    b = fn("b", [[(0, 1)], [(0, 50)], [(0, 70)], [(0, 10), (20, 10)]])
    ms = share.paired_kernel_ms({"a": a, "b": b}, reps=3)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    # a: 150 (two kernels overlapping by 50 us), 300, 200 -> median 200 us; b: 50, 70, 20 -> 50 us
    assert ms == pytest.approx({"a": 0.2, "b": 0.05})


def test_host_aware_projection_is_amdahl_when_device_bound_and_follows_the_host_when_host_bound():
    # device-bound: issuing a step (5 ms) is shorter than its device time (40 ms): plain Amdahl
    base = ShareResult("naive", 1024, 2, 10.0, 40.0, 0.2, 100)
    loop = ClosedLoop("naive", "attnscope", 1024, 2, 0.25, {"naive": 4.0, "attnscope": 1.0},
                      {"naive": 41.0, "attnscope": 33.0}, base, host_us={"naive": 30.0, "attnscope": 40.0},
                      issue_ms={"naive": 5.0, "attnscope": 5.02})
    assert loop.projected_host_aware == pytest.approx(40.0 / (40.0 * (0.75 + 0.25 / 4)))
    assert loop.projected_host_aware == pytest.approx(loop.projected)
    # host-bound: issuing takes 3 ms against 2.5 ms of kernels; the swap adds 2 x 10 us of host per step
    base = ShareResult("naive", 1024, 2, 0.45, 2.5, 0.2, 100)
    loop = ClosedLoop("naive", "attnscope", 1024, 2, 0.18, {"naive": 0.3, "attnscope": 0.067},
                      {"naive": 3.45, "attnscope": 3.6}, base, graph_ms={"naive": 2.48, "attnscope": 2.1},
                      host_us={"naive": 30.0, "attnscope": 40.0}, issue_ms={"naive": 3.0, "attnscope": 3.02})
    dev_b = 2.48 * (1 - 0.18 + 0.18 / (0.3 / 0.067))  # the graph replay is the baseline's device time
    assert loop.projected_host_aware == pytest.approx(3.0 / max(3.0 + 2 * 10.0 / 1e3, dev_b))
    assert loop.projected_host_aware < 1.0 < loop.projected  # the host says slower; Amdahl said faster
    assert loop.to_json()["error_host_aware"] == pytest.approx(loop.projected_host_aware / (3.45 / 3.6) - 1)
    assert ClosedLoop("naive", "attnscope", 1024, 2, 0.18, {"naive": 0.3, "attnscope": 0.067},
                      {"naive": 3.45, "attnscope": 3.6}, base).projected_host_aware is None


def _recorded(name):
    path = RECORDED / name
    if not path.exists():
        return None
    with (gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else open(path)) as f:
        return json.load(f)


@pytest.mark.skipif(_recorded("traces.json.gz") is None, reason="no recorded traces yet")
@pytest.mark.parametrize("attention, backend", [("flash", "flash"), ("naive", "math")])
def test_recorded_prefill_trace(attention, backend):
    rec = _recorded("traces.json.gz")[f"prefill_{attention}"]
    r = share_from_trace(rec["trace"], attention, rec["p"], LlamaShape(layers=rec["layers"]))
    assert "share" in rec, "the recording could not read f_time from this trace"
    assert r.f_time == pytest.approx(rec["share"]["f_time"], abs=1e-5)  # a union of float intervals
    assert 0.0 < r.f_time < 1.0 and r.kernels >= 10 * rec["layers"]
    attn = kernels_within(rec["trace"], decoder.ANNOTATION)
    assert backend_of([k.name for k in attn]) == backend


@pytest.mark.skipif(_recorded("closed_loop.json") is None, reason="no recorded closed loop yet")
def test_recorded_closed_loop_is_consistent():
    from attnscope.model.amdahl import speedup

    # a run that failed is recorded as {"p": ..., "error": "<message>"}; a finished run's "error" is the
    # relative error of the projection (a float)
    runs = [r for r in _recorded("closed_loop.json")["runs"] if "projected_speedup" in r]
    assert runs
    for r in runs:
        assert r["p"] == r["share"]["p"] and r["f_time"] == pytest.approx(r["share"]["f_time"])
        s = r["kernel_ms"][r["baseline"]] / r["kernel_ms"][r["candidate"]]
        assert r["projected_speedup"] == pytest.approx(speedup(r["f_time"], s))
        measured = r["prefill_ms"][r["baseline"]] / r["prefill_ms"][r["candidate"]]
        assert r["measured_speedup"] == pytest.approx(measured)
        assert r["error"] == pytest.approx(r["projected_speedup"] / r["measured_speedup"] - 1)


def test_a_trace_without_attention_kernels_is_refused():
    trace = json.loads((DATA / "trace_handmade.json").read_text())
    for e in trace["traceEvents"]:
        if e.get("name") == "attnscope::attention":
            e["name"] = "something else"
    with_fused = share_from_trace(trace, "flash", 4096, LlamaShape(layers=1))
    assert with_fused.attention_ms == pytest.approx(0.2)  # no range: the fused kernels' names still count
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel" and ("flash" in e["name"] or "attnscope" in e["name"]):
            e["name"] = "void some_generic_kernel<float>"
    with pytest.raises(ValueError, match="expected attention kernels in the prefill"):
        share_from_trace(trace, "flash", 4096, LlamaShape(layers=1))


def test_paired_timing_interleaves_the_functions_and_takes_each_ones_median(monkeypatch):
    # CUDA events faked on a clock that each call advances by its function's cost: the order of the calls
    # (warm-up, then one of each per round, reversed every other round) and the medians are what is checked
    import torch

    from attnscope.measure.share import paired_time_ms

    clock, calls = [0.0], []

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    def fn(name, costs):
        it = iter(costs)

        def run():
            calls.append(name)
            clock[0] += next(it)
        return run

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    a = fn("a", [9.0, 9.0, 1.0, 2.0, 3.0, 4.0])   # 2 warm-up, then 4 timed
    b = fn("b", [9.0, 9.0, 10.0, 30.0, 20.0, 40.0])
    ms = paired_time_ms({"a": a, "b": b}, warmup=2, reps=4)
    assert calls == ["a", "a", "b", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert ms == {"a": 3.0, "b": 30.0}  # the upper median of each function's 4 timings
    calls.clear()
    a = fn("a", [1.0, 3.0, 2.0, 2.0])  # no warm-up, bursts of 2: the mean of each burst
    b = fn("b", [5.0, 7.0, 9.0, 9.0])
    ms = paired_time_ms({"a": a, "b": b}, warmup=0, reps=2, burst=2)
    assert calls == ["a", "a", "b", "b", "b", "b", "a", "a"] and ms == {"a": 2.0, "b": 9.0}


@pytest.mark.gpu
def test_gpu_closed_loop_runs_both_steps_eager_and_as_graph_replays():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from attnscope.measure.share import closed_loop

    loop = closed_loop("flash", "attnscope", p=512, layers=1, reps=3)
    names = {"flash", "attnscope"}
    for times in (loop.kernel_ms, loop.prefill_ms, loop.graph_ms, loop.sustained_ms, loop.host_us,
                  loop.issue_ms, loop.kernel_busy_ms):
        assert set(times) == names and all(t > 0 for t in times.values())
    assert loop.graph_note is None and loop.candidate_share.attention == "attnscope"
    assert 0 < loop.f_time < 1 and 0 < loop.candidate_share.f_time < 1
    # a replay has no host path: it is not slower than the eager step by more than timing noise
    assert all(loop.graph_ms[n] <= 1.1 * loop.prefill_ms[n] for n in names)
    assert loop.to_json()["error_graph"] == pytest.approx(loop.projected / loop.measured_graph - 1)
    # a call's kernel time is at most its events' time (which also counts the GPU idle around its launches)
    assert all(loop.kernel_busy_ms[n] <= 1.05 * loop.kernel_ms[n] for n in names)
