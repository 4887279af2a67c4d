"""The CPU tier of the KV cache: the tier itself, a reload timed by hand, and the behaviour
it exists for (docs/behaviour.md §2.4)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import simulator
from simulator.cli import app
from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig
from simulator.engine.kv_tiers import CPUTier
from simulator.engine.request import Request
from simulator.latency.blackbox import BlackboxModel


def test_tier_is_an_lru_of_hashes_with_conservation():
    tier = CPUTier(3)
    for h, t in ((1, 0), (2, 1), (3, 2)):
        tier.store(h, t)
    tier.store(1, 5)  # refresh: 1 becomes most recent, nothing new written
    tier.store(4, 6)  # evicts the least recent, 2
    assert 2 not in tier and {1, 3, 4} <= {h for h in (1, 3, 4) if h in tier}
    assert (tier.offloaded_blocks, tier.evicted_blocks, tier.used_blocks) == (4, 1, 3)
    tier.check_invariants()
    assert tier.matching_prefix([3, 4, 9, 1], 0, 4) == 2  # stops at the first miss


def _prefix_request(rid: str, arrival_us: int, unique: str) -> Request:
    # 64 shared tokens (4 blocks of 16) + 16 tokens of its own = 80 tokens, 1 output token
    segments = [(("prefix", "doc"), 64), (("req", unique), 16)]
    return Request(rid, arrival_us, 80, 1, segments=segments)


def _evicting_run(cpu_blocks: int, blocking: bool = False):
    """A, then B (which needs the whole 10-block cache, evicting A's blocks), then C with A's
    prefix. Blackbox step = 1000 + 10·prefill tokens + 5·decodes µs, no alpha."""
    requests = [
        _prefix_request("A", 0, "a"),
        Request("B", 10_000, 160, 1),
        _prefix_request("C", 20_000, "c"),
    ]
    for i, r in enumerate(requests):
        r.index = i
    config = EngineConfig(
        total_kv_blocks=10,
        block_size=16,
        kv_cpu_blocks=cpu_blocks,
        kv_bytes_per_block=2_097_152,  # Llama-3.1-8B, TP1: 131,072 B/token × 16
        kv_transfer_bandwidth_gb_per_s=50.0,
        kv_transfer_base_latency_us=32,
        kv_reload_blocking=blocking,
    )
    model = BlackboxModel([0, 0, 0], [1000, 10, 5])
    return run_simulation(requests, config, model, check_invariants=True)


@pytest.mark.parametrize("blocking", [False, True])
def test_a_prefix_evicted_from_gpu_is_reloaded_from_cpu_by_hand(blocking):
    """C's 4 prefix blocks are gone from the GPU (B took every block) but on the CPU tier.

    reload = base + bytes / bandwidth = 32 µs + 4 × 2,097,152 B / 50,000 B/µs
           = 32 + 167.77 -> 200 µs (rounded up once)
    C then prefills only its own 16 tokens: 1000 + 10·16 = 1,160 µs.
    TTFT(C) = 200 + 1,160 = 1,360 µs, against 1000 + 10·80 = 1,800 µs without the tier.
    Non-blocking: the instance idles 200 µs (nothing else to run), then steps; blocking
    (BLIS): the step at 20,000 takes 200 + 1,160 µs. Same TTFT here.
    """
    with_tier = _evicting_run(cpu_blocks=100, blocking=blocking)
    without = _evicting_run(cpu_blocks=0)
    c_tier = next(r for r in with_tier.request_records if r.request_id == "C")
    c_none = next(r for r in without.request_records if r.request_id == "C")
    assert c_none.first_token_us - c_none.arrival_us == 1_800
    assert c_tier.first_token_us - c_tier.arrival_us == 1_360
    assert c_tier.kv_reload_us == 200
    assert c_tier.cached_tokens == 64
    tier = with_tier.engines[0].kv.cpu
    assert tier.reloaded_blocks == 4
    assert with_tier.kv_metrics["reloaded_blocks"] == 4


def test_offload_scenario_cpu_tier_raises_hits_and_lowers_ttft():
    short = {"horizon_us": 120_000_000}
    none = simulator.simulate("scenarios/kv_cpu_offload.yaml", engine__kv_cpu_blocks=0, **short)
    big = simulator.simulate("scenarios/kv_cpu_offload.yaml", **short)
    small = simulator.simulate("scenarios/kv_cpu_offload.yaml", engine__kv_cpu_blocks=1000, **short)
    assert big.kv_metrics["combined_hit_rate"] > none.kv_metrics["cache_hit_rate"] + 0.2
    assert big.summary["ttft_mean_ms"] < 0.5 * none.summary["ttft_mean_ms"]
    # a tier too small for the working set evicts nearly everything it is given
    assert small.kv_metrics["kv_thrashing_rate"] > 0.9
    assert small.kv_metrics["kv_thrashing_rate"] > big.kv_metrics["kv_thrashing_rate"]
    assert "cpu_kv_used_blocks" in big.steps and big.steps.cpu_kv_used_blocks.max() > 0
    assert big.requests.kv_reload_ms.max() > 0


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--kv-cpu-blocks", "-5"),
        ("--kv-transfer-bandwidth", "0"),
        ("--kv-transfer-bandwidth", "-1"),
        ("--kv-transfer-base-latency", "-3"),
        ("--kv-offload-policy", "sometimes"),
    ],
)
def test_bad_tier_settings_exit_2(flag, value):
    res = CliRunner().invoke(app, ["run", "--num-requests", "3", flag, value])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in res.output
