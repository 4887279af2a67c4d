"""`servesim observe`: measure a real OpenAI-compatible server with a servesim workload and
record a TraceV2 pair; registered onto the main typer app by `register(app)`."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError
from ..interruption import Interrupted, active_stop, signal_of
from .common import (
    LOG_HELP,
    check_writable,
    guarded,
    refuse_shared_outputs,
    setup_logging,
    stderr_console,
)
from .flags import naming_flags, with_flags, workload_flags, workload_overrides

_SRV = "Server"
_REC = "Recording"


def _opt(flag: str | tuple[str, ...], panel: str, help: str) -> typer.models.OptionInfo:  # noqa: A002
    names = (flag,) if isinstance(flag, str) else flag
    switch = "/" in names[0] or names[0] in SWITCHES
    return typer.Option(*names, help=help, rich_help_panel=panel, metavar="" if switch else None)


# Plain on switches (no --no- form), shown without a value placeholder.
SWITCHES = ("--quiet", "--unconstrained-output", "--record-itl")


def chunk_times_path(trace_data: Path) -> Path:
    """Where `--record-itl` writes per-chunk times: beside the trace data, `.itl.csv`."""
    return trace_data.with_name(trace_data.stem + ".itl.csv")


def _observe_flags(
    server_url: Annotated[
        str, _opt("--server-url", _SRV, "server's base URL, e.g. http://localhost:8000")
    ],
    model: Annotated[str, _opt("--model", _SRV, "model name the server serves")],
    trace_header: Annotated[Path, _opt("--trace-header", _REC, "TraceV2 header YAML to write")],
    trace_data: Annotated[Path, _opt("--trace-data", _REC, "TraceV2 CSV to write")],
    api_format: Annotated[str, _opt("--api-format", _SRV, "completions | chat")] = "completions",
    api_key: Annotated[str | None, _opt("--api-key", _SRV, "Bearer token")] = None,
    server_type: Annotated[
        str, _opt("--server-type", _SRV, "recorded in the header (vllm, sglang, ...)")
    ] = "vllm",
    max_concurrency: Annotated[
        int, _opt("--max-concurrency", _SRV, "requests in flight, at most")
    ] = 256,
    streaming: Annotated[
        bool,
        _opt(
            "--streaming/--no-streaming",
            _SRV,
            "stream the responses, or get one JSON response per request (TTFT unmeasured)",
        ),
    ] = True,
    unconstrained_output: Annotated[
        bool,
        _opt("--unconstrained-output", _SRV, "output length is only a cap (no min_tokens)"),
    ] = False,
    request_timeout_s: Annotated[
        float, _opt("--request-timeout-s", _SRV, "deadline of requests without one, s")
    ] = 300.0,
    warmup_requests: Annotated[
        int, _opt("--warmup-requests", _REC, "this many first requests are warm-up (header)")
    ] = 0,
    rtt_ms: Annotated[
        float | None, _opt("--rtt-ms", _REC, "network round trip to record, ms (default: measured)")
    ] = None,
    record_itl: Annotated[
        bool, _opt("--record-itl", _REC, "also write per-chunk times to DATA.itl.csv")
    ] = False,
    seed: Annotated[
        int | None, _opt("--seed", "Workload", "random seed of the workload (default 42)")
    ] = None,
    horizon: Annotated[
        int | None, _opt("--horizon", "Workload", "end of arrivals, µs after the start")
    ] = None,
    quiet: Annotated[bool, _opt(("--quiet", "-q"), _REC, "no progress display")] = False,
    log: Annotated[str, _opt("--log", _REC, LOG_HELP)] = "warning",
) -> None:
    """Template: the flags of `observe` besides the traffic flags."""


def _progress_display():
    """A live line on stderr (terminals only): sent, finished by status, in flight."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        transient=True,
        console=stderr_console(),
    )
    task = bar.add_task("connecting", start=True)

    def report(counts: dict[str, int]) -> None:
        bar.update(
            task,
            description=(
                f"sent {counts['sent']:,}: {counts['ok']:,} ok, {counts['error']:,} error, "
                f"{counts['timeout']:,} timeout, {counts['in_flight']:,} in flight"
            ),
        )

    return bar, report


def _overrides(flags: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scenario overrides and synthetic-workload overrides the flags given set."""
    workload = workload_overrides(flags)
    overrides: dict[str, Any] = {}
    if flags.get("workload_spec") is not None:
        overrides["workload_spec"] = flags["workload_spec"]
    if flags.get("seed") is not None:
        overrides["seed"] = flags["seed"]
    if flags.get("horizon") is not None:
        overrides["horizon_us"] = flags["horizon"]
    return overrides, workload


def _scenario(flags: dict[str, Any]):
    from ..api import with_overrides
    from ..scenario import Scenario

    overrides, workload = _overrides(flags)
    if flags.get("workload_spec") is None and not workload:
        raise ConfigError(
            "observe: no workload; give --workload-spec FILE, --workload PRESET or --rate R "
            "(with --num-requests N and the length flags)"
        )
    # As run's: a refused value names the flag the user typed (`--num-requests
    # (workload.num_requests): ...`), not only the scenario field it sets.
    with naming_flags(overrides, workload):
        return with_overrides(Scenario(), overrides, workload)


def register(app: typer.Typer) -> None:
    """Add `observe --server-url URL --model M --trace-header H --trace-data D [traffic]`."""

    @app.command(
        "observe",
        help="Measure a real OpenAI-compatible server and record a TraceV2 pair.\n\nSends the "
        "workload at its scheduled arrival times and records every request as a TraceV2 pair, "
        "for replay and calibrate.",
    )
    @with_flags(_observe_flags, workload_flags)
    def observe_cmd(**flags: Any) -> None:
        """Measure a real server and record a TraceV2 pair (help: above)."""
        exit_status = 0

        def go() -> None:
            nonlocal exit_status
            from ..input_files import scenario_input_files
            from ..observe import observe
            from ..observe.observation import refuse_nested_outputs

            setup_logging(flags["log"])
            header_path, data_path = flags["trace_header"], flags["trace_data"]
            check_writable("--trace-header", header_path)
            check_writable("--trace-data", data_path)
            itl_path = chunk_times_path(data_path) if flags["record_itl"] else None
            check_writable("--record-itl", itl_path)
            sc = _scenario(flags)
            outputs = [
                ("--trace-header", header_path),
                ("--trace-data", data_path),
                ("--record-itl (DATA.itl.csv)", itl_path),
            ]
            refuse_shared_outputs(outputs, inputs=scenario_input_files(sc.model_dump()))
            # Refused before anything is sent: found when writing, it would lose the run.
            refuse_nested_outputs(outputs)
            options = {
                "api_format": flags["api_format"],
                "api_key": flags["api_key"],
                "server_type": flags["server_type"],
                "max_concurrency": flags["max_concurrency"],
                "streaming": flags["streaming"],
                "force_output": not flags["unconstrained_output"],
                "request_timeout_s": flags["request_timeout_s"],
                "warmup_requests": flags["warmup_requests"],
                "rtt_ms": flags["rtt_ms"],
                "record_itl": flags["record_itl"],
            }
            if flags.get("workload_spec") is not None:
                options["workload_description"] = str(flags["workload_spec"])
            show = not flags["quiet"] and sys.stderr.isatty()
            bar, report = _progress_display() if show else (None, None)
            if bar is not None:
                bar.start()
            try:
                # The traffic is built in observe() (a preset resolves there), before anything
                # is sent: its checks name the flags too, as run's do in simulate.
                with naming_flags(*_overrides(flags)):
                    observation = observe(
                        sc,
                        server_url=flags["server_url"],
                        model=flags["model"],
                        progress=report,
                        **options,
                    )
            except KeyboardInterrupt as exc:
                # observe() keeps what it measured once a request was started (SIGINT and
                # SIGTERM alike); an interrupt that reaches here came before any request.
                lost = "no request was sent; nothing written"
                raise Interrupted(signal_of(exc), lost) from None
            finally:
                if bar is not None:
                    bar.stop()
            for path in observation.write_trace(header_path, data_path, itl_path):
                typer.echo(f"wrote {path}", err=True)
            typer.echo(observation.summary_text())
            if observation.interrupted:
                # The summary's last line says so; the entry point must not say it again.
                stop = active_stop()
                if stop is not None:
                    stop.reported = True
                # 128 + the signal (130 SIGINT, 143 SIGTERM), the shell's convention.
                exit_status = 128 + (observation.signal_number or signal.SIGINT)

        guarded(go)
        if exit_status:
            raise typer.Exit(exit_status)
