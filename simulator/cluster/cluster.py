"""Builds one SimPy environment with the workload source and the instances, and runs it.

For now every request goes to instance 0 (single instance); routing across instances is added
with the cluster layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import simpy

from ..engine.batching import EngineConfig, VLLMEngine
from ..engine.instance import Instance
from ..engine.request import Request, RequestState
from ..latency.base import StepTimeModel
from ..metrics.results import Result, compute_summary


def _source(env: simpy.Environment, requests: Sequence[Request], deliver: Callable):
    """Inject each request at its arrival time (requests sorted by arrival)."""
    for req in requests:
        delay = req.arrival_us - env.now
        if delay > 0:
            yield env.timeout(delay)
        deliver(req)


def run_simulation(
    requests: Sequence[Request],
    engine_config: EngineConfig,
    step_model: StepTimeModel,
    horizon_us: int | None = None,
    scenario: dict | None = None,
    check_invariants: bool = False,
) -> Result:
    """Simulate `requests` on one instance until all finish or the horizon passes."""
    ordered = sorted(requests, key=lambda r: (r.arrival_us, r.index))
    env = simpy.Environment()
    engine = VLLMEngine(engine_config, step_model.output_token_processing_us())
    instance_id = "instance_0"
    instance = Instance(
        env, instance_id, engine, step_model, lambda _r: None, horizon_us, check_invariants
    )
    inbox_put = instance.inbox.put
    env.process(_source(env, ordered, inbox_put))
    if horizon_us is None:
        env.run()
    else:
        env.run(until=horizon_us + 1)
    sim_end_us = engine.clock_us if horizon_us is None else min(engine.clock_us, horizon_us)
    arrived = [r for r in ordered if horizon_us is None or r.arrival_us <= horizon_us]
    # Requests that arrived but were not yet enqueued (alpha delay) count as queued.
    pending = sum(1 for r in arrived if r.state is RequestState.CREATED)
    summary = compute_summary("cluster", arrived, [engine], sim_end_us, pending)
    return Result(
        summary=summary,
        request_records=list(ordered),
        engines=[engine],
        instance_ids=[instance_id],
        scenario=scenario or {},
        not_arrived=len(ordered) - len(arrived),
    )
