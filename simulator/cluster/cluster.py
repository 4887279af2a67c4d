"""Builds one SimPy environment — workload source, router, instances — and runs it.

source --(router inbox Store)--> router --(instance inbox Store)--> instance step loops
   ^                                                                    |
   +---------------- closed-loop session follow-ups <-- finished -------+
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import simpy

from ..collector import fewer_collections
from ..engine.batching import EngineConfig, VLLMEngine
from ..engine.dp_group import LockstepGroup
from ..engine.events import INSTANCE_PRIORITY_STRIDE, ROUTER, STEP, Environment, event_after
from ..engine.instance import Instance
from ..engine.options import ACCELERATED, EngineOptions
from ..engine.request import Request, RequestState
from ..errors import in_field
from ..invariants import check_finished, check_run
from ..invariants import requested as invariants_requested
from ..latency.base import StepTimeModel
from ..limits import MAX_INSTANCES
from ..metrics.instance_record import InstanceRecord, capture_instance
from ..metrics.request_table import RequestRecords, RequestTable, request_stats, served_stats
from ..metrics.results import Result
from ..metrics.slo import SloPolicy, slo_report
from ..metrics.steady import judge
from ..metrics.summary import compute_summary
from ..metrics.views.instances import created_slots
from ..rng import subsystem_rng
from ..scenario import ClusterSpec, PDSpec
from ..workload.generator import SessionManager
from .admission import AdmissionPolicy, make_admission_policy
from .decisions import DecisionTrace
from .prefix_index import CacheSignalView
from .router import Router, ServedModels
from .routing import (
    SCORERS_FIELD,
    RoutingPolicy,
    check_routing_policy_name,
    kv_probe_from_caches,
    make_routing_policy,
)
from .snapshot import InstanceSnapshot, SnapshotCache

if TYPE_CHECKING:
    # Node lifecycles and prefill/decode disaggregation are imported by the runs that have a
    # dynamic fleet or disaggregate (start-up of the others).
    from ..deployment import Deployment
    from ..metrics.fleet_record import FleetRecord
    from ..metrics.pd_record import PDRecord
    from .disaggregation import PDDecider
    from .infrastructure import FleetPlan, Infrastructure
    from .pd import Disaggregator


class _Source:
    """Injects requests at their arrival times from a (possibly lazy) arrival-ordered stream."""

    def __init__(
        self,
        requests: Iterable[Request],
        horizon_us: int | None,
        table: RequestTable | None,
        max_in_flight: int | None = None,
    ) -> None:
        self.requests = requests
        self.horizon_us = horizon_us
        # A load generator's cap on outstanding requests (a trace's `max_in_flight`): a
        # request whose time has come waits for one of these slots, then is sent.
        self.max_in_flight = max_in_flight
        self.slots: simpy.Container | None = None
        self.client_delayed = 0  # requests sent after their scheduled time for want of a slot
        self.client_wait_us = 0
        # With a table, finished requests become rows there (`retire`) and only unfinished
        # ones stay objects here, keyed by id with their injection ordinal; without one
        # (compaction off) every request stays in `injected`.
        self.table = table
        self.injected: list[Request] = []
        self.injected_count = 0
        self.live: dict[int, tuple[int, Request]] = {}
        self.not_arrived = 0
        # Requests due before the horizon still waiting for a client slot when it came: the
        # client never sent them (`count_unsent`).
        self.client_unsent = 0
        self._stream: Iterator[Request] | None = None
        self._held: Request | None = None  # the request waiting for a slot now
        self.exhausted = False  # every request of the stream has been injected
        self.finished = 0  # user-facing requests that left the system (any final state)
        # Closed-loop follow-ups made but not yet arrived: until they do the traffic is not
        # over, though the stream is exhausted and every request so far finished.
        self.follow_ups_due = 0
        self.deliver: Callable[[Request], None] = lambda _r: None

    def run(self, env: simpy.Environment):
        horizon = self.horizon_us
        previous = 0
        if self.max_in_flight is not None:
            self.slots = simpy.Container(env, capacity=self.max_in_flight, init=self.max_in_flight)
        self._stream = iter(self.requests)
        for req in self._stream:
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
            if self.slots is not None:
                self._held = req
                yield self.slots.get(1)
                self._held = None
                if env.now > req.arrival_us:
                    if horizon is not None and env.now > horizon:
                        self.not_arrived += 1
                        self.slots.put(1)
                        continue
                    self._send_late(req, int(env.now))
            self.inject(req)
        self.exhausted = True

    def count_unsent(self) -> None:
        """After a run its horizon cut while the client waited for a slot: every request the
        source never reached is counted, as due before the horizon and never sent (the one
        waiting, and those after it up to the horizon) or as not arrived (after it)."""
        if self.exhausted or self._stream is None:
            return
        if self._held is not None:
            self.client_unsent += 1
            self._held = None
        horizon = self.horizon_us
        for req in self._stream:
            if horizon is not None and req.arrival_us > horizon:
                self.not_arrived += 1
            else:
                self.client_unsent += 1

    def _send_late(self, req: Request, now_us: int) -> None:
        """The client sends `req` when a slot frees: latency is measured from the send, as a
        real client measures it, and a deadline keeps its distance from the send."""
        wait_us = now_us - req.arrival_us
        self.client_delayed += 1
        self.client_wait_us += wait_us
        if req.deadline_us:
            req.deadline_us += wait_us
        req.arrival_us = now_us
        req.client_wait_us = wait_us

    def release_slot(self, req: Request) -> None:
        """A user-facing request left the system: its client slot is free again."""
        if self.slots is not None and req.parent is None:
            self.slots.put(1)

    def inject(self, req: Request) -> None:
        if self.table is None:
            self.injected.append(req)
        else:
            self.live[id(req)] = (self.injected_count, req)
        self.injected_count += 1
        self.deliver(req)

    def retire(self, req: Request) -> None:
        """A request has left the system: keep it as a compact row from now on."""
        if self.table is not None and req.is_finished:
            entry = self.live.pop(id(req), None)
            if entry is not None:
                self.table.append(req, entry[0])

    def records(self) -> list[Request] | RequestRecords:
        """Every request that arrived, in injection order."""
        if self.table is None:
            return self.injected
        return RequestRecords(self.table, list(self.live.values()))


def build_policies(
    cluster: ClusterSpec,
    rng: np.random.Generator,
    block_size: int,
    kv_probe: Callable[[int, Request], int],
    options: EngineOptions = ACCELERATED,
) -> tuple[AdmissionPolicy, RoutingPolicy]:
    """The admission and routing policies a cluster spec names (raises ConfigError)."""
    with in_field("cluster.admission.policy"):
        admission = make_admission_policy(
            cluster.admission.policy,
            token_bucket_capacity=cluster.admission.token_bucket_capacity,
            token_bucket_refill_rate=cluster.admission.token_bucket_refill_rate,
        )
    with in_field("cluster.routing.policy"):
        check_routing_policy_name(cluster.routing.policy)
    routing = make_routing_policy(
        cluster.routing.policy,
        scorers=cluster.routing.scorers,
        rng=rng,
        block_size=block_size,
        kv_probe=kv_probe,
        private_blocks_by_count=options.private_blocks_by_count,
    )
    return admission, routing


def decider_for(spec: PDSpec, block_size: int) -> PDDecider:
    """The PD decider a spec names; unset thresholds take the decider defaults."""
    from .disaggregation import make_decider

    # The registry's error names the decider but not where it was given (scenario or
    # --pd-decider both set this field).
    with in_field("cluster.pd.decider"):
        return make_decider(
            spec.decider,
            prefix_threshold=spec.prefix_threshold,
            prefix_mode=spec.prefix_mode,
            prompt_length_threshold=spec.prompt_length_threshold,
            block_size=block_size,
        )


_NO_ADAPTERS: frozenset[str] = frozenset()


def _live_snapshots(instance_ids: list[str], engines: list[VLLMEngine], models: list[str]):
    """read(index, in_flight): what instance `index` looks like now; `read.many(indices,
    in_flights)`: the same for each of `indices` (with its in-flight count), in one loop.

    The router reads every candidate for every request (64 per request in case (g)), so
    `many` builds them without a Python call per candidate: every field is re-read from the
    engine each time (nothing is cached), `KVCache.hit_rate` is computed inline, and the
    tuple is made by `tuple.__new__` rather than the NamedTuple's Python-level `__new__`
    (the same object: fields in order)."""
    new = tuple.__new__

    def many(indices: Iterable[int], in_flights: Iterable[int]) -> list[InstanceSnapshot]:
        out = []
        for index, in_flight in zip(indices, in_flights, strict=True):
            engine = engines[index]
            kv = engine.kv
            used, total = kv.used_blocks, kv.total_blocks
            hits = kv.cache_hits
            lookups = hits + kv.cache_misses
            lora = engine.lora
            out.append(
                new(
                    InstanceSnapshot,
                    (
                        instance_ids[index],
                        index,
                        len(engine.waiting),  # queue_depth
                        len(engine.running),  # batch_size
                        used / total,  # kv_utilization
                        total - used,  # free_kv_blocks
                        hits / lookups if lookups else 0.0,  # cache_hit_rate (KVCache.hit_rate)
                        in_flight,
                        models[index],
                        lora.resident if lora is not None else _NO_ADAPTERS,
                    ),
                )
            )
        return out

    def read(index: int, in_flight: int) -> InstanceSnapshot:
        return many((index,), (in_flight,))[0]

    read.many = many  # type: ignore[attr-defined]
    return read


@dataclass(frozen=True)
class InstanceSetup:
    """What one instance is: its engine knobs, its step-time model and its pool role."""

    engine: EngineConfig
    step_model: StepTimeModel
    role: str = "unified"  # unified | prefill | decode
    # Data-parallel attention ranks: the instance runs dp schedulers in lockstep, each a
    # routable target of its own (engine/dp_group.py).
    dp: int = 1
    # The resolved deployment the instance runs (its model, GPU and layout: a PD transfer is
    # sized from the prefill pool's), when its planner knows it; not part of its identity.
    deployment: Deployment | None = field(default=None, compare=False, repr=False)


def rank_layout(
    setups: Sequence[InstanceSetup],
) -> tuple[list[InstanceSetup], list[str], list[int]]:
    """Instances as the ranks that serve: one setup per rank, its id (`instance_3`, or
    `instance_3.dp1` for rank 1 of a data-parallel instance) and the index of the instance it
    belongs to."""
    ranks: list[InstanceSetup] = []
    ids: list[str] = []
    owners: list[int] = []
    for i, setup in enumerate(setups):
        for r in range(setup.dp):
            ranks.append(setup)
            ids.append(f"instance_{i}" if setup.dp == 1 else f"instance_{i}.dp{r}")
            owners.append(i)
    return ranks, ids, owners


@fewer_collections()
def run_simulation(
    requests: Iterable[Request],
    engine_config: EngineConfig | None = None,
    step_model: StepTimeModel | None = None,
    horizon_us: int | None = None,
    scenario: dict | None = None,
    check_invariants: bool = False,
    sessions: SessionManager | None = None,
    cluster: ClusterSpec | None = None,
    seed: int = 42,
    model_name: str = "",
    setups: list[InstanceSetup] | None = None,
    pd_kv_bytes_per_token: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    fleet: FleetPlan | None = None,
    max_in_flight: int | None = None,
    options: EngineOptions = ACCELERATED,
    on_end: Callable[[list[VLLMEngine]], None] | None = None,
    end_checks: bool = False,
) -> Result:
    """Simulate `requests` on a cluster until all finish or the horizon passes.

    Instances are `setups` (one per instance, e.g. per PD pool), or `cluster.num_instances`
    copies of (`engine_config`, `step_model`). A list of requests is sorted by arrival first;
    any other iterable must already be in arrival order (the workload generator's streams
    are). `sessions` receives every finished user-facing request and may answer with a
    follow-up round, which re-enters through the router at its arrival time. `fleet` makes
    the fleet change while traffic flows (node pools, lifecycle, events, autoscaling, several
    models); without it every instance serves `model_name` and is routable from t = 0.
    `max_in_flight` caps the user-facing requests outstanding at once, as a load generator
    with that many connections does: a request due while all are busy is sent when one frees.
    `options` chooses the exact accelerations (all off: `EngineOptions(reference=True)`).
    The result keeps plain end-of-run records, never a live object: each engine's
    (`Result.engines`), the PD flow's (`Result.pd`) and the changing fleet's
    (`Result.infrastructure`). `end_checks` runs the end-of-run laws with the live engines'
    own self-checks (`invariants.check_run(result, engines)`) without the per-step checks
    of `check_invariants`, which runs them too; `on_end` is called with the live engines once
    the run has ended, for tests of their internal state.
    """
    cluster = cluster or ClusterSpec()
    check_invariants = invariants_requested(check_invariants)
    if setups is None:
        setups = [InstanceSetup(engine_config, step_model)] * cluster.num_instances
    if isinstance(requests, Sequence):
        requests = sorted(requests, key=lambda r: (r.arrival_us, r.index))
    env = Environment()
    if fleet is not None:
        n = len(setups)
        instance_ids = [slot.instance_id for slot in fleet.slots]
        # Untagged requests go to the first deployment's model (docs/infrastructure.md):
        # `model_aliases` is keyed in deployment order, while the first slot belongs to
        # whichever deployment has the first instance.
        served = ServedModels(next(iter(fleet.model_aliases), fleet.slots[0].model_key))
        for key, aliases in fleet.model_aliases.items():
            served.add_model(key, *aliases)
        instance_models = [slot.model_key for slot in fleet.slots]
        owners = list(range(n))
    else:
        # From here on, every routable target is a rank (an instance without dp is one).
        setups, instance_ids, owners = rank_layout(setups)
        n = len(setups)
        served = ServedModels.fixed(model_name, n)
        instance_models = [model_name] * n

    def new_engine(setup: InstanceSetup, instance_id: str) -> VLLMEngine:
        engine = VLLMEngine(
            setup.engine,
            setup.step_model.output_token_processing_us(),
            setup.step_model.post_decode_overhead_us(),
            options,
        )
        if engine.speculation is not None:  # each instance draws acceptances from its own stream
            engine.seed_speculation(subsystem_rng(seed, f"speculative/{instance_id}"))
        return engine

    engines = [new_engine(s, iid) for s, iid in zip(setups, instance_ids, strict=True)]
    block_size = setups[0].engine.block_size
    # Finished requests become compact rows (PD parents with their sub-requests' fields).
    compact = options.compact_finished_requests
    source = _Source(requests, horizon_us, RequestTable() if compact else None, max_in_flight)
    for engine in engines:
        engine.keep_completed = source.table is None
    finished = _on_finished(env, sessions, source, check_invariants)

    signal_delay_us = cluster.routing.cache_signal_delay_us or 0
    cache_view: CacheSignalView | None = None
    if signal_delay_us > 0:
        # The router's view of the prefix caches lags them (BLIS's --cache-signal-delay).
        cache_view = CacheSignalView(
            # An instance without prefix caching reuses nothing it holds: the router sees none.
            lambda i: engines[i].kv.hash_index if engines[i].config.enable_prefix_caching else {},
            n,
            block_size,
            signal_delay_us,
            lambda: env.now,
            lambda i: not instances[i].terminated,
        )
        kv_probe = cache_view.probe
    else:
        kv_probe = kv_probe_from_caches(
            lambda i: engines[i].kv, lambda i: engines[i].config.enable_prefix_caching
        )

    trace = DecisionTrace(cluster.trace.level, cluster.trace.counterfactual_k)
    instances: list[Instance] = []
    admission, routing = build_policies(
        cluster, subsystem_rng(seed, "router"), block_size, kv_probe, options
    )
    pd = _build_pd(
        cluster,
        env,
        seed,
        block_size,
        kv_probe,
        trace,
        pd_kv_bytes_per_token,
        options,
        [s.role for s in setups],
    )
    if pd is not None:
        pd.private_subs = fleet is None or not fleet.dynamic
        if source.table is not None:
            pd.keep_in(source.table)
    router = Router(
        env,
        admission,
        routing,
        SnapshotCache(
            cluster.routing.snapshot_refresh_interval_us,
            _live_snapshots(instance_ids, engines, instance_models),
            lambda i: router.in_flight[i],
            list(zip(instance_ids, instance_models, strict=True)),
        ),
        [lambda r, i=i: instances[i].inbox.put(r) for i in range(n)],
        instance_ids,
        served,
        finished,
        trace,
        cluster.admission.latency_us,
        cluster.routing.latency_us,
        pd,
    )

    def deliver_decode(sub: Request, index: int) -> bool:
        router.in_flight[index] += 1
        router.routed[index] += 1
        if instances[index].deliver_resident(sub):
            return True
        router.in_flight[index] -= 1
        return False

    infra: Infrastructure | None = None
    groups: dict[int, LockstepGroup] = {}

    def make_instance(i: int) -> Instance:
        engine, setup = engines[i], setups[i]
        group = None
        if setup.dp > 1:
            group = groups.get(owners[i])
            if group is None:
                group = groups[owners[i]] = LockstepGroup(
                    env,
                    f"instance_{owners[i]}",
                    setup.step_model,
                    STEP + INSTANCE_PRIORITY_STRIDE * i,
                )

        def on_instance_finished(req: Request, index: int = i) -> None:
            router.finished(index)
            if infra is not None and req.state is RequestState.COMPLETED:
                infra.on_completed(index)
            if req.pd_role:
                pd.on_sub_finished(req, env.now, deliver_decode, finished)
            else:
                finished(req)

        return Instance(
            env,
            instance_ids[i],
            engine,
            setup.step_model,
            on_instance_finished,
            horizon_us,
            check_invariants,
            index=i,
            coalesce_steps=options.coalesce_steps,
            lockstep=group,
        )  # fmt: skip

    instances.extend(make_instance(i) for i in range(n))

    def grow(deployment: str) -> int | None:
        """One more instance of `deployment`, made while the run goes on (its planned slots
        all used): a copy of the deployment's first slot at the next index, with its own
        engine, inbox and router bookkeeping. None once the run has made MAX_INSTANCES
        (a changing fleet has no data-parallel ranks: they are refused before the run)."""
        i = len(instances)
        if i >= MAX_INSTANCES:
            return None
        template = next(slot for slot in fleet.slots if slot.deployment == deployment)
        setup = setups[template.index]
        slot = replace(template, index=i, instance_id=f"instance_{i}", initial=False)
        fleet.slots.append(slot)
        setups.append(setup)
        instance_ids.append(slot.instance_id)
        instance_models.append(slot.model_key)
        engine = new_engine(setup, slot.instance_id)
        engine.keep_completed = source.table is None
        engines.append(engine)
        router.add_target(lambda r: instances[i].inbox.put(r), slot.instance_id, slot.model_key)
        if cache_view is not None:
            cache_view.add_instance()
        instances.append(make_instance(i))
        return i

    if fleet is not None and fleet.dynamic:
        from .infrastructure import Infrastructure

        infra = Infrastructure(
            env,
            fleet,
            instances,
            router,
            seed,
            lambda inst, req: inst.on_finished(req),
            # Over only with no session round still to come (infrastructure._run_over).
            lambda: (
                source.exhausted and not source.follow_ups_due,
                source.finished == source.injected_count,
            ),
            check_invariants,
            grow=grow,
        )
        infra.start()
    elif fleet is not None:
        for index in range(n):
            served.make_routable(instance_models[index], index)
    source.deliver = router.inbox.put
    env.process(source.run(env))
    if progress is None:
        if horizon_us is None:
            env.run()
        else:
            env.run(until=horizon_us + 1)
    else:
        _run_reporting(env, horizon_us, lambda: source.finished, progress)
    for engine in engines:
        engine.sync_lazy_progress()
    if source.slots is not None:
        source.count_unsent()
    if infra is not None:
        infra.warn_refused_scale_ups()
    if pd is not None:
        if horizon_us is not None:
            pd.link.settle(horizon_us)  # joins wait for the link's next wake-up to be applied
        pd.finalize()
    # The result keeps what each engine leaves behind, not the engine.
    records = [capture_instance(engine) for engine in engines]

    def end_of(engine: InstanceRecord) -> int:
        return engine.clock_us if horizon_us is None else min(engine.clock_us, horizon_us)

    arrived = source.records()
    # Read as columns: a million finished requests are rows, not objects.
    stats = request_stats(arrived)
    handled = stats.where(~stats.is_state(RequestState.REJECTED))
    summary = compute_summary("cluster", handled, records, max(end_of(e) for e in records))
    del stats, handled
    slo = slo_report(
        arrived,
        SloPolicy.from_scenario((scenario or {}).get("slo")),
        summary["vllm_estimated_duration_s"],
    )
    steady_state = judge(arrived)
    summary.update(
        offered_requests=slo["offered_requests"],
        goodput_rps=slo["goodput_rps"],
        goodput_tokens_per_s=slo["goodput_tokens_per_s"],
        slo_attainment=slo["slo_attainment"],
        steady_state=steady_state.verdict,
    )
    per_instance = []
    if len(engines) > 1:
        # Instance-level views count what each engine served: sub-requests, not parents.
        by_instance = served_stats(arrived, pd.parents if pd is not None else (), instance_ids)
        for i in created_slots(len(records), infra):  # not the slots the fleet never used
            record = records[i]
            per_instance.append(
                compute_summary(instance_ids[i], by_instance[i], [record], end_of(record))
            )
    result = Result(
        summary=summary,
        request_records=arrived,
        instance_records=records,
        instance_ids=instance_ids,
        scenario=scenario or {},
        not_arrived=source.not_arrived,
        slo=slo,
        steady_state=steady_state,
        client_delayed_requests=source.client_delayed,
        client_wait_us=source.client_wait_us,
        client_unsent_requests=source.client_unsent,
        session_counts=sessions.finalize() if sessions is not None and sessions.sessions else {},
        horizon_us=horizon_us,
        instance_summaries=per_instance,
        admission_rejections=router.admission_rejections,
        routing_rejections=router.routing_rejections,
        routed=list(router.routed),
        in_flight_at_end=list(router.in_flight),
        decisions=trace,
        pd=_pd_record(pd),
        instance_roles=[s.role for s in setups],
        infrastructure=_fleet_record(infra),
        instance_models=instance_models,
        parked_at_end=router.parked_now,
        fleet=fleet,
    )
    if check_invariants or end_checks:
        check_run(result, engines)
    if on_end is not None:
        on_end(engines)
    return result


def _build_pd(
    cluster: ClusterSpec,
    env: simpy.Environment,
    seed: int,
    block_size: int,
    kv_probe: Callable[[int, Request], int],
    trace: DecisionTrace,
    kv_bytes_per_token: float,
    options: EngineOptions = ACCELERATED,
    roles: Sequence[str] = (),
) -> Disaggregator | None:
    """The PD disaggregator; `roles` gives each routable target's pool (prefill ranks first,
    then decode, then unified: contiguous)."""
    spec = cluster.pd
    if not spec.enabled:
        return None
    from .kv_transfer import KVTransferLink
    from .pd import Disaggregator, Pools

    pools = Pools.from_roles(env, roles)

    def pool_policy(pool_scorers: str | None, role: str) -> RoutingPolicy:
        if pool_scorers:
            name, scorers = "weighted", pool_scorers
            field = f"cluster.pd.{role}.routing_scorers (--{role}-routing-scorers)"
        else:
            name, scorers = cluster.routing.policy, cluster.routing.scorers
            field = SCORERS_FIELD
        return make_routing_policy(
            name,
            scorers=scorers,
            scorers_field=field,
            rng=subsystem_rng(seed, f"{role}-router"),
            block_size=block_size,
            kv_probe=kv_probe,
            private_blocks_by_count=options.private_blocks_by_count,
        )

    return Disaggregator(
        pools,
        decider_for(spec, block_size),
        pool_policy(spec.prefill.routing_scorers, "prefill"),
        pool_policy(spec.decode.routing_scorers, "decode"),
        KVTransferLink(
            env,
            spec.transfer_bandwidth_gb_per_s,
            spec.transfer_base_latency_ms,
            contention=spec.transfer_contention,
            priority=ROUTER,
            slots=spec.transfer_slots,
        ),
        spec.kv_bytes_per_token or kv_bytes_per_token,
        kv_probe,
        block_size,
        trace,
    )


def _pd_record(pd: Disaggregator | None) -> PDRecord | None:
    if pd is None:
        return None
    from ..metrics.pd_record import capture_pd

    return capture_pd(pd)


PROGRESS_EVERY_US = 1_000_000


def _run_reporting(env, horizon_us, finished: Callable[[], int], progress) -> None:
    """Run, calling progress(now_us, finished) after each PROGRESS_EVERY_US of simulated time.

    Steps the environment event by event (`env.peek` / `env.step`, SimPy's public API), so the
    event heap and its order are exactly those of one uninterrupted `env.run`."""
    stop = horizon_us + 1 if horizon_us is not None else float("inf")
    peek, step = env.peek, env.step
    while (next_us := peek()) < stop:
        slice_end = min(next_us + PROGRESS_EVERY_US, stop)
        while peek() < slice_end:
            step()
        progress(int(env.now), finished())
    if stop != float("inf") and env.now < stop:
        env.run(until=stop)  # nothing left before it: the clock ends where env.run's would


def _on_finished(
    env: simpy.Environment,
    sessions: SessionManager | None,
    source: _Source,
    check_invariants: bool = False,
):
    """Callback for every request that leaves the system (completed, dropped, timed out or
    rejected): closed-loop sessions may answer with their next round (INV-10)."""

    def on_finished(req: Request) -> None:
        source.finished += 1
        source.release_slot(req)
        req.forget_block_hashes()
        if check_invariants:
            check_finished(req, env.now)
        if sessions is not None:
            finished_us = max(env.now, req.completion_us)
            # env.now is the end of the step that finished it: closed-loop users think from there.
            nxt = sessions.on_finished(req, finished_us, int(env.now))
            if nxt is not None:
                source.follow_ups_due += 1

                def arrive(_e, r: Request = nxt) -> None:
                    source.follow_ups_due -= 1
                    source.inject(r)

                event_after(env, nxt.arrival_us - env.now, ROUTER).callbacks.append(arrive)
        source.retire(req)

    return on_finished


def _fleet_record(infra: Infrastructure | None) -> FleetRecord | None:
    """The run's nodes and instance lifecycles (`Result.infrastructure`), None without a
    dynamic fleet."""
    if infra is None:
        return None
    from ..metrics.fleet_record import capture_fleet

    return capture_fleet(infra)
