"""One serving instance as SimPy processes: an intake that enqueues and a step loop.

The processes are thin: every rule lives in `VLLMEngine` (batching) and the step-time model.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from ..latency.base import StepTimeModel
from .batching import EnqueueOutcome, VLLMEngine
from .events import (
    ARRIVAL,
    INSTANCE_PRIORITY_STRIDE,
    STEP,
    TIMEOUT,
    event_after,
    trigger_with_priority,
)
from .request import Request

# Step coalescing (see `_step_loop`): on by default; tests switch it off to check that
# results are identical either way. Read when an instance is built.
COALESCE_STEPS = True


class Instance:
    """A vLLM replica: `inbox` receives routed requests; finished ones go to `on_finished`."""

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
    ) -> None:
        self.env = env
        self.instance_id = instance_id
        self.engine = engine
        self.step_model = step_model
        self.on_finished = on_finished
        self.horizon_us = horizon_us
        self.check_invariants = check_invariants
        # Simultaneous events of different instances run in instance order (SPEC §6.1).
        self.index = index
        offset = INSTANCE_PRIORITY_STRIDE * index
        self._arrival_priority = ARRIVAL + offset
        self._step_priority = STEP + offset
        self._timeout_priority = TIMEOUT + offset
        self.inbox: simpy.Store = simpy.Store(env)
        self.pending_enqueue: set[Request] = set()
        self._idle: simpy.Event | None = None
        self.host_link = None  # created on the first CPU-tier reload
        self._reload_ids = 0
        # Coalescing needs every step's effects to stay inside the engine; CPU-tier reloads
        # start link transfers, so instances with a CPU tier step one event at a time.
        self.coalesce_steps = COALESCE_STEPS and engine.kv.cpu is None
        env.process(self._intake())
        env.process(self._step_loop())

    def _intake(self):
        env = self.env
        queueing = self.step_model.queueing_time_us
        while True:
            req = yield self.inbox.get()
            req.instance_id = self.instance_id
            delay = queueing(req.input_tokens)
            if delay > 0:
                # The alpha overhead: the request is at the instance but not yet schedulable.
                self.pending_enqueue.add(req)
                event_after(env, delay, self._arrival_priority).callbacks.append(
                    lambda _ev, r=req: self._enqueue(r)
                )
            else:
                self._enqueue(req)

    def deliver_resident(self, req: Request) -> bool:
        """A decode sub-request arriving with its prompt KV (transfer done). False when the
        prompt's KV does not fit here: the request is dropped (at decode KV)."""
        req.instance_id = self.instance_id
        outcome = self.engine.enqueue_resident(req, self.env.now)
        if outcome is EnqueueOutcome.DROPPED:
            return False
        self._after_enqueue(req, outcome)
        return True

    def _enqueue(self, req: Request) -> None:
        self.pending_enqueue.discard(req)
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
        if self.engine.cancel(req, self.env.now):
            self.on_finished(req)

    def _wake(self) -> None:
        idle = self._idle
        if idle is not None and not idle.triggered:
            # Wake at STEP priority so every request arriving this microsecond joins the step.
            trigger_with_priority(self.env, idle, self._step_priority)

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

    def _step_loop(self):
        env = self.env
        engine = self.engine
        step_time = self.step_model.step_time_us
        on_finished = self.on_finished
        priority = self._step_priority
        while True:
            if not engine.has_work:
                self._idle = env.event()
                yield self._idle
                self._idle = None
            batch = engine.plan_step(env.now)
            if batch is None:
                continue
            if engine.new_reloads:
                self._start_reloads()
            if batch.batch_size == 0 and engine.waiting_on_reloads:
                # Nothing to compute until a prefix arrives from the CPU tier (or a request).
                engine.reload_idle_us.append(env.now)
                self._idle = env.event()
                yield self._idle
                self._idle = None
                continue
            step_us = step_time(batch) + batch.extra_us
            end_us = env.now + step_us
            if self.coalesce_steps:
                end_us, step_us = self._run_ahead(end_us, step_us)
            yield event_after(env, end_us - env.now, priority)
            for req in engine.finish_step(step_us):
                on_finished(req)
            if self.check_invariants:
                engine.check_invariants()

    def _run_ahead(self, end_us: int, step_us: int) -> tuple[int, int]:
        """Run the planned step, and the ones after it, without a SimPy event each, for as long
        as a step completes no request and ends before any other event in the simulation.

        Nothing else can happen while such a step runs, so finishing it here, at once, gives
        the same steps (times, log rows) and request timestamps as waiting for its event.
        Returns the end and duration of the first step that does need its event.
        """
        env = self.env
        engine = self.engine
        queue = env._queue  # noqa: SLF001 - SimPy's event heap: (time, priority, id, event)
        priority = self._step_priority
        step_time = self.step_model.step_time_us
        # No completion means the work left after the step is the work there is now.
        while (
            engine.has_work
            and not engine.may_finish_requests()
            and (not queue or (end_us, priority) < (queue[0][0], queue[0][1]))
        ):
            finished = engine.finish_step(step_us)
            assert not finished, "a coalesced step completed a request"
            if self.check_invariants:
                engine.check_invariants()
            batch = engine.plan_step(end_us)
            assert batch is not None and not engine.new_reloads
            step_us = step_time(batch) + batch.extra_us
            end_us += step_us
        return end_us, step_us
