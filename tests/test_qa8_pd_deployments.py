"""QA 2026-12-07 (round 8): PD pools given as `deployments` with `role: prefill` / `decode`
behave as the same pools given under `cluster.pd`; a router's or decider's KV probe sees no
cached prefix on an instance that does not reuse one; the fixed-fleet refusal names what made
the fleet change; a measured defaults.yaml block count is used only when it fits beside the
weights."""

from __future__ import annotations

import copy

import pytest

import simulator
from simulator.api import resolve_deployment
from simulator.catalog.models import load_model
from simulator.cluster.routing import kv_probe_from_caches
from simulator.engine.kv_cache import KVCache
from simulator.errors import ConfigError
from simulator.latency.kv_capacity import GIB_BYTES, model_weight_bytes

LLAMA = "meta-llama/llama-3.1-8b-instruct"
PROMPT = 1000
WORKLOAD = {
    "rate": 5,
    "num_requests": 5,
    "prompt_tokens": {"distribution": "constant", "value": PROMPT},
    "output_tokens": {"distribution": "constant", "value": 10},
}


def _as_deployments(prefill: dict, decode: dict | None = None) -> dict:
    return {
        "seed": 3,
        "model": LLAMA,
        "hardware": "H100",
        "cluster": {"routing": {"policy": "least-loaded"}, "pd": {"decider": "always"}},
        "deployments": [
            {"name": "pf", "role": "prefill", "num_instances": 1, **prefill},
            {"name": "dc", "role": "decode", "num_instances": 1, **(decode or {})},
        ],
        "workload": WORKLOAD,
    }


def _as_cluster_pd(prefill: dict, decode: dict | None = None) -> dict:
    pd = {"decider": "always", "prefill_instances": 1, "decode_instances": 1}
    pd |= {"prefill": prefill} if prefill else {}
    pd |= {"decode": decode} if decode else {}
    return {
        "seed": 3,
        "model": LLAMA,
        "hardware": "H100",
        "cluster": {"num_instances": 2, "routing": {"policy": "least-loaded"}, "pd": pd},
        "workload": WORKLOAD,
    }


# ------------------------------------------------------------- 1. transfer size from the pool


@pytest.mark.parametrize("layout", [{}, {"tp": 2}, {"pp": 2}, {"tp": 2, "pp": 2}])
def test_a_role_prefill_deployments_layout_sizes_the_kv_transfer(layout):
    """Transfer bytes = prompt tokens x the KV bytes per token one GPU of the prefill
    instance holds (docs/pd.md): Llama-3.1-8B stores 2 (K and V) x 32 layers x 8 KV heads x
    128 dims x 2 bytes = 131,072 B per token, of which each GPU holds 1 / (TP x PP). Both ways
    of giving the pools (role deployments, cluster.pd overrides) transfer exactly the same.
    Until 2026-12-07 a role: prefill deployment's tp and pp were ignored: 131,072,000 B at
    TP 2 instead of 65,536,000."""
    per_token = 2 * 32 * 8 * 128 * 2
    assert per_token == 131_072
    shards = layout.get("tp", 1) * layout.get("pp", 1)
    expected = PROMPT * per_token // shards
    by_role = simulator.simulate(_as_deployments(layout), warn_unsteady=False).transfers
    by_pool = simulator.simulate(_as_cluster_pd(layout), warn_unsteady=False).transfers
    assert len(by_role) == len(by_pool) == WORKLOAD["num_requests"]
    assert set(by_role["size_bytes"]) == {expected}
    columns = ["size_bytes", "requested_us", "end_us", "duration_us"]
    assert by_role[columns].reset_index(drop=True).equals(by_pool[columns].reset_index(drop=True))


def test_prefill_deployments_of_different_layouts_are_refused_without_a_transfer_figure():
    """One figure sizes every transfer: prefill deployments whose GPUs hold different shares
    are refused, naming them and their sizes, unless cluster.pd.kv_bytes_per_token gives it."""
    scenario = _as_deployments({"tp": 2})
    scenario["deployments"].append({"name": "pf1", "role": "prefill", "num_instances": 1})
    with pytest.raises(ConfigError) as caught:
        simulator.simulate(scenario, warn_unsteady=False)
    message = str(caught.value)
    assert "pf 65,536 B, pf1 131,072 B" in message
    assert "same tp and pp, or set cluster.pd.kv_bytes_per_token" in message
    scenario["cluster"]["pd"]["kv_bytes_per_token"] = 1000
    transfers = simulator.simulate(scenario, warn_unsteady=False).transfers
    assert set(transfers["size_bytes"]) == {PROMPT * 1000}


# ---------------------------------------------------------- 2. decode pool's context limit


@pytest.mark.parametrize("form", [_as_deployments, _as_cluster_pd])
def test_a_shorter_decode_context_is_warned_about_in_both_forms(form, caplog):
    """A decode pool whose max_model_len (4,096) is below the prefill pool's (Llama-3.1's
    131,072) length-caps disaggregated requests: said whichever way the pools are given
    (until 2026-12-07 role deployments said nothing)."""
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate(form({}, {"max_model_len": 4096}), warn_unsteady=False)
    warned = [m for m in caplog.messages if "decode pool's context limit" in m]
    assert len(warned) == 1
    assert "(4096 tokens) is below the prefill pool's (131072 tokens)" in warned[0]


@pytest.mark.parametrize("form", [_as_deployments, _as_cluster_pd])
def test_equal_contexts_are_not_warned_about(form, caplog):
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate(form({}), warn_unsteady=False)
    assert not [m for m in caplog.messages if "decode pool's context limit" in m]


# ------------------------------------------------ 3. probes and engines without prefix caching


def _shared_prefix(caching: bool, cluster: dict, requests: int = 30) -> dict:
    return {
        "seed": 3,
        "model": LLAMA,
        "hardware": "H100",
        "engine": {"enable_prefix_caching": caching},
        "cluster": cluster,
        "workload": {
            "version": "2",
            "aggregate_rate": 5,
            "num_requests": requests,
            "clients": [
                {
                    "id": "g",
                    "rate_fraction": 1,
                    "prefix_group": "g",
                    "prefix_length": 1024,
                    "arrival": {"process": "poisson"},
                    "input_distribution": {"type": "constant", "params": {"value": 12}},
                    "output_distribution": {"type": "constant", "params": {"value": 10}},
                }
            ],
        },
    }


PD_DECODE_CACHE = {
    "num_instances": 4,
    "pd": {
        "prefill_instances": 2,
        "decode_instances": 2,
        "decider": "prefix-threshold",
        "prefix_mode": "decode-cache",
        "prefix_threshold": 16,
    },
}


@pytest.mark.parametrize("signal_delay_us", [None, 50_000])
def test_decode_cache_decider_counts_no_prefix_on_an_instance_without_prefix_caching(
    signal_delay_us,
):
    """Every prompt is a shared 1,024-token prefix + 12 new tokens. With prefix caching off the
    decode instance will compute all 1,036 tokens whatever its cache holds, so non-cached =
    1,036 > 16 and every request is disaggregated (until 2026-12-07 the probe counted the
    blocks anyway: 28 of 30 were kept on decode as "12 <= 16" and none reused a token). With
    caching on, the same traffic is mostly kept on decode and reuses the prefix."""
    cluster = copy.deepcopy(PD_DECODE_CACHE)
    if signal_delay_us is not None:
        cluster["routing"] = {"cache_signal_delay_us": signal_delay_us}
    off = simulator.simulate(_shared_prefix(False, cluster), warn_unsteady=False).requests
    assert off["disaggregated"].all() and off["cached_tokens"].sum() == 0
    on = simulator.simulate(_shared_prefix(True, cluster), warn_unsteady=False).requests
    assert (~on["disaggregated"]).sum() > 20 and on["cached_tokens"].sum() > 0


@pytest.mark.parametrize("signal_delay_us", [None, 50_000])
def test_precise_prefix_cache_scores_nothing_without_prefix_caching(signal_delay_us):
    """Outside PD too: `precise-prefix-cache` scores the blocks an instance would reuse, none
    when its engine does not reuse a prefix."""
    routing: dict = {"policy": "weighted", "scorers": "precise-prefix-cache:1"}
    if signal_delay_us is not None:
        routing["cache_signal_delay_us"] = signal_delay_us
    cluster = {"num_instances": 2, "routing": routing, "trace": {"level": "decisions"}}

    def scores(caching: bool) -> list[float]:
        result = simulator.simulate(_shared_prefix(caching, cluster, 10), warn_unsteady=False)
        frame = result.decisions.routings_frame()
        return [s for row in frame["scores"] for s in row.values()]

    assert set(scores(False)) == {0.0}
    assert max(scores(True)) > 0


def test_kv_probe_from_caches_reads_nothing_of_a_cache_that_is_not_reused():
    from simulator.engine.request import Request

    cache = KVCache(64, 16)
    held = Request("held", 0, 64, 1, segments=[("sys", 48), ("mine", 16)])
    assert cache.try_allocate(held, 0, held.input_tokens, [])
    asking = Request("ask", 0, 64, 1, segments=[("sys", 48), ("yours", 16)])  # 3 shared
    assert kv_probe_from_caches(lambda i: cache)(0, asking) == 3
    assert kv_probe_from_caches(lambda i: cache, lambda i: True)(0, asking) == 3
    assert kv_probe_from_caches(lambda i: cache, lambda i: False)(0, asking) == 0


# ------------------------------------------------------------- 4. the fixed-fleet refusal


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"instance_lifecycle": {"load_bandwidth_gb_per_s": 10}},
            "instance_lifecycle.load_bandwidth_gb_per_s: invalid value 10;",
        ),
        (
            {"instance_lifecycle": {"loading_delay": {"mean_s": 2.5}}},
            "instance_lifecycle.loading_delay.mean_s: invalid value 2.5;",
        ),
        (
            {"instance_lifecycle": {"warm_up_request_count": 3}},
            "instance_lifecycle.warm_up_request_count: invalid value 3;",
        ),
        (
            {"events": [{"at_s": 1, "action": "drain_instance", "target": "instance_1"}]},
            "events: invalid value [drain_instance at 1 s];",
        ),
        (
            {"autoscaler": [{"deployment": "dc", "scale_up_threshold": 5, "max_instances": 3}]},
            "autoscaler: invalid value ['dc'];",
        ),
    ],
)
@pytest.mark.parametrize("form", [_as_deployments, _as_cluster_pd])
def test_the_fixed_fleet_refusal_names_the_field_and_value(form, extra, named):
    """PD pools run on a fixed fleet; the refusal names the setting that would change it and
    its value, then what is allowed (until 2026-12-07 it listed every kind whatever was set:
    a load bandwidth was told as "loading delays")."""
    scenario = form({}) | extra
    if "autoscaler" in extra and form is _as_cluster_pd:
        scenario["autoscaler"] = [{"scale_up_threshold": 5, "max_instances": 3}]
        named = "autoscaler: invalid value ['(first deployment)'];"
    with pytest.raises(ConfigError) as caught:
        simulator.simulate(scenario, warn_unsteady=False)
    message = str(caught.value)
    assert message.startswith(named)
    assert "prefill/decode pools run on a fixed fleet" in message
    assert "load_bandwidth_gb_per_s 0" in message  # what is allowed


# ------------------------------------------------------- 5. a measured row must fit in memory


def test_a_measured_row_that_does_not_fit_beside_the_weights_is_not_used():
    """Llama-4-Scout FP8 on 2 H100s: defaults.yaml's 25,416 blocks x 16 tokens x 196,608 B
    per token (48 layers x 2 x 8 KV heads x 128 dims x 2 bytes) = 74.5 GiB of KV, beside
    100.4 GiB of weights, is more than the 2 x 80 x 0.9 = 144 GiB vLLM may use: not a vLLM
    count, so the `vllm` rule computes it (until 2026-12-07 the KV alone was compared with
    all 160 GiB, and the row was used)."""
    model = load_model("redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic")
    kv = 25_416 * 16 * (48 * 2 * 8 * 128 * 2)
    weights = model_weight_bytes(model)
    assert round(kv / GIB_BYTES, 1) == 74.5 and round(weights / GIB_BYTES, 1) == 100.4
    assert kv < 2 * 80 * GIB_BYTES and kv + weights > 2 * 80 * 0.9 * GIB_BYTES
    dep = resolve_deployment({"model": model.name, "hardware": "H100", "tp": 2})
    assert dep.kv_blocks_source == "auto"
    blocks = dep.engine.total_kv_blocks
    assert blocks * 16 * 196_608 + weights <= 2 * 80 * 0.9 * GIB_BYTES


def test_a_measured_row_that_fits_beside_the_weights_is_still_used():
    """Llama-3.1-8B on one H100: 29,205 blocks x 16 x 131,072 B = 57.04 GiB of KV beside
    14.96 GiB of weights fits in 80 x 0.9 = 72 GiB (with 1.5 MiB to spare): the measured row
    is used, as every shipped Llama-3.1-8B scenario's figures assume."""
    model = load_model(LLAMA)
    kv = 29_205 * 16 * 131_072
    assert kv + model_weight_bytes(model) <= 80 * 0.9 * GIB_BYTES
    dep = resolve_deployment({"model": LLAMA, "hardware": "H100", "tp": 1})
    assert (dep.engine.total_kv_blocks, dep.kv_blocks_source) == (29_205, "defaults.yaml")
