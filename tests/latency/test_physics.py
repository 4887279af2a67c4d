"""`physics` step-time model: every physical term by hand, and the laws the step time obeys.

Shapes (HF config.json): Llama-2-70B L=80, d=8192, H=64, Hkv=8, dh=128, d_ff=28672,
vocab=32000; Llama-2-7B L=32, d=4096, H=Hkv=32, dh=128, d_ff=11008, vocab=32000;
Mixtral-8x7B L=32, d=4096, H=32, Hkv=8, d_ff=14336, 8 experts, 2 per token. BF16: 2 bytes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.errors import ConfigError
from simulator.latency import build_step_time_model
from simulator.latency.base import StepBatch, StepTimeModel
from simulator.latency.physics import (
    PhysicsCoefficients,
    PhysicsModel,
    causal_pairs,
    coefficients_document,
    interconnect_gb_per_s,
    load_coefficients_file,
    model_shape,
    price_terms,
)

H100 = get_gpu("H100")
LLAMA2_70B = load_model("llama-2-70b-hf")
LLAMA2_7B = load_model("llama-2-7b-hf")
MIXTRAL = load_model("mixtral-8x7b-v0.1")
# Zero overheads and unit efficiencies leave only the physical terms at peak rates.
BARE = PhysicsCoefficients(
    bandwidth_efficiency=1.0,
    kv_bandwidth_efficiency=1.0,
    prefill_compute_efficiency=1.0,
    decode_compute_efficiency=1.0,
    interconnect_efficiency=1.0,
    allreduce_latency_us=0.0,
    per_layer_overhead_us=0.0,
    per_step_overhead_us=0.0,
    per_sequence_overhead_us=0.0,
    single_process_overhead_us=0.0,
    request_overhead_us=0.0,
    gemm_fixed_rows=0.0,
    gemm_ridge_exponent=0.0,  # the sharp roofline; test_a_gemm_near_its_ridge_* prices p
    output_lag_steps=0.0,
)


def test_llama2_70b_tp4_weight_bytes_per_gpu() -> None:
    # Attention per layer: Q (8192x8192) + K, V (8192x1024 each) + O (8192x8192)
    attention = 8192 * (8192 + 2 * 1024) + 8192 * 8192  # 150,994,944
    # SwiGLU: gate, up (8192x28672) and down (28672x8192)
    mlp = 3 * 8192 * 28672  # 704,643,072
    lm_head = 32000 * 8192  # 262,144,000
    per_gpu_bytes = (80 * (attention + mlp) + lm_head) * 2 / 4
    assert per_gpu_bytes == 34_356_592_640
    shape = model_shape(LLAMA2_70B, 4)
    streamed = shape.attention_weight_bytes + shape.expert_weight_bytes + shape.lm_head_bytes
    assert streamed == per_gpu_bytes
    # The embedding table is not streamed: only the looked-up rows (8192 x 2 bytes each).
    assert shape.embedding_row_bytes == 8192 * 2


def test_llama2_7b_tp1_weight_bytes() -> None:
    attention = 4 * 4096 * 4096
    mlp = 3 * 4096 * 11008
    shape = model_shape(LLAMA2_7B, 1)
    assert shape.attention_weight_bytes + shape.expert_weight_bytes == 32 * (attention + mlp) * 2
    assert shape.lm_head_bytes == 32000 * 4096 * 2  # untied LM head


def test_llama2_70b_tp4_allreduce_bytes_per_layer() -> None:
    # Two all-reduces per layer, each of one hidden vector per token: 2 x 8192 x 2 bytes.
    shape = model_shape(LLAMA2_70B, 4)
    assert 2 * shape.allreduce_bytes_per_token == 32_768
    # Ring all-reduce moves 2(tp-1)/tp = 1.5 x the payload per GPU, over 450 GB/s NVLink.
    m = PhysicsModel(LLAMA2_70B, H100, 4, BARE)
    assert interconnect_gb_per_s(H100) == 450.0
    assert m.allreduce_s_per_token == pytest.approx(80 * 32_768 * 1.5 / 450e9)
    # 160 all-reduces (2 per layer), each 2 x (4 - 1) = 6 ring latency steps.
    assert m.collectives == 160 * 6
    assert PhysicsModel(LLAMA2_7B, H100, 1, BARE).collectives == 0


def test_kv_bytes_per_token_per_gpu() -> None:
    # K and V, 80 layers, 8 KV heads split over 4 GPUs, 128 dims, 2 bytes.
    assert model_shape(LLAMA2_70B, 4).kv_bytes_per_token == 2 * 80 * 2 * 128 * 2
    # With more GPUs than KV heads every GPU keeps one head's replica.
    assert model_shape(LLAMA2_70B, 16).kv_bytes_per_token == 2 * 80 * 1 * 128 * 2


def test_linear_and_attention_flops() -> None:
    shape = model_shape(LLAMA2_7B, 1)
    params = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert shape.linear_flops_per_token == 2 * params
    # QK^T and AV: 2 x 2 FLOPs x 32 heads x 128 dims per (query, key) pair per layer.
    assert shape.attention_flops_per_pair == 32 * 2 * 2 * 32 * 128
    assert shape.lm_head_flops_per_sequence == 2 * 32000 * 4096


def test_causal_pairs() -> None:
    # 3 new tokens after 10 cached ones: each sees the 10, plus 1, 2, 3 of the new ones.
    assert causal_pairs(10, 3) == 30 + 6
    assert causal_pairs(0, 1) == 1


def test_moe_touches_experts_the_tokens_route_to() -> None:
    m = PhysicsModel(MIXTRAL, H100, 2, BARE)
    # One token picks 2 of 8 experts; uniform routing of T tokens: 8(1 - (6/8)^T).
    assert m.expected_experts(1) == pytest.approx(2.0)
    assert m.expected_experts(2) == pytest.approx(8 * (1 - 0.75**2))
    assert m.expected_experts(10_000) == pytest.approx(8.0)
    # Only the 2 routed experts' MLP FLOPs are spent per token.
    shape = model_shape(MIXTRAL, 2)
    attention = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    assert (
        shape.linear_flops_per_token == 2 * 32 * (attention + 2 * 3 * 4096 * 14336 + 4096 * 8) / 2
    )


def test_decode_step_by_hand() -> None:
    """One decode token with 99 tokens of context on Llama-2-7B TP1, bare coefficients."""
    m = PhysicsModel(LLAMA2_7B, H100, 1, BARE)
    weights = 32 * (4 * 4096**2 + 3 * 4096 * 11008) * 2 + 32000 * 4096 * 2 + 4096 * 2
    kv = 2 * 32 * 32 * 128 * 2 * (99 + 1)  # read 99, write 1
    memory_s = (weights + kv) / 3.35e12
    terms = m.terms(StepBatch([], 1, 99))
    assert terms.memory_s + terms.kv_memory_s == pytest.approx(memory_s)
    assert terms.kv_memory_s == pytest.approx(kv / 3.35e12)
    # The GEMMs (every weight matrix and the LM head) and the attention (100 pairs) are priced
    # apart: they are different kernels.
    assert terms.decode_compute_s == pytest.approx(
        (m.shape.linear_flops_per_token + 2 * 32000 * 4096) / 989.5e12
    )
    assert terms.decode_attention_s == pytest.approx(
        m.shape.attention_flops_per_pair * 100 / 989.5e12
    )
    # Both kernel classes are memory-bound: the step is the weights' time plus the KV's.
    assert m.step_time_us(StepBatch([], 1, 99)) == int(memory_s * 1e6)


def test_overheads_add_to_the_gpu_time() -> None:
    c = replace(
        BARE, per_step_overhead_us=1000, per_layer_overhead_us=10, per_sequence_overhead_us=20
    )
    bare = PhysicsModel(LLAMA2_70B, H100, 4, BARE)
    with_overheads = PhysicsModel(LLAMA2_70B, H100, 4, c)
    batch = StepBatch([], 8, 8 * 500)
    extra_us = 1000 + 80 * 10 + 8 * 20
    assert with_overheads.step_time_us(batch) - bare.step_time_us(batch) == pytest.approx(
        extra_us, abs=1
    )


def test_single_process_overhead_only_without_tensor_parallelism() -> None:
    """tp == 1 runs the model runner in the engine-core process: its step pays
    `single_process_overhead_us` once (here 2000 µs: 2 ms); tp 2 and 4 do not."""
    c = replace(BARE, single_process_overhead_us=2000)
    batch = StepBatch([], 8, 8 * 500)
    for model, tp, extra_us in ((LLAMA2_7B, 1, 2000), (MIXTRAL, 2, 0), (LLAMA2_70B, 4, 0)):
        with_it, without = PhysicsModel(model, H100, tp, c), PhysicsModel(model, H100, tp, BARE)
        assert with_it.terms(batch).single_process == (1 if tp == 1 else 0)
        assert with_it.step_time_us(batch) - without.step_time_us(batch) == pytest.approx(
            extra_us, abs=1
        )


def test_allreduce_latency_is_charged_per_ring_step() -> None:
    """160 all-reduces (2 per layer x 80 layers); a ring over 4 GPUs takes 2 x (4 - 1) = 6
    latency steps each: 960 x 10 µs = 9.6 ms. Mixtral on 2 GPUs: 64 x 2 x 1 x 10 µs."""
    c = replace(BARE, allreduce_latency_us=10)
    batch = StepBatch([], 4, 400)
    for model, tp, steps in ((LLAMA2_70B, 4, 160 * 6), (MIXTRAL, 2, 64 * 2), (LLAMA2_7B, 1, 0)):
        delta = PhysicsModel(model, H100, tp, c).step_time_us(batch) - PhysicsModel(
            model, H100, tp, BARE
        ).step_time_us(batch)
        assert delta == pytest.approx(steps * 10, abs=1)


def test_each_kernel_class_is_the_slower_of_its_stream_and_its_arithmetic() -> None:
    """A 2,048-token prefill chunk: the GEMMs are compute-bound (2,048 rows) and so is the
    causal attention (2,048 x 2,049 / 2 pairs against writing 2,048 tokens of KV), so the
    step is the sum of the two compute times."""
    m = PhysicsModel(LLAMA2_7B, H100, 1, BARE)
    prefill = m.terms(StepBatch([(0, 2048)], 0, 0))
    assert prefill.prefill_compute_s > prefill.memory_s
    assert prefill.prefill_attention_s > prefill.kv_memory_s
    assert prefill.prefill_attention_s == pytest.approx(
        m.shape.attention_flops_per_pair * 2048 * 2049 / 2 / 989.5e12
    )
    both = prefill.prefill_compute_s + prefill.prefill_attention_s
    assert price_terms(prefill, BARE) == pytest.approx(both)
    # Halving the compute efficiency doubles a compute-bound step.
    slow = replace(BARE, prefill_compute_efficiency=0.5)
    assert price_terms(prefill, slow) == pytest.approx(2 * both)


def test_decode_kv_reads_do_not_hide_under_a_prefill_chunk() -> None:
    """A mixed step: one 1,000-token prompt beside 200 decodes of 1,000 tokens of context each.
    The GEMMs over 1,200 rows are compute-bound and hide the weight stream; the attention
    kernels then stream 200 x 1,001 tokens of KV (plus the prompt's 1,000 written), which the
    GEMMs' arithmetic does not hide: the step costs the GEMMs' compute plus the KV stream."""
    m = PhysicsModel(LLAMA2_7B, H100, 1, BARE)
    t = m.terms(StepBatch([(0, 1000)], 200, 200 * 1000))
    gemm_s = t.prefill_compute_s + t.decode_compute_s
    assert gemm_s > t.memory_s
    # 2 (K, V) x 32 layers x 32 heads x 128 dims x 2 bytes = 512 KiB per token.
    kv_bytes = (200 * 1000 + 1000 + 200) * 2 * 32 * 32 * 128 * 2
    assert t.kv_memory_s == pytest.approx(kv_bytes / 3.35e12)
    assert t.kv_memory_s > t.prefill_attention_s + t.decode_attention_s
    assert price_terms(t, BARE) == pytest.approx(gemm_s + t.kv_memory_s)
    # Priced as one roofline over the whole step the KV stream would have hidden:
    one_roofline_s = max(
        t.memory_s + t.kv_memory_s,
        gemm_s + t.prefill_attention_s + t.decode_attention_s,
    )
    assert price_terms(t, BARE) > one_roofline_s


def test_a_gemm_near_its_ridge_is_the_p_norm_of_its_stream_and_its_arithmetic() -> None:
    """Llama-2-7B TP1 decoding 295 sequences: its GEMMs stream 13.5 GB of weights (4.0 ms at
    3.35 TB/s) and compute 295 x 13.5 GFLOP (4.0 ms at 989.5 TFLOP/s): the ridge, where the
    sharp roofline says 4.0 ms and a real GEMM keeps neither unit fully busy. With
    gemm_ridge_exponent p the GEMMs take (stream^p + arithmetic^p)^(1/p): at the ridge
    2^(1/3) = 1.26 x the maximum for p = 3 (79 % of the roofline), the sum for p = 1, the
    maximum for p = 0. A batch of one, 295x below the ridge, is the stream to 1e-7."""
    m = PhysicsModel(LLAMA2_7B, H100, 1, BARE)
    t = m.terms(StepBatch([], 295, 295 * 100))
    stream, arithmetic = t.memory_s, t.decode_compute_s
    assert arithmetic / stream == pytest.approx(1.0, abs=0.02)
    attention = max(t.kv_memory_s, t.decode_attention_s)
    for p, gemm in (
        (0, max(stream, arithmetic)),
        (1, stream + arithmetic),
        (3, (stream**3 + arithmetic**3) ** (1 / 3)),
    ):
        priced = price_terms(t, replace(BARE, gemm_ridge_exponent=p))
        assert priced == pytest.approx(gemm + attention)
    sharp = price_terms(t, BARE)
    assert price_terms(t, replace(BARE, gemm_ridge_exponent=3)) - attention == pytest.approx(
        2 ** (1 / 3) * (sharp - attention), rel=0.01
    )
    one = m.terms(StepBatch([], 1, 100))
    assert price_terms(one, replace(BARE, gemm_ridge_exponent=3)) == pytest.approx(
        price_terms(one, BARE), rel=1e-7
    )
    # The law: never faster than the sharp roofline, and slower the blunter the ridge.
    times = [price_terms(t, replace(BARE, gemm_ridge_exponent=p)) for p in (0, 8, 4, 3, 2, 1)]
    assert times == sorted(times)
    with pytest.raises(ConfigError, match="gemm_ridge_exponent: invalid value 0.5"):
        replace(BARE, gemm_ridge_exponent=0.5).check()


def test_the_shipped_vllm_0_23_fit_reproduces_the_saturated_step_structure() -> None:
    """What the saturated 24 req/s cell of the vLLM 0.23 measurements (Qwen3-14B, one H100)
    shows step by step, read from its trace.csv (first-chunk times of the requests admitted
    together, t = 300-330 s) and summary.json: with ~250 requests decoding at ~1,050 tokens
    of context, a step that also prefills eight 986-token prompts lasts ~360 ms (cohorts of
    eight first tokens 357-372 ms apart), one that prefills one prompt ~74 ms (single first
    tokens 73-77 ms apart), and a decode-only step ~31 ms (ITL p50 31.2 ms). The fit saw only
    the w5 cells' E2E, TTFT and, in the saturated cells, ITL p50 — not these step times. The
    decode-only step is the loosest (+13 %): the fit trades it against the mixed steps."""
    qwen = load_model("qwen/qwen3-14b")
    m = PhysicsModel(qwen, H100, 1, vllm_version="0.23.0")
    assert m.source.fit_vllm == "0.23.0"
    eight_us = m.step_time_us(StepBatch([(0, 986)] * 8, 248, 248 * 1050))
    one_us = m.step_time_us(StepBatch([(0, 986)], 250, 250 * 1050))
    decode_us = m.step_time_us(StepBatch([], 255, 255 * 1050))
    assert eight_us == pytest.approx(360_000, rel=0.10)
    assert one_us == pytest.approx(74_000, rel=0.10)
    assert decode_us == pytest.approx(31_200, rel=0.15)
    # The law behind it: a prompt's GEMMs do not hide the decoders' KV stream, so a mixed
    # step costs at least the decode-only step plus the prompt's GEMM arithmetic alone.
    t = m.terms(StepBatch([(0, 986)], 250, 250 * 1050))
    prompt_gemm_us = t.prefill_compute_s / m.coefficients.prefill_compute_efficiency * 1e6
    assert one_us >= m.step_time_us(StepBatch([], 250, 250 * 1050)) + 0.9 * prompt_gemm_us


def test_moderate_decode_batches_cannot_tell_the_decode_efficiency() -> None:
    """Why its physical default could be revised (docs/latency-models.md): under the sharp
    roofline a decode-only step of up to 64 sequences is memory-bound in its GEMMs for the
    0.15.1 models at their TP, so it costs the same at decode efficiency 0.3 and 0.6. With the
    GEMM ridge's p-norm (p = 3) batches of one and eight still cannot tell (within 0.5 %: the
    arithmetic is far below the stream), but 32-64 rows at efficiency 0.3 approach the ridge
    and cost more (70B TP4 at 64 sequences 7 % more). At 256 sequences (the vLLM 0.23
    saturated cells, an overloaded server) 70B's GEMMs become compute-bound at 0.3."""
    low = replace(PhysicsCoefficients(), decode_compute_efficiency=0.3)
    high = replace(PhysicsCoefficients(), decode_compute_efficiency=0.6)
    for model, tp in ((LLAMA2_7B, 1), (LLAMA2_70B, 4), (MIXTRAL, 2)):
        for batch in (1, 8, 32, 64):
            step = StepBatch([], batch, batch * 1000)
            sharp_low, sharp_high = (
                PhysicsModel(model, H100, tp, replace(c, gemm_ridge_exponent=0)).step_time_us(step)
                for c in (low, high)
            )
            assert sharp_low == sharp_high, (model.name, batch)
            blunt_low, blunt_high = (
                PhysicsModel(model, H100, tp, c).step_time_us(step) for c in (low, high)
            )
            assert blunt_low >= blunt_high
            if batch <= 8:
                assert blunt_low == pytest.approx(blunt_high, rel=0.005), (model.name, batch)
    seventy = StepBatch([], 64, 64 * 1000)
    assert PhysicsModel(LLAMA2_70B, H100, 4, low).step_time_us(seventy) > 1.05 * (
        PhysicsModel(LLAMA2_70B, H100, 4, high).step_time_us(seventy)
    )
    big = StepBatch([], 256, 256 * 1750)
    slow = PhysicsModel(LLAMA2_70B, H100, 4, low).step_time_us(big)
    assert slow > PhysicsModel(LLAMA2_70B, H100, 4, high).step_time_us(big)


def test_kv_reads_stream_at_their_own_efficiency() -> None:
    """Halving the KV bandwidth efficiency adds exactly the KV time once more (memory-bound)."""
    m = PhysicsModel(LLAMA2_7B, H100, 1, BARE)
    decode = m.terms(StepBatch([], 64, 64 * 1000))
    slow_kv = replace(BARE, kv_bandwidth_efficiency=0.5)
    assert price_terms(decode, slow_kv) - price_terms(decode, BARE) == pytest.approx(
        decode.kv_memory_s
    )
    # 64 requests x 1001 tokens x 2 x 32 layers x 32 heads x 128 dims x 2 bytes.
    assert decode.kv_memory_s == pytest.approx(64 * 1001 * 2 * 32 * 32 * 128 * 2 / 3.35e12)


def test_gemm_fixed_rows_cost_one_row_through_every_touched_weight() -> None:
    """64 fixed rows cost what 64 tokens' GEMMs cost; MoE pays them on every touched expert."""
    rows = replace(BARE, gemm_fixed_rows=64.0)
    dense = PhysicsModel(LLAMA2_7B, H100, 1, rows)
    prefill = dense.terms(StepBatch([(0, 2048)], 0, 0))
    one_row_flops = 2 * (32 * (4 * 4096**2 + 3 * 4096 * 11008) + 32000 * 4096)
    assert prefill.weight_row_compute_s == pytest.approx(one_row_flops / 989.5e12)
    assert price_terms(prefill, rows) - price_terms(prefill, BARE) == pytest.approx(
        64 * one_row_flops / 989.5e12
    )
    # Mixtral: a 2048-token step touches all 8 experts but computes only 2 per token, so the
    # fixed rows weigh 4x more against its FLOPs than against a dense model's.
    moe = PhysicsModel(MIXTRAL, H100, 2, rows).terms(StepBatch([(0, 2048)], 0, 0))
    moe_share = moe.weight_row_compute_s / moe.prefill_compute_s
    dense_share = prefill.weight_row_compute_s / prefill.prefill_compute_s
    assert moe_share > 2.5 * dense_share


def test_mixed_batch_streams_weights_once() -> None:
    """Prefill and decode in one forward pass: less than pricing them as two steps."""
    m = PhysicsModel(LLAMA2_7B, H100, 1)
    mixed = m.step_time_us(StepBatch([(0, 64)], 16, 16 * 500))
    apart = m.step_time_us(StepBatch([(0, 64)], 0, 0)) + m.step_time_us(StepBatch([], 16, 8000))
    assert mixed < apart


def test_step_time_grows_with_batch_and_context() -> None:
    m = PhysicsModel(LLAMA2_70B, H100, 4)
    assert m.step_time_us(StepBatch([], 8, 8000)) < m.step_time_us(StepBatch([], 16, 16000))
    assert m.step_time_us(StepBatch([], 8, 800)) < m.step_time_us(StepBatch([], 8, 80_000))
    assert m.step_time_us(StepBatch([(0, 100)], 0, 0)) < m.step_time_us(
        StepBatch([(0, 1000)], 0, 0)
    )


def test_other_gpus_use_the_h100_fit_transferred_and_say_so() -> None:
    # The fit's efficiencies are fractions of a GPU's own peaks and its overheads are vLLM's
    # CPU-side costs, so they carry over; the provenance must not claim the GPU was measured.
    for gpu in ("A100-SXM", "L40S", "H200", "B200"):
        m = PhysicsModel(LLAMA2_7B, get_gpu(gpu), 1)
        assert m.coefficients_source.startswith("transferred from the H100 fit")
        provenance = m.provenance()
        assert provenance["gpu_covered_by_fit"] is False
        assert provenance["fit_gpu"] == "H100"
        assert m.step_time_us(StepBatch([], 4, 400)) > 1
    assert PhysicsModel(LLAMA2_7B, H100, 1).provenance()["gpu_covered_by_fit"] is True


def test_a_gpu_entry_named_as_the_fits_gpu_with_other_figures_is_not_calibrated() -> None:
    """A GPU file's "H100" with half the FLOPS and 60 % of the bandwidth is priced with the fit
    transferred, and says so (QA: it claimed "calibrated for this GPU"); an entry with the
    built-in figures stays calibrated."""
    other = replace(H100, tflops_peak=500.0, bw_peak_tbs=2.0, source="GPU file 'h100.yaml'")
    provenance = PhysicsModel(LLAMA2_7B, other, 1).provenance()
    assert provenance["source"] == "transferred"
    assert provenance["gpu_covered_by_fit"] is False
    assert "differ from the built-in H100" in provenance["coefficients"]
    same = replace(H100, source="GPU file 'h100.yaml'")
    assert PhysicsModel(LLAMA2_7B, same, 1).provenance()["gpu_covered_by_fit"] is True
    # Memory and the roofline's MFU are not what physics prices a step from.
    other_memory = replace(H100, memory_gib=79.6, mfu_decode=0.2, source="GPU file 'h100.yaml'")
    assert PhysicsModel(LLAMA2_7B, other_memory, 1).provenance()["gpu_covered_by_fit"] is True


def test_coefficients_file_round_trip_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "c.yaml"
    good.write_text("latency_model: physics\ncoefficients:\n  per_step_overhead_us: 123\n")
    assert load_coefficients_file(good).per_step_overhead_us == 123
    assert (
        load_coefficients_file(good).bandwidth_efficiency
        == PhysicsCoefficients().bandwidth_efficiency
    )
    bad_name = tmp_path / "n.yaml"
    bad_name.write_text("coefficients:\n  bandwith_efficiency: 0.5\n")
    with pytest.raises(ConfigError, match="unknown coefficient 'bandwith_efficiency'"):
        load_coefficients_file(bad_name)
    bad_value = tmp_path / "v.yaml"
    bad_value.write_text("coefficients:\n  bandwidth_efficiency: 1.5\n")
    with pytest.raises(
        ConfigError, match=r"bandwidth_efficiency: invalid value 1.5; must be a number in \(0, 1\]"
    ):
        load_coefficients_file(bad_value)
    missing = tmp_path / "m.yaml"
    missing.write_text("latency_model: physics\n")
    with pytest.raises(ConfigError, match="missing key 'coefficients'"):
        load_coefficients_file(missing)


def test_coeffs_file_only_for_physics(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("coefficients: {}\n")
    m = build_step_time_model("physics", LLAMA2_7B, H100, 1, coeffs_file=path)
    assert m.coefficients_source == f"given (file {str(path)!r})"
    # A file an older calibrate wrote (version 1) was fitted for the single-roofline step: it
    # loads, and the run's provenance says to refit it; the current version says nothing.
    old = tmp_path / "old.yaml"
    old.write_text("version: 1\nlatency_model: physics\ncoefficients: {}\n")
    m = build_step_time_model("physics", LLAMA2_7B, H100, 1, coeffs_file=old)
    assert "file version 1" in m.coefficients_source
    assert "refit with servesim calibrate" in m.coefficients_source
    # A version-2 file was fitted with the sharp GEMM roofline: without the key it reads as
    # exponent 0, and says so; a version-3 file (or one with no version) takes the default.
    sharp = tmp_path / "sharp.yaml"
    sharp.write_text("version: 2\nlatency_model: physics\ncoefficients: {}\n")
    assert load_coefficients_file(sharp).gemm_ridge_exponent == 0
    m = build_step_time_model("physics", LLAMA2_7B, H100, 1, coeffs_file=sharp)
    assert "read with gemm_ridge_exponent 0" in m.coefficients_source
    assert m.provenance()["gemm_ridge_exponent"] == 0
    assert load_coefficients_file(path).gemm_ridge_exponent == 3
    current = tmp_path / "current.yaml"
    current.write_text(yaml.safe_dump(coefficients_document(PhysicsCoefficients())))
    assert yaml.safe_load(current.read_text())["version"] == 3
    m = build_step_time_model("physics", LLAMA2_7B, H100, 1, coeffs_file=current)
    assert m.coefficients_source == f"given (file {str(current)!r})"
    with pytest.raises(ConfigError, match="latency.coeffs_file: .* only latency model physics"):
        build_step_time_model("roofline", LLAMA2_7B, H100, 1, coeffs_file=path)
    with pytest.raises(ConfigError, match="alpha_coeffs/beta_coeffs"):
        build_step_time_model("physics", LLAMA2_7B, H100, 1, alpha=[1, 2, 3], beta=[1, 2, 3])


def test_request_delay_is_the_client_path_and_the_lag_is_steps_in_flight() -> None:
    """Before queueing only the client path (HTTP, tokenisation) is charged; the output lag is
    handed to the instance as a number of in-flight steps (priced there, at the load then)."""
    c = replace(BARE, request_overhead_us=2500, output_lag_steps=1.0, per_step_overhead_us=1000)
    m = PhysicsModel(LLAMA2_7B, H100, 1, c)
    assert m.queueing_time_us(700) == 2500
    assert m.queueing_time_us(700) == m.queueing_time_us(10)  # independent of the prompt
    assert m.scheduling_lag_steps() == 1.0
    assert (
        PhysicsModel(LLAMA2_7B, H100, 1, replace(c, output_lag_steps=0.0)).scheduling_lag_steps()
        == 0
    )


def test_a_request_arriving_mid_step_misses_the_step_already_scheduled(tmp_path: Path) -> None:
    """vLLM V1's async scheduler plans step N+1 while step N runs. Constant 10 ms steps, lag 1,
    no client path. Request 0 arrives at 0 on an idle instance: no step in flight, so it runs
    in the step [0, 10) and its first token is at 10 ms. Request 1 arrives at 3 ms, during
    that step: at 10 ms the step [10, 20) is planned without it, then it is queued; it joins
    the step [20, 30): TTFT = 30 - 3 = 27 ms, i.e. the 7 ms left of step N, the whole step
    N+1 and its own step. Without the lag it would join [10, 20): TTFT 17 ms."""
    from simulator.api import replay
    from simulator.latency.base import StepTimeModel

    class Constant(StepTimeModel):
        name = "constant-lag-test"

        def __init__(self, lag: float) -> None:
            self.lag = lag

        def step_time_us(self, batch: StepBatch) -> int:
            return 10_000

        def scheduling_lag_steps(self) -> float:
            return self.lag

    data = tmp_path / "r.csv"
    data.write_text(
        "index,arrival_time_us,input_tokens,output_tokens,prefix_group,has_error,ttft_s,e2e_s\n"
        "0,0,16,20,,0,0.01,0.2\n1,3000,16,2,,0,0.01,0.1\n"
    )
    ttft_ms = {}
    for lag in (1.0, 0.0):

        def swap(deployment, lag=lag):
            deployment.step_model = Constant(lag)

        result = replay(None, data, on_deployment=swap, model="llama-2-7b-hf", hardware="H100")
        by_index = {r.index: r for r in result.request_records}
        ttft_ms[lag] = [
            (r.first_token_us - r.arrival_us) / 1000 for r in (by_index[0], by_index[1])
        ]
    assert ttft_ms[1.0] == [10.0, 27.0]
    assert ttft_ms[0.0] == [10.0, 17.0]


class _PrefillSlow(StepTimeModel):
    """40 ms for a step that computes a prompt chunk, 10 ms for a decode-only step."""

    name = "prefill-slow-lag-test"

    def __init__(self, lag: float) -> None:
        self.lag = lag

    def step_time_us(self, batch: StepBatch) -> int:
        return 40_000 if batch.prefill_chunks else 10_000

    def scheduling_lag_steps(self) -> float:
        return self.lag


def _ttft_ms(tmp_path: Path, rows: str, lag: float) -> list[float]:
    from simulator.api import replay

    data = tmp_path / f"r{lag}.csv"
    data.write_text(
        "index,arrival_time_us,input_tokens,output_tokens,prefix_group,has_error,ttft_s,e2e_s\n"
        + rows
    )

    def swap(deployment):
        deployment.step_model = _PrefillSlow(lag)

    result = replay(None, data, on_deployment=swap, model="llama-2-7b-hf", hardware="H100")
    return [(r.first_token_us - r.arrival_us) / 1000 for r in result.request_records]


def test_the_lag_is_the_rest_of_the_step_and_the_planned_one_whatever_their_lengths(tmp_path):
    """Request 0 arrives at 0 on an idle instance: its prefill step is [0, 40), then decode
    steps of 10 ms. Request 1 arrives at 30 ms, during the prefill step: at 40 ms the decode
    step [40, 50) is planned without it, then it is queued, and it joins the step planned at
    50 ms, which computes its prompt: [50, 90). TTFT = 90 - 30 = 60 ms = the 10 ms left of
    step N + the 10 ms of step N+1 + its own 40 ms step. (Charging the duration of the step
    in flight instead, 40 ms, would reach the scheduler at 70 ms and join [70, 110): TTFT 80
    ms, two decode steps too late.) Without a lag it joins the plan at 40 ms: [40, 80), 50 ms."""
    rows = "0,0,16,20,,0,0.04,0.3\n1,30000,16,2,,0,0.06,0.1\n"
    assert _ttft_ms(tmp_path, rows, 1.0) == [40.0, 60.0]
    assert _ttft_ms(tmp_path, rows, 0.0) == [40.0, 50.0]


def test_a_lagged_request_joins_at_once_when_nothing_is_planned(tmp_path):
    """Request 0 has one output token: it finishes with its prefill step [0, 40) and nothing is
    planned after it. Request 1, arriving at 30 ms, has no planned step to miss: it is queued
    at 40 ms and computed in [40, 80): TTFT 50 ms, as without a lag."""
    rows = "0,0,16,1,,0,0.04,0.04\n1,30000,16,2,,0,0.05,0.1\n"
    assert _ttft_ms(tmp_path, rows, 1.0) == [40.0, 50.0]


def test_the_lag_is_a_whole_number_of_steps() -> None:
    with pytest.raises(ConfigError, match="output_lag_steps: invalid value 0.5; must be a whole"):
        replace(BARE, output_lag_steps=0.5).check()
    assert replace(BARE, output_lag_steps=2.0).check().output_lag_steps == 2.0


def test_physical_defaults_reproduce_the_public_batch_one_anchor() -> None:
    """The default per-step overhead comes from one public measurement (docs/latency-models.md):
    Llama-3.1-8B-Instruct, BF16, one H100-80GB, vLLM V1, one request at a time, short prompts:
    6.48 ms per output token. The defaults must give it back (within the anchor's ~2 %).

    By hand, a lone decode at 300 tokens of context (TP1, so no collectives):
      weights streamed = 32 layers x (4096 x (4096 + 2 x 1024) + 4096 x 4096     attention
                                      + 3 x 4096 x 14336)                     MLP
                         + 128256 x 4096 LM head = 7.504e9 params x 2 B = 15.01 GB
      + one embedding row 4096 x 2 B                        -> 15.01 GB / 3.35 TB/s = 4.480 ms
      KV = 2 x 32 x 8 x 128 x 2 B = 128 KiB per token x 301 -> 39.5 MB / 3.35 TB/s = 0.0118 ms
      step = 4.480 / 0.8 + 0.0118 / 0.8 + 500 µs + 32 x 10 µs + 1 x 5 µs = 6.440 ms
    under the sharp roofline. With the GEMM ridge (p = 3) the GEMMs' arithmetic, one row plus
    gemm_fixed_rows 64 at 2 x 7.504e9 FLOP each, 65 x 15.01 GFLOP / (989.5 TFLOP/s x 0.6) =
    1.643 ms against the stream's 5.600 ms, adds 5.600 x ((1 + (1.643 / 5.600)^3)^(1/3) - 1)
    = 0.047 ms: 6.487 ms (6.486 with the exact terms), against 6.48 measured.
    """
    c = PhysicsCoefficients()
    assert (c.bandwidth_efficiency, c.kv_bandwidth_efficiency) == (0.80, 0.80)
    assert (c.per_step_overhead_us, c.per_layer_overhead_us, c.per_sequence_overhead_us) == (
        500.0,
        10.0,
        5.0,
    )
    m = PhysicsModel(load_model("llama-3.1-8b-instruct"), H100, 1, c)
    terms = m.terms(StepBatch([], 1, 300))
    assert terms.memory_s == pytest.approx(15.01e9 / 3.35e12, rel=1e-3)
    assert terms.kv_memory_s == pytest.approx(131072 * 301 / 3.35e12, rel=1e-9)
    step_ms = m.step_time_us(StepBatch([], 1, 300)) / 1000
    assert step_ms == pytest.approx(6.486, abs=0.002)
    sharp = PhysicsModel(
        load_model("llama-3.1-8b-instruct"), H100, 1, replace(c, gemm_ridge_exponent=0)
    )
    assert sharp.step_time_us(StepBatch([], 1, 300)) / 1000 == pytest.approx(6.440, abs=0.002)
    assert step_ms == pytest.approx(6.48, rel=0.02)  # the public measurement


# (model, gpu, tp, dp, ep): dense, GQA with an explicit head_dim, MoE, MoE with FP8 experts
# beside BF16 attention, MLA with expert parallelism over DP ranks.
DECODE_CASES = [
    ("meta-llama/llama-3.1-8b-instruct", "H100", 1, 1, 1),
    ("meta-llama/llama-3.1-70b-instruct", "H100", 4, 1, 1),
    ("qwen/qwen3-14b", "H100", 2, 1, 1),
    ("mistralai/mixtral-8x7b-v0.1", "A100-80", 2, 1, 1),
    ("redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic", "H100", 4, 1, 1),
    ("deepseek-ai/DeepSeek-V3", "H200", 8, 2, 16),
    ("qwen/qwen3-30b-a3b", "H100", 2, 2, 1),  # experts sliced over both ranks (no EP)
]


@settings(max_examples=200, deadline=None)
@given(
    case=st.sampled_from(DECODE_CASES),
    decodes=st.integers(0, 600),
    mean_context=st.integers(0, 40_000),
)
def test_the_decode_only_price_is_the_general_price_to_the_bit(case, decodes, mean_context):
    """Law: `decode_step_time_us` (the steady steps' direct path) equals `step_time_us` of the
    same decode-only batch for every shape and layout it serves, and falls back to it for the
    others (pipelines, windows)."""
    from simulator.latency.parallel import Parallelism

    name, gpu, tp, dp, ep = case
    model = PhysicsModel(
        load_model(name), get_gpu(gpu), tp, parallelism=Parallelism(tp, dp=dp, ep=ep)
    )
    context_sum = decodes * mean_context
    general = model.step_time_us(StepBatch([], decodes, context_sum, [], 0))
    assert model.decode_step_time_us(decodes, context_sum) == general


@pytest.mark.parametrize(
    "spelling",
    [
        "{v}",
        "v{v}",
        "{v}.0",
        "{v}rc1",
        "{v}.dev2",
        "{v}.post1",
        "{v}+cu128",
        "vllm/vllm-openai:v{v}",
    ],
)
def test_every_spelling_of_a_fitted_release_chooses_its_fit(spelling):
    """A version names a release (PEP 440): `0.23` is `0.23.0`, and a pre-release, dev build or
    local build (`0.23.0rc1`, `0.23.0+cu128`, as vLLM reports its CUDA wheels) runs that
    release's code. Each spelling of each shipped fit's version chooses that fit, and says no
    more about it than the plain version does; reading only all-digit parts took `0.23` and
    `0.23.0+cu128` for an older release and chose the 0.15.1 fit."""
    from simulator.latency.physics import calibrations, choose_calibration, default_coefficients

    for gpu, by_version in calibrations().items():
        for fitted in by_version:
            given = spelling.format(v=fitted.removesuffix(".0"))
            assert choose_calibration(gpu, given)[1] == fitted, given
            coefficients, source = default_coefficients(get_gpu(gpu), given)
            assert source.fit_vllm == fitted and "nearest" not in source.note, given
            assert coefficients == default_coefficients(get_gpu(gpu), fitted)[0]


def test_a_patch_release_takes_its_minor_releases_fit(monkeypatch):
    """Patch releases of one minor release share its engine: with fits for 0.15.1 and
    0.23.2, a 0.23.0 server takes the 0.23.2 fit (the nearest older fit, 0.15.1, is a
    different engine), saying it is not its own; a version between two fitted minors takes
    the older one."""
    from simulator.latency import physics

    shipped = physics.calibrations()["H100"]
    fits = {"H100": {"0.15.1": shipped["0.15.1"], "0.23.2": shipped["0.23.0"]}}
    monkeypatch.setattr(physics, "calibrations", lambda: fits)
    _, source = physics.default_coefficients(H100, "0.23.0rc1")
    assert source.fit_vllm == "0.23.2" and "no fit for vLLM 0.23.0rc1" in source.note
    assert physics.choose_calibration("H100", "0.23.7")[1] == "0.23.2"
    assert physics.choose_calibration("H100", "0.22.9")[1] == "0.15.1"


@pytest.mark.parametrize("version", ["banana", "", "0.23-", "latest", "0..23"])
def test_an_unreadable_version_is_refused_not_guessed(version):
    """A version the choice cannot read (it took `banana` for the oldest fit) is one error
    naming the field, the value and what is allowed."""
    from simulator.latency.physics import default_coefficients

    with pytest.raises(ConfigError) as err:
        default_coefficients(H100, version)
    message = str(err.value)
    assert message.startswith(f"latency.vllm_version: invalid value '{version}'")
    assert "0.23.0rc1" in message and "\n" not in message


def test_chunked_attention_decodes_do_not_jump_at_the_chunk_boundary() -> None:
    """Llama-4's chunked layers attend within 8,192-token chunks. Only the decodes' context
    sum is known: below a chunk every context is taken whole, and past it the keys fall to
    half a chunk on average over the next chunk's length. One more token of mean context
    made a step 21 % cheaper at 8,191; now no one-token step moves the price by 0.1 %, and
    the two regimes meet: 8,192 keys at 8,191, half a chunk from 16,383 on."""
    from simulator.catalog.models import load_model
    from simulator.latency import build_step_time_model

    scout = load_model("meta-llama/llama-4-scout-17b-16e-instruct")
    m = build_step_time_model("physics", scout, get_gpu("H100"), 4)
    for context in (8190, 8191, 8192, 12_000, 16_383):
        before = m.step_time_us(StepBatch([], 256, 256 * context))
        after = m.step_time_us(StepBatch([], 256, 256 * (context + 1)))
        assert abs(after - before) <= 0.001 * before
