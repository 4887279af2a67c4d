"""With fewer KV heads than TP GPUs vLLM replicates each head on tp / kv_heads GPUs, so every
GPU holds one whole head: `kv_bytes_per_token(model, tp)` (the engine's bytes per block for
CPU offload, the PD transfer size) divides by min(TP, kv_heads), as the `vllm` capacity rule
and physics' KV reads do; BLIS's division by TP stays in `blis_kv_bytes_per_token` and the
`blis` rule (docs/models-and-hardware.md, KV-cache capacity step 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.api import resolve_deployment
from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.latency.kv_capacity import (
    blis_kv_bytes_per_token,
    kv_bytes_per_token,
    kv_capacity,
    kv_head_shards,
)
from simulator.latency.physics import model_shape

LLAMA_8B = "meta-llama/llama-3.1-8b-instruct"  # 8 KV heads of 128, 32 layers, BF16


@pytest.fixture(scope="module")
def llama8b():
    return load_model(LLAMA_8B)


@pytest.mark.parametrize(
    ("tp", "per_gpu", "blis"),
    [
        # whole token: 32 layers · 2 · 128 · 8 heads · 2 B = 131,072
        (1, 131_072, 131_072),
        (2, 65_536, 65_536),
        (8, 16_384, 16_384),  # one head per GPU
        (16, 16_384, 8_192),  # still one whole head per GPU (each on 2 GPUs), not half of one
        (32, 16_384, 4_096),
    ],
)
def test_per_gpu_bytes_stop_at_one_whole_head(llama8b, tp, per_gpu, blis):
    assert kv_head_shards(llama8b, tp) == min(tp, 8)
    assert kv_bytes_per_token(llama8b, tp) == per_gpu
    assert blis_kv_bytes_per_token(llama8b, tp) == blis
    assert kv_bytes_per_token(llama8b, tp, 2) == per_gpu / 2  # stages split the layers


def test_mla_keeps_its_latent_on_every_gpu():
    v3 = load_model("deepseek-ai/deepseek-v3")
    whole = 61 * (512 + 64) * 2  # 70,272: the BF16 latent (its weights are FP8)
    assert kv_bytes_per_token(v3, 1) == whole
    assert kv_head_shards(v3, 8) == 1
    assert kv_bytes_per_token(v3, 8) == blis_kv_bytes_per_token(v3, 8) == whole


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32])
def test_it_agrees_with_the_vllm_rule_and_physics(llama8b, tp):
    cap = kv_capacity(llama8b, get_gpu("B200"), tp, rule="vllm")
    assert cap.kv_bytes_per_block_per_gpu == kv_bytes_per_token(llama8b, tp) * 16
    shape = model_shape(llama8b, tp)
    assert shape.kv_bytes_per_token == kv_bytes_per_token(llama8b, tp)


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32])
def test_the_blis_rule_keeps_blis_division(llama8b, tp):
    cap = kv_capacity(llama8b, get_gpu("B200"), tp, rule="blis")
    assert cap.kv_bytes_per_block_per_gpu == int(blis_kv_bytes_per_token(llama8b, tp) * 16)


def test_the_engine_offload_block_holds_one_whole_head_per_gpu():
    """The QA case: Llama-3.1-8B at TP 16 (8 KV heads), each GPU's share of a 16-token block
    is 16,384 · 16 = 262,144 B, not 131,072."""
    deployment = resolve_deployment(
        {"model": LLAMA_8B, "hardware": "H100", "tp": 16, "engine": {"kv_cpu_blocks": 100}}
    )
    assert deployment.engine.kv_bytes_per_block == 262_144


def test_fewer_kv_heads_than_tp_only(llama8b):
    """At or below one KV head per GPU nothing changes."""
    for tp in (1, 2, 4, 8):
        assert kv_bytes_per_token(llama8b, tp) == blis_kv_bytes_per_token(llama8b, tp)
    mha = replace(llama8b, num_kv_heads=32)
    assert kv_bytes_per_token(mha, 32) == blis_kv_bytes_per_token(mha, 32) == 131_072 * 4 / 32


def test_a_pd_transfer_moves_one_whole_head_per_prefill_gpu():
    """Each prefill GPU sends its own share over its own lane: at prefill TP 16 that share is
    one whole head of Llama-3.1-8B's 8, 16,384 B per token (8,192 before)."""
    from simulator.api import _transfer_bytes_per_token, as_scenario
    from simulator.deployment import instance_setups

    def transfer_bytes(sc):  # as simulate sizes it: from its instances' setups
        deployment = resolve_deployment(sc)
        return _transfer_bytes_per_token(sc, deployment, instance_setups(sc, deployment))

    scenario = as_scenario(
        {
            "model": LLAMA_8B,
            "hardware": "H100",
            "cluster": {
                "num_instances": 2,
                "pd": {"prefill_instances": 1, "decode_instances": 1, "prefill": {"tp": 16}},
            },
        }
    )
    assert transfer_bytes(scenario) == 16_384
    # Under BLIS's backends as BLIS sizes it, for parity: the whole KV / TP, 131,072 / 16.
    blis = as_scenario(scenario.model_dump() | {"latency": {"model": "roofline"}})
    assert transfer_bytes(blis) == 8_192
