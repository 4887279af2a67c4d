"""Pathological scenarios: each one finishes (no livelock, bounded wall time) and every
request ends in a counted state, with the count the scenario forces.

The suite runs with invariant checks on (tests/conftest.py), so every run below is also
checked for conservation, KV blocks and causality while it runs.
"""

from __future__ import annotations

import pytest

import simulator
from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig
from simulator.engine.request import Request, RequestState
from simulator.latency.blackbox import BlackboxModel
from tests.fuzzing import finishes_within
from tests.specs import one_prefill_one_decode

# step = 1000 µs + 10 µs per prefill token + 5 µs per decode request: easy to reason about.
STEP_MODEL = BlackboxModel([0, 0, 0], [1000, 10.0, 5.0])
WALL_LIMIT_S = 60
TRACE_HEADER = (
    "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,streaming,"
    "input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,"
    "reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,"
    "first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,"
    "finish_reason\n"
)


def _states(records) -> dict[RequestState, int]:
    counts = dict.fromkeys(RequestState, 0)
    for r in records:
        counts[r.state] += 1
    return counts


def _run(requests, horizon_us=None, **engine):
    config = EngineConfig(**{"total_kv_blocks": 1000, "block_size": 16, **engine})
    with finishes_within(WALL_LIMIT_S):
        return run_simulation(requests, config, STEP_MODEL, horizon_us, None, True)


def test_prompts_longer_than_the_whole_kv_cache_are_dropped_and_counted():
    # 10 blocks of 16 tokens = 160 tokens of KV. Prompts of 161+ tokens can never fit.
    prompts = [50, 161, 100, 400, 160, 2000]
    requests = [Request(f"r{i}", i * 100, p, 5, index=i) for i, p in enumerate(prompts)]
    result = _run(requests, total_kv_blocks=10)
    too_long = {f"r{i}" for i, p in enumerate(prompts) if p > 160}
    dropped = {r.request_id for r in result.request_records if r.state is RequestState.DROPPED}
    assert dropped >= too_long
    assert result.summary["dropped_unservable"] == len(dropped)
    assert result.summary["completed_requests"] + len(dropped) == len(prompts)
    assert result.summary["still_queued"] == result.summary["still_running"] == 0


def test_preemption_storm_finishes_and_counts_every_request():
    """40 requests at once whose outputs outgrow a 60-block cache many times over: constant
    recompute preemption. The run must end, with every request completed or dropped (a
    request whose prompt plus output no longer fits the whole cache is unservable)."""
    requests = [Request(f"r{i}", 0, 200, 500, index=i) for i in range(40)]
    result = _run(requests, total_kv_blocks=60, max_num_running_reqs=40)
    s = result.summary
    assert s["preemption_count"] > 40  # a storm, not a ripple
    counts = _states(result.request_records)
    assert counts[RequestState.COMPLETED] + counts[RequestState.DROPPED] == 40
    assert s["completed_requests"] == counts[RequestState.COMPLETED] > 0
    assert s["dropped_unservable"] == counts[RequestState.DROPPED]
    for r in result.request_records:
        if r.state is RequestState.COMPLETED:
            assert r.generated_tokens == 500  # never a token twice, never one missing


def test_preemption_storm_with_output_outgrowing_the_cache_drops_instead_of_looping():
    # 20 blocks = 320 tokens: a request of 100 + 400 tokens can never hold all its KV, so
    # after its preemption its prompt + output exceeds the cache and it must be dropped.
    requests = [Request(f"r{i}", 0, 100, 400, index=i) for i in range(6)]
    result = _run(requests, total_kv_blocks=20)
    counts = _states(result.request_records)
    assert counts[RequestState.DROPPED] == result.summary["dropped_unservable"] > 0
    assert counts[RequestState.COMPLETED] + counts[RequestState.DROPPED] == 6


def test_zero_output_requests_complete_after_prefill_with_no_tokens():
    requests = [Request(f"r{i}", i * 500, 64 + i, 0, index=i) for i in range(10)]
    result = _run(requests)
    s = result.summary
    assert s["completed_requests"] == 10
    assert s["total_output_tokens"] == 0
    for r in result.request_records:
        assert r.generated_tokens == 0
        assert r.arrival_us <= r.first_schedule_us <= r.completion_us


def test_zero_output_requests_through_pd_complete():
    trace = "".join(f"{i},c0,,,,0,,false,100,0,0,0,0,0,0,,0,{i * 100},0,0,0,0,0,ok,,\n"
                    for i in range(5))  # fmt: skip
    result = _pd_replay(trace, decode_kv_blocks=None)
    assert result.summary["completed_requests"] == 5
    assert result.summary["total_output_tokens"] == 0
    for parent in result.request_records:
        # Nothing to decode: the request is done when its KV reaches the decode instance.
        assert parent.generated_tokens == 0
        assert parent.completion_us == parent.transfer_end_us


def test_all_requests_arriving_at_time_zero():
    requests = [Request(f"r{i}", 0, 128, 16, index=i) for i in range(300)]
    result = _run(requests, max_num_running_reqs=64)
    assert result.summary["completed_requests"] == 300
    steps = result.engines[0].steps
    assert steps.start_us[0] == 0
    assert max(steps.batch_size) == 64  # the batch cap holds under the burst


def test_horizon_cutting_a_step_in_the_middle():
    # One long prefill step: 1000 + 10*2000 = 21,000 µs, cut by a horizon at 10,000 µs.
    requests = [Request("long", 0, 2000, 10, index=0), Request("late", 5000, 32, 4, index=1)]
    result = _run(requests, horizon_us=10_000, max_num_scheduled_tokens=4096)
    s = result.summary
    assert s["completed_requests"] == 0
    assert s["injected_requests"] == 2
    assert s["still_running"] + s["still_queued"] == 2
    by_id = {r.request_id: r for r in result.request_records}
    assert by_id["long"].state is RequestState.RUNNING
    assert by_id["long"].first_token_us < 0  # its step had not ended by the horizon
    assert by_id["late"].state is RequestState.QUEUED


def test_requests_after_the_horizon_are_counted_as_not_arrived():
    requests = [Request(f"r{i}", i * 10_000, 32, 4, index=i) for i in range(10)]
    result = _run(requests, horizon_us=45_000)
    assert result.not_arrived + result.summary["injected_requests"] == 10
    assert result.not_arrived == 5


@pytest.mark.parametrize("policy", ["wait", "redirect", "immediate"])
def test_all_instances_draining_at_once(policy):
    """Every instance drains at 5 s. What they held ends by the policy (finished, or
    dropped_on_drain); requests arriving afterwards find nothing routable and wait at the
    router to the end of the run, counted as still queued. Nothing is lost."""
    events = [
        {"at_s": 5, "action": "drain_instance", "target": f"instance_{i}", "drain_policy": policy}
        for i in range(3)
    ]
    with finishes_within(WALL_LIMIT_S):
        result = simulator.simulate(
            {
                "cluster": {"num_instances": 3},
                "engine": {"max_num_running_reqs": 8},
                "events": events,
                "workload": {"rate": 30, "num_requests": 300},
            }
        )
    states = _states(result.request_records)
    arrived_late = sum(r.arrival_us > 5_000_000 for r in result.request_records)
    waiting = states[RequestState.CREATED]
    assert arrived_late > 0
    assert result.parked_at_end == waiting
    s = result.summary
    assert s["injected_requests"] == len(result.request_records) == 300
    if policy == "immediate":
        assert states[RequestState.DROPPED_ON_DRAIN] == s["dropped_on_drain"] > 0
        assert waiting == arrived_late
    else:
        # redirected requests come back to the router and wait with the late arrivals
        assert waiting >= arrived_late
        assert states[RequestState.COMPLETED] + waiting == 300
    assert all(t == "terminated" for t in result.fleet_instances.final_state)


def _pd_replay(trace_rows: str, decode_kv_blocks: int | None, horizon_us: int | None = None):
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    csv_path = folder / "trace.csv"
    csv_path.write_text(TRACE_HEADER + trace_rows)
    pd = {"prefill_instances": 1, "decode_instances": 1, "decider": "always"}
    if decode_kv_blocks is not None:
        pd["decode"] = {"total_kv_blocks": decode_kv_blocks}
    scenario = {
        "trace": {"data": str(csv_path)},
        "engine": {"total_kv_blocks": 500},
        "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1000, 10, 5]},
        "cluster": {"num_instances": 2, "pd": pd},
        "horizon_us": horizon_us,
    }
    with finishes_within(WALL_LIMIT_S):
        return simulator.simulate(scenario)


def test_horizon_during_a_pd_prefill_leaves_the_parent_running_and_counted():
    # Prefill of 2,000 tokens: 1000 + 10*2000 = 21,000 µs; the horizon cuts it at 10,000 µs.
    rows = "0,c0,,,,0,,false,2000,8,0,0,0,0,0,,0,0,0,0,0,0,0,ok,,\n"
    result = _pd_replay(rows, decode_kv_blocks=None, horizon_us=10_000)
    (parent,) = result.request_records
    assert parent.state is RequestState.RUNNING
    assert parent.enqueue_us == parent.first_schedule_us == 0  # its prefill's, not "never"
    assert result.summary["still_running"] == 1


def test_decode_pool_with_no_kv_room_drops_every_parent_and_counts_it():
    # Decode instances hold 4 blocks (64 tokens); every prompt is 600 tokens.
    rows = "".join(f"{i},c0,,,,0,,false,600,8,0,0,0,0,0,,0,0,{i * 1000},0,0,0,0,ok,,\n"
                   for i in range(8))  # fmt: skip
    result = _pd_replay(rows, decode_kv_blocks=4)
    assert result.pd_metrics["dropped_at_decode_kv"] == 8
    assert result.summary["dropped_unservable"] == 8
    assert result.summary["completed_requests"] == 0
    assert all(r.state is RequestState.DROPPED for r in result.request_records)
    assert result.in_flight_at_end == [0, 0]


def test_token_bucket_smaller_than_any_prompt_rejects_everything_and_counts_it():
    scenario = {
        "workload": {
            "num_requests": 50,
            "rate": 20,
            "prompt_tokens": {"distribution": "constant", "value": 500},
        },
        "cluster": {
            "num_instances": 2,
            "admission": {
                "policy": "token-bucket",
                "token_bucket_capacity": 100,  # less than one prompt: nothing ever fits
                "token_bucket_refill_rate": 1000,
            },
        },
    }
    with finishes_within(WALL_LIMIT_S):
        result = simulator.simulate(scenario)
    assert result.admission_rejections == 50
    assert all(r.state is RequestState.REJECTED for r in result.request_records)
    s = result.summary
    assert s["completed_requests"] == s["injected_requests"] == 0
    assert s["responses_per_sec"] == 0
    result.report_text()  # the report of an empty run renders (no division by zero)


# --- inputs that once hung the simulator -----------------------------------------------------


def test_decode_instance_whose_queued_transfers_hold_every_block_reclaims_them():
    """6 blocks of 16 tokens. Two decode sub-requests arrive with 48-token prompts (3 blocks
    each): all 6 blocks are held by queued requests and nothing runs. The head's next token
    (position 48) starts a 4th block, so it cannot be admitted, and no running request will
    ever free one: the newest queued holder (b) is preempted in the queue, freeing 3 blocks,
    and will recompute its 48-token prompt. The head then runs: 3 + 1 = 4 blocks in use; b
    needs 3 blocks for its prefill but only 2 are free, so it waits (something runs now)."""
    from simulator.engine.batching import EnqueueOutcome, VLLMEngine

    engine = VLLMEngine(EngineConfig(total_kv_blocks=6, block_size=16))
    a = Request("a", 0, 48, 10, index=0).sub_request("decode")
    b = Request("b", 0, 48, 10, index=1).sub_request("decode")
    assert engine.enqueue_resident(a, 0) is EnqueueOutcome.QUEUED
    assert engine.enqueue_resident(b, 0) is EnqueueOutcome.QUEUED
    assert engine.kv.used_blocks == 6
    batch = engine.plan_step(0)
    assert batch.decode_count == 1 and not batch.prefill_chunks
    assert a.state is RequestState.RUNNING
    assert list(engine.waiting) == [b]
    assert b.block_ids == [] and b.in_prefill and b.prefill_target == 48
    assert b.preemptions == engine.preemption_count == 1
    assert engine.kv.used_blocks == 4
    engine.check_invariants()


def test_a_request_running_alone_is_not_preempted_while_queued_transfers_hold_blocks():
    """6 blocks of 16 tokens, one sequence at a time. `a` decodes from a 32-token prompt (2
    blocks); `b` waits with its 48-token prompt transferred (3 blocks). `a` takes a 3rd block
    at its 33rd token; at its 49th it needs a 4th and none is free. Evicting itself, the only
    running request, would free its blocks just for it to take them back chunk by chunk while
    `b` keeps its 3, forever (a QA fuzz found runs that never ended). So the queue gives them
    back: `b` is preempted where it stands and will recompute its prompt; `a` keeps running."""
    from simulator.engine.batching import VLLMEngine

    engine = VLLMEngine(EngineConfig(total_kv_blocks=6, block_size=16, max_num_running_reqs=1))
    a = Request("a", 0, 32, 40, index=0).sub_request("decode")
    b = Request("b", 0, 48, 10, index=1).sub_request("decode")
    engine.enqueue_resident(a, 0)
    engine.enqueue_resident(b, 0)
    now_us = 0
    while a.computed_tokens < 48:  # 16 decode steps: tokens 33..48 on 3 blocks
        engine.plan_step(now_us)
        now_us += 1000
        engine.finish_step(1000)
        engine.check_invariants()
    assert engine.kv.used_blocks == 6 and engine.preemption_count == 0
    engine.plan_step(now_us)  # the 49th token needs a 4th block
    assert a.state is RequestState.RUNNING and a.preemptions == 0
    assert list(engine.waiting) == [b] and b.block_ids == [] and b.in_prefill
    assert b.preemptions == engine.preemption_count == 1
    assert engine.kv.used_blocks == 4
    engine.check_invariants()


def test_decode_head_that_can_never_take_a_token_is_dropped_as_unservable():
    """A 64-token prompt fills a 4-block cache exactly; its first decode token needs a 5th
    block that the whole cache does not have, and no other request holds anything: it can
    never run here, so it is dropped (counted), not left at the head forever."""
    from simulator.engine.batching import VLLMEngine

    engine = VLLMEngine(EngineConfig(total_kv_blocks=4, block_size=16))
    a = Request("a", 0, 64, 10, index=0).sub_request("decode")
    engine.enqueue_resident(a, 0)
    engine.plan_step(0)
    assert a.state is RequestState.DROPPED
    assert engine.dropped_while_planning == [a]
    assert engine.dropped_unservable == 1
    assert engine.kv.used_blocks == 0 and not engine.has_work


def test_pd_decode_cache_filling_up_finishes_and_counts_every_request():
    """The repro of a hang: 20 decode blocks, 50 requests of 100 + 200 tokens (7 prompt blocks,
    19 blocks each at the end). Queued transfers used to hold every block while the request
    at the head waited for one forever, stepping an empty batch every microsecond."""
    with finishes_within(WALL_LIMIT_S):
        result = simulator.simulate(
            {
                "cluster": {
                    "num_instances": 2,
                    "pd": {"prefill_instances": 1, "decode_instances": 1, "decider": "always"},
                },
                "engine": {"total_kv_blocks": 20},
                "workload": {
                    "num_requests": 50,
                    "prompt_tokens": {"distribution": "constant", "value": 100},
                    "output_tokens": {"distribution": "constant", "value": 200},
                },
            }
        )
    s = result.summary
    states = _states(result.request_records)
    assert states[RequestState.COMPLETED] + states[RequestState.DROPPED] == 50
    assert s["completed_requests"] == states[RequestState.COMPLETED] > 0
    assert s["dropped_unservable"] == states[RequestState.DROPPED]
    assert s["still_queued"] == s["still_running"] == 0
    assert s["preemption_count"] > 0
    for r in result.request_records:
        if r.state is RequestState.COMPLETED:
            assert r.generated_tokens == 200


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"engine": {"enable_prefix_caching": False}},
        {"cluster": {"num_instances": 3}},
        {"horizon_us": 500_000},
        {
            "cluster": {
                "num_instances": 2,
                "pd": {"prefill_instances": 1, "decode_instances": 1, "decider": "always"},
            }
        },
    ],
    ids=["plain", "no-prefix-caching", "three-instances", "horizon", "pd"],
)
def test_an_empty_prompt_is_dropped_as_unservable(tmp_path, extra):
    """vLLM refuses an empty prompt. A trace row with input_tokens 0 used to loop forever in
    the step that tried to prefill it; it is now dropped at enqueue and counted."""
    rows = ["0,c0,,,,0,,false,0,8,0,0,0,0,0,,0,0,1000,0,0,0,0,ok,,"]
    rows += [f"{i},c0,,,,0,,false,64,8,0,0,0,0,0,,0,0,{1000 + i * 1000},0,0,0,0,ok,,"
             for i in range(1, 6)]  # fmt: skip
    data = tmp_path / "trace.csv"
    data.write_text(TRACE_HEADER + "\n".join(rows) + "\n")
    with finishes_within(WALL_LIMIT_S):
        result = simulator.simulate({"trace": {"data": str(data)}, **extra})
    by_id = {r.request_id: r for r in result.request_records}
    assert by_id["request_0"].state is RequestState.DROPPED
    assert result.summary["dropped_unservable"] == 1
    assert result.summary["completed_requests"] == 5


def _all_fail_at_3_s() -> dict:
    return {
        "cluster": {"num_instances": 2},
        "instance_lifecycle": {"initial_instances_loaded": True},
        "autoscaler": [{"max_instances": 2, "scale_up_threshold": 4, "interval_s": 1}],
        "events": [
            {"at_s": 3, "action": "fail_instance", "target": "instance_0"},
            {"at_s": 3, "action": "fail_instance", "target": "instance_1"},
        ],
        "workload": {"rate": 20, "num_requests": 200},
    }


def test_autoscaler_replaces_instances_that_all_failed():
    """Both instances fail at 3 s; the autoscaler, below min_instances, makes new ones (its
    planned slots are used up, so the fleet grows) and the requests that waited at the
    router meanwhile are served: every request ends completed or failed."""
    with finishes_within(WALL_LIMIT_S):
        result = simulator.simulate(_all_fail_at_3_s())
    s = result.summary
    states = _states(result.request_records)
    assert s["failed_requests"] == states[RequestState.FAILED] > 0
    assert s["completed_requests"] + s["failed_requests"] == 200
    assert s["still_queued"] == result.parked_at_end == 0
    fleet = result.fleet_metrics
    assert fleet["autoscaler_default_scale_ups"] >= 1
    assert "autoscaler_default_refused_scale_ups" not in fleet
    made = result.timeline[
        (result.timeline.kind == "instance") & (result.timeline.to_state == "scheduling")
    ]
    assert set(made.id) >= {"instance_2"}  # beyond the two planned slots


def test_autoscaler_that_can_make_no_more_instances_stops_asking(monkeypatch):
    """The same with the run's instance limit at 2 (limits.MAX_INSTANCES, patched): the +1
    asks are refused (one timeline row, the counter, a warning) instead of being repeated
    forever. Requests arriving after the failure wait at the router to the end of the run,
    counted as still queued."""
    import simulator.cluster.cluster as cluster_module

    monkeypatch.setattr(cluster_module, "MAX_INSTANCES", 2)
    with finishes_within(WALL_LIMIT_S):
        result = simulator.simulate(_all_fail_at_3_s())
    s = result.summary
    states = _states(result.request_records)
    assert s["failed_requests"] == states[RequestState.FAILED]
    assert s["still_queued"] == states[RequestState.CREATED] == result.parked_at_end > 0
    assert s["completed_requests"] + s["failed_requests"] + s["still_queued"] == 200
    fleet = result.fleet_metrics
    assert fleet["autoscaler_default_refused_scale_ups"] >= 1
    assert fleet["autoscaler_default_scale_ups"] == 0
    refusals = result.timeline[result.timeline.kind == "autoscaler"]
    assert len(refusals) == 1 and "refused: the run has made 2 instances" in refusals.reason.iloc[0]


def test_a_failed_node_is_not_labelled_an_idle_scale_down():
    scenario = {
        "node_pools": [
            {
                "name": "h100",
                "gpu_type": "H100",
                "gpus_per_node": 1,
                "initial_nodes": 2,
                "max_nodes": 2,
            }
        ],  # fmt: skip
        "deployments": [{"name": "llama", "num_instances": 2, "pool": "h100"}],
        "instance_lifecycle": {"initial_instances_loaded": True},
        "autoscaler": [{"deployment": "llama", "max_instances": 2, "scale_up_threshold": 50}],
        "events": [{"at_s": 1, "action": "fail_node", "node": "h100-1"}],
        "workload": {"rate": 10, "num_requests": 30},
    }
    with finishes_within(WALL_LIMIT_S):
        result = simulator.simulate(scenario)
    tl = result.timeline
    ended = tl[(tl.kind == "node") & (tl.id == "h100-1") & (tl.to_state == "terminated")]
    assert list(ended.reason) == ["event fail_node at 1 s"]


def test_the_progress_watchdog_stops_a_stuck_engine():
    """An engine that plans empty steps while it has work would step forever; the instance's
    watchdog stops the run after STALLED_STEPS_LIMIT such steps, in every run (invariant
    checks off here), naming the instance, its queue and its KV state."""
    import simpy

    from simulator.engine.batching import VLLMEngine
    from simulator.engine.instance import Instance
    from simulator.invariants import STALLED_STEPS_LIMIT, InvariantViolation
    from simulator.latency.base import StepBatch

    class StuckEngine(VLLMEngine):
        def plan_step(self, now_us):
            self.step_count += 1
            return StepBatch()

        plan_general_step = plan_step

    env = simpy.Environment()
    engine = StuckEngine(EngineConfig(total_kv_blocks=100, block_size=16))
    instance = Instance(env, "instance_7", engine, STEP_MODEL, lambda r: None)
    instance.inbox.put(Request("r0", 0, 64, 4, index=0))
    with finishes_within(WALL_LIMIT_S), pytest.raises(InvariantViolation) as caught:
        env.run()
    message = str(caught.value)
    assert "progress (INV-PROGRESS)" in message
    assert f"instance_7 ran {STALLED_STEPS_LIMIT} consecutive steps" in message
    assert "1 queued, 0 running" in message
    assert "KV 0 of 100 blocks in use" in message
    assert "queue head r0" in message
    # 1,000 empty steps of 1,000 µs each (the model's constant term; the batch is empty).
    assert env.now == (STALLED_STEPS_LIMIT - 1) * 1000


def test_an_instance_preempting_forever_without_output_stops_the_run(tmp_path, monkeypatch):
    """The thrashing watchdog: the livelock the engine no longer has (a request running alone
    evicting itself while queued decode sub-requests hold blocks), put back by hand. Its
    steps compute re-prefill chunks, so the empty-step watchdog never fires; 1,000
    preemptions without an output token or a completion stop the run instead of letting it
    run forever."""
    from simulator.engine.batching import VLLMEngine
    from simulator.invariants import InvariantViolation

    monkeypatch.setattr(VLLMEngine, "_evict_newest_queued_holder", lambda self, keep_head: False)
    trace = tmp_path / "t.csv"
    trace.write_text(
        "index,arrival_time_us,input_tokens,output_tokens\n0,0,400,300\n1,100000,1040,10\n"
    )
    scenario = {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "engine": {
            "max_num_scheduled_tokens": 256,
            "enable_prefix_caching": False,
            "max_num_running_reqs": 1,
        },
        "cluster": one_prefill_one_decode(decode={"total_kv_blocks": 100}),
        "trace": {"data": str(trace), "timing": "schedule"},
    }
    with pytest.raises(InvariantViolation, match="preempted 1000 times without producing"):
        simulator.simulate(scenario)
