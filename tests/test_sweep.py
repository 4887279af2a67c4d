"""Sweeps (`simulator.sweeps`): grid × seeds, determinism across worker counts, CIs,
validation before anything runs, resumability, sweep files and the `sweep` command."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import typer
import yaml
from typer.testing import CliRunner

import simulator.sweeps as sweep_mod
from simulator.cli_sweep import register
from simulator.errors import ConfigError
from simulator.sweeps import load_sweep_file, sweep

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
    assert "instance_id" not in runs.columns  # only numeric metrics
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
    with pytest.raises(ConfigError, match="seed"):
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
    assert len(lines) == 1 + 4 + 1
    assert "±" in lines[1]
    assert "student-t" in lines[-1]
    assert (out / "points.csv").is_file()
    assert len(pd.read_csv(out / "runs.csv")) == 8


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
