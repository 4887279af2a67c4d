"""Policy bundle YAML (docs/behaviour.md §6.6): strict parsing into dotted scenario overrides."""

from __future__ import annotations

import pytest

from simulator.cluster.policy_bundle import load_policy_bundle
from simulator.cluster.routing import parse_scorers
from simulator.errors import ConfigError

FULL = """
admission:
  policy: token-bucket
  token_bucket_capacity: 5000
  token_bucket_refill_rate: 250.5
routing:
  policy: weighted
  scorers:
    - name: prefix-affinity
      weight: 3
    - {name: queue-depth, weight: 0.5}
priority:
  policy: slo-based
scheduler: priority-fcfs
"""

# BLIS-current's additions: a preemption section, and class priorities kept with admission.
CURRENT = """
admission:
  slo_priorities: {batch: 5, critical: -100}
preemption:
  policy: priority
"""


def bundle(tmp_path, text: str):
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return load_policy_bundle(p)


def test_full_bundle(tmp_path):
    out = bundle(tmp_path, FULL)
    assert out == {
        "cluster.admission.policy": "token-bucket",
        "cluster.admission.token_bucket_capacity": 5000.0,
        "cluster.admission.token_bucket_refill_rate": 250.5,
        "cluster.routing.policy": "weighted",
        "cluster.routing.scorers": "prefix-affinity:3.0,queue-depth:0.5",
        "engine.priority_policy": "slo-based",
        "engine.scheduler": "priority-fcfs",
    }
    assert parse_scorers(out["cluster.routing.scorers"]) == [
        ("prefix-affinity", 3.0),
        ("queue-depth", 0.5),
    ]


def test_blis_current_preemption_and_class_priorities(tmp_path):
    """A BLIS-current bundle's `preemption.policy` and `admission.slo_priorities` were refused
    as unknown keys: they set the engine's preemption policy and class priorities."""
    assert bundle(tmp_path, CURRENT) == {
        "engine.slo_priorities": {"batch": 5, "critical": -100},
        "engine.preemption_policy": "priority",
    }


def test_partial_and_empty(tmp_path):
    assert bundle(tmp_path, "") == {}
    assert bundle(tmp_path, "routing: {policy: least-loaded}\nadmission:\n") == {
        "cluster.routing.policy": "least-loaded"
    }


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("routing_policy: weighted\n", ["'routing_policy'", "(top level)"]),
        ("routing: {policy: weighted, scorer: x}\n", ["'scorer'", "routing"]),
        ("admission: {policy: token-bucket, capacity: 5}\n", ["'capacity'", "admission"]),
        ("priority: {name: slo-based}\n", ["'name'", "priority"]),
        ("routing: {scorers: [{name: queue-depth, weight: 1, x: 2}]}\n", ["'x'", "scorers[0]"]),
    ],
)
def test_unknown_keys(tmp_path, text, needles):
    with pytest.raises(ConfigError) as exc:
        bundle(tmp_path, text)
    for needle in needles:
        assert needle in str(exc.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("- a\n", "mapping"),
        ("routing: weighted\n", "routing must be a mapping"),
        ("routing: {policy: randomish}\n", "unknown routing policy 'randomish'"),
        ("admission: {policy: nope}\n", "unknown admission policy"),
        ("priority: {policy: nope}\n", "unknown priority policy"),
        ("scheduler: lifo\n", "unknown scheduler"),
        ("admission: {token_bucket_capacity: 0}\n", "token_bucket_capacity"),
        ("admission: {token_bucket_refill_rate: .nan}\n", "token_bucket_refill_rate"),
        ("routing: {scorers: [{name: queue-dept, weight: 1}]}\n", "unknown scorer 'queue-dept'"),
        ("routing: {scorers: [{name: queue-depth, weight: 0}]}\n", "weight"),
        ("routing: {scorers: [{name: queue-depth}]}\n", "needs weight"),
        ("routing: {scorers: []}\n", "non-empty list"),
        (
            "routing: {scorers: [{name: queue-depth, weight: 1}, {name: queue-depth, weight: 2}]}",
            "listed twice",
        ),
        ("routing: {policy: weighted}\nrouting: {policy: least-loaded}\n", "duplicate key"),
        ("routing: {policy: [}\n", "not valid YAML"),
        ("preemption: {policy: lifo}\n", "unknown preemption policy 'lifo'"),
        ("preemption: {victim: newest}\n", "unknown key 'victim' in preemption"),
        ("admission: {slo_priorities: {gold: 1}}\n", "unknown SLO class 'gold'"),
        ("admission: {slo_priorities: {batch: 101}}\n", "slo_priorities.batch: invalid value"),
        ("admission: {slo_priorities: {batch: true}}\n", "slo_priorities.batch: invalid value"),
        ("admission: {slo_priorities: [batch]}\n", "slo_priorities must be a mapping"),
    ],
)
def test_invalid_bundles(tmp_path, text, needle):
    with pytest.raises(ConfigError) as exc:
        bundle(tmp_path, text)
    assert needle in str(exc.value)
    assert "policy bundle" in str(exc.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy_bundle(tmp_path / "absent.yaml")
