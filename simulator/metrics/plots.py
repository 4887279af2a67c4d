"""Standard figures of a run, from its `requests` and `steps` DataFrames.

Every function takes a result, live (`Result`) or loaded (`SavedResult`), and returns a
matplotlib `Figure` drawn on the Agg canvas; nothing touches pyplot's global state or opens a
window. Display one in a notebook by evaluating it, or save it with `fig.savefig(path)`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..atomic_io import check_output_folder, replacing, require_output_path
from ..errors import ConfigError, excerpt
from .views.text import batch_limit

PLOT_NAMES = ("latency_cdfs", "instance_timelines", "throughput", "per_class")


# Time series (instance timelines) are resampled to at most this many bins per run.
DEFAULT_MAX_POINTS = 500
# The largest max_points a caller may ask for: each series is resampled into that many bins
# (several float arrays per instance and panel), so max_points=10**9 allocated tens of GB and
# was killed; 100,000 bins is already far beyond a figure's pixels. Also the most bins
# `resample` makes for a bin_s of the caller's (bin_s=1e-9 over seconds asked for billions).
MAX_POINTS = 100_000
# Throughput bars: a target of one bin per ~10 completions, clamped to these (choose_bin_s
# then gives 40-100% of the target).
MAX_THROUGHPUT_BINS = 200
# An explicit bin width may ask for more bins than the default chooses, up to this many.
MAX_EXPLICIT_THROUGHPUT_BINS = 100_000
MIN_THROUGHPUT_BINS = 20
# Above this many instances the per-bin max bands are left out (they would hide the lines).
MAX_BANDS = 8
_NICE_STEPS = (1, 2, 5)


def _require_result(result: Any, argument: str = "result") -> None:
    """A plot's `result` is a run (`simulate`'s Result or `load_result`'s SavedResult):
    anything else is a ConfigError naming the `argument`, not an AttributeError from inside."""
    kind = type(result)
    fields = getattr(kind, "__dataclass_fields__", {})  # a SavedResult holds its frames as fields
    frames = all(hasattr(kind, name) or name in fields for name in ("requests", "steps"))
    if not (frames and isinstance(getattr(result, "summary", None), dict)):
        raise ConfigError(
            f"{argument}: expected a Result (simulate) or a SavedResult (load_result); got "
            f"{type(result).__name__} {excerpt(result)}"
        )


def _figure(width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _seconds(bin_s: float) -> str:
    """A bin width for a title: "0.05 s", "2 s", "500 s"."""
    return f"{bin_s:g} s"


# --- resampling -----------------------------------------------------------------------------


def _n_bins(span_s: float, bin_s: float) -> int:
    # The tolerance keeps 5.0 / 0.01 = 500.00000000000006 at 500 bins.
    return max(1, math.ceil(span_s / bin_s - 1e-9))


def _check_bin_count(what: str, bin_s: float, span_s: float, limit: int, of: str) -> None:
    """Refuse a bin width that cuts `span_s` seconds (`of`: what spans them) into more than
    `limit` bins, before any bin is allocated: bin_s=1e-9 over a run of seconds asked for
    billions of bins (GBs and minutes for a figure that cannot show them). The error names
    the smallest width allowed, rounded up so that giving it is accepted."""
    span_s = float(span_s)  # a numpy scalar would warn on overflow (bin_s=5e-324)
    count = span_s / bin_s
    if count - 1e-9 <= limit:  # _n_bins' tolerance: 5.0 / 0.01 bins is 500, not 501
        return
    if not math.isfinite(span_s):  # no width would do: say so, not "bin_s >= inf"
        raise ConfigError(f"{what}: {of} spans {span_s} s; its end must be finite")
    smallest = span_s / limit
    # Three significant digits, rounded up (0.000123456 -> 0.000124, not 0.000123).
    unit = 10.0 ** (math.floor(math.log10(smallest)) - 2)
    allowed = math.ceil(smallest / unit) * unit
    needed = f"{math.ceil(count - 1e-9):,}" if count < 1e12 else f"{count:.3g}"
    raise ConfigError(
        f"{what}: invalid value bin_s={bin_s!r}; {of} of {span_s:.6g} s would need {needed} "
        f"bins, at most {limit:,} are made: give bin_s >= {allowed:.3g}"
    )


def choose_bin_s(span_s: float, max_points: int = DEFAULT_MAX_POINTS) -> float:
    """The smallest "nice" bin width (1, 2 or 5 × 10^k s) that covers `span_s` seconds in at
    most `max_points` bins. Consecutive nice widths differ by at most 2.5×, so a run gets
    between max_points / 2.5 and max_points bins (200–500 for the default); `max_points` is
    at most MAX_POINTS."""
    if (
        isinstance(max_points, bool)
        or not isinstance(max_points, int)
        or not 1 <= max_points <= MAX_POINTS
    ):
        raise ConfigError(
            f"max_points: invalid value {excerpt(max_points)}; must be an integer from 1 to "
            f"{MAX_POINTS:,}"
        )
    if not (math.isfinite(span_s) and span_s > 0):
        return 1.0
    k = math.floor(math.log10(span_s / max_points))
    for exponent in (k - 1, k, k + 1):  # k - 1 and k + 1 absorb log10 rounding
        for step in _NICE_STEPS:
            bin_s = step * 10.0**exponent
            if _n_bins(span_s, bin_s) <= max_points:
                return bin_s
    return 10.0 ** (k + 2)


@dataclass(frozen=True)
class Resampled:
    """A sampled quantity summarised per fixed-width time bin. `edges` (n + 1 values, s);
    `mean`: its time-weighted mean over the covered part of each bin; `max`: the largest value
    it took in the bin. Both are NaN where the series does not cover the bin."""

    edges: np.ndarray
    mean: np.ndarray
    max: np.ndarray

    @property
    def centers(self) -> np.ndarray:
        return (self.edges[:-1] + self.edges[1:]) / 2


def resample(
    times_s: Any,
    values: Any,
    bin_s: float,
    end_s: float | None = None,
    start_s: float = 0.0,
) -> Resampled:
    """Resample a piecewise-constant series into bins of `bin_s` seconds from `start_s`.

    Each value holds from its time until the next sample's time (the last one until `end_s`,
    default: its own time), as an engine's state does between two step ends. The per-bin mean
    is weighted by time, so sum(mean × covered time) is the series' exact integral; the per-bin
    max includes the value already holding when the bin opens."""
    if not (isinstance(bin_s, int | float) and not isinstance(bin_s, bool) and bin_s > 0):
        raise ConfigError(f"resample: invalid value bin_s={bin_s!r}; must be > 0")
    t = np.asarray(times_s, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.shape != v.shape or t.ndim != 1:
        raise ConfigError(
            f"resample: times and values must be 1-d and of one length, got {t.shape} and {v.shape}"
        )
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    if len(t) == 0:
        edges = np.array([start_s, start_s + bin_s])
        return Resampled(edges, np.full(1, np.nan), np.full(1, np.nan))
    end = t[-1] if end_s is None else max(float(end_s), t[-1])
    _check_bin_count("resample", bin_s, end - start_s, MAX_POINTS, "this series")
    n = _n_bins(end - start_s, bin_s)
    edges = start_s + bin_s * np.arange(n + 1)
    # The integral is piecewise linear between the knots, so interpolating it at the edges is
    # exact; np.interp clamps outside [t0, end], where the series covers nothing.
    knots = np.append(t, end)
    integral = np.concatenate([[0.0], np.cumsum(v * np.diff(knots))])
    at_edges = np.interp(edges, knots, integral)
    covered = np.diff(np.clip(edges, t[0], end))
    mean = np.full(n, np.nan)
    has = covered > 0
    mean[has] = np.diff(at_edges)[has] / covered[has]
    peak = np.full(n, -np.inf)
    holding = np.searchsorted(t, edges[:-1], side="right") - 1  # the value as each bin opens
    carried = (holding >= 0) & (edges[:-1] < end)
    peak[carried] = v[holding[carried]]
    inside = np.clip(np.floor((t - start_s) / bin_s), 0, n - 1).astype(np.int64)
    np.maximum.at(peak, inside, v)
    peak[~np.isfinite(peak)] = np.nan
    if not has.any():  # every sample at one instant: no time to weight by
        mean = peak.copy()
    return Resampled(edges, mean, peak)


# --- latency --------------------------------------------------------------------------------


def _cdf(ax: Any, values_ms: np.ndarray, title: str, xlabel: str, label: str | None = None) -> bool:
    values = np.sort(values_ms[~np.isnan(values_ms)])
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    # At most five ticks on a third of a 12-inch figure: five-digit milliseconds ran together.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    if len(values) == 0:
        return False
    ax.plot(
        values,
        np.arange(1, len(values) + 1) / len(values),
        drawstyle="steps-post",
        label=label,
    )
    return True


# (requests column, title, x label)
_CDF_PANELS = (
    ("ttft_ms", "TTFT", "time to first token (ms)"),
    ("itl_ms", "ITL (per-request mean)", "mean inter-token latency (ms)"),
    ("e2e_ms", "E2E (completed requests)", "end-to-end latency (ms)"),
)


def _latency_columns(req: pd.DataFrame) -> dict[str, np.ndarray]:
    if not len(req):
        return {column: np.zeros(0) for column, _, _ in _CDF_PANELS}
    return {
        "ttft_ms": req["ttft_ms"].to_numpy(dtype=float),
        "itl_ms": req.loc[req["generated_tokens"] > 1, "itl_ms"].to_numpy(dtype=float),
        "e2e_ms": req["e2e_ms"].to_numpy(dtype=float),
    }


def latency_cdfs(result: Any) -> Figure:
    """CDFs of TTFT, per-request mean ITL (requests with ≥ 2 tokens) and E2E, in ms."""
    _require_result(result)
    req: pd.DataFrame = result.requests
    fig = _figure(12, 3.8)
    axes = fig.subplots(1, 3)
    columns = _latency_columns(req)
    fig.suptitle(f"Latency distributions ({len(req):,} requests)")
    for ax, (column, title, xlabel) in zip(axes, _CDF_PANELS, strict=True):
        if not _cdf(ax, columns[column], title, xlabel):
            _no_data(ax)
    return fig


def compare_latency_cdfs(results: Mapping[str, Any]) -> Figure:
    """The three latency CDFs of `latency_cdfs` with one line per named result, e.g. one per
    routing policy: `compare_latency_cdfs({"round-robin": r1, "weighted": r2})`."""
    if not isinstance(results, Mapping) or not results:
        raise ConfigError("compare_latency_cdfs: needs a non-empty mapping of name -> result")
    for name, result in results.items():
        _require_result(result, f"compare_latency_cdfs: results[{name!r}]")
    fig = _figure(12, 3.8)
    axes = fig.subplots(1, 3)
    fig.suptitle(f"Latency distributions of {len(results)} runs")
    drawn = [False] * len(axes)
    for name, result in results.items():
        columns = _latency_columns(result.requests)
        for i, (ax, (column, title, xlabel)) in enumerate(zip(axes, _CDF_PANELS, strict=True)):
            drawn[i] = _cdf(ax, columns[column], title, xlabel, label=str(name)) or drawn[i]
    for ax, any_line in zip(axes, drawn, strict=True):
        if any_line:
            ax.legend(fontsize="small", loc="lower right")
        else:
            _no_data(ax)
    return fig


# --- instance timelines ---------------------------------------------------------------------

# (steps column, panel title, y label)
_TIMELINE_PANELS = (
    ("queue_length", "Waiting queue (requests not yet scheduled)", "queue length (requests)"),
    ("running_requests", "Running batch", "running (requests)"),
    ("kv_used_blocks", "KV cache use (GPU blocks)", "KV used (blocks)"),
)


def _instance_labels(result: Any, ids: list[str]) -> dict[str, str]:
    """`instance_0 (prefill)` when the run has PD roles, else the instance id."""
    roles = ((getattr(result, "scenario", None) or {}).get("resolved") or {}).get("roles") or []
    known = list(getattr(result, "instance_ids", None) or [])
    if not known:
        # A saved result keeps the ids in its instances table, in the same order.
        table = getattr(result, "instances", None)
        if isinstance(table, pd.DataFrame) and "instance_id" in table:
            known = [str(i) for i in table["instance_id"]]
    if not known or len(known) != len(roles) or set(roles) <= {"unified"}:
        return {iid: iid for iid in ids}
    role_of = dict(zip(known, roles, strict=True))
    return {iid: f"{iid} ({role_of[iid]})" if iid in role_of else iid for iid in ids}


def instance_capacities(result: Any) -> pd.DataFrame:
    """Per instance: `kv_blocks` (its KV cache's total GPU blocks) and `max_num_running_reqs`.

    A live result reads each engine; a loaded one has only the scenario: the resolved block
    count (`scenario["resolved"]["total_kv_blocks"]`), except for an instance whose steps and
    `instances` row give its own (a PD pool or deployment with other hardware or blocks)."""
    _require_result(result)
    ids = list(getattr(result, "instance_ids", None) or [])
    engines = getattr(result, "engines", None)
    if engines and len(engines) == len(ids):
        rows = [
            {
                "instance_id": iid,
                "kv_blocks": int(e.kv.total_blocks),
                "max_num_running_reqs": int(e.config.max_num_running_reqs),
            }
            for iid, e in zip(ids, engines, strict=True)
        ]
        return pd.DataFrame(rows, columns=["instance_id", "kv_blocks", "max_num_running_reqs"])
    scenario = getattr(result, "scenario", None) or {}
    kv = (scenario.get("resolved") or {}).get("total_kv_blocks")
    running = batch_limit(scenario, "max_num_running_reqs")
    steps: pd.DataFrame = result.steps
    instances: pd.DataFrame = getattr(result, "instances", pd.DataFrame())
    ids = list(dict.fromkeys(steps["instance_id"])) if len(steps) else []
    inferred: dict[str, int] = {}
    if len(steps) and {"instance_id", "mean_kv_utilization"} <= set(instances.columns):
        # instances.mean_kv_utilization = mean(kv_used_blocks over steps) / total blocks.
        used = steps.groupby("instance_id", sort=False)["kv_used_blocks"].mean()
        pairs = zip(instances["instance_id"], instances["mean_kv_utilization"], strict=True)
        for iid, util in pairs:
            if iid in used.index and util and util > 0 and used[iid] > 0:
                inferred[str(iid)] = round(float(used[iid]) / float(util))
    rows = [
        {"instance_id": iid, "kv_blocks": inferred.get(iid, kv), "max_num_running_reqs": running}
        for iid in ids
    ]
    return pd.DataFrame(rows, columns=["instance_id", "kv_blocks", "max_num_running_reqs"])


def _capacity_lines(
    ax: Any, by_instance: dict[str, Any], labels: dict[str, str], name: str, unit: str
) -> list[Any]:
    """One dashed horizontal line per distinct capacity; the legend names the instances when
    they differ."""
    groups: dict[int, list[str]] = {}
    for iid, value in by_instance.items():
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            groups.setdefault(int(value), []).append(iid)
    lines = []
    styles = ("--", ":", "-.")
    for i, (value, members) in enumerate(sorted(groups.items())):
        who = ""
        if len(groups) > 1:
            roles = sorted({labels[m].partition(" (")[2].rstrip(")") or m for m in members})
            who = f" ({', '.join(roles)})"
        line = ax.axhline(
            value,
            color="black",
            linestyle=styles[i % len(styles)],
            linewidth=1.2,
            label=f"{name}{who}: {value:,} {unit}".rstrip(),
            gid="capacity",
        )
        lines.append(line)
    return lines


def instance_timelines(result: Any, max_points: int = DEFAULT_MAX_POINTS) -> Figure:
    """Queue length, running requests and KV used blocks over time, one line per instance.

    Each series (the value at every step's end, holding until the next step ends) is resampled
    to bins of a nice width (`choose_bin_s`: at most `max_points` bins over the run): the line
    is the time-weighted mean per bin, the light band reaches the per-bin max (up to MAX_BANDS
    instances). Dashed lines: `max_num_running_reqs` on the running panel, each instance's KV
    capacity (total GPU blocks) on the KV panel."""
    _require_result(result)
    # Checked before anything is drawn or allocated, also for a run without steps.
    choose_bin_s(1.0, max_points)
    steps: pd.DataFrame = result.steps
    fig = _figure(12, 8.5)
    axes = fig.subplots(3, 1, sharex=True)
    for ax, (_, title, label) in zip(axes, _TIMELINE_PANELS, strict=True):
        ax.set_title(title, fontsize="medium")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time since start (s)")
    if len(steps) == 0:
        fig.suptitle("Per-instance state over time")
        for ax in axes:
            _no_data(ax)
        return fig
    end_us = (steps["start_us"] + steps["step_us"]).to_numpy(dtype=float)
    end_s = float(end_us.max()) / 1e6
    bin_s = choose_bin_s(end_s, max_points)
    ids = [str(i) for i in dict.fromkeys(steps["instance_id"])]
    labels = _instance_labels(result, ids)
    bands = len(ids) <= MAX_BANDS
    fig.suptitle(
        f"Per-instance state over time: mean per {_seconds(bin_s)} bin"
        + (" (line), max per bin (band)" if bands else "")
    )
    for iid, group in steps.groupby("instance_id", sort=False):
        t = (group["start_us"] + group["step_us"]).to_numpy(dtype=float) / 1e6
        for ax, (column, _, _) in zip(axes, _TIMELINE_PANELS, strict=True):
            series = resample(t, group[column].to_numpy(), bin_s, end_s=end_s)
            (line,) = ax.plot(series.centers, series.mean, linewidth=1.2, label=labels[str(iid)])
            if bands:
                ax.fill_between(
                    series.centers,
                    series.mean,
                    series.max,
                    color=line.get_color(),
                    alpha=0.2,
                    linewidth=0,
                )
    caps = instance_capacities(result)
    caps = caps[caps["instance_id"].isin(ids)]
    running_caps = _capacity_lines(
        axes[1],
        dict(zip(caps["instance_id"], caps["max_num_running_reqs"], strict=True)),
        labels,
        "max_num_running_reqs",
        "",
    )
    kv_caps = _capacity_lines(
        axes[2],
        dict(zip(caps["instance_id"], caps["kv_blocks"], strict=True)),
        labels,
        "KV capacity",
        "blocks",
    )
    if len(ids) <= 16:
        axes[0].legend(loc="upper right", fontsize="small", ncols=2)
    for ax, handles in ((axes[1], running_caps), (axes[2], kv_caps)):
        if handles:
            ax.legend(handles=handles, loc="best", fontsize="small")
    return fig


# --- throughput -----------------------------------------------------------------------------


def throughput(result: Any, bin_s: float | None = None) -> Figure:
    """Completed requests and output tokens per second, in bins of `bin_s` seconds.

    Output tokens are counted at the end of the step that produced them: each decode token of
    a step, plus each request's first token at its `first_token_us`. The default bin is the
    nice width `choose_bin_s` picks for a target of one bin per ~10 completions, clamped to
    MIN_THROUGHPUT_BINS..MAX_THROUGHPUT_BINS (so 8 to 200 bins).
    """
    _require_result(result)
    if bin_s is not None and not (
        isinstance(bin_s, int | float) and not isinstance(bin_s, bool) and bin_s > 0
    ):
        raise ConfigError(f"throughput: invalid value bin_s={bin_s!r}; must be > 0")
    req: pd.DataFrame = result.requests
    steps: pd.DataFrame = result.steps
    fig = _figure(12, 6)
    axes = fig.subplots(2, 1, sharex=True)
    axes[0].set_title("Completed requests", fontsize="medium")
    axes[0].set_ylabel("completed requests / s")
    axes[1].set_title("Output tokens (first tokens and decode tokens)", fontsize="medium")
    axes[1].set_ylabel("output tokens / s")
    axes[1].set_xlabel("time since start (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    done_s = req["completion_us"].dropna().to_numpy(dtype=float) / 1e6 if len(req) else np.zeros(0)
    first_s = (
        req["first_token_us"].dropna().to_numpy(dtype=float) / 1e6 if len(req) else np.zeros(0)
    )
    if len(steps):
        step_end_s = (steps["start_us"] + steps["step_us"]).to_numpy(dtype=float) / 1e6
        decode = steps["decode_tokens"].to_numpy(dtype=float)
    else:
        step_end_s = decode = np.zeros(0)
    end_s = max([0.0, *(a.max() for a in (done_s, first_s, step_end_s) if len(a))])
    if end_s == 0.0:
        fig.suptitle("Throughput")
        for ax in axes:
            _no_data(ax)
        return fig
    if bin_s is None:
        bins = int(np.clip(len(done_s) // 10, MIN_THROUGHPUT_BINS, MAX_THROUGHPUT_BINS))
        bin_s = choose_bin_s(end_s, bins)
    else:
        _check_bin_count("throughput", bin_s, end_s, MAX_EXPLICIT_THROUGHPUT_BINS, "this run")
    fig.suptitle(f"Throughput per {_seconds(bin_s)} bin (the last bin may be partial)")
    edges = np.arange(0.0, end_s + bin_s, bin_s)
    if len(edges) < 2:
        edges = np.array([0.0, bin_s])
    done_counts, _ = np.histogram(done_s, bins=edges)
    tokens, _ = np.histogram(step_end_s, bins=edges, weights=decode)
    first_counts, _ = np.histogram(first_s, bins=edges)
    width = np.diff(edges)
    axes[0].stairs(done_counts / width, edges, fill=True, alpha=0.7)
    axes[1].stairs((tokens + first_counts) / width, edges, fill=True, alpha=0.7)
    return fig


# --- per class ------------------------------------------------------------------------------


def _class_percentiles(req: pd.DataFrame, column: str) -> pd.DataFrame:
    labels = req[column].astype(str).replace("", "default")
    rows = []
    for name in sorted(labels.unique()):
        members = req[labels.to_numpy() == name]
        row: dict[str, Any] = {"class": name}
        for metric in ("ttft_ms", "e2e_ms"):
            values = members[metric].dropna().to_numpy(dtype=float)
            for p in (50, 99):
                # No samples, no bar (a 0-ms bar would show a class nobody served as fast).
                row[f"{metric}_p{p}"] = float(np.percentile(values, p)) if len(values) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def per_class(result: Any, column: str = "slo_class") -> Figure:
    """TTFT and E2E p50 / p99 (ms) per value of `column` (empty → "default"), as bars."""
    _require_result(result)
    req: pd.DataFrame = result.requests
    if column not in req.columns:
        raise ConfigError(
            f"per_class: unknown column {column!r}; valid: {', '.join(map(str, req.columns))}"
        )
    fig = _figure(12, 4)
    axes = fig.subplots(1, 2)
    table = _class_percentiles(req, column) if len(req) else pd.DataFrame()
    fig.suptitle(f"Latency percentiles by {column}")
    for ax, metric, title in zip(axes, ("ttft_ms", "e2e_ms"), ("TTFT", "E2E"), strict=True):
        ax.set_title(f"{title} p50 / p99 by {column}")
        ax.set_xlabel(column)
        ax.set_ylabel(f"{title} (ms)")
        ax.grid(True, axis="y", alpha=0.3)
        if table.empty:
            _no_data(ax)
            continue
        x = np.arange(len(table))
        ax.bar(x - 0.2, table[f"{metric}_p50"], width=0.4, label="p50")
        ax.bar(x + 0.2, table[f"{metric}_p99"], width=0.4, label="p99")
        ax.set_xticks(x, table["class"], rotation=30 if len(table) > 6 else 0)
        ax.legend(fontsize="small")
    return fig


class PlotAccessor:
    """`result.plot.latency_cdfs()` and friends: the plot functions bound to one result."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def latency_cdfs(self) -> Figure:
        return latency_cdfs(self._result)

    def instance_timelines(self, max_points: int = DEFAULT_MAX_POINTS) -> Figure:
        return instance_timelines(self._result, max_points=max_points)

    def throughput(self, bin_s: float | None = None) -> Figure:
        return throughput(self._result, bin_s=bin_s)

    def per_class(self, column: str = "slo_class") -> Figure:
        return per_class(self._result, column=column)

    def write(self, directory: str | Path) -> list[Path]:
        return write_plots(self._result, directory)


def write_plots(result: Any, directory: str | Path, dpi: int = 100) -> list[Path]:
    """Save every standard plot as `<name>.png` in `directory`; return the paths written."""
    _require_result(result)
    require_output_path("write_plots: directory", directory)
    folder = check_output_folder(directory)  # a clear error for a file or a device there
    makers = (latency_cdfs, instance_timelines, throughput, per_class)
    # Every figure is drawn before any is written: a result one of them cannot be drawn from
    # leaves no partial set of plots behind.
    figures: list[Figure] = [make(result) for make in makers]
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png" for name in PLOT_NAMES]
    # Every file is written to its temporary name before any is renamed into place: a full
    # disk halfway leaves neither a partial set nor earlier plots half replaced.
    try:
        with contextlib.ExitStack() as stack:
            for path, fig in zip(paths, figures, strict=True):
                fig.savefig(stack.enter_context(replacing(path)), dpi=dpi, format="png")
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if nothing else is in it
        raise
    return paths
