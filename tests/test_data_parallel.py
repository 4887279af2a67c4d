"""Data-parallel attention ranks in whole runs (docs/parallelism.md "Data-parallel ranks"):
`dp` from the scenario, Python and the CLI, each rank a routable target with its own queue
and KV cache, the ranks of one instance stepping together; the layout composes with EP and
PD pools; what cannot run is refused with the field, the value and what to do instead."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simulator
from simulator.api import as_scenario, resolve_deployment
from simulator.cli import app
from simulator.engine.request import RequestState
from simulator.errors import ConfigError

QWEN_MOE = "qwen/qwen3-30b-a3b"  # 48 layers, 128 experts, 4 KV heads
LLAMA = "meta-llama/llama-3.1-8b-instruct"


def _run(**scenario):
    base = {"model": QWEN_MOE, "hardware": "H100", "tp": 2, "workload": {"num_requests": 60,
            "rate": 20}, "cluster": {"routing": {"policy": "round-robin"}}}  # fmt: skip
    return simulator.simulate({**base, **scenario}, warn_unsteady=False, check_invariants=True)


def _lockstep(result, instance: str) -> None:
    """Every rank of `instance` steps at the group's step times with the group's duration."""
    seen: dict[int, int] = {}
    for iid, eng in zip(result.instance_ids, result.engines, strict=True):
        if not iid.startswith(instance + ".dp"):
            continue
        for start, step in zip(eng.steps.column("start_us"), eng.steps.column("step_us"),
                               strict=True):  # fmt: skip
            assert seen.setdefault(int(start), int(step)) == int(step)
    starts = sorted(seen)
    for a, b in zip(starts, starts[1:], strict=False):
        assert a + seen[a] <= b


def test_each_rank_is_a_routable_instance_and_the_ranks_step_together() -> None:
    result = _run(dp=2, enable_expert_parallel=True)
    assert result.instance_ids == ["instance_0.dp0", "instance_0.dp1"]
    assert result.routed == [30, 30]  # round-robin over the two ranks
    assert result.summary["completed_requests"] == 60
    _lockstep(result, "instance_0")
    block = result.latency_provenance
    assert block["layout"] == {"tp": 2, "pp": 1, "dp": 2, "ep": 4, "gpus": 4}


def test_each_rank_has_the_kv_cache_of_its_own_gpus() -> None:
    # A rank is tp GPUs. Sharding the experts over tp x dp = 4 GPUs instead of slicing them
    # over 2 leaves each GPU a quarter of the routed experts instead of half: more room for
    # KV on the same two GPUs, so a rank of the EP layout holds more blocks than TP2 alone.
    tp2 = resolve_deployment(as_scenario({"model": QWEN_MOE, "hardware": "H100", "tp": 2}))
    ranked = resolve_deployment(
        as_scenario({"model": QWEN_MOE, "hardware": "H100", "tp": 2, "dp": 2,
                     "enable_expert_parallel": True})
    )  # fmt: skip
    assert ranked.engine.total_kv_blocks > tp2.engine.total_kv_blocks
    assert ranked.gpus == 4 and ranked.dp == 2
    result = _run(dp=2, enable_expert_parallel=True)
    assert [e.kv.total_blocks for e in result.engines] == [ranked.engine.total_kv_blocks] * 2


def test_same_seed_same_bytes() -> None:
    one = _run(dp=3)
    two = _run(dp=3)
    assert json.dumps(one.summary, sort_keys=True) == json.dumps(two.summary, sort_keys=True)
    assert one.blis_request_records() == two.blis_request_records()


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    dp=st.integers(1, 3),
    instances=st.integers(1, 2),
    rate=st.sampled_from([5, 40, 200]),
    policy=st.sampled_from(["round-robin", "least-loaded"]),
)
def test_conservation_causality_and_lockstep(dp, instances, rate, policy) -> None:
    result = simulator.simulate(
        {"model": QWEN_MOE, "hardware": "H100", "tp": 1, "dp": dp,
         "workload": {"num_requests": 40, "rate": rate},
         "cluster": {"num_instances": instances, "routing": {"policy": policy}}},
        warn_unsteady=False, check_invariants=True,
    )  # fmt: skip
    assert len(result.instance_ids) == dp * instances
    frame = result.requests
    assert len(frame) == 40
    assert (frame["state"] == RequestState.COMPLETED.value).all()
    assert (frame["first_token_us"] >= frame["arrival_us"]).all()
    assert (frame["completion_us"] >= frame["first_token_us"]).all()
    if dp > 1:
        for i in range(instances):
            _lockstep(result, f"instance_{i}")


def test_decode_pool_with_its_own_ranks() -> None:
    result = simulator.simulate(
        {"model": QWEN_MOE, "hardware": "H100", "tp": 2,
         "workload": {"num_requests": 30, "rate": 10},
         "cluster": {"num_instances": 2, "pd": {"prefill_instances": 1, "decode_instances": 1,
                                                 "decider": "always", "decode": {"dp": 2}}}},
        warn_unsteady=False, check_invariants=True,
    )  # fmt: skip
    assert result.instance_ids == ["instance_0", "instance_1.dp0", "instance_1.dp1"]
    assert result.instance_roles == ["prefill", "decode", "decode"]
    assert result.summary["completed_requests"] == 30
    _lockstep(result, "instance_1")


def test_what_cannot_run_is_refused_naming_what_to_do() -> None:
    with pytest.raises(ConfigError) as err:
        simulator.simulate({"model": QWEN_MOE, "tp": 2, "dp": 2,
                            "latency": {"model": "trained-physics"}})  # fmt: skip
    assert str(err.value).startswith("dp: invalid value 2; latency model 'trained-physics'")
    with pytest.raises(ConfigError) as err:
        simulator.simulate({"model": QWEN_MOE, "tp": 2, "dp": 2,
                            "latency": {"model": "roofline"}})  # fmt: skip
    assert "does not price data parallelism; use latency model physics" in str(err.value)
    with pytest.raises(ConfigError) as err:
        simulator.simulate({"model": QWEN_MOE, "hardware": "H100", "tp": 2, "dp": 2,
                            "deployments": [{"name": "moe", "num_instances": 1}]})  # fmt: skip
    assert str(err.value).startswith("deployments[moe]: dp: invalid value 2; data-parallel")


def test_cli() -> None:
    runner = CliRunner()
    args = ["run", "--model", QWEN_MOE, "--hardware", "H100", "--tp", "2", "--num-requests",
            "10", "--rate", "5", "--quiet"]  # fmt: skip
    ran = runner.invoke(app, [*args, "--dp", "2", "--enable-expert-parallel"])
    assert ran.exit_code == 0, ran.stderr
    assert '"instance_id": "instance_0.dp1"' in ran.stdout
    refused = runner.invoke(app, [*args, "--dp", "2", "--latency-model", "roofline"])
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: --dp (dp): invalid value 2; latency model 'roofline'")
    assert len(refused.stderr.strip().splitlines()) == 1
    zero = runner.invoke(app, [*args, "--dp", "0"])
    assert zero.exit_code == 2 and "dp" in zero.stderr
    pd = runner.invoke(app, [*args, "--num-instances", "2", "--prefill-instances", "1",
                             "--decode-instances", "1", "--pd-decider", "always",
                             "--decode-dp", "2"])  # fmt: skip
    assert pd.exit_code == 0, pd.stderr
    assert '"instance_id": "instance_1.dp1"' in pd.stdout


def test_dense_model_ranks_are_refused_as_replicas() -> None:
    """vLLM keeps DP ranks in lockstep only for an MoE model's expert all-to-alls; a dense
    model's ranks are independent replicas. Simulated in lockstep they ran slower than two
    instances on the same GPUs (ITL 10.0 against 8.6 ms), so dp > 1 on a dense model is
    refused, pointing at instances."""
    with pytest.raises(ConfigError, match=r"dp: invalid value 2; .*is dense.*num_instances"):
        simulator.simulate({"model": LLAMA, "hardware": "H100", "dp": 2,
                            "workload": {"num_requests": 20, "rate": 5}})  # fmt: skip
