"""The numbers a report embeds are the run's own (issue 34): headline, percentiles, SLO
attainment and the steady-state verdict equal `Result`'s to the last bit; binned series
conserve what they bin; PD stages add up to E2E; a saved result or a results file reports
the same numbers as the live run; the page's data does not grow with the run.

Each pinned number is derived by hand in its test.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.metrics.persistence import load_result
from simulator.report import report_data
from simulator.report.run_data import (
    CDF_PROBABILITIES,
    MAX_BINS,
    cdf_of_us,
    run_data,
    time_series,
)
from simulator.report.run_source import PD_STAGES, RequestColumns, RunSource
from simulator.report.study_data import sweep_data
from tests.report.helpers import FakeSweep, synthetic_run


@pytest.fixture(scope="module")
def chatbot_data(chatbot):
    return report_data(chatbot)


# --- the run's own numbers ------------------------------------------------------------------


def test_headline_is_the_summary(chatbot, chatbot_data):
    for key, value in chatbot_data["headline"].items():
        assert value == chatbot.summary[key], key
    assert chatbot_data["summary"] == json.loads(json.dumps(chatbot.summary))


@pytest.mark.parametrize("metric", ["ttft", "e2e", "itl"])
def test_percentiles_are_the_summarys_exactly(chatbot, chatbot_data, metric):
    """The same integer µs samples and numpy's linear percentile: equal, not close. ITL is
    every token gap, as the summary's."""
    cdf = chatbot_data["latency"][metric]
    for q in (50, 90, 95, 99):
        assert cdf[f"p{q}"] == chatbot.summary[f"{metric}_p{q}_ms"]
    assert cdf["mean"] == chatbot.summary[f"{metric}_mean_ms"]


def test_slo_and_verdict_are_the_runs(chatbot, chatbot_data):
    assert chatbot_data["slo"] == json.loads(json.dumps(chatbot.slo))
    assert chatbot_data["steady"] == json.loads(json.dumps(chatbot.steady_state.document()))
    assert chatbot_data["slo"]["targets"] == {"ttft_ms": 500.0, "itl_ms": 50.0}


def test_cdf_by_hand():
    """Samples 1, 2, 3, 4 ms: numpy's linear percentile puts p at (n - 1)·p/100 = 3p/100
    between sorted samples, so p50 → 1.5 → 2 + 0.5 = 2.5 ms, p99 → 2.97 → 3 + 0.97 = 3.97 ms,
    p0 = 1 ms and p100 = 4 ms; the mean is 10 / 4 = 2.5 ms."""
    cdf = cdf_of_us(np.array([4000, 1000, 3000, 2000]))
    assert cdf["n"] == 4
    assert cdf["p50"] == 2.5 and cdf["p99"] == pytest.approx(3.97) and cdf["mean"] == 2.5
    assert cdf["ms"][0] == 1.0 and cdf["ms"][-1] == 4.0
    assert cdf["p"][0] == 0.0 and cdf["p"][-1] == 1.0


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=300))
def test_cdf_is_monotone_and_spans_its_samples(samples):
    cdf = cdf_of_us(np.array(samples, dtype=np.int64))
    assert np.all(np.diff(cdf["p"]) > 0)
    assert np.all(np.diff(cdf["ms"]) >= 0)
    # Rounded to six significant digits, so the ends agree to that precision.
    assert cdf["ms"][0] == pytest.approx(min(samples) / 1000, rel=1e-5, abs=1e-9)
    assert cdf["ms"][-1] == pytest.approx(max(samples) / 1000, rel=1e-5, abs=1e-9)
    assert len(cdf["ms"]) == len(CDF_PROBABILITIES)


# --- time series ----------------------------------------------------------------------------


def test_series_conserve_completions_tokens_and_preemptions(chatbot, chatbot_data):
    ts = chatbot_data["timeseries"]
    assert ts["completed_in_bins"] == chatbot.summary["completed_requests"]
    # Decode tokens of every step plus each request's first token: every output token.
    assert ts["pooled"]["output_tokens_in_bins"] == chatbot.summary["total_output_tokens"]
    assert ts["pooled"]["preemptions"] == chatbot.summary["preemption_count"] == 0
    rebuilt = sum(v * ts["bin_s"] for v in ts["pooled"]["completions_per_s"])
    assert rebuilt == pytest.approx(chatbot.summary["completed_requests"], rel=1e-5)


def test_preemptions_are_binned_whole(preempting):
    """Every preemption lands in exactly one bin. A preempted request recomputes its prompt
    and input plus the tokens it had; the step that completes that recomputation produces its
    next token as a prefill step does, so it is in the engine's output-token total but in no
    step's decode tokens: one token per preemption (every request here finished)."""
    data = report_data(preempting)
    ts = data["timeseries"]
    preemptions = preempting.summary["preemption_count"]
    assert preemptions > 0
    assert ts["pooled"]["preemptions"] == preemptions
    assert sum(r["preemptions"] for r in ts["instances"]) == preemptions
    assert preempting.summary["completed_requests"] == preempting.summary["injected_requests"]
    assert (
        ts["pooled"]["output_tokens_in_bins"] + preemptions
        == (preempting.summary["total_output_tokens"])
    )


def test_preemption_bins_by_hand():
    """Steps ending at 0.5, 1.5 and 2.5 s with running totals 0, 2, 3 and one completion at
    2.5 s: the run lasts 2.5 s, 1 event asks for MIN_BINS = 24 bins, and the smallest nice
    width giving at most 24 bins over 2.5 s is 0.2 s (13 bins; 0.1 s would be 25). Bins
    [1.4, 1.6) and [2.4, 2.6) hold the step ends at 1.5 and 2.5 s: 2 and 1 preemptions, i.e.
    10 and 5 per second; every other bin 0."""
    steps = pd.DataFrame(
        {
            "instance_id": "i0",
            "start_us": [400_000, 1_400_000, 2_400_000],
            "step_us": [100_000, 100_000, 100_000],
            "batch_size": [1, 1, 1],
            "prefill_tokens": [0, 0, 0],
            "decode_tokens": [1, 1, 1],
            "kv_used_blocks": [1, 1, 1],
            "queue_length": [0, 0, 0],
            "running_requests": [1, 1, 1],
            "preemptions_total": [0, 2, 3],
        }
    )
    one = np.array([0])
    requests = RequestColumns(
        arrival_us=one,
        first_token_us=np.array([500_000]),
        completion_us=np.array([2_500_000]),
        generated_tokens=np.array([3]),
        state=np.array(["completed"], dtype=object),
        instance_id=np.array(["i0"], dtype=object),
        slo_class=np.array([""], dtype=object),
        tpot_ms=np.array([1000.0]),
    )
    ts = time_series(RunSource("saved", {}, {}, requests, steps=steps))
    assert ts["bin_s"] == 0.2
    assert len(ts["t_s"]) == 13
    per_s = ts["instances"][0]["preemptions_per_s"]
    assert per_s[7] == 10.0 and per_s[12] == 5.0
    assert sum(per_s) == 15.0
    # The first token and the three decode tokens.
    assert ts["pooled"]["output_tokens_in_bins"] == 4


# --- PD, routing, lifecycle -----------------------------------------------------------------


def test_pd_stages_add_up_to_each_requests_e2e(pd_run):
    """Conservation and causality: per disaggregated request the five stages are each >= 0
    and sum to its E2E exactly (integer µs)."""
    from simulator.report.run_source import _pd_stages

    stages = _pd_stages(pd_run.pd.parents)
    assert len(stages["e2e"]) == pd_run.summary["completed_requests"] == 200
    total = sum(stages[name] for name in PD_STAGES)
    assert np.array_equal(total, stages["e2e"])
    for name in PD_STAGES:
        assert (stages[name] >= 0).all(), name
    data = report_data(pd_run)
    means = sum(s["mean_ms"] for s in data["pd"]["stages"].values())
    assert means == pytest.approx(data["pd"]["e2e_mean_ms"], rel=1e-12)
    assert data["pd"]["e2e_mean_ms"] == pytest.approx(pd_run.summary["e2e_mean_ms"], rel=1e-12)
    assert data["pd"]["metrics"] == json.loads(json.dumps(pd_run.pd_metrics))


def test_pd_tokens_are_counted_once(pd_run):
    """A disaggregated request's first token is its decode sub-request's first decode step:
    counting the parent's first token too would count it twice."""
    ts = report_data(pd_run)["timeseries"]
    assert ts["pooled"]["output_tokens_in_bins"] == pd_run.summary["total_output_tokens"]


def test_routing_decisions_are_all_binned(pd_run):
    data = report_data(pd_run)
    dec = data["balance"]["decisions"]
    routed = dec["summary"]["routing_decisions"]
    assert routed == len(pd_run.decisions.routings) > 0
    rebuilt = sum(sum(v) for v in dec["per_target"].values()) * dec["bin_s"]
    assert rebuilt == pytest.approx(routed, rel=1e-5)
    assert dec["regret"]["k"] == 2
    # Per-instance rows: the instances' own routed counts, labelled with their pool.
    rows = data["balance"]["instances"]
    assert [r["routed"] for r in rows] == pd_run.routed
    assert [r["label"] for r in rows][:1] == ["instance_0 (prefill)"]


def test_lifecycle_events_are_the_timeline(fleet_run):
    data = report_data(fleet_run)
    events = data["lifecycle"]["events"]
    assert len(events) == len(fleet_run.timeline) == 17
    failed = [e for e in events if e["reason"] == "event fail_node at 4 s"]
    # The failed node's instance and the node itself terminate at 4 s.
    assert {e["time_s"] for e in failed} == {4.0} and len(failed) == 2
    assert data["lifecycle"]["fleet"]["instances_created"] == 3


def test_sections_that_do_not_apply_say_why(chatbot_data):
    assert chatbot_data["pd"] is None and "pd" in chatbot_data["notes"]
    assert chatbot_data["balance"] is None and "balance" in chatbot_data["notes"]
    assert chatbot_data["lifecycle"] is None and "lifecycle" in chatbot_data["notes"]


# --- other sources --------------------------------------------------------------------------


def test_a_saved_result_reports_the_live_numbers(chatbot, chatbot_data, tmp_path):
    """From the Parquet tables alone: the same headline, TTFT/E2E CDFs, time series and
    (recomputed) steady-state evidence. Only the every-gap ITL needs the live engines."""
    saved = report_data(load_result(chatbot.save(tmp_path / "saved")))
    assert saved["source"] == "saved"
    for key in ("headline", "steady", "timeseries", "scenario"):
        assert saved[key] == chatbot_data[key], key
    for metric in ("ttft", "e2e", "tpot"):
        assert saved["latency"][metric] == chatbot_data["latency"][metric], metric
    assert "itl" not in saved["latency"] and "itl" in saved["notes"]
    assert saved["slo"]["slo_attainment"] == chatbot.summary["slo_attainment"]


def test_a_results_file_reports_its_numbers(chatbot):
    """A --results-path document has ms latencies per request: percentiles agree with the
    summary to float rounding of µs / 1000."""
    doc = json.loads(json.dumps(chatbot.results_document()))
    data = report_data(doc)
    assert data["source"] == "document"
    for metric in ("ttft", "e2e"):
        for q in (50, 99):
            assert data["latency"][metric][f"p{q}"] == pytest.approx(
                chatbot.summary[f"{metric}_p{q}_ms"], rel=1e-9
            )
    assert data["steady"] == json.loads(json.dumps(chatbot.steady_state.document()))
    assert data["timeseries"]["completed_in_bins"] == chatbot.summary["completed_requests"]
    assert data["timeseries"]["instances"] == []


# --- size -----------------------------------------------------------------------------------


def test_the_page_does_not_grow_with_the_run():
    """A million requests on 8 instances (200,000 steps each): the embedded data is bounded
    by the CDF probabilities and MAX_BINS, not by requests or steps, and the whole page, with
    plotly.js inside, stays under 5 MB."""
    from simulator.report.build import render_run

    small = run_data(synthetic_run(1_000, 8, 1_000))
    large = run_data(synthetic_run(1_000_000, 8, 200_000))
    assert len(large["timeseries"]["t_s"]) <= MAX_BINS
    assert len(large["latency"]["ttft"]["ms"]) == len(CDF_PROBABILITIES)
    large_bytes = len(json.dumps(large))
    assert large_bytes < 400_000
    assert large_bytes < 4 * len(json.dumps(small))  # bins: 24 for 1,000, 240 for 1M
    page = render_run(large)
    assert len(page.encode()) < 5_000_000, len(page.encode()) / 1e6


def test_a_large_fleet_keeps_the_pooled_series():
    """Above MAX_INSTANCE_SERIES instances the per-instance lines are dropped (the note says
    so) and the state charts show the pooled fleet alone."""
    from simulator.report.figures import time_series as series_charts
    from simulator.report.run_data import MAX_INSTANCE_SERIES

    data = run_data(synthetic_run(2_000, MAX_INSTANCE_SERIES + 1, 50))
    assert data["timeseries"]["instances"] == []
    assert data["timeseries"]["instances_hidden"] == MAX_INSTANCE_SERIES + 1
    assert "pooled series only" in data["notes"]["timeseries"]
    charts = {c.fid: c.figure for c in series_charts(data)}
    assert {"ts-queue", "ts-kv", "ts-batch", "ts-preemptions"} <= set(charts)
    (queue,) = charts["ts-queue"].data
    assert queue.name == "all instances (sum)" and queue.visible is True


# --- sweeps ---------------------------------------------------------------------------------


def test_knee_is_the_first_load_not_every_seed_steady():
    """Loads given out of order; steady seeds 2/2 at 10 and 20, 1/2 at 40, 0/2 at 80: the
    knee is 40 (the smallest load where some seed was not steady), as plot_latency_vs_load."""
    points = pd.DataFrame(
        {
            "point": [0, 1, 2, 3],
            "workload.rate": [40, 10, 80, 20],
            "n_seeds": 2,
            "steady_seeds": [1, 2, 0, 2],
            "ttft_p99_ms_mean": [300.0, 50.0, 9000.0, 60.0],
            "ttft_p99_ms_ci95": [30.0, 5.0, math.nan, 6.0],
        }
    )
    data = sweep_data(FakeSweep(points, ["workload.rate"], [1, 2]))
    (curve,) = data["curves"]
    assert curve["load"] == [10, 20, 40, 80]
    assert curve["metrics"]["ttft_p99_ms"]["mean"] == [50.0, 60.0, 300.0, 9000.0]
    assert curve["knee"] == {"load": 40, "steady_seeds": 1, "n_seeds": 2}
    assert curve["metrics"]["ttft_p99_ms"]["ci95"][-1] is None  # NaN: one finite seed


def test_one_curve_per_other_parameter():
    points = pd.DataFrame(
        {
            "point": [0, 1, 2, 3],
            "workload.rate": [10, 20, 10, 20],
            "cluster.num_instances": [1, 1, 2, 2],
            "n_seeds": 1,
            "steady_seeds": [1, 0, 1, 1],
            "e2e_p99_ms_mean": [1.0, 2.0, 3.0, 4.0],
            "e2e_p99_ms_ci95": math.nan,
        }
    )
    data = sweep_data(FakeSweep(points, ["workload.rate", "cluster.num_instances"], [1]))
    assert data["load"] == "workload.rate"
    labels = {c["label"]: c["knee"] for c in data["curves"]}
    assert labels == {
        "cluster.num_instances=1": {"load": 20, "steady_seeds": 0, "n_seeds": 1},
        "cluster.num_instances=2": None,
    }


def test_a_pd_run_in_which_no_request_arrived_still_has_a_report() -> None:
    """The horizon (1 µs) ends the run before the first arrival (1 req/s): nothing to chart,
    yet the report builds, and says no request was completed."""
    import simulator

    result = simulator.simulate(
        {
            "model": "meta-llama/llama-3.1-8b-instruct",
            "hardware": "H100",
            "horizon_us": 1,
            "workload": {"num_requests": 5, "rate": 1},
            "cluster": {
                "num_instances": 2,
                "pd": {"prefill_instances": 1, "decode_instances": 1, "decider": "always"},
            },
        },
        warn_unsteady=False,
    )
    assert result.summary["injected_requests"] == 0
    data = report_data(result)
    assert data["headline"]["completed_requests"] == 0
