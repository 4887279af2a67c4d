"""BLIS's workload specification v2 (docs/behaviour.md §9.2), as a strict pydantic schema.

Field names are BLIS's, so an existing BLIS workload file loads unchanged. Version "1" or an
empty version is upgraded as BLIS does (SLO classes realtime → critical, interactive →
standard). Unknown keys are errors naming the key and its parent. Every number has the range
of its kind (simulator/limits.py): a count of requests, tokens, µs, a rate.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic
# would otherwise compile and evaluate each field's annotation text when the class is
# created, a cost every run pays at start-up (docs/performance.md, "Start-up").
import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError, key_text
from ..limits import (
    CV,
    MAX_BANDWIDTH_GB_PER_S,
    MAX_INFERENCE_PERF_CLIENTS,
    MAX_PEAK_TO_TROUGH,
    MAX_RATE_PER_S,
    MAX_TIME_S,
    MAX_TIME_US,
    MAX_TOKENS,
    MIN_RATE_PER_S,
    Flag,
    Milliseconds,
    PositiveRequests,
    PositiveTimeUs,
    PositiveTokens,
    PositiveWholeSeconds,
    Rate,
    Requests,
    Seed,
    TimeUs,
    Tokens,
    WholeSeconds,
    empty_list,
    integer,
    number,
)

log = logging.getLogger("servesim")

SLO_CLASSES = ("", "critical", "standard", "sheddable", "batch", "background")
V1_SLO_CLASSES = {"realtime": "critical", "interactive": "standard"}
DIST_TYPES = (
    "gaussian", "exponential", "pareto_lognormal", "empirical", "constant", "lognormal"
)  # fmt: skip
# Parameters each distribution needs (empirical takes its CDF points from params or `file`).
DIST_PARAMS: dict[str, tuple[str, ...]] = {
    "gaussian": ("mean", "std_dev", "min", "max"),
    "exponential": ("mean",),
    "pareto_lognormal": ("alpha", "xm", "mu", "sigma", "mix_weight"),
    "constant": ("value",),
    "empirical": (),
    "lognormal": ("mu", "sigma"),
}
# Parameters a distribution may have besides the ones it needs: clamps of the drawn length.
DIST_OPTIONAL_PARAMS: dict[str, tuple[str, ...]] = {
    "exponential": ("min", "max"),
    "lognormal": ("min", "max"),
}
DEFAULT_PREFIX_LENGTH = 50
DEFAULT_SESSION_TIMEOUT_US = 300_000_000
MAX_COHORT_POPULATION = 100_000


class _Strict(BaseModel):
    # Schemas are built on first use: a run validates only the models it uses.
    model_config = ConfigDict(extra="forbid", defer_build=True)


# A distribution's parameters are token counts, percentages (reason ratios), log-scale or shape
# numbers, or probabilities (empirical): none needs to exceed a request's token bound.
_Param = number(
    -MAX_TOKENS,
    MAX_TOKENS,
    "",
    "parameters are token counts, percentages, shapes or "
    "probabilities, bounded like a request's tokens (10^8)",
)
_Mbps = number(
    0, MAX_BANDWIDTH_GB_PER_S * 8000, "Mbit/s", "bandwidths are at most 10^6 GB/s (1 PB/s)"
)
_PeakHour = integer(0, 23, "", "an hour of the day")
_PeakToTrough = number(
    1, MAX_PEAK_TO_TROUGH, "", "beyond it the trough hour's window is already 1 µs long"
)
# Each member is a client with its own random streams; a cohort is a way to write many
# clients, not an unbounded population.
_Population = integer(1, MAX_COHORT_POPULATION, "members", "each member is a whole client")
# A fitted gamma/weibull shape or scale (µs): BLIS warns on a value <= 0 and falls back to the
# cv; beyond the clock a scale means no arrival ever comes.
_ShapeOrScale = number(
    -MAX_TIME_US, MAX_TIME_US, "", "a gap's law cannot reach beyond the clock (2^53 µs)"
)
_RateOrZero = number(
    MIN_RATE_PER_S,
    MAX_RATE_PER_S,
    "requests per second",
    "a rate's mean gap must fit the clock; 0 means every rate is absolute",
    zero_off=True,
)
# A rate share: > 0 and at most 10^9. A 0 passes on to the client's own check, which says what
# it needs (a number > 0 unless the client is closed-loop, which may carry a 0); a negative
# weight is refused as "must be > 0", as 0 is.
_RateFractionOrNone = number(
    0,
    MAX_RATE_PER_S,
    "",
    "a weight of rates, which are at most 10^9 per second",
    lo_open=True,
    zero_passes=True,
)
# Seconds that may be negative (BLIS: a negative drain timeout means the default).
_SignedSeconds = integer(-MAX_TIME_S, MAX_TIME_S, "s", "the clock's range in whole seconds")
_PromptCount = integer(
    1, MAX_INFERENCE_PERF_CLIENTS, "", "prompts × users make the clients, at most 1,000,000"
)


class DistSpec(_Strict):
    type: Literal[
        "gaussian", "exponential", "pareto_lognormal", "empirical", "constant", "lognormal"
    ]
    params: dict[str, _Param] = Field(default_factory=dict)
    file: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "DistSpec":
        for name, value in self.params.items():
            if not math.isfinite(value):
                raise ValueError(f"params.{name} must be a finite number, got {value}")
        if self.type == "empirical":
            if not self.params and not self.file:
                raise ValueError("empirical needs `params` {tokens: probability} or `file`")
            return self
        missing = [p for p in DIST_PARAMS[self.type] if p not in self.params]
        if missing:
            raise ValueError(
                f"{self.type} needs params {', '.join(DIST_PARAMS[self.type])}; "
                f"missing {', '.join(missing)}"
            )
        valid = (*DIST_PARAMS[self.type], *DIST_OPTIONAL_PARAMS.get(self.type, ()))
        extra = sorted(set(self.params) - set(valid))
        if extra:
            raise ValueError(
                f"{self.type}: unknown params {', '.join(extra)}; valid: {', '.join(valid)}"
            )
        lo, hi = self.params.get("min"), self.params.get("max")
        if self.type in DIST_OPTIONAL_PARAMS and lo is not None and hi is not None and lo > hi:
            raise ValueError(f"{self.type}: min ({lo:g}) must be <= max ({hi:g})")
        return self


class ArrivalSpec(_Strict):
    """An arrival process. gamma and weibull take their law from `cv` and the client's rate,
    or, when `shape` and `scale` (µs) are both given and > 0, from those two alone: the
    fitted parameters of a ServeGen chunk, which then fix the mean gap whatever the rate."""

    process: Literal["poisson", "gamma", "weibull", "constant"]
    cv: CV | None = None
    shape: _ShapeOrScale | None = None
    scale: _ShapeOrScale | None = Field(None, description="µs")

    @model_validator(mode="after")
    def _check(self) -> "ArrivalSpec":
        if self.cv is not None and not math.isfinite(self.cv):
            raise ValueError(f"cv must be a finite number, got {self.cv}")
        if (
            self.process == "weibull"
            and self.cv is not None
            and not self.fitted
            and not 0.01 <= self.cv <= 10.4
        ):
            raise ValueError(f"weibull cv must be in [0.01, 10.4], got {self.cv}")
        return self

    @property
    def fitted(self) -> bool:
        """Do shape and scale replace the cv/rate law (both given and > 0)?"""
        return bool(self.shape and self.scale and self.shape > 0 and self.scale > 0)


class GoodputTargets(_Strict):
    """One SLO class's goodput targets, ms; 0 (or absent) = no target on that metric."""

    ttft_ms: Milliseconds = 0.0
    itl_ms: Milliseconds = 0.0
    e2e_ms: Milliseconds = 0.0


class NetworkSpec(_Strict):
    rtt_ms: Milliseconds = 0.0
    bandwidth_mbps: _Mbps = 0.0


class ActiveWindow(_Strict):
    """A client's activity window [start_us, end_us). The optional overrides make the window
    a period of its own (BLIS's time-varying generation, docs/workloads.md): its own rate
    (`trace_rate`, req/s), arrival process and length laws instead of the client's."""

    start_us: TimeUs
    end_us: TimeUs
    trace_rate: Rate | None = Field(None, description="req/s")
    arrival: ArrivalSpec | None = None
    input_distribution: DistSpec | None = None
    output_distribution: DistSpec | None = None

    @model_validator(mode="after")
    def _order(self) -> "ActiveWindow":
        if self.end_us <= self.start_us:
            raise ValueError(f"end_us ({self.end_us}) must be > start_us ({self.start_us})")
        return self

    @property
    def overrides(self) -> bool:
        """Does the window change the client's traffic (rate, arrivals or lengths)?"""
        return any(
            v is not None
            for v in (self.trace_rate, self.arrival, self.input_distribution,
                      self.output_distribution)
        )  # fmt: skip


class LifecycleSpec(_Strict):
    windows: list[ActiveWindow] = Field(min_length=1)


class MultimodalSpec(_Strict):
    text_distribution: DistSpec | None = None
    image_distribution: DistSpec | None = None
    image_count_distribution: DistSpec | None = None
    audio_distribution: DistSpec | None = None
    audio_count_distribution: DistSpec | None = None
    video_distribution: DistSpec | None = None
    video_count_distribution: DistSpec | None = None


class MultiTurnSpec(_Strict):
    max_rounds: PositiveRequests
    think_time_us: TimeUs = 0
    context_growth: Literal["", "accumulate"] = ""
    single_session: Flag = False


class ReasoningSpec(_Strict):
    reason_ratio_distribution: DistSpec | None = None
    multi_turn: MultiTurnSpec | None = None


class _ClientFields(_Strict):
    """Fields shared by clients and cohorts."""

    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    # Required (> 0) for open-loop traffic; a closed-loop (`concurrency`) client has none.
    rate_fraction: _RateFractionOrNone | None = None
    arrival: ArrivalSpec | None = None
    input_distribution: DistSpec
    output_distribution: DistSpec
    prefix_group: str = ""
    prefix_length: Tokens | None = None
    streaming: Flag = False
    network: NetworkSpec | None = None
    multimodal: MultimodalSpec | None = None
    reasoning: ReasoningSpec | None = None
    timeout: TimeUs | None = Field(None, description="µs; None = 300 s for sessions")
    closed_loop: Flag | None = None
    # Each request's TTFT target (µs; 0 = none). BLIS orders its flow-control gateway by it;
    # servesim has no gateway, so it is carried on the trace export only (docs/workloads.md).
    slo_target_us: TimeUs = 0
    # The LoRA adapter every request of this client asks for ("" = the base model); served
    # only when the scenario declares it (`lora`, docs/lora.md). BLIS's field name.
    adapter: str = Field("", max_length=200)

    @field_validator("slo_class")
    @classmethod
    def _slo(cls, v: str) -> str:
        if v not in SLO_CLASSES:
            raise ValueError(
                f"unknown slo_class {v!r}; valid: critical, standard, sheddable, batch, "
                "background, or empty"
            )
        return v

    @property
    def multi_turn(self) -> MultiTurnSpec | None:
        return self.reasoning.multi_turn if self.reasoning else None

    @property
    def is_closed_loop(self) -> bool:
        """Multi-turn clients are closed-loop unless told otherwise (BLIS default)."""
        if self.multi_turn is None:
            return False
        return True if self.closed_loop is None else self.closed_loop

    @property
    def concurrency_users(self) -> int:
        """Virtual users of a closed-loop client (0 for open-loop traffic)."""
        return 0

    def timeout_us(self) -> int:
        """Client deadline after arrival in µs; 0 = none. Sessions and closed-loop users
        default to 300 s, as in BLIS."""
        if self.timeout is not None:
            return self.timeout
        if self.multi_turn is not None or self.concurrency_users:
            return DEFAULT_SESSION_TIMEOUT_US
        return 0

    def _check_traffic(self) -> None:
        """Open-loop traffic needs a rate share and an arrival process."""
        if self.concurrency_users:
            return
        if not self.rate_fraction:
            raise ValueError(
                "rate_fraction: required (a number > 0) unless the client sets concurrency "
                "(closed loop)"
            )
        if self.arrival is None:
            raise ValueError(
                "arrival: required (e.g. {process: poisson}) unless the client sets "
                "concurrency (closed loop)"
            )


class ClientSpec(_ClientFields):
    """One client. With `concurrency: N` it is closed-loop: N virtual users, each sending its
    next request `think_time_us` after its previous one finished (no rate, no arrival)."""

    id: str = ""
    lifecycle: LifecycleSpec | None = None
    concurrency: Requests | None = Field(None, description="virtual users; 0 = open loop")
    think_time_us: TimeUs = 0

    @property
    def concurrency_users(self) -> int:
        return self.concurrency or 0

    @model_validator(mode="after")
    def _closed_loop(self) -> "ClientSpec":
        if self.concurrency_users:
            if self.rate_fraction:
                raise ValueError(
                    "concurrency and rate_fraction are mutually exclusive: a closed-loop "
                    "client sends as its users finish, not at a rate"
                )
            if self.multi_turn is not None:
                raise ValueError(
                    "concurrency and reasoning.multi_turn are mutually exclusive: a "
                    "closed-loop user is already a session of its own"
                )
            if self.lifecycle is not None:
                raise ValueError(
                    "concurrency and lifecycle are mutually exclusive: closed-loop users run "
                    "for the whole workload"
                )
        self._check_traffic()
        return self


class DiurnalSpec(_Strict):
    peak_hour: _PeakHour
    peak_to_trough_ratio: _PeakToTrough


def _ends_on_clock(start_us: int, length_us: int, length_name: str) -> None:
    # The window [start, start + length) is built from the sum; it must stay on the clock.
    if start_us + length_us > MAX_TIME_US:
        raise ValueError(
            f"start_time_us + {length_name} = {start_us + length_us:,} µs; at most "
            f"{MAX_TIME_US:,} µs (the clock's range, about 285 years)"
        )


class SpikeSpec(_Strict):
    start_time_us: TimeUs
    duration_us: PositiveTimeUs
    # The cohort's whole rate during the spike (req/s), shared equally by its members.
    trace_rate: Rate | None = Field(None, description="req/s")

    @model_validator(mode="after")
    def _end(self) -> "SpikeSpec":
        _ends_on_clock(self.start_time_us, self.duration_us, "duration_us")
        return self


class DrainSpec(_Strict):
    start_time_us: TimeUs
    ramp_duration_us: PositiveTimeUs

    @model_validator(mode="after")
    def _end(self) -> "DrainSpec":
        _ends_on_clock(self.start_time_us, self.ramp_duration_us, "ramp_duration_us")
        return self


class CohortSpec(_ClientFields):
    id: str = ""
    population: _Population
    diurnal: DiurnalSpec | None = None
    spike: SpikeSpec | None = None
    drain: DrainSpec | None = None
    # `shared`: every member uses the cohort's prefix group; `per_member`: member j uses
    # group `<prefix_group>-<j>`, a prefix of its own.
    prefix_sharing: Literal["shared", "per_member"] = "shared"

    @model_validator(mode="after")
    def _check(self) -> "CohortSpec":
        if self.prefix_sharing == "per_member" and not self.prefix_group:
            raise ValueError("prefix_sharing per_member needs a prefix_group")
        self._check_traffic()
        return self


class ServeGenDataSpec(_Strict):
    """A ServeGen data folder. With none of the period keys, one span of it becomes one
    client per chunk (BLIS-Mar). Any of `window_duration_secs`, `drain_timeout_secs` or
    `time_window` selects the multi-period conversion of current BLIS: midnight, morning
    and afternoon periods as cohorts per SLO class (docs/workloads.md)."""

    path: str
    span_start: WholeSeconds = 0
    span_end: WholeSeconds = 0
    window_duration_secs: WholeSeconds | None = Field(None, description="s; default 600")
    # Negative means the default gap, 180 s, as BLIS; 0 means no gap.
    drain_timeout_secs: _SignedSeconds | None = Field(None, description="s; default 180")
    time_window: Literal["", "midnight", "morning", "afternoon"] = ""

    @property
    def multi_period(self) -> bool:
        return (
            self.window_duration_secs is not None
            or self.drain_timeout_secs is not None
            or bool(self.time_window)
        )


class StageSpec(_Strict):
    rate: Rate = Field(description="req/s")
    duration: PositiveWholeSeconds = Field(description="s")


class SharedPrefixSpec(_Strict):
    num_unique_system_prompts: _PromptCount
    num_users_per_system_prompt: _PromptCount
    system_prompt_len: Tokens
    question_len: PositiveTokens
    output_len: PositiveTokens
    enable_multi_turn_chat: Flag = False


class InferencePerfSpec(_Strict):
    stages: list[StageSpec] = Field(min_length=1)
    shared_prefix: SharedPrefixSpec

    @model_validator(mode="after")
    def _length(self) -> "InferencePerfSpec":
        # Stages run back to back from t = 0: together they must stay on the clock.
        total_s = sum(stage.duration for stage in self.stages)
        if total_s > MAX_TIME_S:
            raise ValueError(
                f"stages: durations add up to {total_s:,} s; at most {MAX_TIME_S:,} s (the "
                "clock's range, 2^53 µs, about 285 years)"
            )
        return self


class WorkloadSpec(_Strict):
    """A whole v2 workload: clients (and cohorts) with their shares of an aggregate rate."""

    # Built at import, not on first use: every run validates one of these on its own (the
    # scenario's traffic becomes one, `api.workload_spec_of`), and the scenario's schema, built
    # later, then reuses this one instead of generating it a second time.
    model_config = ConfigDict(extra="forbid", defer_build=False)

    version: str = "2"
    seed: Seed | None = None
    category: Literal["", "language", "multimodal", "reasoning"] = ""
    # 0 (or absent) only when every rate is absolute (`absolute_rates`) or every client is
    # closed-loop.
    aggregate_rate: _RateOrZero | None = Field(None, description="req/s over all clients")
    horizon: PositiveTimeUs | None = Field(None, description="µs")
    num_requests: Requests | None = Field(None, description="0 or None = unlimited")
    clients: list[ClientSpec] = Field(default_factory=empty_list)
    cohorts: list[CohortSpec] = Field(default_factory=empty_list)
    servegen_data: ServeGenDataSpec | None = None
    inference_perf: InferencePerfSpec | None = None
    # Per SLO class ("default" for requests without one): the targets goodput and SLO
    # attainment are judged against, unless the scenario's `slo` sets that class's metric.
    goodput_slo_targets: dict[str, GoodputTargets] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _upgrade_v1(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        version = data.get("version")
        version = "" if version is None else str(version)
        if version in ("", "1"):
            data = dict(data)
            data["version"] = "2"
            raw_clients = data.get("clients")
            if not isinstance(raw_clients, list):
                return data  # not a list of clients: validation names the field
            clients = []
            for client in raw_clients:
                old_class = client.get("slo_class") if isinstance(client, dict) else None
                if isinstance(old_class, str) and old_class in V1_SLO_CLASSES:
                    old = client["slo_class"]
                    client = {**client, "slo_class": V1_SLO_CLASSES[old]}
                    log.warning("deprecated SLO class %r mapped to %r", old, client["slo_class"])
                clients.append(client)
            if "clients" in data:
                data["clients"] = clients
        else:
            data = {**data, "version": version}
        return data

    @model_validator(mode="after")
    def _check(self) -> "WorkloadSpec":
        if self.version != "2":
            raise ValueError(f"version: invalid value {self.version!r}; valid: 1, 2 or empty")
        sources = [
            name
            for name, present in (
                ("clients", bool(self.clients)),
                ("servegen_data", self.servegen_data is not None),
                ("inference_perf", self.inference_perf is not None),
            )
            if present
        ]
        if len(sources) > 1:
            raise ValueError(f"{' and '.join(sources)} are mutually exclusive; give one")
        if not sources and not self.cohorts:
            raise ValueError("at least one client, cohort, servegen_data or inference_perf needed")
        members = (*self.clients, *self.cohorts)
        closed = [c for c in self.clients if c.concurrency_users]
        if closed and any(c.multi_turn is not None for c in members):
            raise ValueError(
                "closed-loop (concurrency) clients and multi-turn clients cannot share a "
                "workload; give them separate runs"
            )
        open_loop = [c for c in members if not c.concurrency_users]
        if open_loop and not self.aggregate_rate and not self.absolute_rates:
            raise ValueError(
                "aggregate_rate (req/s) is required with open-loop clients or cohorts, unless "
                "every rate is absolute (each client's lifecycle windows and each cohort's "
                "spike give a trace_rate)"
            )
        return self

    @property
    def absolute_rates(self) -> bool:
        """BLIS's absolute rate mode: every open-loop client's windows and every cohort's
        spike carry their own trace_rate (req/s), so no aggregate rate is needed."""
        clients = [c for c in self.clients if not c.concurrency_users]
        return all(
            c.lifecycle is not None and all(w.trace_rate for w in c.lifecycle.windows)
            for c in clients
        ) and all(
            c.spike is not None and c.spike.trace_rate and c.diurnal is None and c.drain is None
            for c in self.cohorts
        )

    @property
    def open_loop(self) -> bool:
        """Has the spec open-loop traffic (a client without `concurrency`, a cohort)? The
        sections a converter expands (servegen_data, inference_perf) are not looked into."""
        return bool(self.cohorts) or any(not c.concurrency_users for c in self.clients)

    @property
    def absolute_rate_mode(self) -> bool:
        """Is the spec's open-loop traffic given in absolute rates: no aggregate_rate (absent or
        0) and every rate a trace_rate in req/s? (`absolute_rates` alone is also true of a spec
        with no open-loop client, which has no rates at all.)"""
        return self.open_loop and not self.aggregate_rate and self.absolute_rates

    @property
    def has_sessions(self) -> bool:
        """Are there sessions whose next request waits for the previous one (multi-turn
        clients, closed-loop users)?"""
        return any(c.multi_turn is not None for c in (*self.clients, *self.cohorts)) or any(
            c.concurrency_users for c in self.clients
        )


# Fields that a model-level check names at the start of its message ("rate_fraction: ..."):
# the error's place then ends with that field, as a field check's would.
FIELD_MESSAGES = frozenset(
    {"rate_fraction", "arrival", "think_time", "value", "mean", "stdev", "min", "max"}
)

# Names pydantic inserts into error locations for tagged unions (the scenario's workload).
_UNION_TAGS = frozenset({"synthetic", "v2"})

# Keys that only a v2 workload spec has: in a scenario's workload, their presence selects the
# v2 schema over the synthetic one.
V2_ONLY_KEYS = frozenset(
    {"version", "clients", "cohorts", "aggregate_rate", "inference_perf", "servegen_data",
     "category", "horizon", "seed"}
)  # fmt: skip


def _location(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = key_text(part)  # a user's key may hold anything, line breaks included
        out += f".{name}" if out else name
    return out


def model_classes(annotation: object) -> list[type[BaseModel]]:
    """The pydantic model classes inside a field annotation (unions, lists, Annotated,
    Optional)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [c for arg in typing.get_args(annotation) for c in model_classes(arg)]


def _members(annotation: object) -> list[object]:
    """The alternatives of an annotation: a union's members, Annotated and Optional unwrapped."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


def _step(annotation: object, part: str | int) -> list[object]:
    """The annotations that `part` of an error's location reaches from `annotation`."""
    import collections.abc
    import typing

    out: list[object] = []
    for m in _members(annotation):
        origin, args = typing.get_origin(m), typing.get_args(m)
        if origin in (dict, collections.abc.Mapping) and len(args) == 2:
            # A mapping's key is the user's (`slo.classes.batch`), not a field name: the step
            # lands on the value's type, whatever the key.
            out.append(args[1])
        elif isinstance(part, int):
            if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
                out.extend(a for a in args if a is not Ellipsis)
        elif isinstance(m, type) and issubclass(m, BaseModel):
            out.extend(
                f.annotation for name, f in m.model_fields.items() if part in (name, f.alias)
            )
    return out


def _classes_at(model: type, loc: tuple) -> list[type[BaseModel]]:
    """The models that may hold `loc`'s last step, walking from `model` through nested
    models, list items, mapping values and union members; [] where the walk cannot follow (a
    free-form mapping, a tagged union's member it cannot tell)."""
    annotations: list[object] = [model]
    for part in loc[:-1]:
        annotations = [a for ann in annotations for a in _step(ann, part)]
        if not annotations:
            return []
    return [
        m
        for a in annotations
        for m in _members(a)
        if isinstance(m, type) and issubclass(m, BaseModel)
    ]


def _keys_of(classes: list[type[BaseModel]]) -> list[str]:
    return sorted({f.alias or name for c in classes for name, f in c.model_fields.items()})


def format_spec_error(exc: ValidationError, source: str, model: type | None = None) -> str:
    """Pydantic's errors as one line: each problem's place, message and the value (excerpted),
    the first few of them (a list of a million bad items must not make a million-item line).
    With the validated `model`, an unknown key is told with the keys allowed there and the
    nearest of them."""
    from ..errors import excerpt, one_line, shorten

    most = 8
    errors = exc.errors()
    parts = []
    for err in errors[:most]:
        loc = tuple(
            p for p in err["loc"] if not str(p).startswith("function-") and p not in _UNION_TAGS
        )
        if err["type"] == "extra_forbidden" and loc:
            parent = shorten(_location(loc[:-1]) or "(top level)", 120)
            classes = _classes_at(model, loc) if model is not None else []
            # The workload's form matters only for a key of the workload itself: deeper (a
            # client's key) the walk has reached the one model that holds it.
            raw = [p for p in err["loc"] if not str(p).startswith("function-")]
            form = raw[-2] if len(raw) >= 2 and raw[-2] in _UNION_TAGS else None
            if form is not None:
                # The workload's two forms: the keys of the one it was read as.
                read_as = [c for c in classes if (c is WorkloadSpec) == (form == "v2")]
                if loc[-1] in _keys_of(classes):
                    # A key of the other form: said as such, not as a typo of itself.
                    parts.append(_other_form_key(parent, loc[-1], form, read_as))
                    continue
                classes = read_as
            known = _keys_of(classes)
            hint = ""
            if known:
                import difflib

                near = difflib.get_close_matches(str(loc[-1]), known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                hint += "; valid: " + shorten(", ".join(known), 400)
            parts.append(f"{parent}: unknown key {excerpt(loc[-1], 60)}{hint}")
            continue
        text = str(err["msg"]).removeprefix("Value error, ")
        if len(loc) >= 2 and loc[-1] == "[key]":
            # pydantic places a mapping key's error at (..., key, "[key]"): the key is the
            # value at fault, in the mapping's place, not a field of a field named after it.
            where = shorten(_location(loc[:-2]) or "(top level)", 120)
            parts.append(f"{where}: key {excerpt(loc[-2], 60)}: {shorten(one_line(text), 300)}")
            continue
        field, sep, rest = text.partition(": ")
        if sep and field in FIELD_MESSAGES:
            # A model-level check about one of its fields: name the field in the place.
            loc, text = (*loc, field), rest
        where = shorten(_location(loc) or "(top level)", 120)
        # A validator's message may quote a user's value with its line breaks.
        msg = shorten(one_line(text), 300)
        value = err.get("input")
        # A section's own checks quote what they need: the whole mapping or list is shown
        # only when its type is the fault (a list where a mapping belongs).
        whole = isinstance(value, dict | list) and not str(err["type"]).endswith("_type")
        shown = "" if whole else f" (got {excerpt(value)})"
        parts.append(f"{where}: {msg}{shown}")
    if len(errors) > most:
        parts.append(f"… and {len(errors) - most} more problem(s)")
    return f"{one_line(str(source))}: " + "; ".join(parts)


def _other_form_key(parent: str, key: str, form: str, read_as: list) -> str:
    """The message for a key of the other form of a scenario's workload (synthetic or v2)."""
    from ..errors import excerpt, shorten

    why = f" (it has one of {', '.join(sorted(V2_ONLY_KEYS))})" if form == "v2" else ""
    return (
        f"{parent}: key {excerpt(key, 60)} belongs to the other form of workload and cannot "
        f"be combined with the keys given; read as a {form} workload{why}, its keys are "
        + shorten(", ".join(_keys_of(read_as)), 400)
    )


def workload_spec_from_dict(data: dict, source: str = "workload spec") -> "WorkloadSpec":
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, source, WorkloadSpec)) from None


def load_workload_spec(path: str | Path) -> "WorkloadSpec":
    """Read a BLIS v2 (or v1) workload YAML file strictly."""
    from ..input_files import read_yaml_mapping

    return workload_spec_from_dict(read_yaml_mapping(path, "workload spec"), source=str(path))
