"""`trained-roofline`: roofline basis functions with learned corrections (docs/behaviour.md §3.4).

    step_us = β1·max(T_pf_compute, T_pf_kv) + β2·max(T_dc_compute, T_dc_kv) + β3·T_weight
              + β4·T_tp + β5·L + β6·batch_size + β7

with, per GPU (FLOPs / peak FLOP/µs, bytes / HBM bytes/µs; 16-bit weights and KV always):

    T_pf_compute = L·[2·T_pf·d·(2d + 2d_kv)/TP + Σ 4·(H/TP)·t_i·(s_i + t_i/2)·d_h
                      + T_pf·k_eff·6·d·d_ff/TP] / peak          (s_i = prompt length)
    T_pf_kv      = L·2·(d_kv/TP)·T_pf·2 / bw
    T_dc_compute = L·[2·T_dc·d·(2d + 2d_kv)/TP + 4·(H/TP)·Σctx·d_h + T_dc·k_eff·6·d·d_ff/TP] / peak
    T_dc_kv      = L·2·(d_kv/TP)·2·(Σctx + T_dc) / bw
    T_weight     = L·[d·(2d + 2d_kv) + n_eff·3·d·d_ff]·2/TP / bw,
                   n_eff = min(N, max(k, (T_pf + T_dc)·k)) for MoE, else 1
    T_tp = 0 (BLIS absorbs TP communication into β5·L)

Queueing delay α0, post-decode overhead α1 (added to the completion the client sees, never to
the GPU), per-token output overhead α2. No MFU: β1 and β2 are the efficiency corrections.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..catalog.defaults import trained_roofline_defaults
from ..catalog.types import GPUSpec, ModelConfig
from ..errors import invalid
from .base import (
    StepBatch,
    TrainedAlphaOverheads,
    coefficients_or_defaults,
    trained_prefill_attention,
)
from .blackbox import validate_coeffs

log = logging.getLogger("servesim")
BYTES_PER_ELEMENT = 2.0  # the training pipeline's FP16 assumption


class TrainedRoofline(TrainedAlphaOverheads):
    name = "trained-roofline"

    def __init__(
        self,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float],
        beta: Sequence[float],
    ) -> None:
        self.alpha = validate_coeffs("alpha_coeffs", alpha, 3)
        self.beta = validate_coeffs("beta_coeffs", beta, 7)
        heads, kv_heads = model.num_heads, model.effective_kv_heads
        if tp < 1 or heads % tp or kv_heads % tp:
            raise invalid(
                "tp",
                tp,
                f"trained-roofline needs num_attention_heads ({heads}) and kv heads "
                f"({kv_heads}) divisible by tp",
            )
        if model.effective_weight_bytes_per_param != BYTES_PER_ELEMENT:
            log.warning(
                "trained-roofline prices %s with 16-bit weights; its quantized weight precision "
                "only affects KV capacity with this backend",
                model.name,
            )
        self.layers = float(model.num_layers)
        self.d = float(model.hidden_dim)
        head_dim = model.hidden_dim // heads
        self.d_h = float(head_dim)
        self.d_kv = float(kv_heads * head_dim)
        self.d_ff = float(model.intermediate_dim)
        self.k_eff = float(max(1, model.num_experts_per_tok))
        self.num_experts = float(model.num_local_experts)
        self.is_moe = model.num_local_experts > 1
        self.tp = float(tp)
        self.heads_per_gpu = heads / tp
        self.flops_per_us = gpu.tflops_peak * 1e6
        self.bytes_per_us = gpu.bw_peak_tbs * 1e6

    @classmethod
    def from_deployment(
        cls,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        vllm_version: str | None = None,
    ) -> TrainedRoofline:
        """Explicit coefficients win; else BLIS's `trained_roofline_defaults`."""
        coefficients = coefficients_or_defaults(alpha, beta, trained_roofline_defaults())
        built = cls(model, gpu, tp, *coefficients)
        built.coefficients_source = (
            "given alpha/beta coefficients"
            if alpha is not None or beta is not None
            else "BLIS's global trained-roofline fit (defaults.yaml)"
        )
        return built

    def step_time_us(self, batch: StepBatch) -> int:
        L, d, d_kv, d_h, d_ff = self.layers, self.d, self.d_kv, self.d_h, self.d_ff
        tp, k_eff, h = self.tp, self.k_eff, self.heads_per_gpu
        t_pf, attn = trained_prefill_attention(batch, h, d_h)
        t_dc = float(batch.decode_count)
        ctx = float(batch.decode_context_sum)

        pf_compute = pf_kv = 0.0
        if t_pf > 0:
            flops = (
                L * 2 * t_pf * d * (2 * d + 2 * d_kv) / tp
                + L * attn
                + L * t_pf * k_eff * 6 * d * d_ff / tp
            )
            pf_compute = flops / self.flops_per_us
            pf_kv = L * 2 * (d_kv / tp) * t_pf * BYTES_PER_ELEMENT / self.bytes_per_us
        dc_compute = dc_kv = 0.0
        if t_dc > 0:
            flops = (
                L * 2 * t_dc * d * (2 * d + 2 * d_kv) / tp
                + L * 4 * h * ctx * d_h
                + L * t_dc * k_eff * 6 * d * d_ff / tp
            )
            dc_compute = flops / self.flops_per_us
            dc_kv = L * 2 * (d_kv / tp) * BYTES_PER_ELEMENT * (ctx + t_dc) / self.bytes_per_us
        n_eff = 1.0
        if self.is_moe:
            n_eff = min(self.num_experts, max(k_eff, (t_pf + t_dc) * k_eff))
        weight_bytes = (
            L * d * (2 * d + 2 * d_kv) * BYTES_PER_ELEMENT / tp
            + L * n_eff * 3 * d * d_ff * BYTES_PER_ELEMENT / tp
        )
        t_weight = weight_bytes / self.bytes_per_us
        b = self.beta
        step = (
            b[0] * max(pf_compute, pf_kv)
            + b[1] * max(dc_compute, dc_kv)
            + b[2] * t_weight
            + b[3] * 0.0
            + b[4] * L
            + b[5] * batch.batch_size
            + b[6]
        )
        step_us = int(step)
        return step_us if step_us > 1 else 1
