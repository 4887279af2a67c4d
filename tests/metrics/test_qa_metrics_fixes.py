"""Metrics QA found wrong: each test pins the corrected figure on the run that showed it.

- A changing fleet's slots that were never created are not instances: they stay out of HOL
  blocking (its mean queue and its two-instance minimum), BLIS's mean cache hit rate and
  `Result.instances`, as they already did out of the per-instance summary blocks.
- A tenant whose every request failed (rejected, dropped, timed out) is in the per-tenant
  report with 0 tokens, and Jain's index counts it.
- The CPU tier's hit rates are over the prompt blocks the admissions looked up, so the same
  prompts give the same rates whatever the output length.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

import simulator
from simulator.engine.kv_cache import KVCache
from simulator.engine.kv_tiers import CPUTier
from simulator.engine.request import Request, RequestState
from simulator.metrics.anomalies import jain_fairness, tenant_tokens
from simulator.workload.trace import TRACE_V3_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
LLAMA = "meta-llama/llama-3.1-8b-instruct"


# ------------------------------------------------------------- never-created fleet slots


def _created(result: simulator.Result) -> list[str]:
    return [r.instance_id for r in result.infrastructure.records if r.state is not None]


def test_rolling_drain_counts_hol_over_its_created_instances_only():
    """300 requests end long before the first replacement at 60 s: four instances ran, four
    slots were never created. The four queues are even (means 0.062-0.067), so none is
    twice their mean; over eight slots (four zeros) every one was."""
    result = simulator.simulate(
        SCENARIOS / "rolling_drain.yaml", workload__num_requests=300, warn_unsteady=False
    )
    created = _created(result)
    assert created == ["instance_0", "instance_1", "instance_2", "instance_3"]
    assert len(result.instance_ids) == 8
    assert list(result.instances["instance_id"]) == created
    queues = result.instances["mean_queue_length"]
    assert queues.min() > 0.05 and queues.max() < 2 * queues.mean()
    assert result.anomalies["hol_blocking_events"] == 0


def test_one_created_instance_has_no_hol_blocking_and_its_own_hit_rate():
    """The autoscaled spike cut to 300 requests never scales up: one instance of six slots.
    HOL needs two instances; with a shared 512-token prefix, BLIS's mean hit rate over the
    one instance is its own rate (it read 1/6 of it, the mean over six slots)."""
    scenario = yaml.safe_load((SCENARIOS / "autoscale_spike.yaml").read_text())
    for client in scenario["workload"]["clients"]:
        client.update(prefix_group="sys", prefix_length=512)
    scenario["workload"]["num_requests"] = 300
    result = simulator.simulate(scenario, warn_unsteady=False)
    assert result.fleet_metrics["instances_created"] == 1
    assert len(result.instance_ids) == 6
    assert list(result.instances["instance_id"]) == _created(result) == ["instance_0"]
    assert result.anomalies["hol_blocking_events"] == 0
    kv = result.kv_metrics
    assert kv["pooled_cache_hit_rate"] > 0.2
    assert kv["cache_hit_rate"] == pytest.approx(kv["pooled_cache_hit_rate"])
    assert result.instances["cache_hit_rate"].iloc[0] == pytest.approx(kv["cache_hit_rate"])


# ------------------------------------------------------------------ starved tenants


def test_a_tenant_refused_everything_is_reported_with_zero_tokens(tmp_path):
    """QA's run: alice's 5,000-token prompts never fit the 4,000-token bucket, so all her
    requests are rejected at admission while bob's complete. She got nothing of two tenants:
    Jain's index is 1/2, and the per-tenant block is printed."""
    spec = {
        "version": "2",
        "seed": 5,
        "category": "language",
        "aggregate_rate": 20,
        "num_requests": 100,
        "clients": [
            {
                "id": cid,
                "tenant_id": tenant,
                "rate_fraction": 0.5,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": prompt}},
                "output_distribution": {"type": "constant", "params": {"value": 50}},
            }
            for cid, tenant, prompt in (("a", "alice", 5000), ("b", "bob", 200))
        ],
    }
    path = tmp_path / "starve.workload.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = simulator.simulate(
        {
            "model": LLAMA,
            "hardware": "H100",
            "latency": {"model": "roofline"},
            "workload_spec": str(path),
            "cluster": {
                "num_instances": 2,
                "admission": {
                    "policy": "token-bucket",
                    "token_bucket_capacity": 4000,
                    "token_bucket_refill_rate": 100000,
                },
            },
        },
        warn_unsteady=False,
    )
    alice = [r for r in result.request_records if r.tenant_id == "alice"]
    assert alice and all(r.state is RequestState.REJECTED for r in alice)
    bob_tokens = 50 * sum(1 for r in result.request_records if r.tenant_id == "bob")
    assert result.per_tenant == {"tokens": {"alice": 0, "bob": bob_tokens}, "jain_fairness": 0.5}
    assert "=== Per-Tenant Metrics ===" in result.report_text()


@pytest.mark.parametrize(
    "state",
    [
        RequestState.TIMED_OUT,
        RequestState.DROPPED,
        RequestState.DROPPED_ON_DRAIN,
        RequestState.FAILED,
        RequestState.REJECTED,
    ],
)
def test_a_tenant_whose_requests_all_failed_counts_as_starved(state):
    def req(rid: str, tenant: str, state: RequestState, tokens: int) -> Request:
        r = Request(rid, 0, 10, 20, tenant_id=tenant)
        r.state = state
        r.generated_tokens = tokens
        return r

    # A failed request may have produced tokens before it failed: they were not served.
    rs = [req("a", "alice", state, 7), req("b", "bob", RequestState.COMPLETED, 20)]
    tokens = tenant_tokens(rs)
    assert tokens == {"alice": 0, "bob": 20}
    assert jain_fairness(tokens.values()) == 0.5


# ------------------------------------------------------------------- CPU-tier hit rates


def test_prompt_blocks_looked_up_count_admissions_not_decode_or_later_chunks():
    kv = KVCache(100, 16, cpu=CPUTier(100))
    r = Request("r", 0, 40, 100)  # 40 prompt tokens: 3 blocks, the last partial
    assert kv.try_allocate(r, 0, 16, [])  # a first chunk...
    assert kv.try_allocate(r, 16, 40, [])  # ...and the rest of the prompt: one lookup
    assert kv.prompt_blocks_looked_up == 3
    for position in range(40, 140):
        assert kv.append_token(r, position)
    assert kv.cache_misses == 9  # ceil(140/16): BLIS's misses count decode blocks
    assert kv.prompt_blocks_looked_up == 3
    kv.release(r)
    # Returning (a preemption's recompute of prompt and output) is another lookup.
    r.prefill_target = 140
    cached = kv.cached_prefix_blocks(r, 139)
    # Every full block was hashed, output included (as BLIS and vLLM do): 140 // 16 = 8.
    assert len(cached) == 8
    assert kv.try_allocate(r, 8 * 16, 140, cached)
    assert kv.prompt_blocks_looked_up == 3 + 9
    # An allocation that does not fit changes nothing.
    big = Request("big", 0, 16 * 100, 1)
    assert not kv.try_allocate(big, 0, 16 * 100, [])
    assert kv.prompt_blocks_looked_up == 3 + 9


def _cpu_trace(directory: Path, last_output: int) -> tuple[Path, Path]:
    """QA's trace: A, five other 1,600-token prefixes that push A's 100 prefix blocks out of
    a 250-block GPU cache into the CPU tier, then A again; 16 tokens of its own each
    (101 prompt blocks per request, 707 in all). Only A's second output length varies."""
    columns = TRACE_V3_COLUMNS
    groups = ["A", "G1", "G2", "G3", "G4", "G5", "A"]
    rows = []
    for i, group in enumerate(groups):
        row = dict.fromkeys(columns, "")
        t = 1000 + 200_000 * i
        row.update(
            request_id=i, client_id="c0", round_index=0, prefix_group=group,
            prefix_length=1600, streaming="false", input_tokens=16,
            output_tokens=last_output if i == len(groups) - 1 else 2, text_tokens=0,
            image_tokens=0, audio_tokens=0, video_tokens=0, reason_ratio=0, deadline_us=0,
            server_input_tokens=0, arrival_time_us=t, send_time_us=t, first_chunk_time_us=0,
            last_chunk_time_us=0, num_chunks=0, status="ok",
        )  # fmt: skip
        rows.append(row)
    data = directory / f"cpu_o{last_output}.trace.csv"
    with data.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    header = directory / f"cpu_o{last_output}.trace.yaml"
    header.write_text(
        "trace_version: 3\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"
    )
    return header, data


def test_cpu_hit_rates_do_not_depend_on_output_length(tmp_path):
    """The same seven prompt lookups and the same 100 reloaded blocks: 100 / 707 with a
    2-token and an 800-token last output (hits + misses read 100/714 and 100/763)."""
    rates = []
    for output in (2, 800):
        header, data = _cpu_trace(tmp_path, output)
        result = simulator.replay(
            header,
            data,
            model=LLAMA,
            hardware="H100",
            engine__total_kv_blocks=250,
            engine__kv_cpu_blocks=2000,
        )
        kv = result.kv_metrics
        assert result.summary["completed_requests"] == 7
        assert kv["reloaded_blocks"] == 100
        assert result.engines[0].kv.prompt_blocks_looked_up == 707
        rates.append((kv["cpu_hit_rate"], kv["combined_hit_rate"]))
    assert rates[0] == rates[1] == (pytest.approx(100 / 707), pytest.approx(100 / 707))
