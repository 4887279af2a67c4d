"""Fit the `physics` step-time model's efficiencies and overheads to measured runs.

A *case* is one measured run: requests to replay (ground-truth CSV or a real TraceV2 pair),
the deployment to replay them on, and the measured TTFT / E2E of the successful requests.

Objective. For every case the per-run figures TTFT mean, TTFT p99, E2E mean and ITL
(= (E2E mean − TTFT mean) / (mean output tokens − 1), as in simulator/validate.py) are
predicted, and the residual is the log ratio predicted / measured, weighted by
`METRIC_WEIGHTS`. A log-normal prior pulls each coefficient's log towards its value at the
start (by default; its physical default with `prior="physical"`) with a width that says how
well the physics knows it (`PRIOR_SIGMA`): it keeps what the data cannot separate (e.g.
per-step versus per-layer overhead with only three models, or the KV-read efficiency when no
training model reads much KV) where earlier knowledge put it.
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
schedule (which requests share which step) stays the same.

Why it is damped. The schedule does shift when step times change, and under load it shifts in
the direction that amplifies the change: longer steps let more requests join each batch, which
lengthens the steps again. The fixed-schedule fit cannot see that feedback, so its step
overshoots (on cells near saturation by about a factor of two, and the rounds oscillate:
E2E +16%, -17%, +8%, -12%). So every round is a line search along the fitted step, judged by
full replays: try the step (scaled by what the previous round kept), fit a line through the
replayed residuals at the current point and at the trial, try the step length that line says
is best if it differs, and move only to a point whose replayed in-sample score beats the best
so far. The starting point is round 0; a round that improves nothing ends the fit, and if no
round improved the result is the starting point, unchanged (`FitResult.improved` is False).

Where it starts. From the coefficients the deployment uses without calibration (the shipped
fit for the GPU, `physics.default_coefficients`), or from the coefficients given as `start`.
The prior is centred on the start: a shipped fit is what earlier runs taught (itself fitted
with the physical prior), and new runs should move it only where they can see. Centred on the
physical defaults instead, it pulled what low-load runs cannot see (the KV-read and decode
GEMM efficiencies, which set the throughput at saturation) back to the defaults: fitting
Qwen3-14B cells at 2-10 req/s from the shipped fit then took the held-out saturated cells from
+34..115% E2E to +112..246% (centred on the start: -30..-47%; docs/calibrate.md).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .engine.request import RequestState
from .errors import ConfigError, excerpt, invalid
from .latency.physics import (
    COEFFICIENT_NAMES,
    PhysicsCoefficients,
    PhysicsModel,
    PhysicsTerms,
    RecordingStepModel,
    coefficients_document,
    default_coefficients,
    load_coefficients_file,
    price_terms,
    request_delay_s,
)
from .workload.server_settings import version_in_name

# Coefficients the fit moves (all of PhysicsCoefficients but the two below). A name the
# physics model no longer has is dropped, and a coefficient it gains is not fitted until it is
# listed here with a prior width: both keep their starting value.
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
FITTED = tuple(name for name in FITTED if name in COEFFICIENT_NAMES)
# Not fitted: `single_process_overhead_us` stays at 0 (see PhysicsCoefficients),
# `output_lag_steps` stays at 1, the one step vLLM V1's async scheduler runs
# ahead (see PhysicsCoefficients); fitting it as well left the folds disagreeing on how TTFT
# splits between it and `request_overhead_us`. `gemm_ridge_exponent` keeps its start (3: the
# form of the GEMM's roofline, a judgment, docs/latency-models.md) and `network_latency_us`
# too (no measured run crossed nodes).
FIT_METRICS = ("e2e_mean_ms", "itl_ms", "ttft_mean_ms", "ttft_p99_ms")
# Fitted only where it was measured: the median gap between streamed tokens (a BLIS observe
# cell's summary.json records it). The mean ITL mixes decode-only steps with steps that carry
# a prefill chunk; the median is the decode-only step, so it pins how a step's cost grows
# with the batch (the KV reads per sequence), which sets where a server saturates.
OPTIONAL_METRICS = ("itl_p50_ms",)
# The tail is noisier than the means (one burst moves it), so it counts half.
METRIC_WEIGHTS = {
    "e2e_mean_ms": 1.0,
    "itl_ms": 1.0,
    "ttft_mean_ms": 1.0,
    "ttft_p99_ms": 0.5,
    "itl_p50_ms": 1.0,
}
# The prior: each coefficient's log is pulled towards its prior centre (the start, or the
# physical default) with weight PRIOR_DATA_SCALE / sigma, where sigma is how far (in log
# units) the physics allows it to be off. That is the MAP estimate with a log-normal prior of
# width sigma when a run's residuals have scale PRIOR_DATA_SCALE (the soft-L1 scale: the size
# of error the model form leaves).
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
# At most; a round that does not improve ends the fit. The per-kernel-class step's all-nine-runs
# 0.15.1 fit kept improving until round 5 (score 58.6 after 3 rounds, 21.9 after 5).
DEFAULT_ROUNDS = 6
# A replayed point beats the best so far only when it lowers the in-sample score by this
# fraction: a smaller change is the schedule's noise, not a better fit, and calling it an
# improvement would hide a calibration that did nothing.
MIN_IMPROVEMENT = 1e-3
# The line search's shortest step (fraction of the fitted step) and its resolution.
MIN_STEP = 0.05
STEP_GRID = np.linspace(MIN_STEP, 1.0, 96)  # steps of 0.01
# A second trial along the line is worth a full replay only when the line puts the best step
# this far (as a ratio) from the first trial's.
RETRY_RATIO = 1.25
# `start` values that name a starting point rather than a file.
START_SHIPPED = "shipped"
START_PHYSICAL = "physical"
# `prior` values: where the prior is centred.
PRIOR_AT_START = "start"
PRIOR_AT_PHYSICAL = "physical"
PRIOR_CENTRES = (PRIOR_AT_START, PRIOR_AT_PHYSICAL)


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
    vllm_version: str | None = None  # of the server measured, when known (provenance, start)
    # A saturated cell (its client fell behind its schedule): only its step-level figures
    # (OPTIONAL_METRICS) are fitted. Its request latencies sit on a knife edge — a percent of
    # capacity moves them by tens of percent — and the fit's re-pricing of a recorded schedule
    # cannot follow a queue that builds or drains, so they are scored, never fitted.
    step_level_only: bool = False
    # The replay's client (`api.replay`'s max_in_flight), decided once from the trace when the
    # case is built: a fit replays every case each round, and deciding re-reads the trace.
    max_in_flight: int | str = "auto"
    # What the client's network added to each scored request's TTFT and E2E (ms, following
    # `positions`): the recorded round trip and, with a bandwidth, the prompt's upload (and,
    # for E2E, the answer's download). The measured latencies include it and a replay's do
    # not, so it is added to the simulated side, as the calibration report adds it: fitted
    # into the server's coefficients it would price network time as GPU time. None: nothing.
    network_ttft_ms: np.ndarray | None = None
    network_e2e_ms: np.ndarray | None = None
    # The replay's prefix-caching choice and its source, as the commands print it.
    prefix_caching: str = "prefix caching: on (vLLM's default)"
    # Per scored request (following `positions`): whether its TTFT was measured, i.e. the
    # client streamed the answer. A recorded request that was not streamed (`streaming`
    # false) has as "first chunk" the first byte of the whole body: its TTFT is its E2E and
    # the ITL taken from it about 0, so it gives E2E only (`per_run_figures`). None: all.
    streamed: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.network_ttft_ms is None:
            self.network_ttft_ms = np.zeros(len(self.positions))
        if self.network_e2e_ms is None:
            self.network_e2e_ms = np.zeros(len(self.positions))
        if self.streamed is None:
            self.streamed = np.ones(len(self.positions), dtype=bool)
        if not self.measured:
            self.measured = per_run_figures(
                self.measured_ttft_ms, self.measured_e2e_ms, self.output_tokens, self.streamed
            )

    @property
    def not_streamed(self) -> int:
        """How many scored requests give E2E only (no measured TTFT: not streamed)."""
        return int(np.count_nonzero(~np.asarray(self.streamed, dtype=bool)))


def per_run_figures(
    ttft_ms: np.ndarray,
    e2e_ms: np.ndarray,
    output_tokens: np.ndarray,
    streamed: np.ndarray | None = None,
) -> dict:
    """TTFT mean/p99, E2E mean and ITL of one run (numpy linear percentiles). With `streamed`
    (a bool per request), TTFT and ITL are of the streamed requests only and NaN (not
    measured, so not fitted) when there is none; E2E is of every request."""
    if ttft_ms.size == 0:
        return dict.fromkeys(FIT_METRICS, math.nan)
    figures = {"e2e_mean_ms": float(e2e_ms.mean())}
    keep = np.ones(ttft_ms.size, dtype=bool) if streamed is None else np.asarray(streamed, bool)
    if not keep.any():
        return figures | dict.fromkeys(("itl_ms", "ttft_mean_ms", "ttft_p99_ms"), math.nan)
    ttft, e2e_mean = ttft_ms[keep], float(e2e_ms[keep].mean())
    ttft_mean, mean_out = float(ttft.mean()), float(output_tokens[keep].mean())
    return figures | {
        "itl_ms": (e2e_mean - ttft_mean) / (mean_out - 1) if mean_out > 1 else math.nan,
        "ttft_mean_ms": ttft_mean,
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
    }


# ------------------------------------------------------------------------------ building cases


def groundtruth_case(
    run: Any,
    prompt_reuse: bool | None = None,
    workdir: Path | None = None,
    warm_up_s: float = 0.0,
    prefix_caching: bool | None = None,
) -> Case:
    """A case from a ground-truth run (simulator.validate.RunSpec), replayed as validate does
    (the replay trace is written under `workdir`): with the load generator's repeated prompts
    shared whole when `prompt_reuse` says so (`validate.reused_prompts`: by default whenever
    the run shows them), every prompt new otherwise; prefix caching as the server had it.
    `warm_up_s` > 0 fits and scores only the requests that arrived that long after the run's
    first (`validate --warm-up-s`); the whole run is still replayed. `prefix_caching`
    overrides what the server did."""
    from .validate import (
        baseline_trace,
        measured_requests,
        replay_overrides,
        reuse_trace,
        reused_prompts,
    )
    from .workload.server_settings import PrefixCaching
    from .workload.trace import recorded_client

    # The requests validate scores, after the same warm-up.
    measured = measured_requests(run).after_warm_up(warm_up_s, run.name)
    overrides = replay_overrides(run, PhysicsModel.name)
    choice = PrefixCaching(run.prefix_caching, run.prefix_caching_source)
    if prefix_caching is not None:
        overrides["engine__enable_prefix_caching"] = prefix_caching
        choice = PrefixCaching(prefix_caching, _prefix_caching_flag(prefix_caching))
    if reused_prompts(run, prompt_reuse) is not None:
        header, data = reuse_trace(run, workdir)
    else:
        header, data = baseline_trace(run, workdir)
    return Case(
        trace_header=header,
        trace_data=data,
        name=run.name,
        model=run.model,
        scenario=None,
        overrides=overrides,
        positions=np.asarray(measured.positions),
        measured_ttft_ms=measured.ttft_ms,
        measured_e2e_ms=measured.e2e_ms,
        output_tokens=np.maximum(measured.output_tokens, 1.0),
        vllm_version=run.vllm_version,
        max_in_flight=recorded_client(data).replay_choice,
        prefix_caching=choice.line(),
    )


def _prefix_caching_flag(enabled: bool) -> str:
    return "--prefix-caching" if enabled else "--no-prefix-caching"


def trace_case(
    trace_header: Path,
    trace_data: Path,
    scenario: Any = None,
    *,
    case_name: str | None = None,
    vllm_version: str | None = None,
    warm_up_s: float = 0.0,
    rtt_ms: float | None = None,
    network_bandwidth_mbps: float = 0.0,
    **overrides: Any,
) -> Case:
    """A case from a real TraceV2 pair (as `servesim observe` records): TTFT = first chunk −
    send, E2E = last chunk − send over the `ok` rows after the header's warm-up requests and,
    with `warm_up_s` > 0, sent that long after the first request.
    Deployment: `overrides` (dotted with `__`) win, then what the recording says of its
    server, as `replay` reads it (`server_settings.recorded_server`: the header's `server`
    section, a `server_config.json` beside the data file or in the folder above, which also
    gives the vLLM version, vLLM's batch defaults on the GPU for a vLLM server that records
    no limits; prefix caching only when a file records it), then `scenario`'s own fields.
    A recorded model servesim's catalog lacks is an error unless `model` is given (a fit on a
    stand-in model would fold the difference into the coefficients). A request a recorded
    trace (`mode: real`) did not stream gives E2E only (`Case.streamed`); when none left is
    ok, the error counts the rows left out and why (`calibration_report.nothing_to_compare`).
    The case is named `case_name`, else after the data file (after its folder when the file
    is just `trace.csv`). The network (`rtt_ms`, default the header's
    `network.measured_rtt_ms`, and `network_bandwidth_mbps`) is added to the simulated
    latencies exactly as the calibration report adds it (`calibration_report.network_ms`)."""
    from .api import as_scenario
    from .calibration_report import network_ms, nothing_to_compare
    from .validate import NothingToScore, measured_trace
    from .workload.server_settings import PrefixCaching, recorded_server
    from .workload.trace import client_of, read_header, read_rows, trace_spans

    sc = as_scenario(scenario) if scenario is not None else None
    hardware = overrides.get("hardware") or (sc.hardware if sc is not None else None) or "H100"
    server = recorded_server(trace_header, trace_data, hardware)
    recorded = dict(server.settings)
    found_version = recorded.pop("latency.vllm_version", None)
    vllm_version = vllm_version or found_version
    if not server.prefix_caching.recorded:
        del recorded["engine.enable_prefix_caching"]
    flag = overrides.get("engine__enable_prefix_caching")
    if flag is not None:
        choice = PrefixCaching(bool(flag), _prefix_caching_flag(bool(flag)))
    elif sc is not None and not server.prefix_caching.recorded:
        choice = PrefixCaching(sc.engine.enable_prefix_caching, "the scenario")
    else:
        choice = server.prefix_caching
    if overrides.get("model") is None and "model" in recorded:
        _refuse_unknown_recorded_model(
            recorded["model"], server.sources.get("model", ""), trace_header, trace_data
        )
    if any(overrides.get(name) is not None for name in ("model", "tp", "hardware")):
        # As replay decides (server_settings.recorded_settings): the recorded KV blocks belong
        # to the recorded model, TP and GPU; a deployment chosen here sizes its own cache.
        recorded.pop("engine.total_kv_blocks", None)
    overrides = {key.replace(".", "__"): value for key, value in recorded.items()} | {
        k: v for k, v in overrides.items() if v is not None
    }
    header = read_header(trace_header)
    # The requests validate scores: after the header's warm-up requests and `warm_up_s`.
    warm_up = int(header.get("warm_up_requests") or 0)
    rows = read_rows(Path(trace_data))
    try:
        measured_run = measured_trace(Path(trace_data), warm_up, header)
    except NothingToScore:  # a damaged row is its own error, naming the row
        raise ConfigError(
            nothing_to_compare(
                f"calibrate: no request of {str(trace_data)!r}", rows, warm_up, purpose="fit"
            )
        ) from None
    try:
        chosen = measured_run.after_warm_up(warm_up_s, "")
    except NothingToScore:
        raise ConfigError(
            f"calibrate: {str(trace_data)!r} has no successful request after the "
            f"{warm_up} warm-up requests and {warm_up_s:g} s"
        ) from None

    model = overrides.get("model") or (sc.model if sc is not None else "")
    ttft_ms, e2e_ms = chosen.ttft_ms, chosen.e2e_ms
    # A request the client did not stream measured no TTFT (its first chunk is the body's).
    streamed = chosen.streamed_mask
    added = [
        network_ms(
            header,
            rows[i].server_input_tokens or rows[i].input_tokens,
            rows[i].output_tokens,
            rtt_ms,
            network_bandwidth_mbps,
        )
        for i in chosen.positions
    ]
    output_tokens = np.maximum(chosen.output_tokens, 1.0)
    measured = per_run_figures(ttft_ms, e2e_ms, output_tokens, streamed)
    # The gaps between streamed chunks: none without a streamed request.
    itl_p50 = recorded_itl_p50_ms(Path(trace_data).parent / OBSERVE_SUMMARY_FILE)
    if itl_p50 is not None and streamed.any():
        measured["itl_p50_ms"] = itl_p50
    spans = trace_spans(trace_data)
    return Case(
        name=case_name or trace_name(Path(trace_data)),
        model=str(model),
        trace_header=Path(trace_header),
        trace_data=Path(trace_data),
        scenario=sc,
        overrides={"latency__model": PhysicsModel.name, **overrides},
        positions=np.asarray(chosen.positions),
        measured_ttft_ms=ttft_ms,
        measured_e2e_ms=e2e_ms,
        output_tokens=output_tokens,
        measured=measured,
        step_level_only=spans.client_fell_behind,
        max_in_flight=client_of(spans).replay_choice,
        network_ttft_ms=np.asarray([t for t, _e in added], dtype=float),
        network_e2e_ms=np.asarray([e for _t, e in added], dtype=float),
        prefix_caching=choice.line(),
        vllm_version=vllm_version
        or (sc.latency.vllm_version if sc is not None else None)
        or version_in_name(Path(trace_data).resolve().parent.name),
        streamed=streamed,
    )


def _refuse_unknown_recorded_model(
    model: Any, source: str, trace_header: Path, trace_data: Path
) -> None:
    """A model the recording names (no --model given) that servesim's catalog lacks is an
    error naming where the name came from. `replay` simulates servesim's default model in its
    place (with a note), but a fit would fold the difference between the two models into
    the coefficients it writes, which every later run on the GPU then uses."""
    from .catalog.models import load_model
    from .workload.server_settings import server_config_near

    try:
        load_model(str(model))
    except ConfigError:
        pass
    else:
        return
    if source == "trace header":
        where = f"the trace header {str(trace_header)!r} (server.model)"
    else:
        config = server_config_near(trace_data)
        where = f"{str(config)!r} (model)" if config is not None else repr(source)
    raise ConfigError(
        f"model: {excerpt(model)}, recorded in {where}, is not in servesim's catalog "
        "(servesim models); --model chooses the model to fit (calibrate does not fall back "
        "to a default model as replay does: the fit would fold the difference between the "
        "two into the coefficients)"
    )


def not_streamed_note(cases: Sequence[Case]) -> str | None:
    """One line saying which cases' requests were not streamed and so give E2E only (no
    TTFT or ITL target), or None when every request was streamed."""
    parts = [
        f"{case.not_streamed:,} of {len(case.positions):,} requests of {case.name}"
        for case in cases
        if case.not_streamed
    ]
    if not parts:
        return None
    return (
        f"calibrate: note: {', '.join(parts)} were not streamed (streaming=false): a "
        "non-streamed answer's first chunk is its whole body, so they give E2E only, no TTFT "
        "or ITL target"
    )


def fitted_figures(case: Case) -> list[str]:
    """The figures of `case` the fit fits: those measured (finite, > 0) of FIT_METRICS,
    unless the case is step-level only, and of OPTIONAL_METRICS."""
    names = [*(() if case.step_level_only else FIT_METRICS), *OPTIONAL_METRICS]
    return [
        m
        for m in names
        if m in case.measured and math.isfinite(case.measured[m]) and case.measured[m] > 0
    ]


def check_measurable(cases: Sequence[Case]) -> None:
    """Refuse to fit `cases` none of which gives the fit a figure (`fitted_figures`), naming
    why for each: there would be nothing to fit, and a score of 0 would look perfect."""
    if not any(fitted_figures(case) for case in cases):
        raise ConfigError(
            "calibrate: nothing measurable to fit on: "
            + "; ".join(f"{case.name}: {_nothing_fitted(case)}" for case in cases)
        )


def _nothing_fitted(case: Case) -> str:
    """Why `case` gives the fit no figure (`fitted_figures` is empty)."""
    if case.step_level_only:
        return (
            "its client fell behind its schedule, so only an observe summary.json's ITL p50 is "
            "fitted, and it has none"
            + (" (and no request was streamed)" if case.not_streamed == len(case.positions) else "")
        )
    return "no TTFT, ITL or E2E was measured"


# What BLIS `observe` writes beside a cell's trace: its own aggregate of the streamed chunks.
OBSERVE_SUMMARY_FILE = "summary.json"


def recorded_itl_p50_ms(path: Path) -> float | None:
    """The median inter-token gap (ms) an observe `summary.json` recorded (`overall.itl_ms.p50`),
    or None when there is no such file or figure."""
    from .input_files import read_json

    if not path.is_file():
        return None
    data = read_json(path, "observe summary")
    overall = data.get("overall") if isinstance(data, dict) else None
    itl = overall.get("itl_ms") if isinstance(overall, dict) else None
    value = itl.get("p50") if isinstance(itl, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


# The data file of a trace pair, by the file name BLIS `observe` writes in a cell's folder.
TRACE_CELL_FILES = ("trace.yaml", "trace.csv")  # validate's TRACE_HEADER, TRACE_DATA


def trace_name(data: Path) -> str:
    """A trace's case name: its data file's stem without `.trace`, or its folder's name when
    the file is a cell's generic `trace.csv`."""
    stem = data.name.removesuffix(".csv").removesuffix(".trace")
    return data.resolve().parent.name if stem == "trace" else stem


def trace_pairs(folder: Path) -> list[tuple[str, Path, Path]]:
    """(name, header, data) of the trace pairs in `folder`, sorted by name: the folder itself
    when it is one cell (trace.yaml + trace.csv), else each sub-folder that is one, named
    after it, and each `NAME.yaml` + `NAME.csv` pair directly inside (NAME without `.trace`).
    A cell folder holding only one of its two files is an error naming it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"--traces: {str(folder)!r} is not a folder")
    pairs = _find_pairs(folder)
    if not pairs:
        raise ConfigError(
            f"--traces: {str(folder)!r} holds no trace pair (a sub-folder with "
            f"{' + '.join(TRACE_CELL_FILES)}, or NAME.yaml + NAME.csv)"
        )
    return pairs


def _find_pairs(folder: Path) -> list[tuple[str, Path, Path]]:
    """`trace_pairs` without the error for a folder that holds none."""
    header, data = (folder / f for f in TRACE_CELL_FILES)
    if _is_cell(folder):
        return [(folder.resolve().name, header, data)]
    pairs = []
    for sub in sorted(folder.iterdir()):
        header, data = (sub / f for f in TRACE_CELL_FILES)
        if sub.is_dir() and _is_cell(sub):
            pairs.append((sub.name, header, data))
        elif sub.suffix == ".yaml" and sub.with_suffix(".csv").is_file():
            pairs.append((trace_name(sub.with_suffix(".csv")), sub, sub.with_suffix(".csv")))
    return sorted(pairs, key=lambda pair: pair[0])


def _is_cell(folder: Path) -> bool:
    """Whether `folder` is a cell (both of TRACE_CELL_FILES); one of them without the other
    is an error naming the cell (it was left out of the fit without a word)."""
    from .validate import incomplete_cell

    problem = incomplete_cell(folder)
    if problem is not None:
        raise ConfigError(f"trace cell {str(folder)!r}: {problem}")
    return all((folder / name).is_file() for name in TRACE_CELL_FILES)


def trace_cases(folder: Path, scenario: Any = None, **overrides: Any) -> list[Case]:
    """`trace_case` for every pair of `trace_pairs(folder)`: each finds its recorded server
    (a `server_config.json` in the cell's folder, else in `folder`, gives the vLLM version);
    the folder names are the next source of the version."""
    folder = Path(folder)
    cases = []
    for name, header, data in trace_pairs(folder):
        version = version_in_name(header.resolve().parent.name) or version_in_name(
            folder.resolve().name
        )
        case = trace_case(header, data, scenario, case_name=name, **overrides)
        case.vllm_version = case.vllm_version or version
        cases.append(case)
    return cases


def is_trace_folder(folder: Path) -> bool:
    """A folder of trace pairs rather than a ground-truth dataset (`requests/` folders)."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / "requests").is_dir():
        return False
    if any((p / "requests").is_dir() for p in folder.iterdir()):
        return False
    # An incomplete cell is an error naming it here, not a reason to read the folder as
    # ground truth (whose error would say nothing of the cell).
    return bool(_find_pairs(folder))


# ------------------------------------------------------------------------- replay and record


@dataclass
class Recording:
    """One replay of a case: every step's terms and timing, and the scored requests' times."""

    case: Case
    coefficients: PhysicsCoefficients
    terms: np.ndarray  # (steps, len(PhysicsTerms._fields)), PhysicsTerms columns
    start_us: np.ndarray
    end_us: np.ndarray
    busy: np.ndarray  # bool per step: something was scheduled (an empty step costs 1 µs)
    decode_tokens: np.ndarray  # per step: tokens it decoded (the gaps it made, for itl_p50)
    # Per scored request: index of the step running when it was queued (-1 if none), the
    # fraction of that step still to go, and the steps that ended its TTFT and E2E.
    wait_step: np.ndarray
    wait_fraction: np.ndarray
    first_token_step: np.ndarray
    completion_step: np.ndarray
    completed: np.ndarray  # bool per scored request
    # Per scored request: the step in flight when it reached the engine (after the client
    # path), whose rest it waited before the steps it missed (-1 if the instance was idle),
    # and the fraction of that step still to go then.
    lag_step: np.ndarray
    lag_fraction: np.ndarray
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
        case.trace_header,
        case.trace_data,
        case.scenario,
        max_in_flight=case.max_in_flight,
        on_deployment=swap,
        **case.overrides,
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
        busy=steps["batch_size"].to_numpy() > 0,
        decode_tokens=steps["decode_tokens"].to_numpy(),
        wait_step=safe,
        wait_fraction=np.where(wait_step >= 0, fraction, 0.0),
        first_token_step=np.searchsorted(end, first_token, side="left"),
        completion_step=np.searchsorted(end, completion, side="left"),
        completed=completed,
        lag_step=np.where(in_flight, lag_index, -1),
        lag_fraction=np.where(
            in_flight, np.clip((end[lag_index] - reached) / durations[lag_index], 0.0, 1.0), 0.0
        ),
        predicted={},
    )
    done = completed
    recording.predicted = per_run_figures(
        (first_token[done] - arrivals[done]) / 1e3 + case.network_ttft_ms[done],
        (completion[done] - arrivals[done]) / 1e3 + case.network_e2e_ms[done],
        case.output_tokens[done],
        case.streamed[done],
    )
    if "itl_p50_ms" in case.measured:
        recording.predicted["itl_p50_ms"] = median_gap_ms(end - start, recording.decode_tokens)
    return recording


def median_gap_ms(step_us: np.ndarray, decode_tokens: np.ndarray) -> float:
    """The median gap between a request's streamed tokens: each token a step decodes arrives
    one step after the request's previous one, so the gaps are the step durations weighted
    by the tokens each step decoded."""
    busy = decode_tokens > 0
    if not busy.any():
        return math.nan
    durations, weights = np.asarray(step_us, dtype=float)[busy], decode_tokens[busy]
    order = np.argsort(durations, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(durations[order][np.searchsorted(cumulative, cumulative[-1] / 2)]) / 1e3


def reprice(rec: Recording, c: PhysicsCoefficients) -> dict[str, float]:
    """Per-run figures for coefficients `c` on the recorded schedule (see module docstring)."""
    t = rec.terms
    step_s = price_terms(tuple(t.T), c, np.maximum)
    # Empty steps (nothing scheduled) cost the engine 1 µs whatever the coefficients.
    step_s = np.where(rec.busy, step_s, 1e-6)
    elapsed = np.concatenate(([0.0], np.cumsum(step_s)))
    done = rec.completed
    waited = rec.wait_fraction[done] * step_s[rec.wait_step[done]]
    first = rec.wait_step[done] + 1
    lag = rec.lag_step[done]
    # A request that reached the engine mid-step waited for the rest of that step and for
    # the planned steps it missed, up to the step it was queued in (which `waited` counts).
    lagged = lag >= 0
    safe_lag = np.maximum(lag, 0)
    missed_s = np.where(lagged, elapsed[rec.wait_step[done]] - elapsed[safe_lag + 1], 0.0)
    rest_s = np.where(lagged, rec.lag_fraction[done] * step_s[safe_lag], 0.0)
    queue_s = request_delay_s(c) + rest_s + np.maximum(missed_s, 0.0)
    ttft_s = queue_s + waited + elapsed[rec.first_token_step[done] + 1] - elapsed[first]
    e2e_s = queue_s + waited + elapsed[rec.completion_step[done] + 1] - elapsed[first]
    figures = per_run_figures(
        ttft_s * 1e3 + rec.case.network_ttft_ms[done],
        e2e_s * 1e3 + rec.case.network_e2e_ms[done],
        rec.case.output_tokens[done],
        rec.case.streamed[done],
    )
    if "itl_p50_ms" in rec.case.measured:
        figures["itl_p50_ms"] = median_gap_ms(step_s * 1e6, rec.decode_tokens)
    return figures


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


def _prior_weights() -> np.ndarray:
    return np.asarray([PRIOR_DATA_SCALE / PRIOR_SIGMA[name] for name in FITTED])


def _weighted_log_ratios(
    measured: Mapping[str, float], predicted: Mapping[str, float], step_level_only: bool = False
) -> list:
    """One case's data residuals: weighted log(predicted / measured) of each measured figure
    (a figure the replay could not produce counts as a thousandfold miss)."""
    out = []
    fitted = () if step_level_only else FIT_METRICS
    for metric in (*fitted, *(m for m in OPTIONAL_METRICS if m in measured)):
        meas, pred = measured[metric], predicted.get(metric, math.nan)
        if math.isfinite(meas) and meas > 0:
            ratio = pred / meas if math.isfinite(pred) and pred > 0 else 1e-3
            out.append(METRIC_WEIGHTS[metric] * math.log(ratio))
    return out


def residuals(
    recordings: Sequence[Recording], c: PhysicsCoefficients, prior: PhysicsCoefficients
) -> np.ndarray:
    """Weighted log(predicted / measured) per case and metric, then the prior terms."""
    out = []
    for rec in recordings:
        out.extend(
            _weighted_log_ratios(rec.case.measured, reprice(rec, c), rec.case.step_level_only)
        )
    out.extend(_prior_weights() * (_to_vector(c) - _to_vector(prior)))
    return np.asarray(out)


def soft_l1(r: np.ndarray) -> float:
    """The fit's loss of residuals `r` (up to scipy's constant factor scale² / 2)."""
    z = (np.asarray(r, dtype=float) / SOFT_L1_SCALE) ** 2
    return float(np.sum(2 * (np.sqrt(1 + z) - 1)))


def replayed_residuals(recordings: Sequence[Recording]) -> np.ndarray:
    """The data residuals (no prior) of actual replays: what the fit is judged on."""
    out = []
    for rec in recordings:
        out.extend(_weighted_log_ratios(rec.case.measured, rec.predicted, rec.case.step_level_only))
    return np.asarray(out)


def score(scores: Mapping[str, Mapping[str, Mapping[str, float]]]) -> float:
    """The in-sample score of per-case {"measured", "predicted"} figures: the fit's soft-L1
    loss without the prior. 0 is perfect; a case off by 10% on all four figures adds ~3.1."""
    r = [x for s in scores.values() for x in _weighted_log_ratios(s["measured"], s["predicted"])]
    return soft_l1(np.asarray(r))


def signed_errors(
    scores: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, dict[str, float]]:
    """Per case and metric: predicted / measured − 1 (NaN where nothing was measured)."""
    out = {}
    for name, s in scores.items():
        out[name] = {}
        for m in FIT_METRICS:
            meas, pred = s["measured"][m], s["predicted"][m]
            ok = math.isfinite(meas) and meas > 0 and math.isfinite(pred)
            out[name][m] = float(pred / meas - 1) if ok else math.nan
    return out


def mean_abs_errors(errors: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per metric, the mean over cases of |signed error| (cases without the figure skipped)."""
    out = {}
    for m in FIT_METRICS:
        values = [abs(e[m]) for e in errors.values() if math.isfinite(e[m])]
        out[m] = float(np.mean(values)) if values else math.nan
    return out


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


def line_step(r0: np.ndarray, r1: np.ndarray, tried: float) -> float:
    """The step length (fraction of the fitted step, in [MIN_STEP, 1]) that minimises the
    soft-L1 loss of the line through the replayed residuals `r0` at the current point and
    `r1` at the trial `tried` of the way along the step. Residuals are close to linear in the
    log-coefficients over one step, and the replays carry the schedule's feedback that the
    fixed-schedule fit missed, so this corrects the fit's overshoot (or undershoot)."""
    slope = (np.asarray(r1) - np.asarray(r0)) / tried
    losses = [soft_l1(r0 + a * slope) for a in STEP_GRID]
    return round(float(STEP_GRID[int(np.argmin(losses))]), 2)


@dataclass(frozen=True)
class RoundScore:
    """One full replay of the fitted cases: round 0 is the start; a round may try two steps."""

    round: int
    step: float  # fraction of the round's fitted step taken (0 for the start)
    score: float  # in-sample soft-L1 score of the replay (see `score`)
    errors: dict[str, dict[str, float]]  # per case and metric, signed
    kept: bool  # became the best point so far
    coefficients: PhysicsCoefficients

    def mean_abs_errors(self) -> dict[str, float]:
        return mean_abs_errors(self.errors)


def _figures(recordings: Sequence[Recording]) -> dict[str, dict[str, dict[str, float]]]:
    return {
        rec.case.name: {"measured": dict(rec.case.measured), "predicted": dict(rec.predicted)}
        for rec in recordings
    }


@dataclass
class FitResult:
    """What `fit` found, with every replayed round and the held-out cases' figures."""

    coefficients: PhysicsCoefficients
    cases: list[str]  # the fitted cases
    rounds: int  # rounds asked for (at most)
    # Per fitted case: measured and predicted figures of a full replay with `coefficients`.
    scores: dict[str, dict[str, dict[str, float]]]
    start: PhysicsCoefficients = field(default_factory=PhysicsCoefficients)
    start_source: str = "physical defaults"
    prior: str = PRIOR_AT_START  # where the prior was centred (PRIOR_CENTRES)
    start_scores: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    held_out: list[str] = field(default_factory=list)
    # Held-out cases' figures with the result and with the start (replayed, never fitted on).
    held_out_scores: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    start_held_out_scores: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    history: list[RoundScore] = field(default_factory=list)
    stopped_early: bool = False  # a round improved nothing (or the fit proposed no move)
    vllm_version: str | None = None

    @property
    def score(self) -> float:
        return score(self.scores)

    @property
    def start_score(self) -> float:
        return score(self.start_scores)

    @property
    def improved(self) -> bool:
        """False when no round beat the start: `coefficients` is then the start, unchanged."""
        return any(r.kept and r.round > 0 for r in self.history)

    @property
    def rounds_run(self) -> int:
        return max((r.round for r in self.history), default=0)

    @property
    def held_out_worse(self) -> bool:
        """True when held-out runs score worse with `coefficients` than with the start: the
        fit improved the runs it saw but does not carry to these."""
        return bool(self.held_out) and score(self.held_out_scores) > score(
            self.start_held_out_scores
        )

    def document(self, **about: Any) -> dict[str, Any]:
        """The coefficients YAML (load with --latency-coeffs), with the fit's provenance."""

        def errors(scores: Mapping[str, Any]) -> dict[str, dict[str, float]]:
            return {n: dict(e) for n, e in signed_errors(scores).items()}

        fit_section: dict[str, Any] = {
            "objective": "soft-L1 least squares of weighted log(predicted/measured) of "
            + ", ".join(f"{m} (x{METRIC_WEIGHTS[m]:g})" for m in FIT_METRICS)
            + " per run, plus a log-normal prior towards "
            + ("the start" if self.prior == PRIOR_AT_START else "the physical defaults")
            + " (width "
            + ", ".join(f"{n} {PRIOR_SIGMA[n]:g}" for n in FITTED)
            + f"; residual scale {PRIOR_DATA_SCALE:g})",
            "rounds": self.rounds,
            "rounds_run": self.rounds_run,
            "runs": list(self.cases),
            "held_out": list(self.held_out),
            "vllm_version": self.vllm_version,
            "start": {
                "source": self.start_source,
                "coefficients": coefficients_dict(self.start),
            },
            "prior": self.prior,
            "improved": self.improved,
            "score": {"start": self.start_score, "fitted": self.score},
            "round_scores": [
                {"round": r.round, "step": r.step, "score": r.score, "kept": r.kept}
                for r in self.history
            ],
            "in_sample_errors": errors(self.scores),
            "start_in_sample_errors": errors(self.start_scores),
        }
        if self.held_out:
            fit_section["held_out_score"] = {
                "start": score(self.start_held_out_scores),
                "fitted": score(self.held_out_scores),
                "worse": self.held_out_worse,
            }
            fit_section["held_out_errors"] = errors(self.held_out_scores)
            fit_section["start_held_out_errors"] = errors(self.start_held_out_scores)
        return coefficients_document(self.coefficients, fit=fit_section, **about)


def record_all(
    cases: Sequence[Case], coefficients: PhysicsCoefficients, workers: int = 1
) -> list[Recording]:
    """`record` every case, in `workers` processes when more than one."""
    if workers <= 1 or len(cases) <= 1:
        return [record(case, coefficients) for case in cases]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(workers, len(cases))) as pool:
        return list(pool.map(record, cases, [coefficients] * len(cases)))


def split_holdout(
    cases: Sequence[Case], holdout: Sequence[str] | None
) -> tuple[list[Case], list[Case]]:
    """(fitted, held out): a case is held out when its name equals or contains one of
    `holdout`. Every name must match a case, and at least one case must stay to fit on."""
    names = [str(n) for n in holdout or ()]
    for wanted in names:
        if not wanted or not any(wanted in case.name for case in cases):
            raise ConfigError(
                f"--holdout: no run matches {excerpt(wanted)}; "
                f"available: {', '.join(case.name for case in cases)}"
            )
    held = [case for case in cases if any(w in case.name for w in names)]
    fitted = [case for case in cases if case not in held]
    if not fitted:
        raise ConfigError(
            f"--holdout: {', '.join(map(excerpt, names))} holds out every run; nothing left "
            "to fit on"
        )
    return fitted, held


def case_deployment(case: Case) -> Any:
    """The deployment `case` replays on (model, GPU, TP, ...), resolved without running."""
    from .api import as_scenario
    from .deployment import resolve_deployment
    from .scenario import Scenario, TraceSpec, apply_overrides

    sc = as_scenario(case.scenario) if case.scenario is not None else Scenario()
    sc = sc.model_copy(update={"workload": None, "workload_spec": None})
    sc.trace = TraceSpec(header=case.trace_header, data=case.trace_data)
    sc = apply_overrides(sc, {k.replace("__", "."): v for k, v in case.overrides.items()})
    return resolve_deployment(sc)


def shipped_coefficients(gpu: Any, vllm_version: str | None) -> tuple[PhysicsCoefficients, str]:
    """`physics.default_coefficients` for the GPU, and for the vLLM version when the shipped
    calibrations are keyed by it (whatever it returns is what replays use uncalibrated)."""
    parameters = inspect.signature(default_coefficients).parameters
    if "vllm_version" in parameters:
        return default_coefficients(gpu, vllm_version=vllm_version)
    return default_coefficients(gpu)


def model_key(model: str) -> str:
    """A model's name for comparing: lower case, without the organisation."""
    return str(model).strip().lower().split("/")[-1]


def shipped_fit_models(cases: Sequence[Case], vllm_version: str | None) -> set[str] | None:
    """The models (`model_key`) the shipped start for `cases` was fitted on; None when the
    shipped coefficients do not say (then any held-out run may have been among them)."""
    gpu = case_deployment(cases[0]).gpu
    _, source = shipped_coefficients(gpu, vllm_version)
    if str(getattr(source, "kind", source)) == "physical defaults":
        return set()
    models = getattr(source, "fit_models", None)
    return None if models is None else {model_key(m) for m in models}


def resolve_start(
    start: PhysicsCoefficients | str | Path | None,
    cases: Sequence[Case],
    vllm_version: str | None = None,
) -> tuple[PhysicsCoefficients, str]:
    """The starting coefficients and where they come from. None or "shipped": what the cases'
    GPU uses uncalibrated (its shipped fit, else the physical defaults); "physical": the
    physical defaults; a path: a coefficients file; or the coefficients themselves."""
    if isinstance(start, PhysicsCoefficients):
        return start.check("calibrate: start"), "given"
    if start is None or str(start) == START_SHIPPED:
        gpus = {}
        for case in cases:
            gpu = case_deployment(case).gpu
            gpus.setdefault(gpu.name, gpu)
        if len(gpus) != 1:
            raise ConfigError(
                f"calibrate: the runs are on several GPUs ({', '.join(sorted(gpus))}), each "
                "with its own shipped coefficients; choose a start (--start FILE or physical)"
            )
        gpu = next(iter(gpus.values()))
        c, source = shipped_coefficients(gpu, vllm_version)
        # The source is a label or an object that describes itself (its `kind` says which).
        kind = str(getattr(source, "kind", source))
        text = source.describe() if hasattr(source, "describe") else str(source)
        if kind == "physical defaults":
            return c, f"physical defaults (no shipped calibration for {gpu.name})"
        return c, f"shipped coefficients for {gpu.name}: {text}"
    if str(start) == START_PHYSICAL:
        return PhysicsCoefficients(), "physical defaults"
    if isinstance(start, str | Path):
        return load_coefficients_file(start), f"file {str(start)}"
    raise invalid(
        "calibrate: start", start, "must be coefficients, a file, 'shipped' or 'physical'"
    )


def common_version(cases: Sequence[Case]) -> str | None:
    """The vLLM version all `cases` were measured on, if they agree and it is known."""
    versions = {case.vllm_version for case in cases}
    return versions.pop() if len(versions) == 1 else None


def _replay_step(
    cases: Sequence[Case],
    base: PhysicsCoefficients,
    x: np.ndarray,
    direction: np.ndarray,
    step: float,
    round_index: int,
    workers: int,
) -> tuple[RoundScore, list[Recording]]:
    """Replay every case `step` of the way along `direction` from `x` (log-coefficients)."""
    c = _from_vector(x + step * direction, base)
    recordings = record_all(cases, c, workers)
    figures = _figures(recordings)
    return RoundScore(round_index, step, score(figures), signed_errors(figures), False, c), (
        recordings
    )


def fit(
    cases: Sequence[Case],
    start: PhysicsCoefficients | str | Path | None = None,
    rounds: int = DEFAULT_ROUNDS,
    on_round: Callable[[RoundScore], None] | None = None,
    workers: int = 1,
    holdout: Sequence[str] | None = None,
    vllm_version: str | None = None,
    start_source: str | None = None,
    prior: str = PRIOR_AT_START,
) -> FitResult:
    """Fit on `cases` but those `holdout` names (see `split_holdout`), from `start` (see
    `resolve_start`; default the coefficients the deployment uses uncalibrated), in at most
    `rounds` damped replay-and-fit rounds (module docstring). `on_round` sees every replay
    of a round once the round has decided which, if any, to keep. The result is the best
    replayed point, the start itself when no round improved on it (`improved` is then False);
    held-out cases are replayed with the start and the result only, never fitted on.
    `start_source` labels a `start` given as coefficients in the provenance. The prior is
    centred on the start, or with `prior="physical"` on the physical defaults."""
    if not cases:
        raise ConfigError("calibrate: nothing to fit on (no runs selected)")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise invalid("calibrate: rounds", rounds, "must be an integer >= 0")
    if prior not in PRIOR_CENTRES:
        raise invalid("calibrate: prior", prior, f"must be one of {', '.join(PRIOR_CENTRES)}")
    names = [case.name for case in cases]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"calibrate: two runs are named {excerpt(repeated[0])}; rename one")
    train, held = split_holdout(cases, holdout)
    check_measurable(train)
    version = vllm_version or common_version(cases)
    start_c, resolved_source = resolve_start(start, cases, version)
    start_source = start_source or resolved_source
    centre = start_c if prior == PRIOR_AT_START else PhysicsCoefficients()

    recorded = record_all([*train, *held], start_c, workers)
    current, held_start = recorded[: len(train)], recorded[len(train) :]
    start_figures = _figures(current)
    best = RoundScore(0, 0.0, score(start_figures), signed_errors(start_figures), True, start_c)
    history = [best]
    if on_round is not None:
        on_round(best)
    step, stopped = 1.0, False
    for k in range(1, rounds + 1):
        proposal = fit_recorded(current, best.coefficients, centre)
        x = _to_vector(best.coefficients)
        direction = _to_vector(proposal) - x
        if not np.any(np.abs(direction) > 1e-9):
            stopped = True
            break
        trials = [_replay_step(train, best.coefficients, x, direction, step, k, workers)]
        better = line_step(replayed_residuals(current), replayed_residuals(trials[0][1]), step)
        if not (step / RETRY_RATIO <= better <= step * RETRY_RATIO):
            trials.append(_replay_step(train, best.coefficients, x, direction, better, k, workers))
        bar = best.score * (1 - MIN_IMPROVEMENT)
        shortest = min(t.step for t, _ in trials)
        if min(t.score for t, _ in trials) >= bar and shortest / 2 >= MIN_STEP:
            # The line was wrong (the replays are not linear this far out): backtrack once
            # before calling the round a failure.
            trials.append(
                _replay_step(train, best.coefficients, x, direction, shortest / 2, k, workers)
            )
        # Ties go to the earlier trial, the step the previous rounds found to work.
        chosen = min(range(len(trials)), key=lambda i: trials[i][0].score)
        improved = trials[chosen][0].score < bar
        for i, (t, _) in enumerate(trials):
            history.append(replace(t, kept=improved and i == chosen))
            if on_round is not None:
                on_round(history[-1])
        if not improved:
            stopped = True
            break
        best, current = replace(trials[chosen][0], kept=True), trials[chosen][1]
        step = best.step

    result_c = best.coefficients
    if held and result_c is not start_c:
        held_result = record_all(held, result_c, workers)
    else:
        held_result = held_start
    return FitResult(
        coefficients=result_c,
        cases=[case.name for case in train],
        rounds=rounds,
        scores=_figures(current),
        start=start_c,
        start_source=start_source,
        prior=prior,
        start_scores=start_figures,
        held_out=[case.name for case in held],
        held_out_scores=_figures(held_result),
        start_held_out_scores=_figures(held_start),
        history=history,
        stopped_early=stopped,
        vllm_version=version,
    )


def write_coefficients(path: Path, document: dict[str, Any]) -> None:
    import yaml

    from .atomic_io import write_text_atomically

    write_text_atomically(path, yaml.safe_dump(document, sort_keys=False))


def coefficients_dict(c: PhysicsCoefficients) -> dict[str, float]:
    return {k: float(v) for k, v in asdict(c).items()}


__all__ = [
    "Case",
    "FitResult",
    "check_measurable",
    "RoundScore",
    "fit",
    "fitted_figures",
    "groundtruth_case",
    "not_streamed_note",
    "line_step",
    "record",
    "replay_case",
    "reprice",
    "resolve_start",
    "split_holdout",
    "trace_case",
    "trace_cases",
]
