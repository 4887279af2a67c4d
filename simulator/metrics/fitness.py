"""Fitness evaluation: one scalar that ranks runs for policy search (docs/behaviour.md §6.8).

Every metric is mapped to (0, 1] with "higher is better" before weighting, so weights say how
much each metric matters, not how large its units are:
throughput x/(x+100) req/s, tokens_per_sec x/(x+10,000), latencies 1/(1 + x_µs/1000).

Unlike BLIS, the weighted sum is then multiplied by the fraction of offered requests that
completed (`served_fraction`): a request that was rejected, dropped or timed out, or was still
waiting at the end, counts against the run, and a latency of no completed request scores 0. So
a run that serves nobody scores 0, the lowest possible, and rejecting more requests can never
raise the score of an otherwise identical run (BLIS scored a run that rejects everything
highest: its latencies are 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from ..errors import ConfigError, invalid

FITNESS_FIELD = "fitness_weights (--fitness-weights)"

# key -> (summary field, kind). Latency fields in the summary are ms; fitness works in µs.
_METRICS: dict[str, tuple[str, str]] = {
    "throughput": ("responses_per_sec", "throughput"),
    "tokens_per_sec": ("tokens_per_sec", "tokens"),
    "p99_ttft": ("ttft_p99_ms", "latency"),
    "p50_ttft": ("ttft_p50_ms", "latency"),
    "mean_ttft": ("ttft_mean_ms", "latency"),
    "p99_e2e": ("e2e_p99_ms", "latency"),
    "p50_e2e": ("e2e_p50_ms", "latency"),
    "mean_e2e": ("e2e_mean_ms", "latency"),
}
FITNESS_KEYS = tuple(sorted(_METRICS))


def _valid_keys() -> str:
    return ", ".join(FITNESS_KEYS)


def parse_fitness_weights(text: str, field: str = FITNESS_FIELD) -> dict[str, float]:
    """Parse "key:weight,key:weight". An empty string means no fitness evaluation ({})."""
    if text is None or not text.strip():
        return {}
    weights: dict[str, float] = {}
    for raw in text.split(","):
        piece = raw.strip()
        parts = piece.split(":")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise invalid(field, piece, f"expected key:weight; valid keys: {_valid_keys()}")
        key, weight_text = parts[0].strip(), parts[1].strip()
        if key not in _METRICS:
            raise ConfigError(
                f"{field}: unknown fitness key {key!r} in {piece!r}; valid keys: {_valid_keys()}"
            )
        try:
            weight = float(weight_text)
        except ValueError:
            raise invalid(field, piece, f"the weight of {key!r} must be a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise invalid(field, piece, f"the weight of {key!r} must be a finite number >= 0")
        if key in weights:
            raise invalid(field, piece, f"fitness key {key!r} is listed twice")
        weights[key] = weight
    return weights


def normalise(key: str, value: float) -> float:
    """Map a raw metric (req/s, tok/s or latency in µs) to (0, 1], higher = better."""
    kind = _METRICS[key][1]
    if kind == "throughput":
        return value / (value + 100.0)
    if kind == "tokens":
        return value / (value + 10_000.0)
    return 1.0 / (1.0 + value / 1000.0)


def evaluate_fitness(
    summary: Mapping[str, float], weights: Mapping[str, float]
) -> tuple[float, dict[str, float]]:
    """Score a run's summary JSON. Components are the normalised (unweighted) values."""
    components: dict[str, float] = {}
    for key in sorted(weights):
        if key not in _METRICS:
            raise ConfigError(f"unknown fitness key {key!r}; valid keys: {_valid_keys()}")
        field, kind = _METRICS[key]
        if field not in summary:
            raise ConfigError(f"fitness key {key!r} needs summary field {field!r}, which is absent")
        if summary[field] is None:  # a latency of no completed request
            components[key] = 0.0
            continue
        raw = float(summary[field])
        if kind == "latency":
            raw *= 1000.0  # ms -> µs
        components[key] = normalise(key, raw)
    # Accumulate in sorted key order so the float sum is reproducible (R2).
    score = 0.0
    for key, value in components.items():
        score += weights[key] * value
    return score * served_fraction(summary), components


def served_fraction(summary: Mapping[str, float]) -> float:
    """Completed / offered requests (offered includes admission's rejections); 1 for a
    summary without counts."""
    completed = summary.get("completed_requests")
    offered = summary.get("offered_requests", summary.get("injected_requests"))
    if completed is None or not offered:
        return 1.0 if completed is None else 0.0
    return float(completed) / float(offered)


def format_fitness(score: float, components: Mapping[str, float]) -> str:
    """BLIS's `=== Fitness Evaluation ===` block, with the payload as one JSON object."""
    payload = {"score": score, "components": {k: components[k] for k in sorted(components)}}
    return "=== Fitness Evaluation ===\n" + json.dumps(payload, indent=2)
