"""The Python entry points: resolve a Scenario into a deployment, build traffic, run."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .catalog.defaults import lookup_coefficients, model_defaults
from .catalog.hardware import get_gpu, load_gpu_file
from .catalog.models import load_model, validate_tp
from .catalog.types import GPUSpec, ModelConfig
from .cluster.cluster import run_simulation
from .engine.batching import EngineConfig
from .engine.policies import make_priority_policy, make_scheduler
from .engine.request import Request
from .errors import ConfigError
from .latency import build_step_time_model
from .latency.base import StepTimeModel
from .latency.kv_capacity import compute_kv_blocks, derive_max_model_len
from .metrics.results import Result
from .scenario import (
    Scenario,
    TraceSpec,
    WorkloadSpec,
    apply_overrides,
    load_scenario,
    scenario_from_dict,
)
from .workload.synthetic import generate_requests
from .workload.trace import load_trace

log = logging.getLogger("servesim")

FALLBACK_KV_BLOCKS = 1_000_000
# Backends whose step time comes from the model's shape; they get an auto-derived context limit.
ANALYTICAL_BACKENDS = frozenset({"roofline"})
DEFAULT_REPLAY_HORIZON_US = 600_000_000


@dataclass
class Deployment:
    """A scenario's deployment, fully resolved: what one instance is and how it is priced."""

    model: ModelConfig
    gpu: GPUSpec
    tp: int
    step_model: StepTimeModel
    engine: EngineConfig
    kv_blocks_source: str

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "hardware": self.gpu.name,
            "tp": self.tp,
            "latency_model": self.step_model.name,
            "total_kv_blocks": self.engine.total_kv_blocks,
            "kv_blocks_source": self.kv_blocks_source,
            "max_model_len": self.engine.max_model_len,
        }


def as_scenario(scenario: Scenario | dict | str | Path) -> Scenario:
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return scenario_from_dict(scenario)
    return load_scenario(scenario)


def resolve_deployment(scenario: Scenario) -> Deployment:
    """Model, GPU, TP, step-time model and engine settings, with BLIS's precedence rules."""
    model = load_model(scenario.model)
    defaults = model_defaults(model.name) or {}
    hardware = scenario.hardware or defaults.get("GPU") or "H100"
    extra = load_gpu_file(scenario.hardware_file) if scenario.hardware_file else None
    gpu = get_gpu(hardware, extra)
    tp = scenario.tp or int(defaults.get("tensor_parallelism") or 1)
    validate_tp(model, tp)
    lat = scenario.latency
    step_model = build_step_time_model(
        lat.model, model, gpu, tp, lat.alpha_coeffs, lat.beta_coeffs, lat.vllm_version
    )
    eng = scenario.engine
    make_scheduler(eng.scheduler)
    make_priority_policy(eng.priority_policy)
    total_blocks, source = _total_kv_blocks(scenario, model, gpu, tp)
    max_model_len = eng.max_model_len
    if max_model_len is None:
        max_model_len = (
            derive_max_model_len(model, total_blocks, eng.block_size_tokens)
            if lat.model in ANALYTICAL_BACKENDS
            else 0
        )
    engine = EngineConfig(
        total_kv_blocks=total_blocks,
        block_size=eng.block_size_tokens,
        max_num_running_reqs=eng.max_num_running_reqs,
        max_num_scheduled_tokens=eng.max_num_scheduled_tokens,
        long_prefill_token_threshold=eng.long_prefill_token_threshold,
        max_model_len=max_model_len,
        scheduler=eng.scheduler,
        priority_policy=eng.priority_policy,
        enable_prefix_caching=eng.enable_prefix_caching,
    )
    return Deployment(model, gpu, tp, step_model, engine, source)


def _total_kv_blocks(
    scenario: Scenario, model: ModelConfig, gpu: GPUSpec, tp: int
) -> tuple[int, str]:
    """Explicit > measured defaults.yaml entry > auto-calculation > 1,000,000 (SPEC §2.5)."""
    eng = scenario.engine
    if eng.total_kv_blocks is not None:
        return eng.total_kv_blocks, "explicit"
    version = scenario.latency.vllm_version or (model_defaults(model.name) or {}).get(
        "vllm_version"
    )
    entry = lookup_coefficients(model.name, gpu.name, tp, version)
    if entry is not None and entry.total_kv_blocks:
        return entry.total_kv_blocks, "defaults.yaml"
    try:
        blocks = compute_kv_blocks(
            model, gpu, tp, eng.block_size_tokens, eng.gpu_memory_utilization
        )
        return blocks, "auto"
    except ConfigError as exc:
        log.warning("KV capacity auto-calculation failed (%s); using %d blocks", exc, 1_000_000)
        return FALLBACK_KV_BLOCKS, "fallback"


def build_requests(scenario: Scenario) -> list[Request]:
    if scenario.trace is not None:
        _, requests = load_trace(scenario.trace.header, scenario.trace.data)
        return requests
    return generate_requests(scenario.workload or WorkloadSpec(), scenario.seed)


def _horizon(scenario: Scenario, requests: list[Request]) -> int | None:
    if scenario.horizon_us is not None:
        return scenario.horizon_us
    if scenario.trace is not None:
        # BLIS replay: twice the latest arrival (600 s if every request arrives at 0).
        latest = max((r.arrival_us for r in requests), default=0)
        return 2 * latest if latest > 0 else DEFAULT_REPLAY_HORIZON_US
    return None


def simulate(scenario: Scenario | dict | str | Path, **overrides: Any) -> Result:
    """Run one scenario (object, dict or YAML path); keyword overrides use dotted paths with
    `__` for dots, e.g. simulate("x.yaml", engine__scheduler="sjf")."""
    sc = as_scenario(scenario)
    if overrides:
        sc = apply_overrides(sc, {k.replace("__", "."): v for k, v in overrides.items()})
    deployment = resolve_deployment(sc)
    requests = build_requests(sc)
    info = sc.model_dump(mode="json")
    info["resolved"] = deployment.describe()
    return run_simulation(
        requests, deployment.engine, deployment.step_model, _horizon(sc, requests), info
    )


def replay(
    trace_header: str | Path,
    trace_data: str | Path,
    scenario: Scenario | dict | str | Path | None = None,
    **overrides: Any,
) -> Result:
    """Simulate exactly the requests of a TraceV2 pair (arrival times and token counts)."""
    sc = as_scenario(scenario) if scenario is not None else Scenario()
    sc = sc.model_copy(update={"workload": None})
    sc.trace = TraceSpec(header=Path(trace_header), data=Path(trace_data))
    return simulate(sc, **overrides)
