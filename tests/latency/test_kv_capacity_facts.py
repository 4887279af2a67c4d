"""KV capacity from the config's facts (docs/models-and-hardware.md): MLA's compressed cache,
an explicit head_dim, an FP8 cache, pipeline stages, experts sharded over DP ranks, and the two
rules that turn free memory into blocks. Every pinned number is computed by hand below."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.catalog.precision import apply_precision
from simulator.errors import ConfigError
from simulator.latency.kv_capacity import (
    kv_bytes_per_token,
    kv_capacity,
    model_weight_bytes,
)

GIB = 1 << 30
DEEPSEEK_V3 = load_model("deepseek-ai/DeepSeek-V3")
QWEN3_32B = load_model("Qwen/Qwen3-32B")
H200 = get_gpu("H200")


def test_deepseek_v3_mla_kv_bytes_per_token():
    """MLA caches a 512-wide latent plus the 64-wide rotary key per layer, shared by all 128
    heads: 61 x (512 + 64) x 2 B = 70,272 B per token, on every TP GPU (not divided by TP).
    Plain GQA arithmetic would have said 61 x 2 x 128 heads x 56 (hidden/heads) x 2 B =
    1,749,504 B, 25 times more."""
    assert kv_bytes_per_token(DEEPSEEK_V3) == 61 * (512 + 64) * 2 == 70_272
    assert kv_bytes_per_token(DEEPSEEK_V3, tp=8) == 70_272
    assert kv_bytes_per_token(DEEPSEEK_V3, tp=8, pp=2) == 70_272 / 2  # each stage: its layers


def test_deepseek_v3_on_8_h200_by_hand():
    """TP8 on H200 (140.4 GiB), FP8 weights, BF16 cache, block 16, utilisation 0.9.

    weights 671,026,279,424 params x 1 B = 624.9419 GiB (parameter count by hand in
        tests/catalog/test_model_shapes.py)
    available 140.4 x 0.9 x 8 = 1,010.88 GiB
    overhead 624.9419 + 8.0 (MoE activations) + 0.6 x 8 (non-torch) = 637.7419 GiB
    free int((1,010.88 - 637.7419) x 2^30) = 400,653,960,273 B
    block per GPU 70,272 x 16 = 1,124,352 B (the latent is on every GPU)
    blis rule: 400,653,960,273 // 1,124,352 = 356,342 blocks (5.7 M tokens)
    vllm rule: vLLM's measured reserve instead of BLIS's, 1.6215 GiB per GPU (several GPUs):
        overhead 624.9419 + 1.6215 x 8 = 637.9139 GiB; free int((1,010.88 - 637.9139) x 2^30)
        = 400,469,276,680 B; // (1,124,352 x 8) = 44,522 blocks (712,352 tokens)
    """
    blis = kv_capacity(DEEPSEEK_V3, H200, 8)
    assert model_weight_bytes(DEEPSEEK_V3) == 671_026_279_424
    assert blis.weight_gib == pytest.approx(624.9419, abs=1e-4)
    assert blis.available_gib == pytest.approx(1010.88)
    assert blis.overhead_gib == pytest.approx(637.7419, abs=1e-4)
    free = int((blis.available_gib - blis.overhead_gib) * GIB)
    assert free == 400_653_960_273
    assert blis.kv_bytes_per_block_per_gpu == 1_124_352
    assert blis.blocks == free // 1_124_352 == 356_342
    vllm = kv_capacity(DEEPSEEK_V3, H200, 8, rule="vllm")
    assert vllm.overhead_gib == pytest.approx(637.9139, abs=1e-4)
    vllm_free = int((vllm.available_gib - vllm.overhead_gib) * GIB)
    assert vllm_free == 400_469_276_680
    assert vllm.blocks == vllm_free // (1_124_352 * 8) == 44_522


def test_deepseek_v3_fp8_cache_doubles_the_blocks():
    # 35,136 B per token; 562,176 B per block per GPU: 400,469,276,680 // (562,176 x 8).
    fp8 = apply_precision(DEEPSEEK_V3, H200, kv_cache_dtype="fp8")
    assert kv_bytes_per_token(fp8) == 61 * 576 * 1
    assert kv_capacity(fp8, H200, 8, rule="vllm").blocks == 400_469_276_680 // 4_497_408 == 89_044


def test_deepseek_v3_does_not_fit_on_8_h100():
    # 637.7 GiB of weights and reserves against 80 x 0.9 x 8 = 576 GiB.
    with pytest.raises(ConfigError, match=r"needs 637\.74 GiB .* offers 576\.00 GiB"):
        kv_capacity(DEEPSEEK_V3, get_gpu("H100"), 8)


def test_qwen3_32b_explicit_head_dim_by_hand():
    """hidden 5,120 / 64 heads = 80, but the config's head_dim is 128.
    KV per token 64 layers x 2 x 128 x 8 KV heads x 2 B = 262,144 B (hidden/heads: 163,840).
    TP2 on H100: per GPU 131,072 B per token, 2,097,152 B per block.
    params: emb = lm_head 151,936 x 5,120 = 777,912,320; attention 64 x [5,120 x (8,192 + 2 x
        1,024) + 8,192 x 5,120] = 6,039,797,760; MLP 64 x 3 x 5,120 x 25,600 = 25,165,824,000;
        norms 64 x 2 x 5,120 + 5,120 = 660,480 -> 32,762,106,880 (Qwen: 32.8B)
    weights x 2 B = 61.0242 GiB; available 80 x 0.9 x 2 = 144 GiB;
    overhead 61.0242 + 5.5 + 0.6 x 2 = 67.7242 GiB; free int(76.2758 x 2^30) B
    blis: free // 2,097,152 = 39,053.
    vllm: vLLM's measured reserve, 1.6215 GiB per GPU: overhead 61.0242 + 3.2430 = 64.2672 GiB;
    int((144 - 64.2672) x 2^30) = 85,612,464,160 B // (2,097,152 x 2) = 20,411.
    """
    assert kv_bytes_per_token(QWEN3_32B) == 262_144
    cap = kv_capacity(QWEN3_32B, get_gpu("H100"), 2)
    assert cap.param_count == 32_762_106_880
    assert cap.kv_bytes_per_block_per_gpu == 2_097_152
    free = int((144.0 - cap.overhead_gib) * GIB)
    assert cap.blocks == free // 2_097_152 == 39_053
    vllm = kv_capacity(QWEN3_32B, get_gpu("H100"), 2, rule="vllm")
    assert int((144.0 - vllm.overhead_gib) * GIB) == 85_612_464_160
    assert vllm.blocks == 85_612_464_160 // (2_097_152 * 2) == 20_411


def test_fewer_kv_heads_than_gpus_replicate_under_the_vllm_rule():
    """Qwen3-235B-A22B has 4 KV heads; on TP8 each GPU keeps one whole head: 94 x 2 x 128 x 2
    B = 48,128 B per token per GPU (block 770,048), not 192,512 / 8 (BLIS: 385,024)."""
    m = load_model("Qwen/Qwen3-235B-A22B")
    assert kv_capacity(m, H200, 8).kv_bytes_per_block_per_gpu == 192_512 // 8 * 16
    assert kv_capacity(m, H200, 8, rule="vllm").kv_bytes_per_block_per_gpu == 48_128 * 16


# The block counts vLLM logged on H100 at gpu_memory_utilization 0.9: vllm-0.15.1-h100's
# kv_blocks_total_gpu and vllm-0.23.0-h100-qwen3-14b's num_gpu_blocks.
MEASURED_BLOCKS = [
    ("meta-llama/llama-2-7b-hf", 1, 7_462),
    ("meta-llama/llama-2-70b-hf", 4, 31_356),
    ("mistralai/mixtral-8x7b-v0.1", 2, 27_510),
    ("qwen/qwen3-14b", 1, 18_038),
]


@pytest.mark.parametrize(("model_id", "tp", "measured_blocks"), MEASURED_BLOCKS)
def test_vllm_rule_is_what_vllm_allocates(model_id, tp, measured_blocks):
    """BLIS's formula counts each block once per GPU and reserves its planner's activations:
    about tp x vLLM's count (Llama-2-70B TP4: 124,207 against 31,356 measured). The vllm rule
    divides by every GPU's share and reserves what vLLM was measured to keep: within 1% of
    every measurement in-sample (its reserve is fitted on these four)."""
    m = load_model(model_id)
    blis = kv_capacity(m, get_gpu("H100"), tp).blocks
    vllm = kv_capacity(m, get_gpu("H100"), tp, rule="vllm").blocks
    assert vllm == pytest.approx(measured_blocks, rel=0.01)
    if tp == 1:
        assert blis < measured_blocks  # the planner's 5.5 GiB reserve is more than vLLM keeps
    else:
        assert blis > (tp - 1) * measured_blocks  # each block counted on every GPU


@pytest.mark.parametrize(("model_id", "tp", "measured_blocks"), MEASURED_BLOCKS)
def test_vllm_rule_held_out_lands_within_2_percent(model_id, tp, measured_blocks, monkeypatch):
    """Leave one out: the reserve for the held-out run's class (one GPU, several) is the other
    run of that class's alone (7B 1.152, Qwen3-14B 0.454, Mixtral 1.639, 70B 1.604 GiB per
    GPU: memory x 0.9 - weights - measured blocks x bytes per block). Held out the rule lands
    at +1.2, -1.6, +0.1 and -0.1 %."""
    import simulator.latency.kv_capacity as capacity

    reserve = {
        "meta-llama/llama-2-7b-hf": 1.152,
        "qwen/qwen3-14b": 0.454,
        "mistralai/mixtral-8x7b-v0.1": 1.639,
        "meta-llama/llama-2-70b-hf": 1.604,
    }
    mate = next(
        other
        for other, other_tp, _ in MEASURED_BLOCKS
        if other != model_id and (other_tp == 1) == (tp == 1)
    )
    name = "VLLM_RESERVED_ONE_GPU_GIB" if tp == 1 else "VLLM_RESERVED_PER_GPU_GIB"
    monkeypatch.setattr(capacity, name, reserve[mate])
    held_out = kv_capacity(load_model(model_id), get_gpu("H100"), tp, rule="vllm").blocks
    assert held_out == pytest.approx(measured_blocks, rel=0.02)


def test_pipeline_stages_pool_their_memory():
    """TP4 x PP2 has 8 GPUs: under the vllm rule the instance holds what TP8 holds (layers, not
    heads, are split), 2 x TP4's free memory less TP4's weights once more."""
    m = load_model("meta-llama/llama-3.1-70b-instruct")
    tp8 = kv_capacity(m, get_gpu("H100"), 8, rule="vllm")
    tp4pp2 = kv_capacity(m, get_gpu("H100"), 4, pp=2, rule="vllm")
    assert tp4pp2.gpus == 8 and tp4pp2.available_gib == tp8.available_gib
    # 8 KV heads: TP8 stores 1 head of 80 layers per GPU, TP4 x PP2 2 heads of 40 layers.
    assert tp4pp2.kv_bytes_per_block_per_gpu == tp8.kv_bytes_per_block_per_gpu
    assert tp4pp2.blocks == tp8.blocks


def test_experts_sharded_over_dp_ranks_free_memory():
    # Each of 2 DP ranks (TP8) stores half the routed experts under EP16.
    whole = kv_capacity(DEEPSEEK_V3, H200, 8, rule="vllm")
    half = kv_capacity(DEEPSEEK_V3, H200, 8, rule="vllm", expert_fraction=0.5)
    assert whole.weight_gib - half.weight_gib == pytest.approx(653_908_770_816 / 2 / GIB)
    assert half.blocks > whole.blocks


@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    rule=st.sampled_from(["blis", "vllm"]),
)
def test_laws_more_memory_more_blocks_and_fp8_at_least_doubles(tp, pp, rule):
    """Blocks never fall when memory grows (H200 over H100: more GiB, same model), and an FP8
    cache holds at least twice the BF16 blocks (same free bytes, half-size blocks)."""
    m = load_model("meta-llama/llama-3.1-70b-instruct")
    try:
        small = kv_capacity(m, get_gpu("H100"), tp, pp=pp, rule=rule).blocks
    except ConfigError:
        return  # does not fit on so few GPUs
    large = kv_capacity(m, H200, tp, pp=pp, rule=rule).blocks
    assert large >= small
    fp8 = apply_precision(m, get_gpu("H100"), kv_cache_dtype="fp8")
    assert kv_capacity(fp8, get_gpu("H100"), tp, pp=pp, rule=rule).blocks >= 2 * small


def test_bad_rule_and_pp():
    with pytest.raises(ConfigError, match="kv_capacity_rule: invalid value 'exact'"):
        kv_capacity(QWEN3_32B, H200, 1, rule="exact")
    with pytest.raises(ConfigError, match="pp: invalid value 0"):
        kv_capacity(QWEN3_32B, H200, 1, pp=0)


@pytest.mark.parametrize(
    ("latency_model", "rule"),
    [("physics", "vllm"), ("roofline", "blis"), ("trained-physics", "blis")],
)
def test_auto_rule_follows_the_latency_model(latency_model, rule):
    """`auto` (the default) is vLLM's allocation under servesim's physics model and BLIS's
    formula under BLIS's backends, so BLIS's runs reproduce: Llama-3.1-70B on 4 H100 gets TP
    (= 4) times fewer blocks under `vllm` (each GPU stores a quarter of every block)."""
    from simulator.api import as_scenario, capacity_rule, resolve_deployment

    base = {"model": "meta-llama/llama-3.1-70b-instruct", "tp": 4}
    auto = as_scenario({**base, "latency": {"model": latency_model}})
    assert auto.engine.kv_capacity_rule == "auto"
    assert capacity_rule(auto) == rule
    explicit = {**base, "latency": {"model": "physics"}, "engine": {"kv_capacity_rule": rule}}
    assert (
        resolve_deployment(auto).engine.total_kv_blocks
        == resolve_deployment(as_scenario(explicit)).engine.total_kv_blocks
    )
    blis = as_scenario({**base, "engine": {"kv_capacity_rule": "blis"}})
    vllm = as_scenario({**base, "engine": {"kv_capacity_rule": "vllm"}})
    blis_blocks = resolve_deployment(blis).engine.total_kv_blocks
    vllm_blocks = resolve_deployment(vllm).engine.total_kv_blocks
    # A quarter of the blocks per byte free, and vLLM reserves 4 x 1.6215 = 6.49 GiB where
    # BLIS's planner reserves 5.5 + 4 x 0.6 = 7.9 GiB: a little more than a quarter.
    assert blis_blocks // 4 < vllm_blocks < blis_blocks // 4 * 1.02
