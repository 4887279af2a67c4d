"""BLIS-current's PD run h4 (1 prefill + 1 decode instance, `--pd-decider always`, roofline,
1000 requests of 512 → 128 tokens at Poisson 20/s), replayed request by request
(tests/data/blis_head/README.md "PD disaggregation"; docs/pd.md "Parity with BLIS-current").

servesim differs from BLIS-current's PD in four known ways, each tested here:

1. **The transfer starts at the end of the final prefill step** (servesim) — BLIS starts it
   at the step's start, so the prefill step (11,884 µs for 512 tokens) is in neither BLIS's
   TTFT nor its E2E.
2. **One step at a time.** BLIS's prefill instance counts as idle from the start of a step
   that finishes its last request, so a prompt that arrives during that step starts a second,
   overlapping step at once; servesim's waits for the step to end (219 of h4's prompts arrive
   within 11,884 µs of the previous one).
3. **The decode instance computes every output token.** servesim's decode sub-request takes
   one step per output token (the decode engine computes the first token again, as vLLM's
   P/D connector does); BLIS's takes output − 1 steps, its last step delivering two tokens.
4. **Link contention.** BLIS's `--pd-transfer-contention` is off unless given; servesim's
   `transfer_contention` is on by default. The replays pass it off, as BLIS ran.

With 2–4 taken out (four prefill instances, so no prompt ever waits; each request's output
one token shorter; contention off) every one of the 1000 requests is BLIS's plus exactly the
prefill step, in both TTFT and E2E.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

import simulator

DATA = Path(__file__).resolve().parent.parent / "data" / "blis_head"
H4 = "h4_pd_1p1d"
ALONE = "h4_pd_request0_alone"
PREFILL_STEP_US = 11_884  # one 512-token prefill, roofline, H100 TP1
# max(1, ceil(0.05 ms × 1000 + 512 × 131,072 B / (25 GB/s × 1000))) = ceil(50 + 2,684.35)
TRANSFER_US = 2_735
# The flags of tests/data/blis_head/README.md (block size 16, 256 sequences and a 2048-token
# budget are BLIS's defaults and servesim's alike), contention off as BLIS ran (4 above).
FLAGS = dict(
    model="meta-llama/llama-3.1-8b-instruct",
    hardware="H100",
    tp=1,
    latency__model="roofline",
    engine__total_kv_blocks=29_205,
    cluster__num_instances=2,
    cluster__pd__prefill_instances=1,
    cluster__pd__decode_instances=1,
    cluster__pd__decider="always",
    cluster__pd__transfer_contention=False,
)


def _replay(header: Path, data: Path, **overrides) -> simulator.Result:
    return simulator.replay(header, data, **{**FLAGS, **overrides})


def _blis_requests(case: str) -> dict[str, dict]:
    """BLIS's per-request metrics (ms) by request id. Its PD trace has no timings (every row
    `incomplete`): the metrics file is the only per-request record."""
    doc = json.loads((DATA / f"{case}.metrics.json").read_text())
    return {r["requestID"]: r for r in doc["requests"]}


def _us(ms: float) -> int:
    return round(ms * 1000)


def _blis_blocks() -> dict[str, dict]:
    text = (DATA / f"{H4}.stdout.txt").read_text()
    blocks = []
    decoder = json.JSONDecoder()
    for part in text.split("=== Simulation Metrics ===\n")[1:]:
        blocks.append(decoder.raw_decode(part)[0])
    return {b["instance_id"]: b for b in blocks}


@pytest.fixture(scope="module")
def h4() -> simulator.Result:
    return _replay(DATA / f"{H4}.trace.yaml", DATA / f"{H4}.trace.csv")


# ------------------------------------------------------------- request 0 alone, by hand


def test_request_0_alone_by_hand():
    # BLIS's replay of h4's first row alone, and its step timeline (README: the `alone` case).
    result = _replay(DATA / f"{ALONE}.trace.yaml", DATA / f"{ALONE}.trace.csv")
    (req,) = result.request_records
    blis = _blis_requests(ALONE)["request_0"]
    with open(DATA / f"{ALONE}.steps.csv", newline="") as handle:
        rows = [
            (r["instance_id"], int(r["start_us"]), int(r["end_us"])) for r in csv.DictReader(handle)
        ]
    blis_prefill = rows[0]
    blis_decode = [end - start for _, start, end in rows[1:]]
    assert blis_prefill == ("instance_0", 25_304, 25_304 + PREFILL_STEP_US)

    # Prefill: both run it 25,304 → 37,188.
    pre = req.prefill_sub
    assert (pre.arrival_us, pre.schedule_us, pre.completion_us) == (25_304, 25_304, 37_188)
    # Transfer: servesim's starts at the prefill step's end (1), BLIS's at its start.
    assert req.transfer_start_us == 37_188
    assert req.transfer_end_us == 37_188 + TRANSFER_US == 39_923
    assert rows[1][1] == 25_304 + TRANSFER_US == 28_039  # BLIS's first decode step starts
    # Decode: BLIS 127 steps, servesim 128 (3); the first 127 take the same time.
    steps = result.steps
    ours = steps[steps.instance_id == "instance_1"].step_us.tolist()
    assert len(blis_decode) == 127 and len(ours) == 128
    assert ours[:127] == blis_decode
    assert sum(blis_decode) == 389_516 and ours[127] == 3_070
    # TTFT: BLIS 2,735 + 3,065 = 5,800; servesim adds the prefill step: 17,684.
    assert blis_decode[0] == 3_065
    assert _us(blis["ttft_ms"]) == TRANSFER_US + 3_065 == 5_800
    assert req.first_token_us - req.arrival_us == PREFILL_STEP_US + 5_800 == 17_684
    # E2E: BLIS 2,735 + 389,516 = 392,251; servesim 11,884 + 2,735 + 389,516 + 3,070.
    assert _us(blis["e2e_ms"]) == TRANSFER_US + 389_516 == 392_251
    assert req.completion_us - req.arrival_us == 11_884 + 392_251 + 3_070 == 407_205


# ------------------------------------------- all 1000 requests, the differences taken out


@pytest.fixture(scope="module")
def h4_aligned(tmp_path_factory) -> simulator.Result:
    """h4 with differences 2–4 removed: every output one token shorter (servesim's decode
    sub-request then takes BLIS's output − 1 steps), four round-robin prefill instances (a
    prompt finds its instance idle, as BLIS's overlapping steps do), contention off."""
    folder = tmp_path_factory.mktemp("h4")
    with open(DATA / f"{H4}.trace.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row["output_tokens"] = str(int(row["output_tokens"]) - 1)
    with open(folder / "h4.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    shutil.copy(DATA / f"{H4}.trace.yaml", folder / "h4.yaml")
    return _replay(
        folder / "h4.yaml",
        folder / "h4.csv",
        cluster__num_instances=5,
        cluster__pd__prefill_instances=4,
    )


def test_every_request_is_blis_plus_the_prefill_step(h4_aligned):
    blis = _blis_requests(H4)
    assert len(h4_aligned.request_records) == len(blis) == 1000
    off = {}
    for req in h4_aligned.request_records:
        b = blis[req.request_id]
        assert req.arrival_us == round(b["arrived_at"] * 1e6)
        # The conditions of the equality: no prompt waited, every prefill is one 11,884 µs
        # step, every transfer starts at its end and takes 2,735 µs.
        pre = req.prefill_sub
        assert pre.schedule_us == req.arrival_us
        assert pre.completion_us == req.arrival_us + PREFILL_STEP_US
        assert req.transfer_start_us == pre.completion_us
        assert req.transfer_end_us - req.transfer_start_us == TRANSFER_US
        ttft = req.first_token_us - req.arrival_us - _us(b["ttft_ms"])
        e2e = req.completion_us - req.arrival_us - _us(b["e2e_ms"])
        if (ttft, e2e) != (PREFILL_STEP_US, PREFILL_STEP_US):
            off[req.request_id] = (ttft, e2e)
    assert off == {}
    # So BLIS's decode instance and servesim's ran the same steps: the same ITL tail.
    blis_blocks = _blis_blocks()
    for key in ("itl_p90_ms", "itl_p95_ms", "itl_p99_ms"):
        assert h4_aligned.summary[key] == blis_blocks["cluster"][key], key
    # And each prefill instance reports what BLIS's did: TTFT = E2E = one prefill step.
    assert blis_blocks["instance_0"]["ttft_p99_ms"] == PREFILL_STEP_US / 1000
    for block in h4_aligned.instance_summaries[:4]:
        for key in ("ttft_mean_ms", "ttft_p99_ms", "e2e_mean_ms", "e2e_p99_ms"):
            assert block[key] == blis_blocks["instance_0"][key] == PREFILL_STEP_US / 1000


# ------------------------------------------------------------ h4 with BLIS's own flags


def test_h4_counts_match_blis(h4):
    blis = json.loads((DATA / f"{H4}.summary.json").read_text())
    for key in (
        "completed_requests",
        "injected_requests",
        "total_input_tokens",
        "total_output_tokens",
        "still_queued",
        "still_running",
        "dropped_unservable",
        "preemption_count",
    ):
        assert h4.summary[key] == blis[key], key
    pd_metrics = h4.pd_metrics
    assert pd_metrics["disaggregated_requests"] == 1000
    assert pd_metrics["dropped_at_decode_kv"] == 0
    # BLIS: "KV Transfer Duration (us): mean=2735.0 p50=2735.0 p95=2735.0 p99=2735.0".
    durations = {t.duration_us for t in h4.pd.link.records}
    assert durations == {TRANSFER_US}
    # BLIS's "Parent TTFT" line is its cluster TTFT; so is servesim's.
    assert pd_metrics["parent_ttft_mean_ms"] == h4.summary["ttft_mean_ms"]
    # Every parent is handled by the decode instance, as BLIS's `handled_by` says.
    assert {r.instance_id for r in h4.request_records} == {"instance_1"}
    assert {r["handled_by"] for r in _blis_requests(H4).values()} == {"instance_1"}


def _step_in_progress(starts: np.ndarray, ends: np.ndarray, t: int) -> int | None:
    """Index of the step already running at t (start < t < end), if any: a step that starts
    at t is the one a prompt arriving at t joins."""
    i = int(np.searchsorted(starts, t, side="left")) - 1
    return i if i >= 0 and t < ends[i] else None


def test_h4_a_prompt_waits_exactly_while_the_prefill_instance_is_mid_step(h4):
    # Difference 2 as a law: a prompt waits iff it arrives during a prefill step, and it then
    # starts when that step ends. Every prompt BLIS overlapped (arrival within one prefill
    # step of the previous one) waits in servesim.
    steps = h4.steps[h4.steps.instance_id == "instance_0"]
    starts = steps.start_us.to_numpy()
    ends = starts + steps.step_us.to_numpy()
    waited = set()
    for req in h4.request_records:
        pre = req.prefill_sub
        busy = _step_in_progress(starts, ends, req.arrival_us)
        if busy is None:
            assert pre.schedule_us == req.arrival_us, req.request_id
        else:
            assert pre.schedule_us == ends[busy], req.request_id
            waited.add(req.request_id)
    arrivals = sorted((r.arrival_us, r.request_id) for r in h4.request_records)
    overlapped_in_blis = {
        rid
        for (prev, _), (t, rid) in zip(arrivals, arrivals[1:], strict=False)
        if t < prev + PREFILL_STEP_US
    }
    assert len(overlapped_in_blis) == 219  # the README's count
    assert overlapped_in_blis <= waited
    # BLIS started every prefill on arrival: its prefill scheduling delay is 0 throughout.
    assert {r["scheduling_delay_ms"] for r in _blis_requests(H4).values()} == {0}


def test_h4_after_the_prefill_pool_servesim_and_blis_agree_on_average(h4):
    # What BLIS's TTFT measures (transfer + decode wait + first decode step) is servesim's
    # TTFT from the prefill's end; its E2E, minus the extra decode step (3), likewise. The
    # per-request values differ (differences 1 and 2 move the decode instance's arrivals);
    # the means agree within 1 %.
    blis = _blis_requests(H4)
    after_prefill_ttft = [
        r.first_token_us - r.prefill_sub.completion_us for r in h4.request_records
    ]
    after_prefill_e2e = [r.completion_us - r.prefill_sub.completion_us for r in h4.request_records]
    blis_ttft = [_us(b["ttft_ms"]) for b in blis.values()]
    blis_e2e = [_us(b["e2e_ms"]) for b in blis.values()]
    assert np.mean(after_prefill_ttft) == pytest.approx(np.mean(blis_ttft), rel=0.01)
    one_step_us = h4.summary["itl_mean_ms"] * 1000
    assert np.mean(after_prefill_e2e) - one_step_us == pytest.approx(np.mean(blis_e2e), rel=0.01)
    # The whole-request figures: servesim's TTFT mean is larger by at least the prefill step.
    blis_summary = json.loads((DATA / f"{H4}.summary.json").read_text())
    assert h4.summary["ttft_mean_ms"] >= blis_summary["ttft_mean_ms"] + PREFILL_STEP_US / 1000
    for key in ("itl_p90_ms", "itl_p95_ms", "itl_p99_ms"):
        assert h4.summary[key] == pytest.approx(blis_summary[key], rel=0.01), key


def test_contention_is_servesims_default_and_not_blis():
    # Difference 4: with servesim's default (contention on) transfers that overlap share the
    # link and last longer; with BLIS's (off) every one takes the formula's 2,735 µs.
    result = _replay(
        DATA / f"{H4}.trace.yaml",
        DATA / f"{H4}.trace.csv",
        cluster__pd__transfer_contention=True,
    )
    durations = [t.duration_us for t in result.pd.link.records]
    assert min(durations) == TRANSFER_US
    shared = [d for d in durations if d > TRANSFER_US]
    assert shared and result.pd_metrics["link_peak_concurrency"] > 1
    # Two transfers whose bytes share the link from start to end take twice as long, less
    # the base latency that is not shared: 50 + 2 × 2,684.35 → 5,419 µs.
    assert max(durations) <= math.ceil(50 + 3 * 512 * 131_072 / 25_000)
    assert 5_419 in durations
