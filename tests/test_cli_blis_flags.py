"""BLIS's `run` flags, March and current, on servesim's command line (docs/cli.md, "BLIS flags,
March and current"): the table there lists every one; each listed as supported (or an alias)
is accepted with BLIS's meaning, each listed as not supported is refused; and the flags
current BLIS added or renamed do what BLIS does with them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cli.flags import common_overrides
from simulator.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _names(text: str) -> list[str]:
    return text.split()


# `blis run --help` of BLIS-Mar (627e3f80) and of current BLIS (f90a1e3a), flag names only.
MARCH = _names(
    """admission-latency admission-policy alpha-coeffs beta-coeffs block-size-in-tokens
counterfactual-k decode-instances decode-routing-scorers defaults-filepath fitness-weights
gpu-memory-utilization hardware hardware-config help horizon kv-cpu-blocks
kv-offload-threshold kv-transfer-bandwidth kv-transfer-base-latency latency-model log
long-prefill-token-threshold max-model-len max-num-running-reqs max-num-scheduled-tokens model
model-config-folder num-instances num-requests output-tokens output-tokens-max
output-tokens-min output-tokens-stdev pd-decider pd-kv-bytes-per-token pd-prefix-threshold
pd-transfer-bandwidth pd-transfer-base-latency policy-config prefill-instances
prefill-routing-scorers prefix-tokens priority-policy prompt-tokens prompt-tokens-max
prompt-tokens-min prompt-tokens-stdev rate results-path routing-latency routing-policy
routing-scorers scheduler seed snapshot-refresh-interval summarize-trace token-bucket-capacity
token-bucket-refill-rate total-kv-blocks tp trace-level trace-output vllm-version workload
workload-spec"""
)
CURRENT = _names(
    """admission-latency admission-policy alpha-coeffs beta-coeffs block-size-in-tokens
cache-signal-delay concurrency counterfactual-k decode-hardware decode-instances
decode-latency-model decode-max-model-len decode-routing-scorers decode-tp defaults-filepath
detectors dispatch-order dispatch-tick-interval dp enable-expert-parallel encode-decider
encode-instances fairness-policy fitness-weights flow-control gpu-memory-utilization hardware
hardware-config help horizon in-flight-eviction kv-cache-util-threshold kv-cpu-blocks
kv-offload-config kv-offload-threshold kv-transfer-bandwidth kv-transfer-base-latency
latency-model lazy-generation log long-prefill-token-threshold lora-adapter-capacity
lora-config lora-footprint-bytes-per-rank lora-load-bandwidth-bytes-us
lora-load-base-latency-us lora-scorer-weight max-concurrency max-gateway-queue-depth
max-model-len max-num-batched-tokens max-num-seqs metrics-path model
model-autoscaler-interval-us model-config-folder moe-comm-backend num-instances num-requests
output-tokens output-tokens-max output-tokens-min output-tokens-stdev pd-decider
pd-prefix-threshold pd-transfer-bandwidth pd-transfer-base-latency pd-transfer-contention
per-band-capacity policy-config preemption-policy prefill-decode-instances prefill-hardware
prefill-instances prefill-latency-model prefill-max-model-len prefill-routing-scorers
prefill-tp prefix-tokens prompt-tokens prompt-tokens-max prompt-tokens-min prompt-tokens-stdev
queue-depth-threshold queue-shedding rate request-ttl routing-latency routing-policy
routing-scorers saturation-config saturation-detector saturation-final-window
saturation-report scheduler seed slo-e2e slo-itl slo-targets slo-ttft
snapshot-refresh-interval summarize-trace think-time-ms timeout token-bucket-capacity
token-bucket-refill-rate total-kv-blocks tp trace-level trace-output usage-limit-threshold
workload workload-spec"""
)
# The ones the issue asked for by name (current BLIS renamed or added them).
ISSUE_FLAGS = _names(
    """max-num-seqs max-num-batched-tokens metrics-path timeout concurrency think-time-ms
    cache-signal-delay lazy-generation model-config-folder defaults-filepath preemption-policy"""
)

RUN = typer.main.get_command(app).commands["run"]
# click adds the help option itself, outside the command's params.
RUN_FLAGS = {name for p in RUN.params for name in (*p.opts, *p.secondary_opts)} | {"--help"}


def _blis_table() -> dict[str, tuple[str, str]]:
    """flag -> (release column, servesim column) of docs/cli.md's BLIS flags table."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## BLIS flags, March and current", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"^\| `--([a-z0-9-]+)` \| (\w+) \| ([^|]+) \|", line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3).strip())
    return rows


def test_the_table_lists_every_blis_run_flag_once():
    rows = _blis_table()
    assert set(rows) == set(MARCH) | set(CURRENT)
    for flag, (release, _) in rows.items():
        expected = "both" if flag in MARCH and flag in CURRENT else (
            "March" if flag in MARCH else "current"
        )  # fmt: skip
        assert release == expected, flag


def test_every_flag_is_what_the_table_says():
    for flag, (_, status) in _blis_table().items():
        supported = status == "supported" or status.startswith("alias of")
        assert (f"--{flag}" in RUN_FLAGS) is supported, (flag, status)


def test_the_flags_the_issue_names_are_all_supported():
    rows = _blis_table()
    for flag in ISSUE_FLAGS:
        assert rows[flag][1] == "supported" or rows[flag][1].startswith("alias of"), flag


def _parsed(args: list[str]) -> dict[str, Any]:
    with RUN.make_context("run", list(args)) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize(
    ("new", "old", "field"),
    [
        ("--max-num-seqs", "--max-num-running-reqs", "engine.max_num_running_reqs"),
        (
            "--max-num-batched-tokens",
            "--max-num-scheduled-tokens",
            "engine.max_num_scheduled_tokens",
        ),
    ],
)
def test_renamed_engine_flags(new, old, field):
    assert common_overrides(_parsed([new, "7"]))[field] == 7
    assert common_overrides(_parsed([old, "7"]))[field] == 7
    (param,) = [p for p in RUN.params if old in p.opts]
    assert param.hidden
    res = runner.invoke(app, ["run", old, "7", new, "8"])
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {old}: the old name of {new}; give only one of them"


def test_metrics_path_is_the_results_file(tmp_path):
    out = tmp_path / "m.json"
    res = runner.invoke(app, ["run", "--num-requests", "4", "--metrics-path", str(out), "-q"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["completed_requests"] == 4 and len(doc["requests"]) == 4
    res = runner.invoke(app, ["run", "--results-path", str(out), "--metrics-path", str(out), "-q"])
    assert res.exit_code == 2 and "--metrics-path" in res.stderr


def _workload(args: list[str]) -> dict:
    from simulator.cli.blis import closed_loop_overrides
    from simulator.cli.flags import workload_overrides

    flags = _parsed(args)
    return closed_loop_overrides(flags, workload_overrides(flags))


def test_timeout_is_in_seconds():
    assert _workload(["--timeout", "5"])["workload.timeout_us"] == 5_000_000
    assert _workload(["--timeout", "-1"])["workload.timeout_us"] == 0  # negative: none
    with pytest.raises(ConfigError, match="--timeout: invalid value 0"):
        _workload(["--timeout", "0"])
    with pytest.raises(ConfigError, match="give one"):
        _workload(["--timeout", "5", "--timeout-us", "7"])


def test_timeout_sets_a_spec_s_deadlines(tmp_path):
    spec = ROOT / "tests" / "data" / "blis_head" / "h5_closed_loop.workload.yaml"
    args = ["run", "--workload-spec", str(spec), "--latency-model", "roofline"]
    args += ["--total-kv-blocks", "29205", "--num-requests", "40", "--timeout", "2"]
    res = runner.invoke(app, [*args, "--trace-output", str(tmp_path / "t"), "-q"])
    assert res.exit_code == 0, res.stderr
    rows = (tmp_path / "t.csv").read_text().splitlines()[1:]
    header = (tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    deadline, arrival = header.index("deadline_us"), header.index("arrival_time_us")
    # 2 s instead of the users' default 300 s.
    assert {int(r.split(",")[deadline]) - int(r.split(",")[arrival]) for r in rows} == {2_000_000}


def test_closed_loop_flags():
    assert _workload(["--concurrency", "4", "--think-time-ms", "20"]) == {
        "workload.concurrency": 4,
        "workload.think_time_us": 20_000,
    }
    for args, needle in [
        (["--concurrency", "4", "--rate", "3"], "cannot be combined with --rate"),
        (
            ["--concurrency", "4", "--workload-spec", "x.yaml"],
            "cannot be combined with --workload-spec",
        ),
        (["--concurrency", "0"], "must be >= 1"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            _workload(args)
    # Without --concurrency a think time is passed on: a scenario whose users are closed-loop
    # takes it, an open-loop one refuses it (tests/test_cli_conventions.py).
    assert _workload(["--think-time-ms", "5"]) == {"workload.think_time_us": 5_000}


def test_concurrency_keeps_users_in_flight(tmp_path):
    out = tmp_path / "m.json"
    res = runner.invoke(
        app,
        [
            "run",
            "--concurrency",
            "3",
            "--num-requests",
            "30",
            "--latency-model",
            "roofline",
            "--prompt-tokens",
            "64",
            "--output-tokens",
            "8",
            "--metrics-path",
            str(out),
            "-q",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.stderr
    requests = json.loads(out.read_text())["requests"]
    assert len(requests) == 30
    sessions = {r["session_id"] for r in requests}
    assert sessions == {f"concurrency_distribution_user_{u}" for u in range(3)}


def test_lazy_generation_changes_nothing():
    base = ["run", "--num-requests", "20", "-q"]
    plain = runner.invoke(app, base)
    lazy = runner.invoke(app, [*base, "--lazy-generation"])
    eager = runner.invoke(app, [*base, "--no-lazy-generation"])
    assert plain.exit_code == lazy.exit_code == eager.exit_code == 0
    assert plain.stdout == lazy.stdout == eager.stdout


def test_model_config_folder(tmp_path):
    from simulator.catalog import models

    bundled = Path(models.__file__).parent / "data" / "model_configs" / "llama-3.1-8b-instruct"
    folder = tmp_path / "my-config"
    shutil.copytree(bundled, folder)
    base = ["run", "--num-requests", "10", "--latency-model", "roofline", "-q"]
    mine = runner.invoke(
        app,
        [
            *base,
            "--model",
            "meta-llama/llama-3.1-8b-instruct",
            "--model-config-folder",
            str(folder),
        ],
    )
    theirs = runner.invoke(app, [*base, "--model", "meta-llama/llama-3.1-8b-instruct"])
    assert mine.exit_code == 0, mine.stderr
    assert mine.stdout == theirs.stdout
    missing = runner.invoke(app, [*base, "--model-config-folder", str(tmp_path / "none")])
    assert missing.exit_code == 2
    assert "--model-config-folder (model_config_folder): invalid value" in missing.stderr
    assert "no such folder or file" in missing.stderr


DEFAULTS = """
defaults:
  meta-llama/llama-3.1-8b-instruct: {GPU: A100-80, tensor_parallelism: 2}
workloads:
  chatbot: {prompt_tokens: 77, prompt_tokens_stdev: 0, prompt_tokens_min: 77,
            prompt_tokens_max: 77, output_tokens: 9, output_tokens_stdev: 0,
            output_tokens_min: 9, output_tokens_max: 9}
trained_physics_coefficients:
  alpha_coeffs: [100, 10, 1]
  beta_coeffs: [0.2, 0, 1.0, 0.5, 30, 4, 120, 480, 0, 2.0, 0.5]
models:
  - {id: meta-llama/llama-3.1-8b-instruct, GPU: A100-80, tensor_parallelism: 2,
     vllm_version: v0.1, alpha_coeffs: [1, 2, 3], beta_coeffs: [4, 5, 6]}
lora: {}
"""


def test_defaults_filepath(tmp_path):
    from simulator.cli.blis import defaults_file_overrides

    path = tmp_path / "defaults.yaml"
    path.write_text(DEFAULTS)
    extra, workload = defaults_file_overrides(
        path, None, {"latency.model": "trained-physics"}, {"workload.preset": "chatbot"}
    )
    assert extra["hardware"] == "A100-80" and extra["tp"] == 2
    assert extra["latency.alpha_coeffs"] == [100, 10, 1]
    assert len(extra["latency.beta_coeffs"]) == 11
    assert workload["workload.prompt_tokens.mean"] == 77
    # Blackbox takes the row for the model on its (defaulted) GPU and TP.
    extra, _ = defaults_file_overrides(path, None, {"latency.model": "blackbox"}, {})
    assert (extra["latency.alpha_coeffs"], extra["latency.beta_coeffs"]) == ([1, 2, 3], [4, 5, 6])
    # Given flags win: no GPU or coefficients from the file.
    extra, _ = defaults_file_overrides(
        path, None, {"hardware": "H100", "tp": 1, "latency.model": "roofline"}, {}
    )
    assert extra == {}
    # A length the scenario gives beside its preset stands, as with the bundled presets (the
    # file's preset lengths replaced it: naming the bundled file changed the results).
    scenario = tmp_path / "preset.yaml"
    scenario.write_text("workload: {preset: chatbot, output_tokens: {mean: 50, stdev: 0}}\n")
    _, workload = defaults_file_overrides(path, scenario, {}, {})
    assert workload["workload.prompt_tokens.mean"] == 77
    assert not any(key.startswith("workload.output_tokens") for key in workload)


def test_defaults_filepath_runs(tmp_path):
    path = tmp_path / "defaults.yaml"
    path.write_text(DEFAULTS)
    out = tmp_path / "m.json"
    res = runner.invoke(
        app,
        [
            "run",
            "--defaults-filepath",
            str(path),
            "--workload",
            "chatbot",
            "--num-requests",
            "5",
            "--latency-model",
            "trained-physics",
            "--metrics-path",
            str(out),
            "-q",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(out.read_text())
    assert {r["num_prefill_tokens"] for r in doc["requests"]} == {77}
    assert doc["latency_model"]["latency_model"] == "trained-physics"
    bad = tmp_path / "bad.yaml"
    bad.write_text("colours: {}\n")
    res = runner.invoke(app, ["run", "--defaults-filepath", str(bad)])
    assert res.exit_code == 2 and "unknown key(s) colours" in res.stderr


def test_per_class_goodput_flags():
    from simulator.cli.blis import go_duration_ms, goodput_overrides

    assert go_duration_ms("1m30s", "x") == 90_000
    assert go_duration_ms("250us", "x") == 0.25
    flags = {"slo_ttft": "critical=100ms,standard=0.5s", "slo_e2e": "critical=5s"}
    assert goodput_overrides(flags) == {
        "slo.classes.critical.ttft_ms": 100.0,
        "slo.classes.standard.ttft_ms": 500.0,
        "slo.classes.critical.e2e_ms": 5000.0,
    }
    for text, needle in [
        ("critical", "expected class=duration"),
        ("critical=fast", "invalid duration 'fast'"),
        ("critical=0s", "must be > 0"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            goodput_overrides({"slo_ttft": text})


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--session-mode", "open"], "--session-mode: invalid value 'open'"),
        (["--think-time-ms", "5"], "--think-time-ms: needs --session-mode closed-loop"),
        (
            [
                "--session-mode",
                "closed-loop",
                "--think-time-ms",
                "5",
                "--think-time-dist",
                "constant:value=1s",
            ],
            "give one of them",
        ),  # fmt: skip
        (["--session-mode", "closed-loop", "--max-in-flight", "4"], "does not apply"),
        (["--session-mode", "closed-loop", "--think-time-dist", "gauss:x=1"], "--think-time-dist"),
    ],
)
def test_bad_replay_session_flags(args, needle):
    trace = ROOT / "tests" / "data" / "blis_head" / "h5_closed_loop.trace"
    res = runner.invoke(
        app,
        ["replay", "--trace-header", f"{trace}.yaml", "--trace-data", f"{trace}.csv", *args],
    )
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_each_refused_blis_flag_is_told_with_its_note():
    """The refused flags' notes in docs/cli.md are what the error says (a nearest-name guess
    sent --max-concurrency to --concurrency, a different feature), and the two agree."""
    import re

    from simulator.cli.blis import REFUSED_BLIS_FLAGS

    table = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    refused = {
        cells[0].strip("` ")
        for line in table.splitlines()
        if "| not supported |" in line
        for cells in [line.strip("|").split("|")]
    }
    assert refused == set(REFUSED_BLIS_FLAGS)
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", "--max-concurrency", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert re.match(
        r"error: --max-concurrency: a BLIS flag servesim does not take \(saturation detector",
        done.stderr,
    )


def test_defaults_filepath_block_count_is_used_at_stock_settings(tmp_path):
    """QA: a --defaults-filepath row's total_kv_blocks was ignored (the bundled 29,205 was
    used), where BLIS-Mar runs with the file's count; it is now taken, for any backend but
    trained-physics (whose rows carry none), unless --total-kv-blocks is given or a setting
    that changes the count is (then the count is computed, as for the bundled row)."""
    from simulator.cli.blis import defaults_file_overrides

    path = tmp_path / "defaults.yaml"
    path.write_text(
        "models:\n  - {id: meta-llama/llama-3.1-8b-instruct, GPU: H100, tensor_parallelism: 1,"
        " total_kv_blocks: 1500, alpha_coeffs: [1, 2, 3], beta_coeffs: [4, 5, 6]}\n"
    )
    base = {"hardware": "H100", "tp": 1, "latency.model": "roofline"}
    extra, _ = defaults_file_overrides(path, None, base, {})
    assert extra == {"engine.total_kv_blocks": 1500}
    # Not beside an explicit count, a setting that changes it, or under physics (whose own
    # rule over measured rows an explicit count would skip: a row must also fit beside the
    # weights on TP GPUs alone) or trained-physics (which always computes).
    for given in (
        {"engine.total_kv_blocks": 900},
        {"engine.gpu_memory_utilization": 0.3},
        {"latency.model": "physics"},
        {"latency.model": "trained-physics"},
    ):
        extra, _ = defaults_file_overrides(path, None, {**base, **given}, {})
        assert "engine.total_kv_blocks" not in extra
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("1500", "-4"))
    with pytest.raises(ConfigError, match=r"models\[0\]\.total_kv_blocks: invalid value -4"):
        defaults_file_overrides(path.with_name("bad.yaml"), None, base, {})


@pytest.mark.parametrize(
    ("setting", "blocks"),
    [
        # BLIS's formula (BLIS-current computes these; BLIS-Mar took its row, 29,205, for
        # all of them): the stock count is 26,312 blocks of 16 tokens at utilisation 0.9.
        ({}, 29_205),  # stock settings: the measured row
        ({"engine__gpu_memory_utilization": 0.3}, 1_736),
        ({"engine__block_size_tokens": 32}, 26_312 // 2),
        # floor(free bytes / block bytes): the 16-bit count is floor(x) with x from 26,312.5
        # to 26,313, an 8-bit block is half the bytes, so floor(2x) = 52,625.
        ({"engine__kv_cache_dtype": "fp8"}, 52_625),
    ],
)
def test_blis_rule_takes_the_row_only_at_stock_settings(setting, blocks):
    """QA: under BLIS's backends --gpu-memory-utilization, --kv-cache-dtype and
    --block-size-in-tokens changed nothing (the row's 29,205 blocks), silently."""
    import simulator

    run = simulator.simulate(
        {"latency": {"model": "roofline"}, "workload": {"num_requests": 1}}, **setting
    )
    assert run.scenario["resolved"]["total_kv_blocks"] == blocks
