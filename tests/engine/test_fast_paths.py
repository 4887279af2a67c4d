"""The accelerations change nothing (simulator/engine/options.py): the decode fast path (steady
requests advanced lazily), step coalescing (an instance's quiet steps without an event each),
deferred private hashes and compact finished rows give identical per-request results, step
logs and summaries to the reference path (`EngineOptions(reference=True)`,
`simulate(..., reference=True)`): one request at a time, one event per step.

Random small scenarios cover what could break them: preemption (tiny KV caches), chunked
prefill (tiny budgets), context limits, timeouts, horizons, prefix caching and the CPU tier,
several instances behind routers with snapshot staleness, and PD disaggregation.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig
from simulator.engine.options import ACCELERATED, REFERENCE, EngineOptions
from simulator.engine.request import Request
from simulator.latency.roofline import RooflineModel
from tests.specs import H100, LLAMA31_8B
from tests.test_laws import scenarios as engine_scenarios

FAST_PATH_OFF = EngineOptions(decode_fast_path=False)


def accelerated(enabled: bool) -> EngineOptions:
    return ACCELERATED if enabled else REFERENCE


def _observables(result) -> tuple:
    """Everything a run reports, in comparable form."""
    pd_metrics = result.pd_metrics
    return (
        json.dumps(result.summary, sort_keys=True),
        json.dumps(result.instance_summaries, sort_keys=True),
        json.dumps(pd_metrics, sort_keys=True) if pd_metrics is not None else "",
        result.requests,
        result.steps,
        [list(e.irregular_itl_us) for e in result.engines],
    )


def _assert_same(fast, plain) -> None:
    fast_obs, plain_obs = _observables(fast), _observables(plain)
    assert fast_obs[:3] == plain_obs[:3]
    pd.testing.assert_frame_equal(fast_obs[3], plain_obs[3])
    pd.testing.assert_frame_equal(fast_obs[4], plain_obs[4])
    assert fast_obs[5] == plain_obs[5]


# Each example runs a scenario twice (accelerated and reference). 300 examples per law: 7 to
# 8 s a law on an idle 2-core machine; the CI profile draws the same ones every run
# (tests/conftest.py), `make fuzz` explores more.
SAME_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _copies(requests: list[Request]) -> list[Request]:
    """Fresh copies, marked as the generator would: a prompt's last segment of the request's
    own ("req", ...) content is private (the KV cache defers hashing it)."""
    copies = []
    for r in requests:
        c = Request(r.request_id, r.arrival_us, r.input_tokens, r.output_tokens, index=r.index,
                    deadline_us=r.deadline_us, segments=r.segments)  # fmt: skip
        key, length = c.segments[-1]
        if key[0] == "req":
            c.private_from_token = c.input_tokens - length
        copies.append(c)
    return copies


@SAME_SETTINGS
@given(engine_scenarios())
def test_one_engine_is_identical_with_and_without_speedups(case):
    requests, config, model, horizon = case
    runs = {}
    for enabled in (True, False):
        runs[enabled] = run_simulation(
            _copies(requests), config, model, horizon, options=accelerated(enabled)
        )
    _assert_same(runs[True], runs[False])


def _hash_state(engine) -> tuple:
    kv = engine.kv
    return dict(kv._hash_to_block), list(kv._block_hash)  # noqa: SLF001


def _run_keeping_engines(*args, **kwargs) -> tuple:
    """The result and the live engines (a result keeps only their records)."""
    kept = []
    result = run_simulation(*args, **kwargs, on_end=kept.extend)
    return result, kept


@SAME_SETTINGS
@given(engine_scenarios())
def test_the_fast_path_alone_leaves_the_same_hashes(case):
    """Private hashing deferred on both sides, the decode fast path on and off: a steady
    request is not woken when its private last prompt block fills up
    (`SteadyDecoders._wake`), so a release short of completion (preemption, timeout) must
    still hash that block as the per-request loop's count says. The caches' whole hash state
    is compared, not only what a later prefix hit would show."""
    requests, config, model, horizon = case
    runs, engines = {}, {}
    for enabled in (True, False):
        options = ACCELERATED if enabled else FAST_PATH_OFF
        runs[enabled], engines[enabled] = _run_keeping_engines(
            _copies(requests), config, model, horizon, options=options
        )
    _assert_same(runs[True], runs[False])
    assert [_hash_state(e) for e in engines[True]] == [_hash_state(e) for e in engines[False]]


def test_a_timeout_in_the_step_that_fills_the_private_prompt_block_hashes_it():
    """The targeted case of the property above: one private request (20 prompt tokens,
    16-token blocks, so its last prompt block holds positions 16-31 and fills in the step
    that computes position 31, the 12th decode step) times out in the middle of each of its
    first 20 steps. The per-request loop counts the block as full when it plans that step,
    so a timeout during it hashes two blocks and one during the step before hashes one;
    the fast path, which never woke for it, must agree
    (`SteadyDecoders.unsteady_one(in_step=1)`)."""
    config = EngineConfig(total_kv_blocks=100, block_size=16)
    model = RooflineModel(LLAMA31_8B, H100, 1)

    def run(deadline_us: int, fast: bool):
        req = Request("r", 0, 20, 40, index=0, deadline_us=deadline_us)
        req.private_from_token = 0
        return _run_keeping_engines(
            [req], config, model, None, options=ACCELERATED if fast else FAST_PATH_OFF
        )

    starts_us = list(run(0, True)[0].engines[0].steps.start_us)
    hashed_counts = []
    for start_us in starts_us[:20]:
        (fast, [fast_engine]), (plain, [plain_engine]) = (
            run(int(start_us) + 1, True),
            run(int(start_us) + 1, False),
        )
        _assert_same(fast, plain)
        assert _hash_state(fast_engine) == _hash_state(plain_engine)
        hashed_counts.append(len(fast_engine.kv._hash_to_block))  # noqa: SLF001
    # Step 0 prefills positions 0-19 (block 0 full); decode step k computes position 19 + k.
    assert hashed_counts == [1] * 12 + [2] * 8


@st.composite
def cluster_scenarios(draw):
    instances = draw(st.integers(1, 4))
    pd_on = instances >= 2 and draw(st.booleans())
    cluster = {
        "num_instances": instances,
        "routing": {
            "policy": draw(st.sampled_from(["round-robin", "least-loaded", "weighted"])),
            "snapshot_refresh_interval_us": draw(st.sampled_from([0, 0, 20_000])),
        },
    }
    if pd_on:
        prefill = draw(st.integers(1, instances - 1))
        cluster["pd"] = {
            "prefill_instances": prefill,
            "decode_instances": draw(st.integers(1, instances - prefill)),
            "decider": draw(st.sampled_from(["always", "prefix-threshold"])),
        }
    client = {
        "id": "c",
        "rate_fraction": 1,
        "arrival": {"process": draw(st.sampled_from(["poisson", "gamma"])), "cv": 2.0},
        "input_distribution": {
            "type": "gaussian",
            "params": {"mean": 150, "std_dev": 100, "min": 1, "max": 600},
        },
        "output_distribution": {"type": "exponential", "params": {"mean": 40}},
        "prefix_length": draw(st.sampled_from([0, 0, 48, 130])),
        "prefix_group": "shared",
    }
    timeout = draw(st.sampled_from([0, 0, 200_000]))
    if timeout:
        client["timeout"] = timeout
    return {
        "seed": draw(st.integers(0, 1000)),
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "horizon_us": draw(st.sampled_from([None, None, 1_500_000])),
        "engine": {
            # PD decode instances hold transferred prompts' blocks while those wait; a cache
            # they fill leaves a queue head that never fits, and the instance then spins on
            # empty 1 µs steps (with or without the speed-ups), so PD gets a roomy cache.
            "total_kv_blocks": draw(st.integers(5000, 20000) if pd_on else st.integers(30, 2000)),
            "block_size_tokens": draw(st.sampled_from([4, 16])),
            "max_num_scheduled_tokens": draw(st.sampled_from([64, 256, 2048])),
            "max_num_running_reqs": draw(st.sampled_from([4, 64])),
            "enable_prefix_caching": draw(st.booleans()),
        },
        "cluster": cluster,
        "workload": {
            "version": "2",
            "aggregate_rate": draw(st.sampled_from([10.0, 60.0, 300.0])),
            "num_requests": draw(st.integers(1, 60)),
            "clients": [client],
        },
    }


@SAME_SETTINGS
@given(cluster_scenarios())
def test_clusters_are_identical_with_and_without_speedups(scenario):
    runs = {}
    for enabled in (True, False):
        runs[enabled] = simulator.simulate(scenario, reference=not enabled)
    _assert_same(runs[True], runs[False])


def test_the_speedups_are_on_by_default_and_do_take_effect():
    scenario = {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "engine": {"total_kv_blocks": 100_000},
        "workload": {
            "rate": 5,
            "num_requests": 20,
            "prompt_tokens": {"distribution": "constant", "value": 100},
            "output_tokens": {"distribution": "constant", "value": 200},
        },
    }
    assert EngineOptions() == ACCELERATED
    result = simulator.simulate(scenario)
    steps = len(result.engines[0].steps)
    # Light traffic: nearly every step takes the fast path.
    assert result.engines[0].fast_path_steps > 0.9 * steps
    # 100 -> 300 tokens of context per request cross a 16-token block boundary 12 times while
    # decoding; with room to spare, steady requests take most of those blocks without waking.
    assert result.engines[0].steady_block_takes >= 20 * 10
    plain = simulator.simulate(scenario, reference=True)
    assert plain.engines[0].fast_path_steps == 0
    assert plain.engines[0].steady_block_takes == 0
    _assert_same(result, plain)


def test_an_instance_finishes_its_own_quiet_steps_without_events():
    """A lone instance's quiet step whose end precedes every other scheduled event is finished
    at once (in-actor coalescing), and nothing changes; in a PD cluster, where the other
    instances' steps interleave, it happens where it can and changes nothing there either."""
    lone = {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "workload": {
            "rate": 2,
            "num_requests": 20,
            "prompt_tokens": {"distribution": "constant", "value": 200},
            "output_tokens": {"distribution": "constant", "value": 150},
        },
    }
    result = simulator.simulate(lone)
    steps = len(result.engines[0].steps)
    # At 2 req/s each request decodes ~150 steps of ~10 ms alone or with one other between
    # arrivals ~500 ms apart: most steps end before the next arrival and complete nothing.
    assert result.engines[0].steps_coalesced > 0.5 * steps
    plain = simulator.simulate(lone, reference=True)
    assert plain.engines[0].steps_coalesced == 0
    _assert_same(result, plain)
    pd = {
        **lone,
        "cluster": {
            "num_instances": 4,
            "pd": {"prefill_instances": 2, "decode_instances": 2, "decider": "always"},
        },
        "workload": {**lone["workload"], "rate": 20, "num_requests": 60},
    }
    result = simulator.simulate(pd)
    assert sum(e.steps_coalesced for e in result.engines) > 0
    plain = simulator.simulate(pd, reference=True)
    _assert_same(result, plain)


@pytest.mark.parametrize(
    "event",
    [
        {"at_s": 3, "action": "drain_instance", "target": "instance_1", "drain_policy": "redirect"},
        {"at_s": 3, "action": "fail_instance", "target": "instance_0"},
    ],
    ids=["redirect", "retried-failure"],
)
def test_rerouted_requests_are_identical_with_and_without_speedups(event):
    """Re-routes are when a request's private content comes back: to the prefix-affinity
    scorer that recorded it by count (it is stored first) and, after its KV blocks were
    released short of completion, to a router and other caches. Whole runs must not differ.
    (The index a re-routed request was counted in belongs to an instance that left the
    candidates, so a wrong hand-over would not show here; the scorer's property test in
    tests/cluster/test_routing.py catches that.)"""
    scenario = {
        "seed": 5,
        "deployments": [{"name": "d", "num_instances": 3}],
        "engine": {"total_kv_blocks": 3000, "max_num_running_reqs": 4},
        "instance_lifecycle": {"retry_on_failure": True},
        "events": [event],
        "cluster": {"routing": {"policy": "weighted"}},
        "workload": {
            "version": "2",
            "aggregate_rate": 120,
            "num_requests": 600,
            "clients": [
                {
                    "id": "c",
                    "rate_fraction": 1,
                    "arrival": {"process": "poisson"},
                    "prefix_group": "sys",
                    "prefix_length": 64,
                    "input_distribution": {"type": "constant", "params": {"value": 300}},
                    "output_distribution": {"type": "constant", "params": {"value": 100}},
                }
            ],
        },
    }
    runs = {}
    for enabled in (True, False):
        runs[enabled] = simulator.simulate(scenario, reference=not enabled)
    moved = runs[True].fleet_metrics
    assert moved["redirected_requests"] + moved["retried_requests"] > 0
    _assert_same(runs[True], runs[False])
