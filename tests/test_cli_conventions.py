"""The command line follows the conventions of typer/click tools (docs/cli.md, Conventions):
every flag has help, `-h` works everywhere, `--version` prints the version, on/off flags come
as `--x/--no-x`, renamed flags keep their old name, and `run`'s progress bar knows its total.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cli.commands import app_for

runner = CliRunner()


def commands() -> dict[str, Any]:
    """Every command, by its path ("run", "convert preset", ...), and the app itself ("")."""
    found: dict[str, Any] = {}

    def walk(node: Any, path: list[str]) -> None:
        found[" ".join(path)] = node
        for name, sub in getattr(node, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


COMMANDS = commands()
OPTIONS = [
    (path, param)
    for path, command in COMMANDS.items()
    for param in command.params
    if param.param_type_name == "option"
]


def option_id(item: tuple[str, Any]) -> str:
    path, param = item
    return f"{path or 'servesim'} {param.opts[0]}"


@pytest.mark.parametrize("item", OPTIONS, ids=[option_id(o) for o in OPTIONS])
def test_every_option_has_help(item):
    _, param = item
    assert param.help and param.help.strip(), option_id(item)


def test_every_command_is_covered():
    names = set(COMMANDS)
    for expected in ("run", "replay", "validate", "calibrate", "sweep", "plan", "observe"):
        assert expected in names
    assert "convert preset" in names
    assert len(OPTIONS) > 150


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: p or "servesim")
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_flags_work_everywhere(path, flag):
    res = runner.invoke(app, [*path.split(), flag])
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.stdout
    assert "-h" in res.stdout and "--help" in res.stdout


@pytest.mark.parametrize("path", sorted(p for p in COMMANDS if p), ids=str)
def test_the_app_narrowed_to_a_command_parses_it_as_the_whole_app_does(path):
    """`main` runs `app_for(argv)`: only the command argv names, so that typer builds one
    command's options instead of all of them. Its help (every option, default and text) is
    the whole app's, byte for byte; anything else keeps the whole app."""
    argv = [*path.split(), "--help"]
    narrowed = app_for(argv)
    assert narrowed is not app
    assert len(narrowed.registered_commands) + len(narrowed.registered_groups) == 1
    whole_help = runner.invoke(app, argv)
    narrowed_help = runner.invoke(narrowed, argv)
    assert narrowed_help.exit_code == whole_help.exit_code == 0
    assert narrowed_help.stdout == whole_help.stdout
    assert len(app.registered_commands) > 10  # the module's app is left whole


@pytest.mark.parametrize("argv", [[], ["--help"], ["--version"], ["rn"], ["run-typo", "x"]])
def test_the_whole_app_runs_when_no_single_command_is_named(argv):
    assert app_for(argv) is app


def test_a_misspelt_command_is_still_told_what_exists():
    res = runner.invoke(app_for(["rn"]), ["rn"])
    assert res.exit_code == 2
    assert "No such command" in res.output


def test_version_prints_the_package_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0
    assert res.stdout == f"servesim {version('servesim')}\n"


def test_help_states_units_of_the_latency_flags():
    helps = {p.opts[0]: p.help for p in COMMANDS["run"].params if p.param_type_name == "option"}
    assert "µs" in helps["--kv-transfer-base-latency"]
    assert re.search(r"\bms\b", helps["--pd-transfer-base-latency"])
    assert re.search(r"\bs\b", helps["--loading-delay-s"])
    for flag in ("--horizon", "--admission-latency", "--routing-latency", "--timeout-us"):
        assert "µs" in helps[flag], flag


# ------------------------------------------------------------------------ on/off flags

ON_OFF = {
    # flag -> (scenario field it sets, value of --flag)
    "--kv-reload-blocking": ("engine.kv_reload_blocking", True),
    "--summarize-trace": ("cluster.trace.summarize", True),
    "--retry-on-failure": ("instance_lifecycle.retry_on_failure", True),
    "--check-invariants": ("check_invariants", True),
}


def parsed_flags(args: list[str]) -> dict[str, Any]:
    """The flags `run ARGS` passes to its body (parsing only, no simulation)."""
    command = COMMANDS["run"]
    with command.make_context("run", list(args)) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("flag", sorted(ON_OFF))
def test_on_off_flag_accepts_both_forms(flag):
    from simulator.cli.flags import common_overrides

    field, on = ON_OFF[flag]
    name = flag[2:]
    assert common_overrides(parsed_flags([flag])).get(field) is on
    assert common_overrides(parsed_flags([f"--no-{name}"])).get(field) is (not on)
    assert field not in common_overrides(parsed_flags([]))


def test_autoscaler_flag_pair():
    from simulator.cli.flags import common_overrides

    assert common_overrides(parsed_flags(["--no-autoscaler"]))["autoscaler"] == []
    assert "autoscaler" not in common_overrides(parsed_flags(["--autoscaler"]))
    assert "autoscaler" not in common_overrides(parsed_flags([]))


def test_every_boolean_option_is_a_pair_or_a_plain_switch():
    plain = {"--quiet", "--version", "--record-itl", "--unconstrained-output"}
    plain |= {"--include-overloaded", "--fail-if-no-improvement", "--saturation-rate"}
    for path, param in OPTIONS:
        if param.is_flag and not param.secondary_opts:
            assert param.opts[0] in plain, (path, param.opts)


@pytest.mark.parametrize("value", ["on", "off", "true", "false", "TRUE", "Off"])
def test_pd_transfer_contention_takes_a_value(value):
    from simulator.cli.flags import common_overrides

    overrides = common_overrides(parsed_flags(["--pd-transfer-contention", value]))
    assert overrides["cluster.pd.transfer_contention"] is (value.lower() in ("on", "true"))
    blis = common_overrides(parsed_flags([f"--pd-transfer-contention={value}"]))
    assert blis["cluster.pd.transfer_contention"] == overrides["cluster.pd.transfer_contention"]


def test_pd_transfer_contention_refuses_other_values():
    res = runner.invoke(app, ["run", "--num-requests", "3", "--pd-transfer-contention", "yes"])
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        "error: --pd-transfer-contention: invalid value 'yes'; valid: on, off, true, false"
    ]
    # BLIS's bare switch followed by another flag: the next flag was read as the value and
    # told as "invalid value '--pd-transfer-bandwidth'".
    args = ["run", "--pd-transfer-contention", "--pd-transfer-bandwidth", "5"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        "error: --pd-transfer-contention: takes a value, and '--pd-transfer-bandwidth' was read "
        "as it; BLIS's bare switch is written `--pd-transfer-contention on` (or "
        "`--pd-transfer-contention=true`) here"
    ]


def test_an_on_off_flag_runs_end_to_end():
    for flag in ("--check-invariants", "--no-check-invariants"):
        res = runner.invoke(app, ["run", "--num-requests", "5", flag, "-q"])
        assert res.exit_code == 0, res.stderr
        assert '"completed_requests": 5' in res.stdout


# ------------------------------------------------------------------------ renamed flags


def test_loading_delay_old_name_is_a_hidden_alias():
    from simulator.cli.flags import common_overrides

    field = "instance_lifecycle.loading_delay.mean_s"
    assert common_overrides(parsed_flags(["--loading-delay-s", "7"]))[field] == 7
    assert common_overrides(parsed_flags(["--loading-delay", "7"]))[field] == 7
    (old,) = [p for p in COMMANDS["run"].params if "--loading-delay" in p.opts]
    assert old.hidden
    res = runner.invoke(app, ["run", "--loading-delay", "1", "--loading-delay-s", "2"])
    assert res.exit_code == 2
    assert "--loading-delay-s" in res.stderr


@pytest.mark.parametrize("path", ["run", "replay", "validate", "sweep", "plan", "observe"])
def test_simulating_commands_have_quiet(path):
    names = {n for p in COMMANDS[path].params for n in getattr(p, "opts", [])}
    assert {"--quiet", "-q"} <= names


# ------------------------------------------------------------------------ progress


CLIENT = {
    "id": "a",
    "rate_fraction": 1,
    "arrival": {"process": "poisson"},
    "input_distribution": {"type": "constant", "params": {"value": 10}},
    "output_distribution": {"type": "constant", "params": {"value": 10}},
}


def test_expected_requests_of_a_run():
    from simulator.api import as_scenario
    from simulator.cli.commands import expected_requests

    assert expected_requests(as_scenario({"workload": {"num_requests": 37}})) == 37
    v2 = {"workload": {"aggregate_rate": 5, "num_requests": 12, "clients": [CLIENT]}}
    assert expected_requests(as_scenario(v2)) == 12
    horizon_only = {
        "horizon_us": 10_000_000,
        "workload": {"aggregate_rate": 5, "clients": [CLIENT]},
    }
    assert expected_requests(as_scenario(horizon_only)) is None


def test_expected_requests_of_a_trace_is_its_rows(tmp_path):
    from simulator.api import as_scenario
    from simulator.cli.commands import expected_requests

    data = tmp_path / "requests.csv"
    data.write_text(
        "index,arrival_time_us,input_tokens,output_tokens\n0,0,10,10\n1,5,10,10\n2,9,10,10\n\n"
    )
    assert expected_requests(as_scenario({"trace": {"data": str(data)}})) == 3


def test_progress_bar_shows_the_total():
    from rich.console import Console

    from simulator.api import as_scenario
    from simulator.cli.commands import _simulate_with_progress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    sc = as_scenario({"workload": {"num_requests": 40, "rate": 2}})  # 20 s of arrivals
    result = _simulate_with_progress(sc, console=console)
    assert result.summary["completed_requests"] == 40
    assert re.search(r"\d+/40", out.getvalue()), out.getvalue()[-500:]


@pytest.mark.parametrize("path", [p for p in COMMANDS if p])
def test_each_command_summary_is_one_sentence_on_one_line(path):
    """The command list shows a docstring's first paragraph as it is written, line breaks
    included, so a summary wrapped in the source breaks mid-sentence in `--help`."""
    summary = (COMMANDS[path].help or "").strip().split("\n\n")[0]
    assert summary, path
    assert "\n" not in summary, (path, summary)


@pytest.mark.parametrize("path", [p for p in COMMANDS if p])
def test_batch_limit_flags_take_vllms_name_wherever_blis_mars_is_taken(path):
    """`run` took --max-num-seqs while `calibrate` took only --max-num-running-reqs."""
    names = {opt for p in COMMANDS[path].params for opt in getattr(p, "opts", ())}
    for vllm, blis_mar in (
        ("--max-num-seqs", "--max-num-running-reqs"),
        ("--max-num-batched-tokens", "--max-num-scheduled-tokens"),
    ):
        if blis_mar in names:
            assert vllm in names, (path, vllm)


def test_log_help_lists_every_level_it_takes():
    from simulator.cli.common import LOG_LEVELS

    for path, command in COMMANDS.items():
        for param in command.params:
            if "--log" in getattr(param, "opts", ()):
                assert all(level in param.help for level in LOG_LEVELS), path


def _servesim_main(argv: list[str]) -> subprocess.CompletedProcess:
    """The console script as a user runs it: `main` decides how usage errors are told."""
    return subprocess.run(
        [sys.executable, "-m", "simulator.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["run", "--rate", "abc"],
            "error: --rate: invalid value 'abc'; input should be a valid number, unable to "
            "parse string as a number; see 'servesim run -h'",
        ),
        (
            ["run", "--num-requests", "1.5"],
            "error: --num-requests: invalid value '1.5'; input should be a valid integer, "
            "unable to parse string as an integer; see 'servesim run -h'",
        ),
        (["runn"], "error: No such command 'runn'. Did you mean 'run'?; see 'servesim -h'"),
        # Raised without the command's context: the pointer comes from the command line.
        (["run", "--rate"], "error: Option '--rate' requires an argument; see 'servesim run -h'"),
        (
            ["run", "--check-invariants=true"],
            "error: Option '--check-invariants' does not take a value; see 'servesim run -h'",
        ),
    ],
)
def test_a_usage_error_is_one_line_naming_the_value_and_exits_2(argv, line):
    done = _servesim_main(argv)
    assert done.returncode == 2
    assert done.stdout == ""
    # The program name is what Python was asked to run here; a user sees `servesim`.
    assert done.stderr.replace("python -m simulator.cli", "servesim") == line + "\n"


@pytest.mark.parametrize(("argv", "path"), [([], "servesim"), (["convert"], "servesim convert")])
def test_a_group_without_its_command_shows_its_help_and_says_so(argv, path):
    """Bare `servesim` printed the help and `error: ; see 'servesim -h'`."""
    done = _servesim_main(argv)
    assert done.returncode == 2
    assert "Usage:" in done.stdout
    stderr = done.stderr.replace("python -m simulator.cli", "servesim")
    assert stderr == f"error: missing command; see '{path} -h'\n"


@pytest.mark.parametrize("argv", [["--version"], ["models"], ["-h"], ["run", "-q"]])
def test_a_closed_stdout_is_one_error_line_and_exit_2(argv, tmp_path):
    """Started with stdout closed (`>&-`), Python has no sys.stdout: every command ended in a
    traceback (AttributeError at the final flush), exit 1. Now it is the same error as any
    other failure to write there, and a run writes no results file."""
    results = tmp_path / "r.json"
    extra = ["--num-requests", "5", "--results-path", str(results)] if argv[0] == "run" else []
    done = subprocess.run(
        [sys.executable, "-m", "simulator.cli", *argv, *extra],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(1),  # as `>&-` leaves it
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == "error: cannot write to standard output: it is closed\n"
    assert not results.exists()


def test_an_ascii_locale_runs_and_escapes_what_it_cannot_print(tmp_path):
    """Under LC_ALL=C without Python's UTF-8 mode the bundled data (read with the locale's
    encoding) crashed every run, and `run -h` could not print "µs"."""
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    env.pop("LANG", None)
    run = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", "-q", "--num-requests", "5"],
        capture_output=True, text=True, timeout=120, env=env, encoding="utf-8",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert '"completed_requests": 5' in run.stdout
    helped = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", "-h"],
        capture_output=True, text=True, timeout=120, env=env, encoding="utf-8",
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert "\\xb5s" in helped.stdout  # µ escaped, not an encoding error


def test_an_unknown_option_is_one_line_and_exits_2():
    done = _servesim_main(["run", "--bogus", "1"])
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("error: No such option: --bogus")


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["sweep", "SWEEP", "--out", "", "-q"], "--out"),
        (["sweep", "SWEEP", "--out=", "-q"], "--out"),
        (["run", "SCENARIO", "--results-path", "", "-q"], "--results-path"),
        # Positional paths too: `run ''` looked for a scenario in '.' ("it is a directory").
        (["run", "-q", ""], "SCENARIO"),
        (["run", "--seed", "3", ""], "SCENARIO"),
        (["report", ""], "SOURCE"),
        (["plot", ""], "RESULT_DIR"),
        # Repeatable path options (list[Path]): `calibrate --traces ''` searched the folder.
        (["calibrate", "--traces", ""], "--traces"),
        (["calibrate", "--trace-header", "", "--trace-data", "x.csv"], "--trace-header"),
        (["compose", "--from", ""], "--from"),
    ],
)
def test_an_empty_path_is_refused_not_taken_for_the_current_folder(argv, option, tmp_path):
    # The command line turns '' into Path('.'): a sweep's tables landed in the working folder.
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text("base: {workload: {num_requests: 5, rate: 10}}\ngrid: {}\n")
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
    given = {"SWEEP": str(sweep_file), "SCENARIO": str(scenario)}
    argv = [given.get(a, a) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", "simulator.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {option}: invalid value ''; give a path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]  # nothing written


def test_an_empty_value_of_an_option_that_is_no_path_is_left_to_the_command():
    from simulator.cli import empty_path_option

    argv = ["run", "x.yaml", "--routing-scorers", "", "--results-path", "r.json"]
    assert empty_path_option(app_for(argv), argv) is None
    # An empty value of a valued option is that option's, not a positional argument.
    argv = ["run", "--routing-scorers", "", "x.yaml"]
    assert empty_path_option(app_for(argv), argv) is None


def test_an_empty_value_after_an_unknown_option_is_the_unknown_option_s_error():
    """`run --out ''`: run has no --out; the empty value was taken for the scenario path
    and blamed on SCENARIO. The command line now says the option is unknown."""
    from simulator.cli import empty_path_option

    argv = ["run", "--out", ""]
    assert empty_path_option(app_for(argv), argv) is None
    done = _servesim_main(argv)
    assert done.returncode == 2
    assert done.stderr.startswith("error: No such option: --out")
    # A known flag before the empty positional keeps it the scenario's error.
    argv = ["run", "--quiet", ""]
    assert empty_path_option(app_for(argv), argv) == "SCENARIO"


def test_blis_spellings_and_stated_defaults_are_taken(tmp_path):
    """`--log warn` is BLIS's spelling of warning; `--think-time-ms 0`, the stated default,
    changes nothing without --concurrency (it was refused, though the scenario field's 0 ran);
    a bad `--start` for calibrate names the flag before anything loads."""
    for extra in (["--log", "warn"], ["--think-time-ms", "0"]):
        done = _servesim_main(["run", "--num-requests", "2", "-q", *extra])
        assert done.returncode == 0, done.stderr
    refused = _servesim_main(["run", "--num-requests", "2", "-q", "--think-time-ms", "5"])
    assert refused.returncode == 2 and "applies to closed-loop users" in refused.stderr
    # On a scenario whose users are closed-loop already, the flag applies (0 included: it
    # was dropped there once it no longer needed --concurrency).
    closed = tmp_path / "closed.yaml"
    closed.write_text("workload: {num_requests: 8, concurrency: 2, think_time_us: 2000000}\n")
    out = {}
    for think in ("0", "2000"):
        path = tmp_path / f"{think}.json"
        done = _servesim_main(["run", str(closed), "-q", "--think-time-ms", think,
                               "--results-path", str(path)])  # fmt: skip
        assert done.returncode == 0, done.stderr
        out[think] = json.loads(path.read_text())["vllm_estimated_duration_s"]
    assert out["0"] < out["2000"] - 4  # four rounds per user, 2 s of thinking each
    start = _servesim_main(["calibrate", "-q", "--start", str(tmp_path / "absent.yaml")])
    assert start.returncode == 2
    assert start.stderr.startswith("error: --start: invalid value ")
    assert "must be one of shipped, physical or a coefficients FILE" in start.stderr


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--max-num-seqs", "-1"], "--max-num-seqs (engine.max_num_running_reqs): must be from 1"),
        (["--max-num-running-reqs", "-1"], "--max-num-seqs (engine.max_num_running_reqs): must"),
        (["--trace-level", "bogus"], "--trace-level (cluster.trace.level): Input should be"),
        (["--weight-dtype", "bogus"], "--weight-dtype (weight_dtype): Input should be"),
        (
            ["--summarize-trace", "--trace-level", "none"],
            "--trace-level (cluster.trace.level): invalid value 'none' with summarize",
        ),
    ],
)
def test_a_flags_bad_value_names_the_flag_beside_its_field(args, told):
    """QA: a flag's bad value was told by the scenario field it sets alone
    (`engine.max_num_running_reqs: must be ...` for --max-num-seqs -1)."""
    res = runner.invoke(app, ["run", *args, "--num-requests", "2", "-q"])
    assert res.exit_code == 2
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: command-line flags: {told}"), line


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--hardware", "A100"], "--hardware (hardware): unknown GPU 'A100'; valid: A100-80"),
        (
            ["--num-instances", "2", "--prefill-instances", "1", "--decode-instances", "1"]
            + ["--prefill-hardware", "A100"],
            "--prefill-hardware (cluster.pd.prefill.hardware): unknown GPU 'A100'",
        ),
    ],
)
def test_a_flags_unknown_gpu_names_the_flag(args, told):
    """QA: the GPU catalog's check runs when the deployment resolves, after the scenario's,
    and its message began with the field alone (`hardware: unknown GPU 'A100'`)."""
    res = runner.invoke(app, ["run", *args, "--num-requests", "2", "-q"])
    assert res.exit_code == 2
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {told}"), line
