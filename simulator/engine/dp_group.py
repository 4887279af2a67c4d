"""Data-parallel attention ranks stepping together (docs/parallelism.md "Data-parallel ranks").

vLLM runs an MoE model with `--data-parallel-size` dp as dp engine cores, each with its own
scheduler, waiting queue and KV cache, that execute every forward pass together: the expert
layers exchange tokens between the ranks (all-to-all), so no rank can start step k + 1 before
all have finished step k. While any rank has work, every rank steps; a rank with nothing to
run executes a dummy batch so the collectives complete. The group's step therefore lasts as
long as its slowest rank's.

Each rank is an `Instance` (intake, inbox, engine, timeouts: its own actor); the group is one
SimPy process that plans every rank's batch at the step boundary, waits once for the slowest,
and finishes every rank's step at the common end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import simpy

from ..invariants import STALLED_STEPS_LIMIT, stalled
from ..latency.base import StepBatch, StepTimeModel
from .events import PriorityEvent, timeout_at_priority

if TYPE_CHECKING:
    from .instance import Instance

# What an idle rank runs so the step's collectives complete: one token of decode.
DUMMY_BATCH = StepBatch([], 1, 1, [], 0)


def lockstep_step_us(rank_step_us: Sequence[int | None], dummy_step_us: int) -> int:
    """The duration of one lockstep step: the longest of the ranks' own step times (None for
    a rank with nothing to run, which runs the dummy batch instead); 0 when no rank runs."""
    running = [us for us in rank_step_us if us is not None]
    if not running:
        return 0
    if len(running) < len(rank_step_us):
        running.append(dummy_step_us)
    return max(running)


class LockstepGroup:
    """The dp ranks of one instance as one stepping process. Ranks `join` in rank order; the
    process starts with the first. A rank that gets work calls `wake`."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        step_model: StepTimeModel,
        priority: int,
    ) -> None:
        self.env = env
        self.name = name
        self.step_model = step_model
        self.priority = priority
        self.ranks: list[Instance] = []
        self.dummy_step_us = step_model.step_time_us(DUMMY_BATCH)
        self.lockstep_steps = 0  # steps the group took
        self.dummy_rank_steps = 0  # rank-steps spent on a dummy batch
        self._idle: simpy.Event | None = None

    def join(self, rank: Instance) -> None:
        self.ranks.append(rank)
        if len(self.ranks) == 1:
            self.env.process(self._run())

    def wake(self) -> None:
        idle = self._idle
        if idle is not None and not idle.triggered:
            idle.succeed()

    def _run(self):
        env = self.env
        step_timeout = timeout_at_priority(self.priority)
        ranks = self.ranks
        empty_steps = 0
        while True:
            for rank in ranks:
                if rank.lagged and not rank.has_work:
                    rank.release_lagged(all_of_them=True)
            if not any(rank.has_work for rank in ranks):
                self._idle = PriorityEvent(env, self.priority)
                yield self._idle
                self._idle = None
            now_us = env.now
            batches = [rank.plan_rank_step(now_us) for rank in ranks]
            if all(batch is None for batch in batches):
                if any(rank.lagged for rank in ranks):  # no plan to miss: they join the next
                    for rank in ranks:
                        rank.release_lagged(all_of_them=True)
                    continue
                if any(rank.has_work for rank in ranks):
                    # Only CPU-tier reloads are pending: wait for one (it wakes its rank).
                    self._idle = PriorityEvent(env, self.priority)
                    yield self._idle
                    self._idle = None
                continue
            if any(batch is not None and batch.batch_size for batch in batches):
                empty_steps = 0
            else:
                empty_steps += 1
                if empty_steps >= STALLED_STEPS_LIMIT:
                    rank = next(r for r, b in zip(ranks, batches, strict=True) if b is not None)
                    stalled(rank.engine, rank.instance_id, now_us, empty_steps)
            step_us = lockstep_step_us(
                [
                    None if batch is None else rank.price_rank_step(batch)
                    for rank, batch in zip(ranks, batches, strict=True)
                ],
                self.dummy_step_us,
            )
            self.lockstep_steps += 1
            self.dummy_rank_steps += sum(batch is None for batch in batches)
            end_us = now_us + step_us
            for rank in ranks:
                rank.release_lagged()
                rank.step_in_flight(end_us)
            yield step_timeout(env, step_us)
            for rank, batch in zip(ranks, batches, strict=True):
                if batch is not None:
                    rank.finish_rank_step(step_us)
