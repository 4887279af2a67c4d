"""Random whole configurations: engine × cluster × PD × fleet lifecycle × autoscaler × traffic.

The parsers' fuzzers (test_fuzz_inputs.py) damage one input at a time; this one builds
scenarios that are mostly valid but combine features in ways no hand-written test does, and
simulates each with every invariant checked (tests/conftest.py turns the checks on), the
progress watchdog included. The laws:

- every configuration either runs to the end or is refused with a one-line ServesimError —
  never another exception (a broken invariant is an InvariantViolation, not a ServesimError,
  so it fails the test);
- each run finishes within a wall-clock budget (a hang fails instead of stalling the suite);
- every request that arrived ends in exactly one counted state.

Budgets: a few configurations in the suite (derandomized: the same ones every run), 1,000
under `make fuzz`. `make fuzz` also caps the process's memory (tests/conftest.py), so a
configuration that tries to allocate without bound fails with MemoryError instead of taking
the machine down.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import simulator
from simulator.cluster.admission import ADMISSION_POLICIES
from simulator.cluster.disaggregation import PD_DECIDERS
from simulator.cluster.routing import ROUTING_POLICIES, SCORERS
from simulator.engine.policies import PRIORITY_POLICIES, SCHEDULERS
from simulator.errors import ServesimError
from simulator.invariants import CONSERVED_STATES
from tests.fuzzing import finishes_within, fuzz_settings

CASE_LIMIT_S = 120
MODELS = ["meta-llama/llama-3.1-8b-instruct", "qwen/qwen2.5-7b-instruct", "qwen/qwen3-14b"]


def _maybe(draw, strategy, probability_none: float = 0.5):
    return None if draw(st.floats(0, 1)) < probability_none else draw(strategy)


@st.composite
def engines(draw) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "block_size_tokens": draw(st.sampled_from([1, 4, 16, 16, 32])),
        "max_num_running_reqs": draw(st.integers(1, 64)),
        "max_num_scheduled_tokens": draw(st.sampled_from([1, 16, 256, 2048, 8192])),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 1, 64, 512])),
        "scheduler": draw(st.sampled_from(sorted(SCHEDULERS))),
        "priority_policy": draw(st.sampled_from(sorted(PRIORITY_POLICIES))),
        "enable_prefix_caching": draw(st.booleans()),
    }
    # Small caches preempt, drop and (with PD) fill up with queued transfers.
    blocks = _maybe(draw, st.sampled_from([1, 2, 8, 20, 64, 500, 5000]), 0.3)
    if blocks is not None:
        engine["total_kv_blocks"] = blocks
    max_model_len = _maybe(draw, st.sampled_from([0, 64, 300, 4096]), 0.6)
    if max_model_len is not None:
        engine["max_model_len"] = max_model_len
    if draw(st.integers(0, 4)) == 0:
        engine["kv_cpu_blocks"] = draw(st.sampled_from([1, 16, 400]))
        engine["kv_offload_policy"] = draw(st.sampled_from(["evict", "mirror"]))
        engine["kv_reload_blocking"] = draw(st.booleans())
        engine["kv_transfer_base_latency_us"] = draw(st.sampled_from([0, 100, 5000]))
    return engine


@st.composite
def latencies(draw) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"model": draw(st.sampled_from(["roofline", "physics"]))}
    return {
        "model": "blackbox",
        "alpha_coeffs": [draw(st.sampled_from([0, 50, 2000])), 0.5, 0],
        "beta_coeffs": [draw(st.sampled_from([1, 1000, 6000])), 0.5, 3.0],
    }


@st.composite
def clusters(draw, instances: int) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "num_instances": instances,
        "routing": {
            "policy": draw(st.sampled_from(sorted(ROUTING_POLICIES))),
            "snapshot_refresh_interval_us": draw(st.sampled_from([0, 0, 1000, 500_000])),
            "latency_us": draw(st.sampled_from([0, 0, 50])),
        },
    }
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(sorted(SCORERS)), min_size=1, max_size=3))
        weights = draw(st.lists(st.integers(1, 5), min_size=len(names), max_size=len(names)))
        cluster["routing"]["scorers"] = ",".join(
            f"{n}:{w}" for n, w in zip(dict.fromkeys(names), weights, strict=False)
        )
    admission = draw(st.sampled_from(sorted(ADMISSION_POLICIES)))
    cluster["admission"] = {"policy": admission}
    if admission == "token-bucket":
        cluster["admission"]["token_bucket_capacity"] = draw(st.sampled_from([10, 5000, 1e6]))
        cluster["admission"]["token_bucket_refill_rate"] = draw(st.sampled_from([100, 1e5]))
    if instances >= 2 and draw(st.booleans()):
        prefill = draw(st.integers(1, instances - 1))
        decode = draw(st.integers(1, instances - prefill))
        cluster["pd"] = {
            "prefill_instances": prefill,
            "decode_instances": decode,
            "decider": draw(st.sampled_from(sorted(PD_DECIDERS))),
            "transfer_contention": draw(st.booleans()),
            "transfer_bandwidth_gb_per_s": draw(st.sampled_from([0.01, 25.0, 400.0])),
            "transfer_slots": draw(st.sampled_from([None, 1, 3])),
        }
        if cluster["pd"]["decider"] == "prefix-threshold":
            cluster["pd"]["prefix_threshold"] = draw(st.sampled_from([0, 16, 512]))
        if draw(st.booleans()):
            cluster["pd"]["decode"] = {"total_kv_blocks": draw(st.sampled_from([4, 20, 300]))}
    return cluster


@st.composite
def fleets(draw, instances: int) -> dict[str, Any]:
    """Lifecycle events and an autoscaler over the fixed instance ids."""
    fleet: dict[str, Any] = {}
    if draw(st.booleans()):
        fleet["instance_lifecycle"] = {
            "initial_instances_loaded": draw(st.booleans()),
            "loading_delay": {"mean_s": draw(st.sampled_from([0, 0.5, 5]))},
            "warm_up_request_count": draw(st.sampled_from([0, 0, 3])),
            "drain_policy": draw(st.sampled_from(["wait", "redirect", "immediate"])),
            "retry_on_failure": draw(st.booleans()),
        }
    if draw(st.booleans()):
        actions = st.sampled_from(["drain_instance", "fail_instance", "add_instance"])
        events = []
        for _ in range(draw(st.integers(1, 4))):
            action = draw(actions)
            event: dict[str, Any] = {
                "at_s": draw(st.sampled_from([0, 0.5, 2, 10])),
                "action": action,
            }
            if action != "add_instance":
                event["target"] = f"instance_{draw(st.integers(0, instances - 1))}"
                if draw(st.booleans()):
                    event["drain_policy"] = draw(st.sampled_from(["wait", "redirect", "immediate"]))
            events.append(event)
        fleet["events"] = events
    if draw(st.booleans()):
        fleet["autoscaler"] = [
            {
                "signal": draw(st.sampled_from(["in_flight", "queue_depth", "kv_utilization"])),
                "scale_up_threshold": draw(st.sampled_from([0.5, 4, 50])),
                "min_instances": draw(st.integers(0, 1)),
                "max_instances": draw(st.integers(max(1, instances), instances + 2)),
                "interval_s": draw(st.sampled_from([0.5, 1, 15])),
                "scale_down_stabilization_s": draw(st.sampled_from([0, 5, 300])),
            }
        ]
    return fleet


@st.composite
def workloads(draw) -> dict[str, Any]:
    def lengths(low: int, high: int) -> dict[str, Any]:
        if draw(st.booleans()):
            return {"distribution": "constant", "value": draw(st.integers(low, high))}
        lo = draw(st.integers(max(low, 1), high))
        return {
            "mean": draw(st.integers(lo, high)),
            "stdev": draw(st.sampled_from([0, 10, 500])),
            "min": lo,
            "max": draw(st.integers(lo, high)),
        }

    workload: dict[str, Any] = {
        "rate": draw(st.sampled_from([0.5, 5, 50, 500])),
        "num_requests": draw(st.integers(1, 60)),
        "arrival": draw(st.sampled_from(["poisson", "constant"])),
        "prompt_tokens": lengths(0, 3000),
        "output_tokens": lengths(0, 600),
    }
    if draw(st.integers(0, 3)) == 0:
        workload["prefix_tokens"] = draw(st.sampled_from([16, 200]))
    if draw(st.integers(0, 3)) == 0:
        workload["timeout_us"] = draw(st.sampled_from([1, 50_000, 2_000_000]))
    return workload


@st.composite
def scenarios(draw) -> dict[str, Any]:
    instances = draw(st.integers(1, 5))
    scenario: dict[str, Any] = {
        "seed": draw(st.integers(0, 1000)),
        "model": draw(st.sampled_from(MODELS)),
        "hardware": draw(st.sampled_from(["H100", "H100", "A100-80"])),
        "latency": draw(latencies()),
        "engine": draw(engines()),
        "cluster": draw(clusters(instances)),
        "workload": draw(workloads()),
    }
    # PD pools run on a fixed fleet (a documented ConfigError otherwise): mostly keep them
    # apart, sometimes not, to check that refusal too.
    if "pd" not in scenario["cluster"] or draw(st.integers(0, 9)) == 0:
        scenario.update(draw(fleets(instances)))
    if draw(st.integers(0, 4)) == 0:
        scenario["horizon_us"] = draw(st.sampled_from([1, 100_000, 3_000_000]))
    return scenario


@fuzz_settings(ci_examples=12, long_cap=1000)
@given(scenarios())
def test_random_configurations_run_or_are_refused_in_one_line(scenario):
    with finishes_within(CASE_LIMIT_S):
        try:
            result = simulator.simulate(scenario, check_invariants=True)
        except ServesimError as exc:
            message = str(exc)
            assert message.strip() and "\n" not in message, (scenario, message)
            return
    s = result.summary
    arrived = len(result.request_records)
    assert arrived == s["injected_requests"] + result.admission_rejections + (
        result.routing_rejections
    ), scenario
    ended = sum(s.get(k, 0) for k in CONSERVED_STATES)
    assert ended == s["injected_requests"], (scenario, s)
