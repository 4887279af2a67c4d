"""`servesim calibrate`: fit `physics` to measured runs, or report a simulation against a
real trace (SPEC §12.2). Registered onto the main typer app by `register(app)`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .errors import ConfigError


def _print_fit(result: Any) -> None:
    from .calibrate import FIT_METRICS

    typer.echo(f"{'run':<46}" + "".join(f"{m:>15}" for m in FIT_METRICS))
    for name, s in result.scores.items():
        cells = "".join(f"{s['predicted'][m] / s['measured'][m] - 1:>+15.1%}" for m in FIT_METRICS)
        typer.echo(f"{name:<46}{cells}")
    typer.echo("(signed error of a full replay with the fitted coefficients; in-sample)")


def register(app: typer.Typer) -> None:
    """Add `calibrate [FOLDER] | --trace-header H --trace-data D [--sim-trace S]`."""

    @app.command("calibrate")
    def calibrate_cmd(
        folder: Annotated[
            Path | None,
            typer.Argument(help="ground-truth folder to fit on (default ../shared/groundtruth)"),
        ] = None,
        runs: Annotated[
            list[str] | None,
            typer.Option("--runs", help="only runs whose name contains NAME (repeatable)"),
        ] = None,
        include_overloaded: Annotated[
            bool, typer.Option("--include-overloaded", help="also fit on overloaded runs")
        ] = False,
        prompt_reuse: Annotated[
            bool,
            typer.Option(
                "--prompt-reuse/--no-prompt-reuse",
                help="replay the load generator's repeated prompts with prefix caching "
                "(default on: that is how the runs were measured)",
            ),
        ] = True,
        forced_output_length: Annotated[
            bool,
            typer.Option(
                "--forced-output-length/--reported-output-length",
                help="replay the output length an ignore_eos profile forced (default), or "
                "the count the client reported, which undercounts (docs/accuracy.md)",
            ),
        ] = True,
        trace_header: Annotated[
            Path | None, typer.Option("--trace-header", help="real TraceV2 header (YAML)")
        ] = None,
        trace_data: Annotated[
            Path | None, typer.Option("--trace-data", help="real TraceV2 data (CSV)")
        ] = None,
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
        model: Annotated[str | None, typer.Option("--model")] = None,
        hardware: Annotated[str | None, typer.Option("--hardware")] = None,
        tp: Annotated[int | None, typer.Option("--tp")] = None,
        total_kv_blocks: Annotated[int | None, typer.Option("--total-kv-blocks")] = None,
        max_num_running_reqs: Annotated[int | None, typer.Option("--max-num-running-reqs")] = None,
        max_num_scheduled_tokens: Annotated[
            int | None, typer.Option("--max-num-scheduled-tokens")
        ] = None,
        rounds: Annotated[
            int, typer.Option("--rounds", help="replay-and-fit rounds (default 3)")
        ] = 3,
        output: Annotated[
            Path | None, typer.Option("--output", help="write the fitted coefficients (YAML)")
        ] = None,
        workers: Annotated[
            int, typer.Option("--workers", help="processes replaying runs in parallel")
        ] = 1,
        rtt_ms: Annotated[
            float | None, typer.Option("--rtt-ms", help="round trip (default: trace header)")
        ] = None,
        network_bandwidth_mbps: Annotated[
            float, typer.Option("--network-bandwidth-mbps", help="0 = no transfer delay")
        ] = 0.0,
    ) -> None:
        """Fit physics's coefficients to measured runs (a ground-truth folder or a real trace)
        and write them for --latency-coeffs; with --sim-trace, only report a simulation
        against the real trace (MAPE, Pearson r, percentiles, bias, quality)."""
        from .cli_app import _check_writable, _guarded

        def go() -> None:
            from . import calibrate as cal
            from .calibration_report import calibration_report, format_report

            if (trace_header is None) != (trace_data is None):
                raise ConfigError("--trace-header/--trace-data: must be given together")
            if sim_trace is not None:
                if trace_header is None:
                    raise ConfigError("--sim-trace: needs the real --trace-header/--trace-data")
                report = calibration_report(
                    trace_header, trace_data, sim_trace, rtt_ms, network_bandwidth_mbps
                )
                typer.echo(format_report(report))
                return
            _check_writable("--output", output)
            progress = lambda i, c: typer.echo(f"round {i}/{rounds} done", err=True)  # noqa: E731
            if trace_header is not None:
                flags = {
                    "model": model,
                    "hardware": hardware,
                    "tp": tp,
                    "engine__total_kv_blocks": total_kv_blocks,
                    "engine__max_num_running_reqs": max_num_running_reqs,
                    "engine__max_num_scheduled_tokens": max_num_scheduled_tokens,
                }
                case = cal.trace_case(trace_header, trace_data, scenario, **flags)
                result = cal.fit([case], rounds=rounds, on_round=progress, workers=workers)
                _print_fit(result)
                replayed = cal.replay_case(case, result.coefficients)
                report = calibration_report(
                    trace_header, trace_data, replayed, rtt_ms, network_bandwidth_mbps
                )
                typer.echo(format_report(report))
                about = {"trace": str(trace_data)}
            else:
                from .validate import discover_runs, select_runs

                where = folder
                if where is None:
                    where = Path.cwd().parent / "shared" / "groundtruth"
                    if not where.is_dir():
                        raise ConfigError(
                            f"calibrate: no ground truth at {str(where)!r}; pass FOLDER"
                        )
                specs = select_runs(discover_runs(where, forced_output_length), runs)
                specs = [s for s in specs if include_overloaded or not s.overloaded]
                import tempfile

                with tempfile.TemporaryDirectory() as tmp:
                    result = cal.fit(
                        [cal.groundtruth_case(s, prompt_reuse, Path(tmp)) for s in specs],
                        rounds=rounds,
                        on_round=progress,
                        workers=workers,
                    )
                _print_fit(result)
                about = {"groundtruth": str(where)}
            typer.echo("coefficients:")
            for name, value in cal.coefficients_dict(result.coefficients).items():
                typer.echo(f"  {name}: {value:.6g}")
            if output is not None:
                cal.write_coefficients(output, result.document(**about))
                typer.echo(f"wrote {output}", err=True)

        _guarded(go)
