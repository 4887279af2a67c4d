"""Did a run reach a steady state, or was its server saturated?

A latency percentile of a saturated run describes only how long the run was: its queue grows
without bound, so a longer run reports a worse TTFT. Every run is therefore judged
(docs/results.md#steady-state-verdict) from its requests alone:

- the window is the span of arrivals, less a warm-up (the first WARM_UP_FRACTION of it), split
  into two halves;
- the *TTFT trend*: the median time to first token of the requests arriving in each half,
  where a request that never got a first token (dropped, timed out, rejected, unfinished) counts
  as infinitely late;
- the *backlog*: requests that had arrived but not yet received a first token, at the start
  of the window, at its middle and at its end (the last arrival);
- offered load (arrivals per second over the arrival span) against achieved throughput
  (completions per second from the first arrival to the last completion), for the record;
- the requests in the system (arrived, not completed) at the same three instants, read only
  when the window is at least INFLIGHT_E2E_MULTIPLE times the median E2E (a run fills up for
  about one E2E);
- what was left at the end: requests still queued or running when the run stopped.

Verdicts: `saturated` when the queue grows — the median TTFT of the second half is at least
TTFT_GROWTH times the first half's and TTFT_GROWTH_MIN_MS more, or the backlog grew in both
halves and by more than BACKLOG_GROWTH_MIN (at least BACKLOG_GROWTH_FRACTION of the second
half's arrivals) in the second, or (in a settled window) the requests in the system grew in
the first half and, beyond the arrivals of the last median E2E (which a burst of arrivals
raises without any queue), in the second by more than INFLIGHT_GROWTH_FRACTION of its arrivals
and INFLIGHT_NOISE_SIGMAS square roots of the number in the system; `not
steady` when requests were left unfinished at the end
(a horizon cut the run) or more than LOSS_FRACTION of them timed out or were dropped;
`empty` when nothing completed; `too short` with fewer than MIN_REQUESTS arrivals in the
window, or a window shorter than INFLIGHT_E2E_MULTIPLE median E2Es that showed no growth;
`steady` otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..engine.request import RequestState
from .quantiles import median

WARM_UP_FRACTION = 0.1
MIN_REQUESTS = 30
TTFT_GROWTH = 1.5
TTFT_GROWTH_MIN_MS = 200.0
BACKLOG_GROWTH_MIN = 10
BACKLOG_GROWTH_FRACTION = 0.05
LOSS_FRACTION = 0.01
INFLIGHT_E2E_MULTIPLE = 2.0
INFLIGHT_GROWTH_FRACTION = 0.1
INFLIGHT_NOISE_SIGMAS = 3.0

# Dropped covers both kinds: unservable, and dropped by an immediate drain.
_LOST = (
    RequestState.DROPPED,
    RequestState.DROPPED_ON_DRAIN,
    RequestState.TIMED_OUT,
    RequestState.FAILED,
)
_UNFINISHED = (RequestState.QUEUED, RequestState.RUNNING, RequestState.CREATED)


@dataclass
class SteadyState:
    verdict: str  # steady | saturated | not steady | empty | too short
    reasons: list[str] = field(default_factory=list)
    offered_rps: float | None = None
    achieved_rps: float | None = None
    warm_up_s: float = 0.0
    ttft_p50_first_half_ms: float | None = None
    ttft_p50_second_half_ms: float | None = None
    backlog_at_start: int = 0
    backlog_at_middle: int = 0
    backlog_at_end: int = 0
    unfinished_at_end: int = 0
    lost_requests: int = 0

    @property
    def steady(self) -> bool:
        return self.verdict == "steady"

    def document(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None  # an infinite median: most of that half never got a token
        return out


def _median_ms(ttft_us: np.ndarray) -> float:
    return median(ttft_us) / 1000 if len(ttft_us) else math.nan


def judge(records: Sequence[Any]) -> SteadyState:
    """The steady-state verdict of a run from its arrived requests (any order); requests
    that admission rejected never entered a queue and are left out."""
    from .request_table import request_stats

    # The table's own columns (views, no copy: a million requests' verdict must not double the
    # run's memory), in no particular order, which no figure here depends on.
    stats = request_stats(records, ("arrival_us", "first_token_us", "completion_us"))
    stats = stats.where(~stats.is_state(RequestState.REJECTED))  # refusals never queued
    arrival, first = stats.arrival_us, stats.first_token_us
    n = len(arrival)
    completed = stats.is_state(RequestState.COMPLETED)
    counts = stats.state_counts()
    unfinished = sum(counts[s] for s in _UNFINISHED)
    lost = sum(counts[s] for s in _LOST)
    if not completed.any():
        return SteadyState("empty", ["no request completed"], unfinished_at_end=unfinished,
                           lost_requests=lost)  # fmt: skip
    start, end = int(arrival.min()), int(arrival.max())
    span_s = (end - start) / 1e6
    offered = n / span_s if span_s > 0 else None
    run_s = (int(stats.completion_us[completed].max()) - start) / 1e6
    achieved = int(completed.sum()) / run_s if run_s > 0 else None
    warm_up_us = int((end - start) * WARM_UP_FRACTION)
    window_start = start + warm_up_us
    middle = window_start + (end - window_start) // 2
    state = SteadyState(
        "steady",
        offered_rps=offered,
        achieved_rps=achieved,
        warm_up_s=warm_up_us / 1e6,
        unfinished_at_end=unfinished,
        lost_requests=lost,
    )
    # Time to first token, infinite for a request that never got one.
    ttft = np.where(first >= 0, first - arrival, 0).astype(np.float64)
    ttft[first < 0] = math.inf
    first_half = (arrival >= window_start) & (arrival < middle)
    second_half = (arrival >= middle) & (arrival <= end)
    in_window = int(first_half.sum() + second_half.sum())

    def backlog(at_us: int) -> int:
        arrived = arrival <= at_us
        served = (first >= 0) & (first <= at_us)
        return int((arrived & ~served).sum())

    state.backlog_at_start = backlog(window_start)
    state.backlog_at_middle = backlog(middle)
    state.backlog_at_end = backlog(end)
    if in_window < MIN_REQUESTS:
        if not _lost_or_unfinished(state, n):
            state.verdict = "too short"
            state.reasons.append(
                f"{in_window} requests arrived after the warm-up; at least {MIN_REQUESTS} are "
                "needed to judge a trend"
            )
        return state
    p1, p2 = _median_ms(ttft[first_half]), _median_ms(ttft[second_half])
    state.ttft_p50_first_half_ms, state.ttft_p50_second_half_ms = p1, p2
    if p2 >= TTFT_GROWTH * p1 and p2 - p1 >= TTFT_GROWTH_MIN_MS:
        state.verdict = "saturated"
        state.reasons.append(
            f"median TTFT grew from {p1:,.0f} ms (first half) to {p2:,.0f} ms (second half)"
            if math.isfinite(p2)
            else f"median TTFT grew from {p1:,.0f} ms to never (most of the second half got "
            "no first token)"
        )
    grown = state.backlog_at_end - state.backlog_at_middle
    threshold = max(BACKLOG_GROWTH_MIN, BACKLOG_GROWTH_FRACTION * int(second_half.sum()))
    if state.backlog_at_middle > state.backlog_at_start and grown > threshold:
        state.verdict = "saturated"
        state.reasons.append(
            f"the backlog (arrived, no first token yet) grew {state.backlog_at_start} → "
            f"{state.backlog_at_middle} → {state.backlog_at_end} over the window"
        )
    # A batching server takes an overload into its batch first: requests get their first
    # token, the batch and every request's latency grow, and the TTFT backlog stays flat. What
    # grows is the number in the system (arrived, not completed); but it also grows while a run
    # fills up, for about one E2E. So the number in the system is read only in a window longer
    # than twice the median E2E (steady, it levels off at rate x E2E by Little's law), and a
    # shorter run that shows no growth above cannot be called steady either.
    e2e_median_s = float(np.median(stats.completion_us[completed] - arrival[completed])) / 1e6
    window_s = (end - window_start) / 1e6
    settled = window_s >= INFLIGHT_E2E_MULTIPLE * e2e_median_s
    if settled and state.verdict != "saturated":
        completion = np.where(completed, stats.completion_us, np.iinfo(np.int64).max)

        e2e_median_us = int(e2e_median_s * 1e6)

        def in_system(at_us: int) -> int:
            return int(((arrival <= at_us) & (completion > at_us)).sum())

        def recent_arrivals(at_us: int) -> int:
            return int(((arrival <= at_us) & (arrival > at_us - e2e_median_us)).sum())

        instants = (window_start, middle, end)
        counts = [in_system(at) for at in instants]
        # Steady, the number in the system is about the arrivals of the last median E2E
        # (Little's law), and follows their bursts; what a queue adds is the excess.
        excess = [n - recent_arrivals(at) for n, at in zip(counts, instants, strict=True)]
        # The excess still carries the spread of E2E around its median: a growth must stand
        # out of that noise (about the square root of the number in the system) too.
        threshold = max(
            BACKLOG_GROWTH_MIN,
            INFLIGHT_GROWTH_FRACTION * int(second_half.sum()),
            INFLIGHT_NOISE_SIGMAS * math.sqrt(counts[1]),
        )
        if counts[1] > counts[0] and excess[2] - excess[1] > threshold:
            state.verdict = "saturated"
            state.reasons.append(
                f"the requests in the system (arrived, not completed) grew {counts[0]} → "
                f"{counts[1]} → {counts[2]} over the window, {excess[1]} → {excess[2]} beyond "
                f"the arrivals of the last median E2E ({e2e_median_s:,.1f} s) in its second half"
            )
    if state.verdict == "saturated":
        # Still said: a run whose requests were dropped (at a decode instance's KV, say) never
        # served them, and they count in its backlog; the loss is the first thing to see.
        state.reasons.extend(_loss_reasons(state, n))
        return state
    if _lost_or_unfinished(state, n):
        return state
    if not settled:
        state.verdict = "too short"
        state.reasons.append(
            f"arrivals after the warm-up span {window_s:,.1f} s, less than "
            f"{INFLIGHT_E2E_MULTIPLE:g} x the median E2E ({e2e_median_s:,.1f} s): the run "
            "ends before it could settle, so its latencies say nothing of a sustained load"
        )
    return state


def _loss_reasons(state: SteadyState, n: int) -> list[str]:
    """What the run left undone: requests unfinished at the end, and more than LOSS_FRACTION
    of the `n` lost."""
    reasons = []
    if state.unfinished_at_end:
        reasons.append(
            f"{state.unfinished_at_end} requests were still queued or running at the end"
        )
    if state.lost_requests > LOSS_FRACTION * n:
        reasons.append(f"{state.lost_requests} of {n} requests were dropped, timed out or failed")
    return reasons


def _lost_or_unfinished(state: SteadyState, n: int) -> bool:
    """Judge `state` "not steady" if it left requests undone (`_loss_reasons`); whether it
    did. Said before "too short": a run that lost requests is not steady however long it ran,
    and only this verdict warns."""
    reasons = _loss_reasons(state, n)
    if reasons:
        state.verdict = "not steady"
        state.reasons.extend(reasons)
    return bool(reasons)
