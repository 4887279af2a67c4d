"""The benchmark tools' bookkeeping: the instruction-count A/B tool's arithmetic
(benchmarks/instructions.py; valgrind itself is not run here: a counted run takes minutes),
how the speed suite (benchmarks/run.py) merges re-measured cases into its CSVs, and how the
tools refuse what they cannot do (wrong options, trees and paths), report a failing child in
one line, and exit non-zero when they checked nothing (soak.py, parity_fuzz.py)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
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


# --- run.py's in-process suite: options, trees, failures (QA review of the benchmark tools) ---

BENCH = _PATH.parent


def _load(name: str, filename: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _check(argv: list[str]):
    parser = bench_run.build_parser()
    args = parser.parse_args(argv)
    bench_run.check_args(parser, args)
    return args


def _refused(capsys, argv: list[str]) -> str:
    """The one-line error `argv` gets from run.py's checks (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        _check(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("run.py: error: ") and err.count("\n") == 1, err
    return err


def _broken_tree(root: Path) -> Path:
    """A checkout whose `simulator` fails on import."""
    (root / "simulator").mkdir(parents=True)
    (root / "simulator" / "__init__.py").write_text('raise RuntimeError("boom: broken tree")\n')
    return root


def test_a_before_tree_without_a_simulator_package_is_refused_before_any_run(tmp_path, capsys):
    base = ["--cases", "a", "--baseline", str(tmp_path / "bl.csv")]
    err = _refused(capsys, [*base, "--before-tree", str(tmp_path / "nowhere")])
    assert "--before-tree: no such folder" in err
    err = _refused(capsys, [*base, "--before-tree", str(tmp_path)])
    assert err == f"run.py: error: --before-tree: no simulator/ package in {tmp_path}\n"


def test_the_before_tree_check_runs_nothing(tmp_path):
    """The QA repro: exit 2 at once, nothing written (it used to time HEAD as "before")."""
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--cases",
            "a",
            "--repeat",
            "1",
            "--before-tree",
            str(tmp_path / "nonexist"),
            "--baseline",
            str(tmp_path / "bl.csv"),
            "--csv",
            str(tmp_path / "r.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--before-tree" in out.stderr
    assert not list(tmp_path.iterdir())


def test_a_child_that_imported_another_tree_is_caught():
    here = str(bench_run.HERE.parent / "simulator")
    assert bench_run.check_imported(here, None) is None
    why = bench_run.check_imported(here, Path("/elsewhere"))
    assert why.startswith(f"imported simulator from {here}, not ")


def test_a_failing_child_is_one_line_with_its_reason(tmp_path):
    tree = _broken_tree(tmp_path / "tree")
    with pytest.raises(bench_run.ChildFailed) as failure:
        bench_run.run_child("a", tree)
    message = str(failure.value)
    assert "\n" not in message
    assert message == f"(a) on {tree} failed (exit 1): RuntimeError: boom: broken tree"


def test_a_failing_before_tree_stops_the_suite_with_one_line(tmp_path, monkeypatch, capsys):
    tree = _broken_tree(tmp_path / "tree")
    monkeypatch.setattr(bench_run, "compile_tree", lambda tree=None: None)
    csv_path, baseline = tmp_path / "r.csv", tmp_path / "bl.csv"
    argv = ["--cases", "a", "c", "--repeat", "1", "--before-tree", str(tree)]
    code = bench_run.main([*argv, "--baseline", str(baseline), "--csv", str(csv_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert err == (
        f"run.py: error: (a) on {tree} failed (exit 1): RuntimeError: boom: broken tree "
        "(nothing written)\n"
    )
    assert not csv_path.exists() and not baseline.exists()


def test_ctrl_c_is_one_line(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_run, "main_in_process", interrupted)
    assert bench_run.main(["--cases", "a", "--csv", str(tmp_path / "r.csv")]) == 130
    assert capsys.readouterr().err == "run.py: interrupted (nothing written)\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--repeat", "0"], "--repeat must be at least 1 (got 0)"),
        (["--repeat", "-1"], "--repeat must be at least 1 (got -1)"),
        (["--cases"], "--cases needs at least one case name"),
        (["--cases", "a", "--scale", "0.01"], "--scale needs --whole-process"),
        (["--pairs", "2"], "--pairs needs --whole-process"),
        (["--startup-runs", "0"], "--startup-runs needs --whole-process"),
        (["--no-parity"], "--no-parity needs --whole-process"),
        (["--out", "/tmp/x.json"], "--out needs --whole-process"),
        (["--baseline", "/nonexistent/bl.csv"], "--baseline: no such file"),
        (["--before-tree", "."], "--before-tree needs --baseline"),
    ],
)
def test_in_process_option_errors(capsys, argv, message):
    assert message in _refused(capsys, argv)


def test_output_paths_are_checked_before_anything_runs(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("")
    err = _refused(capsys, ["--csv", str(tmp_path)])
    assert err == f"run.py: error: --csv: {tmp_path} is a folder\n"
    err = _refused(capsys, ["--markdown", str(a_file / "page.md")])
    assert err == f"run.py: error: --markdown: {a_file} is not a folder\n"
    baseline = tmp_path / "bl.csv"
    tree = _broken_tree(tmp_path / "tree")
    argv = ["--before-tree", str(tree), "--baseline", str(a_file / "bl.csv")]
    assert "--baseline:" in _refused(capsys, argv)
    # Folders that do not exist yet are fine: they are created.
    args = _check(["--csv", str(tmp_path / "new" / "r.csv"), "--baseline", str(a_file)])
    assert args.csv == tmp_path / "new" / "r.csv" and not baseline.exists()


def test_in_process_defaults_are_filled_in():
    args = _check(["--cases", "a"])
    assert args.csv == bench_run.DEFAULT_CSV
    assert args.repeat is None


def test_the_in_process_commit_marks_an_edited_tree_as_whole_process_does(monkeypatch):
    calls = []

    def git_output(directory, *args):
        calls.append(args)
        return "abc1234-dirty"

    wp = bench_run._whole_process()
    monkeypatch.setattr(wp, "git_output", git_output)
    assert bench_run._commit("/some/simulator") == "abc1234-dirty"
    assert wp.tree_commit("/some/simulator") == "abc1234-dirty"
    assert calls == [("describe", "--always", "--dirty")] * 2


def _cost_row(case: str, per_cpu_s: float) -> dict:
    return {"case": case, "requests_per_cpu_s": per_cpu_s}


def test_the_g_over_c_ratio_uses_this_runs_c_only():
    both = bench_run.relative_costs([_cost_row("c", 10_000), _cost_row("g", 8_000)])
    assert both == ["(g) 125 CPU µs/request, (c) 100, both this run: 1.25x"]
    alone = bench_run.relative_costs([_cost_row("g", 8_000)])
    assert alone == [
        "(g) 125 CPU µs/request; no ratio to (c): it was not run this time (run --cases c g for it)"
    ]


def test_the_markdown_table_names_commits_and_dates_and_a_separate_baseline(tmp_path):
    row = {
        "case": "a",
        "requests": "10000",
        "requests_per_wall_s": "200",
        "requests_per_cpu_s": "210",
        "peak_rss_mib": "88",
        "commit": "98b41d6-dirty",
        "when_utc": "2026-12-07 16:00",
    }
    before = {**row, "requests_per_wall_s": "100", "commit": "c40218d", "when_utc": ""}
    note = bench_run.baseline_note(tmp_path / "baseline.csv", None)
    table = bench_run.markdown_table([row], {"a": before}, note)
    head, _rule, line, _blank, last = table.split("\n")
    assert head.endswith("| measured: before; after |")
    assert line.endswith("| 2.0x | 210 | 210 | 88 | 88 | `c40218d`; `98b41d6-dirty` 2026-12-07 |")
    assert last.startswith("Before figures: `baseline.csv` as it stood, not measured alternately")
    assert bench_run.baseline_note(tmp_path / "baseline.csv", tmp_path) is None


# --- instructions.py and memory.py ---------------------------------------------------------------


def test_instructions_refuses_a_before_tree_without_simulator(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        instructions.main(["--cases", "a", "--before-tree", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"instructions.py: error: --before-tree: no simulator/ package in {tmp_path}\n"


def test_instructions_refuses_an_unwritable_csv(tmp_path, capsys):
    with pytest.raises(SystemExit):
        instructions.main(["--cases", "a", "--csv", str(tmp_path)])
    assert capsys.readouterr().err == f"instructions.py: error: --csv: {tmp_path} is a folder\n"


def _fake_valgrind(tmp_path: Path) -> Path:
    """Fails at once with a child's traceback, except for case c, which hangs."""
    tool = tmp_path / "valgrind"
    tool.write_text(
        "#!/bin/sh\n"
        'if [ "$6" = "c" ]; then exec sleep 30; fi\n'
        'echo "==7== Callgrind, a call-graph generating cache profiler" >&2\n'
        'echo "Traceback (most recent call last):" >&2\n'
        'echo "ValueError: scenario is broken" >&2\n'
        'echo "==7== Collected : 123" >&2\n'
        "exit 1\n"
    )
    tool.chmod(0o755)
    return tool


def test_a_failing_count_is_one_line_with_the_childs_error(tmp_path):
    with pytest.raises(instructions.CountFailed) as failure:
        instructions.count("a", 10, None, tool=str(_fake_valgrind(tmp_path)))
    assert str(failure.value) == "(a) 10 requests failed (exit 1): ValueError: scenario is broken"


def test_the_first_failing_count_stops_the_others(tmp_path):
    jobs = [("after", None, "c", 1500), ("after", None, "a", 10)]
    start = time.perf_counter()
    with pytest.raises(instructions.CountFailed, match="scenario is broken"):
        instructions.count_all(jobs, 2, tool=str(_fake_valgrind(tmp_path)))
    assert time.perf_counter() - start < 10  # case c's 30 s process was killed


def test_memory_refuses_a_before_tree_without_simulator(tmp_path, capsys):
    memory = _load("bench_memory", "memory.py")
    with pytest.raises(SystemExit) as exit_info:
        memory.main(["--cases", "a", "--before-tree", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("memory.py: error: --before-tree: no such folder")


# --- --help texts, whole_process.py run on its own, stale references -----------------------------


@pytest.mark.parametrize("filename", ["memory.py", "soak.py", "instructions.py"])
def test_help_descriptions_are_whole_sentences(filename):
    module = _load(f"bench_help_{filename[:-3]}", filename)
    text = module.build_parser().description
    first_paragraph = " ".join(module.__doc__.split("\n\n")[0].split())
    assert text == first_paragraph and text.endswith(".")


def test_whole_process_py_says_it_is_a_module():
    out = subprocess.run(
        [sys.executable, str(BENCH / "whole_process.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    assert "run.py --whole-process" in out.stdout
    alone = subprocess.run(
        [sys.executable, str(BENCH / "whole_process.py")], capture_output=True, text=True
    )
    assert alone.returncode == 2 and "is a module" in alone.stderr


def test_benchmark_files_cited_in_the_tools_exist():
    for path in BENCH.glob("*.py"):
        for cited in re.findall(r"benchmarks/(\w+\.py)", path.read_text()):
            assert (BENCH / cited).exists(), f"{path.name} cites benchmarks/{cited}"


# --- soak.py --------------------------------------------------------------------------------------


def test_soak_does_not_judge_memory_from_too_few_samples():
    soak = _load("bench_soak", "soak.py")
    flat, first, second, verdict = soak.memory_verdict([(1000, 50 << 20)], 2000)
    assert (flat, first, second) == (None, None, None)
    assert verdict.startswith("not judged: 1 memory samples after the warm-up")
    samples = [(n, (50 << 20) + 100 * n) for n in range(1000, 11_000, 1000)]
    assert soak.memory_verdict(samples, 10_000)[0] is True
    growing = [(n, (50 << 20) + (n * n) // 10) for n in range(1000, 11_000, 1000)]
    flat, _first, _second, verdict = soak.memory_verdict(growing, 10_000)
    assert flat is False and verdict.startswith("grows:")


def test_a_short_soak_prints_valid_json_and_says_not_judged():
    out = subprocess.run(
        [sys.executable, str(BENCH / "soak.py"), "--num-requests", "300"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 3, out.stderr
    report = json.loads(out.stdout)  # strict JSON: no NaN
    assert report["memory_flat"] is None
    assert report["bytes_per_request_first_half"] is None
    assert report["memory_verdict"].startswith("not judged")
    assert "memory not judged" in out.stderr


# --- parity_fuzz.py -------------------------------------------------------------------------------


def test_parity_fuzz_exits_non_zero_when_nothing_was_checked(tmp_path, capsys):
    pf = _load("bench_parity_fuzz", "parity_fuzz.py")
    code = pf.main(["--blis-mar", "/bin/false", "--cases", "2", "--keep", str(tmp_path)])
    assert code == pf.EXIT_NOT_CHECKED == 3
    captured = capsys.readouterr()
    assert "0 of 2 cases agree request by request, 0 differ, 2 not checked" in captured.out
    assert "2 case(s) not checked" in captured.err
