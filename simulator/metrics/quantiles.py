"""Percentiles and medians exactly as numpy computes them, from order statistics.

numpy's `percentile` (default linear method) and `median` give the summaries' figures, and
the summaries are compared byte for byte (scenario digests, BLIS parity to 1e-9). Both are
computed here step by step instead, from the one or two order statistics they need, with
numpy's own arithmetic on numpy scalars: on numpy 2.x the library functions import
`numpy.ma` the first time they run (`np.unique` asks `np.ma.is_masked`), a start-up cost
every run would pay (docs/performance.md, "Start-up: each schema generated once, no
`numpy.ma`"). `CountedValues` (inter-token gaps as value, count pairs) uses the same
interpolation. tests/metrics/test_quantiles.py checks every function here against numpy's,
bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np


def _neighbours(n: int, p: float) -> tuple[np.float64, int]:
    """numpy's virtual index of percentile `p` among `n` values, (n - 1) * p / 100 in
    float64, and the position of its lower neighbour: its floor, or -1 (the last value, taken
    for both neighbours) at or past the end."""
    virtual = (n - 1) * np.true_divide(p, 100)
    return virtual, -1 if virtual >= n - 1 else int(np.floor(virtual))


def linear_percentile(n: int, p: float, order_statistic: Callable[[int], Any]) -> float:
    """numpy's linear-method percentile `p` (0..100) of `n` > 0 values, given their
    `order_statistic(k)` (the k-th smallest, 0-based, as a numpy scalar).

    numpy 2: the virtual index and its neighbours (`_neighbours`); the weight g, the virtual
    index's fraction, a Python float when `p` is one (so float32 values are interpolated in
    float32); linear interpolation written as `a + (b - a) * g` below g = 0.5 and
    `b - (b - a) * (1 - g)` from it (so an infinite neighbour gives NaN as there)."""
    virtual, lower = _neighbours(n, p)
    if lower < 0:
        # The last value for both neighbours, with a weight past 1 (the index -1 subtracted),
        # which changes nothing: b - a is 0, or NaN for an infinite value.
        a = b = order_statistic(n - 1)
    else:
        a = order_statistic(lower)
        b = order_statistic(lower + 1)
    gamma = virtual - lower
    if type(p) in (int, float):
        gamma = float(gamma)
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


def percentile(values: np.ndarray, p: float) -> float:
    """`float(np.percentile(values, p))` for a non-empty 1-D array of numbers."""
    values = np.asarray(values)
    n = len(values)
    # numpy partitions around the first and last positions and the two neighbours (both -1
    # past the end), deduplicated and sorted as `np.unique` leaves them; the same positions
    # give the same arrangement, which matters for -0.0 against 0.0.
    _, lower = _neighbours(n, p)
    ordered = np.partition(values, sorted({0, -1, lower, lower + 1 if lower >= 0 else -1}))
    if values.dtype.kind in "fc" and np.isnan(ordered[-1]):
        return math.nan  # numpy: any NaN (sorted last) makes every percentile NaN
    return linear_percentile(n, p, ordered.__getitem__)


def median(values: np.ndarray) -> float:
    """`float(np.median(values))` for a non-empty 1-D array of numbers: numpy's mean of the
    middle value, or of the two middle values, from a partition around the same positions
    as numpy's (the last one too, for floats: a NaN sorts there)."""
    values = np.asarray(values)
    n = len(values)
    half = n // 2
    first = half if n % 2 else half - 1
    kth = list(range(first, half + 1))
    floats = values.dtype.kind in "fc"
    if floats:
        kth.append(-1)
    ordered = np.partition(values, kth)
    if floats and np.isnan(ordered[-1]):
        return math.nan
    return float(np.mean(ordered[first : half + 1]))
