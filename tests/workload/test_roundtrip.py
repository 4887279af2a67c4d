"""run → TraceV2 → replay reproduces the run's summary byte for byte.

The exported trace carries every request's arrival time, lengths, deadline, tags and (as a v3
prefix_length column) its shared prefix, so the replay sees the same content sharing. A
closed-loop session's later rounds are ordinary rows at the times they actually arrived.
"""

from __future__ import annotations

import json

import pytest

import simulator
from simulator.metrics.results import format_summary

WORKLOADS = {
    "prefix_groups_and_timeouts": {
        "version": "2",
        "aggregate_rate": 30,
        "num_requests": 400,
        "clients": [
            {
                "id": "rag",
                "rate_fraction": 2,
                "slo_class": "critical",
                "prefix_group": "docs",
                "prefix_length": 300,
                "timeout": 400_000,
                "arrival": {"process": "gamma", "cv": 2.5},
                "input_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 200, "std_dev": 50, "min": 10, "max": 600},
                },
                "output_distribution": {"type": "exponential", "params": {"mean": 150}},
            },
            {
                "id": "batch",
                "rate_fraction": 1,
                "slo_class": "batch",
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 900}},
                "output_distribution": {"type": "constant", "params": {"value": 60}},
            },
        ],
    },
    "closed_loop_sessions": {
        "version": "2",
        "aggregate_rate": 3,
        "horizon": 40_000_000,
        "clients": [
            {
                "id": "agent",
                "rate_fraction": 1,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 120}},
                "output_distribution": {"type": "exponential", "params": {"mean": 100}},
                "reasoning": {"multi_turn": {"max_rounds": 4, "think_time_us": 300_000}},
            }
        ],
    },
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_replaying_an_exported_trace_reproduces_the_run(name, tmp_path):
    scenario = {"workload": WORKLOADS[name], "engine": {"total_kv_blocks": 3000}}
    run = simulator.simulate(scenario)
    yaml_path, csv_path = run.write_trace(tmp_path / "trace")
    replayed = simulator.replay(yaml_path, csv_path, horizon_us=run.horizon_us)
    assert format_summary(replayed.summary) == format_summary(run.summary)
    assert json.dumps(replayed.per_slo) == json.dumps(run.per_slo)
    # The law behind the golden equality: every request sees the same latencies.
    ours = {r.arrival_us: (r.first_token_us, r.completion_us) for r in run.request_records}
    theirs = {r.arrival_us: (r.first_token_us, r.completion_us) for r in replayed.request_records}
    assert ours == theirs
