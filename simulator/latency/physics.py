"""`physics`: a first-principles step-time model with a few calibratable efficiencies.

One engine step is one forward pass of a mixed batch (prefill chunks and decode tokens
together) on each of the `tp` GPUs of the instance. Per GPU it costs

    step = per-step overhead (+ single-process overhead when tp == 1)
         + batch × per-sequence overhead + layers × per-layer overhead
         + all-reduces × (2(tp − 1) × all-reduce step latency
                          + all-reduce bytes / (link bandwidth × link eff.))
         + max(weight bytes / (peak bandwidth × bandwidth eff.),
               prefill GEMM FLOPs / (peak × prefill eff.)
               + decode GEMM FLOPs / (peak × decode eff.))
         + max(KV bytes / (peak bandwidth × KV bandwidth eff.),
               prefill attention FLOPs / (peak × prefill eff.)
               + decode attention FLOPs / (peak × decode eff.))

A roofline per kernel class: the GEMMs and the attention are separate kernels run one after
the other, so the KV stream does not hide under a prefill chunk's GEMMs (docs/latency-models.md).

Bytes are the weights streamed once per step (attention, all three SwiGLU matrices, the MoE
experts the step's tokens actually touch, the router, the LM head, the embedding rows looked
up) plus the KV cache read and written. FLOPs are the GEMMs of the tokens computed plus causal
attention over their context plus one LM-head row per sequence. Every GEMM also pays a fixed
cost worth `gemm_fixed_rows` rows (tiles are 128 rows tall, so a GEMM's last tile is partly
empty, and each kernel fills and drains the GPU): that is why an MoE step, which runs one small
GEMM per touched expert, computes less efficiently than a dense one. Every term is in
`PhysicsTerms` at *peak* rates; `PhysicsCoefficients` turns them into time. Because the
terms do not depend on the coefficients, calibration records the terms of every step once and
re-prices them for any coefficients without re-simulating (see simulator/calibrate.py).

Once per request: `request_overhead_us` (HTTP, tokenisation) before it reaches the engine; then,
if a step is running, the rest of it and the `output_lag_steps` steps already planned (the
instance charges it: vLLM V1's async scheduler plans step N+1 while step N runs, so a request
reaching the engine during N misses N+1).

The shape follows the config's facts (docs/latency-models.md): its head_dim, MLA's latent
cache and attention, dense layers and shared experts inside an MoE stack, windowed attention,
per-module weight widths. The layout may add pipeline stages, expert all-to-alls across DP
ranks and TP groups spanning nodes (docs/parallelism.md): a pipelined step is priced stage by
stage and micro-batch by micro-batch (`pipeline_step_s`); the rest are extra terms that are 0
for TP inside one node.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from simulator.catalog.precision import (
    describe_precision,
    gemm_precision,
    gemm_precisions,
    precision_tflops,
)
from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import ConfigError, excerpt, invalid, is_finite_positive
from simulator.latency.base import StepBatch, StepTimeModel
from simulator.latency.parallel import Links, Parallelism, links_for, stage_layer_ranges
from simulator.latency.roofline import validate_roofline_inputs

# A SwiGLU MLP has three matrices: gate and up (d -> d_ff) and down (d_ff -> d).
SWIGLU_MATRICES = 3
# FLOPs of one multiply-accumulate.
FLOPS_PER_MAC = 2
# K and V.
KV_TENSORS = 2
# Tensor parallelism needs one all-reduce after attention's output projection and one after
# the MLP's down projection (Megatron-style sharding) in every layer (ModelShape.allreduces
# counts them, without the MoE one when an all-to-all returns the experts' outputs instead).
ALLREDUCES_PER_LAYER = 2

# Version 2: the step is priced as a roofline per kernel class (GEMMs, attention). A version-1
# file was fitted under one roofline over the whole step; it still loads, and the run's
# provenance says to refit it. Version 3: a GEMM's stream and arithmetic meet in a p-norm
# (`gemm_ridge_exponent`); a file of an older version without that key was fitted with the
# plain maximum, so it reads as exponent 0 and keeps meaning what it meant.
COEFFICIENTS_FILE_VERSION = 3
SINGLE_ROOFLINE_BEFORE_VERSION = 2
SHARP_RIDGE_BEFORE_VERSION = 3
_DATA = Path(__file__).resolve().parent.parent / "catalog" / "data" / "physics.yaml"


@dataclass(frozen=True)
class PhysicsCoefficients:
    """The efficiencies and overheads that turn peak-rate terms into time.

    Defaults are public hardware facts and common measurements, not fits (see
    docs/latency-models.md); `calibrate` replaces them with values fitted to real runs."""

    # Sustained / datasheet HBM bandwidth for large streaming reads (H100 ~0.8 in STREAM-like
    # copies; BLIS's roofline experiment H1 measured 0.82).
    bandwidth_efficiency: float = 0.80
    # The KV cache streams like the weights: vLLM's FlashAttention layout keeps each 16-token
    # block's K (and V) of one layer contiguous, 16 x kv_heads x head_dim x 2 B per GPU (4 KiB
    # and up; 128 KiB for Llama-2-7B), runs long enough for HBM to stream them at full rate.
    kv_bandwidth_efficiency: float = 0.80
    # Large BF16 GEMMs reach ~60-70% of the dense tensor-core peak on Hopper.
    prefill_compute_efficiency: float = 0.60
    # The rows of a decode batch's GEMMs compute as efficiently as a prompt's: the waste of a
    # few-row GEMM (a mostly empty 128-row tile) is `gemm_fixed_rows`, charged per GEMM, so a
    # lower efficiency here would count it twice. Decode batches of moderate load are
    # memory-bound whatever this is; large ones (vLLM 0.23 at ~250 sequences, the overloaded
    # 0.15.1 runs at 128) are where it shows (docs/accuracy.md).
    decode_compute_efficiency: float = 0.60
    # NCCL / custom all-reduce reaches ~70% of the per-direction link bandwidth.
    interconnect_efficiency: float = 0.70
    # Latency of one step of an all-reduce on NVLink (launch + synchronisation), µs. A ring
    # all-reduce over tp GPUs takes 2(tp - 1) steps (reduce-scatter, then all-gather), the
    # same count the bytes term uses, so one all-reduce costs 2(tp - 1) x this. A small
    # all-reduce on 2 H100s takes ~6 µs (nccl-tests with CUDA graphs, NVIDIA/nccl#1259):
    # 3 µs a step; 18 µs on 4 GPUs.
    allreduce_latency_us: float = 3.0
    # Launch gaps and small kernels (norms, rotary, residual adds) per layer, µs.
    per_layer_overhead_us: float = 10.0
    # Fixed time per step beyond the streams (sampling, the host-device sync, launches), µs.
    # From a public measurement: Llama-3.1-8B on one H100 under vLLM V1 decodes alone at
    # 6.48 ms per token, of which the weights (15.0 GB at 0.8 x 3.35 TB/s), the layers and
    # the KV take 5.94 ms (docs/latency-models.md).
    per_step_overhead_us: float = 500.0
    # Exposed time per scheduled sequence per step (sampling, logits and input rows), µs. The
    # async scheduler runs the scheduler's per-request CPU work in the GPU's shadow; the same
    # public sweep bounds the whole per-sequence cost at about 22 µs.
    per_sequence_overhead_us: float = 5.0
    # Extra CPU work per step when tp == 1, µs (vLLM V1 then runs the model runner inside the
    # engine-core process). Default 0 and not fitted: the measured Llama-2-7B TP1 runs, replayed
    # with their true output lengths, keep less fixed time per step than the TP > 1 models
    # (docs/accuracy.md); the term stays for coefficient files that set it.
    single_process_overhead_us: float = 0.0
    # Once per request before it reaches the engine (HTTP, tokenisation), µs.
    request_overhead_us: float = 3000.0
    # Fixed cost of every GEMM in rows: half of Hopper's 128-row output tile.
    gemm_fixed_rows: float = 64.0
    # vLLM V1's async scheduling (the default since vllm#27614) plans step N+1 while step N runs,
    # so a request reaching the engine during step N misses N+1: it waits for the rest of N and
    # all of N+1, and joins the plan made when N+1 ends. A whole number: the planned steps a
    # request reaching the engine mid-step misses (0: it joins the next one).
    output_lag_steps: float = 1.0
    # Latency of one collective step that crosses the scale-out network (a ring step of a TP
    # all-reduce spanning nodes, an expert all-to-all or a pipeline hand-off between nodes), µs.
    # An assumption, not a fit: an InfiniBand/RoCE send costs a few µs on the wire and NCCL's
    # network protocol several more; NVLink steps cost allreduce_latency_us.
    network_latency_us: float = 10.0
    # How sharply a GEMM turns from streaming its weights to computing: its time is the p-norm
    # of the two, (stream^p + arithmetic^p)^(1/p), not their maximum. A GEMM near the ridge
    # (a decode batch of a few hundred rows on an H100) cannot keep HBM and the tensor cores
    # both busy: with p = 3 it reaches 79 % of the roofline where the two times are equal,
    # 96 % where one is twice the other. 0 = the plain maximum (the sharp roofline); any
    # number >= 1 else, not fitted (docs/latency-models.md).
    gemm_ridge_exponent: float = 3.0

    def check(self, where: str = "physics coefficients") -> PhysicsCoefficients:
        def at_least_zero(value: object) -> bool:
            return (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0
            )

        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("efficiency"):
                if not (is_finite_positive(value) and value <= 1.0):
                    raise invalid(f"{where}: {f.name}", value, "must be a number in (0, 1]")
            elif f.name == "gemm_fixed_rows" and not (is_finite_positive(value) or value == 0):
                raise invalid(f"{where}: {f.name}", value, "must be a number >= 0")
            elif f.name == "gemm_ridge_exponent" and not (
                at_least_zero(value) and (value == 0 or value >= 1)
            ):
                raise invalid(
                    f"{where}: {f.name}",
                    value,
                    "must be 0 (the plain maximum) or a number >= 1 (the p-norm's exponent)",
                )
            elif f.name == "output_lag_steps" and not (
                at_least_zero(value) and value == int(value)
            ):
                raise invalid(
                    f"{where}: {f.name}",
                    value,
                    "must be a whole number of steps >= 0 (the planned steps a request "
                    "reaching the engine mid-step misses)",
                )
            elif not at_least_zero(value):
                raise invalid(f"{where}: {f.name}", value, "must be a number >= 0 (µs)")
        return self


COEFFICIENT_NAMES = tuple(f.name for f in fields(PhysicsCoefficients))


class PhysicsTerms(NamedTuple):
    """One step's work per GPU at peak rates (seconds), plus the counts overheads scale with."""

    memory_s: float  # weight (and embedding-row) bytes / peak bandwidth
    # GEMM FLOPs / peak FLOP rate, each part at its precision's rate (gpt-oss on B200: the
    # MXFP4 experts at the FP4 rate, the rest at the BF16 rate; one rate for other models).
    prefill_compute_s: float  # prefill tokens' GEMM FLOPs / peak FLOP rate
    decode_compute_s: float  # decode tokens' GEMM FLOPs / peak FLOP rate
    allreduce_transfer_s: float  # all-reduce bytes on the link / link bandwidth
    collectives: int  # collective latency steps on the scale-up link (ring steps, all-to-alls)
    layers: int
    sequences: int  # requests that got tokens this step
    weight_row_compute_s: float  # FLOPs of one row through every weight matrix / peak
    kv_memory_s: float  # KV cache bytes read and written / peak bandwidth
    single_process: int  # 1 when tp == 1 (scheduler and model runner in one process)
    # Expert dispatch and combine bytes (DP attention with expert parallelism) on the slower of
    # the two links they use / its bandwidth; 0 without them.
    alltoall_transfer_s: float = 0.0
    network_steps: int = 0  # collective latency steps that cross the scale-out network
    # Attention FLOPs (score and value products over the context; MLA's up-projection of the
    # cached latents) / peak FLOP rate: they run in the attention kernels, beside the KV reads.
    prefill_attention_s: float = 0.0
    decode_attention_s: float = 0.0


def _communication_s(terms: Sequence[Any], c: PhysicsCoefficients) -> Any:
    transfer_s, collectives, alltoall_s, network_steps = (
        terms[3],
        terms[4],
        terms[10],
        terms[11],
    )
    return (
        collectives * c.allreduce_latency_us * 1e-6 + transfer_s / c.interconnect_efficiency
    ) + (alltoall_s / c.interconnect_efficiency + network_steps * c.network_latency_us * 1e-6)


def ridge(
    stream_s: Any, arithmetic_s: Any, exponent: float, maximum: Callable[[Any, Any], Any] = max
) -> Any:
    """A kernel's time from its memory stream's and its arithmetic's: their p-norm
    (`PhysicsCoefficients.gemm_ridge_exponent`), or their maximum when `exponent` is 0.
    Element-wise on arrays with `maximum` = numpy.maximum."""
    if exponent == 0:
        return maximum(stream_s, arithmetic_s)
    return (stream_s**exponent + arithmetic_s**exponent) ** (1.0 / exponent)


def _gpu_s(terms: Sequence[Any], c: PhysicsCoefficients, maximum: Callable[[Any, Any], Any]) -> Any:
    """A roofline per kernel class, not per step: the GEMMs stream the weights while they
    compute, the attention kernels stream the KV cache while they compute, and the two run one
    after the other, so neither stream hides under the other's arithmetic."""
    memory_s, prefill_s, decode_s, row_s, kv_s = terms[0], terms[1], terms[2], terms[7], terms[8]
    prefill_attention_s, decode_attention_s = terms[12], terms[13]
    gemm_s = ridge(
        memory_s / c.bandwidth_efficiency,
        (prefill_s + c.gemm_fixed_rows * row_s) / c.prefill_compute_efficiency
        + decode_s / c.decode_compute_efficiency,
        c.gemm_ridge_exponent,
        maximum,
    )
    attention_s = maximum(
        kv_s / c.kv_bandwidth_efficiency,
        prefill_attention_s / c.prefill_compute_efficiency
        + decode_attention_s / c.decode_compute_efficiency,
    )
    return gemm_s + attention_s


def price_terms(
    terms: PhysicsTerms | Sequence[Any],
    c: PhysicsCoefficients,
    maximum: Callable[[Any, Any], Any] = max,
) -> Any:
    """Step time in seconds. Works element-wise on arrays when `maximum` is numpy.maximum."""
    layers, sequences, single_process = terms[5], terms[6], terms[9]
    gpu_s = _gpu_s(terms, c, maximum)
    communication_s = _communication_s(terms, c)
    overhead_s = (
        c.per_step_overhead_us
        + single_process * c.single_process_overhead_us
        + layers * c.per_layer_overhead_us
        + sequences * c.per_sequence_overhead_us
    ) * 1e-6
    return overhead_s + communication_s + gpu_s


def request_delay_s(c: PhysicsCoefficients) -> float:
    """Once per request: the client path (HTTP, tokenisation), charged before the request
    reaches the engine. The scheduling lag that follows (the rest of the step in flight and the
    `output_lag_steps` planned after it, `StepTimeModel.scheduling_lag_steps`) is charged by
    the instance, which knows the steps. Both delay TTFT and E2E alike, not ITL."""
    return c.request_overhead_us * 1e-6


@dataclass(frozen=True)
class ModelShape:
    """Per-GPU constants of the layers one GPU runs (all of them, or one pipeline stage's):
    bytes, FLOPs and counts under the instance's parallel layout."""

    layers: int
    attention_weight_bytes: float  # all layers, per GPU
    expert_weight_bytes: float  # one routed expert of every MoE layer (a dense model: its MLP)
    router_weight_bytes: float  # MoE gate, all layers, per GPU
    lm_head_bytes: float  # vocab × hidden, per GPU (vocab-parallel); last stage only
    embedding_row_bytes: float  # one token's embedding row, per GPU; first stage only
    kv_bytes_per_token: float  # K and V (MLA: the latent) of one token, all layers
    linear_flops_per_token: float  # attention projections + active experts + router, per GPU
    lm_head_flops_per_sequence: float  # logits of one position, per GPU
    attention_flops_per_pair: float  # QK^T and AV for one (query, key) pair, all layers
    allreduce_bytes_per_token: float  # one all-reduce's payload per token (hidden × bytes)
    num_experts: int  # 0 for dense
    experts_per_token: int
    # Beyond a uniform decoder; each is 0 (or equal to its plain counterpart) for one.
    dense_mlp_weight_bytes: float = 0.0  # the dense-MLP layers of an MoE model
    shared_expert_weight_bytes: float = 0.0  # shared experts of every MoE layer
    # The windowed-attention layers' share of the two above: a window saves these on every
    # key it hides (priced as savings, so a window that hides nothing changes no bit).
    window_kv_bytes_per_token: float = 0.0
    window_attention_flops_per_pair: float = 0.0
    decode_attention_flops_per_pair: float = 0.0  # MLA decodes against the latent directly
    context_flops_per_token: float = 0.0  # MLA prefill: up-projecting each cached latent
    allreduces: int = 0  # TP all-reduces per forward pass
    moe_layers: int = 0
    mixed_weight_widths: bool = False  # experts stored at another width (gpt-oss MXFP4)
    weight_bytes_per_param: float = 2.0
    expert_bytes_per_param: float = 2.0
    # The routed experts' share of linear_flops_per_token (0 for a dense model): priced at the
    # experts' own rate when it differs from the rest's (gpt-oss's MXFP4 experts on B200).
    expert_flops_per_token: float = 0.0


def _mla_attention_params(model: ModelConfig) -> tuple[float, float]:
    """(head-sharded, replicated) parameters of one MLA layer. vLLM splits the per-head up
    projections and the output across TP GPUs and replicates the two down projections."""
    d, heads = float(model.hidden_dim), model.num_heads
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    latent = model.kv_lora_rank + model.qk_rope_head_dim
    if model.q_lora_rank > 0:
        q_down, q_up = d * model.q_lora_rank, float(model.q_lora_rank) * heads * qk
    else:
        q_down, q_up = 0.0, d * heads * qk
    kv_up = float(model.kv_lora_rank) * heads * (model.qk_nope_head_dim + model.v_head_dim)
    out = float(heads) * model.v_head_dim * d
    return q_up + kv_up + out, q_down + d * latent


def model_shape(
    model: ModelConfig,
    tp: int,
    parallelism: Parallelism | None = None,
    layer_range: range | None = None,
    first_stage: bool = True,
    last_stage: bool = True,
) -> ModelShape:
    """Count bytes and FLOPs from the architecture; see the module docstring for the terms.
    `layer_range` (default: every layer) and the stage flags select one pipeline stage."""
    layout = parallelism or Parallelism(tp)
    indices = range(model.num_layers) if layer_range is None else layer_range
    layers = len(indices)
    d = float(model.hidden_dim)
    heads = model.num_heads
    head_dim = float(model.config_head_dim or d / heads)
    kv_heads = model.effective_kv_heads
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    d_ff = float(model.intermediate_dim) if model.intermediate_dim > 0 else 4.0 * d
    moe = model.is_moe
    d_expert = float(model.moe_expert_ffn_dim) if moe and model.moe_expert_ffn_dim > 0 else d_ff
    experts = model.num_local_experts if moe else 0
    k = model.num_experts_per_tok if moe else 1
    act_bytes = float(model.bytes_per_param)
    kv_bytes = float(model.kv_bytes_per_element)
    w_bytes = float(model.effective_weight_bytes_per_param)
    e_bytes = float(model.expert_bytes_per_param)
    # Q, K, V and output projections.
    attention_params = d * (q_dim + 2 * kv_dim) + q_dim * d
    replicated_params = 0.0
    if model.is_mla:
        attention_params, replicated_params = _mla_attention_params(model)
    mlp_params = SWIGLU_MATRICES * d * d_expert
    router_params = d * experts
    shared_params = SWIGLU_MATRICES * d * model.shared_ffn_dim if moe else 0.0
    dense_params = SWIGLU_MATRICES * d * (model.dense_ffn_dim or d_ff)
    # The "expert" layers: the MoE layers of an MoE model, every layer of a dense one.
    dense_indices = set(model.dense_layer_indices)
    expert_layers = sum(1 for i in indices if i not in dense_indices) if moe else layers
    dense_layers = layers - expert_layers if moe else 0
    windowed = set(model.windowed_layer_indices)
    window_layers = sum(1 for i in indices if i in windowed) if windowed else 0
    expert_shards = layout.expert_shards if moe else tp
    # KV heads are split across GPUs; with fewer KV heads than GPUs each GPU keeps a replica.
    kv_heads_per_gpu = max(kv_heads / tp, 1.0)
    if model.is_mla:  # one latent per token, replicated on every GPU of the TP group
        kv_per_layer = float(model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes
        kv_full = layers * kv_per_layer
        kv_window = window_layers * kv_per_layer
        pair = (
            FLOPS_PER_MAC
            * heads
            * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
        )
        decode_pair = FLOPS_PER_MAC * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
        attention_pair = layers * pair / tp
        decode_attention_pair = layers * decode_pair / tp
        window_pair = window_layers * pair / tp
        context_flops = (
            FLOPS_PER_MAC
            * layers
            * model.kv_lora_rank
            * heads
            * (model.qk_nope_head_dim + model.v_head_dim)
            / tp
        )
    else:
        kv_full = KV_TENSORS * layers * kv_heads_per_gpu * head_dim * kv_bytes
        kv_window = KV_TENSORS * window_layers * kv_heads_per_gpu * head_dim * kv_bytes
        # QK^T and AV each take head_dim MACs per head per (query, key) pair.
        attention_pair = 2 * FLOPS_PER_MAC * layers * heads * head_dim / tp
        decode_attention_pair = attention_pair
        window_pair = 2 * FLOPS_PER_MAC * window_layers * heads * head_dim / tp
        context_flops = 0.0
    expert_group = attention_params + k * mlp_params + router_params + shared_params
    dense_group = attention_params + dense_params
    # Expert outputs are combined by the TP all-reduce unless experts span DP ranks (then an
    # all-to-all returns them).
    # Sliced over the DP ranks too, a rank's outputs still need its TP all-reduce after the
    # ranks' exchange.
    moe_allreduces = (
        expert_layers if layout.ep_ranks == 1 or layout.experts_tensor_parallel_over_ranks else 0
    )
    return ModelShape(
        layers=layers,
        attention_weight_bytes=layers * attention_params * w_bytes / tp
        + layers * replicated_params * w_bytes,
        expert_weight_bytes=expert_layers
        * mlp_params
        * (e_bytes if moe else w_bytes)
        / expert_shards,
        router_weight_bytes=expert_layers * router_params * w_bytes,
        lm_head_bytes=model.vocab_size * d * w_bytes / tp if last_stage else 0.0,
        embedding_row_bytes=d * w_bytes if first_stage else 0.0,
        kv_bytes_per_token=kv_full,
        linear_flops_per_token=FLOPS_PER_MAC
        * (expert_layers * expert_group + dense_layers * dense_group)
        / tp
        + FLOPS_PER_MAC * layers * replicated_params,
        lm_head_flops_per_sequence=FLOPS_PER_MAC * model.vocab_size * d / tp if last_stage else 0.0,
        attention_flops_per_pair=attention_pair,
        allreduce_bytes_per_token=d * act_bytes,
        num_experts=experts,
        experts_per_token=k if moe else 0,
        dense_mlp_weight_bytes=dense_layers * dense_params * w_bytes / tp,
        shared_expert_weight_bytes=expert_layers * shared_params * w_bytes / tp,
        window_kv_bytes_per_token=kv_window,
        window_attention_flops_per_pair=window_pair,
        decode_attention_flops_per_pair=decode_attention_pair,
        context_flops_per_token=context_flops,
        allreduces=layers + (layers if not moe else dense_layers + moe_allreduces),
        moe_layers=expert_layers if moe else 0,
        mixed_weight_widths=moe and e_bytes != w_bytes,
        weight_bytes_per_param=w_bytes,
        expert_bytes_per_param=e_bytes if moe else w_bytes,
        expert_flops_per_token=FLOPS_PER_MAC * expert_layers * k * mlp_params / tp if moe else 0.0,
    )


def window_pairs(context_tokens: float, new_tokens: float, window: int, kind: str) -> float:
    """(query, key) pairs of a chunk of `new_tokens` after `context_tokens` in a layer whose
    attention sees `window` keys: the last `window` ("sliding") or those of the same
    `window`-token chunk ("chunked")."""
    s, n = int(context_tokens), int(new_tokens)
    if kind == "chunked":

        def upto(x: int) -> int:  # Σ over positions p < x of (p mod window) + 1
            whole, rest = divmod(x, window)
            return whole * window * (window + 1) // 2 + rest * (rest + 1) // 2

        return float(upto(s + n) - upto(s))
    # Query p sees min(p + 1, window) keys; positions s .. s + n - 1.
    lo, hi = s + 1, s + n
    if hi <= window:
        return float((lo + hi) * n // 2)
    if lo > window:
        return float(n * window)
    return float((lo + window) * (window - lo + 1) // 2 + (hi - window) * window)


def window_context_read_of(context_tokens: float, window: int, kind: str) -> float:
    """Cached keys a request attends in a windowed layer (those still inside its window)."""
    if kind == "chunked":
        return float(int(context_tokens) % window)
    return float(min(context_tokens, window))


def causal_pairs(context_tokens: int, new_tokens: int) -> int:
    """(query, key) pairs a chunk attends: every new token sees the context and the new
    tokens up to itself."""
    return new_tokens * context_tokens + new_tokens * (new_tokens + 1) // 2


@cache
def _hardware_table() -> dict[str, Any]:
    from simulator.input_files import bundled_yaml

    return bundled_yaml(_DATA.read_text(encoding="utf-8"))


def interconnect_gb_per_s(gpu: GPUSpec) -> float:
    """Per-direction GPU-to-GPU bandwidth (GB/s) from the bundled table; PCIe for unknown GPUs."""
    table = _hardware_table()["interconnect_gb_per_s"]
    return float(table.get(gpu.name, table["default"]))


@dataclass(frozen=True)
class CoefficientSource:
    """Where a physics model's coefficients come from, as every result reports it.

    `fit` is the calibration used ("" for the physical defaults or given coefficients),
    `fit_gpu` / `fit_vllm` what it was fitted on, and `covers_gpu` whether the run's GPU is
    the one the fit saw (a fit transfers to other GPUs as fractions of their peaks)."""

    kind: str  # "calibrated" | "transferred" | "physical defaults" | "given"
    fit_gpu: str = ""
    fit_vllm: str = ""
    fitted_on: str = ""
    covers_gpu: bool = False
    note: str = ""
    fit_models: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "calibrated":
            return f"fit for {self.fit_gpu}, vLLM {self.fit_vllm} ({self.fitted_on}){self.note}"
        if self.kind == "transferred":
            return (
                f"transferred from the {self.fit_gpu} fit, vLLM {self.fit_vllm} "
                f"({self.fitted_on}): efficiencies as fractions of this GPU's peaks, not "
                f"measured on it{self.note}"
            )
        return self.kind + self.note


# The GPU whose fits carry to GPUs without one of their own (docs/latency-models.md).
REFERENCE_GPU = "H100"


# A vLLM version as PEP 440 spells one (what `packaging` parses, which is not a dependency),
# optionally as a container image tag (`vllm/vllm-openai:v0.23.0`, as defaults.yaml records
# them). Only the release numbers choose a fit: a pre-release, post-release, dev build or local
# build (`0.23.0rc1`, `0.23.0+cu128`) runs that release's code paths.
_VERSION = re.compile(
    r"v?(?:\d+!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
    r"(?:-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?"
    r"(?:[-_.]?dev[-_.]?\d*)?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?",
    re.IGNORECASE,
)

VERSION_ALLOWED = (
    "must be a vLLM version such as 0.23.0, v0.23, 0.23.0rc1 or 0.23.0+cu128 (release "
    "numbers with optional pre/post/dev/local suffixes)"
)


# vLLM's first release (June 2023); a version before it names no vLLM.
FIRST_RELEASE = (0, 1)


def version_key(version: str, field: str = "latency.vllm_version") -> tuple[int, ...]:
    """The release numbers of a vLLM version, trailing zeros dropped (`0.23` and `0.23.0` are
    one release, as in PEP 440). An unparseable version, or one before vLLM's first release,
    is an error naming `field`: choosing a fit for it would be a guess."""
    tag = str(version).strip().rsplit(":", 1)[-1].strip()
    found = _VERSION.fullmatch(tag)
    if found is None:
        raise invalid(field, version, VERSION_ALLOWED)
    release = [int(p) for p in found.group("release").split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    if tuple(release) < FIRST_RELEASE:
        # No vLLM ever had it (a typo, `0.0.1`): any fit chosen for it would be a guess.
        raise invalid(field, version, "must be a vLLM release: 0.1.0 (vLLM's first) or later")
    return tuple(release)


def _minor(key: tuple[int, ...]) -> tuple[int, int]:
    return (key[0], key[1] if len(key) > 1 else 0)


def calibrations() -> dict[str, dict[str, dict[str, Any]]]:
    """Shipped fits: GPU -> vLLM version -> {coefficients: ..., fitted_on: ...}."""
    return _hardware_table().get("calibrated", {}) or {}


def choose_calibration(
    gpu_name: str, vllm_version: str | None
) -> tuple[str, str, dict[str, Any]] | None:
    """(fit GPU, fit vLLM version, entry) for a GPU and an optional vLLM version.

    The GPU's own fits, else the reference GPU's (transferred). Without a version the newest
    fit; with one, that release's fit, else the nearest fit of the same minor release (patch
    releases do not change the engine's step), else the nearest older one, else the oldest."""
    wanted = None if vllm_version is None else version_key(vllm_version)
    fits = calibrations()
    fit_gpu = gpu_name if gpu_name in fits else REFERENCE_GPU
    by_version = fits.get(fit_gpu)
    if not by_version:
        return None
    ordered = sorted(by_version, key=version_key)
    if wanted is None:
        chosen = ordered[-1]
    else:
        same_minor = [v for v in ordered if _minor(version_key(v)) == _minor(wanted)]
        candidates = same_minor or ordered
        older = [v for v in candidates if version_key(v) <= wanted]
        chosen = older[-1] if older else candidates[0]
    return fit_gpu, chosen, by_version[chosen]


def default_coefficients(
    gpu: GPUSpec, vllm_version: str | None = None
) -> tuple[PhysicsCoefficients, CoefficientSource]:
    """The shipped calibration for this GPU and vLLM version (newest when none is given), the
    reference GPU's transferred to it when it has none, else the physical defaults."""
    chosen = choose_calibration(gpu.name, vllm_version)
    if chosen is None:
        return PhysicsCoefficients(), CoefficientSource("physical defaults")
    fit_gpu, fit_vllm, entry = chosen
    where = f"physics.yaml calibrated.{fit_gpu}.{fit_vllm}"
    coefficients = coefficients_from_mapping(entry["coefficients"], where)
    note = ""
    if vllm_version is not None and version_key(vllm_version) != version_key(fit_vllm):
        # Which rule chose it: a release older than every fit gets the oldest, not a near one.
        if _minor(version_key(fit_vllm)) == _minor(version_key(vllm_version)):
            chose = "the same minor release's used"
        elif version_key(fit_vllm) < version_key(vllm_version):
            chose = "the nearest older one used"
        else:
            chose = "older than every fit, the oldest used"
        note = f"; no fit for vLLM {vllm_version}, {chose}"
        if _minor(version_key(fit_vllm)) != _minor(version_key(vllm_version)):
            # Another minor release's engine: said on stderr too, not only in the provenance
            # (blackbox refuses such a version; physics carries the fit over, a guess). A patch
            # release shares its minor's engine and is told in the provenance only.
            from simulator.deployment import warn_once

            warn_once(
                "no physics fit for vLLM %s (latency.vllm_version); the %s vLLM %s fit is used "
                "(%s; fits: %s)",
                vllm_version,
                fit_gpu,
                fit_vllm,
                "older than every fit" if "oldest" in chose else "the nearest older one",
                ", ".join(sorted(calibrations().get(fit_gpu, {}), key=version_key)),
            )
    kind = "calibrated" if fit_gpu == gpu.name else "transferred"
    if kind == "calibrated" and not _is_builtin_gpu(gpu):
        # A GPU file's entry under the fit's name but with other figures is another GPU: the
        # fit's efficiencies carry to it as to any other (its peaks price the steps).
        kind = "transferred"
        note += (
            f"; the GPU's figures ({gpu.source or 'as given'}) differ from the built-in {fit_gpu}"
        )
    source = CoefficientSource(
        kind,
        fit_gpu,
        fit_vllm,
        str(entry.get("fitted_on", "")),
        kind == "calibrated",
        note,
        tuple(m.lower() for m in entry.get("models", ())),
    )
    return coefficients, source


# The GPU figures physics prices a step from; memory and the roofline's MFU never reach it.
_PRICED_FIGURES = ("tflops_peak", "tflops_fp8", "tflops_fp8_dense", "tflops_fp4", "bw_peak_tbs")


def _is_builtin_gpu(gpu: GPUSpec) -> bool:
    """Whether `gpu` has the priced figures of the built-in GPU of its name."""
    from simulator.catalog.hardware import get_gpu

    try:
        builtin = get_gpu(gpu.name)
    except ConfigError:
        return False
    return all(getattr(builtin, f) == getattr(gpu, f) for f in _PRICED_FIGURES)


def coefficients_from_mapping(data: Mapping[str, Any], where: str) -> PhysicsCoefficients:
    """Strict: unknown names are errors; missing names keep the physical defaults."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: coefficients must be a mapping of name: number")
    # Keys of a user's file may be of any type (null, numbers): sort them as text.
    extra = sorted(set(data) - set(COEFFICIENT_NAMES), key=repr)
    if extra:
        raise ConfigError(
            f"{where}: unknown coefficient {excerpt(extra[0], 40)}; "
            f"valid: {', '.join(COEFFICIENT_NAMES)}"
        )
    for name, value in data.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**1023:
            raise invalid(f"{where}: {name}", value, "must be a number within float range")
    return replace(PhysicsCoefficients(), **dict(data)).check(where)


def load_coefficients_file(path: str | Path) -> PhysicsCoefficients:
    """Read a file written by `servesim calibrate` (or by hand): `coefficients: {name: value}`."""
    return read_coefficients_file(path)[0]


def read_coefficients_file(path: str | Path) -> tuple[PhysicsCoefficients, str]:
    """The file's coefficients and how a run names them: the file, with a warning when it was
    fitted before the per-kernel-class roofline (an explicit `version` below the current)."""
    from simulator.input_files import read_yaml_mapping

    data = read_yaml_mapping(path, "latency coefficients file")
    model = data.get("latency_model", PhysicsModel.name)
    if model != PhysicsModel.name:
        raise invalid(
            f"latency coefficients file {str(path)!r}: latency_model", model, "must be 'physics'"
        )
    if "coefficients" not in data:
        raise ConfigError(f"latency coefficients file {str(path)!r}: missing key 'coefficients'")
    mapping = data["coefficients"]
    version = data.get("version")
    # The versions calibrate has written (1 to the current); no key at all is a file written
    # by hand. Anything else was read as an older (-5, 0) or the current file (9, "abc").
    is_count = isinstance(version, int) and not isinstance(version, bool)
    if "version" in data and not (is_count and 1 <= version <= COEFFICIENTS_FILE_VERSION):
        raise invalid(
            f"latency coefficients file {str(path)!r}: version",
            version,
            f"must be an integer from 1 to {COEFFICIENTS_FILE_VERSION} (the versions "
            "servesim calibrate writes), or no version key for a file written by hand",
        )
    old_ridge = (
        is_count
        and version < SHARP_RIDGE_BEFORE_VERSION
        and isinstance(mapping, dict)
        and "gemm_ridge_exponent" not in mapping
    )
    if old_ridge:
        mapping = {**mapping, "gemm_ridge_exponent": 0.0}
    coefficients = coefficients_from_mapping(mapping, f"{str(path)!r} coefficients")
    note = f"file {str(path)!r}"
    if is_count and version < SINGLE_ROOFLINE_BEFORE_VERSION:
        note += (
            f"; written by an older calibrate (file version {version}) for the "
            "single-roofline step: refit with servesim calibrate"
        )
    elif old_ridge:
        note += (
            f"; written by an older calibrate (file version {version}) for the sharp GEMM "
            "roofline, read with gemm_ridge_exponent 0"
        )
    return coefficients, note


def coefficients_document(c: PhysicsCoefficients, **about: Any) -> dict[str, Any]:
    """The YAML document `load_coefficients_file` reads, with free-form provenance."""
    return {
        "version": COEFFICIENTS_FILE_VERSION,
        "latency_model": PhysicsModel.name,
        "coefficients": {k: float(v) for k, v in asdict(c).items()},
        **about,
    }


class _Work(NamedTuple):
    """One step's (or one micro-batch's) work, summed over its requests."""

    prefill_tokens: float
    prefill_sequences: float
    prefill_pairs: float  # (query, key) pairs of the prefill chunks in full-attention layers
    context_read: float  # cached tokens the requests attend (full-attention layers)
    decodes: float
    decode_pairs: float
    window_prefill_pairs: float  # the same in windowed-attention layers
    window_decode_pairs: float
    window_context_read: float
    prefill_context: float  # cached tokens the prefill chunks attend (MLA up-projects them)

    def share(self, parts: int) -> _Work:
        return _Work(*(value / parts for value in self)) if parts > 1 else self


@dataclass(frozen=True)
class _Stage:
    """The layers one GPU runs, with its collectives' cost per token at peak link rates."""

    shape: ModelShape
    allreduce_s_per_token: float
    alltoall_s_per_token: float
    collectives: int
    network_steps: int


class PhysicsModel(StepTimeModel):
    """First-principles step time with calibrated efficiencies; see the module docstring."""

    name = "physics"
    accepts_coeffs_file = True
    # Prices pipeline stages, expert all-to-alls and DP attention ranks (docs/parallelism.md).
    parallelism_dimensions = frozenset({"pp", "dp", "ep"})

    def __init__(
        self,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        coefficients: PhysicsCoefficients | None = None,
        vllm_version: str | None = None,
        given_from: str = "",
        parallelism: Parallelism | None = None,
        links: Links | None = None,
    ) -> None:
        validate_roofline_inputs(model, gpu, tp)
        layout = (parallelism or Parallelism(tp)).check(model)
        if layout.tp != tp:
            raise invalid("tp", tp, f"must equal the layout's tp {layout.tp}")
        if coefficients is None:
            coefficients, self.source = default_coefficients(gpu, vllm_version)
        else:
            self.source = CoefficientSource("given", note=f" ({given_from})" if given_from else "")
        self.coefficients = coefficients.check()
        self.model, self.gpu, self.tp, self.layout = model, gpu, tp, layout
        self.links = links or links_for(gpu)
        bytes_weight = model.effective_weight_bytes_per_param
        # The rate of every GEMM but the routed experts', and of the attention kernels; the
        # experts' own (the same but for mixed-precision weights: gpt-oss on B200, FP4).
        precisions = gemm_precisions(model, gpu)
        self.peak_flops_per_s = precision_tflops(precisions.rest, gpu) * 1e12
        self.expert_peak_flops_per_s = precision_tflops(precisions.experts, gpu) * 1e12
        self.mixed_rates = precisions.mixed
        self.weight_bytes_per_param = bytes_weight
        self.peak_bytes_per_s = gpu.bw_peak_tbs * 1e12
        ranges = stage_layer_ranges(model.num_layers, layout.pp)
        self.stages = [
            self._stage(
                model_shape(
                    model,
                    tp,
                    layout,
                    None if layout.pp == 1 else ranges[i],
                    first_stage=i == 0,
                    last_stage=i == layout.pp - 1,
                ),
                i,
            )
            for i in range(layout.pp)
        ]
        self.shape = self.stages[0].shape if layout.pp == 1 else model_shape(model, tp, layout)
        self.allreduce_s_per_token = self.stages[0].allreduce_s_per_token
        self.collectives = self.stages[0].collectives
        # vLLM hands the hidden states and the residual stream to the next stage.
        self.hand_off_bytes_per_token = 2 * float(model.hidden_dim) * model.bytes_per_param
        self.queueing_us = int(request_delay_s(self.coefficients) * 1e6)

    def _stage(self, shape: ModelShape, stage: int = 0) -> _Stage:
        tp, layout, links = self.tp, self.layout, self.links
        # A TP group wider than one scale-up domain all-reduces over the network: every ring
        # step waits for its slowest (network) hop. NCCL runs one ring per network card, so
        # the domain's cards carry the rings side by side (each the 1/cards of the payload
        # it owns): domain x card bandwidth, unless the scale-up link is slower still.
        tp_over_network = links.crosses(0, tp - 1)
        link_gb_per_s = links.scale_up_gb_per_s
        if tp_over_network:
            link_gb_per_s = min(link_gb_per_s, links.scale_out_gb_per_s * links.domain_gpus)
        link_bytes_per_s = link_gb_per_s * 1e9
        # Ring all-reduce: each GPU sends and receives 2(tp-1)/tp of the payload, in 2(tp - 1)
        # latency steps.
        allreduce_s_per_token = (
            shape.allreduces
            * 2
            * (tp - 1)
            / tp
            * shape.allreduce_bytes_per_token
            / link_bytes_per_s
        )
        ring_steps = shape.allreduces * 2 * (tp - 1)
        alltoall_s_per_token, alltoall_steps, alltoall_network = 0.0, 0, False
        if layout.ep_ranks > 1 and shape.moe_layers:
            # The group's GPUs as vLLM places them (rank by rank, then stage): with pipeline
            # stages a stage's group is not consecutive GPUs.
            group = layout.expert_group_gpus(stage)
            if layout.experts_tensor_parallel_over_ranks:
                # Every GPU computes its expert slices for every rank's tokens: each GPU
                # exchanges with the GPUs at its TP position in the other dp - 1 ranks, the
                # ranks' hidden states all-gathered before each MoE layer and the partial
                # outputs reduce-scattered after it, d·B per token of its rank each way and
                # peer; the rank's TP all-reduce then completes them (`moe_allreduces`).
                exchanges = [group[t :: layout.tp] for t in range(layout.tp)]
                d_bytes = float(self.model.hidden_dim) * self.model.bytes_per_param
                per_token = shape.moe_layers * 2 * d_bytes
            else:
                # Each GPU dispatches its 1/tp share of the rank's tokens to the k experts'
                # GPUs and receives the results back (combine); (ep - 1)/ep of them live
                # elsewhere.
                exchanges = [group]
                dispatch = self._dispatch_bytes_per_element()
                per_token = (
                    shape.moe_layers
                    * shape.experts_per_token
                    * float(self.model.hidden_dim)
                    * (dispatch + self.model.bytes_per_param)
                    / tp
                    / layout.ep
                )
            # Each member's two links carry their shares at once; the slowest member sets
            # the time.
            alltoall_s_per_token = links.exchange_s(exchanges, per_token)
            alltoall_network = any(links.crosses_domains(g) for g in exchanges)
            alltoall_steps = 2 * shape.moe_layers
        collectives = (0 if tp_over_network else ring_steps) + (
            0 if alltoall_network else alltoall_steps
        )
        network_steps = (ring_steps if tp_over_network else 0) + (
            alltoall_steps if alltoall_network else 0
        )
        return _Stage(
            shape, allreduce_s_per_token, alltoall_s_per_token, collectives, network_steps
        )

    def _dispatch_bytes_per_element(self) -> float:
        """Tokens travel to their experts in FP8 when the expert GEMMs run in FP8 (DeepEP's
        FP8 dispatch); results come back at activation width."""
        return 1.0 if gemm_precision(self.model, self.gpu) == "fp8" else self.model.bytes_per_param

    @classmethod
    def from_deployment(
        cls,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        vllm_version: str | None = None,
        coeffs_file: str | Path | None = None,
        parallelism: Parallelism | None = None,
    ) -> PhysicsModel:
        if alpha is not None or beta is not None:
            raise invalid(
                "alpha_coeffs/beta_coeffs",
                {"alpha_coeffs": alpha, "beta_coeffs": beta},
                "latency model 'physics' takes a coefficients file (latency.coeffs_file / "
                "--latency-coeffs), not alpha/beta",
            )
        coefficients, given_from = None, ""
        if coeffs_file is not None:
            coefficients, given_from = read_coefficients_file(coeffs_file)
        return cls(
            model,
            gpu,
            tp,
            coefficients,
            vllm_version=vllm_version,
            given_from=given_from,
            parallelism=parallelism,
        )

    def expected_experts(self, step_tokens: float) -> float:
        """Distinct experts per layer that `step_tokens` uniformly routed tokens touch."""
        n, k = self.shape.num_experts, self.shape.experts_per_token
        if n == 0:
            return 1.0
        return n * (1.0 - ((n - k) / n) ** step_tokens)

    def work(self, batch: StepBatch) -> _Work:
        model = self.model
        window, kind = model.attention_window, model.window_kind
        windowed = bool(model.windowed_layer_indices) and window > 0
        prefill_pairs = prefill_tokens = context_read = prefill_context = 0
        window_prefill_pairs = window_context_read = 0.0
        for context, new in batch.prefill_chunks:
            prefill_pairs += causal_pairs(context, new)
            prefill_tokens += new
            context_read += context
            prefill_context += context
            if windowed:
                window_prefill_pairs += window_pairs(context, new, window, kind)
                window_context_read += window_context_read_of(context, window, kind)
        decodes = batch.decode_count
        # A decode token attends its whole context plus itself.
        decode_pairs = batch.decode_context_sum + decodes
        context_read += batch.decode_context_sum
        window_decode_pairs = 0.0
        if windowed and decodes:
            # Only the sum of the decoding requests' contexts is known. While their mean fits
            # in the window, every context is taken to (nothing hidden); beyond it, each sees
            # a full sliding window or, in chunks, half a chunk on average.
            mean_context = batch.decode_context_sum / decodes
            if mean_context < window - 1:
                window_decode_pairs = decode_pairs
                window_context_read += batch.decode_context_sum
            elif kind == "chunked":
                # From a full chunk (every context still in its first chunk) to half a chunk
                # on average over the next chunk's length, not at once: one more token of mean
                # context made a step 21 % cheaper (Llama-4-Scout, 256 decodes at 8,191).
                into_next = min(1.0, (mean_context - (window - 1)) / window)
                keys = window - into_next * (window - 1) / 2
                window_decode_pairs = decodes * keys
                window_context_read += decodes * (keys - 1)
            else:
                window_decode_pairs = decodes * window
                window_context_read += decodes * window
        return _Work(
            prefill_tokens,
            len(batch.prefill_chunks),
            prefill_pairs,
            context_read,
            decodes,
            decode_pairs,
            window_prefill_pairs,
            window_decode_pairs,
            window_context_read,
            prefill_context,
        )

    def _terms(
        self, stage: _Stage, work: _Work, sequences: float, single_process: int
    ) -> PhysicsTerms:
        shape = stage.shape
        tokens = work.prefill_tokens + work.decodes
        expert_bytes = shape.expert_weight_bytes * self.expected_experts(
            tokens * self.layout.ep_ranks
        )
        weight_bytes = (
            shape.attention_weight_bytes
            + shape.dense_mlp_weight_bytes
            + expert_bytes
            + shape.shared_expert_weight_bytes
            + shape.router_weight_bytes
            + shape.lm_head_bytes
        )
        # Windowed layers save what their window hides (0 while it hides nothing).
        kv_bytes = shape.kv_bytes_per_token * (
            work.context_read + tokens
        ) - shape.window_kv_bytes_per_token * (work.context_read - work.window_context_read)
        prefill_flops = (
            shape.linear_flops_per_token * work.prefill_tokens
            + shape.lm_head_flops_per_sequence * work.prefill_sequences
        )
        prefill_attention_flops = (
            shape.attention_flops_per_pair * work.prefill_pairs
            - shape.window_attention_flops_per_pair
            * (work.prefill_pairs - work.window_prefill_pairs)
            + shape.context_flops_per_token * work.prefill_context
        )
        decode_flops = (
            shape.linear_flops_per_token + shape.lm_head_flops_per_sequence
        ) * work.decodes
        decode_attention_flops = shape.decode_attention_flops_per_pair * work.decode_pairs - (
            shape.window_attention_flops_per_pair * (work.decode_pairs - work.window_decode_pairs)
        )
        if shape.mixed_weight_widths:
            params = (weight_bytes - expert_bytes) / shape.weight_bytes_per_param + (
                expert_bytes / shape.expert_bytes_per_param
            )
            row_flops = FLOPS_PER_MAC * params
        else:
            row_flops = FLOPS_PER_MAC * weight_bytes / self.weight_bytes_per_param
        peak_flops = self.peak_flops_per_s
        prefill_s, decode_s, row_s = (
            prefill_flops / peak_flops,
            decode_flops / peak_flops,
            row_flops / peak_flops,
        )
        if self.mixed_rates:
            prefill_s, decode_s, row_s = self._mixed_rate_s(
                shape,
                work.prefill_tokens,
                work.decodes,
                prefill_flops,
                decode_flops,
                row_flops,
                expert_bytes,
            )
        return PhysicsTerms(
            (weight_bytes + shape.embedding_row_bytes * tokens) / self.peak_bytes_per_s,
            prefill_s,
            decode_s,
            stage.allreduce_s_per_token * tokens,
            stage.collectives,
            shape.layers,
            sequences,
            row_s,
            kv_bytes / self.peak_bytes_per_s,
            single_process,
            stage.alltoall_s_per_token * tokens,
            stage.network_steps,
            prefill_attention_flops / self.peak_flops_per_s,
            decode_attention_flops / self.peak_flops_per_s,
        )

    def _mixed_rate_s(
        self,
        shape: ModelShape,
        prefill_tokens: float,
        decodes: float,
        prefill_flops: float,
        decode_flops: float,
        row_flops: float,
        expert_bytes: float,
    ) -> tuple[float, float, float]:
        """(prefill, decode, row) GEMM seconds at peak when the routed experts run at another
        rate than the rest: each GEMM's FLOPs at its own part's rate."""
        rest, experts = self.peak_flops_per_s, self.expert_peak_flops_per_s
        prefill_experts = shape.expert_flops_per_token * prefill_tokens
        decode_experts = shape.expert_flops_per_token * decodes
        row_experts = FLOPS_PER_MAC * expert_bytes / shape.expert_bytes_per_param
        return (
            (prefill_flops - prefill_experts) / rest + prefill_experts / experts,
            (decode_flops - decode_experts) / rest + decode_experts / experts,
            (row_flops - row_experts) / rest + row_experts / experts,
        )

    def terms(self, batch: StepBatch) -> PhysicsTerms:
        """The step's terms (one pipeline stage only: calibration records them)."""
        if len(self.stages) > 1:
            raise ConfigError(
                f"pp: invalid value {self.layout.pp}; a pipelined step is priced stage by stage "
                "and has no single set of terms (calibration takes pp = 1)"
            )
        work = self.work(batch)
        sequences = len(batch.prefill_chunks) + batch.decode_count
        return self._terms(self.stages[0], work, sequences, 1 if self.tp == 1 else 0)

    def pipeline_step_s(self, batch: StepBatch) -> float:
        """A step split into m = min(pp, sequences) micro-batches flowing through the stages:
        it lasts until every micro-batch has passed every stage and the first can start its
        next token, max(Σ stage + hand-offs, m × slowest stage) — the pipeline bubble is the
        gap when m < pp or the stages differ (docs/parallelism.md)."""
        c = self.coefficients
        work = self.work(batch)
        sequences = len(batch.prefill_chunks) + batch.decode_count
        parts = max(1, min(self.layout.pp, sequences))
        micro = work.share(parts)
        # Micro-batches are made of whole sequences: each prefill chunk passes every stage in
        # one of them, so the heaviest carries at least any one chunk's work, however many
        # sequences share the step. (An even split of every token priced a lone 3,403-token
        # chunk as two halves in flight: one decode added to it halved the step.) Decodes are
        # known by their sum only, so they are spread evenly.
        heaviest = micro
        if parts > 1 and batch.prefill_chunks:
            prompts = batch.prefill_prompt_tokens
            for k, chunk in enumerate(batch.prefill_chunks):
                alone = self.work(StepBatch([chunk], prefill_prompt_tokens=prompts[k : k + 1]))
                heaviest = _Work(*map(max, heaviest, alone))
        micro_s = self._stage_seconds(micro)
        heaviest_s = micro_s if heaviest is micro else self._stage_seconds(heaviest)
        heaviest_tokens = heaviest.prefill_tokens + heaviest.decodes
        hand_off_s = 0.0
        for i in range(len(self.stages) - 1):
            last_gpu = (i + 1) * self.tp - 1
            crosses = self.links.crosses(last_gpu, last_gpu + 1)
            link = self.links.scale_out_gb_per_s if crosses else self.links.scale_up_gb_per_s
            latency_us = c.network_latency_us if crosses else c.allreduce_latency_us
            hand_off_s += (
                heaviest_tokens
                * self.hand_off_bytes_per_token
                / (link * 1e9 * c.interconnect_efficiency)
                + latency_us * 1e-6
            )
        cycle_s = max(sum(heaviest_s) + hand_off_s, parts * max(micro_s))
        overhead_s = (c.per_step_overhead_us + sequences * c.per_sequence_overhead_us) * 1e-6
        return overhead_s + cycle_s

    def _stage_seconds(self, micro: _Work) -> list[float]:
        """Each pipeline stage's time for one micro-batch of `micro`'s work."""
        c = self.coefficients
        return [
            _gpu_s(t, c, max)
            + _communication_s(t, c)
            + stage.shape.layers * c.per_layer_overhead_us * 1e-6
            for stage in self.stages
            for t in (self._terms(stage, micro, 0, 0),)
        ]

    @property
    def coefficients_source(self) -> str:
        return self.source.describe()

    def efficiencies(self) -> str:
        """Which of the efficiencies pricing this run were measured on its GPU, which were
        carried over (and from where), and which are assumptions."""
        s = self.source
        if s.kind == "calibrated":
            text = f"fitted on {s.fit_gpu} with vLLM {s.fit_vllm}: calibrated for this GPU"
        elif s.kind == "transferred":
            text = (
                f"carried over from the {s.fit_gpu} fit (vLLM {s.fit_vllm}) as fractions of "
                f"{self.gpu.name}'s peaks; not measured on {self.gpu.name}"
            )
        elif s.kind == "given":
            text = "given" + s.note
        else:
            text = "physical defaults (public hardware facts), not fitted"
        stage = self.stages[0]
        if stage.network_steps or self.layout.pp > 1 or stage.alltoall_s_per_token:
            text += (
                "; the network latency, scale-out bandwidth, expert all-to-all and pipeline "
                "terms are assumptions from public figures, not fitted to any run"
            )
        return text

    def provenance(self) -> dict[str, Any]:
        return {
            "latency_model": self.name,
            "coefficients": self.source.describe(),
            "source": self.source.kind,
            "fit_gpu": self.source.fit_gpu,
            "fit_vllm_version": self.source.fit_vllm,
            "gpu": self.gpu.name,
            "gpu_covered_by_fit": self.source.covers_gpu,
            "model_covered_by_fit": self.model.name.lower() in self.source.fit_models,
            "efficiencies": self.efficiencies(),
            # The step's form: 0 = each GEMM the slower of its stream and its arithmetic.
            "gemm_ridge_exponent": self.coefficients.gemm_ridge_exponent,
            "gpu_figures": self.gpu.source,
            "layout": self.layout.describe(),
            "precision": describe_precision(self.model, self.gpu),
        }

    def decode_step_time_us(self, decode_count: int, decode_context_sum: int) -> int:
        """`step_time_us` of a decode-only step, as most steps of a busy batch are: the same
        arithmetic as `work`, `_terms` and `price_terms` on such a step, operation for
        operation (so the same bits), without building the batch, the work and the terms.
        Pipelined and windowed models take the general path. tests/latency/test_physics.py
        compares the two on random shapes, layouts and steps."""
        if len(self.stages) > 1 or (
            self.model.windowed_layer_indices and self.model.attention_window > 0
        ):
            return super().decode_step_time_us(decode_count, decode_context_sum)
        if decode_count == 0:
            return 1
        stage = self.stages[0]
        shape = stage.shape
        c = self.coefficients
        d, ctx = decode_count, decode_context_sum
        # work(): no prefill chunks.
        decode_pairs = ctx + d
        context_read = 0 + ctx
        # _terms()
        tokens = 0 + d
        n, k = shape.num_experts, shape.experts_per_token
        step_tokens = tokens * self.layout.ep_ranks
        experts = 1.0 if n == 0 else n * (1.0 - ((n - k) / n) ** step_tokens)
        expert_bytes = shape.expert_weight_bytes * experts
        weight_bytes = (
            shape.attention_weight_bytes
            + shape.dense_mlp_weight_bytes
            + expert_bytes
            + shape.shared_expert_weight_bytes
            + shape.router_weight_bytes
            + shape.lm_head_bytes
        )
        kv_bytes = shape.kv_bytes_per_token * (
            context_read + tokens
        ) - shape.window_kv_bytes_per_token * (context_read - 0.0)
        prefill_flops = shape.linear_flops_per_token * 0 + shape.lm_head_flops_per_sequence * 0
        prefill_attention_flops = (
            shape.attention_flops_per_pair * 0
            - shape.window_attention_flops_per_pair * (0 - 0.0)
            + shape.context_flops_per_token * 0
        )
        decode_flops = (shape.linear_flops_per_token + shape.lm_head_flops_per_sequence) * d
        decode_attention_flops = shape.decode_attention_flops_per_pair * decode_pairs - (
            shape.window_attention_flops_per_pair * (decode_pairs - 0.0)
        )
        if shape.mixed_weight_widths:
            params = (weight_bytes - expert_bytes) / shape.weight_bytes_per_param + (
                expert_bytes / shape.expert_bytes_per_param
            )
            row_flops = FLOPS_PER_MAC * params
        else:
            row_flops = FLOPS_PER_MAC * weight_bytes / self.weight_bytes_per_param
        peak_bytes, peak_flops = self.peak_bytes_per_s, self.peak_flops_per_s
        memory_s = (weight_bytes + shape.embedding_row_bytes * tokens) / peak_bytes
        prefill_s = prefill_flops / peak_flops
        decode_s = decode_flops / peak_flops
        row_s = row_flops / peak_flops
        if self.mixed_rates:
            prefill_s, decode_s, row_s = self._mixed_rate_s(
                shape, 0, d, prefill_flops, decode_flops, row_flops, expert_bytes
            )
        kv_s = kv_bytes / peak_bytes
        prefill_attention_s = prefill_attention_flops / peak_flops
        decode_attention_s = decode_attention_flops / peak_flops
        # price_terms()
        stream_s = memory_s / c.bandwidth_efficiency
        arithmetic_s = (
            prefill_s + c.gemm_fixed_rows * row_s
        ) / c.prefill_compute_efficiency + decode_s / c.decode_compute_efficiency
        p = c.gemm_ridge_exponent  # ridge(), written out
        gpu_s = (
            max(stream_s, arithmetic_s) if p == 0 else (stream_s**p + arithmetic_s**p) ** (1.0 / p)
        ) + max(
            kv_s / c.kv_bandwidth_efficiency,
            prefill_attention_s / c.prefill_compute_efficiency
            + decode_attention_s / c.decode_compute_efficiency,
        )
        communication_s = (
            stage.collectives * c.allreduce_latency_us * 1e-6
            + stage.allreduce_s_per_token * tokens / c.interconnect_efficiency
        ) + (
            stage.alltoall_s_per_token * tokens / c.interconnect_efficiency
            + stage.network_steps * c.network_latency_us * 1e-6
        )
        overhead_s = (
            c.per_step_overhead_us
            + (1 if self.tp == 1 else 0) * c.single_process_overhead_us
            + shape.layers * c.per_layer_overhead_us
            + (0 + d) * c.per_sequence_overhead_us
        ) * 1e-6
        step_us = int((overhead_s + communication_s + gpu_s) * 1e6)
        return step_us if step_us > 1 else 1

    def step_time_us(self, batch: StepBatch) -> int:
        if batch.batch_size == 0:
            return 1
        if len(self.stages) == 1:
            step_us = int(price_terms(self.terms(batch), self.coefficients) * 1e6)
        else:
            step_us = int(self.pipeline_step_s(batch) * 1e6)
        return step_us if step_us > 1 else 1

    def queueing_time_us(self, input_tokens: int) -> int:
        return self.queueing_us

    def scheduling_lag_steps(self) -> float:
        return float(self.coefficients.output_lag_steps)


class RecordingStepModel(StepTimeModel):
    """Wraps a PhysicsModel and keeps every step's terms, in step order (for calibration)."""

    def __init__(self, inner: PhysicsModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.terms: list[PhysicsTerms] = []

    def step_time_us(self, batch: StepBatch) -> int:
        # Every call is one row of the engine's step log, empty steps included.
        self.terms.append(self.inner.terms(batch))
        return self.inner.step_time_us(batch)

    def queueing_time_us(self, input_tokens: int) -> int:
        return self.inner.queueing_time_us(input_tokens)

    def scheduling_lag_steps(self) -> float:
        return self.inner.scheduling_lag_steps()


__all__ = [
    "COEFFICIENT_NAMES",
    "PhysicsCoefficients",
    "PhysicsModel",
    "PhysicsTerms",
    "RecordingStepModel",
    "causal_pairs",
    "coefficients_document",
    "load_coefficients_file",
    "model_shape",
    "price_terms",
    "request_delay_s",
]
