"""Per-instance views: the `instances` table, the KV cache metrics, the anomaly counters and
the statistics of speculative decoding and LoRA adapters, all from the instances' end-of-run
records (`metrics.instance_record`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..anomalies import hol_blocking_instances, priority_inversions
from ..instance_record import InstanceRecord

if TYPE_CHECKING:
    import pandas as pd

    from ..fleet_record import FleetRecord


def created_slots(count: int, infrastructure: FleetRecord | None) -> list[int]:
    """Indices of the `count` instances that existed in the run: all of them, except a
    changing fleet's slots that were never created (state None). `infrastructure` is the
    run's fleet record, or the live fleet (cluster.py's per-instance summaries), whose
    `records` are the same. Such a slot never ran, so as a row of zeros it would
    pass for an idle instance: lower HOL's mean queue and BLIS's mean hit rate, and count as
    an instance HOL could compare with."""
    if infrastructure is None:
        return list(range(count))
    return [i for i, rec in enumerate(infrastructure.records) if rec.state is not None]


def mean_queue_length(instance: InstanceRecord) -> float:
    queue = instance.steps.queue_length
    return float(np.mean(queue)) if len(queue) else 0.0


def instances_frame(
    instances: Sequence[InstanceRecord],
    instance_ids: list[str],
    routed: list[int],
    infrastructure: FleetRecord | None = None,
) -> pd.DataFrame:
    """One row per instance the run created: routed, completed, tokens, batch size, KV use,
    cache hits."""
    import pandas as pd

    rows = []
    for i in created_slots(len(instances), infrastructure):
        iid, eng = instance_ids[i], instances[i]
        steps = eng.steps
        n_steps = len(steps)
        rows.append(
            {
                "instance_id": iid,
                "routed": routed[i] if routed else eng.completed_count,
                "completed": eng.completed_count,
                "input_tokens": eng.total_input_tokens,
                "output_tokens": eng.total_output_tokens,
                "steps": n_steps,
                "mean_batch_size": float(np.mean(steps.batch_size)) if n_steps else 0.0,
                "mean_queue_length": mean_queue_length(eng),
                "mean_kv_utilization": float(np.mean(steps.kv_used_blocks)) / eng.kv.total_blocks
                if n_steps
                else 0.0,
                "peak_kv_utilization": eng.kv.peak_used_blocks / eng.kv.total_blocks,
                "cache_hit_rate": eng.kv.hit_rate,
                "preemptions": eng.preemption_count,
                "dropped_unservable": eng.dropped_unservable,
                "timed_out": eng.timed_out,
            }
        )
    return pd.DataFrame(rows)


def kv_metrics(
    summary: dict[str, Any],
    instances: Sequence[InstanceRecord],
    infrastructure: FleetRecord | None = None,
) -> dict[str, float]:
    """Preemption rate, prefix-cache hit rate and, with a CPU tier, its traffic and thrashing,
    over the instances the run created."""
    completed = summary["completed_requests"]
    preemptions = summary["preemption_count"]
    instances = [instances[i] for i in created_slots(len(instances), infrastructure)]
    hit_rates = [e.kv.hit_rate for e in instances]
    tiers = [e.kv.cpu for e in instances if e.kv.cpu is not None]
    hits = sum(e.kv.cache_hits for e in instances)
    lookups = hits + sum(e.kv.cache_misses for e in instances)
    metrics = {
        "preemption_rate": preemptions / completed if completed else 0.0,
        # BLIS's figure: the unweighted mean of the instances' rates, so an idle instance
        # (an unused pool member, a rank nobody routed to) pulls it toward 0.
        "cache_hit_rate": float(np.mean(hit_rates)) if hit_rates else 0.0,
        # The fleet's own rate: blocks found cached over blocks looked up, on every instance.
        "pooled_cache_hit_rate": hits / lookups if lookups else 0.0,
        "kv_thrashing_rate": 0.0,
    }
    if tiers:
        # Block-level hit rates over the prompt blocks the admissions looked up, as vLLM's
        # prefix-cache queries count prompt tokens: hits + misses would count every decode
        # block as a failed lookup, so the rates would fall as outputs grow with the same
        # prompts. (The GPU rates above keep BLIS's hits + misses, which the routers read.)
        reloaded = sum(t.reloaded_blocks for t in tiers)
        offloaded = sum(t.offloaded_blocks for t in tiers)
        looked = sum(e.kv.prompt_blocks_looked_up for e in instances)
        metrics["cpu_hit_rate"] = reloaded / looked if looked else 0.0
        metrics["combined_hit_rate"] = (hits + reloaded) / looked if looked else 0.0
        metrics["offloaded_blocks"] = offloaded
        metrics["reloaded_blocks"] = reloaded
        evicted = sum(t.evicted_blocks for t in tiers)
        # BLIS's definition (docs/behaviour.md §2.4): blocks the tier had to evict per block
        # written.
        metrics["kv_thrashing_rate"] = evicted / offloaded if offloaded else 0.0
        # The GPU handing back blocks it needs again at once: reloads of blocks offloaded
        # less than a second before (or lost from the tier meanwhile), per block reloaded.
        fast = sum(t.thrashed_blocks for t in tiers)
        metrics["fast_reloaded_blocks"] = fast
        metrics["fast_reload_rate"] = fast / reloaded if reloaded else 0.0
    return metrics


def anomaly_counters(
    summary: dict[str, Any],
    records: Sequence,
    instances: Sequence[InstanceRecord],
    instance_ids: list[str],
    priority_policy: str,
    admission_rejections: int,
    routing_rejections: int,
    infrastructure: FleetRecord | None = None,
) -> dict[str, int]:
    """BLIS's anomaly counters (docs/behaviour.md §10.4), plus routing rejections."""
    # From the step logs directly: building the instances DataFrame would import pandas,
    # which a run that prints its report never needs.
    mean_queue = {
        instance_ids[i]: mean_queue_length(instances[i])
        for i in created_slots(len(instances), infrastructure)
    }
    return {
        "priority_inversions": priority_inversions(records, priority_policy),
        "hol_blocking_events": len(hol_blocking_instances(mean_queue)),
        "admission_rejections": admission_rejections,
        "routing_rejections": routing_rejections,
        "dropped_unservable": summary["dropped_unservable"],
        "length_capped_requests": summary["length_capped_requests"],
    }


def adapter_metrics(
    instances: Sequence[InstanceRecord], duration_s: float, requests: Sequence[Any]
) -> dict[str, dict[str, Any]] | None:
    """Per LoRA adapter (docs/lora.md), None without LoRA: requests, completions, TTFT and
    E2E, output throughput from the run's requests; cold loads and evictions over every
    instance."""
    states = [e.lora for e in instances if e.lora is not None]
    if not states:
        return None
    from ...engine.lora import per_adapter

    return per_adapter(states, duration_s, requests)


def speculative_metrics(
    instances: Sequence[InstanceRecord], summary: dict[str, Any]
) -> dict[str, Any] | None:
    """Speculative decoding over the run (docs/speculative.md), None when it was off:
    the summary's spec_* fields plus the histogram of drafts accepted per verification."""
    speculating = [e for e in instances if e.speculation is not None]
    if not speculating:
        return None
    from ...engine.speculative import summary_fields

    step_us = sum(int(np.sum(e.steps.step_us, dtype=np.int64)) for e in speculating)
    out = summary_fields([e.speculation.stats for e in speculating], step_us)
    out["spec_in_burst_itl_share"] = summary.get("spec_in_burst_itl_share")
    return out
