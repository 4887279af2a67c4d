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
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import ConfigError, invalid, unknown
from .limits import MAX_REQUESTS
from .metrics.results import BLIS_SUMMARY_FIELDS
from .scenario import Scenario

# Fields where more is better or that describe the load rather than the service: an upper
# bound on them would fail a fleet for serving well (more instances finish more requests).
NOT_UPPER_BOUNDED = frozenset(
    {
        "instance_id",
        "completed_requests",
        "injected_requests",
        "total_input_tokens",
        "total_output_tokens",
        "vllm_estimated_duration_s",
        "responses_per_sec",
        "tokens_per_sec",
    }
)
# Summary metrics an SLO may bound (upper bounds): the BLIS fields where less is better, plus
# the p50s.
SLO_METRICS: tuple[str, ...] = (
    *(f for f in BLIS_SUMMARY_FIELDS if f not in NOT_UPPER_BOUNDED),
    "ttft_p50_ms",
    "itl_p50_ms",
    "e2e_p50_ms",
    "kv_allocation_failures",
)


def _default_prices() -> dict[str, float]:
    """The bundled price table (catalog/data/prices.yaml: indicative on-demand list prices of
    specialised GPU clouds, each GPU's sources and their dates in the file's comments)."""
    from .input_files import bundled_yaml

    text = (
        resources.files("simulator.catalog")
        .joinpath("data/prices.yaml")
        .read_text(encoding="utf-8")
    )
    table = bundled_yaml(text)["usd_per_gpu_hour"]
    return {str(gpu): float(price) for gpu, price in table.items()}


# ASSUMPTION -- on-demand USD per GPU-hour, one number per catalog GPU (the catalog's specs
# carry no prices). Override with `prices=` / `--price GPU=USD`.
DEFAULT_PRICES_USD_PER_GPU_HOUR: dict[str, float] = _default_prices()

ProbeCallback = Callable[[dict[str, Any]], None]


class MissingPriceError(ConfigError):
    """A GPU compared with others has no price (one from a hardware_file). `gpu` names it,
    so that the command line can say how to give one in its own syntax (`--price`)."""

    def __init__(self, gpu: str) -> None:
        self.gpu = gpu
        super().__init__(
            f"plan: no price for GPU {gpu!r}; pass prices={{{gpu!r}: USD/h}} "
            f"(known: {', '.join(DEFAULT_PRICES_USD_PER_GPU_HOUR)})"
        )


# The fraction of offered requests that must meet their per-request targets at every seed.
DEFAULT_MIN_ATTAINMENT = 0.99


@dataclass(frozen=True)
class PlanChoice:
    """One GPU type's answer: `instances` replicas of `tp` GPUs per pipeline stage each;
    `gpus` counts the whole fleet (tp x pp x dp per instance, each PD pool its own layout).
    Without `gpus` (a choice built by hand) the fleet is taken as instances x tp."""

    gpu: str
    instances: int
    tp: int
    cost_per_hour_usd: float
    gpus: int | None = None

    @property
    def total_gpus(self) -> int:
        return self.gpus if self.gpus is not None else self.instances * self.tp

    @property
    def cost_per_hour(self) -> float:
        return self.cost_per_hour_usd


@dataclass
class PlanResult:
    """`frontier`: every probe (gpu, tp, instances, meets, goodput_worst, <metric>_worst, ...).
    `per_gpu`: per GPU the smallest meeting instance count (NaN when infeasible), the GPUs
    it takes (`gpus_per_instance` of the instance's layout, `total_gpus`) and its cost.
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
    min_attainment: float = DEFAULT_MIN_ATTAINMENT
    # Per-request targets derived from the SLOs (ttft_ms, itl_ms, e2e_ms) and the requests a
    # one-instance probe runs (a probe of n instances: n x required_requests, at least this;
    # None: the scenario's own, a trace or a horizon-bounded workload).
    targets: dict[str, float] = field(default_factory=dict)
    run_requests: int | None = None
    notes: list[str] = field(default_factory=list)
    # Per GPU, the instance layout in words ("TP 8 x PP 2", PD pools each theirs).
    layouts: dict[str, str] = field(default_factory=dict)
    # GPUs never searched, each with why (the model does not fit its layout there): their
    # per_gpu rows read planned False (and feasible False, having no answer).
    not_planned: dict[str, str] = field(default_factory=dict)

    def plot(self, metric: str | None = None):
        """The frontier: worst-seed `metric` (default: the first SLO) against instance count,
        one line per GPU, the SLO bound dashed, probes that meet every SLO filled, and failing
        probes whose runs did not all reach a steady state (`steady` False) marked with an X.
        A Figure (Agg)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        from .metrics.study import metric_label

        metric = metric or (next(iter(self.slos)) if self.slos else "goodput")
        column = "goodput_worst" if metric == "goodput" else f"{metric}_worst"
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        labelled: set[str] = set()

        def once(label: str) -> str | None:
            if label in labelled:
                return None
            labelled.add(label)
            return label

        for gpu, probes in self.frontier.groupby("gpu", sort=True):
            probes = probes.sort_values("instances")
            (line,) = ax.plot(probes["instances"], probes[column], marker="o", label=str(gpu))
            met = probes[probes["meets"].astype(bool)]
            ax.scatter(
                met["instances"],
                met[column],
                s=80,
                color=line.get_color(),
                zorder=3,
                label=once("meets every SLO") if len(met) else None,
            )
            if "steady" in probes:
                steady = probes["steady"].astype("boolean").fillna(True).astype(bool)
                unsteady = probes[~probes["meets"].astype(bool) & ~steady]
                ax.scatter(
                    unsteady["instances"],
                    unsteady[column],
                    marker="X",
                    s=110,
                    color=line.get_color(),
                    edgecolors="black",
                    linewidths=0.6,
                    zorder=4,
                    label=once("fails, not every seed steady") if len(unsteady) else None,
                )
        bound = self.min_goodput if metric == "goodput" else self.slos.get(metric)
        if bound is not None:
            ax.axhline(bound, linestyle="--", color="grey", label=f"SLO {metric} = {_fmt(bound)}")
        ax.set_xlabel("instances")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ylabel = "completed / injected (fraction)" if metric == "goodput" else metric_label(metric)
        ax.set_ylabel(f"worst-seed {ylabel}")
        ax.set_title(f"Capacity frontier: worst seed of {len(self.seeds)} per probe")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        return fig

    def table(self) -> str:
        """The probes, the per-GPU answers and the winner, as plain text."""
        bounds = [_at_most(self.slos)] if self.slos else []
        if self.min_goodput is not None:
            bounds.append(f"goodput >= {_fmt(self.min_goodput)}")
        targets = _at_most(self.targets)
        lines = [
            f"SLOs: {', '.join(bounds)} (worst of seeds {self.seeds})",
            f"a probe passes when every seed is steady, has SLO attainment >= "
            f"{self.min_attainment:g} of offered requests"
            + (f" (per request: {targets})" if targets else "")
            + " and meets every bound",
            *(f"note: {n}" for n in self.notes),
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
            lines.append(self._no_answer())
        else:
            b = self.best
            layout = self.layouts.get(b.gpu, f"TP {b.tp}")
            # A single GPU from a hardware_file may have no price: it wins alone, unpriced.
            cost = (
                "(no price)" if math.isnan(b.cost_per_hour_usd) else f"${b.cost_per_hour_usd:.2f}/h"
            )
            lines.append(
                f"best: {b.gpu} x {b.instances} instance(s) ({layout}, {b.total_gpus} GPUs), {cost}"
            )
        return "\n".join(lines)

    def _no_answer(self) -> str:
        """The last line when no GPU is feasible (`metrics.study.plan_no_answer_line`)."""
        from .metrics.study import plan_no_answer_line

        gpus = [str(g) for g in self.per_gpu["gpu"]] if "gpu" in self.per_gpu else []
        return plan_no_answer_line(gpus, self.not_planned, self.max_instances)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def _at_most(bounds: Mapping[str, Any]) -> str:
    """`ttft_ms <= 500, itl_ms <= 5`: bounds by name, as the plan's text shows them."""
    return ", ".join(f"{name} <= {_fmt(value)}" for name, value in bounds.items())


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
        if name in NOT_UPPER_BOUNDED:
            raise invalid(
                "SLO metric",
                name,
                "an SLO is an upper bound, and more is better here (or it measures the load); "
                f"valid: {', '.join(SLO_METRICS)}",
            )
        if name not in SLO_METRICS:
            raise unknown("SLO metric", name, SLO_METRICS)
        if (
            isinstance(bound, bool)
            or not isinstance(bound, int | float)
            or not math.isfinite(bound)
        ):
            raise invalid(f"SLO {name}", bound, "the upper bound must be a finite number")
        # A bound no run can meet would simulate the whole search for nothing.
        if name.endswith("_ms") and bound <= 0:
            raise invalid(f"SLO {name}", bound, "a latency bound must be > 0 ms")
        if bound < 0:
            raise invalid(f"SLO {name}", bound, "a count's bound must be >= 0")
        out[name] = float(bound)
    return out


def _prices(overrides: Mapping[str, float] | None, field: str = "price of") -> dict[str, float]:
    """Default prices with `overrides` applied (GPU names case-insensitive), keyed by lower
    case. A bad price is named `<field> <GPU>` ("price of H100", "--price H100")."""
    table = {k.lower(): v for k, v in DEFAULT_PRICES_USD_PER_GPU_HOUR.items()}
    for name, price in (overrides or {}).items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not price >= 0:
            raise invalid(f"{field} {name}", price, "must be a number >= 0 (USD per GPU-hour)")
        if not math.isfinite(price):
            raise invalid(f"{field} {name}", price, "must be finite")
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


# Percentile of a metric name (ttft_p99_ms -> 0.99); a mean or other statistic -> 0.5.
def _percentile(metric: str) -> float:
    for part in metric.split("_"):
        if part.startswith("p") and part[1:].isdigit():
            return int(part[1:]) / 100
    return 0.5


# Samples a percentile needs to be judged: ten beyond it (p99 -> 1,000 requests).
SAMPLES_BEYOND_PERCENTILE = 10
# Requests a probe needs at the least to judge whether it reached a steady state.
MIN_PROBE_REQUESTS = 200


def required_requests(bounds: Mapping[str, float], min_attainment: float) -> int:
    """Requests per probe for the SLOs to mean something: ten requests beyond the strictest
    percentile bounded (p99 -> 1,000) or attainment target, and MIN_PROBE_REQUESTS."""
    strictest = max([_percentile(m) for m in bounds] + [min_attainment], default=0.5)
    # Rounded so that 1 - 0.9999 is 1e-4, not 1.0000000000001e-4 (100,001 requests).
    tail = max(round(1.0 - strictest, 12), 1e-6)
    return max(MIN_PROBE_REQUESTS, math.ceil(SAMPLES_BEYOND_PERCENTILE / tail - 1e-9))


# The most requests a one-instance probe may need (min_attainment 0.9999): about 40 s of
# simulation per seed on one instance, and a probe of n instances runs n times as many, so a
# stricter target would leave the plan silent for hours and a larger fleet's probe past
# MAX_REQUESTS mid-plan.
MAX_REQUESTS_PER_INSTANCE = 100_000


def check_min_attainment(value: Any, name: str = "min_attainment") -> None:
    """Raise ConfigError (naming `name`, the API keyword or the CLI flag) unless `value` is an
    attainment a finite plan can show: a fraction below 1 whose probes need at most
    MAX_REQUESTS_PER_INSTANCE requests per instance."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise invalid(name, value, "must be a fraction in [0, 1)")
    if value >= 1:
        raise invalid(
            name,
            value,
            "a 100 % attainment cannot be shown by a finite run (a probe needs "
            f"{SAMPLES_BEYOND_PERCENTILE} requests beyond the target: 10 / (1 - attainment) "
            "per instance); use a fraction below 1, e.g. 0.999",
        )
    needed = required_requests({}, value)
    if needed > MAX_REQUESTS_PER_INSTANCE:
        raise invalid(
            name,
            value,
            f"each probe would run {needed:,} requests per instance "
            f"({SAMPLES_BEYOND_PERCENTILE} beyond the target), more than the "
            f"{MAX_REQUESTS_PER_INSTANCE:,} a plan runs; use at most 0.9999, e.g. 0.999",
        )


def per_request_targets(
    bounds: Mapping[str, float], min_attainment: float = DEFAULT_MIN_ATTAINMENT
) -> dict[str, float]:
    """Per-request SLO targets from the plan's bounds: for TTFT, ITL and E2E the bound of the
    highest percentile given (ttft_p99_ms=500 -> every request's TTFT <= 500 ms), so that
    attainment >= 99 % means p99 <= 500 over the *offered* requests, not only completed ones.
    Only a percentile at or above `min_attainment` becomes one: "p50 <= B" asks half the
    requests to be within B, and a per-request target checked at 99 % attainment would ask
    99 % of them (a mean is no share of requests at all); those stay bounds on the summary."""
    targets: dict[str, tuple[float, float]] = {}
    for metric, bound in bounds.items():
        family = metric.split("_")[0]
        if family in ("ttft", "itl", "e2e") and metric.endswith("_ms") and "_mean_" not in metric:
            rank = _percentile(metric)
            if rank < min_attainment:
                continue
            if family not in targets or rank > targets[family][0]:
                targets[family] = (rank, bound)
    return {f"{family}_ms": bound for family, (_rank, bound) in targets.items()}


def wilson_interval(fraction: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial fraction observed over n trials ((0, 1) for
    n = 0): how sure a probe's attainment is, given how many requests it offered."""
    if n <= 0:
        return 0.0, 1.0
    centre = (fraction + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(fraction * (1 - fraction) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # The interval holds the fraction observed; at 0 or 1 rounding can leave its bound a hair
    # inside (1,000 of 1,000 gave 1.0, 4,000 of 4,000 gives 0.99999...).
    return max(0.0, min(centre - half, fraction)), min(1.0, max(centre + half, fraction))


def undecided(row: Mapping[str, Any], min_attainment: float) -> bool:
    """Does the attainment's interval straddle the target? Then more requests may decide."""
    return row["attainment_ci_low"] < min_attainment <= row["attainment_ci_high"]


# A probe whose attainment interval straddles the target is rerun with twice the requests, up
# to this many times the planned run length.
MAX_EXTENSION = 4


def judge_probe(
    runs: pd.DataFrame,
    bounds: Mapping[str, float],
    min_attainment: float,
    min_goodput: float | None,
) -> tuple[bool, dict[str, Any], list[str]]:
    """Does every seed pass? (meets, the row's worst-seed figures, the reasons it fails)."""
    reasons: list[str] = []
    row: dict[str, Any] = {}
    completed = runs["completed_requests"].astype(float)
    if (completed <= 0).any():
        reasons.append("no request completed")
    verdicts = [str(v) for v in runs.get("steady_state", pd.Series(dtype=object))]
    unsteady = sorted({v for v in verdicts if v != "steady"})
    row["steady"] = not unsteady
    if unsteady:
        reasons.append(f"steady-state verdict: {', '.join(unsteady)}")
    attainment = pd.to_numeric(runs.get("slo_attainment"), errors="coerce").fillna(0.0)
    row["attainment_worst"] = float(attainment.min()) if len(attainment) else 0.0
    offered = (
        pd.to_numeric(runs["offered_requests"], errors="coerce")
        if "offered_requests" in runs
        else pd.Series(math.nan, index=runs.index)
    )
    worst_offered = 0
    if len(attainment) and offered.notna().all():
        worst_offered = int(offered[attainment.idxmin()])
    low, high = wilson_interval(row["attainment_worst"], worst_offered)
    row["attainment_ci_low"], row["attainment_ci_high"] = low, high
    if row["attainment_worst"] < min_attainment:
        reasons.append(f"SLO attainment {row['attainment_worst']:.3f} < {min_attainment:g}")
    injected = runs["injected_requests"].astype(float)
    goodput = (completed / injected.where(injected > 0)).fillna(0.0)
    row["goodput_worst"] = float(goodput.min())
    if min_goodput is not None and row["goodput_worst"] < min_goodput:
        reasons.append(f"completed fraction {row['goodput_worst']:.3f} < {min_goodput:g}")
    for metric, bound in bounds.items():
        values = pd.to_numeric(runs[metric], errors="coerce") if metric in runs else None
        worst = math.nan if values is None or values.isna().any() else float(values.max())
        row[f"{metric}_worst"] = worst
        if not worst <= bound:
            shown = "n/a" if math.isnan(worst) else f"{worst:,.6g}"
            reasons.append(f"{metric} {shown} > {bound:,.6g}")
    row["reason"] = "; ".join(reasons)
    return not reasons, row, reasons


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
    min_attainment: float = DEFAULT_MIN_ATTAINMENT,
    saturation_rate: bool = False,
    names: Mapping[str, str] | None = None,
) -> PlanResult:
    """For each GPU (default: the scenario's own), the fewest instances whose every seed
    passes: the run reached a steady state, at least `min_attainment` of the offered requests
    met the per-request targets derived from `slos` (`per_request_targets`), every bounded
    metric (worst seed) is within its bound, something completed, and with `min_goodput` the
    completed / injected fraction is at least that. The cheapest feasible GPU by instances x
    TP x price per GPU-hour wins.

    Each probe runs at least `required_requests` requests (the scenario's count is raised to
    it when smaller). A disaggregated scenario is searched over the total instance count and,
    per total, over its prefill:decode split (from the scenario's ratio outwards).
    `prices` overrides DEFAULT_PRICES_USD_PER_GPU_HOUR. `progress(row)` is called after each
    probe. A GPU that misses the SLOs at `max_instances` is infeasible (reported, no error).
    `names` maps these keywords to what an error calls them (default: the keywords; the
    command line passes its flags, {"max_instances": "--max-instances", ...})."""
    from .api import as_scenario, with_overrides
    from .catalog.hardware import get_gpu, load_gpu_file
    from .deployment import pool_deployments, resolve_deployment
    from .sweeps import _seeds, sweep

    sc = as_scenario(base)
    if sc.deployments:
        raise ConfigError(
            "plan: the scenario lists `deployments`, whose instance counts plan does not "
            "search (it sizes cluster.num_instances of the scenario's one deployment); plan "
            "each deployment as a scenario of its own"
        )
    if sc.events:
        # Events name instances (instance_2 does not exist in a probe of 1 or 2) and add ones
        # the probe's price does not count: plan sizes the fleet it is given, from the start.
        first = sc.events[0]
        named = first.target or first.node or first.pool or first.deployment
        raise ConfigError(
            f"plan: the scenario lists `events` (events[0]: {first.action}"
            + (f" {named}" if named else "")
            + f" at {first.at_s:g} s), which plan does not take: its probes size "
            "cluster.num_instances from 1 up, where an event's instance may not exist and an "
            "added one would go unpriced; remove `events` to plan the fleet, then run the "
            "chosen fleet with them (`servesim run`, or `sweep` over cluster.num_instances)"
        )
    if sc.autoscaler:
        # The autoscaler adds instances the probe's price does not count: a probe of one
        # instance that it grows to three would "meet the SLOs at 1 instance".
        scaler = sc.autoscaler[0]
        raise ConfigError(
            f"plan: the scenario has an `autoscaler` (autoscaler[0]: {scaler.signal}, "
            f"{scaler.min_instances}-{scaler.max_instances} instances), which plan does not "
            "take: a probe's price counts cluster.num_instances, and the autoscaler would run "
            "more than that; remove `autoscaler` to plan the fixed fleet, then run the chosen "
            "fleet with it (`servesim run`)"
        )
    if sc.node_pools:
        # Node pools bound the fleet by their nodes and price it per node; plan prices GPUs
        # per instance and grows the count past what the pools could place.
        first_pool = sc.node_pools[0]
        raise ConfigError(
            f"plan: the scenario has `node_pools` (node_pools[0]: {first_pool.name}, "
            f"{first_pool.max_nodes} x {first_pool.gpus_per_node} {first_pool.gpu_type}), "
            "which plan does not take: it prices each instance's GPUs at --price and searches "
            "instance counts the pools' nodes may not hold; remove `node_pools` to plan the "
            "fleet, then run the chosen fleet on its nodes (`servesim run`)"
        )
    pools = sc.cluster.pd
    own_gpu = [
        f"cluster.pd.{role}.hardware ({pool.hardware})"
        for role, pool in (("prefill", pools.prefill), ("decode", pools.decode))
        if pool.hardware is not None
    ]
    if own_gpu:
        # Plan sets one GPU for the fleet and prices every GPU at it: a pool on its own GPU
        # would be a mixed fleet priced as the other (docs/planning.md, "Not covered").
        raise ConfigError(
            f"plan: the scenario's {' and '.join(own_gpu)} runs on its own GPU, and plan "
            "compares fleets of one GPU type; remove the pool's hardware to plan the fleet "
            "on each --gpu, or run the mixed fleet with `servesim run`/`sweep`"
        )
    if names is not None and not isinstance(names, Mapping):
        raise invalid("names", names, "must be a mapping keyword -> name shown in errors")
    given_names = dict(names or {})

    def name(keyword: str) -> str:
        """What an error calls the argument `keyword`: a flag on the command line."""
        return str(given_names.get(keyword, keyword))

    bounds = _check_slos(slos)
    if not bounds and min_goodput is None:
        raise ConfigError("plan: give at least one SLO (metric=bound) or min_goodput")
    if min_goodput is not None and (
        isinstance(min_goodput, bool)
        or not isinstance(min_goodput, int | float)
        or not 0 <= min_goodput <= 1
    ):
        raise invalid(name("min_goodput"), min_goodput, "must be a fraction in [0, 1]")
    check_min_attainment(min_attainment, name("min_attainment"))
    if isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances < 1:
        raise invalid(name("max_instances"), max_instances, "must be an integer >= 1")
    # Checked here, not by the first probe's sweep, so that the error names it as given.
    from .sweeps import check_workers

    workers = check_workers(workers, name("workers"))
    try:
        seed_list = _seeds(seeds)
    except ConfigError as exc:
        raise ConfigError(_renamed(str(exc), "seeds", name("seeds"))) from None
    price_table = _prices(prices, "price of" if "prices" not in given_names else name("prices"))

    notes: list[str] = []
    targets = per_request_targets(bounds, min_attainment)
    # The scenario's own per-request targets are judged as well (SLO attainment counts them):
    # shown with the plan's, so that a probe failing on one of them says why.
    own = {
        key: value
        for key in ("ttft_ms", "itl_ms", "e2e_ms")
        if (value := getattr(sc.slo, key)) is not None and key not in targets
    }
    if own or sc.slo.classes:
        shown = _at_most(own)
        per_class = "; ".join(
            f"{name}: " + _at_most({k: v for k, v in t.model_dump().items() if v})
            for name, t in sc.slo.classes.items()
        )
        parts = [p for p in (shown, f"per SLO class {per_class}" if per_class else "") if p]
        notes.append(
            "the scenario's own SLO targets count towards the attainment too: " + "; ".join(parts)
        )
    if targets:
        sc = with_overrides(
            sc, {f"slo.{k}": v for k, v in targets.items()}, source="plan: SLO targets"
        )
    needed = required_requests(bounds, min_attainment)
    have = _num_requests(sc)
    run_requests = have
    if have is not None and have < needed:
        sc = with_overrides(sc, {}, {"workload.num_requests": needed}, source="plan: run length")
        run_requests = needed
        notes.append(
            f"each probe runs {needed:,} requests (the scenario has {have:,}): the strictest "
            f"percentile judged needs {SAMPLES_BEYOND_PERCENTILE} samples beyond it"
        )
    if run_requests is not None:
        floor = f" (at least the scenario's {run_requests:,})" if run_requests > needed else ""
        notes.append(
            f"a probe of n instances runs n x {needed:,} requests{floor}, so that each "
            "instance serves as many as a one-instance probe's does"
        )

    def probe_requests(instances: int) -> int | None:
        """A probe's planned length: the run length (`run_requests`), and `needed` requests
        per instance. A fixed length spread over more instances gives each fewer: at 5
        instances and 1,000 requests each served 200 (4 s), the batch was still filling
        when the run ended, and the judge called 5 H100 at 240 req/s saturated (plan
        answered 6 where 5 hold the load). None for a trace or a horizon-bounded workload,
        which keep their own length."""
        if run_requests is None:
            return None
        return max(run_requests, needed * instances)

    longest = probe_requests(max_instances)
    if longest is not None and longest > MAX_REQUESTS:
        # Found now rather than when the search reaches that count, hours in.
        raise invalid(
            name("max_instances"),
            max_instances,
            f"a probe of {max_instances:,} instances would run {longest:,} requests "
            f"({needed:,} per instance), more than one run holds ({MAX_REQUESTS:,}); use at "
            f"most {MAX_REQUESTS // needed:,} instances, or a lower {name('min_attainment')}",
        )

    disaggregated = sc.cluster.pd.enabled
    if disaggregated and max_instances < 2:
        raise invalid(name("max_instances"), max_instances, "a disaggregated plan needs at least 2")

    extra = load_gpu_file(sc.hardware_file) if sc.hardware_file else None
    if gpus is None:
        gpu_names = [resolve_deployment(sc).gpu.name]
    else:
        if isinstance(gpus, str) or not gpus:
            raise invalid(name("gpus"), gpus, "must be a non-empty list of GPU names")
        gpu_names = list(dict.fromkeys(get_gpu(g, extra).name for g in gpus))
    known = {k.lower() for k in DEFAULT_PRICES_USD_PER_GPU_HOUR} | {g.lower() for g in gpu_names}
    unused = [str(name) for name in (prices or {}) if str(name).lower() not in known]
    if unused:
        # A misspelt GPU would otherwise leave the default price in force, silently.
        raise ConfigError(
            f"plan: a price for GPU {unused[0]!r}, which is neither in the price table nor "
            f"planned (GPUs: {', '.join(gpu_names)}; priced: "
            f"{', '.join(DEFAULT_PRICES_USD_PER_GPU_HOUR)})"
        )
    missing = [g for g in gpu_names if g.lower() not in price_table]
    if missing and len(gpu_names) > 1:
        raise MissingPriceError(missing[0])

    probes: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    not_planned: dict[str, str] = {}  # GPU -> why it was not planned
    provenance: dict[str, dict[str, Any]] = {}
    layouts: dict[str, str] = {}
    # Each GPU's batch limits: unset ones are a stock vLLM server's on that GPU under physics
    # (deployment.batch_limits), so GPUs may be compared at different limits; said per GPU.
    limits: dict[str, str] = {}
    for gpu in gpu_names:
        gpu_sc = with_overrides(sc, {"hardware": gpu}, source=f"plan: hardware {gpu}")
        try:
            deployment = resolve_deployment(gpu_sc)
            pools = pool_deployments(gpu_sc, deployment) if disaggregated else {}
        except ConfigError as exc:
            raise ConfigError(f"plan: GPU {gpu}: {exc}") from None
        tp = deployment.tp
        # An instance takes tp x pp x dp GPUs (expert parallelism reuses them); under PD each
        # pool has its own layout, so a fleet's GPUs depend on its split.
        per_instance = deployment.gpus
        pool_gpus = {role: d.gpus for role, d in pools.items()}
        layouts[gpu] = (
            f"prefill {_layout_text(pools['prefill'])}; decode {_layout_text(pools['decode'])}"
            if pools
            else _layout_text(deployment)
        )
        provenance[gpu] = _latency_block(deployment, pools)
        limits[gpu] = _limits_text(deployment, pools)
        price = price_table.get(gpu.lower(), math.nan)
        passing: dict[int, dict[str, Any]] = {}

        def judged(point: Scenario) -> tuple[bool, dict[str, Any], pd.DataFrame]:
            """`judge_probe` of `point` simulated at every seed, and the runs it judged."""
            runs = sweep(point, {}, seeds=seed_list, workers=workers).runs
            meets, figures, _ = judge_probe(runs, bounds, min_attainment, min_goodput)
            return meets, figures, runs

        def probe(
            n: int,
            gpu: str = gpu,
            gpu_sc: Scenario = gpu_sc,
            tp: int = tp,
            passing: dict[int, dict[str, Any]] = passing,
            per_instance: int = per_instance,
            pool_gpus: dict[str, int] = pool_gpus,
        ) -> bool:
            for split in _splits(gpu_sc, n) if disaggregated else [None]:
                overrides: dict[str, Any] = {"cluster.num_instances": n}
                if split is not None:
                    overrides["cluster.pd.prefill_instances"] = split[0]
                    overrides["cluster.pd.decode_instances"] = split[1]
                planned = probe_requests(n)
                length = {} if planned is None else {"workload.num_requests": planned}
                point = with_overrides(
                    gpu_sc, overrides, length, source=f"plan: {n} instances"
                )  # fmt: skip
                meets, figures, runs = judged(point)
                requests = planned
                rechecked_saturation = False
                # Too close to call, or too short to have settled: the same probe with more
                # requests, as often as allowed. A saturated verdict that alone fails a probe
                # is checked once on a run twice as long: a batching server near its capacity
                # fills its batch for several E2Es, which a short run's judge can read as a
                # queue growing; a real overload stays saturated when run longer.
                while (
                    requests is not None
                    and requests * 2 <= planned * MAX_EXTENSION
                    and requests * 2 <= MAX_REQUESTS
                ):
                    if not (undecided(figures, min_attainment) or _too_short(runs)):
                        if rechecked_saturation or not fails_only_as_saturated(
                            runs, bounds, min_attainment, min_goodput
                        ):
                            break
                        rechecked_saturation = True
                    requests *= 2
                    longer = with_overrides(
                        point, {}, {"workload.num_requests": requests},
                        source="plan: a longer probe",
                    )  # fmt: skip
                    meets, figures, runs = judged(longer)
                row: dict[str, Any] = {"gpu": gpu, "tp": tp, "instances": n}
                row["requests"] = requests
                row["gpus"] = n * per_instance
                if split is not None:
                    row["prefill_instances"], row["decode_instances"] = split
                    row["gpus"] = (
                        split[0] * pool_gpus["prefill"]
                        + split[1] * pool_gpus["decode"]
                        + (n - split[0] - split[1]) * per_instance
                    )
                row.update(figures)
                row["meets"] = meets
                probes.append(row)
                if progress is not None:
                    progress(row)
                if meets:
                    passing[n] = row
                    return True
            return False

        def rate_per_instance(gpu_sc: Scenario = gpu_sc) -> float:
            """The largest offered rate one instance sustains while passing, by bisection
            between 0 and the scenario's own rate (SATURATION_STEPS halvings); NaN when it is
            not found (a trace, a disaggregated scenario, or nothing passes)."""
            full = _offered_rate(gpu_sc)
            if full is None or disaggregated:
                return math.nan

            def passes(rate: float) -> bool:
                point = with_overrides(
                    gpu_sc, {"cluster.num_instances": 1}, {"workload.rate": rate},
                    source=f"plan: saturation rate {rate:g}",
                )  # fmt: skip
                return judged(point)[0]

            if passes(full):
                return full
            lo, hi = 0.0, full
            for _ in range(SATURATION_STEPS):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if passes(mid) else (lo, mid)
            return lo if lo > 0 else math.nan

        unfit = [d for d in (deployment, *pools.values()) if d.kv_blocks_source == "fallback"]
        if unfit:
            # No KV capacity could be computed (the weights do not fit the GPUs of this layout,
            # or the model lacks what the formula needs): its runs would price a machine that
            # cannot exist, so the GPU is not planned.
            found = None
            not_planned[gpu] = (
                f"the model does not fit its {_layout_text(unfit[0])} layout (no KV capacity; "
                "see the KV-capacity warning); a larger TP, or engine.total_kv_blocks given "
                "explicitly, plans it"
            )
        else:
            found = (
                _search(probe, max_instances)
                if not disaggregated
                else _search(lambda n: n >= 2 and probe(n), max_instances)
            )
        chosen = passing.get(found) if found is not None else None
        total_gpus = chosen["gpus"] if chosen else math.nan
        uniform = len({per_instance, *pool_gpus.values()}) == 1
        answers.append(
            {
                "gpu": gpu,
                "tp": tp,
                "usd_per_gpu_hour": price,
                "planned": gpu not in not_planned,
                "feasible": found is not None,
                "instances": found if found is not None else math.nan,
                **(
                    {
                        "prefill_instances": chosen.get("prefill_instances", math.nan)
                        if chosen
                        else math.nan,
                        "decode_instances": chosen.get("decode_instances", math.nan)
                        if chosen
                        else math.nan,
                    }
                    if disaggregated
                    else {}
                ),
                "gpus_per_instance": per_instance if uniform else math.nan,
                "layout": layouts[gpu],
                "total_gpus": total_gpus,
                "cost_per_hour_usd": total_gpus * price,
                "margin": _margin(chosen, bounds) if chosen else math.nan,
                **(
                    {"saturation_rps_per_instance": rate_per_instance(gpu_sc)}
                    if saturation_rate
                    else {}
                ),
                "batch_limits": limits[gpu],
                "latency_model": latency_model_text(provenance[gpu]),
                "evidence": evidence(provenance[gpu]),
            }
        )

    metric_cols = [f"{m}_worst" for m in bounds]
    split_cols = ["prefill_instances", "decode_instances"] if disaggregated else []
    frontier = pd.DataFrame(
        probes,
        columns=[
            "gpu", "tp", "instances", *split_cols, "gpus", "requests", "meets", "steady",
            "attainment_worst", "attainment_ci_low", "attainment_ci_high",
            *metric_cols, "goodput_worst", "reason",
        ],
    )  # fmt: skip
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
            pick["gpu"],
            int(pick["instances"]),
            pick["tp"],
            pick["cost_per_hour_usd"],
            gpus=int(pick["total_gpus"]),
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
        # A GPU not planned was never simulated: its evidence compares nothing.
        warnings=[f"{gpu}: not planned: {why}" for gpu, why in not_planned.items()]
        + mixed_evidence({g: p for g, p in provenance.items() if g not in not_planned}),
        min_attainment=float(min_attainment),
        targets={**own, **targets},
        run_requests=run_requests,
        notes=notes,
        layouts=layouts,
        not_planned=not_planned,
    )


# Halvings of the search for the rate one instance sustains (precision: rate / 2^steps).
SATURATION_STEPS = 5


def _workload(sc: Scenario) -> Any:
    """The scenario's workload as a v2 spec (synthetic or v2), None for a trace or when it
    cannot be expressed as one."""
    from .api import workload_spec_of

    if sc.trace is not None:
        return None
    try:
        return workload_spec_of(sc)
    except (ConfigError, AttributeError):
        return None


def _offered_rate(sc: Scenario) -> float | None:
    """The scenario's aggregate request rate (req/s), None for a trace or sessions."""
    rate = getattr(_workload(sc), "aggregate_rate", None)
    return float(rate) if rate else None


def _num_requests(sc: Scenario) -> int | None:
    """The scenario's request count (synthetic or v2 workload), None for a trace or a workload
    bounded only by its horizon."""
    return getattr(_workload(sc), "num_requests", None)


def _splits(sc: Scenario, n: int) -> list[tuple[int, int]]:
    """Prefill:decode splits of `n` instances, the scenario's own ratio first, then outwards."""
    pd_spec = sc.cluster.pd
    share = pd_spec.prefill_instances / max(pd_spec.prefill_instances + pd_spec.decode_instances, 1)
    first = min(max(round(n * share), 1), n - 1)
    order = sorted(range(1, n), key=lambda p: (abs(p - first), p))
    return [(p, n - p) for p in order]


def _latency_block(deployment: Any, pools: Mapping[str, Any]) -> dict[str, Any]:
    """What prices a probe's steps, in the shape of a run's `=== Latency Model ===` block
    (`api.simulate`: the top level, and `by_role` when a PD pool's step-time model differs
    from it), read back with `sweeps.latency_entries` as a sweep reads a run's. A PD probe's
    split covers every instance, so there the pools price every step and the top level none:
    until 2026-12-07 plan read the top level alone, and a scenario with roofline at the top
    and physics in both pools was tabled `roofline`/`analytical`, its mixed evidence unsaid."""
    top = deployment.step_model.provenance()
    by_role = {role: d.step_model.provenance() for role, d in pools.items()}
    if any(p != top for p in by_role.values()):
        return {**top, "by_role": by_role}
    return top


def latency_model_text(provenance: Mapping[str, Any]) -> str:
    """The step-time model(s) of a Latency Model block: "physics", or per PD pool when they
    differ ("prefill roofline, decode physics")."""
    from .sweeps import latency_entries, per_entry_text

    return per_entry_text(latency_entries(provenance), "latency_model")


def _limits_text(deployment: Any, pools: Mapping[str, Any]) -> str:
    """An instance's batch limits in words: "1,024 seqs, 8,192 tokens (vLLM's default on
    H100)"; per pool when a PD split's pools differ. Under PD only the pools run (a probe's
    split covers every instance), so theirs are shown even when both differ from the top
    level's (a roofline top level with physics pools: BLIS's 256 seqs against vLLM's 1,024)."""

    def text(d: Any) -> str:
        engine = d.engine
        return (
            f"{engine.max_num_running_reqs:,} seqs, {engine.max_num_scheduled_tokens:,} tokens "
            f"({d.batch_limits_source})"
        )

    by_pool = {role: text(d) for role, d in pools.items()}
    if len(set(by_pool.values())) > 1:
        return "; ".join(f"{role} {shown}" for role, shown in by_pool.items())
    return next(iter(by_pool.values())) if by_pool else text(deployment)


def _renamed(message: str, keyword: str, shown: str) -> str:
    """`message` (a ConfigError's, "seeds: ...") naming `shown` where it names `keyword`."""
    prefix = f"{keyword}:"
    return shown + message[len(keyword) :] if message.startswith(prefix) else message


def _layout_text(deployment: Any) -> str:
    """An instance's layout in words: "TP 8", "TP 8 x PP 2, EP 8"."""
    layout = deployment.parallelism
    parts = [f"TP {deployment.tp}"]
    if layout is not None and layout.pp > 1:
        parts.append(f"PP {layout.pp}")
    if layout is not None and layout.dp > 1:
        parts.append(f"DP {layout.dp}")
    text = " x ".join(parts)
    if layout is not None and layout.ep > 1:
        text += f", EP {layout.ep}"
    return text


def _too_short(runs: pd.DataFrame) -> bool:
    """A seed's run ended before it could settle (steady-state verdict `too short`)."""
    return "too short" in set(runs.get("steady_state", pd.Series(dtype=object)))


def fails_only_as_saturated(
    runs: pd.DataFrame,
    bounds: Mapping[str, float],
    min_attainment: float,
    min_goodput: float | None,
) -> bool:
    """Does a probe fail on a seed's `saturated` verdict alone: would it pass were every
    verdict `steady`?"""
    if "saturated" not in set(runs.get("steady_state", pd.Series(dtype=object))):
        return False
    as_if_steady = runs.assign(steady_state="steady")
    return judge_probe(as_if_steady, bounds, min_attainment, min_goodput)[0]


def _margin(row: Mapping[str, Any], bounds: Mapping[str, float]) -> float:
    """How far inside its bounds the chosen count is: the smallest (bound - worst) / bound."""
    margins = [
        (bound - row[f"{m}_worst"]) / bound
        for m, bound in bounds.items()
        if bound > 0 and not math.isnan(row[f"{m}_worst"])
    ]
    return min(margins) if margins else math.nan


def evidence(provenance: Mapping[str, Any]) -> str:
    """How a GPU's step times are known: `calibrated` (physics, fitted on this GPU),
    `transferred` (physics, another GPU's fit), `physical defaults`, `given` (a coefficients
    file) or `analytical`/`fitted` for BLIS's backends, `fitted (transferred)` when the fit
    says which GPUs it saw and this is not one of them (trained-physics off the H100).
    `provenance` is a step-time model's or a Latency Model block; a block whose PD pools rest
    on different evidence reads per pool ("prefill calibrated, decode analytical")."""
    from .sweeps import latency_entries, per_entry_text

    return per_entry_text(latency_entries(provenance), _evidence_of)


def _evidence_of(provenance: Mapping[str, Any]) -> str:
    """`evidence` of one step-time model's provenance."""
    if provenance.get("latency_model") == "physics":
        return str(provenance.get("source", "given"))
    source = str(provenance.get("coefficients", ""))
    # The backends' own sources: "analytical: …", "given alpha/beta coefficients", or the
    # name of BLIS's fit ("BLIS's fit for H100 TP2, …", "BLIS's global crossmodel fit …").
    if not source or source.startswith("analytical"):
        return "analytical"
    if source.startswith("given"):
        return "given"
    # Only a fit that records its GPUs can say this; absent (blackbox's per-GPU fits, the
    # global fits that record none) is not read as uncovered.
    if provenance.get("gpu_covered_by_fit") is False:
        return "fitted (transferred)"
    return "fitted"


# Step-time models whose step times do not depend on the GPU.
GPU_BLIND_MODELS = frozenset({"crossmodel"})


def mixed_evidence(provenance: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One warning when the compared GPUs' latencies rest on different evidence: a GPU whose
    fit was measured on it against one whose fit was carried over is not a like-for-like
    comparison (docs/planning.md). `provenance` maps each GPU to its step-time model's
    provenance or Latency Model block: under PD every pool's evidence counts, so H100 and
    A100 differing in one pool only are compared on different evidence."""
    from .sweeps import latency_entries

    entries = {gpu: latency_entries(p) for gpu, p in provenance.items()}
    models = {label: e.get("latency_model") for es in entries.values() for label, e in es.items()}
    blind = sorted(set(models.values()) & GPU_BLIND_MODELS)
    warnings: list[str] = []
    if blind and len(provenance) > 1:
        # BLIS's crossmodel fit has no GPU term: every GPU is priced alike, so only the prices
        # tell the GPUs apart (in the PD pools it prices, when only some).
        if set(models.values()) <= GPU_BLIND_MODELS:
            return [
                f"latency model {blind[0]} prices every GPU alike (its fit has no GPU term): "
                "the GPUs compared differ only in price and KV capacity here; compare GPUs "
                "under physics or roofline (docs/latency-models.md)"
            ]
        pools = " and ".join(label for label, m in models.items() if m in GPU_BLIND_MODELS)
        warnings.append(
            f"latency model {blind[0]} prices the {pools} pool's steps alike on every GPU (its "
            "fit has no GPU term): there the GPUs compared differ only in price and KV "
            "capacity; compare GPUs under physics or roofline (docs/latency-models.md)"
        )
    kinds = {gpu: evidence(p) for gpu, p in provenance.items()}
    if len(set(kinds.values())) <= 1:
        return warnings
    parts = [f"{gpu}: {kind}" for gpu, kind in kinds.items()]
    return warnings + [
        "the GPUs' step times rest on different evidence (" + "; ".join(parts) + "); a "
        "GPU fitted on itself (calibrated) is measured, a transferred one uses a fit made on "
        "other GPUs as fractions of its own peaks, so their comparison carries that GPU's "
        "transfer error "
        "(docs/latency-models.md)"
    ]


def _gpu_order(gpu_names: list[str]) -> Callable[[pd.Series], pd.Series]:
    rank = {g: i for i, g in enumerate(gpu_names)}

    def key(col: pd.Series) -> pd.Series:
        return col.map(rank) if col.name == "gpu" else col

    return key
