"""The garbage-collector settings a run uses (simulator/collector.py).

Laws: the caller's thresholds and freeze state come back after a run, also when the run
raises; during a run the young threshold is at least RUN_GEN0_THRESHOLD and the objects that
existed before are frozen unless the caller froze some or disabled the collector; a run's
results do not depend on the collector's settings.
"""

from __future__ import annotations

import gc
import json

import pytest

from simulator.api import simulate
from simulator.collector import RUN_GEN0_THRESHOLD, fewer_collections


@pytest.fixture
def saved_gc_state():
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_settings_are_raised_during_the_block_and_restored_after(saved_gc_state):
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (RUN_GEN0_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_settings_are_restored_when_the_block_raises(saved_gc_state):
    gc.set_threshold(1234, 5, 6)

    @fewer_collections()
    def failing_run():
        raise ValueError("boom")

    with pytest.raises(ValueError):
        failing_run()
    assert gc.get_threshold() == (1234, 5, 6)
    assert gc.get_freeze_count() == 0


def test_a_callers_own_choices_are_respected(saved_gc_state):
    # A higher threshold than ours stays; a caller's frozen objects stay frozen.
    gc.set_threshold(10 * RUN_GEN0_THRESHOLD, 10, 10)
    gc.freeze()
    frozen = gc.get_freeze_count()
    with fewer_collections():
        assert gc.get_threshold()[0] == 10 * RUN_GEN0_THRESHOLD
    assert gc.get_freeze_count() == frozen
    gc.unfreeze()
    # A disabled collector is neither frozen into nor enabled.
    gc.disable()
    with fewer_collections():
        assert gc.get_freeze_count() == 0 and not gc.isenabled()
    assert not gc.isenabled()


def test_results_do_not_depend_on_the_collector(saved_gc_state, monkeypatch):
    scenario = {
        "seed": 3,
        "workload": {"rate": 30, "num_requests": 200, "prompt_tokens": {"mean": 300}},
    }
    default = simulate(scenario)
    # A collection of every generation after every few allocations, during the run too.
    monkeypatch.setattr("simulator.collector.RUN_GEN0_THRESHOLD", 1)
    gc.set_threshold(5, 1, 1)
    young_before = gc.get_stats()[0]["collections"]
    eager = simulate(scenario)
    assert gc.get_stats()[0]["collections"] - young_before > 100
    gc.set_threshold(700, 10, 10)
    assert json.dumps(eager.summary, sort_keys=True) == json.dumps(default.summary, sort_keys=True)
    assert eager.requests.equals(default.requests)
