"""Append-only logs written during a run; DataFrames are built once at the end."""

from __future__ import annotations

from array import array


class StepLog:
    """One row per engine step, stored column-wise in typed arrays: as cheap to append to as
    lists, and 8 bytes a value instead of a pointer plus an int object (a run can log
    millions of steps).

    batch_size counts the requests that got tokens in the step; kv_used_blocks, queue_length
    and running_requests are read at the step's end, after completions.
    """

    __slots__ = (
        "start_us",
        "step_us",
        "batch_size",
        "prefill_tokens",
        "decode_tokens",
        "kv_used_blocks",
        "queue_length",
        "running_requests",
        "cpu_kv_used_blocks",
        "reloading_requests",
        "preemptions",
        "itl_regular_gap_us",
        "itl_regular_count",
    )

    def __init__(self) -> None:
        # "d" for times: integers (exact below 2**53) except with blocking CPU-tier reloads,
        # whose durations are fractional; "q" for running totals; "i" for per-step counts.
        self.start_us = array("d")
        self.step_us = array("d")
        self.batch_size = array("i")
        self.prefill_tokens = array("i")
        self.decode_tokens = array("i")
        self.kv_used_blocks = array("i")
        self.queue_length = array("i")
        self.running_requests = array("i")
        self.cpu_kv_used_blocks = array("i")
        self.reloading_requests = array("i")
        self.preemptions = array("q")
        # Inter-token gaps: in a step every request that also got a token in the previous step
        # sees the same gap, so those are stored as (gap, count) per step, not per token.
        self.itl_regular_gap_us = array("d")
        self.itl_regular_count = array("i")

    def __len__(self) -> int:
        return len(self.start_us)
