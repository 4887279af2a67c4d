"""Closed-loop load against BLIS-current, request by request (tests/data/blis_head, README
there: case h5 and its two closed-loop replays).

h5: 16 virtual users (`concurrency: 16`), think time 500 ms, 512 → 128 tokens, 1000 requests,
roofline, one instance. Every request's arrival, first-token and last-token time must equal
BLIS's to the µs: the users' start times (u · 500 ms / 16), the follow-up rule (end of the
step that produced the last token + think time), the follow-up budget (1000 − 16) and the
request names all agree. With roofline there is no α overhead, so BLIS's completion tick and
the trace's last chunk are the same instant.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import simulator
from simulator.scenario import TraceSpec, scenario_from_dict

DATA = Path(__file__).resolve().parent.parent / "data" / "blis_head"
CASE = "h5_closed_loop"
DEPLOYMENT = {
    "model": "meta-llama/llama-3.1-8b-instruct",
    "hardware": "H100",
    "tp": 1,
    "seed": 42,
    "latency": {"model": "roofline"},
    "engine": {"total_kv_blocks": 29205},
}


def _trace_times(path: Path) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(session, round) -> (arrival, first chunk, last chunk) µs of a TraceV2/v3 CSV."""
    with path.open(newline="") as handle:
        return {
            (row["session_id"], int(row["round_index"])): (
                int(row["arrival_time_us"]),
                int(row["first_chunk_time_us"]),
                int(row["last_chunk_time_us"]),
            )
            for row in csv.DictReader(handle)
        }


@pytest.fixture(scope="module")
def h5_run(tmp_path_factory) -> tuple[simulator.Result, Path]:
    scenario = scenario_from_dict(
        {**DEPLOYMENT, "workload_spec": str(DATA / f"{CASE}.workload.yaml")}
    )
    result = simulator.simulate(scenario)
    prefix = tmp_path_factory.mktemp("h5") / "sim"
    result.write_trace(str(prefix))
    return result, prefix.with_suffix(".csv")


def test_h5_matches_blis_request_for_request(h5_run):
    result, trace = h5_run
    blis = _trace_times(DATA / f"{CASE}.trace.csv")
    mine = _trace_times(trace)
    assert set(mine) == set(blis)  # the same 1000 (user, round) pairs
    assert len(blis) == 1000
    different = {k: (blis[k], mine[k]) for k in blis if blis[k] != mine[k]}
    assert not different, list(different.items())[:3]


def test_h5_summary_matches_blis(h5_run):
    result, _ = h5_run
    blis = json.loads((DATA / f"{CASE}.summary.json").read_text())
    for key in ("completed_requests", "injected_requests", "total_output_tokens"):
        assert result.summary[key] == blis[key], key
    for key in ("ttft_mean_ms", "e2e_mean_ms", "itl_mean_ms", "vllm_estimated_duration_s"):
        assert result.summary[key] == pytest.approx(blis[key], rel=1e-12), key


def test_h5_users_start_spread_over_one_think_time(h5_run):
    # Hand computation: user u's first request at u × 500,000 µs / 16 = u × 31,250 µs.
    blis = _trace_times(DATA / f"{CASE}.trace.csv")
    firsts = [blis[(f"concurrency_c0_user_{u}", 0)][0] for u in range(16)]
    assert firsts == [u * 31_250 for u in range(16)]


def test_h5_follow_ups_arrive_one_think_time_after_the_last_token(h5_run):
    # The closed-loop law BLIS keeps: round r+1 arrives 500 ms after round r's last chunk.
    _, trace = h5_run
    mine = _trace_times(trace)
    for (session, r), (arrival, _, _) in mine.items():
        if r:
            assert arrival == mine[(session, r - 1)][2] + 500_000, (session, r)


def test_h5_names_follow_ups_as_blis(h5_run):
    result, _ = h5_run
    names = {r["requestID"] for r in result.results_document()["requests"]}
    # Follow-up k (1-based, over all users) of user u's round r: as in BLIS's metrics file.
    assert "session_concurrency_c0_user_0_round_1_1" in names
    assert "session_concurrency_c0_user_4_round_62_981" in names
    assert result.session_counts == {
        "completed": 0,
        "cancelled": 0,
        "horizon_interrupted": 0,
        "budget_exhausted": 16,
        "total": 16,
    }


def test_concurrency_flag_gives_the_same_run_as_the_spec(h5_run, tmp_path):
    # BLIS documents `--concurrency 16 --think-time-ms 500` with constant 512/128 lengths as
    # the same workload as h5's spec; so it is here.
    from typer.testing import CliRunner

    from simulator.cli import app

    out = tmp_path / "metrics.json"
    args = ["run", "--model", DEPLOYMENT["model"], "--hardware", "H100", "--tp", "1"]
    args += ["--latency-model", "roofline", "--total-kv-blocks", "29205", "--seed", "42"]
    args += ["--concurrency", "16", "--think-time-ms", "500", "--num-requests", "1000"]
    args += ["--prompt-tokens", "512", "--prompt-tokens-stdev", "0"]
    args += ["--output-tokens", "128", "--output-tokens-stdev", "0"]
    args += ["--metrics-path", str(out), "-q"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.stderr
    flag_run = {
        (r["session_id"], r["round_index"]): r for r in json.loads(out.read_text())["requests"]
    }
    spec_run = {
        (r["session_id"], r["round_index"]): r for r in h5_run[0].results_document()["requests"]
    }
    assert len(flag_run) == len(spec_run) == 1000
    for (session, r_index), r in spec_run.items():
        # The flag's client is BLIS's `distribution`, the spec's `c0`: only the names differ.
        other = flag_run[(session.replace("_c0_", "_distribution_"), r_index)]
        assert (other["arrived_at"], other["ttft_ms"], other["e2e_ms"]) == (
            r["arrived_at"],
            r["ttft_ms"],
            r["e2e_ms"],
        )


@pytest.mark.parametrize(
    ("case", "think_time"),
    [("think500", "constant:value=500ms"), ("gaps", None)],
)
def test_closed_loop_replay_matches_blis(case, think_time):
    """`blis replay --session-mode closed-loop` of h5's trace (--horizon 100 s): with
    `--think-time-ms 500`, and with no think flag (each round's think time is then the
    recorded gap between its arrival and the previous round's; 944 requests fit before the
    horizon). Arrival, TTFT and E2E of every request, and its name, match BLIS."""
    scenario = scenario_from_dict({**DEPLOYMENT, "horizon_us": 100_000_000})
    scenario.trace = TraceSpec(
        header=DATA / f"{CASE}.trace.yaml",
        data=DATA / f"{CASE}.trace.csv",
        session_mode="closed-loop",
        think_time=think_time,
    )
    result = simulator.simulate(scenario)
    with (DATA / f"{CASE}_replay_{case}.requests.csv").open(newline="") as handle:
        blis = {(r["session_id"], int(r["round_index"])): r for r in csv.DictReader(handle)}
    mine = {(r["session_id"], r["round_index"]): r for r in result.results_document()["requests"]}
    assert set(mine) == set(blis)
    for key, theirs in blis.items():
        ours = mine[key]
        assert ours["requestID"] == theirs["requestID"], key
        for field in ("arrived_at", "ttft_ms", "e2e_ms"):
            assert ours[field] == pytest.approx(float(theirs[field]), abs=1e-9), (key, field)
    summary = json.loads((DATA / f"{CASE}_replay_{case}.summary.json").read_text())
    assert result.summary["completed_requests"] == summary["completed_requests"]


def test_python_replay_in_closed_loop():
    result = simulator.replay(
        DATA / f"{CASE}.trace.yaml",
        DATA / f"{CASE}.trace.csv",
        {k: v for k, v in DEPLOYMENT.items() if k != "seed"},
        session_mode="closed-loop",
        think_time="constant:value=500ms",
    )
    blis = json.loads((DATA / f"{CASE}.summary.json").read_text())
    assert result.summary["ttft_mean_ms"] == pytest.approx(blis["ttft_mean_ms"], rel=1e-12)
    assert result.summary["e2e_mean_ms"] == pytest.approx(blis["e2e_mean_ms"], rel=1e-12)
