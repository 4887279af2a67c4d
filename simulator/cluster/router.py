"""The router: admission, then routing, each after its latency (docs/behaviour.md §6.2).

A SimPy process takes arriving requests from its inbox Store and schedules each request's
admission and routing decisions as events (at ROUTER priority), so one request's decision
latency never delays another's. Decisions read instance snapshots only (INV-9); in-flight
counts are the router's own bookkeeping: +1 when a request is routed, −1 when its instance
finishes it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from ..engine.events import ROUTER, TIMEOUT, event_after
from ..engine.request import Request, RequestState
from .admission import AdmissionPolicy
from .decisions import DecisionTrace
from .routing import RoutingPolicy
from .snapshot import InstanceSnapshot, SnapshotCache

if TYPE_CHECKING:
    from .pd import Disaggregator


class ServedModels:
    """Which instances serve which model, and which of those are routable right now
    (docs/behaviour.md §A6).

    A model is known by any of its aliases (the name the scenario gives, the catalog's name),
    case-insensitively; an untagged request asks for the default model. Routable indices stay
    in index order so that candidate lists look the same as for a fixed fleet.
    """

    def __init__(self, default_model: str) -> None:
        self.default_model = default_model.lower()
        self.aliases: dict[str, str] = {self.default_model: self.default_model}
        self.routable: dict[str, list[int]] = {self.default_model: []}

    @classmethod
    def fixed(cls, model: str, count: int) -> ServedModels:
        served = cls(model)
        served.routable[served.default_model] = list(range(count))
        return served

    def add_model(self, model: str, *aliases: str) -> str:
        key = model.lower()
        self.routable.setdefault(key, [])
        for name in (model, *aliases):
            if name:
                self.aliases.setdefault(name.lower(), key)
        return key

    def key_for(self, req: Request) -> str | None:
        """The served model `req` asks for, or None when nobody serves it."""
        if not req.model:
            return self.default_model
        return self.aliases.get(req.model.lower())

    def make_routable(self, key: str, index: int) -> None:
        indices = self.routable[key]
        if index not in indices:
            indices.append(index)
            indices.sort()

    def make_unroutable(self, key: str, index: int) -> None:
        indices = self.routable[key]
        if index in indices:
            indices.remove(index)


class Router:
    def __init__(
        self,
        env: simpy.Environment,
        admission: AdmissionPolicy,
        routing: RoutingPolicy,
        snapshots: SnapshotCache,
        deliver: list[Callable[[Request], None]],
        instance_ids: list[str],
        served: ServedModels,
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
        self.served = served
        # Requests for a served model while none of its instances is routable (all loading,
        # say) wait here and are routed when one becomes routable, or leave at their client
        # deadline, timed out.
        self.parked: dict[str, deque[Request]] = {}
        self.parked_total = 0
        self.parked_timed_out = 0
        self._unparking: set[str] = set()  # models whose parked requests are routed this µs
        # The cluster's callback for a request that leaves the system without reaching an
        # instance: rejected, or timed out while parked.
        self.on_rejected = on_rejected
        self.trace = trace
        self.admission_latency_us = admission_latency_us
        self.routing_latency_us = routing_latency_us
        self.pd = pd
        self.inbox = simpy.Store(env)
        env.process(self._intake())
        self.in_flight = [0] * len(instance_ids)
        self.routed = [0] * len(instance_ids)
        self.admission_rejections = 0
        self.routing_rejections = 0

    def add_target(self, deliver: Callable[[Request], None], instance_id: str, model: str) -> None:
        """An instance made while the run goes on (the cluster appends its id to the shared
        `instance_ids`): its delivery, counters and snapshot, at the next index."""
        self.deliver.append(deliver)
        self.in_flight.append(0)
        self.routed.append(0)
        self.snapshots.add(instance_id, model)

    def _intake(self):
        inbox = self.inbox
        while True:
            req = yield inbox.get()
            self._after(self.admission_latency_us, self._admit, req)

    def _after(self, delay_us: int, action: Callable[[Request], None], req: Request) -> None:
        if delay_us > 0:
            event_after(self.env, delay_us, ROUTER).callbacks.append(lambda _e: action(req))
        else:
            action(req)

    def candidates(self, req: Request) -> list[InstanceSnapshot]:
        """Snapshots of the routable instances serving the model `req` asks for."""
        key = self.served.key_for(req)
        if key is None:
            return []
        return self.snapshots.get_many(self.served.routable[key], self.env.now)

    def _admit(self, req: Request) -> None:
        now = self.env.now
        # BLIS builds the candidates' snapshots for every admission decision, and building
        # one re-reads it when stale. With a refresh interval that read decides what routing
        # sees a routing latency later (or what the next request sees, when this one is
        # rejected), so it is done here even for a policy that ignores snapshots. Live
        # snapshots (interval 0) have nothing to refresh.
        if self.admission.uses_snapshots or self.snapshots.interval_us > 0:
            snapshots = self.candidates(req)
        else:
            snapshots = []
        admitted, reason = self.admission.admit(req, now, snapshots)
        self.trace.record_admission(req, now, admitted, reason)
        if not admitted:
            self.admission_rejections += 1
            self._reject(req)
            return
        self._after(self.routing_latency_us, self._route, req)

    def _route(self, req: Request) -> None:
        key = self.served.key_for(req)
        if key is None:
            self.routing_rejections += 1
            self._reject(req)
            return
        now = self.env.now
        if self.pd is not None:
            self.pd.route(
                req,
                lambda indices: self.snapshots.get_many(indices, now),
                now,
                self.dispatch,
                self.routing,
            )
            return
        if not self.served.routable[key]:
            self._park(key, req)
            return
        candidates = self.snapshots.get_many(self.served.routable[key], now)
        decision = self.routing.route(req, candidates, now)
        chosen = next(c for c in candidates if c.index == decision.target)
        self.routing.observe(req, chosen)
        self.trace.record_routing(req, now, decision, candidates)
        self.dispatch(req, decision.target)

    def _park(self, key: str, req: Request) -> None:
        """Hold `req` until an instance of model `key` is routable. Its client gives up at its
        deadline, as it would in an instance's queue (docs/engine.md, Timeouts): an event at
        the deadline, at the client-timeout priority, takes it out of the park queue unrouted
        (until 2026-12-07 it stayed, was counted as demand by the autoscaler and was routed
        after its deadline). A request routed first at that microsecond (unparking runs at
        routing priority) times out at its instance's enqueue instead: timed out either way."""
        self.parked.setdefault(key, deque()).append(req)
        self.parked_total += 1
        deadline_us = req.deadline_us
        if deadline_us > 0:
            event_after(self.env, max(0, deadline_us - self.env.now), TIMEOUT).callbacks.append(
                lambda _e: self._parked_deadline(key, req)
            )

    def _parked_deadline(self, key: str, req: Request) -> None:
        try:
            # Requests compare by identity. Usually near the head: the queue is in arrival
            # order.
            self.parked[key].remove(req)
        except ValueError:
            # Not there any more: routed meanwhile (and maybe parked again, with the same
            # deadline and its own event, of which the first to fire takes it).
            return
        self.parked_timed_out += 1
        req.state = RequestState.TIMED_OUT
        req.completion_us = self.env.now
        self.on_rejected(req)

    def dispatch(self, req: Request, index: int) -> None:
        """Send a (sub-)request to instance `index` and count it in flight there."""
        self.in_flight[index] += 1
        self.routed[index] += 1
        req.instance_id = self.instance_ids[index]
        self.deliver[index](req)

    def unpark_after_this_instant(self, key: str) -> None:
        """An instance of model `key` became routable: route the requests waiting for one once
        every instance that becomes routable at this microsecond is (their loading events were
        scheduled earlier, so this zero-delay event of the same priority runs after them), so
        the routing policy chooses among all of them rather than the first."""
        if key in self._unparking:
            return
        self._unparking.add(key)

        def unpark(_event) -> None:
            self._unparking.discard(key)
            self.unpark(key)

        event_after(self.env, 0, ROUTER).callbacks.append(unpark)

    def unpark(self, key: str) -> None:
        """Route the requests waiting for an instance of model `key`, while one is routable."""
        waiting = self.parked.get(key)
        while waiting and self.served.routable[key]:
            self._route(waiting.popleft())

    def reinject(self, req: Request) -> None:
        """A request taken back from an instance (redirect, retry) re-enters the pipeline
        now: admission, then routing, as if it had just arrived (docs/behaviour.md §8.4)."""
        self.inbox.put(req)

    @property
    def parked_now(self) -> int:
        return sum(len(q) for q in self.parked.values())

    def _reject(self, req: Request) -> None:
        req.state = RequestState.REJECTED
        req.completion_us = self.env.now
        self.on_rejected(req)

    def finished(self, index: int) -> None:
        self.in_flight[index] -= 1
