"""Determinism across processes (INV-6): the same scenario and seed print a byte-identical
summary in a fresh process whatever PYTHONHASHSEED is, match the in-process API, and give
identical sweep rows on the local and Ray backends.

Prefix-cache block hashes come from Python's hash() of tuples holding strings, which is
salted per process by PYTHONHASHSEED. They are only ever used as dictionary keys (looked up,
never ordered or printed), so the salt must not change any result; these tests hold that.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

import simulator
from simulator.sweeps import sweep

# Prefix sharing on a multi-instance cluster with prefix-aware routing and PD: every place
# where a block hash could leak into a decision.
PREFIX_HEAVY = "scenarios/pd_prefix_threshold.yaml"
CASES = {
    "pd_prefix_threshold": ["run", PREFIX_HEAVY, "--num-requests", "100"],
    "rag_shared_prefix": [
        "run",
        "scenarios/rag_shared_prefix.yaml",
        "--num-requests",
        "100",
        "--num-instances",
        "3",
        "--routing-policy",
        "weighted",
        "--routing-scorers",
        "precise-prefix-cache:2,prefix-affinity:2,queue-depth:1",
    ],
    "agent_sessions": ["run", "scenarios/agent_sessions.yaml", "--num-requests", "100"],
}
HASH_SEEDS = ["0", "1", "4242"]


def _start(args: list[str], hash_seed: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *args, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
    )


@pytest.fixture(scope="module")
def outputs() -> dict[str, dict[str, bytes]]:
    """stdout of every case under every hash seed, each in a fresh process (two at a time:
    the machine is shared)."""
    jobs = [(name, seed) for name in CASES for seed in HASH_SEEDS]
    results: dict[str, dict[str, bytes]] = {name: {} for name in CASES}
    for i in range(0, len(jobs), 2):
        running = [(name, seed, _start(CASES[name], seed)) for name, seed in jobs[i : i + 2]]
        for name, seed, proc in running:
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, stderr.decode()
            results[name][seed] = stdout
    return results


@pytest.mark.parametrize("name", sorted(CASES))
def test_summary_is_byte_identical_whatever_the_hash_seed(outputs, name):
    by_seed = outputs[name]
    first = by_seed[HASH_SEEDS[0]]
    assert b"=== Simulation Metrics ===" in first
    for seed in HASH_SEEDS[1:]:
        assert by_seed[seed] == first, f"{name}: PYTHONHASHSEED={seed} changed the output"


def test_fresh_process_matches_the_in_process_api(outputs):
    in_process = simulator.simulate(PREFIX_HEAVY, workload__num_requests=100)
    printed = outputs["pd_prefix_threshold"][HASH_SEEDS[0]].decode()
    assert printed.rstrip("\n") == in_process.report_text().rstrip("\n")


def test_local_and_ray_sweep_rows_are_identical_to_the_byte():
    try:
        import ray
    except ImportError:
        pytest.skip("Ray is not installed")
    base = {
        "workload": {
            "version": "2",
            "aggregate_rate": 30,
            "num_requests": 80,
            "clients": [
                {
                    "id": "rag",
                    "rate_fraction": 1,
                    "arrival": {"process": "poisson"},
                    "prefix_group": "docs",
                    "prefix_length": 512,
                    "input_distribution": {"type": "constant", "params": {"value": 128}},
                    "output_distribution": {"type": "exponential", "params": {"mean": 32}},
                }
            ],
        },
        "cluster": {
            "num_instances": 2,
            "routing": {"policy": "weighted", "scorers": "prefix-affinity:2,queue-depth:1"},
        },
    }
    grid = {"engine.max_num_running_reqs": [4, 32]}
    local = sweep(base, grid, seeds=[3, 4], workers=2)
    try:
        on_ray = sweep(base, grid, seeds=[3, 4], backend="ray")
    finally:
        ray.shutdown()
    assert local.runs.to_csv(index=False) == on_ray.runs.to_csv(index=False)
    pd.testing.assert_frame_equal(local.points, on_ray.points, check_exact=True)
