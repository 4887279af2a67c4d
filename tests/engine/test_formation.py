"""Batch formation policies (docs/engine.md "Batch formation"): `chunked` (vLLM V1, the
default), `whole-prompt` (Orca-style, no chunking) and `prefill-first` (vLLM V0).

Hand-driven cases with a constant step time show each policy's step shapes and what they do to
token times; laws over random small workloads: every request ends completed or dropped (dropped
only when it can never fit), KV blocks are conserved, a `prefill-first` step never computes
prompts and decodes together, a `whole-prompt` or `prefill-first` prompt is split over steps
only when it was alone and longer than the budget, and every policy's accelerated run equals
its reference run. Whole runs through `simulator.simulate` and the CLI: conservation,
causality, determinism, and unknown names refused with the allowed ones.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig, VLLMEngine
from simulator.engine.formation import (
    BATCH_FORMATIONS,
    BatchFormation,
    make_batch_formation,
)
from simulator.engine.options import ACCELERATED, REFERENCE
from simulator.engine.request import Request, RequestState
from simulator.errors import ConfigError
from simulator.latency.base import StepBatch
from tests.engine.test_fast_paths import _assert_same, _copies
from tests.test_laws import scenarios as engine_scenarios

STEP = 1000  # µs per step
FORMATIONS = ["chunked", "whole-prompt", "prefill-first"]


def make_engine(formation: str, **config) -> VLLMEngine:
    return VLLMEngine(EngineConfig(batch_formation=formation, **config))


class Driver:
    """Back-to-back steps of STEP µs from 0; `arrivals` maps a step index to the requests
    enqueued at that step's start."""

    def __init__(self, eng: VLLMEngine, arrivals: dict[int, list[Request]]) -> None:
        self.eng = eng
        self.arrivals = arrivals
        self.now = 0
        self.batches: list[StepBatch] = []

    def run(self, max_steps: int = 1000) -> list[StepBatch]:
        for k in range(max_steps):
            for req in self.arrivals.get(k, []):
                self.eng.enqueue(req, self.now)
            if not self.eng.has_work and k > max(self.arrivals, default=0):
                return self.batches
            batch = self.eng.plan_step(self.now)
            if batch is not None:
                self.eng.finish_step(STEP)
                self.batches.append(batch)
            self.now += STEP
            self.eng.check_invariants()
        raise AssertionError("engine did not drain")


def shapes(batches: list[StepBatch]) -> list[tuple[list[tuple[int, int]], int]]:
    """Each step as (prefill chunks as (context, tokens), decode count)."""
    return [(b.prefill_chunks, b.decode_count) for b in batches]


# ------------------------------------------------------------------------ registry


def test_policies_are_registered_by_name_and_unknown_names_are_refused():
    assert set(BATCH_FORMATIONS) == set(FORMATIONS)
    assert EngineConfig().batch_formation == "chunked"
    for name, cls in BATCH_FORMATIONS.items():
        assert issubclass(cls, BatchFormation) and cls.name == name
    with pytest.raises(ConfigError) as err:
        make_batch_formation("orca")
    message = str(err.value)
    # The registry names the kind; a scenario's resolution names the field (CLI test below).
    assert message.startswith("unknown batch formation 'orca'")
    assert "chunked, prefill-first, whole-prompt" in message
    with pytest.raises(ConfigError, match="batch formation"):
        VLLMEngine(EngineConfig(batch_formation="orca"))


def test_only_a_policy_that_lets_running_requests_wait_turns_the_fast_path_off():
    assert make_engine("chunked").fast_path
    assert make_engine("whole-prompt").fast_path
    assert not make_engine("prefill-first").fast_path


# ------------------------------------------------------------------------ prefill-first


def _decoder_and_newcomer(formation: str) -> tuple[Request, Request, VLLMEngine, list]:
    """a (100-token prompt, 5 tokens) from step 0; b (100, 3) enqueued at step 2's start,
    while a decodes. Budget 2048, so every prompt fits a step whole."""
    a = Request("a", 0, 100, 5)
    b = Request("b", 2 * STEP, 100, 3)
    eng = make_engine(formation)
    batches = Driver(eng, {0: [a], 2: [b]}).run()
    return a, b, eng, batches


def test_prefill_first_stalls_decoders_in_the_step_that_admits_a_prompt():
    a, b, eng, batches = _decoder_and_newcomer("prefill-first")
    # Step 1 prefills a (token 1 at 1,000), step 2 decodes it (token 2 at 2,000). Step 3
    # admits b: b's whole prompt alone, a gets nothing. Steps 4-5 decode both (a: tokens 3, 4
    # at 4,000, 5,000; b: 2, 3 - b done at 5,000); step 6 decodes a alone (token 5, 6,000).
    assert shapes(batches) == [
        ([(0, 100)], 0),
        ([], 1),
        ([(0, 100)], 0),
        ([], 2),
        ([], 2),
        ([], 1),
    ]
    # Step 4's contexts: a has 100 prompt + 1 decoded = 101; b 100.
    assert batches[3].decode_context_sum == 201
    # a's gap between tokens 2 and 3 spans two steps, 2,000 -> 4,000: the one gap that is not
    # a step long (the engine keeps such gaps; regular ones are counted).
    assert list(eng.irregular_itl_us) == [2 * STEP]
    assert (b.first_token_us, b.completion_us) == (3 * STEP, 5 * STEP)
    assert a.completion_us == 6 * STEP


def test_chunked_decodes_in_the_step_that_admits_a_prompt():
    a, b, eng, batches = _decoder_and_newcomer("chunked")
    # Step 3 is mixed: a's token 3 (context 100 + 1) and b's prompt; a never waits, so its
    # 5 tokens end at 5,000 (one per step), b's 3 at 3,000, 4,000, 5,000.
    assert shapes(batches) == [([(0, 100)], 0), ([], 1), ([(0, 100)], 1), ([], 2), ([], 2)]
    assert batches[2].decode_context_sum == 101
    assert list(eng.irregular_itl_us) == []  # every gap is one step
    assert (b.first_token_us, b.completion_us) == (3 * STEP, 5 * STEP)
    assert a.completion_us == 5 * STEP


def test_prefill_first_admits_several_whole_prompts_in_one_step():
    a, b, c = Request("a", 0, 900, 2), Request("b", 0, 900, 2), Request("c", 0, 900, 2)
    batches = Driver(make_engine("prefill-first"), {0: [a, b, c]}).run()
    # 900 + 900 fit the 2,048 budget; c's whole 900 does not fit the 248 left, so it waits
    # (no chunk). Step 2 admits c (a step that can admit does: a and b wait); step 3 decodes
    # all three (a and b's second token, c's second).
    assert shapes(batches) == [([(0, 900), (0, 900)], 0), ([(0, 900)], 0), ([], 3)]
    assert (a.completion_us, c.first_token_us, c.completion_us) == (3 * STEP, 2 * STEP, 3 * STEP)


# ------------------------------------------------------------------------ whole prompts


def _blocked_by_one_token(formation: str) -> tuple[Request, list[StepBatch]]:
    """a (100, 3) from step 0; b with a 2,048-token prompt (the whole budget) from step 1."""
    a = Request("a", 0, 100, 3)
    b = Request("b", STEP, 2048, 2)
    batches = Driver(make_engine(formation), {0: [a], 1: [b]}).run()
    assert a.completion_us == 3 * STEP  # a's three tokens at 1,000, 2,000, 3,000 either way
    return b, batches


def test_whole_prompt_waits_until_its_whole_prompt_fits_the_budget_left():
    b, batches = _blocked_by_one_token("whole-prompt")
    # Steps 2 and 3: a's decode leaves 2,047 < 2,048, so b waits; a finishes at 3,000 and
    # step 4 computes b's whole prompt (first token 4,000), step 5 its second token.
    assert shapes(batches) == [([(0, 100)], 0), ([], 1), ([], 1), ([(0, 2048)], 0), ([], 1)]
    assert (b.first_token_us - b.arrival_us, b.completion_us) == (3 * STEP, 5 * STEP)


def test_chunked_splits_the_same_prompt_over_the_budget_left():
    b, batches = _blocked_by_one_token("chunked")
    # Step 2: a's decode + 2,047 of b's prompt; step 3: a's last token + b's last prompt token
    # (first token 3,000); step 4: b's second token.
    assert shapes(batches) == [
        ([(0, 100)], 0),
        ([(0, 2047)], 1),
        ([(2047, 1)], 1),
        ([], 1),
    ]
    assert (b.first_token_us - b.arrival_us, b.completion_us) == (2 * STEP, 4 * STEP)


@pytest.mark.parametrize("formation", ["whole-prompt", "prefill-first"])
def test_a_prompt_longer_than_the_budget_is_admitted_alone_and_chunked(formation):
    a, b, c = Request("a", 0, 100, 3), Request("b", 0, 3000, 2), Request("c", 0, 100, 2)
    batches = Driver(make_engine(formation), {0: [a, b, c]}).run()
    # Step 1 admits a whole; b (3,000 > 2,048: never whole) waits for an empty batch and c
    # waits behind it (head-of-line). a decodes its tokens 2, 3 in steps 2, 3 and leaves.
    # Step 4: b alone, 2,048 tokens; step 5: b's last 952, and c's whole 100 in the 1,096
    # left; step 6: both decode their second token.
    assert shapes(batches) == [
        ([(0, 100)], 0),
        ([], 1),
        ([], 1),
        ([(0, 2048)], 0),
        ([(2048, 952), (0, 100)], 0),
        ([], 2),
    ]
    assert [(r.first_token_us, r.completion_us) for r in (a, b, c)] == [
        (1 * STEP, 3 * STEP),
        (5 * STEP, 6 * STEP),
        (5 * STEP, 6 * STEP),
    ]


def test_chunked_gives_the_long_prompt_what_the_budget_leaves_at_once():
    a, b, c = Request("a", 0, 100, 3), Request("b", 0, 3000, 2), Request("c", 0, 100, 2)
    batches = Driver(make_engine("chunked"), {0: [a, b, c]}).run()
    # Step 1: a's 100 and 1,948 of b. Step 2: a decodes, b's last 1,052, c's 100 in the 995
    # left. Step 3: three decodes; all three are done at 3,000.
    assert shapes(batches) == [
        ([(0, 100), (0, 1948)], 0),
        ([(1948, 1052), (0, 100)], 1),
        ([], 3),
    ]
    assert [r.completion_us for r in (a, b, c)] == [3 * STEP] * 3


# ------------------------------------------------------------------------ laws


@st.composite
def workloads(draw):
    """A small engine and requests arriving at step starts: tiny budgets and caches make
    chunking, head-of-line blocking, preemption and drops common."""
    block_size = draw(st.sampled_from([4, 16]))
    config = dict(
        total_kv_blocks=draw(st.integers(2, 40)),
        block_size=block_size,
        max_num_running_reqs=draw(st.integers(1, 6)),
        max_num_scheduled_tokens=draw(st.integers(4, 160)),
        enable_prefix_caching=draw(st.booleans()),
    )
    arrivals: dict[int, list[tuple[str, int, int]]] = {}
    for i in range(draw(st.integers(1, 12))):
        step = draw(st.integers(0, 30))
        spec = (f"r{i}", draw(st.integers(1, 200)), draw(st.integers(1, 30)))
        arrivals.setdefault(step, []).append(spec)
    return config, arrivals


def _drive(formation: str | None, config: dict, arrivals: dict) -> tuple[VLLMEngine, list, list]:
    """Run the workload to the end (`formation` None: an EngineConfig without the field);
    returns the engine, its requests and each step's batch with the prompt chunks as
    (request, context, tokens, prompt target)."""
    eng = (
        VLLMEngine(EngineConfig(**config))
        if formation is None
        else make_engine(formation, **config)
    )
    requests = []
    steps = []
    now = 0
    for k in range(5000):
        for rid, prompt, output in arrivals.get(k, []):
            req = Request(rid, now, prompt, output, segments=[(("shared",), prompt)])
            requests.append(req)
            eng.enqueue(req, now)
        if not eng.has_work and k > max(arrivals):
            return eng, requests, steps
        batch = eng.plan_step(now)
        if batch is not None:
            prompts = [
                (r, r.computed_tokens, r.num_new_tokens, r.prefill_target)
                for r in eng.prefill_requests()
            ]
            eng.finish_step(STEP)
            steps.append((batch, prompts))
        now += STEP
        eng.check_invariants()  # states, progress bounds, KV blocks in use + free = total
    raise AssertionError("engine did not drain")


LAW_SETTINGS = settings(max_examples=150, deadline=None)


@LAW_SETTINGS
@given(st.sampled_from(FORMATIONS), workloads())
def test_every_request_completes_or_is_dropped_because_it_can_never_fit(formation, work):
    config, arrivals = work
    eng, requests, _ = _drive(formation, config, arrivals)
    bs, total = config["block_size"], config["total_kv_blocks"]
    for req in requests:
        assert req.state in (RequestState.COMPLETED, RequestState.DROPPED), req
        if req.state is RequestState.DROPPED:
            # Dropped at enqueue (prompt > cache) or at admission (prompt + every delivered
            # token + one more token's KV > cache); either needs more than the whole cache
            # for prompt + output - 1 tokens.
            assert -(-(req.input_tokens + req.output_tokens - 1) // bs) > total, req
        else:
            assert req.generated_tokens == req.output_tokens
            assert req.arrival_us <= req.first_token_us <= req.completion_us
    assert eng.kv.used_blocks == 0  # everything released at the end
    assert eng.completed_count + eng.dropped_unservable == len(requests)


@LAW_SETTINGS
@given(workloads())
def test_a_prefill_first_step_never_computes_prompts_and_decodes_together(work):
    config, arrivals = work
    _, _, steps = _drive("prefill-first", config, arrivals)
    for batch, _ in steps:
        assert not (batch.prefill_chunks and batch.decode_count), batch


@LAW_SETTINGS
@given(st.sampled_from(["whole-prompt", "prefill-first"]), workloads())
def test_a_prompt_is_split_only_when_alone_and_longer_than_the_budget(formation, work):
    """A chunk that leaves part of its prompt for later is the step's only work and takes the
    whole budget: the request was admitted into an empty batch because its remaining prompt
    could never fit one step. Every other prompt is computed in the step that admits it."""
    config, arrivals = work
    budget = config["max_num_scheduled_tokens"]
    _, _, steps = _drive(formation, config, arrivals)
    for batch, prompts in steps:
        for _req, context, tokens, target in prompts:
            if context + tokens < target:
                assert len(prompts) == 1 and batch.decode_count == 0, batch
                assert tokens == budget


@settings(max_examples=60, deadline=None)
@given(workloads())
def test_chunked_by_name_is_the_default_engine(work):
    """Naming `chunked` is the same engine as not naming a policy: identical step batches and
    per-request times on random workloads (the default path's results are pinned, digests
    and all, by tests/test_scenario_digests.py)."""
    config, arrivals = work

    def observed(formation: str | None) -> tuple:
        _, requests, steps = _drive(formation, config, arrivals)
        return (
            [(b.prefill_chunks, b.decode_count, b.decode_context_sum) for b, _ in steps],
            [(r.state, r.first_token_us, r.completion_us, r.preemptions) for r in requests],
        )

    assert observed("chunked") == observed(None)


SAME_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SAME_SETTINGS
@given(st.sampled_from(["whole-prompt", "prefill-first"]), engine_scenarios())
def test_accelerated_and_reference_runs_are_identical(formation, case):
    """`whole-prompt` keeps the decode fast path (its running phase is `chunked`'s) and both
    keep step coalescing, which needs an empty wait queue: with nothing waiting every policy
    here serves only the running requests, so a quiet step depends on the engine alone. Both
    are checked against the reference path (one request, one event at a time), on random
    engines with timeouts, horizons, context limits, prefix caching and a CPU tier."""
    requests, config, model, horizon = case
    config = dataclasses.replace(config, batch_formation=formation)
    runs = {
        enabled: run_simulation(
            _copies(requests),
            config,
            model,
            horizon,
            check_invariants=True,
            options=ACCELERATED if enabled else REFERENCE,
        )
        for enabled in (True, False)
    }
    _assert_same(runs[True], runs[False])


# ------------------------------------------------------------------------ whole runs


# Prompts up to three budgets long and a cache of 600 blocks: chunking, head-of-line blocking
# and preemption all happen.
WORKLOAD = {
    "rate": 40,
    "num_requests": 150,
    "prompt_tokens": {"mean": 400, "stdev": 300, "min": 10, "max": 1500},
    "output_tokens": {"mean": 60, "stdev": 30, "min": 1, "max": 200},
}


def _run(formation: str, **overrides):
    return simulator.simulate(
        {
            "model": "meta-llama/llama-3.1-8b-instruct",
            "latency": {"model": "roofline"},
            "engine": {
                "batch_formation": formation,
                "total_kv_blocks": 600,
                "max_num_scheduled_tokens": 512,
            },
            "workload": WORKLOAD,
            "seed": 3,
        },
        warn_unsteady=False,
        **overrides,
    )


@pytest.fixture(scope="module")
def runs():
    return {f: _run(f) for f in FORMATIONS}


@pytest.mark.parametrize("formation", FORMATIONS)
def test_whole_runs_conserve_requests_keep_causality_and_repeat(formation, runs):
    result = runs[formation]
    s = result.summary
    assert s["injected_requests"] == 150
    assert s["injected_requests"] == (
        s["completed_requests"]
        + s["still_queued"]
        + s["still_running"]
        + s["dropped_unservable"]
        + s["timed_out_requests"]
    )
    frame = result.requests
    done = frame[frame.state == "completed"]
    assert len(done) == s["completed_requests"] > 0
    assert (done.arrival_us <= done.first_token_us).all()
    assert (done.first_token_us <= done.completion_us).all()
    again = _run(formation)
    assert json.dumps(again.summary, sort_keys=True) == json.dumps(s, sort_keys=True)


def test_the_policies_change_results_as_their_rules_say(runs):
    steps = {f: runs[f].steps for f in FORMATIONS}
    pf = steps["prefill-first"]
    assert not ((pf.prefill_tokens > 0) & (pf.decode_tokens > 0)).any()
    assert ((steps["chunked"].prefill_tokens > 0) & (steps["chunked"].decode_tokens > 0)).any()
    # The same tokens are computed either way (no preemption here: no prompt computed twice).
    for f in FORMATIONS:
        assert runs[f].summary["preemption_count"] == 0
        assert steps[f].decode_tokens.sum() + steps[f].prefill_tokens.sum() == (
            steps["chunked"].decode_tokens.sum() + steps["chunked"].prefill_tokens.sum()
        )
    # A third of the prompts are longer than the 512-token budget: without chunking each
    # waits for an empty batch, and everything queued behind it waits too.
    for f in ("whole-prompt", "prefill-first"):
        assert runs[f].summary["ttft_mean_ms"] > 10 * runs["chunked"].summary["ttft_mean_ms"]
    summaries = {f: json.dumps(runs[f].summary, sort_keys=True) for f in FORMATIONS}
    assert len(set(summaries.values())) == 3


def test_the_default_run_names_no_policy_and_equals_chunked(runs):
    default = simulator.simulate(
        {
            "model": "meta-llama/llama-3.1-8b-instruct",
            "latency": {"model": "roofline"},
            "engine": {"total_kv_blocks": 600, "max_num_scheduled_tokens": 512},
            "workload": WORKLOAD,
            "seed": 3,
        },
        warn_unsteady=False,
    )
    chunked = runs["chunked"]
    assert json.dumps(default.summary, sort_keys=True) == json.dumps(
        chunked.summary, sort_keys=True
    )
    assert default.blis_request_records() == chunked.blis_request_records()


def test_python_keyword_override_selects_the_policy(runs):
    result = _run("chunked", engine__batch_formation="prefill-first")
    assert json.dumps(result.summary, sort_keys=True) == json.dumps(
        runs["prefill-first"].summary, sort_keys=True
    )
    with pytest.raises(ConfigError, match=r"batch formation.*'orca'.*chunked, prefill-first"):
        simulator.simulate({"engine": {"batch_formation": "orca"}})


def test_cli_flag_selects_the_policy_and_refuses_unknown_names():
    from typer.testing import CliRunner

    from simulator.cli import app

    args = ["run", "--model", "meta-llama/llama-3.1-8b-instruct", "--num-requests", "5"]
    runner = CliRunner()
    for name in FORMATIONS:
        assert runner.invoke(app, [*args, "--batch-formation", name]).exit_code == 0, name
    bad = runner.invoke(app, [*args, "--batch-formation", "orca"])
    assert bad.exit_code == 2
    lines = bad.output.strip().splitlines()
    assert lines == [
        "error: --batch-formation (engine.batch_formation): unknown batch formation 'orca'; "
        "valid: chunked, prefill-first, whole-prompt"
    ]
