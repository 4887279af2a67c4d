"""The report in a real browser (issue 34): headless Chromium opens each kind of page from
disk with the network cut off, and every chart must render (a plotly SVG with its traces),
with zero console errors, in light and in dark mode; tables sort when their header is clicked.
Screenshots go to artifacts/ (git-ignored; CI keeps it).

The browser is the distribution's (Debian: `apt-get install chromium`), driven by Playwright's
Python package; nothing is downloaded. Without a browser or Playwright the tests skip and say
which is missing. SERVESIM_CHROMIUM names another Chromium binary.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from simulator.report import write_report

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("SERVESIM_ARTIFACTS", ROOT / "artifacts"))
# A sandbox-less, quiet Chromium: CI runs as root (no sandbox), the machine has no network
# (no QUIC, background fetches, component updates or sync) and no GPU.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL = "install one with `apt-get install chromium` (docs/report.md)"


def _chromium() -> str | None:
    given = os.environ.get("SERVESIM_CHROMIUM")
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed: pip install -e '.[dev]'")
    executable = _chromium()
    if executable is None:
        pytest.skip(f"no Chromium found (chromium, chromium-browser, google-chrome); {INSTALL}")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=executable,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1366, "height": 800},
            offline=True,
        )
        yield context
        context.close()


class Opened:
    """A page loaded from disk, with what it logged and every request it tried."""

    def __init__(self, context, path: Path, scheme: str = "light") -> None:
        self.page = context.new_page()
        self.page.emulate_media(color_scheme=scheme)
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def route(r):
            self.requests.append(r.request.url)
            if r.request.url == path.resolve().as_uri():
                r.continue_()
            else:
                r.abort()

        self.page.route("**/*", route)
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_function("document.body.dataset.rendered !== undefined", timeout=60000)

    def charts(self) -> list[dict]:
        return self.page.evaluate(
            """() => Array.from(document.querySelectorAll('div.plot')).map(d => {
                const svg = d.querySelector('svg.main-svg');
                const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
                return {id: d.id, width: box.width, height: box.height,
                        traces: d.querySelectorAll('g.trace').length,
                        font: d.layout ? d.layout.template.layout.font.color : null};
            })"""
        )

    def check(self, path: Path) -> list[dict]:
        assert self.page.evaluate("document.body.dataset.rendered") == "true", self.errors
        assert self.errors == []
        assert self.requests == [path.resolve().as_uri()]
        charts = self.charts()
        assert charts
        for chart in charts:
            assert chart["width"] > 200 and chart["height"] > 200, chart
            assert chart["traces"] > 0, chart
        return charts

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        target = ARTIFACTS / name
        self.page.screenshot(path=str(target), full_page=True)
        return target


def test_a_pd_run_renders_every_chart(browser, pd_run, tmp_path):
    path = write_report(pd_run, tmp_path / "pd.html")
    opened = Opened(browser, path)
    charts = opened.check(path)
    ids = {c["id"] for c in charts}
    assert {"cdf-ttft", "ts-kv", "pd-stages", "balance-decisions"} <= ids
    assert opened.shot("report-screenshot.png").stat().st_size > 10_000


def test_the_checks_see_errors_and_requests(browser, chatbot, tmp_path):
    """The harness itself: a console error and a request for a remote script are caught."""
    path = write_report(chatbot, tmp_path / "broken.html")
    text = path.read_text().replace(
        "</body>",
        '<script>console.error("boom")</script><script src="https://example.org/x.js"></script>'
        "</body>",
    )
    path.write_text(text)
    opened = Opened(browser, path)
    assert "boom" in opened.errors
    assert "https://example.org/x.js" in opened.requests


def test_sorting_a_table(browser, pd_run, tmp_path):
    """Clicking "routed" sorts the per-instance rows by it, ascending then descending."""
    path = write_report(pd_run, tmp_path / "pd.html")
    opened = Opened(browser, path)
    opened.check(path)
    table = opened.page.locator("table", has_text="Per-instance load")
    header = table.locator("th", has_text="routed")

    def column() -> list[int]:
        cells = table.locator("tbody tr td:nth-child(2)").all_inner_texts()
        return [int(c.replace(",", "")) for c in cells]

    header.locator("button").click()
    assert column() == sorted(pd_run.routed)
    assert header.get_attribute("aria-sort") == "ascending"
    header.locator("button").click()
    assert column() == sorted(pd_run.routed, reverse=True)


def test_dark_mode(browser, chatbot, tmp_path):
    from simulator.report.page import templates

    path = write_report(chatbot, tmp_path / "chatbot.html")
    opened = Opened(browser, path, scheme="dark")
    charts = opened.check(path)
    dark_font = templates()["dark"]["layout"]["font"]["color"]
    assert {c["font"] for c in charts} == {dark_font}
    background = opened.page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(17, 19, 23)"
    opened.shot("report-dark.png")
    # Switching back redraws with the light template, without errors.
    opened.page.emulate_media(color_scheme="light")
    opened.page.wait_for_function(
        "Array.from(document.querySelectorAll('div.plot'))"
        f".every(d => d.layout.template.layout.font.color !== {dark_font!r})"
    )
    assert opened.errors == []


def test_a_fleet_run(browser, fleet_run, tmp_path):
    path = write_report(fleet_run, tmp_path / "fleet.html")
    opened = Opened(browser, path)
    assert "lifecycle" in {c["id"] for c in opened.check(path)}
    opened.shot("report-fleet.png")


def test_a_sweep_and_a_plan(browser, tmp_path):
    import simulator
    from simulator.plan import plan

    study = simulator.sweep(
        ROOT / "scenarios" / "chatbot.yaml",
        {"workload.rate": [10, 40], "workload.num_requests": [100]},
        seeds=[1, 2],
        workers=1,
    )
    path = write_report(study, tmp_path / "sweep.html")
    opened = Opened(browser, path)
    assert "sweep-ttft_p99_ms" in {c["id"] for c in opened.check(path)}
    opened.shot("report-sweep.png")
    result = plan(
        ROOT / "scenarios" / "chatbot.yaml",
        {"ttft_p50_ms": 2000},
        gpus=["H100", "A100-80"],
        seeds=[1],
        min_attainment=0.5,
        max_instances=2,
        workers=1,
    )
    path = write_report(result, tmp_path / "plan.html")
    opened = Opened(browser, path)
    assert {"plan-ttft_p50_ms", "plan-cost"} <= {c["id"] for c in opened.check(path)}
    opened.shot("report-plan.png")
