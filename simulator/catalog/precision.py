"""Deployment precision: the weight format and the KV-cache element a run chooses, checked
against what the GPU's tensor cores can do (docs/models-and-hardware.md, "Precision").

A model's config already says how its checkpoint is stored (`torch_dtype`,
`quantization_config`); `weight_dtype` replaces that, as vLLM's `--quantization` does, and
`kv_cache_dtype` is vLLM's `--kv-cache-dtype`. "auto" keeps the config's choice.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from simulator.catalog.models import dtype_bytes
from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import invalid

# name -> bytes per weight element (block scales are ignored, as for every format).
WEIGHT_DTYPES: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,  # W8A8: FP8 GEMMs on tensor cores
    "int4": 0.5,  # W4A16 (GPTQ/AWQ): dequantised to BF16 for the GEMM
    "fp4": 0.5,  # NVFP4 W4A4: FP4 GEMMs on Blackwell tensor cores
}
# vLLM's --kv-cache-dtype names; every FP8 variant stores one byte per element.
KV_CACHE_DTYPES: dict[str, float] = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}
AUTO = "auto"
# Formats whose GEMMs need a tensor-core precision the GPU may lack.
_NEEDS_FP8 = frozenset({"fp8"})
_NEEDS_FP4 = frozenset({"fp4"})


def weight_dtypes_on(gpu: GPUSpec) -> list[str]:
    """The weight formats `gpu` can run, "auto" first."""
    names = [AUTO]
    for name in WEIGHT_DTYPES:
        if name in _NEEDS_FP8 and not gpu.has_fp8:
            continue
        if name in _NEEDS_FP4 and not gpu.has_fp4:
            continue
        names.append(name)
    return names


def kv_cache_dtypes_on(gpu: GPUSpec) -> list[str]:
    """The KV-cache element types `gpu` supports: FP8 needs FP8 support (vLLM's attention
    backends read an FP8 cache with FP8 instructions; Hopper, Ada, Blackwell, MI300)."""
    return [AUTO, *KV_CACHE_DTYPES] if gpu.has_fp8 else [AUTO]


def apply_precision(
    model: ModelConfig,
    gpu: GPUSpec,
    weight_dtype: str = AUTO,
    kv_cache_dtype: str = AUTO,
) -> ModelConfig:
    """`model` with the chosen weight format and KV-cache element; refuses a precision the
    GPU lacks, naming the field, the value and what this GPU allows."""
    if weight_dtype != AUTO:
        if weight_dtype not in WEIGHT_DTYPES:
            raise invalid("weight_dtype", weight_dtype, "must be one of " + _names(WEIGHT_DTYPES))
        if weight_dtype not in weight_dtypes_on(gpu):
            lacks = "FP8" if weight_dtype in _NEEDS_FP8 else "FP4"
            raise invalid(
                "weight_dtype",
                weight_dtype,
                f"GPU {gpu.name!r} has no {lacks} tensor cores; allowed on it: "
                + ", ".join(weight_dtypes_on(gpu)),
            )
        model = replace(
            model,
            weight_bytes_per_param=WEIGHT_DTYPES[weight_dtype],
            weight_format=weight_dtype,
            expert_weight_bytes_per_param=0.0,
        )
    if kv_cache_dtype != AUTO:
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise invalid(
                "engine.kv_cache_dtype", kv_cache_dtype, "must be one of " + _names(KV_CACHE_DTYPES)
            )
        if kv_cache_dtype not in kv_cache_dtypes_on(gpu):
            raise invalid(
                "engine.kv_cache_dtype",
                kv_cache_dtype,
                f"GPU {gpu.name!r} has no FP8 support; allowed on it: "
                + ", ".join(kv_cache_dtypes_on(gpu)),
            )
        model = replace(model, kv_cache_bytes_per_element=KV_CACHE_DTYPES[kv_cache_dtype])
    return model


FP32_BYTES = dtype_bytes("float32")


def served_dtype(model: ModelConfig) -> ModelConfig:
    """`model` as vLLM serves it with `--dtype auto`: an FP32 checkpoint runs in FP16 (its
    compute, the weights it loads and its KV cache two bytes wide); every other dtype as it
    is. BLIS's backends keep the checkpoint's width (BLIS's own mapping)."""
    if model.bytes_per_param != FP32_BYTES:
        return model

    def halved(width: float) -> float:
        return 0.0 if width == FP32_BYTES else width  # 0: the compute width, now 2 bytes

    return replace(
        model,
        bytes_per_param=2.0,
        weight_bytes_per_param=halved(model.weight_bytes_per_param),
        kv_cache_bytes_per_element=halved(model.kv_cache_bytes_per_element),
        expert_weight_bytes_per_param=halved(model.expert_weight_bytes_per_param),
    )


def gemm_precision(model: ModelConfig, gpu: GPUSpec) -> str:
    """The tensor-core precision the model's GEMMs run at on `gpu`: "fp4", "fp8" or "bf16".

    FP4 formats use FP4 units where the GPU has them; exactly one-byte weights use FP8 units
    where it has them (BLIS's rule); anything else (W4A16, FP8 weights on an A100) is
    dequantised and runs at the 16-bit rate, as vLLM's Marlin kernels do."""
    if model.weight_format in ("fp4", "mxfp4") and gpu.has_fp4:
        return "fp4"
    if model.effective_weight_bytes_per_param == 1.0 and gpu.has_fp8:
        return "fp8"
    return "bf16"


def peak_tflops(model: ModelConfig, gpu: GPUSpec) -> float:
    """Dense peak TFLOPS of `gpu` at the model's GEMM precision."""
    return precision_tflops(gemm_precision(model, gpu), gpu)


def precision_tflops(precision: str, gpu: GPUSpec) -> float:
    """Dense peak TFLOPS of `gpu` at a tensor-core precision ("fp4", "fp8" or "bf16")."""
    if precision == "fp4":
        return gpu.tflops_fp4
    if precision == "fp8":
        return gpu.tflops_fp8_dense or gpu.tflops_fp8
    return gpu.tflops_peak


class GemmPrecisions(NamedTuple):
    """The tensor-core precision of each part of a forward pass, as vLLM runs it."""

    experts: str  # the routed experts' GEMMs
    rest: str  # every other GEMM (attention projections, dense MLPs, shared experts, router,
    # LM head) and the attention kernels: the non-expert weights' precision

    @property
    def mixed(self) -> bool:
        return self.experts != self.rest


def gemm_precisions(model: ModelConfig, gpu: GPUSpec) -> GemmPrecisions:
    """Each part's GEMM precision. A model whose weights have one width and format runs every
    GEMM (and its attention) at `gemm_precision`. One whose routed experts are stored apart
    (gpt-oss: MXFP4 experts, BF16 elsewhere) runs the experts at their format's precision and
    the rest at the other weights' precision: vLLM's MXFP4 MoE kernels use the FP4 units,
    while the BF16 attention projections, router and LM head, and the attention itself, run
    in BF16 (docs/models-and-hardware.md, "Precision")."""
    if not model.expert_weight_bytes_per_param:
        whole = gemm_precision(model, gpu)
        return GemmPrecisions(whole, whole)
    rest = "fp8" if model.effective_weight_bytes_per_param == 1.0 and gpu.has_fp8 else "bf16"
    return GemmPrecisions(gemm_precision(model, gpu), rest)


def describe_precision(model: ModelConfig, gpu: GPUSpec) -> dict[str, str]:
    """Weights, KV cache and GEMM precision in words, for the run's provenance block."""
    weights = model.weight_format or _width_name(model.effective_weight_bytes_per_param)
    if model.expert_weight_bytes_per_param:
        weights += f" experts, {_width_name(model.effective_weight_bytes_per_param)} elsewhere"
    parts = gemm_precisions(model, gpu)
    gemm = parts.rest
    if parts.mixed:
        experts, rest = precision_tflops(parts.experts, gpu), precision_tflops(parts.rest, gpu)
        gemm = (
            f"{parts.experts} experts ({experts:g} TFLOPS), "
            f"{parts.rest} elsewhere and in attention ({rest:g} TFLOPS)"
        )
    return {
        "weights": weights,
        "kv_cache": _width_name(model.kv_bytes_per_element),
        "gemm": gemm,
    }


def _width_name(width: float) -> str:
    return {4.0: "fp32", 2.0: "bf16/fp16", 1.0: "8-bit", 0.5: "4-bit"}.get(width, f"{width:g} B")


def _names(table: dict[str, float]) -> str:
    return ", ".join([AUTO, *table])


__all__ = [
    "GemmPrecisions",
    "KV_CACHE_DTYPES",
    "WEIGHT_DTYPES",
    "apply_precision",
    "served_dtype",
    "describe_precision",
    "gemm_precision",
    "gemm_precisions",
    "kv_cache_dtypes_on",
    "peak_tflops",
    "precision_tflops",
    "weight_dtypes_on",
]
