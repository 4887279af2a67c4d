"""What a sweep (or a report of one) shows: per (point, seed) run the summary metrics, per
point their mean and 95 % confidence interval across seeds, the axis labels of its figures.

`SweepTables` holds a sweep's tables and draws them; `sweeps.SweepResult` is a SweepTables
that can also write its HTML report. A sweep's --out folder loaded back by the report
(`report.study_data.sweep_from_folder`) is a SweepTables: this module sits below both the
sweeps and the report and imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, excerpt

CI_LEVEL = 0.95
# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (used when scipy is absent).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964
# Summary fields kept as text in `runs` (not averaged in `points`): the steady-state verdict,
# and which step-time model priced the run with its coefficients' source (every result says
# which model produced it; `points` carries them per point).
LATENCY_COLUMNS = ("latency_model", "latency_coefficients")
TEXT_COLUMNS = ("steady_state", *LATENCY_COLUMNS)


@dataclass(repr=False)
class SweepTables:
    """A sweep's tables. `runs`: tidy, one row per (point, seed), sorted by point then seed.
    `points`: per point, `<metric>_mean` and `<metric>_ci95` (half-width of the 95% CI of the
    mean across seeds)."""

    runs: pd.DataFrame
    points: pd.DataFrame
    params: list[str]
    metrics: list[str]
    ci_method: str
    simulated: int = 0
    skipped: int = 0
    out: Path | None = None
    seeds: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        """A few lines: the grid, the counts, the seeds, the CI method and the folder (the
        tables themselves are `runs` and `points`)."""
        n_points, n_runs = len(self.points), len(self.runs)
        grid = "; ".join(
            f"{p}: {values_text(pd.unique(self.points[p]) if p in self.points else [])}"
            for p in self.params
        )
        lines = [
            f"{type(self).__name__}({n_points} point(s) x {len(self.seeds)} seed(s) = "
            f"{n_runs} run(s); {self.simulated} simulated, {self.skipped} resumed)",
            f"  params:  {grid or '(none: the base scenario only)'}",
            f"  seeds:   {values_text(self.seeds, limit=10)}",
            f"  metrics: {len(self.metrics)} per run; points has <metric>_mean and <metric>_ci95",
            f"  CI:      95% half-width, {self.ci_method}",
        ]
        if {"steady_seeds", "n_seeds"} <= set(self.points.columns):
            steady = int(self.points["steady_seeds"].sum())
            lines.append(f"  steady:  {steady} of {int(self.points['n_seeds'].sum())} run(s)")
        lines.append(f"  out:     {self.out if self.out is not None else '(not saved)'}")
        return "\n".join(lines)

    def plot_latency_vs_load(
        self,
        metric: str = "ttft_p99_ms",
        load: str = "workload.rate",
        slo: float | None = None,
        log_y: bool | None = None,
    ):
        """`metric` (mean across seeds, 95% CI band) against the grid parameter `load`, one
        line per combination of the other grid parameters; a dashed line at `slo` when given.
        The y axis is logarithmic when `log_y`, by default when the means span more than 50x.

        Every point at which not every seed reached a steady state (`steady_seeds <
        n_seeds`) is an X. The saturation point, the smallest load at which a seed's verdict
        was `saturated`, is a dotted vertical line; when the first unsteady load comes before
        it (its seeds `too short` or `not steady`, not saturated), that load has a dash-dot
        line labelled `not steady`. Each line's legend gives the seeds' verdicts; when every
        load is steady the legend says so. A Figure (Agg canvas)."""
        from .plots import _figure

        if load not in self.params:
            raise ConfigError(
                f"plot_latency_vs_load: load {excerpt(load)} is not a grid parameter; "
                f"grid: {', '.join(self.params) or '(none)'}"
            )
        if f"{metric}_mean" not in self.points.columns:
            raise ConfigError(
                f"plot_latency_vs_load: unknown metric {excerpt(metric)}; valid: "
                f"{', '.join(sorted(self.metrics))}"
            )
        if slo is not None and (
            isinstance(slo, bool) or not isinstance(slo, int | float) or not math.isfinite(slo)
        ):
            raise ConfigError(f"plot_latency_vs_load: invalid value slo={slo!r}; a number")
        pts = self.points.copy()
        pts["_load"] = pd.to_numeric(pts[load], errors="coerce")
        if pts["_load"].isna().any():
            raise ConfigError(
                f"plot_latency_vs_load: load {excerpt(load)} needs numeric values, got "
                f"{excerpt(list(self.points[load]))}"
            )
        has_verdicts = {"steady_seeds", "n_seeds"} <= set(pts.columns)
        others = [p for p in self.params if p != load]
        groups = list(pts.groupby(others, sort=False, dropna=False)) if others else [((), pts)]
        fig = _figure(8, 5)
        ax = fig.add_subplot(1, 1, 1)
        marked_unsteady = False
        for key, group in groups:
            values = key if isinstance(key, tuple) else (key,)
            name = ", ".join(f"{p}={v}" for p, v in zip(others, values, strict=True))
            g = group.sort_values("_load", kind="stable")
            x = g["_load"].to_numpy(dtype=float)
            y = g[f"{metric}_mean"].to_numpy(dtype=float)
            half = g[f"{metric}_ci95"].to_numpy(dtype=float)
            (line,) = ax.plot(x, y, marker="o", label=name or f"{metric} (mean)")
            color = line.get_color()
            band = ~np.isnan(half)
            if band.any():
                ax.fill_between(
                    x[band],
                    (y - half)[band],
                    (y + half)[band],
                    color=color,
                    alpha=0.2,
                    linewidth=0,
                )
            suffix = f" ({name})" if name else ""
            if not has_verdicts:
                ax.plot([], [], " ", label=f"saturation unknown{suffix}: no steady-state verdicts")
                continue
            unsteady = (g["steady_seeds"] < g["n_seeds"]).to_numpy()
            verdicts = [point_verdicts(self.runs, p) for p in g.get("point", [None] * len(g))]
            saturated = np.array([v.get("saturated", 0) > 0 for v in verdicts], dtype=bool)
            if unsteady.any():
                ax.scatter(
                    x[unsteady],
                    y[unsteady],
                    marker="X",
                    s=110,
                    color=color,
                    zorder=3,
                    edgecolors="black",
                    linewidths=0.6,
                    label=None if marked_unsteady else "not every seed steady",
                )
                marked_unsteady = True
                # Only a `saturated` verdict is saturation: a `too short` or `not steady` seed
                # says the run could not be judged or lost requests, not that the load is
                # beyond capacity, so it gets a line of its own, named for what it was.
                first = int(np.flatnonzero(unsteady)[0])
                first_saturated = int(np.flatnonzero(saturated)[0]) if saturated.any() else None
                lines = []  # (point, what, line style, width)
                if first_saturated is None or first < first_saturated:
                    lines.append((first, "not steady", "-.", 1.2))
                if first_saturated is not None:
                    lines.append((first_saturated, "saturation", ":", 1.5))
                for k, what, style, width in lines:
                    ax.axvline(
                        x[k],
                        color=color,
                        linestyle=style,
                        linewidth=width,
                        gid=what.replace(" ", "-"),
                        label=f"{what}{suffix}: {load} = {x[k]:g} "
                        f"({seeds_text(g.iloc[k], verdicts[k])})",
                    )
            else:
                ax.plot(
                    [],
                    [],
                    " ",
                    gid="no-saturation",
                    label=f"no saturation{suffix}: every seed steady up to {load} = {x.max():g}",
                )
        if slo is not None:
            ax.axhline(
                slo,
                color="grey",
                linestyle="--",
                linewidth=1.2,
                gid="slo",
                label=f"SLO: {metric} = {slo:g}",
            )
        n_seeds = len(self.seeds) or int(pts["n_seeds"].max())
        means = pts[f"{metric}_mean"].to_numpy(dtype=float)
        means = means[np.isfinite(means)]
        if log_y is None:  # a saturated point easily sits 100x above the rest
            log_y = bool(len(means)) and means.min() > 0 and means.max() / means.min() > 50
        if log_y:
            ax.set_yscale("log")
        ax.set_title(f"{metric} vs {load}: mean ± 95% CI over {n_seeds} seed(s)")
        ax.set_xlabel(LOAD_LABELS.get(load, load))
        ax.set_ylabel(metric_label(metric))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        return fig


# Axis labels (with units) of common load parameters and metric suffixes.
LOAD_LABELS = {
    "workload.rate": "offered load: workload.rate (requests / s)",
    "workload.aggregate_rate": "offered load: workload.aggregate_rate (requests / s)",
    "workload.num_requests": "workload.num_requests (requests)",
    "cluster.num_instances": "cluster.num_instances (instances)",
}
_METRIC_UNITS = (
    ("_ms", "ms"),
    ("tokens_per_sec", "tokens / s"),
    ("tokens_per_s", "tokens / s"),
    ("responses_per_sec", "requests / s"),
    ("_per_sec", "per s"),
    ("_per_s", "per s"),
    ("_rps", "requests / s"),
    ("_tps", "tokens / s"),
    ("_s", "s"),
    ("_requests", "requests"),
    ("_rate", "fraction"),
    ("_attainment", "fraction"),
)


def metric_label(metric: str) -> str:
    unit = next((u for suffix, u in _METRIC_UNITS if metric.endswith(suffix)), None)
    return f"{metric} ({unit})" if unit else metric


def values_text(values: Sequence[Any], limit: int = 6) -> str:
    """`1, 2, 4` or `1, 2, 3, ..., 50 (50 values)`; each value cut to 30 characters."""

    def one(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "null (default)"  # a null grid value (NaN in a numeric column)
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # an integer column that also holds a null turned float
        text = str(v)
        return text if len(text) <= 30 else text[:27] + "..."

    items = list(values)
    if len(items) <= limit:
        return ", ".join(one(v) for v in items)
    head = ", ".join(one(v) for v in items[: limit - 1])
    return f"{head}, ..., {one(items[-1])} ({len(items)} values)"


# --- confidence intervals -------------------------------------------------------------------


def t_quantile_975(df: int) -> tuple[float, str]:
    """The 97.5% quantile for a two-sided 95% CI with `df` degrees of freedom, and its method."""
    try:
        from scipy import stats

        return float(stats.t.ppf(0.975, df)), "student-t (scipy)"
    except ImportError:
        if df <= len(_T975):
            return _T975[df - 1], "student-t (table)"
        return _Z975, "normal (z=1.96)"


def ci_half_width(values: pd.Series) -> tuple[float, str]:
    """Half-width of the 95% CI of the mean of `values` (NaN below two), and its method."""
    x = values.dropna()
    n = len(x)
    if n < 2:
        return math.nan, "n<2"
    q, method = t_quantile_975(n - 1)
    return q * float(x.std(ddof=1)) / math.sqrt(n), method


def point_verdicts(runs: pd.DataFrame, point: Any) -> dict[str, int]:
    """How many of `point`'s seeds got each steady-state verdict other than `steady`, most
    first ({} when the runs carry no verdicts)."""
    if not {"point", "steady_state"} <= set(runs.columns):
        return {}
    verdicts = runs.loc[runs["point"] == point, "steady_state"].astype(str)
    counts = verdicts[verdicts != "steady"].value_counts()
    return {str(v): int(n) for v, n in counts.items()}


def seeds_text(row: Any, verdicts: dict[str, int]) -> str:
    """`1/3 seeds steady; 2 too short`: a point's steady seeds and what the others were."""
    text = f"{int(row['steady_seeds'])}/{int(row['n_seeds'])} seeds steady"
    others = ", ".join(f"{n} {verdict}" for verdict, n in verdicts.items())
    return f"{text}; {others}" if others else text


def summarize_points(
    runs: pd.DataFrame, params: list[str], metrics: list[str]
) -> tuple[pd.DataFrame, str]:
    """Per point: the parameters, `n_seeds`, and `<metric>_mean` / `<metric>_ci95` columns."""
    rows = []
    methods: set[str] = set()
    for p, group in runs.groupby("point", sort=True):
        row: dict[str, Any] = {"point": p}
        row.update({k: group[k].iloc[0] for k in params})
        row["n_seeds"] = len(group)
        if "steady_state" in group:
            row["steady_seeds"] = int((group["steady_state"] == "steady").sum())
        for name in LATENCY_COLUMNS:
            if name in group:
                row[name] = " | ".join(dict.fromkeys(group[name].astype(str)))
        for m in metrics:
            values = pd.to_numeric(group[m], errors="coerce")
            half, method = ci_half_width(values)
            methods.add(method)
            row[f"{m}_mean"] = float(values.mean())
            row[f"{m}_ci95"] = half
        rows.append(row)
    real = sorted(methods - {"n<2"})
    method = ", ".join(real) if real else "none (one seed per point)"
    return pd.DataFrame(rows), method


def latency_models_line(tables: SweepTables) -> str | None:
    """One line naming the step-time model(s) and coefficient source(s) a sweep's runs used,
    or None for tables saved before they were recorded."""
    if not set(LATENCY_COLUMNS) <= set(tables.runs.columns):
        return None
    pairs = dict.fromkeys(
        (model, source if isinstance(source, str) else "")
        for model, source in zip(
            tables.runs["latency_model"], tables.runs["latency_coefficients"], strict=True
        )
        if isinstance(model, str)  # runs resumed from a sweep saved before: NaN
    )
    shown = "; ".join(f"{model} ({source})" if source else str(model) for model, source in pairs)
    return f"latency model: {shown}"


def plan_no_answer_line(
    gpus: Sequence[str], not_planned: dict[str, str], max_instances: int, at_most: str = "<="
) -> str:
    """Why a plan has no answer, one line for the text plan and its HTML page: no GPU met the
    SLOs within `max_instances`, or none could be planned at all (the model fits no layout
    there, so nothing was simulated and no instance count was too few)."""
    skipped = [g for g in gpus if g in not_planned]
    if gpus and len(skipped) == len(gpus):
        reasons = {not_planned[g] for g in skipped}
        if len(reasons) == 1:
            return (
                f"no GPU could be planned ({', '.join(skipped)}), nothing was simulated: "
                f"{reasons.pop()}"
            )
        why = "; ".join(f"{g}: {not_planned[g]}" for g in skipped)
        return f"no GPU could be planned, nothing was simulated: {why}"
    line = f"no GPU meets the SLOs with {at_most} {max_instances} instances"
    if skipped:
        line += f" ({', '.join(skipped)} not planned: see the warnings)"
    return line
