"""Prefill/decode disaggregation flow (docs/behaviour.md §7, §A4): parents, sub-requests, transfers.

The router asks `Disaggregator.route` for every admitted request. Routing is decode-first (as
llm-d): the decode instance is chosen, then the decider says whether to disaggregate (it may
look at that instance's real KV cache). A disaggregated request becomes a parent with

    prefill sub-request (prompt only) on the prefill pool
      -> KV transfer over the link, starting at the end of the final prefill step
      -> decode sub-request on the chosen decode instance, prompt KV already resident,
         generating every output token.

Each role's candidates come from its pool (`pools.py`: prefill, decode and unified pools as
separate resource groups, fixed for the run).

The parent is the user-facing request: it takes its first token, completion and token count
from the decode sub-request, so summaries never show sub-requests (INV-PD-6).

In a run that compacts finished requests (`keep_in`), a finished parent becomes a row of the
cluster's request table like any other request, with what the PD results read of its two
sub-requests (metrics/request_table.py, `PDColumns`), and the objects go; `parents` then lists
rows and the still-live parents in the order they were disaggregated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..engine.request import Request, RequestState
from ..metrics.request_table import ParentRecords, RequestTable
from .decisions import DecisionTrace
from .disaggregation import DecisionContext, PDDecider
from .kv_transfer import KVTransferLink
from .pools import InstancePool, Pools
from .routing import RoutingPolicy
from .snapshot import InstanceSnapshot

__all__ = ["Disaggregator", "InstancePool", "Pools"]


class Disaggregator:
    def __init__(
        self,
        pools: Pools,
        decider: PDDecider,
        prefill_routing: RoutingPolicy,
        decode_routing: RoutingPolicy,
        link: KVTransferLink,
        kv_bytes_per_token: float,
        kv_probe: Callable[[int, Request], int],
        block_size: int,
        trace: DecisionTrace,
    ) -> None:
        self.pools = pools
        self.decider = decider
        self.prefill_routing = prefill_routing
        self.decode_routing = decode_routing
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.kv_probe = kv_probe
        self.block_size = block_size
        self.trace = trace
        # Every disaggregated parent, in order: a list of the objects, or (`keep_in`) the
        # live parents by id with their ordinal, the finished ones being rows of `table`.
        self._parents: list[Request] = []
        self._live: dict[int, tuple[int, Request]] = {}
        self._routed = 0
        self.table: RequestTable | None = None
        self._records: tuple[tuple[int, int], ParentRecords] | None = None
        self.dropped_at_decode_kv = 0
        # Sub-requests inherit their parent's private-content mark (the KV cache then defers
        # hashing it) only when each instance can see at most one of a parent's phases: the
        # pools are disjoint, and only a changing fleet re-routes a parent.
        self.private_subs = False
        self.prefill_completed = 0
        self.decode_completed = 0

    # ------------------------------------------------------------------ parents
    def keep_in(self, table: RequestTable) -> None:
        """Finished parents become rows of `table` (which must be empty) with their PD fields,
        as the cluster retires them; only unfinished ones stay objects here."""
        table.track_pd(self._retire)
        self.table = table

    def _retire(self, parent: Request) -> int:
        """A finished parent has been read into the table: forget the object (its sub-requests
        let go of it, so no reference cycle outlives it) and return its ordinal."""
        ordinal, _ = self._live.pop(id(parent))
        for sub in (parent.prefill_sub, parent.decode_sub):
            if sub is not None:
                sub.parent = None
        return ordinal

    @property
    def parents(self) -> list[Request] | ParentRecords:
        """Every disaggregated parent, in the order it was disaggregated."""
        if self.table is None:
            return self._parents
        key = (len(self.table), self._routed)
        if self._records is None or self._records[0] != key:
            self._records = key, ParentRecords(self.table, list(self._live.values()))
        return self._records[1]

    def _live_parents(self):
        return self._parents if self.table is None else [p for _o, p in self._live.values()]

    # ------------------------------------------------------------------ routing
    def route(
        self,
        req: Request,
        snapshots: Callable[[Sequence[int]], list[InstanceSnapshot]],
        now_us: int,
        dispatch: Callable[[Request, int], None],
        fallback: RoutingPolicy,
    ) -> None:
        """Decide and dispatch `req`: `snapshots(indices)` reads those instances now (in one
        call per pool), `dispatch(request, instance_index)` sends a (sub-)request to an
        instance's inbox and counts it in flight."""
        decode_candidates = snapshots(self.pools.decode.members)
        decode_choice = self.decode_routing.route(req, decode_candidates, now_us)
        ctx = DecisionContext(decode_choice.target, self.kv_probe, self.block_size)
        disaggregate, reason = self.decider.decide(req, ctx)
        if self.trace.enabled:  # the record's arguments are built only for a trace
            self.trace.record_event(
                "disaggregation", req, now_us, disaggregate=disaggregate, reason=reason
            )
        if disaggregate:
            # The decode choice is committed here (its sub-request reaches it after the
            # transfer): stateful scorers learn it now, as after any routing decision.
            decode_chosen = next(c for c in decode_candidates if c.index == decode_choice.target)
            self.decode_routing.observe(req, decode_chosen)
            if self.trace.enabled:
                # The decode pool's choice, made now though its sub-request arrives after the
                # transfer; not a "routing" record, which counts a request's one target.
                scores = decode_choice.scores
                self.trace.record_event(
                    "decode_routing",
                    req,
                    now_us,
                    chosen=decode_chosen.instance_id,
                    reason=decode_choice.reason,
                    scores=dict(scores) if scores is not None else None,
                )
            prefill_candidates = snapshots(self.pools.prefill.members)
            decision = self.prefill_routing.route(req, prefill_candidates, now_us)
            chosen = next(c for c in prefill_candidates if c.index == decision.target)
            self.prefill_routing.observe(req, chosen)
            self.trace.record_routing(req, now_us, decision, prefill_candidates)
            sub = req.sub_request("prefill")
            if self.private_subs:
                sub.private_from_token = req.private_from_token
            req.prefill_sub = sub
            req.decode_instance_index = decode_choice.target
            req.state = RequestState.QUEUED
            if self.table is None:
                self._parents.append(req)
            else:
                self._live[id(req)] = (self._routed, req)
            self._routed += 1
            dispatch(sub, decision.target)
        elif self.pools.unified:
            candidates = snapshots(self.pools.unified.members)
            decision = fallback.route(req, candidates, now_us)
            fallback.observe(req, next(c for c in candidates if c.index == decision.target))
            self.trace.record_routing(req, now_us, decision, candidates)
            dispatch(req, decision.target)
        else:
            # No unified instances: the decode instance serves the request whole (llm-d).
            chosen = next(c for c in decode_candidates if c.index == decode_choice.target)
            self.decode_routing.observe(req, chosen)
            self.trace.record_routing(req, now_us, decode_choice, decode_candidates)
            dispatch(req, decode_choice.target)
        self.decider.observe(req, disaggregate, ctx)

    # ------------------------------------------------------------------ phases
    def on_sub_finished(
        self,
        sub: Request,
        now_us: int,
        deliver_decode: Callable[[Request, int], bool],
        parent_finished: Callable[[Request], None],
    ) -> None:
        """A sub-request left its instance: start the transfer, or settle the parent."""
        parent = sub.parent
        if sub.pd_role == "prefill":
            if sub.state is not RequestState.COMPLETED:
                self._settle(parent, sub.state)
                parent_finished(parent)
                return
            self.prefill_completed += 1
            parent.schedule_us = sub.schedule_us
            parent.first_schedule_us = sub.first_schedule_us
            parent.enqueue_us = sub.enqueue_us
            parent.cached_tokens = sub.cached_tokens
            parent.state = RequestState.RUNNING  # in transfer
            # A4: the transfer starts at the end of the final prefill step (now).
            parent.transfer_start_us = now_us
            size = int(parent.input_tokens * self.kv_bytes_per_token)
            self.link.start(
                parent.request_id,
                size,
                lambda end_us, p=parent: self._transfer_done(
                    p, end_us, deliver_decode, parent_finished
                ),
            )
            return
        # decode sub-request
        if sub.state is RequestState.COMPLETED:
            self.decode_completed += 1
        self._settle(parent, sub.state)
        parent_finished(parent)

    def _transfer_done(self, parent: Request, end_us: int, deliver_decode, parent_finished):
        parent.transfer_end_us = end_us
        if self.trace.enabled:
            self.trace.record_event(
                "kv_transfer",
                parent,
                end_us,
                start_us=parent.transfer_start_us,
                duration_us=end_us - parent.transfer_start_us,
                blocks=-(-parent.input_tokens // self.block_size),
                prefill_instance=parent.prefill_sub.instance_id,
                decode_index=parent.decode_instance_index,
            )
        decode = parent.sub_request("decode")
        if self.private_subs:
            decode.private_from_token = parent.private_from_token
        parent.decode_sub = decode
        if not deliver_decode(decode, parent.decode_instance_index):
            if decode.state is RequestState.DROPPED:
                parent.dropped_at_decode_kv = True
                self.dropped_at_decode_kv += 1
            self._settle(parent, decode.state)
            parent_finished(parent)

    def _settle(self, parent: Request, state: RequestState) -> None:
        """Copy the outcome of the parent's last phase onto the parent."""
        parent.state = state
        sub = parent.decode_sub or parent.prefill_sub
        parent.instance_id = sub.instance_id
        if parent.decode_sub is not None:
            _take_decode_progress(parent)
        parent.completion_us = (
            sub.completion_us
            if state is RequestState.COMPLETED
            else max(sub.completion_us, parent.transfer_end_us)
        )

    def finalize(self) -> None:
        """At the end of a run, unfinished parents take the state of their current phase."""
        for parent in self._live_parents():
            if parent.is_finished:
                continue
            if parent.decode_sub is not None:
                d = parent.decode_sub
                parent.state = (
                    d.state if d.state is not RequestState.CREATED else RequestState.QUEUED
                )
                _take_decode_progress(parent)
                parent.instance_id = d.instance_id
            elif parent.transfer_start_us >= 0:
                parent.state = RequestState.RUNNING  # mid-transfer
            else:
                p = parent.prefill_sub
                parent.state = (
                    p.state if p.state is not RequestState.CREATED else RequestState.QUEUED
                )
                parent.instance_id = p.instance_id
                parent.enqueue_us = p.enqueue_us
                parent.schedule_us = p.schedule_us
                parent.first_schedule_us = p.first_schedule_us
        if self.table is not None:
            # No parent becomes a row after the run: the table, which the result keeps, lets
            # go of this disaggregator and, through its policies and link, of the engines.
            self.table.pd.retire = _run_ended


def _run_ended(parent: Request) -> int:
    raise RuntimeError(f"the run has ended: parent {parent.request_id} cannot become a row")


def _take_decode_progress(parent: Request) -> None:
    """The parent's tokens are its decode sub-request's: first and last token, count, caps."""
    d = parent.decode_sub
    parent.first_token_us = d.first_token_us
    parent.last_token_us = d.last_token_us
    parent.generated_tokens = d.generated_tokens
    parent.preemptions = parent.prefill_sub.preemptions + d.preemptions
    parent.length_capped = d.length_capped
