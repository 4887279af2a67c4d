"""Named-deployment defects QA found, each pinned here.

1. Round-robin keeps one turn counter per served model: two models' alternating traffic
   no longer leaves half of each model's instances idle (docs/cluster.md, routing table).
2. A deployment without `model` answers to the scenario's top-level `model` string
   (docs/infrastructure.md "Routing by model").
3. A deployment of 0 instances that nothing can ever start is refused, naming
   `deployments[NAME].num_instances`; untagged requests go to the first deployment's model.
4. The KV-capacity fallback warning names its deployment.
5. A deployment's bad `latency_model` is told by that field's name.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import simulator
from simulator.cluster.routing import RoundRobin
from simulator.cluster.snapshot import InstanceSnapshot
from simulator.engine.request import Request
from simulator.errors import ConfigError

LLAMA = "meta-llama/llama-3.1-8b-instruct"
QWEN = "qwen/qwen3-14b"

_COLUMNS = (
    "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,"
    "prefix_length,streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,"
    "video_tokens,reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,"
    "send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,"
    "finish_reason"
)


def _client(cid: str, model: str | None, fraction: float) -> dict:
    client = {
        "id": cid,
        "rate_fraction": fraction,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 100}},
        "output_distribution": {"type": "constant", "params": {"value": 20}},
    }
    if model is not None:
        client["model"] = model
    return client


def _workload(*clients: dict, n: int = 20) -> dict:
    return {
        "version": "2",
        "seed": 3,
        "aggregate_rate": 4,
        "num_requests": n,
        "clients": list(clients),
    }


# ------------------------------------------------------- 1. round-robin per model


def test_round_robin_keeps_a_turn_per_model():
    policy = RoundRobin()
    llama = [
        InstanceSnapshot("instance_0", 0, model="a"),
        InstanceSnapshot("instance_1", 1, model="a"),
    ]
    qwen = [
        InstanceSnapshot("instance_2", 2, model="b"),
        InstanceSnapshot("instance_3", 3, model="b"),
    ]
    chosen = []
    for i in range(8):
        candidates = llama if i % 2 == 0 else qwen
        decision = policy.route(Request(f"r{i}", 0, 100, 10, index=i), candidates, 0)
        snap = next(c for c in candidates if c.index == decision.target)
        policy.observe(Request(f"r{i}", 0, 100, 10, index=i), snap)
        chosen.append(decision.target)
    assert chosen == [0, 2, 1, 3, 0, 2, 1, 3]


def test_round_robin_single_model_is_one_global_counter():
    policy = RoundRobin()
    pool = [InstanceSnapshot(f"instance_{i}", i, model="m") for i in range(3)]
    targets = []
    for i in range(6):
        decision = policy.route(Request(f"r{i}", 0, 100, 10, index=i), pool, 0)
        policy.observe(Request(f"r{i}", 0, 100, 10, index=i), pool[decision.target])
        targets.append(decision.target)
    assert targets == [0, 1, 2, 0, 1, 2]


def test_round_robin_two_models_use_every_instance(tmp_path: Path):
    rows = [
        f"{i},c,,,,0,,0,false,100,10,0,0,0,0,0,{LLAMA if i % 2 == 0 else QWEN},0,100,"
        f"{i * 100_000},{i * 100_000},0,0,0,ok,,"
        for i in range(40)
    ]
    (tmp_path / "rr.csv").write_text("\n".join([_COLUMNS, *rows]) + "\n")
    result = simulator.simulate(
        {
            "seed": 2,
            "deployments": [
                {"name": "llama", "model": LLAMA, "num_instances": 2},
                {"name": "qwen", "model": QWEN, "num_instances": 2},
            ],
            "cluster": {"routing": {"policy": "round-robin"}},
            "trace": {"data": str(tmp_path / "rr.csv")},
        },
        warn_unsteady=False,
    )
    counts = result.requests.groupby(["model", "instance_id"]).size().to_dict()
    assert counts == {
        (LLAMA, "instance_0"): 10,
        (LLAMA, "instance_1"): 10,
        (QWEN, "instance_2"): 10,
        (QWEN, "instance_3"): 10,
    }


# ------------------------------------------- 2. the scenario's model names its deployment


def test_deployment_without_model_answers_to_the_scenarios_model():
    result = simulator.simulate(
        {
            "seed": 3,
            "model": "llama-3.1-8b-instruct",
            "deployments": [
                {"name": "a", "num_instances": 1},
                {"name": "b", "model": "Qwen3-14B", "tp": 2},
            ],
            "workload": _workload(
                _client("short", "llama-3.1-8b-instruct", 0.5), _client("q", "qwen3-14b", 0.5)
            ),
        },
        warn_unsteady=False,
    )
    assert result.anomalies["routing_rejections"] == 0
    frame = result.per_model.set_index("model")
    assert sorted(frame.index) == [LLAMA, QWEN]
    assert frame["rejected"].sum() == 0
    assert frame["completed"].sum() == 20


# -------------------------------------------- 3. a deployment nothing can ever start


def _zero_first(**extra) -> dict:
    return {
        "seed": 3,
        "deployments": [
            {"name": "qwen", "model": QWEN, "tp": 2, "num_instances": 0},
            {"name": "llama", "model": LLAMA, "num_instances": 1},
        ],
        "workload": _workload(_client("a", QWEN, 0.5), _client("b", None, 0.5)),
        **extra,
    }


def test_zero_instances_without_a_way_to_start_one_is_refused():
    with pytest.raises(ConfigError) as err:
        simulator.simulate(_zero_first(), warn_unsteady=False)
    message = str(err.value)
    assert "deployments[qwen].num_instances: invalid value 0" in message
    assert "autoscaler" in message and "add_instance" in message


def test_zero_instances_started_by_an_event_is_accepted_and_untagged_goes_to_it():
    # An add_instance event can start the deployment: accepted, and untagged traffic
    # follows the first deployment (qwen), not the one running at t = 0.
    result = simulator.simulate(
        _zero_first(events=[{"at_s": 0, "action": "add_instance", "deployment": "qwen"}]),
        warn_unsteady=False,
    )
    untagged = result.requests[result.requests["client_id"] == "b"]
    assert len(untagged) > 0
    assert set(untagged["model"].fillna("")) <= {"", QWEN}
    frame = result.per_model.set_index("model")
    assert frame.loc[QWEN, "requests"] == 20
    assert frame.loc[LLAMA, "requests"] == 0


def test_an_idle_variant_of_a_served_model_is_accepted():
    # 0 instances and nothing to start one, but another deployment serves its model.
    scenario = _zero_first()
    scenario["deployments"][0] = {"name": "idle", "model": LLAMA, "num_instances": 0}
    scenario["workload"] = _workload(_client("b", None, 1.0))
    result = simulator.simulate(scenario, warn_unsteady=False)
    assert result.anomalies["routing_rejections"] == 0
    assert result.summary["completed_requests"] == 20


def test_untagged_requests_follow_the_first_deployment_not_the_first_slot():
    # The first deployment has no instance of its own, so qwen's is instance_0; untagged
    # traffic still asks for the first deployment's model, served by llama's instance_1.
    scenario = {
        "seed": 3,
        "deployments": [
            {"name": "idle", "model": LLAMA, "num_instances": 0},
            {"name": "qwen", "model": QWEN, "tp": 2, "num_instances": 1},
            {"name": "llama", "model": LLAMA, "num_instances": 1},
        ],
        "workload": {"rate": 2, "num_requests": 10},
    }
    result = simulator.simulate(scenario, warn_unsteady=False)
    assert result.requests.groupby("instance_id").size().to_dict() == {"instance_1": 10}
    # ... and the per-model table counts them under llama, which served them, not qwen.
    per_model = result.per_model.set_index("model")
    assert per_model.loc[LLAMA, "requests"] == 10
    assert per_model.loc[QWEN, "requests"] == 0


# ------------------------------------------------ 4. KV fallback warning names its deployment


def test_kv_fallback_warning_names_the_deployment(caplog):
    scenario = {
        "node_pools": [
            {
                "name": "h100",
                "gpu_type": "H100",
                "gpus_per_node": 8,
                "initial_nodes": 1,
                "max_nodes": 1,
            }
        ],
        "deployments": [
            {"name": "big", "model": "meta-llama/llama-3.1-70b-instruct", "tp": 1, "pool": "h100"}
        ],
        "workload": {"rate": 1, "num_requests": 1},
        "horizon_us": 1,
    }
    with caplog.at_level(logging.WARNING, logger="servesim"):
        simulator.simulate(scenario, warn_unsteady=False)
    fallback = [
        r.getMessage() for r in caplog.records if "auto-calculation failed" in r.getMessage()
    ]
    assert fallback, [r.getMessage() for r in caplog.records]
    assert all(m.startswith("deployments[big]: KV capacity") for m in fallback)


# ------------------------------------------------------ 5. latency_model by its own name


def test_bad_deployment_latency_model_is_told_as_latency_model():
    scenario = {
        "deployments": [
            {"name": "llama", "model": LLAMA},
            {"name": "qwen", "model": QWEN, "tp": 2, "latency_model": "fancy"},
        ],
        "workload": {"rate": 1, "num_requests": 3},
    }
    with pytest.raises(ConfigError) as err:
        simulator.simulate(scenario, warn_unsteady=False)
    message = str(err.value)
    assert message.startswith("deployments[qwen]: latency_model: unknown latency model 'fancy'")
    assert "latency.model" not in message


# ------------------------------------------- 6. Engine Policies: the deployments' limits


def _engine_block(result: simulator.Result) -> dict:
    text = result.report_text()
    start = text.index("=== Engine Policies ===") + len("=== Engine Policies ===")
    return json.loads(text[start : text.index("\n}", start) + 2])


def test_engine_policies_give_the_deployments_batch_limits():
    one_a100 = {
        "seed": 3,
        "node_pools": [
            {
                "name": "a",
                "gpu_type": "A100-80",
                "gpus_per_node": 4,
                "initial_nodes": 1,
                "max_nodes": 1,
            }
        ],
        "deployments": [{"name": "qwen", "model": QWEN, "tp": 2, "num_instances": 1, "pool": "a"}],
        "workload": {"rate": 2, "num_requests": 4},
    }
    block = _engine_block(simulator.simulate(one_a100, warn_unsteady=False))
    assert block["max_num_running_reqs"] == 256
    assert block["max_num_scheduled_tokens"] == 2048
    assert block["batch_limits_source"] == "vLLM's default on A100-80"

    two = {
        "seed": 3,
        "deployments": [
            {"name": "llama", "model": LLAMA, "num_instances": 1},
            {"name": "qwen", "model": QWEN, "tp": 2, "hardware": "A100-80", "num_instances": 1},
        ],
        "workload": {"rate": 2, "num_requests": 4},
    }
    result = simulator.simulate(two, warn_unsteady=False)
    block = _engine_block(result)
    assert "max_num_running_reqs" not in block
    assert block["by_deployment"]["llama"]["max_num_running_reqs"] == 1024
    assert block["by_deployment"]["qwen"]["max_num_running_reqs"] == 256
    assert result.results_document()["engine_policies"] == block
    # The Latency Model block stays about latency.
    for entry in result.latency_provenance["by_deployment"].values():
        assert "max_num_running_reqs" not in entry
