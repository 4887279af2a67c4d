"""The router's per-request fast paths (issue 30, case (g)) give exactly what the plain code
gives: snapshots built in one loop, and the weighted policy's composite, tie-break and score
mapping computed in C where the values allow it."""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster.cluster import _live_snapshots
from simulator.cluster.decisions import DecisionTrace
from simulator.cluster.routing import (
    SCORERS,
    QueueDepthScorer,
    RoutingDecision,
    Scorer,
    Weighted,
)
from simulator.cluster.snapshot import InstanceSnapshot, SnapshotCache
from simulator.engine.kv_cache import KVCache
from simulator.engine.request import Request

# ------------------------------------------------------------------------------ snapshots


def _engine(waiting: int, running: int, used: int, total: int, hits: int, misses: int, lora):
    kv = SimpleNamespace(used_blocks=used, total_blocks=total, cache_hits=hits, cache_misses=misses)
    return SimpleNamespace(
        waiting=deque(range(waiting)), running=list(range(running)), kv=kv, lora=lora
    )


def _plain_read(ids, engines, models, index, in_flight):
    """The snapshot as read field by field through the engine's own properties."""
    engine = engines[index]
    kv = engine.kv
    return InstanceSnapshot(
        ids[index],
        index,
        len(engine.waiting),
        len(engine.running),
        KVCache.utilization.fget(kv),
        KVCache.free_blocks.fget(kv),
        KVCache.hit_rate.fget(kv),
        in_flight,
        models[index],
        engine.lora.resident if engine.lora is not None else frozenset(),
    )


_ENGINES = st.lists(
    st.tuples(
        st.integers(0, 9),
        st.integers(0, 9),
        st.integers(0, 50),
        st.integers(1, 50),
        st.integers(0, 5),
        st.integers(0, 5),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(_ENGINES, st.data())
def test_live_snapshots_many_reads_what_the_engines_say(rows, data):
    engines = [
        _engine(
            w, r, min(u, t), t, h, m, SimpleNamespace(resident=frozenset({"a"})) if lo else None
        )
        for w, r, u, t, h, m, lo in rows
    ]
    ids = [f"instance_{i}" for i in range(len(engines))]
    models = [f"m{i % 2}" for i in range(len(engines))]
    read = _live_snapshots(ids, engines, models)
    indices = data.draw(st.lists(st.integers(0, len(engines) - 1), max_size=10))
    flights = [3 * i + 1 for i in indices]
    want = [_plain_read(ids, engines, models, i, f) for i, f in zip(indices, flights, strict=True)]
    got = read.many(indices, flights)
    assert got == want
    assert all(type(s) is InstanceSnapshot for s in got)
    assert [type(x) for s in got for x in s] == [type(x) for s in want for x in s]
    for i, f in zip(indices, flights, strict=True):
        assert read(i, f) == _plain_read(ids, engines, models, i, f)

    # The cache reads through `many` when the reader has it, and per candidate otherwise.
    in_flight = [7 * i for i in range(len(engines))]
    fast = SnapshotCache(0, read, in_flight.__getitem__, list(zip(ids, models, strict=True)))

    def plain(index, flight):
        return _plain_read(ids, engines, models, index, flight)

    slow = SnapshotCache(0, plain, in_flight.__getitem__, list(zip(ids, models, strict=True)))
    assert fast.get_many(indices, 0) == slow.get_many(indices, 0)


# ------------------------------------------------------------------------------ composite


def _clamped_sum(totals, weight, scores):
    """The composite step as the weighted policy wrote it before the fast path."""
    return [
        total + weight * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s)
        for total, s in zip(totals, scores, strict=True)
    ]


def _same(a: list, b: list) -> bool:
    """Equal element by element, bit for bit (the sign of a zero, NaN where NaN, type)."""
    return len(a) == len(b) and all(
        type(x) is type(y)
        and (math.copysign(1, x) == math.copysign(1, y))
        and (x == y or (math.isnan(x) and math.isnan(y)))
        for x, y in zip(a, b, strict=True)
    )


class _Odd(Scorer):
    """A user's scorer with values the clamp must see: out of range, -0.0, NaN."""

    name = "odd"

    def score(self, req, candidates):
        pick = [1.5, -0.0, 0.25, -2.0, 0.0, math.nan]
        return {c.instance_id: pick[c.index % len(pick)] for c in candidates}


class _Zero(QueueDepthScorer):
    """A subclass of a built-in is read through `score`: its zeros are not skipped."""

    def score(self, req, candidates):
        return dict.fromkeys((c.instance_id for c in candidates), 0.0)


def _plain_route(policy: Weighted, req, candidates):
    """The weighted policy as written before the fast paths (clamp loop per scorer, tie list,
    score dict), drawing from `policy.rng`."""
    composite = [0.0] * len(candidates)
    for (_, weight), score_list in zip(policy.scorers, policy._score_lists, strict=True):
        composite = _clamped_sum(composite, weight, score_list(req, candidates))
    best = max(composite)
    tied = [c for c, total in zip(candidates, composite, strict=True) if total == best]
    chosen = tied[int(policy.rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
    return chosen.index, f"weighted (score={best:.4f})", composite


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),
            st.integers(0, 4),
            st.integers(0, 4),
            st.sampled_from([0.0, 0.5, 1.0, 1.5, -0.5]),
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(
        st.tuples(st.sampled_from([*SCORERS, "odd", "zero"]), st.sampled_from([1, 2, 3])),
        min_size=1,
        max_size=4,
        unique_by=lambda pair: pair[0],
    ),
    st.integers(0, 2**16),
)
def test_weighted_route_is_the_plain_route(rows, scorer_names, seed):
    cands = [
        InstanceSnapshot(
            f"instance_{i}", i, queue_depth=q, batch_size=b, in_flight=f, kv_utilization=kv
        )
        for i, (q, b, f, kv) in enumerate(rows)
    ]

    def build(name):
        if name == "odd":
            return _Odd()
        if name == "zero":
            return _Zero()
        return SCORERS[name].build(block_size=4, kv_probe=lambda index, req: index % 3)

    def policy():
        return Weighted(
            [(build(name), weight) for name, weight in scorer_names], np.random.default_rng(seed)
        )

    fast, plain = policy(), policy()
    for k in range(4):  # ties draw from the generator: the draws must stay in step
        req = Request(f"r{k}", 0, 4 * k + 2, 5)
        try:
            target, reason, composite = _plain_route(plain, req, cands)
        except IndexError:  # a NaN best ties nobody: the fast route fails alike
            with pytest.raises(IndexError):
                fast.route(req, cands, 0)
            continue
        decision = fast.route(req, cands, 0)
        assert (decision.target, decision.reason) == (target, reason)
        assert list(decision.scores) == [c.instance_id for c in cands]
        assert _same(list(decision.scores.values()), composite)
    assert fast.rng.integers(1 << 30) == plain.rng.integers(1 << 30)


def test_weighted_scores_read_like_the_dict_they_were():
    """`decision.scores` is built on first read; it reads as the dict the policy used to
    return: equal to it, same order, repr, `get`, and the decision trace's copy is a dict."""
    cands = [InstanceSnapshot(f"instance_{i}", i, queue_depth=i % 3) for i in range(5)]
    policy = Weighted(
        [(SCORERS["queue-depth"].build(block_size=4, kv_probe=None), 1.0)], np.random.default_rng(0)
    )
    decision = policy.route(Request("r", 0, 10, 5), cands, 0)
    want = {f"instance_{i}": [1.0, 0.5, 0.0][i % 3] for i in range(5)}
    assert decision.scores == want and want == decision.scores
    assert list(decision.scores.items()) == list(want.items())
    assert repr(decision.scores) == repr(want)
    assert decision.scores.get("instance_9", 0.0) == 0.0
    assert decision == RoutingDecision(decision.target, decision.reason, want)
    trace = DecisionTrace("decisions", counterfactual_k=2)
    trace.record_routing(Request("r", 0, 10, 5), 0, decision, cands)
    record = trace.routings[0]
    assert type(record["scores"]) is dict and record["scores"] == want
    assert [c["instance_id"] for c in record["candidates"]] == ["instance_0", "instance_3"]
