"""Write a `Document` (document.py) as Markdown and as one self-contained HTML page.

The HTML comes from the Jinja2 templates in report/templates/ with autoescaping on: every string,
from an input file or not, is escaped on its way out, and the page fetches nothing (inline CSS, inline
SVG) and prints on one A4 or Letter page. The Markdown backslash-escapes the syntax that would make
text into a link, an image, code or a table cell. Both show control and bidi characters as a visible
<U+XXXX>. Neither formats a number: document.py did.
"""

from __future__ import annotations

import html
import re
from functools import cache

from markupsafe import Markup

from attnscope.report.document import Document

# Control characters (C0, DEL, C1) and the bidi controls that reorder what follows them (U+202A-U+202E,
# U+2066-U+2069, U+200E/F, U+061C): shown as a visible <U+XXXX> instead of acting on the page.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Markdown syntax that would make text from an input file into a link, an image, code or a tag.
_MD_SYNTAX = re.compile(r"([\\`*_\[\]!|])")


def _visible(s: object) -> str:
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group()):04X}>", str(s))


def _md(s: object) -> str:
    """Markdown-safe text: control and bidi characters shown as <U+XXXX>, raw HTML escaped, and every
    character Markdown reads as link, image, code or emphasis syntax (and table pipes) backslash-escaped."""
    return _MD_SYNTAX.sub(r"\\\1", html.escape(_visible(s), quote=False))


def _md_runs(runs) -> str:
    return "".join(_md(r.text) if not r.style else f" ⚠ {_md(r.text.strip())}" if r.style == "warn"
                   else f"**{_md(r.text)}**" for r in runs).strip()


def _md_block(b) -> list[str]:
    if b.kind == "para":
        return [f"*{_md_runs(b.runs)}*" if b.small else _md_runs(b.runs), ""]
    if b.kind == "bullets":
        return [f"- {_md_runs(item)}" for item in b.items] + [""]
    if b.kind == "code":
        return ["```", *(_visible(x) for x in b.lines), "```", ""]
    if b.kind == "table":
        def row(cells, bold=False):
            return "| " + " | ".join(f"**{_md(c)}**" if bold and c else _md(c) for c in cells) + " |"

        return ([f"**{_md(b.caption)}**", ""] if b.caption else []) + [
            row(b.head), "| " + " | ".join("---:" if n else "---" for n in b.numeric) + " |",
            *(row(r, i in b.strong) for i, r in enumerate(b.rows)), ""]
    return []  # a figure: the HTML draws it; its numbers are in the section's text and tables


def markdown(doc: Document) -> str:
    """The document as Markdown (figures left out: their numbers are in the text)."""
    out = [f"# {_md(doc.title)}", "", f"*{_md(doc.subtitle)}.*", "", f"> {_md_runs(doc.summary)}", ""]
    for i, s in enumerate(doc.sections, 1):
        out += [f"## {i}. {_md(s.title)}", ""]
        for b in s.blocks + s.aside:
            out += _md_block(b)
    out += ["---", "", f"*{_md_runs(doc.footer)}*"]
    return "\n".join(out).rstrip() + "\n"


@cache  # one Environment per process: the templates are compiled once
def _env():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("attnscope.report", "templates"), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        finalize=lambda v: v if isinstance(v, Markup) else _visible(v))


def html_page(doc: Document) -> str:
    """The document as one self-contained HTML page (templates/report.html.j2)."""
    return _env().get_template("report.html.j2").render(doc=doc)
