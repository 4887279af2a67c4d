"""A fleet that changes while traffic flows (docs/behaviour.md §8, §A6, §A7): node pools, GPU
placement, instance lifecycle, drains, failures, scheduled events and the autoscaler.

The rules live in plain objects (`lifecycle.py`: states, legal edges, first-fit placement;
`autoscaler.py`: the scaling decision). This module wires them to simulated time: delays are
SimPy events, and every change of routability goes through the router's `ServedModels`.

Request conservation across fleet changes:
- a drained (immediate) instance's requests end `dropped_on_drain`; a failed node's end
  `failed`, or are retried through the router when `retry_on_failure` is set;
- a redirected request leaves its first instance without a trace there (its input tokens are
  uncounted) and is counted once, where it finally ends.

Placement: an instance whose tp x pp GPUs fit on one node of a pool takes them there (first
fit, shared with other instances); a larger one takes whole nodes of one pool, every GPU of
each (vLLM runs the same number of GPUs on every node of a multi-node instance), and any of
those nodes failing or draining takes the instance with it.

Each node holds its GPUs as a `simpy.Container` (`Node.capacity`, level = free GPUs): placing
an instance takes its GPUs from its node's container (or empties each of its whole nodes'),
and its termination puts them back. An instance that finds no room waits in Scheduling and
`_place_pending` scans again whenever a node becomes Ready or GPUs are given back; it does
not wait on a `Container.get`. A get waits on one container, while placement is a choice
among containers (the first Ready node that fits, pools in config order, or several empty
nodes at once for an instance larger than a node), and a yielded get would resume the
waiting instance after the other events of its microsecond (a request routed meanwhile
would see another fleet), while the scan places it within the event that freed the room.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from ..engine.events import ROUTER, event_after
from ..engine.instance import Instance
from ..engine.request import Request, RequestState
from ..errors import ConfigError
from ..invariants import InvariantViolation
from ..limits import MAX_TIME_US, duration_us
from ..rng import subsystem_rng
from .autoscaler import Autoscaler
from .infra_spec import AutoscalerSpec, DelaySpec, EventSpec, LifecycleSpec, NodePoolSpec
from .lifecycle import InstanceRecord, InstanceState, Node, NodeState, Timeline, first_fit
from .router import Router

US_PER_S = 1_000_000
log = logging.getLogger("servesim")


@dataclass(frozen=True)
class SlotPlan:
    """One instance the fleet may run: which deployment, model and GPUs, and whether it
    exists from the start (autoscaler headroom and add_instance targets do not)."""

    index: int
    instance_id: str
    deployment: str
    model_key: str
    gpu_type: str
    gpus_needed: int
    pool: str | None
    initial: bool
    weight_bytes: float = 0.0


@dataclass
class FleetPlan:
    """Everything the infrastructure needs from the scenario, resolved."""

    slots: list[SlotPlan]
    node_pools: list[NodePoolSpec] = field(default_factory=list)
    lifecycle: LifecycleSpec = field(default_factory=LifecycleSpec)
    events: list[EventSpec] = field(default_factory=list)
    autoscalers: list[AutoscalerSpec] = field(default_factory=list)
    # served model key -> other names requests may use for it
    model_aliases: dict[str, list[str]] = field(default_factory=dict)
    # named deployment -> what prices its steps (model, GPU, layout, precision, latency
    # model and where its efficiencies come from); empty without named deployments
    latency_by_deployment: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def dynamic(self) -> bool:
        """Anything beyond a fixed fleet routable from t = 0?"""
        lc = self.lifecycle
        return bool(
            self.node_pools
            or self.events
            or self.autoscalers
            or lc.warm_up_request_count
            or lc.loading_delay.mean_s
            or lc.load_bandwidth_gb_per_s
            or any(not s.initial for s in self.slots)
        )


def _sample_delay_us(delay: DelaySpec, rng: np.random.Generator, what: str) -> int:
    if delay.stddev_s <= 0:
        return round(delay.mean_s * US_PER_S)
    drawn_us = rng.normal(delay.mean_s, delay.stddev_s) * US_PER_S
    if drawn_us > MAX_TIME_US:  # a tail draw of a huge spread: refused, naming the setting
        duration_us(drawn_us, what)
    return max(0, round(drawn_us))


def _record(slot: SlotPlan) -> InstanceRecord:
    return InstanceRecord(
        slot.index, slot.instance_id, slot.deployment, slot.model_key, slot.gpus_needed, slot.pool
    )


def slot_fits_pool(slot: SlotPlan, pool: NodePoolSpec) -> bool:
    """May `slot`'s instance be placed on `pool`: its deployment's pool (any of its GPU type
    without one), of the instance's GPU type? (Whether the pool's nodes can hold that many
    GPUs is `nodes_spanned`.)"""
    return (slot.pool is None or slot.pool == pool.name) and (
        pool.gpu_type.lower() == slot.gpu_type.lower()
    )


def nodes_spanned(gpus_needed: int, pool: NodePoolSpec) -> int:
    """Nodes of `pool` one instance of `gpus_needed` GPUs occupies: 1 when its GPUs fit on one
    node (it may share the node), GPUs / gpus_per_node whole nodes when they are a multiple
    of it, 0 when the pool cannot hold it (not a whole number of nodes, or more nodes than
    max_nodes; the scenario's checks make sure some pool can)."""
    per_node = pool.gpus_per_node
    if gpus_needed <= per_node:
        return 1
    if gpus_needed % per_node or gpus_needed // per_node > pool.max_nodes:
        return 0
    return gpus_needed // per_node


def managed_pools(plan: FleetPlan) -> set[str]:
    """The node pools an autoscaler manages: those its deployment's instances may be placed
    on (the deployment's pool, or every pool of its GPU type without one, that can hold an
    instance). Only there does a scale-up find no GPUs and order a node, for whichever
    instance waits for one, and only there is an idle node released; a pool no autoscaler
    places on keeps the nodes its events give it (until 2026-12-07 any autoscaler did both
    in every pool). Shared with the plan's start-up warning (`fleet_plan`), which must know
    the same pools. An autoscaler without a deployment scales the first one."""
    if not plan.slots:
        return set()
    scaled = {a.deployment or plan.slots[0].deployment for a in plan.autoscalers}
    return {
        pool.name
        for pool in plan.node_pools
        for slot in plan.slots
        if slot.deployment in scaled
        and slot_fits_pool(slot, pool)
        and nodes_spanned(slot.gpus_needed, pool)
    }


class Infrastructure:
    def __init__(
        self,
        env: simpy.Environment,
        plan: FleetPlan,
        instances: list[Instance],
        router: Router,
        seed: int,
        settle: Callable[[Instance, Request], None],
        is_done: Callable[[], tuple[bool, bool]],
        check_invariants: bool = False,
        grow: Callable[[str], int | None] | None = None,
    ) -> None:
        self.env = env
        self.plan = plan
        self.lifecycle = plan.lifecycle
        self.instances = instances
        self.router = router
        self.settle = settle  # ends a request's life at its instance (counts, sessions)
        self.is_done = is_done
        # Makes one more instance of a deployment whose planned slots are all used (its index;
        # None when the deployment cannot grow during the run).
        self.grow = grow
        self.check = check_invariants
        self.timeline = Timeline()
        self.records = [_record(s) for s in plan.slots]
        self.pools = {p.name: p for p in plan.node_pools}
        self.nodes: list[Node] = []
        # Instance index -> the nodes its GPUs are on (one, or several whole nodes). Kept after
        # termination: the cost report bills an instance's share of the nodes it held.
        self.placement: dict[int, list[Node]] = {}
        self._pool_counts = {p.name: 0 for p in plan.node_pools}
        self._pending: list[InstanceRecord] = []  # Scheduling: waiting for GPUs
        # Nodes that came up with nothing to place, and when (`_release_unclaimed`).
        self._unclaimed: list[tuple[Node, int]] = []
        self._provision_rng = subsystem_rng(seed, "node-provisioning")
        self._loading_rng = subsystem_rng(seed, "instance-loading")
        self.dropped_on_drain = 0
        self.failed = 0
        self.retried = 0
        # Scenario events due after the run ended, not applied (`_scenario_events`).
        self.events_after_end = 0
        self.redirected = 0
        # Why each instance stopped taking work: "immediate" | "redirect" | "wait" | "failure".
        self._end_cause: dict[int, str] = {}
        self.autoscalers = [
            Autoscaler(spec, self._deployment_of(spec)) for spec in plan.autoscalers
        ]
        # Only in a managed pool does a scale-up find no GPUs and order a node, and only there
        # is an idle node released (`managed_pools`).
        self.managed_pools = managed_pools(plan)
        for inst in instances:
            self._adopt(inst)

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        now = self.env.now
        for pool in self.plan.node_pools:
            for _ in range(pool.initial_nodes):
                node = self._new_node(pool, "initial")
                node.move(NodeState.READY, now, self.timeline, "initial")
        for slot in self.plan.slots:
            if slot.initial:
                self._create(self.records[slot.index], "initial")
        if self.plan.events:
            self.env.process(self._scenario_events())
        for scaler in self.autoscalers:
            self.env.process(self._autoscale(scaler))

    def _scenario_events(self):
        """The scenario's `events:` as one process: each applied at its time, in time order
        (config order among equal times)."""
        events = sorted(self.plan.events, key=lambda e: e.at_s)
        for k, event in enumerate(events):
            delay = round(event.at_s * US_PER_S) - self.env.now
            yield event_after(self.env, max(0, delay), ROUTER)
            if self._run_over():
                # Due after the run ended (no traffic left, every request finished): applied,
                # it would bill and change a fleet nobody uses any more.
                self.events_after_end = len(events) - k
                return
            self._apply(event)

    def _run_over(self) -> bool:
        exhausted, all_finished = self.is_done()
        return exhausted and all_finished

    def _deployment_of(self, spec: AutoscalerSpec) -> str:
        names = list(dict.fromkeys(s.deployment for s in self.plan.slots))
        name = spec.deployment or names[0]
        if name not in names:
            raise ConfigError(
                f"autoscaler.deployment: unknown deployment {name!r}; known: {', '.join(names)}"
            )
        return name

    # ------------------------------------------------------------------ nodes
    def _new_node(self, pool: NodePoolSpec, reason: str) -> Node:
        index = self._pool_counts[pool.name]
        self._pool_counts[pool.name] += 1
        node = Node(
            f"{pool.name}-{index}",
            pool.name,
            pool.gpu_type,
            [None] * pool.gpus_per_node,
            pool.cost_per_hour,
            created_us=self.env.now,
            env=self.env,
        )
        self.nodes.append(node)
        self.timeline.record(self.env.now, "node", node.node_id, "", node.state.value, reason)
        return node

    def _nodes_in(self, pool: str) -> list[Node]:
        return [n for n in self.nodes if n.pool == pool and n.state is not NodeState.TERMINATED]

    def add_node(self, pool_name: str, reason: str) -> Node | None:
        """Provision one node of `pool_name` (None when the pool is at max_nodes)."""
        pool = self.pools[pool_name]
        if len(self._nodes_in(pool_name)) >= pool.max_nodes:
            return None
        node = self._new_node(pool, reason)
        delay = _sample_delay_us(
            pool.provisioning_delay,
            self._provision_rng,
            f"node_pools[{pool.name}].provisioning_delay (a draw)",
        )
        self.env.process(self._provisioning(node, delay))
        return node

    def _provisioning(self, node: Node, delay_us: int):
        """A new node's process: provisioning takes `delay_us`, then it is Ready (unless an
        event ended it meanwhile, or the run did)."""
        yield event_after(self.env, delay_us, ROUTER)
        if self._run_over():
            # The run is over (no traffic left, every request finished): it ends with the
            # node still Provisioning, as a horizon would, rather than recording changes after
            # its end (until 2026-12-07 a node ordered late came up, and its instances loaded,
            # on the timeline after the run's last event).
            return
        self._node_ready(node)

    def _node_ready(self, node: Node) -> None:
        if node.state is not NodeState.PROVISIONING:
            return
        node.move(NodeState.READY, self.env.now, self.timeline, "provisioned")
        self._place_pending()
        if not node.allocated_gpus:
            # Ordered for an instance that was cancelled (scaled down, drained) while it
            # waited: released at the autoscaler's next decision unless that decision uses it
            # (a scale-up at this very microsecond would otherwise order another node).
            self._unclaimed.append((node, self.env.now))
        if self.check:
            self.check_invariants()

    def _retire_node(self, node: Node, reason: str) -> None:
        if node.state is not NodeState.TERMINATED:
            node.move(NodeState.TERMINATED, self.env.now, self.timeline, reason)

    def _maybe_release_node(self, node: Node) -> None:
        """An empty node goes away when it is draining, or when the autoscaler manages its
        pool and the pool is above min_nodes."""
        if node.allocated_gpus or node.state is NodeState.TERMINATED:
            return
        if node.state is NodeState.DRAINING:
            self._retire_node(node, "drained")
            return
        pool = self.pools[node.pool]
        if (
            pool.name in self.managed_pools
            and node.state is NodeState.READY
            and len(self._nodes_in(pool.name)) > pool.min_nodes
            and not any(self._fits_pool(r, pool.name) for r in self._pending)
        ):
            self._retire_node(node, "scale-down: idle node")

    # ------------------------------------------------------------------ instances
    def _create(self, rec: InstanceRecord, reason: str) -> None:
        rec.move(InstanceState.SCHEDULING, self.env.now, self.timeline, reason)
        self._pending.append(rec)
        self._place_pending()
        if rec in self._pending:
            self._provision_for(rec)  # orders a node only in a pool an autoscaler manages

    def _fits_pool(self, rec: InstanceRecord, pool_name: str) -> bool:
        return slot_fits_pool(self.plan.slots[rec.index], self.pools[pool_name])

    def nodes_of(self, rec: InstanceRecord) -> list[Node]:
        """The nodes holding `rec`'s GPUs (empty before it is placed or without node pools)."""
        return self.placement.get(rec.index, [])

    def nodes_spanned(self, rec: InstanceRecord, pool: NodePoolSpec) -> int:
        """Nodes of `pool` one instance of `rec` occupies (module-level `nodes_spanned`)."""
        return nodes_spanned(rec.gpus_needed, pool)

    def _whole_nodes_fit(self, rec: InstanceRecord) -> list[Node] | None:
        """For an instance larger than a node: the first empty Ready nodes (index order), as
        many as it spans, of the first pool (config order) of its GPU type that has them."""
        for pool in self.plan.node_pools:
            needed = self.nodes_spanned(rec, pool)
            if needed < 2 or not self._fits_pool(rec, pool.name):
                continue
            empty = [
                n
                for n in self._nodes_in(pool.name)
                if n.state is NodeState.READY and n.allocated_gpus == 0
            ]
            if len(empty) >= needed:
                return empty[:needed]
        return None

    def _provision_whole_nodes(self, pool: NodePoolSpec) -> bool:
        """Scale-up for instances larger than a node of `pool`: provision the empty nodes the
        instances waiting for it still lack, all of them or none (an instance cannot start on
        part of its nodes, so a pool without room for all of them is left alone). True when
        the pool covers the demand."""
        empty = sum(
            1
            for n in self._nodes_in(pool.name)
            if n.state in (NodeState.READY, NodeState.PROVISIONING) and n.allocated_gpus == 0
        )
        demand = sum(
            self.nodes_spanned(r, pool)
            for r in self._pending
            if self._fits_pool(r, pool.name) and self.nodes_spanned(r, pool) > 1
        )
        missing = demand - empty
        if missing <= 0:
            return True
        if len(self._nodes_in(pool.name)) + missing > pool.max_nodes:
            return False
        for _ in range(missing):
            self.add_node(pool.name, "scale-up")
        return True

    def _provision_for(self, rec: InstanceRecord) -> None:
        """Scale-up found no free GPUs: provision a node in a pool an autoscaler manages,
        unless one already on its way has room for every instance waiting for that pool
        (whole nodes for an instance larger than a node)."""
        for pool in self.plan.node_pools:
            if pool.name not in self.managed_pools:
                continue
            span = self.nodes_spanned(rec, pool)
            if not span or not self._fits_pool(rec, pool.name):
                continue
            if span > 1:
                if self._provision_whole_nodes(pool):
                    return
                continue
            coming = sum(
                n.free_gpus for n in self._nodes_in(pool.name) if n.state is NodeState.PROVISIONING
            )
            waiting = sum(r.gpus_needed for r in self._pending if self._fits_pool(r, pool.name))
            if coming >= waiting or self.add_node(pool.name, "scale-up") is not None:
                return

    def _reprovision_pending(self) -> None:
        """A node on its way was withdrawn (drained or failed while provisioning): the
        instances that were waiting for it order another, as their scale-up did (in the
        pools an autoscaler manages)."""
        for rec in list(self._pending):
            self._provision_for(rec)

    def _place_pending(self) -> None:
        if not self.plan.node_pools:
            for rec in list(self._pending):
                self._pending.remove(rec)
                self._load(rec)
            return
        for rec in list(self._pending):
            slot = self.plan.slots[rec.index]
            node = first_fit(self.nodes, slot.gpu_type, rec.gpus_needed, rec.pool)
            if node is not None:
                node.allocate(rec.instance_id, rec.gpus_needed)
                nodes = [node]
            else:
                nodes = self._whole_nodes_fit(rec)
                if nodes is None:
                    continue
                for whole in nodes:
                    whole.allocate(rec.instance_id, len(whole.gpus))
            rec.node = nodes[0]
            self.placement[rec.index] = nodes
            self._pending.remove(rec)
            self._load(rec)

    def _load(self, rec: InstanceRecord) -> None:
        now = self.env.now
        rec.move(InstanceState.LOADING, now, self.timeline, f"placed on {self._where(rec)}")
        slot = self.plan.slots[rec.index]
        lc = self.lifecycle
        if slot.initial and lc.initial_instances_loaded and now == 0:
            self._loaded(rec)
            return
        delay = _sample_delay_us(
            lc.loading_delay, self._loading_rng, "instance_lifecycle.loading_delay (a draw)"
        )
        if lc.load_bandwidth_gb_per_s > 0:
            load_us = slot.weight_bytes / (lc.load_bandwidth_gb_per_s * 1e9) * US_PER_S
            if delay + load_us > MAX_TIME_US:
                duration_us(
                    delay + load_us,
                    f"loading {slot.weight_bytes:.4g} bytes of weights at "
                    f"instance_lifecycle.load_bandwidth_gb_per_s {lc.load_bandwidth_gb_per_s:g}",
                )
            delay += round(load_us)
        if delay <= 0:
            self._loaded(rec)
            return
        self.env.process(self._loading(rec, delay))

    def _loading(self, rec: InstanceRecord, delay_us: int):
        """A placed instance's process: loading its weights takes `delay_us`, then it serves
        (unless it was terminated meanwhile, or the run ended: then it ends Loading, as for
        a node in `_provisioning`)."""
        yield event_after(self.env, delay_us, ROUTER)
        if not self._run_over():
            self._loaded(rec)

    def _where(self, rec: InstanceRecord) -> str:
        nodes = self.nodes_of(rec)
        return ", ".join(n.node_id for n in nodes) if nodes else "fleet"

    def _loaded(self, rec: InstanceRecord) -> None:
        if rec.state is not InstanceState.LOADING:
            return  # terminated while loading
        now = self.env.now
        rec.loaded_us = now
        inst = self._instance(rec)
        warm = self.lifecycle.warm_up_request_count
        if warm > 0:
            rec.warm_up_left = warm
            inst.warm_up_left = warm
            inst.warm_up_factor = self.lifecycle.warm_up_ttft_factor
            rec.move(InstanceState.WARMING_UP, now, self.timeline, "loaded")
        else:
            rec.move(InstanceState.ACTIVE, now, self.timeline, "loaded")
        self.router.served.make_routable(rec.model, rec.index)
        self.router.unpark_after_this_instant(rec.model)
        if self.check:
            self.check_invariants()

    def on_completed(self, index: int) -> None:
        """A request completed on instance `index`: K completions end its warm-up."""
        rec = self.records[index]
        if rec.state is InstanceState.WARMING_UP:
            rec.warm_up_left -= 1
            if rec.warm_up_left <= 0:
                rec.move(InstanceState.ACTIVE, self.env.now, self.timeline, "warmed up")

    def _instance(self, rec: InstanceRecord) -> Instance:
        return self.instances[rec.index]

    def add_instance(self, deployment: str, reason: str) -> InstanceRecord | None:
        """Bring up the next unused slot of `deployment`, or a new one when every planned slot
        has been used (None when the deployment cannot grow)."""
        for slot, rec in zip(self.plan.slots, self.records, strict=True):
            if slot.deployment == deployment and rec.state is None:
                self._create(rec, reason)
                return rec
        index = self.grow(deployment) if self.grow is not None else None
        if index is None:
            return None
        rec = _record(self.plan.slots[index])
        self.records.append(rec)
        self._adopt(self.instances[index])
        self._create(rec, reason)
        return rec

    def _adopt(self, inst: Instance) -> None:
        inst.on_orphan = lambda req: self._orphan(inst, req)

    # ------------------------------------------------------------------ going away
    def drain(self, rec: InstanceRecord, policy: str, reason: str) -> None:
        now = self.env.now
        if rec.state in (InstanceState.SCHEDULING, InstanceState.LOADING):
            self._terminate(rec, f"{reason} (before serving)")
            return
        if rec.state not in (InstanceState.WARMING_UP, InstanceState.ACTIVE):
            return  # already draining or gone
        rec.move(InstanceState.DRAINING, now, self.timeline, f"{reason} ({policy})")
        index = rec.index
        self._end_cause[index] = policy
        self.router.served.make_unroutable(rec.model, index)
        inst = self.instances[index]
        if policy == "immediate":
            for req in inst.evict():
                self._end(inst, req, RequestState.DROPPED_ON_DRAIN)
            self._terminate(rec, "drained (immediate)")
            return
        if policy == "redirect":
            for req in inst.take_unstarted():
                self._reroute(index, req)
                self.redirected += 1
        inst.on_idle = lambda i, r=rec: self._idle(r)
        self._idle(rec)

    def _idle(self, rec: InstanceRecord) -> None:
        """A draining instance with nothing left (queued, running or arriving) terminates."""
        inst = self._instance(rec)
        if rec.state is not InstanceState.DRAINING:
            return
        if inst.engine.has_work or inst.pending_enqueue or inst.inbox.items:
            return
        self._terminate(rec, "drained")  # stops the (empty) instance

    def fail(self, rec: InstanceRecord, reason: str) -> None:
        if rec.state in (None, InstanceState.TERMINATED):
            return
        index = rec.index
        self._end_cause[index] = "failure"
        if rec.routable:
            self.router.served.make_unroutable(rec.model, index)
        inst = self.instances[index]
        retry = self.lifecycle.retry_on_failure
        for req in inst.evict():
            if retry:
                self._reroute(index, req)
                self.retried += 1
            else:
                self._end(inst, req, RequestState.FAILED)
        self._terminate(rec, reason)

    def _terminate(self, rec: InstanceRecord, reason: str) -> None:
        inst = self._instance(rec)
        if not inst.terminated:
            inst.evict()  # nothing left in it by now; stops its processes
        if rec in self._pending:
            self._pending.remove(rec)
        rec.move(InstanceState.TERMINATED, self.env.now, self.timeline, reason)
        nodes = self.nodes_of(rec)
        for node in nodes:
            node.release(rec.instance_id)
        for node in nodes:
            self._maybe_release_node(node)
        self._place_pending()
        if self.check:
            self.check_invariants()

    def _end(self, inst: Instance, req: Request, state: RequestState) -> None:
        req.state = state
        req.completion_us = self.env.now
        req.num_new_tokens = 0
        if state is RequestState.DROPPED_ON_DRAIN:
            self.dropped_on_drain += 1
        else:
            self.failed += 1
        self.settle(inst, req)

    def _reroute(self, index: int, req: Request) -> None:
        self.router.finished(index)
        self.instances[index].engine.forget(req)
        req.restart()
        self.router.reinject(req)

    def _orphan(self, inst: Instance, req: Request) -> None:
        """A request reached an instance that had stopped taking work in the same instant
        (it was routed there just before): it shares the fate of that instance's requests."""
        cause = self._end_cause.get(inst.index, "wait")
        if cause == "immediate":
            self._end(inst, req, RequestState.DROPPED_ON_DRAIN)
        elif cause == "failure" and not self.lifecycle.retry_on_failure:
            self._end(inst, req, RequestState.FAILED)
        else:
            self._reroute(inst.index, req)
            if cause == "failure":
                self.retried += 1
            else:
                self.redirected += 1

    # ------------------------------------------------------------------ events
    def _apply(self, event: EventSpec) -> None:
        self._apply_event(event)
        if self.check:
            self.check_invariants()

    def _apply_event(self, event: EventSpec) -> None:
        policy = event.drain_policy or self.lifecycle.drain_policy
        action = event.action
        reason = f"event {action} at {event.at_s:g} s"
        if action in ("drain_instance", "fail_instance"):
            rec = self.record(event.target)
            if rec.state is None or rec.state is InstanceState.TERMINATED:
                # A slot the fleet has not created yet (an autoscaler's or add_instance's) or
                # an instance already gone: nothing to drain or fail, said on the timeline
                # rather than silently, as for a node.
                why = "not created yet" if rec.state is None else "already terminated"
                self.timeline.record(
                    self.env.now, "event", event.target, "", "", f"{reason}: {why}"
                )
            elif action == "drain_instance":
                self.drain(rec, policy, reason)
            else:
                self.fail(rec, reason)
        elif action == "add_instance":
            deployment = event.deployment or self.plan.slots[0].deployment
            self.add_instance(deployment, reason)
        elif action == "add_node":
            if self.add_node(event.pool, reason) is None:
                # The pool is at max_nodes: said on the timeline rather than silently.
                limit = self.pools[event.pool].max_nodes
                self.timeline.record(
                    self.env.now, "event", event.pool, "", "", f"{reason}: at max_nodes {limit}"
                )
        elif action in ("drain_node", "fail_node"):
            node = self.node(event.node)
            if node is None or node.state is NodeState.TERMINATED:
                # Said on the timeline rather than silently, as for an instance slot.
                why = "no such node yet" if node is None else "already terminated"
                self.timeline.record(self.env.now, "event", event.node, "", "", f"{reason}: {why}")
                return
            if action == "drain_node" and node.state is NodeState.PROVISIONING:
                # Nothing runs there yet: the request for it is withdrawn (Provisioning →
                # Terminated), as a failure would.
                self._retire_node(node, reason)
                self._reprovision_pending()
                return
            if action == "drain_node" and node.state is NodeState.READY:
                node.move(NodeState.DRAINING, self.env.now, self.timeline, reason)
            if action == "fail_node":
                # The node is gone first, so releasing its instances' GPUs cannot look like an
                # idle node being scaled down.
                self._retire_node(node, reason)
            for rec in self.records:
                # An instance on several nodes goes with any one of them.
                if node in self.nodes_of(rec) and rec.state is not InstanceState.TERMINATED:
                    if action == "fail_node":
                        self.fail(rec, reason)
                    else:
                        self.drain(rec, policy, reason)
            if action == "drain_node":
                self._maybe_release_node(node)
            else:
                self._reprovision_pending()

    def record(self, instance_id: str) -> InstanceRecord:
        for rec in self.records:
            if rec.instance_id == instance_id:
                return rec
        raise KeyError(instance_id)

    def node(self, node_id: str) -> Node | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    # ------------------------------------------------------------------ autoscaling
    def _autoscale(self, scaler: Autoscaler):
        spec = scaler.spec
        interval_us = round(spec.interval_s * US_PER_S)
        delay_us = round(spec.scrape_delay_s * US_PER_S)
        while not self._nothing_left_to_scale(scaler):
            yield event_after(self.env, interval_us, ROUTER)
            if self._run_over():  # the run ended during the interval: nothing left to serve
                return
            value = self.signal(scaler.deployment, spec.signal)
            if delay_us > 0:
                # The next tick does not wait for this scrape's decision.
                self.env.process(self._scale_after(scaler, value, delay_us))
            else:
                self._scale(scaler, value)

    def _scale_after(self, scaler: Autoscaler, value: float, delay_us: int):
        yield event_after(self.env, delay_us, ROUTER)
        if not self._run_over():
            self._scale(scaler, value)

    def _nothing_left_to_scale(self, scaler: Autoscaler) -> bool:
        """Stop ticking once the traffic is over and the fleet is at rest: everything has
        finished, or nothing runs, loads or provisions and the scaler just declined to act
        (so a run cannot go on forever waiting for capacity that never comes)."""
        exhausted, all_finished = self.is_done()
        if not exhausted:
            return False
        if all_finished:
            return True
        busy = any(i.engine.has_work or i.pending_enqueue for i in self.instances)
        loading = any(r.state is InstanceState.LOADING for r in self.records)
        provisioning = any(n.state is NodeState.PROVISIONING for n in self.nodes)
        return not (busy or loading or provisioning) and scaler.last_step == 0

    def _live(self, deployment: str) -> list[InstanceRecord]:
        return [
            r
            for s, r in zip(self.plan.slots, self.records, strict=True)
            if s.deployment == deployment and r.live
        ]

    def _scale(self, scaler: Autoscaler, value: float) -> None:
        now = self.env.now
        live = self._live(scaler.deployment)
        step = scaler.decide(now, value, len(live))
        if self.check:
            self.check_invariants()
            # The autoscaler itself never grows the deployment past max_instances (scheduled
            # add_instance events may: they are the operator's, not the scaler's).
            if step > 0 and scaler.spec.min_instances <= len(live) >= scaler.spec.max_instances:
                raise InvariantViolation(
                    "autoscaler bounds (INV-FLEET)",
                    now,
                    f"{scaler.deployment}: scale-up with {len(live)} live instances, "
                    f"max_instances {scaler.spec.max_instances}",
                )
        scaler.samples.append((now, value, len(live)))
        if step > 0:
            if len(live) < scaler.spec.min_instances:
                why = f"scale-up: {len(live)} live < min_instances {scaler.spec.min_instances}"
            else:
                why = f"scale-up: {scaler.spec.signal}={value:.3g}"
            if self.add_instance(scaler.deployment, why) is None:
                # The run has made as many instances as one run may (limits.MAX_INSTANCES):
                # the ask changes nothing.
                step = 0
                scaler.scale_ups -= 1
                scaler.refused_scale_ups += 1
                if not scaler.refusing:
                    # One row per spell of refusals (until the fleet next changes), not one
                    # per tick: the count is in fleet_metrics.
                    scaler.refusing = True
                    self.timeline.record(
                        now,
                        "autoscaler",
                        scaler.deployment,
                        "",
                        "",
                        f"{why} refused: the run has made {len(self.records)} instances, the "
                        "most one run may",
                    )
            else:
                scaler.refusing = False
        elif step < 0:
            scaler.refusing = False
            # The newest serving instance goes first (of instances created together, the
            # highest slot); one still coming up is cancelled first.
            victim = max(
                live, key=lambda r: (r.state is not InstanceState.ACTIVE, r.created_us, r.index)
            )
            self.drain(victim, self.lifecycle.drain_policy, f"scale-down: {scaler.spec.signal}")
        scaler.last_step = step
        self._release_unclaimed()

    def _release_unclaimed(self) -> None:
        """Nodes that came up with nothing to place and are still empty at a decision made
        after they came up go, as any idle node would (not billed to the end of the run);
        every autoscaler deciding at the microsecond a node comes up may still use it."""
        now = self.env.now
        unclaimed, self._unclaimed = self._unclaimed, []
        for node, ready_us in unclaimed:
            if ready_us == now:
                self._unclaimed.append((node, ready_us))
            else:
                self._maybe_release_node(node)

    def warn_refused_scale_ups(self) -> None:
        """Said once at the end of a run whose autoscaler could not add instances: the
        timeline and fleet_metrics have the details, but a run that served its load on fewer
        instances than asked for should not look like one that did not need them."""
        for scaler in self.autoscalers:
            if scaler.refused_scale_ups:
                log.warning(
                    "autoscaler of deployment %s: %d scale-ups refused, the run having made "
                    "%d instances, the most one run may",
                    scaler.deployment,
                    scaler.refused_scale_ups,
                    len(self.records),
                )

    def signal(self, deployment: str, name: str) -> float:
        """Mean per routable instance of the deployment; with none routable, the requests
        waiting for one (so a fleet scaled to zero still sees demand). Requests waiting at the
        router for the deployment's model count as demand on its instances too: at the
        microsecond an instance becomes routable they have not reached it yet, and a tick then
        read an idle fleet and scaled it down under them."""
        indices = [
            s.index
            for s, r in zip(self.plan.slots, self.records, strict=True)
            if s.deployment == deployment and r.routable
        ]
        model = next(s.model_key for s in self.plan.slots if s.deployment == deployment)
        waiting = len(self.router.parked.get(model, ()))
        if not indices:
            return float(waiting)
        values = []
        for i in indices:
            engine = self.instances[i].engine
            if name == "kv_utilization":
                values.append(engine.kv.used_blocks / engine.kv.total_blocks)
            elif name == "queue_depth":
                values.append(len(engine.waiting))
            else:
                values.append(self.router.in_flight[i])
        if name == "kv_utilization":
            return float(np.mean(values))
        return float(np.mean(values)) + waiting / len(indices)

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """GPU accounting and routability agree with the instances' states; a broken law
        stops the run as an InvariantViolation naming it (a servesim bug, exit 3)."""
        try:
            self._assert_fleet_laws()
        except AssertionError as exc:
            detail = ", ".join(repr(a) for a in exc.args) or "fleet self-check failed"
            raise InvariantViolation("fleet state (INV-FLEET)", self.env.now, detail) from None

    def _assert_fleet_laws(self) -> None:
        held_on_nodes = 0
        for node in self.nodes:
            # The container (the capacity) and the holder record (who has which GPU) agree.
            level = node.capacity.level
            assert 0 <= level <= node.capacity.capacity == len(node.gpus), node
            assert level == node.free_gpus_recorded, (node, level)
            held_on_nodes += len(node.gpus) - level
            holders = {g for g in node.gpus if g is not None}
            for holder in holders:
                rec = self.record(holder)
                assert node in self.nodes_of(rec) and rec.state is not InstanceState.TERMINATED, rec
        for rec in self.records:
            nodes = self.nodes_of(rec)
            if rec.state is InstanceState.TERMINATED or not nodes:
                continue
            # Exactly tp x pp GPUs, on one node or on whole nodes of one pool.
            held = sum(len(n.gpu_ids(rec.instance_id)) for n in nodes)
            assert held == rec.gpus_needed, (rec, held)
            if len(nodes) > 1:
                assert len({n.pool for n in nodes}) == 1, rec
                assert all(
                    n.free_gpus == 0 and len(n.gpu_ids(rec.instance_id)) == len(n.gpus)
                    for n in nodes
                ), rec
        placed = sum(
            r.gpus_needed
            for r in self.records
            if r.state is not InstanceState.TERMINATED and self.nodes_of(r)
        )
        assert held_on_nodes == placed, (held_on_nodes, placed)
        served = self.router.served
        for key, indices in served.routable.items():
            for i in indices:
                assert self.records[i].routable and self.records[i].model == key, i
