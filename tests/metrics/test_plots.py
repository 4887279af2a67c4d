"""Standard plots of a run (simulator.metrics.plots) and the `plot` CLI command."""

from __future__ import annotations

import pytest
import typer
from matplotlib.figure import Figure
from typer.testing import CliRunner

import simulator
from simulator.cli_extras import register
from simulator.errors import ConfigError
from simulator.metrics import plots
from simulator.metrics.persistence import load_result, save_result

TINY = {"workload": {"num_requests": 40, "rate": 20}, "cluster": {"num_instances": 2}}


@pytest.fixture(scope="module")
def result() -> simulator.Result:
    return simulator.simulate(TINY)


@pytest.fixture(scope="module")
def saved(result, tmp_path_factory):
    return save_result(result, tmp_path_factory.mktemp("saved") / "run")


def test_latency_cdfs(result):
    fig = plots.latency_cdfs(result)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 3
    for ax in fig.axes:
        assert len(ax.lines) == 1
        assert len(ax.lines[0].get_xdata()) > 0


def test_instance_timelines_one_line_per_instance(result):
    fig = plots.instance_timelines(result)
    assert len(fig.axes) == 3
    for ax in fig.axes:
        assert len(ax.lines) == 2
        assert all(len(line.get_xdata()) > 0 for line in ax.lines)


def test_throughput_counts_every_completion_and_token(result):
    fig = plots.throughput(result, bin_s=0.5)
    assert len(fig.axes) == 2
    (done,) = fig.axes[0].patches
    (tokens,) = fig.axes[1].patches
    assert done.get_data().values.sum() * 0.5 == pytest.approx(result.summary["completed_requests"])
    assert tokens.get_data().values.sum() * 0.5 == pytest.approx(
        result.summary["total_output_tokens"]
    )
    with pytest.raises(ConfigError, match="bin_s"):
        plots.throughput(result, bin_s=0)


def test_per_class_bars(result):
    fig = plots.per_class(result)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert len(ax.patches) == 2  # p50 and p99 of the single "default" class
        assert all(p.get_height() > 0 for p in ax.patches)
    with pytest.raises(ConfigError, match="nope"):
        plots.per_class(result, column="nope")


def test_accessor_and_loaded_result(saved):
    loaded = load_result(saved)
    assert len(loaded.plot.latency_cdfs().axes) == 3
    assert len(plots.PlotAccessor(loaded).per_class(column="tenant_id").axes) == 2


def test_write_plots(result, tmp_path):
    paths = plots.write_plots(result, tmp_path / "pngs")
    assert [p.name for p in paths] == [f"{n}.png" for n in plots.PLOT_NAMES]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 1024


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:  # keep `plot` a subcommand even though it is the only one
        pass

    return app


def test_plot_command_writes_pngs(saved, tmp_path):
    out = tmp_path / "figs"
    res = CliRunner().invoke(_app(), ["plot", str(saved), "--out", str(out)])
    assert res.exit_code == 0, res.output
    printed = res.stdout.split()
    assert printed == [str(out / f"{n}.png") for n in plots.PLOT_NAMES]
    assert all((out / f"{n}.png").stat().st_size > 1024 for n in plots.PLOT_NAMES)


def test_plot_command_missing_folder(tmp_path):
    missing = tmp_path / "missing"
    res = CliRunner().invoke(_app(), ["plot", str(missing)])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error:") and str(missing) in lines[0]
