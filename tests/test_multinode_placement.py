"""An instance larger than one node of its pool takes whole nodes of that pool
(docs/infrastructure.md, "Node pools and GPU placement"; docs/parallelism.md, "Deployments,
fleets and plans").

Laws first (GPUs reserved = instances x tp x pp and never more than the pool has; any node of
a multi-node instance failing ends the instance and leaves every request counted;
determinism), then placement, provisioning, cost and pricing with hand-computed figures,
then bad input."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simulator
from simulator.api import as_scenario, plan_fleet, resolve_deployment
from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.cli import app
from simulator.engine.request import RequestState
from simulator.errors import ConfigError
from simulator.latency.base import StepBatch
from simulator.latency.parallel import Links, Parallelism, links_for
from simulator.latency.physics import PhysicsModel

LLAMA = "meta-llama/llama-3.1-8b-instruct"  # 32 attention heads, 8 KV heads, 32 layers
US = 1_000_000


def _workload(n: int = 30, rate: float = 4.0, output: int = 16) -> dict:
    return {
        "rate": rate,
        "num_requests": n,
        "prompt_tokens": {"distribution": "constant", "value": 256},
        "output_tokens": {"distribution": "constant", "value": output},
    }


def _scenario(
    deployments: list[dict],
    gpus_per_node: int = 8,
    initial_nodes: int = 2,
    max_nodes: int = 4,
    **extra: object,
) -> dict:
    """One H100 pool; the fleet loaded at t = 0 unless the test says otherwise; invariant
    checks on (the fleet's assert GPU conservation and whole-node placement at every event)."""
    pool = {
        "name": "p",
        "gpu_type": "H100",
        "gpus_per_node": gpus_per_node,
        "initial_nodes": initial_nodes,
        "max_nodes": max_nodes,
        "cost_per_hour": 36.0,
    }
    return {
        "model": LLAMA,
        "hardware": "H100",
        "seed": 3,
        "check_invariants": True,
        "engine": {"total_kv_blocks": 2000},
        "node_pools": [pool],
        "deployments": deployments,
        "instance_lifecycle": {"initial_instances_loaded": True},
        "workload": _workload(),
        **extra,
    }


def _counted(result: simulator.Result) -> None:
    """Every request that arrived ends in exactly one counted state, once."""
    records = result.request_records
    assert len({r.request_id for r in records}) == len(records)
    states = Counter(r.state for r in records)
    s = result.summary
    assert s["injected_requests"] + states[RequestState.REJECTED] == len(records)
    assert s["completed_requests"] == states[RequestState.COMPLETED]
    assert s.get("failed_requests", 0) == states[RequestState.FAILED]
    assert s.get("dropped_on_drain", 0) == states[RequestState.DROPPED_ON_DRAIN]
    assert s["still_queued"] == states[RequestState.QUEUED] + states[RequestState.CREATED]
    assert result.fleet_metrics["failed_requests"] == states[RequestState.FAILED]


def _placed_nodes(result: simulator.Result, instance: str) -> list[str]:
    row = result.fleet_instances.set_index("instance_id").loc[instance]
    return row.node.split("+") if row.node else []


# ----------------------------------------------------------------------------------- laws
@st.composite
def _fleets(draw) -> dict:
    """A pool of 1, 2 or 4 GPUs per node and two deployments whose instances are one node
    or a whole number of nodes, plus a node failure and a drain at random times."""
    per_node = draw(st.sampled_from([1, 2, 4]))
    deployments = []
    for name in ("a", "b"):
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        pp = draw(st.sampled_from([1, 2]))
        if tp * pp > per_node and (tp * pp) % per_node:
            pp = 1  # every tp above is a power of two, so tp alone is a whole number of nodes
        deployments.append(
            {"name": name, "tp": tp, "pp": pp, "num_instances": draw(st.integers(0, 2))}
        )
    if not any(d["num_instances"] for d in deployments):
        deployments[0]["num_instances"] = 1
    max_nodes = 16
    events = [
        {"at_s": draw(st.floats(0.5, 6.0)), "action": "fail_node", "node": f"p-{node}"}
        for node in draw(st.lists(st.integers(0, 5), max_size=2, unique=True))
    ]
    if draw(st.booleans()):
        events.append({"at_s": 3.0, "action": "drain_node", "node": "p-0"})
    return _scenario(
        deployments,
        gpus_per_node=per_node,
        initial_nodes=draw(st.integers(1, 8)),
        max_nodes=max_nodes,
        events=events,
        instance_lifecycle={
            "initial_instances_loaded": True,
            "retry_on_failure": draw(st.booleans()),
        },
        workload=_workload(n=24, rate=6.0),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fleets())
def test_gpus_reserved_follow_the_layout_and_every_request_is_counted(scenario: dict) -> None:
    """Run with the fleet's invariant checks (every node: allocated + free = its GPUs; every
    live instance holds exactly tp x pp GPUs, on one node or on whole nodes of one pool).
    After it: each created instance's GPU count is its tp x pp; at no instant do the live
    instances hold more GPUs than the pool's live nodes have; every request is counted."""
    result = simulator.simulate(scenario, warn_unsteady=False)
    size = {d["name"]: d["tp"] * d["pp"] for d in scenario["deployments"]}
    fleet = result.fleet_instances
    assert (fleet.gpus == fleet.deployment.map(size)).all()
    per_node = scenario["node_pools"][0]["gpus_per_node"]
    for row in fleet.itertuples():
        nodes = row.node.split("+") if row.node else []
        if len(nodes) > 1:  # whole nodes: tp x pp = nodes x gpus_per_node
            assert row.gpus == len(nodes) * per_node
    nodes = result.nodes
    # Held GPUs never exceed the nodes' GPUs at any instance's creation or placement time.
    for t in sorted(set(result.timeline.time_s)):
        live = fleet[(fleet.routable_s <= t) & ~(fleet.terminated_s <= t)]
        up = nodes[(nodes.created_s <= t) & ~(nodes.terminated_s <= t)]
        assert live.gpus.sum() <= up.gpus.sum()
    _counted(result)


@pytest.mark.parametrize("failed", ["p-0", "p-1"])
@pytest.mark.parametrize("retry", [False, True])
def test_any_node_of_a_multi_node_instance_failing_ends_it(failed: str, retry: bool) -> None:
    """TP8 x PP2 on 8-GPU nodes holds p-0 and p-1. Failing either ends the instance at that
    moment; its requests fail (or, with retry, go to the TP4 instance on p-2); the other node
    survives empty and Ready; every request is counted."""
    scenario = _scenario(
        [
            {"name": "big", "tp": 8, "pp": 2, "num_instances": 1},
            {"name": "small", "tp": 4, "num_instances": 1},
        ],
        initial_nodes=3,
        events=[{"at_s": 4.0, "action": "fail_node", "node": failed}],
        instance_lifecycle={"initial_instances_loaded": True, "retry_on_failure": retry},
        # Long answers, so that the instance holds requests when its node goes.
        workload=_workload(n=30, rate=8.0, output=600),
    )
    result = simulator.simulate(scenario, warn_unsteady=False)
    fleet = result.fleet_instances.set_index("instance_id")
    assert _placed_nodes(result, "instance_0") == ["p-0", "p-1"]
    assert fleet.loc["instance_0", "terminated_s"] == 4.0
    assert fleet.loc["instance_0", "final_state"] == "terminated"
    nodes = result.nodes.set_index("node_id")
    assert nodes.loc[failed, "terminated_s"] == 4.0
    survivor = "p-1" if failed == "p-0" else "p-0"
    assert math.isnan(nodes.loc[survivor, "terminated_s"])  # still there, free
    _counted(result)
    if retry:
        assert result.summary.get("failed_requests", 0) == 0
    lost = result.fleet_metrics["failed_requests"] + result.fleet_metrics["retried_requests"]
    assert lost > 0  # the instance held requests when it went


def test_runs_are_deterministic() -> None:
    scenario = _scenario(
        [{"name": "big", "tp": 8, "pp": 2, "num_instances": 1}],
        events=[{"at_s": 3.0, "action": "fail_node", "node": "p-1"}],
        instance_lifecycle={"initial_instances_loaded": True, "retry_on_failure": True},
    )
    one = simulator.simulate(scenario, warn_unsteady=False)
    two = simulator.simulate(scenario, warn_unsteady=False)
    assert one.summary == two.summary
    assert one.timeline.equals(two.timeline)
    assert one.fleet_instances.equals(two.fleet_instances)
    assert one.blis_request_records() == two.blis_request_records()


# ------------------------------------------------------------------------------ placement
def test_a_multi_node_instance_takes_empty_nodes_only() -> None:
    """p-0 holds the TP4 instance (4 of its 8 GPUs); the TP8 x PP2 instance needs two empty
    nodes, so it takes p-1 and p-2, not p-0's free half. 4 + 16 = 20 GPUs of 24 held."""
    scenario = _scenario(
        [
            {"name": "small", "tp": 4, "num_instances": 1},
            {"name": "big", "tp": 8, "pp": 2, "num_instances": 1},
        ],
        initial_nodes=3,
    )
    result = simulator.simulate(scenario, warn_unsteady=False)
    assert _placed_nodes(result, "instance_0") == ["p-0"]
    assert _placed_nodes(result, "instance_1") == ["p-1", "p-2"]
    assert result.fleet_instances.gpus.sum() == 4 + 16
    placed = result.timeline[result.timeline.to_state == "loading"].reason.tolist()
    assert placed == ["placed on p-0", "placed on p-1, p-2"]
    assert result.summary["completed_requests"] == 30


def test_the_instance_waits_for_its_last_node() -> None:
    """One node is Ready at 0; add_node at 5 s with a 10 s provisioning delay brings the
    second at 5 + 10 = 15 s. The TP4 x PP4 instance (16 GPUs, 2 nodes) stays Scheduling until
    then and is placed at 15 s; requests that came before wait at the router."""
    scenario = _scenario(
        [{"name": "big", "tp": 4, "pp": 4, "num_instances": 1}],
        initial_nodes=1,
        events=[{"at_s": 5.0, "action": "add_node", "pool": "p"}],
    )
    scenario["node_pools"][0]["provisioning_delay"] = {"mean_s": 10.0}
    result = simulator.simulate(scenario, warn_unsteady=False)
    fleet = result.fleet_instances.set_index("instance_id")
    assert fleet.loc["instance_0", "routable_s"] == 15.0
    rows = result.timeline[result.timeline.id == "instance_0"]
    placed = rows[rows.to_state == "loading"]
    assert placed.time_s.tolist() == [15.0]
    assert placed.reason.tolist() == ["placed on p-0, p-1"]
    first_tokens = [r.first_token_us for r in result.request_records if r.first_token_us >= 0]
    assert min(first_tokens) >= 15 * US
    assert result.fleet_metrics["requests_waited_for_instance"] > 0
    _counted(result)


def test_scale_up_provisions_every_node_an_instance_spans() -> None:
    """No node at first; the autoscaler's first tick (1 s) sees requests waiting and adds the
    TP8 x PP2 instance: both of its nodes are requested at once (1 s), Ready after the 10 s
    delay, and the instance is placed on them at 11 s."""
    scenario = _scenario(
        [{"name": "big", "tp": 8, "pp": 2, "num_instances": 0}],
        initial_nodes=0,
        max_nodes=2,
        autoscaler=[
            {
                "deployment": "big",
                "scale_up_threshold": 0.5,
                "min_instances": 0,
                "max_instances": 1,
                "interval_s": 1.0,
            }
        ],
    )
    scenario["node_pools"][0]["provisioning_delay"] = {"mean_s": 10.0}
    result = simulator.simulate(scenario, warn_unsteady=False)
    nodes = result.nodes
    assert nodes.node_id.tolist() == ["p-0", "p-1"]
    assert nodes.created_s.tolist() == [1.0, 1.0]
    assert result.fleet_instances.routable_s.tolist() == [11.0]
    assert _placed_nodes(result, "instance_0") == ["p-0", "p-1"]
    _counted(result)


def test_a_multi_node_instance_pays_for_its_whole_nodes() -> None:
    """Cost: two whole nodes at $36/h each = $0.01 per node-second, so the instance's share
    is 2 x 0.01 x its uptime; its GPU-seconds are 16 x uptime."""
    scenario = _scenario([{"name": "big", "tp": 8, "pp": 2, "num_instances": 1}])
    result = simulator.simulate(scenario, warn_unsteady=False)
    row = result.fleet_instances.iloc[0]
    assert row.gpus == 16
    assert row.cost_usd == pytest.approx(2 * 0.01 * row.uptime_s, rel=1e-12)
    assert row.gpu_seconds == pytest.approx(16 * row.uptime_s, rel=1e-12)
    assert result.fleet_metrics["gpu_cost_usd"] == pytest.approx(row.cost_usd, rel=1e-12)


def test_an_instance_that_fits_one_node_still_goes_on_one_node() -> None:
    """A pool of 16-GPU nodes next to the 8-GPU pool: the 16-GPU instance takes one 16-GPU
    node (first fit on one node wins over spanning nodes)."""
    scenario = _scenario([{"name": "big", "tp": 8, "pp": 2, "num_instances": 1}])
    scenario["node_pools"].append(
        {"name": "wide", "gpu_type": "H100", "gpus_per_node": 16, "max_nodes": 1}
    )
    result = simulator.simulate(scenario, warn_unsteady=False)
    assert _placed_nodes(result, "instance_0") == ["wide-0"]


# ------------------------------------------------------------------------------- pricing
def test_a_multi_node_instance_is_priced_with_the_network() -> None:
    """The step-time model takes its links from the GPU type, not from the pool: H100's
    NVLink domain is 8 GPUs, so TP16 across two 8-GPU nodes all-reduces over the network.
    The deployment's model prices a step exactly as `physics` with H100's links does, and
    dearer than the same layout on one 16-GPU NVLink domain would cost."""
    scenario = _scenario([{"name": "wide", "tp": 16, "num_instances": 1}])
    sc = as_scenario(scenario)
    setups, fleet, _ = plan_fleet(sc, resolve_deployment(sc))
    assert fleet.slots[0].gpus_needed == 16
    model, gpu = load_model(LLAMA), get_gpu("H100")
    h100 = links_for(gpu)
    assert h100.domain_gpus == 8 and h100.crosses(0, 15)
    batch = StepBatch([], 32, 32 * 1000)
    priced = setups[0].step_model.step_time_us(batch)
    assert priced == PhysicsModel(model, gpu, 16, parallelism=Parallelism(16)).step_time_us(batch)
    one_domain = Links(h100.scale_up_gb_per_s, h100.scale_out_gb_per_s, 16)
    nvlink_only = PhysicsModel(model, gpu, 16, parallelism=Parallelism(16), links=one_domain)
    assert priced > nvlink_only.step_time_us(batch)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("per_node", "max_nodes", "needles"),
    [
        (
            8,
            4,
            [
                "deployments[odd]: tp x pp: invalid value 12 (GPUs per instance)",
                "node pool 'p' has 8 GPUs per node",
                "same number of GPUs on every node",
                "at most 8 or a multiple of 8",
            ],
        ),
        (
            4,
            2,
            [
                "deployments[odd]: tp x pp: invalid value 12",
                "it takes 3 whole nodes of node pool 'p' (4 GPUs each)",
                "max_nodes is 2; raise max_nodes to at least 3",
            ],
        ),
    ],
)
def test_an_instance_that_no_pool_can_hold_is_refused(
    per_node: int, max_nodes: int, needles: list[str]
) -> None:
    """TP4 x PP3 = 12 GPUs: not a whole number of 8-GPU nodes; 3 nodes of 4 GPUs, but the
    pool stops at 2."""
    scenario = _scenario(
        [{"name": "odd", "tp": 4, "pp": 3, "num_instances": 1}],
        gpus_per_node=per_node,
        initial_nodes=1,
        max_nodes=max_nodes,
    )
    with pytest.raises(ConfigError) as err:
        simulator.simulate(scenario)
    for needle in needles:
        assert needle in str(err.value)


def test_the_cli_refuses_it_with_exit_status_2(tmp_path: Path) -> None:
    scenario = _scenario([{"name": "odd", "tp": 4, "pp": 3, "num_instances": 1}], initial_nodes=1)
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = CliRunner().invoke(app, ["run", str(path)])
    assert out.exit_code == 2
    assert "tp x pp: invalid value 12" in out.output
    assert "Traceback" not in out.output
