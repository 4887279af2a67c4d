"""`=== Session Metrics ===`: BLIS-current's cold/warm TTFT and session duration
(docs/results.md "Sessions"), by hand, as laws, and against BLIS's own h5 run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.engine.request import RequestState
from simulator.metrics.results import SESSION_HEADER, Result
from simulator.scenario import scenario_from_dict

DATA = Path(__file__).resolve().parent.parent / "data" / "blis_head"


def _req(session, rnd, arrival, first=-1, done=-1, state=RequestState.COMPLETED):
    return SimpleNamespace(
        session_id=session,
        round_index=rnd,
        arrival_us=arrival,
        first_token_us=first,
        completion_us=done,
        state=state,
    )


def _result(records) -> Result:
    return Result(summary={}, request_records=records, instance_records=[], instance_ids=[])


def test_session_statistics_by_hand():
    records = [
        _req("a", 0, 0, 10_000, 50_000),
        _req("a", 1, 60_000, 64_000, 90_000),
        _req("b", 0, 5_000, 9_000, 40_000),
        # b's second round timed out after its first token: a warm TTFT, no completion.
        _req("b", 1, 45_000, 47_000, -1, RequestState.TIMED_OUT),
        _req("", 0, 1_000, 2_000, 3_000),  # not in a session: ignored
        # c has no round 0 (a trace cut before it): its TTFT counts, its duration does not.
        _req("c", 3, 0, 1_000, 2_000),
    ]
    got = _result(records).session_metrics
    assert got["sessions"] == 3
    # cold: a 10 ms, b 4 ms -> mean 7, p50 7, p95 = 4 + 0.95 × 6 = 9.7, p99 = 9.94.
    assert got["ttft_cold_ms"] == pytest.approx(
        {"mean": 7.0, "p50": 7.0, "p95": 9.7, "p99": 9.94, "n": 2}
    )
    # warm: a 4 ms, b 2 ms, c 1 ms -> mean 7/3, p50 2.
    assert got["ttft_warm_ms"]["n"] == 3
    assert got["ttft_warm_ms"]["mean"] == pytest.approx(7 / 3)
    assert got["ttft_warm_ms"]["p50"] == 2.0
    # durations: a 90,000 − 0 = 90 ms; b's last completion is round 0's, 40,000 − 5,000 = 35 ms.
    assert got["session_duration_ms"]["n"] == 2
    assert got["session_duration_ms"]["mean"] == pytest.approx(62.5)


def test_no_session_no_block():
    result = simulator.simulate({"workload": {"num_requests": 20, "rate": 20}})
    assert result.session_metrics is None
    assert SESSION_HEADER not in result.report_text()
    doc = result.results_document()
    assert "session_metrics" not in doc and "sessions" not in doc


@st.composite
def session_records(draw):
    records = []
    for s in range(draw(st.integers(1, 4))):
        t = draw(st.integers(0, 10_000))
        for rnd in range(draw(st.integers(1, 4))):
            ttft = draw(st.integers(1, 5_000))
            e2e = ttft + draw(st.integers(0, 5_000))
            state = draw(st.sampled_from([RequestState.COMPLETED, RequestState.TIMED_OUT]))
            done = t + e2e if state is RequestState.COMPLETED else -1
            records.append(_req(f"s{s}", rnd, t, t + ttft, done, state))
            t += e2e + draw(st.integers(0, 3_000))
    return records


@settings(max_examples=60, deadline=None)
@given(session_records())
def test_session_statistics_laws(records):
    got = _result(records).session_metrics
    assert got["sessions"] == len({r.session_id for r in records})
    # Every request with a first token is counted once, cold or warm.
    assert got["ttft_cold_ms"]["n"] + got["ttft_warm_ms"]["n"] == len(records)
    assert got["ttft_cold_ms"]["n"] == got["sessions"]
    for key in ("ttft_cold_ms", "ttft_warm_ms", "session_duration_ms"):
        stats = got[key]
        if stats["n"]:
            assert stats["p50"] <= stats["p95"] <= stats["p99"]
    # A session lasts at least as long as any of its completed requests (they arrive no
    # earlier than its round 0), and no longer than the whole run.
    for sid in {r.session_id for r in records}:
        own = [r for r in records if r.session_id == sid]
        e2e = [(r.completion_us - r.arrival_us) / 1000 for r in own if r.completion_us >= 0]
        duration = _result(own).session_metrics["session_duration_ms"]
        assert duration["n"] == (1 if e2e else 0)
        if e2e:
            assert duration["mean"] >= max(e2e)


def _blis_session_block(text: str) -> dict[str, list[float]]:
    """BLIS's printed lines: `label: mean=.. p50=.. p95=.. p99=.. ms (n=..)`."""
    block = text.split("=== Session Metrics ===")[1]
    out = {"sessions": [float(re.search(r"Sessions: (\d+)", block).group(1))]}
    for label, key in (
        ("TTFT cold", "ttft_cold_ms"),
        ("TTFT warm", "ttft_warm_ms"),
        ("Session duration", "session_duration_ms"),
    ):
        line = next(x for x in block.splitlines() if x.strip().startswith(label))
        # mean, p50, p95, p99, then n
        out[key] = [float(v) for v in re.findall(r"=([\d.]+)", line)]
    return out


def test_h5_session_block_matches_blis():
    # h5 (tests/data/blis_head/README.md) matches BLIS to the µs request for request, so its
    # session statistics must print the same two-decimal figures BLIS printed.
    scenario = scenario_from_dict(
        {
            "model": "meta-llama/llama-3.1-8b-instruct",
            "hardware": "H100",
            "tp": 1,
            "seed": 42,
            "latency": {"model": "roofline"},
            "engine": {"total_kv_blocks": 29205},
            "workload_spec": str(DATA / "h5_closed_loop.workload.yaml"),
        }
    )
    result = simulator.simulate(scenario)
    blis = _blis_session_block((DATA / "h5_closed_loop.stdout.txt").read_text())
    ours = result.session_metrics
    assert ours["sessions"] == blis["sessions"][0] == 16
    for key in ("ttft_cold_ms", "ttft_warm_ms", "session_duration_ms"):
        stats = ours[key]
        mine = [round(stats[k], 2) for k in ("mean", "p50", "p95", "p99")] + [stats["n"]]
        assert mine == blis[key], key
    # The printed block adds how the sessions ended; the results JSON holds the same dict.
    printed = result.report_text().split(SESSION_HEADER + "\n")[1]
    block = json.JSONDecoder().raw_decode(printed)[0]
    assert block["outcomes"] == result.session_counts
    assert block["ttft_cold_ms"] == ours["ttft_cold_ms"]
    assert result.results_document()["session_metrics"] == ours
