"""The router: admission, then routing, each after its latency (SPEC §6.2).

A SimPy process takes arriving requests from its inbox Store and schedules each request's
admission and routing decisions as events, so one request's decision latency never delays
another's. Decisions read instance snapshots only (INV-9); in-flight counts are the router's
own bookkeeping: +1 when a request is routed, −1 when its instance finishes it.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from ..engine.events import ROUTER, event_after
from ..engine.request import Request, RequestState
from .admission import AdmissionPolicy
from .decisions import DecisionTrace
from .pd import Disaggregator
from .routing import RoutingPolicy
from .snapshot import InstanceSnapshot, SnapshotCache


class Router:
    def __init__(
        self,
        env: simpy.Environment,
        admission: AdmissionPolicy,
        routing: RoutingPolicy,
        snapshots: SnapshotCache,
        deliver: list[Callable[[Request], None]],
        instance_ids: list[str],
        model_name: str,
        on_rejected: Callable[[Request], None],
        trace: DecisionTrace,
        admission_latency_us: int = 0,
        routing_latency_us: int = 0,
        pd: Disaggregator | None = None,
    ) -> None:
        self.env = env
        self.admission = admission
        self.routing = routing
        self.snapshots = snapshots
        self.deliver = deliver
        self.instance_ids = instance_ids
        self.model_name = model_name.lower()
        self.on_rejected = on_rejected
        self.trace = trace
        self.admission_latency_us = admission_latency_us
        self.routing_latency_us = routing_latency_us
        self.pd = pd
        self.inbox: simpy.Store = simpy.Store(env)
        self.in_flight = [0] * len(instance_ids)
        self.routed = [0] * len(instance_ids)
        self.admission_rejections = 0
        self.routing_rejections = 0
        env.process(self._run())

    def _run(self):
        while True:
            req = yield self.inbox.get()
            self._after(self.admission_latency_us, self._admit, req)

    def _after(self, delay_us: int, action: Callable[[Request], None], req: Request) -> None:
        if delay_us > 0:
            event_after(self.env, delay_us, ROUTER).callbacks.append(lambda _e: action(req))
        else:
            action(req)

    def candidates(self, req: Request) -> list[InstanceSnapshot]:
        """Snapshots of the instances that may serve `req` (all of them, unless its model tag
        names another model)."""
        if req.model and req.model.lower() != self.model_name:
            return []
        now = self.env.now
        return [self.snapshots.get(i, now) for i in range(len(self.instance_ids))]

    def _admit(self, req: Request) -> None:
        now = self.env.now
        snapshots = self.candidates(req) if self.admission.uses_snapshots else []
        admitted, reason = self.admission.admit(req, now, snapshots)
        self.trace.record_admission(req, now, admitted, reason)
        if not admitted:
            self.admission_rejections += 1
            self._reject(req)
            return
        self._after(self.routing_latency_us, self._route, req)

    def _route(self, req: Request) -> None:
        if req.model and req.model.lower() != self.model_name:
            self.routing_rejections += 1
            self._reject(req)
            return
        now = self.env.now
        if self.pd is not None:
            self.pd.route(
                req, lambda i: self.snapshots.get(i, now), now, self.dispatch, self.routing
            )
            return
        candidates = self.candidates(req)
        decision = self.routing.route(req, candidates, now)
        chosen = next(c for c in candidates if c.index == decision.target)
        self.routing.observe(req, chosen)
        self.trace.record_routing(req, now, decision, candidates)
        self.dispatch(req, decision.target)

    def dispatch(self, req: Request, index: int) -> None:
        """Send a (sub-)request to instance `index` and count it in flight there."""
        self.in_flight[index] += 1
        self.routed[index] += 1
        req.instance_id = self.instance_ids[index]
        self.deliver[index](req)

    def _reject(self, req: Request) -> None:
        req.state = RequestState.REJECTED
        req.completion_us = self.env.now
        self.on_rejected(req)

    def finished(self, index: int) -> None:
        self.in_flight[index] -= 1
