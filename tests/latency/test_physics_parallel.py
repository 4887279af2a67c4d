"""`physics` beyond a plain decoder on TP GPUs (docs/parallelism.md, docs/latency-models.md):
MLA, an explicit head_dim, windowed attention, expert all-to-alls, pipeline stages, TP across
nodes; each term by hand, then the laws over random layouts.

Shapes (config.json): DeepSeek-V3 L=61 (3 dense + 58 MoE), d=7,168, H=128, q_lora 1,536,
kv_lora 512, rope 64, nope 128, v 128, 256 experts of 2,048 (top-8) + 1 shared, dense FFN
18,432, vocab 129,280, FP8 weights, BF16 activations. Qwen3-32B L=64, d=5,120, H=64, Hkv=8,
head_dim 128 (not 5,120/64 = 80), d_ff=25,600, vocab 151,936.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.errors import ConfigError
from simulator.latency import build_step_time_model
from simulator.latency.base import StepBatch
from simulator.latency.parallel import Links, Parallelism, links_for, stage_layer_ranges
from simulator.latency.physics import (
    PhysicsModel,
    causal_pairs,
    model_shape,
    window_pairs,
)
from tests.latency.test_physics import BARE as PHYSICS_BARE

H100, H200 = get_gpu("H100"), get_gpu("H200")
DEEPSEEK_V3 = load_model("deepseek-ai/DeepSeek-V3")
QWEN3_32B = load_model("Qwen/Qwen3-32B")
LLAMA_70B = load_model("meta-llama/llama-3.1-70b-instruct")
LLAMA_8B = load_model("meta-llama/llama-3.1-8b-instruct")
MIXTRAL = load_model("mistralai/mixtral-8x7b-v0.1")
# test_physics's unit efficiencies and no overheads, and no network latency either: only the
# physical terms at peak rates.
BARE = replace(PHYSICS_BARE, network_latency_us=0.0)

# --- MLA: DeepSeek-V3 on 8 H200 (TP8) ----------------------------------------------------------

# Per layer, split over heads (÷ TP): q up 1,536x128x192, kv up 512x128x256, out 128x128x7,168;
# replicated on every GPU: q down 7,168x1,536, kv down 7,168x(512+64).
MLA_SHARDED = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168  # 171,966,464
MLA_REPLICATED = 7168 * 1536 + 7168 * 576  # 15,138,816
EXPERT = 3 * 7168 * 2048  # one routed (or the shared) expert: 44,040,192
DENSE_MLP = 3 * 7168 * 18432


def test_deepseek_v3_weight_bytes_per_gpu_by_hand():
    shape = model_shape(DEEPSEEK_V3, 8)
    # FP8: one byte per weight.
    assert shape.attention_weight_bytes == 61 * (MLA_SHARDED / 8 + MLA_REPLICATED)
    assert shape.attention_weight_bytes == 2_234_712_064
    assert shape.dense_mlp_weight_bytes == 3 * DENSE_MLP / 8
    assert shape.expert_weight_bytes == 58 * EXPERT / 8  # one expert of every MoE layer
    assert shape.shared_expert_weight_bytes == 58 * EXPERT / 8
    assert shape.router_weight_bytes == 58 * 7168 * 256  # replicated
    assert shape.lm_head_bytes == 129280 * 7168 / 8
    assert shape.embedding_row_bytes == 7168


def test_deepseek_v3_mla_cache_and_attention_flops_by_hand():
    shape = model_shape(DEEPSEEK_V3, 8)
    # The latent (512) and rotary key (64), BF16, all 61 layers, on every GPU.
    assert shape.kv_bytes_per_token == 61 * 576 * 2 == 70_272
    # Prefill attends the decompressed heads: QK over 128+64, AV over 128 dims, per head.
    assert shape.attention_flops_per_pair == 61 * 2 * 128 * (128 + 64 + 128) / 8
    # Decode attends the latent directly: QK over 512+64, AV over 512.
    assert shape.decode_attention_flops_per_pair == 61 * 2 * 128 * (512 + 64 + 512) / 8
    # A prefill chunk up-projects every cached latent it attends: 512 -> 128 x (128 + 128).
    assert shape.context_flops_per_token == 2 * 61 * 512 * 128 * 256 / 8
    # 2 x active parameters per token: 58 MoE layers (8 routed + 1 shared + router), 3 dense.
    active = 58 * (MLA_SHARDED + 8 * EXPERT + 7168 * 256 + EXPERT) + 3 * (MLA_SHARDED + DENSE_MLP)
    assert shape.linear_flops_per_token == pytest.approx(
        2 * active / 8 + 2 * 61 * MLA_REPLICATED, rel=1e-12
    )


def test_deepseek_v3_decode_step_terms_by_hand():
    """One decode token with 999 tokens of context on 8 H200 (4.8 TB/s, FP8 1,979 TFLOPS)."""
    m = PhysicsModel(DEEPSEEK_V3, H200, 8, BARE)
    terms = m.terms(StepBatch([], 1, 999))
    # One token routes to exactly 8 of 256 experts: 256 x (1 - 248/256) = 8.
    weights = (
        (2_234_712_064 + 3 * DENSE_MLP / 8 + 8 * 58 * EXPERT / 8 + 58 * EXPERT / 8)
        + 58 * 7168 * 256
        + 129280 * 7168 / 8
    )
    assert terms.memory_s == pytest.approx((weights + 7168) / 4.8e12, rel=1e-12)
    assert terms.kv_memory_s == pytest.approx(70_272 * (999 + 1) / 4.8e12, rel=1e-12)
    shape = m.shape
    flops = shape.linear_flops_per_token + 2 * 129280 * 7168 / 8
    assert terms.decode_compute_s == pytest.approx(flops / 1979e12, rel=1e-12)
    attention_flops = shape.decode_attention_flops_per_pair * (999 + 1)
    assert terms.decode_attention_s == pytest.approx(attention_flops / 1979e12, rel=1e-12)
    # Two all-reduces of 7,168 x 2 B per layer, ring over 8 GPUs on 450 GB/s NVLink.
    assert terms.allreduce_transfer_s == pytest.approx(122 * 14 / 8 * 14_336 / 450e9, rel=1e-12)
    assert terms.collectives == 122 * 14 and terms.network_steps == 0


# --- explicit head_dim: Qwen3-32B ----------------------------------------------------------------


def test_qwen3_head_dim_128_prices_bytes_and_flops():
    """q_dim = 64 x 128 = 8,192 (not 5,120), kv_dim 8 x 128 = 1,024 per layer."""
    shape = model_shape(QWEN3_32B, 2)
    attention = 5120 * (8192 + 2 * 1024) + 8192 * 5120
    assert shape.attention_weight_bytes == 64 * attention * 2 / 2
    assert shape.kv_bytes_per_token == 2 * 64 * 4 * 128 * 2  # 4 KV heads per GPU at TP2
    assert shape.attention_flops_per_pair == 2 * 2 * 64 * 64 * 128 / 2
    assert shape.linear_flops_per_token == 2 * 64 * (attention + 3 * 5120 * 25600) / 2


# --- windowed attention --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    context=st.integers(0, 3000),
    new=st.integers(1, 700),
    window=st.integers(1, 1200),
    kind=st.sampled_from(["sliding", "chunked"]),
)
def test_window_pairs_match_counting_every_query(context, new, window, kind):
    def keys(p: int) -> int:
        return min(p + 1, window) if kind == "sliding" else p % window + 1

    assert window_pairs(context, new, window, kind) == sum(
        keys(p) for p in range(context, context + new)
    )
    assert window_pairs(context, new, window, kind) <= causal_pairs(context, new)


def test_gpt_oss_sliding_layers_price_only_their_window():
    """gpt-oss-120b: 18 of 36 layers see the last 128 keys. A 4,096-token prefill with no
    context: full layers attend 4,096 x 4,097 / 2 pairs, windowed ones 128 x 129 / 2 +
    (4,096 - 128) x 128; the windowed layers' FLOPs per pair are half of all layers'."""
    m = PhysicsModel(load_model("openai/gpt-oss-120b"), H100, 1, BARE)
    full = causal_pairs(0, 4096)
    windowed = 128 * 129 // 2 + (4096 - 128) * 128
    assert window_pairs(0, 4096, 128, "sliding") == windowed
    shape = m.shape
    assert shape.window_attention_flops_per_pair == shape.attention_flops_per_pair / 2
    terms = m.terms(StepBatch([(0, 4096)], 0, 0))
    attention = shape.attention_flops_per_pair * full - shape.window_attention_flops_per_pair * (
        full - windowed
    )
    other = shape.linear_flops_per_token * 4096 + shape.lm_head_flops_per_sequence
    assert terms.prefill_compute_s * m.peak_flops_per_s == pytest.approx(other)
    assert terms.prefill_attention_s * m.peak_flops_per_s == pytest.approx(attention)
    # Decoding at 10,000 tokens of context: the windowed layers read 128 cached tokens.
    kv = m.terms(StepBatch([], 1, 10_000)).kv_memory_s * m.peak_bytes_per_s
    per_layer = 2 * 8 * 64 * 2  # K and V, 8 KV heads, head_dim 64, BF16
    assert kv == pytest.approx(per_layer * (18 * (10_000 + 1) + 18 * (128 + 1)))


def test_a_window_that_hides_nothing_changes_no_bit():
    """Llama-4 chunks of 8,192: below that, pricing equals pricing without windows exactly."""
    scout = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    plain = replace(scout, windowed_layer_indices=(), attention_window=0, window_kind="")
    batch = StepBatch([(300, 2000), (0, 512)], 40, 40 * 3000)
    assert PhysicsModel(scout, H100, 4).terms(batch) == PhysicsModel(plain, H100, 4).terms(batch)


# --- expert parallelism --------------------------------------------------------------------------


def test_ep_inside_one_rank_prices_like_tp():
    """With one DP rank, EP shards whole experts where TP slices them: the same bytes and
    FLOPs per GPU and the same combine all-reduce (vLLM does exactly this)."""
    batch = StepBatch([(0, 700)], 30, 30 * 2000)
    tp = PhysicsModel(MIXTRAL, H100, 2)
    ep = PhysicsModel(MIXTRAL, H100, 2, parallelism=Parallelism(2, ep=2))
    assert ep.step_time_us(batch) == tp.step_time_us(batch)


def test_expert_all_to_all_within_a_node_by_hand():
    """DeepSeek-V3, 8 DP ranks of TP1, experts over all 8 GPUs (one H200 node). Each token
    sends its hidden state (FP8 GEMMs: 1 B) to 8 experts and gets 8 results back (BF16: 2 B);
    7/8 of them live on another GPU, over 450 GB/s NVLink: per token 58 layers x 8 x 7,168 x
    (1 + 2) B x 7/8 / 450e9 s; two all-to-alls per MoE layer, each one NVLink latency step."""
    m = PhysicsModel(DEEPSEEK_V3, H200, 1, BARE, parallelism=Parallelism(1, dp=8, ep=8))
    stage = m.stages[0]
    assert stage.alltoall_s_per_token == pytest.approx(58 * 8 * 7168 * 3 / 8 * 7 / 450e9)
    assert (stage.collectives, stage.network_steps) == (2 * 58, 0)
    # No TP all-reduce for the experts: the combine returns them.
    assert stage.shape.allreduces == 61 + 3


def test_expert_all_to_all_across_two_nodes_by_hand():
    """2 DP ranks of TP8 on two H200 nodes, EP16: of 15 peers, 7 on NVLink and 8 across the
    400 Gb/s (50 GB/s) network, which sets the time: per token 58 x 8 x 7,168 x 3 B / 8 (the
    rank's TP GPUs share its tokens) / 16 x 8 / 50e9 s; every all-to-all waits on the network."""
    m = PhysicsModel(DEEPSEEK_V3, H200, 8, BARE, parallelism=Parallelism(8, dp=2, ep=16))
    stage = m.stages[0]
    per_token = 58 * 8 * 7168 * 3 / 8 / 16
    assert stage.alltoall_s_per_token == pytest.approx(
        max(per_token * 7 / 450e9, per_token * 8 / 50e9)
    )
    assert stage.network_steps == 2 * 58
    # Each GPU holds 256/16 = 16 whole experts: 1/16 of the routed weights.
    assert stage.shape.expert_weight_bytes == 58 * EXPERT / 16


def test_dp_ranks_without_ep_slice_the_experts_over_every_rank_by_hand():
    """vLLM serves an MoE model with data parallelism and no --enable-expert-parallel by
    making the expert layers one tensor-parallel group of tp x dp GPUs (until 2026-12-07 each
    rank kept its own copy of every expert: a quarter of the KV capacity and 2.5x the decode
    step at DP4 for Qwen3-30B-A3B). Mixtral, 4 ranks of TP1: each GPU holds 1/4 of every
    expert (as EP4's whole experts) and computes it for all 4 ranks' tokens, exchanged with
    the 3 other ranks' GPUs at its TP position: the hidden states all-gathered before each of
    the 32 MoE layers and the outputs reduce-scattered after it, 4,096 x 2 B per token of its
    rank each way and peer, over NVLink at 450 GB/s: 32 x 2 x 8,192 B x 3 / 450e9 s."""
    layout = Parallelism(1, dp=4)
    assert layout.experts_tensor_parallel_over_ranks
    assert (layout.expert_shards, layout.ep_ranks) == (4, 4)
    m = PhysicsModel(MIXTRAL, H100, 1, BARE, parallelism=layout)
    ep = PhysicsModel(MIXTRAL, H100, 1, BARE, parallelism=Parallelism(1, dp=4, ep=4))
    stage = m.stages[0]
    assert stage.shape.expert_weight_bytes == ep.stages[0].shape.expert_weight_bytes
    assert stage.alltoall_s_per_token == pytest.approx(32 * 2 * 8192 * 3 / 450e9)
    assert (stage.collectives, stage.network_steps) == (2 * 32, 0)
    # The rank's TP all-reduce still completes the MoE outputs (free at TP 1, not at TP 2).
    assert stage.shape.allreduces == ep.stages[0].shape.allreduces + 32
    tp2 = PhysicsModel(MIXTRAL, H100, 2, BARE)
    tp2_dp2 = PhysicsModel(MIXTRAL, H100, 2, BARE, parallelism=Parallelism(2, dp=2))
    assert tp2_dp2.stages[0].shape.allreduces == tp2.stages[0].shape.allreduces
    assert tp2_dp2.stages[0].collectives == tp2.stages[0].collectives + 2 * 32
    # Each rank's share of the KV memory is EP4's too: the expert fraction per GPU is 1/4.
    from simulator.api import resolve_deployment

    def blocks(**lay: object) -> int:
        scenario = {"model": "qwen/qwen3-30b-a3b", "hardware": "H100", "tp": 1, **lay}
        return resolve_deployment(scenario).engine.total_kv_blocks

    assert blocks(dp=4) == blocks(dp=4, ep=4) > 3 * blocks()


def test_an_expert_group_spans_the_ranks_stage_by_stage():
    """vLLM places ranks one after another, each its pp stages of tp GPUs: with TP4, PP2,
    DP2 and EP8, stage 0's expert group is GPUs 0-3 of rank 0 and 8-11 of rank 1, which
    straddle two 8-GPU nodes (until 2026-12-07 priced as GPUs 0-7, one node: no network)."""
    layout = Parallelism(4, pp=2, dp=2, ep=8)
    assert layout.expert_group_gpus(0) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert layout.expert_group_gpus(1) == [4, 5, 6, 7, 12, 13, 14, 15]
    links = links_for(H100)
    assert links.member_peers(layout.expert_group_gpus(0)) == [(3, 4), (3, 4)]
    assert links.member_peers(range(8)) == [(7, 0)]
    # An uneven group is priced for its member with the most remote peers: of GPUs 0, 1, 6,
    # 7 (node 0) and 12, 13 (node 1), GPU 12 has 1 local and 4 remote peers.
    assert Parallelism(2, pp=3, dp=3, ep=6).expert_group_gpus(0) == [0, 1, 6, 7, 12, 13]
    assert links.member_peers([0, 1, 6, 7, 12, 13]) == [(3, 2), (1, 4)]
    assert links.exchange_s([[0, 1, 6, 7, 12, 13]], 1e9) == pytest.approx(
        4 / links.scale_out_gb_per_s
    )
    qwen = load_model("qwen/qwen3-235b-a22b")
    m = PhysicsModel(qwen, H100, 4, BARE, parallelism=layout)
    assert all(stage.network_steps > 0 for stage in m.stages)


def test_an_exchange_is_priced_for_its_slowest_member_on_either_link():
    """Each member of an exchange sends to its same-domain peers over the scale-up link and to
    the rest over the network at once; the slowest member sets the time, whichever link is
    slower. Links of 32 GB/s inside a node and 50 GB/s between nodes (physics.yaml's default
    row), 12 GPUs on nodes of 8: a member of the full node has 7 local and 4 remote peers,
    max(7/32, 4/50) = 0.21875 s per GB per peer; one of the other node 3 and 8,
    max(3/32, 8/50) = 0.16. The first sets the time (the fewest-local rule chose the second)."""
    links = Links(32, 50, 8)
    assert links.exchange_s([range(12)], 1e9) == pytest.approx(7 / 32)
    assert links.crosses_domains(range(12)) and not links.crosses_domains(range(8))
    # DP without EP exchanges by TP position: TP16 x DP5 on one 72-GPU GB200 rack puts GPUs
    # 64-79 of the last rank beyond it, so positions 8-15 cross the network (position 0 does
    # not: GPUs 0, 16, 32, 48, 64).
    gb200 = get_gpu("GB200")
    qwen = load_model("qwen/qwen3-235b-a22b")
    m = PhysicsModel(qwen, gb200, 16, BARE, parallelism=Parallelism(16, dp=5))
    assert m.stages[0].network_steps == 2 * 94


# --- tensor parallelism across nodes -------------------------------------------------------------


def test_tp_across_two_nodes_all_reduces_over_the_network():
    """Llama-3.1-70B TP16 on H100 spans two 8-GPU nodes: 160 all-reduces of 8,192 x 2 B per
    token, ring over 16 GPUs. NCCL runs a ring per network card, so the 8 cards of a node carry
    8 x 50 = 400 GB/s side by side (below NVLink's 450); all 160 x 30 ring steps wait on the
    network's latency."""
    m = PhysicsModel(LLAMA_70B, H100, 16, BARE)
    stage = m.stages[0]
    assert stage.allreduce_s_per_token == pytest.approx(160 * 30 / 16 * 16_384 / 400e9)
    assert (stage.collectives, stage.network_steps) == (0, 160 * 30)
    assert PhysicsModel(LLAMA_70B, H100, 8, BARE).stages[0].network_steps == 0


# --- pipeline parallelism ------------------------------------------------------------------------


def test_vllm_stage_split():
    assert [len(r) for r in stage_layer_ranges(80, 3)] == [27, 27, 26]
    assert [len(r) for r in stage_layer_ranges(61, 4)] == [15, 15, 16, 15]
    assert stage_layer_ranges(10, 1) == [range(0, 10)]


def test_pipeline_step_by_hand():
    """Llama-3.1-70B TP4 x PP2 on H100 (one node). One decoding request is one micro-batch:
    it crosses both stages one after the other (the other stage idles: the bubble), handing
    8,192 x 2 tensors x 2 B over NVLink between them. Eight requests make two micro-batches
    of four, and the step lasts max(Σ stages + hand-off, 2 x slowest stage)."""
    m = PhysicsModel(LLAMA_70B, H100, 4, BARE, parallelism=Parallelism(4, pp=2))
    assert [s.shape.layers for s in m.stages] == [40, 40]
    assert m.stages[0].shape.lm_head_bytes == 0 and m.stages[1].shape.embedding_row_bytes == 0

    def stage_s(batch: StepBatch, parts: int) -> list[float]:
        work = m.work(batch).share(parts)
        out = []
        for stage in m.stages:
            t = m._terms(stage, work, 0, 0)  # noqa: SLF001 - the stage's own terms
            out.append(
                max(t.memory_s, t.prefill_compute_s + t.decode_compute_s)
                + max(t.kv_memory_s, t.prefill_attention_s + t.decode_attention_s)
                + t.allreduce_transfer_s
            )
        return out

    one = StepBatch([], 1, 1000)
    s0, s1 = stage_s(one, 1)
    hand_off = 1 * 2 * 8192 * 2 / 450e9
    assert m.step_time_us(one) == int((s0 + s1 + hand_off) * 1e6)
    eight = StepBatch([], 8, 8000)
    t0, t1 = stage_s(eight, 2)
    expected = max(t0 + t1 + 4 * 2 * 8192 * 2 / 450e9, 2 * max(t0, t1))
    assert m.step_time_us(eight) == int(expected * 1e6)


def test_a_prefill_chunk_passes_every_stage_whole():
    """Micro-batches are whole sequences: a 3,403-token chunk plus one decode makes two
    micro-batches, and the chunk's still crosses both stages, so the step lasts at least the
    chunk's alone (it was priced as two 1,700-token halves overlapping: 239 -> 123 ms)."""
    m = PhysicsModel(LLAMA_70B, H100, 4, BARE, parallelism=Parallelism(4, pp=2))
    alone = m.step_time_us(StepBatch([(0, 3403)], 0, 0))
    assert m.step_time_us(StepBatch([(0, 3403)], 1, 12_888)) >= alone


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.integers(0, 4000), st.integers(1, 4000)), max_size=3),
    decodes=st.integers(0, 64),
    context=st.integers(1, 4000),
    extra=st.tuples(st.integers(0, 4000), st.integers(1, 4000)),
    pp=st.sampled_from([2, 4]),
)
def test_pipeline_steps_never_get_faster_with_more_work(chunks, decodes, context, extra, pp):
    """Under PP, one more prefill chunk, or one more decode at the batch's mean context,
    never shortens the step. (Decodes are known by their context sum only, so a decode with
    a shorter context than the others' may lower the mean a micro-batch carries.)"""
    m = PhysicsModel(LLAMA_8B, H100, 1, BARE, parallelism=Parallelism(1, pp=pp))
    base = m.step_time_us(StepBatch(list(chunks), decodes, decodes * context))
    more_chunks = StepBatch([*chunks, extra], decodes, decodes * context)
    more_decodes = StepBatch(list(chunks), decodes + 1, (decodes + 1) * context)
    assert m.step_time_us(more_chunks) >= base
    assert m.step_time_us(more_decodes) >= base


def test_pipeline_hand_off_crosses_nodes_when_stages_do():
    """TP8 x PP2 on H100: stage 1 sits on the second node, so its one hand-off (all that
    crosses the network: each TP group stays on its node) pays the network latency; TP4 x
    PP2 stays on one node's NVLink and pays none of it."""
    assert links_for(H100).crosses(7, 8) and not links_for(H100).crosses(3, 4)
    one = StepBatch([], 1, 100)
    for tp, network_hops in ((4, 0), (8, 1)):
        layout = Parallelism(tp, pp=2)
        with_latency = PhysicsModel(
            LLAMA_70B, H100, tp, replace(BARE, network_latency_us=10.0), parallelism=layout
        )
        without = PhysicsModel(LLAMA_70B, H100, tp, BARE, parallelism=layout)
        assert with_latency.pipeline_step_s(one) - without.pipeline_step_s(one) == pytest.approx(
            network_hops * 10e-6, abs=1e-12
        )


# --- layouts: validation and laws ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "model", "message"),
    [
        (Parallelism(2, ep=2), LLAMA_70B, "ep: invalid value 2; expert parallelism needs an MoE"),
        (Parallelism(4, ep=3), MIXTRAL, "ep: invalid value 3; must divide tp x dp = 4"),
        (Parallelism(1, dp=16, ep=16), MIXTRAL, "ep: invalid value 16; must divide the 8 experts"),
        (Parallelism(2, dp=2, ep=2), MIXTRAL, "ep: invalid value 2; with dp = 2 the expert layers"),
        (Parallelism(1, pp=81), LLAMA_70B, "pp: invalid value 81; must be at most the 80 layers"),
    ],
)
def test_layouts_the_model_cannot_take_are_refused(layout, model, message):
    with pytest.raises(ConfigError, match=message):
        layout.check(model)


def test_enable_expert_parallel_is_tp_times_dp():
    assert Parallelism.of(4, dp=2, enable_expert_parallel=True).ep == 8
    with pytest.raises(ConfigError, match="ep: invalid value 4; enable_expert_parallel"):
        Parallelism.of(4, dp=2, ep=4, enable_expert_parallel=True)


@pytest.mark.parametrize("name", ["roofline", "blackbox", "crossmodel", "trained-roofline"])
def test_backends_that_do_not_price_a_dimension_refuse_it(name):
    with pytest.raises(ConfigError, match=r"pp: invalid value 2; latency model .* physics"):
        build_step_time_model(name, MIXTRAL, H100, 2, parallelism=Parallelism(2, pp=2))


def test_trained_physics_takes_ep_without_effect_as_blis():
    batch = StepBatch([(0, 512)], 8, 8000)
    plain = build_step_time_model("trained-physics", MIXTRAL, H100, 2)
    ep = build_step_time_model(
        "trained-physics", MIXTRAL, H100, 2, parallelism=Parallelism(2, ep=2)
    )
    assert ep.step_time_us(batch) == plain.step_time_us(batch)


LAYOUTS = st.builds(
    lambda tp, pp, dp, ep_on: Parallelism.of(tp, pp, dp, enable_expert_parallel=ep_on),
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    pp=st.sampled_from([1, 2, 3, 4]),
    dp=st.sampled_from([1, 2, 4]),
    ep_on=st.booleans(),
)
BATCHES = st.builds(
    lambda chunks, decodes, context: StepBatch(chunks, decodes, decodes * context),
    chunks=st.lists(st.tuples(st.integers(0, 4000), st.integers(1, 2048)), max_size=3),
    decodes=st.integers(0, 128),
    context=st.integers(1, 8000),
)


@settings(max_examples=60, deadline=None)
@given(layout=LAYOUTS)
def test_gpus_used_are_tp_times_dp_times_pp(layout):
    assert layout.gpus == layout.tp * layout.dp * layout.pp
    m = PhysicsModel(DEEPSEEK_V3, H200, layout.tp, parallelism=layout.check(DEEPSEEK_V3))
    assert m.provenance()["layout"]["gpus"] == layout.tp * layout.dp * layout.pp
    assert sum(s.shape.layers for s in m.stages) == 61


@settings(max_examples=60, deadline=None)
@given(
    layout=LAYOUTS,
    batch=BATCHES,
    more=st.sampled_from(["hbm", "compute", "scale_up", "scale_out"]),
    factor=st.floats(1.0, 8.0),
)
def test_step_time_is_non_increasing_in_bandwidth_and_compute(layout, batch, more, factor):
    model = DEEPSEEK_V3
    layout = layout.check(model)
    base_links = links_for(H200)
    gpu, links = H200, base_links
    if more == "hbm":
        gpu = replace(H200, bw_peak_tbs=H200.bw_peak_tbs * factor)
    elif more == "compute":
        gpu = replace(
            H200, tflops_peak=H200.tflops_peak * factor, tflops_fp8=H200.tflops_fp8 * factor
        )
    elif more == "scale_up":
        links = replace(base_links, scale_up_gb_per_s=base_links.scale_up_gb_per_s * factor)
    else:
        links = replace(base_links, scale_out_gb_per_s=base_links.scale_out_gb_per_s * factor)
    slow = PhysicsModel(model, H200, layout.tp, parallelism=layout, links=base_links)
    fast = PhysicsModel(model, gpu, layout.tp, parallelism=layout, links=links)
    assert fast.step_time_us(batch) <= slow.step_time_us(batch)


@settings(max_examples=8, deadline=None)
@given(
    tp=st.sampled_from([1, 2]),
    pp=st.sampled_from([1, 2]),
    dp=st.sampled_from([1, 2]),
    ep_on=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_runs_conserve_requests_and_keep_causality(tp, pp, dp, ep_on, seed):
    """A whole run under any TP x PP x DP x EP layout: every request ends in a counted
    state, none gets its first token before it arrives or finishes before its first token;
    a DP layout serves from tp x pp x dp GPUs as dp routing targets."""
    result = simulator.simulate(
        {
            "model": "qwen/qwen3-30b-a3b",
            "hardware": "H100",
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "enable_expert_parallel": ep_on,
            "seed": seed,
            "engine": {"total_kv_blocks": 4000},
            "workload": {"rate": 20, "num_requests": 40},
        },
        warn_unsteady=False,
    )
    assert len(result.instance_ids) == dp
    assert result.latency_provenance["layout"]["gpus"] == tp * pp * dp
    s = result.summary
    assert (
        s["completed_requests"]
        + s["still_queued"]
        + s["still_running"]
        + s["dropped_unservable"]
        + s["timed_out_requests"]
        == s["injected_requests"]
        == 40
    )
    for r in result.request_records:
        if r.first_token_us is not None:
            assert r.arrival_us <= r.first_token_us
        if r.completion_us is not None:
            assert r.first_token_us <= r.completion_us


def test_provenance_says_what_is_measured_and_what_is_carried_over():
    b200 = build_step_time_model("physics", DEEPSEEK_V3, get_gpu("B200"), 8).provenance()
    assert b200["efficiencies"].startswith(
        "carried over from the H100 fit (vLLM 0.23.0) as fractions of B200's peaks; not "
        "measured on B200"
    )
    assert "NVIDIA HGX/DGX B200 datasheets" in b200["gpu_figures"]
    assert b200["precision"] == {"weights": "8-bit", "kv_cache": "bf16/fp16", "gemm": "fp8"}
    h100 = build_step_time_model("physics", MIXTRAL, H100, 2).provenance()
    assert h100["efficiencies"] == "fitted on H100 with vLLM 0.23.0: calibrated for this GPU"
    pipelined = build_step_time_model(
        "physics", MIXTRAL, H100, 2, parallelism=Parallelism(2, pp=2)
    ).provenance()
    assert "pipeline terms are assumptions" in pipelined["efficiencies"]
    roofline = build_step_time_model("roofline", MIXTRAL, get_gpu("MI300X"), 2).provenance()
    assert roofline["efficiencies"].startswith("MFU 0.45 prefill / 0.3 decode carried over from")
    assert Links(450.0, 50.0, 8).member_peers(range(16)) == [(7, 8), (7, 8)]
