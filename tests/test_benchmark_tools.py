"""The benchmark tools' bookkeeping: the instruction-count A/B tool's arithmetic
(benchmarks/instructions.py; valgrind itself is not run here: a counted run takes minutes)
and how the speed suite (benchmarks/run.py) merges re-measured cases into its CSVs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "instructions.py"
_spec = importlib.util.spec_from_file_location("bench_instructions", _PATH)
instructions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(instructions)
_RUN_PATH = _PATH.parent / "run.py"
_run_spec = importlib.util.spec_from_file_location("bench_run", _RUN_PATH)
bench_run = importlib.util.module_from_spec(_run_spec)
_run_spec.loader.exec_module(bench_run)


def test_reads_the_last_collected_total_from_valgrind_output():
    stderr = (
        "==123== Callgrind, a call-graph generating cache profiler\n"
        "==123== Events    : Ir\n"
        "==123== Collected : 5536467540\n"
        "==123== I   refs:      5,536,467,540\n"
    )
    assert instructions.collected_instructions(stderr) == 5_536_467_540


def test_output_without_a_total_is_an_error_not_a_zero():
    with pytest.raises(RuntimeError, match="no instruction count"):
        instructions.collected_instructions("==1== valgrind: failed to start tool\n")


def test_per_request_subtracts_the_set_up_run():
    # 600 requests counted 5.536 G, the 10-request set-up run 3.603 G: the 590 extra requests
    # cost (5,536,467,540 - 3,603,180,062) / 590 = 3,276,758.4 instructions each.
    got = instructions.per_request(5_536_467_540, 3_603_180_062, 600)
    assert got == pytest.approx(1_933_287_478 / 590)
    assert instructions.SETUP_REQUESTS == 10


def test_every_case_has_a_counted_size_above_the_set_up_run():
    for case in instructions.CASES:
        assert instructions.DEFAULT_REQUESTS[case] > instructions.SETUP_REQUESTS


def _row(case: str, speed: float, commit: str) -> dict:
    return {"case": case, "requests": 10, "requests_per_wall_s": speed, "commit": commit}


def test_re_measured_cases_replace_their_rows_and_keep_the_others(tmp_path):
    path = tmp_path / "results.csv"
    bench_run.write_csv([_row("a", 1.0, "old"), _row("c", 2.0, "old"), _row("d", 3.0, "old")], path)
    merged = bench_run.merge_rows([_row("c", 20.0, "new"), _row("b", 9.0, "new")], path)
    # Case order, every case once; c and b from this run, a and d from the file (as text).
    assert [(r["case"], r["commit"]) for r in merged] == [
        ("a", "old"),
        ("b", "new"),
        ("c", "new"),
        ("d", "old"),
    ]
    assert float(merged[2]["requests_per_wall_s"]) == 20.0


def test_without_a_file_the_merge_is_just_this_run(tmp_path):
    rows = [_row("e", 5.0, "new"), _row("a", 1.0, "new")]
    assert bench_run.merge_rows(rows, tmp_path / "missing.csv") == [rows[1], rows[0]]
