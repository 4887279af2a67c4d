"""One run, whatever it came from: a live `Result`, a folder written by `Result.save`
(`SavedResult`) or a `--results-path` JSON document.

The three carry different amounts of detail. A live result has everything (every token gap,
PD sub-request timings, the decision trace); a saved one has the per-request and per-step
tables but not the token gaps or sub-request timings; a results document has per-request
latencies and the summary blocks but no step log. `RunSource` exposes what its source has and
None for what it lacks, so each report section can say precisely why it is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..engine.request import RequestState
from ..errors import ConfigError, shorten

COMPLETED = RequestState.COMPLETED.value
REJECTED = RequestState.REJECTED.value


@dataclass
class RequestColumns:
    """Every arrived request as aligned numpy columns. Timestamps are integer µs; a stage never
    reached is -1. `tpot_ms` is a request's own mean inter-token time (NaN below two tokens)."""

    arrival_us: np.ndarray
    first_token_us: np.ndarray
    completion_us: np.ndarray  # -1 unless the request completed
    generated_tokens: np.ndarray
    state: np.ndarray  # str
    instance_id: np.ndarray  # str
    slo_class: np.ndarray  # str ("" when untagged)
    tpot_ms: np.ndarray
    # Split into prefill and decode sub-requests (PD): its first token is a decode step's.
    disaggregated: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_us)

    @property
    def completed(self) -> np.ndarray:
        return self.state == COMPLETED


@dataclass
class RunSource:
    """What a report of one run can read. `kind` is live | saved | document."""

    kind: str
    summary: dict[str, Any]
    scenario: dict[str, Any]
    requests: RequestColumns
    steps: Any = None  # per-step DataFrame (steps_frame's columns) or None
    capacities: Any = None  # DataFrame instance_id, kv_blocks, max_num_running_reqs
    instances: Any = None  # DataFrame: one row per instance (Result.instances) or None
    instance_ids: list[str] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)
    itl_gaps: Any = None  # CountedValues of every inter-token gap (µs); live only
    slo: dict[str, Any] = field(default_factory=dict)
    steady: dict[str, Any] | None = None
    anomalies: dict[str, Any] = field(default_factory=dict)
    kv_metrics: dict[str, Any] = field(default_factory=dict)
    per_slo: dict[str, Any] = field(default_factory=dict)
    pd_metrics: dict[str, Any] | None = None
    pd_stages: dict[str, np.ndarray] | None = None  # live PD runs only
    transfers_us: np.ndarray | None = None  # KV transfer durations (PD)
    fleet_metrics: dict[str, Any] | None = None
    timeline: Any = None  # DataFrame of lifecycle transitions or None
    fleet_instances: Any = None
    per_model: Any = None
    decisions: Any = None  # DecisionTrace with records; live only
    latency: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return float(self.summary.get("vllm_estimated_duration_s") or 0.0)


# PD stage names in the order a disaggregated request passes through them.
PD_STAGES = ("prefill_wait", "prefill", "transfer", "decode_wait", "decode")


def of(result: Any) -> RunSource:
    """The `RunSource` of a live `Result`, a `SavedResult` or a results document (dict)."""
    if isinstance(result, RunSource):
        return result
    if isinstance(result, dict):
        return _from_document(result)
    if hasattr(result, "request_records"):
        return _from_live(result)
    if hasattr(result, "requests") and hasattr(result, "steps"):
        return _from_saved(result)
    raise ConfigError(
        f"report: cannot report a {type(result).__name__}; give a Result, a saved result "
        "(load_result), a SweepResult, a PlanResult or a results document"
    )


def _roles(scenario: dict[str, Any], ids: list[str]) -> dict[str, str]:
    roles = (scenario.get("resolved") or {}).get("roles") or []
    if len(roles) != len(ids) or set(roles) <= {"unified"}:
        return {}
    return dict(zip(ids, roles, strict=True))


def _tpot_ms(first: np.ndarray, last: np.ndarray, generated: np.ndarray) -> np.ndarray:
    """As `mean_itl_ms`: (last - first token) / (tokens - 1), NaN below two tokens."""
    out = np.full(len(first), np.nan)
    decoded = (generated > 1) & (first >= 0)
    out[decoded] = (last[decoded] - first[decoded]) / (generated[decoded] - 1) / 1000
    return out


def _from_live(result: Any) -> RunSource:
    from ..metrics.plots import instance_capacities
    from ..metrics.request_table import request_columns
    from ..metrics.summary import pooled_itl_us

    cols = request_columns(
        result.request_records,
        ("arrival_us", "first_token_us", "completion_us", "last_token_us", "generated_tokens"),
        ("state", "instance_id", "slo_class"),
    )
    state = np.array([getattr(s, "value", s) for s in cols["state"]], dtype=object)
    completed = state == COMPLETED
    arrival = cols["arrival_us"].astype(np.int64)
    first = cols["first_token_us"].astype(np.int64)
    generated = cols["generated_tokens"].astype(np.int64)
    tpot = _tpot_ms(first, cols["last_token_us"].astype(np.int64), generated)
    requests = RequestColumns(
        arrival_us=arrival,
        first_token_us=first,
        completion_us=np.where(completed, cols["completion_us"], -1).astype(np.int64),
        generated_tokens=generated,
        state=state,
        instance_id=np.array([s or "" for s in cols["instance_id"]], dtype=object),
        slo_class=np.array([s or "" for s in cols["slo_class"]], dtype=object),
        tpot_ms=np.where(completed, tpot, np.nan),
        disaggregated=np.array(
            [bool(getattr(r, "disaggregated", False)) for r in result.request_records],
            dtype=bool,  # also when no request arrived
        )
        if result.pd is not None
        else None,
    )
    ids = list(result.instance_ids)
    steady = result.steady_state.document() if result.steady_state is not None else None
    pd_stages = transfers = None
    if result.pd is not None:
        pd_stages = _pd_stages(result.pd.parents)
        transfers = result.transfers["duration_us"].to_numpy(dtype=np.int64)
    decisions = result.decisions if result.decisions is not None else None
    if decisions is not None and not decisions.enabled:
        decisions = None
    return RunSource(
        kind="live",
        summary=dict(result.summary),
        scenario=result.scenario or {},
        requests=requests,
        steps=result.steps,
        capacities=instance_capacities(result),
        instances=result.instances,
        instance_ids=ids,
        roles=_roles(result.scenario or {}, ids),
        itl_gaps=pooled_itl_us(result.instance_records),
        slo=dict(result.slo or {}),
        steady=steady,
        anomalies=dict(result.anomalies),
        kv_metrics=dict(result.kv_metrics),
        per_slo=dict(result.per_slo),
        pd_metrics=result.pd_metrics,
        pd_stages=pd_stages,
        transfers_us=transfers,
        fleet_metrics=result.fleet_metrics,
        timeline=result.timeline if result.infrastructure is not None else None,
        fleet_instances=result.fleet_instances if result.infrastructure is not None else None,
        per_model=result.per_model if result.multi_model else None,
        decisions=decisions,
        latency=dict(result.latency_provenance),
    )


def _pd_stages(parents: list[Any]) -> dict[str, np.ndarray]:
    """Per completed disaggregated request, µs spent in each stage (PD_STAGES), which add up
    to its E2E exactly: waiting for the prefill instance, prefilling, the KV transfer,
    waiting at the decode instance, decoding."""
    rows = []
    for p in parents:
        pre, dec = p.prefill_sub, p.decode_sub
        if (
            p.state is not RequestState.COMPLETED
            or pre is None
            or dec is None
            or p.transfer_end_us < 0
            or pre.first_schedule_us < 0
            or dec.first_schedule_us < 0
        ):
            continue
        rows.append(
            (
                pre.first_schedule_us - p.arrival_us,
                p.transfer_start_us - pre.first_schedule_us,
                p.transfer_end_us - p.transfer_start_us,
                dec.first_schedule_us - p.transfer_end_us,
                p.completion_us - dec.first_schedule_us,
                p.completion_us - p.arrival_us,
            )
        )
    table = np.array(rows, dtype=np.int64).reshape(-1, len(PD_STAGES) + 1)
    out = {name: table[:, i] for i, name in enumerate(PD_STAGES)}
    out["e2e"] = table[:, -1]
    return out


def _int_column(frame: Any, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), -1, dtype=np.int64)
    return frame[name].astype("Float64").fillna(-1).to_numpy(dtype=np.float64).astype(np.int64)


def _text_column(frame: Any, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), "", dtype=object)
    return np.array([v if isinstance(v, str) else "" for v in frame[name]], dtype=object)


def _from_saved(saved: Any) -> RunSource:
    from ..metrics.plots import instance_capacities

    frame = saved.requests
    state = _text_column(frame, "state")
    completed = state == COMPLETED
    generated = _int_column(frame, "generated_tokens")
    itl = (
        frame["itl_ms"].to_numpy(dtype=float)
        if "itl_ms" in frame.columns
        else np.full(len(frame), np.nan)
    )
    requests = RequestColumns(
        arrival_us=_int_column(frame, "arrival_us"),
        first_token_us=_int_column(frame, "first_token_us"),
        completion_us=np.where(completed, _int_column(frame, "completion_us"), -1),
        generated_tokens=generated,
        state=state,
        instance_id=_text_column(frame, "instance_id"),
        slo_class=_text_column(frame, "slo_class"),
        tpot_ms=np.where(completed & (generated > 1), itl, np.nan),
        disaggregated=frame["disaggregated"].fillna(False).to_numpy(dtype=bool)
        if "disaggregated" in frame.columns
        else None,
    )
    steps = saved.steps if len(saved.steps) else None
    ids = [str(i) for i in dict.fromkeys(saved.steps["instance_id"])] if steps is not None else []
    scenario = saved.scenario or {}
    summary = dict(saved.summary)
    transfers = saved.transfers
    return RunSource(
        kind="saved",
        summary=summary,
        scenario=scenario,
        requests=requests,
        steps=steps,
        capacities=instance_capacities(saved) if steps is not None else None,
        instances=saved.instances if len(saved.instances) else None,
        instance_ids=ids,
        roles=_roles(scenario, ids),
        slo=_saved_slo(saved, summary, scenario),
        # The verdict as the run had it, with its reasons and evidence (a run of no requests
        # has one too); recomputed from the table only for a folder saved before verdicts were.
        steady=saved.steady_state.document()
        if saved.steady_state is not None
        else _judge(requests),
        anomalies=dict(saved.anomalies or {}),
        kv_metrics=dict(saved.kv_metrics or {}),
        per_slo=dict(saved.per_slo or {}),
        pd_metrics=saved.pd_metrics,
        transfers_us=transfers["duration_us"].to_numpy(dtype=np.int64)
        if len(transfers) and "duration_us" in transfers.columns
        else None,
        fleet_metrics=saved.fleet_metrics,
        timeline=saved.timeline if len(saved.timeline) else None,
        fleet_instances=saved.fleet_instances if len(saved.fleet_instances) else None,
        per_model=saved.per_model if len(saved.per_model) > 1 else None,
        latency=dict((scenario.get("resolved") or {}).get("latency") or {}),
    )


def slo_problem(slo: dict[str, Any]) -> tuple[str, Any, str] | None:
    """The first entry of an SLO report (`Result.slo`, as a results file or a saved folder
    keeps it) that the Overview cannot draw, as (where, value, what is allowed); None when
    every entry it reads is of the kind the run wrote. An edited file otherwise failed deep
    inside the page's tables with a traceback."""

    def number(where: str, value: Any) -> tuple[str, Any, str] | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return where, value, "must be a number >= 0 or null"
        if not 0 <= value < math.inf:
            return where, value, "must be a number >= 0 or null"
        return None

    def targets(where: str, value: Any) -> tuple[str, Any, str] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            return where, value, "must be a mapping"
        # Every target is a latency in ms; "classes" is the scenario's own spec, not drawn.
        found = (number(f"{where}.{k}", v) for k, v in value.items() if k != "classes")
        return next((f for f in found if f is not None), None)

    checks = [targets("slo.targets", slo.get("targets"))]
    checks += [number(f"slo.{k}", slo.get(k)) for k in ("slo_attainment", "goodput_rps")]
    per_class = slo.get("per_class")
    if per_class is not None and not isinstance(per_class, dict):
        checks.append(("slo.per_class", per_class, "must be a mapping"))
    elif per_class:
        for name, block in per_class.items():
            where = f"slo.per_class.{name}"
            if not isinstance(block, dict):
                checks.append((where, block, "must be a mapping"))
                continue
            checks.append(targets(f"{where}.targets", block.get("targets")))
    return next((c for c in checks if c is not None), None)


def _saved_slo(saved: Any, summary: dict[str, Any], scenario: dict[str, Any]) -> dict[str, Any]:
    """The SLO report as the run had it (per-class attainment, met requests, each class's
    targets); only a folder saved before 2026-12-07 lacks it and gets what its summary keeps."""
    if not saved.slo:
        return _slo_from_summary(summary, scenario)
    problem = slo_problem(saved.slo)
    if problem is not None:
        where, value, allowed = problem
        file = str(saved.path / "summary.json") if saved.path is not None else "summary.json"
        raise ConfigError(
            f"report: {file!r}: {where}: invalid value {shorten(repr(value))}; {allowed} (as "
            "save_result writes it)"
        )
    return dict(saved.slo)


def _slo_from_summary(summary: dict[str, Any], scenario: dict[str, Any]) -> dict[str, Any]:
    """The attainment figures the summary keeps, with the scenario's targets."""
    spec = scenario.get("slo") or {}
    targets = {k: spec[k] for k in ("ttft_ms", "itl_ms", "e2e_ms") if spec.get(k) is not None}
    if spec.get("classes"):
        targets["classes"] = spec["classes"]
    out: dict[str, Any] = {"targets": targets}
    for key in ("offered_requests", "slo_attainment", "goodput_rps", "goodput_tokens_per_s"):
        if key in summary:
            out[key] = summary[key]
    return out


def _judge(requests: RequestColumns) -> dict[str, Any] | None:
    """The steady-state verdict recomputed from the per-request table (the saved summary
    keeps only the verdict's name)."""
    from ..metrics.steady import judge

    if not len(requests):
        return None
    states = {s.value: s for s in RequestState}
    records = [
        SimpleNamespace(
            arrival_us=int(a),
            first_token_us=int(f),
            completion_us=int(c),
            state=states.get(s, RequestState.CREATED),
        )
        for a, f, c, s in zip(
            requests.arrival_us,
            requests.first_token_us,
            requests.completion_us,
            requests.state,
            strict=True,
        )
    ]
    return judge(records).document()


def _from_document(doc: dict[str, Any]) -> RunSource:
    """A `--results-path` document: the summary fields at the top level, blocks beside them
    and `requests` in BLIS's per-request format (seconds and ms; 0 for a stage not reached)."""
    records = doc.get("requests") or []
    n = len(records)

    def column(name: str, default: Any = 0) -> list[Any]:
        return [r.get(name, default) for r in records]

    state = np.array([str(s) for s in column("state", COMPLETED)], dtype=object)
    completed = state == COMPLETED
    arrival = np.rint(np.array(column("arrived_at", 0.0), dtype=float) * 1e6).astype(np.int64)
    ttft_ms = np.array(column("ttft_ms", 0.0), dtype=float)
    e2e_ms = np.array(column("e2e_ms", 0.0), dtype=float)
    itl_ms = np.array(column("itl_ms", 0.0), dtype=float)
    # A first token is known for every completed request; for the others a TTFT of 0 means
    # the request never got one.
    has_first = completed | (ttft_ms > 0)
    first = np.where(has_first, arrival + np.rint(ttft_ms * 1000).astype(np.int64), -1)
    completion = np.where(completed, arrival + np.rint(e2e_ms * 1000).astype(np.int64), -1)
    generated = np.array(column("num_decode_tokens", 0), dtype=np.int64)
    requests = RequestColumns(
        arrival_us=arrival,
        first_token_us=first,
        completion_us=completion,
        generated_tokens=generated,
        state=state,
        instance_id=np.array([str(v or "") for v in column("handled_by", "")], dtype=object),
        slo_class=np.array([str(v or "") for v in column("slo_class", "")], dtype=object),
        tpot_ms=np.where(completed & (itl_ms > 0), itl_ms, np.nan) if n else np.zeros(0),
    )
    summary = {k: v for k, v in doc.items() if not isinstance(v, dict | list)}
    instances = doc.get("instances") or []
    ids = [str(s.get("instance_id")) for s in instances if isinstance(s, dict)]
    return RunSource(
        kind="document",
        summary=summary,
        scenario={},
        requests=requests,
        instance_ids=ids,
        slo=doc.get("slo") or _slo_from_summary(summary, {}),
        steady=doc.get("steady_state_detail") or (_judge(requests) if n else None),
        anomalies=doc.get("anomalies") or {},
        kv_metrics=doc.get("kv_cache") or {},
        per_slo=doc.get("per_slo_class") or {},
        pd_metrics=doc.get("pd"),
        fleet_metrics=doc.get("fleet"),
        latency=doc.get("latency_model") or {},
        instances=_instance_frame(
            instances, requests.instance_id, disaggregated=isinstance(doc.get("pd"), dict)
        )
        if instances
        else None,
        per_model=_per_model_frame(doc.get("per_model")),
    )


def _per_model_frame(records: Any) -> Any:
    """The document's `per_model` rows (a multi-model run's; the live and saved reports show
    the same table) as a DataFrame, or None when the run served one model."""
    import pandas as pd

    if not records:
        return None
    return pd.DataFrame(records)


def _instance_frame(
    instances: list[dict[str, Any]], handled_by: np.ndarray, disaggregated: bool
) -> Any:
    """One row per instance of a results document. `routed` is counted from the requests'
    `handled_by`: every request the router sent to an instance names it, completed or not (a
    rejected or never-routed one names none), which is the live run's own routed count. A
    disaggregated request names only the last of its two instances while the live count
    has it on both pools, so a PD document gets no `routed` column rather than a wrong one."""
    import pandas as pd

    ids, counts = np.unique(handled_by[handled_by != ""].astype(str), return_counts=True)
    routed = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    rows = []
    for s in instances:
        if not isinstance(s, dict):
            continue
        row: dict[str, Any] = {"instance_id": s.get("instance_id")}
        if not disaggregated:
            row["routed"] = routed.get(str(s.get("instance_id")), 0)
        row.update(
            completed=s.get("completed_requests"),
            output_tokens=s.get("total_output_tokens"),
            preemptions=s.get("preemption_count"),
        )
        rows.append(row)
    return pd.DataFrame(rows)
