"""Layouts beyond TP where the scenario meets the fleet (docs/parallelism.md, "Deployments,
fleets and plans"): named deployments take their own pp / ep, node pools place a whole
instance on one node (or on whole nodes) or refuse it, `dp: 1` changes nothing
(tests/test_data_parallel.py runs more ranks), and the DeepSeek-V3 study scenario keeps the
laws (conservation, causality) under its layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.api import as_scenario, plan_fleet, resolve_deployment
from simulator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
LLAMA = "meta-llama/llama-3.1-8b-instruct"  # dense, 32 layers, 8 KV heads
QWEN_MOE = "qwen/qwen3-30b-a3b"  # 48 layers, 128 experts, 4 KV heads
FEW = {"num_requests": 20, "rate": 5}


def _fleet(scenario: dict):
    sc = as_scenario(scenario)
    setups, fleet, _ = plan_fleet(sc, resolve_deployment(sc))
    return setups, fleet


def _layouts(scenario: dict) -> dict[str, dict[str, int]]:
    """deployment name -> the layout its instances were built with."""
    setups, fleet = _fleet(scenario)
    return {
        slot.deployment: setup.step_model.provenance()["layout"]
        for slot, setup in zip(fleet.slots, setups, strict=True)
    }


def test_named_deployments_take_their_own_layout() -> None:
    """Each deployment's layout is its own; the fleet reserves tp x pp GPUs per instance
    (2 x 2 = 4 for the MoE deployment, 1 x 1 for the dense one) and EP adds none."""
    scenario = {
        "hardware": "H100",
        "deployments": [
            {"name": "moe", "model": QWEN_MOE, "tp": 2, "pp": 2, "enable_expert_parallel": True},
            {"name": "dense", "model": LLAMA, "tp": 1},
        ],
        "workload": FEW,
    }
    layouts = _layouts(scenario)
    assert layouts["moe"] == {"tp": 2, "pp": 2, "dp": 1, "ep": 2, "gpus": 4}
    assert layouts["dense"] == {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "gpus": 1}
    _, fleet = _fleet(scenario)
    assert {s.deployment: s.gpus_needed for s in fleet.slots} == {"moe": 4, "dense": 1}


def test_unset_layout_fields_inherit_the_scenario() -> None:
    scenario = {
        "model": QWEN_MOE,
        "hardware": "H100",
        "tp": 2,
        "pp": 2,
        "ep": 2,
        "deployments": [{"name": "a"}, {"name": "b", "pp": 3}],
        "workload": FEW,
    }
    layouts = _layouts(scenario)
    assert layouts["a"] == {"tp": 2, "pp": 2, "dp": 1, "ep": 2, "gpus": 4}
    assert layouts["b"] == {"tp": 2, "pp": 3, "dp": 1, "ep": 2, "gpus": 6}


def test_expert_options_are_set_together() -> None:
    """The scenario shards the MoE model's experts; a dense model next to it cannot inherit
    that, and `ep: 1` (or enable_expert_parallel: false) on its deployment takes both expert
    options from the deployment, so nothing half-inherited contradicts it."""
    base = {
        "model": QWEN_MOE,
        "hardware": "H100",
        "tp": 2,
        "enable_expert_parallel": True,
        "workload": FEW,
    }
    inherited = {**base, "deployments": [{"name": "moe"}, {"name": "dense", "model": LLAMA}]}
    with pytest.raises(ConfigError) as err:
        _fleet(inherited)
    assert str(err.value).startswith("deployments[dense]: ")
    assert "expert parallelism needs an MoE model" in str(err.value)
    for own in ({"ep": 1}, {"enable_expert_parallel": False}):
        layouts = _layouts(
            {**base, "deployments": [{"name": "moe"}, {"name": "dense", "model": LLAMA, **own}]}
        )
        assert layouts["moe"]["ep"] == 2 and layouts["dense"]["ep"] == 1
    # An explicit ep on the deployment replaces the scenario's flag instead of contradicting it.
    layouts = _layouts({**base, "deployments": [{"name": "moe", "tp": 4, "ep": 2}]})
    assert layouts["moe"] == {"tp": 4, "pp": 1, "dp": 1, "ep": 2, "gpus": 4}


@st.composite
def _moe_layouts(draw) -> dict:
    """A deployment of Qwen3-30B-A3B (4 KV heads, 48 layers, 128 experts) with a random
    layout it can take: tp dividing the KV heads, any pp, ep dividing tp (one DP rank)."""
    tp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if tp % e == 0]))
    return {
        "tp": tp,
        "pp": draw(st.integers(1, 4)),
        "ep": ep,
        "num_instances": draw(st.integers(1, 3)),
    }


@settings(max_examples=25, deadline=None)
@given(layouts=st.lists(_moe_layouts(), min_size=1, max_size=3))
def test_every_slot_reserves_tp_times_pp_gpus(layouts: list[dict]) -> None:
    """Law: whatever the deployments' layouts, each instance slot reserves tp x pp GPUs (EP
    adds none) and is priced with exactly its deployment's layout."""
    deployments = [{"name": f"d{i}", **layout} for i, layout in enumerate(layouts)]
    scenario = {"model": QWEN_MOE, "hardware": "H200", "deployments": deployments}
    setups, fleet = _fleet(scenario)
    by_name = {d["name"]: d for d in deployments}
    assert len(fleet.slots) == sum(d["num_instances"] for d in deployments)
    for slot, setup in zip(fleet.slots, setups, strict=True):
        d = by_name[slot.deployment]
        assert slot.gpus_needed == d["tp"] * d["pp"]
        layout = setup.step_model.provenance()["layout"]
        assert layout == {"tp": d["tp"], "pp": d["pp"], "dp": 1, "ep": d["ep"],
                          "gpus": d["tp"] * d["pp"]}  # fmt: skip


@pytest.mark.parametrize(
    ("deployment", "needle"),
    [
        ({"pp": 33}, "deployments[d]: pp: invalid value 33; must be at most the 32 layers"),
        ({"ep": 2}, "deployments[d]: ep: invalid value 2; expert parallelism needs an MoE"),
        (
            {"model": QWEN_MOE, "tp": 2, "ep": 4},
            "deployments[d]: ep: invalid value 4; must divide tp x dp = 2",
        ),
        (
            {"model": QWEN_MOE, "tp": 2, "ep": 4, "enable_expert_parallel": True},
            "deployments[d]: ep: invalid value 4; enable_expert_parallel shards experts over",
        ),
        ({"pp": 0}, "deployments[0].pp"),
        ({"enable_expert_parallel": "yes"}, "deployments[0].enable_expert_parallel"),
    ],
)
def test_a_layout_the_deployment_cannot_take_is_refused(deployment: dict, needle: str) -> None:
    scenario = {
        "model": LLAMA,
        "hardware": "H100",
        "deployments": [{"name": "d", **deployment}],
        "workload": FEW,
    }
    with pytest.raises(ConfigError) as err:
        _fleet(scenario)
    assert needle in str(err.value)


def _pooled(gpus_per_node: int) -> dict:
    return {
        "model": LLAMA,
        "hardware": "H100",
        "node_pools": [
            {"name": "p", "gpu_type": "H100", "gpus_per_node": gpus_per_node, "max_nodes": 1}
        ],
        "instance_lifecycle": {"initial_instances_loaded": True},
        "deployments": [{"name": "d", "tp": 4, "pp": 2, "pool": "p"}],
        "workload": FEW,
    }


def test_node_pools_place_a_whole_instance_on_one_node() -> None:
    """TP4 x PP2 = 8 GPUs: on 4-GPU nodes it takes two whole nodes, refused while the pool
    allows one (saying what to change; tests/test_multinode_placement.py places it on two),
    placed on an 8-GPU node (the node's 8 GPUs all held by it) and every request served."""
    with pytest.raises(ConfigError) as err:
        simulator.simulate(_pooled(4))
    text = str(err.value)
    assert "deployments[d]: tp x pp: invalid value 8 (GPUs per instance)" in text
    assert "it takes 2 whole nodes of node pool 'p' (4 GPUs each)" in text
    assert "raise max_nodes to at least 2" in text
    result = simulator.simulate(_pooled(8), warn_unsteady=False)
    assert result.fleet_instances["gpus"].tolist() == [8]
    assert result.summary["completed_requests"] == FEW["num_requests"]


# --- dp ---------------------------------------------------------------------------------


def test_dp_one_changes_no_bit() -> None:
    base = {"model": LLAMA, "hardware": "H100", "workload": FEW}
    plain = simulator.simulate(base, warn_unsteady=False)
    one = simulator.simulate({**base, "dp": 1}, warn_unsteady=False)
    assert json.dumps(plain.summary, sort_keys=True) == json.dumps(one.summary, sort_keys=True)
    assert plain.blis_request_records() == one.blis_request_records()


# --- the DeepSeek-V3 study scenario ------------------------------------------------------


@pytest.fixture(scope="module")
def deepseek():
    return simulator.simulate(ROOT / "scenarios" / "deepseek_v3_dp_ep.yaml", warn_unsteady=False)


def test_the_study_scenario_lays_out_its_pools(deepseek) -> None:
    """One prefill instance of TP8 (44,522 blocks: docs/models-and-hardware.md's worked
    example) and one decode instance of eight DP ranks of one GPU each, experts sharded over
    the eight (EP8): 8 GPUs each, 16 in all. Each decode rank's KV, by hand (vllm rule, one
    GPU of an 8-GPU instance, FP8 weights at 1 B, the latent's 70,272 B per token x 16 per
    block on the GPU):

    weights: 17,117,508,608 params outside the routed experts, all on every rank, plus
        653,908,770,816 / 8 of the routed experts = 98,856,104,960 B = 92.06692 GiB
    available 140.4 x 0.9 = 126.36 GiB; overhead 92.06692 + 1.6215 (vLLM's measured reserve
        per GPU of a multi-GPU instance) = 93.68842 GiB; free int(32.67158 x 2^30)
        = 35,080,839,553 B
    blocks 35,080,839,553 // 1,124,352 = 31,200 per rank (eight ranks: 249,600, 5.6x the TP8
        instance's 44,522 on the same eight GPUs: under TP8 each GPU holds every sequence's
        whole latent)."""
    roles = deepseek.latency_provenance["by_role"]
    assert roles["prefill"]["layout"] == {"tp": 8, "pp": 1, "dp": 1, "ep": 1, "gpus": 8}
    assert roles["decode"]["layout"] == {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "gpus": 8}
    sc = as_scenario(ROOT / "scenarios" / "deepseek_v3_dp_ep.yaml")
    from simulator.api import pool_deployments

    pools = pool_deployments(sc, resolve_deployment(sc))
    assert [pools[r].engine.total_kv_blocks for r in ("prefill", "decode")] == [44_522, 31_200]
    assert sum(pools[r].gpus for r in pools) == 16
    assert deepseek.instance_ids == ["instance_0"] + [f"instance_1.dp{r}" for r in range(8)]


def test_the_study_scenario_conserves_and_is_causal(deepseek) -> None:
    s = deepseek.summary
    assert s["steady_state"] == "steady"
    assert s["completed_requests"] == s["offered_requests"] == 600
    req = deepseek.requests
    done = req[req["state"] == "completed"] if "state" in req else req
    assert len(done) == 600
    assert (done["arrival_us"] <= done["first_token_us"]).all()
    assert (done["first_token_us"] <= done["completion_us"]).all()


def test_pd_roles_and_pool_sizes_in_cluster_pd_are_refused_for_what_they_are() -> None:
    """Deployments with roles size the pools; pool sizes in cluster.pd too were refused as
    'prefill_instances + decode_instances = 2 exceeds num_instances (1)', a count the user
    never set (the fleet has two instances)."""
    scenario = {
        "model": LLAMA,
        "hardware": "H100",
        "deployments": [
            {"name": "p", "num_instances": 1, "role": "prefill"},
            {"name": "d", "num_instances": 1, "role": "decode"},
        ],
        "cluster": {"pd": {"prefill_instances": 1, "decode_instances": 1, "decider": "always"}},
        "workload": FEW,
    }
    with pytest.raises(ConfigError, match="deployments with role prefill and decode size the"):
        _fleet(scenario)
    del (
        scenario["cluster"]["pd"]["prefill_instances"],
        scenario["cluster"]["pd"]["decode_instances"],
    )
    setups, fleet = _fleet(scenario)  # the decider alone stays
    assert [s.role for s in setups] == ["prefill", "decode"]


def test_a_top_level_layout_no_deployment_runs_is_not_warned_about(caplog) -> None:
    """Llama-3.1-70B on one H100 does not fit (132 GiB of weights against 72 GiB): with
    deployments only the top-level fields still name that layout, which no instance runs, and
    its failed KV sizing was a WARNING before every run. A deployment that runs it still warns."""
    import logging

    seventy = "meta-llama/llama-3.1-70b-instruct"
    scenario = {"model": seventy, "hardware": "H100", "workload": FEW}
    with caplog.at_level(logging.WARNING, logger="servesim"):
        _fleet({**scenario, "deployments": [{"name": "big", "tp": 8}]})
    assert "KV capacity auto-calculation failed" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="servesim"):
        _fleet({**scenario, "deployments": [{"name": "small", "tp": 1}]})
    assert "KV capacity auto-calculation failed" in caplog.text
