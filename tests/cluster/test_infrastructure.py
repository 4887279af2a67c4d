"""The changing fleet (docs/behaviour.md §8, §A6, §A7): node pools, lifecycle, drains, failures,
events, autoscaling and multi-model serving.

Laws first (conservation of requests and GPUs, legal lifecycle edges, routability, autoscaler
bounds), then timelines with known delays, then behaviour, then bad input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simulator
from simulator.api import as_scenario, build_traffic, plan_fleet, resolve_deployment
from simulator.cli import app
from simulator.cluster.cluster import run_simulation
from simulator.cluster.lifecycle import (
    INSTANCE_EDGES,
    NODE_EDGES,
    IllegalTransition,
    InstanceRecord,
    InstanceState,
    Node,
    NodeState,
    Timeline,
    first_fit,
)
from simulator.engine.request import RequestState
from simulator.errors import ConfigError
from simulator.latency.base import StepBatch

ROOT = Path(__file__).parents[2]
US = 1_000_000


def constant_workload(rate: float, n: int, prompt: int = 512, output: int = 64) -> dict:
    return {
        "rate": rate,
        "num_requests": n,
        "prompt_tokens": {"distribution": "constant", "value": prompt},
        "output_tokens": {"distribution": "constant", "value": output},
    }


def run_checked(scenario: dict) -> simulator.Result:
    """simulate(), with every engine, KV and fleet invariant asserted during the run. The KV
    cache is kept small (the KV check walks every block each step)."""
    scenario = {**scenario, "engine": {"total_kv_blocks": 1500, **scenario.get("engine", {})}}
    sc = as_scenario(scenario)
    deployment = resolve_deployment(sc)
    setups, fleet, sc = plan_fleet(sc, deployment)
    requests, _ = build_traffic(sc)
    return run_simulation(
        requests,
        horizon_us=sc.horizon_us,
        scenario=sc.model_dump(mode="json"),
        cluster=sc.cluster,
        seed=sc.seed,
        model_name=deployment.model.name,
        setups=setups,
        fleet=fleet,
        check_invariants=True,
    )


def assert_conserved(result: simulator.Result) -> None:
    """Every request that arrived is in exactly one counted state, once."""
    records = result.request_records
    ids = [r.request_id for r in records]
    assert len(ids) == len(set(ids))
    states = Counter(r.state for r in records)
    s = result.summary
    rejected = states[RequestState.REJECTED]
    assert s["injected_requests"] + rejected == len(records)
    assert s["completed_requests"] == states[RequestState.COMPLETED]
    assert s.get("dropped_on_drain", 0) == states[RequestState.DROPPED_ON_DRAIN]
    assert s.get("failed_requests", 0) == states[RequestState.FAILED]
    assert s["still_queued"] == states[RequestState.QUEUED] + states[RequestState.CREATED]
    if result.fleet_metrics is not None:
        assert result.fleet_metrics["dropped_on_drain"] == states[RequestState.DROPPED_ON_DRAIN]
        assert result.fleet_metrics["failed_requests"] == states[RequestState.FAILED]


def assert_legal_timeline(result: simulator.Result) -> None:
    """Every recorded transition is an edge of the state machines, in time order."""
    timeline = result.timeline
    assert timeline.time_us.is_monotonic_increasing
    for row in timeline.itertuples():
        if row.kind in ("event", "autoscaler"):
            continue  # a note (an event with nothing to act on, a refused scale-up): no move
        if row.from_state == "":
            expected = "provisioning" if row.kind == "node" else "scheduling"
            assert row.to_state == expected, row
            continue
        edges = NODE_EDGES if row.kind == "node" else INSTANCE_EDGES
        kind = NodeState if row.kind == "node" else InstanceState
        assert kind(row.to_state) in edges[kind(row.from_state)], row


def assert_served_only_while_routable(result: simulator.Result) -> None:
    """A request is scheduled on an instance only after it was loaded (routable) and before
    it terminated, and only on an instance serving the request's model."""
    fleet = result.fleet_instances.set_index("instance_id")
    for r in result.request_records:
        if r.first_schedule_us < 0:
            continue
        row = fleet.loc[r.instance_id]
        assert r.first_schedule_us >= round(row.routable_s * US), r
        if row.terminated_s == row.terminated_s:  # not NaN
            assert r.completion_us <= round(row.terminated_s * US), r


# ---------------------------------------------------------------------- plain state machines
def test_lifecycle_refuses_illegal_edges():
    timeline = Timeline()
    rec = InstanceRecord(0, "i0", "d", "m", 1, None)
    with pytest.raises(IllegalTransition):
        rec.move(InstanceState.ACTIVE, 0, timeline, "born active")
    rec.move(InstanceState.SCHEDULING, 0, timeline, "created")
    with pytest.raises(IllegalTransition):
        rec.move(InstanceState.DRAINING, 1, timeline, "drain before loading")
    rec.move(InstanceState.LOADING, 1, timeline, "placed")
    rec.move(InstanceState.ACTIVE, 2, timeline, "loaded")
    rec.move(InstanceState.DRAINING, 3, timeline, "drain")
    with pytest.raises(IllegalTransition):
        rec.move(InstanceState.ACTIVE, 4, timeline, "undrain")
    rec.move(InstanceState.TERMINATED, 5, timeline, "drained")
    assert [row.to_state for row in timeline.rows] == [
        "scheduling", "loading", "active", "draining", "terminated"
    ]  # fmt: skip


def test_first_fit_takes_lowest_free_gpus_of_the_first_ready_node_that_fits():
    timeline = Timeline()
    a = Node("p-0", "p", "H100", [None] * 4, 0.0)
    b = Node("p-1", "p", "H100", [None] * 4, 0.0)
    for n in (a, b):
        n.move(NodeState.READY, 0, timeline, "initial")
    a.allocate("x", 3)
    assert first_fit([a, b], "H100", 2, None) is b  # a has 1 free GPU
    assert first_fit([a, b], "h100", 1, None) is a  # GPU type compared case-insensitively
    assert first_fit([a, b], "A100", 1, None) is None
    assert b.allocate("y", 2) == [0, 1]
    assert b.gpu_ids("y") == ["p-1-gpu-0", "p-1-gpu-1"]
    assert b.release("y") == 2 and b.free_gpus == 4
    with pytest.raises(IllegalTransition):
        a.allocate("z", 2)


# ---------------------------------------------------------------------- timelines
def test_instance_becomes_routable_exactly_after_provisioning_plus_loading():
    """add_node at 10 s (30 s to provision) and add_instance at 10 s (5 s to load): the
    instance waits in Scheduling until 40 s, is placed then, and is routable at 45 s."""
    result = run_checked(
        {
            "node_pools": [
                {
                    "name": "p",
                    "gpu_type": "H100",
                    "gpus_per_node": 1,
                    "initial_nodes": 1,
                    "max_nodes": 2,
                    "provisioning_delay": {"mean_s": 30},
                }
            ],  # fmt: skip
            "deployments": [{"name": "d", "num_instances": 1}],
            "instance_lifecycle": {"loading_delay": {"mean_s": 5}},
            "events": [
                {"at_s": 10, "action": "add_node", "pool": "p"},
                {"at_s": 10, "action": "add_instance", "deployment": "d"},
            ],
            "workload": constant_workload(5, 300),
        }
    )
    tl = result.timeline
    late = tl[tl.id == "instance_1"]
    assert list(zip(late.to_state, late.time_us, strict=True)) == [
        ("scheduling", 10 * US),
        ("loading", 40 * US),
        ("active", 45 * US),
    ]
    first = tl[tl.id == "instance_0"]
    assert first[first.to_state == "active"].time_us.item() == 5 * US  # loaded at 0 + 5 s
    # Nothing is scheduled before an instance is routable: the first requests waited.
    assert result.fleet_metrics["requests_waited_for_instance"] > 0
    served_late = [r for r in result.request_records if r.instance_id == "instance_1"]
    assert served_late and min(r.first_schedule_us for r in served_late) >= 45 * US
    assert_conserved(result)
    assert_legal_timeline(result)
    assert_served_only_while_routable(result)


def test_wait_drain_terminates_exactly_when_its_last_request_completes():
    result = run_checked(
        {
            "cluster": {"num_instances": 2},
            "instance_lifecycle": {"drain_policy": "wait"},
            "events": [{"at_s": 10, "action": "drain_instance", "target": "instance_1"}],
            "workload": constant_workload(20, 400),
        }
    )
    tl = result.timeline
    end = tl[(tl.id == "instance_1") & (tl.to_state == "terminated")].time_us.item()
    mine = [r for r in result.request_records if r.instance_id == "instance_1"]
    assert end == max(r.completion_us for r in mine)
    assert end > 10 * US  # it had work when the drain began
    assert all(r.state is RequestState.COMPLETED for r in result.request_records)
    assert_conserved(result)


def test_immediate_drain_counts_what_it_held_as_dropped_on_drain():
    result = run_checked(
        {
            "cluster": {"num_instances": 2},
            "instance_lifecycle": {"drain_policy": "immediate"},
            "events": [{"at_s": 10, "action": "drain_instance", "target": "instance_1"}],
            "workload": constant_workload(20, 400),
        }
    )
    dropped = [r for r in result.request_records if r.state is RequestState.DROPPED_ON_DRAIN]
    assert dropped and result.summary["dropped_on_drain"] == len(dropped)
    assert all(r.instance_id == "instance_1" and r.completion_us == 10 * US for r in dropped)
    tl = result.timeline
    assert tl[(tl.id == "instance_1") & (tl.to_state == "terminated")].time_us.item() == 10 * US
    assert_conserved(result)


def test_redirect_hands_queued_requests_back_and_counts_each_once():
    """A batch cap of 4 keeps a queue on the drained instance: those requests are re-routed
    to instance_0 and complete there, counted once."""
    result = run_checked(
        {
            "cluster": {"num_instances": 2},
            "engine": {"max_num_running_reqs": 4},
            "instance_lifecycle": {"drain_policy": "redirect"},
            "events": [{"at_s": 5, "action": "drain_instance", "target": "instance_1"}],
            "workload": constant_workload(40, 400),
        }
    )
    moved = [r for r in result.request_records if r.reroutes]
    assert moved and len(moved) == result.fleet_metrics["redirected_requests"]
    assert all(r.instance_id == "instance_0" for r in moved)
    assert all(r.state is RequestState.COMPLETED for r in result.request_records)
    # Input tokens are counted where requests are served, so once each.
    served = sum(r.input_tokens for r in result.request_records)
    assert result.summary["total_input_tokens"] == served
    assert_conserved(result)


@pytest.mark.parametrize("retry", [True, False])
def test_failed_node_loses_or_retries_its_in_flight_requests(retry):
    result = run_checked(
        {
            "node_pools": [
                {
                    "name": "p",
                    "gpu_type": "H100",
                    "gpus_per_node": 1,
                    "initial_nodes": 2,
                    "max_nodes": 2,
                }
            ],  # fmt: skip
            "cluster": {"num_instances": 2},
            "instance_lifecycle": {"retry_on_failure": retry},
            "events": [{"at_s": 10, "action": "fail_node", "node": "p-1"}],
            "workload": constant_workload(20, 400),
        }
    )
    tl = result.timeline
    assert tl[(tl.id == "p-1") & (tl.to_state == "terminated")].time_us.item() == 10 * US
    states = Counter(r.state for r in result.request_records)
    if retry:
        assert states[RequestState.FAILED] == 0
        assert result.fleet_metrics["retried_requests"] > 0
        assert states[RequestState.COMPLETED] == 400
    else:
        assert states[RequestState.FAILED] == result.summary["failed_requests"] > 0
    assert_conserved(result)
    assert_served_only_while_routable(result)


def test_warm_up_multiplies_the_prefill_cost_of_the_first_requests():
    """One request alone on a fresh instance: its prefill is the whole step, so the step
    costs factor × t(prefill) and TTFT grows by exactly round((factor − 1) × t)."""
    base = {"workload": constant_workload(1, 1, prompt=1000, output=4)}
    cold = simulator.simulate(base)
    lifecycle = {"warm_up_request_count": 1, "warm_up_ttft_factor": 3.0}
    warm = simulator.simulate({**base, "instance_lifecycle": lifecycle})
    model = resolve_deployment(as_scenario(base)).step_model
    prefill_us = model.step_time_us(StepBatch([(0, 1000)], 0, 0, [1000]))
    cold_ttft = cold.request_records[0].first_token_us - cold.request_records[0].arrival_us
    warm_ttft = warm.request_records[0].first_token_us - warm.request_records[0].arrival_us
    assert warm_ttft - cold_ttft == round(2.0 * prefill_us)
    # Decode steps are not slowed: the gap from first to last token is the same.
    c, w = cold.request_records[0], warm.request_records[0]
    assert c.last_token_us - c.first_token_us == w.last_token_us - w.first_token_us
    tl = warm.timeline
    assert list(tl[tl.kind == "instance"].to_state) == [
        "scheduling", "loading", "warming_up", "active"
    ]  # fmt: skip


# ---------------------------------------------------------------------- multi-model
def client(
    client_id: str, model: str, fraction: float, start_s: float = 0, end_s: float = 0
) -> dict:
    """A Poisson client of 512 → 128-token requests; active only from start_s to end_s when
    end_s is given."""
    spec = {
        "id": client_id,
        "model": model,
        "rate_fraction": fraction,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 512}},
        "output_distribution": {"type": "constant", "params": {"value": 128}},
    }
    if end_s:
        spec["lifecycle"] = {"windows": [{"start_us": start_s * US, "end_us": end_s * US}]}
    return spec


def two_models(**extra) -> dict:
    return {
        "deployments": [
            {"name": "small", "model": "meta-llama/llama-3.1-8b-instruct", "num_instances": 2},
            {"name": "qwen", "model": "qwen/qwen3-14b", "tp": 2, "num_instances": 1},
        ],
        "workload": {
            "version": "2",
            "seed": 3,
            "aggregate_rate": 20,
            "num_requests": 400,
            "clients": [
                client("a", "meta-llama/llama-3.1-8b-instruct", 0.5),
                client("b", "Qwen/Qwen3-14B", 0.4),  # model names match case-insensitively
                client("c", "nobody/serves-this", 0.1),
            ],  # fmt: skip
        },
        **extra,
    }


def test_requests_go_only_to_instances_serving_their_model():
    result = run_checked(two_models())
    models = dict(zip(result.instance_ids, result.instance_models, strict=True))
    assert models == {
        "instance_0": "meta-llama/llama-3.1-8b-instruct",
        "instance_1": "meta-llama/llama-3.1-8b-instruct",
        "instance_2": "qwen/qwen3-14b",
    }
    for r in result.request_records:
        if r.client_id == "c":
            assert r.state is RequestState.REJECTED
        else:
            assert models[r.instance_id] == r.model.lower(), r
    rejected = sum(r.client_id == "c" for r in result.request_records)
    assert result.routing_rejections == rejected > 0
    table = result.per_model.set_index("model")
    assert table.requests.sum() == len(result.request_records)
    # Every request of a model ends in one of the counted states (conservation per model).
    ends = ["completed", "rejected", "unfinished", "dropped", "timed_out", "failed"]
    assert (table[ends].sum(axis=1) == table.requests).all()
    assert table.completed.sum() == result.summary["completed_requests"]
    assert table.loc["nobody/serves-this", "rejected"] == rejected
    assert table.loc["qwen/qwen3-14b", "instances"] == 1
    assert "=== Per-Model Metrics ===" in result.report_text()
    # The model nobody serves has no latency: NaN in the frame, null in the JSON, never 0 ms.
    unserved = table.loc["nobody/serves-this"]
    latencies = [c for c in table.columns if c.endswith("_ms")]
    assert unserved[latencies].isna().all()
    assert table.loc["qwen/qwen3-14b", latencies].notna().all()
    document = result.results_document()
    row = next(r for r in document["per_model"] if r["model"] == "nobody/serves-this")
    assert all(row[c] is None for c in latencies)
    json.dumps(document, allow_nan=False)  # strict JSON: no NaN anywhere
    assert_conserved(result)


def test_untagged_requests_go_to_the_first_deployment():
    result = simulator.simulate(
        {
            "deployments": [
                {"name": "a", "model": "qwen/qwen3-14b", "tp": 2, "num_instances": 1},
                {"name": "b", "model": "meta-llama/llama-3.1-8b-instruct", "num_instances": 1},
            ],
            "workload": constant_workload(5, 50),
        }
    )
    assert {r.instance_id for r in result.request_records} == {"instance_0"}


def test_pd_roles_come_from_deployments():
    result = simulator.simulate(
        {
            "deployments": [
                {"name": "dec", "role": "decode", "num_instances": 1},
                {"name": "pre", "role": "prefill", "num_instances": 1},
            ],
            "cluster": {"pd": {"decider": "always"}},
            "workload": constant_workload(10, 100),
        }
    )
    assert result.instance_roles == ["prefill", "decode"]  # prefill pool first
    assert result.pd_metrics["disaggregated_requests"] == 100


# ---------------------------------------------------------------------- autoscaler
SPIKE = {
    "seed": 7,
    # A batch cap of 16 makes one instance's capacity small (about 14 req/s here), so the
    # spike (5 → 30 req/s from 15 s to 55 s) overloads it and the test stays quick. Those
    # capacities are roofline's step times; physics' are slower and four instances would not
    # absorb the spike.
    "engine": {"max_num_running_reqs": 16},
    "latency": {"model": "roofline"},
    "node_pools": [
        {
            "name": "h100",
            "gpu_type": "H100",
            "gpus_per_node": 2,
            "initial_nodes": 1,
            "min_nodes": 1,
            "max_nodes": 2,
            "provisioning_delay": {"mean_s": 5},
            "cost_per_hour": 24.0,
        }
    ],  # fmt: skip
    "deployments": [{"name": "llama", "num_instances": 1}],
    "instance_lifecycle": {
        "initial_instances_loaded": True,
        "loading_delay": {"mean_s": 3},
        "warm_up_request_count": 4,
        "warm_up_ttft_factor": 2.0,
    },
    "autoscaler": [
        {
            "signal": "in_flight",
            "scale_up_threshold": 12,
            "scale_down_threshold": 3,
            "min_instances": 1,
            "max_instances": 4,
            "interval_s": 2,
            "scrape_delay_s": 1,
            "scale_down_stabilization_s": 10,
        }
    ],  # fmt: skip
    "workload": {
        "version": "2",
        "seed": 7,
        "aggregate_rate": 30,
        "horizon": 90 * US,
        "clients": [
            client("steady", "", 1 / 6),
            client("spike", "", 5 / 6, start_s=15, end_s=55),
        ],  # fmt: skip
    },
}


@pytest.fixture(scope="module")
def spike():
    # Unchecked runs: the per-step engine checks would dominate this longer run; the laws are
    # asserted on the outcome instead.
    return simulator.simulate(SPIKE), simulator.simulate({**SPIKE, "autoscaler": []})


def p99_ttft(result, start_s: float, end_s: float) -> float:
    df = result.requests
    window = df[(df.arrival_us >= start_s * US) & (df.arrival_us < end_s * US)]
    return float(window.ttft_ms.quantile(0.99))


def test_autoscaled_fleet_recovers_from_a_spike_and_pays_for_it(spike):
    scaled, fixed = spike
    tl = scaled.timeline
    ready = tl[(tl.kind == "instance") & (tl.to_state == "active")]
    last_ready_s = ready.time_s.max()
    assert 15 < last_ready_s < 45  # the added instances were warm well before the spike ended
    # Late in the spike the scaled fleet serves promptly; the fixed one is drowning.
    late = p99_ttft(scaled, last_ready_s + 5, 55)
    assert late < 500
    assert p99_ttft(fixed, last_ready_s + 5, 55) > 10 * late
    assert p99_ttft(scaled, 15, last_ready_s) > late  # before recovery it was worse
    assert scaled.fleet_metrics["gpu_cost_usd"] > fixed.fleet_metrics["gpu_cost_usd"]
    assert scaled.fleet_metrics["autoscaler_llama_scale_ups"] >= 1
    assert scaled.fleet_metrics["autoscaler_llama_scale_downs"] >= 1  # after the spike
    assert_conserved(scaled)
    assert_legal_timeline(scaled)
    assert_served_only_while_routable(scaled)


def test_autoscaler_stays_within_min_and_max(spike):
    scaled, _ = spike
    live = 0
    most = 0
    for row in scaled.timeline[scaled.timeline.kind == "instance"].itertuples():
        if row.from_state == "":
            live += 1
        elif row.to_state in ("draining", "terminated") and row.from_state not in ("draining",):
            live -= 1
        most = max(most, live)
        assert live >= 0
    assert most <= 4
    nodes = scaled.nodes
    assert len(nodes) <= 3


def test_fleet_runs_are_deterministic():
    a = simulator.simulate(SPIKE)
    b = simulator.simulate(SPIKE)
    assert json.dumps(a.summary) == json.dumps(b.summary)
    assert a.timeline.equals(b.timeline)


# ---------------------------------------------------------------------- random fleets
events = st.lists(
    st.tuples(
        st.integers(0, 30),
        st.sampled_from(
            [
                "drain_instance",
                "fail_instance",
                "add_instance",
                "add_node",
                "fail_node",
                "drain_node",
            ]
        ),  # fmt: skip
        st.integers(0, 3),
        st.sampled_from(["immediate", "wait", "redirect"]),
    ),
    max_size=5,
)


def fleet_event(
    at_s: int, action: str, k: int, policy: str, instances: int, deployment: str
) -> dict:
    """One drawn infrastructure event: `k` picks its target among `instances` instances or
    two nodes of pool "p"; an added instance belongs to `deployment`."""
    e: dict = {"at_s": at_s, "action": action}
    if action in ("drain_instance", "fail_instance"):
        e["target"] = f"instance_{k % instances}"
    elif action == "add_node":
        e["pool"] = "p"
    elif action in ("fail_node", "drain_node"):
        e["node"] = f"p-{k % 2}"
    else:
        e["deployment"] = deployment
    if action.startswith("drain_"):  # only drains take a policy
        e["drain_policy"] = policy
    return e


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=events,
    retry=st.booleans(),
    rate=st.sampled_from([10, 40]),
    loading_s=st.sampled_from([0, 3]),
    warm=st.integers(0, 3),
)
def test_random_fleet_changes_keep_every_law(events, retry, rate, loading_s, warm):
    spec = [fleet_event(*event, instances=3, deployment="d") for event in events]
    result = run_checked(
        {
            "node_pools": [
                {
                    "name": "p",
                    "gpu_type": "H100",
                    "gpus_per_node": 2,
                    "initial_nodes": 2,
                    "max_nodes": 3,
                    "provisioning_delay": {"mean_s": 2},
                }
            ],  # fmt: skip
            "deployments": [{"name": "d", "num_instances": 3}],
            "engine": {"max_num_running_reqs": 8},
            "instance_lifecycle": {
                "retry_on_failure": retry,
                "loading_delay": {"mean_s": loading_s},
                "warm_up_request_count": warm,
                "warm_up_ttft_factor": 1.5,
            },
            "events": spec,
            "workload": constant_workload(rate, 150, prompt=256, output=16),
        }
    )
    assert_conserved(result)
    assert_legal_timeline(result)
    assert_served_only_while_routable(result)
    for node in result.nodes.itertuples():
        assert node.gpus == 2


# ---------------------------------------------------------------------- scenarios and CLI
FLEET_SCENARIOS = ["autoscale_spike", "rolling_drain", "node_failure", "multi_model"]


@pytest.mark.parametrize("name", FLEET_SCENARIOS)
def test_shipped_fleet_scenarios_plan(name):
    sc = simulator.load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    _, fleet, _ = plan_fleet(sc, resolve_deployment(sc))
    assert fleet is not None


def test_cli_writes_the_timeline(tmp_path):
    out = tmp_path / "timeline.csv"
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(ROOT / "scenarios" / "node_failure.yaml"),
            "--horizon",
            "130000000",  # past the failure at 120 s
            "--timeline-path",
            str(out),
            "--quiet",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.output
    assert "=== Fleet Metrics ===" in res.output
    lines = out.read_text().splitlines()
    assert lines[0] == "time_us,time_s,kind,id,from_state,to_state,reason"
    assert any("fail_node" in line for line in lines)


def test_events_due_after_the_run_ended_are_not_applied_nor_billed():
    """200 requests at 80/s end in about 3 s; node_failure.yaml's events come at 120 and
    150 s. Applied, they billed the nodes to 150 s and beyond (a drain at 3,600 s billed an
    hour) and changed a fleet nobody used; now they are counted and nothing else."""
    result = simulator.simulate(
        ROOT / "scenarios" / "node_failure.yaml", workload__num_requests=200
    )
    fleet = result.fleet_metrics
    assert fleet["events_after_end"] == 6  # the failure, the new node and four instances
    assert not any("event" in reason for reason in result.timeline.reason)
    run_end_s = result.summary["vllm_estimated_duration_s"]
    assert (result.nodes.uptime_s <= run_end_s + 1e-9).all()
    assert fleet["gpu_seconds"] <= fleet["node_seconds"] * 8 + 1e-6  # 8-GPU nodes
    assert result.summary["completed_requests"] == 200


BAD = [
    ({"node_pools": [{"name": "p", "gpu_type": "X9", "max_nodes": 1}]}, "unknown GPU 'X9'"),
    # A deployment placed on that pool takes its GPU from it: the pool's field is named, not
    # the deployment's `hardware`, which nobody wrote.
    (
        {
            "node_pools": [{"name": "p", "gpu_type": "X9", "max_nodes": 1}],
            "deployments": [{"name": "d", "num_instances": 1, "pool": "p"}],
        },
        "node_pools[0].gpu_type: unknown GPU 'X9'",
    ),
    (
        {
            "autoscaler": [
                {"scale_up_threshold": 5, "max_instances": 3},
                {"scale_up_threshold": 5, "max_instances": 5},
            ]
        },
        "autoscaler[1]: the cluster's instances is already scaled by autoscaler[0]",
    ),
    (
        {"node_pools": [{"name": "p", "gpu_type": "A100-80", "max_nodes": 1}]},
        "runs on GPU 'H100', but no node pool it may use has that gpu_type "
        "(the node pools have A100-80)",
    ),
    (
        {"node_pools": [{"name": "p", "gpu_type": "H100", "min_nodes": 3, "max_nodes": 2}]},
        "min_nodes (3) must be <= max_nodes (2)",
    ),
    (
        {"events": [{"at_s": 1, "action": "drain_instance", "target": "instance_9"}]},
        "events[0].target: unknown instance 'instance_9'",
    ),
    (
        {"events": [{"at_s": 1, "action": "fail_node", "node": "p-0"}]},
        "events[0].node: 'p-0', but the scenario has no node_pools",
    ),
    (
        {"deployments": [{"name": "x", "model": "acme/no-such-model"}]},
        "deployments[x]:",
    ),
    (
        {"autoscaler": [{"scale_up_threshold": 5, "min_instances": 3, "max_instances": 2}]},
        "min_instances (3) must be <= max_instances (2)",
    ),
    (
        # The live count never exceeds max_instances: a start above it is refused.
        {
            "deployments": [{"name": "a", "num_instances": 3}],
            "autoscaler": [{"deployment": "a", "scale_up_threshold": 5, "max_instances": 2}],
        },
        "autoscaler[0].max_instances: 2, below the 3 instances deployment 'a' starts with",
    ),
    (
        {
            "cluster": {"num_instances": 3},
            "autoscaler": [{"scale_up_threshold": 5, "max_instances": 2}],
        },
        "below the 3 instances cluster.num_instances starts with",
    ),
    (
        {"deployments": [{"name": "a", "pool": "nope"}]},
        "deployments[0].pool: unknown node pool 'nope'",
    ),
    (
        {
            "cluster": {"num_instances": 2, "pd": {"prefill_instances": 1, "decode_instances": 1}},
            "events": [{"at_s": 1, "action": "drain_instance", "target": "instance_1"}],
        },
        "prefill/decode pools run on a fixed fleet",
    ),
    (
        {"deployments": [{"name": "a"}], "cluster": {"num_instances": 3}},
        "cluster.num_instances: 3, but with `deployments`",
    ),
    # A field the action does not read was silently ignored (QA 2026-12-07).
    (
        {
            "cluster": {"num_instances": 2},
            "events": [
                {
                    "at_s": 1,
                    "action": "fail_instance",
                    "target": "instance_1",
                    "drain_policy": "redirect",
                }
            ],
        },  # fmt: skip
        "action 'fail_instance' does not take `drain_policy`; it takes `target`",
    ),
    (
        {
            "cluster": {"num_instances": 2},
            "events": [
                {"at_s": 1, "action": "drain_instance", "target": "instance_1", "node": "h100-0"}
            ],
        },  # fmt: skip
        "action 'drain_instance' does not take `node`; it takes `target`, `drain_policy`",
    ),
    # A KV utilisation is a fraction: a threshold above 1 could never fire.
    (
        {
            "autoscaler": [
                {
                    "signal": "kv_utilization",
                    "scale_up_threshold": 5,
                    "scale_down_threshold": 2,
                    "max_instances": 3,
                }
            ]
        },  # fmt: skip
        "scale_up_threshold: invalid value 5; the kv_utilization signal is a fraction",
    ),
]


@pytest.mark.parametrize(("extra", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_fleet_input_is_one_line_and_exit_2(extra, message, tmp_path):
    path = tmp_path / "bad.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"workload": constant_workload(5, 10), **extra}))
    res = CliRunner().invoke(app, ["run", str(path), "--results-path", str(tmp_path / "r.json")])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()
    with pytest.raises(ConfigError):
        simulator.simulate(str(path))


def test_timed_lifecycle_parts_are_processes_not_callbacks() -> None:
    """Provisioning, loading, scenario events and delayed scrapes wait inside processes
    (docs/architecture.md): the module schedules no callback on an event of its own."""
    import inspect

    from simulator.cluster import infrastructure

    source = inspect.getsource(infrastructure)
    assert "callbacks.append" not in source
    for name in ("_provisioning", "_loading", "_scenario_events", "_scale_after", "_autoscale"):
        assert inspect.isgeneratorfunction(getattr(infrastructure.Infrastructure, name))


@pytest.mark.parametrize("policy", ["round-robin", "least-loaded"])
def test_requests_parked_while_loading_are_routed_over_every_instance_ready_then(policy):
    """Three instances load for 1 s and become routable at the same microsecond: the requests
    that arrived meanwhile are routed once all three are, by the policy, not all to the one
    whose loading event happened to run first."""
    sc = {
        "cluster": {"num_instances": 3, "routing": {"policy": policy}},
        "instance_lifecycle": {"loading_delay": {"mean_s": 1.0}},
        "workload": constant_workload(50, 60),
    }
    result = run_checked(sc)
    loaded = {r["instance_id"]: r["routable_s"] for r in result.fleet_instances.to_dict("records")}
    assert set(loaded.values()) == {1.0}
    early = result.requests[result.requests.arrival_us < 1_000_000]
    counts = early.instance_id.value_counts()
    assert len(early) > 30 and len(counts) == 3
    assert counts.max() - counts.min() <= 1
    assert_conserved(result)


@pytest.mark.parametrize("name", FLEET_SCENARIOS)
def test_instances_hold_and_pay_for_gpus_only_once_placed(name):
    """An instance holds GPUs from its placement (Loading) to its termination, not while it
    waits in Scheduling: the instances' GPU-seconds never exceed what the nodes provided,
    and their costs never exceed the nodes' bill (each node's GPUs x its uptime)."""
    result = simulator.simulate(ROOT / "scenarios" / f"{name}.yaml")
    instances, nodes = result.fleet_instances, result.nodes
    fleet = result.fleet_metrics
    assert fleet["gpu_seconds"] == pytest.approx(instances.gpu_seconds.sum())
    if len(nodes):
        provided = float((nodes.uptime_s * nodes.gpus).sum())
        assert fleet["gpu_seconds"] <= provided + 1e-6
        assert instances.cost_usd.sum() <= fleet["gpu_cost_usd"] + 1e-9
    never_placed = instances[instances.placed_s.isna()]
    assert (never_placed.gpu_seconds == 0).all() and (never_placed.cost_usd == 0).all()
    placed = instances[instances.placed_s.notna()]
    assert (placed.placed_s >= placed.created_s).all()
    stop_s = placed.terminated_s.fillna(result.run_end_us / 1e6)
    assert np.allclose(placed.gpu_seconds, (stop_s - placed.placed_s).clip(lower=0) * placed.gpus)


def test_scale_down_drains_the_newest_of_instances_created_together():
    """Three instances up at t = 0 and hardly any load: the autoscaler's first scale-down
    drains the newest instance, which among instances created together is the highest
    slot (instance_2), not instance_0."""
    sc = {
        "cluster": {"num_instances": 3},
        "instance_lifecycle": {"initial_instances_loaded": True},
        "autoscaler": [
            {
                "signal": "in_flight",
                "scale_up_threshold": 50,
                "scale_down_threshold": 5,
                "min_instances": 1,
                "max_instances": 3,
                "interval_s": 1,
                "scale_down_stabilization_s": 1,
            }
        ],
        "workload": constant_workload(2, 20),
    }
    result = run_checked(sc)
    drained = result.timeline[result.timeline.to_state == "draining"]
    assert len(drained) >= 1
    assert drained.iloc[0]["id"] == "instance_2"


def test_an_event_aimed_at_a_slot_not_created_yet_says_so_on_the_timeline():
    """instance_2 is the add_instance event's slot, created at 5 s: a drain at 1 s has
    nothing to drain, and the timeline records that instead of nothing."""
    sc = {
        "cluster": {"num_instances": 2},
        "instance_lifecycle": {"initial_instances_loaded": True},
        "events": [
            {"at_s": 1, "action": "drain_instance", "target": "instance_2"},
            {"at_s": 5, "action": "add_instance"},
        ],
        "workload": constant_workload(5, 40),
    }
    result = run_checked(sc)
    rows = result.timeline[(result.timeline.kind == "event") & (result.timeline.id == "instance_2")]
    assert len(rows) == 1 and rows.iloc[0]["reason"].endswith("not created yet")
    assert rows.iloc[0]["time_s"] == 1.0
    assert "instance_2" in set(result.fleet_instances.instance_id)  # created later, served


def test_node_events_on_a_node_provisioning_missing_or_gone_are_on_the_timeline():
    """drain_node on a node still provisioning was ignored (the node was billed to the end);
    events on a node not created yet or already terminated did nothing silently."""
    scenario = {
        "node_pools": [{"name": "h100", "gpu_type": "H100", "gpus_per_node": 1,
                        "initial_nodes": 1, "max_nodes": 3,
                        "provisioning_delay": {"mean_s": 30}, "cost_per_hour": 18}],
        "deployments": [{"name": "llama", "num_instances": 2, "pool": "h100"}],
        "events": [
            {"at_s": 1, "action": "add_node", "pool": "h100"},
            {"at_s": 5, "action": "drain_node", "node": "h100-1"},
            {"at_s": 6, "action": "fail_node", "node": "h100-1"},
            {"at_s": 7, "action": "fail_node", "node": "h100-9"},
        ],
        "workload": {"rate": 10, "num_requests": 300},
    }  # fmt: skip
    result = simulator.simulate(scenario)
    rows = result.timeline
    withdrawn = rows[(rows.id == "h100-1") & (rows.to_state == "terminated")]
    assert list(withdrawn.from_state) == ["provisioning"] and list(withdrawn.time_s) == [5.0]
    reasons = list(rows[rows.kind == "event"].reason)
    assert reasons == [
        "event fail_node at 6 s: already terminated",
        "event fail_node at 7 s: no such node yet",
    ]
    node = result.nodes.set_index("node_id").loc["h100-1"]
    assert node.uptime_s == 4.0  # requested at 1 s, withdrawn at 5 s


def test_a_pools_gpu_memory_that_is_not_its_gpus_is_warned_about(caplog):
    """gpu_memory_gib is BLIS's schema field; KV caches are sized from the GPU catalog, so a
    pool of 1 GiB 'H100s' ran exactly as one of 80 GiB, silently. Given equal to the
    catalog's (or not given) it says nothing."""
    import logging

    def run(memory: dict) -> None:
        pool = {"name": "h100", "gpu_type": "H100", "gpus_per_node": 8, "initial_nodes": 1,
                "max_nodes": 1, **memory}  # fmt: skip
        simulator.simulate(
            {
                "node_pools": [pool],
                "deployments": [{"name": "llama"}],
                "workload": {"rate": 10, "num_requests": 5},
            }  # fmt: skip
        )

    with caplog.at_level(logging.WARNING, logger="servesim"):
        run({"gpu_memory_gib": 1})
    assert "node_pools[h100].gpu_memory_gib 1 differs from H100's 80 GiB" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="servesim"):
        run({"gpu_memory_gib": 80})
        run({})
    assert "gpu_memory_gib" not in caplog.text


def test_an_add_node_at_max_nodes_is_on_the_timeline():
    """max_nodes 2 with one node to start: the first add_node provisions h100-1, the next two
    find the pool full; they did nothing silently."""
    scenario = {
        "node_pools": [{"name": "h100", "gpu_type": "H100", "gpus_per_node": 1,
                        "initial_nodes": 1, "max_nodes": 2, "cost_per_hour": 18}],
        "deployments": [{"name": "llama", "num_instances": 1, "pool": "h100"}],
        "events": [{"at_s": t, "action": "add_node", "pool": "h100"} for t in (1, 1, 2)],
        "workload": {"rate": 10, "num_requests": 50},
    }  # fmt: skip
    rows = simulator.simulate(scenario).timeline
    assert list(rows[rows.kind == "event"].reason) == [
        "event add_node at 1 s: at max_nodes 2",
        "event add_node at 2 s: at max_nodes 2",
    ]
    assert set(rows[rows.kind == "node"].id) == {"h100-0", "h100-1"}


def test_initial_instances_beyond_what_the_pools_hold_are_warned_about(caplog):
    """5 one-GPU instances on a pool of at most 2 GPUs: 3 wait in Scheduling all run long,
    which ran silently (exit 0) before."""
    import logging

    scenario = {
        "node_pools": [{"name": "h100", "gpu_type": "H100", "gpus_per_node": 2,
                        "initial_nodes": 1, "max_nodes": 1, "cost_per_hour": 36}],
        "deployments": [{"name": "llama", "num_instances": 5, "pool": "h100"}],
        "workload": {"rate": 5, "num_requests": 40},
    }  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="servesim"):
        result = simulator.simulate(scenario, warn_unsteady=False)
    assert "initial instances need 5 H100 GPUs, but the node pools of that type hold at most 2" in (
        caplog.text
    )
    waiting = result.fleet_instances[result.fleet_instances.placed_s.isna()]
    assert len(waiting) == 3


@pytest.mark.parametrize(
    ("pool", "deployment", "needed", "start"),
    [
        # No node at the start and nothing adds one: the one instance is never placed.
        ({"gpus_per_node": 8, "initial_nodes": 0, "max_nodes": 2}, {}, 1, 0),
        # A TP16 instance needs two 8-GPU nodes; the pool starts with one.
        ({"gpus_per_node": 8, "initial_nodes": 1, "max_nodes": 2}, {"tp": 16}, 16, 8),
    ],
)
def test_instances_no_node_will_ever_hold_are_warned_about(pool, deployment, needed, start, caplog):
    """Without an add_node event or an autoscaler a pool never grows past its initial nodes:
    the run used to end with every request queued, exit 0, no word of why. An add_node event
    for the pool (or an autoscaler) can grow it, and then nothing is said."""
    import logging

    scenario = {
        "node_pools": [{"name": "h100", "gpu_type": "H100", "cost_per_hour": 36, **pool}],
        "deployments": [{"name": "llama", "num_instances": 1, **deployment}],
        "workload": {"rate": 5, "num_requests": 10},
    }
    text = (
        f"initial instances need {needed} H100 GPUs, but the node pools of that type start "
        f"with {start} (initial_nodes x gpus_per_node) and nothing adds a node"
    )
    with caplog.at_level(logging.WARNING, logger="servesim"):
        result = simulator.simulate(scenario, warn_unsteady=False)
    assert text in caplog.text
    assert result.summary["completed_requests"] == 0
    caplog.clear()
    grown = {**scenario, "events": [{"at_s": 1, "action": "add_node", "pool": "h100"}]}
    with caplog.at_level(logging.WARNING, logger="servesim"):
        simulator.simulate(grown, warn_unsteady=False)
    assert "nothing adds a node" not in caplog.text


def test_the_autoscaler_does_not_scale_down_under_requests_waiting_at_the_router():
    """The first instance became routable at 2 s, the very microsecond of a tick; the five
    requests parked at the router had not reached it yet, the tick read in_flight 0 and
    drained it, and they waited 9 s for a new node. Waiting requests count as demand."""
    scenario = {
        "node_pools": [{"name": "h100", "gpu_type": "H100", "gpus_per_node": 2,
                        "initial_nodes": 1, "max_nodes": 3,
                        "provisioning_delay": {"mean_s": 5}, "cost_per_hour": 36}],
        "deployments": [{"name": "llama", "num_instances": 1, "pool": "h100"}],
        "instance_lifecycle": {"loading_delay": {"mean_s": 2}},
        "autoscaler": [{"deployment": "llama", "signal": "in_flight", "scale_up_threshold": 8,
                        "scale_down_threshold": 2, "min_instances": 0, "max_instances": 4,
                        "interval_s": 2, "scrape_delay_s": 0,
                        "scale_down_stabilization_s": 0}],
        "workload": {"rate": 5, "num_requests": 200},
    }  # fmt: skip
    result = simulator.simulate(scenario, warn_unsteady=False)
    rows = result.timeline
    first = rows[rows.id == "instance_0"]
    assert not first[first.time_s == 2.0].to_state.isin(["draining", "terminated"]).any()
    assert result.requests.first_schedule_us.min() <= 2_000_000 + 100_000


def _v2_client(
    client_id: str, fraction: float, prompt: int, output: int, windows: list | None = None
) -> dict:
    spec = {"id": client_id, "rate_fraction": fraction, "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": prompt}},
            "output_distribution": {"type": "constant", "params": {"value": output}}}  # fmt: skip
    if windows:
        spec["lifecycle"] = {"windows": windows}
    return spec


def _one_gpu_pool(provisioning_s: float) -> dict:
    return {"name": "h100", "gpu_type": "H100", "gpus_per_node": 1, "initial_nodes": 1,
            "min_nodes": 1, "max_nodes": 4, "provisioning_delay": {"mean_s": provisioning_s},
            "cost_per_hour": 100.0}  # fmt: skip


def _scaler(**settings) -> dict:
    return {"deployment": "llama", "signal": "in_flight", "interval_s": 1, "scrape_delay_s": 0,
            "scale_up_stabilization_s": 0, "min_instances": 1, **settings}  # fmt: skip


def test_a_node_ordered_for_an_instance_cancelled_while_it_waited_is_released():
    """A 3 s spike: the autoscaler adds two instances at 6 s and 7 s and orders a node for
    each (30 s away); the spike is over and both are scaled down while still Scheduling.
    The nodes come up empty at 36 s and 37 s and go at the autoscaler's next decision (1 s
    ticks), as any idle node above min_nodes would, instead of being billed to the end of
    the run."""
    windows = [{"start_us": 5_000_000, "end_us": 8_000_000}]
    scenario = {
        "node_pools": [_one_gpu_pool(30)],
        "deployments": [{"name": "llama", "num_instances": 1, "pool": "h100"}],
        "instance_lifecycle": {"initial_instances_loaded": True, "loading_delay": {"mean_s": 5}},
        "autoscaler": [_scaler(scale_up_threshold=10, scale_down_threshold=5, max_instances=3,
                               scale_down_stabilization_s=2)],
        "workload": {"version": "2", "seed": 3, "aggregate_rate": 30, "horizon": 120_000_000,
                     "clients": [_v2_client("steady", 0.05, 256, 64),
                                 _v2_client("spike", 0.95, 512, 100, windows)]},
    }  # fmt: skip
    result = run_checked(scenario)
    assert_conserved(result)
    nodes = result.timeline[result.timeline.kind == "node"]
    ordered = nodes[nodes.reason == "scale-up"].id.tolist()
    assert ordered == ["h100-1", "h100-2"]
    for node_id in ordered:
        moves = nodes[nodes.id == node_id]
        ready = moves[moves.to_state == "ready"].time_s.item()
        gone = moves[moves.to_state == "terminated"]
        assert gone.reason.item() == "scale-down: idle node"
        assert ready <= gone.time_s.item() <= ready + 1


def test_instances_waiting_for_a_withdrawn_node_order_another():
    """The autoscaler adds an instance at 1 s and orders h100-1 for it (10 s away); an event
    fails h100-1 at 8 s, before it is up. The waiting instance orders another node at once
    (ready at 18 s) instead of waiting in Scheduling to the end of the run."""
    scenario = {
        "node_pools": [_one_gpu_pool(10)],
        "deployments": [{"name": "llama", "num_instances": 1, "pool": "h100"}],
        "instance_lifecycle": {"initial_instances_loaded": True, "loading_delay": {"mean_s": 5}},
        "autoscaler": [_scaler(scale_up_threshold=10, scale_down_threshold=1, max_instances=2,
                               scale_down_stabilization_s=60)],
        "events": [{"at_s": 8, "action": "fail_node", "node": "h100-1"}],
        "workload": {"version": "2", "seed": 3, "aggregate_rate": 40, "horizon": 40_000_000,
                     "clients": [_v2_client("c", 1, 512, 100)]},
    }  # fmt: skip
    result = run_checked(scenario)
    assert_conserved(result)
    rows = result.timeline
    second = rows[rows.id == "instance_1"]
    assert second.to_state.tolist() == ["scheduling", "loading", "active"]
    assert second[second.to_state == "loading"].reason.item() == "placed on h100-2"
    assert rows[(rows.id == "h100-2") & (rows.to_state == "provisioning")].time_s.item() == 8.0


def _two_spikes() -> dict:
    windows = [{"start_us": 10_000_000, "end_us": 25_000_000},
               {"start_us": 60_000_000, "end_us": 75_000_000}]  # fmt: skip
    return {
        "node_pools": [_one_gpu_pool(5) | {"cost_per_hour": 10.0}],
        "deployments": [{"name": "llama", "num_instances": 1, "pool": "h100"}],
        "instance_lifecycle": {"initial_instances_loaded": True, "loading_delay": {"mean_s": 5}},
        "autoscaler": [_scaler(scale_up_threshold=20, scale_down_threshold=5, max_instances=3,
                               interval_s=2, scale_down_stabilization_s=6)],
        "workload": {"version": "2", "seed": 3, "aggregate_rate": 24, "horizon": 100_000_000,
                     "clients": [_v2_client("steady", 0.05, 256, 64),
                                 _v2_client("spike", 0.95, 1024, 200, windows)]},
    }  # fmt: skip


def test_a_second_spike_gets_new_instances_after_the_first_ones_ended():
    """max_instances 3 and two spikes with scale-downs between them: the first spike uses
    the deployment's three planned slots, and the second gets instances made during the run
    (instance_3 on), never more than three live at once."""
    result = run_checked(_two_spikes())
    assert_conserved(result)
    assert_legal_timeline(result)
    rows = result.timeline
    made = rows[(rows.kind == "instance") & (rows.to_state == "scheduling")]
    late = made[made.time_s > 60]
    assert len(late) >= 1 and all(int(i.split("_")[1]) >= 3 for i in late.id)
    assert "autoscaler_llama_refused_scale_ups" not in result.fleet_metrics
    live = 0
    for row in rows[rows.kind == "instance"].itertuples():
        live += (row.to_state == "scheduling") - (row.to_state == "terminated")
        assert live <= 3


def test_refused_scale_ups_are_one_row_per_spell_counted_and_warned_about(caplog, monkeypatch):
    """The same run where one run may make only three instances (limits.MAX_INSTANCES,
    patched): every ask of the second spike is refused. One timeline row says so (the
    fleet did not change between the refusals), fleet_metrics counts each, and the run ends
    with a warning."""
    import simulator.cluster.cluster as cluster_module

    monkeypatch.setattr(cluster_module, "MAX_INSTANCES", 3)
    with caplog.at_level("WARNING", logger="servesim"):
        result = simulator.simulate(_two_spikes(), warn_unsteady=False)
    refused = result.fleet_metrics["autoscaler_llama_refused_scale_ups"]
    rows = result.timeline[result.timeline.kind == "autoscaler"]
    assert refused > 1 and len(rows) == 1 and rows.time_s.item() > 60
    warned = [r.getMessage() for r in caplog.records if "scale-ups refused" in r.getMessage()]
    assert len(warned) == 1 and f"{refused} scale-ups refused" in warned[0]


def test_a_scale_up_to_restore_min_instances_says_so():
    """The only instance is drained at 3 s; the next tick adds one because the deployment is
    below min_instances, whatever the signal reads, and the timeline's reason says that."""
    scenario = {
        "deployments": [{"name": "llama", "num_instances": 1}],
        "instance_lifecycle": {"initial_instances_loaded": True},
        "autoscaler": [_scaler(scale_up_threshold=50, scale_down_threshold=0, max_instances=3)],
        "events": [{"at_s": 3, "action": "drain_instance", "target": "instance_0"}],
        "workload": constant_workload(2, 20, 128, 16),
    }  # fmt: skip
    result = simulator.simulate(scenario, warn_unsteady=False)
    rows = result.timeline
    added = rows[(rows.id == "instance_1") & (rows.to_state == "scheduling")]
    assert added.reason.item() == "scale-up: 0 live < min_instances 1"
