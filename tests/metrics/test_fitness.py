"""Fitness evaluation (docs/behaviour.md §6.8): parsing, normalisation, score, printed block."""

from __future__ import annotations

import json

import pytest

from simulator.errors import ConfigError
from simulator.metrics.fitness import (
    FITNESS_KEYS,
    evaluate_fitness,
    format_fitness,
    normalise,
    parse_fitness_weights,
)


def test_parse():
    assert parse_fitness_weights(" throughput:1, p99_ttft : 2.5") == {
        "throughput": 1.0,
        "p99_ttft": 2.5,
    }
    assert parse_fitness_weights("") == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("goodput:1", "unknown fitness key 'goodput'"),
        ("throughput", "'throughput'"),
        ("throughput:1:2", "'throughput:1:2'"),
        ("throughput:x", "must be a number"),
        ("throughput:-1", ">= 0"),
        ("throughput:nan", ">= 0"),
        ("throughput:1,throughput:2", "listed twice"),
    ],
)
def test_parse_errors(text, needle):
    with pytest.raises(ConfigError) as exc:
        parse_fitness_weights(text)
    assert needle in str(exc.value)
    assert "--fitness-weights" in str(exc.value)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as exc:
        parse_fitness_weights("goodput:1")
    assert str(exc.value).endswith("valid keys: " + ", ".join(FITNESS_KEYS))
    assert FITNESS_KEYS == (
        "mean_e2e",
        "mean_ttft",
        "p50_e2e",
        "p50_ttft",
        "p99_e2e",
        "p99_ttft",
        "throughput",
        "tokens_per_sec",
    )


def test_normalisation_hand_computed():
    assert normalise("throughput", 100) == 0.5
    assert normalise("throughput", 300) == 0.75
    assert normalise("tokens_per_sec", 10_000) == 0.5
    assert normalise("tokens_per_sec", 0) == 0.0
    assert normalise("p99_ttft", 1000) == 0.5  # µs
    assert normalise("mean_e2e", 3000) == 0.25
    assert normalise("p50_e2e", 0) == 1.0


def test_evaluate_hand_computed():
    summary = {
        "responses_per_sec": 100.0,
        "tokens_per_sec": 10_000.0,
        "ttft_p99_ms": 1.0,  # = 1000 µs -> 0.5
        "e2e_mean_ms": 3.0,  # = 3000 µs -> 0.25
        "ttft_p50_ms": 9.0,  # -> 0.1
    }
    weights = {"throughput": 1, "tokens_per_sec": 2, "p99_ttft": 3, "mean_e2e": 4, "p50_ttft": 10}
    score, components = evaluate_fitness(summary, weights)
    assert components == pytest.approx(
        {
            "mean_e2e": 0.25,
            "p50_ttft": 0.1,
            "p99_ttft": 0.5,
            "throughput": 0.5,
            "tokens_per_sec": 0.5,
        }
    )
    assert list(components) == sorted(components)
    assert score == pytest.approx(0.5 + 1.0 + 1.5 + 1.0 + 1.0)


def test_evaluate_missing_field():
    with pytest.raises(ConfigError, match="e2e_p50_ms"):
        evaluate_fitness({"responses_per_sec": 1.0}, {"p50_e2e": 1.0})


def test_format():
    text = format_fitness(1.25, {"throughput": 0.5, "mean_e2e": 0.25})
    header, _, body = text.partition("\n")
    assert header == "=== Fitness Evaluation ==="
    payload = json.loads(body)
    assert payload == {"score": 1.25, "components": {"mean_e2e": 0.25, "throughput": 0.5}}
    assert list(payload["components"]) == ["mean_e2e", "throughput"]


# ------------------------------------------------------- fitness that cannot be gamed (laws)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import simulator  # noqa: E402

_ALL = {key: 1.0 for key in FITNESS_KEYS}


def _summary(completed: int, offered: int, latency_ms: float, rps: float) -> dict:
    summary = {"completed_requests": completed, "offered_requests": offered,
               "injected_requests": completed, "responses_per_sec": rps,
               "tokens_per_sec": rps * 100}  # fmt: skip
    for name in ("ttft", "e2e"):
        for stat in ("mean", "p50", "p99"):
            summary[f"{name}_{stat}_ms"] = latency_ms if completed else None
    return summary


@settings(max_examples=200, deadline=None)
@given(
    completed=st.integers(0, 1000),
    more_rejected=st.integers(0, 1000),
    offered_extra=st.integers(0, 1000),
    latency_ms=st.floats(0, 1e6),
    rps=st.floats(0, 1e4),
    weights=st.dictionaries(st.sampled_from(FITNESS_KEYS), st.floats(0, 10), min_size=1),
)
def test_rejecting_more_never_improves_fitness(
    completed, more_rejected, offered_extra, latency_ms, rps, weights
):
    """All else equal, a run that completes fewer of the same offered requests (it rejected,
    dropped or timed out more) never scores higher."""
    offered = completed + offered_extra + more_rejected
    fewer = max(completed - more_rejected, 0)
    base = evaluate_fitness(_summary(completed, offered, latency_ms, rps), weights)[0]
    worse = evaluate_fitness(_summary(fewer, offered, latency_ms, rps), weights)[0]
    assert worse <= base + 1e-12


def test_serving_nobody_scores_zero_and_ranks_last():
    # The case: a token bucket that rejects all 3,000 requests used to score 2.0 (its
    # latencies printed as 0 ms), above a run that served everyone (0.285).
    nobody = evaluate_fitness(_summary(0, 3000, 0.0, 0.0), _ALL)[0]
    everyone = evaluate_fitness(_summary(3000, 3000, 800.0, 20.0), _ALL)[0]
    assert nobody == 0.0 < everyone


def test_a_run_whose_admission_rejects_everything_scores_zero():
    result = simulator.simulate(
        {
            "latency": {"model": "roofline"},
            "workload": {"rate": 50, "num_requests": 60},
            "cluster": {
                "admission": {
                    "policy": "token-bucket",
                    "token_bucket_capacity": 1,
                    "token_bucket_refill_rate": 0.001,
                },  # fmt: skip
                "fitness_weights": "throughput:1,p99_ttft:1",
            },
        }
    )
    assert result.summary["completed_requests"] == 0
    assert result.summary["ttft_p99_ms"] is None  # no sample: unknown, not 0
    assert result.fitness[0] == 0.0
    assert result.summary["slo_attainment"] == 0.0
    assert result.steady_state.verdict == "empty"
