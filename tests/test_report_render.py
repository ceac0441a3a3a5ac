"""The report rendered once: one Document, the same sections and tables in Markdown and in HTML, every
input string escaped, nothing fetched, one printed page (headless Chromium)."""

import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from attnscope.errors import InputError
from attnscope.report import attribution, build, document, render, schema
from attnscope.report.default_trace import DEFAULT_TRACE_YAML

DATA = Path(__file__).parent / "data" / "report"
EVIL = "<script>alert(1)</script>"
ALL_EVIDENCE = (DATA / "ttft_samples.csv", (DATA / "vllm_before.prom", DATA / "vllm_after.prom"),
                DATA / "prefill_profile.json")


def _pages_of(trace=None, source="test"):
    doc = document.build(attribution.attribute(trace or schema.load()), source=source)
    return render.markdown(doc), render.html_page(doc)


def _evil_trace():
    d = yaml.safe_load(DEFAULT_TRACE_YAML)
    d["title"] = EVIL
    d["workload"]["model"] = '"><img src=x onerror=alert(2)>'
    d["segments"][0].update(name=EVIL, source="a & b < c", note="| pipe |")
    d["segments"][2]["name"] = "GPU <b>prefill</b>"
    d["prefill"]["segment"] = d["change"]["segment"] = "GPU <b>prefill</b>"
    d["change"]["description"] = "</style><script>x()</script>"
    return schema.validate(d)


def test_input_strings_render_as_text_in_html():
    _, page = _pages_of(_evil_trace(), source=EVIL)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower() and "<img" not in page and "<b>prefill" not in page
    assert "&lt;/style&gt;" in page and page.count("</style>") == 1
    assert "a &amp; b &lt; c" in page


def test_input_strings_are_neutralised_in_markdown():
    md, _ = _pages_of(_evil_trace())
    assert "<script" not in md and "<img" not in md
    assert "&lt;script&gt;" in md and "\\| pipe \\|" in md  # pipes cannot break the table


def test_control_and_bidi_characters_are_shown_not_obeyed_on_both_pages():
    # the trace refuses them, but evidence files (a kernel name, a histogram label) reach the renderers
    doc = document.Document("t\u202e", "s", document.para("x"), (document.Section(
        "A\x07", (document.Paragraph(document.para("evil\u202eexe", ("\x1b[31m", "warn"))),)),),
        document.para("f\u2066"))
    for page in (render.markdown(doc), render.html_page(doc)):
        assert not re.search("[\x00-\x08\x0b-\x1f\u202e\u2066]", page)
        for code in ("202E", "0007", "001B", "2066"):
            assert f"&lt;U+{code}&gt;" in page, code


def _md_tables(md: str) -> list[list[list[str]]]:
    tables, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not all(re.fullmatch(r"-+:?", c) for c in cells):
                cur.append([html.unescape(re.sub(r"\\(.)", r"\1", c.replace("**", ""))) for c in cells])
        elif cur:
            tables, cur = tables + [cur], []
    return tables


def _html_tables(page: str) -> list[list[list[str]]]:
    return [[[html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
             for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)]
            for table in re.findall(r"<table.*?</table>", page, re.S)]


@pytest.mark.parametrize("evidence", [False, True], ids=["plain", "all-evidence"])
def test_markdown_and_html_say_the_same_thing(tmp_path, evidence):
    _, paths = build(None, tmp_path, "both", *(ALL_EVIDENCE if evidence else (None, None, None)))
    md, page = (p.read_text(encoding="utf-8") for p in paths)
    md_heads = re.findall(r"^## (\d+)\. (.+)$", md, re.M)
    html_heads = [tuple(html.unescape(h).split(" · ", 1)) for h in re.findall(r"<h2>(.*?)</h2>", page)]
    assert md_heads == html_heads and len(md_heads) == (8 if evidence else 7)
    assert _md_tables(md) == _html_tables(page)  # every table, cell for cell
    assert len(_md_tables(md)) == (3 if evidence else 2)  # segments, sensitivity, evidence
    for text in ("1.3636×", "302.67 ms", "126.7 ms", "attnscope which"):
        assert text in md and text in page, text


def test_page_is_self_contained(tmp_path):
    _, paths = build(None, tmp_path, "html", *ALL_EVIDENCE)
    page = paths[0].read_text()
    for bad in ("src=", "href=", "url(", "@import", "<link", "<script", "<iframe"):
        assert bad not in page, bad
    assert set(re.findall(r"https?://[^\s\"']+", page)) == {"http://www.w3.org/2000/svg"}  # namespace only
    assert page.count("<svg") == 2  # the stacked TTFT bar and the Amdahl curve


def _svgs(page: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", page, re.S)


def test_charts_carry_the_numbers():
    md, page = _pages_of()
    bar, curve = _svgs(page)
    assert ">116.0<" in bar and ">38.67<" in bar  # attention before and after S = 3
    assert ">380.0<" in bar and ">302.67<" in bar  # the two totals
    # every number on the bars is printed as the Markdown tables print it (one formatter)
    labels = re.findall(r'class="(?:val|lbl tot)"[^>]*>([0-9.,]+)<', bar)
    assert len(labels) >= 6 and all(x in md for x in labels), labels
    assert "1.3636×" in curve and "6.3%" in curve  # operating point and FLOP-share point


# --------------------------------------------------------------------------------------- one page


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _pages(page: Path, tmp_path: Path, size: str | None) -> int:
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("headless Chromium is required in CI for the one-page test: apt-get install chromium")
        pytest.skip("chromium not installed (apt-get install chromium)")
    if size:  # force the paper size; without it Chromium prints on its default (Letter)
        page = page.with_name(f"{page.stem}-{size}.html")
        src = page.with_name("report.html").read_text()
        page.write_text(src.replace("@page {", f"@page {{ size: {size};", 1))
    pdf = tmp_path / f"{page.stem}.pdf"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--print-to-pdf={pdf}",
                    "--no-pdf-header-footer", page.as_uri()], check=True, capture_output=True, timeout=120)
    return len(re.findall(rb"/Type\s*/Page(?!s)", pdf.read_bytes()))


@pytest.mark.parametrize("samples", [None, "ttft_samples.csv", "ttft_samples_small.json"],
                         ids=["default", "all-evidence", "all-evidence-few-samples"])
def test_report_prints_on_one_page(tmp_path, samples):
    extra = ((DATA / samples, (DATA / "vllm_before.prom", DATA / "vllm_after.prom"),
              DATA / "prefill_profile.json") if samples else (None, None, None))
    _, paths = build(None, tmp_path, "html", *extra)
    for size in (None, "A4"):
        assert _pages(paths[0], tmp_path, size) == 1, size


def test_page_counter_counts_pages(tmp_path):
    long = tmp_path / "report.html"
    long.write_text("<html><body>" + "<p>line</p>" * 400 + "</body></html>")
    assert _pages(long, tmp_path, None) > 1  # the counter can fail


# --------------------------------------------------------------------- new-user fixes (issue 12)


def test_markdown_links_control_and_bidi_characters_are_neutralised():
    d = yaml.safe_load(DEFAULT_TRACE_YAML)
    d["segments"][0]["name"] = "[x](javascript:alert(1)) ![i](http://e/x.png) `code`"
    md, _ = _pages_of(schema.validate(d))
    assert "[x](javascript" not in md and "![i](" not in md  # no live link or image
    assert "\\[x\\](javascript:alert(1))" in md and "\\!\\[i\\]" in md and "\\`code\\`" in md
    # control and bidi characters are refused where the trace is read, naming the field
    d["segments"][1]["note"] = "evil\u202eexe.txt\x07bell\x1b[31m"
    with pytest.raises(InputError, match=r"segments\[1\]\.note: expected printable text"):
        schema.validate(d)


def test_target_label_stays_inside_the_chart_when_ttft_is_near_the_target():
    d = yaml.safe_load(DEFAULT_TRACE_YAML)
    d["targets"]["p95_ttft_ms"] = 380.125  # the trace's TTFT: the target line sits at the bars' right end
    bar = _svgs(_pages_of(schema.validate(d))[1])[0]
    width = float(re.search(r'viewBox="0 0 (\d+)', bar).group(1))
    target = re.search(r'<text x="([0-9.]+)" y="[0-9.-]+" text-anchor="(\w+)" class="tick tgt">([^<]*)<',
                       bar)
    x, anchor, text = float(target.group(1)), target.group(2), target.group(3)
    extent = 5.0 * len(text)  # 7 pt sans: under 5 px a character
    lo = {"start": x, "middle": x - extent / 2, "end": x - extent}[anchor]
    assert lo >= 0 and lo + extent <= width, (anchor, x, text)  # the whole label inside the chart
    line_x = float(re.search(r'<line x1="([0-9.]+)"[^>]*class="target"', bar).group(1))
    total = re.search(r'<text x="([0-9.]+)" y="[0-9.]+" class="lbl tot">380.0<', bar)
    assert float(total.group(1)) + 5.0 * len("380.0") <= width + 0.5
    assert float(total.group(1)) > line_x  # the total starts after the target line, not under it


def test_svg_never_gets_inf_or_nan():
    d = yaml.safe_load(DEFAULT_TRACE_YAML)
    d["change"]["speedup"] = 1e308
    try:
        r = attribution.attribute(schema.validate(d))
    except ValueError as e:  # refused by the trace's own checks: one line naming the field
        assert "speedup" in str(e)
        return
    with pytest.raises(ValueError, match=r"^speedup: expected a kernel speedup between 1e-06 and 1e\+06 to "
                                         r"draw, got 1e\+308$"):
        document.build(r)


def test_the_plan_asks_for_the_samples_it_computed(tmp_path):
    doc, (path,) = build(None, tmp_path, "md", DATA / "ttft_samples_small.json")
    s = doc.data["samples"]
    if s["verdict"] != "inconclusive" or not s["needed"]:
        pytest.skip(f"fixture verdict is {s['verdict']}")
    page = path.read_text(encoding="utf-8")
    assert f"about {s['needed']:,} independent client TTFT samples" in page and "at least 59" not in page


def test_single_trace_ttft_is_not_called_within_a_p95_target():
    r = attribution.attribute(schema.load())
    assert "TTFT 380.0 ms is above the p95 target of 350 ms (one request, not a p95)" in r.observations[0]
