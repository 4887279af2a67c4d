"""The step log keeps every row it is given, in order, whether packed or still in its tails."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics.recorder import PACK_AFTER_ROWS, STEP_COLUMNS, StepLog

WRITTEN = (
    "start_us",
    "step_us",
    "batch_size",
    "prefill_tokens",
    "decode_tokens",
    "kv_used_blocks",
    "queue_length",
    "running_requests",
    "preemptions",
    "itl_regular_count",
)


def _log_rows(log: StepLog, rows: list[dict]) -> None:
    for row in rows:
        log.tail.append(tuple(row[name] for name in log.written))


def _rows(count: int, fractional_every: int = 0) -> list[dict]:
    rows = []
    start_us = 0
    for i in range(count):
        step_us = 900 + i % 37
        if fractional_every and i % fractional_every == 0:
            step_us += 0.5  # a blocking CPU-tier reload's fractional duration
        rows.append(
            {
                "start_us": start_us,
                "step_us": step_us,
                "batch_size": i % 300,
                "prefill_tokens": (i * 7) % 2049,
                "decode_tokens": i % 256,
                "kv_used_blocks": 29_000 - i % 5_000,
                "queue_length": i % 3,
                "running_requests": i % 300,
                "preemptions": i // 1000,
                "itl_regular_count": i % 250,
            }
        )
        start_us = start_us + step_us + (i % 2)  # idle a microsecond after every other step
    return rows


@settings(max_examples=25, deadline=None)
@given(
    count=st.integers(min_value=0, max_value=3 * PACK_AFTER_ROWS),
    pack_at=st.lists(st.integers(min_value=0, max_value=3 * PACK_AFTER_ROWS), max_size=4),
    fractional_every=st.sampled_from([0, 1, 97]),
)
def test_columns_hold_every_row_in_order_however_often_the_log_packs(
    count, pack_at, fractional_every
):
    rows = _rows(count, fractional_every)
    log = StepLog(otp_us=7)
    done = 0
    for cut in sorted({min(c, count) for c in pack_at}) + [count]:
        _log_rows(log, rows[done:cut])
        log.pack()
        done = cut
    assert len(log) == count
    for name in WRITTEN:
        assert list(log.column(name)) == [row[name] for row in rows], name
    # Columns not written: the CPU tier's (none here) and the regular gap, from the times.
    assert not log.cpu_kv_used_blocks.any() and len(log.reloading_requests) == count
    previous_end_us = -1
    gaps = []
    for row in rows:
        end_us = row["start_us"] + row["step_us"]
        gaps.append(end_us - previous_end_us + 7)  # the engine's own arithmetic
        previous_end_us = end_us
    assert list(log.itl_regular_gap_us) == gaps


def test_last_values_read_across_the_packed_part_and_the_tail():
    rows = _rows(PACK_AFTER_ROWS + 3)
    log = StepLog()
    _log_rows(log, rows[:PACK_AFTER_ROWS])
    log.pack()
    assert log.last_values("start_us", 2) == [
        r["start_us"] for r in rows[PACK_AFTER_ROWS - 2 : PACK_AFTER_ROWS]
    ]
    _log_rows(log, rows[PACK_AFTER_ROWS:][:1])
    assert log.last_values("step_us", 2) == [
        r["step_us"] for r in rows[PACK_AFTER_ROWS - 1 : PACK_AFTER_ROWS + 1]
    ]
    assert StepLog().last_values("start_us", 2) == []


def test_an_engine_with_a_cpu_tier_stores_its_columns_and_every_name_is_readable():
    log = StepLog(has_cpu_tier=True)
    rows = _rows(3)
    for row, cpu_used, reloading in zip(rows, [5, 6, 7], [0, 1, 0], strict=True):
        row.update(cpu_kv_used_blocks=cpu_used, reloading_requests=reloading)
    _log_rows(log, rows)
    assert list(log.cpu_kv_used_blocks) == [5, 6, 7]
    assert list(log.reloading_requests) == [0, 1, 0]
    assert all(isinstance(log.column(name), np.ndarray) for name in STEP_COLUMNS)
