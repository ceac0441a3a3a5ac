"""`attnscope report`: files written, paths printed last, bad input = one line on stderr and exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnscope.cli import main
from attnscope.report.default_trace import DEFAULT_TRACE_YAML

DATA = Path(__file__).parent / "data" / "report"


def _trace(tmp_path, edit=None, name="trace.yaml"):
    data = yaml.safe_load(DEFAULT_TRACE_YAML)
    if edit:
        edit(data)
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data, allow_unicode=True))
    return p


def _err(capsys, argv) -> str:
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("attnscope report: error: ")
    return lines[0]


def test_default_report_writes_both_and_prints_paths_last(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == [f"report: {out / 'report.md'}", f"report: {out / 'report.html'}"]
    assert "302.67 ms" in lines[0] and "1.2555x" in lines[0] and "212.67 ms" in lines[0]
    assert (out / "report.md").read_text().startswith("# Document QA")
    assert "<svg" in (out / "report.html").read_text()


def test_json_output_carries_the_numbers(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [round(100 * s["share"], 1) for s in d["segments"]] == [3.9, 17.1, 76.3, 2.6]
    assert round(d["boundary"]["outer_projected_ms"], 2) == 302.67
    assert round(d["boundary"]["inner_speedup"], 4) == 1.3636
    assert round(d["naive_ms"], 1) == 126.7
    assert d["ttft_meets_target_this_trace"] is False and d["tpot_meets_target"] is True
    assert d["paths"] == [str(tmp_path / "report.md"), str(tmp_path / "report.html")]


def test_json_and_page_come_from_one_document(tmp_path, capsys):
    """The JSON's numbers are the page's: every segment's ms and share, and the projection, as printed."""
    assert main(["report", "--out", str(tmp_path), "--format", "md", "--json",
                 "--samples", str(DATA / "ttft_samples_small.json")]) == 0
    d = json.loads(capsys.readouterr().out)
    page = Path(d["paths"][0]).read_text(encoding="utf-8")
    for seg in d["segments"]:
        assert f"| {seg['ms']:,.1f} | {100 * seg['share']:.1f}% |" in page, seg
    assert f"{d['boundary']['outer_projected_ms']:,.2f} ms ({d['boundary']['outer_speedup']:.4f}×)" in page
    assert f"(n = {d['samples']['n']})" in page and d["samples"]["verdict"] in page


def test_format_md_only_and_json_trace(tmp_path, capsys):
    p = _trace(tmp_path, name="trace.json")
    assert main(["report", str(p), "--out", str(tmp_path / "o"), "--format", "md"]) == 0
    assert [x.name for x in (tmp_path / "o").iterdir()] == ["report.md"]
    assert capsys.readouterr().out.strip().endswith("report.md")


def test_bad_format_is_argparse_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["report", "--format", "pdf", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "invalid choice: 'pdf'" in capsys.readouterr().err


def test_print_trace_is_the_default_trace(capsys):
    assert main(["report", "--print-trace"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(DEFAULT_TRACE_YAML)


def test_evidence_inputs_change_the_report(tmp_path, capsys):
    argv = ["report", "--out", str(tmp_path), "--samples", str(DATA / "ttft_samples.csv"),
            "--metrics", str(DATA / "vllm_before.prom"), str(DATA / "vllm_after.prom"),
            "--profile", str(DATA / "prefill_profile.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "p95 TTFT verdict from 120 samples: reject" in out
    md = (tmp_path / "report.md").read_text()
    assert "## 8. Evidence" in md and "Profiler split" in md and "AFTER − BEFORE" in md
    assert "unknown without a distribution" not in md  # the samples replaced that sentence
    assert "Server histogram: queue p50 159.6 ms" in md  # the queue assumption now cites the histogram
    page = (tmp_path / "report.html").read_text()  # the page says the same (one document, two renderings)
    assert "8 · Evidence" in page and "Profiler split" in page and "AFTER − BEFORE" in page
    assert "unknown without a distribution" not in page and "Server histogram: queue p50 159.6 ms" in page


# ------------------------------------------------------------------------------- bad input, one line each


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["segments"][1].update(ms=-5.0),
     "segments[1].ms: expected a finite duration >= 0 ms, got -5.0"),
    (lambda d: d["prefill"].update(attention_ms=300.0), "prefill.attention_ms: expected at most the prefill"),
    (lambda d: (d["prefill"].pop("attention_ms"), d["prefill"].update(attention_share=1.4)),
     "prefill.attention_share: expected a fraction in [0, 1]"),
    (lambda d: d["ttft"].update(ms=300.0), "ttft.ms: expected at least the segments' sum 380 ms"),
    (lambda d: d["change"].update(segment="GPU decode"), "change.segment: expected one of the segment names"),
    (lambda d: d["change"].update(speedup=0),
     "change.speedup: expected a kernel speedup S in [0.001, 1e+06], got 0"),
    (lambda d: d["change"].update(speedup=-2.0),
     "change.speedup: expected a kernel speedup S in [0.001, 1e+06], got -2.0"),
    (lambda d: d["workload"].update(layerz=32), "workload.layerz: unknown field"),
    (lambda d: d["workload"].pop("heads"), "workload.heads: missing required field"),
    (lambda d: d["workload"].update(d=0), "workload.d: expected a positive integer up to 10^12, got 0"),
    (lambda d: d["targets"].update(tpot_ms=50.0), "targets.tokens_per_s: expected 1000 / tpot_ms = 20"),
    (lambda d: d["segments"].append(dict(d["segments"][0])),
     "segments[4].name: expected a unique segment name"),
    (lambda d: d["prefill"].update(segment="nope"), "prefill.segment: expected one of the segment names"),
    (lambda d: d.update(segments=[]), "segments: expected a non-empty list"),
])
def test_bad_trace_one_line_exit_2(tmp_path, capsys, edit, needle):
    line = _err(capsys, ["report", str(_trace(tmp_path, edit)), "--out", str(tmp_path / "o")])
    assert needle in line
    assert not (tmp_path / "o").exists()  # nothing written on bad input


def test_change_on_other_segment_is_not_implemented(tmp_path, capsys):
    line = _err(capsys, ["report", str(_trace(tmp_path, lambda d: d["change"].update(
        segment="Server admission queue"))), "--out", str(tmp_path)])
    assert "change.segment: only the split prefill segment ('GPU prefill execution') is supported" in line


def test_yaml_is_loaded_safely(tmp_path, capsys):
    p = tmp_path / "evil.yaml"
    p.write_text("!!python/object/apply:os.system ['echo pwned > " + str(tmp_path / "pwned") + "']\n")
    line = _err(capsys, ["report", str(p), "--out", str(tmp_path)])
    assert "TRACE: expected valid YAML" in line
    assert not (tmp_path / "pwned").exists()


def test_unreadable_and_malformed_trace(tmp_path, capsys):
    assert "TRACE: expected a readable file" in _err(capsys, ["report", str(tmp_path / "none.yaml")])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert "TRACE: expected valid JSON" in _err(capsys, ["report", str(bad), "--out", str(tmp_path)])
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    line = _err(capsys, ["report", str(top), "--out", str(tmp_path)])
    assert "error: TRACE: expected a mapping, got 'list'" in line


def test_plain_report_imports_no_heavy_modules(tmp_path):
    code = ("import sys; from attnscope.cli import main; "
            f"assert main(['report', '--out', {str(tmp_path)!r}]) == 0; "
            "print(sorted(m for m in ('torch', 'triton', 'scipy', 'prometheus_client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
