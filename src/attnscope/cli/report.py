"""`attnscope report`: the one-page latency attribution report (report/; CPU, no torch).

A trace (YAML/JSON; default: the spec's Document QA trace) in, Markdown and a self-contained HTML page
out, the paths printed last. Optional evidence: client TTFT samples, two vLLM metric scrapes, a
torch.profiler Chrome trace.
"""

from __future__ import annotations

from pathlib import Path

from attnscope.cli._out import path_arg, print_json
from attnscope.errors import visible
from attnscope.report import FORMATS, build
from attnscope.report.default_trace import DEFAULT_TRACE_YAML

DEFAULT_OUT = "attnscope-report"


def configure(sub) -> None:
    """Add `report` to `sub` (argparse subparsers)."""
    p = sub.add_parser("report",
                       help="one-page latency attribution report (Markdown + HTML) from a serving trace",
                       description="Turn a serving trace, an attention time share and a kernel speedup into "
                                   "a one-page latency attribution report: segment shares, Amdahl at the "
                                   "prefill and client TTFT boundaries, the boundary errors, a next "
                                   "measurement plan.")
    p.add_argument("trace", nargs="?", metavar="TRACE", default=None, type=path_arg,
                   help="trace file, YAML or JSON (schema: README; template: --print-trace); "
                        "default: the spec's Document QA trace")
    p.add_argument("--out", metavar="DIR", default=DEFAULT_OUT, type=path_arg,
                   help=f"output directory for report.md / report.html (default: ./{DEFAULT_OUT}, with its "
                        "own .gitignore); files are written atomically, never through a symlink")
    p.add_argument("--format", default="both", choices=FORMATS,
                   help="what to write (default: both)")
    p.add_argument("--samples", metavar="FILE", default=None, type=path_arg,
                   help="client TTFT samples: a CSV with a ttft_ms or ttft_s column, a JSON "
                        "{\"ttft_ms\": [...]} or {\"ttft_s\": [...]}, or a `vllm bench serve --save-result "
                        "--save-detailed` result (its ttfts); p50/p95/p99, exact 95%% CI for p95, "
                        "accept/reject/inconclusive against the target")
    p.add_argument("--samples-unit", choices=("ms", "s"), default=None,
                   help="unit of --samples values when the file does not name it (bare numbers)")
    p.add_argument("--metrics", nargs=2, metavar=("BEFORE", "AFTER"), default=None, type=path_arg,
                   help="two Prometheus text scrapes of a vLLM server, before and after the run: "
                        "histograms diffed, quantiles interpolated within buckets")
    p.add_argument("--profile", metavar="FILE", default=None, type=path_arg,
                   help="torch.profiler Chrome trace JSON: the attention kernels' share of the prefill's "
                        "kernel time (as `attnscope share`) replaces the trace's assumed split")
    p.add_argument("--json", action="store_true",
                   help="print the report's numbers as JSON, with the paths of the files (still written)")
    p.add_argument("--print-trace", action="store_true",
                   help="print the default trace (a template for your own) and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.print_trace:
        print(DEFAULT_TRACE_YAML, end="")
        return 0
    fresh_default = args.out == DEFAULT_OUT and not Path(DEFAULT_OUT).exists()
    # like .pytest_cache: the default output directory keeps itself out of git
    extra = {".gitignore": "# created by attnscope report\n*\n"} if fresh_default else None
    doc, paths = build(args.trace, args.out, args.format, args.samples, args.metrics, args.profile,
                       samples_unit=args.samples_unit, extra_files=extra)
    paths = [p for p in paths if p.name != ".gitignore"]
    d, b = doc.data, doc.data["boundary"]
    if args.json:
        print_json(d | {"paths": [str(p) for p in paths]})
        return 0
    print(f"TTFT {d['ttft_ms']:.1f} ms -> projected {b['outer_projected_ms']:.2f} ms "
          f"({b['outer_speedup']:.4f}x, {100 * b['outer_reduction']:.2f} % reduction); "
          f"prefill {b['inner_ms']:.1f} -> {b['inner_projected_ms']:.2f} ms ({b['inner_speedup']:.4f}x)")
    if "samples" in d:
        print(f"p95 TTFT verdict from {d['samples']['n']} samples: {d['samples']['verdict']}")
    for path in paths:
        print(f"report: {visible(str(path))}")
    return 0
