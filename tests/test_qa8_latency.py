"""QA round 8, latency and catalog: the laws behind three fixes, each against a hand-computed
reference (docs/models-and-hardware.md "Precision" and "How a model name resolves",
docs/latency-models.md "Physics")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.errors import ConfigError
from simulator.latency import StepBatch, build_step_time_model
from simulator.latency.physics import PhysicsCoefficients, PhysicsModel, price_terms

# --- 1. gpt-oss on B200: MXFP4 experts at the FP4 rate, everything else at the BF16 rate -------

# gpt-oss-120b (bundled config.json): 36 layers, hidden 2,880, 64 heads of 64, 8 KV heads, 128
# experts of FFN 2,880, top-4, vocabulary 201,088; 18 layers attend a sliding window of 128.
LAYERS, D, Q_DIM, KV_DIM, EXPERTS, K, VOCAB = 36, 2880, 64 * 64, 8 * 64, 128, 4, 201_088
ATTENTION_PARAMS = D * (Q_DIM + 2 * KV_DIM) + Q_DIM * D  # Q, K, V, O: 26,542,080 a layer
EXPERT_PARAMS = 3 * D * D  # gate, up, down of one expert: 24,883,200
ROUTER_PARAMS = D * EXPERTS  # 368,640 a layer
# Per token, one GPU: the four experts' GEMMs, and the rest (attention projections, router).
EXPERT_FLOPS_PER_TOKEN = 2 * LAYERS * K * EXPERT_PARAMS  # 7,166,361,600
REST_FLOPS_PER_TOKEN = 2 * LAYERS * (ATTENTION_PARAMS + ROUTER_PARAMS)  # 1,937,571,840
LM_HEAD_FLOPS = 2 * VOCAB * D  # one logits row per sequence: 1,158,266,880
B200_BF16, B200_FP4 = 2250e12, 9000e12  # dense FLOP/s (gpus.yaml)
PROMPT = 8192


def test_hand_counts_match_the_shape():
    """The split the fix prices: the rest is 21 % of a token's GEMM FLOPs."""
    shape = PhysicsModel(load_model("openai/gpt-oss-120b"), get_gpu("B200"), 1).shape
    assert shape.expert_flops_per_token == EXPERT_FLOPS_PER_TOKEN
    assert shape.linear_flops_per_token == EXPERT_FLOPS_PER_TOKEN + REST_FLOPS_PER_TOKEN
    assert shape.lm_head_flops_per_sequence == LM_HEAD_FLOPS
    share = REST_FLOPS_PER_TOKEN / (REST_FLOPS_PER_TOKEN + EXPERT_FLOPS_PER_TOKEN)
    assert round(share, 3) == 0.213


def test_gpt_oss_on_b200_prices_each_gemm_at_its_weights_rate():
    """An 8,192-token prefill on one B200. Expert GEMMs at the FP4 rate, attention projections,
    router and LM head at BF16, attention at BF16; before, every FLOP ran at 9,000 TFLOPS."""
    m = PhysicsModel(load_model("openai/gpt-oss-120b"), get_gpu("B200"), 1)
    terms = m.terms(StepBatch([(0, PROMPT)], 0, 0, [PROMPT]))

    # GEMMs: 8,192 x 7,166,361,600 expert FLOPs at FP4; 8,192 x 1,937,571,840 + one LM-head
    # row at BF16.
    expert_flops = PROMPT * EXPERT_FLOPS_PER_TOKEN  # 58,706,834,227,200
    rest_flops = PROMPT * REST_FLOPS_PER_TOKEN + LM_HEAD_FLOPS  # 15,873,146,593,280
    expected = rest_flops / B200_BF16 + expert_flops / B200_FP4  # 7.055 + 6.523 = 13.577 ms
    assert terms.prefill_compute_s == pytest.approx(expected, rel=1e-12)
    assert terms.prefill_compute_s == pytest.approx(13.5775e-3, rel=1e-4)
    # All at FP4 (the defect) would be (rest + experts) / 9,000 TFLOPS = 8.286 ms.
    assert (rest_flops + expert_flops) / B200_FP4 == pytest.approx(8.2867e-3, rel=1e-4)

    # Attention at BF16: 4 x 36 x 64 x 64 FLOPs a (query, key) pair over 8,192 x 8,193 / 2
    # pairs; the 18 windowed layers see 128 x 129 / 2 + (8,192 - 128) x 128 pairs instead.
    full = PROMPT * (PROMPT + 1) // 2  # 33,558,528
    windowed = 128 * 129 // 2 + (PROMPT - 128) * 128  # 1,040,448
    attention_flops = 4 * 18 * 64 * 64 * full + 4 * 18 * 64 * 64 * windowed
    assert terms.prefill_attention_s == pytest.approx(attention_flops / B200_BF16, rel=1e-12)

    # Row FLOPs (each GEMM's fixed cost): the touched experts' parameters at FP4, the rest's
    # (attention, router, LM head) at BF16. 8,192 tokens touch 128 (1 - (124/128)^8192) experts.
    touched = EXPERTS * (1 - ((EXPERTS - K) / EXPERTS) ** PROMPT)
    expert_row = 2 * LAYERS * EXPERT_PARAMS * touched
    rest_row = 2 * (LAYERS * (ATTENTION_PARAMS + ROUTER_PARAMS) + VOCAB * D)
    assert terms.weight_row_compute_s == pytest.approx(
        rest_row / B200_BF16 + expert_row / B200_FP4, rel=1e-12
    )

    # The step is those terms priced, and the provenance says both rates.
    assert m.step_time_us(StepBatch([(0, PROMPT)], 0, 0, [PROMPT])) == int(
        price_terms(terms, m.coefficients) * 1e6
    )
    assert m.provenance()["precision"]["gemm"] == (
        "fp4 experts (9000 TFLOPS), bf16 elsewhere and in attention (2250 TFLOPS)"
    )


@pytest.mark.parametrize("gpu", ["B200", "GB200"])
def test_decode_fast_path_agrees_with_mixed_rates(gpu):
    """`decode_step_time_us` repeats `step_time_us`'s arithmetic operation for operation, with
    two GEMM rates too (a windowed model takes the general path, so the window is removed)."""
    from dataclasses import replace

    model = replace(load_model("openai/gpt-oss-120b"), windowed_layer_indices=())
    m = PhysicsModel(model, get_gpu(gpu), 2, PhysicsCoefficients())
    for decodes, context in ((1, 100), (64, 64 * 2000), (256, 256 * 9000)):
        assert m.decode_step_time_us(decodes, context) == m.step_time_us(
            StepBatch([], decodes, context)
        )


def test_one_rate_models_and_gpus_without_fp4_keep_one_rate():
    """gpt-oss on H100: both parts BF16 (no FP4 units), provenance "bf16"; DeepSeek-V3 (FP8
    weights throughout, as servesim reads it) on B200: every FLOP at the FP8 rate."""
    oss = PhysicsModel(load_model("openai/gpt-oss-120b"), get_gpu("H100"), 1)
    assert oss.peak_flops_per_s == oss.expert_peak_flops_per_s == 989.5e12
    assert oss.provenance()["precision"]["gemm"] == "bf16"
    v3 = PhysicsModel(load_model("deepseek-ai/deepseek-v3"), get_gpu("B200"), 8)
    assert v3.peak_flops_per_s == v3.expert_peak_flops_per_s == 4500e12
    assert v3.provenance()["precision"]["gemm"] == "fp8"


def test_roofline_keeps_blis_one_rate():
    """roofline follows BLIS: gpt-oss (2-byte weights by BLIS's rule) at BF16 throughout."""
    roofline = build_step_time_model(
        "roofline", load_model("openai/gpt-oss-120b"), get_gpu("B200"), 1
    )
    assert roofline.peak_flops == B200_BF16


# --- 3. a config's sizes are bounded so that no accepted model overflows the clock -------------

LLAMA_8B_CONFIG = (
    Path(__file__).resolve().parent.parent
    / "simulator/catalog/data/model_configs/llama-3.1-8b-instruct/config.json"
)


def _folder(tmp_path: Path, name: str, **sizes: int) -> Path:
    """The bundled Llama-3.1-8B config.json with `sizes` replaced, in a folder of its own."""
    folder = tmp_path / name
    folder.mkdir()
    config = json.loads(LLAMA_8B_CONFIG.read_text())
    config.update(sizes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_hidden_size_beyond_its_bound_is_refused_naming_it(tmp_path):
    """QA: hidden_size 2^35 priced one step at ~2.2e17 µs and the run's sums overflowed int64
    (OverflowError in the request table). The bound is 2^20, 64 x Llama-3.1-405B's 16,384."""
    folder = _folder(tmp_path, "huge", hidden_size=2**35)
    with pytest.raises(ConfigError) as exc:
        load_model(str(folder))
    assert str(exc.value) == (
        "model 'huge': hidden_size: invalid value 34359738368; must be an integer in "
        "[0, 1,048,576] (2^20; the largest real model's is Llama-3.1-405B's 16,384); a larger "
        "size is a damaged config"
    )
    # At the bound it loads.
    assert load_model(str(_folder(tmp_path, "edge", hidden_size=2**20))).hidden_dim == 2**20


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    folder = _folder(tmp_path, "huge", hidden_size=2**35)
    args = ["run", "--model", str(folder), "--latency-model", "roofline", "--num-requests", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith("error: model 'huge': hidden_size: invalid value 34359738368")


def test_sizes_each_within_bounds_whose_product_is_not_are_refused(tmp_path):
    """hidden 2^20 (32 heads of 32,768, 8 KV heads), FFN 2^22, vocabulary 128,256, untied.
    A layer: attention d(d + 2 d/4) + d^2 = 2.5 x 2^40, SwiGLU 3 x 2^20 x 2^22 = 12 x 2^40,
    two RMSNorms 2 x 2^20; embeddings and LM head 2 x 128,256 x 2^20 = 0.245 x 2^40, the final
    norm 2^20 (the count the KV capacity's weight estimate makes, `model_param_count`). 70
    layers make about (70 x 14.5 + 0.245) x 2^40 = 1,015.2 x 2^40, under 2^50 = 1,024 x 2^40;
    71 make 1,029.7."""
    from simulator.catalog.models import MAX_PARAMETERS
    from simulator.latency.kv_capacity import model_param_count

    sizes = {"hidden_size": 2**20, "intermediate_size": 2**22}
    ok = load_model(str(_folder(tmp_path, "seventy", num_hidden_layers=70, **sizes)))
    layer = int(2.5 * 2**40) + 12 * 2**40 + 2 * 2**20
    rest = 2 * 128_256 * 2**20 + 2**20
    assert model_param_count(ok) == 70 * layer + rest <= MAX_PARAMETERS
    with pytest.raises(ConfigError) as exc:
        load_model(str(_folder(tmp_path, "seventy-one", num_hidden_layers=71, **sizes)))
    assert 71 * layer + rest == 1_132_216_343_068_672 > MAX_PARAMETERS
    assert str(exc.value) == (
        "model 'seventy-one': parameters: invalid value 1,132,216,343,068,672; the sizes of "
        "config.json (hidden_size 1,048,576, num_hidden_layers 71, intermediate_size "
        "4,194,304, vocab_size 128,256) must make at most 1,125,899,906,842,624 parameters "
        "(2^50, about 1,000 times the largest open model's 1.04e12); a larger model is a "
        "damaged config"
    )


@pytest.mark.parametrize("latency_model", ["roofline", "physics"])
def test_the_largest_accepted_model_runs_to_the_end(tmp_path, latency_model):
    """The 70-layer model above (about 2^50 parameters) in FP32 on the slowest built-in GPU
    (L40S): a step costs hours of simulated time, and a run's clock stays far below int64 µs."""
    from typer.testing import CliRunner

    from simulator.cli import app

    folder = _folder(
        tmp_path,
        "largest",
        hidden_size=2**20,
        intermediate_size=2**22,
        num_hidden_layers=70,
        torch_dtype="float32",
    )
    args = ["run", "--model", str(folder), "--latency-model", latency_model, "--hardware", "L40S"]
    res = CliRunner().invoke(app, [*args, "--num-requests", "20"])
    assert res.exit_code == 0, res.stderr[-2000:]
    header = "=== Simulation Metrics ==="
    assert res.stdout.startswith(header), res.stdout[:200]
    summary, _ = json.JSONDecoder().raw_decode(res.stdout[len(header) :].lstrip())
    assert summary["completed_requests"] == 20
    # Hours a step, yet months, not ages, for the whole run: 2^63 µs is 292,000 years.
    e2e_us = summary["e2e_mean_ms"] * 1e3
    assert 3.6e9 < e2e_us < 2**63 / 1e4
    assert math.isfinite(e2e_us)


@pytest.mark.parametrize(
    ("version", "fit", "told"),
    [
        ("0.10.0", "0.15.1", "no fit for vLLM 0.10.0, older than every fit, the oldest used"),
        ("0.16.2", "0.15.1", "no fit for vLLM 0.16.2, the nearest older one used"),
        ("0.23.5", "0.23.0", "no fit for vLLM 0.23.5, the same minor release's used"),
        ("0.23.0", "0.23.0", None),
    ],
)
def test_the_provenance_says_which_rule_chose_the_fit(version, fit, told):
    """QA: a release older than every fit was said to use the "nearest" fit; it gets the
    oldest (0.15.1 for 0.10.0), and the note now says which rule chose."""
    from simulator.catalog.hardware import get_gpu
    from simulator.latency.physics import default_coefficients

    _, source = default_coefficients(get_gpu("H100"), version)
    assert source.fit_vllm == fit
    assert (told in source.note) if told else "no fit" not in source.note


def test_roofline_names_its_own_gemm_rate():
    """QA: the precision a roofline run reported was physics's (gpt-oss on a B200: "fp4
    experts ...") while roofline prices every GEMM at the BF16 rate there (BLIS's rule: the
    FP8 rate only for exactly one-byte weights on a GPU that has it)."""
    import simulator

    def gemm(model: str, gpu: str, tp: int = 1) -> str:
        run = simulator.simulate(
            {
                "model": model,
                "hardware": gpu,
                "tp": tp,
                "latency": {"model": "roofline"},
                "workload": {"num_requests": 1},
            }  # fmt: skip
        )
        return run.scenario["resolved"]["latency"]["precision"]["gemm"]

    assert gemm("openai/gpt-oss-120b", "B200") == "bf16 (2250 TFLOPS, BLIS's rule)"
    fp8_scout = "redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic"
    assert gemm(fp8_scout, "H100", 2) == "fp8 (1979 TFLOPS, BLIS's rule)"
