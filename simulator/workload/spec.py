"""BLIS's workload specification v2 (SPEC §9.2), as a strict pydantic schema.

Field names are BLIS's, so an existing BLIS workload file loads unchanged. Version "1" or an
empty version is upgraded as BLIS does (SLO classes realtime → critical, interactive →
standard). Unknown keys are errors naming the key and its parent.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError

log = logging.getLogger("servesim")

SLO_CLASSES = ("", "critical", "standard", "sheddable", "batch", "background")
V1_SLO_CLASSES = {"realtime": "critical", "interactive": "standard"}
DIST_TYPES = ("gaussian", "exponential", "pareto_lognormal", "empirical", "constant")
# Parameters each distribution needs (empirical takes its CDF points from params or `file`).
DIST_PARAMS: dict[str, tuple[str, ...]] = {
    "gaussian": ("mean", "std_dev", "min", "max"),
    "exponential": ("mean",),
    "pareto_lognormal": ("alpha", "xm", "mu", "sigma", "mix_weight"),
    "constant": ("value",),
    "empirical": (),
}
DEFAULT_PREFIX_LENGTH = 50
DEFAULT_SESSION_TIMEOUT_US = 300_000_000
MAX_COHORT_POPULATION = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DistSpec(_Strict):
    type: Literal["gaussian", "exponential", "pareto_lognormal", "empirical", "constant"]
    params: dict[str, float] = Field(default_factory=dict)
    file: str | None = None

    @model_validator(mode="after")
    def _check(self) -> DistSpec:
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
        extra = sorted(set(self.params) - set(DIST_PARAMS[self.type]))
        if extra:
            raise ValueError(
                f"{self.type}: unknown params {', '.join(extra)}; "
                f"valid: {', '.join(DIST_PARAMS[self.type])}"
            )
        return self


class ArrivalSpec(_Strict):
    process: Literal["poisson", "gamma", "weibull", "constant"]
    cv: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> ArrivalSpec:
        if self.cv is not None and not math.isfinite(self.cv):
            raise ValueError(f"cv must be a finite number, got {self.cv}")
        if self.process == "weibull" and self.cv is not None and not 0.01 <= self.cv <= 10.4:
            raise ValueError(f"weibull cv must be in [0.01, 10.4], got {self.cv}")
        return self


class NetworkSpec(_Strict):
    rtt_ms: float = Field(0.0, ge=0)
    bandwidth_mbps: float = Field(0.0, ge=0)


class ActiveWindow(_Strict):
    start_us: int = Field(ge=0)
    end_us: int = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> ActiveWindow:
        if self.end_us <= self.start_us:
            raise ValueError(f"end_us ({self.end_us}) must be > start_us ({self.start_us})")
        return self


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
    max_rounds: int = Field(ge=1)
    think_time_us: int = Field(0, ge=0)
    context_growth: Literal["", "accumulate"] = ""
    single_session: bool = False


class ReasoningSpec(_Strict):
    reason_ratio_distribution: DistSpec | None = None
    multi_turn: MultiTurnSpec | None = None


class _ClientFields(_Strict):
    """Fields shared by clients and cohorts."""

    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    rate_fraction: float = Field(gt=0)
    arrival: ArrivalSpec
    input_distribution: DistSpec
    output_distribution: DistSpec
    prefix_group: str = ""
    prefix_length: int | None = Field(None, ge=0)
    streaming: bool = False
    network: NetworkSpec | None = None
    multimodal: MultimodalSpec | None = None
    reasoning: ReasoningSpec | None = None
    timeout: int | None = Field(None, ge=0, description="µs; None = 300 s for sessions")
    closed_loop: bool | None = None

    @field_validator("slo_class")
    @classmethod
    def _slo(cls, v: str) -> str:
        if v not in SLO_CLASSES:
            raise ValueError(
                f"unknown slo_class {v!r}; valid: critical, standard, sheddable, batch, "
                "background, or empty"
            )
        return v

    @field_validator("rate_fraction")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v}")
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

    def timeout_us(self) -> int:
        """Client deadline after arrival in µs; 0 = none."""
        if self.timeout is not None:
            return self.timeout
        return DEFAULT_SESSION_TIMEOUT_US if self.multi_turn is not None else 0


class ClientSpec(_ClientFields):
    id: str = ""
    lifecycle: LifecycleSpec | None = None


class DiurnalSpec(_Strict):
    peak_hour: int = Field(ge=0, le=23)
    peak_to_trough_ratio: float = Field(ge=1.0)


class SpikeSpec(_Strict):
    start_time_us: int = Field(ge=0)
    duration_us: int = Field(gt=0)


class DrainSpec(_Strict):
    start_time_us: int = Field(ge=0)
    ramp_duration_us: int = Field(gt=0)


class CohortSpec(_ClientFields):
    id: str = ""
    population: int = Field(gt=0, le=MAX_COHORT_POPULATION)
    diurnal: DiurnalSpec | None = None
    spike: SpikeSpec | None = None
    drain: DrainSpec | None = None


class ServeGenDataSpec(_Strict):
    path: str
    span_start: int = Field(0, ge=0)
    span_end: int = Field(0, ge=0)


class StageSpec(_Strict):
    rate: float = Field(gt=0, description="req/s")
    duration: int = Field(gt=0, description="s")


class SharedPrefixSpec(_Strict):
    num_unique_system_prompts: int = Field(gt=0)
    num_users_per_system_prompt: int = Field(gt=0)
    system_prompt_len: int = Field(ge=0)
    question_len: int = Field(gt=0)
    output_len: int = Field(gt=0)
    enable_multi_turn_chat: bool = False


class InferencePerfSpec(_Strict):
    stages: list[StageSpec] = Field(min_length=1)
    shared_prefix: SharedPrefixSpec


class WorkloadSpec(_Strict):
    """A whole v2 workload: clients (and cohorts) with their shares of an aggregate rate."""

    version: str = "2"
    seed: int | None = Field(None, ge=0)
    category: Literal["", "language", "multimodal", "reasoning"] = ""
    aggregate_rate: float | None = Field(None, gt=0, description="req/s over all clients")
    horizon: int | None = Field(None, gt=0, description="µs")
    num_requests: int | None = Field(None, ge=0, description="0 or None = unlimited")
    clients: list[ClientSpec] = Field(default_factory=list)
    cohorts: list[CohortSpec] = Field(default_factory=list)
    servegen_data: ServeGenDataSpec | None = None
    inference_perf: InferencePerfSpec | None = None

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
    def _check(self) -> WorkloadSpec:
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
        if (self.clients or self.cohorts) and self.aggregate_rate is None:
            raise ValueError("aggregate_rate (req/s) is required with clients or cohorts")
        return self

    @property
    def has_sessions(self) -> bool:
        return any(c.multi_turn is not None for c in (*self.clients, *self.cohorts))


# Names pydantic inserts into error locations for tagged unions (the scenario's workload).
_UNION_TAGS = frozenset({"synthetic", "v2"})


def _location(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        # A user's key may hold anything, line breaks included: quote any odd one.
        name = str(part)
        if not name or not name.isprintable() or any(c in name for c in " .[]"):
            name = repr(name)
        out += f".{name}" if out else name
    return out


def format_spec_error(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        loc = tuple(
            p for p in err["loc"] if not str(p).startswith("function-") and p not in _UNION_TAGS
        )
        if err["type"] == "extra_forbidden":
            parent = _location(loc[:-1]) or "(top level)"
            parts.append(f"{parent}: unknown key {loc[-1]!r}")
            continue
        where = _location(loc) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
        parts.append(f"{where}: {msg}{shown}")
    return f"{source}: " + "; ".join(parts)


def workload_spec_from_dict(data: dict, source: str = "workload spec") -> WorkloadSpec:
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, source)) from None


def load_workload_spec(path: str | Path) -> WorkloadSpec:
    """Read a BLIS v2 (or v1) workload YAML file strictly."""
    from ..yamlfiles import read_yaml_mapping

    return workload_spec_from_dict(read_yaml_mapping(path, "workload spec"), source=str(path))
