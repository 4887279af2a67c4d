"""The Python entry points: resolve a Scenario into a deployment, build traffic, run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from os import PathLike, fspath
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .catalog.defaults import lookup_coefficients, model_defaults
from .catalog.hardware import get_gpu, load_gpu_file
from .catalog.models import load_model, validate_tp
from .catalog.precision import apply_precision, describe_precision
from .catalog.types import GPUSpec, ModelConfig
from .cluster.cluster import InstanceSetup, run_simulation
from .cluster.infra_spec import DeploymentSpec, LifecycleSpec, NodePoolSpec
from .cluster.infrastructure import FleetPlan, SlotPlan
from .engine.batching import EngineConfig
from .engine.formation import make_batch_formation
from .engine.options import EngineOptions
from .engine.policies import make_priority_policy, make_scheduler
from .engine.preemption import make_preemption_policy
from .engine.request import Request
from .errors import ConfigError, excerpt, invalid
from .latency import build_step_time_model
from .latency.base import StepTimeModel
from .latency.kv_capacity import (
    compute_kv_blocks,
    derive_max_model_len,
    kv_bytes_per_token,
    model_weight_bytes,
)
from .latency.parallel import Parallelism
from .limits import MAX_REQUESTS
from .metrics.results import Result
from .scenario import (
    PDSpec,
    Scenario,
    SyntheticWorkload,
    TraceSpec,
    apply_overrides,
    load_scenario,
    scenario_from_dict,
)
from .workload.generator import WorkloadStream
from .workload.spec import WorkloadSpec as V2WorkloadSpec
from .workload.spec import format_spec_error, load_workload_spec
from .workload.synthetic import synthetic_to_spec
from .workload.trace import ClientReplay, load_requests_file, recorded_client

log = logging.getLogger("servesim")
# Verdicts worth a warning; "too short" cannot judge and says so only in the report.
UNSTEADY_VERDICTS = ("saturated", "not steady", "empty")

FALLBACK_KV_BLOCKS = 1_000_000
# Why BLIS's trained-physics cannot price a data-parallel rank (docs/parallelism.md).
DP_NEEDS_RANK_PRICING = (
    "latency model 'trained-physics' prices one scheduler standing for all dp ranks (BLIS's "
    "approximation); servesim runs a scheduler per rank, which latency model physics prices"
)
# Backends whose step time comes from the model's shape; they get an auto-derived context limit.
ANALYTICAL_BACKENDS = frozenset({"roofline", "physics"})


@dataclass
class Deployment:
    """A scenario's deployment, fully resolved: what one instance is and how it is priced."""

    model: ModelConfig
    gpu: GPUSpec
    tp: int
    step_model: StepTimeModel
    engine: EngineConfig
    kv_blocks_source: str
    parallelism: Parallelism | None = None

    @property
    def gpus(self) -> int:
        """GPUs one instance occupies: tp x pp x dp."""
        return self.parallelism.gpus if self.parallelism is not None else self.tp

    @property
    def dp(self) -> int:
        """Data-parallel attention ranks per instance."""
        return self.parallelism.dp if self.parallelism is not None else 1

    def describe(self) -> dict[str, Any]:
        layout = self.parallelism or Parallelism(self.tp)
        described = {
            "model": self.model.name,
            "hardware": self.gpu.name,
            "tp": self.tp,
            "pp": layout.pp,
            "ep": layout.ep,
            "gpus": layout.gpus,
            "latency_model": self.step_model.name,
            "latency": self.step_model.provenance(),
            "total_kv_blocks": self.engine.total_kv_blocks,
            "kv_blocks_source": self.kv_blocks_source,
            "max_model_len": self.engine.max_model_len,
        }
        if self.engine.speculative is not None:
            described["speculative"] = self.engine.speculative.describe()
        if self.engine.lora is not None:
            described["lora"] = self.engine.lora.describe()
        return described


def as_scenario(scenario: Scenario | dict | str | Path) -> Scenario:
    """A Scenario from a Scenario, a dict of its fields or the path of its YAML file; any
    other value is a ConfigError naming what was given (not a TypeError from deep inside)."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return scenario_from_dict(scenario)
    if isinstance(scenario, str | PathLike) and isinstance(fspath(scenario), str):
        if "\x00" in fspath(scenario):
            raise ConfigError(
                f"scenario: invalid value {_shown(fspath(scenario))}; a path cannot contain a "
                "NUL byte"
            )
        return load_scenario(scenario)
    given = "None" if scenario is None else f"{type(scenario).__name__} {_shown(scenario)}"
    raise ConfigError(
        f"scenario: expected a path to a YAML file, a dict or a Scenario; got {given}"
    )


def _shown(value: object, limit: int = 80) -> str:
    """`repr(value)` cut to one short line, for a message."""
    try:
        text = " ".join(repr(value).split())
    except ValueError:  # an int too long to print
        return "(too large to show)"
    return text if len(text) <= limit else text[:limit] + "…"


def resolve_deployment(scenario: Scenario) -> Deployment:
    """Model, GPU, TP, step-time model and engine settings, with BLIS's precedence rules."""
    if scenario.model_config_folder is not None:
        model = load_model(str(scenario.model_config_folder), name=scenario.model)
    else:
        model = load_model(scenario.model)
    defaults = model_defaults(model.name) or {}
    hardware = scenario.hardware or defaults.get("GPU") or "H100"
    extra = load_gpu_file(scenario.hardware_file) if scenario.hardware_file else None
    gpu = get_gpu(hardware, extra)
    tp = scenario.tp or int(defaults.get("tensor_parallelism") or 1)
    validate_tp(model, tp)
    model = apply_precision(model, gpu, scenario.weight_dtype, scenario.engine.kv_cache_dtype)
    if scenario.dp not in (None, 1) and scenario.latency.model == "trained-physics":
        raise invalid("dp", scenario.dp, DP_NEEDS_RANK_PRICING)
    layout = Parallelism.of(
        tp, scenario.pp, scenario.dp, scenario.ep, scenario.enable_expert_parallel
    ).check(model)
    if scenario.enable_expert_parallel and not model.is_moe:
        raise ConfigError(
            f"enable_expert_parallel: invalid value True; expert parallelism needs an MoE "
            f"model and {model.name!r} is dense"
        )
    lat = scenario.latency
    step_model = build_step_time_model(
        lat.model,
        model,
        gpu,
        tp,
        lat.alpha_coeffs,
        lat.beta_coeffs,
        lat.vllm_version,
        coeffs_file=lat.coeffs_file,
        parallelism=layout,
    )
    eng = scenario.engine
    make_scheduler(eng.scheduler)
    make_priority_policy(eng.priority_policy)
    make_preemption_policy(eng.preemption_policy)
    make_batch_formation(eng.batch_formation)
    _validate_cluster(scenario)
    total_blocks, source = _total_kv_blocks(scenario, model, gpu, tp, layout)
    speculative = None
    if scenario.speculative is not None:
        from .speculative_setup import build_speculation

        speculative, total_blocks, source = build_speculation(
            scenario, model, gpu, tp, layout, step_model, total_blocks, source
        )
    lora = None
    if scenario.lora is not None:
        from .lora_setup import build_lora

        lora, total_blocks, source = build_lora(
            scenario, model, gpu, tp, layout, total_blocks, source
        )
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
        preemption_policy=eng.preemption_policy,
        batch_formation=eng.batch_formation,
        enable_prefix_caching=eng.enable_prefix_caching,
        kv_cpu_blocks=eng.kv_cpu_blocks,
        kv_offload_policy=eng.kv_offload_policy,
        kv_bytes_per_block=kv_bytes_per_token(model, tp, layout.pp) * eng.block_size_tokens,
        kv_transfer_bandwidth_gb_per_s=eng.kv_transfer_bandwidth_gb_per_s,
        kv_transfer_base_latency_us=eng.kv_transfer_base_latency_us,
        kv_reload_blocking=eng.kv_reload_blocking,
        speculative=speculative,
        lora=lora,
    )
    return Deployment(model, gpu, tp, step_model, engine, source, layout)


def instance_setups(scenario: Scenario, deployment: Deployment) -> list[InstanceSetup]:
    """One setup per instance: PD pools first (prefill, then decode), then unified ones.

    A pool with overrides (GPU, TP, latency model, context limit, KV blocks) gets its own
    deployment: its roofline uses the pool's GPU and TP, and its KV capacity is resolved for
    that GPU (docs/behaviour.md §7.4)."""
    cluster = scenario.cluster
    unified = InstanceSetup(deployment.engine, deployment.step_model, "unified", deployment.dp)
    pd = cluster.pd
    if not pd.enabled:
        return [unified] * cluster.num_instances
    setups = []
    pools = pool_deployments(scenario, deployment)
    for role, count in (("prefill", pd.prefill_instances), ("decode", pd.decode_instances)):
        pool = pools[role]
        setups += [InstanceSetup(pool.engine, pool.step_model, role, pool.dp)] * count
    return setups + [unified] * (cluster.num_instances - len(setups))


def pool_deployments(scenario: Scenario, deployment: Deployment) -> dict[str, Deployment]:
    """The deployment of each PD pool ("prefill", "decode"): `deployment` itself unless the
    pool overrides its GPU, layout, latency model, context limit or KV blocks."""
    pd = scenario.cluster.pd
    out = {}
    for role, pool in (("prefill", pd.prefill), ("decode", pd.decode)):
        if not pool.changes_deployment:
            out[role] = deployment
            continue
        changes = {
            "hardware": pool.hardware,
            "tp": pool.tp,
            "pp": pool.pp,
            "ep": pool.ep,
            "dp": pool.dp,
            "latency.model": pool.latency_model,
            "engine.max_model_len": pool.max_model_len,
            "engine.total_kv_blocks": pool.total_kv_blocks,
        }
        pool_scenario = apply_overrides(
            scenario,
            {k: v for k, v in changes.items() if v is not None},
            source=f"cluster.pd.{role}",
        )
        out[role] = resolve_deployment(pool_scenario)
    return out


def uses_fleet(scenario: Scenario) -> bool:
    """Does the scenario describe its fleet (deployments, pools, lifecycle, events, scaling)?"""
    return bool(
        scenario.deployments
        or scenario.node_pools
        or scenario.events
        or scenario.autoscaler
        or scenario.instance_lifecycle != LifecycleSpec()
    )


def plan_fleet(
    scenario: Scenario, deployment: Deployment
) -> tuple[list[InstanceSetup], FleetPlan | None, Scenario]:
    """Instance setups and the fleet plan. Without fleet fields: `instance_setups` and no plan.

    With `deployments`, instances are numbered deployment by deployment (prefill roles
    first, then decode, then unified, so PD pools stay contiguous), and each deployment gets
    extra slots for its autoscaler's headroom and its add_instance events. Returns the
    scenario too, with PD pool sizes filled in from the deployments' roles."""
    if not uses_fleet(scenario):
        return instance_setups(scenario, deployment), None, scenario
    specs = scenario.deployments or [
        DeploymentSpec(name="default", num_instances=scenario.cluster.num_instances)
    ]
    if scenario.deployments and scenario.cluster.pd.enabled:
        raise ConfigError(
            "cluster.pd.prefill_instances/decode_instances: with `deployments`, give the "
            "pools as deployments with role: prefill / decode instead"
        )
    order = {"prefill": 0, "decode": 1, "unified": 2}
    specs = sorted(specs, key=lambda d: order[d.role])  # stable: config order within a role
    resolved = {d.name: _resolve_named_deployment(scenario, d) for d in specs}
    for d in specs:
        if resolved[d.name].dp > 1:
            field = "dp" if d.name == "default" else f"deployments[{d.name}]: dp"
            raise invalid(
                field,
                resolved[d.name].dp,
                "data-parallel ranks run on a fixed fleet (cluster.num_instances and PD "
                "pools); with deployments, node_pools, lifecycle, events or an autoscaler "
                "use dp 1",
            )
    models = {resolved[d.name].model.name.lower() for d in specs}
    roles = {d.role for d in specs}
    pd_roles = roles & {"prefill", "decode"}
    if pd_roles and pd_roles != {"prefill", "decode"}:
        raise ConfigError(
            f"deployments: role {sorted(pd_roles)[0]!r} needs deployments of both roles "
            "prefill and decode"
        )
    if pd_roles and len(models) > 1:
        raise ConfigError(
            "deployments: prefill/decode disaggregation serves one model; these deployments "
            f"serve {', '.join(sorted(models))}"
        )
    _check_pool_gpus(scenario)
    _check_pools(scenario, specs, resolved)
    extra = _extra_slots(scenario, specs)
    setups: list[InstanceSetup] = []
    slots: list[SlotPlan] = []
    aliases: dict[str, list[str]] = {}
    for d in specs:
        dep = resolved[d.name]
        key = dep.model.name.lower()
        aliases.setdefault(key, [])
        if d.model:
            aliases[key].append(d.model)
        if scenario.model and not scenario.deployments:
            aliases[key].append(scenario.model)
        weights = model_weight_bytes(dep.model) / dep.gpus
        for k in range(d.num_instances + extra[d.name]):
            index = len(slots)
            slots.append(
                SlotPlan(
                    index=index,
                    instance_id=f"instance_{index}",
                    deployment=d.name,
                    model_key=key,
                    gpu_type=dep.gpu.name,
                    gpus_needed=dep.gpus,
                    pool=d.pool,
                    initial=k < d.num_instances,
                    weight_bytes=weights,
                )
            )
            setups.append(InstanceSetup(dep.engine, dep.step_model, d.role))
    if not slots:
        raise ConfigError("deployments: no instances (every num_instances is 0, no autoscaler)")
    plan = FleetPlan(
        slots=slots,
        node_pools=list(scenario.node_pools),
        lifecycle=scenario.instance_lifecycle,
        events=list(scenario.events),
        autoscalers=list(scenario.autoscaler),
        model_aliases=aliases,
        latency_by_deployment={d.name: latency_entry(resolved[d.name], d.role) for d in specs}
        if scenario.deployments
        else {},
    )
    if (pd_roles or scenario.cluster.pd.enabled) and plan.dynamic:
        raise ConfigError(
            "prefill/decode pools run on a fixed fleet: node_pools, loading delays, "
            "warm-up, events and autoscaler are not supported with them"
        )
    if scenario.cluster.pd.enabled:
        # Lifecycle settings that change nothing on a fixed fleet (e.g. retry_on_failure with
        # no failure): the PD pools are the cluster's, with their per-pool overrides.
        return instance_setups(scenario, deployment), None, scenario
    if pd_roles:
        counts = {r: sum(d.num_instances for d in specs if d.role == r) for r in order}
        scenario = apply_overrides(
            scenario,
            {
                "deployments": [],  # now described by the fleet plan
                "cluster.num_instances": len(slots),
                "cluster.pd.prefill_instances": counts["prefill"],
                "cluster.pd.decode_instances": counts["decode"],
            },
            source="deployments",
        )
    _check_event_targets(scenario, plan)
    return setups, plan, scenario


def latency_entry(dep: Deployment, role: str) -> dict[str, Any]:
    """What prices one deployment's steps, for the Latency Model block: its model and role,
    then its step-time model's own provenance, with the GPU, layout and precision filled in
    for backends whose provenance does not name them."""
    entry: dict[str, Any] = {"model": dep.model.name, "role": role}
    entry.update(dep.step_model.provenance())
    entry.setdefault("gpu", dep.gpu.name)
    entry.setdefault("layout", (dep.parallelism or Parallelism(dep.tp)).describe())
    entry.setdefault("precision", describe_precision(dep.model, dep.gpu))
    return entry


def deployments_latency(fleet: FleetPlan | None, top: Deployment) -> dict[str, dict[str, Any]]:
    """One Latency Model entry per named deployment, or {} when every deployment is priced
    exactly as the scenario's top-level one (its block already says all there is)."""
    entries = fleet.latency_by_deployment if fleet is not None else {}
    same = {k: v for k, v in latency_entry(top, "").items() if k != "role"}
    if all({k: v for k, v in e.items() if k != "role"} == same for e in entries.values()):
        return {}
    return entries


def _resolve_named_deployment(scenario: Scenario, d: DeploymentSpec) -> Deployment:
    hardware = d.hardware
    if hardware is None and d.pool is not None:
        hardware = next(p.gpu_type for p in scenario.node_pools if p.name == d.pool)
    changes = {
        "model": d.model,
        "hardware": hardware,
        "tp": d.tp,
        "pp": d.pp,
        "latency.model": d.latency_model,
        "engine.total_kv_blocks": d.total_kv_blocks,
        "engine.max_model_len": d.max_model_len,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    if d.ep is not None or d.enable_expert_parallel is not None:
        # A deployment that sets either expert option sets both: half inherited from the
        # scenario (ep 8 with its own enable_expert_parallel) would contradict itself.
        changes["ep"] = d.ep
        changes["enable_expert_parallel"] = bool(d.enable_expert_parallel)
    # The deployment is resolved as a single-model scenario of its own.
    base = scenario.model_copy(
        update={
            "deployments": [],
            "events": [],
            "autoscaler": [],
            "node_pools": [],
            "cluster": scenario.cluster.model_copy(update={"pd": PDSpec()}),
        }
    )
    try:
        return resolve_deployment(apply_overrides(base, changes, source=f"deployments[{d.name}]"))
    except ConfigError as exc:
        raise ConfigError(f"deployments[{d.name}]: {exc}") from None


def _check_pools(
    scenario: Scenario, specs: list[DeploymentSpec], resolved: dict[str, Deployment]
) -> None:
    """With node pools, every deployment needs a pool of its GPU type that can hold one
    instance (tp x pp GPUs): on one node, or on whole nodes when the instance is a multiple
    of the pool's gpus_per_node and max_nodes allows that many."""
    pools = scenario.node_pools
    if not pools:
        return
    for d in specs:
        dep = resolved[d.name]
        fitting = [
            p
            for p in pools
            if (d.pool is None or p.name == d.pool) and p.gpu_type.lower() == dep.gpu.name.lower()
        ]
        where = f"node pool {d.pool!r}" if d.pool else "any node pool"
        if not fitting:
            types = ", ".join(sorted({p.gpu_type for p in pools}))
            raise ConfigError(
                f"deployments[{d.name}]: runs on GPU {dep.gpu.name!r} but {where} has "
                f"gpu_type {types}; set the deployment's hardware or the pool's gpu_type"
            )
        refusals = [_pool_refusal(p, dep.gpus) for p in fitting]
        if all(refusals):
            dp = dep.parallelism.dp if dep.parallelism is not None else 1
            field = "tp" if dep.gpus == dep.tp else "tp x pp x dp" if dp > 1 else "tp x pp"
            raise ConfigError(
                f"deployments[{d.name}]: {field}: invalid value {dep.gpus} (GPUs per "
                f"instance); {'; '.join(refusals)}"
            )


def _pool_refusal(pool: NodePoolSpec, gpus: int) -> str:
    """Why `pool` cannot hold an instance of `gpus` GPUs ("" when it can). An instance larger
    than a node takes whole nodes: vLLM runs the same number of GPUs on every node of a
    multi-node instance, and servesim gives each such instance every GPU of its nodes."""
    per_node = pool.gpus_per_node
    if gpus <= per_node:
        return ""
    if gpus % per_node:
        return (
            f"node pool {pool.name!r} has {per_node} GPUs per node, and an instance across "
            f"nodes takes whole nodes (vLLM runs the same number of GPUs on every node), so "
            f"it must be at most {per_node} or a multiple of {per_node}"
        )
    nodes = gpus // per_node
    if nodes > pool.max_nodes:
        return (
            f"it takes {nodes} whole nodes of node pool {pool.name!r} ({per_node} GPUs each) "
            f"but the pool's max_nodes is {pool.max_nodes}; raise max_nodes to at least {nodes}"
        )
    return ""


def _check_pool_gpus(scenario: Scenario) -> None:
    extra = load_gpu_file(scenario.hardware_file) if scenario.hardware_file else None
    for i, pool in enumerate(scenario.node_pools):
        try:
            get_gpu(pool.gpu_type, extra)
        except ConfigError as exc:
            raise ConfigError(f"node_pools[{i}].gpu_type: {exc}") from None


def _extra_slots(scenario: Scenario, specs: list[DeploymentSpec]) -> dict[str, int]:
    """Slots beyond the initial instances: autoscaler headroom and add_instance events."""
    extra = {d.name: 0 for d in specs}
    first = specs[0].name
    for a in scenario.autoscaler:
        name = a.deployment or first
        initial = next(d.num_instances for d in specs if d.name == name)
        extra[name] += max(0, a.max_instances - initial)
    for e in scenario.events:
        if e.action == "add_instance":
            extra[e.deployment or first] += 1
    return extra


def _check_event_targets(scenario: Scenario, plan: FleetPlan) -> None:
    ids = [s.instance_id for s in plan.slots]
    for i, e in enumerate(scenario.events):
        if e.target is not None and e.target not in ids:
            raise ConfigError(
                f"events[{i}].target: unknown instance {e.target!r}; instances are "
                f"{ids[0]} .. {ids[-1]}"
            )
        if e.node is not None:
            if not scenario.node_pools:
                raise ConfigError(
                    f"events[{i}].node: {e.node!r}, but the scenario has no node_pools"
                )
            pool = e.node.rsplit("-", 1)[0]
            known = {p.name: p for p in scenario.node_pools}
            if pool not in known or not e.node.rsplit("-", 1)[-1].isdigit():
                raise ConfigError(
                    f"events[{i}].node: unknown node {e.node!r}; nodes are named "
                    "<pool>-<index>, e.g. "
                    f"{scenario.node_pools[0].name}-0"
                )


def _validate_cluster(scenario: Scenario) -> None:
    """Reject unknown policies, scorers and fitness keys before anything runs."""
    import numpy as np

    from .cluster.cluster import build_policies, decider_for
    from .metrics.fitness import parse_fitness_weights

    c = scenario.cluster
    pd = c.pd
    decider_for(pd, scenario.engine.block_size_tokens)
    if pd.prefix_threshold is not None and pd.decider != "prefix-threshold":
        log.warning("pd.prefix_threshold is set but the decider is %r; it is ignored", pd.decider)
    if pd.prompt_length_threshold is not None and pd.decider != "prompt-length":
        log.warning(
            "pd.prompt_length_threshold is set but the decider is %r; it is ignored", pd.decider
        )
    build_policies(c, np.random.default_rng(0), scenario.engine.block_size_tokens, lambda _i, _r: 0)
    if c.fitness_weights:
        parse_fitness_weights(c.fitness_weights)


def capacity_settings(scenario: Scenario, layout: Parallelism) -> dict[str, Any]:
    """The engine and layout settings the KV capacity formula takes besides model, GPU, TP."""
    eng = scenario.engine
    return {
        "block_size": eng.block_size_tokens,
        "gpu_memory_utilization": eng.gpu_memory_utilization,
        "pp": layout.pp,
        "expert_fraction": layout.tp / layout.expert_shards if layout.ep_ranks > 1 else 1.0,
        "rule": capacity_rule(scenario),
    }


def capacity_rule(scenario: Scenario) -> str:
    """The KV capacity rule in force: `auto` is vLLM's per-GPU allocation under servesim's
    `physics` model (the measured block counts agree with it) and BLIS's formula under BLIS's
    backends, whose runs it reproduces (docs/models-and-hardware.md, Capacity rules)."""
    rule = scenario.engine.kv_capacity_rule
    if rule == "auto":
        return "vllm" if scenario.latency.model == "physics" else "blis"
    return rule


def _total_kv_blocks(
    scenario: Scenario, model: ModelConfig, gpu: GPUSpec, tp: int, layout: Parallelism
) -> tuple[int, str]:
    """Explicit > measured defaults.yaml entry > auto-calculation > 1,000,000 (docs/behaviour.md
    §2.5)."""
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
        blocks = compute_kv_blocks(model, gpu, tp, **capacity_settings(scenario, layout))
        return blocks, "auto"
    except ConfigError as exc:
        log.warning("KV capacity auto-calculation failed (%s); using %d blocks", exc, 1_000_000)
        return FALLBACK_KV_BLOCKS, "fallback"


def workload_spec_of(scenario: Scenario) -> V2WorkloadSpec:
    """The scenario's traffic as a v2 workload spec (synthetic, inline or from a file)."""
    if scenario.workload_spec is not None:
        return load_workload_spec(scenario.workload_spec)
    workload = scenario.workload
    if isinstance(workload, V2WorkloadSpec):
        return workload
    return synthetic_to_spec(workload or SyntheticWorkload())


def _workload_base_dir(scenario: Scenario) -> Path | None:
    if scenario.workload_spec is not None:
        return Path(scenario.workload_spec).parent
    return scenario._base_dir  # noqa: SLF001


def build_traffic(scenario: Scenario) -> tuple[Iterable[Request], WorkloadStream | None]:
    """The requests of a run: a trace's rows, or a lazy stream from the workload spec."""
    if scenario.trace is not None:
        trace = scenario.trace
        at_schedule = trace.timing == "schedule"
        if trace.session_mode == "closed-loop":
            from .workload.trace import closed_loop_replay

            return closed_loop_replay(trace, scenario.seed, scenario.horizon_us)
        return load_requests_file(trace.data, trace.header, at_schedule), None
    stream = WorkloadStream(
        workload_spec_of(scenario),
        scenario.seed,
        scenario.horizon_us,
        _workload_base_dir(scenario),
    )
    return stream, stream


def merged_slo(slo: dict[str, Any], goodput_targets: dict[str, Any]) -> dict[str, Any]:
    """The scenario's `slo` section (a dict) with a v2 spec's (or a trace header's)
    `goodput_slo_targets` filling each class's metrics the scenario leaves unset (a target of
    0 means none, as in BLIS)."""
    if not goodput_targets:
        return slo
    slo = {**slo, "classes": {k: dict(v) for k, v in (slo.get("classes") or {}).items()}}
    for slo_class, targets in goodput_targets.items():
        mine = slo["classes"].setdefault(str(slo_class), {})
        given = targets if isinstance(targets, dict) else targets.model_dump()
        for metric, value in (given or {}).items():
            if value and mine.get(metric) is None:
                mine[metric] = value
    return slo


def build_requests(scenario: Scenario) -> list[Request]:
    """Every request of the scenario, materialised (closed-loop follow-ups excluded)."""
    requests, _ = build_traffic(scenario)
    return list(requests)


def _horizon(scenario: Scenario, stream: WorkloadStream | None) -> int | None:
    """Explicit horizon, else the workload's own; a replayed trace runs until every request
    finishes (BLIS stops at twice the latest arrival, which cuts short overloaded traces)."""
    if scenario.horizon_us is not None:
        return scenario.horizon_us
    return stream.horizon_us if stream is not None else None


def simulate(
    scenario: Scenario | dict | str | Path,
    progress: Callable[[int, int], None] | None = None,
    on_deployment: Callable[[Deployment], None] | None = None,
    warn_unsteady: bool = True,
    reference: bool = False,
    options: EngineOptions | None = None,
    **overrides: Any,
) -> Result:
    """Run one scenario (object, dict or YAML path); keyword overrides use dotted paths with
    `__` for dots, e.g. simulate("x.yaml", engine__scheduler="sjf"). `on_deployment` sees the
    resolved deployment before instances are built (calibration wraps its step model).
    A run that did not reach a steady state logs a warning (`servesim` logger) unless
    `warn_unsteady` is False (sweeps and plans judge many runs and report verdicts).
    `reference=True` runs without the exact accelerations (engine/options.py): the same
    results, slower; for checking them. `options` picks them one by one instead."""
    sc = as_scenario(scenario)
    if overrides:
        sc = apply_overrides(sc, {k.replace("__", "."): v for k, v in overrides.items()})
    deployment = resolve_deployment(sc)
    if on_deployment is not None:
        on_deployment(deployment)
    requests, stream = build_traffic(sc)
    info = sc.model_dump(mode="json")
    info["resolved"] = deployment.describe()
    sessions = stream.sessions if stream is not None and stream.has_sessions else None
    if stream is not None and getattr(stream, "spec", None) is not None:
        info["slo"] = merged_slo(info["slo"], stream.spec.goodput_slo_targets)
    elif sc.trace is not None and sc.trace.header is not None:
        from .workload.trace import read_header

        targets = read_header(sc.trace.header).get("goodput_slo_targets") or {}
        info["slo"] = merged_slo(info["slo"], targets)
    setups, fleet, sc = plan_fleet(sc, deployment)
    info["resolved"]["roles"] = [s.role for s in setups]
    pools = {s.role: s.step_model.provenance() for s in setups}
    by_deployment = deployments_latency(fleet, deployment)
    if by_deployment:
        # Each entry names its role; a per-role summary would merge deployments of one role.
        info["resolved"]["latency_by_deployment"] = by_deployment
    elif any(p != info["resolved"]["latency"] for p in pools.values()):
        info["resolved"]["latency_by_role"] = pools
    if fleet is not None and len(fleet.model_aliases) > 1:
        info["resolved"]["models"] = sorted(fleet.model_aliases)
    result = run_simulation(
        requests,
        horizon_us=_horizon(sc, stream),
        scenario=info,
        sessions=sessions,
        fleet=fleet,
        cluster=sc.cluster,
        seed=sc.seed,
        model_name=deployment.model.name,
        setups=setups,
        pd_kv_bytes_per_token=kv_bytes_per_token(deployment.model),
        progress=progress,
        check_invariants=sc.check_invariants,
        max_in_flight=sc.trace.max_in_flight if sc.trace is not None else None,
        options=options if options is not None else EngineOptions(reference=reference),
    )
    if sc.cluster.trace.path is not None and result.decisions is not None:
        result.decisions.write(sc.cluster.trace.path)
    steady = result.steady_state
    if warn_unsteady and steady is not None and steady.verdict in UNSTEADY_VERDICTS:
        log.warning(
            "the run is %s: %s; its latency percentiles describe this run's length, not a "
            "sustainable load (see the Steady State block)",
            steady.verdict,
            "; ".join(steady.reasons) or "no reason recorded",
        )
    return result


def replay(
    trace_header: str | Path | None,
    trace_data: str | Path,
    scenario: Scenario | dict | str | Path | None = None,
    max_in_flight: int | str = "auto",
    session_mode: str = "fixed",
    think_time: str | None = None,
    **overrides: Any,
) -> Result:
    """Simulate exactly the requests of a TraceV2 pair (arrival times and token counts).

    `max_in_flight`: "auto" replays as the recorded client behaved (`recorded_client`: at the
    send times, or, for a client that fell behind a saturated server, at the scheduled times
    with its cap on outstanding requests); "off" at the send times; a number sends at the
    scheduled times with at most that many requests outstanding. `session_mode`
    "closed-loop" sends each session's later rounds when the earlier finished, after
    `think_time` (BLIS syntax, e.g. "constant:value=500ms"; None = the trace's own);
    docs/workloads.md, "Closed-loop load"."""
    sc = as_scenario(scenario) if scenario is not None else Scenario()
    sc = sc.model_copy(update={"workload": None, "workload_spec": None})
    header = Path(trace_header) if trace_header is not None else None
    closed = session_mode == "closed-loop"
    client = client_replay("off" if closed else max_in_flight, trace_data)
    try:
        sc.trace = TraceSpec(
            header=header,
            data=Path(trace_data),
            timing="schedule" if client.at_schedule else "sends",
            max_in_flight=client.max_in_flight,
            session_mode=session_mode,
            think_time=think_time,
        )
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, "replay")) from None
    return simulate(sc, **overrides)


def client_replay(max_in_flight: int | str | None, trace_data: str | Path) -> ClientReplay:
    """The client of a replay from a `max_in_flight` choice: "auto" (what the recorded client
    did), "off" (the send times) or a positive number (the scheduled times, that cap)."""
    if max_in_flight is None or max_in_flight == "off":
        return ClientReplay(False, None, "--max-in-flight off")
    if max_in_flight == "auto":
        return recorded_client(trace_data)
    value = max_in_flight
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REQUESTS:
        raise ConfigError(
            f"max_in_flight: invalid value {excerpt(max_in_flight)}; must be auto, off or a "
            f"whole number from 1 to {MAX_REQUESTS:,}"
        )
    return ClientReplay(True, value, "--max-in-flight")


# Flags of BLIS's distribution mode that also mean something for a v2 workload spec.
_V2_EQUIVALENTS = {"workload.rate": "aggregate_rate", "workload.num_requests": "num_requests"}


def with_overrides(
    scenario: Scenario,
    overrides: dict[str, Any],
    workload_overrides: dict[str, Any] | None = None,
    source: str = "command-line flags",
) -> Scenario:
    """Apply flag overrides (dotted scenario paths) the way BLIS's CLI does.

    `workload_overrides` are synthetic-workload fields (`workload.rate`, ...). On a v2 workload
    (inline or `workload_spec` file) only rate and num_requests apply (as aggregate_rate and
    num_requests); the others are an error. An explicit seed also replaces a v2 spec's own seed.
    """
    sc = apply_overrides(scenario, overrides, source=source) if overrides else scenario
    workload_overrides = workload_overrides or {}
    v2 = sc.workload_spec is not None or isinstance(sc.workload, V2WorkloadSpec)
    if sc.trace is not None and workload_overrides:
        flags = ", ".join(sorted(workload_overrides))
        raise ConfigError(f"{flags}: workload flags do not apply to a trace replay")
    seed_given = "seed" in overrides
    if not v2:
        return apply_overrides(sc, workload_overrides, source=source) if workload_overrides else sc
    if not workload_overrides and not seed_given:
        return sc
    spec = workload_spec_of(sc).model_dump(exclude_none=True)
    for key, value in workload_overrides.items():
        if key == "workload.timeout_us":
            # BLIS --timeout on a spec: every client's deadline, sessions' included (0 = none).
            for member in (*spec.get("clients", ()), *spec.get("cohorts", ())):
                member["timeout"] = value
            continue
        if key not in _V2_EQUIVALENTS:
            raise ConfigError(
                f"{key}: does not apply to a v2 workload spec; only --rate (aggregate_rate), "
                "--num-requests and the deadline (--timeout, --timeout-us) do"
            )
        spec[_V2_EQUIVALENTS[key]] = value
    if seed_given and spec.get("seed") is not None:
        spec["seed"] = overrides["seed"]
    base_dir = _workload_base_dir(sc)
    updated = apply_overrides(sc, {"workload_spec": None, "workload": spec}, source=source)
    updated._base_dir = base_dir  # noqa: SLF001
    return updated
