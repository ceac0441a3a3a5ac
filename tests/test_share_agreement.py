"""`attnscope share` and `attnscope report --profile` give one share on every recorded H200 trace.

Both read the trace through attnscope/chrome_trace.py; this test holds them to it through their public
paths: share's JSON (share_from_trace, what `share --json` prints), the report's JSON and both pages.
"""

import gzip
import html
import json
import re
from pathlib import Path

import pytest

from attnscope.cli import main
from attnscope.measure.share import LlamaShape, share_from_trace

RECORDED = Path(__file__).parent / "data" / "measure" / "recorded" / "traces.json.gz"
TRACES = json.loads(gzip.decompress(RECORDED.read_bytes()))
PREFILLS = sorted(k for k in TRACES if k.startswith("prefill_"))


def test_there_are_recorded_prefill_traces():
    assert len(PREFILLS) >= 2


@pytest.mark.parametrize("key", PREFILLS)
def test_share_and_report_profile_agree(key, tmp_path, capsys):
    rec = TRACES[key]
    shared = share_from_trace(rec["trace"], key.removeprefix("prefill_"), rec["p"],
                              LlamaShape(layers=rec["layers"])).to_json()["f_time"]
    # the share the GPU run printed when it was recorded (before chrome_trace existed) is the same number
    assert abs(shared - rec["share"]["f_time"]) < 0.005
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(rec["trace"]))
    capsys.readouterr()
    assert main(["report", "--profile", str(path), "--out", str(tmp_path / "out"), "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)["profile"]["share"]
    assert abs(reported - shared) < 0.005
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    page = html.unescape((tmp_path / "out" / "report.html").read_text(encoding="utf-8"))
    on_md = re.search(r"kernels = ([0-9.]+)% of the prefill's kernel time", md)
    on_html = re.search(r"kernels = ([0-9.]+)% of the prefill's kernel time", page)
    assert on_md and on_html, "the page does not state the profiler share"
    for page in (on_md, on_html):
        assert abs(float(page.group(1)) / 100 - shared) < 0.005
