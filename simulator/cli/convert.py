"""`servesim convert servegen` and `servesim convert inference-perf`: other workload forms
as v2 specs on stdout (docs/workloads.md, "Converters"). `convert preset` lives in commands.py.

Each prints a spec that `servesim run --workload-spec` runs unchanged and that generates
exactly the requests the source would (the round-trip tests check it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import guarded


def register(convert_app: typer.Typer) -> None:
    @convert_app.command("servegen")
    def convert_servegen(
        path: Annotated[
            Path, typer.Option("--path", help="ServeGen data folder (chunk-*-trace.csv, ...)")
        ],
        time: Annotated[
            str | None,
            typer.Option("--time", help="keep one period: midnight | morning | afternoon"),
        ] = None,
        window_duration_seconds: Annotated[
            int,
            typer.Option("--window-duration-seconds", help="length of each period, s"),
        ] = 600,
        drain_timeout_seconds: Annotated[
            int,
            typer.Option(
                "--drain-timeout-seconds", help="gap between periods without new requests, s"
            ),
        ] = 180,
        seed: Annotated[
            int, typer.Option("--seed", help="seed of the window picks and the spec")
        ] = 42,
        num_requests: Annotated[
            int | None,
            typer.Option(
                "--num-requests",
                help="requests in the spec, at most (periods end by themselves; required "
                "with --single-span)",
            ),
        ] = None,
        single_span: Annotated[
            bool,
            typer.Option(
                "--single-span/--periods",
                metavar="",
                help="BLIS-Mar's form, one client per chunk over the whole trace, or current "
                "BLIS's periods as cohorts (default)",
            ),
        ] = False,
    ) -> None:
        """Print a ServeGen data folder as a v2 spec.

        Current BLIS's midnight, morning and afternoon periods become cohorts per SLO class
        (with --single-span, BLIS-Mar's clients).
        """

        def go() -> None:
            from ..workload.convert import servegen_spec
            from ..workload.presets import spec_to_yaml

            spec = servegen_spec(
                path,
                seed=seed,
                window_s=window_duration_seconds,
                drain_s=drain_timeout_seconds,
                time_window=time or "",
                single_span=single_span,
                num_requests=num_requests,
            )
            typer.echo(spec_to_yaml(spec), nl=False)

        guarded(go)

    @convert_app.command("inference-perf")
    def convert_inference_perf(
        spec: Annotated[
            Path,
            typer.Option("--spec", help="v2 workload YAML with an inference_perf section"),
        ],
    ) -> None:
        """Print an inference-perf workload as a v2 spec of plain clients.

        Stages, shared prefixes and multi-turn chat are carried over.
        """

        def go() -> None:
            from ..workload.convert import inference_perf_spec
            from ..workload.presets import spec_to_yaml

            typer.echo(spec_to_yaml(inference_perf_spec(spec)), nl=False)

        guarded(go)
