"""SLO attainment, goodput and the steady-state verdict (docs/results.md): laws on random
small runs, and hand-built cases whose answers can be read off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.engine.request import RequestState
from simulator.metrics.slo import SloPolicy, SloTargets, slo_report
from simulator.metrics.steady import judge
from tests.specs import CAPACITY_25_RPS, evenly_spaced

# tests/specs.py: a GPU-independent server of exactly 25 req/s.
CAPACITY_RPS = 25.0
BASE = {k: v for k, v in CAPACITY_25_RPS.items() if k != "workload"}


def _run(rate: float, n: int, slo: dict | None = None, **workload) -> simulator.Result:
    scenario = {
        **BASE,
        "workload": {
            "arrival": "poisson",
            "rate": rate,
            "num_requests": n,
            "prompt_tokens": {"distribution": "constant", "value": 16},
            "output_tokens": {"distribution": "constant", "value": 4},
            **workload,
        },
    }
    if slo:
        scenario["slo"] = slo
    return simulator.simulate(scenario)


@settings(max_examples=25, deadline=None)
@given(
    load=st.floats(0.05, 4.0),
    n=st.integers(1, 150),
    ttft_ms=st.one_of(st.none(), st.floats(1, 5_000)),
    e2e_ms=st.one_of(st.none(), st.floats(1, 5_000)),
    itl_ms=st.one_of(st.none(), st.floats(1, 50)),
    timeout_us=st.one_of(st.none(), st.integers(50_000, 2_000_000)),
)
def test_goodput_and_attainment_laws(load, n, ttft_ms, e2e_ms, itl_ms, timeout_us):
    slo = {k: v for k, v in (("ttft_ms", ttft_ms), ("e2e_ms", e2e_ms), ("itl_ms", itl_ms)) if v}
    extra = {"timeout_us": timeout_us} if timeout_us else {}
    result = _run(load * CAPACITY_RPS, n, slo, **extra)
    s = result.summary
    assert 0.0 <= s["slo_attainment"] <= 1.0
    assert s["goodput_rps"] <= s["responses_per_sec"] + 1e-9
    assert s["goodput_tokens_per_s"] <= s["tokens_per_sec"] + 1e-9
    assert result.slo["met_requests"] <= s["completed_requests"] <= result.slo["offered_requests"]
    assert result.slo["offered_requests"] == n
    if not slo:  # no targets: every completed request meets them
        assert result.slo["met_requests"] == s["completed_requests"]
    if s["completed_requests"] == 0:
        assert s["ttft_p99_ms"] is None and s["e2e_mean_ms"] is None


@settings(max_examples=10, deadline=None)
@given(overload=st.floats(2.0, 6.0), n=st.integers(300, 600))
def test_a_saturated_run_is_never_reported_steady(overload, n):
    result = _run(overload * CAPACITY_RPS, n)
    assert result.steady_state.verdict == "saturated"
    assert result.summary["steady_state"] == "saturated"
    assert result.steady_state.reasons


def test_a_lightly_loaded_run_is_steady():
    result = _run(0.3 * CAPACITY_RPS, 400)
    verdict = result.steady_state
    assert verdict.verdict == "steady", verdict.reasons
    assert verdict.offered_rps == pytest.approx(7.5, rel=0.2)
    assert verdict.achieved_rps == pytest.approx(verdict.offered_rps, rel=0.1)


def test_a_run_cut_by_the_horizon_is_not_steady():
    # 20 output tokens: 0.2 s per request, 5 req/s of capacity against 4 req/s offered, so
    # the run keeps up, but the horizon (9.9 s) stops it with the 9.75 s arrival in flight.
    result = simulator.simulate(
        {
            **BASE,
            "horizon_us": 9_900_000,
            "workload": evenly_spaced(rate=4, num_requests=60, prompt=16, output=20),
        }
    )
    assert result.summary["still_queued"] + result.summary["still_running"] > 0
    assert result.steady_state.verdict == "not steady"
    assert "still queued or running at the end" in result.steady_state.reasons[-1]


def _req(arrival_us, ttft_us=None, e2e_us=None, tokens=4, state=RequestState.COMPLETED, cls=""):
    first = arrival_us + ttft_us if ttft_us is not None else -1
    done = arrival_us + e2e_us if e2e_us is not None else -1
    return SimpleNamespace(
        arrival_us=arrival_us, first_token_us=first, last_token_us=done, completion_us=done,
        generated_tokens=tokens, state=state, slo_class=cls,
    )  # fmt: skip


def test_slo_report_by_hand():
    # Four requests over a 2 s run; targets TTFT 100 ms, E2E 400 ms; class "batch" has none.
    # r0 meets (50/300 ms); r1 misses TTFT (150 ms); r2 times out; r3 ("batch") meets anything.
    # ITL of r0 = (300 - 50) ms / 3 gaps = 83.3 ms: no ITL target, so it does not matter.
    requests = [
        _req(0, 50_000, 300_000),
        _req(10_000, 150_000, 350_000),
        _req(20_000, state=RequestState.TIMED_OUT),
        _req(30_000, 900_000, 1_900_000, tokens=10, cls="batch"),
    ]
    policy = SloPolicy(SloTargets(ttft_ms=100, e2e_ms=400), {"batch": SloTargets()})
    batch_policy = policy.targets("batch")
    assert batch_policy == SloTargets(ttft_ms=100, e2e_ms=400)  # unset fields fall back
    policy = SloPolicy(
        SloTargets(ttft_ms=100, e2e_ms=400), {"batch": SloTargets(ttft_ms=1e9, e2e_ms=1e9)}
    )
    report = slo_report(requests, policy, duration_s=2.0)
    assert (report["offered_requests"], report["met_requests"]) == (4, 2)
    assert report["slo_attainment"] == 0.5
    assert report["goodput_rps"] == 1.0  # 2 met / 2 s
    assert report["goodput_tokens_per_s"] == 7.0  # (4 + 10) tokens / 2 s
    assert report["per_class"]["default"]["slo_attainment"] == pytest.approx(1 / 3)
    assert report["per_class"]["batch"]["slo_attainment"] == 1.0
    itl = SloPolicy(SloTargets(itl_ms=80))
    assert slo_report(requests[:1], itl, 1.0)["met_requests"] == 0  # 83.3 ms > 80


def test_judge_by_hand():
    # 200 arrivals 10 ms apart (2 s). Steady: every TTFT 20 ms.
    steady = [_req(i * 10_000, 20_000, 60_000) for i in range(200)]
    assert judge(steady).verdict == "steady"
    # Growing queue: request i waits 5 ms more than i-1 (TTFT 0 -> 1 s).
    growing = [_req(i * 10_000, i * 5_000, i * 5_000 + 40_000) for i in range(200)]
    verdict = judge(growing)
    assert verdict.verdict == "saturated"
    assert verdict.ttft_p50_second_half_ms > 1.5 * verdict.ttft_p50_first_half_ms
    assert judge([_req(0, state=RequestState.DROPPED)]).verdict == "empty"
    assert judge(steady[:20]).verdict == "too short"
    rejected = steady + [_req(2_000_000 + i, state=RequestState.REJECTED) for i in range(500)]
    assert judge(rejected).verdict == "steady"  # refusals never queued
    # A saturated run that also lost requests says so (QA: a PD run that dropped 28 of 50 at
    # its decode instances' KV read only "saturated: the backlog grew").
    dropped = [_req(r.arrival_us, state=RequestState.DROPPED) for r in growing[:9]]
    verdict = judge(dropped + growing[9:])
    assert verdict.verdict == "saturated"
    assert verdict.reasons[-1] == "9 of 200 requests were dropped, timed out or failed"


def test_lost_or_unfinished_requests_say_not_steady_before_too_short():
    """A run that lost requests is "not steady" however short it is, and that verdict warns:
    the QA's quickstart with a horizon and a timeout, 45 of 163 requests timed out and 93
    unfinished, read "too short" (its window under 2 x the median E2E) and warned nothing."""
    # 200 arrivals 10 ms apart (2 s) with a median E2E of 1.5 s: a window of 1.6 s < 2 x 1.5.
    short = [_req(i * 10_000, 20_000, 1_500_000) for i in range(200)]
    assert judge(short).verdict == "too short"
    timed_out = [_req(r.arrival_us, state=RequestState.TIMED_OUT) for r in short[:3]]
    verdict = judge(timed_out + short[3:])  # 3 of 200 lost: more than 1 %
    assert verdict.verdict == "not steady"
    assert verdict.reasons == ["3 of 200 requests were dropped, timed out or failed"]
    # Fewer than 30 arrivals after the warm-up, two of them still running at the end.
    few = [_req(i * 10_000, 20_000, 60_000) for i in range(18)]
    running = [_req(180_000 + i, state=RequestState.RUNNING) for i in range(2)]
    assert judge(few).verdict == "too short"
    assert judge(few + running).verdict == "not steady"
    assert judge(short[:2] + [_req(30_000, state=RequestState.TIMED_OUT)]).verdict == ("not steady")


@pytest.mark.parametrize(
    "lost_state",
    [
        RequestState.DROPPED,
        RequestState.DROPPED_ON_DRAIN,
        RequestState.TIMED_OUT,
        RequestState.FAILED,
    ],
)
def test_every_way_of_losing_a_request_counts_as_lost(lost_state):
    """Each end state in which a request was admitted and got no answer counts towards the
    1 % loss rule: 9 of 400 requests dropped by an immediate drain read "steady" (QA)."""
    steady = [_req(i * 50_000, 20_000, 60_000) for i in range(400)]
    assert judge(steady).verdict == "steady"
    lost = [_req(r.arrival_us, state=lost_state) for r in steady[:9]]
    verdict = judge(lost + steady[9:])
    assert verdict.lost_requests == 9
    assert verdict.verdict == "not steady"


def test_a_burst_of_arrivals_at_the_end_is_not_a_growing_queue():
    """Every request takes 100 ms (no queue: E2E constant). 60 arrivals 12 ms apart, 250 10 ms
    apart, then the last 40 in a burst 2 ms apart (3.298 s in all). The window starts at
    0.3298 s (10 % warm-up), its middle is 1.8139 s; the number in the system (arrivals of the
    last 100 ms) is 8 → 10 → 42 there and at the last arrival: a growth of 32 in the second
    half, over 10 % of its 180 arrivals, which the rule took for a queue until 2026-12-07 (a
    400-request quickstart run at 60 % load was called saturated so, and `plan` doubled its
    fleet). All 42 arrived within the last median E2E (100 ms): beyond those arrivals the
    excess is 0 → 0 → 0, so the run is steady. A queue that grows beyond its arrivals (each
    request after the 150th 5 ms slower than the one before) is still saturated."""
    times = [i * 12_000 for i in range(60)] + [720_000 + i * 10_000 for i in range(250)]
    times += [times[-1] + 10_000 + i * 2_000 for i in range(40)]
    verdict = judge([_req(t, 20_000, 100_000) for t in times])
    assert verdict.verdict == "steady", verdict.reasons
    slower = [_req(i * 10_000, 20_000, 100_000 + max(0, i - 150) * 5_000) for i in range(300)]
    verdict = judge(slower)
    assert verdict.verdict == "saturated", verdict.reasons
    assert "beyond the arrivals of the last median E2E" in verdict.reasons[-1]


# A batching server (physics, Llama-3.1-8B on one H100: about 33 requests/s of 512 -> 256
# tokens, measured by a rate sweep that plateaus at 32.6-33.3) takes an overload into its batch:
# first tokens stay prompt, so the TTFT trend and backlog show nothing.
BATCHING = {
    "model": "meta-llama/llama-3.1-8b-instruct",
    "hardware": "H100",
    "tp": 1,
    "workload": {
        "arrival": "poisson",
        "prompt_tokens": {"distribution": "gaussian", "mean": 512, "stdev": 128, "min": 16,
                          "max": 2048},
        "output_tokens": {"distribution": "gaussian", "mean": 256, "stdev": 64, "min": 1,
                          "max": 1024},
    },
}  # fmt: skip


def _batching(rate: float, n: int, instances: int = 1):
    workload = {**BATCHING["workload"], "rate": rate, "num_requests": n}
    scenario = {**BATCHING, "workload": workload, "cluster": {"num_instances": instances}}
    return simulator.simulate(scenario, warn_unsteady=False).steady_state


def test_a_short_run_offered_2x_a_batching_servers_capacity_is_not_steady():
    """80 req/s on one instance for 337 requests was judged steady (the plan then passed 2.4x
    overloaded fleets): its window (3.8 s) is shorter than twice its median E2E, so it cannot
    show a steady state; a shorter run under capacity cannot either."""
    state = _batching(80, 337)
    assert state.verdict == "too short" and "median E2E" in state.reasons[0]
    assert state.achieved_rps < 0.5 * state.offered_rps


def test_a_long_overload_shows_in_the_requests_in_the_system():
    """3 instances (about 100 req/s) offered 120: the number in the system grows in both
    halves of the window though first tokens stay prompt."""
    state = _batching(120, 5000, instances=3)
    assert state.verdict == "saturated"
    assert any("requests in the system" in r for r in state.reasons)
    assert _batching(120, 1000, instances=5).verdict == "steady"  # under capacity, settled


@pytest.mark.parametrize("seed", [9, 12])
def test_a_short_run_at_60_percent_load_is_not_called_saturated(seed):
    """400 requests at 20 req/s (about 60 % of the ~33 req/s above): seeds 9 and 12 end with a
    burst of arrivals (the number in the system went 46 -> 47 -> 80 for seed 9, 37 -> 47 -> 74
    for 12), which the in-system rule took for a queue until it counted what the burst
    explains."""
    workload = {**BATCHING["workload"], "rate": 20, "num_requests": 400}
    state = simulator.simulate(
        {**BATCHING, "seed": seed, "workload": workload}, warn_unsteady=False
    ).steady_state
    assert state.verdict == "steady", state.reasons
