"""HF config parsing (docs/behaviour.md §4, §5) and model resolution. Expected values are read by
hand from the bundled config.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.catalog.models import (
    list_models,
    load_model,
    parse_hf_config,
    validate_tp,
    weight_bytes_from_name,
)
from simulator.catalog.types import ModelConfig
from simulator.errors import ConfigError

BUNDLED_DIR = Path(__file__).parents[2] / "simulator" / "catalog" / "data" / "model_configs"


def _dense(**overrides) -> dict:
    raw = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "torch_dtype": "bfloat16",
    }
    raw.update(overrides)
    return raw


# --- every bundled config -----------------------------------------------------------------------


def test_bundled_models_listed_as_lower_case_ids():
    # BLIS's fourteen plus nine large MoE / explicit-head_dim models (model_index.yaml).
    models = list_models()
    assert len(models) == 23 == len(list(BUNDLED_DIR.iterdir()))
    assert all(m == m.lower() and "/" in m for m in models)
    assert "meta-llama/llama-3.1-8b-instruct" in models


@pytest.mark.parametrize("model_id", list_models())
def test_every_bundled_config_parses_to_consistent_values(model_id):
    m = load_model(model_id)
    assert m.name == model_id
    assert m.num_layers > 0 and m.hidden_dim > 0 and m.num_heads > 0
    assert m.intermediate_dim > 0 and m.vocab_size > 0
    assert m.num_kv_heads > 0 and m.num_heads % m.num_kv_heads == 0
    assert m.head_dim > 0
    assert m.bytes_per_param > 0 and m.effective_weight_bytes_per_param > 0
    assert m.max_position_embeddings > 0
    assert not m.moe_count_missing
    if m.is_moe:
        assert 0 < m.num_experts_per_tok <= m.num_local_experts


# --- hand-checked architectures -----------------------------------------------------------------


def test_gqa_llama_3_1_8b():
    m = load_model("meta-llama/Llama-3.1-8B-Instruct")
    assert (m.num_layers, m.hidden_dim, m.num_heads, m.num_kv_heads) == (32, 4096, 32, 8)
    assert (m.intermediate_dim, m.vocab_size) == (14336, 128256)
    assert m.bytes_per_param == 2.0 and m.weight_bytes_per_param == 0.0
    assert m.head_dim == 128 and m.config_head_dim is None
    assert not m.is_moe and m.hidden_act == "silu" and m.tie_word_embeddings is False
    assert m.max_position_embeddings == 131072 and m.model_type == "llama"


def test_mha_llama_2_7b_float16():
    m = load_model("llama-2-7b-hf")
    assert m.num_heads == m.num_kv_heads == 32
    assert m.bytes_per_param == 2.0  # float16
    assert m.rope_scaling is None


def test_moe_mixtral_uses_num_local_experts():
    m = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert (m.num_local_experts, m.num_experts_per_tok) == (8, 2)
    # No moe_intermediate_size: the per-expert FFN is intermediate_size (Mixtral convention).
    assert m.moe_expert_ffn_dim == 0 and m.intermediate_dim == 14336
    assert m.shared_expert_ffn_dim == 0


def test_moe_qwen3_30b_a3b_uses_num_experts():
    m = load_model("Qwen/Qwen3-30B-A3B")
    assert (m.num_local_experts, m.num_experts_per_tok, m.moe_expert_ffn_dim) == (128, 8, 768)
    assert (m.num_heads, m.num_kv_heads, m.config_head_dim) == (32, 4, 128)
    assert m.head_dim == 2048 / 32  # BLIS-Mar: hidden/heads, config head_dim ignored
    assert m.attention_head_dim == 128  # what the model has, for physics and KV capacity


def test_mla_deepseek_v2_lite():
    m = load_model("deepseek-ai/DeepSeek-V2-Lite")
    assert (m.num_layers, m.hidden_dim, m.num_heads, m.num_kv_heads) == (27, 2048, 16, 16)
    assert (m.intermediate_dim, m.vocab_size) == (10944, 102400)
    assert (m.num_local_experts, m.num_experts_per_tok) == (64, 6)  # n_routed_experts
    assert m.moe_expert_ffn_dim == 1408
    assert m.shared_expert_ffn_dim == 2 * 1408  # n_shared_experts x moe_intermediate_size
    assert m.rope_scaling["type"] == "yarn" and m.model_type == "deepseek_v2"


def test_text_config_wrapper_llama_4_scout_compressed_tensors_fp8():
    m = load_model("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic")
    assert m.name == "redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic"
    # Architecture only exists inside text_config.
    assert (m.num_layers, m.hidden_dim, m.num_heads, m.num_kv_heads) == (48, 5120, 40, 8)
    assert (m.intermediate_dim, m.vocab_size) == (8192, 202048)
    assert (m.num_local_experts, m.num_experts_per_tok) == (16, 1)
    assert m.config_head_dim == 128 and m.model_type == "llama4_text"
    # Compute dtype bf16; weights 8-bit from config_groups.group_0.weights.num_bits.
    assert m.bytes_per_param == 2.0 and m.weight_bytes_per_param == 1.0


def test_explicit_head_dim_mistral_nemo():
    m = load_model("mistralai/Mistral-Nemo-Instruct-2407")
    assert m.config_head_dim == 128
    assert m.head_dim == 5120 / 32 == 160  # what BLIS-Mar uses
    assert m.attention_head_dim == 128


def test_fp8_quant_method_glm_5_2():
    m = load_model("zai-org/GLM-5.2-FP8")
    assert m.bytes_per_param == 2.0  # from "dtype", no torch_dtype in this file
    assert m.weight_bytes_per_param == 1.0  # quant_method "fp8"
    assert (m.num_local_experts, m.num_experts_per_tok, m.moe_expert_ffn_dim) == (256, 8, 2048)
    assert m.shared_expert_ffn_dim == 1 * 2048
    assert (m.num_heads, m.num_kv_heads, m.config_head_dim) == (64, 64, 192)


# --- parsing rules on synthetic configs ---------------------------------------------------------


def test_text_config_keys_override_top_level():
    raw = _dense(hidden_size=1, text_config={"hidden_size": 64, "num_hidden_layers": 3})
    m = parse_hf_config(raw, "x")
    assert (m.hidden_dim, m.num_layers, m.vocab_size) == (64, 3, 100)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"num_key_value_heads": 2, "num_kv_heads": 1}, 2),
        ({"num_key_value_heads": 0, "num_kv_heads": 1}, 1),
        ({"multi_query_group_num": 2}, 2),
        ({}, 4),  # default: MHA
    ],
)
def test_kv_heads_chain(fields, expected):
    assert parse_hf_config(_dense(**fields), "x").num_kv_heads == expected


def test_ffn_hidden_size_fallback():
    raw = _dense(intermediate_size=None, ffn_hidden_size=256)
    assert parse_hf_config(raw, "x").intermediate_dim == 256


def test_shared_expert_intermediate_size_wins_over_n_shared():
    raw = _dense(
        num_experts=4, num_experts_per_tok=2, n_shared_experts=3, shared_expert_intermediate_size=99
    )
    m = parse_hf_config(raw, "x")
    assert (m.num_local_experts, m.shared_expert_ffn_dim) == (4, 99)


def test_n_shared_without_moe_dim_uses_intermediate():
    raw = _dense(n_routed_experts=4, num_experts_per_tok=1, n_shared_experts=2)
    assert parse_hf_config(raw, "x").shared_expert_ffn_dim == 2 * 128


def test_single_local_expert_falls_through_to_other_keys():
    raw = _dense(num_local_experts=1, num_routed_experts=8, num_experts_per_tok=2)
    assert parse_hf_config(raw, "x").num_local_experts == 8


@pytest.mark.parametrize("signal", [{"num_experts_per_tok": 2}, {"n_shared_experts": 1}])
def test_moe_signal_without_count_is_flagged(signal):
    m = parse_hf_config(_dense(**signal), "x")
    assert m.moe_count_missing and not m.is_moe


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("float32", 4.0),
        ("float16", 2.0),
        ("bfloat16", 2.0),
        ("int8", 1.0),
        ("uint8", 1.0),
        ("float8_e4m3fn", 1.0),
        ("fp8", 1.0),
        ("int4", 1.0),
        ("nf4", 1.0),
        ("complex64", 0.0),
        (None, 0.0),
    ],
)
def test_torch_dtype_bytes(dtype, expected):
    assert parse_hf_config(_dense(torch_dtype=dtype), "x").bytes_per_param == expected


def test_dtype_key_used_when_torch_dtype_absent():
    raw = _dense(torch_dtype=None, dtype="float32")
    assert parse_hf_config(raw, "x").bytes_per_param == 4.0


@pytest.mark.parametrize(
    ("qcfg", "expected"),
    [
        ({"bits": 4, "quant_method": "gptq"}, 0.5),
        ({"bits": "8", "quant_method": "awq"}, 1.0),
        ({"quant_method": "FP8"}, 1.0),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_1": {"weights": {"num_bits": 8}},
                    "group_0": {"weights": {"num_bits": 4}},
                },
            },
            0.5,  # first in sorted key order: group_0
        ),
        ({"quant_method": "bitsandbytes"}, 0.0),
    ],
)
def test_quantization_config_chain(qcfg, expected):
    raw = _dense(quantization_config=qcfg)
    assert parse_hf_config(raw, "org/plain-model").weight_bytes_per_param == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("org/model-w4a16", 0.5),
        ("RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8", 1.0),
        ("w4a16_model", 0.5),
        ("org/model-FP8-dynamic", 1.0),
        ("org/model-fp8", 1.0),
        ("org/model-w4a16x", 0.0),  # not a delimited token
        ("org/modelfp8", 0.0),
        ("org/model", 0.0),
    ],
)
def test_model_name_convention(name, expected):
    assert weight_bytes_from_name(name) == expected
    assert parse_hf_config(_dense(), name).weight_bytes_per_param == expected


def test_quantization_config_beats_model_name():
    raw = _dense(quantization_config={"bits": 4})
    assert parse_hf_config(raw, "org/model-fp8").weight_bytes_per_param == 0.5


def test_non_integer_field_is_rejected_with_field_name():
    with pytest.raises(ConfigError, match="hidden_size"):
        parse_hf_config(_dense(hidden_size="big"), "x")


# --- resolution ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "meta-llama/llama-3.1-8b-instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
        "llama-3.1-8b-instruct",
        "Llama-3.1-8B-Instruct",
        "  META-LLAMA/LLAMA-3.1-8B-INSTRUCT ",
    ],
)
def test_resolution_spellings(spec):
    assert load_model(spec).name == "meta-llama/llama-3.1-8b-instruct"


def test_resolution_by_folder_path_and_json_path(tmp_path):
    folder = tmp_path / "my-model-w4a16"
    folder.mkdir()
    (folder / "config.json").write_text(
        (BUNDLED_DIR / "llama-3.1-8b-instruct" / "config.json").read_text()
    )
    by_dir = load_model(str(folder))
    assert by_dir.name == "my-model-w4a16" and by_dir.hidden_dim == 4096
    assert by_dir.weight_bytes_per_param == 0.5  # name convention applies to paths too
    by_file = load_model(str(folder / "config.json"), name="custom/id")
    assert by_file.name == "custom/id" and by_file.weight_bytes_per_param == 0.0
    other = tmp_path / "tiny.json"
    other.write_text(json.dumps(_dense()))
    assert load_model(str(other)).name == "tiny"


def test_unknown_model_lists_bundled_ids():
    with pytest.raises(ConfigError) as exc:
        load_model("acme/not-a-model")
    msg = str(exc.value)
    assert msg.startswith("unknown model 'acme/not-a-model'; valid: ")
    assert "meta-llama/llama-3.1-8b-instruct" in msg and "qwen/qwen3-14b" in msg


def test_a_model_blis_fits_but_servesim_has_no_config_for_says_how_to_run_it(tmp_path):
    """BLIS-Mar runs blackbox for Granite 3.1 8B from defaults.yaml's coefficients alone;
    servesim needs the architecture, so the error names the fits and the way in: the model's
    own config.json (here Llama-3.1-8B's stands in for it), with which the run uses BLIS's fit."""
    with pytest.raises(ConfigError) as exc:
        load_model("ibm-granite/granite-3.1-8b-instruct")
    msg = str(exc.value)
    assert msg.splitlines() == [msg]
    assert "no bundled config.json for 'ibm-granite/granite-3.1-8b-instruct'" in msg
    fits = "A100-80 TP1 (v0.8.4), H100 TP1 (v0.8.4), A100-80 TP2 (v0.8.4), H100 TP2 (v0.8.4)"
    assert f"({fits}, H100 TP4 (v0.8.4))" in msg
    assert "--model-config-folder" in msg
    folder = tmp_path / "granite"
    folder.mkdir()
    import simulator.catalog.models as catalog

    bundled = Path(catalog.__file__).parent / "data" / "model_configs" / "llama-3.1-8b-instruct"
    (folder / "config.json").write_text((bundled / "config.json").read_text())
    from simulator import simulate

    result = simulate(
        {
            "model": "ibm-granite/granite-3.1-8b-instruct",
            "model_config_folder": str(folder),
            "hardware": "H100",
            "tp": 1,
            "latency": {"model": "blackbox"},
            "workload": {"rate": 5, "num_requests": 5},
        }
    )
    assert result.summary["completed_requests"] == 5
    assert "H100 TP1, vLLM v0.8.4" in result.latency_provenance["coefficients"]


def test_missing_path_and_folder_without_config(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_model("./no/such/config.json")
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(str(tmp_path))


def test_invalid_json_names_the_path(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json.*not valid JSON"):
        load_model(str(bad))
    top_list = tmp_path / "list.json"
    top_list.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="list.json"):
        load_model(str(top_list))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"hidden_size": None}, "hidden_size"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"torch_dtype": "complex64"}, "torch_dtype"),
        ({"num_local_experts": 8}, "num_experts_per_tok"),  # experts but k = 0
        ({"num_local_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok"),
    ],
)
def test_load_validates(tmp_path, overrides, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_dense(**overrides)))
    with pytest.raises(ConfigError, match=field):
        load_model(str(path))


# --- tensor parallelism -------------------------------------------------------------------------


def _model(heads: int, kv_heads: int) -> ModelConfig:
    return ModelConfig(
        name="m",
        num_layers=1,
        hidden_dim=heads * 8,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_dim=8,
    )


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32])
def test_tp_valid_for_llama_8b(tp):
    validate_tp(load_model("llama-3.1-8b-instruct"), tp)  # kv 8 < 16, 32: replicated


def test_tp_must_divide_heads():
    with pytest.raises(
        ConfigError, match=r"tp: invalid value 3; must divide num_attention_heads=32"
    ):
        validate_tp(load_model("llama-3.1-8b-instruct"), 3)
    with pytest.raises(ConfigError, match="num_attention_heads=28"):
        validate_tp(load_model("qwen2.5-7b-instruct"), 8)


def test_tp_must_divide_kv_heads_when_not_fewer():
    validate_tp(_model(heads=24, kv_heads=6), 12)  # 6 < 12: each KV head on 2 ranks
    with pytest.raises(ConfigError, match="num_key_value_heads=6"):
        validate_tp(_model(heads=24, kv_heads=6), 4)


def test_tp_above_the_kv_heads_must_be_a_multiple_of_them():
    """vLLM replicates each KV head on tp / kv_heads ranks (QKVParallelLinear divides them):
    Qwen2.5-7B's 28 heads take TP 7, its 4 KV heads do not (7 / 4), and vLLM refuses it."""
    with pytest.raises(ConfigError, match="tp: invalid value 7; must be a multiple of num_key"):
        validate_tp(load_model("qwen2.5-7b-instruct"), 7)
    with pytest.raises(ConfigError, match="num_key_value_heads=6"):
        validate_tp(_model(heads=24, kv_heads=6), 8)


@pytest.mark.parametrize("tp", [0, -1, 1.5, True])
def test_tp_must_be_positive_integer(tp):
    with pytest.raises(ConfigError, match="tp: invalid value"):
        validate_tp(_model(4, 4), tp)


@pytest.mark.parametrize("value", [float("inf"), 1e300, 2**40 + 1, 12.5])
def test_a_size_no_model_has_is_refused_naming_the_field(value):
    """Found by fuzzing: head_dim 1e30928 (JSON reads it as infinity) reached int() and
    raised OverflowError. Sizes are integers of at most 2^40 (far above any vocabulary or
    context window); anything else is a one-line ConfigError naming the field."""
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "head_dim": value,
    }
    with pytest.raises(ConfigError, match="head_dim.*at most 1,099,511,627,776"):
        parse_hf_config(config, "toy")
    assert parse_hf_config({**config, "head_dim": 2**40}, "toy").config_head_dim == 2**40


def test_kv_heads_must_divide_the_attention_heads():
    """Grouped-query attention gives each KV head an equal group of query heads: 3 KV heads
    for 32 query heads is not a model, and is refused rather than priced."""
    from simulator.catalog.models import validate_model

    validate_model(parse_hf_config(_dense(num_attention_heads=32, num_key_value_heads=8), "x"))
    with pytest.raises(ConfigError, match=r"num_key_value_heads: invalid value 3; must divide"):
        validate_model(parse_hf_config(_dense(num_attention_heads=32, num_key_value_heads=3), "x"))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_hidden_layers": None}, r"num_hidden_layers: .*config.json lacks reads as 0"),
        ({"torch_dtype": "int3"}, r"torch_dtype: missing or not a dtype servesim knows"),
    ],
)
def test_a_config_missing_a_size_or_with_an_unknown_dtype_says_so(fields, message):
    from simulator.catalog.models import validate_model

    raw = {k: v for k, v in _dense(**fields).items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        validate_model(parse_hf_config(raw, "x"))
