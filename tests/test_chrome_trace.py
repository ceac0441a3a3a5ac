"""attnscope/chrome_trace.py: the one trace reader, the attention rule, the share, hostile events."""

import gzip
import json
import math
import time

import pytest

from attnscope import chrome_trace as ct
from attnscope.errors import InputError


def _k(name, ts, dur, corr=None, **kw):
    e = {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return {**e, **kw}


def _r(name, ts, dur, cat="gpu_user_annotation", tid=7):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


@pytest.mark.parametrize("name, attention", [
    ("attnscope::attention", True), ("attention", True), ("self_attn", True), ("Attention.forward", True),
    ("attnscope::prefill", False), ("attnscope", False), ("attnscope_mlp", False), ("attentional", False),
    ("prefill", False),
])
def test_attention_range_rule_is_whole_words(name, attention):
    assert ct.is_attention_range(name) is attention


def test_an_attnscope_prefill_range_is_not_attention():
    # the headline bug: a prefix rule counted every kernel of attnscope::prefill as attention
    ev = [_r("attnscope::prefill", 0, 100), _r("attnscope::attention", 10, 20),
          _k("gemm_qkv", 0, 10), _k("ampere_gemm", 10, 20), _k("mlp_gemm", 30, 70)]
    s = ct.attention_share({"traceEvents": ev})
    assert s.kernels == 3 and s.attention_kernels == 1
    assert s.attention_ms == pytest.approx(0.020) and s.busy_ms == pytest.approx(0.100)
    assert s.share == pytest.approx(0.20)


def test_fused_kernel_names_count_without_a_range():
    ev = [_k("void pytorch_flash::flash_fwd_kernel<...>", 0, 30), _k("_attn_fwd", 30, 10),
          _k("_attnscope_fwd_kernel", 40, 10), _k("sm90_xmma_gemm", 50, 50)]
    s = ct.attention_share(ev)
    assert s.attention_kernels == 3 and s.share == pytest.approx(0.5)
    assert s.span.startswith("all kernels")


def test_overlapping_streams_count_once():
    ev = [_k("flash_fwd_a", 0, 50), _k("flash_fwd_b", 25, 50), _k("gemm", 75, 25)]
    s = ct.attention_share(ev)
    assert s.attention_ms == pytest.approx(0.075) and s.busy_ms == pytest.approx(0.100)


@pytest.mark.parametrize("field, value, needle", [
    ("dur", float("nan"),
     r"traceEvents\[1\]\.dur: expected a finite number >= 0, at most 1e\+12 µs, got nan"),
    ("dur", float("inf"),
     r"traceEvents\[1\]\.dur: expected a finite number >= 0, at most 1e\+12 µs, got inf"),
    ("dur", True, r"traceEvents\[1\]\.dur: expected a finite number >= 0, at most 1e\+12 µs, got True"),
    ("dur", -5, r"traceEvents\[1\]\.dur: expected a finite number >= 0, at most 1e\+12 µs, got -5"),
    ("dur", "10", r"traceEvents\[1\]\.dur: expected a finite number >= 0, at most 1e\+12 µs, got 10"),
    ("ts", None, r"traceEvents\[1\]\.ts: expected a finite number within ±1e\+16 µs, got None"),
    ("dur", None, r"traceEvents\[1\]\.dur: expected a finite number >= 0, at most 1e\+12 µs, got None"),
    ("ts", -math.inf, r"traceEvents\[1\]\.ts: expected a finite number within ±1e\+16 µs, got -inf"),
    ("args", [1, 2], r"traceEvents\[1\]\.args: expected an object, got list"),
    ("args", "x", r"traceEvents\[1\]\.args: expected an object, got str"),
    ("name", 3, r"traceEvents\[1\]\.name: expected a string, got int"),
])
def test_hostile_events_are_one_line_errors(field, value, needle):
    bad = _k("flash_fwd", 10, 10)
    if value is None:
        bad.pop(field)
    else:
        bad[field] = value
    trace = {"traceEvents": [_k("gemm", 0, 10), bad]}
    with pytest.raises(InputError, match="^--profile t.json: " + needle) as e:
        ct.attention_share(trace, "--profile t.json")
    assert "\n" not in str(e.value)


def test_events_of_other_categories_are_not_checked():
    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "dur": "junk"}, "not an event", 5,
                             _k("flash_fwd", 0, 10), _k("gemm", 10, 10)]}
    assert ct.attention_share(trace).share == pytest.approx(0.5)


def test_empty_and_attention_free_traces_are_refused():
    with pytest.raises(InputError, match=r'^t: expected GPU kernel events \(cat "kernel"\), got none'):
        ct.attention_share({"traceEvents": []}, "t")
    with pytest.raises(InputError, match=r"^t: expected attention kernels in the prefill"):
        ct.attention_share([_k("gemm", 0, 10)], "t")
    with pytest.raises(InputError, match=r"^t: expected a Chrome trace with a traceEvents list, got str"):
        ct.attention_share("x", "t")
    with pytest.raises(InputError, match=r"^t: expected kernels inside the prefill span"):
        ct.attention_share([_r("prefill", 0, 10), _k("flash_fwd", 50, 10)], "t")


def test_load_reads_gz_and_refuses_bad_files(tmp_path):
    trace = {"traceEvents": [_k("flash_fwd", 0, 10)]}
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    assert ct.load(tmp_path / "t.json.gz") == trace
    (tmp_path / "b.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(InputError, match=r"^--profile b.json: expected UTF-8"):
        ct.load(tmp_path / "b.json", "--profile b.json")
    (tmp_path / "j.json").write_text("{")
    with pytest.raises(InputError, match=r"^x: expected valid JSON"):
        ct.load(tmp_path / "j.json", "x")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=r"^x: expected JSON nested at most"):
        ct.load(tmp_path / "deep.json", "x")
    with pytest.raises(InputError, match=r"^x: expected a readable file"):
        ct.load(tmp_path / "missing.json", "x")


def test_cpu_ranges_match_launches_by_correlation_on_their_thread():
    ev = [_r("attnscope::prefill", 0, 1000, "user_annotation", tid=1),
          _r("attnscope::attention", 100, 100, "user_annotation", tid=1),
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 50, "dur": 1, "tid": 1,
           "args": {"correlation": 1}},
          {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 150, "dur": 1, "tid": 1,
           "args": {"correlation": 2}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 160, "dur": 1, "tid": 2,
           "args": {"correlation": 3}},  # another thread: not in these ranges
          _k("gemm", 2000, 30, 1), _k("generic", 2030, 10, 2), _k("other", 2040, 500, 3)]
    s = ct.attention_share(ev)
    assert s.kernels == 2 and s.attention_kernels == 1 and s.share == pytest.approx(0.25)
    assert [k.correlation for k in ct.kernels_within(ev, "attnscope::attention")] == [2]


def test_range_matching_is_not_quadratic():
    n = 40_000
    ev = [_r("prefill", 0, 10 * n)]
    for i in range(n):
        ev.append(_r("attention", 10 * i, 5))
        ev.append(_k("gemm", 10 * i, 5))
        ev.append(_k("mlp", 10 * i + 5, 5))
    t0 = time.perf_counter()
    s = ct.attention_share(ev)
    assert time.perf_counter() - t0 < 3.0  # a quadratic match would take minutes
    assert s.attention_kernels == n and s.share == pytest.approx(0.5)


def test_every_launched_kernel_is_named_as_attnscope():
    """Each Triton / Gluon kernel src/attnscope launches (``name[grid](...)``) carries the ``_attnscope_``
    prefix, so `chrome_trace.family` counts it as attnscope's attention in `attnscope share`, `which` and
    `report --profile` (a portable backward once ran as ``_bwd_dkdv_kernel``: its time was not counted)."""
    import pathlib
    import re

    root = pathlib.Path(ct.__file__).parent
    # a decorator's argument list may span lines (``do_not_specialize=[...]``)
    jit = re.compile(r"@(?:triton|gluon)\.jit(?:\([^)]*\))?[^\n]*\n(?:@[^\n]*\n)*def (\w+)\(")
    sources = {path.name: path.read_text() for path in sorted(root.rglob("*.py"))}
    every = "\n".join(sources.values())
    launched = []
    for file, src in sources.items():
        for name in jit.findall(src):  # launched as ``name[grid](...)`` or planned (`_direct.planned_launch`)
            if re.search(rf"(?<![\w]){name}\[|planned_launch\((?:\w+\.)?{name}\b", every):
                launched.append((file, name))
    assert len(launched) >= 16, launched  # forward, backward (Hopper too), decode, varlen, plan kernels
    wrong = [(f, n) for f, n in launched if ct.family(n) != "attnscope"]
    assert not wrong, wrong
