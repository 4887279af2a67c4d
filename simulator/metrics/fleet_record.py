"""What a changing fleet leaves behind when the run ends (docs/infrastructure.md): its
lifecycle timeline, each node with the instance holding each of its GPUs, each instance
slot's lifecycle times and nodes, the autoscalers' counts and the requests the fleet's
changes touched. Captured once, so that a finished `Result` holds plain data rather than the
live `Infrastructure` (its instances and their engines, the router, the SimPy environment
and the nodes' GPU containers).

The attribute names are the infrastructure's own (`timeline.rows`, `nodes`, `plan.slots`,
`records`, `nodes_of(rec)`, `dropped_on_drain`, ...), so the fleet views (metrics/fleet.py)
and tests read a record as they read the live object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .instance_record import record_of

if TYPE_CHECKING:
    from ..cluster.autoscaler import Autoscaler
    from ..cluster.infrastructure import FleetPlan, Infrastructure
    from ..cluster.lifecycle import InstanceState, Node, NodeState, Timeline


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node at the end of the run. `gpus[j]` is the id of the instance holding GPU j, or
    None; `free_gpus` is its GPU container's level, which equals the free GPUs by that
    holder record (`free_gpus_recorded`)."""

    node_id: str
    pool: str
    gpu_type: str
    gpus: list[str | None]
    cost_per_hour: float
    state: NodeState
    created_us: int
    terminated_us: int
    free_gpus: int

    @property
    def free_gpus_recorded(self) -> int:
        return sum(1 for g in self.gpus if g is None)

    @property
    def allocated_gpus(self) -> int:
        return len(self.gpus) - self.free_gpus

    def gpu_ids(self, instance_id: str) -> list[str]:
        return [f"{self.node_id}-gpu-{j}" for j, g in enumerate(self.gpus) if g == instance_id]


@dataclass(frozen=True, slots=True)
class FleetInstanceRecord:
    """One instance slot's lifecycle at the end of the run (state None: never created)."""

    index: int
    instance_id: str
    deployment: str
    model: str
    gpus_needed: int
    pool: str | None
    state: InstanceState | None
    created_us: int
    placed_us: int  # when it took its GPUs; -1: never placed
    loaded_us: int
    terminated_us: int
    # The nodes its GPUs were on (kept after termination: the cost report bills them).
    node_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AutoscalerRecord:
    """One autoscaler's decisions: its spec, the scale-ups and -downs it made, the scale-ups
    refused once the run could make no more instances, and every sample (time µs, signal, live
    instances) it decided on."""

    deployment: str
    spec: Any
    scale_ups: int
    scale_downs: int
    refused_scale_ups: int
    samples: list[tuple[int, float, int]]


@dataclass(frozen=True)
class FleetRecord:
    """A changing fleet at the end of the run."""

    plan: FleetPlan
    timeline: Timeline
    nodes: list[NodeRecord]
    records: list[FleetInstanceRecord]
    autoscalers: list[AutoscalerRecord]
    dropped_on_drain: int
    failed: int
    retried: int
    redirected: int
    events_after_end: int
    # Requests that waited at the router for a routable instance of their model.
    parked_total: int
    _by_node_id: dict[str, NodeRecord] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_node_id", {n.node_id: n for n in self.nodes})

    def nodes_of(self, rec: FleetInstanceRecord) -> list[NodeRecord]:
        """The nodes that held `rec`'s GPUs (empty if it was never placed or the fleet has no
        node pools)."""
        return [self._by_node_id[node_id] for node_id in rec.node_ids]

    def node(self, node_id: str) -> NodeRecord | None:
        return self._by_node_id.get(node_id)

    def record(self, instance_id: str) -> FleetInstanceRecord:
        for rec in self.records:
            if rec.instance_id == instance_id:
                return rec
        raise KeyError(instance_id)


def _capture_node(node: Node) -> NodeRecord:
    return record_of(NodeRecord, node, gpus=list(node.gpus))


def _capture_scaler(scaler: Autoscaler) -> AutoscalerRecord:
    return record_of(AutoscalerRecord, scaler)


def capture_fleet(infra: Infrastructure) -> FleetRecord:
    """`infra`'s record, once the run has stopped."""
    records = [
        record_of(
            FleetInstanceRecord,
            rec,
            node_ids=tuple(n.node_id for n in infra.nodes_of(rec)),
        )
        for rec in infra.records
    ]
    return record_of(
        FleetRecord,
        infra,
        nodes=[_capture_node(n) for n in infra.nodes],
        records=records,
        autoscalers=[_capture_scaler(s) for s in infra.autoscalers],
        parked_total=infra.router.parked_total,
    )
