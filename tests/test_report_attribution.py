"""The report's numbers on the spec's Document QA trace (expected values typed from the spec's exit task)."""

import math

import pytest

from attnscope.report import attribution, document, render, schema


@pytest.fixture(scope="module")
def rep():
    return attribution.attribute(schema.load())


def test_default_trace_matches_spec_table(rep):
    t = rep.trace
    assert t.ttft_ms == 380.0
    assert [round(100 * r.share, 1) for r in rep.rows] == [3.9, 17.1, 76.3, 2.6]
    assert [r.ms for r in rep.rows] == [15.0, 65.0, 290.0, 10.0]
    assert rep.attention_ms == 116.0 and t.prefill_ms - rep.attention_ms == 174.0
    assert t.tpot_ms == 32.0 and t.targets.tpot_ms == 40.0 and t.targets.tokens_per_s == 25.0
    assert t.targets.p95_ttft_ms == 350.0 and t.speedup == 3.0


def test_default_trace_projection(rep):
    b = rep.boundary
    assert b.f_inner == pytest.approx(0.40)
    assert round(b.inner_speedup, 4) == 1.3636
    assert round(b.inner_projected_ms, 2) == 212.67
    assert round(100 * b.inner_reduction, 2) == 26.67
    assert round(b.outer_projected_ms, 2) == 302.67
    assert round(b.outer_speedup, 4) == 1.2555
    assert round(100 * b.outer_reduction, 2) == 20.35
    assert round(rep.naive_ms, 1) == 126.7


def test_target_checks_for_this_trace_only(rep):
    assert not rep.ttft_meets_target  # 380.0 > 350
    assert rep.projected_meets_target  # 302.67 <= 350, conditional
    assert rep.tpot_meets_target  # 32.0 <= 40.0
    text = " ".join(rep.observations)
    assert "single trace says nothing about p95" in text


def test_flop_share_formula_matches_spec():
    # spec §5.1: 3.2 % at P = 2,048; exit task: ~6 % at P = 4,096 (nominal 8B, 32 layers, 32 heads, d = 128)
    dense, attn, share = attribution.flop_share(8.0e9, 2048, 128, 32, 32)
    assert dense == 16.0e9 and attn == 2 * 2048 * 128 * 32 * 32
    assert round(100 * share, 2) == 3.25
    assert round(100 * attribution.flop_share(8.0e9, 4096, 128, 32, 32)[2], 2) == 6.29


def test_sensitivity_rows_include_spec_rows_and_operating_point(rep):
    fs = [p.f for p in rep.sensitivity]
    assert fs == [0.15, 0.40, 0.65]  # the operating point 0.40 is one of the spec's rows
    assert math.isclose(rep.sensitivity[1].speedup, 1 / (0.6 + 0.4 / 3.0))
    t = schema.parse(_default_text().replace("attention_ms: 116.0", "attention_ms: 87.0"))  # f = 0.30
    assert [p.f for p in attribution.attribute(t).sensitivity] == [0.15, 0.30, 0.40, 0.65]


def test_markdown_states_every_worked_value(rep):
    md = render.markdown(document.build(rep))
    for s in ("380.0 ms", "3.9%", "17.1%", "76.3%", "2.6%", "1.3636×", "212.67 ms", "26.67%", "302.67 ms",
              "1.2555×", "20.35%", "126.7 ms", "32.0 ms", "40.0 ms", "6.3%"):
        assert s in md, s
    assert "2·P·d·heads·layers" in md  # the FLOP-share formula is stated
    for h in ("Workload", "Trace timings", "Observations", "Proposed change", "Projected impact",
              "Boundary errors", "Next measurement plan"):
        assert h in md


def test_unattributed_remainder_is_held_fixed():
    text = schema.parse(_default_text().replace("ms: 380.0", "ms: 400.0"))
    r = attribution.attribute(text)
    assert r.rows[-1].name == "Unattributed" and r.rows[-1].ms == pytest.approx(20.0)
    assert r.boundary.outer_projected_ms == pytest.approx(400.0 - (116.0 - 116.0 / 3.0))


def test_attention_share_field_gives_same_split():
    t = schema.parse(_default_text().replace("attention_ms: 116.0", "attention_share: 0.40"))
    assert t.attention_ms == pytest.approx(116.0)


def _default_text() -> str:
    from attnscope.report.default_trace import DEFAULT_TRACE_YAML

    return DEFAULT_TRACE_YAML
