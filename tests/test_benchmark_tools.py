"""The instruction-count A/B tool's arithmetic (benchmarks/instructions.py; valgrind itself is
not run here: a counted run takes minutes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "instructions.py"
_spec = importlib.util.spec_from_file_location("bench_instructions", _PATH)
instructions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(instructions)


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
