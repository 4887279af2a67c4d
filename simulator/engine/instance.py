"""One serving instance as SimPy processes: an intake that enqueues and a step loop.

The processes are thin: every rule lives in `VLLMEngine` (batching) and the step-time model.
The step loop is the reference loop (plan, price, wait for the step's end, finish) with the
exact accelerations of accelerator.py: whole steady steps (`SteadyDecoders`) and quiet steps
finished without an event each (`finish_quiet_steps`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from ..invariants import STALLED_STEPS_LIMIT, check_step, stalled, thrashing
from ..latency.base import StepBatch, StepTimeModel
from ..limits import MAX_TIME_US, duration_us
from .accelerator import finish_quiet_steps
from .batching import EnqueueOutcome, VLLMEngine
from .events import (
    ARRIVAL,
    INSTANCE_PRIORITY_STRIDE,
    STEP,
    TIMEOUT,
    PriorityEvent,
    event_after,
    timeout_at_priority,
)
from .request import Request

if TYPE_CHECKING:
    from .dp_group import LockstepGroup


class Instance:
    """A vLLM replica as two SimPy processes: an intake that takes routed requests from its
    `inbox` Store, and a step loop. Finished requests go to `on_finished`."""

    def __init__(
        self,
        env: simpy.Environment,
        instance_id: str,
        engine: VLLMEngine,
        step_model: StepTimeModel,
        on_finished: Callable[[Request], None],
        horizon_us: int | None = None,
        check_invariants: bool = False,
        index: int = 0,
        coalesce_steps: bool = True,
        lockstep: LockstepGroup | None = None,
    ) -> None:
        self.env = env
        self.instance_id = instance_id
        self.engine = engine
        self.step_model = step_model
        self.on_finished = on_finished
        self.horizon_us = horizon_us
        self.check_invariants = check_invariants
        # Simultaneous events of different instances run in instance order (docs/behaviour.md §6.1).
        self.index = index
        offset = INSTANCE_PRIORITY_STRIDE * index
        self._arrival_priority = ARRIVAL + offset
        self._step_priority = STEP + offset
        self._timeout_priority = TIMEOUT + offset
        self.inbox = simpy.Store(env)
        self.pending_enqueue: set[Request] = set()
        # When the step in flight ends (µs), and the scheduling lag: a request that
        # reaches the engine while a step runs misses the next `scheduling_lag_steps` planned
        # steps (StepTimeModel.scheduling_lag_steps); `_lagged` holds each such request with
        # the number of plans it still has to miss.
        self._inflight_end_us = 0
        self.scheduling_lag_steps = step_model.scheduling_lag_steps()
        self._lagged: list[list] = []
        self._decode_step_time = step_model.decode_step_time_us
        self._idle: simpy.Event | None = None
        self.host_link = None  # created on the first CPU-tier reload
        self._reload_ids = 0
        # Fleet lifecycle (all inert for a fixed fleet). A request reaching an instance that no
        # longer accepts work goes to `on_orphan`; `on_idle` hears when the step loop runs dry.
        self.accepting = True
        self.terminated = False
        self.on_orphan: Callable[[Request], None] | None = None
        self.on_idle: Callable[[Instance], None] | None = None
        # Warm-up: the first requests this instance receives pay `warm_up_factor` times the
        # cost of their prefill (cold caches, lazy kernel compilation).
        self.warm_up_left = 0
        self.warm_up_factor = 1.0
        self.warm_requests: set[Request] = set()
        # Coalescing needs every step's effects to stay inside the engine; CPU-tier reloads
        # start link transfers, so instances with a CPU tier step one event at a time.
        self.coalesce_steps = coalesce_steps and engine.kv.cpu is None
        # A data-parallel rank does not step on its own: its group steps all ranks together.
        self.lockstep = lockstep
        env.process(self._intake())
        if lockstep is None:
            env.process(self._step_loop())
        else:
            lockstep.join(self)

    def _intake(self):
        inbox = self.inbox
        while True:
            self._take((yield inbox.get()))

    def _take(self, req: Request) -> None:
        """A routed request reaches the instance (delivered by `inbox`)."""
        if not self.accepting:
            self.on_orphan(req)
            return
        req.instance_id = self.instance_id
        if self.warm_up_left > 0:
            self.warm_up_left -= 1
            self.warm_requests.add(req)
        delay = self.step_model.queueing_time_us(req.input_tokens)
        lagged = self.scheduling_lag_steps > 0
        if delay <= 0 and not lagged:
            self._enqueue(req)
            return
        # The request is at the instance but not yet schedulable: the client path (the alpha
        # overhead) first, then, with a scheduling lag, the step in flight when it gets there.
        self.pending_enqueue.add(req)
        then = self._reach_engine if lagged else self._enqueue_pending
        if delay > 0:
            event_after(self.env, delay, self._arrival_priority).callbacks.append(
                lambda _ev, r=req: then(r)
            )
        else:
            then(req)

    def deliver_resident(self, req: Request) -> bool:
        """A decode sub-request arriving with its prompt KV (transfer done). False when the
        prompt's KV does not fit here: the request is dropped (at decode KV)."""
        req.instance_id = self.instance_id
        outcome = self.engine.enqueue_resident(req, self.env.now)
        if outcome is EnqueueOutcome.DROPPED:
            return False
        self._after_enqueue(req, outcome)
        return True

    def _reach_engine(self, req: Request) -> None:
        """The request reaches the engine (after the client path). With a step running, the
        next one is already planned (vLLM V1's async scheduler plans step N+1 while step N
        runs): the request waits for the plans it misses (`release_lagged`); with none
        running, it joins the next plan."""
        if req not in self.pending_enqueue:
            return  # a drain or failure took it meanwhile
        if self._inflight_end_us > self.env.now:
            self._lagged.append([req, self.scheduling_lag_steps])
        else:
            self._enqueue_pending(req)

    @property
    def lagged(self) -> bool:
        """Requests at the engine waiting for the plans they miss (`release_lagged`)."""
        return bool(self._lagged)

    def release_lagged(self, all_of_them: bool = False) -> None:
        """At a step boundary, once the next step is planned: a lagged request has missed one
        more plan, and joins the queue when it has missed all it must (so it is in the plan
        after). `all_of_them` at a boundary with nothing planned (an idle engine): there is
        no step to miss, so every lagged request joins the queue now."""
        keep = []
        for entry in self._lagged:
            entry[1] -= 1
            if entry[1] <= 0 or all_of_them:
                self._enqueue_pending(entry[0])
            else:
                keep.append(entry)
        self._lagged = keep

    def _enqueue_pending(self, req: Request) -> None:
        if req in self.pending_enqueue:  # else a drain or failure took it meanwhile
            self.pending_enqueue.discard(req)
            self._enqueue(req)

    def _enqueue(self, req: Request) -> None:
        self._after_enqueue(req, self.engine.enqueue(req, self.env.now))

    def _after_enqueue(self, req: Request, outcome: EnqueueOutcome) -> None:
        if outcome is EnqueueOutcome.QUEUED:
            deadline = req.deadline_us
            if deadline > 0 and (self.horizon_us is None or deadline <= self.horizon_us):
                event_after(
                    self.env, deadline - self.env.now, self._timeout_priority
                ).callbacks.append(lambda _ev, r=req: self._timeout(r))
            self._wake()
        elif outcome is not EnqueueOutcome.IGNORED:
            self.on_finished(req)

    def _timeout(self, req: Request) -> None:
        if req.instance_id != self.instance_id:
            return  # re-routed to another instance, which keeps its own deadline
        if self.engine.cancel(req, self.env.now):
            self.on_finished(req)

    def _wake(self) -> None:
        if self.lockstep is not None:
            self.lockstep.wake()
            return
        idle = self._idle
        if idle is not None and not idle.triggered:
            # At STEP priority (`_idle_event`) so every request arriving this microsecond joins
            # the step.
            idle.succeed()

    def _start_reloads(self) -> None:
        """Carry this step's CPU-tier reloads over the instance's host link (they contend)."""
        from ..cluster.kv_transfer import KVTransferLink  # the shared link model

        if self.host_link is None:
            cfg = self.engine.config
            self.host_link = KVTransferLink(
                self.env,
                cfg.kv_transfer_bandwidth_gb_per_s,
                cfg.kv_transfer_base_latency_us / 1000,
                contention=True,
                priority=self._arrival_priority,
                bandwidth_field="engine.kv_transfer_bandwidth_gb_per_s",
                base_latency_field="engine.kv_transfer_base_latency_us",
            )
        for req, size_bytes in self.engine.new_reloads:
            ticket = req.reload_ticket
            started_us = self.env.now

            def done(end_us: int, r: Request = req, t: int = ticket, s: int = started_us) -> None:
                if self.engine.reload_done(r, t, end_us - s):
                    self._wake()

            self._reload_ids += 1
            self.host_link.start(f"reload-{self._reload_ids}", size_bytes, done)
        self.engine.new_reloads.clear()

    def _warm_up_extra_us(self, batch) -> int:
        """(factor − 1) × the part of the step's time that the warm-up requests' prefill
        chunks cost: the step priced with and without them."""
        warm = self.warm_requests
        chunks = self.engine.prefill_requests()
        if not any(r in warm for r in chunks):
            return 0
        cold = StepBatch(
            [c for c, r in zip(batch.prefill_chunks, chunks, strict=True) if r not in warm],
            batch.decode_count,
            batch.decode_context_sum,
            [p for p, r in zip(batch.prefill_prompt_tokens, chunks, strict=True) if r not in warm]
            if batch.prefill_prompt_tokens
            else [],
        )
        step_time = self.step_model.step_time_us
        warm_cost_us = step_time(batch) - (step_time(cold) if cold.batch_size else 0)
        for r in chunks:
            if r in warm and r.computed_tokens + r.num_new_tokens >= r.prefill_target:
                warm.discard(r)  # its last prefill chunk: warm-up is over for it
        extra_us = (self.warm_up_factor - 1.0) * warm_cost_us
        if extra_us > MAX_TIME_US:
            duration_us(
                extra_us,
                f"{self.instance_id}: a warm-up step (instance_lifecycle.warm_up_ttft_factor "
                f"{self.warm_up_factor:g})",
            )
        return max(0, round(extra_us))

    def evict(self) -> list[Request]:
        """Take every request this instance holds (queued, running, still in its arrival
        delay or its inbox) and stop it for good; the caller settles each one."""
        self.accepting = False
        self.terminated = True
        taken = self.engine.evict_all()
        taken += sorted(self.pending_enqueue, key=lambda r: (r.arrival_us, r.index))
        self.pending_enqueue.clear()
        taken += list(self.inbox.items)
        self.inbox.items.clear()
        self.warm_requests.clear()
        if self._idle is not None and not self._idle.triggered:
            self._idle.tie_priority = ARRIVAL
            self._idle.succeed()  # lets the step loop see `terminated` and end
        return taken

    def take_unstarted(self) -> list[Request]:
        """Stop accepting work and hand back every request not yet started here."""
        self.accepting = False
        taken = self.engine.take_unstarted()
        taken += sorted(self.pending_enqueue, key=lambda r: (r.arrival_us, r.index))
        self.pending_enqueue.clear()
        taken += list(self.inbox.items)
        self.inbox.items.clear()
        for r in taken:
            self.warm_requests.discard(r)
        return taken

    # ---------------------------------------------- a data-parallel rank's part of a step
    @property
    def has_work(self) -> bool:
        return self.engine.has_work

    def plan_rank_step(self, now_us: int) -> StepBatch | None:
        """Form this rank's batch for the lockstep step starting at `now_us`
        (`dp_group.LockstepGroup`); None when it has nothing to run. The planning of
        `_step_loop`, one step at a time."""
        if not self.engine.has_work:
            return None
        batch = self.engine.plan_step(now_us)
        return batch if self._runnable(batch, now_us) else None

    def _runnable(self, batch: StepBatch | None, now_us: int) -> bool:
        """Settle what planning left — report the requests it dropped, start the CPU-tier
        reloads it asked for — and say whether `batch` is a step to run: not when there is
        none, nor when all it does is wait for reloads (that wait is recorded at `now_us`)."""
        engine = self.engine
        if engine.dropped_while_planning:
            for req in engine.dropped_while_planning:
                self.on_finished(req)
            engine.dropped_while_planning.clear()
        if batch is None:
            return False
        if engine.new_reloads:
            self._start_reloads()
        if batch.batch_size == 0 and engine.waiting_on_reloads:
            engine.reload_idle_us.append(now_us)
            return False
        return True

    def price_rank_step(self, batch: StepBatch) -> int:
        """What this rank's batch would take alone (µs)."""
        step_us = self.step_model.step_time_us(batch) + batch.extra_us
        if self.warm_requests:
            step_us += self._warm_up_extra_us(batch)
        return step_us

    def step_in_flight(self, end_us: int) -> None:
        """The group's step now running ends at `end_us`: a request reaching this rank
        meanwhile waits for it (the scheduling lag)."""
        self._inflight_end_us = end_us

    def finish_rank_step(self, step_us: int) -> None:
        """Apply the step this rank planned, which lasted the group's `step_us`."""
        for req in self.engine.finish_step(step_us):
            self.on_finished(req)
        if self.check_invariants:
            check_step(self.engine, self.instance_id, self.env.now)

    def _step_loop(self):
        env = self.env
        peek = env.peek
        engine = self.engine
        step_time = self.step_model.step_time_us
        decode_step_time = self._decode_step_time
        on_finished = self.on_finished
        priority = self._step_priority
        step_timeout = timeout_at_priority(priority)
        steady_decoders = engine.steady  # None with the decode fast path off
        # The duration of a steady step already planned where the previous one finished
        # (`SteadyDecoders.finish_and_plan`); 0 when the next step is still to plan.
        planned_us = 0
        empty_steps = 0  # consecutive steps that gave no request a token (the watchdog)
        # The thrashing watchdog: every STALLED_STEPS_LIMIT preemptions, the output produced
        # and the requests completed must have moved since the last such checkpoint.
        checkpoint_preemptions = 0
        checkpoint_progress = (-1, -1)
        while True:
            if planned_us:
                step_us = planned_us
            else:
                if self._lagged and not engine.has_work:
                    self.release_lagged(all_of_them=True)
                if not engine.has_work:
                    if self.on_idle is not None:
                        self.on_idle(self)
                    if self.terminated:
                        return
                    self._idle = PriorityEvent(env, priority)
                    yield self._idle
                    self._idle = None
                now = env.now
                # A step of steady decoders alone (nothing waits, none is warming up) is
                # priced from its aggregates, as coalesced steps are; anything else builds the
                # batch.
                may_be_steady = (
                    steady_decoders is not None and engine.running and not self.warm_requests
                )
                steady = steady_decoders.plan_step(now) if may_be_steady else None
                if steady is not None:
                    step_us = decode_step_time(steady[0], steady[1])
                else:
                    # If tried, the steady plan changed nothing; plan_step would try it again.
                    batch = (
                        engine.plan_general_step(now) if may_be_steady else engine.plan_step(now)
                    )
                    if not self._runnable(batch, now):
                        if self._lagged:  # nothing planned to miss: they join the next plan
                            self.release_lagged(all_of_them=True)
                            continue
                        if batch is not None:
                            # Nothing to compute until a prefix arrives from the CPU tier (or
                            # a request).
                            self._idle = PriorityEvent(env, priority)
                            yield self._idle
                            self._idle = None
                        continue
                    if batch.batch_size:
                        empty_steps = 0
                    else:
                        empty_steps += 1
                        if empty_steps >= STALLED_STEPS_LIMIT:
                            stalled(engine, self.instance_id, env.now, empty_steps)
                    if engine.preemption_count - checkpoint_preemptions >= STALLED_STEPS_LIMIT:
                        progress = (engine.total_output_tokens, engine.completed_count)
                        if progress == checkpoint_progress:
                            thrashing(
                                engine,
                                self.instance_id,
                                env.now,
                                engine.preemption_count - checkpoint_preemptions,
                            )
                        checkpoint_preemptions = engine.preemption_count
                        checkpoint_progress = progress
                    step_us = step_time(batch) + batch.extra_us
                    if self.warm_requests:
                        step_us += self._warm_up_extra_us(batch)
            if self._lagged:
                self.release_lagged()  # before coalescing: the queue is no longer empty
            end_us = now + step_us
            # finish_quiet_steps' own first test, made here: in a busy cluster another event
            # nearly always comes first, and the call would be all the work.
            if end_us < peek() and self.coalesce_steps and not self.warm_requests:
                end_us, step_us = finish_quiet_steps(self, end_us, step_us)
            self._inflight_end_us = end_us
            yield step_timeout(env, end_us - now)
            if self.terminated:
                return  # the instance went away mid-step; its requests were settled then
            now = end_us  # env.now, which the timeout just reached
            # A step of steady requests alone is finished, and the next one planned if it is
            # such a step too, in one call; warm-up requests need the general plan's pricing.
            planned_us = (
                -1
                if self.warm_requests or steady_decoders is None
                else steady_decoders.finish_and_plan(step_us, decode_step_time)
            )
            if planned_us < 0:
                for req in engine.finish_step(step_us):
                    on_finished(req)
                planned_us = 0
            if self.check_invariants:
                check_step(engine, self.instance_id, env.now)
