"""vLLM continuous batching for one instance (docs/behaviour.md §1.3–1.5, §1.8, §A2–A3).

`VLLMEngine` owns the wait queue, the running batch and the KV cache. It has no notion of
SimPy: the instance process calls `enqueue`, `plan_step` (at a step's start), and
`finish_step` (at its end), and the engine answers with plain values. That split keeps the
scheduling rules testable with nothing but integers.

This is the reference: a step is formed (`plan_general_step`: Phase 1 `_schedule_running`,
Phase 2 `_admit_waiting`), priced by the step-time model, advanced and completed
(`finish_step`), one request at a time, each rule written once. The exact accelerations of
that loop live in `accelerator.py` and call the rules here (`tokens_to_end`, `context_limit`,
`_prefill_chunk`) instead of restating them.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from ..latency.base import StepBatch
from ..limits import MAX_TIME_US, duration_us
from ..metrics.recorder import PACK_AFTER_ROWS, StepLog
from .accelerator import SteadyDecoders
from .formation import make_batch_formation
from .itl_pool import WithdrawnGapLog, note_break
from .kv_cache import KVCache
from .kv_tiers import CPUTier
from .options import ACCELERATED, EngineOptions
from .policies import make_priority_policy, make_scheduler
from .preemption import make_preemption_policy
from .request import Request, RequestState

if TYPE_CHECKING:
    from .itl_pool import WithdrawnGaps

    # LoRA and speculative decoding are imported by the engines that use them: a run
    # without them does not pay for their modules at start-up.
    from .lora import LoRAConfig
    from .speculative import SpeculativeConfig

# The context limit of an engine without one (`max_model_len` 0): more tokens than any
# request computes, so that the same comparisons hold with and without a limit.
NO_CONTEXT_LIMIT = 1 << 62


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
    # SLO-class priorities replacing BLIS's defaults (engine.slo_priorities), for `priority`
    # preemption and the `slo-class` priority policy.
    slo_priorities: dict[str, int] | None = None
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

    With the decode fast path on (`EngineOptions.decode_fast_path`), `steady` holds the
    running requests that only advance a counter per step (`accelerator.SteadyDecoders`):
    the reference loops here see only the others, and count the steady ones as a group.
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
        self.preemption = make_preemption_policy(config.preemption_policy, config.slo_priorities)
        self.formation = formation = make_batch_formation(config.batch_formation)
        # Read per step: a policy that forms steps its own way, and one admitting only whole
        # prompts (engine/formation.py).
        self._own_formation = not formation.running_first
        self._whole_prompts = not formation.chunks_prompts
        self.priority_policy = make_priority_policy(config.priority_policy, config.slo_priorities)
        self.otp_us = output_token_processing_us
        # Fixed per-request cost after the last token (trained-roofline's alpha1): it delays
        # the completion the client sees, never the GPU.
        self.post_decode_us = post_decode_overhead_us
        self.steps = StepLog(cpu is not None, output_token_processing_us)
        self.irregular_itl_us = array("d")  # fractional only with blocking reloads
        # Requests that left without completing: their gaps leave the pooled ITL (itl_pool.py).
        self.withdrawn = WithdrawnGapLog(output_token_processing_us)
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
        self.speculation = None
        if spec is not None:
            from .speculative import Speculation

            self.speculation = Speculation(spec)
        self._planned_draft_us = 0
        # LoRA adapters: GPU slots, CPU cache, per-adapter statistics.
        self.lora = None
        if config.lora is not None:
            from .lora import LoRAState

            self.lora = LoRAState(config.lora)
        # The computed-token count at which a request is length-capped (`context_room`).
        mml = config.max_model_len
        self.context_limit = mml - 1 if mml > 0 else NO_CONTEXT_LIMIT
        self._active: list[Request] = []  # this step's one-by-one requests, in running order
        # Requests of the step in flight whose clients timed out during it, and their tokens:
        # the step computes them all the same, and its log row counts them (`finish_step`).
        self._left_served = 0
        self._left_prefill_tokens = 0
        self._left_decode_tokens = 0
        self._run_seq = 0
        # Planned steps that took the plain loop over every running request (no fast path):
        # `fast_path_steps` is the rest of `step_count`.
        self.reference_steps = 0
        self.steady_block_takes = 0  # KV blocks handed to steady requests without waking them
        # Steps finished without a SimPy event of their own (the instance's step coalescing).
        self.steps_coalesced = 0
        # The decode fast path (accelerator.py). A speculating request's step is a random
        # number of tokens, never a counter's advance by one, and a LoRA step is priced by the
        # tokens of each adapter: both take the reference loop every step; so does a batch
        # formation that lets running requests wait (formation.py).
        self.fast_path = (
            options.decode_fast_path
            and spec is None
            and self.lora is None
            and formation.supports_decode_fast_path
        )
        self.steady = SteadyDecoders(self) if self.fast_path else None

    def seed_speculation(self, rng) -> None:
        """The stream this instance's acceptance draws come from (one per instance)."""
        if self.speculation is not None:
            self.speculation.seed(rng)

    # ------------------------------------------------------------------ queries
    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ rules
    def context_room(self, computed_tokens: int) -> int:
        """Tokens a request that has computed `computed_tokens` may still compute under
        `max_model_len`: it is length-capped when its context reaches max_model_len − 1
        (BLIS), so a prefill chunk stops there and a request at it gets no decode token.
        Without a limit, more than any request needs."""
        return self.context_limit - computed_tokens

    def tokens_to_end(self, computed_tokens: int, generated_tokens: int, output_tokens: int) -> int:
        """Tokens a decoding request (at `computed_tokens` / `generated_tokens` of
        `output_tokens`) has still to produce before it ends: its output is complete or its
        context reaches the limit (`context_room`), whichever comes first. `finish_step`
        completes a request once this is 0 or less; a token that brings it there is the
        request's last."""
        left = output_tokens - generated_tokens
        room = self.context_limit - computed_tokens
        return left if left < room else room

    @property
    def fast_path_steps(self) -> int:
        """Planned steps that took a fast path (`SteadyDecoders`): all steady, or the steady
        requests kept as a group. Derived rather than counted, as the all-steady paths plan
        most steps of a busy batch and a counter there costs per step."""
        return self.step_count - self.reference_steps

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
        if req.output_tokens == 0:
            if self._past_deadline(req, now_us):
                return EnqueueOutcome.TIMED_OUT
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
            self._drop(req, now_us)  # counted here too: this instance dropped it
            return EnqueueOutcome.DROPPED
        if self._past_deadline(req, now_us):
            # The KV is reserved before the deadline is looked at, as in BLIS (§7.2 step 5:
            # no room is a drop at decode KV even for a request whose client has given up).
            self.kv.release(req)
            return EnqueueOutcome.TIMED_OUT
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
            if req.num_new_tokens or req.steady:
                # It leaves in the middle of a step that computes its tokens (no step is planned
                # between steps: `finish_step` and the next plan run at one instant).
                self._note_left_mid_step(req)
            if self.steady is not None:
                self.steady.leave(req)
            self.running.remove(req)
            self.kv.release(req)
        else:
            return False
        self.withdrawn.withdraw(req)
        self.clock_us = now_us
        req.state = RequestState.TIMED_OUT
        req.completion_us = now_us
        req.num_new_tokens = 0
        _retire(req)
        self.timed_out += 1
        return True

    def _note_left_mid_step(self, req: Request) -> None:
        """`req`, whose client timed out, leaves the step in flight: the step still computes
        (and was priced for) its tokens, so its log row counts them: its prefill chunk, or one
        decode token (a verification's accepted drafts are never drawn: its sampled token
        alone), though none reaches the client."""
        self._left_served += 1
        if req.in_prefill:
            self._left_prefill_tokens += req.num_new_tokens
        else:
            self._left_decode_tokens += 1

    def evict_all(self) -> list[Request]:
        """Remove every queued and running request, freeing their KV blocks (the instance is
        going away). The caller settles each request's fate."""
        steady = self.steady
        if steady is not None:
            steady.unsteady_all(in_step=1)  # exact token counts for every running request first
            steady.unsteady = []
        evicted = [*self.running, *self.waiting]
        withdraw = self.withdrawn.withdraw
        for req in evicted:
            if req.block_ids:
                self.kv.release(req)
            req.num_new_tokens = 0
            withdraw(req)
        self.running = []
        self.waiting = deque()
        self._active = []
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
        if self.steady is not None:
            plan = self.steady.plan_step(now_us)
            if plan is not None:
                return StepBatch([], plan[0], plan[1], [], 0)
        return self.plan_general_step(now_us)

    def plan_general_step(self, now_us: int) -> StepBatch:
        """`plan_step` once the all-steady plan is ruled out (there is work): the reference
        step, less the steady requests (`steady`) when the fast path can keep them as a
        group this step."""
        self.clock_us = now_us
        self.kv.now_us = now_us
        self.step_count += 1
        cfg = self.config
        step_extra_us = 0
        if not self.priority_policy.is_constant or not self.scheduler.keeps_order:
            self._reorder_waiting(now_us)

        budget = cfg.max_num_scheduled_tokens
        steady = self.steady
        active = steady.one_by_one(budget) if steady is not None else None
        if active is None:
            # The plain loop over every running request (it may preempt).
            self.reference_steps += 1
            if steady is not None:
                steady.unsteady_all()
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
            budget, preempted = self._schedule_running(active, budget - steady.count)
            assert not preempted, "the fast path admitted a step that preempts"
            step_extra_us = self._admit_waiting(active, budget, now_us)
        self._active = active

        # The batch the step-time model prices: only requests that got tokens this step.
        prefill_chunks: list[tuple[int, int]] = []
        prefill_prompts: list[int] = []
        if steady is not None:
            # This step's requests are handled one by one until it ends; `finish_step` then
            # makes steady those that can be.
            steady.unsteady = active[:]
            decode_count = steady.count
            decode_context = steady.context_sum()
        else:
            decode_count = decode_context = 0
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

    def _schedule_running(
        self, order: list[Request], budget: int, prefills_only: bool = False
    ) -> tuple[int, bool]:
        """Phase 1: tokens for running requests in `order` (admission order), within `budget`;
        with `prefills_only`, chunks for those still in prefill alone (decoders wait).

        Returns the budget left and whether a request was preempted for KV room."""
        limit = self.context_limit
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
                # No context room left (`context_room`; compared inline, as this runs for
                # every request in every step): it gets no token.
                if prefills_only or computed >= limit:
                    i += 1
                    continue
                if spec is not None:
                    # The sampled token and the drafts, with KV for both and for the
                    # drafter's next proposals (vLLM's lookahead), up to the context limit.
                    mml = self.config.max_model_len
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
                    # Hashed is the block the sampled token at `computed` fills, if it does:
                    # the only known token the KV does not hold yet (the last step's accepted
                    # burst was hashed at that step's end, `finish_step`), not the drafts or
                    # the lookahead.
                    while not kv.try_allocate(req, computed, end, [], computed + 1):
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
        if self._evict_newest_queued_holder(keep_head=True):
            return True
        waiting = self.waiting
        if head.block_ids:
            waiting.popleft()
            self.kv.release(head)
            self._drop(head, now_us)
            self.dropped_while_planning.append(head)
            return True
        return False

    def _evict_newest_queued_holder(self, keep_head: bool) -> bool:
        """Preempt the newest queued request holding KV blocks (a decode sub-request with its
        transferred prompt), where it stands in the queue, the head too unless `keep_head`.
        Whether there was one."""
        waiting = self.waiting
        for i in range(len(waiting) - 1, 0 if keep_head else -1, -1):
            holder = waiting[i]
            if holder.block_ids:
                self._evict_for_recompute(holder)
                return True
        return False

    def _drop(self, req: Request, now_us: int) -> None:
        """A request that can never be served: dropped, and counted (docs/behaviour.md §1.3)."""
        req.state = RequestState.DROPPED
        req.completion_us = now_us
        self.dropped_unservable += 1
        self.withdrawn.withdraw(req)

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
        room = self.context_room(start)
        if chunk > room:
            chunk = room if room > 0 else 0
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
        if len(running) == 1 and self._evict_newest_queued_holder(keep_head=False):
            # `serving` runs alone, so it would evict itself, only to take the same blocks back
            # chunk by chunk while queued decode sub-requests keep theirs, for ever: the queue
            # gives KV back instead, as when nothing runs (docs/engine.md, PD).
            return False, cursor, budget
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
        if self.steady is not None:
            self.steady.check_invariants()
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

    def sync_lazy_progress(self) -> None:
        """Bring every steady request's counters and last-token time up to date."""
        if self.steady is not None:
            self.steady.sync_all()

    @property
    def withdrawn_gaps(self) -> WithdrawnGaps:
        """The gaps to leave out of the pooled ITL: of the requests that left this engine
        without completing, and of those still in it (the run ended before they completed)."""
        self.sync_lazy_progress()
        return self.withdrawn.snapshot([*self.running, *self.waiting])

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
        # A request ends when `tokens_to_end` reaches 0, written out below by its two reasons
        # (the output is complete; the context is at the limit: length-capped).
        limit = self.context_limit
        kv = self.kv
        block_size = kv.block_size
        done: list[Request] = []
        prefill_tokens = 0
        decode_tokens = 0
        produced = 0
        served = 0
        burst_gaps = 0
        row = -1  # this step's row in the log, looked up when a run of tokens starts
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
                before = req.computed_tokens
                computed = before + burst
                req.computed_tokens = computed
                g = req.generated_tokens
                if burst > req.output_tokens - g:
                    burst = req.output_tokens - g
                # The accepted tokens are known now: hash the blocks they filled, as vLLM
                # caches a request's full blocks once its new tokens are appended (its async
                # scheduler's `_update_request_with_output`). The allocation only knew the
                # sampled token; left to the next step's, the blocks of a request's last burst
                # were never hashed (it completes or is preempted first). Capped at the
                # request's content: drafts past the output's end are discarded.
                known = req.input_tokens + g + burst
                if known > computed:
                    known = computed
                if known // block_size > before // block_size:
                    kv.now_us = end
                    kv.hash_known_blocks(req, before, known)
                decode_tokens += burst
                produced += burst
                t = end + (g + 1) * otp
                if g == 0:
                    req.first_token_us = t
                    if row < 0:
                        row = len(self.steps)
                    req.first_token_row = row
                else:
                    gap = t - req.last_token_us
                    if gap == regular_gap:
                        regular += 1
                    else:
                        irregular.append(gap)
                        if row < 0:
                            row = len(self.steps)
                        note_break(req, req.last_token_us - g * otp, row, gap)
                # The burst's later tokens follow its first by the per-token overhead each.
                burst_gaps += burst - 1
                g += burst
                req.generated_tokens = g
                req.last_token_us = end + g * otp
                if g >= req.output_tokens:
                    done.append(req)
                elif req.computed_tokens >= limit:
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
                if row < 0:
                    row = len(self.steps)
                req.first_token_row = row
            else:
                gap = t - req.last_token_us
                if gap == regular_gap:
                    regular += 1
                else:
                    irregular.append(gap)
                    if row < 0:
                        row = len(self.steps)
                    note_break(req, req.last_token_us - (g - 1) * otp, row, gap)
            req.last_token_us = t
            if g >= req.output_tokens:
                done.append(req)
            elif req.computed_tokens >= limit:
                req.length_capped = True
                self.length_capped += 1
                done.append(req)
        steady = self.steady
        if steady is not None and steady.count:
            # Each steady request decoded one token with the regular gap (accelerator.py).
            n = steady.count
            served += n
            decode_tokens += n
            produced += n
            regular += n
        if self._left_served:
            served += self._left_served
            prefill_tokens += self._left_prefill_tokens
            decode_tokens += self._left_decode_tokens
            self._left_served = self._left_prefill_tokens = self._left_decode_tokens = 0
        self.total_output_tokens += produced
        if self.speculation is not None:
            stats = self.speculation.stats
            stats.burst_gaps += burst_gaps
            stats.draft_us += self._planned_draft_us
            self._planned_draft_us = 0
        if done:
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
        self._log_step(start, step_us, served, prefill_tokens, decode_tokens, regular)
        self._prev_step_end_us = end
        if steady is not None:
            steady.after_step(active)
        return done

    def _log_step(
        self,
        start_us: int,
        step_us: int,
        served: int,
        prefill_tokens: int,
        decode_tokens: int,
        regular_itl_count: int,
    ) -> None:
        """The step log's row of a finished step (metrics/recorder.py: StepLog), the engine's
        state after it. `SteadyDecoders.finish_and_plan` writes the same row inline."""
        steps = self.steps
        tail = steps.tail
        row = (
            start_us,
            step_us,
            served,
            prefill_tokens,
            decode_tokens,
            self.kv.used_blocks,
            len(self.waiting),
            len(self.running),
            self.preemption_count,
            regular_itl_count,
        )
        cpu = self.kv.cpu
        if cpu is not None:
            row += (cpu.used_blocks, sum(1 for r in self.running if r.reload_pending))
        tail.append(row)
        if len(tail) >= PACK_AFTER_ROWS:
            steps.pack()


def _retire(req: Request) -> None:
    """A request done with this engine keeps only what results read: its cached block hashes
    and fast-path bookkeeping (large ints, one object each) go, as a million finished
    requests would keep them all."""
    req.forget_block_hashes()
    req.run_seq = req.sync_step = req.wake_step = 0
