"""Builds one SimPy environment — workload source, router, instances — and runs it.

source --(router inbox Store)--> router --(instance inbox Store)--> instance step loops
   ^                                                                    |
   +---------------- closed-loop session follow-ups <-- finished -------+
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import simpy

from ..engine.batching import EngineConfig, VLLMEngine
from ..engine.events import ROUTER, event_after
from ..engine.instance import Instance
from ..engine.request import Request, RequestState
from ..latency.base import StepTimeModel
from ..metrics.results import Result, compute_summary
from ..rng import subsystem_rng
from ..scenario import ClusterSpec
from ..workload.generator import SessionManager
from .admission import AdmissionPolicy, make_admission_policy
from .decisions import DecisionTrace
from .router import Router
from .routing import RoutingPolicy, make_routing_policy
from .snapshot import InstanceSnapshot, SnapshotCache


class _Source:
    """Injects requests at their arrival times from a (possibly lazy) arrival-ordered stream."""

    def __init__(self, requests: Iterable[Request], horizon_us: int | None) -> None:
        self.requests = requests
        self.horizon_us = horizon_us
        self.injected: list[Request] = []
        self.not_arrived = 0
        self.deliver: Callable[[Request], None] = lambda _r: None

    def run(self, env: simpy.Environment):
        horizon = self.horizon_us
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
            self.inject(req)

    def inject(self, req: Request) -> None:
        self.injected.append(req)
        self.deliver(req)


def build_policies(
    cluster: ClusterSpec,
    rng: np.random.Generator,
    block_size: int,
    kv_probe: Callable[[int, Request], int],
) -> tuple[AdmissionPolicy, RoutingPolicy]:
    """The admission and routing policies a cluster spec names (raises ConfigError)."""
    admission = make_admission_policy(
        cluster.admission.policy,
        token_bucket_capacity=cluster.admission.token_bucket_capacity,
        token_bucket_refill_rate=cluster.admission.token_bucket_refill_rate,
    )
    routing = make_routing_policy(
        cluster.routing.policy,
        scorers=cluster.routing.scorers,
        rng=rng,
        block_size=block_size,
        kv_probe=kv_probe,
    )
    return admission, routing


def _live_snapshot(index: int, instance_id: str, engine: VLLMEngine, model: str):
    def read() -> InstanceSnapshot:
        kv = engine.kv
        return InstanceSnapshot(
            instance_id=instance_id,
            index=index,
            queue_depth=len(engine.waiting),
            batch_size=len(engine.running),
            kv_utilization=kv.used_blocks / kv.total_blocks,
            free_kv_blocks=kv.total_blocks - kv.used_blocks,
            cache_hit_rate=kv.hit_rate,
            model=model,
        )

    return read


def run_simulation(
    requests: Iterable[Request],
    engine_config: EngineConfig,
    step_model: StepTimeModel,
    horizon_us: int | None = None,
    scenario: dict | None = None,
    check_invariants: bool = False,
    sessions: SessionManager | None = None,
    cluster: ClusterSpec | None = None,
    seed: int = 42,
    model_name: str = "",
) -> Result:
    """Simulate `requests` on a cluster of identical instances until all finish or the
    horizon passes.

    A list is sorted by arrival first; any other iterable must already be in arrival order
    (the workload generator's streams are). `sessions` receives every finished request and may
    answer with a follow-up round, which re-enters through the router at its arrival time.
    """
    cluster = cluster or ClusterSpec()
    if isinstance(requests, Sequence):
        requests = sorted(requests, key=lambda r: (r.arrival_us, r.index))
    env = simpy.Environment()
    n = cluster.num_instances
    instance_ids = [f"instance_{i}" for i in range(n)]
    engines = [VLLMEngine(engine_config, step_model.output_token_processing_us()) for _ in range(n)]
    source = _Source(requests, horizon_us)
    finished = _on_finished(env, sessions, source)

    def kv_probe(index: int, req: Request) -> int:
        return len(engines[index].kv.cached_prefix_blocks(req, req.input_tokens))

    trace = DecisionTrace(cluster.trace.level, cluster.trace.counterfactual_k)
    snapshots = SnapshotCache(
        cluster.routing.snapshot_refresh_interval_us,
        lambda i: live[i](),
        lambda i: router.in_flight[i],
        [(iid, model_name) for iid in instance_ids],
    )
    live = [_live_snapshot(i, instance_ids[i], engines[i], model_name) for i in range(n)]
    instances: list[Instance] = []
    router = Router(
        env,
        *build_policies(cluster, subsystem_rng(seed, "router"), engine_config.block_size, kv_probe),
        snapshots,
        [lambda r, i=i: instances[i].inbox.put(r) for i in range(n)],
        instance_ids,
        model_name,
        finished,
        trace,
        cluster.admission.latency_us,
        cluster.routing.latency_us,
    )
    for i, engine in enumerate(engines):

        def on_instance_finished(req: Request, index: int = i) -> None:
            router.finished(index)
            finished(req)

        instances.append(
            Instance(
                env,
                instance_ids[i],
                engine,
                step_model,
                on_instance_finished,
                horizon_us,
                check_invariants,
                index=i,
            )  # fmt: skip
        )
    source.deliver = router.inbox.put
    env.process(source.run(env))
    if horizon_us is None:
        env.run()
    else:
        env.run(until=horizon_us + 1)

    def end_of(engine: VLLMEngine) -> int:
        return engine.clock_us if horizon_us is None else min(engine.clock_us, horizon_us)

    arrived = source.injected
    handled = [r for r in arrived if r.state is not RequestState.REJECTED]
    # Arrived but not yet enqueued anywhere (router latency, alpha delay) counts as queued.
    pending = sum(1 for r in handled if r.state is RequestState.CREATED)
    summary = compute_summary("cluster", handled, engines, max(end_of(e) for e in engines), pending)
    per_instance = []
    if n > 1:
        for iid, engine in zip(instance_ids, engines, strict=True):
            mine = [r for r in handled if r.instance_id == iid]
            waiting = sum(1 for r in mine if r.state is RequestState.CREATED)
            per_instance.append(compute_summary(iid, mine, [engine], end_of(engine), waiting))
    return Result(
        summary=summary,
        request_records=arrived,
        engines=engines,
        instance_ids=instance_ids,
        scenario=scenario or {},
        not_arrived=source.not_arrived,
        session_counts=sessions.finalize() if sessions is not None and sessions.sessions else {},
        horizon_us=horizon_us,
        instance_summaries=per_instance,
        admission_rejections=router.admission_rejections,
        routing_rejections=router.routing_rejections,
        routed=list(router.routed),
        in_flight_at_end=list(router.in_flight),
        decisions=trace,
    )


def _on_finished(env: simpy.Environment, sessions: SessionManager | None, source: _Source):
    """Callback for every request that leaves the system (completed, dropped, timed out or
    rejected): closed-loop sessions may answer with their next round (INV-10)."""

    def on_finished(req: Request) -> None:
        if sessions is None:
            return
        finished_us = max(env.now, req.completion_us)
        nxt = sessions.on_finished(req, finished_us)
        if nxt is not None:
            event_after(env, nxt.arrival_us - env.now, ROUTER).callbacks.append(
                lambda _e, r=nxt: source.inject(r)
            )

    return on_finished
