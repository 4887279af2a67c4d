"""Nodes, GPUs and instance lifecycle states (docs/behaviour.md §8.2, §8.3).

The state machines refuse illegal edges, placement is first-fit, and every transition is
written to a `Timeline`; `infrastructure.py` drives them in simulated time. The one SimPy
object here is each node's GPU capacity, a `simpy.Container` whose level is its free GPUs,
kept next to the record of which instance holds which GPU (users see GPU ids). GPUs are
taken and given back with calls that the container grants at once, never waited for (see
`Node.allocate`), so the rules stay synchronous and testable with integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import simpy


class NodeState(StrEnum):
    PROVISIONING = "provisioning"
    READY = "ready"
    DRAINING = "draining"
    TERMINATED = "terminated"


class InstanceState(StrEnum):
    SCHEDULING = "scheduling"  # waiting for free GPUs
    LOADING = "loading"  # weights being loaded
    WARMING_UP = "warming_up"  # routable; its first requests run slower
    ACTIVE = "active"
    DRAINING = "draining"
    TERMINATED = "terminated"


NODE_EDGES: dict[NodeState, frozenset[NodeState]] = {
    NodeState.PROVISIONING: frozenset({NodeState.READY, NodeState.TERMINATED}),
    NodeState.READY: frozenset({NodeState.DRAINING, NodeState.TERMINATED}),
    NodeState.DRAINING: frozenset({NodeState.TERMINATED}),
    NodeState.TERMINATED: frozenset(),
}

INSTANCE_EDGES: dict[InstanceState, frozenset[InstanceState]] = {
    InstanceState.SCHEDULING: frozenset({InstanceState.LOADING, InstanceState.TERMINATED}),
    InstanceState.LOADING: frozenset(
        {InstanceState.WARMING_UP, InstanceState.ACTIVE, InstanceState.TERMINATED}
    ),
    InstanceState.WARMING_UP: frozenset(
        {InstanceState.ACTIVE, InstanceState.DRAINING, InstanceState.TERMINATED}
    ),
    InstanceState.ACTIVE: frozenset({InstanceState.DRAINING, InstanceState.TERMINATED}),
    InstanceState.DRAINING: frozenset({InstanceState.TERMINATED}),
    InstanceState.TERMINATED: frozenset(),
}

ROUTABLE = frozenset({InstanceState.WARMING_UP, InstanceState.ACTIVE})
# Instances that count towards a deployment's size (the autoscaler's min/max).
LIVE = frozenset(
    {
        InstanceState.SCHEDULING,
        InstanceState.LOADING,
        InstanceState.WARMING_UP,
        InstanceState.ACTIVE,
    }
)


class IllegalTransition(RuntimeError):
    pass


@dataclass
class TimelineRow:
    time_us: int
    kind: str  # "node" | "instance"
    entity_id: str
    from_state: str
    to_state: str
    reason: str


@dataclass
class Timeline:
    rows: list[TimelineRow] = field(default_factory=list)

    def record(self, time_us: int, kind: str, entity_id: str, old: str, new: str, why: str):
        self.rows.append(TimelineRow(time_us, kind, entity_id, old, new, why))


@dataclass
class Node:
    """One machine of a pool. `gpus[j]` is the id of the instance holding GPU j, or None;
    `capacity` holds the same GPUs as a SimPy resource (level = free GPUs, capacity = GPUs
    per node), and the two always agree (`free_gpus_recorded`).

    `env` is the run's environment; a node built outside a run (a test of placement rules)
    gets an environment of its own that nobody runs, so its container's events stay inert."""

    node_id: str
    pool: str
    gpu_type: str
    gpus: list[str | None]
    cost_per_hour: float
    state: NodeState = NodeState.PROVISIONING
    created_us: int = 0
    terminated_us: int = -1
    env: simpy.Environment | None = field(default=None, repr=False, compare=False)
    capacity: simpy.Container = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        env = self.env if self.env is not None else simpy.Environment()
        self.capacity = simpy.Container(env, capacity=len(self.gpus), init=self.free_gpus_recorded)

    @property
    def free_gpus(self) -> int:
        return int(self.capacity.level)

    @property
    def allocated_gpus(self) -> int:
        return len(self.gpus) - self.free_gpus

    @property
    def free_gpus_recorded(self) -> int:
        """Free GPUs by the holder record (the container's level must equal it)."""
        return sum(1 for g in self.gpus if g is None)

    def gpu_ids(self, instance_id: str) -> list[str]:
        return [f"{self.node_id}-gpu-{j}" for j, g in enumerate(self.gpus) if g == instance_id]

    def allocate(self, instance_id: str, count: int) -> list[int]:
        """Take the `count` lowest-index free GPUs for `instance_id` (caller checked room).

        The container's get is only called, never yielded: with the room checked first it is
        granted at once (the level drops as the get is created), and yielding it would resume
        the placing process after the other events of this microsecond, reordering ties. The
        get's success event is still scheduled; it has no callbacks, so it changes nothing."""
        taken = [j for j, g in enumerate(self.gpus) if g is None][:count]
        if len(taken) < count or self.free_gpus < count:
            raise IllegalTransition(
                f"node {self.node_id}: {count} GPUs asked for, {len(taken)} free "
                f"({self.free_gpus} by its container)"
            )
        granted = self.capacity.get(count)
        # A get left waiting would take GPUs later, behind the holder record's back.
        assert granted.triggered, (self.node_id, count)
        for j in taken:
            self.gpus[j] = instance_id
        return taken

    def release(self, instance_id: str) -> int:
        """Give back every GPU `instance_id` holds here (a put granted at once, as in
        `allocate`); the number given back."""
        freed = 0
        for j, g in enumerate(self.gpus):
            if g == instance_id:
                self.gpus[j] = None
                freed += 1
        if freed:
            returned = self.capacity.put(freed)
            assert returned.triggered, (self.node_id, freed)
        return freed

    def move(self, new: NodeState, now_us: int, timeline: Timeline, reason: str) -> None:
        if new not in NODE_EDGES[self.state]:
            raise IllegalTransition(f"node {self.node_id}: {self.state} -> {new} ({reason})")
        timeline.record(now_us, "node", self.node_id, self.state.value, new.value, reason)
        self.state = new
        if new is NodeState.TERMINATED:
            self.terminated_us = now_us


def first_fit(nodes: list[Node], gpu_type: str, gpus_needed: int, pool: str | None) -> Node | None:
    """The first Ready node (pools in config order, nodes in index order) of the right GPU
    type, and pool if one is named, with enough free GPUs (docs/behaviour.md §8.2)."""
    for node in nodes:
        if (
            node.state is NodeState.READY
            and node.gpu_type.lower() == gpu_type.lower()
            and (pool is None or node.pool == pool)
            and node.free_gpus >= gpus_needed
        ):
            return node
    return None


@dataclass
class InstanceRecord:
    """Lifecycle bookkeeping of one instance slot."""

    index: int  # the instance's position in the fleet (its slot and its engine)
    instance_id: str
    deployment: str
    model: str
    gpus_needed: int
    pool: str | None
    state: InstanceState | None = None  # None: a slot the fleet has not created (yet)
    node: Node | None = None
    created_us: int = -1
    placed_us: int = -1  # when it took its GPUs (Scheduling -> Loading); -1: never placed
    loaded_us: int = -1
    terminated_us: int = -1
    warm_up_left: int = 0  # completions until WarmingUp -> Active

    def move(self, new: InstanceState, now_us: int, timeline: Timeline, reason: str) -> None:
        old = self.state
        if old is None:
            if new is not InstanceState.SCHEDULING:
                raise IllegalTransition(f"instance {self.instance_id}: created as {new}")
        elif new not in INSTANCE_EDGES[old]:
            raise IllegalTransition(f"instance {self.instance_id}: {old} -> {new} ({reason})")
        timeline.record(
            now_us, "instance", self.instance_id, old.value if old else "", new.value, reason
        )
        self.state = new
        if old is None:
            self.created_us = now_us
        if new is InstanceState.LOADING:
            self.placed_us = now_us
        if new is InstanceState.TERMINATED:
            self.terminated_us = now_us

    @property
    def routable(self) -> bool:
        return self.state in ROUTABLE

    @property
    def live(self) -> bool:
        return self.state in LIVE
