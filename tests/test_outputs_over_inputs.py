"""No command writes over a file it reads (docs/robustness.md, "Atomic outputs"): each output
naming an input is refused with status 2 before any work, and the input is left as it was.
`run`, `replay` and trace exports are covered in tests/test_trace_export.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import simulator
from simulator.errors import ConfigError
from tests.test_cli_workloads import invoke

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "tests" / "data" / "blis" / "r1_fixed512.trace"
SCENARIO = "workload: {num_requests: 5, rate: 5}\n"


def _refused(res, needle: str) -> None:
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and "which this run reads" in res.stderr, res.stderr
    assert "Traceback" not in res.output


def test_validate_refuses_to_write_over_a_ground_truth_file(tmp_path):
    folder = tmp_path / "gt"
    shutil.copytree(REPO / "groundtruth" / "vllm-0.15.1-h100", folder)
    victim = next((folder / "requests").iterdir())
    before = victim.read_bytes()
    _refused(invoke("validate", folder, "--output", victim), "is in the ground-truth folder")
    assert victim.read_bytes() == before
    coeffs = tmp_path / "c.yaml"
    coeffs.write_text("x: 1\n")
    _refused(
        invoke("validate", folder, "--latency-coeffs", coeffs, "--output", coeffs),
        "is the coefficients file",
    )
    assert coeffs.read_text() == "x: 1\n"


def test_calibrate_refuses_to_write_its_fit_over_the_trace(tmp_path):
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    shutil.copy(f"{TRACE}.yaml", header)
    shutil.copy(f"{TRACE}.csv", data)
    before = header.read_bytes()
    res = invoke("calibrate", "--trace-header", header, "--trace-data", data, "--output", header)
    _refused(res, "is a --trace-header file")
    assert header.read_bytes() == before


def test_report_refuses_its_own_source_but_replaces_an_earlier_report(tmp_path):
    results = tmp_path / "r.json"
    assert invoke("run", "--num-requests", 5, "--rate", 5, "--results-path", results).exit_code == 0
    before = results.read_bytes()
    _refused(invoke("report", results, "-o", results), "is the report's source")
    assert results.read_bytes() == before
    saved = tmp_path / "saved"
    simulator.simulate({"workload": {"num_requests": 5, "rate": 5}}).save(saved)
    summary = (saved / "summary.json").read_bytes()
    _refused(invoke("report", saved, "-o", saved / "summary.json"), "is in the report's source")
    assert (saved / "summary.json").read_bytes() == summary
    for _ in range(2):  # the default target, report.html in the folder, is rewritten
        assert invoke("report", saved).exit_code == 0


def test_sweep_and_plan_refuse_to_write_over_their_inputs(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text("base: s.yaml\ngrid: {workload.rate: [5]}\nseeds: [1]\n")
    for target, needle in ((sweep_file, "is the sweep file"), (scenario, "is the scenario file")):
        _refused(invoke("sweep", sweep_file, "--report", target), needle)
    res = invoke("plan", scenario, "--slo", "ttft_p99_ms=500", "--report", scenario)
    _refused(res, "is the scenario file")
    assert scenario.read_text() == SCENARIO
    assert sweep_file.read_text().startswith("base: s.yaml")


def test_plan_refuses_a_figure_format_before_any_work(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    res = invoke("plan", scenario, "--slo", "ttft_p99_ms=500", "--plot", tmp_path / "f.txt")
    assert res.exit_code == 2, res.output
    assert "--plot: invalid value" in res.stderr and "png" in res.stderr
    assert "instance(s)" not in res.stderr  # no configuration was simulated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_python_run_refuses_a_decision_log_over_its_scenario(tmp_path):
    scenario = tmp_path / "s.yaml"
    text = SCENARIO + f"cluster:\n  trace: {{level: decisions, path: {scenario}}}\n"
    scenario.write_text(text)
    with pytest.raises(ConfigError, match="cluster.trace.path: .* is the scenario file"):
        simulator.simulate(str(scenario))
    assert scenario.read_text() == text


def test_python_outputs_refuse_the_files_their_run_read(tmp_path):
    """`Result.write_trace`, `Result.report` and `SweepResult.report` refuse, as their CLI
    flags do, a path naming a file the run read: the scenario file it was given (until
    2026-12-07 only the files the scenario names were guarded, and the reports nothing), the
    trace a replay read, the base scenario and the --out folder's tables of a sweep. Each
    input is left as it was; a new path, and an earlier report in the sweep's folder, are
    fine."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    run = simulator.simulate(scenario)
    with pytest.raises(ConfigError, match="trace header: .* is the scenario file"):
        run.write_trace(tmp_path / "s")
    with pytest.raises(ConfigError, match="report: .* is the scenario file"):
        run.report(scenario)
    header, data = run.write_trace(tmp_path / "t")
    replayed = simulator.replay(header, data)
    with pytest.raises(ConfigError, match=r"report: .* is the trace data \(trace.data\)"):
        replayed.report(data)
    with_scenario = simulator.replay(header, data, scenario=scenario)  # the file guarded too
    with pytest.raises(ConfigError, match="report: .* is the scenario file"):
        with_scenario.report(scenario)
    with pytest.raises(ConfigError, match="trace header: .* is the scenario file"):
        with_scenario.write_trace(tmp_path / "s")
    study = simulator.sweep(
        str(scenario), {"workload.rate": [5]}, seeds=[1], workers=1, out=tmp_path / "sw"
    )
    with pytest.raises(ConfigError, match="report: .* is the scenario file"):
        study.report(scenario)
    runs_csv = tmp_path / "sw" / "runs.csv"
    before = runs_csv.read_bytes()
    with pytest.raises(ConfigError, match="report: .* is in the sweep's output folder"):
        study.report(runs_csv)
    assert scenario.read_text() == SCENARIO and runs_csv.read_bytes() == before
    assert header.read_text().startswith("trace_version") and data.stat().st_size > 0
    study.report(tmp_path / "sw" / "report.html")
    study.report(tmp_path / "sw" / "report.html")  # its own earlier report is replaced
    run.report(tmp_path / "run.html")
