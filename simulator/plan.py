"""Capacity planning: the fewest instances per GPU type that meet latency / goodput SLOs.

    result = plan("scenario.yaml", {"ttft_p99_ms": 500, "itl_p99_ms": 50}, gpus=["H100", "L40S"])
    result.frontier   # one row per probe: gpu, instances, meets, worst-seed metrics
    result.per_gpu    # one row per GPU: the smallest instance count meeting the SLOs, its cost
    result.best       # the cheapest feasible choice (PlanChoice) or None
    print(result.table())

A probe simulates one instance count for every seed (one `sweep` call) and *meets* the SLOs
when every seed does: each bounded metric <= its bound and, with `min_goodput`, completed /
injected >= min_goodput. The verdict is judged on the worst seed, not on the mean.

The search per GPU is exponential (1, 2, 4, ... capped at `max_instances`) and then a
bisection between the last failing and the first meeting count. It assumes that meeting the
SLOs is monotone in the instance count (more instances never hurt), which holds for the
load-balancing routers but is not checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import ConfigError, invalid, unknown
from .metrics.results import BLIS_SUMMARY_FIELDS
from .scenario import Scenario

# Summary metrics an SLO may bound (upper bounds): the numeric BLIS fields plus the p50s.
SLO_METRICS: tuple[str, ...] = (
    *(f for f in BLIS_SUMMARY_FIELDS if f != "instance_id"),
    "ttft_p50_ms",
    "itl_p50_ms",
    "e2e_p50_ms",
    "kv_allocation_failures",
)

# ASSUMPTION -- on-demand USD per GPU-hour, one number per catalog GPU. The catalog has no
# prices; these are round mid-range figures from public on-demand list prices of specialised
# GPU clouds (Lambda, CoreWeave, RunPod, Crusoe) as summarised early 2026:
#   - pricegpu.pages.dev/blog/h100-vs-a100-cloud-price: H100 SXM 80GB $2.49-3.99/h,
#     A100 80GB SXM $1.49-2.49/h.
#   - lyceum.technology/magazine/nvidia-b200-gpu-cloud-pricing-2026: B200 on-demand
#     $4.50-6.00/h on specialised clouds.
#   - cyfuture.ai/blog/h100-vs-a100-vs-l40s-gpu-rental-guide and cudocompute.com: L40S rents
#     well below an A100 (~35% less).
# H200 is placed between H100 and B200. Hyperscaler list prices (AWS, Azure, GCP) are 2-4x
# higher; only the ratios matter for ranking, but pass `prices=` for your own rates.
DEFAULT_PRICES_USD_PER_GPU_HOUR: dict[str, float] = {
    "H100": 3.00,
    "H200": 3.50,
    "B200": 5.00,
    "A100-SXM": 1.80,  # the catalog's A100-SXM is the 80 GB part, same as A100-80
    "A100-80": 1.80,
    "L40S": 1.00,
}

ProbeCallback = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class PlanChoice:
    """One GPU type's answer: `instances` replicas of `tp` GPUs each."""

    gpu: str
    instances: int
    tp: int
    cost_per_hour_usd: float

    @property
    def total_gpus(self) -> int:
        return self.instances * self.tp

    @property
    def cost_per_hour(self) -> float:
        return self.cost_per_hour_usd


@dataclass
class PlanResult:
    """`frontier`: every probe (gpu, tp, instances, meets, goodput_worst, <metric>_worst, ...).
    `per_gpu`: per GPU the smallest meeting instance count (NaN when infeasible) and its cost.
    `best`: the cheapest feasible choice, or None when no GPU meets the SLOs."""

    frontier: pd.DataFrame
    per_gpu: pd.DataFrame
    best: PlanChoice | None
    slos: dict[str, float]
    min_goodput: float | None
    seeds: list[int]
    max_instances: int
    prices_usd_per_gpu_hour: dict[str, float] = field(default_factory=dict)
    # Said before any answer: GPUs whose latencies rest on different evidence.
    warnings: list[str] = field(default_factory=list)

    def plot(self, metric: str | None = None):
        """The frontier: worst-seed `metric` (default: the first SLO) against instance count,
        one line per GPU, the SLO bound dashed and meeting probes filled. A Figure (Agg)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        metric = metric or (next(iter(self.slos)) if self.slos else "goodput")
        column = "goodput_worst" if metric == "goodput" else f"{metric}_worst"
        fig = Figure(figsize=(7, 4.5))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for gpu, probes in self.frontier.groupby("gpu", sort=True):
            probes = probes.sort_values("instances")
            (line,) = ax.plot(probes["instances"], probes[column], marker="o", label=str(gpu))
            met = probes[probes["meets"]]
            ax.scatter(met["instances"], met[column], s=80, color=line.get_color(), zorder=3)
        bound = self.min_goodput if metric == "goodput" else self.slos.get(metric)
        if bound is not None:
            ax.axhline(bound, linestyle="--", color="grey", label=f"SLO {metric} = {_fmt(bound)}")
        ax.set_xlabel("instances")
        ax.set_ylabel(f"worst-seed {metric}")
        ax.set_title("capacity frontier (filled: meets every SLO)")
        ax.legend()
        return fig

    def table(self) -> str:
        """The probes, the per-GPU answers and the winner, as plain text."""
        bounds = [f"{m} <= {_fmt(v)}" for m, v in self.slos.items()]
        if self.min_goodput is not None:
            bounds.append(f"goodput >= {_fmt(self.min_goodput)}")
        lines = [
            f"SLOs: {', '.join(bounds)} (worst of seeds {self.seeds})",
            *(f"warning: {w}" for w in self.warnings),
            "",
            "probes:",
            _text_table(self.frontier),
            "",
            "per GPU:",
            _text_table(self.per_gpu),
            "",
        ]
        if self.best is None:
            lines.append(f"no GPU meets the SLOs with <= {self.max_instances} instances")
        else:
            b = self.best
            lines.append(
                f"best: {b.gpu} x {b.instances} instance(s) (TP {b.tp}, {b.total_gpus} GPUs), "
                f"${b.cost_per_hour_usd:.2f}/h"
            )
        return "\n".join(lines)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def _text_table(frame: pd.DataFrame) -> str:
    header = [str(c) for c in frame.columns]
    rows = [[_fmt(v) for v in rec] for rec in frame.itertuples(index=False)]
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
    )


# --- validation -----------------------------------------------------------------------------


def _check_slos(slos: Mapping[str, float]) -> dict[str, float]:
    if not isinstance(slos, Mapping):
        raise invalid("slos", slos, "must be a mapping metric -> upper bound")
    out: dict[str, float] = {}
    for name, bound in slos.items():
        if name not in SLO_METRICS:
            raise unknown("SLO metric", name, SLO_METRICS)
        if (
            isinstance(bound, bool)
            or not isinstance(bound, int | float)
            or not math.isfinite(bound)
        ):
            raise invalid(f"SLO {name}", bound, "the upper bound must be a finite number")
        out[name] = float(bound)
    return out


def _prices(overrides: Mapping[str, float] | None) -> dict[str, float]:
    """Default prices with `overrides` applied (GPU names case-insensitive), keyed by lower
    case."""
    table = {k.lower(): v for k, v in DEFAULT_PRICES_USD_PER_GPU_HOUR.items()}
    for name, price in (overrides or {}).items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not price >= 0:
            raise invalid(f"price of {name}", price, "must be a number >= 0 (USD per GPU-hour)")
        if not math.isfinite(price):
            raise invalid(f"price of {name}", price, "must be finite")
        table[str(name).lower()] = float(price)
    return table


# --- search ---------------------------------------------------------------------------------


def _search(probe: Callable[[int], bool], max_instances: int) -> int | None:
    """Smallest n in [1, max_instances] with probe(n), assuming probe is monotone."""
    last_fail = 0
    n = 1
    while True:
        if probe(n):
            break
        last_fail = n
        if n >= max_instances:
            return None
        n = min(2 * n, max_instances)
    lo, hi = last_fail, n  # lo fails (0 = nothing probed), hi meets
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            hi = mid
        else:
            lo = mid
    return hi


def plan(
    base: Scenario | dict | str | Path,
    slos: Mapping[str, float],
    gpus: Sequence[str] | None = None,
    seeds: Sequence[int] = (1, 2),
    max_instances: int = 64,
    min_goodput: float | None = None,
    workers: int | None = None,
    prices: Mapping[str, float] | None = None,
    progress: ProbeCallback | None = None,
) -> PlanResult:
    """For each GPU (default: the scenario's own), the fewest `cluster.num_instances` whose
    every seed meets `slos` (metric -> upper bound) and `min_goodput` (completed / injected);
    the cheapest feasible GPU by instances x TP x price per GPU-hour wins.

    `prices` overrides DEFAULT_PRICES_USD_PER_GPU_HOUR. `progress(row)` is called after each
    probe. A GPU that misses the SLOs at `max_instances` is infeasible (reported, no error)."""
    from .api import as_scenario, resolve_deployment, with_overrides
    from .catalog.hardware import get_gpu, load_gpu_file
    from .sweeps import _seeds, sweep

    sc = as_scenario(base)
    bounds = _check_slos(slos)
    if not bounds and min_goodput is None:
        raise ConfigError("plan: give at least one SLO (metric=bound) or min_goodput")
    if min_goodput is not None and (
        isinstance(min_goodput, bool)
        or not isinstance(min_goodput, int | float)
        or not 0 <= min_goodput <= 1
    ):
        raise invalid("min_goodput", min_goodput, "must be a fraction in [0, 1]")
    if isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances < 1:
        raise invalid("max_instances", max_instances, "must be an integer >= 1")
    seed_list = _seeds(seeds)
    price_table = _prices(prices)

    extra = load_gpu_file(sc.hardware_file) if sc.hardware_file else None
    if gpus is None:
        gpu_names = [resolve_deployment(sc).gpu.name]
    else:
        if isinstance(gpus, str) or not gpus:
            raise invalid("gpus", gpus, "must be a non-empty list of GPU names")
        gpu_names = list(dict.fromkeys(get_gpu(g, extra).name for g in gpus))
    missing = [g for g in gpu_names if g.lower() not in price_table]
    if missing and len(gpu_names) > 1:
        raise ConfigError(
            f"plan: no price for GPU {missing[0]!r}; pass prices={{{missing[0]!r}: USD/h}} "
            f"(known: {', '.join(DEFAULT_PRICES_USD_PER_GPU_HOUR)})"
        )

    probes: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    provenance: dict[str, dict[str, Any]] = {}
    for gpu in gpu_names:
        gpu_sc = with_overrides(sc, {"hardware": gpu}, source=f"plan: hardware {gpu}")
        try:
            deployment = resolve_deployment(gpu_sc)
        except ConfigError as exc:
            raise ConfigError(f"plan: GPU {gpu}: {exc}") from None
        tp = deployment.tp
        provenance[gpu] = deployment.step_model.provenance()
        price = price_table.get(gpu.lower(), math.nan)

        def probe(n: int, gpu: str = gpu, gpu_sc: Scenario = gpu_sc, tp: int = tp) -> bool:
            res = sweep(gpu_sc, {"cluster.num_instances": [n]}, seeds=seed_list, workers=workers)
            runs = res.runs
            injected = runs["injected_requests"].astype(float)
            goodput = (runs["completed_requests"] / injected.where(injected > 0)).fillna(1.0)
            row: dict[str, Any] = {"gpu": gpu, "tp": tp, "instances": n}
            meets = True
            for metric, bound in bounds.items():
                worst = float(runs[metric].max()) if metric in runs else 0.0
                row[f"{metric}_worst"] = worst
                meets = meets and worst <= bound
            row["goodput_worst"] = float(goodput.min())
            if min_goodput is not None:
                meets = meets and row["goodput_worst"] >= min_goodput
            row["meets"] = meets
            probes.append(row)
            if progress is not None:
                progress(row)
            return meets

        found = _search(probe, max_instances)
        answers.append(
            {
                "gpu": gpu,
                "tp": tp,
                "usd_per_gpu_hour": price,
                "feasible": found is not None,
                "instances": found if found is not None else math.nan,
                "total_gpus": found * tp if found is not None else math.nan,
                "cost_per_hour_usd": found * tp * price if found is not None else math.nan,
                "latency_model": provenance[gpu]["latency_model"],
                "evidence": evidence(provenance[gpu]),
            }
        )

    metric_cols = [f"{m}_worst" for m in bounds]
    frontier = pd.DataFrame(
        probes, columns=["gpu", "tp", "instances", "meets", *metric_cols, "goodput_worst"]
    )
    frontier = frontier.sort_values(["gpu", "instances"], kind="stable", key=_gpu_order(gpu_names))
    frontier = frontier.reset_index(drop=True)
    per_gpu = pd.DataFrame(answers)
    feasible = [a for a in answers if a["feasible"]]
    best = None
    if feasible:
        # Cheapest; an unpriced single GPU (NaN cost) still wins alone. Ties: fewer GPUs.
        pick = min(
            feasible,
            key=lambda a: (
                math.inf if math.isnan(a["cost_per_hour_usd"]) else a["cost_per_hour_usd"],
                a["total_gpus"],
            ),
        )
        best = PlanChoice(
            pick["gpu"], int(pick["instances"]), pick["tp"], pick["cost_per_hour_usd"]
        )
    return PlanResult(
        frontier=frontier,
        per_gpu=per_gpu,
        best=best,
        slos=bounds,
        min_goodput=None if min_goodput is None else float(min_goodput),
        seeds=seed_list,
        max_instances=max_instances,
        prices_usd_per_gpu_hour={g: price_table.get(g.lower(), math.nan) for g in gpu_names},
        warnings=mixed_evidence(provenance),
    )


def evidence(provenance: Mapping[str, Any]) -> str:
    """How a GPU's step times are known: `calibrated` (physics, fitted on this GPU),
    `transferred` (physics, another GPU's fit), `physical defaults`, `given` (a coefficients
    file) or `analytical`/`fitted` for BLIS's backends."""
    if provenance.get("latency_model") == "physics":
        return str(provenance.get("source", "given"))
    return str(provenance.get("coefficients", "")).split(":")[0] or "analytical"


def mixed_evidence(provenance: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One warning when the compared GPUs' latencies rest on different evidence: a GPU whose
    fit was measured on it against one whose fit was carried over is not a like-for-like
    comparison (docs/planning.md)."""
    kinds = {gpu: evidence(p) for gpu, p in provenance.items()}
    if len(set(kinds.values())) <= 1:
        return []
    parts = [f"{gpu}: {kind}" for gpu, kind in kinds.items()]
    return [
        "the GPUs' step times rest on different evidence (" + "; ".join(parts) + "); a "
        "calibrated GPU is measured, a transferred one uses another GPU's fit as fractions of "
        "its own peaks, so their comparison carries that GPU's transfer error "
        "(docs/latency-models.md)"
    ]


def _gpu_order(gpu_names: list[str]) -> Callable[[pd.Series], pd.Series]:
    rank = {g: i for i, g in enumerate(gpu_names)}

    def key(col: pd.Series) -> pd.Series:
        return col.map(rank) if col.name == "gpu" else col

    return key
