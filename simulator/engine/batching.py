"""vLLM continuous batching for one instance (docs/behaviour.md §1.3–1.5, §1.8, §A2–A3).

`VLLMEngine` owns the wait queue, the running batch and the KV cache. It has no notion of
SimPy: the instance process calls `enqueue`, `plan_step` (at a step's start), and
`finish_step` (at its end), and the engine answers with plain values. That split keeps the
scheduling rules testable with nothing but integers.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from operator import attrgetter

from ..latency.base import StepBatch
from ..limits import MAX_TIME_US, duration_us
from ..metrics.recorder import PACK_AFTER_ROWS, StepLog
from .formation import make_batch_formation
from .kv_cache import KVCache
from .kv_tiers import CPUTier
from .lora import LoRAConfig, LoRAState
from .options import ACCELERATED, EngineOptions
from .policies import make_priority_policy, make_scheduler
from .preemption import make_preemption_policy
from .request import Request, RequestState
from .speculative import Speculation, SpeculativeConfig

_run_seq_of = attrgetter("run_seq")


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of one vLLM instance, named as BLIS's flags (docs/behaviour.md §12.1)."""

    total_kv_blocks: int = 1_000_000
    block_size: int = 16
    max_num_running_reqs: int = 256
    max_num_scheduled_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    max_model_len: int = 0
    scheduler: str = "fcfs"
    priority_policy: str = "constant"
    preemption_policy: str = "fcfs"
    # How a step is formed (engine/formation.py): chunked (vLLM V1), whole-prompt, prefill-first.
    batch_formation: str = "chunked"
    enable_prefix_caching: bool = True
    # Tiered KV (docs/behaviour.md §2.4): a CPU tier of this many blocks behind the GPU cache (0 =
    # off).
    kv_cpu_blocks: int = 0
    kv_offload_policy: str = "evict"
    # Reload cost of one block from the CPU tier, per GPU: bytes over the host link.
    kv_bytes_per_block: float = 0.0
    kv_transfer_bandwidth_gb_per_s: float = 50.0
    kv_transfer_base_latency_us: int = 0
    # BLIS's behaviour: the reload is added to the step that needs it, holding up the batch.
    kv_reload_blocking: bool = False
    # Speculative decoding (docs/speculative.md); None = off.
    speculative: SpeculativeConfig | None = None
    # Multi-LoRA serving (docs/lora.md); None = off (adapters named by requests are ignored).
    lora: LoRAConfig | None = None

    def reload_us(self, blocks: int) -> int:
        """Time to bring `blocks` back from the CPU tier over an idle host link; a reload that
        the clock cannot hold is a ConfigError naming the host link's settings."""
        size_bytes = blocks * self.kv_bytes_per_block
        duration = self.kv_transfer_base_latency_us + -(
            -size_bytes // (self.kv_transfer_bandwidth_gb_per_s * 1e3)
        )
        if not duration <= MAX_TIME_US:  # once per reload, never per step
            duration_us(
                duration,
                f"engine.kv_transfer_bandwidth_gb_per_s ({self.kv_transfer_bandwidth_gb_per_s:g} "
                f"GB/s) and engine.kv_transfer_base_latency_us "
                f"({self.kv_transfer_base_latency_us}): a CPU-tier reload of {blocks} blocks",
            )
        return duration


class EnqueueOutcome(StrEnum):
    QUEUED = "queued"
    DROPPED = "dropped_unservable"
    TIMED_OUT = "timed_out"
    IGNORED = "ignored"
    COMPLETED = "completed"  # a decode sub-request with nothing left to generate


class VLLMEngine:
    """Wait queue + running batch + KV cache of one instance.

    Decode fast path. Most of a busy batch is requests decoding one token per step in which
    nothing happens but counters moving: no KV block to take, no prompt block to hash, no
    completion (a private prompt block, whose hashing the KV cache defers, does not count: its
    fill is applied when the request stops being steady, see `_unsteady_one`). Such a
    *steady* request is not touched step by step: its computed and generated counts are exact
    as of step `sync_step` and advance by one per finished step; its
    `wake_step` (kept in a heap) is the next step at which it needs individual attention, and
    from then on it is handled like any other request until it is steady again. The step-time
    model gets the steady requests as aggregates (their count and the sum of their contexts,
    kept incrementally). A step takes the fast path only when nothing can differ from handling
    every request: the token budget covers every running request's demand and the free KV
    blocks cover every allocation, so no request is cut short or preempted; otherwise every
    steady request is brought up to date and the step runs the plain per-request loop.
    `sync_lazy_progress()` brings every request up to date (for readers outside the engine).
    """

    def __init__(
        self,
        config: EngineConfig,
        output_token_processing_us: int = 0,
        post_decode_overhead_us: int = 0,
        options: EngineOptions = ACCELERATED,
    ) -> None:
        self.config = config
        cpu = CPUTier(config.kv_cpu_blocks) if config.kv_cpu_blocks > 0 else None
        self.kv = KVCache(
            config.total_kv_blocks,
            config.block_size,
            cpu,
            config.kv_offload_policy,
            options.defer_private_hashes,
        )
        # Reloads started by the last plan_step, for the instance's host link to carry.
        self.new_reloads: list[tuple[Request, float]] = []
        # Times the instance idled with work because every runnable request awaited a reload.
        self.reload_idle_us: list[int] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.scheduler = make_scheduler(config.scheduler)
        self.preemption = make_preemption_policy(config.preemption_policy)
        self.formation = formation = make_batch_formation(config.batch_formation)
        # Read per step: a policy that forms steps its own way, and one admitting only whole
        # prompts (engine/formation.py).
        self._own_formation = not formation.running_first
        self._whole_prompts = not formation.chunks_prompts
        self.priority_policy = make_priority_policy(config.priority_policy)
        self.otp_us = output_token_processing_us
        # Fixed per-request cost after the last token (trained-roofline's alpha1): it delays
        # the completion the client sees, never the GPU.
        self.post_decode_us = post_decode_overhead_us
        self.steps = StepLog(cpu is not None, output_token_processing_us)
        self.irregular_itl_us = array("d")  # fractional only with blocking reloads
        # Completed requests, kept only with `keep_completed` (a cluster that compacts finished
        # requests into rows turns it off, so the engine does not hold them all alive).
        self.completed: list[Request] = []
        self.keep_completed = True
        self.completed_count = 0
        self.step_count = 0
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.preemption_count = 0
        self.dropped_unservable = 0
        # Requests plan_step found unservable (e.g. a preempted request whose prompt plus
        # output outgrew the whole cache); the instance reports them as finished.
        self.dropped_while_planning: list[Request] = []
        self.timed_out = 0
        self.length_capped = 0
        self.kv_allocation_failures = 0
        self.clock_us = 0
        self._step_start_us = 0
        self._prev_step_end_us = -1
        # Speculative decoding: drafts per decoding request, their KV, acceptance draws.
        spec = config.speculative
        self.speculation = Speculation(spec) if spec is not None else None
        self._planned_draft_us = 0
        # LoRA adapters: GPU slots, CPU cache, per-adapter statistics.
        self.lora = LoRAState(config.lora) if config.lora is not None else None
        # Decode fast path state (see the class docstring). A speculating request's step is
        # a random number of tokens, never a counter's advance by one, and a LoRA step is
        # priced by the tokens of each adapter: both take the per-request loop every step;
        # so does a batch formation that lets running requests wait (formation.py).
        self.fast_path = (
            options.decode_fast_path
            and spec is None
            and self.lora is None
            and formation.supports_decode_fast_path
        )
        self._finished_steps = 0
        self.fast_path_steps = 0
        self.steady_block_takes = 0  # KV blocks handed to steady requests without waking them
        # Steps finished without a SimPy event of their own (the instance's step coalescing).
        self.steps_coalesced = 0
        self._steady_count = 0
        # Sum over steady requests of (computed_tokens - sync_step): their context sum at a
        # step start is this plus steady_count * finished steps.
        self._steady_context_offset = 0
        self._wake_heap: list[tuple[int, int, Request]] = []
        self._unsteady: list[Request] = []  # running requests handled one by one, in order
        self._active: list[Request] = []  # this step's one-by-one requests, in running order
        self._run_seq = 0
        # A steady request that just took a block at a block start is this many tokens from
        # the next one (0 with one-token blocks, where every step takes a block).
        self._steps_to_next_block = config.block_size - 1
        self._has_cpu_tier = cpu is not None

    def seed_speculation(self, rng) -> None:
        """The stream this instance's acceptance draws come from (one per instance)."""
        if self.speculation is not None:
            self.speculation.seed(rng)

    # ------------------------------------------------------------------ queries
    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ admission
    def enqueue(self, req: Request, now_us: int) -> EnqueueOutcome:
        """Admit `req` into the wait queue, applying BLIS's guards in order (docs/behaviour.md
        §1.3)."""
        if req.state is RequestState.TIMED_OUT:
            return EnqueueOutcome.IGNORED
        self.clock_us = now_us
        cfg = self.config
        mml = cfg.max_model_len
        if req.max_output_tokens == 0 and mml > 0 and req.input_tokens < mml:
            req.max_output_tokens = mml - req.input_tokens
        # vLLM refuses an empty prompt (there is no token to compute the first output from).
        unservable = (
            req.max_output_tokens < 0
            or req.input_tokens <= 0
            or -(-req.input_tokens // cfg.block_size) > cfg.total_kv_blocks
        )
        if mml > 0 and (
            req.input_tokens >= mml
            or (req.max_output_tokens > 0 and req.input_tokens + req.max_output_tokens > mml)
        ):
            unservable = True
        lora = self.lora
        if lora is not None and req.adapter:
            # vLLM answers a request for an adapter it was not started with by an error.
            if not lora.knows(req.adapter):
                unservable = True
            else:
                lora.adapter_stats(req.adapter).requests += 1
        if unservable:
            self._drop(req, now_us)
            return EnqueueOutcome.DROPPED
        self.total_input_tokens += req.input_tokens
        req.enqueue_us = now_us
        if self._past_deadline(req, now_us):
            return EnqueueOutcome.TIMED_OUT
        req.state = RequestState.QUEUED
        self.waiting.append(req)
        return EnqueueOutcome.QUEUED

    def _past_deadline(self, req: Request, now_us: int) -> bool:
        """A request whose client already gave up is timed out on arrival (docs/behaviour.md §1.3
        step 7)."""
        if 0 < req.deadline_us <= now_us:
            req.state = RequestState.TIMED_OUT
            req.completion_us = now_us
            self.timed_out += 1
            return True
        return False

    def enqueue_resident(self, req: Request, now_us: int) -> EnqueueOutcome:
        """Enqueue a decode sub-request whose prompt KV arrives by transfer (docs/behaviour.md §7.2
        step 5): the prompt's blocks are allocated now (reusing any cached prefix), there is no
        queueing delay and its input tokens are not counted again. No room → DROPPED (the cluster
        counts it as dropped at decode KV)."""
        self.clock_us = now_us
        req.enqueue_us = now_us
        if self._past_deadline(req, now_us):
            return EnqueueOutcome.TIMED_OUT
        if req.output_tokens == 0:
            # The prefill was the whole request: done on arrival, no token, no KV needed.
            req.state = RequestState.COMPLETED
            req.first_token_us = req.last_token_us = req.completion_us = now_us
            req.in_prefill = False
            self.completed_count += 1
            if self.keep_completed:
                self.completed.append(req)
            return EnqueueOutcome.COMPLETED
        prompt = req.input_tokens
        cached = (
            self.kv.cached_prefix_blocks(req, prompt) if self.config.enable_prefix_caching else []
        )
        if prompt == 0 or not self.kv.try_allocate(
            req, len(cached) * self.kv.block_size, prompt, cached
        ):
            req.state = RequestState.DROPPED
            req.completion_us = now_us
            return EnqueueOutcome.DROPPED
        req.cached_tokens = len(cached) * self.kv.block_size
        req.computed_tokens = prompt
        req.prefill_target = prompt
        req.in_prefill = False
        req.state = RequestState.QUEUED
        self.waiting.append(req)
        return EnqueueOutcome.QUEUED

    def cancel(self, req: Request, now_us: int) -> bool:
        """Client timeout at the deadline (docs/behaviour.md §1.8). Returns True if the request was
        live."""
        if req.state is RequestState.QUEUED:
            self.waiting.remove(req)
            if req.block_ids:
                self.kv.release(req)
        elif req.state is RequestState.RUNNING:
            if req.steady:
                self._unsteady_one(req, in_step=1)
            elif req in self._unsteady:
                self._unsteady.remove(req)
            self.running.remove(req)
            self.kv.release(req)
        else:
            return False
        self.clock_us = now_us
        req.state = RequestState.TIMED_OUT
        req.completion_us = now_us
        req.num_new_tokens = 0
        _retire(req)
        self.timed_out += 1
        return True

    def evict_all(self) -> list[Request]:
        """Remove every queued and running request, freeing their KV blocks (the instance is
        going away). The caller settles each request's fate."""
        self._unsteady_all(in_step=1)  # exact token counts for every running request first
        evicted = [*self.running, *self.waiting]
        for req in evicted:
            if req.block_ids:
                self.kv.release(req)
            req.num_new_tokens = 0
        self.running = []
        self.waiting = deque()
        self._active = []
        self._unsteady = []
        return evicted

    def prefill_requests(self) -> list[Request]:
        """The requests of the planned step's prefill chunks, in `StepBatch.prefill_chunks`
        order (steady requests only decode, so they are never among them; a speculative
        verification, more than one token of a decoding request, is a chunk too)."""
        return [
            r for r in self._active if r.num_new_tokens and (r.in_prefill or r.num_new_tokens > 1)
        ]

    def take_unstarted(self) -> list[Request]:
        """Remove the queued requests that were never scheduled (a redirecting drain)."""
        keep: deque[Request] = deque()
        taken: list[Request] = []
        for req in self.waiting:
            if req.first_schedule_us < 0 and not req.block_ids:
                taken.append(req)
            else:
                keep.append(req)
        self.waiting = keep
        return taken

    def forget(self, req: Request) -> None:
        """`req` leaves to be served from scratch elsewhere: its tokens are counted there."""
        if req.enqueue_us >= 0:
            self.total_input_tokens -= req.input_tokens
        self.total_output_tokens -= req.generated_tokens

    # ------------------------------------------------------------------ one step
    def plan_step(self, now_us: int) -> StepBatch | None:
        """Form the batch for a step starting at `now_us` (docs/behaviour.md §1.4 phase A, §1.5)."""
        if not self.running and not self.waiting:
            return None
        steady = self.plan_steady_step(now_us)
        if steady is not None:
            return StepBatch([], steady[0], steady[1], [], 0)
        return self.plan_general_step(now_us)

    def plan_general_step(self, now_us: int) -> StepBatch:
        """`plan_step` once the all-steady plan is ruled out (there is work)."""
        self.clock_us = now_us
        self.kv.now_us = now_us
        self.step_count += 1
        cfg = self.config
        step_extra_us = 0
        if not self.priority_policy.is_constant or not self.scheduler.keeps_order:
            self._reorder_waiting(now_us)

        budget = cfg.max_num_scheduled_tokens
        active = self._fast_path_requests(budget) if self.fast_path else None
        if active is None:
            # The plain loop over every running request (it may preempt).
            self._unsteady_all()
            active = self.running
            for req in active:
                req.num_new_tokens = 0
            if self._own_formation:
                # A batch formation that orders the step its own way (formation.py).
                step_extra_us = self.formation.plan(self, budget, now_us)
            else:
                budget, preempted = self._schedule_running(active, budget)
                if not preempted:
                    step_extra_us = self._admit_waiting(active, budget, now_us)
        else:
            # Steady requests take one token each; nothing else of theirs changes.
            self.fast_path_steps += 1
            budget, preempted = self._schedule_running(active, budget - self._steady_count)
            assert not preempted, "the fast path admitted a step that preempts"
            step_extra_us = self._admit_waiting(active, budget, now_us)
        self._active = active
        self._unsteady = active[:]

        # The batch the step-time model prices: only requests that got tokens this step.
        prefill_chunks: list[tuple[int, int]] = []
        prefill_prompts: list[int] = []
        decode_count = self._steady_count
        decode_context = self._steady_context_offset + decode_count * self._finished_steps
        verifying = verify_context = 0
        lora_tokens: dict[str, int] | None = {} if self.lora is not None else None
        for req in active:
            n = req.num_new_tokens
            if n:
                if lora_tokens is not None and req.adapter:
                    lora_tokens[req.adapter] = lora_tokens.get(req.adapter, 0) + n
                if req.in_prefill:
                    prefill_chunks.append((req.computed_tokens, n))
                    prefill_prompts.append(req.prefill_target)
                elif n > 1:
                    # A verification: the sampled token and k drafts are n query tokens over
                    # the request's context, one chunk of the forward pass (as vLLM runs it),
                    # so every step-time model prices it as it prices a prefill chunk.
                    prefill_chunks.append((req.computed_tokens, n))
                    prefill_prompts.append(req.computed_tokens + n)
                    verifying += 1
                    verify_context += req.computed_tokens
                else:
                    decode_count += 1
                    decode_context += req.computed_tokens
        if verifying:
            # The drafter proposes the next drafts of the requests it verifies, in this step.
            self._planned_draft_us = self.speculation.draft_us(verifying, verify_context)
            step_extra_us += self._planned_draft_us
        if lora_tokens:
            # The step's adapters are loaded into GPU slots inside the step (vLLM activates
            # them in the model runner), then run as the LoRA kernels.
            step_extra_us += self.lora.activate(lora_tokens)
        self._step_start_us = now_us
        return StepBatch(
            prefill_chunks, decode_count, decode_context, prefill_prompts, step_extra_us
        )

    def _admit_waiting(self, active: list[Request], budget: int, now_us: int) -> int:
        """Phase 2: admit from the head of the wait queue while the batch has room and budget
        remains (no skipping: head-of-line blocking). Admitted requests join `active` when it
        is not the running list itself. Returns time to add to the step (a blocking CPU-tier
        reload), in µs."""
        waiting = self.waiting
        if not waiting:
            return 0
        cfg = self.config
        kv = self.kv
        running = self.running
        max_running = cfg.max_num_running_reqs
        bs = cfg.block_size
        caching = cfg.enable_prefix_caching
        admitted_from = len(running)
        whole_prompts = self._whole_prompts
        step_extra_us = 0
        lora = self.lora
        if lora is not None:
            # Adapters of the running batch: a batch holds at most max_loras of them.
            adapters = {r.adapter for r in running if r.adapter}
            max_loras = lora.config.max_loras
            skipped: list[Request] = []
        while waiting and budget > 0 and len(running) < max_running:
            req = waiting[0]
            if (
                lora is not None
                and req.adapter
                and req.adapter not in adapters
                and len(adapters) >= max_loras
            ):
                # As vLLM: skipped for this step, requests behind it may still run.
                skipped.append(waiting.popleft())
                continue
            if req.kv_resident:
                # Decode sub-request: its prompt KV is here; it needs one token's worth.
                if not kv.append_token(req, req.computed_tokens):
                    if not running and self._reclaim_queued_kv(req, now_us):
                        continue
                    break
                self._admit_head(req, 1, now_us)
                if lora is not None and req.adapter:
                    adapters.add(req.adapter)
                budget -= 1
                continue
            target = req.prefill_target
            # After this prefill, a request with 2+ tokens still to produce needs KV for one
            # more token; if even the whole cache cannot hold that, it can never progress.
            decode_needs = 1 if req.output_tokens - req.generated_tokens >= 2 else 0
            if -(-(target + decode_needs) // bs) > kv.total_blocks:
                waiting.popleft()
                self._drop(req, now_us)
                self.dropped_while_planning.append(req)
                continue
            cached = kv.cached_prefix_blocks(req, target - 1) if caching else []
            reload = kv.cpu_prefix_blocks(req, len(cached), target - 1) if caching else 0
            gpu_start = len(cached) * bs
            start = gpu_start + reload * bs
            chunk = self._prefill_chunk(target, start, budget)
            if whole_prompts and chunk < target - start and running:
                # A prompt joins only whole; one no step could hold whole waits for an empty
                # batch, where the budget is whole, and is then prefilled in chunks.
                break
            if not kv.try_allocate(req, gpu_start, start + chunk, cached):
                if not running and self._reclaim_queued_kv(req, now_us):
                    continue
                break
            self._admit_head(req, chunk, now_us)
            if lora is not None and req.adapter:
                adapters.add(req.adapter)
            req.computed_tokens = start
            if start > req.cached_tokens:
                req.cached_tokens = start
            if reload:
                step_extra_us += self._reload(req, len(cached), reload, now_us)
                if req.reload_pending:
                    req.num_new_tokens = 0
                    continue
            budget -= chunk
        if lora is not None and skipped:
            waiting.extendleft(reversed(skipped))
        if active is not running and len(running) > admitted_from:
            active.extend(running[admitted_from:])
        return step_extra_us

    def plan_steady_step(self, now_us: int) -> tuple[int, int] | None:
        """The plan when every running request is steady and nothing waits: one token each,
        plus the KV blocks of those reaching a block start. Returns the decode count and
        context sum the step-time model prices; None when the step needs the general plan
        (something waits, a request is handled one by one or needs more than a block, or the
        budget or the blocks run short); nothing has changed then."""
        if self.waiting or self._unsteady or not self.fast_path:
            return None
        n = self._steady_count
        if n > self.config.max_num_scheduled_tokens:
            return None
        step = self._finished_steps
        heap = self._wake_heap
        if heap and heap[0][0] <= step and not self._take_steady_blocks(step, now_us):
            return None
        self.clock_us = now_us
        self.kv.now_us = now_us
        self.step_count += 1
        self.fast_path_steps += 1
        self._active = []
        self._step_start_us = now_us
        return n, self._steady_context_offset + n * step

    def _take_steady_blocks(self, step: int, now_us: int) -> bool:
        """The steady requests due at `step` take their KV blocks and stay steady. False, with
        nothing changed, when one of them needs more than a block or the blocks run short."""
        heap = self._wake_heap
        kv = self.kv
        wakers = []
        blocks_only = True
        while heap and heap[0][0] <= step:
            entry = heapq.heappop(heap)
            req = entry[2]
            if req.steady and req.wake_step == entry[0]:
                wakers.append(entry)
                if not req.wake_for_block:
                    blocks_only = False
        if not blocks_only or len(wakers) > kv.total_blocks - kv.used_blocks:
            for entry in wakers:
                heapq.heappush(heap, entry)
            return False
        kv.now_us = now_us
        for entry in wakers:
            self._take_block_steady(entry[2], step)
        self.steady_block_takes += len(wakers)
        # Steady steps do not pack the step log; some steady request takes a block at least
        # every block_size steps, so checking here keeps its tails short.
        if len(self.steps.tail_start_us) >= PACK_AFTER_ROWS:
            self.steps.pack()
        return True

    def _schedule_running(
        self, order: list[Request], budget: int, prefills_only: bool = False
    ) -> tuple[int, bool]:
        """Phase 1: tokens for running requests in `order` (admission order), within `budget`;
        with `prefills_only`, chunks for those still in prefill alone (decoders wait).

        Returns the budget left and whether a request was preempted for KV room."""
        mml = self.config.max_model_len
        kv = self.kv
        block_size = self.config.block_size
        spec = self.speculation
        preempted = False
        i = 0
        while i < len(order):
            if budget <= 0:
                break
            req = order[i]
            if req.reload_pending:  # its prefix is still on the way from the CPU tier
                i += 1
                continue
            computed = req.computed_tokens
            if req.in_prefill:
                chunk = self._prefill_chunk(req.prefill_target, computed, budget)
                while not kv.try_allocate(req, computed, computed + chunk, []):
                    preempted = True
                    served_itself, i, budget = self._preempt(req, i, budget)
                    if served_itself:
                        break
                if req.state is not RequestState.RUNNING:
                    break
            else:
                if prefills_only or (mml > 0 and computed + 1 > mml - 1):
                    i += 1
                    continue
                if spec is not None:
                    # The sampled token and the drafts, with KV for both and for the
                    # drafter's next proposals (vLLM's lookahead), up to the context limit.
                    chunk = 1 + spec.proposals(budget, computed, mml)
                    end = computed + chunk + spec.lookahead
                    if mml > 0 and end > mml:
                        end = mml
                    # Drafts never ask for more than the whole cache, so a request that fits
                    # without them fits with them once alone (one that does not, fails as a
                    # plain decode does: preempted, then dropped as unservable).
                    room = kv.total_blocks * block_size
                    if end > room:
                        end = max(room, computed + 1)
                        chunk = max(1, min(chunk, end - computed))
                    while not kv.try_allocate(req, computed, end, []):
                        preempted = True
                        served_itself, i, budget = self._preempt(req, i, budget)
                        if served_itself:
                            break
                    if req.state is not RequestState.RUNNING:
                        break
                    req.num_new_tokens = chunk
                    budget -= chunk
                    i += 1
                    continue
                chunk = 1
                # Most decode tokens land inside a block that is neither new nor completed:
                # no KV work at all, so skip the call.
                pos_in_block = computed % block_size
                if 0 < pos_in_block < block_size - 1:
                    req.num_new_tokens = 1
                    budget -= 1
                    i += 1
                    continue
                ok = kv.append_token(req, computed)
                while not ok:
                    preempted = True
                    served_itself, i, budget = self._preempt(req, i, budget)
                    if served_itself:
                        break
                    ok = kv.append_token(req, computed)
                if not ok:
                    break
            req.num_new_tokens = chunk
            budget -= chunk
            i += 1
        return budget, preempted

    # ------------------------------------------------------------------ decode fast path
    def _fast_path_requests(self, budget: int) -> list[Request] | None:
        """The running requests to handle one by one this step, in running order, when the
        step can take the fast path; None when it cannot (see the class docstring)."""
        step = self._finished_steps
        heap = self._wake_heap
        active = self._unsteady
        woken = False
        block_wakers: list[Request] = []
        while heap and heap[0][0] <= step:
            wake, _seq, req = heapq.heappop(heap)
            if req.steady and req.wake_step == wake:
                if req.wake_for_block:
                    block_wakers.append(req)  # in running order: the heap breaks ties so
                    continue
                self._unsteady_one(req)
                if not woken:
                    active = active[:]
                    woken = True
                active.append(req)
        if woken:
            active.sort(key=_run_seq_of)
        tokens, blocks, hashes = self._demand(active, budget)
        free = self.kv.total_blocks - self.kv.used_blocks
        if block_wakers:
            if not blocks and not hashes and tokens <= budget and len(block_wakers) <= free:
                # Nothing handled one by one takes or hashes a block this step, so the cache
                # ends the same as if the per-request loop had handed these blocks out.
                for req in block_wakers:
                    self._take_block_steady(req, step)
                free -= len(block_wakers)
                self.steady_block_takes += len(block_wakers)
            else:
                for req in block_wakers:
                    self._unsteady_one(req)
                active = [*active, *block_wakers]
                active.sort(key=_run_seq_of)
                woken = True
                tokens, blocks, hashes = self._demand(active, budget)
        # Would the plain loop give every request its full demand without preempting?
        if tokens > budget or blocks > free:
            return None
        for req in active:
            req.num_new_tokens = 0
        return active if woken else active[:]

    def _demand(self, active: list[Request], budget: int) -> tuple[int, int, bool]:
        """Tokens this step's requests ask for (steady ones included), new KV blocks for the
        ones handled one by one, and whether any of those may hash a full block."""
        tokens = self._steady_count
        blocks = 0
        hashes = False
        mml = self.config.max_model_len
        bs = self.config.block_size
        for req in active:
            if req.reload_pending:
                continue
            computed = req.computed_tokens
            if req.in_prefill:
                end = computed + self._prefill_chunk(req.prefill_target, computed, budget)
                tokens += end - computed
                needed = -(-end // bs) - len(req.block_ids)
                if needed > 0:
                    blocks += needed
                hashes = True
            elif not (mml > 0 and computed + 1 > mml - 1):
                tokens += 1
                if computed % bs == 0 or not req.block_ids:
                    blocks += 1
                elif (computed + 1) % bs == 0:
                    hashes = True  # possibly: the block holding prompt tokens fills up
        return tokens, blocks, hashes

    def may_finish_requests(self) -> bool:
        """Could the planned step complete a request? (False is certain; True may not be.)"""
        mml = self.config.max_model_len
        for req in self._active:
            n = req.num_new_tokens
            if not n:
                continue
            if req.in_prefill:
                after = req.computed_tokens + n
                if after < req.prefill_target:
                    continue
                if req.output_tokens == 0:
                    return True
            else:
                # A decode yields one token; a verification of n - 1 drafts at most n.
                after = req.computed_tokens + n
                if req.generated_tokens + n >= req.output_tokens:
                    return True
            if req.generated_tokens + 1 >= req.output_tokens or (mml > 0 and after >= mml - 1):
                return True
        return False

    def _steady_wake(self, req: Request, computed: int, generated: int) -> tuple[int, bool]:
        """Steps from the next one until `req` (at `computed` / `generated` tokens), decoding
        one token per step, needs attention: a KV block to take, a prompt block to hash (not
        a private one: `lazy_hash_end` records it), or its last token (0 = at once). The flag
        says the only need then is a new KV block: a request at a block start now (0, True)
        waits for its block as a steady one."""
        bs = self.config.block_size
        steps = -computed % bs  # next position at a block start: a new block
        block_only = True
        # A need that falls on the block step too makes that step more than a block taking.
        done_in = req.output_tokens - generated - 1
        if done_in <= steps:
            steps = done_in
            block_only = False
        mml = self.config.max_model_len
        if mml > 0:
            capped_in = mml - 2 - computed
            if capped_in <= steps:
                steps = capped_in
                block_only = False
        # The block holding the last prompt token is hashed once it fills up with output.
        hash_at = computed + (bs - 1 - computed) % bs
        if hash_at - computed <= steps and hash_at + 1 <= -(-req.prefill_target // bs) * bs:
            if self.kv.defers_hash(req, hash_at // bs):
                # A private block's hashing is deferred anyway (KVCache): filling it only
                # sets the count a release short of completion hashes, so the request stays
                # steady and `_unsteady_one` sets that count if the block filled meanwhile.
                req.lazy_hash_end = hash_at + 1
            else:
                steps = hash_at - computed
                block_only = False
        return (steps, block_only) if steps > 0 else (0, block_only)

    def _make_steady(self, req: Request, wake_in: int, block_only: bool) -> None:
        step = self._finished_steps
        req.steady = True
        req.sync_step = step
        req.wake_step = step + wake_in
        req.wake_for_block = block_only
        self._steady_count += 1
        self._steady_context_offset += req.computed_tokens - step
        heapq.heappush(self._wake_heap, (req.wake_step, req.run_seq, req))

    def _take_block_steady(self, req: Request, step: int) -> None:
        """A steady request at a block start gets its block and stays steady: nothing else of
        it changes this step, so the per-request loop has nothing to do for it."""
        self.kv.take_block(req)  # the caller checked the room
        behind = step - req.sync_step
        # After this step's token it is one further on: when does it need attention next?
        computed = req.computed_tokens + behind + 1
        generated = req.generated_tokens + behind + 1
        # Nearly always the next block start, a block from now: `_steady_wake`'s answer when
        # neither the last token nor the context limit comes first (the block just taken holds
        # output alone, so there is no prompt block to hash in it).
        to_next_block = self._steps_to_next_block
        mml = self.config.max_model_len
        if (
            to_next_block
            and req.output_tokens - generated - 1 > to_next_block
            and (mml <= 0 or mml - 2 - computed > to_next_block)
        ):
            wake_in, block_only = to_next_block, True
        else:
            wake_in, block_only = self._steady_wake(req, computed, generated)
        req.wake_step = wake_step = step + 1 + wake_in
        req.wake_for_block = block_only
        heapq.heappush(self._wake_heap, (wake_step, req.run_seq, req))

    def _sync(self, req: Request) -> None:
        behind = self._finished_steps - req.sync_step
        if behind:
            req.computed_tokens += behind
            req.generated_tokens += behind
            req.last_token_us = self._prev_step_end_us + req.generated_tokens * self.otp_us
            req.sync_step = self._finished_steps

    def _unsteady_one(self, req: Request, in_step: int = 0) -> None:
        """Bring a steady request up to date and hand it back to the one-by-one loop.

        `in_step` is 1 when a planned step holds the request's next token (a timeout or an
        eviction in the middle of a step), 0 between steps (planning): the per-request loop
        takes a token's KV, and hashes a block it fills, when it plans the step."""
        self._sync(req)
        req.steady = False
        self._steady_count -= 1
        self._steady_context_offset -= req.computed_tokens - req.sync_step
        hash_end = req.lazy_hash_end
        if hash_end:
            # The private prompt block skipped by `_steady_wake`: if it filled up, the count
            # of deferred blocks is what filling it on the per-request loop would have set.
            req.lazy_hash_end = 0
            if req.computed_tokens + in_step >= hash_end:
                req.deferred_hash_blocks = hash_end // self.config.block_size

    def _unsteady_all(self, in_step: int = 0) -> None:
        if self._steady_count:
            for req in self.running:
                if req.steady:
                    self._unsteady_one(req, in_step)
        self._wake_heap.clear()

    def sync_lazy_progress(self) -> None:
        """Bring every steady request's counters and last-token time up to date."""
        if self._steady_count:
            for req in self.running:
                if req.steady:
                    self._sync(req)

    def _admit_head(self, req: Request, new_tokens: int, now_us: int) -> None:
        """Move the head of the wait queue into the running batch for this step."""
        self.waiting.popleft()
        self.running.append(req)
        self._run_seq += 1
        req.run_seq = self._run_seq
        req.state = RequestState.RUNNING
        req.num_new_tokens = new_tokens
        req.schedule_us = now_us
        if req.first_schedule_us < 0:
            req.first_schedule_us = now_us

    def _reclaim_queued_kv(self, head: Request, now_us: int) -> bool:
        """The head of the wait queue does not fit and nothing runs, so no running request will
        ever free a block: only queued decode sub-requests hold KV (their transferred prompts).
        Preempt the newest of them other than the head: its blocks are freed and it will
        re-compute its prompt here when its turn comes, as a preempted request does
        (docs/behaviour.md §A2). With none left, a resident head that still cannot take its next
        token can never run on this instance: it is dropped as unservable. Returns True when the
        head should be tried again (something was freed, or the head was dropped)."""
        waiting = self.waiting
        for i in range(len(waiting) - 1, 0, -1):
            holder = waiting[i]
            if holder.block_ids:
                self._evict_for_recompute(holder)
                return True
        if head.block_ids:
            waiting.popleft()
            self.kv.release(head)
            self._drop(head, now_us)
            self.dropped_while_planning.append(head)
            return True
        return False

    def _drop(self, req: Request, now_us: int) -> None:
        """A request that can never be served: dropped, and counted (docs/behaviour.md §1.3)."""
        req.state = RequestState.DROPPED
        req.completion_us = now_us
        self.dropped_unservable += 1

    def _reload(self, req: Request, gpu_blocks: int, blocks: int, now_us: int) -> int:
        """Bring `blocks` prefix blocks back from the CPU tier for `req`, whose GPU blocks now
        hold their hashes. Returns the time to add to this step (blocking mode only)."""
        kv = self.kv
        kv.cache_misses -= blocks  # they were allocated as new blocks, but are CPU hits
        hashes = req.block_hashes(gpu_blocks + blocks, kv.block_size)
        kv.cpu.reload(hashes[gpu_blocks : gpu_blocks + blocks], now_us)
        if self.config.kv_reload_blocking:
            duration = self.config.reload_us(blocks)
            req.kv_reload_us += duration
            return duration
        req.reload_pending = True
        req.reload_ticket += 1
        self.new_reloads.append((req, blocks * self.config.kv_bytes_per_block))
        return 0

    def reload_done(self, req: Request, ticket: int, duration_us: int) -> bool:
        """The host link delivered `req`'s prefix. False if the request moved on meanwhile
        (preempted or cancelled while it waited)."""
        if req.state is not RequestState.RUNNING or ticket != req.reload_ticket:
            return False
        req.reload_pending = False
        req.kv_reload_us += duration_us
        return True

    @property
    def waiting_on_reloads(self) -> bool:
        return any(r.reload_pending for r in self.running)

    def _prefill_chunk(self, target: int, start: int, budget: int) -> int:
        """Prefill tokens from `start` this step: the rest of the target, capped by the
        long-prefill threshold, the remaining budget and the context limit (docs/behaviour.md
        §1.5)."""
        chunk = target - start
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold < chunk:
            chunk = threshold
        if chunk > budget:
            chunk = budget
        mml = self.config.max_model_len
        if mml > 0:
            chunk = min(chunk, max(mml - 1 - start, 0))
        return chunk

    def _preempt(self, serving: Request, cursor: int, budget: int) -> tuple[bool, int, int]:
        """Evict the running request the preemption policy names (vLLM recompute,
        docs/behaviour.md §A2) while `serving` (at index `cursor`) needs KV room.

        A victim before the cursor already had its tokens this step: they go back to the
        budget and the cursor moves back with the list. Returns whether the request being
        served was itself evicted (or nothing was left), and the cursor and budget after."""
        running = self.running
        if not running:
            return True, cursor, budget
        index = self.preemption.victim_index(running)
        victim = running.pop(index)
        if index < cursor:
            cursor -= 1
            budget += victim.num_new_tokens
        self._evict_for_recompute(victim)
        victim.state = RequestState.QUEUED
        victim.reload_pending = False
        victim.reload_ticket += 1
        self.waiting.appendleft(victim)
        return victim is serving, cursor, budget

    def _evict_for_recompute(self, victim: Request) -> None:
        """Free `victim`'s KV blocks; it will re-prefill its prompt and every token already
        delivered (nothing is generated twice). Counted as a preemption."""
        self.kv.release(victim)
        victim.computed_tokens = 0
        victim.num_new_tokens = 0
        victim.in_prefill = True
        victim.prefill_target = victim.input_tokens + victim.generated_tokens
        victim.preemptions += 1
        self.preemption_count += 1

    def check_invariants(self) -> None:
        """Assert the engine's laws (tests and debug runs): states, progress bounds, KV."""
        self.sync_lazy_progress()
        steady = [r for r in self.running if r.steady]
        assert len(steady) == self._steady_count
        assert sum(r.computed_tokens - r.sync_step for r in steady) == (self._steady_context_offset)
        assert all(r.wake_step >= self._finished_steps for r in steady)
        for req in self.waiting:
            assert req.state is RequestState.QUEUED, req
            assert not req.block_ids or req.kv_resident, req
        for req in self.running:
            assert req.state is RequestState.RUNNING, req
        for req in (*self.waiting, *self.running):
            assert 0 <= req.generated_tokens <= max(req.output_tokens, 0), req
            assert req.computed_tokens <= req.input_tokens + req.generated_tokens, req
        self.kv.check_invariants([*self.running, *(r for r in self.waiting if r.block_ids)])
        if self.lora is not None:
            # A batch never holds more adapters than the GPU has slots (vLLM's max_loras).
            adapters = {r.adapter for r in self.running if r.adapter}
            assert len(adapters) <= self.lora.config.max_loras, adapters
            assert len(self.lora.gpu) <= self.lora.config.max_loras
            assert len(self.lora.cpu) <= self.lora.config.max_cpu_loras

    def _reorder_waiting(self, now_us: int) -> None:
        policy = self.priority_policy
        for req in self.waiting:
            req.priority = policy.priority(req, now_us)
        if not self.scheduler.keeps_order:
            self.waiting = deque(self.scheduler.order(list(self.waiting)))

    def finish_and_plan_steady(self, step_us: int, price: Callable[[int, int], int]) -> int:
        """`finish_step` for a step in which every request served was steady (none handled one
        by one, so none completes) on an engine without a CPU tier, then `plan_steady_step`
        at its end, priced by `price(decode_count, decode_context_sum)`: the same counters,
        log row and plan, without the per-request loops, in one call, as most steps of a busy
        batch are such. Returns the planned step's duration; 0 when the step was finished and
        the next one needs the general plan (nothing planned yet); -1 when the step was not
        all steady (nothing done: it needs `finish_step`)."""
        if self._active or not self._steady_count or self._has_cpu_tier:
            return -1
        start = self._step_start_us
        end = start + step_us
        steady = self._steady_count
        self.total_output_tokens += steady
        # The same row as finish_step's, written out: a shared StepLog.append_row call cost
        # +0.6 % (a) and +1.1 % (d) instructions. A column added there and not here would
        # differ in length; tests/engine/test_fast_paths.py compares step frames and summaries.
        # (No CPU tier here, so no CPU-tier columns; the regular gap is derived from the times.)
        steps = self.steps
        waiting = self.waiting
        steps.tail_start_us.append(start)
        steps.tail_step_us.append(step_us)
        steps.tail_batch_size.append(steady)
        steps.tail_prefill_tokens.append(0)
        steps.tail_decode_tokens.append(steady)
        steps.tail_kv_used_blocks.append(self.kv.used_blocks)
        steps.tail_queue_length.append(len(waiting))
        steps.tail_running_requests.append(len(self.running))
        steps.tail_preemptions.append(self.preemption_count)
        steps.tail_itl_regular_count.append(steady)
        self._prev_step_end_us = end
        self._finished_steps = step = self._finished_steps + 1
        self._unsteady = []
        self.clock_us = end
        # plan_steady_step(end), written out.
        if waiting or not self.fast_path or steady > self.config.max_num_scheduled_tokens:
            return 0
        heap = self._wake_heap
        if heap and heap[0][0] <= step and not self._take_steady_blocks(step, end):
            return 0
        self.kv.now_us = end
        self.step_count += 1
        self.fast_path_steps += 1
        self._step_start_us = end
        return price(steady, self._steady_context_offset + steady * step)

    def finish_step(self, step_us: int) -> list[Request]:
        """Apply a step that ran for `step_us`: progress, tokens, completions (docs/behaviour.md
        §1.4 B–C).

        Returns the requests that completed at the end of this step.
        """
        start = self._step_start_us
        end = start + step_us
        self.clock_us = end
        otp = self.otp_us
        prev_end = self._prev_step_end_us
        regular_gap = end - prev_end + otp
        regular = 0
        irregular = self.irregular_itl_us
        mml = self.config.max_model_len
        done: list[Request] = []
        prefill_tokens = 0
        decode_tokens = 0
        produced = 0
        served = 0
        burst_gaps = 0
        active = self._active
        for req in active:
            n = req.num_new_tokens
            if not n:
                continue
            served += 1
            if req.in_prefill:
                prefill_tokens += n
                req.computed_tokens += n
                if req.computed_tokens < req.prefill_target:
                    continue
                req.in_prefill = False
                if req.output_tokens == 0:
                    req.first_token_us = end
                    req.last_token_us = end
                    done.append(req)
                    continue
            elif n > 1:
                # A verification: the accepted drafts and the target's own token arrive
                # together; tokens past the output's end are discarded (docs/speculative.md).
                burst = self.speculation.draw_accepted(req.client_id, n - 1) + 1
                req.computed_tokens += burst
                g = req.generated_tokens
                if burst > req.output_tokens - g:
                    burst = req.output_tokens - g
                decode_tokens += burst
                produced += burst
                t = end + (g + 1) * otp
                if g == 0:
                    req.first_token_us = t
                else:
                    gap = t - req.last_token_us
                    if gap == regular_gap:
                        regular += 1
                    else:
                        irregular.append(gap)
                # The burst's later tokens follow its first by the per-token overhead each.
                burst_gaps += burst - 1
                g += burst
                req.generated_tokens = g
                req.last_token_us = end + g * otp
                if g >= req.output_tokens:
                    done.append(req)
                elif mml > 0 and req.computed_tokens >= mml - 1:
                    req.length_capped = True
                    self.length_capped += 1
                    done.append(req)
                continue
            else:
                decode_tokens += 1
                req.computed_tokens += 1
            # One output token reaches the client: token k at end + k*otp (docs/behaviour.md §A3).
            g = req.generated_tokens + 1
            req.generated_tokens = g
            produced += 1
            t = end + g * otp
            if g == 1:
                req.first_token_us = t
            else:
                gap = t - req.last_token_us
                if gap == regular_gap:
                    regular += 1
                else:
                    irregular.append(gap)
            req.last_token_us = t
            if g >= req.output_tokens:
                done.append(req)
            elif mml > 0 and req.computed_tokens >= mml - 1:
                req.length_capped = True
                self.length_capped += 1
                done.append(req)
        steady = self._steady_count
        if steady:
            # Each steady request decoded one token with the regular gap (see the class doc).
            served += steady
            decode_tokens += steady
            produced += steady
            regular += steady
        self.total_output_tokens += produced
        if self.speculation is not None:
            stats = self.speculation.stats
            stats.burst_gaps += burst_gaps
            stats.draft_us += self._planned_draft_us
            self._planned_draft_us = 0
        if done:
            kv = self.kv
            post = self.post_decode_us
            lora = self.lora
            for req in done:
                req.state = RequestState.COMPLETED
                req.completion_us = req.last_token_us + (post if req.generated_tokens else 0)
                kv.release(req)
                _retire(req)
                if lora is not None and req.adapter:
                    lora.record_completion(
                        req.adapter,
                        req.first_token_us - req.arrival_us if req.first_token_us >= 0 else -1,
                        req.completion_us - req.arrival_us,
                        req.generated_tokens,
                    )
            if len(done) <= 2:
                # Usually the oldest running requests finish, near the list's front: cheaper
                # than rebuilding the whole batch.
                for req in done:
                    self.running.remove(req)
            else:
                self.running = [r for r in self.running if r.state is RequestState.RUNNING]
            self.completed_count += len(done)
            if self.keep_completed:
                self.completed.extend(done)
        steps = self.steps
        steps.tail_start_us.append(start)
        steps.tail_step_us.append(step_us)
        steps.tail_batch_size.append(served)
        steps.tail_prefill_tokens.append(prefill_tokens)
        steps.tail_decode_tokens.append(decode_tokens)
        steps.tail_kv_used_blocks.append(self.kv.used_blocks)
        steps.tail_queue_length.append(len(self.waiting))
        steps.tail_running_requests.append(len(self.running))
        steps.tail_preemptions.append(self.preemption_count)
        steps.tail_itl_regular_count.append(regular)
        cpu = self.kv.cpu
        if cpu is not None:
            steps.tail_cpu_kv_used_blocks.append(cpu.used_blocks)
            steps.tail_reloading_requests.append(sum(1 for r in self.running if r.reload_pending))
        if len(steps.tail_start_us) >= PACK_AFTER_ROWS:
            steps.pack()
        self._prev_step_end_us = end
        self._finished_steps += 1
        if self.fast_path:
            unsteady = []
            for req in active:
                if req.state is not RequestState.RUNNING:
                    continue
                if req.num_new_tokens and not req.in_prefill and not req.reload_pending:
                    wake_in, block_only = self._steady_wake(
                        req, req.computed_tokens, req.generated_tokens
                    )
                    if wake_in or block_only:
                        self._make_steady(req, wake_in, block_only)
                        continue
                unsteady.append(req)
            self._unsteady = unsteady
        return done


def _retire(req: Request) -> None:
    """A request done with this engine keeps only what results read: its cached block hashes
    and fast-path bookkeeping (large ints, one object each) go, as a million finished
    requests would keep them all."""
    req.forget_block_hashes()
    req.run_seq = req.sync_step = req.wake_step = req.lazy_hash_end = 0
