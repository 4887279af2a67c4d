"""`servesim plan`: capacity planning, registered onto the main typer app by `register(app)`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError
from .common import check_figure_format, check_writable, figure_format, guarded


def parse_assignments(values: list[str], flag: str, what: str) -> dict[str, float]:
    """`["name=1.5", ...]` -> {"name": 1.5}; ConfigError naming `flag` on bad syntax."""
    out: dict[str, float] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise ConfigError(f"{flag}: invalid value {item!r}; expected {what}")
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(
                f"{flag}: invalid value {item!r}; {raw!r} is not a number (expected {what})"
            ) from None
        if not math.isfinite(value):
            raise ConfigError(f"{flag}: invalid value {item!r}; the number must be finite")
        if name in out:
            raise ConfigError(
                f"{flag}: {name!r} is given twice ({out[name]:g} and {value:g}); once"
            )
        out[name] = value
    return out


# What plan's errors call its arguments here: the flags that give them (the Python API's
# errors name its keywords; until 2026-12-07 `--max-instances 0` said "max_instances: ...").
FLAGS = {
    "max_instances": "--max-instances",
    "min_goodput": "--min-goodput",
    "min_attainment": "--min-attainment",
    "prices": "--price",
    "workers": "--workers",
    "seeds": "--seeds",
    "gpus": "--gpu",
}


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(
            f"--seeds: invalid value {text!r}; expected comma-separated integers"
        ) from None


def _check_gpus(gpus: list[str] | None, sc: Any) -> None:
    """Each `--gpu` is a known GPU (the bundled catalog, or the scenario's hardware file), told
    as `--gpu: unknown GPU 'X'; valid: ...` as run's `--hardware` is; plan() checks them too,
    but its message cannot name the flag."""
    from ..catalog.hardware import get_gpu, load_gpu_file
    from ..errors import in_field

    if not gpus:
        return
    extra = load_gpu_file(sc.hardware_file) if sc.hardware_file else None
    with in_field(FLAGS["gpus"]):
        for name in gpus:
            get_gpu(name, extra)


def register(app: typer.Typer) -> None:
    """Add `plan SCENARIO --slo METRIC=BOUND ... [--min-goodput F] [--gpu G ...] ...`."""

    @app.command(
        "plan",
        help="Find the fewest instances per GPU type that meet the SLOs, and the cheapest."
        "\n\nEvery seed must meet the SLOs (the worst one decides); prints each probe and the "
        "cheapest choice.",
    )
    def plan_cmd(
        scenario: Annotated[Path, typer.Argument(help="scenario YAML to size")],
        slo: Annotated[
            list[str] | None,
            typer.Option("--slo", help="METRIC=UPPER_BOUND, e.g. ttft_p99_ms=500; repeatable"),
        ] = None,
        min_goodput: Annotated[
            float | None,
            typer.Option(
                "--min-goodput", help="minimum completed/injected fraction per seed, 0 to 1"
            ),
        ] = None,
        min_attainment: Annotated[
            float,
            typer.Option(
                "--min-attainment",
                help="minimum SLO attainment per seed: the fraction of offered requests "
                "meeting the per-request targets derived from --slo, 0 to 1",
            ),
        ] = 0.99,
        saturation_rate: Annotated[
            bool,
            typer.Option(
                "--saturation-rate",
                help="also find, per GPU, the largest request rate (req/s) one instance "
                "sustains while passing (bisection; about 6 more probes per GPU)",
                metavar="",  # a switch: it takes no value
            ),
        ] = False,
        gpu: Annotated[
            list[str] | None,
            typer.Option("--gpu", help="GPU type to consider; repeatable (default: scenario's)"),
        ] = None,
        seeds: Annotated[
            str, typer.Option("--seeds", help="comma-separated seeds; the worst one decides")
        ] = "1,2",
        max_instances: Annotated[
            int, typer.Option("--max-instances", help="largest instance count to try")
        ] = 64,
        workers: Annotated[
            int | None, typer.Option("--workers", help="worker processes (default: CPUs)")
        ] = None,
        price: Annotated[
            list[str] | None,
            typer.Option(
                "--price",
                help="GPU=USD per GPU-hour, e.g. H100=3; overrides the default table; repeatable",
            ),
        ] = None,
        quiet: Annotated[
            bool, typer.Option("--quiet", "-q", metavar="", help="no progress lines on stderr")
        ] = False,
        plot: Annotated[
            Path | None, typer.Option("--plot", help="write the frontier plot (PNG) here")
        ] = None,
        report: Annotated[
            Path | None,
            typer.Option("--report", help="write the plan's HTML report (one page) here"),
        ] = None,
    ) -> None:
        """Find the fewest instances per GPU type that meet the SLOs (help: above)."""

        def go() -> None:
            from ..api import as_scenario
            from ..input_files import refuse_writing_inputs, scenario_input_files
            from ..plan import (
                DEFAULT_PRICES_USD_PER_GPU_HOUR,
                MissingPriceError,
                check_min_attainment,
                plan,
            )

            check_writable("--plot", plot)
            check_writable("--report", report)
            check_figure_format("--plot", plot)
            sc = as_scenario(scenario)  # loaded once: for this check and for the plan
            refuse_writing_inputs(
                [("--plot", plot), ("--report", report)],
                scenario_input_files(sc.model_dump(), scenario),
            )
            slos = parse_assignments(slo or [], "--slo", "METRIC=BOUND, e.g. ttft_p99_ms=500")
            prices = parse_assignments(price or [], "--price", "GPU=USD_PER_HOUR, e.g. H100=3")
            check_min_attainment(min_attainment, FLAGS["min_attainment"])
            _check_gpus(gpu, sc)

            def progress(row: dict[str, Any]) -> None:
                verdict = "meets" if row["meets"] else "misses"
                typer.echo(f"[{row['gpu']}] {row['instances']} instance(s): {verdict}", err=True)

            try:
                result = plan(
                    sc,
                    slos,
                    gpus=gpu or None,
                    seeds=parse_seeds(seeds),
                    max_instances=max_instances,
                    min_goodput=min_goodput,
                    min_attainment=min_attainment,
                    saturation_rate=saturation_rate,
                    workers=workers,
                    prices=prices,
                    progress=None if quiet else progress,
                    names=FLAGS,
                )
            except MissingPriceError as exc:
                # The API's message gives the fix as a `prices=` argument; here it is a flag.
                raise ConfigError(
                    f"--price: no price for GPU {exc.gpu!r}, and the GPUs compared are ranked "
                    f"by price; pass --price {exc.gpu}=USD_PER_HOUR (priced by default: "
                    f"{', '.join(DEFAULT_PRICES_USD_PER_GPU_HOUR)})"
                ) from None
            for warning in result.warnings:
                typer.echo(f"warning: {warning}", err=True)
            typer.echo(result.table())
            if plot is not None:
                from ..atomic_io import write_with

                figure = result.plot()
                write_with(plot, lambda tmp: figure.savefig(tmp, format=figure_format(plot)))
                typer.echo(f"wrote {plot}", err=True)
            if report is not None:
                from ..report import write_report  # plotly loads only for a report

                write_report(result, report)
                typer.echo(f"wrote {report}", err=True)

        guarded(go)
