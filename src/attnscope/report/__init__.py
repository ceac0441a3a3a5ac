"""The latency attribution report: a serving trace in, a defended one-page projection out.

    schema.py       load and validate the trace (YAML or JSON); default_trace.py: the spec's Document QA trace
    evidence.py     optional inputs: client TTFT samples, vLLM histograms, a torch.profiler trace
    attribution.py  the numbers (Amdahl via model/amdahl.py) and the sentences that state them
    document.py     the report as one document (sections, tables, figures.py's SVG shapes), built once
    render.py       that document as Markdown and as one self-contained HTML page (Jinja2 templates/)

`build(...)` runs them in order and writes the files. No torch; scipy and prometheus_client only
when their evidence is given.
"""

from __future__ import annotations

from pathlib import Path

from attnscope.errors import choice
from attnscope.inputs import out_dir as make_out_dir
from attnscope.inputs import write_all

FORMATS = ("md", "html", "both")


def build(trace_path=None, out_dir="attnscope-report", fmt: str = "both", samples_path=None,
          metrics_paths=None, profile_path=None, samples_unit=None):
    """Write `report.md` and/or `report.html` into `out_dir`; return (document, [paths written]).

    trace_path: a YAML/JSON trace, defaults to the spec's Document QA trace. metrics_paths: (BEFORE,
    AFTER) Prometheus text scrapes. Bad input raises `InputError` naming the field or the flag.
    """
    from attnscope.report import attribution, document, evidence, render, schema

    choice("--format", fmt, FORMATS)
    trace = schema.load(trace_path)
    tg = trace.targets
    s = evidence.samples(samples_path, tg.p95_ttft_ms, trace.ttft_ms, samples_unit) if samples_path else None
    m = evidence.metrics(*metrics_paths, tg.p95_ttft_ms, tg.tpot_ms) if metrics_paths else None
    p = evidence.profile(profile_path) if profile_path else None
    report = attribution.attribute(trace, samples=s, metrics=m, profile=p)
    source = Path(trace_path).name if trace_path else "the spec's Document QA trace (synthetic)"
    doc = document.build(report, source)
    files = {}  # everything is rendered before the first byte is written: all or nothing
    if fmt in ("md", "both"):
        files["report.md"] = render.markdown(doc)
    if fmt in ("html", "both"):
        files["report.html"] = render.html_page(doc)
    out = make_out_dir(out_dir, "--out")
    return doc, write_all({out / name: text for name, text in files.items()}, "--out")
