"""Capacity held as SimPy resources (docs/architecture.md, "What runs in simulated time"): each
node's GPUs are a `simpy.Container` next to the record of who holds which GPU, and the
prefill, decode and unified pools of a disaggregated cluster are separate resource groups.

Laws first, checked after every SimPy event that changed the fleet (random fleets: node
levels agree with the holder record and stay within [0, capacity]; GPUs held on nodes equal
tp x pp x dp of every placed, live instance; PD pools partition the targets by role and
each phase runs in its own pool), then hand-computed levels."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest
import simpy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import simulator
from simulator.cluster import cluster as cluster_module
from simulator.cluster import infrastructure as infrastructure_module
from simulator.cluster import pd as pd_module  # PD runs import it when they build one
from simulator.cluster.infrastructure import Infrastructure
from simulator.cluster.lifecycle import InstanceState, Node, NodeState, Timeline
from simulator.cluster.pools import Pools
from simulator.engine.events import Environment
from tests.cluster.test_infrastructure import fleet_event

LLAMA = "meta-llama/llama-3.1-8b-instruct"


class WatchedEnvironment(Environment):
    """The run's environment, calling `after_step` once each event's callbacks are done (an
    override of SimPy's public `step`, which `run` calls for every event)."""

    after_step = None

    def step(self) -> None:
        super().step()
        if self.after_step is not None:
            self.after_step()


@contextmanager
def watched_runs(check):
    """Within the block, every run calls `check(env, infra)` after every event (infra is None
    on a fixed fleet), and once more at its end; yields the number of checks made."""
    made = [0]
    built: list[WatchedEnvironment] = []

    class Env(WatchedEnvironment):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.infra = None
            built.append(self)

            def after_step() -> None:
                made[0] += 1
                check(self, self.infra)

            self.after_step = after_step

    class Infra(Infrastructure):
        def __init__(self, env, *args, **kwargs) -> None:
            super().__init__(env, *args, **kwargs)
            env.infra = self

    with (
        mock.patch.object(cluster_module, "Environment", Env),
        # The cluster imports Infrastructure when a run has a dynamic fleet: from its module.
        mock.patch.object(infrastructure_module, "Infrastructure", Infra),
    ):
        yield made
    for env in built:
        check(env, env.infra)
        made[0] += 1


# ---------------------------------------------------------------------- node GPUs
def assert_node_laws(infra, gpus_of_deployment: dict[str, int]) -> None:
    """The laws on a live `Infrastructure` (its nodes' containers) or on a result's
    `FleetRecord` (each node's level as the run left it)."""
    held_on_nodes = 0
    for node in infra.nodes:
        level = node.free_gpus  # the container's level
        if isinstance(infra, Infrastructure):
            assert node.capacity.capacity == len(node.gpus), node
        assert 0 <= level <= len(node.gpus), (node, level)
        assert level == sum(1 for g in node.gpus if g is None), (node, level)
        held_on_nodes += len(node.gpus) - level
    placed = 0
    for slot, rec in zip(infra.plan.slots, infra.records, strict=True):
        if rec.state in (None, InstanceState.SCHEDULING, InstanceState.TERMINATED):
            assert not any(rec.instance_id in n.gpus for n in infra.nodes), rec
            continue
        placed += gpus_of_deployment[slot.deployment]
    assert held_on_nodes == placed, (held_on_nodes, placed)


def _layout(gpus_per_node: int, max_nodes: int):
    """(tp, pp) layouts a pool of `gpus_per_node`-GPU nodes can hold: within one node, or
    whole nodes (at most max_nodes of them)."""
    return st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2])).filter(
        lambda lay: (
            (g := lay[0] * lay[1]) <= gpus_per_node
            or (g % gpus_per_node == 0 and g // gpus_per_node <= max_nodes)
        )
    )


@st.composite
def fleets(draw):
    gpus_per_node = draw(st.sampled_from([2, 4, 8]))
    max_nodes = draw(st.integers(2, 4))
    layouts = draw(st.lists(_layout(gpus_per_node, max_nodes), min_size=1, max_size=2))
    deployments = [
        {"name": f"d{k}", "tp": tp, "pp": pp, "num_instances": draw(st.integers(0, 2))}
        for k, (tp, pp) in enumerate(layouts)
    ]
    assume(any(d["num_instances"] for d in deployments))
    actions = [
        "add_instance",
        "drain_instance",
        "fail_instance",
        "add_node",
        "drain_node",
        "fail_node",
    ]
    events = []
    instances = sum(d["num_instances"] for d in deployments)
    for at_s, action, k, policy in draw(
        st.lists(
            st.tuples(
                st.integers(0, 8),
                st.sampled_from(actions),
                st.integers(0, 3),
                st.sampled_from(["immediate", "wait", "redirect"]),
            ),
            max_size=6,
        )
    ):
        deployment = deployments[k % len(deployments)]["name"]
        events.append(fleet_event(at_s, action, k, policy, instances, deployment))
    scenario = {
        "model": LLAMA,
        "hardware": "H100",
        "seed": draw(st.integers(0, 50)),
        "check_invariants": True,
        "engine": {"total_kv_blocks": 1500, "max_num_running_reqs": 8},
        "node_pools": [
            {
                "name": "p",
                "gpu_type": "H100",
                "gpus_per_node": gpus_per_node,
                "initial_nodes": draw(st.integers(1, 2)),
                "max_nodes": max_nodes,
                "provisioning_delay": {"mean_s": 2},
            }
        ],  # fmt: skip
        "deployments": deployments,
        "instance_lifecycle": {"loading_delay": {"mean_s": draw(st.sampled_from([0, 2]))}},
        "events": events,
        "workload": {
            "rate": 20,
            "num_requests": 60,
            "prompt_tokens": {"distribution": "constant", "value": 256},
            "output_tokens": {"distribution": "constant", "value": 16},
        },
    }
    gpus = {d["name"]: d["tp"] * d["pp"] for d in deployments}  # dp is 1 on a changing fleet
    return scenario, gpus


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_node_containers_agree_with_the_holder_record_at_every_transition(fleet):
    scenario, gpus_of_deployment = fleet
    transitions_seen = [0]

    def check(env, infra):
        if infra is None:
            return
        if len(infra.timeline.rows) != transitions_seen[0]:  # this event changed the fleet
            transitions_seen[0] = len(infra.timeline.rows)
            assert_node_laws(infra, gpus_of_deployment)

    with watched_runs(check) as made:
        result = simulator.simulate(scenario, warn_unsteady=False)
    assert made[0] > 0 and transitions_seen[0] == len(result.infrastructure.timeline.rows)
    # The result's record of the fleet keeps the laws the live fleet ended with.
    assert_node_laws(result.infrastructure, gpus_of_deployment)


def test_a_node_of_8_gpus_with_tp2_and_tp4_has_2_free_then_4_when_tp2_ends():
    env = simpy.Environment()
    node = Node("p-0", "p", "H100", [None] * 8, 0.0, env=env)
    node.move(NodeState.READY, 0, Timeline(), "initial")
    assert node.capacity.capacity == 8 and node.capacity.level == 8
    assert node.allocate("a", 2) == [0, 1]
    assert node.allocate("b", 4) == [2, 3, 4, 5]
    # Granted at once: the level dropped before any event ran.
    assert node.capacity.level == 2 == node.free_gpus_recorded
    assert node.release("a") == 2
    assert node.capacity.level == 4 == node.free_gpus_recorded
    assert node.gpus == [None, None, "b", "b", "b", "b", None, None]
    env.run()  # the gets' and puts' success events carry nothing: processing them moves no GPU
    assert node.capacity.level == 4


def test_the_same_case_in_a_run_ends_with_4_gpus_free():
    """One 8-GPU node; a TP2 and a TP4 instance at t = 0 (level 2); the TP2 instance is
    drained at 1 s, immediately, and its GPUs go back (level 4)."""
    levels: list[tuple[int, int]] = []

    def check(env, infra):
        if infra is not None and infra.nodes:
            level = infra.nodes[0].capacity.level
            if not levels or levels[-1][1] != level:
                levels.append((int(env.now), level))

    scenario = {
        "model": LLAMA,
        "hardware": "H100",
        "check_invariants": True,
        "engine": {"total_kv_blocks": 1500},
        "node_pools": [{"name": "p", "gpu_type": "H100", "gpus_per_node": 8, "initial_nodes": 1}],
        "deployments": [{"name": "two", "tp": 2}, {"name": "four", "tp": 4}],
        "instance_lifecycle": {"initial_instances_loaded": True},
        "events": [
            {
                "at_s": 1,
                "action": "drain_instance",
                "target": "instance_0",
                "drain_policy": "immediate",
            }
        ],
        "workload": {
            "rate": 5,
            "num_requests": 10,
            "prompt_tokens": {"distribution": "constant", "value": 128},
            "output_tokens": {"distribution": "constant", "value": 8},
        },
    }
    with watched_runs(check):
        result = simulator.simulate(scenario, warn_unsteady=False)
    assert levels == [(0, 2), (1_000_000, 4)]
    node = result.infrastructure.nodes[0]
    assert (
        node.gpus
        == [None, None, "instance_1", "instance_1", "instance_1", "instance_1"] + [None] * 2
    )
    assert node.free_gpus == 4 == node.free_gpus_recorded


# ---------------------------------------------------------------------- PD pools
def assert_pools_partition(pools: Pools, roles: list[str]) -> None:
    members = [i for pool in pools for i in pool.members]
    assert sorted(members) == list(range(len(roles)))  # every target in exactly one pool
    for pool in pools:
        assert list(pool.members) == sorted(pool.members)
        assert all(roles[i] == pool.role for i in pool.members), pool
        # Fixed membership on a fixed fleet: every member serves throughout.
        assert pool.serving_now == len(pool)
        if pool.serving is not None:
            assert pool.serving.capacity == len(pool)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefill=st.integers(1, 3),
    decode=st.integers(1, 3),
    unified=st.integers(0, 2),
    decider=st.sampled_from(["always", "never", "prompt-length"]),
    seed=st.integers(0, 50),
)
def test_pd_pools_partition_the_targets_by_role_at_all_times(
    prefill, decode, unified, decider, seed
):
    roles = ["prefill"] * prefill + ["decode"] * decode + ["unified"] * unified
    seen: list[Pools] = []

    def check(env, infra):
        if seen:
            assert_pools_partition(seen[0], roles)

    scenario = {
        "seed": seed,
        "check_invariants": True,
        "engine": {"total_kv_blocks": 1500},
        "cluster": {
            "num_instances": len(roles),
            "pd": {
                "prefill_instances": prefill,
                "decode_instances": decode,
                "decider": decider,
                "prompt_length_threshold": 100 if decider == "prompt-length" else None,
            },
        },
        "workload": {
            "rate": 20,
            "num_requests": 30,
            "prompt_tokens": {"mean": 200, "stdev": 100, "min": 1, "max": 600},
            "output_tokens": {"distribution": "constant", "value": 8},
        },
    }
    original = pd_module.Disaggregator

    def capture(pools, *args, **kwargs):
        seen.append(pools)
        return original(pools, *args, **kwargs)

    with (
        mock.patch.object(pd_module, "Disaggregator", side_effect=capture),
        watched_runs(check) as made,
    ):
        result = simulator.simulate(scenario, warn_unsteady=False)
    assert made[0] > 0
    assert_pools_partition(seen[0], roles)
    # The result keeps the pools' membership and serving level, not the pools.
    pools = result.pd.pools
    assert [(p.role, p.members, p.serving_at_end) for p in pools] == [
        (p.role, p.members, p.serving_now) for p in seen[0]
    ]
    # Each phase ran in its own pool: the decisions read membership from the pools.
    index = {iid: i for i, iid in enumerate(result.instance_ids)}
    for parent in result.pd.parents:
        assert index[parent.prefill_sub.instance_id] in pools.prefill
        if parent.decode_sub is not None:
            assert index[parent.decode_sub.instance_id] in pools.decode
    assert [pools.role_of(i) for i in range(len(roles))] == result.instance_roles


def test_pools_from_roles_refuse_an_unknown_role():
    env = simpy.Environment()
    pools = Pools.from_roles(env, ["prefill", "decode", "decode"])
    assert [list(p) for p in pools] == [[0], [1, 2], []]
    assert pools.unified.serving is None and pools.decode.serving.level == 2
    with pytest.raises(ValueError, match="unknown pool role 'encode'"):
        Pools.from_roles(env, ["prefill", "encode"])
