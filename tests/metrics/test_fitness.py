"""Fitness evaluation (SPEC §6.8): parsing, normalisation, score, printed block."""

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
