"""servesim's percentile and median equal numpy's bit for bit (the summaries are compared byte
for byte), and computing them does not import numpy.ma (the point of not calling numpy's)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics.quantiles import median, percentile

PERCENTS = [0, 0.1, 1, 10, 33.3, 50, 66.7, 90, 95, 99, 99.9, 100]
integers = st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=60)
floats = st.lists(
    st.floats(allow_nan=False, width=64, min_value=-1e300, max_value=1e300)
    | st.sampled_from([math.inf, -math.inf, 0.0, -0.0, 5e-324]),
    min_size=1,
    max_size=60,
)


def same(ours: float, numpys: float) -> bool:
    """Equal as numbers and as bits (so -0.0 is not 0.0), NaN equal to NaN."""
    return np.float64(ours).tobytes() == np.float64(numpys).tobytes()


@given(values=integers, p=st.sampled_from(PERCENTS) | st.floats(0, 100))
def test_percentile_of_integers_equals_numpys(values, p):
    array = np.array(values, dtype=np.int64)
    assert same(percentile(array, p), float(np.percentile(array, p)))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf, as in numpy's own
@given(values=floats, p=st.sampled_from(PERCENTS) | st.floats(0, 100))
def test_percentile_of_floats_equals_numpys_infinities_included(values, p):
    array = np.array(values, dtype=np.float64)
    assert same(percentile(array, p), float(np.percentile(array, p)))


@pytest.mark.skipif(int(np.__version__.split(".")[0]) < 2, reason="numpy 1 promotes otherwise")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@given(
    values=st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=40),
    p=st.sampled_from(PERCENTS) | st.floats(0, 100),
)
def test_float32_values_promote_as_in_numpy(values, p):
    # numpy 2 interpolates with a weak (Python float) weight when p is a Python number, so
    # float32 values stay float32; with a numpy p the weight is float64 and so is the result.
    array = np.array(values, dtype=np.float32)
    assert same(percentile(array, p), float(np.percentile(array, p)))
    assert same(percentile(array, np.float64(p)), float(np.percentile(array, np.float64(p))))
    assert same(median(array), float(np.median(array)))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@given(values=integers.map(lambda v: np.array(v, dtype=np.int64)) | floats.map(np.array))
def test_median_equals_numpys(values):
    assert same(median(values), float(np.median(values)))


@given(
    values=st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0]), min_size=1, max_size=80),
    dtype=st.sampled_from([np.float64, np.float32]),
    p=st.sampled_from(PERCENTS) | st.floats(0, 100),
)
@settings(max_examples=300)
def test_signed_zeros_come_out_as_numpys(values, dtype, p):
    # Equal values are told apart only by the sign of zero, and which one lands at a position
    # depends on how the array was partitioned: numpy's positions are used, so the signs agree.
    array = np.array(values, dtype=dtype)
    assert same(percentile(array, p), float(np.percentile(array, p)))
    assert same(median(array), float(np.median(array)))


def test_a_nan_makes_both_nan_as_in_numpy():
    values = np.array([1.0, math.nan, 3.0])
    assert math.isnan(percentile(values, 50)) and math.isnan(np.percentile(values, 50))
    assert math.isnan(median(values)) and math.isnan(np.median(values))


def test_a_hand_computed_case():
    # 10 values 10, 20, ..., 100; p90: virtual index (10 - 1) * 0.9 = 8.1, between the 9th
    # (90) and the 10th (100) values with weight 0.1 (below 0.5): 90 + (100 - 90) * 0.1 ≈ 91.
    values = np.arange(100, 0, -10)
    assert percentile(values, 90) == 90 + 10 * ((9 * 0.9) - 8)
    assert median(values) == 55.0  # (50 + 60) / 2


def test_neither_imports_numpy_ma():
    code = (
        "import sys, numpy as np\n"
        "from simulator.metrics.quantiles import median, percentile\n"
        "from simulator.metrics.summary import CountedValues\n"
        "v = np.array([3, 1, 2, 5])\n"
        "percentile(v, 99); median(v); percentile(v.astype(float), 50)\n"
        "CountedValues(v, np.array([1, 2, 0, 4])).percentile(90)\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
