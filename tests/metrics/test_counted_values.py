"""Inter-token-gap statistics from (value, count) pairs equal numpy's on the expanded array,
bit for bit: summaries stay byte-identical while a run never holds one integer per token."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from simulator.metrics.results import CountedValues

pairs = st.lists(st.tuples(st.integers(0, 5_000_000), st.integers(0, 50)), min_size=0, max_size=40)


@given(pairs=pairs, p=st.sampled_from([0, 1, 33.3, 50, 90, 95, 99, 99.9, 100]))
def test_mean_and_percentiles_equal_numpy_on_the_expanded_values(pairs, p):
    values = np.array([v for v, _ in pairs], dtype=np.int64)
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    expanded = np.repeat(values, counts)
    counted = CountedValues(values, counts)
    assert len(counted) == len(expanded)
    if len(expanded) == 0:
        assert counted.mean() == 0.0 and counted.percentile(p) == 0.0
        return
    assert counted.mean() == float(expanded.sum() / len(expanded))
    assert counted.percentile(p) == float(np.percentile(expanded, p))


def test_repeated_values_from_several_sources_merge():
    # (7 µs × 2) + (3 µs × 1) + (7 µs × 1): sorted 3, 7, 7, 7; median = 7, mean = 24 / 4 = 6.
    counted = CountedValues(np.array([7, 3, 7]), np.array([2, 1, 1]))
    assert list(counted.values) == [3, 7] and list(counted.counts) == [1, 3]
    assert counted.mean() == 6.0
    assert counted.percentile(50) == 7.0
    assert counted.percentile(0) == 3.0
