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
from attnscope.inputs import distinct, write_all
from attnscope.inputs import out_dir as make_out_dir

FORMATS = ("md", "html", "both")


def build(trace_path=None, out_dir="attnscope-report", fmt: str = "both", samples_path=None,
          metrics_paths=None, profile_path=None, samples_unit=None, extra_files=None):
    """Write `report.md` and/or `report.html` into `out_dir`; return (document, [paths written]).

    trace_path: a YAML/JSON trace, defaults to the spec's Document QA trace. metrics_paths: (BEFORE,
    AFTER) Prometheus text scrapes. extra_files: {name: text} written into `out_dir` with the report.
    Every file is written or none (`inputs.write_all`); an output that is one of the inputs is refused
    before anything is read. Bad input raises `InputError` naming the field or the flag.
    """
    from attnscope.report import attribution, document, evidence, render, schema

    choice("--format", fmt, FORMATS)
    names = [*(["report.md"] if fmt in ("md", "both") else []), *(["report.html"] if fmt != "md" else []),
             *(extra_files or {})]
    before, after = metrics_paths or (None, None)
    distinct({f"--out {name}": Path(out_dir) / name for name in names},
             {"TRACE": trace_path, "--samples": samples_path, "--metrics BEFORE": before,
              "--metrics AFTER": after, "--profile": profile_path})
    trace = schema.load(trace_path)
    tg = trace.targets
    s = evidence.samples(samples_path, tg.p95_ttft_ms, trace.ttft_ms, samples_unit) if samples_path else None
    m = evidence.metrics(*metrics_paths, tg.p95_ttft_ms, tg.tpot_ms) if metrics_paths else None
    p = evidence.profile(profile_path) if profile_path else None
    report = attribution.attribute(trace, samples=s, metrics=m, profile=p)
    source = Path(trace_path).name if trace_path else "the spec's Document QA trace (synthetic)"
    doc = document.build(report, source)
    files = dict(extra_files or {})  # everything is rendered before the first byte is written
    if fmt in ("md", "both"):
        files["report.md"] = render.markdown(doc)
    if fmt in ("html", "both"):
        files["report.html"] = render.html_page(doc)
    out = make_out_dir(out_dir, "--out")
    return doc, write_all({out / name: text for name, text in files.items()}, "--out")
