"""Fit the `physics` step-time model's efficiencies and overheads to measured runs.

A *case* is one measured run: requests to replay (ground-truth CSV or a real TraceV2 pair),
the deployment to replay them on, and the measured TTFT / E2E of the successful requests.

Objective. For every case the per-run figures TTFT mean, TTFT p99, E2E mean and ITL
(= (E2E mean − TTFT mean) / (mean output tokens − 1), as in simulator/validate.py) are
predicted, and the residual is the log ratio predicted / measured, weighted by
`METRIC_WEIGHTS`. A log-normal prior pulls each coefficient's log towards its physical
default with a width that says how well the physics knows it (`PRIOR_SIGMA`): it keeps what
the data cannot separate (e.g. per-step versus per-layer overhead with only three models, or
the KV-read efficiency when no training model reads much KV) near physically sensible values.
`output_lag_steps` is not fitted (vLLM's async scheduler runs exactly one step ahead).
Coefficients are
optimised in log space (positive by construction, efficiencies ≤ 1) by scipy's trust-region
least squares with a soft-L1 loss, so one badly fitting run cannot dominate.

Why it is cheap. Replaying a run takes seconds, far too long for an optimiser that needs
hundreds of evaluations. But `physics` prices a step from terms that do not depend on the
coefficients (`PhysicsTerms`). So each case is replayed once with the current coefficients,
recording every step's terms and each request's place in the step sequence; the optimiser
then re-prices all steps for trial coefficients with numpy and rebuilds each request's TTFT
and E2E as the sum of the steps it waited through and took part in — exact as long as the
schedule (which requests share which step) stays the same. The schedule does shift a little
when step times change, so the fit alternates: replay with the new coefficients, re-record,
re-fit (`rounds`), and the reported figures come from a final full replay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .engine.request import RequestState
from .errors import ConfigError, invalid
from .latency.physics import (
    PhysicsCoefficients,
    PhysicsModel,
    PhysicsTerms,
    RecordingStepModel,
    coefficients_document,
    price_terms,
    request_delay_s,
)

# Coefficients the fit moves (all of PhysicsCoefficients but the two below).
FITTED = (
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "prefill_compute_efficiency",
    "decode_compute_efficiency",
    "interconnect_efficiency",
    "gemm_fixed_rows",
    "allreduce_latency_us",
    "per_layer_overhead_us",
    "per_step_overhead_us",
    "per_sequence_overhead_us",
    "request_overhead_us",
)
# Not fitted: `single_process_overhead_us` stays at 0 (see PhysicsCoefficients), and
# `output_lag_steps` stays at 1, the one step vLLM V1's async scheduler runs
# ahead (see PhysicsCoefficients); fitting it as well left the folds disagreeing on how TTFT
# splits between it and `request_overhead_us`.
FIT_METRICS = ("e2e_mean_ms", "itl_ms", "ttft_mean_ms", "ttft_p99_ms")
# The tail is noisier than the means (one burst moves it), so it counts half.
METRIC_WEIGHTS = {"e2e_mean_ms": 1.0, "itl_ms": 1.0, "ttft_mean_ms": 1.0, "ttft_p99_ms": 0.5}
# The prior: each coefficient's log is pulled towards its physical default with weight
# PRIOR_DATA_SCALE / sigma, where sigma is how far (in log units) the physics allows it to be
# off. That is the MAP estimate with a log-normal prior of width sigma when a run's residuals
# have scale PRIOR_DATA_SCALE (the soft-L1 scale: the size of error the model form leaves).
PRIOR_DATA_SCALE = 0.1
PRIOR_SIGMA = {
    # Streaming HBM efficiency is well measured on H100 (STREAM-like copies ~0.8-0.9).
    "bandwidth_efficiency": 0.15,
    # Paged-attention KV reads: 0.4-0.9 in published kernel benchmarks, less certain.
    "kv_bandwidth_efficiency": 0.3,
    # GEMM efficiencies depend on shapes: 0.3-0.8 of peak.
    "prefill_compute_efficiency": 0.3,
    "decode_compute_efficiency": 0.3,
    "interconnect_efficiency": 0.3,
    "gemm_fixed_rows": 0.5,
    # Latencies and CPU overheads vary with vLLM version and deployment: a factor of ~e.
    "allreduce_latency_us": 1.0,
    "per_layer_overhead_us": 1.0,
    "per_step_overhead_us": 1.0,
    "per_sequence_overhead_us": 1.0,
    "request_overhead_us": 1.0,
}
PRIOR_WEIGHTS = np.asarray([PRIOR_DATA_SCALE / PRIOR_SIGMA[name] for name in FITTED])
# Residuals (log ratios) beyond ~10% count linearly, not quadratically (soft-L1 loss).
SOFT_L1_SCALE = 0.1
# Overheads are fitted in log space, so they need a positive floor (µs).
OVERHEAD_FLOOR_US = 0.1
DEFAULT_ROUNDS = 3


@dataclass
class Case:
    """One measured run to fit on or score: what to replay and what was measured."""

    name: str
    model: str  # grouping key for leave-one-model-out
    trace_header: Path | None
    trace_data: Path
    scenario: Any  # a Scenario (or None) the overrides apply to
    overrides: dict[str, Any]
    # Record positions (request index) of the scored requests and their measured figures.
    positions: np.ndarray
    measured_ttft_ms: np.ndarray
    measured_e2e_ms: np.ndarray
    output_tokens: np.ndarray
    measured: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.measured:
            self.measured = per_run_figures(
                self.measured_ttft_ms, self.measured_e2e_ms, self.output_tokens
            )


def per_run_figures(ttft_ms: np.ndarray, e2e_ms: np.ndarray, output_tokens: np.ndarray) -> dict:
    """TTFT mean/p99, E2E mean and ITL of one run (numpy linear percentiles)."""
    if ttft_ms.size == 0:
        return dict.fromkeys(FIT_METRICS, math.nan)
    ttft_mean, e2e_mean = float(ttft_ms.mean()), float(e2e_ms.mean())
    mean_out = float(output_tokens.mean())
    return {
        "e2e_mean_ms": e2e_mean,
        "itl_ms": (e2e_mean - ttft_mean) / (mean_out - 1) if mean_out > 1 else math.nan,
        "ttft_mean_ms": ttft_mean,
        "ttft_p99_ms": float(np.percentile(ttft_ms, 99)),
    }


# ------------------------------------------------------------------------------ building cases


def groundtruth_case(run: Any, prompt_reuse: bool = False, workdir: Path | None = None) -> Case:
    """A case from a ground-truth run (simulator.validate.RunSpec), replayed as validate does;
    with `prompt_reuse`, as `validate --prompt-reuse` does (the load generator's few distinct
    prompts shared, prefix caching on; the replay trace is written under `workdir`)."""
    from .validate import baseline_trace, replay_overrides, reuse_trace
    from .workload.trace import read_groundtruth_rows

    rows = read_groundtruth_rows(run.requests_csv)
    ok = [i for i, r in enumerate(rows) if not r.has_error and r.ttft_s is not None and r.e2e_s]
    if not ok:
        raise ConfigError(f"calibrate: {str(run.requests_csv)!r} has no successful request")
    overrides = replay_overrides(run, PhysicsModel.name)
    if prompt_reuse:
        header, data = reuse_trace(run, workdir)
        overrides["engine__enable_prefix_caching"] = True
    else:
        header, data = baseline_trace(run, workdir)
    return Case(
        trace_header=header,
        trace_data=data,
        name=run.name,
        model=run.model,
        scenario=None,
        overrides=overrides,
        positions=np.asarray(ok),
        measured_ttft_ms=np.asarray([rows[i].ttft_s * 1e3 for i in ok]),
        measured_e2e_ms=np.asarray([rows[i].e2e_s * 1e3 for i in ok]),
        output_tokens=np.asarray([max(1, rows[i].output_tokens) for i in ok], dtype=float),
    )


# TraceV2 header `server` key -> replay override, so a recorded trace carries its deployment.
HEADER_SERVER_FIELDS = {
    "model": "model",
    "tensor_parallel": "tp",
    "max_num_seqs": "engine__max_num_running_reqs",
    "block_size": "engine__block_size_tokens",
    "max_model_len": "engine__max_model_len",
}


def trace_case(
    trace_header: Path, trace_data: Path, scenario: Any = None, **overrides: Any
) -> Case:
    """A case from a real TraceV2 pair (as `servesim observe` records): TTFT = first chunk −
    send, E2E = last chunk − send over the `ok` rows after the header's warm-up requests.
    Deployment: `overrides` (dotted with `__`) win, then the header's `server` section, then
    `scenario`'s own fields."""
    from .workload.trace import read_header, read_rows

    header = read_header(trace_header)
    server = header.get("server") or {}
    from_header = {
        key: server[name]
        for name, key in HEADER_SERVER_FIELDS.items()
        if server.get(name) not in (None, "", 0)
    }
    overrides = from_header | {k: v for k, v in overrides.items() if v is not None}
    rows = read_rows(trace_data)
    warm_up = int(header.get("warm_up_requests") or 0)
    ok = [
        i
        for i, r in enumerate(rows)
        if i >= warm_up and r.status == "ok" and r.first_chunk_time_us > 0 and r.last_chunk_time_us
    ]
    if not ok:
        raise ConfigError(
            f"calibrate: {str(trace_data)!r} has no successful request after the "
            f"{warm_up} warm-up requests"
        )

    def sent_us(r: Any) -> int:
        return r.send_time_us or r.arrival_time_us

    from .api import as_scenario

    sc = as_scenario(scenario) if scenario is not None else None
    model = overrides.get("model") or (sc.model if sc is not None else "")
    return Case(
        name=Path(trace_data).stem,
        model=str(model),
        trace_header=Path(trace_header),
        trace_data=Path(trace_data),
        scenario=sc,
        overrides={"latency__model": PhysicsModel.name, **overrides},
        positions=np.asarray(ok),
        measured_ttft_ms=np.asarray(
            [(rows[i].first_chunk_time_us - sent_us(rows[i])) / 1e3 for i in ok]
        ),
        measured_e2e_ms=np.asarray(
            [(rows[i].last_chunk_time_us - sent_us(rows[i])) / 1e3 for i in ok]
        ),
        output_tokens=np.asarray([max(1, rows[i].output_tokens) for i in ok], dtype=float),
    )


# ------------------------------------------------------------------------- replay and record


@dataclass
class Recording:
    """One replay of a case: every step's terms and timing, and the scored requests' times."""

    case: Case
    coefficients: PhysicsCoefficients
    terms: np.ndarray  # (steps, len(PhysicsTerms._fields)), PhysicsTerms columns
    start_us: np.ndarray
    end_us: np.ndarray
    # Per scored request: index of the step running when it reached the engine (-1 if none),
    # the fraction of that step still to go, and the steps that ended its TTFT and E2E.
    wait_step: np.ndarray
    wait_fraction: np.ndarray
    first_token_step: np.ndarray
    completion_step: np.ndarray
    completed: np.ndarray  # bool per scored request
    # Per scored request: the step in flight when it reached the engine (after the client
    # path), whose duration its scheduling lag is; -1 if the instance was idle.
    lag_step: np.ndarray
    predicted: dict[str, float]  # figures of this very replay


def replay_case(
    case: Case, coefficients: PhysicsCoefficients, recorders: list | None = None
) -> Any:
    """Replay `case` on physics with `coefficients`; the Result. With `recorders`, the step
    model records every step's terms and is appended there."""
    from .api import replay

    def swap(deployment: Any) -> None:
        model = PhysicsModel(deployment.model, deployment.gpu, deployment.tp, coefficients)
        if recorders is not None:
            model = RecordingStepModel(model)
            recorders.append(model)
        deployment.step_model = model

    return replay(
        case.trace_header, case.trace_data, case.scenario, on_deployment=swap, **case.overrides
    )


def record(case: Case, coefficients: PhysicsCoefficients) -> Recording:
    """Replay `case` with `coefficients`, keeping what `reprice` needs."""
    recorders: list[RecordingStepModel] = []
    result = replay_case(case, coefficients, recorders)
    steps = result.steps
    if len(recorders) != 1 or len(result.engines) != 1:
        raise invalid("calibrate: instances", len(result.engines), "calibration replays one")
    terms = np.asarray(recorders[0].terms, dtype=float).reshape(-1, len(PhysicsTerms._fields))
    start = steps["start_us"].to_numpy()
    end = start + steps["step_us"].to_numpy()
    if len(terms) != len(start):
        raise RuntimeError(f"recorded {len(terms)} step terms for {len(start)} steps")
    by_index = {r.index: r for r in result.request_records}
    reqs = [by_index.get(int(i)) for i in case.positions]
    completed = np.asarray(
        [r is not None and r.state is RequestState.COMPLETED for r in reqs], dtype=bool
    )

    def times(attr: str) -> np.ndarray:
        return np.asarray([getattr(r, attr) if r is not None else -1 for r in reqs], dtype=float)

    enqueue = times("enqueue_us")
    arrivals = times("arrival_us")
    # When each request reached the engine: arrival + the client path (whole µs, as charged).
    reached = arrivals + recorders[0].inner.queueing_time_us(0)
    # A step starting at that very µs started after it (the request joined it): not in flight.
    lag_step = np.searchsorted(start, reached, side="left") - 1
    lag_index = np.clip(lag_step, 0, max(len(start) - 1, 0))
    in_flight = (lag_step >= 0) & (end[lag_index] > reached)
    first_token, completion = times("first_token_us"), times("completion_us")
    wait_step = np.searchsorted(start, enqueue, side="right") - 1
    safe = np.clip(wait_step, 0, max(len(start) - 1, 0))
    durations = np.maximum(end - start, 1)
    fraction = np.where(
        wait_step >= 0, np.clip((end[safe] - enqueue) / durations[safe], 0.0, 1.0), 0.0
    )
    recording = Recording(
        case=case,
        coefficients=coefficients,
        terms=terms,
        start_us=start,
        end_us=end,
        wait_step=safe,
        wait_fraction=np.where(wait_step >= 0, fraction, 0.0),
        first_token_step=np.searchsorted(end, first_token, side="left"),
        completion_step=np.searchsorted(end, completion, side="left"),
        completed=completed,
        lag_step=np.where(in_flight, lag_index, -1),
        predicted={},
    )
    done = completed
    recording.predicted = per_run_figures(
        (first_token[done] - arrivals[done]) / 1e3,
        (completion[done] - arrivals[done]) / 1e3,
        case.output_tokens[done],
    )
    return recording


def reprice(rec: Recording, c: PhysicsCoefficients) -> dict[str, float]:
    """Per-run figures for coefficients `c` on the recorded schedule (see module docstring)."""
    t = rec.terms
    step_s = price_terms(tuple(t.T), c, np.maximum)
    # Empty steps (nothing scheduled) cost the engine 1 µs whatever the coefficients.
    step_s = np.where(t[:, 6] > 0, step_s, 1e-6)
    elapsed = np.concatenate(([0.0], np.cumsum(step_s)))
    done = rec.completed
    waited = rec.wait_fraction[done] * step_s[rec.wait_step[done]]
    first = rec.wait_step[done] + 1
    lag = rec.lag_step[done]
    queue_s = request_delay_s(c) + c.output_lag_steps * np.where(
        lag >= 0, step_s[np.maximum(lag, 0)], 0.0
    )
    ttft_s = queue_s + waited + elapsed[rec.first_token_step[done] + 1] - elapsed[first]
    e2e_s = queue_s + waited + elapsed[rec.completion_step[done] + 1] - elapsed[first]
    return per_run_figures(ttft_s * 1e3, e2e_s * 1e3, rec.case.output_tokens[done])


# ------------------------------------------------------------------------------------- fitting


def _to_vector(c: PhysicsCoefficients) -> np.ndarray:
    return np.log([max(getattr(c, n), OVERHEAD_FLOOR_US) for n in FITTED])


def _from_vector(x: np.ndarray, base: PhysicsCoefficients) -> PhysicsCoefficients:
    return replace(base, **{n: float(math.exp(v)) for n, v in zip(FITTED, x, strict=True)})


def _bounds() -> tuple[list[float], list[float]]:
    lower, upper = [], []
    for name in FITTED:
        if name.endswith("efficiency"):
            lower.append(math.log(0.05))
            upper.append(0.0)
        else:
            lower.append(math.log(OVERHEAD_FLOOR_US))
            upper.append(math.log(1e5))
    return lower, upper


def residuals(
    recordings: Sequence[Recording], c: PhysicsCoefficients, prior: PhysicsCoefficients
) -> np.ndarray:
    """Weighted log(predicted / measured) per case and metric, then the prior terms."""
    out = []
    for rec in recordings:
        predicted = reprice(rec, c)
        for metric in FIT_METRICS:
            meas, pred = rec.case.measured[metric], predicted[metric]
            if math.isfinite(meas) and meas > 0:
                ratio = pred / meas if math.isfinite(pred) and pred > 0 else 1e-3
                out.append(METRIC_WEIGHTS[metric] * math.log(ratio))
    out.extend(PRIOR_WEIGHTS * (_to_vector(c) - _to_vector(prior)))
    return np.asarray(out)


def fit_recorded(
    recordings: Sequence[Recording], start: PhysicsCoefficients, prior: PhysicsCoefficients
) -> PhysicsCoefficients:
    """One least-squares fit on fixed recordings."""
    from scipy.optimize import least_squares

    lower, upper = _bounds()
    x0 = np.clip(_to_vector(start), lower, upper)
    solution = least_squares(
        lambda x: residuals(recordings, _from_vector(x, start), prior),
        x0,
        bounds=(lower, upper),
        loss="soft_l1",
        f_scale=SOFT_L1_SCALE,
        x_scale=1.0,
        diff_step=1e-3,
        max_nfev=100,
    )
    return _from_vector(solution.x, start)


@dataclass
class FitResult:
    coefficients: PhysicsCoefficients
    cases: list[str]
    rounds: int
    # Per case: measured and predicted figures of the final full replay.
    scores: dict[str, dict[str, dict[str, float]]]

    def document(self, **about: Any) -> dict[str, Any]:
        """The coefficients YAML (load with --latency-coeffs), with the fit's provenance."""
        return coefficients_document(
            self.coefficients,
            fit={
                "objective": "soft-L1 least squares of weighted log(predicted/measured) of "
                + ", ".join(f"{m} (x{METRIC_WEIGHTS[m]:g})" for m in FIT_METRICS)
                + " per run, plus a log-normal prior towards the physical defaults (width "
                + ", ".join(f"{n} {PRIOR_SIGMA[n]:g}" for n in FITTED)
                + f"; residual scale {PRIOR_DATA_SCALE:g})",
                "rounds": self.rounds,
                "runs": list(self.cases),
                "in_sample_errors": {
                    name: {m: float(s["predicted"][m] / s["measured"][m] - 1) for m in FIT_METRICS}
                    for name, s in self.scores.items()
                },
            },
            **about,
        )


def record_all(
    cases: Sequence[Case], coefficients: PhysicsCoefficients, workers: int = 1
) -> list[Recording]:
    """`record` every case, in `workers` processes when more than one."""
    if workers <= 1 or len(cases) <= 1:
        return [record(case, coefficients) for case in cases]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(record, cases, [coefficients] * len(cases)))


def fit(
    cases: Sequence[Case],
    start: PhysicsCoefficients | None = None,
    rounds: int = DEFAULT_ROUNDS,
    on_round: Callable[[int, PhysicsCoefficients], None] | None = None,
    workers: int = 1,
) -> FitResult:
    """Alternate replay-and-record with a least-squares fit `rounds` times; score the result
    with one more replay of every case."""
    if not cases:
        raise ConfigError("calibrate: nothing to fit on (no runs selected)")
    if rounds < 1:
        raise invalid("calibrate: rounds", rounds, "must be >= 1")
    prior = PhysicsCoefficients()
    c = start or prior
    # The fixed-schedule fit cannot see a queue build up, so a round can overshoot into
    # overload; every round's coefficients are scored by full replays and the best one kept.
    best: tuple[float, PhysicsCoefficients, list[Recording]] | None = None
    for round_index in range(rounds + 1):
        recordings = record_all(cases, c, workers)
        replayed_cost = _replayed_cost(recordings)
        if best is None or replayed_cost < best[0]:
            best = (replayed_cost, c, recordings)
        if round_index == rounds:
            break
        c = fit_recorded(recordings, c, prior)
        if on_round is not None:
            on_round(round_index + 1, c)
    _, c, final = best
    scores = {
        rec.case.name: {"measured": rec.case.measured, "predicted": rec.predicted} for rec in final
    }
    return FitResult(c, [case.name for case in cases], rounds, scores)


def _replayed_cost(recordings: Sequence[Recording]) -> float:
    """The fit's soft-L1 cost (without the prior) on the figures of actual replays."""
    total = 0.0
    for rec in recordings:
        for metric in FIT_METRICS:
            meas, pred = rec.case.measured[metric], rec.predicted[metric]
            if math.isfinite(meas) and meas > 0:
                r = METRIC_WEIGHTS[metric] * math.log(pred / meas if pred > 0 else 1e-3)
                total += 2 * ((1 + (r / SOFT_L1_SCALE) ** 2) ** 0.5 - 1)
    return total


def write_coefficients(path: Path, document: dict[str, Any]) -> None:
    import yaml

    from .atomic_io import write_text_atomically

    write_text_atomically(path, yaml.safe_dump(document, sort_keys=False))


def coefficients_dict(c: PhysicsCoefficients) -> dict[str, float]:
    return {k: float(v) for k, v in asdict(c).items()}


__all__ = [
    "Case",
    "FitResult",
    "fit",
    "groundtruth_case",
    "record",
    "replay_case",
    "reprice",
    "trace_case",
]
