"""Evidence inputs: exact order-statistic bounds, histogram diffs and quantiles, profiler attention share."""

import json
import math
from pathlib import Path

import pytest

from attnscope.errors import InputError
from attnscope.report import attribution, evidence, schema

DATA = Path(__file__).parent / "data" / "report"


# ------------------------------------------------------------------------------------------ samples


def _cdf(k: int, n: int, p: float) -> float:
    """P(B <= k), B ~ Binomial(n, p), summed exactly (independent of scipy)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(0, k + 1)) if k >= 0 else 0.0


@pytest.mark.parametrize("n", [1, 5, 20, 58, 59, 60, 72, 100, 137, 400])
def test_order_stat_ranks_are_exact_and_tightest(n):
    lower, upper = evidence.order_stat_ranks(n)
    if upper is None:
        assert _cdf(n - 1, n, 0.95) < 0.95  # even the maximum is not a 95 % upper bound
    else:
        assert _cdf(upper - 1, n, 0.95) >= 0.95 > _cdf(upper - 2, n, 0.95)
    if lower is None:
        assert 1 - _cdf(0, n, 0.95) < 0.95
    else:
        assert 1 - _cdf(lower - 1, n, 0.95) >= 0.95 > 1 - _cdf(lower, n, 0.95)


def test_no_upper_bound_on_p95_below_59_samples():
    assert evidence.order_stat_ranks(58)[1] is None
    assert evidence.order_stat_ranks(59)[1] == 59


def _write(tmp_path, values, name="s.json"):
    """Samples in ms, the unit named by the key or the header."""
    p = tmp_path / name
    if name.endswith(".json"):
        p.write_text(json.dumps(values if isinstance(values, dict) else {"ttft_ms": values}))
    else:
        p.write_text("ttft_ms\n" + "\n".join(map(str, values)) + "\n")
    return p


def test_verdicts_accept_reject_inconclusive(tmp_path):
    p = _write(tmp_path, list(range(1, 101)))  # 1..100 ms; ranks for n = 100: lower 91, upper 99
    acc = evidence.samples(p, 100.0)
    assert (acc.p50, acc.p95, acc.p99) == (50, 95, 99)
    assert (acc.lower_bound, acc.upper_bound, acc.verdict) == (91, 99, "accept")
    assert evidence.samples(p, 90.0).verdict == "reject"  # lower bound 91 > 90
    mid = evidence.samples(p, 96.5)  # 96 % of samples at or below the target: decidable with more samples
    assert mid.verdict == "inconclusive" and mid.needed is not None and mid.needed > 100
    assert evidence.order_stat_ranks(mid.needed)[1] <= 0.96 * mid.needed  # by then u(n) <= n * F
    at = evidence.samples(p, 95.0)  # the observed p95 sits on the target: no sample size decides it
    assert at.verdict == "inconclusive" and at.needed is None


def test_few_samples_all_below_target_need_59(tmp_path):
    s = evidence.samples(_write(tmp_path, [100.0 + i for i in range(40)]), 350.0)
    assert s.verdict == "inconclusive" and s.upper_bound is None and s.needed == 59
    assert any("below 59 samples" in w for w in s.warnings)
    assert any("correlated" in w for w in s.warnings)


def test_fixture_samples_consistent_with_bounds():
    s = evidence.samples(DATA / "ttft_samples.csv", 350.0, 380.0)
    assert s.n == 120
    xs = sorted(float(r.split(",")[1]) for r in (DATA / "ttft_samples.csv").read_text().split()[1:])
    lo, up = evidence.order_stat_ranks(120)
    assert (s.lower_bound, s.upper_bound) == (xs[lo - 1], xs[up - 1])
    assert s.verdict == ("reject" if xs[lo - 1] > 350 else "accept" if xs[up - 1] <= 350 else "inconclusive")
    assert s.trace_percentile == pytest.approx(100 * sum(x <= 380.0 for x in xs) / 120)


def test_sample_file_formats(tmp_path):
    assert evidence.read_samples(_write(tmp_path, {"ttft_ms": [1, 2]}, "d.json")) == [1.0, 2.0]
    assert evidence.read_samples(_write(tmp_path, [3, 1.5], "s.csv")) == [3.0, 1.5]
    (tmp_path / "h.csv").write_text("ttft_s\n0.004\n0.5\n")
    assert evidence.read_samples(tmp_path / "h.csv") == [4.0, 500.0]
    (tmp_path / "bare.csv").write_text("4\n5\n")
    assert evidence.read_samples(tmp_path / "bare.csv", unit="s") == [4000.0, 5000.0]
    assert len(evidence.read_samples(DATA / "ttft_samples_small.json", unit="ms")) == 40
    # a `vllm bench serve --save-result --save-detailed` file: ttfts in seconds, failed requests left out
    (tmp_path / "vllm.json").write_text(json.dumps({"ttfts": [0.25, 0.0, 0.5], "errors": ["", "timeout", ""],
                                                   "mean_ttft_ms": 375.0}))
    assert evidence.read_samples(tmp_path / "vllm.json") == [250.0, 500.0]


@pytest.mark.parametrize("name, text, needle", [
    ("a.csv", "a,b\n1,2\n", "expected one column, or a header with a ttft_ms or ttft_s column"),
    ("b.csv", "ttft_ms\n1\nfast\n", "expected a plain decimal number on data row 2, got 'fast'"),
    ("c.json", '{"ttft_ms": [1, -2]}', "expected TTFT samples >= 0 (and finite), got -2 at ttft_ms[1]"),
    ("d.json", "{\"x\": 1}", "expected a JSON list of TTFT samples"),
    ("e.json", "[", "expected valid JSON"),
    ("g.csv", "1OO\n200\n", "expected a unit"),
    ("h.csv", "ttft_ms\n1OO\n200\n", "expected a plain decimal number on data row 1, got '1OO'"),
    ("i.csv", "ttft_ms\n1_000\n", "expected a plain decimal number on data row 1, got '1_000'"),
    ("j.json", "[1, 2]", "expected a unit: a ttft_ms or ttft_s column/key, or --samples-unit"),
    ("f.csv", "", "expected at least one TTFT sample, got none"),
])
def test_bad_samples(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match="--samples") as e:
        evidence.read_samples(tmp_path / name)
    assert needle in str(e.value)


# ------------------------------------------------------------------------------------------ metrics


@pytest.fixture(scope="module")
def hists():
    diffs = evidence.metrics(DATA / "vllm_before.prom", DATA / "vllm_after.prom", 350.0, 40.0)
    return {m.name: m for m in diffs}


def test_histograms_are_diffed_and_interpolated(hists):
    ttft = hists["vllm:time_to_first_token_seconds"]
    # AFTER - BEFORE: 40 in (0.1, 0.25], 156 in (0.25, 0.5], 4 in (0.5, 0.75] seconds
    assert ttft.hist.count == 200
    assert ttft.p50_ms == pytest.approx(250 + 250 * (100 - 40) / 156)
    assert ttft.p95_ms == pytest.approx(250 + 250 * (190 - 40) / 156)
    assert ttft.mean_ms == pytest.approx(70.0 / 200 * 1e3)
    itl = hists["vllm:inter_token_latency_seconds"]  # 24,400 in (0.01, 0.025], 800 in (0.025, 0.05]
    assert itl.hist.count == 25200
    assert itl.p95_ms == pytest.approx(10 + 15 * (0.95 * 25200) / 24400)
    assert set(hists) == set(evidence.VLLM_HISTOGRAMS)


def test_coarse_bucket_warning_and_decidable_target(hists):
    ttft = hists["vllm:time_to_first_token_seconds"]
    assert ttft.meets == "undecided"
    assert "(250, 500] ms" in ttft.warning and "cannot accept or reject" in ttft.warning
    itl = hists["vllm:inter_token_latency_seconds"]
    assert itl.meets == "yes" and itl.warning is None  # >= 95 % of tokens at or below 25 ms < 40 ms


def test_histogram_quantile_edges():
    h = evidence.Histogram((0.1, 0.2, math.inf), (0.0, 10.0, 20.0), 20.0, 3.0)
    assert h.quantile(0.25) == pytest.approx(0.15)  # rank 5 of the 10 in (0.1, 0.2]
    assert h.quantile(0.99) == 0.2  # rank in the +Inf bucket: the highest finite bound
    assert evidence._check_target(h, 0.15) == ("no", None)  # p95 is above 0.2 >= target
    ok = evidence.Histogram((0.1, 0.2, math.inf), (19.0, 20.0, 20.0), 20.0, 1.0)
    assert evidence._check_target(ok, 0.15) == ("yes", None)


def test_metrics_errors(tmp_path):
    with pytest.raises(InputError, match="counter that went down"):
        evidence.metrics(DATA / "vllm_after.prom", DATA / "vllm_before.prom", 350.0, 40.0)
    gauge = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n"
    (tmp_path / "g.prom").write_text(gauge)
    with pytest.raises(InputError, match="expected at least one vLLM histogram"):
        evidence.metrics(tmp_path / "g.prom", tmp_path / "g.prom", 350.0, 40.0)
    (tmp_path / "bad.prom").write_text("vllm:x{le=\"0.1\" 1.0\n")
    with pytest.raises(InputError, match="expected Prometheus text exposition format"):
        evidence.metrics(tmp_path / "bad.prom", DATA / "vllm_after.prom", 350.0, 40.0)
    with pytest.raises(InputError, match="got no new observations"):
        evidence.metrics(DATA / "vllm_after.prom", DATA / "vllm_after.prom", 350.0, 40.0)


# ------------------------------------------------------------------------------------------ profile


def test_profile_fixture_gpu_range():
    p = evidence.profile(DATA / "prefill_profile.json")
    assert p.span == "GPU range 'prefill'"
    assert p.span_ms == pytest.approx(290.0) and p.attention_ms == pytest.approx(116.0)
    assert p.share == pytest.approx(0.40)
    assert p.kernels == 20 and p.attention_kernels == 4  # the decode kernel after the range is left out


def test_profile_cpu_range_uses_correlation(tmp_path):
    d = json.loads((DATA / "prefill_profile.json").read_text())
    d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") != "gpu_user_annotation"]
    (tmp_path / "p.json").write_text(json.dumps(d))
    p = evidence.profile(tmp_path / "p.json")
    ks = [e for e in d["traceEvents"] if e["cat"] == "kernel" and "splitkv" not in e["name"]]
    extent = (max(e["ts"] + e["dur"] for e in ks) - min(e["ts"] for e in ks)) / 1e3
    assert p.kernels == len(ks) == 20
    assert p.span_ms == pytest.approx(extent)
    # the share is of kernel time (the kernels do not overlap here: their sum)
    assert p.busy_ms == pytest.approx(sum(e["dur"] for e in ks) / 1e3)
    assert p.share == pytest.approx(116.0 / p.busy_ms)


def test_profile_attention_range_counts_generic_kernels(tmp_path):
    ev = [
        {"ph": "X", "cat": "gpu_user_annotation", "name": "prefill", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "attention", "ts": 10, "dur": 50},
        {"ph": "X", "cat": "kernel", "name": "ampere_fp16_gemm_128x128", "ts": 10, "dur": 20},  # in attention
        {"ph": "X", "cat": "kernel", "name": "ampere_fp16_gemm_128x128", "ts": 40, "dur": 20},  # in attention
        {"ph": "X", "cat": "kernel", "name": "ampere_fp16_gemm_128x128", "ts": 70, "dur": 30},  # MLP
    ]
    (tmp_path / "t.json").write_text(json.dumps(ev))
    p = evidence.profile(tmp_path / "t.json")
    assert p.attention_kernels == 2 and p.share == pytest.approx(40 / 70)  # of the kernel time


def test_profile_errors(tmp_path):
    cpu_only = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1}]}
    (tmp_path / "n.json").write_text(json.dumps(cpu_only))
    with pytest.raises(InputError, match="expected GPU kernel events"):
        evidence.profile(tmp_path / "n.json")
    (tmp_path / "s.json").write_text("\"x\"")
    with pytest.raises(InputError, match="traceEvents list"):
        evidence.profile(tmp_path / "s.json")


def test_profile_share_replaces_the_trace_split():
    t = schema.parse(_half_split())
    assert t.attention_ms == pytest.approx(58.0)
    r = attribution.attribute(t, profile=evidence.profile(DATA / "prefill_profile.json"))
    assert r.attention_ms == pytest.approx(116.0)  # 40 % of 290 ms, measured
    assert round(r.boundary.outer_projected_ms, 2) == 302.67
    assert "torch.profiler" in r.attention_source


def _half_split() -> str:
    from attnscope.report.default_trace import DEFAULT_TRACE_YAML

    return DEFAULT_TRACE_YAML.replace("attention_ms: 116.0", "attention_share: 0.20")
