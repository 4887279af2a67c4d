"""VLLMEngine driven by hand, without SimPy (docs/behaviour.md §1.3–1.8, §A2–A3).

The engine is a plain object: `enqueue(req, now)`, `plan_step(now) -> StepBatch`,
`finish_step(step_us) -> completed`. Each test drives it step by step with a constant step
time, so every expected number follows from the batching rules alone (comments show how).
"""

from __future__ import annotations

import pytest

from simulator.engine.batching import EngineConfig, EnqueueOutcome, VLLMEngine
from simulator.engine.request import Request, RequestState
from simulator.errors import ConfigError
from simulator.latency.base import StepBatch

STEP = 1000  # µs per step, unless a test says otherwise


def make_engine(otp_us: int = 0, **config) -> VLLMEngine:
    return VLLMEngine(EngineConfig(**config), output_token_processing_us=otp_us)


def new_req(rid: str, inp: int, out: int, arrival: int = 0, **kw) -> Request:
    return Request(rid, arrival, inp, out, **kw)


class Driver:
    """Runs back-to-back steps of `step_us` each, starting at `now`."""

    def __init__(self, engine: VLLMEngine, now: int = 0, step_us: int = STEP) -> None:
        self.eng = engine
        self.now = now
        self.step_us = step_us
        self.batches: list[StepBatch] = []

    def step(self) -> tuple[StepBatch, list[Request]]:
        batch = self.eng.plan_step(self.now)
        assert batch is not None
        done = self.eng.finish_step(self.step_us)
        self.now += self.step_us
        self.batches.append(batch)
        self.eng.check_invariants()
        return batch, done

    def run(self, max_steps: int = 10_000) -> list[Request]:
        done: list[Request] = []
        for _ in range(max_steps):
            if not self.eng.has_work:
                return done
            done += self.step()[1]
        raise AssertionError("engine did not drain")


def admission_order(eng: VLLMEngine, step_us: int = STEP) -> list[str]:
    """Request IDs in the order they were first admitted to the running batch."""
    d = Driver(eng, now=eng.clock_us, step_us=step_us)
    d.run()
    return [r.request_id for r in sorted(eng.completed, key=lambda r: r.first_schedule_us)]


# ---------------------------------------------------------------------------- token budget


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget():
    eng = make_engine(max_num_scheduled_tokens=2048)
    r = new_req("a", 5000, 3)
    assert eng.enqueue(r, 0) is EnqueueOutcome.QUEUED
    d = Driver(eng)
    # 5000 = 2048 + 2048 + 904; context of each chunk = tokens already computed.
    b1, _ = d.step()
    assert b1.prefill_chunks == [(0, 2048)]
    assert r.first_token_us == -1
    b2, _ = d.step()
    assert b2.prefill_chunks == [(2048, 2048)]
    assert r.first_token_us == -1
    b3, _ = d.step()
    assert b3.prefill_chunks == [(4096, 904)]
    # The step that computes the last prompt token produces the first output token.
    assert r.first_token_us == 3 * STEP
    assert r.generated_tokens == 1
    b4, _ = d.step()
    assert b4.prefill_chunks == [] and b4.decode_count == 1 and b4.decode_context_sum == 5000


def test_long_prefill_threshold_caps_each_chunk():
    eng = make_engine(max_num_scheduled_tokens=2048, long_prefill_token_threshold=512)
    a, b = new_req("a", 1000, 2), new_req("b", 1000, 2)
    eng.enqueue(a, 0)
    eng.enqueue(b, 0)
    d = Driver(eng)
    # Both prompts fit the 2048 budget, but each chunk is capped at 512: 1000 = 512 + 488.
    b1, _ = d.step()
    assert b1.prefill_chunks == [(0, 512), (0, 512)]
    b2, _ = d.step()
    assert b2.prefill_chunks == [(512, 488), (512, 488)]
    assert a.first_token_us == b.first_token_us == 2 * STEP


def test_max_num_running_reqs_caps_admission():
    eng = make_engine(max_num_running_reqs=2)
    reqs = [new_req(f"r{i}", 100, 3) for i in range(3)]
    for r in reqs:
        eng.enqueue(r, 0)
    d = Driver(eng)
    b1, _ = d.step()
    assert len(b1.prefill_chunks) == 2
    assert [r.state for r in reqs] == [RequestState.RUNNING] * 2 + [RequestState.QUEUED]
    # r0 and r1 produce tokens 1, 2, 3 in steps 1, 2, 3 and leave at the end of step 3.
    d.step()
    _, done = d.step()
    assert done == reqs[:2]
    b4, _ = d.step()
    assert b4.prefill_chunks == [(0, 100)]  # r2 admitted only once a slot frees up
    assert reqs[2].first_schedule_us == 3 * STEP


def test_decode_costs_one_token_of_budget_and_running_requests_come_first():
    eng = make_engine(max_num_scheduled_tokens=100)
    a = new_req("a", 50, 5)
    eng.enqueue(a, 0)
    d = Driver(eng)
    d.step()  # a: 50-token prefill -> first token
    b = new_req("b", 200, 5, arrival=STEP)
    eng.enqueue(b, STEP)
    b2, _ = d.step()
    # Phase 1: a decodes (1 token, context 50); Phase 2: b gets the remaining 100 - 1 = 99.
    assert b2.decode_count == 1 and b2.decode_context_sum == 50
    assert b2.prefill_chunks == [(0, 99)]


def test_running_prefill_is_served_before_a_new_admission():
    eng = make_engine(max_num_scheduled_tokens=100)
    a = new_req("a", 250, 2)
    eng.enqueue(a, 0)
    d = Driver(eng)
    assert d.step()[0].prefill_chunks == [(0, 100)]
    b = new_req("b", 30, 2, arrival=STEP)
    eng.enqueue(b, STEP)
    # a (running) takes the whole budget; b is not admitted with 0 tokens left.
    assert d.step()[0].prefill_chunks == [(100, 100)]
    assert b.state is RequestState.QUEUED
    # a's last 50 tokens, then b gets the other 50 of the budget (needs only 30).
    assert d.step()[0].prefill_chunks == [(200, 50), (0, 30)]
    assert b.first_schedule_us == 2 * STEP


def test_phase_two_head_of_line_blocking():
    # 10 blocks of 16 tokens. a holds 7 blocks (100 tokens + decode fits in block 7).
    eng = make_engine(total_kv_blocks=10, block_size=16)
    a = new_req("a", 100, 10)
    eng.enqueue(a, 0)
    d = Driver(eng)
    d.step()
    assert eng.kv.used_blocks == 7  # ceil(100/16)
    big = new_req("big", 100, 5, arrival=STEP)  # needs 7 blocks; only 3 are free
    small = new_req("small", 10, 5, arrival=STEP)  # needs 1 block: would fit
    eng.enqueue(big, STEP)
    eng.enqueue(small, STEP)
    b, _ = d.step()
    assert b.prefill_chunks == []  # no skipping past the blocked head
    assert list(eng.waiting) == [big, small]
    assert small.state is RequestState.QUEUED
    assert eng.kv.used_blocks == 7  # a's decode at position 100 stays in its 7th block


# ---------------------------------------------------------------------------- enqueue guards


def test_enqueue_drops_prompts_at_or_over_max_model_len():
    eng = make_engine(max_model_len=1000)
    too_long = new_req("a", 1000, 10)  # input >= max_model_len
    over = new_req("b", 900, 101)  # 900 + 101 > 1000
    fits = new_req("c", 900, 100)  # 900 + 100 == 1000 is allowed
    assert eng.enqueue(too_long, 0) is EnqueueOutcome.DROPPED
    assert eng.enqueue(over, 0) is EnqueueOutcome.DROPPED
    assert eng.enqueue(fits, 0) is EnqueueOutcome.QUEUED
    assert too_long.state is over.state is RequestState.DROPPED
    assert eng.dropped_unservable == 2
    assert eng.total_input_tokens == 900  # dropped requests' inputs are not counted


def test_enqueue_auto_fills_max_output_from_max_model_len():
    eng = make_engine(max_model_len=1000)
    r = new_req("a", 300, 0, max_output_tokens=0)
    assert eng.enqueue(r, 0) is EnqueueOutcome.QUEUED
    assert r.max_output_tokens == 700  # 1000 - 300


def test_enqueue_drops_negative_max_output():
    eng = make_engine()
    r = new_req("a", 10, 5, max_output_tokens=-1)
    assert eng.enqueue(r, 0) is EnqueueOutcome.DROPPED
    assert eng.dropped_unservable == 1


def test_enqueue_drops_prompt_larger_than_the_whole_kv_cache():
    eng = make_engine(total_kv_blocks=10, block_size=16)
    huge = new_req("a", 161, 1)  # ceil(161/16) = 11 > 10 blocks
    assert eng.enqueue(huge, 0) is EnqueueOutcome.DROPPED
    assert eng.dropped_unservable == 1
    assert eng.total_input_tokens == 0
    assert not eng.waiting


def test_enqueue_past_deadline_times_out_but_counts_input_tokens():
    eng = make_engine()
    late = new_req("a", 40, 5, deadline_us=500)
    on_time_edge = new_req("b", 60, 5, deadline_us=1000)
    assert eng.enqueue(late, 1000) is EnqueueOutcome.TIMED_OUT
    assert eng.enqueue(on_time_edge, 1000) is EnqueueOutcome.TIMED_OUT  # deadline <= now
    assert late.state is RequestState.TIMED_OUT
    assert eng.timed_out == 2
    # Counted before the past-due check (docs/behaviour.md §1.3 steps 6-7).
    assert eng.total_input_tokens == 100
    assert not eng.waiting
    ok = new_req("c", 7, 5, deadline_us=1001)
    assert eng.enqueue(ok, 1000) is EnqueueOutcome.QUEUED


def test_enqueue_guard_order_drop_wins_over_timeout():
    eng = make_engine(max_model_len=100)
    r = new_req("a", 200, 5, deadline_us=10)  # both too long and past due
    assert eng.enqueue(r, 1000) is EnqueueOutcome.DROPPED
    assert (eng.dropped_unservable, eng.timed_out, eng.total_input_tokens) == (1, 0, 0)


def test_enqueue_ignores_a_request_already_timed_out():
    eng = make_engine()
    r = new_req("a", 10, 5)
    r.state = RequestState.TIMED_OUT
    assert eng.enqueue(r, 0) is EnqueueOutcome.IGNORED
    assert eng.total_input_tokens == 0 and not eng.waiting


@pytest.mark.parametrize("out", [0, 1])
def test_prompt_exactly_filling_the_cache_is_served_when_no_decode_kv_is_needed(out):
    eng = make_engine(total_kv_blocks=10, block_size=16)
    r = new_req("a", 160, out)  # ceil(160/16) = 10 blocks = the whole cache
    assert eng.enqueue(r, 0) is EnqueueOutcome.QUEUED
    Driver(eng).run()
    assert r.state is RequestState.COMPLETED
    assert eng.dropped_unservable == 0


# ---------------------------------------------------------------------------- preemption


def _grow_three(**config) -> tuple[VLLMEngine, Driver, list[Request]]:
    """Three 32-token prompts decoding 60 tokens each in a 10-block cache."""
    eng = make_engine(total_kv_blocks=10, block_size=16, **config)
    reqs = [new_req(n, 32, 60) for n in "abc"]
    for r in reqs:
        eng.enqueue(r, 0)
    return eng, Driver(eng, step_us=10), reqs


def test_preemption_evicts_the_most_recent_admission_to_the_queue_front():
    eng, d, (a, b, c) = _grow_three()
    # Step 1: 3 prefills of 32 tokens = 2 blocks each (6 used); token 1.
    # Step s >= 2 decodes position 30 + s; a new block is needed at positions 32 (s=2, 9 used)
    # and 48 (s=18): a takes the 10th block, b finds none -> c (admitted last) is evicted.
    for _ in range(17):
        d.step()
    assert eng.preemption_count == 0 and eng.kv.used_blocks == 9
    late = new_req("late", 1, 5, arrival=d.now)  # queued behind, at the tail
    eng.enqueue(late, d.now)
    batch, _ = d.step()
    assert eng.preemption_count == 1 and c.preemptions == 1
    assert eng.running == [a, b]
    assert list(eng.waiting) == [c, late]  # the victim goes to the FRONT
    assert eng.kv.used_blocks == 8  # 10 - c's 3 + b's new block
    assert c.state is RequestState.QUEUED and c.block_ids == []
    assert batch.decode_count == 2 and batch.prefill_chunks == []  # nothing admitted
    # c delivered tokens 1..17 in steps 1..17; it must recompute prompt + those 17 tokens.
    assert c.generated_tokens == 17
    assert c.prefill_target == 32 + 17
    assert eng.steps.preemptions[-1] == 1


def test_preempted_request_reprefills_and_never_exceeds_its_output_length():
    eng, d, (a, b, c) = _grow_three()
    for _ in range(18):  # up to and including the step that evicts c (see previous test)
        d.step()
    ttft = {r.request_id: r.first_token_us for r in (a, b, c)}
    assert ttft == {"a": 10, "b": 10, "c": 10}  # end of step 1 (10 µs steps)
    # a and b (4 blocks each) take their 5th block at position 64 (step 34): 10 used. At
    # position 80 (step 50) a needs a 6th block: b, now the last admitted, is evicted.
    for _ in range(32):
        d.step()
    assert eng.preemption_count == 2 and b.preemptions == 1
    assert list(eng.waiting) == [b, c]
    assert b.generated_tokens == 49 and b.prefill_target == 32 + 49
    # a delivers token s in step s and completes at the end of step 60; meanwhile b (head)
    # needs 6 blocks and only 4 are free: nothing is admitted until step 61.
    while a.state is RequestState.RUNNING:
        d.step()
    assert len(d.batches) == 60
    readmit, _ = d.step()
    # b had 80 tokens of KV (32 prompt + 48 of its 49 output tokens): 5 full blocks, all hashed
    # (output blocks too, as vLLM). Released last block first, its 5th was the one a took at
    # step 50; the other 4 kept their hashes while free: 64 tokens hit the cache and b
    # re-prefills the other 81 - 64 = 17 tokens. c's blocks were reused by a and b at step
    # 34, so c re-prefills all of 32 + 17 = 49 tokens.
    assert readmit.prefill_chunks == [(64, 17), (0, 49)]
    assert b.cached_tokens == 64 and c.cached_tokens == 0
    # The re-prefill step produces the next token, not a duplicate of an earlier one.
    assert (b.generated_tokens, c.generated_tokens) == (50, 18)
    d.run()
    for r in (a, b, c):
        assert r.state is RequestState.COMPLETED
        assert r.generated_tokens == r.output_tokens == 60
        assert r.first_token_us == ttft[r.request_id]  # TTFT recorded once
    assert eng.total_output_tokens == 3 * 60
    assert eng.preemption_count == sum(r.preemptions for r in (a, b, c))


def test_no_admission_in_a_step_that_preempted():
    # Prefix caching off, so the victim's re-prefill needs only ceil(chunk/16) blocks and
    # would fit in the same step -- it must still wait for the next step.
    eng = make_engine(
        total_kv_blocks=10, block_size=16, max_num_scheduled_tokens=64, enable_prefix_caching=False
    )
    a = new_req("a", 16, 40)
    b = new_req("b", 100, 40)
    eng.enqueue(a, 0)
    eng.enqueue(b, 0)
    d = Driver(eng)
    # Step 1: a 16 tokens (1 block), b 48 tokens (3 blocks). Step 2: a decodes position 16
    # (new block: 2), b its last 52 tokens (7 blocks) -> 9 used. b decodes position 100 + s - 3
    # in step s >= 3 and needs its 8th block at position 112 (step 15): 10 used.
    # a decodes position 14 + s and needs its 3rd block at position 32 in step 18 -> b evicted.
    for _ in range(17):
        d.step()
    assert eng.kv.used_blocks == 10 and eng.preemption_count == 0
    batch, _ = d.step()
    assert eng.preemption_count == 1
    assert list(eng.waiting) == [b]
    assert b.prefill_target == 100 + 16  # b delivered tokens in steps 2..17
    assert eng.kv.free_blocks == 7  # 10 - a's 3; b's first chunk needs ceil(63/16) = 4
    assert batch.decode_count == 1 and batch.prefill_chunks == []
    batch, _ = d.step()
    assert batch.prefill_chunks == [(0, 63)]  # admitted one step later, 64 - 1 budget


# ---------------------------------------------------------------------------- token timing


def test_output_token_processing_time_is_charged_cumulatively():
    alpha2 = 100
    eng = make_engine(otp_us=alpha2)
    r = new_req("a", 16, 3)
    eng.enqueue(r, 0)
    d = Driver(eng)
    d.step()  # step [0, 1000): prefill -> token 1 at 1000 + 1*100
    assert r.first_token_us == 1100
    d.step()  # token 2 at 2000 + 2*100
    assert r.last_token_us == 2200
    _, done = d.step()  # token 3 at 3000 + 3*100 = last step end + N*alpha2
    assert done == [r]
    assert r.last_token_us == r.completion_us == 3300
    # alpha2 does not stretch the GPU step: steps stay back to back.
    assert list(eng.steps.start_us) == [0, 1000, 2000]
    # Each inter-token gap = step time + alpha2.
    assert list(eng.steps.itl_regular_gap_us[1:]) == [1100, 1100]


def test_zero_output_request_completes_at_end_of_prefill():
    eng = make_engine(otp_us=100, max_num_scheduled_tokens=64)
    r = new_req("a", 100, 0)
    eng.enqueue(r, 0)
    d = Driver(eng)
    _, done = d.step()  # 64 of 100 prompt tokens
    assert done == []
    _, done = d.step()  # last 36 tokens: done, no output token so no alpha2
    assert done == [r]
    assert r.completion_us == 2 * STEP
    assert r.state is RequestState.COMPLETED
    assert r.generated_tokens == 0 and eng.total_output_tokens == 0
    assert eng.kv.used_blocks == 0


def test_total_output_tokens_include_the_first_token():
    eng = make_engine()
    for i in range(3):
        eng.enqueue(new_req(f"r{i}", 20, 4), 0)
    Driver(eng).run()
    assert eng.total_output_tokens == 12  # 3 requests x 4 tokens (docs/behaviour.md §A3)
    assert eng.total_input_tokens == 60


def test_single_request_timeline():
    eng = make_engine()
    r = new_req("a", 20, 4, arrival=0)
    eng.enqueue(r, 500)
    d = Driver(eng, now=500)
    d.run()
    # Admitted at 500; prefill step [500, 1500) gives token 1, steps 2-4 give tokens 2-4.
    assert (r.enqueue_us, r.schedule_us, r.first_token_us, r.completion_us) == (
        500,
        500,
        1500,
        4500,
    )
    assert eng.step_count == 4


# ---------------------------------------------------------------------------- schedulers


def _queue_one_at_a_time(scheduler: str, priority: str, reqs: list[Request]) -> VLLMEngine:
    eng = make_engine(max_num_running_reqs=1, scheduler=scheduler, priority_policy=priority)
    for r in reqs:
        eng.enqueue(r, 1000)
    return eng


def test_sjf_admits_the_shortest_prompt_first():
    reqs = [new_req("long", 300, 2), new_req("short", 100, 2), new_req("mid", 200, 2)]
    eng = _queue_one_at_a_time("sjf", "constant", reqs)
    assert admission_order(eng) == ["short", "mid", "long"]


def test_fcfs_keeps_queue_order():
    reqs = [new_req("long", 300, 2), new_req("short", 100, 2), new_req("mid", 200, 2)]
    eng = _queue_one_at_a_time("fcfs", "constant", reqs)
    assert admission_order(eng) == ["long", "short", "mid"]


def _out_of_order_arrivals() -> list[Request]:
    # Queued in this order, but "early" has waited longest (arrived at 100 µs).
    return [
        new_req("late", 50, 2, arrival=500),
        new_req("early", 50, 2, arrival=100),
        new_req("middle", 50, 2, arrival=300),
    ]


def test_priority_fcfs_with_slo_based_priority_admits_longest_waiting_first():
    eng = _queue_one_at_a_time("priority-fcfs", "slo-based", _out_of_order_arrivals())
    assert admission_order(eng) == ["early", "middle", "late"]


def test_reverse_priority_with_slo_based_priority_admits_shortest_waiting_first():
    eng = _queue_one_at_a_time("reverse-priority", "slo-based", _out_of_order_arrivals())
    assert admission_order(eng) == ["late", "middle", "early"]


def test_priority_fcfs_with_inverted_slo_admits_shortest_waiting_first():
    eng = _queue_one_at_a_time("priority-fcfs", "inverted-slo", _out_of_order_arrivals())
    assert admission_order(eng) == ["late", "middle", "early"]


@pytest.mark.parametrize("scheduler", ["priority-fcfs", "sjf", "reverse-priority"])
def test_ties_on_arrival_go_by_request_id_as_text(scheduler):
    """Same arrival, same prompt, same priority: the IDs decide, compared as text as BLIS
    compares them, so request_10 comes before request_9 (found by benchmarks/parity_fuzz.py:
    with several clients arriving in the same microsecond, ordering them by index made the
    queue order, and every later step, differ from BLIS-Mar's)."""
    reqs = [new_req(f"request_{i}", 50, 2, arrival=100) for i in (9, 10, 1, 2)]
    eng = _queue_one_at_a_time(scheduler, "slo-based", reqs)
    assert admission_order(eng) == ["request_1", "request_10", "request_2", "request_9"]


def _requests_of_classes() -> list[Request]:
    classes = ["background", "", "critical", "batch", "standard", "sheddable"]
    return [
        new_req(f"request_{i}", 50, 2, arrival=100 + i, slo_class=c) for i, c in enumerate(classes)
    ]


def test_slo_class_priority_serves_the_most_urgent_class_first():
    """The current BLIS's static priority: vLLM priority critical 0, standard (or no class) 1,
    batch 5, sheddable 6, background 7; priority-fcfs serves the lowest first, reverse-priority
    the highest, ties by arrival then ID."""
    eng = _queue_one_at_a_time("priority-fcfs", "slo-class", _requests_of_classes())
    assert admission_order(eng) == [f"request_{i}" for i in (2, 1, 4, 3, 5, 0)]
    # Most urgent last; the unclassed and standard requests tie and go by arrival.
    eng = _queue_one_at_a_time("reverse-priority", "slo-class", _requests_of_classes())
    assert admission_order(eng) == [f"request_{i}" for i in (0, 5, 3, 1, 4, 2)]


def test_slo_based_priority_is_one_per_second_waited():
    eng = make_engine(scheduler="priority-fcfs", priority_policy="slo-based")
    r = new_req("a", 10, 2, arrival=0)
    eng.enqueue(r, 0)
    eng.plan_step(2_500_000)
    # Priority is recomputed for queued requests at the step's start: 2.5 s waited -> 2.5.
    assert r.priority == pytest.approx(2.5)


@pytest.mark.parametrize(("field", "value"), [("scheduler", "lifo"), ("priority_policy", "urgent")])
def test_unknown_scheduler_or_priority_policy_is_a_config_error(field, value):
    with pytest.raises(ConfigError, match=value):
        make_engine(**{field: value})


# ---------------------------------------------------------------------------- cancel


def test_cancel_a_queued_request():
    eng = make_engine()
    r = new_req("a", 10, 5, deadline_us=2000)
    eng.enqueue(r, 0)
    assert eng.cancel(r, 2000) is True
    assert r.state is RequestState.TIMED_OUT and r.completion_us == 2000
    assert not eng.waiting and eng.timed_out == 1
    assert eng.plan_step(2000) is None  # nothing left to do
    assert eng.cancel(r, 2001) is False  # already finished: no double count
    assert eng.timed_out == 1


def test_cancel_a_running_request_releases_its_kv():
    eng = make_engine(block_size=16)
    r = new_req("a", 40, 50)
    other = new_req("b", 20, 50)
    eng.enqueue(r, 0)
    eng.enqueue(other, 0)
    d = Driver(eng)
    d.step()
    assert eng.kv.used_blocks == 3 + 2  # ceil(40/16) + ceil(20/16)
    assert eng.cancel(r, d.now) is True
    assert r.state is RequestState.TIMED_OUT
    assert eng.running == [other]
    assert eng.kv.used_blocks == 2 and r.block_ids == []
    assert eng.timed_out == 1
    eng.check_invariants()
    d.run()
    assert other.state is RequestState.COMPLETED
    assert eng.completed == [other]


def test_cancel_of_a_completed_request_is_a_no_op():
    eng = make_engine()
    r = new_req("a", 10, 1)
    eng.enqueue(r, 0)
    Driver(eng).run()
    assert r.state is RequestState.COMPLETED
    assert eng.cancel(r, 5000) is False
    assert eng.timed_out == 0 and r.state is RequestState.COMPLETED
