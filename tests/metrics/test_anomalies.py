"""Anomaly detectors and fairness (docs/behaviour.md §10.4)."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.request import Request, RequestState
from simulator.metrics.anomalies import (
    hol_blocking_instances,
    jain_fairness,
    priority_inversions,
    tenant_tokens,
)


def done(
    rid: str,
    arrival_us: int,
    e2e_us: int,
    instance: str = "instance_0",
    slo: str = "",
    tenant: str = "",
    tokens: int = 0,
    state: RequestState = RequestState.COMPLETED,
) -> Request:
    r = Request(rid, arrival_us, 10, max(tokens, 1), slo_class=slo, tenant_id=tenant)
    r.state = state
    r.instance_id = instance
    r.completion_us = arrival_us + e2e_us
    r.generated_tokens = tokens
    return r


def reference(requests) -> int:
    """O(n²) definition: same instance and class, i arrived earlier, E2E_i > 2·E2E_j."""
    rs = [r for r in requests if r.state is RequestState.COMPLETED]
    count = 0
    for a in rs:
        for b in rs:
            same = (a.instance_id, a.slo_class) == (b.instance_id, b.slo_class)
            ea, eb = a.completion_us - a.arrival_us, b.completion_us - b.arrival_us
            if same and a.arrival_us < b.arrival_us and ea > 2 * eb:
                count += 1
    return count


def test_priority_inversions_hand_example():
    rs = [
        done("a", 0, 100),
        done("b", 10, 40),
        done("c", 20, 10),
        done("d", 30, 60),
        done("e", 5, 1000, instance="instance_1"),  # other instance: never paired
        done("f", 6, 1000, slo="batch"),  # other class
        done("g", 7, 1000, state=RequestState.TIMED_OUT),  # not completed
        done("h", 20, 1),  # same arrival as c: c vs h is not "earlier"
    ]
    # a>b (100>80), a>c (100>20), b>c (40>20), and h: a>h, b>h (c and h tie on arrival).
    assert priority_inversions(rs, "slo-based") == 5
    assert reference(rs) == 5
    assert priority_inversions(rs, "constant") == 0
    assert priority_inversions([], "slo-based") == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 50), st.sampled_from(["i0", "i1"])),
        max_size=40,
    )
)
def test_priority_inversions_match_reference(rows):
    rs = [done(f"r{k}", a, e, instance=i) for k, (a, e, i) in enumerate(rows)]
    assert priority_inversions(rs, "inverted-slo") == reference(rs)


def test_priority_inversions_fast_for_10k():
    rnd = random.Random(1)
    rs = [done(f"r{k}", rnd.randrange(10**7), rnd.randrange(1, 10**6)) for k in range(10_000)]
    start = time.perf_counter()
    priority_inversions(rs, "slo-based")
    assert time.perf_counter() - start < 2.0


def test_hol_blocking():
    assert hol_blocking_instances({"a": 1.0, "b": 1.0, "c": 10.0}) == ["c"]  # mean 4, 10 > 8
    assert hol_blocking_instances({"a": 1.0, "b": 3.0}) == []  # mean 2: 3 is not > 4
    assert hol_blocking_instances({"a": 50.0}) == []
    assert hol_blocking_instances({"a": 0.0, "b": 0.0}) == []
    assert hol_blocking_instances({}) == []


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 1, 1, 1], 1.0),
        ([1, 0, 0, 0], 0.25),
        ([1, 2, 3], 36 / 42),
        ([5], 1.0),
        ([], 1.0),
        ([0, 0], 1.0),
    ],
)
def test_jain(values, expected):
    assert jain_fairness(values) == pytest.approx(expected)


def test_tenant_tokens():
    rs = [
        done("a", 0, 1, tenant="t1", tokens=10),
        done("b", 0, 1, tenant="t1", tokens=5),
        done("c", 0, 1, tokens=7),
        done("d", 0, 1, tenant="t2", tokens=100, state=RequestState.RUNNING),
    ]
    # t2 sent a request that did not complete: listed, with nothing served.
    assert tenant_tokens(rs) == {"default": 7, "t1": 15, "t2": 0}
