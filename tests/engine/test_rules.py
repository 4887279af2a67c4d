"""Each engine rule is written once, and every inlined copy says the same (simulator/engine/
batching.py and accelerator.py).

The context limit and the end of a request are `VLLMEngine.context_room` and
`VLLMEngine.tokens_to_end`; `finish_step` writes the end test out by its two reasons and
`_schedule_running` the decode skip, as those loops run for every request in every step; the
accelerator (`SteadyDecoders`, `may_finish_requests`) calls the predicates. The step log's row
is `VLLMEngine._log_step`; `SteadyDecoders.finish_and_plan` writes it out. The laws here pin
each copy to its definition on hand-driven engines.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.accelerator import may_finish_requests
from simulator.engine.batching import NO_CONTEXT_LIMIT, EngineConfig, VLLMEngine
from simulator.engine.options import ACCELERATED, REFERENCE
from simulator.engine.request import Request, RequestState


def _decoding(engine: VLLMEngine, prompt: int, max_output: int, output: int) -> Request:
    """A request that has finished its prefill of `prompt` tokens (its first token out)."""
    req = Request("r", 0, prompt, output, index=0, max_output_tokens=max_output)
    engine.enqueue(req, 0)
    engine.plan_step(0)
    engine.finish_step(100)
    assert not req.in_prefill and req.generated_tokens == 1
    return req


def test_the_context_room_by_hand():
    """max_model_len 100: a request is length-capped when its context reaches 99 tokens.
    Prompt 90 with 5 tokens generated has 94 in KV (the 5th is not yet computed), so 5 more
    may be computed; with no limit the room exceeds any request."""
    engine = VLLMEngine(EngineConfig(max_model_len=100))
    assert engine.context_limit == 99
    assert engine.context_room(90 + 5 - 1) == 5
    assert engine.context_room(99) == 0
    # The prompt is cut at the limit too: a prefill from 95 gets 4 tokens at most.
    assert engine._prefill_chunk(200, 95, 512) == 4  # noqa: SLF001
    assert engine._prefill_chunk(200, 99, 512) == 0  # noqa: SLF001
    unlimited = VLLMEngine(EngineConfig(max_model_len=0))
    assert unlimited.context_limit == NO_CONTEXT_LIMIT
    assert unlimited.context_room(10**9) > 10**15


def test_tokens_to_end_by_hand_and_as_finish_step_applies_it():
    """Prompt 90, an output budget auto-filled to 10 (max_model_len 100), a true length of
    50: with 5 tokens generated, 5 more come (the output alone would allow 45), the last of
    them length-capped; with a true length of 7, 2 more, the last completing it."""
    config = EngineConfig(max_model_len=100)
    engine = VLLMEngine(config)
    assert engine.tokens_to_end(94, 5, 50) == 5
    assert engine.tokens_to_end(94, 5, 7) == 2
    for output, produced, capped in ((50, 10, True), (7, 7, False)):
        engine = VLLMEngine(config, options=REFERENCE)
        req = _decoding(engine, 90, 0, output)
        assert req.max_output_tokens == 10
        now = 100
        while req.state is RequestState.RUNNING:
            left = engine.tokens_to_end(req.computed_tokens, req.generated_tokens, output)
            assert left >= 1
            engine.plan_step(now)
            done = engine.finish_step(100)
            now += 100
            # The token that brings tokens_to_end to 0 is the last one.
            assert (req in done) == (left == 1)
        assert req.generated_tokens == produced
        assert req.length_capped is capped


@st.composite
def engines(draw):
    """A request mix and a small engine without speculation, LoRA or a CPU tier (steps are
    driven by hand here, with no host link for reloads)."""
    block_size = draw(st.sampled_from([1, 4, 16]))
    max_model_len = draw(st.sampled_from([0, 0, 64, 200]))
    requests = []
    t = 0
    for i in range(draw(st.integers(1, 12))):
        t += draw(st.integers(0, 3000))
        prompt = draw(st.integers(1, 150))
        output = draw(st.integers(0, 80))
        # An unknown output budget (0) is filled from max_model_len, so requests get capped.
        max_output = draw(st.sampled_from([None, 0]))
        requests.append(Request(f"r{i}", t, prompt, output, index=i, max_output_tokens=max_output))
    config = EngineConfig(
        total_kv_blocks=draw(st.integers(20, 200)),
        block_size=block_size,
        max_num_running_reqs=draw(st.integers(1, 8)),
        max_num_scheduled_tokens=draw(st.integers(8, 256)),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 32])),
        max_model_len=max_model_len,
        enable_prefix_caching=draw(st.booleans()),
    )
    return requests, config, draw(st.booleans())


def _predicted_completions(engine: VLLMEngine) -> list[Request]:
    """The requests `finish_step` will complete, by `tokens_to_end` (one token per decode)."""
    predicted = []
    for req in engine._active:  # noqa: SLF001
        n = req.num_new_tokens
        if not n:
            continue
        if req.in_prefill:
            after = req.computed_tokens + n
            if after < req.prefill_target:
                continue
            if req.output_tokens == 0:
                predicted.append(req)
                continue
            # The prefill's last chunk yields the first token.
            left = engine.tokens_to_end(after - 1, req.generated_tokens, req.output_tokens)
        else:
            left = engine.tokens_to_end(
                req.computed_tokens, req.generated_tokens, req.output_tokens
            )
        if left <= 1:
            predicted.append(req)
    return predicted


def _last_row(engine: VLLMEngine) -> dict:
    steps = engine.steps
    return dict(zip(steps.written, steps.tail[-1], strict=True)) if steps.tail else {}


def _step_us(decode_count: int, tokens: int) -> int:
    return 200 + 5 * tokens


def _drive(requests, config, fast: bool, finish) -> VLLMEngine:
    """Run `requests` through an engine by hand, as an instance does: a step lasts
    `_step_us`; requests arriving up to its end are enqueued before it finishes; then
    `finish(engine, step_us)` finishes it and returns the duration of the next step when it
    planned one (`SteadyDecoders.finish_and_plan`), else 0."""
    engine = VLLMEngine(config, options=ACCELERATED if fast else REFERENCE)
    pending = sorted(requests, key=lambda r: r.arrival_us)
    now = 0
    planned_us = 0
    for _ in range(20_000):
        if planned_us:
            step_us = planned_us
        else:
            while pending and pending[0].arrival_us <= now:
                engine.enqueue(pending.pop(0), now)
            if not engine.has_work:
                if not pending:
                    return engine
                now = pending[0].arrival_us
                continue
            batch = engine.plan_step(now)
            engine.dropped_while_planning.clear()
            if batch is None:
                continue
            tokens = batch.decode_count + sum(n for _c, n in batch.prefill_chunks)
            step_us = _step_us(batch.decode_count, tokens)
        now += step_us
        while pending and pending[0].arrival_us <= now:
            req = pending.pop(0)
            engine.enqueue(req, req.arrival_us)
        planned_us = finish(engine, step_us)
        engine.check_invariants()
    raise AssertionError("the engine did not drain")


@settings(max_examples=150)
@given(engines())
def test_finish_step_completes_exactly_what_tokens_to_end_says(case):
    """Before every step's finish: the requests it completes are those whose next token is
    their last by `tokens_to_end` (or whose prefill ends with no output), and the
    accelerator's `may_finish_requests` says so exactly (no speculation here)."""
    requests, config, fast = case

    def finish(engine, step_us):
        predicted = _predicted_completions(engine)
        assert may_finish_requests(engine) == bool(predicted)
        done = engine.finish_step(step_us)
        assert sorted(r.index for r in done) == sorted(r.index for r in predicted)
        return 0

    engine = _drive(requests, config, fast, finish)
    assert engine.completed_count + engine.dropped_unservable == len(requests)


@settings(max_examples=150)
@given(engines())
def test_the_all_steady_finish_writes_finish_steps_row(case):
    """Whenever a step served steady requests alone, `SteadyDecoders.finish_and_plan` leaves
    the same log row and counters as the reference's `finish_step` on a copy of the engine
    (for the first 20 such steps of a run: copying the engine is most of this law's time)."""
    requests, config, _fast = case
    compared = []

    def finish(engine, step_us):
        steady = engine.steady
        if engine._active or not steady.count:  # noqa: SLF001
            engine.finish_step(step_us)
            return 0
        if len(compared) >= 20:
            return steady.finish_and_plan(step_us, _step_us)
        reference = copy.deepcopy(engine)
        assert reference.finish_step(step_us) == []
        planned_us = steady.finish_and_plan(step_us, _step_us)
        assert planned_us >= 0
        assert _last_row(engine) == _last_row(reference)
        assert len(engine.steps) == len(reference.steps)
        for name in ("total_output_tokens", "_prev_step_end_us", "clock_us"):
            assert getattr(engine, name) == getattr(reference, name), name
        compared.append(step_us)
        return planned_us

    engine = _drive(requests, config, True, finish)
    assert engine.completed_count + engine.dropped_unservable == len(requests)


@settings(max_examples=300)
@given(
    st.sampled_from([1, 4, 16]),
    st.integers(1, 100),
    st.integers(0, 60),
    st.sampled_from([-1, 0, 30]),
)
def test_the_fast_paths_demand_takes_and_hashes_as_append_token_does(
    block_size, prompt, decoded, private_from
):
    """`SteadyDecoders._demand` predicts a decode token's KV without taking it: the blocks it
    counts are the blocks `KVCache.append_token` takes, and when append_token hashes a block
    `_demand` said it might."""
    engine = VLLMEngine(EngineConfig(total_kv_blocks=1000, block_size=block_size))
    req = Request("r", 0, prompt, decoded + 5, index=0)
    req.private_from_token = min(private_from, prompt - 1)
    computed = prompt + decoded
    kv = engine.kv
    assert kv.try_allocate(req, 0, computed, [])
    req.computed_tokens = computed
    req.prefill_target = prompt
    req.in_prefill = False
    tokens, blocks, may_hash = engine.steady._demand([req], 512)  # noqa: SLF001
    used, hashed = kv.used_blocks, len(kv.hash_index)
    assert kv.append_token(req, computed)
    assert tokens == 1
    assert blocks == kv.used_blocks - used
    if len(kv.hash_index) > hashed:
        assert may_hash


@settings(max_examples=300)
@given(
    st.sampled_from([1, 4, 16]),
    st.integers(1, 100),
    st.integers(0, 3),
    st.integers(1, 120),
    st.one_of(st.none(), st.integers(1, 40)),
)
def test_a_steady_block_take_wakes_next_as_wake_says(
    block_size, prompt, blocks_decoded, output, context_room
):
    """`SteadyDecoders._take_block` writes out `tokens_to_end` to see whether the next block
    start comes before the request's last token; the step it schedules is `_wake`'s. The
    context limit is drawn relative to the request (`context_room` tokens past it, or none),
    so the limit falls on, just before and just after the next block start."""
    computed = -(-prompt // block_size) * block_size + blocks_decoded * block_size
    max_model_len = 0 if context_room is None else computed + 1 + context_room
    engine = VLLMEngine(
        EngineConfig(total_kv_blocks=1000, block_size=block_size, max_model_len=max_model_len)
    )
    generated = computed - prompt + 1
    if engine.tokens_to_end(computed, generated, output) < 2:
        return  # its token at this block start would end it: it is not steady there
    req = Request("r", 0, prompt, output, index=0)
    assert engine.kv.try_allocate(req, 0, computed, [])
    req.computed_tokens, req.generated_tokens = computed, generated
    req.prefill_target = prompt
    req.in_prefill = False
    steady = engine.steady
    # Made steady at its block start as the engine does it: with `_wake`'s answer.
    steady._make_steady(req, *steady._wake(req, computed, generated))  # noqa: SLF001
    steady.wake_heap.clear()
    steady._take_block(req, 0)  # noqa: SLF001
    wake_in, block_only = steady._wake(req, computed + 1, generated + 1)  # noqa: SLF001
    assert (req.wake_step, req.wake_for_block) == (1 + wake_in, block_only)
