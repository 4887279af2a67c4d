"""QA round 9, engine: the blocks a speculative step's accepted tokens fill are hashed at the
step's end; a zero-output request's TTFT is its prefill's end, as BLIS records it; and the
step log counts the tokens of requests whose client timed out during the step, which the
step's time prices (docs/engine.md, docs/behaviour.md §1.4, docs/results.md)."""

from __future__ import annotations

import pytest

import simulator
from simulator.engine.batching import EngineConfig, VLLMEngine
from simulator.engine.request import Request, RequestState
from simulator.engine.speculative import (
    AcceptanceModel,
    EagleDrafter,
    NgramDrafter,
    SpeculativeConfig,
)
from simulator.rng import subsystem_rng

BLOCK = 16


# ------------------------------------------------------------------ 1. speculative hashing
def _session(speculative: dict | None, reference: bool = False) -> simulator.Result:
    """Two rounds of one accumulating session: round 0 is 133 prompt + 142 output tokens; round
    1's prompt (408 = 133 + 142 + 133) holds all of round 0's content."""
    scenario = {
        "seed": 1,
        "engine": {"total_kv_blocks": 20_000},
        "speculative": speculative,
        "workload": {
            "version": "2",
            "aggregate_rate": 1,
            "num_requests": 1,
            "clients": [
                {
                    "id": "a",
                    "rate_fraction": 1,
                    "arrival": {"process": "poisson"},
                    "input_distribution": {"type": "constant", "params": {"value": 133}},
                    "output_distribution": {"type": "constant", "params": {"value": 142}},
                    "reasoning": {
                        "multi_turn": {
                            "max_rounds": 2,
                            "think_time_us": 200_000,
                            "context_growth": "accumulate",
                        }
                    },
                }
            ],
        },
    }
    if speculative is None:
        del scenario["speculative"]
    return simulator.simulate(scenario, warn_unsteady=False, reference=reference)


SPECS = [
    {"method": m, "num_speculative_tokens": k, "acceptance_rate": a}
    for m, k, a in (
        ("ngram", 7, 1.0),
        ("ngram", 3, 0.7),
        ("eagle", 3, [0.8, 0.7, 0.6]),
        ("eagle", 5, 0.9),
        ("ngram", 4, 0.0),
    )
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['method']}-{s['acceptance_rate']}")
def test_next_round_finds_every_full_block_of_the_previous_one_with_speculation(spec):
    # Round 0's KV holds its prompt and every output token but the last (whose KV no step
    # computes): 133 + 142 - 1 = 274 tokens, 274 // 16 = 17 full blocks = 272 tokens, all of
    # them in round 1's prompt. Speculation changes how the tokens arrive, not which are
    # computed: a burst past the output's end is discarded (the content stops at 275 tokens,
    # still 17 full blocks). Before the fix the blocks filled by round 0's last accepted burst
    # were never hashed: 256 with ngram k=7 at acceptance 1.0.
    plain = _session(None).requests.set_index("request_id")
    assert plain.loc["sess_a_0_round_1", "cached_tokens"] == 272
    result = _session(spec)
    rounds = result.requests.set_index("request_id")
    assert rounds.loc["sess_a_0_round_1", "input_tokens"] == 408
    assert rounds.loc["sess_a_0_round_1", "cached_tokens"] == 272 == (133 + 142 - 1) // 16 * 16
    ref = _session(spec, reference=True)
    assert ref.summary == result.summary
    assert ref.blis_request_records() == result.blis_request_records()


def _spec_config(rates, drafter, k: int = 3, **engine) -> EngineConfig:
    spec = SpeculativeConfig(drafter, k, AcceptanceModel(rates), {})
    return EngineConfig(speculative=spec, **engine)


def _drive(engine: VLLMEngine, requests: list[Request]) -> None:
    now = 0
    for r in requests:
        engine.enqueue(r, 0)
    while engine.has_work:
        batch = engine.plan_step(now)
        engine.dropped_while_planning.clear()
        duration = 10 + batch.extra_us
        engine.finish_step(duration)
        now += duration
        engine.check_invariants()


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(total_kv_blocks=40, max_num_scheduled_tokens=256),
        _spec_config(1.0, NgramDrafter(), k=7, total_kv_blocks=40, max_num_scheduled_tokens=256),
        _spec_config(0.7, NgramDrafter(), total_kv_blocks=40, max_num_scheduled_tokens=256),
        _spec_config(
            [0.9, 0.8, 0.7],
            EagleDrafter(lambda n, c: 3),
            total_kv_blocks=48,
            max_num_scheduled_tokens=256,
        ),
    ],
    ids=["plain", "ngram-1.0", "ngram-0.7", "eagle"],
)
@pytest.mark.parametrize("private", [False, True], ids=["hashed-at-once", "deferred"])
def test_a_preemption_victim_finds_all_its_own_full_blocks_right_after_eviction(
    config, private, monkeypatch
):
    """The law: a victim's KV holds its first `computed_tokens` tokens; every block full of
    them is findable in the prefix cache as soon as the victim is evicted (its content is its
    own, so the index names its blocks), whatever the speculation."""
    engine = VLLMEngine(config)
    engine.seed_speculation(subsystem_rng(3, "speculative"))
    checked = []
    evict = VLLMEngine._evict_for_recompute

    def evict_and_check(self, victim):
        computed = victim.computed_tokens
        known = min(computed, victim.input_tokens + victim.generated_tokens)
        evict(self, victim)
        found = self.kv.cached_prefix_blocks(victim, known)
        checked.append((victim.request_id, known, len(found)))
        assert len(found) == known // BLOCK, (victim.request_id, known, len(found))

    monkeypatch.setattr(VLLMEngine, "_evict_for_recompute", evict_and_check)
    requests = []
    for i in range(8):
        r = Request(f"r{i}", 0, 60 + 7 * i, 90 + 11 * i)
        if private:
            r.private_from_token = 0  # its blocks' hashing waits for its release
        requests.append(r)
    _drive(engine, requests)
    assert all(r.state is RequestState.COMPLETED for r in requests)
    # Victims that had decoded past a full block, so the law had blocks to find.
    assert sum(1 for _, known, found in checked if found and known > 100) >= 3, checked


def test_speculation_runs_with_preemption_are_the_same_on_the_reference_path():
    kw = {
        "workload__num_requests": 120,
        "workload__rate": 40,
        "engine__total_kv_blocks": 400,
        "speculative": {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.8},
        "warn_unsteady": False,
    }
    fast = simulator.simulate("scenarios/quickstart.yaml", **kw)
    slow = simulator.simulate("scenarios/quickstart.yaml", reference=True, **kw)
    assert fast.summary["preemption_count"] > 0
    assert fast.summary == slow.summary
    assert fast.blis_request_records() == slow.blis_request_records()
    assert fast.steps.equals(slow.steps)


# ------------------------------------------------------------------ 2. zero-output TTFT
def test_a_zero_output_request_has_its_prefill_end_as_ttft_as_blis_records_it():
    """BLIS sets TTFT for every request that finishes its prefill (SPEC Part B §1.4 Phase B) and
    averages it over them; a PD prefill instance's TTFT is its zero-output sub-requests'
    (tests/cluster/test_blis_current_pd_parity.py). servesim keeps it, without α2: no token is
    delivered, and the request completes at the step's end (docs/behaviour.md §1.4)."""
    engine = VLLMEngine(EngineConfig(max_num_scheduled_tokens=64), output_token_processing_us=100)
    zero = Request("z", 0, 100, 0)
    one = Request("o", 0, 20, 1)
    engine.enqueue(zero, 0)
    engine.enqueue(one, 0)
    now = 0
    while engine.has_work:
        engine.plan_step(now)
        engine.finish_step(1000)
        now += 1000
    # Step 1 (0-1000): 64 of z's 100 tokens. Step 2 (1000-2000): z's last 36 and o's 20 with
    # its one token, delivered at 2000 + 1 * 100.
    assert zero.state is RequestState.COMPLETED and zero.generated_tokens == 0
    assert zero.first_token_us == zero.completion_us == 2000
    assert one.first_token_us == one.completion_us == 2100


# ------------------------------------------------------------------ 3. the step log
def test_a_step_log_row_counts_requests_that_timed_out_during_the_step():
    engine = VLLMEngine(EngineConfig(max_num_scheduled_tokens=1000))
    a = Request("a", 0, 300, 5)
    b = Request("b", 0, 200, 5)
    engine.enqueue(a, 0)
    engine.enqueue(b, 0)
    batch = engine.plan_step(0)
    assert batch.prefill_chunks == [(0, 300), (0, 200)]
    engine.cancel(a, 500)  # its client gives up in the middle of the step
    engine.finish_step(1000)
    steps = engine.steps
    # The step was priced for both prompts (500 tokens, 2 requests): its row says so.
    assert list(steps.batch_size) == [2]
    assert list(steps.prefill_tokens) == [500]
    assert list(steps.decode_tokens) == [0]
    assert list(steps.running_requests) == [1]
    # Next step: b decodes its second token, a is gone; then b's decode times out mid-step.
    engine.plan_step(1000)
    engine.cancel(b, 1500)
    engine.finish_step(1000)
    assert list(steps.batch_size) == [2, 1]
    assert list(steps.decode_tokens) == [0, 1]
    assert a.state is b.state is RequestState.TIMED_OUT
    assert engine.total_output_tokens == 1  # b's first token: nothing timed out was delivered


TIMEOUTS = {
    "workload__num_requests": 400,
    "workload__rate": 200,
    "horizon_us": 1_500_000,
    "workload__timeout_us": 800_000,
    "warn_unsteady": False,
}


@pytest.mark.parametrize("spec", [None, SPECS[1]], ids=["plain", "speculative"])
def test_every_step_log_row_is_the_batch_its_time_priced(spec, monkeypatch):
    """The QA's case: 157 requests time out, many during steps; a step priced for 23 requests
    (8,186 prompt tokens) was logged with batch_size 0 and no tokens. Now every row holds the
    planned batch: its requests, its prompt tokens, and a token per decoding request (a
    verification logs its accepted drafts + 1, at most the 1 + k' it verified), on the
    reference path, where every step is planned one by one; the accelerated path logs the
    same rows."""
    planned = {}
    plan = VLLMEngine.plan_general_step

    def plan_and_note(self, now_us):
        batch = plan(self, now_us)
        served = [r for r in self._active if r.num_new_tokens]
        decoding = [r.num_new_tokens for r in served if not r.in_prefill]
        prefill = sum(r.num_new_tokens for r in served if r.in_prefill)
        assert len(served) == len(batch.prefill_chunks) + batch.decode_count
        planned[now_us] = (len(served), prefill, decoding)
        return batch

    monkeypatch.setattr(VLLMEngine, "plan_general_step", plan_and_note)
    kw = {**TIMEOUTS, **({"speculative": spec} if spec else {})}
    slow = simulator.simulate("scenarios/quickstart.yaml", reference=True, **kw)
    assert slow.summary["timed_out_requests"] > 100
    steps = slow.steps
    # Every planned step but the one the horizon cut is logged.
    assert len(planned) - 1 == len(steps)
    for start, size, prefill, decode in zip(
        steps.start_us, steps.batch_size, steps.prefill_tokens, steps.decode_tokens, strict=True
    ):
        p_size, p_prefill, decoding = planned[int(start)]
        assert (size, prefill) == (p_size, p_prefill)
        if spec is None:
            assert decode == len(decoding)
        else:
            assert len(decoding) <= decode <= sum(decoding)
    monkeypatch.setattr(VLLMEngine, "plan_general_step", plan)
    fast = simulator.simulate("scenarios/quickstart.yaml", **kw)
    assert fast.steps.equals(steps)
    assert fast.summary == slow.summary


def test_the_qa_step_is_logged_as_priced():
    r = simulator.simulate("scenarios/quickstart.yaml", **TIMEOUTS)
    last = r.steps.iloc[-1]
    # The run's last step: every request in it times out before it ends (nothing runs after).
    assert last.running_requests == 0
    assert (last.batch_size, last.prefill_tokens, last.decode_tokens) == (23, 8186, 6)


def test_steady_decoders_that_time_out_mid_step_are_in_its_row_on_both_paths():
    """12 requests decode 2,000 tokens each and all time out while decoding, mostly during
    steps of steady decoders alone (`SteadyDecoders.finish_and_plan`, which writes its own row):
    a decode-only step after one that left nothing queued serves exactly the requests running
    at that step's start, the one that times out during it included. Before the fix the
    accelerated row left it out (e.g. 11 where 12 were priced) and the run's last step showed
    a stale 12; the reference path and the accelerated one log the same rows."""
    kw = {
        "workload__num_requests": 12,
        "workload__rate": 50,
        "workload__timeout_us": 600_000,
        "workload__output_tokens": {"distribution": "constant", "value": 2000},
        "workload__prompt_tokens": {"distribution": "constant", "value": 100},
        "warn_unsteady": False,
    }
    fast = simulator.simulate("scenarios/quickstart.yaml", **kw)
    slow = simulator.simulate("scenarios/quickstart.yaml", reference=True, **kw)
    assert fast.summary["timed_out_requests"] == 12
    assert fast.steps.equals(slow.steps)
    s = fast.steps
    decode_only = 0
    for i in range(1, len(s)):
        if s.queue_length.iat[i - 1] == 0 and s.prefill_tokens.iat[i] == 0:
            decode_only += 1
            assert s.batch_size.iat[i] == s.decode_tokens.iat[i] == s.running_requests.iat[i - 1]
    assert decode_only > 100
    assert s.running_requests.iat[-1] == 0 and s.batch_size.iat[-1] == 1
