"""`trained-physics`, BLIS-current's default step-time model (BLIS f90a1e3a, docs/latency-models.md
"Trained physics"): hand-derived steps from the shipped iter29 coefficients, values the BLIS
binary printed for single requests, and replays of BLIS-current's own reference runs
(tests/data/blis_head, README there) compared request by request to the µs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import simulator
from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.errors import ConfigError
from simulator.latency import build_step_time_model, latency_model_names
from simulator.latency.base import StepBatch
from simulator.latency.trained_physics import (
    COEFFICIENTS_PATH,
    COEFFICIENTS_SOURCE,
    TrainedPhysics,
    shipped_coefficients,
)
from simulator.metrics.results import BLIS_SUMMARY_FIELDS
from simulator.scenario import DEFAULT_LATENCY_MODEL

DATA = Path(__file__).resolve().parent.parent / "data" / "blis_head"
H100 = get_gpu("H100")
A100 = get_gpu("A100-80")
LLAMA_8B = "meta-llama/llama-3.1-8b-instruct"
LLAMA_70B = "meta-llama/llama-3.1-70b-instruct"
MIXTRAL = "mistralai/mixtral-8x7b-v0.1"
QWEN3_MOE = "qwen/qwen3-30b-a3b"
SCOUT_FP8 = "redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic"

# The iter29 fit, as BLIS f90a1e3a ships it (defaults.yaml trained_physics_coefficients).
ALPHA = (15563.199579, 777.3455, 45.907545)
BETA = (0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825,
        481.8613888, 0.0, 1.94710771, 0.752037)  # fmt: skip
P_H100 = 989.5e6  # BF16 FLOP/µs
W_H100 = 3.35e6  # HBM bytes/µs


def _model(name: str, tp: int) -> TrainedPhysics:
    built = build_step_time_model("trained-physics", load_model(name), H100, tp)
    assert isinstance(built, TrainedPhysics)
    return built


def _prefill(n: int) -> StepBatch:
    return StepBatch([(0, n)], 0, 0, [n])


def _decode(context: int) -> StepBatch:
    return StepBatch([], 1, context, [])


# ---------------------------------------------------------------------------------------------
# Coefficients and registration
# ---------------------------------------------------------------------------------------------


def test_shipped_coefficients_are_blis_iter29():
    coeffs = shipped_coefficients()
    assert tuple(coeffs["alpha_coeffs"]) == ALPHA
    # The file carries 10 β; the 11th slot (β_EP) defaults to β3, as in BLIS's defaults.yaml.
    assert tuple(coeffs["beta_coeffs"]) == BETA[:10]
    assert _model(LLAMA_8B, 1).beta == BETA
    raw = json.loads(COEFFICIENTS_PATH.read_text())
    assert raw["backend"] == "trained-physics" and "iter29" in raw["description"]


def test_registered_provenance_and_overheads():
    assert "trained-physics" in latency_model_names()
    assert DEFAULT_LATENCY_MODEL == "physics"  # physics stays servesim's default
    m = _model(LLAMA_8B, 1)
    # What the global fit saw is the file's regression experiments: 15 runs, all on H100,
    # of 7 models (Llama-2-7B among them, Llama-3.1-8B not).
    assert m.provenance() == {
        "latency_model": "trained-physics",
        "coefficients": "BLIS f90a1e3a trained-physics iter29, global",
        "fit_gpus": ["H100"],
        "gpu": "H100",
        "gpu_covered_by_fit": True,
        "model_covered_by_fit": False,
    }
    assert _model("meta-llama/llama-2-7b-hf", 1).provenance()["model_covered_by_fit"] is True
    on_a100 = build_step_time_model("trained-physics", load_model(LLAMA_8B), A100, 1)
    assert on_a100.provenance()["gpu_covered_by_fit"] is False
    given = build_step_time_model("trained-physics", load_model(LLAMA_8B), H100, 1, beta=[1.0] * 7)
    assert "fit_gpus" not in given.provenance()  # a given fit's coverage is not ours to say
    assert m.coefficients_source == COEFFICIENTS_SOURCE
    # α0 queueing is constant (no input-length term); α2 per token; α1 post-decode (E2E only).
    assert m.queueing_time_us(1) == m.queueing_time_us(8000) == 15563
    assert m.output_token_processing_us() == 45
    assert m.post_decode_overhead_us() == 777
    assert m.scheduling_lag_steps() == 0
    assert m.step_time_us(StepBatch()) == 1  # empty batch


def test_explicit_coefficients_win_each_on_its_own():
    beta = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1000.0]  # 7 β: β6 µs per step only
    m = build_step_time_model("trained-physics", load_model(LLAMA_8B), H100, 1, beta=beta)
    assert m.step_time_us(_prefill(512)) == 1000
    assert m.queueing_time_us(0) == 15563  # α still the shipped one
    assert m.coefficients_source.startswith("given alpha/beta coefficients")


@pytest.mark.parametrize(
    "alpha, beta, match",
    [
        ([1, 2], None, r"alpha_coeffs.*3 numbers"),
        (None, [1, 2, 3, 4, 5, 6], r"beta_coeffs.*7 to 11"),
        (None, [1] * 12, r"beta_coeffs.*7 to 11"),
        (None, [0] * 10, r"all zero"),
        (None, [1, 2, 3, 4, 5, 6, -7], r"beta_coeffs\[6\].*>= 0"),
        ([1, float("nan"), 3], None, r"alpha_coeffs\[1\].*finite"),
    ],
)
def test_bad_coefficients_are_config_errors(alpha, beta, match):
    with pytest.raises(ConfigError, match=match):
        build_step_time_model(
            "trained-physics", load_model(LLAMA_8B), H100, 1, alpha=alpha, beta=beta
        )


def test_tp_must_divide_heads_and_kv_heads():
    with pytest.raises(ConfigError, match="divisible by tp"):
        TrainedPhysics(load_model(LLAMA_8B), H100, 16, ALPHA, BETA)  # 8 KV heads


# ---------------------------------------------------------------------------------------------
# Basis functions and steps by hand
# ---------------------------------------------------------------------------------------------


def test_dense_prefill_and_decode_steps_by_hand():
    """Llama-3.1-8B, H100, TP1: L=32, d=4096, H=32, H_kv=8, d_h=128, d_kv=1024, d_ff=14336."""
    m = _model(LLAMA_8B, 1)
    L, d, d_kv, d_h, d_ff = 32, 4096, 1024, 128, 14336
    # Weights, every step: attention 32·4096·(8192+2048)·2 B + MLP 32·3·4096·14336·2 B
    # = 13,958,643,712 B → / 3.35e6 B/µs = 4166.759 µs; × β2 1.36252915 = 5677.331 µs.
    t_w = (L * d * (2 * d + 2 * d_kv) * 2 + L * 3 * d * d_ff * 2) / W_H100
    assert t_w == pytest.approx(4166.759317, abs=1e-6)

    # A lone 512-token prompt (t = s = 512):
    #   proj = 32·2·512·4096·10240             = 1,374,389,534,720 FLOP
    #   attn = 32·4·32·512·(512 + 256)·128     =   206,158,430,208
    #   ffn  = 32·512·6·4096·14336             = 5,772,436,045,824
    #   T_pf_c = 7,352,984,010,752 / 989.5e6   = 7431.0096 µs; × β0 0.152128 = 1130.4646 µs
    # step = 1130.4646 + 5677.3310 + β4·32 (1027.0549) + β5·1 (4.4168) + β6 (126.0248)
    #      = 7965.29 µs → 7965 (β8 = 0: the prefill KV write has no weight)
    proj = L * 2 * 512 * d * (2 * d + 2 * d_kv)
    attn = L * 4 * 32 * 512 * (512 + 512 / 2) * d_h
    ffn = L * 512 * 6 * d * d_ff
    assert (proj, attn, ffn) == (1_374_389_534_720, 206_158_430_208, 5_772_436_045_824)
    t_pf_c = (proj + attn + ffn) / P_H100
    basis = m.basis(_prefill(512))
    assert basis["T_pf_c"] == pytest.approx(t_pf_c, rel=1e-12)
    assert basis["T_w"] == pytest.approx(t_w, rel=1e-12)
    assert basis["T_att"] == basis["T_dense"] == basis["T_moe_red"] == basis["T_disp"] == 0
    by_hand = BETA[0] * t_pf_c + BETA[2] * t_w + BETA[4] * L + BETA[5] * 1 + BETA[6]
    assert by_hand == pytest.approx(7965.2923, abs=1e-4)
    assert m.step_time_us(_prefill(512)) == int(by_hand) == 7965

    # Decode at context C: T_dc_kv = 32·2·1024·2·(C + 1) / 3.35e6 (C=512: 20.0716 µs);
    # × β9 1.94710771 = 39.0816; step = 39.0816 + 5677.3310 + 1027.0549 + 4.4168 + 126.0248
    # = 6873.91 → 6873 (β1 = 0: decode compute has no weight).
    for context, expected in ((512, 6873), (513, 6873), (514, 6874)):
        t_dc_kv = L * 2 * d_kv * 2 * (context + 1) / W_H100
        by_hand = BETA[9] * t_dc_kv + BETA[2] * t_w + BETA[4] * L + BETA[5] + BETA[6]
        assert m.basis(_decode(context))["T_dc_kv"] == pytest.approx(t_dc_kv, rel=1e-12)
        assert m.step_time_us(_decode(context)) == int(by_hand) == expected


def test_blis_worked_example_request_latencies():
    """BLIS-current's worked example, one 512 → 4 request on an idle instance:
    TTFT = α0 + prefill + α2 = 15563 + 7965 + 45 = 23573 µs;
    E2E = TTFT + Σ(decode + α2) + α1 = 23573 + 20755 + 777 = 45105 µs."""
    m = _model(LLAMA_8B, 1)
    ttft = m.queueing_time_us(512) + m.step_time_us(_prefill(512)) + 45
    itls = [m.step_time_us(_decode(c)) + m.output_token_processing_us() for c in (512, 513, 514)]
    assert ttft == 23573 and sum(itls) == 20755
    assert ttft + sum(itls) + m.post_decode_overhead_us() == 45105


def test_chunked_prefill_prices_attention_with_the_full_prompt():
    """A later chunk of a 3000-token prompt: s_i is the prompt length, not the progress."""
    m = _model(LLAMA_8B, 1)
    chunk = StepBatch([(2048, 952)], 0, 0, [3000])
    h, d_h, L = 32, 128, 32
    attn = L * 4 * h * 952 * (3000 + 952 / 2) * d_h
    other = (
        m.basis(StepBatch([(0, 952)], 0, 0, [952]))["T_pf_c"] * P_H100
        - L * 4 * h * 952 * (952 + 952 / 2) * d_h
    )
    assert m.basis(chunk)["T_pf_c"] * P_H100 == pytest.approx(other + attn, rel=1e-12)


def test_mixed_step_with_tp_all_reduce_by_hand():
    """Llama-3.1-70B TP4 (L=80, d=8192, H=64, H_kv=8): one 512-token prefill + 10 decodes at
    context 600. T = 522 tokens; the all-reduce V(u) = u·T·d·2 B·2·(TP−1)/TP / W is paid for
    attention and the dense MLP, V(80) each."""
    m = _model(LLAMA_70B, 4)
    L, d, d_kv, d_h, d_ff, tp, h = 80, 8192, 1024, 128, 28672, 4, 16
    batch = StepBatch([(0, 512)], 10, 6000, [512])
    pf_c = (
        L * 2 * 512 * d * (2 * d + 2 * d_kv) / tp
        + L * 4 * h * 512 * (512 + 256) * d_h
        + L * 512 * 6 * d * d_ff / tp
    ) / P_H100
    dc_kv = L * 2 * (d_kv / tp) * 2 * (6000 + 10) / W_H100
    t_w = (L * d * (2 * d + 2 * d_kv) * 2 / tp + L * 3 * d * d_ff * 2 / tp) / W_H100
    v_l = L * 522 * d * 2 * 2 * (tp - 1) / tp / W_H100
    step = (
        BETA[0] * pf_c
        + BETA[9] * dc_kv
        + BETA[2] * t_w
        + BETA[3] * (v_l + v_l)
        + BETA[4] * L
        + BETA[5] * 11
        + BETA[6]
    )
    f = m.basis(batch)
    assert f["T_att"] == pytest.approx(v_l) and f["T_dense"] == pytest.approx(v_l)
    assert f["T_moe_red"] == 0
    assert m.step_time_us(batch) == int(step)


def test_moe_step_by_hand():
    """Mixtral-8x7B TP2 (every layer MoE, N=8, k=2, G=TP=2): routed FFN FLOPs use
    computeTok = X·k/G, expert weights N/G experts per GPU (independent of the batch), and the
    MoE layers' all-reduce replaces the dense one."""
    m = _model(MIXTRAL, 2)
    L, d, d_kv, d_h, d_ff, tp, h = 32, 4096, 1024, 128, 14336, 2, 16
    batch = StepBatch([(0, 300)], 4, 4000, [300])
    pf_c = (
        L * 2 * 300 * d * (2 * d + 2 * d_kv) / tp
        + L * 4 * h * 300 * (300 + 150) * d_h
        + L * (300 * 2 / 2) * 6 * d * d_ff
    ) / P_H100
    dc_kv = L * 2 * (d_kv / tp) * 2 * (4000 + 4) / W_H100
    t_w = (L * d * (2 * d + 2 * d_kv) * 2 / tp + L * (8 / 2) * 3 * d * d_ff * 2) / W_H100
    v_l = L * 304 * d * 2 * 2 * (tp - 1) / tp / W_H100
    step = (
        BETA[0] * pf_c
        + BETA[9] * dc_kv
        + BETA[2] * t_w
        + BETA[3] * (v_l + 0 + v_l)  # T_att + T_dense (no dense layers) + T_moe_red
        + BETA[4] * L
        + BETA[5] * 5
        + BETA[6]
    )
    assert m.basis(batch)["T_w"] == pytest.approx(t_w, rel=1e-12)
    assert m.step_time_us(batch) == int(step)


def test_interleaved_fp8_moe_layer_split():
    """Llama-4-Scout FP8: interleave_moe_layer_step 1 → 48 // 2 = 24 MoE layers, 24 dense ones
    with intermediate_size_mlp 16384; 1-byte weights use the FP8 peak; β7 per MoE layer."""
    m = _model(SCOUT_FP8, 2)
    assert (m.n_moe, m.n_dense, m.interleaved) == (24, 24, True)
    assert (m.d_m, m.d_d) == (8192, 16384)
    assert m.peak == 1979.0e6
    # 480 + 128 = 608 ≥ β7·24 of fixed time per step beyond the dense model's terms
    assert m.step_time_us(_decode(1)) > BETA[7] * 24


@pytest.mark.parametrize(
    "name, tp, dp, backend, prefill_us, decode_us",
    [
        # From `blis current replay` of one 512 → 4 request (tests/data/blis_head/README.md):
        # prefill = TTFT − 15563 − 45; each decode = ITL − 45.
        (QWEN3_MOE, 2, 1, "allgather_reducescatter", 13882, 13654),
        (SCOUT_FP8, 2, 1, "allgather_reducescatter", 25507, 24933),
        (QWEN3_MOE, 2, 2, "allgather_reducescatter", 7874, 7754),
        (QWEN3_MOE, 2, 2, "pplx", 7992, 7754),
    ],
)
def test_single_request_steps_match_the_blis_binary(name, tp, dp, backend, prefill_us, decode_us):
    """DP is not reachable from a servesim deployment (one instance is one DP rank); the
    constructor keeps BLIS's DP terms, checked here against the binary."""
    c = shipped_coefficients()
    m = TrainedPhysics(load_model(name), H100, tp, c["alpha_coeffs"], c["beta_coeffs"], dp, backend)
    assert m.step_time_us(_prefill(512)) == prefill_us
    assert [m.step_time_us(_decode(ctx)) for ctx in (512, 513, 514)] == [decode_us] * 3


# ---------------------------------------------------------------------------------------------
# Parity: BLIS-current's own runs, replayed
# ---------------------------------------------------------------------------------------------

# case: exactly the flags of tests/data/blis_head/README.md (H100, block 16, max-num-seqs 256,
# max-num-batched-tokens 2048 are BLIS's defaults and servesim's replay defaults alike).
CASES = {
    "h1_trained_physics_8b": dict(model=LLAMA_8B, tp=1, engine__total_kv_blocks=29_205),
    "h2_trained_physics_70b_tp4": dict(model=LLAMA_70B, tp=4, engine__total_kv_blocks=121_801),
    "h3_trained_physics_moe": dict(model=MIXTRAL, tp=2, engine__total_kv_blocks=48_956),
    "h9_trained_physics_scout_fp8": dict(model=SCOUT_FP8, tp=2, engine__total_kv_blocks=40_000),
    "h10_trained_physics_qwen3_moe": dict(model=QWEN3_MOE, tp=2, engine__total_kv_blocks=60_000),
}
COMMON = dict(
    hardware="H100",
    latency__model="trained-physics",
    engine__block_size_tokens=16,
    engine__max_num_running_reqs=256,
    engine__max_num_scheduled_tokens=2048,
)


def _replay(case: str, **flags) -> simulator.Result:
    return simulator.replay(
        DATA / f"{case}.trace.yaml", DATA / f"{case}.trace.csv", **COMMON, **flags
    )


@pytest.fixture(scope="module", params=sorted(CASES))
def replayed(request):
    return request.param, _replay(request.param, **CASES[request.param])


def _us(ms: float) -> int:
    return round(ms * 1000)


def test_every_request_matches_blis_current_to_the_microsecond(replayed):
    """TTFT and E2E of every request equal BLIS's metrics.json (E2E there includes α1, as
    servesim's completion does). The trace's last chunk leaves α1 out (README)."""
    case, result = replayed
    blis = {r["requestID"]: r for r in json.loads((DATA / f"{case}.metrics.json").read_text())[
        "requests"
    ]}  # fmt: skip
    with open(DATA / f"{case}.trace.csv", newline="") as handle:
        trace = {f"request_{row['request_id']}": row for row in csv.DictReader(handle)}
    assert len(result.request_records) == len(blis) == len(trace)
    post_decode = result.engines[0].post_decode_us
    assert post_decode == 777
    mismatches = []
    for req in result.request_records:
        ttft = req.first_token_us - req.arrival_us
        e2e = req.completion_us - req.arrival_us
        ref = blis[req.request_id]
        row = trace[req.request_id]
        arrival = int(row["arrival_time_us"])
        assert req.arrival_us == arrival
        if (
            ttft != _us(ref["ttft_ms"])
            or e2e != _us(ref["e2e_ms"])
            or ttft != int(row["first_chunk_time_us"]) - arrival
            or e2e - post_decode != int(row["last_chunk_time_us"]) - arrival
        ):
            mismatches.append((req.request_id, ttft, ref["ttft_ms"], e2e, ref["e2e_ms"]))
    assert not mismatches, mismatches[:5]


def test_summary_matches_blis_current(replayed):
    """Every BLIS summary field, total_output_tokens included (BLIS-current counts every
    output token, as servesim does; BLIS-Mar dropped each request's first)."""
    case, result = replayed
    blis = json.loads((DATA / f"{case}.summary.json").read_text())
    for field in BLIS_SUMMARY_FIELDS:
        if field == "instance_id":
            continue
        assert result.summary[field] == pytest.approx(blis[field], rel=1e-9, abs=1e-9), field
    assert result.summary["preemption_count"] == 0


def test_new_work_waits_for_the_step_in_flight_unlike_blis():
    """Documented difference (docs/latency-models.md): when a step empties the instance, BLIS
    counts the instance idle from that step's *start*, so a request enqueued during the step
    starts a second, overlapping step at once. servesim runs one step at a time: the request
    waits for the step in flight, so its TTFT and E2E are later by exactly the remaining time.

    q1: two 512 → 2 requests, arrivals 0 and 9437 µs. Request 0: queued 15563, prefill
    15563 → 23528, decode 23528 → 30401. Request 1 is queued at 9437 + 15563 = 25000, during
    that decode step: BLIS starts it at 25000, servesim at 30401 (+5401 µs)."""
    blis = {
        f"request_{r['request_id']}": r
        for r in json.loads((DATA / "q1_idle_overlap.results.json").read_text())
    }
    result = _replay("q1_idle_overlap", model=LLAMA_8B, tp=1, engine__total_kv_blocks=29_205)
    got = {r.request_id: r for r in result.request_records}
    first, second = got["request_0"], got["request_1"]
    assert first.first_token_us - first.arrival_us == blis["request_0"]["ttft_us"] == 23573
    assert first.completion_us - first.arrival_us == blis["request_0"]["e2e_us"] == 31268
    step_end = first.arrival_us + 15563 + 7965 + 6873  # end of request 0's decode step
    late = step_end - (second.arrival_us + 15563)
    assert late == 5401
    assert second.first_token_us - second.arrival_us == blis["request_1"]["ttft_us"] + late
    assert second.completion_us - second.arrival_us == blis["request_1"]["e2e_us"] + late


# ---------------------------------------------------------------------------------------------
# Selectable everywhere by name
# ---------------------------------------------------------------------------------------------


def test_scenario_selects_trained_physics_by_name():
    result = simulator.simulate(
        {
            "model": LLAMA_8B,
            "hardware": "H100",
            "tp": 1,
            "latency": {"model": "trained-physics"},
            "workload": {"num_requests": 3, "rate": 1.0},
        }
    )
    assert result.summary["completed_requests"] == 3
    assert result.engines[0].post_decode_us == 777


def test_cli_latency_model_trained_physics():
    from typer.testing import CliRunner

    from simulator.cli import app

    res = CliRunner().invoke(app, ["run", "--num-requests", "3", "--latency-model",
                                   "trained-physics"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "BLIS f90a1e3a trained-physics iter29, global" in res.stdout
