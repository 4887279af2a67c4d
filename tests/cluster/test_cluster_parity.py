"""BLIS's 2-instance round-robin reference run, replayed: same instance for every request and
the same TTFT and E2E to the microsecond (tests/data/blis/r8_rr2.*)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import simulator
from simulator.metrics.results import BLIS_SUMMARY_FIELDS

DATA = Path(__file__).parent.parent / "data" / "blis"


@pytest.fixture(scope="module")
def r8():
    return simulator.replay(
        DATA / "r8_rr2.trace.yaml",
        DATA / "r8_rr2.trace.csv",
        model="meta-llama/llama-3.1-8b-instruct",
        hardware="H100",
        tp=1,
        latency__model="roofline",
        engine__total_kv_blocks=1_000_000,
        cluster__num_instances=2,
        cluster__routing__policy="round-robin",
    )


def test_every_request_goes_where_blis_sent_it(r8):
    with open(DATA / "r8_rr2.assignments.csv", newline="") as handle:
        expected = {
            f"request_{row['request_id']}": row["handled_by"] for row in csv.DictReader(handle)
        }
    got = {r.request_id: r.instance_id for r in r8.request_records}
    assert got == expected


def test_every_request_matches_blis_latencies(r8):
    with open(DATA / "r8_rr2.trace.csv", newline="") as handle:
        blis = {f"request_{row['request_id']}": row for row in csv.DictReader(handle)}
    mismatches = []
    for r in r8.request_records:
        row = blis[r.request_id]
        arrival = int(row["arrival_time_us"])
        ttft = int(row["first_chunk_time_us"]) - arrival
        e2e = int(row["last_chunk_time_us"]) - arrival
        ours_ttft = r.first_token_us - r.arrival_us
        ours_e2e = r.completion_us - r.arrival_us
        if abs(ours_ttft - ttft) > 1 or abs(ours_e2e - e2e) > 1:
            mismatches.append((r.request_id, ours_ttft, ttft, ours_e2e, e2e))
    assert not mismatches, mismatches[:5]


def test_cluster_summary_agrees_with_blis(r8):
    blis = json.loads((DATA / "r8_rr2.summary.json").read_text())
    for field in BLIS_SUMMARY_FIELDS:
        if field in ("instance_id", "total_output_tokens", "tokens_per_sec"):
            continue  # BLIS-Mar leaves first tokens out of output totals (docs/behaviour.md §A3)
        assert r8.summary[field] == pytest.approx(blis[field], rel=1e-9, abs=1e-9), field


def test_per_instance_summaries_add_up_to_the_cluster(r8):
    per = r8.instance_summaries
    assert [s["instance_id"] for s in per] == ["instance_0", "instance_1"]
    for key in (
        "completed_requests",
        "injected_requests",
        "total_input_tokens",
        "total_output_tokens",
    ):
        assert sum(s[key] for s in per) == r8.summary[key]
    durations = [s["vllm_estimated_duration_s"] for s in per]
    assert r8.summary["vllm_estimated_duration_s"] == max(durations)
    assert r8.routed == [500, 500]
    assert r8.in_flight_at_end == [0, 0]  # every routed request came back
