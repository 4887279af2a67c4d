"""Laws that hold for every run, checked on random small scenarios (hypothesis).

The scenarios are drawn to be hostile: tiny KV caches force preemption, tiny token budgets
force chunked prefill, short deadlines force timeouts, a horizon cuts some runs short, and
the output-token overhead (alpha2) is often non-zero.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig
from simulator.engine.request import Request, RequestState
from simulator.latency.blackbox import BlackboxModel
from simulator.latency.roofline import RooflineModel
from tests.specs import H100, LLAMA31_8B


@st.composite
def scenarios(draw):
    block_size = draw(st.sampled_from([4, 16]))
    n = draw(st.integers(1, 25))
    requests = []
    t = 0
    for i in range(n):
        t += draw(st.integers(0, 20_000))
        prompt = draw(st.integers(1, 300))
        output = draw(st.integers(0, 60))
        deadline = t + draw(st.integers(1, 400_000)) if draw(st.booleans()) else 0
        shared = draw(st.sampled_from([0, 0, 32, 96]))  # a common system prompt sometimes
        segments = [(("prefix", "sys"), min(shared, prompt))]
        if prompt > shared:
            segments.append((("req", i), prompt - shared))
        requests.append(
            Request(
                f"request_{i}",
                t,
                prompt,
                output,
                index=i,
                deadline_us=deadline,
                segments=segments if shared else None,
            )  # fmt: skip
        )
    config = EngineConfig(
        total_kv_blocks=draw(st.integers(3, 120)),
        block_size=block_size,
        max_num_running_reqs=draw(st.integers(1, 16)),
        max_num_scheduled_tokens=draw(st.integers(8, 512)),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 32, 100])),
        max_model_len=draw(st.sampled_from([0, 0, 0, 256, 400])),
        scheduler=draw(st.sampled_from(["fcfs", "fcfs", "sjf", "priority-fcfs"])),
        priority_policy=draw(st.sampled_from(["constant", "slo-based", "inverted-slo"])),
        kv_cpu_blocks=draw(st.sampled_from([0, 0, 6, 64])),
        kv_offload_policy=draw(st.sampled_from(["evict", "mirror"])),
        kv_bytes_per_block=2_097_152.0,
        kv_reload_blocking=draw(st.booleans()),
    )
    if draw(st.booleans()):
        alpha = [draw(st.integers(0, 3000)), draw(st.floats(0, 5)), draw(st.integers(0, 2000))]
        model = BlackboxModel(alpha, [draw(st.integers(1, 8000)), 10.0, 5.0])
    else:
        model = RooflineModel(LLAMA31_8B, H100, 1)
    horizon = draw(st.sampled_from([None, None, None, 150_000, 600_000]))
    return requests, config, model, horizon


def _run(requests, config, model, horizon):
    fresh = [
        Request(r.request_id, r.arrival_us, r.input_tokens, r.output_tokens, index=r.index,
                deadline_us=r.deadline_us, segments=r.segments)
        for r in requests
    ]  # fmt: skip
    return run_simulation(fresh, config, model, horizon, check_invariants=True)


LAW_SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@LAW_SETTINGS
@given(scenarios())
def test_laws_hold(case):
    requests, config, model, horizon = case
    result = _run(requests, config, model, horizon)  # KV conservation checked after each step
    summary = result.summary
    records = result.request_records
    arrived = [r for r in records if horizon is None or r.arrival_us <= horizon]

    # Request conservation: every arrived request is in exactly one counted state.
    states = {s: sum(1 for r in arrived if r.state is s) for s in RequestState}
    assert summary["completed_requests"] == states[RequestState.COMPLETED]
    assert summary["timed_out_requests"] == states[RequestState.TIMED_OUT]
    assert summary["dropped_unservable"] == states[RequestState.DROPPED]
    assert summary["still_running"] == states[RequestState.RUNNING]
    assert summary["still_queued"] == states[RequestState.QUEUED] + states[RequestState.CREATED]
    assert summary["injected_requests"] == len(arrived)
    assert result.not_arrived + len(arrived) == len(requests)
    if horizon is None:
        assert summary["still_running"] == summary["still_queued"] == 0

    # Causality of every request's timestamps.
    for r in records:
        chain = [r.arrival_us, r.enqueue_us, r.first_schedule_us, r.first_token_us]
        reached = [t for t in chain if t >= 0]
        assert reached == sorted(reached), r
        if r.state is RequestState.COMPLETED:
            assert r.first_token_us >= 0 or r.output_tokens == 0
            assert r.arrival_us <= r.enqueue_us <= r.first_schedule_us <= r.schedule_us
            # schedule_us is the last admission: after a preemption it may follow the 1st token
            assert r.first_schedule_us <= r.first_token_us <= r.completion_us
            assert r.schedule_us <= r.completion_us
        if r.first_token_us >= 0:
            assert r.first_token_us <= r.last_token_us

    # No token generated twice; totals add up.
    for r in records:
        assert 0 <= r.generated_tokens <= r.output_tokens
        if r.state is RequestState.COMPLETED and not r.length_capped:
            assert r.generated_tokens == r.output_tokens
    assert summary["total_output_tokens"] == sum(r.generated_tokens for r in records)

    # Clock monotonicity and work conservation across steps.
    steps = result.engines[0].steps
    reload_idle = set(result.engines[0].reload_idle_us)
    for i in range(1, len(steps)):
        prev_end = steps.start_us[i - 1] + steps.step_us[i - 1]
        assert steps.start_us[i] >= prev_end  # steps never overlap; the clock never goes back
        if steps.start_us[i] > prev_end:  # the GPU idled: only with no work left, or while
            # a prefix is on its way back from the CPU tier (non-blocking reload)
            no_work = steps.queue_length[i - 1] == 0 and steps.running_requests[i - 1] == 0
            assert no_work or prev_end in reload_idle
    assert all(s >= 1 for s in steps.step_us)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_same_seed_same_bytes(case):
    requests, config, model, horizon = case
    a = json.dumps(_run(requests, config, model, horizon).summary)
    b = json.dumps(_run(requests, config, model, horizon).summary)
    assert a == b


def test_hostile_scenarios_do_preempt_and_chunk():
    """Guard against a vacuous law test: the generator really reaches preemption and chunking."""
    requests = [Request(f"request_{i}", i * 1000, 200, 60, index=i) for i in range(12)]
    config = EngineConfig(total_kv_blocks=40, block_size=16, max_num_scheduled_tokens=128)
    result = run_simulation(requests, config, RooflineModel(LLAMA31_8B, H100, 1), None, None, True)
    assert result.summary["preemption_count"] > 0
    assert result.summary["completed_requests"] == 12
    assert max(result.engines[0].steps.prefill_tokens) <= 128  # prompts of 200 were chunked
