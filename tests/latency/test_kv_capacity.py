"""KV capacity auto-calculation (docs/behaviour.md §2.5) and MaxModelLen derivation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.catalog.types import ModelConfig
from simulator.errors import ConfigError
from simulator.latency.kv_capacity import (
    compute_kv_blocks,
    derive_max_model_len,
    kv_bytes_per_token,
    kv_capacity,
    model_param_count,
    model_weight_bytes,
)
from tests.specs import evenly_spaced

GIB = 1 << 30


@pytest.fixture(scope="module")
def llama8b() -> ModelConfig:
    return load_model("meta-llama/Llama-3.1-8B-Instruct")


def test_worked_example_llama_3_1_8b_h100_tp1(llama8b):
    """docs/behaviour.md §2.5 worked example, every step by hand.

    head_dim = 4096 / 32 = 128; kv_heads = 8; kv_dim = 1024.
    KV bytes/token = 32 layers * 2 (K,V) * 128 * 8 * 2 B = 131,072; per block of 16 = 2,097,152.
    Params:
      embeddings       128,256 * 4,096                           =   525,336,576
      per layer  attn  4,096*(4,096 + 2*1,024) + 4,096^2          =    41,943,040
                 mlp   3 * 4,096 * 14,336                         =   176,160,768
                 norms 2 * 4,096                                  =         8,192
                 sum                                              =   218,112,000
      32 layers                                                   = 6,979,584,000
      lm_head (not tied) 128,256 * 4,096                          =   525,336,576
      final norm                                                  =         4,096
      total                                                       = 8,030,261,248
    Weights = 8,030,261,248 * 2 B = 16,060,522,496 B = 14.9575 GiB.
    Available = 80 GiB * 0.9 * 1 = 72 GiB = 77,309,411,328 B.
    Overhead = 14.9575 + 5.5 (dense activations) + 0.15 (non-torch, TP1) = 20.6075 GiB.
    Allocatable = 77,309,411,328 - 16,060,522,496 - 5.65 * 2^30 (6,066,641,305.6)
                = 55,182,247,526 B (truncated).
    Blocks = 55,182,247,526 // 2,097,152 = 26,312 (26,312 * 2,097,152 = 55,180,263,424;
    the remainder 1,984,102 B is less than one block). docs/behaviour.md §2.5 says 26,312.
    """
    cap = kv_capacity(llama8b, get_gpu("H100"), tp=1)
    assert cap.kv_bytes_per_token == 131_072
    assert cap.kv_bytes_per_block_per_gpu == 2_097_152
    assert cap.param_count == model_param_count(llama8b) == 8_030_261_248
    assert model_weight_bytes(llama8b) == 16_060_522_496
    assert cap.weight_gib == pytest.approx(14.9575, abs=1e-4)
    assert cap.available_gib == 72.0
    assert (cap.activation_gib, cap.non_torch_gib) == (5.5, 0.15)
    assert cap.overhead_gib == pytest.approx(20.61, abs=5e-3)
    allocatable_bytes = int((72.0 - cap.overhead_gib) * GIB)
    assert allocatable_bytes == 55_182_247_526
    assert cap.blocks == allocatable_bytes // 2_097_152 == 26_312
    assert compute_kv_blocks(llama8b, get_gpu("h100"), 1) == 26_312


def test_kv_bytes_per_token_splits_over_tp(llama8b):
    assert kv_bytes_per_token(llama8b) == 131_072
    assert kv_bytes_per_token(llama8b, 2) == 65_536
    # KV uses the compute dtype even when weights are quantised.
    assert kv_bytes_per_token(replace(llama8b, weight_bytes_per_param=0.5)) == 131_072


def test_moe_param_count_qwen3_30b_a3b():
    """The config's head_dim 128 (not hidden/heads = 2048/32 = 64): q_dim 32*128 = 4,096,
    kv_dim 4*128 = 512. attn 2048*(4096+1024) + 4096*2048 = 18,874,368; experts
    3*2048*768*128 = 603,979,776; router 128*2048 = 262,144; norms 4,096 -> layer 623,120,384;
    *48 = 29,909,778,432; embeddings + lm_head 2*151,936*2,048 = 622,329,856; final norm 2,048
    -> 30,532,110,336: Qwen's published 30.5B. (hidden/heads gave 30,079,125,504.)
    """
    assert model_param_count(load_model("Qwen/Qwen3-30B-A3B")) == 30_532_110_336


def test_moe_uses_activation_reserve_8_gib_and_shared_experts():
    m = load_model("deepseek-ai/DeepSeek-V2-Lite")
    cap = kv_capacity(m, get_gpu("H100"), 1)
    assert cap.activation_gib == 8.0
    without_shared = replace(m, shared_expert_ffn_dim=0)
    # 2 shared experts of 1,408 in the 26 MoE layers (first_k_dense_replace = 1 keeps layer 0
    # dense).
    assert model_param_count(m) - model_param_count(without_shared) == 26 * 3 * 2048 * 2816


def test_tied_embeddings_drop_lm_head(llama8b):
    tied = replace(llama8b, tie_word_embeddings=True)
    assert model_param_count(llama8b) - model_param_count(tied) == 128_256 * 4_096


def test_quantised_weights_leave_more_room(llama8b):
    fp8 = replace(llama8b, weight_bytes_per_param=1.0)
    assert model_weight_bytes(fp8) == 8_030_261_248
    assert compute_kv_blocks(fp8, get_gpu("H100"), 1) > compute_kv_blocks(
        llama8b, get_gpu("H100"), 1
    )


def test_blocks_strictly_decrease_with_memory_utilisation(llama8b):
    gpu = get_gpu("H100")
    utils = [0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.35]
    blocks = [compute_kv_blocks(llama8b, gpu, 1, gpu_memory_utilization=u) for u in utils]
    assert all(a > b for a, b in zip(blocks, blocks[1:], strict=False))


@pytest.mark.parametrize("model_id", ["meta-llama/llama-3.1-8b-instruct", "qwen/qwen3-30b-a3b"])
def test_more_gpus_per_instance_give_more_blocks(model_id):
    m = load_model(model_id)
    gpu = get_gpu("H100")
    blocks = [compute_kv_blocks(m, gpu, tp) for tp in (1, 2, 4)]
    assert blocks[0] < blocks[1] < blocks[2]


def test_block_size_halves_blocks_roughly(llama8b):
    b16 = compute_kv_blocks(llama8b, get_gpu("H100"), 1, block_size=16)
    b32 = compute_kv_blocks(llama8b, get_gpu("H100"), 1, block_size=32)
    assert b32 == b16 // 2


def test_model_too_large_for_gpu_is_a_config_error():
    with pytest.raises(ConfigError) as exc:
        compute_kv_blocks(load_model("meta-llama/Llama-2-70b-hf"), get_gpu("L40S"), 1)
    msg = str(exc.value)
    assert msg.startswith("tp: invalid value 1;")
    assert "L40S" in msg and "43.20 GiB" in msg  # 48 GiB * 0.9


def test_unsupported_activation_is_refused(llama8b):
    with pytest.raises(ConfigError, match="hidden_act: invalid value 'gelu'"):
        compute_kv_blocks(replace(llama8b, hidden_act="gelu"), get_gpu("H100"), 1)
    compute_kv_blocks(replace(llama8b, hidden_act=""), get_gpu("H100"), 1)


def test_moe_without_expert_count_is_refused(llama8b):
    with pytest.raises(ConfigError, match="num_local_experts"):
        compute_kv_blocks(replace(llama8b, moe_count_missing=True), get_gpu("H100"), 1)


def test_head_dim_must_divide_evenly(llama8b):
    with pytest.raises(ConfigError, match="hidden_size"):
        compute_kv_blocks(replace(llama8b, hidden_dim=4100), get_gpu("H100"), 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tp": 0}, "tp"),
        ({"tp": 3}, "tp"),  # 8 KV heads not divisible by 3
        ({"tp": 1, "block_size": 0}, "block_size"),
        ({"tp": 1, "gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"tp": 1, "gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
    ],
)
def test_invalid_arguments(llama8b, kwargs, field):
    with pytest.raises(ConfigError, match=field):
        compute_kv_blocks(llama8b, get_gpu("H100"), **kwargs)


# --- MaxModelLen --------------------------------------------------------------------------------


def test_max_model_len_llama3_rope_not_scaled_and_capped(llama8b):
    scaled = replace(llama8b, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert derive_max_model_len(scaled, total_blocks=100_000, block_size=16) == 131_072
    assert derive_max_model_len(scaled, total_blocks=1_000, block_size=16) == 16_000


def test_max_model_len_yarn_uses_original_length():
    m = load_model("deepseek-ai/DeepSeek-V2-Lite")  # yarn, factor 40, original 4096
    assert derive_max_model_len(m, 10**9, 16) == 4096 * 40


@pytest.mark.parametrize(
    ("scaling", "model_type", "expected"),
    [
        ({"type": "linear", "factor": 4.0}, "llama", 4 * 4096),
        ({"rope_type": "dynamic", "factor": 2}, "llama", 2 * 4096),
        ({"type": "longrope", "factor": 4.0}, "phi3", 4096),
        ({"type": "su", "factor": 4.0}, "phi3", 4096),
        ({"rope_type": "linear", "factor": 8.0}, "gemma3", 4096),
        ({"type": "yarn", "factor": 4.0}, "qwen2", 4 * 4096),  # no original: base is the max
        (None, "llama", 4096),
    ],
)
def test_max_model_len_rope_rules(llama8b, scaling, model_type, expected):
    m = replace(llama8b, max_position_embeddings=4096, rope_scaling=scaling, model_type=model_type)
    assert derive_max_model_len(m, 10**9, 16) == expected


def test_max_model_len_zero_without_position_embeddings(llama8b):
    assert derive_max_model_len(replace(llama8b, max_position_embeddings=0), 1000, 16) == 0


# The context limit a run gets when the scenario leaves engine.max_model_len unset. Llama-2-7B's
# config says max_position_embeddings 4096 with no rope scaling, and 100,000 blocks of 16 tokens
# (1,600,000 tokens) do not cap it, so every backend that reads the config derives 4096; blackbox
# prices from fitted coefficients alone and, as in BLIS, sets no limit (0).
CONTEXT_LIMIT_RUN = {
    "model": "meta-llama/llama-2-7b-hf",
    "hardware": "H100",
    "tp": 1,
    "engine": {"total_kv_blocks": 100_000},
}


@pytest.mark.parametrize(
    ("backend", "limit"),
    [
        ("roofline", 4096),
        ("physics", 4096),
        ("crossmodel", 4096),
        ("trained-roofline", 4096),
        ("trained-physics", 4096),
        ("blackbox", 0),
    ],
)
def test_every_backend_but_blackbox_derives_the_context_limit(backend, limit):
    from simulator.api import as_scenario, resolve_deployment

    latency = {"model": backend}
    if backend == "blackbox":
        latency |= {"alpha_coeffs": [1000, 1, 1], "beta_coeffs": [1000, 1, 1]}
    scenario = as_scenario({**CONTEXT_LIMIT_RUN, "latency": latency})
    assert resolve_deployment(scenario).engine.max_model_len == limit


@pytest.mark.parametrize("backend", ["crossmodel", "trained-roofline", "trained-physics"])
def test_a_prompt_past_the_derived_limit_is_unservable(backend):
    """BLIS-Mar (crossmodel, trained-roofline) and the current BLIS (trained-physics), run on
    this workload, drop all four requests: "input length 5000 >= MaxModelLen 4096". servesim
    did not derive the limit for these backends before 2026-12-06 and served them; found by
    replaying BLIS-Mar's own traces of random workloads."""
    from simulator import simulate

    result = simulate(
        {
            **CONTEXT_LIMIT_RUN,
            "latency": {"model": backend},
            "workload": evenly_spaced(rate=10, num_requests=4, prompt=5000, output=10),
        }
    )
    assert result.summary["dropped_unservable"] == 4
    assert result.summary["completed_requests"] == 0
