"""Append-only logs written during a run; DataFrames are built once at the end."""

from __future__ import annotations


class StepLog:
    """One row per engine step, stored column-wise in plain lists (cheap in the hot path).

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
        self.start_us: list[int] = []
        self.step_us: list[int] = []
        self.batch_size: list[int] = []
        self.prefill_tokens: list[int] = []
        self.decode_tokens: list[int] = []
        self.kv_used_blocks: list[int] = []
        self.queue_length: list[int] = []
        self.running_requests: list[int] = []
        self.cpu_kv_used_blocks: list[int] = []
        self.reloading_requests: list[int] = []
        self.preemptions: list[int] = []
        # Inter-token gaps: in a step every request that also got a token in the previous step
        # sees the same gap, so those are stored as (gap, count) per step, not per token.
        self.itl_regular_gap_us: list[int] = []
        self.itl_regular_count: list[int] = []

    def __len__(self) -> int:
        return len(self.start_us)
