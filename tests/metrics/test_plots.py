"""Standard plots of a run (simulator.metrics.plots), their resampling, the plan frontier plot
and the `plot` CLI command."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import typer
from matplotlib.figure import Figure
from typer.testing import CliRunner

import simulator
from simulator.cli.plot import register
from simulator.errors import ConfigError, OutputError
from simulator.metrics import plots
from simulator.metrics.persistence import load_result, save_result
from simulator.plan import PlanResult

KV_BLOCKS = 5_000
MAX_RUNNING = 48
TINY = {
    "workload": {"num_requests": 40, "rate": 20},
    "cluster": {"num_instances": 2},
    "engine": {"total_kv_blocks": KV_BLOCKS, "max_num_running_reqs": MAX_RUNNING},
}


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


def _series(ax) -> list:
    return [line for line in ax.lines if line.get_gid() != "capacity"]


def _capacities(ax) -> list:
    return [line for line in ax.lines if line.get_gid() == "capacity"]


def test_instance_timelines_one_line_per_instance(result):
    fig = plots.instance_timelines(result)
    assert len(fig.axes) == 3
    for ax in fig.axes:
        assert [line.get_label() for line in _series(ax)] == ["instance_0", "instance_1"]
        assert all(len(line.get_xdata()) > 0 for line in _series(ax))
        assert ax.get_title() and ax.get_ylabel()
    assert fig.axes[-1].get_xlabel() == "time since start (s)"
    assert "bin" in fig.get_suptitle()


@pytest.mark.parametrize("max_points", [500, 40])
def test_instance_timelines_are_resampled(result, max_points):
    """The run has thousands of steps; each drawn series has at most `max_points` points on a
    monotone time axis, and a band (the per-bin max) per instance."""
    assert len(result.steps) > 1000
    fig = plots.instance_timelines(result, max_points=max_points)
    end_s = float((result.steps["start_us"] + result.steps["step_us"]).max()) / 1e6
    for ax in fig.axes:
        for line in _series(ax):
            x = np.asarray(line.get_xdata(), dtype=float)
            assert 0 < len(x) <= max_points
            assert (np.diff(x) > 0).all()
            assert x[0] >= 0 and x[-1] <= end_s + plots.choose_bin_s(end_s, max_points)
        assert len(ax.collections) == 2  # one max band per instance


def test_timeline_capacity_lines_are_the_configured_limits(result, saved):
    for res in (result, load_result(saved)):
        fig = plots.instance_timelines(res)
        queue, running, kv = fig.axes
        assert _capacities(queue) == []
        (cap,) = _capacities(running)
        assert list(cap.get_ydata()) == [MAX_RUNNING, MAX_RUNNING]
        assert "max_num_running_reqs" in cap.get_label()
        (cap,) = _capacities(kv)
        assert list(cap.get_ydata()) == [KV_BLOCKS, KV_BLOCKS]
        assert cap.get_label() == f"KV capacity: {KV_BLOCKS:,} blocks"
        caps = plots.instance_capacities(res)
        assert list(caps["kv_blocks"]) == [KV_BLOCKS, KV_BLOCKS]
        assert list(caps["max_num_running_reqs"]) == [MAX_RUNNING, MAX_RUNNING]


def test_choose_bin_s_gives_200_to_500_nice_bins():
    for span in (0.37, 1.0, 5.0, 7.3, 99.9, 100.0, 1234.5, 86_400.0):
        bin_s = plots.choose_bin_s(span)
        n = int(np.ceil(span / bin_s - 1e-9))
        assert 200 <= n <= 500, (span, bin_s, n)
        mantissa = bin_s / 10 ** np.floor(np.log10(bin_s) + 1e-9)
        assert round(mantissa, 6) in (1, 2, 5)
    assert plots.choose_bin_s(10.0, max_points=10) == 1.0
    with pytest.raises(ConfigError, match="max_points"):
        plots.choose_bin_s(10.0, max_points=0)


def test_resample_constant_series_is_that_constant():
    t = np.sort(np.random.default_rng(1).uniform(0, 10, 5_000))
    r = plots.resample(t, np.full(len(t), 7.0), 0.05, end_s=10.0)
    assert len(r.mean) == len(r.max) == len(r.edges) - 1 == 200
    assert (np.diff(r.edges) > 0).all() and (np.diff(r.centers) > 0).all()
    covered = ~np.isnan(r.mean)
    assert covered[1:].all()  # only the bin before the first sample can be empty
    assert np.allclose(r.mean[covered], 7.0) and np.allclose(r.max[covered], 7.0)


def test_resample_conserves_the_integral_and_bounds_the_mean():
    rng = np.random.default_rng(2)
    t = np.sort(rng.uniform(0.3, 9.0, 3_000))
    v = rng.integers(0, 50, len(t)).astype(float)
    end = 9.5
    r = plots.resample(t, v, 0.1, end_s=end)
    covered = np.diff(np.clip(r.edges, t[0], end))
    exact = float(np.sum(v * np.diff(np.append(t, end))))
    assert np.nansum(r.mean * covered) == pytest.approx(exact, rel=1e-12)
    ok = ~np.isnan(r.mean)
    assert (r.mean[ok] <= r.max[ok] + 1e-9).all()
    assert np.nanmax(r.max) == v.max()


def test_resample_max_includes_the_value_holding_into_the_bin():
    # 5 holds from t=0.5 until t=2.5: bins [1, 2) and [2, 3) both see it.
    r = plots.resample([0.5, 2.5], [5.0, 1.0], 1.0, end_s=4.0)
    assert list(r.max) == [5.0, 5.0, 5.0, 1.0]
    assert list(r.mean) == [5.0, 5.0, 3.0, 1.0]
    with pytest.raises(ConfigError, match="bin_s"):
        plots.resample([0.0], [1.0], 0)


@pytest.mark.parametrize("bin_s", [0.5, None])
def test_throughput_counts_every_completion_and_token(result, bin_s):
    fig = plots.throughput(result, bin_s=bin_s)
    assert len(fig.axes) == 2
    (done,) = fig.axes[0].patches
    (tokens,) = fig.axes[1].patches
    edges = done.get_data().edges
    width = np.diff(edges)
    if bin_s is None:  # choose_bin_s: 40-100% of the target count of ~10 completions per bin
        assert plots.MIN_THROUGHPUT_BINS * 0.4 <= len(width) <= plots.MAX_THROUGHPUT_BINS + 1
    else:
        assert (width == bin_s).all()
    assert (done.get_data().values * width).sum() == pytest.approx(
        result.summary["completed_requests"]
    )
    assert (tokens.get_data().values * width).sum() == pytest.approx(
        result.summary["total_output_tokens"]
    )
    assert fig.axes[0].get_ylabel() == "completed requests / s"
    with pytest.raises(ConfigError, match="bin_s"):
        plots.throughput(result, bin_s=0)


def test_compare_latency_cdfs_one_line_per_run(result, saved):
    fig = plots.compare_latency_cdfs({"live": result, "saved": load_result(saved)})
    assert len(fig.axes) == 3
    for ax in fig.axes:
        assert [line.get_label() for line in ax.lines] == ["live", "saved"]
        assert ax.get_xlabel().endswith("(ms)")
    with pytest.raises(ConfigError, match="non-empty"):
        plots.compare_latency_cdfs({})


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


def test_plan_plot_marks_unsteady_failures():
    frontier = pd.DataFrame(
        {
            "gpu": ["H100"] * 4,
            "tp": [1] * 4,
            "instances": [1, 2, 3, 4],
            "meets": [False, False, True, True],
            "steady": [False, True, True, True],
            "attainment_worst": [0.1, 0.5, 1.0, 1.0],
            "ttft_p99_ms_worst": [900.0, 400.0, 10.0, 10.0],
            "goodput_worst": [1.0] * 4,
            "reason": ["", "", "", ""],
        }
    )
    result = PlanResult(
        frontier=frontier,
        per_gpu=pd.DataFrame(),
        best=None,
        slos={"ttft_p99_ms": 50.0},
        min_goodput=None,
        seeds=[1, 2],
        max_instances=4,
    )
    (ax,) = result.plot().axes
    frontier_line, slo = ax.lines
    assert list(frontier_line.get_xdata()) == [1, 2, 3, 4]
    assert list(slo.get_ydata()) == [50.0, 50.0]
    met, unsteady = ax.collections
    assert [tuple(xy) for xy in met.get_offsets()] == [(3, 10.0), (4, 10.0)]
    assert [tuple(xy) for xy in unsteady.get_offsets()] == [(1, 900.0)]
    assert unsteady.get_label() == "fails, not every seed steady"
    assert ax.get_ylabel() == "worst-seed ttft_p99_ms (ms)"


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


def test_a_write_that_fails_halfway_leaves_no_partial_set(result, tmp_path, monkeypatch):
    """A full disk at the third plot left the first two (a new folder with 1 of 4 plots, or
    earlier plots half replaced). Every file is written before any is renamed into place:
    a failure leaves the folder as it was (a new one removed), and earlier plots untouched."""
    import errno

    real = Figure.savefig
    calls = []

    def full_disk_at_the_third(self, fname, *args, **kwargs):
        calls.append(fname)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", full_disk_at_the_third)
    with pytest.raises(OutputError, match="No space left on device"):
        plots.write_plots(result, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    monkeypatch.setattr(Figure, "savefig", real)
    before = {p.name: p.read_bytes() for p in plots.write_plots(result, kept)}
    calls.clear()
    monkeypatch.setattr(Figure, "savefig", full_disk_at_the_third)
    with pytest.raises(OutputError):
        plots.write_plots(result, kept)
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before


def test_a_saved_pd_result_keeps_its_pools_roles_in_the_labels(tmp_path):
    """The live plot names instances by role (`instance_0 (prefill)`); the same result
    loaded from a folder lost them (a saved result has no instance_ids attribute, only the
    instances table)."""
    from simulator.metrics.plots import _instance_labels
    from tests.specs import one_prefill_one_decode

    run = simulator.simulate(
        {"cluster": one_prefill_one_decode(), "workload": {"num_requests": 6}},
        warn_unsteady=False,
    )
    loaded = load_result(save_result(run, tmp_path / "pd"))
    ids = ["instance_0", "instance_1"]
    expected = {"instance_0": "instance_0 (prefill)", "instance_1": "instance_1 (decode)"}
    assert _instance_labels(run, ids) == _instance_labels(loaded, ids) == expected


def test_latency_cdf_axes_keep_their_tick_labels_apart(result):
    """Five-digit milliseconds on a third of a 12-inch figure ran together
    ('5000 10000150002000025000'): at most five ticks per axis."""
    fig = plots.latency_cdfs(result)
    fig.canvas.draw()
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert len([t for t in ax.get_xticks() if lo <= t <= hi]) <= 6
