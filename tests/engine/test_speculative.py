"""Speculative decoding (docs/speculative.md): the acceptance model, the drafters' prices, and
the engine's laws with speculation on — tokens delivered equal the output length, KV blocks are
conserved through rejections, a verification is priced as its equivalent batch, and the
accelerations stay exact."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.engine.batching import EngineConfig, VLLMEngine
from simulator.engine.request import Request, RequestState
from simulator.engine.speculative import (
    AcceptanceModel,
    DraftModelDrafter,
    EagleDrafter,
    NgramDrafter,
    Speculation,
    SpeculativeConfig,
    layer_share_price,
    reserve_kv_blocks,
)
from simulator.errors import ConfigError
from simulator.latency.base import StepBatch
from simulator.latency.roofline import RooflineModel
from simulator.rng import subsystem_rng


def _config(k: int = 3, rates=0.7, drafter=None, by_client=None, **engine) -> EngineConfig:
    spec = SpeculativeConfig(
        drafter or NgramDrafter(),
        k,
        AcceptanceModel(rates),
        {c: AcceptanceModel(r) for c, r in (by_client or {}).items()},
    )
    return EngineConfig(speculative=spec, **engine)


def _run(engine: VLLMEngine, requests: list[Request], step_us=lambda b: 10, check=True) -> int:
    """Drive the engine step by step until it has no work; returns the end time."""
    now = 0
    for r in requests:
        engine.enqueue(r, 0)
    while engine.has_work:
        batch = engine.plan_step(now)
        engine.dropped_while_planning.clear()
        duration = step_us(batch) + batch.extra_us
        engine.finish_step(duration)
        now += duration
        if check:
            engine.check_invariants()
    return now


# ---------------------------------------------------------------- the acceptance model


def test_expected_tokens_by_hand():
    # α = 0.7, k = 3: 1 + 0.7 + 0.49 + 0.343 = 2.533 = (1 − 0.7⁴) / (1 − 0.7) = 0.7599 / 0.3.
    model = AcceptanceModel(0.7)
    assert model.expected_tokens(3) == pytest.approx(2.533)
    assert model.expected_tokens(3) == pytest.approx((1 - 0.7**4) / (1 - 0.7))
    # Per position (0.8, 0.5, then 0.5 repeats), k = 3: 1 + 0.8 + 0.4 + 0.2 = 2.4.
    assert AcceptanceModel([0.8, 0.5]).expected_tokens(3) == pytest.approx(2.4)
    assert AcceptanceModel(1.0).expected_tokens(4) == 5  # every draft accepted
    assert AcceptanceModel(0.0).expected_tokens(4) == 1  # only the target's own token


@given(alpha=st.floats(0.01, 0.99), k=st.integers(1, 12))
def test_expected_tokens_is_the_geometric_sum(alpha, k):
    assert AcceptanceModel(alpha).expected_tokens(k) == pytest.approx(
        (1 - alpha ** (k + 1)) / (1 - alpha)
    )


def test_accepted_drafts_invert_the_survival_function():
    # α = (0.8, 0.5): P(≥1) = 0.8, P(≥2) = 0.4, P(≥3) = 0.2 (k = 3).
    model = AcceptanceModel([0.8, 0.5])
    assert [model.accepted(u, 3) for u in (0.0, 0.19, 0.2, 0.39, 0.4, 0.79, 0.8, 0.99)] == [
        3, 3, 2, 2, 1, 1, 0, 0,
    ]  # fmt: skip
    assert model.accepted(0.1, 1) == 1  # never more than k


@given(
    rates=st.lists(st.floats(0, 1), min_size=1, max_size=5),
    k=st.integers(1, 8),
    u=st.floats(0, 1, exclude_max=True),
)
def test_accepted_count_is_between_0_and_k_and_monotone_in_u(rates, k, u):
    model = AcceptanceModel(rates)
    a = model.accepted(u, k)
    assert 0 <= a <= k
    assert model.accepted(u / 2, k) >= a  # a smaller draw never accepts fewer


def test_bad_rates_are_refused():
    for bad in (1.5, -0.1, [], [0.5, 2], "0.5", True):
        with pytest.raises((ValueError, TypeError)):
            AcceptanceModel(bad)


def test_proposals_are_cut_by_budget_and_context_limit():
    spec = Speculation(SpeculativeConfig(NgramDrafter(), 4, AcceptanceModel(0.5)))
    assert spec.proposals(100, 10, 0) == 4
    assert spec.proposals(3, 10, 0) == 2  # 3 tokens left: the sampled one and 2 drafts
    assert spec.proposals(1, 10, 0) == 0
    # max_model_len 15, 10 tokens in KV: positions 10 .. 13 at most (vLLM keeps one back).
    assert spec.proposals(100, 10, 15) == 3


def test_draws_are_seeded_and_reproducible():
    def draws(seed: int) -> list[int]:
        spec = Speculation(SpeculativeConfig(NgramDrafter(), 4, AcceptanceModel(0.6)))
        spec.seed(subsystem_rng(seed, "speculative/instance_0"))
        return [spec.draw_accepted("c", 4) for _ in range(200)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


def test_draws_match_the_expected_length_within_2_percent_over_10k():
    for rates, k in ((0.7, 3), (0.6, 5), ([0.9, 0.8, 0.6], 4)):
        spec = Speculation(SpeculativeConfig(NgramDrafter(), k, AcceptanceModel(rates)))
        spec.seed(subsystem_rng(7, "draws"))
        n = 10_000
        mean = sum(spec.draw_accepted("", k) + 1 for _ in range(n)) / n
        assert mean == pytest.approx(AcceptanceModel(rates).expected_tokens(k), rel=0.02)


# ---------------------------------------------------------------- drafters


def test_draft_model_runs_k_sequential_passes():
    # A pass over n requests whose contexts sum to c costs 100 + n + c // 1000 µs. k = 3,
    # 2 requests at contexts summing to 2000: passes at 2000, 2002, 2004 -> 104 each = 312,
    # plus a 5 µs overhead.
    drafter = DraftModelDrafter(lambda n, c: 100 + n + c // 1000, overhead_us=5)
    assert drafter.draft_us(2, 2000, 3) == 5 + 3 * 104
    assert drafter.draft_us(0, 0, 3) == 0  # nothing to draft for: no cost


def test_eagle_head_is_its_share_of_the_target_decode_step():
    # 1 of 80 layers: a 4,000 µs target decode step makes a 50 µs head pass.
    price = layer_share_price(lambda n, c: 4000, 1, 80)
    assert price(8, 1000) == 50
    assert EagleDrafter(price).draft_us(8, 1000, 3) == 150
    assert NgramDrafter(7).draft_us(8, 1000, 3) == 7
    assert NgramDrafter().reserves_lookahead is False and EagleDrafter(price).reserves_lookahead


def test_reserve_kv_blocks_by_hand():
    # 1,000 blocks in a 100 GiB pool; 10 GiB of drafter weights; its KV 25 % of the target's:
    # 1000 × 90/100 / 1.25 = 720.
    gib = 2**30
    assert reserve_kv_blocks(1000, 100 * gib, 10 * gib, 0.25, "x") == 720
    with pytest.raises(ConfigError, match="speculative"):
        reserve_kv_blocks(1000, 100 * gib, 100 * gib, 0.0, "speculative")


# ---------------------------------------------------------------- the engine


def test_verification_is_priced_as_its_equivalent_batch():
    """A decoding request with k drafts is a chunk of k + 1 query tokens over its context;
    the step costs the model's price of that batch (n-gram drafting is free)."""
    model = RooflineModel(load_model("meta-llama/llama-3.1-8b-instruct"), get_gpu("H100"), 1)
    engine = VLLMEngine(_config(k=3))
    a, b = Request("a", 0, 100, 50), Request("b", 0, 40, 50)
    for r in (a, b):
        engine.enqueue(r, 0)
    engine.finish_step(model.step_time_us(engine.plan_step(0)))  # both prefills
    assert a.generated_tokens == b.generated_tokens == 1
    batch = engine.plan_step(1000)
    # Contexts 100 and 40 (the prompts' KV); the sampled token and 3 drafts each.
    equivalent = StepBatch([(100, 4), (40, 4)], 0, 0, [104, 44])
    assert batch == equivalent
    assert batch.extra_us == 0
    assert model.step_time_us(batch) == model.step_time_us(equivalent)
    assert engine.prefill_requests() == [a, b]


def test_draft_cost_is_added_to_the_step():
    drafter = DraftModelDrafter(lambda n, c: 10 * n + c // 100)
    engine = VLLMEngine(_config(k=2, drafter=drafter))
    r = Request("a", 0, 300, 50)
    engine.enqueue(r, 0)
    engine.plan_step(0)
    engine.finish_step(5)  # the prefill
    batch = engine.plan_step(5)
    # One request at context 300, two passes: (10 + 3) + (10 + 3) = 26 µs.
    assert batch.prefill_chunks == [(300, 3)]
    assert batch.extra_us == 26
    engine.finish_step(100 + batch.extra_us)
    assert engine.speculation.stats.draft_us == 26


def test_budget_trims_the_drafts():
    engine = VLLMEngine(_config(k=4, max_num_scheduled_tokens=7))
    reqs = [Request(f"r{i}", 0, 2, 50) for i in range(3)]
    for r in reqs:
        engine.enqueue(r, 0)
    engine.plan_step(0)
    engine.finish_step(5)  # prefills of 2 tokens each (6 of 7)
    batch = engine.plan_step(5)
    # 7 tokens: the first request takes 1 + 4, the second the 2 left (1 + 1), the third none.
    assert batch.prefill_chunks == [(2, 5), (2, 2)]
    assert batch.decode_count == 0
    assert [r.num_new_tokens for r in reqs] == [5, 2, 0]


def test_a_burst_arrives_at_once_and_counts_its_gaps():
    # Every draft accepted (α = 1), k = 3, 9 output tokens: prefill gives token 1, then two
    # verifications give 4 each.
    engine = VLLMEngine(_config(k=3, rates=1.0))
    r = Request("a", 0, 10, 9)
    end = _run(engine, [r], step_us=lambda b: 100)
    assert r.state is RequestState.COMPLETED and r.generated_tokens == 9
    assert end == 300 and r.first_token_us == 100 and r.completion_us == 300
    stats = engine.speculation.stats
    assert (stats.verifications, stats.proposed, stats.accepted) == (2, 6, 6)
    # 8 gaps: each burst's first token 100 µs after the last one, the other 3 + 3 at once.
    assert stats.burst_gaps == 6
    assert sum(engine.steps.itl_regular_count) == 2


def test_tokens_past_the_output_are_discarded():
    engine = VLLMEngine(_config(k=4, rates=1.0))
    r = Request("a", 0, 10, 3)  # the first verification could give 5; 2 are left
    _run(engine, [r])
    assert r.generated_tokens == 3 and engine.total_output_tokens == 3
    assert engine.speculation.stats.accepted == 4  # what vLLM counts: before the stop check


def test_acceptance_per_client():
    # Client "sure" accepts every draft, "never" none: with k = 3 and 13 output tokens, "sure"
    # needs 3 verifications (1 + 4 + 4 + 4), "never" 12.
    engine = VLLMEngine(_config(k=3, rates=0.5, by_client={"sure": 1.0, "never": 0.0}))
    sure = Request("s", 0, 10, 13, client_id="sure")
    never = Request("n", 0, 10, 13, client_id="never")
    _run(engine, [sure, never], step_us=lambda b: 100)
    assert sure.completion_us == 100 + 3 * 100
    assert never.completion_us == 100 + 12 * 100


def test_simulated_mean_acceptance_length_within_2_percent():
    # 4 requests of 8,000 output tokens: about 12,600 verifications at α = 0.7, k = 3.
    engine = VLLMEngine(_config(k=3, rates=0.7))
    engine.seed_speculation(subsystem_rng(3, "speculative/instance_0"))
    reqs = [Request(f"r{i}", 0, 64, 8000) for i in range(4)]
    _run(engine, reqs, check=False)
    stats = engine.speculation.stats
    assert stats.verifications > 10_000
    mean = 1 + stats.accepted / stats.verifications
    assert mean == pytest.approx((1 - 0.7**4) / (1 - 0.7), rel=0.02)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 120), st.integers(1, 80)), min_size=1, max_size=6),
    k=st.integers(1, 5),
    rates=st.lists(st.floats(0, 1), min_size=1, max_size=3),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 40),
    budget=st.integers(4, 300),
    method=st.sampled_from(["ngram", "eagle"]),
    seed=st.integers(0, 5),
)
def test_laws_with_speculation(sizes, k, rates, block_size, spare_blocks, budget, method, seed):
    """Every request gets exactly its output length (or is dropped as unservable); KV blocks
    are conserved at every step, through rejections and preemptions, and all come back; the
    output-token total is the sum of what requests received."""
    drafter = NgramDrafter() if method == "ngram" else EagleDrafter(lambda n, c: 3)
    biggest = max(i + 1 for i, _ in sizes)
    blocks = math.ceil(biggest / block_size) + spare_blocks
    engine = VLLMEngine(
        _config(
            k,
            rates,
            drafter,
            total_kv_blocks=blocks,
            block_size=block_size,
            max_num_scheduled_tokens=budget,
        )
    )
    engine.seed_speculation(subsystem_rng(seed, "speculative/instance_0"))
    reqs = [Request(f"r{i}", 0, n_in, n_out) for i, (n_in, n_out) in enumerate(sizes)]
    lookahead = k if method == "eagle" else 0

    def step(batch: StepBatch) -> int:
        for r in engine.running:
            if r.num_new_tokens and not r.in_prefill:
                # A speculating request holds KV for its verified tokens at least, and for
                # the sampled token, the drafts and the lookahead at most.
                need = r.computed_tokens + r.num_new_tokens + lookahead
                assert len(r.block_ids) <= max(-(-need // block_size), 1)
                assert len(r.block_ids) >= -(-r.computed_tokens // block_size)
        return 10

    _run(engine, reqs, step)
    assert engine.kv.used_blocks == 0
    for r in reqs:
        assert r.state in (RequestState.COMPLETED, RequestState.DROPPED), r
        if r.state is RequestState.COMPLETED:
            assert r.generated_tokens == r.output_tokens
    assert engine.total_output_tokens == sum(r.generated_tokens for r in reqs)
    stats = engine.speculation.stats
    assert sum(stats.accepted_histogram) == stats.verifications
    assert stats.accepted <= stats.proposed <= k * stats.verifications


# ---------------------------------------------------------------- whole runs

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.7}
SMALL = {"workload__num_requests": 150, "warn_unsteady": False}


def test_accelerated_and_reference_runs_are_identical():
    spec = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": [0.8, 0.6]}
    kw = {**SMALL, "speculative": spec, "cluster__num_instances": 2}
    fast = simulator.simulate("scenarios/quickstart.yaml", **kw)
    slow = simulator.simulate("scenarios/quickstart.yaml", reference=True, **kw)
    assert fast.summary == slow.summary
    assert fast.blis_request_records() == slow.blis_request_records()


def test_runs_are_deterministic_per_seed():
    a = simulator.simulate("scenarios/quickstart.yaml", speculative=SPEC, **SMALL)
    b = simulator.simulate("scenarios/quickstart.yaml", speculative=SPEC, **SMALL)
    c = simulator.simulate("scenarios/quickstart.yaml", speculative=SPEC, seed=7, **SMALL)
    assert a.summary == b.summary
    assert a.summary["spec_accepted_tokens"] != c.summary["spec_accepted_tokens"]


def test_summary_fields_only_when_speculating():
    off = simulator.simulate("scenarios/quickstart.yaml", **SMALL)
    on = simulator.simulate("scenarios/quickstart.yaml", speculative=SPEC, **SMALL)
    assert not any(key.startswith("spec_") for key in off.summary)
    assert off.speculative_metrics is None and "=== Speculative" not in off.report_text()
    extra = set(on.summary) - set(off.summary)
    assert extra == {
        "spec_verifications",
        "spec_proposed_tokens",
        "spec_accepted_tokens",
        "spec_acceptance_rate",
        "spec_mean_acceptance_length",
        "spec_draft_time_share",
        "spec_verify_time_share",
        "spec_in_burst_itl_share",
    }
    assert on.summary["total_output_tokens"] == off.summary["total_output_tokens"]
    assert "=== Speculative Decoding ===" in on.report_text()
    assert on.results_document()["speculative"]["spec_accepted_length_histogram"]
    # Speculation delivers the same tokens; n-gram drafting is free, so it only saves steps.
    assert len(on.steps) < len(off.steps)


@settings(max_examples=4, deadline=None)
@given(alpha=st.floats(0.6, 1.0), k=st.integers(1, 4), rate=st.floats(2, 10))
def test_itl_with_cheap_drafts_is_no_worse_at_equal_load(alpha, k, rate):
    kw = {**SMALL, "workload__num_requests": 100, "workload__rate": rate}
    off = simulator.simulate("scenarios/quickstart.yaml", **kw)
    spec = {"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": alpha}
    on = simulator.simulate("scenarios/quickstart.yaml", speculative=spec, **kw)
    assert on.summary["itl_mean_ms"] <= off.summary["itl_mean_ms"]
    assert on.summary["e2e_mean_ms"] <= off.summary["e2e_mean_ms"]


def test_the_drafter_takes_kv_capacity_from_an_auto_sized_cache():
    base = {"model": "meta-llama/llama-3.1-70b-instruct", "tp": 4, "hardware": "H100"}
    plain = simulator.resolve_deployment(simulator.Scenario(**base))
    spec = {
        "method": "draft_model",
        "draft_model": "meta-llama/llama-3.1-8b-instruct",
        "num_speculative_tokens": 4,
        "acceptance_rate": 0.7,
    }
    drafted = simulator.resolve_deployment(simulator.Scenario(**base, speculative=spec))
    assert drafted.engine.total_kv_blocks < plain.engine.total_kv_blocks
    assert drafted.kv_blocks_source.startswith("auto, less the draft_model")
    # An explicit count is taken as given.
    explicit = simulator.Scenario(**base, speculative=spec, engine={"total_kv_blocks": 5000})
    assert simulator.resolve_deployment(explicit).engine.total_kv_blocks == 5000


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5},
         "needs `draft_model`"),
        ({"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 1.5},
         "speculative.acceptance_rate"),
        ({"method": "eagle", "num_speculative_tokens": 0, "acceptance_rate": 0.5},
         "speculative.num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5,
          "draft_layers": 2}, "draft_layers applies to methods eagle and mtp"),
        ({"method": "medusa", "num_speculative_tokens": 2, "acceptance_rate": 0.5},
         "speculative.method"),
        # More per-position rates than drafted tokens: the extra ones were ignored.
        ({"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": [0.9, 0.8, 0.7]},
         r"^speculative\.acceptance_rate: invalid value \[0\.9, 0\.8, 0\.7\]; 3 per-position"),
        # The draft's TP, not the target's `tp` (which is fine).
        ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5,
          "draft_model": "meta-llama/llama-3.1-8b-instruct", "draft_tp": 3},
         r"^speculative\.draft_tp: invalid value 3; must divide num_attention_heads=32"),
        # The drafter's own names, not the target's (QA: these said "unknown model" alone).
        ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5,
          "draft_model": "nope/x"}, r"^speculative\.draft_model: unknown model 'nope/x'"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5,
          "draft_model": "meta-llama/llama-3.1-8b-instruct", "draft_latency_model": "bogus"},
         r"^speculative\.draft_latency_model \(pricing the draft model\): unknown latency"),
        # A path the loader cannot read blamed the target's `model` field.
        ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5,
          "draft_model": "./nope.json"},
         r"^speculative\.draft_model: path '\./nope\.json' does not exist"),
        # A drafter has no coefficients to give: the advice is another latency model.
        ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5,
          "draft_model": "meta-llama/llama-3.1-8b-instruct", "draft_latency_model": "blackbox",
          "draft_tp": 4},
         r"^speculative\.draft_latency_model \(pricing the draft model\): blackbox: .*; for "
         r"the draft model alone, set speculative\.draft_latency_model \(e\.g\. roofline\)$"),
    ],
)  # fmt: skip
def test_bad_speculative_sections_name_the_field(spec, message):
    with pytest.raises(ConfigError, match=message):
        simulator.simulate("scenarios/quickstart.yaml", speculative=spec)


def test_mtp_needs_a_model_with_its_own_prediction_layers():
    """vLLM's `mtp` drafts with the model's own multi-token-prediction layers (DeepSeek-V3
    has one: `num_nextn_predict_layers`); a model without them (Llama) is refused rather
    than priced as if it had them."""
    assert load_model("deepseek-ai/deepseek-v3").mtp_layers == 1
    assert load_model("meta-llama/llama-3.1-8b-instruct").mtp_layers == 0
    with pytest.raises(ConfigError, match="speculative.method: invalid value 'mtp'; .*no multi"):
        simulator.simulate(
            {
                "model": "meta-llama/llama-3.1-8b-instruct",
                "speculative": {"method": "mtp", "num_speculative_tokens": 2,
                                "acceptance_rate": 0.7},
                "workload": {"num_requests": 5, "rate": 5},
            }
        )  # fmt: skip
