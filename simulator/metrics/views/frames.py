"""The per-request and per-step tables of a run, and BLIS's per-request records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...engine.request import Request, RequestState
from ..summary import mean_itl_ms

if TYPE_CHECKING:
    import pandas as pd

    from ..instance_record import InstanceRecord


def requests_frame(requests: list[Request]) -> pd.DataFrame:
    """One row per request; timestamps in µs (exact), latencies in ms."""

    import pandas as pd

    def opt(value: int) -> int | None:
        return value if value >= 0 else None

    rows = []
    for r in requests:
        done = r.state is RequestState.COMPLETED
        rows.append(
            (
                r.request_id,
                r.instance_id,
                r.state.value,
                r.arrival_us,
                opt(r.enqueue_us),
                opt(r.first_schedule_us),
                opt(r.schedule_us),
                opt(r.first_token_us),
                opt(r.completion_us) if done else None,
                r.input_tokens,
                r.output_tokens,
                r.generated_tokens,
                r.cached_tokens,
                r.preemptions,
                r.length_capped,
                (r.first_token_us - r.arrival_us) / 1000 if r.first_token_us >= 0 else np.nan,
                (r.completion_us - r.arrival_us) / 1000 if done else np.nan,
                # No gap to average below two tokens: NaN, as ttft_ms and e2e_ms of a stage
                # never reached (BLIS's records write 0.0 there; blis_request_records does).
                mean_itl_ms(r, no_gap=np.nan),
                (r.schedule_us - r.arrival_us) / 1000 if r.schedule_us >= 0 else np.nan,
                r.slo_class,
                r.tenant_id,
                r.model,
                r.client_id,
                r.session_id,
                r.round_index,
                r.prefix_group,
                r.disaggregated,
                r.prefill_sub.instance_id if r.prefill_sub is not None else "",
                r.decode_sub.instance_id if r.decode_sub is not None else "",
                (r.transfer_end_us - r.transfer_start_us) / 1000
                if r.transfer_end_us >= 0
                else np.nan,
                r.kv_reload_us / 1000,
            )
        )
    frame = pd.DataFrame.from_records(rows, columns=REQUEST_COLUMNS)
    # Timestamps stay exact integers; a stage never reached is <NA>. A frame of no requests
    # gets the types rows would have given (pandas infers `object` from none), so filters and
    # sums on it behave as on any other run's.
    return frame.astype({c: "Int64" for c in TIMESTAMP_COLUMNS} if rows else _EMPTY_REQUEST_TYPES)


REQUEST_COLUMNS = [
    "request_id",
    "instance_id",
    "state",
    "arrival_us",
    "enqueue_us",
    "first_schedule_us",
    "schedule_us",
    "first_token_us",
    "completion_us",
    "input_tokens",
    "output_tokens",
    "generated_tokens",
    "cached_tokens",
    "preemptions",
    "length_capped",
    "ttft_ms",
    "e2e_ms",
    "itl_ms",
    "scheduling_delay_ms",
    "slo_class",
    "tenant_id",
    "model",
    "client_id",
    "session_id",
    "round_index",
    "prefix_group",
    "disaggregated",
    "prefill_instance",
    "decode_instance",
    "transfer_ms",
    "kv_reload_ms",
]


# The request's timestamps: every column in µs.
TIMESTAMP_COLUMNS = [c for c in REQUEST_COLUMNS if c.endswith("_us")]
_COUNT_COLUMNS = (
    "input_tokens", "output_tokens", "generated_tokens", "cached_tokens", "preemptions",
    "round_index",
)  # fmt: skip
_EMPTY_REQUEST_TYPES: dict[str, Any] = {
    c: "Int64"
    if c in TIMESTAMP_COLUMNS
    else "float64"
    if c.endswith("_ms")
    else "int64"
    if c in _COUNT_COLUMNS
    else "bool"
    if c in ("length_capped", "disaggregated")
    else str
    for c in REQUEST_COLUMNS
}


def steps_frame(instances: Sequence[InstanceRecord], instance_ids: list[str]) -> pd.DataFrame:
    """One row per engine step of every instance, instance by instance."""
    import pandas as pd

    frames = []
    for eng, iid in zip(instances, instance_ids, strict=True):
        s = eng.steps
        frames.append(
            pd.DataFrame(
                {
                    "instance_id": iid,
                    "start_us": np.asarray(s.start_us, dtype=np.int64),
                    "step_us": np.asarray(s.step_us, dtype=np.int64),
                    "batch_size": np.asarray(s.batch_size, dtype=np.int64),
                    "prefill_tokens": np.asarray(s.prefill_tokens, dtype=np.int64),
                    "decode_tokens": np.asarray(s.decode_tokens, dtype=np.int64),
                    "kv_used_blocks": np.asarray(s.kv_used_blocks, dtype=np.int64),
                    "queue_length": np.asarray(s.queue_length, dtype=np.int64),
                    "running_requests": np.asarray(s.running_requests, dtype=np.int64),
                    "cpu_kv_used_blocks": np.asarray(s.cpu_kv_used_blocks, dtype=np.int64),
                    "reloading_requests": np.asarray(s.reloading_requests, dtype=np.int64),
                    "preemptions_total": np.asarray(s.preemptions, dtype=np.int64),
                }
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def blis_request_records(records: Sequence) -> list[dict[str, Any]]:
    """Per-request entries of BLIS's `--results-path` file (docs/behaviour.md §10.3), by
    arrival."""
    out = []
    for r in sorted(records, key=lambda x: (x.arrival_us, x.index)):
        done = r.state is RequestState.COMPLETED
        out.append(
            {
                "requestID": r.request_id,
                "arrived_at": r.arrival_us / 1e6,
                "num_prefill_tokens": r.input_tokens,
                "num_decode_tokens": r.output_tokens,
                "ttft_ms": (r.first_token_us - r.arrival_us) / 1000
                if r.first_token_us >= 0
                else 0.0,
                "itl_ms": mean_itl_ms(r) if done else 0.0,
                "e2e_ms": (r.completion_us - r.arrival_us) / 1000 if done else 0.0,
                "scheduling_delay_ms": (r.schedule_us - r.arrival_us) / 1000
                if r.schedule_us >= 0
                else 0.0,
                "slo_class": r.slo_class,
                "tenant_id": r.tenant_id,
                "handled_by": r.instance_id,
                "model": r.model,
                "client_id": r.client_id,
                "session_id": r.session_id,
                "round_index": r.round_index,
                "prefix_group": r.prefix_group,
                "length_capped": r.length_capped,
                "state": r.state.value,
            }
        )
    return out
