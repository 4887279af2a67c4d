"""What an instance's engine leaves behind when the run ends: its counters, its step log and
the statistics of the features it ran, captured once so that a finished `Result` holds plain
records rather than the live engines (their queues, KV block tables and prefix-hash maps).

The attribute names are the engine's own (`steps`, `kv.total_blocks`, `irregular_itl_us`,
`speculation.stats`, ...): every view of a run, and `Result.engines`, read a record exactly as
they read an engine. Large columns (the step log, the irregular inter-token gaps) are taken
by reference, not copied, so capturing costs no memory; what is dropped is everything the
engine needed only while it ran.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..engine.batching import EngineConfig, VLLMEngine
    from ..engine.itl_pool import WithdrawnGaps
    from .recorder import StepLog


@dataclass(frozen=True, slots=True)
class CPUTierRecord:
    """The CPU KV tier's block counters (docs/behaviour.md §2.4)."""

    capacity_blocks: int
    offloaded_blocks: int
    evicted_blocks: int
    reloaded_blocks: int
    thrashed_blocks: int


@dataclass(frozen=True, slots=True)
class KVRecord:
    """The GPU KV cache's size, peak use and prefix-cache counters."""

    total_blocks: int
    peak_used_blocks: int
    cache_hits: int
    cache_misses: int
    prompt_blocks_looked_up: int
    hit_rate: float
    cpu: CPUTierRecord | None


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One instance's engine at the end of the run."""

    config: EngineConfig
    steps: StepLog
    irregular_itl_us: Sequence[float]
    # The gaps of requests that did not complete, which the pooled ITL leaves out.
    withdrawn_gaps: WithdrawnGaps
    kv: KVRecord
    clock_us: int
    completed_count: int
    total_input_tokens: int
    total_output_tokens: int
    preemption_count: int
    dropped_unservable: int
    timed_out: int
    length_capped: int
    kv_allocation_failures: int
    otp_us: int
    post_decode_us: int
    reload_idle_us: Sequence[int]
    # The feature states hold only their configuration and statistics (no requests, no
    # engine), so they are kept as they are: `speculation.stats`, `lora.stats`.
    speculation: Any
    lora: Any
    # How often the engine's exact accelerations applied (docs/performance.md).
    fast_path_steps: int
    steady_block_takes: int
    steps_coalesced: int


def record_of(record_type: type, live: Any, **changed: Any) -> Any:
    """A record of `live` (an engine, a link, a node, ...): each of the record type's fields
    read from the live object under the same name, unless given in `changed`. Every
    end-of-run record is taken this way, so a record cannot drift from what it records."""
    values = {
        f.name: getattr(live, f.name)
        for f in fields(record_type)
        if f.init and f.name not in changed
    }
    return record_type(**values, **changed)


def capture_instance(engine: VLLMEngine) -> InstanceRecord:
    """`engine`'s record, taken once it has stopped (its lazy progress synced)."""
    kv = engine.kv
    cpu = None if kv.cpu is None else record_of(CPUTierRecord, kv.cpu)
    return record_of(InstanceRecord, engine, kv=record_of(KVRecord, kv, cpu=cpu))
