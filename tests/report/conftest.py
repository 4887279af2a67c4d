"""Runs the report tests share: small (a few hundred requests each), simulated once per session.

- `chatbot`: one instance, SLO targets (TTFT 500 ms, ITL 50 ms), 300 requests: no PD, no
  routing, a fixed fleet.
- `pd_run`: 2 prefill + 2 decode instances, every request disaggregated, decision trace with
  two counterfactual candidates, 200 requests.
- `fleet_run`: two 1-GPU nodes, one fails at 4 s and is replaced at 6 s (ready at 8 s, its
  instance active at 9 s), 15 s of traffic at 20 req/s.
- `preempting`: the chatbot at 40 req/s in a 600-block KV cache: preemptions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import simulator

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"

FLEET_SCENARIO = {
    "name": "small-fleet",
    "seed": 9,
    "model": "meta-llama/llama-3.1-8b-instruct",
    "node_pools": [
        {
            "name": "h100",
            "gpu_type": "H100",
            "gpus_per_node": 1,
            "initial_nodes": 2,
            "max_nodes": 3,
            "provisioning_delay": {"mean_s": 2},
            "cost_per_hour": 3.0,
        }
    ],
    "deployments": [{"name": "llama", "num_instances": 2, "pool": "h100"}],
    "instance_lifecycle": {
        "initial_instances_loaded": True,
        "loading_delay": {"mean_s": 1},
        "retry_on_failure": True,
    },
    "cluster": {"routing": {"policy": "least-loaded"}},
    "events": [
        {"at_s": 4, "action": "fail_node", "node": "h100-1"},
        {"at_s": 6, "action": "add_node", "pool": "h100"},
        {"at_s": 6, "action": "add_instance", "deployment": "llama"},
    ],
    "workload": {
        "version": "2",
        "seed": 9,
        "aggregate_rate": 20,
        "horizon": 15_000_000,
        "clients": [
            {
                "id": "chat",
                "rate_fraction": 1,
                "arrival": {"process": "poisson"},
                "input_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 512, "std_dev": 128, "min": 64, "max": 2048},
                },
                "output_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 64, "std_dev": 16, "min": 8, "max": 256},
                },
            }
        ],
    },
}


@pytest.fixture(scope="session")
def chatbot():
    return simulator.simulate(SCENARIOS / "chatbot.yaml", workload__num_requests=300)


@pytest.fixture(scope="session")
def pd_run():
    return simulator.simulate(
        SCENARIOS / "pd_2p2d.yaml",
        workload__num_requests=200,
        cluster__trace__level="decisions",
        cluster__trace__counterfactual_k=2,
    )


@pytest.fixture(scope="session")
def fleet_run():
    return simulator.simulate(FLEET_SCENARIO)


@pytest.fixture(scope="session")
def preempting():
    return simulator.simulate(
        SCENARIOS / "chatbot.yaml",
        workload__num_requests=300,
        workload__rate=40,
        engine__total_kv_blocks=600,
        warn_unsteady=False,
    )
