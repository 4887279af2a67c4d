"""What the router knows of the instances' prefix caches (docs/behaviour.md §6.4, §7.3;
docs/cluster.md): a router-side LRU index of prompt block hashes, and (`CacheSignalView`, at
the end) the engines' own caches as a delayed KV-event feed reports them.

The prefix-affinity scorer keeps one per instance, the PD prefix-threshold decider one for the
cluster. Its rule, hash by hash: recording a hash refreshes it (it becomes the most recently
recorded) or inserts it, and whenever the index holds more than `capacity_blocks` hashes the
least recently recorded one goes. Reading never refreshes.

The router records a routed prompt's 30-odd hashes for every request, so the index records
them in bulk with the same outcome. It keeps the recordings ("runs": a prompt's hashes, in
order), oldest first, and maps each hash to the run that recorded it last; a hash refreshed
by a later run is stale in the earlier one and skipped when eviction reaches it. Whether a
record refreshed anything shows in the dict's size (it grew by fewer than the hashes
recorded), without a lookup per hash; a run recorded after the last refresh has no stale
entries, so eviction drops its oldest hashes without checking each. With prompts that share
nothing (the usual case) a record inserts its hashes and evicts an earlier run's, both in
bulk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.request import Request


def _delete_keys(table: dict, keys: Iterable) -> None:
    """del table[k] for every k, looping in C (a deque of length 0 consumes the iterator)."""
    deque(map(table.__delitem__, keys), maxlen=0)


class _Run:
    """The hashes of one recording, in order, and the index's refresh count after it; then
    `private` more that were recorded after them but are not stored (see `record`)."""

    __slots__ = ("hashes", "refreshes", "private")

    def __init__(self, hashes: list[int], refreshes: int, private: int = 0) -> None:
        self.hashes = hashes
        self.refreshes = refreshes
        self.private = private


class PrefixIndex:
    """An LRU set of block hashes holding at most `capacity_blocks`."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._run_of: dict[int, _Run] = {}  # every hash held -> the run that recorded it last
        self._runs: deque[_Run] = deque()  # oldest first
        self._front = 0  # hashes of the oldest run already evicted or skipped
        self._refreshes = 0  # hashes recorded while already held, ever
        # Stale entries in the runs; when they outnumber twice the capacity the runs are
        # rebuilt, so that refreshing without evicting (a prefix everyone shares) stays bounded.
        self._stale = 0
        self._private = 0  # private hashes held, counted but not stored

    def __len__(self) -> int:
        return len(self._run_of) + self._private

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._run_of

    def __iter__(self) -> Iterator[int]:
        """The stored hashes held (private ones are counted only), least recently recorded
        first."""
        for k, run in enumerate(self._runs):
            for h in run.hashes[self._front if k == 0 else 0 :]:
                if self._run_of.get(h) is run:
                    yield h

    def matched_blocks(self, hashes: Sequence[int]) -> int:
        """Leading hashes present (does not refresh them). See also `leading_matches`."""
        run_of = self._run_of
        count = 0
        for h in hashes:
            if h not in run_of:
                break
            count += 1
        return count

    def record(self, hashes: Sequence[int], private: int = 0) -> _Run | None:
        """Refresh or insert each hash in order, then evict the least recently recorded until
        the index fits: the same contents and order as recording them one at a time.

        `private` more hashes follow `hashes` that no index holds and no other prompt can
        have (a request's own content): they would only be inserted, and looked up by nobody
        until the same request is routed again, so only their number is kept. Before that
        happens the caller hands them over (`materialize`) with the returned run.
        """
        if not hashes and not private:
            return None
        run_of = self._run_of
        held = len(run_of)
        run = _Run(list(hashes), 0, private)
        run_of.update(zip(hashes, repeat(run)))
        # The index grew by fewer than the hashes: some were held (refreshed) or some repeat
        # within the recording. Only repeats (never in a prompt's chained hashes, so the check
        # is not paid for every record) change the run: a repeated hash is refreshed again at
        # its later position, so keep the last ones.
        if len(run_of) < held + len(hashes) and len(set(hashes)) < len(hashes):
            run.hashes = list(reversed(dict.fromkeys(reversed(hashes))))
        refreshed = held + len(run.hashes) - len(run_of)  # their entries elsewhere are stale now
        self._refreshes += refreshed
        self._stale += refreshed
        run.refreshes = self._refreshes
        self._runs.append(run)
        self._private += private
        excess = len(run_of) + self._private - self.capacity_blocks
        if excess > 0:
            self._evict(excess)
        if self._stale > 2 * self.capacity_blocks:
            self._rebuild()
        return run

    def materialize(self, run: _Run, private_hashes: Sequence[int]) -> None:
        """Store the private hashes `run` was recorded with (all of them, in order; those
        evicted since are left out): the index is then as if they had been stored."""
        if not run.private:
            return
        live = private_hashes[len(private_hashes) - run.private :]
        self._private -= run.private
        run.private = 0
        run.hashes.extend(live)
        self._run_of.update(zip(live, repeat(run)))

    def _evict(self, excess: int) -> None:
        """Drop the `excess` least recently recorded hashes."""
        run_of = self._run_of
        runs = self._runs
        start = self._front
        while excess > 0:
            run = runs[0]
            hashes = run.hashes
            if run.refreshes == self._refreshes:
                # Nothing was refreshed since this run was recorded, so nothing in it is stale:
                # its oldest hashes go as they are.
                stop = min(start + excess, len(hashes))
                _delete_keys(run_of, hashes[start:stop])
                excess -= stop - start
                start = stop
            else:
                while excess > 0 and start < len(hashes):
                    h = hashes[start]
                    start += 1
                    if run_of.get(h) is run:
                        del run_of[h]
                        excess -= 1
                    else:
                        self._stale -= 1
            if start == len(hashes) and excess > 0 and run.private:
                # The private hashes come last in their run.
                gone = min(excess, run.private)
                run.private -= gone
                self._private -= gone
                excess -= gone
            if start == len(hashes) and not run.private:
                runs.popleft()
                start = 0
        self._front = start

    def _rebuild(self) -> None:
        """Every run without its stale entries, in order (runs keep their identity: a
        caller may hold one to materialize)."""
        run_of = self._run_of
        kept: deque[_Run] = deque()
        for k, run in enumerate(self._runs):
            run.hashes = [
                h for h in run.hashes[self._front if k == 0 else 0 :] if run_of.get(h) is run
            ]
            run.refreshes = self._refreshes
            if run.hashes or run.private:
                kept.append(run)
        self._runs = kept
        self._front = 0
        self._stale = 0


def leading_matches(indexes: Sequence[PrefixIndex | None], hashes: Sequence[int]) -> list[int]:
    """`matched_blocks(hashes)` of each index, 0 for None: the router asks every candidate's
    index for every request, and most prompts are missing from most indexes at their first
    hash, so that is checked without a call."""
    if not hashes:
        return [0] * len(indexes)
    first = hashes[0]
    return [
        index.matched_blocks(hashes) if index is not None and first in index._run_of else 0
        for index in indexes
    ]


class CacheSignalView:
    """The instances' prefix caches as a router fed by KV-cache events sees them, `delay_us`
    late (BLIS-current's `--cache-signal-delay`); the `precise-prefix-cache` and `no-hit-lru`
    scorers and the PD `decode-cache` decider look up prompts here.

    Delay 0 reads every engine's live hash index (an oracle). With a delay D > 0 the view is a
    copy of every instance's index: all empty at t = 0, and re-taken together for every
    instance at the first lookup at least D after the last copy. So a lookup's view is always
    less than D old: a block cached (or evicted) at t is seen by every lookup from t + D on,
    and by earlier ones only if a copy was taken after t. A freed block that keeps its hash is
    still a hit, as in the engine.

    `hash_index(i)` returns instance i's index (block hash -> block, or any container of
    hashes); `clock()` the simulated time in µs.
    """

    def __init__(
        self,
        hash_index: Callable[[int], Mapping[int, int]],
        num_instances: int,
        block_size: int,
        delay_us: int,
        clock: Callable[[], int],
        serving: Callable[[int], bool] | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if delay_us < 0:
            raise ValueError(f"cache signal delay must be >= 0 µs, got {delay_us}")
        self.hash_index = hash_index
        self.num_instances = num_instances
        self.block_size = block_size
        self.delay_us = delay_us
        self.clock = clock
        # Whether instance i still serves: an ended one is never routed to again, so its copy
        # stays empty (a fleet that grows during the run keeps every instance it ever made).
        self.serving = serving
        self._copies: list[Mapping[int, int]] = [{} for _ in range(num_instances)]
        self.copied_us = 0
        self.copies_taken = 0

    def add_instance(self) -> None:
        """An instance made during the run: its copy is empty (so is its cache) until the
        next refresh copies it."""
        self.num_instances += 1
        self._copies.append({})

    def refresh(self, now_us: int) -> None:
        """Re-take every copy if `delay_us` has passed since the last (no-op for delay 0).
        `probe` calls it; a router may also call it whenever it builds its view of the
        instances, to copy exactly when BLIS does (at every admission and routing decision)."""
        if self.delay_us > 0 and now_us - self.copied_us >= self.delay_us:
            read, serving = self.hash_index, self.serving
            self._copies = [
                dict(read(i)) if serving is None or serving(i) else {}
                for i in range(self.num_instances)
            ]
            self.copied_us = now_us
            self.copies_taken += 1

    def _view(self, index: int) -> Mapping[int, int]:
        if self.delay_us > 0:
            self.refresh(self.clock())
            return self._copies[index]
        return self.hash_index(index)

    def cached_blocks(self, index: int, hashes: Sequence[int]) -> int:
        """Consecutive leading `hashes` present in instance `index`'s view."""
        return _leading_present(self._view(index), hashes)

    def probe(self, index: int, req: Request) -> int:
        """Leading full prompt blocks of `req` in instance `index`'s view: a scorer's
        `kv_probe`."""
        view = self._view(index)
        n = req.input_tokens // self.block_size
        if n < 1 or not view:
            return 0
        return _leading_present(view, req.block_hashes(n, self.block_size)[:n])


def _leading_present(view: Mapping[int, int], hashes: Sequence[int]) -> int:
    count = 0
    for h in hashes:
        if h not in view:
            break
        count += 1
    return count
