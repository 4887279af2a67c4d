"""Scenario schema of the fleet: node pools, instance lifecycle, events, autoscaling and
multi-model deployments (docs/behaviour.md §8, §A6, §A7).

Everything here is optional: a scenario that names none of it runs the fixed fleet of
`cluster.num_instances` instances, all routable from t = 0, exactly as before.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic
# would otherwise compile and evaluate each field's annotation text when the class is
# created, a cost every run pays at start-up (docs/performance.md, "Start-up").
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..limits import (
    MAX_COST_PER_HOUR,
    MAX_GPU_MEMORY_GIB,
    MAX_WARM_UP_FACTOR,
    BandwidthOrOff,
    Flag,
    Gpus,
    Instances,
    IntervalSeconds,
    Nodes,
    PositiveBlocks,
    PositiveInstances,
    PositiveThreshold,
    Requests,
    Seconds,
    Threshold,
    Tokens,
    number,
)


class _Strict(BaseModel):
    # Schemas are built on first use: a run validates only the models it uses.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)


_GpuMemoryGib = number(
    0,
    MAX_GPU_MEMORY_GIB,
    "GiB",
    "its byte count stays exact in float64 (2^53 bytes)",
    lo_open=True,
)
_CostPerHour = number(
    0,
    MAX_COST_PER_HOUR,
    "dollars per node-hour",
    "thousands of times any GPU node's price; keeps a fleet's cost finite",
)
_WarmUpFactor = number(
    1,
    MAX_WARM_UP_FACTOR,
    "",
    "a cold request a million times slower than a warm one keeps its step on the clock",
)


class DelaySpec(_Strict):
    """A delay in seconds: Gaussian(mean, stddev) clamped at 0; constant when stddev is 0."""

    mean_s: Seconds = 0.0
    stddev_s: Seconds = 0.0


class NodePoolSpec(_Strict):
    """A group of identical GPU nodes (docs/behaviour.md §8.1). Cost is per node and hour.
    An instance of more than `gpus_per_node` GPUs takes whole nodes of one pool, so its GPUs
    must be a multiple of `gpus_per_node` (checked where deployments are resolved)."""

    name: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    gpus_per_node: Gpus = 8
    gpu_memory_gib: _GpuMemoryGib = 80.0
    initial_nodes: Nodes = 1
    min_nodes: Nodes = 0
    max_nodes: Nodes = 1
    provisioning_delay: DelaySpec = Field(default_factory=dict, validate_default=True)
    cost_per_hour: _CostPerHour = Field(0.0, description="per node, in dollars")

    @model_validator(mode="after")
    def _bounds(self) -> "NodePoolSpec":
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"min_nodes ({self.min_nodes}) must be <= max_nodes ({self.max_nodes})"
            )
        if self.initial_nodes > self.max_nodes:
            raise ValueError(
                f"initial_nodes ({self.initial_nodes}) must be <= max_nodes ({self.max_nodes})"
            )
        return self


DrainPolicyName = Literal["immediate", "wait", "redirect"]


class LifecycleSpec(_Strict):
    """How instances come up and go away (docs/behaviour.md §8.3, §8.4)."""

    loading_delay: DelaySpec = Field(default_factory=dict, validate_default=True)
    # Loading can also be priced as weight bytes over a load bandwidth (0 = off): the two add.
    load_bandwidth_gb_per_s: BandwidthOrOff = 0.0
    warm_up_request_count: Requests = 0
    warm_up_ttft_factor: _WarmUpFactor = 1.0
    drain_policy: DrainPolicyName = "wait"
    retry_on_failure: Flag = False
    # The fleet the scenario starts with is already loaded and serving at t = 0.
    initial_instances_loaded: Flag = False


EventAction = Literal[
    "drain_instance", "add_instance", "add_node", "drain_node", "fail_node", "fail_instance"
]


# Per event action (besides `at_s` and `action`): the field it needs, and the fields it reads.
_EVENT_FIELDS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "drain_instance": ("target", ("target", "drain_policy")),
    "fail_instance": ("target", ("target",)),
    "drain_node": ("node", ("node", "drain_policy")),
    "fail_node": ("node", ("node",)),
    "add_node": ("pool", ("pool",)),
    "add_instance": (None, ("deployment",)),  # none: the first deployment
}
_EVENT_OPTIONAL = ("target", "node", "pool", "deployment", "drain_policy")


class EventSpec(_Strict):
    """One scheduled change to the fleet."""

    at_s: Seconds
    action: EventAction
    target: str | None = Field(None, description="instance id (drain/fail_instance)")
    node: str | None = Field(None, description="node id (drain_node, fail_node)")
    pool: str | None = Field(None, description="node pool (add_node)")
    deployment: str | None = Field(None, description="deployment (add_instance)")
    drain_policy: DrainPolicyName | None = Field(None, description="overrides the lifecycle's")

    @model_validator(mode="after")
    def _needs(self) -> "EventSpec":
        needed, takes = _EVENT_FIELDS[self.action]
        if needed is not None and getattr(self, needed) is None:
            raise ValueError(f"action {self.action!r} needs `{needed}`")
        # A field the action does not read would be silently ignored (a drain policy on a
        # failure, a node on an instance drain): refused, naming what the action takes.
        given = [f for f in _EVENT_OPTIONAL if getattr(self, f) is not None and f not in takes]
        if given:
            raise ValueError(
                f"action {self.action!r} does not take {', '.join(f'`{f}`' for f in given)}; "
                f"it takes {', '.join(f'`{f}`' for f in takes)}"
            )
        return self


class AutoscalerSpec(_Strict):
    """Scale one deployment between min and max instances on a load signal."""

    deployment: str | None = Field(None, description="None = the first deployment")
    signal: Literal["kv_utilization", "queue_depth", "in_flight"] = "in_flight"
    scale_up_threshold: PositiveThreshold
    scale_down_threshold: Threshold = 0.0
    min_instances: Instances = 1
    max_instances: PositiveInstances
    interval_s: IntervalSeconds = 15.0
    scrape_delay_s: Seconds = 0.0
    scale_up_stabilization_s: Seconds = 0.0
    scale_down_stabilization_s: Seconds = 300.0

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalerSpec":
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"min_instances ({self.min_instances}) must be <= max_instances "
                f"({self.max_instances})"
            )
        if self.signal == "kv_utilization" and self.scale_up_threshold > 1:
            # A utilisation is a fraction: such a threshold could never be crossed.
            raise ValueError(
                f"scale_up_threshold: invalid value {self.scale_up_threshold:g}; the "
                "kv_utilization signal is a fraction of the KV cache, so it must be at most 1"
            )
        if self.scale_down_threshold >= self.scale_up_threshold:
            raise ValueError(
                f"scale_down_threshold ({self.scale_down_threshold}) must be < "
                f"scale_up_threshold ({self.scale_up_threshold})"
            )
        return self


class DeploymentSpec(_Strict):
    """One model served by a group of identical instances (docs/behaviour.md §A6). Unset fields
    inherit the scenario's top-level model / hardware / layout / latency / engine."""

    name: str = Field(min_length=1)
    model: str | None = None
    hardware: str | None = None
    tp: Gpus | None = None
    # The instance's layout beyond TP (docs/parallelism.md); checked against the deployment's
    # model when it is resolved, since a dense model takes no ep and pp is bounded by layers.
    pp: Gpus | None = None
    ep: Gpus | None = None
    enable_expert_parallel: Flag | None = None
    num_instances: Instances = 1
    role: Literal["unified", "prefill", "decode"] = "unified"
    pool: str | None = Field(None, description="node pool its instances are placed on")
    latency_model: str | None = None
    total_kv_blocks: PositiveBlocks | None = None
    max_model_len: Tokens | None = None
