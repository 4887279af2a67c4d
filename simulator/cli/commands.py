"""`servesim` command line: the typer app, its core commands (run, replay, convert preset,
compose, models, hardware, validate, report) and the registration of every other command
module (calibrate, convert, observe, plan, plot, sweep) onto it.

Bad input prints one line on stderr and exits with status 2, before anything is written; so
does an output flag naming something servesim must not replace (a device, a FIFO, a path on
/proc), checked before simulating (atomic_io.check_output).

The program starts in `simulator.cli.main`, which installs the signal handlers and the
stdout guard before importing this module (typer, then the simulator on first use).

Layering: this module imports the command modules (to register them), `flags`, `blis` and
`common`; none of them imports this module (tests/test_import_graph.py checks it).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.main import get_command_name

from ..atomic_io import atomic_open, write_json_atomically, write_with
from ..errors import ConfigError, ServesimError, counted
from ..interruption import interruptible
from ..version import package_version
from .blis import closed_loop_flags, goodput_flags
from .common import (
    CONTEXT_SETTINGS,
    PrefixCachingOverride,
    check_writable,
    guarded,
    refuse_shared_outputs,
    setup_logging,
    stderr_console,
)
from .flags import (
    common_flags,
    common_overrides,
    trace_output_flag,
    with_flags,
    workload_flags,
    workload_overrides,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
    help="servesim: discrete-event simulator of LLM inference serving (BLIS-compatible flags).",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"servesim {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="print servesim's version and exit",
            metavar="",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """servesim: discrete-event simulator of LLM inference serving (BLIS-compatible flags)."""


def _execute(
    scenario: Path | None,
    overrides: dict[str, Any],
    results_path: Path | None,
    workload_overrides: dict[str, Any] | None = None,
    trace_output: str | None = None,
    quiet: bool = False,
    timeline_path: Path | None = None,
    report_path: Path | None = None,
    extra_inputs: list[tuple[str, Any]] = (),
) -> None:
    from ..api import as_scenario, simulate, with_overrides
    from ..input_files import scenario_input_files
    from ..scenario import Scenario
    from .flags import naming_flags

    check_writable("--results-path", results_path)
    check_writable("--timeline-path", timeline_path)
    check_writable("--report", report_path)
    check_writable("--decisions-path", overrides.get("cluster.trace.path"))
    trace_files = []
    if trace_output is not None:
        from ..workload.trace import check_trace_prefix  # loads only for an export

        check_trace_prefix(trace_output, "--trace-output")
        trace_files = [f"{trace_output}.{ext}" for ext in ("yaml", "csv")]
    for trace_file in trace_files:
        check_writable("--trace-output", trace_file)
    sc = as_scenario(scenario) if scenario is not None else Scenario()
    with naming_flags(overrides, workload_overrides):
        sc = with_overrides(sc, overrides, workload_overrides)
    decisions_flag = "--decisions-path"
    if "cluster.trace.path" not in overrides:
        decisions_flag = "cluster.trace.path"  # from the scenario file
        check_writable(decisions_flag, sc.cluster.trace.path)
    refuse_shared_outputs(
        [
            ("--results-path", results_path),
            ("--timeline-path", timeline_path),
            ("--report", report_path),
            (decisions_flag, sc.cluster.trace.path),
            *(("--trace-output", trace_file) for trace_file in trace_files),
        ],
        inputs=[*scenario_input_files(sc.model_dump(), scenario), *extra_inputs],
    )
    outputs = _planned_outputs(results_path, sc.cluster.trace.path, trace_output)
    if timeline_path is not None:
        outputs.append(str(timeline_path))
    if report_path is not None:
        outputs.append(str(report_path))
    written: list[str] = []

    def lost() -> str:
        missing = [o for o in outputs if o not in written]
        if not outputs:
            return "the run was abandoned; no output files were requested"
        kept = f"; complete: {', '.join(written)}" if written else ""
        return f"the run was abandoned; not written: {', '.join(missing)}{kept}"

    with interruptible(lost):
        logging.getLogger("servesim").info("simulating %s", scenario or "flags-only scenario")
        # A progress display only on a terminal: pipes and CI logs get clean stderr.
        show_progress = not quiet and sys.stderr.isatty()
        # The deployment resolves in simulate: its checks (the GPU catalog's) name flags too.
        with naming_flags(overrides, workload_overrides):
            result = _simulate_with_progress(sc) if show_progress else simulate(sc)
        if sc.cluster.trace.path is not None:
            written.append(str(sc.cluster.trace.path))
        typer.echo(result.report_text())
        if results_path is not None:
            write_json_atomically(results_path, result.results_document())
            written.append(str(results_path))
            logging.getLogger("servesim").info("wrote %s", results_path)
        if trace_output is not None:
            from ..trace_export import export, unexported_traffic

            yaml_path, csv_path, settings = export(result, trace_output, note=False)
            written.append(f"{trace_output}.yaml/.csv")
            logging.getLogger("servesim").info("wrote %s and %s", yaml_path, csv_path)
            _note_unrecorded_settings(settings, scenario)
            for loss in unexported_traffic(sc):
                typer.echo(f"note: --trace-output: {loss}", err=True)
        if timeline_path is not None:
            with atomic_open(timeline_path, newline="") as handle:
                result.timeline.to_csv(handle, index=False)
            written.append(str(timeline_path))
        if report_path is not None:
            from ..report import write_report  # plotly loads only for a report

            write_report(result, report_path)
            written.append(str(report_path))
            logging.getLogger("servesim").info("wrote %s", report_path)


# Fields `replay` sets with a switch of its own (no shared flag sets them).
REPLAY_SWITCHES = {"engine.enable_prefix_caching": ("--prefix-caching", "--no-prefix-caching")}


def _note_unrecorded_settings(settings: dict[str, Any], scenario: Path | None) -> None:
    """Say on stderr what a replay of the exported trace needs besides it to simulate this
    run's deployment: flags where one sets the field, else scenario fields."""
    if not settings:
        return
    from .flags import flag_for_field

    def as_flag(path: str, value: Any) -> str | None:
        if path in REPLAY_SWITCHES and isinstance(value, bool):
            return REPLAY_SWITCHES[path][0 if value else 1]
        flag = flag_for_field(path)
        scalar = isinstance(value, int | float | str) and not isinstance(value, bool)
        return f"{flag} {value}" if flag is not None and scalar else None

    as_flags = {path: as_flag(path, value) for path, value in settings.items()}
    # A section with a field no flag sets goes into the scenario file whole: a scenario's
    # section is validated on its own, before flags are applied (a speculative section
    # without its method would be refused).
    in_file = {path.split(".")[0] for path, flag in as_flags.items() if flag is None}
    flags, fields = [], []
    for path, value in settings.items():
        if path.split(".")[0] in in_file:
            fields.append(f"{path}: {json.dumps(value)}")
        else:
            flags.append(as_flags[path])
    parts = []
    if flags:
        parts.append(" ".join(flags))
    if fields:
        parts.append(f"(in a --scenario file) {'; '.join(fields)}")
    alternative = (
        f"; or replay with --scenario {scenario} and the run's other deployment flags"
        if scenario is not None
        else ""
    )
    typer.echo(
        "note: --trace-output: a TraceV2 header records only the model, TP, sequence limit, "
        "block size, memory utilisation and context limit (BLIS's server keys); to simulate "
        f"this run's deployment, replay it with {' and '.join(parts)}{alternative}",
        err=True,
    )


def _planned_outputs(
    results_path: Path | None, decisions_path: Path | None, trace_output: str | None
) -> list[str]:
    """The files a run was asked to write, named as its interruption message names them."""
    outputs = [str(p) for p in (decisions_path, results_path) if p is not None]
    if trace_output is not None:
        outputs.append(f"{trace_output}.yaml/.csv")
    return outputs


def _simulate_with_progress(sc, console=None):
    """`simulate(sc)` with a progress display on stderr: a bar with the requests finished out
    of the run's known request count and the time remaining, or, when the count is not known
    in advance (a workload bounded only by its horizon), a spinner. rich loads only here."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from ..api import simulate

    total = expected_requests(sc)
    if total is None:
        columns: tuple = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    else:
        columns = (
            TextColumn("simulating"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests, {task.description}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
    console = console if console is not None else stderr_console()
    with Progress(*columns, transient=True, console=console) as bar:
        task = bar.add_task("simulating", total=total)

        def report(now_us: int, completed: int) -> None:
            if total is None:
                description = f"simulated {now_us / 1e6:,.0f} s, {completed:,} requests done"
                bar.update(task, description=description)
            else:
                # Closed-loop follow-ups can outnumber the requests known in advance.
                grown = max(total, completed)
                description = f"{now_us / 1e6:,.0f} s simulated"
                bar.update(task, completed=completed, total=grown, description=description)

        return simulate(sc, progress=report)


def expected_requests(sc: Any) -> int | None:
    """How many requests the run will serve, when known before it starts: a trace's rows, or
    the workload's num_requests (synthetic or v2); None for a workload bounded only by its
    horizon, or when the count cannot be had cheaply."""
    if sc.trace is not None:
        return _count_rows(sc.trace.data)
    from ..api import workload_spec_of

    try:
        spec = workload_spec_of(sc)
    except ServesimError:
        return None  # the run itself reports the problem
    return spec.num_requests or None


def _count_rows(path: str | os.PathLike[str]) -> int | None:
    """Data rows of a CSV with a header line (blank lines not counted)."""
    try:
        with open(path, "rb") as handle:
            lines = sum(1 for line in handle if line.strip())
    except OSError:
        return None
    return max(lines - 1, 0) or None


@app.command()
@with_flags(common_flags, workload_flags, closed_loop_flags, goodput_flags, trace_output_flag)
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help="scenario YAML (flags override its fields)")
    ] = None,
    **flags: Any,
) -> None:
    """Simulate a scenario file, or synthetic traffic described by flags."""

    def go() -> None:
        from .blis import (
            closed_loop_overrides,
            defaults_file_overrides,
            goodput_overrides,
            results_path,
        )

        setup_logging(flags["log"])
        overrides = {**common_overrides(flags), **goodput_overrides(flags)}
        if flags.get("workload_spec") is not None:
            # The flag replaces the scenario's traffic, whichever form that has.
            overrides.update(workload_spec=flags["workload_spec"], workload=None, trace=None)
        workload = closed_loop_overrides(flags, workload_overrides(flags))
        if flags.get("defaults_filepath") is not None:
            extra, extra_workload = defaults_file_overrides(
                flags["defaults_filepath"], scenario, overrides, workload
            )
            overrides, workload = {**extra, **overrides}, {**extra_workload, **workload}
        _execute(
            scenario,
            overrides,
            results_path(flags),
            workload,
            flags["trace_output"],
            flags["quiet"],
            flags["timeline_path"],
            flags["report"],
            [("the defaults file (--defaults-filepath)", flags.get("defaults_filepath"))],
        )

    guarded(go)


@app.command()
@with_flags(common_flags, goodput_flags, trace_output_flag)
def replay(
    trace_data: Annotated[
        Path, typer.Option("--trace-data", help="TraceV2 CSV, or a plain request CSV")
    ],
    trace_header: Annotated[
        Path | None,
        typer.Option("--trace-header", help="TraceV2 header YAML (omit for a plain CSV)"),
    ] = None,
    scenario: Annotated[
        Path | None, typer.Option("--scenario", help="scenario YAML for the deployment")
    ] = None,
    prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--prefix-caching/--no-prefix-caching",
            metavar="",
            help="override what the recorded server did (default: its configuration next to "
            "the trace, else vLLM's default, on)",
            show_default=False,
        ),
    ] = None,
    max_in_flight: Annotated[
        str,
        typer.Option(
            "--max-in-flight",
            help="the load generator's cap on outstanding requests: auto (what the recorded "
            "client did: its send times, or, if it fell behind a saturated server, the "
            "scheduled times with its cap), off (the send times, as BLIS), or N (the scheduled "
            "times, at most N outstanding)",
        ),
    ] = "auto",
    session_mode: Annotated[
        str,
        typer.Option(
            "--session-mode",
            help="fixed (every row at its recorded time, default) | closed-loop (each "
            "session's later rounds wait for the earlier: round r+1 is sent when round r "
            "finished plus a think time)",
        ),
    ] = "fixed",
    think_time_ms: Annotated[
        int | None,
        typer.Option(
            "--think-time-ms",
            help="closed-loop: think time between rounds, ms (0 or unset: the trace's "
            "recorded think times, else its arrival gaps)",
        ),
    ] = None,
    think_time_dist: Annotated[
        str | None,
        typer.Option(
            "--think-time-dist",
            help='closed-loop: think-time law, "constant:value=500ms" or '
            '"lognormal:mu=2.0,sigma=0.6,min=3s,max=30s" (mu, sigma in ln s)',
        ),
    ] = None,
    **flags: Any,
) -> None:
    """Simulate exactly the requests of a BLIS TraceV2 file (send/arrival times, token counts)."""

    def go() -> None:
        from ..api import as_scenario, client_replay, slo_with_workload_targets
        from ..scenario import Scenario
        from ..workload.server_settings import recorded_settings
        from ..workload.trace import trace_notes
        from .blis import (
            defaults_file_overrides,
            goodput_overrides,
            results_path,
            session_mode_trace,
        )

        setup_logging(flags["log"])
        overrides = {**common_overrides(flags), **goodput_overrides(flags)}
        overrides["workload"] = None
        overrides["workload_spec"] = None
        sessions = session_mode_trace(session_mode, think_time_ms, think_time_dist)
        if sessions and max_in_flight != "auto":
            raise ConfigError(
                "--max-in-flight: closed-loop sessions pace themselves; it does not apply "
                "with --session-mode closed-loop"
            )
        client = client_replay("off" if sessions else max_in_flight, trace_data)
        overrides["trace"] = {
            "header": trace_header,
            "data": trace_data,
            "timing": "schedule" if client.at_schedule else "sends",
            "max_in_flight": client.max_in_flight,
            **sessions,
        }
        if flags.get("defaults_filepath") is not None:
            extra, _ = defaults_file_overrides(flags["defaults_filepath"], scenario, overrides, {})
            overrides = {**extra, **overrides}
        choice, apply = _replay_prefix_caching(
            prefix_caching, scenario, overrides, trace_header, trace_data
        )
        if apply:
            overrides["engine.enable_prefix_caching"] = choice.enabled
        base = as_scenario(scenario) if scenario is not None else Scenario()
        slo = slo_with_workload_targets(base)
        if slo is not None and not any(k == "slo" or k.startswith("slo.") for k in overrides):
            # The scenario's workload gives way to the trace, its SLO targets do not.
            overrides = {"slo": slo, **overrides}
        followed, server, unfollowed = recorded_settings(base, overrides, trace_header, trace_data)
        notes_first = []
        if unfollowed is not None:
            notes_first.append(
                f"model: the recording's {unfollowed!r} is not in servesim's catalog "
                f"(servesim models); simulating {base.model} (--model chooses)"
            )
        replaced = server.replaced_line(base, overrides, followed)
        if replaced:
            notes_first.append(replaced)
        notes = notes_first + trace_notes(
            trace_header, trace_data, closed_loop=bool(sessions), spans=client.spans
        )
        if client.at_schedule:  # the send times are not used
            notes = [n for n in notes if not n.startswith("send_time_us:")]
        _execute(
            scenario,
            overrides,
            results_path(flags),
            trace_output=flags["trace_output"],
            quiet=flags["quiet"],
            timeline_path=flags["timeline_path"],
            report_path=flags["report"],
        )
        # After the run: a refused input must leave its error as the only line on stderr.
        typer.echo(choice.line(), err=True)
        if server.line(followed):
            typer.echo(server.line(followed), err=True)
        typer.echo(client.line(), err=True)
        for note in notes:
            typer.echo(f"note: {note}", err=True)

    guarded(go)


def _replay_prefix_caching(
    flag: bool | None,
    scenario: Path | None,
    overrides: dict[str, Any],
    trace_header: Path | None,
    trace_data: Path,
) -> tuple[Any, bool]:
    """The prefix-caching setting of a replay and whether the replay must be told it: the
    flag, else a policy bundle's or the scenario file's own setting (already in force),
    else what the recorded server did (`recorded_prefix_caching`)."""
    from ..api import as_scenario
    from ..workload.server_settings import PrefixCaching, recorded_prefix_caching

    if flag is not None:
        return PrefixCaching(flag, "--prefix-caching" if flag else "--no-prefix-caching"), True
    if "engine.enable_prefix_caching" in overrides:
        return PrefixCaching(
            bool(overrides["engine.enable_prefix_caching"]), "--policy-config"
        ), False
    if scenario is not None:
        engine = as_scenario(scenario).engine
        if "enable_prefix_caching" in engine.model_fields_set:
            return PrefixCaching(engine.enable_prefix_caching, f"scenario {scenario}"), False
    return recorded_prefix_caching(trace_header, trace_data), True


convert_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
    help="Turn other workload forms into a v2 spec.",
)
app.add_typer(convert_app, name="convert")


@convert_app.command("preset")
def convert_preset(
    name: Annotated[str, typer.Option("--name", help="chatbot, contentgen, summarization, ...")],
    rate: Annotated[float, typer.Option("--rate", help="arrival rate, requests/s")] = 1.0,
    num_requests: Annotated[
        int, typer.Option("--num-requests", help="requests in the spec (0 = unlimited)")
    ] = 100,
    arrival: Annotated[
        str,
        typer.Option(
            "--arrival",
            help="arrival process: poisson | gamma | weibull | constant (gamma and weibull "
            "with cv 1; edit the printed spec's arrival.cv for another)",
        ),
    ] = "poisson",
) -> None:
    """Print a BLIS preset as a v2 workload spec (YAML) on stdout."""

    def go() -> None:
        from ..workload.presets import preset_spec, spec_to_yaml

        typer.echo(spec_to_yaml(preset_spec(name, rate, num_requests, arrival)), nl=False)

    guarded(go)


@app.command("compose")
def compose(
    sources: Annotated[
        list[Path], typer.Option("--from", help="v2 workload spec; repeat to merge several")
    ],
) -> None:
    """Merge v2 workload specs into one (aggregate rate = sum) and print it on stdout.

    Each client keeps its absolute rate in every period (windows and spikes included). Each
    spec's length laws are checked first; an error names its file and field."""

    def go() -> None:
        from ..workload.presets import compose_specs, spec_to_yaml, with_absolute_files
        from ..workload.spec import load_workload_spec

        specs = [with_absolute_files(load_workload_spec(p), Path(p).parent) for p in sources]
        merged = compose_specs(specs, names=[str(p) for p in sources])
        typer.echo(spec_to_yaml(merged), nl=False)

    guarded(go)


@app.command("models")
def list_models_cmd() -> None:
    """List the bundled models (HuggingFace ids)."""
    from ..catalog.models import list_models

    for name in list_models():
        typer.echo(name)


@app.command("hardware")
def list_hardware_cmd() -> None:
    """List the GPU catalog: peak rates and whose MFU each GPU uses.

    Rates are dense, except BLIS's L40S FP8 figure, kept as BLIS has it
    (docs/models-and-hardware.md).
    """
    from ..catalog.hardware import get_gpu, list_gpus

    typer.echo(
        f"{'gpu':<10} {'bf16_tflops':>11} {'fp8_tflops':>10} {'fp4_tflops':>10} {'hbm_tbs':>8} "
        f"{'memory_gib':>10}  mfu"
    )
    for name in list_gpus():
        g = get_gpu(name)
        typer.echo(
            f"{g.name:<10} {g.tflops_peak:>11.1f} {g.tflops_fp8:>10.1f} {g.tflops_fp4:>10.1f} "
            f"{g.bw_peak_tbs:>8.3f} {g.memory_gib:>10.1f}  "
            + (f"carried over from {g.mfu_from}" if g.mfu_from else "calibrated")
        )
    typer.echo(
        "(dense rates, except L40S fp8_tflops: BLIS's figure, NVIDIA's with-sparsity rate; "
        "733 dense)"
    )


@app.command("validate")
def validate_cmd(
    folder: Annotated[
        Path | None,
        typer.Argument(
            help="ground-truth folder: a dataset folder (vllm-0.15.1 request CSVs or "
            "vllm-0.23.0 observe cells), one cell, or their parent; default: the "
            "repository's groundtruth/ folder"
        ),
    ] = None,
    latency_models: Annotated[
        list[str] | None,
        typer.Option(
            "--latency-model",
            help="step-time backend (repeat to compare several: physics, roofline, blackbox, "
            "crossmodel, trained-roofline, trained-physics)",
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="write the per-run table as CSV")
    ] = None,
    runs: Annotated[
        list[str] | None,
        typer.Option("--runs", help="only runs/cells whose name contains NAME (repeatable)"),
    ] = None,
    latency_coeffs: Annotated[
        Path | None,
        typer.Option("--latency-coeffs", help="coefficients YAML for physics (from calibrate)"),
    ] = None,
    prompt_reuse: Annotated[
        bool | None,
        typer.Option(
            "--prompt-reuse/--no-prompt-reuse",
            metavar="",
            help="replay the load generator's repeated prompts (request-CSV runs): default "
            "whenever the request file shows its prompt cycle; --prompt-reuse requires one, "
            "--no-prompt-reuse replays every prompt as new",
            show_default=False,
        ),
    ] = None,
    forced_output_length: Annotated[
        bool,
        typer.Option(
            "--forced-output-length/--reported-output-length",
            metavar="",
            help="replay the output length an ignore_eos profile forced (default), or the "
            "count the client reported, which undercounts (docs/accuracy.md)",
        ),
    ] = True,
    prefix_caching: PrefixCachingOverride = None,
    warm_up_s: Annotated[
        float,
        typer.Option(
            "--warm-up-s",
            help="score only the requests that arrived this many seconds or more after each "
            "run's first (the freshly started server's warm-up left out, on both sides; "
            "docs/accuracy.md); 0 scores every request",
        ),
    ] = 0.0,
    vllm_version: Annotated[
        str | None,
        typer.Option(
            "--vllm-version",
            help="vLLM version whose shipped physics fit to use for every run (default: each "
            "dataset's, from its server_config.json or folder name, else the newest fit)",
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", metavar="", help="no per-run progress lines on stderr")
    ] = False,
) -> None:
    """Replay the measured vLLM runs and score TTFT, E2E, ITL and throughput against them."""
    import time

    def go() -> None:
        from ..input_files import refuse_writing_inputs
        from ..latency.physics import version_key
        from ..validate import (
            ALL_DATASETS,
            check_warm_up_s,
            default_groundtruth,
            physics_fit_lines,
            summarize,
            validate_datasets,
        )

        started_s = time.perf_counter()
        check_warm_up_s(warm_up_s, "--warm-up-s")
        if vllm_version is not None:
            version_key(vllm_version, "--vllm-version")
        where = folder if folder is not None else default_groundtruth("validate")
        check_writable("--output", output)
        refuse_writing_inputs(
            [("--output", output)],
            [
                ("the ground-truth folder", where),
                ("the coefficients file (--latency-coeffs)", latency_coeffs),
            ],
        )

        def progress(outcome: dict[str, Any]) -> None:
            if quiet:
                return
            unstreamed = outcome.get("not_streamed", 0)
            typer.echo(
                f"{outcome['dataset']} {outcome['run']}: {outcome['n_success']}/"
                f"{outcome['n_requests']} scored, {outcome['wall_s']:.1f} s"
                + (
                    f" ({unstreamed} not streamed (streaming=false): E2E only, TTFT and ITL "
                    "over the streamed ones)"
                    if unstreamed
                    else ""
                ),
                err=True,
            )

        import pandas as pd

        from ..scenario import DEFAULT_LATENCY_MODEL

        models = latency_models or [DEFAULT_LATENCY_MODEL]
        frames = []
        medians = {}
        for model in models:
            extra = {"latency__coeffs_file": latency_coeffs} if latency_coeffs else None
            done = validate_datasets(
                where,
                model,
                runs,
                on_run=progress,
                extra_overrides=extra,
                prompt_reuse=prompt_reuse,
                forced_output=forced_output_length,
                prefix_caching=prefix_caching,
                warm_up_s=warm_up_s,
                vllm_version=vllm_version,
            )
            if model == "physics" and latency_coeffs is None:
                for line in physics_fit_lines(done.runs, vllm_version):
                    typer.echo(line, err=True)
            if model == models[0]:
                _echo_server_settings(done, prefix_caching, prompt_reuse)
                if warm_up_s > 0:
                    typer.echo(
                        f"scored: the requests that arrived {warm_up_s:g} s or more after each "
                        "run's first (--warm-up-s); throughput from then on",
                        err=True,
                    )
            _echo_validation(done, model)
            summary = summarize(done.frame)
            accuracy = summary[summary["group"] == "accuracy"]
            # Over every dataset's accuracy runs: the `all` rows when there are several.
            if (accuracy["dataset"] == ALL_DATASETS).any():
                overall = accuracy[accuracy["dataset"] == ALL_DATASETS]
            else:
                overall = accuracy
            medians[model] = dict(zip(overall["metric"], overall["median_error"], strict=True))
            frames.append(done.frame.assign(latency_model=model))
        if len(models) > 1:
            typer.echo("median error on the accuracy runs, by backend")
            typer.echo(f"{'metric':<20}" + "".join(f"{m:>18}" for m in models))
            for metric in medians[models[0]]:
                cells = "".join(
                    f"{100 * medians[m].get(metric, float('nan')):>17.1f}%" for m in models
                )
                typer.echo(f"{metric:<20}{cells}")
        frame = pd.concat(frames, ignore_index=True)
        if output is not None:
            write_with(output, lambda tmp: frame.to_csv(tmp, index=False))
            typer.echo(f"wrote {output}", err=True)
        typer.echo(f"wall time {time.perf_counter() - started_s:.1f} s", err=True)

    guarded(go)


def _echo_server_settings(done: Any, flag: bool | None, prompt_reuse: bool | None) -> None:
    """Stderr lines per dataset: the prefix-caching choice and where it came from, the
    prompts the replay reused (and why), and the batch limits taken from vLLM's defaults
    because the server's configuration omits them."""
    from ..validate import prompt_reuse_text
    from ..workload.server_settings import PrefixCaching

    runs = done.runs
    seen: dict[str, PrefixCaching] = {}
    for run in runs:
        if flag is not None:
            choice = PrefixCaching(flag, "--prefix-caching" if flag else "--no-prefix-caching")
        else:
            choice = PrefixCaching(run.prefix_caching, run.prefix_caching_source)
        seen.setdefault(run.dataset, choice)
    for dataset, choice in seen.items():
        typer.echo(f"{dataset}: {choice.line()}", err=True)
    why = {
        True: "--prompt-reuse",
        False: "--no-prompt-reuse",
        None: "the request files' prompt cycle; --no-prompt-reuse replays every prompt as new",
    }[prompt_reuse]
    for dataset, found in done.reused_prompts().items():
        counts = [n for n in found if n is not None]
        if counts:
            fresh = " (some runs: none found, every prompt new)" if None in found else ""
            line = f"prompt reuse: {prompt_reuse_text(counts)}{fresh} ({why})"
        elif prompt_reuse is False:
            line = "prompt reuse: off, every prompt replayed as new (--no-prompt-reuse)"
        else:
            line = "prompt reuse: no prompt cycle found, every prompt replayed as new"
        typer.echo(f"{dataset}: {line}", err=True)
    # Batch limits the dataset's server configuration does not record (vLLM's own defaults).
    defaulted: dict[str, tuple[tuple[str, int], ...]] = {}
    for run in runs:
        if run.vllm_default_settings:
            defaulted.setdefault(run.dataset, run.vllm_default_settings)
    for dataset, settings in defaulted.items():
        values = ", ".join(f"{name} {value:,}" for name, value in settings)
        typer.echo(
            f"{dataset}: {values} (not recorded: vLLM's default on the replayed GPU)", err=True
        )


def _echo_validation(done: Any, model: str) -> None:
    """The per-dataset tables, the overloaded runs, the load sweep and the summary."""
    from ..validate import (
        format_load,
        format_saturation,
        format_summary,
        format_table,
        saturation,
        summarize,
    )

    frame = done.frame
    # What each dataset's replay reused, so that saved output says how it was made.
    reused = done.reused_prompts()
    for dataset in dict.fromkeys(frame["dataset"]):
        part = frame[(frame["dataset"] == dataset) & ~frame["overloaded"]]
        if part.empty:
            continue
        counts = ", ".join(str(n) for n in sorted(reused.get(dataset, set()) - {None}))
        replay = f"; prompts reused: {counts} per run" if counts else ""
        typer.echo(f"{dataset}: {counted(part['run'].nunique(), 'run')} ({model}{replay})")
        typer.echo(format_table(part))
        typer.echo("")
    overloaded = frame[frame["overloaded"]]
    if not overloaded.empty:
        typer.echo(f"overloaded runs, kept out of the accuracy summary ({model})")
        for run in done.runs:
            if run.overloaded and run.name in set(overloaded["run"]):
                typer.echo(f"  {run.dataset} {run.name}: {run.overload_reason}")
        typer.echo(format_table(overloaded))
        typer.echo("")
    for dataset in dict.fromkeys(done.load["dataset"]):
        cells = done.load[done.load["dataset"] == dataset]
        typer.echo(f"{dataset}: load sweep, achieved throughput in req/s ({model})")
        typer.echo(format_load(cells))
        typer.echo(format_saturation(saturation(cells)))
        typer.echo("")
    warm_up = {o.get("warm_up_s", 0.0) for o in done.outcomes} - {0.0}
    after = f"; requests after the first {max(warm_up):g} s" if warm_up else ""
    typer.echo(f"summary ({model}; error = |predicted - measured| / measured{after})")
    typer.echo(format_summary(summarize(frame)))
    typer.echo("")


@app.command("report")
def report_cmd(
    source: Annotated[
        Path,
        typer.Argument(
            help="a saved result folder (Result.save), a sweep's --out folder, or a "
            "--results-path JSON file"
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="HTML file to write (default: report.html in the folder, or the JSON file's "
            "name with .html)",
        ),
    ] = None,
) -> None:
    """Write one self-contained HTML page for a run or a sweep.

    Charts and data are inside the page, which opens without a network (docs/report.md).
    """

    def go() -> None:
        from ..input_files import refuse_writing_inputs
        from ..report import default_output, load_input, write_report

        target = output if output is not None else default_output(source)
        check_writable("--output", target)
        # A report over its own data would destroy it; an earlier report in the folder is fine.
        refuse_writing_inputs([("--output", target)], [("the report's source", source)], (".html",))
        write_report(load_input(source), target)
        typer.echo(str(target))

    guarded(go)


def _register_extras() -> None:
    from .calibrate import register as register_calibrate
    from .convert import register as register_convert
    from .observe import register as register_observe
    from .plan import register as register_plan
    from .plot import register as register_plot
    from .sweep import register as register_sweep

    register_convert(convert_app)
    register_plot(app)
    register_sweep(app)
    register_plan(app)
    register_observe(app)
    register_calibrate(app)


_register_extras()


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The app that runs the command line `argv` (without the program name): when its first
    word names a command (or a command group such as `convert`), a copy of `app` holding that
    one alone; otherwise (`--help`, `--version`, a misspelt command, which must list or
    suggest the others) `app` itself. typer builds the options of every command it holds
    before parsing, from their signatures; one command instead of all of them is a visible
    part of a run's start-up (docs/performance.md, "Start-up")."""
    first = argv[0] if argv else ""
    if not first or first.startswith("-"):
        return app
    commands = [
        info
        for info in app.registered_commands
        if (info.name or get_command_name(info.callback.__name__)) == first
    ]
    groups = [info for info in app.registered_groups if info.name == first]
    if len(commands) + len(groups) != 1:
        return app
    narrowed = copy.copy(app)  # the lists are replaced, never changed: `app` stays whole
    narrowed.registered_commands = commands
    narrowed.registered_groups = groups
    return narrowed
