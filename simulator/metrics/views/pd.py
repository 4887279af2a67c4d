"""Prefill-decode disaggregation's views (docs/behaviour.md §7.4): one row per KV transfer,
and BLIS's PD metrics, from the run's PD record (metrics/pd_record.py: its parents, rows or
objects, and its link's transfer records and statistics)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..request_table import ParentRecords
from ..summary import stat_or_none

if TYPE_CHECKING:
    import pandas as pd

    from ..pd_record import PDRecord


def _parent_columns(parents: Sequence, names: Sequence[str]) -> list[np.ndarray]:
    """Fields of every PD parent (rows and objects alike), in order."""
    if isinstance(parents, ParentRecords):
        return [parents.column(name) for name in names]
    return [
        np.asarray([getattr(p, name) for p in parents], dtype=np.int64 if not parents else None)
        for name in names
    ]


def _transfer_ends(parents: Sequence) -> tuple[dict, list, list]:
    """Per PD parent in order: its position by request id (the last if an id repeats), its
    prefill instance and its decode instance index."""
    if isinstance(parents, ParentRecords):
        ids, prefill, decode = parents.transfer_ends()
    else:
        ids = [p.request_id for p in parents]
        prefill = [p.prefill_sub.instance_id for p in parents]
        decode = [p.decode_instance_index for p in parents]
    return dict(zip(ids, range(len(ids)), strict=True)), prefill, decode


TRANSFER_COLUMNS = (
    "request_id",
    "prefill_instance",
    "decode_instance",
    "size_bytes",
    "requested_us",
    "start_us",
    "end_us",
    "duration_us",
    "contention_delay_us",
    "concurrency_at_start",
    "slot_wait_us",
)


def transfers_frame(pd_state: PDRecord | None, instance_ids: list[str]) -> pd.DataFrame:
    """One row per KV transfer (PD): request, instances, bytes and timing (µs). Built column
    by column from the link's typed records; a link whose records hold values of other types
    (a fractional size, a start that is not a float) gets the row-by-row reference, whose
    types pandas infers from the values (a test compares the two)."""
    import pandas as pd

    if pd_state is None:
        return pd.DataFrame(columns=list(TRANSFER_COLUMNS))
    records = pd_state.link.records
    typed = (
        len(records) > 0
        and all(
            type(column) is array
            for column in (
                records.size_bytes,
                records.requested_us,
                records.duration_us,
                records.concurrency_at_start,
            )
        )
        and all(type(start) is float for start in records.other_starts.values())
    )
    if not typed:
        return transfer_rows_frame(pd_state, instance_ids)
    link = pd_state.link
    parents, prefill, decode = _transfer_ends(pd_state.parents)
    transfer_ids = list(records.transfer_id)
    parent_of = [parents[tid] for tid in transfer_ids]
    size = np.asarray(records.size_bytes).astype(np.int64)
    requested = np.asarray(records.requested_us).astype(np.int64)
    duration, starts, slot_waits = _link_columns(pd_state)
    # `lone_transfer_us` on every size: max(1, ceil(base + bytes / bandwidth)), the same
    # float operations (sizes below 2**53 convert exactly).
    lone = np.maximum(1, np.ceil(link.base_latency_us + size / link.bandwidth_bytes_per_us)).astype(
        np.int64
    )
    columns = {
        "request_id": transfer_ids,
        "prefill_instance": [prefill[i] for i in parent_of],
        "decode_instance": [instance_ids[decode[i]] for i in parent_of],
        "size_bytes": size,
        "requested_us": requested,
        "start_us": starts,
        "end_us": requested + duration,
        "duration_us": duration,
        "contention_delay_us": duration - lone,
        "concurrency_at_start": np.asarray(records.concurrency_at_start).astype(np.int64),
        "slot_wait_us": slot_waits,
    }
    return pd.DataFrame(columns, columns=list(TRANSFER_COLUMNS))


def transfer_rows_frame(pd_state: PDRecord, instance_ids: list[str]) -> pd.DataFrame:
    """`transfers_frame` row by row: each value as the records read it back, the frame's types
    inferred from them. The reference for the columns above, and the frame of a link whose
    records are not all typed."""
    import pandas as pd

    parents, prefill, decode = _transfer_ends(pd_state.parents)
    link = pd_state.link
    records = link.records
    rows = []
    for tid, size, requested, start, duration, concurrency in zip(
        records.transfer_id,
        records.size_bytes,
        records.requested_us,
        records.starts(),
        records.duration_us,
        records.concurrency_at_start,
        strict=True,
    ):
        parent = parents[tid]
        rows.append(
            (
                tid,
                prefill[parent],
                instance_ids[decode[parent]],
                size,
                requested,
                start,
                requested + duration,
                duration,
                duration - link.lone_duration_us(size),
                concurrency,
                start - (requested + link.base_latency_us),  # 0.0 exactly without a wait
            )
        )
    return pd.DataFrame.from_records(rows, columns=list(TRANSFER_COLUMNS))


def _link_columns(pd_state: PDRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`transfers_frame`'s duration_us (int64), start_us and slot_wait_us (float64) columns,
    read from the link's records without building the frame: a PD run's summary needs only
    the durations and waits, and the frame of a million transfers is a million Python rows.
    The same values: a timestamp below 2**53 µs converts to float64 exactly, so each
    operation is the one the frame's row makes (a test compares them). A start is the
    request time plus the base latency unless recorded otherwise, as
    `TransferRecords.start_us` computes it."""
    link = pd_state.link
    records = link.records
    durations = np.asarray(records.duration_us).astype(np.int64)
    requested = np.asarray(records.requested_us, dtype=np.float64)
    starts = requested + records.base_latency_us
    for i, start in records.other_starts.items():
        starts[i] = start
    return durations, starts, starts - (requested + link.base_latency_us)


def pd_metrics(pd_state: PDRecord | None, summary: dict[str, Any]) -> dict[str, Any] | None:
    """BLIS's `=== PD Metrics ===` (docs/behaviour.md §7.4) plus link concurrency."""
    if pd_state is None:
        return None
    d = pd_state
    duration_s = summary["vllm_estimated_duration_s"]
    prefill_tput = d.prefill_completed / duration_s if duration_s else 0.0
    decode_tput = d.decode_completed / duration_s if duration_s else 0.0
    lo, hi = sorted((prefill_tput, decode_tput))
    imbalance: float | str = 1.0 if hi == 0 else ("inf" if lo == 0 else hi / lo)
    first, arrival, transfer_end = _parent_columns(
        d.parents, ("first_token_us", "arrival_us", "transfer_end_us")
    )
    ttft = (first - arrival)[first >= 0].astype(np.int64)
    durations, _starts, slot_waits = _link_columns(d)
    completed_transfers = int(np.count_nonzero(transfer_end >= 0))
    end = max(summary["vllm_estimated_duration_s"] * 1e6, 1.0)

    return {
        "disaggregated_requests": completed_transfers,
        "dropped_at_decode_kv": d.dropped_at_decode_kv,
        "prefill_throughput_rps": prefill_tput,
        "decode_throughput_rps": decode_tput,
        "load_imbalance_ratio": imbalance,
        "parent_ttft_mean_ms": stat_or_none(ttft, None, 1000),
        "parent_ttft_p50_ms": stat_or_none(ttft, 50, 1000),
        "parent_ttft_p95_ms": stat_or_none(ttft, 95, 1000),
        "parent_ttft_p99_ms": stat_or_none(ttft, 99, 1000),
        "transfers": int(len(durations)),
        "transfer_duration_mean_us": stat_or_none(durations),
        "transfer_duration_p50_us": stat_or_none(durations, 50),
        "transfer_duration_p95_us": stat_or_none(durations, 95),
        "transfer_duration_p99_us": stat_or_none(durations, 99),
        "link_transfer_slots": d.link.transfer_slots,
        "transfer_slot_wait_mean_us": stat_or_none(slot_waits),
        "transfer_slot_wait_p99_us": stat_or_none(slot_waits, 99),
        "link_peak_concurrency": d.link.peak_concurrency,
        "link_mean_concurrency_at_start": d.link.mean_concurrency_at_start,
        "link_time_weighted_concurrency": d.link.time_weighted_mean_concurrency(int(end)),
    }
