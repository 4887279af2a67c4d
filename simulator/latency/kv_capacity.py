"""KV-cache capacity from model and GPU (docs/behaviour.md §2.5; BLIS CalculateKVBlocks, itself the
llm-d capacity-planner formula), and the MaxModelLen derived from it.

The arithmetic copies BLIS's order of float operations and truncations so the block counts
match it to the block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import ConfigError, invalid

GIB_BYTES = 1 << 30
ACTIVATION_DENSE_GIB = 5.5
ACTIVATION_MOE_GIB = 8.0
# CUDA context, NCCL buffers etc. outside PyTorch's allocator, per GPU.
NON_TORCH_TP1_GIB = 0.15
NON_TORCH_TP_MULTI_GIB = 0.6
# The weight formula assumes a 3-matrix (gate/up/down) MLP; other activations mean other shapes.
SWIGLU_ACTIVATIONS = frozenset({"silu", "swiglu", "geglu", ""})
# Rope types whose max_position_embeddings already is the extended context (vLLM rule).
_ROPE_TYPES_NOT_SCALED = frozenset({"su", "longrope", "llama3"})


@dataclass(frozen=True)
class KVCapacity:
    """Every intermediate of the capacity calculation, for reports and tests."""

    blocks: int
    kv_bytes_per_token: float  # whole model, before the TP split
    kv_bytes_per_block_per_gpu: int
    available_gib: float  # over all TP GPUs
    param_count: int
    weight_gib: float
    activation_gib: float
    non_torch_gib: float

    @property
    def overhead_gib(self) -> float:
        return self.weight_gib + self.activation_gib + self.non_torch_gib


def _check_heads(model: ModelConfig, tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise invalid("tp", tp, "must be an integer >= 1")
    for field, value in (
        ("num_hidden_layers", model.num_layers),
        ("hidden_size", model.hidden_dim),
        ("num_attention_heads", model.num_heads),
    ):
        if value <= 0:
            raise invalid(f"model {model.name!r}: {field}", value, "must be > 0")
    if model.hidden_dim % model.num_heads != 0:
        raise invalid(
            f"model {model.name!r}: hidden_size",
            model.hidden_dim,
            f"must be divisible by num_attention_heads={model.num_heads} for KV sizing",
        )
    kv_heads = model.effective_kv_heads
    # Fewer KV heads than ranks is accepted: vLLM replicates them, and dividing by TP then
    # overestimates capacity slightly -- the same optimistic approximation BLIS makes.
    if kv_heads >= tp and kv_heads % tp != 0:
        raise invalid("tp", tp, f"must divide num_key_value_heads={kv_heads} of {model.name!r}")
    if not (model.bytes_per_param > 0 and math.isfinite(model.bytes_per_param)):
        raise invalid(
            f"model {model.name!r}: bytes_per_param", model.bytes_per_param, "must be > 0"
        )


def kv_bytes_per_token(model: ModelConfig, tp: int = 1) -> float:
    """KV-cache bytes one token occupies on one GPU: layers·2·head_dim·kv_heads·dtype / TP.

    Uses the compute dtype, never the quantised weight width: vLLM stores KV at compute precision.
    """
    _check_heads(model, tp)
    head_dim = model.hidden_dim // model.num_heads
    per_token = 2.0 * model.num_layers * head_dim * model.effective_kv_heads * model.bytes_per_param
    return per_token / tp


def model_param_count(model: ModelConfig) -> int:
    """Parameter estimate of docs/behaviour.md §2.5 step 4 (3-matrix SwiGLU MLP, MoE counts every
    expert)."""
    hidden = model.hidden_dim
    head_dim = hidden // model.num_heads
    kv_dim = model.effective_kv_heads * head_dim
    attention = hidden * (hidden + 2 * kv_dim) + hidden * hidden
    if model.is_moe:
        expert_ffn = model.moe_expert_ffn_dim or model.intermediate_dim
        mlp = 3 * hidden * expert_ffn * model.num_local_experts
        if model.shared_expert_ffn_dim > 0:
            mlp += 3 * hidden * model.shared_expert_ffn_dim
        mlp += model.num_local_experts * hidden  # router
    else:
        mlp = 3 * hidden * model.intermediate_dim
    norms = 2 * hidden
    embeddings = model.vocab_size * hidden
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * hidden
    return embeddings + model.num_layers * (attention + mlp + norms) + lm_head + hidden


def model_weight_bytes(model: ModelConfig) -> int:
    """Total weight bytes over all GPUs at the effective (possibly quantised) weight width."""
    return int(float(model_param_count(model)) * model.effective_weight_bytes_per_param)


def kv_capacity(
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
) -> KVCapacity:
    """Full capacity calculation; raises ConfigError when the model cannot be sized or fit."""
    _check_heads(model, tp)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise invalid("block_size", block_size, "must be an integer > 0")
    util = gpu_memory_utilization
    if not (isinstance(util, int | float) and math.isfinite(util) and 0 < util <= 1):
        raise invalid("gpu_memory_utilization", util, "must be in (0, 1]")
    if not (gpu.memory_gib > 0 and math.isfinite(gpu.memory_gib)):
        raise invalid(f"GPU {gpu.name!r}: MemoryGiB", gpu.memory_gib, "must be > 0")
    where = f"model {model.name!r}"
    if model.hidden_act not in SWIGLU_ACTIVATIONS:
        raise invalid(
            f"{where}: hidden_act",
            model.hidden_act,
            "KV capacity auto-calculation supports only silu, swiglu, geglu (or unset); "
            "set total_kv_blocks explicitly",
        )
    if model.moe_count_missing:
        raise ConfigError(
            f"{where}: num_local_experts: invalid value missing; the config signals MoE "
            "(n_shared_experts / num_experts_per_tok) without an expert count, so weight memory "
            "cannot be estimated; set total_kv_blocks explicitly"
        )
    if model.intermediate_dim <= 0:
        raise invalid(f"{where}: intermediate_size", model.intermediate_dim, "must be > 0")
    if model.vocab_size <= 0:
        raise invalid(f"{where}: vocab_size", model.vocab_size, "must be > 0")

    per_token = kv_bytes_per_token(model, 1)
    # Multiply by block size before truncating so fractional per-token bytes are not lost.
    per_block = int(per_token / tp * block_size)
    if per_block <= 0:
        raise invalid(f"{where}: KV bytes per block", per_block, "must be > 0")

    available_gib = gpu.memory_gib * util * tp
    params = model_param_count(model)
    weight_gib = float(model_weight_bytes(model)) / GIB_BYTES
    activation_gib = ACTIVATION_MOE_GIB if model.is_moe else ACTIVATION_DENSE_GIB
    non_torch_gib = (NON_TORCH_TP1_GIB if tp == 1 else NON_TORCH_TP_MULTI_GIB) * tp
    overhead_gib = weight_gib + activation_gib + non_torch_gib
    if overhead_gib >= available_gib:
        raise ConfigError(
            f"tp: invalid value {tp}; {where} needs {overhead_gib:.2f} GiB "
            f"({weight_gib:.2f} weights + {activation_gib:.2f} activations + "
            f"{non_torch_gib:.2f} non-torch) but {tp} x {gpu.name} offers {available_gib:.2f} GiB "
            f"({gpu.memory_gib:g} GiB x {util:g} utilisation x {tp}); use more GPUs per instance "
            "or a larger GPU"
        )
    allocatable_bytes = int((available_gib - overhead_gib) * GIB_BYTES)
    blocks = allocatable_bytes // per_block
    if blocks <= 0:
        raise ConfigError(
            f"tp: invalid value {tp}; {where} on {gpu.name} leaves room for 0 KV blocks "
            f"({per_block} bytes each)"
        )
    return KVCapacity(
        blocks=blocks,
        kv_bytes_per_token=per_token,
        kv_bytes_per_block_per_gpu=per_block,
        available_gib=available_gib,
        param_count=params,
        weight_gib=weight_gib,
        activation_gib=activation_gib,
        non_torch_gib=non_torch_gib,
    )


def compute_kv_blocks(
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
) -> int:
    """Number of KV blocks one instance (TP GPUs) can hold (docs/behaviour.md §2.5)."""
    return kv_capacity(model, gpu, tp, block_size, gpu_memory_utilization).blocks


def derive_max_model_len(model: ModelConfig, total_blocks: int, block_size: int) -> int:
    """Context limit: max_position_embeddings (times the rope factor where it applies), capped
    at what the KV cache can hold. 0 when the config gives no max_position_embeddings.
    """
    if model.max_position_embeddings <= 0:
        return 0
    max_len = model.max_position_embeddings
    scaling = model.rope_scaling
    if isinstance(scaling, dict) and model.model_type != "gemma3":
        rope_type = scaling.get("rope_type") or scaling.get("type") or ""
        factor = scaling.get("factor")
        if (
            rope_type not in _ROPE_TYPES_NOT_SCALED
            and isinstance(factor, int | float)
            and not isinstance(factor, bool)
            and math.isfinite(factor)
            and factor > 1
        ):
            base = max_len
            if rope_type == "yarn":
                original = scaling.get("original_max_position_embeddings")
                if isinstance(original, int) and not isinstance(original, bool) and original > 0:
                    base = original
            max_len = int(base * factor)
    return min(max_len, total_blocks * block_size)
