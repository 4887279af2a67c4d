"""Multi-LoRA serving, as vLLM runs it (docs/lora.md).

Many adapters share one base model. vLLM keeps `max_loras` adapters in GPU slots (every
adapter a batch uses must be in one), an LRU cache of `max_cpu_loras` adapters in host memory,
and loads the rest from disk; a batch never holds requests of more than `max_loras` adapters.
GPU buffers for `max_loras` adapters of `max_lora_rank` are allocated at start-up, out of the
memory that would otherwise hold KV blocks.

This module holds the rules as plain objects, testable without SimPy or an engine:

* `Adapter`, `LoRACost`: an adapter's size and what loading it and running it cost;
* `LRUSet`: an LRU of adapter names with a capacity;
* `LoRAConfig` (what an engine needs) and `LoRAState` (one engine's GPU slots, CPU cache and
  per-adapter statistics).

`VLLMEngine` (batching.py) applies them: the admission rule, the activation of each step's
adapters (loads added to the step, as vLLM loads them inside the step), the per-step cost of
the LoRA kernels.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .request import RequestState

# The linear layers of a decoder layer vLLM can put LoRA on (its `target_modules` names).
ALL_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Adapter:
    name: str
    rank: int
    target_modules: tuple[str, ...] = ALL_TARGET_MODULES


@dataclass(frozen=True)
class ModuleShapes:
    """(input, output) width of each target module of one decoder layer, and the layer count."""

    shapes: Mapping[str, tuple[int, int]]
    layers: int

    def widths(self, modules: Iterable[str]) -> int:
        """Σ (input + output) over `modules` and every layer: the parameters of a rank-1
        adapter on them (A is input × r, B is r × output)."""
        return self.layers * sum(sum(self.shapes[m]) for m in modules)


@dataclass(frozen=True)
class LoRACost:
    """What LoRA costs one instance, in µs.

    * per step: the batch's adapters run as punica's SGMV kernels (a shrink x·A and an expand
      ·B per target module and layer): 2·r·(in + out) FLOPs per token, and each adapter's A
      and B read once, r·(in + out)·bytes; the step pays the slower of compute and memory.
    * a load: an adapter's weights cross the host link (CPU cache → GPU slot); one missing
      from the CPU cache is first read from disk.
    """

    flop_us: float  # µs per (token × rank × Σ(in + out)) of compute, all GPUs of the instance
    byte_us: float  # µs per byte of adapter weights read from HBM, all GPUs
    load_byte_us: float  # µs per byte over the host link (CPU → GPU), all GPUs in parallel
    disk_byte_us: float  # µs per byte read from disk into the CPU cache
    load_base_us: int  # fixed cost of a CPU → GPU load
    disk_base_us: int  # fixed cost of a disk read (open, parse)
    bytes_per_param: float
    step_overhead_us: int = 0  # per step with LoRA requests in the batch

    def step_us(self, ranked_tokens: float, ranked_widths: float) -> int:
        """The LoRA kernels of a step: `ranked_tokens` = Σ over the batch's adapters of
        tokens × rank × widths, `ranked_widths` = Σ over them of rank × widths."""
        compute = 2.0 * ranked_tokens * self.flop_us
        memory = ranked_widths * self.bytes_per_param * self.byte_us
        return self.step_overhead_us + int(compute if compute > memory else memory)

    def load_us(self, size_bytes: float, from_disk: bool) -> int:
        t = self.load_base_us + size_bytes * self.load_byte_us
        if from_disk:
            t += self.disk_base_us + size_bytes * self.disk_byte_us
        return int(-(-t // 1))


@dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA serving for one instance."""

    adapters: Mapping[str, Adapter]
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    shapes: ModuleShapes
    cost: LoRACost
    # Adapter name -> Σ(in + out) over its target modules and the layers (params per rank).
    widths: Mapping[str, int] = field(default_factory=dict)
    # KV blocks the adapter buffers took from an auto-sized cache (0: the count was given).
    reserved_kv_blocks: int = 0

    def width(self, name: str) -> int:
        return self.widths[name]

    def size_bytes(self, name: str) -> float:
        adapter = self.adapters[name]
        return adapter.rank * self.widths[name] * self.cost.bytes_per_param

    def describe(self) -> dict:
        """What the run's provenance records about LoRA."""
        return {
            "adapters": len(self.adapters),
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras,
            "max_lora_rank": self.max_lora_rank,
            "reserved_gib": round(self.reserved_bytes() / 2**30, 3),
            "reserved_kv_blocks": self.reserved_kv_blocks,
        }

    def reserved_bytes(self) -> float:
        """vLLM's start-up buffers: `max_loras` slots of `max_lora_rank` on every module any
        adapter targets (all GPUs of the instance)."""
        modules = sorted({m for a in self.adapters.values() for m in a.target_modules})
        widths = self.shapes.widths(modules)
        return self.max_loras * self.max_lora_rank * widths * self.cost.bytes_per_param


class LRUSet:
    """Names in least-recently-used order with a capacity."""

    __slots__ = ("capacity", "_order")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._order: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, name: object) -> bool:
        return name in self._order

    def __len__(self) -> int:
        return len(self._order)

    def touch(self, name: str) -> None:
        self._order.move_to_end(name)

    def add(self, name: str, keep: frozenset[str] | set[str] = frozenset()) -> str | None:
        """Insert `name` as most recent; if that exceeds the capacity, evict the least recent
        name not in `keep` and return it (None when nothing was evicted)."""
        self._order[name] = None
        if len(self._order) <= self.capacity:
            return None
        for victim in self._order:
            if victim not in keep and victim != name:
                del self._order[victim]
                return victim
        raise AssertionError("every resident adapter is in use: more than the capacity")

    def remove(self, name: str) -> bool:
        """Drop `name`; False when it was not there."""
        if name not in self._order:
            return False
        del self._order[name]
        return True

    def names(self) -> list[str]:
        return list(self._order)


class AdapterStats:
    """Per adapter on one instance."""

    __slots__ = (
        "requests",
        "completed",
        "output_tokens",
        "gpu_loads",
        "disk_loads",
        "evictions",
        "load_us",
        "ttft_us",
        "e2e_us",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.completed = 0
        self.output_tokens = 0
        self.gpu_loads = 0  # cold loads: into a GPU slot
        self.disk_loads = 0  # of those, the ones read from disk (not in the CPU cache)
        self.evictions = 0  # from a GPU slot
        self.load_us = 0
        self.ttft_us: list[int] = []
        self.e2e_us: list[int] = []


class LoRAState:
    """One engine's adapters: GPU slots, CPU cache, statistics."""

    def __init__(self, config: LoRAConfig) -> None:
        self.config = config
        self.gpu = LRUSet(config.max_loras)
        self.cpu = LRUSet(config.max_cpu_loras)
        self.stats: dict[str, AdapterStats] = {}
        self.resident: frozenset[str] = frozenset()  # the GPU slots, for routing snapshots
        self.load_us = 0  # step time spent loading adapters
        self.compute_us = 0  # step time spent in LoRA kernels
        self.cpu_evictions = 0

    def knows(self, name: str) -> bool:
        return name in self.config.adapters

    def adapter_stats(self, name: str) -> AdapterStats:
        s = self.stats.get(name)
        if s is None:
            s = self.stats[name] = AdapterStats()
        return s

    def activate(self, tokens_by_adapter: Mapping[str, int]) -> int:
        """The step's adapters (at most max_loras) go into GPU slots: each missing one is
        loaded (from disk first if the CPU cache lacks it), evicting the least recently used
        slot no request of this step needs. Returns the step time this adds: the loads, then
        the LoRA kernels."""
        batch = tokens_by_adapter.keys()
        keep = set(batch)
        extra = 0
        changed = False
        cfg = self.config
        for name in batch:
            if name in self.gpu:
                # vLLM's worker re-adds every adapter of the batch each step, which refreshes
                # it in the host cache too (LRUCacheWorkerLoRAManager.add_adapter): a hot
                # adapter that never leaves its GPU slot never ages out of host memory.
                self.gpu.touch(name)
                self.cpu.touch(name)
                continue
            from_disk = name not in self.cpu
            if from_disk:
                dropped = self.cpu.add(name, keep)
                if dropped is not None:
                    # vLLM's CPU cache owns every loaded adapter: one it drops leaves its GPU
                    # slot too.
                    self.cpu_evictions += 1
                    if self.gpu.remove(dropped):
                        self.adapter_stats(dropped).evictions += 1
                        changed = True
            else:
                self.cpu.touch(name)
            victim = self.gpu.add(name, keep)
            changed = True
            stats = self.adapter_stats(name)
            stats.gpu_loads += 1
            stats.disk_loads += from_disk
            if victim is not None:
                self.adapter_stats(victim).evictions += 1
            t = cfg.cost.load_us(cfg.size_bytes(name), from_disk)
            stats.load_us += t
            extra += t
        if changed:
            self.resident = frozenset(self.gpu.names())
        self.load_us += extra
        ranked_tokens = ranked_widths = 0.0
        for name, tokens in tokens_by_adapter.items():
            rw = cfg.adapters[name].rank * cfg.width(name)
            ranked_widths += rw
            ranked_tokens += tokens * rw
        compute = cfg.cost.step_us(ranked_tokens, ranked_widths) if tokens_by_adapter else 0
        self.compute_us += compute
        return extra + compute

    def record_completion(self, adapter: str, ttft_us: int, e2e_us: int, tokens: int) -> None:
        s = self.adapter_stats(adapter)
        s.completed += 1
        s.output_tokens += tokens
        if ttft_us >= 0:
            s.ttft_us.append(ttft_us)
        s.e2e_us.append(e2e_us)


def summary_fields(states: Iterable[LoRAState], step_us_total: int) -> dict:
    """The summary's LoRA fields over `states` (one per engine) and their total step time."""
    states = list(states)
    stats = [s for state in states for s in state.stats.values()]
    load_us = sum(s.load_us for s in states)
    compute_us = sum(s.compute_us for s in states)
    return {
        "lora_cold_loads": sum(s.gpu_loads for s in stats),
        "lora_disk_loads": sum(s.disk_loads for s in stats),
        "lora_evictions": sum(s.evictions for s in stats),
        "lora_load_time_share": load_us / step_us_total if step_us_total else None,
        "lora_compute_time_share": compute_us / step_us_total if step_us_total else None,
        "lora_reserved_kv_blocks": sum(s.config.reserved_kv_blocks for s in states),
    }


def per_adapter(
    states: Iterable[LoRAState], duration_s: float, requests: Iterable[Any]
) -> dict[str, dict]:
    """Per adapter, adapters sorted by name: from the run's `requests` (each user-facing
    request once: a PD request's two sub-requests and a redirected or retried request's
    attempts are one request, as in the main summary) the requests that asked for it (less
    admission and routing rejections), those completed, TTFT p50 / p99 and E2E mean (ms) of
    the completed ones and their output tokens per second of the run; summed over the
    instances' `states`, cold loads into GPU slots (and of those from disk) and evictions."""
    import numpy as np

    merged: dict[str, list[AdapterStats]] = {}
    for state in states:
        for name, s in state.stats.items():
            merged.setdefault(name, []).append(s)
    asked: dict[str, int] = {}
    ttft: dict[str, list[int]] = {}
    e2e: dict[str, list[int]] = {}
    tokens: dict[str, int] = {}
    for req in requests:
        name = req.adapter
        if not name or req.state is RequestState.REJECTED:
            continue
        asked[name] = asked.get(name, 0) + 1
        if req.state is RequestState.COMPLETED:
            if req.first_token_us >= 0:
                ttft.setdefault(name, []).append(req.first_token_us - req.arrival_us)
            e2e.setdefault(name, []).append(req.completion_us - req.arrival_us)
            tokens[name] = tokens.get(name, 0) + req.generated_tokens
    out = {}
    for name in sorted(set(merged) | set(asked)):
        group = merged.get(name, [])
        ttft_us = np.array(ttft.get(name, []), dtype=np.int64)
        e2e_us = np.array(e2e.get(name, []), dtype=np.int64)
        out[name] = {
            "requests": asked.get(name, 0),
            "completed_requests": len(e2e_us),
            "load_count": sum(s.gpu_loads for s in group),
            "disk_load_count": sum(s.disk_loads for s in group),
            "eviction_count": sum(s.evictions for s in group),
            "ttft_p50_ms": float(np.percentile(ttft_us, 50)) / 1000 if len(ttft_us) else None,
            "ttft_p99_ms": float(np.percentile(ttft_us, 99)) / 1000 if len(ttft_us) else None,
            "e2e_mean_ms": float(e2e_us.mean()) / 1000 if len(e2e_us) else None,
            "throughput_tok_per_s": tokens.get(name, 0) / duration_s if duration_s > 0 else 0.0,
        }
    return out
