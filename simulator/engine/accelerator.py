"""The engine's exact accelerations, kept apart from the rules they accelerate (docs/engine.md
"Reference path and accelerations").

The reference is `simulator/engine/batching.py`: `VLLMEngine.plan_general_step` and
`finish_step` handle every running request one by one, and the instance's step loop
(`instance.py`) gives every step a SimPy event. This module makes that loop cheaper without
changing a result:

* `SteadyDecoders` (`EngineOptions.decode_fast_path`): decoding requests that need nothing but
  a counter's advance are a group, not a loop; an engine holds one as `VLLMEngine.steady`
  (None when the fast path is off).
* `finish_quiet_steps` (`EngineOptions.coalesce_steps`): an instance finishes steps that no one
  else can observe without an event each.

Neither states an engine rule of its own. It asks the reference: `VLLMEngine.tokens_to_end`
(when a decoding request's tokens end it: its output or the context limit), `_prefill_chunk`
(a prefill's chunk), `KVCache.append_token`'s block boundaries and block fills (restated in
`_demand` and `_wake`, pinned by tests/engine/test_rules.py) and `KVCache.defers_hash` (asked
by `_wake`, whose answer `wake_for_block` carries to `_take_block`, and by `unsteady_one`). A
change to what ends a request or what a step allocates or hashes is made in the reference;
this module follows it, and tests/engine/test_fast_paths.py checks that it did.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING

from ..invariants import check_step
from ..metrics.recorder import PACK_AFTER_ROWS
from .request import Request, RequestState

if TYPE_CHECKING:
    from .batching import VLLMEngine
    from .instance import Instance

_run_seq_of = attrgetter("run_seq")

# What a steady request's wake needs when it can stay steady (`Request.wake_for_block`, bits):
# a new KV block at a block start, and the hash of the block its token fills; 0: the reference
# loop must handle it. HASHES_FILLS marks a request whose full blocks are hashed at once
# (content a later request may look up; not deferred private content, `KVCache.defers_hash`),
# so that the commonest wake, a private request's block take, is WAKE_BLOCK alone (1) and
# the hot paths tell it apart with one comparison, literal 1 there for speed.
WAKE_BLOCK = 1
WAKE_HASH = 2
HASHES_FILLS = 4


class SteadyDecoders:
    """The decode fast path of one engine.

    Most of a busy batch is requests decoding one token per step in which nothing happens but
    counters moving: no KV block to take, no block to hash, no completion (a private block,
    whose hashing the KV cache defers, does not count: the count of full blocks is set when
    the request stops being steady, see `unsteady_one`). Such a *steady* request is not
    touched step by step: its computed and generated counts are exact as of step `sync_step`
    and advance by one per finished step; its `wake_step` (kept in a heap) is the next step at
    which it needs attention. A wake that only takes a KV block or hashes the block its token
    fills (`WAKE_BLOCK`, `WAKE_HASH`) is done here and the request stays steady; at any other
    the reference loop handles it like any other request until it is steady again. The
    step-time model gets the steady requests as aggregates (their count and the sum of their
    contexts, kept incrementally). A step takes the fast path only when nothing can differ
    from the reference loop: the token budget covers every running request's demand and the
    free KV blocks cover every allocation, so no request is cut short or preempted; otherwise
    every steady request is brought up to date and the step is the reference's.

    The state lives here; the engine's own state (queues, KV cache, step log, counters) stays
    on the engine and is read through it.
    """

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        # Never replaced on the engine, so bound here: one lookup less on the hot paths.
        self.kv = engine.kv
        self.context_limit = engine.context_limit
        config = engine.config
        self.block_size = config.block_size
        self.token_budget = config.max_num_scheduled_tokens
        # The step log of an engine with a CPU tier has columns the all-steady finish does
        # not write.
        self.has_cpu_tier = engine.kv.cpu is not None
        self.step_rows = engine.steps.tail  # the step log's unpacked rows (never replaced)
        # Steps finished so far: the clock steady requests' counters are kept against.
        self.finished_steps = 0
        self.count = 0
        # Sum over steady requests of (computed_tokens - sync_step): their context sum at a
        # step start is this plus count * finished_steps.
        self.context_offset = 0
        self.wake_heap: list[tuple[int, int, Request]] = []
        self.unsteady: list[Request] = []  # running requests handled one by one, in order
        # A steady request that just took a block at a block start is this many tokens from
        # the next one (0 with one-token blocks, where every step takes a block).
        self.steps_to_next_block = config.block_size - 1

    def context_sum(self) -> int:
        """The steady requests' context sum at the start of the next step."""
        return self.context_offset + self.count * self.finished_steps

    # ---------------------------------------------------------------- whole steady steps
    def plan_step(self, now_us: int) -> tuple[int, int] | None:
        """The plan when every running request is steady and nothing waits: one token each,
        plus the KV blocks of those reaching a block start. Returns the decode count and
        context sum the step-time model prices; None when the step needs the reference plan
        (something waits, a request is handled one by one or needs more than a block, or the
        budget or the blocks run short); nothing has changed then."""
        e = self.engine
        if e.waiting or self.unsteady:
            return None
        n = self.count
        if n > self.token_budget:
            return None
        step = self.finished_steps
        heap = self.wake_heap
        if heap and heap[0][0] <= step and not self._take_blocks(step, now_us):
            return None
        e.clock_us = now_us
        self.kv.now_us = now_us
        e.step_count += 1
        e._active = []
        e._step_start_us = now_us
        return n, self.context_offset + n * step

    def finish_and_plan(self, step_us: int, price: Callable[[int, int], int]) -> int:
        """`VLLMEngine.finish_step` for a step in which every request served was steady (none
        handled one by one, so none completes) on an engine without a CPU tier, then
        `plan_step` at its end, priced by `price(decode_count, decode_context_sum)`: the same
        counters, log row and plan, without the per-request loops, in one call, as most steps
        of a busy batch are such. Returns the planned step's duration; 0 when the step was
        finished and the next one needs the reference plan (nothing planned yet); -1 when the
        step was not all steady (nothing done: it needs `finish_step`)."""
        e = self.engine
        # A request that timed out during the step is counted in its row by `finish_step`.
        if e._active or not self.count or self.has_cpu_tier or e._left_served:
            return -1
        start = e._step_start_us
        end = start + step_us
        steady = self.count
        e.total_output_tokens += steady
        # finish_step's row (`VLLMEngine._log_step`), written out: most steps of a busy batch
        # end here, and a call per step is measurable per request (benchmarks/
        # instructions.py). tests/engine/test_rules.py pins this copy to it.
        # (No CPU tier here, so no CPU-tier columns; the regular gap is derived from the times.)
        waiting = e.waiting
        self.step_rows.append(
            (
                start,
                step_us,
                steady,
                0,
                steady,
                self.kv.used_blocks,
                len(waiting),
                len(e.running),
                e.preemption_count,
                steady,
            )
        )
        e._prev_step_end_us = end
        self.finished_steps = step = self.finished_steps + 1
        if self.unsteady:
            self.unsteady = []
        e.clock_us = end
        # plan_step(end), written out.
        if waiting or steady > self.token_budget:
            return 0
        heap = self.wake_heap
        if heap and heap[0][0] <= step and not self._take_blocks(step, end):
            return 0
        # (No `kv.now_us = end`: only a CPU tier reads the KV cache's clock, and `_take_blocks`
        # sets it for the blocks it takes.)
        e.step_count += 1
        e._step_start_us = end
        return price(steady, self.context_offset + steady * step)

    def _take_blocks(self, step: int, now_us: int) -> bool:
        """The steady requests due at `step` take their KV blocks (or hash the blocks their
        tokens fill), in running order, and stay steady. False, with nothing changed, when one
        of them needs more or the blocks run short."""
        heap = self.wake_heap
        kv = self.kv
        wakers = []
        blocks_only = True
        hashes_only = 0  # wakers that take no block
        while heap and heap[0][0] <= step:
            entry = heapq.heappop(heap)
            req = entry[2]
            if req.steady and req.wake_step == entry[0]:
                wakers.append(entry)
                need = req.wake_for_block
                if need != 1:  # not WAKE_BLOCK alone
                    if not need:
                        blocks_only = False
                    elif not need & WAKE_BLOCK:
                        hashes_only += 1
        blocks = len(wakers) - hashes_only
        if not blocks_only or blocks > kv.total_blocks - kv.used_blocks:
            for entry in wakers:
                heapq.heappush(heap, entry)
            return False
        kv.now_us = now_us
        for entry in wakers:
            self._take_block(entry[2], step)
        self.engine.steady_block_takes += blocks
        # Steady steps do not pack the step log; some steady request takes a block at least
        # every block_size steps, so checking here keeps its tails short.
        if len(self.step_rows) >= PACK_AFTER_ROWS:
            self.engine.steps.pack()
        return True

    # ---------------------------------------------------------------- within a reference step
    def one_by_one(self, budget: int) -> list[Request] | None:
        """The running requests the reference loop must handle this step, in running order,
        when the others can stay steady (each one token, nothing else); None when the whole
        step must be the reference's (see the class docstring)."""
        step = self.finished_steps
        heap = self.wake_heap
        active = self.unsteady
        woken = False
        block_wakers: list[Request] = []
        hashes_only = 0  # block_wakers that take no block
        while heap and heap[0][0] <= step:
            wake, _seq, req = heapq.heappop(heap)
            if req.steady and req.wake_step == wake:
                need = req.wake_for_block
                if need:
                    block_wakers.append(req)  # in running order: the heap breaks ties so
                    if need != 1 and not need & WAKE_BLOCK:
                        hashes_only += 1
                    continue
                self.unsteady_one(req)
                if not woken:
                    active = active[:]
                    woken = True
                active.append(req)
        if woken:
            active.sort(key=_run_seq_of)
        tokens, blocks, hashes = self._demand(active, budget)
        kv = self.kv
        free = kv.total_blocks - kv.used_blocks
        if block_wakers:
            takes = len(block_wakers) - hashes_only
            if not blocks and not hashes and tokens <= budget and takes <= free:
                # Nothing handled one by one takes or hashes a block this step, so the cache
                # ends the same as if the per-request loop had handed these blocks out and
                # hashed these blocks (in running order, as it would).
                for req in block_wakers:
                    self._take_block(req, step)
                free -= takes
                self.engine.steady_block_takes += takes
            else:
                for req in block_wakers:
                    self.unsteady_one(req)
                active = [*active, *block_wakers]
                active.sort(key=_run_seq_of)
                woken = True
                tokens, blocks, hashes = self._demand(active, budget)
        # Would the reference loop give every request its full demand without preempting?
        if tokens > budget or blocks > free:
            return None
        for req in active:
            req.num_new_tokens = 0
        return active if woken else active[:]

    def _demand(self, active: list[Request], budget: int) -> tuple[int, int, bool]:
        """Tokens this step's requests ask for (steady ones included), new KV blocks for the
        ones handled one by one, and whether any of those may hash a full block: what
        `VLLMEngine._schedule_running` would give them with budget and blocks to spare."""
        e = self.engine
        tokens = self.count
        blocks = 0
        hashes = False
        # The reference's decode skip (`_schedule_running`): no context room left.
        limit = self.context_limit
        bs = self.block_size
        prefill_chunk = e._prefill_chunk
        for req in active:
            if req.reload_pending:
                continue
            computed = req.computed_tokens
            if req.in_prefill:
                end = computed + prefill_chunk(req.prefill_target, computed, budget)
                tokens += end - computed
                needed = -(-end // bs) - len(req.block_ids)
                if needed > 0:
                    blocks += needed
                hashes = True
            elif computed < limit:
                tokens += 1
                # KVCache.append_token's boundaries: a new block at a block start, a hash
                # when the token fills a block.
                if computed % bs == 0 or not req.block_ids:
                    blocks += 1
                    if (computed + 1) % bs == 0:  # one-token blocks
                        hashes = True
                elif (computed + 1) % bs == 0:
                    hashes = True
        return tokens, blocks, hashes

    def after_step(self, active: list[Request]) -> None:
        """The reference's `finish_step` applied a step to `active`: each request that now
        decodes with nothing to do for a while becomes steady; the rest stay one by one."""
        self.finished_steps += 1
        unsteady = []
        wake = self._wake
        for req in active:
            if req.state is not RequestState.RUNNING:
                continue
            if req.num_new_tokens and not req.in_prefill and not req.reload_pending:
                wake_in, need = wake(req, req.computed_tokens, req.generated_tokens)
                if wake_in or need:
                    self._make_steady(req, wake_in, need)
                    continue
            unsteady.append(req)
        self.unsteady = unsteady

    # ---------------------------------------------------------------- one steady request
    def _wake(self, req: Request, computed: int, generated: int) -> tuple[int, int]:
        """Steps from the next one until `req` (at `computed` / `generated` tokens), decoding
        one token per step, needs attention: a KV block to take, the block its token fills to
        hash (unless its hashing is deferred: private content, `KVCache.defers_hash`; the count
        of full blocks is then set by `unsteady_one`), or the token that ends it (0 = at once).
        The second value says what the need is when it is only KV work (`WAKE_BLOCK`,
        `WAKE_HASH`, both with one-token blocks; with `HASHES_FILLS` for a request whose fills
        are hashed), 0 when the token ends the request: a request at a block start now
        (0, WAKE_BLOCK) waits for its block as a steady one."""
        bs = self.block_size
        steps = -computed % bs  # next position at a block start: a new block
        need = WAKE_BLOCK
        if not self.kv.defers_hash(req, computed // bs):
            # KVCache.append_token hashes the block the token at a block's last position fills.
            need = WAKE_BLOCK | HASHES_FILLS
            fill = (bs - 1 - computed) % bs
            if fill < steps:
                steps, need = fill, WAKE_HASH | HASHES_FILLS
            elif fill == steps:  # one-token blocks: each token takes a block and fills it
                need = WAKE_BLOCK | WAKE_HASH | HASHES_FILLS
        # The step whose token ends the request needs it; a need that falls on the same step
        # makes that step more than KV work.
        end_in = self.engine.tokens_to_end(computed, generated, req.output_tokens) - 1
        if end_in <= steps:
            return (end_in, 0) if end_in > 0 else (0, 0)
        return steps, need

    def _make_steady(self, req: Request, wake_in: int, need: int) -> None:
        """`need` as `_wake` gives it."""
        step = self.finished_steps
        req.steady = True
        req.sync_step = step
        req.wake_step = step + wake_in
        req.wake_for_block = need
        self.count += 1
        self.context_offset += req.computed_tokens - step
        heapq.heappush(self.wake_heap, (req.wake_step, req.run_seq, req))

    def _take_block(self, req: Request, step: int) -> None:
        """A steady request due for KV work only (`wake_for_block`) does it and stays steady:
        at a block start it gets its block, at a block's last position it hashes the block its
        token fills (`_fill_block`). Nothing else of it changes this step, so the reference
        loop has nothing to do for it."""
        if req.wake_for_block != 1:  # not a private request's block take (WAKE_BLOCK alone)
            self._fill_block(req, step)
            return
        self.kv.take_block(req)  # the caller checked the room
        behind = step - req.sync_step
        # After this step's token it is one further on: when does it need attention next?
        computed = req.computed_tokens + behind + 1
        generated = req.generated_tokens + behind + 1
        # Nearly always the next block start, a block from now: `_wake`'s answer when the token
        # that ends the request does not come first (the block just taken holds output alone,
        # and its fill is not woken for: the request's hashing is deferred). That test is
        # `VLLMEngine.tokens_to_end(computed, generated, output) - 1 > to_next_block`, written
        # out as it runs every block_size tokens of every request (a call here is measurable
        # per request); tests/engine/test_rules.py pins it to `_wake`.
        to_next_block = self.steps_to_next_block
        if (
            to_next_block
            and req.output_tokens - generated - 1 > to_next_block
            and self.context_limit - computed - 1 > to_next_block
        ):
            wake_in, need = to_next_block, WAKE_BLOCK
        else:
            wake_in, need = self._wake(req, computed, generated)
        req.wake_step = wake_step = step + 1 + wake_in
        req.wake_for_block = need
        heapq.heappush(self.wake_heap, (wake_step, req.run_seq, req))

    def _fill_block(self, req: Request, step: int) -> None:
        """`_take_block` for a request whose full blocks are hashed at once (`HASHES_FILLS`):
        a block to take at a block start, a block to hash when this step's token fills it
        (both with one-token blocks), as `KVCache.append_token` does for the token."""
        need = req.wake_for_block
        behind = step - req.sync_step
        if need & WAKE_BLOCK:
            self.kv.take_block(req)  # the caller checked the room
        if need & WAKE_HASH:
            self.kv.hash_filled_block(req, req.computed_tokens + behind + 1)
        computed = req.computed_tokens + behind + 1
        generated = req.generated_tokens + behind + 1
        # After a block start, nearly always the block's last position, a block less one
        # from now (`_wake`'s answer when the token that ends the request does not come first).
        to_next_block = self.steps_to_next_block
        if (
            need == WAKE_BLOCK | HASHES_FILLS
            and to_next_block
            and req.output_tokens - generated - 1 > to_next_block
            and self.context_limit - computed - 1 > to_next_block
        ):
            wake_in, need = to_next_block - 1, WAKE_HASH | HASHES_FILLS
        else:
            wake_in, need = self._wake(req, computed, generated)
        req.wake_step = wake_step = step + 1 + wake_in
        req.wake_for_block = need
        heapq.heappush(self.wake_heap, (wake_step, req.run_seq, req))

    def _sync(self, req: Request) -> None:
        behind = self.finished_steps - req.sync_step
        if behind:
            req.computed_tokens += behind
            req.generated_tokens += behind
            e = self.engine
            req.last_token_us = e._prev_step_end_us + req.generated_tokens * e.otp_us
            req.sync_step = self.finished_steps

    def unsteady_one(self, req: Request, in_step: int = 0) -> None:
        """Bring a steady request up to date and hand it back to the reference loop.

        `in_step` is 1 when a planned step holds the request's next token (a timeout or an
        eviction in the middle of a step), 0 between steps (planning): the reference loop
        takes a token's KV, and hashes a block it fills, when it plans the step."""
        self._sync(req)
        req.steady = False
        self.count -= 1
        self.context_offset -= req.computed_tokens - req.sync_step
        # The private blocks that filled while it was steady (`_wake` does not wake for them):
        # the count of deferred blocks is what filling them on the reference loop would have
        # set (`KVCache._hash_full_blocks`): its full blocks, when the last of them is deferred.
        full = (req.computed_tokens + in_step) // self.block_size
        if full and self.kv.defers_hash(req, full - 1):
            req.deferred_hash_blocks = full

    def unsteady_all(self, in_step: int = 0) -> None:
        if self.count:
            for req in self.engine.running:
                if req.steady:
                    self.unsteady_one(req, in_step)
        self.wake_heap.clear()

    def leave(self, req: Request) -> None:
        """`req` leaves the running batch in the middle of a step (its client timed out)."""
        if req.steady:
            self.unsteady_one(req, in_step=1)
        elif req in self.unsteady:
            self.unsteady.remove(req)

    def sync_all(self) -> None:
        """Bring every steady request's counters and last-token time up to date."""
        if self.count:
            for req in self.engine.running:
                if req.steady:
                    self._sync(req)

    def check_invariants(self) -> None:
        steady = [r for r in self.engine.running if r.steady]
        assert len(steady) == self.count
        assert sum(r.computed_tokens - r.sync_step for r in steady) == self.context_offset
        assert all(r.wake_step >= self.finished_steps for r in steady)


# -------------------------------------------------------------------- step coalescing
def finish_quiet_steps(instance: Instance, end_us: int, step_us: int) -> tuple[int, int]:
    """Finish quiet steps at once, without a SimPy event each, for as long as the planned
    step's end comes strictly before every other scheduled event (`env.peek()`). A step is
    quiet when it completes no request and nothing waits at this instance, so all it does is
    end and let the next one be planned (`_can_finish_quietly`).

    Nothing can happen before such a step ends (every other event is later, and only events
    schedule events), and nothing outside this instance sees what it does, so finishing it
    here gives the same steps (times, log rows) and request timestamps as waiting for its
    event. Returns the end and duration of the first step that needs its event."""
    peek = instance.env.peek
    engine = instance.engine
    while end_us < peek() and _can_finish_quietly(engine):
        end_us, step_us = _finish_quiet_step(instance, end_us, step_us)
    return end_us, step_us


def _can_finish_quietly(engine: VLLMEngine) -> bool:
    """Does the step in flight (or planned) complete nothing, with nothing waiting?

    No completion means the work left after the step is the work there is now. A plan may
    also drop a queued request that can never fit (reported as finished at that instant), so
    steps only run ahead while nothing waits."""
    # With nothing waiting, there is work iff something runs; a step of steady requests
    # alone (none handled one by one, `_active` empty) cannot complete any.
    return (
        bool(engine.running)
        and not engine.waiting
        and not (engine._active and may_finish_requests(engine))
    )


def may_finish_requests(engine: VLLMEngine) -> bool:
    """Could the planned step complete a request? (False is certain; True may not be.) The
    reference's `finish_step` ends a request whose tokens end it (`tokens_to_end`), or whose
    prefill completes with no output to produce."""
    tokens_to_end = engine.tokens_to_end
    for req in engine._active:
        n = req.num_new_tokens
        if not n:
            continue
        after = req.computed_tokens + n
        if req.in_prefill:
            if after < req.prefill_target:
                continue
            if req.output_tokens == 0:
                return True
            produced = 1  # the prefill's last chunk yields the first token
        else:
            produced = n  # a decode yields one token; a verification of n - 1 drafts at most n
        if tokens_to_end(after, req.generated_tokens + produced, req.output_tokens) <= 0:
            return True
    return False


def _finish_quiet_step(instance: Instance, end_us: int, step_us: int) -> tuple[int, int]:
    """Finish the quiet step ending at `end_us` and plan the next: its end and duration.

    Most such steps only advance steady decoders, and the next one does the same: those take
    the all-steady paths and the model's decode-only step time."""
    engine = instance.engine
    steady = engine.steady
    decode_step_time = instance._decode_step_time
    engine.steps_coalesced += 1
    next_step_us = steady.finish_and_plan(step_us, decode_step_time) if steady is not None else -1
    if next_step_us < 0:
        finished = engine.finish_step(step_us)
        assert not finished, "a coalesced step completed a request"
    if instance.check_invariants:
        check_step(engine, instance.instance_id, end_us)
    if next_step_us > 0:
        return end_us + next_step_us, next_step_us
    plan = steady.plan_step(end_us) if steady is not None and next_step_us < 0 else None
    if plan is not None:
        step_us = decode_step_time(plan[0], plan[1])  # not *plan: a slower call
        return end_us + step_us, step_us
    batch = engine.plan_general_step(end_us)
    assert not engine.new_reloads
    step_us = instance.step_model.step_time_us(batch) + batch.extra_us
    return end_us + step_us, step_us
