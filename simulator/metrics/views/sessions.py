"""Views of the run's users: BLIS-current's session statistics, how the sessions ended, and
what a trace's `max_in_flight` client cap held back (docs/results.md "Sessions")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...engine.request import RequestState
from ..request_table import request_columns
from ..summary import mean, pct


def session_metrics(records: Sequence) -> dict[str, Any] | None:
    """BLIS-current's session statistics (docs/results.md "Sessions"), or None when no
    request belongs to a session. `sessions` counts the distinct session IDs; TTFT cold is
    over round-0 requests and warm over later rounds (every request that got a first
    token); a session's duration runs from its round-0 arrival to its last completion
    (sessions without a round 0, or with no completed request after it, are left out).
    Each statistic is {mean, p50, p95, p99, n} in ms, percentiles interpolated linearly."""
    cols = request_columns(
        records,
        ("arrival_us", "first_token_us", "completion_us", "round_index"),
        ("session_id", "state"),
    )
    in_session = cols["session_id"] != ""
    if not in_session.any():
        return None
    sid = cols["session_id"][in_session]
    arrival = cols["arrival_us"][in_session]
    first = cols["first_token_us"][in_session]
    done = cols["completion_us"][in_session]
    rnd = cols["round_index"][in_session]
    completed = cols["state"][in_session] == RequestState.COMPLETED
    has_token = first >= 0
    cold = (first - arrival)[has_token & (rnd == 0)] / 1000
    warm = (first - arrival)[has_token & (rnd > 0)] / 1000
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for s, a in zip(sid[rnd == 0], arrival[rnd == 0], strict=True):
        start.setdefault(s, int(a))
    for s, c in zip(sid[completed], done[completed], strict=True):
        end[s] = max(end.get(s, int(c)), int(c))
    durations = [end[s] - a for s, a in start.items() if end.get(s, a) > a]

    def stats(values_ms) -> dict[str, Any]:
        values_ms = np.asarray(values_ms, dtype=float)
        return {
            "mean": mean(values_ms),
            "p50": pct(values_ms, 50),
            "p95": pct(values_ms, 95),
            "p99": pct(values_ms, 99),
            "n": len(values_ms),
        }

    return {
        "sessions": len(set(sid)),
        "ttft_cold_ms": stats(cold),
        "ttft_warm_ms": stats(warm),
        "session_duration_ms": stats(np.asarray(durations, dtype=float) / 1000),
    }


def session_block(metrics: dict[str, Any] | None, counts: dict[str, int]) -> dict[str, Any] | None:
    """What `=== Session Metrics ===` prints: the statistics, then how the sessions ended
    (`session_counts`, when the run tracked them)."""
    if metrics is None and not counts:
        return None
    block = dict(metrics or {})
    if counts:
        block["outcomes"] = counts
    return block


def client_cap(
    scenario: dict[str, Any], delayed_requests: int, wait_us: int, unsent_requests: int = 0
) -> dict[str, Any] | None:
    """The load generator's cap on outstanding requests and what it held back (a trace
    replayed with `max_in_flight`), or None without a cap: requests sent late, their mean
    wait, and those due before the horizon that it never sent."""
    cap = (scenario.get("trace") or {}).get("max_in_flight")
    if cap is None:
        return None
    delayed = delayed_requests
    return {
        "max_in_flight": cap,
        "requests_sent_late": delayed,
        "mean_client_wait_ms": round(wait_us / delayed / 1000, 3) if delayed else 0.0,
        "requests_never_sent": unsent_requests,
    }
