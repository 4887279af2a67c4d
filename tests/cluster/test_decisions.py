"""Decision trace (docs/behaviour.md §6.7): records, counterfactual top-k and regret, summary, JSONL
file."""

from __future__ import annotations

import json

import pytest

from simulator.cluster.decisions import DecisionTrace
from simulator.cluster.routing import RoutingDecision
from simulator.cluster.snapshot import InstanceSnapshot
from simulator.engine.request import Request
from simulator.errors import ConfigError


def snap(i: int, load: int, kv: float = 0.0) -> InstanceSnapshot:
    return InstanceSnapshot(f"instance_{i}", i, queue_depth=load, kv_utilization=kv)


def req(i: int) -> Request:
    return Request(f"request_{i}", 0, 10, 5)


def test_validation():
    with pytest.raises(ConfigError, match="trace level"):
        DecisionTrace("verbose")
    with pytest.raises(ConfigError, match="counterfactual"):
        DecisionTrace("decisions", -1)


def test_level_none_records_nothing():
    trace = DecisionTrace()
    trace.record_admission(req(0), 0, True, "ok")
    trace.record_routing(req(0), 0, RoutingDecision(0, "rr"), [snap(0, 1)])
    assert trace.admissions == [] and trace.routings == [] and trace.records() == []


def test_regret_without_policy_scores_uses_negative_load():
    trace = DecisionTrace("decisions", counterfactual_k=2)
    cands = [snap(0, 3), snap(1, 1), snap(2, 2)]
    trace.record_routing(req(0), 50, RoutingDecision(0, "round-robin[0]"), cands)
    rec = trace.routings[0]
    # scores -3, -1, -2: best is instance_1 (-1); the chosen instance_0 scores -3.
    assert [c["instance_id"] for c in rec["candidates"]] == ["instance_1", "instance_2"]
    assert [c["score"] for c in rec["candidates"]] == [-1.0, -2.0]
    assert rec["candidates"][0]["queue_depth"] == 1
    assert rec["candidates"][0]["effective_load"] == 1
    assert rec["regret"] == 2.0
    assert rec["chosen"] == "instance_0"
    assert rec["scores"] is None


def test_regret_with_policy_scores_and_id_tiebreak():
    trace = DecisionTrace("decisions", counterfactual_k=2)
    cands = [snap(0, 0), snap(1, 0), snap(2, 0)]
    scores = {"instance_0": 0.2, "instance_2": 0.7, "instance_1": 0.7}
    trace.record_routing(req(0), 0, RoutingDecision(2, "weighted", scores), cands)
    trace.record_routing(req(1), 0, RoutingDecision(0, "weighted", scores), cands)
    first, second = trace.routings
    assert [c["instance_id"] for c in first["candidates"]] == ["instance_1", "instance_2"]
    assert first["regret"] == 0.0  # chose a tied best
    assert second["regret"] == pytest.approx(0.5)
    s = trace.summary()
    assert s["mean_regret"] == pytest.approx(0.25)
    assert s["max_regret"] == pytest.approx(0.5)


def test_k_zero_keeps_no_candidates():
    trace = DecisionTrace("decisions")
    trace.record_routing(req(0), 0, RoutingDecision(1, "ll"), [snap(0, 0), snap(1, 5)])
    assert trace.routings[0]["candidates"] == []
    assert trace.routings[0]["regret"] == 0.0


def test_summary_and_text():
    trace = DecisionTrace("decisions", counterfactual_k=1)
    cands = [snap(0, 0), snap(1, 4), snap(10, 2)]
    for i, (ok, target) in enumerate([(True, 1), (False, None), (True, 10), (True, 1)]):
        trace.record_admission(req(i), i, ok, "r")
        if ok:
            trace.record_routing(req(i), i, RoutingDecision(target, "x"), cands)
    s = trace.summary()
    assert s["total_decisions"] == 4
    assert (s["admitted"], s["rejected"]) == (3, 1)
    assert s["routing_decisions"] == 3
    assert s["unique_targets"] == 2
    assert s["target_distribution"] == {"instance_1": 2, "instance_10": 1}
    # regrets: 4, 2, 4 (best is instance_0 at -0)
    assert s["mean_regret"] == pytest.approx(10 / 3)
    assert s["max_regret"] == 4.0
    assert trace.summary_text().splitlines() == [
        "=== Trace Summary ===",
        "Total Decisions: 4",
        "  Admitted: 3",
        "  Rejected: 1",
        "Unique Targets: 2",
        "Target Distribution:",
        "  instance_1: 2",
        "  instance_10: 1",
        "Mean Regret: 3.333333",
        "Max Regret: 4.000000",
    ]


def test_frames():
    trace = DecisionTrace("decisions", counterfactual_k=1)
    trace.record_admission(req(0), 1500, True, "always-admit")
    trace.record_routing(req(0), 2500, RoutingDecision(1, "x"), [snap(0, 0), snap(1, 1)])
    adm = trace.admissions_frame()
    assert list(adm.columns) == ["request_id", "clock_ms", "admitted", "reason"]
    assert adm.clock_ms.tolist() == [1.5]
    rt = trace.routings_frame()
    assert rt.loc[0, "chosen"] == "instance_1"
    assert rt.loc[0, "best"] == "instance_0"
    assert rt.loc[0, "regret"] == 1.0
    assert rt.loc[0, "clock_ms"] == 2.5


def test_write_jsonl_atomically(tmp_path):
    trace = DecisionTrace("decisions", counterfactual_k=1)
    trace.record_admission(req(0), 0, True, "ok")
    trace.record_routing(req(0), 0, RoutingDecision(0, "x", {"instance_0": 1.0}), [snap(0, 0)])
    trace.record_admission(req(1), 5, False, "no")
    trace.record_event("kv_transfer", req(0), 7, blocks=3)
    out = trace.write(tmp_path / "sub" / "decisions.jsonl")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["admission", "routing", "admission", "kv_transfer"]
    assert records[1]["scores"] == {"instance_0": 1.0}
    assert records[3]["blocks"] == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["decisions.jsonl"]


def test_a_disaggregated_requests_decode_choice_is_recorded():
    """PD 1P + 2D, every request disaggregated: each one has a routing record (its prefill
    instance) and a decode_routing record (the decode instance chosen at the same instant,
    the one its transfer goes to); the summary counts the decode targets apart. The decode
    choice was seen only as an index in the kv_transfer record, after the transfer."""
    import simulator

    result = simulator.simulate(
        {
            "cluster": {
                "num_instances": 3,
                "trace": {"level": "decisions"},
                "pd": {"prefill_instances": 1, "decode_instances": 2, "decider": "always"},
            },
            "workload": {"num_requests": 8, "rate": 5},
        }
    )
    records = result.decisions.records()
    routing = {r["request_id"]: r for r in records if r["kind"] == "routing"}
    decode = {r["request_id"]: r for r in records if r["kind"] == "decode_routing"}
    transfers = {r["request_id"]: r for r in records if r["kind"] == "kv_transfer"}
    assert len(routing) == len(decode) == len(transfers) == 8
    for rid, choice in decode.items():
        assert routing[rid]["chosen"] == "instance_0"  # the one prefill instance
        assert choice["clock_us"] == routing[rid]["clock_us"]
        assert choice["chosen"] == f"instance_{transfers[rid]['decode_index']}"
    summary = result.decisions.summary()
    assert summary["target_distribution"] == {"instance_0": 8}
    assert sum(summary["decode_target_distribution"].values()) == 8
    assert "Decode Target Distribution:" in result.decisions.summary_text()
