"""Interrupting a command (SIGINT = Ctrl-C, SIGTERM): it stops with a non-zero status and one
line saying what was lost, leaves no partial or temporary files, and an interrupted sweep
resumes without redoing the runs it finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simulator.sweeps import RUNS_DIR, sweep

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SERVESIM_CHECK_INVARIANTS": "0"},
    )


def _wait_for_line(proc: subprocess.Popen, marker: str, timeout_s: float = 120) -> list[str]:
    """Read stderr lines until one contains `marker` (the process is then past start-up)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return seen
    proc.kill()
    raise AssertionError(f"never saw {marker!r}; stderr so far: {seen}")


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_writes_no_result_file(tmp_path, signal_number):
    results = tmp_path / "out" / "results.json"
    proc = _start(
        ["run", "scenarios/quickstart.yaml", "--num-requests", "2000000", "--rate", "2000"]
        + ["--results-path", results, "--trace-output", tmp_path / "trace", "--log", "info"]
    )
    _wait_for_line(proc, "simulating")
    time.sleep(0.5)  # inside the event loop by now
    proc.send_signal(signal_number)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal_number
    assert stdout == ""  # no half report
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    name = signal.Signals(signal_number).name
    assert errors == [
        f"error: interrupted by {name}; the run was abandoned; not written: {results}, "
        f"{tmp_path / 'trace'}.yaml/.csv"
    ]
    assert "Traceback" not in stderr
    assert not results.exists()
    assert not (tmp_path / "trace.csv").exists() and not (tmp_path / "trace.yaml").exists()
    assert _leftovers(tmp_path) == []


def _sweep_file(tmp_path: Path) -> Path:
    doc = {
        "base": {"workload": {"num_requests": 500, "rate": 40}},
        "grid": {"engine.max_num_running_reqs": [8, 16, 32, 64]},
        "seeds": [1],
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_interrupted_sweep_keeps_finished_runs_and_resumes(tmp_path):
    sweep_yaml = _sweep_file(tmp_path)
    out = tmp_path / "out"
    proc = _start(["sweep", sweep_yaml, "--out", out, "--workers", "2"])
    _wait_for_line(proc, "[1/4]")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    kept = sorted((out / RUNS_DIR).glob("*.json"))
    assert 1 <= len(kept) < 4
    (error,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert f"{len(kept)} finished run(s) are kept in {out / RUNS_DIR}" in error
    assert "resume" in error
    assert not (out / "points.csv").exists()  # the tables are written only at the end
    assert _leftovers(tmp_path) == []
    before = {p.name: p.stat().st_mtime_ns for p in kept}

    resumed = _start(["sweep", sweep_yaml, "--out", out, "--workers", "2"])
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert f"resumed: {len(kept)} run(s) already in {out}" in stderr
    simulated = [line for line in stderr.splitlines() if line.startswith("[")]
    assert len(simulated) == 4 - len(kept)  # finished points are not redone
    assert {p.name: p.stat().st_mtime_ns for p in kept} == before  # nor rewritten

    fresh = sweep(
        yaml.safe_load(sweep_yaml.read_text())["base"],
        {"engine.max_num_running_reqs": [8, 16, 32, 64]},
        seeds=[1],
        workers=1,
    )
    resumed_runs = pd.read_csv(out / "runs.csv")
    pd.testing.assert_frame_equal(
        resumed_runs, fresh.runs.astype(resumed_runs.dtypes.to_dict()), check_exact=False
    )
