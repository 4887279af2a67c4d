"""The numbers a run's report shows, as one JSON-safe dict (embedded in the page as is).

Nothing here is recomputed differently from the run's own report: headline numbers are the
summary's, latency percentiles are numpy's linear percentiles of the same integer µs samples
(so a CDF's p99 is the summary's p99 to the last bit), SLO attainment and the steady-state
verdict are the run's. What is added is only what a picture needs, at a size that does not grow
with the run: CDFs as quantiles at fixed probabilities, time series as fixed-width bins.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ..metrics.views.text import batch_limit
from . import run_source
from .run_source import PD_STAGES, RunSource

# Probabilities at which a CDF is sampled: every 0.5 % up to p90, then finer into the tail,
# so a CDF is 364 points whatever the run and the tail a reader cares about keeps its shape.
CDF_PROBABILITIES = np.unique(
    np.round(
        np.concatenate(
            [
                np.arange(0.0, 0.9, 0.005),
                np.arange(0.9, 0.99, 0.001),
                np.arange(0.99, 0.999, 0.0001),
                [0.9995, 0.9999, 1.0],
            ]
        ),
        6,
    )
)
# The percentiles each CDF also carries by name (those of the summary).
NAMED_PERCENTILES = (50, 90, 95, 99)
# Time series: one bin per ~BIN_COMPLETIONS completions, clamped to MIN_BINS..MAX_BINS bins
# over the run (choose_bin_s then picks a nice width giving 40-100 % of that count).
MAX_BINS = 240
MIN_BINS = 24
BIN_COMPLETIONS = 10
# Per-instance lines are drawn up to this many instances; beyond, only the pooled series and
# the per-bin spread across instances.
MAX_INSTANCE_SERIES = 32
# Lifecycle transitions kept in the page (a fleet that churns for hours would otherwise grow
# the page with the run); the fleet totals always count every one.
MAX_EVENTS = 2000
# Significant digits of the floats in sampled series (not of the headline numbers).
SERIES_DIGITS = 6

# Headline summary fields, in the order shown.
HEADLINE_FIELDS = (
    "injected_requests",
    "completed_requests",
    "responses_per_sec",
    "tokens_per_sec",
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_mean_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2e_mean_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "slo_attainment",
    "goodput_rps",
    "preemption_count",
    "dropped_unservable",
    "timed_out_requests",
    "still_queued",
    "still_running",
    "vllm_estimated_duration_s",
)


def rounded(values: Any, digits: int = SERIES_DIGITS) -> list[float | None]:
    """Floats to `digits` significant digits, NaN and infinities as None (JSON null)."""
    out: list[float | None] = []
    for v in np.asarray(values, dtype=float).tolist():
        out.append(float(f"{v:.{digits}g}") if math.isfinite(v) else None)
    return out


def clean(value: Any) -> Any:
    """Plain JSON types: numpy scalars unwrapped, non-finite floats as None."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# --- distributions --------------------------------------------------------------------------


def cdf_of_us(samples_us: np.ndarray) -> dict[str, Any]:
    """A latency distribution from integer µs samples, in ms: quantiles at CDF_PROBABILITIES,
    the named percentiles and the mean exactly as `compute_summary` computes them."""
    values = np.asarray(samples_us, dtype=np.int64)
    n = len(values)
    if n == 0:
        return {
            "n": 0,
            "p": [],
            "ms": [],
            "mean": None,
            **{f"p{q}": None for q in NAMED_PERCENTILES},
        }
    quantiles = np.percentile(values, CDF_PROBABILITIES * 100)
    out: dict[str, Any] = {
        "n": n,
        "p": CDF_PROBABILITIES.tolist(),
        "ms": rounded(quantiles / 1000),
        "mean": float(values.sum() / n) / 1000,
    }
    for q in NAMED_PERCENTILES:
        out[f"p{q}"] = float(np.percentile(values, q)) / 1000
    return out


def cdf_of_counted(counted: Any) -> dict[str, Any]:
    """The same from a `CountedValues` multiset (every inter-token gap of a run)."""
    n = len(counted)
    if n == 0:
        return cdf_of_us(np.zeros(0, dtype=np.int64))
    out: dict[str, Any] = {
        "n": n,
        "p": CDF_PROBABILITIES.tolist(),
        "ms": rounded([counted.percentile(p * 100) / 1000 for p in CDF_PROBABILITIES]),
        "mean": counted.mean() / 1000,
    }
    for q in NAMED_PERCENTILES:
        out[f"p{q}"] = counted.percentile(q) / 1000
    return out


def cdf_of_ms(samples_ms: np.ndarray) -> dict[str, Any]:
    """The same from float ms samples (a per-request mean, already in ms); NaNs dropped."""
    values = np.asarray(samples_ms, dtype=float)
    values = values[np.isfinite(values)]
    n = len(values)
    if n == 0:
        return cdf_of_us(np.zeros(0, dtype=np.int64))
    out: dict[str, Any] = {
        "n": n,
        "p": CDF_PROBABILITIES.tolist(),
        "ms": rounded(np.percentile(values, CDF_PROBABILITIES * 100)),
        "mean": float(values.mean()),
    }
    for q in NAMED_PERCENTILES:
        out[f"p{q}"] = float(np.percentile(values, q))
    return out


def latency_distributions(src: RunSource) -> dict[str, Any]:
    """TTFT (every request that got a first token), E2E (completed), every inter-token gap
    (live results only: the summary's ITL) and each completed request's mean inter-token time
    (TPOT: what an ITL SLO judges)."""
    r = src.requests
    handled = r.state != run_source.REJECTED
    got_first = handled & (r.first_token_us >= 0)
    out = {
        "ttft": cdf_of_us(r.first_token_us[got_first] - r.arrival_us[got_first]),
        "e2e": cdf_of_us(r.completion_us[r.completed] - r.arrival_us[r.completed]),
        "tpot": cdf_of_ms(r.tpot_ms),
    }
    if src.itl_gaps is not None:
        out["itl"] = cdf_of_counted(src.itl_gaps)
    return out


# --- time series ----------------------------------------------------------------------------


def _bins(end_s: float, events: int) -> tuple[float, np.ndarray]:
    """A nice bin width for `end_s` seconds holding `events` events, and the bin edges."""
    from ..metrics.plots import choose_bin_s

    bin_s = choose_bin_s(end_s, int(np.clip(events // BIN_COMPLETIONS, MIN_BINS, MAX_BINS)))
    n = max(1, math.ceil(end_s / bin_s - 1e-9))
    return bin_s, bin_s * np.arange(n + 1)


def _label(src: RunSource, iid: str) -> str:
    role = src.roles.get(iid)
    return f"{iid} ({role})" if role else iid


def time_series(src: RunSource) -> dict[str, Any] | None:
    """Per instance and pooled, in the same fixed-width bins from t = 0: completions and
    output tokens per second, waiting queue, batch size and KV blocks in use (time-weighted
    means per bin, each value holding from its step's end to the next), and preemptions per
    second. None without a step log (a results document)."""
    from ..metrics.plots import resample

    steps = src.steps
    r = src.requests
    done_s = r.completion_us[r.completed] / 1e6
    # A request's first token, unless a decode step made it (a disaggregated request's is its
    # decode sub-request's first decode token, already in the steps' decode_tokens).
    whole = r.first_token_us >= 0
    if r.disaggregated is not None:
        whole &= ~r.disaggregated
    first_s = r.first_token_us[whole] / 1e6
    if steps is None or not len(steps):
        if not len(done_s):
            return None
        end_s = float(done_s.max())
    else:
        step_end_us = (steps["start_us"] + steps["step_us"]).to_numpy(dtype=float)
        end_s = max(float(step_end_us.max()) / 1e6, float(done_s.max()) if len(done_s) else 0.0)
    end_s = max(end_s, 1e-6)
    bin_s, edges = _bins(end_s, len(done_s))
    width = np.diff(edges)
    out: dict[str, Any] = {
        "bin_s": bin_s,
        "t_s": rounded((edges[:-1] + edges[1:]) / 2),
        "end_s": end_s,
    }
    completions = np.histogram(done_s, bins=edges)[0]
    pooled: dict[str, Any] = {"completions_per_s": rounded(completions / width)}
    out["completed_in_bins"] = int(completions.sum())
    out["pooled"] = pooled
    if steps is None or not len(steps):
        out["instances"] = []
        return out
    ids = [str(i) for i in dict.fromkeys(steps["instance_id"])]
    caps = src.capacities
    cap_of = (
        dict(zip(caps["instance_id"].astype(str), caps["kv_blocks"], strict=True))
        if caps is not None
        else {}
    )
    per: list[dict[str, Any]] = []
    sums = {k: np.zeros(len(width)) for k in ("queue", "batch", "kv_used", "running")}
    tokens_total = np.histogram(first_s, bins=edges)[0].astype(float)
    preempt_total = np.zeros(len(width))
    kv_capacity_total = 0
    groups = dict(tuple(steps.groupby("instance_id", sort=False)))
    done_by_instance = r.instance_id[r.completed]
    for iid in ids:
        g = groups[iid]
        t = (g["start_us"] + g["step_us"]).to_numpy(dtype=float) / 1e6
        row: dict[str, Any] = {"id": iid, "label": _label(src, iid)}
        for key, column in (
            ("queue", "queue_length"),
            ("batch", "batch_size"),
            ("kv_used", "kv_used_blocks"),
            ("running", "running_requests"),
        ):
            series = resample(t, g[column].to_numpy(), bin_s, end_s=edges[-1], start_s=0.0)
            mean = series.mean[: len(width)]
            sums[key] += np.nan_to_num(mean)
            row[key] = rounded(mean)
        decode = np.histogram(t, bins=edges, weights=g["decode_tokens"].to_numpy(dtype=float))[0]
        tokens_total += decode
        # Preemptions are a running total per step: the count in a bin is the total at the
        # bin's last step minus the total before it.
        total = g["preemptions_total"].to_numpy(dtype=np.int64)
        at_edges = np.searchsorted(t, edges, side="right") - 1
        cumulative = np.where(at_edges >= 0, total[np.clip(at_edges, 0, None)], 0)
        preempted = np.diff(cumulative)
        preempt_total += preempted
        row["preemptions_per_s"] = rounded(preempted / width)
        row["preemptions"] = int(preempted.sum())
        row["completions_per_s"] = rounded(
            np.histogram(done_s[done_by_instance == iid], bins=edges)[0] / width
        )
        capacity = cap_of.get(iid)
        if capacity is not None and not (isinstance(capacity, float) and math.isnan(capacity)):
            row["kv_capacity_blocks"] = int(capacity)
            kv_capacity_total += int(capacity)
        per.append(row)
    pooled["output_tokens_per_s"] = rounded(tokens_total / width)
    pooled["output_tokens_in_bins"] = int(tokens_total.sum())
    pooled["preemptions_per_s"] = rounded(preempt_total / width)
    pooled["preemptions"] = int(preempt_total.sum())
    for key, values in sums.items():
        pooled[key] = rounded(values)
    if kv_capacity_total:
        pooled["kv_capacity_blocks"] = kv_capacity_total
        live = _live_capacity(src, cap_of, edges)
        if live is not None:
            pooled["kv_capacity_blocks_live"] = live
    if len(per) > MAX_INSTANCE_SERIES:
        out["instances_hidden"] = len(per)
        per = []
    out["instances"] = per
    return out


def _live_capacity(src: RunSource, cap_of: dict[str, Any], edges: np.ndarray) -> list | None:
    """The KV capacity of the instances routable in each bin, for a fleet that changed (None
    for a fixed one): an instance counts from `routable_s` to `terminated_s` (or the end)."""
    fleet = src.fleet_instances
    if fleet is None or not len(fleet) or "routable_s" not in fleet:
        return None
    mid = (edges[:-1] + edges[1:]) / 2
    live = np.zeros(len(mid))
    for row in fleet.itertuples(index=False):
        capacity = cap_of.get(str(row.instance_id))
        start = row.routable_s
        if capacity is None or start is None or math.isnan(float(capacity)):
            continue
        if math.isnan(float(start)):
            continue
        end = row.terminated_s if not math.isnan(float(row.terminated_s)) else math.inf
        live += float(capacity) * ((mid >= float(start)) & (mid < float(end)))
    return rounded(live)


# --- sections -------------------------------------------------------------------------------


def scenario_facts(src: RunSource) -> list[list[Any]]:
    """(what, value) rows describing the deployment, traffic and latency model."""
    sc = src.scenario
    resolved = sc.get("resolved") or {}
    rows: list[list[Any]] = []

    def add(name: str, value: Any) -> None:
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items())
        if value is not None and value != "" and value != [] and value != {}:
            rows.append([name, value if isinstance(value, int | float | str) else str(value)])

    add("scenario", sc.get("name"))
    add("description", sc.get("description"))
    add("model", resolved.get("model") or sc.get("model"))
    if resolved.get("models"):
        add("models served", ", ".join(resolved["models"]))
    deployments = [d for d in sc.get("deployments") or [] if isinstance(d, dict)]
    # With named deployments each has its own GPU, layout and KV cache (its rows below): the
    # top level's would be the first deployment's, wrongly shown for every instance.
    if not deployments:
        add("GPU", resolved.get("hardware") or sc.get("hardware"))
        add("tensor parallel (TP)", resolved.get("tp") or sc.get("tp"))
        for key, name in (
            ("pp", "pipeline parallel (PP)"),
            ("ep", "expert parallel (EP)"),
            ("dp", "data parallel within an instance (DP)"),
        ):
            if sc.get(key) is not None:
                add(name, sc[key])
        layout = (src.latency or {}).get("layout")
        if isinstance(layout, dict):
            add("parallel layout per instance", _layout_text(layout))
    cluster = sc.get("cluster") or {}
    instances = len(src.instance_ids) or cluster.get("num_instances")
    add("instances (data-parallel replicas)", instances)
    pd = cluster.get("pd") or {}
    if pd.get("prefill_instances"):
        for role in ("prefill", "decode"):
            pool = pd.get(role) or {}
            gpu = pool.get("hardware") or resolved.get("hardware")
            tp = pool.get("tp") or resolved.get("tp")
            add(f"{role} pool", f"{pd.get(f'{role}_instances')} instance(s), {gpu}, TP {tp}")
        add("PD decider", pd.get("decider"))
        add("KV transfer link", f"{pd.get('transfer_bandwidth_gb_per_s')} GB/s")
    for pool in sc.get("node_pools") or []:
        add(
            f"node pool {pool.get('name')}",
            f"{pool.get('gpu_type')}, {pool.get('gpus_per_node')} GPU(s)/node, "
            f"{pool.get('initial_nodes')}-{pool.get('max_nodes')} nodes, "
            f"${pool.get('cost_per_hour')}/h per node",
        )
    for dep in deployments:
        add(f"deployment {dep.get('name')}", _deployment_text(src, dep, sc, resolved))
    routing = cluster.get("routing") or {}
    if (instances or 1) > 1:
        add("routing policy", routing.get("policy"))
        add("admission policy", (cluster.get("admission") or {}).get("policy"))
    engine = sc.get("engine") or {}
    add("scheduler", engine.get("scheduler"))
    # The resolved limits (an unset one is auto, deployment.batch_limits).
    running = batch_limit(sc, "max_num_running_reqs")
    tokens = batch_limit(sc, "max_num_scheduled_tokens")
    limits_source = resolved.get("batch_limits_source")
    shown_source = f" ({limits_source})" if limits_source and limits_source != "set" else ""
    add("max running requests per instance", f"{running}{shown_source}" if running else running)
    add("token budget per step", f"{tokens}{shown_source}" if tokens else tokens)
    if resolved.get("total_kv_blocks") is not None and not deployments:
        add(
            "KV cache per instance",
            f"{resolved['total_kv_blocks']:,} blocks of {engine.get('block_size_tokens', 16)} "
            f"tokens ({resolved.get('kv_blocks_source', 'given')})",
        )
    add("prefix caching", engine.get("enable_prefix_caching"))
    add("traffic", _traffic(sc))
    add("seed", sc.get("seed"))
    latency = src.latency or {}
    add("latency model", latency.get("latency_model"))
    for key, value in latency.items():
        if key not in ("latency_model", "by_role", "by_deployment", "layout"):
            add(f"latency model: {key}", value)
    for role, prov in (latency.get("by_role") or {}).items():
        add(
            f"latency model ({role} pool)", f"{prov.get('latency_model')}: {prov.get('source', '')}"
        )
    for name, prov in (latency.get("by_deployment") or {}).items():
        if isinstance(prov, dict):
            add(
                f"latency model (deployment {name})",
                f"{prov.get('latency_model')}: {prov.get('source', '')}",
            )
    return rows


def _layout_text(layout: dict[str, Any]) -> str:
    """ "TP 2 × PP 1 × DP 1 × EP 1 (2 GPU(s))"."""
    return " × ".join(f"{k.upper()} {v}" for k, v in layout.items() if k != "gpus") + (
        f" ({layout['gpus']} GPU(s))" if "gpus" in layout else ""
    )


def _deployment_text(
    src: RunSource, dep: dict[str, Any], sc: dict[str, Any], resolved: dict[str, Any]
) -> str:
    """One named deployment: its model, instances and pool, then its own GPU, parallel layout
    (from its resolved latency entry) and KV cache per instance (its instances' capacities:
    each engine's in a live run, inferred per instance in a saved one)."""
    name = dep.get("name")
    parts = [
        f"{dep.get('model') or resolved.get('model')}, {dep.get('num_instances')} "
        f"instance(s) on pool {dep.get('pool')}"
    ]
    by_deployment = (src.latency or {}).get("by_deployment") or resolved.get(
        "latency_by_deployment"
    )
    entry = (by_deployment or {}).get(name) if isinstance(by_deployment, dict) else None
    entry = entry if isinstance(entry, dict) else {}
    pools = {p.get("name"): p for p in sc.get("node_pools") or [] if isinstance(p, dict)}
    gpu = (
        dep.get("hardware")
        or entry.get("gpu")
        or (pools.get(dep.get("pool")) or {}).get("gpu_type")
        or resolved.get("hardware")
    )
    if gpu:
        parts.append(str(gpu))
    layout = entry.get("layout")
    if isinstance(layout, dict):
        parts.append(_layout_text(layout))
    elif dep.get("tp") or resolved.get("tp"):
        parts.append(f"TP {dep.get('tp') or resolved.get('tp')}")
    blocks = _deployment_kv_blocks(src, name)
    if not blocks and dep.get("total_kv_blocks") is not None:
        blocks = [int(dep["total_kv_blocks"])]
    if blocks:
        shown = " to ".join(f"{b:,}" for b in sorted({min(blocks), max(blocks)}))
        block_size = (sc.get("engine") or {}).get("block_size_tokens", 16)
        parts.append(f"KV cache {shown} blocks of {block_size} tokens per instance")
    return ", ".join(parts)


def _deployment_kv_blocks(src: RunSource, name: Any) -> list[int]:
    """The KV blocks of each instance of deployment `name` the run created (empty when the
    input does not say which instance belongs to which deployment)."""
    fleet, caps = src.fleet_instances, src.capacities
    if fleet is None or caps is None or "deployment" not in getattr(fleet, "columns", ()):
        return []
    mine = {str(i) for i in fleet.loc[fleet["deployment"] == name, "instance_id"]}
    out = []
    for iid, blocks in zip(caps["instance_id"].astype(str), caps["kv_blocks"], strict=True):
        if iid in mine and blocks is not None and not math.isnan(float(blocks)):
            out.append(int(blocks))
    return out


def _traffic(sc: dict[str, Any]) -> str | None:
    wl = sc.get("workload")
    if sc.get("trace"):
        return f"trace replay of {sc['trace'].get('data')}"
    if sc.get("workload_spec"):
        return f"workload spec {sc['workload_spec']}"
    if not isinstance(wl, dict):
        return None
    if wl.get("preset") is not None or "rate" in wl:
        parts = [f"preset {wl['preset']}" if wl.get("preset") else "synthetic"]
        if wl.get("rate") is not None:
            parts.append(f"{wl['rate']:g} req/s {wl.get('arrival', 'poisson')}")
        if wl.get("num_requests"):
            parts.append(f"{wl['num_requests']:,} requests")
        return ", ".join(parts)
    clients = wl.get("clients") or []
    parts = ["v2 workload"]
    if wl.get("aggregate_rate") is not None:
        parts.append(f"{wl['aggregate_rate']:g} req/s")
    if wl.get("num_requests"):
        parts.append(f"{wl['num_requests']:,} requests")
    if clients:
        parts.append(f"{len(clients)} client(s)")
    return ", ".join(parts)


def headline(src: RunSource) -> dict[str, Any]:
    return {k: src.summary[k] for k in HEADLINE_FIELDS if k in src.summary}


def pd_section(src: RunSource) -> dict[str, Any] | None:
    """Where a disaggregated request's time goes, and the KV link. None without PD."""
    if src.pd_metrics is None:
        return None
    out: dict[str, Any] = {"metrics": src.pd_metrics}
    if src.pd_stages is not None and len(src.pd_stages["e2e"]):
        stages = {}
        for name in PD_STAGES:
            us = src.pd_stages[name]
            stages[name] = {
                "mean_ms": float(us.sum() / len(us)) / 1000,
                **{f"p{q}_ms": float(np.percentile(us, q)) / 1000 for q in (50, 90, 99)},
            }
        out["stages"] = stages
        out["requests"] = len(src.pd_stages["e2e"])
        out["e2e_mean_ms"] = float(src.pd_stages["e2e"].sum() / len(src.pd_stages["e2e"])) / 1000
    if src.transfers_us is not None and len(src.transfers_us):
        out["transfer"] = cdf_of_us(src.transfers_us)
    return out


def balance_section(src: RunSource) -> dict[str, Any] | None:
    """Per-instance load and the routing decisions. None with a single instance."""
    frame = src.instances
    if frame is None or len(frame) < 2:
        return None
    keep = [
        c
        for c in (
            "instance_id",
            "routed",
            "completed",
            "output_tokens",
            "steps",
            "mean_batch_size",
            "mean_queue_length",
            "mean_kv_utilization",
            "peak_kv_utilization",
            "cache_hit_rate",
            "preemptions",
        )
        if c in frame.columns
    ]
    rows = clean(frame[keep].to_dict(orient="records"))
    for row in rows:
        row["label"] = _label(src, str(row["instance_id"]))
    out: dict[str, Any] = {"instances": rows}
    # Only a routed count is judged: a completed count is not the router's spread (a request
    # that timed out on a slow instance was routed there all the same).
    load = [row.get("routed") or 0 for row in rows]
    if "routed" in keep and sum(load):
        from ..metrics.anomalies import jain_fairness

        out["jain_fairness_routed"] = jain_fairness(load)
        out["max_over_mean_routed"] = max(load) / (sum(load) / len(load))
    if src.decisions is not None:
        out["decisions"] = _decisions(src)
    if src.per_model is not None:
        out["per_model"] = clean(src.per_model.to_dict(orient="records"))
    return out


def _decisions(src: RunSource) -> dict[str, Any]:
    """Routing decisions per target and bin, regret statistics and the reasons given."""
    trace = src.decisions
    summary = trace.summary()
    routings = trace.routings
    out: dict[str, Any] = {"summary": summary}
    if not routings:
        return out
    clock_s = np.array([r["clock_us"] for r in routings], dtype=float) / 1e6
    chosen = np.array([r["chosen"] for r in routings], dtype=object)
    end_s = max(float(clock_s.max()), 1e-6)
    bin_s, edges = _bins(end_s, len(routings))
    width = np.diff(edges)
    from ..cluster.decisions import natural_key

    targets = sorted(set(chosen.tolist()), key=natural_key)
    out["bin_s"] = bin_s
    out["t_s"] = rounded((edges[:-1] + edges[1:]) / 2)
    out["per_target"] = {
        t: rounded(np.histogram(clock_s[chosen == t], bins=edges)[0] / width) for t in targets
    }
    regrets = np.array([r["regret"] for r in routings], dtype=float)
    if trace.counterfactual_k > 0:
        out["regret"] = {
            "k": trace.counterfactual_k,
            "mean": float(regrets.mean()),
            "p99": float(np.percentile(regrets, 99)),
            "max": float(regrets.max()),
            "zero_fraction": float((regrets == 0).mean()),
        }
    reasons: dict[str, int] = {}
    for r in routings:
        # "weighted (score=0.5690)": the policy's reason without the chosen score, which
        # differs decision by decision (grouped by it, every row was one score).
        reason = _SCORE_IN_REASON.sub("", str(r.get("reason") or ""))
        reasons[reason] = reasons.get(reason, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
    out["reasons"] = [{"reason": k, "decisions": v} for k, v in top]
    return out


_SCORE_IN_REASON = re.compile(r"\s*\(score=[^)]*\)")


def lifecycle_section(src: RunSource) -> dict[str, Any] | None:
    """Every lifecycle transition (nodes and instances) and the fleet's totals. None for a
    fixed fleet. A results JSON has the totals (`fleet`) but not the transitions: then the
    totals alone, with no events."""
    if src.timeline is None or not len(src.timeline):
        if src.fleet_metrics:
            return {"events": [], "fleet": src.fleet_metrics}
        return None
    t = src.timeline
    events = [
        {
            "time_s": float(row.time_s),
            "kind": str(row.kind),
            "id": str(row.id),
            "from": str(row.from_state),
            "to": str(row.to_state),
            "reason": str(row.reason),
        }
        for row in t.head(MAX_EVENTS).itertuples(index=False)
    ]
    out: dict[str, Any] = {"events": events, "fleet": src.fleet_metrics or {}}
    if len(t) > MAX_EVENTS:
        out["events_total"] = len(t)
    if src.fleet_instances is not None and len(src.fleet_instances):
        out["instances"] = clean(src.fleet_instances.to_dict(orient="records"))
    return out


def anomaly_section(src: RunSource) -> dict[str, Any]:
    kv = {k: v for k, v in src.kv_metrics.items()}
    flags = []
    s = src.summary
    for key, text in (
        ("dropped_unservable", "requests dropped as unservable (prompt larger than the KV cache)"),
        ("timed_out_requests", "requests timed out"),
        ("preemption_count", "preemptions (KV cache full: a running request was evicted)"),
        ("still_queued", "requests still queued when the run ended"),
        ("still_running", "requests still running when the run ended"),
        ("kv_allocation_failures", "KV allocation failures"),
        ("dropped_on_drain", "requests dropped when their instance was drained"),
        ("failed_requests", "requests lost with a failed instance"),
    ):
        if s.get(key):
            flags.append({"what": text, "count": s[key]})
    for key, value in src.anomalies.items():
        if value and key not in ("dropped_unservable", "length_capped_requests"):
            flags.append({"what": key.replace("_", " "), "count": value})
    if s.get("length_capped_requests"):
        flags.append(
            {
                "what": "requests capped at the model's context length",
                "count": s["length_capped_requests"],
            }
        )
    return {"counters": src.anomalies, "kv_cache": kv, "flags": flags}


def run_data(result: Any) -> dict[str, Any]:
    """Everything a run's report shows, JSON-safe. `result`: a live `Result`, a `SavedResult`
    or a results document (dict)."""
    src = run_source.of(result)
    notes: dict[str, str] = {}
    series = time_series(src)
    if series is None and src.kind == "document":
        notes["timeseries"] = "no step log in this input (a results JSON has per-request rows only)"
    elif series is None:
        # A live run or saved folder keeps every step: an empty log is a run whose engines
        # never stepped (every request rejected, timed out waiting or never arriving).
        notes["timeseries"] = "no engine step ran: no instance ever scheduled a request"
    elif not series["instances"] and not series.get("instances_hidden"):
        notes["timeseries"] = (
            "only completions over time: this input has no step log (queue, KV, batch size "
            "and preemptions come from the engine's steps)"
        )
    elif series.get("instances_hidden"):
        notes["timeseries"] = (
            f"{series['instances_hidden']} instances: pooled series only (per-instance lines "
            f"are drawn up to {MAX_INSTANCE_SERIES})"
        )
    pd = pd_section(src)
    if pd is None:
        notes["pd"] = "not a disaggregated run: prefill and decode share every instance"
    elif "stages" not in pd:
        notes["pd"] = (
            "the stage breakdown needs a live run (Result.report or --report): a saved result "
            "keeps only each KV transfer's duration, a results JSON only the PD metrics"
        )
    balance = balance_section(src)
    if balance is None:
        notes["balance"] = "a single instance: there is no routing and nothing to balance"
    elif "decisions" not in balance:
        notes["decisions"] = (
            "routing decisions are recorded only with cluster.trace.level: decisions (flag "
            "--trace-level decisions) in a live run"
        )
    lifecycle = lifecycle_section(src)
    if lifecycle is None:
        notes["lifecycle"] = "a fixed fleet: no node or instance changed state during the run"
    elif not lifecycle["events"]:
        notes["lifecycle"] = (
            "the fleet changed during the run, but a results JSON keeps only its totals: the "
            "transitions are in a saved result (Result.save) or the --timeline-path CSV"
        )
    if src.itl_gaps is None:
        notes["itl"] = (
            "every-token ITL needs a live run; the ITL curve here is each request's mean "
            "inter-token time (TPOT)"
        )
    return clean(
        {
            "kind": "run",
            "source": src.kind,
            "title": src.scenario.get("name") or "servesim run",
            "scenario": scenario_facts(src),
            "summary": src.summary,
            "headline": headline(src),
            "slo": src.slo,
            "steady": src.steady,
            "latency": latency_distributions(src),
            "per_slo": src.per_slo if len(src.per_slo) > 1 else {},
            "timeseries": series,
            "pd": pd,
            "balance": balance,
            "lifecycle": lifecycle,
            "anomalies": anomaly_section(src),
            "notes": notes,
        }
    )
