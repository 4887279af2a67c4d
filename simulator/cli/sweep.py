"""`servesim sweep`: run a sweep file, registered onto the main typer app by `register(app)`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import check_writable, guarded

if TYPE_CHECKING:
    from ..sweeps import SweepResult

# Metrics shown in the printed table, each when the sweep has it (every metric is in
# points.csv with --out).
HEADLINE_METRICS = (
    "responses_per_sec",
    "tokens_per_sec",
    "ttft_mean_ms",
    "ttft_p99_ms",
    "itl_mean_ms",
    "itl_p99_ms",
    "e2e_mean_ms",
    "e2e_p99_ms",
    "goodput_rps",
    "slo_attainment",
)
# Per-point counts shown after n_seeds when present (seeds whose run reached a steady state).
COUNT_COLUMNS = ("steady_seeds",)


def _num(x: float, digits: int) -> str:
    """`digits` significant digits, without switching to exponent notation for large values;
    a statistic of no samples (NaN) as "-", as the plan's tables show it."""
    if x != x:
        return "-"
    return f"{x:.0f}" if abs(x) >= 10**digits else f"{x:.{digits}g}"


def _param(value: Any) -> str:
    """A grid value as printed: a null grid value (None, NaN in a numeric column) is the
    scenario's default; a whole float that shares its column with a null, an integer."""
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "default"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def format_points_table(result: SweepResult) -> str:
    """One line per point: its parameters, the seed count, the steady-seed count and
    `mean ± ci95` of the headline metrics."""
    import math

    pts = result.points
    metrics = [m for m in HEADLINE_METRICS if f"{m}_mean" in pts.columns]
    counts = [c for c in COUNT_COLUMNS if c in pts.columns]
    header = ["point", *result.params, "n_seeds", *counts, *metrics]
    rows: list[list[str]] = []
    for row in pts.to_dict("records"):
        cells = [str(row["point"]), *(_param(row[p]) for p in result.params)]
        cells += [str(row["n_seeds"]), *(str(int(row[c])) for c in counts)]
        for m in metrics:
            mean, half = row[f"{m}_mean"], row[f"{m}_ci95"]
            cells.append(
                _num(mean, 4) if math.isnan(half) else f"{_num(mean, 4)} ± {_num(half, 2)}"
            )
        rows.append(cells)
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add `sweep SWEEP_YAML [--workers N] [--out DIR] [--quiet]` to `app`."""

    @app.command("sweep")
    def sweep_cmd(
        sweep_yaml: Annotated[Path, typer.Argument(help="sweep file: base, grid, seeds, workers")],
        workers: Annotated[
            int | None,
            typer.Option("--workers", help="worker processes (default: the file's, else CPUs)"),
        ] = None,
        out: Annotated[
            Path | None,
            typer.Option(
                "--out", help="folder for runs.parquet, runs.csv, points.csv; enables resume"
            ),
        ] = None,
        quiet: Annotated[
            bool,
            typer.Option("--quiet", "-q", metavar="", help="no progress bar or lines on stderr"),
        ] = False,
        backend: Annotated[
            str, typer.Option("--backend", help="local (process pool) | ray")
        ] = "local",
        ray_address: Annotated[
            str | None, typer.Option("--ray-address", help="Ray cluster (default: start one)")
        ] = None,
        check_invariants: Annotated[
            bool | None,
            typer.Option(
                "--check-invariants/--no-check-invariants",
                metavar="",
                help="check the laws in every run (default: the base scenario's check_invariants, "
                "off)",
                show_default=False,
            ),
        ] = None,
        report: Annotated[
            Path | None,
            typer.Option("--report", help="write the sweep's HTML report (one page)"),
        ] = None,
    ) -> None:
        """Simulate a grid of scenario overrides × seeds; print mean ± 95% CI per point."""
        from ..interruption import interruptible

        def go() -> None:
            from ..input_files import refuse_writing_inputs, scenario_input_files
            from ..sweeps import check_workers, load_sweep_file, sweep

            # Checked here so that the error names the flag, not sweep()'s keyword.
            check_workers(workers, "--workers")
            _check_out_folder(out)
            check_writable("--report", report)
            spec = load_sweep_file(sweep_yaml)
            refuse_writing_inputs(
                [("--report", report)],
                [
                    ("the sweep file", sweep_yaml),
                    ("the --out folder", out),
                    *scenario_input_files(spec.base.model_dump(), spec.base_path),
                ],
                (".html",),
            )
            if check_invariants is not None:
                spec.base = spec.base.model_copy(update={"check_invariants": check_invariants})

            def progress(done: int, total: int, row: dict[str, Any]) -> None:
                point = ", ".join(f"{k}={v}" for k, v in row.items() if k in spec.grid)
                typer.echo(f"[{done}/{total}] {point} seed={row['seed']}", err=True)

            def run(report) -> Any:
                return sweep(
                    spec.base,
                    spec.grid,
                    seeds=spec.seeds,
                    workers=workers if workers is not None else spec.workers,
                    out=out,
                    progress=report,
                    backend=backend,
                    ray_address=ray_address,
                )

            with interruptible(lambda: _sweep_loss(out)):
                result = _run_with_progress(run, progress, quiet)
            if not quiet and result.skipped:
                typer.echo(f"resumed: {result.skipped} run(s) already in {out}", err=True)
            typer.echo(format_points_table(result))
            typer.echo(f"(95% CI half-width across seeds: {result.ci_method})")
            from ..metrics.study import latency_models_line

            models = latency_models_line(result)
            if models is not None:
                typer.echo(models)
            if report is not None:
                with interruptible(lambda: _report_loss(report, out)):
                    result.report(report)
                typer.echo(f"wrote {report}", err=True)

        guarded(go)


def _check_out_folder(out: Path | None) -> None:
    """Refuse an --out that cannot hold the sweep's files before any run is simulated."""
    if out is None:
        return
    from ..atomic_io import check_output, check_output_folder
    from ..sweeps import RUNS_DIR

    check_output_folder(out, "--out")
    check_output_folder(out / RUNS_DIR, "--out")
    for name in ("runs.parquet", "runs.csv", "points.csv"):
        check_output(out / name, "--out")


def _sweep_loss(out: Path | None) -> str:
    """What an interrupted sweep keeps: the runs already saved under --out resume later."""
    from ..sweeps import RUNS_DIR

    if out is None:
        return "no --out folder, so every finished run was lost"
    saved = len(list((out / RUNS_DIR).glob("*.json")))
    return (
        f"{saved} finished run(s) are kept in {out / RUNS_DIR}; runs in progress were lost; "
        "run the same command again to resume"
    )


def _report_loss(report: Path, out: Path | None) -> str:
    """What a sweep interrupted while writing its report keeps: every run finished."""
    tables = f"its tables are in {out}" if out is not None else "its table was printed"
    return f"the sweep finished ({tables}), but {report} was not written"


def _run_with_progress(run, progress, quiet: bool) -> SweepResult:
    """`run(report)` with per-run lines (pipes), a progress bar (terminals) or nothing."""
    if quiet:
        return run(None)
    elif sys.stderr.isatty():
        # On a terminal: one rich progress bar instead of a line per run.
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        columns = (
            TextColumn("sweep"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("sweep", total=None)

            def report(done: int, total: int, _row: dict[str, Any]) -> None:
                bar.update(task, completed=done, total=total)

            return run(report)
    else:
        return run(progress)
