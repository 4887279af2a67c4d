"""The v2 workload generator and sessions: statistical laws with fixed seeds, session laws,
stream independence, laziness, and whole-file loading."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import simulator
from simulator.engine.request import RequestState
from simulator.limits import MAX_REQUESTS
from simulator.workload.generator import WorkloadStream
from simulator.workload.spec import load_workload_spec, workload_spec_from_dict

DATA = Path(__file__).parent.parent / "data" / "workloads"


def client(cid: str, fraction: float = 1.0, **extra) -> dict:
    return {
        "id": cid,
        "rate_fraction": fraction,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 100}},
        "output_distribution": {"type": "constant", "params": {"value": 10}},
        **extra,
    }


def spec(clients: list[dict], **top) -> object:
    return workload_spec_from_dict({"version": "2", "clients": clients, **top})


def test_rate_fractions_split_the_aggregate_rate():
    # 100 req/s for 200 s = 20,000 requests expected; fractions 1:2:7.
    s = spec([client("a", 1), client("b", 2), client("c", 7)], aggregate_rate=100)
    reqs = list(WorkloadStream(s, seed=1, horizon_us=200_000_000))
    counts = {cid: sum(r.client_id == cid for r in reqs) for cid in "abc"}
    assert len(reqs) == pytest.approx(20_000, rel=0.03)
    assert counts["a"] / len(reqs) == pytest.approx(0.1, abs=0.01)
    assert counts["b"] / len(reqs) == pytest.approx(0.2, abs=0.01)
    assert counts["c"] / len(reqs) == pytest.approx(0.7, abs=0.01)


def test_stream_is_in_arrival_order_with_sequential_ids_and_truncated():
    s = spec([client("a", 1), client("b", 3)], aggregate_rate=50, num_requests=5000)
    reqs = list(WorkloadStream(s, seed=3))
    assert len(reqs) == 5000
    arrivals = [r.arrival_us for r in reqs]
    assert arrivals == sorted(arrivals)
    assert [r.request_id for r in reqs[:3]] == ["request_0", "request_1", "request_2"]
    assert [r.index for r in reqs] == list(range(5000))


def test_adding_a_client_leaves_another_clients_stream_unchanged():
    # Client a has 10 req/s in both specs (fraction 1 of 10, or 1 of 2 fractions of 20).
    alone = spec([client("a")], aggregate_rate=10, num_requests=300)
    joined = spec([client("a"), client("b")], aggregate_rate=20, num_requests=600)
    a_alone = [(r.arrival_us, r.input_tokens) for r in WorkloadStream(alone, seed=9)]
    a_joined = [
        (r.arrival_us, r.input_tokens) for r in WorkloadStream(joined, seed=9) if r.client_id == "a"
    ]
    n = min(len(a_alone), len(a_joined))
    assert n > 250 and a_alone[:n] == a_joined[:n]


def test_lifecycle_windows_are_honoured():
    windows = [
        {"start_us": 1_000_000, "end_us": 2_000_000},
        {"start_us": 5_000_000, "end_us": 6_000_000},
    ]
    s = spec([client("w", lifecycle={"windows": windows})], aggregate_rate=200)
    reqs = list(WorkloadStream(s, seed=2, horizon_us=10_000_000))
    assert reqs and all(1e6 <= r.arrival_us < 2e6 or 5e6 <= r.arrival_us < 6e6 for r in reqs)
    # Inside the windows the client keeps its full rate: ~200 per 1 s window.
    assert len(reqs) == pytest.approx(400, rel=0.15)


def test_overlapping_windows_are_active_in_any_of_them():
    """A client is active when the time lies in any of its windows. A long window [0, 100 s)
    overlapped by a later, shorter one [10, 20 s) was cut at 20 s: 199 arrivals at 10 req/s
    where the union's 100 s bring ~1,000 (BLIS: 1,010). The windowed client's arrivals are
    the plain client's (same seed and id) inside the union, here all of them."""
    windows = [
        {"start_us": 0, "end_us": 100_000_000},
        {"start_us": 10_000_000, "end_us": 20_000_000},
    ]
    windowed = spec([client("c", lifecycle={"windows": windows})], aggregate_rate=10)
    plain = spec([client("c")], aggregate_rate=10)
    horizon_us = 100_000_000
    got = [r.arrival_us for r in WorkloadStream(windowed, seed=42, horizon_us=horizon_us)]
    expected = [r.arrival_us for r in WorkloadStream(plain, seed=42, horizon_us=horizon_us)]
    assert got == expected and sum(t >= 20_000_000 for t in got) == pytest.approx(800, rel=0.1)


def test_merged_windows_are_the_union_as_disjoint_intervals():
    from simulator.workload.generator import merged_windows

    assert merged_windows([(10, 20), (0, 100), (150, 160), (160, 170), (200, 210)]) == [
        (0, 100),
        (150, 170),
        (200, 210),
    ]
    assert merged_windows([]) == []


def test_clients_sharing_an_id_are_independent_sources():
    """Two clients with one id drew the same streams: every arrival twice (half the merged
    gaps 0, CV 1.74). Two independent Poisson streams merge into one (CV ~ 1); the same holds
    for a client named like a cohort's member."""
    s = spec([client("x"), client("x")], aggregate_rate=10, num_requests=10_000)
    arrivals = np.array([r.arrival_us for r in WorkloadStream(s, seed=42)], dtype=float)
    gaps = np.diff(arrivals)
    assert np.mean(gaps == 0) < 0.01
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


def test_a_window_far_ahead_filters_the_same_arrivals_and_is_reached_quickly():
    """Windows only filter a client's arrival stream: the windowed client's arrivals are the
    unwindowed client's (same seed, same id) that fall inside a window. The generator skips
    whole chunks of draws that end before a window opens (a window ten minutes away at 2,000
    req/s is 1.2 million arrivals to pass); the skip must not change a single arrival."""
    windows = [{"start_us": 600_000_000, "end_us": 601_000_000}]
    windowed = spec([client("w", lifecycle={"windows": windows})], aggregate_rate=2000)
    plain = spec([client("w")], aggregate_rate=2000)
    horizon_us = 601_000_000
    got = [r.arrival_us for r in WorkloadStream(windowed, seed=4, horizon_us=horizon_us)]
    (plan,) = WorkloadStream(plain, seed=4, horizon_us=horizon_us).plans
    expected = [t for t in plan.arrival_times(horizon_us) if t >= 600_000_000]
    assert got == expected and len(got) == pytest.approx(2000, rel=0.1)


def test_prefix_groups_share_token_content():
    s = spec(
        [client("x", prefix_group="g", prefix_length=64), client("y", prefix_group="h")],
        aggregate_rate=10,
        num_requests=40,
    )
    reqs = list(WorkloadStream(s, seed=4))
    g = [r for r in reqs if r.prefix_group == "g"]
    h = [r for r in reqs if r.prefix_group == "h"]
    # prefix + sampled input (docs/behaviour.md §9.3)
    assert all(r.input_tokens == 64 + 100 for r in g)
    assert all(r.input_tokens == 50 + 100 for r in h)  # default prefix length 50
    # 64 shared tokens = 4 full blocks of 16: identical chained hashes, then they diverge.
    first, second = g[0].block_hashes(5, 16), g[1].block_hashes(5, 16)
    assert first[:4] == second[:4] and first[4] != second[4]
    assert h[0].block_hashes(3, 16)[0] != first[0]


def test_private_content_is_marked_only_where_no_other_request_can_share_it():
    """`private_from_token` (the KV cache defers hashing from there): the first token no other
    request can hold. Equal content keys must never be marked, or a prefix hit would be lost."""
    s = spec(
        [
            client("plain"),
            client("grouped", prefix_group="g", prefix_length=64),
            client("twin"),
            client("twin"),  # the same id, yet another source: content keys of its own
            client(
                "chat", reasoning={"multi_turn": {"max_rounds": 3, "context_growth": "accumulate"}}
            ),
            client("fresh", reasoning={"multi_turn": {"max_rounds": 3}}),
        ],
        aggregate_rate=50,
        num_requests=300,
    )
    reqs = list(WorkloadStream(s, seed=2))
    marks = {}
    for r in reqs:
        marks.setdefault(r.client_id, set()).add(r.private_from_token)
    assert marks == {"plain": {0}, "grouped": {64}, "twin": {0}, "chat": {-1}, "fresh": {0}}
    # The law behind the marks: a request's hashes from its private block on are its own.
    owner: dict[int, str] = {}
    for r in reqs:
        if r.private_from_token >= 0:
            blocks = r.input_tokens // 16
            for h in r.block_hashes(blocks, 16)[r.private_from_token // 16 :]:
                assert owner.setdefault(h, r.request_id) == r.request_id


def test_generation_is_lazy():
    """A spec of the most requests a run may hold (MAX_REQUESTS, 10^8) yields its first
    requests at once (nothing is materialised)."""
    s = spec([client("a")], aggregate_rate=1000, num_requests=MAX_REQUESTS)
    first = list(itertools.islice(WorkloadStream(s, seed=1), 1000))
    assert len(first) == 1000


def test_arrival_process_statistics_survive_the_generator():
    s = spec([{**client("g"), "arrival": {"process": "gamma", "cv": 3.0}}], aggregate_rate=50)
    reqs = list(WorkloadStream(s, seed=5, horizon_us=2_000_000_000))
    gaps = np.diff([r.arrival_us for r in reqs])
    assert len(reqs) / 2000 == pytest.approx(50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def _run_sessions(multi_turn: dict, horizon_us: int = 60_000_000, **extra):
    s = {
        "version": "2",
        "aggregate_rate": 2,
        "clients": [
            client(
                "agent",
                reasoning={"multi_turn": multi_turn},
                output_distribution={
                    "type": "gaussian",
                    "params": {"mean": 120, "std_dev": 40, "min": 5, "max": 400},
                },
                **extra,
            )
        ],
    }
    return simulator.simulate({"workload": s, "horizon_us": horizon_us})


def _by_session(result):
    sessions: dict[str, list] = {}
    for r in result.request_records:
        sessions.setdefault(r.session_id, []).append(r)
    return {k: sorted(v, key=lambda r: r.round_index) for k, v in sessions.items()}


def test_closed_loop_rounds_follow_completion_plus_think_time():
    think = 1_500_000
    result = _run_sessions({"max_rounds": 5, "think_time_us": think})
    sessions = _by_session(result)
    assert len(sessions) > 50
    for rounds in sessions.values():
        assert [r.round_index for r in rounds] == list(range(len(rounds)))
        for prev, nxt in itertools.pairwise(rounds):
            assert prev.state is RequestState.COMPLETED
            assert nxt.arrival_us == prev.completion_us + think  # INV-10, with equality
    counts = result.session_counts
    assert counts["total"] == len(sessions)
    assert counts["completed"] + counts["cancelled"] + counts["horizon_interrupted"] == len(
        sessions
    )
    assert counts["completed"] == sum(
        len(r) == 5 and r[-1].state is RequestState.COMPLETED for r in sessions.values()
    )


def test_accumulated_context_grows_by_prompt_plus_output():
    result = _run_sessions({"max_rounds": 4, "think_time_us": 0, "context_growth": "accumulate"})
    checked = 0
    for rounds in _by_session(result).values():
        for prev, nxt in itertools.pairwise(rounds):
            assert nxt.input_tokens == prev.input_tokens + prev.generated_tokens + 100
            assert nxt.cached_tokens >= prev.input_tokens // 16 * 16  # earlier rounds are cached
            checked += 1
    assert checked > 50


def test_a_timed_out_round_cancels_its_session():
    # 20 ms deadline: many first rounds cannot finish 120 output tokens in time.
    result = _run_sessions({"max_rounds": 3, "think_time_us": 0}, timeout=20_000)
    counts = result.session_counts
    assert counts["cancelled"] > 0
    for rounds in _by_session(result).values():
        states = [r.state for r in rounds]
        if RequestState.TIMED_OUT in states:
            assert states.index(RequestState.TIMED_OUT) == len(states) - 1  # nothing after it
    assert (
        sum(counts[k] for k in ("completed", "cancelled", "horizon_interrupted")) == counts["total"]
    )


def test_open_loop_rounds_are_spaced_by_think_time_plus_output_tokens():
    s = spec(
        [
            client(
                "o",
                closed_loop=False,
                reasoning={"multi_turn": {"max_rounds": 3, "think_time_us": 1000}},
            )
        ],
        aggregate_rate=5,
        num_requests=60,
    )
    by_session: dict[str, list] = {}
    for r in WorkloadStream(s, seed=8):
        by_session.setdefault(r.session_id, []).append(r)
    assert by_session
    for rounds in by_session.values():
        rounds.sort(key=lambda r: r.round_index)
        for prev, nxt in itertools.pairwise(rounds):
            assert nxt.arrival_us == prev.arrival_us + 1000 + prev.output_tokens


@pytest.mark.parametrize("num_requests", [1, 7, 60, 300])
def test_closed_loop_rounds_count_against_num_requests_where_open_loop_would_place_them(
    num_requests,
):
    """BLIS expands every round of every session open-loop, cuts the merged list at
    num_requests and keeps the first rounds. With constant lengths the open-loop stream's
    rounds fall exactly where the closed-loop placeholders do, so the sessions started are
    the first rounds among the open-loop stream's first num_requests requests."""

    def stream(closed_loop: bool):
        mt = {"max_rounds": 4, "think_time_us": 250_000}
        c = client("s", closed_loop=closed_loop, reasoning={"multi_turn": mt})
        return list(WorkloadStream(spec([c], aggregate_rate=5, num_requests=num_requests), seed=3))

    open_loop, closed = stream(False), stream(True)
    assert len(open_loop) == num_requests
    first_rounds = [r for r in open_loop if r.round_index == 0]
    assert [r.round_index for r in closed] == [0] * len(first_rounds)
    assert [r.arrival_us for r in closed] == [r.arrival_us for r in first_rounds]
    assert [r.request_id for r in closed] == [f"request_{i}" for i in range(len(closed))]
    if num_requests >= 60:
        assert len(closed) < num_requests / 2  # most places went to later rounds


def test_closed_loop_sessions_total_about_num_requests():
    """The helper's case that found the old rule (every first round counted alone): 300
    requests of 5-round sessions started 300 sessions and sent 1,500 requests; BLIS starts
    64 and sends 320 (both releases, seed 3). Follow-ups are not capped, so the total is
    near num_requests rather than equal to it."""
    out = {"type": "gaussian", "params": {"mean": 50, "std_dev": 10, "min": 10, "max": 100}}
    c = client(
        "s",
        output_distribution=out,
        reasoning={"multi_turn": {"max_rounds": 5, "think_time_us": 1_000_000}},
    )
    result = simulator.simulate(
        {"workload": {"version": "2", "aggregate_rate": 2, "num_requests": 300, "clients": [c]}}
    )
    sessions = result.session_counts["total"]
    assert 55 <= sessions <= 70
    assert len(result.requests) == pytest.approx(300, rel=0.1)


def test_single_session_starts_one_session_per_client():
    s = spec(
        [client("s", reasoning={"multi_turn": {"max_rounds": 3, "single_session": True}})],
        aggregate_rate=5,
        horizon=100_000_000,
    )
    stream = WorkloadStream(s, seed=8)
    reqs = list(stream)
    assert len({r.session_id for r in reqs}) == 1 and len(reqs) == 1  # later rounds: closed loop


def test_a_blis_file_with_every_feature_loads_and_runs():
    s = load_workload_spec(DATA / "everything.yaml")
    assert s.clients[0].slo_class == "critical"  # v1 "realtime" upgraded
    result = simulator.simulate(
        {"workload_spec": str(DATA / "everything.yaml"), "engine": {"total_kv_blocks": 50_000}}
    )
    df = result.requests
    assert set(df.client_id) >= {"chat", "docs", "vision", "agent", "scripted"}
    assert any(c.startswith("office-") for c in df.client_id)
    assert (df[df.client_id == "vision"].input_tokens >= 40 + 50).all()  # text + >=1 audio
    assert len(result.per_slo) > 1
    assert result.session_counts["total"] > 0
    s = result.summary
    assert s["injected_requests"] == len(result.request_records)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (
            {"reasoning": {"reason_ratio_distribution": {"type": "gaussian", "params": {
                "mean": 50, "std_dev": 10, "min": 80, "max": 20}}}},
            "clients[0].reasoning.reason_ratio_distribution.params.min",
        ),
        (
            {"multimodal": {"image_count_distribution": {"type": "constant",
                                                         "params": {"value": 1}},
                            "image_distribution": {"type": "gaussian", "params": {
                                "mean": 50, "std_dev": 10, "min": 80, "max": 20}}}},
            "clients[0].multimodal.image_distribution.params.min",
        ),
    ],
)  # fmt: skip
def test_a_bad_reasoning_or_multimodal_law_names_its_field(extra, field):
    from simulator.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        list(WorkloadStream(spec([client("a", **extra)], aggregate_rate=1, num_requests=2), 1))
    assert str(caught.value).startswith(f"{field}: invalid value 80")
