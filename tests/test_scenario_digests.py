"""Every shipped scenario gives exactly the results it gave when its digest was recorded: a
change to the engine, the latency models or the workload generator that moves any summary
figure or any request's timing shows up here (issue 30: results byte-identical before and
after a speed change), and the reference path must give the same digests (issue 29). The
law that makes such a golden meaningful — same inputs, same seed, byte-identical output,
whatever the process's hash seed — is tests/test_determinism.py's.

After a deliberate change of results, regenerate with SERVESIM_REGEN_GOLDEN=1 and say in the
commit which scenarios moved and why."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import pytest

import simulator

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "scenario_digests.json"
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


# Shipped to show what overload does (a KV cache far too small for its load); every other
# scenario must be sustainable under the default latency model, or its figures describe the
# run's length rather than the system (docs/scenario.md).
OVERLOADED_ON_PURPOSE = {"preemption.yaml"}


@functools.cache
def _run(path: Path, reference: bool = False) -> simulator.Result:
    return simulator.simulate(path, warn_unsteady=False, reference=reference)


def _digest(path: Path, reference: bool = False) -> dict[str, str]:
    result = _run(path, reference)
    summary = json.dumps(result.summary, sort_keys=True).encode()
    requests = json.dumps(result.blis_request_records(), sort_keys=True).encode()
    return {
        "summary": hashlib.sha256(summary).hexdigest(),
        "requests": hashlib.sha256(requests).hexdigest(),
    }


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, str]]:
    if os.environ.get("SERVESIM_REGEN_GOLDEN"):
        digests = {p.name: _digest(p) for p in SCENARIOS}
        GOLDEN.write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")
    return json.loads(GOLDEN.read_text())


def test_every_scenario_has_a_recorded_digest(golden):
    assert sorted(golden) == [p.name for p in SCENARIOS]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_results_are_unchanged(path, golden):
    assert _digest(path) == golden[path.name]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_the_reference_path_gives_every_scenario_the_same_results(path, golden):
    """The accelerations (simulator/engine/options.py) change nothing on any shipped scenario:
    with every one of them off (`reference=True`: each request handled one at a time, every
    step its own event, finished requests kept as objects) the digest is the recorded one."""
    assert _digest(path, reference=True) == golden[path.name]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenarios_are_not_saturated(path):
    """A scenario whose queue grows for good under the default latency model shows the length
    of its run, not its system: the steady-state judge must not call it saturated (it may be
    "not steady" for a fixed horizon that ends with requests in flight, or a fleet change)."""
    # The same cache key as _digest's (functools.cache keys `_run(p)` and `_run(p, False)`
    # apart): each scenario is simulated once for both tests.
    state = _run(path, False).steady_state
    if path.name in OVERLOADED_ON_PURPOSE:
        assert state.verdict == "saturated"
    else:
        assert state.verdict != "saturated", state.reasons
