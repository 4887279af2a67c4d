"""`servesim report`: one self-contained HTML page per run, sweep or plan (docs/report.md).

    from simulator.report import write_report
    write_report(result, "out/run.html")        # a Result, a saved result, a SweepResult,
                                                # a PlanResult or a --results-path document

Modules: run_source (one run from a live, saved or JSON source), run_data and study_data (the
numbers each page shows, as JSON-safe dicts embedded in the page), figures (Plotly figures
drawn from those dicts), page (the HTML: sections, sortable tables, the embedded plotly.js and
light/dark templates), build (the sections of each kind of page, and the entry points).

Imported only by the report code path: plotly and pandas load here, never on `servesim run`.
"""

from .build import default_output, load_input, render_report, report_data, write_report

__all__ = ["default_output", "load_input", "render_report", "report_data", "write_report"]
