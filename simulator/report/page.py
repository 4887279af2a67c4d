"""The HTML page: sections of charts, tables and notes, with everything it needs inside it.

The page holds, each once: the report's data (`<script type="application/json"
id="servesim-data">`, what the unit tests read back), each figure's Plotly JSON, the light and
dark Plotly templates, plotly.js itself (gzip-compressed and base64-encoded: 2.0 MB instead of
4.8 MB), the style sheet and a short script that unpacks plotly.js, draws the figures and sorts
tables. It loads nothing from the network, and the same input gives the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

from ..version import package_version
from .figures import Chart, fmt


@dataclass
class Table:
    caption: str
    headers: list[str]
    rows: list[list[Any]]


@dataclass
class Section:
    """One part of the page. `note` replaces the content of a section that does not apply."""

    sid: str
    title: str
    intro: str = ""
    html: str = ""
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    after_charts: str = ""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def table_html(table: Table) -> str:
    numeric = [
        any(_is_number(row[i]) for row in table.rows)
        and all(_is_number(row[i]) or row[i] is None for row in table.rows)
        for i in range(len(table.headers))
    ]
    head = "".join(
        f'<th scope="col"{" class=num" if numeric[i] else ""}><button type="button">'
        f"{esc(h)}</button></th>"
        for i, h in enumerate(table.headers)
    )
    body = []
    for row in table.rows:
        cells = []
        for i, value in enumerate(row):
            if numeric[i]:
                sort = "" if value is None or not math.isfinite(value) else repr(float(value))
                cells.append(f'<td class="num" data-sort="{sort}">{esc(fmt(value))}</td>')
            else:
                cells.append(f"<td>{esc(fmt(value))}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<div class="table-wrap"><table class="sortable"><caption>{esc(table.caption)}'
        f"</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def card(label: str, value: str, sub: str = "") -> str:
    sub_html = f'<div class="sub">{esc(sub)}</div>' if sub else ""
    return (
        f'<div class="card"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(value)}</div>{sub_html}</div>'
    )


def _chart_html(chart: Chart) -> str:
    layout = chart.figure.layout
    title = layout.title.text if layout.title and layout.title.text else chart.fid
    wide = " wide" if chart.wide else ""
    caption = f"<figcaption>{esc(chart.caption)}</figcaption>" if chart.caption else ""
    return (
        f'<figure class="chart{wide}"><div class="plot" id="{esc(chart.fid)}" role="img" '
        f'aria-label="{esc(title)}"></div>{caption}</figure>'
    )


def section_html(section: Section) -> str:
    parts = [f'<section id="{esc(section.sid)}" aria-labelledby="{esc(section.sid)}-h">']
    parts.append(f'<h2 id="{esc(section.sid)}-h">{esc(section.title)}</h2>')
    if section.intro:
        parts.append(f'<p class="intro">{esc(section.intro)}</p>')
    parts.extend(f'<p class="note">{esc(n)}</p>' for n in section.notes)
    parts.append(section.html)
    if section.charts:
        parts.append('<div class="charts">')
        parts.extend(_chart_html(c) for c in section.charts)
        parts.append("</div>")
    parts.append(section.after_charts)
    parts.extend(table_html(t) for t in section.tables)
    parts.append("</section>")
    return "".join(parts)


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element: no `<` can close it early."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def figure_json(chart: Chart) -> dict[str, Any]:
    """The figure's data and layout, without the template (the page applies one of two)."""
    fig = json.loads(chart.figure.to_json())
    fig.get("layout", {}).pop("template", None)
    return {"data": fig.get("data", []), "layout": fig.get("layout", {})}


@cache
def templates() -> dict[str, Any]:
    """Plotly's white and dark templates, both with transparent backgrounds (the page's
    card colour shows through)."""
    import plotly.io as pio
    from plotly.io.json import to_json_plotly

    out = {}
    for name, source in (("light", "plotly_white"), ("dark", "plotly_dark")):
        tpl = json.loads(to_json_plotly(pio.templates[source].to_plotly_json()))
        tpl["layout"]["paper_bgcolor"] = "rgba(0,0,0,0)"
        tpl["layout"]["plot_bgcolor"] = "rgba(0,0,0,0)"
        out[name] = tpl
    return out


@cache
def packed_plotly_js() -> str:
    """plotly.js from the installed plotly package, gzip-compressed (fixed mtime, so the
    bytes never change) and base64-encoded."""
    from plotly.offline import get_plotlyjs

    raw = get_plotlyjs().encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def _asset(name: str) -> str:
    return files("simulator.report").joinpath("assets", name).read_text(encoding="utf-8")


def render(title: str, subtitle: list[str], sections: list[Section], data: dict[str, Any]) -> str:
    """The whole page as one string."""
    import plotly

    charts = [c for s in sections for c in s.charts]
    ids = [c.fid for c in charts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate figure ids: {ids}")
    nav = "".join(f'<li><a href="#{esc(s.sid)}">{esc(s.title)}</a></li>' for s in sections)
    subtitle_html = "".join(f"<p>{esc(line)}</p>" for line in subtitle)
    loading = '<p id="loading" role="status">Drawing the charts…</p>' if charts else ""
    return "".join(
        [
            "<!DOCTYPE html>\n",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            '<meta name="color-scheme" content="light dark">',
            f'<meta name="generator" content="servesim {esc(package_version())}, '
            f'plotly.js via plotly {esc(plotly.__version__)}">',
            f"<title>{esc(title)}</title>",
            f"<style>{_asset('report.css')}</style>",
            "</head><body>",
            f'<header class="top"><h1>{esc(title)}</h1>{subtitle_html}{loading}</header>',
            f'<nav class="toc" aria-label="sections"><ul>{nav}</ul></nav>',
            "<main>",
            *(section_html(s) for s in sections),
            "</main>",
            f"<footer>servesim {esc(package_version())}. Every chart is interactive (hover, zoom, "
            "double-click to reset; the camera icon saves a PNG). The numbers behind the "
            "page are in the <code>servesim-data</code> JSON block of its source.</footer>",
            f'<script type="application/json" id="servesim-data">{script_json(data)}</script>',
            '<script type="application/json" id="servesim-figures">'
            f"{script_json({c.fid: figure_json(c) for c in charts})}</script>",
            '<script type="application/json" id="servesim-templates">'
            f"{script_json(templates())}</script>",
            '<script type="application/octet-stream" id="plotly-js-gz" '
            f'data-encoding="gzip+base64">{packed_plotly_js()}</script>',
            f"<script>{_asset('report.js')}</script>",
            "</body></html>\n",
        ]
    )
