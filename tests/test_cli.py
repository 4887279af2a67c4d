"""The `servesim` command line (docs/behaviour.md §10, §12; docs/architecture.md, "No silent
failure").

Bad input: exit status 2, exactly one `error:` line on stderr, no traceback, nothing written.
Good input: BLIS's `=== Simulation Metrics ===` + JSON on stdout, the per-request file, and
byte-identical output for the same command.

Most cases run in-process through typer's CliRunner (fast); a few run the real program in
subprocesses (started concurrently) to check exit status, streams and determinism end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.metrics.results import BLIS_SUMMARY_FIELDS

DATA = Path(__file__).parent / "data" / "blis"
TRACE_HEADER = DATA / "r1_fixed512.trace.yaml"
TRACE_DATA = DATA / "r1_fixed512.trace.csv"

# docs/behaviour.md §10.2: the summary JSON fields BLIS prints (kv_allocation_failures is omitted
# when 0).
BLIS_FIELDS = set(BLIS_SUMMARY_FIELDS)
REQUEST_FIELDS = {
    "requestID",
    "arrived_at",
    "num_prefill_tokens",
    "num_decode_tokens",
    "ttft_ms",
    "itl_ms",
    "e2e_ms",
    "scheduling_delay_ms",
    "handled_by",
}
HEADER = "=== Simulation Metrics ==="

runner = CliRunner()


def invoke(args: list[str]):
    return runner.invoke(app, [str(a) for a in args])


def start(args: list[str], hashseed: str = "0") -> subprocess.Popen:
    """Start `python -m simulator.cli ARGS` (simulator/cli/__main__.py)."""
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    return subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def parse_summary(stdout: str) -> dict:
    """The summary block: the first JSON object after the header (later blocks, such as
    `=== Latency Model ===`, follow it)."""
    assert stdout.startswith(HEADER + "\n"), stdout[:200]
    summary, _end = json.JSONDecoder().raw_decode(stdout[len(HEADER) :].lstrip())
    return summary


def assert_rejected(res, out_file: Path, *needles: str) -> None:
    """CliRunner result of bad input: a clean exit 2, not an escaped exception."""
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.stdout == ""
    assert_clean_usage_error(res.exit_code, res.stderr, out_file, *needles)


def assert_clean_usage_error(code: int, stderr: str, out_file: Path, *needles: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out_file.exists()
    assert not list(out_file.parent.glob(f".{out_file.name}.*"))  # no temp file left behind


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    unknown_key = tmp_path / "unknown_key.yaml"
    unknown_key.write_text("seed: 1\nworkload:\n  rate: 2\n  num_request: 5\n")
    not_mapping = tmp_path / "not_mapping.yaml"
    not_mapping.write_text("just some words, not a scenario\n")
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("id,arrival,input,output\n0,0,10,10\n")
    return {
        "unknown_key": unknown_key,
        "not_mapping": not_mapping,
        "bad_header": bad_header,
        "missing": tmp_path / "does-not-exist.csv",
    }


BAD_RUN_FLAGS = {
    "unknown_model": (["--model", "acme/nonexistent-7b"], ["acme/nonexistent-7b"]),
    "unknown_gpu": (["--hardware", "X100"], ["X100", "H100"]),
    "unknown_latency_model": (["--latency-model", "crystal-ball"], ["crystal-ball", "roofline"]),
    "unknown_scheduler": (["--scheduler", "lifo"], ["lifo", "fcfs"]),
    "unknown_priority_policy": (["--priority-policy", "vip"], ["vip", "slo-based"]),
    "rate_zero": (["--rate", "0"], ["rate"]),
    "rate_negative": (["--rate", "-3"], ["rate"]),
    # llama-3.1-8b has 32 attention heads; TP must divide them.
    "tp_not_dividing_heads": (["--model", "meta-llama/llama-3.1-8b-instruct", "--tp", "3"], ["tp"]),
    "alpha_without_beta": (["--alpha-coeffs", "1,2,3"], ["--beta-coeffs"]),
    "alpha_not_numbers": (["--alpha-coeffs", "1,x,3", "--beta-coeffs", "1,2,3"], ["1,x,3"]),
}


@pytest.mark.parametrize("case", sorted(BAD_RUN_FLAGS))
def test_bad_flag_is_a_one_line_usage_error(case, tmp_path):
    flags, needles = BAD_RUN_FLAGS[case]
    out = tmp_path / "out.json"
    res = invoke(["run", "--num-requests", "3", *flags, "--results-path", out])
    assert_rejected(res, out, *needles)


def test_scenario_with_unknown_key_names_its_dotted_path(files, tmp_path):
    out = tmp_path / "out.json"
    res = invoke(["run", files["unknown_key"], "--results-path", out])
    assert_rejected(res, out, "workload: unknown key", "num_request")


def test_scenario_that_is_not_a_mapping_is_rejected(files, tmp_path):
    out = tmp_path / "out.json"
    res = invoke(["run", files["not_mapping"], "--results-path", out])
    assert_rejected(res, out, "mapping")


def test_scenario_with_broken_yaml_syntax_is_a_one_line_error(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("workload: [1, 2\n  rate: :\n")
    out = tmp_path / "out.json"
    res = invoke(["run", broken, "--results-path", out])
    assert_rejected(res, out, "YAML")


def test_missing_scenario_file_is_rejected(tmp_path):
    out = tmp_path / "out.json"
    res = invoke(["run", tmp_path / "nope.yaml", "--results-path", out])
    assert_rejected(res, out, "nope.yaml")


def test_missing_trace_file_is_rejected(files, tmp_path):
    out = tmp_path / "out.json"
    res = invoke(
        ["replay", "--trace-header", TRACE_HEADER, "--trace-data", files["missing"]]
        + ["--results-path", out]
    )
    assert_rejected(res, out, "does-not-exist.csv")


def test_trace_csv_with_wrong_header_is_rejected(files, tmp_path):
    out = tmp_path / "out.json"
    res = invoke(
        ["replay", "--trace-header", TRACE_HEADER, "--trace-data", files["bad_header"]]
        + ["--results-path", out]
    )
    assert_rejected(res, out, "header")


def test_bad_input_in_a_real_process_exits_2_without_traceback(files, tmp_path):
    # The same guarantees, end to end: real exit status, real stderr, nothing written.
    cases = {
        "gpu": ["run", "--hardware", "X100"],
        "tp": ["run", "--tp", "3"],
        "scenario_key": ["run", files["unknown_key"]],
        "trace_header": ["replay", "--trace-header", TRACE_HEADER, "--trace-data"]
        + [files["bad_header"]],
    }
    outs = {name: tmp_path / f"{name}.json" for name in cases}
    procs = {name: start([*args, "--results-path", outs[name]]) for name, args in cases.items()}
    for name, proc in procs.items():
        code, stdout, stderr = finish(proc)
        assert stdout == "", name
        assert_clean_usage_error(code, stderr, outs[name])


# ---------------------------------------------------------------------------- good input


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory):
    """`servesim run --num-requests 20 --rate 5 --results-path OUT.json`, twice, concurrently,
    under different hash seeds (nothing may depend on Python's string hashing)."""
    base = tmp_path_factory.mktemp("twin")
    paths = [base / "one" / "OUT.json", base / "two" / "OUT.json"]  # folders get created
    procs = [
        start(["run", "--num-requests", "20", "--rate", "5", "--results-path", p], hashseed=h)
        for p, h in zip(paths, ["1", "2"], strict=True)
    ]
    return [(*finish(p), path) for p, path in zip(procs, paths, strict=True)]


def test_run_prints_blis_summary_and_writes_results(twin_runs):
    code, stdout, stderr, path = twin_runs[0]
    assert code == 0, stderr
    assert "Traceback" not in stderr
    summary = parse_summary(stdout)
    assert summary.keys() >= BLIS_FIELDS, BLIS_FIELDS - summary.keys()
    assert summary["instance_id"] == "cluster"
    assert summary["completed_requests"] == 20
    assert summary["injected_requests"] == 20
    doc = json.loads(path.read_text())
    assert doc.keys() >= BLIS_FIELDS
    assert {k: doc[k] for k in summary} == summary
    reqs = doc["requests"]
    assert len(reqs) == 20
    for r in reqs:
        assert r.keys() >= REQUEST_FIELDS, REQUEST_FIELDS - r.keys()
        assert r["e2e_ms"] >= r["ttft_ms"] > 0
        assert r["handled_by"] == "instance_0"
    arrivals = [r["arrived_at"] for r in reqs]
    assert arrivals == sorted(arrivals)  # docs/behaviour.md §10.3: sorted by arrival
    assert len({r["requestID"] for r in reqs}) == 20


def test_same_command_gives_byte_identical_output(twin_runs):
    (c1, out1, _, p1), (c2, out2, _, p2) = twin_runs
    assert c1 == c2 == 0
    assert out1 == out2
    assert p1.read_bytes() == p2.read_bytes()


def test_flags_override_scenario_fields(tmp_path):
    scenario = tmp_path / "sc.yaml"
    scenario.write_text("seed: 3\nworkload:\n  rate: 5\n  num_requests: 10\n")
    res = invoke(["run", scenario])
    assert res.exit_code == 0, res.stderr
    assert parse_summary(res.stdout)["completed_requests"] == 10
    res = invoke(["run", scenario, "--num-requests", "7"])
    assert res.exit_code == 0, res.stderr
    summary = parse_summary(res.stdout)
    assert summary["completed_requests"] == summary["injected_requests"] == 7


def test_replay_of_blis_trace_completes_every_request(tmp_path):
    out = tmp_path / "replay.json"
    res = invoke(
        ["replay", "--trace-header", TRACE_HEADER, "--trace-data", TRACE_DATA]
        + ["--hardware", "H100", "--tp", "1", "--total-kv-blocks", "1000000"]
        + ["--results-path", out]
    )
    assert res.exit_code == 0, res.stderr
    summary = parse_summary(res.stdout)
    assert summary["completed_requests"] == 1000
    assert summary["injected_requests"] == 1000
    assert len(json.loads(out.read_text())["requests"]) == 1000


def test_replay_scans_the_trace_for_its_spans_once(tmp_path, monkeypatch):
    # The client choice and the notes both need the trace's spans; a replay reads them once
    # (a million-row trace takes seconds to scan), then the run reads the rows themselves.
    import simulator.workload.trace as trace_module

    scans = []
    scan = trace_module.trace_spans
    monkeypatch.setattr(trace_module, "trace_spans", lambda path: scans.append(path) or scan(path))
    res = invoke(
        ["replay", "--trace-header", TRACE_HEADER, "--trace-data", TRACE_DATA]
        + ["--hardware", "H100", "--tp", "1", "--total-kv-blocks", "1000000", "--quiet"]
    )
    assert res.exit_code == 0, res.stderr
    assert len(scans) == 1
    assert "client: at the recorded send times" in res.stderr


def test_models_lists_bundled_models():
    res = invoke(["models"])
    assert res.exit_code == 0
    assert "meta-llama/llama-3.1-8b-instruct" in res.stdout.splitlines()


def test_hardware_lists_gpu_catalog():
    res = invoke(["hardware"])
    assert res.exit_code == 0
    names = [line.split()[0] for line in res.stdout.splitlines()[1:] if line.strip()]
    assert "H100" in names
