"""KVCache unit tests (docs/behaviour.md §2.1–2.2): block geometry, all-or-nothing allocation, LRU
release order, prefix-cache hits and eviction, decode appends, and KV conservation (INV-4).

Block size is 16 throughout unless a test says otherwise; "blocks for n tokens" = ceil(n/16).
"""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine import kv_cache as kv_cache_module
from simulator.engine.kv_cache import KVCache
from simulator.engine.request import Request, RequestState

BS = 16


def req(rid: str, tokens: int, out: int = 10) -> Request:
    """A request whose prompt tokens are unique to it."""
    return Request(rid, 0, tokens, out)


def shared(rid: str, prefix: int, own: int, group: str = "g", out: int = 10) -> Request:
    """A request whose prompt is a shared `prefix` (same tokens for every group member)
    followed by `own` tokens unique to it."""
    segments = [(("prefix", group), prefix)]
    if own:
        segments.append((("req", rid), own))
    return Request(rid, 0, prefix + own, out, segments=segments)


def free_list(kv: KVCache) -> list[int]:
    """Released blocks, LRU head first (the order in which they will be reused)."""
    return kv.free_lru()


def test_constructor_rejects_non_positive_geometry():
    with pytest.raises(ValueError):
        KVCache(0, BS)
    with pytest.raises(ValueError):
        KVCache(10, 0)


# ---------------------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    ("tokens", "blocks"),
    [(1, 1), (15, 1), (16, 1), (17, 2), (32, 2), (33, 3), (100, 7)],  # ceil(tokens / 16)
)
def test_allocation_rounds_up_to_whole_blocks(tokens, blocks):
    kv = KVCache(100, BS)
    r = req("a", tokens)
    assert kv.blocks_needed(r, tokens) == blocks
    assert kv.try_allocate(r, 0, tokens, [])
    assert len(r.block_ids) == blocks
    assert kv.used_blocks == blocks
    assert kv.free_blocks == 100 - blocks
    assert kv.cache_misses == blocks  # every freshly taken block is a miss
    kv.check_invariants([r])


def test_partial_last_block_is_filled_before_a_new_block_is_taken():
    kv = KVCache(100, BS)
    r = req("a", 40)
    assert kv.try_allocate(r, 0, 10, [])  # tokens 0..9 -> 1 block, 6 spare slots
    assert len(r.block_ids) == 1
    # tokens 10..15 fit in the 6 spare slots: no new block.
    assert kv.blocks_needed(r, 16) == 0
    assert kv.try_allocate(r, 10, 16, [])
    assert len(r.block_ids) == 1
    # tokens 16..19 start a new block; 20..31 fill it; 32..39 need a third.
    assert kv.try_allocate(r, 16, 20, [])
    assert len(r.block_ids) == 2
    assert kv.try_allocate(r, 20, 32, [])
    assert len(r.block_ids) == 2
    assert kv.try_allocate(r, 32, 40, [])
    assert len(r.block_ids) == 3
    assert kv.used_blocks == 3
    kv.check_invariants([r])


def test_allocation_uses_exactly_the_free_blocks_when_they_suffice():
    kv = KVCache(4, BS)
    r = req("a", 64)
    assert kv.try_allocate(r, 0, 64, [])  # 64/16 = 4 blocks = the whole cache
    assert kv.used_blocks == 4
    assert kv.free_blocks == 0


# ---------------------------------------------------------------------------- all-or-nothing


def test_try_allocate_failure_changes_nothing():
    kv = KVCache(4, BS)
    a = req("a", 48)
    b = req("b", 32)
    assert kv.try_allocate(a, 0, 48, [])  # 3 blocks, 1 free
    kv.release(a)  # 3 released blocks on the free list
    assert kv.try_allocate(a, 0, 48, [])  # takes the never-used block 3, then 2 from the LRU
    before = (kv.used_blocks, free_list(kv), kv.cache_hits, kv.cache_misses, list(a.block_ids))
    # b needs 2 blocks, only 1 is free -> refused, nothing moves.
    assert not kv.try_allocate(b, 0, 32, [])
    after = (kv.used_blocks, free_list(kv), kv.cache_hits, kv.cache_misses, list(a.block_ids))
    assert after == before
    assert b.block_ids == []
    kv.check_invariants([a, b])


def test_try_allocate_failure_with_cached_prefix_leaves_hits_and_free_list_unchanged():
    kv = KVCache(5, BS)
    a = shared("a", 48, 4)  # 52 tokens -> 4 blocks; the 3 full prefix blocks get hashed
    assert kv.try_allocate(a, 0, 52, [])
    kv.release(a)
    filler = req("f", 16)
    assert kv.try_allocate(filler, 0, 16, [])  # never-used block 4
    b = shared("b", 48, 40)  # 88 tokens -> 6 blocks in total
    cached = kv.cached_prefix_blocks(b, b.input_tokens - 1)
    assert len(cached) == 3
    before = (kv.used_blocks, free_list(kv), kv.cache_hits, kv.cache_misses)
    # 3 revived + (6 - 3) new = 6 blocks needed > 4 free -> refused.
    assert not kv.try_allocate(b, 0, 88, cached)
    assert (kv.used_blocks, free_list(kv), kv.cache_hits, kv.cache_misses) == before
    assert b.block_ids == []
    kv.check_invariants([filler, b])


# ---------------------------------------------------------------------------- release order


def test_release_walks_last_to_first_so_first_block_is_reused_last():
    kv = KVCache(4, BS)
    a = req("a", 64)
    assert kv.try_allocate(a, 0, 64, [])
    assert a.block_ids == [0, 1, 2, 3]
    kv.release(a)
    assert kv.used_blocks == 0
    # Released last to first onto the tail: 3 is the LRU head, 0 (a's first block) the tail.
    assert free_list(kv) == [3, 2, 1, 0]
    b = req("b", 64)
    assert kv.try_allocate(b, 0, 16, [])
    assert b.block_ids == [3]
    assert kv.try_allocate(b, 16, 48, [])
    assert b.block_ids == [3, 2, 1]
    assert kv.try_allocate(b, 48, 64, [])
    assert b.block_ids == [3, 2, 1, 0]  # a's first block comes back last
    kv.check_invariants([b])


def test_never_used_blocks_are_taken_before_released_ones():
    # BLIS's free list starts as 0..N-1 and released blocks go to its tail.
    kv = KVCache(8, BS)
    a = req("a", 64)
    assert kv.try_allocate(a, 0, 64, [])  # blocks 0..3
    kv.release(a)
    b = req("b", 96)
    assert kv.try_allocate(b, 0, 96, [])  # 6 blocks: 4..7 never used, then LRU 3, 2
    assert b.block_ids == [4, 5, 6, 7, 3, 2]
    assert free_list(kv) == [1, 0]
    kv.check_invariants([b])


def test_shared_block_is_freed_only_when_its_last_holder_releases():
    kv = KVCache(10, BS)
    a = shared("a", 32, 8)
    assert kv.try_allocate(a, 0, 40, [])  # 3 blocks, prefix blocks 0, 1 hashed
    b = shared("b", 32, 8)
    cached = kv.cached_prefix_blocks(b, b.input_tokens - 1)
    assert cached == [0, 1]
    assert kv.try_allocate(b, 32, 40, cached)
    assert kv.used_blocks == 4  # 0, 1 shared + a's block 2 + b's own block
    kv.release(a)
    assert kv.used_blocks == 3  # only a's private block was freed
    assert free_list(kv) == [2]
    kv.check_invariants([b])
    kv.release(b)
    assert kv.used_blocks == 0
    kv.check_invariants([])


# ---------------------------------------------------------------------------- prefix caching


def test_prefix_shared_after_release_gives_cache_hits():
    kv = KVCache(100, BS)
    a = shared("a", 64, 20)  # 84 tokens: 4 full prefix blocks + 1 own block + 1 partial
    assert kv.try_allocate(a, 0, 84, [])
    assert kv.cache_misses == 6  # ceil(84/16)
    kv.release(a)
    b = shared("b", 64, 30)  # same 64-token prefix, different tail
    cached = kv.cached_prefix_blocks(b, b.input_tokens - 1)
    # (94-1)//16 = 5 blocks may match; block 4 holds a's own tokens, so exactly 4 match.
    assert cached == [0, 1, 2, 3]  # a, first in a fresh cache, got blocks 0, 1, 2, ...
    assert kv.try_allocate(b, 64, 94, cached)
    assert b.block_ids[:4] == cached
    assert kv.cache_hits == 4
    # b's tail: ceil(94/16) - 4 = 2 fresh blocks.
    assert kv.cache_misses == 6 + 2
    assert kv.hit_rate == pytest.approx(4 / (4 + 8))
    kv.check_invariants([b])


def test_requests_with_different_prefixes_do_not_hit():
    kv = KVCache(100, BS)
    a = shared("a", 64, 20, group="g1")
    assert kv.try_allocate(a, 0, 84, [])
    kv.release(a)
    b = shared("b", 64, 20, group="g2")
    assert kv.cached_prefix_blocks(b, b.input_tokens - 1) == []
    assert kv.hit_rate == 0.0


def test_hit_rate_is_zero_before_any_allocation():
    assert KVCache(10, BS).hit_rate == 0.0


def test_lookup_matches_at_most_prompt_minus_one_over_block_size_blocks():
    kv = KVCache(100, BS)
    a = shared("a", 64, 0)  # a prompt of exactly 4 full blocks
    assert kv.try_allocate(a, 0, 64, [])
    kv.release(a)
    b = shared("b", 64, 0)  # identical prompt: all 4 blocks are in the cache ...
    assert len(kv.cached_prefix_blocks(b, 64)) == 4
    # ... but the last token is always recomputed: (64-1)//16 = 3 blocks are matched.
    assert len(kv.cached_prefix_blocks(b, b.input_tokens - 1)) == 3
    c = shared("c", 64, 1)  # 65 tokens: (65-1)//16 = 4 blocks may match
    assert len(kv.cached_prefix_blocks(c, c.input_tokens - 1)) == 4


def test_only_full_prompt_blocks_are_hashed():
    kv = KVCache(100, BS)
    a = shared("a", 40, 0)  # 40 tokens: 2 full blocks + 8 tokens in a partial third block
    assert kv.try_allocate(a, 0, 40, [])
    kv.release(a)
    b = shared("b", 40, 20)  # shares all 40 tokens, but only 2 full blocks were hashed
    assert len(kv.cached_prefix_blocks(b, b.input_tokens - 1)) == 2


def test_reusing_a_free_block_evicts_its_hash():
    kv = KVCache(4, BS)
    a = shared("a", 32, 1)  # 33 tokens -> blocks 0, 1 (hashed prefix), 2 (partial)
    assert kv.try_allocate(a, 0, 33, [])
    kv.release(a)
    assert free_list(kv) == [2, 1, 0]
    probe = shared("probe", 32, 1)
    assert kv.cached_prefix_blocks(probe, 32) == [0, 1]
    c = req("c", 64)
    assert kv.try_allocate(c, 0, 32, [])  # never-used block 3, then LRU head 2 (unhashed)
    assert c.block_ids == [3, 2]
    assert kv.cached_prefix_blocks(probe, 32) == [0, 1]
    assert kv.try_allocate(c, 32, 48, [])  # takes block 1: the prefix's second block
    assert c.block_ids[-1] == 1
    assert kv.cached_prefix_blocks(probe, 32) == [0]  # chain stops at the evicted block
    assert kv.try_allocate(c, 48, 64, [])  # takes block 0: the prefix is gone entirely
    assert kv.cached_prefix_blocks(probe, 32) == []
    kv.check_invariants([c])


def test_cached_blocks_held_by_a_running_request_are_shared_not_copied():
    kv = KVCache(10, BS)
    a = shared("a", 32, 5)
    assert kv.try_allocate(a, 0, 37, [])
    b = shared("b", 32, 5)
    cached = kv.cached_prefix_blocks(b, b.input_tokens - 1)
    assert cached == a.block_ids[:2]
    used = kv.used_blocks
    assert kv.try_allocate(b, 32, 37, cached)
    assert kv.used_blocks == used + 1  # only b's own block is new
    assert kv.cache_hits == 2
    kv.check_invariants([a, b])


# ---------------------------------------------------------------------------- decode appends


def test_append_token_takes_a_new_block_only_at_a_block_boundary():
    kv = KVCache(10, BS)
    r = req("a", 16)
    assert kv.try_allocate(r, 0, 16, [])
    assert len(r.block_ids) == 1
    assert kv.append_token(r, 16)  # position 16 = first slot of block 2
    assert len(r.block_ids) == 2
    for pos in range(17, 32):  # positions 17..31 fill block 2
        assert kv.append_token(r, pos)
        assert len(r.block_ids) == 2
    assert kv.append_token(r, 32)
    assert len(r.block_ids) == 3
    assert kv.cache_misses == 3
    kv.check_invariants([r])


def test_append_token_fails_without_side_effects_when_cache_full():
    kv = KVCache(2, BS)
    r = req("a", 32)
    assert kv.try_allocate(r, 0, 32, [])
    before = (kv.used_blocks, kv.cache_misses, list(r.block_ids))
    assert not kv.append_token(r, 32)  # needs a third block; none free
    assert (kv.used_blocks, kv.cache_misses, list(r.block_ids)) == before
    assert kv.append_token(r, 31) is True  # a non-boundary position needs no block


def test_blocks_filled_by_decode_output_are_hashed():
    kv = KVCache(10, BS)
    a = shared("a", 16, 0)
    assert kv.try_allocate(a, 0, 16, [])
    for pos in range(16, 33):  # block 1 filled by output tokens only (position 31 fills it)
        assert kv.append_token(a, pos)
    kv.release(a)
    b = Request("b", 0, 40, 5, segments=[(("prefix", "g"), 16), (("out", "a"), 24)])
    # b's block 1 holds a's output tokens 0-15: a's decode block, hashed when it filled (as
    # vLLM V1 and BLIS's append branch do; docs/behaviour.md §2.2).
    assert len(kv.cached_prefix_blocks(b, 39)) == 2


# ---------------------------------------------------------------------------- conservation

N_REQS = 4
TOTAL = 8  # small: allocations fail, blocks get reused and hashes evicted

op_strategy = st.tuples(
    st.sampled_from(["alloc", "alloc", "append", "append", "release"]),
    st.integers(0, N_REQS - 1),
    st.integers(1, 24),
)


@settings(max_examples=150, deadline=None)
@given(
    inputs=st.lists(st.integers(1, 100), min_size=N_REQS, max_size=N_REQS),
    groups=st.lists(st.sampled_from(["x", "y"]), min_size=N_REQS, max_size=N_REQS),
    ops=st.lists(op_strategy, min_size=20, max_size=100),
)
def test_kv_conservation_holds_after_every_operation(inputs, groups, ops):
    kv = KVCache(TOTAL, BS)
    reqs = []
    for i, (n, g) in enumerate(zip(inputs, groups, strict=True)):
        prefix = min(n, 32)  # shared content makes prefix hits (and shared blocks) happen
        reqs.append(shared(f"r{i}", prefix, n - prefix, group=g, out=100))
    pos = [0] * N_REQS  # tokens covered by each request's KV
    for op, i, k in ops:
        r = reqs[i]
        if op == "alloc" and pos[i] < r.input_tokens:
            if not r.block_ids:
                cached = kv.cached_prefix_blocks(r, r.input_tokens - 1)
                start = len(cached) * BS
            else:
                cached, start = [], pos[i]
            end = min(start + k, r.input_tokens)
            before = (kv.used_blocks, kv.cache_misses, kv.cache_hits, free_list(kv))
            ok = kv.try_allocate(r, start, end, cached)
            if ok:
                pos[i] = end
                assert len(r.block_ids) == -(-end // BS)
            else:  # all-or-nothing
                after = (kv.used_blocks, kv.cache_misses, kv.cache_hits, free_list(kv))
                assert after == before
                assert len(r.block_ids) == -(-pos[i] // BS)
        elif op == "append" and pos[i] >= r.input_tokens:
            if kv.append_token(r, pos[i]):
                pos[i] += 1
            assert len(r.block_ids) == -(-pos[i] // BS)
        elif op == "release":
            kv.release(r)
            pos[i] = 0
            assert r.block_ids == []
        assert kv.used_blocks + kv.free_blocks == TOTAL
        assert 0 <= kv.used_blocks <= TOTAL
        assert kv.used_blocks <= kv.peak_used_blocks
        kv.check_invariants(reqs)
    for r in reqs:
        kv.release(r)
    assert kv.used_blocks == 0
    kv.check_invariants(reqs)


@pytest.mark.parametrize(
    ("stale_slack", "compact_after"),
    [(0, 0), (kv_cache_module._STALE_SLACK, kv_cache_module._COMPACT_AFTER)],
)
@settings(max_examples=120, deadline=None)
@given(
    inputs=st.lists(st.integers(1, 100), min_size=N_REQS, max_size=N_REQS),
    groups=st.lists(st.sampled_from(["x", "y"]), min_size=N_REQS, max_size=N_REQS),
    ops=st.lists(op_strategy, min_size=20, max_size=100),
)
def test_free_list_is_least_recently_freed_first(stale_slack, compact_after, inputs, groups, ops):
    """The free queue (lazy deletion, stale entries dropped now and then, the consumed head
    cut off now and then, taken as one slice while nothing is stale) against the rule stated
    one block at a time: a release appends the blocks it frees, last block first; a prefix hit
    takes its blocks out wherever they are; new blocks come off the head."""
    kv = KVCache(TOTAL, BS)
    reqs = [
        shared(f"r{i}", min(n, 32), n - min(n, 32), group=g, out=100)
        for i, (n, g) in enumerate(zip(inputs, groups, strict=True))
    ]
    pos = [0] * N_REQS
    expected: list[int] = []  # the rule's free list, head first

    def held() -> set[int]:
        return {b for r in reqs for b in r.block_ids}

    with (
        mock.patch.object(kv_cache_module, "_STALE_SLACK", stale_slack),
        mock.patch.object(kv_cache_module, "_COMPACT_AFTER", compact_after),
    ):
        for op, i, k in ops:
            r = reqs[i]
            before_ids = list(r.block_ids)
            fresh_before = kv._fresh_next
            cached: list[int] = []
            if op == "alloc" and pos[i] < r.input_tokens:
                if not r.block_ids:
                    cached = kv.cached_prefix_blocks(r, r.input_tokens - 1)
                    start = len(cached) * BS
                else:
                    start = pos[i]
                end = min(start + k, r.input_tokens)
                if kv.try_allocate(r, start, end, cached):
                    pos[i] = end
            elif op == "append" and pos[i] >= r.input_tokens:
                if kv.append_token(r, pos[i]):
                    pos[i] += 1
            elif op == "release":
                kv.release(r)
                pos[i] = 0
                now_held = held()
                expected += [b for b in reversed(before_ids) if b not in now_held]
            new = r.block_ids[len(before_ids) :]
            if new:
                head = [b for b in expected if b not in cached]
                reused = [b for b in new if b not in cached and b < fresh_before]
                assert reused == head[: len(reused)]
                expected = head[len(reused) :]
            assert free_list(kv) == expected
            assert kv.reusable_blocks == kv.free_blocks
        kv.check_invariants(reqs)


# ---------------------------------------------------------------- deferred private hashing


def private(rid: str, prefix: int, own: int, group: str = "g", out: int = 100) -> Request:
    """`shared`, with the generator's mark that the `own` tokens are this request's alone."""
    r = shared(rid, prefix, own, group=group, out=out)
    r.private_from_token = prefix
    return r


def test_a_completed_private_request_leaves_no_hash_but_a_preempted_one_does():
    # 40 shared + 60 own tokens = 100 tokens in 7 blocks of 16: blocks 0-1 (tokens 0-31) are
    # shared content, block 2 holds tokens 32-47 (shared and own: private from token 40 means
    # private from block 40 // 16 = 2), blocks 3-5 are full and own; block 6 (96-99) is partial.
    # Hashed are the full prompt blocks 0-5; at once only the shared 0-1, the rest on release.
    lazy, eager = KVCache(64, BS), KVCache(64, BS)
    eager.defer_private = False
    done, preempted, reference = private("a", 40, 60), private("b", 40, 60), private("c", 40, 60)
    for kv, r in ((lazy, done), (lazy, preempted), (eager, reference)):
        assert kv.try_allocate(r, 0, 100, [])
    shared_hashes = set(done.block_hashes(2, BS))
    assert set(lazy._hash_to_block) == shared_hashes  # a's and b's shared blocks are the same
    assert len(eager._hash_to_block) == 6
    done_ids = list(done.block_ids)
    done.state = RequestState.COMPLETED
    lazy.release(done)
    assert set(lazy._hash_to_block) == shared_hashes
    b_ids = list(preempted.block_ids)
    lazy.release(preempted)  # still queued: it may come back for its cached blocks
    assert {h: b for h, b in lazy._hash_to_block.items() if h not in shared_hashes} == dict(
        zip(preempted.block_hashes(6, BS)[2:6], b_ids[2:6], strict=True)
    )
    assert preempted.private_from_token == -1  # hashed at once from now on
    # Coming back, it finds all six full blocks, as it would have without the deferral: the
    # shared two are a's (cached first), the private four its own.
    assert lazy.cached_prefix_blocks(preempted, 99) == [*done_ids[:2], *b_ids[2:6]]


REQ_STATES = [RequestState.QUEUED, RequestState.COMPLETED]


@settings(max_examples=150, deadline=None)
@given(
    inputs=st.lists(st.integers(1, 100), min_size=N_REQS, max_size=N_REQS),
    groups=st.lists(st.sampled_from(["x", "y"]), min_size=N_REQS, max_size=N_REQS),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "alloc", "append", "append", "release", "complete"]),
            st.integers(0, N_REQS - 1),
            st.integers(1, 24),
        ),
        min_size=20,
        max_size=100,
    ),
)
def test_deferring_private_hashes_changes_nothing_anyone_can_see(inputs, groups, ops):
    """The same operations on a cache that defers private hashing and one that hashes at
    once: every lookup, allocation, free list and counter agrees; the deferring index lacks
    only hashes of private blocks whose request completed without releasing them otherwise
    (those can never be looked up), and after a release short of completion nothing."""
    caches = {"lazy": KVCache(TOTAL, BS), "eager": KVCache(TOTAL, BS)}
    caches["eager"].defer_private = False
    reqs = {
        name: [
            private(f"r{i}", min(n, 32), n - min(n, 32), group=g)
            for i, (n, g) in enumerate(zip(inputs, groups, strict=True))
        ]
        for name in caches
    }
    pos = [0] * N_REQS
    retired = [False] * N_REQS
    for op, i, k in ops:
        if retired[i]:
            continue
        seen = {}
        for name, kv in caches.items():
            r = reqs[name][i]
            if op == "alloc" and pos[i] < r.input_tokens:
                cached = kv.cached_prefix_blocks(r, r.input_tokens - 1) if not r.block_ids else []
                start = len(cached) * BS if not r.block_ids else pos[i]
                end = min(start + k, r.input_tokens)
                seen[name] = (cached, kv.try_allocate(r, start, end, cached), end)
            elif op == "append" and pos[i] >= r.input_tokens:
                seen[name] = kv.append_token(r, pos[i])
            elif op in ("release", "complete"):
                r.state = RequestState.COMPLETED if op == "complete" else RequestState.QUEUED
                kv.release(r)
            kv.check_invariants(reqs[name])
        if op == "alloc" and seen:
            assert seen["lazy"] == seen["eager"]
            if seen["lazy"][1]:
                pos[i] = seen["lazy"][2]
        elif op == "append" and seen:
            assert seen["lazy"] == seen["eager"]
            pos[i] += seen["lazy"]
        elif op in ("release", "complete"):
            pos[i] = 0
            retired[i] = op == "complete"
        lazy, eager = caches["lazy"], caches["eager"]
        assert [r.block_ids for r in reqs["lazy"]] == [r.block_ids for r in reqs["eager"]]
        assert free_list(lazy) == free_list(eager)
        assert (lazy.used_blocks, lazy.cache_hits, lazy.cache_misses) == (
            eager.used_blocks, eager.cache_hits, eager.cache_misses
        )  # fmt: skip
        missing = eager._hash_to_block.items() - lazy._hash_to_block.items()
        assert lazy._hash_to_block.items() <= eager._hash_to_block.items()
        for h, _block in missing:

            def private_hashes(r):
                return r.block_hashes(-(-r.input_tokens // BS) + 2, BS)[
                    r.private_from_token // BS :
                ]

            owners = [j for j, r in enumerate(reqs["eager"]) if h in private_hashes(r)]
            assert owners and all(retired[j] or reqs["lazy"][j].block_ids for j in owners), h


@settings(max_examples=150, deadline=None)
@given(
    inputs=st.lists(st.integers(1, 100), min_size=N_REQS, max_size=N_REQS),
    groups=st.lists(st.sampled_from(["x", "y"]), min_size=N_REQS, max_size=N_REQS),
    ops=st.lists(op_strategy, min_size=20, max_size=100),
)
def test_free_block_state_written_at_the_first_hit_is_what_releases_would_have_written(
    inputs, groups, ops
):
    """Until its first prefix hit a cache does not write free blocks' reference counts and
    queue positions; against a cache that writes them on every release: the same blocks,
    free queue and counters throughout, and once it has settled, the same per-block state."""
    caches = [KVCache(TOTAL, BS), KVCache(TOTAL, BS)]
    caches[1]._free_state_settled = True  # writes on every release, as before
    reqs = [
        [
            shared(f"r{i}", min(n, 32), n - min(n, 32), group=g, out=100)
            for i, (n, g) in enumerate(zip(inputs, groups, strict=True))
        ]
        for _ in caches
    ]
    pos = [0] * N_REQS
    for op, i, k in ops:
        outcomes = []
        for kv, rs in zip(caches, reqs, strict=True):
            r = rs[i]
            if op == "alloc" and pos[i] < r.input_tokens:
                cached = kv.cached_prefix_blocks(r, r.input_tokens - 1) if not r.block_ids else []
                start = len(cached) * BS if not r.block_ids else pos[i]
                end = min(start + k, r.input_tokens)
                outcomes.append((kv.try_allocate(r, start, end, cached), end))
            elif op == "append" and pos[i] >= r.input_tokens:
                outcomes.append((kv.append_token(r, pos[i]), pos[i] + 1))
            elif op == "release":
                kv.release(r)
                outcomes.append((True, 0))
            kv.check_invariants(rs)
        if outcomes:
            assert outcomes[0] == outcomes[1]
            if outcomes[0][0]:
                pos[i] = outcomes[0][1]
        lazy, eager = caches
        assert [r.block_ids for r in reqs[0]] == [r.block_ids for r in reqs[1]]
        assert free_list(lazy) == free_list(eager)
        assert (lazy.used_blocks, lazy.cache_hits, lazy.cache_misses) == (
            eager.used_blocks, eager.cache_hits, eager.cache_misses
        )  # fmt: skip
        if lazy._free_state_settled:
            for b in free_list(lazy):
                assert lazy._ref_count[b] == eager._ref_count[b] == 0
                assert lazy._free_pos[b] == eager._free_pos[b]
