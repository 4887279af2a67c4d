"""The step log stores narrow and reads back wide: a column's array starts at one byte a value
and widens when a value needs it, and every reader sees the declared type and the values as
they were written. The regular inter-token gaps reduce, chunk by chunk, to the same multiset
as the whole expanded columns."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics.recorder import StepLog, distinct_counts
from simulator.metrics.results import CountedValues

DECLARED = {
    "start_us": np.float64,
    "step_us": np.float64,
    "batch_size": np.intc,
    "prefill_tokens": np.intc,
    "decode_tokens": np.intc,
    "kv_used_blocks": np.intc,
    "queue_length": np.intc,
    "running_requests": np.intc,
    "preemptions": np.int64,
    "itl_regular_count": np.intc,
}


def _append(log: StepLog, row: dict) -> None:
    log.tail.append(tuple(row[name] for name in log.written))


def _row(start_us, step_us, count: int, big: int = 0) -> dict:
    return {
        "start_us": start_us,
        "step_us": step_us,
        "batch_size": count,
        "prefill_tokens": count,
        "decode_tokens": count,
        "kv_used_blocks": count,
        "queue_length": count,
        "running_requests": count,
        "preemptions": big,
        "itl_regular_count": count,
    }


def test_a_column_widens_only_as_far_as_its_values_need():
    log = StepLog()
    _append(log, _row(0, 5, 100))
    log.pack()
    assert log._packed["batch_size"].typecode == "b"  # 100 fits a signed byte
    assert log._packed["step_us"].typecode == "i"  # whole microseconds
    _append(log, _row(5, 7, 40_000, big=2**40))
    log.pack()
    assert log._packed["batch_size"].typecode == "i"  # 40,000 needs 4 bytes (not 2: signed)
    assert log._packed["preemptions"].typecode == "q"
    _append(log, _row(12, 2.5, -3))
    log.pack()
    assert log._packed["step_us"].typecode == "d"  # a fractional time
    for name, dtype in DECLARED.items():
        column = log.column(name)
        assert column.dtype == dtype, name
    assert list(log.column("batch_size")) == [100, 40_000, -3]
    assert list(log.column("preemptions")) == [0, 2**40, 0]
    assert list(log.column("step_us")) == [5.0, 7.0, 2.5]


def test_a_value_beyond_the_declared_type_still_fails_to_pack():
    log = StepLog()
    _append(log, _row(0, 5, 2**31))  # one past the declared 4-byte counts' maximum
    with pytest.raises(struct.error):
        log.pack()


def test_last_values_of_a_time_column_are_floats_once_packed():
    # As a "d" array gave them: the invariant checker reads the last two steps' times.
    log = StepLog()
    _append(log, _row(10, 5, 1))
    _append(log, _row(15, 6, 1))
    log.pack()
    _append(log, _row(21, 7, 1))
    assert log.last_values("start_us", 2) == [15.0, 21]
    assert [type(v) for v in log.last_values("start_us", 3)] == [float, float, int]


def test_starts_past_two_to_the_31_microseconds_keep_four_bytes_a_row():
    # Starts are stored as differences from the previous start while they are whole numbers:
    # 36 minutes into a run a start needs eight bytes, the step between two starts four.
    log = StepLog()
    starts = [2**31 + 10_000 * i for i in range(5_000)]
    for start in starts:
        _append(log, _row(start, 10_000, 1))
    log.pack()
    assert log._packed["start_us"].typecode == "h"  # 10,000 µs apart: two bytes each
    assert log.column("start_us").tolist() == [float(v) for v in starts]
    assert log.column("start_us").dtype == np.float64
    # A fractional start (a blocking CPU-tier reload) makes the column plain times for good.
    _append(log, _row(starts[-1] + 10_000.5, 3, 1))
    _append(log, _row(starts[-1] + 20_000, 3, 1))
    log.pack()
    assert log._packed["start_us"].typecode == "d"
    assert log.column("start_us").tolist() == [
        *map(float, starts),
        starts[-1] + 10_000.5,
        starts[-1] + 20_000.0,
    ]


@settings(max_examples=150, deadline=None)
@given(
    starts=st.lists(
        st.one_of(
            st.integers(-(2**40), 2**52),
            st.integers(0, 1_000),
            st.sampled_from([0.5, 2.0**31 + 0.25, 7.0]),
        ),
        max_size=60,
    ),
    pack_every=st.integers(1, 25),
)
def test_starts_read_back_as_written_whatever_the_storage(starts, pack_every):
    # Any whole numbers (any order, any size below 2**53) and fractional times, packed at any
    # points: every reader sees the starts that were appended, as a "d" array would hold them.
    log = StepLog()
    for i, start in enumerate(starts):
        _append(log, _row(start, 1, 1))
        if i % pack_every == 0:
            log.pack()
        for count in (1, 2, 3):
            expected = starts[max(0, i + 1 - count) : i + 1]
            got = log.last_values("start_us", count)
            assert got == expected  # values (a packed start may read back as a float)
            packed_rows = len(log) - len(log.tail)
            for k, value in enumerate(got):
                if i + 1 - len(got) + k < packed_rows:
                    assert type(value) is float
    assert log.column("start_us").tolist() == [float(v) for v in starts]
    assert log.column("start_us").dtype == np.float64


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 3),  # idle gap before the step, µs
            st.one_of(st.integers(1, 5_000), st.sampled_from([0.5, 1_000.25, 33.75])),
            st.integers(0, 300),  # tokens that saw the regular gap
        ),
        max_size=300,
    ),
    chunk_rows=st.integers(1, 64),
    otp_us=st.sampled_from([0, 7]),
    pack_every=st.integers(1, 400),
    first_start_us=st.sampled_from([0, 2**31 + 5, 2**45]),
)
def test_regular_gaps_counted_in_chunks_equal_the_expanded_columns(
    rows, chunk_rows, otp_us, pack_every, first_start_us
):
    log = StepLog(otp_us=otp_us)
    start_us = first_start_us
    for i, (idle_us, step_us, count) in enumerate(rows):
        start_us += idle_us
        _append(log, _row(start_us, step_us, count))
        start_us += step_us
        if i % pack_every == 0:
            log.pack()
    values, counts = log.itl_regular_counted(chunk_rows)
    expanded = np.repeat(
        np.asarray(log.itl_regular_gap_us, dtype=np.int64),
        np.asarray(log.itl_regular_count, dtype=np.int64),
    )
    distinct, expected_counts = np.unique(expanded, return_counts=True)
    assert values.dtype == counts.dtype == np.int64
    assert values.tolist() == distinct.tolist()
    assert counts.tolist() == expected_counts.tolist()
    counted = CountedValues(values, counts)
    if len(expanded):
        assert counted.mean() == float(expanded.sum() / len(expanded))
        for p in (50, 90, 99):
            assert counted.percentile(p) == float(np.percentile(expanded, p))


def test_distinct_counts_by_hand():
    # gaps 5, 3, 5, 9 seen by 2, 1, 4, 0 tokens: 3 once, 5 six times, 9 never (left out).
    values, counts = distinct_counts(np.array([5, 3, 5, 9]), np.array([2, 1, 4, 0]))
    assert values.tolist() == [3, 5] and counts.tolist() == [1, 6]
