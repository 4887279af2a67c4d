"""Layout and precision options reach a run from every entry point (CLI, scenario YAML, Python
dict) and bad values end the CLI with status 2 and one line naming field, value and allowed
values (docs/parallelism.md, docs/models-and-hardware.md)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import simulator
from simulator.cli import app
from tests.specs import one_prefill_one_decode

runner = CliRunner()
SMALL = ["--num-requests", "8", "--rate", "4", "--quiet"]


def _latency_block(stdout: str) -> dict:
    return json.loads(stdout.split("=== Latency Model ===\n", 1)[1])


def test_cli_layout_and_precision_reach_the_provenance():
    res = runner.invoke(
        app,
        [
            "run",
            "--model",
            "qwen/qwen3-30b-a3b",
            "--hardware",
            "B200",
            "--tp",
            "2",
            "--pp",
            "2",
            "--enable-expert-parallel",
            "--kv-cache-dtype",
            "fp8",
            "--weight-dtype",
            "fp4",
            *SMALL,
        ],
    )
    assert res.exit_code == 0, res.stderr
    block = _latency_block(res.stdout)
    assert block["layout"] == {"tp": 2, "pp": 2, "dp": 1, "ep": 2, "gpus": 4}
    assert block["precision"] == {"weights": "fp4", "kv_cache": "8-bit", "gemm": "fp4"}
    assert "not measured on B200" in block["efficiencies"]
    assert "pipeline terms are assumptions" in block["efficiencies"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--weight-dtype", "fp4"],
            "error: --weight-dtype (weight_dtype): invalid value 'fp4'; GPU 'H100' has no FP4 "
            "tensor cores",
        ),
        (
            ["--hardware", "A100-80", "--kv-cache-dtype", "fp8"],
            "error: --kv-cache-dtype (engine.kv_cache_dtype): invalid value 'fp8'; GPU 'A100-80' "
            "has no FP8 support",
        ),
        (
            ["--pp", "2", "--latency-model", "roofline"],
            "error: --pp (pp): invalid value 2; latency model 'roofline' does not price pipeline",
        ),
        (
            ["--ep", "2", "--tp", "2"],
            "error: --ep (ep): invalid value 2; expert parallelism needs an MoE",
        ),
        (
            ["--enable-expert-parallel"],
            "error: --enable-expert-parallel (enable_expert_parallel): invalid value True; expert "
            "parallelism needs an MoE",
        ),
        (["--pp", "33"], "error: --pp (pp): invalid value 33; must be at most the 32 layers"),
        (
            ["--kv-capacity-rule", "exact"],
            "error: command-line flags: --kv-capacity-rule (engine.kv_capacity_rule)",
        ),
    ],
)
def test_cli_refuses_bad_layouts_and_precisions(flags, message):
    res = runner.invoke(app, ["run", *flags, *SMALL])
    assert res.exit_code == 2
    assert res.stderr.startswith(message), res.stderr
    assert "Traceback" not in res.stderr


def test_scenario_file_fields(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(
        "model: mistralai/mixtral-8x7b-v0.1\n"
        "hardware: H200\n"
        "tp: 2\n"
        "pp: 2\n"
        "ep: 2\n"
        "weight_dtype: fp8\n"
        "engine: {kv_cache_dtype: fp8, kv_capacity_rule: vllm}\n"
        "workload: {rate: 4, num_requests: 8}\n"
    )
    result = simulator.simulate(path, warn_unsteady=False)
    resolved = result.scenario["resolved"]
    assert (resolved["tp"], resolved["pp"], resolved["ep"], resolved["gpus"]) == (2, 2, 2, 4)
    assert resolved["kv_blocks_source"] == "auto"
    assert result.latency_provenance["precision"]["gemm"] == "fp8"
    assert result.summary["completed_requests"] == 8


def test_vllm_rule_gives_tp_times_fewer_blocks_than_blis():
    """Each of the 4 GPUs stores a quarter of every block under the vllm rule; its reserve is
    vLLM's measured 4 x 1.6215 = 6.486 GiB where BLIS's planner takes 5.5 + 4 x 0.6 = 7.9
    GiB, so it keeps 1.414 GiB more free: 1.414 x 2^30 / (327,680 x 16 B a block on 4 GPUs)
    = 289.6 blocks more than a quarter of BLIS's count."""

    def blocks(rule: str) -> int:
        result = simulator.simulate(
            {
                "model": "meta-llama/llama-3.1-70b-instruct",
                "tp": 4,
                "engine": {"kv_capacity_rule": rule},
                "workload": {"rate": 2, "num_requests": 2},
            },
            warn_unsteady=False,
        )
        return result.scenario["resolved"]["total_kv_blocks"]

    assert 4 * blocks("vllm") - blocks("blis") == pytest.approx(4 * 289.6, abs=4)


def test_pd_pools_take_their_own_layout():
    result = simulator.simulate(
        {
            "model": "qwen/qwen3-30b-a3b",
            "tp": 2,
            "cluster": one_prefill_one_decode(decode={"pp": 2, "ep": 2}),
            "workload": {"rate": 4, "num_requests": 8},
        },
        warn_unsteady=False,
    )
    roles = result.latency_provenance["by_role"]
    assert roles["prefill"]["layout"]["gpus"] == 2
    assert roles["decode"]["layout"] == {"tp": 2, "pp": 2, "dp": 1, "ep": 2, "gpus": 4}
    assert result.summary["completed_requests"] == 8
