"""Finished requests' integer columns are stored as narrow as their values allow and widen
when a value needs it; readers see int64 columns and the values as they were."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from simulator.metrics.request_table import extend_widening


def test_a_column_widens_as_far_as_its_values_need_and_no_further():
    column = extend_widening(array("b"), [1, -128, 127], "q")
    assert column.typecode == "b"  # a signed byte holds -128..127
    column = extend_widening(column, [5, 128, 6], "q")
    assert column.typecode == "h" and list(column) == [1, -128, 127, 5, 128, 6]
    column = extend_widening(column, [2**31], "q")  # one past the 4-byte maximum
    assert column.typecode == "q" and column[-1] == 2**31 and len(column) == 7


def test_beyond_the_widest_type_the_overflow_propagates_and_nothing_is_half_appended():
    column = array("b", [1, 2])
    with pytest.raises(OverflowError):
        extend_widening(column, [3, 2**15], "h")
    assert list(column) == [1, 2]


def test_request_columns_are_int64_whatever_the_storage():
    import simulator

    scenario = {
        "seed": 3,
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "tp": 1,
        "latency": {"model": "roofline"},
        "workload": {
            "rate": 20,
            "num_requests": 30,
            "prompt_tokens": {"distribution": "constant", "value": 300},
            "output_tokens": {"distribution": "constant", "value": 20},
        },
    }
    result = simulator.simulate(scenario, warn_unsteady=False)
    table = result.request_records.table
    assert table.numeric["input_tokens"].typecode == "h"  # 300 needs two bytes
    from simulator.metrics.request_table import request_columns

    cols = request_columns(result.request_records, ["input_tokens", "arrival_us"])
    assert cols["input_tokens"].dtype == np.int64 and set(cols["input_tokens"]) == {300}
    assert cols["arrival_us"].dtype == np.int64
