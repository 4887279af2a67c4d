"""Paged KV cache: block allocation, prefix caching with chained hashes, LRU free list.

Plain Python, no SimPy (docs/behaviour.md §2.1–2.2):

* Blocks hold `block_size` tokens. A block is *used* while some request references it
  (ref count > 0) and *free* otherwise; free blocks keep their content hash, so a later request
  with the same prefix can revive them (a prefix-cache hit).
* New blocks are taken from the head of the free list (least recently freed first); a request's
  blocks are released last-to-first onto the tail, so its first block is freed most recently.
* Allocation is all-or-nothing: the block count is checked before anything changes.

Never-used blocks are not materialised: they sit, conceptually, at the head of the free list in
ID order (as they do in BLIS, where the free list starts as 0..N-1), and get an ID when first
taken. That keeps a 1,000,000-block cache cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

from .kv_tiers import CPUTier
from .request import Request, RequestState


class KVCache:
    """Block manager for one instance."""

    def __init__(
        self,
        total_blocks: int,
        block_size: int,
        cpu: CPUTier | None = None,
        offload_policy: str = "evict",
        defer_private_hashes: bool = True,
    ) -> None:
        if total_blocks <= 0:
            raise ValueError(f"total_kv_blocks must be > 0, got {total_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self._fresh_next = 0  # IDs below this have been materialised
        self._ref_count: list[int] = []
        self._block_hash: list[int | None] = []
        # Released blocks in LRU order, as a queue with lazy deletion: a release appends the
        # block and notes its position (absolute, ever-increasing: list index + `_free_base`);
        # the head is `_free_head` (a list index; the consumed prefix is cut off now and then).
        # A block revived by a prefix hit keeps its entry, which no longer matches
        # `_free_pos` and is skipped when the head reaches it; `_free_stale` counts such
        # entries, and while there are none the head's blocks are taken as one slice. An
        # OrderedDict did the same with a linked-list node allocated per release, and was most
        # of the KV cost of 125-block PD prompts; a plain dict rescans deleted slots at its
        # head (quadratic).
        self._free_order: list[int] = []
        self._free_pos: list[int] = []  # per block: position of its live entry, -1 if none
        self._free_head = 0
        self._free_base = 0
        self._free_stale = 0  # stale entries from the head on
        self._free_count = 0  # live entries: released blocks not in use
        # Blocks held by more than one request (prefix hits): while there are none, a release
        # frees every block of the request without counting references down one by one.
        self._shared_blocks = 0
        # Until the first prefix hit nothing reads a free block's reference count or queue
        # position (only a revival does, and stale entries come only from revivals): a
        # release then just appends its blocks, and the first hit writes both for every
        # block in the queue (`_settle_free_blocks`). Caches that never hit (no shared
        # content, private content deferred) never pay a per-block write on release.
        self._free_state_settled = False
        # No block has held a hash yet: a reused block then has no content to erase, and
        # (unsettled) its reference count still reads 1, so taking it needs no per-block work.
        self._never_hashed = True
        self._hash_to_block: dict[int, int] = {}
        self.used_blocks = 0
        # A hit per prefix block found cached, a miss per block allocated new, decode blocks
        # included: `hit_rate`, BLIS's per-instance figure that the routers read, is
        # hits / (hits + misses).
        self.cache_hits = 0
        self.cache_misses = 0
        # Blocks holding prompt tokens, counted once per admission (a preempted request's
        # return is another): what the prefix lookup was asked about, whatever the output
        # length, as vLLM's prefix-cache queries count prompt tokens. The CPU-tier rates'
        # denominator.
        self.prompt_blocks_looked_up = 0
        self.peak_used_blocks = 0
        # Optional CPU tier (docs/behaviour.md §2.4): "evict" writes a block's content there when
        # the GPU reuses the block (vLLM's offloading connector); "mirror" as soon as it is hashed.
        self.cpu = cpu
        self.offload_on_evict = cpu is not None and offload_policy == "evict"
        self.offload_on_hash = cpu is not None and offload_policy == "mirror"
        # Blocks of a request's private content (`Request.private_from_token`: its own prompt
        # tokens and its output) are hashed only if someone could ever look them up: its own
        # return after a preemption (or any release short of completion). Until then no
        # lookup can find them, as no other request has that content, and an index entry
        # would only be erased again when the block is reused; so their hashing waits for a
        # release that needs it, and a completed request's never happens. A CPU tier sees
        # every hashed or evicted block, so with one every block is hashed at once.
        self.defer_private = cpu is None and defer_private_hashes
        self.now_us = 0

    # ------------------------------------------------------------------ queries
    @property
    def hash_index(self) -> dict[int, int]:
        """Block hash -> block of every cached block (read-only for callers): what a router
        fed by KV-cache events learns, e.g. `cluster.prefix_index.CacheSignalView`."""
        return self._hash_to_block

    def defers_hash(self, req: Request, block_index: int) -> bool:
        """Is the hashing of `req`'s block at `block_index` deferred (private content)?
        `_hash_full_blocks` applies the same rule to a range of blocks."""
        private_from = req.private_from_token
        return (
            private_from >= 0
            and self.defer_private
            and block_index >= private_from // self.block_size
        )

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    @property
    def reusable_blocks(self) -> int:
        """Blocks not in use, counted where they are: released (LRU) plus never used yet.
        Equals `free_blocks` exactly when KV blocks are conserved (INV-4)."""
        return self._free_count + self.total_blocks - self._fresh_next

    def free_lru(self) -> list[int]:
        """Released blocks not in use, least recently freed first (the order of reuse)."""
        if not self._free_state_settled:
            return self._free_order[self._free_head :]  # no revival yet: no stale entry
        pos = self._free_pos
        order = self._free_order
        base = self._free_base
        return [b for k in range(self._free_head, len(order)) if pos[b := order[k]] == base + k]

    @property
    def utilization(self) -> float:
        return self.used_blocks / self.total_blocks

    @property
    def hit_rate(self) -> float:
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if total else 0.0

    def blocks_needed(self, req: Request, end_token: int) -> int:
        """New blocks `req` needs so its KV covers tokens [0, end_token)."""
        needed = -(-end_token // self.block_size) - len(req.block_ids)
        return needed if needed > 0 else 0

    def cached_prefix_blocks(self, req: Request, max_tokens: int) -> list[int]:
        """Longest run of leading full blocks of `req`'s content already in the cache.

        At most `max_tokens // block_size` blocks are matched: the caller keeps the last token
        uncached so the step that computes it produces the next output (as vLLM does).
        """
        max_blocks = max_tokens // self.block_size
        if max_blocks <= 0 or not self._hash_to_block:
            return []
        hashes = req.block_hashes(max_blocks, self.block_size)
        found: list[int] = []
        lookup = self._hash_to_block
        for i in range(max_blocks):
            block = lookup.get(hashes[i])
            if block is None:
                break
            found.append(block)
        return found

    def cpu_prefix_blocks(self, req: Request, gpu_blocks: int, max_tokens: int) -> int:
        """Full blocks right after the GPU hits whose content the CPU tier holds."""
        max_blocks = max_tokens // self.block_size
        if self.cpu is None or max_blocks <= gpu_blocks:
            return 0
        hashes = req.block_hashes(max_blocks, self.block_size)
        return self.cpu.matching_prefix(hashes, gpu_blocks, max_blocks)

    # ------------------------------------------------------------------ mutation
    def try_allocate(
        self,
        req: Request,
        start_token: int,
        end_token: int,
        cached: list[int],
        known_end: int = -1,
    ) -> bool:
        """Give `req` KV for tokens [start_token, end_token), first committing `cached` blocks.

        `cached` (from cached_prefix_blocks) is only passed when the request holds no blocks.
        The blocks that become full of known tokens are hashed: those below `known_end` when
        given (a speculative step allocates for drafts and lookahead, whose tokens are not
        known yet), else below `end_token`. Returns False, changing nothing, when the free
        blocks do not suffice.
        """
        bs = self.block_size
        if cached:
            if not self._free_state_settled:
                self._settle_free_blocks()
            revived = 0
            ref = self._ref_count
            for b in cached:
                if ref[b] == 0:
                    revived += 1
            new_needed = -(-end_token // bs) - len(cached)
            if new_needed < 0:
                new_needed = 0
            if new_needed + revived > self.total_blocks - self.used_blocks:
                return False
            free_pos = self._free_pos
            for b in cached:
                held = ref[b]
                if held == 0:
                    free_pos[b] = -1  # its entry in the free queue is stale now
                    self.used_blocks += 1
                elif held == 1:
                    self._shared_blocks += 1
                ref[b] = held + 1
            self._free_count -= revived
            self._free_stale += revived
            req.block_ids.extend(cached)
            self.cache_hits += len(cached)
            self.prompt_blocks_looked_up += -(-req.prefill_target // bs)
        else:
            new_needed = -(-end_token // bs) - len(req.block_ids)
            if new_needed > self.total_blocks - self.used_blocks:
                return False
        if new_needed > 0:
            # Holding no block yet (a prefix hit gave it some): an admission, not a later
            # chunk or a decode. Checked only here, as most decode calls take no new block.
            if not req.block_ids:
                self.prompt_blocks_looked_up += -(-req.prefill_target // bs)
            self._take_new_blocks(req, new_needed)
        self._hash_full_blocks(req, start_token, end_token if known_end < 0 else known_end)
        return True

    def _take_new_blocks(self, req: Request, count: int) -> None:
        ids = req.block_ids
        fresh = self.total_blocks - self._fresh_next
        if fresh:
            # Never-used blocks first, in ID order, all at once.
            n = count if count < fresh else fresh
            first = self._fresh_next
            self._fresh_next = first + n
            ids.extend(range(first, first + n))
            self._ref_count.extend([1] * n)
            self._block_hash.extend([None] * n)
            self._free_pos.extend([-1] * n)
            reused = count - n
        else:
            reused = count
        if reused:
            # The least recently freed blocks, off the queue's head (skipping stale entries).
            taken = self._pop_free(reused)
            if self._free_state_settled or not self._never_hashed:
                self._reuse(taken)
            ids.extend(taken)
        self.used_blocks += count
        self.cache_misses += count
        if self.used_blocks > self.peak_used_blocks:
            self.peak_used_blocks = self.used_blocks

    def take_block(self, req: Request) -> None:
        """One new block for `req` (the caller checked there is room): `_take_new_blocks` for
        a count of one, without its loops, as decoding requests need it every block_size steps."""
        b = self._fresh_next
        if b < self.total_blocks:
            self._fresh_next = b + 1
            self._ref_count.append(1)
            self._block_hash.append(None)
            self._free_pos.append(-1)
        else:
            if self._free_stale:
                (b,) = self._pop_free(1)
            else:
                order = self._free_order
                head = self._free_head
                b = order[head]
                self._free_count -= 1
                self._free_head = head = head + 1
                if head > _COMPACT_AFTER and 2 * head > len(order):
                    self._cut_free_head()
            if self._block_hash[b] is not None:
                self._reuse((b,))
            else:
                self._ref_count[b] = 1
        req.block_ids.append(b)
        self.cache_misses += 1
        used = self.used_blocks + 1
        self.used_blocks = used
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used

    def _pop_free(self, count: int) -> list[int]:
        """Take `count` (<= the live entries) least recently freed blocks off the queue."""
        order = self._free_order
        head = self._free_head
        if not self._free_stale:
            taken = order[head : head + count]
            head += count
        else:
            pos = self._free_pos
            at = self._free_base + head  # the head's position
            taken = []
            while len(taken) < count:
                b = order[head]
                if pos[b] == at:
                    taken.append(b)
                else:
                    self._free_stale -= 1
                head += 1
                at += 1
        self._free_count -= count
        self._free_head = head
        if head > _COMPACT_AFTER and 2 * head > len(order):
            self._cut_free_head()
        return taken

    def _cut_free_head(self) -> None:
        """Drop the consumed part of the free queue (positions stay absolute: the base moves)."""
        head = self._free_head
        del self._free_order[:head]
        self._free_base += head
        self._free_head = 0

    def _reuse(self, blocks: Sequence[int]) -> None:
        """`blocks`, just taken off the free queue, are in use again: the cached content they
        held is gone (to the CPU tier when offloading on eviction)."""
        ref = self._ref_count
        block_hash = self._block_hash
        index = self._hash_to_block
        offload = self.offload_on_evict
        pop = index.pop
        for b in blocks:
            ref[b] = 1
            old = block_hash[b]
            if old is None:
                continue
            # One probe: the index nearly always names this block for its content; when it
            # names another (the same content computed twice), put that one back.
            holder = pop(old, b)
            if holder != b:
                index[old] = holder
            block_hash[b] = None
            if offload:
                self.cpu.store(old, self.now_us)

    def _hash_full_blocks(self, req: Request, start_token: int, end_token: int) -> None:
        """Hash the blocks that became full in [start_token, end_token): prompt and output
        alike, as vLLM V1 caches every full block and BLIS's append branch hashes the block a
        decode token fills (docs/behaviour.md §2.2). A private block's hashing is deferred
        (`defer_private`): this only notes how many blocks are full."""
        bs = self.block_size
        first = start_token // bs
        last_full = end_token // bs
        if last_full <= first:
            return
        private_from = req.private_from_token
        if private_from >= 0 and self.defer_private:
            private_block = private_from // bs
            if last_full > private_block:
                req.deferred_hash_blocks = last_full
                if first >= private_block:
                    return
                last_full = private_block
        self._never_hashed = False
        hashes = req.block_hashes(last_full, bs)
        ids = req.block_ids
        block_hash = self._block_hash
        index = self._hash_to_block
        mirror = self.offload_on_hash
        for b, h in zip(ids[first:last_full], hashes[first:last_full], strict=True):
            if block_hash[b] is None:
                block_hash[b] = h
                index.setdefault(h, b)
                if mirror:
                    self.cpu.store(h, self.now_us)

    def append_token(self, req: Request, position: int) -> bool:
        """KV for one decode token at `position`; a new block only at a block boundary, a
        hash (or, for private content, a deferred one) when the token fills its block."""
        bs = self.block_size
        if position % bs == 0 or not req.block_ids:
            if self.used_blocks >= self.total_blocks:
                return False
            self.take_block(req)
        end = position + 1
        if end % bs == 0:
            self._hash_full_blocks(req, position, end)
        return True

    def hash_filled_block(self, req: Request, end: int) -> None:
        """The token at `end` - 1, a block's last position, fills its block: what
        `append_token` does then, for a steady decoder whose KV was taken without it
        (engine/accelerator.py)."""
        self._hash_full_blocks(req, end - 1, end)

    def hash_known_blocks(self, req: Request, start_token: int, end_token: int) -> None:
        """The tokens [start_token, end_token) of `req`, whose KV it holds, became known after
        their allocation (a speculative step's accepted drafts): hash the blocks they fill, as
        an allocation does for the tokens it knows (`_hash_full_blocks`, deferral included)."""
        self._hash_full_blocks(req, start_token, end_token)

    def check_invariants(self, holders: list[Request]) -> None:
        """Assert KV conservation against the requests that hold blocks (tests and debug)."""
        expected: dict[int, int] = {}
        for req in holders:
            for b in req.block_ids:
                expected[b] = expected.get(b, 0) + 1
        ref = list(self._ref_count)
        if not self._free_state_settled:
            # Before the first prefix hit free blocks keep their last count: read them as 0.
            assert self._shared_blocks == 0 and self._free_stale == 0
            for b in self._free_order[self._free_head :]:
                ref[b] = 0
        in_use = [b for b, r in enumerate(ref) if r > 0]
        assert self._shared_blocks == sum(1 for r in ref if r > 1)
        assert self._free_stale == len(self._free_order) - self._free_head - len(self.free_lru())
        assert len(in_use) == self.used_blocks, (len(in_use), self.used_blocks)
        for b in in_use:
            assert ref[b] == expected.get(b, 0), (b, ref[b])
        assert set(expected) == set(in_use)
        never_used = self.total_blocks - self._fresh_next
        free = self.free_lru()
        assert len(free) == self._free_count, (len(free), self._free_count)
        assert self.used_blocks + len(free) + never_used == self.total_blocks
        assert all(ref[b] == 0 for b in free)
        for req in holders:  # a block's hash is the content the request expects there
            hashes = req._block_hashes or []  # noqa: SLF001
            for i, b in enumerate(req.block_ids[: len(hashes)]):
                h = self._block_hash[b]
                assert h is None or h == hashes[i], (req, i)
        if self.cpu is not None:
            self.cpu.check_invariants()

    def release(self, req: Request) -> None:
        """Drop `req`'s references, last block first; blocks reaching zero go to the LRU tail."""
        ref = self._ref_count
        order = self._free_order
        append = order.append
        pos = self._free_pos
        first = tail = self._free_base + len(order)
        ids = req.block_ids
        if not self._free_state_settled:
            # No prefix hit yet, so no shared block either: the blocks just join the queue.
            order.extend(reversed(ids))
            tail += len(ids)
        elif not self._shared_blocks:
            # Every block is this request's alone: all of them are freed.
            order.extend(reversed(ids))
            for b in reversed(ids):
                ref[b] = 0
                pos[b] = tail
                tail += 1
        else:
            for b in reversed(ids):
                left = ref[b] - 1
                ref[b] = left
                if not left:
                    pos[b] = tail
                    tail += 1
                    append(b)
                elif left == 1:
                    self._shared_blocks -= 1
        freed = tail - first
        self.used_blocks -= freed
        self._free_count += freed
        if req.deferred_hash_blocks and req.state is not RequestState.COMPLETED:
            self._hash_deferred(req)
        req.deferred_hash_blocks = 0
        req.block_ids = []
        if self._free_stale > self._free_count + _STALE_SLACK:
            self._drop_stale_entries()

    def _hash_deferred(self, req: Request) -> None:
        """Hash the private blocks whose hashing was deferred, as `_hash_full_blocks` would
        have: a request that may return needs its cached content findable. No other block
        can hold these hashes (the content is this request's alone and it was never released
        before with them hashed), so inserting them now leaves the index as hashing them at
        once would have. From now on the request is hashed at once: its own cached blocks
        may be found again, so its content is no longer private to one holder."""
        bs = self.block_size
        first = req.private_from_token // bs
        end = req.deferred_hash_blocks
        req.private_from_token = -1
        self._never_hashed = False
        hashes = req.block_hashes(end, bs)
        block_hash = self._block_hash
        index = self._hash_to_block
        for b, h in zip(req.block_ids[first:end], hashes[first:end], strict=True):
            if block_hash[b] is None:
                block_hash[b] = h
                index.setdefault(h, b)

    def _settle_free_blocks(self) -> None:
        """Write the reference count (0) and queue position of every free block, as releases
        do once the cache has had a prefix hit."""
        ref = self._ref_count
        pos = self._free_pos
        order = self._free_order
        base = self._free_base
        for k in range(self._free_head, len(order)):
            b = order[k]
            ref[b] = 0
            pos[b] = base + k
        self._free_state_settled = True

    def _drop_stale_entries(self) -> None:
        """Rebuild the free queue from its live entries: revivals (prefix hits) leave stale
        ones behind, and with a large cache the head may not reach them for a long time."""
        live = self.free_lru()
        self._free_order = live
        self._free_head = self._free_base = self._free_stale = 0
        pos = self._free_pos
        for k, b in enumerate(live):
            pos[b] = k


_STALE_SLACK = 4096  # stale free-queue entries tolerated beyond as many as the live ones
_COMPACT_AFTER = 4096  # consumed free-queue entries kept before the list is cut
