"""Sweeps (`simulator.sweeps`): grid × seeds, determinism across worker counts, CIs,
validation before anything runs, resumability, sweep files and the `sweep` command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import typer
import yaml
from typer.testing import CliRunner

import simulator
import simulator.sweeps as sweep_mod
from simulator.cli.sweep import format_points_table, register
from simulator.errors import ConfigError
from simulator.sweeps import load_sweep_file, sweep
from tests.specs import CAPACITY_25_RPS

BASE = {"workload": {"num_requests": 30, "rate": 10}}
GRID = {"cluster.num_instances": [1, 2], "engine.max_num_running_reqs": [4, 64]}
SEEDS = [1, 2]


@pytest.fixture(scope="module")
def serial() -> sweep_mod.SweepResult:
    return sweep(BASE, GRID, seeds=SEEDS, workers=1)


def test_grid_times_seeds_rows_sorted(serial: sweep_mod.SweepResult) -> None:
    runs = serial.runs
    assert len(runs) == 2 * 2 * 2
    assert list(runs.columns[:4]) == ["point", *GRID, "seed"]
    assert list(runs["point"]) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(runs["seed"]) == SEEDS * 4
    assert list(runs["cluster.num_instances"]) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert list(runs["engine.max_num_running_reqs"]) == [4, 4, 64, 64] * 2
    assert {"e2e_mean_ms", "ttft_p99_ms", "responses_per_sec"} <= set(serial.metrics)
    assert "instance_id" not in runs.columns  # numeric metrics, the verdict, the model
    assert "latency_model" not in serial.metrics  # text: carried per point, not averaged
    assert (runs["completed_requests"] == 30).all()
    # Different seeds draw different traffic.
    assert runs.loc[0, "e2e_mean_ms"] != runs.loc[1, "e2e_mean_ms"]


def test_parallel_matches_serial(serial: sweep_mod.SweepResult) -> None:
    parallel = sweep(BASE, GRID, seeds=SEEDS, workers=2)
    pd.testing.assert_frame_equal(serial.runs, parallel.runs)
    pd.testing.assert_frame_equal(serial.points, parallel.points)


def test_ray_backend_matches_local(serial: sweep_mod.SweepResult) -> None:
    """The same 2×2 grid × 2 seeds on a local Ray started by the test: identical tables."""
    import ray  # the dev extra installs it; a missing Ray must fail this test, not skip it

    try:
        on_ray = sweep(BASE, GRID, seeds=SEEDS, backend="ray")
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(serial.runs, on_ray.runs)
    pd.testing.assert_frame_equal(serial.points, on_ray.points)


def test_ray_backend_without_ray_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError, match="needs Ray, which is not installed"):
        sweep(BASE, GRID, seeds=SEEDS, backend="ray")
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # keeps `sweep` a subcommand
        pass

    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({"base": BASE, "grid": GRID, "seeds": SEEDS}))
    res = CliRunner().invoke(app, ["sweep", str(sweep_file), "--backend", "ray"])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs Ray, which is not installed" in lines[0]
    assert "Traceback" not in res.output


def test_a_grid_of_more_runs_than_a_sweep_holds_is_refused_before_listing_it() -> None:
    """1,000 x 1,000 x 1,000 values built every point in a list first: MemoryError (exit 1)
    under a memory cap, and no end without one. 10^9 runs > 100,000: one error, at once."""
    grid = {"workload.rate": list(range(1, 1001)), "workload.num_requests": list(range(1, 1001)),
            "seed": list(range(1000))}  # fmt: skip
    with pytest.raises(ConfigError, match=r"1000 x 1000 x 1000 point\(s\) x 1 seed\(s\) = "):
        sweep(BASE, grid, seeds=[1])
    with pytest.raises(ConfigError, match="= 200,000 runs; a sweep is at most 100,000 runs"):
        sweep(BASE, {"workload.rate": [1, 2]}, seeds=range(100_000))


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ConfigError, match="backend: invalid value 'spark'"):
        sweep(BASE, GRID, seeds=SEEDS, backend="spark")


def test_points_mean_and_ci(serial: sweep_mod.SweepResult) -> None:
    pts = serial.points
    assert len(pts) == 4
    assert (pts["n_seeds"] == 2).all()
    for m in serial.metrics:
        assert f"{m}_mean" in pts.columns and f"{m}_ci95" in pts.columns
    for p, group in serial.runs.groupby("point"):
        row = pts[pts["point"] == p].iloc[0]
        assert row["e2e_mean_ms_mean"] == pytest.approx(group["e2e_mean_ms"].mean())
        # Two seeds: t_{0.975, 1} = 12.706, half-width = t * s / sqrt(2).
        expected = 12.706 * group["e2e_mean_ms"].std(ddof=1) / 2**0.5
        assert row["e2e_mean_ms_ci95"] == pytest.approx(expected, rel=1e-3)
    assert serial.ci_method.startswith("student-t")


def test_one_seed_has_no_ci() -> None:
    res = sweep(BASE, {"cluster.num_instances": [1]}, seeds=[3], workers=1)
    assert res.points["e2e_mean_ms_ci95"].isna().all()


@pytest.mark.parametrize(
    ("grid", "needle"),
    [
        ({"cluster.num_instance": [1]}, "unknown scenario field 'cluster.num_instance'"),
        ({"workload.rat": [1]}, "unknown scenario field 'workload.rat'"),
        ({"seed.x": [1]}, "unknown scenario field 'seed.x'"),
        ({"cluster.num_instances": [1, 0]}, "cluster.num_instances = 0"),
        ({"engine.scheduler": ["fcfs", "bogus"]}, "engine.scheduler = 'bogus'"),
        ({"cluster.num_instances": []}, "'cluster.num_instances' needs a non-empty list"),
    ],
)
def test_bad_grid_fails_before_running(
    grid: dict, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    monkeypatch.setattr(sweep_mod, "_simulate_row", lambda sc: calls.append(sc))
    with pytest.raises(ConfigError, match="grid") as info:
        sweep(BASE, {"engine.max_num_running_reqs": [4, 8], **grid}, workers=1)
    assert needle in str(info.value)
    assert calls == []


def test_a_synthetic_workload_field_on_a_v2_base_says_why_it_does_not_apply() -> None:
    base = "scenarios/bursty_gamma.yaml"  # its traffic is a v2 workload spec
    with pytest.raises(ConfigError, match="does not apply: the base's traffic is a v2"):
        sweep(base, {"workload.prompt_tokens.mean": [100, 200]}, workers=1)


def test_combined_values_validated_together() -> None:
    """PD pool sizes are only valid in pairs: a point is checked as a whole."""
    grid = {
        "cluster.num_instances": [2],
        "cluster.pd.prefill_instances": [1],
        "cluster.pd.decode_instances": [1],
    }
    res = sweep({"workload": {"num_requests": 10, "rate": 10}}, grid, workers=1)
    assert len(res.runs) == 1


def test_resume_skips_finished_runs(
    tmp_path: Path, serial: sweep_mod.SweepResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    first = sweep(BASE, GRID, seeds=SEEDS, workers=1, out=out)
    assert first.simulated == 8 and first.skipped == 0
    for name in ("runs.parquet", "runs.csv", "points.csv"):
        assert (out / name).is_file()
    pd.testing.assert_frame_equal(pd.read_parquet(out / "runs.parquet"), serial.runs)

    def boom(sc: object) -> dict:
        raise AssertionError("resumed sweep simulated a finished run")

    monkeypatch.setattr(sweep_mod, "_simulate_row", boom)
    again = sweep(BASE, GRID, seeds=SEEDS, workers=2, out=out)
    assert again.simulated == 0 and again.skipped == 8
    pd.testing.assert_frame_equal(again.runs, serial.runs)
    pd.testing.assert_frame_equal(again.points, serial.points)


def test_resume_runs_only_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    sweep(BASE, {"cluster.num_instances": [1]}, seeds=[1], workers=1, out=out)
    seen: list[tuple[int, int]] = []
    real = sweep_mod._simulate_row

    def counting(sc):  # noqa: ANN001, ANN202
        seen.append((sc.cluster.num_instances, sc.seed))
        return real(sc)

    monkeypatch.setattr(sweep_mod, "_simulate_row", counting)
    res = sweep(BASE, {"cluster.num_instances": [1, 2]}, seeds=[1], workers=1, out=out)
    assert seen == [(2, 1)]
    assert res.skipped == 1 and len(res.runs) == 2
    # A different base scenario does not reuse those runs.
    seen.clear()
    other = {"workload": {"num_requests": 20, "rate": 10}}
    sweep(other, {"cluster.num_instances": [1]}, seeds=[1], workers=1, out=out)
    assert seen == [(1, 1)]


def test_sweep_file(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(BASE))
    f = tmp_path / "sweep.yaml"
    f.write_text(
        yaml.safe_dump({"base": "scenario.yaml", "grid": GRID, "seeds": [5, 6], "workers": 1})
    )
    spec = load_sweep_file(f)
    assert spec.base.workload.num_requests == 30
    assert spec.grid == GRID and spec.seeds == [5, 6] and spec.workers == 1

    f.write_text(yaml.safe_dump({"base": BASE, "grid": GRID}))
    spec = load_sweep_file(f)
    assert spec.base.workload.rate == 10 and spec.seeds == [42] and spec.workers is None

    f.write_text(yaml.safe_dump({"base": BASE, "grid": GRID, "seed": [1]}))
    # An unknown key is told with the nearest known one and the keys allowed, as a
    # scenario's is.
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'seed' \(did you mean 'seeds'\?\); valid: base, grid, seeds, workers",
    ):
        load_sweep_file(f)
    f.write_text(yaml.safe_dump({"base": "missing.yaml", "grid": GRID}))
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_sweep_file(f)


def _cli() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop")  # two commands keep typer from collapsing `sweep` into the root
    def noop() -> None:
        pass

    return app


def test_cli_prints_points_and_writes_out(tmp_path: Path) -> None:
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump({"base": BASE, "grid": GRID, "seeds": SEEDS}))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        _cli(), ["sweep", str(f), "--workers", "1", "--out", str(out), "--quiet"]
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert "cluster.num_instances" in lines[0] and "e2e_mean_ms" in lines[0]
    assert len(lines) == 1 + 4 + 2
    assert "±" in lines[1]
    assert "student-t" in lines[-2]
    # Every result says which step-time model produced it (the default: physics, fitted).
    assert lines[-1].startswith("latency model: physics (fit for H100")
    assert (out / "points.csv").is_file()
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 8
    assert set(runs["latency_model"]) == {"physics"}
    points = pd.read_csv(out / "points.csv")
    assert set(points["latency_model"]) == {"physics"}
    assert points["latency_coefficients"].str.startswith("fit for H100").all()


@pytest.mark.parametrize(
    "doc",
    [
        {"base": BASE, "grid": {"cluster.num_instance": [1]}},
        {"base": BASE, "grid": GRID, "workerz": 2},
        {"base": BASE, "grid": {"cluster.num_instances": [0]}},
    ],
)
def test_cli_bad_sweep_file_one_line_exit_2(tmp_path: Path, doc: dict) -> None:
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    res = CliRunner().invoke(_cli(), ["sweep", str(f), "--out", str(out)])
    assert res.exit_code == 2
    assert res.stdout == ""
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert not out.exists()


# --- repr, null grid values, the printed table, latency vs load ---------------------------------


def test_repr_is_short(serial: sweep_mod.SweepResult) -> None:
    text = repr(serial)
    lines = text.splitlines()
    assert len(lines) <= 10 and all(len(line) <= 120 for line in lines)
    assert lines[0] == "SweepResult(4 point(s) x 2 seed(s) = 8 run(s); 8 simulated, 0 resumed)"
    assert "cluster.num_instances: 1, 2" in text and "engine.max_num_running_reqs: 4, 64" in text
    assert "seeds:   1, 2" in text
    assert f"metrics: {len(serial.metrics)} per run" in text
    assert serial.ci_method in text and "out:     (not saved)" in text
    # No table dump: no metric column names, no DataFrame index rows.
    assert "e2e_mean_ms" not in text and "[8 rows" not in text


def test_null_grid_value_runs_the_default() -> None:
    """`null` unsets the path: the schema's default applies (here: no PD, 256 running)."""
    base = {"workload": {"num_requests": 20, "rate": 10}, "cluster": {"num_instances": 2}}
    pd_setup = {"prefill_instances": 1, "decode_instances": 1, "decider": "always"}
    grid = {"cluster.pd": [None, pd_setup], "engine.max_num_running_reqs": [None, 4]}
    res = sweep(base, grid, seeds=[3], workers=1)
    assert len(res.runs) == 4
    plain = sweep(base, {}, seeds=[3], workers=1).runs
    first = res.runs.iloc[[0]].drop(columns=["point", *grid]).reset_index(drop=True)
    pd.testing.assert_frame_equal(first, plain.drop(columns=["point"]), check_dtype=False)
    # The PD point differs from the default one.
    assert res.runs.loc[2, "ttft_mean_ms"] != res.runs.loc[0, "ttft_mean_ms"]
    explicit = sweep(base, {"engine.max_num_running_reqs": [256]}, seeds=[3], workers=1)
    assert res.runs.loc[0, "e2e_mean_ms"] == explicit.runs.loc[0, "e2e_mean_ms"]
    assert "null (default)" in repr(res)
    table = format_points_table(res)
    assert table.splitlines()[1].split()[1:3] == ["default", "default"]


def test_a_null_grid_value_keeps_what_the_base_left_unset() -> None:
    """Unsetting a path re-reads only what the base's author wrote: a constant length's
    gaussian bounds are not given (QA: the sweep refused `max: 7000`), and a preset's length
    with one field given keeps the preset's others (chatbot's prompts: mean 256, capped at 600,
    here constant 64-token outputs)."""
    from simulator.sweeps import _point_scenario
    from simulator.workload.synthetic import synthetic_to_spec

    base = simulator.Scenario(
        workload={
            "preset": "chatbot",
            "num_requests": 20,
            "prompt_tokens": {"max": 600},
            "output_tokens": {"distribution": "constant", "value": 64},
        }
    )
    point = _point_scenario(base, {"engine.total_kv_blocks": None}, seed=1)
    [client] = synthetic_to_spec(point.workload).clients
    params = client.input_distribution.params
    assert (params["mean"], params["std_dev"], params["min"], params["max"]) == (256, 100, 2, 600)
    assert client.output_distribution.params == {"value": 64}
    res = sweep(base, {"engine.total_kv_blocks": [None, 2000]}, seeds=[1], workers=1)
    assert list(res.runs["completed_requests"]) == [20, 20]


def test_points_table_has_itl_p99_and_new_fields(serial: sweep_mod.SweepResult) -> None:
    header = format_points_table(serial).splitlines()[0].split()
    for column in ("itl_p99_ms", "goodput_rps", "slo_attainment", "steady_seeds"):
        assert column in header
    assert header.index("steady_seeds") == header.index("n_seeds") + 1


# tests/specs.py: capacity exactly 25 req/s, so 5 req/s is steady and 100 req/s saturates.
SATURATING = {
    **CAPACITY_25_RPS,
    "workload": {**CAPACITY_25_RPS["workload"], "arrival": "poisson"},
}


@pytest.fixture(scope="module")
def by_rate() -> sweep_mod.SweepResult:
    return sweep(SATURATING, {"workload.rate": [5, 100]}, seeds=[1, 2], workers=1)


def test_latency_vs_load_marks_the_saturation_point(by_rate: sweep_mod.SweepResult) -> None:
    pts = by_rate.points
    assert list(pts["steady_seeds"]) == [2, 0]
    fig = by_rate.plot_latency_vs_load("ttft_p99_ms", slo=500)
    (ax,) = fig.axes
    (curve,) = [line for line in ax.lines if line.get_gid() is None]
    assert list(curve.get_xdata()) == [5, 100]
    assert list(curve.get_ydata()) == list(pts["ttft_p99_ms_mean"])
    (saturation,) = [line for line in ax.lines if line.get_gid() == "saturation"]
    assert list(saturation.get_xdata()) == [100, 100]
    assert "workload.rate = 100 (0/2 seeds steady; 2 saturated)" in saturation.get_label()
    (slo,) = [line for line in ax.lines if line.get_gid() == "slo"]
    assert list(slo.get_ydata()) == [500, 500] and slo.get_linestyle() == "--"
    band = ax.collections[0]  # the 95% CI band
    assert band.get_paths()
    assert ax.get_xlabel() == "offered load: workload.rate (requests / s)"
    assert ax.get_ylabel() == "ttft_p99_ms (ms)"
    assert ax.get_yscale() == "log"  # the saturated point sits >50x above the steady one
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("saturation: workload.rate = 100") for t in legend)


def test_latency_vs_load_without_saturation_says_so(by_rate: sweep_mod.SweepResult) -> None:
    steady_only = replace(by_rate, points=by_rate.points[by_rate.points["workload.rate"] == 5])
    (ax,) = steady_only.plot_latency_vs_load().axes
    assert not [line for line in ax.lines if line.get_gid() == "saturation"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "no saturation: every seed steady up to workload.rate = 5" in legend


def test_only_a_saturated_verdict_is_called_saturation(by_rate: sweep_mod.SweepResult) -> None:
    """A line says saturation only at a load where some seed was judged `saturated`. 20
    requests are too few to judge at any rate (`too short`): the first unsteady load gets a
    `not steady` line naming its verdicts instead, in the figure and in the report's charts.
    Over 300 requests every seed at 100 req/s saturates."""
    from simulator.report.figures import sweep_charts
    from simulator.report.study_data import sweep_data

    base = {**SATURATING, "workload": {**SATURATING["workload"], "num_requests": 20}}
    short = sweep(base, {"workload.rate": [5, 100]}, seeds=[1, 2], workers=1)
    assert set(short.runs["steady_state"]) == {"too short"}
    for res in (short, by_rate):
        lines = res.plot_latency_vs_load().axes[0].lines
        marked = {line.get_gid(): line for line in lines if line.get_gid() is not None}
        saturated = res.runs.loc[res.runs["steady_state"] == "saturated", "workload.rate"]
        kind = "not steady" if saturated.empty else "saturation"
        if saturated.empty:
            assert "saturation" not in marked
            assert marked["not-steady"].get_label() == (
                "not steady: workload.rate = 5 (0/2 seeds steady; 2 too short)"
            )
        else:
            assert list(marked["saturation"].get_xdata()) == [saturated.min()] * 2
        for chart in sweep_charts(sweep_data(res)):
            notes = [a.text for a in chart.figure.layout.annotations]
            assert any(t.startswith(f"{kind}: ") for t in notes), notes


def test_latency_vs_load_rejects_unknown_names(by_rate: sweep_mod.SweepResult) -> None:
    with pytest.raises(ConfigError, match="not a grid parameter"):
        by_rate.plot_latency_vs_load(load="cluster.num_instances")
    with pytest.raises(ConfigError, match="unknown metric 'ttft_p999_ms'"):
        by_rate.plot_latency_vs_load(metric="ttft_p999_ms")


def test_a_rate_grid_applies_to_an_inline_v2_workload():
    """docs/sweeps.md: `workload.rate` is a v2 spec's aggregate_rate, inline or from a file.
    30 requests at 5 req/s take about twice as long to arrive as at 10 req/s."""
    scenario = {
        "workload": {
            "version": "2",
            "aggregate_rate": 10,
            "num_requests": 30,
            "clients": [
                {
                    "id": "c",
                    "rate_fraction": 1,
                    "arrival": {"process": "poisson"},
                    "input_distribution": {"type": "constant", "params": {"value": 100}},
                    "output_distribution": {"type": "constant", "params": {"value": 20}},
                }
            ],
        }
    }
    result = sweep_mod.sweep(scenario, {"workload.rate": [5, 10]}, seeds=[1], workers=1)
    points = result.points
    durations = dict(
        zip(points["workload.rate"], points["vllm_estimated_duration_s_mean"], strict=True)
    )
    assert 1.5 < durations[5] / durations[10] < 2.5


def test_numpy_grid_values_seeds_and_workers_are_plain_numbers(tmp_path: Path) -> None:
    import numpy as np

    plain = sweep(BASE, {"cluster.num_instances": [1, 2]}, seeds=[1], workers=1, out=tmp_path)
    numpy_given = sweep(
        BASE,
        {"cluster.num_instances": list(np.arange(1, 3))},
        seeds=np.array([1]),
        workers=np.int64(1),
        out=tmp_path,
    )
    # The same column type, and the same run keys: the second sweep simulated nothing.
    assert numpy_given.runs["cluster.num_instances"].tolist() == [1, 2]
    assert (
        numpy_given.runs["cluster.num_instances"].dtype == plain.runs["cluster.num_instances"].dtype
    )
    assert numpy_given.skipped == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seeds": [-1]}, "^seeds: invalid value -1; a seed is from 0"),
        ({"workers": True}, "^workers: invalid value True"),
    ],
)
def test_bad_seeds_and_workers_name_themselves(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sweep(BASE, {"cluster.num_instances": [1]}, **kwargs)


def test_an_out_that_is_a_file_is_one_output_error(tmp_path: Path) -> None:
    from simulator.errors import OutputError

    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(OutputError, match="^out: invalid value"):
            sweep(BASE, {"cluster.num_instances": [1]}, out=out)


def test_a_changed_input_file_reuses_no_run(tmp_path: Path) -> None:
    # The run key names the coefficients file by path; its contents decide too, or an edited
    # file between two sweeps into one `out` would bring back the old figures.
    from dataclasses import replace as changed

    from simulator.latency.physics import PhysicsCoefficients, coefficients_document

    coeffs = tmp_path / "coeffs.yaml"

    def write(c: PhysicsCoefficients) -> None:
        coeffs.write_text(yaml.safe_dump(coefficients_document(c)))

    base = {**BASE, "latency": {"model": "physics", "coeffs_file": str(coeffs)}}
    grid = {"workload.rate": [10]}
    write(PhysicsCoefficients())
    first = sweep(base, grid, seeds=[1], workers=1, out=tmp_path / "out")
    again = sweep(base, grid, seeds=[1], workers=1, out=tmp_path / "out")
    assert again.skipped == 1  # nothing changed: reused
    write(changed(PhysicsCoefficients(), per_step_overhead_us=5000.0))
    edited = sweep(base, grid, seeds=[1], workers=1, out=tmp_path / "out")
    assert edited.skipped == 0
    assert edited.runs["e2e_mean_ms"][0] > first.runs["e2e_mean_ms"][0]


def test_a_repeated_grid_value_and_a_stray_ray_address_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^grid: workload.rate: duplicate values in \[5, 5\]"):
        sweep(BASE, {"workload.rate": [5, 5]}, workers=1)
    # The same number written two ways is the same value of the field, so the same runs.
    with pytest.raises(ConfigError, match=r"duplicate values in \[5, 5.0\]"):
        sweep(BASE, {"workload.rate": [5, 5.0]}, workers=1)
    with pytest.raises(ConfigError, match="^ray_address: invalid value '1.2.3.4:1'"):
        sweep(BASE, {"workload.rate": [5]}, ray_address="1.2.3.4:1")


def test_the_points_table_shows_a_statistic_of_no_samples_as_a_dash() -> None:
    # A 1 µs horizon ends the run before any request completes at that point.
    res = sweep(BASE, {"horizon_us": [1, 100_000_000]}, seeds=[1], workers=1)
    lines = format_points_table(res).splitlines()
    assert "nan" not in "\n".join(lines)
    assert " - " in lines[1] + " "


def test_an_interrupt_while_writing_the_report_says_what_was_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self, path):  # Ctrl-C while the page is written
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_mod.SweepResult, "report", interrupted)
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump({"base": BASE, "grid": {"workload.rate": [10]}, "seeds": [1]}))
    out, page = tmp_path / "out", tmp_path / "r.html"
    argv = ["sweep", str(f), "--workers", "1", "--out", str(out), "--report", str(page), "-q"]
    res = CliRunner().invoke(_cli(), argv)
    assert res.exit_code == 130
    assert f"the sweep finished (its tables are in {out}), but {page} was not written" in (
        res.stderr
    )
    assert (out / "runs.csv").is_file() and not page.exists()


# --- fleet runs: counts absent when zero, fleet checks before the first run ------------------

# Two instances, one of which fails at 2 s: some seeds lose requests with it, some lose none.
FAILING_INSTANCE = {
    "cluster": {"num_instances": 2},
    "instance_lifecycle": {"initial_instances_loaded": True},
    "events": [{"at_s": 2, "action": "fail_instance", "target": "instance_0"}],
    "workload": {
        "arrival": "poisson",
        "rate": 4,
        "num_requests": 40,
        "prompt_tokens": {"distribution": "constant", "value": 256},
        "output_tokens": {"distribution": "constant", "value": 64},
    },
}


def test_zero_when_absent_lists_every_count_the_summary_omits_at_zero() -> None:
    """The law behind ZERO_WHEN_ABSENT: a summary of requests in every state, on an engine
    with a KV allocation failure, has fields that a summary of nothing lacks; those, and only
    those, are the counts a sweep row fills with 0."""
    from dataclasses import replace as changed
    from types import SimpleNamespace

    from simulator.api import simulate
    from simulator.engine.request import RequestState
    from simulator.metrics.summary import compute_summary

    (record,) = simulate(BASE).instance_records
    requests = [
        SimpleNamespace(state=state, arrival_us=0, first_token_us=1, schedule_us=1, completion_us=2)
        for state in RequestState
    ]
    everything = compute_summary("c", requests, [changed(record, kv_allocation_failures=1)], 10)
    nothing = compute_summary("c", [], [changed(record, kv_allocation_failures=0)], 10)
    assert set(everything) - set(nothing) == set(sweep_mod.ZERO_WHEN_ABSENT)


def test_a_count_absent_because_zero_averages_as_zero() -> None:
    """Mean and CI over every seed: each point's `<count>_mean` is the mean of the per-seed
    summaries' values, a field a summary left out counting as 0 (here a seed that lost no
    request with the failed instance; once it was NaN and left out of the mean)."""
    from simulator.api import simulate
    from simulator.metrics.study import ci_half_width

    seeds = [1, 2, 3, 4, 5, 6]
    res = sweep(FAILING_INSTANCE, {}, seeds=seeds, workers=1)
    summaries = [simulate(FAILING_INSTANCE, seed=s, warn_unsteady=False).summary for s in seeds]
    assert any("failed_requests" not in s for s in summaries)  # the case this test is about
    assert any("failed_requests" in s for s in summaries)
    for name in {"failed_requests", *sweep_mod.ZERO_WHEN_ABSENT}:
        per_seed = pd.Series([float(s.get(name, 0)) for s in summaries])
        assert res.runs[name].tolist() == per_seed.tolist()
        assert res.points.loc[0, f"{name}_mean"] == pytest.approx(per_seed.mean())
        half, _method = ci_half_width(per_seed)
        assert res.points.loc[0, f"{name}_ci95"] == pytest.approx(half, nan_ok=True)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            {"at_s": 2, "action": "fail_instance", "target": "instance_7"},
            "events[0].target: unknown instance 'instance_7'",
        ),
        (
            {"at_s": 2, "action": "drain_node", "node": "gpus-9x"},
            "events[0].node: unknown node 'gpus-9x'",
        ),
    ],
)
def test_a_bad_event_target_in_the_grid_fails_before_the_first_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, event: dict, message: str
) -> None:
    """The fleet plan is checked for every point before anything runs: one line naming the
    point, exit 2, nothing simulated and nothing written (the first point is valid)."""
    calls: list[object] = []
    monkeypatch.setattr(sweep_mod, "_simulate_row", lambda sc: calls.append(sc))
    pools = [
        {"name": "gpus", "gpu_type": "H100", "gpus_per_node": 1, "initial_nodes": 2, "max_nodes": 2}
    ]
    base = {**FAILING_INSTANCE, "events": [], "node_pools": pools}
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump({"base": base, "grid": {"events": [[], [event]]}}))
    out = tmp_path / "out"
    res = CliRunner().invoke(_cli(), ["sweep", str(f), "--workers", "1", "--out", str(out)])
    assert res.exit_code == 2
    assert res.stdout == ""
    (err,) = res.stderr.strip().splitlines()
    assert err.startswith("error: grid: events = [{") and "}]: " + message in err
    assert calls == [] and not out.exists()


def test_a_grid_path_into_a_list_says_what_simulate_says() -> None:
    """A dotted path cannot reach into a list field: the sweep says so as `simulate`'s
    overrides do, instead of calling a known field unknown."""
    from simulator.api import simulate

    with pytest.raises(ConfigError) as by_keyword:
        simulate(FAILING_INSTANCE, autoscaler__0__max_instances=2)
    reason = str(by_keyword.value).split("autoscaler.0.max_instances: ", 1)[1]
    assert reason.startswith("autoscaler is not a section")
    with pytest.raises(ConfigError) as in_grid:
        sweep(FAILING_INSTANCE, {"autoscaler.0.max_instances": [2]}, workers=1)
    assert str(in_grid.value) == f"grid: 'autoscaler.0.max_instances': {reason}"


def test_throughput_axes_name_what_is_counted():
    """responses_per_sec and tokens_per_sec were both '(per s)' beside goodput's
    '(requests / s)'."""
    from simulator.metrics.study import metric_label

    assert metric_label("responses_per_sec") == "responses_per_sec (requests / s)"
    assert metric_label("tokens_per_sec") == "tokens_per_sec (tokens / s)"
    assert metric_label("goodput_tokens_per_s") == "goodput_tokens_per_s (tokens / s)"
    assert metric_label("goodput_rps") == "goodput_rps (requests / s)"


# --- QA fixes: a grid's rate on a v2 spec is silent; 10 and 10.0 are one run ---------------

V2_BASE = {
    "workload": {
        "version": "2",
        "aggregate_rate": 14,
        "num_requests": 20,
        "clients": [
            {
                "id": "c",
                "rate_fraction": 1,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 64}},
                "output_distribution": {"type": "constant", "params": {"value": 8}},
            }
        ],
    }
}


def _rate_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "replaces the workload spec" in r.getMessage()
    ]


def test_a_rate_grid_on_a_v2_spec_warns_of_no_flag(tmp_path: Path, caplog) -> None:
    """docs/sweeps.md: a grid's workload.rate is a v2 spec's aggregate_rate. QA: `sweep -q`
    printed `--rate 5 replaces the workload spec's aggregate_rate 14 ...`, a flag nobody
    gave, twice per value (validation, then the run). `simulate`'s keyword still says it
    once, under its own name; the command line's --rate: tests/test_cli_workloads.py."""
    res = sweep(V2_BASE, {"workload.rate": [5, 10]}, seeds=[1], workers=1)
    assert list(res.runs["workload.rate"]) == [5, 10]
    assert _rate_warnings(caplog) == []
    (tmp_path / "sweep.yaml").write_text(
        yaml.safe_dump({"base": V2_BASE, "grid": {"workload.rate": [5, 10]}, "seeds": [1]})
    )
    from simulator.cli import app

    cli = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "-q", "--workers", "1"])
    assert cli.exit_code == 0, cli.output
    assert cli.stderr == "" and _rate_warnings(caplog) == []
    simulator.simulate(V2_BASE, workload__rate=20)
    assert _rate_warnings(caplog) == [
        "workload__rate 20 replaces the workload spec's aggregate_rate 14 (BLIS ignores --rate "
        "when a workload spec is given)"
    ]


def test_resuming_reads_10_and_10_0_as_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The duplicate check already took 5 and 5.0 for one value; the run key did not, so the
    same grid written [10.0, 20.0] re-simulated every run of [10, 20]."""
    out = tmp_path / "out"
    first = sweep(BASE, {"workload.rate": [10, 20]}, seeds=[1], workers=1, out=out)

    def boom(sc: object) -> dict:
        raise AssertionError("resumed sweep simulated a finished run")

    monkeypatch.setattr(sweep_mod, "_simulate_row", boom)
    again = sweep(BASE, {"workload.rate": [10.0, 20.0]}, seeds=[1], workers=1, out=out)
    assert again.skipped == 2 and again.simulated == 0
    metrics = [c for c in first.metrics if c in again.runs]
    pd.testing.assert_frame_equal(again.runs[metrics], first.runs[metrics])
    with pytest.raises(ConfigError, match="duplicate values"):  # nested values alike
        sweep(BASE, {"cluster.pd": [{"prefill_instances": 1}, {"prefill_instances": 1.0}]})


def test_run_keys_of_folders_written_before_the_fix_still_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An integer grid's key is what it was (hashed here as the old code hashed it), and a
    float grid's runs, written under the old key of its values as given, are found too."""
    import hashlib
    import json

    old = json.dumps({"base": "b", "params": {"workload.rate": 10}, "seed": 1}, sort_keys=True)
    assert (
        sweep_mod._run_key("b", {"workload.rate": 10}, 1)
        == (hashlib.sha256(old.encode()).hexdigest()[:24])
    )
    out = tmp_path / "out"
    real_key = sweep_mod._run_key
    monkeypatch.setattr(  # the code before the fix: values hashed as written
        sweep_mod, "_run_key", lambda b, p, s, as_given=False: real_key(b, p, s, as_given=True)
    )
    sweep(BASE, {"workload.rate": [10.0, 20.0]}, seeds=[1], workers=1, out=out)
    monkeypatch.setattr(sweep_mod, "_run_key", real_key)

    def boom(sc: object) -> dict:
        raise AssertionError("resumed sweep simulated a finished run")

    monkeypatch.setattr(sweep_mod, "_simulate_row", boom)
    again = sweep(BASE, {"workload.rate": [10.0, 20.0]}, seeds=[1], workers=1, out=out)
    assert again.skipped == 2 and again.simulated == 0


def test_a_field_assigned_inside_a_default_section_survives_a_point() -> None:
    """`sc.cluster.num_instances = 3` marks the field set on `cluster` but not `cluster` on the
    scenario: a null grid value (and any override) re-read the scenario without it, so every
    point ran one instance where `simulate(sc)` ran three."""
    from simulator.scenario import apply_overrides
    from simulator.sweeps import _point_scenario

    base = simulator.Scenario(workload={"num_requests": 5})
    base.cluster.num_instances = 3
    base.cluster.routing.policy = "least-loaded"
    point = _point_scenario(base, {"engine.total_kv_blocks": None}, seed=1)
    assert (point.cluster.num_instances, point.cluster.routing.policy) == (3, "least-loaded")
    overridden = apply_overrides(base, {"engine.max_num_running_reqs": 8})
    assert overridden.cluster.num_instances == 3
    assert overridden.engine.max_num_running_reqs == 8
