"""`servesim calibrate` and the calibration report: laws on a small simulated 'real' trace.

A trace simulated with known physics coefficients stands in for a server recording (what
`servesim observe` writes): fitting it must reproduce its figures, re-pricing a recorded
replay with its own coefficients must reproduce that replay, and the report of a replay with
the true coefficients against it must be perfect.
"""

from __future__ import annotations

import math
import shutil
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
from simulator.workload.trace import read_rows

TRUE = replace(
    PhysicsCoefficients(),
    bandwidth_efficiency=0.9,
    per_step_overhead_us=2500.0,
    request_overhead_us=8000.0,
)


def _write_coeffs(path: Path, c: PhysicsCoefficients) -> Path:
    path.write_text(yaml.safe_dump(coefficients_document(c)))
    return path


def _edit_rows(source: Path, out: Path, edit) -> Path:
    """`source`'s rows, each changed by `edit(index, row)` (a dict of its columns), at `out`
    (which may be `source`)."""
    import csv

    with source.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for i, row in enumerate(rows):
        edit(i, row)
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out


def _as_recorded(header: Path, data: Path) -> None:
    """A simulated trace pair made to look recorded from a server by `servesim observe`:
    `mode: real`, and every request streamed (a simulated client's default is not to stream,
    and a recorded request that was not streamed measured no TTFT)."""
    doc = yaml.safe_load(header.read_text())
    doc["mode"] = "real"
    header.write_text(yaml.safe_dump(doc))
    _edit_rows(data, data, lambda _i, row: row.update(streaming="true"))


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
    _as_recorded(header, data)  # as `servesim observe` records a streamed run
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
    # ... plus, for a request that reached the engine while a step ran, the rest of that step
    # and the planned steps it missed before the one it was queued in.
    lag = rec.lag_step[done]
    lagged = lag >= 0
    rest = np.where(lagged, rec.lag_fraction[done], 0.0)
    missed = np.where(lagged, rec.wait_step[done] - lag - 1, 0)
    assert (missed >= 0).all()
    expected_ms = 1.0 * (steps_per_request + rest + missed).mean()
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


def test_trace_case_after_a_warm_up_keeps_the_later_sends(real_trace) -> None:
    whole = cal.trace_case(*real_trace)
    steady = cal.trace_case(*real_trace, warm_up_s=10.0)
    rows = read_rows(real_trace[1])
    sent = [r.send_time_us or r.arrival_time_us for r in rows]
    later = [i for i in whole.positions if sent[i] - min(sent) >= 10_000_000]
    assert list(steady.positions) == later and 0 < len(later) < len(whole.positions)
    with pytest.raises(ConfigError, match=r"after the 0 warm-up requests and 1e\+06 s"):
        cal.trace_case(*real_trace, warm_up_s=1e6)


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


def test_cli_report_refuses_a_simulated_trace_of_another_run(real_trace, tmp_path) -> None:
    """QA: --sim-trace joins by request id alone, and ids are 0, 1, 2, ... in every run: a
    replay of another cell was scored as this one (MAPE 25 %, "poor", no warning). A
    simulated side whose matched prompts differ (here every prompt 7 tokens longer, in at
    least OTHER_RUN_SHARE of them) is refused; one differing prompt is only counted."""
    import csv

    from simulator.calibration_report import OTHER_RUN_SHARE

    header, data = real_trace
    with open(data, newline="") as handle:
        rows = list(csv.DictReader(handle))

    def with_longer_prompts(count: int, name: str) -> Path:
        changed = [dict(r) for r in rows]
        ok = [r for r in changed if r["status"] == "ok"]
        for r in ok[:count]:
            r["input_tokens"] = str(int(r["input_tokens"]) + 7)
            r["server_input_tokens"] = ""
        path = tmp_path / name
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(changed)
        return path

    matched = sum(r["status"] == "ok" for r in rows)
    args = ["calibrate", "--trace-header", str(header), "--trace-data", str(data)]
    other = with_longer_prompts(matched, "other.csv")
    result = CliRunner().invoke(app, [*args, "--sim-trace", str(other)])
    assert result.exit_code == 2, result.output
    assert f"'{other}' is not a replay of '{data}': {matched:,} of the {matched:,}" in result.output
    one = with_longer_prompts(1, "one.csv")
    assert OTHER_RUN_SHARE * matched > 1
    report = calibration_report(header, data, one)
    assert report["trace_info"]["prompt_tokens_differ"] == 1
    assert "prompt_tokens_differ" not in calibration_report(header, data, data)["trace_info"]


def test_cli_report_refuses_a_real_trace_whose_times_go_backwards(real_trace, tmp_path) -> None:
    """A first chunk before its send printed a negative TTFT MAPE, rated "good"."""
    import csv

    header, data = real_trace
    with open(data, newline="") as handle:
        rows = list(csv.DictReader(handle))
    ok = next(i for i, r in enumerate(rows) if r["status"] == "ok")
    sent = int(rows[ok]["send_time_us"] or rows[ok]["arrival_time_us"])
    rows[ok]["first_chunk_time_us"] = str(sent - 1000)
    broken = tmp_path / "broken.csv"
    with open(broken, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    args = ["calibrate", "--trace-header", str(header), "--trace-data", str(broken)]
    result = CliRunner().invoke(app, [*args, "--sim-trace", str(data)])
    assert result.exit_code == 2, result.output
    assert (
        f"request {rows[ok]['request_id']}" in result.output
        and "must not decrease" in result.output
    )


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


# --------------------------------------------------------- rounds that cannot make things worse


def _fake_case(name: str, measured_ms: float = 100.0) -> cal.Case:
    """A case that is never replayed: the fake replays below produce its figures."""
    one = np.asarray([measured_ms])
    return cal.Case(
        name=name,
        model="m",
        trace_header=None,
        trace_data=Path(f"{name}.csv"),
        scenario=None,
        overrides={},
        positions=np.asarray([0]),
        measured_ttft_ms=one,
        measured_e2e_ms=one,
        output_tokens=np.asarray([1.0]),
        measured=dict.fromkeys(cal.FIT_METRICS, measured_ms),
    )


def _fake_world(monkeypatch, response, propose) -> list[PhysicsCoefficients]:
    """Replays answer `response(coefficients)` (the factor every figure is off by) and the
    fixed-schedule fit proposes `propose(coefficients)`; returns the replayed coefficients."""
    from types import SimpleNamespace

    replayed: list[PhysicsCoefficients] = []

    def record_all(cases, c, workers=1):
        replayed.append(c)
        return [
            SimpleNamespace(
                case=case, predicted={m: case.measured[m] * response(c) for m in cal.FIT_METRICS}
            )
            for case in cases
        ]

    monkeypatch.setattr(cal, "record_all", record_all)
    monkeypatch.setattr(cal, "fit_recorded", lambda recs, c, prior: propose(c))
    return replayed


BEST_STEP_US = 1000.0


def test_damping_stops_the_oscillation(monkeypatch) -> None:
    """Under load the schedule amplifies a change of step time (longer steps, bigger batches),
    which the fixed-schedule fit cannot see: here the replayed figures go as the square of the
    per-step overhead while the fit assumes they go linearly, so its full step reflects the
    error to the other side (+300% -> -75%, the same score: the rounds would oscillate for
    ever and keep the start). The line through the two replays finds half the step."""
    replayed = _fake_world(
        monkeypatch,
        response=lambda c: (c.per_step_overhead_us / BEST_STEP_US) ** 2,
        propose=lambda c: replace(c, per_step_overhead_us=BEST_STEP_US**2 / c.per_step_overhead_us),
    )
    start = replace(PhysicsCoefficients(), per_step_overhead_us=2 * BEST_STEP_US)
    seen = []
    result = cal.fit([_fake_case("a")], start=start, rounds=3, on_round=seen.append)
    assert seen == result.history
    start_round, full, damped = result.history[:3]
    assert (start_round.round, start_round.step, start_round.kept) == (0, 0.0, True)
    assert (full.round, full.step, full.kept) == (1, 1.0, False)
    assert full.score == pytest.approx(start_round.score)  # the undamped fit goes nowhere
    assert (damped.round, damped.step, damped.kept) == (1, pytest.approx(0.5), True)
    assert damped.score == pytest.approx(0.0, abs=1e-12)
    assert result.improved and result.score == pytest.approx(0.0, abs=1e-12)
    assert result.coefficients.per_step_overhead_us == pytest.approx(BEST_STEP_US)
    # At the optimum the fit proposes no move: the rounds stop instead of replaying again.
    assert result.stopped_early and result.rounds_run == 1
    assert len(replayed) == 3


def test_no_improvement_returns_the_start_unchanged(monkeypatch) -> None:
    """A fit whose every step makes the replays worse: the start is the result, `improved`
    is False, and the rounds stop after the first that improved nothing."""
    _fake_world(
        monkeypatch,
        response=lambda c: c.per_step_overhead_us / BEST_STEP_US,
        propose=lambda c: replace(c, per_step_overhead_us=c.per_step_overhead_us * 3),
    )
    start = replace(PhysicsCoefficients(), per_step_overhead_us=1.2 * BEST_STEP_US)
    result = cal.fit([_fake_case("a"), _fake_case("b")], start=start, rounds=3)
    assert not result.improved
    assert result.coefficients == start
    assert result.score == result.start_score
    assert result.stopped_early and result.rounds_run == 1
    assert [r.kept for r in result.history] == [True] + [False] * (len(result.history) - 1)
    doc = result.document()
    assert doc["fit"]["improved"] is False
    assert doc["coefficients"]["per_step_overhead_us"] == start.per_step_overhead_us


def test_line_step_finds_where_the_line_crosses() -> None:
    r0 = np.asarray([0.16, 0.16])
    # The full step overshot to -17%: the line crosses zero at 16/33 of it.
    assert cal.line_step(r0, np.asarray([-0.17, -0.17]), 1.0) == pytest.approx(0.48, abs=0.011)
    # A trial at half the step that got a third of the way: the full step is best.
    assert cal.line_step(r0, r0 * 2 / 3, 0.5) == 1.0
    # A trial that made things worse: the shortest step.
    assert cal.line_step(r0, r0 * 2, 1.0) == cal.MIN_STEP


@pytest.mark.parametrize(
    "start",
    [
        None,  # the shipped H100 coefficients
        "physical",
        TRUE,  # perfect: nothing can improve on it
        replace(TRUE, per_step_overhead_us=300.0, request_overhead_us=500.0),
    ],
    ids=["shipped", "physical", "true", "fast"],
)
def test_fit_is_never_worse_than_its_start_unless_it_says_so(real_trace, start) -> None:
    """The law: the result's replayed in-sample score is at most the start's, and it is only
    different when `improved` says so (the CLI then warns, and fails on request)."""
    case = cal.trace_case(*real_trace)
    result = cal.fit([case], start=start, rounds=2)
    assert result.score <= result.start_score
    assert result.improved == (result.score < result.start_score)
    if not result.improved:
        assert result.coefficients == result.start
    kept = [r.score for r in result.history if r.kept]
    assert kept == sorted(kept, reverse=True) and kept[-1] == pytest.approx(result.score)
    if start is TRUE:
        assert not result.improved and result.coefficients == TRUE


def test_the_start_is_the_shipped_fit(real_trace) -> None:
    from simulator.catalog.hardware import get_gpu
    from simulator.latency.physics import default_coefficients

    case = cal.trace_case(*real_trace)
    shipped, _ = default_coefficients(get_gpu("H100"))
    assert cal.resolve_start(None, [case])[0] == shipped
    assert cal.resolve_start("physical", [case]) == (PhysicsCoefficients(), "physical defaults")
    result = cal.fit([case], rounds=0)
    assert result.start == shipped and result.coefficients == shipped
    assert result.start_source.startswith("shipped coefficients for H100")


@pytest.mark.parametrize(("prior", "expected"), [("start", 0.5), ("physical", 0.7)])
def test_the_prior_keeps_what_the_runs_cannot_see_at_its_centre(
    real_trace, prior: str, expected: float
) -> None:
    """A TP1 run has no all-reduce: the data say nothing about the interconnect, so it stays
    where the prior is centred, the start's value (default) or the physical default."""
    case = cal.trace_case(*real_trace)
    start = replace(TRUE, per_step_overhead_us=1500.0, interconnect_efficiency=0.5)
    result = cal.fit([case], start=start, rounds=1, prior=prior)
    assert result.improved
    assert result.coefficients.interconnect_efficiency == pytest.approx(expected, rel=1e-3)
    assert result.document()["fit"]["prior"] == prior


def test_rounds_zero_only_scores_the_start(real_trace) -> None:
    case = cal.trace_case(*real_trace)
    result = cal.fit([case], start=TRUE, rounds=0)
    assert len(result.history) == 1 and result.coefficients == TRUE
    assert result.score == pytest.approx(0.0, abs=1e-6)


# ----------------------------------------------------------- several traces, held-out scoring


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as the vLLM 0.23 ground truth: one sub-folder per cell with
    trace.yaml + trace.csv, and the server's settings in server_config.json."""
    import json

    folder = tmp_path_factory.mktemp("vllm-0.99.0-cells")
    coeffs = _write_coeffs(folder.parent / f"{folder.name}-true.yaml", TRUE)
    for rate in (4, 8, 12):
        cell = folder / f"rate-{rate}"
        cell.mkdir()
        result = simulate(
            {
                "model": "llama-2-7b-hf",
                "hardware": "H100",
                "engine": {"total_kv_blocks": 7000},
                "latency": {"model": "physics", "coeffs_file": str(coeffs)},
                "workload": {
                    "rate": rate,
                    "num_requests": 150,
                    "prompt_tokens": {"mean": 300, "stdev": 50, "min": 50, "max": 500},
                    "output_tokens": {"mean": 40, "stdev": 10, "min": 5, "max": 80},
                },
            }
        )
        header, data = result.write_trace(cell / "trace")
        _as_recorded(header, data)
    (folder / "server_config.json").write_text(
        json.dumps({"vllm_version": "0.99.0", "num_gpu_blocks": 7000, "kv_cache_tokens": 1})
    )
    return folder


def test_trace_cells_are_named_after_their_folders(cells: Path) -> None:
    cases = cal.trace_cases(cells)
    assert [c.name for c in cases] == ["rate-12", "rate-4", "rate-8"]
    assert {c.vllm_version for c in cases} == {"0.99.0"}
    assert all(c.overrides["engine__total_kv_blocks"] == 7000 for c in cases)
    # A flag wins over the recorded setting.
    flagged = cal.trace_cases(cells, engine__total_kv_blocks=6000)
    assert all(c.overrides["engine__total_kv_blocks"] == 6000 for c in flagged)
    # The recorded blocks are the recorded deployment's: choosing the model, TP or GPU sizes
    # the cache from the chosen deployment's memory, as replay does (docs/traces.md).
    for chosen in ({"model": "llama-2-7b-hf"}, {"tp": 1}, {"hardware": "H100"}):
        own = cal.trace_cases(cells, **chosen)
        assert all("engine__total_kv_blocks" not in c.overrides for c in own), chosen
    # server_config.json records no token budget: the server took vLLM's default for the GPU
    # (8,192 on an H100, 2,048 on an L40S), not BLIS's. Its sequence limit is the header's
    # (these traces were written by servesim simulating an H100 under physics, whose header
    # records the run's max_num_seqs, vLLM's default there: 1,024); with neither, vLLM's
    # default (1,024 on an H100, 256 on an L40S).
    bare = cells.parent / f"{cells.name}-bare"
    shutil.copytree(cells, bare)
    for header in bare.glob("*/trace.yaml"):
        doc = yaml.safe_load(header.read_text())
        del doc["server"]["max_num_seqs"]
        header.write_text(yaml.safe_dump(doc))
    for hardware, tokens, seqs in ((None, 8192, 1024), ("L40S", 2048, 256)):
        for folder, expected_seqs in ((cells, 1024), (bare, seqs)):
            for case in cal.trace_cases(folder, hardware=hardware):
                assert case.overrides["engine__max_num_scheduled_tokens"] == tokens
                assert case.overrides["engine__max_num_running_reqs"] == expected_seqs
    flagged = cal.trace_cases(bare, engine__max_num_running_reqs=64)[0]
    assert flagged.overrides["engine__max_num_running_reqs"] == 64
    assert cal.version_in_name("vllm-0.15.1-h100") == "0.15.1"
    assert cal.version_in_name("runs") is None


def test_fit_holds_cells_out_and_scores_them(cells: Path) -> None:
    cases = cal.trace_cases(cells)
    result = cal.fit(cases, start="physical", rounds=1, holdout=["rate-12"])
    assert result.cases == ["rate-4", "rate-8"] and result.held_out == ["rate-12"]
    assert set(result.held_out_scores) == set(result.start_held_out_scores) == {"rate-12"}
    assert set(result.scores) == {"rate-4", "rate-8"}
    doc = result.document(traces=[str(cells)])
    fit = doc["fit"]
    assert fit["held_out"] == ["rate-12"] and fit["runs"] == ["rate-4", "rate-8"]
    assert fit["vllm_version"] == "0.99.0"
    assert fit["start"]["source"] == "physical defaults"
    assert set(fit["held_out_errors"]) == {"rate-12"}
    assert set(fit["held_out_score"]) == {"start", "fitted", "worse"}
    held = fit["held_out_score"]
    assert held["worse"] is (held["fitted"] > held["start"])
    assert fit["round_scores"][0] == {
        "round": 0,
        "step": 0.0,
        "score": result.start_score,
        "kept": True,
    }
    with pytest.raises(ConfigError, match="--holdout: no run matches 'rate-99'"):
        cal.fit(cases, holdout=["rate-99"])
    with pytest.raises(ConfigError, match="holds out every run"):
        cal.fit(cases, holdout=["rate"])


def _calibrate(*args: object) -> object:
    return CliRunner().invoke(app, ["calibrate", *map(str, args)])


def test_cli_traces_with_holdout_prints_both_sides(cells: Path, tmp_path: Path) -> None:
    out = tmp_path / "fit.yaml"
    result = _calibrate(
        "--traces", cells, "--holdout", "rate-12", "--start", "physical", "--rounds", "1",
        "--output", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "in-sample (2 runs)" in result.stdout and "held-out (1 run)" in result.stdout
    assert "rate-12" in result.stdout and "held-out" in result.stdout
    assert "calibrate: starting from physical defaults" in result.stderr
    assert "calibrate: round 0 (the start): score" in result.stderr
    assert "calibrate: round 1" in result.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["fit"]["held_out"] == ["rate-12"] and doc["traces"] == [str(cells)]
    # The folder alone, as the argument, is the same selection.
    again = _calibrate(cells, "--runs", "rate-4", "--start", "physical", "--rounds", "0")
    assert again.exit_code == 0, again.output
    assert "in-sample (1 run)" in again.stdout and "rate-8" not in again.stdout


def test_cli_repeated_trace_pairs(cells: Path) -> None:
    pairs = []
    for name in ("rate-4", "rate-8"):
        pairs += ["--trace-header", cells / name / "trace.yaml"]
        pairs += ["--trace-data", cells / name / "trace.csv"]
    result = _calibrate(*pairs, "--holdout", "rate-8", "--start", "physical", "--rounds", "0")
    assert result.exit_code == 0, result.output
    assert "in-sample (1 run)" in result.stdout and "held-out (1 run)" in result.stdout
    half = _calibrate(*pairs[:6])
    assert half.exit_code == 2 and "2 headers, 1 data files" in half.output
    assert half.output.count("\n") == 1


def test_cli_no_improvement_is_said_and_fails_on_request(real_trace, tmp_path: Path) -> None:
    """Starting from the coefficients that made the trace, no round can improve: calibrate
    says so on stderr, writes the start unchanged, and exits 1 with the flag (0 without)."""
    start = _write_coeffs(tmp_path / "true.yaml", TRUE)
    out = tmp_path / "fit.yaml"
    header, data = real_trace
    args = ["--trace-header", header, "--trace-data", data, "--start", start, "--rounds", "1"]
    result = _calibrate(*args, "--output", out, "--fail-if-no-improvement")
    assert result.exit_code == 1, result.output
    assert "calibrate: no round improved on the starting coefficients (score " in result.stderr
    assert "writing them unchanged" in result.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["coefficients"] == cal.coefficients_dict(TRUE)
    assert doc["fit"]["improved"] is False and doc["fit"]["start"]["source"] == f"file {start}"
    quiet = _calibrate(*args)
    assert quiet.exit_code == 0 and "keeping them unchanged" in quiet.stderr


def test_cli_coefficient_file_is_byte_identical_across_runs(cells: Path, tmp_path: Path) -> None:
    outputs = []
    for i in range(2):
        out = tmp_path / f"fit-{i}.yaml"
        args = ["--traces", cells, "--holdout", "rate-12", "--rounds", "1", "--output", out]
        result = _calibrate(*args)
        assert result.exit_code == 0, result.output
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_cli_bad_holdout_and_rounds_are_one_line(cells: Path) -> None:
    for args, message in (
        (["--holdout", "nope"], "--holdout: no run matches 'nope'"),
        (["--holdout", "rate"], "holds out every run"),
        (["--rounds", "-1"], "--rounds: invalid value -1"),
        (["--start", "/no/such.yaml"], "no/such.yaml"),
        (["--prior", "flat"], "--prior: invalid value 'flat'"),
    ):
        result = _calibrate("--traces", cells, *args)
        assert result.exit_code == 2, result.output
        assert message in result.output and result.output.count("\n") == 1


def test_cli_notes_held_out_runs_the_shipped_start_saw(cells: Path) -> None:
    """The shipped H100 fit was fitted on Llama-2-7B runs, among others: holding out a
    Llama-2-7B cell while starting there is not an independent test, and calibrate says so."""
    seen = cal.shipped_fit_models(cal.trace_cases(cells), None)
    result = _calibrate("--traces", cells, "--holdout", "rate-12", "--rounds", "0")
    assert result.exit_code == 0, result.output
    noted = "note: the shipped start was fitted on" in result.stderr
    assert noted == (seen is None or "llama-2-7b-hf" in seen)
    physical = _calibrate(
        "--traces", cells, "--holdout", "rate-12", "--rounds", "0", "--start", "physical"
    )
    assert "note:" not in physical.stderr


def test_cli_traces_of_one_name_are_told_apart(real_trace, tmp_path: Path) -> None:
    import shutil

    args = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        for source in real_trace:
            shutil.copy(source, tmp_path / folder / source.name)
        args += ["--trace-header", tmp_path / folder / real_trace[0].name]
        args += ["--trace-data", tmp_path / folder / real_trace[1].name]
    result = _calibrate(*args, "--holdout", "b/", "--start", "physical", "--rounds", "0")
    assert result.exit_code == 0, result.output
    stem = real_trace[1].stem
    assert f"a/{stem}" in result.stdout and f"b/{stem}" in result.stdout


def test_cli_calibrates_a_real_blis_observe_cell_unchanged(tmp_path: Path) -> None:
    """200 rows of a real vLLM 0.23.0 cell as BLIS `observe` wrote them (tests/data/observe_v3:
    trace_version 3, time_unit us, epoch send times, server_config.json beside it) calibrate
    as they are: the start is the shipped 0.23.0 fit, the files are not touched, and the
    result is a coefficients file that a run accepts."""
    import hashlib

    folder = Path(__file__).parent / "data" / "observe_v3"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*.*")}
    out = tmp_path / "fit.yaml"
    result = CliRunner().invoke(
        app, ["calibrate", str(folder), "--rounds", "1", "--workers", "1", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "starting from shipped coefficients for H100: fit for H100, vLLM 0.23.0" in (
        result.stderr
    )
    assert "sweep_rate-agg_2rps  fitted" in result.stdout
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*.*")} == before
    document = yaml.safe_load(out.read_text())
    assert document["fit"]["vllm_version"] == "0.23.0"
    run = simulate(
        {
            "model": "qwen/qwen3-14b",
            "latency": {"model": "physics", "coeffs_file": str(out)},
            "workload": {"rate": 2, "num_requests": 5},
        }  # fmt: skip
    )
    assert run.summary["completed_requests"] == 5
    assert run.latency_provenance["coefficients"] == f"given (file {str(out)!r})"


def test_cli_quiet_keeps_stderr_for_warnings_only(tmp_path: Path) -> None:
    folder = Path(__file__).parent / "data" / "observe_v3"
    out = tmp_path / "fit.yaml"
    args = ["calibrate", str(folder), "--rounds", "1", "--workers", "1", "--output", str(out)]
    result = CliRunner().invoke(app, [*args, "-q"])
    assert result.exit_code == 0, result.output
    assert "starting from" not in result.stderr and "round 0" not in result.stderr
    assert "wrote" not in result.stderr and out.exists()
    assert "coefficients:" in result.stdout


def test_the_command_line_asks_for_the_library_default_rounds():
    """`servesim calibrate` without --rounds runs as many rounds as `cal.fit` does by default
    (the command line spells the number out so that --help does not import the fitter)."""
    import typer.main

    command = typer.main.get_command(app).commands["calibrate"]
    rounds = next(p for p in command.params if p.name == "rounds")
    assert rounds.default == cal.DEFAULT_ROUNDS


def test_held_out_runs_that_get_worse_are_said_plainly() -> None:
    """A fit that improves its own runs and worsens the held-out ones is not returned
    silently: the result says so (`held_out_worse`, the file's `held_out_score.worse`) and the
    command line prints one warning line (with --fail-if-no-improvement it exits 1)."""
    from simulator.cli.calibrate import held_out_warning

    def figures(predicted_ms: float) -> dict[str, dict[str, dict[str, float]]]:
        measured = dict.fromkeys(cal.FIT_METRICS, 100.0)
        return {"held": {"measured": measured, "predicted": dict.fromkeys(measured, predicted_ms)}}

    def result(start_ms: float, fitted_ms: float) -> cal.FitResult:
        return cal.FitResult(
            coefficients=PhysicsCoefficients(),
            cases=["fitted"],
            rounds=1,
            scores={},
            held_out=["held"],
            start_held_out_scores=figures(start_ms),
            held_out_scores=figures(fitted_ms),
        )

    worse = result(start_ms=105.0, fitted_ms=130.0)
    assert worse.held_out_worse
    assert worse.document()["fit"]["held_out_score"]["worse"] is True
    line = held_out_warning(worse)
    assert line is not None and line.startswith("calibrate: warning: the held-out runs score")
    assert "\n" not in line
    better = result(start_ms=130.0, fitted_ms=105.0)
    assert not better.held_out_worse and held_out_warning(better) is None
    # Without held-out runs there is nothing to compare and nothing to say.
    alone = replace(worse, held_out=[], held_out_scores={}, start_held_out_scores={})
    assert not alone.held_out_worse and held_out_warning(alone) is None


def test_a_run_name_matching_nothing_lists_the_runs_there_are():
    """`--runs NAME` on the repository's ground truth: an unknown name is refused before any
    replay, naming the runs it could have chosen (not "available: none")."""
    result = CliRunner().invoke(app, ["calibrate", "--runs", "no-such-run"])
    assert result.exit_code == 2, result.output
    assert "--runs: no run matches 'no-such-run'; available: " in result.stderr
    assert "llama-2-7b-tp1-codegen" in result.stderr
    assert "available: none" not in result.stderr


def _with_network(real_trace, folder: Path, rtt_ms: float) -> tuple[Path, Path]:
    """The recorded trace as a client `rtt_ms` away would have recorded it: every chunk that
    much later after its send, and the header's measured_rtt_ms saying so."""
    import csv

    header, data = real_trace
    doc = yaml.safe_load(header.read_text())
    doc["network"] = {"measured_rtt_ms": rtt_ms}
    far_header = folder / "far.yaml"
    far_header.write_text(yaml.safe_dump(doc))
    with data.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for column in ("first_chunk_time_us", "last_chunk_time_us"):
            if int(row[column]) > 0:
                row[column] = str(int(row[column]) + round(rtt_ms * 1000))
    far_data = folder / "far.csv"
    with far_data.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return far_header, far_data


def test_the_recorded_round_trip_is_network_time_not_server_time(real_trace, tmp_path) -> None:
    """A client 40 ms away measures every latency 40 ms longer, and records that round trip
    in the header. Calibrate adds it to the simulated side, as the report does: the true
    coefficients reproduce the far trace as they do the near one (so the fit's optimum does
    not move into the server's coefficients), and the fit's errors and the report's agree. (The
    fit compared server-only replays with network-inclusive latencies and folded the round
    trip into the server's overheads, while the report added it again.)"""
    far = _with_network(real_trace, tmp_path, 40.0)
    near_case, far_case = cal.trace_case(*real_trace), cal.trace_case(*far)
    assert far_case.measured["ttft_mean_ms"] == pytest.approx(
        near_case.measured["ttft_mean_ms"] + 40.0, abs=1e-6
    )
    recording = cal.record(far_case, TRUE)
    for metric in ("e2e_mean_ms", "ttft_mean_ms", "itl_ms"):
        assert recording.predicted[metric] == pytest.approx(far_case.measured[metric], rel=1e-6)
        assert cal.reprice(recording, TRUE)[metric] == pytest.approx(
            far_case.measured[metric], rel=2e-3
        )
    # The true coefficients are the fit's optimum with the network as without it: its score
    # there is the near trace's (whole-µs rounding apart), so no round moves off them.
    at_true = [cal.fit([c], start=TRUE, rounds=0).start_score for c in (near_case, far_case)]
    assert at_true[1] == pytest.approx(at_true[0], abs=1e-4)
    # Elsewhere, the report of a replay against the far trace has the fit's start error.
    start = replace(TRUE, per_step_overhead_us=1500.0, request_overhead_us=3000.0)
    far_fit = cal.fit([far_case], start=start, rounds=0)
    report = calibration_report(*far, cal.replay_case(far_case, start))
    for metric, figure in (("ttft", "ttft_mean_ms"), ("e2e", "e2e_mean_ms")):
        fit_error = (
            far_fit.start_scores[far_case.name]["predicted"][figure] / far_case.measured[figure] - 1
        )
        assert report[metric]["mean_signed_error"] == pytest.approx(fit_error, abs=1e-6)


@pytest.mark.parametrize(
    "flag", [["--output", "x.yaml"], ["--runs", "a"], ["--holdout", "b"], ["--start", "physical"]]
)
def test_cli_report_refuses_the_flags_of_a_fit(real_trace, flag) -> None:
    """--sim-trace only reports: a flag that only a fit reads (it ignored them all, and
    --output wrote nothing) is one error naming it, exit 2, nothing on stdout."""
    header, data = real_trace
    args = ["--trace-header", header, "--trace-data", data, "--sim-trace", data, *flag]
    result = _calibrate(*args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: {flag[0]}: does not apply with --sim-trace (a report of two recorded traces, "
        "no fit); drop it, or drop --sim-trace to fit\n"
    )


def test_cli_warm_up_applies_to_the_report_as_to_the_fit(real_trace) -> None:
    """--warm-up-s is checked in every mode, named as the flag, and leaves the report the
    requests the fit would score: those sent that long after the first."""
    header, data = real_trace
    args = ["--trace-header", header, "--trace-data", data, "--sim-trace", data]
    bad = _calibrate(*args, "--warm-up-s", "-5")
    assert bad.exit_code == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: --warm-up-s: invalid value -5.0;")
    later = _calibrate(*args, "--warm-up-s", "10")
    assert later.exit_code == 0, later.output
    fitted = len(cal.trace_case(header, data, warm_up_s=10.0).positions)
    assert f"matched {fitted}," in later.stdout and 0 < fitted < 300


def test_cli_prefix_caching_is_chosen_and_said(real_trace) -> None:
    """calibrate prints its prefix-caching choice as validate and replay do, and
    --no-prefix-caching overrides what the recording says."""
    header, data = real_trace
    args = ["--trace-header", header, "--trace-data", data, "--start", "physical", "--rounds", "0"]
    default = _calibrate(*args)
    assert default.exit_code == 0, default.output
    assert "calibrate: prefix caching: on (vLLM's default" in default.stderr
    off = _calibrate(*args, "--no-prefix-caching")
    assert off.exit_code == 0, off.output
    assert "calibrate: prefix caching: off (--no-prefix-caching)" in off.stderr
    assert (
        cal.trace_case(header, data, engine__enable_prefix_caching=False).overrides[
            "engine__enable_prefix_caching"
        ]
        is False
    )


def test_cli_quiet_takes_no_value_in_the_help() -> None:
    result = CliRunner().invoke(app, ["calibrate", "-h"], terminal_width=200)
    line = next(x for x in result.stdout.splitlines() if "--quiet" in x)
    assert "<bool>" not in line and "BOOLEAN" not in line


def test_cli_cells_of_one_name_are_told_apart_by_their_folders(real_trace, tmp_path) -> None:
    """Two cells named `cell` in different folders were both renamed `cell/cell` (and then
    refused as two runs of one name): each gets the folder that tells it apart; the same
    pair given twice is an error naming the file."""
    args = []
    for parent in ("a", "b"):
        cell = tmp_path / parent / "cell"
        cell.mkdir(parents=True)
        shutil.copy(real_trace[0], cell / "trace.yaml")
        shutil.copy(real_trace[1], cell / "trace.csv")
        args += ["--trace-header", cell / "trace.yaml", "--trace-data", cell / "trace.csv"]
    result = _calibrate(*args, "--holdout", "b/", "--start", "physical", "--rounds", "0")
    assert result.exit_code == 0, result.output
    assert "a/cell" in result.stdout and "b/cell" in result.stdout
    twice = _calibrate(*args[:4], *args[:4], "--start", "physical", "--rounds", "0")
    assert twice.exit_code == 2 and "is given twice" in twice.stderr
    assert twice.stderr.count("\n") == 1


# ------------------------------------------- traces recorded by `servesim observe`: what they say


def _not_streamed(real_trace, tmp_path: Path, streamed=lambda _i: False) -> Path:
    """The recorded trace's rows with `streaming` false except where `streamed(index)`, as
    `servesim observe --no-streaming` records them (the chunk times are the fixture's)."""
    return _edit_rows(
        real_trace[1],
        tmp_path / "not-streamed.csv",
        lambda i, row: row.update(streaming="true" if streamed(i) else "false"),
    )


def test_requests_not_streamed_give_e2e_only(real_trace, tmp_path: Path) -> None:
    """`observe --no-streaming`: a row's first chunk is the first byte of the whole body, so
    first chunk - send is E2E and an ITL taken from it about 0. Such rows give the fit E2E
    only (before, their "TTFT" was fitted, ITL 14,865% off at the start)."""
    header, data = real_trace
    whole = cal.trace_case(header, data)
    case = cal.trace_case(header, _not_streamed(real_trace, tmp_path))
    assert case.not_streamed == len(case.positions) == 300
    assert case.measured["e2e_mean_ms"] == pytest.approx(whole.measured["e2e_mean_ms"])
    assert all(math.isnan(case.measured[m]) for m in ("ttft_mean_ms", "ttft_p99_ms", "itl_ms"))
    assert cal.fitted_figures(case) == ["e2e_mean_ms"]
    # The true coefficients reproduce the E2E, and nothing else is scored.
    assert cal.fit([case], start=TRUE, rounds=0).start_score == pytest.approx(0.0, abs=1e-6)
    note = cal.not_streamed_note([whole, case])
    assert note is not None and "\n" not in note
    assert note.startswith("calibrate: note: 300 of 300 requests of not-streamed were not ")
    assert cal.not_streamed_note([whole]) is None


def test_a_mixed_trace_takes_ttft_and_itl_from_the_streamed_requests(
    real_trace, tmp_path: Path
) -> None:
    header, _ = real_trace
    whole = cal.trace_case(*real_trace)
    mixed = cal.trace_case(header, _not_streamed(real_trace, tmp_path, lambda i: i % 2 == 0))
    even = whole.positions % 2 == 0
    assert mixed.not_streamed == int((~even).sum()) > 0
    ttft, e2e, out = whole.measured_ttft_ms, whole.measured_e2e_ms, whole.output_tokens
    assert mixed.measured["ttft_mean_ms"] == pytest.approx(ttft[even].mean())
    assert mixed.measured["itl_ms"] == pytest.approx(
        (e2e[even].mean() - ttft[even].mean()) / (out[even].mean() - 1)
    )
    assert mixed.measured["e2e_mean_ms"] == pytest.approx(e2e.mean())
    # The replay and the re-pricing predict the same requests' figures as were measured.
    recording = cal.record(mixed, TRUE)
    for metric in cal.FIT_METRICS:
        assert recording.predicted[metric] == pytest.approx(mixed.measured[metric], rel=1e-6)
        assert cal.reprice(recording, TRUE)[metric] == pytest.approx(
            mixed.measured[metric], rel=2e-3
        )


def test_the_report_has_no_ttft_of_requests_not_streamed(real_trace, tmp_path: Path) -> None:
    from simulator.calibration_report import format_report

    header, data = real_trace
    none = calibration_report(header, _not_streamed(real_trace, tmp_path), data)
    assert none["ttft"] is None and none["e2e"]["count"] == 300
    assert none["trace_info"]["not_streamed"] == 300
    text = format_report(none)
    assert [x for x in text.splitlines() if "TTFT" in x] == [
        "  TTFT  not measured: none of the 300 matched requests was streamed (streaming=false: "
        "the first chunk is the whole answer, so first chunk - send is E2E); E2E only"
    ]
    half = calibration_report(header, _not_streamed(real_trace, tmp_path, lambda i: i < 100), data)
    assert half["ttft"]["count"] == 100 and half["e2e"]["count"] == 300
    notes = [x for x in format_report(half).splitlines() if "not streamed" in x]
    assert notes == [
        "  note: TTFT over the 100 streamed requests only; 200 requests not streamed "
        "(streaming=false: the first chunk is the whole answer) count towards E2E only"
    ]
    # Streamed throughout: no such key or line.
    assert "not_streamed" not in calibration_report(header, data, data)["trace_info"]


def test_cli_says_in_one_line_that_requests_not_streamed_give_e2e_only(
    real_trace, tmp_path: Path
) -> None:
    header, _ = real_trace
    data = _not_streamed(real_trace, tmp_path)
    result = _calibrate("--trace-header", header, "--trace-data", data, "--rounds", "0")
    assert result.exit_code == 0, result.output
    said = [x for x in result.stderr.splitlines() if "not streamed" in x]
    assert said == [
        "calibrate: note: 300 of 300 requests of not-streamed were not streamed "
        "(streaming=false): a non-streamed answer's first chunk is its whole body, so they "
        "give E2E only, no TTFT or ITL target"
    ]
    assert "TTFT mean -" in result.stderr and "ITL -" in result.stderr
    assert "  TTFT  not measured: none of the 300 matched requests" in result.stdout


def test_nothing_measurable_to_fit_is_an_error(real_trace, tmp_path: Path) -> None:
    """A client that fell behind its schedule gives only an observe summary's ITL p50, and
    one that did not stream gives none: nothing is left to fit, which is said (exit 2)
    rather than fitted to a perfect score of 0."""
    fake = _fake_case("a")
    fake.step_level_only = True
    with pytest.raises(ConfigError, match="nothing measurable to fit on: a: its client fell"):
        cal.fit([fake], rounds=0)
    header, _ = real_trace
    first = min(r.arrival_time_us for r in read_rows(real_trace[1]))

    def late(_i: int, row: dict) -> None:  # sent 1.5 times as spread out, same latencies
        later = (int(row["arrival_time_us"]) - first) // 2
        for column in ("send_time_us", "first_chunk_time_us", "last_chunk_time_us"):
            row[column] = str(int(row[column]) + later)
        row["streaming"] = "false"

    behind = _edit_rows(real_trace[1], tmp_path / "behind.csv", late)
    result = _calibrate("--trace-header", header, "--trace-data", behind, "--rounds", "0")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "error: calibrate: nothing measurable to fit on: behind: its client fell behind its "
        "schedule, so only an observe summary.json's ITL p50 is fitted, and it has none (and "
        "no request was streamed)"
    )


def _failed(_i: int, row: dict) -> None:
    row.update(
        status="error",
        error_message="HTTP 500: injected failure",
        first_chunk_time_us="0",
        last_chunk_time_us="0",
        num_chunks="0",
        finish_reason="",
    )


def _with_header(real_trace, out: Path, **changes: object) -> Path:
    doc = yaml.safe_load(real_trace[0].read_text())
    doc.update(changes)
    out.write_text(yaml.safe_dump(doc))
    return out


def test_cli_says_which_rows_were_left_out_when_none_is_left(real_trace, tmp_path: Path) -> None:
    """Every request failed (HTTP 500), or the warm-up covers every row: the report said no
    request "matches a completed simulated request by request_id", though every simulated
    one completed. It says how many rows were left out and why."""
    header, data = real_trace
    failed = _edit_rows(data, tmp_path / "failed.csv", _failed)
    warm = _with_header(real_trace, tmp_path / "warm.yaml", warm_up_requests=300)
    some = _with_header(real_trace, tmp_path / "some.yaml", warm_up_requests=100)
    for h, d, why in (
        (header, failed, "not ok: 300 (error 300); warm-up: 0"),
        (warm, data, "not ok: 0; warm-up: 300"),
        (some, failed, "not ok: 200 (error 200); warm-up: 100"),
    ):
        result = _calibrate("--trace-header", h, "--trace-data", d, "--sim-trace", data)
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr == (
            f"error: calibration report: no request of {str(d)!r} to compare: all 300 of its "
            f"rows were left out: {why} (the header's warm_up_requests)\n"
        )
        fit = _calibrate("--trace-header", h, "--trace-data", d, "--rounds", "0")
        assert fit.exit_code == 2 and fit.stdout == ""
        assert fit.stderr == (
            f"error: calibrate: no request of {str(d)!r} to fit: all 300 of its rows were left "
            f"out: {why} (the header's warm_up_requests)\n"
        )
    # Rows left to compare that no simulated request matches are told apart.
    renamed = _edit_rows(data, tmp_path / "renamed.csv", lambda i, r: r.update(request_id=i + 1000))
    result = _calibrate("--trace-header", some, "--trace-data", data, "--sim-trace", renamed)
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: calibration report: no request of {str(data)!r} matches a completed simulated "
        "request by request_id: of its 300 rows, 200 have none and 100 were left out: not ok: "
        "0; warm-up: 100 (the header's warm_up_requests)\n"
    )


def test_a_recorded_model_servesim_lacks_is_refused_naming_where_it_was_read(
    real_trace, tmp_path: Path
) -> None:
    """`replay` simulates its default model in place of a recorded one servesim lacks, with a
    note; a fit would fold the difference into the coefficients it writes, so calibrate
    refuses, saying where the name came from and that --model chooses (docs/calibrate.md)."""
    header, data = real_trace
    server = yaml.safe_load(header.read_text())["server"]
    fake = _with_header(real_trace, tmp_path / "fake.yaml", server={**server, "model": "fake"})
    result = _calibrate("--trace-header", fake, "--trace-data", data, "--rounds", "0")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: model: 'fake', recorded in the trace header {str(fake)!r} (server.model), is "
        "not in servesim's catalog (servesim models); --model chooses the model to fit "
        "(calibrate does not fall back to a default model as replay does: the fit would fold "
        "the difference between the two into the coefficients)\n"
    )
    chosen = _calibrate(
        "--trace-header", fake, "--trace-data", data, "--model", "llama-2-7b-hf", "--rounds", "0"
    )
    assert chosen.exit_code == 0, chosen.output
    # Named by the server_config.json beside the data (the header names no model).
    cell = tmp_path / "cell"
    cell.mkdir()
    del server["model"]
    bare = _with_header(real_trace, cell / "trace.yaml", server=server)
    shutil.copy(data, cell / "trace.csv")
    (cell / "server_config.json").write_text('{"model": "acme/fake"}')
    config = str(cell / "server_config.json")
    with pytest.raises(ConfigError, match=f"'acme/fake', recorded in {config!r} \\(model\\)"):
        cal.trace_case(bare, cell / "trace.csv")
    assert cal.trace_case(bare, cell / "trace.csv", model="llama-2-7b-hf").model == "llama-2-7b-hf"
