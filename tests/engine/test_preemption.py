"""Preemption policies (docs/engine.md "Preemption"): which running request is evicted.

Laws: `fcfs` evicts the batch's tail; `priority` evicts the running request with the largest
(vLLM priority, arrival time), ties to the one nearest the tail; a victim that already had its
tokens this step gives them back; KV blocks and requests are conserved either way. Parity:
BLIS-current's h6 run (tests/data/blis_head/README.md) picks the same victims, in order, until
the documented re-prefill difference (docs/behaviour.md A2) moves the timelines apart.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.engine.batching import EngineConfig, VLLMEngine
from simulator.engine.preemption import (
    PREEMPTION_POLICIES,
    LeastUrgentFirst,
    NewestFirst,
    make_preemption_policy,
    vllm_priorities,
    vllm_priority,
)
from simulator.engine.request import Request, RequestState
from simulator.errors import ConfigError

DATA = Path(__file__).resolve().parent.parent / "data" / "blis_head"
CLASSES = ["critical", "standard", "batch", "sheddable", "background", "", "gold"]


def test_vllm_priorities_by_hand():
    # BLIS class priorities critical 4, standard 3, batch -1, sheddable -2, background -3;
    # max(3, 4, 3, -1, -2, -3) = 4, so vLLM priority = 4 - class priority.
    assert [vllm_priority(c) for c in CLASSES] == [0, 1, 5, 6, 7, 1, 1]


def test_class_priorities_a_scenario_sets_by_hand():
    """engine.slo_priorities (BLIS-current's admission.slo_priorities) replaces class
    priorities; the inversion's maximum is over the resulting table. batch 10: max(3, 4, 3,
    10, -2, -3) = 10, so critical 6, standard 7, batch 0, sheddable 12, background 13, and a
    request without a class (or of an unknown one) counts as standard, 7."""
    table = vllm_priorities({"batch": 10})
    assert [vllm_priority(c, table) for c in CLASSES] == [6, 7, 0, 12, 13, 7, 7]
    assert vllm_priorities({}) == vllm_priorities(None) == vllm_priorities()
    # Lowered below the default, the maximum stays max(3, ...): critical -100 -> 3 + 100.
    assert vllm_priority("critical", vllm_priorities({"critical": -100})) == 103
    victim = make_preemption_policy("priority", {"batch": 10, "critical": -5})
    running = _running([("batch", 0), ("critical", 0), ("standard", 0)])
    assert victim.victim_index(running) == 1  # critical is now the least urgent
    assert make_preemption_policy("priority").victim_index(running) == 0  # batch by default


def test_policies_are_registered_by_name_and_unknown_names_are_refused():
    assert set(PREEMPTION_POLICIES) == {"fcfs", "priority"}
    with pytest.raises(ConfigError, match="preemption policy.*'lifo'"):
        make_preemption_policy("lifo")


running_lists = st.lists(
    st.tuples(st.sampled_from(CLASSES), st.integers(0, 5)), min_size=1, max_size=12
)


def _running(spec) -> list[Request]:
    return [
        Request(f"r{i}", arrival, 10, 10, slo_class=cls) for i, (cls, arrival) in enumerate(spec)
    ]


@settings(max_examples=300, deadline=None)
@given(running_lists)
def test_priority_victim_is_the_least_urgent_latest_arrival_nearest_the_tail(spec):
    running = _running(spec)
    index = LeastUrgentFirst().victim_index(running)
    keys = [(vllm_priority(r.slo_class), r.arrival_us) for r in running]
    assert keys[index] == max(keys)
    assert all(k < keys[index] for k in keys[index + 1 :])  # no equal key nearer the tail
    assert NewestFirst().victim_index(running) == len(running) - 1


def _three(policy: str) -> tuple[VLLMEngine, list[Request]]:
    """Three 32-token prompts decoding 60 tokens in a 10-block cache: a `batch` request
    admitted first, then two `critical` ones."""
    eng = VLLMEngine(EngineConfig(total_kv_blocks=10, block_size=16, preemption_policy=policy))
    reqs = [
        Request("a", 0, 32, 60, slo_class="batch"),
        Request("b", 0, 32, 60, slo_class="critical"),
        Request("c", 0, 32, 60, slo_class="critical"),
    ]
    for r in reqs:
        eng.enqueue(r, 0)
    return eng, reqs


def _steps(eng: VLLMEngine, count: int, now: int = 0) -> int:
    for _ in range(count):
        if eng.plan_step(now) is None:
            break
        eng.finish_step(10)
        now += 10
        eng.check_invariants()
    return now


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_victim_each_policy_chooses_when_the_cache_runs_out(policy):
    eng, (a, b, c) = _three(policy)
    # Step 1 prefills 2 blocks each (6 used); step s >= 2 decodes position 30 + s, so all
    # three take a 3rd block at position 32 (step 2: 9 used) and a 4th at 48 (step 18).
    now = _steps(eng, 17)
    assert eng.kv.used_blocks == 9 and eng.preemption_count == 0
    batch = eng.plan_step(now)
    # Step 18: a takes the 10th block; b finds none.
    assert eng.preemption_count == 1
    if policy == "fcfs":
        # The tail, c, goes: its 3 blocks free, b and then nobody else needs one: 10 - 3 + 1.
        assert eng.running == [a, b] and list(eng.waiting) == [c]
        assert eng.kv.used_blocks == 8
        victim = c
    else:
        # a is the least urgent (batch: vLLM priority 5 vs 0). It sits before the cursor and
        # already had its token: that token goes back, and a's 4 blocks free: 10 - 4 + b + c.
        assert eng.running == [b, c] and list(eng.waiting) == [a]
        assert eng.kv.used_blocks == 8
        victim = a
    assert batch.decode_count == 2 and batch.prefill_chunks == []
    assert victim.state is RequestState.QUEUED and victim.block_ids == []
    assert victim.num_new_tokens == 0
    assert victim.generated_tokens == 17 and victim.prefill_target == 32 + 17
    eng.finish_step(10)
    eng.check_invariants()
    # Conservation: drained to the end, every request completes with exactly its tokens.
    now = _steps(eng, 400, now + 10)
    assert not eng.has_work
    assert all(r.state is RequestState.COMPLETED and r.generated_tokens == 60 for r in (a, b, c))
    assert eng.kv.used_blocks == sum(len(r.block_ids) for r in eng.running) == 0


def _blis_victims() -> list[tuple[int, str]]:
    lines = (DATA / "h6_priority_preemption.victims.txt").read_text().split("\n")
    return [(int(t), rid) for t, rid in (line.split() for line in lines if line)]


@pytest.fixture(scope="module")
def h6(monkeypatch_module):
    victims: list[tuple[int, str, str]] = []
    original = VLLMEngine._evict_for_recompute

    def record(engine, victim):
        victims.append((engine.clock_us, victim.request_id, victim.slo_class))
        original(engine, victim)

    monkeypatch_module.setattr(VLLMEngine, "_evict_for_recompute", record)
    result = simulator.replay(
        DATA / "h6_priority_preemption.trace.yaml",
        DATA / "h6_priority_preemption.trace.csv",
        model="meta-llama/llama-3.1-8b-instruct",
        hardware="H100",
        tp=1,
        latency__model="roofline",
        engine__total_kv_blocks=2000,
        engine__block_size_tokens=16,
        engine__max_num_running_reqs=256,
        engine__max_num_scheduled_tokens=2048,
        engine__preemption_policy="priority",
    )
    return result, victims


@pytest.fixture(scope="module")
def monkeypatch_module():
    patcher = pytest.MonkeyPatch()
    yield patcher
    patcher.undo()


def test_h6_victims_match_blis_current_until_the_first_readmission(h6):
    result, victims = h6
    blis = _blis_victims()
    assert victims[0][:2] == blis[0]  # tick 6,709,726 µs: request_175, to the microsecond
    assert [v[1] for v in victims[:10]] == [rid for _t, rid in blis[:10]]
    assert {cls for *_, cls in victims} == {"batch"}  # never a critical request
    assert result.summary["preemption_count"] == len(victims)
    assert len(victims) == pytest.approx(len(blis), rel=0.15)


def test_h6_requests_before_the_first_preemption_match_blis_to_the_microsecond(h6):
    """Until the first victim comes back, nothing differs: every request that completed before
    BLIS's first preemption has BLIS's exact TTFT and last-token time."""
    result, _victims = h6
    first_preemption_us = _blis_victims()[0][0]
    with open(DATA / "h6_priority_preemption.trace.csv", newline="") as handle:
        trace = {f"request_{row['request_id']}": row for row in csv.DictReader(handle)}
    compared = 0
    for req in result.request_records:
        row = trace[req.request_id]
        last_chunk_us = int(row["last_chunk_time_us"])
        if last_chunk_us >= first_preemption_us:
            continue
        compared += 1
        assert req.first_token_us == int(row["first_chunk_time_us"]), req.request_id
        assert req.last_token_us == last_chunk_us, req.request_id
    assert compared > 100


def test_scenario_and_cli_select_the_policy(tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    args = ["run", "--model", "meta-llama/llama-3.1-8b-instruct", "--num-requests", "5"]
    assert CliRunner().invoke(app, [*args, "--preemption-policy", "priority"]).exit_code == 0
    bad = CliRunner().invoke(app, [*args, "--preemption-policy", "lifo"])
    assert bad.exit_code == 2 and "preemption policy" in bad.output
    with pytest.raises(ConfigError, match="preemption policy"):
        simulator.simulate({"engine": {"preemption_policy": "lifo"}})


def test_class_priorities_change_the_victim_and_reach_the_engine_from_every_entry(tmp_path):
    """With `batch` made the most important class, `priority` preemption spares the batch
    request `_three` admitted first: the victim is the tail's critical request, as fcfs would
    choose (the two critical ones tie, and a tie goes to the tail). The class priorities come
    the same way from a scenario, Python keywords and a BLIS-current policy bundle."""
    from typer.testing import CliRunner

    from simulator.cli import app

    eng = VLLMEngine(
        EngineConfig(
            total_kv_blocks=10,
            block_size=16,
            preemption_policy="priority",
            slo_priorities={"batch": 10},
        )
    )
    a = Request("a", 0, 32, 60, slo_class="batch")
    b = Request("b", 0, 32, 60, slo_class="critical")
    c = Request("c", 0, 32, 60, slo_class="critical")
    for r in (a, b, c):
        eng.enqueue(r, 0)
    now = _steps(eng, 17)
    eng.plan_step(now)
    assert eng.preemption_count == 1 and list(eng.waiting) == [c]

    trace = ["--trace-header", str(DATA / "h6_priority_preemption.trace.yaml")]
    trace += ["--trace-data", str(DATA / "h6_priority_preemption.trace.csv")]
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("preemption: {policy: priority}\nadmission:\n  slo_priorities: {batch: 10}\n")
    common = ["--model", "meta-llama/llama-3.1-8b-instruct", "--latency-model", "roofline"]
    out = {}
    for name, extra in (
        ("bundle", ["--policy-config", str(bundle)]),
        ("default", ["--preemption-policy", "priority"]),
    ):
        path = tmp_path / f"{name}.json"
        res = CliRunner().invoke(app, ["replay", *trace, *common, *extra, "--results-path", path])
        assert res.exit_code == 0, res.output
        out[name] = path.read_text()
    assert out["bundle"] != out["default"]  # the h6 trace preempts, and batch is now spared
    python = simulator.replay(
        DATA / "h6_priority_preemption.trace.yaml",
        DATA / "h6_priority_preemption.trace.csv",
        model="meta-llama/llama-3.1-8b-instruct",
        latency__model="roofline",
        engine__preemption_policy="priority",
        engine__slo_priorities={"batch": 10},
    )
    assert json.loads(out["bundle"])["requests"] == python.results_document()["requests"]


def test_a_priority_scheduler_with_constant_priorities_says_it_keeps_arrival_order(caplog):
    """BLIS-current's `priority-fcfs` orders by SLO class; servesim's orders by the priority
    policy, whose default makes every request equal: the run says so once, and is quiet when
    a priority policy is chosen."""
    base = {"workload": {"num_requests": 3, "rate": 1}, "latency": {"model": "roofline"}}
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate({**base, "engine": {"scheduler": "priority-fcfs"}})
    said = [r.getMessage() for r in caplog.records if "keeps arrival order" in r.getMessage()]
    assert len(said) == 1 and "--priority-policy slo-class" in said[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="servesim"):
        engine = {"scheduler": "priority-fcfs", "priority_policy": "slo-class"}
        simulator.simulate({**base, "engine": engine})
    assert not [r for r in caplog.records if "keeps arrival order" in r.getMessage()]


def test_class_priorities_nothing_reads_are_said_to_change_nothing(caplog):
    """A BLIS-current bundle with only admission.slo_priorities: neither priority preemption
    nor the slo-class priority policy reads them, so the run says so."""
    base = {"workload": {"num_requests": 3, "rate": 1}, "latency": {"model": "roofline"}}
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate({**base, "engine": {"slo_priorities": {"batch": 5}}})
    assert any("changes nothing" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="servesim"):
        engine = {"slo_priorities": {"batch": 5}, "preemption_policy": "priority"}
        simulator.simulate({**base, "engine": engine})
    assert not any("changes nothing" in r.getMessage() for r in caplog.records)
