"""What a run returns: its data (the summary, the request records, the instances' end-of-run
records, the PD flow's and the fleet's end-of-run records) and, as cached attributes, the
views built from them.

A view is computed by the module that owns its concept (metrics/summary.py, metrics/views/,
metrics/fleet.py, metrics/anomalies.py, metrics/fitness.py); `Result` only passes it the data.
Those modules never import this one, and neither do persistence, the plots or the report,
which read a result by attribute: every import from here points down (docs/architecture.md
"Layers").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.request import Request
from .anomalies import jain_fairness, tenant_tokens
from .fitness import evaluate_fitness, parse_fitness_weights
from .instance_record import InstanceRecord
from .summary import (
    BLIS_SUMMARY_FIELDS,
    SUMMARY_HEADER,
    CountedValues,
    compute_summary,
    format_summary,
    mean_itl_ms,
    per_class_metrics,
    pooled_itl_us,
)
from .views import frames as frame_views
from .views import instances as instance_views
from .views import sessions as session_views
from .views import text as text_views
from .views.frames import REQUEST_COLUMNS, TIMESTAMP_COLUMNS, requests_frame, steps_frame
from .views.text import (
    ADAPTER_HEADER,
    ANOMALY_HEADER,
    CLIENT_HEADER,
    FLEET_HEADER,
    KV_HEADER,
    LATENCY_HEADER,
    MODEL_HEADER,
    PD_HEADER,
    PER_SLO_HEADER,
    SESSION_HEADER,
    SLO_HEADER,
    SPECULATIVE_HEADER,
    STEADY_HEADER,
    TENANT_HEADER,
)

if TYPE_CHECKING:
    import pandas

    from .fleet_record import FleetRecord
    from .pd_record import PDRecord
    from .plots import PlotAccessor

# Names other modules and notebooks import from here; each is defined where its concept lives.
__all__ = [
    "ADAPTER_HEADER", "ANOMALY_HEADER", "BLIS_SUMMARY_FIELDS", "CLIENT_HEADER", "FLEET_HEADER",
    "KV_HEADER", "LATENCY_HEADER", "MODEL_HEADER", "PD_HEADER", "PER_SLO_HEADER",
    "REQUEST_COLUMNS", "SESSION_HEADER", "SLO_HEADER", "SPECULATIVE_HEADER", "STEADY_HEADER",
    "SUMMARY_HEADER", "TENANT_HEADER", "TIMESTAMP_COLUMNS", "CountedValues", "Result",
    "compute_summary", "format_summary", "mean_itl_ms", "per_class_metrics", "pooled_itl_us",
    "requests_frame", "steps_frame",
]  # fmt: skip


@dataclass
class Result:
    """Outcome of one run. `summary` is the BLIS-compatible dict; every other view (tables,
    metric dicts, the printed text) is built when first read by the module that owns it
    (metrics/views/, metrics/fleet.py, metrics/anomalies.py), and saving, plotting and the
    HTML report delegate to metrics/persistence.py, metrics/plots.py and report/."""

    summary: dict[str, Any]
    # Every request that arrived, in arrival order: a RequestRow (metrics/request_table.py)
    # per finished request of a compacting run, the Request object otherwise.
    request_records: Sequence[Request] = field(repr=False)
    # Per instance, what its engine left at the end of the run (metrics/instance_record.py):
    # counters, step log, feature statistics; never the live engine.
    instance_records: list[InstanceRecord] = field(repr=False)
    instance_ids: list[str] = field(repr=False)
    scenario: dict[str, Any] = field(default_factory=dict, repr=False)
    not_arrived: int = 0
    # SLO attainment and goodput (metrics/slo.py) and the steady-state verdict (metrics/steady.py).
    slo: dict[str, Any] = field(default_factory=dict)
    steady_state: Any = None
    # A trace's `max_in_flight` client cap: requests it sent late, and their total wait.
    client_delayed_requests: int = 0
    client_wait_us: int = 0
    # Due before the horizon, never sent: the client's slots were all taken when it came.
    client_unsent_requests: int = 0
    session_counts: dict[str, int] = field(default_factory=dict)
    horizon_us: int | None = None
    instance_summaries: list[dict[str, Any]] = field(default_factory=list, repr=False)
    admission_rejections: int = 0
    routing_rejections: int = 0
    routed: list[int] = field(default_factory=list, repr=False)
    in_flight_at_end: list[int] = field(default_factory=list, repr=False)
    decisions: Any = field(default=None, repr=False)
    # A PD run's flow at its end (metrics/pd_record.py): parents, the link's transfers, pools.
    pd: PDRecord | None = field(default=None, repr=False)
    instance_roles: list[str] = field(default_factory=list, repr=False)
    # A changing fleet at its end (metrics/fleet_record.py): timeline, nodes, instance slots.
    infrastructure: FleetRecord | None = field(default=None, repr=False)
    instance_models: list[str] = field(default_factory=list, repr=False)
    parked_at_end: int = 0
    fleet: Any = field(default=None, repr=False)
    # The scenario file the run was read from (None for a dict or Scenario): an input, as the
    # files the scenario names are, that no output of this result may be written over.
    scenario_file: str | None = field(default=None, repr=False)

    @property
    def engines(self) -> list[InstanceRecord]:
        """Per instance, its engine's end-of-run record (read-only; the same attribute names
        as the engine: `steps`, `kv.total_blocks`, `irregular_itl_us`, ...). The live engines
        are not kept once the run ends."""
        return self.instance_records

    @cached_property
    def requests(self) -> pandas.DataFrame:
        return requests_frame(self.request_records)

    @cached_property
    def steps(self) -> pandas.DataFrame:
        return steps_frame(self.instance_records, self.instance_ids)

    def summary_text(self) -> str:
        return format_summary(self.summary)

    @property
    def plot(self) -> PlotAccessor:
        """Figures of this run: `result.plot.latency_cdfs()`, `.instance_timelines()`, ..."""
        # Saving, plotting, the report and the fleet tables load pandas or matplotlib: they are
        # imported when used, so a run that only prints its text never loads either.
        from .plots import PlotAccessor

        return PlotAccessor(self)

    def save(self, directory: str | Path) -> Path:
        """Write Parquet tables and summary.json; read back with `simulator.load_result`."""
        from .persistence import save_result

        return save_result(self, directory)

    def report(self, path: str | Path) -> Path:
        """Write this run's HTML report, one self-contained page (docs/report.md)."""
        from ..atomic_io import require_output_path
        from ..input_files import refuse_writing_inputs
        from ..report import write_report

        require_output_path("report: path", path)  # a ConfigError for 5, None or ""
        refuse_writing_inputs([("report", path)], self.input_files())
        return write_report(self, path)

    def input_files(self) -> list[tuple[str, Any]]:
        """The files the run read, as (what, path; None for one it did not have): the scenario
        file and those it names (workload spec, trace, coefficients, hardware)."""
        from ..input_files import scenario_input_files

        return scenario_input_files(self.scenario, self.scenario_file)

    @property
    def run_end_us(self) -> int:
        return round(self.summary["vllm_estimated_duration_s"] * 1e6)

    @property
    def duration_s(self) -> float:
        return self.summary["vllm_estimated_duration_s"]

    @cached_property
    def timeline(self) -> pandas.DataFrame:
        """Lifecycle transitions of nodes and instances: time, id, from, to, reason."""
        from .fleet import timeline_frame

        return timeline_frame(self.infrastructure)

    @cached_property
    def fleet_instances(self) -> pandas.DataFrame:
        """Per instance the fleet created: node, GPUs, uptime, GPU-seconds and cost."""
        from .fleet import uptime_frame

        return uptime_frame(self.infrastructure, self.run_end_us)

    @cached_property
    def nodes(self) -> pandas.DataFrame:
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
    def per_model(self) -> pandas.DataFrame:
        """TTFT / E2E / ITL, throughput and counts per served model (docs/behaviour.md §A6)."""
        from .fleet import per_model_frame

        aliases = {}
        if self.fleet is not None:
            for key, names in self.fleet.model_aliases.items():
                aliases[key] = key
                aliases.update({n.lower(): key for n in names})
        models = self.instance_models or [""] * len(self.instance_records)
        # Untagged requests go to the first deployment's model (the aliases are in deployment
        # order), which need not be the first instance's when that deployment starts empty.
        untagged = models[0] if models else ""
        if self.fleet is not None and self.fleet.model_aliases:
            untagged = next(iter(self.fleet.model_aliases))
        return per_model_frame(
            self.request_records,
            self.instance_records,
            models,
            aliases,
            untagged,
            self.duration_s,
        )

    @property
    def multi_model(self) -> bool:
        return len(set(self.instance_models)) > 1

    @cached_property
    def per_slo(self) -> dict[str, dict[str, Any]]:
        """TTFT / E2E per SLO class ("default" when untagged), docs/behaviour.md §10.4, in ms."""
        return per_class_metrics(self.request_records, "slo_class")

    @cached_property
    def instances(self) -> pandas.DataFrame:
        """One row per instance the run created (a changing fleet's never-created slots
        left out): routed, completed, tokens, batch size, KV use, cache hits."""
        return instance_views.instances_frame(
            self.instance_records, self.instance_ids, self.routed, self.infrastructure
        )

    @cached_property
    def transfers(self) -> pandas.DataFrame:
        """One row per KV transfer (PD): request, instances, bytes and timing (µs)."""
        from .views import pd as pd_views

        return pd_views.transfers_frame(self.pd, self.instance_ids)

    @cached_property
    def pd_metrics(self) -> dict[str, Any] | None:
        """BLIS's `=== PD Metrics ===` (docs/behaviour.md §7.4) plus link concurrency."""
        if self.pd is None:
            return None
        from .views import pd as pd_views

        return pd_views.pd_metrics(self.pd, self.summary)

    @cached_property
    def adapter_metrics(self) -> dict[str, dict[str, Any]] | None:
        """Per LoRA adapter over every instance (docs/lora.md), None without LoRA."""
        return instance_views.adapter_metrics(
            self.instance_records, self.duration_s, self.request_records
        )

    @cached_property
    def speculative_metrics(self) -> dict[str, Any] | None:
        """Speculative decoding over the run (docs/speculative.md), None when it was off."""
        return instance_views.speculative_metrics(self.instance_records, self.summary)

    @cached_property
    def anomalies(self) -> dict[str, int]:
        """BLIS's anomaly counters (docs/behaviour.md §10.4), plus routing rejections."""
        return instance_views.anomaly_counters(
            self.summary,
            self.request_records,
            self.instance_records,
            self.instance_ids,
            self.scenario.get("engine", {}).get("priority_policy", "constant"),
            self.admission_rejections,
            self.routing_rejections,
            self.infrastructure,
        )

    @cached_property
    def kv_metrics(self) -> dict[str, float]:
        return instance_views.kv_metrics(self.summary, self.instance_records, self.infrastructure)

    @cached_property
    def per_tenant(self) -> dict[str, Any]:
        """Output tokens served per tenant and Jain's fairness index over them."""
        tokens = tenant_tokens(self.request_records)
        return {"tokens": tokens, "jain_fairness": jain_fairness(list(tokens.values()))}

    @cached_property
    def fitness(self) -> tuple[float, dict[str, float]] | None:
        weights = self.scenario.get("cluster", {}).get("fitness_weights")
        if not weights:
            return None
        return evaluate_fitness(self.summary, parse_fitness_weights(weights))

    def report_text(self) -> str:
        """Everything the CLI prints, in BLIS's order (docs/behaviour.md §10.1)."""
        return text_views.report_text(self)

    @cached_property
    def session_metrics(self) -> dict[str, Any] | None:
        """BLIS-current's session statistics (docs/results.md "Sessions"), or None when no
        request belongs to a session (metrics/views/sessions.py)."""
        return session_views.session_metrics(self.request_records)

    @property
    def session_block(self) -> dict[str, Any] | None:
        """What `=== Session Metrics ===` prints: the statistics, then how the sessions ended
        (`session_counts`, when the run tracked them)."""
        return session_views.session_block(self.session_metrics, self.session_counts)

    @property
    def client_cap(self) -> dict[str, Any] | None:
        """The load generator's cap on outstanding requests and what it held back (a trace
        replayed with `max_in_flight`), or None without a cap."""
        return session_views.client_cap(
            self.scenario,
            self.client_delayed_requests,
            self.client_wait_us,
            self.client_unsent_requests,
        )

    @property
    def latency_provenance(self) -> dict[str, Any]:
        """Which latency model produced these numbers, from which coefficients."""
        return text_views.latency_provenance(self.scenario)

    def write_trace(self, prefix: str | Path) -> tuple[Path, Path]:
        """Export the run as a trace pair (docs/behaviour.md §9.5), version 3 so that a
        replay shares the same prefixes: `prefix`.yaml and `prefix`.csv. What a replay of it
        needs besides (the settings BLIS's header has no keys for):
        `simulator.trace_export.export`, which also says so."""
        from ..errors import require_path
        from ..input_files import refuse_writing_inputs
        from ..workload.trace import check_trace_prefix, write_trace

        require_path("prefix", prefix)
        check_trace_prefix(prefix)
        refuse_writing_inputs(
            [
                (f"trace {kind}", f"{prefix}.{ext}")
                for kind, ext in (("header", "yaml"), ("data", "csv"))
            ],
            self.input_files(),
        )
        resolved = self.scenario.get("resolved", {})
        engine = self.scenario.get("engine", {})
        server = {
            "type": "servesim",
            "model": resolved.get("model", ""),
            "tensor_parallel": resolved.get("tp", 0),
            "max_num_seqs": text_views.batch_limit(self.scenario, "max_num_running_reqs") or 0,
            "block_size": engine.get("block_size_tokens", 0),
            "gpu_memory_utilization": engine.get("gpu_memory_utilization", 0.0),
            "max_model_len": resolved.get("max_model_len", 0),
        }
        trace = self.scenario.get("trace")
        row_ids = None
        if trace is not None and trace.get("session_mode") == "closed-loop":
            from ..workload.trace import read_rows, session_row_ids

            row_ids = session_row_ids(read_rows(trace["data"]))
        return write_trace(
            prefix,
            self.request_records,
            server=server,
            keep_prefix_groups=True,
            # A replay's export keeps the replayed rows' request_ids: `calibrate --sim-trace`
            # joins it with the real trace by them.
            keep_request_ids=trace is not None,
            session_row_ids=row_ids,
        )

    def blis_request_records(self) -> list[dict[str, Any]]:
        """Per-request entries of BLIS's `--results-path` file (docs/behaviour.md §10.3), by
        arrival."""
        return frame_views.blis_request_records(self.request_records)

    def results_document(self) -> dict[str, Any]:
        """What `--results-path` writes (metrics/views/text.py)."""
        return text_views.results_document(self)
