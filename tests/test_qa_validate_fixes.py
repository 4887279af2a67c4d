"""QA's defects in `validate` and in replaying an exported multi-model trace.

- an observe cell is scored with the server its trace header records (header first, then
  server_config.json), as `replay` and `calibrate` simulate it;
- a cell with its own server_config.json is found on its own;
- a request file whose prompt lengths show no cycle is replayed with every prompt new, and
  `--prompt-reuse` refuses it (the profile's count is no cycle);
- a replay of an exported two-model run with its scenario file prints the run's summary.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ConfigError
from simulator.scenario import Scenario
from simulator.validate import discover_runs, distinct_prompts, reused_prompts
from simulator.workload.server_settings import recorded_server, recorded_settings
from tests.test_cli_workloads import invoke

REPOSITORY = Path(__file__).resolve().parents[1]
V23 = REPOSITORY / "groundtruth" / "vllm-0.23.0-h100-qwen3-14b"
V15 = REPOSITORY / "groundtruth" / "vllm-0.15.1-h100"
CODEGEN = "20260217-155451-llama-2-7b-tp1-codegen"


def _cell(folder: Path, server: dict | None = None, rows: int = 40) -> Path:
    """A copy of the shipped agg_2rps cell's first `rows` requests; `server` replaces its
    header's `server` section."""
    folder.mkdir(parents=True)
    header = yaml.safe_load((V23 / "sweep_rate-agg_2rps" / "trace.yaml").read_text())
    if server is not None:
        header["server"] = server
    (folder / "trace.yaml").write_text(yaml.safe_dump(header, sort_keys=False))
    with (V23 / "sweep_rate-agg_2rps" / "trace.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        kept = [row for _, row in zip(range(rows), reader, strict=False)]
    with (folder / "trace.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(kept[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
    return folder


# ------------------------------------------------------------ 1: the header's server section


def test_validate_scores_a_cell_with_the_server_its_header_records(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    dataset.mkdir()
    shutil.copy(V23 / "server_config.json", dataset / "server_config.json")
    server = {
        "type": "vllm",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "tensor_parallel": 2,
        "max_num_seqs": 1,
        "block_size": 32,
        "max_model_len": 8192,
    }
    cell = _cell(dataset / "cellA", server)
    (run,) = discover_runs(dataset, traces=True)
    # The header outranks server_config.json (1,024 sequences by vLLM's default, qwen, TP1,
    # block 16, 40,960 tokens), exactly as replay reads the recording.
    assert run.model == "meta-llama/llama-3.1-8b-instruct"
    assert (run.tp, run.max_num_seqs, run.block_size_tokens, run.max_model_len) == (
        2,
        1,
        32,
        8192,
    )
    # max_num_seqs is recorded now: not said to be vLLM's default.
    assert run.vllm_default_settings == ()
    replayed = recorded_server(cell / "trace.yaml", cell / "trace.csv", "H100").settings
    assert replayed["tp"] == run.tp
    assert replayed["engine.max_num_running_reqs"] == run.max_num_seqs
    assert replayed["engine.block_size_tokens"] == run.block_size_tokens
    assert replayed["engine.max_model_len"] == run.max_model_len
    # What the header does not record still comes from server_config.json.
    assert (run.max_num_batched_tokens, run.gpu_kv_blocks) == (8192, 18038)


def test_a_bad_header_value_names_the_header(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    dataset.mkdir()
    shutil.copy(V23 / "server_config.json", dataset / "server_config.json")
    _cell(dataset / "cellA", {"type": "vllm", "max_num_seqs": -3})
    with pytest.raises(ConfigError, match=r"trace\.yaml'.*server\.max_num_seqs.*-3"):
        discover_runs(dataset, traces=True)


def test_selecting_runs_does_not_read_the_others(tmp_path: Path) -> None:
    """QA: `validate --runs cellA` failed on cellB's bad header, a run it was not asked to
    read; the names are known from the folders, and only the selected runs' files are read.
    The bad cell still fails when it is selected (or when every run is)."""
    dataset = tmp_path / "ds"
    dataset.mkdir()
    shutil.copy(V23 / "server_config.json", dataset / "server_config.json")
    _cell(dataset / "cellA")
    _cell(dataset / "cellB", {"type": "vllm", "max_num_seqs": -3})
    (run,) = discover_runs(dataset, traces=True, names=["cellA"])
    assert run.name == "cellA"
    for names in (["cellB"], None):
        with pytest.raises(ConfigError, match=r"cellB.*trace\.yaml'.*server\.max_num_seqs"):
            discover_runs(dataset, traces=True, names=names)
    with pytest.raises(
        ConfigError, match=r"--runs: no run matches 'cellC'; available: cellA, cellB"
    ):
        discover_runs(dataset, traces=True, names=["cellC"])


# ------------------------------------------------- 2: a cell with its own server_config.json


def test_a_cell_finds_its_own_server_config(tmp_path: Path) -> None:
    cell = _cell(tmp_path / "good1")
    shutil.copy(V23 / "server_config.json", cell / "server_config.json")
    (run,) = discover_runs(cell, traces=True)
    assert run.meta_json == cell / "server_config.json"
    assert (run.model, run.gpu_kv_blocks, run.dataset) == ("qwen/qwen3-14b", 18038, "vllm-0.23.0")


def test_a_cell_without_server_config_names_both_places(tmp_path: Path) -> None:
    cell = _cell(tmp_path / "alone" / "cellX")
    with pytest.raises(ConfigError) as caught:
        discover_runs(cell, traces=True)
    message = str(caught.value)
    assert str((cell / "server_config.json").resolve()) in message
    assert str((cell.parent / "server_config.json").resolve()) in message


# ------------------------------------------------------------------- 3: no prompt cycle


@pytest.fixture
def run_without_cycle(tmp_path: Path) -> Path:
    """The 7B codegen run's first 300 requests with shuffled prompt lengths (no cycle left),
    its profile (which sets system prompts x users) kept."""
    dataset = tmp_path / "gt" / "vllm-0.15.1-h100"
    requests = dataset / "requests"
    requests.mkdir(parents=True)
    shutil.copy(V15 / "requests" / f"{CODEGEN}.meta.json", requests / f"{CODEGEN}.meta.json")
    with (V15 / "requests" / f"{CODEGEN}.requests.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = [row for _, row in zip(range(300), reader, strict=False)]
    lengths = [row["input_tokens"] for row in rows]
    random.Random(3).shuffle(lengths)
    for row, length in zip(rows, lengths, strict=True):
        row["input_tokens"] = length
    with (requests / f"{CODEGEN}.requests.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    shutil.copytree(V15 / "runs" / CODEGEN, dataset / "runs" / CODEGEN)
    profile = yaml.safe_load((dataset / "runs" / CODEGEN / "profile.yaml").read_text())
    assert profile["data"]["shared_prefix"]["num_unique_system_prompts"]  # the old fallback
    return tmp_path / "gt"


def test_no_prompt_cycle_replays_every_prompt_as_new(run_without_cycle: Path) -> None:
    (run,) = discover_runs(run_without_cycle)
    assert distinct_prompts(run) is None
    assert reused_prompts(run) is None
    with pytest.raises(ConfigError, match=r"--prompt-reuse: .*repeat in no cycle"):
        reused_prompts(run, True)


def test_cli_says_no_cycle_and_prompt_reuse_refuses(run_without_cycle: Path) -> None:
    runner = CliRunner()
    default = runner.invoke(app, ["validate", str(run_without_cycle)])
    assert default.exit_code == 0, default.output
    assert "prompt reuse: no prompt cycle found, every prompt replayed as new" in default.stderr
    assert "prompt cycle;" not in default.stderr
    demanded = runner.invoke(app, ["validate", str(run_without_cycle), "--prompt-reuse"])
    assert demanded.exit_code == 2
    assert "--prompt-reuse" in demanded.stderr and "no cycle" in demanded.stderr


# ------------------------------------------------------ 4: an exported multi-model run

TWO_MODELS = {
    "name": "two",
    "seed": 7,
    "cluster": {"routing": {"policy": "least-loaded"}},
    "node_pools": [
        {
            "name": "h",
            "gpu_type": "H100",
            "gpus_per_node": 8,
            "initial_nodes": 1,
            "max_nodes": 1,
            "cost_per_hour": 80,
        },
        {
            "name": "a",
            "gpu_type": "A100-80",
            "gpus_per_node": 4,
            "initial_nodes": 1,
            "max_nodes": 1,
            "cost_per_hour": 40,
        },
    ],
    "deployments": [
        {
            "name": "llama",
            "model": "meta-llama/llama-3.1-8b-instruct",
            "num_instances": 1,
            "pool": "h",
        },
        {"name": "qwen", "model": "qwen/qwen3-14b", "num_instances": 1, "pool": "a", "tp": 2},
    ],
    "workload": {
        "version": "2",
        "seed": 7,
        "aggregate_rate": 40,
        "horizon": 1_500_000,
        "clients": [
            {
                "id": "c-llama",
                "model": "meta-llama/llama-3.1-8b-instruct",
                "rate_fraction": 0.3,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 300}},
                "output_distribution": {"type": "constant", "params": {"value": 40}},
            },
            {
                "id": "c-qwen",
                "model": "qwen/qwen3-14b",
                "rate_fraction": 0.7,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 50}},
                "output_distribution": {"type": "constant", "params": {"value": 120}},
            },
        ],
    },
}


def test_replaying_an_exported_two_model_run_reproduces_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("two.yaml").write_text(yaml.safe_dump(TWO_MODELS, sort_keys=False))
    run = invoke("run", "two.yaml", "-q", "--trace-output", "tr")
    assert run.exit_code == 0, run.output
    header = yaml.safe_load(Path("tr.yaml").read_text())
    # The header's server is the first deployment's (H100: 1,024 sequences; llama's context).
    assert header["server"]["max_num_seqs"] == 1024
    replay = invoke(
        "replay",
        "--trace-header",
        "tr.yaml",
        "--trace-data",
        "tr.csv",
        "--scenario",
        "two.yaml",
        "--seed",
        7,
        "--routing-policy",
        "least-loaded",
        "--horizon",
        1_500_000,
        "-q",
    )
    assert replay.exit_code == 0, replay.output
    assert replay.stdout == run.stdout
    notes = [line for line in replay.stderr.splitlines() if "not applied" in line]
    assert len(notes) == 1 and "deployments keep their own settings" in notes[0]


def test_recorded_settings_of_a_scenario_with_deployments(tmp_path: Path) -> None:
    cell = _cell(tmp_path / "cell", {"type": "vllm", "model": "Qwen/Qwen3-14B", "max_num_seqs": 7})
    shutil.copy(V23 / "server_config.json", cell / "server_config.json")
    scenario = Scenario.model_validate(
        {key: TWO_MODELS[key] for key in ("node_pools", "deployments")}
    )
    followed, server, unfollowed = recorded_settings(
        scenario, {}, cell / "trace.yaml", cell / "trace.csv"
    )
    # Only what holds for every deployment; the one server's settings are set aside.
    assert set(followed) == {"engine.enable_prefix_caching", "latency.vllm_version"}
    assert "engine.max_num_running_reqs" in server.set_aside and unfollowed is None
    assert "max_num_running_reqs 7" in server.line(followed)
    # Without deployments the same recording is followed.
    alone, _, _ = recorded_settings(Scenario(), {}, cell / "trace.yaml", cell / "trace.csv")
    assert alone["engine.max_num_running_reqs"] == 7
    assert json.dumps(alone["model"]) == '"Qwen/Qwen3-14B"'


def test_export_of_deployments_lists_a_top_level_setting_equal_to_the_header(
    tmp_path: Path,
) -> None:
    """A replay with deployments no longer applies the header's max_num_seqs, so a run that
    set it at the top level (reaching every deployment) must be told it, even though the
    header, which is the first deployment's, holds the same value."""
    from simulator.trace_export import unrecorded_settings

    cell = _cell(tmp_path / "tr", {"type": "servesim", "max_num_seqs": 1024})
    data = {key: TWO_MODELS[key] for key in ("node_pools", "deployments")}
    scenario = Scenario.model_validate(data | {"engine": {"max_num_running_reqs": 1024}})
    settings = unrecorded_settings(scenario, cell / "trace.yaml", cell / "trace.csv")
    assert settings["engine.max_num_running_reqs"] == 1024
