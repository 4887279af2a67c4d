"""Analytical roofline step-time model (docs/behaviour.md §3.1, with the §A5 MoE fix).

One engine step is one forward pass: the weights are streamed from HBM once, every request adds
its own FLOPs and dynamic bytes (KV read/write, activations), and the step costs whichever of
compute or memory is slower. No overheads, no TP communication, no bandwidth haircut.

Every per-request term is `a * n + c * n * ctx` (FLOPs) or `k * (n + s) + m * n` (bytes), so the
model reduces to a handful of constants computed once here. Decode requests (n = 1, ctx = s) then
collapse to a closed form over (decode_count, decode_context_sum) and only prefill chunks are
looped over — the model is called once per engine step, tens of thousands of times per run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from simulator.catalog.hardware import mfu_provenance
from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import invalid
from simulator.latency.base import StepBatch, StepTimeModel

# HF `intermediate_size` is taken as already SwiGLU-scaled, so up+down is the whole MLP cost
# (BLIS / llm-optimizer convention; a third matrix over-prices e.g. Llama-2-70B).
MLP_MATRIX_COUNT = 2


def _positive_finite(value: float) -> bool:
    return value > 0 and math.isfinite(value)


def validate_roofline_inputs(model: ModelConfig, gpu: GPUSpec, tp: int) -> None:
    """Reject inputs the formula would divide by or silently mis-price (BLIS's checks)."""
    if isinstance(tp, bool) or not isinstance(tp, numbers.Integral) or tp < 1:
        raise invalid("tensor_parallelism", tp, "must be an integer >= 1")
    for field_name in ("num_heads", "num_layers", "hidden_dim"):
        value = getattr(model, field_name)
        if value <= 0:
            raise invalid(f"model {model.name!r} {field_name}", value, "must be > 0 for roofline")
    if model.num_kv_heads < 0:
        raise invalid(f"model {model.name!r} num_kv_heads", model.num_kv_heads, "must be >= 0")
    if model.intermediate_dim < 0:
        raise invalid(
            f"model {model.name!r}: intermediate_size", model.intermediate_dim, "must be >= 0"
        )
    if not _positive_finite(model.bytes_per_param):
        raise invalid(
            f"model {model.name!r} bytes_per_param",
            model.bytes_per_param,
            "must be a positive number (the torch_dtype was not recognised)",
        )
    if model.weight_bytes_per_param != 0 and not _positive_finite(model.weight_bytes_per_param):
        raise invalid(
            f"model {model.name!r} weight_bytes_per_param",
            model.weight_bytes_per_param,
            "must be a positive number, or 0 for 'same as bytes_per_param'",
        )
    for field_name in ("tflops_peak", "bw_peak_tbs", "mfu_prefill", "mfu_decode"):
        value = getattr(gpu, field_name)
        if not _positive_finite(value):
            raise invalid(f"GPU {gpu.name!r} {field_name}", value, "must be a positive number")
    if not (gpu.tflops_fp8 >= 0 and math.isfinite(gpu.tflops_fp8)):
        raise invalid(f"GPU {gpu.name!r} tflops_fp8", gpu.tflops_fp8, "must be >= 0 (0 = no FP8)")

    experts, k = model.num_local_experts, model.num_experts_per_tok
    if experts < 0:
        raise invalid(f"model {model.name!r} num_local_experts", experts, "must be >= 0")
    if experts > 1 and k <= 0:
        raise invalid(
            f"model {model.name!r} num_experts_per_tok",
            k,
            f"must be > 0 for an MoE model with {experts} experts",
        )
    if experts > 1 and k > experts:
        raise invalid(
            f"model {model.name!r} num_experts_per_tok",
            k,
            f"must be <= num_local_experts ({experts})",
        )
    if experts == 0 and k > 0:
        raise invalid(
            f"model {model.name!r} num_experts_per_tok",
            k,
            "must be 0 when num_local_experts is 0 (the expert count is missing)",
        )
    if model.moe_expert_ffn_dim < 0:
        raise invalid(
            f"model {model.name!r} moe_expert_ffn_dim", model.moe_expert_ffn_dim, "must be >= 0"
        )


class RooflineModel(StepTimeModel):
    """max(compute, memory) per step over the whole batch; see the module docstring."""

    name = "roofline"

    def __init__(self, model: ModelConfig, gpu: GPUSpec, tp: int) -> None:
        validate_roofline_inputs(model, gpu, tp)
        self.model = model
        self.gpu = gpu
        self.tp = tp

        layers = float(model.num_layers)
        d = float(model.hidden_dim)
        heads = float(model.num_heads)
        kv_heads = float(model.effective_kv_heads)
        d_head = d / heads  # config head_dim deliberately ignored, as in BLIS-Mar
        d_kv = kv_heads * d_head
        d_ff = float(model.intermediate_dim) if model.intermediate_dim > 0 else 4.0 * d
        self.is_moe = model.is_moe
        d_expert = (
            float(model.moe_expert_ffn_dim)
            if self.is_moe and model.moe_expert_ffn_dim > 0
            else d_ff
        )
        experts_per_token = float(model.num_experts_per_tok) if self.is_moe else 1.0
        bytes_act = float(model.bytes_per_param)
        bytes_weight = float(model.effective_weight_bytes_per_param)

        # --- FLOPs per request: linear_flops_per_token * n + attn_flops_per_token_ctx * n * ctx
        gemm_per_token = 2.0 * (d * d + 2.0 * d * d_kv) + 2.0 * d * d  # QKV + output projection
        rope_per_token = 2.0 * d
        mlp_per_token = 2.0 * (MLP_MATRIX_COUNT * d * d_expert) * experts_per_token
        self.linear_flops_per_token = layers * (gemm_per_token + rope_per_token + mlp_per_token)
        # 4·H·dh (QK^T and AV) + 5·H (softmax / mask) per (token, context position)
        self.attn_flops_per_token_ctx = layers * (4.0 * heads * d_head + 5.0 * heads)

        # --- Dynamic bytes per request: kv * (n + s) + act * n
        self.kv_bytes_per_token = 2.0 * layers * kv_heads * d_head * bytes_act
        self.act_bytes_per_token = layers * d * bytes_act

        # --- Weight bytes (once per step): attention part fixed, MLP part depends on nEff for MoE
        attn_weights = d * (d + 2.0 * d_kv) + d * d
        mlp_weights_per_expert = MLP_MATRIX_COUNT * d * d_expert
        self.attn_weight_bytes = attn_weights * layers * bytes_weight
        self.expert_weight_bytes = mlp_weights_per_expert * layers * bytes_weight
        self.num_experts = float(model.num_local_experts)
        # Probability that a given expert is NOT picked by one token under uniform routing.
        self.expert_miss_prob = (
            (self.num_experts - experts_per_token) / self.num_experts if self.is_moe else 0.0
        )
        self.dense_weight_bytes = self.attn_weight_bytes + self.expert_weight_bytes

        # FP8 tensor-core rate only for exactly one-byte weights on a GPU that has it
        # (docs/behaviour.md §4); sub-byte weights (W4A16) are dequantised and run at the BF16 rate.
        self.gemm_precision = "fp8" if bytes_weight == 1.0 and gpu.tflops_fp8 > 0 else "bf16"
        tflops = gpu.tflops_fp8 if self.gemm_precision == "fp8" else gpu.tflops_peak
        self.peak_flops = tflops * 1e12
        self.prefill_flops_rate = tp * self.peak_flops * gpu.mfu_prefill
        self.decode_flops_rate = tp * self.peak_flops * gpu.mfu_decode
        self.bw_bytes_per_s = gpu.bw_peak_tbs * 1e12

    @classmethod
    def from_deployment(
        cls,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        vllm_version: str | None = None,
    ) -> RooflineModel:
        """Registry entry point. Roofline has no fitted coefficients, and BLIS refuses them with
        an explicit roofline choice rather than silently ignoring them."""
        if alpha is not None or beta is not None:
            raise invalid(
                "alpha_coeffs/beta_coeffs",
                {"alpha_coeffs": alpha, "beta_coeffs": beta},
                "coefficients cannot be combined with latency model 'roofline'; "
                "use latency model 'blackbox' to apply them",
            )
        return cls(model, gpu, tp)

    def provenance(self) -> dict:
        """Adds where the GPU's MFU (this model's only efficiencies) was measured."""
        from ..catalog.precision import describe_precision

        # BLIS's rule (__init__), not physics's: a plan's precision column for gpt-oss on a
        # B200 said "fp4 experts", physics's.
        precision = {
            **describe_precision(self.model, self.gpu),
            "gemm": f"{self.gemm_precision} ({self.peak_flops / 1e12:g} TFLOPS, BLIS's rule)",
        }
        return {
            **super().provenance(),
            "efficiencies": mfu_provenance(self.gpu),
            "gpu_figures": self.gpu.source,
            "precision": precision,
        }

    def effective_experts(self, step_tokens: int) -> float:
        """Expected distinct experts touched by `step_tokens` tokens: N·(1 − ((N−k)/N)^T)."""
        if not self.is_moe:
            return 1.0
        return self.num_experts * (1.0 - self.expert_miss_prob**step_tokens)

    def weight_bytes(self, step_tokens: int) -> float:
        """Bytes of weights streamed once in a step with `step_tokens` new tokens (all GPUs)."""
        if not self.is_moe:
            return self.dense_weight_bytes
        return self.attn_weight_bytes + self.expert_weight_bytes * self.effective_experts(
            step_tokens
        )

    def step_time_us(self, batch: StepBatch) -> int:
        a = self.linear_flops_per_token
        c = self.attn_flops_per_token_ctx
        kv = self.kv_bytes_per_token
        act = self.act_bytes_per_token

        prefill_flops = 0.0
        prefill_new = 0
        prefill_ctx = 0
        for s, n in batch.prefill_chunks:
            ctx = s + (n - 1) * 0.5 if n > 1 else s
            prefill_flops += n * (a + c * ctx)
            prefill_new += n
            prefill_ctx += s

        d_count = batch.decode_count
        d_ctx = batch.decode_context_sum
        decode_flops = a * d_count + c * d_ctx

        step_tokens = prefill_new + d_count
        if step_tokens == 0 and not batch.prefill_chunks:
            return 1
        dynamic_bytes = kv * (step_tokens + prefill_ctx + d_ctx) + act * step_tokens

        compute_s = prefill_flops / self.prefill_flops_rate + decode_flops / self.decode_flops_rate
        memory_s = (self.weight_bytes(step_tokens) + dynamic_bytes) / self.tp / self.bw_bytes_per_s
        # max() without the call: the same float (neither term is ever NaN).
        step_us = int((memory_s if memory_s > compute_s else compute_s) * 1e6)
        return step_us if step_us > 1 else 1

    def decode_step_time_us(self, decode_count: int, decode_context_sum: int) -> int:
        """`step_time_us` without prefill chunks, term for term (0.0 + x is x, so the value
        is the same to the bit)."""
        if decode_count == 0:
            return 1
        decode_flops = self.linear_flops_per_token * decode_count + (
            self.attn_flops_per_token_ctx * decode_context_sum
        )
        dynamic_bytes = (
            self.kv_bytes_per_token * (decode_count + decode_context_sum)
            + self.act_bytes_per_token * decode_count
        )
        compute_s = decode_flops / self.decode_flops_rate
        weight_bytes = self.weight_bytes(decode_count) if self.is_moe else self.dense_weight_bytes
        memory_s = (weight_bytes + dynamic_bytes) / self.tp / self.bw_bytes_per_s
        # max() without the call: the same float (neither term is ever NaN).
        step_us = int((memory_s if memory_s > compute_s else compute_s) * 1e6)
        return step_us if step_us > 1 else 1


__all__ = ["RooflineModel", "validate_roofline_inputs"]
