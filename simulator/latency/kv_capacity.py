"""KV-cache capacity from model and GPU (docs/behaviour.md §2.5; BLIS CalculateKVBlocks, itself the
llm-d capacity-planner formula), and the MaxModelLen derived from it.

The arithmetic copies BLIS's order of float operations and truncations so the block counts
match it to the block for the plain decoders BLIS-Mar sizes. Where a config states more than
BLIS-Mar reads, the facts win (docs/models-and-hardware.md): an explicit `head_dim`, MLA's
compressed cache, dense layers inside an MoE stack, unlisted shared experts, weight formats
per module, an FP8 cache; and the layout's pipeline stages and expert sharding.

Two rules turn free memory into blocks (`KV_CAPACITY_RULES`): "blis" (the default, BLIS's)
divides the free memory of all the instance's GPUs by the bytes *one* GPU stores per block
as BLIS computes them (`blis_kv_bytes_per_token`: ÷ TP even below one KV head per GPU),
which counts every block once per GPU (tp times what vLLM reports for tp > 1); "vllm" divides
it by what all of them store per block, as vLLM allocates (each GPU keeps its share of every
block, at least one whole KV head: `kv_bytes_per_token`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import ConfigError, invalid

GIB_BYTES = 1 << 30
# BLIS's (the llm-d capacity planner's) activation reserve, per instance.
ACTIVATION_DENSE_GIB = 5.5
ACTIVATION_MOE_GIB = 8.0
# CUDA context, NCCL buffers etc. outside PyTorch's allocator, per GPU.
NON_TORCH_TP1_GIB = 0.15
NON_TORCH_TP_MULTI_GIB = 0.6
# What vLLM keeps beyond the weights before sizing its KV cache (its profiled activation peak,
# CUDA graphs, the CUDA context, NCCL buffers), per GPU, as the block counts vLLM logged imply:
# memory x 0.9 - weights - blocks x bytes per block, on H100 — Llama-2-7B TP1 1.152 GiB and
# Qwen3-14B TP1 0.454 GiB (one GPU); Mixtral-8x7B TP2 1.639 and Llama-2-70B TP4 1.604 GiB per
# GPU (several). Each is the mean of its pair; docs/models-and-hardware.md scores it held out.
VLLM_RESERVED_ONE_GPU_GIB = 0.803
VLLM_RESERVED_PER_GPU_GIB = 1.6215
# The weight formula assumes a 3-matrix (gate/up/down) MLP; other activations mean other shapes.
SWIGLU_ACTIVATIONS = frozenset({"silu", "swiglu", "geglu", ""})
# Gemma 1/2/3 (and PaliGemma's Gemma text model) gate their MLP with a GELU (GeGLU: gate, up and
# down projections, down(gelu(gate(x)) * up(x))) and write the GELU's name in hidden_act /
# hidden_activation. The same names elsewhere (GPT-2, Phi-2, StarCoder2, Falcon) mean a
# two-matrix MLP, so a GELU is accepted for these model types only.
GATED_GELU_MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
GELU_ACTIVATIONS = frozenset({"gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast"})
# Gemma-2 and Gemma-3 normalise before and after both attention and MLP (four RMSNorms per
# layer, not two); Gemma-3 also normalises queries and keys (one head_dim-wide norm each).
_FOUR_NORM_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text"})
_QK_NORM_MODEL_TYPES = frozenset({"gemma3", "gemma3_text"})
# Rope types whose max_position_embeddings already is the extended context (vLLM rule).
_ROPE_TYPES_NOT_SCALED = frozenset({"su", "longrope", "llama3"})
KV_CAPACITY_RULES = ("blis", "vllm")


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
    gpus: int = 1  # GPUs of one instance (one DP rank): tp x pp
    rule: str = "blis"

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
    # An explicit head_dim (or MLA's latent) sizes the cache without hidden / heads.
    if not (model.config_head_dim or model.is_mla) and model.hidden_dim % model.num_heads != 0:
        raise invalid(
            f"model {model.name!r}: hidden_size",
            model.hidden_dim,
            f"must be divisible by num_attention_heads={model.num_heads} for KV sizing",
        )
    kv_heads = model.effective_kv_heads
    # Fewer KV heads than ranks is accepted: vLLM replicates them, each GPU keeping one whole
    # head (kv_head_shards); BLIS's division by TP (blis_kv_bytes_per_token) ignores that.
    if kv_heads >= tp and kv_heads % tp != 0:
        raise invalid("tp", tp, f"must divide num_key_value_heads={kv_heads} of {model.name!r}")
    if not (model.bytes_per_param > 0 and math.isfinite(model.bytes_per_param)):
        raise invalid(
            f"model {model.name!r}: bytes_per_param", model.bytes_per_param, "must be > 0"
        )


def _head_dim(model: ModelConfig) -> int:
    return model.config_head_dim or model.hidden_dim // model.num_heads


def mla_kv_bytes_per_token(model: ModelConfig) -> float:
    """MLA caches one latent of kv_lora_rank plus the rotary key of qk_rope_head_dim per token
    and layer, shared by every head (so every TP GPU keeps all of it)."""
    return float(model.num_layers * (model.kv_lora_rank + model.qk_rope_head_dim)) * (
        model.kv_bytes_per_element
    )


def kv_head_shards(model: ModelConfig, tp: int) -> int:
    """Into how many distinct shards TP splits the KV cache: TP, or the KV-head count when
    there are fewer KV heads than GPUs (vLLM replicates each head on tp / kv_heads GPUs, so
    every GPU holds one whole head), or 1 for MLA (the latent is on every GPU)."""
    if model.is_mla:
        return 1
    return min(tp, model.effective_kv_heads)


def _model_kv_bytes_per_token(model: ModelConfig) -> float:
    """KV-cache bytes of one token over the whole model (every layer, every KV head once)."""
    if model.is_mla:
        return mla_kv_bytes_per_token(model)
    return (
        2.0
        * model.num_layers
        * _head_dim(model)
        * model.effective_kv_heads
        * model.kv_bytes_per_element
    )


def kv_bytes_per_token(model: ModelConfig, tp: int = 1, pp: int = 1) -> float:
    """KV-cache bytes one token occupies on one GPU, as vLLM stores it:
    layers·2·head_dim·kv_heads·dtype / min(TP, kv_heads) / PP (with fewer KV heads than TP
    GPUs each GPU keeps one whole head; MLA: the latent, on every TP GPU, / PP).

    head_dim is the config's when given. The element is the compute dtype (vLLM stores KV at
    compute precision), one byte with an FP8 cache; never the quantised weight width.
    """
    _check_heads(model, tp)
    return _model_kv_bytes_per_token(model) / (kv_head_shards(model, tp) * pp)


def blis_kv_bytes_per_token(model: ModelConfig, tp: int = 1, pp: int = 1) -> float:
    """BLIS's KVBytesPerToken (SPEC-blis-current §8.4), which the `blis` capacity rule keeps
    for parity: the whole model's KV / TP / PP even when there are fewer KV heads than TP GPUs
    (it then undercounts what each GPU holds); MLA's latent is not divided by TP."""
    _check_heads(model, tp)
    if model.is_mla:
        return mla_kv_bytes_per_token(model) / pp
    return _model_kv_bytes_per_token(model) / (tp * pp)


def _attention_params(model: ModelConfig) -> int:
    hidden = model.hidden_dim
    if model.is_mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        heads = model.num_heads
        if model.q_lora_rank > 0:
            q = hidden * model.q_lora_rank + model.q_lora_rank * heads * qk
        else:
            q = hidden * heads * qk
        kv = hidden * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank * heads * (
            model.qk_nope_head_dim + model.v_head_dim
        )
        return q + kv + heads * model.v_head_dim * hidden
    head_dim = _head_dim(model)
    q_dim = model.num_heads * head_dim
    kv_dim = model.effective_kv_heads * head_dim
    return hidden * (q_dim + 2 * kv_dim) + q_dim * hidden


def model_param_breakdown(model: ModelConfig) -> dict[str, int]:
    """Parameters by part (docs/behaviour.md §2.5 step 4, with the config's facts): embeddings,
    attention, dense MLPs, routed experts, shared experts, router, norms, LM head."""
    hidden, layers = model.hidden_dim, model.num_layers
    parts = {
        "embeddings": model.vocab_size * hidden,
        "attention": layers * _attention_params(model),
        "dense_mlp": 0,
        "experts": 0,
        "shared_experts": 0,
        "router": 0,
        "norms": layers * _norm_params_per_layer(model) + hidden,
        "lm_head": 0 if model.tie_word_embeddings else model.vocab_size * hidden,
    }
    if model.is_moe:
        expert_ffn = model.moe_expert_ffn_dim or model.intermediate_dim
        moe_layers = model.moe_layer_count
        parts["experts"] = moe_layers * 3 * hidden * expert_ffn * model.num_local_experts
        parts["shared_experts"] = moe_layers * 3 * hidden * model.shared_ffn_dim
        parts["router"] = moe_layers * model.num_local_experts * hidden
        parts["dense_mlp"] = (
            (layers - moe_layers) * 3 * hidden * (model.dense_ffn_dim or model.intermediate_dim)
        )
    else:
        parts["dense_mlp"] = layers * 3 * hidden * model.intermediate_dim
    return parts


def _norm_params_per_layer(model: ModelConfig) -> int:
    """RMSNorm weights of one layer: two of hidden (before attention and MLP), four for
    Gemma-2/3, plus Gemma-3's query and key norms of head_dim each."""
    norms = (4 if model.model_type in _FOUR_NORM_MODEL_TYPES else 2) * model.hidden_dim
    if model.model_type in _QK_NORM_MODEL_TYPES and not model.is_mla:
        norms += 2 * _head_dim(model)
    return norms


def has_gated_mlp(model: ModelConfig) -> bool:
    """Whether the MLP is the three-matrix gated one (gate, up, down) the weight formula counts:
    a SwiGLU-family activation (or none written), or a GELU in a Gemma config (GeGLU)."""
    act = model.hidden_act
    if act in SWIGLU_ACTIVATIONS:
        return True
    return act in GELU_ACTIVATIONS and model.model_type in GATED_GELU_MODEL_TYPES


def model_param_count(model: ModelConfig) -> int:
    """Parameter estimate of docs/behaviour.md §2.5 step 4 (3-matrix SwiGLU MLP, MoE counts every
    expert and only its MoE layers' experts)."""
    return sum(model_param_breakdown(model).values())


def model_weight_bytes(model: ModelConfig, expert_fraction: float = 1.0) -> int:
    """Weight bytes over all GPUs at the effective (possibly quantised) weight width; the
    routed experts at their own width when it differs (gpt-oss). `expert_fraction` keeps that
    share of the routed experts (one DP rank's, when experts are sharded across ranks)."""
    if not model.expert_weight_bytes_per_param and expert_fraction == 1.0:
        return int(float(model_param_count(model)) * model.effective_weight_bytes_per_param)
    parts = model_param_breakdown(model)
    experts = parts.pop("experts")
    return int(
        float(sum(parts.values())) * model.effective_weight_bytes_per_param
        + float(experts) * expert_fraction * model.expert_bytes_per_param
    )


def kv_capacity(
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    *,
    pp: int = 1,
    expert_fraction: float = 1.0,
    rule: str = "blis",
    instance_gpus: int | None = None,
) -> KVCapacity:
    """Full capacity calculation for one instance (one DP rank) of tp x pp GPUs; raises
    ConfigError when the model cannot be sized or fit. `expert_fraction` is the share of the
    routed experts the rank stores (1/dp when experts are sharded over dp ranks).
    `instance_gpus` (default tp x pp) is the whole instance's GPU count, dp ranks included:
    under the vllm rule a GPU working with others reserves what multi-GPU servers were
    measured to."""
    _check_heads(model, tp)
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise invalid("pp", pp, "must be an integer >= 1")
    if rule not in KV_CAPACITY_RULES:
        raise invalid("kv_capacity_rule", rule, "must be one of " + ", ".join(KV_CAPACITY_RULES))
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise invalid("block_size", block_size, "must be an integer > 0")
    util = gpu_memory_utilization
    if not (isinstance(util, int | float) and math.isfinite(util) and 0 < util <= 1):
        raise invalid("gpu_memory_utilization", util, "must be in (0, 1]")
    if not (gpu.memory_gib > 0 and math.isfinite(gpu.memory_gib)):
        raise invalid(f"GPU {gpu.name!r}: MemoryGiB", gpu.memory_gib, "must be > 0")
    where = f"model {model.name!r}"
    if not has_gated_mlp(model):
        raise invalid(
            f"{where}: hidden_act",
            model.hidden_act,
            "KV capacity auto-calculation supports only gated (three-matrix) MLPs: silu, "
            "swiglu, geglu (or unset), or gelu, gelu_pytorch_tanh, gelu_new, gelu_fast in a "
            f"Gemma config (model_type {', '.join(sorted(GATED_GELU_MODEL_TYPES))}); "
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
    gpus = tp * pp
    # Multiply by block size before truncating so fractional per-token bytes are not lost.
    if model.is_mla:  # the latent is replicated on every TP GPU; stages split the layers
        per_block = int(per_token / pp * block_size)
    elif rule == "vllm":  # fewer KV heads than TP GPUs: each keeps a whole head
        per_block = int(per_token / pp / kv_head_shards(model, tp) * block_size)
    else:  # BLIS's KVBytesPerToken (blis_kv_bytes_per_token), in BLIS's order of operations
        per_block = int(per_token / gpus * block_size)
    if per_block <= 0:
        raise invalid(f"{where}: KV bytes per block", per_block, "must be > 0")

    available_gib = gpu.memory_gib * util * gpus
    params = model_param_count(model)
    weight_gib = float(model_weight_bytes(model, expert_fraction)) / GIB_BYTES
    non_torch_gib = (NON_TORCH_TP1_GIB if gpus == 1 else NON_TORCH_TP_MULTI_GIB) * gpus
    if rule == "vllm":
        # vLLM's measured reserve; the part that is not the non-torch memory is counted as
        # activations (its profiled peak and CUDA graphs).
        alone = (instance_gpus or gpus) == 1
        reserved_gib = VLLM_RESERVED_ONE_GPU_GIB if alone else VLLM_RESERVED_PER_GPU_GIB * gpus
        activation_gib = reserved_gib - non_torch_gib
    else:
        activation_gib = ACTIVATION_MOE_GIB if model.is_moe else ACTIVATION_DENSE_GIB
    overhead_gib = weight_gib + activation_gib + non_torch_gib
    layout = f"{tp}" if pp == 1 else f"{tp} (x pp {pp})"
    if overhead_gib >= available_gib:
        raise ConfigError(
            f"tp: invalid value {layout}; {where} needs {overhead_gib:.2f} GiB "
            f"({weight_gib:.2f} weights + {activation_gib:.2f} activations + "
            f"{non_torch_gib:.2f} non-torch) but {gpus} x {gpu.name} offers "
            f"{available_gib:.2f} GiB ({gpu.memory_gib:g} GiB x {util:g} utilisation x {gpus}); "
            "use more GPUs per instance or a larger GPU"
        )
    allocatable_bytes = int((available_gib - overhead_gib) * GIB_BYTES)
    blocks = allocatable_bytes // (per_block * gpus if rule == "vllm" else per_block)
    if blocks <= 0:
        raise ConfigError(
            f"tp: invalid value {layout}; {where} on {gpu.name} leaves room for 0 KV blocks "
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
        gpus=gpus,
        rule=rule,
    )


def compute_kv_blocks(
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    *,
    pp: int = 1,
    expert_fraction: float = 1.0,
    rule: str = "blis",
    instance_gpus: int | None = None,
) -> int:
    """Number of KV blocks one instance (TP x PP GPUs) can hold (docs/behaviour.md §2.5)."""
    return kv_capacity(
        model,
        gpu,
        tp,
        block_size,
        gpu_memory_utilization,
        pp=pp,
        expert_fraction=expert_fraction,
        rule=rule,
        instance_gpus=instance_gpus,
    ).blocks


def derive_max_model_len(model: ModelConfig, total_blocks: int, block_size: int) -> int:
    """Context limit: max_position_embeddings (times the rope factor where it applies), capped
    at what the KV cache can hold. 0 when the config gives no max_position_embeddings.
    """
    own = model_context_limit(model)
    return min(own, total_blocks * block_size) if own else 0


def model_context_limit(model: ModelConfig) -> int:
    """The model's own context limit: max_position_embeddings, times the rope factor where it
    applies (0 when the config gives no max_position_embeddings)."""
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
    return max_len
