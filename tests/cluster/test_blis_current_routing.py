"""BLIS-current's routing (docs/cluster.md "Scorers", "Routing profiles", "Cache signal
delay"): the scorers it added, its meanings of `queue-depth` and `precise-prefix-cache`, its
default profile and signal ages, and the delayed view of the prefix caches. Laws first, each
with hand-computed cases; the whole-run comparisons with BLIS's own runs are in
test_blis_current_routing_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simulator
from simulator.cli import app
from simulator.cluster.policy_bundle import policy_bundle_overrides
from simulator.cluster.prefix_index import CacheSignalView
from simulator.cluster.routing import (
    BLIS_CURRENT,
    LOAD_AWARE_QUEUE_CAP,
    ROUTING_PROFILES,
    SCORERS,
    ActiveRequestsScorer,
    LoadAwareScorer,
    NoHitLruScorer,
    PrecisePrefixCacheCurrentScorer,
    QueueDepthCurrentScorer,
    QueueDepthScorer,
    RunningRequestsScorer,
    VllmDpScorer,
    Weighted,
    make_routing_policy,
    make_scorer,
    resolve_routing,
    resolve_scorers,
)
from simulator.cluster.snapshot import InstanceSnapshot
from simulator.engine.kv_cache import KVCache
from simulator.engine.request import Request
from simulator.errors import ConfigError
from simulator.scenario import apply_overrides, scenario_from_dict

BS = 4  # small blocks keep the prefix examples readable
LLAMA_8B = "meta-llama/llama-3.1-8b-instruct"


def snap(i: int, *, queue: int = 0, batch: int = 0, in_flight: int = 0, kv: float = 0.0):
    return InstanceSnapshot(
        f"instance_{i}",
        i,
        queue_depth=queue,
        batch_size=batch,
        in_flight=in_flight,
        kv_utilization=kv,
    )


def prompt(rid: str, *segments: tuple[str, int]) -> Request:
    """A request whose prompt is the given (content key, length) segments."""
    return Request(rid, 0, sum(n for _, n in segments), 5, segments=list(segments))


def counts_probe(counts: dict[int, int]):
    """A kv_probe that reports `counts[instance index]` cached leading blocks."""
    return lambda index, req: counts[index]


R = prompt("r", ("r", 10))  # 2 full blocks of its own content


# ------------------------------------------------------------------- hand-computed scores


def test_queue_depth_current_reads_the_wait_queue_only():
    # Queue depths 2, 0, 4 and batches 0, 9, 0: BLIS-current min-max inverts the queue depths
    # alone, (4 − q)/(4 − 0) = 0.5, 1, 0. March's queue-depth inverts queue + batch + in-flight
    # = 2, 9, 4: (9 − 2)/7 = 1, 0, (9 − 4)/7 = 5/7.
    cands = [snap(0, queue=2), snap(1, batch=9), snap(2, queue=4)]
    assert QueueDepthCurrentScorer().score_list(R, cands) == [0.5, 1.0, 0.0]
    assert QueueDepthScorer().score_list(R, cands) == [1.0, 0.0, 5 / 7]


def test_active_requests_hand_values():
    # m = max in-flight = 4: (4 − 0) → 1 (idle), (4 − 1)/4 = 0.75, (4 − 4)/4 = 0.
    scorer = ActiveRequestsScorer()
    assert scorer.score_list(R, [snap(0), snap(1, in_flight=1), snap(2, in_flight=4)]) == [
        1.0,
        0.75,
        0.0,
    ]
    # Not min-max: equal non-zero counts all score (m − m)/m = 0, equal zero counts all 1.
    assert scorer.score_list(R, [snap(0, in_flight=3), snap(1, in_flight=3)]) == [0.0, 0.0]
    assert scorer.score_list(R, [snap(0), snap(1)]) == [1.0, 1.0]


def test_running_requests_and_vllm_dp_hand_values():
    cands = [snap(0, queue=1, batch=0), snap(1, queue=0, batch=3), snap(2, queue=0, batch=6)]
    # Batches 0, 3, 6: (6 − b)/6 = 1, 0.5, 0.
    assert RunningRequestsScorer().score_list(R, cands) == [1.0, 0.5, 0.0]
    # vllm-dp load 4·queue + batch = 4, 3, 6: (6 − x)/(6 − 3) = 2/3, 1, 0 — one waiting
    # request outweighs three running ones.
    assert VllmDpScorer().score_list(R, cands) == [2 / 3, 1.0, 0.0]


def test_load_aware_hand_values():
    # 0.5 for an empty queue, else 0.5·(1 − min(q, 128)/128).
    queues = [0, 1, 64, 128, 500]
    cands = [snap(i, queue=q) for i, q in enumerate(queues)]
    assert LoadAwareScorer().score_list(R, cands) == [0.5, 0.5 * 127 / 128, 0.25, 0.0, 0.0]
    assert LOAD_AWARE_QUEUE_CAP == 128


def test_precise_prefix_cache_current_is_min_max_over_counts():
    cands = [snap(0), snap(1), snap(2)]
    # Cached leading blocks 0, 1, 2 of a 4-block prompt: (c − 0)/(2 − 0) = 0, 0.5, 1. The
    # longest cached prefix scores 1 even though it covers half the prompt (March-style
    # `precise-prefix-cache@mar` gives c/4 = 0, 0.25, 0.5).
    r = prompt("p", ("x", 17))
    current = PrecisePrefixCacheCurrentScorer(BS, counts_probe({0: 0, 1: 1, 2: 2}))
    assert current.score_list(r, cands) == [0.0, 0.5, 1.0]
    mar = make_scorer(
        "precise-prefix-cache@mar", block_size=BS, kv_probe=counts_probe({0: 0, 1: 1, 2: 2})
    )
    assert mar.score_list(r, cands) == [0.0, 0.25, 0.5]
    # All equal (no hit anywhere) → 1 for all; so does a prompt shorter than a block, whose
    # probe is not even asked.
    none = PrecisePrefixCacheCurrentScorer(BS, counts_probe({0: 0, 1: 0, 2: 0}))
    assert none.score_list(r, cands) == [1.0, 1.0, 1.0]
    asked = []
    short = PrecisePrefixCacheCurrentScorer(BS, lambda i, q: asked.append(i) or 9)
    assert short.score_list(prompt("s", ("y", 3)), cands) == [1.0, 1.0, 1.0]
    assert asked == []


def test_cache_scorers_need_a_probe():
    for name in ("precise-prefix-cache@current", "no-hit-lru"):
        with pytest.raises(ConfigError, match=name):
            make_routing_policy("weighted", scorers=f"{name}:1", rng=np.random.default_rng(0))


# --------------------------------------------------------------------- laws of every scorer

_STATELESS = {
    "queue-depth@current": lambda s: s.queue_depth,
    "running-requests": lambda s: s.batch_size,
    "vllm-dp": lambda s: 4 * s.queue_depth + s.batch_size,
    "active-requests": lambda s: s.in_flight,
    "load-aware": lambda s: min(s.queue_depth, LOAD_AWARE_QUEUE_CAP),
}
_CANDIDATES = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 300), st.integers(0, 300)),
    min_size=1,
    max_size=8,
).map(lambda rows: [snap(i, queue=q, batch=b, in_flight=f) for i, (q, b, f) in enumerate(rows)])


@settings(max_examples=200, deadline=None)
@given(_CANDIDATES, st.sampled_from(sorted(_STATELESS)))
def test_load_scorers_are_bounded_and_prefer_the_less_loaded(cands, name):
    """Scores lie in [0, 1] (load-aware in [0, 0.5]), one per candidate; a candidate with less
    of the scorer's load never scores lower; for the min-max scorers the least loaded scores
    1 and, whenever loads differ, the most loaded 0."""
    scorer = SCORERS[name]()
    scores = scorer.score_list(R, cands)
    assert len(scores) == len(cands)
    top = 0.5 if name == "load-aware" else 1.0
    assert all(0.0 <= s <= top for s in scores)
    load = [_STATELESS[name](c) for c in cands]
    for i in range(len(cands)):
        for j in range(len(cands)):
            if load[i] < load[j]:
                assert scores[i] >= scores[j]
    least, lo, hi = scores[load.index(min(load))], min(load), max(load)
    if name == "active-requests":
        # Not min-max: the least busy scores (m − its count)/m, 0 when all are equally busy.
        assert least == (1.0 if lo == 0 else (hi - lo) / hi)
    elif name == "load-aware":
        # Not normalised either: an absolute scale, 0.5 only for an empty queue.
        assert least == (0.5 if lo == 0 else 0.5 * (1 - lo / LOAD_AWARE_QUEUE_CAP))
    else:
        assert least == top
    if name in ("queue-depth@current", "running-requests", "vllm-dp") and min(load) < max(load):
        assert scores[load.index(max(load))] == 0.0
    assert scorer.score_list(R, cands) == scores  # stateless: asking again changes nothing


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_precise_prefix_cache_current_orders_by_cached_blocks(counts):
    cands = [snap(i) for i in range(len(counts))]
    scores = PrecisePrefixCacheCurrentScorer(BS, counts_probe(dict(enumerate(counts)))).score_list(
        prompt("p", ("x", 30)), cands
    )
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores[counts.index(max(counts))] == 1.0
    for i, j in ((i, j) for i in range(len(counts)) for j in range(len(counts))):
        if counts[i] > counts[j]:
            assert scores[i] > scores[j]


# -------------------------------------------------------------------------------- no-hit-lru


def _lru(counts: dict[int, int] | None = None) -> NoHitLruScorer:
    return NoHitLruScorer(BS, counts_probe(counts) if counts else (lambda i, r: 0))


def test_no_hit_lru_ranks_never_used_then_least_recent():
    scorer = _lru()
    cands = [snap(0), snap(1), snap(2)]
    a, b, c = (prompt(x, (x, 8)) for x in "abc")
    # Nobody used: ranks 0, 1, 2 in candidate order → 1 − rank/2 = 1, 0.5, 0.
    assert scorer.score_list(a, cands) == [1.0, 0.5, 0.0]
    scorer.observe(a, cands[0])
    # instance_0 used: the never-used 1, 2 rank 0, 1; then instance_0 rank 2 → 0, 1, 0.5.
    assert scorer.score_list(b, cands) == [0.0, 1.0, 0.5]
    scorer.observe(b, cands[1])
    # Never used: instance_2 (rank 0); then least to most recent: 0 (rank 1), 1 (rank 2).
    assert scorer.score_list(c, cands) == [0.5, 0.0, 1.0]


def test_no_hit_lru_warm_request_scores_half_and_learns_nothing():
    scorer = _lru({0: 0, 1: 2})  # instance_1 caches 2 leading blocks: the request is warm
    cands = [snap(0), snap(1)]
    warm = prompt("w", ("w", 8))
    assert scorer.score_list(warm, cands) == [0.5, 0.5]
    scorer.observe(warm, cands[1])
    assert scorer._recent == []  # noqa: SLF001


def test_no_hit_lru_single_candidate_and_observe_only_the_last_scored():
    scorer = _lru()
    a, b = prompt("a", ("a", 8)), prompt("b", ("b", 8))
    assert scorer.score_list(a, [snap(3)]) == [1.0]
    scorer.score_list(b, [snap(0), snap(1)])
    scorer.observe(a, snap(3))  # not the request scored last: ignored
    assert scorer._recent == []  # noqa: SLF001
    scorer.observe(b, snap(1))
    scorer.observe(b, snap(1))  # once only
    assert scorer._recent == ["instance_1"]  # noqa: SLF001


def test_no_hit_lru_forgets_instances_that_are_no_longer_candidates():
    scorer = _lru()
    for i, rid in enumerate("ab"):
        req = prompt(rid, (rid, 8))
        scorer.score_list(req, [snap(0), snap(1)])
        scorer.observe(req, snap(i))
    # instance_0 left the candidates: forgotten, so when it returns it is never-used again.
    scorer.score_list(prompt("c", ("c", 8)), [snap(1), snap(2)])
    assert scorer._recent == ["instance_1"]  # noqa: SLF001
    assert scorer.score_list(prompt("d", ("d", 8)), [snap(0), snap(1)]) == [1.0, 0.0]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.lists(st.booleans(), min_size=1, max_size=40), st.integers(0, 99))
def test_no_hit_lru_alone_rotates_cold_requests_over_the_instances(n, warm_flags, seed):
    """Law: routed by no-hit-lru alone over a fixed set of n instances, the k-th cold request
    goes to instance k mod n, whatever warm requests (ties, broken at random, not learnt)
    come in between."""
    warm = {f"q{k}" for k, is_warm in enumerate(warm_flags) if is_warm}

    def probe(index, req):
        return 1 if req.request_id in warm else 0

    policy = make_routing_policy(
        "weighted", scorers="no-hit-lru:1", rng=np.random.default_rng(seed), block_size=BS,
        kv_probe=probe,
    )  # fmt: skip
    cands = [snap(i) for i in range(n)]
    cold_targets = []
    for k in range(len(warm_flags)):
        req = prompt(f"q{k}", (f"q{k}", 8))
        decision = policy.route(req, cands, 0)
        policy.observe(req, cands[decision.target])
        if req.request_id not in warm:
            cold_targets.append(decision.target)
    assert cold_targets == [k % n for k in range(len(cold_targets))]


# ----------------------------------------------------------------------- weighted, profiles


def test_weighted_ties_go_to_break_tie_in_candidate_order():
    """Exact ties (as BLIS: float equality of the composites) are handed to `break_tie` in
    candidate order; with one best candidate nothing is drawn."""
    seen = []

    class Recording(Weighted):
        def break_tie(self, req, tied):
            seen.append([c.index for c in tied])
            return tied[-1]

    policy = Recording(
        [(QueueDepthCurrentScorer(), 1.0), (RunningRequestsScorer(), 1.0)],
        np.random.default_rng(0),
    )
    # Queue 0, 0, 1 and batch 2, 2, 0: composites 0.5·1 + 0.5·0 = 0.5, 0.5, 0.5·0 + 0.5·1 =
    # 0.5: a three-way tie.
    cands = [snap(0, batch=2), snap(1, batch=2), snap(2, queue=1)]
    assert policy.route(R, cands, 0).target == 2
    assert seen == [[0, 1, 2]]
    assert policy.route(R, [snap(0, queue=1), snap(1)], 0).target == 1
    assert seen == [[0, 1, 2]]


def test_blis_current_default_profile_ties_everything_before_the_first_refresh():
    """BLIS-current's default (precise-prefix-cache:2, queue-depth:1, kv-utilization:1,
    weights 0.5/0.25/0.25) on snapshots that are all zero — what the router sees before its
    first 50 ms refresh — scores every candidate 0.5·1 + 0.25·1 + 0.25·(1 − 0) = 1: a tie."""
    scorers = resolve_scorers(None, "blis-current")
    assert scorers == "precise-prefix-cache@current:2,queue-depth@current:1,kv-utilization:1"
    policy = make_routing_policy(
        "weighted", scorers=scorers, rng=np.random.default_rng(0), block_size=BS,
        kv_probe=counts_probe({0: 0, 1: 0, 2: 0, 3: 0}),
    )  # fmt: skip
    decision = policy.route(R, [snap(i) for i in range(4)], 0)
    assert decision.scores == dict.fromkeys((f"instance_{i}" for i in range(4)), 1.0)


def test_profiles_and_resolution():
    assert sorted(ROUTING_PROFILES) == ["blis-current", "blis-mar"]
    # servesim's own profile leaves everything as given: unset scorers stay unset (the routing
    # module's default is BLIS-Mar's list) and the signals are fresh.
    assert resolve_routing(
        "blis-mar", scorers=None, snapshot_refresh_interval_us=None, cache_signal_delay_us=None
    ) == {"scorers": None, "snapshot_refresh_interval_us": 0, "cache_signal_delay_us": 0}
    assert resolve_scorers("queue-depth:2,load-aware:1", "blis-mar") == (
        "queue-depth:2,load-aware:1"
    )
    # BLIS-current: its default list and 50 ms signal ages; given values win.
    assert resolve_routing(
        "blis-current", scorers=" queue-depth :2,vllm-dp:1", snapshot_refresh_interval_us=0,
        cache_signal_delay_us=None,
    ) == {
        "scorers": "queue-depth@current:2,vllm-dp:1",
        "snapshot_refresh_interval_us": 0,
        "cache_signal_delay_us": BLIS_CURRENT.cache_signal_delay_us,
    }  # fmt: skip
    assert BLIS_CURRENT.snapshot_refresh_interval_us == BLIS_CURRENT.cache_signal_delay_us == 50_000
    # A pinned meaning is kept, and malformed text is left for the parser to report.
    assert resolve_scorers("queue-depth@mar:1", "blis-current") == "queue-depth@mar:1"
    assert resolve_scorers("queue-depth", "blis-current") == "queue-depth@current"
    with pytest.raises(ConfigError, match="unknown routing profile 'blis-next'"):
        resolve_scorers(None, "blis-next")


def test_scenario_resolves_the_profile_and_dumps_what_was_given():
    sc = scenario_from_dict(
        {"cluster": {"routing": {"policy": "weighted", "profile": "blis-current"},
                     "pd": {"prefill": {"routing_scorers": "queue-depth:1"}}}}
    )  # fmt: skip
    routing = sc.cluster.routing
    assert routing.scorers == BLIS_CURRENT.default_scorers.replace(
        "queue-depth", "queue-depth@current"
    ).replace("precise-prefix-cache", "precise-prefix-cache@current")
    assert (routing.snapshot_refresh_interval_us, routing.cache_signal_delay_us) == (
        50_000,
        50_000,
    )
    assert sc.cluster.pd.prefill.routing_scorers == "queue-depth@current:1"
    dumped = sc.model_dump()["cluster"]
    assert dumped["routing"]["scorers"] is None
    assert dumped["routing"]["snapshot_refresh_interval_us"] is None
    assert dumped["pd"]["prefill"]["routing_scorers"] == "queue-depth:1"
    # Switching the profile (an override dumps and validates again) re-resolves everything.
    back = apply_overrides(sc, {"cluster.routing.profile": "blis-mar"})
    assert back.cluster.routing.scorers is None
    assert back.cluster.routing.snapshot_refresh_interval_us == 0
    assert back.cluster.pd.prefill.routing_scorers == "queue-depth:1"
    # An explicit value survives a profile switch.
    pinned = apply_overrides(sc, {"cluster.routing.cache_signal_delay_us": 7})
    switched = apply_overrides(pinned, {"cluster.routing.profile": "blis-mar"})
    assert switched.cluster.routing.cache_signal_delay_us == 7


def test_scenario_profile_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"cluster\.routing\.profile: unknown routing profile"):
        scenario_from_dict({"cluster": {"routing": {"profile": "blis-head"}}})
    with pytest.raises(ConfigError, match=r"cluster\.routing\.cache_signal_delay_us"):
        scenario_from_dict({"cluster": {"routing": {"cache_signal_delay_us": -1}}})


def test_policy_bundle_accepts_the_new_scorers():
    out = policy_bundle_overrides(
        {"routing": {"policy": "weighted", "scorers": [
            {"name": "no-hit-lru", "weight": 2}, {"name": "load-aware", "weight": 1},
            {"name": "queue-depth@current", "weight": 1}]}}
    )  # fmt: skip
    assert out["cluster.routing.scorers"] == "no-hit-lru:2.0,load-aware:1.0,queue-depth@current:1.0"


# ----------------------------------------------------------------------- cache signal delay


class _Clock:
    def __init__(self) -> None:
        self.now_us = 0

    def __call__(self) -> int:
        return self.now_us


def _indexes_with(*prompts_per_instance: list[Request]) -> list[dict[int, int]]:
    """Per instance, a hash index holding the full blocks of the given prompts."""
    out = []
    for prompts in prompts_per_instance:
        index: dict[int, int] = {}
        for p in prompts:
            n = p.input_tokens // BS
            index.update((h, 0) for h in p.block_hashes(n, BS)[:n])
        out.append(index)
    return out


def test_delay_zero_reads_the_live_index():
    indexes = _indexes_with([], [])
    view = CacheSignalView(lambda i: indexes[i], 2, BS, 0, _Clock())
    asking = prompt("ask", ("sys", 12), ("own", 5))  # 4 full blocks, 3 of them "sys"
    assert view.probe(1, asking) == 0
    indexes[1].update(_indexes_with([prompt("held", ("sys", 12))])[0])
    assert view.probe(1, asking) == 3  # seen at once
    assert view.copies_taken == 0


def test_the_delayed_view_copies_only_instances_still_serving():
    """A fleet that grows during the run keeps every instance it made; an ended one is never
    routed to again, so a refresh leaves its copy empty instead of copying its cache."""
    clock = _Clock()
    indexes = _indexes_with([prompt("held", ("sys", 12))], [prompt("held", ("sys", 12))])
    view = CacheSignalView(lambda i: indexes[i], 2, BS, 50_000, clock, lambda i: i == 0)
    asking = prompt("ask", ("sys", 12), ("own", 5))
    clock.now_us = 50_000
    assert view.probe(0, asking) == 3 and view.probe(1, asking) == 0
    view.add_instance()  # one more, made during the run: empty until the next copy
    assert view.num_instances == 3 and view.probe(2, asking) == 0


def test_delayed_view_sees_a_change_only_after_the_next_copy():
    """D = 50 ms. The copies start empty at t = 0 and are re-taken at the first lookup at
    least D after the last copy: a prefix cached at t = 10 ms is invisible at 49.999 ms,
    visible from the copy at 50 ms; one cached at 60 ms stays invisible until a lookup at
    100 ms or later re-copies (here 130 ms, after which the next copy is due at 180 ms)."""
    clock = _Clock()
    indexes = _indexes_with([], [])
    view = CacheSignalView(lambda i: indexes[i], 2, BS, 50_000, clock)
    sys_prompt = prompt("ask", ("sys", 12), ("own", 5))
    other = prompt("ask2", ("doc", 8))
    clock.now_us = 10_000
    indexes[0].update(_indexes_with([prompt("held", ("sys", 12))])[0])
    clock.now_us = 49_999
    assert view.probe(0, sys_prompt) == 0
    clock.now_us = 50_000
    assert view.probe(0, sys_prompt) == 3
    assert (view.copied_us, view.copies_taken) == (50_000, 1)
    clock.now_us = 60_000
    indexes[1].update(_indexes_with([prompt("held2", ("doc", 8))])[0])
    indexes[0].clear()  # evicted at 60 ms: still a hit in the copy
    clock.now_us = 99_999
    assert (view.probe(1, other), view.probe(0, sys_prompt)) == (0, 3)
    clock.now_us = 130_000
    assert (view.probe(1, other), view.probe(0, sys_prompt)) == (2, 0)
    assert (view.copied_us, view.copies_taken) == (130_000, 2)
    view.refresh(179_999)
    assert view.copies_taken == 2


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 30),
    st.lists(
        st.tuples(st.integers(0, 25), st.sampled_from(["add", "drop", "look"]), st.integers(0, 5)),
        max_size=40,
    ),
)
def test_a_lookup_sees_the_index_as_it_was_at_the_last_copy(delay_us, events):
    """Law: every lookup answers from the index as it stood at the view's last copy, and that
    copy is less than `delay_us` old (with delay 0: the live index)."""
    clock = _Clock()
    live: dict[int, int] = {}
    history = [(0, {})]  # (time, index contents) after every change, oldest first
    view = CacheSignalView(lambda i: live, 1, 1, delay_us, clock)
    for step_us, kind, h in events:
        clock.now_us += step_us
        if kind == "add":
            live[h] = 0
            history.append((clock.now_us, dict(live)))
        elif kind == "drop":
            live.pop(h, None)
            history.append((clock.now_us, dict(live)))
        else:
            found = view.cached_blocks(0, [h])
            if delay_us == 0:
                assert found == (h in live)
                continue
            assert clock.now_us - view.copied_us < delay_us
            # The index at the copy: the last change at or before it (a change at the copy's
            # own instant happened before the lookup that took it).
            at_copy = [state for t, state in history if t <= view.copied_us][-1]
            if view.copies_taken == 0:
                at_copy = {}
            assert found == (h in at_copy)


def test_delayed_view_of_a_real_kv_cache():
    """The engine's index keeps a freed block's hash until the block is reused, so the view
    does too (the hook passes `KVCache`'s hash index; read here through its attribute)."""
    cache = KVCache(8, BS)
    clock = _Clock()
    view = CacheSignalView(lambda i: cache._hash_to_block, 1, BS, 1_000, clock)  # noqa: SLF001
    held = prompt("held", ("sys", 8), ("mine", 4))
    assert cache.try_allocate(held, 0, held.input_tokens, [])
    cache.release(held)  # freed, hashes kept
    asking = prompt("ask", ("sys", 8), ("yours", 4))
    assert view.probe(0, asking) == 0  # the t = 0 copy is empty
    clock.now_us = 1_000
    assert view.probe(0, asking) == 2


def test_cache_signal_view_rejects_bad_settings():
    with pytest.raises(ValueError, match="delay"):
        CacheSignalView(lambda i: {}, 1, BS, -1, _Clock())
    with pytest.raises(ValueError, match="block_size"):
        CacheSignalView(lambda i: {}, 1, 0, 0, _Clock())


def _shared_prefix_run(delay_us: int) -> list[str]:
    """Three requests with one 64-token system prompt, 20 ms apart, on 3 instances routed by
    no-hit-lru plus BLIS-current's precise-prefix-cache: where each went."""
    spec = {
        "version": "2", "seed": 7, "aggregate_rate": 50.0, "num_requests": 3,
        "clients": [{
            "id": "c", "rate_fraction": 1.0, "arrival": {"process": "constant"},
            "prefix_group": "sys", "prefix_length": 64,
            "input_distribution": {"type": "constant", "params": {"value": 32}},
            "output_distribution": {"type": "constant", "params": {"value": 4}},
        }],
    }  # fmt: skip
    result = simulator.simulate(
        {
            "model": LLAMA_8B, "hardware": "H100", "tp": 1, "latency": {"model": "roofline"},
            "engine": {"total_kv_blocks": 10_000},
            "workload": spec,
            "cluster": {"num_instances": 3, "routing": {
                "policy": "weighted", "profile": "blis-current",
                "scorers": "precise-prefix-cache:1,no-hit-lru:1",
                "cache_signal_delay_us": delay_us, "snapshot_refresh_interval_us": 0}},
        }
    )  # fmt: skip
    return [r.instance_id for r in sorted(result.request_records, key=lambda r: r.arrival_us)]


def test_a_cache_signal_older_than_the_hit_is_not_seen():
    """Live view: the 2nd and 3rd requests find the system prompt cached where the 1st went
    (precise-prefix-cache 1 there, 0 elsewhere; no-hit-lru 0.5 for all: warm) and follow it.
    With a 1 s delay the view stays empty for the whole run: every request is cold and
    no-hit-lru spreads them over the three instances."""
    live = _shared_prefix_run(0)
    assert live[1] == live[2] == live[0]
    assert sorted(_shared_prefix_run(1_000_000)) == ["instance_0", "instance_1", "instance_2"]


# ---------------------------------------------------------------------------- reachability


def test_python_api_runs_every_new_scorer():
    result = simulator.simulate(
        {
            "model": LLAMA_8B, "hardware": "H100", "tp": 1, "latency": {"model": "roofline"},
            "engine": {"total_kv_blocks": 10_000},
            "workload": {"num_requests": 40, "rate": 200.0},
            "cluster": {"num_instances": 3, "routing": {
                "policy": "weighted", "profile": "blis-current",
                "scorers": "no-hit-lru:1,active-requests:1,running-requests:1,load-aware:1,"
                           "vllm-dp:1,queue-depth:1,precise-prefix-cache:1"}},
        }
    )  # fmt: skip
    assert result.summary["completed_requests"] == 40
    assert sum(result.routed) == 40 and all(result.routed)


def test_cli_routing_profile_and_cache_signal_delay():
    args = ["run", "--model", LLAMA_8B, "--num-requests", "20", "--rate", "100",
            "--latency-model", "roofline", "--total-kv-blocks", "10000", "--num-instances", "2",
            "--routing-policy", "weighted", "--routing-profile", "blis-current",
            "--routing-scorers", "no-hit-lru:1,queue-depth:1",
            "--cache-signal-delay", "20000", "--quiet"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert '"completed_requests": 20' in res.stdout
    bad = CliRunner().invoke(app, [*args[:-1], "--routing-profile", "blis-next"])
    assert bad.exit_code == 2
    assert "unknown routing profile 'blis-next'" in bad.output
    assert "Traceback" not in bad.output
