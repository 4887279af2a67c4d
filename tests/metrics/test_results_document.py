"""The results document and the printed report say which engine policies produced the run, as
they say which latency model did: the defaults when none is chosen, the chosen ones otherwise
(scenario, Python or CLI flags all land in the scenario's `engine` section)."""

from __future__ import annotations

import json

import simulator
from simulator.metrics.views.text import (
    BATCH_LIMIT_FIELDS,
    ENGINE_HEADER,
    ENGINE_POLICY_FIELDS,
    LATENCY_HEADER,
    engine_policies,
)

SMALL = {"workload": {"num_requests": 20, "rate": 10}}


def test_the_defaults_are_named():
    doc = simulator.simulate(SMALL).results_document()
    assert doc["engine_policies"] == {
        "scheduler": "fcfs",
        "priority_policy": "constant",
        "batch_formation": "chunked",
        "preemption_policy": "fcfs",
        # Unset batch limits under physics on an H100: a stock vLLM server's there.
        "max_num_running_reqs": 1024,
        "max_num_scheduled_tokens": 8192,
        "batch_limits_source": "vLLM's default on H100",
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
    assert list(policies) == [*ENGINE_POLICY_FIELDS, *BATCH_LIMIT_FIELDS]


def test_a_run_that_does_not_say_names_nothing():
    assert engine_policies({}) == {} == engine_policies(None)
    assert engine_policies({"engine": {"batch_formation": "whole-prompt"}}) == {
        "batch_formation": "whole-prompt"
    }


def test_the_report_prints_them_before_the_latency_model():
    result = simulator.simulate(SMALL, engine__batch_formation="prefill-first")
    text = result.report_text()
    block = text[text.index(ENGINE_HEADER) + len(ENGINE_HEADER) : text.index(LATENCY_HEADER)]
    assert json.loads(block) == result.results_document()["engine_policies"]
    assert json.loads(block)["batch_formation"] == "prefill-first"
