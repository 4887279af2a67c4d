"""A replay of a recorded trace simulates the server that recorded it (issue 27: one default
for replay, validate and calibrate, chosen from what the server did), field by field, unless
the user chose the field: a flag, a keyword, or a scenario field set explicitly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator import replay, simulate
from simulator.cli import app
from simulator.validate import discover_runs, validate_run
from simulator.workload.server_settings import recorded_server

OBSERVE = Path(__file__).resolve().parents[1] / "data" / "observe_v3"
CELL = OBSERVE / "sweep_rate-agg_2rps"
HEADER, DATA = CELL / "trace.yaml", CELL / "trace.csv"
BLIS = Path(__file__).resolve().parents[1] / "data" / "blis"


def test_the_recorded_server_is_read_from_the_header_and_the_sweeps_configuration() -> None:
    server = recorded_server(HEADER, DATA)
    assert server.settings == {
        # server_config.json, in the folder above the cell
        "tp": 1,
        "engine.max_num_scheduled_tokens": 8192,
        "engine.block_size_tokens": 16,
        "engine.total_kv_blocks": 18038,
        "engine.max_model_len": 40960,
        "latency.vllm_version": "0.23.0",
        # the header's server section wins over the file
        "model": "Qwen/Qwen3-14B",
        # recorded nowhere: vLLM's own default on an H100 (>= 70 GiB, not an A100)
        "engine.max_num_running_reqs": 1024,
        "engine.enable_prefix_caching": True,
    }
    assert server.sources["model"] == "trace header"
    assert server.sources["engine.total_kv_blocks"] == "server_config.json"
    assert server.sources["engine.max_num_running_reqs"] == "vLLM's default on H100"
    # On an A100 the same unflagged server takes 256 sequences (the recorded 8,192 tokens stay).
    on_a100 = recorded_server(HEADER, DATA, "A100-80")
    assert on_a100.settings["engine.max_num_running_reqs"] == 256
    assert on_a100.settings["engine.max_num_scheduled_tokens"] == 8192


def test_a_generated_trace_records_no_server() -> None:
    """BLIS's own traces have no server section and no configuration: nothing is followed but
    the prefix-caching default, which is servesim's own default too (parity stays exact)."""
    server = recorded_server(BLIS / "r1_fixed512.trace.yaml", BLIS / "r1_fixed512.trace.csv")
    assert server.settings == {"engine.enable_prefix_caching": True}
    assert server.line(server.settings) == ""


def test_replay_without_choices_is_validates_replay_of_the_cell(tmp_path: Path) -> None:
    """With nothing chosen, `replay` of an observe cell simulates what `validate` does for it:
    the same requests, the same predicted latencies."""
    dataset = tmp_path / "vllm-0.23.0-h100-qwen3-14b"
    shutil.copytree(CELL, dataset / CELL.name)
    shutil.copy(OBSERVE / "server_config.json", dataset / "server_config.json")
    result = replay(dataset / CELL.name / "trace.yaml", dataset / CELL.name / "trace.csv")
    assert result.scenario["resolved"]["model"] == "qwen/qwen3-14b"
    engine = result.scenario["engine"]
    assert (engine["total_kv_blocks"], engine["max_num_running_reqs"]) == (18038, 1024)
    assert (engine["max_num_scheduled_tokens"], engine["max_model_len"]) == (8192, 40960)
    (cell,) = discover_runs(dataset, traces=True)
    scored = {s["metric"]: s["predicted"] for s in validate_run(cell)["scores"]}
    records = {r.index: r for r in result.request_records}
    ttft_ms = [(records[i].first_token_us - records[i].arrival_us) / 1e3 for i in sorted(records)]
    assert scored["ttft_mean_ms"] == pytest.approx(sum(ttft_ms) / len(ttft_ms), rel=1e-9)


def test_what_the_user_chose_wins_field_by_field(tmp_path: Path) -> None:
    chosen = replay(HEADER, DATA, engine__max_num_running_reqs=64)
    engine = chosen.scenario["engine"]
    assert engine["max_num_running_reqs"] == 64  # the keyword
    assert engine["total_kv_blocks"] == 18038  # the recording, for the rest
    # Another model (or TP, or GPU) is another deployment: its KV cache is sized from its own
    # memory, not the recording's 18,038 blocks; the batch limits still follow the recording.
    other = replay(HEADER, DATA, model="meta-llama/llama-3.1-8b-instruct")
    assert other.scenario["resolved"]["model"] == "meta-llama/llama-3.1-8b-instruct"
    assert other.scenario["engine"]["total_kv_blocks"] != 18038
    assert other.scenario["engine"]["max_num_scheduled_tokens"] == 8192
    # Another TP is another deployment of the recorded model: the model is still followed,
    # the cache sized from the chosen deployment's memory.
    tp2 = replay(HEADER, DATA, tp=2)
    assert tp2.scenario["resolved"]["model"] == "qwen/qwen3-14b"
    assert tp2.scenario["resolved"]["tp"] == 2
    assert tp2.scenario["engine"]["total_kv_blocks"] != 18038
    # A scenario file's explicit field wins too, through `simulate` as through the CLI.
    scenario = tmp_path / "replay.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "engine": {"total_kv_blocks": 5000},
                "trace": {"header": str(HEADER), "data": str(DATA)},
            }
        )
    )
    by_file = simulate(scenario)
    assert by_file.scenario["engine"]["total_kv_blocks"] == 5000
    assert by_file.scenario["resolved"]["model"] == "qwen/qwen3-14b"
    cli = CliRunner().invoke(app, ["run", str(scenario), "--quiet"])
    assert cli.exit_code == 0, cli.output
    assert by_file.summary_text() in cli.stdout  # the same run


def test_cli_replay_says_what_it_followed(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    args = ["replay", "--trace-header", str(HEADER), "--trace-data", str(DATA), "--quiet"]
    out = CliRunner().invoke(app, [*args, "--max-num-seqs", "256", "--results-path", str(results)])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.stderr.splitlines() if x.startswith("recorded server: "))
    assert "model Qwen/Qwen3-14B (trace header); tp 1," in line
    assert (
        "total_kv_blocks 18,038, max_model_len 40,960, vllm_version 0.23.0 (server_config.json)"
        in line
    )
    assert "max_num_running_reqs" not in line  # the flag chose it
    assert json.loads(results.read_text())["completed_requests"] == 200


def test_a_recorded_model_servesim_lacks_is_said_not_followed(tmp_path: Path) -> None:
    header = tmp_path / "t.yaml"
    header.write_text(HEADER.read_text().replace("Qwen/Qwen3-14B", "acme/unknown-7b"))
    data = tmp_path / "t.csv"
    shutil.copy(DATA, data)
    args = ["replay", "--trace-header", str(header), "--trace-data", str(data), "--quiet"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert (
        "note: model: the recording's 'acme/unknown-7b' is not in servesim's catalog "
        "(servesim models); simulating meta-llama/llama-3.1-8b-instruct (--model chooses)"
    ) in out.stderr
    assert "model acme/unknown-7b" not in out.stderr
    # A model servesim has is followed under another TP, and no such note is given.
    known = ["replay", "--trace-header", str(HEADER), "--trace-data", str(DATA), "--quiet"]
    out = CliRunner().invoke(app, [*known, "--tp", "2"])
    assert out.exit_code == 0, out.output
    assert "not in servesim's catalog" not in out.stderr
    assert "model Qwen/Qwen3-14B (trace header)" in out.stderr


def test_a_sweep_point_over_a_trace_scenario_follows_the_recorded_server_too(
    tmp_path: Path,
) -> None:
    """Every path that turns a scenario and overrides into a run (`with_overrides`: the CLI,
    sweeps, plans) fills what nobody chose from the recording; what a point sets wins."""
    from simulator.api import as_scenario, with_overrides

    scenario = tmp_path / "replay.yaml"
    scenario.write_text(yaml.safe_dump({"trace": {"header": str(HEADER), "data": str(DATA)}}))
    point = with_overrides(as_scenario(scenario), {"engine.max_num_running_reqs": 32, "seed": 7})
    assert point.model == "Qwen/Qwen3-14B"
    assert (point.engine.total_kv_blocks, point.engine.max_num_running_reqs) == (18038, 32)
    # Applying overrides again finds every field set: nothing changes (idempotent).
    assert with_overrides(point, {"seed": 7}) == point


def test_calibrate_takes_the_same_recorded_server_for_a_pair_as_for_its_folder() -> None:
    """`calibrate --trace-header/--trace-data` on a cell and `calibrate --traces` on its sweep
    replay the same deployment, the one `replay` follows."""
    import simulator.calibrate as cal

    (in_folder,) = cal.trace_cases(OBSERVE)
    pair = cal.trace_case(HEADER, DATA)
    assert pair.overrides == in_folder.overrides
    assert pair.vllm_version == in_folder.vllm_version == "0.23.0"
    followed = {
        path.replace(".", "__"): value
        for path, value in recorded_server(HEADER, DATA).settings.items()
        if path != "latency.vllm_version"
    }
    assert {k: v for k, v in pair.overrides.items() if k != "latency__model"} == followed


def test_an_observed_vllm_server_without_its_configuration_took_vllms_batch_defaults(
    tmp_path: Path,
) -> None:
    """`servesim observe` records the server's type and model only. A vLLM server started
    without batch limits ran with vLLM's defaults for its GPU; `replay` and `calibrate` both
    simulate those (they disagreed before: calibrate took BLIS's 256 / 2,048)."""
    import simulator.calibrate as cal

    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    shutil.copy(HEADER, header)
    shutil.copy(DATA, data)  # no server_config.json beside it or above
    server = recorded_server(header, data)
    assert {k: server.sources[k] for k in server.settings} == {
        "model": "trace header",
        "engine.max_num_scheduled_tokens": "vLLM's default on H100",
        "engine.max_num_running_reqs": "vLLM's default on H100",
        "engine.enable_prefix_caching": "vLLM's default; no server configuration found",
    }
    case = cal.trace_case(header, data)
    assert case.overrides["engine__max_num_scheduled_tokens"] == 8192
    assert case.overrides["engine__max_num_running_reqs"] == 1024
    assert "engine__enable_prefix_caching" not in case.overrides  # not recorded: the scenario's
    replayed = replay(header, data).scenario["engine"]
    assert (replayed["max_num_scheduled_tokens"], replayed["max_num_running_reqs"]) == (8192, 1024)


def test_a_trace_servesim_exported_keeps_its_own_settings(tmp_path: Path) -> None:
    """servesim's own export names its server `servesim`: what its header records is followed,
    and no vLLM default is added for what it does not (the replay must reproduce the run,
    tests/workload/test_roundtrip.py)."""
    header = tmp_path / "t.yaml"
    header.write_text(
        "trace_version: 3\ntime_unit: microseconds\nmode: generated\nserver:\n"
        "  type: servesim\n  model: meta-llama/llama-3.1-8b-instruct\n  max_num_seqs: 256\n"
    )
    data = tmp_path / "t.csv"
    shutil.copy(BLIS / "r1_fixed512.trace.csv", data)
    settings = recorded_server(header, data).settings
    assert settings["engine.max_num_running_reqs"] == 256
    assert "engine.max_num_scheduled_tokens" not in settings
