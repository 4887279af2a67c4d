"""Cluster speed: simulated requests per wall second with 4 and 8 instances behind weighted
routing (default scorer profile), 5,000 requests at 70 % of the cluster's capacity.

Capacity: one H100 serving Llama-3.1-8B with 512 -> 128-token requests saturates at about
60.8 completed requests per second (measured by simulating it at 100 and 200 req/s), so 70 %
load is 0.7 x 60.8 x instances req/s of Poisson traffic.

    .venv/bin/python benchmarks/bench_cluster.py [--num-requests N] [--repeat K]
"""

from __future__ import annotations

import argparse
import json
import time

import simulator
from simulator.api import build_traffic, resolve_deployment
from simulator.cluster.cluster import run_simulation

SATURATION_REQ_PER_S = 60.8
LOAD = 0.7


def scenario(instances: int, num_requests: int) -> simulator.Scenario:
    return simulator.Scenario.model_validate(
        {
            "seed": 42,
            "model": "meta-llama/llama-3.1-8b-instruct",
            "hardware": "H100",
            "tp": 1,
            "engine": {"total_kv_blocks": 1_000_000},
            "cluster": {
                "num_instances": instances,
                "routing": {"policy": "weighted"},
            },
            "workload": {
                "rate": LOAD * SATURATION_REQ_PER_S * instances,
                "num_requests": num_requests,
                "prompt_tokens": {"distribution": "constant", "value": 512},
                "output_tokens": {"distribution": "constant", "value": 128},
            },
        }
    )


def run_once(instances: int, num_requests: int) -> dict:
    sc = scenario(instances, num_requests)
    deployment = resolve_deployment(sc)
    requests = list(build_traffic(sc)[0])
    start = time.perf_counter()
    result = run_simulation(
        requests,
        deployment.engine,
        deployment.step_model,
        cluster=sc.cluster,
        seed=sc.seed,
        model_name=deployment.model.name,
    )
    wall_s = time.perf_counter() - start
    return {
        "instances": instances,
        "requests": num_requests,
        "completed": result.summary["completed_requests"],
        "wall_s": round(wall_s, 3),
        "requests_per_wall_s": round(num_requests / wall_s, 1),
        "ttft_p99_ms": round(result.summary["ttft_p99_ms"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    out = []
    for instances in (4, 8):
        runs = [run_once(instances, args.num_requests) for _ in range(args.repeat)]
        best = max(runs, key=lambda r: r["requests_per_wall_s"])
        best["runs_requests_per_wall_s"] = [r["requests_per_wall_s"] for r in runs]
        out.append(best)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
