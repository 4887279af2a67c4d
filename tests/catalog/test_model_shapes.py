"""Architecture facts beyond BLIS's plain decoder (docs/models-and-hardware.md): MLA, explicit
head_dim, dense layers inside MoE stacks, shared experts, windowed attention, MXFP4 experts.
Expected values are read by hand from the bundled config.json files; parameter totals are
checked against the totals each model's publisher states."""

from __future__ import annotations

import pytest

from simulator.catalog.models import load_model, parse_hf_config
from simulator.errors import ConfigError
from simulator.latency.kv_capacity import model_param_breakdown, model_param_count


def _moe(**overrides) -> dict:
    raw = {
        "num_hidden_layers": 8,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "vocab_size": 100,
        "torch_dtype": "bfloat16",
    }
    raw.update(overrides)
    return raw


def test_deepseek_v3_mla_and_first_k_dense():
    m = load_model("deepseek-ai/DeepSeek-V3")
    assert m.is_mla and (m.kv_lora_rank, m.qk_rope_head_dim) == (512, 64)
    assert (m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank) == (128, 128, 1536)
    # first_k_dense_replace = 3: layers 0-2 keep an 18,432-wide dense MLP, 58 are MoE.
    assert m.dense_layer_indices == (0, 1, 2) and m.moe_layer_count == 58
    assert m.dense_ffn_dim == 18432
    assert (m.num_local_experts, m.num_experts_per_tok, m.moe_expert_ffn_dim) == (256, 8, 2048)
    assert m.shared_ffn_dim == 2048  # n_shared_experts 1 x moe_intermediate_size
    assert m.weight_bytes_per_param == 1.0 and m.bytes_per_param == 2.0  # FP8 block quant


def test_deepseek_v3_parameter_count_by_hand():
    """671B, DeepSeek's published total without the multi-token-prediction layer.

    embeddings = lm_head = 129,280 x 7,168 = 926,679,040
    MLA per layer: q 7,168x1,536 + 1,536x128x(128+64) = 48,758,784;
        kv 7,168x(512+64) + 512x128x(128+128) = 20,905,984; o 128x128x7,168 = 117,440,512
        -> 187,105,280; x61 = 11,413,422,080
    dense MLP 3 x 3x7,168x18,432 = 1,189,085,184
    routed experts 58 x 256 x 3x7,168x2,048 = 653,908,770,816
    shared experts 58 x 3x7,168x2,048 = 2,554,331,136; router 58 x 256 x 7,168 = 106,430,464
    norms 61 x 2 x 7,168 + 7,168 = 881,664
    total 671,026,279,424
    """
    parts = model_param_breakdown(load_model("deepseek-ai/DeepSeek-V3"))
    assert parts == {
        "embeddings": 926_679_040,
        "attention": 11_413_422_080,
        "dense_mlp": 1_189_085_184,
        "experts": 653_908_770_816,
        "shared_experts": 2_554_331_136,
        "router": 106_430_464,
        "norms": 881_664,
        "lm_head": 926_679_040,
    }
    assert sum(parts.values()) == 671_026_279_424


@pytest.mark.parametrize(
    ("model_id", "published_billions"),
    [
        ("deepseek-ai/deepseek-v3", 671.0),
        ("deepseek-ai/deepseek-v2-lite", 15.7),
        ("qwen/qwen3-235b-a22b", 235.1),
        ("qwen/qwen3-30b-a3b", 30.5),
        ("qwen/qwen3-32b", 32.8),
        ("zai-org/glm-4.5-air", 106.9),
        ("meta-llama/llama-4-scout-17b-16e-instruct", 107.8),  # 109B with the vision tower
        ("meta-llama/llama-4-maverick-17b-128e-instruct", 400.7),  # "400B"
        ("openai/gpt-oss-120b", 116.8),
        ("openai/gpt-oss-20b", 20.9),
    ],
)
def test_parameter_totals_match_the_published_ones(model_id, published_billions):
    assert model_param_count(load_model(model_id)) / 1e9 == pytest.approx(
        published_billions, abs=0.06
    )


def test_qwen3_explicit_head_dim_differs_from_hidden_over_heads():
    m = load_model("Qwen/Qwen3-32B")
    assert (m.hidden_dim, m.num_heads, m.num_kv_heads, m.config_head_dim) == (5120, 64, 8, 128)
    assert m.head_dim == 80  # hidden / heads: BLIS's backends
    assert m.attention_head_dim == 128  # the model's


def test_qwen3_235b_every_layer_moe():
    m = load_model("Qwen/Qwen3-235B-A22B")
    assert m.moe_layer_count == 94 and m.dense_layer_indices == ()
    assert m.attention_head_dim == 128 and m.hidden_dim / m.num_heads == 64


def test_glm_4_5_air_one_dense_layer_and_head_dim_that_does_not_divide_hidden():
    m = load_model("zai-org/GLM-4.5-Air")
    assert m.dense_layer_indices == (0,) and m.moe_layer_count == 45
    assert m.num_heads * m.attention_head_dim == 96 * 128 != m.hidden_dim  # 12,288 vs 4,096
    assert m.shared_ffn_dim == 1408


def test_llama4_moe_layers_shared_expert_and_chunked_attention():
    scout = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    # interleave_moe_layer_step 1: every layer is MoE (transformers/vLLM: (i + 1) % step == 0).
    assert scout.moe_layer_count == 48 and scout.dense_layer_indices == ()
    # One shared expert of intermediate_size the config does not list; BLIS sees none.
    assert scout.shared_expert_ffn_dim == 0 and scout.shared_ffn_dim == 8192
    # attention_chunk_size 8192 on the RoPE layers; every 4th layer (3, 7, ..) is global NoPE.
    assert scout.window_kind == "chunked" and scout.attention_window == 8192
    assert len(scout.windowed_layer_indices) == 36 and 3 not in scout.windowed_layer_indices
    maverick = load_model("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    # step 2: the odd layers are MoE; the even ones keep a 16,384-wide dense MLP.
    assert maverick.moe_layer_count == 24
    assert maverick.dense_layer_indices == tuple(range(0, 48, 2))
    assert maverick.dense_ffn_dim == 16384 and maverick.interleave_moe_layer_step == 2


def test_gpt_oss_sliding_layers_and_mxfp4_experts():
    m = load_model("openai/gpt-oss-120b")
    # layer_types alternate sliding (even) and full (odd); window 128.
    assert m.windowed_layer_indices == tuple(range(0, 36, 2))
    assert (m.attention_window, m.window_kind) == (128, "sliding")
    # No dtype in the file: BF16 modules beside MXFP4 (4-bit) experts.
    assert m.bytes_per_param == 2.0 and m.weight_format == "mxfp4"
    assert m.expert_bytes_per_param == 0.5 and m.effective_weight_bytes_per_param == 2.0
    assert (m.num_local_experts, m.num_experts_per_tok, m.attention_head_dim) == (128, 4, 64)


def test_configs_without_windows_stay_plain():
    for model_id in ("qwen/qwen2.5-7b-instruct", "mistralai/mixtral-8x7b-v0.1"):
        m = load_model(model_id)  # sliding_window disabled (use_sliding_window false) or null
        assert m.windowed_layer_indices == () and m.window_kind == ""


@pytest.mark.parametrize(
    ("extra", "dense"),
    [
        ({"first_k_dense_replace": 2}, (0, 1)),
        ({"first_k_dense_replace": 1, "moe_layer_freq": 2}, (0, 1, 3, 5, 7)),
        ({"decoder_sparse_step": 2}, (0, 2, 4, 6)),
        ({"mlp_only_layers": [0, 7]}, (0, 7)),
        ({"interleave_moe_layer_step": 4}, (0, 1, 2, 4, 5, 6)),
        ({"moe_layers": [5]}, (0, 1, 2, 3, 4, 6, 7)),
        ({}, ()),
    ],
)
def test_dense_layer_rules_of_each_family(extra, dense):
    assert parse_hf_config(_moe(**extra), "x").dense_layer_indices == dense


@pytest.mark.parametrize(
    ("extra", "windowed", "kind"),
    [
        ({"sliding_window": 4096}, tuple(range(8)), "sliding"),  # Mistral-7B: every layer
        ({"sliding_window": 4096, "use_sliding_window": False}, (), ""),
        ({"sliding_window": 512, "sliding_window_pattern": 4}, (0, 1, 2, 4, 5, 6), "sliding"),
        ({"sliding_window": 512, "model_type": "gemma2"}, (0, 2, 4, 6), "sliding"),
        (
            {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 6},
            (6, 7),
            "sliding",
        ),
        ({"attention_chunk_size": 1024}, (0, 1, 2, 4, 5, 6), "chunked"),
        ({"attention_chunk_size": 1024, "no_rope_layers": [1, 0] * 4}, (0, 2, 4, 6), "chunked"),
    ],
)
def test_window_rules(extra, windowed, kind):
    m = parse_hf_config(_moe(**extra), "x")
    assert (m.windowed_layer_indices, m.window_kind) == (windowed, kind)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"first_k_dense_replace": -1}, "first_k_dense_replace"),
        ({"mlp_only_layers": [8]}, "mlp_only_layers"),
        ({"moe_layers": "all"}, "moe_layers"),
        ({"interleave_moe_layer_step": -2}, "interleave_moe_layer_step"),
        # Layers are walked one by one: a damaged count is refused, not looped over.
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
    ],
)
def test_bad_layer_fields_name_the_field(extra, field):
    with pytest.raises(ConfigError, match=f"x: {field}: invalid value"):
        parse_hf_config(_moe(**extra), "x")
