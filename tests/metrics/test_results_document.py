"""The results document says which engine policies produced the run, as it says which latency
model did: the defaults when none is chosen, the chosen ones otherwise (scenario, Python or
CLI flags all land in the scenario's `engine` section)."""

from __future__ import annotations

import simulator
from simulator.metrics.views.text import ENGINE_POLICY_FIELDS, engine_policies

SMALL = {"workload": {"num_requests": 20, "rate": 10}}


def test_the_defaults_are_named():
    doc = simulator.simulate(SMALL).results_document()
    assert doc["engine_policies"] == {
        "scheduler": "fcfs",
        "priority_policy": "constant",
        "batch_formation": "chunked",
        "preemption_policy": "fcfs",
    }


def test_chosen_policies_are_named():
    result = simulator.simulate(
        SMALL,
        engine__batch_formation="prefill-first",
        engine__preemption_policy="priority",
        engine__scheduler="priority-fcfs",
    )
    policies = result.results_document()["engine_policies"]
    assert policies["batch_formation"] == "prefill-first"
    assert policies["preemption_policy"] == "priority"
    assert policies["scheduler"] == "priority-fcfs"
    assert list(policies) == list(ENGINE_POLICY_FIELDS)


def test_a_run_that_does_not_say_names_nothing():
    assert engine_policies({}) == {} == engine_policies(None)
    assert engine_policies({"engine": {"batch_formation": "whole-prompt"}}) == {
        "batch_formation": "whole-prompt"
    }
