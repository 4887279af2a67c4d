"""Runtime checks of the simulator's laws (docs/behaviour.md §11, §7.5), on when `check_invariants`
is set.

A capacity-planning number is only as good as the bookkeeping behind it, so a run can check
itself as it goes and stop at the first law that breaks, naming the law, the simulated time and
the request. Three moments:

- after every step of every instance (`check_step`): KV-block conservation (allocated + free
  = total, reference counts match the requests holding blocks), request states in the queues,
  token progress bounds, and the instance clock never going back (INV-2, INV-3, INV-4);
- when a user-facing request leaves the system (`check_finished`): it is in a final state and
  its timestamps are causal (INV-5), PD parents along the whole prefill → transfer → decode
  chain (INV-PD-1, INV-PD-4), and no token was generated beyond the request's output;
- at the end (`check_run`): request conservation for the cluster and every instance (INV-1),
  rejections add up, in-flight counts match the unfinished requests, nothing is left in
  flight when the run had no horizon, PD pools and transfers (INV-PD-2, INV-PD-3), the
  output-token total, and the pooled ITL holding exactly the completed requests' gaps.

The checks cost a pass over each step's queues and KV reference counts: fine for test-size
runs; large runs leave them off (see docs/robustness.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .engine.request import Request, RequestState

if TYPE_CHECKING:
    from .engine.batching import VLLMEngine
    from .metrics.results import Result

# Set to 1 to check every run in this process and its children (the test suite does).
ENVIRONMENT_SWITCH = "SERVESIM_CHECK_INVARIANTS"


def requested(flag: bool) -> bool:
    """Whether to check this run: asked for explicitly, or switched on for the process."""
    return flag or os.environ.get(ENVIRONMENT_SWITCH, "") not in ("", "0")


CONSERVED_STATES = (
    "completed_requests",
    "still_queued",
    "still_running",
    "dropped_unservable",
    "timed_out_requests",
    # present in a summary only when a changing fleet produced them
    "dropped_on_drain",
    "failed_requests",
)
_FINAL = (
    RequestState.COMPLETED,
    RequestState.TIMED_OUT,
    RequestState.DROPPED,
    RequestState.REJECTED,
    RequestState.DROPPED_ON_DRAIN,
    RequestState.FAILED,
)


class InvariantViolation(Exception):
    """A law of the simulation broke. This is a servesim bug, not bad input: the CLI reports
    it on one line and exits with status 3 (bad input is 2)."""

    def __init__(self, law: str, time_us: int, detail: str, request_id: str = "") -> None:
        # All fields in args: SimPy re-raises a process's exception as type(e)(*e.args).
        super().__init__(law, time_us, detail, request_id)
        self.law = law
        self.time_us = time_us
        self.detail = detail
        self.request_id = request_id

    def __str__(self) -> str:
        where = f"request {self.request_id} " if self.request_id else ""
        return f"invariant violated: {self.law}: {where}at t={self.time_us} µs: {self.detail}"


def _require(ok: bool, law: str, time_us: int, detail: str, req: Request | None = None) -> None:
    if not ok:
        raise InvariantViolation(law, time_us, detail, req.request_id if req is not None else "")


# --- after each step ------------------------------------------------------------------------


# The deep check walks every KV block (O(total blocks)): at 1,024 it costs a checked run of
# scenarios/diurnal_cohort.yaml about a fifth of its time instead of well over half.
DEEP_CHECK_EVERY_STEPS = 1024


def check_step(engine: VLLMEngine, instance_id: str, now_us: int) -> None:
    """The instance's laws right after a step ended at `now_us`.

    Every step: the clock, the KV block count, and the running batch (work proportional to
    the batch). The engine's full self-check walks every KV block's reference count, so it
    runs on steps 1, 2, 4, 8, ... and every DEEP_CHECK_EVERY_STEPS-th step, and at the end
    of the run (`check_run`): a broken KV law is still caught, a little later."""
    steps = engine.steps
    n = len(steps)
    starts_us = steps.last_values("start_us", 2)
    if len(starts_us) == 2:
        previous_end_us = starts_us[0] + steps.last_values("step_us", 2)[0]
        _require(
            starts_us[1] >= previous_end_us,
            "clock never decreases (INV-3)",
            now_us,
            f"{instance_id} started a step at {starts_us[1]} µs, before its previous "
            f"step ended at {previous_end_us} µs",
        )
    kv = engine.kv
    used, total = kv.used_blocks, kv.total_blocks
    if not (0 <= used <= total and used + kv.reusable_blocks == total):
        _require(
            False,
            "KV-block conservation (INV-4)",
            now_us,
            f"{instance_id}: {used} blocks in use + {kv.reusable_blocks} free != {total} total",
        )
    # Messages are built only for a broken law: this runs for every request of every step.
    running = RequestState.RUNNING
    for req in engine.running:
        if req.state is not running:
            _require(
                False,
                "lifecycle (INV-2)",
                now_us,
                f"in {instance_id}'s running batch in state {req.state}",
                req,
            )
    if n & (n - 1) == 0 or n % DEEP_CHECK_EVERY_STEPS == 0:
        check_engine(engine, instance_id, now_us)


def check_engine(engine: VLLMEngine, instance_id: str, now_us: int) -> None:
    """The engine's own full self-check (queues, progress bounds, every KV reference count),
    its assertion turned into an InvariantViolation naming the request."""
    try:
        engine.check_invariants()
    except AssertionError as exc:
        detail = ", ".join(repr(a) for a in exc.args) or "engine self-check failed"
        culprit = next((a for a in exc.args if isinstance(a, Request)), None)
        raise InvariantViolation(
            "engine state and KV-block conservation (INV-2, INV-4)",
            now_us,
            f"{instance_id}: {detail}",
            culprit.request_id if culprit is not None else "",
        ) from None


# --- progress (always on) -------------------------------------------------------------------

# Consecutive engine steps in which no request got a token, after which an instance with work
# is declared stuck. A correct engine has at most one such step in a row (the step in which
# the only running request preempted itself admits nothing), so the limit only needs to be
# small against the cost of empty steps: 1,000 of them take milliseconds of wall time.
STALLED_STEPS_LIMIT = 1_000


def stalled(engine: VLLMEngine, instance_id: str, now_us: int, empty_steps: int) -> None:
    """Stop the run: `instance_id` stepped `empty_steps` times in a row without giving any
    request a token while it had work. Checked in every run, not only with invariants on,
    because a stuck instance would otherwise step (and log) forever."""
    raise InvariantViolation(
        "progress (INV-PROGRESS)",
        now_us,
        f"{instance_id} ran {empty_steps} consecutive steps in which no request got a token: "
        + _engine_state(engine),
    )


def thrashing(engine: VLLMEngine, instance_id: str, now_us: int, preemptions: int) -> None:
    """Stop the run: `instance_id` preempted `preemptions` times without producing an output
    token or completing a request. Its steps compute (prefill chunks re-computing what the
    preemptions threw away), so the step watchdog does not see it, but the run would never
    end. Checked in every run."""
    raise InvariantViolation(
        "progress (INV-PROGRESS)",
        now_us,
        f"{instance_id} preempted {preemptions} times without producing an output token or "
        "completing a request (re-computing the same prompts forever): " + _engine_state(engine),
    )


def _engine_state(engine: VLLMEngine) -> str:
    kv = engine.kv
    waiting = engine.waiting
    held_by_queued = sum(len(r.block_ids) for r in waiting)
    head = ""
    if waiting:
        r = waiting[0]
        head = (
            f"; queue head {r.request_id} ({r.input_tokens} prompt tokens, "
            f"{r.generated_tokens}/{r.output_tokens} output tokens, {len(r.block_ids)} KV "
            f"blocks held, prefill target {r.prefill_target})"
        )
    return (
        f"{len(waiting)} queued, {len(engine.running)} running, KV {kv.used_blocks} of "
        f"{kv.total_blocks} blocks in use ({held_by_queued} held by queued requests){head}"
    )


# --- when a request leaves ------------------------------------------------------------------


def check_finished(req: Request, now_us: int) -> None:
    """A user-facing request (or PD parent) that just left the system at `now_us`."""
    _require(req.state in _FINAL, "lifecycle (INV-2)", now_us, f"left in state {req.state}", req)
    _require(
        0 <= req.generated_tokens <= max(req.output_tokens, 0),
        "no token generated twice",
        now_us,
        f"generated {req.generated_tokens} of {req.output_tokens} output tokens",
        req,
    )
    if req.disaggregated:
        _check_pd_chain(req, now_us)
        return
    chain = [
        ("arrival", req.arrival_us),
        ("enqueue", req.enqueue_us),
        ("first schedule", req.first_schedule_us),
        ("first token", req.first_token_us),
    ]
    if req.state is RequestState.COMPLETED:
        chain.append(("completion", req.completion_us))
        _require(
            req.enqueue_us >= 0 and req.first_schedule_us >= 0,
            "causality (INV-5)",
            now_us,
            "completed without being enqueued and scheduled",
            req,
        )
    _check_ordered(chain, "causality (INV-5)", now_us, req)


def _check_pd_chain(parent: Request, now_us: int) -> None:
    pre, dec = parent.prefill_sub, parent.decode_sub
    chain = [("arrival", parent.arrival_us), ("prefill enqueue", pre.enqueue_us)]
    if pre.state is RequestState.COMPLETED:
        chain += [
            ("prefill complete", pre.completion_us),
            ("transfer start", parent.transfer_start_us),
            ("transfer complete", parent.transfer_end_us),
        ]
        if dec is not None:
            chain.append(("decode enqueue", dec.enqueue_us))
            if dec.state is RequestState.COMPLETED:
                chain.append(("completion", parent.completion_us))
    _check_ordered(chain, "PD causality (INV-PD-1, INV-PD-4)", now_us, parent)


def _check_ordered(chain: list[tuple[str, int]], law: str, now_us: int, req: Request) -> None:
    reached = [(name, t) for name, t in chain if t >= 0]
    for (a, ta), (b, tb) in zip(reached, reached[1:], strict=False):
        _require(ta <= tb, law, now_us, f"{b} at {tb} µs precedes {a} at {ta} µs", req)


# --- at the end -----------------------------------------------------------------------------


def check_run(result: Result, engines: list[VLLMEngine] | None = None) -> None:
    """The whole run's bookkeeping, once it has ended. A result keeps its engines' records,
    not the engines: their own self-checks run only when the live `engines` are given (the
    run passes them)."""
    summary = result.summary
    end_us = _end_us(result)
    if engines is not None:
        for instance_id, engine in zip(result.instance_ids, engines, strict=True):
            check_engine(engine, instance_id, end_us)
    records = result.request_records
    rejected = [r for r in records if r.state is RequestState.REJECTED]
    _require(
        len(rejected) == result.admission_rejections + result.routing_rejections,
        "request conservation (INV-1)",
        end_us,
        f"{len(rejected)} rejected requests, but {result.admission_rejections} admission + "
        f"{result.routing_rejections} routing rejections counted",
    )
    _require(
        len(records) == summary["injected_requests"] + len(rejected),
        "request conservation (INV-1)",
        end_us,
        f"{len(records)} requests arrived; injected {summary['injected_requests']} + "
        f"rejected {len(rejected)} differ",
    )
    _check_conserved("cluster", summary, end_us)
    for per in result.instance_summaries:
        _check_conserved(per["instance_id"], per, end_us)
    _check_states(result, end_us)
    _check_in_flight(result, end_us)
    produced = sum(r.generated_tokens for r in records)
    _require(
        summary["total_output_tokens"] == produced,
        "output-token conservation",
        end_us,
        f"summary counts {summary['total_output_tokens']} output tokens, requests hold {produced}",
    )
    _check_itl_pool(result, end_us)
    _check_sessions(result, end_us)
    if result.pd is not None:
        _check_pd_run(result, end_us)


def _check_itl_pool(result: Result, end_us: int) -> None:
    """The pooled ITL holds the gaps of the completed requests and nothing else: one per
    token after each one's first, adding up to the time from its first token to its last
    (each gap truncated to a whole µs, so the sum may fall short by under 1 µs a gap)."""
    from .metrics.summary import pooled_itl_us

    pool = pooled_itl_us(result.instance_records)
    completed = [
        r
        for r in result.request_records
        if r.state is RequestState.COMPLETED and r.generated_tokens >= 1
    ]
    expected = sum(r.generated_tokens - 1 for r in completed)
    _require(
        len(pool) == expected,
        "ITL pool holds the completed requests' gaps",
        end_us,
        f"{len(pool)} gaps pooled; the completed requests had {expected}",
    )
    span_us = sum(r.last_token_us - r.first_token_us for r in completed)
    pooled_us = pool.total()
    _require(
        span_us == pooled_us or 0 < span_us - pooled_us < len(pool),
        "ITL pool holds the completed requests' gaps",
        end_us,
        f"the pooled gaps add up to {pooled_us} µs; the completed requests' first-to-last "
        f"token times to {span_us} µs",
    )


def _check_sessions(result: Result, end_us: int) -> None:
    """Every session ends once (INV-11), and a session exists once it sent a request: its
    first request arrived, or fell past the horizon (`not_arrived`)."""
    counts = result.session_counts
    if not counts:
        return
    ended = sum(n for outcome, n in counts.items() if outcome != "total")
    _require(
        ended == counts["total"],
        "every session ends exactly once (INV-11)",
        end_us,
        f"outcomes add up to {ended}, total is {counts['total']}",
    )
    sent = {r.session_id for r in result.request_records if r.session_id}
    _require(
        len(sent) <= counts["total"] <= len(sent) + result.not_arrived,
        "a session exists once it sent a request (INV-11)",
        end_us,
        f"{counts['total']} sessions counted; {len(sent)} sent a request that arrived "
        f"({result.not_arrived} requests never arrived)",
    )


def _end_us(result: Result) -> int:
    clocks = [e.clock_us for e in result.engines]
    end = max(clocks, default=0)
    return end if result.horizon_us is None else min(end, result.horizon_us)


def _check_conserved(scope: str, counts: dict[str, Any], end_us: int) -> None:
    parts = {k: counts.get(k, 0) for k in CONSERVED_STATES}
    _require(
        counts["injected_requests"] == sum(parts.values()),
        "request conservation (INV-1)",
        end_us,
        f"{scope}: injected {counts['injected_requests']} != "
        + " + ".join(f"{k} {v}" for k, v in parts.items()),
    )


def _check_states(result: Result, end_us: int) -> None:
    unbounded = result.horizon_us is None
    # Requests for a served model that never found a routable instance (a fleet drained or
    # failed to zero) wait at the router: unfinished but counted (still_queued).
    waiting_for_instance = sum(r.state is RequestState.CREATED for r in result.request_records)
    _require(
        waiting_for_instance >= result.parked_at_end,
        "request conservation (INV-1)",
        end_us,
        f"router holds {result.parked_at_end} requests but only {waiting_for_instance} are "
        "unrouted",
    )
    parked_ok = unbounded and waiting_for_instance == result.parked_at_end
    for req in result.request_records:
        _require(
            req.state is not RequestState.RUNNING or req.enqueue_us >= 0,
            "lifecycle (INV-2)",
            end_us,
            "running but never enqueued",
            req,
        )
        if unbounded:
            _require(
                req.is_finished or (parked_ok and req.state is RequestState.CREATED),
                "every request ends in a counted final state (INV-1)",
                end_us,
                f"still {req.state} at the end of a run without a horizon",
                req,
            )


def _check_in_flight(result: Result, end_us: int) -> None:
    served = _served_requests(result)
    for index, iid in enumerate(result.instance_ids):
        unfinished = sum(1 for r in served if r.instance_id == iid and not r.is_finished)
        counted = result.in_flight_at_end[index]
        _require(
            counted == unfinished,
            "router in-flight count (INV-7)",
            end_us,
            f"{iid}: router counts {counted} in flight, {unfinished} requests are unfinished there",
        )


def _served_requests(result: Result) -> list[Request]:
    """What the instances served: plain requests, and the sub-requests of PD parents."""
    served = [r for r in result.request_records if not r.disaggregated]
    for parent in result.pd.parents if result.pd is not None else ():
        served.extend(s for s in (parent.prefill_sub, parent.decode_sub) if s is not None)
    return served


def _check_pd_run(result: Result, end_us: int) -> None:
    pd = result.pd
    roles = dict(zip(result.instance_ids, result.instance_roles, strict=True))
    for parent in pd.parents:
        for sub, role in ((parent.prefill_sub, "prefill"), (parent.decode_sub, "decode")):
            if sub is None or not sub.instance_id:
                continue
            _require(
                roles[sub.instance_id] == role,
                "PD pool membership (INV-PD-2)",
                end_us,
                f"{role} sub-request ran on {sub.instance_id}, a {roles[sub.instance_id]} instance",
                parent,
            )
        if result.horizon_us is None and parent.transfer_start_us >= 0:
            _require(
                parent.transfer_end_us >= 0,
                "every KV transfer completes (INV-PD-3)",
                end_us,
                f"transfer started at {parent.transfer_start_us} µs never completed",
                parent,
            )
    dropped = sum(1 for p in pd.parents if p.dropped_at_decode_kv)
    _require(
        dropped == pd.dropped_at_decode_kv,
        "no silent loss (dropped at decode KV)",
        end_us,
        f"{dropped} parents dropped at decode KV, {pd.dropped_at_decode_kv} counted",
    )
