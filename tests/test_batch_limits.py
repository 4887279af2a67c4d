"""Batch limits a scenario leaves unset (docs/behaviour.md §1.5): a stock vLLM server's on the
GPU under servesim's `physics` model, BLIS's defaults under BLIS's latency models, and what
the run used said in its results."""

from __future__ import annotations

import json

import pytest

import simulator
from simulator.deployment import BLIS_BATCH_LIMITS, pool_deployments, resolve_deployment
from simulator.scenario import scenario_from_dict
from tests.test_cli_workloads import invoke

SMALL = {"workload": {"num_requests": 30, "rate": 10}}

# vLLM's OpenAI server started without --max-num-batched-tokens / --max-num-seqs
# (vllm/engine/arg_utils.py): a GPU with at least 70 GiB that is not an A100 gets 8,192 tokens
# and 1,024 sequences; any other GPU 2,048 and 256.
LARGE, OTHER = (8192, 1024), (2048, 256)


def _limits(scenario: dict) -> tuple[int, int, str]:
    deployment = resolve_deployment(scenario_from_dict(scenario))
    engine = deployment.engine
    return (
        engine.max_num_scheduled_tokens,
        engine.max_num_running_reqs,
        deployment.batch_limits_source,
    )


@pytest.mark.parametrize(
    ("hardware", "expected"),
    [
        ("H100", LARGE),  # 80 GiB
        ("H200", LARGE),  # 141 GiB
        ("A100-80", OTHER),  # 80 GiB, but an A100
        ("L40S", OTHER),  # 48 GiB
    ],
)
def test_physics_takes_a_stock_vllm_servers_limits_on_the_gpu(hardware, expected):
    tokens, running, source = _limits({**SMALL, "hardware": hardware})
    assert (tokens, running) == expected
    assert source.startswith("vLLM's default on ")


@pytest.mark.parametrize("latency", ["roofline", "blackbox", "trained-roofline", "crossmodel"])
def test_blis_latency_models_keep_blis_limits(latency):
    """BLIS's runs are reproduced with BLIS's defaults: 2,048 tokens, 256 sequences."""
    scenario = {**SMALL, "latency": {"model": latency}}
    if latency == "blackbox":
        scenario["latency"] |= {"alpha_coeffs": [1, 0, 0], "beta_coeffs": [1000, 1, 1]}
    assert _limits(scenario) == (*BLIS_BATCH_LIMITS, "BLIS's default")


def test_a_set_limit_wins_and_the_description_says_what_the_values_are():
    assert _limits({**SMALL, "engine": {"max_num_running_reqs": 64}}) == (
        8192,
        64,
        "max_num_running_reqs set; max_num_scheduled_tokens: vLLM's default on H100",
    )
    both = {"max_num_running_reqs": 64, "max_num_scheduled_tokens": 512}
    assert _limits({**SMALL, "engine": both}) == (512, 64, "set")
    # Values equal to the default read as the default, whoever set them (a replay sets the
    # recorded limits and reads as the run that recorded them).
    stock = {"max_num_running_reqs": 1024, "max_num_scheduled_tokens": 8192}
    assert _limits({**SMALL, "engine": stock})[2] == "vLLM's default on H100"


def test_each_pd_pool_takes_its_own_gpus_limits():
    scenario = scenario_from_dict(
        {
            **SMALL,
            "cluster": {
                "num_instances": 2,
                "pd": {
                    "prefill_instances": 1,
                    "decode_instances": 1,
                    "prefill": {"hardware": "L40S"},
                },
            },
        }
    )
    pools = pool_deployments(scenario, resolve_deployment(scenario))
    prefill, decode = pools["prefill"].engine, pools["decode"].engine
    assert (prefill.max_num_scheduled_tokens, prefill.max_num_running_reqs) == OTHER
    assert (decode.max_num_scheduled_tokens, decode.max_num_running_reqs) == LARGE


def test_leaving_them_unset_is_setting_the_defaults():
    """Law: a run with unset limits is byte-identical to one that sets the values they
    resolve to, under physics (vLLM's) and under roofline (BLIS's)."""
    for latency, (tokens, running) in (("physics", LARGE), ("roofline", BLIS_BATCH_LIMITS)):
        scenario = {**SMALL, "workload": {"num_requests": 60, "rate": 40}}
        scenario["latency"] = {"model": latency}
        unset = simulator.simulate(scenario)
        given = simulator.simulate(
            scenario,
            engine__max_num_scheduled_tokens=tokens,
            engine__max_num_running_reqs=running,
        )
        assert json.dumps(unset.summary, sort_keys=True) == json.dumps(
            given.summary, sort_keys=True
        )


def test_the_cli_prints_them_and_a_flag_wins():
    res = invoke("run", "--num-requests", 20, "--rate", 10)
    assert res.exit_code == 0, res.output
    block = res.stdout[res.stdout.index("=== Engine Policies ===") :]
    policies = json.loads(block[block.index("{") : block.index("}") + 1])
    assert policies["max_num_running_reqs"] == 1024
    assert policies["max_num_scheduled_tokens"] == 8192
    assert policies["batch_limits_source"] == "vLLM's default on H100"
    res = invoke("run", "--num-requests", 20, "--rate", 10, "--max-num-seqs", 32)
    assert res.exit_code == 0, res.output
    assert '"max_num_running_reqs": 32' in res.stdout
    res = invoke("run", "--num-requests", 20, "--rate", 10, "--latency-model", "roofline")
    assert '"max_num_running_reqs": 256' in res.stdout
    assert '"batch_limits_source": "BLIS\'s default"' in res.stdout


def test_each_fleet_deployment_takes_its_own_gpus_limits():
    """Two deployments on node pools of different GPUs: each engine has its GPU's limits."""
    result = simulator.simulate(
        {
            "node_pools": [
                {"name": "big", "gpu_type": "H100", "gpus_per_node": 1, "initial_nodes": 1},
                {"name": "small", "gpu_type": "L40S", "gpus_per_node": 1, "initial_nodes": 1},
            ],
            "deployments": [
                {"name": "on-h100", "num_instances": 1, "pool": "big"},
                {"name": "on-l40s", "num_instances": 1, "pool": "small"},
            ],
            "workload": {"num_requests": 20, "rate": 10},
        }
    )
    limits = sorted(
        (e.config.max_num_scheduled_tokens, e.config.max_num_running_reqs) for e in result.engines
    )
    assert limits == sorted([LARGE, OTHER])


def test_an_exported_trace_says_when_its_replay_would_take_another_token_budget(tmp_path):
    """A TraceV2 header records the sequence limit, not the token budget: a run with its own
    budget says so when it exports, and giving it to the replay reproduces the run."""
    prefix = tmp_path / "t"
    common = ["--workload", "chatbot", "--rate", 25, "--num-requests", 60]
    run = invoke("run", *common, "--max-num-batched-tokens", 4096, "--trace-output", prefix)
    assert run.exit_code == 0, run.output
    assert "replay it with --max-num-batched-tokens 4096" in run.stderr
    replay = ["replay", "--trace-header", f"{prefix}.yaml", "--trace-data", f"{prefix}.csv"]
    rep = invoke(*replay, "--max-num-batched-tokens", 4096)
    assert rep.exit_code == 0, rep.output
    assert rep.stdout == run.stdout
    stock = invoke("run", *common, "--trace-output", tmp_path / "s")
    assert "note: --trace-output" not in stock.stderr


@pytest.mark.parametrize(
    ("engine", "warned"),
    [
        # Llama-3.1-8B: max_position_embeddings 131,072, rope_type llama3 (not scaled).
        ({"max_model_len": 200_000}, "above meta-llama/llama-3.1-8b-instruct's own context"),
        # 10 blocks x 16 tokens = 160 tokens of KV cache.
        ({"max_model_len": 1_000, "total_kv_blocks": 10}, "more than the KV cache holds (160"),
        # vLLM: max_num_batched_tokens must be >= max_num_seqs.
        ({"max_num_scheduled_tokens": 10, "max_num_running_reqs": 64}, "below engine.max_num_run"),
    ],
)
def test_settings_vllm_refuses_at_start_up_run_with_a_warning(engine, warned, caplog):
    with caplog.at_level("WARNING", logger="servesim"):
        resolve_deployment(scenario_from_dict({**SMALL, "engine": engine}))
    messages = [r.getMessage() for r in caplog.records if "vLLM refuses" in r.getMessage()]
    assert len(messages) == 1 and warned in messages[0]


def test_settings_vllm_accepts_are_not_warned_about(caplog):
    # 131,072 tokens is the model's own limit and 8,192 >= 1,024: vLLM starts.
    engine = {"max_model_len": 131_072, "max_num_scheduled_tokens": 1024}
    with caplog.at_level("WARNING", logger="servesim"):
        resolve_deployment(scenario_from_dict({**SMALL, "engine": engine}))
    assert not [r for r in caplog.records if "vLLM refuses" in r.getMessage()]


@pytest.mark.parametrize(
    "latency", ["roofline", "trained-roofline", "crossmodel", "trained-physics"]
)
def test_an_fp8_kv_cache_under_a_blis_backend_is_said_to_change_only_capacity(latency, caplog):
    with caplog.at_level("WARNING", logger="servesim"):
        resolve_deployment(
            scenario_from_dict(
                {**SMALL, "latency": {"model": latency}, "engine": {"kv_cache_dtype": "fp8"}}
            )
        )
    assert [r for r in caplog.records if "changes only the KV capacity" in r.getMessage()]
    caplog.clear()
    with caplog.at_level("WARNING", logger="servesim"):
        resolve_deployment(scenario_from_dict({**SMALL, "engine": {"kv_cache_dtype": "fp8"}}))
    assert not [r for r in caplog.records if "changes only the KV capacity" in r.getMessage()]


def test_a_settings_warning_is_said_once_per_run(caplog):
    """A run resolves its scenario more than once (the top level, then each PD pool): the
    context-limit warning came once per resolution. Said once per run, and again next run."""
    from pathlib import Path

    pd = Path(__file__).resolve().parents[1] / "scenarios" / "pd_2p2d.yaml"
    for _run in range(2):
        caplog.clear()
        with caplog.at_level("WARNING", logger="servesim"):
            simulator.simulate(
                pd, engine__max_model_len=10_000_000, workload__num_requests=5, warn_unsteady=False
            )
        own = [r for r in caplog.records if "own context limit" in r.getMessage()]
        assert len(own) == 1
