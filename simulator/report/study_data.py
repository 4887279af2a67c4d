"""The numbers a sweep's or a plan's report shows, as JSON-safe dicts.

A sweep: per point the mean and 95 % interval of each metric across seeds (SweepResult.points)
and the saturation knee, the smallest load at which not every seed reached a steady state (the
same rule as `SweepResult.plot_latency_vs_load`). A plan: every probe (the frontier) and each
GPU type's answer and cost (PlanResult.frontier, .per_gpu, .best).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from ..metrics.study import latency_models_line, plan_no_answer_line, point_verdicts
from .run_data import clean

# Load parameters, most telling first; otherwise the first numeric grid parameter.
LOAD_PARAMETERS = (
    "workload.rate",
    "workload.aggregate_rate",
    "cluster.num_instances",
    "workload.num_requests",
)
# Metrics drawn against load, each when the sweep has it.
CURVE_METRICS = (
    "ttft_p99_ms",
    "ttft_p50_ms",
    "itl_p99_ms",
    "e2e_p99_ms",
    "e2e_mean_ms",
    "responses_per_sec",
    "tokens_per_sec",
    "slo_attainment",
    "goodput_rps",
)
# Columns of the points table (means ± CI).
TABLE_METRICS = (
    "responses_per_sec",
    "ttft_p99_ms",
    "itl_p99_ms",
    "e2e_p99_ms",
    "slo_attainment",
    "goodput_rps",
)


def _numeric(series: pd.Series) -> bool:
    return bool(pd.to_numeric(series, errors="coerce").notna().all())


def load_parameter(sweep: Any) -> str | None:
    """The grid parameter drawn on the x axis, None when no parameter is numeric."""
    pts = sweep.points
    for name in (*LOAD_PARAMETERS, *sweep.params):
        if name in sweep.params and name in pts and _numeric(pts[name]):
            return name
    return None


def _group_label(params: list[str], values: tuple) -> str:
    return ", ".join(f"{p}={_value(v)}" for p, v in zip(params, values, strict=True))


def _value(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "default"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def sweep_data(sweep: Any) -> dict[str, Any]:
    """Curves of each metric against the load parameter, one per combination of the other
    grid parameters, with their 95 % bands and the saturation knee; and the points table."""
    pts = sweep.points
    load = load_parameter(sweep)
    metrics = [m for m in CURVE_METRICS if f"{m}_mean" in pts.columns]
    has_verdicts = {"steady_seeds", "n_seeds"} <= set(pts.columns)
    curves: list[dict[str, Any]] = []
    notes: dict[str, str] = {}
    if load is None:
        notes["curves"] = (
            "no numeric grid parameter to draw against; the table below has every point"
            if sweep.params
            else "a sweep of the base scenario alone (no grid): one point, in the table below"
        )
    else:
        others = [p for p in sweep.params if p != load]
        frame = pts.copy()
        frame["_load"] = pd.to_numeric(frame[load], errors="coerce")
        groups = list(frame.groupby(others, sort=False, dropna=False)) if others else [((), frame)]
        for key, group in groups:
            values = key if isinstance(key, tuple) else (key,)
            g = group.sort_values("_load", kind="stable")
            curve: dict[str, Any] = {
                "label": _group_label(others, values) or "all points",
                "load": g["_load"].tolist(),
                "metrics": {
                    m: {"mean": g[f"{m}_mean"].tolist(), "ci95": g[f"{m}_ci95"].tolist()}
                    for m in metrics
                },
            }
            if has_verdicts:
                steady = g["steady_seeds"].astype(int).tolist()
                n = g["n_seeds"].astype(int).tolist()
                curve["steady_seeds"], curve["n_seeds"] = steady, n
                unsteady = [i for i, (s, k) in enumerate(zip(steady, n, strict=True)) if s < k]
                curve["knee"] = (
                    {
                        "load": curve["load"][unsteady[0]],
                        "steady_seeds": steady[unsteady[0]],
                        "n_seeds": n[unsteady[0]],
                    }
                    if unsteady
                    else None
                )
                if unsteady:
                    # What the unsteady seeds were: only `saturated` makes the knee a
                    # saturation (`too short` runs were not judged at all).
                    knee_point = g["point"].iloc[unsteady[0]] if "point" in g else None
                    verdicts = point_verdicts(sweep.runs, knee_point)
                    if verdicts:
                        curve["knee"]["verdicts"] = verdicts
            curves.append(curve)
        if not has_verdicts:
            notes["knee"] = "these runs carry no steady-state verdicts: the knee is unknown"
    table_cols = [m for m in TABLE_METRICS if f"{m}_mean" in pts.columns]
    rows = []
    for rec in pts.to_dict("records"):
        row: dict[str, Any] = {"point": rec["point"]}
        for p in sweep.params:
            row[p] = _value(rec[p])
        row["n_seeds"] = rec.get("n_seeds")
        if "steady_seeds" in rec:
            row["steady_seeds"] = rec["steady_seeds"]
        for m in table_cols:
            row[f"{m}_mean"] = rec[f"{m}_mean"]
            row[f"{m}_ci95"] = rec[f"{m}_ci95"]
        rows.append(row)
    return clean(
        {
            "kind": "sweep",
            "title": f"sweep of {', '.join(sweep.params) or 'the base scenario'}",
            "params": list(sweep.params),
            "seeds": list(sweep.seeds),
            "ci_method": sweep.ci_method,
            "latency_models": latency_models_line(sweep),
            "load": load,
            "metrics": metrics,
            "curves": curves,
            "table_metrics": table_cols,
            "points": rows,
            "runs": len(sweep.runs),
            "notes": notes,
        }
    )


def plan_data(plan: Any) -> dict[str, Any]:
    """The plan's bounds, its probes, each GPU's answer and cost, and the cheapest choice."""
    frontier = plan.frontier
    best = plan.best
    return clean(
        {
            "kind": "plan",
            "title": "capacity plan",
            "slos": dict(plan.slos),
            "min_goodput": plan.min_goodput,
            "min_attainment": plan.min_attainment,
            "targets": dict(plan.targets),
            "seeds": list(plan.seeds),
            "max_instances": plan.max_instances,
            "run_requests": plan.run_requests,
            "prices_usd_per_gpu_hour": dict(plan.prices_usd_per_gpu_hour),
            "warnings": list(plan.warnings),
            "notes_text": list(plan.notes),
            "frontier": frontier.to_dict(orient="records"),
            "per_gpu": plan.per_gpu.to_dict(orient="records"),
            "best": None
            if best is None
            else {
                "gpu": best.gpu,
                "instances": best.instances,
                "tp": best.tp,
                # The instance's layout in words ("TP 2 x PP 2"), as the text answer says it.
                "layout": plan.layouts.get(best.gpu, f"TP {best.tp}"),
                "total_gpus": best.total_gpus,
                "cost_per_hour_usd": best.cost_per_hour_usd,
            },
            # The answer card's text when there is no answer.
            "no_answer": _no_answer(plan) if best is None else None,
            "notes": {},
        }
    )


def _no_answer(plan: Any) -> str:
    """Why the plan has no answer, as the text plan says it (`plan_no_answer_line`)."""
    not_planned = dict(getattr(plan, "not_planned", None) or {})
    gpus = [str(g) for g in plan.per_gpu["gpu"]] if "gpu" in plan.per_gpu else []
    return plan_no_answer_line(gpus, not_planned, plan.max_instances, at_most="≤")


def sweep_from_folder(folder: Path) -> Any:
    """A sweep's tables (`metrics.study.SweepTables`) rebuilt from its --out folder
    (runs.parquet, else runs.csv): the grid parameters are the columns between `point` and
    `seed`, as `sweep` writes them."""
    from ..errors import ConfigError
    from ..input_files import open_binary
    from ..metrics.study import TEXT_COLUMNS, SweepTables, summarize_points

    parquet, csv = folder / "runs.parquet", folder / "runs.csv"
    if parquet.is_file():
        import pyarrow

        with open_binary(parquet, "report") as handle:
            try:
                runs = pd.read_parquet(handle)
            except (pyarrow.ArrowException, ValueError, TypeError, KeyError, IndexError) as exc:
                raise ConfigError(
                    f"report: {str(parquet)!r} is not a readable Parquet table "
                    f"({type(exc).__name__})"
                ) from None
    elif csv.is_file():
        with open_binary(csv, "report") as handle:
            try:
                runs = pd.read_csv(handle)
            except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"report: {str(csv)!r} is not a readable CSV table ({type(exc).__name__})"
                ) from None
    else:
        raise ConfigError(f"report: {str(folder)!r} has neither runs.parquet nor runs.csv")
    columns = list(runs.columns)
    if "point" not in columns or "seed" not in columns or columns.index("seed") < 1:
        raise ConfigError(
            f"report: {str(folder)!r} does not hold a sweep's runs table (no point/seed columns)"
        )
    params = columns[columns.index("point") + 1 : columns.index("seed")]
    metrics = [c for c in columns if c not in {"point", "seed", *params, *TEXT_COLUMNS}]
    text = [c for c in TEXT_COLUMNS if c in columns]
    # A row cut short (a truncated file) leaves its last cells empty: told, not drawn.
    incomplete = runs[["point", "seed", *text]].isna().any(axis=1)
    if incomplete.any():
        row = int(incomplete.to_numpy().nonzero()[0][0])
        raise ConfigError(
            f"report: {str(folder)!r}: runs table row {row} is incomplete (empty "
            "point, seed or text cells): a truncated or edited file"
        )
    try:
        points, method = summarize_points(runs, params, metrics)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"report: {str(folder)!r}: the runs table does not read as a sweep's "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return SweepTables(
        runs=runs,
        points=points,
        params=params,
        metrics=metrics,
        ci_method=method,
        out=folder,
        seeds=sorted(int(s) for s in runs["seed"].unique()),
    )
