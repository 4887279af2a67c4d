"""Deployment precision (docs/models-and-hardware.md, "Precision"): the weight format and the
KV-cache element a run chooses, and the refusal of a precision the GPU lacks."""

from __future__ import annotations

import pytest

from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.catalog.precision import (
    apply_precision,
    describe_precision,
    gemm_precision,
    kv_cache_dtypes_on,
    peak_tflops,
    weight_dtypes_on,
)
from simulator.errors import ConfigError
from simulator.latency.kv_capacity import compute_kv_blocks, kv_bytes_per_token

LLAMA = load_model("meta-llama/llama-3.1-8b-instruct")


def test_auto_changes_nothing():
    assert apply_precision(LLAMA, get_gpu("H100")) == LLAMA


def test_fp8_kv_halves_the_bytes_per_token():
    fp8 = apply_precision(LLAMA, get_gpu("H100"), kv_cache_dtype="fp8")
    # 32 layers x 2 (K, V) x 128 x 8 KV heads x 1 byte.
    assert kv_bytes_per_token(fp8) == 32 * 2 * 128 * 8 * 1 == kv_bytes_per_token(LLAMA) / 2


def test_fp8_kv_doubles_the_blocks():
    """Llama-3.1-8B TP1 H100: the same 55,182,247,526 free bytes over 2,097,152-byte BF16
    blocks give 26,312; over 1,048,576-byte FP8 blocks 52,625 (= 2 x 26,312 + 1: the
    remainder 1,984,102 B of the BF16 division holds one more half-size block)."""
    fp8 = apply_precision(LLAMA, get_gpu("H100"), kv_cache_dtype="fp8")
    assert compute_kv_blocks(LLAMA, get_gpu("H100"), 1) == 26_312
    assert compute_kv_blocks(fp8, get_gpu("H100"), 1) == 55_182_247_526 // 1_048_576 == 52_625


def test_weight_dtype_sets_width_and_gemm_precision():
    h100, b200 = get_gpu("H100"), get_gpu("B200")
    fp8 = apply_precision(LLAMA, h100, weight_dtype="fp8")
    assert fp8.effective_weight_bytes_per_param == 1.0
    assert gemm_precision(fp8, h100) == "fp8" and peak_tflops(fp8, h100) == 1979.0
    fp4 = apply_precision(LLAMA, b200, weight_dtype="fp4")
    assert fp4.effective_weight_bytes_per_param == 0.5
    assert gemm_precision(fp4, b200) == "fp4" and peak_tflops(fp4, b200) == 9000.0
    w4a16 = apply_precision(LLAMA, h100, weight_dtype="int4")  # dequantised: BF16 GEMMs
    assert gemm_precision(w4a16, h100) == "bf16" and peak_tflops(w4a16, h100) == 989.5
    bf16 = apply_precision(load_model("deepseek-ai/deepseek-v3"), h100, weight_dtype="bf16")
    assert bf16.effective_weight_bytes_per_param == 2.0 and gemm_precision(bf16, h100) == "bf16"


def test_checkpoint_fp8_on_a_gpu_without_fp8_runs_weight_only():
    # An FP8 checkpoint on A100 runs as W8A16 (vLLM's Marlin): 1-byte weights, BF16 GEMMs.
    fp8_model = load_model("deepseek-ai/deepseek-v3")
    assert gemm_precision(fp8_model, get_gpu("A100-80")) == "bf16"


def test_mxfp4_experts_use_fp4_units_where_there_are_some():
    gpt_oss = load_model("openai/gpt-oss-120b")
    assert gemm_precision(gpt_oss, get_gpu("B200")) == "fp4"
    assert gemm_precision(gpt_oss, get_gpu("H100")) == "bf16"
    assert describe_precision(gpt_oss, get_gpu("H100")) == {
        "weights": "mxfp4 experts, bf16/fp16 elsewhere",
        "kv_cache": "bf16/fp16",
        "gemm": "bf16",
    }


@pytest.mark.parametrize(
    ("gpu", "kwargs", "message"),
    [
        (
            "H100",
            {"weight_dtype": "fp4"},
            "weight_dtype: invalid value 'fp4'; GPU 'H100' has no FP4 tensor cores; allowed on "
            "it: auto, bf16, fp16, fp8, int4",
        ),
        (
            "A100-80",
            {"weight_dtype": "fp8"},
            "weight_dtype: invalid value 'fp8'; GPU 'A100-80' has no FP8 tensor cores; allowed "
            "on it: auto, bf16, fp16, int4",
        ),
        (
            "A100-SXM",
            {"kv_cache_dtype": "fp8"},
            "engine.kv_cache_dtype: invalid value 'fp8'; GPU 'A100-SXM' has no FP8 support; "
            "allowed on it: auto",
        ),
        (
            "H100",
            {"weight_dtype": "int3"},
            "weight_dtype: invalid value 'int3'; must be one of auto, bf16, fp16, fp8, int4, fp4",
        ),
        (
            "H100",
            {"kv_cache_dtype": "int8"},
            "engine.kv_cache_dtype: invalid value 'int8'; must be one of auto, fp8, fp8_e4m3, "
            "fp8_e5m2",
        ),
    ],
)
def test_refuses_a_precision_the_gpu_lacks(gpu, kwargs, message):
    with pytest.raises(ConfigError) as exc:
        apply_precision(LLAMA, get_gpu(gpu), **kwargs)
    assert str(exc.value) == message


def test_allowed_lists_follow_the_tensor_cores():
    assert weight_dtypes_on(get_gpu("B200")) == ["auto", "bf16", "fp16", "fp8", "int4", "fp4"]
    assert weight_dtypes_on(get_gpu("MI300X")) == ["auto", "bf16", "fp16", "fp8", "int4"]
    assert kv_cache_dtypes_on(get_gpu("L40S"))[:2] == ["auto", "fp8"]
