"""Standard figures of a run, from its `requests` and `steps` DataFrames.

Every function takes a result, live (`Result`) or loaded (`SavedResult`), and returns a
matplotlib `Figure` drawn on the Agg canvas; nothing touches pyplot's global state or opens a
window. Display one in a notebook by evaluating it, or save it with `fig.savefig(path)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..atomic_io import write_with
from ..errors import ConfigError

PLOT_NAMES = ("latency_cdfs", "instance_timelines", "throughput", "per_class")


def _figure(width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _cdf(ax: Any, values_ms: np.ndarray, title: str) -> None:
    values = np.sort(values_ms[~np.isnan(values_ms)])
    ax.set_title(title)
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    if len(values) == 0:
        _no_data(ax)
        return
    ax.plot(values, np.arange(1, len(values) + 1) / len(values), drawstyle="steps-post")


def latency_cdfs(result: Any) -> Figure:
    """CDFs of TTFT, per-request mean ITL (requests with ≥ 2 tokens) and E2E, in ms."""
    req: pd.DataFrame = result.requests
    fig = _figure(12, 3.8)
    axes = fig.subplots(1, 3)
    if len(req):
        ttft = req["ttft_ms"].to_numpy(dtype=float)
        itl = req.loc[req["generated_tokens"] > 1, "itl_ms"].to_numpy(dtype=float)
        e2e = req["e2e_ms"].to_numpy(dtype=float)
    else:
        ttft = itl = e2e = np.zeros(0)
    _cdf(axes[0], ttft, "TTFT")
    _cdf(axes[1], itl, "ITL (per-request mean)")
    _cdf(axes[2], e2e, "E2E (completed requests)")
    return fig


def instance_timelines(result: Any) -> Figure:
    """Queue length, running requests and KV used blocks at each step's end, per instance."""
    steps: pd.DataFrame = result.steps
    fig = _figure(12, 8)
    axes = fig.subplots(3, 1, sharex=True)
    panels = (
        ("queue_length", "queue length (requests)"),
        ("running_requests", "running (requests)"),
        ("kv_used_blocks", "KV used (blocks)"),
    )
    for ax, (_, label) in zip(axes, panels, strict=True):
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time (s)")
    if len(steps) == 0:
        for ax in axes:
            _no_data(ax)
        return fig
    for iid, group in steps.groupby("instance_id", sort=True):
        end_s = (group["start_us"] + group["step_us"]).to_numpy(dtype=float) / 1e6
        for ax, (column, _) in zip(axes, panels, strict=True):
            ax.plot(end_s, group[column].to_numpy(), drawstyle="steps-post", label=str(iid))
    if steps["instance_id"].nunique() <= 16:
        axes[0].legend(loc="upper right", fontsize="small", ncols=2)
    return fig


def throughput(result: Any, bin_s: float = 1.0) -> Figure:
    """Completed requests and output tokens per second, in bins of `bin_s` seconds.

    Output tokens are counted at the end of the step that produced them: each decode token of
    a step, plus each request's first token at its `first_token_us`.
    """
    if not bin_s > 0:
        raise ConfigError(f"throughput: invalid value bin_s={bin_s!r}; must be > 0")
    req: pd.DataFrame = result.requests
    steps: pd.DataFrame = result.steps
    fig = _figure(12, 6)
    axes = fig.subplots(2, 1, sharex=True)
    axes[0].set_ylabel("completed requests / s")
    axes[1].set_ylabel("output tokens / s")
    axes[1].set_xlabel("time (s)")
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
        for ax in axes:
            _no_data(ax)
        return fig
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


def _class_percentiles(req: pd.DataFrame, column: str) -> pd.DataFrame:
    labels = req[column].astype(str).replace("", "default")
    rows = []
    for name in sorted(labels.unique()):
        members = req[labels.to_numpy() == name]
        row: dict[str, Any] = {"class": name}
        for metric in ("ttft_ms", "e2e_ms"):
            values = members[metric].dropna().to_numpy(dtype=float)
            for p in (50, 99):
                row[f"{metric}_p{p}"] = float(np.percentile(values, p)) if len(values) else 0.0
        rows.append(row)
    return pd.DataFrame(rows)


def per_class(result: Any, column: str = "slo_class") -> Figure:
    """TTFT and E2E p50 / p99 (ms) per value of `column` (empty → "default"), as bars."""
    req: pd.DataFrame = result.requests
    if column not in req.columns:
        raise ConfigError(
            f"per_class: unknown column {column!r}; valid: {', '.join(map(str, req.columns))}"
        )
    fig = _figure(12, 4)
    axes = fig.subplots(1, 2)
    table = _class_percentiles(req, column) if len(req) else pd.DataFrame()
    for ax, metric, title in zip(axes, ("ttft_ms", "e2e_ms"), ("TTFT", "E2E"), strict=True):
        ax.set_title(f"{title} by {column}")
        ax.set_ylabel("ms")
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

    def instance_timelines(self) -> Figure:
        return instance_timelines(self._result)

    def throughput(self, bin_s: float = 1.0) -> Figure:
        return throughput(self._result, bin_s=bin_s)

    def per_class(self, column: str = "slo_class") -> Figure:
        return per_class(self._result, column=column)

    def write(self, directory: str | Path) -> list[Path]:
        return write_plots(self._result, directory)


def write_plots(result: Any, directory: str | Path, dpi: int = 100) -> list[Path]:
    """Save every standard plot as `<name>.png` in `directory`; return the paths written."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    makers = (latency_cdfs, instance_timelines, throughput, per_class)
    for name, make in zip(PLOT_NAMES, makers, strict=True):
        fig: Figure = make(result)
        path = folder / f"{name}.png"
        write_with(path, lambda tmp, f=fig: f.savefig(tmp, dpi=dpi, format="png"))
        paths.append(path)
    return paths
