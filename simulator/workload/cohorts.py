"""Cohorts and inference-perf specs rendered as plain clients (docs/behaviour.md §9.2, BLIS
cohort.go and inference_perf.go).

Both expansions are pure: they read a WorkloadSpec and return clients, with no randomness
(BLIS derives a per-cohort RNG but never draws from it).

Lifecycle windows are half-open [start_us, end_us) and a client is active when the time lies
in ANY of its windows (BLIS's union rule). A cohort's traffic patterns are therefore combined
by concatenating their windows, exactly as BLIS does, with these consequences:

* diurnal + spike: the spike window is added to the 24 hourly windows; inside the spike the
  member is active for the whole spike (filling the diurnal off-periods), outside it the
  diurnal pattern holds. A spike does not raise the member's rate above its base rate.
* drain + anything: the drain adds a full-rate window [0, start_time_us) (when the drain does
  not start at 0), which overrides any diurnal gaps before the drain begins; the ramp windows
  then add to whatever the other patterns allow.
* A diurnal pattern covers one day only (hours 0..23): a diurnal member is inactive after 24 h.
"""

from __future__ import annotations

import math

from pydantic import ValidationError

from ..errors import ConfigError
from ..limits import MAX_INFERENCE_PERF_CLIENTS, MAX_TIME_US, duration_us
from .spec import (
    ActiveWindow,
    ClientSpec,
    CohortSpec,
    DistSpec,
    DiurnalSpec,
    DrainSpec,
    LifecycleSpec,
    MultiTurnSpec,
    ReasoningSpec,
    SpikeSpec,
    WorkloadSpec,
    format_spec_error,
)

HOURS_PER_DAY = 24
US_PER_HOUR = 3600 * 1_000_000
DRAIN_SEGMENTS = 10
US_PER_S = 1_000_000


def diurnal_multiplier(hour: int, peak_hour: int, peak_to_trough_ratio: float) -> float:
    """Fraction of hour `hour` a member is active: 1 at the peak, 1/R twelve hours away.

    (1 + cos(2π(h − peak)/24)) / 2 · (1 − 1/R) + 1/R
    """
    inv_r = 1.0 / peak_to_trough_ratio
    angle = 2.0 * math.pi * (hour - peak_hour) / HOURS_PER_DAY
    return (1.0 + math.cos(angle)) / 2.0 * (1.0 - inv_r) + inv_r


def diurnal_windows(diurnal: DiurnalSpec) -> list[ActiveWindow]:
    """24 windows, one per hour from t = 0, each starting on the hour and lasting the hour
    scaled by `diurnal_multiplier` (whole µs, at least 1, at most the hour).

    The rate therefore varies as an on/off square wave within each hour, not smoothly: the
    member runs at its full rate while inside the window, and not at all for the rest of the
    hour, so the hour's expected request count scales with the multiplier.
    """
    windows = []
    for hour in range(HOURS_PER_DAY):
        m = diurnal_multiplier(hour, diurnal.peak_hour, diurnal.peak_to_trough_ratio)
        active_us = min(US_PER_HOUR, max(1, int(US_PER_HOUR * m)))
        start_us = hour * US_PER_HOUR
        windows.append(ActiveWindow(start_us=start_us, end_us=start_us + active_us))
    return windows


def spike_window(spike: SpikeSpec, population: int = 1) -> ActiveWindow:
    """One window [start_time_us, start_time_us + duration_us); a spike's `trace_rate` (the
    whole cohort's req/s) becomes each of the `population` members' equal share of it."""
    return ActiveWindow(
        start_us=spike.start_time_us,
        end_us=spike.start_time_us + spike.duration_us,
        trace_rate=spike.trace_rate / population if spike.trace_rate else None,
    )


def drain_windows(drain: DrainSpec) -> list[ActiveWindow]:
    """A linear ramp-down to zero approximated by 10 shrinking windows.

    The ramp is cut into 10 segments of floor(ramp_duration_us / 10) µs (at least 1); segment
    i (0..9) starts at start_time_us + i·segment and is active for the first (10 − i)/10 of
    it (whole µs, at least 1). When start_time_us > 0 a full-rate window [0, start_time_us)
    comes first. After the last segment the member is silent.
    """
    segment_us = max(1, drain.ramp_duration_us // DRAIN_SEGMENTS)
    windows = []
    if drain.start_time_us > 0:
        windows.append(ActiveWindow(start_us=0, end_us=drain.start_time_us))
    for i in range(DRAIN_SEGMENTS):
        fraction = (DRAIN_SEGMENTS - i) / DRAIN_SEGMENTS
        start_us = drain.start_time_us + i * segment_us
        active_us = max(1, int(segment_us * fraction))
        windows.append(ActiveWindow(start_us=start_us, end_us=start_us + active_us))
    return windows


def cohort_windows(cohort: CohortSpec) -> list[ActiveWindow]:
    """The lifecycle windows of one cohort member: diurnal, then spike, then drain windows."""
    windows: list[ActiveWindow] = []
    if cohort.diurnal is not None:
        windows.extend(diurnal_windows(cohort.diurnal))
    if cohort.spike is not None:
        windows.append(spike_window(cohort.spike, cohort.population))
    if cohort.drain is not None:
        windows.extend(drain_windows(cohort.drain))
    return windows


_COHORT_ONLY = {"id", "population", "diurnal", "spike", "drain", "prefix_sharing"}


def expand_cohort(cohort: CohortSpec) -> list[ClientSpec]:
    """`population` clients `<id>-<j>`, each with fraction/population and the cohort's windows.

    All other fields are copied; with `prefix_sharing: per_member`, member j's prefix group is
    `<prefix_group>-<j>`, so no two members share a prefix. Members share the cohort's nested
    specs (as BLIS shares its pointers): treat them as read-only.
    """
    fields = cohort.model_dump(exclude=_COHORT_ONLY)
    windows = cohort_windows(cohort)
    if windows:
        fields["lifecycle"] = {"windows": [w.model_dump() for w in windows]}
    # Validate once, then copy: a cohort may have up to 100 000 members.
    template = ClientSpec.model_validate({**fields, "id": cohort.id})
    fraction = cohort.rate_fraction / cohort.population
    per_member = cohort.prefix_sharing == "per_member"

    def member(j: int) -> ClientSpec:
        update: dict = {"id": f"{cohort.id}-{j}", "rate_fraction": fraction}
        if per_member:
            update["prefix_group"] = f"{cohort.prefix_group}-{j}"
        return template.model_copy(update=update)

    return [member(j) for j in range(cohort.population)]


def expand_cohorts(spec: WorkloadSpec) -> list[ClientSpec]:
    """spec.clients followed by every cohort's members, in cohort order."""
    clients = list(spec.clients)
    for cohort in spec.cohorts:
        clients.extend(expand_cohort(cohort))
    return clients


# --- inference-perf ---------------------------------------------------------------------------


def _constant(value: int) -> DistSpec:
    return DistSpec(type="constant", params={"value": float(value)})


def _stage_windows(durations_s: list[int]) -> list[ActiveWindow]:
    windows, offset_us = [], 0
    for duration_s in durations_s:
        windows.append(ActiveWindow(start_us=offset_us, end_us=offset_us + duration_s * US_PER_S))
        offset_us += duration_s * US_PER_S
    return windows


def _session_reasoning(
    rate_per_s: float, duration_s: int, sessions: int, where: str = "inference_perf"
) -> ReasoningSpec:
    """inference-perf multi-turn chat as BLIS maps it: each of N users cycles through
    ceil(R·D/N) rounds, N/R seconds apart, with fixed-length (not accumulated) prompts."""
    max_rounds = max(1, math.ceil(rate_per_s * duration_s / sessions))
    think_us = sessions / rate_per_s * 1e6
    if think_us > MAX_TIME_US:
        duration_us(
            think_us,
            f"{where}: {sessions} sessions at {rate_per_s:g} requests/s: the think time "
            "between a session's rounds",
        )
    think_time_us = int(think_us)
    return ReasoningSpec(
        reason_ratio_distribution=_constant(0),
        multi_turn=MultiTurnSpec(
            max_rounds=max_rounds,
            think_time_us=think_time_us,
            context_growth="",
            single_session=True,
        ),
    )


def expand_inference_perf(spec: WorkloadSpec) -> WorkloadSpec:
    """An `inference_perf` spec as plain clients (BLIS ExpandInferencePerfSpec, BLIS-Mar).

    shared_prefix gives N = num_unique_system_prompts × num_users_per_system_prompt clients
    `prompt-<p>-user-<u>` in prefix group / tenant `prompt-<p>` (prefix_length =
    system_prompt_len), SLO class "batch", Poisson arrivals, constant question_len /
    output_len lengths.

    * one stage: aggregate_rate = its rate, each client 1/N, no lifecycle;
    * several stages: one set of N clients per stage, `stage-<s>-prompt-<p>-user-<u>`, active
      only in that stage's window (stages run back to back from t = 0); aggregate_rate = Σ
      stage rates and fraction = stage rate / N, so after normalisation each stage emits at
      exactly its own rate while it runs.
    * enable_multi_turn_chat: each client is one closed-loop session (single_session) of
      ceil(R·D/N) rounds spaced N/R s apart, fixed-length prompts; category "reasoning".

    Cohorts of the spec are passed through untouched. The horizon, unless the spec gives one,
    is the end of the last stage, and none with multi-turn (the sessions' rounds end it).
    BLIS's single-stage "normalized exponential" arrivals
    (exactly R·D requests spread over the stage) are replaced by Poisson arrivals at the same
    rate.
    """
    try:
        return _expand_inference_perf(spec)
    except ValidationError as exc:
        # A value derived from valid stages can still leave its bounds (the summed rate, a
        # session's rounds): named as the field of the expanded spec it would fill.
        raise ConfigError(format_spec_error(exc, "inference_perf (expanded to clients)")) from None


def _expand_inference_perf(spec: WorkloadSpec) -> WorkloadSpec:
    ip = spec.inference_perf
    if ip is None:
        raise ConfigError("inference_perf: missing; expand_inference_perf needs that section")
    sp = ip.shared_prefix
    n_clients = sp.num_unique_system_prompts * sp.num_users_per_system_prompt
    if n_clients > MAX_INFERENCE_PERF_CLIENTS:
        raise ConfigError(
            f"inference_perf.shared_prefix: invalid client count {n_clients}; "
            "num_unique_system_prompts × num_users_per_system_prompt must be <= "
            f"{MAX_INFERENCE_PERF_CLIENTS}"
        )
    multi_stage = len(ip.stages) > 1
    windows = _stage_windows([s.duration for s in ip.stages]) if multi_stage else [None]
    clients: list[ClientSpec] = []
    for s, stage in enumerate(ip.stages):
        if sp.enable_multi_turn_chat and stage.rate * stage.duration < 1:
            raise ConfigError(
                f"inference_perf.stages[{s}]: invalid rate × duration "
                f"{stage.rate * stage.duration:g}; must give at least 1 request"
            )
        reasoning = (
            _session_reasoning(stage.rate, stage.duration, n_clients, f"inference_perf.stages[{s}]")
            if sp.enable_multi_turn_chat
            else None
        )
        fraction = stage.rate / n_clients if multi_stage else 1.0 / n_clients
        lifecycle = LifecycleSpec(windows=[windows[s]]) if multi_stage else None
        for p in range(sp.num_unique_system_prompts):
            group = f"prompt-{p}"
            for u in range(sp.num_users_per_system_prompt):
                client_id = f"{group}-user-{u}"
                if multi_stage:
                    client_id = f"stage-{s}-{client_id}"
                clients.append(
                    ClientSpec(
                        id=client_id,
                        tenant_id=group,
                        slo_class="batch",
                        rate_fraction=fraction,
                        arrival={"process": "poisson"},
                        input_distribution=_constant(sp.question_len),
                        output_distribution=_constant(sp.output_len),
                        prefix_group=group,
                        prefix_length=sp.system_prompt_len,
                        reasoning=reasoning,
                        lifecycle=lifecycle,
                    )
                )
    aggregate_rate = sum(s.rate for s in ip.stages) if multi_stage else ip.stages[0].rate
    # Independent requests stop at the end of the last stage. Multi-turn sessions need no
    # horizon: their rounds (rate x duration requests in all) end the workload, and a
    # session's last rounds, sent after the stages' end when it ran late, are still sent
    # (inference-perf and BLIS send them all).
    if spec.horizon or sp.enable_multi_turn_chat:
        horizon_us = spec.horizon
    else:
        horizon_us = sum(s.duration for s in ip.stages) * US_PER_S
    return WorkloadSpec(
        version="2",
        seed=spec.seed,
        category="reasoning" if sp.enable_multi_turn_chat else "language",
        aggregate_rate=aggregate_rate,
        horizon=horizon_us,
        num_requests=spec.num_requests,
        clients=clients,
        cohorts=spec.cohorts,  # cohorts compose with any client source
    )
