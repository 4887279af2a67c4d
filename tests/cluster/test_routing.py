"""Routing policies and scorers (docs/behaviour.md §6.4), hand-checked."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster.prefix_index import PrefixIndex, leading_matches
from simulator.cluster.routing import (
    DEFAULT_SCORERS,
    ROUTING_POLICIES,
    SCORERS,
    KVUtilizationScorer,
    LoadBalanceScorer,
    PrecisePrefixCacheScorer,
    PrefixAffinityScorer,
    QueueDepthScorer,
    RoutingDecision,
    Scorer,
    Weighted,
    kv_probe_from_caches,
    make_routing_policy,
    parse_scorers,
)
from simulator.cluster.snapshot import InstanceSnapshot
from simulator.engine.kv_cache import KVCache
from simulator.engine.request import Request
from simulator.errors import ConfigError

BS = 4  # small blocks keep the prefix examples readable


def snap(i: int, load: int = 0, kv: float = 0.0, queue: int = 0, batch: int = 0):
    return InstanceSnapshot(
        f"instance_{i}", i, queue_depth=queue, batch_size=batch, in_flight=load, kv_utilization=kv
    )


def snaps(loads, kvs=None):
    kvs = kvs or [0.0] * len(loads)
    return [snap(i, load, kv) for i, (load, kv) in enumerate(zip(loads, kvs, strict=True))]


def prompt(rid: str, *segments: tuple[str, int]) -> Request:
    """A request whose prompt is the given (content key, length) segments."""
    return Request(rid, 0, sum(n for _, n in segments), 5, segments=list(segments))


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


R = Request("r", 0, 10, 5)


# ----------------------------------------------------------------------------- policies


def test_registries():
    assert sorted(ROUTING_POLICIES) == ["always-busiest", "least-loaded", "round-robin", "weighted"]
    assert sorted(SCORERS) == [
        "active-requests",  # this and the others not listed at March: BLIS-current's
        "kv-utilization",
        "load-aware",
        "load-balance",
        "lora-affinity",  # docs/lora.md
        "no-hit-lru",
        "precise-prefix-cache",
        "precise-prefix-cache@current",
        "precise-prefix-cache@mar",
        "prefix-affinity",
        "queue-depth",
        "queue-depth@current",
        "queue-depth@mar",
        "running-requests",
        "vllm-dp",
    ]


def _committed(policy, candidates):
    """Route and commit, as the router does: the turn passes with `observe`."""
    decision = policy.route(R, candidates, 0)
    policy.observe(R, next(c for c in candidates if c.index == decision.target))
    return decision.target


def test_round_robin_cycles_over_candidate_position():
    rr = make_routing_policy("round-robin", rng=rng())
    cands = snaps([5, 0, 9])
    assert [_committed(rr, cands) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    # The counter is global: with a different candidate list it continues at counter mod len.
    sub = [snap(5), snap(7)]
    assert [_committed(rr, sub) for _ in range(3)] == [7, 5, 7]  # counter 7, 8, 9
    # A choice asked for and not used (PD's decode pre-selection) does not pass the turn.
    assert rr.route(R, sub, 0).target == rr.route(R, sub, 0).target == 5  # counter 10


def test_decision_carries_reason_and_no_scores():
    d = make_routing_policy("round-robin", rng=rng()).route(R, snaps([0, 0]), 0)
    assert d == RoutingDecision(0, "round-robin[0]", None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=12), st.integers(0, 2**32 - 1))
def test_least_loaded_never_picks_busier(loads, seed):
    policy = make_routing_policy("least-loaded", rng=rng(seed))
    cands = snaps(loads)
    d = policy.route(R, cands, 0)
    assert loads[d.target] == min(loads)


def test_least_loaded_counts_queue_batch_and_in_flight():
    cands = [snap(0, load=1, queue=2), snap(1, load=0, batch=2), snap(2, load=1, queue=1, batch=1)]
    # effective loads 3, 2, 3
    assert make_routing_policy("least-loaded", rng=rng()).route(R, cands, 0).target == 1


def test_least_loaded_breaks_ties_over_all_tied():
    cands = snaps([1, 0, 0, 3, 0])
    policy = make_routing_policy("least-loaded", rng=rng(7))
    picks = [policy.route(R, cands, 0).target for _ in range(300)]
    assert set(picks) == {1, 2, 4}
    again = make_routing_policy("least-loaded", rng=rng(7))
    assert [again.route(R, cands, 0).target for _ in range(300)] == picks


def test_always_busiest_first_wins():
    policy = make_routing_policy("always-busiest", rng=rng())
    d = policy.route(R, snaps([3, 5, 5, 1]), 0)
    assert d.target == 1
    assert "load=5" in d.reason


def test_empty_candidates_is_an_error():
    with pytest.raises(ValueError):
        make_routing_policy("round-robin", rng=rng()).route(R, [], 0)


def test_unknown_routing_policy():
    with pytest.raises(ConfigError) as exc:
        make_routing_policy("random", rng=rng())
    assert str(exc.value) == (
        "unknown routing policy 'random'; "
        "valid: always-busiest, least-loaded, round-robin, weighted"
    )


# ----------------------------------------------------------------------------- scorers


def test_queue_depth_min_max():
    scores = QueueDepthScorer().score(R, snaps([2, 5, 8]))
    assert scores == {"instance_0": 1.0, "instance_1": 0.5, "instance_2": 0.0}


def test_queue_depth_all_equal_scores_one():
    assert QueueDepthScorer().score(R, snaps([4, 4, 4])) == {
        "instance_0": 1.0,
        "instance_1": 1.0,
        "instance_2": 1.0,
    }


def test_kv_utilization_and_load_balance():
    cands = snaps([0, 3], [0.25, 1.0])
    assert KVUtilizationScorer().score(R, cands) == {"instance_0": 0.75, "instance_1": 0.0}
    assert LoadBalanceScorer().score(R, cands) == {"instance_0": 1.0, "instance_1": 0.25}


def test_weighted_hand_computed_composite():
    # queue-depth:2, kv-utilization:1 -> normalised weights 2/3, 1/3.
    cands = snaps([0, 4, 2], [0.9, 0.0, 0.5])
    # queue-depth: 1, 0, 0.5; kv-utilization: 0.1, 1.0, 0.5
    policy = make_routing_policy("weighted", scorers="queue-depth:2,kv-utilization:1", rng=rng())
    d = policy.route(R, cands, 0)
    assert d.target == 0
    assert d.scores == pytest.approx(
        {"instance_0": 2 / 3 + 0.1 / 3, "instance_1": 1 / 3, "instance_2": 2 / 3 * 0.5 + 0.5 / 3}
    )
    # Flip the weights: kv-utilization dominates and instance 1 wins.
    policy = make_routing_policy("weighted", scorers="queue-depth:1,kv-utilization:4", rng=rng())
    d = policy.route(R, cands, 0)
    assert d.target == 1
    assert d.scores["instance_1"] == pytest.approx(0.8)


class _Fixed(Scorer):
    name = "fixed"

    def __init__(self, scores):
        self.scores = scores

    def score(self, req, candidates):
        return dict(self.scores)


def test_weighted_clamps_scores_to_unit_interval():
    cands = snaps([0, 0, 0])
    policy = Weighted(
        [(_Fixed({"instance_0": 5.0, "instance_1": 0.9, "instance_2": -3.0}), 2.0)], rng()
    )
    d = policy.route(R, cands, 0)
    assert d.target == 0
    assert d.scores == {"instance_0": 1.0, "instance_1": 0.9, "instance_2": 0.0}


def test_weighted_ties_random_among_best():
    cands = snaps([0, 0, 5])
    policy = make_routing_policy("weighted", scorers="queue-depth:1", rng=rng(3))
    picks = {policy.route(R, cands, 0).target for _ in range(100)}
    assert picks == {0, 1}


def test_default_profile():
    assert DEFAULT_SCORERS == "prefix-affinity:3,queue-depth:2,kv-utilization:2"
    policy = make_routing_policy("weighted", rng=rng())
    names = [(s.name, w) for s, w in policy.scorers]
    assert names == [
        ("prefix-affinity", pytest.approx(3 / 7)),
        ("queue-depth", pytest.approx(2 / 7)),
        ("kv-utilization", pytest.approx(2 / 7)),
    ]


# ----------------------------------------------------------------------------- prefix affinity


def test_prefix_affinity_scores_shared_leading_blocks():
    scorer = PrefixAffinityScorer(BS)
    cands = snaps([0, 0, 0])
    first = prompt("a", ("system", 8), ("user-a", 8))  # 4 full blocks
    assert scorer.score(first, cands) == {"instance_0": 0.0, "instance_1": 0.0, "instance_2": 0.0}
    scorer.observe(first, cands[1])
    # Shares blocks 0-1 (the system prompt); its own 8 tokens + 2 more -> 4 full blocks.
    second = prompt("b", ("system", 8), ("user-b", 10))
    assert scorer.score(second, cands) == {"instance_0": 0.0, "instance_1": 0.5, "instance_2": 0.0}
    # Same content except the first block: chained hashes share nothing.
    third = prompt("c", ("other", 4), ("system", 4), ("user-a", 8))
    assert scorer.score(third, cands)["instance_1"] == 0.0
    assert scorer.score(first, cands)["instance_1"] == 1.0


def test_prefix_affinity_short_prompt_scores_zero():
    scorer = PrefixAffinityScorer(BS)
    short = prompt("s", ("x", 3))
    scorer.observe(short, snap(0))  # nothing to record
    assert scorer.index_size("instance_0") == 0
    assert scorer.score(short, [snap(0)]) == {"instance_0": 0.0}


def test_prefix_affinity_lru_eviction():
    scorer = PrefixAffinityScorer(BS, capacity_blocks=4)
    inst = snap(0)
    a, b, c = (prompt(k, (k, 8)) for k in "abc")  # 2 blocks each
    scorer.observe(a, inst)
    scorer.observe(b, inst)
    assert scorer.index_size("instance_0") == 4
    scorer.observe(c, inst)  # evicts a's two blocks (least recently recorded)
    assert scorer.index_size("instance_0") == 4
    assert [scorer.score(r, [inst])["instance_0"] for r in (a, b, c)] == [0.0, 1.0, 1.0]


def test_prefix_affinity_lookup_does_not_refresh_recency():
    inst = snap(0)
    a, b, c = (prompt(k, (k, 8)) for k in "abc")

    scorer = PrefixAffinityScorer(BS, capacity_blocks=4)
    scorer.observe(a, inst)
    scorer.observe(b, inst)
    for _ in range(5):
        assert scorer.score(a, [inst])["instance_0"] == 1.0  # lookups only
    scorer.observe(c, inst)
    assert scorer.score(a, [inst])["instance_0"] == 0.0  # a was still the LRU end
    assert scorer.score(b, [inst])["instance_0"] == 1.0

    # Recording a again does refresh it, so b is evicted instead.
    scorer = PrefixAffinityScorer(BS, capacity_blocks=4)
    scorer.observe(a, inst)
    scorer.observe(b, inst)
    scorer.observe(a, inst)
    scorer.observe(c, inst)
    assert scorer.score(a, [inst])["instance_0"] == 1.0
    assert scorer.score(b, [inst])["instance_0"] == 0.0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["new", "new", "reroute", "decode"]),
            st.integers(0, 40),  # shared prefix tokens (new) / which earlier request (else)
            st.integers(0, 60),  # own tokens (new)
            st.integers(0, 2),  # the instance chosen
            st.integers(0, 1),  # which of two scorers routes (PD: a prefill and a decode pool)
        ),
        max_size=30,
    ),
    st.sampled_from([4, 12, 1000]),
)
def test_private_blocks_by_count_route_as_stored_hashes(events, capacity):
    """Prefix-affinity scorers with private blocks kept by count and with every hash stored:
    the same scores for every routing, first or repeated (a re-route of the same request, a
    PD decode sub-request of it), by the same scorer or another, and indexes of the same
    size."""
    scorers = {
        mode: [PrefixAffinityScorer(BS, capacity), PrefixAffinityScorer(BS, capacity)]
        for mode in (True, False)
    }
    for mode, pair in scorers.items():
        for scorer in pair:
            scorer.private_blocks_by_count = mode
    made: dict[bool, list[Request]] = {True: [], False: []}
    cands = snaps([0, 0, 0])
    for kind, a, b, chosen, which in events:
        seen = {}
        for by_count, pair in scorers.items():
            scorer = pair[which]
            reqs = made[by_count]
            if kind == "new" or not reqs:
                segments = [("sys", a)] if a else []
                rid = f"r{len(reqs)}"
                req = prompt(rid, *segments, (rid, b)) if b else prompt(rid, *segments)
                req.private_from_token = a if b else -1
                reqs.append(req)
            elif kind == "reroute":
                req = reqs[a % len(reqs)]
            else:
                req = reqs[a % len(reqs)].sub_request("decode")
            seen[by_count] = scorer.score_list(req, cands)
            scorer.observe(req, cands[chosen])
        assert seen[True] == seen[False]
        for lazy, eager in zip(scorers[True], scorers[False], strict=True):
            for c in cands:
                assert lazy.index_size(c.instance_id) == eager.index_size(c.instance_id)


def test_weighted_observe_feeds_prefix_index():
    policy = make_routing_policy("weighted", scorers="prefix-affinity:1", rng=rng(), block_size=BS)
    cands = snaps([0, 0, 0])
    first = prompt("a", ("sys", 12))
    policy.observe(first, cands[2])
    d = policy.route(prompt("b", ("sys", 12), ("own", 4)), cands, 0)
    assert d.target == 2
    assert d.scores == {"instance_0": 0.0, "instance_1": 0.0, "instance_2": 0.75}


# ----------------------------------------------------------------------------- precise prefix


def test_precise_prefix_cache_with_fake_probe():
    found = {0: 2, 1: 0, 2: 10}
    calls = []

    def probe(index, req):
        calls.append((index, req.request_id))
        return found[index]

    r = prompt("p", ("x", 17))  # 4 full blocks
    scorer = PrecisePrefixCacheScorer(BS, probe)
    assert scorer.score(r, snaps([0, 0, 0])) == {
        "instance_0": 0.5,
        "instance_1": 0.0,
        "instance_2": 1.0,  # a probe count above the prompt's blocks is capped
    }
    assert calls == [(0, "p"), (1, "p"), (2, "p")]
    policy = make_routing_policy(
        "weighted", scorers="precise-prefix-cache:1", rng=rng(), block_size=BS, kv_probe=probe
    )
    assert policy.route(r, snaps([0, 0, 0]), 0).target == 2


def test_precise_prefix_cache_needs_probe():
    with pytest.raises(ConfigError, match="precise-prefix-cache"):
        make_routing_policy("weighted", scorers="precise-prefix-cache:1", rng=rng())


def test_kv_probe_reads_engine_cache():
    caches = [KVCache(64, BS), KVCache(64, BS)]
    held = prompt("held", ("sys", 12), ("mine", 4))
    assert caches[1].try_allocate(held, 0, held.input_tokens, [])
    probe = kv_probe_from_caches(lambda i: caches[i])
    asking = prompt("ask", ("sys", 12), ("yours", 9))  # 5 full blocks, 3 shared
    assert probe(0, asking) == 0
    assert probe(1, asking) == 3
    scorer = PrecisePrefixCacheScorer(BS, probe)
    assert scorer.score(asking, snaps([0, 0])) == {"instance_0": 0.0, "instance_1": 0.6}


# ----------------------------------------------------------------------------- scorer syntax


def test_parse_scorers_ok():
    assert parse_scorers(" queue-depth : 2 , kv-utilization:0.5") == [
        ("queue-depth", 2.0),
        ("kv-utilization", 0.5),
    ]


@pytest.mark.parametrize(
    ("text", "piece"),
    [
        ("nope:1", "nope"),
        ("queue-depth:1,a:b:c", "a:b:c"),
        ("queue-depth", "queue-depth"),
        ("queue-depth:", "queue-depth:"),
        ("queue-depth:0", "queue-depth:0"),
        ("queue-depth:-1", "queue-depth:-1"),
        ("queue-depth:nan", "queue-depth:nan"),
        ("queue-depth:inf", "queue-depth:inf"),
        ("queue-depth:x", "queue-depth:x"),
        ("queue-depth:1,queue-depth:2", "queue-depth:2"),
        ("queue-depth:1,", ""),
        ("", ""),
    ],
)
def test_parse_scorers_errors(text, piece):
    with pytest.raises(ConfigError) as exc:
        parse_scorers(text)
    msg = str(exc.value)
    assert "--routing-scorers" in msg
    assert "routing.scorers" in msg
    assert repr(piece) in msg


def test_parse_scorers_unknown_lists_valid_names():
    with pytest.raises(ConfigError) as exc:
        parse_scorers("prefix-afinity:3")
    assert "unknown scorer 'prefix-afinity'" in str(exc.value)
    assert (
        "valid: active-requests, kv-utilization, load-aware, load-balance, lora-affinity, "
        "no-hit-lru, precise-prefix-cache, " in str(exc.value)
    )


def test_parse_scorers_duplicate_message():
    with pytest.raises(ConfigError, match="listed twice"):
        parse_scorers("kv-utilization:1,kv-utilization:1")


def test_make_routing_policy_accepts_pairs_and_validates_them():
    policy = make_routing_policy("weighted", scorers=[("load-balance", 1)], rng=rng())
    assert [s.name for s, _ in policy.scorers] == ["load-balance"]
    with pytest.raises(ConfigError):
        make_routing_policy("weighted", scorers=[("load-balance", math.nan)], rng=rng())
    # A typo is caught even for policies that ignore scorers.
    with pytest.raises(ConfigError):
        make_routing_policy("round-robin", scorers="queue-dept:1", rng=rng())


def _record_one_at_a_time(lru: OrderedDict, hashes: list[int], capacity_blocks: int) -> None:
    """The index's rule stated plainly: refresh or insert each hash, evict on overflow."""
    for h in hashes:
        if h in lru:
            lru.move_to_end(h)
        else:
            lru[h] = None
            if len(lru) > capacity_blocks:
                lru.popitem(last=False)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 40), max_size=14)
        | st.lists(st.integers(0, 40), max_size=14, unique=True)
        | st.integers(0, 200).map(lambda first: list(range(first, first + 8))),
        max_size=40,
    ),
    st.integers(1, 24),
)
def test_bulk_recording_keeps_the_one_at_a_time_rule(batches, capacity):
    """PrefixIndex records a prompt's hashes at once (runs, stale entries, bulk eviction);
    its contents, order and matches equal refreshing / inserting / evicting hash by hash."""
    index = PrefixIndex(capacity)
    plain: OrderedDict = OrderedDict()
    for hashes in batches:
        index.record(hashes)
        _record_one_at_a_time(plain, hashes, capacity)
        assert list(index) == list(plain)
        assert len(index) == len(plain)
        assert all((h in index) == (h in plain) for h in range(-1, 250))
        probe = [*hashes, *range(200, 204)]
        assert index.matched_blocks(probe) == next(
            (i for i, h in enumerate(probe) if h not in plain), len(probe)
        )
        # Stale entries stay bounded (refreshing a shared prefix must not grow the index).
        held = sum(len(run.hashes) for run in index._runs) - index._front  # noqa: SLF001
        assert held <= len(plain) + 2 * capacity + len(hashes)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 30), max_size=8),
            st.integers(0, 6),
            st.integers(-1, 6),  # materialize this record's private hashes so many records on
        ),
        max_size=40,
    ),
    st.integers(1, 24),
)
def test_private_hashes_held_by_count_keep_the_one_at_a_time_rule(records, capacity):
    """Private hashes (new, never recorded elsewhere) kept as a count: the size, the stored
    hashes' order, every lookup and every eviction are those of storing them, and once
    materialized they are stored where they would have been."""
    index = PrefixIndex(capacity)
    plain: OrderedDict = OrderedDict()
    fresh = iter(range(1000, 10**6))
    pending: dict[int, list] = {}  # record number -> [(run, private hashes)]
    materialized: set[int] = set()
    for k, (hashes, private, later) in enumerate(records):
        own = [next(fresh) for _ in range(private)]
        run = index.record(hashes, private)
        _record_one_at_a_time(plain, [*hashes, *own], capacity)
        if later >= 0 and private:
            pending.setdefault(k + later, []).append((run, own))
        for run_due, own_due in pending.pop(k, []):
            index.materialize(run_due, own_due)
            materialized.update(own_due)
        stored = [h for h in plain if h < 1000 or h in materialized]
        assert list(index) == stored
        assert len(index) == len(plain)
        probe = [*hashes, *(h for h in own if h in materialized), 500]
        assert index.matched_blocks(probe) == next(
            (i for i, h in enumerate(probe) if h not in plain), len(probe)
        )
        held = sum(len(run.hashes) for run in index._runs) - index._front  # noqa: SLF001
        assert held <= len(plain) + 2 * capacity + len(hashes) + private


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.none() | st.lists(st.integers(0, 12), max_size=10), min_size=1, max_size=6),
    st.lists(st.integers(0, 12), max_size=8),
)
def test_leading_matches_of_many_indexes_are_each_ones_matched_blocks(recorded, probe):
    """The router's call for all candidates at once equals asking each index (None: 0)."""
    indexes = []
    for hashes in recorded:
        if hashes is None:
            indexes.append(None)
        else:
            indexes.append(PrefixIndex(6))
            indexes[-1].record(hashes)
    expected = [i.matched_blocks(probe) if i is not None else 0 for i in indexes]
    assert leading_matches(indexes, probe) == expected


def test_prefix_index_refreshing_a_shared_prefix_stays_bounded():
    """Refreshing hashes that never get evicted leaves stale entries behind; the index drops
    them (keeping the order) instead of growing with every record."""
    for capacity in (8, 20):  # with evictions, and without any (9 distinct hashes)
        index = PrefixIndex(capacity)
        plain: OrderedDict = OrderedDict()
        for i in range(300):
            hashes = [5, 1, 4, 2, 3] if i % 2 else [3, 2, 9, 100 + i % 3]
            index.record(hashes)
            _record_one_at_a_time(plain, hashes, capacity)
            assert list(index) == list(plain)
            held = sum(len(run.hashes) for run in index._runs) - index._front  # noqa: SLF001
            assert held <= len(plain) + 2 * capacity + len(hashes)


# ----------------------------------------------------------------------------- list scoring


def _reference_scores(scorer: Scorer, req, candidates) -> dict[str, float]:
    """A scorer's dict as the built-in scorers computed it before they computed lists."""
    ids = [c.instance_id for c in candidates]
    kind = type(scorer)
    if kind is QueueDepthScorer:
        loads = [c.effective_load for c in candidates]
        lo, hi = min(loads), max(loads)
        if hi == lo:
            return dict.fromkeys(ids, 1.0)
        return {iid: (hi - load) / (hi - lo) for iid, load in zip(ids, loads, strict=True)}
    if kind is KVUtilizationScorer:
        return {c.instance_id: 1.0 - c.kv_utilization for c in candidates}
    if kind is LoadBalanceScorer:
        return {c.instance_id: 1.0 / (1.0 + c.effective_load) for c in candidates}
    n = req.input_tokens // BS
    if kind in (PrefixAffinityScorer, PrecisePrefixCacheScorer) and n < 1:
        return dict.fromkeys(ids, 0.0)
    if kind is PrefixAffinityScorer:
        hashes = req.block_hashes(n, BS)[:n]
        return {iid: scorer.cached_blocks(iid, hashes) / n for iid in ids}
    if kind is PrecisePrefixCacheScorer:
        return {c.instance_id: min(scorer.kv_probe(c.index, req), n) / n for c in candidates}
    return scorer.score(req, candidates)  # not a built-in: its own dict


def _reference_weighted_route(policy: Weighted, req, candidates):
    """The weighted policy as a dict per scorer (how it was written before scores became
    lists in candidate order): composite scores and the tied best, drawing from policy.rng."""
    composite = {c.instance_id: 0.0 for c in candidates}
    for scorer, weight in policy.scorers:
        scores = _reference_scores(scorer, req, candidates)
        for iid in composite:
            s = scores.get(iid, 0.0)
            composite[iid] += weight * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s)
    best = max(composite.values())
    tied = [c for c in candidates if composite[c.instance_id] == best]
    chosen = tied[int(policy.rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
    return chosen.index, composite


class _Halving(QueueDepthScorer):
    """A user's subclass of a built-in that overrides `score` only: it must be read there."""

    def score(self, req, candidates):
        return {iid: s / 2 - 0.25 for iid, s in super().score(req, candidates).items()}


_SNAPSHOTS = st.lists(
    st.tuples(
        st.integers(0, 6),  # queue depth
        st.integers(0, 6),  # batch size
        st.integers(0, 6),  # in flight
        st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, 1 / 3, 1.5, -0.5]),  # KV utilisation
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    _SNAPSHOTS,
    st.lists(
        st.tuples(
            st.sampled_from([*SCORERS, "halving", "fixed"]), st.sampled_from([0.5, 1, 2, 3, 7])
        ),
        min_size=1,
        max_size=4,
        unique_by=lambda pair: pair[0],
    ),
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abc"), st.integers(0, 14)), max_size=8),
    st.integers(0, 2**16),
)
def test_list_scoring_matches_dict_scoring(rows, scorer_names, history, seed):
    """Same choice, same composite scores and the same random draws as the dict-based
    reference, for built-in scorers (list path) and others (read through `score`)."""
    cands = [
        InstanceSnapshot(
            f"instance_{i}", i, queue_depth=q, batch_size=b, in_flight=f, kv_utilization=kv
        )
        for i, (q, b, f, kv) in enumerate(rows)
    ]
    found = {c.index: (c.queue_depth * 3) % 7 for c in cands}

    def build(name):
        if name == "halving":
            return _Halving()
        if name == "fixed":
            return _Fixed({c.instance_id: c.in_flight / 3 - 0.5 for c in cands[::2]})
        return SCORERS[name].build(block_size=BS, kv_probe=lambda index, req: found[index])

    def policy():
        return Weighted([(build(name), weight) for name, weight in scorer_names], rng(seed))

    fast, reference = policy(), policy()
    for (where, key, extra), step in zip(history, range(len(history)), strict=True):
        # Teach both prefix indexes the same routed prompts (shared "sys" prefix, own tail).
        r = prompt(f"h{step}", ("sys", 8), (key, extra))
        fast.observe(r, cands[where % len(cands)])
        reference.observe(r, cands[where % len(cands)])
    for req in (prompt("q1", ("sys", 8), ("a", 6)), prompt("q2", ("b", 3)), R):
        for _ in range(3):  # ties draw from the generator: the draws must stay in step
            decision = fast.route(req, cands, 0)
            target, composite = _reference_weighted_route(reference, req, cands)
            assert decision.target == target
            assert decision.scores == composite
            assert list(decision.scores) == list(composite)
