"""Builds one SimPy environment with the workload source and the instances, and runs it.

For now every request goes to instance 0 (single instance); routing across instances is added
with the cluster layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import simpy

from ..engine.batching import EngineConfig, VLLMEngine
from ..engine.events import ARRIVAL, event_after
from ..engine.instance import Instance
from ..engine.request import Request, RequestState
from ..latency.base import StepTimeModel
from ..metrics.results import Result, compute_summary
from ..workload.generator import SessionManager


class _Source:
    """Injects requests at their arrival times from a (possibly lazy) arrival-ordered stream."""

    def __init__(self, requests: Iterable[Request], horizon_us: int | None) -> None:
        self.requests = requests
        self.horizon_us = horizon_us
        self.injected: list[Request] = []
        self.not_arrived = 0

    def run(self, env: simpy.Environment, deliver: Callable[[Request], None]):
        horizon = self.horizon_us
        injected = self.injected
        previous = 0
        for req in self.requests:
            if horizon is not None and req.arrival_us > horizon:
                self.not_arrived += 1
                continue
            if req.arrival_us < previous:
                raise ValueError(
                    f"requests must arrive in order: {req.request_id} at {req.arrival_us} µs "
                    f"after one at {previous} µs"
                )
            previous = req.arrival_us
            delay = req.arrival_us - env.now
            if delay > 0:
                yield env.timeout(delay)
            injected.append(req)
            deliver(req)


def run_simulation(
    requests: Iterable[Request],
    engine_config: EngineConfig,
    step_model: StepTimeModel,
    horizon_us: int | None = None,
    scenario: dict | None = None,
    check_invariants: bool = False,
    sessions: SessionManager | None = None,
) -> Result:
    """Simulate `requests` on one instance until all finish or the horizon passes.

    A list is sorted by arrival first; any other iterable must already be in arrival order
    (the workload generator's streams are). `sessions` receives every finished request and
    may answer with a follow-up round, injected at its arrival time.
    """
    if isinstance(requests, Sequence):
        requests = sorted(requests, key=lambda r: (r.arrival_us, r.index))
    env = simpy.Environment()
    engine = VLLMEngine(engine_config, step_model.output_token_processing_us())
    instance_id = "instance_0"
    source = _Source(requests, horizon_us)
    on_finished = _follow_ups(env, sessions, source) if sessions is not None else _ignore
    instance = Instance(
        env, instance_id, engine, step_model, on_finished, horizon_us, check_invariants
    )
    deliver = instance.inbox.put
    source.deliver = deliver
    env.process(source.run(env, deliver))
    if horizon_us is None:
        env.run()
    else:
        env.run(until=horizon_us + 1)
    sim_end_us = engine.clock_us if horizon_us is None else min(engine.clock_us, horizon_us)
    arrived = source.injected
    # Requests that arrived but were not yet enqueued (alpha delay) count as queued.
    pending = sum(1 for r in arrived if r.state is RequestState.CREATED)
    summary = compute_summary("cluster", arrived, [engine], sim_end_us, pending)
    return Result(
        summary=summary,
        request_records=arrived,
        engines=[engine],
        instance_ids=[instance_id],
        scenario=scenario or {},
        not_arrived=source.not_arrived,
        session_counts=sessions.finalize() if sessions is not None and sessions.sessions else {},
        horizon_us=horizon_us,
    )


def _ignore(_req: Request) -> None:
    return None


def _follow_ups(env: simpy.Environment, sessions: SessionManager, source: _Source):
    """Completion callback that injects closed-loop session rounds (INV-10)."""

    def on_finished(req: Request) -> None:
        finished_us = max(env.now, req.completion_us)
        nxt = sessions.on_finished(req, finished_us)
        if nxt is None:
            return

        def inject(_event, r=nxt) -> None:
            source.injected.append(r)
            source.deliver(r)

        event_after(env, nxt.arrival_us - env.now, ARRIVAL).callbacks.append(inject)

    return on_finished
