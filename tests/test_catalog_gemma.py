"""Gemma 1/2/3 gate their MLP with a GELU (GeGLU: gate, up and down projections), the
three-matrix family the weight formula counts, so their configs are sized instead of falling
back to 1,000,000 blocks (docs/models-and-hardware.md, KV-cache capacity step 7)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model, parse_hf_config
from simulator.errors import ConfigError
from simulator.latency.kv_capacity import (
    GIB_BYTES,
    kv_capacity,
    model_param_breakdown,
    model_param_count,
)

# google/gemma-2-9b-it config.json as published (it writes no tie_word_embeddings: transformers'
# Gemma2Config ties the LM head by default).
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}


def test_gemma_2_9b_counts_its_published_9_24b_parameters():
    """Gemma-2-9B, 9,241,705,984 parameters (the safetensors total HuggingFace shows, 9.24B):

    embeddings  256,000 · 3,584                                  =   917,504,000
    per layer   q_dim = 16 · 256 = 4,096, kv_dim = 8 · 256 = 2,048
      attention 3,584 · (4,096 + 2 · 2,048) + 4,096 · 3,584        =    44,040,192
      MLP       3 · 3,584 · 14,336 (GeGLU gate, up, down)          =   154,140,672
      norms     4 · 3,584 (before/after attention and MLP)         =        14,336
      sum                                                          =   198,195,200
    42 layers                                                      = 8,324,198,400
    final norm                                                     =         3,584
    lm_head     tied to the embeddings (the file does not say:
                transformers' Gemma default)                       =             0
    total                                                          = 9,241,705,984
    """
    model = parse_hf_config(GEMMA_2_9B, "google/gemma-2-9b-it")
    parts = model_param_breakdown(model)
    assert parts["embeddings"] == 917_504_000
    assert parts["attention"] == 42 * 44_040_192
    assert parts["dense_mlp"] == 42 * 154_140_672
    assert parts["norms"] == 42 * 14_336 + 3_584
    assert parts["lm_head"] == 0
    assert model_param_count(model) == 9_241_705_984


@pytest.mark.parametrize(
    ("config", "published"),
    [
        # google/gemma-2-2b: 26 layers of 2,304, 8 heads / 4 KV heads of 256, FFN 9,216.
        (
            {
                **GEMMA_2_9B,
                "hidden_size": 2304,
                "intermediate_size": 9216,
                "num_attention_heads": 8,
                "num_hidden_layers": 26,
                "num_key_value_heads": 4,
            },
            2_614_341_888,
        ),
        # google/gemma-2-27b: 46 layers of 4,608, 32 heads / 16 KV heads of 128, FFN 36,864.
        (
            {
                **GEMMA_2_9B,
                "head_dim": 128,
                "hidden_size": 4608,
                "intermediate_size": 36864,
                "num_attention_heads": 32,
                "num_hidden_layers": 46,
                "num_key_value_heads": 16,
            },
            27_227_128_320,
        ),
        # google/gemma-3-1b-it (text only): 26 layers of 1,152, 4 heads / 1 KV head of 256, FFN
        # 6,912, vocabulary 262,144; each layer also has query and key norms of 256.
        (
            {
                "architectures": ["Gemma3ForCausalLM"],
                "head_dim": 256,
                "hidden_activation": "gelu_pytorch_tanh",
                "hidden_size": 1152,
                "intermediate_size": 6912,
                "max_position_embeddings": 32768,
                "model_type": "gemma3_text",
                "num_attention_heads": 4,
                "num_hidden_layers": 26,
                "num_key_value_heads": 1,
                "sliding_window": 512,
                "sliding_window_pattern": 6,
                "torch_dtype": "bfloat16",
                "vocab_size": 262144,
            },
            999_885_952,
        ),
    ],
)
def test_other_gemmas_count_their_published_parameters(config, published):
    assert model_param_count(parse_hf_config(config, "gemma")) == published


@pytest.fixture
def gemma_2_9b(tmp_path):
    folder = tmp_path / "gemma-2-9b-it"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GEMMA_2_9B))
    return load_model(str(folder))


def test_gemma_2_9b_is_sized_on_one_h100(gemma_2_9b):
    """KV bytes / token = 42 · 2 · 256 · 8 · 2 = 344,064; per 16-token block 5,505,024.
    Weights 9,241,705,984 · 2 B = 18,483,411,968 B (17.214 GiB).
    blis: free = (72 - 17.214 - 5.5 - 0.15) GiB; vllm: free = (72 - 17.214 - 0.803) GiB."""
    assert gemma_2_9b.hidden_act == "gelu_pytorch_tanh"
    h100 = get_gpu("H100")
    weights = 9_241_705_984 * 2
    for rule, reserve in (("blis", 5.5 + 0.15), ("vllm", 0.803)):
        cap = kv_capacity(gemma_2_9b, h100, 1, rule=rule)
        assert cap.kv_bytes_per_token == 344_064
        assert cap.kv_bytes_per_block_per_gpu == 5_505_024
        free = int((72.0 - (weights / GIB_BYTES + reserve)) * GIB_BYTES)
        assert cap.blocks == free // 5_505_024
    assert kv_capacity(gemma_2_9b, h100, 1, rule="blis").blocks == 9_583
    assert kv_capacity(gemma_2_9b, h100, 1, rule="vllm").blocks == 10_529


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast"])
@pytest.mark.parametrize("model_type", ["gemma", "gemma2", "gemma3", "gemma3_text"])
def test_every_gemma_gelu_is_accepted(gemma_2_9b, act, model_type):
    model = replace(gemma_2_9b, hidden_act=act, model_type=model_type)
    assert kv_capacity(model, get_gpu("H100"), 1).blocks > 0


@pytest.mark.parametrize(
    ("act", "model_type"),
    [
        ("gelu_pytorch_tanh", "starcoder2"),  # c_fc / c_proj: two matrices
        ("gelu_new", "gpt2"),
        ("gelu_new", "phi"),
        ("gelu", "falcon"),
        ("relu", "gemma2"),  # not a GELU
    ],
)
def test_a_gelu_outside_gemma_is_still_refused(gemma_2_9b, act, model_type):
    model = replace(gemma_2_9b, hidden_act=act, model_type=model_type)
    with pytest.raises(ConfigError, match=f"hidden_act: invalid value '{act}'.*gated"):
        kv_capacity(model, get_gpu("H100"), 1)


def test_hidden_activation_is_read_where_gemma_writes_it():
    config = {k: v for k, v in GEMMA_2_9B.items() if k != "hidden_act"}
    assert parse_hf_config(config, "g").hidden_act == "gelu_pytorch_tanh"
    config = {**GEMMA_2_9B, "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"}
    assert parse_hf_config(config, "g").hidden_act == "gelu_pytorch_tanh"
    config = {**GEMMA_2_9B, "hidden_act": "gelu", "hidden_activation": None}
    assert parse_hf_config(config, "g").hidden_act == "gelu"


def test_gemma_ties_its_lm_head_unless_the_file_says_otherwise():
    assert parse_hf_config(GEMMA_2_9B, "g").tie_word_embeddings is True
    untied = {**GEMMA_2_9B, "tie_word_embeddings": False}
    assert parse_hf_config(untied, "g").tie_word_embeddings is False
    assert model_param_count(parse_hf_config(untied, "g")) == 9_241_705_984 + 917_504_000
    # Other families keep BLIS's reading: absent is untied.
    llama = {**GEMMA_2_9B, "model_type": "llama", "hidden_act": "silu", "hidden_activation": None}
    assert parse_hf_config(llama, "l").tie_word_embeddings is False
