"""HuggingFace config.json -> ModelConfig (docs/behaviour.md §4, §5) and the bundled model catalog.

Resolution never touches the network: a model is either one of the configs bundled under
`data/model_configs/` or a path the user gives.
"""

from __future__ import annotations

import math
import re
from functools import cache
from pathlib import Path
from typing import Any

from simulator.catalog.types import ModelConfig
from simulator.errors import ConfigError, excerpt, invalid, unknown
from simulator.input_files import bundled_yaml, read_json

_DATA_DIR = Path(__file__).parent / "data"
_MODEL_CONFIGS_DIR = _DATA_DIR / "model_configs"
_MODEL_INDEX_PATH = _DATA_DIR / "model_index.yaml"

# torch_dtype -> bytes per element of compute / activations / KV cache (docs/behaviour.md §4).
_DTYPE_BYTES: dict[str, float] = {
    "float32": 4.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "int8": 1.0,
    "uint8": 1.0,
    "int4": 1.0,
    "nf4": 1.0,
}
DTYPES_ACCEPTED = "float32, float16, bfloat16, int8, uint8, fp8* / float8*, int4, nf4"

# Model-name quantisation convention (docs/behaviour.md §4 step 2). The leading delimiter may be
# '/', so "org/model-w4a16" and "w4a16-model" both match; the trailing one may not (as in BLIS).
_WXAY_RE = re.compile(r"(?:^|[./_-])w(\d+)a\d+(?:$|[._-])", re.IGNORECASE)
_FP8_NAME_RE = re.compile(r"(?:^|[./_-])fp8(?:$|[._-])", re.IGNORECASE)

# transformers ties Gemma's LM head to its embeddings unless the config says otherwise (their
# config classes default tie_word_embeddings to true, and Gemma-2/3 files do not write it);
# every other family servesim reads writes it, or unties by default (BLIS reads absent as false).
_TIED_BY_DEFAULT_MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})

# Keys that may carry the total routed-expert count, after num_local_experts (docs/behaviour.md §5).
_EXPERT_COUNT_KEYS = ("num_routed_experts", "n_routed_experts", "num_experts")


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


# No real config has a size near this (vocabularies are ~10^5, context windows ~10^7); a
# larger one is damage, and it would overflow the floats the latency models compute with.
MAX_CONFIG_INT = 2**40
# Layers are walked one by one (which are MoE, which attend a window); real models have ~10^2.
MAX_LAYERS = 100_000

# What `load_model` accepts of the sizes that set a step's bytes and FLOPs
# (docs/models-and-hardware.md, "Size bounds"): 64 to 128 times the largest real model's, so
# no real config comes near them, and beyond them a config is damaged. A bound on each size
# alone still lets their product run away (2^20 hidden x 2^22 FFN x 2^16 experts x 10^5
# layers), so the parameter count they make is bounded too, at about 1,000 times the largest
# open model's (Kimi-K2, 1.04 x 10^12). Under it a step on any built-in GPU lasts hours, not
# the ~10^17 µs of a hidden_size of 2^35, whose run's clock overflowed int64 µs.
MAX_SIZES: dict[str, tuple[str, int, str]] = {
    # ModelConfig field: (config key, bound, the largest real value it is measured against)
    "hidden_dim": ("hidden_size", 2**20, "Llama-3.1-405B's 16,384"),
    "intermediate_dim": ("intermediate_size", 2**22, "PaLM-540B's 73,728"),
    "moe_expert_ffn_dim": ("moe_intermediate_size", 2**22, "PaLM-540B's dense 73,728"),
    "shared_expert_ffn_dim": (
        "shared_expert_intermediate_size (or n_shared_experts x moe_intermediate_size)",
        2**22,
        "PaLM-540B's dense 73,728",
    ),
    "dense_ffn_dim": ("intermediate_size_mlp", 2**22, "PaLM-540B's 73,728"),
    "vocab_size": ("vocab_size", 2**24, "Gemma-3's 262,144"),
    "num_heads": ("num_attention_heads", 2**14, "DeepSeek-V3's 128"),
    "config_head_dim": ("head_dim", 2**14, "Gemma's 256"),
    "num_local_experts": ("the expert count", 2**16, "Qwen3-Next's 512"),
    "kv_lora_rank": ("kv_lora_rank", 2**16, "DeepSeek-V3's 512"),
    "q_lora_rank": ("q_lora_rank", 2**16, "DeepSeek-V3's 1,536"),
    "qk_rope_head_dim": ("qk_rope_head_dim", 2**14, "DeepSeek-V3's 64"),
    "qk_nope_head_dim": ("qk_nope_head_dim", 2**14, "DeepSeek-V3's 128"),
    "v_head_dim": ("v_head_dim", 2**14, "DeepSeek-V3's 128"),
}
MAX_PARAMETERS = 2**50  # 1,125,899,906,842,624


# The sizes a model cannot lack: when written, they must be > 0 (absent reads as 0, which
# validate_model refuses saying the field is missing).
_REQUIRED_SIZES = frozenset({"num_hidden_layers", "hidden_size", "num_attention_heads"})


def _int_field(cfg: dict[str, Any], key: str, name: str) -> int:
    """Read a size or count; absent or null -> 0. Integral floats (e.g. 8.0) are accepted.
    Every such field of a config.json is a size, a count or a layer number, so a negative value
    (and a written 0 for the sizes every model has) is refused here, naming the config's key
    (docs/models-and-hardware.md)."""
    value = cfg.get(key)
    if value is None:
        return 0
    lowest = 1 if key in _REQUIRED_SIZES else 0
    allowed = f"must be an integer >= {lowest} and at most {MAX_CONFIG_INT:,}"
    if isinstance(value, bool):
        raise invalid(f"{name}: {key}", value, allowed)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and lowest <= value <= MAX_CONFIG_INT:
        return value
    raise invalid(f"{name}: {key}", value, allowed)


def _first_nonzero(cfg: dict[str, Any], keys: tuple[str, ...], name: str) -> int:
    for key in keys:
        value = _int_field(cfg, key, name)
        if value != 0:
            return value
    return 0


def dtype_bytes(dtype: object) -> float:
    """Bytes per element for a torch dtype name; 0 when unknown (docs/behaviour.md §4)."""
    if not isinstance(dtype, str):
        return 0.0
    key = dtype.strip().lower().removeprefix("torch.")
    if key.startswith("fp8") or key.startswith("float8"):
        return 1.0
    return _DTYPE_BYTES.get(key, 0.0)


def _as_number(value: object) -> float | None:
    """A positive finite number from a JSON number or numeric string, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) and number > 0 else None


# A weight of more bits than float32's is no quantisation servesim knows.
_MAX_WEIGHT_BITS = 32


def _check_bits(value: object, field: str) -> None:
    """A numeric bit width (a number or a numeric string) must be in (0, 32]; anything
    non-numeric says nothing and is ignored, as before."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        return
    if not (math.isfinite(number) and 0 < number <= _MAX_WEIGHT_BITS):
        raise invalid(field, value, f"must be a number of bits > 0 and <= {_MAX_WEIGHT_BITS}")


def _check_quantization_config(qcfg: object, name: str) -> None:
    """Refuse a non-positive (or absurd) bit width where the weight width is read from."""
    if not isinstance(qcfg, dict):
        return
    _check_bits(qcfg.get("bits"), f"{name}: quantization_config.bits")
    groups = qcfg.get("config_groups")
    if isinstance(groups, dict):
        for key in sorted(groups):
            group = groups[key]
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict):
                _check_bits(
                    weights.get("num_bits"),
                    f"{name}: quantization_config.config_groups.{key}.weights.num_bits",
                )


def _check_rope_scaling(scaling: object, name: str) -> None:
    """`rope_scaling.factor` and `original_max_position_embeddings` stretch the context limit:
    when numeric they must be positive (a non-numeric value is ignored, as before)."""
    if not isinstance(scaling, dict):
        return
    for key, allowed in (
        ("factor", "must be a finite number > 0"),
        ("original_max_position_embeddings", "must be a number > 0"),
    ):
        value = scaling.get(key)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if numeric and not (_finite(value) and value > 0):
            raise invalid(f"{name}: rope_scaling.{key}", value, allowed)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range
        return False


def weight_bytes_from_quantization_config(qcfg: object) -> float:
    """Weight width in bytes from a `quantization_config` block; 0 when it says nothing."""
    if not isinstance(qcfg, dict):
        return 0.0
    bits = _as_number(qcfg.get("bits"))
    if bits is not None:
        return bits / 8.0
    method = qcfg.get("quant_method")
    method = method.lower() if isinstance(method, str) else ""
    if method == "fp8":
        return 1.0
    if method == "compressed-tensors":
        groups = qcfg.get("config_groups")
        if isinstance(groups, dict):
            for key in sorted(groups):
                group = groups[key]
                weights = group.get("weights") if isinstance(group, dict) else None
                num_bits = (
                    _as_number(weights.get("num_bits")) if isinstance(weights, dict) else None
                )
                if num_bits is not None:
                    return num_bits / 8.0
    return 0.0


def weight_bytes_from_name(name: str) -> float:
    """Weight width implied by a model name (`-w4a16` -> 0.5, `-FP8` -> 1.0); 0 when silent."""
    match = _WXAY_RE.search(name)
    if match and int(match.group(1)) > 0:
        return int(match.group(1)) / 8.0
    if _FP8_NAME_RE.search(name):
        return 1.0
    return 0.0


def parse_hf_config(raw: dict, name: str) -> ModelConfig:
    """Map a HuggingFace config.json dict to a ModelConfig (docs/behaviour.md §5). Refuses a
    value no config can mean, naming its key: a size or count that is negative, not an integer
    or beyond 2^40 (a written 0 for layers, hidden size or heads), a bit width outside (0, 32], a
    non-positive rope factor. The checks across fields (heads, dtype, experts) are
    `validate_model`'s, which `load_model` calls, so a caller building from a dict decides.
    """
    if not isinstance(raw, dict):
        raise invalid(f"{name}: config", type(raw).__name__, "must be a JSON object")
    cfg: dict[str, Any] = dict(raw)
    text_config = raw.get("text_config")
    if isinstance(text_config, dict):
        # Multimodal wrappers (Llama-4, Gemma-3, ...) keep the language model in text_config.
        cfg.update(text_config)

    num_heads = _int_field(cfg, "num_attention_heads", name)
    num_kv_heads = _first_nonzero(
        cfg, ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), name
    )
    intermediate_dim = _first_nonzero(cfg, ("intermediate_size", "ffn_hidden_size"), name)

    num_experts = _int_field(cfg, "num_local_experts", name)
    if num_experts <= 1:
        num_experts = 0
        for key in _EXPERT_COUNT_KEYS:
            value = _int_field(cfg, key, name)
            if value > 1:
                num_experts = value
                break
    experts_per_tok = _int_field(cfg, "num_experts_per_tok", name)
    moe_dim = _int_field(cfg, "moe_intermediate_size", name)
    n_shared = _int_field(cfg, "n_shared_experts", name)
    shared_dim = _int_field(cfg, "shared_expert_intermediate_size", name)
    if shared_dim <= 0 and n_shared > 0:
        shared_dim = n_shared * (moe_dim or intermediate_dim)
    # Without an expert count the weight estimate would be the dense one, wildly too small,
    # so the KV-capacity calculation must refuse rather than guess.
    moe_count_missing = num_experts == 0 and (n_shared > 0 or experts_per_tok > 0)

    dtype = cfg.get("torch_dtype")
    if dtype is None:
        dtype = cfg.get("dtype")
    bytes_per_param = dtype_bytes(dtype)
    qcfg = cfg.get("quantization_config")
    quant_method = qcfg.get("quant_method") if isinstance(qcfg, dict) else None
    mxfp4 = isinstance(quant_method, str) and quant_method.lower() == "mxfp4"
    if mxfp4 and dtype is None:
        # gpt-oss writes no dtype: its unquantised modules (attention, router, embeddings)
        # ship in BF16, the MXFP4 format's companion precision.
        bytes_per_param = _DTYPE_BYTES["bfloat16"]

    _check_quantization_config(qcfg, name)
    weight_bytes = weight_bytes_from_quantization_config(qcfg)
    if weight_bytes == 0.0:
        weight_bytes = weight_bytes_from_name(name)

    head_dim = cfg.get("head_dim")
    # A non-numeric head_dim is ignored (some configs write null or a string); a numeric one
    # is read like every other size.
    config_head_dim = (
        _int_field(cfg, "head_dim", name) or None
        if isinstance(head_dim, int | float) and not isinstance(head_dim, bool)
        else None
    )
    # Gemma-2/3 name their MLP's activation `hidden_activation` (transformers reads it there;
    # their files may carry a `hidden_act` too); everyone else writes `hidden_act`.
    hidden_act = cfg.get("hidden_activation")
    if not isinstance(hidden_act, str) or not hidden_act:
        hidden_act = cfg.get("hidden_act")
    rope_scaling = cfg.get("rope_scaling")
    _check_rope_scaling(rope_scaling, name)
    model_type = cfg.get("model_type")
    model_type = model_type if isinstance(model_type, str) else ""
    num_layers = _int_field(cfg, "num_hidden_layers", name)
    if num_layers > MAX_LAYERS:
        raise invalid(f"{name}: num_hidden_layers", num_layers, f"must be at most {MAX_LAYERS:,}")
    is_moe = num_experts > 1
    dense_layers = _dense_layers_of_moe(cfg, num_layers, name) if is_moe else ()
    windowed, window, window_kind = _windowed_layers(cfg, num_layers, name)
    unlisted_shared = 0
    if is_moe and shared_dim <= 0 and model_type.startswith("llama4"):
        # Llama-4's MoE block always adds one shared expert of intermediate_size.
        unlisted_shared = intermediate_dim

    return ModelConfig(
        name=name,
        num_layers=num_layers,
        hidden_dim=_int_field(cfg, "hidden_size", name),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads or num_heads,
        intermediate_dim=intermediate_dim,
        vocab_size=_int_field(cfg, "vocab_size", name),
        bytes_per_param=bytes_per_param,
        weight_bytes_per_param=weight_bytes,
        num_local_experts=num_experts,
        num_experts_per_tok=experts_per_tok,
        moe_expert_ffn_dim=moe_dim,
        shared_expert_ffn_dim=shared_dim,
        config_head_dim=config_head_dim,
        hidden_act=hidden_act if isinstance(hidden_act, str) else "",
        tie_word_embeddings=cfg.get("tie_word_embeddings") is True
        or ("tie_word_embeddings" not in cfg and model_type in _TIED_BY_DEFAULT_MODEL_TYPES),
        max_position_embeddings=_int_field(cfg, "max_position_embeddings", name),
        rope_scaling=dict(rope_scaling) if isinstance(rope_scaling, dict) else None,
        model_type=model_type,
        moe_count_missing=moe_count_missing,
        kv_lora_rank=_int_field(cfg, "kv_lora_rank", name),
        qk_rope_head_dim=_int_field(cfg, "qk_rope_head_dim", name),
        qk_nope_head_dim=_int_field(cfg, "qk_nope_head_dim", name),
        v_head_dim=_int_field(cfg, "v_head_dim", name),
        q_lora_rank=_int_field(cfg, "q_lora_rank", name),
        dense_layer_indices=dense_layers,
        dense_ffn_dim=_int_field(cfg, "intermediate_size_mlp", name) or intermediate_dim,
        interleave_moe_layer_step=_int_field(cfg, "interleave_moe_layer_step", name),
        unlisted_shared_expert_ffn_dim=unlisted_shared,
        windowed_layer_indices=windowed,
        attention_window=window,
        window_kind=window_kind,
        weight_format="mxfp4" if mxfp4 else "",
        # MXFP4 packs 4-bit elements (plus one shared 8-bit scale per 32, ignored here like
        # every format's scales) for the routed experts only.
        expert_weight_bytes_per_param=0.5 if mxfp4 and is_moe else 0.0,
        mtp_layers=_int_field(cfg, "num_nextn_predict_layers", name),
    )


def _index_list(cfg: dict[str, Any], key: str, num_layers: int, name: str) -> list[int] | None:
    """A list of layer indices (`mlp_only_layers`, `moe_layers`); None when absent."""
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < max(num_layers, 1)
        for i in value
    ):
        raise invalid(
            f"{name}: {key}", value, f"must be a list of layer indices 0..{num_layers - 1}"
        )
    return value


def _dense_layers_of_moe(cfg: dict[str, Any], num_layers: int, name: str) -> tuple[int, ...]:
    """Layers of an MoE model that keep a dense MLP, by each family's config rule."""
    first_dense = _int_field(cfg, "first_k_dense_replace", name)  # >= 0, as every size
    listed = _index_list(cfg, "moe_layers", num_layers, name)
    moe_layers = set(listed) if listed is not None else None
    step = _int_field(cfg, "interleave_moe_layer_step", name)
    sparse_step = _int_field(cfg, "decoder_sparse_step", name)
    freq = _int_field(cfg, "moe_layer_freq", name)
    mlp_only = set(_index_list(cfg, "mlp_only_layers", num_layers, name) or ())
    dense = []
    for i in range(num_layers):
        if moe_layers is not None:  # Llama-4 may list them outright
            moe = i in moe_layers
        elif step > 0:  # Llama-4: every step-th layer, counting from 1
            moe = (i + 1) % step == 0
        else:  # DeepSeek/GLM/Kimi (first_k_dense_replace, moe_layer_freq), Qwen (sparse step)
            moe = (
                i >= first_dense
                and (freq <= 1 or i % freq == 0)
                and (sparse_step <= 1 or (i + 1) % sparse_step == 0)
                and i not in mlp_only
            )
        if not moe:
            dense.append(i)
    return tuple(dense)


# Llama-4: every `no_rope_layer_interval`-th layer is a global NoPE layer, the rest attend
# within chunks (transformers' default when `no_rope_layers` is empty).
_LLAMA4_NOPE_INTERVAL = 4
# Gemma-2 alternates sliding (even) and global (odd) layers.
_GEMMA2_PATTERN = 2


def _windowed_layers(
    cfg: dict[str, Any], num_layers: int, name: str
) -> tuple[tuple[int, ...], int, str]:
    """(layers with windowed attention, window tokens, "sliding" | "chunked")."""
    chunk = _int_field(cfg, "attention_chunk_size", name)
    if chunk > 0:
        rope = cfg.get("no_rope_layers")
        if isinstance(rope, list) and len(rope) == num_layers:
            layers = [i for i, uses_rope in enumerate(rope) if uses_rope]
        else:
            interval = _int_field(cfg, "no_rope_layer_interval", name) or _LLAMA4_NOPE_INTERVAL
            layers = [i for i in range(num_layers) if (i + 1) % interval != 0]
        return tuple(layers), chunk, "chunked"
    window = _int_field(cfg, "sliding_window", name)
    if window <= 0 or cfg.get("use_sliding_window") is False:
        return (), 0, ""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == num_layers:
        layers = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    elif (pattern := _int_field(cfg, "sliding_window_pattern", name)) > 0:
        layers = [i for i in range(num_layers) if (i + 1) % pattern != 0]
    elif cfg.get("model_type") == "gemma2":
        layers = [i for i in range(num_layers) if i % _GEMMA2_PATTERN == 0]
    elif cfg.get("use_sliding_window") is True and "max_window_layers" in cfg:
        layers = list(range(_int_field(cfg, "max_window_layers", name), num_layers))
    else:  # Mistral-7B: every layer
        layers = list(range(num_layers))
    return tuple(layers), window, "sliding" if layers else ""


def _check_sizes(model: ModelConfig, where: str) -> None:
    """The size bounds (MAX_SIZES, MAX_PARAMETERS), naming the config key, its value and the
    range allowed."""
    for field, (key, bound, largest) in MAX_SIZES.items():
        value = getattr(model, field) or 0
        if value > bound:
            raise invalid(
                f"{where}: {key}",
                value,
                f"must be an integer in [0, {bound:,}] (2^{bound.bit_length() - 1}; the "
                f"largest real model's is {largest}); a larger size is a damaged config",
            )
    # kv_capacity imports this module's types: importing it at the top would be a cycle.
    from simulator.latency.kv_capacity import model_param_count

    parameters = model_param_count(model)
    if parameters > MAX_PARAMETERS:
        experts = f", {model.num_local_experts:,} experts" if model.is_moe else ""
        # The standard `<field>: invalid value <value>; <allowed>`, the count with separators.
        raise ConfigError(
            f"{where}: parameters: invalid value {parameters:,}; the sizes of config.json "
            f"(hidden_size {model.hidden_dim:,}, num_hidden_layers {model.num_layers:,}, "
            f"intermediate_size {model.intermediate_dim:,}, vocab_size {model.vocab_size:,}"
            f"{experts}) must make at most {MAX_PARAMETERS:,} parameters (2^50, about 1,000 "
            "times the largest open model's 1.04e12); a larger model is a damaged config"
        )


def validate_model(model: ModelConfig) -> None:
    """Reject configs no latency model can use (missing sizes, unknown dtype, bad MoE, sizes
    beyond the bounds of docs/models-and-hardware.md)."""
    where = f"model {model.name!r}"
    for field, value in (
        ("num_hidden_layers", model.num_layers),
        ("hidden_size", model.hidden_dim),
        ("num_attention_heads", model.num_heads),
    ):
        if value <= 0:
            raise invalid(
                f"{where}: {field}", value, "must be > 0 (a field config.json lacks reads as 0)"
            )
    if model.num_kv_heads < 0:
        raise invalid(f"{where}: num_key_value_heads", model.num_kv_heads, "must be >= 0")
    if model.num_kv_heads and model.num_heads % model.num_kv_heads:
        # Grouped-query attention shares each KV head among an equal group of query heads.
        raise invalid(
            f"{where}: num_key_value_heads",
            model.num_kv_heads,
            f"must divide num_attention_heads ({model.num_heads})",
        )
    if not model.bytes_per_param > 0:
        raise ConfigError(
            f"{where}: torch_dtype: missing or not a dtype servesim knows (it gives the bytes "
            f"per parameter); torch_dtype (or dtype) must be one of {DTYPES_ACCEPTED}"
        )
    if model.weight_bytes_per_param < 0:
        raise invalid(
            f"{where}: weight_bytes_per_param", model.weight_bytes_per_param, "must be >= 0"
        )
    if model.is_moe:
        if model.num_experts_per_tok <= 0:
            raise invalid(
                f"{where}: num_experts_per_tok",
                model.num_experts_per_tok,
                f"must be > 0 for an MoE model with {model.num_local_experts} experts",
            )
        if model.num_experts_per_tok > model.num_local_experts:
            raise invalid(
                f"{where}: num_experts_per_tok",
                model.num_experts_per_tok,
                f"must be <= the expert count {model.num_local_experts}",
            )
    _check_sizes(model, where)


def validate_tp(model: ModelConfig, tp: int, field: str = "tp") -> None:
    """Tensor parallelism must shard attention heads evenly (docs/behaviour.md §2.5 step 1).
    `field` names the setting in an error (a draft model's `speculative.draft_tp`)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise invalid(field, tp, "must be an integer >= 1")
    if model.num_heads % tp != 0:
        raise invalid(
            field,
            tp,
            f"must divide num_attention_heads={model.num_heads} of model {model.name!r}",
        )
    kv_heads = model.effective_kv_heads
    # kv_heads < tp is allowed: vLLM replicates each KV head on tp / kv_heads ranks, which
    # must be a whole number (QKVParallelLinear divides tp by the KV heads).
    if kv_heads >= tp and kv_heads % tp != 0:
        raise invalid(
            field,
            tp,
            f"must divide num_key_value_heads={kv_heads} of model {model.name!r} "
            "(or be a multiple of it, in which case KV heads are replicated)",
        )
    if 0 < kv_heads < tp and tp % kv_heads != 0:
        raise invalid(
            field,
            tp,
            f"must be a multiple of num_key_value_heads={kv_heads} of model {model.name!r} "
            "when above it (vLLM replicates each KV head on tp / kv_heads ranks), or divide it",
        )


# ---------------------------------------------------------------------------------------------
# Catalog and resolution
# ---------------------------------------------------------------------------------------------


@cache
def _bundled_index() -> dict[str, str]:
    """folder -> case-correct HuggingFace id."""
    data = bundled_yaml(_MODEL_INDEX_PATH.read_text(encoding="utf-8"))
    return dict(data["models"])


@cache
def _lookup_table() -> dict[str, str]:
    """Every accepted lower-case spelling (id, folder, part after the org) -> folder."""
    table: dict[str, str] = {}
    for folder, hf_id in _bundled_index().items():
        for key in (hf_id.lower(), folder.lower(), hf_id.split("/", 1)[-1].lower()):
            table.setdefault(key, folder)
    return table


def _unknown_model(spec: str) -> ConfigError:
    """The error for a model servesim ships no config.json for. BLIS's defaults.yaml fits
    blackbox coefficients for about twenty such models (BLIS runs them from the coefficients
    alone); servesim needs the architecture for every deployment, so the message says where
    the fit is and how to give the config."""
    from simulator.catalog.defaults import fitted_deployments  # only on this error path

    fits = fitted_deployments(spec)
    if not fits:
        return unknown("model", spec, list_models())
    return ConfigError(
        f"model: no bundled config.json for {excerpt(spec)}, which has BLIS blackbox "
        f"coefficients ({', '.join(fits)}); give its HuggingFace config.json with "
        "--model-config-folder FOLDER (scenario: model_config_folder) and --latency-model "
        "blackbox, or choose a bundled model (servesim models)"
    )


def list_models() -> list[str]:
    """Lower-case HuggingFace ids of the bundled models, sorted."""
    return sorted(hf_id.lower() for hf_id in _bundled_index().values())


def hf_repo(name: str) -> str | None:
    """Case-correct HuggingFace id of a bundled model, or None when not bundled."""
    folder = _lookup_table().get(name.strip().lower())
    return _bundled_index()[folder] if folder else None


def _read_json(path: Path) -> dict:
    data = read_json(path, "model config")
    if not isinstance(data, dict):
        raise invalid(f"model config {str(path)!r}", type(data).__name__, "must be a JSON object")
    return data


def _config_path(path: Path) -> Path:
    if path.is_dir():
        candidate = path / "config.json"
        if not candidate.is_file():
            raise ConfigError(f"model config folder {str(path)!r}: no config.json in it")
        return candidate
    return path


def _expand(spec: str) -> Path:
    try:
        return Path(spec).expanduser()
    except RuntimeError:  # `~user` of an unknown user: the name is then not a path
        return Path(spec)


def _exists(path: Path) -> bool:
    """Whether `path` exists; a name the OS cannot take as a path (too long, a NUL byte) is
    not one, so it is looked up as a model name instead of raising."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".json") or spec.startswith((".", "/", "~")) or "\\" in spec


def load_model(spec: str, name: str | None = None) -> ModelConfig:
    """Resolve a model by HuggingFace id, bundled folder name, id without org (all
    case-insensitive), or a path to a folder holding config.json / to a .json file.

    `name` overrides the ModelConfig name (it also feeds the name quantisation convention).
    An existing path wins over a bundled name, so a user's own copy of a config is honoured.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise invalid("model", spec, "must be a HuggingFace id, bundled model name or path")
    spec = spec.strip()
    if "\x00" in spec:
        raise invalid("model", spec, "a model name or path must not contain a NUL byte")
    if _exists(path := _expand(spec)):
        config_path = _config_path(path)
        if name is None:
            stem_dir = config_path.parent if config_path.name == "config.json" else None
            name = stem_dir.name if stem_dir is not None else config_path.stem
        model = parse_hf_config(_read_json(config_path), name)
    else:
        folder = _lookup_table().get(spec.lower())
        if folder is None:
            if _looks_like_path(spec):
                raise ConfigError(f"model: path {excerpt(spec)} does not exist")
            raise _unknown_model(spec)
        raw = _read_json(_MODEL_CONFIGS_DIR / folder / "config.json")
        model = parse_hf_config(raw, name or _bundled_index()[folder].lower())
    validate_model(model)
    return model
