"""The BLIS-compatible summary of a run and the statistics it is made of.

Summary fields follow BLIS's MetricsOutput (docs/behaviour.md §10.2): same names, same units (ms),
plus the p50 latencies BLIS lacks. Semantics follow servesim's Part A (docs/behaviour.md): E2E is
completion − arrival and output-token totals include each request's first token (§A3).

Everything here reads requests (objects or their columns) and the instances' end-of-run
records (`metrics.instance_record`), never a live engine, so the run (`cluster.cluster`), the
per-model view (`metrics.fleet`) and the report (`report.run_source`) share it without
importing `metrics.results`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..engine.request import Request, RequestState
from .quantiles import linear_percentile, percentile
from .request_table import RequestStats, request_columns

if TYPE_CHECKING:
    from .instance_record import InstanceRecord


SUMMARY_HEADER = "=== Simulation Metrics ==="
# BLIS's MetricsOutput fields (docs/behaviour.md §10.2), in BLIS's order; kv_allocation_failures is
# omitted when zero. servesim adds the *_p50_ms fields.
BLIS_SUMMARY_FIELDS = (
    "instance_id",
    "completed_requests",
    "still_queued",
    "still_running",
    "injected_requests",
    "total_input_tokens",
    "total_output_tokens",
    "vllm_estimated_duration_s",
    "responses_per_sec",
    "tokens_per_sec",
    "e2e_mean_ms",
    "e2e_p90_ms",
    "e2e_p95_ms",
    "e2e_p99_ms",
    "ttft_mean_ms",
    "ttft_p90_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "itl_mean_ms",
    "itl_p90_ms",
    "itl_p95_ms",
    "itl_p99_ms",
    "scheduling_delay_p99_ms",
    "preemption_count",
    "dropped_unservable",
    "length_capped_requests",
    "timed_out_requests",
)


def pct(values: np.ndarray, p: float) -> float:
    """numpy's linear percentile; 0 of no values."""
    return percentile(values, p) if len(values) else 0.0


def mean(values: np.ndarray) -> float:
    """The mean as the exact sum over the count; 0 of no values."""
    return float(values.sum() / len(values)) if len(values) else 0.0


class CountedValues:
    """A multiset of integers as sorted distinct values and their counts, with numpy's mean
    and linear-interpolation percentile computed exactly as on the expanded array.

    A run's inter-token gaps are logged per step as (gap, count); expanding them costs one
    integer per output token (about 1 GB for a million requests). The statistics need only
    the sum, the count and two order statistics per percentile."""

    def __init__(self, values: np.ndarray, counts: np.ndarray) -> None:
        # A negative count takes values back out (the pooled ITL's withdrawn gaps).
        distinct, inverse = np.unique(values, return_inverse=True)
        totals = np.zeros(len(distinct), dtype=np.int64)
        np.add.at(totals, inverse, counts.astype(np.int64))
        if (totals < 0).any():
            raise ValueError("counted values: a value taken out more often than it was put in")
        keep = totals > 0
        self.values = distinct[keep]
        self.counts = totals[keep]
        self.cumulative = np.cumsum(self.counts)
        self.n = int(self.cumulative[-1]) if len(self.values) else 0

    def __len__(self) -> int:
        return self.n

    def total(self) -> int:
        """The exact sum of the expanded array (Python integers: no int64 overflow)."""
        return int((self.values.astype(object) * self.counts.astype(object)).sum())

    def mean(self) -> float:
        """As `mean` of the expanded array: the exact integer sum over n."""
        if not self.n:
            return 0.0
        return float(np.int64(self.total()) / self.n)

    def _at(self, index: int) -> np.int64:
        return self.values[int(np.searchsorted(self.cumulative, index, side="right"))]

    def percentile(self, p: float) -> float:
        """numpy.percentile(expanded, p) with its default linear method."""
        return linear_percentile(self.n, p, self._at) if self.n else 0.0


def pooled_itl_us(
    instances: Sequence[InstanceRecord], withdrawn: Sequence[WithdrawnItl] | None = None
) -> CountedValues:
    """Every individual inter-token gap (µs) of the requests that completed, as counted
    values: what the engines' steps produced less the gaps of the requests they withdrew
    (engine/itl_pool.py), as vLLM's benchmark and BLIS pool successful requests only.
    `withdrawn` is each instance's `withdrawn_itl_us`, when the caller has them already."""
    if withdrawn is None:
        withdrawn = [withdrawn_itl_us(eng) for eng in instances]
    values = []
    counts = []
    for eng, lost in zip(instances, withdrawn, strict=True):
        # Reduced log by log, chunk by chunk: the expanded columns of a million-request run
        # are tens of MB each, and sorting them all at once took several hundred MB.
        regular_us, regular_counts = eng.steps.itl_regular_counted()
        values.append(regular_us)
        counts.append(regular_counts)
        irregular = np.asarray(eng.irregular_itl_us, dtype=np.int64)
        values.append(irregular)
        counts.append(np.ones(len(irregular), dtype=np.int64))
        for gaps_us in (lost.regular_us, lost.irregular_us):
            values.append(gaps_us)
            counts.append(np.full(len(gaps_us), -1, dtype=np.int64))
        if eng.speculation is not None:
            # A verification's later tokens follow its first by the per-token overhead.
            values.append(np.array([eng.otp_us], dtype=np.int64))
            counts.append(np.array([completed_burst_gaps(eng, lost)], dtype=np.int64))
    if not values:
        return CountedValues(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    return CountedValues(np.concatenate(values), np.concatenate(counts))


class WithdrawnItl(NamedTuple):
    """The gaps of the requests an instance withdrew: regular and irregular ones (µs, int64)
    and how many were in-burst gaps of speculative verifications."""

    regular_us: np.ndarray
    irregular_us: np.ndarray
    in_burst: int


def withdrawn_itl_us(eng: InstanceRecord) -> WithdrawnItl:
    """The gaps of the requests `eng` withdrew: every withdrawn gap that was neither regular
    nor a break was a gap inside a speculative burst."""
    withdrawn = eng.withdrawn_gaps
    regular = eng.steps.regular_gaps_of_runs(
        np.array(withdrawn.run_start_rows, dtype=np.int64),
        np.array(withdrawn.run_last_end_us, dtype=np.float64),
    )
    irregular = np.asarray(withdrawn.irregular_itl_us, dtype=np.int64)
    in_burst = max(0, withdrawn.gap_count - len(regular) - len(irregular))
    return WithdrawnItl(regular, irregular, in_burst)


def completed_burst_gaps(eng: InstanceRecord, withdrawn: WithdrawnItl) -> int:
    """The in-burst gaps (tokens after a speculative verification's first) of the requests
    that completed."""
    return eng.speculation.stats.burst_gaps - withdrawn.in_burst


def stat_mean(values: np.ndarray | CountedValues) -> float:
    return values.mean() if isinstance(values, CountedValues) else mean(values)


def stat_pct(values: np.ndarray | CountedValues, p: float) -> float:
    return values.percentile(p) if isinstance(values, CountedValues) else pct(values, p)


def stat_or_none(
    values: np.ndarray | CountedValues, p: float | None = None, scale: float = 1.0
) -> float | None:
    """The mean (`p` None) or the `p`-th percentile of `values`, over `scale`; None of no
    values: a statistic of no samples is unknown (JSON null), never 0, so that a run or a
    class that served nobody does not look fast. BLIS prints 0 there."""
    if not len(values):
        return None
    return (stat_mean(values) if p is None else stat_pct(values, p)) / scale


def compute_summary(
    instance_id: str,
    requests: list[Request] | RequestStats,
    engines: Sequence[InstanceRecord],
    sim_end_us: int,
) -> dict[str, Any]:
    """The BLIS MetricsOutput dict for `requests` (objects, or their `RequestStats`
    columns: the same numbers) served by the instances whose end-of-run records are `engines`.

    Request counts come from the requests' own states (a request that arrived but is not yet
    enqueued anywhere counts as queued), token totals and inter-token gaps from the engines.
    """
    if isinstance(requests, RequestStats):
        counts = requests.state_counts()
        completed = requests.is_state(RequestState.COMPLETED)
        arrival = requests.arrival_us
        # As the lists of the objects' differences made int64 (a fractional time truncated).
        e2e_us = (requests.completion_us - arrival)[completed].astype(np.int64, copy=False)
        first, scheduled = requests.first_token_us, requests.schedule_us
        ttft_us = (first - arrival)[first >= 0].astype(np.int64, copy=False)
        sched_us = (scheduled - arrival)[scheduled >= 0].astype(np.int64, copy=False)
    else:
        counts = {state: 0 for state in RequestState}
        for r in requests:
            counts[r.state] += 1
        completed = [r for r in requests if r.state is RequestState.COMPLETED]
        e2e_us = np.array([r.completion_us - r.arrival_us for r in completed], dtype=np.int64)
        ttft_us = np.array(
            [r.first_token_us - r.arrival_us for r in requests if r.first_token_us >= 0],
            dtype=np.int64,
        )
        sched_us = np.array(
            [r.schedule_us - r.arrival_us for r in requests if r.schedule_us >= 0],
            dtype=np.int64,
        )
    withdrawn = [withdrawn_itl_us(e) for e in engines]
    itl_us = pooled_itl_us(engines, withdrawn)
    n_completed = len(e2e_us)
    still_queued = counts[RequestState.QUEUED] + counts[RequestState.CREATED]
    still_running = counts[RequestState.RUNNING]
    dropped = counts[RequestState.DROPPED]
    timed_out = counts[RequestState.TIMED_OUT]
    duration_s = sim_end_us / 1e6
    output_tokens = sum(e.total_output_tokens for e in engines)
    summary: dict[str, Any] = {
        "instance_id": instance_id,
        "completed_requests": n_completed,
        "still_queued": still_queued,
        "still_running": still_running,
        "injected_requests": n_completed + still_queued + still_running + dropped + timed_out,
        "total_input_tokens": sum(e.total_input_tokens for e in engines),
        "total_output_tokens": output_tokens,
        "vllm_estimated_duration_s": duration_s,
        "responses_per_sec": n_completed / duration_s if duration_s > 0 else 0.0,
        "tokens_per_sec": output_tokens / duration_s if duration_s > 0 else 0.0,
    }
    for name, values in (("e2e", e2e_us), ("ttft", ttft_us), ("itl", itl_us)):
        summary[f"{name}_mean_ms"] = stat_or_none(values, None, 1000)
        for p in (50, 90, 95, 99):
            summary[f"{name}_p{p}_ms"] = stat_or_none(values, p, 1000)
    summary["scheduling_delay_p99_ms"] = pct(sched_us, 99) / 1000 if len(sched_us) else None
    failures = sum(e.kv_allocation_failures for e in engines)
    if failures:
        summary["kv_allocation_failures"] = failures
    summary["preemption_count"] = sum(e.preemption_count for e in engines)
    summary["dropped_unservable"] = dropped
    summary["length_capped_requests"] = sum(e.length_capped for e in engines)
    summary["timed_out_requests"] = timed_out
    speculating = [e for e in engines if e.speculation is not None]
    if speculating:  # speculative decoding's fields, only in runs that speculate
        from ..engine.speculative import summary_fields

        step_us = sum(int(np.sum(e.steps.step_us, dtype=np.int64)) for e in speculating)
        spec = summary_fields([e.speculation.stats for e in speculating], step_us)
        in_burst = sum(
            completed_burst_gaps(e, w)
            for e, w in zip(engines, withdrawn, strict=True)
            if e.speculation is not None
        )
        spec["spec_in_burst_itl_share"] = in_burst / len(itl_us) if len(itl_us) else None
        # Lists: the report block and the results document show them.
        del spec["spec_accepted_length_histogram"], spec["spec_per_position_acceptance"]
        summary.update(spec)
    with_lora = [e for e in engines if e.lora is not None]
    if with_lora:  # multi-LoRA serving's fields, only in runs that declare adapters
        from ..engine.lora import summary_fields as lora_fields

        step_us = sum(int(np.sum(e.steps.step_us, dtype=np.int64)) for e in with_lora)
        summary.update(lora_fields([e.lora for e in with_lora], step_us))
    # Fleet changes (only present when they happened, so fixed-fleet summaries keep BLIS's
    # field list).
    for state, name in (
        (RequestState.DROPPED_ON_DRAIN, "dropped_on_drain"),
        (RequestState.FAILED, "failed_requests"),
    ):
        if counts[state]:
            summary[name] = counts[state]
            summary["injected_requests"] += counts[state]
    return summary


# The class of a request without a label (an SLO class or a tenant).
DEFAULT_CLASS = "default"


def class_masks(values: np.ndarray) -> dict[str, np.ndarray]:
    """Rows per class of a coded column (`slo_class`, `tenant_id`): an unset value (None or
    "") is the class "default"; classes sorted by name."""
    masks: dict[str, np.ndarray] = {}
    for value in dict.fromkeys(values.tolist()):  # the few distinct values, first seen first
        rows = values == value if value is not None else np.equal(values, None)
        name = value or DEFAULT_CLASS
        masks[name] = masks[name] | rows if name in masks else rows
    return {name: masks[name] for name in sorted(masks)}


def per_class_metrics(records: Sequence, field: str) -> dict[str, dict[str, Any]]:
    """Request counts and TTFT / E2E mean and percentiles (ms) per class of the coded request
    field `field` ("default" when unset), classes sorted. Read as columns, in the records'
    order: a million finished requests are rows, not objects."""
    columns = request_columns(
        records, ("arrival_us", "first_token_us", "completion_us"), ("state", field)
    )
    arrival, first_token = columns["arrival_us"], columns["first_token_us"]
    ttft_all = (first_token - arrival).astype(np.int64)
    e2e_all = (columns["completion_us"] - arrival).astype(np.int64)
    has_token = first_token >= 0
    completed = columns["state"] == RequestState.COMPLETED
    out: dict[str, dict[str, Any]] = {}
    for name, rows in class_masks(columns[field]).items():
        ttft, e2e = ttft_all[rows & has_token], e2e_all[rows & completed]
        row: dict[str, Any] = {"requests": int(rows.sum()), "completed_requests": len(e2e)}
        for metric, values in (("ttft", ttft), ("e2e", e2e)):
            row[f"{metric}_mean_ms"] = stat_or_none(values, None, 1000)
            for p in (50, 90, 99):
                row[f"{metric}_p{p}_ms"] = stat_or_none(values, p, 1000)
        out[name] = row
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """BLIS's stdout block: the header line, then the JSON."""
    return f"{SUMMARY_HEADER}\n{json.dumps(summary, indent=2)}"


def mean_itl_ms(r: Request, no_gap: float = 0.0) -> float:
    """A request's mean inter-token time (TPOT), ms; `no_gap` with fewer than two tokens (0,
    as BLIS's records write it, by default)."""
    gen = r.generated_tokens
    if gen > 1 and r.first_token_us >= 0:
        return (r.last_token_us - r.first_token_us) / (gen - 1) / 1000
    return no_gap
