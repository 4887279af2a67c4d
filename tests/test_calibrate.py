"""`servesim calibrate` and the calibration report: laws on a small simulated 'real' trace.

A trace simulated with known physics coefficients stands in for a server recording (what
`servesim observe` writes): fitting it must reproduce its figures, re-pricing a recorded
replay with its own coefficients must reproduce that replay, and the report of a replay with
the true coefficients against it must be perfect.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from simulator import calibrate as cal
from simulator.api import simulate
from simulator.calibration_report import calibration_report, metric_report, quality
from simulator.cli import app
from simulator.errors import ConfigError
from simulator.latency.physics import PhysicsCoefficients, coefficients_document

TRUE = replace(
    PhysicsCoefficients(),
    bandwidth_efficiency=0.9,
    per_step_overhead_us=2500.0,
    request_overhead_us=8000.0,
)


def _write_coeffs(path: Path, c: PhysicsCoefficients) -> Path:
    path.write_text(yaml.safe_dump(coefficients_document(c)))
    return path


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """300 requests on Llama-2-7B TP1 priced with TRUE, exported as a recorded trace."""
    folder = tmp_path_factory.mktemp("trace")
    result = simulate(
        {
            "model": "llama-2-7b-hf",
            "hardware": "H100",
            "tp": 1,
            "latency": {
                "model": "physics",
                "coeffs_file": str(_write_coeffs(folder / "t.yaml", TRUE)),
            },
            "workload": {
                "rate": 8,
                "num_requests": 300,
                "prompt_tokens": {"mean": 400, "stdev": 100, "min": 50, "max": 800},
                "output_tokens": {"mean": 60, "stdev": 20, "min": 5, "max": 120},
            },
        }
    )
    header, data = result.write_trace(folder / "real")
    doc = yaml.safe_load(header.read_text())
    doc["mode"] = "real"  # as `servesim observe` records it
    header.write_text(yaml.safe_dump(doc))
    return header, data


def test_reprice_with_own_coefficients_reproduces_the_replay(real_trace) -> None:
    case = cal.trace_case(*real_trace)
    rec = cal.record(case, TRUE)
    repriced = cal.reprice(rec, TRUE)
    for metric in cal.FIT_METRICS:
        # Only the simulator's whole-µs step durations separate the two.
        assert repriced[metric] == pytest.approx(rec.predicted[metric], rel=2e-3)
    # And the replay with the true coefficients is the recording itself.
    for metric in ("e2e_mean_ms", "ttft_mean_ms"):
        assert rec.predicted[metric] == pytest.approx(case.measured[metric], rel=1e-6)


def test_reprice_tracks_a_coefficient_change(real_trace) -> None:
    """A larger per-step overhead raises E2E by that overhead times the steps a request spans
    (the one it arrived in counted by the fraction it still had to run)."""
    case = cal.trace_case(*real_trace)
    rec = cal.record(case, TRUE)
    slower = replace(TRUE, per_step_overhead_us=TRUE.per_step_overhead_us + 1000)
    delta_ms = cal.reprice(rec, slower)["e2e_mean_ms"] - rec.predicted["e2e_mean_ms"]
    done = rec.completed
    steps_per_request = rec.completion_step[done] - rec.wait_step[done] + rec.wait_fraction[done]
    # ... plus once more per output-lag step: the step in flight when it reached the engine,
    # for the requests that found one running.
    lagged = (rec.lag_step[done] >= 0).mean()
    expected_ms = 1.0 * (steps_per_request.mean() + TRUE.output_lag_steps * lagged)
    assert delta_ms == pytest.approx(expected_ms, rel=1e-3)


def test_fit_reproduces_the_recorded_figures(real_trace) -> None:
    case = cal.trace_case(*real_trace)
    # Two replay-and-fit rounds, as a real calibration needs (the default is three).
    result = cal.fit([case], rounds=2)
    scores = result.scores[case.name]
    for metric in ("e2e_mean_ms", "itl_ms", "ttft_mean_ms"):
        assert scores["predicted"][metric] == pytest.approx(scores["measured"][metric], rel=0.03)
    doc = result.document()
    assert doc["latency_model"] == "physics"
    assert set(doc["coefficients"]) == set(cal.coefficients_dict(TRUE))


def test_report_of_the_true_replay_is_perfect(real_trace) -> None:
    case = cal.trace_case(*real_trace)
    replayed = cal.replay_case(case, TRUE)
    report = calibration_report(*real_trace, replayed)
    for metric in ("ttft", "e2e"):
        assert report[metric]["mape"] < 1e-9
        assert report[metric]["pearson_r"] == pytest.approx(1.0)
        assert report[metric]["quality"] == "excellent"
        assert report[metric]["bias"] == "neutral"
    assert report["trace_info"]["matched"] == 300


def test_report_adds_the_network_to_the_simulation(real_trace) -> None:
    case = cal.trace_case(*real_trace)
    replayed = cal.replay_case(case, TRUE)
    report = calibration_report(*real_trace, replayed, rtt_ms=5.0)
    # Every simulated latency is 5 ms later: the bias is upward, by 5 ms over the real mean.
    assert report["ttft"]["bias"] == "over-predicts"
    assert report["ttft"]["sim_p50"] - report["ttft"]["real_p50"] == pytest.approx(5.0, abs=0.01)


def test_metric_report_arithmetic() -> None:
    real = np.array([10.0, 20.0, 0.0, 40.0])
    sim = np.array([11.0, 18.0, 5.0, 44.0])
    m = metric_report(real, sim)
    # MAPE skips the real zero: (0.1 + 0.1 + 0.1) / 3.
    assert m["mape"] == pytest.approx(0.1)
    assert m["pearson_r"] == pytest.approx(np.corrcoef(real, sim)[0, 1])
    assert m["mean_signed_error"] == pytest.approx((78 - 70) / 70)
    assert m["bias"] == "over-predicts"
    assert math.isnan(metric_report(real[:2], sim[:2])["pearson_r"])  # n < 3


@pytest.mark.parametrize(
    ("mape", "r", "grade"),
    [
        (0.09, 0.96, "excellent"),
        (0.09, 0.90, "good"),
        (0.19, 0.86, "good"),
        (0.30, 0.75, "fair"),
        (0.36, 0.99, "poor"),
    ],
)
def test_quality_grades(mape: float, r: float, grade: str) -> None:
    assert quality(mape, r) == grade


def test_report_needs_a_real_trace(real_trace, tmp_path: Path) -> None:
    header = tmp_path / "gen.yaml"
    doc = yaml.safe_load(real_trace[0].read_text())
    doc["mode"] = "generated"
    header.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="mode: invalid value 'generated'"):
        calibration_report(header, real_trace[1], real_trace[1])


def test_cli_calibrate_from_a_trace_writes_loadable_coefficients(
    real_trace, tmp_path: Path
) -> None:
    out = tmp_path / "fit.yaml"
    header, data = real_trace
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--trace-header",
            str(header),
            "--trace-data",
            str(data),
            "--rounds",
            "1",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "calibration report" in result.output
    # run / replay load the file with --latency-coeffs (which implies the physics model).
    replayed = CliRunner().invoke(
        app,
        [
            "replay",
            "--trace-header",
            str(header),
            "--trace-data",
            str(data),
            "--latency-coeffs",
            str(out),
        ],
    )
    assert replayed.exit_code == 0, replayed.output


def test_cli_report_only_with_a_simulated_trace(real_trace) -> None:
    header, data = real_trace
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--trace-header",
            str(header),
            "--trace-data",
            str(data),
            "--sim-trace",
            str(data),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "quality excellent" in result.output


def test_cli_calibrate_errors_are_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "no requests/ folder" in result.output
    half = CliRunner().invoke(app, ["calibrate", "--trace-header", str(tmp_path / "h.yaml")])
    assert half.exit_code == 2 and "must be given together" in half.output


def test_cli_latency_coeffs_with_another_model_is_an_error(tmp_path: Path) -> None:
    path = _write_coeffs(tmp_path / "c.yaml", TRUE)
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--model",
            "llama-2-7b-hf",
            "--latency-model",
            "roofline",
            "--latency-coeffs",
            str(path),
            "--num-requests",
            "5",
        ],
    )
    assert result.exit_code == 2
    assert "only latency model physics reads one" in result.output


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_num_seqs": None}, "missing key 'config.max_num_seqs'"),
        (
            {"model_id": "acme/unknown-model"},
            "model_id 'acme/unknown-model' is not a bundled model",
        ),
    ],
)
def test_cli_calibrate_rejects_an_incomplete_run(
    tmp_path: Path, change: dict, message: str
) -> None:
    import json

    from tests.test_validate import DATASET, _write_run

    dataset = tmp_path / DATASET
    _write_run(
        dataset, "20260101-000000-llama-2-7b-tp1-general", "general", [(0, 50, 5, 0, 0.03, 0.1)]
    )
    meta_path = next((dataset / "requests").glob("*.meta.json"))
    meta = json.loads(meta_path.read_text())
    for key, value in change.items():
        if key in meta["config"]:
            meta["config"][key] = value
        else:
            meta[key] = value
    meta_path.write_text(json.dumps(meta))
    result = CliRunner().invoke(app, ["calibrate", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.output and result.output.count("\n") == 1
