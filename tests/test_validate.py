"""`servesim validate`: discovery, scoring arithmetic, errors, and replay of ground truth."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simulator.validate as validate_module
from simulator.cli import app
from simulator.errors import ConfigError
from simulator.validate import (
    FRAME_COLUMNS,
    METRICS,
    default_groundtruth,
    discover_runs,
    run_metrics,
    score,
    select_runs,
    summarize,
    validate_folder,
)
from simulator.workload.server_settings import vllm_batch_defaults, vllm_batch_defaults_for

REPOSITORY = Path(__file__).resolve().parents[1]
REAL_GROUNDTRUTH = REPOSITORY / "groundtruth"  # shipped with the repository
DATASET = "vllm-0.15.1-h100"


def _meta(name: str, workload: str, **config_changes: object) -> dict:
    """Shaped like the real vllm-0.15.1-h100 meta.json files."""
    config = {
        "tensor_parallelism": 1,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "kv_blocks_total_gpu": 7462,
        "block_size": 16,
        "num_prefix_groups": 0,
        "users_per_group": 0,
        "system_prompt_len": 0,
    }
    config.update(config_changes)
    return {
        "experiment": name,
        "model_id": "meta-llama/Llama-2-7b-hf",
        "model_short": "llama-2-7b",
        "profile": workload,
        "split": "train",
        "config": config,
        "model_config": {"num_layers": 32, "hidden_dim": 4096},
    }


def _write_run(dataset: Path, name: str, workload: str, rows: list[tuple], **changes) -> None:
    requests = dataset / "requests"
    requests.mkdir(parents=True, exist_ok=True)
    lines = ["index,arrival_time_us,input_tokens,output_tokens,prefix_group,has_error,ttft_s,e2e_s"]
    for i, (arrival_us, inp, out, err, ttft_s, e2e_s) in enumerate(rows):
        lines.append(f"{i},{arrival_us},{inp},{out},,{err},{ttft_s},{e2e_s}")
    (requests / f"{name}.requests.csv").write_text("\n".join(lines) + "\n")
    (requests / f"{name}.meta.json").write_text(json.dumps(_meta(name, workload, **changes)))
    run_dir = dataset / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "exp-config.yaml").write_text(
        "model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\nmax_model_len: 4096\n"
    )


@pytest.fixture
def fake_groundtruth(tmp_path: Path) -> Path:
    dataset = tmp_path / DATASET
    general = [(i * 100_000, 500, 20, 0, 0.03, 0.25) for i in range(6)]
    reasoning = [(i * 200_000, 900, 30, 0, 0.05, 0.5) for i in range(4)]
    reasoning.append((900_000, 0, 0, 1, "", 240.0))  # a client timeout: not scored
    _write_run(dataset, "20260101-000000-llama-2-7b-tp1-general", "general", general)
    _write_run(dataset, "20260101-010000-llama-2-7b-tp1-reasoning", "reasoning", reasoning)
    return tmp_path


def test_replaying_a_request_file_simulates_its_runs_server(fake_groundtruth: Path) -> None:
    """`servesim replay --trace-data <run>.requests.csv` follows what the run recorded of its
    server, as validate's replay does: meta.json's model, TP, batch limits, block size and
    KV blocks, exp-config.yaml's context limit, the dataset folder's vLLM version."""
    from simulator import replay
    from simulator.workload.server_settings import recorded_server

    general = discover_runs(fake_groundtruth)[0]
    server = recorded_server(None, general.requests_csv)
    assert server.settings["model"] == "meta-llama/Llama-2-7b-hf"
    assert server.settings["latency.vllm_version"] == "0.15.1"
    assert server.sources["engine.max_model_len"] == "exp-config.yaml"
    result = replay(None, general.requests_csv)
    engine = result.scenario["engine"]
    assert result.scenario["resolved"]["model"] == general.model
    assert (result.scenario["tp"], engine["max_num_running_reqs"]) == (general.tp, 128)
    assert (engine["max_num_scheduled_tokens"], engine["max_model_len"]) == (2048, 4096)
    assert engine["total_kv_blocks"] == general.gpu_kv_blocks
    assert result.scenario["latency"]["vllm_version"] == "0.15.1"
    # A plain CSV elsewhere records no server.
    plain = fake_groundtruth / "plain.csv"
    plain.write_text(general.requests_csv.read_text())
    assert recorded_server(None, plain).settings == {"engine.enable_prefix_caching": True}


def test_discovery_from_parent_and_dataset_folder(fake_groundtruth: Path) -> None:
    from_parent = discover_runs(fake_groundtruth)
    from_dataset = discover_runs(fake_groundtruth / DATASET)
    assert from_parent == from_dataset
    general, reasoning = from_parent
    assert general.name == "20260101-000000-llama-2-7b-tp1-general"
    assert general.model == "meta-llama/llama-2-7b-hf"
    assert (general.tp, general.max_num_seqs, general.max_num_batched_tokens) == (1, 128, 2048)
    assert (general.max_model_len, general.block_size_tokens, general.gpu_kv_blocks) == (
        4096,
        16,
        7462,
    )
    assert general.workload == "general" and not general.overloaded
    assert reasoning.workload == "reasoning" and reasoning.overloaded
    assert select_runs(from_parent, ["reasoning"]) == [reasoning]
    with pytest.raises(ConfigError, match="no run matches 'nope'"):
        select_runs(from_parent, ["nope"])


def test_missing_meta_json_names_the_file(fake_groundtruth: Path) -> None:
    meta = next((fake_groundtruth / DATASET / "requests").glob("*general.meta.json"))
    meta.unlink()
    with pytest.raises(ConfigError, match=r"general\.meta\.json.* is missing"):
        discover_runs(fake_groundtruth)


@pytest.mark.parametrize(
    ("key", "message"),
    [("kv_blocks_total_gpu", "'config.kv_blocks_total_gpu'"), ("model_id", "'model_id'")],
)
def test_missing_meta_key_names_file_and_key(
    fake_groundtruth: Path, key: str, message: str
) -> None:
    meta_path = next((fake_groundtruth / DATASET / "requests").glob("*general.meta.json"))
    meta = json.loads(meta_path.read_text())
    meta["config"].pop(key, None)
    meta.pop(key, None)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=rf"general\.meta\.json.*missing key {message}"):
        discover_runs(fake_groundtruth)


def test_missing_max_model_len_is_an_error(fake_groundtruth: Path) -> None:
    for exp in (fake_groundtruth / DATASET / "runs").glob("*/exp-config.yaml"):
        exp.unlink()
    with pytest.raises(ConfigError, match="missing key 'config.max_model_len'"):
        discover_runs(fake_groundtruth)


def test_no_runs_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no requests/ folder"):
        discover_runs(tmp_path)


def test_run_metrics_arithmetic() -> None:
    ttft = [10.0, 20.0, 30.0, 40.0, 50.0]
    e2e = [110.0, 220.0, 330.0, 440.0, 550.0]
    out = [11, 11, 11, 11, 11]
    m = run_metrics(ttft, e2e, out, window_s=5.0)
    assert m["ttft_mean_ms"] == 30.0
    assert m["ttft_p90_ms"] == pytest.approx(46.0)  # linear: 40 + 0.6 × 10
    assert m["ttft_p99_ms"] == pytest.approx(49.6)
    assert m["e2e_mean_ms"] == 330.0
    assert m["e2e_p90_ms"] == pytest.approx(np.percentile(e2e, 90))
    assert m["itl_ms"] == pytest.approx((330.0 - 30.0) / 10)
    assert m["output_tokens_per_s"] == pytest.approx(55 / 5.0)
    assert set(m) == set(METRICS)


def test_score_errors_are_relative_and_signed() -> None:
    measured = dict.fromkeys(METRICS, 100.0)
    predicted = dict.fromkeys(METRICS, 80.0) | {"itl_ms": 150.0}
    rows = {r["metric"]: r for r in score(measured, predicted)}
    assert rows["ttft_mean_ms"]["error"] == pytest.approx(0.2)
    assert rows["ttft_mean_ms"]["signed_error"] == pytest.approx(-0.2)
    assert rows["itl_ms"]["error"] == pytest.approx(0.5)
    assert rows["itl_ms"]["signed_error"] == pytest.approx(0.5)
    zero = {r["metric"]: r for r in score(dict.fromkeys(METRICS, 0.0), predicted)}
    assert math.isnan(zero["e2e_mean_ms"]["error"])


def test_summarize_keeps_overloaded_runs_apart() -> None:
    rows = []
    for run, err, overloaded in (("a", 0.1, False), ("b", 0.3, False), ("c", 0.9, False)):
        rows.append((run, "x", "general", "itl_ms", 1.0, 1.0, err, -err, overloaded, "v1"))
    rows.append(("d", "x", "reasoning", "itl_ms", 1.0, 1.0, 5.0, 5.0, True, "v1"))
    frame = pd.DataFrame(rows, columns=FRAME_COLUMNS)
    summary = summarize(frame).set_index("group")
    assert summary.loc["accuracy", "runs"] == 3
    assert summary.loc["accuracy", "dataset"] == "v1"
    assert summary.loc["accuracy", "mean_error"] == pytest.approx(13 / 30)
    assert summary.loc["accuracy", "median_error"] == pytest.approx(0.3)
    assert summary.loc["overloaded", "mean_error"] == pytest.approx(5.0)
    # A frame without a dataset column (older callers) is one unnamed dataset.
    legacy = summarize(frame.drop(columns="dataset")).set_index("group")
    assert legacy.loc["accuracy", "runs"] == 3 and legacy.loc["accuracy", "dataset"] == ""


def test_summarize_per_dataset_and_over_all() -> None:
    rows = [
        ("a", "x", "w", "itl_ms", 1.0, 1.0, 0.1, 0.1, False, "vllm-1"),
        ("b", "x", "w", "itl_ms", 1.0, 1.0, 0.3, -0.3, False, "vllm-2"),
        ("c", "x", "w", "itl_ms", 1.0, 1.0, 0.5, 0.5, False, "vllm-2"),
    ]
    summary = summarize(pd.DataFrame(rows, columns=FRAME_COLUMNS)).set_index("dataset")
    assert list(summary.index) == ["vllm-1", "vllm-2", "all"]
    assert summary.loc["vllm-2", "runs"] == 2
    assert summary.loc["vllm-2", "median_error"] == pytest.approx(0.4)
    assert summary.loc["all", "runs"] == 3
    assert summary.loc["all", "median_error"] == pytest.approx(0.3)


def test_validate_folder_end_to_end(fake_groundtruth: Path) -> None:
    frame = validate_folder(fake_groundtruth)
    assert list(frame.columns) == FRAME_COLUMNS
    assert len(frame) == 2 * len(METRICS)
    general = frame[frame["workload"] == "general"].set_index("metric")
    assert general.loc["ttft_mean_ms", "measured"] == pytest.approx(30.0)
    assert general.loc["e2e_mean_ms", "measured"] == pytest.approx(250.0)
    assert general.loc["itl_ms", "measured"] == pytest.approx(220.0 / 19)
    assert np.isfinite(frame["predicted"]).all()
    assert (frame["predicted"] > 0).all()
    assert frame.groupby("workload")["overloaded"].first().to_dict() == {
        "general": False,
        "reasoning": True,
    }
    assert set(frame["dataset"]) == {"vllm-0.15.1"}


def test_cli_validate_writes_csv(fake_groundtruth: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "scores.csv"
    result = CliRunner().invoke(
        app, ["validate", str(fake_groundtruth), "--runs", "general", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "ttft_mean_ms" in result.stdout and "median err" in result.stdout
    written = pd.read_csv(out)
    assert list(written.columns) == [*FRAME_COLUMNS, "latency_model"]
    assert len(written) == len(METRICS) and set(written.latency_model) == {"physics"}  # the default


def test_cli_validate_compares_backends(fake_groundtruth: Path, tmp_path: Path) -> None:
    out = tmp_path / "scores.csv"
    result = CliRunner().invoke(
        app,
        ["validate", str(fake_groundtruth), "--runs", "general", "--output", str(out),
         "--latency-model", "roofline", "--latency-model", "crossmodel",
         "--latency-model", "trained-roofline"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "by backend" in result.stdout and "trained-roofline" in result.stdout
    written = pd.read_csv(out)
    assert set(written.latency_model) == {"roofline", "crossmodel", "trained-roofline"}
    assert len(written) == 3 * len(METRICS)


def test_cli_validate_bad_folder_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.fixture
def cold_start_run(tmp_path: Path) -> Path:
    """Eight requests 0.5 s apart; the first two met a server still warming up (TTFT 0.9 s),
    the other six the steady 30 ms; every E2E is TTFT + 200 ms."""
    rows = [
        (i * 500_000, 500, 20, 0, ttft, ttft + 0.2)
        for i, ttft in enumerate([0.9, 0.9, 0.03, 0.03, 0.03, 0.03, 0.03, 0.03])
    ]
    _write_run(tmp_path / DATASET, "20260101-000000-llama-2-7b-tp1-general", "general", rows)
    return tmp_path


def test_warm_up_leaves_out_the_early_requests_on_both_sides(cold_start_run: Path) -> None:
    from simulator.validate import measured_requests, validate_run

    (run,) = discover_runs(cold_start_run)
    whole = measured_requests(run)
    assert whole.after_warm_up(0.0) is whole  # no warm-up: the same requests
    # Arrivals at 0, 0.5, ... 3.5 s: a 1-s warm-up keeps those at 1.0 s and later (six).
    steady = whole.after_warm_up(1.0, run.name)
    assert steady.positions == [2, 3, 4, 5, 6, 7]
    assert (steady.arrival_s >= 1.0).all() and np.allclose(steady.ttft_ms, 30.0)
    # The window ran from the first arrival (0 s) to the last response (3.5 + 0.23 s); it now
    # starts at 1 s.
    assert whole.window_s == pytest.approx(3.73)
    assert steady.window_s == pytest.approx(2.73) and steady.window_start_s == 1.0
    plain = {s["metric"]: s for s in validate_run(run, "physics")["scores"]}
    after = validate_run(run, "physics", warm_up_s=1.0)
    scores = {s["metric"]: s for s in after["scores"]}
    assert (after["n_success"], after["warm_up_s"]) == (6, 1.0)
    assert after["n_predicted"] == 6  # the same six requests on the simulated side
    assert plain["ttft_mean_ms"]["measured"] == pytest.approx((2 * 900 + 6 * 30) / 8)
    assert scores["ttft_mean_ms"]["measured"] == pytest.approx(30.0)
    # Every request's simulated TTFT is the same whatever its turn here (one at a time, well
    # apart), so leaving the first two out changes only the measured side's mean.
    assert scores["ttft_mean_ms"]["predicted"] == pytest.approx(
        plain["ttft_mean_ms"]["predicted"], rel=0.05
    )
    assert scores["ttft_mean_ms"]["error"] < plain["ttft_mean_ms"]["error"]
    # Output tokens per second: six requests' 20 tokens over the window after the warm-up.
    assert scores["output_tokens_per_s"]["measured"] == pytest.approx(6 * 20 / 2.73)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, True, "30"])
def test_warm_up_must_be_seconds_at_least_zero(value: object) -> None:
    from simulator.validate import check_warm_up_s

    with pytest.raises(ConfigError, match=r"^warm_up_s: invalid value .*seconds >= 0"):
        check_warm_up_s(value)
    assert check_warm_up_s(0) == 0.0 and check_warm_up_s(2.5) == 2.5


def test_warm_up_past_the_last_request_is_an_error(cold_start_run: Path) -> None:
    from simulator.validate import measured_requests

    (run,) = discover_runs(cold_start_run)
    with pytest.raises(ConfigError, match=r"warm_up_s: invalid value 4.*last one's 3\.5 s"):
        measured_requests(run).after_warm_up(4.0, run.name)


def test_cli_validate_warm_up(cold_start_run: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(cold_start_run), "--warm-up-s", "1"])
    assert result.exit_code == 0, result.output
    assert "requests after the first 1 s" in result.stdout
    assert "--warm-up-s" in result.stderr
    bad = CliRunner().invoke(app, ["validate", str(cold_start_run), "--warm-up-s", "-2"])
    assert bad.exit_code == 2
    assert bad.stderr == (
        "error: --warm-up-s: invalid value -2.0; must be a number of seconds >= 0\n"
    )


def test_calibrate_fits_after_the_warm_up_too(cold_start_run: Path, tmp_path: Path) -> None:
    import simulator.calibrate as cal

    (run,) = discover_runs(cold_start_run)
    whole = cal.groundtruth_case(run, False, tmp_path / "whole")
    steady = cal.groundtruth_case(run, False, tmp_path / "steady", warm_up_s=1.0)
    assert list(whole.positions) == list(range(8))
    assert list(steady.positions) == [2, 3, 4, 5, 6, 7]  # arrivals at 1.0 s and later
    assert whole.measured["ttft_mean_ms"] == pytest.approx((2 * 900 + 6 * 30) / 8)
    assert steady.measured["ttft_mean_ms"] == pytest.approx(30.0)
    with pytest.raises(
        ConfigError,
        match=r"warm_up_s: invalid value 10\.0; run '.*' has no successful request that arrived "
        r"that late: must be below its last one's 3\.5 s",
    ):
        cal.groundtruth_case(run, False, tmp_path / "late", warm_up_s=10.0)


def test_cli_calibrate_warm_up(cold_start_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "fit.yaml"
    args = ["calibrate", str(cold_start_run), "--rounds", "0", "--no-prompt-reuse", "-q"]
    result = CliRunner().invoke(app, [*args, "--warm-up-s", "1", "--output", str(out)])
    assert result.exit_code == 0, result.output
    import yaml

    assert yaml.safe_load(out.read_text())["warm_up_s"] == 1.0  # said in the provenance
    bad = CliRunner().invoke(app, [*args, "--warm-up-s", "nan"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --warm-up-s: invalid value")


def test_default_groundtruth_is_the_repository_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # found next to the package, wherever the command runs
    assert default_groundtruth() == REAL_GROUNDTRUTH
    assert (REAL_GROUNDTRUTH / "vllm-0.15.1-h100" / "requests").is_dir()
    assert (REAL_GROUNDTRUTH / "vllm-0.23.0-h100-qwen3-14b" / "server_config.json").is_file()


def test_default_groundtruth_falls_back_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed package has no groundtruth/ beside it: ./groundtruth is used, else an error
    # naming both places.
    package = tmp_path / "site-packages" / "simulator"
    monkeypatch.setattr(validate_module, "__file__", str(package / "validate.py"))
    work = tmp_path / "work"
    (work / "groundtruth").mkdir(parents=True)
    monkeypatch.chdir(work)
    assert default_groundtruth() == work / "groundtruth"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        default_groundtruth("validate")
    message = str(error.value)
    assert message.startswith("validate: no ground truth at ") and "\n" not in message
    assert str(tmp_path / "site-packages" / "groundtruth") in message
    assert str(tmp_path / "groundtruth") in message


def test_cli_validate_without_folder_scores_the_repository_groundtruth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", "--runs", "llama-2-7b-tp1-general"])
    assert result.exit_code == 0, result.output
    assert "20260217-231439-llama-2-7b-tp1-general" in result.stdout
    assert "vllm-0.15.1 20260217-231439-llama-2-7b-tp1-general:" in result.stderr


def test_one_real_run() -> None:
    frame = validate_folder(REAL_GROUNDTRUTH, runs=["llama-2-7b-tp1-roleplay"])
    assert sorted(frame["metric"]) == sorted(METRICS)
    assert frame["run"].nunique() == 1
    assert np.isfinite(frame["predicted"]).all()
    # The measured side must reproduce the published targets_summary.csv figures.
    measured = frame.set_index("metric")["measured"]
    assert measured["ttft_mean_ms"] == pytest.approx(27.1288, abs=1e-3)
    assert measured["itl_ms"] == pytest.approx(9.9517, abs=1e-3)
    assert measured["output_tokens_per_s"] == pytest.approx(1236.7572, abs=1e-2)


def test_shared_prefix_trace_groups_the_system_prompt_round_robin(
    fake_groundtruth: Path, tmp_path: Path
) -> None:
    from simulator.validate import SYSTEM_PROMPT_TOKENS, shared_prefix_trace, validate_run
    from simulator.workload.trace import load_trace

    run = discover_runs(fake_groundtruth)[0]
    header, data = shared_prefix_trace(run, tmp_path / "shared", groups=4)
    _, requests = load_trace(header, data)
    # Same prompts, same order; request i in group i mod 4, its first 100 tokens shared.
    assert [r.input_tokens for r in requests] == [500] * 6
    assert [r.prefix_group for r in requests] == [f"system-{i % 4}" for i in range(6)]
    assert all(r.segments[0][1] == SYSTEM_PROMPT_TOKENS["general"] for r in requests)
    from simulator.api import replay
    from simulator.validate import baseline_trace, replay_overrides

    overrides = replay_overrides(run, "physics")
    baseline = replay(*baseline_trace(run, tmp_path), **overrides)
    shared = replay(header, data, **(overrides | {"engine__enable_prefix_caching": True}))
    # Requests 4 and 5 find their group's 100-token prefix cached in whole 16-token blocks
    # (6 blocks, 96 tokens each): 192 prompt tokens fewer to prefill. (Neither a request's TTFT
    # nor the busy time is a monotone law: under the exact scheduling lag a request's wait
    # depends on where in a step it arrives, and a shorter prefill can land a request in a
    # step of its own.)
    cached = 2 * (SYSTEM_PROMPT_TOKENS["general"] // 16 * 16)
    assert baseline.steps["prefill_tokens"].sum() - shared.steps["prefill_tokens"].sum() == cached
    assert shared.summary["completed_requests"] == baseline.summary["completed_requests"] == 6
    assert validate_run(
        run, extra_overrides={"engine__enable_prefix_caching": True}, trace=(header, data)
    )["n_predicted"] == len(requests)


def test_validate_scores_physics_with_a_coefficients_file(
    fake_groundtruth: Path, tmp_path: Path
) -> None:
    coeffs = tmp_path / "c.yaml"
    coeffs.write_text("latency_model: physics\ncoefficients: {per_step_overhead_us: 5000}\n")
    result = CliRunner().invoke(
        app,
        [
            "validate",
            str(fake_groundtruth),
            "--latency-model",
            "physics",
            "--latency-coeffs",
            str(coeffs),
            "--runs",
            "general",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "summary (physics" in result.output


def test_prompt_reuse_shares_each_distinct_prompt_whole(
    fake_groundtruth: Path, tmp_path: Path
) -> None:
    """Prompt lengths cycling with period 3 (500, 507, 514, twice): 3 prompts, request i reuses
    i mod 3, each shared whole. Without a cycle (every prompt 500 long) --prompt-reuse is
    refused: the profile's system prompts x users is no fallback (docs/cli.md)."""
    from simulator.validate import distinct_prompts, reuse_trace
    from simulator.workload.trace import load_trace

    run = discover_runs(fake_groundtruth)[0]
    with pytest.raises(ConfigError, match="--prompt-reuse: "):
        reuse_trace(run, tmp_path)
    profile = fake_groundtruth / DATASET / "runs" / run.name / "profile.yaml"
    profile.write_text(
        '{"data": {"shared_prefix": {"num_unique_system_prompts": 2,'
        ' "num_users_per_system_prompt": 2}}}'
    )
    assert distinct_prompts(run) is None  # the profile's 4 is not a cycle
    lengths = [500, 507, 514] * 2
    rows = [(i * 100_000, n, 20, 0, 0.03, 0.25) for i, n in enumerate(lengths)]
    _write_run(fake_groundtruth / DATASET, run.name, "general", rows)
    run = discover_runs(fake_groundtruth)[0]
    assert distinct_prompts(run) == 3
    _, requests = load_trace(*reuse_trace(run, tmp_path))
    assert [r.prefix_group for r in requests] == [f"system-{i % 3}" for i in range(6)]
    assert [r.segments for r in requests] == [
        [(("prefix", f"system-{i % 3}"), n)] for i, n in enumerate(lengths)
    ]
    reused = CliRunner().invoke(
        app, ["validate", str(fake_groundtruth), "--runs", "general", "--prompt-reuse"]
    )
    assert reused.exit_code == 0, reused.output


@settings(max_examples=60, deadline=None)
@given(
    period=st.integers(min_value=3, max_value=40),
    cycles=st.integers(min_value=4, max_value=6),
    extra=st.integers(min_value=0, max_value=39),
    failed=st.sets(st.integers(min_value=0, max_value=239), max_size=2),
)
def test_prompt_cycle_is_the_period_of_the_lengths(period, cycles, extra, failed) -> None:
    """A load generator cycling through `period` prompts of distinct lengths, a request or two
    failed with no length recorded (0): the cycle is `period`, whatever the failures."""
    from simulator.validate import prompt_cycle

    one_cycle = [500 + 7 * i for i in range(period)]
    lengths = (one_cycle * (cycles + 1))[: period * cycles + min(extra, period - 1)]
    lengths = [0 if i in failed else n for i, n in enumerate(lengths)]
    assert prompt_cycle(lengths) == period


def test_prompt_cycle_needs_lengths_that_say_something() -> None:
    from simulator.validate import prompt_cycle

    assert prompt_cycle([500] * 40) is None  # one length fits every cycle
    assert prompt_cycle([500, 510] * 20) is None  # two lengths: too few to tell
    assert prompt_cycle([500, 510, 520, 530]) is None  # not two whole cycles of anything
    assert prompt_cycle([500, 510, 520] * 2) == 3
    # A rare repeat is not a cycle: here no lag repeats 95 % of the pairs.
    assert prompt_cycle(list(range(400, 440)) + list(range(600, 640))) is None


def test_prompt_reuse_follows_the_cycle_in_the_request_file(tmp_path: Path) -> None:
    """The 0.15.1 runs cycle through 100 prompts whatever their profile says; a run's own cycle
    decides the reuse replay's groups."""
    from simulator.validate import distinct_prompts, reuse_trace
    from simulator.workload.trace import load_trace

    rows = [(i * 100_000, 500 + 10 * (i % 3), 20, 0, 0.03, 0.25) for i in range(9)]
    _write_run(tmp_path / DATASET, "20260101-000000-llama-2-7b-tp1-general", "general", rows)
    (run,) = discover_runs(tmp_path)
    profile = tmp_path / DATASET / "runs" / run.name / "profile.yaml"
    profile.write_text(
        '{"data": {"shared_prefix": {"num_unique_system_prompts": 2,'
        ' "num_users_per_system_prompt": 2}}}'
    )
    assert distinct_prompts(run) == 3  # the lengths' cycle, not the profile's 2 x 2
    cli = CliRunner().invoke(app, ["validate", str(tmp_path), "--prompt-reuse", "-q"])
    assert cli.exit_code == 0, cli.output
    assert "prompt reuse: 3 distinct prompts per run" in cli.stderr
    _, requests = load_trace(*reuse_trace(run, tmp_path / "work"))
    assert [r.prefix_group for r in requests] == [f"system-{i % 3}" for i in range(9)]
    # Requests one cycle apart share their whole prompt, of one length.
    assert [r.segments for r in requests[:3]] == [r.segments for r in requests[3:6]]
    assert [r.input_tokens for r in requests[:3]] == [500, 510, 520]


def test_validate_and_calibrate_reuse_a_shown_prompt_cycle_by_default(tmp_path: Path) -> None:
    """One default for both commands, chosen from what the load generator sent: a run whose
    request file shows a prompt cycle is replayed with its prompts reused unless told not to,
    and the default says so on stderr."""
    import simulator.calibrate as cal
    from simulator.validate import reused_prompts, validate_datasets

    rows = [(i * 100_000, 500 + 10 * (i % 3), 20, 0, 0.03, 0.25) for i in range(9)]
    _write_run(tmp_path / DATASET, "20260101-000000-llama-2-7b-tp1-general", "general", rows)
    (run,) = discover_runs(tmp_path)
    assert reused_prompts(run) == reused_prompts(run, True) == 3
    assert reused_prompts(run, False) is None

    default = validate_datasets(tmp_path)
    assert [o["reused_prompts"] for o in default.outcomes] == [3]
    reused = validate_datasets(tmp_path, prompt_reuse=True)
    fresh = validate_datasets(tmp_path, prompt_reuse=False)
    assert [o["reused_prompts"] for o in fresh.outcomes] == [None]
    pd.testing.assert_frame_equal(default.frame, reused.frame)
    # Shared prompts are cached after their first occurrence: the first requests of each
    # prompt are computed cold, later ones find it cached, so TTFT can only fall.
    ttft = {
        f: d.frame.set_index("metric").loc["ttft_mean_ms", "predicted"]
        for f, d in (("reused", reused), ("fresh", fresh))
    }
    assert ttft["reused"] < ttft["fresh"]

    cli = CliRunner().invoke(app, ["validate", str(tmp_path), "-q"])
    assert cli.exit_code == 0, cli.output
    assert (
        "prompt reuse: 3 distinct prompts per run, request i reusing prompt i mod that "
        "(the request files' prompt cycle; --no-prompt-reuse replays every prompt as new)"
    ) in cli.stderr
    assert "vllm-0.15.1: 1 run (physics; prompts reused: 3 per run)" in cli.stdout
    off = CliRunner().invoke(app, ["validate", str(tmp_path), "-q", "--no-prompt-reuse"])
    assert off.exit_code == 0, off.output
    assert "prompt reuse: off, every prompt replayed as new (--no-prompt-reuse)" in off.stderr
    assert "vllm-0.15.1: 1 run (physics)" in off.stdout

    # calibrate builds the same replay trace by default as with --prompt-reuse.
    by_default = cal.groundtruth_case(run, workdir=tmp_path / "default")
    explicit = cal.groundtruth_case(run, True, tmp_path / "explicit")
    new = cal.groundtruth_case(run, False, tmp_path / "new")
    assert Path(by_default.trace_data).read_text() == Path(explicit.trace_data).read_text()
    assert Path(by_default.trace_data).read_text() != Path(new.trace_data).read_text()
    assert by_default.overrides == explicit.overrides == new.overrides  # caching as recorded
    # One run, fitted from its reuse replay: the command ends cleanly (it used to try BLIS's
    # trace report on the replay trace after its folder was gone) and records the replay.
    out = tmp_path / "fit.yaml"
    fitted = CliRunner().invoke(
        app, ["calibrate", str(tmp_path), "--rounds", "0", "--output", str(out)]
    )
    assert fitted.exit_code == 0, fitted.output
    assert "calibrate: prompt reuse: 3 distinct prompts per run" in fitted.stderr
    import yaml

    assert yaml.safe_load(out.read_text())["prompt_reuse"].startswith("3 distinct prompts")


def test_a_run_without_a_prompt_cycle_replays_every_prompt_new_unless_reuse_is_demanded(
    fake_groundtruth: Path,
) -> None:
    """No cycle in the request file and no profile: the default replays every prompt as new
    and says why; `--prompt-reuse` demands a cycle, so it is an error naming the run."""
    from simulator.validate import reused_prompts

    run = select_runs(discover_runs(fake_groundtruth), ["general"])[0]
    assert reused_prompts(run) is None
    with pytest.raises(ConfigError, match="--prompt-reuse: .*general: its prompt lengths"):
        reused_prompts(run, True)
    default = validate_folder(fake_groundtruth, runs=["general"])
    fresh = validate_folder(fake_groundtruth, runs=["general"], prompt_reuse=False)
    pd.testing.assert_frame_equal(default, fresh)
    cli = CliRunner().invoke(app, ["validate", str(fake_groundtruth), "--runs", "general"])
    assert cli.exit_code == 0, cli.output
    assert "prompt reuse: no prompt cycle found, every prompt replayed as new" in cli.stderr
    demanded = CliRunner().invoke(
        app, ["validate", str(fake_groundtruth), "--runs", "general", "--prompt-reuse"]
    )
    assert demanded.exit_code == 2
    assert "--prompt-reuse" in demanded.stderr and "Traceback" not in demanded.output


def test_every_shipped_run_cycles_through_100_prompts() -> None:
    from simulator.validate import distinct_prompts

    runs = discover_runs(REAL_GROUNDTRUTH / "vllm-0.15.1-h100")
    assert len(runs) == 12 and {distinct_prompts(r) for r in runs} == {100}


def _force_output(fake_groundtruth: Path, run_name: str, text: str) -> None:
    profile = fake_groundtruth / DATASET / "runs" / run_name / "profile.yaml"
    profile.write_text(text)


@pytest.mark.parametrize(
    ("text", "forced"),
    [
        ('{"server": {"ignore_eos": true}, "data": {"shared_prefix": {"output_len": 24}}}', 24),
        ('{"server": {"ignore_eos": false}, "data": {"shared_prefix": {"output_len": 24}}}', None),
        ('{"data": {"shared_prefix": {"output_len": 24}}}', None),
        ('{"server": {"ignore_eos": true}, "data": {"shared_prefix": {}}}', None),
        ('{"server": {"ignore_eos": true}, "data": {"shared_prefix": {"output_len": 0}}}', None),
        ("[1, 2", None),
    ],
)
def test_forced_output_tokens_come_from_an_ignore_eos_profile(
    fake_groundtruth: Path, text: str, forced: int | None
) -> None:
    run = discover_runs(fake_groundtruth)[0]
    assert run.forced_output_tokens is None  # no profile.yaml
    _force_output(fake_groundtruth, run.name, text)
    assert discover_runs(fake_groundtruth)[0].forced_output_tokens == forced
    # The README's replay (the reported counts) on request.
    assert discover_runs(fake_groundtruth, forced_output=False)[0].forced_output_tokens is None


def test_forced_length_is_replayed_and_the_reported_count_scored(
    fake_groundtruth: Path, tmp_path: Path
) -> None:
    """The client under-counted some outputs (3 of a forced 20): the replay generates 20 for
    every successful request, failed ones keep their count, and ITL and throughput divide by
    the reported counts on both sides."""
    from simulator import calibrate as cal
    from simulator.latency.physics import PhysicsCoefficients
    from simulator.validate import baseline_trace, replay_requests, validate_run
    from simulator.workload.trace import load_trace

    dataset = fake_groundtruth / DATASET
    name = "20260101-020000-llama-2-7b-tp1-codegen"
    # Prompt lengths cycling with period 3, for the prompt-reuse case below.
    prompts = [500, 507, 514]
    rows = [(i * 100_000, prompts[i % 3], 3 if i % 2 else 20, 0, 0.03, 0.25) for i in range(6)]
    rows.append((700_000, 500, 2, 1, "", 240.0))  # failed: keeps its own count
    _write_run(dataset, name, "codegen", rows)
    run = select_runs(discover_runs(fake_groundtruth), ["codegen"])[0]
    assert baseline_trace(run, tmp_path) == (None, run.requests_csv)
    before = validate_run(run, "physics")
    _force_output(
        fake_groundtruth,
        name,
        '{"server": {"ignore_eos": true}, "data": {"shared_prefix": {"output_len": 20}}}',
    )
    run = select_runs(discover_runs(fake_groundtruth, forced_output=True), ["codegen"])[0]
    assert [r.output_tokens for r in replay_requests(run)] == [20] * 6 + [2]
    _, baseline = load_trace(*baseline_trace(run, tmp_path))
    assert [r.output_tokens for r in baseline] == [20] * 6 + [2]
    assert [r.arrival_us for r in baseline] == [r[0] for r in rows]
    after = validate_run(run, "physics")

    def predicted(outcome: dict) -> dict[str, float]:
        return {s["metric"]: s["predicted"] for s in outcome["scores"]}

    b, a = predicted(before), predicted(after)
    assert a["e2e_mean_ms"] > b["e2e_mean_ms"]  # three requests now generate 20, not 3
    reported_mean = np.mean([r[2] for r in rows[:6]])
    assert a["itl_ms"] == pytest.approx(
        (a["e2e_mean_ms"] - a["ttft_mean_ms"]) / (reported_mean - 1)
    )
    measured = {s["metric"]: s["measured"] for s in after["scores"]}
    assert measured == {s["metric"]: s["measured"] for s in before["scores"]}
    # calibrate replays the same forced length (baseline and prompt-reuse cases alike).
    for reuse in (False, True):
        if reuse:
            _force_output(
                fake_groundtruth,
                name,
                '{"server": {"ignore_eos": true}, "data": {"shared_prefix": {"output_len": 20}}}',
            )
            run = select_runs(discover_runs(fake_groundtruth, forced_output=True), ["codegen"])[0]
        case = cal.groundtruth_case(run, reuse, tmp_path / f"work-{reuse}")
        result = cal.replay_case(case, PhysicsCoefficients())
        generated = {r.index: r.generated_tokens for r in result.request_records}
        assert [generated[i] for i in case.positions] == [20] * 6
        assert list(case.output_tokens) == [r[2] for r in rows[:6]]


def test_cli_forced_output_length_replays_the_forced_length(
    fake_groundtruth: Path, tmp_path: Path
) -> None:
    """The forced length (the default) and `--reported-output-length` (the README's replay)
    predict differently for a run whose client under-counted."""
    dataset = fake_groundtruth / DATASET
    name = "20260101-020000-llama-2-7b-tp1-codegen"
    rows = [(i * 100_000, 500, 3 if i % 2 else 20, 0, 0.03, 0.25) for i in range(6)]
    _write_run(dataset, name, "codegen", rows)
    _force_output(
        fake_groundtruth,
        name,
        '{"server": {"ignore_eos": true}, "data": {"shared_prefix": {"output_len": 20}}}',
    )
    e2e = {}
    for flag in (["--reported-output-length"], []):
        out = tmp_path / f"scores{len(flag)}.csv"
        result = CliRunner().invoke(
            app,
            ["validate", str(fake_groundtruth), "--runs", "codegen", "--output", str(out), *flag],
        )
        assert result.exit_code == 0, result.output
        frame = pd.read_csv(out)
        e2e[not flag] = frame.loc[frame.metric == "e2e_mean_ms", "predicted"].item()
    assert e2e[True] > e2e[False]  # forced: three requests generate 20 tokens, not 3


# ----------------------------------------------------------- the vllm-0.23.0 observe layout

OBSERVE = Path(__file__).resolve().parent / "data" / "observe_v3"
V23 = "vllm-0.23.0-h100-qwen3-14b"


def _write_cell(dataset: Path, name: str, rows: list[dict[str, str]]) -> None:
    cell = dataset / name
    cell.mkdir(parents=True)
    shutil.copy(OBSERVE / "sweep_rate-agg_2rps" / "trace.yaml", cell / "trace.yaml")
    with (cell / "trace.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def both_layouts(fake_groundtruth: Path) -> Path:
    """The fake vllm-0.15.1 dataset next to a vllm-0.23.0 one: the fixture cell's first 60
    rows as it is, and the same rows as a cell whose client sent 10 % slower than scheduled
    (latencies unchanged): overloaded."""
    dataset = fake_groundtruth / V23
    dataset.mkdir()
    shutil.copy(OBSERVE / "server_config.json", dataset / "server_config.json")
    with (OBSERVE / "sweep_rate-agg_2rps" / "trace.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))[:60]
    _write_cell(dataset, "sweep-agg2", rows)
    first_send, first_arrival = int(rows[0]["send_time_us"]), int(rows[0]["arrival_time_us"])
    late = []
    for row in rows:
        send = first_send + (int(row["arrival_time_us"]) - first_arrival) * 11 // 10
        moved = send - int(row["send_time_us"])
        late.append(
            row
            | {
                "send_time_us": str(send),
                "first_chunk_time_us": str(int(row["first_chunk_time_us"]) + moved),
                "last_chunk_time_us": str(int(row["last_chunk_time_us"]) + moved),
            }
        )
    _write_cell(dataset, "sweep-agg20", late)
    return fake_groundtruth


def test_discovery_of_observe_cells(both_layouts: Path) -> None:
    # The request-CSV layout alone by default (calibrate reads those files itself).
    assert {r.kind for r in discover_runs(both_layouts)} == {"requests"}
    runs = discover_runs(both_layouts, traces=True)
    assert [(r.dataset, r.kind) for r in runs] == [
        ("vllm-0.15.1", "requests"),
        ("vllm-0.15.1", "requests"),
        ("vllm-0.23.0", "trace"),
        ("vllm-0.23.0", "trace"),
    ]
    calm, late = runs[2:]
    assert (calm.name, late.name) == ("sweep-agg2", "sweep-agg20")  # by load, not by text
    assert calm.model == "qwen/qwen3-14b"
    # server_config.json does not record max_num_seqs: the server (started without flags on an
    # H100) took vLLM's default, 1,024; the recorded 8,192 tokens is that branch's default too.
    assert (calm.tp, calm.max_num_seqs, calm.max_num_batched_tokens) == (1, 1024, 8192)
    assert calm.vllm_default_settings == (("max_num_seqs", 1024),)
    assert (calm.max_model_len, calm.block_size_tokens, calm.gpu_kv_blocks) == (40960, 16, 18038)
    assert (calm.prefix_caching, calm.prefix_caching_source) == (True, "server_config.json")
    assert calm.trace_header == both_layouts / V23 / "sweep-agg2" / "trace.yaml"
    assert not calm.overloaded and late.overloaded and late.client_fell_behind
    assert late.overload_reason == "client fell behind its schedule"
    # The dataset folder and a single cell are found on their own too.
    assert discover_runs(both_layouts / V23, traces=True) == [calm, late]
    assert discover_runs(both_layouts / V23 / "sweep-agg2", traces=True) == [calm]
    # 0.15.1 runs: no prefix-caching argument in exp-config.yaml, so vLLM's default.
    assert runs[0].prefix_caching and "exp-config.yaml records no setting" in (
        runs[0].prefix_caching_source
    )


def test_vllm_batch_defaults_by_gpu() -> None:
    # vLLM's OpenAI server without --max-num-batched-tokens/--max-num-seqs: (8192, 1024) on a
    # device with at least 70 GiB that is not an A100, else (2048, 256).
    assert vllm_batch_defaults_for("H100") == (8192, 1024)  # 80 GiB
    assert vllm_batch_defaults_for("H200") == (8192, 1024)
    assert vllm_batch_defaults_for("A100-80") == (2048, 256)  # 80 GiB, but an A100
    assert vllm_batch_defaults_for("A100-SXM") == (2048, 256)
    assert vllm_batch_defaults_for("L40S") == (2048, 256)  # 48 GiB
    assert vllm_batch_defaults("some-gpu", 69.9) == (2048, 256)
    assert vllm_batch_defaults("some-gpu", 70.0) == (8192, 1024)


def test_observe_cell_without_batch_limits_takes_vllms(both_layouts: Path) -> None:
    config_path = both_layouts / V23 / "server_config.json"
    config = json.loads(config_path.read_text())
    del config["max_num_batched_tokens"]
    config_path.write_text(json.dumps(config))
    calm = discover_runs(both_layouts / V23, traces=True)[0]
    assert (calm.max_num_seqs, calm.max_num_batched_tokens) == (1024, 8192)
    assert calm.vllm_default_settings == (("max_num_seqs", 1024), ("max_num_batched_tokens", 8192))
    # A recorded value wins.
    config["max_num_seqs"] = 128
    config_path.write_text(json.dumps(config))
    calm = discover_runs(both_layouts / V23, traces=True)[0]
    assert calm.max_num_seqs == 128
    assert calm.vllm_default_settings == (("max_num_batched_tokens", 8192),)


def test_observe_cell_needs_its_server_config(both_layouts: Path) -> None:
    (both_layouts / V23 / "server_config.json").unlink()
    with pytest.raises(ConfigError, match=r"server_config\.json' is missing .*sweep-agg2"):
        discover_runs(both_layouts, traces=True)


def test_observe_cell_measured_side_counts_from_the_send(both_layouts: Path) -> None:
    from simulator.validate import measured_requests

    calm = discover_runs(both_layouts / V23, traces=True)[0]
    with calm.requests_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    m = measured_requests(calm)
    sends = [int(r["send_time_us"]) for r in rows]
    assert m.positions == list(range(60))
    assert m.ttft_ms[0] == pytest.approx((int(rows[0]["first_chunk_time_us"]) - sends[0]) / 1e3)
    assert m.e2e_ms[5] == pytest.approx((int(rows[5]["last_chunk_time_us"]) - sends[5]) / 1e3)
    ends = [int(r["last_chunk_time_us"]) for r in rows]
    assert m.window_s == pytest.approx((max(ends) - min(sends)) / 1e6)


def test_the_offered_load_replay_keeps_the_recorded_clients_limit(
    both_layouts: Path, tmp_path: Path
) -> None:
    """The saturation figure's replay offers the schedule through the recorded client's limit
    on outstanding requests, as the real server was offered it: never more than that many
    requests between arrival and completion; without the limit the same schedule holds more."""
    from simulator.validate import offered_load_replay, replay_overrides
    from simulator.workload.trace import ClientReplay

    late = discover_runs(both_layouts / V23 / "sweep-agg20", traces=True)[0]
    overrides = replay_overrides(late, "physics")

    def most_in_flight(client: ClientReplay | None) -> int:
        requests = offered_load_replay(late, tmp_path, overrides, client).requests
        events = sorted(
            [(int(t), 1) for t in requests["arrival_us"]]
            + [(int(t), -1) for t in requests["completion_us"]]
        )
        level = peak = 0
        for _, step in events:  # a completion at t frees its slot before an arrival at t
            level += step
            peak = max(peak, level)
        return peak

    assert most_in_flight(ClientReplay(True, 1, "test")) == 1
    assert most_in_flight(None) > 1


def test_validate_scores_both_datasets_and_the_load_sweep(both_layouts: Path) -> None:
    from simulator.validate import LOAD_COLUMNS, saturation, validate_datasets

    done = validate_datasets(both_layouts)
    frame = done.frame
    assert list(frame.columns) == FRAME_COLUMNS
    assert frame.groupby("run")["dataset"].first().to_dict() == {
        "20260101-000000-llama-2-7b-tp1-general": "vllm-0.15.1",
        "20260101-010000-llama-2-7b-tp1-reasoning": "vllm-0.15.1",
        "sweep-agg2": "vllm-0.23.0",
        "sweep-agg20": "vllm-0.23.0",
    }
    assert frame.groupby("run")["overloaded"].first().to_dict()["sweep-agg20"]
    assert np.isfinite(frame["predicted"]).all()
    load = done.load.set_index("run")
    assert list(done.load.columns) == LOAD_COLUMNS
    assert list(load.index) == ["sweep-agg2", "sweep-agg20"]
    # The late cell is predicted at its scheduled times, the offered load.
    assert load.loc["sweep-agg2", "predicted_at"] == "sends"
    assert load.loc["sweep-agg20", "predicted_at"] == "schedule"
    assert load.loc["sweep-agg20", "sent_rps"] < load.loc["sweep-agg20", "offered_rps"]
    assert load.loc["sweep-agg2", "sent_rps"] == pytest.approx(
        load.loc["sweep-agg2", "offered_rps"], rel=1e-3
    )
    top = saturation(done.load).iloc[0]
    assert top["measured_rps"] == pytest.approx(load["measured_rps"].max())
    assert top["predicted_rps"] == pytest.approx(load["predicted_rps"].max())
    summary = summarize(frame)
    accuracy = summary[summary["group"] == "accuracy"]
    assert set(accuracy["dataset"]) == {"vllm-0.15.1", "vllm-0.23.0", "all"}
    # Deterministic: a second pass gives the same figures.
    again = validate_datasets(both_layouts)
    pd.testing.assert_frame_equal(again.frame, frame)
    pd.testing.assert_frame_equal(again.load, done.load)


def test_cli_validate_on_the_parent_of_both_datasets(both_layouts: Path, tmp_path: Path) -> None:
    out = tmp_path / "scores.csv"
    result = CliRunner().invoke(app, ["validate", str(both_layouts), "--output", str(out)])
    assert result.exit_code == 0, result.output
    stdout, stderr = result.stdout, result.stderr
    assert "vllm-0.15.1: 1 run (physics)" in stdout
    assert "vllm-0.23.0: 1 run (physics)" in stdout
    assert "overloaded runs, kept out of the accuracy summary" in stdout
    assert "vllm-0.23.0 sweep-agg20: client fell behind its schedule" in stdout
    assert "vllm-0.15.1 20260101-010000-llama-2-7b-tp1-reasoning: README" in stdout
    assert "vllm-0.23.0: load sweep, achieved throughput in req/s" in stdout
    assert "saturation throughput vllm-0.23.0: measured" in stdout
    assert "accuracy    all" in stdout
    assert "vllm-0.23.0: prefix caching: on (server_config.json)" in stderr
    assert "vllm-0.23.0: max_num_seqs 1,024 (not recorded: vLLM's default" in stderr
    assert "vllm-0.15.1: prefix caching: on (vLLM's default" in stderr
    assert "wall time" in stderr
    written = pd.read_csv(out)
    assert set(written["dataset"]) == {"vllm-0.15.1", "vllm-0.23.0"}
    off = CliRunner().invoke(
        app, ["validate", str(both_layouts / V23), "--runs", "agg2", "--no-prefix-caching"]
    )
    assert off.exit_code == 0, off.output
    assert "vllm-0.23.0: prefix caching: off (--no-prefix-caching)" in off.stderr


def test_validate_and_calibrate_leave_out_a_traces_warm_up_requests_alike(
    both_layouts: Path,
) -> None:
    """The observe header counts the load generator's warm-up requests: neither command
    scores or fits them, and both take the same requests."""
    import simulator.calibrate as cal
    from simulator.validate import measured_requests

    cell = select_runs(discover_runs(both_layouts / V23, traces=True), ["sweep-agg2"])[0]
    everything = measured_requests(cell)
    header = Path(cell.trace_header)
    header.write_text(header.read_text().replace("warm_up_requests: 0", "warm_up_requests: 5"))
    later = measured_requests(cell)
    assert later.positions == [p for p in everything.positions if p >= 5]
    assert list(later.ttft_ms) == list(everything.ttft_ms[-len(later.positions) :])
    case = cal.trace_case(cell.trace_header, cell.requests_csv)
    assert list(case.positions) == later.positions
    assert list(case.measured_e2e_ms) == list(later.e2e_ms)


def test_prompt_reuse_leaves_observe_cells_as_recorded(both_layouts: Path) -> None:
    from simulator.validate import reuse_trace

    cell = discover_runs(both_layouts / V23, traces=True)[0]
    with pytest.raises(ConfigError, match="--prompt-reuse: sweep-agg2: an observe cell"):
        reuse_trace(cell)
    frame = validate_folder(both_layouts / V23, runs=["agg2"], prompt_reuse=True)
    assert set(frame["run"]) == {"sweep-agg2", "sweep-agg20"}


@pytest.mark.parametrize("column", ["has_error", "ttft_s", "e2e_s"])
def test_a_measurement_column_missing_is_named_not_scored_around(
    fake_groundtruth: Path, column: str
) -> None:
    # Without has_error every row scored as a success; without e2e_s none, and the message
    # blamed the run ("no successful request") rather than the column.
    from simulator.validate import measured_requests

    run = discover_runs(fake_groundtruth)[0]
    frame = pd.read_csv(run.requests_csv)
    frame.drop(columns=[column]).to_csv(run.requests_csv, index=False)
    with pytest.raises(ConfigError, match=f"missing column\\(s\\) {column}; expected columns"):
        measured_requests(run)


def test_a_recorded_request_whose_times_decrease_is_refused_before_any_fit(tmp_path: Path) -> None:
    # A first chunk before the send is a negative TTFT: calibrate fitted on it, wrote its
    # coefficients file, and only then failed in its report.
    from simulator.validate import measured_trace
    from simulator.workload.trace import TRACE_V3_COLUMNS

    lines = [",".join(TRACE_V3_COLUMNS)]
    for i, (send, first, last) in enumerate([(0, 50, 90), (100, 90, 300)]):
        row = {c: "" for c in TRACE_V3_COLUMNS}
        row.update(request_id=i, client_id="c", streaming="true", input_tokens=10,
                   output_tokens=5, arrival_time_us=send, send_time_us=send,
                   first_chunk_time_us=first, last_chunk_time_us=last, num_chunks=5,
                   status="ok", server_input_tokens=10)  # fmt: skip
        lines.append(",".join(str(row[c]) for c in TRACE_V3_COLUMNS))
    data = tmp_path / "t.csv"
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="request 1: sent at 100 µs, first chunk at 90 µs"):
        measured_trace(data)


def test_a_request_that_never_went_out_leaves_the_measured_window_alone(
    both_layouts: Path,
) -> None:
    """send_time_us 0 among wall-clock sends is a request that was never sent
    (docs/traces.md): its arrival is on the run's clock, so it cannot start a window that ends
    at a wall-clock chunk. Adding such a row, scheduled before every other, changes neither
    the window nor any latency or throughput; only the row count. (The window ran from its
    arrival, 56 years before the first chunk: throughput 0.00, error 1e10 %.)"""
    from simulator.validate import _figures, measured_requests

    calm = discover_runs(both_layouts / V23, traces=True)[0]
    before = measured_requests(calm)
    with calm.requests_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    unsent = rows[0] | {
        "request_id": "999",
        "arrival_time_us": "0",
        "send_time_us": "0",
        "first_chunk_time_us": "0",
        "last_chunk_time_us": "0",
        "num_chunks": "0",
        "status": "error",
        "finish_reason": "",
    }
    _write_cell(both_layouts / "again", calm.name, [*rows, unsent])
    shutil.copy(calm.meta_json, both_layouts / "again" / "server_config.json")
    after = measured_requests(discover_runs(both_layouts / "again", traces=True)[0])
    assert after.requests == before.requests + 1
    assert after.window_s == pytest.approx(before.window_s)
    assert after.arrival_s.tolist() == pytest.approx(before.arrival_s.tolist())
    assert _figures(after) == pytest.approx(_figures(before))


def test_validate_names_the_physics_fit_it_uses_and_why(fake_groundtruth: Path, tmp_path) -> None:
    """The 0.15.1 runs record their vLLM version only in their folder's name: validate says
    which shipped fit that chose and why; a copy under another name has no version, which it
    warns of (the newest fit then scores it, a different prediction), and --vllm-version
    restores the fit. An unreadable version is one error line, exit 2, no output."""

    def predicted(folder: Path, *flags: str) -> tuple[list[float], str]:
        out = tmp_path / f"{folder.name}{len(flags)}.csv"
        result = CliRunner().invoke(app, ["validate", str(folder), "--output", str(out), *flags])
        assert result.exit_code == 0, result.output
        return pd.read_csv(out)["predicted"].tolist(), result.stderr

    named, stderr = predicted(fake_groundtruth / DATASET)
    assert (
        "vllm-0.15.1: physics fit: H100, vLLM 0.15.1 (vLLM 0.15.1 from the dataset folder's "
        "name)" in stderr
    )
    copy = shutil.copytree(fake_groundtruth / DATASET, tmp_path / "h100-runs")
    unnamed, stderr = predicted(copy)
    assert "h100-runs: warning: vLLM version unknown" in stderr
    assert "the newest fit, H100 vLLM 0.23.0 (--vllm-version chooses)" in stderr
    assert unnamed != named
    chosen, stderr = predicted(copy, "--vllm-version", "0.15.1")
    assert "h100-runs: physics fit: H100, vLLM 0.15.1 (vLLM 0.15.1 from --vllm-version)" in stderr
    assert chosen == named
    bad = CliRunner().invoke(app, ["validate", str(copy), "--vllm-version", "banana"])
    assert bad.exit_code == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: --vllm-version: invalid value 'banana'")
    assert bad.stderr.count("\n") == 1


@pytest.mark.parametrize("version", ["0.23.0+cu128", "0.23", "0.23.0rc1"])
def test_a_recorded_release_spelling_chooses_that_releases_fit(
    both_layouts: Path, version: str
) -> None:
    """A server config's vllm_version as vLLM prints it (a local CUDA build, a short or
    pre-release spelling) is that release: its fit, said to come from server_config.json."""
    from simulator.validate import physics_fit_lines, replay_overrides

    config_path = both_layouts / V23 / "server_config.json"
    config_path.write_text(
        json.dumps(json.loads(config_path.read_text()) | {"vllm_version": version})
    )
    runs = discover_runs(both_layouts / V23, traces=True)
    assert physics_fit_lines(runs) == [
        f"vllm-{version}: physics fit: H100, vLLM 0.23.0 (vLLM {version} from server_config.json)"
    ]
    assert replay_overrides(runs[0], "physics")["latency__vllm_version"] == version


def test_an_unreadable_recorded_version_is_refused(both_layouts: Path) -> None:
    config_path = both_layouts / V23 / "server_config.json"
    config_path.write_text(
        json.dumps(json.loads(config_path.read_text()) | {"vllm_version": "banana"})
    )
    result = CliRunner().invoke(app, ["validate", str(both_layouts / V23)])
    assert result.exit_code == 2 and result.stdout == ""
    assert "server_config.json': vllm_version: invalid value 'banana'" in result.stderr
    assert result.stderr.count("\n") == 1


def test_calibrate_on_both_datasets_says_the_cells_it_leaves_out(both_layouts: Path) -> None:
    """A ground-truth folder fit reads the request-CSV runs; the observe cells beside them
    (another vLLM's server) were left out without a word."""
    result = CliRunner().invoke(
        app, ["calibrate", str(both_layouts), "--start", "physical", "--rounds", "0"]
    )
    assert result.exit_code == 0, result.output
    assert (
        f"calibrate: note: 2 observe cells under {str(both_layouts / V23)!r} left out"
        in result.stderr
    )
    assert f"fit them with --traces {str(both_layouts / V23)!r}" in result.stderr


def test_requests_not_streamed_give_validate_e2e_only(both_layouts: Path) -> None:
    """In a recorded cell, a row with streaming false has as first chunk the whole body's:
    its "TTFT" is its E2E. Such rows count for E2E only; TTFT and ITL are scored over the
    streamed rows, on both sides, so a row's first chunk time no longer matters once it is
    marked. (Until 2026-12-07 they were scored as measured TTFTs.)"""
    dataset = both_layouts / V23
    with (dataset / "sweep-agg2" / "trace.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    marked = [
        row | {"streaming": "false", "first_chunk_time_us": row["last_chunk_time_us"]}
        if i % 2
        else row
        for i, row in enumerate(rows)
    ]
    _write_cell(dataset, "sweep-agg3", marked)
    runs = {r.name: r for r in discover_runs(dataset, traces=True)}

    def scores(name: str) -> tuple[dict, dict]:
        outcome = validate_module.validate_run(runs[name], "roofline")
        return {s["metric"]: s for s in outcome["scores"]}, outcome

    whole, whole_outcome = scores("sweep-agg2")
    mixed, mixed_outcome = scores("sweep-agg3")
    assert "not_streamed" not in whole_outcome
    scored = whole_outcome["n_success"]
    assert mixed_outcome["not_streamed"] == len(range(1, scored, 2))
    for metric in ("e2e_mean_ms", "e2e_p99_ms"):
        assert mixed[metric]["measured"] == whole[metric]["measured"]
    # TTFT over the even rows only: their own mean, on the measured side.
    sent = [int(r["send_time_us"]) for r in rows]
    streamed_ttft = [
        (int(rows[i]["first_chunk_time_us"]) - sent[i]) / 1e3
        for i in range(0, len(rows), 2)
        if rows[i]["status"] == "ok"
    ]
    assert mixed["ttft_mean_ms"]["measured"] == pytest.approx(np.mean(streamed_ttft))
    assert mixed["ttft_mean_ms"]["measured"] < mixed["e2e_mean_ms"]["measured"] / 10
