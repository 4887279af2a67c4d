"""The page itself (issue 34): one file that needs no network, plotly.js inside it once, the
data it embeds is what `report_data` computed, every chart titled with units, every table
sortable, light and dark templates, byte-identical for the same run, and a section that does
not apply is a one-line note instead of an empty frame.
"""

from __future__ import annotations

import base64
import gzip
import re

import pandas as pd
import pytest

from simulator.report import render_report, report_data
from simulator.report.figures import plan_charts, run_charts, sweep_charts
from tests.report.helpers import FakeSweep, embedded


@pytest.fixture(scope="module")
def page(chatbot):
    return render_report(chatbot)


@pytest.fixture(scope="module")
def pd_page(pd_run):
    return render_report(pd_run)


def test_the_page_loads_nothing_from_outside(page, pd_page):
    for text in (page, pd_page):
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
        assert "<link" not in text
        assert not re.search(r"<script[^>]+\bsrc=", text)
        assert "@import" not in text


def test_plotly_js_is_inside_once(page):
    from plotly.offline import get_plotlyjs

    packed = re.findall(r'id="plotly-js-gz"[^>]*>([^<]*)</script>', page)
    assert len(packed) == 1
    assert gzip.decompress(base64.b64decode(packed[0])).decode() == get_plotlyjs()
    # Compressed, the page is well under the 4.8 MB plotly.js alone would take.
    assert len(page.encode()) < 3_000_000


def test_the_embedded_data_is_report_data(chatbot, page):
    assert embedded(page, "servesim-data") == report_data(chatbot)


def test_same_run_same_bytes(chatbot, page):
    assert render_report(chatbot) == page


def test_every_figure_is_drawn_from_the_page(page, pd_page):
    """Every figure div has its JSON, and every figure JSON a div."""
    for text in (page, pd_page):
        figures = embedded(text, "servesim-figures")
        divs = re.findall(r'<div class="plot" id="([^"]+)"', text)
        assert sorted(divs) == sorted(figures) and divs
        for fig in figures.values():
            assert fig["data"], "a figure without traces"
            assert "template" not in fig["layout"]


def _axes(layout) -> list:
    return [v for k, v in layout.to_plotly_json().items() if re.fullmatch(r"[xy]axis\d*", k)]


def _all_charts(chatbot, pd_run, fleet_run):
    charts = []
    for result in (chatbot, pd_run, fleet_run):
        for group in run_charts(report_data(result)).values():
            charts.extend(group)
    return charts


def test_every_chart_is_titled_with_units(chatbot, pd_run, fleet_run):
    """A title, and a title on every axis; a numeric axis names its unit in parentheses."""
    charts = _all_charts(chatbot, pd_run, fleet_run)
    assert {"cdf-ttft", "ts-kv", "pd-stages", "balance-decisions", "lifecycle"} <= {
        c.fid for c in charts
    }
    for chart in charts:
        layout = chart.figure.layout
        assert layout.title.text, chart.fid
        for axis in _axes(layout):
            title = (axis.get("title") or {}).get("text")
            assert title, (chart.fid, axis)
            if axis.get("type") != "category" and chart.fid not in ("pd-stages",):
                assert re.search(r"\(.+\)", title) or chart.fid.startswith(("balance-", "pd-")), (
                    chart.fid,
                    title,
                )


def test_value_axes_carry_units(chatbot):
    """The y axes of the run's charts, one by one."""
    charts = {c.fid: c for g in run_charts(report_data(chatbot)).values() for c in g}
    units = {
        "cdf-ttft": "(0-1)",
        "ts-completions": "(requests/s)",
        "ts-tokens": "(tokens/s)",
        "ts-queue": "(requests)",
        "ts-kv": "(blocks)",
        "ts-batch": "(requests)",
        "ts-preemptions": "(per s)",
    }
    for fid, unit in units.items():
        assert charts[fid].figure.layout.yaxis.title.text.endswith(unit), fid
    assert charts["cdf-ttft"].figure.layout.xaxis.title.text == "TTFT (ms)"


def test_slo_targets_and_capacity_are_drawn(chatbot):
    charts = {c.fid: c for g in run_charts(report_data(chatbot)).values() for c in g}
    ttft = charts["cdf-ttft"].figure
    (line,) = [s for s in ttft.layout.shapes if s.type == "line"]
    assert line.x0 == line.x1 == 500.0  # the scenario's TTFT target
    kv = charts["ts-kv"].figure
    capacity = [t for t in kv.data if t.name.startswith("KV capacity")]
    assert capacity and capacity[0].y[0] == chatbot.engines[0].kv.total_blocks


def test_every_table_is_sortable_and_captioned(page, pd_page):
    for text in (page, pd_page):
        tables = re.findall(r"<table[^>]*>", text)
        assert tables and all('class="sortable"' in t for t in tables)
        assert text.count("<caption>") == len(tables)
        assert text.count('<th scope="col"') == text.count('<button type="button">')


def test_light_and_dark(page):
    templates = embedded(page, "servesim-templates")
    assert set(templates) == {"light", "dark"}
    assert (
        templates["light"]["layout"]["font"]["color"]
        != templates["dark"]["layout"]["font"]["color"]
    )
    assert "@media (prefers-color-scheme: dark)" in page
    assert '<meta name="color-scheme" content="light dark">' in page


def test_sections_that_do_not_apply_are_one_note(page):
    for sid in ("pd", "balance", "lifecycle"):
        section = re.search(rf'<section id="{sid}".*?</section>', page, re.S).group(0)
        assert section.count('<p class="note">') == 1, sid
        assert '<div class="plot"' not in section and "<table" not in section, sid


def test_every_section_of_a_pd_run_is_filled(pd_page):
    for sid in ("overview", "scenario", "latency", "timeseries", "pd", "balance", "anomalies"):
        assert re.search(rf'<section id="{sid}"', pd_page), sid
    figures = embedded(pd_page, "servesim-figures")
    assert {"pd-stages", "pd-transfer", "balance-requests", "balance-decisions"} <= set(figures)


def test_text_is_escaped(chatbot):
    """A scenario name with markup in it stays text."""
    data = report_data(chatbot)
    data["title"] = "<script>alert(1)</script>"
    from simulator.report.build import render_run

    text = render_run(data)
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert embedded(text, "servesim-data")["title"] == data["title"]


def test_sweep_and_plan_charts_are_titled():
    from simulator.report.study_data import sweep_data

    points = pd.DataFrame(
        {
            "point": [0, 1],
            "workload.rate": [10, 20],
            "n_seeds": 2,
            "steady_seeds": [2, 1],
            "slo_attainment_mean": [1.0, 0.5],
            "slo_attainment_ci95": [0.0, 0.1],
        }
    )
    charts = sweep_charts(sweep_data(FakeSweep(points, ["workload.rate"], [1, 2])))
    (chart,) = charts
    layout = chart.figure.layout
    assert layout.title.text == "slo_attainment vs workload.rate"
    assert layout.xaxis.title.text == "offered load: workload.rate (requests / s)"
    assert layout.yaxis.title.text == "slo_attainment (fraction)"
    (knee,) = [s for s in layout.shapes if s.type == "line"]
    assert knee.x0 == 20
    # The axis spans the loads probed (5 % margin each side), not the knee label at the last
    # load, which stretched an autoranged axis to about three times the data.
    assert tuple(layout.xaxis.range) == (9.5, 20.5)
    plan = {
        "slos": {"ttft_p99_ms": 500.0},
        "min_attainment": 0.99,
        "seeds": [1],
        "max_instances": 4,
        "frontier": [
            {
                "gpu": "H100",
                "instances": 1,
                "meets": False,
                "steady": False,
                "ttft_p99_ms_worst": 900.0,
                "attainment_worst": 0.5,
                "reason": "too slow",
            },
            {
                "gpu": "H100",
                "instances": 2,
                "meets": True,
                "steady": True,
                "ttft_p99_ms_worst": 300.0,
                "attainment_worst": 1.0,
                "reason": "",
            },
        ],
        "per_gpu": [
            {
                "gpu": "H100",
                "tp": 1,
                "feasible": True,
                "instances": 2,
                "total_gpus": 2,
                "cost_per_hour_usd": 6.0,
            }
        ],
        "best": {"gpu": "H100", "instances": 2, "tp": 1, "total_gpus": 2, "cost_per_hour_usd": 6.0},
    }
    charts = {c.fid: c.figure for c in plan_charts(plan)}
    assert set(charts) == {"plan-ttft_p99_ms", "plan-slo_attainment", "plan-cost"}
    (bound,) = [s for s in charts["plan-ttft_p99_ms"].layout.shapes if s.type == "line"]
    assert bound.y0 == 500.0
    assert charts["plan-cost"].data[0].y == (6.0,)
    assert charts["plan-cost"].layout.yaxis.title.text == "cost (USD per hour)"
