"""Workload generation speed: requests generated per wall second and peak memory.

Streams 1,000,000 requests from a three-client v2 spec (Poisson, gamma and weibull arrivals,
Gaussian / exponential / empirical lengths, a prefix group) without simulating them, and
without keeping them: memory must stay bounded however many requests are generated.

    .venv/bin/python benchmarks/bench_workload.py [--num-requests N]
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

from simulator.workload.generator import WorkloadStream
from simulator.workload.spec import workload_spec_from_dict

SPEC = {
    "version": "2",
    "aggregate_rate": 500,
    "clients": [
        {
            "id": "chat",
            "rate_fraction": 5,
            "arrival": {"process": "poisson"},
            "prefix_group": "system",
            "prefix_length": 200,
            "input_distribution": {
                "type": "gaussian",
                "params": {"mean": 300, "std_dev": 100, "min": 2, "max": 2000},
            },
            "output_distribution": {"type": "exponential", "params": {"mean": 200}},
        },
        {
            "id": "bursty",
            "rate_fraction": 3,
            "arrival": {"process": "gamma", "cv": 3},
            "input_distribution": {"type": "empirical", "params": {"100": 0.5, "1000": 0.5}},
            "output_distribution": {"type": "constant", "params": {"value": 64}},
        },
        {
            "id": "smooth",
            "rate_fraction": 2,
            "arrival": {"process": "weibull", "cv": 0.5},
            "input_distribution": {"type": "constant", "params": {"value": 512}},
            "output_distribution": {"type": "constant", "params": {"value": 128}},
        },
    ],
}


def generate(num_requests: int, trace_memory: bool) -> dict:
    spec = workload_spec_from_dict({**SPEC, "num_requests": num_requests})
    if trace_memory:
        tracemalloc.start()
    start = time.perf_counter()
    count = 0
    input_tokens = 0
    for req in WorkloadStream(spec, seed=42):
        count += 1
        input_tokens += req.input_tokens
    wall_s = time.perf_counter() - start
    peak_mib = tracemalloc.get_traced_memory()[1] / 2**20 if trace_memory else float("nan")
    if trace_memory:
        tracemalloc.stop()
    return {
        "requests": count,
        "wall_s": round(wall_s, 2),
        "requests_per_wall_s": round(count / wall_s),
        "peak_traced_mib": round(peak_mib, 1),
        "mean_input_tokens": round(input_tokens / count, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1_000_000)
    args = parser.parse_args()
    speed = generate(args.num_requests, trace_memory=False)
    # Memory on a tenth of the run: a bounded stream peaks at the same level for any length.
    small = generate(max(1, args.num_requests // 10), trace_memory=True)
    speed["peak_traced_mib_at_10pct"] = small["peak_traced_mib"]
    speed["peak_traced_mib"] = generate(args.num_requests, trace_memory=True)["peak_traced_mib"]
    print(json.dumps(speed, indent=2))


if __name__ == "__main__":
    main()
