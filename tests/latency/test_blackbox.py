"""Blackbox alpha/beta step-time model (docs/behaviour.md §3.2) and its registry path.

Reference coefficients: defaults.yaml row for meta-llama/llama-3.1-8b-instruct, H100, TP2,
vllm/vllm-openai:v0.8.4 (docs/behaviour.md §3.2 quotes them rounded as α = [1601.35, 3.512,
1805.54], β = [6910.42, 17.671, 2.838]).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog.types import ModelConfig
from simulator.errors import ConfigError
from simulator.latency import (
    LATENCY_MODELS,
    build_step_time_model,
    latency_model_class,
    latency_model_names,
    register_latency_model,
)
from simulator.latency.base import StepBatch, StepTimeModel
from simulator.latency.blackbox import BlackboxModel
from tests.specs import A100_SXM, H100, LLAMA31_8B

ALPHA = (1601.350510688092, 3.512476196805965, 1805.5430360826988)
BETA = (6910.420479880494, 17.67057489844186, 2.8377471109943855)


@pytest.fixture
def model() -> BlackboxModel:
    return BlackboxModel(ALPHA, BETA)


def test_step_time_hand_values(model: BlackboxModel) -> None:
    # Empty batch: β0 = 6910.42 -> 6910
    assert model.step_time_us(StepBatch()) == 6910
    # One 512-token prefill chunk + 10 decodes:
    #   6910.420479880494 + 17.67057489844186*512 + 2.8377471109943855*10
    #   = 6910.42 + 9047.33 + 28.38 = 15986.13 -> 15986
    batch = StepBatch(prefill_chunks=[(0, 512)], decode_count=10, decode_context_sum=99_999)
    assert int(BETA[0] + BETA[1] * 512 + BETA[2] * 10) == 15986
    assert model.step_time_us(batch) == 15986
    # Prefill context (cache hits) is free: only new tokens count.
    assert model.step_time_us(StepBatch(prefill_chunks=[(4000, 512)], decode_count=10)) == 15986
    # Two chunks: 300 + 212 = 512 new tokens -> same as one chunk of 512.
    split = StepBatch(prefill_chunks=[(0, 300), (50, 212)], decode_count=10)
    assert model.step_time_us(split) == 15986
    # 64 decodes only: 6910.42 + 2.8377*64 = 7092.04 -> 7092
    assert model.step_time_us(StepBatch(decode_count=64, decode_context_sum=64 * 700)) == 7092


def test_queueing_time_truncates_the_whole_sum(model: BlackboxModel) -> None:
    # 1000 input tokens: 1601.3505 + 3.5124762*1000 = 5113.83 -> 5113
    assert model.queueing_time_us(1000) == 5113
    # BLIS adds α0 + α1·in as one float and truncates once. For 13 tokens:
    #   1601.3505 + 45.6622 = 1647.0127 -> 1647, whereas per-term truncation would give
    #   int(1601.35) + int(45.66) = 1601 + 45 = 1646.
    assert int(ALPHA[0]) + int(ALPHA[1] * 13) == 1646
    assert model.queueing_time_us(13) == 1647
    assert model.queueing_time_us(0) == 1601


def test_output_token_overhead_and_post_decode(model: BlackboxModel) -> None:
    assert model.output_token_processing_us() == 1805  # int(1805.543)
    assert model.post_decode_overhead_us() == 0


def test_step_time_floor_is_one_us() -> None:
    queue_only = BlackboxModel([100.0, 1.0, 5.0], [0.0, 0.0, 0.0])
    assert queue_only.step_time_us(StepBatch()) == 1
    assert queue_only.step_time_us(StepBatch(prefill_chunks=[(0, 10)], decode_count=3)) == 1
    sub_us = BlackboxModel([0.0, 0.0, 0.0], [0.4, 0.0, 0.0])
    assert sub_us.step_time_us(StepBatch()) == 1


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(1, 4096)), min_size=0, max_size=8
    ),
    decodes=st.integers(0, 512),
    more=st.integers(1, 1000),
)
def test_step_time_is_monotone_and_linear(chunks: list, decodes: int, more: int) -> None:
    model = BlackboxModel(ALPHA, BETA)
    base = StepBatch(list(chunks), decodes, 0)
    t = model.step_time_us(base)
    prefill = sum(n for _, n in chunks)
    assert t == max(1, int(BETA[0] + BETA[1] * prefill + BETA[2] * decodes))
    assert model.step_time_us(StepBatch(list(chunks), decodes + more, 0)) >= t
    assert model.step_time_us(StepBatch([*chunks, (0, more)], decodes, 0)) >= t


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha", "beta", "field"),
    [
        ([1.0, 2.0], BETA, "alpha_coeffs"),
        (ALPHA, [1.0, 2.0, 3.0, 4.0], "beta_coeffs"),
        ([1.0, -2.0, 3.0], BETA, r"alpha_coeffs\[1\]"),
        (ALPHA, [1.0, 2.0, math.nan], r"beta_coeffs\[2\]"),
        (ALPHA, [math.inf, 2.0, 3.0], r"beta_coeffs\[0\]"),
        (ALPHA, [1.0, "x", 3.0], r"beta_coeffs\[1\]"),
        ("1,2,3", BETA, "alpha_coeffs"),
        ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], "alpha_coeffs/beta_coeffs"),
    ],
)
def test_bad_coefficients_rejected(alpha: object, beta: object, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        BlackboxModel(alpha, beta)  # type: ignore[arg-type]


def test_integer_coefficients_accepted() -> None:
    model = BlackboxModel([1000, 2, 10], [5000, 10, 3])
    assert model.step_time_us(StepBatch(prefill_chunks=[(0, 100)], decode_count=4)) == 6012
    assert model.queueing_time_us(50) == 1100


# --- registry -------------------------------------------------------------------------------


def test_registry_lists_builtin_backends() -> None:
    assert latency_model_names() == [
        "blackbox", "crossmodel", "physics", "roofline", "trained-physics", "trained-roofline"
    ]  # fmt: skip
    assert latency_model_class("roofline").__name__ == "RooflineModel"
    assert latency_model_class("blackbox") is BlackboxModel
    assert LATENCY_MODELS["blackbox"] is BlackboxModel  # registered once looked up


def test_a_run_imports_only_the_backend_it_names() -> None:
    # The shipped backends load when first named: a roofline run never imports physics.
    probe = (
        "import sys, simulator\n"
        "simulator.simulate({'workload': {'num_requests': 2}, 'latency': {'model': 'roofline'}})\n"
        "import simulator.latency as latency\n"
        "print(sorted(m for m in sys.modules if m.startswith('simulator.latency.')))\n"
        "print(latency.PhysicsModel.name, 'simulator.latency.physics' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    first, second = out.stdout.splitlines()
    assert "physics" not in first and "blackbox" not in first and "roofline" in first
    assert second == "physics True"  # the package attribute imports it


def _constant_model(model_name: str, step_us: int) -> type[StepTimeModel]:
    """A minimal backend named `model_name` whose every step takes `step_us`."""

    class ConstantModel(StepTimeModel):
        name = model_name

        @classmethod
        def from_deployment(cls, model, gpu, tp, alpha=None, beta=None, vllm_version=None):
            return cls()

        def step_time_us(self, batch: StepBatch) -> int:
            return step_us

    return ConstantModel


def test_a_shipped_name_cannot_be_taken_before_it_is_loaded() -> None:
    with pytest.raises(ValueError, match="already taken by PhysicsModel"):
        register_latency_model(_constant_model("physics", 1))


@pytest.mark.parametrize("version", ["v0.8.4", "0.8.4", "vllm/vllm-openai:v0.8.4"])
def test_blackbox_coefficients_from_defaults(version: str) -> None:
    model = build_step_time_model("blackbox", LLAMA31_8B, H100, 2, vllm_version=version)
    assert isinstance(model, BlackboxModel)
    assert model.alpha == ALPHA
    assert model.beta == BETA
    assert model.total_kv_blocks == 132139
    assert model.step_time_us(StepBatch(prefill_chunks=[(0, 512)], decode_count=10)) == 15986


def test_blackbox_lookup_by_bundled_folder_name_and_case() -> None:
    from dataclasses import replace

    for name in ("llama-3.1-8b-instruct", "Meta-Llama/Llama-3.1-8B-Instruct"):
        named = replace(LLAMA31_8B, name=name)
        model = build_step_time_model("blackbox", named, H100, 2, vllm_version="v0.8.4")
        assert model.alpha == ALPHA  # type: ignore[attr-defined]


def test_blackbox_a100_sxm_finds_a100_80_rows() -> None:
    model = build_step_time_model("blackbox", LLAMA31_8B, A100_SXM, 1, vllm_version="v0.8.4")
    assert isinstance(model, BlackboxModel)
    assert model.total_kv_blocks is not None


def test_without_a_version_the_models_default_vllm_version_is_looked_up() -> None:
    """As BLIS-Mar does (checked on its binary): Llama-3.1-8B's default vLLM version is
    v0.11.0 (defaults.yaml `defaults:`), fitted on H100 TP 1 only. Its v0.8.4 rows (H100 TP 2,
    A100 TP 1, ...) are used when v0.8.4 is asked for, never in its place."""
    on_default = build_step_time_model("blackbox", LLAMA31_8B, H100, 1)
    assert "vLLM v0.11.0" in on_default.coefficients_source
    with pytest.raises(ConfigError) as exc:
        build_step_time_model("blackbox", LLAMA31_8B, H100, 2)
    message = str(exc.value)
    assert "(vLLM version vllm/vllm-openai:v0.11.0)" in message
    assert "H100 TP2 (v0.8.4)" in message and "--vllm-version" in message


def test_explicit_coefficients_override_defaults() -> None:
    model = build_step_time_model(
        "blackbox", LLAMA31_8B, H100, 2, alpha=[1.0, 0.0, 2.0], beta=[100.0, 1.0, 1.0]
    )
    assert model.step_time_us(StepBatch(prefill_chunks=[(0, 50)], decode_count=5)) == 155
    assert model.output_token_processing_us() == 2


def test_explicit_coefficients_must_come_together() -> None:
    with pytest.raises(ConfigError, match="beta_coeffs.*together"):
        build_step_time_model("blackbox", LLAMA31_8B, H100, 2, alpha=[1.0, 0.0, 2.0])
    with pytest.raises(ConfigError, match="alpha_coeffs.*together"):
        build_step_time_model("blackbox", LLAMA31_8B, H100, 2, beta=[1.0, 0.0, 2.0])


def test_missing_coefficients_name_the_deployment_and_alternatives() -> None:
    with pytest.raises(ConfigError) as info:
        build_step_time_model("blackbox", LLAMA31_8B, H100, 8)
    message = str(info.value)
    assert "'meta-llama/llama-3.1-8b-instruct'" in message
    assert "'H100'" in message and "TP 8" in message
    assert "H100 TP2 (v0.8.4)" in message and "A100-80 TP1" in message

    with pytest.raises(ConfigError, match=r"v0\.9\.9.*H100 TP1 \(v0\.11\.0\)"):
        build_step_time_model("blackbox", LLAMA31_8B, H100, 2, vllm_version="v0.9.9")

    unknown_model = ModelConfig("acme/unknown-7b", 32, 4096, 32, 8, 14336)
    with pytest.raises(ConfigError, match="no coefficients for this model"):
        build_step_time_model("blackbox", unknown_model, H100, 1)


def test_blackbox_unknown_name() -> None:
    with pytest.raises(ConfigError, match="unknown latency model 'black-box'; valid: blackbox"):
        build_step_time_model("black-box", LLAMA31_8B, H100, 1)


def test_register_latency_model_by_name() -> None:
    ConstantModel = _constant_model("constant-test", 42)
    try:
        assert register_latency_model(ConstantModel) is ConstantModel
        built = build_step_time_model("constant-test", LLAMA31_8B, H100, 1)
        assert built.step_time_us(StepBatch()) == 42
        with pytest.raises(ValueError, match="already taken"):

            class Impostor(ConstantModel):
                name = "constant-test"

            register_latency_model(Impostor)
    finally:
        LATENCY_MODELS.pop("constant-test", None)


def test_register_rejects_incomplete_classes() -> None:
    class NoName(StepTimeModel):
        pass

    with pytest.raises(ValueError, match="name"):
        register_latency_model(NoName)

    class NoBuilder(StepTimeModel):
        name = "no-builder"

    with pytest.raises(TypeError, match="from_deployment"):
        register_latency_model(NoBuilder)
