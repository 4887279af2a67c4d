"""Roofline step-time model (docs/behaviour.md §3.1 + §A5): hand-derived values and laws.

Every pinned number below is derived in the test from the formula, with plain integer
arithmetic a reader can redo on paper; the model is then required to agree.

Shared symbols for llama-3.1-8b-instruct (config.json): L=32, d=4096, H=32, Hkv=8,
dh=d/H=128, dkv=Hkv*dh=1024, dff=14336, B=2 (bf16). H100: 989.5 TFLOPS BF16, 1979 FP8,
3.35 TB/s, MFU prefill 0.45 / decode 0.30.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import ConfigError
from simulator.latency import build_step_time_model
from simulator.latency.base import StepBatch
from simulator.latency.roofline import RooflineModel
from tests.specs import A100_SXM, H100, LLAMA31_8B, MIXTRAL_8X7B

A100 = A100_SXM

LLAMA2_7B = ModelConfig(  # multi-head attention: kv heads == heads
    name="meta-llama/llama-2-7b-hf",
    num_layers=32,
    hidden_dim=4096,
    num_heads=32,
    num_kv_heads=32,
    intermediate_dim=11008,
    vocab_size=32000,
    bytes_per_param=2.0,
)

# --- llama-3.1-8b per-model constants, by hand -------------------------------------------
L, D, H, HKV, DH, DKV, DFF = 32, 4096, 32, 8, 128, 1024, 14336
# FLOPs linear in new tokens, per token: QKV+O GEMMs + RoPE (2d) + MLP (2 * 2*d*dff)
LIN_FLOPS = L * (2 * (D * D + 2 * D * DKV) + 2 * D * D + 2 * D + 2 * (2 * D * DFF))
# FLOPs per (new token x context position): attention 4*H*dh + softmax/mask 5*H
CTX_FLOPS = L * (4 * H * DH + 5 * H)
KV_BYTES_PER_TOKEN = 2 * L * HKV * DH * 2  # K and V, all layers, bf16 = 131072
ACT_BYTES_PER_TOKEN = L * D * 2  # = 262144
# Weights per layer: attention d(d+2dkv) + d^2, MLP 2*d*dff; all layers, bf16
WEIGHT_BYTES = L * ((D * (D + 2 * DKV) + D * D) + 2 * D * DFF) * 2  # = 10_200_547_328


def test_hand_constants() -> None:
    assert LIN_FLOPS == 10_200_809_472
    assert CTX_FLOPS == 529_408
    assert KV_BYTES_PER_TOKEN == 131_072
    assert ACT_BYTES_PER_TOKEN == 262_144
    assert WEIGHT_BYTES == 10_200_547_328
    m = RooflineModel(LLAMA31_8B, H100, 1)
    assert m.linear_flops_per_token == LIN_FLOPS
    assert m.attn_flops_per_token_ctx == CTX_FLOPS
    assert m.weight_bytes(1) == WEIGHT_BYTES


def test_blis_parity_lone_512_token_prompt_is_11884_us() -> None:
    """BLIS reference: llama-3.1-8b, H100 TP1, request 0 = 512-token prompt, TTFT 11.884 ms.

    One prefill chunk (s=0, n=512): ctx = 0 + (512-1)/2 = 255.5
      GEMM   = 32*[2*512*(4096^2 + 2*4096*1024) + 2*512*4096^2]     = 1_374_389_534_720
      attn   = 32*4*32*512*255.5*128                                 =    68_585_259_008
      vector = 32*[5*32*512*255.5 + 2*512*4096]                      =       803_995_648
      MLP    = 32*2*512*(2*4096*14336)                               = 3_848_290_697_216
      total                                                          = 5_292_069_486_592
      compute = 5.292069486592e12 / (989.5e12 * 0.45) = 0.0118849...s
      memory  = (10_200_547_328 weights + 131072*512 KV write + 262144*512 act) / 3.35e12
              = 10_401_873_920 / 3.35e12 = 0.003105...s   (compute-bound)
      step = int(11884.9...) = 11884 us
    """
    gemm = 32 * (2 * 512 * (4096**2 + 2 * 4096 * 1024) + 2 * 512 * 4096**2)
    attn = 32 * 4 * 32 * 512 * 255.5 * 128
    vector = 32 * (5 * 32 * 512 * 255.5 + 2 * 512 * 4096)
    mlp = 32 * 2 * 512 * (2 * 4096 * 14336)
    assert (gemm, attn, vector, mlp) == (
        1_374_389_534_720,
        68_585_259_008,
        803_995_648,
        3_848_290_697_216,
    )
    compute_s = (gemm + attn + vector + mlp) / (989.5e12 * 0.45)
    memory_s = (WEIGHT_BYTES + KV_BYTES_PER_TOKEN * 512 + ACT_BYTES_PER_TOKEN * 512) / 3.35e12
    assert compute_s > memory_s
    assert int(compute_s * 1e6) == 11884

    model = RooflineModel(LLAMA31_8B, H100, 1)
    assert model.step_time_us(StepBatch(prefill_chunks=[(0, 512)])) == 11884


def test_dense_decode_batch_is_memory_bound_3280_us() -> None:
    """10 decodes at context 600 each (decode_context_sum = 6000), llama-3.1-8b, H100 TP1.

    FLOPs  = 10*LIN_FLOPS + 6000*CTX_FLOPS = 102_008_094_720 + 3_176_448_000
           = 105_184_542_720 -> / (989.5e12*0.30) = 354 us
    bytes  = weights 10_200_547_328 + KV 131072*(10 new + 6000 read) + act 262144*10
           = 10_200_547_328 + 787_742_720 + 2_621_440 = 10_990_911_488
           -> / 3.35e12 = 3280.87 us  (memory-bound)
    """
    flops = 10 * LIN_FLOPS + 6000 * CTX_FLOPS
    assert flops == 105_184_542_720
    compute_us = flops / (989.5e12 * 0.30) * 1e6
    total_bytes = WEIGHT_BYTES + KV_BYTES_PER_TOKEN * (10 + 6000) + ACT_BYTES_PER_TOKEN * 10
    assert total_bytes == 10_990_911_488
    memory_us = total_bytes / 3.35e12 * 1e6
    assert int(compute_us) == 354
    assert int(memory_us) == 3280

    model = RooflineModel(LLAMA31_8B, H100, 1)
    assert model.step_time_us(StepBatch(decode_count=10, decode_context_sum=6000)) == 3280
    # TP2 divides both weights and dynamic bytes by 2 (no communication term).
    tp2 = RooflineModel(LLAMA31_8B, H100, 2)
    assert tp2.step_time_us(StepBatch(decode_count=10, decode_context_sum=6000)) == 1640


def test_mha_llama2_reads_four_times_the_kv_of_gqa() -> None:
    """llama-2-7b: Hkv = H = 32 -> dkv = 4096, dff = 11008. Same decode batch as above.

    KV bytes/token = 2*32*32*128*2 = 524_288 (4x llama-3.1's 131_072 with 8 kv heads)
    weights = 32*[(4096*(4096+2*4096) + 4096^2) + 2*4096*11008]*2
            = 32*[67_108_864 + 90_177_536]*2 = 10_066_329_600
    bytes   = 10_066_329_600 + 524_288*6010 + 262_144*10 = 13_219_921_920
            -> / 3.35e12 = 3946.2 us
    """
    kv_mha = 2 * 32 * 32 * 128 * 2
    assert kv_mha == 4 * KV_BYTES_PER_TOKEN
    weights = 32 * ((4096 * (4096 + 2 * 4096) + 4096**2) + 2 * 4096 * 11008) * 2
    assert weights == 10_066_329_600
    total = weights + kv_mha * 6010 + ACT_BYTES_PER_TOKEN * 10
    assert total == 13_219_921_920
    assert int(total / 3.35e12 * 1e6) == 3946

    mha = RooflineModel(LLAMA2_7B, H100, 1)
    assert mha.step_time_us(StepBatch(decode_count=10, decode_context_sum=6000)) == 3946

    # Holding everything else fixed, GQA (fewer kv heads) never costs more than MHA.
    gqa = RooflineModel(replace(LLAMA2_7B, num_kv_heads=8), H100, 1)
    for ctx in (0, 600, 4000):
        batch = StepBatch(decode_count=10, decode_context_sum=10 * ctx)
        assert gqa.step_time_us(batch) <= mha.step_time_us(batch)


def test_kv_heads_zero_means_mha() -> None:
    zero = RooflineModel(replace(LLAMA2_7B, num_kv_heads=0), H100, 1)
    mha = RooflineModel(LLAMA2_7B, H100, 1)
    batch = StepBatch(prefill_chunks=[(100, 300)], decode_count=5, decode_context_sum=5000)
    assert zero.step_time_us(batch) == mha.step_time_us(batch)


def test_moe_effective_experts_and_weights() -> None:
    """Mixtral 8x7B: N=8 experts, k=2, expert FFN dim 14336 (no moe_intermediate_size).

    nEff(T) = 8*(1 - (6/8)^T): T=1 -> 8*(1-0.75) = 2 experts (exactly the k routed ones);
    T=256 -> 8*(1 - 0.75^256) = 8 to double precision (every expert touched).
      attention weights/layer = 4096*(4096+2*1024) + 4096^2 = 41_943_040
      one expert/layer        = 2*4096*14336               = 117_440_512
      T=1:   32*(41_943_040 + 2*117_440_512)*2 = 17_716_740_096 bytes
      T=256: 32*(41_943_040 + 8*117_440_512)*2 = 62_813_896_704 bytes
    """
    model = RooflineModel(MIXTRAL_8X7B, H100, 1)
    assert model.effective_experts(1) == pytest.approx(2.0, abs=1e-12)
    assert model.effective_experts(256) == pytest.approx(8.0, abs=1e-12)
    assert model.effective_experts(2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5 experts
    assert model.weight_bytes(1) == 32 * (41_943_040 + 2 * 117_440_512) * 2 == 17_716_740_096
    assert model.weight_bytes(256) == pytest.approx(62_813_896_704, rel=1e-12)


def test_moe_single_decode_prices_the_two_routed_experts() -> None:
    """One decode at context 1000 (T = 1 token in the step, docs/behaviour.md §A5 -> nEff = 2).

      bytes = 17_716_740_096 + 131072*(1+1000) + 262144 = 17_848_205_312
              -> / 3.35e12 = 5327.8 us  (memory-bound; FLOPs ~ 2*LIN, tens of us)
    BLIS-Mar evaluated nEff at T=0 (no expert weights at all); servesim follows the fix.
    """
    total = 17_716_740_096 + KV_BYTES_PER_TOKEN * 1001 + ACT_BYTES_PER_TOKEN
    assert total == 17_848_205_312
    assert int(total / 3.35e12 * 1e6) == 5327
    model = RooflineModel(MIXTRAL_8X7B, H100, 1)
    assert model.step_time_us(StepBatch(decode_count=1, decode_context_sum=1000)) == 5327


def test_moe_large_decode_batch_touches_all_experts() -> None:
    """256 decodes at context 1000 each: T = 256 -> nEff = 8.

    bytes = 62_813_896_704 + 131072*(256 + 256_000) + 262144*256
          = 62_813_896_704 + 33_587_986_432 + 67_108_864 = 96_468_992_000
          -> / 3.35e12 = 28_796.7 us
    Per-token FLOPs with k=2 routed experts:
      LIN' = 32*(2*(4096^2 + 2*4096*1024) + 2*4096^2 + 2*4096 + 2*(2*4096*14336)*2)
           = 17_717_002_240
      compute = (256*LIN' + 256_000*CTX_FLOPS) / (989.5e12*0.30) = 15_735 us < memory.
    """
    lin_moe = 32 * (
        2 * (4096**2 + 2 * 4096 * 1024) + 2 * 4096**2 + 2 * 4096 + 2 * (2 * 4096 * 14336) * 2
    )
    assert lin_moe == 17_717_002_240
    compute_us = (256 * lin_moe + 256_000 * CTX_FLOPS) / (989.5e12 * 0.30) * 1e6
    dyn = KV_BYTES_PER_TOKEN * (256 + 256_000) + ACT_BYTES_PER_TOKEN * 256
    assert dyn == 33_655_095_296
    memory_us = (62_813_896_704 + dyn) / 3.35e12 * 1e6
    assert int(compute_us) == 15_735
    assert int(memory_us) == 28_796
    model = RooflineModel(MIXTRAL_8X7B, H100, 1)
    assert model.step_time_us(StepBatch(decode_count=256, decode_context_sum=256_000)) == 28_796


def test_moe_prefill_tokens_count_toward_step_tokens() -> None:
    # T = prefill new tokens + decode count: a step with a 100-token chunk and one decode
    # streams all 8 experts, far more than the single decode alone (2 experts).
    model = RooflineModel(MIXTRAL_8X7B, H100, 1)
    alone = model.step_time_us(StepBatch(decode_count=1, decode_context_sum=1000))
    mixed = model.step_time_us(
        StepBatch(prefill_chunks=[(0, 100)], decode_count=1, decode_context_sum=1000)
    )
    assert mixed > 3 * alone


def test_moe_expert_ffn_dim_overrides_intermediate() -> None:
    small = replace(MIXTRAL_8X7B, moe_expert_ffn_dim=1024)
    model = RooflineModel(small, H100, 1)
    attn = 32 * 41_943_040 * 2
    assert model.weight_bytes(1) == attn + 32 * 2 * (2 * 4096 * 1024) * 2


def test_fp8_weights_use_fp8_peak_and_halve_compute_bound_prefill() -> None:
    """Same llama-3.1-8b with weight_bytes_per_param = 1.0 (FP8) on H100.

    One 8192-token prefill is compute-bound: FLOPs = 8192*LIN + 8192*(8191/2)*CTX
      bf16: / (989.5e12*0.45)  -> 227_560 us
      fp8 : / (1979e12*0.45)   -> 113_780 us (exactly half the FLOP rate)
    """
    flops = 8192 * LIN_FLOPS + 8192 * (8191 / 2) * CTX_FLOPS
    bf16_us = int(flops / (989.5e12 * 0.45) * 1e6)
    fp8_us = int(flops / (1979e12 * 0.45) * 1e6)
    assert (bf16_us, fp8_us) == (227_560, 113_780)

    batch = StepBatch(prefill_chunks=[(0, 8192)])
    bf16 = RooflineModel(LLAMA31_8B, H100, 1)
    fp8 = RooflineModel(replace(LLAMA31_8B, weight_bytes_per_param=1.0), H100, 1)
    assert fp8.peak_flops == 1979e12
    assert bf16.step_time_us(batch) == 227_560
    assert fp8.step_time_us(batch) == 113_780

    # Memory-bound decode: FP8 weights are half the bytes; KV/activations stay bf16.
    #   (10_200_547_328/2 + 787_742_720 + 2_621_440) / 3.35e12 = 1758.4 us
    decode = StepBatch(decode_count=10, decode_context_sum=6000)
    assert int((WEIGHT_BYTES / 2 + 787_742_720 + 2_621_440) / 3.35e12 * 1e6) == 1758
    assert fp8.step_time_us(decode) == 1758


def test_fp8_without_fp8_tensor_cores_keeps_bf16_rate() -> None:
    fp8_model = replace(LLAMA31_8B, weight_bytes_per_param=1.0)
    a100 = RooflineModel(fp8_model, A100, 1)
    assert a100.peak_flops == 312e12
    # bytes_per_param = 1 with weight_bytes unset is also "1 byte weights" (effective width).
    int8_everything = RooflineModel(replace(LLAMA31_8B, bytes_per_param=1.0), H100, 1)
    assert int8_everything.peak_flops == 1979e12


def test_w4a16_uses_bf16_rate_and_quarter_weight_bytes() -> None:
    """W4A16: Bw = 0.5 byte/weight. Not exactly 1.0 -> BF16 peak (dequantised GEMMs).

    prefill 8192 (compute-bound): same 227_560 us as bf16
    decode 10 @ 600 (memory-bound): weights 10_200_547_328 * 0.5/2 = 2_550_136_832
      (2_550_136_832 + 787_742_720 + 2_621_440) / 3.35e12 = 997.2 us  (vs 3280 bf16)
    """
    w4 = RooflineModel(replace(LLAMA31_8B, weight_bytes_per_param=0.5), H100, 1)
    assert w4.peak_flops == 989.5e12
    assert w4.weight_bytes(1) == WEIGHT_BYTES / 4 == 2_550_136_832
    assert w4.step_time_us(StepBatch(prefill_chunks=[(0, 8192)])) == 227_560
    assert int((2_550_136_832 + 787_742_720 + 2_621_440) / 3.35e12 * 1e6) == 997
    assert w4.step_time_us(StepBatch(decode_count=10, decode_context_sum=6000)) == 997


def test_cached_prefix_context_raises_attention_cost() -> None:
    # A request whose first 4000 prompt tokens were cache hits prefills its last 96 tokens
    # with s=4000: attention and KV read use the cached context (servesim supplies it).
    model = RooflineModel(LLAMA31_8B, H100, 1)
    cold = model.step_time_us(StepBatch(prefill_chunks=[(0, 96)]))
    warm = model.step_time_us(StepBatch(prefill_chunks=[(4000, 96)]))
    assert warm > cold


def test_empty_and_tiny_batches_cost_at_least_one_us() -> None:
    model = RooflineModel(LLAMA31_8B, H100, 1)
    assert model.step_time_us(StepBatch()) == 1
    tiny = RooflineModel(
        ModelConfig("tiny", 1, 8, 1, 1, 8), GPUSpec("big", 1e6, 0.0, 1e6, 1.0, 1.0, 80.0), 1
    )
    assert tiny.step_time_us(StepBatch(decode_count=1, decode_context_sum=1)) == 1


def test_overheads_are_zero() -> None:
    model = RooflineModel(LLAMA31_8B, H100, 1)
    assert model.queueing_time_us(5000) == 0
    assert model.output_token_processing_us() == 0
    assert model.post_decode_overhead_us() == 0


# --- laws ---------------------------------------------------------------------------------


def reference_step_us(model: ModelConfig, gpu: GPUSpec, tp: int, requests: list) -> int:
    """Slow, literal docs/behaviour.md §3.1: one FLOPs/bytes evaluation per request.

    `requests` is a list of (kind, s, n) with kind "prefill" or "decode" (decode has n=1).
    """
    if not requests:
        return 1
    layers, d, heads = model.num_layers, model.hidden_dim, model.num_heads
    kv_heads = model.num_kv_heads or heads
    dh = d / heads
    dkv = kv_heads * dh
    dff = model.intermediate_dim or 4 * d
    moe = model.num_local_experts > 1
    dexp = model.moe_expert_ffn_dim if moe and model.moe_expert_ffn_dim else dff
    k = model.num_experts_per_tok if moe else 1
    b = model.bytes_per_param
    bw = model.weight_bytes_per_param or b
    peak = (gpu.tflops_fp8 if bw == 1.0 and gpu.tflops_fp8 > 0 else gpu.tflops_peak) * 1e12

    compute_s = 0.0
    dynamic = 0.0
    total_new = 0
    for kind, s, n in requests:
        ctx = s if n <= 1 else s + (n - 1) / 2
        gemm = layers * (2 * n * (d * d + 2 * d * dkv) + 2 * n * d * d)
        attn = layers * 4 * heads * n * ctx * dh
        vector = layers * (5 * heads * n * ctx + 2 * n * d)
        mlp = layers * 2 * n * (2 * d * dexp) * k
        mfu = gpu.mfu_prefill if kind == "prefill" else gpu.mfu_decode
        compute_s += (gemm + attn + vector + mlp) / (tp * peak * mfu)
        dynamic += (
            2 * layers * kv_heads * dh * b * n
            + 2 * layers * kv_heads * dh * b * s
            + layers * d * b * n
        ) / tp
        total_new += n
    n_eff = 1.0
    if moe:
        big_n = model.num_local_experts
        n_eff = big_n * (1 - ((big_n - k) / big_n) ** total_new)
    weights = layers * ((d * (d + 2 * dkv) + d * d) + 2 * d * dexp * n_eff) * bw
    memory_s = (weights / tp + dynamic) / (gpu.bw_peak_tbs * 1e12)
    return max(1, int(max(compute_s, memory_s) * 1e6))


MODELS = [
    LLAMA31_8B,
    LLAMA2_7B,
    MIXTRAL_8X7B,
    replace(LLAMA31_8B, weight_bytes_per_param=1.0),
    replace(LLAMA31_8B, weight_bytes_per_param=0.5),
]
GPUS = [H100, A100]

contexts = st.integers(min_value=0, max_value=32_768)
chunks = st.lists(
    st.tuples(contexts, st.integers(min_value=1, max_value=2048)), min_size=0, max_size=6
)
decodes = st.lists(contexts, min_size=0, max_size=300)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(GPUS),
    tp=st.sampled_from([1, 2, 4, 8]),
    prefill=chunks,
    decode_contexts=decodes,
)
def test_closed_form_matches_per_request_reference(
    model: ModelConfig, gpu: GPUSpec, tp: int, prefill: list, decode_contexts: list
) -> None:
    requests = [("prefill", s, n) for s, n in prefill] + [("decode", s, 1) for s in decode_contexts]
    expected = reference_step_us(model, gpu, tp, requests)
    batch = StepBatch(
        prefill_chunks=list(prefill),
        decode_count=len(decode_contexts),
        decode_context_sum=sum(decode_contexts),
    )
    got = RooflineModel(model, gpu, tp).step_time_us(batch)
    # Only floating-point summation order differs, which can move a truncation by 1 us.
    assert abs(got - expected) <= 1


@settings(max_examples=200, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    prefill=chunks,
    decode_contexts=decodes,
    index=st.integers(min_value=0),
    extra=st.integers(min_value=1, max_value=4096),
)
def test_step_time_non_decreasing_in_context_and_new_tokens(
    model: ModelConfig, prefill: list, decode_contexts: list, index: int, extra: int
) -> None:
    roof = RooflineModel(model, H100, 1)
    base = StepBatch(list(prefill), len(decode_contexts), sum(decode_contexts))
    t0 = roof.step_time_us(base)
    assert t0 >= 1

    # More decode context.
    more_decode_ctx = StepBatch(list(prefill), base.decode_count, base.decode_context_sum + extra)
    if base.decode_count:
        assert roof.step_time_us(more_decode_ctx) >= t0
    # One more decode request.
    one_more = StepBatch(list(prefill), base.decode_count + 1, base.decode_context_sum + extra)
    assert roof.step_time_us(one_more) >= t0
    if prefill:
        i = index % len(prefill)
        s, n = prefill[i]
        more_ctx = list(prefill)
        more_ctx[i] = (s + extra, n)
        more_new = list(prefill)
        more_new[i] = (s, n + extra)
        assert (
            roof.step_time_us(StepBatch(more_ctx, base.decode_count, base.decode_context_sum)) >= t0
        )
        assert (
            roof.step_time_us(StepBatch(more_new, base.decode_count, base.decode_context_sum)) >= t0
        )
    # One more prefill request.
    added = StepBatch(list(prefill) + [(0, extra)], base.decode_count, base.decode_context_sum)
    assert roof.step_time_us(added) >= t0


# A GPU with effectively unlimited bandwidth makes every step compute-bound, isolating FLOPs.
COMPUTE_ONLY = GPUSpec("compute-only", 989.5, 0.0, 1e12, 0.45, 0.45, 80.0)


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.integers(min_value=2, max_value=16_384),
    cuts=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=6),
)
def test_chunked_prefill_costs_the_same_flops_as_one_step(prompt: int, cuts: list) -> None:
    """Σ over chunks (s_i, n_i) of n_i*(s_i + (n_i-1)/2) = N*(N-1)/2 exactly, so splitting a
    prompt into chunks across steps prices the same total compute as one step (up to one
    truncated microsecond per step)."""
    bounds = sorted({0, prompt, *(int(c * prompt) for c in cuts)})
    pieces = [(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    roof = RooflineModel(LLAMA31_8B, COMPUTE_ONLY, 1)
    whole = roof.step_time_us(StepBatch(prefill_chunks=[(0, prompt)]))
    chunked = sum(roof.step_time_us(StepBatch(prefill_chunks=[p])) for p in pieces)
    assert whole - len(pieces) <= chunked <= whole + 1


@settings(max_examples=100, deadline=None)
@given(context=contexts)
def test_decode_priced_like_one_token_prefill_at_equal_mfu(context: int) -> None:
    # Decode is the n=1 case of the same per-request formula; only the MFU differs.
    roof = RooflineModel(LLAMA31_8B, COMPUTE_ONLY, 1)
    as_decode = roof.step_time_us(StepBatch(decode_count=1, decode_context_sum=context))
    as_prefill = roof.step_time_us(StepBatch(prefill_chunks=[(context, 1)]))
    assert abs(as_decode - as_prefill) <= 1


def test_requests_in_one_step_share_the_weights() -> None:
    # Memory-bound: two decodes in one step cost far less than two one-decode steps.
    roof = RooflineModel(LLAMA31_8B, H100, 1)
    one = roof.step_time_us(StepBatch(decode_count=1, decode_context_sum=500))
    two = roof.step_time_us(StepBatch(decode_count=2, decode_context_sum=1000))
    assert one <= two < 2 * one


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_layers": 0}, "num_layers"),
        ({"hidden_dim": -1}, "hidden_dim"),
        ({"bytes_per_param": 0.0}, "bytes_per_param"),
        ({"weight_bytes_per_param": -1.0}, "weight_bytes_per_param"),
        ({"num_local_experts": 8, "num_experts_per_tok": 0}, "num_experts_per_tok"),
        ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"num_local_experts": 0, "num_experts_per_tok": 2}, "num_experts_per_tok"),
    ],
)
def test_invalid_model_rejected(change: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        RooflineModel(replace(LLAMA31_8B, **change), H100, 1)


@pytest.mark.parametrize("field", ["tflops_peak", "bw_peak_tbs", "mfu_prefill", "mfu_decode"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_invalid_gpu_rejected(field: str, bad: float) -> None:
    with pytest.raises(ConfigError, match=field):
        RooflineModel(LLAMA31_8B, replace(H100, **{field: bad}), 1)


@pytest.mark.parametrize("tp", [0, -2, 1.5, True])
def test_invalid_tp_rejected(tp: object) -> None:
    with pytest.raises(ConfigError, match="tensor_parallelism"):
        RooflineModel(LLAMA31_8B, H100, tp)  # type: ignore[arg-type]


# --- registry -----------------------------------------------------------------------------


def test_registry_builds_roofline() -> None:
    model = build_step_time_model("roofline", LLAMA31_8B, H100, 1)
    assert isinstance(model, RooflineModel)
    assert model.step_time_us(StepBatch(prefill_chunks=[(0, 512)])) == 11884


def test_roofline_rejects_coefficients_like_blis() -> None:
    with pytest.raises(ConfigError, match="alpha_coeffs/beta_coeffs.*roofline"):
        build_step_time_model("roofline", LLAMA31_8B, H100, 1, alpha=[1, 2, 3], beta=[1, 2, 3])
    with pytest.raises(ConfigError):
        build_step_time_model("roofline", LLAMA31_8B, H100, 1, beta=[1, 2, 3])


def test_roofline_registry_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown latency model 'roofine'; valid: .*roofline"):
        build_step_time_model("roofine", LLAMA31_8B, H100, 1)


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(0, 4096),
    mean_context=st.integers(0, 200_000),
    model_gpu=st.sampled_from([(LLAMA31_8B, H100), (LLAMA2_7B, A100), (MIXTRAL_8X7B, H100)]),
    tp=st.sampled_from([1, 2, 8]),
)
def test_decode_only_step_time_is_step_time_of_a_decode_batch(count, mean_context, model_gpu, tp):
    """The closed form coalesced steps use (count, context sum) is the general formula with no
    prefill chunk, to the microsecond: prefill's terms are exact zeros."""
    model = RooflineModel(*model_gpu, tp)
    context_sum = count * mean_context
    batch = StepBatch([], count, context_sum, [], 0)
    assert model.decode_step_time_us(count, context_sum) == model.step_time_us(batch)
