"""QA round 8, sessions: a session exists once its first request is sent, and is counted
exactly once; `session_counts` always carries every outcome; the think-time flag and a bad
rate share are refused in the user's own terms (docs/workloads.md "Sessions")."""

from __future__ import annotations

import subprocess
import sys

import pytest

import simulator
from simulator.errors import ConfigError
from simulator.workload.generator import WorkloadStream
from simulator.workload.spec import workload_spec_from_dict

OUTCOMES = ("completed", "cancelled", "horizon_interrupted", "budget_exhausted")
GAUSS_IN = {"type": "gaussian", "params": {"mean": 300, "std_dev": 100, "min": 20, "max": 1000}}
GAUSS_OUT = {"type": "gaussian", "params": {"mean": 50, "std_dev": 10, "min": 10, "max": 100}}


def _client(cid: str, multi_turn: dict, **extra) -> dict:
    return {
        "id": cid,
        "rate_fraction": 1,
        "arrival": {"process": "poisson"},
        "input_distribution": GAUSS_IN,
        "output_distribution": GAUSS_OUT,
        "reasoning": {"multi_turn": {"context_growth": "accumulate", **multi_turn}},
        **extra,
    }


def _spec(num_requests: int, *clients: dict) -> dict:
    return {
        "version": "2",
        "aggregate_rate": 2,
        "num_requests": num_requests,
        "seed": 7,
        "clients": list(clients),
    }


CONSTANT = {"process": "constant"}
# The QA reviewer's cases (/tmp/qa/sessions8): one.yaml, z0.yaml, to1.yaml, to2.yaml, and
# two clients (the merge draws each client's next request ahead of the cut).
CASES = {
    "one_round_long_think": _spec(20, _client("agent", {"max_rounds": 1, "think_time_us": 10**6})),
    "zero_think": _spec(40, _client("agent", {"max_rounds": 4, "think_time_us": 0})),
    "timeouts_closed_loop": _spec(
        12,
        _client(
            "agent", {"max_rounds": 3, "think_time_us": 500_000}, timeout=120_000, arrival=CONSTANT
        ),
    ),
    "timeouts_open_loop": _spec(
        12,
        _client(
            "agent",
            {"max_rounds": 3, "think_time_us": 500_000},
            timeout=120_000,
            arrival=CONSTANT,
            closed_loop=False,
        ),
    ),
    "two_clients": _spec(
        7,
        _client("a", {"max_rounds": 2, "think_time_us": 10**6}),
        _client("b", {"max_rounds": 3, "think_time_us": 0}, closed_loop=False),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_session_is_counted_once_and_only_when_it_sent_a_request(name):
    """Law: the outcomes add up to `total`, and `total` is the number of sessions with at
    least one request (here every request arrives: no horizon). A session whose first round
    fell past num_requests never existed; it was counted `horizon_interrupted` (20 sessions
    sent, outcomes completed 20 + horizon_interrupted 1 = total 21)."""
    result = simulator.simulate(
        {"workload": CASES[name]}, warn_unsteady=False, check_invariants=True
    )
    counts = result.session_counts
    sent = {r.session_id for r in result.request_records if r.session_id}
    assert sum(counts[k] for k in OUTCOMES) == counts["total"]
    assert counts["total"] == len(sent) == result.session_metrics["sessions"]


def test_the_generator_registers_a_session_when_its_first_request_is_sent():
    """With two clients and num_requests 1, the merge has drawn both clients' first
    requests; only the one sent opens a session."""
    spec = workload_spec_from_dict(
        _spec(
            1,
            _client("a", {"max_rounds": 2, "think_time_us": 0}),
            _client("b", {"max_rounds": 2, "think_time_us": 0}, closed_loop=False),
        )
    )
    stream = WorkloadStream(spec, seed=7)
    sent = list(stream)
    assert len(sent) == 1
    assert set(stream.sessions.sessions) == {sent[0].session_id}
    assert stream.sessions.finalize()["total"] == 1


def test_session_counts_always_carry_every_outcome():
    """`budget_exhausted` is 0, not missing, when no user ran out of budget; a run without
    sessions has no counts at all ({})."""
    result = simulator.simulate({"workload": CASES["zero_think"]}, warn_unsteady=False)
    assert list(result.session_counts) == [*OUTCOMES, "total"]
    assert result.session_counts["budget_exhausted"] == 0
    assert result.session_block["outcomes"] == result.session_counts
    plain = simulator.simulate({"workload": {"num_requests": 5}}, warn_unsteady=False)
    assert plain.session_counts == {}
    assert plain.session_block is None


def _servesim(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simulator.cli", *argv], capture_output=True, text=True, timeout=120
    )


def test_think_time_flag_without_users_names_the_flag_and_what_to_add(tmp_path):
    done = _servesim("run", "--think-time-ms", "100", "--num-requests", "20", "-q")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --think-time-ms 100:"), line
    assert "--concurrency" in line and "think_time_us" not in line
    # The scenario file's form names its fields.
    path = tmp_path / "s.yaml"
    path.write_text("workload: {num_requests: 20, think_time_us: 100000}\n")
    done = _servesim("run", str(path), "-q")
    assert done.returncode == 2
    assert "think_time_us: invalid value 100000" in done.stderr
    assert "set concurrency" in done.stderr and "--think-time-ms" not in done.stderr


@pytest.mark.parametrize("value", [-1, -0.5, float("nan"), 2e9])
def test_a_bad_rate_fraction_says_it_must_be_above_zero(value):
    """0 is refused as "required (a number > 0)": so must a negative share be, not told that
    0 is allowed."""
    spec = {
        "version": "2",
        "aggregate_rate": 1,
        "num_requests": 5,
        "cohorts": [
            {
                "id": "office",
                "population": 2,
                "rate_fraction": value,
                "arrival": {"process": "poisson"},
                "input_distribution": GAUSS_IN,
                "output_distribution": GAUSS_OUT,
            }
        ],
    }
    with pytest.raises(ConfigError) as err:
        workload_spec_from_dict(spec)
    message = str(err.value)
    assert "cohorts[0].rate_fraction: must be > 0 and at most 1,000,000,000" in message
    assert "from 0" not in message
    spec["cohorts"][0]["rate_fraction"] = 0
    with pytest.raises(ConfigError, match=r"rate_fraction: required \(a number > 0\)"):
        workload_spec_from_dict(spec)


def test_check_invariants_catches_a_session_counted_without_a_request():
    """The law the old generator broke, as an invariant: check_invariants now fails a run
    whose session outcomes do not add up, or that counts a session with no request."""
    from types import SimpleNamespace

    from simulator import invariants

    request = SimpleNamespace(session_id="s1")
    phantom = {"completed": 1, "cancelled": 0, "horizon_interrupted": 1, "budget_exhausted": 0}
    cases = {
        "every session ends exactly once": {**phantom, "total": 1},
        "a session exists once it sent a request": {**phantom, "total": 2},
    }
    for law, counts in cases.items():
        run = SimpleNamespace(session_counts=counts, request_records=[request], not_arrived=0)
        with pytest.raises(invariants.InvariantViolation, match=law):
            invariants._check_sessions(run, 0)
    fine = {**phantom, "horizon_interrupted": 0, "total": 1}
    run = SimpleNamespace(session_counts=fine, request_records=[request], not_arrived=0)
    invariants._check_sessions(run, 0)


def test_session_clients_stop_at_blis_per_client_cap_of_twice_num_requests():
    """QA: with long think times the cut at num_requests (which counts rounds where open loop
    would place them) started 77 sessions (462 requests) where both BLIS builds start 50
    (300): BLIS stops a client once it generated 2 x num_requests rounds, and with 6 rounds a
    session that is 2 x 150 / 6 = 50 sessions, every one of which runs its 6 rounds."""
    spec = {
        "version": "2",
        "seed": 5,
        "aggregate_rate": 1.2,
        "num_requests": 150,
        "clients": [
            {
                "id": "agent",
                "rate_fraction": 1,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 200}},
                "output_distribution": {"type": "constant", "params": {"value": 50}},
                "reasoning": {
                    "multi_turn": {
                        "max_rounds": 6,
                        "think_time_us": 20_000_000,
                        "context_growth": "accumulate",
                    }
                },
            }
        ],
    }
    result = simulator.simulate(
        {"workload": spec, "latency": {"model": "roofline"}},
        warn_unsteady=False,
        check_invariants=True,
    )
    assert result.session_counts["total"] == 2 * 150 // 6 == 50
    assert len(result.request_records) == 50 * 6
