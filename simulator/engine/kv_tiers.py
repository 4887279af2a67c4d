"""The CPU tier of the KV cache (docs/behaviour.md §2.4; vLLM CPU offloading, LMCache).

Plain Python: an LRU set of block hashes with a capacity in blocks. The GPU cache writes
blocks into it (when it evicts them, or as soon as they are hashed: the offload policy) and
looks prompts up in it when its own prefix lookup stops; hits are reloaded to the GPU by the
instance's host link. Only hashes are kept — the tier stores content, not block IDs.
"""

from __future__ import annotations

from collections import OrderedDict

OFFLOAD_POLICIES = ("evict", "mirror")
# A block reloaded within this long of being offloaded counts as thrashing: the GPU keeps
# giving up blocks it needs again almost at once.
THRASH_WINDOW_US = 1_000_000


class CPUTier:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"kv_cpu_blocks must be > 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, int] = OrderedDict()  # hash -> time it was offloaded
        self.offloaded_blocks = 0
        self.evicted_blocks = 0
        self.reloaded_blocks = 0
        self.thrashed_blocks = 0
        self.lookup_hits = 0
        self.lookup_misses = 0

    @property
    def used_blocks(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def store(self, block_hash: int, now_us: int) -> None:
        """Write a block's content to the tier (refreshing it if already there)."""
        lru = self._lru
        if block_hash in lru:
            lru.move_to_end(block_hash)
            return
        lru[block_hash] = now_us
        self.offloaded_blocks += 1
        if len(lru) > self.capacity_blocks:
            lru.popitem(last=False)
            self.evicted_blocks += 1

    def matching_prefix(self, hashes: list[int], start: int, stop: int) -> int:
        """How many of hashes[start:stop] are present, consecutively from `start`."""
        lru = self._lru
        count = 0
        for i in range(start, stop):
            if hashes[i] not in lru:
                break
            # A hit is recent use: refreshing it keeps it from being the next eviction while
            # the GPU makes room for the reload.
            lru.move_to_end(hashes[i])
            count += 1
        if count:
            self.lookup_hits += 1
        elif stop > start:
            self.lookup_misses += 1
        return count

    def reload(self, hashes: list[int], now_us: int) -> None:
        """Account for `hashes` copied back to the GPU; they stay in the tier (refreshed)."""
        lru = self._lru
        for h in hashes:
            offloaded_us = lru.get(h)
            if offloaded_us is None:
                # Pushed out by the very blocks the GPU just evicted to make room: a tier this
                # small cannot keep what it hands back.
                self.thrashed_blocks += 1
                continue
            if now_us - offloaded_us < THRASH_WINDOW_US:
                self.thrashed_blocks += 1
            lru.move_to_end(h)
        self.reloaded_blocks += len(hashes)

    def check_invariants(self) -> None:
        assert 0 <= self.used_blocks <= self.capacity_blocks
        assert self.offloaded_blocks - self.evicted_blocks == self.used_blocks
