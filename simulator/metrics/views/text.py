"""The run as text and as one document: the blocks the command line prints, in BLIS's order
(docs/behaviour.md §10.1), and the `--results-path` file (§10.3). Both read a result's views
by attribute, so they serve any object that has them."""

from __future__ import annotations

import json
from typing import Any

from ..fitness import format_fitness
from ..summary import format_summary

PER_SLO_HEADER = "=== Per-SLO Metrics ==="
ANOMALY_HEADER = "=== Anomaly Counters ==="
KV_HEADER = "=== KV Cache Metrics ==="
TENANT_HEADER = "=== Per-Tenant Metrics ==="
PD_HEADER = "=== PD Metrics ==="
SESSION_HEADER = "=== Session Metrics ==="
CLIENT_HEADER = "=== Client ==="
SLO_HEADER = "=== SLO Attainment ==="
STEADY_HEADER = "=== Steady State ==="
LATENCY_HEADER = "=== Latency Model ==="
ENGINE_HEADER = "=== Engine Policies ==="
FLEET_HEADER = "=== Fleet Metrics ==="
MODEL_HEADER = "=== Per-Model Metrics ==="
SPECULATIVE_HEADER = "=== Speculative Decoding ==="
ADAPTER_HEADER = "=== Per-Adapter Metrics ==="
HORIZON_HEADER = "=== Horizon ==="


def report_text(result: Any) -> str:
    """Everything the CLI prints, in BLIS's order (docs/behaviour.md §10.1)."""
    blocks = [format_summary(s) for s in result.instance_summaries if s["completed_requests"] > 0]
    blocks.append(format_summary(result.summary))
    if result.fitness is not None:
        blocks.append(format_fitness(*result.fitness))
    if any(result.anomalies.values()):
        blocks.append(f"{ANOMALY_HEADER}\n{json.dumps(result.anomalies, indent=2)}")
    if any(result.kv_metrics.values()):
        kv = {k: round(v, 4) if isinstance(v, float) else v for k, v in result.kv_metrics.items()}
        blocks.append(f"{KV_HEADER}\n{json.dumps(kv, indent=2)}")
    if len(result.per_slo) > 1:
        blocks.append(f"{PER_SLO_HEADER}\n{json.dumps(result.per_slo, indent=2)}")
    if len(result.per_tenant["tokens"]) > 1:
        blocks.append(f"{TENANT_HEADER}\n{json.dumps(result.per_tenant, indent=2)}")
    if result.pd_metrics is not None:
        blocks.append(f"{PD_HEADER}\n{json.dumps(result.pd_metrics, indent=2)}")
    if result.speculative_metrics is not None:
        spec = json.dumps(result.speculative_metrics, indent=2)
        blocks.append(f"{SPECULATIVE_HEADER}\n{spec}")
    if result.adapter_metrics:
        blocks.append(f"{ADAPTER_HEADER}\n{json.dumps(result.adapter_metrics, indent=2)}")
    if result.session_block is not None:
        blocks.append(f"{SESSION_HEADER}\n{json.dumps(result.session_block, indent=2)}")
    if result.client_cap is not None:
        blocks.append(f"{CLIENT_HEADER}\n{json.dumps(result.client_cap, indent=2)}")
    horizon = horizon_block(result)
    if horizon is not None:
        blocks.append(f"{HORIZON_HEADER}\n{json.dumps(horizon, indent=2)}")
    if result.slo:
        blocks.append(f"{SLO_HEADER}\n{json.dumps(result.slo, indent=2)}")
    if result.steady_state is not None:
        steady = result.steady_state.document()
        blocks.append(f"{STEADY_HEADER}\n{json.dumps(steady, indent=2)}")
    if result.multi_model:
        table = _nulls(result.per_model.set_index("model").round(3)).to_dict(orient="index")
        blocks.append(f"{MODEL_HEADER}\n{json.dumps(table, indent=2)}")
    if result.fleet_metrics is not None:
        fleet = {
            k: round(v, 3) if isinstance(v, float) else v for k, v in result.fleet_metrics.items()
        }
        blocks.append(f"{FLEET_HEADER}\n{json.dumps(fleet, indent=2)}")
    if result.decisions is not None and result.scenario.get("cluster", {}).get("trace", {}).get(
        "summarize"
    ):
        blocks.append(result.decisions.summary_text())
    policies = engine_policies(result.scenario)
    if policies:
        blocks.append(f"{ENGINE_HEADER}\n{json.dumps(policies, indent=2)}")
    if result.latency_provenance:
        blocks.append(f"{LATENCY_HEADER}\n{json.dumps(result.latency_provenance, indent=2)}")
    return "\n".join(blocks)


def latency_provenance(scenario: dict[str, Any] | None) -> dict[str, Any]:
    """Which latency model produced these numbers, from which coefficients (and, when PD
    pools differ, per pool role; when named deployments differ from the scenario's
    top-level one, per deployment: model, role, GPU, layout, precision, efficiencies)."""
    # A saved result's entries may be null (load_result lets them: "the run did not say"),
    # as the report's readers take them; a null block is left out, not shown as null.
    resolved = (scenario or {}).get("resolved") or {}
    out = dict(resolved.get("latency") or {})
    if resolved.get("latency_by_role") is not None:
        out["by_role"] = resolved["latency_by_role"]
    if resolved.get("latency_by_deployment") is not None:
        out["by_deployment"] = {
            name: {k: v for k, v in (entry or {}).items() if k not in BATCH_LIMIT_FIELDS}
            for name, entry in resolved["latency_by_deployment"].items()
        }
    return out


def results_document(result: Any) -> dict[str, Any]:
    """What `--results-path` writes: the summary, every dict-valued view and one record per
    request."""
    doc = dict(result.summary)
    if len(result.per_slo) > 1:
        doc["per_slo_class"] = result.per_slo
    if result.session_counts:
        doc["sessions"] = result.session_counts
    if result.session_metrics is not None:
        doc["session_metrics"] = result.session_metrics
    if result.client_cap is not None:
        doc["client"] = result.client_cap
    horizon = horizon_block(result)
    if horizon is not None:
        doc["horizon"] = horizon
    if result.slo:
        doc["slo"] = result.slo
    if result.steady_state is not None:
        doc["steady_state_detail"] = result.steady_state.document()
    if result.instance_summaries:
        doc["instances"] = result.instance_summaries
    doc["anomalies"] = result.anomalies
    doc["kv_cache"] = result.kv_metrics
    if result.fitness is not None:
        doc["fitness"] = {"score": result.fitness[0], "components": result.fitness[1]}
    if result.pd_metrics is not None:
        doc["pd"] = result.pd_metrics
    if result.speculative_metrics is not None:
        doc["speculative"] = result.speculative_metrics
    if result.adapter_metrics is not None:
        doc["adapters"] = result.adapter_metrics
    if result.multi_model:
        doc["per_model"] = _nulls(result.per_model).to_dict(orient="records")
    if result.fleet_metrics is not None:
        doc["fleet"] = result.fleet_metrics
    if result.latency_provenance:
        doc["latency_model"] = result.latency_provenance
    policies = engine_policies(result.scenario)
    if policies:
        doc["engine_policies"] = policies
    doc["requests"] = result.blis_request_records()
    return doc


# The engine's pluggable rules (docs/engine.md): which of each produced a run.
ENGINE_POLICY_FIELDS = ("scheduler", "priority_policy", "batch_formation", "preemption_policy")
# The batch limits the run's (main) deployment resolved, and where they came from
# (deployment.batch_limits: set, vLLM's default on the GPU, or BLIS's).
BATCH_LIMIT_FIELDS = ("max_num_running_reqs", "max_num_scheduled_tokens", "batch_limits_source")


def batch_limit(scenario: dict[str, Any] | None, name: str) -> Any:
    """The batch limit `name` the run's deployment resolved, or, in a result saved before the
    limits were resolved, its engine section's value (None when neither says)."""
    scenario = scenario or {}
    return (scenario.get("resolved") or {}).get(name, (scenario.get("engine") or {}).get(name))


def engine_policies(scenario: dict[str, Any] | None) -> dict[str, Any]:
    """The wait-queue order, priority, batch formation and preemption policies the run's
    engines used (every instance uses the scenario's `engine` section), then the batch
    limits its deployment resolved (with named deployments that differ from the top level,
    theirs: once when they agree, else `by_deployment`); what the run does not say (a result
    saved before these were recorded) is left out."""
    engine = (scenario or {}).get("engine") or {}
    resolved = (scenario or {}).get("resolved") or {}
    policies = {name: engine[name] for name in ENGINE_POLICY_FIELDS if name in engine}
    if engine.get("slo_priorities"):  # only when set: the defaults are BLIS's, in engine.md
        policies["slo_priorities"] = engine["slo_priorities"]
    by_deployment = {
        name: {k: entry[k] for k in BATCH_LIMIT_FIELDS if k in entry}
        for name, entry in (resolved.get("latency_by_deployment") or {}).items()
    }
    if any(by_deployment.values()):
        # Named deployments that differ from the top-level resolution: no instance runs
        # the top level's limits (a deployment on another GPU has vLLM's default for that
        # GPU), so the block says the deployments' own, once when they agree.
        distinct = {json.dumps(v, sort_keys=True) for v in by_deployment.values()}
        if len(distinct) == 1:
            return policies | next(iter(by_deployment.values()))
        return policies | {"by_deployment": by_deployment}
    return policies | {name: resolved[name] for name in BATCH_LIMIT_FIELDS if name in resolved}


def _nulls(frame: Any) -> Any:
    """`frame` with NaN as None, so that JSON shows a statistic of no samples as null."""
    return frame.astype(object).where(frame.notna(), None)


def horizon_block(result: Any) -> dict[str, Any] | None:
    """A replayed trace cut by the horizon: how many of its requests arrive after it, and,
    through a client cap, how many were due before it but never sent (neither injected, so in
    no other count); with the arrived ones they add up to the trace. None when every request
    arrived."""
    unsent = getattr(result, "client_unsent_requests", 0)
    if not result.not_arrived and not unsent:
        return None
    block = {
        "horizon_us": result.horizon_us,
        "not_arrived_requests": result.not_arrived,
        "arrived_requests": len(result.request_records),
    }
    if unsent:
        block["never_sent_requests"] = unsent
    return block
