"""Fleet planning: a scenario's named deployments, node pools, instance lifecycle, events and
autoscalers become the instance setups and the `FleetPlan` the cluster runs (`plan_fleet`),
after checking that every deployment fits a node pool and every event names an instance or
node that exists. Each deployment is resolved by `deployment.resolve_deployment`."""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING, Any

from .catalog.hardware import get_gpu, load_gpu_file
from .catalog.precision import describe_precision
from .cluster.cluster import InstanceSetup
from .cluster.infra_spec import DeploymentSpec, LifecycleSpec, NodePoolSpec
from .deployment import (
    Deployment,
    instance_setups,
    resolve_deployment,
    transfer_bytes_per_token,
    warn_decode_context_limit,
    warn_once,
    warnings_of,
)
from .errors import ConfigError, invalid
from .latency.kv_capacity import model_weight_bytes
from .latency.parallel import Parallelism
from .scenario import PDSpec, Scenario, apply_overrides

if TYPE_CHECKING:
    # Imported by the scenarios that have a fleet (start-up of the others).
    from .cluster.infrastructure import FleetPlan


def uses_fleet(scenario: Scenario) -> bool:
    """Does the scenario describe its fleet (deployments, pools, lifecycle, events, scaling)?"""
    return bool(
        scenario.deployments
        or scenario.node_pools
        or scenario.events
        or scenario.autoscaler
        or scenario.instance_lifecycle != _default_lifecycle()
    )


@cache
def _default_lifecycle() -> LifecycleSpec:
    """The section a scenario without one has, as the scenario's schema builds it (building
    `LifecycleSpec`'s own schema only to compare with it would cost every run's start-up)."""
    return Scenario().instance_lifecycle


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
    from .cluster.infrastructure import FleetPlan, SlotPlan

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
    # A pool's GPU type first: a deployment on that pool takes its GPU from it, and an
    # unknown one would be told as the deployment's `hardware`, a field nobody wrote.
    _check_pool_gpus(scenario)
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
    _check_pools(scenario, specs, resolved)
    extra = _extra_slots(scenario, specs)
    # A deployment that never has an instance, for a model no other deployment can serve:
    # its model's requests would wait for an instance that never comes. (An idle variant of
    # a model another deployment serves is harmless.)
    can_serve = {
        resolved[d.name].model.name.lower() for d in specs if d.num_instances + extra[d.name]
    }
    for d in specs:
        key = resolved[d.name].model.name.lower()
        if scenario.deployments and d.num_instances + extra[d.name] == 0 and key not in can_serve:
            raise invalid(
                f"deployments[{d.name}].num_instances",
                0,
                f"no instance of any deployment can ever serve its model {key!r}: nothing "
                "starts one of this deployment later (no autoscaler scales it up, no "
                "add_instance event names it); give it at least 1 instance, or remove the "
                "deployment",
            )
    setups: list[InstanceSetup] = []
    slots: list[SlotPlan] = []
    aliases: dict[str, list[str]] = {}
    for d in specs:
        dep = resolved[d.name]
        key = dep.model.name.lower()
        aliases.setdefault(key, [])
        if d.model:
            aliases[key].append(d.model)
        elif scenario.model:
            # A deployment without a model serves the scenario's: clients may ask for it by
            # the scenario's own spelling (say `llama-3.1-8b-instruct`), which the catalog's
            # full name does not match.
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
            setups.append(InstanceSetup(dep.engine, dep.step_model, d.role, deployment=dep))
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
        raise _fixed_fleet_refusal(scenario)
    if scenario.cluster.pd.enabled:
        # Lifecycle settings that change nothing on a fixed fleet (e.g. retry_on_failure with
        # no failure): the PD pools are the cluster's, with their per-pool overrides.
        return instance_setups(scenario, deployment), None, scenario
    if pd_roles:
        by_role = {r: [resolved[d.name] for d in specs if d.role == r] for r in pd_roles}
        _check_transfer_sizes(scenario, specs, resolved)
        warn_decode_context_limit(by_role["prefill"], by_role["decode"])
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
    if plan.node_pools:
        _warn_initial_overflow(plan)
    return setups, plan, scenario


def _check_transfer_sizes(
    scenario: Scenario, specs: list[DeploymentSpec], resolved: dict[str, Deployment]
) -> None:
    """A PD transfer is sized with one figure of KV bytes per token, what one GPU of a prefill
    instance holds (docs/pd.md): prefill deployments whose GPUs hold different shares (another
    TP or PP) are refused, unless `cluster.pd.kv_bytes_per_token` gives the figure."""
    if scenario.cluster.pd.kv_bytes_per_token is not None:
        return
    sizes = {
        d.name: transfer_bytes_per_token(resolved[d.name]) for d in specs if d.role == "prefill"
    }
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name} {size:,.0f} B" for name, size in sizes.items())
        raise ConfigError(
            "deployments: the prefill deployments' GPUs hold different KV bytes per token "
            f"({listed}), and a KV transfer is sized with one figure: give every role: prefill "
            "deployment the same tp and pp, or set cluster.pd.kv_bytes_per_token"
        )


def _fixed_fleet_refusal(scenario: Scenario) -> ConfigError:
    """PD pools run on a fixed fleet: the error names each setting that makes the fleet
    change (as `FleetPlan.dynamic` reads them), with its value, and what is allowed."""
    lc = scenario.instance_lifecycle
    given: list[tuple[str, str]] = []
    if scenario.node_pools:
        given.append(("node_pools", ", ".join(repr(p.name) for p in scenario.node_pools)))
    if scenario.events:
        events = ", ".join(f"{e.action} at {e.at_s:g} s" for e in scenario.events)
        given.append(("events", f"[{events}]"))
    if scenario.autoscaler:
        scaled = ", ".join(repr(a.deployment or "(first deployment)") for a in scenario.autoscaler)
        given.append(("autoscaler", f"[{scaled}]"))
    for name, value in (
        ("warm_up_request_count", lc.warm_up_request_count),
        ("loading_delay.mean_s", lc.loading_delay.mean_s),
        ("load_bandwidth_gb_per_s", lc.load_bandwidth_gb_per_s),
    ):
        if value:
            given.append((f"instance_lifecycle.{name}", f"{value:g}"))
    if not given:  # slots that start later: only events and autoscalers add them today
        given.append(("deployments", "instances that start after t = 0"))
    named = ", ".join(f"{field}: invalid value {value}" for field, value in given)
    return ConfigError(
        f"{named}; prefill/decode pools run on a fixed fleet, routable from t = 0: with them "
        "node_pools, events and autoscaler must be empty and instance_lifecycle's "
        "warm_up_request_count, loading_delay.mean_s and load_bandwidth_gb_per_s 0"
    )


def latency_entry(dep: Deployment, role: str) -> dict[str, Any]:
    """What prices one deployment's steps, for the Latency Model block: its model and role,
    then its step-time model's own provenance, with the GPU, layout and precision filled in
    for backends whose provenance does not name them."""
    entry: dict[str, Any] = {"model": dep.model.name, "role": role}
    entry.update(dep.step_model.provenance())
    entry.setdefault("gpu", dep.gpu.name)
    entry.setdefault("layout", (dep.parallelism or Parallelism(dep.tp)).describe())
    entry.setdefault("precision", describe_precision(dep.model, dep.gpu))
    # The batch limits this deployment's engines run with, for the Engine Policies block
    # (`metrics.views.text.engine_policies`), which the scenario's top-level resolution
    # would otherwise describe though no instance runs it; not part of the Latency Model
    # block (`text.latency_provenance` leaves them out).
    entry["max_num_running_reqs"] = dep.engine.max_num_running_reqs
    entry["max_num_scheduled_tokens"] = dep.engine.max_num_scheduled_tokens
    entry["batch_limits_source"] = dep.batch_limits_source
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
    changes = {"model": d.model, "hardware": hardware, "tp": d.tp, "pp": d.pp}
    changes |= {path: getattr(d, field) for field, path in _SCENARIO_FIELD.items()}
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
        with warnings_of(f"deployments[{d.name}]"):
            return resolve_deployment(
                apply_overrides(base, changes, source=f"deployments[{d.name}]")
            )
    except ConfigError as exc:
        raise ConfigError(
            f"deployments[{d.name}]: {_as_deployment_field(str(exc), changes)}"
        ) from None


# A deployment's field -> the scenario's field of another name it sets when the deployment is
# resolved (model, hardware, tp and pp keep their names).
_SCENARIO_FIELD = {
    "latency_model": "latency.model",
    "total_kv_blocks": "engine.total_kv_blocks",
    "max_model_len": "engine.max_model_len",
}


def _as_deployment_field(message: str, changes: dict[str, Any]) -> str:
    """`message` with the scenario field it starts with named as the deployment's field the
    user wrote (`latency.model: ...` -> `latency_model: ...`), when the deployment set it."""
    for mine, theirs in _SCENARIO_FIELD.items():
        if theirs in changes and message.startswith(f"{theirs}:"):
            return f"{mine}:{message[len(theirs) + 1 :]}"
    return message


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
        if not fitting:
            offered = [p for p in pools if d.pool is None or p.name == d.pool]
            types = ", ".join(sorted({p.gpu_type for p in offered}))
            where = f"node pool {d.pool!r} has" if d.pool else "the node pools have"
            raise ConfigError(
                f"deployments[{d.name}]: runs on GPU {dep.gpu.name!r}, but no node pool it may "
                f"use has that gpu_type ({where} {types}); set the deployment's hardware or "
                "the pool's gpu_type"
            )
        refusals = [_pool_refusal(p, dep.gpus) for p in fitting]
        if all(refusals):
            dp = dep.parallelism.dp if dep.parallelism is not None else 1
            field = "tp" if dep.gpus == dep.tp else "tp x pp x dp" if dp > 1 else "tp x pp"
            raise ConfigError(
                f"deployments[{d.name}]: {field}: invalid value {dep.gpus} (GPUs per "
                f"instance); {'; '.join(refusals)}"
            )
    for pool in pools:
        gpu = next(
            (dep.gpu for dep in resolved.values() if dep.gpu.name.lower() == pool.gpu_type.lower()),
            None,
        )
        given = "gpu_memory_gib" in pool.model_fields_set
        if gpu is not None and given and not math.isclose(pool.gpu_memory_gib, gpu.memory_gib):
            warn_once(
                "node_pools[%s].gpu_memory_gib %g differs from %s's %g GiB in the GPU catalog; "
                "servesim sizes KV caches from the catalog's GPU (the field is kept for BLIS's "
                "schema): give --hardware-config a GPU with that memory to simulate it",
                pool.name,
                pool.gpu_memory_gib,
                gpu.name,
                gpu.memory_gib,
            )


def _warn_initial_overflow(plan: FleetPlan) -> None:
    """Say when the initial instances need more GPUs than the pools they may be placed on can
    ever hold, or than those pools start with when nothing adds a node to any of them (no
    add_node event for them, no autoscaler manages them): the rest wait in Scheduling, and
    their model's requests queue, unless events free GPUs. Legal (a later fail or drain may
    make room), but otherwise it runs silently short.

    Checked for each set of pools some deployment's instances may use, against every initial
    instance that may use only pools of that set (two deployments pinned to two pools of one
    GPU type are checked pool by pool: a pinned instance cannot use the other pool's room)."""
    from .cluster.infrastructure import managed_pools, nodes_spanned, slot_fits_pool

    # Nodes beyond a pool's initial ones come from an add_node event, or from a scale-up in
    # a pool an autoscaler manages (the same pools the run's infrastructure orders nodes in).
    growing = managed_pools(plan)
    growing |= {e.pool for e in plan.events if e.action == "add_node" and e.pool}
    initial = [s for s in plan.slots if s.initial]
    may_use = {
        s.index: frozenset(
            p.name
            for p in plan.node_pools
            if slot_fits_pool(s, p) and nodes_spanned(s.gpus_needed, p)
        )
        for s in initial
    }
    for where in dict.fromkeys(u for u in may_use.values() if u):
        among = [s for s in initial if may_use[s.index] and may_use[s.index] <= where]
        needed = sum(s.gpus_needed for s in among)
        gpu = among[0].gpu_type
        pools = [p for p in plan.node_pools if p.name in where]
        held = sum(p.max_nodes * p.gpus_per_node for p in pools)
        start = sum(p.initial_nodes * p.gpus_per_node for p in pools)
        of_type = {p.name for p in plan.node_pools if p.gpu_type.lower() == gpu.lower()}
        if where == of_type:
            named = "the node pools of that type"
        else:
            named = f"the node pools they may use ({', '.join(repr(p.name) for p in pools)})"
        if needed <= held and needed > start and not where & growing:
            warn_once(
                "the deployments' initial instances need %d %s GPUs, but %s start with %d "
                "(initial_nodes x gpus_per_node) and nothing adds a node (no add_node event "
                "for them, no autoscaler manages them): some instances will never be placed, "
                "and their model's requests wait",
                needed,
                gpu,
                named,
                start,
            )
        if needed > held:
            warn_once(
                "the deployments' initial instances need %d %s GPUs, but %s hold at most %d "
                "(max_nodes x gpus_per_node): some instances will wait in Scheduling for GPUs "
                "that only a drain or failure can free",
                needed,
                gpu,
                named,
                held,
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
                f"events[{i}].target: unknown instance {e.target!r}; "
                + (
                    f"the only instance is {ids[0]}"
                    if len(ids) == 1
                    else f"instances are {ids[0]} .. {ids[-1]}"
                )
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
