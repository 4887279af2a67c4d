"""What a run returns: per-request and per-step DataFrames and a BLIS-compatible summary.

Summary fields follow BLIS's MetricsOutput (docs/behaviour.md §10.2): same names, same units (ms),
plus the p50 latencies BLIS lacks. Semantics follow servesim's Part A (docs/behaviour.md): E2E is
completion − arrival and output-token totals include each request's first token (§A3).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine.batching import VLLMEngine
from ..engine.request import Request, RequestState
from .request_table import ParentRecords, RequestStats

if TYPE_CHECKING:
    import pandas as pd


SUMMARY_HEADER = "=== Simulation Metrics ==="
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
FLEET_HEADER = "=== Fleet Metrics ==="
MODEL_HEADER = "=== Per-Model Metrics ==="
SPECULATIVE_HEADER = "=== Speculative Decoding ==="
ADAPTER_HEADER = "=== Per-Adapter Metrics ==="
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


def _pct(values: np.ndarray, p: float) -> float:
    return float(np.percentile(values, p)) if len(values) else 0.0


def _mean(values: np.ndarray) -> float:
    return float(values.sum() / len(values)) if len(values) else 0.0


class CountedValues:
    """A multiset of integers as sorted distinct values and their counts, with numpy's mean
    and linear-interpolation percentile computed exactly as on the expanded array.

    A run's inter-token gaps are logged per step as (gap, count); expanding them costs one
    integer per output token (about 1 GB for a million requests). The statistics need only
    the sum, the count and two order statistics per percentile."""

    def __init__(self, values: np.ndarray, counts: np.ndarray) -> None:
        keep = counts > 0
        distinct, inverse = np.unique(values[keep], return_inverse=True)
        self.values = distinct
        self.counts = np.zeros(len(distinct), dtype=np.int64)
        np.add.at(self.counts, inverse, counts[keep].astype(np.int64))
        self.cumulative = np.cumsum(self.counts)
        self.n = int(self.cumulative[-1]) if len(distinct) else 0

    def __len__(self) -> int:
        return self.n

    def mean(self) -> float:
        """As `_mean` of the expanded array: the exact integer sum over n."""
        if not self.n:
            return 0.0
        total = np.int64(int((self.values.astype(object) * self.counts.astype(object)).sum()))
        return float(total / self.n)

    def _at(self, index: int) -> np.int64:
        return self.values[int(np.searchsorted(self.cumulative, index, side="right"))]

    def percentile(self, p: float) -> float:
        """numpy.percentile(expanded, p) with its default linear method, step by step."""
        n = self.n
        if not n:
            return 0.0
        virtual = (n - 1) * np.true_divide(p, 100)
        if virtual >= n - 1:
            return float(self._at(n - 1))
        if virtual < 0:
            return float(self._at(0))
        lo = np.floor(virtual)
        gamma = virtual - lo
        a = self._at(int(lo))
        b = self._at(int(lo) + 1)
        diff = b - a
        result = b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
        return float(result)


def pooled_itl_us(engines: list[VLLMEngine]) -> CountedValues:
    """Every individual inter-token gap (µs) of the run, as counted values."""
    values = []
    counts = []
    for eng in engines:
        # Reduced log by log, chunk by chunk: the expanded columns of a million-request run
        # are tens of MB each, and sorting them all at once took several hundred MB.
        regular_us, regular_counts = eng.steps.itl_regular_counted()
        values.append(regular_us)
        counts.append(regular_counts)
        irregular = np.asarray(eng.irregular_itl_us, dtype=np.int64)
        values.append(irregular)
        counts.append(np.ones(len(irregular), dtype=np.int64))
        if eng.speculation is not None:
            # A verification's later tokens follow its first by the per-token overhead.
            values.append(np.array([eng.otp_us], dtype=np.int64))
            counts.append(np.array([eng.speculation.stats.burst_gaps], dtype=np.int64))
    if not values:
        return CountedValues(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    return CountedValues(np.concatenate(values), np.concatenate(counts))


def _stat_mean(values) -> float:
    return values.mean() if isinstance(values, CountedValues) else _mean(values)


def _stat_pct(values, p: float) -> float:
    return values.percentile(p) if isinstance(values, CountedValues) else _pct(values, p)


def compute_summary(
    instance_id: str,
    requests: list[Request] | RequestStats,
    engines: list[VLLMEngine],
    sim_end_us: int,
) -> dict[str, Any]:
    """The BLIS MetricsOutput dict for `requests` (objects, or their `RequestStats`
    columns: the same numbers) served by `engines`.

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
    itl_us = pooled_itl_us(engines)
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
    # A statistic of no samples is unknown (JSON null), never 0: a run that served nobody
    # must not look fast. BLIS prints 0 there.
    for name, values in (("e2e", e2e_us), ("ttft", ttft_us), ("itl", itl_us)):
        sampled = len(values) > 0
        summary[f"{name}_mean_ms"] = _stat_mean(values) / 1000 if sampled else None
        summary[f"{name}_p50_ms"] = _stat_pct(values, 50) / 1000 if sampled else None
        for p in (90, 95, 99):
            summary[f"{name}_p{p}_ms"] = _stat_pct(values, p) / 1000 if sampled else None
    summary["scheduling_delay_p99_ms"] = _pct(sched_us, 99) / 1000 if len(sched_us) else None
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
        spec["spec_in_burst_itl_share"] = (
            sum(e.speculation.stats.burst_gaps for e in speculating) / len(itl_us)
            if len(itl_us)
            else None
        )
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


def per_class_metrics(
    requests: list[Request], key: Callable[[Request], str]
) -> dict[str, dict[str, Any]]:
    """Request counts and TTFT / E2E mean and percentiles (ms) per class, classes sorted."""
    groups: dict[str, list[Request]] = {}
    for r in requests:
        groups.setdefault(key(r), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(groups):
        members = groups[name]
        ttft = np.array(
            [r.first_token_us - r.arrival_us for r in members if r.first_token_us >= 0],
            dtype=np.int64,
        )
        e2e = np.array(
            [r.completion_us - r.arrival_us for r in members if r.state is RequestState.COMPLETED],
            dtype=np.int64,
        )
        row: dict[str, Any] = {"requests": len(members), "completed_requests": len(e2e)}
        for metric, values in (("ttft", ttft), ("e2e", e2e)):
            row[f"{metric}_mean_ms"] = _mean(values) / 1000
            for p in (50, 90, 99):
                row[f"{metric}_p{p}_ms"] = _pct(values, p) / 1000
        out[name] = row
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """BLIS's stdout block: the header line, then the JSON."""
    return f"{SUMMARY_HEADER}\n{json.dumps(summary, indent=2)}"


def mean_itl_ms(r: Request) -> float:
    """A request's mean inter-token time (TPOT), ms; 0 with fewer than two tokens."""
    gen = r.generated_tokens
    if gen > 1 and r.first_token_us >= 0:
        return (r.last_token_us - r.first_token_us) / (gen - 1) / 1000
    return 0.0


def _mean_queue_length(engine: VLLMEngine) -> float:
    queue = engine.steps.queue_length
    return float(np.mean(queue)) if len(queue) else 0.0


def requests_frame(requests: list[Request]) -> pd.DataFrame:
    """One row per request; timestamps in µs (exact), latencies in ms."""

    import pandas as pd

    def opt(value: int) -> int | None:
        return value if value >= 0 else None

    rows = []
    for r in requests:
        done = r.state is RequestState.COMPLETED
        rows.append(
            (
                r.request_id,
                r.instance_id,
                r.state.value,
                r.arrival_us,
                opt(r.enqueue_us),
                opt(r.first_schedule_us),
                opt(r.schedule_us),
                opt(r.first_token_us),
                opt(r.completion_us) if done else None,
                r.input_tokens,
                r.output_tokens,
                r.generated_tokens,
                r.cached_tokens,
                r.preemptions,
                r.length_capped,
                (r.first_token_us - r.arrival_us) / 1000 if r.first_token_us >= 0 else np.nan,
                (r.completion_us - r.arrival_us) / 1000 if done else np.nan,
                mean_itl_ms(r),
                (r.schedule_us - r.arrival_us) / 1000 if r.schedule_us >= 0 else np.nan,
                r.slo_class,
                r.tenant_id,
                r.model,
                r.client_id,
                r.session_id,
                r.round_index,
                r.prefix_group,
                r.disaggregated,
                r.prefill_sub.instance_id if r.prefill_sub is not None else "",
                r.decode_sub.instance_id if r.decode_sub is not None else "",
                (r.transfer_end_us - r.transfer_start_us) / 1000
                if r.transfer_end_us >= 0
                else np.nan,
                r.kv_reload_us / 1000,
            )
        )
    frame = pd.DataFrame.from_records(rows, columns=REQUEST_COLUMNS)
    # Timestamps stay exact integers; a stage never reached is <NA>.
    return frame.astype({c: "Int64" for c in TIMESTAMP_COLUMNS})


REQUEST_COLUMNS = [
    "request_id",
    "instance_id",
    "state",
    "arrival_us",
    "enqueue_us",
    "first_schedule_us",
    "schedule_us",
    "first_token_us",
    "completion_us",
    "input_tokens",
    "output_tokens",
    "generated_tokens",
    "cached_tokens",
    "preemptions",
    "length_capped",
    "ttft_ms",
    "e2e_ms",
    "itl_ms",
    "scheduling_delay_ms",
    "slo_class",
    "tenant_id",
    "model",
    "client_id",
    "session_id",
    "round_index",
    "prefix_group",
    "disaggregated",
    "prefill_instance",
    "decode_instance",
    "transfer_ms",
    "kv_reload_ms",
]


TIMESTAMP_COLUMNS = [
    "arrival_us",
    "enqueue_us",
    "first_schedule_us",
    "schedule_us",
    "first_token_us",
    "completion_us",
]


def steps_frame(engines: list[VLLMEngine], instance_ids: list[str]) -> pd.DataFrame:
    import pandas as pd

    frames = []
    for eng, iid in zip(engines, instance_ids, strict=True):
        s = eng.steps
        frames.append(
            pd.DataFrame(
                {
                    "instance_id": iid,
                    "start_us": np.asarray(s.start_us, dtype=np.int64),
                    "step_us": np.asarray(s.step_us, dtype=np.int64),
                    "batch_size": np.asarray(s.batch_size, dtype=np.int64),
                    "prefill_tokens": np.asarray(s.prefill_tokens, dtype=np.int64),
                    "decode_tokens": np.asarray(s.decode_tokens, dtype=np.int64),
                    "kv_used_blocks": np.asarray(s.kv_used_blocks, dtype=np.int64),
                    "queue_length": np.asarray(s.queue_length, dtype=np.int64),
                    "running_requests": np.asarray(s.running_requests, dtype=np.int64),
                    "cpu_kv_used_blocks": np.asarray(s.cpu_kv_used_blocks, dtype=np.int64),
                    "reloading_requests": np.asarray(s.reloading_requests, dtype=np.int64),
                    "preemptions_total": np.asarray(s.preemptions, dtype=np.int64),
                }
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _parent_columns(parents: Sequence, names: Sequence[str]) -> list[np.ndarray]:
    """Fields of every PD parent (rows and objects alike), in order."""
    if isinstance(parents, ParentRecords):
        return [parents.column(name) for name in names]
    return [
        np.asarray([getattr(p, name) for p in parents], dtype=np.int64 if not parents else None)
        for name in names
    ]


def _transfer_ends(parents: Sequence) -> tuple[list, list, list]:
    """Per PD parent in order: id, prefill instance and decode instance index."""
    if isinstance(parents, ParentRecords):
        return parents.transfer_ends()
    return (
        [p.request_id for p in parents],
        [p.prefill_sub.instance_id for p in parents],
        [p.decode_instance_index for p in parents],
    )


@dataclass
class Result:
    """Outcome of one run. `summary` is the BLIS-compatible dict; DataFrames are built lazily."""

    summary: dict[str, Any]
    # Every request that arrived, in arrival order: a RequestRow (metrics/request_table.py)
    # per finished request of a compacting run, the Request object otherwise.
    request_records: Sequence[Request] = field(repr=False)
    engines: list[VLLMEngine] = field(repr=False)
    instance_ids: list[str] = field(repr=False)
    scenario: dict[str, Any] = field(default_factory=dict, repr=False)
    not_arrived: int = 0
    # SLO attainment and goodput (metrics/slo.py) and the steady-state verdict (metrics/steady.py).
    slo: dict[str, Any] = field(default_factory=dict)
    steady_state: Any = None
    # A trace's `max_in_flight` client cap: requests it sent late, and their total wait.
    client_delayed_requests: int = 0
    client_wait_us: int = 0
    session_counts: dict[str, int] = field(default_factory=dict)
    horizon_us: int | None = None
    instance_summaries: list[dict[str, Any]] = field(default_factory=list, repr=False)
    admission_rejections: int = 0
    routing_rejections: int = 0
    routed: list[int] = field(default_factory=list, repr=False)
    in_flight_at_end: list[int] = field(default_factory=list, repr=False)
    decisions: Any = field(default=None, repr=False)
    pd: Any = field(default=None, repr=False)
    instance_roles: list[str] = field(default_factory=list, repr=False)
    infrastructure: Any = field(default=None, repr=False)
    instance_models: list[str] = field(default_factory=list, repr=False)
    parked_at_end: int = 0
    fleet: Any = field(default=None, repr=False)

    @cached_property
    def requests(self) -> pd.DataFrame:
        return requests_frame(self.request_records)

    @cached_property
    def steps(self) -> pd.DataFrame:
        return steps_frame(self.engines, self.instance_ids)

    def summary_text(self) -> str:
        return format_summary(self.summary)

    @property
    def plot(self):
        """Figures of this run: `result.plot.latency_cdfs()`, `.instance_timelines()`, ..."""
        from .plots import PlotAccessor

        return PlotAccessor(self)

    def save(self, directory: str | Path) -> Path:
        """Write Parquet tables and summary.json; read back with `simulator.load_result`."""
        from .persistence import save_result

        return save_result(self, directory)

    def report(self, path: str | Path) -> Path:
        """Write this run's HTML report, one self-contained page (docs/report.md)."""
        from ..report import write_report

        return write_report(self, path)

    @property
    def run_end_us(self) -> int:
        return round(self.summary["vllm_estimated_duration_s"] * 1e6)

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """Lifecycle transitions of nodes and instances: time, id, from, to, reason."""
        from .fleet import timeline_frame

        return timeline_frame(self.infrastructure)

    @cached_property
    def fleet_instances(self) -> pd.DataFrame:
        """Per instance the fleet created: node, GPUs, uptime, GPU-seconds and cost."""
        from .fleet import uptime_frame

        return uptime_frame(self.infrastructure, self.run_end_us)

    @cached_property
    def nodes(self) -> pd.DataFrame:
        """Per node: pool, GPUs, uptime and cost."""
        from .fleet import node_frame

        return node_frame(self.infrastructure, self.run_end_us)

    @cached_property
    def fleet_metrics(self) -> dict[str, Any] | None:
        """Instance-seconds, GPU cost and the requests the fleet's changes touched."""
        if self.infrastructure is None:
            return None
        from .fleet import fleet_summary

        return fleet_summary(self.infrastructure, self.run_end_us)

    @cached_property
    def per_model(self) -> pd.DataFrame:
        """TTFT / E2E / ITL, throughput and counts per served model (docs/behaviour.md §A6)."""
        from .fleet import per_model_frame

        aliases = {}
        if self.fleet is not None:
            for key, names in self.fleet.model_aliases.items():
                aliases[key] = key
                aliases.update({n.lower(): key for n in names})
        models = self.instance_models or [""] * len(self.engines)
        return per_model_frame(
            self.request_records,
            self.engines,
            models,
            aliases,
            models[0] if models else "",
            self.summary["vllm_estimated_duration_s"],
        )

    @property
    def multi_model(self) -> bool:
        return len(set(self.instance_models)) > 1

    @cached_property
    def per_slo(self) -> dict[str, dict[str, Any]]:
        """TTFT / E2E per SLO class ("default" when untagged), docs/behaviour.md §10.4, in ms."""
        return per_class_metrics(self.request_records, lambda r: r.slo_class or "default")

    @cached_property
    def instances(self) -> pd.DataFrame:
        """One row per instance: routed, completed, tokens, batch size, KV use, cache hits."""
        import pandas as pd

        rows = []
        for i, (iid, eng) in enumerate(zip(self.instance_ids, self.engines, strict=True)):
            steps = eng.steps
            n_steps = len(steps)
            rows.append(
                {
                    "instance_id": iid,
                    "routed": self.routed[i] if self.routed else eng.completed_count,
                    "completed": eng.completed_count,
                    "input_tokens": eng.total_input_tokens,
                    "output_tokens": eng.total_output_tokens,
                    "steps": n_steps,
                    "mean_batch_size": float(np.mean(steps.batch_size)) if n_steps else 0.0,
                    "mean_queue_length": _mean_queue_length(eng),
                    "mean_kv_utilization": float(np.mean(steps.kv_used_blocks))
                    / eng.kv.total_blocks
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

    @cached_property
    def transfers(self) -> pd.DataFrame:
        """One row per KV transfer (PD): request, instances, bytes and timing (µs)."""
        import pandas as pd

        columns = [
            "request_id",
            "prefill_instance",
            "decode_instance",
            "size_bytes",
            "requested_us",
            "start_us",
            "end_us",
            "duration_us",
            "contention_delay_us",
            "concurrency_at_start",
        ]
        if self.pd is None:
            return pd.DataFrame(columns=columns)
        ids, prefill, decode = _transfer_ends(self.pd.parents)
        parents = dict(
            zip(ids, range(len(ids)), strict=True)
        )  # by request id (the last if one repeats)
        link = self.pd.link
        records = link.records
        rows = []
        for tid, size, requested, start, duration, concurrency in zip(
            records.transfer_id,
            records.size_bytes,
            records.requested_us,
            records.starts(),
            records.duration_us,
            records.concurrency_at_start,
            strict=True,
        ):
            parent = parents[tid]
            rows.append(
                (
                    tid,
                    prefill[parent],
                    self.instance_ids[decode[parent]],
                    size,
                    requested,
                    start,
                    requested + duration,
                    duration,
                    duration - link.lone_duration_us(size),
                    concurrency,
                )
            )
        return pd.DataFrame.from_records(rows, columns=columns)

    @cached_property
    def pd_metrics(self) -> dict[str, Any] | None:
        """BLIS's `=== PD Metrics ===` (docs/behaviour.md §7.4) plus link concurrency."""
        if self.pd is None:
            return None
        d = self.pd
        duration_s = self.summary["vllm_estimated_duration_s"]
        prefill_tput = d.prefill_completed / duration_s if duration_s else 0.0
        decode_tput = d.decode_completed / duration_s if duration_s else 0.0
        lo, hi = sorted((prefill_tput, decode_tput))
        imbalance: float | str = 1.0 if hi == 0 else ("inf" if lo == 0 else hi / lo)
        first, arrival, transfer_end = _parent_columns(
            d.parents, ("first_token_us", "arrival_us", "transfer_end_us")
        )
        ttft = (first - arrival)[first >= 0].astype(np.int64)
        durations = self.transfers.duration_us.to_numpy(dtype=np.int64)
        completed_transfers = int(np.count_nonzero(transfer_end >= 0))
        end = max(self.summary["vllm_estimated_duration_s"] * 1e6, 1.0)
        return {
            "disaggregated_requests": completed_transfers,
            "dropped_at_decode_kv": d.dropped_at_decode_kv,
            "prefill_throughput_rps": prefill_tput,
            "decode_throughput_rps": decode_tput,
            "load_imbalance_ratio": imbalance,
            "parent_ttft_mean_ms": _mean(ttft) / 1000,
            "parent_ttft_p50_ms": _pct(ttft, 50) / 1000,
            "parent_ttft_p95_ms": _pct(ttft, 95) / 1000,
            "parent_ttft_p99_ms": _pct(ttft, 99) / 1000,
            "transfers": int(len(durations)),
            "transfer_duration_mean_us": _mean(durations),
            "transfer_duration_p50_us": _pct(durations, 50),
            "transfer_duration_p95_us": _pct(durations, 95),
            "transfer_duration_p99_us": _pct(durations, 99),
            "link_peak_concurrency": d.link.peak_concurrency,
            "link_mean_concurrency_at_start": d.link.mean_concurrency_at_start,
            "link_time_weighted_concurrency": d.link.time_weighted_mean_concurrency(int(end)),
        }

    @cached_property
    def adapter_metrics(self) -> dict[str, dict[str, Any]] | None:
        """Per LoRA adapter over every instance (docs/lora.md), None without LoRA: requests,
        completions, cold loads and evictions, TTFT and E2E, output throughput."""
        states = [e.lora for e in self.engines if e.lora is not None]
        if not states:
            return None
        from ..engine.lora import per_adapter

        return per_adapter(states, self.summary["vllm_estimated_duration_s"])

    @cached_property
    def speculative_metrics(self) -> dict[str, Any] | None:
        """Speculative decoding over the run (docs/speculative.md), None when it was off:
        the summary's spec_* fields plus the histogram of drafts accepted per verification."""
        speculating = [e for e in self.engines if e.speculation is not None]
        if not speculating:
            return None
        from ..engine.speculative import summary_fields

        step_us = sum(int(np.sum(e.steps.step_us, dtype=np.int64)) for e in speculating)
        out = summary_fields([e.speculation.stats for e in speculating], step_us)
        out["spec_in_burst_itl_share"] = self.summary.get("spec_in_burst_itl_share")
        return out

    @cached_property
    def anomalies(self) -> dict[str, int]:
        """BLIS's anomaly counters (docs/behaviour.md §10.4), plus routing rejections."""
        from .anomalies import hol_blocking_instances, priority_inversions

        policy = self.scenario.get("engine", {}).get("priority_policy", "constant")
        # From the engines directly: building the instances DataFrame would import pandas,
        # which a run that prints its report never needs.
        mean_queue = {
            iid: _mean_queue_length(eng)
            for iid, eng in zip(self.instance_ids, self.engines, strict=True)
        }
        return {
            "priority_inversions": priority_inversions(self.request_records, policy),
            "hol_blocking_events": len(hol_blocking_instances(mean_queue)),
            "admission_rejections": self.admission_rejections,
            "routing_rejections": self.routing_rejections,
            "dropped_unservable": self.summary["dropped_unservable"],
            "length_capped_requests": self.summary["length_capped_requests"],
        }

    @cached_property
    def kv_metrics(self) -> dict[str, float]:
        completed = self.summary["completed_requests"]
        preemptions = self.summary["preemption_count"]
        hit_rates = [e.kv.hit_rate for e in self.engines]
        tiers = [e.kv.cpu for e in self.engines if e.kv.cpu is not None]
        metrics = {
            "preemption_rate": preemptions / completed if completed else 0.0,
            "cache_hit_rate": float(np.mean(hit_rates)) if hit_rates else 0.0,
            "kv_thrashing_rate": 0.0,
        }
        if tiers:
            # Block-level hit rate over both tiers: (GPU hits + CPU reloads) / blocks looked at.
            gpu_hits = sum(e.kv.cache_hits for e in self.engines)
            misses = sum(e.kv.cache_misses for e in self.engines)
            reloaded = sum(t.reloaded_blocks for t in tiers)
            offloaded = sum(t.offloaded_blocks for t in tiers)
            looked = gpu_hits + reloaded + misses
            metrics["cpu_hit_rate"] = reloaded / looked if looked else 0.0
            metrics["combined_hit_rate"] = (gpu_hits + reloaded) / looked if looked else 0.0
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

    @cached_property
    def per_tenant(self) -> dict[str, Any]:
        """Output tokens served per tenant and Jain's fairness index over them."""
        from .anomalies import jain_fairness, tenant_tokens

        tokens = tenant_tokens(self.request_records)
        return {"tokens": tokens, "jain_fairness": jain_fairness(list(tokens.values()))}

    @cached_property
    def fitness(self) -> tuple[float, dict[str, float]] | None:
        weights = self.scenario.get("cluster", {}).get("fitness_weights")
        if not weights:
            return None
        from .fitness import evaluate_fitness, parse_fitness_weights

        return evaluate_fitness(self.summary, parse_fitness_weights(weights))

    def report_text(self) -> str:
        """Everything the CLI prints, in BLIS's order (docs/behaviour.md §10.1)."""
        blocks = [format_summary(s) for s in self.instance_summaries if s["completed_requests"] > 0]
        blocks.append(self.summary_text())
        if self.fitness is not None:
            from .fitness import format_fitness

            blocks.append(format_fitness(*self.fitness))
        if any(self.anomalies.values()):
            blocks.append(f"{ANOMALY_HEADER}\n{json.dumps(self.anomalies, indent=2)}")
        if any(self.kv_metrics.values()):
            kv = {k: round(v, 4) if isinstance(v, float) else v for k, v in self.kv_metrics.items()}
            blocks.append(f"{KV_HEADER}\n{json.dumps(kv, indent=2)}")
        if len(self.per_slo) > 1:
            blocks.append(f"{PER_SLO_HEADER}\n{json.dumps(self.per_slo, indent=2)}")
        if len(self.per_tenant["tokens"]) > 1:
            blocks.append(f"{TENANT_HEADER}\n{json.dumps(self.per_tenant, indent=2)}")
        if self.pd_metrics is not None:
            blocks.append(f"{PD_HEADER}\n{json.dumps(self.pd_metrics, indent=2)}")
        if self.speculative_metrics is not None:
            spec = json.dumps(self.speculative_metrics, indent=2)
            blocks.append(f"{SPECULATIVE_HEADER}\n{spec}")
        if self.adapter_metrics:
            blocks.append(f"{ADAPTER_HEADER}\n{json.dumps(self.adapter_metrics, indent=2)}")
        if self.session_block is not None:
            blocks.append(f"{SESSION_HEADER}\n{json.dumps(self.session_block, indent=2)}")
        if self.client_cap is not None:
            blocks.append(f"{CLIENT_HEADER}\n{json.dumps(self.client_cap, indent=2)}")
        if self.slo:
            blocks.append(f"{SLO_HEADER}\n{json.dumps(self.slo, indent=2)}")
        if self.steady_state is not None:
            steady = self.steady_state.document()
            blocks.append(f"{STEADY_HEADER}\n{json.dumps(steady, indent=2)}")
        if self.multi_model:
            table = self.per_model.set_index("model").round(3).to_dict(orient="index")
            blocks.append(f"{MODEL_HEADER}\n{json.dumps(table, indent=2)}")
        if self.fleet_metrics is not None:
            fleet = {
                k: round(v, 3) if isinstance(v, float) else v for k, v in self.fleet_metrics.items()
            }
            blocks.append(f"{FLEET_HEADER}\n{json.dumps(fleet, indent=2)}")
        if self.decisions is not None and self.scenario.get("cluster", {}).get("trace", {}).get(
            "summarize"
        ):
            blocks.append(self.decisions.summary_text())
        if self.latency_provenance:
            blocks.append(f"{LATENCY_HEADER}\n{json.dumps(self.latency_provenance, indent=2)}")
        return "\n".join(blocks)

    @cached_property
    def session_metrics(self) -> dict[str, Any] | None:
        """BLIS-current's session statistics (docs/results.md "Sessions"), or None when no
        request belongs to a session. `sessions` counts the distinct session IDs; TTFT cold is
        over round-0 requests and warm over later rounds (every request that got a first
        token); a session's duration runs from its round-0 arrival to its last completion
        (sessions without a round 0, or with no completed request after it, are left out).
        Each statistic is {mean, p50, p95, p99, n} in ms, percentiles interpolated linearly."""
        from .request_table import request_columns

        cols = request_columns(
            self.request_records,
            ("arrival_us", "first_token_us", "completion_us", "round_index"),
            ("session_id", "state"),
        )
        in_session = cols["session_id"] != ""
        if not in_session.any():
            return None
        sid = cols["session_id"][in_session]
        arrival = cols["arrival_us"][in_session]
        first = cols["first_token_us"][in_session]
        done = cols["completion_us"][in_session]
        rnd = cols["round_index"][in_session]
        completed = cols["state"][in_session] == RequestState.COMPLETED
        has_token = first >= 0
        cold = (first - arrival)[has_token & (rnd == 0)] / 1000
        warm = (first - arrival)[has_token & (rnd > 0)] / 1000
        start: dict[str, int] = {}
        end: dict[str, int] = {}
        for s, a in zip(sid[rnd == 0], arrival[rnd == 0], strict=True):
            start.setdefault(s, int(a))
        for s, c in zip(sid[completed], done[completed], strict=True):
            end[s] = max(end.get(s, int(c)), int(c))
        durations = [end[s] - a for s, a in start.items() if end.get(s, a) > a]

        def stats(values_ms) -> dict[str, Any]:
            values_ms = np.asarray(values_ms, dtype=float)
            return {
                "mean": _mean(values_ms),
                "p50": _pct(values_ms, 50),
                "p95": _pct(values_ms, 95),
                "p99": _pct(values_ms, 99),
                "n": len(values_ms),
            }

        return {
            "sessions": len(set(sid)),
            "ttft_cold_ms": stats(cold),
            "ttft_warm_ms": stats(warm),
            "session_duration_ms": stats(np.asarray(durations, dtype=float) / 1000),
        }

    @property
    def session_block(self) -> dict[str, Any] | None:
        """What `=== Session Metrics ===` prints: the statistics, then how the sessions ended
        (`session_counts`, when the run tracked them)."""
        if self.session_metrics is None and not self.session_counts:
            return None
        block = dict(self.session_metrics or {})
        if self.session_counts:
            block["outcomes"] = self.session_counts
        return block

    @property
    def client_cap(self) -> dict[str, Any] | None:
        """The load generator's cap on outstanding requests and what it held back (a trace
        replayed with `max_in_flight`), or None without a cap."""
        cap = (self.scenario.get("trace") or {}).get("max_in_flight")
        if cap is None:
            return None
        delayed = self.client_delayed_requests
        return {
            "max_in_flight": cap,
            "requests_sent_late": delayed,
            "mean_client_wait_ms": round(self.client_wait_us / delayed / 1000, 3)
            if delayed
            else 0.0,
        }

    @property
    def latency_provenance(self) -> dict[str, Any]:
        """Which latency model produced these numbers, from which coefficients (and, when PD
        pools differ, per pool role; when named deployments differ from the scenario's
        top-level one, per deployment: model, role, GPU, layout, precision, efficiencies)."""
        resolved = self.scenario.get("resolved", {})
        out = dict(resolved.get("latency", {}))
        if "latency_by_role" in resolved:
            out["by_role"] = resolved["latency_by_role"]
        if "latency_by_deployment" in resolved:
            out["by_deployment"] = resolved["latency_by_deployment"]
        return out

    def write_trace(self, prefix: str | Path) -> tuple[Path, Path]:
        """Export the run as a TraceV2 pair (docs/behaviour.md §9.5): `prefix`.yaml and
        `prefix`.csv."""
        from ..workload.trace import write_trace

        resolved = self.scenario.get("resolved", {})
        engine = self.scenario.get("engine", {})
        server = {
            "type": "servesim",
            "model": resolved.get("model", ""),
            "tensor_parallel": resolved.get("tp", 0),
            "max_num_seqs": engine.get("max_num_running_reqs", 0),
            "block_size": engine.get("block_size_tokens", 0),
            "gpu_memory_utilization": engine.get("gpu_memory_utilization", 0.0),
            "max_model_len": resolved.get("max_model_len", 0),
        }
        return write_trace(prefix, self.request_records, server=server, keep_prefix_groups=True)

    def blis_request_records(self) -> list[dict[str, Any]]:
        """Per-request entries of BLIS's `--results-path` file (docs/behaviour.md §10.3), by
        arrival."""
        out = []
        for r in sorted(self.request_records, key=lambda x: (x.arrival_us, x.index)):
            done = r.state is RequestState.COMPLETED
            out.append(
                {
                    "requestID": r.request_id,
                    "arrived_at": r.arrival_us / 1e6,
                    "num_prefill_tokens": r.input_tokens,
                    "num_decode_tokens": r.output_tokens,
                    "ttft_ms": (r.first_token_us - r.arrival_us) / 1000
                    if r.first_token_us >= 0
                    else 0.0,
                    "itl_ms": mean_itl_ms(r) if done else 0.0,
                    "e2e_ms": (r.completion_us - r.arrival_us) / 1000 if done else 0.0,
                    "scheduling_delay_ms": (r.schedule_us - r.arrival_us) / 1000
                    if r.schedule_us >= 0
                    else 0.0,
                    "slo_class": r.slo_class,
                    "tenant_id": r.tenant_id,
                    "handled_by": r.instance_id,
                    "model": r.model,
                    "client_id": r.client_id,
                    "session_id": r.session_id,
                    "round_index": r.round_index,
                    "prefix_group": r.prefix_group,
                    "length_capped": r.length_capped,
                    "state": r.state.value,
                }
            )
        return out

    def results_document(self) -> dict[str, Any]:
        doc = dict(self.summary)
        if len(self.per_slo) > 1:
            doc["per_slo_class"] = self.per_slo
        if self.session_counts:
            doc["sessions"] = self.session_counts
        if self.session_metrics is not None:
            doc["session_metrics"] = self.session_metrics
        if self.client_cap is not None:
            doc["client"] = self.client_cap
        if self.slo:
            doc["slo"] = self.slo
        if self.steady_state is not None:
            doc["steady_state_detail"] = self.steady_state.document()
        if self.instance_summaries:
            doc["instances"] = self.instance_summaries
        doc["anomalies"] = self.anomalies
        doc["kv_cache"] = self.kv_metrics
        if self.fitness is not None:
            doc["fitness"] = {"score": self.fitness[0], "components": self.fitness[1]}
        if self.pd_metrics is not None:
            doc["pd"] = self.pd_metrics
        if self.speculative_metrics is not None:
            doc["speculative"] = self.speculative_metrics
        if self.adapter_metrics is not None:
            doc["adapters"] = self.adapter_metrics
        if self.multi_model:
            doc["per_model"] = self.per_model.to_dict(orient="records")
        if self.fleet_metrics is not None:
            doc["fleet"] = self.fleet_metrics
        if self.latency_provenance:
            doc["latency_model"] = self.latency_provenance
        doc["requests"] = self.blis_request_records()
        return doc
