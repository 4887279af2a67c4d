"""Every number the catalog reads from a config.json is a size, a count, a layer number, a bit
width or a rope factor: a negative (or otherwise impossible) one is refused by `load_model`,
naming the config's key, the value and what is allowed (docs/models-and-hardware.md, "How a
model name resolves")."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.errors import ConfigError
from simulator.latency.roofline import validate_roofline_inputs

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_scaling": {
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
MOE = {
    **LLAMA_8B,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 1024,
    "n_shared_experts": 1,
}
SIZE = "must be an integer >= 0 and at most 1,099,511,627,776"
REQUIRED = "must be an integer >= 1 and at most 1,099,511,627,776"


def _load(tmp_path, config: dict, name: str = "bad"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return load_model(str(folder))


def test_the_base_configs_load(tmp_path):
    assert _load(tmp_path, LLAMA_8B, "dense").num_kv_heads == 8
    assert _load(tmp_path, MOE, "moe").num_local_experts == 8


@pytest.mark.parametrize(
    ("key", "value", "base", "allowed"),
    [
        # The two QA found: head_dim -128 ran on 1,000,000 fallback blocks, vocab_size -5 ran.
        ("head_dim", -128, LLAMA_8B, SIZE),
        ("vocab_size", -5, LLAMA_8B, SIZE),
        ("intermediate_size", -5, LLAMA_8B, SIZE),
        ("ffn_hidden_size", -5, {**LLAMA_8B, "intermediate_size": None}, SIZE),
        ("num_key_value_heads", -8, LLAMA_8B, SIZE),
        ("num_kv_heads", -8, {**LLAMA_8B, "num_key_value_heads": None}, SIZE),
        ("max_position_embeddings", -1, LLAMA_8B, SIZE),
        ("kv_lora_rank", -512, LLAMA_8B, SIZE),
        ("qk_rope_head_dim", -64, LLAMA_8B, SIZE),
        ("q_lora_rank", -1, LLAMA_8B, SIZE),
        ("num_nextn_predict_layers", -1, LLAMA_8B, SIZE),
        ("sliding_window", -4096, LLAMA_8B, SIZE),
        ("attention_chunk_size", -8192, LLAMA_8B, SIZE),
        ("num_experts_per_tok", -2, MOE, SIZE),
        ("num_experts", -8, {**MOE, "num_local_experts": None}, SIZE),
        ("moe_intermediate_size", -1024, MOE, SIZE),
        ("n_shared_experts", -1, MOE, SIZE),
        ("shared_expert_intermediate_size", -1, MOE, SIZE),
        ("intermediate_size_mlp", -1, MOE, SIZE),
        ("first_k_dense_replace", -1, MOE, SIZE),
        ("moe_layer_freq", -1, MOE, SIZE),
        ("decoder_sparse_step", -1, MOE, SIZE),
        ("interleave_moe_layer_step", -2, MOE, SIZE),
        ("num_hidden_layers", -1, LLAMA_8B, REQUIRED),
        ("hidden_size", -4096, LLAMA_8B, REQUIRED),
        ("num_attention_heads", -32, LLAMA_8B, REQUIRED),
        ("num_attention_heads", 0, LLAMA_8B, REQUIRED),
    ],
)
def test_a_negative_size_is_refused_naming_the_config_key(tmp_path, key, value, base, allowed):
    config = {k: v for k, v in {**base, key: value}.items() if v is not None}
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, config)
    assert str(exc.value) == f"bad: {key}: invalid value {value}; {allowed}"


@pytest.mark.parametrize(
    ("quantization_config", "field", "value"),
    [
        ({"quant_method": "gptq", "bits": -4}, "quantization_config.bits", "-4"),
        ({"quant_method": "awq", "bits": "0"}, "quantization_config.bits", "'0'"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": -8}}},
            },
            "quantization_config.config_groups.group_0.weights.num_bits",
            "-8",
        ),
    ],
)
def test_a_non_positive_bit_width_is_refused(tmp_path, quantization_config, field, value):
    """Before, `bits: -4` was ignored (read as "says nothing") and the weights stayed BF16."""
    config = {**LLAMA_8B, "quantization_config": quantization_config}
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, config)
    assert str(exc.value) == (
        f"bad: {field}: invalid value {value}; must be a number of bits > 0 and <= 32"
    )


@pytest.mark.parametrize(
    ("scaling", "field", "value", "allowed"),
    [
        ({"rope_type": "linear", "factor": -4.0}, "factor", -4.0, "must be a finite number > 0"),
        (
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -4096},
            "original_max_position_embeddings",
            -4096,
            "must be a number > 0",
        ),
    ],
)
def test_a_non_positive_rope_scaling_number_is_refused(tmp_path, scaling, field, value, allowed):
    """Before, both were ignored (a factor <= 1 does not stretch the context)."""
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, {**LLAMA_8B, "rope_scaling": scaling})
    assert str(exc.value) == f"bad: rope_scaling.{field}: invalid value {value}; {allowed}"


def test_absent_or_zero_optional_sizes_still_load(tmp_path):
    """0 and null keep meaning "not set" (head_dim 0: hidden / heads; no vocabulary)."""
    config = {**LLAMA_8B, "head_dim": 0, "vocab_size": None, "sliding_window": None}
    model = _load(tmp_path, {k: v for k, v in config.items() if v is not None})
    assert (model.config_head_dim, model.vocab_size, model.attention_window) == (None, 0, 0)


def test_roofline_names_the_config_key_for_a_negative_ffn():
    """A ModelConfig built directly (no config.json) reaches roofline's own check, which now
    says `intermediate_size` as the config does (it said `intermediate_dim`, without colon)."""
    model = replace(load_model("meta-llama/llama-3.1-8b-instruct"), intermediate_dim=-5)
    with pytest.raises(ConfigError) as exc:
        validate_roofline_inputs(model, get_gpu("H100"), 1)
    assert str(exc.value) == (
        "model 'meta-llama/llama-3.1-8b-instruct': intermediate_size: invalid value -5; "
        "must be >= 0"
    )
