"""`servesim calibrate`: fit `physics` to measured runs, or report a simulation against a
real trace (docs/behaviour.md §12.2). Registered onto the main typer app by `register(app)`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError, counted, excerpt
from .common import PrefixCachingOverride, check_writable, guarded

# Exit status when --fail-if-no-improvement is given and no round beat the start (or the
# held-out runs got worse). Bad input is 2, a broken invariant 3 (common): 1 is the
# conventional "ran, but the answer is no".
NO_IMPROVEMENT_EXIT_CODE = 1
METRIC_LABELS = {
    "e2e_mean_ms": "E2E mean",
    "itl_ms": "ITL",
    "ttft_mean_ms": "TTFT mean",
    "ttft_p99_ms": "TTFT p99",
}


# Flags only a trace's replay reads, with why a ground-truth run (a request CSV) has no use
# for them: its deployment and client are recorded, so overriding them would fit the
# coefficients to another server than the one measured. Refused by name when the fit has no
# trace (they were silently ignored, with the same scores); with traces too, they apply to
# the traces only.
TRACE_ONLY_FLAGS = {
    "--scenario": "each run's deployment is recorded (its meta.json, one H100)",
    "--model": "each run's model is recorded (its meta.json)",
    "--hardware": "each run's GPU is recorded (one H100, the README's step 1)",
    "--tp": "each run's tensor parallelism is recorded (its meta.json)",
    "--total-kv-blocks": "each run's KV capacity is recorded (its meta.json)",
    "--max-num-seqs": "each run's batch limits are recorded (its meta.json)",
    "--max-num-batched-tokens": "each run's batch limits are recorded (its meta.json)",
    "--rtt-ms": "its request CSVs measured no round trip to add",
    "--network-bandwidth-mbps": "its request CSVs measured no network to add",
}
# Flags only a ground-truth run's replay reads, with why a trace has no use for them.
GROUNDTRUTH_ONLY_FLAGS = {
    "--include-overloaded": "a trace whose client fell behind is fitted on its ITL p50 "
    "(saturated cells), never skipped",
    "--prompt-reuse": "a trace records its own prompts",
    "--no-prompt-reuse": "a trace records its own prompts",
    "--reported-output-length": "a trace replays the output lengths its rows record",
}


def _pct(value: float, signed: bool = False) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def format_round(r: Any) -> str:
    """One line per replay (stderr): round, step, in-sample score and mean |error|s."""
    errors = r.mean_abs_errors()
    if r.round == 0:
        where = "round 0 (the start)"
    elif r.step == 1.0:
        where = f"round {r.round}, full step"
    else:
        where = f"round {r.round}, {r.step:.2f} of the step"
    figures = "  ".join(f"{METRIC_LABELS[m]} {_pct(v)}" for m, v in errors.items())
    kept = "  (kept)" if r.kept and r.round > 0 else ""
    return f"calibrate: {where}: score {r.score:.4g}  {figures}{kept}"


def _runs(n: int) -> str:
    return counted(n, "run")


def held_out_warning(result: Any) -> str | None:
    """The line that says, when it is so, that the held-out runs score worse with the fitted
    coefficients than with the start (a fit that does not carry beyond its runs)."""
    if not result.held_out_worse:
        return None
    from ..calibrate import score

    return (
        "calibrate: warning: the held-out runs score worse with the result than with the "
        f"start (score {score(result.start_held_out_scores):.4g} -> "
        f"{score(result.held_out_scores):.4g}): the fit improved the runs it saw but does "
        "not carry to these; the start may be the better choice"
    )


def format_summary(result: Any) -> str:
    """Per metric, the mean |error| over runs of the start and of the result, in-sample and
    held out side by side; then every run's signed errors (result, and start in brackets)."""
    from ..calibrate import FIT_METRICS, mean_abs_errors, score, signed_errors

    columns = [("in-sample", result.start_scores, result.scores)]
    if result.held_out:
        columns.append(("held-out", result.start_held_out_scores, result.held_out_scores))
    lines = [
        f"{'mean |error| per run':<22}"
        + "".join(f"{f'{label} ({_runs(len(now))})':>25}" for label, _, now in columns),
        f"{'':<22}" + "".join(f"{'start':>16}{'fitted':>9}" for _ in columns),
    ]
    means = [
        (mean_abs_errors(signed_errors(before)), mean_abs_errors(signed_errors(now)))
        for _, before, now in columns
    ]
    for m in FIT_METRICS:
        cells = "".join(f"{_pct(before[m]):>16}{_pct(now[m]):>9}" for before, now in means)
        lines.append(f"{METRIC_LABELS[m]:<22}{cells}")
    cells = "".join(f"{score(before):>16.4g}{score(now):>9.4g}" for _, before, now in columns)
    lines.append(f"{'score (soft-L1)':<22}{cells}")
    lines.append("")
    width = max(len(n) for n in [*result.scores, *result.held_out_scores, "run"]) + 2
    lines.append(
        f"{'run':<{width}}{'set':<10}" + "".join(f"{METRIC_LABELS[m]:>21}" for m in FIT_METRICS)
    )
    for label, start_scores, scores in (
        ("fitted", result.start_scores, result.scores),
        ("held-out", result.start_held_out_scores, result.held_out_scores),
    ):
        now, before = signed_errors(scores), signed_errors(start_scores)
        for name, errors in now.items():
            cells = "".join(
                f"{f'{_pct(errors[m], True)} ({_pct(before[name][m], True)})':>21}"
                for m in FIT_METRICS
            )
            lines.append(f"{name:<{width}}{label:<10}{cells}")
    lines.append(
        "(signed error of full replays: with the result, and with the start in brackets; "
        "held-out runs were never fitted on)"
    )
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add `calibrate [FOLDER] | --trace-header H --trace-data D [--sim-trace S] | --traces F`."""

    @app.command(
        "calibrate",
        help="Fit physics's coefficients to measured runs, or compare a simulated trace.\n\n"
        "Fits to a ground-truth folder or real traces and writes the coefficients for "
        "--latency-coeffs, scoring held-out runs side by side; with --sim-trace, only reports "
        "a simulation against the real trace (MAPE, Pearson r, percentiles, bias, quality).",
    )
    def calibrate_cmd(
        folder: Annotated[
            Path | None,
            typer.Argument(
                help="ground-truth folder to fit on (default: the repository's groundtruth/ "
                "folder), or a folder of trace cells (as --traces)"
            ),
        ] = None,
        runs: Annotated[
            list[str] | None,
            typer.Option("--runs", help="only runs whose name contains NAME (repeatable)"),
        ] = None,
        holdout: Annotated[
            list[str] | None,
            typer.Option(
                "--holdout",
                help="hold runs/cells whose name contains NAME out of the fit and score them "
                "separately (repeatable)",
            ),
        ] = None,
        include_overloaded: Annotated[
            bool,
            typer.Option("--include-overloaded", metavar="", help="also fit on overloaded runs"),
        ] = False,
        prompt_reuse: Annotated[
            bool | None,
            typer.Option(
                "--prompt-reuse/--no-prompt-reuse",
                metavar="",
                help="replay the load generator's repeated prompts, as validate does: default "
                "whenever the request file shows its prompt cycle (that is how the runs were "
                "measured); --prompt-reuse requires one, --no-prompt-reuse replays every "
                "prompt as new",
                show_default=False,
            ),
        ] = None,
        forced_output_length: Annotated[
            bool,
            typer.Option(
                "--forced-output-length/--reported-output-length",
                metavar="",
                help="replay the output length an ignore_eos profile forced (default), or "
                "the count the client reported, which undercounts (docs/accuracy.md)",
            ),
        ] = True,
        trace_header: Annotated[
            list[Path] | None,
            typer.Option("--trace-header", help="real TraceV2 header (YAML; repeatable)"),
        ] = None,
        trace_data: Annotated[
            list[Path] | None,
            typer.Option(
                "--trace-data", help="real TraceV2 data (CSV; repeatable, paired in order)"
            ),
        ] = None,
        traces: Annotated[
            list[Path] | None,
            typer.Option(
                "--traces",
                help="folder of trace cells: sub-folders with trace.yaml + trace.csv, or "
                "NAME.yaml + NAME.csv pairs (repeatable)",
            ),
        ] = None,
        warm_up_s: Annotated[
            float,
            typer.Option(
                "--warm-up-s",
                help="fit and score only the requests that arrived this many seconds or more "
                "after each run's or trace's first (a freshly started server's warm-up left "
                "out, as validate --warm-up-s); 0 uses every request",
            ),
        ] = 0.0,
        quiet: Annotated[
            bool,
            typer.Option(
                "--quiet",
                "-q",
                metavar="",
                help="no progress or note lines on stderr (the start, each round, the "
                "replay's settings, notes, 'wrote'); warnings and errors still go there",
            ),
        ] = False,
        sim_trace: Annotated[
            Path | None,
            typer.Option(
                "--sim-trace",
                help="simulated TraceV2 CSV of the same requests: report only, no fit",
            ),
        ] = None,
        scenario: Annotated[
            Path | None,
            typer.Option("--scenario", help="deployment to replay a trace on (scenario YAML)"),
        ] = None,
        model: Annotated[
            str | None,
            typer.Option("--model", help="model of a trace replay (default: the trace header's)"),
        ] = None,
        hardware: Annotated[
            str | None, typer.Option("--hardware", help="GPU type of a trace replay, e.g. H100")
        ] = None,
        tp: Annotated[
            int | None, typer.Option("--tp", help="tensor parallelism of a trace replay")
        ] = None,
        total_kv_blocks: Annotated[
            int | None,
            typer.Option("--total-kv-blocks", help="GPU KV-cache blocks per instance (replay)"),
        ] = None,
        max_num_running_reqs: Annotated[
            int | None,
            typer.Option(
                "--max-num-seqs",
                "--max-num-running-reqs",
                help="requests per batch, at most (replay; the second name is BLIS-Mar's)",
            ),
        ] = None,
        max_num_scheduled_tokens: Annotated[
            int | None,
            typer.Option(
                "--max-num-batched-tokens",
                "--max-num-scheduled-tokens",
                help="tokens per step, at most (replay; the second name is BLIS-Mar's)",
            ),
        ] = None,
        vllm_version: Annotated[
            str | None,
            typer.Option(
                "--vllm-version",
                help="vLLM version of the measured server (start lookup and provenance; "
                "default: recorded with the runs)",
            ),
        ] = None,
        prefix_caching: PrefixCachingOverride = None,
        start: Annotated[
            str | None,
            typer.Option(
                "--start",
                help="starting coefficients: 'shipped' (default: what the GPU uses "
                "uncalibrated), 'physical' (the physical defaults) or a coefficients FILE",
            ),
        ] = None,
        prior: Annotated[
            str,
            typer.Option(
                "--prior",
                help="centre the log-normal prior on the 'start' (default) or on the "
                "'physical' defaults",
            ),
        ] = "start",
        rounds: Annotated[
            int,
            typer.Option(
                "--rounds",
                help="at most this many replay-and-fit rounds (default 6; a round that "
                "does not improve ends the fit)",
            ),
        ] = 6,
        fail_if_no_improvement: Annotated[
            bool,
            typer.Option(
                "--fail-if-no-improvement",
                metavar="",
                help=f"exit with status {NO_IMPROVEMENT_EXIT_CODE} when no round improves on "
                "the start, or when held-out runs score worse with the result than with the "
                "start (the result is still printed and written)",
            ),
        ] = False,
        output: Annotated[
            Path | None, typer.Option("--output", help="write the fitted coefficients (YAML)")
        ] = None,
        workers: Annotated[
            int, typer.Option("--workers", help="processes replaying runs in parallel")
        ] = 1,
        rtt_ms: Annotated[
            float | None,
            typer.Option("--rtt-ms", help="network round trip, ms (default: the trace header's)"),
        ] = None,
        network_bandwidth_mbps: Annotated[
            float,
            typer.Option(
                "--network-bandwidth-mbps", help="network bandwidth, Mbit/s (0 = no transfer delay)"
            ),
        ] = 0.0,
    ) -> None:
        """Fit physics's coefficients, or compare a simulated trace (help: above)."""
        not_improved: list[bool] = []  # a fit that kept the start or worsened held-out runs

        def go() -> None:
            from .. import calibrate as cal
            from ..calibration_report import calibration_report, format_report

            headers, datas = list(trace_header or []), list(trace_data or [])
            if len(headers) != len(datas):
                raise ConfigError(
                    f"--trace-header/--trace-data: must be given together, in pairs "
                    f"({len(headers)} headers, {len(datas)} data files)"
                )
            from ..calibration_report import check_network
            from ..latency.physics import version_key
            from ..validate import check_warm_up_s

            check_warm_up_s(warm_up_s, "--warm-up-s")
            check_network(rtt_ms, network_bandwidth_mbps)
            if vllm_version is not None:
                version_key(vllm_version, "--vllm-version")
            # The deployment flags given: a trace's replay reads them, a recorded ground-truth
            # run and a --sim-trace report do not.
            deployment_given = {
                "--scenario": scenario is not None,
                "--model": model is not None,
                "--hardware": hardware is not None,
                "--tp": tp is not None,
                "--total-kv-blocks": total_kv_blocks is not None,
                "--max-num-seqs": max_num_running_reqs is not None,
                "--max-num-batched-tokens": max_num_scheduled_tokens is not None,
            }
            if sim_trace is not None:
                if len(headers) != 1:
                    raise ConfigError(
                        "--sim-trace: needs exactly one real --trace-header/--trace-data pair"
                    )
                # The report compares two recordings: a flag of the fit would be ignored.
                fit_only = {
                    "FOLDER": folder is not None,
                    "--runs": bool(runs),
                    "--holdout": bool(holdout),
                    "--traces": bool(traces),
                    "--include-overloaded": include_overloaded,
                    "--prompt-reuse/--no-prompt-reuse": prompt_reuse is not None,
                    "--reported-output-length": not forced_output_length,
                    **deployment_given,
                    "--vllm-version": vllm_version is not None,
                    "--prefix-caching/--no-prefix-caching": prefix_caching is not None,
                    "--start": start is not None,
                    "--prior": prior != cal.PRIOR_AT_START,
                    "--rounds": rounds != cal.DEFAULT_ROUNDS,
                    "--fail-if-no-improvement": fail_if_no_improvement,
                    "--output": output is not None,
                    "--workers": workers != 1,
                }
                given = [flag for flag, is_given in fit_only.items() if is_given]
                if given:
                    raise ConfigError(
                        f"{given[0]}: does not apply with --sim-trace (a report of two "
                        "recorded traces, no fit); drop it, or drop --sim-trace to fit"
                    )
                report = calibration_report(
                    headers[0], datas[0], sim_trace, rtt_ms, network_bandwidth_mbps, warm_up_s
                )
                typer.echo(format_report(report))
                return
            check_writable("--output", output)
            from ..input_files import refuse_writing_inputs

            named_starts = (None, cal.START_SHIPPED, cal.START_PHYSICAL)
            refuse_writing_inputs(
                [("--output", output)],
                [
                    ("the ground-truth folder", folder),
                    *(("a --trace-header file", h) for h in headers),
                    *(("a --trace-data file", d) for d in datas),
                    ("the --start file", None if start in named_starts else start),
                ],
            )
            if rounds < 0:
                raise ConfigError(f"--rounds: invalid value {rounds}; must be an integer >= 0")
            if workers < 1:
                raise ConfigError(f"--workers: invalid value {workers}; must be an integer >= 1")
            if prior not in cal.PRIOR_CENTRES:
                raise ConfigError(
                    f"--prior: invalid value {excerpt(prior)}; must be one of "
                    + ", ".join(cal.PRIOR_CENTRES)
                )
            if start is not None and start not in named_starts:
                from ..latency.physics import load_coefficients_file

                try:  # read now: before the runs load and replay, and naming the flag
                    load_coefficients_file(start)
                except ConfigError as exc:
                    raise ConfigError(
                        f"--start: invalid value {excerpt(str(start))}; must be one of "
                        f"{cal.START_SHIPPED}, {cal.START_PHYSICAL} or a coefficients FILE ({exc})"
                    ) from None
            flags = {
                "model": model,
                "hardware": hardware,
                "tp": tp,
                "engine__total_kv_blocks": total_kv_blocks,
                "engine__max_num_running_reqs": max_num_running_reqs,
                "engine__max_num_scheduled_tokens": max_num_scheduled_tokens,
                "engine__enable_prefix_caching": prefix_caching,
                "rtt_ms": rtt_ms,
                "network_bandwidth_mbps": network_bandwidth_mbps,
            }
            trace_folders = list(traces or [])
            groundtruth = folder
            if folder is not None and cal.is_trace_folder(folder):
                trace_folders.insert(0, folder)
                groundtruth = None
            elif folder is None and not headers and not trace_folders:
                from ..validate import default_groundtruth

                groundtruth = default_groundtruth("calibrate")
            _refuse_unread_flags(
                groundtruth is not None,
                bool(headers or trace_folders),
                {
                    **deployment_given,
                    "--rtt-ms": rtt_ms is not None,
                    "--network-bandwidth-mbps": network_bandwidth_mbps != 0,
                    "--include-overloaded": include_overloaded,
                    "--prompt-reuse": prompt_reuse is True,
                    "--no-prompt-reuse": prompt_reuse is False,
                    "--reported-output-length": not forced_output_length,
                },
                quiet,
            )
            cases = [
                cal.trace_case(
                    h, d, scenario, vllm_version=vllm_version, warm_up_s=warm_up_s, **flags
                )
                for h, d in zip(headers, datas, strict=True)
            ]
            for where in trace_folders:
                cases.extend(cal.trace_cases(where, scenario, warm_up_s=warm_up_s, **flags))
            _name_apart(cases)
            cases = _select(cases, runs, groundtruth is not None)
            about: dict[str, Any] = {}
            if headers:
                about["trace"] = [str(d) for d in datas] if len(datas) > 1 else str(datas[0])
            if trace_folders:
                about["traces"] = [str(f) for f in trace_folders]
            if warm_up_s > 0:
                about["warm_up_s"] = warm_up_s
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                if groundtruth is not None:
                    from ..validate import discover_runs

                    specs = discover_runs(
                        groundtruth, forced_output_length, trace_pairs_too=folder is not None
                    )
                    if not quiet:
                        _note_cells_left_out(groundtruth)
                    specs = [s for s in specs if include_overloaded or not s.overloaded]
                    # Names are checked against every run there is, before the replays.
                    _select([*cases, *specs], runs, False)
                    specs = [s for s in specs if not runs or any(w in s.name for w in runs)]
                    gt_cases = [
                        cal.groundtruth_case(s, prompt_reuse, Path(tmp), warm_up_s, prefix_caching)
                        for s in specs
                    ]
                    cases = _select([*cases, *gt_cases], runs, False)
                    about["groundtruth"] = str(groundtruth)
                    about["prompt_reuse"] = _echo_prompt_reuse(specs, prompt_reuse, quiet)
                if not cases:
                    raise ConfigError("calibrate: nothing to fit on (no runs selected)")
                # Bad names, and runs that measured nothing to fit, fail before a replay.
                fitted, held = cal.split_holdout(cases, holdout)
                cal.check_measurable(fitted)
                version = vllm_version or cal.common_version(cases)
                start_c, start_source = cal.resolve_start(start, cases, version)
                if not quiet:
                    typer.echo(f"calibrate: starting from {start_source}", err=True)
                if start_source.startswith("shipped"):
                    _echo_version_choice(cases, vllm_version, quiet)
                # Notes (not warnings): what was replayed and how, which --quiet drops.
                if not quiet:
                    _echo_prefix_caching(cases)
                    if (note := cal.not_streamed_note(cases)) is not None:
                        typer.echo(note, err=True)
                    if held and start_source.startswith("shipped"):
                        _note_dependent_holdout(cal, cases, held, version)
                result = cal.fit(
                    cases,
                    start=start_c,
                    rounds=rounds,
                    on_round=None if quiet else lambda r: typer.echo(format_round(r), err=True),
                    workers=workers,
                    holdout=holdout,
                    vllm_version=version,
                    start_source=start_source,
                    prior=prior,
                )
            best = max((r for r in result.history if r.kept), key=lambda r: r.round)
            if result.improved and not quiet:
                typer.echo(
                    f"calibrate: kept round {best.round} ({best.step:.2f} of its step): score "
                    f"{result.start_score:.4g} -> {result.score:.4g}"
                    + ("; a later round improved nothing, stopped" if result.stopped_early else ""),
                    err=True,
                )
            typer.echo(format_summary(result))
            typer.echo("coefficients:")
            for name, value in cal.coefficients_dict(result.coefficients).items():
                typer.echo(f"  {name}: {value:.6g}")
            if output is not None:
                cal.write_coefficients(output, result.document(**about))
            if rounds > 0 and not result.improved:
                what = "writing" if output is not None else "keeping"
                typer.echo(
                    "calibrate: no round improved on the starting coefficients "
                    f"(score {result.start_score:.4g}); {what} them unchanged",
                    err=True,
                )
                not_improved.append(True)
            elif rounds > 0 and (warning := held_out_warning(result)) is not None:
                typer.echo(warning, err=True)
                not_improved.append(True)
            if output is not None and not quiet:
                typer.echo(f"wrote {output}", err=True)
            # A recorded trace pair gets BLIS's report; a ground-truth run's replay trace was
            # made here (and is gone with its folder), so it has none.
            if len(cases) == 1 and cases[0].trace_header is not None and groundtruth is None:
                _report_one(cases[0], result, rtt_ms, network_bandwidth_mbps, warm_up_s)

        guarded(go)
        if not_improved and fail_if_no_improvement:
            raise typer.Exit(NO_IMPROVEMENT_EXIT_CODE)


def _refuse_unread_flags(
    groundtruth: bool, traces: bool, given: dict[str, bool], quiet: bool
) -> None:
    """A flag that none of the fit's inputs reads is an error naming it (it was ignored
    without a word); in a fit on both, one line says which flags apply to which part."""
    given_flags = [flag for flag, is_given in given.items() if is_given]
    for flag in given_flags:
        if flag in TRACE_ONLY_FLAGS and not traces:
            raise ConfigError(
                f"{flag}: not used with a ground-truth folder: {TRACE_ONLY_FLAGS[flag]}; it "
                "applies to traces (--trace-header/--trace-data, --traces or a FOLDER of "
                "trace cells)"
            )
        if flag in GROUNDTRUTH_ONLY_FLAGS and not groundtruth:
            raise ConfigError(
                f"{flag}: not used with traces: {GROUNDTRUTH_ONLY_FLAGS[flag]}; it applies "
                "to a ground-truth folder's request-CSV runs"
            )
    if groundtruth and traces and given_flags and not quiet:
        parts = []
        to_traces = [f for f in given_flags if f in TRACE_ONLY_FLAGS]
        to_runs = [f for f in given_flags if f in GROUNDTRUTH_ONLY_FLAGS]
        if to_traces:
            parts.append(
                f"{', '.join(to_traces)} apply to the traces only (each ground-truth run's "
                "deployment is recorded)"
            )
        if to_runs:
            parts.append(f"{', '.join(to_runs)} apply to the ground-truth runs only")
        typer.echo(f"calibrate: note: {'; '.join(parts)}", err=True)


def _note_dependent_holdout(cal: Any, cases: list, held: list, version: str | None) -> None:
    """Held-out runs of a model the shipped start was fitted on are not an independent test
    of a fit that starts there (the start already saw them): say so."""
    seen = cal.shipped_fit_models(cases, version)
    dependent = [c.name for c in held if seen is None or cal.model_key(c.model) in seen]
    if dependent:
        typer.echo(
            "calibrate: note: the shipped start was fitted on "
            + ("the models of" if seen is not None else "runs that may include")
            + f" held-out runs ({', '.join(dependent)}); their held-out scores are not "
            "independent of it (--start physical is)",
            err=True,
        )


def _select(cases: list, names: list[str] | None, more_to_come: bool) -> list:
    """The cases (or run specs: anything with a `name`) whose name contains one of `names`
    (all without names); a name that matches none is an error unless more are still to
    come."""
    if not names:
        return cases
    if not more_to_come:
        for wanted in names:
            if not any(wanted in c.name for c in cases):
                available = ", ".join(c.name for c in cases) or "none"
                raise ConfigError(
                    f"--runs: no run matches {excerpt(wanted)}; available: {available}"
                )
    return [c for c in cases if any(wanted in c.name for wanted in names)]


def _name_apart(cases: list) -> None:
    """Trace pairs named alike (two folders' trace.csv of one name) get as many of their
    folders' names in front as tell them apart, so every run keeps a distinct name in the
    output and the provenance; one pair given twice is an error naming it."""
    groups: dict[str, list] = {}
    for case in cases:
        if case.trace_data is not None:
            groups.setdefault(case.name, []).append(case)
    for name, alike in groups.items():
        if len(alike) < 2:
            continue
        paths = [Path(c.trace_data).resolve() for c in alike]
        twice = next((p for p in paths if paths.count(p) > 1), None)
        if twice is not None:
            raise ConfigError(f"--trace-data: {str(twice)!r} is given twice (as run {name!r})")
        # A cell's trace.csv is named after its folder already: start above it.
        folders = [p.parent.parts[:-1] if p.parent.name == name else p.parent.parts for p in paths]
        depth = 1
        while len({f[-depth:] for f in folders}) < len(folders):
            depth += 1
        for case, folder in zip(alike, folders, strict=True):
            case.name = "/".join([*folder[-depth:], name])


def _note_cells_left_out(groundtruth: Path) -> None:
    """A ground-truth folder fit reads the request-CSV runs only: say which observe cells
    under it are left out (another vLLM's server, fitted apart with --traces)."""
    from ..validate import trace_datasets

    for dataset, cells in trace_datasets(groundtruth):
        typer.echo(
            f"calibrate: note: {counted(len(cells), 'observe cell')} under {str(dataset)!r} "
            f"left out (a ground-truth folder fit reads request-CSV runs); fit them with "
            f"--traces {str(dataset)!r}",
            err=True,
        )


def _echo_prefix_caching(cases: list) -> None:
    """Stderr: the prefix-caching choice of the replays and where it came from, once per
    distinct choice (as validate and replay print it)."""
    by_choice: dict[str, list[str]] = {}
    for case in cases:
        by_choice.setdefault(case.prefix_caching, []).append(case.name)
    for choice, names in by_choice.items():
        which = "" if len(by_choice) == 1 else f" ({', '.join(names)})"
        typer.echo(f"calibrate: {choice}{which}", err=True)


def _echo_version_choice(cases: list, flag: str | None, quiet: bool) -> None:
    """Stderr: which vLLM version chose the shipped start and why (not with --quiet); a
    warning when no single version is known (the newest fit is then a guess)."""
    versions = sorted({c.vllm_version or "unknown" for c in cases})
    if flag is not None or (len(versions) == 1 and versions[0] != "unknown"):
        if not quiet:
            why = "--vllm-version" if flag is not None else "recorded with the runs"
            typer.echo(f"calibrate: vLLM version {flag or versions[0]} ({why})", err=True)
        return
    what = (
        "no vLLM version is recorded with the runs"
        if versions == ["unknown"]
        else f"the runs record several vLLM versions ({', '.join(versions)})"
    )
    typer.echo(
        f"calibrate: warning: {what}; the shipped start is the newest fit (--vllm-version chooses)",
        err=True,
    )


def _report_one(
    case: Any, result: Any, rtt_ms: float | None, bandwidth: float, warm_up_s: float = 0.0
) -> None:
    """BLIS's calibration report of the one fitted trace, replayed with the result (it needs
    a real recording: `mode: real`)."""
    from .. import calibrate as cal
    from ..calibration_report import calibration_report, format_report
    from ..workload.trace import read_header

    if read_header(case.trace_header).get("mode", "generated") != "real":
        typer.echo(
            "calibrate: no calibration report: the trace header's mode is not 'real'", err=True
        )
        return
    replayed = cal.replay_case(case, result.coefficients)
    report = calibration_report(
        case.trace_header, case.trace_data, replayed, rtt_ms, bandwidth, warm_up_s
    )
    typer.echo(format_report(report))


def _echo_prompt_reuse(specs: list, prompt_reuse: bool | None, quiet: bool = False) -> str:
    """Say on stderr how the ground-truth runs' prompts were replayed (not with --quiet; the
    file records the same words)."""
    from ..validate import prompt_reuse_text, reused_prompts

    reused = [reused_prompts(spec, prompt_reuse) for spec in specs]
    counts = {n for n in reused if n is not None}
    if counts:
        fresh = reused.count(None)
        rest = ""
        if fresh:
            rest = f"; {counted(fresh, 'run')} with no cycle replay every prompt as new"
        line = prompt_reuse_text(counts) + rest
    else:
        line = "none, every prompt replayed as new"
    if not quiet:
        typer.echo(f"calibrate: prompt reuse: {line}", err=True)
    return line
