"""QA round 9, the changing fleet (docs/infrastructure.md): an autoscaler orders and releases
nodes only in the pools its deployment places on; a request waiting at the router for a
routable instance leaves at its client deadline, timed out; nothing is recorded after the run
has ended; a drain or failure of an instance already gone leaves a timeline row; and a
closed-loop session's next round, not yet arrived, keeps the run going for the fleet."""

from __future__ import annotations

from collections import Counter

import simulator
from simulator.engine.request import RequestState
from tests.cluster.test_infrastructure import (
    assert_conserved,
    assert_legal_timeline,
    run_checked,
)

US = 1_000_000
LLAMA = "meta-llama/llama-3.1-8b-instruct"
QWEN = "qwen/qwen3-14b"


def _const(value: int) -> dict:
    return {"type": "constant", "params": {"value": value}}


def _client(cid: str, **extra) -> dict:
    return {
        "id": cid,
        "rate_fraction": extra.pop("rate_fraction", 1),
        "arrival": {"process": "poisson"},
        "input_distribution": _const(extra.pop("prompt", 512)),
        "output_distribution": _const(extra.pop("output", 64)),
        **extra,
    }


# ---------------------------------------------------------------- 1. pools an autoscaler manages
def _two_pools(autoscaled: bool) -> dict:
    """Pool `a` serves llama (no autoscaler), pool `b` qwen (autoscaled). instance_0 (llama, on
    a-0) is drained at 10 s and an add_instance for llama comes at 20 s."""
    scenario = {
        "name": "xpool",
        "seed": 11,
        "node_pools": [
            {
                "name": "a",
                "gpu_type": "H100",
                "gpus_per_node": 1,
                "initial_nodes": 1,
                "max_nodes": 1,
                "provisioning_delay": {"mean_s": 30},
                "cost_per_hour": 10,
            },
            {
                "name": "b",
                "gpu_type": "H100",
                "gpus_per_node": 2,
                "initial_nodes": 1,
                "max_nodes": 3,
                "provisioning_delay": {"mean_s": 10},
                "cost_per_hour": 20,
            },
        ],
        "deployments": [
            {"name": "llama", "model": LLAMA, "num_instances": 1, "pool": "a"},
            {"name": "qwen", "model": QWEN, "num_instances": 1, "pool": "b"},
        ],
        "instance_lifecycle": {
            "initial_instances_loaded": True,
            "loading_delay": {"mean_s": 5},
            "drain_policy": "redirect",
        },
        "events": [
            {"at_s": 10, "action": "drain_instance", "target": "instance_0"},
            {"at_s": 20, "action": "add_instance", "deployment": "llama"},
        ],
        "workload": {
            "version": "2",
            "seed": 11,
            "aggregate_rate": 6,
            "num_requests": 400,
            "clients": [
                _client("l", model=LLAMA, rate_fraction=0.5),
                _client("q", model=QWEN, rate_fraction=0.5),
            ],
        },
    }
    if autoscaled:
        scenario["autoscaler"] = [
            {
                "deployment": "qwen",
                "signal": "in_flight",
                "scale_up_threshold": 50,
                "scale_down_threshold": 0,
                "min_instances": 1,
                "max_instances": 2,
                "interval_s": 5,
            }
        ]
    return scenario


def _pool_a_rows(result) -> list[tuple]:
    tl = result.timeline
    mine = tl[tl.id.str.startswith("a-") | tl.id.isin(["instance_0", "instance_1"])]
    return [tuple(r) for r in mine[["time_us", "id", "from_state", "to_state", "reason"]].values]


def test_an_autoscaler_leaves_the_pools_its_deployment_does_not_place_on_alone():
    scaled = run_checked(_two_pools(autoscaled=True))
    plain = run_checked(_two_pools(autoscaled=False))
    for result in (scaled, plain):
        assert_conserved(result)
        assert_legal_timeline(result)
    # Pool a's story is the same with qwen's autoscaler as without it: a-0 stays up once
    # instance_0 has drained (10 s) and takes instance_1 at 20 s; nothing is ordered there.
    assert _pool_a_rows(scaled) == _pool_a_rows(plain)
    tl = scaled.timeline
    placed = tl[(tl.id == "instance_1") & (tl.to_state == "loading")]
    assert list(placed.time_us) == [20 * US] and list(placed.reason) == ["placed on a-0"]
    a_nodes = tl[(tl.kind == "node") & tl.id.str.startswith("a-")]
    assert set(a_nodes.id) == {"a-0"} and "terminated" not in set(a_nodes.to_state)
    # Law: every node the fleet ordered or released on its own is of a pool qwen places on.
    own = tl[(tl.kind == "node") & tl.reason.isin(["scale-up", "scale-down: idle node"])]
    assert all(node_id.startswith("b-") for node_id in own.id)
    assert scaled.fleet_metrics["nodes_created"] == plain.fleet_metrics["nodes_created"] == 2


# ---------------------------------------------------------------- 2. parked requests' deadlines
LOAD_S = 10
TIMEOUT_US = 1_000_000


def _parked(autoscaler: bool = True) -> dict:
    """One instance loading for 10 s while 150 requests with a 1 s client deadline arrive at
    10 req/s: no instance is routable before 10 s."""
    scenario = {
        "name": "park-timeout",
        "seed": 1,
        "model": LLAMA,
        "deployments": [{"name": "llama", "num_instances": 1}],
        "instance_lifecycle": {"loading_delay": {"mean_s": LOAD_S}},
        "workload": {
            "version": "2",
            "seed": 1,
            "aggregate_rate": 10,
            "num_requests": 150,
            "clients": [_client("a", timeout=TIMEOUT_US, prompt=256, output=32)],
        },
    }
    if autoscaler:
        scenario["autoscaler"] = [
            {
                "deployment": "llama",
                "signal": "in_flight",
                "scale_up_threshold": 30,
                "scale_down_threshold": 1,
                "min_instances": 1,
                "max_instances": 4,
                "interval_s": 2,
                "scrape_delay_s": 0,
            }
        ]
    return scenario


def test_a_parked_request_leaves_at_its_deadline_timed_out_and_unrouted():
    result = run_checked(_parked())
    assert_conserved(result)
    assert_legal_timeline(result)
    records = result.request_records
    loaded_us = LOAD_S * US
    at_router = [r for r in records if r.deadline_us < loaded_us]
    routed = [r for r in records if r.deadline_us >= loaded_us]
    assert at_router and routed and len(at_router) + len(routed) == 150
    for r in at_router:
        # Cancelled by its client at the deadline, never routed nor enqueued.
        assert r.state is RequestState.TIMED_OUT, r
        assert r.completion_us == r.deadline_us == r.arrival_us + TIMEOUT_US, r
        assert r.instance_id == "" and r.enqueue_us == -1, r
    for r in routed:  # still waiting at 10 s: routed when instance_0 became routable
        assert r.instance_id == "instance_0", r
    states = Counter(r.state for r in records)
    assert result.summary["timed_out_requests"] == states[RequestState.TIMED_OUT]
    assert result.summary["timed_out_requests"] >= len(at_router)
    assert result.summary["still_queued"] == 0 and result.parked_at_end == 0


def test_the_in_flight_signal_counts_only_requests_still_waiting_for_their_client():
    """Hand computation: with nothing routable, the signal is the number of parked requests.
    A tick at t (routing priority) runs before arrivals at t and before deadlines at t
    (client-timeout priority), so it sees the requests that arrived in [t − 1 s, t)."""
    result = run_checked(_parked())
    arrivals = [r.arrival_us for r in result.request_records]
    (scaler,) = result.infrastructure.autoscalers
    before_routable = [s for s in scaler.samples if s[0] < LOAD_S * US]
    assert [s[0] for s in before_routable] == [2 * US, 4 * US, 6 * US, 8 * US]
    for t_us, value, live in before_routable:
        expected = sum(t_us - TIMEOUT_US <= a < t_us for a in arrivals)
        assert value == expected and live == 1, (t_us, value, expected)
        assert value <= 30  # so the scaler never reads demand that has given up
    assert scaler.scale_ups == 0
    assert result.fleet_metrics["autoscaler_llama_scale_ups"] == 0


# ---------------------------------------------------------------- 3. nothing after the run's end
def _late_node() -> dict:
    """A node ordered at 65 s comes up 30 s later; the traffic ends at 70 s and the last
    request before 95 s."""
    return {
        "name": "as0",
        "seed": 3,
        "model": LLAMA,
        "node_pools": [
            {
                "name": "h100",
                "gpu_type": "H100",
                "gpus_per_node": 2,
                "initial_nodes": 1,
                "min_nodes": 1,
                "max_nodes": 2,
                "provisioning_delay": {"mean_s": 30},
                "cost_per_hour": 24.0,
            }
        ],
        "deployments": [{"name": "llama", "num_instances": 1, "pool": "h100"}],
        "instance_lifecycle": {
            "loading_delay": {"mean_s": 5},
            "warm_up_request_count": 4,
            "warm_up_ttft_factor": 3.0,
            "drain_policy": "wait",
            "initial_instances_loaded": True,
        },
        "autoscaler": [
            {
                "deployment": "llama",
                "signal": "in_flight",
                "scale_up_threshold": 3,
                "scale_down_threshold": 2,
                "min_instances": 1,
                "max_instances": 4,
                "interval_s": 2,
                "scrape_delay_s": 1,
                "scale_up_stabilization_s": 0,
                "scale_down_stabilization_s": 0,
            }
        ],
        "workload": {
            "version": "2",
            "seed": 3,
            "aggregate_rate": 20,
            "horizon": 200_000_000,
            "clients": [
                {
                    "id": "a",
                    "arrival": {"process": "poisson"},
                    "rate_fraction": 1,
                    "lifecycle": {
                        "windows": [
                            {"start_us": 0, "end_us": 8_000_000},
                            {"start_us": 60_000_000, "end_us": 70_000_000},
                        ]
                    },
                    "input_distribution": {
                        "type": "gaussian",
                        "params": {"mean": 1024, "std_dev": 256, "min": 64, "max": 4096},
                    },
                    "output_distribution": {
                        "type": "gaussian",
                        "params": {"mean": 192, "std_dev": 64, "min": 8, "max": 512},
                    },
                }
            ],
        },
    }


def test_the_fleet_records_nothing_after_the_run_has_ended():
    result = run_checked(_late_node())
    assert_conserved(result)
    assert_legal_timeline(result)
    end_us = round(result.summary["vllm_estimated_duration_s"] * US)
    last_finish_us = max(r.completion_us for r in result.request_records)
    assert end_us <= 95 * US and last_finish_us <= 95 * US  # the node is due after the end
    tl = result.timeline
    ordered = tl[(tl.kind == "node") & (tl.reason == "scale-up")]
    late = ordered[ordered.time_us + 30 * US > end_us]
    assert len(late) >= 1  # the situation under test: a node due after the run's end
    assert tl.time_us.max() <= end_us
    fleet = result.fleet_instances
    assert (fleet.placed_s.dropna() * US <= end_us).all()
    assert (fleet.routable_s.dropna() * US <= end_us).all()
    # final_state is the state at the end: the last row of each instance on the timeline.
    last = tl[tl.kind == "instance"].groupby("id").to_state.last()
    for row in fleet.itertuples():
        assert row.final_state == last[row.instance_id], row
    for node_id in late.id:
        assert result.infrastructure.node(node_id).state.value == "provisioning"


# ---------------------------------------------------------------- 4. events on a gone instance
def test_failing_or_draining_an_instance_already_gone_leaves_a_timeline_row():
    scenario = {
        "name": "gone",
        "seed": 12,
        "model": LLAMA,
        "instance_lifecycle": {"initial_instances_loaded": True, "drain_policy": "redirect"},
        "deployments": [{"name": "llama", "num_instances": 2}],
        "events": [
            {"at_s": 2, "action": "fail_instance", "target": "instance_1"},
            {"at_s": 3, "action": "fail_instance", "target": "instance_1"},
            {"at_s": 4, "action": "drain_instance", "target": "instance_1"},
        ],
        "workload": {
            "version": "2",
            "seed": 12,
            "aggregate_rate": 10,
            "num_requests": 60,
            "clients": [_client("a")],
        },
    }
    result = run_checked(scenario)
    assert_conserved(result)
    assert_legal_timeline(result)
    tl = result.timeline
    notes = tl[(tl.kind == "event") & (tl.id == "instance_1")]
    assert list(notes.time_us) == [3 * US, 4 * US]
    assert list(notes.reason) == [
        "event fail_instance at 3 s: already terminated",
        "event drain_instance at 4 s: already terminated",
    ]
    moves = tl[(tl.kind == "instance") & (tl.id == "instance_1")]
    assert list(moves.to_state).count("terminated") == 1


# ---------------------------------------------------------------- sessions: the run is not over
def test_a_session_round_still_to_come_keeps_the_fleet_running():
    """A closed-loop session of 10 rounds, 10 s of think time between rounds (the workload
    makes one: its first request, 4.2 s, then a round about every 10.3 s): between rounds
    nothing is in flight and the stream of first rounds is exhausted, yet the run is
    not over. The add_instance at 60 s is applied (it was counted as after the end), and the
    autoscaler keeps ticking to the last round."""
    scenario = {
        "name": "sess-as",
        "seed": 5,
        "model": LLAMA,
        "deployments": [{"name": "llama", "num_instances": 1}],
        "instance_lifecycle": {"initial_instances_loaded": True, "loading_delay": {"mean_s": 1}},
        "autoscaler": [
            {
                "deployment": "llama",
                "signal": "in_flight",
                "scale_up_threshold": 0.5,
                "scale_down_threshold": 0,
                "min_instances": 1,
                "max_instances": 3,
                "interval_s": 1,
                "scrape_delay_s": 0,
            }
        ],
        "events": [{"at_s": 60, "action": "add_instance", "deployment": "llama"}],
        "workload": {
            "version": "2",
            "seed": 5,
            "aggregate_rate": 1,
            "num_requests": 2,
            "clients": [
                _client(
                    "agent",
                    prompt=200,
                    output=50,
                    reasoning={
                        "reason_ratio_distribution": _const(0),
                        "multi_turn": {
                            "max_rounds": 10,
                            "think_time_us": 10_000_000,
                            "context_growth": "accumulate",
                        },
                    },
                )
            ],
        },
    }
    # simulate() (run_checked does not make sessions), with every invariant checked.
    result = simulator.simulate(scenario, warn_unsteady=False, check_invariants=True)
    assert_conserved(result)
    end_us = round(result.summary["vllm_estimated_duration_s"] * US)
    assert end_us > 90 * US  # ten rounds 10 s apart
    assert "events_after_end" not in result.fleet_metrics
    tl = result.timeline
    added = tl[tl.reason == "event add_instance at 60 s"]
    assert list(added.time_us) == [60 * US]
    (scaler,) = result.infrastructure.autoscalers
    # Ticks every second until the traffic is over: past 90 s, not stopped at a lull.
    assert scaler.samples[-1][0] >= 90 * US
    assert result.summary["completed_requests"] == 10
    assert result.session_counts["completed"] == result.session_counts["total"] == 1
