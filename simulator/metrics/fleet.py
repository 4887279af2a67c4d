"""Reports of a changing fleet: lifecycle timeline, instance uptime and GPU cost, and
per-model metrics for multi-model runs (docs/behaviour.md §A6, §A7). The fleet's functions
read its end-of-run record (`infra`, a `FleetRecord` of metrics/fleet_record.py), or None
for a run on a fixed fleet."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..engine.request import Request, RequestState
from .summary import pooled_itl_us, stat_or_none

if TYPE_CHECKING:
    from .fleet_record import FleetRecord

TIMELINE_COLUMNS = ["time_us", "time_s", "kind", "id", "from_state", "to_state", "reason"]
UPTIME_COLUMNS = [
    "instance_id",
    "deployment",
    "model",
    "node",
    "gpus",
    "created_s",
    "placed_s",
    "routable_s",
    "terminated_s",
    "final_state",
    "uptime_s",
    "gpu_seconds",
    "cost_usd",
]
NODE_COLUMNS = ["node_id", "pool", "gpus", "created_s", "terminated_s", "uptime_s", "cost_usd"]


def timeline_frame(infra: FleetRecord | None) -> pd.DataFrame:
    """Every lifecycle transition, in the order it happened."""
    if infra is None:
        return pd.DataFrame(columns=TIMELINE_COLUMNS)
    rows = [
        (r.time_us, r.time_us / 1e6, r.kind, r.entity_id, r.from_state, r.to_state, r.reason)
        for r in infra.timeline.rows
    ]
    return pd.DataFrame.from_records(rows, columns=TIMELINE_COLUMNS)


def _end_s(start_us: int, end_us: int, run_end_us: int) -> float:
    # Billed until it ended or the run did, whichever came first.
    stop = min(end_us, run_end_us) if end_us >= 0 else run_end_us
    return max(0, stop - start_us) / 1e6


def node_frame(infra: FleetRecord | None, run_end_us: int) -> pd.DataFrame:
    """One row per node: billed from the provisioning request until it terminates (or the
    run ends), at its pool's cost per hour."""
    if infra is None:
        return pd.DataFrame(columns=NODE_COLUMNS)
    rows = []
    for node in infra.nodes:
        uptime_s = _end_s(node.created_us, node.terminated_us, run_end_us)
        rows.append(
            (
                node.node_id,
                node.pool,
                len(node.gpus),
                node.created_us / 1e6,
                node.terminated_us / 1e6 if node.terminated_us >= 0 else np.nan,
                uptime_s,
                uptime_s / 3600 * node.cost_per_hour,
            )
        )
    return pd.DataFrame.from_records(rows, columns=NODE_COLUMNS)


def uptime_frame(infra: FleetRecord | None, run_end_us: int) -> pd.DataFrame:
    """One row per instance the fleet created: when it existed and what its GPUs cost.

    `uptime_s` runs from its creation (Scheduling) to its termination; its GPUs are held, and
    cost, only from its placement (Loading) on: `gpu_seconds` and `cost_usd` count that span,
    so the fleet's GPU-seconds never exceed what its nodes provided. An instance's share of a
    node's cost is its GPUs on the node / the node's GPUs; an instance on several nodes (whole
    ones) pays each node's whole cost and lists its nodes joined by "+"; an instance never
    placed holds nothing and costs nothing."""
    if infra is None:
        return pd.DataFrame(columns=UPTIME_COLUMNS)
    rows = []
    for slot, rec in zip(infra.plan.slots, infra.records, strict=True):
        if rec.state is None:
            continue
        uptime_s = _end_s(rec.created_us, rec.terminated_us, run_end_us)
        placed = rec.placed_us >= 0
        held_s = _end_s(rec.placed_us, rec.terminated_us, run_end_us) if placed else 0.0
        nodes = infra.nodes_of(rec)
        gpus = rec.gpus_needed
        cost = 0.0
        if len(nodes) == 1:
            node = nodes[0]
            cost = held_s / 3600 * node.cost_per_hour * gpus / len(node.gpus)
        elif nodes:
            cost = sum(held_s / 3600 * n.cost_per_hour for n in nodes)
        rows.append(
            (
                rec.instance_id,
                slot.deployment,
                rec.model,
                "+".join(n.node_id for n in nodes),
                gpus,
                rec.created_us / 1e6,
                rec.placed_us / 1e6 if placed else np.nan,
                rec.loaded_us / 1e6 if rec.loaded_us >= 0 else np.nan,
                rec.terminated_us / 1e6 if rec.terminated_us >= 0 else np.nan,
                rec.state.value,
                uptime_s,
                held_s * gpus,
                cost,
            )
        )
    return pd.DataFrame.from_records(rows, columns=UPTIME_COLUMNS)


def fleet_summary(infra: FleetRecord, run_end_us: int) -> dict[str, Any]:
    """Counts and totals of the fleet's changes: what the capacity cost and what was lost."""
    uptime = uptime_frame(infra, run_end_us)
    nodes = node_frame(infra, run_end_us)
    out: dict[str, Any] = {
        "instances_created": len(uptime),
        "instance_seconds": float(uptime.uptime_s.sum()),
        "gpu_seconds": float(uptime.gpu_seconds.sum()),
        "nodes_created": len(nodes),
        "node_seconds": float(nodes.uptime_s.sum()),
        "gpu_cost_usd": float(nodes.cost_usd.sum()),
        "dropped_on_drain": infra.dropped_on_drain,
        "failed_requests": infra.failed,
        "retried_requests": infra.retried,
        "redirected_requests": infra.redirected,
        "requests_waited_for_instance": infra.parked_total,
    }
    if infra.events_after_end:
        out["events_after_end"] = infra.events_after_end
    for scaler in infra.autoscalers:
        out[f"autoscaler_{scaler.deployment}_scale_ups"] = scaler.scale_ups
        out[f"autoscaler_{scaler.deployment}_scale_downs"] = scaler.scale_downs
        if scaler.refused_scale_ups:
            out[f"autoscaler_{scaler.deployment}_refused_scale_ups"] = scaler.refused_scale_ups
    return out


def served_model_of(req: Request, aliases: dict[str, str], default: str) -> str:
    if not req.model:
        return default
    return aliases.get(req.model.lower(), req.model.lower())


def per_model_frame(
    requests: list[Request],
    instances: list[Any],
    instance_models: list[str],
    aliases: dict[str, str],
    default_model: str,
    duration_s: float,
) -> pd.DataFrame:
    """TTFT, E2E, ITL, throughput and counts per model (ms; throughput per second);
    `instances` are the instances' end-of-run records, `instance_models` their models."""
    groups: dict[str, list[Request]] = {m: [] for m in dict.fromkeys(instance_models)}
    for r in requests:
        groups.setdefault(served_model_of(r, aliases, default_model), []).append(r)
    rows = []
    for model, members in groups.items():
        mine = [e for e, m in zip(instances, instance_models, strict=True) if m == model]
        done = [r for r in members if r.state is RequestState.COMPLETED]
        ttft = np.array(
            [r.first_token_us - r.arrival_us for r in members if r.first_token_us >= 0],
            dtype=np.int64,
        )
        e2e = np.array([r.completion_us - r.arrival_us for r in done], dtype=np.int64)
        itl = pooled_itl_us(mine)
        output_tokens = sum(e.total_output_tokens for e in mine)
        states = Counter(r.state for r in members)
        row: dict[str, Any] = {
            "model": model,
            "instances": len(mine),
            "requests": len(members),
            "completed": len(done),
            "rejected": states[RequestState.REJECTED],
            "unfinished": sum(not r.is_finished for r in members),
            # The other ways a request ends, so that a row adds up to its requests.
            "dropped": states[RequestState.DROPPED] + states[RequestState.DROPPED_ON_DRAIN],
            "timed_out": states[RequestState.TIMED_OUT],
            "failed": states[RequestState.FAILED],
        }
        for name, values in (("ttft", ttft), ("e2e", e2e), ("itl", itl)):
            # A model nobody was served by has no latency: NaN here, null in the JSON.
            for column, p in ((f"{name}_mean_ms", None), (f"{name}_p99_ms", 99)):
                value = stat_or_none(values, p, 1000)
                row[column] = np.nan if value is None else value
        row["responses_per_sec"] = len(done) / duration_s if duration_s > 0 else 0.0
        row["tokens_per_sec"] = output_tokens / duration_s if duration_s > 0 else 0.0
        rows.append(row)
    return pd.DataFrame(rows)
