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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..engine.batching import EngineConfig, VLLMEngine
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
    hit_rate: float
    cpu: CPUTierRecord | None


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One instance's engine at the end of the run."""

    config: EngineConfig
    steps: StepLog
    irregular_itl_us: Sequence[float]
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


def capture_instance(engine: VLLMEngine) -> InstanceRecord:
    """`engine`'s record, taken once it has stopped (its lazy progress synced)."""
    kv = engine.kv
    tier = kv.cpu
    return InstanceRecord(
        config=engine.config,
        steps=engine.steps,
        irregular_itl_us=engine.irregular_itl_us,
        kv=KVRecord(
            total_blocks=kv.total_blocks,
            peak_used_blocks=kv.peak_used_blocks,
            cache_hits=kv.cache_hits,
            cache_misses=kv.cache_misses,
            hit_rate=kv.hit_rate,
            cpu=None
            if tier is None
            else CPUTierRecord(
                capacity_blocks=tier.capacity_blocks,
                offloaded_blocks=tier.offloaded_blocks,
                evicted_blocks=tier.evicted_blocks,
                reloaded_blocks=tier.reloaded_blocks,
                thrashed_blocks=tier.thrashed_blocks,
            ),
        ),
        clock_us=engine.clock_us,
        completed_count=engine.completed_count,
        total_input_tokens=engine.total_input_tokens,
        total_output_tokens=engine.total_output_tokens,
        preemption_count=engine.preemption_count,
        dropped_unservable=engine.dropped_unservable,
        timed_out=engine.timed_out,
        length_capped=engine.length_capped,
        kv_allocation_failures=engine.kv_allocation_failures,
        otp_us=engine.otp_us,
        post_decode_us=engine.post_decode_us,
        reload_idle_us=engine.reload_idle_us,
        speculation=engine.speculation,
        lora=engine.lora,
        fast_path_steps=engine.fast_path_steps,
        steady_block_takes=engine.steady_block_takes,
        steps_coalesced=engine.steps_coalesced,
    )
