"""Hand-derived steps of the `crossmodel` and `trained-roofline` backends (docs/behaviour.md §3.3,
§3.4), BLIS-Mar default coefficients from defaults.yaml, dense and MoE, TP 1 and 2."""

from __future__ import annotations

import pytest

from simulator.catalog.types import ModelConfig
from simulator.errors import ConfigError
from simulator.latency import build_step_time_model
from simulator.latency.base import StepBatch
from tests.specs import H100, LLAMA31_8B
from tests.specs import MIXTRAL_8X7B as MIXTRAL

CROSS_BETA = (116.110, 1226.868, 19.943, 9445.157)
CROSS_ALPHA = (13732.0, 0.0, 860.6)
TR_BETA = (0.7726491335309499, 1.127489556719325, 1.0559901872766853, 0.0, 43.500541908701074,
           48.80613214319187, 0.0)  # fmt: skip
TR_ALPHA = (9315.338771116985, 1849.5902371340574, 1.7079389122469397)

# One 512-token prefill (no context) plus ten decodes at context 600.
MIXED = StepBatch([(0, 512)], decode_count=10, decode_context_sum=6000, prefill_prompt_tokens=[512])
DECODE_ONLY = StepBatch([], decode_count=10, decode_context_sum=6000)


def _cross(model, tp):
    return build_step_time_model("crossmodel", model, H100, tp)


def _trained(model, tp):
    return build_step_time_model("trained-roofline", model, H100, tp)


@pytest.mark.parametrize(
    "model, tp, expected",
    [
        # dense TP1: β0·L + β1·decodes·(L·kv·dh/TP·1e-6); kv_dim_scaled = 32·8·128·1e-6
        (LLAMA31_8B, 1, 116.110 * 32 + 1226.868 * 10 * (32 * 8 * 128 / 1 * 1e-6)),
        # dense TP2: kv_dim_scaled halves, + β3 (TP sync)
        (LLAMA31_8B, 2, 116.110 * 32 + 1226.868 * 10 * (32 * 8 * 128 / 2 * 1e-6) + 9445.157),
        # MoE TP2: + β2·(prefill + decode tokens)
        (
            MIXTRAL,
            2,
            116.110 * 32
            + 1226.868 * 10 * (32 * 8 * 128 / 2 * 1e-6)
            + 19.943 * (512 + 10)
            + 9445.157,
        ),
    ],
)
def test_crossmodel_step_by_hand(model, tp, expected):
    assert _cross(model, tp).step_time_us(MIXED) == int(expected)


def test_crossmodel_overheads():
    m = _cross(LLAMA31_8B, 1)
    assert m.queueing_time_us(500) == int(13732.0 + 0.0 * 500)
    assert m.output_token_processing_us() == 860  # int(860.6)
    assert m.post_decode_overhead_us() == 0


def _trained_by_hand(L, d, H, kv, d_ff, tp, k, experts, prefill, decode, ctx):
    """The docs/behaviour.md §3.4 formulas, written out (peak FLOP/µs and HBM bytes/µs of the
    H100)."""
    d_h = d // H
    d_kv = kv * d_h
    peak, bw = 989.5e6, 3.35e6
    t_pf = sum(t for t, _ in prefill)
    attn = sum(4 * (H / tp) * t * (s + t / 2) * d_h for t, s in prefill)
    pf_c = (L * 2 * t_pf * d * (2 * d + 2 * d_kv) / tp + L * attn
            + L * t_pf * max(1, k) * 6 * d * d_ff / tp) / peak  # fmt: skip
    pf_kv = L * 2 * (d_kv / tp) * t_pf * 2 / bw
    dc_c = (L * 2 * decode * d * (2 * d + 2 * d_kv) / tp + L * 4 * (H / tp) * ctx * d_h
            + L * decode * max(1, k) * 6 * d * d_ff / tp) / peak  # fmt: skip
    dc_kv = L * 2 * (d_kv / tp) * 2 * (ctx + decode) / bw
    n_eff = min(experts, max(k, (t_pf + decode) * k)) if experts > 1 else 1
    t_w = (L * d * (2 * d + 2 * d_kv) * 2 / tp + L * n_eff * 3 * d * d_ff * 2 / tp) / bw
    b = TR_BETA
    batch = len(prefill) + decode
    return (b[0] * max(pf_c, pf_kv) + b[1] * max(dc_c, dc_kv) + b[2] * t_w + b[4] * L
            + b[5] * batch + b[6])  # fmt: skip


def test_trained_roofline_decode_step_by_hand_dense_tp1():
    # 10 decodes, Σctx 6000 on Llama-3.1-8B:
    #   decode KV bytes 32·2·1024·2·6010 = 787,742,720 B -> 235.15 µs (beats 144.2 µs compute)
    #   weights 32·4096·10240·2 + 32·3·4096·14336·2 = 13,958,643,712 B -> 4,166.76 µs
    #   1.1275·235.15 + 1.0560·4166.76 + 43.50·32 + 48.81·10 = 6,545.3 µs
    step = _trained(LLAMA31_8B, 1).step_time_us(DECODE_ONLY)
    assert step == 6545
    assert step == int(_trained_by_hand(32, 4096, 32, 8, 14336, 1, 0, 0, [], 10, 6000))


@pytest.mark.parametrize("model, tp", [(LLAMA31_8B, 2), (MIXTRAL, 1), (MIXTRAL, 2)])
def test_trained_roofline_mixed_step_by_hand(model, tp):
    k, experts = model.num_experts_per_tok, model.num_local_experts
    expected = _trained_by_hand(32, 4096, 32, 8, 14336, tp, k, experts, [(512, 512)], 10, 6000)
    assert _trained(model, tp).step_time_us(MIXED) == int(expected)


def test_trained_roofline_overheads():
    m = _trained(LLAMA31_8B, 1)
    assert m.queueing_time_us(10_000) == 9315  # α0 only, whatever the prompt
    assert m.post_decode_overhead_us() == 1849  # α1, added to E2E only
    assert m.output_token_processing_us() == 1  # int(1.708)


@pytest.mark.parametrize(
    "name, alpha, beta, needle",
    [
        ("crossmodel", [1, 2, 3], [1, 2, 3], "beta_coeffs.*exactly 4"),
        ("crossmodel", [1, 2], [1, 2, 3, 4], "alpha_coeffs.*exactly 3"),
        ("trained-roofline", [1, 2, 3], [1, 2, 3, 4], "beta_coeffs.*exactly 7"),
        ("trained-roofline", [1, 2, 3], [1, 2, 3, 4, 5, 6, -7], r"beta_coeffs\[6\].*>= 0"),
    ],
)
def test_bad_coefficients_name_the_expected_count(name, alpha, beta, needle):
    with pytest.raises(ConfigError, match=needle):
        build_step_time_model(name, LLAMA31_8B, H100, 1, alpha, beta)


def test_trained_roofline_needs_tp_dividing_heads():
    with pytest.raises(ConfigError, match="tp"):
        build_step_time_model("trained-roofline", LLAMA31_8B, H100, 3)


def test_trained_roofline_warns_once_for_quantized_weights(caplog):
    fp8 = ModelConfig("acme/x-fp8", 32, 4096, 32, 8, 14336, weight_bytes_per_param=1.0)
    with caplog.at_level("WARNING", logger="servesim"):
        build_step_time_model("trained-roofline", fp8, H100, 1)
    assert sum("16-bit weights" in r.message for r in caplog.records) == 1


def test_cli_bad_coefficients_exit_2():
    from typer.testing import CliRunner

    from simulator.cli import app

    res = CliRunner().invoke(
        app,
        ["run", "--num-requests", "3", "--latency-model", "trained-roofline",
         "--alpha-coeffs", "1,2,3", "--beta-coeffs", "1,2"],
    )  # fmt: skip
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "exactly 7" in lines[0] and "Traceback" not in res.output
