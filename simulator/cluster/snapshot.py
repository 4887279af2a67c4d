"""What the control plane may see of an instance (docs/behaviour.md §6.4–6.5).

A snapshot is plain data. Admission and routing read snapshots only, never an engine: that is
the boundary that keeps the control plane from peeking at a request's true output length
(INV-9) and that lets signal staleness be modelled (INV-7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class InstanceSnapshot(NamedTuple):
    """Immutable, and a tuple rather than a frozen dataclass: the router builds one per
    candidate instance per request, and a tuple is built several times faster."""

    instance_id: str
    index: int
    queue_depth: int = 0
    batch_size: int = 0
    kv_utilization: float = 0.0
    free_kv_blocks: int = 0
    cache_hit_rate: float = 0.0
    in_flight: int = 0
    model: str = ""
    # LoRA adapters in the instance's GPU slots (docs/lora.md); empty without LoRA.
    adapters: frozenset[str] = frozenset()

    @property
    def effective_load(self) -> int:
        """Queue depth + batch size + routed-but-unfinished requests (BLIS's EffectiveLoad)."""
        return self.queue_depth + self.batch_size + self.in_flight


class SnapshotCache:
    """Signal freshness (INV-7): in-flight counts are always live; queue depth, batch size and
    the KV group are re-read only when `interval_us` has passed since their last read.

    interval 0 reads everything live. With a positive interval the first cached snapshot is
    all-zero with last refresh at t = 0, as in BLIS.
    """

    def __init__(
        self,
        interval_us: int,
        read_live: Callable[[int, int], InstanceSnapshot],
        read_in_flight: Callable[[int], int],
        instances: list[tuple[str, str]],
    ) -> None:
        self.interval_us = interval_us
        self.read_live = read_live
        self.read_in_flight = read_in_flight
        # `read_live.many(indices, in_flights)`, when the reader has it (the cluster's does):
        # every candidate's snapshot in one call rather than a call per candidate. Without
        # it (a reader standing in for the cluster's), `read_live` is called per candidate.
        self._read_many = getattr(read_live, "many", None)
        self._cached = [
            InstanceSnapshot(iid, i, model=model) for i, (iid, model) in enumerate(instances)
        ]
        self._refreshed_us = [0] * len(instances)

    def add(self, instance_id: str, model: str) -> None:
        """An instance made during the run, at the next index: all-zero until first read."""
        self._cached.append(InstanceSnapshot(instance_id, len(self._cached), model=model))
        self._refreshed_us.append(0)

    def get(self, index: int, now_us: int) -> InstanceSnapshot:
        if self.interval_us <= 0:
            return self.read_live(index, self.read_in_flight(index))
        if now_us - self._refreshed_us[index] >= self.interval_us:
            self._cached[index] = self.read_live(index, 0)
            self._refreshed_us[index] = now_us
        return self._cached[index]._replace(in_flight=self.read_in_flight(index))

    def get_many(self, indices: list[int], now_us: int) -> list[InstanceSnapshot]:
        """`get` for each of `indices`, in order (the router's candidates for a request)."""
        if self.interval_us <= 0:
            read_live, read_in_flight = self.read_live, self.read_in_flight
            if self._read_many is not None:
                return self._read_many(indices, map(read_in_flight, indices))
            return [read_live(i, read_in_flight(i)) for i in indices]
        return [self.get(i, now_us) for i in indices]
