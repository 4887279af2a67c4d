"""Cluster laws on random small clusters, and behaviour that shows the policies matter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.engine.request import RequestState

POLICIES = [
    ("round-robin", None),
    ("least-loaded", None),
    ("always-busiest", None),
    ("weighted", None),
    ("weighted", "queue-depth:1,load-balance:2"),
    ("weighted", "precise-prefix-cache:2,kv-utilization:1"),
]


def _workload(n_requests: int, rate: float, timeout_us: int = 0, groups: int = 2) -> dict:
    client = {
        "rate_fraction": 1,
        "arrival": {"process": "gamma", "cv": 2.0},
        "input_distribution": {
            "type": "gaussian",
            "params": {"mean": 200, "std_dev": 120, "min": 1, "max": 700},
        },
        "output_distribution": {"type": "exponential", "params": {"mean": 40}},
    }
    if timeout_us:
        client["timeout"] = timeout_us
    clients = [
        {**client, "id": f"c{g}", "prefix_group": f"g{g}", "prefix_length": 64}
        for g in range(groups)
    ]
    return {"version": "2", "aggregate_rate": rate, "num_requests": n_requests, "clients": clients}


@st.composite
def clusters(draw):
    policy, scorers = draw(st.sampled_from(POLICIES))
    admission = draw(
        st.sampled_from(["always-admit", "always-admit", "token-bucket", "reject-all"])
    )
    return {
        "seed": draw(st.integers(0, 1000)),
        "horizon_us": draw(st.sampled_from([None, None, 2_000_000])),
        "workload": _workload(
            draw(st.integers(1, 40)),
            draw(st.sampled_from([5.0, 40.0, 200.0])),
            draw(st.sampled_from([0, 0, 300_000])),
        ),
        "engine": {
            "total_kv_blocks": draw(st.integers(40, 400)),
            "max_num_scheduled_tokens": draw(st.sampled_from([256, 2048])),
        },
        "cluster": {
            "num_instances": draw(st.integers(1, 4)),
            "admission": {
                "policy": admission,
                "latency_us": draw(st.sampled_from([0, 500])),
                "token_bucket_capacity": 2000,
                "token_bucket_refill_rate": 3000,
            },
            "routing": {
                "policy": policy,
                "scorers": scorers,
                "latency_us": draw(st.sampled_from([0, 0, 1000])),
                "snapshot_refresh_interval_us": draw(st.sampled_from([0, 0, 50_000])),
            },
        },
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_cluster_conservation_and_in_flight(scenario):
    result = simulator.simulate(scenario)
    records = result.request_records
    s = result.summary
    rejected = sum(r.state is RequestState.REJECTED for r in records)
    assert rejected == result.admission_rejections + result.routing_rejections
    # num_requests (arrived) = injected + rejected
    assert len(records) == s["injected_requests"] + rejected
    # per instance: injected = completed + queued + running + dropped + timed out
    for per in result.instance_summaries:
        total = sum(
            per[k]
            for k in (
                "completed_requests",
                "still_queued",
                "still_running",
                "dropped_unservable",
                "timed_out_requests",
            )
        )
        assert per["injected_requests"] == total
        mine = [r for r in records if r.instance_id == per["instance_id"]]
        assert per["injected_requests"] == len(mine)
    if result.instance_summaries:
        assert sum(p["injected_requests"] for p in result.instance_summaries) == s[
            "injected_requests"
        ] - sum(r.state is RequestState.CREATED and not r.instance_id for r in records)
    # in-flight counts return to zero once every routed request is finished
    unfinished = [
        sum(1 for r in records if r.instance_id == iid and not r.is_finished)
        for iid in result.instance_ids
    ]
    assert result.in_flight_at_end == unfinished
    if scenario["horizon_us"] is None:
        assert result.in_flight_at_end == [0] * len(result.instance_ids)
    assert sum(result.routed) == s["injected_requests"] - sum(
        1 for r in records if r.state is RequestState.CREATED and not r.instance_id
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_cluster_runs_are_deterministic(scenario):
    a = simulator.simulate(scenario)
    b = simulator.simulate(scenario)
    assert a.report_text() == b.report_text()
    assert [r.instance_id for r in a.request_records] == [r.instance_id for r in b.request_records]


def test_round_robin_spreads_evenly():
    result = simulator.simulate({"workload": _workload(1003, 50), "cluster": {"num_instances": 4}})
    assert max(result.routed) - min(result.routed) <= 1
    assert sum(result.routed) == 1003


def test_least_loaded_never_picks_a_strictly_busier_instance_from_fresh_signals():
    result = simulator.simulate(
        {
            "workload": _workload(600, 150),
            "cluster": {
                "num_instances": 4,
                "routing": {"policy": "least-loaded"},
                "trace": {"level": "decisions", "counterfactual_k": 4},
            },
        }
    )
    routings = result.decisions.routings
    assert len(routings) == 600
    busy_choices = 0
    for record in routings:
        loads = {c["instance_id"]: c["effective_load"] for c in record["candidates"]}
        assert loads[record["chosen"]] == min(loads.values())
        busy_choices += min(loads.values()) > 0
    assert busy_choices > 100  # the law was exercised under real contention


def test_fresh_snapshots_carry_the_in_flight_count():
    """docs/behaviour.md §6.4-6.5: InFlightRequests (routed, not yet finished) is always
    synchronous, also with immediate snapshots, so it counts at least every request the instance
    holds."""
    result = simulator.simulate(
        {
            "workload": _workload(400, 150),
            "cluster": {
                "num_instances": 3,
                "routing": {"policy": "least-loaded"},
                "trace": {"level": "decisions", "counterfactual_k": 3},
            },
        }
    )
    held_somewhere = 0
    for record in result.decisions.routings:
        for c in record["candidates"]:
            held = c["queue_depth"] + c["batch_size"]
            assert c["in_flight"] >= held
            assert c["effective_load"] == held + c["in_flight"]
            held_somewhere += held > 0
    assert held_somewhere > 100  # the law was exercised with requests on the instances


def _prefix_heavy(policy: str, scorers: str | None):
    clients = [
        {
            "id": f"g{i}",
            "rate_fraction": 1,
            "prefix_group": f"doc{i}",
            "prefix_length": 2048,
            "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 64}},
            "output_distribution": {"type": "constant", "params": {"value": 32}},
        }
        for i in range(8)
    ]
    return simulator.simulate(
        {
            "workload": {
                "version": "2",
                "aggregate_rate": 40,
                "num_requests": 800,
                "clients": clients,
            },
            # 600 blocks per instance: two 128-block prefixes fit, all eight do not.
            "engine": {"total_kv_blocks": 600},
            "cluster": {"num_instances": 4, "routing": {"policy": policy, "scorers": scorers}},
        }
    )


def test_prefix_affinity_beats_round_robin_on_shared_prefixes():
    rr = _prefix_heavy("round-robin", None)
    pa = _prefix_heavy("weighted", "prefix-affinity:3,queue-depth:2,kv-utilization:2")
    assert pa.kv_metrics["cache_hit_rate"] > rr.kv_metrics["cache_hit_rate"] + 0.2
    assert pa.summary["ttft_mean_ms"] < 0.6 * rr.summary["ttft_mean_ms"]


def test_pooled_hit_rate_counts_blocks_and_blis_rate_averages_instances():
    """Every request goes to one instance (always-busiest), so adding idle instances changes
    no request: the pooled rate (hits / lookups over all instances) stays put, while BLIS's
    unweighted mean of per-instance rates is the busy instance's rate divided by n."""
    rates = {}
    for n in (1, 2, 4):
        result = simulator.simulate(
            Path(__file__).parents[2] / "scenarios" / "rag_shared_prefix.yaml",
            workload__num_requests=120,
            cluster__num_instances=n,
            cluster__routing__policy="always-busiest",
        )
        rates[n] = result.kv_metrics
        assert list(result.instances["routed"]).count(0) == n - 1
    busy = rates[1]["cache_hit_rate"]
    assert busy > 0.3
    for n in (1, 2, 4):
        assert rates[n]["pooled_cache_hit_rate"] == pytest.approx(busy)
        assert rates[n]["cache_hit_rate"] == pytest.approx(busy / n)


def _least_loaded(interval_us: int, seed: int):
    workload = {
        "version": "2",
        "aggregate_rate": 120,
        "num_requests": 2500,
        "clients": [
            {
                "id": "c",
                "rate_fraction": 1,
                "arrival": {"process": "gamma", "cv": 3},
                "input_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 800, "std_dev": 400, "min": 10, "max": 3000},
                },
                "output_distribution": {"type": "exponential", "params": {"mean": 150}},
            }
        ],
    }
    return simulator.simulate(
        {
            "seed": seed,
            "workload": workload,
            # The load is sized for roofline's step times (physics' are slower: the same rate
            # would saturate every instance and leave nothing for routing to decide).
            "latency": {"model": "roofline"},
            "cluster": {
                "num_instances": 4,
                "trace": {"level": "decisions"},
                "routing": {"policy": "least-loaded", "snapshot_refresh_interval_us": interval_us},
            },
        }
    )


def test_stale_snapshots_make_least_loaded_herd():
    fresh = [_least_loaded(0, seed) for seed in (1, 2)]
    stale = [_least_loaded(500_000, seed) for seed in (1, 2)]

    def repeat_rate(result) -> float:
        chosen = np.array([d["chosen"] for d in result.decisions.routings])
        return float(np.mean(chosen[1:] == chosen[:-1]))

    # Herding: with stale queue signals consecutive requests pile onto the same instance...
    assert np.mean([repeat_rate(r) for r in stale]) > 1.3 * np.mean([repeat_rate(r) for r in fresh])
    # ... and the tail suffers.
    p99 = lambda runs: np.mean([r.summary["ttft_p99_ms"] for r in runs])  # noqa: E731
    assert p99(stale) > 1.15 * p99(fresh)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--routing-policy", "fastest"], "unknown routing policy 'fastest'; valid:"),
        (["--routing-policy", "weighted", "--routing-scorers", "magic:1"], "magic"),
        (["--routing-policy", "weighted", "--routing-scorers", "queue-depth"], "queue-depth"),
        (["--routing-policy", "weighted", "--routing-scorers", "queue-depth:0"], "queue-depth:0"),
        (["--routing-policy", "weighted", "--routing-scorers", "queue-depth:-2"], "queue-depth:-2"),
        (["--admission-policy", "token-bucket"], "token_bucket_capacity"),
        (["--admission-policy", "bouncer"], "unknown admission policy 'bouncer'; valid:"),
        (["--num-instances", "0"], "cluster.num_instances"),
        (["--fitness-weights", "speed:1"], "speed"),
        (["--trace-level", "everything"], "cluster.trace.level"),
    ],
)
def test_bad_cluster_flags_exit_2_with_one_line(args, needle, tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    out = tmp_path / "out.json"
    res = CliRunner().invoke(app, ["run", "--num-requests", "5", *args, "--results-path", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert "Traceback" not in res.output and not out.exists()


def test_decision_trace_file_and_frames(tmp_path):
    path = tmp_path / "decisions.jsonl"
    result = simulator.simulate(
        {
            "workload": _workload(50, 20),
            "cluster": {
                "num_instances": 3,
                "routing": {"policy": "least-loaded"},
                "trace": {"level": "decisions", "counterfactual_k": 2, "path": str(path)},
            },
        }
    )
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(d["kind"] == "routing" for d in lines) == 50
    assert sum(d["kind"] == "admission" for d in lines) == 50
    frame = result.decisions.routings_frame()
    assert len(frame) == 50
    assert set(result.instances.instance_id) == {"instance_0", "instance_1", "instance_2"}
    assert result.instances.routed.sum() == 50
