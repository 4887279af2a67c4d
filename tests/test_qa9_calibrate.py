"""QA round 9 on calibrate: flags no input reads, negative chunk times, incomplete trace
cells, the coefficients file's version and what --quiet leaves on stderr."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ConfigError
from simulator.latency.physics import COEFFICIENTS_FILE_VERSION, read_coefficients_file
from simulator.workload.trace import read_rows
from tests.test_validate import DATASET, OBSERVE, V23, _write_cell, _write_run

CELL = OBSERVE / "sweep_rate-agg_2rps"
# Refused before any replay, so each case is cheap.
TRACE_ONLY = [
    ("--scenario", "scenario.yaml"),
    ("--model", "llama-2-7b-hf"),
    ("--hardware", "A100-80"),
    ("--tp", "2"),
    ("--total-kv-blocks", "10"),
    ("--max-num-seqs", "4"),
    ("--max-num-running-reqs", "4"),  # BLIS-Mar's name, named as vLLM's in the error
    ("--max-num-batched-tokens", "100"),
    ("--rtt-ms", "5"),
    ("--network-bandwidth-mbps", "10"),
]
GROUNDTRUTH_ONLY = ["--prompt-reuse", "--no-prompt-reuse", "--reported-output-length"]


def _calibrate(*args: object):
    return CliRunner().invoke(app, ["calibrate", *map(str, args)])


def _one_line_error(result, starts: str) -> None:
    """The project's refusal: exit 2, one stderr line, nothing on stdout, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {starts}"), result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert "Traceback" not in result.output


@pytest.fixture
def groundtruth(tmp_path: Path) -> Path:
    """One request-CSV run of six requests (Llama-2-7B, as the 0.15.1 runs)."""
    rows = [(i * 100_000, 500, 20, 0, 0.03, 0.25) for i in range(6)]
    _write_run(tmp_path / "gt" / DATASET, "20260101-000000-llama-2-7b-tp1-general", "general", rows)
    return tmp_path / "gt"


def _cell_rows(n: int = 40) -> list[dict[str, str]]:
    with (CELL / "trace.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))[:n]


@pytest.fixture
def cells(tmp_path: Path) -> Path:
    """A folder of two observe cells (the fixture cell's first 40 rows each) and the
    server's server_config.json."""
    folder = tmp_path / "cells"
    folder.mkdir()
    shutil.copy(OBSERVE / "server_config.json", folder / "server_config.json")
    _write_cell(folder, "c1", _cell_rows())
    _write_cell(folder, "c2", _cell_rows())
    return folder


# ------------------------------------------------------------------ 1. flags no input reads


@pytest.mark.parametrize(("flag", "value"), TRACE_ONLY)
def test_a_ground_truth_fit_refuses_each_deployment_flag_by_name(
    groundtruth: Path, tmp_path: Path, flag: str, value: str
) -> None:
    """A ground-truth run records its deployment and client: a flag only a trace's replay
    reads used to be ignored (exit 0, identical scores; --hardware A100-80 still said
    'starting from shipped coefficients for H100')."""
    if flag == "--scenario":
        value = str(tmp_path / value)
        Path(value).write_text("model: llama-2-7b-hf\nhardware: A100-80\n")
    named = {"--max-num-running-reqs": "--max-num-seqs"}.get(flag, flag)
    result = _calibrate(groundtruth, "--rounds", "0", flag, value)
    _one_line_error(result, f"{named}: not used with a ground-truth folder: ")
    assert "it applies to traces" in result.stderr


@pytest.mark.parametrize("flag", [*GROUNDTRUTH_ONLY, "--include-overloaded"])
def test_a_trace_fit_refuses_each_ground_truth_flag_by_name(cells: Path, flag: str) -> None:
    """Prompt reuse, the reported output length and --include-overloaded are read by
    request-CSV runs only; on traces they were ignored. Every trace mode refuses them."""
    header, data = cells / "c1" / "trace.yaml", cells / "c1" / "trace.csv"
    for inputs in (
        [cells],
        ["--traces", cells],
        ["--trace-header", header, "--trace-data", data],
    ):
        result = _calibrate(*inputs, "--rounds", "0", flag)
        _one_line_error(result, f"{flag}: not used with traces: ")


def test_a_fit_on_both_applies_each_flag_to_its_part_and_says_so(
    groundtruth: Path, cells: Path
) -> None:
    """With a ground-truth folder and traces, each flag is read by one part: accepted, and
    one note line says which (dropped by --quiet)."""
    args = [groundtruth, "--traces", cells, "--runs", "general", "--runs", "c1", "--rounds", "0"]
    result = _calibrate(*args, "--hardware", "H100", "--rtt-ms", "1", "--no-prompt-reuse")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "apply to" in line]
    assert notes == [
        "calibrate: note: --hardware, --rtt-ms apply to the traces only (each ground-truth "
        "run's deployment is recorded); --no-prompt-reuse apply to the ground-truth runs only"
    ]
    quiet = _calibrate(*args, "--hardware", "H100", "-q")
    assert quiet.exit_code == 0, quiet.output
    assert "apply to" not in quiet.stderr
    # Without a flag of either kind there is nothing to say.
    plain = _calibrate(*args)
    assert plain.exit_code == 0 and "apply to" not in plain.stderr


# -------------------------------------------------------------- 2. negative chunk times


def _damaged_cell(tmp_path: Path, column: str, value: str, row: int = 5) -> Path:
    rows = _cell_rows()
    rows[row] = rows[row] | {column: value}
    folder = tmp_path / "damaged"
    folder.mkdir(exist_ok=True)
    shutil.copy(OBSERVE / "server_config.json", folder / "server_config.json")
    _write_cell(folder, "cell", rows)
    return folder


@pytest.mark.parametrize("column", ["first_chunk_time_us", "last_chunk_time_us"])
def test_a_negative_chunk_time_is_refused_with_its_line_and_column(
    tmp_path: Path, column: str
) -> None:
    """A completed row with a negative chunk time was dropped without a word (calibrate fit
    199 of 200 requests, validate scored 199/200, the report counted it not ok) while a
    first chunk before the send was refused. A chunk time is a time on a clock (0: no token
    came), so a negative one is refused as a negative send is, by every reader."""
    folder = _damaged_cell(tmp_path, column, "-5")
    data = folder / "cell" / "trace.csv"
    # Data line 6 (row 5) is file line 7: the header is line 1.
    expected = f"trace data: {str(data)!r} line 7: column {column}: invalid value '-5'; "
    with pytest.raises(ConfigError, match="must be an integer >= 0") as caught:
        read_rows(data)
    assert str(caught.value).startswith(expected)
    _one_line_error(_calibrate(folder, "--rounds", "0"), expected)
    _one_line_error(CliRunner().invoke(app, ["validate", str(folder), "-q"]), expected)
    report = _calibrate(
        "--trace-header", folder / "cell" / "trace.yaml", "--trace-data", data,
        "--sim-trace", CELL / "trace.csv",
    )  # fmt: skip
    _one_line_error(report, expected)
    # 0 still means "no token came" (a non-ok row): read as it was.
    rows = _cell_rows()
    rows[5] = rows[5] | {"status": "error", "first_chunk_time_us": "0", "last_chunk_time_us": "0"}
    _write_cell(tmp_path / "zero", "cell", rows)
    assert read_rows(tmp_path / "zero" / "cell" / "trace.csv")[5].first_chunk_time_us == 0


def test_decreasing_times_are_labelled_by_the_trace_data_file(tmp_path: Path) -> None:
    """An observe trace's decreasing times said 'ground truth:' in validate and calibrate;
    they name the input they are in, the trace data file (as its reading errors do)."""
    send = int(_cell_rows()[5]["send_time_us"])
    folder = _damaged_cell(tmp_path, "first_chunk_time_us", str(send - 1000))
    data = folder / "cell" / "trace.csv"
    expected = f"trace data: {str(data)!r}, request "
    for result in (
        CliRunner().invoke(app, ["validate", str(folder), "-q"]),
        _calibrate(folder, "--rounds", "0"),
    ):
        _one_line_error(result, expected)
        assert "a completed request's times must not decrease" in result.stderr


# ------------------------------------------------------------------ 3. incomplete cells


@pytest.mark.parametrize("missing", ["trace.csv", "trace.yaml"])
def test_an_incomplete_cell_is_named_not_left_out(cells: Path, missing: str) -> None:
    """A cell folder holding one of its two files was left out of validate and calibrate
    without a word (they scored or fitted the other cell alone)."""
    (cells / "c2" / missing).unlink()
    present = "trace.yaml" if missing == "trace.csv" else "trace.csv"
    where = str(cells / "c2")
    for inputs in ([cells], ["--traces", cells]):
        _one_line_error(
            _calibrate(*inputs, "--rounds", "0"),
            f"trace cell {where!r}: holds {present} but no {missing}; ",
        )
    _one_line_error(
        CliRunner().invoke(app, ["validate", str(cells), "-q"]),
        f"ground truth: observe cell {where!r} holds {present} but no {missing}; ",
    )
    # validate reads only the cells --runs selects (another cell's broken files do not stop
    # them), as it does for every other damage.
    only = CliRunner().invoke(app, ["validate", str(cells), "-q", "--runs", "c1"])
    assert only.exit_code == 0, only.output


def test_a_folder_of_neither_layout_names_both_for_calibrate(tmp_path: Path) -> None:
    """calibrate's FOLDER may be a ground-truth folder or a folder of trace cells: the error
    for an empty one said only the first, as validate's says both."""
    (tmp_path / "empty").mkdir()
    result = _calibrate(tmp_path / "empty")
    _one_line_error(result, f"ground truth: {str(tmp_path / 'empty')!r} has no requests/ folder")
    assert "folder of trace cells (<cell>/trace.yaml + trace.csv)" in result.stderr


# -------------------------------------------------------- 4. the coefficients file version


def _coefficients_file(tmp_path: Path, **top: object) -> Path:
    path = tmp_path / "c.yaml"
    document = {"latency_model": "physics", "coefficients": {"bandwidth_efficiency": 0.8}}
    path.write_text(yaml.safe_dump(document | top))
    return path


@pytest.mark.parametrize("version", [-5, 0, 4, 9, "abc", True, None, 2.0])
def test_a_version_calibrate_never_wrote_is_refused(tmp_path: Path, version: object) -> None:
    """-5 and 0 loaded as 'an older calibrate', 9, "abc" and true as current files."""
    path = _coefficients_file(tmp_path, version=version)
    with pytest.raises(ConfigError, match=r"version: invalid value .*; must be an integer from 1"):
        read_coefficients_file(path)
    start = _calibrate("--start", path, "--rounds", "0")
    _one_line_error(start, "--start: invalid value ")
    assert "version: invalid value" in start.stderr


def test_the_written_versions_and_none_still_load(tmp_path: Path) -> None:
    assert COEFFICIENTS_FILE_VERSION == 3  # the versions below are 1 to it
    notes = {}
    for version in (1, 2, 3):
        c, notes[version] = read_coefficients_file(_coefficients_file(tmp_path, version=version))
        assert c.bandwidth_efficiency == 0.8
    assert "single-roofline step" in notes[1] and "sharp GEMM roofline" in notes[2]
    assert "older" not in notes[3]
    by_hand, note = read_coefficients_file(_coefficients_file(tmp_path))
    assert by_hand.bandwidth_efficiency == 0.8 and "older" not in note


# ---------------------------------------------------------------------------- 5. --quiet


def test_quiet_drops_the_notes_and_keeps_the_warnings(groundtruth: Path, cells: Path) -> None:
    """-q printed `prompt reuse:` (without calibrate's prefix) and the prefix-caching line;
    it now drops every line that is not a warning or an error."""
    loud = _calibrate(groundtruth, "--rounds", "0")
    assert loud.exit_code == 0, loud.output
    assert "calibrate: prompt reuse: " in loud.stderr
    assert "calibrate: prefix caching: " in loud.stderr
    assert not any(line.startswith("prompt reuse") for line in loud.stderr.splitlines())
    quiet = _calibrate(groundtruth, "--rounds", "0", "-q")
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == "" and quiet.stdout == loud.stdout
    # A ground-truth folder with observe cells beside it: the 'left out' note is a note.
    v23 = groundtruth / V23
    shutil.copytree(cells, v23)
    assert "observe cells under" in _calibrate(groundtruth, "--rounds", "0").stderr
    assert _calibrate(groundtruth, "--rounds", "0", "-q").stderr == ""
    # A warning stays: runs of two vLLM versions leave the shipped start a guess.
    mixed = _calibrate(groundtruth, "--traces", v23, "--rounds", "0", "-q")
    assert mixed.exit_code == 0, mixed.output
    assert mixed.stderr.splitlines() == [
        "calibrate: warning: the runs record several vLLM versions (0.15.1, 0.23.0); the "
        "shipped start is the newest fit (--vllm-version chooses)"
    ]
