"""Blackbox alpha/beta regression step-time model (docs/behaviour.md §3.2).

The coefficients were fitted against real vLLM runs, per (model, GPU, TP, vLLM version):

    step_us     = β0 + β1 · (prefill tokens computed this step) + β2 · (decode requests)
    queueing_us = α0 + α1 · (input tokens)           arrival -> enqueue
    per token   = α2                                  output-token processing

(α2 is charged as docs/behaviour.md §A3 says.)

Each sum is formed in floating point and truncated once, as BLIS does (not term by term).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.catalog.defaults import fitted_deployments, lookup_coefficients, model_defaults
from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import ConfigError, excerpt, invalid, one_line, shorten
from simulator.latency.base import StepBatch, StepTimeModel

COEFFS_LEN = 3


def validate_coeffs(field: str, coeffs: object, count: int = COEFFS_LEN) -> tuple[float, ...]:
    """`count` finite, non-negative numbers, or ConfigError naming `field`."""
    if isinstance(coeffs, str | bytes) or not isinstance(coeffs, Sequence):
        raise invalid(field, coeffs, f"must be a list of {count} numbers")
    if len(coeffs) != count:
        raise invalid(field, list(coeffs), f"must have exactly {count} numbers")
    values: list[float] = []
    for i, c in enumerate(coeffs):
        if isinstance(c, bool) or not isinstance(c, int | float):
            raise invalid(f"{field}[{i}]", c, "must be a number")
        if not math.isfinite(c):
            raise invalid(f"{field}[{i}]", c, "must be finite")
        if c < 0:
            raise invalid(f"{field}[{i}]", c, "must be >= 0")
        values.append(float(c))
    return tuple(values)


class BlackboxModel(StepTimeModel):
    """Linear regression over the step's prefill tokens and decode count."""

    name = "blackbox"
    derives_context_limit = False  # no context limit unless the scenario sets one (as BLIS)

    def __init__(
        self,
        alpha: Sequence[float],
        beta: Sequence[float],
        total_kv_blocks: int | None = None,
    ) -> None:
        self.alpha = validate_coeffs("alpha_coeffs", alpha)
        self.beta = validate_coeffs("beta_coeffs", beta)
        if not any(self.alpha) and not any(self.beta):
            # Same guard as BLIS: all-zero means "no coefficients", never a real fit.
            raise invalid(
                "alpha_coeffs/beta_coeffs",
                [list(self.alpha), list(self.beta)],
                "all coefficients are zero; give fitted coefficients or use the roofline model",
            )
        # Fitted KV capacity that came with the coefficients (defaults.yaml), if any; the
        # engine may use it as the instance's total KV blocks.
        self.total_kv_blocks = total_kv_blocks
        self._beta0, self._beta1, self._beta2 = self.beta
        self._alpha0, self._alpha1, _ = self.alpha
        self._otp_us = int(self.alpha[2])

    @classmethod
    def from_deployment(
        cls,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        vllm_version: str | None = None,
    ) -> BlackboxModel:
        """Explicit coefficients win; otherwise the first defaults.yaml row for (model, GPU,
        TP, vLLM version), the version being the model's default one (defaults.yaml
        `defaults:`) when none is given, as in BLIS: a row fitted on another vLLM version is
        not used unless that version is asked for."""
        if (alpha is None) != (beta is None):
            missing = "beta_coeffs" if beta is None else "alpha_coeffs"
            raise invalid(missing, None, "alpha_coeffs and beta_coeffs must be given together")
        if alpha is not None and beta is not None:
            model_ = cls(alpha, beta)
            model_.coefficients_source = "given alpha/beta coefficients"
            return model_
        if vllm_version is None:
            vllm_version = (model_defaults(model.name) or {}).get("vllm_version")
        entry = lookup_coefficients(model.name, gpu.name, tp, vllm_version)
        if entry is None:
            raise ConfigError(_no_coefficients_message(model.name, gpu.name, tp, vllm_version))
        fitted = cls(entry.alpha, entry.beta, total_kv_blocks=entry.total_kv_blocks)
        fitted.coefficients_source = (
            f"BLIS's fit for {gpu.name} TP{tp}, vLLM {entry.vllm_version.rsplit(':', 1)[-1]} "
            "(defaults.yaml)"
        )
        return fitted

    def step_time_us(self, batch: StepBatch) -> int:
        prefill_tokens = 0
        for _, n in batch.prefill_chunks:
            prefill_tokens += n
        step_us = int(self._beta0 + self._beta1 * prefill_tokens + self._beta2 * batch.decode_count)
        return step_us if step_us > 1 else 1

    def queueing_time_us(self, input_tokens: int) -> int:
        return int(self._alpha0 + self._alpha1 * input_tokens)

    def output_token_processing_us(self) -> int:
        return self._otp_us

    def post_decode_overhead_us(self) -> int:
        return 0


def _no_coefficients_message(model_id: str, gpu: str, tp: int, vllm_version: str | None) -> str:
    version = shorten(one_line(vllm_version), 40) if vllm_version else "any"
    head = (
        f"blackbox: no fitted coefficients for model {excerpt(model_id)} on GPU {excerpt(gpu)} "
        f"with TP {tp} (vLLM version {version})"
    )
    combos = fitted_deployments(model_id)
    if not combos:
        return (
            f"{head}; defaults.yaml has no coefficients for this model at all. Give "
            "alpha_coeffs and beta_coeffs, or use latency model 'roofline'"
        )
    return (
        f"{head}; available for this model: {', '.join(combos)}. Name one of those vLLM "
        "versions (latency.vllm_version, --vllm-version), give alpha_coeffs and beta_coeffs, "
        "or use latency model 'roofline'"
    )
