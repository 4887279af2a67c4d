"""`crossmodel`: BLIS-Mar's global physics-feature step-time model (docs/behaviour.md §3.3).

Four coefficients shared by every architecture, scaled by features read from the model:

    step_us = β0·L + β1·decode_tokens·kv_dim_scaled + β2·(prefill + decode tokens)·is_moe
              + β3·is_tp
    kv_dim_scaled = L·kv_heads·head_dim / TP · 1e-6

Queueing delay α0 + α1·input tokens (one float, truncated once), per-token output overhead α2.
Dense prefill cost does not depend on its tokens (BLIS documents this).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..catalog.defaults import crossmodel_defaults
from ..catalog.types import GPUSpec, ModelConfig
from .base import StepBatch, StepTimeModel, coefficients_or_defaults
from .blackbox import validate_coeffs


class CrossModel(StepTimeModel):
    name = "crossmodel"

    def __init__(self, model: ModelConfig, tp: int, alpha: Sequence[float], beta: Sequence[float]):
        self.alpha = validate_coeffs("alpha_coeffs", alpha, 3)
        self.beta = validate_coeffs("beta_coeffs", beta, 4)
        head_dim = model.hidden_dim // model.num_heads
        self.layers = model.num_layers
        self.kv_dim_scaled = model.num_layers * model.effective_kv_heads * head_dim / tp * 1e-6
        self.is_moe = 1.0 if model.num_local_experts > 0 else 0.0
        self.is_tp = 1.0 if tp > 1 else 0.0
        b0, b1, b2, b3 = self.beta
        self._fixed_us = b0 * self.layers
        self._per_decode_us = b1 * self.kv_dim_scaled
        self._per_token_moe_us = b2 * self.is_moe
        self._tp_us = b3 * self.is_tp

    @classmethod
    def from_deployment(
        cls,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        vllm_version: str | None = None,
    ) -> CrossModel:
        """Explicit coefficients win; else BLIS's `crossmodel_defaults` (defaults.yaml)."""
        built = cls(model, tp, *coefficients_or_defaults(alpha, beta, crossmodel_defaults()))
        built.coefficients_source = (
            "given alpha/beta coefficients"
            if alpha is not None or beta is not None
            else "BLIS's global crossmodel fit (defaults.yaml)"
        )
        return built

    def step_time_us(self, batch: StepBatch) -> int:
        prefill = 0
        for _, n in batch.prefill_chunks:
            prefill += n
        decode = batch.decode_count
        step = (
            self._fixed_us
            + self._per_decode_us * decode
            + self._per_token_moe_us * (prefill + decode)
            + self._tp_us
        )
        step_us = int(step)
        return step_us if step_us > 1 else 1

    def queueing_time_us(self, input_tokens: int) -> int:
        return int(self.alpha[0] + self.alpha[1] * input_tokens)

    def output_token_processing_us(self) -> int:
        return int(self.alpha[2])
