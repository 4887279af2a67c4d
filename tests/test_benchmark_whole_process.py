"""benchmarks/run.py --whole-process (issue 30): servesim and BLIS timed as whole processes.

No BLIS binary is needed: the runner is exercised end to end with fake programs (shell
scripts that sleep a little and print a summary), the workload specs are checked by servesim
itself, and the statistics on fixed timings.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import stat
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("bench_run_whole", BENCH / "run.py")
bench_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_run)
wp = bench_run._whole_process()


def _parse(argv: list[str]):
    parser = bench_run.build_parser()
    args = parser.parse_args(argv)
    bench_run.check_args(parser, args)
    return args


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


FAKE = """#!/bin/sh
# A stand-in for servesim or BLIS: lists HELP_FLAGS for `run -h`, logs every run.
if [ "$1" = "run" ] && [ "$2" = "-h" ]; then echo "{help}"; exit 0; fi
if [ "$1" = "--help" ]; then echo "usage"; exit 0; fi
for a in "$@"; do
  if [ "$a" = "--num-requests" ]; then echo "{name} start-up" >> "$FAKE_LOG"; fi
done
echo "{name} $1" >> "$FAKE_LOG"
sleep 0.01
echo "=== Simulation Metrics ==="
echo '{{"instance_id": "cluster", "completed_requests": 7}}'
"""


def _fake(folder: Path, name: str, help_text: str = "") -> Path:
    return _executable(folder / name, FAKE.format(name=name, help=help_text))


# --- arguments -------------------------------------------------------------------------------


def test_whole_process_defaults(tmp_path):
    mar = _fake(tmp_path, "mar")
    args = _parse(["--whole-process", "--blis-mar", str(mar)])
    assert args.cases == ["a", "c", "d"]
    assert args.pairs == 5
    assert args.blis_current is None
    assert args.out == BENCH / "whole_process.json"


def test_without_whole_process_the_in_process_suite_keeps_its_defaults():
    args = _parse([])
    assert args.cases == list(bench_run.CASES)
    assert not args.whole_process


@pytest.mark.parametrize("flag", ["--blis-mar", "--blis-current"])
def test_a_missing_binary_is_a_one_line_error(tmp_path, capsys, flag):
    mar = _fake(tmp_path, "mar")
    missing = tmp_path / "nowhere" / "blis"
    argv = ["--whole-process", "--blis-mar", str(mar), flag, str(missing)]
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"run.py: error: {flag}: no such file: {missing}\n"


def test_a_file_that_cannot_run_is_an_error(tmp_path, capsys):
    plain = tmp_path / "blis"
    plain.write_text("not a program")
    with pytest.raises(SystemExit):
        _parse(["--whole-process", "--blis-mar", str(plain)])
    assert capsys.readouterr().err == f"run.py: error: --blis-mar: not executable: {plain}\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--whole-process"], "--whole-process needs --blis-mar PATH"),
        (["--blis-mar", "x"], "--blis-mar needs --whole-process"),
        (["--whole-process", "--blis-mar", "MAR", "--cases", "a", "e"], "not e"),
        (["--whole-process", "--blis-mar", "MAR", "--pairs", "0"], "--pairs must be"),
    ],
)
def test_option_errors(tmp_path, capsys, argv, message):
    mar = _fake(tmp_path, "mar")
    argv = [str(mar) if a == "MAR" else a for a in argv]
    with pytest.raises(SystemExit):
        _parse(argv)
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_no_default_points_at_a_blis_binary():
    """The repository stands alone: BLIS's paths are arguments only."""
    for path in (BENCH / "run.py", BENCH / "whole_process.py"):
        text = path.read_text()
        assert "/work/" not in text and "../shared" not in text and "peers" not in text


# --- workload specs ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "c", "d"])
def test_the_spec_is_a_v2_poisson_spec_servesim_runs(tmp_path, name):
    case = wp.CASES[name]
    path = wp.write_spec(case, tmp_path)
    spec = yaml.safe_load(path.read_text())
    assert spec["version"] == "2"
    assert spec["seed"] == 42
    assert spec["num_requests"] == case.requests
    assert [c["arrival"] for c in spec["clients"]] == [{"process": "poisson"}]
    # servesim accepts it with the case's own command line (shortened to 20 requests).
    args = wp.program_args(case, wp.servesim_program(), path)
    res = CliRunner().invoke(app, [*args, "--num-requests", "20"])
    assert res.exit_code == 0, res.output
    assert wp.cluster_summary(res.stdout)["completed_requests"] == 20


def test_case_sizes_follow_the_issue():
    assert {n: c.requests for n, c in wp.CASES.items()} == {"a": 10_000, "c": 50_000, "d": 20_000}
    assert wp.make_cases(0.01)["c"].requests == 500


def test_blis_gets_the_same_flags_plus_its_own(tmp_path):
    case = wp.CASES["d"]
    spec = tmp_path / "d.yaml"
    mar = wp.blis_program(wp.MAR, _fake(tmp_path, "mar"))
    args = wp.program_args(case, mar, spec)
    assert args[: len(case.flags) + 1] == ["run", *case.flags]
    assert args[args.index("--workload-spec") + 1] == str(spec)
    assert args[args.index("--pd-kv-bytes-per-token") + 1] == "131072"
    folder = Path(args[args.index("--model-config-folder") + 1])
    assert (folder / "config.json").exists()
    assert mar.cwd == tmp_path  # BLIS runs in its own folder


# --- order and statistics ------------------------------------------------------------------------


def test_programs_alternate():
    assert wp.alternate(["A", "B"], 3) == [
        (0, "A"),
        (0, "B"),
        (1, "A"),
        (1, "B"),
        (2, "A"),
        (2, "B"),
    ]
    order = [p for _, p in wp.alternate(["A", "B", "C"], 2)]
    assert order == ["A", "B", "C", "A", "B", "C"]


def test_wall_statistics():
    stats = wp.wall_stats([3.0, 1.0, 2.0, 10.0, 4.0], 100)
    assert stats["median_wall_s"] == 3.0
    assert (stats["min_wall_s"], stats["max_wall_s"]) == (1.0, 10.0)
    assert stats["requests_per_s"] == pytest.approx(100 / 3)
    assert stats["runs"] == 5
    assert wp.wall_stats([1.0, 2.0, 4.0, 8.0], 30)["median_wall_s"] == 3.0


def test_speed_ratio_is_servesim_speed_over_the_others():
    assert wp.speed_ratio(2.0, 5.0) == 2.5  # servesim 2 s, BLIS 5 s: servesim 2.5x as fast
    assert wp.speed_ratio(4.0, 1.0) == 0.25


def test_completed_check():
    agree = {"servesim": {"completed": [7, 7]}, "BLIS-Mar": {"completed": [7, 7]}}
    assert wp.completed_check(7, agree).startswith("agree: 7 completed")
    differ = {"servesim": {"completed": [7]}, "BLIS-Mar": {"completed": [6]}}
    assert wp.completed_check(7, differ).startswith("DIFFER")
    unread = {"servesim": {"completed": [7]}, "BLIS-Mar": {"completed": [None]}}
    assert "BLIS-Mar" in wp.completed_check(7, unread)


def test_the_cluster_summary_is_found_among_the_instances():
    out = (
        "=== Simulation Metrics ===\n"
        + json.dumps({"instance_id": "instance_0", "completed_requests": 3}, indent=2)
        + "\n=== Simulation Metrics ===\n"
        + json.dumps({"instance_id": "cluster", "completed_requests": 5}, indent=2)
        + "\n=== Anomaly Counters ===\nPriority Inversions: 0\n"
    )
    assert wp.cluster_summary(out)["completed_requests"] == 5
    assert wp.cluster_summary("nothing") is None


def _records(*rows: tuple[str, float, float]) -> dict:
    return {
        "completed_requests": len(rows),
        "requests": [{"requestID": r, "ttft_ms": t, "e2e_ms": e} for r, t, e in rows],
    }


def test_request_by_request_comparison():
    blis = _records(("request_0", 11.884, 655.015), ("request_1", 12.068, 714.451))
    same = _records(("request_1", 12.069, 714.451), ("request_0", 11.884, 655.015))
    assert wp.compare_requests(blis, same).startswith("outputs agree: 2 requests")
    off = _records(("request_0", 11.884, 655.015), ("request_1", 12.068, 714.453))
    assert wp.compare_requests(blis, off) == (
        "MISMATCH at request_1: TTFT 12068 µs (servesim) vs 12068 µs (BLIS-Mar), "
        "E2E 714453 µs vs 714451 µs"
    )
    fewer = _records(("request_0", 11.884, 655.015))
    assert wp.compare_requests(blis, fewer).startswith("MISMATCH: request sets differ")


def test_a_request_dropped_as_unservable_is_compared_by_count():
    """BLIS deletes a request it drops from its records; servesim keeps it with its state."""
    blis = {**_records(("request_0", 11.884, 655.015)), "dropped_unservable": 1}
    ours = {**_records(("request_0", 11.884, 655.015)), "dropped_unservable": 1}
    ours["requests"].append(
        {"requestID": "request_1", "ttft_ms": 0, "e2e_ms": 0, "state": "dropped_unservable"}
    )
    assert wp.compare_requests(blis, ours).startswith("outputs agree: 1 requests")
    served = {**ours, "dropped_unservable": 0}
    assert wp.compare_requests(blis, served) == (
        "MISMATCH: dropped_unservable 0 (servesim) vs 1 (BLIS-Mar)"
    )


# --- end to end with fake programs ---------------------------------------------------------------


def test_runner_end_to_end_with_fake_programs(tmp_path, monkeypatch, capsys):
    log = tmp_path / "runs.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    servesim = _fake(tmp_path, "S")
    mar = _fake(tmp_path, "M")
    # The fake current BLIS lists its flags, and lacks PD's: case d is skipped for it.
    flags = " ".join(wp.program_args(wp.CASES["a"], wp.blis_program(wp.CURRENT, mar), Path("x")))
    current = _fake(tmp_path, "C", help_text=flags + " --num-instances --routing-policy")
    out = tmp_path / "report.json"
    markdown = tmp_path / "page.md"
    markdown.write_text(
        f"# Page\n{bench_run.WHOLE_TABLE_BEGIN}\nold\n{bench_run.WHOLE_TABLE_END}\ntail\n"
    )
    bench_run.main(
        [
            "--whole-process",
            "--blis-mar",
            str(mar),
            "--blis-current",
            str(current),
            "--servesim",
            str(servesim),
            "--pairs",
            "2",
            "--cases",
            "a",
            "d",
            "--startup-runs",
            "2",
            "--no-parity",
            "--out",
            str(out),
            "--markdown",
            str(markdown),
        ]
    )
    runs = log.read_text().split("\n")
    startup = [line.split()[0] for line in runs if line.endswith("start-up")]
    assert startup == ["S", "S", "M", "M", "C", "C"]
    timed = [line.split()[0] for line in runs if line.endswith(" run")]
    # start-up's 1-request runs first (2 per program), then case a: S M C S M C,
    # then case d without C: S M S M.
    assert timed[6:] == ["S", "M", "C", "S", "M", "C", "S", "M", "S", "M"]

    report = json.loads(out.read_text())
    a, d = report["cases"]
    assert a["completed_check"] == "agree: 7 completed of 10,000 by every run"
    assert set(a["programs"]) == {"servesim", "BLIS-Mar", "BLIS-current"}
    assert len(a["programs"]["servesim"]["walls_s"]) == 2
    assert a["programs"]["BLIS-Mar"]["servesim_speed_ratio"] > 0
    assert d["skipped"]["BLIS-current"].startswith("BLIS-current has no --prefill-instances")
    assert set(d["programs"]) == {"servesim", "BLIS-Mar"}
    assert set(report["startup"]) == {"servesim", "BLIS-Mar", "BLIS-current"}
    assert report["startup"]["servesim"]["one_request_run"]["completed"] == [7]

    with out.with_suffix(".csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["case"], r["program"]) for r in rows] == [
        ("a", "servesim"),
        ("a", "BLIS-Mar"),
        ("a", "BLIS-current"),
        ("d", "servesim"),
        ("d", "BLIS-Mar"),
        ("d", "BLIS-current"),
    ]
    assert rows[-1]["note"].startswith("skipped: BLIS-current has no")
    page = markdown.read_text()
    assert "old" not in page and "| a | BLIS-Mar | 10,000 |" in page and page.endswith("tail\n")
    printed = capsys.readouterr().out
    assert "servesim speed ÷ this" in printed


def test_a_failing_program_stops_the_run_with_its_message(tmp_path):
    bad = _executable(tmp_path / "bad", "#!/bin/sh\necho 'Error: unknown flag' >&2\nexit 1\n")
    programs = [wp.servesim_program(bad)]
    with pytest.raises(wp.ProgramFailed, match="unknown flag"):
        wp.run_case(wp.make_cases(0.001)["a"], programs, 1, tmp_path, log=lambda _: None)


def test_this_python_runs_servesim():
    program = wp.servesim_program()
    assert Path(program.argv[0]).parent == Path(sys.executable).parent or (
        program.argv[0] == sys.executable
    )
    assert str(BENCH.parent) in program.env["PYTHONPATH"]


# --- options of the other mode, output files, scale (QA review) ---------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--repeat", "2"], "--repeat is for the in-process suite"),
        (["--csv", "x.csv"], "--csv is for the in-process suite"),
        (["--baseline", "x.csv"], "--baseline is for the in-process suite"),
        (["--cases"], "--cases needs at least one case name"),
        (["--scale", "0"], "--scale must be positive"),
        (["--startup-runs", "-1"], "--startup-runs must be 0 or more"),
        (["--scale", "0.1"], "--scale 0.1 needs --out"),
    ],
)
def test_whole_process_option_errors(tmp_path, capsys, extra, message):
    mar = _fake(tmp_path, "mar")
    with pytest.raises(SystemExit) as exit_info:
        _parse(["--whole-process", "--blis-mar", str(mar), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_scaled_run_needs_its_own_out_and_the_default_is_kept_for_full_size(tmp_path):
    mar = _fake(tmp_path, "mar")
    args = _parse(["--whole-process", "--blis-mar", str(mar), "--scale", "0.1", "--out", "q.json"])
    assert args.out == Path("q.json") and args.scale == 0.1
    args = _parse(["--whole-process", "--blis-mar", str(mar), "--scale", "1"])
    assert args.out == BENCH / "whole_process.json"


def test_an_unwritable_out_is_refused_before_anything_runs(tmp_path, capsys):
    mar = _fake(tmp_path, "mar")
    with pytest.raises(SystemExit):
        _parse(["--whole-process", "--blis-mar", str(mar), "--out", str(mar / "report.json")])
    assert capsys.readouterr().err == f"run.py: error: --out: {mar} is not a folder\n"


def _whole_argv(tmp_path: Path, servesim: Path, mar: Path, *extra: str) -> list[str]:
    return [
        "--whole-process",
        "--blis-mar",
        str(mar),
        "--servesim",
        str(servesim),
        "--pairs",
        "1",
        "--startup-runs",
        "0",
        "--no-parity",
        "--out",
        str(tmp_path / "report.json"),
        *extra,
    ]


def test_the_report_records_its_scale(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "runs.log"))
    argv = _whole_argv(tmp_path, _fake(tmp_path, "S"), _fake(tmp_path, "M"), "--cases", "a")
    assert bench_run.main([*argv, "--scale", "0.001"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["scale"] == 0.001
    assert report["cases"][0]["requests"] == 10


# --- failures and checks: one line, what finished kept, non-zero exit -----------------------------


def test_a_failing_program_keeps_what_finished_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "runs.log"))
    good = _fake(tmp_path, "M0")
    mar = _executable(
        tmp_path / "M",
        "#!/bin/sh\n"
        'for a in "$@"; do if [ "$a" = "--prefill-instances" ]; then\n'
        "  echo 'panic: something' >&2; echo 'Error: no PD here' >&2; exit 3; fi; done\n"
        f'exec {good} "$@"\n',
    )
    markdown = tmp_path / "page.md"
    page = f"{bench_run.WHOLE_TABLE_BEGIN}\nold\n{bench_run.WHOLE_TABLE_END}\n"
    markdown.write_text(page)
    argv = _whole_argv(tmp_path, _fake(tmp_path, "S"), mar, "--cases", "a", "d")
    code = bench_run.main([*argv, "--scale", "0.001", "--markdown", str(markdown)])
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("run.py: error: (d) BLIS-Mar exited 3: Error: no PD here; (a) finished")
    report = json.loads((tmp_path / "report.json").read_text())
    assert [c["case"] for c in report["cases"]] == ["a"]
    assert report["incomplete"] == "(d) BLIS-Mar exited 3: Error: no PD here"
    assert markdown.read_text() == page  # the docs' table is not replaced by a partial run


def test_differing_completed_counts_exit_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "runs.log"))
    mar = _fake(tmp_path, "M")
    mar.write_text(mar.read_text().replace('"completed_requests": 7', '"completed_requests": 6'))
    argv = _whole_argv(tmp_path, _fake(tmp_path, "S"), mar, "--cases", "a")
    assert bench_run.main([*argv, "--scale", "0.001"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("run.py: check failed: (a) completed: DIFFER") and err.count("\n") == 1
    assert json.loads((tmp_path / "report.json").read_text())["cases"][0]["case"] == "a"


def test_failed_checks_name_a_parity_mismatch_and_an_unchecked_parity():
    report = {"cases": [], "replay_parity": "MISMATCH at request_3: TTFT 1 µs vs 2 µs"}
    assert wp.failed_checks(report) == ["replay parity: MISMATCH at request_3: TTFT 1 µs vs 2 µs"]
    report["replay_parity"] = "not checked: BLIS-Mar exited 1: boom"
    assert wp.failed_checks(report) == ["replay parity: not checked: BLIS-Mar exited 1: boom"]
    report["replay_parity"] = "outputs agree: 1,000 requests, TTFT and E2E within 1 µs"
    assert wp.failed_checks(report) == []


def test_a_parity_mismatch_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wp, "replay_parity", lambda *a, **k: "MISMATCH: completed_requests 1 vs 2")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "runs.log"))
    argv = _whole_argv(tmp_path, _fake(tmp_path, "S"), _fake(tmp_path, "M"), "--cases", "a")
    argv.remove("--no-parity")
    assert bench_run.main([*argv, "--scale", "0.001"]) == 1
    assert "replay parity: MISMATCH" in capsys.readouterr().err


def test_failure_messages_are_the_last_error_line():
    stderr = (
        "==12== Callgrind\nTraceback (most recent call last):\n  x\nValueError: no\n==12== end\n"
    )
    assert wp.last_error_line(stderr) == "ValueError: no"
    assert wp.last_error_line("") == "(no message)"


# --- --servesim: another servesim, with its own package -------------------------------------------


def test_another_servesim_is_timed_with_its_own_package(tmp_path):
    """A servesim in another environment: its Python finds its own `simulator` (here through
    a wrapper that appends the other tree to PYTHONPATH, as a site-packages comes after it).
    The benchmark must not put this checkout in front of it, nor find this checkout through
    the working directory."""
    other = tmp_path / "other"
    (other / "lib" / "simulator").mkdir(parents=True)
    (other / "lib" / "simulator" / "__init__.py").write_text("")
    (other / "bin").mkdir()
    python = _executable(
        other / "bin" / "python",
        "#!/bin/sh\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{other / "lib"}" exec {sys.executable} "$@"\n',
    )
    servesim = _executable(other / "bin" / "servesim", f"#!{python}\nimport simulator\n")
    program = wp.servesim_program(servesim)
    assert program.env is None  # its own environment, no PYTHONPATH of ours
    assert wp.compile_bytecode(program) == other / "lib" / "simulator"


def test_a_servesim_whose_python_cannot_import_simulator_is_one_line(tmp_path):
    python = _executable(tmp_path / "python", f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    servesim = _executable(tmp_path / "servesim", f"#!{python}\n")
    with pytest.raises(wp.ProgramFailed) as failure:
        wp.compile_bytecode(wp.servesim_program(servesim))
    message = str(failure.value)
    assert "cannot import simulator" in message and "\n" not in message
