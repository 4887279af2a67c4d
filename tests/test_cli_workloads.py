"""CLI paths of the workload layer: presets, --workload-spec, --trace-output / replay,
convert / compose, plain request CSVs, and one-line errors for bad workload files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app

runner = CliRunner()
EVERYTHING = Path(__file__).parent / "data" / "workloads" / "everything.yaml"
GOOD_CLIENT = {
    "id": "a",
    "rate_fraction": 1,
    "arrival": {"process": "poisson"},
    "input_distribution": {"type": "constant", "params": {"value": 64}},
    "output_distribution": {"type": "constant", "params": {"value": 8}},
}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def summary(stdout: str) -> dict:
    body = stdout.split("=== Simulation Metrics ===\n", 1)[1]
    return json.JSONDecoder().raw_decode(body)[0]


def write_spec(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_preset_flags_run(tmp_path):
    res = invoke("run", "--workload", "chatbot", "--rate", 10, "--num-requests", 30)
    assert res.exit_code == 0, res.output
    assert summary(res.stdout)["completed_requests"] == 30


def test_workload_spec_flag_runs_a_blis_file():
    res = invoke(
        "run", "--workload-spec", EVERYTHING, "--num-requests", 200, "--total-kv-blocks", 40000
    )
    assert res.exit_code == 0, res.output
    assert summary(res.stdout)["injected_requests"] >= 200  # + closed-loop follow-up rounds
    assert "=== Per-SLO Metrics ===" in res.stdout
    assert "=== Session Metrics ===" in res.stdout


@pytest.mark.parametrize("scenario", ["quickstart.yaml", "multi_model.yaml"])
def test_workload_spec_flag_replaces_a_scenarios_traffic(tmp_path, scenario):
    """Flags override the scenario: --workload-spec replaces its traffic whether that is a
    synthetic workload (quickstart) or a v2 spec of its own (multi_model)."""
    spec_data = {"version": "2", "aggregate_rate": 5, "num_requests": 30}
    spec = write_spec(tmp_path, {**spec_data, "clients": [GOOD_CLIENT]})
    for extra, count in (([], 30), (["--num-requests", 12], 12)):
        out = tmp_path / f"r{count}.json"
        args = ["--workload-spec", spec, *extra, "--results-path", out]
        res = invoke("run", f"scenarios/{scenario}", *args)
        assert res.exit_code == 0, res.output
        assert json.loads(out.read_text())["offered_requests"] == count  # every one arrived


def test_rate_replaces_a_specs_aggregate_rate_and_says_it_departs_from_blis(tmp_path, caplog):
    """Both BLIS releases ignore --rate beside --workload-spec; servesim applies it (a flag
    given is never dropped) and says so, so that a parity run knows to leave it out."""
    spec = write_spec(
        tmp_path, {"aggregate_rate": 30, "num_requests": 20, "clients": [GOOD_CLIENT]}
    )
    out = tmp_path / "r.json"
    res = invoke("run", "--workload-spec", spec, "--rate", 10, "--results-path", out)
    assert res.exit_code == 0, res.output
    said = [
        r.getMessage() for r in caplog.records if "replaces the workload spec" in r.getMessage()
    ]
    assert said == [
        "--rate 10 replaces the workload spec's aggregate_rate 30 (BLIS ignores --rate when a "
        "workload spec is given)"
    ]
    caplog.clear()
    same = invoke("run", "--workload-spec", spec, "--rate", 30, "--results-path", out)
    assert same.exit_code == 0
    assert not [r for r in caplog.records if "replaces the workload spec" in r.getMessage()]


def test_trace_output_then_replay_is_byte_identical(tmp_path):
    prefix = tmp_path / "t"
    run = invoke(
        "run",
        "--workload",
        "chatbot",
        "--rate",
        25,
        "--num-requests",
        150,
        "--prefix-tokens",
        100,
        "--trace-output",
        prefix,
    )
    assert run.exit_code == 0, run.output
    rep = invoke("replay", "--trace-header", f"{prefix}.yaml", "--trace-data", f"{prefix}.csv")
    assert rep.exit_code == 0, rep.output
    assert rep.stdout == run.stdout


def test_replay_of_a_plain_request_csv(tmp_path):
    csv_path = tmp_path / "gt.requests.csv"
    csv_path.write_text(
        "index,arrival_time_us,input_tokens,output_tokens,prefix_group,has_error,ttft_s,e2e_s\n"
        "0,0,500,100,,0,0.05,1.0\n1,100000,400,0,,0,0.05,0.2\n2,150000,300,50,,1,0,0\n"
    )
    res = invoke(
        "replay",
        "--trace-data",
        csv_path,
        "--model",
        "meta-llama/llama-2-7b-hf",
        "--total-kv-blocks",
        7462,
    )
    assert res.exit_code == 0, res.output
    s = summary(res.stdout)
    assert s["completed_requests"] == 3
    assert s["total_output_tokens"] == 100 + 1 + 50  # output_tokens 0 replays as 1 token


def test_convert_preset_prints_a_loadable_spec(tmp_path):
    res = invoke("convert", "preset", "--name", "summarization", "--rate", 2, "--num-requests", 10)
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.stdout)
    assert (
        data["aggregate_rate"] == 2
        and data["clients"][0]["input_distribution"]["params"]["mean"] == 4096
    )
    spec = write_spec(tmp_path, data)
    assert invoke("run", "--workload-spec", spec).exit_code == 0


def test_compose_adds_rates(tmp_path):
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"aggregate_rate": 3, "clients": [GOOD_CLIENT]}))
    b.write_text(yaml.safe_dump({"aggregate_rate": 5, "clients": [GOOD_CLIENT]}))
    res = invoke("compose", "--from", a, "--from", b)
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.stdout)
    assert data["aggregate_rate"] == 8
    assert sorted(c["rate_fraction"] for c in data["clients"]) == pytest.approx([3 / 8, 5 / 8])


BAD_SPECS = {
    "misspelled key": (
        {"aggregate_rate": 1, "clients": [{**GOOD_CLIENT, "rate_fracton": 1}]},
        "clients[0]: unknown key 'rate_fracton'",
    ),
    "negative rate": ({"aggregate_rate": -2, "clients": [GOOD_CLIENT]}, "aggregate_rate"),
    "zero fraction": (
        {"aggregate_rate": 1, "clients": [{**GOOD_CLIENT, "rate_fraction": 0}]},
        "clients[0].rate_fraction",
    ),
    "unknown distribution": (
        {
            "aggregate_rate": 1,
            "clients": [{**GOOD_CLIENT, "input_distribution": {"type": "zipf", "params": {}}}],
        },
        "clients[0].input_distribution.type",
    ),
    "mutually exclusive sections": (
        {
            "aggregate_rate": 1,
            "clients": [GOOD_CLIENT],
            "inference_perf": {
                "stages": [{"rate": 1, "duration": 10}],
                "shared_prefix": {
                    "num_unique_system_prompts": 1,
                    "num_users_per_system_prompt": 1,
                    "system_prompt_len": 10,
                    "question_len": 10,
                    "output_len": 10,
                },
            },
        },
        "mutually exclusive",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_workload_file_is_one_line_and_exit_2(case, tmp_path):
    data, needle = BAD_SPECS[case]
    out = tmp_path / "out.json"
    res = invoke("run", "--workload-spec", write_spec(tmp_path, data), "--results-path", out)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert "Traceback" not in res.output
    assert not out.exists()


def test_unknown_preset_is_rejected():
    res = invoke("run", "--workload", "chatbots")
    assert res.exit_code == 2 and "unknown workload preset 'chatbots'" in res.stderr


def test_synthetic_only_flags_do_not_apply_to_a_v2_spec():
    res = invoke("run", "--workload-spec", EVERYTHING, "--prompt-tokens", 10)
    assert res.exit_code == 2 and "does not apply to a v2 workload spec" in res.stderr
